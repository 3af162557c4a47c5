"""The charts: two-tone bars that split mean |attr| by sign, sized for TensorBoard's card; the heatmap; the shares."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_ig.run.host_result import Moments
from lightning_ig.views.pictures.bars import LINE, bar_chart, sign_parts
from lightning_ig.views.pictures.bars import top_features_chart as top_features_figure
from lightning_ig.views.pictures.charts import _wrapped, format_step
from lightning_ig.views.pictures.charts import heatmap_chart as heatmap_figure
from lightning_ig.views.pictures.charts import shares_chart as shares_figure
from lightning_ig.views.pictures.raster import (
    CARD_HEIGHT,
    CARD_WIDTH,
    NEGATIVE,
    POSITIVE,
    Canvas,
    categorical_colours,
    rgb,
)

EPS = np.finfo(np.float64).eps


def _moments(rows: list[list[float]]) -> Moments:
    return Moments.of(np.array(rows, dtype=np.float64))


def _runs_of(pixels: np.ndarray, colour: str, row: int) -> int:
    """How many pixels of ``colour`` a row of the picture holds."""
    return int(np.all(pixels[row] == rgb(colour), axis=1).sum())


def test_sign_parts_add_up_to_the_mean_of_the_magnitudes():
    values = np.random.default_rng(0).normal(size=(64, 5))
    moments = Moments.of(values)
    positive, negative = sign_parts(moments)
    assert np.allclose(positive, np.clip(values, 0, None).mean(0), rtol=16 * EPS)
    assert np.allclose(negative, np.clip(-values, 0, None).mean(0), rtol=16 * EPS)
    assert np.allclose(positive + negative, moments.mean_abs, rtol=16 * EPS)


def _bar_rows(pixels: np.ndarray) -> list[int]:
    """The pixel rows through the middle of each bar (where a bar colour appears right of the labels)."""
    coloured = np.all(pixels == rgb(POSITIVE), axis=2) | np.all(pixels == rgb(NEGATIVE), axis=2)
    rows = np.nonzero(coloured.any(axis=1))[0]
    groups = np.split(rows, np.nonzero(np.diff(rows) > 1)[0] + 1)
    return [int(group[len(group) // 2]) for group in groups if group.size > 3]  # the legend swatches are thinner


def test_a_mixed_sign_feature_is_a_two_tone_bar_in_proportion_to_its_parts():
    # ball: +1 and -3 (mean |a| 2, positive part 0.5, negative 1.5); paddle: +1, +1 (all positive)
    moments = _moments([[1.0, 1.0], [-3.0, 1.0]])
    chart = top_features_figure(["ball", "paddle"], moments, top_k=2, title="t", value_label="v")
    assert chart.labels == ("ball", "paddle")  # sorted by mean |attr|
    ball, paddle = _bar_rows(chart.pixels)[-2:]
    blue, red = _runs_of(chart.pixels, POSITIVE, ball), _runs_of(chart.pixels, NEGATIVE, ball)
    unit = _runs_of(chart.pixels, POSITIVE, paddle)  # paddle: all blue, mean |attr| 1
    assert _runs_of(chart.pixels, NEGATIVE, paddle) == 0 and unit > 100
    assert blue == pytest.approx(0.5 * unit, abs=3) and red == pytest.approx(1.5 * unit, abs=3)  # whole pixels


def test_the_chart_of_four_groups_with_a_verdict_fits_the_card():
    moments = Moments.of(np.random.default_rng(1).normal(size=(64, 4)))
    chart = top_features_figure(
        ["paddle", "ball", "trail", "brick"],
        moments,
        top_k=4,
        verdict=("pass", "worst relative error 9.2e-06 ≤ tolerance 0.01"),
        num_states=64,
        label_colours=categorical_colours(4),
        target_label="V(s)",
    )
    assert chart.pixels.shape[1] == CARD_WIDTH and chart.pixels.shape[0] <= CARD_HEIGHT
    verdict_green = rgb("#1b7837")
    assert np.all(chart.pixels == verdict_green, axis=2).any()  # the verdict is written, in its colour


def test_whiskers_are_drawn_only_when_the_number_of_states_is_known():
    moments = Moments.of(np.random.default_rng(2).normal(size=(16, 3)))
    labels = ["a", "b", "c"]
    plain = top_features_figure(labels, moments, title="t", value_label="v").pixels
    whiskered = top_features_figure(labels, moments, title="t", value_label="v", num_states=16).pixels
    assert not np.array_equal(plain, whiskered)
    interval = 1.959963984540054 * moments.stddev_abs / np.sqrt(16)
    chart = top_features_figure(labels, moments, title="t", value_label="v", num_states=16)
    assert chart.axis_limit == pytest.approx(float((moments.mean_abs + interval).max()), rel=64 * EPS)


def test_many_bars_grow_the_chart_and_labels_are_cut_to_the_width():
    moments = Moments.of(np.random.default_rng(3).normal(size=(8, 12)))
    labels = [f"a rather long feature name number {i}" for i in range(12)]
    chart = top_features_figure(labels, moments, top_k=10, title="t", value_label="v")
    assert len(chart.labels) == 10 and all(label.endswith("…") for label in chart.labels)
    assert chart.pixels.shape[0] > CARD_HEIGHT  # 10 rows of 16 px no longer fit 214 px: the Images tab shows it whole


def test_bar_chart_argument_errors():
    with pytest.raises(ValueError, match="got 2 labels, 3 positive and 3 negative parts"):
        bar_chart(["a", "b"], np.ones(3), np.ones(3), title="t", value_label="v")
    with pytest.raises(ValueError, match="label_colours has 1 colours for 2 units"):
        bar_chart(["a", "b"], np.ones(2), np.ones(2), title="t", value_label="v", label_colours=["#000000"])


def test_heatmap_columns_are_shares_on_a_round_scale():
    history = np.array([[1.0, 1.0, 2.0], [3.0, 1.0, 0.0]])  # shares 25/25/50, 75/25/0
    chart = heatmap_figure(["a", "b", "c"], [10, 20], history)
    assert chart.axis_limit == 0.75  # the largest share, 0.75, is a round step itself
    assert chart.labels == ("a", "b", "c")  # ordered by the last run
    assert chart.pixels.shape[1] == CARD_WIDTH and chart.pixels.shape[0] <= CARD_HEIGHT
    assert heatmap_figure(["a", "b"], [1], np.array([[0.3, 0.7]])).axis_limit == 0.75
    with pytest.raises(ValueError, match="at least one run"):
        heatmap_figure(["a"], [], np.zeros((0, 1)))


def test_shares_stack_each_run_to_the_whole_in_the_units_colours():
    colours = ["#e69f00", "#f0f0f0", "#8c8c8c"]
    history = np.array([[1.0, 1.0, 2.0], [2.0, 1.0, 1.0], [3.0, 0.0, 1.0]])
    chart = shares_figure(["paddle", "ball", "brick"], [100, 200, 300], history, colours=colours)
    assert chart.labels == ("paddle", "brick", "ball")  # bottom-up, by the last run's share
    pixels = chart.pixels
    orange = np.all(pixels == rgb(colours[0]), axis=2)
    columns = np.nonzero(orange.any(axis=0))[0]
    plot_columns = columns[columns < CARD_WIDTH - 100]  # the plot, not the swatches of the labels beside it
    first, last = plot_columns.min(), plot_columns.max()
    band_first, band_last = orange[:, first].sum(), orange[:, last].sum()
    assert band_last / band_first == pytest.approx(0.75 / 0.25, rel=0.05)  # paddle: 25% of run 1, 75% of run 3


def test_shares_sum_the_small_units_into_other():
    history = np.random.default_rng(4).random((5, 12))
    chart = shares_figure([f"g{i}" for i in range(12)], list(range(5)), history)
    assert len(chart.labels) == 8 and chart.labels[-1] == "other 5"
    with pytest.raises(ValueError, match="one label"):
        shares_figure(["a"], [1], np.ones((1, 2)))


def test_steps_are_written_short():
    assert [format_step(s) for s in (250, 3437, 24000, 125000, 2_500_000)] == ["250", "3,437", "24k", "125k", "2.5M"]


def test_a_long_band_label_goes_on_two_lines_broken_at_a_space_never_cut_mid_word():
    canvas = Canvas(1, 1)
    assert _wrapped(canvas, "4.5% cart position", 127) == ["4.5% cart position"]
    assert _wrapped(canvas, "58% pole angular velocity", 127) == ["58% pole angular", "velocity"]
    share, name = _wrapped(canvas, "58% a-very-long-single-name", 60)
    assert share == "58%" and name.endswith("…")  # the second line is cut where it must be
    assert _wrapped(canvas, "100%-and-a-very-long-name", 60)[0].endswith("…")  # nowhere to break: one cut line
    history = np.array([[1.0, 2.0, 5.0, 12.0], [1.0, 2.5, 5.0, 13.0]])

    def inked_rows(longest: str) -> int:
        chart = shares_figure(["cart position", "cart velocity", "pole angle", longest], [250, 500], history)
        text = np.all(chart.pixels[LINE + 8 :, CARD_WIDTH - 127 :] < 120, axis=2)  # the labels' ink, below the title
        return int(text.any(axis=1).sum())

    assert inked_rows("pole angular velocity") >= inked_rows("pole rate") + 8  # a second line of text
