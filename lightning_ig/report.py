"""The JSON report of an Integrated Gradients run (schema version 1).

The callback (one file per run) and the ``lightning-ig`` command write the same
document. Its contract keys are fixed; the JSON Schema in
``report_schema_v1.json`` next to this file pins them::

    { "schema_version": 1, "checkpoint", "num_steps", "state_dim", "num_states",
      "forward_target", "regime_head",
      "features": [ { "name", "mean_abs", "stddev", "mean_signed" } ],
      "top_10_by_mean_abs": [ ... ],
      "completeness": { "worst_relative_error",
         "per_state": [ { "state_idx", "sum_attributions",
                          "f_input_minus_f_baseline", "relative_error" } ] } }

More keys sit beside them (documented in the schema): the run's settings,
``non_finite_states`` (states whose forward or attributions were NaN/Inf),
``num_degenerate``, ``stochastic_forward`` and, when groups are in use,
``groups``; for an ensemble, ``ensemble`` (the members beside the aggregate,
:func:`lightning_ig.ensemble.member_summary`, passed in ``extra``). Strict JSON:
a number that is not finite is written as ``null``.
The same inputs give a byte-identical document.

The statistics come from :mod:`lightning_ig.statistics` and drift from
:mod:`lightning_ig.drift`; their public functions are re-exported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_ig._files import OutputPathError, atomic_path, check_output_dir, check_output_file, file_name_limit
from lightning_ig.drift import spearman, topk_jaccard
from lightning_ig.groups import FeatureGroups, GroupSpec, check_group_spec
from lightning_ig.host_result import HostResult
from lightning_ig.statistics import completeness_summary, feature_statistics, rank_order, statistics_rows, top_features
from lightning_ig.vocabulary import (
    check_feature_names,
    check_mapping,
    check_names,
    check_path,
    check_positive_int,
    check_text,
    default_feature_names,
)

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "ReportFolder",
    "build_report",
    "completeness_summary",
    "default_feature_names",
    "feature_statistics",
    "load_schema",
    "rank_order",
    "report_to_json",
    "spearman",
    "top_features",
    "topk_jaccard",
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
) -> dict[str, Any]:
    """Build the schema-version-1 JSON report of one IG run.

    The contract keys come first, in the documented order; then the run's
    settings (``feature_shape``, ``method``, ``gradient``, ``backend``, the
    package version), ``non_finite_states``, ``num_degenerate``,
    ``stochastic_forward``, ``groups`` (when given) and the ``extra`` keys.

    Args:
        result: an :class:`~lightning_ig.attribution.IGResult` with one
            attribution per state (for ``target="each"``, build one report per
            action), or a :class:`~lightning_ig.host_result.HostResult`.
        feature_names: one name per flattened feature, or ``None`` for ``x0, x1, ...``.
        checkpoint: the checkpoint the model came from (written as a string), or ``None``.
        forward_target: what the attributed scalar is, e.g. ``"mean"``, ``"action:1"``.
        regime_head: the head prefix of a merged checkpoint, or ``None``.
        top_k: how many features ``top_10_by_mean_abs`` lists (default 10; the
            key keeps its contract name whatever ``top_k`` is).
        extra: more keys beside the contract keys (e.g. ``global_step``,
            ``timings``); JSON-serialisable, not shadowing a contract key.
        groups: feature groups to report (``"channels"``, a mask, a dict or a
            :class:`~lightning_ig.groups.FeatureGroups`); ``None`` (default): the
            host result's groups, if any.

    Returns:
        A dict ready for :func:`write_report` / :func:`report_to_json`.

    Raises:
        ValueError: ``feature_names`` has the wrong length, ``top_k < 1``, the
            result has one attribution set per action, ``extra`` shadows a
            contract key, or ``groups`` is bad (see :class:`~lightning_ig.groups.FeatureGroups`).
        TypeError: ``feature_names`` is not a sequence of strings or ``top_k`` is not an int.

    Example::

        result = integrated_gradients(model_v, states, n_steps=32)
        report = build_report(result, feature_names=["x", "v"], forward_target="mean", groups={"all": [0, 1]})
        write_report(report, "runs/ig.json")
    """
    from lightning_ig import __version__  # noqa: PLC0415 - the package imports this module lazily

    check_positive_int(top_k, "top_k")
    if not isinstance(forward_target, str):
        raise TypeError(f"forward_target must be a string describing the target, got {type(forward_target).__name__}")
    checkpoint = None if checkpoint is None else check_path(checkpoint, "checkpoint")
    regime_head = None if regime_head is None else check_text(regime_head, "regime_head")
    extra = None if extra is None else check_mapping(extra, "extra")
    feature_names = None if feature_names is None else check_names(feature_names, "feature_names")
    groups = check_group_spec(groups, "groups")
    shadowed = sorted(set(extra or {}) & set(_REPORT_KEYS))
    if shadowed:
        raise ValueError(f"extra must not redefine the report's contract keys, got {shadowed}; rename those keys")
    host = _host(result, groups)
    shape = host.feature_shape
    names = (
        default_feature_names(shape) if feature_names is None else check_feature_names(feature_names, host.num_features)
    )
    features = statistics_rows(names, host.features)
    completeness = completeness_summary(host)
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
    if host.groups is not None and host.group_moments is not None:
        report["groups"] = statistics_rows(host.groups.names, host.group_moments, host.groups.sizes.tolist())
    report.update(extra or {})
    return report


def _host(result: Any, groups: GroupSpec | None) -> HostResult:
    if groups is None:
        return HostResult.from_result(result)
    if isinstance(result, HostResult):
        if result.groups is None:
            raise ValueError("this host result was gathered without groups; pass groups= to HostResult.from_result")
        return result
    resolved = FeatureGroups.resolve(groups, tuple(result.attributions.shape[1:]))
    return HostResult.from_result(result, groups=resolved)


def report_to_json(report: Mapping[str, Any]) -> str:
    """Serialise a report as strict, deterministic JSON (no NaN/Infinity; same report, same bytes).

    Two-space indentation, except that each entry of a list of objects (a
    feature, a group, a state) is written on one line: compact for reports of
    tens of thousands of features, and fast (the C encoder writes each line).

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


