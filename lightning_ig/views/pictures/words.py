"""The words on the pictures: what is attributed, against which baseline, the run's verdict and the trust line.

The verdict card, the bar chart and the other pictures (:mod:`~lightning_ig.views.pictures.draw`) say these the same
way.
"""

from __future__ import annotations

from typing import Any

from lightning_ig.run.summary import RunSummary
from lightning_ig.views.pictures.bars import VERDICT_COLOURS
from lightning_ig.views.text import format_value
from lightning_ig.vocabulary import relative_error_text

__all__ = [
    "TRUST_COLOURS",
    "baseline_words",
    "run_verdict",
    "trust_detail",
    "trust_reason_words",
    "verdict_detail",
]


def baseline_words(baseline: str, spatial: bool) -> str:
    """The baseline in words: ``the all-zero frame``, ``the mean state``, ``the baseline``."""
    thing = "frame" if spatial else "state"
    return {"zeros": f"the all-zero {thing}", "mean": f"the mean {thing}"}.get(baseline, "the baseline")


def run_verdict(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, short line)`` of the verdict card and the bar chart.

    The run's accuracy verdict (``summary.completeness.accuracy``: the estimated attribution error and the
    mass-relative completeness error against ``sqrt(2) x completeness_tol``, naming the figure that decided);
    for NaN/Inf, the count of such states (:func:`verdict_detail`). ``verdict`` is ``"pass"``, ``"fail"``,
    ``"unchecked"`` or ``"non-finite"``.
    """
    numbers = summary.completeness
    if numbers.verdict == "non-finite":
        return numbers.verdict, verdict_detail(summary)
    accuracy = numbers.accuracy
    if accuracy.within is None:
        return "unchecked", accuracy.reason or verdict_detail(summary)
    figure = accuracy.words
    sign = "≤" if accuracy.within else ">"
    return ("pass" if accuracy.within else "fail"), (
        f"{figure} {relative_error_text(accuracy.value)} {sign} {format_value(accuracy.threshold)}"
    )


def verdict_detail(summary: RunSummary) -> str:
    """The short line under the verdict where no accuracy figure gives one: NaN/Inf, or nothing to score."""
    numbers = summary.completeness
    if numbers.verdict == "non-finite":
        return f"NaN/Inf in {numbers.num_non_finite} of {numbers.num_states} states"
    return f"no state away from the baseline in {numbers.num_states} states"


TRUST_COLOURS = {
    "passed": VERDICT_COLOURS["pass"],
    "failed": VERDICT_COLOURS["fail"],
    "unresolved": VERDICT_COLOURS["unchecked"],
}
"""The colour of the verdict card's trust line: green passed, red failed, brown unresolved (the verdicts' colours)."""


def trust_reason_words(sentence: str) -> str:
    """A trust check's reason or note, short enough for a line of the card: up to its first ``,`` or ``;`` after the
    check's name (``sanity unresolved: with 4 units``, ``sanity: not run yet``); the report has the whole sentence."""
    head, colon, rest = sentence.partition(": ")
    if not colon:
        head, rest = "", sentence
    cut = min((rest.find(mark) for mark in (", ", "; ") if mark in rest), default=len(rest))
    return f"{head}{colon}{rest[:cut]}"


def trust_detail(trust: Any) -> list[str] | None:
    """The line under the trust status: why it failed or is unresolved, short (the report has the whole sentence).

    An accuracy failure is the card's own headline already: another failed check is named first; accuracy alone
    points up to it.
    """
    if trust.status == "failed":
        others = [reason for reason in trust.reasons if not reason.startswith("accuracy:")]
        if not others:
            return ["accuracy: the verdict above"]
        why = others[0]
    elif trust.status == "unresolved" and trust.notes:
        why = trust.notes[0]
    else:
        return None
    short = trust_reason_words(why)
    return [f"{short} (Text tab: ig/report)", short]
