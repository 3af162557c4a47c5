"""GPU: `lightning-ig diag --device cuda` agrees with the CPU report, repeats bit for bit, and flags NaN weights.

Also the CUDA side of the noise layer: reset_noise with a CUDA generator, and
noise_disabled leaving the CUDA random generators alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_ig.checkpoint import load_checkpoint, save_checkpoint
from lightning_ig.models import DuelingQNetwork
from lightning_ig.models.noise import NoisyLinear, noise_disabled
from tests.support import REPO
from tests.support.tolerance import eps

pytestmark = pytest.mark.gpu

# CUDA kernels and the CPU's torch path round differently (fused multiply-adds, reduction
# orders): float32 roundings (ulps) at the size of the values compared
ULPS = 84


def _diag(workspace: Path, *args: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "lightning_ig.cli", "diag", "--checkpoint", "q.safetensors", "--quiet", *args],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"diag {args} failed with {done.returncode}: {done.stderr}"
    output = args[args.index("--output") + 1]
    return json.loads((workspace / output).read_text())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_gpu")
    torch.manual_seed(0)
    net = DuelingQNetwork(8, 4, hidden_sizes=(64, 64), activation="tanh", stream_hidden_size=32)
    net.reset_noise()
    states = torch.randn(128, 8, generator=torch.Generator().manual_seed(1))
    save_checkpoint(net, root / "q.safetensors", feature_names=[f"s{i}" for i in range(8)], states=states)
    return root


def _close(a: float | None, b: float | None, scale: float) -> bool:
    if a is None or b is None:
        return a is b
    # each value at its own size, with the report's scale as the floor so that values near zero,
    # computed from terms of that size, compare sensibly
    return abs(a - b) <= ULPS * eps(torch.float32) * (max(abs(a), abs(b)) + scale)


def test_cuda_report_matches_cpu_and_repeats_bit_for_bit(workspace: Path) -> None:
    common = ("--auto-samples", "64", "--num-steps", "50")
    cpu = _diag(workspace, *common, "--device", "cpu", "--output", "cpu.json")
    cuda = _diag(workspace, *common, "--device", "cuda", "--output", "cuda.json")
    again = _diag(workspace, *common, "--device", "cuda", "--output", "cuda_again.json")

    assert cpu["backend"] == "torch" and cuda["backend"] == "cuda", "on a CUDA device the CUDA kernels run by default"
    assert cuda["state_indices"] == cpu["state_indices"]
    scale = max(abs(f[key]) for f in cpu["features"] for key in ("mean_abs", "stddev", "mean_signed"))
    mismatches = [
        (f_cpu["name"], key, f_cpu[key], f_cuda[key])
        for f_cpu, f_cuda in zip(cpu["features"], cuda["features"])
        for key in ("mean_abs", "stddev", "mean_signed")
        if not _close(f_cpu[key], f_cuda[key], scale)
    ]
    assert not mismatches, f"CUDA and CPU reports differ beyond {ULPS} float32 ulps: {mismatches}"
    assert [f["name"] for f in cuda["features"]] == [f["name"] for f in cpu["features"]]
    per_state = list(zip(cpu["completeness"]["per_state"], cuda["completeness"]["per_state"]))
    state_scale = max(abs(s_cpu["f_input_minus_f_baseline"]) for s_cpu, _ in per_state)
    for s_cpu, s_cuda in per_state:
        assert _close(s_cpu["sum_attributions"], s_cuda["sum_attributions"], state_scale), (s_cpu, s_cuda)
    assert cuda["completeness"]["worst_relative_error"] < 0.01

    assert json.dumps(again["features"]) == json.dumps(cuda["features"]), "a repeat on the GPU must be bit-identical"
    assert json.dumps(again["completeness"]) == json.dumps(cuda["completeness"])


def test_cuda_auto_steps_and_backend_cuda(workspace: Path) -> None:
    report = _diag(workspace, "--device", "cuda", "--backend", "cuda", "--num-steps", "auto", "--output", "auto.json")
    assert report["backend"] == "cuda" and report["num_steps_requested"] == "auto"
    assert report["completeness"]["worst_relative_error"] < 0.01


def test_checkpoint_loads_onto_cuda_and_noise_switch_leaves_cuda_rng_alone(
    workspace: Path, cuda_device: torch.device
) -> None:
    loaded = load_checkpoint(workspace / "q.safetensors", device=cuda_device)
    assert loaded.states is not None and loaded.states.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in loaded.model.parameters())
    model = loaded.model.train()
    layer = next(m for m in model.modules() if isinstance(m, NoisyLinear))
    layer.reset_noise(torch.Generator(device=cuda_device).manual_seed(5))
    epsilon = layer.weight_epsilon.clone()
    cuda_state = torch.cuda.get_rng_state(cuda_device)
    with noise_disabled(model):
        first, second = model(loaded.states), model(loaded.states)
    assert torch.equal(first, second)
    assert torch.equal(torch.cuda.get_rng_state(cuda_device), cuda_state)
    assert torch.equal(layer.weight_epsilon, epsilon) and layer.noise_enabled and model.training
    assert not torch.equal(model(loaded.states), first), "noise is back on after the block"


def test_cuda_kernels_flag_a_nan_checkpoint_exit_3_with_the_report(workspace: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(workspace / "q.safetensors"), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open's API, not a dict
        metadata = handle.metadata()
    first_weight = next(key for key in tensors if key.endswith("weight"))
    tensors[first_weight][0, 0] = float("nan")  # one diverged weight
    save_file(tensors, str(workspace / "nan.safetensors"), metadata=metadata)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_ig.cli",
            "diag",
            "--checkpoint",
            "nan.safetensors",
            "--device",
            "cuda",
            "--backend",
            "cuda",
            "--output",
            "nan.json",
        ],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3 and len(lines) == 1 and "NaN/Inf on 16 of 16 states" in lines[0], done.stderr
    report = json.loads((workspace / "nan.json").read_text())
    assert report["backend"] == "cuda" and report["non_finite_states"] == list(range(16))
