"""The kink rule (lightning_ig/attribution/kinks.py) on networks whose kinks and integrals are known exactly.

Along the path ``alpha x`` (zero baseline) the network ``sum_i c_i relu(z_i - k_i)`` has feature ``i``'s kink at
``alpha = k_i / x_i`` and exact attributions ``c_i (x_i - k_i)`` for ``x_i > k_i``.
"""

from __future__ import annotations

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from lightning_ig.attribution.exact_line import midpoint_reference
from lightning_ig.run.statistics import accuracy_verdict
from tests.support.models import kinked_relu, kinked_relu_attributions, seeded_mlp
from tests.support.tolerance import assert_close_scaled, eps, state_errors

F64 = torch.float64


KINKS, SIGNS = [0.23, 0.41, 0.77], [1.0, -2.0, 0.5]
STATES = torch.tensor([[1.0] * 3, [1.1] * 3, [1.2] * 3], dtype=F64)


def test_one_kink_per_stretch_is_corrected_to_the_exact_integral() -> None:
    # At 12 midpoint nodes each kink sits alone between two nodes, and ceil(12 / 4) = 3 stretches are certified per
    # state: the certificate confirms each, and the corrected rule is the exact integral; the plain midpoint rule on
    # the same gradients is visibly off.
    forward = kinked_relu(KINKS, SIGNS)
    result = integrated_gradients(forward, STATES, target="mean", n_steps=12)
    plain = integrated_gradients(forward, STATES, target="mean", n_steps=12, method="riemann_middle")
    exact = kinked_relu_attributions(STATES, KINKS, SIGNS)
    assert result.method == "kink_midpoint" and result.n_steps == 12
    mass = float(exact.abs().sum(1).max())
    assert float((plain.attributions - exact).abs().max()) > 1e-3 * mass
    assert_close_scaled(result.attributions, exact, ulps=64, dtype=F64, scale=mass)
    assert float(result.attribution_error.max()) <= 1e3 * eps(F64)  # nothing left: rounding only
    assert float(result.mass_relative_error.max()) <= 1e3 * eps(F64)


def test_two_kinks_in_one_stretch_are_partly_corrected_and_the_estimate_says_so() -> None:
    # Kinks at 0.26 and 0.31 lie between the nodes 0.1875 and 0.3125 (n = 8): one kink explains the stretch only in
    # part, the certificate's value misses by part of the residual, the stretch keeps the rest of its error and the
    # estimate reads it within a factor of two.
    kinks, signs = [0.26, 0.31, 0.7], [1.0, 1.5, 0.8]
    x = torch.ones(1, 3, dtype=F64)
    result = integrated_gradients(kinked_relu(kinks, signs), x, target="mean", n_steps=8)
    exact = kinked_relu_attributions(x, kinks, signs)
    true = float((result.attributions - exact).abs().sum() / exact.abs().sum())
    assert true > 1e-3  # not corrected: there is an error to estimate
    assert 0.5 * true <= float(result.attribution_error[0]) <= 2 * true


def test_two_kinks_of_opposite_slope_changes_in_one_stretch_are_not_read_as_exact() -> None:
    # Kinks at 0.496 (slope +1) and 0.504 (slope -0.25) lie between the nodes 0.4911 and 0.5089 (n = 56); the outer
    # lines cross at 0.4933, before both kinks, where the value lies on the left line and so on both: the check there
    # passes and alone read the stretch as exact (7.8e-16 against a true 0.85%). The second value, halfway from
    # there to the stretch's far end (0.5011, between the kinks), misses, and the error is kept and estimated.
    kinks, signs = [0.496, 0.504], [1.0, -0.25]
    x = torch.ones(1, 2, dtype=F64)
    result = integrated_gradients(kinked_relu(kinks, signs), x, target=0, n_steps=56)
    exact = kinked_relu_attributions(x, kinks, signs)
    true = float((result.attributions - exact).abs().sum() / exact.abs().sum())
    assert result.method == "kink_midpoint" and true > 1e-3
    assert float(result.attribution_error[0]) >= 0.25 * true


