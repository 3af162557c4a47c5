"""IG results built by hand for the report's tests, so that the expected numbers are known."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class FakeResult:
    """The IGResult fields report.py reads, built by hand so the expected numbers are known."""

    attributions: torch.Tensor
    f_input: torch.Tensor
    f_baseline: torch.Tensor
    delta: torch.Tensor
    relative_error: torch.Tensor
    degenerate: torch.Tensor
    n_steps: int = 16
    method: str = "gausslegendre"
    gradient: str = "autograd"
    backend: str = "torch"
    target: str = "mean"


def make_result(attributions: torch.Tensor, f_input: torch.Tensor, f_baseline: torch.Tensor, eps: float = 1e-6):
    sums = attributions.reshape(attributions.shape[0], -1).sum(1)
    difference = f_input - f_baseline
    delta = sums - difference
    degenerate = difference.abs() < eps
    relative = torch.where(degenerate, torch.full_like(delta, math.nan), delta.abs() / difference.abs())
    return FakeResult(attributions, f_input, f_baseline, delta, relative, degenerate)


def sample_result() -> FakeResult:
    """Six states of four features; the sums off by a known amount per state, state 2 degenerate (F(x) == F(b))."""
    generator = torch.Generator().manual_seed(0)
    attributions = torch.randn(6, 4, generator=generator)
    f_baseline = torch.zeros(6)
    f_input = attributions.sum(1) + torch.tensor([0.01, -0.02, 0.0, 0.03, 0.0, -0.005])
    f_input[2] = 0.0
    return make_result(attributions, f_input, f_baseline)


HOST_ARRAYS = (
    "f_input",
    "f_baseline",
    "delta",
    "relative_error",
    "degenerate",
    "non_finite",
    "sum_attributions",
    "attributions",
    "sample_attributions",
    "group_attributions",
    "attribution_error",
    "mass_relative_error",
    "near_baseline",
    "attribution_mass",
    "n_steps_per_state",
)
HOST_LABELS = ("n_steps", "method", "gradient", "backend", "target", "stochastic", "feature_shape")


def assert_same_host_results(got: Any, expected: Any) -> None:
    """Two :class:`~lightning_ig.run.host_result.HostResult` are the same bit for bit (NaN where NaN)."""
    for name in HOST_ARRAYS:
        a, b = getattr(got, name), getattr(expected, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
    for name in ("mean_abs", "stddev", "mean_signed"):
        assert np.array_equal(getattr(got.features, name), getattr(expected.features, name)), name
    assert [getattr(got, n) for n in HOST_LABELS] == [getattr(expected, n) for n in HOST_LABELS]
