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


def test_ddp_reports_equal_the_single_process_reports(runs):
    _assert_reports_agree(runs, rtol=1e-6)


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
    # cuBLAS may sum in another order for batches of 16 and 32: allow float32 rounding of the training.
    _assert_reports_agree({1: single, 2: double}, rtol=1e-5)
    reports = _reports(double)
    assert all(report["backend"] == "cuda" for report in reports.values())
    assert len(list((double / "tb").rglob("events.out.tfevents.*"))) == 1


def _assert_reports_agree(runs: dict[int, Path], rtol: float) -> None:
    single, double = _reports(runs[1]), _reports(runs[2])
    assert list(single) == list(double) == [f"ig_report_step={step:08d}.json" for step in (2, 4)]
    for name in single:
        a, b = single[name], double[name]
        assert b["world_size"] == 2 and a["world_size"] == 1
        assert a["num_states"] == b["num_states"] == 37  # padding rows of the uneven split are dropped
        for key in ("mean_abs", "stddev", "mean_signed"):
            np.testing.assert_allclose(
                [f[key] for f in b["features"]], [f[key] for f in a["features"]], rtol=rtol, atol=rtol
            )
        for field in ("sum_attributions", "f_input_minus_f_baseline"):
            np.testing.assert_allclose(
                [s[field] for s in b["completeness"]["per_state"]],
                [s[field] for s in a["completeness"]["per_state"]],
                rtol=rtol,
                atol=rtol,
            )
        assert [s["state_idx"] for s in b["completeness"]["per_state"]] == list(range(37))
        assert b["completeness"]["worst_relative_error"] == pytest.approx(
            a["completeness"]["worst_relative_error"], abs=rtol
        )
        assert [f["name"] for f in b["top_10_by_mean_abs"]] == [f["name"] for f in a["top_10_by_mean_abs"]]
    assert double[f"ig_report_step={4:08d}.json"]["drift"]["spearman_prev"] == pytest.approx(
        single[f"ig_report_step={4:08d}.json"]["drift"]["spearman_prev"], abs=rtol
    )


def test_only_rank_zero_logs(runs):
    event_files = list((runs[2] / "tb").rglob("events.out.tfevents.*"))
    assert len(event_files) == 1, event_files
