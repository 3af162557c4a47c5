"""Statistics of an Integrated Gradients run and the JSON report (schema version 1).

This module turns an :class:`~lightning_ig.attribution.IGResult` into numbers a
person (or a program) can read: per-feature statistics over the held-out
states, the top features, the completeness error with degenerate states kept
apart, drift measures between runs, and the JSON document that the callback
and the ``lightning-ig`` command write.

The report's keys are a contract with existing consumers (shared/DESIGN.md,
"The JSON report"); the JSON Schema in ``report_schema_v1.json`` next to this
file pins them. More keys may sit beside them; none may be renamed.

Everything here runs on the host in float64 on a copy of the result, so the
statistics do not depend on the device the attributions were computed on, and
the same inputs give a byte-identical JSON document.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from lightning_ig._files import atomic_path

__all__ = [
    "SCHEMA_VERSION",
    "SCHEMA_PATH",
    "load_schema",
    "default_feature_names",
    "feature_statistics",
    "top_features",
    "completeness_summary",
    "spearman",
    "topk_jaccard",
    "build_report",
    "report_to_json",
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


class _ResultLike(Protocol):
    """The fields of :class:`~lightning_ig.attribution.IGResult` this module reads."""

    attributions: torch.Tensor
    f_input: torch.Tensor
    f_baseline: torch.Tensor
    delta: torch.Tensor
    relative_error: torch.Tensor
    degenerate: torch.Tensor
    n_steps: int
    method: str
    gradient: str
    backend: str


def load_schema() -> dict[str, Any]:
    """Return the JSON Schema of a schema-version-1 report as a dict.

    Returns:
        The parsed contents of :data:`SCHEMA_PATH`.

    Example::

        import jsonschema
        jsonschema.validate(report, load_schema())
    """
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def default_feature_names(feature_shape: Sequence[int]) -> list[str]:
    """Names for unnamed features: ``x0, x1, ...``, or ``x[i,j]`` for multi-dimensional inputs.

    Args:
        feature_shape: the shape of one input state, without the batch dimension.

    Returns:
        One name per element of a state, in row-major (flattened) order.
    """
    shape = tuple(int(size) for size in feature_shape)
    if len(shape) <= 1:
        return [f"x{i}" for i in range(shape[0] if shape else 1)]
    return ["x[" + ",".join(str(i) for i in index) + "]" for index in np.ndindex(*shape)]


def _as_float64(values: torch.Tensor | np.ndarray | Sequence[float], name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        # One device-to-host copy; the statistics are host work by design.
        return values.detach().to(device="cpu", dtype=torch.float64).numpy()
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a tensor or a sequence of numbers, got {type(values).__name__}") from error


def _flat_attributions(attributions: torch.Tensor | np.ndarray) -> np.ndarray:
    array = _as_float64(attributions, "attributions")
    if array.ndim < 2:
        raise ValueError(
            f"attributions must have shape (num_states, *feature_shape), got shape {tuple(array.shape)}; "
            "add the state dimension (e.g. attributions.unsqueeze(0)) for a single state"
        )
    return array.reshape(array.shape[0], -1)  # (B, F): features flattened in row-major order


def _check_names(feature_names: Sequence[str] | None, num_features: int, feature_shape: Sequence[int]) -> list[str]:
    if feature_names is None:
        return default_feature_names(feature_shape)
    if isinstance(feature_names, str):
        raise TypeError(f"feature_names must be a sequence of strings, got the string {feature_names!r}")
    names = list(feature_names)
    if len(names) != num_features:
        raise ValueError(
            f"feature_names has {len(names)} names but the attributions have {num_features} features "
            f"(feature shape {tuple(feature_shape)}, flattened); pass one name per feature"
        )
    if not all(isinstance(name, str) for name in names):
        bad = next(name for name in names if not isinstance(name, str))
        raise TypeError(f"feature_names must all be strings, got {bad!r} ({type(bad).__name__})")
    return names


def _json_float(value: float) -> float | None:
    """A float for strict JSON: non-finite values become ``None`` (``null``)."""
    value = float(value)
    return value if math.isfinite(value) else None


def feature_moments(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean |attr|, stddev, mean attr)`` per feature of ``flat (B, F)``, over the states.

    Population standard deviation (ddof=0), so one state gives 0, not NaN.
    """
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite inputs give non-finite stats -> null
        return np.abs(flat).mean(axis=0), flat.std(axis=0), flat.mean(axis=0)


