"""Do the members of an ensemble rely on the same features as the aggregate (``lightning_ig.run.agreement``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_ig.attribution import integrated_gradients
from lightning_ig.ensemble import Ensemble
from lightning_ig.models import DuelingQNetwork
from lightning_ig.run.agreement import agreement_scalars, ensemble_summary, mean_abs_per_feature, member_agreement
from tests.support.tolerance import assert_close_scaled, eps


def _members(count: int = 3, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [DuelingQNetwork(4, 3, hidden_sizes=(16,), noisy=False, activation="tanh") for _ in range(count)]


def test_member_agreement_by_hand() -> None:
    agreement = member_agreement([3.0, 2.0, 1.0], [[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    assert agreement["spearman"][:2] == [1.0, -1.0] and math.isnan(agreement["spearman"][2])
    assert agreement["spearman_mean"] == 0.0 and agreement["spearman_min"] == -1.0
    assert agreement["spearman_undefined"] == 1
    spread = np.std([[3, 2, 1], [1, 2, 3], [5, 5, 5]], axis=0).mean()
    assert agreement["spread"] == pytest.approx(spread)
    assert agreement["relative_spread"] == pytest.approx(spread / np.mean([[3, 2, 1], [1, 2, 3], [5, 5, 5]]))
    assert member_agreement([1.0, 2.0], [[1.0, 2.0]])["spread"] == 0.0
    with pytest.raises(ValueError, match=r"member_mean_abs must be \(M >= 1, F\) with F = 3"):
        member_agreement([1.0, 2.0, 3.0], [[1.0, 2.0]])
    scalars = agreement_scalars(agreement)
    assert set(scalars) == {
        "spearman_mean",
        "spearman_min",
        "spread",
        "relative_spread",
        "spearman/member_0",
        "spearman/member_1",
        "spearman/member_2",
    }


def test_mean_abs_per_feature_flattens_features() -> None:
    attributions = torch.tensor([[[1.0, -2.0], [3.0, 0.0]], [[-1.0, 2.0], [1.0, 0.0]]])  # (B=2, 2, 2)
    assert mean_abs_per_feature(attributions).tolist() == [1.0, 2.0, 2.0, 0.0]
    assert mean_abs_per_feature(attributions, members=True).tolist() == [[2.0, 1.0], [1.0, 1.0]]
    with pytest.raises(ValueError, match="at least one state"):
        mean_abs_per_feature(torch.zeros(0, 3))


def test_ensemble_summary_is_json_and_says_what_each_member_relies_on() -> None:
    ensemble = Ensemble(_members(seed=3), weights=[0.2, 0.5, 0.3]).eval()
    states = torch.randn(5, 4)
    aggregate = integrated_gradients(ensemble, states, n_steps=24)
    members = integrated_gradients(ensemble.member_signals, states, target="each", n_steps=24)
    summary = ensemble_summary(aggregate, members, weights=ensemble.weights, feature_names=list("abcd"), top_k=2)
    json.dumps(summary, allow_nan=False)  # strict JSON
    assert summary["num_members"] == 3 and summary["weights"] == pytest.approx([0.2, 0.5, 0.3])
    assert set(summary["agreement"]) == {
        "spearman",
        "spearman_mean",
        "spearman_min",
        "spearman_undefined",
        "spread",
        "relative_spread",
    }
    first = summary["members"][0]
    assert set(first) == {
        "member",
        "weight",
        "spearman_vs_aggregate",
        "worst_relative_error",
        "num_degenerate",
        "num_non_finite",
        "mean_abs_error",
        "top_features",
        "per_state",
    }
    for m, member in enumerate(summary["members"]):  # each member's completeness, as the engine computed it
        assert [s["state_idx"] for s in member["per_state"]] == list(range(5))
        sums = members.attributions[m].double().reshape(5, -1).sum(1)
        assert_close_scaled([s["sum_attributions"] for s in member["per_state"]], sums, ulps=4, dtype=torch.float64)
        assert_close_scaled(
            [s["f_input_minus_f_baseline"] for s in member["per_state"]],
            (members.f_input[m].double() - members.f_baseline[m].double()),
            ulps=0,
            dtype=torch.float64,
        )
        assert member["worst_relative_error"] == pytest.approx(
            float(members.relative_error[m].max()), rel=4 * eps(torch.float32)
        )
        assert member["mean_abs_error"] == pytest.approx(
            float(members.delta[m].double().abs().mean()), rel=4 * eps(torch.float32)
        )
        assert member["num_non_finite"] == 0 and member["worst_relative_error"] < 1e-3
    assert len(first["top_features"]) == 2 and first["top_features"][0]["name"] in "abcd"
    assert first["top_features"][0]["mean_abs"] >= first["top_features"][1]["mean_abs"]
    expected = member_agreement(
        mean_abs_per_feature(aggregate.attributions), mean_abs_per_feature(members.attributions, members=True)
    )
    assert [m["spearman_vs_aggregate"] for m in summary["members"]] == expected["spearman"]
    with pytest.raises(ValueError, match="members.attributions must be"):
        ensemble_summary(aggregate, aggregate)
    with pytest.raises(ValueError, match="weights has 2 entries for 3 members"):
        ensemble_summary(aggregate, members, weights=[0.5, 0.5])
