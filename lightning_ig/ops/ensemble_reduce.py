"""Layer one of the ensemble reduce: the kernels' launchers, their ``autograd.Function`` and the torch twin.

The kernels are in ``kernels/ensemble.cu``: ONE launch for the forward and ONE
for the backward, which writes ``d out / d logits`` and, when the weights
require a gradient, ``d out / d weights`` (a deterministic cross-block sum, no
atomics on floats). The gradient is not precomputed in the forward: the output
has one value per row, so scaling a stored gradient by ``grad_output`` would
cost the same pass over memory as recomputing it from the logits, plus a write.

``forward_torch`` / ``backward_torch`` are the torch twin: the same operations
in the same order (the stable sigmoid ``e = exp(-|x|)``, ``r = 1 / (1 + e)``,
``sigmoid = r`` or ``e r``; the sum over ``k`` in order; the members in the
kernel's lane chunks and shuffle tree). On one CUDA device the float32 kernel
and the twin agree bit for bit (``torch.exp`` on CUDA is the same libdevice
``expf`` the kernel calls; every other step is one exactly rounded operation);
the twin is also the CPU and float64 path and the reference in tests.

The kernels' tuning (rows per thread, loads in flight, register budget, the
instruction sequences of the reciprocal and of ``/ K``) is chosen at compile time
from :data:`VARIANTS`; :data:`DEFAULT_VARIANT` names the one every launch uses.
All variants give the same bits; ``benchmarks/bench_ensemble.py --variants``
times them on a device, and :func:`use_variant` switches for a ``with`` block.
Each (variant, dtype) compiles once per device, with only that dtype's entry points.

Everything here takes logits already checked and viewed as ``(B, M, K)`` and
weights of length ``M`` on the same device (:mod:`lightning_ig.ensemble.reduce`
checks them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.ops import _cupy
from lightning_ig.ops.dtypes import accumulate_dtype, dtype_suffix

__all__ = [
    "DEFAULT_VARIANT",
    "VARIANTS",
    "KernelVariant",
    "TorchReduce",
    "backward_torch",
    "forward_torch",
    "group_size",
    "member_means_torch",
    "reduce_cuda",
    "use_variant",
]

# Launch geometry; it must match the constants at the top of kernels/ensemble.cu.
_KERNEL_FILE = "ensemble.cu"
_THREADS = 256  # LIG_ENS_THREADS
_BACKWARD_BLOCKS_PER_SM = 4  # LIG_ENS_MIN_BLOCKS: the backward's grid fills every SM once


# --------------------------------------------------------------------------- kernel variants


class KernelVariant(NamedTuple):
    """Compile-time tuning of ``kernels/ensemble.cu`` (the knobs documented at its top).

    No knob changes a rounding: every variant gives the same bits as every other
    (and as the twin in float32); they differ in speed only.
    """

    forward_rows: int  # LIG_ENS_FORWARD_ROWS: rows a forward thread works on at once
    forward_min_blocks: int  # LIG_ENS_FORWARD_MIN_BLOCKS: register budget; the forward grid is this many blocks per SM
    forward_depth: int  # LIG_ENS_FORWARD_DEPTH: 0 one member at a time; D: D vectors per row loaded before computing
    lean: bool  # LIG_ENS_LEAN: branch-free exact reciprocal on [1, 2], / K as * (1 / K) for K = 2^n, unrolled tree

    def options(self) -> tuple[str, ...]:
        """The NVRTC ``-D`` options that select this variant."""
        return (
            f"-DLIG_ENS_FORWARD_ROWS={self.forward_rows}",
            f"-DLIG_ENS_FORWARD_MIN_BLOCKS={self.forward_min_blocks}",
            f"-DLIG_ENS_FORWARD_DEPTH={self.forward_depth}",
            f"-DLIG_ENS_LEAN={int(self.lean)}",
        )


# Each compiles without register spills for sm_80 and sm_90 (tests/test_ensemble_variants.py
# checks where nvcc exists); `benchmarks/bench_ensemble.py --variants` times them all on one device.
VARIANTS: dict[str, KernelVariant] = {
    "baseline": KernelVariant(forward_rows=3, forward_min_blocks=4, forward_depth=0, lean=False),
    "lean": KernelVariant(forward_rows=3, forward_min_blocks=4, forward_depth=0, lean=True),
    "lean-r4-d1": KernelVariant(forward_rows=4, forward_min_blocks=4, forward_depth=1, lean=True),
    "lean-r2-d2": KernelVariant(forward_rows=2, forward_min_blocks=4, forward_depth=2, lean=True),
    "lean-r1-d4": KernelVariant(forward_rows=1, forward_min_blocks=4, forward_depth=4, lean=True),
    "lean-r2-d1-mb5": KernelVariant(forward_rows=2, forward_min_blocks=5, forward_depth=1, lean=True),
    "lean-r3-d2-mb3": KernelVariant(forward_rows=3, forward_min_blocks=3, forward_depth=2, lean=True),
    "exact-r3-d2-mb3": KernelVariant(forward_rows=3, forward_min_blocks=3, forward_depth=2, lean=False),
    "lean-r4-d2-mb2": KernelVariant(forward_rows=4, forward_min_blocks=2, forward_depth=2, lean=True),
    "lean-r8-d1-mb2": KernelVariant(forward_rows=8, forward_min_blocks=2, forward_depth=1, lean=True),
    "lean-r2-d4-mb2": KernelVariant(forward_rows=2, forward_min_blocks=2, forward_depth=4, lean=True),
}

DEFAULT_VARIANT = "lean-r4-d1"  # the fastest where it was timed (docs/benchmarks.md, bench_ensemble.py --variants)

_active_variant = DEFAULT_VARIANT


@contextlib.contextmanager
def use_variant(name: str) -> Iterator[KernelVariant]:
    """Launch the kernels of variant ``name`` inside the ``with`` block (benchmarks and tests).

    Not thread-safe: it switches a module-level setting for every caller.

    Raises:
        ValueError: ``name`` is not in :data:`VARIANTS`.
    """
    global _active_variant  # noqa: PLW0603 - one module-level switch, documented as not thread-safe
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {name!r}")
    previous, _active_variant = _active_variant, name
    try:
        yield VARIANTS[name]
    finally:
        _active_variant = previous


# --------------------------------------------------------------------------- torch twin


def group_size(members: int) -> int:
    """Lanes per row in the kernels: the next power of two >= ``members``, at most 32."""
    return min(32, 1 << (members - 1).bit_length())


def _sigmoid_parts(x: Tensor) -> tuple[Tensor, Tensor]:
    """``e = exp(-|x|)`` and ``r = 1 / (1 + e)``: the kernel's expf, __fadd_rn and __frcp_rn."""
    e = torch.exp(-x.abs())
    return e, torch.reciprocal(e + 1)


