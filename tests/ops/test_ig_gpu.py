"""The IG engine on a CUDA device: each kernel of kernels/ig.cu (CudaIG) against its torch twin (TorchIG),
the non-finite flags, both gradient modes, half precision, determinism, n_steps="auto", the CUDA-graph path of
IntegratedGradients (stochastic forwards caught at capture), kernels on torch's current stream, and backend errors.

Run with ``pytest -m gpu tests/ops/test_ig_gpu.py``; skipped where there is no CUDA device or no CuPy.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, StochasticForwardWarning, integrated_gradients
from lightning_ig.ops.dtypes import accumulate_dtype
from lightning_ig.ops.ig import CudaIG, TorchIG
from tests.support.kernels import repeated_ends
from tests.support.models import DuelingMLP
from tests.support.tolerance import assert_close_scaled, eps, rounding_bound

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
F32 = torch.float32
KERNELS, TWINS = CudaIG(), TorchIG()
# Central differences with the default step h = eps^(1/3): truncation O(h^2) and rounding O(eps / h), both
# eps^(2/3) of the attributions' size (times the model's smoothness).
FD_TOLERANCE_F32 = 32 * eps(F32) ** (2 / 3)
SIZES = [(1, 1), (1, 3), (3, 1), (1, 1000), (5, 3), (2, 1000)]  # (B, F): odd sizes on purpose


def _generator(seed: int, device: torch.device) -> torch.Generator:
    # A private generator: tests draw fresh inputs without touching the global RNG.
    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, device), device=device, dtype=torch.float32).to(dtype)


def _dueling(features: int, actions: int, device: torch.device, *, seed: int, hidden: int = 64) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DuelingMLP(features, actions, hidden)
    return model.to(device).eval()


def _tanh_mlp(features: int, device: torch.device, *, seed: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(features, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    return model.to(device=device, dtype=dtype).eval()


# --------------------------------------------------------------------------- each kernel vs its twin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "features"), SIZES)
def test_interpolation_kernel_matches_its_twin(
    cuda_device: torch.device, dtype: torch.dtype, batch: int, features: int
) -> None:
    acc = accumulate_dtype(dtype)
    x = _randn((batch, features), dtype, cuda_device, 1)
    b = _randn((batch, features), dtype, cuda_device, 2)
    alphas = torch.rand(7, generator=_generator(3, cuda_device), device=cuda_device).to(acc)
    for end_copies in (0, 1, 2):
        ours = KERNELS.interpolate(x, b, alphas, end_copies)
        twin = TWINS.interpolate(x, b, alphas, end_copies)
        assert ours.shape == twin.shape == (7 + 2 * end_copies, batch, features)
        assert torch.equal(ours, twin)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "features"), [(1, 1), (1, 3), (3, 1), (2, 5), (1, 1000)])
def test_probe_and_gradient_kernels_match_their_twins(
    cuda_device: torch.device, dtype: torch.dtype, batch: int, features: int
) -> None:
    acc = accumulate_dtype(dtype)
    n_points = 3 if features == 1000 else 7
    points = _randn((n_points, features), dtype, cuda_device, 4)
    h = (torch.rand((batch, features), generator=_generator(5, cuda_device), device=cuda_device) * 0.1 + 1e-3).to(acc)
    for offset in (0, 1, 5):
        ours = KERNELS.fd_probes(points, h, offset)
        twin = TWINS.fd_probes(points, h, offset)
        assert torch.equal(ours, twin)
        # Into a chunk's forward buffer (P 2 F, F), as the engine asks for them.
        into_ours = torch.full((n_points * 2 * features, features), -1.0, dtype=dtype, device=cuda_device)
        into_twin = into_ours.clone()
        KERNELS.fd_probes(points, h, offset, out=into_ours)
        TWINS.fd_probes(points, h, offset, out=into_twin)
        assert torch.equal(into_ours, into_twin) and torch.equal(into_ours.view_as(ours), ours)
        n_targets = 3
        f = torch.randn(
            (n_points, 2, features, n_targets), generator=_generator(6, cuda_device), device=cuda_device
        ).to(acc)
        # Write into the middle of a larger buffer, as a chunk does: the target stride must be honoured.
        out_ours = torch.full((n_targets, n_points + 4, features), -7.0, dtype=acc, device=cuda_device)
        out_twin = out_ours.clone()
        KERNELS.fd_gradient(points, h, f, offset, out_ours[:, 2 : 2 + n_points])
        TWINS.fd_gradient(points, h, f, offset, out_twin[:, 2 : 2 + n_points])
        assert torch.equal(out_ours, out_twin)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "features"), SIZES)
def test_accumulation_kernel_matches_its_twin(
    cuda_device: torch.device, dtype: torch.dtype, batch: int, features: int
) -> None:
    acc = accumulate_dtype(dtype)
    x = _randn((batch, features), dtype, cuda_device, 7)
    b = _randn((batch, features), dtype, cuda_device, 8)
    for n_targets in (1, 4):
        grads = _randn((n_targets, 9, batch, features), acc, cuda_device, 9)
        weights = torch.rand(9, generator=_generator(10, cuda_device), device=cuda_device).to(acc)
        ours = KERNELS.accumulate(x, b, weights, grads)
        twin = TWINS.accumulate(x, b, weights, grads)
        assert torch.equal(ours, twin)
        per_state = _randn((n_targets, 9, batch), acc, cuda_device, 11)  # the kink rule's weights
        assert torch.equal(KERNELS.accumulate(x, b, per_state, grads), TWINS.accumulate(x, b, per_state, grads))
    grads = _randn((2, 600, batch, features), acc, cuda_device, 12)  # past one block of 256 summed steps
    weights = torch.rand(600, generator=_generator(13, cuda_device), device=cuda_device).to(acc)
    assert torch.equal(KERNELS.accumulate(x, b, weights, grads), TWINS.accumulate(x, b, weights, grads))
    per_state = _randn((2, 600, batch), acc, cuda_device, 14)
    assert torch.equal(KERNELS.accumulate(x, b, per_state, grads), TWINS.accumulate(x, b, per_state, grads))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "features"), [*SIZES, (300, 37), (2, 33), (3, 64), (1, 65)])
def test_completeness_kernel_matches_its_twin(
    cuda_device: torch.device, dtype: torch.dtype, batch: int, features: int
) -> None:
    acc = accumulate_dtype(dtype)
    for n_targets in (1, 3):
        attributions = _randn((n_targets, batch, features), dtype, cuda_device, 11)
        ends = _randn((2, batch, n_targets), acc, cuda_device, 12) * 5
        ends[1, 0, 0] = ends[0, 0, 0]  # one degenerate state
        ours = KERNELS.completeness(attributions, ends)
        twin = TWINS.completeness(attributions, ends)
        assert ours.shape == twin.shape == (7, n_targets, batch)
        assert not ours[6].any() and not twin[6].any()  # one copy of the ends: nothing to compare
        assert torch.equal(ours[4], twin[4])  # the degenerate flags
        assert torch.equal(ours[5], twin[5]) and not ours[5].any()  # nothing non-finite here
        assert torch.equal(ours[:2], twin[:2])  # f_input, f_baseline are copies
        # The twin sums the features in the kernel's order (lanes, then the shuffle tree): bit for bit.
        assert torch.equal(ours[2], twin[2])
        torch.testing.assert_close(ours[3], twin[3], rtol=0, atol=0, equal_nan=True)
        # ... and that order is a float sum: close to a float64 sum within its roundings.
        exact = attributions.double().sum(-1) - (ends[0].t() - ends[1].t()).double()
        bound = (
            (features + 5)
            * torch.finfo(acc).eps
            * (attributions.double().abs().sum(-1) + ends.double().abs().amax(0).t())
        )
        assert ((ours[2].double() - exact).abs() <= bound).all()
        # The relative error is |delta| / |f_input - f_baseline| of the kernel's own delta; NaN where degenerate.
        expected = (ours[2].abs() / (ours[0] - ours[1]).abs()).masked_fill(ours[4] != 0, float("nan"))
        torch.testing.assert_close(ours[3], expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_completeness_kernel_compares_repeated_ends_like_its_twin(
    cuda_device: torch.device, dtype: torch.dtype
) -> None:
    attributions, ends, expected = repeated_ends(dtype)
    attributions, ends = attributions.to(cuda_device), ends.to(cuda_device)
    ours = KERNELS.completeness(attributions, ends)
    torch.testing.assert_close(ours, TWINS.completeness(attributions, ends), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(ours[6].cpu() != 0, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_completeness_kernel_flags_nan_and_inf_like_its_twin(cuda_device: torch.device, dtype: torch.dtype) -> None:
    acc = accumulate_dtype(dtype)
    batch, features, n_targets = 8, 70, 2
    attributions = _randn((n_targets, batch, features), dtype, cuda_device, 13)
    ends = _randn((2, batch, n_targets), acc, cuda_device, 14) * 5
    attributions[0, 1, 3] = float("nan")  # one attribution NaN
    attributions[1, 2, 69] = float("inf")  # one attribution Inf, in the last (partial) lane chunk
    attributions[0, 3, 0] = float("inf")
    attributions[0, 3, 40] = float("-inf")  # Inf - Inf in the sum: NaN
    ends[0, 4, 0] = float("nan")  # F(x) NaN
    ends[1, 5, 1] = float("-inf")  # F(b) -Inf
    ends[0, 6, 0] = ends[1, 6, 0] = float("inf")  # F(x) = F(b) = Inf: non-finite, not degenerate
    ends[1, 7, 1] = ends[0, 7, 1]  # a degenerate state beside them
    ours = KERNELS.completeness(attributions, ends)
    twin = TWINS.completeness(attributions, ends)
    torch.testing.assert_close(ours, twin, rtol=0, atol=0, equal_nan=True)  # every row, bit for bit
    non_finite = torch.zeros((n_targets, batch), dtype=torch.bool, device=cuda_device)
    for t, s in [(0, 1), (1, 2), (0, 3), (0, 4), (1, 5), (0, 6)]:
        non_finite[t, s] = True
    assert torch.equal(ours[5] != 0, non_finite)
    assert torch.isinf(ours[3][non_finite]).all() and (ours[3][non_finite] > 0).all()  # relative error +Inf
    assert not (ours[4][non_finite] != 0).any()  # never degenerate
    assert ours[4, 1, 7] == 1 and torch.isnan(ours[3, 1, 7])


def test_engine_results_flag_non_finite_forwards_on_the_gpu(cuda_device: torch.device) -> None:
    model = _dueling(4, 2, cuda_device, seed=15)
    with torch.no_grad():
        model.advantage.weight[1, 3] = float("nan")
    x = _randn((5, 4), torch.float32, cuda_device, 16)
    for backend in ("cuda", "torch"):
        result = integrated_gradients(model, x, target=1, backend=backend)
        assert result.non_finite.all() and result.worst_relative_error == float("inf")
        assert result.num_non_finite == 5 and result.first_non_finite == 0 and result.num_checked == 0
    cuda = integrated_gradients(lambda t: (t * 1e38).sum(1) * 10, torch.ones(3, 4, device=cuda_device), backend="cuda")
    twin = integrated_gradients(lambda t: (t * 1e38).sum(1) * 10, torch.ones(3, 4, device=cuda_device), backend="torch")
    assert cuda.worst_relative_error == twin.worst_relative_error == float("inf")
    assert torch.equal(cuda.non_finite, twin.non_finite) and cuda.non_finite.all()


# --------------------------------------------------------------------------- the engine on the GPU


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
@pytest.mark.parametrize("target", ["mean", "each", 2, "per_row"])
def test_cuda_backend_matches_torch_backend(cuda_device: torch.device, gradient: str, target: object) -> None:
    model = _dueling(6, 4, cuda_device, seed=13)
    x = _randn((5, 6), torch.float32, cuda_device, 14)
    if target == "per_row":
        target = torch.tensor([0, 3, 1, 2, 2], device=cuda_device)
    ours = integrated_gradients(model, x, target=target, gradient=gradient, n_steps=12, backend="cuda")
    twin = integrated_gradients(model, x, target=target, gradient=gradient, n_steps=12, backend="torch")
    assert ours.backend == "cuda" and twin.backend == "torch"
    # The kernels equal their twins bit for bit; the forwards and gradients are the same torch calls.
    assert_close_scaled(ours.attributions.cpu(), twin.attributions.cpu(), ulps=64, dtype=F32)
    assert_close_scaled(ours.f_input.cpu(), twin.f_input.cpu(), ulps=64, dtype=F32)
    size = float(twin.attributions.abs().sum(-1).max())
    assert_close_scaled(ours.delta.cpu(), twin.delta.cpu(), ulps=64, dtype=F32, scale=size)


def test_agrees_with_captum_on_the_gpu(cuda_device: torch.device) -> None:
    captum_ig = pytest.importorskip("captum.attr").IntegratedGradients
    model = _dueling(16, 4, cuda_device, seed=15)
    x = _randn((8, 16), torch.float32, cuda_device, 16)
    mean_value = lambda z: model(z).mean(dim=1)  # noqa: E731
    ours = integrated_gradients(model, x, target="mean", n_steps=50, method="gausslegendre", backend="cuda")
    theirs = captum_ig(mean_value).attribute(x, n_steps=50, method="gausslegendre")
    # Same nodes and weights; the path in differently shaped GEMMs: float32 roundings of a forward and a
    # backward through 16 -> 64 -> 64 layers, each dot product summing up to 64 terms.
    scale = float(theirs.abs().max())
    assert float((ours.attributions - theirs).abs().max()) <= rounding_bound(scale, ulps=1024, dtype=F32)


def test_finite_differences_match_autograd_on_the_gpu(cuda_device: torch.device) -> None:
    model = _tanh_mlp(10, cuda_device, seed=17)
    x = _randn((4, 10), torch.float32, cuda_device, 18)
    exact = integrated_gradients(model, x, target=0, n_steps=20, backend="cuda")
    fd = integrated_gradients(model, x, target=0, n_steps=20, gradient="finite_difference", backend="cuda")
    assert (
        float((fd.attributions - exact.attributions).abs().max() / exact.attributions.abs().max()) <= FD_TOLERANCE_F32
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_half_precision_models(cuda_device: torch.device, dtype: torch.dtype, gradient: str) -> None:
    model32 = _tanh_mlp(6, cuda_device, seed=19)
    model16 = _tanh_mlp(6, cuda_device, seed=19, dtype=dtype)
    x = _randn((4, 6), torch.float32, cuda_device, 20)
    reference = integrated_gradients(model32, x, target=1, n_steps=16, backend="cuda")
    half = integrated_gradients(model16, x.to(dtype), target=1, n_steps=16, gradient=gradient, backend="cuda")
    assert half.attributions.dtype == dtype and half.f_input.dtype == torch.float32
    # A half-precision model against its float32 original: weights, activations and outputs rounded to 8-11 bits
    # (bfloat16, the coarser type, sets the bound for both); FD is coarser still (step ~0.1-0.2 of the coordinate).
    tolerance = (8 if gradient == "autograd" else 32) * eps(torch.bfloat16)
    scale = float(reference.attributions.abs().max())
    assert float((half.attributions.float() - reference.attributions).abs().max()) <= tolerance * scale
    assert torch.isfinite(half.delta).all()


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
def test_repeats_are_bit_identical_on_the_gpu(cuda_device: torch.device, gradient: str) -> None:
    model = _dueling(12, 4, cuda_device, seed=21)
    x = _randn((16, 12), torch.float32, cuda_device, 22)
    runs = [
        integrated_gradients(model, x, target="mean", gradient=gradient, n_steps=25, backend="cuda") for _ in range(3)
    ]
    for other in runs[1:]:
        assert torch.equal(other.attributions, runs[0].attributions)
        assert torch.equal(other.delta, runs[0].delta)


def test_auto_steps_on_the_gpu_match_the_torch_twin(cuda_device: torch.device) -> None:
    model = _tanh_mlp(5, cuda_device, seed=23, dtype=torch.float64)
    x = _randn((6, 5), torch.float64, cuda_device, 24) * 2
    options = {"target": 0, "n_steps": "auto", "completeness_tol": 1e-4}
    cuda = integrated_gradients(model, x, backend="cuda", **options)
    twin = integrated_gradients(model, x, backend="torch", **options)
    assert torch.equal(cuda.n_steps_per_state.cpu(), twin.n_steps_per_state.cpu())  # the same stops, per state
    assert_close_scaled(cuda.attributions.cpu(), twin.attributions.cpu(), ulps=64, dtype=torch.float64)
    assert cuda.worst_attribution_error <= 1e-4 / 2  # it stops on the estimate, at half the tolerance
    with pytest.raises(ValueError, match="refines by tripling the midpoint nodes"):
        integrated_gradients(model, x, backend="cuda", method="gausslegendre", **options)


def test_model_is_left_as_it_was_on_the_gpu(cuda_device: torch.device) -> None:
    model = _dueling(5, 3, cuda_device, seed=25).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state(cuda_device)
    x = _randn((4, 5), torch.float32, cuda_device, 26)
    with torch.inference_mode():
        integrated_gradients(model, x, target="mean", backend="cuda")
        IntegratedGradients(model, target="mean").attribute(x)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), cpu_rng) and torch.equal(torch.cuda.get_rng_state(cuda_device), cuda_rng)


# --------------------------------------------------------------------------- the CUDA-graph path


def test_graph_path_equals_eager_and_follows_weight_updates(cuda_device: torch.device) -> None:
    model = _dueling(32, 4, cuda_device, seed=27, hidden=256)
    engine = IntegratedGradients(model, target="mean", n_steps=50)
    x = _randn((16, 32), torch.float32, cuda_device, 28)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = engine.attribute(x)
    assert not [w for w in caught if "capture" in str(w.message)], [str(w.message) for w in caught]
    assert engine.last_mode == "capture" and first.cuda_graph
    eager = integrated_gradients(model, x, target="mean", n_steps=50)
    # The same calls captured and replayed: at most a few float32 roundings apart.
    assert_close_scaled(first.attributions.cpu(), eager.attributions.cpu(), ulps=16, dtype=F32)
    size = float(eager.attributions.abs().sum(-1).max())
    assert_close_scaled(first.delta.cpu(), eager.delta.cpu(), ulps=64, dtype=F32, scale=size)
    assert torch.equal(first.degenerate, eager.degenerate)

    second = engine.attribute(x)
    assert engine.last_mode == "graph"
    assert torch.equal(second.attributions, first.attributions)  # replays are bit-identical
    assert (
        second.attributions.data_ptr() != first.attributions.data_ptr()
    )  # results are copies, not the graph's buffers

    fresh = _randn((16, 32), torch.float32, cuda_device, 29)
    replayed = engine.attribute(fresh)
    assert_close_scaled(
        replayed.attributions.cpu(),
        integrated_gradients(model, fresh, target="mean", n_steps=50).attributions.cpu(),
        ulps=16,
        dtype=F32,
    )

    with torch.no_grad():  # what an optimizer step does: update the weights in place
        for parameter in model.parameters():
            parameter.mul_(0.9).add_(0.01)
    updated = engine.attribute(x)
    assert engine.last_mode == "graph"
    expected = integrated_gradients(model, x, target="mean", n_steps=50)
    assert_close_scaled(updated.attributions.cpu(), expected.attributions.cpu(), ulps=16, dtype=F32)
    assert not torch.allclose(updated.attributions, first.attributions)


@pytest.mark.parametrize("baseline_form", ["zeros", "mean", "scalar", "tensor"])
def test_graph_path_with_every_baseline_and_per_row_targets(cuda_device: torch.device, baseline_form: str) -> None:
    model = _dueling(7, 3, cuda_device, seed=30)
    engine = IntegratedGradients(model, n_steps=20)
    for seed in (31, 32):
        x = _randn((5, 7), torch.float32, cuda_device, seed)
        baselines = {
            "zeros": "zeros",
            "mean": "mean",
            "scalar": 0.5,
            "tensor": _randn((7,), torch.float32, cuda_device, seed + 10),
        }[baseline_form]
        rows = torch.tensor([seed % 3, 1, 2, 0, 1], device=cuda_device)
        result = engine.attribute(x, baselines, target=rows)
        expected = integrated_gradients(model, x, baselines, target=rows, n_steps=20)
        assert_close_scaled(result.attributions.cpu(), expected.attributions.cpu(), ulps=16, dtype=F32)
        torch.testing.assert_close(result.baselines, expected.baselines)
    assert engine.last_mode == "graph"


def test_graph_capture_failure_falls_back_to_eager(cuda_device: torch.device) -> None:
    model = _dueling(4, 2, cuda_device, seed=33)

    def syncing_forward(z: torch.Tensor) -> torch.Tensor:
        scale = float(z.abs().max())  # a host sync: cannot be captured
        return model(z).mean(dim=1) * (1.0 + 0.0 * scale)

    engine = IntegratedGradients(syncing_forward, n_steps=8)
    x = _randn((3, 4), torch.float32, cuda_device, 34)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture of the attribution failed"):
        result = engine.attribute(x)
    assert engine.last_mode == "eager" and not result.cuda_graph
    expected = integrated_gradients(syncing_forward, x, n_steps=8)
    torch.testing.assert_close(result.attributions, expected.attributions)
    engine.attribute(x)  # no second warning: the key is remembered as eager
    assert engine.last_mode == "eager"
    # The sync is caught before a capture starts, so the device generator still works.
    torch.randn(3, device=cuda_device)


def test_stochastic_forwards_are_caught_at_graph_capture(cuda_device: torch.device) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(37)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 3)
        )
    model = model.to(cuda_device).train()
    x = _randn((8, 6), torch.float32, cuda_device, 38)
    engine = IntegratedGradients(model, target="mean", n_steps=16)
    with pytest.warns(StochasticForwardWarning, match=r"2 \(Dropout in train mode\)"):
        first = engine.attribute(x)
    assert first.stochastic
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StochasticForwardWarning)  # warned again only if capture fell back to eager
        again = engine.attribute(x)
    assert again.stochastic  # a replay reports what its capture found
    deterministic = IntegratedGradients(model.eval(), target="mean", n_steps=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StochasticForwardWarning)
        captured = deterministic.attribute(x)
        replayed = deterministic.attribute(x)
    assert deterministic.last_mode == "graph" and captured.cuda_graph
    assert not captured.stochastic and not replayed.stochastic
    eager = integrated_gradients(model, x, target="mean", n_steps=16, backend="cuda")
    assert not eager.stochastic


def test_graph_off_and_finite_differences_run_eagerly(cuda_device: torch.device) -> None:
    model = _dueling(4, 2, cuda_device, seed=35)
    x = _randn((3, 4), torch.float32, cuda_device, 36)
    engine = IntegratedGradients(model, target="mean", cuda_graph=False)
    assert not engine.attribute(x).cuda_graph and engine.last_mode == "eager"
    engine = IntegratedGradients(model, target="mean", gradient="finite_difference")
    assert not engine.attribute(x).cuda_graph and engine.last_mode == "eager"
    engine = IntegratedGradients(model, target="mean", n_steps="auto")
    assert not engine.attribute(x).cuda_graph and engine.last_mode == "eager"


# --------------------------------------------------------------------------- the launch path


def test_kernels_launch_on_torchs_current_stream(cuda_device: torch.device) -> None:
    model = _dueling(9, 3, cuda_device, seed=42)
    x = _randn((6, 9), torch.float32, cuda_device, 43)
    reference = integrated_gradients(model, x, target="mean", n_steps=20, backend="torch")
    on_default = integrated_gradients(model, x, target="mean", n_steps=20, backend="cuda")
    side = torch.cuda.Stream(cuda_device)
    side.wait_stream(torch.cuda.current_stream(cuda_device))
    with torch.cuda.stream(side):  # every kernel must follow torch onto the side stream, or results race
        on_side = integrated_gradients(model, x, target="mean", n_steps=20, backend="cuda")
        engine = IntegratedGradients(model, target="mean", n_steps=20)
        captured, replayed = engine.attribute(x), engine.attribute(x)
    torch.cuda.current_stream(cuda_device).wait_stream(side)
    assert engine.last_mode == "graph" and replayed.backend == "cuda"
    for result in (on_side, captured, replayed):
        assert torch.equal(result.attributions, on_default.attributions) and torch.equal(result.delta, on_default.delta)
    assert_close_scaled(on_default.attributions.cpu(), reference.attributions.cpu(), ulps=16, dtype=F32)


# --------------------------------------------------------------------------- backend errors


def test_cuda_backend_errors(cuda_device: torch.device) -> None:
    forward = lambda z: z.sum(1)  # noqa: E731
    with pytest.raises(ValueError, match="backend='cuda' needs the tensors on a CUDA device, got cpu"):
        integrated_gradients(forward, torch.randn(2, 3), backend="cuda")
    result = integrated_gradients(forward, torch.randn(2, 3, device=cuda_device), backend="cuda")
    assert result.backend == "cuda"
    auto = integrated_gradients(forward, torch.randn(2, 3, device=cuda_device))
    assert auto.backend == "cuda"


def test_a_cpu_baseline_tensor_with_gpu_inputs(cuda_device: torch.device) -> None:
    # guards against: the queued finite check of a CPU baseline was a CPU flag, stacked with the GPU's flags: torch's
    # "Expected all tensors to be on the same device" from a call that takes the baseline to the inputs' device
    model = _dueling(4, 2, cuda_device, seed=42)
    x = _randn((3, 4), torch.float32, cuda_device, 43)
    on_gpu = integrated_gradients(model, x, torch.zeros(4, device=cuda_device), target="mean")
    for baseline in (torch.zeros(4), torch.zeros(3, 4, dtype=torch.float64)):
        result = integrated_gradients(model, x, baseline, target="mean")
        assert result.attributions.device == x.device
        torch.testing.assert_close(result.attributions, on_gpu.attributions, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"baselines as torch.float32 holds 4 NaN/Inf value\(s\)"):
        integrated_gradients(model, x, torch.full((4,), 1e39, dtype=torch.float64), target="mean")


def test_nan_and_inf_inputs_are_reported_after_the_queued_work(cuda_device: torch.device) -> None:
    # On CUDA the finite check is queued with the work and read at the end: the error is the same.
    model = _dueling(4, 2, cuda_device, seed=40)
    x = _randn((3, 4), torch.float32, cuda_device, 41)
    x[1, 2] = float("nan")
    x[2, 0] = float("inf")
    with pytest.raises(ValueError, match=r"inputs holds 2 NaN/Inf value\(s\), the first at index \(1, 2\)"):
        integrated_gradients(model, x, target="mean")
    baselines = torch.zeros(4, device=cuda_device)
    baselines[3] = float("-inf")
    with pytest.raises(ValueError, match=r"baselines holds 1 NaN/Inf value\(s\), the first at index \(3,\)"):
        integrated_gradients(model, x.nan_to_num(0.0, 0.0, 0.0), baselines, target="mean")
