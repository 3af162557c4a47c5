"""trust/sanity.py: passes on a trained network, fails at init and on a weight-independent map."""

from __future__ import annotations

import math

import pytest
import scipy.stats
import torch
from torch import nn

from lightning_ig.trust import common, sanity
from lightning_ig.trust.faithfulness import deletion_check
from lightning_ig.trust.sanity import randomization_check, randomization_reference
from lightning_ig.trust.stability import stability_check
from lightning_ig.views.text import verdict_words
from tests.support.tolerance import rounding_bound
from tests.support.trust import (
    FEATURES,
    SCALES,
    SETTINGS,
    InputDriven,
    assert_unchanged,
    attribute,
    reinitialised_copy,
    snapshot,
)


def test_rank_correlation_is_spearman_with_ties_and_exclusions():
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(0, 5, (40,), generator=generator).double().numpy()  # many ties
    second = first + torch.randint(0, 3, (40,), generator=generator).double().numpy()
    include = (torch.rand(40, generator=generator) > 0.3).numpy()
    expected = scipy.stats.spearmanr(first[include], second[include]).statistic
    got = common.rank_correlation(first, second, include)
    assert abs(got - expected) <= rounding_bound(1.0, ulps=64, dtype=torch.float64)


def test_rank_correlation_is_nan_when_undefined():
    values = torch.arange(5.0).double().numpy()
    everything = values == values
    assert math.isnan(common.rank_correlation(values * 0 + 1, values, everything))  # a constant side
    assert math.isnan(common.rank_correlation(values, values, values == 0))  # one unit
    broken = values.copy()
    broken[2] = math.nan
    assert math.isnan(common.rank_correlation(broken, values, everything))
    rho = common.rank_correlation(broken, values, values != 2)  # a NaN left out does not count
    assert abs(rho - 1.0) <= rounding_bound(1.0, ulps=8, dtype=torch.float64)


def test_sanity_passes_on_a_trained_network_and_fails_at_init(trained, untrained):
    model, states = trained
    reference = randomization_reference(model, states, settings=SETTINGS)
    result = randomization_check(attribute(model, states), reference)
    assert result.resolved and result.num_units == FEATURES
    assert result.passed, result
    assert result.randomization_rank_correlation < result.copy_rank_correlation - sanity.SANITY_MARGIN
    assert result.reason is None and result.note is None
    assert set(result.scalars()) >= {"sanity/randomization_rank_correlation", "sanity/copy_rank_correlation"}

    model, states = untrained
    reference = randomization_reference(model, states, settings=SETTINGS)
    result = randomization_check(attribute(model, states), reference)
    assert result.resolved
    assert not result.passed  # an untrained network ranks like its re-initialised copies
    assert "sanity" in result.reason and f"{result.randomization_rank_correlation:.3f}" in result.reason


@pytest.mark.parametrize("num_features", [4, 16])
def test_sanity_fails_on_a_weight_independent_map(num_features):
    model = InputDriven().eval()
    states = torch.randn(32, num_features, generator=torch.Generator().manual_seed(1)) * SCALES[:num_features]
    reference = randomization_reference(model, states, settings=SETTINGS)
    result = randomization_check(attribute(model, states), reference)
    # every copy's map is mean(w') x^2: the same ranking, so rho is 1 up to rounding
    one = 1 - rounding_bound(1.0, ulps=64, dtype=torch.float64)
    assert result.randomization_rank_correlation >= one and result.copy_rank_correlation >= one
    assert result.resolved == (num_features >= sanity.SANITY_MIN_UNITS)
    assert not result.passed


def test_sanity_with_few_units_applies_only_the_ceiling_and_says_so(untrained):
    model, states = untrained
    groups = torch.arange(FEATURES) // (FEATURES // 4)  # 4 groups
    reference = randomization_reference(model, states, settings=SETTINGS, groups=groups)
    units = common.unit_sums(attribute(model, states).view_as(states), common.resolve_groups(groups, states))
    result = randomization_check(units, reference)
    assert reference.num_units == 4 and not result.resolved
    assert result.threshold == sanity.SANITY_CEILING
    assert result.passed == (result.randomization_rank_correlation < sanity.SANITY_CEILING - common.ROUNDING)
    assert result.note is not None and "4 units" in result.note


def test_sanity_fails_on_constant_or_non_finite_attributions(trained):
    model, states = trained
    reference = randomization_reference(model, states, settings=SETTINGS, num_copies=2)
    for units in (torch.ones_like(states), torch.full_like(states, math.nan)):
        result = randomization_check(units, reference)
        assert math.isnan(result.randomization_rank_correlation)
        assert not result.passed and "undefined" in result.reason
        # the closing line's short form (the reason cut at its first comma) must not call NaN attributions constant
        entry = {"global_step": 1, "verdict": "pass", "trust": "failed", "trust_reasons": [result.reason]}
        assert "constant or NaN/Inf)" in verdict_words(entry)


