"""What the callback's set-up decides once per fit (put together by :mod:`lightning_ig.callback.fit`).

* :func:`check_unique_names`: callbacks that share a trainer need names of their own (their options are checked
  when they are made: :mod:`lightning_ig.callback.options`);
* :func:`logged_units`: what a run logs one by one (the features, or groups when there are too many) and the
  tags they go under (:func:`choose_groups`, :func:`automatic_groups`);
* :func:`report_folder`: where the JSON report of each run goes, checked before training.
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_ig.attribution.groups import FeatureGroups, GroupSpec
from lightning_ig.callback.reports import ReportFolder
from lightning_ig.views.tags import TagNames
from lightning_ig.vocabulary import check_feature_names, default_feature_names

__all__ = [
    "LoggedUnits",
    "automatic_groups",
    "check_unique_names",
    "choose_groups",
    "history_to_continue",
    "logged_units",
    "named",
    "report_folder",
    "take_earlier_state",
    "warn_of_earlier_reports",
]


def named(name: str | None) -> str:
    """`` 'name'`` for a named callback's messages, nothing for an unnamed one."""
    return "" if name is None else f" '{name}'"


def check_unique_names(names: Sequence[str | None]) -> None:
    """Refuse two callbacks of one trainer with one ``name``: they would write the same tags."""
    if repeated := sorted({str(name) for name in names if names.count(name) > 1}):
        raise MisconfigurationException(
            f"{sum(str(name) in repeated for name in names)} IntegratedGradientsCallbacks would write the "
            f"same tags (name={', '.join(repeated)}): give each its own name=, e.g. name='value' and name='action_1', "
            "so that their tags go under ig/<name>/"
        )


@dataclass(frozen=True)
class LoggedUnits:
    """What a callback's runs log one by one, decided at set-up.

    Attributes:
        names: one name per flattened feature (the user's, or ``x0, x1, ...``).
        groups: the groups logged, or ``None``.
        log_features: the features are few enough to log one by one.
        tags: the tags they go under.
    """

    names: list[str]
    groups: FeatureGroups | None
    log_features: bool
    tags: TagNames


def logged_units(
    feature_shape: tuple[int, ...],
    name: str | None,
    feature_names: Sequence[str] | None,
    feature_groups: GroupSpec | None,
    group_names: Sequence[str] | None,
    max_features: int,
) -> LoggedUnits:
    """The callback's units and tags for states of ``feature_shape``; a warning when groups were chosen for it.

    Raises:
        ValueError, TypeError: names or groups that do not fit the states (see :func:`choose_groups`).
    """
    count = math.prod(feature_shape)
    names = default_feature_names(feature_shape) if feature_names is None else list(feature_names)
    check_feature_names(names, count)
    groups = choose_groups(
        feature_groups, feature_shape, group_names=group_names, feature_names=feature_names, max_features=max_features
    )
    log_features = count <= max_features
    tags = TagNames.build(
        name,
        names if log_features else None,
        None if groups is None else groups.names,
        generated_features=feature_names is None,
        generated_groups=groups is not None and groups.generated_names,
        num_features=count,  # the top-10% concentration is logged only where it differs from the top-1% one
        group_units=groups is None or len(groups) <= max_features,  # two scalars and a histogram each, every run
    )
    if groups is not None and not tags.group_units:
        rank_zero_warn(
            f"IntegratedGradientsCallback{named(name)}: {len(groups)} feature_groups, more than max_logged_features="
            f"{max_features}: not logged one by one under {tags.prefix}/group/ (the cards, text and reports rank them)"
        )
    if feature_groups is None and groups is not None:
        rank_zero_warn(
            f"IntegratedGradientsCallback{named(name)}: the states have {count} features, more than "
            f"max_logged_features={max_features}: logging {len(groups)} groups ({tags.labels['groups'][0]}, ...) under "
            f"{tags.prefix}/group/ instead; choose them with feature_groups="
        )
    return LoggedUnits(names, groups, log_features, tags)


def history_to_continue(history: list[Any], now: dict[str, Any], state: dict[str, Any], name: str | None) -> list[Any]:
    """The ``history`` a ``state`` restores, or a new one (said) where it was of other units or held-out states."""
    was = {"units": len(history[0]["mean_abs"]) if history else 0, **(state.get("held_out") or {})}  # FitPlan.identity
    if history and (other := [key for key in now if key in was and was[key] != now[key]]):
        rank_zero_warn(
            f"IntegratedGradientsCallback{named(name)}: the restored history is of other units or held-out states "
            f"(their {' and '.join(other)} differ); starting a new history: drift compares runs on the same ones"
        )
        return []
    return history


