"""How a run reads: numbers written for people, the verdict in words, and the ``<prefix>/report`` text.

**Numbers** read the same in a chart, under a saliency frame and in the text (:func:`format_value`,
:func:`format_signed`, :func:`format_percent`: their docstrings say how). The accuracy figures are fractions, as the
JSON report and ``completeness_tol`` have them (:func:`lightning_ig.vocabulary.relative_error_text`).

**Words**: the accuracy verdict (:func:`accuracy_line` on the cards, :func:`completeness_sentence` in the text), the
trust status (:func:`trust_line`), what is wrong with a run (:func:`troubles`, the callback's warnings) and the
``<prefix>/report`` markdown TensorBoard shows (:func:`report_markdown`), read from a
:class:`~lightning_ig.run.summary.RunSummary`. Every one of them states the same two figures and the same verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_ig.run.statistics import AccuracyVerdict, Completeness, rank_order
from lightning_ig.run.summary import RunSummary
from lightning_ig.views.tags import PICTURE_TAGS
from lightning_ig.vocabulary import non_finite_words, relative_error_text

__all__ = [
    "DRIFT_WORDS",
    "HEADLINES",
    "accuracy_line",
    "completeness_sentence",
    "format_percent",
    "format_signed",
    "format_value",
    "report_markdown",
    "troubles",
    "trust_line",
    "verdict_words",
]

# --------------------------------------------------------------------------- numbers

_PLAIN_LOW = 1e-3  # below this, plain decimals need leading zeros: 0.000123 reads worse than 1.23e-04
_PLAIN_HIGH = 1e5
_SMALLEST_PERCENT = 0.01  # the smallest percentage written out; anything above zero and below it is "<0.01%"


def format_value(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits: ``1.09``, ``0.0123``, ``12300``, ``3.8e-05``.

    Args:
        value: any float; ``nan`` and ``inf`` are written as such.
        digits: significant digits (default 3).

    Returns:
        Plain decimals for ``1e-3 <= |value| < 1e5`` (trailing zeros dropped), else scientific notation with
        two exponent digits; ``"0"`` for zero.

    Example::

        >>> [format_value(v) for v in (1.0904, 0.012345, -0.5, 123456.0, 3.8e-05, 0.0)]
        ['1.09', '0.0123', '-0.5', '1.23e+05', '3.8e-05', '0']
    """
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    # the significant digits as plain decimals, unless they round up past the plain range (99999.7)
    if _PLAIN_LOW <= abs(value) < _PLAIN_HIGH and abs(rounded := float(f"{value:.{digits}g}")) < _PLAIN_HIGH:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
        text = f"{rounded:.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.') if '.' in mantissa else mantissa}e{exponent}"


def format_signed(value: float, digits: int = 3) -> str:
    """:func:`format_value` with the sign always written: ``+0.85``, ``-1.2``, ``0``.

    Example::

        >>> format_signed(0.853), format_signed(-1.2), format_signed(0.0)
        ('+0.853', '-1.2', '0')
    """
    text = format_value(value, digits)
    return f"+{text}" if math.isfinite(value) and value > 0 else text


def format_percent(fraction: float, digits: int = 3) -> str:
    """A share written as a percentage: ``31.4%``, ``0.25%``, ``<0.01%``, ``0%``, ``100%``.

    Args:
        fraction: the share, ``0.314`` for 31.4%.
        digits: significant digits (default 3), but never more decimals than two.

    Returns:
        The percentage; above zero but below 0.01% it is ``"<0.01%"`` (a tiny error is never ``0.00%``).

    Example::

        >>> [format_percent(v) for v in (0.31416, 0.0025, 3e-07, 0.0, 1.0)]
        ['31.4%', '0.25%', '<0.01%', '0%', '100%']
    """
    percent = 100.0 * fraction  # 1e308 is inf% (a share read from a file): no log10 of inf below
    if not math.isfinite(percent):
        return f"{percent}%"
    if percent == 0:
        return "0%"
    if 0 < abs(percent) < _SMALLEST_PERCENT:
        return "<0.01%" if percent > 0 else ">-0.01%"
    decimals = min(2, max(0, digits - 1 - math.floor(math.log10(abs(percent)))))
    text = f"{percent:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"


# --------------------------------------------------------------------------- words

