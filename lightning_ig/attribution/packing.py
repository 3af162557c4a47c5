"""One rank's IG result as one tensor: each state's attributions and its per-state numbers, side by side.

:func:`pack` makes the ``(B, F + 10)`` tensor that one collective gathers under DDP and that
:meth:`~lightning_ig.attribution.host_result.HostResult.begin` reduces; :data:`COLUMNS` names the per-state numbers
after the attributions, in their order.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["COLUMNS", "ResultLike", "pack"]

# The per-state columns packed after the attributions, in this order.
COLUMNS = (
    "f_input",
    "f_baseline",
    "delta",
    "relative_error",
    "degenerate",
    "non_finite",
    "n_steps",
    "stochastic",
    "attribution_error",
    "mass_relative_error",
)


class ResultLike(Protocol):
    """The fields of :class:`~lightning_ig.attribution.IGResult` read here (``non_finite``, ``stochastic`` optional)."""

    attributions: Tensor
    f_input: Tensor
    f_baseline: Tensor
    delta: Tensor
    relative_error: Tensor
    degenerate: Tensor
    n_steps: int
    method: str
    gradient: str
    backend: str


def pack(result: Any) -> tuple[Tensor, tuple[int, ...]]:
    """One rank's result as the single tensor that is gathered, and the feature shape.

    Returns:
        ``(B, F + 10)`` in the attributions' dtype (at least float32): each state's flattened
        attributions, then ``f_input``, ``f_baseline``, ``delta``, ``relative_error``,
        ``degenerate``, ``non_finite``, ``n_steps`` (per state), ``stochastic``, ``attribution_error``,
        ``mass_relative_error`` (NaN where the result has no such figure); and ``feature_shape``.
    """
    attributions = result.attributions
    f_input = torch.as_tensor(result.f_input)
    if attributions.ndim < 2 or f_input.ndim != 1 or f_input.shape[0] != attributions.shape[0]:
        raise ValueError(
            f"expected one forward value per state, got f_input of shape {tuple(f_input.shape)} for attributions "
            f"of shape {tuple(attributions.shape)}; for target='each' build one report per action "
            "(index the result's tensors)"
        )
    share = attributions.shape[0]
    dtype = torch.promote_types(attributions.dtype, torch.float32)
    non_finite = getattr(result, "non_finite", None)
    flags = torch.zeros(share, dtype=dtype, device=attributions.device) if non_finite is None else non_finite
    missing = torch.full((share,), float("nan"), dtype=dtype, device=attributions.device)
    steps = getattr(result, "n_steps_per_state", None)
    columns = [
        result.f_input,
        result.f_baseline,
        result.delta,
        result.relative_error,
        result.degenerate,
        flags,
        torch.full((share,), float(result.n_steps), dtype=dtype, device=attributions.device)
        if steps is None
        else steps,
        torch.full(
            (share,), float(bool(getattr(result, "stochastic", False))), dtype=dtype, device=attributions.device
        ),
        _figure(result, "attribution_error", missing),
        _figure(result, "mass_relative_error", missing),
    ]
    per_state = torch.stack(
        [torch.as_tensor(c, device=attributions.device).reshape(share).to(dtype) for c in columns], 1
    )
    packed = torch.cat([attributions.reshape(share, -1).to(dtype), per_state], dim=1)  # (B, F + 10)
    return packed, tuple(int(size) for size in attributions.shape[1:])


def _figure(result: Any, name: str, missing: Tensor) -> Any:
    value = getattr(result, name, None)
    return missing if value is None else value