def take_earlier_state(states: dict[Any, Any], key: str, identity: dict[str, Any]) -> None:
    """Move to ``key`` (in place) the state a checkpoint of an earlier version keeps under that version's
    ``state_key``, which also named the cadences (and, before the ``name`` option, not the name): one whose name and
    target are ``identity``'s is this callback's (a resume at another cadence keeps the history)."""
    kind = key[: key.index("{")]
    for earlier in [found for found in states if isinstance(found, str) and found.startswith(kind + "{")]:
        try:
            fields = ast.literal_eval(earlier[len(kind) :])
        except (ValueError, SyntaxError):  # not a key this callback made
            continue
        if key not in states and isinstance(fields, dict) and {k: fields.get(k) for k in identity} == identity:
            states[key] = states.pop(earlier)
            rank_zero_info(
                f"IntegratedGradientsCallback{named(identity['name'])}: the checkpoint keeps its state under an "
                f"earlier version's key {earlier}; restored (Lightning's warning to add that callback is moot)"
            )


def report_folder(
    report_dir: Path | None, default_root_dir: str | os.PathLike[str], has_loggers: bool, name: str | None, states: Any
) -> ReportFolder | None:
    """The reports' folder, checked (and ``name``: the file names must fit its file system), or ``None``.

    Without ``report_dir`` and without a logger, the reports go to ``<default_root_dir>/ig_reports``: a run that
    logs nowhere still leaves its numbers somewhere.
    """
    folder = report_dir
    if folder is None and not has_loggers:
        folder = Path(default_root_dir) / "ig_reports"
        rank_zero_info(
            "IntegratedGradientsCallback: the trainer has no logger, so nothing is logged; "
            f"the JSON report of each run goes to {folder}"
        )
    unnamed = "no logger and no report_dir: give the callback a report_dir, the Trainer a logger or a default_root_dir"
    what = "report_dir" if report_dir is not None else f"the reports' folder ({unnamed} you can write)"
    return None if folder is None else ReportFolder(folder, name, inputs=[states], what=what)


def warn_of_earlier_reports(reports: ReportFolder, name: str | None, start: int) -> None:
    """Warn that a new fit's reports at the steps of an earlier fit's in the same folder replace them.

    Called at the fit's start, once Lightning has restored a checkpoint (``Trainer.ckpt_path`` is set only then): a
    resumed fit continues the reports of the fit it resumes and is not warned about.

    Args:
        reports: the fit's report folder.
        name: the callback's ``name``.
        start: the global step the fit starts at.
    """
    if earlier := reports.existing(start):
        rank_zero_warn(
            f"IntegratedGradientsCallback{named(name)}: report_dir {reports.folder} holds {earlier} report(s) of an "
            f"earlier fit past step {start}; this fit's reports at the same steps replace them. Give each fit its own "
            "report_dir (or name=) to keep both"
        )


def automatic_groups(
    feature_shape: Sequence[int], max_features: int, feature_names: Sequence[str] | None = None
) -> FeatureGroups:
    """The groups used when a state has more features than are logged one by one.

    ``"channels"`` for a state with a channel dimension (``(C, H, W)``, ``(C, L)``)
    of at most ``max_features`` channels; otherwise consecutive blocks of the
    flattened features, as few as keep the number of groups within ``max_features``.

    Args:
        feature_shape: the shape of one state.
        max_features: the most units to log one by one.
        feature_names: the feature names (for the block names), or ``None``.

    Returns:
        The groups.
    """
    shape = tuple(int(size) for size in feature_shape)
    if len(shape) >= 2 and shape[0] <= max_features:
        return FeatureGroups.channels(shape)
    return FeatureGroups.blocks(shape, math.ceil(math.prod(shape) / max_features), feature_names)


def choose_groups(
    groups: GroupSpec | None,
    feature_shape: Sequence[int],
    *,
    group_names: Sequence[str] | None,
    feature_names: Sequence[str] | None,
    max_features: int,
) -> FeatureGroups | None:
    """The groups a training callback logs: the ones asked for; else :func:`automatic_groups` when the
    state has more than ``max_features`` features; else none.

    Raises:
        ValueError: ``group_names`` without ``groups`` or of another count than the groups, or a bad
            ``groups`` (see :meth:`FeatureGroups.resolve`).
    """
    if groups is not None and group_names is not None:  # the groups first: the names are counted against them
        return FeatureGroups.resolve(groups, feature_shape).renamed(group_names, "group_names")
    if groups is not None:
        names = feature_names if isinstance(groups, str) and groups == "features" else None
        return FeatureGroups.resolve(groups, feature_shape, names)
    if group_names is not None:
        raise ValueError("group_names needs feature_groups=...; pass the groups they name")
    if math.prod(feature_shape) <= max_features:
        return None
    return automatic_groups(feature_shape, max_features, feature_names)
