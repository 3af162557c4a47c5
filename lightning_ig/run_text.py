"""The words of one IG run: units, the completeness verdict, and the ``<prefix>/report`` markdown.

The completeness error is written as a fraction (``relative error 3.76e-03 <= 0.01``), as the JSON report,
the scalars and ``completeness_tol`` have it (:func:`lightning_ig.names.relative_error_text`).

Read by :mod:`lightning_ig.tensorboard` (the text and the Custom Scalars
titles) and :mod:`lightning_ig.figures` (the verdict under the bar chart). Reads
a :class:`~lightning_ig.summary.RunSummary`, never the JSON report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_ig.names import relative_error_text
from lightning_ig.statistics import rank_order
from lightning_ig.summary import RunSummary

__all__ = ["DRIFT_WORDS", "completeness_sentence", "completeness_verdict", "report_markdown", "target_unit"]

DRIFT_WORDS = {
    "spearman_prev": "Spearman rank correlation with the previous run",
    "spearman_first": "with the first run",
    "topk_jaccard_prev": "top-{k} overlap (Jaccard) with the previous run",
}


def target_unit(target: str) -> str:
    """The unit of the attributions, from the target label: attributions add up to a change of the target."""
    if target == "mean":
        return "mean output = V(s)"
    if target.startswith("action:"):
        return f"Q(s, {target.split(':', 1)[1]})"
    if target.startswith("callable:"):
        return target.split(":", 1)[1]
    return "model output"


def _number(value: float, spec: str = ".4g") -> str:
    return "nan" if value != value else format(value, spec)


def completeness_verdict(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, one short line)`` for the bar chart."""
    numbers = summary.completeness
    worst, tolerance = numbers.worst_relative_error, numbers.tolerance
    line = {
        "non-finite": f"NaN/Inf in {numbers.num_non_finite} of {numbers.num_states} states: not to be trusted",
        "unchecked": f"completeness not checked: F(x) ≈ F(b) in all {numbers.num_states} states",
        "pass": f"completeness passes: worst relative error {relative_error_text(worst)} <= {tolerance:g}",
        "fail": (
            f"completeness FAILS: worst relative error {relative_error_text(worst)} > {tolerance:g}; use n_steps='auto'"
        ),
    }[numbers.verdict]
    return numbers.verdict, line


