"""The soft-margin loss's shared test helpers: the reductions, dtypes and roundings, a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import torch

from tests.support.tolerance import assert_close_scaled

__all__ = ["DTYPES", "REDUCTIONS", "ULPS", "assert_close_loss", "labels", "reference_loss"]

REDUCTIONS = ("none", "mean", "sum")
# dtype -> roundings (ulps of the dtype) that may separate two computations of the same loss:
# the twin's stable form and torch's, or a kernel (float32 accumulation, rounded once)
# and a float64 reference. The half types round every intermediate in torch.
ULPS = {torch.float64: 8, torch.float32: 8, torch.bfloat16: 3, torch.float16: 3}
DTYPES = list(ULPS)


def assert_close_loss(
    actual: torch.Tensor | np.ndarray,
    expected: torch.Tensor | np.ndarray,
    dtype: torch.dtype,
    *,
    ulps: float | None = None,
    scale: float | None = None,
) -> None:
    """``actual`` within ``ulps`` roundings of ``dtype`` of ``expected``, at the values' size (support/tolerance)."""

    def as_array(values: torch.Tensor | np.ndarray) -> np.ndarray:
        return values.detach().cpu().double().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)

    assert_close_scaled(
        as_array(actual), as_array(expected), ulps=ULPS[dtype] if ulps is None else ulps, dtype=dtype, scale=scale
    )


def reference_loss(x: torch.Tensor, y: torch.Tensor, reduction: str) -> tuple[np.ndarray, np.ndarray]:
    """Loss and dL/dx in float64 numpy, independent of torch's and our formulas."""
    x64 = x.detach().double().numpy()
    y64 = np.broadcast_to(y.detach().double().numpy(), x64.shape)
    z = -y64 * x64
    loss = np.logaddexp(0.0, z)
    sigmoid = np.exp(z - loss)  # exp(z - softplus(z)) = sigmoid(z), without overflow
    grad = -y64 * sigmoid
    if reduction == "mean":
        return np.asarray(loss.mean()), grad / x64.size
    if reduction == "sum":
        return np.asarray(loss.sum()), grad
    return loss, grad


def labels(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=generator).float() * 2 - 1
