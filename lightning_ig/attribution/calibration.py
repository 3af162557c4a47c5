"""Calibration: pick a quadrature rule per model, and the error estimate's scale, on a few states.

Where a ReLU network's kinks sit along the path depends on the model and its states, so no single rule wins:
the uniform midpoint rule is best (or within 15% of the best) on in-distribution states, while inputs far off the
training distribution crowd the kinks near the baseline, where a warped rule is several times more accurate.
:func:`calibrate` decides per model, against a reference, on the first :data:`CALIBRATION_STATES` states:

1. the reference: the midpoint rule with ``reference_steps`` (1024) nodes of the same forward, the gradients
   summed in float64 (accurate to about ``n_steps / reference_steps`` of the rule's own error: enough to rank rules
   and scale the estimate);
2. each candidate of :data:`CANDIDATES` at the run's ``n_steps``: its worst true error
   ``||a - a_ref||_1 / ||a_ref||_1`` over the ordinary states (not near the baseline) and its unscaled estimate
   (:attr:`~lightning_ig.attribution.IGResult.attribution_error`);
3. the rule: the midpoint rule, unless a candidate's worst error is below ``margin`` (0.5) x the midpoint's, i.e. at
   least twice as accurate (few states rank rules noisily: with 4 states and no margin a warp was picked on a
   CartPole agent and made its worst held-out state 3x worse; 8 states and the margin kept the midpoint on every
   in-distribution family measured and picked ``warped_middle:2`` on frames x255, 3.5x more accurate);
4. the scale: the largest ratio true / estimated error over the ordinary states of the chosen rule, clipped to
   ``[0.05, 4]`` (measured: 0.73-1.35 on ReLU networks in distribution, 2.16 on the x255 frames with the midpoint,
   0.05-0.44 on smooth networks, whose curvature the kink model overstates).

Cost: ``(reference_steps + len(CANDIDATES) x n_steps) x states`` gradient rows, 8 x (1024 + 6 x 64) = 11264 at the
defaults, about 3.5 callback runs of 64 states x 50 steps: 7% of the callback's IG time when re-run every 50 runs.

When it can be wrong
    The states it sees are the first few held-out ones: a rule or scale fitted to them is wrong for states unlike
    them (the clip to ``[0.05, 4]`` bounds how wrong the scale can make the estimate). The reference is itself a
    midpoint rule: on a network whose error at ``reference_steps`` is not small next to the rule's (extremely
    many kinks per unit of ``alpha``) the true errors, and so the scale, read low.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lightning_ig.attribution.inputs import Baselines, RunningStatistics, prepare
from lightning_ig.attribution.options import DEFAULT_METHOD, DEFAULT_N_STEPS, parse_settings
from lightning_ig.attribution.path import PathRun, chunk_rows, rule_tensors
from lightning_ig.attribution.result import near_baseline_states
from lightning_ig.attribution.targets import Target
from lightning_ig.ops.ig import IGOps
from lightning_ig.vocabulary import BackendName, check_method, check_positive_float, check_positive_int, shown

__all__ = ["CALIBRATION_STATES", "CANDIDATES", "REFERENCE_STEPS", "SCALE_RANGE", "Calibration", "calibrate"]

CANDIDATES = (
    DEFAULT_METHOD,
    "warped_middle:1.5",
    "warped_middle:2",
    "warped_middle:3",
    "mirrored_middle:2",
    "cosine_middle",
)
"""The rules calibration compares: the midpoint rule, warps towards the baseline, one towards the input, both ends."""

CALIBRATION_STATES = 8
"""How many states calibration uses (the first ones given): 4 ranked rules too noisily on CartPole."""

SCALE_RANGE = (0.05, 4.0)
"""The error scale is clipped to this range: a few states never shrink or blow up the estimate past it."""

REFERENCE_STEPS = 1024
"""Midpoint nodes of the reference (float64 sums)."""

_BLOCK_ELEMENTS = 1 << 24  # the reference's gradients are summed in blocks of at most this many elements


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` found.

    Attributes:
        method: the rule chosen (one of the candidates; the midpoint rule unless another was >= 2x better).
        n_steps: the nodes the candidates were scored at.
        error_scale: the factor for the error estimate (largest true / estimated ratio, clipped to ``[0.05, 4]``).
        worst_errors: each candidate's worst true error over the ordinary calibration states.
        num_states: the states used.
        gradient_rows: gradient rows spent (reference and candidates).
        seconds: wall time it took (the device synchronised at the end).
    """

    method: str
    n_steps: int
    error_scale: float
    worst_errors: dict[str, float]
    num_states: int
    gradient_rows: int
    seconds: float