def feature_statistics(
    attributions: torch.Tensor | np.ndarray, feature_names: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Per-feature statistics of attributions over the states.

    Args:
        attributions: ``(num_states, *feature_shape)``; multi-dimensional
            features are flattened in row-major order.
        feature_names: one name per (flattened) feature; ``None`` (default)
            names them with :func:`default_feature_names`.

    Returns:
        One dict per feature, in feature order, with keys ``name``,
        ``mean_abs`` (mean of ``|attr|`` over states), ``stddev`` (population
        standard deviation of ``attr`` over states) and ``mean_signed`` (mean of
        ``attr``). Non-finite statistics are ``None``.

    Raises:
        ValueError: ``attributions`` has no state dimension or ``feature_names``
            has the wrong length.
        TypeError: ``feature_names`` is not a sequence of strings.

    Example::

        >>> feature_statistics(torch.tensor([[1.0, -2.0], [3.0, 2.0]]), ["a", "b"])[1]
        {'name': 'b', 'mean_abs': 2.0, 'stddev': 2.0, 'mean_signed': 0.0}
    """
    flat = _flat_attributions(attributions)
    feature_shape = tuple(attributions.shape[1:])
    names = _check_names(feature_names, flat.shape[1], feature_shape)
    mean_abs, stddev, mean_signed = feature_moments(flat)
    return [
        {
            "name": name,
            "mean_abs": _json_float(mean_abs[i]),
            "stddev": _json_float(stddev[i]),
            "mean_signed": _json_float(mean_signed[i]),
        }
        for i, name in enumerate(names)
    ]


def rank_order(values: np.ndarray) -> np.ndarray:
    """Indices of ``values`` by decreasing value; ties keep feature order; NaN last.

    The one ordering of features used everywhere: the report's top-k, the
    Jaccard drift, the text table and the figures.
    """
    keys = np.where(np.isnan(values), -np.inf, values)
    return np.argsort(-keys, kind="stable")


def top_features(features: Sequence[Mapping[str, Any]], k: int = 10) -> list[dict[str, Any]]:
    """The ``k`` features with the largest ``mean_abs``, largest first.

    Args:
        features: the output of :func:`feature_statistics`.
        k: how many to keep (default 10); fewer when there are fewer features.

    Returns:
        Copies of the feature dicts, by ``mean_abs`` descending; ties keep
        feature order, and ``None`` (non-finite) values come last.

    Raises:
        ValueError: ``k`` is not a positive int.
    """
    _check_positive_int(k, "k")
    values = np.array([np.nan if f["mean_abs"] is None else f["mean_abs"] for f in features], dtype=np.float64)
    return [dict(features[i]) for i in rank_order(values)[:k]]


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def completeness_summary(result: _ResultLike, *, per_state: bool = True) -> dict[str, Any]:
    """Completeness of an IG run: how far ``sum(attr)`` is from ``F(x) - F(b)`` per state.

    Degenerate states (``|F(x) - F(b)|`` too small for a ratio, as flagged by
    the engine in ``result.degenerate``) are kept out of the worst relative
    error; their relative error is ``None`` and they are listed apart with
    their absolute error.

    Args:
        result: an :class:`~lightning_ig.attribution.IGResult` with one
            attribution per state (not ``target="each"``).
        per_state: include the per-state lists (default ``True``); ``False``
            gives the summary numbers only, which is much cheaper for many states.

    Returns:
        A dict with ``worst_relative_error`` (max over non-degenerate states;
        ``0.0`` when every state is degenerate), ``mean_abs_error`` (mean
        ``|delta|`` over all states), ``num_degenerate``, ``per_state`` (one
        dict per state: ``state_idx``, ``sum_attributions``,
        ``f_input_minus_f_baseline``, ``relative_error``, ``absolute_error``,
        ``degenerate``) and ``degenerate_states`` (``state_idx`` and
        ``absolute_error`` of each degenerate state).

    Raises:
        ValueError: the result holds one attribution set per action (``target="each"``).
    """
    flat = _flat_attributions(result.attributions)
    f_input = _as_float64(result.f_input, "f_input")
    f_baseline = _as_float64(result.f_baseline, "f_baseline")
    if f_input.ndim != 1 or f_input.shape[0] != flat.shape[0]:
        raise ValueError(
            f"expected one forward value per state, got f_input of shape {tuple(f_input.shape)} for "
            f"{flat.shape[0]} states; for target='each' build one report per action (index the result's tensors)"
        )
    sums = flat.sum(axis=1)  # (B,)
    difference = f_input - f_baseline  # (B,)
    absolute = np.abs(_as_float64(result.delta, "delta"))  # Captum's signed delta, as the engine computed it
    relative = _as_float64(result.relative_error, "relative_error")
    degenerate = _as_float64(result.degenerate, "degenerate").reshape(-1) != 0  # (B,) bool
    regular = relative[~degenerate]
    regular = regular[~np.isnan(regular)]
    summary: dict[str, Any] = {
        "worst_relative_error": _json_float(regular.max()) if regular.size else 0.0,
        "mean_abs_error": _json_float(absolute.mean()) if absolute.size else 0.0,
        "num_degenerate": int(degenerate.sum()),
    }
    if not per_state:
        return summary
    relative = np.where(degenerate, np.nan, relative)  # degenerate: no ratio, whatever the engine stored
    columns = zip(
        _json_floats(sums),
        _json_floats(difference),
        _json_floats(relative),
        _json_floats(absolute),
        degenerate.tolist(),
    )
    summary["per_state"] = [
        {
            "state_idx": i,
            "sum_attributions": total,
            "f_input_minus_f_baseline": change,
            "relative_error": ratio,
            "absolute_error": error,
            "degenerate": flag,
        }
        for i, (total, change, ratio, error, flag) in enumerate(columns)
    ]
    summary["degenerate_states"] = [
        {"state_idx": i, "absolute_error": _json_float(absolute[i])} for i in np.flatnonzero(degenerate).tolist()
    ]
    return summary


def _json_floats(values: np.ndarray) -> list[float | None]:
    """``values.tolist()`` with non-finite entries as ``None`` (vectorised check: one pass for the common case)."""
    listed = values.tolist()
    if np.isfinite(values).all():
        return listed
    return [value if math.isfinite(value) else None for value in listed]


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    start = 0
    while start < len(values):
        stop = start
        while stop + 1 < len(values) and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        ranks[order[start : stop + 1]] = (start + stop) / 2.0 + 1.0
        start = stop + 1
    return ranks


def spearman(a: torch.Tensor | np.ndarray | Sequence[float], b: torch.Tensor | np.ndarray | Sequence[float]) -> float:
    """Spearman rank correlation of two equally long vectors, ties given average ranks.

    Used for drift: ``a`` and ``b`` are the per-feature mean ``|attr|`` of two runs.

    Args:
        a: first vector (flattened).
        b: second vector, as long as ``a``.

    Returns:
        The Pearson correlation of the two rank vectors, in ``[-1, 1]``;
        ``nan`` when either vector is constant (including length 1) or holds
        a NaN, where a rank correlation is undefined.

    Raises:
        ValueError: ``a`` and ``b`` differ in length or are empty.

    Example::

        >>> spearman([1.0, 2.0, 3.0], [10.0, 20.0, 20.0])
        0.8660254037844387
    """
    x = _as_float64(a, "a").reshape(-1)
    y = _as_float64(b, "b").reshape(-1)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"spearman needs two non-empty vectors of one length, got lengths {x.size} and {y.size}")
    if np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    rank_x = _average_ranks(x) - (x.size + 1) / 2.0
    rank_y = _average_ranks(y) - (y.size + 1) / 2.0
    denominator = math.sqrt(float(rank_x @ rank_x) * float(rank_y @ rank_y))
    if denominator == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float(rank_x @ rank_y) / denominator))


def topk_jaccard(
    a: torch.Tensor | np.ndarray | Sequence[float], b: torch.Tensor | np.ndarray | Sequence[float], k: int
) -> float:
    """Jaccard overlap ``|A & B| / |A | B|`` of the top-``k`` features of two score vectors.

    Ties in the scores keep feature order (lower index first), so the result is deterministic.

    Args:
        a: per-feature scores of one run (e.g. mean ``|attr|``).
        b: per-feature scores of another run, as long as ``a``.
        k: how many top features to compare; clipped to the number of features.

    Returns:
        A value in ``[0, 1]``: 1 when both runs have the same top-``k`` set.

    Raises:
        ValueError: ``a`` and ``b`` differ in length or are empty, or ``k < 1``.
        TypeError: ``k`` is not an int.

    Example::

        >>> topk_jaccard([3.0, 2.0, 1.0, 0.0], [3.0, 0.0, 1.0, 2.0], k=2)
        0.3333333333333333
    """
    _check_positive_int(k, "k")
    x = _as_float64(a, "a").reshape(-1)
    y = _as_float64(b, "b").reshape(-1)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"topk_jaccard needs two non-empty vectors of one length, got lengths {x.size} and {y.size}")
    k = min(int(k), x.size)
    top_a = set(rank_order(x)[:k].tolist())
    top_b = set(rank_order(y)[:k].tolist())
    return len(top_a & top_b) / len(top_a | top_b)


def build_report(
    result: _ResultLike,
    *,
    feature_names: Sequence[str] | None,
    checkpoint: str | os.PathLike[str] | None = None,
    forward_target: str,
    regime_head: str | None = None,
    top_k: int = 10,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the schema-version-1 JSON report of one IG run.

    The contract keys come first, in the documented order; ``extra`` keys and
    the run's settings (``method``, ``gradient``, ``backend``, ``baseline``
    summary, ``feature_shape``, ``package_version``, ``mean_abs_error``) sit
    beside them.

    Args:
        result: an :class:`~lightning_ig.attribution.IGResult` with one
            attribution per state (for ``target="each"``, build one report per action).
        feature_names: one name per flattened feature, or ``None`` for
            :func:`default_feature_names`.
        checkpoint: the checkpoint the model came from (written as a string), or ``None``.
        forward_target: what the attributed scalar is, e.g. ``"mean"``, ``"action:1"``.
        regime_head: the head prefix of a merged checkpoint, or ``None``.
        top_k: how many features ``top_10_by_mean_abs`` lists (default 10; the
            key keeps its contract name whatever ``top_k`` is).
        extra: more keys to add beside the contract keys (e.g. ``global_step``,
            ``timings``). They must be JSON-serialisable and must not shadow a
            contract key.

    Returns:
        A dict ready for :func:`write_report` / :func:`report_to_json`.

    Raises:
        ValueError: ``feature_names`` has the wrong length, ``top_k < 1``, the
            result has one attribution set per action, or ``extra`` shadows a
            contract key.
        TypeError: ``feature_names`` is not a sequence of strings or ``top_k`` is not an int.

    Example::

        result = integrated_gradients(model_v, states, n_steps=32)
        report = build_report(result, feature_names=["x", "v"], forward_target="mean")
        write_report(report, "runs/ig.json")
    """
    from lightning_ig import __version__  # noqa: PLC0415 - the package imports this module lazily

    _check_positive_int(top_k, "top_k")
    if not isinstance(forward_target, str):
        raise TypeError(f"forward_target must be a string describing the target, got {type(forward_target).__name__}")
    features = feature_statistics(result.attributions, feature_names)
    completeness = completeness_summary(result)
    shadowed = sorted(set(extra or {}) & set(_REPORT_KEYS))
    if shadowed:
        raise ValueError(f"extra must not redefine the report's contract keys, got {shadowed}; rename those keys")

    feature_shape = [int(size) for size in result.attributions.shape[1:]]
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "checkpoint": None if checkpoint is None else os.fspath(checkpoint),
        "num_steps": int(result.n_steps),
        "state_dim": len(features),
        "num_states": int(result.attributions.shape[0]),
        "forward_target": forward_target,
        "regime_head": regime_head,
        "features": features,
        "top_10_by_mean_abs": top_features(features, top_k),
        "completeness": {
            "worst_relative_error": completeness["worst_relative_error"],
            "per_state": completeness["per_state"],
            "mean_abs_error": completeness["mean_abs_error"],
            "num_degenerate": completeness["num_degenerate"],
            "degenerate_states": completeness["degenerate_states"],
        },
        "feature_shape": feature_shape,
        "method": str(result.method),
        "gradient": str(result.gradient),
        "backend": str(result.backend),
        "package": "lightning-ig",
        "package_version": __version__,
    }
    report.update(extra or {})
    return report


def report_to_json(report: Mapping[str, Any]) -> str:
    """Serialise a report as strict, deterministic JSON (no NaN/Infinity; same report, same bytes).

    Args:
        report: from :func:`build_report`.

    Returns:
        The JSON text, indented by two spaces, ending with a newline.

    Raises:
        ValueError: the report holds a non-finite float (use ``None``).
    """
    try:
        # Python writes floats with repr(): the shortest text that reads back to the same double.
        return json.dumps(report, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
    except ValueError as error:
        raise ValueError(f"the report holds a non-finite number, which strict JSON cannot carry: {error}") from error


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a report as JSON atomically: readers see the old file or the new one, never half of one.

    The text goes to a temporary file in the same folder, is flushed to disk,
    and replaces ``path`` with :func:`os.replace`. Missing parent folders are created.

    Args:
        report: from :func:`build_report`.
        path: where to write.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: the report holds a non-finite float.
        OSError: the folder cannot be created or written.
    """
    text = report_to_json(report)  # serialise first: a bad report leaves no file behind
    target = Path(path)
    with atomic_path(target) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return target

