"""Inputs the kernels' tests share: the repeated ends of the stochastic-forward check, with known answers."""

from __future__ import annotations

import torch

from lightning_ig.ops.dtypes import accumulate_dtype
from lightning_ig.ops.ig import repeat_threshold

__all__ = ["repeated_ends"]


def repeated_ends(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attributions ``(2, 8, 5)``, ends ``(4, 8, 2)`` (x, b, then x, b again) and which states' repeat differs."""
    acc = accumulate_dtype(dtype)
    generator = torch.Generator().manual_seed(54)
    attributions = torch.randn(2, 8, 5, generator=generator).to(dtype)
    first = (torch.randn(2, 8, 2, generator=generator) * 50).to(acc)
    first[0, 5, 0] = first[1, 6, 1] = float("nan")
    first[0, 7, 0] = float("inf")
    again = first.clone()
    tolerance = repeat_threshold(dtype)
    scale = torch.maximum(first.abs(), torch.ones_like(first))
    # ends are (end, state, target): x's value of state 1, target 0 moves within the bound (GEMM tiling, say)
    again[0, 1, 0] += 0.1 * tolerance * scale[0, 1, 0]
    again[1, 2, 1] -= 10 * tolerance * scale[1, 2, 1]  # b's value, far past it (dropout, say)
    again[0, 3, 1] *= 1.5
    again[1, 4, 0] = float("nan")  # NaN against a number
    # states 5 and 6: NaN twice agrees; state 7: the same infinity twice agrees
    expected = torch.zeros(2, 8, dtype=torch.bool)  # (T, B)
    for t, s in [(1, 2), (1, 3), (0, 4)]:
        expected[t, s] = True
    return attributions, torch.cat([first, again]), expected
