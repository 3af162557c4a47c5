"""The engine's kernels: the five operations of ``kernels/ig.cu``, each launcher beside its plain-torch twin.

============  ==========================================================  ==============================
operation     what it computes                                            layouts
============  ==========================================================  ==============================
interpolate   ``b + alpha_k (x - b)`` per step, then ``c`` pairs ``x, b``  ``(n + 2 c, B, F)``
fd_probes     ``p +/- h_i e_i`` for every feature of every path point      ``(P, 2, F, F)``
fd_gradient   ``(F(p + h e_i) - F(p - h e_i)) / (p_i^+ - p_i^-)``          ``(T, P, F)``
accumulate    ``(x - b) * sum_k w_k g_k`` in step order in blocks of 256  ``(T, B, F)``
              steps; ``w (n,)`` or one per step and state ``(T, n, B)``
completeness  F(x), F(b), delta, relative error, degenerate, non-finite,   ``(7, T, B)`` (:data:`STATS`)
              repeat differs
============  ==========================================================  ==============================

Each twin performs the kernel's operations in the kernel's order with the same rounding (the kernels' explicitly
rounded intrinsics forbid the FMA contraction torch's separate ops never make), so :class:`CudaIG` and :class:`TorchIG`
agree bit for bit. A run picks its :class:`IGOps` once (:func:`ig_ops`, from the engine's ``backend``: ``"auto"``,
``"cuda"``, ``"torch"`` or an object). The engine differentiates with autograd itself: no ``autograd.Function`` here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ig.ops import _cupy
from lightning_ig.ops.dtypes import KERNEL_DTYPES, dtype_suffix
from lightning_ig.vocabulary import BACKENDS, check_choice

__all__ = [
    "IG_DTYPES",
    "STATS",
    "CudaIG",
    "IGOps",
    "KernelLaunch",
    "TorchIG",
    "check_backend",
    "degenerate_threshold",
    "ig_ops",
    "repeat_threshold",
    "warp_order_sum",
]

STATS = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite", "repeat_differs")
"""The rows of the completeness statistics ``(7, T, B)``; the flags are 0/1 in the accumulation dtype.

``repeat_differs`` is the stochastic-forward check: 1 where the second evaluation of ``F(x)`` or ``F(b)`` (``ends`` with
two copies) differs from the first (see :func:`repeat_threshold`); always 0 with one copy.
"""

_KERNEL_FILE = "ig.cu"
IG_DTYPES = (*KERNEL_DTYPES, torch.float64)
"""The dtypes ``kernels/ig.cu`` has entry points for: every kernel family's, and float64."""
_THREADS = 256
_MAX_BLOCKS = 1 << 20

KernelLaunch = Callable[[str, torch.dtype, torch.device, int, list], None]
"""``launch(op, dtype, device, total_threads, args)``: run ``ig_<op>_<dtype suffix>`` over ``total_threads``."""


def degenerate_threshold(dtype: torch.dtype) -> float:
    """``sqrt(eps)`` of the accumulation dtype: below it (relative), ``F(x) - F(b)`` is rounding noise."""
    return math.sqrt(float(torch.finfo(dtype).eps))


def repeat_threshold(dtype: torch.dtype) -> float:
    """How far (relative to ``max(1, |F|)``) two evaluations of one row may differ: ``sqrt(eps)`` of the inputs' dtype.

    No finer than float32's: forwards often compute in float32 or coarser whatever the inputs (TF32, autocast, a cast
    inside the model), and a GEMM may tile identical rows differently. Dropout and noise move values by far more.
    """
    return math.sqrt(max(float(torch.finfo(dtype).eps), float(torch.finfo(torch.float32).eps)))