def _means_from_parts(x: Tensor, e: Tensor, r: Tensor) -> Tensor:
    """``(B, M)``: sigmoid summed over k in order from 0, divided by K (a tensor: torch turns a
    division by a Python scalar into a multiplication by its reciprocal on CUDA)."""
    sigmoid = torch.where(x >= 0, r, e * r)  # (B, M, K)
    total = torch.zeros_like(sigmoid[..., 0])
    for k in range(sigmoid.shape[-1]):
        total = total + sigmoid[..., k]
    return total / torch.full_like(total, sigmoid.shape[-1])


def member_means_torch(rows_members_logits: Tensor) -> Tensor:
    """``(B, M)`` member means in the accumulation dtype (float32, or float64 for float64 logits)."""
    x = rows_members_logits.to(accumulate_dtype(rows_members_logits.dtype))
    e, r = _sigmoid_parts(x)
    return _means_from_parts(x, e, r)


def forward_torch(rows_members_logits: Tensor, weights: Tensor) -> Tensor:
    """Twin of the forward kernel: ``(B,)`` in the logits' dtype."""
    means = member_means_torch(rows_members_logits)  # (B, M)
    values = weights.to(means.dtype) * means
    rows, members = values.shape
    lanes = group_size(members)
    chunks = -(-members // lanes)
    if chunks * lanes != members:
        values = nn.functional.pad(values, (0, chunks * lanes - members))  # x + 0 == x for every partial
    values = values.reshape(rows, chunks, lanes)
    partial = torch.zeros_like(values[:, 0])  # (B, lanes): lane j's members j, j + lanes, ... in order
    for chunk in range(chunks):
        partial = partial + values[:, chunk]
    while lanes > 1:  # the shuffle tree: lane j adds lane j + lanes / 2
        lanes //= 2
        partial = partial[:, :lanes] + partial[:, lanes : 2 * lanes]
    return partial[:, 0].to(rows_members_logits.dtype)


def backward_torch(
    rows_members_logits: Tensor, weights: Tensor, grad_output: Tensor, need_logits: bool, need_weights: bool
) -> tuple[Tensor | None, Tensor | None]:
    """Twin of the backward kernel, from differentiable ops (so it also serves ``create_graph=True``).

    ``d logits = (g w / K) (e r) r`` bit for bit in float32; ``d weights = sum_b g mean``
    from exact float64 products (the kernel's sum runs in another order).
    """
    accumulate = accumulate_dtype(rows_members_logits.dtype)
    x = rows_members_logits.to(accumulate)
    g = grad_output.to(accumulate)
    e, r = _sigmoid_parts(x)
    grad_logits = grad_weights = None
    if need_logits:
        scaled = g[:, None] * weights.to(accumulate)[None, :]  # (B, M)
        coefficient = scaled / torch.full_like(scaled, x.shape[-1])
        grad_logits = (coefficient[..., None] * ((e * r) * r)).to(rows_members_logits.dtype)
    if need_weights:
        means = _means_from_parts(x, e, r)
        exact = (g.double()[:, None] * means.double()).sum(dim=0)
        grad_weights = exact.to(accumulate).to(weights.dtype)
    return grad_logits, grad_weights


class TorchReduce(torch.autograd.Function):
    """The twin with the kernels' backward formula (also where there is no CUDA device)."""

    @staticmethod
    def forward(ctx: Any, rows_members_logits: Tensor, weights: Tensor) -> Tensor:
        ctx.save_for_backward(rows_members_logits, weights)
        return forward_torch(rows_members_logits, weights)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None]:
        rows_members_logits, weights = ctx.saved_tensors
        return backward_torch(rows_members_logits, weights, grad_output, *ctx.needs_input_grad[:2])


