"""Every member of an ensemble attributed beside the aggregate, in one batched IG run.

The training callback and ``lightning-ig diag`` attribute an ensemble's aggregate (its forward, ``(N,)``) and each
member's own signal (``ensemble.member_signals`` ``(N, M)``, ``target="each"``): :func:`find_ensemble` finds the
ensemble behind a model, :class:`MemberAttribution` is the members' engine, and :func:`pack_members` /
:class:`MemberRun` pack their result one row per state (gathered across ranks with the aggregate's) and reduce it on
the host.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.attribution import IGOptions, IGResult, IntegratedGradients, StochasticForwardWarning
from lightning_ig.attribution.targets import EACH, Target
from lightning_ig.ensemble.module import _EnsembleLike, is_ensemble
from lightning_ig.models.noise import attribution_mode

__all__ = ["MemberAttribution", "MemberRun", "find_ensemble", "pack_members"]

# The per-state columns packed after each member's attributions, in this order.
_COLUMNS = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite")


def find_ensemble(model: nn.Module, sample: Tensor) -> _EnsembleLike | None:
    """The ensemble whose aggregate ``model`` computes, or ``None``.

    ``model`` itself when it has ``member_signals`` and ``num_members``
    (:func:`~lightning_ig.ensemble.is_ensemble`); otherwise its one submodule that
    has them, provided ``model(sample)`` equals that submodule's output bit for bit
    (a LightningModule whose forward returns ``self.ensemble(x)``). A model whose
    output is something else (a head on top of an ensemble, two ensembles) has no
    members to attribute.

    Args:
        model: the model whose forward (one value per state) is attributed.
        sample: a few states on the model's device.
    """
    if is_ensemble(model):
        return model
    found = [module for module in model.modules() if module is not model and is_ensemble(module)]
    if len(found) != 1:
        return None
    with attribution_mode(model), torch.no_grad():
        output, aggregate = model(sample), found[0](sample)
    same = isinstance(output, Tensor) and output.shape == aggregate.shape and bool(torch.equal(output, aggregate))
    return found[0] if same else None


class MemberAttribution:
    """The engine that attributes each member's signal of an ensemble (``target="each"``, one run for all).

    Build it with :meth:`prepare`. The engine is the package's
    :class:`~lightning_ig.attribution.IntegratedGradients`, so on CUDA repeated
    runs replay a captured graph.

    Attributes:
        ensemble: the ensemble module.
        engine: the engine over ``ensemble.member_signals``.
    """

    def __init__(self, ensemble: _EnsembleLike, engine: IntegratedGradients) -> None:
        self.ensemble = ensemble
        self.engine = engine

    @classmethod
    def prepare(
        cls, model: nn.Module, target: Target, sample: Tensor, baselines: Any, options: IGOptions
    ) -> MemberAttribution | None:
        """The members' engine when ``model``'s attributed output is an ensemble's aggregate, else ``None``.

        The engine is tried on ``sample`` (two steps, eagerly) so that a member that
        cannot be attributed fails before training.

        Args:
            model: the LightningModule (or model) being attributed.
            target: what is attributed; members are attributed only where it is the model's own output (one value
                per state).
            sample: two states on the model's device, in its dtype.
            baselines: ``sample``'s baselines as the engine takes them.
            options: the aggregate engine's options.
        """
        ensemble = find_ensemble(model, sample) if target.model_output else None
        if ensemble is None:
            return None
        engine = IntegratedGradients(ensemble.member_signals, target=EACH, **options.keywords())
        with attribution_mode(model), warnings.catch_warnings():
            warnings.simplefilter("ignore", StochasticForwardWarning)  # the aggregate's trial says it
            engine.attribute(sample, baselines=baselines, n_steps=2, cuda_graph=False)
        return cls(ensemble, engine)

    @property
    def num_members(self) -> int:
        return self.ensemble.num_members

    def weights(self) -> list[float] | None:
        """The members' weights (``ensemble.weights``) as floats, or ``None`` when the ensemble has none."""
        weights = getattr(self.ensemble, "weights", None)
        return None if weights is None else [float(w) for w in torch.as_tensor(weights).detach().cpu().reshape(-1)]

    def attribute(self, states: Tensor, baselines: Any) -> IGResult:
        """Every member's attributions of ``states``: ``(M, B, *feature_shape)``."""
        return self.engine.attribute(states, baselines=baselines)

    def host_run(self, packed: Tensor, num_states: int) -> MemberRun:
        """The members' host numbers from their packed rows (:func:`pack_members`, gathered or not)."""
        return MemberRun.from_packed(packed, self.num_members, num_states=num_states, weights=self.weights())


