"""The fused soft-margin loss's kernels: launchers, the torch twin and the autograd Function.

The ops layer of :mod:`lightning_ig.losses` (Liger-Kernel's layering: the kernels' launchers, the plain-torch twin and
an :class:`torch.autograd.Function` here; the module and the functional form in ``losses``). Every launch reads flat,
contiguous buffers of one dtype and device, allocated by torch; ``losses`` checks the arguments first.

* ``mean``/``sum``: ONE launch of ``soft_margin_reduce[_grad]``; the gradient (for ``grad_output == 1``, the reduction's
  scale folded in) is written in the same pass, and the backward only scales it by ``grad_output``, read on the device.
* ``none``: one elementwise launch forward and one backward.
* :func:`soft_margin_torch`: the same loss in plain torch, the path for CPU tensors and float64, the tests' reference.

Deterministic: the grid depends only on the size and the device, so the reduction order, hence the result, is too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ig.ops import _cupy
from lightning_ig.ops.dtypes import dtype_suffix

__all__ = [
    "BLOCKS_PER_SM",
    "KERNEL_FILE",
    "MAX_GRID",
    "THREADS",
    "TORCH_SCALE_MAX_ELEMENTS",
    "UNROLL",
    "SoftMarginFunction",
    "gradient_torch",
    "launch_none",
    "launch_none_backward",
    "launch_reduce",
    "launch_scale_",
    "soft_margin_cuda",
    "soft_margin_torch",
]

# Launch geometry; it must match the constants at the top of kernels/soft_margin.cu.
KERNEL_FILE = "soft_margin.cu"
THREADS = 256  # LIG_SM_THREADS
BLOCKS_PER_SM = 4  # LIG_SM_MIN_BLOCKS: the grid fills every SM once, no tail wave
UNROLL = 4  # LIG_SM_UNROLL: 4-element vectors per thread per iteration in the reduction
MAX_GRID = 4096  # LIG_SM_MAX_GRID: partial sums a workspace holds
# Up to this many elements the mean/sum backward scales with torch's mul_ (see launch_scale_).
TORCH_SCALE_MAX_ELEMENTS = 1 << 22


def gradient_torch(input: Tensor, target: Tensor, grad_output: Tensor, reduction: str) -> Tensor:  # noqa: A002
    """``grad_output * dL/dx`` from differentiable torch ops, for ``create_graph=True``."""
    # d/dx log(1 + exp(-y x)) = -y sigmoid(-y x); torch.sigmoid is stable at both ends
    gradient = -target * torch.sigmoid(-target * input)
    if reduction == "mean":
        gradient = gradient / input.numel()
    return gradient * grad_output


def soft_margin_torch(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    """The stable soft-margin loss in plain torch: the CPU/float64 path and the reference.

    ``logaddexp(z, 0)`` is ``max(z, 0) + log1p(exp(-|z|))`` exactly, and its autograd formula is the stable
    ``sigmoid(z)`` (0.5 at ``z == 0``, where a hand-written ``clamp``/``abs`` form would give a wrong subgradient).
    ``target`` must already have the input's shape or broadcast to it.
    """
    # -y x in the input's dtype, as torch's in-place `neg(input).mul_(target)` rounds it
    z = torch.mul(input.neg(), target)
    if z.dtype != input.dtype:
        z = z.to(input.dtype)
    loss = torch.logaddexp(z, z.new_zeros(()))
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def soft_margin_cuda(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    """The loss on the kernels; ``target`` has the input's shape (a broadcast view is fine), both on one CUDA device."""
    # The path from here to the launch is kept short: at 512 x 4096 host time is the cost.
    if input.get_device() != target.get_device():
        raise ValueError(f"input is on {input.device} and target on {target.device}; move them to one device")
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    # The kernels read flat buffers. A non-contiguous input (or a broadcast target)
    # is copied once; autograd routes the gradient back through that copy.
    if not input.is_contiguous():
        input = input.contiguous()  # noqa: A001 - torch's name for the argument
    if not target.is_contiguous():
        target = target.contiguous()
    if input.requires_grad and torch.is_grad_enabled():
        return SoftMarginFunction.apply(input, target, reduction)
    # Nothing will differentiate this call: skip autograd and the gradient write.
    if reduction == "none":
        return launch_none(input, target)
    return launch_reduce(input, target, reduction, with_grad=False)[0]


