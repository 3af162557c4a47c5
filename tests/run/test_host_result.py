"""HostResult: one packed gather with a padded uneven split gives what one process computes; host-side views."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.result import pack
from lightning_ig.run.host_result import HostResult, Moments
from tests.support.tolerance import assert_close_scaled


def _forward(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x.reshape(x.shape[0], -1) * torch.linspace(-1.0, 2.0, x[0].numel())).sum(1)


def _result(states: torch.Tensor):
    return integrated_gradients(_forward, states, n_steps=16)


def test_the_single_process_view_equals_numpy():
    states = torch.randn(7, 2, 3, generator=torch.Generator().manual_seed(0))
    result = _result(states)
    host = HostResult.from_result(
        result, keep_attributions=True, sample_states=2, groups=FeatureGroups.resolve("channels", (2, 3))
    )
    flat = result.attributions.double().reshape(7, 6).numpy()
    assert np.array_equal(host.attributions, flat)
    assert np.array_equal(host.sample_attributions, flat[:2].reshape(2, 2, 3))
    np.testing.assert_array_equal(host.f_input, result.f_input.double().numpy())
    np.testing.assert_array_equal(host.sum_attributions, flat.sum(1))
    np.testing.assert_allclose(host.features.mean_abs, np.abs(flat).mean(0), rtol=4 * np.finfo(float).eps)
    np.testing.assert_allclose(host.features.stddev, flat.std(0), rtol=64 * np.finfo(float).eps)
    np.testing.assert_allclose(host.group_attributions, flat.reshape(7, 2, 3).sum(2), rtol=4 * np.finfo(float).eps)
    assert host.num_states == 7 and host.num_features == 6 and host.feature_shape == (2, 3)
    assert not host.non_finite.any() and host.stochastic is False and host.n_steps == 16


def test_a_padded_uneven_split_gathers_in_one_call_to_the_one_process_result():
    states = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    world, share = 2, 3  # ranks attribute rows [0, 1, 2] and [3, 4, 4] (the last state repeated as padding)
    shares = [_result(states[[0, 1, 2]]), _result(states[[3, 4, 4]])]
    calls = []

    def all_gather(packed: torch.Tensor) -> torch.Tensor:  # what trainer.strategy.all_gather returns: (world, ...)
        calls.append(tuple(packed.shape))
        return torch.stack([pack(result)[0] for result in shares])

    gathered = HostResult.from_result(shares[0], gather=all_gather, num_states=5, keep_attributions=True)
    single = HostResult.from_result(_result(states), keep_attributions=True)
    assert calls == [(share, 4 + 10)]  # one collective, the same shape on every rank
    assert gathered.num_states == 5  # the padding row is gone
    # the per-state error figures ride along; near-baseline flags come from the median over all gathered states
    assert_close_scaled(gathered.attribution_error, single.attribution_error, ulps=64)
    assert_close_scaled(gathered.mass_relative_error, single.mass_relative_error, ulps=64)
    assert gathered.near_baseline.tolist() == single.near_baseline.tolist()
    assert gathered.worst_attribution_error == pytest.approx(single.worst_attribution_error, rel=1e-6)
    scale = float(np.abs(single.attributions).max())
    assert_close_scaled(gathered.attributions, single.attributions, ulps=64, scale=scale)
    assert_close_scaled(gathered.features.mean_abs, single.features.mean_abs, ulps=64, scale=scale)
    assert_close_scaled(gathered.f_input, single.f_input, ulps=64)
    assert world * share - gathered.num_states == 1


def test_non_finite_states_come_from_the_engine_flag_or_the_numbers():
    states = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    result = _result(states)
    result.f_input[1] = math.nan
    host = HostResult.from_result(result)
    assert host.non_finite.tolist() == [False, True, False]
    assert not host.degenerate[1]  # never both: a NaN state is not "too small to judge"


def test_each_target_is_refused_with_what_to_do():
    states = torch.randn(3, 4)
    result = integrated_gradients(lambda x: torch.stack([x.sum(1), x.prod(1)], 1), states, target="each", n_steps=4)
    with pytest.raises(ValueError, match="for target='each' build one report per action"):
        HostResult.from_result(result)


def test_moments_are_population_statistics():
    values = np.array([[1.0, -2.0], [3.0, 2.0]])
    moments = Moments.of(values)
    assert moments.mean_abs.tolist() == [2.0, 2.0]
    assert moments.mean_signed.tolist() == [2.0, 0.0]
    assert moments.stddev.tolist() == [1.0, 2.0]
