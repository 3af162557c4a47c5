"""DDP with 2 processes (gloo on the CPU; NCCL on 2 GPUs where present): the gathered attributions equal the
one-process run's, and rank zero alone writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from _tolerance import assert_close_scaled, eps

SCRIPT = Path(__file__).with_name("_ig_tiny.py")
REPOSITORY = Path(__file__).resolve().parents[1]


def _run(devices: int, out: Path, batch_size: int, accelerator: str = "cpu") -> None:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), environment.get("PYTHONPATH")]))
    environment.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
    if accelerator == "cpu":
        environment.pop("CUDA_VISIBLE_DEVICES", None)
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--devices", str(devices), "--out", str(out), "--batch-size", str(batch_size),
         "--accelerator", accelerator],  # fmt: skip
        cwd=out,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if completed.returncode != 0:
        output = f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
        raise AssertionError(f"the {devices}-process run failed:\n{output}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    single = tmp_path_factory.mktemp("single")
    double = tmp_path_factory.mktemp("ddp")
    # One process with batches of 32 sees what two ranks with batches of 16 see together (the
    # DistributedSampler interleaves the unshuffled indices), so the weights agree up to rounding.
    _run(1, single, batch_size=32)
    _run(2, double, batch_size=16)
    return {1: single, 2: double}


def _reports(folder: Path) -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted((folder / "reports").glob("*.json"))}


# Both runs train 4 Adam steps in float32 and sum the same gradients in another order: their weights, and so
# every number in the reports, agree up to a few hundred float32 roundings of the numbers' own size.
_CPU_ULPS = 256


def test_ddp_reports_equal_the_single_process_reports(runs):
    _assert_reports_agree(runs, ulps=_CPU_ULPS)


@pytest.mark.gpu
def test_ddp_on_two_gpus_equals_one_gpu(tmp_path: Path) -> None:
    import torch  # noqa: PLC0415

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    single, double = tmp_path / "single", tmp_path / "ddp"
    single.mkdir()
    double.mkdir()
    _run(1, single, batch_size=32, accelerator="gpu")
    _run(2, double, batch_size=16, accelerator="gpu")
    # cuBLAS may sum in another order for batches of 16 and 32: allow more float32 rounding of the training.
    _assert_reports_agree({1: single, 2: double}, ulps=4 * _CPU_ULPS)
    reports = _reports(double)
    assert all(report["backend"] == "cuda" for report in reports.values())
    assert len(list((double / "tb").rglob("events.out.tfevents.*"))) == 1


def _assert_reports_agree(runs: dict[int, Path], ulps: float) -> None:
    single, double = _reports(runs[1]), _reports(runs[2])
    assert list(single) == list(double) == [f"ig_report_step={step:08d}.json" for step in (2, 4)]
    for name in single:
        a, b = single[name], double[name]
        assert b["world_size"] == 2 and a["world_size"] == 1
        assert a["num_states"] == b["num_states"] == 37  # padding rows of the uneven split are dropped
        for key in ("mean_abs", "stddev", "mean_signed"):
            assert_close_scaled([f[key] for f in b["features"]], [f[key] for f in a["features"]], ulps=ulps)
        states_a, states_b = a["completeness"]["per_state"], b["completeness"]["per_state"]
        assert [s["state_idx"] for s in states_b] == list(range(37))
        for field in ("sum_attributions", "f_input_minus_f_baseline"):
            assert_close_scaled([s[field] for s in states_b], [s[field] for s in states_a], ulps=ulps)
        # A relative completeness error is itself rounding noise here (~1e-6): compare it as such. Its rounding
        # is that of delta (a difference of numbers of size |sum| + |F(x) - F(b)|) over |F(x) - F(b)|.
        bounds = [
            ulps * eps(torch.float32) * (abs(s["sum_attributions"]) + abs(s["f_input_minus_f_baseline"]))
            / abs(s["f_input_minus_f_baseline"])
            for s in states_a
        ]
        for s_a, s_b, bound in zip(states_a, states_b, bounds):
            assert abs(s_b["relative_error"] - s_a["relative_error"]) <= bound, (s_a, s_b, bound)
        worst_a, worst_b = a["completeness"]["worst_relative_error"], b["completeness"]["worst_relative_error"]
        assert abs(worst_b - worst_a) <= max(bounds), (worst_a, worst_b, max(bounds))
        assert [f["name"] for f in b["top_10_by_mean_abs"]] == [f["name"] for f in a["top_10_by_mean_abs"]]
    # Spearman over 4 features is a ratio of small integers: equal unless the ranking moved.
    assert double[f"ig_report_step={4:08d}.json"]["drift"]["spearman_prev"] == pytest.approx(
        single[f"ig_report_step={4:08d}.json"]["drift"]["spearman_prev"], rel=ulps * eps(np.float64)
    )


def test_only_rank_zero_logs(runs):
    event_files = list((runs[2] / "tb").rglob("events.out.tfevents.*"))
    assert len(event_files) == 1, event_files
