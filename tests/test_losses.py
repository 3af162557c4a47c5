"""The fused soft-margin loss on CPU: the torch twin, the module, swap_soft_margin, the checks.

The CUDA kernels are exercised in tests/test_losses_gpu.py; here the autograd
Function's own logic (in-place scaling, retained graphs, double backward) runs
with its launchers replaced by plain torch.
"""

from __future__ import annotations

import ctypes
import re
import types
import warnings

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from lightning_ig import losses
from lightning_ig.losses import SoftMarginLoss, soft_margin_loss, swap_soft_margin
from lightning_ig.ops import soft_margin as launchers
from lightning_ig.ops.soft_margin import soft_margin_torch
from tests.support.tolerance import assert_close_scaled

REDUCTIONS = ("none", "mean", "sum")
# dtype -> roundings (ulps of the dtype) that may separate two computations of the same loss:
# the twin's stable form and torch's, or a kernel (float32 accumulation, rounded once)
# and a float64 reference. The half types round every intermediate in torch.
ULPS = {torch.float64: 8, torch.float32: 8, torch.bfloat16: 3, torch.float16: 3}
DTYPES = list(ULPS)


def _assert_close(
    actual: torch.Tensor | np.ndarray,
    expected: torch.Tensor | np.ndarray,
    dtype: torch.dtype,
    *,
    ulps: float | None = None,
    scale: float | None = None,
) -> None:
    """``actual`` within ``ulps`` roundings of ``dtype`` of ``expected``, at the values' size (support/tolerance)."""

    def as_array(values: torch.Tensor | np.ndarray) -> np.ndarray:
        return values.detach().cpu().double().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)

    assert_close_scaled(
        as_array(actual), as_array(expected), ulps=ULPS[dtype] if ulps is None else ulps, dtype=dtype, scale=scale
    )


def _reference(x: torch.Tensor, y: torch.Tensor, reduction: str) -> tuple[np.ndarray, np.ndarray]:
    """Loss and dL/dx in float64 numpy, independent of torch's and our formulas."""
    x64 = x.detach().double().numpy()
    y64 = np.broadcast_to(y.detach().double().numpy(), x64.shape)
    z = -y64 * x64
    loss = np.logaddexp(0.0, z)
    sigmoid = np.exp(z - loss)  # exp(z - softplus(z)) = sigmoid(z), without overflow
    grad = -y64 * sigmoid
    if reduction == "mean":
        return np.asarray(loss.mean()), grad / x64.size
    if reduction == "sum":
        return np.asarray(loss.sum()), grad
    return loss, grad


