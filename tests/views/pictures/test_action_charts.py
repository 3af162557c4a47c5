"""Why this action: the pictures of per-action and contrast attributions."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_ig.run.host_result import Moments
from lightning_ig.views.pictures.action_charts import (
    action_attributions_chart as action_attributions_figure,
)
from lightning_ig.views.pictures.action_charts import (
    contrast_chart as contrast_figure,
)
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, NEGATIVE, POSITIVE, rgb


def test_contrast_figure_names_both_actions_and_fits_the_card():
    moments = Moments.of(np.random.default_rng(1).normal(size=(20, 4)))
    chart = contrast_figure(
        ["paddle", "ball", "trail", "brick"], moments, greedy="left", runner_up="right", num_states=20, of_states=64
    )
    assert chart.pixels.shape[1] == CARD_WIDTH and chart.pixels.shape[0] <= CARD_HEIGHT
    plain = contrast_figure(["paddle", "ball", "trail", "brick"], moments, greedy="right", runner_up="left")
    assert not np.array_equal(plain.pixels[:16], chart.pixels[:16])  # the title says which is which


def _blue_lengths(pixels: np.ndarray) -> list[int]:
    """The blue pixels per row, for rows with any (one value per bar row, legend excluded by the caller)."""
    blue = np.all(pixels == rgb(POSITIVE), axis=2).sum(axis=1)
    return blue.tolist()


def test_action_panels_share_one_scale_so_equal_values_are_equal_bars():
    same = np.array([[1.0, 0.5], [1.0, 0.5]])  # two states, two units: all positive
    half = same / 2
    moments = [Moments.of(same), Moments.of(half)]
    chart = action_attributions_figure(["ball", "paddle"], ["left", "right"], moments, greedy_counts=[1, 1])
    pixels = chart.pixels
    blue = np.all(pixels == rgb(POSITIVE), axis=2)
    ratios = []
    for row in np.nonzero(blue.any(axis=1))[0]:
        columns = np.nonzero(blue[row])[0]
        runs = np.split(columns, np.nonzero(np.diff(columns) > 1)[0] + 1)
        if len(runs) == 2 and columns.min() > 40:  # a bar row: one bar per panel (the legend's swatch is at the left)
            ratios.append(len(runs[1]) / len(runs[0]))
    assert ratios and np.allclose(ratios, 0.5, atol=0.03)  # half the value, half the bar: one scale for both panels
    assert not np.all(pixels == rgb(NEGATIVE), axis=2)[40:].any()  # no negative parts


def test_action_figure_argument_errors_and_many_actions():
    moments = [Moments.of(np.ones((2, 3)))] * 3
    with pytest.raises(ValueError, match="got 3 moments for 2 actions"):
        action_attributions_figure(["a", "b", "c"], ["x", "y"], moments)
    with pytest.raises(ValueError, match="greedy_counts has 1 counts for 3 actions"):
        action_attributions_figure(["a", "b", "c"], ["x", "y", "z"], moments, greedy_counts=[1])
    many = [Moments.of(np.full((2, 3), float(a + 1))) for a in range(18)]
    chart = action_attributions_figure(
        ["a", "b", "c"], [f"a{i}" for i in range(18)], many, greedy_counts=list(range(18))
    )
    assert chart.pixels.shape[1] == CARD_WIDTH  # the six most often greedy actions, not eighteen slivers
