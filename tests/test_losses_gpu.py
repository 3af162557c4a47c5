"""The fused soft-margin kernels on a CUDA device, against a float64 reference and against torch.

Tolerances are roundings of the dtype (ulps, times its eps), relative to each value,
on top of rounding the float64 reference to the dtype (see tests/support/tolerance.py):

=========  ==========  ========  ==========================================
dtype      vs float64  vs torch  why
=========  ==========  ========  ==========================================
float32    9 ulps      84 ulps   ~4 ulp per element; torch rounds differently
float16    2.5 ulps    5.2 ulps  output rounding; torch rounds each step in half
bfloat16   2.5 ulps    3.9 ulps  output rounding; torch rounds each step in bf16
=========  ==========  ========  ==========================================

The absolute floor is the dtype's smallest normal number times those ulps: it only
covers values that round to a subnormal (a mean's gradient in float16 is subnormal
for n >~ 16k), where the spacing is ``eps * tiny``. Where the result is a
difference of larger terms (second derivatives, parameters after training steps),
the scale is the size of those terms, as the test says.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_ig.losses import SoftMarginLoss, soft_margin_loss, swap_soft_margin
from lightning_ig.ops.soft_margin import soft_margin_torch
from tests.support.tolerance import assert_close_scaled

pytestmark = pytest.mark.gpu

REDUCTIONS = ("none", "mean", "sum")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# dtype -> ulps against the float64 reference (rounded to the dtype)
ULPS_VS_REFERENCE = {torch.float32: 9, torch.float16: 2.5, torch.bfloat16: 2.5}
# dtype -> ulps against torch's own loss, which rounds its intermediate steps differently
ULPS_VS_TORCH = {torch.float32: 84, torch.float16: 5.2, torch.bfloat16: 3.9}
SIZES = [(0,), (1,), (3,), (1023,), (4097,), (512, 4096)]


def _data(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0, scale: float = 3.0):
    generator = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(shape, generator=generator, device=device) * scale).to(dtype)
    y = (torch.randint(0, 2, shape, generator=generator, device=device) * 2 - 1).to(dtype)
    return x, y


def _reference(x: torch.Tensor, y: torch.Tensor, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and dL/dx (for grad_output = 1) in float64, from the exact values of x and y."""
    x64, y64 = x.detach().double(), y.detach().double().expand(x.shape)
    z = -y64 * x64
    loss = torch.logaddexp(z, torch.zeros((), dtype=torch.float64, device=x.device))
    grad = -y64 * torch.sigmoid(z)
    if reduction == "mean":
        return loss.mean(), grad / max(x.numel(), 1)
    if reduction == "sum":
        return loss.sum(), grad
    return loss, grad


def _assert_ulps(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, ulps: float, scale: float | None = None
) -> None:
    """Within ``ulps`` roundings of ``dtype`` at ``scale`` (default: each value's own size, floored at
    the dtype's smallest normal number); equal values (infinities) and NaN against NaN pass."""
    actual64 = actual.detach().double().cpu().numpy().reshape(-1)
    expected64 = expected.detach().double().cpu().numpy().reshape(-1)
    assert actual64.shape == expected64.shape, (actual.shape, expected.shape)
    same = (actual64 == expected64) | (np.isnan(actual64) & np.isnan(expected64))
    floor = torch.finfo(dtype).tiny if scale is None else scale
    assert_close_scaled(actual64[~same], expected64[~same], ulps=ulps, dtype=dtype, scale=floor)


def _assert_close(actual: torch.Tensor, expected64: torch.Tensor, dtype: torch.dtype) -> None:
    """``actual`` (in ``dtype``) against a float64 value, allowing the rounding to ``dtype``."""
    assert actual.dtype == dtype
    rounded = expected64.to(dtype)  # overflow to inf in a half type is what torch gives too
    _assert_ulps(actual, rounded, dtype, ULPS_VS_REFERENCE[dtype])


