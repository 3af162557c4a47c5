"""Calibration (lightning_ig/attribution/calibration.py): a rule per model and the estimate's scale, on real
ReLU networks, checked against the engine's own runs (float64 models: every sum is float64, so the two agree to
rounding)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, calibrate, integrated_gradients
from lightning_ig.attribution.calibration import CANDIDATES, CENTRED_BAND, SCALE_RANGE, _scale
from tests.support.tolerance import eps

F64 = torch.float64


def _relu_mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3)]
    return torch.nn.Sequential(*layers).double().eval()


def _states(seed: int, scale: float = 1.0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(12, 4, dtype=F64) * scale


def _true_errors(model: torch.nn.Module, x: torch.Tensor, method: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``||a - a_ref||_1 / ||a_ref||_1`` and the unscaled estimate per state, the reference 1024 midpoint steps."""
    reference = integrated_gradients(model, x, target="mean", n_steps=1024).attributions
    result = integrated_gradients(model, x, target="mean", n_steps=n, method=method)
    true = (result.attributions - reference).abs().sum(1) / reference.abs().sum(1)
    return true, result.attribution_error


def _median_ratio(true: torch.Tensor, estimate: torch.Tensor) -> float:
    return float((true / estimate).median())


def test_in_distribution_it_keeps_the_midpoint_rule_and_leaves_a_centred_estimate_alone() -> None:
    model, x = _relu_mlp(60), _states(61)
    found = calibrate(model, x, target="mean", n_steps=32)
    assert found.num_states == 8 and found.n_steps == 32 and set(found.worst_errors) == set(CANDIDATES)
    assert found.gradient_rows == (1024 + len(CANDIDATES) * 32) * 8  # the reference: max(1024, 4 x 32) nodes
    first = x[:8]
    true, estimate = _true_errors(model, first, "riemann_middle", 32)
    mass = integrated_gradients(model, first, target="mean", n_steps=1024).attributions.abs().sum(1)
    assert bool((mass >= 0.1 * mass.median()).all())  # no state near the baseline: all eight are scored
    tolerance = 64 * eps(F64)
    assert found.worst_errors["riemann_middle"] == pytest.approx(float(true.max()), rel=tolerance)
    # the midpoint rule stays unless another was at least twice as accurate
    best = min(found.worst_errors.values())
    assert (
        found.method == "riemann_middle" or found.worst_errors[found.method] < 0.5 * found.worst_errors[CANDIDATES[0]]
    )
    if found.method == "riemann_middle":
        assert best >= 0.5 * found.worst_errors["riemann_middle"]
        low, high = CENTRED_BAND
        assert low <= _median_ratio(true, estimate) <= high  # the estimate is centred on the truth here
        assert found.error_scale == 1.0  # so the scale is left alone (the worst ratio would over-read elsewhere)


def test_an_estimate_that_reads_high_everywhere_is_lowered_to_its_largest_ratio() -> None:
    # Gauss-Legendre on a tanh network: its true error is far below the curvature model's cell-by-cell figure, so
    # the estimate reads high on every state; calibration lowers it as far as the state it reads lowest.
    torch.manual_seed(64)
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).double().eval()
    x = _states(65)
    found = calibrate(model, x, target="mean", n_steps=8, candidates=["gausslegendre"])
    true, estimate = _true_errors(model, x[:8], "gausslegendre", 8)
    largest = float((true / estimate).max())
    assert largest < CENTRED_BAND[0]
    low, high = SCALE_RANGE
    assert found.error_scale == pytest.approx(min(high, max(low, largest)), rel=1e-6)
    assert found.error_scale < 1.0


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([1.6, 1.8, 2.0, 0.9, 3.0], 1.8),  # reads low on most states: raised by the median
        ([0.2, 0.3, 0.5, 0.6], 0.6),  # reads high on every state: lowered only as far as the lowest-read one
        ([0.3, 0.5, 0.6, 1.2], 1.0),  # one state read about right: never lowered past it
        ([0.8, 1.0, 1.3, 5.0], 1.0),  # centred: left alone
        ([50.0, 60.0, 70.0], SCALE_RANGE[1]),  # clipped
    ],
)
def test_the_scale_rule(ratios: list[float], expected: float) -> None:
    errors = torch.tensor(ratios, dtype=F64)
    assert _scale(errors, torch.ones_like(errors)) == pytest.approx(expected)


def test_the_budget_is_resolved_for_the_states_the_run_attributes() -> None:
    model, x = _relu_mlp(60), _states(61)
    found = calibrate(model, x, target="mean")  # n_steps="budget", the default
    assert found.n_steps == integrated_gradients(model, x, target="mean").n_steps
    assert calibrate(model, x, target="mean", batch=50_000).n_steps == 64  # a batch whose work does not fit
    assert found.n_steps > 64  # twelve states of a small network: more nodes for free


def test_off_distribution_it_picks_a_rule_that_crowds_the_nodes_near_the_baseline() -> None:
    # inputs 255x larger than the network's scale (frames not scaled to [0, 1]): along alpha x the kinks crowd in
    # the first few percent of the path
    model, x = _relu_mlp(62), _states(63, scale=255.0)
    found = calibrate(model, x, target="mean", n_steps=32)
    assert found.method != "riemann_middle"
    assert found.worst_errors[found.method] < 0.5 * found.worst_errors["riemann_middle"]
    assert found.method.startswith("warped_middle") or found.method == "cosine_middle"  # nodes near alpha = 0
    # what it scored is what the engine gives with that rule
    true, _ = _true_errors(model, x[:8], found.method, 32)
    assert found.worst_errors[found.method] == pytest.approx(float(true.max()), rel=64 * eps(F64))


def test_the_engine_adopts_the_rule_and_the_scale() -> None:
    model, x = _relu_mlp(62), _states(63, scale=255.0)
    engine = IntegratedGradients(model, target="mean", n_steps=32)
    found = engine.calibrate(x)
    assert engine.options.method == found.method and engine.options.error_scale == found.error_scale
    result = engine.attribute(x)
    assert result.method == found.method and result.error_scale == found.error_scale
    plain = integrated_gradients(model, x, target="mean", n_steps=32, method=found.method)
    torch.testing.assert_close(result.attribution_error, plain.attribution_error * found.error_scale)
    with pytest.raises(ValueError, match="calibrate needs a fixed n_steps"):
        IntegratedGradients(model, target="mean", n_steps="auto").calibrate(x)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"n_steps": 0}, ValueError, "n_steps"),
        ({"margin": -1.0}, ValueError, "margin"),
        ({"num_states": 1.5}, TypeError, "num_states"),
        ({"candidates": "riemann_middle"}, TypeError, "candidates"),
        ({"candidates": ["riemann_middle", "simpson"]}, ValueError, "candidates"),
        ({"reference_steps": math.nan}, TypeError, "reference_steps"),
        ({"n_steps": "auto"}, ValueError, "n_steps='auto'"),
        ({"batch": 0}, ValueError, "batch"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        calibrate(_relu_mlp(66), _states(67), target="mean", **options)