def _encode(value: Any, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [f"{inner}{_scalar(str(key))}: {_encode(item, inner)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, Mapping) for item in value):
        return "[\n" + ",\n".join(inner + _scalar(item) for item in value) + "\n" + indent + "]"
    return _scalar(value)


# One encoder for every line (json.dumps with options builds a new one per call). Python writes floats with
# repr(): the shortest text that reads back to the same double.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(", ", ": "))


def _scalar(value: Any) -> str:
    return _ENCODER.encode(value)


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> Path:
    """Write a report as JSON atomically: readers see the old file or the new one, never half of one.

    The file's mode follows the umask (an existing file keeps its mode). Missing parent
    folders are created.

    Args:
        report: from :func:`build_report`.
        path: where to write.
        follow_symlinks: ``True`` (default: ``path`` is the user's): a symbolic link is written
            through to its target. ``False`` (a name the caller made up, as the callback's
            reports): a link at ``path`` is replaced itself, its target never touched.

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


class ReportFolder:
    """The folder where the callback writes one report per run, under names it makes up.

    The names are ``ig_report[_<name>]_step=<step, 8+ digits>.json``. Being the tool's
    own, they are never written through a symbolic link: a link found there is refused
    and one planted later is replaced, never followed. A report that cannot be written
    (a full disk, a changed permission, a refused link) does not stop training:
    :meth:`write` says why and counts it, and :meth:`losses` sums up the losses.

    Args:
        folder: the folder (made if missing).
        name: the callback's ``name`` (``None``: none), part of every file name.
        inputs: files the run reads (the held-out states file); a report never replaces one.

    Raises:
        OutputPathError: ``folder`` is a file, or cannot be made or written.
        ValueError: ``name`` makes file names longer than the folder's file system takes.
    """

    def __init__(self, folder: str | os.PathLike[str], name: str | None, *, inputs: Sequence[Any] = ()) -> None:
        self.name = name
        self._inputs = [path for path in inputs if isinstance(path, (str, os.PathLike))]
        longest = self.file_name(2**63 - 1)  # the last step a run can have (a 64-bit step counter)
        size, limit = len(os.fsencode(longest)), file_name_limit(folder)
        if size > limit:  # before the folder is made: a refused set-up leaves nothing behind
            raise ValueError(
                f"name={_cut(name)!r} makes report file names of up to {size} bytes ({_cut(longest)!r}), more than the "
                f"{limit} the file system of report_dir {os.fspath(folder)!r} takes: choose a name at least "
                f"{size - limit} bytes shorter"
            )
        self.folder = check_output_dir(folder, what="report_dir")
        self.attempted = 0
        self.lost = 0
        self.first_loss: str | None = None

    def file_name(self, step: int) -> str:
        """The report's file name for the run at global step ``step``."""
        return f"ig_report{'' if self.name is None else '_' + self.name}_step={step:08d}.json"

    def write(self, report: Mapping[str, Any], step: int) -> str | None:
        """Write the report of the run at ``step``; ``None``, or why it could not be (``"PATH (error)"``)."""
        self.attempted += 1
        path = self.folder / self.file_name(step)
        try:
            check_output_file(path, what="the report", inputs=self._inputs, made_up=True)
            write_report(report, path, follow_symlinks=False)
        except OutputPathError as error:
            failure = f"{path} ({error})"
        except OSError as error:
            failure = f"{path} ({error.strerror or error})"
        else:
            return None
        self.lost += 1
        self.first_loss = self.first_loss or failure
        return failure

    def losses(self) -> str | None:
        """``"N of M reports could not be written, the first: PATH (error)"``, or ``None`` when none was lost."""
        if not self.lost:
            return None
        return f"{self.lost} of {self.attempted} reports could not be written, the first: {self.first_loss}"


def _cut(text: str | None, size: int = 60) -> str | None:
    return text if text is None or len(text) <= size else f"{text[: size - 3]}..."
