"""DDP with 2 processes (gloo on the CPU; NCCL and the CUDA kernels on 2 GPUs) against one process.

One pair of runs (tests/support/tiny.py as a script: a conv net on (2, 4, 4) frames, 37 held-out states split
19 + 18 over the ranks) is compared on everything the callback gathers: per-feature and per-group statistics,
completeness per state, the saliency images; and on who writes (rank zero
alone) and on training (the callback leaves the weights as they would be without it).

Both runs train on the same batches (every rank sees the one-process run's batch; DDP's mean of two equal
gradients is that gradient exactly), so their weights agree bit for bit and every difference left comes from the
IG runs on the ranks' shares and the gather. The GPU variant runs the same checks:

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python -m pytest -m gpu tests/callback/test_callback_ddp.py
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support import REPO
from tests.support.tiny import has_tensorboard
from tests.support.tolerance import assert_close_scaled, eps

NUM_STATES, SALIENCY_STATES, STEPS = 37, 24, (2, 4)
# The per-state numbers of one state come from the same weights through the same operations on both sides; they
# may still round apart where a batched kernel sums in another order for a share of 19 rows than for 37.
_CPU_ULPS = 64
_GPU_ULPS = 256


def _run(devices: int, out: Path, accelerator: str, *extra: str) -> None:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environment.get("PYTHONPATH")]))
    environment.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
    if accelerator == "cpu":
        environment.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        environment.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.tiny",
            "--devices",
            str(devices),
            "--out",
            str(out),
            "--batch-size",
            "16",
            "--accelerator",
            accelerator,
            *extra,
        ],
        cwd=out,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if completed.returncode != 0:
        output = f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
        raise AssertionError(f"the {devices}-process run failed:\n{output}")


def _pair(tmp_path_factory: pytest.TempPathFactory, accelerator: str) -> dict[int, Path]:
    single, double = tmp_path_factory.mktemp(f"single_{accelerator}"), tmp_path_factory.mktemp(f"ddp_{accelerator}")
    _run(1, single, accelerator)
    _run(2, double, accelerator)
    return {1: single, 2: double}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return _pair(tmp_path_factory, "cpu")


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (nvidia-h200-x2)")
    return _pair(tmp_path_factory, "gpu")


def _reports(folder: Path) -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted((folder / "reports_rank0").glob("*.json"))}


def _stable_order(values: list[float], ulps: float) -> bool:
    """No two values are within rounding of each other: their ranking cannot move when they round apart."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    return bool(np.all(np.diff(ordered) > 2 * ulps * eps(torch.float32) * np.abs(ordered).max()))


def _assert_completeness_agrees(states_a: list[dict], states_b: list[dict], ulps: float) -> float:
    """Per-state sums and F(x) - F(b) within rounding; relative errors within the rounding of delta; the bound."""
    assert [s["state_idx"] for s in states_b] == [s["state_idx"] for s in states_a] == list(range(NUM_STATES))
    for field in ("sum_attributions", "f_input_minus_f_baseline"):
        assert_close_scaled([s[field] for s in states_b], [s[field] for s in states_a], ulps=ulps)
    # A relative completeness error is itself rounding noise here: its rounding is that of delta (a difference of
    # numbers of size |sum| + |F(x) - F(b)|) over |F(x) - F(b)|.
    # A degenerate state (|F(x) - F(b)| too small for a ratio) has none, on both sides.
    assert [s["relative_error"] is None for s in states_b] == [s["relative_error"] is None for s in states_a]
    checked = [(s_a, s_b) for s_a, s_b in zip(states_a, states_b) if s_a["relative_error"] is not None]
    bounds = [
        ulps
        * eps(torch.float32)
        * (abs(s["sum_attributions"]) + abs(s["f_input_minus_f_baseline"]))
        / abs(s["f_input_minus_f_baseline"])
        for s, _ in checked
    ]
    for (s_a, s_b), bound in zip(checked, bounds):
        assert abs(s_b["relative_error"] - s_a["relative_error"]) <= bound, (s_a, s_b, bound)
    return max(bounds)


# ---------------------------------------------------------------------------- the checks, on CPU and GPU pairs


def _statistics_and_completeness(runs: dict[int, Path], ulps: float) -> None:
    single, double = _reports(runs[1]), _reports(runs[2])
    assert list(single) == list(double) == [f"ig_report_step={step:08d}.json" for step in STEPS]
    for name in single:
        a, b = single[name], double[name]
        assert (a["world_size"], b["world_size"]) == (1, 2)
        assert a["num_states"] == b["num_states"] == NUM_STATES  # the padding row of the uneven split is dropped
        for unit in ("features", "groups"):
            assert [u["name"] for u in b[unit]] == [u["name"] for u in a[unit]]
            for key in ("mean_abs", "stddev", "mean_signed"):
                assert_close_scaled([u[key] for u in b[unit]], [u[key] for u in a[unit]], ulps=ulps)
        assert [g["name"] for g in a["groups"]] == ["channel 0", "channel 1"]
        bound = _assert_completeness_agrees(a["completeness"]["per_state"], b["completeness"]["per_state"], ulps)
        worst_a, worst_b = a["completeness"]["worst_relative_error"], b["completeness"]["worst_relative_error"]
        assert abs(worst_b - worst_a) <= bound, (worst_a, worst_b, bound)
        if _stable_order([f["mean_abs"] for f in a["features"]], ulps):
            assert [f["name"] for f in b["top_10_by_mean_abs"]] == [f["name"] for f in a["top_10_by_mean_abs"]]


