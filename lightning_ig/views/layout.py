"""The Custom Scalars page of TensorBoard: one chart per quantity, for every IG callback of a trainer.

Written at a callback's first run and with each bar chart (the latest one written is the one TensorBoard
shows); reached only then, not at every run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lightning_ig.attribution.statistics import drift_tags, rank_order
from lightning_ig.views.summary import DRIFT_WORDS, RunSummary
from lightning_ig.views.tensorboard import TagNames

__all__ = ["custom_scalars_layout", "ranked_labels"]

_LAYOUT_UNIT_CHARTS = 12
_ENSEMBLE_CHARTS = {
    "spearman_min": "lowest Spearman correlation of a member's ranking with the aggregate's",
    "relative_spread": "spread of mean |attribution| across members (relative)",
    "completeness/worst_relative_error": "worst relative completeness error of a member",
}


def custom_scalars_layout(
    tag_sets: Sequence[tuple[str, TagNames, int, Sequence[str] | None]],
) -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout of every IG callback in the trainer: one chart per quantity.

    TensorBoard draws the lines of one run in one colour, so every chart holds one
    quantity: completeness's relative and absolute errors apart, each meaningful
    drift measure, an ensemble's agreement and member completeness, and the most
    important units (features or groups) one chart each.

    Args:
        tag_sets: per callback ``(title, tags, top_k, units_by_importance)``; the last is
            the unit labels, most important first (``None``: by name).

    Returns:
        A layout for ``SummaryWriter.add_custom_scalars``.
    """
    layout: dict[str, dict[str, list[Any]]] = {}
    for title, tags, top_k, ranked in tag_sets:
        prefix = re.escape(tags.prefix)
        charts: dict[str, list[Any]] = {
            "completeness: worst relative error": ["Multiline", [rf"^{prefix}/completeness/worst_relative_error$"]],
            "completeness: mean absolute error": ["Multiline", [rf"^{prefix}/completeness/mean_abs_error$"]],
            "states that could not be checked (NaN/Inf)": [
                "Multiline",
                [rf"^{prefix}/completeness/non_finite_states$"],
            ],
            "share of |attribution| in the top 1% of features": [
                "Multiline",
                [rf"^{prefix}/concentration/top1pct_share$"],
            ],
        }
        grouped = tags.group_labels is not None
        units = tags.group_labels if grouped else tags.feature_labels or []
        for name in drift_tags(len(units), top_k):
            words = (
                DRIFT_WORDS[name]
                .format(k=top_k)
                .replace("with the first run", "Spearman rank correlation with the first run")
            )
            charts[f"drift: {words}"] = ["Multiline", [rf"^{prefix}/drift/{name}$"]]
        if tags.ensemble_members is not None:
            charts.update(
                {
                    f"ensemble: {words}": ["Multiline", [rf"^{prefix}/ensemble/{name}$"]]
                    for name, words in _ENSEMBLE_CHARTS.items()
                }
            )
        quantity = "group/mean_abs" if grouped else "mean_abs"
        for rank, label in enumerate(list(ranked or units)[:_LAYOUT_UNIT_CHARTS], start=1):
            charts[f"#{rank} {label}: mean |attribution|"] = [
                "Multiline",
                [rf"^{prefix}/{quantity}/{re.escape(label)}$"],
            ]
        layout[title] = charts
    return layout


def ranked_labels(summary: RunSummary, tags: TagNames) -> list[str]:
    """The unit labels, most important (mean ``|attr|``) first."""
    labels = tags.unit_labels(summary.units)
    return [labels[i] for i in rank_order(summary.units.moments.mean_abs)]
