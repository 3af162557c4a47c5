"""The ensemble kernels' tuning variants (``lightning_ig.ensemble.ops.VARIANTS``) without a GPU.

On the GPU (tests/test_ensemble_gpu.py) every variant is checked bit for bit against
the twin. Here: the table is well formed and names the kernel's knobs; every
variant compiles for sm_80 and sm_90 without register spills (where nvcc exists);
and, emulated on the host with g++, the batched forward (LIG_ENS_FORWARD_DEPTH > 0)
gives every lane partial bit for bit as the member loop, so batching moves loads,
never an operation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lightning_ig.ops import ensemble_reduce as ops
from tests.support import DATA, REPO

KERNELS = REPO / "kernels"
HOST_CHECK = DATA / "ensemble_host_check.cpp"


def test_the_variant_table_names_the_kernels_knobs() -> None:
    source = (KERNELS / "ensemble.cu").read_text(encoding="utf-8")
    assert ops.DEFAULT_VARIANT in ops.VARIANTS
    assert len(set(ops.VARIANTS.values())) == len(ops.VARIANTS), "two names for one variant"
    for name, variant in ops.VARIANTS.items():
        assert variant.forward_rows >= 1 and variant.forward_depth >= 0 and 1 <= variant.forward_min_blocks <= 8, name
        for option in variant.options():
            match = re.fullmatch(r"-D(LIG_ENS_[A-Z_]+)=(\d+)", option)
            assert match, option
            assert f"#ifndef {match.group(1)}\n" in source, f"{match.group(1)} is not a knob of ensemble.cu"
    # the baseline is the kernel file's own defaults (what the CI compile check builds)
    defaults = dict(re.findall(r"#define (LIG_ENS_[A-Z_]+) (\d+)\b", source))
    assert defaults["LIG_ENS_THREADS"] == str(ops._THREADS)
    assert defaults["LIG_ENS_MIN_BLOCKS"] == str(ops._BACKWARD_BLOCKS_PER_SM)
    baseline = ops.VARIANTS["baseline"]
    assert defaults["LIG_ENS_FORWARD_ROWS"] == str(baseline.forward_rows)
    assert defaults["LIG_ENS_MIN_BLOCKS"] == str(baseline.forward_min_blocks)
    assert defaults["LIG_ENS_FORWARD_DEPTH"] == str(baseline.forward_depth)
    assert defaults["LIG_ENS_LEAN"] == str(int(baseline.lean))


def test_use_variant_rejects_unknown_names_and_restores_the_default() -> None:
    with (
        pytest.raises(ValueError, match=r"variant must be one of \[.*'baseline'.*\], got 'fastest'"),
        ops.use_variant("fastest"),
    ):
        pass  # entering the block is what raises
    other = next(name for name in ops.VARIANTS if name != ops.DEFAULT_VARIANT)
    with pytest.raises(RuntimeError, match="inside"), ops.use_variant(other) as variant:
        assert variant is ops.VARIANTS[other] and ops._active_variant == other
        raise RuntimeError("inside")
    assert ops._active_variant == ops.DEFAULT_VARIANT


def _spill_report(variant: ops.KernelVariant, tmp_path: Path) -> list[tuple[str, str, str]]:
    """(entry point, arch, ptxas's stack/spill line) for every entry point of ensemble.cu under ``variant``."""
    command = [
        "nvcc",
        "-std=c++17",
        f"-I{KERNELS}",
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-Xptxas",
        "-v",
        "-fatbin",
        "-o",
        str(tmp_path / "ensemble.fatbin"),
        *variant.options(),
        str(KERNELS / "ensemble.cu"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    report, entry = [], None
    for line in run.stderr.splitlines():
        compiling = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
        if compiling:
            entry = compiling.groups()
        elif "spill stores" in line and entry is not None:
            report.append((*entry, line.strip()))
            entry = None
    return report


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("name", sorted(ops.VARIANTS))
def test_every_variant_compiles_without_spills(name: str, tmp_path: Path) -> None:
    report = _spill_report(ops.VARIANTS[name], tmp_path)
    assert len(report) == 12, report  # forward and backward, three dtypes, two architectures
    spilling = [entry for entry in report if "0 bytes spill stores, 0 bytes spill loads" not in entry[2]]
    assert not spilling, spilling


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_batched_forward_computes_what_the_member_loop_computes(tmp_path: Path) -> None:
    binary = tmp_path / "ensemble_host_check"
    build = [
        "g++",
        "-std=c++17",
        "-O1",
        "-ffp-contract=off",
        f"-I{KERNELS}",
        "-DLIG_ENS_ONE_DTYPE",
        "-DLIG_ENS_DTYPE_f32",
        "-DLIG_ENS_LEAN=0",
        "-o",
        str(binary),
        str(HOST_CHECK),
    ]
    compiled = subprocess.run(build, capture_output=True, text=True, timeout=300, check=False)
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and run.stdout.startswith("ok: "), run.stdout + run.stderr
