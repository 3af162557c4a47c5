"""The fused soft-margin loss on CPU: the torch twin, the module, swap_soft_margin, the checks.

The CUDA kernels are exercised in tests/test_losses_gpu.py; here the autograd
Function's own logic (in-place scaling, retained graphs, double backward) runs
with its launchers replaced by plain torch.
"""

from __future__ import annotations

import re
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
from tests.support.soft_margin import DTYPES, REDUCTIONS, assert_close_loss, labels, reference_loss


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_twin_matches_torch(reduction: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    # |x| stays below ~10: float16's exp overflows past 11, and torch computes exp(-y x) in the input's dtype
    x = (torch.randn(37, 11, generator=generator) * 2).to(dtype)
    y = labels((37, 11), generator).to(dtype)
    ours = soft_margin_loss(x, y, reduction)
    theirs = F.soft_margin_loss(x, y, reduction=reduction)
    assert ours.dtype == theirs.dtype == dtype
    assert ours.shape == theirs.shape
    assert_close_loss(ours, theirs, dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_twin_gradient_matches_torch(reduction: str, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 7, generator=generator) * 3).to(dtype)
    x[0, 0] = 0.0  # the kink of max(z, 0): the gradient there is -y/2
    y = labels((5, 7), generator).to(dtype)
    weights = torch.rand(5, 7, generator=generator, dtype=dtype) if reduction == "none" else None
    grads = []
    for fn in (soft_margin_loss, F.soft_margin_loss):
        leaf = x.clone().requires_grad_()
        loss = fn(leaf, y, reduction=reduction)
        (loss * weights).sum().backward() if weights is not None else (loss * 3.0).backward()
        grads.append(leaf.grad)
    assert_close_loss(grads[0], grads[1], dtype)
    expected_at_zero = -y[0, 0] * 0.5 * (weights[0, 0] if weights is not None else 3.0)
    if reduction == "mean":
        expected_at_zero = expected_at_zero / x.numel()
    assert_close_loss(grads[0][0, 0], expected_at_zero, dtype)


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
    expected_loss, expected_grad = reference_loss(x, y, reduction)
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
    assert_close_loss(values[normal], expected[normal], dtype, scale=0.0)
    assert (np.abs(values[~normal]) <= tiny).all(), values[~normal]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_stay_finite_at_their_largest_values(dtype: torch.dtype) -> None:
    largest = torch.finfo(dtype).max
    x = torch.tensor([largest, -largest, 1e3, -1e3, 0.0], dtype=dtype)
    y = torch.tensor([-1.0, 1.0, -1.0, -1.0, 1.0], dtype=dtype)
    loss = soft_margin_loss(x, y, "none")
    expected, _ = reference_loss(x, y, "none")
    assert torch.isfinite(loss).all()
    assert_close_loss(loss, expected, dtype, scale=0.0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_and_gradgradcheck_in_float64(reduction: str) -> None:
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 4, generator=generator, dtype=torch.float64) * 2).requires_grad_()
    y = labels((3, 4), generator).double()
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
    assert_close_loss(soft_margin_loss(x, y, reduction), F.soft_margin_loss(x, y, reduction=reduction), torch.float32)


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
    assert_close_loss(ours, theirs, torch.float32)


def test_complex_target_fails_like_torch() -> None:
    x = torch.randn(3)
    y = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(RuntimeError):
        F.soft_margin_loss(x, y)
    with pytest.raises(RuntimeError, match="cannot be cast"):
        soft_margin_loss(x, y)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_a_cpu_scalar_target_works_with_an_input_on_another_device_like_torch(reduction: str) -> None:
    # torch accepts a 0-dim CPU target for an input on any device (CUDA in practice; "meta" runs without a GPU)
    x, y = torch.randn(3, 4, device="meta"), torch.tensor(-1.0)
    expected = F.soft_margin_loss(x, y, reduction=reduction)
    loss = soft_margin_loss(x, y, reduction)
    assert (loss.device, loss.shape, loss.dtype) == (expected.device, expected.shape, expected.dtype)


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
    expected_loss, expected_grad_x = reference_loss(x.detach(), y.detach(), reduction)
    scale = {"mean": 1.0 / x64.size, "sum": 1.0, "none": 1.0}[reduction]
    z = -y64 * x64
    per_element = -x64 * np.exp(z - np.logaddexp(0.0, z)) * scale * 0.5  # -x sigmoid(-y x), reduced, times grad_output
    expected_grad_y = per_element if target_shape == x.shape else per_element.sum(axis=0)  # summed over the broadcast
    assert_close_loss(loss, expected_loss, torch.float64)
    assert_close_loss(grad_x, expected_grad_x * 0.5, torch.float64)
    assert_close_loss(grad_y, expected_grad_y, torch.float64)
    with torch.no_grad():  # where torch's own loss takes such a target, the values are torch's
        assert_close_loss(
            soft_margin_loss(x, y, reduction), F.soft_margin_loss(x, y, reduction=reduction), torch.float64
        )


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
    assert_close_loss(soft_margin_loss(x, y, "none"), F.soft_margin_loss(x, y, reduction="none"), torch.float32)


