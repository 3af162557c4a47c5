"""Numbers of one IG run: per-feature statistics, completeness, where the attribution mass sits.

Host-side and float64, on a :class:`~lightning_ig.host_result.HostResult` (an
:class:`~lightning_ig.attribution.IGResult` is brought to the host first).

Completeness of a state is ``|sum(attr) - (F(x) - F(b))| / |F(x) - F(b)|``. A
state whose ``|F(x) - F(b)|`` is too small for that ratio (*degenerate*) is
reported with its absolute error only; a state whose forward or attributions
are NaN/Inf (*non-finite*) is never counted as clean. The worst relative error
is ``inf`` when any state is non-finite, ``nan`` when no state could be checked
(every state degenerate), and otherwise the largest over the checked states:
never 0.0 for "nothing checked".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_ig.attribution import worst_relative_error
from lightning_ig.host_result import HostResult, Moments
from lightning_ig.vocabulary import check_bool, check_feature_names, check_positive_int, default_feature_names

__all__ = [
    "Completeness",
    "completeness",
    "completeness_summary",
    "concentration",
    "feature_moments",
    "feature_statistics",
    "json_float",
    "rank_order",
    "top_features",
]


def json_float(value: float) -> float | None:
    """A float for strict JSON: non-finite values become ``None`` (``null``)."""
    value = float(value)
    return value if math.isfinite(value) else None


def json_floats(values: np.ndarray) -> list[float | None]:
    """``values.tolist()`` with non-finite entries as ``None`` (one vectorised check for the common case)."""
    listed = values.tolist()
    if np.isfinite(values).all():
        return listed
    return [value if math.isfinite(value) else None for value in listed]


def rank_order(values: np.ndarray) -> np.ndarray:
    """Indices of ``values`` by decreasing value; ties keep feature order; NaN last.

    The one ordering of features and groups used everywhere: the report's
    top-k, the Jaccard drift, the text table and the figures.
    """
    keys = np.where(np.isnan(values), -np.inf, values)
    return np.argsort(-keys, kind="stable")


def feature_moments(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean |attr|, stddev, mean attr)`` per column of ``flat (B, F)``, over the states (ddof 0)."""
    moments = Moments.of(flat)
    return moments.mean_abs, moments.stddev, moments.mean_signed


def _flat(attributions: Any) -> np.ndarray:
    array = (
        attributions.detach().cpu().double().numpy()
        if isinstance(attributions, torch.Tensor)
        else np.asarray(attributions, dtype=np.float64)
    )
    if array.ndim < 2:
        raise ValueError(
            f"attributions must have shape (num_states, *feature_shape), got shape {tuple(array.shape)}; "
            "add the state dimension (e.g. attributions.unsqueeze(0)) for a single state"
        )
    return array.reshape(array.shape[0], -1)  # (B, F): row-major