def test_sanity_reference_is_deterministic_and_leaves_everything_as_it_was(trained):
    model, states = trained
    model.train()  # a training-mode model, as the callback meets it
    model.value[0].disable_noise()  # and one layer's switch off
    try:
        before = snapshot(model)
        first = randomization_reference(model, states, settings=SETTINGS, seed=3)
        assert_unchanged(model, before)
        with torch.inference_mode():  # Lightning may call with gradients off
            second = randomization_reference(model, states, settings=SETTINGS, seed=3)
        assert_unchanged(model, before)
    finally:
        model.value[0].enable_noise()
        model.eval()
    assert (first.copy_means == second.copy_means).all()
    assert first.pair_rank_correlations == second.pair_rank_correlations
    other = randomization_reference(model, states, settings=SETTINGS, seed=4)
    assert not (first.copy_means == other.copy_means).all()


def test_reinitialised_copy_uses_each_layers_own_initialisation_and_shares_the_rest():
    class WithExtras(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(6, 3)
            self.raw = nn.Parameter(torch.arange(12.0))  # no reset_parameters(): shuffled
            self.scale = nn.Parameter(torch.tensor(2.5))  # one number: kept
            self.replay = [object()]  # not part of the model: shared, never copied

    model = WithExtras()
    before = snapshot(model)
    clone, shuffled, kept = reinitialised_copy(model, seed=7)
    assert_unchanged(model, before)
    expected = nn.Linear(6, 3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        expected.reset_parameters()
    assert torch.equal(clone.linear.weight, expected.weight) and torch.equal(clone.linear.bias, expected.bias)
    assert (shuffled, kept) == (1, 1)
    assert torch.equal(clone.raw.sort().values, model.raw) and not torch.equal(clone.raw, model.raw)
    assert torch.equal(clone.scale, model.scale)
    assert clone.replay is model.replay
    assert not any(parameter.requires_grad for parameter in clone.parameters())
    assert all(parameter.requires_grad for parameter in model.parameters())


def test_randomization_check_refuses_mismatched_inputs(trained):
    model, states = trained
    reference = randomization_reference(model, states, settings=SETTINGS, num_copies=2, num_states=4)
    with pytest.raises(ValueError, match="32 states"):
        randomization_check(attribute(model, states)[:8], reference)
    with pytest.raises(TypeError, match="RandomizationReference"):
        randomization_check(attribute(model, states), "reference")
    with pytest.raises(ValueError, match="num_copies"):
        randomization_reference(model, states, settings=SETTINGS, num_copies=1)
    with pytest.raises(TypeError, match="settings"):
        randomization_reference(model, states, settings={"target": 0})


def test_a_correlation_on_a_bound_up_to_rounding_is_on_it():
    """Over 4 features Spearman's 0.8 comes out a few ulps off 0.8: not below a ceiling of 0.8."""
    model = InputDriven().eval()
    states = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) * SCALES[:4]
    reference = randomization_reference(model, states, settings=SETTINGS)
    swapped = attribute(model, states)[:, [0, 1, 3, 2]]  # one adjacent swap against every copy: rho = 0.8
    result = randomization_check(swapped, reference, ceiling=0.8)
    assert abs(result.randomization_rank_correlation - 0.8) <= common.ROUNDING
    assert not result.passed


def test_a_copy_calls_its_own_weights_when_the_forward_is_an_instance_attribute():
    """Under DDP Lightning keeps the LightningModule's ``forward`` as an instance attribute: a shared one would make
    every re-initialised copy (and every noisy copy) compute with the original's weights."""
    model = nn.Sequential(nn.Linear(3, 2))
    model.forward = model.forward  # a bound method of the original, in the instance's __dict__
    model.replay = [object()]
    clone, _, _ = reinitialised_copy(model, seed=1)
    x = torch.ones(1, 3)
    assert clone.forward.__self__ is clone and clone.replay is model.replay
    assert torch.equal(clone(x), clone[0](x)) and not torch.equal(clone(x), model(x))


def test_a_reference_whose_copies_cannot_be_compared_is_unresolved_not_a_crash():
    # guards against: AttributeError 'float' object has no attribute 'numerator' (statistics.pstdev of NaN pairs)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    states = torch.zeros(5, 4)  # every state at the baseline: no unit moves, every correlation undefined
    check = randomization_check(torch.zeros(5, 4), randomization_reference(model, states))
    assert not check.resolved and not check.passed and math.isnan(check.pair_spread)


class _Sampling(torch.nn.Module):
    """A forward that samples even in eval mode (torch's global generator)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + 0.0 * torch.rand_like(x[:, :2])


def test_the_checks_leave_the_callers_generators_as_they_were():
    # guards against: randomization_reference and stability_check drawing from torch's global generator when called
    # directly (only the callback kept them); a seed past 64 bits is refused by name
    model, states, units = _Sampling(), torch.randn(6, 4), torch.rand(6, 4)
    for check in (
        lambda: randomization_reference(model, states, num_states=2),
        lambda: stability_check(model, states, None, units),
        lambda: deletion_check(model, states, None, units),
    ):
        before = torch.get_rng_state()
        check()
        assert torch.equal(before, torch.get_rng_state())
    with pytest.raises(ValueError, match="seed"):
        randomization_reference(model, states, seed=2**64 - 1)
