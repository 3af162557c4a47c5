"""The numbers of a run per action (``lightning_ig.run.actions``): ``target="each"`` and ``target="contrast"``."""

from __future__ import annotations

import types

import numpy as np
import pytest

from lightning_ig.run.actions import ActionSummary, action_pairs, contrast_numbers
from tests.support.each import NAMES
from tests.support.each import each_run as make_each_run
from tests.support.tolerance import assert_close_scaled


@pytest.fixture(scope="module")
def each_run() -> dict:
    return make_each_run()


def test_each_action_has_the_moments_of_its_own_attributions_and_its_advantage(each_run):
    result, summary = each_run["result"], each_run["summary"]
    each = result.attributions.numpy()  # (A, B, F)
    scale = float(np.abs(each).max())
    assert summary.names == NAMES and summary.num_states == 9
    for action in range(len(NAMES)):
        own, advantage = summary.moments[action], summary.advantage_moments[action]
        # the same float64 numbers, reduced in another order: a few roundings of the largest attribution
        assert_close_scaled(own.mean_abs, np.abs(each[action]).mean(0), ulps=16, dtype=np.float64, scale=scale)
        assert_close_scaled(own.mean_signed, each[action].mean(0), ulps=16, dtype=np.float64, scale=scale)
        expected = each[action] - each.mean(0)  # what favours the action over the mean action
        assert_close_scaled(advantage.mean_abs, np.abs(expected).mean(0), ulps=32, dtype=np.float64, scale=scale)
    greedy = np.bincount(each_run["q_values"].argmax(1), minlength=len(NAMES))
    assert summary.greedy_counts.tolist() == greedy.tolist()


def test_a_state_with_a_non_finite_q_value_counts_for_no_action():
    q_values = np.array([[1.0, 2.0], [np.nan, 0.0], [3.0, -1.0], [0.5, 0.5]])  # state-major rows below
    host = types.SimpleNamespace(f_input=q_values.reshape(-1))
    summary = ActionSummary.of_each(host, np.ones((8, 2)), ["a", "b"])
    assert summary.greedy_counts.tolist() == [2, 1]  # a tie goes to the lower index; the NaN state to none


def test_a_contrast_run_shows_its_commonest_pair_and_the_moments_of_its_states():
    pairs = np.array([[0, 2], [1, 0], [0, 2], [2, 1]])  # as the engine chose them: IGResult.target_actions
    numbers = contrast_numbers(pairs, np.arange(8.0).reshape(4, 2))
    assert numbers.pair == (0, 2) and numbers.count == 2
    assert numbers.moments.mean_abs.tolist() == [2.0, 3.0]  # states 0 and 2: rows [0, 1] and [4, 5]
    with pytest.raises(ValueError, match=r"pairs must be \(B, 2\)"):
        contrast_numbers(pairs[:, :1], np.ones((4, 2)))


def test_pairs_are_counted_the_commonest_first():
    assert action_pairs(np.array([0, 2, 0, 1, 2]), np.array([2, 0, 2, 0, 0])) == [((0, 2), 2), ((2, 0), 2), ((1, 0), 1)]
