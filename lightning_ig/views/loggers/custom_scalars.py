"""The landing view: which scalars carry something for this run, and the Custom Scalars page of every IG callback.

What TensorBoard does with them (read in its 2.21 frontend and checked in headless Chromium): Time Series sorts
every card of a run, scalars, images and histograms together, by tag with a natural order (runs of digits compare
as numbers; ``/`` and digits sort before every other character), twelve to a page. So a card that carries nothing
(two identical curves, a count that is always 0) pushes the ones that do further down:
:func:`~lightning_ig.views.loggers.outputs.informative_scalars` leaves them out. The Custom Scalars page merges
the categories of one title across the runs of a logdir and drops
identical charts, so :func:`custom_scalars_layout` titles every chart by what it shows (the feature or group by
name, the callback by name), never by a rank that differs from run to run: two runs of one set-up give one chart
per unit with a line per run.

Written at a callback's first run and with each bar chart (the latest layout written is the one TensorBoard shows);
reached only then, not at every run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from lightning_ig.run.statistics import rank_order
from lightning_ig.run.summary import RunSummary
from lightning_ig.views.tags import TagNames

if TYPE_CHECKING:  # the TensorBoard outputs of a callback, which make the page through the callback
    from lightning_ig.views.loggers.outputs import RunOutputs

__all__ = ["custom_scalars_layout", "ranked_labels", "trainer_layout"]

_TRUST_CHARTS = {
    "completeness/worst_attribution_error": "accuracy: worst estimated attribution error (verdict)",
    "completeness/worst_mass_relative_error": "accuracy: worst mass-relative completeness error (verdict)",
    "trust/status": "trust checks: 1 passed, 0 unresolved, -1 failed",
    "sanity/randomization_rank_correlation": "sanity: rank correlation with a re-initialised copy",
    "faithfulness/deletion_auc": "faithfulness: deletion AUC (attribution order)",
    "completeness/worst_relative_error": "completeness: worst relative error |delta| / |dF|",
    "completeness/mean_abs_error": "completeness: mean absolute error",
    "completeness/non_finite_states": "states with NaN/Inf",
    "completeness/degenerate_states": "states too close to the baseline to check",
    "drift/spearman_prev": "drift: rank correlation with the previous run",
    "drift/spearman_first": "drift: rank correlation with the first run",
    "drift/topk_jaccard_prev": "drift: top-k overlap with the previous run",
    "concentration/top1pct_share": "share of |attribution| in the top 1% of features",
    "concentration/top10pct_share": "share of |attribution| in the top 10% of features",
}
_ENSEMBLE_CHARTS = {
    "ensemble/spearman_min": "ensemble: lowest rank correlation of a member with the aggregate",
    "ensemble/relative_spread": "ensemble: spread of mean |attribution| across members (relative)",
    "ensemble/completeness/worst_relative_error": "ensemble: worst relative completeness error of a member",
}
_UNIT_CHARTS = 12


def custom_scalars_layout(
    callbacks: Sequence[tuple[str | None, TagNames, Sequence[str] | None]], logged: Iterable[str] | None = None
) -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout of every IG callback of a trainer, titled by names, never by rank.

    One category per callback for its trust curves (``IG: trust``; ``IG value: trust`` for a callback named
    ``value``), one for its units (``IG: groups`` or ``IG: features``) and, with ``target="each"`` or
    ``"contrast"``, one for the actions (``IG: actions``). Every chart holds one quantity of one unit (TensorBoard
    draws the lines of one run in one colour), titled by the unit's name (``ball: mean |attribution|``): two runs
    of one set-up give identical charts, which TensorBoard merges into one chart with a line per run, and a
    CartPole run and a MinAtar run in one logdir land in ``IG: features`` and ``IG: groups``.

    Args:
        callbacks: per callback ``(name, tags, units_by_importance)``: its ``name`` (``None`` for the unnamed
            one), its :class:`~lightning_ig.views.tags.TagNames`, and its unit labels most important
            first (``None``: in their order). The order picks the 12 units that get a chart and the order in
            which they first appear; the titles never carry it.
        logged: the scalar tags logged so far (``tensorboard.informative_scalars``); charts of tags never logged are
            left out (``None``: every chart).

    Returns:
        A layout for ``SummaryWriter.add_custom_scalars``.
    """
    present = None if logged is None else set(logged)
    layout: dict[str, dict[str, list[Any]]] = {}
    for name, tags, ranked in callbacks:
        title = "IG" if name is None else f"IG {name}"
        prefix = re.escape(tags.prefix)
        chosen = dict(_TRUST_CHARTS)
        if tags.ensemble_members is not None:
            chosen.update(_ENSEMBLE_CHARTS)
        layout[f"{title}: trust"] = {
            words: _chart(rf"^{prefix}/{re.escape(suffix)}$")
            for suffix, words in chosen.items()
            if present is None or f"{tags.prefix}/{suffix}" in present
        }
        grouped = tags.group_labels is not None
        units = list(ranked or (tags.group_labels if grouped else tags.feature_labels) or [])
        quantity = "group/mean_abs" if grouped else "mean_abs"
        layout[f"{title}: {'groups' if grouped else 'features'}"] = {
            f"{label}: mean |attribution|": _chart(rf"^{prefix}/{quantity}/{re.escape(label)}$")
            for label in units[:_UNIT_CHARTS]
        }
        if tags.action_labels:
            layout[f"{title}: actions"] = {
                f"{action}: states where it is greedy": _chart(rf"^{prefix}/action/{re.escape(action)}/greedy_states$")
                for action in tags.action_labels
            }
    return layout


def _chart(pattern: str) -> list[Any]:
    return ["Multiline", [pattern]]


def ranked_labels(summary: RunSummary, tags: TagNames) -> list[str]:
    """The unit labels, most important (mean ``|attr|``) first."""
    labels = tags.labels[summary.units.kind]
    return [labels[i] for i in rank_order(summary.units.moments.mean_abs)]


def trainer_layout(callbacks: Sequence[tuple[str | None, RunOutputs, RunSummary | None]]) -> dict[str, Any]:
    """The Custom Scalars page of every IG callback of a trainer, charting the tags any of them has logged so far.

    Args:
        callbacks: per callback ``(name, outputs, last)``: its ``name``, its
            :class:`~lightning_ig.views.loggers.outputs.RunOutputs` and its last run's summary (``None`` before its
            first run), whose most important units get the charts.
    """
    logged = set().union(*(outputs.logged for _, outputs, _ in callbacks))
    entries = [
        (name, outputs.tags, None if last is None else ranked_labels(last, outputs.tags))
        for name, outputs, last in callbacks
    ]
    return custom_scalars_layout(entries, logged)