class SoftMarginFunction(torch.autograd.Function):
    """Autograd over the fused kernels. ``input`` and ``target`` are contiguous, same dtype and device."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
        ctx.reduction = reduction
        ctx.save_for_backward(input, target)
        if reduction == "none":
            return launch_none(input, target)
        loss, gradient = launch_reduce(input, target, reduction, with_grad=True)
        # dL/dx for grad_output == 1, handed out (and scaled in place) by the first backward
        ctx.gradient = gradient
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, None, None]:
        if torch.is_grad_enabled():
            # create_graph=True: build the gradient from differentiable ops so that
            # second derivatives are right (the kernels' output is a constant to autograd)
            saved_input, target = ctx.saved_tensors
            return gradient_torch(saved_input, target, grad_output, ctx.reduction), None, None
        if ctx.reduction == "none":
            saved_input, target = ctx.saved_tensors
            return launch_none_backward(saved_input, target, grad_output), None, None
        if (gradient := ctx.gradient) is None:
            # a second backward through a retained graph: the first one handed the buffer out
            saved_input, target = ctx.saved_tensors
            gradient = launch_reduce(saved_input, target, ctx.reduction, with_grad=True)[1]
        ctx.gradient = None  # ours alone from here, so scaling in place is safe
        launch_scale_(gradient, grad_output)
        return gradient, None, None


# Caches that keep the per-call host path short: kernels per (entry point, dtype, device), grid limits per device,
# workspaces per (device, stream), and the grid and scalar arguments per reduction size.
_kernels: dict[tuple[str, torch.dtype, int], Any] = {}
_grid_limits: dict[int, int] = {}
_workspaces: dict[tuple[int, int], tuple[Tensor, tuple[np.uint64, np.uint64]]] = {}
_plans: dict[tuple[int, str, int], tuple[int, tuple[np.int64, np.float64]]] = {}


def _kernel(op: str, dtype: torch.dtype, device_index: int) -> Any:
    key = (op, dtype, device_index)
    if (kernel := _kernels.get(key)) is None:
        kernel = _kernels[key] = _cupy.get_kernel(KERNEL_FILE, f"{op}_{dtype_suffix(dtype)}", device_index)
    return kernel


def _grid(n: int, device_index: int, elements_per_thread: int) -> int:
    """Blocks for ``n`` elements: enough to cover them, at most ``BLOCKS_PER_SM`` per SM. A fixed grid for a given ``n``
    and device is what makes the reduction order, hence the result, the same on every call."""
    if (limit := _grid_limits.get(device_index)) is None:
        sm_count = torch.cuda.get_device_properties(device_index).multi_processor_count
        limit = _grid_limits[device_index] = max(1, min(MAX_GRID, sm_count * BLOCKS_PER_SM))
    return max(1, min(limit, -(-n // (THREADS * elements_per_thread))))


def _workspace(like: Tensor, index: int, grid: int) -> tuple[Tensor, tuple[np.uint64, np.uint64]]:
    """Partial sums and the ticket counter for one reduction launch. Returns
    ``(the workspace tensor, (partials pointer, counter pointer))``. The counter must be zero before a launch (the
    kernel's last block puts it back to zero), and two launches that may overlap must not share it. Launches on one
    stream never overlap, so eager calls share one zeroed workspace per (device, stream), allocated once. A launch being
    captured into a CUDA graph gets its own, zeroed from the graph's memory pool as part of the graph, so replays of
    different graphs never share a counter either. (Whether a capture is in progress is asked of the current device's
    current stream.)"""
    if torch.cuda.is_current_stream_capturing():
        # float64 zeros: `grid` partial sums, then the counter (the low word of 0.0 is 0u)
        scratch = like.new_zeros(grid + 1, dtype=torch.float64)
        base = scratch.data_ptr()
        return scratch, (np.uint64(base), np.uint64(base + 8 * grid))
    key = (index, _cupy.current_stream_handle(index))
    if (cached := _workspaces.get(key)) is None:
        # kept for the life of the process: 32 KiB per stream that ran a reduction
        scratch = like.new_zeros(MAX_GRID + 1, dtype=torch.float64)
        base = scratch.data_ptr()
        cached = _workspaces[key] = (scratch, (np.uint64(base), np.uint64(base + 8 * MAX_GRID)))
    return cached


def _reduce_plan(n: int, reduction: str, index: int) -> tuple[int, tuple[np.int64, np.float64]]:
    """The grid and the scalar arguments for a mean/sum of ``n`` elements (cached per size)."""
    key = (n, reduction, index)
    if (plan := _plans.get(key)) is None:
        if len(_plans) > 1024:  # many distinct sizes: start over rather than grow without bound
            _plans.clear()
        # mean of nothing is 0 / 0 = NaN in the kernel, as in torch; sum of nothing is 0
        divisor = float(n) if reduction == "mean" else 1.0
        plan = _plans[key] = (_grid(n, index, 4 * UNROLL), (np.int64(n), np.float64(divisor)))
    return plan


def launch_reduce(
    input: Tensor,  # noqa: A002
    target: Tensor,
    reduction: str,
    *,
    with_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    """mean/sum in one launch; with ``with_grad`` also ``dL/dx`` (for grad_output == 1)."""
    index = input.get_device()
    grid, scalars = _reduce_plan(input.numel(), reduction, index)
    scratch, workspace = _workspace(input, index, grid)
    loss = input.new_empty(())
    pointers: tuple[np.uint64, ...]
    if with_grad:
        gradient = torch.empty_like(input)
        kernel = _kernel("soft_margin_reduce_grad", input.dtype, index)
        pointers = (_cupy.pointer(input), _cupy.pointer(target), _cupy.pointer(loss), _cupy.pointer(gradient))
    else:
        gradient = None
        kernel = _kernel("soft_margin_reduce", input.dtype, index)
        pointers = (_cupy.pointer(input), _cupy.pointer(target), _cupy.pointer(loss))
    _cupy.launch(kernel, grid, THREADS, pointers + workspace + scalars, device=index)
    del scratch  # alive until the launch is queued; a captured one then returns to the graph's pool
    return loss, gradient


def launch_none(input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
    loss = torch.empty_like(input)
    if n := input.numel():
        index = input.get_device()
        kernel = _kernel("soft_margin_none", input.dtype, index)
        args = (_cupy.pointer(input), _cupy.pointer(target), _cupy.pointer(loss), np.int64(n))
        _cupy.launch(kernel, _grid(n, index, 4), THREADS, args, device=index)
    return loss


def launch_none_backward(input: Tensor, target: Tensor, grad_output: Tensor) -> Tensor:  # noqa: A002
    gradient = torch.empty_like(input)
    if not (n := input.numel()):
        return gradient
    if grad_output.dtype != input.dtype:
        grad_output = grad_output.to(input.dtype)
    if grad_output.is_contiguous():
        g_is_scalar = 0
    elif all(step == 0 for step in grad_output.stride()):
        # an expanded scalar (what `loss.sum().backward()` sends): read one value, copy nothing
        g_is_scalar = 1
    else:
        grad_output = grad_output.contiguous()
        g_is_scalar = 0
    index = input.get_device()
    kernel = _kernel("soft_margin_none_backward", input.dtype, index)
    args = (
        _cupy.pointer(input),
        _cupy.pointer(target),
        _cupy.pointer(grad_output),
        np.int32(g_is_scalar),
        _cupy.pointer(gradient),
        np.int64(n),
    )
    _cupy.launch(kernel, _grid(n, index, 4), THREADS, args, device=index)
    return gradient


def launch_scale_(gradient: Tensor, grad_output: Tensor) -> None:
    """``gradient *= grad_output`` in place, the scalar read on the device.

    Large gradients go through our kernel, which returns at once when ``grad_output`` is 1 (the usual
    ``loss.backward()``), so the backward costs no pass over memory. Small ones (where host time, not memory, is the
    cost) take torch's ``mul_``: one full pass, but cheaper to launch than CuPy. Both read the scalar on the device and
    round identically (x * 1 == x).
    """
    if not (n := gradient.numel()):
        return
    if grad_output.dtype != gradient.dtype:
        grad_output = grad_output.to(gradient.dtype)
    if n <= TORCH_SCALE_MAX_ELEMENTS:
        gradient.mul_(grad_output)
        return
    index = gradient.get_device()
    kernel = _kernel("soft_margin_scale", gradient.dtype, index)
    args = (_cupy.pointer(gradient), _cupy.pointer(grad_output), np.int64(n))
    _cupy.launch(kernel, _grid(n, index, 4), THREADS, args, device=index)
