"""The JSON report of an Integrated Gradients run (schema version 1), and its rows.

The callback (one file per run, and W&B's and MLflow's copy) and the ``lightning-ig`` command write the same document.
Its contract keys are fixed (``schema_version``, ``checkpoint``, ``num_steps``, ``state_dim``, ``num_states``,
``forward_target``, ``regime_head``, ``features`` (rows of :func:`feature_statistics`), ``top_10_by_mean_abs``,
``completeness`` (:func:`completeness_summary`)): the JSON Schema in ``report_schema_v1.json`` next to this file pins
them and the ones it names. More keys sit beside them, documented in ``docs/json-report.md``: the run's settings, the
accuracy figures and their verdict, ``non_finite_states``, ``num_degenerate``, ``stochastic_forward``, ``groups``, a
``target="each"`` run's ``actions`` (:func:`each_report`), and the run's ``verdict`` and ``trust``
(:func:`with_verdict`). ``completeness.worst_relative_error`` is the old ratio ``|delta| / |dF|``, kept for the
contract; it decides nothing. Strict JSON: a number that is not finite is written as ``null``; the same inputs give a
byte-identical document.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_ig._files import atomic_path
from lightning_ig._version import __version__
from lightning_ig.attribution.groups import FeatureGroups, GroupSpec, check_group_spec
from lightning_ig.run.actions import ActionSummary
from lightning_ig.run.host_result import HostResult, Moments
from lightning_ig.run.statistics import accuracy_verdict, completeness, json_float, json_floats, rank_order
from lightning_ig.run.summary import RunSummary
from lightning_ig.vocabulary import (
    check_bool,
    check_feature_names,
    check_mapping,
    check_names,
    check_path,
    check_positive_float,
    check_positive_int,
    check_text,
    default_feature_names,
)

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "build_report",
    "completeness_summary",
    "each_report",
    "feature_statistics",
    "load_schema",
    "report_to_json",
    "statistics_rows",
    "top_features",
    "verdict_keys",
    "with_verdict",
    "write_report",
]

SCHEMA_VERSION = 1
"""Version of the JSON report's layout; bumped only when a contract key changes."""

SCHEMA_PATH = Path(__file__).with_name("report_schema_v1.json")
"""The JSON Schema (draft 2020-12) of a schema-version-1 report."""

# The contract keys, in the order they are written.
_REPORT_KEYS = (
    "schema_version",
    "checkpoint",
    "num_steps",
    "state_dim",
    "num_states",
    "forward_target",
    "regime_head",
    "features",
    "top_10_by_mean_abs",
    "completeness",
)


