"""The IG engine on its torch path (CPU): exactness, Captum agreement, both gradient modes, side effects, errors."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_ig.attribution import IGResult, IntegratedGradients, integrated_gradients, target_forward
from lightning_ig.ops.ig import TorchIG
from lightning_ig.vocabulary import METHODS
from tests.support.models import DuelingMLP, seeded_dueling, seeded_mlp
from tests.support.tolerance import assert_close_scaled, eps, rounding_bound

ALL_METHODS = list(METHODS)
TWINS = TorchIG()
CAPTUM_SAME = ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle"]
F64 = torch.float64


def _completeness_rounding(result: IGResult, ulps: float) -> torch.Tensor:
    """Per state, ``ulps`` roundings of the numbers completeness adds up: ``sum |attr| + |F(x)| + |F(b)|``.

    For a rule that integrates the model exactly, ``|delta|`` is no more than this.
    """
    attributions = result.attributions.reshape(result.attributions.shape[0], -1).double()
    size = attributions.abs().sum(1) + result.f_input.double().abs() + result.f_baseline.double().abs()
    return ulps * eps(result.attributions.dtype) * size


def _assert_complete_to_rounding(result: IGResult, ulps: float) -> None:
    bound = _completeness_rounding(result, ulps)
    assert (result.delta.double().abs() <= bound).all(), (result.delta, bound)
    difference = (result.f_input - result.f_baseline).double().abs()
    assert result.worst_relative_error <= float((bound / difference).max())


def _fd_tolerance(dtype: torch.dtype) -> float:
    """Central differences with the default step h = eps^(1/3): truncation O(h^2) and rounding O(eps / h),
    both eps^(2/3) relative to the size of the attributions (times the model's smoothness: a few units here)."""
    return 16 * eps(dtype) ** (2 / 3)


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("method", ALL_METHODS)
def test_linear_model_attributions_are_exact_for_every_rule(method: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(6, dtype=torch.float64)
    x = torch.randn(5, 6, dtype=torch.float64)
    b = torch.randn(5, 6, dtype=torch.float64)
    result = integrated_gradients(lambda z: z @ weight + 3.0, x, b, n_steps=7, method=method)
    # The gradient is the weight exactly: what remains is the rounding of 7 weighted sums and one product.
    assert_close_scaled(result.attributions, (x - b) * weight, ulps=16, dtype=F64)
    _assert_complete_to_rounding(result, ulps=16)
    assert result.n_steps == 7 and result.method == method and result.backend == "torch"


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_middle", "riemann_trapezoid"])
def test_quadratic_model_matches_its_closed_form(method: str) -> None:
    # F(x) = x^T Q x: the gradient is linear along the path, which these rules integrate exactly;
    # attr_i = (x_i - b_i) [(Q + Q^T)(b + (x - b) / 2)]_i.
    torch.manual_seed(1)
    q = torch.randn(4, 4, dtype=torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(3, 4, dtype=torch.float64)
    forward = lambda z: torch.einsum("ni,ij,nj->n", z, q, z)  # noqa: E731
    expected = (x - b) * (((b + x) / 2) @ (q + q.T).T)
    result = integrated_gradients(forward, x, b, n_steps=5, method=method)
    assert_close_scaled(result.attributions, expected, ulps=32, dtype=F64)  # 5 steps of 4-term gradient sums
    _assert_complete_to_rounding(result, ulps=32)


@pytest.mark.parametrize("method", CAPTUM_SAME)
def test_agrees_with_captum_on_random_mlps(method: str) -> None:
    captum_ig = pytest.importorskip("captum.attr").IntegratedGradients
    for seed in range(3):
        model = seeded_mlp(7, 3, seed=seed)
        x = torch.randn(6, 7, dtype=torch.float64)
        b = torch.randn(6, 7, dtype=torch.float64) * 0.1
        ours = integrated_gradients(model, x, b, target=2, n_steps=24, method=method)
        theirs, delta = captum_ig(model).attribute(
            x, b, target=2, n_steps=24, method=method, return_convergence_delta=True
        )
        # Captum builds its Riemann alphas with a float32 linspace: each is off by up to half a float32 rounding,
        # which moves the attributions by that much of their size. Gauss-Legendre: float64 nodes on both sides.
        scale = float(theirs.abs().max())
        assert float((ours.attributions - theirs).abs().max()) <= rounding_bound(scale, ulps=4, dtype=torch.float32)
        assert_close_scaled(ours.delta, delta, ulps=4, dtype=torch.float32, scale=scale)


def test_trapezoid_differs_from_captum_only_by_its_weight_sum() -> None:
    # Captum's trapezoid weights sum to (n - 1)/n (see quadrature.riemann_trapezoid); ours sum to one.
    captum_ig = pytest.importorskip("captum.attr").IntegratedGradients
    model = seeded_mlp(5, 2, seed=3)
    x = torch.randn(4, 5, dtype=torch.float64)
    n = 10
    ours = integrated_gradients(model, x, target=0, n_steps=n, method="riemann_trapezoid")
    theirs = captum_ig(model).attribute(x, target=0, n_steps=n, method="riemann_trapezoid")
    assert_close_scaled(ours.attributions * (n - 1) / n, theirs, ulps=4, dtype=torch.float32)  # float32 alphas


# --------------------------------------------------------------------------- gradient modes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_differences_match_autograd_on_a_tanh_mlp(dtype: torch.dtype) -> None:
    model = seeded_mlp(8, 1, seed=4, dtype=dtype)
    forward = lambda z: model(z).squeeze(1)  # noqa: E731
    x = torch.randn(5, 8, dtype=dtype)
    exact = integrated_gradients(forward, x, n_steps=20, method="riemann_middle")  # the rule finite differences use
    fd = integrated_gradients(forward, x, n_steps=20, gradient="finite_difference")
    error = float((fd.attributions - exact.attributions).abs().max() / exact.attributions.abs().max())
    assert error <= _fd_tolerance(dtype)
    assert fd.gradient == "finite_difference" and fd.fd_step == eps(dtype) ** (1 / 3)
    torch.testing.assert_close(fd.f_input, exact.f_input, rtol=0, atol=0)


def test_finite_differences_run_forwards_autograd_cannot_go_through() -> None:
    weight = np.linspace(-1.0, 1.0, 4)

    def numpy_forward(z: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.tanh(z.detach().numpy() @ weight))

    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="gradient='finite_difference'"):
        integrated_gradients(numpy_forward, x)
    fd = integrated_gradients(numpy_forward, x, gradient="finite_difference", n_steps=16)
    exact = integrated_gradients(
        lambda z: torch.tanh(z @ torch.from_numpy(weight)), x, n_steps=16, method="riemann_middle"
    )
    assert_close_scaled(fd.attributions, exact.attributions, ulps=_fd_tolerance(F64) / eps(F64), dtype=F64)


def test_finite_difference_step_is_recorded_and_scales_with_the_inputs() -> None:
    # F = sum z^3: the central difference of z^3 is exactly 3 z^2 + h^2, so every gradient is off by h^2
    # and attr_i by (x_i - b_i) h_i^2, with h_i = fd_step * max(1, |x_i|, |b_i|).
    x = torch.tensor([[100.0, 0.5]], dtype=torch.float64)
    forward = lambda z: (z**3).sum(1)  # noqa: E731
    exact = integrated_gradients(forward, x, n_steps=4, method="riemann_middle")
    fd = integrated_gradients(forward, x, gradient="finite_difference", fd_step=1e-2, n_steps=4)
    assert fd.fd_step == 1e-2
    error = fd.attributions - exact.attributions
    steps = torch.tensor([1e-2 * 100, 1e-2 * 1], dtype=torch.float64)
    expected = x[0] * steps**2
    # What rounding leaves: F's values (~1e6 here) rounded, over the step 2 h_i, times (x_i - b_i).
    rounding = 4 * eps(F64) * float(forward(x).abs()) * x[0].abs() / (2 * steps)
    assert ((error[0] - expected).abs() <= rounding).all(), (error[0], expected, rounding)
    assert (rounding < 1e-3 * expected).all()  # the h^2 term is what is measured, not the noise
    # a step under 16 eps of the dtype: x +- h rounds to x and every gradient to 0, refused before any forward
    fine = 16 * eps(torch.float32)
    with pytest.raises(
        ValueError, match=r"fd_step 1e-12 is below 16 eps of torch.float32 \(1.91e-06\), the inputs' dtype"
    ):
        integrated_gradients(forward, x.float(), gradient="finite_difference", fd_step=1e-12, n_steps=4)
    assert (
        integrated_gradients(forward, x, gradient="finite_difference", fd_step=fine / 2, n_steps=4).fd_step == fine / 2
    )


# --------------------------------------------------------------------------- targets

RULE = "riemann_middle"


def test_targets_mean_index_per_row_each_and_callable() -> None:
    model = seeded_dueling(5, 4, seed=5)
    # one fixed rule throughout: the kink rule corrects each target on its own, so a mean's map is not the mean of
    # the maps (nor the finite differences' rule)
    x = torch.randn(6, 5, dtype=torch.float64)
    each = integrated_gradients(model, x, target="each", n_steps=8, method=RULE)
    assert each.attributions.shape == (4, 6, 5) and each.f_input.shape == (4, 6) and each.target == "each"
    for action in range(4):
        one = integrated_gradients(model, x, target=action, n_steps=8, method=RULE)
        assert_close_scaled(one.attributions, each.attributions[action], ulps=8, dtype=F64)
        assert one.target == f"action:{action}"  # vocabulary.target_label, as in the report
    rows = torch.tensor([0, 3, 1, 2, 2, 0])
    per_row = integrated_gradients(model, x, target=rows, n_steps=8, method=RULE)
    assert_close_scaled(per_row.attributions, each.attributions[rows, torch.arange(6)], ulps=8, dtype=F64)
    per_row_fd = integrated_gradients(model, x, target=rows, n_steps=8, gradient="finite_difference")
    assert_close_scaled(per_row_fd.attributions, per_row.attributions, ulps=_fd_tolerance(F64) / eps(F64), dtype=F64)
    mean = integrated_gradients(model, x, target="mean", n_steps=8, method=RULE)
    assert_close_scaled(mean.attributions, each.attributions.mean(0), ulps=8, dtype=F64)
    value = integrated_gradients(target_forward(model, "mean"), x, n_steps=8, method=RULE)
    torch.testing.assert_close(value.attributions, mean.attributions, rtol=0, atol=0)
    picked = integrated_gradients(model, x, target=lambda q: q.max(dim=1).values, n_steps=8, method=RULE)
    assert picked.target.startswith("callable:")
    torch.testing.assert_close(picked.f_input, model(x).max(dim=1).values)


def test_mean_target_is_the_state_value_of_a_dueling_network() -> None:
    model = seeded_dueling(3, 2, seed=6)
    x = torch.randn(4, 3, dtype=torch.float64)
    result = integrated_gradients(model, x, target="mean", n_steps=4)
    value = model.value(model.body(x)).squeeze(1)
    torch.testing.assert_close(result.f_input, value)


def test_any_feature_shape_in_both_modes() -> None:
    torch.manual_seed(8)
    weight = torch.randn(2, 3, 2, dtype=torch.float64)
    forward = lambda z: torch.tanh((z * weight).sum(dim=(1, 2, 3)))  # noqa: E731
    x = torch.randn(3, 2, 3, 2, dtype=torch.float64)
    autograd = integrated_gradients(forward, x, n_steps=12, method="riemann_middle")
    fd = integrated_gradients(forward, x, n_steps=12, gradient="finite_difference")
    assert autograd.attributions.shape == x.shape and fd.attributions.shape == x.shape
    assert_close_scaled(fd.attributions, autograd.attributions, ulps=_fd_tolerance(F64) / eps(F64), dtype=F64)
    assert autograd.worst_relative_error < 1e-3  # 12 Gauss-Legendre steps on a tanh: the rule's accuracy, not rounding


# --------------------------------------------------------------------------- determinism, chunks, side effects


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_repeats_are_bit_identical(gradient: str) -> None:
    model = seeded_mlp(6, 3, seed=9, dtype=torch.float32)
    x = torch.randn(5, 6)
    first = integrated_gradients(model, x, target="mean", gradient=gradient, n_steps=10)
    second = integrated_gradients(model, x, target="mean", gradient=gradient, n_steps=10)
    for name in ("attributions", "f_input", "f_baseline", "delta", "relative_error"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name


def test_model_is_left_exactly_as_it_was() -> None:
    model = seeded_mlp(5, 2, seed=12, act=torch.nn.Tanh).train()
    model[0].weight.grad = torch.full_like(model[0].weight, 0.5)
    model[2].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {k: (None if p.grad is None else p.grad.clone()) for k, p in model.named_parameters()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    rng = torch.get_rng_state()
    x = torch.randn(3, 5, dtype=torch.float64)
    rng = torch.get_rng_state()
    integrated_gradients(model, x, target="mean", n_steps=5)
    integrated_gradients(model, x, target=1, n_steps=5, gradient="finite_difference")
    integrated_gradients(model, x, target="each", n_steps="auto")
    integrated_gradients(model, x, target="contrast", n_steps="auto")
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    for key, p in model.named_parameters():
        assert p.requires_grad == flags[key], key
        if grads[key] is None:
            assert p.grad is None, key
        else:
            assert torch.equal(p.grad, grads[key]), key


@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_works_without_gradients_enabled(context: str) -> None:
    model = seeded_mlp(4, 1, seed=13)
    forward = lambda z: model(z).squeeze(1)  # noqa: E731
    x = torch.randn(3, 4, dtype=torch.float64)
    reference = integrated_gradients(forward, x, n_steps=8)
    manager = torch.no_grad() if context == "no_grad" else torch.inference_mode()
    with manager:
        inputs = x.clone()  # an inference tensor under inference_mode
        result = integrated_gradients(forward, inputs, n_steps=8)
        engine = IntegratedGradients(forward, n_steps=8).attribute(inputs)
    torch.testing.assert_close(result.attributions, reference.attributions, rtol=0, atol=0)
    torch.testing.assert_close(engine.attributions, reference.attributions, rtol=0, atol=0)


# --------------------------------------------------------------------------- completeness, auto steps


def test_degenerate_states_are_counted_apart() -> None:
    model = seeded_mlp(3, 1, seed=14)
    forward = lambda z: model(z).squeeze(1)  # noqa: E731
    x = torch.randn(3, 3, dtype=torch.float64)
    b = torch.zeros_like(x)
    b[1] = x[1]  # F(x) == F(b): no ratio to speak of
    result = integrated_gradients(forward, x, b, n_steps=4, method="riemann_left")
    assert result.degenerate.tolist() == [False, True, False]
    assert math.isnan(float(result.relative_error[1]))
    assert result.num_degenerate == 1
    kept = result.relative_error[[0, 2]]
    assert result.worst_relative_error == float(kept.max())
    torch.testing.assert_close(result.delta, result.attributions.sum(1) - (result.f_input - result.f_baseline))
    assert result.num_checked == 2 and result.num_non_finite == 0 and result.first_non_finite is None
    all_degenerate = integrated_gradients(forward, x, x.clone(), n_steps=4)
    # Nothing could be checked: NaN (never 0.0, which would read as a perfect score), with the count.
    assert math.isnan(all_degenerate.worst_relative_error)
    assert all_degenerate.num_degenerate == 3 and all_degenerate.num_checked == 0


# --------------------------------------------------------------------------- the engine object


def test_engine_runs_eagerly_on_cpu_and_matches_the_function() -> None:
    model = seeded_dueling(4, 3, seed=17)
    x = torch.randn(5, 4, dtype=torch.float64)
    engine = IntegratedGradients(model, target="mean", n_steps=9, cuda_graph=True)
    first = engine.attribute(x)
    assert engine.last_mode == "eager" and not first.cuda_graph
    again = engine.attribute(x, n_steps=12, method="riemann_middle")
    reference = integrated_gradients(model, x, target="mean", n_steps=12, method="riemann_middle")
    torch.testing.assert_close(again.attributions, reference.attributions, rtol=0, atol=0)
    assert again.n_steps == 12 and isinstance(again, IGResult)


def test_engine_rejects_bad_options_at_construction() -> None:
    with pytest.raises(TypeError, match="unknown option"):
        IntegratedGradients(lambda z: z.sum(1), n_step=4)
    with pytest.raises(ValueError, match="cuda_graph must be"):
        IntegratedGradients(lambda z: z.sum(1), cuda_graph="yes")
    with pytest.raises(TypeError, match="forward must be callable"):
        IntegratedGradients(42)


def test_half_precision_models_on_the_torch_path() -> None:
    torch.manual_seed(18)
    weight = torch.randn(4)
    x = torch.randn(3, 4)
    result = integrated_gradients(lambda z: z @ weight.to(z.dtype), x.to(torch.bfloat16), n_steps=4)
    assert result.attributions.dtype == torch.bfloat16 and result.f_input.dtype == torch.float32
    # bfloat16 path points and products, accumulated in float32: a few bfloat16 roundings.
    assert_close_scaled(
        result.attributions.float(), x.to(torch.bfloat16).float() * weight, ulps=4, dtype=torch.bfloat16
    )


# --------------------------------------------------------------------------- the torch twins of the kernels


def test_interpolation_twin_layout_and_exact_ends() -> None:
    x = torch.randn(3, 5)
    b = torch.randn(3, 5)
    alphas = torch.tensor([0.0, 0.25, 1.0])
    points = TWINS.interpolate(x, b, alphas, end_copies=2)
    assert points.shape == (7, 3, 5)
    assert torch.equal(points[0], b) and torch.equal(points[3], x) and torch.equal(points[4], b)
    assert torch.equal(points[5], x) and torch.equal(points[6], b)  # the second pair: the stochastic-forward check
    assert torch.equal(points[1], b + 0.25 * (x - b))  # the same float32 operations


def test_probe_and_gradient_twins() -> None:
    points = torch.randn(4, 3, dtype=torch.float64)
    h = torch.rand(2, 3, dtype=torch.float64) + 0.1  # (B=2, F)
    probes = TWINS.fd_probes(points, h, point_offset=1)
    assert probes.shape == (4, 2, 3, 3)
    for p in range(4):
        state = (1 + p) % 2
        expected_plus = points[p].expand(3, 3) + torch.diag(h[state])
        assert torch.equal(probes[p, 0], expected_plus)  # one float64 addition on the diagonal, none elsewhere
        assert torch.equal(probes[p, 1], points[p].expand(3, 3) - torch.diag(h[state]))
    into = torch.full((4 * 2 * 3, 3), -1.0, dtype=torch.float64)  # a chunk's forward buffer, (P 2 F, F)
    assert TWINS.fd_probes(points, h, 1, out=into) is into and torch.equal(into.view(4, 2, 3, 3), probes)
    slope = torch.tensor([[1.0, -2.0], [0.5, 3.0], [2.0, 0.0]], dtype=torch.float64)  # (F, T)
    f = probes @ slope  # (P, 2, F, T): a linear forward, so central differences are exact
    out = torch.empty(2, 4, 3, dtype=torch.float64)
    TWINS.fd_gradient(points, h, f, 1, out)
    # The differences of f round at f's size; divided by the step 2 h >= 0.2.
    bound = 4 * eps(F64) * float(f.abs().max()) / float(2 * h.min())
    assert float((out - slope.T.unsqueeze(1).expand(2, 4, 3)).abs().max()) <= bound


def test_accumulation_twin_sums_in_step_order() -> None:
    x = torch.randn(2, 3)
    b = torch.randn(2, 3)
    weights = torch.tensor([0.1, 0.7, 0.2])
    grads = torch.randn(2, 3, 2, 3)  # (T, n, B, F)
    attr = TWINS.accumulate(x, b, weights, grads)
    # Three products and sums in step order against einsum's order: a few float32 roundings.
    expected = (x - b) * torch.einsum("k,tkbf->tbf", weights, grads)
    assert_close_scaled(
        attr, expected, ulps=8, dtype=torch.float32, scale=float(((x - b).abs() * grads.abs().sum(1)).max())
    )


# --------------------------------------------------------------------------- property tests


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 4),
    feature_shape=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    method=st.sampled_from(ALL_METHODS),
    n_steps=st.integers(2, 9),
    gradient=st.sampled_from(["autograd", "finite_difference"]),
    seed=st.integers(0, 2**16),
)
def test_property_linear_models_are_exact_for_any_shape_and_rule(
    batch: int, feature_shape: list[int], method: str, n_steps: int, gradient: str, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, *feature_shape)
    weight = torch.randn(tuple(feature_shape), generator=generator, dtype=torch.float64)
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    b = torch.randn(shape, generator=generator, dtype=torch.float64)
    dims = tuple(range(1, len(shape)))
    forward = lambda z: (z * weight).sum(dim=dims) if dims else z * weight  # noqa: E731
    result = integrated_gradients(forward, x, b, n_steps=n_steps, method=method, gradient=gradient)
    assert result.attributions.shape == shape
    # Autograd: the gradient is the weight exactly. Central differences of an exactly linear F lose F's
    # rounding (eps |F|) over the step 2 h, h = eps^(1/3) max(1, |x|, |b|): eps^(2/3) |F| per unit of x - b.
    size = float((x.abs() + b.abs()).reshape(batch, -1).sum(1).max()) * float(weight.abs().max())  # bounds |F|
    ulps = 16 if gradient == "autograd" else 16 * eps(F64) ** (-1 / 3)
    assert_close_scaled(result.attributions, (x - b) * weight, ulps=ulps, dtype=F64, scale=max(1.0, size))
    assert (
        result.delta.double().abs() <= _completeness_rounding(result, ulps) + rounding_bound(size, ulps=ulps, dtype=F64)
    ).all()


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 5), features=st.integers(1, 6), n_steps=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_property_completeness_of_gauss_legendre_on_quadratics(
    batch: int, features: int, n_steps: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(features, features, generator=generator, dtype=torch.float64)
    x = torch.randn(batch, features, generator=generator, dtype=torch.float64)
    result = integrated_gradients(lambda z: torch.einsum("ni,ij,nj->n", z, q, z), x, n_steps=n_steps)
    # Exact for degree 2n - 1 >= 1: what remains is rounding of n_steps gradient sums of `features` terms.
    assert (result.delta.abs() <= _completeness_rounding(result, ulps=8 * (n_steps + features))).all()


# --------------------------------------------------------------------------- bad input


def test_error_n_steps_method_and_options() -> None:
    x = torch.randn(2, 3)
    # The words of lightning_ig.vocabulary, as the callback and the command line say them.
    with pytest.raises(ValueError, match="n_steps must be an int >= 1, got 0; e.g. n_steps=64"):
        integrated_gradients(_forward, x, n_steps=0)
    with pytest.raises(TypeError, match="n_steps must be an int >= 1, got float"):
        integrated_gradients(_forward, x, n_steps=2.5)
    with pytest.raises(ValueError, match="n_steps must be an int >= 1, 'budget' or 'auto', got 'many'"):
        integrated_gradients(_forward, x, n_steps="many")
    with pytest.raises(
        ValueError, match="method must be one of 'auto', 'kink_midpoint', 'riemann_left', .*; got 'simpson'"
    ):
        integrated_gradients(_forward, x, method="simpson")
    with pytest.raises(ValueError, match="riemann_trapezoid' needs n_steps >= 2"):
        integrated_gradients(_forward, x, method="riemann_trapezoid", n_steps=1)
    with pytest.raises(ValueError, match="gradient must be one of 'autograd', 'finite_difference'; got 'numeric'"):
        integrated_gradients(_forward, x, gradient="numeric")
    with pytest.raises(ValueError, match="internal_batch_size must be an int >= 1, got 0"):
        integrated_gradients(_forward, x, internal_batch_size=0)
    with pytest.raises(ValueError, match="completeness_tol must be a finite number > 0, got 0"):
        integrated_gradients(_forward, x, completeness_tol=0)
    with pytest.raises(TypeError, match="check_finite must be True or False, got str"):
        integrated_gradients(_forward, x, check_finite="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target must be None, 'mean', 'each'"):
        integrated_gradients(_forward, x, target="max")
    with pytest.raises(ValueError, match="a target tensor must have shape \\(B,\\) = \\(2,\\)"):
        integrated_gradients(lambda z: z, x, target=torch.tensor([0, 1, 2]))


def test_error_autograd_on_a_forward_autograd_cannot_differentiate() -> None:
    def detached(z: torch.Tensor) -> torch.Tensor:
        return z.detach().sum(1)

    with pytest.raises(ValueError, match="pass gradient='finite_difference'"):
        integrated_gradients(detached, torch.randn(2, 3))
    net = torch.nn.Linear(3, 1)

    def stepped(z: torch.Tensor) -> torch.Tensor:  # an op whose derivative torch does not implement
        return torch.heaviside(net(z)[:, 0], torch.tensor(0.5))

    with pytest.raises(ValueError, match="heaviside is not implemented; pass gradient='finite_difference'"):
        integrated_gradients(stepped, torch.randn(2, 3))


def test_error_a_nan_in_a_broadcast_baseline_is_counted_once() -> None:
    """One NaN in a ``(F,)`` baseline given for B states is one NaN/Inf value, at its own index (it used to be counted
    once per state, on the baseline broadcast to ``(B, F)``)."""
    baseline = torch.zeros(3)
    baseline[1] = float("nan")
    with pytest.raises(ValueError, match=r"baselines holds 1 NaN/Inf value\(s\), the first at index \(1,\)"):
        integrated_gradients(_forward, torch.randn(4, 3), baseline, n_steps=4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_error_cuda_backend_without_a_device() -> None:
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA device"):
        integrated_gradients(_forward, torch.randn(2, 3), backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cuda', 'torch'; got 'triton'"):
        integrated_gradients(_forward, torch.randn(2, 3), backend="triton")


def test_a_forward_that_changes_its_input_in_place_is_told_to_copy_it() -> None:
    """torch's own error names a leaf Variable and a view; the forward's author wrote ``x.mul_(2)``."""
    layer = torch.nn.Linear(4, 3)

    def scaled_in_place(x: torch.Tensor) -> torch.Tensor:
        return layer(x.mul_(2.0))

    with pytest.raises(RuntimeError, match=r"the forward changes its input or a parameter in place .*copy it first"):
        integrated_gradients(scaled_in_place, torch.randn(5, 4), target=0)


def test_target_forward_rejects_what_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="pass it to integrated_gradients"):
        target_forward(lambda z: z, "each")
    with pytest.raises(ValueError, match="pass it to integrated_gradients"):
        target_forward(lambda z: z, torch.tensor([0, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        forward = target_forward(lambda z: z * 2, 1)
        torch.testing.assert_close(forward(torch.ones(2, 3)), torch.full((2,), 2.0))


@pytest.mark.parametrize("entry", ["integrated_gradients", "IntegratedGradients"])
@pytest.mark.parametrize("before", [False, True])
def test_cuda_math_is_held_deterministic_and_float32_during_a_call_and_put_back(entry: str, before: bool) -> None:
    # cuDNN's own pick for a convolution's backward can sum with atomics (calls then differ in their last bits), and
    # TF32 (cuDNN's default for convolutions; matmuls where asked for) is noise the float32 estimate reads as kinks
    seen: list[tuple[bool, bool, str]] = []
    torch.manual_seed(5)
    model = DuelingMLP(6, 3)

    def forward(x: torch.Tensor) -> torch.Tensor:
        cudnn = torch.backends.cudnn
        seen.append((cudnn.deterministic, cudnn.allow_tf32, torch.get_float32_matmul_precision()))
        return model(x)

    def flags() -> tuple[bool, bool, str]:
        return torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()

    states = torch.randn(4, 6, generator=torch.Generator().manual_seed(6))
    previous = flags()
    given = (before, not before, "high" if before else "medium")  # as a user might have set them
    torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = given[:2]
    torch.set_float32_matmul_precision(given[2])
    try:
        if entry == "integrated_gradients":
            integrated_gradients(forward, states, target="mean", n_steps=8)
        else:
            IntegratedGradients(forward, target="mean", n_steps=8).attribute(states)
        assert seen and all(held == (True, False, "highest") for held in seen)
        assert flags() == given

        def failing(x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("the forward failed")

        with pytest.raises(RuntimeError, match="the forward failed"):
            integrated_gradients(failing, states, target="mean", n_steps=8)
        assert flags() == given
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32 = previous[:2]
        torch.set_float32_matmul_precision(previous[2])


def _forward(z: torch.Tensor) -> torch.Tensor:
    return z.reshape(z.shape[0], -1).sum(1)
