"""A fused, numerically stable soft-margin loss: a drop-in for ``torch.nn.SoftMarginLoss``.

``loss = reduce(log(1 + exp(-y x)))`` for targets ``y`` in ``{-1, +1}``, computed as
``max(z, 0) + log1p(exp(-|z|))`` with ``z = -y x``, so it is finite for every
finite input (torch's own loss overflows to ``inf`` once ``-y x`` passes ~88 in
float32, and its gradient turns into NaN there).

Three layers with one stem, as in Liger-Kernel:

* the kernels (``kernels/soft_margin.cu``), their launchers and
  ``_SoftMarginFunction``, an :class:`torch.autograd.Function`. For
  ``mean``/``sum`` the forward is ONE launch that also writes ``dL/dx`` (the
  reduction's scale folded in) when the input needs a gradient; the backward
  only scales that by ``grad_output``, read on the device (no host sync): for
  large inputs with a kernel that does nothing at all when ``grad_output`` is 1
  (the usual ``loss.backward()``), for small ones with torch's ``mul_``, which is
  cheaper to launch. ``reduction="none"`` is one elementwise launch forward and
  one backward.
* :class:`SoftMarginLoss`, a thin ``nn.Module`` with torch's constructor;
* :func:`soft_margin_loss`, the functional form;

plus :func:`swap_soft_margin`, which switches an existing model over in one
line, and ``_soft_margin_torch``, the same math in plain torch: the path for
CPU tensors and float64, and the reference in tests.

Behaviour shared with torch: the output has the input's shape (``"none"``) and
dtype; the target may broadcast to the input's shape (never the other way), is
converted to the input's dtype where torch would, and cannot require a gradient;
the mean of an empty input is NaN and its sum 0; under ``torch.autocast``
half-precision inputs are computed in float32, as torch's autocast does for this
loss.

Second derivatives (``create_graph=True``) are supported: when autograd records
the backward, it is computed with differentiable torch operations from the
saved input and target, so ``torch.autograd.grad`` of a gradient is correct. A
second ``backward`` through a retained graph recomputes the gradient.

The CUDA path is deterministic: the same input on the same device gives
bit-identical results (the reduction order depends only on the size). Each
(device, stream) gets a small reduction workspace once; a launch captured into
a CUDA graph gets its own, so a training step that uses the loss can be
captured with ``torch.cuda.graph`` and replayed (warm it up first, as torch's
documentation asks: the first call compiles the kernels).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig import _cuda

__all__ = ["soft_margin_loss", "SoftMarginLoss", "swap_soft_margin"]

Reduction = Literal["none", "mean", "sum"]
Backend = Literal["auto", "cuda", "torch"]

_REDUCTIONS = ("none", "mean", "sum")
_BACKENDS = ("auto", "cuda", "torch")
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Launch geometry; it must match the constants at the top of kernels/soft_margin.cu.
_KERNEL_FILE = "soft_margin.cu"
_THREADS = 256  # LIG_SM_THREADS
_BLOCKS_PER_SM = 4  # LIG_SM_MIN_BLOCKS: the grid fills every SM once, no tail wave
_UNROLL = 4  # LIG_SM_UNROLL: 4-element vectors per thread per iteration in the reduction
_MAX_GRID = 4096  # LIG_SM_MAX_GRID: partial sums a workspace holds
# Up to this many elements the mean/sum backward scales with torch's mul_ (see _launch_scale_).
_TORCH_SCALE_MAX_ELEMENTS = 1 << 22


# --------------------------------------------------------------------------- public API


def soft_margin_loss(
    input: Tensor,  # noqa: A002 - torch's name for it
    target: Tensor,
    reduction: Reduction = "mean",
    *,
    backend: Backend = "auto",
) -> Tensor:
    """The soft-margin loss ``log(1 + exp(-target * input))``, reduced; fused on CUDA.

    Same results as :func:`torch.nn.functional.soft_margin_loss` where torch's
    are finite, and finite where torch's overflow.

    Args:
        input: Scores (logits) of any shape; floating point. The kernels read a
            contiguous buffer: a non-contiguous input is copied once (and its
            gradient comes back through that copy).
        target: Labels, usually ``-1``/``+1``; the input's shape or one that
            broadcasts to it (a broadcast target is materialised for the kernels).
            Converted to the input's dtype; must not require a gradient.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (elementwise,
            the input's shape).
        backend: ``"auto"`` (default) runs the CUDA kernels for float32, float16
            and bfloat16 tensors on a CUDA device when CuPy imports, and plain
            torch otherwise (CPU, float64). ``"cuda"`` insists on the kernels and
            raises instead of falling back; ``"torch"`` always uses plain torch.

    Returns:
        The loss in the input's dtype: a 0-dim tensor for ``"mean"``/``"sum"``,
        the input's shape for ``"none"``.

    Raises:
        TypeError: ``input``/``target`` is not a tensor, ``input`` is not floating
            point, or ``backend="cuda"`` with a dtype the kernels do not take.
        ValueError: an unknown ``reduction`` or ``backend``, or ``backend="cuda"``
            without a CUDA device / with tensors off the GPU.
        RuntimeError: as torch raises it: ``target`` does not broadcast to the
            input's shape, its dtype cannot be cast to the input's, or it
            requires a gradient; or ``backend="cuda"`` where CuPy cannot be imported.

    Example::

        >>> x = torch.tensor([2.0, -1.0, 100.0], requires_grad=True)
        >>> y = torch.tensor([1.0, 1.0, -1.0])
        >>> loss = soft_margin_loss(x, y)  # torch.nn.functional.soft_margin_loss gives inf here
        >>> round(loss.item(), 4)
        33.8134
        >>> loss.backward()
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not input.is_floating_point():
        raise TypeError(f"input must be a floating-point tensor, got {input.dtype}; convert it with .float()")
    if target.requires_grad and torch.is_grad_enabled():
        # torch's soft_margin_loss has no derivative for the target either; same kind of error
        raise RuntimeError(
            "soft_margin_loss is not differentiable with respect to target, which requires grad; "
            "pass target.detach()"
        )
    resolved = _cuda.resolve_backend(backend, input, target)

    if input.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(input.device.type):
        # torch's autocast runs soft_margin_loss in float32; do the same, so swapping is invisible
        input = input.float()
    if target.shape != input.shape:
        target = _broadcast_target(target, input)
    if target.dtype != input.dtype and not torch.can_cast(torch.promote_types(input.dtype, target.dtype), input.dtype):
        raise RuntimeError(
            f"soft_margin_loss computes in the input's dtype {input.dtype}, and a target of dtype "
            f"{target.dtype} cannot be cast to it (torch refuses the same); pass a real-valued target"
        )

    if resolved == "cuda" and input.dtype not in _CUDA_DTYPES:
        if backend == "cuda":
            raise TypeError(
                f"backend='cuda': the fused kernels take float32, float16 and bfloat16, got {input.dtype}; "
                "use backend='auto' or 'torch' for it"
            )
        resolved = "torch"
    if resolved == "torch":
        return _soft_margin_torch(input, target, reduction)
    if torch.compiler.is_compiling():
        # raw pointers and CuPy launches cannot be traced: torch.compile runs this part
        # eagerly (wrapped here, not at import, since the wrapper imports torch._dynamo)
        return torch.compiler.disable(_soft_margin_cuda)(input, target, reduction)
    return _soft_margin_cuda(input, target, reduction)


