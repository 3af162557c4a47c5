"""The pictures' words: the verdict read from the run summary's accuracy verdict, else from completeness."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import AccuracyVerdict
from lightning_ig.trust.verdict import trust_summary
from lightning_ig.views.pictures.bars import VERDICT_COLOURS
from lightning_ig.views.pictures.draw import PictureInputs, draw, verdict_picture
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, rgb
from lightning_ig.views.pictures.verdict_card import verdict_chart
from lightning_ig.views.pictures.words import run_verdict, trust_reason_words
from lightning_ig.views.text import format_value
from tests.support.summaries import make_summary as _summary


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


def _has(pixels: np.ndarray, colour: str) -> bool:
    """Whether some pixel is exactly ``colour`` (the core of a glyph written in it)."""
    return bool(np.all(pixels == rgb(colour), axis=2).any())


PASSED = AccuracyVerdict(True, "estimated", 0.004, 0.0141, "the worst estimated attribution error 4.00e-03 <= 0.0141")
FAILED = AccuracyVerdict(False, "estimated", 0.03, 0.0141, "the worst estimated attribution error 3.00e-02 > 0.0141")
NOT_RUN = "sanity: not run yet; it costs 2.7 IG runs with its re-initialised copies (once) and runs at run 29"


def test_trust_reason_words_keep_the_check_and_its_first_clause():
    assert trust_reason_words(NOT_RUN) == "sanity: not run yet"
    note = "sanity unresolved: with 4 units, on which random networks disagree (spread 0.10); it cannot tell"
    assert trust_reason_words(note) == "sanity unresolved: with 4 units"
    assert trust_reason_words("stability: undefined (nan)") == "stability: undefined (nan)"
    assert trust_reason_words("no colon, but a comma") == "no colon"


def test_the_verdict_card_says_why_the_trust_checks_are_unresolved_in_the_status_colour():
    summary = _summary()
    plain = verdict_picture(summary, ["a", "b", "c"], PictureInputs())
    unresolved = dataclasses.replace(summary, trust_checks=trust_summary(accuracy=PASSED, pending=[NOT_RUN]))
    pixels = verdict_picture(unresolved, ["a", "b", "c"], PictureInputs())
    assert _has(pixels, VERDICT_COLOURS["unchecked"]) and not _has(plain, VERDICT_COLOURS["unchecked"])
    assert pixels.shape[0] == plain.shape[0] + 15  # one more line: why (the drift line's place holds the status)
    passed = dataclasses.replace(summary, trust_checks=trust_summary(accuracy=PASSED))
    green = verdict_picture(passed, ["a", "b", "c"], PictureInputs())
    assert green.shape == plain.shape  # passed: the status line alone
    assert (
        np.all(green == rgb(VERDICT_COLOURS["pass"]), axis=2).sum()
        > np.all(plain == rgb(VERDICT_COLOURS["pass"]), axis=2).sum()
    )  # the status line is green too


def test_an_accuracy_failure_alone_points_up_to_the_verdict_and_another_failure_is_named():
    summary = _summary()
    failed = dataclasses.replace(summary, trust_checks=trust_summary(accuracy=FAILED))
    pixels = verdict_picture(failed, ["a", "b", "c"], PictureInputs())
    plain = verdict_picture(summary, ["a", "b", "c"], PictureInputs())
    assert pixels.shape[0] == plain.shape[0] + 15
    other = dataclasses.replace(
        summary, trust_checks=trust_summary(accuracy=FAILED, errors=["deletion: could not run, out of memory"])
    )
    assert not np.array_equal(verdict_picture(other, ["a", "b", "c"], PictureInputs()), pixels)


def test_the_why_line_is_left_out_where_the_card_would_outgrow_time_series_box():
    moments = Moments.of(np.random.default_rng(0).normal(size=(8, 9)))
    labels = [f"unit {i}" for i in range(9)]
    common = {"verdict": ("pass", "x"), "title": "t", "top_k": 5, "footer": "? trust checks unresolved"}
    with_why = verdict_chart(labels, moments, footer_detail="sanity: not run yet", **common).pixels
    without = verdict_chart(labels, moments, **common).pixels
    assert with_why.shape == without.shape and without.shape[0] + 15 > CARD_HEIGHT  # five rows and "the other 4"
    few = verdict_chart(labels[:3], Moments.of(np.ones((2, 3))), footer_detail="why", **common).pixels
    assert few.shape[0] == verdict_chart(labels[:3], Moments.of(np.ones((2, 3))), **common).pixels.shape[0] + 15


def test_every_picture_drawn_is_as_high_as_time_series_box_so_it_is_shown_at_1x():
    summary = _summary()
    history = [{"global_step": 100 * k, "mean_abs": [1.0 + k, 2.0, 3.0]} for k in range(3)]
    due = {"verdict": True, "top_features": True, "heatmap": True, "shares": True}
    pictures, _ = draw(due, summary, ["a", "b", "c"], None, history, PictureInputs())
    assert set(pictures) == set(due)
    for kind, pixels in pictures.items():
        assert pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3), kind
        assert (pixels[-3:] == 255).all(), kind  # padded below: none of them is as tall as the box by itself
