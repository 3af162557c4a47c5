"""Calibration: pick a quadrature rule per model, and re-centre the error estimate if it needs it, on a few states.

Where a ReLU network's kinks sit along the path depends on the model and its states, so no single rule wins:
the uniform midpoint rule is best (or within 15% of the best) on in-distribution states, while inputs far off the
training distribution crowd the kinks near the baseline, where a warped rule is several times more accurate.
:func:`calibrate` decides per model, against a reference, on the first :data:`CALIBRATION_STATES` states:

1. the reference: the midpoint rule with ``reference_steps`` nodes (by default ``max(1024, 4 n_steps)``) of the
   same forward, the gradients summed in float64 (accurate to about ``n_steps / reference_steps`` of the rule's
   own error: enough to rank rules and to see whether the estimate is centred);
2. each candidate of :data:`CANDIDATES` at the run's ``n_steps`` (``"budget"`` is resolved on all the states
   given, the batch the run will attribute): its worst true error ``||a - a_ref||_1 / ||a_ref||_1`` over the
   ordinary states (not near the baseline) and its unscaled estimate
   (:attr:`~lightning_ig.attribution.IGResult.attribution_error`); the reference's and the candidates' nodes go
   through the network in as few passes as memory allows (one or two for a CartPole or MinAtar network);
3. the rule: the midpoint rule, unless a candidate's worst error is below ``margin`` (0.5) x the midpoint's, i.e. at
   least twice as accurate (few states rank rules noisily: with 4 states and no margin a warp was picked on a
   CartPole agent and made its worst held-out state 3x worse; 8 states and the margin kept the midpoint on every
   in-distribution family measured and picked ``warped_middle:2`` on frames x255, 3.5x more accurate);
4. the scale: 1, unless the ratios true / estimated error over the ordinary states of the chosen rule leave the
   band ``[1/sqrt 2, sqrt 2]`` (inside which the verdict is right, :func:`~lightning_ig.run.accuracy_verdict`):
   their median where that is above the band (the estimate reads low on most states: kinks crowded at an end), their
   largest where even that is below it (it reads high on every state: Gauss-Legendre on a smooth network); clipped
   to ``[0.05, 4]``. It lowers the estimate only as far as the state it reads lowest, because 8 states are few: a
   scale from their median below the band (tried) put a trained tanh CartPole's worst state at 0.41x and three
   CartPole agents' at 0.56-0.64x, whose first 8 states happened to be over-read. The estimate is centred where its
   models hold (median true / estimated 0.77-1.00 on every family measured), so the scale stays 1 there; a scale
   fitted to the worst of 8 states always (the rule before) made it over-read everywhere else.

Cost: ``(reference_steps + len(CANDIDATES) x n_steps) x states`` gradient rows: 8 x (1024 + 4 x 256) = 16384 at 256
nodes, 8 x (1024 + 4 x 64) = 10240 at 64, in 2-5 passes; :attr:`Calibration.seconds` says what it took.

When it can be wrong
    The states it sees are the first few held-out ones: a rule or scale fitted to them is wrong for states unlike
    them (the clip to ``[0.05, 4]`` bounds how wrong the scale can make the estimate). The reference is itself a
    midpoint rule: on a network whose error at ``reference_steps`` is not small next to the rule's (extremely
    many kinks per unit of ``alpha``) the true errors read low.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lightning_ig.attribution.budget import budget_steps
from lightning_ig.attribution.inputs import Baselines, RunningStatistics, prepare
from lightning_ig.attribution.path import PathRun, chunk_rows, rule_tensors
from lightning_ig.attribution.result import near_baseline_states
from lightning_ig.attribution.settings import BUDGET, DEFAULT_METHOD, DEFAULT_N_STEPS, IGOptions
from lightning_ig.attribution.targets import Target, TargetLike
from lightning_ig.ops.ig import IGOps
from lightning_ig.vocabulary import (
    BackendName,
    check_method,
    check_n_steps,
    check_optional_positive_int,
    check_positive_float,
    check_positive_int,
    shown,
)

__all__ = [
    "CALIBRATION_STATES",
    "CANDIDATES",
    "CENTRED_BAND",
    "REFERENCE_STEPS",
    "SCALE_RANGE",
    "Calibration",
    "calibrate",
]

CANDIDATES = (DEFAULT_METHOD, "warped_middle:2", "mirrored_middle:2", "cosine_middle")
"""The rules calibration compares: the midpoint rule, nodes crowded near the baseline, near the input, near both
ends (the milder and stronger warps ``warped_middle:1.5`` and ``:3`` were never picked where ``:2`` was not)."""

CALIBRATION_STATES = 8
"""How many states calibration uses (the first ones given): 4 ranked rules too noisily on CartPole."""

SCALE_RANGE = (0.05, 4.0)
"""The error scale is clipped to this range: a few states never shrink or blow up the estimate past it."""

CENTRED_BAND = (1 / math.sqrt(2), math.sqrt(2))
"""Ratios true / estimated error inside this band (the verdict's) leave the scale at 1."""

REFERENCE_STEPS = 1024
"""The fewest midpoint nodes of the reference (float64 sums); at least 4 x ``n_steps``."""

_PASS_ELEMENTS = 1 << 24  # gradients held at once: the nodes of a pass x states x features, at most this many


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` found.

    Attributes:
        method: the rule chosen (one of the candidates; the midpoint rule unless another was >= 2x better).
        n_steps: the nodes the candidates were scored at (``"budget"`` resolved).
        error_scale: the factor for the error estimate: 1, or what re-centres an estimate that reads off
            :data:`CENTRED_BAND` (step 4 of the module docstring; clipped to :data:`SCALE_RANGE`).
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
    target: TargetLike = None,
    n_steps: int | Literal["budget"] = DEFAULT_N_STEPS,
    gradient: Literal["autograd", "finite_difference"] = "autograd",
    backend: BackendName | IGOps = "auto",
    internal_batch_size: int | None = None,
    candidates: Sequence[str] = CANDIDATES,
    reference_steps: int | None = None,
    margin: float = 0.5,
    num_states: int = CALIBRATION_STATES,
    batch: int | None = None,
) -> Calibration:
    """Pick a rule for ``forward`` and the scale of its error estimate (see the module docstring).

    Args:
        forward: as for :func:`~lightning_ig.attribution.integrated_gradients`.
        states: ``(B, *feature_shape)``: the states the run will attribute; the first ``num_states`` are used
            (and ``n_steps="budget"`` is resolved for all ``B``).
        baselines: as for :func:`~lightning_ig.attribution.integrated_gradients` (a per-state tensor: its first
            ``num_states`` rows).
        target: as for :func:`~lightning_ig.attribution.integrated_gradients` (``"each"``: every output's errors
            count).
        n_steps: the nodes the run will use (``"budget"``, the default, as the run resolves it); candidates are
            scored there.
        gradient, backend, internal_batch_size: as for :func:`~lightning_ig.attribution.integrated_gradients`.
        candidates: the rules compared; the first is the default kept unless another is clearly better.
        reference_steps: midpoint nodes of the reference (default ``max(1024, 4 n_steps)``).
        margin: another candidate is chosen only if its worst error is below ``margin`` x the first's.
        num_states: how many states to use.
        batch: how many states each call of the run attributes, for ``n_steps="budget"`` (default: all of
            ``states``; the callback under DDP passes its rank's share).

    Returns:
        A :class:`Calibration`.

    Raises:
        TypeError, ValueError: a bad option (the message names it; ``n_steps="auto"`` is refused), or the errors
            of :func:`~lightning_ig.attribution.integrated_gradients` for the forward, states and target.

    Example::

        found = calibrate(q_network, held_out, target="mean")
        result = integrated_gradients(q_network, held_out, target="mean", n_steps=found.n_steps,
                                      method=found.method, error_scale=found.error_scale)
    """
    started = time.perf_counter()
    n_steps = check_n_steps(n_steps)
    if n_steps == "auto":
        raise ValueError("calibrate scores rules at a fixed n_steps, got n_steps='auto': pass a number or 'budget'")
    reference_steps = check_optional_positive_int(reference_steps, "reference_steps")
    num_states = check_positive_int(num_states, "num_states", example=CALIBRATION_STATES)
    batch = check_optional_positive_int(batch, "batch")
    margin = check_positive_float(margin, "margin")
    if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
        raise TypeError(f"candidates must be a non-empty sequence of method names, got {shown(candidates)}")
    rules = [check_method(name, "candidates") for name in candidates]
    checked = Target.parse(target)
    settings = IGOptions(
        n_steps=n_steps, gradient=gradient, backend=backend, internal_batch_size=internal_batch_size, cuda_graph=False
    )
    for rule in rules:
        IGOptions(n_steps=n_steps, method=rule)  # a rule that cannot have n_steps nodes fails now
    if not isinstance(states, Tensor):
        raise TypeError(f"states must be a torch.Tensor of shape (B, *feature_shape), got {type(states).__name__}")
    count = min(num_states, states.shape[0]) if states.dim() else 0
    if isinstance(baselines, Tensor) and baselines.dim() == states.dim() and baselines.shape[0] == states.shape[0]:
        baselines = baselines[:count]
    with torch.inference_mode(False), torch.enable_grad():
        prepared = prepare(forward, states[:count], baselines, settings, checked)
        if n_steps == BUDGET:  # what the run on all the states will use
            n_steps = budget_steps(
                forward,
                prepared.x[:1].view(1, *prepared.feature_shape),
                batch or states.shape[0],
                each=prepared.spec.every_output,
                finite_difference=gradient == "finite_difference",
            )
            settings = dataclasses.replace(settings, n_steps=n_steps)
        reference_steps = reference_steps or max(REFERENCE_STEPS, 4 * n_steps)
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
            scored = _Scored(run, rules, n_steps, reference_steps)
            worst = {rule: scored.worst(rule) for rule in rules}
            default = rules[0]
            best = min(rules, key=lambda rule: worst[rule] if math.isfinite(worst[rule]) else math.inf)
            if not worst[best] < margin * worst[default]:  # NaN (nothing ordinary) keeps the default too
                best = default
            scale = _scale(*scored.with_estimate(best))
        finally:
            statistics.restore(saved)
    rows = (reference_steps + len(rules) * n_steps) * count
    return Calibration(best, n_steps, scale, worst, count, rows, time.perf_counter() - started)


def _scale(errors: Tensor, estimates: Tensor) -> float:
    """1, unless the estimate reads off-centre on these states: the median true / estimated ratio where it is above
    :data:`CENTRED_BAND` (the estimate reads low on most states), the largest ratio where even that is below the band
    (it reads high on every state); clipped to :data:`SCALE_RANGE`."""
    with_estimate = estimates > 0
    ratios = torch.where(with_estimate, errors / torch.where(with_estimate, estimates, 1.0), math.inf)
    ratios = ratios[(errors > 0) | with_estimate]  # a state without error and without estimate says nothing
    if ratios.numel() == 0:
        return 1.0
    low, high = CENTRED_BAND
    median, largest = float(ratios.median()), float(ratios.max())
    if median > high:
        return min(SCALE_RANGE[1], median)
    if largest < low:
        return max(SCALE_RANGE[0], largest)
    return 1.0


class _Scored:
    """The candidates' true errors against the reference; the estimate is computed for the chosen rule only.

    The reference's nodes (in pieces) and each candidate's go through the network together, as many per pass as
    :data:`_PASS_ELEMENTS` allows (one pass for a small network: a few launches on a GPU). Each candidate is
    accumulated at once (one kernel); its gradients stay until a rule is chosen.
    """

    def __init__(self, run: PathRun, rules: list[str], n_steps: int, reference_steps: int) -> None:
        self.run, self.n_steps = run, n_steps
        device = run.x.device
        reference_alphas, _ = rule_tensors(DEFAULT_METHOD, reference_steps, run.acc, device)
        largest = max(n_steps, _PASS_ELEMENTS // max(1, run.batch * run.features))
        piece = max(1, min(reference_steps, largest))
        pieces: list[tuple[str, Tensor]] = [
            ("", reference_alphas[first : first + piece]) for first in range(0, reference_steps, piece)
        ]
        pieces += [(rule, rule_tensors(rule, n_steps, run.acc, device)[0]) for rule in rules]
        reference: Tensor | None = None  # (T, B, F) float64: the sum of the reference's gradients
        self.paths: dict[str, tuple[Tensor, Tensor]] = {}  # each rule's gradients (T, n, B, F) and values (T, n, B)
        attributions: dict[str, Tensor] = {}
        self.ends: Tensor | None = None
        while pieces:
            batch = [pieces.pop(0)]
            while pieces and sum(p.shape[0] for _, p in batch) + pieces[0][1].shape[0] <= largest:
                batch.append(pieces.pop(0))
            path = run.gradients(torch.cat([alphas for _, alphas in batch]), with_ends=self.ends is None)
            self.ends = path.ends if self.ends is None else self.ends
            first = 0
            for rule, alphas in batch:
                nodes = slice(first, first + alphas.shape[0])
                first += alphas.shape[0]
                if rule:
                    grads, weights = path.grads[:, nodes], rule_tensors(rule, n_steps, run.acc, device)[1]
                    self.paths[rule] = (grads, path.values[:, nodes])
                    attributions[rule] = run.backend.accumulate(run.x, run.b, weights, grads.contiguous())
                else:
                    part = path.grads[:, nodes].to(torch.float64).sum(1)
                    reference = part if reference is None else reference + part
        assert reference is not None  # noqa: S101 - reference_steps >= 1
        diff = run.x.to(torch.float64) - run.b.to(torch.float64)
        reference = diff * reference / reference_steps
        mass = reference.abs().sum(-1)  # (T, B)
        tiny = torch.finfo(torch.float64).tiny
        self.true = {
            rule: (a.to(torch.float64) - reference).abs().sum(-1) / mass.clamp_min(tiny)
            for rule, a in attributions.items()
        }  # (T, B) each
        self.ordinary = ~near_baseline_states(mass)

    def worst(self, rule: str) -> float:
        """The rule's worst true error over the ordinary (target, state) pairs (NaN when there is none)."""
        true = self.true[rule]
        kept = true[self.ordinary & torch.isfinite(true)]
        return float(kept.max()) if kept.numel() else math.nan

    def with_estimate(self, rule: str) -> tuple[Tensor, Tensor]:
        """The rule's true errors and unscaled estimates ``(K,)`` over the ordinary pairs (estimated now)."""
        alphas, weights = rule_tensors(rule, self.n_steps, self.run.acc, self.run.x.device)
        grads, values = self.paths[rule]
        assert self.ends is not None  # noqa: S101 - the first pass has them
        estimate = self.run.finish(alphas, weights, grads, self.ends, values)["accuracy"][0].to(torch.float64)
        true = self.true[rule]
        keep = self.ordinary & torch.isfinite(true) & torch.isfinite(estimate)
        return true[keep], estimate[keep]
