"""The pictures' words: the verdict read from the run summary's accuracy verdict, else from completeness."""

from __future__ import annotations

import dataclasses
import math

from lightning_ig.views.pictures import run_verdict
from lightning_ig.views.text import format_value
from tests.views.test_summary import _summary


def _with_figures(summary, attribution_error: float, mass_relative_error: float, tolerance: float = 0.01):
    """The summary with the two figures the accuracy verdict rests on (a real ``Completeness``)."""
    numbers = dataclasses.replace(
        summary.completeness,
        worst_attribution_error=attribution_error,
        worst_mass_relative_error=mass_relative_error,
        tolerance=tolerance,
    )
    return dataclasses.replace(summary, completeness=numbers)


def test_the_card_names_the_figure_that_decided_and_its_threshold():
    summary = _summary()
    failed = _with_figures(summary, attribution_error=0.03, mass_relative_error=0.001)
    verdict, line = run_verdict(failed)
    assert verdict == "fail" and line.startswith("estimated attribution error 3") and ">" in line
    assert line.endswith(format_value(math.sqrt(2) * 0.01))
    passed = _with_figures(summary, attribution_error=1e-4, mass_relative_error=0.012)  # 0.012 <= 1.41 x 0.01
    verdict, line = run_verdict(passed)
    assert verdict == "pass" and "≤" in line and "mass" in line  # the larger figure is the one named
    unchecked = _with_figures(summary, attribution_error=math.nan, mass_relative_error=math.nan)
    verdict, line = run_verdict(unchecked)
    assert verdict == "unchecked" and line == unchecked.completeness.accuracy.reason


def test_nan_inf_overrides_an_accuracy_verdict():
    summary = _summary(worst=math.inf, non_finite=2)
    flagged = _with_figures(summary, attribution_error=0.0, mass_relative_error=0.0)
    assert run_verdict(flagged)[0] == "non-finite"
