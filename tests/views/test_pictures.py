"""The pictures' words: the verdict read from the run summary's accuracy verdict, else from completeness."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

from lightning_ig.views.pictures import run_verdict, verdict_detail
from tests.views.test_summary import _summary


class _Completeness:
    """The summary's completeness part as the trust engine's change leaves it: with an ``accuracy_verdict``."""

    def __init__(self, numbers: object, accuracy: SimpleNamespace) -> None:
        self._numbers, self.accuracy_verdict = numbers, accuracy

    def __getattr__(self, name: str) -> object:
        return getattr(self._numbers, name)


def _with_accuracy(summary, **accuracy):
    return dataclasses.replace(summary, completeness=_Completeness(summary.completeness, SimpleNamespace(**accuracy)))


def test_the_verdict_falls_back_to_the_completeness_figures():
    summary = _summary()
    assert run_verdict(summary) == (summary.completeness.verdict, verdict_detail(summary))


def test_the_verdict_is_the_accuracy_verdict_when_the_summary_has_one():
    summary = _summary()
    failed = _with_accuracy(summary, within=False, figure="worst_attribution_error", value=0.03, threshold=0.0141)
    verdict, line = run_verdict(failed)
    assert verdict == "fail" and line.startswith("worst attribution error 3") and line.endswith("> 0.0141")
    passed = _with_accuracy(summary, within=True, figure="worst_mass_relative_error", value=1e-4, threshold=0.0141)
    assert run_verdict(passed)[0] == "pass" and "≤" in run_verdict(passed)[1]
    unchecked = _with_accuracy(summary, within=None, figure="", value=math.nan, threshold=0.0141, reason="no state")
    assert run_verdict(unchecked) == ("unchecked", "no state")


def test_nan_inf_overrides_an_accuracy_verdict():
    summary = _summary(worst=math.inf, non_finite=2)
    flagged = _with_accuracy(summary, within=True, figure="worst_attribution_error", value=0.0, threshold=0.0141)
    assert run_verdict(flagged)[0] == "non-finite"