def load_schema() -> dict[str, Any]:
    """Return the JSON Schema of a schema-version-1 report as a dict.

    Example::

        import jsonschema
        jsonschema.validate(report, load_schema())
    """
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def build_report(
    result: Any,
    *,
    feature_names: Sequence[str] | None,
    checkpoint: str | os.PathLike[str] | None = None,
    forward_target: str,
    regime_head: str | None = None,
    top_k: int = 10,
    extra: Mapping[str, Any] | None = None,
    groups: GroupSpec | None = None,
    tolerance: float | None = None,
) -> dict[str, Any]:
    """Build the schema-version-1 JSON report of one IG run.

    The contract keys come first, in the documented order; then the run's settings (``feature_shape``, ``method``,
    ``gradient``, ``backend``, the package version), ``non_finite_states``, ``num_degenerate``, ``stochastic_forward``,
    ``groups`` (when given) and the ``extra`` keys.

    Args:
        result: an :class:`~lightning_ig.attribution.IGResult` with one attribution per state (for ``target="each"``,
            build one report per action), or a :class:`~lightning_ig.run.host_result.HostResult`.
        feature_names: one name per flattened feature, or ``None`` for ``x0, x1, ...``.
        checkpoint: the checkpoint the model came from (written as a string), or ``None``.
        forward_target: what the attributed scalar is, e.g. ``"mean"``, ``"action:1"``.
        regime_head: the head prefix of a merged checkpoint, or ``None``.
        top_k: how many features ``top_10_by_mean_abs`` lists (default 10; the key keeps its contract name whatever
            ``top_k`` is).
        extra: more keys beside the contract keys (e.g. ``global_step``, ``timings``); JSON-serialisable, not shadowing
            a contract key.
        groups: feature groups to report (``"channels"``, a mask, a dict or a
            :class:`~lightning_ig.attribution.groups.FeatureGroups`); ``None`` (default): the host result's groups, if
            any.
        tolerance: the ``completeness_tol`` the run is judged by: ``completeness.verdict`` (see
            :func:`completeness_summary`); ``None`` (default): no verdict in the report.

    Returns:
        A dict ready for :func:`write_report` / :func:`report_to_json`.

    Raises:
        ValueError: ``feature_names`` has the wrong length, ``top_k < 1``, the result has one attribution set per
            action, ``extra`` shadows a contract key, or ``groups`` is bad (see
            :class:`~lightning_ig.attribution.groups.FeatureGroups`).
        TypeError: ``feature_names`` is not a sequence of strings or ``top_k`` is not an int.

    Example::

        result = integrated_gradients(model_v, states, n_steps=32)
        report = build_report(result, feature_names=["x", "v"], forward_target="mean", groups={"all": [0, 1]})
        write_report(report, "runs/ig.json")
    """
    check_positive_int(top_k, "top_k")
    tolerance = None if tolerance is None else check_positive_float(tolerance, "tolerance")
    if not isinstance(forward_target, str):
        raise TypeError(f"forward_target must be a string describing the target, got {type(forward_target).__name__}")
    checkpoint = None if checkpoint is None else check_path(checkpoint, "checkpoint")
    regime_head = None if regime_head is None else check_text(regime_head, "regime_head")
    extra = None if extra is None else check_mapping(extra, "extra")
    feature_names = None if feature_names is None else check_names(feature_names, "feature_names")
    groups = check_group_spec(groups, "groups")
    if shadowed := sorted(set(extra or {}) & set(_REPORT_KEYS)):
        raise ValueError(f"extra must not redefine the report's contract keys, got {shadowed}; rename those keys")
    host = _host(result, groups)
    shape = host.feature_shape
    names = (
        default_feature_names(shape) if feature_names is None else check_feature_names(feature_names, host.num_features)
    )
    features = statistics_rows(names, host.features)
    completeness = completeness_summary(host, tolerance=tolerance)
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "num_steps": int(host.n_steps),
        "state_dim": len(features),
        "num_states": host.num_states,
        "forward_target": forward_target,
        "regime_head": regime_head,
        "features": features,
        "top_10_by_mean_abs": top_features(features, top_k),
        "completeness": {
            "worst_relative_error": completeness.pop("worst_relative_error"),
            "per_state": completeness.pop("per_state"),
            **completeness,
        },
        "feature_shape": list(shape),
        "method": host.method,
        "gradient": host.gradient,
        "backend": host.backend,
        "package": "lightning-ig",
        "package_version": __version__,
        "non_finite_states": np.flatnonzero(host.non_finite).tolist(),
        "num_degenerate": int(host.degenerate.sum()),
        "stochastic_forward": host.stochastic,
    }
    if tolerance is not None:  # the run's verdict, as the callback's reports write it; no trust checks ran here
        within = report["completeness"]["verdict"]["within"]
        non_finite = host.non_finite.any()
        kind = "non-finite" if non_finite else "unchecked" if within is None else "pass" if within else "fail"
        report["verdict"] = {"accuracy": kind, "within": within, "trust": None}  # the kinds the cards write
    if host.groups is not None and host.group_moments is not None:
        report["groups"] = statistics_rows(host.groups.names, host.group_moments, host.groups.sizes.tolist())
        # the verdict card's share: each cell's |attribution| counted on its own, so cells that cancel keep their mass
        mass = np.bincount(host.groups.ids.numpy(), weights=host.features.mean_abs, minlength=len(host.groups.names))
        total = mass.sum()  # NaN/Inf in a feature: no share is a number (null), as no share of 0 is
        for row, share in zip(report["groups"], json_floats(mass / total if 0 < total < np.inf else mass * np.nan)):
            row["share"] = share
    report.update(extra or {})
    return report