class SoftMarginLoss(nn.SoftMarginLoss):
    """Drop-in for :class:`torch.nn.SoftMarginLoss` that runs the fused, stable kernels.

    Same constructor as torch's (the deprecated ``size_average``/``reduce`` are
    turned into ``reduction`` by torch's own rules, with its warning) plus
    ``backend``. It subclasses ``torch.nn.SoftMarginLoss``, so ``isinstance``
    checks in existing code keep working.

    Args:
        size_average: Deprecated (see ``reduction``). Default ``None``.
        reduce: Deprecated (see ``reduction``). Default ``None``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        backend: ``"auto"`` (default), ``"cuda"`` or ``"torch"``; see :func:`soft_margin_loss`.

    Raises:
        ValueError: an unknown ``reduction`` or ``backend``.

    Example::

        >>> criterion = SoftMarginLoss()
        >>> x = torch.randn(8, 3, requires_grad=True)
        >>> y = torch.randn(8, 3).sign()
        >>> criterion(x, y).backward()
    """

    def __init__(
        self,
        size_average: bool | None = None,
        reduce: bool | None = None,
        reduction: Reduction = "mean",
        *,
        backend: Backend = "auto",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        if self.reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {self.reduction!r}")
        _check_backend_name(backend)
        self.backend = backend

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        """The loss of ``input`` against ``target``; see :func:`soft_margin_loss`."""
        return soft_margin_loss(input, target, self.reduction, backend=self.backend)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, backend={self.backend!r}"


def swap_soft_margin(module: nn.Module, *, backend: Backend = "auto") -> int:
    """Replace every ``torch.nn.SoftMarginLoss`` inside ``module`` with the fused one, in place.

    The one-line loss option for an existing model or LightningModule: it walks
    the whole module tree (nested modules, ``ModuleList``, ``ModuleDict``,
    ``Sequential``), keeps each loss's ``reduction`` and training flag, and keeps
    a loss shared by several parents shared. Only modules whose type is exactly
    ``torch.nn.SoftMarginLoss`` are replaced: a user subclass may have changed
    ``forward``, and losses already fused are left alone. Hooks registered on an
    old loss do not move to its replacement; a loss held outside the module tree
    (a plain list, a closure) is not seen.

    Args:
        module: The model whose losses to replace.
        backend: The ``backend`` of the new losses. Default ``"auto"``.

    Returns:
        How many distinct losses were replaced.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
        ValueError: ``module`` is itself a ``torch.nn.SoftMarginLoss`` (there is no
            parent to put the new one in), or ``backend`` is unknown.

    Example::

        >>> model = nn.ModuleDict({"head": nn.Linear(4, 1), "criterion": nn.SoftMarginLoss(reduction="sum")})
        >>> swap_soft_margin(model)
        1
        >>> model["criterion"]
        SoftMarginLoss(reduction='sum', backend='auto')
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if type(module) is nn.SoftMarginLoss:
        raise ValueError(
            "module is itself a torch.nn.SoftMarginLoss; swap_soft_margin replaces the losses inside a "
            "module tree and cannot rebind your reference: use "
            f"lightning_ig.SoftMarginLoss(reduction={module.reduction!r}) instead"
        )
    _check_backend_name(backend)
    replacements: dict[int, SoftMarginLoss] = {}
    for parent in list(module.modules()):  # a list: the tree changes under the loop
        for name, child in list(parent.named_children()):
            if type(child) is not nn.SoftMarginLoss:
                continue
            fused = replacements.get(id(child))
            if fused is None:
                fused = SoftMarginLoss(reduction=child.reduction, backend=backend)  # type: ignore[arg-type]
                fused.train(child.training)
                replacements[id(child)] = fused
            setattr(parent, name, fused)
    return len(replacements)


# --------------------------------------------------------------------------- torch twin


def _soft_margin_torch(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    """The stable soft-margin loss in plain torch: the CPU/float64 path and the reference.

    ``logaddexp(z, 0)`` is ``max(z, 0) + log1p(exp(-|z|))`` exactly, and its
    autograd formula is the stable ``sigmoid(z)`` (0.5 at ``z == 0``, where a
    hand-written ``clamp``/``abs`` form would give a wrong subgradient).
    ``target`` must already have the input's shape or broadcast to it.
    """
    # -y x in the input's dtype, as torch's in-place `neg(input).mul_(target)` rounds it
    z = torch.mul(input.neg(), target)
    if z.dtype != input.dtype:
        z = z.to(input.dtype)
    loss = torch.logaddexp(z, z.new_zeros(()))
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _gradient_torch(input: Tensor, target: Tensor, grad_output: Tensor, reduction: str) -> Tensor:  # noqa: A002
    """``grad_output * dL/dx`` from differentiable torch ops, for ``create_graph=True``."""
    # d/dx log(1 + exp(-y x)) = -y sigmoid(-y x); torch.sigmoid is stable at both ends
    gradient = -target * torch.sigmoid(-target * input)
    if reduction == "mean":
        gradient = gradient / input.numel()
    return gradient * grad_output


# --------------------------------------------------------------------------- CUDA path


def _soft_margin_cuda(input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
    # The path from here to the launch is kept short: at 512 x 4096 host time is the cost.
    if input.get_device() != target.get_device():
        raise ValueError(
            f"input is on {input.device} and target on {target.device}; move them to one device"
        )
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    # The kernels read flat buffers. A non-contiguous input (or a broadcast target)
    # is copied once; autograd routes the gradient back through that copy.
    if not input.is_contiguous():
        input = input.contiguous()
    if not target.is_contiguous():
        target = target.contiguous()
    if input.requires_grad and torch.is_grad_enabled():
        return _SoftMarginFunction.apply(input, target, reduction)
    # Nothing will differentiate this call: skip autograd and the gradient write.
    if reduction == "none":
        return _launch_none(input, target)
    return _launch_reduce(input, target, reduction, with_grad=False)[0]


class _SoftMarginFunction(torch.autograd.Function):
    """Autograd over the fused kernels. ``input`` and ``target`` are contiguous, same dtype and device."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, target: Tensor, reduction: str) -> Tensor:  # noqa: A002
        ctx.reduction = reduction
        ctx.save_for_backward(input, target)
        if reduction == "none":
            return _launch_none(input, target)
        loss, gradient = _launch_reduce(input, target, reduction, with_grad=True)
        # dL/dx for grad_output == 1, handed out (and scaled in place) by the first backward
        ctx.gradient = gradient
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, None, None]:
        if torch.is_grad_enabled():
            # create_graph=True: build the gradient from differentiable ops so that
            # second derivatives are right (the kernels' output is a constant to autograd)
            input, target = ctx.saved_tensors
            return _gradient_torch(input, target, grad_output, ctx.reduction), None, None
        if ctx.reduction == "none":
            input, target = ctx.saved_tensors
            return _launch_none_backward(input, target, grad_output), None, None
        gradient = ctx.gradient
        if gradient is None:
            # a second backward through a retained graph: the first one handed the buffer out
            input, target = ctx.saved_tensors
            gradient = _launch_reduce(input, target, ctx.reduction, with_grad=True)[1]
        ctx.gradient = None  # ours alone from here, so scaling in place is safe
        _launch_scale_(gradient, grad_output)
        return gradient, None, None


