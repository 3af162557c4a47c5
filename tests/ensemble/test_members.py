"""Every member of an ensemble beside the aggregate: which ensemble is behind a model, and the members' result
packed one row per state and reduced on the host."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lightning_ig.attribution import integrated_gradients
from lightning_ig.ensemble import Ensemble
from lightning_ig.ensemble.members import MemberRun, find_ensemble, pack_members
from lightning_ig.models import DuelingQNetwork


def _ensemble(seed: int = 0) -> Ensemble:
    torch.manual_seed(seed)
    members = [DuelingQNetwork(4, 3, hidden_sizes=(8,), noisy=False, activation="tanh") for _ in range(3)]
    return Ensemble(members, weights=[0.5, 0.3, 0.2]).eval()


class _Wrapper(nn.Module):
    def __init__(self, ensemble: Ensemble, scale: float = 1.0) -> None:
        super().__init__()
        self.ensemble, self.scale = ensemble, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.ensemble(x)
        return out if self.scale == 1.0 else out * self.scale


def test_the_ensemble_is_found_only_where_the_models_output_is_its_aggregate() -> None:
    ensemble, sample = _ensemble(), torch.randn(2, 4)
    assert find_ensemble(ensemble, sample) is ensemble
    assert find_ensemble(_Wrapper(ensemble), sample) is ensemble  # a module whose forward returns the ensemble's
    assert find_ensemble(_Wrapper(ensemble, scale=2.0), sample) is None  # a head on top: no members to attribute
    two = nn.ModuleList([_ensemble(1), _ensemble(2)])
    assert find_ensemble(nn.Sequential(two), sample) is None
    assert find_ensemble(DuelingQNetwork(4, 3, hidden_sizes=(8,)), sample) is None


def test_packed_rows_reduce_to_the_results_numbers() -> None:
    ensemble, states = _ensemble(), torch.randn(5, 4, dtype=torch.float32)
    result = integrated_gradients(ensemble.member_signals, states, target="each", n_steps=8)
    packed = pack_members(result)
    assert packed.shape == (5, 3 * (4 + 6)) and packed.dtype == torch.float32
    run = MemberRun.from_result(result, weights=[0.5, 0.3, 0.2])
    attributions = result.attributions.double().numpy()  # (M, B, F)
    assert (run.num_members, run.num_states, run.weights) == (3, 5, [0.5, 0.3, 0.2])
    np.testing.assert_array_equal(run.mean_abs, np.abs(attributions).mean(1))
    np.testing.assert_array_equal(run.sum_attributions, attributions.sum(2))
    np.testing.assert_array_equal(run.f_input, result.f_input.double().numpy())
    np.testing.assert_array_equal(run.delta, result.delta.double().numpy())
    assert not run.non_finite.any() and run.worst_relative_errors().shape == (3,)
    # the padding of an uneven split across ranks is dropped
    padded = torch.cat([packed, torch.full_like(packed[:2], math.nan)])
    again = MemberRun.from_packed(padded, 3, num_states=5)
    np.testing.assert_array_equal(again.mean_signed, run.mean_signed)


def test_a_non_finite_state_is_flagged_and_makes_its_members_worst_error_infinite() -> None:
    ensemble, states = _ensemble(), torch.randn(4, 4)
    result = integrated_gradients(ensemble.member_signals, states, target="each", n_steps=4)
    packed = pack_members(result).clone()
    packed[2, 4] = math.inf  # member 0, state 2: its f_input (after its 4 attributions)
    run = MemberRun.from_packed(packed, 3)
    assert run.non_finite[0, 2] and not run.non_finite[1:].any() and not run.degenerate[0, 2]
    worst = run.worst_relative_errors()
    assert worst[0] == math.inf and np.isfinite(worst[1:]).all()
    assert np.isfinite(run.mean_abs_errors()).all()  # the mean |delta| is over the finite states


def test_a_result_that_is_not_one_per_member_is_refused() -> None:
    result = integrated_gradients(_ensemble(), torch.randn(3, 4), n_steps=4)  # the aggregate: (B, F)
    with pytest.raises(ValueError, match="attribute ensemble.member_signals with target='each'"):
        pack_members(result)