@pytest.mark.parametrize("shape", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loss_and_gradient_match_the_float64_reference(
    cuda_device: torch.device, dtype: torch.dtype, reduction: str, shape: tuple[int, ...]
) -> None:
    x, y = _data(shape, dtype, cuda_device)
    leaf = x.clone().requires_grad_()
    loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
    if reduction == "none":
        weights = torch.rand(shape, device=cuda_device, dtype=dtype)
        (loss * weights).sum().backward()
    else:
        weights = None
        loss.backward()
    expected_loss, expected_grad = _reference(x, y, reduction)
    if weights is not None:
        expected_grad = expected_grad * weights.double()
    assert loss.shape == expected_loss.shape
    _assert_close(loss.detach(), expected_loss, dtype)
    _assert_close(leaf.grad, expected_grad, dtype)
    # without a gradient the forward takes its own (cheaper) kernels: same values
    _assert_close(soft_margin_loss(x, y, reduction, backend="cuda"), expected_loss, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loss_and_gradient_match_torch(cuda_device: torch.device, dtype: torch.dtype, reduction: str) -> None:
    # moderate values: torch's half types overflow exp(-y x) past |x| ~ 11
    x, y = _data((512, 4096), dtype, cuda_device, seed=1, scale=2.0)
    grads, values = [], []
    for fn in (soft_margin_loss, F.soft_margin_loss):
        leaf = x.clone().requires_grad_()
        loss = fn(leaf, y, reduction=reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        values.append(loss.detach())
        grads.append(leaf.grad)
    _assert_ulps(values[0], values[1], dtype, ULPS_VS_TORCH[dtype])
    # gradients at the size of the largest one; a mean over 2M elements puts half-precision
    # gradients among the subnormals, where the dtype's smallest normal number is the floor
    scale = max(grads[1].abs().max().item(), torch.finfo(dtype).tiny)
    _assert_ulps(grads[0], grads[1], dtype, ULPS_VS_TORCH[dtype], scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_input(cuda_device: torch.device, dtype: torch.dtype) -> None:
    shape = (2**26 + 3,)  # ~67M elements, and not a multiple of the vector width
    x, y = _data(shape, dtype, cuda_device, seed=2)
    # large gradients are scaled by the kernel: grad_output == 1 (it returns at once) and 0.5
    for reduction, grad_output in (("mean", 1.0), ("sum", 0.5)):
        leaf = x.clone().requires_grad_()
        loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
        (loss * grad_output).backward()
        expected_loss, expected_grad = _reference(x, y, reduction)
        _assert_close(loss.detach(), expected_loss, dtype)
        _assert_close(leaf.grad, expected_grad * grad_output, dtype)
        del leaf, loss, expected_grad
    expected_none, _ = _reference(x, y, "none")
    _assert_close(soft_margin_loss(x, y, "none", backend="cuda"), expected_none, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_non_contiguous_input_and_broadcast_target(cuda_device: torch.device, reduction: str) -> None:
    base, _ = _data((300, 514), torch.float32, cuda_device, seed=3)
    x = base[:, 1::2].t()  # (257, 300), strided and transposed
    y = (torch.arange(300, device=cuda_device) % 2 * 2 - 1).float()  # (300,) broadcasts over rows
    assert not x.is_contiguous()
    leaf = x.detach().clone().t().contiguous().t().requires_grad_()  # a non-contiguous leaf
    assert not leaf.is_contiguous()
    loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
    (loss.sum() if reduction == "none" else loss).backward()
    expected_loss, expected_grad = _reference(x, y, reduction)
    _assert_close(loss.detach(), expected_loss, torch.float32)
    assert leaf.grad.shape == leaf.shape
    _assert_close(leaf.grad, expected_grad, torch.float32)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unaligned_pointers_take_the_scalar_path(cuda_device: torch.device, dtype: torch.dtype, reduction: str) -> None:
    x_buffer, y_buffer = _data((4099,), dtype, cuda_device, seed=4)
    x, y = x_buffer[1:], y_buffer[1:]  # contiguous views one element past an aligned start
    assert x.data_ptr() % 16 != 0
    leaf_buffer = x_buffer.clone().requires_grad_()
    loss = soft_margin_loss(leaf_buffer[1:], y, reduction, backend="cuda")
    (loss.sum() if reduction == "none" else loss).backward()
    expected_loss, expected_grad = _reference(x, y, reduction)
    _assert_close(loss.detach(), expected_loss, dtype)
    _assert_close(leaf_buffer.grad[1:], expected_grad, dtype)
    assert leaf_buffer.grad[0].item() == 0.0


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_not_the_last_op(cuda_device: torch.device, dtype: torch.dtype, reduction: str) -> None:
    """grad_output != 1: the loss is scaled, and mixed with another differentiable tensor."""
    x, y = _data((33, 129), dtype, cuda_device, seed=5)
    leaf = x.clone().requires_grad_()
    coefficient = torch.tensor(0.75, device=cuda_device, dtype=dtype, requires_grad=True)
    loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
    if reduction == "none":
        # a non-contiguous grad_output: the loss is used transposed
        weights = torch.rand(129, 33, device=cuda_device, dtype=dtype)
        total = (loss.t() * weights * coefficient).sum()
        grad_output = weights.t().double() * 0.75
    else:
        total = loss * coefficient * 2.0 - 1.0
        grad_output = torch.tensor(1.5, dtype=torch.float64, device=cuda_device)
    total.backward()
    _, expected_grad = _reference(x, y, reduction)
    _assert_close(leaf.grad, expected_grad * grad_output, dtype)
    assert coefficient.grad is not None


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extreme_values_stay_finite(cuda_device: torch.device, dtype: torch.dtype, reduction: str) -> None:
    # so that the sum of the (at most 32) losses stays representable in the dtype: float16's
    # max is 65504, and a true sum beyond it is inf in float16 for torch and for us alike
    largest = torch.finfo(dtype).max / 64
    magnitudes = [0.0, 1e-3, 1.0, 11.0, 20.0, 88.0, 89.0, 700.0, 1e4, 1e6, 1e30, largest]
    magnitudes = [m for m in magnitudes if m <= largest] + [largest]
    values = torch.tensor(magnitudes + [-m for m in magnitudes], dtype=torch.float64, device=cuda_device)
    x = values.repeat(2).to(dtype)
    y = torch.cat([torch.ones(len(values)), -torch.ones(len(values))]).to(device=cuda_device, dtype=dtype)
    assert not torch.isfinite(F.soft_margin_loss(x, y, reduction="none")).all()  # torch overflows here
    leaf = x.clone().requires_grad_()
    loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
    (loss.sum() if reduction == "none" else loss).backward()
    assert torch.isfinite(loss).all() and torch.isfinite(leaf.grad).all()
    expected_loss, expected_grad = _reference(x, y, reduction)
    _assert_normal_or_flushed(loss.detach(), expected_loss, dtype)
    _assert_normal_or_flushed(leaf.grad, expected_grad, dtype)


def _assert_normal_or_flushed(actual: torch.Tensor, expected64: torch.Tensor, dtype: torch.dtype) -> None:
    """Normal values within ULPS_VS_REFERENCE; a subnormal one (exp(-89) in float32) may be flushed to zero."""
    tiny = torch.finfo(dtype).tiny
    rounded = expected64.to(dtype).double()
    normal = rounded.abs() >= tiny
    _assert_ulps(actual.double()[normal], rounded[normal], dtype, ULPS_VS_REFERENCE[dtype])
    assert bool((actual.double()[~normal].abs() <= tiny).all()), actual[~normal]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_input(cuda_device: torch.device, reduction: str) -> None:
    x = torch.empty(0, 7, device=cuda_device, requires_grad=True)
    loss = soft_margin_loss(x, torch.empty(0, 7, device=cuda_device), reduction, backend="cuda")
    expected = F.soft_margin_loss(x.detach(), torch.empty(0, 7, device=cuda_device), reduction=reduction)
    torch.testing.assert_close(loss.detach(), expected, equal_nan=True)
    (loss.sum() if reduction == "none" else loss).backward()
    assert x.grad.shape == (0, 7)


@pytest.mark.parametrize("shape", [(512, 4096), (2**24 + 5,)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_repeats_are_bit_identical(cuda_device: torch.device, shape: tuple[int, ...], reduction: str) -> None:
    x, y = _data(shape, torch.float32, cuda_device, seed=6)
    runs = []
    for _ in range(5):
        leaf = x.clone().requires_grad_()
        loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
        loss.backward()
        runs.append((loss.detach(), leaf.grad, soft_margin_loss(x, y, reduction, backend="cuda")))
    for loss, grad, forward_only in runs[1:]:
        assert torch.equal(loss, runs[0][0]) and torch.equal(grad, runs[0][1])
        assert torch.equal(forward_only, runs[0][2])
    assert torch.equal(runs[0][0], runs[0][2])  # the gradient write does not change the sum


def test_concurrent_streams_do_not_share_a_ticket_counter(cuda_device: torch.device) -> None:
    inputs = [_data((2**22 + 1,), torch.float32, cuda_device, seed=s) for s in (7, 8)]
    expected = [soft_margin_loss(x, y, "sum", backend="cuda") for x, y in inputs]
    streams = [torch.cuda.Stream(cuda_device) for _ in inputs]
    results: list[list[torch.Tensor]] = [[], []]
    for _ in range(20):
        for k, (stream, (x, y)) in enumerate(zip(streams, inputs)):
            stream.wait_stream(torch.cuda.current_stream(cuda_device))
            with torch.cuda.stream(stream):
                results[k].append(soft_margin_loss(x, y, "sum", backend="cuda"))
    torch.cuda.synchronize(cuda_device)
    for k in range(2):
        assert all(torch.equal(value, expected[k]) for value in results[k])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_retained_graph_and_double_backward(cuda_device: torch.device, reduction: str) -> None:
    x, y = _data((37, 41), torch.float32, cuda_device, seed=9)
    leaf = x.clone().requires_grad_()
    loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
    total = loss.sum() if reduction == "none" else loss
    total.backward(retain_graph=True)
    (total * 2.0).backward()  # through the retained graph: 1 + 2 times the gradient
    _, expected_grad = _reference(x, y, reduction)
    _assert_close(leaf.grad, 3.0 * expected_grad, torch.float32)

    def second_derivative(fn) -> torch.Tensor:
        leaf = x.double().requires_grad_()
        (grad,) = torch.autograd.grad(fn(leaf).sum(), leaf, create_graph=True)
        return torch.autograd.grad((grad**2).sum(), leaf)[0]

    # float32 kernels vs the float64 twin: the create_graph backward runs in the input's dtype
    ours = second_derivative(lambda t: soft_margin_loss(t.float(), y, reduction, backend="cuda"))
    reference = second_derivative(lambda t: soft_margin_torch(t, y.double(), reduction))
    # sigmoid'(z) = s (1 - s) loses relative precision in float32 where s ~ 1 (1 - s is
    # rounded at the size of s): the scale is the size of the terms, the largest entry
    _assert_ulps(ours, reference, torch.float32, ULPS_VS_TORCH[torch.float32], scale=reference.abs().max().item())


def test_backward_does_not_synchronise(cuda_device: torch.device) -> None:
    x, y = _data((512, 4096), torch.float32, cuda_device, seed=10)
    for reduction in REDUCTIONS:  # compile and warm every kernel first
        leaf = x.clone().requires_grad_()
        soft_margin_loss(leaf, y, reduction, backend="cuda").sum().backward()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising torch call raises
    try:
        for reduction in REDUCTIONS:
            leaf = x.clone().requires_grad_()
            loss = soft_margin_loss(leaf, y, reduction, backend="cuda")
            (loss.sum() * 0.5 if reduction == "none" else loss * 0.5).backward()
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def test_training_step_captured_in_a_cuda_graph_replays_correctly(cuda_device: torch.device) -> None:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(cuda_device)
    reference_model = copy.deepcopy(model)
    criterion = SoftMarginLoss(backend="cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    reference_optimizer = torch.optim.SGD(reference_model.parameters(), lr=0.5)
    batches = [
        (torch.randn(256, 16, device=cuda_device), (torch.randint(0, 2, (256, 1), device=cuda_device) * 2 - 1).float())
        for _ in range(6)
    ]
    static_x, static_y = batches[0][0].clone(), batches[0][1].clone()

    # warm up on a side stream (compiles the kernels, as torch.cuda.graph asks), no steps
    side = torch.cuda.Stream(cuda_device)
    side.wait_stream(torch.cuda.current_stream(cuda_device))
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            criterion(model(static_x), static_y).backward()
    torch.cuda.current_stream(cuda_device).wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = criterion(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()

    for x, y in batches:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        reference_optimizer.zero_grad(set_to_none=True)
        reference_loss = F.soft_margin_loss(reference_model(x), y)
        reference_loss.backward()
        reference_optimizer.step()
        _assert_ulps(static_loss, reference_loss, torch.float32, ULPS_VS_TORCH[torch.float32])
    # six SGD steps carry the loss's rounding into every parameter: each at the size of the
    # model's parameters, ten times the one-step ulps
    scale = max(p.abs().max().item() for p in reference_model.parameters())
    for ours, theirs in zip(model.parameters(), reference_model.parameters()):
        _assert_ulps(ours, theirs, torch.float32, 10 * ULPS_VS_TORCH[torch.float32], scale=scale)


def test_module_swap_and_backends_on_the_gpu(cuda_device: torch.device) -> None:
    model = nn.ModuleDict({"criterion": nn.SoftMarginLoss(reduction="sum")}).to(cuda_device)
    assert swap_soft_margin(model, backend="cuda") == 1
    x, y = _data((64, 3), torch.float32, cuda_device, seed=12)
    expected, _ = _reference(x, y, "sum")
    _assert_close(model["criterion"](x, y), expected, torch.float32)
    # float64 is the torch twin's under "auto", and refused by "cuda" (never a silent fallback)
    _assert_ulps(soft_margin_loss(x.double(), y.double(), "sum"), expected, torch.float64, 64)
    with pytest.raises(TypeError, match="backend='cuda': the fused kernels take float32"):
        soft_margin_loss(x.double(), y.double(), backend="cuda")


def test_autocast_runs_half_inputs_in_float32(cuda_device: torch.device) -> None:
    x, y = _data((128, 8), torch.float16, cuda_device, seed=13)
    with torch.autocast("cuda", dtype=torch.float16):
        ours, theirs = soft_margin_loss(x, y), F.soft_margin_loss(x, y)
    assert ours.dtype == theirs.dtype == torch.float32
    _assert_ulps(ours, theirs, torch.float32, ULPS_VS_TORCH[torch.float32])
