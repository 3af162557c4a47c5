"""Shared pytest set-up: the `gpu` marker skips where there is no CUDA device or no CuPy."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")

# LIGHTNING_IG_TEST_THREADS=1 (or 2, ...) runs the suite with that many torch threads, to flush out results that
# depend on how a CPU splits its reductions: `LIGHTNING_IG_TEST_THREADS=1 python -m pytest`.
if os.environ.get("LIGHTNING_IG_TEST_THREADS"):
    torch.set_num_threads(int(os.environ["LIGHTNING_IG_TEST_THREADS"]))


def _gpu_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    from lightning_ig.ops import _cupy

    if not _cupy.cupy_available():
        return False, "CuPy is not installed"
    return True, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ready, why = _gpu_ready()
    if ready:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cuda_device() -> torch.device:
    """The CUDA device for `gpu` tests."""
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(autouse=True, scope="session")
def _frozen_budget_clock() -> Iterator[None]:
    """The callback's budget reads a frozen clock in every test (see tests/support/trust.py's
    checks_without_budget): the runs and checks of a test's fit are what its cadence says."""
    from tests.support.trust import checks_without_budget

    with checks_without_budget():
        yield