class _Doubled(torch.autograd.Function):
    """The identity whose backward doubles the gradient: a broken straight-through estimator."""

    @staticmethod
    def forward(ctx: object, z: torch.Tensor) -> torch.Tensor:
        return z.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return 2 * grad


def test_a_wrong_gradient_fails_the_verdict() -> None:
    # The values say one thing, the gradients twice as much: whatever the certificates let through, the sum is off
    # by about |F(x) - F(b)| and the mass-relative error fails every state.
    net = kinked_relu(KINKS, SIGNS)
    result = integrated_gradients(lambda z: net(_Doubled.apply(z)), STATES, target="mean", n_steps=16)
    change = (result.f_input - result.f_baseline).abs()
    assert bool((result.mass_relative_error > 0.5 * change / result.attribution_mass).all())
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01)
    assert verdict.within is False


class _Cubic(torch.nn.Module):
    """``sum_i c_i z_i^3``: smooth; each path term is a quadratic in ``alpha``."""

    def __init__(self, coefficients: list[float]) -> None:
        super().__init__()
        self.c = torch.nn.Parameter(torch.tensor(coefficients, dtype=F64))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (self.c * z**3).sum(-1)


def test_a_smooth_path_gets_the_end_corrected_weights() -> None:
    # No kinks: the roughness reads smooth and the weights exact to degree 7 integrate the quadratic path terms
    # exactly, where the midpoint rule is off by c x^3 / (4 n^2) per feature.
    x = torch.tensor([[1.0, 0.8, 1.3], [0.5, 1.2, -0.7]], dtype=F64)
    coefficients = [1.0, -2.0, 0.5]
    result = integrated_gradients(_Cubic(coefficients), x, n_steps=16)
    exact = torch.tensor(coefficients, dtype=F64) * x**3
    mass = float(exact.abs().sum(1).max())
    assert_close_scaled(result.attributions, exact, ulps=256, dtype=F64, scale=mass)
    plain = integrated_gradients(_Cubic(coefficients), x, n_steps=16, method="riemann_middle")
    assert float((plain.attributions - exact).abs().max()) > 1e-4 * mass
    assert float(result.attribution_error.max()) < 1e-6


def test_a_sharp_smooth_path_gets_no_kink_corrections() -> None:
    # log cosh(50 (z0 - c)): a smooth transition about one node spacing wide at 56 nodes (roughness 0.79-0.82, what
    # a trained tanh agent's sharpest states read). No kink is there to locate: the corrections the values seem to
    # certify made the rule 5x worse than the plain midpoint rule on the same gradients when such states counted
    # as half kinked.
    c = torch.linspace(0.3, 0.7, 16, dtype=F64)
    x = torch.stack([torch.ones_like(c), c], 1)
    b = torch.stack([torch.zeros_like(c), c], 1)  # only feature 0 moves along the path

    def forward(z: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.cosh(50.0 * (z[:, 0] - z[:, 1]))) + 0.1 * z[:, 0]

    exact = torch.log(torch.cosh(50.0 * (1 - c))) - torch.log(torch.cosh(-50.0 * c)) + 0.1
    kink = integrated_gradients(forward, x, b, n_steps=56, method="kink_midpoint")
    plain = integrated_gradients(forward, x, b, n_steps=56, method="riemann_middle")
    kink_error = float(((kink.attributions[:, 0] - exact).abs() / exact.abs()).max())
    plain_error = float(((plain.attributions[:, 0] - exact).abs() / exact.abs()).max())
    assert plain_error > 1e-5  # the path is resolved only roughly at 56 nodes
    assert kink_error <= 1.05 * plain_error
    assert float(kink.attribution_error.max()) >= 0.5 * kink_error  # and the estimate does not read it low