def pack_members(result: Any) -> Tensor:
    """One rank's member result as one row per state, to be gathered with the aggregate's.

    Args:
        result: an IG result of ``member_signals`` with ``target="each"``
            (attributions ``(M, B, *feature_shape)``, per-state fields ``(M, B)``).

    Returns:
        ``(B, M * (F + 6))`` in the attributions' dtype (at least float32): per member,
        its flattened attributions, then ``f_input``, ``f_baseline``, ``delta``,
        ``relative_error``, ``degenerate``, ``non_finite``.

    Raises:
        ValueError: the result is not one attribution set per member.
    """
    attributions = result.attributions
    if attributions.ndim < 3 or tuple(torch.as_tensor(result.f_input).shape) != tuple(attributions.shape[:2]):
        raise ValueError(
            f"expected a target='each' result with attributions (M, B, *feature_shape) and f_input (M, B), got "
            f"{tuple(attributions.shape)} and {tuple(torch.as_tensor(result.f_input).shape)}; attribute "
            "ensemble.member_signals with target='each'"
        )
    members, share = attributions.shape[:2]
    dtype = torch.promote_types(attributions.dtype, torch.float32)
    device = attributions.device
    columns = torch.stack(
        [torch.as_tensor(getattr(result, name), device=device).reshape(members, share).to(dtype) for name in _COLUMNS],
        dim=2,
    )  # (M, B, 6)
    packed = torch.cat([attributions.reshape(members, share, -1).to(dtype), columns], dim=2)  # (M, B, F + 6)
    return packed.permute(1, 0, 2).reshape(share, -1)  # (B, M * (F + 6)): one row per state


@dataclass(frozen=True)
class MemberRun:
    """Every member's IG numbers over the states, on the host in float64.

    Attributes:
        mean_abs: ``(M, F)`` mean over the states of ``|attr|``, per member and feature.
        mean_signed: ``(M, F)`` mean of ``attr``.
        sum_attributions, f_input, f_baseline, delta, relative_error: ``(M, B)`` per member and state.
        degenerate, non_finite: ``(M, B)`` bool, as the engine flags states (a non-finite number is non-finite).
        weights: the members' weights, or ``None``.
    """

    mean_abs: np.ndarray
    mean_signed: np.ndarray
    sum_attributions: np.ndarray
    f_input: np.ndarray
    f_baseline: np.ndarray
    delta: np.ndarray
    relative_error: np.ndarray
    degenerate: np.ndarray
    non_finite: np.ndarray
    weights: list[float] | None = None

    @property
    def num_members(self) -> int:
        return int(self.mean_abs.shape[0])

    @property
    def num_states(self) -> int:
        return int(self.f_input.shape[1])

    @classmethod
    def from_result(cls, result: Any, weights: list[float] | None = None) -> MemberRun:
        """The host numbers of a (single-process) ``target="each"`` result."""
        return cls.from_packed(pack_members(result), int(result.attributions.shape[0]), weights=weights)

    @classmethod
    def from_packed(
        cls, packed: Tensor, num_members: int, *, num_states: int | None = None, weights: list[float] | None = None
    ) -> MemberRun:
        """Reduce packed rows (from :func:`pack_members`, gathered or not) on their device; one copy to the host.

        Args:
            packed: ``(B, M * (F + 6))``.
            num_members: ``M``.
            num_states: keep the first this many rows (drops the padding of an uneven split).
            weights: the members' weights, or ``None``.
        """
        rows = packed[:num_states] if num_states is not None else packed
        values = rows.reshape(rows.shape[0], num_members, -1).to(torch.float64)  # (B, M, F + 6)
        count = values.shape[2] - len(_COLUMNS)
        attributions, columns = values[..., :count], values[..., count:]  # (B, M, F), (B, M, 6)
        pieces = [attributions.abs().mean(0), attributions.mean(0), attributions.sum(2).T, columns.permute(2, 1, 0)]
        host = torch.cat([piece.reshape(-1) for piece in pieces]).cpu().numpy()  # the one device-to-host copy
        members, states = num_members, values.shape[0]
        mean_abs, mean_signed = host[: 2 * members * count].reshape(2, members, count)
        sums = host[2 * members * count : 2 * members * count + members * states].reshape(members, states)
        named = dict(
            zip(_COLUMNS, host[2 * members * count + members * states :].reshape(len(_COLUMNS), members, states))
        )
        non_finite = (named["non_finite"] != 0) | ~(
            np.isfinite(named["f_input"]) & np.isfinite(named["f_baseline"]) & np.isfinite(sums)
        )
        return cls(
            mean_abs=mean_abs,
            mean_signed=mean_signed,
            sum_attributions=sums,
            f_input=named["f_input"],
            f_baseline=named["f_baseline"],
            delta=named["delta"],
            relative_error=named["relative_error"],
            degenerate=(named["degenerate"] != 0) & ~non_finite,
            non_finite=non_finite,
            weights=weights,
        )

    def worst_relative_errors(self) -> np.ndarray:
        """``(M,)``: per member, ``inf`` if a state is non-finite, NaN if none could be checked, else the largest."""
        checked = ~(self.degenerate | self.non_finite)
        largest = np.where(checked, self.relative_error, -np.inf).max(axis=1, initial=-np.inf)
        worst = np.where(checked.any(axis=1), largest, math.nan)
        return np.where(self.non_finite.any(axis=1), math.inf, worst)

    def mean_abs_errors(self) -> np.ndarray:
        """``(M,)``: per member, the mean ``|delta|`` over its finite states (NaN when none is finite)."""
        finite = ~self.non_finite
        with np.errstate(invalid="ignore"):
            return np.where(finite, np.abs(self.delta), 0.0).sum(axis=1) / finite.sum(axis=1)