def _saliency_images(runs: dict[int, Path], ulps: float) -> None:
    if not has_tensorboard():
        pytest.skip("the runs log images only where TensorBoard and Pillow are installed")
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lightning_ig.views.pictures.raster import CARD_WIDTH

    pictures = {}
    for world, folder in runs.items():
        (log_dir,) = {path.parent for path in (folder / "tb_rank0").rglob("events.out.tfevents.*")}
        events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
        events.Reload()
        pictures[world] = {
            (tag, event.step): np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
            for tag in ("ig/2_saliency",)
            for event in events.Images(tag)
        }
    assert sorted(pictures[1]) == sorted(pictures[2]) == sorted(("ig/2_saliency", step) for step in STEPS)
    for key, pixels in pictures[1].items():
        assert pixels.shape == pictures[2][key].shape and pixels.dtype == np.uint8
        differ = (pictures[2][key] != pixels).any(-1)
        largest = int(np.abs(pictures[2][key].astype(int) - pixels.astype(int)).max())
        assert not differ.any(), f"{key}: {int(differ.sum())} of {differ.size} pixels differ, by up to {largest} levels"
    # the grid at the card's width, the same whether one process or two gathered the states
    assert pictures[1][("ig/2_saliency", STEPS[-1])].shape[1] == CARD_WIDTH


def _only_rank_zero_writes(runs: dict[int, Path], ulps: float) -> None:
    logged = has_tensorboard()  # the runs log to TensorBoard where it is installed
    for folder in runs.values():
        assert len(list((folder / "tb_rank0").rglob("events.out.tfevents.*"))) == int(logged)
        assert len(list((folder / "reports_rank0").glob("*.json"))) == len(STEPS)
    double = runs[2]
    assert not list((double / "tb_rank1").rglob("*")), "rank 1 wrote TensorBoard files"
    assert not (double / "reports_rank1").exists() or not list((double / "reports_rank1").iterdir()), (
        "rank 1 wrote reports"
    )


def _trust_checks_agree(runs: dict[int, Path], ulps: float) -> None:
    """The trust checks run on rank zero on the gathered states with one seed: the same numbers as one process."""
    if not has_tensorboard():
        pytest.skip("the runs log scalars only where TensorBoard is installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.support.trust import trust_scalar_tags

    logged = {}
    for world, folder in runs.items():
        (log_dir,) = {path.parent for path in (folder / "tb_rank0").rglob("events.out.tfevents.*")}
        events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
        events.Reload()
        tags = set(trust_scalar_tags("ig", noisy=False)) & set(events.Tags()["scalars"])
        logged[world] = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in tags}
    assert set(logged[1]) == set(logged[2]) == set(trust_scalar_tags("ig", noisy=False))  # the first run: all
    for tag, values in logged[1].items():
        assert [step for step, _ in logged[2][tag]] == [step for step, _ in values], tag
        for (_, a), (_, b) in zip(values, logged[2][tag]):
            assert abs(a - b) <= ulps * eps(torch.float32) * max(1.0, abs(a)), (tag, a, b)


def _callback_leaves_the_weights(runs: dict[int, Path], ulps: float) -> None:
    for world, folder in runs.items():
        weights = torch.load(folder / "weights.pt")
        for key, value in weights["with"].items():
            assert torch.equal(value, weights["without"][key]), f"{world} process(es): the callback changed {key}"


def _ddp_trains_as_one_process(runs: dict[int, Path], ulps: float) -> None:
    """The premise of the bit-for-bit comparisons above: the same batches on every rank train the same weights."""
    single, double = (torch.load(runs[world] / "weights.pt")["with"] for world in (1, 2))
    for key, value in single.items():
        assert torch.equal(double[key], value), key


CHECKS: list[Callable[[dict[int, Path], float], None]] = [
    _statistics_and_completeness,
    _saliency_images,
    _only_rank_zero_writes,
    _trust_checks_agree,
    _callback_leaves_the_weights,
    _ddp_trains_as_one_process,
]


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__.strip("_") for check in CHECKS])
def test_two_processes_equal_one(runs: dict[int, Path], check: Callable[[dict[int, Path], float], None]) -> None:
    check(runs, _CPU_ULPS)


@pytest.mark.gpu
@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__.strip("_") for check in CHECKS])
def test_two_gpus_equal_one(gpu_runs: dict[int, Path], check: Callable[[dict[int, Path], float], None]) -> None:
    check(gpu_runs, _GPU_ULPS)
    assert all(report["backend"] == "cuda" for report in _reports(gpu_runs[2]).values())


def test_a_tensor_baseline_is_rank_zeros(tmp_path: Path) -> None:
    """Each rank draws its own per-state baseline (as an unseeded draw would): every rank attributes its share of rank
    zero's states from rank zero's baselines, so each state's F(x) - F(b) is that of its own baseline."""
    from tests.support.tiny import TinyQNet, held_out_states

    _run(2, tmp_path, "cpu", "--rank-baselines")
    (report,) = [json.loads(path.read_text()) for path in (tmp_path / "reports").glob("*.json")]
    assert report["world_size"] == 2 and report["global_step"] == 2
    model = TinyQNet(noisy=False, dropout=0.0, batchnorm=False)
    model.load_state_dict(torch.load(tmp_path / "weights.pt"))
    with torch.no_grad():
        f_input, f_baseline = model(held_out_states()).mean(1), model(held_out_states(seed=2) * 0.5).mean(1)
    deltas = [state["f_input_minus_f_baseline"] for state in report["completeness"]["per_state"]]
    scale = float(torch.cat([f_input, f_baseline]).abs().max())  # the outputs the difference is taken of
    assert_close_scaled(deltas, (f_input - f_baseline).tolist(), ulps=16, scale=scale)