def _labels(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=generator).float() * 2 - 1


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_twin_matches_torch(reduction: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    # |x| stays below ~10: float16's exp overflows past 11, and torch computes exp(-y x) in the input's dtype
    x = (torch.randn(37, 11, generator=generator) * 2).to(dtype)
    y = _labels((37, 11), generator).to(dtype)
    ours = soft_margin_loss(x, y, reduction)
    theirs = F.soft_margin_loss(x, y, reduction=reduction)
    assert ours.dtype == theirs.dtype == dtype
    assert ours.shape == theirs.shape
    _assert_close(ours, theirs, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_twin_gradient_matches_torch(reduction: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 7, generator=generator) * 3).to(dtype)
    x[0, 0] = 0.0  # the kink of max(z, 0): the gradient there is -y/2
    y = _labels((5, 7), generator).to(dtype)
    weights = torch.rand(5, 7, generator=generator, dtype=dtype) if reduction == "none" else None
    grads = []
    for fn in (soft_margin_loss, F.soft_margin_loss):
        leaf = x.clone().requires_grad_()
        loss = fn(leaf, y, reduction=reduction)
        (loss * weights).sum().backward() if weights is not None else (loss * 3.0).backward()
        grads.append(leaf.grad)
    _assert_close(grads[0], grads[1], dtype)
    expected_at_zero = -y[0, 0] * 0.5 * (weights[0, 0] if weights is not None else 3.0)
    if reduction == "mean":
        expected_at_zero = expected_at_zero / x.numel()
    _assert_close(grads[0][0, 0], expected_at_zero, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_and_exact_where_torch_overflows(reduction: str, dtype: torch.dtype) -> None:
    magnitudes = torch.tensor([0.0, 1e-3, 1.0, 20.0, 88.0, 89.0, 700.0, 1e4, 1e6, 1e30, 1e38], dtype=torch.float64)
    x = torch.cat([magnitudes, -magnitudes]).repeat(2).to(dtype)  # (44,)
    y = torch.cat([torch.ones(22), -torch.ones(22)]).to(dtype)
    assert not torch.isfinite(F.soft_margin_loss(x, y, reduction="none")).all()  # the case is real

    leaf = x.clone().requires_grad_()
    loss = soft_margin_loss(leaf, y, reduction)
    loss.sum().backward()
    expected_loss, expected_grad = _reference(x, y, reduction)
    assert torch.isfinite(loss).all() and torch.isfinite(leaf.grad).all()
    _assert_normal_or_flushed(loss, expected_loss, dtype)
    _assert_normal_or_flushed(leaf.grad, expected_grad, dtype)


def _assert_normal_or_flushed(actual: torch.Tensor, expected: np.ndarray, dtype: torch.dtype) -> None:
    """Each value at its own size (they span 0 .. 1e38); a subnormal one (exp(-89) in float32) may be flushed to zero.

    Vectorised ``exp`` on some CPUs flushes subnormal results, so below the dtype's smallest
    normal number only the magnitude is promised.
    """
    tiny = torch.finfo(dtype).tiny
    values, expected = actual.detach().double().numpy().reshape(-1), np.asarray(expected, dtype=np.float64).reshape(-1)
    normal = np.abs(expected) >= tiny
    _assert_close(values[normal], expected[normal], dtype, scale=0.0)
    assert (np.abs(values[~normal]) <= tiny).all(), values[~normal]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_stay_finite_at_their_largest_values(dtype: torch.dtype) -> None:
    largest = torch.finfo(dtype).max
    x = torch.tensor([largest, -largest, 1e3, -1e3, 0.0], dtype=dtype)
    y = torch.tensor([-1.0, 1.0, -1.0, -1.0, 1.0], dtype=dtype)
    loss = soft_margin_loss(x, y, "none")
    expected, _ = _reference(x, y, "none")
    assert torch.isfinite(loss).all()
    _assert_close(loss, expected, dtype, scale=0.0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_and_gradgradcheck_in_float64(reduction: str) -> None:
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 4, generator=generator, dtype=torch.float64) * 2).requires_grad_()
    y = _labels((3, 4), generator).double()
    assert torch.autograd.gradcheck(lambda t: soft_margin_loss(t, y, reduction), (x,))
    assert torch.autograd.gradgradcheck(lambda t: soft_margin_loss(t, y, reduction), (x,))


def test_empty_input_gives_what_torch_gives() -> None:
    empty = torch.empty(0, 3)
    assert torch.isnan(soft_margin_loss(empty, empty, "mean"))
    assert torch.isnan(F.soft_margin_loss(empty, empty, reduction="mean"))
    assert soft_margin_loss(empty, empty, "sum").item() == 0.0
    assert soft_margin_loss(empty, empty, "none").shape == (0, 3)


@pytest.mark.parametrize("target_shape", [(4,), (3, 1), (1, 4), ()])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_target_broadcasts_like_torch(target_shape: tuple[int, ...], reduction: str) -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, generator=generator)
    y = torch.randn(target_shape, generator=generator).sign()
    _assert_close(soft_margin_loss(x, y, reduction), F.soft_margin_loss(x, y, reduction=reduction), torch.float32)


@pytest.mark.parametrize("target_shape", [(2, 4), (1, 3, 4), (5,)])
def test_target_that_torch_rejects_is_rejected_with_the_same_kind_of_error(target_shape: tuple[int, ...]) -> None:
    x = torch.randn(3, 4)
    y = torch.ones(target_shape)
    with pytest.raises(RuntimeError):
        F.soft_margin_loss(x, y)
    with pytest.raises(RuntimeError, match=re.escape(f"target of shape {tuple(target_shape)} does not broadcast")):
        soft_margin_loss(x, y)


@pytest.mark.parametrize("target_dtype", [torch.float64, torch.float16, torch.int64, torch.bool])
def test_target_dtype_is_handled_like_torch(target_dtype: torch.dtype) -> None:
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(4))
    y = (torch.arange(12).reshape(6, 2) % 2).to(target_dtype)
    if target_dtype != torch.bool:
        y = y * 2 - 1
    ours, theirs = soft_margin_loss(x, y, "none"), F.soft_margin_loss(x, y, reduction="none")
    assert ours.dtype == theirs.dtype == torch.float32
    _assert_close(ours, theirs, torch.float32)