def verdict_keys(summary: RunSummary) -> dict[str, Any]:
    """A callback run's verdict as its JSON report holds it, beside the contract keys.

    Returns:
        ``verdict``: ``accuracy`` (``"pass"``, ``"fail"``, ``"unchecked"`` or ``"non-finite"``: what the cards say),
        ``within``, ``figure``, ``value``, ``threshold``, ``tolerance``, ``reason`` (the accuracy figures against
        ``sqrt(2) x completeness_tol``) and ``trust`` (``"passed"``, ``"failed"``, ``"unresolved"``; ``None``: no trust
        checks). With the trust checks on, ``trust``: ``status``, ``reasons``, ``notes``, and ``checks`` with each
        check's latest result and the global step it comes from (``None``: not run yet in this fit; stability: also for
        a model without NoisyNet layers).
    """
    numbers, trust = summary.completeness, summary.trust_checks
    accuracy = numbers.accuracy
    keys: dict[str, Any] = {
        "verdict": {
            "accuracy": numbers.verdict,
            "within": accuracy.within,
            "figure": accuracy.figure,
            "value": json_float(accuracy.value),
            "threshold": json_float(accuracy.threshold),
            "tolerance": numbers.tolerance,
            "reason": accuracy.reason,
            "trust": None if trust is None else str(trust.status),
        }
    }
    if trust is None:
        return keys
    steps = dict(trust.steps)
    sanity, deletion, stability = trust.randomization, trust.deletion, trust.stability
    checks: dict[str, Any] = {"sanity": None, "faithfulness": None, "stability": None}
    if sanity is not None:
        checks["sanity"] = {
            "passed": sanity.passed,
            "resolved": sanity.resolved,
            "randomization_rank_correlation": json_float(sanity.randomization_rank_correlation),
            "copy_rank_correlation": json_float(sanity.copy_rank_correlation),
            "threshold": json_float(sanity.threshold),
            "num_units": sanity.num_units,
            "step": steps.get("sanity"),
            "reason": sanity.reason or sanity.note,
        }
    if deletion is not None:
        checks["faithfulness"] = {
            "passed": deletion.passed,
            "deletion_auc": json_float(deletion.deletion_auc),
            "deletion_auc_random": json_float(deletion.deletion_auc_random),
            "gap": json_float(deletion.gap),
            "needed": json_float(deletion.needed),
            "step": steps.get("deletion"),
            "reason": deletion.reason,
        }
    if stability is not None and stability.applicable:
        checks["stability"] = {
            "passed": stability.passed,
            "noise_rank_correlation": json_float(stability.noise_rank_correlation),
            "floor": json_float(stability.floor),
            "step": steps.get("stability"),
            "reason": stability.reason,
        }
    keys["trust"] = {
        "status": str(trust.status),
        "reasons": list(trust.reasons),
        "notes": list(trust.notes),
        "checks": checks,
    }
    return keys


def with_verdict(report: Mapping[str, Any], summary: RunSummary) -> dict[str, Any]:
    """``report`` (a callback run's, from :func:`build_report`) with the run's verdict: ``completeness.verdict`` as
    ``lightning-ig diag`` writes it, and the ``verdict`` and ``trust`` keys of :func:`verdict_keys`."""
    keys = verdict_keys(summary)
    verdict, document = keys["verdict"], {**report, **keys}
    document["completeness"] = {
        **report["completeness"],
        "verdict": {name: verdict[name] for name in ("tolerance", "within", "figure", "value", "threshold", "reason")},
    }
    return document


def _host(result: Any, groups: GroupSpec | None) -> HostResult:
    if groups is None:
        return HostResult.from_result(result)
    if isinstance(result, HostResult):
        if result.groups is None:
            raise ValueError("this host result was gathered without groups; pass groups= to HostResult.from_result")
        return result
    return HostResult.from_result(result, groups=FeatureGroups.resolve(groups, tuple(result.attributions.shape[1:])))


def report_to_json(report: Mapping[str, Any]) -> str:
    """Serialise a report as strict, deterministic JSON (no NaN/Infinity; same report, same bytes).

    Two-space indentation, except that each entry of a list of objects (a feature, a group, a state) is written on one
    line: compact for reports of tens of thousands of features, and fast (the C encoder writes each line).

    Args:
        report: from :func:`build_report`.

    Returns:
        The JSON text, ending with a newline.

    Raises:
        ValueError: the report holds a non-finite float (use ``None``).
    """
    try:
        return _encode(report, "") + "\n"
    except ValueError as error:
        raise ValueError(f"the report holds a non-finite number, which strict JSON cannot carry: {error}") from error


# One encoder for every line (json.dumps with options builds a new one per call). Python writes floats with
# repr(): the shortest text that reads back to the same double.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(", ", ": "))


