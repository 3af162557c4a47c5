"""``n_steps="auto"``: the kink rule at 56 nodes, then the states above tolerance refined by tripling the nodes.

The first level is the kink rule (:mod:`~lightning_ig.attribution.kinks`) at
:data:`~lightning_ig.attribution.kinks.BUDGET_NODES` nodes (the midpoint rule for ``method="riemann_middle"`` and
finite differences). The ``3 n`` midpoint nodes hold the ``n`` before, so a state that goes on costs ``2 n`` new
gradients per level: ``56, 168, 504``, never past ``max_steps``. Each later level runs the states still above
tolerance as a sub-batch (:meth:`~lightning_ig.attribution.path.PathRun.subset`) with the midpoint rule and its
estimate, computed afresh on the level's nodes; each state records what it used
(:attr:`~lightning_ig.attribution.IGResult.n_steps_per_state`). A state goes on while a figure is above
``completeness_tol / 2`` (``/ 4`` after the kink rule); which figures, and why: ``docs/trust.md``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_ig.attribution.kinks import BUDGET_NODES
from lightning_ig.attribution.path import PathRun, rule_tensors
from lightning_ig.attribution.result import NEAR_BASELINE_FRACTION, lower_median
from lightning_ig.attribution.settings import IGOptions
from lightning_ig.vocabulary import KINK_METHOD

__all__ = ["attribute_auto", "levels"]

_METHOD = "riemann_middle"


def levels(max_steps: int) -> list[int]:
    """The numbers of nodes ``n_steps="auto"`` may use: 56, 168, 504, ... up to ``max_steps`` (``max_steps`` alone
    when it is below 56)."""
    found = [min(BUDGET_NODES, max_steps)]
    while found[-1] * 3 <= max_steps:
        found.append(found[-1] * 3)
    return found


def attribute_auto(run: PathRun, settings: IGOptions) -> dict[str, Tensor]:
    """The out dict of :meth:`PathRun.attribute` for ``n_steps="auto"``, with ``n_steps_per_state`` ``(B,)``.

    One host synchronisation per level (which states go on).
    """
    steps = levels(settings.max_steps)
    alphas, weights = rule_tensors(_METHOD, steps[0], run.acc, run.x.device)
    path = run.gradients(alphas, with_ends=True)
    assert path.ends is not None  # noqa: S101 - with_ends=True
    out = run.finish(alphas, weights, path.grads, path.ends, path.values)  # the kink rule where that is the method
    final = {name: out[name].clone() for name in ("attributions", "stats", "accuracy")}
    per_state = torch.full((run.batch,), steps[0], dtype=torch.int64, device=run.x.device)
    # near-baseline states are judged against a tenth of the median scale over all states, fixed at the first level
    floor = NEAR_BASELINE_FRACTION * lower_median(_scale(out))  # (T, 1)
    states = torch.arange(run.batch, device=run.x.device)
    grads, values, ends, current = path.grads, path.values, path.ends[:2], run  # ends: one copy of F(x), F(b)
    tolerance = settings.completeness_tol / 2
    first = tolerance / 2 if settings.method == KINK_METHOD else tolerance
    moved = None  # the kink rule's corrections, ||a - a_midpoint||_1: a wrong one the certificate passed (two kinks
    if settings.method == KINK_METHOD and len(steps) > 1:  # of opposite slope changes in one stretch) reads as exact
        plain = run.backend.accumulate(run.x, run.b, weights, path.grads.contiguous())  # the midpoint's sums
        moved = (out["attributions"] - plain).abs().sum(-1).to(out["accuracy"].dtype)  # (T, B)
    for n in steps[1:]:
        going_on = _going_on(out, floor, first, moved) if n == steps[1] else _going_on(out, floor, tolerance)
        keep = going_on.nonzero().squeeze(1)  # the one host sync of this level
        if keep.numel() == 0:
            break
        states, grads, values, ends = states[keep], grads[:, :, keep], values[:, :, keep], ends[:, keep]
        current = current.subset(keep)
        alphas, weights = rule_tensors(_METHOD, n, run.acc, run.x.device)
        fresh = current.gradients(alphas.view(-1, 3)[:, [0, 2]].reshape(-1), with_ends=False)  # each triple's ends
        grads, values = _merged(grads, fresh.grads), _merged(values, fresh.values)
        out = current.finish(alphas, weights, grads, ends, values, kinks=False)
        final["attributions"][:, states] = out["attributions"]  # (T, B, F)
        final["stats"][..., states] = out["stats"]  # (7, T, B)
        final["accuracy"][..., states] = out["accuracy"]  # (3, T, B)
        per_state[states] = n
    final["n_steps_per_state"] = per_state
    return final


def _scale(out: dict[str, Tensor]) -> Tensor:
    """``(T, B)`` ``max(||a||_1, |F(x) - F(b)|)``: what a state's errors are relative to."""
    return torch.maximum(out["accuracy"][2], (out["stats"][0] - out["stats"][1]).abs().to(out["accuracy"].dtype))


def _going_on(out: dict[str, Tensor], floor: Tensor, tolerance: float, moved: Tensor | None = None) -> Tensor:
    """``(B,)`` bool: the states with the estimate, mass-relative error or ``moved / scale`` over ``tolerance``."""
    estimate, mass_relative, mass = out["accuracy"]  # (T, B) each
    # relative to max(own scale, a tenth of the median): a near-baseline state is judged by its absolute error
    scale = _scale(out)
    judged = torch.where(scale >= floor, estimate, estimate * mass / torch.maximum(scale, floor))
    above = torch.maximum(torch.nan_to_num(judged, nan=math.inf), mass_relative) > tolerance
    if moved is not None:
        above |= moved / torch.maximum(scale, floor) > tolerance
    non_finite = out["stats"][5] != 0  # (T, B)
    return above.any(0) & ~non_finite.any(0)


def _merged(old: Tensor, new: Tensor) -> Tensor:
    """``(T, 3 n, ...)``: the old nodes at the middle of each triple, the new ones at its ends, in node order."""
    merged = torch.empty((old.shape[0], old.shape[1] * 3, *old.shape[2:]), dtype=old.dtype, device=old.device)
    merged[:, 1::3] = old
    fresh = new.view(new.shape[0], -1, 2, *new.shape[2:])
    merged[:, 0::3] = fresh[:, :, 0]
    merged[:, 2::3] = fresh[:, :, 1]
    return merged
