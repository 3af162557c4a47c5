"""What an Integrated Gradients run returns: :class:`IGResult`, and the one definition of its worst error.

Each state of a result is exactly one of

* *non-finite*: ``F(x)``, ``F(b)``, an attribution or their completeness sum is
  NaN/Inf (a diverged model, an overflowing forward). Its relative error is
  ``inf`` and it makes :attr:`IGResult.worst_relative_error` ``inf``: never clean.
* *degenerate*: finite, but ``|F(x) - F(b)|`` is within the forward's rounding
  noise, so the ratio ``|delta| / |F(x) - F(b)|`` means nothing. Its relative
  error is NaN; its absolute error stays in ``delta``.
* *checked*: everything else, with relative error ``|delta| / |F(x) - F(b)|``.

The flags are computed on the device with the completeness statistics; nothing
reaches the host until a property is read.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_ig.attribution.groups import FeatureGroups

if TYPE_CHECKING:  # the parts of a run, read here, import this module
    from lightning_ig.attribution.options import Settings
    from lightning_ig.attribution.path import PathRun
    from lightning_ig.attribution.targets import TargetSpec

__all__ = [
    "IGResult",
    "StochasticForwardWarning",
    "build_result",
    "stochastic_warnings_silenced",
    "worst_relative_error",
]


class StochasticForwardWarning(RuntimeWarning):
    """The forward gave different values on the same rows within one call.

    Dropout or batch-norm in train mode, or noise drawn inside the forward: the
    attributions of such a forward are not reproducible and completeness does
    not hold. Put the model in ``eval()`` mode and switch its noise off
    (:func:`lightning_ig.noise_disabled`) before attributing.
    """


@contextlib.contextmanager
def stochastic_warnings_silenced() -> Iterator[None]:
    """Quiet :class:`StochasticForwardWarning` inside the block: for callers that say it once, in their own words.

    The engine warns at every call whose forward was stochastic; the callback warns once per kind of trouble, and
    ``lightning-ig diag`` refuses such a model (exit 2) instead.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StochasticForwardWarning)
        yield


@dataclass(frozen=True)
class IGResult:
    """What one Integrated Gradients run produced.

    Tensors stay on the inputs' device; nothing is copied to the host until a
    property such as :attr:`worst_relative_error` is read. Each state is
    non-finite, degenerate or checked (see the module docstring).

    Attributes:
        attributions: ``(B, *feature_shape)``, or ``(A, B, *feature_shape)`` for
            ``target="each"``; the inputs' dtype.
        f_input: ``(B,)`` (``(A, B)`` for ``"each"``) the target at the inputs.
        f_baseline: ``(B,)`` (``(A, B)``) the target at the baselines.
        delta: ``sum(attributions) - (f_input - f_baseline)`` per state (Captum's sign).
        relative_error: ``|delta| / |f_input - f_baseline|`` for a checked state;
            NaN for a degenerate state, ``inf`` for a non-finite one.
        degenerate: bool, ``|f_input - f_baseline| <= sqrt(eps) * max(1, |f_input|, |f_baseline|)``
            with ``eps`` that of the accumulation dtype; never set on a non-finite state.
        non_finite: bool, ``f_input``, ``f_baseline``, ``delta`` or any attribution
            of the state is NaN/Inf.
        baselines: ``(B, *feature_shape)`` as used.
        n_steps: the quadrature points used (for ``n_steps="auto"``, where it stopped).
        method: the quadrature rule.
        gradient: ``"autograd"`` or ``"finite_difference"``.
        backend: ``"cuda"`` (the kernels of ``kernels/ig.cu``) or ``"torch"``.
        target: what was attributed (``lightning_ig.vocabulary.target_label``):
            ``"output"``, ``"mean"``, ``"action:<k>"``, ``"per_row"``, ``"each"``
            or ``"callable:<name>"``.
        fd_step: the relative finite-difference step (``None`` for autograd).
        internal_batch_size: rows per forward in the last chunk run.
        cuda_graph: whether the result came from a replayed CUDA graph.
        stochastic: the forward gave different values to the two copies of the
            path's ends evaluated in the same batch, or its module normalises
            with batch statistics (batch-norm in train mode); checked on every
            eager call and when a CUDA graph is captured (a replay reports what
            its capture found). A :class:`StochasticForwardWarning` said so.

    Example::

        result = integrated_gradients(value, states)
        if result.num_non_finite:
            print("the model produced NaN/Inf for state", result.first_non_finite)
        print(result.worst_relative_error, result.num_checked, result.num_degenerate)
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

    def grouped(self, groups: Any, names: Sequence[str] | None = None) -> Tensor:
        """The attributions summed per feature group: ``(B, G)`` (``(A, B, G)`` for ``target="each"``).

        A group's attribution is the sum of its members', so completeness holds
        per state for groups as for features.

        Args:
            groups: anything :meth:`lightning_ig.attribution.groups.FeatureGroups.resolve` takes:
                a ``FeatureGroups``, ``"features"``, ``"channels"``, an integer mask of
                the feature shape (Captum's ``feature_mask``) or ``{name: indices | bool mask}``.
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

        ``inf`` when any state is non-finite; NaN when no state could be checked
        (every state degenerate); otherwise the largest relative error over the
        checked states.
        """
        return worst_relative_error(self.relative_error, self.degenerate, self.non_finite)

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

    The one definition of the worst completeness error (:attr:`IGResult.worst_relative_error`);
    the arguments are an :class:`IGResult`'s fields of the same names (any shape, any device).

    Args:
        relative_error: per-state relative errors.
        degenerate: bool flags, same shape.
        non_finite: bool flags, same shape.

    Returns:
        A Python float (one host read).
    """
    checked = ~(degenerate | non_finite)
    if relative_error.numel() == 0:
        return math.nan
    largest = torch.where(checked, relative_error, torch.zeros_like(relative_error)).max()  # checked errors are >= 0
    flags = torch.stack([non_finite.any().to(largest.dtype), checked.any().to(largest.dtype), largest])
    any_non_finite, any_checked, largest_checked = flags.tolist()  # one host sync for all three
    if any_non_finite:
        return math.inf
    if not any_checked:
        return math.nan
    return largest_checked


def build_result(
    out: dict[str, Tensor],
    resolved: Tensor,
    spec: TargetSpec,
    settings: Settings,
    run: PathRun,
    n_steps: int,
    *,
    graph: bool,
    stochastic: bool,
) -> IGResult:
    """The :class:`IGResult` of a run's ``out`` (attributions ``(T, B, F)``, stats ``(7, T, B)``), with views only.

    ``resolved`` is the baselines in the inputs' shape; ``run`` says how the run went (its operations' name, the
    finite-difference step, the rows per forward). The eager path and a graph's replay both end here.
    """
    stats = out["stats"]
    if spec.kind == "each":
        attributions = out["attributions"].view(-1, *resolved.shape)  # (A, B, F) -> (A, B, *feature_shape)
    else:
        attributions = out["attributions"].view(resolved.shape)  # (1, B, F) -> (B, *feature_shape)
        stats = stats.view(stats.shape[0], -1)  # (7, 1, B) -> (7, B)
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
    )