def statistics_rows(names: Sequence[str], moments: Moments, sizes: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """One ``{name, [members,] mean_abs, stddev, mean_signed}`` dict per unit, non-finite values as ``None``."""
    columns = (json_floats(moments.mean_abs), json_floats(moments.stddev), json_floats(moments.mean_signed))
    rows = []
    for index, (name, mean_abs, stddev, mean_signed) in enumerate(zip(names, *columns)):
        row: dict[str, Any] = {"name": name}
        if sizes is not None:
            row["members"] = int(sizes[index])
        row.update(mean_abs=mean_abs, stddev=stddev, mean_signed=mean_signed)
        rows.append(row)
    return rows


def feature_statistics(attributions: Any, feature_names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per-feature statistics of attributions over the states.

    Args:
        attributions: ``(num_states, *feature_shape)`` tensor or array;
            multi-dimensional features are flattened in row-major order.
        feature_names: one name per (flattened) feature; ``None`` (default)
            names them ``x0, x1, ...`` (``x[c,i,j]`` for multi-dimensional states).

    Returns:
        One dict per feature, in feature order: ``name``, ``mean_abs`` (mean of
        ``|attr|`` over states), ``stddev`` (population standard deviation of
        ``attr``) and ``mean_signed`` (mean of ``attr``); non-finite values are ``None``.

    Raises:
        ValueError: ``attributions`` has no state dimension, or ``feature_names`` has the wrong length.
        TypeError: ``feature_names`` is not a sequence of strings.

    Example::

        >>> feature_statistics(torch.tensor([[1.0, -2.0], [3.0, 2.0]]), ["a", "b"])[1]
        {'name': 'b', 'mean_abs': 2.0, 'stddev': 2.0, 'mean_signed': 0.0}
    """
    flat = _flat(attributions)
    shape = tuple(attributions.shape[1:])
    names = default_feature_names(shape) if feature_names is None else check_feature_names(feature_names, flat.shape[1])
    return statistics_rows(names, Moments.of(flat))


def top_features(features: Sequence[Mapping[str, Any]], k: int = 10) -> list[dict[str, Any]]:
    """The ``k`` entries with the largest ``mean_abs``, largest first (ties in order, ``None`` last).

    Args:
        features: the output of :func:`feature_statistics`.
        k: how many to keep (default 10); fewer when there are fewer features.

    Returns:
        Copies of the dicts.

    Raises:
        ValueError: ``k`` is not a positive int.
    """
    check_positive_int(k, "k")
    values = np.array([np.nan if f["mean_abs"] is None else f["mean_abs"] for f in features], dtype=np.float64)
    return [dict(features[i]) for i in rank_order(values)[:k]]


@dataclass(frozen=True)
class Completeness:
    """How well the attributions add up to ``F(x) - F(b)`` over the states of one run.

    Attributes:
        worst_relative_error: ``inf`` if any state is non-finite, ``nan`` when no
            state could be checked, else the largest relative error of a checked state.
        mean_abs_error: mean ``|delta|`` over the finite states (``nan`` if none).
        num_states: states attributed.
        num_degenerate: finite states whose ``|F(x) - F(b)|`` is too small for a ratio.
        num_non_finite: states with a NaN/Inf forward value or attribution.
        first_non_finite: the index of the first such state, or ``None``.
        tolerance: the ``completeness_tol`` the verdict is judged against.
    """

    worst_relative_error: float
    mean_abs_error: float
    num_states: int
    num_degenerate: int
    num_non_finite: int
    first_non_finite: int | None
    tolerance: float

    @property
    def num_checked(self) -> int:
        """States with a relative error: finite and not degenerate."""
        return self.num_states - self.num_degenerate - self.num_non_finite

    @property
    def verdict(self) -> str:
        """``"non-finite"``, ``"unchecked"`` (no state could be checked), ``"pass"`` or ``"fail"`` (above tolerance)."""
        if self.num_non_finite:
            return "non-finite"
        if self.num_checked == 0:
            return "unchecked"
        return "pass" if self.worst_relative_error <= self.tolerance else "fail"


def completeness(result: Any, tolerance: float = 0.01) -> Completeness:
    """The :class:`Completeness` of a result (an IGResult or a :class:`~lightning_ig.host_result.HostResult`)."""
    host = HostResult.from_result(result)
    finite = np.abs(host.delta[~host.non_finite])
    first = np.flatnonzero(host.non_finite)
    flags = (
        torch.from_numpy(host.relative_error),
        torch.from_numpy(host.degenerate),
        torch.from_numpy(host.non_finite),
    )
    return Completeness(
        worst_relative_error=worst_relative_error(*flags),  # the engine's one definition, on the gathered states
        mean_abs_error=float(finite.mean()) if finite.size else math.nan,
        num_states=host.num_states,
        num_degenerate=int(host.degenerate.sum()),
        num_non_finite=int(host.non_finite.sum()),
        first_non_finite=int(first[0]) if first.size else None,
        tolerance=float(tolerance),
    )


def completeness_summary(result: Any, *, per_state: bool = True) -> dict[str, Any]:
    """Completeness of an IG run as the report writes it.

    Args:
        result: an :class:`~lightning_ig.attribution.IGResult` with one
            attribution per state (not ``target="each"``), or a host result.
        per_state: include the per-state lists (default ``True``).

    Returns:
        ``worst_relative_error`` (``None`` when it is not finite: a non-finite
        state, or no state that could be checked), ``mean_abs_error``,
        ``num_degenerate``, ``num_non_finite``, ``num_checked`` and, with
        ``per_state``, ``per_state`` (``state_idx``, ``sum_attributions``,
        ``f_input_minus_f_baseline``, ``relative_error``, ``absolute_error``,
        ``degenerate``, ``non_finite``) and ``degenerate_states`` (``state_idx``,
        ``absolute_error``).

    Raises:
        ValueError: the result holds one attribution set per action (``target="each"``).
    """
    per_state = check_bool(per_state, "per_state")
    host = HostResult.from_result(result)
    numbers = completeness(host)
    summary: dict[str, Any] = {
        "worst_relative_error": json_float(numbers.worst_relative_error),
        "mean_abs_error": json_float(numbers.mean_abs_error),
        "num_degenerate": numbers.num_degenerate,
        "num_non_finite": numbers.num_non_finite,
        "num_checked": numbers.num_checked,
    }
    if not per_state:
        return summary
    absolute = np.abs(host.delta)
    relative = np.where(host.degenerate | host.non_finite, np.nan, host.relative_error)  # no ratio for those
    columns = zip(
        json_floats(host.sum_attributions),
        json_floats(host.f_input - host.f_baseline),
        json_floats(relative),
        json_floats(absolute),
        host.degenerate.tolist(),
        host.non_finite.tolist(),
    )
    summary["per_state"] = [
        {
            "state_idx": i,
            "sum_attributions": total,
            "f_input_minus_f_baseline": change,
            "relative_error": ratio,
            "absolute_error": error,
            "degenerate": degenerate,
            "non_finite": non_finite,
        }
        for i, (total, change, ratio, error, degenerate, non_finite) in enumerate(columns)
    ]
    summary["degenerate_states"] = [
        {"state_idx": i, "absolute_error": json_float(absolute[i])} for i in np.flatnonzero(host.degenerate).tolist()
    ]
    return summary


CONCENTRATION_SHARES = {"top1pct_share": 0.01, "top10pct_share": 0.10}
"""Scalars of where the attribution mass sits: the share held by the top 1% and 10% of features."""


def concentration(mean_abs: np.ndarray) -> dict[str, float]:
    """The share of the total mean ``|attr|`` held by the top 1% / 10% of features (at least one feature each).

    1.0 means one feature (or 1% of them) carries everything; an even spread
    gives about 0.01 / 0.1. ``nan`` when the total is 0 or not finite. Costs
    one partial sort of the ``F`` values, whatever the input size.

    Args:
        mean_abs: ``(F,)`` mean ``|attr|`` per feature.

    Returns:
        ``{"top1pct_share": ..., "top10pct_share": ...}``.
    """
    values = np.asarray(mean_abs, dtype=np.float64).reshape(-1)
    total = float(values.sum())
    shares = {}
    for name, fraction in CONCENTRATION_SHARES.items():
        count = max(1, math.ceil(fraction * values.size))
        top = np.partition(values, values.size - count)[values.size - count :] if np.isfinite(total) else values
        shares[name] = float(top.sum()) / total if np.isfinite(total) and total > 0 else math.nan
    return shares
