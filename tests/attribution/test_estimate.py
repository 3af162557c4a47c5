"""The error figures (lightning_ig/attribution/estimate.py) on ReLU networks whose kinks are known exactly.

Along the path ``alpha x`` (zero baseline) the network ``sum_i c_i relu(z_i - k_i)`` has feature ``i``'s kink at
``alpha = k_i / x_i``, so its exact attributions are ``c_i (x_i - k_i)`` for ``x_i > k_i``, and a quadrature rule's
error is known in closed form: the rule gives feature ``i`` the weights of its nodes past the kink.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.estimate import NOISE
from lightning_ig.attribution.exact_line import midpoint_reference
from lightning_ig.attribution.quadrature import quadrature
from lightning_ig.run.statistics import accuracy_verdict
from tests.support.models import kinked_relu, kinked_relu_attributions, seeded_mlp
from tests.support.tolerance import assert_close_scaled, eps, state_errors

F64 = torch.float64


def _rule_attributions(x: torch.Tensor, kinks: list[float], signs: list[float], method: str, n: int) -> torch.Tensor:
    """What the rule gives, in closed form: each feature's weights of the nodes past its kink."""
    alphas, weights = (torch.tensor(v, dtype=F64) for v in quadrature(method, n))
    k, c = torch.tensor(kinks, dtype=F64), torch.tensor(signs, dtype=F64)
    past = (alphas.view(-1, 1, 1) * x > k).to(F64)  # (n, B, F)
    return c * x * (weights.view(-1, 1, 1) * past).sum(0)


def _one_kink_per_stretch(x: torch.Tensor, kinks: list[float], method: str, n: int) -> bool:
    """Every kink between two neighbouring nodes, alone there (the end pieces hold none): the estimate's model."""
    alphas = np.asarray(quadrature(method, n)[0])
    places = np.asarray(kinks) / x.numpy()  # (B, F)
    stretch = np.searchsorted(alphas, places)  # 0: before the first node, n: after the last
    inner = (stretch > 0) & (stretch < n)
    return bool(inner.all()) and all(len(set(row)) == len(row) for row in stretch.tolist())


KINKS, SIGNS = [0.23, 0.41, 0.77], [1.0, -2.0, 0.5]
STATES = torch.tensor([[1.0] * 3, [1.1] * 3, [1.2] * 3], dtype=F64)


@pytest.mark.parametrize("method", ["riemann_middle", "gausslegendre"])
def test_one_kink_per_stretch_the_estimate_is_the_true_error(method: str) -> None:
    n = 8
    assert _one_kink_per_stretch(STATES, KINKS, method, n)  # the case the estimate models exactly
    result = integrated_gradients(kinked_relu(KINKS, SIGNS), STATES, target="mean", n_steps=n, method=method)
    expected = _rule_attributions(STATES, KINKS, SIGNS, method, n)
    assert_close_scaled(result.attributions, expected, ulps=16, dtype=F64)
    error = (result.attributions - kinked_relu_attributions(STATES, KINKS, SIGNS)).abs().sum(1)  # ||a - a_exact||_1
    assert float(error.min()) > 0  # the rule is off: there is something to estimate
    mass = result.attributions.abs().sum(1)
    # the relative estimate is ||e||_1 / ||a||_1 with ||e||_1 the true L1 error, to rounding of sums of n terms
    assert_close_scaled(result.attribution_error * mass, error, ulps=16 * n, dtype=F64, scale=float(mass.max()))