# Caches that keep the per-call host path short: kernels per (entry point, dtype,
# device), grid limits per device, workspaces per (device, stream), and the grid
# and scalar arguments per reduction size.
_kernels: dict[tuple[str, torch.dtype, int], Any] = {}
_grid_limits: dict[int, int] = {}
_workspaces: dict[tuple[int, int], tuple[Tensor, tuple[np.uint64, np.uint64]]] = {}
_plans: dict[tuple[int, str, int], tuple[int, tuple[np.int64, np.float64]]] = {}


def _kernel(op: str, dtype: torch.dtype, device_index: int) -> Any:
    key = (op, dtype, device_index)
    kernel = _kernels.get(key)
    if kernel is None:
        name = f"{op}_{_cuda.dtype_suffix(dtype)}"
        kernel = _cuda.get_kernel(_KERNEL_FILE, name, device_index)
        _kernels[key] = kernel
    return kernel


def _grid(n: int, device_index: int, elements_per_thread: int) -> int:
    """Blocks for ``n`` elements: enough to cover them, at most ``_BLOCKS_PER_SM`` per SM.

    A fixed grid for a given ``n`` and device is what makes the reduction order,
    hence the result, the same on every call.
    """
    limit = _grid_limits.get(device_index)
    if limit is None:
        sm_count = torch.cuda.get_device_properties(device_index).multi_processor_count
        limit = _grid_limits[device_index] = max(1, min(_MAX_GRID, sm_count * _BLOCKS_PER_SM))
    per_block = _THREADS * elements_per_thread
    return max(1, min(limit, -(-n // per_block)))


def _workspace(like: Tensor, index: int, grid: int) -> tuple[Tensor, tuple[np.uint64, np.uint64]]:
    """Partial sums and the ticket counter for one reduction launch.

    Returns ``(the workspace tensor, (partials pointer, counter pointer))``.
    The counter must be zero before a launch (the kernel's last block puts it
    back to zero), and two launches that may overlap must not share it. Launches
    on one stream never overlap, so eager calls share one zeroed workspace per
    (device, stream), allocated once. A launch being captured into a CUDA graph
    gets its own, zeroed from the graph's memory pool as part of the graph, so
    replays of different graphs never share a counter either. (Whether a capture
    is in progress is asked of the current device's current stream.)
    """
    if torch.cuda.is_current_stream_capturing():
        # float64 zeros: `grid` partial sums, then the counter (the low word of 0.0 is 0u)
        scratch = like.new_zeros(grid + 1, dtype=torch.float64)
        base = scratch.data_ptr()
        return scratch, (np.uint64(base), np.uint64(base + 8 * grid))
    key = (index, _cuda.current_stream_handle(index))
    cached = _workspaces.get(key)
    if cached is None:
        # kept for the life of the process: 32 KiB per stream that ran a reduction
        scratch = like.new_zeros(_MAX_GRID + 1, dtype=torch.float64)
        base = scratch.data_ptr()
        cached = _workspaces[key] = (scratch, (np.uint64(base), np.uint64(base + 8 * _MAX_GRID)))
    return cached


def _reduce_plan(n: int, reduction: str, index: int) -> tuple[int, tuple[np.int64, np.float64]]:
    """The grid and the scalar arguments for a mean/sum of ``n`` elements (cached per size)."""
    key = (n, reduction, index)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 1024:  # many distinct sizes: start over rather than grow without bound
            _plans.clear()
        # mean of nothing is 0 / 0 = NaN in the kernel, as in torch; sum of nothing is 0
        divisor = float(n) if reduction == "mean" else 1.0
        plan = _plans[key] = (_grid(n, index, 4 * _UNROLL), (np.int64(n), np.float64(divisor)))
    return plan




def _launch_reduce(
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
    if with_grad:
        gradient = torch.empty_like(input)
        kernel = _kernel("soft_margin_reduce_grad", input.dtype, index)
        pointers = (_cuda.pointer(input), _cuda.pointer(target), _cuda.pointer(loss), _cuda.pointer(gradient))
    else:
        gradient = None
        kernel = _kernel("soft_margin_reduce", input.dtype, index)
        pointers = (_cuda.pointer(input), _cuda.pointer(target), _cuda.pointer(loss))
    _cuda.launch(kernel, grid, _THREADS, pointers + workspace + scalars, device=index)
    del scratch  # alive until the launch is queued; a captured one then returns to the graph's pool
    return loss, gradient


def _launch_none(input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
    loss = torch.empty_like(input)
    n = input.numel()
    if n:
        index = input.get_device()
        kernel = _kernel("soft_margin_none", input.dtype, index)
        args = (_cuda.pointer(input), _cuda.pointer(target), _cuda.pointer(loss), np.int64(n))
        _cuda.launch(kernel, _grid(n, index, 4), _THREADS, args, device=index)
    return loss


def _launch_none_backward(input: Tensor, target: Tensor, grad_output: Tensor) -> Tensor:  # noqa: A002
    gradient = torch.empty_like(input)
    n = input.numel()
    if not n:
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
        _cuda.pointer(input), _cuda.pointer(target), _cuda.pointer(grad_output),
        np.int32(g_is_scalar), _cuda.pointer(gradient), np.int64(n),
    )  # fmt: skip
    _cuda.launch(kernel, _grid(n, index, 4), _THREADS, args, device=index)
    return gradient


def _launch_scale_(gradient: Tensor, grad_output: Tensor) -> None:
    """``gradient *= grad_output`` in place, the scalar read on the device.

    Large gradients go through our kernel, which returns at once when
    ``grad_output`` is 1 (the usual ``loss.backward()``), so the backward costs
    no pass over memory. Small ones (where host time, not memory, is the cost)
    take torch's ``mul_``: one full pass, but cheaper to launch than CuPy.
    Both read the scalar on the device and round identically (x * 1 == x).
    """
    n = gradient.numel()
    if not n:
        return
    if grad_output.dtype != gradient.dtype:
        grad_output = grad_output.to(gradient.dtype)
    if n <= _TORCH_SCALE_MAX_ELEMENTS:
        gradient.mul_(grad_output)
        return
    index = gradient.get_device()
    kernel = _kernel("soft_margin_scale", gradient.dtype, index)
    args = (_cuda.pointer(gradient), _cuda.pointer(grad_output), np.int64(n))
    _cuda.launch(kernel, _grid(n, index, 4), _THREADS, args, device=index)


# --------------------------------------------------------------------------- helpers


def _broadcast_target(target: Tensor, input: Tensor) -> Tensor:  # noqa: A002
    """``target`` expanded to the input's shape, or torch's kind of error (RuntimeError)."""
    try:
        return target.expand(input.shape)
    except RuntimeError:
        raise RuntimeError(
            f"target of shape {tuple(target.shape)} does not broadcast to the input's shape "
            f"{tuple(input.shape)}; soft_margin_loss needs a target of the input's shape (or one that "
            "broadcasts to it, as in torch): reshape the target"
        ) from None


def _check_backend_name(backend: object) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be 'auto', 'cuda' or 'torch', got {backend!r}")