@pytest.mark.parametrize("seed", [0, 2])
def test_a_saturated_tanh_network_is_not_read_low(seed: int) -> None:
    # Weights 8x their init: tanh units switch within about a node spacing (roughness 0.4-0.7), the end-corrected
    # weights' figure alone read the worst states at 0.24-0.36x their error (1.6-3.1%, a false "within" at tol 1%)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2)
    ).eval()
    with torch.no_grad():
        net[0].weight.mul_(8.0)
        net[2].weight.mul_(8.0)
    states = torch.randn(64, 4)
    truth = midpoint_reference(net, states, target="mean").attributions
    result = integrated_gradients(net, states, target="mean", n_steps=56, method="kink_midpoint")
    error = (result.attributions.double() - truth).abs().sum(1) / truth.abs().sum(1)
    worst = int(error.argmax())
    assert float(error[worst]) > 0.01  # the case that matters: above the default tolerance
    assert float(result.attribution_error[worst]) >= 0.5 * float(error[worst])
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01)
    assert verdict.within is False or float(error.max()) <= 0.02


@pytest.mark.parametrize("seed", [0, 3])
def test_a_smooth_network_at_rounding_level_gets_its_rounding_measured(seed: int) -> None:
    # A tanh MLP at init: at 56 nodes the rule's error is the float32 sums' rounding (about 1 eps). The bound on it
    # (2 eps times the path terms' mass) read 1.8-2.1x the truth at the median, within 2x on 35-54% of the states;
    # the same sums in float64 measure it (98-100%)
    net = seeded_mlp(16, 3, seed=seed, hidden=64, dtype=torch.float32)
    states = torch.randn(48, 16)
    result = integrated_gradients(net, states, target="mean")
    assert result.method == "kink_midpoint"
    error = state_errors(result.attributions, midpoint_reference(net, states, target="mean").attributions)
    assert float(error.max()) < 16 * eps(torch.float32)  # the case: rounding-level truths
    ratio = result.attribution_error.double() / error
    assert float(((ratio >= 0.5) & (ratio <= 2.0)).double().mean()) >= 0.8
    assert float(ratio[error.argmax()]) >= 0.5


def test_a_smooth_network_makes_no_certificate_pass_on_the_cpu() -> None:
    # No state reads kinked, so no correction could be made (each is scaled by the state's kinked share, 0 here): the
    # certificate's forward pass is skipped. A ReLU network, whose states read kinked, still makes it
    rows: list[int] = []
    for act, passes in ((torch.nn.Tanh, 1), (torch.nn.ReLU, 2)):
        net = seeded_mlp(6, 3, seed=1, hidden=32, act=act, dtype=torch.float32)

        def forward(z: torch.Tensor, net: torch.nn.Module = net) -> torch.Tensor:
            rows.append(z.shape[0])
            return net(z).mean(1)

        rows.clear()
        result = integrated_gradients(forward, torch.randn(8, 6), n_steps=56, method="kink_midpoint")
        assert result.method == "kink_midpoint" and len(rows) == passes and rows[0] == (56 + 4) * 8


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_few_nodes_still_give_finite_figures(n: int) -> None:
    result = integrated_gradients(kinked_relu(KINKS, SIGNS), STATES, target="mean", n_steps=n, method="kink_midpoint")
    assert result.n_steps == n and bool(torch.isfinite(result.attributions).all())
    assert bool(torch.isfinite(result.attribution_error).all()) and float(result.attribution_error.min()) > 0


def test_the_same_inputs_give_the_same_bits_and_each_action_is_its_own_run() -> None:
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)).eval()
    x = torch.randn(16, 6)
    first = integrated_gradients(net, x, target="each", n_steps=24)
    again = IntegratedGradients(net, target="each", n_steps=24).attribute(x)
    for name in ("attributions", "attribution_error", "mass_relative_error", "delta"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    assert first.method == "kink_midpoint"
    for action in range(3):  # each action's rows, certificates and sums as a run of that action alone
        alone = integrated_gradients(net, x, target=action, n_steps=24)
        assert torch.equal(first.attributions[action], alone.attributions)
        assert torch.equal(first.attribution_error[action], alone.attribution_error)


def test_finite_differences_keep_the_midpoint_rule() -> None:
    net = kinked_relu(KINKS, SIGNS)
    result = integrated_gradients(net, STATES, target="mean", n_steps=8, gradient="finite_difference")
    assert result.method == "riemann_middle"
    with pytest.raises(ValueError, match="kink_midpoint.*finite"):
        integrated_gradients(net, STATES, n_steps=8, method="kink_midpoint", gradient="finite_difference")