def test_kinks_whose_completeness_errors_cancel_are_seen_by_the_estimate() -> None:
    # Two kinks exactly one cell apart, with opposite signs: their rule errors are equal and cancel in sum(a), so
    # completeness is exact at every n that keeps them a whole number of cells apart, while each feature is off.
    n = 32
    kinks, signs = [0.3, 0.3 + 1 / n], [1.0, -1.0]
    x = torch.ones(1, 2, dtype=F64)
    result = integrated_gradients(kinked_relu(kinks, signs), x, target="mean", n_steps=n, method="riemann_middle")
    mass = float(result.attributions.abs().sum())
    assert abs(float(result.delta[0])) <= 4 * n * eps(F64) * mass  # completeness reads (almost) exact
    assert float(result.mass_relative_error[0]) <= 4 * n * eps(F64)
    error = float((result.attributions - kinked_relu_attributions(x, kinks, signs)).abs().sum())
    assert error > 0.01 * mass  # yet the map is more than 1% off
    assert float(result.attribution_error[0]) * mass == pytest.approx(error, rel=16 * n * eps(F64))
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01)
    assert verdict.within is False and verdict.figure == "attribution_error"


def test_auto_goes_on_where_completeness_is_exact_but_the_estimate_is_not_within() -> None:
    # Cancelling kinks one cell apart: 1/56 is 3/168 and 9/504, so completeness stays exact at every level; the old
    # engine stopped at its first level. "auto" refines until the estimate is within tol / 2.
    kinks, signs = [0.3, 0.3 + 1 / 56], [1.0, -1.0]
    x = torch.ones(2, 2, dtype=F64)
    tol = 0.01
    result = integrated_gradients(
        kinked_relu(kinks, signs), x, target="mean", n_steps="auto", method="riemann_middle", completeness_tol=tol
    )
    assert result.n_steps > 56 and result.n_steps_per_state.tolist() == [result.n_steps] * 2
    assert float(result.attribution_error.max()) <= tol / 2
    true = (result.attributions - kinked_relu_attributions(x, kinks, signs)).abs().sum(1) / kinked_relu_attributions(
        x, kinks, signs
    ).abs().sum(1)
    assert float(true.max()) <= tol
    coarser = integrated_gradients(
        kinked_relu(kinks, signs), x, target="mean", n_steps=result.n_steps // 3, method="riemann_middle"
    )
    assert float(coarser.attribution_error.max()) > tol / 2  # and it stopped at the first level that was within


class _Cubic(torch.nn.Module):
    """``sum_i c_i z_i^3``: along ``alpha x`` each path term is ``3 c_i x_i^3 alpha^2``, a quadratic."""

    def __init__(self, coefficients: list[float]) -> None:
        super().__init__()
        self.c = torch.nn.Parameter(torch.tensor(coefficients, dtype=F64))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (self.c * z**3).sum(-1)


@pytest.mark.parametrize("method", ["riemann_middle", "riemann_trapezoid", "gausslegendre", "riemann_left"])
def test_on_a_smooth_integrand_the_curvature_term_is_the_true_error(method: str) -> None:
    # Quadratic path terms: the quadratic through each node and its neighbours is the integrand itself, so the
    # curvature model's error is exact for any rule (the midpoint rule's is -c x^3 / (4 n^2) per feature), and the
    # roughness of a quadratic sampled at 16 nodes is far below the smooth threshold: no kink term is added.
    n, coefficients = 16, [1.0, -2.0, 0.5]
    x = torch.tensor([[1.0, 0.8, 1.3], [0.5, 1.2, -0.7]], dtype=F64)
    result = integrated_gradients(_Cubic(coefficients), x, n_steps=n, method=method)
    exact = torch.tensor(coefficients, dtype=F64) * x**3
    error = (result.attributions - exact).abs().sum(1)
    if method != "gausslegendre":  # 16 Gauss-Legendre nodes integrate a quadratic exactly: both read ~0 there
        assert float(error.min()) > 1e-6 * float(exact.abs().sum(1).max())
    mass = result.attributions.abs().sum(1)
    assert_close_scaled(result.attribution_error * mass, error, ulps=64 * n, dtype=F64, scale=float(mass.max()))