def _encode(value: Any, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [f"{inner}{_ENCODER.encode(str(key))}: {_encode(item, inner)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, Mapping) for item in value):
        return "[\n" + ",\n".join(inner + _ENCODER.encode(item) for item in value) + "\n" + indent + "]"
    return _ENCODER.encode(value)


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> Path:
    """Write a report as JSON atomically: readers see the old file or the new one, never half of one.

    The file's mode follows the umask (an existing file keeps its mode). Missing parent folders are created.

    Args:
        report: from :func:`build_report`.
        path: where to write.
        follow_symlinks: ``True`` (default: ``path`` is the user's): a symbolic link is written through to its target.
            ``False`` (a name the caller made up, as the callback's reports): a link at ``path`` is replaced itself, its
            target never touched.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: the report holds a non-finite float.
        OSError: the folder cannot be created or written.
    """
    text = report_to_json(report)  # serialise first: a bad report leaves no file behind
    target = Path(path)
    with (
        atomic_path(target, follow_symlinks=follow_symlinks) as temporary,
        open(temporary, "w", encoding="utf-8") as handle,
    ):
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return target


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
        members = {} if sizes is None else {"members": int(sizes[index])}
        rows.append({"name": name, **members, "mean_abs": mean_abs, "stddev": stddev, "mean_signed": mean_signed})
    return rows


def feature_statistics(attributions: Any, feature_names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per-feature statistics of attributions over the states.

    Args:
        attributions: ``(num_states, *feature_shape)`` tensor or array; multi-dimensional features are flattened in
            row-major order.
        feature_names: one name per (flattened) feature; ``None`` (default) names them ``x0, x1, ...`` (``x[c,i,j]`` for
            multi-dimensional states).

    Returns:
        One dict per feature, in feature order: ``name``, ``mean_abs`` (mean of ``|attr|`` over states), ``stddev``
        (population standard deviation of ``attr``) and ``mean_signed`` (mean of ``attr``); non-finite values are
        ``None``.

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
        result: an :class:`~lightning_ig.attribution.IGResult` with one attribution per state (not ``target="each"``),
            or a host result.
        per_state: include the per-state lists (default ``True``).
        tolerance: the ``completeness_tol`` to judge the run by: adds ``verdict``
            (:func:`~lightning_ig.run.statistics.accuracy_verdict`); ``None`` (default): no verdict.

    Returns:
        ``worst_relative_error`` (``None`` when it is not finite: a non-finite state, or no state that could be
        checked), ``mean_abs_error``, ``num_degenerate``, ``num_non_finite``, ``num_checked`` and, with ``per_state``,
        ``per_state`` (``state_idx``, ``sum_attributions``, ``f_input_minus_f_baseline``, ``relative_error``,
        ``absolute_error``, ``degenerate``, ``non_finite``, ``attribution_error``, ``mass_relative_error``,
        ``near_baseline``) and ``degenerate_states`` (``state_idx``, ``absolute_error``). The accuracy figures, beside
        them: ``worst_attribution_error`` and ``worst_mass_relative_error`` (over the states away from the baseline;
        ``None`` when not finite), ``num_near_baseline``, ``error_scale`` (1.0) and, with ``tolerance``, ``verdict``
        (``tolerance``, ``within`` (``true``, ``false`` or ``null``: nothing could be checked), ``figure``, ``value``,
        ``threshold``, ``reason``).

    Raises:
        ValueError: the result holds one attribution set per action (``target="each"``).
    """
    per_state = check_bool(per_state, "per_state")
    tolerance = None if tolerance is None else check_positive_float(tolerance, "tolerance")
    host = HostResult.from_result(result)
    numbers = completeness(host)
    summary: dict[str, Any] = {
        "worst_relative_error": json_float(numbers.worst_relative_error),
        "worst_delta_over_output_change": json_float(numbers.worst_relative_error),  # the old ratio, named for it
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
    with np.errstate(invalid="ignore"):  # inf - inf where both ends are infinite: NaN (null), as non_finite says
        change = host.f_input - host.f_baseline
    near = np.zeros(host.num_states, bool) if host.near_baseline is None else host.near_baseline
    columns = {
        "sum_attributions": json_floats(host.sum_attributions),
        "f_input_minus_f_baseline": json_floats(change),
        "relative_error": json_floats(relative),
        "absolute_error": json_floats(absolute),
        "degenerate": host.degenerate.tolist(),
        "non_finite": host.non_finite.tolist(),
        "attribution_error": json_floats(_column(host.attribution_error, host.num_states)),
        "mass_relative_error": json_floats(_column(host.mass_relative_error, host.num_states)),
        "near_baseline": [bool(flag) for flag in near.tolist()],
    }
    rows = zip(*columns.values())
    summary["per_state"] = [{"state_idx": i, **dict(zip(columns, row))} for i, row in enumerate(rows)]
    summary["degenerate_states"] = [
        {"state_idx": i, "absolute_error": json_float(absolute[i])} for i in np.flatnonzero(host.degenerate).tolist()
    ]
    return summary


def _column(values: np.ndarray | None, size: int) -> np.ndarray:
    """A per-state figure, NaN (``null``) throughout where the result carried none."""
    return np.full(size, np.nan) if values is None else values


# The per-row numbers of a host result: a target="each" run's are its (state, action) pairs.
_ROW_FIELDS = (
    "f_input",
    "f_baseline",
    "delta",
    "relative_error",
    "degenerate",
    "non_finite",
    "sum_attributions",
    "attributions",
    "group_attributions",
    "attribution_error",
    "mass_relative_error",
    "near_baseline",
    "attribution_mass",
    "n_steps_per_state",
)


def _action_rows(host: HostResult, action: int, actions: int) -> HostResult:
    """One action's rows of a ``target="each"`` run, for its completeness (``features`` stays the run's; the
    near-baseline flags stay those of the run: a tenth of the median over every pair)."""
    picked: dict[str, Any] = {
        name: None if (rows := getattr(host, name)) is None else rows[action::actions] for name in _ROW_FIELDS
    }
    return dataclasses.replace(host, **picked)


def each_report(
    report: Mapping[str, Any],
    actions: ActionSummary,
    host: HostResult,
    unit_names: Sequence[str],
    unit_sizes: Sequence[int] | None = None,
    *,
    top_k: int = 10,
    tolerance: float | None = None,
) -> dict[str, Any]:
    """The JSON report of a ``target="each"`` run, from the document of its (state, action) rows.

    :func:`~lightning_ig.views.report.build_report` writes a row per pair (row ``s * A + a``); here the document speaks
    of the held-out states again: ``num_states`` counts them, each ``completeness.per_state`` (and
    ``degenerate_states``) row names its ``state_idx`` and its ``action``, ``non_finite_states`` lists the states with a
    NaN/Inf pair. The features, the groups and the completeness figures stay those of every pair (the callback's
    ``ig/mean_abs/...`` and verdict). The ``actions`` key holds, per action, as ``lightning-ig diag --target each``
    writes it: ``action``, ``name``, ``forward_target`` (``action:<k>``), ``greedy_states``, ``units`` (``"features"``
    or ``"groups"``: what the callback logs one by one), ``top_10_by_mean_abs`` (of those units, for ``Q(s, a)``) and
    ``completeness`` (without per-state rows).

    Args:
        report: the document of the run's rows.
        actions: the run per action.
        host: the run's host result (a row per pair).
        unit_names: one name per unit of ``actions.moments``.
        unit_sizes: the groups' sizes (``members``), or ``None`` for features.
        top_k: how many units each action lists.
        tolerance: ``completeness_tol``: each action's completeness gets its ``verdict``; ``None``: none.

    Raises:
        ValueError: the report's rows are not a whole number of states times the actions.
    """
    count = len(actions.names)
    if report["num_states"] != actions.num_states * count:
        raise ValueError(
            f"the report has {report['num_states']} rows, not {actions.num_states} states x {count} actions"
        )
    document = dict(report)
    document["num_states"] = actions.num_states
    completeness = dict(document["completeness"])
    for key in ("per_state", "degenerate_states"):
        if key in completeness:
            completeness[key] = [_pair_row(row, count) for row in completeness[key]]
    document["completeness"] = completeness
    document["non_finite_states"] = sorted({int(row) // count for row in report.get("non_finite_states", [])})
    document["actions"] = [
        {
            "action": action,
            "name": name,
            "forward_target": f"action:{action}",
            "greedy_states": int(actions.greedy_counts[action]),
            "units": "features" if unit_sizes is None else "groups",
            "top_10_by_mean_abs": top_features(statistics_rows(unit_names, actions.moments[action], unit_sizes), top_k),
            "completeness": completeness_summary(
                _action_rows(host, action, count), per_state=False, tolerance=tolerance
            ),
        }
        for action, name in enumerate(actions.names)
    ]
    return document


def _pair_row(row: Mapping[str, Any], actions: int) -> dict[str, Any]:
    """A per-pair row (``state_idx`` the row ``s * A + a``) as the state's: ``state_idx`` ``s``, then ``action``."""
    state, action = divmod(int(row["state_idx"]), actions)
    return {"state_idx": state, "action": action, **{key: value for key, value in row.items() if key != "state_idx"}}