def test_complex_target_fails_like_torch() -> None:
    x = torch.randn(3)
    y = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(RuntimeError):
        F.soft_margin_loss(x, y)
    with pytest.raises(RuntimeError, match="cannot be cast"):
        soft_margin_loss(x, y)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("target_shape", [(3, 4), (4,)])  # the input's shape, and one that broadcasts to it
def test_a_target_requiring_grad_gets_its_gradient(reduction: str, target_shape: tuple[int, ...]) -> None:
    # guards against: refused with a RuntimeError. The loss is differentiable in the target too: dL/dy = -x sigmoid(-y
    # x).
    generator = torch.Generator().manual_seed(11)
    x = (torch.randn(3, 4, generator=generator, dtype=torch.float64) * 3).requires_grad_()
    y = torch.randn(*target_shape, generator=generator, dtype=torch.float64).requires_grad_()  # a learnt soft label
    loss = soft_margin_loss(x, y, reduction)
    grad_output = torch.full_like(loss, 0.5)  # not the last op: grad_output != 1
    grad_x, grad_y = torch.autograd.grad(loss, (x, y), grad_output)
    x64, y64 = x.detach().numpy(), np.broadcast_to(y.detach().numpy(), x.shape)
    expected_loss, expected_grad_x = _reference(x.detach(), y.detach(), reduction)
    scale = {"mean": 1.0 / x64.size, "sum": 1.0, "none": 1.0}[reduction]
    z = -y64 * x64
    per_element = -x64 * np.exp(z - np.logaddexp(0.0, z)) * scale * 0.5  # -x sigmoid(-y x), reduced, times grad_output
    expected_grad_y = per_element if target_shape == x.shape else per_element.sum(axis=0)  # summed over the broadcast
    _assert_close(loss, expected_loss, torch.float64)
    _assert_close(grad_x, expected_grad_x * 0.5, torch.float64)
    _assert_close(grad_y, expected_grad_y, torch.float64)
    with torch.no_grad():  # where torch's own loss takes such a target, the values are torch's
        _assert_close(soft_margin_loss(x, y, reduction), F.soft_margin_loss(x, y, reduction=reduction), torch.float64)


def test_a_target_gradient_through_the_module_and_the_kernels_path_choice() -> None:
    x = torch.randn(6, requires_grad=True)
    y = torch.ones(6, requires_grad=True)
    SoftMarginLoss()(x, y).backward()
    assert y.grad is not None and torch.isfinite(y.grad).all()
    # the fused kernels write dL/dx only: a target that needs a gradient takes the twin, or says why not
    assert not losses._use_kernels("cuda", "auto", x, y)
    with pytest.raises(RuntimeError, match="the fused kernels compute dL/dinput only, and target requires a gradient"):
        losses._use_kernels("cuda", "cuda", x, y)
    assert losses._use_kernels("cuda", "auto", x, y.detach())


def test_non_contiguous_input() -> None:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(8, 5, generator=generator).t()
    y = torch.randn(8, 5, generator=generator).sign().t()
    assert not x.is_contiguous()
    _assert_close(soft_margin_loss(x, y, "none"), F.soft_margin_loss(x, y, reduction="none"), torch.float32)


def test_autocast_computes_half_inputs_in_float32_like_torch() -> None:
    x = torch.randn(16).bfloat16()
    y = torch.ones(16).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = soft_margin_loss(x, y), F.soft_margin_loss(x, y)
    assert ours.dtype == theirs.dtype == torch.float32
    _assert_close(ours, theirs, torch.float32)


def test_bad_arguments_are_named() -> None:
    x = torch.randn(3)
    with pytest.raises(TypeError, match="input must be a torch.Tensor, got list"):
        soft_margin_loss([1.0, 2.0], x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="target must be a torch.Tensor, got float"):
        soft_margin_loss(x, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reduction must be one of 'none', 'mean', 'sum'; got 'avg'"):
        soft_margin_loss(x, x, "avg")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="input must be a floating-point tensor, got torch.int64"):
        soft_margin_loss(torch.ones(3, dtype=torch.long), x)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cuda', 'torch'; got 'triton'"):
        soft_margin_loss(x, x, backend="triton")  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_backend_without_a_gpu_never_falls_back() -> None:
    x = torch.randn(3)
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA device"):
        soft_margin_loss(x, x.sign(), backend="cuda")
    with pytest.raises(ValueError, match="backend='cuda'"):
        SoftMarginLoss(backend="cuda")(x, x.sign())