def test_the_accumulations_rounding_is_part_of_the_estimate() -> None:
    # A linear model: every rule is exact, so a float32 result is off by the rounding of its float32 sum only;
    # the estimate is that rounding, measured against the same gradients summed in float64.
    torch.manual_seed(3)
    model = torch.nn.Linear(6, 1)
    x = torch.randn(5, 6)
    result = integrated_gradients(model, x, target=0, n_steps=50, method="riemann_middle")
    summed = (
        x.double() * model.weight.detach().double().squeeze(0) * torch.tensor(quadrature("riemann_middle", 50)[1]).sum()
    )
    rounding = (result.attributions.double() - summed).abs().sum(1)
    assert float(rounding.max()) > 0  # 1/50 is not a float: the float32 sum rounds
    mass = result.attributions.double().abs().sum(1)
    # the curvature term of a constant integrand is its stencil's sum, zero to float32 rounding of the stencil
    assert_close_scaled(result.attribution_error.double() * mass, rounding, ulps=64, scale=float(mass.max()))


@pytest.mark.parametrize("seed", [0, 4])
def test_a_smooth_network_at_rounding_level_is_read_within_2x(seed: int) -> None:
    # A tanh MLP at init on 4 features at 256 midpoint nodes (the GPU's default): the rule's error vector and the
    # sums' rounding are of one size. Their norms added read 1.1-1.3x the truth at the median and up to 6x, within 2x
    # on 81-94% of the states; the two as one vector cancel where the real ones do (98-100%)
    net = seeded_mlp(4, 3, seed=seed, hidden=64, dtype=torch.float32)
    states = torch.randn(48, 4)
    result = integrated_gradients(net, states, target="mean", method="riemann_middle", n_steps=256)
    error = state_errors(result.attributions, midpoint_reference(net, states, target="mean").attributions)
    assert float(error.max()) < 64 * eps(torch.float32)  # the case: rounding-level truths
    ratio = result.attribution_error.double() / error
    assert float(((ratio >= 0.5) & (ratio <= 2.0)).double().mean()) >= 0.95
    assert float(ratio[error.argmax()]) >= 0.5


@pytest.mark.parametrize("seed", [0, 1])
def test_three_gauss_legendre_nodes_are_not_read_exact(seed: int) -> None:
    # Three nodes hold one quadratic, which Gauss-Legendre integrates exactly: the curvature model read 0 there (8e-8
    # against a true 0.6-0.9%, a false "within" at tol 1%); under four nodes the path now reads as kinked
    net = seeded_mlp(5, 3, seed=seed, dtype=torch.float32)
    states = torch.randn(8, 5) * 2
    result = integrated_gradients(net, states, target="mean", method="gausslegendre", n_steps=3)
    error = state_errors(result.attributions, midpoint_reference(net, states, target="mean").attributions)
    assert float(error.max()) > 1e-3
    assert float(result.attribution_error[error.argmax()]) >= 0.5 * float(error.max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["kink_midpoint", "riemann_middle"])
def test_a_half_precision_forward_is_not_read_at_float32s_rounding(dtype: torch.dtype, method: str) -> None:
    # The gradients of a bfloat16 forward carry its rounding (a tanh MLP: 0.24-0.4% off at 64 points), which the
    # float32 sums' figures do not see: the kink rule read 1.6e-5 (0.00x the truth), the midpoint rule 0.43x
    net = seeded_mlp(6, 3, seed=0, hidden=32, dtype=dtype)
    states = torch.randn(16, 6).to(dtype)
    result = integrated_gradients(net, states, target="mean", method=method, n_steps=64)
    error = state_errors(result.attributions, midpoint_reference(net, states, target="mean").attributions)
    assert float(error.max()) > 64 * eps(torch.float32)  # the case: the forward's rounding, not float32's
    assert float((result.attribution_error.double() / error).min()) >= 0.5


