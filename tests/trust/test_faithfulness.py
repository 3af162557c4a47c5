"""trust/faithfulness.py: IG's deletion order beats a random one; shuffled or reversed maps fail."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_ig.trust import AttributionSettings, faithfulness
from lightning_ig.trust.faithfulness import deletion_check
from lightning_ig.views.text import verdict_words
from tests.support.tolerance import rounding_bound
from tests.support.trust import SETTINGS, assert_unchanged, attribute, shuffled, snapshot


def test_deletion_passes_for_ig_and_fails_for_shuffled_or_reversed_orders(trained):
    model, states = trained
    units = attribute(model, states)
    result = deletion_check(model, states, None, units, settings=SETTINGS)
    assert result.passed, result
    assert result.curve[0] == 1.0 and result.curve[-1] == 0.0
    assert len(result.curve) == faithfulness.DELETION_FRACTIONS + 1
    assert result.gap >= faithfulness.DELETION_Z * result.gap_standard_error and result.reason is None
    for seed in range(3):
        other = deletion_check(model, states, None, shuffled(units, seed), settings=SETTINGS)
        assert not other.passed, other
        assert "faithfulness" in other.reason
    backwards = deletion_check(model, states, None, -units, settings=SETTINGS)
    assert not backwards.passed and backwards.deletion_auc > backwards.deletion_auc_random
    assert set(result.scalars()) >= {"faithfulness/deletion_auc", "faithfulness/deletion_auc_random"}

    # a gap short of the bar: the closing line's short form (the reason cut at its first comma or semicolon) says
    # the bar, not only that the attribution order "beats a random order by" a positive gap
    short = deletion_check(model, states, None, units, settings=SETTINGS, margin=min(result.gap * 2, 0.99))
    entry = {"global_step": 1, "verdict": "pass", "trust": "failed", "trust_reasons": [short.reason]}
    assert not short.passed and short.gap > 0
    assert f"by {short.gap:.3f} of the {short.needed:.3f} needed), at step 1" in verdict_words(entry)


def test_deletion_curve_of_a_linear_model_is_its_attributions_removed():
    """For F(x) = w.x + c and a zero baseline, F(x_k) - F(0) is the sum of the attributions kept."""
    generator = torch.Generator().manual_seed(2)
    model = nn.Linear(10, 1)
    states = torch.randn(8, 10, generator=generator)
    states[:, 3] = 0  # a feature at its baseline in every state: never counted, never deleted
    units = model.weight.detach()[0] * states  # IG of a linear model, exactly
    result = deletion_check(model, states, None, units, settings=AttributionSettings(target=0), num_fractions=4)
    a = units.double().numpy()
    delta = a.sum(axis=1)
    sign = np.where(delta < 0, -1.0, 1.0)
    moved = states.numpy() != 0
    curve = []
    for k in range(5):
        total = 0.0
        for b in range(len(a)):
            order = [i for i in np.argsort(-(sign[b] * a[b]), kind="stable") if moved[b, i]]
            removed = order[: int(np.round(k * len(order) / 4))]
            total += sign[b] * (delta[b] - a[b, removed].sum())
        curve.append(total / np.abs(delta).sum())
    bound = rounding_bound(float(np.abs(a).sum(axis=1).max() / np.abs(delta).sum() * len(a)), ulps=64)
    np.testing.assert_allclose(result.curve, curve, rtol=0, atol=bound)
    expected_auc = (sum(curve[1:-1]) + (curve[0] + curve[-1]) / 2) / 4
    assert abs(result.deletion_auc - expected_auc) <= bound


def test_deletion_by_groups_removes_whole_groups_and_chunking_changes_nothing(trained):
    model, states = trained
    groups = torch.arange(states.shape[1]) // 4  # 8 groups of four
    units = attribute(model, states).view(len(states), 8, 4).sum(dim=2)
    whole = deletion_check(model, states, None, units, settings=SETTINGS, groups=groups)
    assert whole.num_fractions == 8  # at most one fraction per group
    chunked = deletion_check(model, states, None, units, settings=SETTINGS, groups=groups, max_rows=5)
    scale = max(abs(value) for value in whole.curve + whole.curve_random)
    for got, expected in zip(chunked.curve + chunked.curve_random, whole.curve + whole.curve_random):
        assert abs(got - expected) <= rounding_bound(scale, ulps=256)


def test_deletion_is_deterministic_leaves_the_model_and_fails_on_nan(trained):
    model, states = trained
    units = attribute(model, states)
    model.train()
    try:
        before = snapshot(model)
        first = deletion_check(model, states, None, units, settings=SETTINGS, seed=5)
        with torch.inference_mode():
            second = deletion_check(model, states, None, units, settings=SETTINGS, seed=5)
        assert_unchanged(model, before)
    finally:
        model.eval()
    assert first == second
    other = deletion_check(model, states, None, units, settings=SETTINGS, seed=6)
    assert other.curve_random != first.curve_random and other.curve == first.curve

    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.where(x[:, :1] > 0, math.nan, 1.0) * x.sum(dim=1, keepdim=True)

    result = deletion_check(Broken(), states, None, units, settings=AttributionSettings(target=0))
    assert math.isnan(result.deletion_auc) and not result.passed and "undefined" in result.reason


class _Ordered(nn.Module):
    """A linear model whose features are already in order of importance: the deletion check's tie order (unit order)
    is the right order, so only a map that orders nothing can pass there by accident."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * torch.tensor([100.0, 50, 20, 10, 5, 2, 1, 0.5, 0.2, 0.1])).sum(-1)


def test_deletion_fails_attributions_that_are_nan_inf_or_order_nothing():
    """NaN, inf and all-zero attributions used to pass here (the stable sort's tie order happened to be right)."""
    torch.manual_seed(0)
    states = torch.rand(32, 10) + 0.5
    good = deletion_check(_Ordered(), states, None, states * torch.tensor([100.0, 50, 20, 10, 5, 2, 1, 0.5, 0.2, 0.1]))
    assert good.passed, good
    for value in (math.nan, math.inf, 0.0):
        result = deletion_check(_Ordered(), states, None, torch.full((32, 10), value))
        assert not result.passed and math.isnan(result.gap) and "order no unit" in result.reason, (value, result)


def test_states_of_another_dtype_than_the_model_are_told_which_to_convert():
    # guards against: torch's "mat1 and mat2 must have the same dtype", where the other checks say it in words
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    states = torch.rand(6, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"inputs are torch.float64 but the model's parameters are torch.float32"):
        deletion_check(model, states, None, torch.rand(6, 4))


def test_targets_the_checks_cannot_judge_are_refused_with_the_reason():
    """ "each" gives a map per action and no one value per state to check; a contrast's pair is chosen per state, so
    a deleted state's forward cannot re-state it: both were accepted and failed later with the target's repr."""
    model, states = nn.Linear(4, 3), torch.randn(6, 4)
    with pytest.raises(ValueError, match=r"target='each' cannot be checked.*pass target='mean'"):
        deletion_check(model, states, None, torch.randn(6, 4), settings=AttributionSettings(target="each"))
    for target, named in (("contrast", "'contrast'"), (torch.tensor([0, 1, 2, 0, 1, 2]), "'per_row'")):
        with pytest.raises(ValueError, match=f"deletion check cannot use target={named} \\(it picks outputs per state"):
            deletion_check(model, states, None, torch.randn(6, 4), settings=AttributionSettings(target=target))