# --------------------------------------------------------------------------- CUDA path


def reduce_cuda(rows_members_logits: Tensor, weights: Tensor, needs_grad: bool) -> Tensor:
    if needs_grad:
        return _CudaReduce.apply(rows_members_logits, weights)
    return _launch_forward(rows_members_logits, _weights32(weights))


def _weights32(weights: Tensor) -> Tensor:
    """The weights as the kernels read them (float32, contiguous); only their address is used."""
    if weights.dtype == torch.float32 and weights.is_contiguous():
        return weights
    return weights.detach().to(torch.float32).contiguous()


class _CudaReduce(torch.autograd.Function):
    """Autograd over the kernels: one launch forward, one backward."""

    @staticmethod
    def forward(ctx: Any, rows_members_logits: Tensor, weights: Tensor) -> Tensor:
        ctx.save_for_backward(rows_members_logits, weights)
        return _launch_forward(rows_members_logits, _weights32(weights))

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None]:
        rows_members_logits, weights = ctx.saved_tensors
        need_logits, need_weights = ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():
            # create_graph=True: differentiable ops, so second derivatives are right
            return backward_torch(rows_members_logits, weights, grad_output, need_logits, need_weights)
        grad_logits, grad_weights = _launch_backward(
            rows_members_logits, _weights32(weights), grad_output, need_logits, need_weights
        )
        if grad_weights is not None and grad_weights.dtype != weights.dtype:
            grad_weights = grad_weights.to(weights.dtype)
        return grad_logits, grad_weights


class _Plan(NamedTuple):
    """What one (shape, strides, dtype, device, variant) needs for a launch, computed once."""

    forward_grid: int  # blocks: enough for one row per group, at most the variant's blocks per SM
    backward_grid: int  # the same with _BACKWARD_BLOCKS_PER_SM
    shape_args: tuple[Any, ...]  # rows, members, K, three strides, group size (the kernels' C types)
    vector_alignment: int  # bytes the logits' address must be a multiple of for vector loads; 0: never


# Caches that keep the per-call host path short (the (16, 8, 1) call is host-bound).
_kernels: dict[tuple[str, torch.dtype, int, str], Any] = {}
_plans: dict[tuple[Any, ...], _Plan] = {}
_sm_counts: dict[int, int] = {}
_workspaces: dict[tuple[int, int], Tensor] = {}


def _kernel(op: str, dtype: torch.dtype, device_index: int) -> Any:
    key = (op, dtype, device_index, _active_variant)
    kernel = _kernels.get(key)
    if kernel is None:
        suffix = dtype_suffix(dtype)
        options = (*VARIANTS[_active_variant].options(), "-DLIG_ENS_ONE_DTYPE", f"-DLIG_ENS_DTYPE_{suffix}")
        kernel = _kernels[key] = _cupy.get_kernel(_KERNEL_FILE, f"{op}_{suffix}", device_index, options)
    return kernel


