"""The pictures a run draws from its summary: the verdict card's words and colours, every card at Time Series' size."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lightning_ig.run.statistics import AccuracyVerdict
from lightning_ig.trust.verdict import trust_summary
from lightning_ig.views.pictures.cards import STATE_COLOURS
from lightning_ig.views.pictures.draw import PictureInputs, draw, shares_picture, verdict_picture
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, NEGATIVE, POSITIVE, rgb
from lightning_ig.views.text import accuracy_line, format_value, trust_line
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
    verdict, line = accuracy_line(failed)
    assert verdict == "fail" and line.startswith("estimated attribution error 3") and ">" in line
    assert line.endswith(format_value(math.sqrt(2) * 0.01))
    passed = _with_figures(summary, attribution_error=1e-4, mass_relative_error=0.012)  # 0.012 <= 1.41 x 0.01
    verdict, line = accuracy_line(passed)
    assert verdict == "pass" and "≤" in line and "mass" in line  # the larger figure is the one named
    unchecked = _with_figures(summary, attribution_error=math.nan, mass_relative_error=math.nan)
    verdict, line = accuracy_line(unchecked)
    assert verdict == "unchecked" and line == unchecked.completeness.accuracy.reason


def test_nan_inf_overrides_an_accuracy_verdict():
    flagged = _with_figures(_summary(worst=math.inf, non_finite=2), attribution_error=0.0, mass_relative_error=0.0)
    assert accuracy_line(flagged)[0] == "non-finite"


PASSED = AccuracyVerdict(True, "estimated", 0.004, 0.0141, "the worst estimated attribution error 4.00e-03 <= 0.0141")
FAILED = AccuracyVerdict(False, "estimated", 0.03, 0.0141, "the worst estimated attribution error 3.00e-02 > 0.0141")
NOT_RUN = "sanity: not run yet; it costs 2.7 IG runs with its re-initialised copies (once)"


def _head(pixels: np.ndarray) -> np.ndarray:
    """The rows above the first bar: the verdict, the trust status, the earlier runs (the bars' red is their sign)."""
    bar = np.all(pixels == rgb(POSITIVE), axis=2) | np.all(pixels == rgb(NEGATIVE), axis=2)
    longest = [max((len(run) for run in "".join("1" if b else " " for b in row).split()), default=0) for row in bar]
    return pixels[: next(y for y, length in enumerate(longest) if length >= 12)]  # a bar, never a glyph


def _has(pixels: np.ndarray, state: str) -> bool:
    return bool(np.all(pixels == rgb(STATE_COLOURS[state]), axis=2).any())


def test_the_trust_line_keeps_the_check_and_its_first_clause():
    unresolved = trust_summary(accuracy=PASSED, pending=[NOT_RUN])
    assert unresolved.status == "unresolved" and trust_line(unresolved) == "sanity: not run yet"
    failed = trust_summary(accuracy=FAILED, errors=["deletion: could not run, out of memory"])
    assert trust_line(failed) == "deletion: could not run"
    assert trust_line(trust_summary(accuracy=FAILED)) == "accuracy, above"


def test_the_verdict_card_shows_the_trust_status_in_its_colour():
    summary = _summary()
    labels = ["a", "b", "c"]
    plain = _head(verdict_picture(summary, labels, [], PictureInputs()))
    assert _has(plain, "pass") and not _has(plain, "unresolved")
    unresolved = dataclasses.replace(summary, trust_checks=trust_summary(accuracy=PASSED, pending=[NOT_RUN]))
    assert _has(_head(verdict_picture(unresolved, labels, [], PictureInputs())), "unresolved")
    failed = dataclasses.replace(summary, trust_checks=trust_summary(accuracy=FAILED))
    assert _has(_head(verdict_picture(failed, labels, [], PictureInputs())), "fail")


def test_a_failing_run_is_never_drawn_as_a_pass():
    failing = _with_figures(_summary(), attribution_error=0.5, mass_relative_error=0.001)
    pixels = _head(verdict_picture(failing, ["a", "b", "c"], [], PictureInputs()))
    assert _has(pixels, "fail") and not _has(pixels, "pass")


def test_an_earlier_failure_is_counted_on_the_verdict_card():
    summary = _summary()
    history = [
        {"global_step": 100, "verdict": "fail", "trust": None},
        {"global_step": 200, "verdict": "pass", "trust": None},
        {"global_step": summary.step, "verdict": "pass", "trust": None},  # this run: not an earlier one
    ]
    assert _has(_head(verdict_picture(summary, ["a", "b", "c"], history, PictureInputs())), "fail")
    assert not _has(_head(verdict_picture(summary, ["a", "b", "c"], history[1:], PictureInputs())), "fail")


def test_every_picture_drawn_is_as_high_as_time_series_box_so_it_is_shown_at_1x():
    summary = _summary()
    history = [{"global_step": 100 * k, "mass": [1.0 + k, 2.0, 3.0], "verdict": "pass"} for k in range(3)]
    due = {"verdict": True, "shares": True}
    pictures, scale = draw(due, summary, ["a", "b", "c"], None, history, PictureInputs())
    assert set(pictures) == set(due) and scale is None
    for kind, pixels in pictures.items():
        assert pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3), kind


def test_the_shares_over_training_read_one_run_a_pixel_column_not_the_whole_history():
    # guards against: the whole history made into an array at every chart (every 10 runs by default), so that the
    # logging worker's time per chart grew with the fit's runs (64 units: 0.27 s at 100,000 runs) and the budget
    # deferred runs to pay for it
    read: set[int] = set()

    class Row:  # a run's mass per unit that notes when its numbers are read
        def __init__(self, run: int) -> None:
            self.run = run

        def __len__(self) -> int:
            return 3

        def __getitem__(self, unit: int) -> float:
            read.add(self.run)
            return [1.0 + self.run % 7, 2.0, 3.0][unit]

    runs = 20_000
    history = [{"global_step": 10 * k, "mass": Row(k), "verdict": "pass", "trust": None} for k in range(runs)]
    pixels = shares_picture(_summary(), ["a", "b", "c"], history, PictureInputs())
    assert pixels.shape[1] == CARD_WIDTH
    assert runs - 1 in read and 0 < len(read) <= CARD_WIDTH + 1, len(read)  # the last run, and one a pixel column