def test_autocast_computes_half_inputs_in_float32_like_torch() -> None:
    x = torch.randn(16).bfloat16()
    y = torch.ones(16).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = soft_margin_loss(x, y), F.soft_margin_loss(x, y)
    assert ours.dtype == theirs.dtype == torch.float32
    assert_close_loss(ours, theirs, torch.float32)


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
    y = labels((4, 9), generator)
    ours = SoftMarginLoss(reduction=reduction)
    assert isinstance(ours, nn.SoftMarginLoss)
    assert_close_loss(ours(x, y), nn.SoftMarginLoss(reduction=reduction)(x, y), torch.float32)
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


def test_the_deprecated_elementwise_mean_is_mean_with_torchs_warning() -> None:
    x, y = torch.randn(5, 3), torch.randn(5, 3).sign()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = SoftMarginLoss(reduction="elementwise_mean")  # type: ignore[arg-type]
        value = soft_margin_loss(x, y, "elementwise_mean")  # type: ignore[arg-type]
        theirs = nn.SoftMarginLoss(reduction="elementwise_mean")(x, y)  # torch's own takes it
    assert [str(w.message) for w in caught[:2]] == [str(caught[2].message)] * 2 and "deprecated" in str(
        caught[0].message
    )
    assert module.reduction == "mean" and caught[0].filename == caught[1].filename == __file__
    assert_close_loss(value, theirs, torch.float32)
    assert torch.equal(module(x, y), soft_margin_loss(x, y, "mean"))


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
    assert_close_loss(model.by_name["aux"](x, y), F.soft_margin_loss(x, y, reduction="none"), torch.float32)


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
    y = labels((6, 4), generator).double()
    leaf = x.clone().requires_grad_()
    loss = launchers.SoftMarginFunction.apply(leaf, y, reduction)
    (loss * 2.5).backward(retain_graph=True)  # not the last op: grad_output = 2.5
    first = leaf.grad.clone()
    (loss * -1.0).backward()  # again through the retained graph
    assert torch_launchers == ["reduce(grad=True)", "scale_", "reduce(grad=True)", "scale_"]

    expected_loss, expected_grad = reference_loss(x, y, reduction)
    assert_close_loss(loss, expected_loss, torch.float64)
    assert_close_loss(first, 2.5 * expected_grad, torch.float64)
    assert_close_loss(leaf.grad, 1.5 * expected_grad, torch.float64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_function_double_backward_goes_through_torch(torch_launchers: list[str], reduction: str) -> None:
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(5, generator=generator, dtype=torch.float64)
    y = labels((5,), generator).double()

    def second_derivative(fn) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(fn(leaf).sum(), leaf, create_graph=True)
        (grad_of_grad,) = torch.autograd.grad((grad**2).sum(), leaf)
        return grad.detach(), grad_of_grad

    ours = second_derivative(lambda t: launchers.SoftMarginFunction.apply(t, y, reduction))
    reference = second_derivative(lambda t: soft_margin_torch(t, y, reduction))
    assert "scale_" not in torch_launchers and "none_backward" not in torch_launchers
    for value, expected in zip(ours, reference):
        assert_close_loss(value, expected, torch.float64)


def test_function_none_backward_uses_the_elementwise_launcher(torch_launchers: list[str]) -> None:
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)
    y = torch.ones(7, dtype=torch.float64)
    leaf = x.clone().requires_grad_()
    weights = torch.arange(7, dtype=torch.float64)
    (launchers.SoftMarginFunction.apply(leaf, y, "none") * weights).sum().backward()
    assert torch_launchers == ["none", "none_backward"]
    assert_close_loss(leaf.grad, weights.numpy() * reference_loss(x, y, "none")[1], torch.float64)