# --------------------------------------------------------------------------- the module


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_module_is_a_drop_in(reduction: str) -> None:
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(4, 9, generator=generator)
    y = _labels((4, 9), generator)
    ours = SoftMarginLoss(reduction=reduction)
    assert isinstance(ours, nn.SoftMarginLoss)
    _assert_close(ours(x, y), nn.SoftMarginLoss(reduction=reduction)(x, y), torch.float32)
    assert repr(ours) == f"SoftMarginLoss(reduction='{reduction}', backend='auto')"


@pytest.mark.parametrize(
    ("size_average", "reduce", "expected"),
    [(False, None, "sum"), (None, False, "none"), (True, True, "mean"), (False, True, "sum")],
)
def test_deprecated_arguments_follow_torch(size_average: bool | None, reduce: bool | None, expected: str) -> None:
    with warnings.catch_warnings(record=True) as ours_warnings:
        warnings.simplefilter("always")
        ours = SoftMarginLoss(size_average, reduce)
    with warnings.catch_warnings(record=True) as torch_warnings:
        warnings.simplefilter("always")
        theirs = nn.SoftMarginLoss(size_average, reduce)
    assert ours.reduction == theirs.reduction == expected
    assert [str(w.message) for w in ours_warnings] == [str(w.message) for w in torch_warnings]
    assert ours_warnings  # torch warns about the deprecation; so do we


def test_module_rejects_bad_settings_at_construction() -> None:
    with pytest.raises(ValueError, match="reduction must be one of 'none', 'mean', 'sum'; got 'max'"):
        SoftMarginLoss(reduction="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cuda', 'torch'; got 'cupy'"):
        SoftMarginLoss(backend="cupy")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- swap_soft_margin


class _CustomLoss(nn.SoftMarginLoss):
    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return super().forward(input, target) * 2


class _Head(nn.Module):
    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)
        self.criterion = shared
        self.extra = nn.Sequential(nn.ReLU(), nn.SoftMarginLoss(reduction="none"))


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.SoftMarginLoss(reduction="sum")
        self.loss = shared  # the same instance twice in the tree
        self.heads = nn.ModuleList([_Head(shared), nn.SoftMarginLoss()])
        self.by_name = nn.ModuleDict({"aux": nn.SoftMarginLoss(reduction="none"), "keep": _CustomLoss()})
        self.already = SoftMarginLoss(reduction="mean", backend="torch")


def test_swap_soft_margin_replaces_every_torch_loss_in_a_nested_tree() -> None:
    model = _Model()
    model.eval()
    model.heads[1].train()  # a loss in training mode stays in training mode
    assert swap_soft_margin(model, backend="torch") == 4

    assert type(model.loss) is SoftMarginLoss and model.loss.reduction == "sum"
    assert model.heads[0].criterion is model.loss  # still shared
    assert type(model.heads[0].extra[1]) is SoftMarginLoss and model.heads[0].extra[1].reduction == "none"
    assert type(model.heads[1]) is SoftMarginLoss and model.heads[1].training
    assert model.heads[1].reduction == "mean" and not model.loss.training
    assert type(model.by_name["aux"]) is SoftMarginLoss and model.by_name["aux"].reduction == "none"
    assert type(model.by_name["keep"]) is _CustomLoss  # a subclass may have its own forward
    assert model.loss.backend == "torch"
    assert not any(type(m) is nn.SoftMarginLoss for m in model.modules())
    assert swap_soft_margin(model) == 0  # nothing left to replace

    x, y = torch.randn(5, 3), torch.ones(5, 3)
    _assert_close(model.by_name["aux"](x, y), F.soft_margin_loss(x, y, reduction="none"), torch.float32)


