"""The fused ensemble-reduce kernels on a CUDA device, against their torch twin on the same device.

What is promised, and so what is asserted:

* float32: the forward and ``d out / d logits`` are bit-identical to the twin
  (``lightning_ig.ensemble.ops.forward_torch`` / ``backward_torch`` run on the same
  device); ``d out / d weights`` is a float64 sum in another order, rounded once to
  float32: within one float32 ulp of the size of its terms.
* float16 / bfloat16: the kernels use the fast exp and division intrinsics (a few
  float32 ulp), then round to the half type: within one ulp of the half type.
* the same input gives the same bits on every call; CUDA-graph replays equal eager
  calls; nothing synchronises with the host.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.ensemble import Ensemble, ensemble_reduce, member_means
from lightning_ig.models import DuelingQNetwork
from lightning_ig.ops import ensemble_reduce as ops
from tests.support.tolerance import assert_close_scaled

pytestmark = pytest.mark.gpu

HALF_TYPES = (torch.float16, torch.bfloat16)
# M = 1, K = 1, B = 1, B not a multiple of a block's rows, M > 32 (two lane chunks), K a
# multiple of 4 (vector loads) and not, B beyond one pass of the grid (grid-stride loop)
SHAPES = [
    (1, 1, 1),
    (1, 8, 1),
    (3, 1, 5),
    (257, 7, 3),
    (1000, 33, 4),
    (64, 64, 4),
    (4096, 32, 16),
    (300_000, 3, 2),
    (5, 2, 1000),
]


def _ids(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _data(shape, dtype, device, seed=0, scale=4.0):
    generator = torch.Generator(device=device).manual_seed(seed)
    logits = (torch.randn(shape, generator=generator, device=device) * scale).to(dtype)
    weights = torch.randn(shape[1], generator=generator, device=device)
    return logits, weights


def _assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    actual, expected = actual.detach(), expected.detach()
    assert actual.dtype == expected.dtype == torch.float32 and actual.shape == expected.shape
    assert torch.equal(actual.contiguous().view(torch.int32), expected.contiguous().view(torch.int32)), (
        f"{int((actual != expected).sum())} of {actual.numel()} values differ; "
        f"max difference {float((actual - expected).abs().max())}"
    )


def _layouts(logits: torch.Tensor):
    """The same (B, M, K) values as contiguous, members-last (reduce_dim=1), unaligned and K-strided tensors."""
    rows, members, per_member = logits.shape
    yield "contiguous", logits, -1
    yield "members_last", logits.transpose(1, 2).contiguous(), 1
    unaligned = torch.empty(logits.numel() + 1, dtype=logits.dtype, device=logits.device)[1:].view(logits.shape)
    unaligned.copy_(logits)
    yield "unaligned", unaligned, -1  # the scalar path: the address is not a multiple of 4 elements
    strided = torch.zeros(rows, members, 2 * per_member, dtype=logits.dtype, device=logits.device)
    strided[..., ::2] = logits
    yield "k_strided", strided[..., ::2], -1


def _as_rows_members_logits(logits: torch.Tensor, reduce_dim: int) -> torch.Tensor:
    return logits if reduce_dim == -1 else logits.transpose(1, 2)


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_float32_forward_is_bit_identical_to_the_twin(cuda_device, shape) -> None:
    logits, weights = _data(shape, torch.float32, cuda_device)
    twin = ops.forward_torch(logits, weights)
    for name, layout, reduce_dim in _layouts(logits):
        out = ensemble_reduce(layout, weights, reduce_dim=reduce_dim, backend="cuda")
        assert out.dtype == torch.float32, name
        _assert_same_bits(out, twin)
    reference = (torch.sigmoid(logits.double()).mean(-1) * weights.double()).sum(-1)
    assert_close_scaled(
        twin.double().cpu(), reference.cpu(), ulps=shape[1] + shape[2] + 8, scale=float(weights.abs().sum())
    )


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_half_precision_forward_is_within_one_ulp_of_the_twin(cuda_device, shape, dtype) -> None:
    logits, weights = _data(shape, dtype, cuda_device, seed=1)
    twin = ops.forward_torch(logits, weights)  # exact float32 math, rounded once to the half type
    scale = float(weights.abs().sum())
    for name, layout, reduce_dim in _layouts(logits):
        out = ensemble_reduce(layout, weights, reduce_dim=reduce_dim, backend="cuda")
        assert out.dtype == dtype, name
        assert_close_scaled(out.double().cpu(), twin.double().cpu(), ulps=1, dtype=dtype, scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF_TYPES], ids=str)
def test_extreme_logits(cuda_device, dtype) -> None:
    big = 1e4
    logits = torch.tensor(
        [
            [[big, -big], [math.inf, -math.inf]],
            [[big, big], [-big, -big]],
            [[0.0, -0.0], [-big, big]],
            [[math.nan, 0.0], [0.0, 0.0]],
        ],
        device=cuda_device,
    ).to(dtype)
    weights = torch.tensor([1.0, 2.0], device=cuda_device)
    leaf = logits.clone().requires_grad_()
    out = ensemble_reduce(leaf, weights, backend="cuda")
    assert out[:3].tolist() == [0.5 + 1.0, 1.0, 0.5 + 1.0] and math.isnan(out[3].item())
    (grad,) = torch.autograd.grad(out[:3].sum(), leaf)
    assert torch.equal(grad[:2], torch.zeros_like(grad[:2]))  # saturated: exactly no gradient, never NaN
    assert grad[2, 0].tolist() == [0.125, 0.125]  # (w / K) sigmoid'(0) = (1 / 2) (1 / 4)
    if dtype == torch.float32:
        huge = torch.tensor([[[1e30, -1e30, 3e38, -3e38]]], device=cuda_device)
        assert ensemble_reduce(huge, weights[:1], backend="cuda").item() == 0.5  # (1 + 0 + 1 + 0) / 4
        _assert_same_bits(out[:3], ops.forward_torch(logits, weights)[:3])


def test_non_finite_cuda_weights_make_every_row_non_finite(cuda_device) -> None:
    logits, _ = _data((50, 3, 2), torch.float32, cuda_device)
    for bad in (math.nan, math.inf):
        weights = torch.tensor([0.5, bad, 0.5], device=cuda_device)
        assert not torch.isfinite(ensemble_reduce(logits, weights, backend="cuda")).any()


def test_empty_batch(cuda_device) -> None:
    logits = torch.zeros(0, 3, 4, device=cuda_device, requires_grad=True)
    weights = torch.ones(3, device=cuda_device, requires_grad=True)
    out = ensemble_reduce(logits, weights, backend="cuda")
    assert out.shape == (0,)
    grad_logits, grad_weights = torch.autograd.grad(out.sum(), (logits, weights))
    assert grad_logits.shape == (0, 3, 4) and grad_weights.tolist() == [0.0, 0.0, 0.0]


def test_argument_errors_on_the_gpu(cuda_device) -> None:
    logits, weights = _data((4, 3, 2), torch.float32, cuda_device)
    with pytest.raises(ValueError, match=r"logits are on cuda:\d+ and weights on cpu; move them to one device"):
        ensemble_reduce(logits, weights.cpu())
    with pytest.raises(
        TypeError, match="the ensemble kernels take float32, float16 and bfloat16 logits, got torch.float64"
    ):
        ensemble_reduce(logits.double(), weights, backend="cuda")
    with pytest.raises(ValueError, match="backend='cuda' needs the tensors on a CUDA device"):
        ensemble_reduce(logits.cpu(), weights.cpu(), backend="cuda")
    twin = ensemble_reduce(logits.double(), weights)  # "auto" runs the twin for float64
    assert twin.dtype == torch.float64 and twin.is_cuda


# --------------------------------------------------------------------------- backward


def _gradients(logits, weights, grad_output, backend, need=(True, True)):
    leaf = logits.detach().clone().requires_grad_(need[0])
    leaf_weights = weights.detach().clone().requires_grad_(need[1])
    out = ensemble_reduce(leaf, leaf_weights, backend=backend)
    wanted = [t for t, n in zip((leaf, leaf_weights), need) if n]
    grads = iter(torch.autograd.grad(out, wanted, grad_output))
    return out, *(next(grads) if n else None for n in need)


def _weight_gradient_scale(logits, grad_output) -> torch.Tensor:
    """Per member: sum_b |g_b| mean_k sigmoid, the size of the terms d out / d w_m sums."""
    return (grad_output.double().abs()[:, None] * member_means(logits.float()).double()).sum(0)


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)], ids=["both", "logits", "weights"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_float32_gradients_match_the_twin(cuda_device, shape, need) -> None:
    logits, weights = _data(shape, torch.float32, cuda_device, seed=2)
    grad_output = torch.randn(shape[0], device=cuda_device)  # not the last op: grad_output != 1
    _, grad_logits, grad_weights = _gradients(logits, weights, grad_output, "cuda", need)
    twin_logits, twin_weights = ops.backward_torch(logits, weights, grad_output, *need)
    if need[0]:
        _assert_same_bits(grad_logits, twin_logits)
    if need[1]:
        scale = _weight_gradient_scale(logits, grad_output).cpu()
        error = (grad_weights.double() - twin_weights.double()).abs().cpu()
        assert bool((error <= torch.finfo(torch.float32).eps * scale + 1e-38).all()), (error, scale)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("shape", [(257, 7, 3), (1000, 33, 4), (4096, 32, 16)], ids=_ids)
def test_half_precision_gradients_are_bounded(cuda_device, shape, dtype) -> None:
    logits, weights = _data(shape, dtype, cuda_device, seed=3)
    grad_output = torch.randn(shape[0], device=cuda_device).to(dtype)
    _, grad_logits, grad_weights = _gradients(logits, weights, grad_output, "cuda")
    twin_logits, twin_weights = ops.backward_torch(logits, weights, grad_output, True, True)
    assert grad_logits.dtype == dtype and grad_weights.dtype == torch.float32
    assert_close_scaled(
        grad_logits.double().cpu(),
        twin_logits.double().cpu(),
        ulps=1,
        dtype=dtype,
        scale=float(twin_logits.double().abs().max()),
    )
    # the fast intrinsics: a few float32 ulp per mean, in a float64 sum over the rows
    scale = _weight_gradient_scale(logits, grad_output).cpu()
    error = (grad_weights.double() - twin_weights.double()).abs().cpu()
    assert bool((error <= 32 * torch.finfo(torch.float32).eps * scale + 1e-30).all()), (error, scale)


def test_expanded_and_strided_grad_outputs_are_read_in_place(cuda_device) -> None:
    logits, weights = _data((333, 5, 4), torch.float32, cuda_device, seed=4)
    leaf = logits.clone().requires_grad_()
    ensemble_reduce(leaf, weights, backend="cuda").sum().backward()  # grad_output: an expanded 1
    _assert_same_bits(
        leaf.grad, ops.backward_torch(logits, weights, torch.ones(333, device=cuda_device), True, False)[0]
    )
    every_other = torch.randn(666, device=cuda_device)[::2]
    (grad,) = torch.autograd.grad(ensemble_reduce(leaf, weights, backend="cuda"), leaf, every_other)
    _assert_same_bits(grad, ops.backward_torch(logits, weights, every_other.contiguous(), True, False)[0])


def test_double_backward_on_the_gpu(cuda_device) -> None:
    logits, weights = _data((40, 6, 3), torch.float32, cuda_device, seed=5)

    def second(backend: str) -> tuple[torch.Tensor, ...]:
        leaf = logits.clone().requires_grad_()
        leaf_weights = weights.clone().requires_grad_()
        (grad,) = torch.autograd.grad(
            ensemble_reduce(leaf, leaf_weights, backend=backend).sum(), leaf, create_graph=True
        )
        return torch.autograd.grad((grad**2).sum(), (leaf, leaf_weights))

    for ours, twin in zip(second("cuda"), second("torch")):
        _assert_same_bits(ours, twin)  # the create_graph backward is the twin's on both paths


# --------------------------------------------------------------------------- determinism, streams, graphs


def test_repeats_are_bit_identical(cuda_device) -> None:
    logits, weights = _data((200_000, 5, 4), torch.float32, cuda_device, seed=6)
    grad_output = torch.randn(200_000, device=cuda_device)
    runs = [_gradients(logits, weights, grad_output, "cuda") for _ in range(5)]
    for run in runs[1:]:
        for value, first in zip(run, runs[0]):
            _assert_same_bits(value, first)
    _assert_same_bits(ensemble_reduce(logits, weights, backend="cuda"), runs[0][0])  # no-grad launch, same bits


def test_concurrent_streams_do_not_share_a_ticket_counter(cuda_device) -> None:
    inputs = [_data((100_000, 6, 4), torch.float32, cuda_device, seed=s) for s in (7, 8)]
    grad_output = torch.ones(100_000, device=cuda_device)
    expected = [_gradients(x, w, grad_output, "cuda")[2] for x, w in inputs]
    streams = [torch.cuda.Stream(cuda_device) for _ in inputs]
    results: list[list[torch.Tensor]] = [[], []]
    for _ in range(10):
        for k, (stream, (x, w)) in enumerate(zip(streams, inputs)):
            stream.wait_stream(torch.cuda.current_stream(cuda_device))
            with torch.cuda.stream(stream):
                results[k].append(_gradients(x, w, grad_output, "cuda")[2])
    torch.cuda.synchronize(cuda_device)
    for k in range(2):
        for value in results[k]:
            _assert_same_bits(value, expected[k])


def test_forward_and_backward_do_not_synchronise(cuda_device) -> None:
    logits, weights = _data((4096, 8, 4), torch.float32, cuda_device, seed=9)
    grad_output = torch.randn(4096, device=cuda_device)
    _gradients(logits, weights, grad_output, "cuda")  # compile and warm up first
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising torch call raises
    try:
        ensemble_reduce(logits, weights, backend="cuda")
        _gradients(logits, weights, grad_output, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def test_forward_and_backward_captured_in_a_cuda_graph_replay_like_eager_calls(cuda_device) -> None:
    shape = (5000, 12, 4)
    batches = [_data(shape, torch.float32, cuda_device, seed=10 + i) for i in range(4)]
    static_logits = batches[0][0].clone().requires_grad_()
    static_weights = batches[0][1].clone().requires_grad_()
    static_grad_output = torch.randn(shape[0], device=cuda_device)

    def step() -> tuple[torch.Tensor, ...]:
        out = ensemble_reduce(static_logits, static_weights, backend="cuda")
        return (out, *torch.autograd.grad(out, (static_logits, static_weights), static_grad_output))

    side = torch.cuda.Stream(cuda_device)  # warm up on a side stream (compiles the kernels), as torch asks
    side.wait_stream(torch.cuda.current_stream(cuda_device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(cuda_device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_results = step()
    for logits, weights in batches:
        with torch.no_grad():
            static_logits.copy_(logits)
            static_weights.copy_(weights)
        graph.replay()
        eager = _gradients(logits, weights, static_grad_output, "cuda")
        for replayed, expected in zip(static_results, eager):
            _assert_same_bits(replayed, expected)


# --------------------------------------------------------------------------- the Ensemble target on the GPU


def test_ig_of_an_ensemble_on_the_gpu_matches_the_cpu(cuda_device) -> None:
    torch.manual_seed(12)
    members = [DuelingQNetwork(6, 3, hidden_sizes=(32,), noisy=False, activation="tanh") for _ in range(4)]
    ensemble = Ensemble(members, weights=[0.4, 0.3, 0.2, 0.1]).eval()
    states = torch.randn(16, 6)
    cpu = integrated_gradients(ensemble, states, n_steps=32, backend="torch")
    cpu_members = integrated_gradients(ensemble.member_signals, states, target="each", n_steps=32, backend="torch")
    ensemble.to(cuda_device)
    gpu = integrated_gradients(ensemble, states.to(cuda_device), n_steps=32, backend="cuda")
    gpu_members = integrated_gradients(
        ensemble.member_signals, states.to(cuda_device), target="each", n_steps=32, backend="cuda"
    )
    scale = float(cpu.attributions.abs().max())
    # cuBLAS and the CPU's BLAS sum the members' layers in other orders: float32 rounding, 32 steps
    assert_close_scaled(gpu.attributions.cpu(), cpu.attributions, ulps=256, scale=scale)
    assert_close_scaled(
        gpu_members.attributions.cpu(),
        cpu_members.attributions,
        ulps=256,
        scale=float(cpu_members.attributions.abs().max()),
    )
    assert gpu.worst_relative_error < 1e-3 and gpu_members.worst_relative_error < 1e-3


# --------------------------------------------------------------------------- kernel variants

VARIANT_SHAPES = [(1, 1, 4), (3, 1, 8), (257, 7, 3), (1000, 33, 4), (4096, 32, 16), (5, 2, 1000), (70_001, 5, 8)]


@pytest.mark.parametrize("name", sorted(ops.VARIANTS))
def test_every_variant_is_bit_identical_to_the_twin_and_the_default(cuda_device, name) -> None:
    for shape in VARIANT_SHAPES:
        logits, weights = _data(shape, torch.float32, cuda_device, seed=20)
        logits.view(-1)[:: max(1, logits.numel() // 7)] = torch.tensor(1e4, device=cuda_device)  # saturated members too
        grad_output = torch.randn(shape[0], device=cuda_device)
        twin = ops.forward_torch(logits, weights)
        twin_logits, _ = ops.backward_torch(logits, weights, grad_output, True, False)
        with ops.use_variant(name):
            for _, layout, reduce_dim in _layouts(logits):
                leaf = layout.detach().requires_grad_()  # the same strides and offset (clone() would realign)
                out = ensemble_reduce(leaf, weights, reduce_dim=reduce_dim, backend="cuda")
                _assert_same_bits(out, twin)
                (grad,) = torch.autograd.grad(out, leaf, grad_output)
                _assert_same_bits(_as_rows_members_logits(grad, reduce_dim), twin_logits)
            for dtype in HALF_TYPES:  # the knobs apply to the half types too: same bits as the default variant
                half = logits.to(dtype)
                got = ensemble_reduce(half, weights, backend="cuda")
                with ops.use_variant(ops.DEFAULT_VARIANT):
                    expected = ensemble_reduce(half, weights, backend="cuda")
                assert torch.equal(got.view(torch.int16), expected.view(torch.int16)), (name, shape, dtype)


_PROBE = r"""
extern "C" __global__ void probe_reciprocal(unsigned int* mismatches) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i > (1u << 23)) return;
    const float y = __uint_as_float(0x3f800000u + i);  // every float in [1, 2]
    if (__float_as_uint(lig_ens_reciprocal_1_to_2(y)) != __float_as_uint(__frcp_rn(y))) atomicAdd(mismatches, 1u);
}
extern "C" __global__ void probe_divisor(const unsigned int* bits, long long n, unsigned int* mismatches) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = __uint_as_float(bits[i]);
    for (int K = 1; K <= (1 << 20); K *= 2) {
        const float lean = lig_ens_divisor(K)(x), exact = __fdiv_rn(x, static_cast<float>(K));
        if (__float_as_uint(lean) != __float_as_uint(exact) && !(lean != lean && exact != exact))
            atomicAdd(mismatches, 1u);
    }
}
"""


def test_lean_gives_the_exactly_rounded_bits(cuda_device) -> None:
    """LIG_ENS_LEAN's reciprocal on every float in [1, 2], and its power-of-two division on random bit patterns
    (subnormal, infinite and NaN ones included), against __frcp_rn and __fdiv_rn."""
    from lightning_ig.ops import _cupy

    cupy = _cupy.require_cupy()
    source = _cupy.kernel_source("ensemble.cu") + _PROBE
    options = ("-std=c++17", f"-I{_cupy.kernel_dir().as_posix()}", "-DLIG_ENS_LEAN=1", "-DLIG_ENS_ONE_DTYPE")
    with cupy.cuda.Device(cuda_device.index):
        module = cupy.RawModule(code=source, options=options)
        mismatches = cupy.zeros(2, dtype=cupy.uint32)
        count = (1 << 23) + 1
        module.get_function("probe_reciprocal")(((count + 255) // 256,), (256,), (mismatches[0:1],))
        generator = torch.Generator(device=cuda_device).manual_seed(21)
        bits = torch.randint(-(2**31), 2**31, (1 << 20,), device=cuda_device, generator=generator, dtype=torch.int64)
        bits = torch.cat([bits, torch.arange(0, 1 << 16, device=cuda_device) * 3]).to(torch.int32)  # subnormals
        words = cupy.asarray(bits).view(cupy.uint32)
        module.get_function("probe_divisor")(
            ((words.size + 255) // 256,), (256,), (words, cupy.int64(words.size), mismatches[1:2])
        )
        assert mismatches.get().tolist() == [0, 0]


def test_use_variant_switches_and_restores(cuda_device) -> None:
    logits, weights = _data((100, 9, 4), torch.float32, cuda_device, seed=22)
    other = next(name for name in ops.VARIANTS if name != ops.DEFAULT_VARIANT)
    with ops.use_variant(other) as variant:
        assert variant == ops.VARIANTS[other] and ops._active_variant == other
        ensemble_reduce(logits, weights, backend="cuda")
    assert ops._active_variant == ops.DEFAULT_VARIANT
    assert {key[3] for key in ops._kernels if key[0] == "ensemble_forward"} >= {other}
