"""The soft-margin kernels' launchers on the CPU: the arguments they pass (kernels emulated in numpy), empty inputs, and
torch.compile."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from lightning_ig import losses
from lightning_ig.losses import soft_margin_loss
from lightning_ig.ops import soft_margin as launchers
from tests.support.soft_margin import REDUCTIONS, assert_close_loss, labels, reference_loss

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
    y = labels((70,), generator).to(torch.float64)  # broadcast, and another dtype: converted
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
    expected_loss, expected_grad = reference_loss(x, y, reduction)
    assert loss.dtype == dtype and loss.shape == expected_loss.shape
    assert_close_loss(loss, expected_loss, dtype)
    assert_close_loss(leaf.grad, expected_scale * torch.from_numpy(expected_grad), dtype)
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
        assert_close_loss(forward_only, expected_loss, dtype)
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
    assert_close_loss(loss, reference, torch.float32)
    assert ("soft_margin_reduce_grad", 1) in emulated_device.calls  # the kernels ran, not a traced twin
    (expected_grad,) = torch.autograd.grad(reference, linear.weight)
    assert_close_loss(linear.weight.grad, expected_grad, torch.float32)
