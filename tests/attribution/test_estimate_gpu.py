"""The error figures on a CUDA device: the CUDA backend's (kernels for accumulation and completeness, the estimate
in torch beside them) against the torch twins', on ReLU and tanh networks (the kink and the curvature terms), a real
CUDA graph's replay against eager, target="contrast" in a captured graph, n_steps="budget" resolved alike eagerly
and in a graph, and the kink rule (its per-state weights in the accumulation kernel, its certificate in a graph).

Run with ``pytest -m gpu tests/attribution/test_estimate_gpu.py``; skipped where there is no CUDA device or CuPy.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from lightning_ig.attribution.budget import budget_steps
from lightning_ig.attribution.exact_line import midpoint_reference
from lightning_ig.attribution.kinks import BUDGET_NODES
from tests.support.models import DuelingMLP, seeded_mlp
from tests.support.tolerance import assert_close_scaled, state_errors

pytestmark = pytest.mark.gpu

F32 = torch.float32
FIGURES = ("attribution_error", "mass_relative_error")


def _relu_dueling(device: torch.device, seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DuelingMLP(16, 4, 128)
    return model.to(device).eval()


def _tanh_dueling(device: torch.device, seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4))
    return model.to(device).eval()


def _states(device: torch.device, seed: int, count: int = 32) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn((count, 16), generator=generator, device=device)


def _assert_figures_close(actual, expected, ulps: int) -> None:
    # The estimate sums one term per stretch between nodes, each a difference of forward values (a cancellation
    # carrying their rounding): its rounding grows with the nodes, hence the scale times n_steps.
    for name in FIGURES:
        got, want = getattr(actual, name).double().cpu(), getattr(expected, name).double().cpu()
        scale = float(want.abs().max()) * int(actual.n_steps)
        assert_close_scaled(got, want, ulps=ulps, dtype=F32, scale=scale)
    assert torch.equal(actual.near_baseline.cpu(), expected.near_baseline.cpu())


@pytest.mark.parametrize("network", ["relu", "tanh"])
@pytest.mark.parametrize("target", ["mean", "contrast", "each"])
def test_cuda_backend_figures_equal_the_torch_twins(cuda_device: torch.device, target: str, network: str) -> None:
    model = (_relu_dueling if network == "relu" else _tanh_dueling)(cuda_device, 70)
    x = _states(cuda_device, 71)
    cuda = integrated_gradients(model, x, target=target, backend="cuda")
    twin = integrated_gradients(model, x, target=target, backend="torch")
    expected_steps = budget_steps(model, x[:1], 32, each=target == "each", finite_difference=False)
    assert cuda.backend == "cuda" and cuda.method == "riemann_middle" and cuda.n_steps == twin.n_steps
    assert cuda.n_steps == expected_steps == 256  # a small network on a GPU: the most points, for the launches' time
    assert_close_scaled(cuda.attributions.cpu(), twin.attributions.cpu(), ulps=16, dtype=F32)
    _assert_figures_close(cuda, twin, ulps=256)  # the estimate divides by ||a||_1: a few more roundings


def test_the_budget_is_resolved_alike_eagerly_and_in_a_graph_per_shape(cuda_device: torch.device) -> None:
    model = _relu_dueling(cuda_device, 77)
    engine = IntegratedGradients(model, target="mean")
    small, large = _states(cuda_device, 78, 32), _states(cuda_device, 79, 65536)
    points = {2**k: budget_steps(model, small[:1], 2**k, each=False, finite_difference=False) for k in range(16)}
    middle = _states(cuda_device, 80, min(c for c, n in points.items() if n == 128))  # 128 points: the kink rule's 112
    for x in (small, large, middle, small):
        expected = integrated_gradients(model, x, target="mean")
        engine.attribute(x)
        replayed = engine.attribute(x)  # the fast path: the plan's own number of points
        assert engine.last_mode == "graph" and replayed.n_steps == expected.n_steps
        assert_close_scaled(replayed.attributions.cpu(), expected.attributions.cpu(), ulps=16, dtype=F32)
    assert engine.attribute(small).n_steps == 256 and engine.attribute(large).n_steps == BUDGET_NODES
    assert engine.attribute(large).method == engine.attribute(middle).method == "kink_midpoint"
    assert engine.attribute(middle).n_steps == 2 * BUDGET_NODES and engine.last_mode == "graph"


@pytest.mark.parametrize("target", ["mean", "contrast"])
def test_a_cuda_graph_replay_gives_the_eager_figures(cuda_device: torch.device, target: str) -> None:
    model = _relu_dueling(cuda_device, 72)
    engine = IntegratedGradients(model, target=target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.attribute(_states(cuda_device, 73))
    assert not [w for w in caught if "capture" in str(w.message)], [str(w.message) for w in caught]
    x = _states(cuda_device, 74)
    replayed = engine.attribute(x)
    assert engine.last_mode == "graph" and replayed.cuda_graph
    eager = integrated_gradients(model, x, target=target)
    if target == "contrast":
        assert torch.equal(replayed.target_actions, eager.target_actions)  # chosen for the replay's own states
    assert_close_scaled(replayed.attributions.cpu(), eager.attributions.cpu(), ulps=16, dtype=F32)
    _assert_figures_close(replayed, eager, ulps=256)
    assert replayed.worst_attribution_error == pytest.approx(eager.worst_attribution_error, rel=1e-4)


@pytest.mark.parametrize("target", ["mean", "contrast", "each"])
def test_the_kink_rule_on_the_device_eagerly_and_replayed(cuda_device: torch.device, target: str) -> None:
    model, x = _relu_dueling(cuda_device, 75), _states(cuda_device, 76)
    cuda = integrated_gradients(model, x, target=target, method="kink_midpoint", backend="cuda")
    twin = integrated_gradients(model, x, target=target, method="kink_midpoint", backend="torch")
    points = budget_steps(model, x[:1], x.shape[0], each=target == "each", finite_difference=False)
    assert cuda.method == twin.method == "kink_midpoint" and cuda.n_steps == BUDGET_NODES * points // 64
    assert_close_scaled(cuda.attributions.cpu(), twin.attributions.cpu(), ulps=64, dtype=F32)
    _assert_figures_close(cuda, twin, ulps=1024)
    engine = IntegratedGradients(model, target=target, method="kink_midpoint")
    engine.attribute(x)
    replayed = engine.attribute(x)
    assert engine.last_mode == "graph" and replayed.method == "kink_midpoint"
    assert_close_scaled(replayed.attributions.cpu(), cuda.attributions.cpu(), ulps=64, dtype=F32)
    _assert_figures_close(replayed, cuda, ulps=1024)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", ["kink_midpoint", "riemann_middle"])
def test_a_half_precision_forward_is_read_at_its_own_rounding_on_the_device(
    cuda_device: torch.device, dtype: torch.dtype, method: str
) -> None:
    # Its gradients carry the forward's rounding: the estimate adds it, in the first call and in the graph's replay
    net = seeded_mlp(6, 3, seed=0, hidden=32, dtype=dtype)
    states = torch.randn(16, 6).to(dtype)
    truth = midpoint_reference(net, states, target="mean").attributions
    engine = IntegratedGradients(net.to(cuda_device), target="mean", method=method, n_steps=64)
    for _ in ("first call", "replay"):
        result = engine.attribute(states.to(cuda_device))
        error = state_errors(result.attributions.cpu(), truth)
        assert float(error.max()) > 64 * torch.finfo(F32).eps
        assert float((result.attribution_error.double().cpu() / error).min()) >= 0.5
