"""trust/stability.py: stable under the agent's own noise, not under loud noise; n/a without NoisyLinear."""

from __future__ import annotations

import torch

from lightning_ig.models import DuelingQNetwork
from lightning_ig.trust.stability import stability_check
from tests.support.trust import SETTINGS, assert_unchanged, attribute, loud, snapshot


def test_stability_passes_on_a_trained_noisy_network_and_fails_under_loud_noise(trained):
    model, states = trained
    result = stability_check(model, states, None, attribute(model, states), settings=SETTINGS)
    assert result.applicable and result.passed, result
    assert len(result.draw_rank_correlations) == 2 and "stability/noise_rank_correlation" in result.scalars()
    noisy = loud(model, 300.0)  # the noise, not the weights, decides: each draw is another network
    result = stability_check(noisy, states, None, attribute(noisy, states), settings=SETTINGS)
    assert result.applicable and not result.passed, result
    assert "stability" in result.reason


def test_stability_does_not_apply_without_noisy_layers():
    model = DuelingQNetwork(4, 2, hidden_sizes=(8,), noisy=False).eval()
    states = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    result = stability_check(model, states, None, attribute(model, states), settings=SETTINGS)
    assert not result.applicable and result.passed is None and result.scalars() == {} and result.reason is None


def test_stability_restores_epsilon_modes_and_switches_exactly(trained):
    model, states = trained
    units = attribute(model, states)
    model.train()
    model.advantage[0].disable_noise()
    try:
        before = snapshot(model)
        first = stability_check(model, states, None, units, settings=SETTINGS, seed=2)
        with torch.inference_mode():
            second = stability_check(model, states, None, units, settings=SETTINGS, seed=2)
        assert_unchanged(model, before)  # epsilon buffers bit for bit, modes, switches, the random generators
    finally:
        model.advantage[0].enable_noise()
        model.eval()
    assert first == second
    third = stability_check(model, states, None, units, settings=SETTINGS, seed=3)
    assert third.draw_rank_correlations != () and third.applicable