def calibrate(
    forward: Callable[[Tensor], Tensor],
    states: Tensor,
    baselines: Baselines = None,
    *,
    target: Target = None,
    n_steps: int = DEFAULT_N_STEPS,
    gradient: Literal["autograd", "finite_difference"] = "autograd",
    backend: BackendName | IGOps = "auto",
    internal_batch_size: int | None = None,
    candidates: Sequence[str] = CANDIDATES,
    reference_steps: int = REFERENCE_STEPS,
    margin: float = 0.5,
    num_states: int = CALIBRATION_STATES,
) -> Calibration:
    """Pick a rule for ``forward`` and the scale of its error estimate (see the module docstring).

    Args:
        forward: as for :func:`~lightning_ig.attribution.integrated_gradients`.
        states: ``(B, *feature_shape)``; the first ``num_states`` are used.
        baselines: as for :func:`~lightning_ig.attribution.integrated_gradients` (a per-state tensor: its first
            ``num_states`` rows).
        target: as for :func:`~lightning_ig.attribution.integrated_gradients` (``"each"``: every output's errors
            count).
        n_steps: the nodes the run will use; candidates are scored there.
        gradient, backend, internal_batch_size: as for :func:`~lightning_ig.attribution.integrated_gradients`.
        candidates: the rules compared; the first is the default kept unless another is clearly better.
        reference_steps: midpoint nodes of the reference.
        margin: another candidate is chosen only if its worst error is below ``margin`` x the first's.
        num_states: how many states to use.

    Returns:
        A :class:`Calibration`.

    Raises:
        TypeError, ValueError: a bad option (the message names it), or the errors of
            :func:`~lightning_ig.attribution.integrated_gradients` for the forward, states and target.

    Example::

        found = calibrate(q_network, held_out, target="mean", n_steps=64)
        result = integrated_gradients(q_network, states, target="mean", n_steps=64, method=found.method,
                                      error_scale=found.error_scale)
    """
    started = time.perf_counter()
    n_steps = check_positive_int(n_steps, "n_steps", example=DEFAULT_N_STEPS)
    reference_steps = check_positive_int(reference_steps, "reference_steps", example=REFERENCE_STEPS)
    num_states = check_positive_int(num_states, "num_states", example=CALIBRATION_STATES)
    margin = check_positive_float(margin, "margin")
    if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
        raise TypeError(f"candidates must be a non-empty sequence of method names, got {shown(candidates)}")
    rules = [check_method(name, "candidates") for name in candidates]
    settings = parse_settings(
        {
            "target": target,
            "n_steps": n_steps,
            "gradient": gradient,
            "backend": backend,
            "internal_batch_size": internal_batch_size,
            "cuda_graph": False,
        }
    )
    for rule in rules:
        parse_settings({"n_steps": n_steps, "method": rule})  # a rule that cannot have n_steps nodes fails now
    if not isinstance(states, Tensor):
        raise TypeError(f"states must be a torch.Tensor of shape (B, *feature_shape), got {type(states).__name__}")
    count = min(num_states, states.shape[0]) if states.dim() else 0
    if isinstance(baselines, Tensor) and baselines.dim() == states.dim() and baselines.shape[0] == states.shape[0]:
        baselines = baselines[:count]
    with torch.inference_mode(False), torch.enable_grad():
        prepared = prepare(forward, states[:count], baselines, settings)
        run = PathRun(
            forward,
            prepared.x,
            prepared.b,
            prepared.feature_shape,
            prepared.spec,
            settings,
            prepared.backend,
            chunk_rows(settings, prepared.x),
        )
        run.check_stochastic = False
        statistics = RunningStatistics(forward)
        saved = statistics.save()
        try:
            reference = _reference(run, reference_steps)  # (T, B, F) float64
            scored = {rule: _scored(run, rule, n_steps, reference) for rule in rules}
        finally:
            statistics.restore(saved)
    worst = {rule: float(errors.max()) if errors.numel() else math.nan for rule, (errors, _) in scored.items()}
    default = rules[0]
    best = min(rules, key=lambda rule: worst[rule] if math.isfinite(worst[rule]) else math.inf)
    if not worst[best] < margin * worst[default]:  # NaN (nothing ordinary) keeps the default too
        best = default
    errors, estimates = scored[best]
    with_estimate = estimates > 0
    ratios = torch.where(with_estimate, errors / torch.where(with_estimate, estimates, 1.0), math.inf)
    ratios = ratios[(errors > 0) | with_estimate]  # a state without error and without estimate says nothing
    low, high = SCALE_RANGE
    scale = 1.0 if ratios.numel() == 0 else min(high, max(low, float(ratios.max())))
    rows = (reference_steps + len(rules) * n_steps) * count
    return Calibration(best, n_steps, scale, worst, count, rows, time.perf_counter() - started)


def _reference(run: PathRun, steps: int) -> Tensor:
    """``(T, B, F)``: the midpoint rule with ``steps`` nodes, gradients summed in float64, in blocks of nodes."""
    alphas, _ = rule_tensors(DEFAULT_METHOD, steps, run.acc, run.x.device)
    block = max(1, min(steps, _BLOCK_ELEMENTS // max(1, run.batch * run.features)))  # bounded memory, any steps
    total: Tensor | None = None
    for first in range(0, steps, block):
        grads = run.gradients(alphas[first : first + block], with_ends=False).grads  # (T, m, B, F)
        part = grads.to(torch.float64).sum(1)
        total = part if total is None else total + part
    assert total is not None  # noqa: S101 - steps >= 1
    diff = run.x.to(torch.float64) - run.b.to(torch.float64)
    return diff * total / steps


def _scored(run: PathRun, rule: str, n_steps: int, reference: Tensor) -> tuple[Tensor, Tensor]:
    """The rule's true errors and unscaled estimates ``(K,)`` over the ordinary (target, state) pairs."""
    alphas, weights = rule_tensors(rule, n_steps, run.acc, run.x.device)
    path = run.gradients(alphas, with_ends=True)
    assert path.ends is not None  # noqa: S101 - with_ends=True
    out = run.finish(alphas, weights, path.grads, path.ends, path.values)
    mass = reference.abs().sum(-1)  # (T, B)
    true = (out["attributions"].to(torch.float64) - reference).abs().sum(-1) / mass.clamp_min(
        torch.finfo(torch.float64).tiny
    )
    estimate = out["accuracy"][0].to(torch.float64)
    ordinary = ~near_baseline_states(mass) & torch.isfinite(true) & torch.isfinite(estimate)
    return true[ordinary], estimate[ordinary]
