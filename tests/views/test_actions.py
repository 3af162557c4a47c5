"""Why this action: the contrast and the advantage from per-action attributions, and their pictures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_ig import integrated_gradients
from lightning_ig.attribution.host_result import Moments
from lightning_ig.views.actions import (
    action_attributions_chart as action_attributions_figure,
)
from lightning_ig.views.actions import (
    action_pairs,
    advantage_attributions,
    contrast_attributions,
    greedy_and_runner_up,
)
from lightning_ig.views.actions import (
    contrast_chart as contrast_figure,
)
from lightning_ig.views.raster import CARD_HEIGHT, CARD_WIDTH, NEGATIVE, POSITIVE, rgb


def test_greedy_and_runner_up_per_state_ties_by_the_lower_index():
    q = np.array([[0.1, 0.5, 0.3], [2.0, 2.0, 1.0], [0.0, -1.0, 3.0]])
    greedy, runner_up = greedy_and_runner_up(q)
    assert greedy.tolist() == [1, 0, 2] and runner_up.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match="at least 2 actions"):
        greedy_and_runner_up(np.ones((3, 1)))


def test_the_contrast_from_each_equals_ig_of_the_difference_of_the_two_q_values():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    states = torch.randn(12, 5, dtype=torch.float64)
    each = integrated_gradients(model, states, target="each", n_steps=32)
    with torch.no_grad():
        q = model(states).numpy()
    contrast, greedy, runner_up = contrast_attributions(each.attributions.numpy(), q)
    g, r = torch.as_tensor(greedy), torch.as_tensor(runner_up)

    def difference(x: torch.Tensor) -> torch.Tensor:  # Q(s, g) - Q(s, r), the pair fixed per state at the input
        rows = torch.arange(x.shape[0]) % states.shape[0]  # the engine lays rows out (*, B): row i is state i % B
        out = model(x)
        return out[torch.arange(x.shape[0]), g[rows]] - out[torch.arange(x.shape[0]), r[rows]]

    direct = integrated_gradients(difference, states, n_steps=32)
    scale = float(np.abs(direct.attributions.numpy()).max())
    np.testing.assert_allclose(
        contrast, direct.attributions.numpy(), rtol=0, atol=64 * np.finfo(np.float64).eps * scale
    )
    sums = contrast.sum(axis=1)  # completeness carries over: the contrast misses dF by the direct run's delta
    change = (direct.f_input - direct.f_baseline).numpy()
    bound = 64 * np.finfo(np.float64).eps * max(float(np.abs(sums).max()), float(np.abs(change).max()))
    np.testing.assert_allclose(sums - change, direct.delta.numpy(), rtol=0, atol=bound)


def test_the_advantage_is_each_action_less_the_mean_action():
    each = np.random.default_rng(0).normal(size=(3, 4, 5))
    advantage = advantage_attributions(each)
    np.testing.assert_allclose(advantage.sum(axis=0), 0.0, atol=16 * np.finfo(np.float64).eps * np.abs(each).max())
    np.testing.assert_allclose(advantage[1] - advantage[2], each[1] - each[2], rtol=16 * np.finfo(np.float64).eps)


def test_pairs_are_counted_the_commonest_first():
    assert action_pairs(np.array([0, 2, 0, 1, 2]), np.array([2, 0, 2, 0, 0])) == [((0, 2), 2), ((2, 0), 2), ((1, 0), 1)]


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
