"""The exact line is exact (a closed form, convergence of fine midpoint rules) and refuses what it cannot walk."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_ig.attribution.exact_line import (
    MIN_REFERENCE_STEPS,
    ExactLineError,
    UnsupportedModelError,
    exact_line,
    midpoint_reference,
    reference,
)
from lightning_ig.models import DuelingQNetwork, MinAtarQNetwork

EPS = torch.finfo(torch.float64).eps


class _OneLayer(nn.Module):
    def __init__(self, features: int = 5, hidden: int = 16) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.relu = nn.ReLU()
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.relu(self.hidden(x))).squeeze(-1)


def _closed_form(net: _OneLayer, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IG of ``sum_j v_j relu(z_j(alpha))``: unit j gives ``diff * v_j w_j`` x the share of [0, 1] where z_j > 0."""
    w, c = net.hidden.weight.double(), net.hidden.bias.double()
    v = net.out.weight.double()[0]
    diff = x.double() - b.double()
    z0 = b.double() @ w.T + c  # (B, H): z_j(alpha) = z0 + alpha * slope
    slope = diff @ w.T
    crossing = torch.where(
        slope != 0, -z0 / torch.where(slope != 0, slope, torch.ones_like(slope)), torch.zeros_like(z0)
    )
    crossing = crossing.clamp(0, 1)
    share = torch.where(slope > 0, 1 - crossing, torch.where(slope < 0, crossing, (z0 > 0).double()))
    return diff * ((share * v) @ w)  # (B, F)


def test_exact_line_matches_the_closed_form_of_a_one_layer_relu_net() -> None:
    torch.manual_seed(0)
    net = _OneLayer()
    x, b = torch.randn(8, 5), 0.1 * torch.randn(8, 5)
    truth = _closed_form(net, x, b)
    got = exact_line(net, x, b, target=None)
    scale = truth.abs().sum(1, keepdim=True)  # rounding grows with the mass and the regions summed
    assert torch.all((got.attributions - truth).abs() <= 64 * EPS * got.regions.view(-1, 1) * scale)
    assert got.method == "exact_line"
    assert torch.all(got.regions >= 1)


def test_an_in_place_relu_is_walked_as_a_plain_one() -> None:
    """ReLU(inplace=True) clips its input before a forward hook sees it: the walk read clipped pre-activations,
    missed the kinks ahead and failed its own self-check ("a non-linearity its hooks do not see")."""
    torch.manual_seed(0)
    layers = (nn.Linear(4, 16), nn.Linear(16, 16), nn.Linear(16, 3))
    plain = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])
    in_place = nn.Sequential(layers[0], nn.ReLU(inplace=True), layers[1], nn.ReLU(inplace=True), layers[2])
    x = torch.randn(5, 4)
    expected, got = exact_line(plain, x), exact_line(in_place, x)
    assert torch.equal(got.attributions, expected.attributions) and torch.equal(got.regions, expected.regions)


@pytest.mark.parametrize("target", ["mean", "each", "contrast", 1])
def test_fine_midpoint_rules_converge_to_the_exact_line(target: object) -> None:
    torch.manual_seed(1)
    net = DuelingQNetwork(4, 3, hidden_sizes=(24, 24)).eval()
    x = torch.randn(6, 4)
    exact = exact_line(net, x, target=target)
    coarse = midpoint_reference(net, x, target=target, n_steps=MIN_REFERENCE_STEPS)
    fine = midpoint_reference(net, x, target=target, n_steps=8 * MIN_REFERENCE_STEPS)
    error_coarse = (coarse.attributions - exact.attributions).abs().max()
    error_fine = (fine.attributions - exact.attributions).abs().max()
    # A step integrand makes the midpoint rule first order: 8x the steps, ~8x smaller error (2x is the bar).
    assert error_fine <= error_coarse / 2
    assert float(exact.completeness.max()) <= 1e3 * EPS
    assert exact.attributions.shape == ((3, 6, 4) if target == "each" else (6, 4))


def test_exact_line_walks_a_conv_net_and_leaves_the_model_alone() -> None:
    torch.manual_seed(2)
    net = MinAtarQNetwork(4, 3, hidden_size=16).eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = (torch.rand(2, 4, 10, 10) < 0.1).float()
    exact = exact_line(net, x)
    assert float(exact.completeness.max()) <= 1e3 * EPS
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert next(net.parameters()).dtype == torch.float32


def test_an_unsupported_module_is_refused_and_the_fallback_used() -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,), activation="tanh").eval()
    with pytest.raises(UnsupportedModelError, match="Tanh.*midpoint_reference"):
        exact_line(net, torch.randn(2, 4))
    assert reference(net, torch.randn(2, 4)).method == f"midpoint:{MIN_REFERENCE_STEPS}"


def test_a_hidden_non_linearity_fails_the_self_check() -> None:
    class Functional(_OneLayer):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.relu(self.hidden(x))).squeeze(-1)  # F.relu: no module for the hooks

    torch.manual_seed(3)
    with pytest.raises(ExactLineError, match="self-check"):
        exact_line(Functional(), torch.randn(4, 5), target=None)


def test_too_few_midpoint_steps_and_bad_targets_are_refused() -> None:
    net = _OneLayer()
    with pytest.raises(ValueError, match=f">= {MIN_REFERENCE_STEPS}"):
        midpoint_reference(net, torch.randn(2, 5), target=None, n_steps=1024)
    with pytest.raises(TypeError, match="n_steps must be an int"):
        midpoint_reference(net, torch.randn(2, 5), target=None, n_steps=8192.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="torch.nn.Module"):
        exact_line(object(), torch.randn(2, 5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="callable"):
        exact_line(net, torch.randn(2, 5), target="bogus")
