"""Tolerances derived from a dtype's machine epsilon and the size of the quantity compared.

Rounding differs between CPUs (vector width, FMA contraction, BLAS blocking), so a
test never compares rounding noise with a fixed absolute bound tuned on one machine.
It says instead how many roundings separate the two sides (``ulps``) and how large
the numbers involved are (``scale``), and the bound is ``ulps * eps * scale``.
"""

from __future__ import annotations

import numpy as np
import torch


def eps(dtype: torch.dtype | np.dtype | type = torch.float32) -> float:
    """The machine epsilon of ``dtype`` (torch or numpy)."""
    if isinstance(dtype, torch.dtype):
        return float(torch.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def rounding_bound(scale: float, *, ulps: float, dtype: torch.dtype | np.dtype | type = torch.float32) -> float:
    """``ulps`` roundings of ``dtype`` on numbers of size ``scale`` (at least 1 ulp of 1.0's size when scale is 0)."""
    return float(ulps) * eps(dtype) * max(float(scale), np.finfo(np.float64).tiny)


def assert_close_scaled(actual, expected, *, ulps: float, dtype=torch.float32, scale: float | None = None) -> None:
    """Elementwise ``|actual - expected| <= ulps * eps(dtype) * (|expected| + scale)``.

    ``scale`` (default: the largest ``|expected|``) is the size of the numbers the values were computed
    from, so near-zero results of large cancelling sums get the absolute slack their inputs call for.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if scale is None:
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    bound = ulps * eps(dtype) * (np.abs(expected) + scale)
    error = np.abs(actual - expected)
    bad = ~(error <= bound)  # NaN counts as bad
    if bad.any():
        index = int(np.flatnonzero(bad.reshape(-1))[0])
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} values differ by more than {ulps} ulps of {dtype} at scale {scale:.3g}; "
            f"first at flat index {index}: {actual.reshape(-1)[index]!r} vs {expected.reshape(-1)[index]!r} "
            f"(bound {bound.reshape(-1)[index]:.3g})"
        )


def state_errors(attributions: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``||a - a_true||_1 / ||a_true||_1`` per state (row), in float64."""
    return (attributions.double() - truth.double()).abs().sum(1) / truth.double().abs().sum(1)
