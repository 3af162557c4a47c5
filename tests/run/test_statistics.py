"""The numbers of runs: completeness and its verdicts, where the mass sits, drift between runs, the feature order."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_ig.run.host_result import HostResult
from lightning_ig.run.statistics import (
    CONCENTRATION_SHARES,
    Completeness,
    completeness,
    concentration,
    drift,
    json_float,
    json_floats,
    rank_order,
    spearman,
    topk_jaccard,
)
from tests.support.tolerance import eps


class _Result:
    """The fields of an IGResult that the statistics read, set by hand (one attribution per state)."""

    def __init__(
        self, attributions, f_input, f_baseline, degenerate=None, non_finite=None, attribution_error=None
    ) -> None:
        self.attributions = torch.as_tensor(attributions, dtype=torch.float64)
        self.f_input = torch.as_tensor(f_input, dtype=torch.float64)
        self.f_baseline = torch.as_tensor(f_baseline, dtype=torch.float64)
        self.delta = self.attributions.sum(1) - (self.f_input - self.f_baseline)
        difference = (self.f_input - self.f_baseline).abs()
        self.relative_error = self.delta.abs() / difference
        states = len(self.f_input)
        self.degenerate = torch.zeros(states, dtype=torch.bool) if degenerate is None else torch.tensor(degenerate)
        self.non_finite = torch.zeros(states, dtype=torch.bool) if non_finite is None else torch.tensor(non_finite)
        self.n_steps, self.method, self.gradient, self.backend = 8, "gausslegendre", "autograd", "torch"
        self.target = "mean"
        if attribution_error is not None:
            self.attribution_error = torch.as_tensor(attribution_error, dtype=torch.float64)


def test_json_floats_write_non_finite_values_as_null() -> None:
    assert json_float(1.5) == 1.5 and json_float(math.inf) is None and json_float(math.nan) is None
    assert json_floats(np.array([1.0, 2.0])) == [1.0, 2.0]
    assert json_floats(np.array([1.0, -math.inf, math.nan])) == [1.0, None, None]


def test_rank_order_is_decreasing_stable_on_ties_and_puts_nan_last() -> None:
    assert rank_order(np.array([1.0, 3.0, 2.0])).tolist() == [1, 2, 0]
    assert rank_order(np.array([2.0, 5.0, 2.0, 5.0])).tolist() == [1, 3, 0, 2]  # ties in feature order
    assert rank_order(np.array([math.nan, 0.0, 1.0])).tolist() == [2, 1, 0]


def test_completeness_verdicts_follow_the_accuracy_figures_not_the_ratio() -> None:
    # state 0: attributions add up to 1.0 of a 1.0 change (error 0); state 1: 2.2 of 2.0 (ratio 0.1, mass-relative
    # 0.2 / 2.2); the estimates say 0.02 and 0.05
    result = _Result([[0.5, 0.5], [1.2, 1.0]], [1.0, 2.0], [0.0, 0.0], attribution_error=[0.02, 0.05])
    numbers = completeness(result, tolerance=0.2)
    assert numbers.worst_relative_error == pytest.approx(0.1, rel=4 * eps(torch.float64))
    assert numbers.mean_abs_error == pytest.approx(0.1, rel=4 * eps(torch.float64))
    assert numbers.worst_mass_relative_error == pytest.approx(0.2 / 2.2, rel=4 * eps(torch.float64))
    assert numbers.worst_attribution_error == pytest.approx(0.05)
    assert (numbers.num_states, numbers.num_checked, numbers.first_non_finite) == (2, 2, None)
    assert numbers.verdict == "pass" and numbers.accuracy.figure == "mass_relative_error"
    # 0.2 / 2.2 = 0.0909 > sqrt(2) x 0.06: fails on the mass-relative error although the estimate (0.05) would pass
    failing = completeness(result, tolerance=0.06)
    assert failing.verdict == "fail" and failing.accuracy.figure == "mass_relative_error"
    # without an estimate nothing vouches for the per-feature error: not within
    assert completeness(_Result([[0.5, 0.5], [1.2, 1.0]], [1.0, 2.0], [0.0, 0.0]), tolerance=0.2).verdict == "fail"


def test_a_degenerate_state_is_left_out_of_the_worst_error_and_nothing_checked_is_nan() -> None:
    result = _Result([[0.5, 0.5], [1.0, 0.0]], [1.0, 3.0], [0.0, 3.0], degenerate=[False, True])
    numbers = completeness(result)
    assert numbers.num_degenerate == 1 and numbers.num_checked == 1 and numbers.worst_relative_error == 0.0
    nothing = completeness(_Result([[0.0], [0.0]], [1.0, 1.0], [1.0, 1.0], degenerate=[True, True]))
    assert math.isnan(nothing.worst_relative_error) and nothing.verdict == "unchecked"  # never 0.0


def test_a_non_finite_state_makes_the_run_non_finite_wherever_it_shows() -> None:
    flagged = completeness(_Result([[1.0], [1.0]], [1.0, 1.0], [0.0, 0.0], non_finite=[False, True]))
    assert flagged.worst_relative_error == math.inf and flagged.verdict == "non-finite"
    assert flagged.first_non_finite == 1 and flagged.num_non_finite == 1
    # not flagged by the engine, but a NaN forward value: the host side says non-finite too
    unflagged = completeness(_Result([[1.0], [1.0]], [math.nan, 1.0], [0.0, 0.0]))
    assert unflagged.verdict == "non-finite" and unflagged.first_non_finite == 0
    assert unflagged.mean_abs_error == 0.0  # over the finite states only


def test_completeness_reads_a_host_result_as_it_is() -> None:
    result = _Result([[0.5, 0.5], [1.2, 1.0]], [1.0, 2.0], [0.0, 0.0])
    host = HostResult.from_result(result)
    assert completeness(host) == completeness(result)
    assert isinstance(completeness(host), Completeness)


def test_concentration_is_the_share_of_the_top_features() -> None:
    one = concentration(np.array([10.0, 0.0, 0.0, 0.0]))
    assert one == {"top1pct_share": 1.0, "top10pct_share": 1.0}  # one feature carries it all
    even = concentration(np.ones(200))
    assert even["top1pct_share"] == pytest.approx(0.01) and even["top10pct_share"] == pytest.approx(0.1)
    assert set(even) == set(CONCENTRATION_SHARES)
    assert all(math.isnan(v) for v in concentration(np.zeros(5)).values())  # no mass: no share
    assert all(math.isnan(v) for v in concentration(np.array([1.0, math.inf])).values())


def test_spearman_matches_definition_with_ties():
    assert spearman([1.0, 2.0, 3.0], [2.0, 4.0, 9.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # ties: ranks of b are 1, 2.5, 2.5 -> Pearson of (1,2,3) and (1,2.5,2.5)
    x = np.array([1.0, 2.0, 3.0]) - 2.0
    y = np.array([1.0, 2.5, 2.5]) - 2.0
    assert spearman([1.0, 2.0, 3.0], [10.0, 20.0, 20.0]) == pytest.approx(x @ y / np.sqrt((x @ x) * (y @ y)))
    assert math.isnan(spearman([1.0, 1.0], [1.0, 2.0]))
    with pytest.raises(ValueError, match="lengths 2 and 3"):
        spearman([1.0, 2.0], [1.0, 2.0, 3.0])


def test_spearman_agrees_with_scipy_formula_on_random_vectors():
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = rng.integers(0, 5, size=9).astype(float)  # many ties
        b = rng.normal(size=9)
        ranks_a = _reference_ranks(a)
        ranks_b = _reference_ranks(b)
        expected = np.corrcoef(ranks_a, ranks_b)[0, 1]
        if np.isnan(expected):
            assert math.isnan(spearman(a, b))
        else:
            assert spearman(a, b) == pytest.approx(expected)


def _reference_ranks(values: np.ndarray) -> np.ndarray:
    return np.array([np.mean([1 + j for j, w in enumerate(sorted(values)) if w == v]) for v in values])


def test_topk_jaccard():
    assert topk_jaccard([3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0], 2) == 1.0
    assert topk_jaccard([3.0, 2.0, 1.0, 0.0], [3.0, 0.0, 1.0, 2.0], 2) == pytest.approx(1 / 3)
    assert topk_jaccard([3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0], 2) == 0.0
    assert topk_jaccard([1.0, 2.0], [2.0, 1.0], 10) == 1.0  # k clipped to the number of features
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        topk_jaccard([1.0], [1.0], 0)


def test_drift_reports_every_key_from_the_second_run_on() -> None:
    current, previous, first = np.array([3.0, 2.0, 1.0]), np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])
    assert drift(current, None, None, top_k=2) == {}  # the first run
    three = drift(current, previous, first, top_k=2)
    assert three["spearman_prev"] == pytest.approx(-1.0) and three["spearman_first"] == pytest.approx(1.0)
    assert three["topk_jaccard_prev"] == pytest.approx(1 / 3) and len(three) == 3  # top 2: {0, 1} and {2, 1}
    assert drift(current, previous, first, top_k=3)["topk_jaccard_prev"] == 1.0  # top 3 of 3: 1 by construction
    two = drift(np.array([1.0, 2.0]), np.array([2.0, 1.0]), np.array([2.0, 1.0]), top_k=1)
    assert two == {"spearman_prev": -1.0, "spearman_first": -1.0, "topk_jaccard_prev": 0.0}  # schema v1's keys
    assert drift(current, np.array([1.0, 2.0]), first, top_k=2) == {}  # another number of units before