def _launch_with_cupy(op: str, dtype: torch.dtype, device: torch.device, total: int, args: list) -> None:
    kernel = _cupy.get_kernel(_KERNEL_FILE, f"ig_{op}_{dtype_suffix(dtype, IG_DTYPES)}", device)
    blocks = max(1, min((total + _THREADS - 1) // _THREADS, _MAX_BLOCKS))
    _cupy.launch(kernel, blocks, _THREADS, args, device=device)


def _probe_steps(points: Tensor, h: Tensor, point_offset: int) -> Tensor:
    """``h (B, F)`` of each point's state: point ``g`` (global index ``point_offset + p``) is state ``g % B``."""
    states = torch.arange(point_offset, point_offset + points.shape[0], device=points.device) % h.shape[0]
    return h[states]  # (P, F)


_STEP_BLOCK = 16  # the steps whose products one call makes (a call costs the CPU path microseconds of Python)
_SUM_STEPS = 256  # the kernel's LIG_SUM_STEPS: the steps summed in order before their partial sum is added


def _step_weights(weights: Tensor, grads: Tensor) -> Tensor:
    """The weights as ``(T, n, B)``: one per step ``(n,)`` broadcast (a view), or one per step and state as given."""
    n_targets, n_steps, batch, _ = grads.shape
    if weights.dim() == 1:
        return weights.view(1, n_steps, 1).expand(n_targets, n_steps, batch)
    if weights.shape != (n_targets, n_steps, batch):
        raise ValueError(
            f"weights must be (n,) or (T, n, B) = {(n_targets, n_steps, batch)}, got {tuple(weights.shape)}"
        )
    return weights


def warp_order_sum(values: Tensor) -> Tensor:
    """``values (T, B, F)`` summed over ``F`` in kernel (e)'s order: 32 lane-strided partial sums, then a tree.

    Lane ``l`` adds ``values[..., l], values[..., l + 32], ...`` to ``+0`` in turn; the 32 partials are then added
    pairwise at offsets 16, 8, 4, 2, 1, as the warp's shuffles do. Every addition is one exactly rounded elementwise
    add, so the sum is bit-identical to the kernel's and does not depend on torch's reduction order or thread count.
    """
    n_targets, batch, features = values.shape
    chunks = -(-features // 32)
    padded = values.new_zeros((n_targets, batch, chunks * 32))  # +0 pads: x + 0 == x
    padded[..., :features] = values
    padded = padded.view(n_targets, batch, chunks, 32)
    partial = values.new_zeros((n_targets, batch, 32))
    for chunk in range(chunks):
        partial = partial + padded[:, :, chunk]
    width = 16
    while width:
        partial = partial[..., :width] + partial[..., width : 2 * width]
        width //= 2
    return partial[..., 0]


def _repeat_differs(first: Tensor, again: Tensor, tolerance: float) -> Tensor:
    """Twin of ``ig_repeat_differs``: NaN against a number, or ``|again - first| > tol * max(1, |first|, |again|)``. The
    comparison is on the values as the forward returned them (the accumulation dtype)."""
    scale = torch.maximum(torch.maximum(first.abs(), again.abs()), torch.ones_like(first))
    return (first.isnan() != again.isnan()) | ((again - first).abs() > tolerance * scale)


# --------------------------------------------------------------------------- the two implementations


class IGOps:
    """The five operations on flattened states ``x, b (B, F)`` (see the module docstring for shapes).

    Attributes:
        name: what :attr:`IGResult.backend` reports (``"cuda"`` or ``"torch"``).
        twin: an implementation with the same arithmetic to fall back on (the CUDA kernels' torch twins), or ``None``.
    """

    name = "base"
    twin: IGOps | None = None

    def interpolate(self, x: Tensor, b: Tensor, alphas: Tensor, end_copies: int) -> Tensor:
        """``(n + 2 end_copies, B, F)``: the path points, then ``end_copies`` pairs of ends ``x, b``."""
        raise NotImplementedError

    def fd_probes(self, points: Tensor, h: Tensor, point_offset: int, out: Tensor | None = None) -> Tensor:
        """``(P, 2, F, F)`` probes ``p +/- h e_i`` of ``points (P, F)`` (into ``out``, any shape of that size)."""
        raise NotImplementedError

    def fd_gradient(self, points: Tensor, h: Tensor, f: Tensor, point_offset: int, out: Tensor) -> None:
        """Write ``out (T, P, F)`` from the probe values ``f (P, 2, F, T)``; the divisor is the step as stored."""
        raise NotImplementedError

    def accumulate(self, x: Tensor, b: Tensor, weights: Tensor, grads: Tensor) -> Tensor:
        """``(T, B, F)``: ``(x - b) * sum_k w_k g_k`` with ``weights (n,)`` or one per step and state ``(T, n, B)``."""
        raise NotImplementedError

    def completeness(self, attributions: Tensor, ends: Tensor) -> Tensor:
        """``stats (7, T, B)`` (rows :data:`STATS`) from ``attributions (T, B, F)`` and ``ends (2 c, B, T)``.

        ``ends`` holds ``F(x), F(b)``, ``c`` times. A state is *non-finite* when ``F(x)``, ``F(b)`` or ``delta`` is
        NaN/Inf (any NaN/Inf attribution makes the sum, and so ``delta``, non-finite): relative error ``inf``; else
        *degenerate* (NaN) or checked.
        """
        raise NotImplementedError


class TorchIG(IGOps):
    """The torch twins: any device, any floating dtype; the reference for the kernels."""

    name = "torch"

    def interpolate(self, x: Tensor, b: Tensor, alphas: Tensor, end_copies: int) -> Tensor:
        acc = alphas.dtype
        xa, ba = x.to(acc), b.to(acc)
        path = (ba.unsqueeze(0) + alphas.view(-1, 1, 1) * (xa - ba).unsqueeze(0)).to(x.dtype)  # (n, B, F)
        if end_copies:
            path = torch.cat([path, *[x.unsqueeze(0), b.unsqueeze(0)] * end_copies])  # (n + 2 c, B, F)
        return path

    def fd_probes(self, points: Tensor, h: Tensor, point_offset: int, out: Tensor | None = None) -> Tensor:
        n_points, features = points.shape
        step, values = _probe_steps(points, h, point_offset), points.to(h.dtype)
        probes = points.view(n_points, 1, 1, features).expand(n_points, 2, features, features).clone()
        diagonal = torch.arange(features, device=points.device)
        probes[:, 0, diagonal, diagonal] = (values + step).to(points.dtype)
        probes[:, 1, diagonal, diagonal] = (values - step).to(points.dtype)
        if out is None:
            return probes
        out.view(probes.shape).copy_(probes)
        return out

    def fd_gradient(self, points: Tensor, h: Tensor, f: Tensor, point_offset: int, out: Tensor) -> None:
        step, values = _probe_steps(points, h, point_offset), points.to(h.dtype)
        plus = (values + step).to(points.dtype).to(h.dtype)
        minus = (values - step).to(points.dtype).to(h.dtype)
        denominator = plus - minus  # (P, F)
        difference = (f[:, 0] - f[:, 1]).permute(2, 0, 1)  # (T, P, F)
        gradient = difference / denominator
        out.copy_(torch.where(denominator != 0, gradient, torch.zeros_like(gradient)))  # a step that rounds away: 0

    def accumulate(self, x: Tensor, b: Tensor, weights: Tensor, grads: Tensor) -> Tensor:
        steps = _step_weights(weights, grads).unsqueeze(-1)  # (T, n, B, 1)
        sums = torch.promote_types(steps.dtype, grads.dtype)  # the products' dtype
        n_steps, total = grads.shape[1], torch.zeros_like(grads[:, 0], dtype=sums)  # (T, B, F)
        for start in range(0, n_steps, _SUM_STEPS):
            part = total if start == 0 else torch.zeros_like(total)  # the first block's sum is 0 + part: part itself
            for first in range(start, min(n_steps, start + _SUM_STEPS), _STEP_BLOCK):
                # multiply, then add in step order: two roundings, like the kernel's __fmul_rn/__fadd_rn (no FMA)
                block = slice(first, first + _STEP_BLOCK)
                for term in (steps[:, block] * grads[:, block]).unbind(1):
                    part.add_(term)
            if start:
                total.add_(part)
        acc = grads.dtype
        return ((x.to(acc) - b.to(acc)).unsqueeze(0) * total).to(x.dtype)

    def completeness(self, attributions: Tensor, ends: Tensor) -> Tensor:
        acc = ends.dtype
        f_input, f_baseline = ends[0].t(), ends[1].t()  # (T, B) each
        difference = f_input - f_baseline
        delta = warp_order_sum(attributions.to(acc)) - difference
        scale = torch.maximum(torch.maximum(f_input.abs(), f_baseline.abs()), torch.ones_like(f_input))
        non_finite = ~(torch.isfinite(f_input) & torch.isfinite(f_baseline) & torch.isfinite(delta))
        degenerate = ~non_finite & (difference.abs() <= degenerate_threshold(acc) * scale)
        relative = torch.where(degenerate, torch.full_like(delta, math.nan), delta.abs() / difference.abs())
        relative = torch.where(non_finite, torch.full_like(delta, math.inf), relative)
        differs = torch.zeros_like(degenerate)
        if ends.shape[0] == 4:
            tolerance = repeat_threshold(attributions.dtype)
            repeated = ends[2:].transpose(1, 2)  # (2, T, B)
            differs = _repeat_differs(f_input, repeated[0], tolerance) | _repeat_differs(
                f_baseline, repeated[1], tolerance
            )
        flags = (degenerate.to(acc), non_finite.to(acc), differs.to(acc))
        return torch.stack([f_input, f_baseline, delta, relative, *flags])


class CudaIG(IGOps):
    """The kernels of ``kernels/ig.cu`` through CuPy, on torch's current stream; torch twins as :attr:`twin`.

    Args:
        launch: how a kernel runs (default: compiled with NVRTC and launched through :mod:`lightning_ig.ops._cupy`);
            tests pass a host build of ``ig.cu``.
    """

    name = "cuda"

    def __init__(self, launch: KernelLaunch | None = None) -> None:
        self.launch = launch or _launch_with_cupy
        self.twin = TorchIG()

    def interpolate(self, x: Tensor, b: Tensor, alphas: Tensor, end_copies: int) -> Tensor:
        n_steps = alphas.shape[0]
        batch, features = x.shape
        points = torch.empty((n_steps + 2 * end_copies, batch, features), dtype=x.dtype, device=x.device)
        pointers = [_cupy.pointer(tensor) for tensor in (x, b, alphas, points)]
        sizes = [_cupy.int64(n_steps), _cupy.int64(batch * features), _cupy.int32(end_copies)]
        self.launch("interpolate", x.dtype, x.device, points.numel(), [*pointers, *sizes])
        return points

    def fd_probes(self, points: Tensor, h: Tensor, point_offset: int, out: Tensor | None = None) -> Tensor:
        n_points, features = points.shape
        shape = (n_points, 2, features, features)
        probes = out if out is not None else torch.empty(shape, dtype=points.dtype, device=points.device)
        pointers = [_cupy.pointer(tensor) for tensor in (points, h, probes)]
        sizes = [_cupy.int64(n_points), _cupy.int32(features), _cupy.int32(h.shape[0]), _cupy.int64(point_offset)]
        self.launch("fd_probes", points.dtype, points.device, math.prod(shape), [*pointers, *sizes])
        return probes

    def fd_gradient(self, points: Tensor, h: Tensor, f: Tensor, point_offset: int, out: Tensor) -> None:
        n_points, features = points.shape
        n_targets = f.shape[-1]
        pointers = [_cupy.pointer(tensor) for tensor in (points, h, f, out)]
        sizes = [_cupy.int64(n_points), _cupy.int32(features), _cupy.int32(h.shape[0]), _cupy.int32(n_targets)]
        offsets = [_cupy.int64(point_offset), _cupy.int64(out.stride(0))]
        total = n_targets * n_points * features
        self.launch("fd_gradient", points.dtype, points.device, total, [*pointers, *sizes, *offsets])

    def accumulate(self, x: Tensor, b: Tensor, weights: Tensor, grads: Tensor) -> Tensor:
        n_targets, n_steps, batch, features = grads.shape
        steps = _step_weights(weights, grads)
        if weights.dim() > 1:
            steps = steps.contiguous()
        attributions = torch.empty((n_targets, batch, features), dtype=x.dtype, device=x.device)
        pointers = [_cupy.pointer(tensor) for tensor in (x, b, weights if weights.dim() == 1 else steps, grads)]
        sizes = [
            _cupy.int32(n_steps),
            _cupy.int64(batch * features),
            _cupy.int32(n_targets),
            _cupy.int64(max(1, features)),
        ]
        strides = [_cupy.int64(stride) for stride in steps.stride()]  # (0, 1, 0) per step; (n B, B, 1) per state
        args = [*pointers, _cupy.pointer(attributions), *sizes, *strides]
        self.launch("accumulate", x.dtype, x.device, attributions.numel(), args)
        return attributions

    def completeness(self, attributions: Tensor, ends: Tensor) -> Tensor:
        n_targets, batch, features = attributions.shape
        stats = torch.empty((len(STATS), n_targets, batch), dtype=ends.dtype, device=ends.device)
        pointers = [_cupy.pointer(tensor) for tensor in (attributions, ends, stats)]
        sizes = [_cupy.int32(batch), _cupy.int64(features), _cupy.int32(n_targets)]
        thresholds = [np.float64(degenerate_threshold(ends.dtype)), _cupy.int32(ends.shape[0] // 2)]
        thresholds.append(np.float64(repeat_threshold(attributions.dtype)))
        warps = n_targets * batch * 32  # one warp per state
        self.launch("completeness", attributions.dtype, attributions.device, warps, [*pointers, *sizes, *thresholds])
        return stats


_TORCH = TorchIG()
_CUDA = CudaIG()


def ig_ops(backend: str | IGOps, inputs: Tensor) -> IGOps:
    """The operations a run uses: an :class:`IGOps` as given, or the one ``"auto"``/``"cuda"``/``"torch"`` names.

    ``"auto"`` picks the kernels when the inputs are on a CUDA device and CuPy imports, else the twins; ``"cuda"`` never
    falls back silently.

    Raises:
        ValueError: an unknown name, or ``"cuda"`` without a CUDA device or with CPU inputs.
        TypeError: ``"cuda"`` with a dtype the kernels do not take.
        RuntimeError: ``"cuda"`` where CuPy is not installed.
    """
    if isinstance(backend, IGOps):
        return backend
    check_choice(backend, BACKENDS, "backend")
    if backend == "cuda" and inputs.dtype not in IG_DTYPES:
        raise TypeError(f"backend='cuda' has kernels for {', '.join(map(str, IG_DTYPES))}; got {inputs.dtype}")
    return _CUDA if _cupy.choose_backend(backend, inputs) == "cuda" else _TORCH


def check_backend(value: Any) -> str | IGOps:
    """Check the ``backend`` option: a name of :data:`lightning_ig.vocabulary.BACKENDS` or an :class:`IGOps`."""
    return value if isinstance(value, IGOps) else check_choice(value, BACKENDS, "backend")