def _plan(x: Tensor, device_index: int) -> _Plan:
    key = (x.shape, x.stride(), x.dtype, device_index, _active_variant)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 1024:  # many distinct shapes: start over rather than grow without bound
            _plans.clear()
        rows, members, per_member = x.shape
        stride_row, stride_member, stride_logit = x.stride()
        lanes = group_size(members)
        sm_count = _sm_counts.get(device_index)
        if sm_count is None:
            sm_count = _sm_counts[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
        needed = -(-rows // (_THREADS // lanes))  # one row per group
        forward_limit = max(1, sm_count * VARIANTS[_active_variant].forward_min_blocks)
        backward_limit = max(1, sm_count * _BACKWARD_BLOCKS_PER_SM)
        vector = stride_logit == 1 and per_member % 4 == 0 and stride_member % 4 == 0 and stride_row % 4 == 0
        shape_args = (
            _cupy.int64(rows),
            _cupy.int32(members),
            _cupy.int32(per_member),
            _cupy.int64(stride_row),
            _cupy.int64(stride_member),
            _cupy.int64(stride_logit),
            _cupy.int32(lanes),
        )
        plan = _plans[key] = _Plan(
            max(1, min(forward_limit, needed)),
            max(1, min(backward_limit, needed)),
            shape_args,
            4 * x.element_size() if vector else 0,
        )
    return plan


def _vectorized(x: Tensor, plan: _Plan) -> np.int32:
    aligned = plan.vector_alignment and x.data_ptr() % plan.vector_alignment == 0
    return np.int32(1 if aligned else 0)


def _launch_forward(x: Tensor, weights32: Tensor) -> Tensor:
    out = x.new_empty(x.shape[0])
    if x.shape[0] == 0:
        return out
    index = x.get_device()
    plan = _plan(x, index)
    args = (_cupy.pointer(x), _cupy.pointer(weights32), _cupy.pointer(out), *plan.shape_args, _vectorized(x, plan))
    _cupy.launch(_kernel("ensemble_forward", x.dtype, index), plan.forward_grid, _THREADS, args, device=index)
    return out


def _workspace(like: Tensor, index: int, doubles: int) -> tuple[Tensor, np.uint64, np.uint64]:
    """Partial sums (``doubles`` float64) and a zeroed ticket counter for a weight-gradient launch.

    Returns ``(the tensor, partials pointer, counter pointer)``. Launches on one
    stream never overlap, so eager ones share one workspace per (device, stream),
    grown when too small (a new zeroed tensor); a launch being captured into a
    CUDA graph gets its own, zeroed from the graph's pool as part of the graph.
    """
    if torch.cuda.is_current_stream_capturing():
        scratch = like.new_zeros(doubles + 1, dtype=torch.float64)  # the counter is the low word of the last 0.0
    else:
        key = (index, _cupy.current_stream_handle(index))
        cached = _workspaces.get(key)
        if cached is None or cached.numel() < doubles + 1:
            cached = _workspaces[key] = like.new_zeros(max(doubles, 4096) + 1, dtype=torch.float64)
        scratch = cached
    base = scratch.data_ptr()
    return scratch, np.uint64(base), np.uint64(base + 8 * (scratch.numel() - 1))


def _launch_backward(
    x: Tensor, weights32: Tensor, grad_output: Tensor, need_logits: bool, need_weights: bool
) -> tuple[Tensor | None, Tensor | None]:
    rows, members, _ = x.shape
    grad_logits = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_logits else None
    grad_weights = weights32.new_empty(members) if need_weights else None
    if rows == 0:
        if grad_weights is not None:
            grad_weights.zero_()
        return grad_logits, grad_weights
    if grad_output.dtype != x.dtype:
        grad_output = grad_output.to(x.dtype)
    index = x.get_device()
    plan = _plan(x, index)
    scratch = None
    partials = counter = np.uint64(0)
    if need_weights:
        scratch, partials, counter = _workspace(x, index, plan.backward_grid * members)
    null = np.uint64(0)
    args = (
        _cupy.pointer(x),
        _cupy.pointer(weights32),
        _cupy.pointer(grad_output),
        _cupy.int64(grad_output.stride(0)),
        _cupy.pointer(grad_logits) if grad_logits is not None else null,
        _cupy.pointer(grad_weights) if grad_weights is not None else null,
        partials,
        counter,
        *plan.shape_args,
        _vectorized(x, plan),
    )
    _cupy.launch(_kernel("ensemble_backward", x.dtype, index), plan.backward_grid, _THREADS, args, device=index)
    del scratch  # alive until the launch is queued; a captured one then returns to the graph's pool
    return grad_logits, grad_weights
