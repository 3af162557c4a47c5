"""The scalar tags a healthy run logs, for the tests that read a run's events or a logger's files back."""

from __future__ import annotations

from lightning_ig.run.statistics import CONCENTRATION_SHARES
from lightning_ig.views.tags import CONCENTRATION_TWIN, TagNames, same_concentrations


def drift_tags(num_units: int, top_k: int) -> list[str]:
    """The drift scalars a run reports from the second run on, for this many units: the rank correlations from 3
    units (of 2 they are +-1 by construction), the top-k overlap where there are more units than k."""
    names = ["spearman_prev", "spearman_first"] if num_units >= 3 else []
    return names + (["topk_jaccard_prev"] if num_units > top_k else [])


def scalar_tags(tags: TagNames, top_k: int) -> list[str]:
    """Every scalar tag a healthy run logs from the second run on (the first has no drift).

    The counts of ``COUNT_TAGS`` are not among them: they appear from the first run where they are not 0.
    """
    prefix = tags.prefix
    figures = ("worst_attribution_error", "worst_mass_relative_error", "mean_abs_error")
    names = [f"{prefix}/completeness/{name}" for name in figures]
    for labels, group in ((tags.feature_labels, ""), (tags.group_labels if tags.group_units else None, "group/")):
        for quantity in ("mean_abs", "mean_signed"):
            names += [f"{prefix}/{group}{quantity}/{label}" for label in labels or []]
    names += [f"{prefix}/concentration/{name}" for name in CONCENTRATION_SHARES]
    if same_concentrations(tags.num_features):
        names.remove(f"{prefix}/{CONCENTRATION_TWIN}")
    units = tags.group_labels if tags.group_labels is not None else tags.feature_labels or []
    names += [f"{prefix}/drift/{name}" for name in drift_tags(len(units), top_k)]
    for action in tags.action_labels or []:
        names.append(f"{prefix}/action/{action}/greedy_states")
        if tags.action_units:
            quantity = "group/mean_abs" if tags.group_labels is not None else "mean_abs"
            names += [f"{prefix}/action/{action}/{quantity}/{label}" for label in units]
    return [*names, f"{prefix}/time_ms"]
