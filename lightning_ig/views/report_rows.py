"""The rows of the JSON report (schema version 1): one per feature, per group and per state, and its completeness.

:func:`feature_statistics` and :func:`statistics_rows` write a unit's ``{name, mean_abs, stddev, mean_signed}``
(``members`` for a group), :func:`top_features` the ``top_10_by_mean_abs`` list, :func:`completeness_summary` the
``completeness`` key with its per-state rows, all from the numbers of :mod:`lightning_ig.run.statistics`.
Strict JSON: a number that is not finite is written as ``None`` (``null``). The document around them is
:func:`lightning_ig.views.report.build_report`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_ig.run.host_result import HostResult, Moments
from lightning_ig.run.statistics import accuracy_verdict, completeness, json_float, json_floats, rank_order
from lightning_ig.vocabulary import (
    check_bool,
    check_feature_names,
    check_positive_float,
    check_positive_int,
    default_feature_names,
)

__all__ = ["completeness_summary", "feature_statistics", "statistics_rows", "top_features"]


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


def completeness_summary(result: Any, *, per_state: bool = True, tolerance: float | None = None) -> dict[str, Any]:
    """Completeness of an IG run as the report writes it.

    Args:
        result: an :class:`~lightning_ig.attribution.IGResult` with one
            attribution per state (not ``target="each"``), or a host result.
        per_state: include the per-state lists (default ``True``).
        tolerance: the ``completeness_tol`` to judge the run by: adds ``verdict``
            (:func:`~lightning_ig.run.statistics.accuracy_verdict`); ``None`` (default): no verdict.

    Returns:
        ``worst_relative_error`` (``None`` when it is not finite: a non-finite
        state, or no state that could be checked), ``mean_abs_error``,
        ``num_degenerate``, ``num_non_finite``, ``num_checked`` and, with
        ``per_state``, ``per_state`` (``state_idx``, ``sum_attributions``,
        ``f_input_minus_f_baseline``, ``relative_error``, ``absolute_error``,
        ``degenerate``, ``non_finite``, ``attribution_error``, ``mass_relative_error``,
        ``near_baseline``) and ``degenerate_states`` (``state_idx``, ``absolute_error``).
        The accuracy figures, beside them: ``worst_attribution_error`` and
        ``worst_mass_relative_error`` (over the states away from the baseline; ``None``
        when not finite), ``num_near_baseline``, ``error_scale`` (1.0) and, with ``tolerance``,
        ``verdict`` (``tolerance``, ``within`` (``true``, ``false`` or ``null``: nothing
        could be checked), ``figure``, ``value``, ``threshold``, ``reason``).

    Raises:
        ValueError: the result holds one attribution set per action (``target="each"``).
    """
    per_state = check_bool(per_state, "per_state")
    tolerance = None if tolerance is None else check_positive_float(tolerance, "tolerance")
    host = HostResult.from_result(result)
    numbers = completeness(host)
    summary: dict[str, Any] = {
        "worst_relative_error": json_float(numbers.worst_relative_error),
        "mean_abs_error": json_float(numbers.mean_abs_error),
        "num_degenerate": numbers.num_degenerate,
        "num_non_finite": numbers.num_non_finite,
        "num_checked": numbers.num_checked,
        "worst_attribution_error": json_float(numbers.worst_attribution_error),
        "worst_mass_relative_error": json_float(numbers.worst_mass_relative_error),
        "num_near_baseline": numbers.num_near_baseline,
        "error_scale": 1.0,  # the estimate is no longer scaled; the key stays for readers of schema v1
    }
    if tolerance is not None:
        verdict = accuracy_verdict(numbers.worst_attribution_error, numbers.worst_mass_relative_error, tolerance)
        summary["verdict"] = {
            "tolerance": float(tolerance),
            "within": verdict.within,
            "figure": verdict.figure,
            "value": json_float(verdict.value),
            "threshold": json_float(verdict.threshold),
            "reason": verdict.reason,
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
        json_floats(_column(host.attribution_error, host.num_states)),
        json_floats(_column(host.mass_relative_error, host.num_states)),
        (np.zeros(host.num_states, bool) if host.near_baseline is None else host.near_baseline).tolist(),
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
            "attribution_error": estimate,
            "mass_relative_error": mass_relative,
            "near_baseline": bool(near),
        }
        for i, (total, change, ratio, error, degenerate, non_finite, estimate, mass_relative, near) in enumerate(
            columns
        )
    ]
    summary["degenerate_states"] = [
        {"state_idx": i, "absolute_error": json_float(absolute[i])} for i in np.flatnonzero(host.degenerate).tolist()
    ]
    return summary


def _column(values: np.ndarray | None, size: int) -> np.ndarray:
    """A per-state figure, NaN (``null``) throughout where the result carried none."""
    return np.full(size, np.nan) if values is None else values
