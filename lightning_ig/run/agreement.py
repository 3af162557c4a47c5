"""Do the members of an ensemble rely on the same features as the aggregate?

Pure host-side functions over the attributions of two IG runs on an
:class:`~lightning_ig.ensemble.Ensemble`: the aggregate's (``target`` the
ensemble's forward, attributions ``(B, *feature_shape)``) and every member's
(``ensemble.member_signals`` with ``target="each"``, attributions
``(M, B, *feature_shape)``). The callback logs :func:`agreement_scalars` and
:func:`completeness_scalars` as ``ig/ensemble/<key>``; the callback's reports
and ``lightning-ig diag`` write :func:`member_summary` (:func:`ensemble_summary`
on two IG results) under the report's ``"ensemble"`` key. Everything runs in
float64 on a host copy, so the numbers do not depend on the device.

Definitions, over ``F`` flattened features:

* a run's per-feature *mean |attribution|* is the mean over the ``B`` states of
  ``|attr|`` (the report's ``mean_abs``);
* ``spearman[m]``: the Spearman rank correlation (average ranks for ties) of
  member ``m``'s mean |attribution| with the aggregate's: 1 when the member
  orders the features as the aggregate does; NaN when either vector is
  constant (e.g. a member whose signal is saturated everywhere);
* ``spread``: the mean over features of the population standard deviation
  (ddof 0: the members are the whole ensemble) across members of mean
  |attribution|; 0 when all members agree exactly. ``relative_spread`` divides
  it by the mean of the members' mean |attribution| over members and features,
  a scale-free number comparable across runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from lightning_ig.ensemble.members import MemberRun
from lightning_ig.run.statistics import json_float, rank_order, spearman
from lightning_ig.vocabulary import check_feature_names, check_positive_int, default_feature_names

__all__ = [
    "EnsembleSummary",
    "agreement_scalars",
    "completeness_scalars",
    "ensemble_scalar_names",
    "ensemble_summary",
    "mean_abs_per_feature",
    "member_agreement",
    "member_label",
    "member_summary",
]


class _AttributionRun(Protocol):
    """The fields of an :class:`~lightning_ig.attribution.IGResult` read here."""

    attributions: torch.Tensor
    f_input: torch.Tensor
    f_baseline: torch.Tensor
    delta: torch.Tensor
    relative_error: torch.Tensor
    degenerate: torch.Tensor
    non_finite: torch.Tensor


def _check_run(run: Any, name: str) -> None:
    """A ``TypeError`` naming ``name`` unless ``run`` has every tensor of an IG result that is read here."""
    fields = _AttributionRun.__annotations__
    missing = [field for field in fields if not isinstance(getattr(run, field, None), torch.Tensor)]
    if missing:
        raise TypeError(
            f"{name} must be an IGResult (integrated_gradients(...)), got {type(run).__name__} "
            f"without {', '.join(missing)}"
        )


def _host(values: Any, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.float64).numpy()
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a tensor or an array of numbers, got {type(values).__name__}") from error


def mean_abs_per_feature(attributions: Any, *, members: bool = False) -> np.ndarray:
    """Mean over the states of ``|attr|`` per flattened feature, in float64.

    Args:
        attributions: ``(B, *feature_shape)``, or ``(M, B, *feature_shape)`` with ``members=True``.
        members: whether the first axis is the members.

    Returns:
        ``(F,)``, or ``(M, F)`` with ``members=True``.

    Raises:
        ValueError: no state axis (or no member axis), or no states.
    """
    values = _host(attributions, "attributions")
    leading = 2 if members else 1
    if values.ndim < leading + 1 or values.shape[leading - 1] == 0:
        what = "(M, B, *feature_shape)" if members else "(B, *feature_shape)"
        raise ValueError(f"attributions must be {what} with at least one state, got shape {values.shape}")
    flat = values.reshape(*values.shape[:leading], -1)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(flat).mean(axis=leading - 1)


def member_agreement(aggregate_mean_abs: Any, member_mean_abs: Any) -> dict[str, Any]:
    """How far each member's feature ranking is from the aggregate's, and how much the members differ.

    Args:
        aggregate_mean_abs: ``(F,)``, the aggregate's mean |attribution| per feature.
        member_mean_abs: ``(M, F)``, each member's.

    Returns:
        ``{"spearman": [M floats], "spearman_mean", "spearman_min", "spearman_undefined",
        "spread", "relative_spread"}``: ``spearman_mean``/``spearman_min`` over the
        members whose correlation is defined (NaN if none is), ``spearman_undefined``
        how many are not (an int); see the module docstring for the rest.

    Raises:
        ValueError: the shapes do not fit (``F`` differs, no features, no members).

    Example::

        >>> agreement = member_agreement([3.0, 2.0, 1.0], [[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
        >>> agreement["spearman"], agreement["spread"]
        ([1.0, -1.0], 0.6666666666666666)
    """
    aggregate = _host(aggregate_mean_abs, "aggregate_mean_abs").reshape(-1)
    each = _host(member_mean_abs, "member_mean_abs")
    if aggregate.size == 0 or each.ndim != 2 or each.shape[0] == 0 or each.shape[1] != aggregate.size:
        raise ValueError(
            f"member_mean_abs must be (M >= 1, F) with F = {aggregate.size} (the aggregate's features), "
            f"got shape {each.shape}; pass one row per member"
        )
    correlations = [spearman(row, aggregate) for row in each]
    defined = [value for value in correlations if not math.isnan(value)]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        spread = float(np.std(each, axis=0).mean())
        scale = float(each.mean())
        relative = spread / scale if scale != 0.0 else math.nan
    return {
        "spearman": correlations,
        "spearman_mean": float(np.mean(defined)) if defined else math.nan,
        "spearman_min": float(np.min(defined)) if defined else math.nan,
        "spearman_undefined": len(correlations) - len(defined),
        "spread": spread,
        "relative_spread": relative,
    }


def member_label(index: int, num_members: int) -> str:
    """``member_<m>``, with ``m`` zero-padded to the width of ``num_members - 1`` so that tags sort as numbers.

    Example::

        >>> member_label(3, 12)
        'member_03'
    """
    return f"member_{index:0{len(str(max(0, num_members - 1)))}d}"


def agreement_scalars(agreement: dict[str, Any]) -> dict[str, float]:
    """The scalars to log, keyed by tag suffix: ``ig/ensemble/<key>``.

    Args:
        agreement: from :func:`member_agreement` (or the ``"agreement"`` of :func:`ensemble_summary`).

    Returns:
        ``spearman_mean``, ``spearman_min``, ``spread``, ``relative_spread`` and
        ``spearman/member_<m>`` for each member (see :func:`member_label`), as floats
        (NaN where undefined; a JSON ``None`` is read back as NaN).

    Example::

        >>> agreement_scalars(member_agreement([2.0, 1.0], [[2.0, 1.0]]))
        {'spearman_mean': 1.0, 'spearman_min': 1.0, 'spread': 0.0, 'relative_spread': 0.0, 'spearman/member_0': 1.0}
    """

    def number(value: Any) -> float:
        return math.nan if value is None else float(value)

    scalars = {key: number(agreement[key]) for key in ("spearman_mean", "spearman_min", "spread", "relative_spread")}
    count = len(agreement["spearman"])
    scalars.update(
        {f"spearman/{member_label(index, count)}": number(value) for index, value in enumerate(agreement["spearman"])}
    )
    return scalars


def ensemble_scalar_names(num_members: int) -> list[str]:
    """Every key of :func:`agreement_scalars` and :func:`completeness_scalars` for ``num_members`` members.

    Example::

        >>> ensemble_scalar_names(2)[-3:]
        ['completeness/worst_relative_error', 'completeness/member_0', 'completeness/member_1']
    """
    members = [member_label(m, num_members) for m in range(num_members)]
    agreement = ["spearman_mean", "spearman_min", "spread", "relative_spread", *(f"spearman/{m}" for m in members)]
    return [*agreement, "completeness/worst_relative_error", *(f"completeness/{m}" for m in members)]


def completeness_scalars(run: MemberRun) -> dict[str, float]:
    """Each member's worst relative completeness error, keyed ``completeness/member_<m>``, and the worst of all.

    ``inf`` where a member's forward or attributions were NaN/Inf, NaN where none of
    its states could be checked (the same rules as the aggregate's
    ``completeness/worst_relative_error``).
    """
    worst = run.worst_relative_errors()
    scalars = {f"completeness/{member_label(m, len(worst))}": float(value) for m, value in enumerate(worst)}
    if np.isinf(worst).any():
        overall = math.inf
    else:
        checked = worst[~np.isnan(worst)]
        overall = float(checked.max()) if checked.size else math.nan
    return {"completeness/worst_relative_error": overall, **scalars}


def ensemble_summary(
    aggregate: _AttributionRun,
    members: _AttributionRun,
    *,
    weights: Any = None,
    feature_names: Sequence[str] | None = None,
    top_k: int = 10,
) -> dict[str, Any]:
    """Per-member summaries beside the aggregate's report: the ``"ensemble"`` key of a report.

    Args:
        aggregate: the IG result of the ensemble's forward (attributions ``(B, *feature_shape)``).
        members: the IG result of ``ensemble.member_signals`` with ``target="each"``
            (attributions ``(M, B, *feature_shape)``; ``f_input``, ``f_baseline``,
            ``delta``, ``relative_error``, ``degenerate``, ``non_finite`` ``(M, B)``),
            on the same states and baselines.
        weights: the members' weights (``ensemble.weights``), or ``None``.
        feature_names: one per flattened feature; ``None`` names them ``x0, x1, ...``.
        top_k: how many features each member lists (default 10; clipped to ``F``).

    Returns:
        A JSON-ready dict (non-finite numbers as ``None``); see :func:`member_summary`.

    Raises:
        TypeError: ``aggregate`` or ``members`` is not an IG result.
        ValueError: the two runs' shapes do not fit, weights of the wrong length,
            bad ``feature_names`` or ``top_k``.
    """
    check_positive_int(top_k, "top_k")
    _check_run(aggregate, "aggregate")
    _check_run(members, "members")
    aggregate_mean_abs = mean_abs_per_feature(aggregate.attributions)
    shape = tuple(members.attributions.shape)
    if len(shape) < 3 or shape[1:] != tuple(aggregate.attributions.shape):
        raise ValueError(
            "members.attributions must be (M, *aggregate shape) = (M, "
            f"{', '.join(map(str, aggregate.attributions.shape))}), got {shape}; attribute ensemble.member_signals "
            "with target='each' on the same states"
        )
    run = MemberRun.from_result(members, weights=_weight_list(weights, shape[0]))
    return member_summary(
        aggregate_mean_abs,
        run,
        feature_names=feature_names,
        top_k=top_k,
        feature_shape=tuple(aggregate.attributions.shape[1:]),
    )


def member_summary(
    aggregate_mean_abs: Any,
    run: MemberRun,
    *,
    feature_names: Sequence[str] | None = None,
    top_k: int = 10,
    feature_shape: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The ``"ensemble"`` key of a report, from the aggregate's mean |attribution| and the members' host numbers.

    Args:
        aggregate_mean_abs: ``(F,)`` the aggregate's mean |attribution| per feature.
        run: the members' :class:`~lightning_ig.ensemble.members.MemberRun` (gathered over ranks).
        feature_names: one per flattened feature; ``None``: the default names of ``feature_shape``.
        top_k: how many features each member lists (clipped to ``F``).
        feature_shape: the shape of one state (for the default names); default ``(F,)``.

    Returns:
        A JSON-ready dict (non-finite numbers as ``None``)::

            {"num_members": M, "weights": [M floats] | None,
             "agreement": member_agreement(...),
             "members": [{"member": m, "weight": float | None,
                          "spearman_vs_aggregate": float | None,
                          "worst_relative_error": float | None,  # IG completeness of member m
                          "num_degenerate": int, "num_non_finite": int,
                          "mean_abs_error": float | None,
                          "top_features": [{"name", "mean_abs", "mean_signed"}, ...],
                          "per_state": [{"state_idx", "sum_attributions",
                                         "f_input_minus_f_baseline", "relative_error"}, ...]}, ...]}

        ``worst_relative_error`` is the largest over the member's checked states
        (``None`` when none could be checked or a state is non-finite;
        ``num_degenerate`` and ``num_non_finite`` say how many were left out).
    """
    check_positive_int(top_k, "top_k")
    count = run.num_members
    names = _feature_names(feature_names, feature_shape if feature_shape is not None else (run.mean_abs.shape[1],))
    agreement = member_agreement(aggregate_mean_abs, run.mean_abs)
    worst, mean_abs_error = run.worst_relative_errors(), run.mean_abs_errors()
    summaries = []
    for m in range(count):
        top = rank_order(run.mean_abs[m])[: min(top_k, len(names))]
        summaries.append(
            {
                "member": m,
                "weight": None if run.weights is None else run.weights[m],
                "spearman_vs_aggregate": json_float(agreement["spearman"][m]),
                "worst_relative_error": json_float(worst[m]),
                "num_degenerate": int(run.degenerate[m].sum()),
                "num_non_finite": int(run.non_finite[m].sum()),
                "mean_abs_error": json_float(mean_abs_error[m]),
                "top_features": [
                    {
                        "name": names[i],
                        "mean_abs": json_float(run.mean_abs[m, i]),
                        "mean_signed": json_float(run.mean_signed[m, i]),
                    }
                    for i in top.tolist()
                ],
                "per_state": _per_state(run, m),
            }
        )
    return {
        "num_members": count,
        "weights": run.weights,
        "agreement": {
            key: (_json_list(value) if isinstance(value, list) else _json_value(value))
            for key, value in agreement.items()
        },
        "members": summaries,
    }


def _per_state(run: MemberRun, member: int) -> list[dict[str, Any]]:
    difference = run.f_input[member] - run.f_baseline[member]
    relative = np.where(run.degenerate[member] | run.non_finite[member], math.nan, run.relative_error[member])
    return [
        {
            "state_idx": index,
            "sum_attributions": json_float(total),
            "f_input_minus_f_baseline": json_float(diff),
            "relative_error": json_float(error),
        }
        for index, (total, diff, error) in enumerate(
            zip(run.sum_attributions[member].tolist(), difference.tolist(), relative.tolist())
        )
    ]


def _feature_names(feature_names: Sequence[str] | None, feature_shape: Sequence[int]) -> list[str]:
    count = int(np.prod(feature_shape)) if len(feature_shape) else 1
    if feature_names is None:
        return default_feature_names(feature_shape)
    return check_feature_names(feature_names, count)


def _weight_list(weights: Any, count: int) -> list[float] | None:
    if weights is None:
        return None
    values = _host(weights, "weights").reshape(-1)
    if values.size != count:
        raise ValueError(f"weights has {values.size} entries for {count} members; pass ensemble.weights")
    return [float(value) for value in values]


def _json_value(value: Any) -> Any:
    return json_float(value) if isinstance(value, float) else value


def _json_list(values: list[float]) -> list[float | None]:
    return [json_float(value) for value in values]


@dataclass(frozen=True)
class EnsembleSummary:
    """The members of an ensemble beside the aggregate in one callback run: what is logged and what the report holds.

    Attributes:
        report: the report's ``"ensemble"`` key (:func:`member_summary`).
        scalars: ``{tag suffix: value}`` logged as ``<prefix>/ensemble/<suffix>``: agreement
            (``spearman_mean``, ``spearman_min``, ``spread``, ``relative_spread``,
            ``spearman/member_<m>``) and completeness (``completeness/worst_relative_error``,
            ``completeness/member_<m>``; ``inf`` for NaN/Inf, NaN when nothing was checked).
    """

    report: dict[str, Any]
    scalars: dict[str, float]

    @classmethod
    def of(
        cls,
        aggregate_mean_abs: np.ndarray,
        members: MemberRun,
        *,
        feature_names: Sequence[str],
        feature_shape: tuple[int, ...],
        top_k: int,
    ) -> EnsembleSummary:
        report = member_summary(
            aggregate_mean_abs, members, feature_names=feature_names, top_k=top_k, feature_shape=feature_shape
        )
        return cls(report, {**agreement_scalars(report["agreement"]), **completeness_scalars(members)})