def test_a_pulse_between_two_nodes_is_seen_and_rounding_does_not_add_up_over_the_nodes() -> None:
    # Feature 0 feeds two units whose kinks, 0.3004 and 0.3010, lie between the same two nodes with opposite
    # effects (a pulse: the gradient changes and changes back, equal at every node); feature 1 has one kink at 0.6.
    # An output offset of 1000 makes the float32 forward values' rounding (~1e-4 each) large next to the rule's
    # error: summed over the 1023 stretches, most without a jump, it would read 3x the truth; summed per run of
    # such stretches (the values telescope) it stays within 2x, and the pulse is still counted.
    n = 1024
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        net[0].bias.copy_(-torch.tensor([0.3004, 0.3010, 0.462]))  # feature 1 (x = 0.77) kinks at alpha = 0.6
        net[2].weight.copy_(torch.tensor([[1.3, -1.3, 1.7]]))  # slopes whose steps are not float32 multiples
        net[2].bias.fill_(1000.0)
    x = torch.tensor([[1.0, 0.77]])
    k, c = -net[0].bias.detach().double(), net[2].weight.detach().double()[0]  # as float32 holds them
    exact = torch.stack([c[0] * (k[1] - k[0]), c[2] * (x[0, 1].double() - k[2])]).view(1, 2)
    result = integrated_gradients(net, x, target="mean", n_steps=n)
    assert float(result.attributions[0, 0]) == 0.0  # no node sees the pulse
    true = float((result.attributions.double() - exact).abs().sum() / exact.abs().sum())
    assert true > 1e-3
    assert 0.5 * true <= float(result.attribution_error[0]) <= 2 * true


def test_mass_relative_error_is_well_conditioned_where_dF_is_tiny() -> None:
    # Two kinks 5e-4 apart in one cell, opposite signs: F(x) - F(b) = 5e-4 is 4e-4 of the attribution mass, so the
    # ratio |delta| / |dF| reads 100% for a map whose sum is off by 5e-4; the mass-relative figure reads 4e-4.
    n = 32
    kinks, signs = [0.3, 0.3005], [1.0, -1.0]
    x = torch.ones(1, 2, dtype=F64)
    result = integrated_gradients(kinked_relu(kinks, signs), x, target="mean", n_steps=n, method="riemann_middle")
    mass = float(result.attributions.abs().sum())
    delta, change = float(result.delta[0]), float(result.f_input[0] - result.f_baseline[0])
    assert abs(change) < 0.01 * mass and float(result.relative_error[0]) > 0.5
    rounding = NOISE * eps(F64) * float(result.f_input[0].abs() + result.f_baseline[0].abs())  # the values' own
    expected = (abs(delta) - rounding) / max(mass, abs(change))
    assert float(result.mass_relative_error[0]) == pytest.approx(expected, rel=16 * eps(F64))
    assert float(result.mass_relative_error[0]) < 0.01 * float(result.relative_error[0])


def test_near_baseline_states_are_flagged_and_left_out_of_the_worst() -> None:
    forward = kinked_relu(KINKS, SIGNS)
    near = torch.tensor([[0.3, 0.45, 0.78]], dtype=F64)  # just past each kink: a tiny map (x - k = 0.01-0.07)
    x = torch.cat([STATES, near])
    result = integrated_gradients(forward, x, target="mean", n_steps=8, method="riemann_middle")
    mass = result.attributions.abs().sum(1)
    assert float(mass[-1]) < 0.1 * float(mass.median())
    assert result.near_baseline.tolist() == [False, False, False, True] and result.num_near_baseline == 1
    ordinary = result.attribution_error[:3]
    assert result.worst_attribution_error == float(ordinary.max())
    assert result.worst_mass_relative_error == float(result.mass_relative_error[:3].max())