def test_swap_soft_margin_keeps_aliases_aliased() -> None:
    # two names on one module for one loss: both now name the same fused loss
    model = nn.Module()
    model.criterion = model.aux = nn.SoftMarginLoss(reduction="sum")
    assert swap_soft_margin(model) == 1, "one loss object was swapped"
    assert type(model.criterion) is SoftMarginLoss and model.aux is model.criterion

    # one loss shared by two submodules, and listed twice in each kind of container
    shared = nn.SoftMarginLoss()
    left, right = nn.Module(), nn.Module()
    left.loss, right.loss = shared, shared
    containers = [
        nn.ModuleList([shared, shared]),
        nn.ModuleDict({"a": shared, "b": shared}),
        nn.Sequential(shared, shared),
    ]
    tree = nn.ModuleDict(
        {"left": left, "right": right, "list": containers[0], "dict": containers[1], "seq": containers[2]}
    )
    assert swap_soft_margin(tree, backend="torch") == 1
    fused = left.loss
    assert type(fused) is SoftMarginLoss and fused.backend == "torch"
    members = [right.loss, *containers[0], *containers[1].values(), *containers[2]]
    assert all(member is fused for member in members)
    assert not any(type(m) is nn.SoftMarginLoss for m in tree.modules())


def test_swap_soft_margin_rejects_what_it_cannot_swap() -> None:
    with pytest.raises(ValueError, match=r"lightning_ig.SoftMarginLoss\(reduction='sum'\)"):
        swap_soft_margin(nn.SoftMarginLoss(reduction="sum"))
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got dict"):
        swap_soft_margin({"loss": nn.SoftMarginLoss()})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend must be"):
        swap_soft_margin(nn.Sequential(nn.SoftMarginLoss()), backend="gpu")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the autograd Function


