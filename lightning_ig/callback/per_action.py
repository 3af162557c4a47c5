"""The callback's ``target="each"``: every action's ``Q(s, a)`` in one batched run, a row per (state, action).

The engine's ``target="each"`` gives ``(A, B, *feature_shape)`` attributions and ``(A, B)`` per-state numbers (one
batched call; on CUDA the callback's engine replays its graph as for any target). A run hands them on as one row per
(state, action) pair, state-major (row ``s * A + a``: :func:`pair_rows`), so that the one gather, the reductions on the
device and the one copy to the host are those of any run and every pair is checked for completeness like a state. Under
DDP each rank's share is whole states, so the gathered rows are the pairs of the states in order and the padding of an
uneven split (the last rank's repeated last state) is at the end, where the host result drops it. The views split the
rows by action (:class:`~lightning_ig.run.actions.ActionSummary`).

The trust checks judge the mean over the actions (:meth:`~lightning_ig.callback.monitor.TrustMonitor.prepare`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from lightning_ig.attribution.result import IGResult

__all__ = ["pair_rows"]


def pair_rows(result: IGResult) -> IGResult:
    """``result`` of ``target="each"`` as a row per (state, action) pair, state-major: ``(B * A, *feature_shape)``,
    ``(B * A,)``.

    On the device, queued (no host sync); the attributions are copied out of the engine's buffers, which its next run
    (a graph replay) writes again.

    Raises:
        ValueError: ``result`` is not one of ``target="each"`` (``f_input`` not ``(A, B)``).
    """
    if result.f_input.ndim != 2:
        raise ValueError(
            f"expected a target='each' result (f_input (A, B)), got f_input of shape {tuple(result.f_input.shape)}"
        )
    actions, states = result.f_input.shape

    def pairs(values: Tensor | None) -> Any:
        return None if values is None else values.transpose(0, 1).reshape(states * actions, *values.shape[2:])

    per_row = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite")
    optional = ("attribution_error", "mass_relative_error", "attribution_mass")
    steps = result.n_steps_per_state  # (B,): a state's actions stop together
    return dataclasses.replace(
        result,
        attributions=pairs(result.attributions),
        baselines=result.baselines.repeat_interleave(actions, dim=0),
        n_steps_per_state=None if steps is None else steps.repeat_interleave(actions),
        **{name: pairs(getattr(result, name)) for name in (*per_row, *optional)},
    )