DRIFT_WORDS = {
    "spearman_prev": "Spearman rank correlation with the previous run",
    "spearman_first": "with the first run",
    "topk_jaccard_prev": "top-{k} overlap (Jaccard) with the previous run",
}


def _per_state_pointer(summary: RunSummary) -> str:
    """Where a run's per-state numbers are: the JSON reports' folder with ``report_dir``, else how to get them."""
    if (folder := summary.settings.report_dir) is not None:
        return f"the per-state numbers are in the JSON reports in {folder}"
    return "pass report_dir= to the callback for a JSON report of every run with the per-state numbers"


def accuracy_line(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, short line)`` for the cards: ``"pass"``, ``"fail"``, ``"unchecked"`` or ``"non-finite"``, and
    the figure that decided against its bar (``estimated attribution error 1.21e-02 ≤ 0.0141``), or the count of
    NaN/Inf states, or why nothing could be checked."""
    numbers = summary.completeness
    if numbers.verdict == "non-finite":
        return "non-finite", f"NaN/Inf in {numbers.num_non_finite} of {numbers.num_states} {_rows(summary)}"
    accuracy = numbers.accuracy
    if accuracy.within is None:
        return "unchecked", accuracy.reason or f"no state away from the baseline in {numbers.num_states}"
    sign = "≤" if accuracy.within else ">"
    value, bar = relative_error_text(accuracy.value), format_value(accuracy.threshold)
    return ("pass" if accuracy.within else "fail"), f"{accuracy.words} {value} {sign} {bar}"


HEADLINES = {
    "pass": "✓ attributions add up",
    "fail": "✗ attributions do NOT add up",
    "non-finite": "✗ NaN/Inf: do not trust these",
    "unchecked": "? accuracy not checked",
}
"""The accuracy verdict as the verdict card's headline and the examples' closing line say it."""


def verdict_words(entry: Mapping[str, Any]) -> str:
    """A run's verdict in one line, in the verdict card's words, from the callback's history entry of the run.

    Args:
        entry: a run of the callback's ``history`` (:meth:`~lightning_ig.run.summary.RunSummary.history_entry`).

    Returns:
        The headline, the figure that decided against its bar, the trust status (and its first failed check other
        than accuracy) and the step.

    Example:
        >>> entry = {"global_step": 500, "verdict": "pass", "trust": "passed",
        ...          "accuracy": {"figure": "attribution_error", "value": 0.004, "threshold": 0.0141}}
        >>> verdict_words(entry)
        '✓ attributions add up (estimated attribution error 4.00e-03 ≤ 0.0141), trust checks passed, at step 500'
    """
    kind, figures = str(entry.get("verdict")), entry.get("accuracy")
    words = HEADLINES.get(kind, HEADLINES["unchecked"])
    if kind in ("pass", "fail") and figures is not None:
        accuracy = AccuracyVerdict(kind == "pass", figures["figure"], figures["value"], figures["threshold"], "")
        sign = "≤" if accuracy.within else ">"
        value, bar = relative_error_text(accuracy.value), format_value(accuracy.threshold)
        words += f" ({accuracy.words} {value} {sign} {bar})"
    trust, reasons = entry.get("trust"), [str(reason) for reason in entry.get("trust_reasons", ())]
    failed = [reason for reason in reasons if not reason.startswith("accuracy:")]  # accuracy: the headline's
    why = f" ({_short(failed[0])})" if trust == "failed" and failed else ""
    return f"{words}{'' if trust is None else f', trust checks {trust}{why}'}, at step {int(entry['global_step']):,}"


def _short(sentence: str) -> str:
    """A trust reason or note cut at its first ``,`` or ``;`` after the check's name, never inside parentheses (the
    text has all of it)."""
    head, colon, rest = sentence.partition(": ")
    if not colon:
        head, rest = "", sentence
    cut = min((rest.find(mark) for mark in (", ", "; ") if mark in rest), default=len(rest))
    short = rest[:cut] if rest[:cut].count("(") <= rest[:cut].count(")") else rest[:cut].rsplit("(", 1)[0].rstrip()
    return f"{head}{colon}{short}"


def trust_line(trust: Any) -> str:
    """Why the trust status is what it is, short: the first failed check other than accuracy (an accuracy failure is
    the card's headline already), the first note when unresolved, the checks judged when passed."""
    if trust.status == "failed":
        others = [reason for reason in trust.reasons if not reason.startswith("accuracy:")]
        return _figures_of(trust, others[0]) if others else "accuracy, above"
    if trust.status == "unresolved":
        return _short(trust.notes[0]) if trust.notes else "nothing judged yet"
    passed, undecided = ["accuracy"], list[str]()  # the passed first: a card cuts the line at its width
    for name, word in {"randomization": "sanity", "deletion": "faithfulness", "stability": "stability"}.items():
        if (check := getattr(trust, name, None)) is not None and check.passed:  # not applicable: passed is None
            (passed if getattr(check, "note", None) is None else undecided).append(word)  # a note: judged nothing
    return ", ".join(passed) + (f"; {', '.join(undecided)} unresolved" if undecided else "")  # fits the card with 3


def _figures_of(trust: Any, reason: str) -> str:
    """A failed check as its figure against its bar, short enough for the card's line (the text has the sentence)."""
    sanity, deletion, stability = trust.randomization, trust.deletion, trust.stability
    if sanity is not None and reason == sanity.reason and math.isfinite(sanity.randomization_rank_correlation):
        return f"sanity {sanity.randomization_rank_correlation:.2f} ≥ {sanity.threshold:.2f}"
    if deletion is not None and reason == deletion.reason and math.isfinite(deletion.gap * deletion.needed):
        return f"faithfulness gap {deletion.gap:.2f} < {deletion.needed:.2f}"
    if stability is not None and reason == stability.reason and math.isfinite(stability.noise_rank_correlation):
        return f"stability {stability.noise_rank_correlation:.2f} < {stability.floor:.2f}"
    return _short(reason)


def _rows(summary: RunSummary) -> str:
    """What a run's rows are: states (of a budget window), or (state, action) pairs for ``target="each"``."""
    windowed = summary.budget.get("state_indices") is not None
    return "(state, action) pairs" if summary.actions else "states of the run's budget window" if windowed else "states"


def _first_non_finite(summary: RunSummary) -> str:
    """The first NaN/Inf row as the user finds it: its held-out state (a budget window's row mapped back), action."""
    first, actions, held = summary.completeness.first_non_finite, summary.actions, summary.budget.get("state_indices")
    if first is None or actions is None:
        return f"state {first if first is None or held is None else held[first]}"
    return f"state {first // len(actions.names)}, {actions.names[first % len(actions.names)]}"


def _figures_text(numbers: Completeness) -> str:
    """The two figures the verdict rests on, as every line writes them (fractions, as ``completeness_tol``)."""
    return (
        f"worst estimated attribution error {relative_error_text(numbers.worst_attribution_error)}, worst "
        f"mass-relative completeness error {relative_error_text(numbers.worst_mass_relative_error)}"
    )


def completeness_sentence(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, sentence)`` in plain words, for the text: the accuracy verdict, the two figures it rests on and
    the states near the baseline (flagged, not scored)."""
    numbers, target = summary.completeness, summary.settings.target.label
    total, rows = numbers.num_states, _rows(summary)
    if numbers.verdict == "non-finite":
        what, why = non_finite_words(numbers.gradient_only)
        return "non-finite", (
            f"✗ {what[0].upper()}{what[1:]} in {numbers.num_non_finite} of {total} {rows} (first: "
            f"{_first_non_finite(summary)}){why}: these attributions cannot be trusted."
        )
    if numbers.verdict == "unchecked":
        return "unchecked", (
            f"? Accuracy not checked: in all {total} {rows} the attributions are zero, F(x) = F(b) along the whole "
            f"path (target {target})."
        )
    notes = ""
    if numbers.num_near_baseline:
        near = "state(s)" if summary.actions is None else rows
        notes = (
            f" {numbers.num_near_baseline} of {total} {near} are near the baseline (attribution mass and |dF| below a "
            f"tenth of the median, where every relative figure is ill-conditioned): flagged, not scored "
            f"({_per_state_pointer(summary)})."
        )
    if numbers.verdict == "pass":
        return "pass", (
            f"✓ The attributions add up: {_figures_text(numbers)}, both <= sqrt(2) x completeness_tol "
            f"{numbers.tolerance:g} over {total - numbers.num_near_baseline - numbers.num_non_finite} {rows}.{notes}"
        )
    return "fail", (
        f"✗ The attributions do NOT add up: {numbers.accuracy.reason} (completeness_tol {numbers.tolerance:g}): they "
        f"may be off by more than the tolerance ({_figures_text(numbers)}). {_fix(summary)}.{notes}"
    )


def _fix(summary: RunSummary) -> str:
    """What to do about a failed verdict: more points, unless the forward is stochastic or a half-precision forward's
    rounding is about the tolerance (its errors stay near 10-40 eps at any number of points: float16 at 0.01 too)."""
    if summary.stochastic:
        return "The forward is random (said on its own), so completeness cannot hold at any number of points"
    if summary.settings.rounding * 32 < summary.completeness.tolerance:
        return (
            "More points help: n_steps='auto' (the default on a CPU) refines each state until its error estimate is "
            "within tolerance, up to max_steps (512 by default; where auto already ran, raise it: "
            "engine=IGOptions(n_steps='auto', max_steps=1512)), or a larger n_steps"
        )
    return (
        f"The model computes in half precision: its rounding (eps {summary.settings.rounding:.1e}) alone is about the "
        "tolerance, and more points do not lower it; attribute a float32 model (Lightning's 16-mixed and bf16-mixed "
        "keep float32 weights) or raise completeness_tol above the estimate"
    )


def report_markdown(
    summary: RunSummary, labels: Sequence[str], prefix: str, *, saliency_scale: float | None = None
) -> str:
    """The ``<prefix>/report`` text: the accuracy verdict and the trust status first, the settings, the table of what
    the target relies on (as the verdict card ranks it, by mass, with both signs), drift, concentration, the
    saliency scale and per action.

    The table is a fixed-width block: TensorBoard's markdown drops table alignment, and numbers read best right-aligned.
    """
    settings, units = summary.settings, summary.units
    noun = "groups" if units.kind == "groups" else "features"
    name = "" if settings.name is None else f" ({settings.name})"
    states, averaged = f"{summary.num_states} states", ""
    if summary.actions is not None:
        states = f"{summary.actions.num_states} states × {len(summary.actions.names)} actions"
        averaged = ", the mean over the actions"
    lines = [f"### Integrated Gradients{name} at step {summary.step}", "", f"**{completeness_sentence(summary)[1]}**"]

    def paragraph(text: str) -> None:
        lines.extend(("", text))

    trust = summary.trust_checks.lines() if summary.trust_checks is not None else ()
    failures = {f"- {reason}" for reason in summary.trust_checks.reasons} if summary.trust_checks is not None else set()
    lines += ["", trust[0], "", *(line for line in trust if line in failures)] if trust else []  # the answer first
    paragraph(
        f"{states}, {summary.n_steps} steps ({summary.method}, {summary.gradient} gradients, "
        f"{summary.backend} backend), target `{settings.target.label}` ({settings.target.unit}), baseline "
        f"`{settings.baseline}`."
    )
    if summary.stochastic:
        paragraph(
            "**The forward is random**: it gave different values on the same rows (dropout or batch-norm "
            "in train mode, noise left on); the attributions are not reproducible."
        )
    positive, negative = units.parts
    mass = positive + negative
    whole = float(mass.sum()) or 1.0
    order = rank_order(mass)[: settings.top_k]
    width = max([len(noun) - 1, *(len(labels[i]) for i in order)])
    heads = ("share", "raises", "lowers", "mean |attr|", "mean attr")
    rows = [f"{'rank':>4}  {noun[:-1]:<{width}}  " + "  ".join(f"{head:>11}" for head in heads)]
    for rank, index in enumerate(order, start=1):
        cells = (
            format_percent(mass[index] / whole),
            format_value(positive[index]),
            format_value(negative[index]),
            format_value(units.moments.mean_abs[index]),
            format_signed(units.moments.mean_signed[index]),
        )
        rows.append(f"{rank:>4}  {labels[index]:<{width}}  " + "  ".join(f"{cell:>11}" for cell in cells))
    per_cell = " (each cell's sign counted apart; mean |attr| and mean attr of the group's sum)" * (noun == "groups")
    paragraph(
        f"What {settings.target.words} relies on: the top {len(order)} {noun} by mass, the part that raises it "
        f"and the part that lowers it, vs {settings.baseline} (units of {settings.target.unit}{averaged}"
        f"){per_cell}:"
    )
    lines += ["", "```", *rows, "```"]
    details = [line for line in trust[1:] if line not in failures]  # the figures of every check, below the fold
    lines += ["", "**The trust checks' figures**:", "", *details] if details else []  # a blank line: a Markdown list
    if drift := summary.moving_drift:
        words = [f"{DRIFT_WORDS[key].format(k=settings.top_k)} {value:.3f}" for key, value in drift.items()]
        paragraph(f"**Drift**: {', '.join(words)}.")
    if shares := summary.concentration:
        paragraph(
            f"**Concentration**: the top 1% of the {int(np.prod(summary.feature_shape))} features hold "
            f"{format_percent(shares['top1pct_share'])} of the mean |attribution|, the top 10% hold "
            f"{format_percent(shares['top10pct_share'])}."
        )
    if saliency_scale is not None:
        paragraph(
            f"**Saliency** (`{prefix}/{PICTURE_TAGS['saliency']}`): colour scale ±{format_value(saliency_scale)} "
            "per cell; blue raises the target, red lowers it."
        )
    lines += _action_lines(summary, labels, prefix)
    return "\n".join(lines) + "\n"


def _action_lines(summary: RunSummary, labels: Sequence[str], prefix: str, top: int = 2) -> list[str]:
    """``target="each"``: per action, in how many states it is greedy, what its Q relies on most and what sets it
    apart from the mean action (the attributions of ``Q(s, a) - mean Q``, signed: + favours the action)."""
    if (actions := summary.actions) is None:
        return []
    relies, apart = [], []
    for own, advantage in zip(actions.moments, actions.advantage_moments):
        relies.append(", ".join(f"{labels[i]} {format_value(own.mean_abs[i])}" for i in rank_order(own.mean_abs)[:top]))
        leading = rank_order(advantage.mean_abs)[:top]
        apart.append(", ".join(f"{labels[i]} {format_signed(advantage.mean_signed[i])}" for i in leading))
    greedy = [f"{count}/{actions.num_states}" for count in actions.greedy_counts.tolist()]
    heads = ("action", "greedy", "Q(s, a) relies most on (mean |attr|)", "sets it apart (mean attr of Q - mean Q)")
    columns = [actions.names, greedy, relies, apart]
    widths = [max(len(head), *(len(cell) for cell in cells)) for head, cells in zip(heads, columns)]
    table = [heads, *zip(*columns)]
    rows = ["  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths)).rstrip() for row in table]
    intro = (
        f"**Per action** (`{prefix}/action/<action>/...`, the picture `{prefix}/{PICTURE_TAGS['actions']}`): "
        f"in how many of the {actions.num_states} states each action has the largest Q, what its Q(s, a) relies "
        "on most, and what sets it apart from the mean action (+ favours it, - disfavours it):"
    )
    return ["", intro, "", "```", *rows, "```"]


def troubles(summary: RunSummary) -> dict[str, str]:
    """What is wrong with a run, in words: the callback's warnings, one per kind of :meth:`RunSummary.troubles`.

    Returns:
        ``{kind: message}`` for the kinds that apply: ``"non-finite"``, ``"unchecked"``, ``"fail"``, ``"stochastic"``.
    """
    numbers, step = summary.completeness, summary.step
    words = {
        "unchecked": lambda: (
            f"no state could be checked for accuracy at step {step}: in all {numbers.num_states} states the "
            "attributions are (near) zero, F(x) = F(b) along the whole path; try baseline='mean' "
            "or another target"
        ),
        "fail": lambda: (
            f"the accuracy check (estimated attribution error, mass-relative completeness error) fails at step "
            f"{step} with completeness_tol={numbers.tolerance:g}: {numbers.accuracy.reason}. {_fix(summary)}"
        ),
        "stochastic": lambda: (
            f"the forward gave different values on the same rows at step {step} (dropout or batch-norm in train "
            "mode, batch-norm without running statistics, noise drawn inside forward?): the attributions are not "
            "reproducible"
        ),
        "non-finite": lambda: (
            f"{non_finite_words(numbers.gradient_only)[0]} at step {step} in {numbers.num_non_finite} of "
            f"{numbers.num_states} {'held-out ' * (summary.actions is None)}{_rows(summary)} (first: "
            f"{_first_non_finite(summary)}){non_finite_words(numbers.gradient_only)[1]}; the accuracy figures are "
            "logged as inf"
        ),
    }
    return {kind: words[kind]() for kind in summary.troubles()}