@pytest.fixture
def torch_launchers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the kernel launchers by torch with the same contracts; record the calls."""
    calls: list[str] = []

    def reduce_(input, target, reduction, *, with_grad):  # noqa: A002
        calls.append(f"reduce(grad={with_grad})")
        loss = soft_margin_torch(input, target, reduction).detach()
        gradient = -target * torch.sigmoid(-target * input) / (input.numel() if reduction == "mean" else 1)
        return loss, (gradient if with_grad else None)

    def none(input, target):  # noqa: A002
        calls.append("none")
        return soft_margin_torch(input, target, "none").detach()

    def none_backward(input, target, grad_output):  # noqa: A002
        calls.append("none_backward")
        return grad_output * -target * torch.sigmoid(-target * input)

    def scale_(gradient, grad_output):
        calls.append("scale_")
        gradient.mul_(grad_output)

    monkeypatch.setattr(launchers, "launch_reduce", reduce_)
    monkeypatch.setattr(launchers, "launch_none", none)
    monkeypatch.setattr(launchers, "launch_none_backward", none_backward)
    monkeypatch.setattr(launchers, "launch_scale_", scale_)
    return calls


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_function_scales_its_saved_gradient_and_recomputes_for_a_retained_graph(
    torch_launchers: list[str], reduction: str
) -> None:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    y = _labels((6, 4), generator).double()
    leaf = x.clone().requires_grad_()
    loss = launchers.SoftMarginFunction.apply(leaf, y, reduction)
    (loss * 2.5).backward(retain_graph=True)  # not the last op: grad_output = 2.5
    first = leaf.grad.clone()
    (loss * -1.0).backward()  # again through the retained graph
    assert torch_launchers == ["reduce(grad=True)", "scale_", "reduce(grad=True)", "scale_"]

    expected_loss, expected_grad = _reference(x, y, reduction)
    _assert_close(loss, expected_loss, torch.float64)
    _assert_close(first, 2.5 * expected_grad, torch.float64)
    _assert_close(leaf.grad, 1.5 * expected_grad, torch.float64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_function_double_backward_goes_through_torch(torch_launchers: list[str], reduction: str) -> None:
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(5, generator=generator, dtype=torch.float64)
    y = _labels((5,), generator).double()

    def second_derivative(fn) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(fn(leaf).sum(), leaf, create_graph=True)
        (grad_of_grad,) = torch.autograd.grad((grad**2).sum(), leaf)
        return grad.detach(), grad_of_grad

    ours = second_derivative(lambda t: launchers.SoftMarginFunction.apply(t, y, reduction))
    reference = second_derivative(lambda t: soft_margin_torch(t, y, reduction))
    assert "scale_" not in torch_launchers and "none_backward" not in torch_launchers
    for value, expected in zip(ours, reference):
        _assert_close(value, expected, torch.float64)


def test_function_none_backward_uses_the_elementwise_launcher(torch_launchers: list[str]) -> None:
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)
    y = torch.ones(7, dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    weights = torch.arange(7, dtype=torch.float64)
    (launchers.SoftMarginFunction.apply(leaf, y, "none") * weights).sum().backward()
    assert torch_launchers == ["none", "none_backward"]
    _assert_close(leaf.grad, weights.numpy() * _reference(x, y, "none")[1], torch.float64)


# --------------------------------------------------------------------------- the launch plumbing
#
# The CUDA path's Python side (argument order and types, workspace layout,
# ticket-counter reset, the scalar grad_output case) runs here on CPU tensors,
# with the kernels emulated in numpy on the tensors' memory through their
# data_ptr(). Only the device is pretended; everything the launchers compute is real.


def _array(address: np.uint64, count: int, dtype: type) -> np.ndarray:
    assert isinstance(address, np.uint64), f"pointer passed as {type(address).__name__}"
    buffer = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(int(address))
    return np.frombuffer(buffer, dtype=dtype, count=count)


class _EmulatedKernels:
    """The entry points of kernels/soft_margin.cu, in numpy, with their C signatures checked."""

    def __init__(self, storage: type) -> None:
        self.storage = storage
        self.calls: list[tuple[str, int]] = []

    def __call__(self, name: str, grid: int, block: int, args: tuple) -> None:
        assert block == launchers.THREADS and 1 <= grid <= launchers.MAX_GRID
        op = name.rsplit("_", 1)[0]
        self.calls.append((op, grid))
        getattr(self, op)(grid, *args)

    def _losses(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = -y.astype(np.float64) * x
        loss = np.logaddexp(0.0, z)
        return loss, -y * np.exp(z - loss)

    def soft_margin_reduce(self, grid: int, x, y, out, partials, counter, n, divisor, grad=None) -> None:
        assert isinstance(n, np.int64) and isinstance(divisor, np.float64)
        ticket = _array(counter, 1, np.uint32)
        assert ticket[0] == 0, "the counter must be zero before a launch"
        loss, gradient = self._losses(_array(x, int(n), self.storage), _array(y, int(n), self.storage))
        _array(partials, grid, np.float64)[:] = [chunk.sum() for chunk in np.array_split(loss, grid)]
        with np.errstate(invalid="ignore", divide="ignore"):
            _array(out, 1, self.storage)[0] = loss.sum() / divisor
            if grad is not None:
                _array(grad, int(n), self.storage)[:] = gradient / divisor
        ticket[0] = 0  # what the last block does

    def soft_margin_reduce_grad(self, grid: int, x, y, out, grad, partials, counter, n, divisor) -> None:
        self.soft_margin_reduce(grid, x, y, out, partials, counter, n, divisor, grad=grad)

    def soft_margin_none(self, grid: int, x, y, loss, n) -> None:
        assert isinstance(n, np.int64)
        values, _ = self._losses(_array(x, int(n), self.storage), _array(y, int(n), self.storage))
        _array(loss, int(n), self.storage)[:] = values

    def soft_margin_none_backward(self, grid: int, x, y, g, g_is_scalar, grad, n) -> None:
        assert isinstance(g_is_scalar, np.int32) and isinstance(n, np.int64)
        _, gradient = self._losses(_array(x, int(n), self.storage), _array(y, int(n), self.storage))
        scale = _array(g, 1 if g_is_scalar else int(n), self.storage)
        _array(grad, int(n), self.storage)[:] = scale * gradient

    def soft_margin_scale(self, grid: int, grad, g, n) -> None:
        assert isinstance(n, np.int64)
        scale = _array(g, 1, self.storage)[0]
        if scale != 1:
            values = _array(grad, int(n), self.storage)
            values[:] = values * scale


@pytest.fixture(params=[torch.float32, torch.float16], ids=str)
def emulated_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> _EmulatedKernels:
    source = (launchers._cupy.kernel_dir() / "soft_margin.cu").read_text()
    kernels = _EmulatedKernels(np.float32 if request.param == torch.float32 else np.float16)
    kernels.dtype = request.param

    def get_kernel(filename: str, name: str, device: torch.device | int, options=()) -> str:
        assert filename == "soft_margin.cu"
        op, suffix = name.rsplit("_", 1)
        assert f"{op}_##SFX(" in source and f"LIG_SM_ENTRY_POINTS({suffix}," in source, name
        return name

    def launch(kernel: str, grid: int, block: int, args, *, device: torch.device | int, shared_mem: int = 0) -> None:
        kernels(kernel, grid, block, tuple(args))

    monkeypatch.setattr(launchers._cupy, "get_kernel", get_kernel)
    monkeypatch.setattr(launchers._cupy, "launch", launch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(launchers._cupy, "current_stream_handle", lambda device_index: 7)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(multi_processor_count=3)
    )
    for cache in ("_kernels", "_grid_limits", "_workspaces", "_plans"):
        monkeypatch.setattr(launchers, cache, {})
    return kernels


@pytest.mark.parametrize("scale_by_kernel", [True, False], ids=["scale-kernel", "scale-torch"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_launchers_pass_what_the_kernels_expect(
    emulated_device: _EmulatedKernels, reduction: str, scale_by_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if scale_by_kernel:
        monkeypatch.setattr(launchers, "TORCH_SCALE_MAX_ELEMENTS", 0)
    dtype = emulated_device.dtype
    generator = torch.Generator().manual_seed(9)
    x = (torch.randn(40, 70, generator=generator) * 3).to(dtype)
    y = _labels((70,), generator).to(torch.float64)  # broadcast, and another dtype: converted
    leaf = x.t().contiguous().t().requires_grad_()  # non-contiguous: copied for the kernels
    loss = launchers.soft_margin_cuda(leaf, y.expand(40, 70), reduction)
    if reduction == "none":
        loss.sum().backward(retain_graph=True)  # an expanded scalar grad_output
        weights = torch.rand(40, 70, generator=generator).to(dtype)
        (loss * weights).sum().backward()  # a full one
        expected_scale = 1 + weights.double()
    else:
        (loss * 2.5).backward()
        expected_scale = 2.5
    expected_loss, expected_grad = _reference(x, y, reduction)
    assert loss.dtype == dtype and loss.shape == expected_loss.shape
    _assert_close(loss, expected_loss, dtype)
    _assert_close(leaf.grad, expected_scale * torch.from_numpy(expected_grad), dtype)
    ops = [op for op, _ in emulated_device.calls]
    if reduction == "none":
        assert ops == ["soft_margin_none", "soft_margin_none_backward", "soft_margin_none_backward"]
    else:
        assert ops == ["soft_margin_reduce_grad"] + (["soft_margin_scale"] if scale_by_kernel else [])
        grid = emulated_device.calls[0][1]
        assert grid == min(3 * launchers.BLOCKS_PER_SM, -(-x.numel() // (launchers.THREADS * 4 * launchers.UNROLL)))
        # the eager workspace (one per device and stream) is reused and its counter is back at zero
        ((workspace, _),) = launchers._workspaces.values()
        assert workspace.view(torch.int32)[2 * launchers.MAX_GRID].item() == 0
        forward_only = launchers.soft_margin_cuda(x, y.expand(40, 70), reduction)
        assert emulated_device.calls[-1][0] == "soft_margin_reduce"
        _assert_close(forward_only, expected_loss, dtype)
        assert len(launchers._workspaces) == 1


def test_launchers_handle_empty_inputs(emulated_device: _EmulatedKernels) -> None:
    empty = torch.empty(0, 5, dtype=emulated_device.dtype, requires_grad=True)
    mean = launchers.soft_margin_cuda(empty, empty.detach(), "mean")
    assert torch.isnan(mean)
    mean.backward()
    assert empty.grad.shape == (0, 5)
    assert launchers.soft_margin_cuda(empty.detach(), empty.detach(), "sum").item() == 0.0
    assert launchers.soft_margin_cuda(empty.detach(), empty.detach(), "none").shape == (0, 5)
    # mean and sum still launch once (the last block writes the NaN or the 0); none launches nothing
    assert [op for op, _ in emulated_device.calls] == ["soft_margin_reduce_grad", "soft_margin_reduce"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torch_compile_runs_the_kernel_path_eagerly(
    emulated_device: _EmulatedKernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    if emulated_device.dtype != torch.float32:
        pytest.skip("one dtype is enough to check the compile path")
    monkeypatch.setattr(losses, "choose_backend", lambda backend, *tensors: "cuda")
    torch._dynamo.reset()
    linear = nn.Linear(5, 1)
    step = torch.compile(lambda x, y: soft_margin_loss(linear(x), y, "mean"))
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(10))
    y = torch.ones(16, 1)
    loss = step(x, y)
    loss.backward()
    reference = F.soft_margin_loss(linear(x), y)
    _assert_close(loss, reference, torch.float32)
    assert ("soft_margin_reduce_grad", 1) in emulated_device.calls  # the kernels ran, not a traced twin
    (expected_grad,) = torch.autograd.grad(reference, linear.weight)
    _assert_close(linear.weight.grad, expected_grad, torch.float32)