@pytest.mark.parametrize("tol", [1e-3, 0.01, 0.2])
def test_the_verdict_flips_at_sqrt2_tol(tol: float) -> None:
    threshold = math.sqrt(2) * tol
    below, above = threshold * (1 - 4 * eps(F64)), threshold * (1 + 4 * eps(F64))
    for estimate, mass_relative, figure in [(below, 0.0, "attribution_error"), (0.0, below, "mass_relative_error")]:
        verdict = accuracy_verdict(estimate, mass_relative, tol)
        assert verdict.within is True and verdict.figure == figure and verdict.threshold == threshold
    for estimate, mass_relative, figure in [(above, 0.0, "attribution_error"), (0.0, above, "mass_relative_error")]:
        verdict = accuracy_verdict(estimate, mass_relative, tol)
        assert verdict.within is False and verdict.figure == figure and verdict.value == above
        assert figure.split("_")[0] in verdict.reason


def test_the_verdict_on_nothing_checkable_and_on_nan_inf() -> None:
    nothing = accuracy_verdict(math.nan, math.nan, 0.01)
    assert nothing.within is None and nothing.figure == "none"
    for bad in (math.inf, math.nan):
        verdict = accuracy_verdict(0.001, bad, 0.01)
        assert verdict.within is False and verdict.figure == "mass_relative_error"
        assert accuracy_verdict(bad, 0.001, 0.01).figure == "attribution_error"
    with pytest.raises(ValueError, match="tol"):
        accuracy_verdict(0.001, 0.001, 0.0)
    with pytest.raises(TypeError, match="tol"):
        accuracy_verdict(0.001, 0.001, "0.01")


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.ReLU])
@pytest.mark.parametrize("scale", [1e-4, 1e-6])
@pytest.mark.parametrize("method", ["auto", "kink_midpoint", "riemann_middle"])
def test_states_close_to_the_baseline_read_their_rounding_not_kinks(activation, scale: float, method: str) -> None:
    # The path is nearly constant: its gradients differ by rounding (read as kinks before the noise floor) and
    # F(x) - F(b) is within the values' rounding (which the mass-relative figure read as a completeness failure).
    torch.manual_seed(5)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 32), activation(), torch.nn.Linear(32, 32), activation(), torch.nn.Linear(32, 3)
    ).eval()
    states = torch.randn(16, 6) * scale
    result = integrated_gradients(net, states, target="mean", method=method, n_steps=56)
    exact = midpoint_reference(net, states, target="mean").attributions
    truth = (result.attributions.double() - exact).abs().sum(1) / exact.abs().sum(1)
    floor = 256 * eps()  # float32's rounding of a sum of a few hundred terms, relative
    assert float(truth.max()) < floor and result.num_degenerate == 16
    assert result.worst_attribution_error < floor and result.worst_mass_relative_error < floor
    assert accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01).within is True


def test_gauss_legendre_where_float32_merges_nodes_keeps_a_finite_estimate() -> None:
    # 15000 nodes: the last two round to the same float32 (the curvature stencil divided by their zero distance)
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)).eval()
    result = integrated_gradients(net, torch.randn(2, 6), target="mean", method="gausslegendre", n_steps=15000)
    assert torch.isfinite(result.attribution_error).all() and result.num_non_finite == 0
    assert 0 < result.worst_attribution_error < 0.01


@pytest.mark.parametrize("method", ["auto", "kink_midpoint", "riemann_middle", "gausslegendre"])
def test_float32_outputs_past_1e19_keep_a_finite_estimate(method: str) -> None:
    # The figures' squares overflowed float32 to inf past about 1e19 (every output finite). Outputs scaled by a power
    # of two scale every node exactly, so the relative estimate is the unscaled one to rounding.
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).eval()
    states = torch.randn(16, 4)
    plain = integrated_gradients(net, states, target=0, method=method, n_steps=64)
    with torch.no_grad():
        net[2].weight.mul_(2.0**90)  # about 1.2e27
        net[2].bias.mul_(2.0**90)
    scaled = integrated_gradients(net, states, target=0, method=method, n_steps=64)
    assert float(scaled.f_input.abs().max()) > 1e26 and scaled.num_non_finite == 0
    assert torch.isfinite(scaled.attribution_error).all()
    torch.testing.assert_close(scaled.attribution_error, plain.attribution_error, rtol=64 * eps(), atol=0)