def completeness_sentence(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, sentence)`` in plain words, for the text."""
    numbers, target = summary.completeness, summary.settings.target
    total = numbers.num_states
    if numbers.verdict == "non-finite":
        first = numbers.first_non_finite
        return "non-finite", (
            f"The model produced NaN/Inf in {numbers.num_non_finite} of {total} states (first: state "
            f"{first}): these attributions cannot be trusted."
        )
    if numbers.verdict == "unchecked":
        return "unchecked", (
            f"Completeness not checked: in all {total} states F(x) and F(b) are too close for a relative "
            f"error (mean absolute error {_number(numbers.mean_abs_error, '.3g')}, target {target})."
        )
    worst, tolerance = numbers.worst_relative_error, numbers.tolerance
    skipped = ""
    if numbers.num_degenerate:
        skipped = (
            f" {numbers.num_degenerate} state(s) had F(x) and F(b) too close to judge by a ratio; "
            "their absolute error is in the JSON report."
        )
    if numbers.verdict == "pass":
        return "pass", (
            f"Completeness passes: worst relative error {relative_error_text(worst)} <= tolerance "
            f"{tolerance:g} over {numbers.num_checked} states.{skipped}"
        )
    return "fail", (
        f"Completeness FAILS: worst relative error {relative_error_text(worst)} > tolerance {tolerance:g}: "
        "the attributions do not add up to F(x) - F(b). Use n_steps='auto' or more steps."
        f"{skipped}"
    )


def report_markdown(
    summary: RunSummary, labels: Sequence[str], prefix: str, *, saliency_scale: float | None = None
) -> str:
    """The ``<prefix>/report`` text: settings, the completeness verdict, the top-k table, drift, concentration,
    the saliency scale and an ensemble's members.

    The table is a fixed-width block: TensorBoard's markdown drops table alignment, and numbers read best
    right-aligned.
    """
    settings = summary.settings
    units = summary.units
    noun = "groups" if units.kind == "groups" else "features"
    name = "" if settings.name is None else f" ({settings.name})"
    lines = [
        f"### Integrated Gradients{name} at step {summary.step}",
        "",
        (
            f"{summary.num_states} states, {summary.n_steps} steps ({summary.method}, {summary.gradient} gradients, "
            f"{summary.backend} backend), target `{settings.target}` ({target_unit(settings.target)}), baseline "
            f"`{settings.baseline}`."
        ),
        "",
        f"**{completeness_sentence(summary)[1]}**",
    ]
    if summary.stochastic:
        lines += [
            "",
            (
                "**The forward is random**: it gave different values on the same rows (dropout or batch-norm "
                "in train mode, noise left on); the attributions are not reproducible."
            ),
        ]
    order = rank_order(units.moments.mean_abs)[: settings.top_k]
    width = max([len(noun) - 1, *(len(labels[i]) for i in order)])
    rows = [f"{'rank':>4}  {noun[:-1]:<{width}}  {'mean |attr|':>11}  {'std':>9}  {'mean attr':>10}"]
    for rank, index in enumerate(order, start=1):
        moments = units.moments
        rows.append(
            f"{rank:>4}  {labels[index]:<{width}}  {_number(moments.mean_abs[index], '11.4g')}  "
            f"{_number(moments.stddev[index], '9.3g')}  {_number(moments.mean_signed[index], '+10.3g')}"
        )
    lines += [
        "",
        f"Top {len(order)} {noun} by mean |attribution| (units of {target_unit(settings.target)}):",
        "",
        "```",
        *rows,
        "```",
    ]
    if summary.drift:
        words = [f"{DRIFT_WORDS[key].format(k=settings.top_k)} {value:.3f}" for key, value in summary.drift.items()]
        lines += ["", f"**Drift**: {', '.join(words)}."]
    shares = summary.concentration
    if shares:
        features = int(np.prod(summary.feature_shape))
        lines += [
            "",
            (
                f"**Concentration**: the top 1% of the {features} features hold "
                f"{_number(100 * shares['top1pct_share'], '.3g')}% of the mean |attribution|, the top 10% hold "
                f"{_number(100 * shares['top10pct_share'], '.3g')}%."
            ),
        ]
    if saliency_scale is not None:
        lines += [
            "",
            (
                f"**Saliency** (`{prefix}/saliency`): colour scale ±{saliency_scale:.3g} per feature; blue "
                "raises the target, red lowers it."
            ),
        ]
    return "\n".join(lines + _ensemble_lines(summary, prefix)) + "\n"


def _ensemble_lines(summary: RunSummary, prefix: str) -> list[str]:
    """What the members of an ensemble say: their agreement with the aggregate and their completeness."""
    if summary.ensemble is None:
        return []
    scalars, count = summary.ensemble.scalars, summary.ensemble.report["num_members"]
    worst = scalars["completeness/worst_relative_error"]
    verdict = (
        "passes" if worst <= summary.completeness.tolerance else "was not checked" if math.isnan(worst) else "FAILS"
    )
    return [
        "",
        (
            f"**Ensemble** ({count} members, `{prefix}/ensemble/...`): Spearman correlation of the members' feature "
            f"rankings with the aggregate's: mean {_number(scalars['spearman_mean'], '.3f')}, lowest "
            f"{_number(scalars['spearman_min'], '.3f')}; relative spread of mean |attribution| across members "
            f"{_number(scalars['relative_spread'], '.3g')}. Member completeness {verdict}: worst relative error "
            f"{relative_error_text(worst)}."
        ),
    ]
