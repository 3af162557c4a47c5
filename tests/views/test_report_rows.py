"""lightning_ig.views.report_rows: the report's rows (per feature, the top features, completeness per state)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_ig.views.report_rows import completeness_summary, feature_statistics, top_features
from lightning_ig.vocabulary import default_feature_names
from tests.support.results import FakeResult, sample_result


@pytest.fixture
def result() -> FakeResult:
    return sample_result()


def test_feature_statistics_match_numpy():
    attributions = torch.tensor([[1.0, -2.0, 0.5], [3.0, 2.0, 0.5], [-1.0, 4.0, 0.5]])
    stats = feature_statistics(attributions, ["a", "b", "c"])
    array = attributions.double().numpy()
    assert [s["name"] for s in stats] == ["a", "b", "c"]
    np.testing.assert_allclose([s["mean_abs"] for s in stats], np.abs(array).mean(0))
    np.testing.assert_allclose([s["stddev"] for s in stats], array.std(0))
    np.testing.assert_allclose([s["mean_signed"] for s in stats], array.mean(0))
    assert stats[2]["stddev"] == 0.0


def test_feature_statistics_flatten_multidimensional_inputs():
    attributions = torch.arange(2 * 2 * 3, dtype=torch.float32).reshape(2, 2, 3)
    stats = feature_statistics(attributions)
    assert [s["name"] for s in stats] == default_feature_names((2, 3))
    assert stats[0]["name"] == "x[0,0]" and stats[-1]["name"] == "x[1,2]"
    flat = attributions.reshape(2, 6).double()
    np.testing.assert_allclose([s["mean_signed"] for s in stats], flat.mean(0).numpy())


def test_feature_names_checked():
    with pytest.raises(ValueError, match="feature_names has 2 names but there are 3 features"):
        feature_statistics(torch.zeros(2, 3), ["a", "b"])
    with pytest.raises(TypeError, match="feature_names must be a list of strings"):
        feature_statistics(torch.zeros(2, 3), "abc")
    with pytest.raises(ValueError, match="num_states"):
        feature_statistics(torch.zeros(3), None)


def test_top_features_order_and_ties():
    stats = feature_statistics(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), ["a", "b", "c", "d"])
    assert [f["name"] for f in top_features(stats, 3)] == ["b", "c", "d"]
    assert [f["name"] for f in top_features(stats, 10)] == ["b", "c", "d", "a"]
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        top_features(stats, 0)


def test_completeness_summary_keeps_degenerate_states_apart(result):
    summary = completeness_summary(result)
    expected = np.array([0.01, -0.02, 0.0, 0.03, 0.0, -0.005])
    difference = result.f_input.double().numpy()
    regular = [i for i in range(6) if i != 2]
    worst = max(abs(expected[i]) / abs(difference[i]) for i in regular)
    assert summary["worst_relative_error"] == pytest.approx(worst, rel=1e-4)
    assert summary["num_degenerate"] == 1
    assert summary["degenerate_states"][0]["state_idx"] == 2
    assert summary["degenerate_states"][0]["absolute_error"] == pytest.approx(abs(result.delta[2].item()))
    assert summary["per_state"][2]["relative_error"] is None
    assert summary["per_state"][2]["degenerate"] is True
    assert summary["mean_abs_error"] == pytest.approx(result.delta.abs().double().mean().item())
    for i in regular:  # delta was computed in float32 from numbers of this size
        state = summary["per_state"][i]
        size = abs(state["sum_attributions"]) + abs(state["f_input_minus_f_baseline"])
        gap = state["sum_attributions"] - state["f_input_minus_f_baseline"]
        assert abs(gap - result.delta[i].item()) <= 4 * float(torch.finfo(torch.float32).eps) * size
