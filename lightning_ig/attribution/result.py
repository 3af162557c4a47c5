"""What an Integrated Gradients run returns: :class:`IGResult`, and the one definition of its worst errors.

Each state of a result carries two error figures that can fail (:mod:`~lightning_ig.attribution.estimate` computes them
on the device): ``attribution_error``, the reference-free estimate of ``||a - a_exact||_1 /
||a_exact||_1``, and ``mass_relative_error``, ``|sum(a) - dF| / max(sum|a|, |dF|)``. A state whose scale
``max(||a||_1, |dF|)`` is below a tenth of the batch median is *near the baseline*: every relative figure is
ill-conditioned there, so it is flagged and counted (:attr:`IGResult.num_near_baseline`), never scored in the worst
figures (:func:`worst_over_ordinary`) nor hidden. A forward whose gradient is zero where its value changes (a step, an
argmax) has ``||a||_1 = 0`` but not ``dF``: it is scored, and its mass-relative error is 1.

For completeness (``sum(a) = F(x) - F(b)``), each state of a result is exactly one of

* *non-finite*: ``F(x)``, ``F(b)``, an attribution or their completeness sum is NaN/Inf (a diverged model, an
  overflowing forward). Its relative error is ``inf`` and it makes :attr:`IGResult.worst_relative_error` ``inf``: never
  clean.
* *degenerate*: finite, but ``|F(x) - F(b)|`` is within the forward's rounding noise, so the ratio
  ``|delta| / |F(x) - F(b)|`` means nothing. Its relative error is NaN; its absolute error stays in ``delta``.
* *checked*: everything else, with relative error ``|delta| / |F(x) - F(b)|``.

The flags are computed on the device (nothing reaches the host until a property is read).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from lightning_ig.attribution.groups import FeatureGroups

if TYPE_CHECKING:  # the parts of a run, read here, import this module
    from lightning_ig.attribution.settings import IGOptions
    from lightning_ig.attribution.targets import Target
    from lightning_ig.ops.ig import IGOps

__all__ = [
    "COLUMNS",
    "NEAR_BASELINE_FRACTION",
    "SILENCED",
    "IGResult",
    "StochasticForwardWarning",
    "build_result",
    "lower_median",
    "near_baseline_states",
    "pack",
    "stochastic_warnings_silenced",
    "worst_over_ordinary",
    "worst_relative_error",
]

NEAR_BASELINE_FRACTION = 0.1
"""A state whose ``||a||_1`` is below this fraction of the batch median is near the baseline (flagged, not scored)."""


class StochasticForwardWarning(RuntimeWarning):
    """The forward gave different values on the same rows within one call.

    Dropout or batch-norm in train mode, or noise drawn inside the forward: the attributions of such a forward are not
    reproducible and completeness does not hold. Put the model in ``eval()`` mode and switch its noise off
    (:func:`lightning_ig.models.noise_disabled`) before attributing.
    """


class _Silenced(threading.local):
    depth = 0  # stochastic_warnings_silenced blocks open on this thread (the engine's warning is not given in one)


SILENCED = _Silenced()


@contextlib.contextmanager
def stochastic_warnings_silenced() -> Iterator[None]:
    """Quiet :class:`StochasticForwardWarning` inside the block: for callers that say it once, in their own words.

    The engine warns at every call whose forward was stochastic; the callback warns once per kind of trouble, and
    ``lightning-ig diag`` refuses such a model (exit 2) instead.
    """
    # not warnings.catch_warnings: its exit resets Python's once-per-place memory (the user's warnings said every run)
    SILENCED.depth += 1
    try:
        yield
    finally:
        SILENCED.depth -= 1


@dataclass(frozen=True)
class IGResult:
    """What one Integrated Gradients run produced.

    Tensors stay on the inputs' device; nothing is copied to the host until a property such as
    :attr:`worst_relative_error` is read. Each state is non-finite, degenerate or checked (see the module docstring).

    Attributes:
        attributions: ``(B, *feature_shape)``, or ``(A, B, *feature_shape)`` for ``target="each"``; the inputs' dtype.
        f_input: ``(B,)`` (``(A, B)`` for ``"each"``) the target at the inputs.
        f_baseline: ``(B,)`` (``(A, B)``) the target at the baselines.
        delta: ``sum(attributions) - (f_input - f_baseline)`` per state (Captum's sign).
        relative_error: ``|delta| / |f_input - f_baseline|`` for a checked state; NaN for a degenerate state, ``inf``
            for a non-finite one.
        degenerate: bool, ``|f_input - f_baseline| <= sqrt(eps) * max(1, |f_input|, |f_baseline|)`` with ``eps`` that of
            the accumulation dtype; never set on a non-finite state.
        non_finite: bool, ``f_input``, ``f_baseline``, ``delta`` or any attribution of the state is NaN/Inf.
        baselines: ``(B, *feature_shape)`` as used.
        n_steps: the quadrature points used (for ``n_steps="auto"``, where it stopped).
        method: the rule that ran (``method="auto"`` resolved: ``"kink_midpoint"`` or ``"riemann_middle"``; for
            ``n_steps="auto"``, its first level's).
        gradient: ``"autograd"`` or ``"finite_difference"``.
        backend: ``"cuda"`` (the kernels of ``kernels/ig.cu``) or ``"torch"``.
        target: what was attributed, the target's label (:attr:`~lightning_ig.attribution.targets.Target.label`):
            ``"output"``, ``"mean"``, ``"action:<k>"``, ``"per_row"``, ``"each"``, ``"contrast"`` or
            ``"callable:<name>"``.
        fd_step: the relative finite-difference step (``None`` for autograd).
        internal_batch_size: rows per forward in the last chunk run.
        cuda_graph: whether the result came from a replayed CUDA graph.
        stochastic: the forward gave different values to the two copies of the path's ends evaluated in the same batch,
            or its module normalises with batch statistics (batch-norm in train mode); checked on every eager call and
            when a CUDA graph is captured (a replay reports what its capture found). A :class:`StochasticForwardWarning`
            said so.
        attribution_error: ``(B,)`` (``(A, B)``) the reference-free estimate of ``||a - a_exact||_1 / ||a_exact||_1``
            (:mod:`~lightning_ig.attribution.kinks` for the kink rule,
            :func:`~lightning_ig.attribution.estimate.error_estimate` for the others); where it reads low (kinks that
            share a stretch and cancel, kinks crowded at an end of the path) or high: ``docs/trust.md``.
        mass_relative_error: ``(B,)`` (``(A, B)``) ``|sum(a) - dF| / max(sum|a|, |dF|)``: well conditioned where ``dF``
            is tiny; a lower bound of the per-feature error (it can fail a map, never vouch for one: errors of opposite
            sign cancel in the sum).
        attribution_mass: ``(B,)`` (``(A, B)``) ``||a||_1`` per state.
        near_baseline: bool ``(B,)`` (``(A, B)``): ``max(||a||_1, |dF|)`` below :data:`NEAR_BASELINE_FRACTION` x the
            batch median (or zero); computed when first read (the callback flags the states on the gathered batch
            instead, so its runs never pay for it).
        n_steps_per_state: ``(B,)`` int64: the points each state used with ``n_steps="auto"`` (it stops per state);
            ``None`` when every state used :attr:`n_steps`.
        target_actions: ``(B, 2)`` int64 for ``target="contrast"``: each state's greedy and runner-up outputs, chosen at
            the state and held fixed along the path; else ``None``.

    Example::

        result = integrated_gradients(value, states)
        if result.num_non_finite:
            print("the model produced NaN/Inf for state", result.first_non_finite)
        print(result.worst_attribution_error, result.worst_mass_relative_error, result.num_near_baseline)
        print(accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01))
    """

    attributions: Tensor
    f_input: Tensor
    f_baseline: Tensor
    delta: Tensor
    relative_error: Tensor
    degenerate: Tensor
    non_finite: Tensor
    baselines: Tensor
    n_steps: int
    method: str
    gradient: str
    backend: str
    target: str
    fd_step: float | None = None
    internal_batch_size: int | None = None
    cuda_graph: bool = False
    stochastic: bool = False
    attribution_error: Tensor = field(kw_only=True)  # the engine's every result has these three: never None
    mass_relative_error: Tensor = field(kw_only=True)
    attribution_mass: Tensor = field(kw_only=True)
    n_steps_per_state: Tensor | None = None
    target_actions: Tensor | None = None

    def grouped(self, groups: Any, names: Sequence[str] | None = None) -> Tensor:
        """The attributions summed per feature group: ``(B, G)`` (``(A, B, G)`` for ``target="each"``).

        A group's attribution is the sum of its members', so completeness holds per state for groups as for features.

        Args:
            groups: anything :meth:`lightning_ig.attribution.groups.FeatureGroups.resolve` takes: a ``FeatureGroups``,
                ``"features"``, ``"channels"``, an integer mask of the feature shape (Captum's ``feature_mask``) or
                ``{name: indices | bool mask}``.
            names: group names replacing the defaults.

        Returns:
            The group sums, deterministic (no atomics), on the attributions' device.

        Raises:
            TypeError, ValueError: ``groups`` does not describe a partition of this feature shape.

        Example::

            per_channel = result.grouped("channels")   # (B, C) for (B, C, H, W) states
        """
        feature_shape = tuple(self.baselines.shape[1:])
        resolved = FeatureGroups.resolve(groups, feature_shape, names)
        leading = self.attributions.shape[: self.attributions.dim() - len(feature_shape)]  # (B,) or (A, B)
        sums = resolved.sum(self.attributions.reshape(-1, *feature_shape))  # (prod(leading), G)
        return sums.reshape(*leading, sums.shape[-1])

    @property
    def worst_relative_error(self) -> float:
        """The result's completeness in one number; never ``0.0`` for "nothing was checked".

        ``inf`` when any state is non-finite; NaN when no state could be checked (every state degenerate); otherwise the
        largest relative error over the checked states.
        """
        return worst_relative_error(self.relative_error, self.degenerate, self.non_finite)

    @property
    def worst_attribution_error(self) -> float:
        """The largest :attr:`attribution_error` over the ordinary states (see :func:`worst_over_ordinary`)."""
        return worst_over_ordinary(self.attribution_error, self.near_baseline, self.non_finite)

    @property
    def worst_mass_relative_error(self) -> float:
        """The largest :attr:`mass_relative_error` over the ordinary states (see :func:`worst_over_ordinary`)."""
        return worst_over_ordinary(self.mass_relative_error, self.near_baseline, self.non_finite)

    @property
    def num_near_baseline(self) -> int:
        """How many states are near the baseline (per action for ``"each"``): flagged, not scored."""
        return int(self.near_baseline.sum())

    @functools.cached_property
    def near_baseline(self) -> Tensor:
        """Bool flags of the states near the baseline (see the class docstring); computed when first read."""
        return near_baseline_states(torch.maximum(self.attribution_mass, (self.f_input - self.f_baseline).abs()))

    @property
    def mean_abs_error(self) -> float:
        """The mean ``|delta|`` over all states, degenerate ones included (NaN/Inf with a non-finite state)."""
        return float(self.delta.abs().mean())

    @property
    def num_degenerate(self) -> int:
        """How many states were too degenerate for a relative error (per action for ``"each"``)."""
        return int(self.degenerate.sum())

    @property
    def num_non_finite(self) -> int:
        """How many states had a NaN/Inf forward value or attribution (per action for ``"each"``)."""
        return int(self.non_finite.sum())

    @property
    def num_checked(self) -> int:
        """How many states had a relative error to check: neither degenerate nor non-finite."""
        return self.non_finite.numel() - self.num_degenerate - self.num_non_finite

    @property
    def first_non_finite(self) -> int | None:
        """The index (0 to B - 1) of the first state with a NaN/Inf value (in any action for ``"each"``), or None."""
        per_state = self.non_finite.reshape(-1, self.non_finite.shape[-1]).any(dim=0)  # (B,)
        found = per_state.nonzero()
        return int(found[0, 0]) if found.numel() else None


def worst_relative_error(relative_error: Tensor, degenerate: Tensor, non_finite: Tensor) -> float:
    """``inf`` if any state is non-finite, NaN if none was checked, else the largest checked relative error.

    The one definition of the worst completeness error (:attr:`IGResult.worst_relative_error`); the arguments are an
    :class:`IGResult`'s fields of the same names (any shape, any device).

    Args:
        relative_error: per-state relative errors.
        degenerate: bool flags, same shape.
        non_finite: bool flags, same shape.

    Returns:
        A Python float (one host read).
    """
    # the checked states are the ordinary ones of this figure: a degenerate state is set apart as a near-baseline one is
    return worst_over_ordinary(relative_error, degenerate, non_finite)


def worst_over_ordinary(values: Tensor, near_baseline: Tensor, non_finite: Tensor) -> float:
    """The worst of a per-state error figure over the *ordinary* states: finite and not near the baseline.

    ``inf`` when any state is non-finite (as :func:`worst_relative_error`: never clean), NaN when no state is ordinary,
    else the largest value over the ordinary states. One host read.

    Args:
        values: the per-state figure (``attribution_error`` or ``mass_relative_error``), any shape.
        near_baseline: bool flags, same shape.
        non_finite: bool flags, same shape.
    """
    if values.numel() == 0:
        return math.nan
    ordinary = ~(near_baseline | non_finite)
    candidates = torch.where(ordinary, values, torch.full_like(values, -math.inf))
    flags = torch.stack([non_finite.any().to(values.dtype), ordinary.any().to(values.dtype), candidates.max()])
    any_non_finite, any_ordinary, largest = flags.tolist()  # one host sync for all three
    if any_non_finite:
        return math.inf
    if not any_ordinary:
        return math.nan
    return largest if largest == largest else math.inf  # a NaN figure on a finite state: never clean


def near_baseline_states(scale: Tensor) -> Tensor:
    """Bool flags of the states near the baseline: ``scale < NEAR_BASELINE_FRACTION x`` the median over the last dim.

    ``scale`` is ``max(||a||_1, |F(x) - F(b)|)`` per state, ``(..., B)``; the median is the lower middle value for an
    even count (torch's) over the finite scales; a state without scale is near the baseline whatever the median. On the
    device, no sync.
    """
    finite = torch.where(torch.isfinite(scale), scale, torch.full_like(scale, math.nan))
    return (scale < NEAR_BASELINE_FRACTION * lower_median(finite)) | (scale == 0)


def lower_median(values: Tensor) -> Tensor:
    """``torch.nanmedian(values, dim=-1, keepdim=True).values``, as a quantile: CUDA has no deterministic median with a
    dim, so that one raised under ``torch.use_deterministic_algorithms`` (``Trainer(deterministic=True)``)."""
    wide = values.to(torch.promote_types(values.dtype, torch.float32))  # a quantile takes float32 or float64 only
    return torch.nanquantile(wide, 0.5, dim=-1, keepdim=True, interpolation="lower").to(values.dtype)


class _PathFacts(Protocol):
    """What a result records of the path run that made it (:class:`~lightning_ig.attribution.path.PathRun`)."""

    backend: IGOps
    fd_step: float | None
    chunk_rows: int
    pairs: Tensor | None


def build_result(
    out: dict[str, Tensor],
    resolved: Tensor,
    spec: Target,
    settings: IGOptions,
    run: _PathFacts,
    n_steps: int,
    *,
    graph: bool,
    stochastic: bool,
) -> IGResult:
    """The :class:`IGResult` of a run's ``out`` (attributions ``(T, B, F)``, stats ``(7, T, B)``, accuracy
    ``(3, T, B)``, optionally ``n_steps_per_state (B,)``), with views only.

    ``resolved`` is the baselines in the inputs' shape; ``run`` says how the run went (its operations' name, the
    finite-difference step, the rows per forward). The eager path and a graph's replay both end here.
    """
    stats, accuracy = out["stats"], out["accuracy"]
    if spec.every_output:
        attributions = out["attributions"].view(-1, *resolved.shape)  # (A, B, F) -> (A, B, *feature_shape)
    else:
        attributions = out["attributions"].view(resolved.shape)  # (1, B, F) -> (B, *feature_shape)
        stats = stats.view(stats.shape[0], -1)  # (7, 1, B) -> (7, B)
        accuracy = accuracy.view(accuracy.shape[0], -1)  # (3, 1, B) -> (3, B)
    f_input, f_baseline, delta, relative_error = stats[:4].unbind(0)
    degenerate, non_finite = (stats[4:6] != 0).unbind(0)  # both flags in one comparison
    return IGResult(
        attributions=attributions,
        f_input=f_input,
        f_baseline=f_baseline,
        delta=delta,
        relative_error=relative_error,
        degenerate=degenerate,
        non_finite=non_finite,
        baselines=resolved,
        n_steps=n_steps,
        method=settings.method,
        gradient=settings.gradient,
        backend=run.backend.name,
        target=spec.label,
        fd_step=run.fd_step,
        internal_batch_size=run.chunk_rows,
        cuda_graph=graph,
        stochastic=stochastic,
        attribution_error=accuracy[0],
        mass_relative_error=accuracy[1],
        attribution_mass=accuracy[2],
        n_steps_per_state=out.get("n_steps_per_state"),
        target_actions=None if run.pairs is None else run.pairs.clone(),
    )


# One rank's result as one tensor (B, F + 10): each state's attributions, then these per-state columns in this
# order; the tensor that one collective gathers under DDP and that HostResult.begin reduces.
COLUMNS: tuple[str, ...] = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite", "n_steps")
COLUMNS += ("stochastic", "attribution_error", "mass_relative_error")


def pack(result: Any) -> tuple[Tensor, tuple[int, ...]]:
    """One rank's result as the single tensor that is gathered, and the feature shape.

    Returns:
        ``(B, F + 10)`` in the attributions' dtype (at least float32): each state's flattened attributions, then
        ``f_input``, ``f_baseline``, ``delta``, ``relative_error``, ``degenerate``, ``non_finite``, ``n_steps`` (per
        state), ``stochastic``, ``attribution_error``, ``mass_relative_error`` (NaN where the result has no such
        figure); and ``feature_shape``.
    """
    attributions, f_input = result.attributions, torch.as_tensor(result.f_input)
    if attributions.ndim < 2 or f_input.ndim != 1 or f_input.shape[0] != attributions.shape[0]:
        raise ValueError(
            f"expected one forward value per state, got f_input of shape {tuple(f_input.shape)} for attributions "
            f"of shape {tuple(attributions.shape)}; for target='each' build one report per action "
            "(index the result's tensors)"
        )
    share, dtype = attributions.shape[0], torch.promote_types(attributions.dtype, torch.float32)
    non_finite = getattr(result, "non_finite", None)
    flags = torch.zeros(share, dtype=dtype, device=attributions.device) if non_finite is None else non_finite
    full = functools.partial(torch.full, (share,), dtype=dtype, device=attributions.device)
    missing, steps = full(float("nan")), getattr(result, "n_steps_per_state", None)
    columns = [
        *(getattr(result, name) for name in COLUMNS[:5]),  # f_input, f_baseline, delta, relative_error, degenerate
        flags,
        full(float(result.n_steps)) if steps is None else steps,
        full(float(bool(getattr(result, "stochastic", False)))),
        *(missing if getattr(result, name, None) is None else getattr(result, name) for name in COLUMNS[-2:]),
    ]
    per_state = torch.stack(
        [torch.as_tensor(c, device=attributions.device).reshape(share).to(dtype) for c in columns], 1
    )
    packed = torch.cat([attributions.reshape(share, -1).to(dtype), per_state], dim=1)  # (B, F + 10)
    return packed, tuple(int(size) for size in attributions.shape[1:])
