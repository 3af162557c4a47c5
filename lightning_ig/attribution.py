"""The Integrated Gradients engine: :func:`integrated_gradients`, :class:`IGResult`, :class:`IntegratedGradients`.

Integrated Gradients (Sundararajan et al., 2017) attributes ``F(x) - F(b)`` to
the input features by integrating the gradient of ``F`` along the straight
path ``b + alpha (x - b)``, ``alpha`` in ``[0, 1]``::

    attributions_i = (x_i - b_i) * integral_0^1 dF/dx_i(b + alpha (x - b)) d alpha
                  ~= (x_i - b_i) * sum_k w_k g_k,i

with the quadrature ``(alpha_k, w_k)`` of :mod:`lightning_ig.quadrature`.

How it runs:

* all ``n_steps x B`` path points, plus the two ends ``x`` and ``b``, are built
  by one interpolation (kernel (a) of ``kernels/ig.cu``) and evaluated in one
  batched forward (chunked by ``internal_batch_size``), so ``F(x)`` and
  ``F(b)`` for the completeness check cost no extra pass;
* ``gradient="autograd"``: one ``torch.autograd.grad`` w.r.t. the path points
  only; never ``.backward()``, never a parameter's ``.grad``;
* ``gradient="finite_difference"``: central differences
  ``(F(p + h e_i) - F(p - h e_i)) / 2h`` for every feature ``i`` of every path
  point, all probes built by one kernel launch per chunk (kernel (b)) and
  evaluated in batched forwards; the differences by kernel (c);
* ``attributions = (x - b) * sum_k w_k g_k`` summed in step order (kernel (d));
* the completeness statistics per state in one launch (kernel (e)).

Every kernel has a torch twin here (``_interpolate_torch`` and friends) with
the same operations in the same order: the reference in tests and the path
where there is no CUDA device or no CuPy.

The finite-difference step
    For a state with input ``x`` and baseline ``b`` the step of feature ``i`` is
    ``h_i = fd_step * max(1, |x_i|, |b_i|)``, the relative step scaled to the
    size of the coordinate along the whole path (every path point lies between
    ``b_i`` and ``x_i``), with a floor of 1 so features near zero still get a
    step the forward can resolve. ``fd_step`` defaults to ``eps ** (1/3)`` of the
    input dtype (float32: 4.9e-3, float64: 6.1e-6, float16: 0.099, bfloat16:
    0.198), the step that balances the central difference's truncation error
    ``O(h^2)`` against rounding error ``O(eps / h)``. The divisor is the step the
    forward really saw, ``(p_i + h_i) - (p_i - h_i)`` after rounding to the
    input dtype, not ``2 h_i``.

Completeness and degenerate states
    ``delta = sum(attributions) - (F(x) - F(b))`` (Captum's sign) and the relative
    error ``|delta| / |F(x) - F(b)|``. A state is *degenerate* when
    ``|F(x) - F(b)| <= sqrt(eps) * max(1, |F(x)|, |F(b)|)`` with ``eps`` the
    machine epsilon of the accumulation dtype (float32: 3.5e-4 x scale; float64:
    1.5e-8 x scale): then ``F(x) - F(b)`` is within the rounding noise of the
    forward and the ratio means nothing. Its ``relative_error`` is NaN, it is
    kept out of :attr:`IGResult.worst_relative_error`, and its absolute error
    stays in ``delta``. ``n_steps="auto"`` judges it by that absolute error
    against ``completeness_tol * max(1, |F(x)|, |F(b)|)``.

Non-finite states
    A state whose ``F(x)``, ``F(b)`` or attributions hold NaN/Inf (a diverged
    model, an overflowing forward) is *non-finite*: flagged in
    :attr:`IGResult.non_finite`, relative error ``inf``, and it makes
    :attr:`IGResult.worst_relative_error` ``inf``; it is never counted as
    degenerate or clean. The flags are computed on the device in the
    completeness step; NaN/Inf *inputs* still raise.

Stochastic forwards
    Every eager call (and each CUDA-graph capture) evaluates the forward a
    second time on the path's two ends ``x`` and ``b`` and compares; values that
    differ beyond rounding (dropout or batch-norm in train mode, noise drawn in
    the forward) set :attr:`IGResult.stochastic` and raise a
    :class:`StochasticForwardWarning`. It costs one forward of ``2 B`` rows.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

import numpy as np
import torch
from torch import Tensor

from lightning_ig import _cuda
from lightning_ig.quadrature import MAX_GAUSS_LEGENDRE_STEPS, check_rule, nests_on_doubling, quadrature
from lightning_ig.vocabulary import check_finite

__all__ = [
    "IGResult",
    "IntegratedGradients",
    "StochasticForwardWarning",
    "check_finite",
    "integrated_gradients",
    "target_forward",
    "worst_relative_error",
]

Target = Union[None, str, int, Tensor, Callable[[Tensor], Tensor]]
Baselines = Union[None, str, float, int, Tensor]
GradientMode = Literal["autograd", "finite_difference"]

_KERNEL_FILE = "ig.cu"
_KERNEL_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_THREADS = 256
_MAX_BLOCKS = 1 << 20
_DEFAULT_MAX_STEPS = 512
_AUTO_FIRST_STEPS = 16


# --------------------------------------------------------------------------- result


class StochasticForwardWarning(RuntimeWarning):
    """The forward gave different values on the same rows within one call.

    Dropout or batch-norm in train mode, or NoisyNet noise left on: the
    attributions of such a forward are not reproducible and completeness does
    not hold. Put the model in ``eval()`` mode and switch its noise off
    (:func:`lightning_ig.noise_disabled`) before attributing.
    """


@dataclass(frozen=True)
class IGResult:
    """What one Integrated Gradients run produced.

    Tensors stay on the inputs' device; nothing is copied to the host until a
    property such as :attr:`worst_relative_error` is read.

    Each state is exactly one of: *non-finite* (``F(x)``, ``F(b)`` or an
    attribution is NaN/Inf: it cannot be checked and is never clean),
    *degenerate* (``|F(x) - F(b)|`` too small for a ratio, see the module
    docstring) or *checked*.

    Attributes:
        attributions: ``(B, *feature_shape)``, or ``(A, B, *feature_shape)`` for
            ``target="each"``; the inputs' dtype.
        f_input: ``(B,)`` (``(A, B)`` for ``"each"``) the target at the inputs.
        f_baseline: ``(B,)`` (``(A, B)``) the target at the baselines.
        delta: ``sum(attributions) - (f_input - f_baseline)`` per state (Captum's sign).
        relative_error: ``|delta| / |f_input - f_baseline|`` for a checked state;
            NaN for a degenerate state, ``inf`` for a non-finite one.
        degenerate: bool, ``|f_input - f_baseline|`` too small for a ratio (see the
            module docstring for the threshold); never set on a non-finite state.
        non_finite: bool, ``f_input``, ``f_baseline``, ``delta`` or any attribution
            of the state is NaN/Inf.
        baselines: ``(B, *feature_shape)`` as used.
        n_steps: the quadrature points used (for ``n_steps="auto"``, where it stopped).
        method: the quadrature rule.
        gradient: ``"autograd"`` or ``"finite_difference"``.
        backend: ``"cuda"`` (the kernels of ``kernels/ig.cu``) or ``"torch"``.
        target: what was attributed: ``"output"``, ``"mean"``, ``"index:<k>"``,
            ``"per_row"``, ``"each"`` or ``"callable:<name>"``.
        fd_step: the relative finite-difference step (``None`` for autograd).
        internal_batch_size: rows per forward in the last chunk run.
        cuda_graph: whether the result came from a replayed CUDA graph.
        stochastic: the forward gave different values when the path's two ends
            were evaluated a second time in the same call (checked on every
            eager call and when a CUDA graph is captured; a replay reports what
            its capture found). A :class:`StochasticForwardWarning` said so.
    """

    attributions: Tensor
    f_input: Tensor
    f_baseline: Tensor
    delta: Tensor
    relative_error: Tensor
    degenerate: Tensor
    non_finite: Tensor
    baselines: Tensor
    n_steps: int
    method: str
    gradient: str
    backend: str
    target: str
    fd_step: float | None = None
    internal_batch_size: int | None = None
    cuda_graph: bool = False
    stochastic: bool = False

    @property
    def worst_relative_error(self) -> float:
        """The result's completeness in one number; never ``0.0`` for "nothing was checked".

        ``inf`` when any state is non-finite; NaN when no state could be checked
        (every state degenerate); otherwise the largest relative error over the
        checked states.
        """
        return worst_relative_error(self.relative_error, self.degenerate, self.non_finite)

    @property
    def mean_abs_error(self) -> float:
        """The mean ``|delta|`` over all states, degenerate ones included (NaN/Inf with a non-finite state)."""
        return float(self.delta.abs().mean())

    @property
    def num_degenerate(self) -> int:
        """How many states were too degenerate for a relative error (per action for ``"each"``)."""
        return int(self.degenerate.sum())

    @property
    def num_non_finite(self) -> int:
        """How many states had a NaN/Inf forward value or attribution (per action for ``"each"``)."""
        return int(self.non_finite.sum())

    @property
    def num_checked(self) -> int:
        """How many states had a relative error to check: neither degenerate nor non-finite."""
        return self.non_finite.numel() - self.num_degenerate - self.num_non_finite

    @property
    def first_non_finite(self) -> int | None:
        """The index (0 to B - 1) of the first state with a NaN/Inf value (in any action for ``"each"``), or None."""
        per_state = self.non_finite.reshape(-1, self.non_finite.shape[-1]).any(dim=0)  # (B,)
        found = per_state.nonzero()
        return int(found[0, 0]) if found.numel() else None


def worst_relative_error(relative_error: Tensor, degenerate: Tensor, non_finite: Tensor) -> float:
    """``inf`` if any state is non-finite, NaN if none was checked, else the largest checked relative error.

    The one definition of the worst completeness error (:attr:`IGResult.worst_relative_error`).
    """
    checked = ~(degenerate | non_finite)
    # One host sync: both answers come back together.
    any_non_finite, any_checked, largest = torch.stack([
        non_finite.any().to(relative_error.dtype),
        checked.any().to(relative_error.dtype),
        torch.where(checked, relative_error, torch.zeros_like(relative_error)).max() if relative_error.numel() else
        relative_error.new_zeros(()),
    ]).tolist()  # fmt: skip
    if any_non_finite:
        return math.inf
    if not any_checked:
        return math.nan
    return largest


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class _TargetSpec:
    kind: str  # "output", "mean", "index", "per_row", "each", "callable"
    index: int | None = None
    rows: Tensor | None = None  # (B,) int64 on the inputs' device for "per_row"
    rows_max: int = 0  # the largest index in rows, checked against the forward's A on the host
    fn: Callable[[Tensor], Tensor] | None = None

    @property
    def label(self) -> str:
        if self.kind == "index":
            return f"index:{self.index}"
        if self.kind == "callable":
            return f"callable:{getattr(self.fn, '__name__', type(self.fn).__name__)}"
        return self.kind

    def key(self) -> tuple[Any, ...]:
        if self.kind == "per_row":
            assert self.rows is not None  # internal invariant
            return ("per_row", tuple(self.rows.shape))
        if self.kind == "callable":
            return ("callable", id(self.fn))
        return (self.kind, self.index)


def _target_spec(target: Target, batch: int, device: torch.device) -> _TargetSpec:
    if target is None:
        return _TargetSpec("output")
    if isinstance(target, str):
        if target == "mean":
            return _TargetSpec("mean")
        if target == "each":
            return _TargetSpec("each")
        raise ValueError(
            f"target must be None, 'mean', 'each', an int, a LongTensor of shape (B,) or a callable, got {target!r}; "
            "use 'mean' for V(s) of a dueling network or an int for one action"
        )
    if isinstance(target, bool):
        raise TypeError(f"target must be an int action index, not a bool ({target!r})")
    if isinstance(target, int):
        if target < 0:
            raise ValueError(f"target must be a non-negative action index, got {target}")
        return _TargetSpec("index", index=int(target))
    if isinstance(target, Tensor):
        if target.dtype.is_floating_point or target.dtype == torch.bool or target.dtype.is_complex:
            raise TypeError(f"a target tensor must hold integer action indices, got dtype {target.dtype}")
        if target.dim() == 0:
            return _target_spec(int(target), batch, device)
        if tuple(target.shape) != (batch,):
            raise ValueError(
                f"a target tensor must have shape (B,) = ({batch},), one action per state, got {tuple(target.shape)}"
            )
        rows = target.detach().to(device=device, dtype=torch.int64)
        if rows.is_inference():
            rows = rows.clone()
        low, high = (int(v) for v in torch.stack([rows.min(), rows.max()]).tolist())  # one host sync
        if low < 0:
            raise ValueError(f"target indices must be >= 0, got {low}")
        return _TargetSpec("per_row", rows=rows, rows_max=high)
    if callable(target):
        return _TargetSpec("callable", fn=target)
    raise TypeError(f"target must be None, 'mean', 'each', an int, a LongTensor or a callable, got {type(target).__name__}")


def _select(outputs: Any, spec: _TargetSpec, n_rows: int, first_row: int, batch: int) -> Tensor:
    """The target values of one chunk as ``(n_rows, T)``; rows ``first_row...`` of the ``(*, B)`` layout."""
    if not isinstance(outputs, Tensor):
        raise TypeError(f"forward must return a torch.Tensor, got {type(outputs).__name__}")
    if not outputs.dtype.is_floating_point:
        raise TypeError(f"forward must return floating-point values, got dtype {outputs.dtype}")
    shape = tuple(outputs.shape)
    if spec.kind == "output":
        if shape == (n_rows,):
            return outputs.unsqueeze(1)
        if shape == (n_rows, 1):
            return outputs
        hint = "; it returns several columns, so pass target='mean', an int, 'each' or a callable" if len(shape) == 2 else ""
        raise ValueError(f"forward must return one value per row, shape ({n_rows},), for {n_rows} rows; got {shape}{hint}")
    if spec.kind == "callable":
        assert spec.fn is not None
        values = spec.fn(outputs)
        if not isinstance(values, Tensor) or tuple(values.shape) not in ((n_rows,), (n_rows, 1)):
            seen = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"the target callable must map the forward's output to shape ({n_rows},), got {seen}")
        return values.reshape(n_rows, 1)
    if len(shape) != 2 or shape[0] != n_rows:
        raise ValueError(
            f"with target={spec.label!r} forward must return (N, A) values, one row per input row ({n_rows} rows); got {shape}"
        )
    actions = shape[1]
    if spec.kind == "mean":
        return outputs.mean(dim=1, keepdim=True)
    if spec.kind == "each":
        return outputs
    if spec.kind == "index":
        assert spec.index is not None
        if spec.index >= actions:
            raise ValueError(f"target={spec.index} is out of range for a forward with {actions} outputs; use 0..{actions - 1}")
        return outputs[:, spec.index : spec.index + 1]
    # per_row: row r of the (*, B) layout belongs to state r % B.
    assert spec.rows is not None
    if spec.rows_max >= actions:
        raise ValueError(f"target holds index {spec.rows_max}, out of range for a forward with {actions} outputs; use 0..{actions - 1}")
    states = torch.arange(first_row, first_row + n_rows, device=outputs.device) % batch
    return outputs.gather(1, spec.rows[states].unsqueeze(1))


def target_forward(model: Callable[[Tensor], Tensor], target: Target = "mean") -> Callable[[Tensor], Tensor]:
    """Turn a multi-output model into a forward that returns one value per row.

    Args:
        model: maps ``(N, *feature_shape)`` to ``(N, A)``, e.g. Q-values.
        target: ``"mean"`` (default; the mean over the ``A`` outputs, which is
            ``V(s)`` for a dueling network whose advantages are mean-centred),
            an int (one output column), or a callable mapping ``(N, A)`` to ``(N,)``.
            Per-state indices and ``"each"`` need the engine: pass them as
            ``integrated_gradients(model, x, target=...)`` instead.

    Returns:
        A callable ``(N, *feature_shape) -> (N,)``.

    Raises:
        ValueError: ``target`` is ``"each"``, a tensor, or an unknown name.
        TypeError: ``target`` has an unsupported type.

    Example::

        value = target_forward(q_network, "mean")
        result = integrated_gradients(value, states)
    """
    if target is None:
        return model
    if isinstance(target, Tensor) or target == "each":
        raise ValueError(
            f"target_forward cannot express target={'a tensor' if isinstance(target, Tensor) else repr(target)}; "
            "pass it to integrated_gradients(model, inputs, target=...) instead"
        )
    spec = _target_spec(target, 1, torch.device("cpu"))

    def forward(inputs: Tensor) -> Tensor:
        return _select(model(inputs), spec, inputs.shape[0], 0, inputs.shape[0]).squeeze(1)

    forward.__name__ = f"{getattr(model, '__name__', type(model).__name__)}[{spec.label}]"
    forward.__wrapped__ = model  # type: ignore[attr-defined]  # the engine's error messages look through it
    return forward


# --------------------------------------------------------------------------- kernels and their torch twins


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _launch(op: str, dtype: torch.dtype, device: torch.device, total: int, args: list[Any]) -> None:
    kernel = _cuda.get_kernel(_KERNEL_FILE, f"ig_{op}_{_KERNEL_SUFFIX[dtype]}", device)
    blocks = max(1, min((total + _THREADS - 1) // _THREADS, _MAX_BLOCKS))
    _cuda.launch(kernel, blocks, _THREADS, args, device=device)


def _interpolate_torch(x: Tensor, b: Tensor, alphas: Tensor, with_ends: bool) -> Tensor:
    """Twin of kernel (a): ``(n [+ 2], B, F)`` path points from ``x, b (B, F)`` and ``alphas (n,)``."""
    acc = alphas.dtype
    xa, ba = x.to(acc), b.to(acc)
    path = (ba.unsqueeze(0) + alphas.view(-1, 1, 1) * (xa - ba).unsqueeze(0)).to(x.dtype)  # (n, B, F)
    if with_ends:
        path = torch.cat([path, x.unsqueeze(0), b.unsqueeze(0)])  # (n + 2, B, F)
    return path


def _interpolate_cuda(x: Tensor, b: Tensor, alphas: Tensor, with_ends: bool) -> Tensor:
    n_steps = alphas.shape[0]
    batch, features = x.shape
    points = torch.empty((n_steps + (2 if with_ends else 0), batch, features), dtype=x.dtype, device=x.device)
    _launch(
        "interpolate", x.dtype, x.device, points.numel(),
        [_cuda.pointer(x), _cuda.pointer(b), _cuda.pointer(alphas), _cuda.pointer(points),
         _cuda.int64(n_steps), _cuda.int64(batch * features), _cuda.int32(int(with_ends))],
    )  # fmt: skip
    return points


def _fd_probes_torch(points: Tensor, h: Tensor, point_offset: int) -> Tensor:
    """Twin of kernel (b): ``(P, 2, F, F)`` probes ``p +/- h e_i`` of ``points (P, F)``."""
    n_points, features = points.shape
    acc = h.dtype
    states = torch.arange(point_offset, point_offset + n_points, device=points.device) % h.shape[0]
    step = h[states]  # (P, F)
    values = points.to(acc)
    probes = points.view(n_points, 1, 1, features).expand(n_points, 2, features, features).clone()
    diagonal = torch.arange(features, device=points.device)
    probes[:, 0, diagonal, diagonal] = (values + step).to(points.dtype)
    probes[:, 1, diagonal, diagonal] = (values - step).to(points.dtype)
    return probes


def _fd_probes_cuda(points: Tensor, h: Tensor, point_offset: int, out: Tensor | None = None) -> Tensor:
    n_points, features = points.shape
    numel = n_points * 2 * features * features
    probes = out if out is not None else torch.empty((n_points, 2, features, features), dtype=points.dtype, device=points.device)
    _launch(
        "fd_probes", points.dtype, points.device, numel,
        [_cuda.pointer(points), _cuda.pointer(h), _cuda.pointer(probes), _cuda.int64(n_points),
         _cuda.int32(features), _cuda.int32(h.shape[0]), _cuda.int64(point_offset)],
    )  # fmt: skip
    return probes


def _fd_gradient_torch(points: Tensor, h: Tensor, f: Tensor, point_offset: int, out: Tensor) -> None:
    """Twin of kernel (c): writes ``out (T, P, F)`` from the probe values ``f (P, 2, F, T)``."""
    n_points, features = points.shape
    states = torch.arange(point_offset, point_offset + n_points, device=points.device) % h.shape[0]
    step = h[states]  # (P, F)
    values = points.to(h.dtype)
    plus = (values + step).to(points.dtype).to(h.dtype)
    minus = (values - step).to(points.dtype).to(h.dtype)
    denominator = plus - minus  # (P, F)
    difference = (f[:, 0] - f[:, 1]).permute(2, 0, 1)  # (T, P, F)
    gradient = difference / denominator
    out.copy_(torch.where(denominator != 0, gradient, torch.zeros_like(gradient)))


def _fd_gradient_cuda(points: Tensor, h: Tensor, f: Tensor, point_offset: int, out: Tensor) -> None:
    n_points, features = points.shape
    n_targets = f.shape[-1]
    _launch(
        "fd_gradient", points.dtype, points.device, n_targets * n_points * features,
        [_cuda.pointer(points), _cuda.pointer(h), _cuda.pointer(f), _cuda.pointer(out), _cuda.int64(n_points),
         _cuda.int32(features), _cuda.int32(h.shape[0]), _cuda.int32(n_targets), _cuda.int64(point_offset),
         _cuda.int64(out.stride(0))],
    )  # fmt: skip


def _accumulate_torch(x: Tensor, b: Tensor, weights: Tensor, grads: Tensor) -> Tensor:
    """Twin of kernel (d): ``(T, B, F)`` attributions from ``grads (T, n, B, F)``, summed in step order."""
    total = torch.zeros_like(grads[:, 0])  # (T, B, F)
    for k in range(grads.shape[1]):
        # Multiply, then add: two roundings, like the kernel's __fmul_rn/__fadd_rn (never an FMA).
        total = total + weights[k] * grads[:, k]
    acc = grads.dtype
    return ((x.to(acc) - b.to(acc)).unsqueeze(0) * total).to(x.dtype)


def _accumulate_cuda(x: Tensor, b: Tensor, weights: Tensor, grads: Tensor) -> Tensor:
    n_targets, n_steps, batch, features = grads.shape
    attributions = torch.empty((n_targets, batch, features), dtype=x.dtype, device=x.device)
    _launch(
        "accumulate", x.dtype, x.device, attributions.numel(),
        [_cuda.pointer(x), _cuda.pointer(b), _cuda.pointer(weights), _cuda.pointer(grads), _cuda.pointer(attributions),
         _cuda.int32(n_steps), _cuda.int64(batch * features), _cuda.int32(n_targets)],
    )  # fmt: skip
    return attributions


def _degenerate_threshold(dtype: torch.dtype) -> float:
    return math.sqrt(float(torch.finfo(dtype).eps))


_STATS = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite")  # the rows of stats


def _warp_order_sum(values: Tensor) -> Tensor:
    """``values (T, B, F)`` summed over ``F`` in kernel (e)'s order: 32 lane-strided partial sums, then a tree.

    Lane ``l`` adds ``values[..., l], values[..., l + 32], ...`` to ``+0`` in turn;
    the 32 partials are then added pairwise at offsets 16, 8, 4, 2, 1, as the
    warp's shuffles do. Every addition is one exactly rounded elementwise add, so
    the sum is bit-identical to the kernel's and does not depend on torch's
    reduction order or thread count.
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


def _completeness_torch(attributions: Tensor, ends: Tensor) -> Tensor:
    """Twin of kernel (e): ``stats (6, T, B)``, the rows named in ``_STATS``.

    ``attributions`` is ``(T, B, F)``, ``ends`` the target values ``(2, B, T)`` at x and b.
    A state is *non-finite* when ``F(x)``, ``F(b)`` or ``delta`` is NaN/Inf (any
    NaN/Inf attribution makes the sum, and so ``delta``, non-finite): relative
    error ``inf``. Otherwise *degenerate* (relative error NaN) or checked.
    """
    acc = ends.dtype
    f_input = ends[0].t()  # (T, B)
    f_baseline = ends[1].t()  # (T, B)
    difference = f_input - f_baseline
    delta = _warp_order_sum(attributions.to(acc)) - difference
    scale = torch.maximum(torch.maximum(f_input.abs(), f_baseline.abs()), torch.ones_like(f_input))
    non_finite = ~(torch.isfinite(f_input) & torch.isfinite(f_baseline) & torch.isfinite(delta))
    degenerate = ~non_finite & (difference.abs() <= _degenerate_threshold(acc) * scale)
    relative = torch.where(degenerate, torch.full_like(delta, float("nan")), delta.abs() / difference.abs())
    relative = torch.where(non_finite, torch.full_like(delta, float("inf")), relative)
    return torch.stack([f_input, f_baseline, delta, relative, degenerate.to(acc), non_finite.to(acc)])


def _completeness_cuda(attributions: Tensor, ends: Tensor) -> Tensor:
    n_targets, batch, features = attributions.shape
    stats = torch.empty((len(_STATS), n_targets, batch), dtype=ends.dtype, device=ends.device)
    _launch(
        "completeness", attributions.dtype, attributions.device, n_targets * batch * 32,
        [_cuda.pointer(attributions), _cuda.pointer(ends), _cuda.pointer(stats), _cuda.int32(batch),
         _cuda.int64(features), _cuda.int32(n_targets), np.float64(_degenerate_threshold(ends.dtype))],
    )  # fmt: skip
    return stats


_RULE_CACHE: dict[tuple[str, int, torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}


def _rule_tensors(method: str, n_steps: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(alphas, weights)`` as tensors on ``device``, cached: a host-to-device copy per call is a sync we skip."""
    key = (method, n_steps, dtype, device)
    cached = _RULE_CACHE.get(key)
    if cached is None:
        alphas, weights = quadrature(method, n_steps)
        cached = (torch.tensor(alphas, dtype=dtype, device=device), torch.tensor(weights, dtype=dtype, device=device))
        if len(_RULE_CACHE) < 256:
            _RULE_CACHE[key] = cached
    return cached


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class _Settings:
    target: Target
    n_steps: int | str
    method: str
    gradient: str
    internal_batch_size: int | None
    backend: str
    completeness_tol: float
    max_steps: int
    fd_step: float | None
    check_finite: bool
    cuda_graph: bool | str


_DEFAULTS: dict[str, Any] = {
    "target": None,
    "n_steps": 50,
    "method": "gausslegendre",
    "gradient": "autograd",
    "internal_batch_size": None,
    "backend": "auto",
    "completeness_tol": 0.01,
    "max_steps": _DEFAULT_MAX_STEPS,
    "fd_step": None,
    "check_finite": True,
    "cuda_graph": "auto",
}


def _settings(options: dict[str, Any]) -> _Settings:
    unknown = sorted(set(options) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; the engine takes {', '.join(_DEFAULTS)}")
    merged = {**_DEFAULTS, **options}
    n_steps = merged["n_steps"]
    if isinstance(n_steps, str):
        if n_steps != "auto":
            raise ValueError(f"n_steps must be an int >= 1 or 'auto', got {n_steps!r}")
    elif isinstance(n_steps, bool) or not isinstance(n_steps, int):
        raise TypeError(f"n_steps must be an int >= 1 or 'auto', got {type(n_steps).__name__} ({n_steps!r})")
    elif n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}; 50 is a good default")
    method = merged["method"]
    check_rule(method, n_steps if isinstance(n_steps, int) else 2)  # unknown names, too few or too many steps
    if merged["gradient"] not in ("autograd", "finite_difference"):
        raise ValueError(f"gradient must be 'autograd' or 'finite_difference', got {merged['gradient']!r}")
    ibs = merged["internal_batch_size"]
    if ibs is not None and (isinstance(ibs, bool) or not isinstance(ibs, int) or ibs < 1):
        raise ValueError(f"internal_batch_size must be None (automatic) or an int >= 1, got {ibs!r}")
    if merged["backend"] not in ("auto", "cuda", "torch"):
        raise ValueError(f"backend must be 'auto', 'cuda' or 'torch', got {merged['backend']!r}")
    tol = merged["completeness_tol"]
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise ValueError(f"completeness_tol must be a positive number, got {tol!r}")
    max_steps = merged["max_steps"]
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    if n_steps == "auto" and method == "gausslegendre" and max_steps > MAX_GAUSS_LEGENDRE_STEPS:
        raise ValueError(
            f"max_steps={max_steps} is more than the {MAX_GAUSS_LEGENDRE_STEPS} points a Gauss-Legendre rule is "
            f"built with; pass max_steps <= {MAX_GAUSS_LEGENDRE_STEPS}"
        )
    fd_step = merged["fd_step"]
    if fd_step is not None and (isinstance(fd_step, bool) or not isinstance(fd_step, (int, float)) or not 0 < fd_step < 1):
        raise ValueError(f"fd_step must be None (automatic) or a relative step in (0, 1), got {fd_step!r}")
    if merged["cuda_graph"] not in (True, False, "auto"):
        raise ValueError(f"cuda_graph must be True, False or 'auto', got {merged['cuda_graph']!r}")
    return _Settings(**merged)


# --------------------------------------------------------------------------- input checks


def _check_forward(forward: Any) -> None:
    if not callable(forward):
        raise TypeError(f"forward must be callable (a model or a function of the inputs), got {type(forward).__name__}")


def _check_inputs(inputs: Any) -> None:
    if not isinstance(inputs, Tensor):
        raise TypeError(f"inputs must be a torch.Tensor of shape (B, *feature_shape), got {type(inputs).__name__}")
    if inputs.dtype not in _FLOATING:
        raise TypeError(
            f"inputs must be floating point (float16, bfloat16, float32 or float64), got {inputs.dtype}; "
            "convert them with inputs.float()"
        )
    if inputs.dim() < 1 or inputs.shape[0] == 0 or math.prod(inputs.shape[1:]) == 0:
        raise ValueError(
            f"inputs must have shape (num_states >= 1, *feature_shape) with at least one feature, got "
            f"{tuple(inputs.shape)}; add the state dimension (inputs.unsqueeze(0)) for a single state"
        )


_DTYPE_METHOD = {torch.float16: "half()", torch.bfloat16: "bfloat16()", torch.float32: "float()", torch.float64: "double()"}


def _module_of(forward: Any) -> torch.nn.Module | None:
    """The ``nn.Module`` behind ``forward``: itself, a bound method's owner, or what a wrapper names in ``__wrapped__``."""
    for candidate in (forward, getattr(forward, "__self__", None), getattr(forward, "__wrapped__", None)):
        if isinstance(candidate, torch.nn.Module):
            return candidate
    return None


def _raise_if_dtype_mismatch(forward: Any, dtype: torch.dtype, error: BaseException) -> None:
    """Turn torch's error for inputs of another dtype than the model's parameters into one that says what to do."""
    module = _module_of(forward)
    if module is None:
        return
    parameter = next((p for p in module.parameters() if p.is_floating_point()), None)
    if parameter is None or parameter.dtype == dtype:
        return
    fix = " or ".join(
        f"{what}.{_DTYPE_METHOD[target]}" for what, target in (("inputs", parameter.dtype), ("model", dtype)) if target in _DTYPE_METHOD
    )
    raise TypeError(
        f"inputs are {dtype} but the model's parameters are {parameter.dtype}; convert one to match the other: {fix}"
    ) from error


def _warn_stochastic(forward: Any, stacklevel: int) -> None:
    """Warn that the forward is stochastic, naming the modules that likely make it so."""
    module = _module_of(forward)
    suspects: list[str] = []
    if module is not None:
        for name, child in module.named_modules():
            if not child.training:
                continue
            if isinstance(child, (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)):
                suspects.append(f"{name or type(child).__name__} ({type(child).__name__} in train mode)")
            elif hasattr(child, "reset_noise"):
                suspects.append(f"{name or type(child).__name__} ({type(child).__name__}: noise on)")
    cause = (
        f"likely cause: {', '.join(suspects[:5])}{' ...' if len(suspects) > 5 else ''}"
        if suspects
        else "likely cause: dropout or batch-norm in train mode, or NoisyNet noise left on"
    )
    warnings.warn(
        f"the forward gave different values for the same inputs within one call ({cause}); its attributions are "
        "not reproducible and completeness does not hold: call model.eval() and switch noise off "
        "(lightning_ig.noise_disabled(model)) before attributing",
        StochasticForwardWarning,
        stacklevel=stacklevel,
    )


def _resolve_baselines(baselines: Baselines, inputs: Tensor) -> Tensor:
    """The baselines as a ``(B, *feature_shape)`` tensor of the inputs' dtype and device."""
    if baselines is None or (isinstance(baselines, str) and baselines == "zeros"):
        return torch.zeros_like(inputs)
    if isinstance(baselines, str):
        if baselines == "mean":
            return inputs.to(_accumulate_dtype(inputs.dtype)).mean(dim=0, keepdim=True).to(inputs.dtype).expand_as(inputs).clone()
        raise ValueError(f"baselines must be None, 'zeros', 'mean', a number or a tensor, got {baselines!r}")
    if isinstance(baselines, bool):
        raise TypeError(f"baselines must be None, 'zeros', 'mean', a number or a tensor, got a bool ({baselines!r})")
    if isinstance(baselines, (int, float)):
        if not math.isfinite(baselines):
            raise ValueError(f"baselines must be finite, got {baselines!r}")
        return torch.full_like(inputs, float(baselines))
    if not isinstance(baselines, Tensor):
        raise TypeError(f"baselines must be None, 'zeros', 'mean', a number or a tensor, got {type(baselines).__name__}")
    if not baselines.dtype.is_floating_point:
        raise TypeError(f"baselines must be floating point, got dtype {baselines.dtype}; convert them with .float()")
    feature_shape = tuple(inputs.shape[1:])
    shape = tuple(baselines.shape)
    if shape not in ((), feature_shape, tuple(inputs.shape)):
        raise ValueError(
            f"baselines of shape {shape} do not match inputs of shape {tuple(inputs.shape)}; "
            f"pass a scalar, one baseline of shape {feature_shape} or one per state of shape {tuple(inputs.shape)}"
        )
    return baselines.detach().to(device=inputs.device, dtype=inputs.dtype).expand_as(inputs).clone()


def _default_fd_step(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) ** (1.0 / 3.0)


def _default_chunk_rows(device: torch.device, row_bytes: int, rows_needed: int) -> int:
    """Rows per forward from the free memory: a quarter of it, guessing 32 row copies plus 16 KiB of activations a row.

    Work that needs at most 256 MiB by that guess runs in one chunk without asking the device.
    """
    per_row = 32 * row_bytes + 16 * 1024
    if rows_needed * per_row <= _SMALL_WORK_BYTES:
        return max(1, rows_needed)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        budget = (free + max(cached, 0)) // 4
    else:
        budget = 1 << 30  # 1 GiB on the host: the torch path is the reference, not the fast path
    return max(1, int(budget // per_row))


_SMALL_WORK_BYTES = 256 << 20


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError) and "out of memory" in str(error))


# --------------------------------------------------------------------------- the computation


class _Run:
    """One attribution problem with its inputs flattened to ``(B, F)``; the same code runs eagerly and under capture."""

    def __init__(
        self,
        forward: Callable[[Tensor], Tensor],
        x: Tensor,
        b: Tensor,
        feature_shape: tuple[int, ...],
        spec: _TargetSpec,
        settings: _Settings,
        backend: str,
        chunk_rows: int,
    ) -> None:
        self.forward = forward
        self.x = x  # (B, F)
        self.b = b  # (B, F)
        self.feature_shape = feature_shape
        self.spec = spec
        self.settings = settings
        self.backend = backend
        self.chunk_rows = chunk_rows
        self.acc = _accumulate_dtype(x.dtype)
        self.batch, self.features = x.shape
        self.fd_step = (settings.fd_step or _default_fd_step(x.dtype)) if settings.gradient == "finite_difference" else None
        self.allow_oom_retry = True
        self.output_width = 0
        # Evaluate the path's two ends a second time and compare (eager calls and the eager run before a
        # capture; never inside a capture). The answer stays on the device until the caller reads it.
        self.check_stochastic = True
        self.stochastic: Tensor | None = None  # 0-dim bool once checked

    # -- kernels or twins
    def interpolate(self, alphas: Tensor, with_ends: bool) -> Tensor:
        fn = _interpolate_cuda if self.backend == "cuda" else _interpolate_torch
        return fn(self.x, self.b, alphas, with_ends)

    def accumulate(self, weights: Tensor, grads: Tensor) -> Tensor:
        fn = _accumulate_cuda if self.backend == "cuda" else _accumulate_torch
        return fn(self.x, self.b, weights, grads)

    # -- the forward on a chunk of rows
    def _evaluate(self, rows: Tensor, first_row: int, spec: _TargetSpec | None = None) -> Tensor:
        n_rows = rows.shape[0]
        try:
            outputs = self.forward(rows.view(n_rows, *self.feature_shape))
        except RuntimeError as error:
            _raise_if_dtype_mismatch(self.forward, rows.dtype, error)
            raise
        selected = _select(outputs, spec or self.spec, n_rows, first_row, self.batch)
        self.output_width = outputs.shape[1] if outputs.dim() == 2 else 1  # A, for per-row checks on replay
        return selected

    def _chunked(self, total: int, unit: int, body: Callable[[int, int], None]) -> None:
        """Run ``body(start, stop)`` over ``[0, total)`` in chunks of whole ``unit``s; halve on CUDA OOM."""
        size = max(1, self.chunk_rows // unit)
        start = 0
        while start < total:
            stop = min(total, start + size)
            try:
                body(start, stop)
            except Exception as error:  # noqa: BLE001 - only out-of-memory is retried
                if not (self.allow_oom_retry and _is_oom(error)) or size == 1:
                    raise
                size = max(1, size // 2)
                warnings.warn(
                    f"CUDA ran out of memory with {(stop - start) * unit} rows per forward; retrying with "
                    f"internal_batch_size={size * unit} (pass a smaller internal_batch_size to skip this)",
                    RuntimeWarning,
                    stacklevel=4,
                )
                if self.x.device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            start = stop
        self.chunk_rows = size * unit

    # -- gradients along the path
    def gradients(self, alphas: Tensor, with_ends: bool) -> tuple[Tensor, Tensor | None]:
        """``grads (T, m, B, F)`` at ``alphas (m,)`` and, with ends, the target values ``(2, B, T)`` at x and b."""
        points = self.interpolate(alphas, with_ends).view(-1, self.features)  # ((m [+ 2]) * B, F)
        if self.settings.gradient == "autograd":
            grads, ends = self._autograd(points, alphas.shape[0], with_ends)
            end_spec = self.spec
        else:
            grads, ends = self._finite_difference(points, alphas.shape[0], with_ends)
            end_spec = self._probe_spec()
        if ends is not None and self.check_stochastic:
            end_rows = points[alphas.shape[0] * self.batch :]  # (2 B, F): x then b, as evaluated the first time
            self.stochastic = self._differs_when_repeated(end_rows, ends.view(2 * self.batch, -1), end_spec)
        return grads, ends

    def stochastic_flag(self) -> Tensor:
        """The 0-dim bool of the repeated-ends check (False where it did not run)."""
        if self.stochastic is None:
            return torch.zeros((), dtype=torch.bool, device=self.x.device)
        return self.stochastic

    def _probe_spec(self) -> _TargetSpec:
        # Per-row targets pick a column by state, but probe rows do not follow the (*, B) layout:
        # finite differences evaluate every column ("each") and keep each state's own afterwards (_per_row_fd).
        return _TargetSpec("each") if self.spec.kind == "per_row" else self.spec

    def _differs_when_repeated(self, end_rows: Tensor, first: Tensor, spec: _TargetSpec) -> Tensor:
        """Evaluate the ends ``(2 B, F)`` again and compare with ``first (2 B, T)``: a 0-dim bool on the device.

        A deterministic forward repeats its values up to rounding: a batch of
        another size may take another GEMM blocking or summation order. The bound
        is ``sqrt(eps) * max(1, |F|)`` per value, with ``eps`` that of the inputs'
        dtype but no finer than float32's (forwards compute in float32 or coarser
        more often than not: TF32, autocast, a cast inside the model): the same
        bound below which ``F(x) - F(b)`` counts as noise (degenerate states).
        Dropout, batch-norm statistics of another batch and exploration noise
        move values by far more. Equal values, and NaN where both are NaN, agree.
        """
        with torch.no_grad():
            again = self._evaluate(end_rows, 0, spec)  # row 0 is state 0, as row m * B was the first time
        again = again.detach().to(first.dtype)
        eps = max(float(torch.finfo(end_rows.dtype).eps), float(torch.finfo(torch.float32).eps))
        scale = torch.maximum(torch.maximum(first.abs(), again.abs()), torch.ones_like(first))
        agree = (again == first) | (again.isnan() & first.isnan()) | ((again - first).abs() <= math.sqrt(eps) * scale)
        return ~agree.all()

    def _autograd(self, points: Tensor, n_alphas: int, with_ends: bool) -> tuple[Tensor, Tensor | None]:
        path_rows = n_alphas * self.batch
        total_rows = points.shape[0]
        state: dict[str, Any] = {"grads": None, "ends": None, "single": None}

        def body(start: int, stop: int) -> None:
            rows = points[start:stop].detach().requires_grad_(stop <= path_rows or start < path_rows)
            if not rows.requires_grad:  # only end points here: values, no gradient
                with torch.no_grad():
                    values = self._evaluate(rows, start)
            else:
                values = self._evaluate(rows, start)
                if not values.requires_grad:
                    raise ValueError(
                        "gradient='autograd' needs a forward that autograd can differentiate, but its output has no "
                        "grad_fn (it was computed outside autograd: numpy, .detach(), torch.no_grad inside the forward, ...); "
                        "pass gradient='finite_difference' for such forwards"
                    )
            n_targets = values.shape[1]
            if with_ends and stop > path_rows:
                if state["ends"] is None:
                    state["ends"] = torch.empty((2 * self.batch, n_targets), dtype=self.acc, device=points.device)
                lo = max(start, path_rows)
                state["ends"][lo - path_rows : stop - path_rows] = values[lo - start :].detach()
            if not rows.requires_grad:
                return
            path_stop = min(stop, path_rows)
            for t in range(n_targets):
                (grad,) = torch.autograd.grad(
                    values[:, t].sum(), rows, retain_graph=t + 1 < n_targets, allow_unused=True
                )
                if grad is None:
                    raise ValueError(
                        "gradient='autograd' could not differentiate the forward's output w.r.t. its input (the input "
                        "does not reach the output through autograd); pass gradient='finite_difference' for such forwards"
                    )
                grad = grad[: path_stop - start]  # (rows on the path, F)
                if start == 0 and path_stop == path_rows and n_targets == 1 and grad.dtype == self.acc:
                    state["single"] = grad  # the whole path in one chunk: no copy
                    continue
                if state["grads"] is None:
                    state["grads"] = torch.empty((n_targets, path_rows, self.features), dtype=self.acc, device=points.device)
                state["grads"][t, start:path_stop] = grad

        self._chunked(total_rows, 1, body)
        grads = state["single"].unsqueeze(0) if state["single"] is not None else state["grads"]
        grads = grads.view(-1, n_alphas, self.batch, self.features)  # (T, m, B, F)
        ends = state["ends"].view(2, self.batch, -1) if with_ends else None  # (2, B, T)
        return grads, ends

    def _finite_difference(self, points: Tensor, n_alphas: int, with_ends: bool) -> tuple[Tensor, Tensor | None]:
        assert self.fd_step is not None
        path_points = n_alphas * self.batch
        features = self.features
        probe_rows = 2 * features  # forward rows per path point
        xa, ba = self.x.to(self.acc), self.b.to(self.acc)
        h = self.fd_step * torch.maximum(torch.maximum(xa.abs(), ba.abs()), torch.ones_like(xa))  # (B, F)
        ends_rows = 2 * self.batch if with_ends else 0
        state: dict[str, Any] = {"grads": None, "ends": None}
        use_cuda = self.backend == "cuda"
        probe_spec = self._probe_spec()

        def body(start: int, stop: int) -> None:
            count = stop - start
            last = stop == path_points
            extra = ends_rows if last else 0
            buffer = torch.empty((count * probe_rows + extra, features), dtype=self.x.dtype, device=self.x.device)
            chunk_points = points[start:stop]
            if use_cuda:
                _fd_probes_cuda(chunk_points, h, start, out=buffer)
            else:
                buffer[: count * probe_rows] = _fd_probes_torch(chunk_points, h, start).view(-1, features)
            if extra:
                buffer[count * probe_rows :] = points[path_points:]  # x then b, evaluated in the same forward
            with torch.no_grad():
                values = self._evaluate(buffer, 0, probe_spec).to(self.acc)
            n_targets = values.shape[1]
            if state["grads"] is None:
                state["grads"] = torch.empty((n_targets, path_points, features), dtype=self.acc, device=self.x.device)
            f = values[: count * probe_rows].view(count, 2, features, n_targets)  # (P, 2, F, T)
            out = state["grads"][:, start:stop]
            (_fd_gradient_cuda if use_cuda else _fd_gradient_torch)(chunk_points, h, f.contiguous(), start, out)
            if extra:
                state["ends"] = values[count * probe_rows :].contiguous()

        self._chunked(path_points, probe_rows, body)
        grads = state["grads"].view(-1, n_alphas, self.batch, features)  # (T, m, B, F)
        ends = state["ends"].view(2, self.batch, -1) if with_ends else None  # (2, B, T)
        return grads, ends

    # -- the whole attribution
    def attribute(self, n_steps: int) -> dict[str, Tensor]:
        alphas, weights = _rule_tensors(self.settings.method, n_steps, self.acc, self.x.device)
        grads, ends = self._per_row_fd(*self.gradients(alphas, with_ends=True))
        assert ends is not None
        return self.finish(weights, grads, ends)

    def _per_row_fd(self, grads: Tensor, ends: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """With per-row targets under finite differences, keep each state's own column of the ``"each"`` values."""
        if self.spec.kind != "per_row" or self.settings.gradient != "finite_difference":
            return grads, ends
        assert self.spec.rows is not None
        rows = self.spec.rows  # (B,)
        states = torch.arange(self.batch, device=rows.device)
        grads = grads[rows, :, states]  # (A, m, B, F) -> (B, m, F)
        grads = grads.transpose(0, 1).unsqueeze(0).contiguous()  # (1, m, B, F)
        if ends is not None:
            ends = ends[:, states, rows].unsqueeze(-1)  # (2, B, A) -> (2, B, 1)
        return grads, ends

    def finish(self, weights: Tensor, grads: Tensor, ends: Tensor) -> dict[str, Tensor]:
        """Attributions ``(T, B, F)`` and the completeness ``stats (6, T, B)`` (see ``_completeness_torch``)."""
        attributions = self.accumulate(weights, grads.contiguous())  # (T, B, F)
        completeness = _completeness_cuda if self.backend == "cuda" else _completeness_torch
        return {"attributions": attributions, "stats": completeness(attributions, ends.contiguous())}


# --------------------------------------------------------------------------- front doors


def _prepare(
    forward: Callable[[Tensor], Tensor], inputs: Tensor, baselines: Baselines, settings: _Settings
) -> tuple[Tensor, Tensor, Tensor, _TargetSpec, str]:
    """Checks and normalisations shared by every call: ``(x (B, F), b (B, F), b as given shape, spec, backend)``."""
    _check_forward(forward)
    _check_inputs(inputs)
    if inputs.is_inference():
        inputs = inputs.clone()  # inference tensors cannot be saved for autograd
    inputs = inputs.detach()
    resolved = _resolve_baselines(baselines, inputs)
    backend = _resolve_backend(settings.backend, inputs)
    spec = _target_spec(settings.target, inputs.shape[0], inputs.device)
    batch = inputs.shape[0]
    x = inputs.reshape(batch, -1).contiguous()  # (B, F)
    b = resolved.reshape(batch, -1).contiguous()  # (B, F)
    return x, b, resolved, spec, backend


def _resolve_backend(backend: str, inputs: Tensor) -> str:
    if backend == "cuda" and inputs.dtype not in _KERNEL_SUFFIX:
        raise TypeError(f"backend='cuda' has kernels for {', '.join(map(str, _KERNEL_SUFFIX))}; got {inputs.dtype}")
    return _cuda.resolve_backend(backend, inputs)


def _chunk_rows(settings: _Settings, x: Tensor) -> int:
    if settings.internal_batch_size is not None:
        return settings.internal_batch_size
    batch, features = x.shape
    steps = settings.max_steps if settings.n_steps == "auto" else int(settings.n_steps)
    per_point = 2 * features if settings.gradient == "finite_difference" else 1
    rows_needed = steps * batch * per_point + 2 * batch  # the path (or its probes) and the two ends
    return _default_chunk_rows(x.device, features * x.element_size(), rows_needed)


def _result(
    out: dict[str, Tensor],
    resolved: Tensor,
    spec: _TargetSpec,
    settings: _Settings,
    backend: str,
    n_steps: int,
    run: _Run,
    graph: bool,
    stochastic: bool,
) -> IGResult:
    """The :class:`IGResult` of ``out`` (attributions ``(T, B, F)``, stats ``(6, T, B)``), with views only."""
    stats = out["stats"]
    if spec.kind == "each":
        attributions = out["attributions"].view(-1, *resolved.shape)  # (A, B, F) -> (A, B, *feature_shape)
    else:
        attributions = out["attributions"].view(resolved.shape)  # (1, B, F) -> (B, *feature_shape)
        stats = stats.view(len(_STATS), -1)  # (6, 1, B) -> (6, B)
    f_input, f_baseline, delta, relative_error, degenerate, non_finite = stats.unbind(0)
    return IGResult(
        attributions=attributions,
        f_input=f_input,
        f_baseline=f_baseline,
        delta=delta,
        relative_error=relative_error,
        degenerate=degenerate != 0,
        non_finite=non_finite != 0,
        baselines=resolved,
        n_steps=n_steps,
        method=settings.method,
        gradient=settings.gradient,
        backend=backend,
        target=spec.label,
        fd_step=run.fd_step,
        internal_batch_size=run.chunk_rows,
        cuda_graph=graph,
        stochastic=stochastic,
    )


def _attribute_eager(
    forward: Callable[[Tensor], Tensor], inputs: Tensor, baselines: Baselines, settings: _Settings
) -> IGResult:
    x, b, resolved, spec, backend = _prepare(forward, inputs, baselines, settings)
    checks = [("inputs", x)] + ([("baselines", b)] if isinstance(baselines, Tensor) else [])
    deferred: list[tuple[str, Tensor, Tensor]] = []
    if settings.check_finite:
        if settings.n_steps == "auto" or x.device.type != "cuda":
            for name, tensor in checks:  # "auto" reads errors on the host as it goes: check first
                check_finite(name, tensor)
        else:
            # Queue the checks now and read them after the work is queued: the host waits for
            # nothing, and nothing the work does depends on them (no state changes, no side effects).
            deferred = [(name, tensor, torch.isfinite(tensor).all()) for name, tensor in checks]
    run = _Run(forward, x, b, tuple(inputs.shape[1:]), spec, settings, backend, _chunk_rows(settings, x))
    if settings.n_steps == "auto":
        out, n_steps = _attribute_auto(run, settings)
    else:
        n_steps = int(settings.n_steps)
        out = run.attribute(n_steps)
    # One host sync reads every flag queued above: the inputs' finite checks and the repeated ends.
    flags = torch.stack([flag for _, _, flag in deferred] + [run.stochastic_flag()]).tolist()
    for (name, tensor, _), flag in zip(deferred, flags):
        check_finite(name, tensor, flag)
    stochastic = bool(flags[-1])
    if stochastic:
        _warn_stochastic(forward, stacklevel=4)
    return _result(out, resolved, spec, settings, backend, n_steps, run, graph=False, stochastic=stochastic)


def _attribute_auto(run: _Run, settings: _Settings) -> tuple[dict[str, Tensor], int]:
    """Refine ``n`` until the worst relative completeness error is <= completeness_tol or ``max_steps`` is reached.

    Rules that nest (riemann_left/right on doubling, riemann_trapezoid on ``2n - 1``)
    reuse every gradient already evaluated; the others evaluate the new rule anew.
    The forward values at the ends are evaluated once.
    """
    method = settings.method
    minimum = 2 if method == "riemann_trapezoid" else 1
    n = max(minimum, min(_AUTO_FIRST_STEPS, settings.max_steps))
    acc, device = run.acc, run.x.device
    alphas_list, weights_list = quadrature(method, n)
    alphas = torch.tensor(alphas_list, dtype=acc, device=device)
    grads, ends = run._per_row_fd(*run.gradients(alphas, with_ends=True))
    assert ends is not None
    while True:
        weights = torch.tensor(weights_list, dtype=acc, device=device)
        out = run.finish(weights, grads, ends)
        if n >= settings.max_steps or _auto_done(out["stats"], settings.completeness_tol):
            return out, n
        nested = n * 2 - 1 if method == "riemann_trapezoid" else n * 2
        refined = min(nested, settings.max_steps)
        new_alphas_list, weights_list = quadrature(method, refined)
        if nests_on_doubling(method) and refined == nested:
            # Old points sit at every other index of the refined rule: even for left and
            # trapezoid, odd for right. Evaluate only the new ones.
            old_index = list(range(0, refined, 2)) if method != "riemann_right" else list(range(1, refined, 2))
            new_index = sorted(set(range(refined)) - set(old_index))
            fresh_alphas = torch.tensor([new_alphas_list[i] for i in new_index], dtype=acc, device=device)
            fresh, _ = run._per_row_fd(*run.gradients(fresh_alphas, with_ends=False))
            merged = torch.empty((grads.shape[0], refined, *grads.shape[2:]), dtype=grads.dtype, device=device)
            merged[:, old_index] = grads
            merged[:, new_index] = fresh
            grads = merged
        else:
            alphas = torch.tensor(new_alphas_list, dtype=acc, device=device)
            grads, _ = run._per_row_fd(*run.gradients(alphas, with_ends=False))
        n = refined


def _auto_done(stats: Tensor, tolerance: float) -> bool:
    """Whether ``n_steps="auto"`` stops here: every state within ``tolerance``, or a state non-finite.

    A checked state is judged by its relative error; a degenerate one (no ratio
    to form) by its absolute error ``|delta| <= tolerance * max(1, |F(x)|, |F(b)|)``,
    so a batch of degenerate states is refined like any other and never stops on
    a NaN. A non-finite state stops the refinement at once: more steps cannot
    repair NaN/Inf weights or outputs, and the result says so.
    """
    f_input, f_baseline, delta, relative, degenerate, non_finite = stats  # each (T, B)
    scale = torch.maximum(torch.maximum(f_input.abs(), f_baseline.abs()), torch.ones_like(f_input))
    within = torch.where(degenerate != 0, delta.abs() <= tolerance * scale, relative <= tolerance)
    any_non_finite, all_within = torch.stack([(non_finite != 0).any(), within.all()]).tolist()  # one host sync
    return bool(any_non_finite or all_within)


def integrated_gradients(
    forward: Callable[[Tensor], Tensor],
    inputs: Tensor,
    baselines: Baselines = None,
    *,
    target: Target = None,
    n_steps: int | Literal["auto"] = 50,
    method: str = "gausslegendre",
    gradient: GradientMode = "autograd",
    internal_batch_size: int | None = None,
    backend: Literal["auto", "cuda", "torch"] = "auto",
    completeness_tol: float = 0.01,
    max_steps: int = _DEFAULT_MAX_STEPS,
    fd_step: float | None = None,
    check_finite: bool = True,
) -> IGResult:
    """Integrated Gradients of ``forward`` at ``inputs`` against ``baselines``.

    The call runs eagerly (no CUDA graph); for repeated calls on the same shapes
    use :class:`IntegratedGradients`, which captures and replays the work.
    Works under ``torch.no_grad()`` and ``torch.inference_mode()``, leaves the
    model as it was (parameters, their ``.grad`` and ``requires_grad``, training
    mode) and draws no random numbers. The forward is called as it is: put the
    model in the mode you want attributed (``eval()``, noise off) first.

    Args:
        forward: maps ``(N, *feature_shape)`` to ``(N,)``, or to ``(N, A)`` with
            ``target`` choosing what to attribute. Rows must be independent.
        inputs: ``(B, *feature_shape)`` floating-point states.
        baselines: ``None`` or ``"zeros"`` (default: zeros), ``"mean"`` (the batch
            mean), a number, one baseline ``(*feature_shape)`` or one per state
            ``(B, *feature_shape)``.
        target: ``None`` (forward returns ``(N,)``), ``"mean"`` (mean over ``A``:
            ``V(s)`` under the dueling identity), an int (one column), a
            LongTensor ``(B,)`` (one column per state), ``"each"`` (every column:
            attributions ``(A, B, *feature_shape)``) or a callable ``(N, A) -> (N,)``.
        n_steps: quadrature points (default 50), or ``"auto"``: start at 16 and
            refine until the worst relative completeness error is at most
            ``completeness_tol`` or ``max_steps`` is reached, reusing gradients
            where the rule nests; the result says how many were used.
        method: ``"gausslegendre"`` (default), ``"riemann_left"``,
            ``"riemann_right"``, ``"riemann_middle"`` or ``"riemann_trapezoid"``.
        gradient: ``"autograd"`` (default) or ``"finite_difference"`` for forwards
            autograd cannot go through (see the module docstring for the step).
        internal_batch_size: rows per forward (path points for autograd, probes
            for finite differences); ``None`` picks it from the free device memory.
            On CUDA out-of-memory the chunk is halved and retried, with a warning.
        backend: ``"auto"`` (the CUDA kernels when the inputs are on a CUDA
            device and CuPy imports, else torch), ``"cuda"`` or ``"torch"``.
        completeness_tol: the target of ``n_steps="auto"`` (default 0.01).
        max_steps: the most points ``n_steps="auto"`` may use (default 512).
        fd_step: relative finite-difference step; ``None`` is ``eps ** (1/3)`` of
            the inputs' dtype.
        check_finite: check inputs and baselines for NaN/Inf first (one host sync).

    Returns:
        An :class:`IGResult`.

    Raises:
        TypeError: a non-callable forward, non-floating inputs or baselines, a
            bad type for an option, or a forward that returns no tensor.
        ValueError: baselines that do not match the inputs, NaN/Inf inputs,
            ``n_steps < 1``, an unknown method, a forward returning the wrong
            shape, ``gradient="autograd"`` on a forward autograd cannot
            differentiate, or ``backend="cuda"`` without a CUDA device.
        RuntimeError: ``backend="cuda"`` where CuPy is not installed.

    Example::

        model = DuelingQNetwork(4, 2).eval()
        result = integrated_gradients(model, states, target="mean", n_steps=50)
        result.attributions        # (B, 4)
        result.worst_relative_error
    """
    settings = _settings(
        {
            "target": target,
            "n_steps": n_steps,
            "method": method,
            "gradient": gradient,
            "internal_batch_size": internal_batch_size,
            "backend": backend,
            "completeness_tol": completeness_tol,
            "max_steps": max_steps,
            "fd_step": fd_step,
            "check_finite": check_finite,
            "cuda_graph": False,
        }
    )
    with torch.inference_mode(False), torch.enable_grad():
        return _attribute_eager(forward, inputs, baselines, settings)


# --------------------------------------------------------------------------- the reusable engine


class _GraphPlan:
    """A captured attribution for one key: static inputs, the graph, and its outputs packed in one buffer."""

    def __init__(self, graph: Any, static_x: Tensor, static_b: Tensor | None, static_rows: Tensor | None,
                 outputs: dict[str, Tensor], packed: Tensor | None, run: _Run, keep: Any) -> None:  # fmt: skip
        self.graph = graph
        self.static_x = static_x
        self.static_b = static_b
        self.static_rows = static_rows
        self.outputs = outputs  # "attributions" (T, B, F), "stats" (6, T, B)
        self.packed = packed  # both flattened into one buffer when their dtypes agree: one copy per replay
        self.run = run
        self.keep = keep  # objects whose id() is part of the key (a target callable)
        self.attribution_shape = outputs["attributions"].shape
        self.stats_shape = outputs["stats"].shape
        self.split_sizes = (outputs["attributions"].numel(), outputs["stats"].numel())
        self.zero_baselines: Tensor | None = None  # set by the fast path: a read-only expanded zero
        self.static_x_view: Tensor | None = None  # static_x viewed as (B, *feature_shape), for the fast path
        self.stochastic = False  # what the eager run before the capture found (replays repeat the capture)

    def results(self) -> dict[str, Tensor]:
        """Fresh copies of the outputs of the last replay."""
        if self.packed is None:
            return {name: value.clone() for name, value in self.outputs.items()}
        attributions, stats = self.packed.clone().split(self.split_sizes)
        return {"attributions": attributions.view(self.attribution_shape), "stats": stats.view(self.stats_shape)}


class IntegratedGradients:
    """A reusable Integrated Gradients engine for one forward.

    Holds default settings and, for repeated calls on the same shapes (what the
    training callback does), captures the whole autograd computation
    (interpolation kernel, batched forward, ``torch.autograd.grad``,
    accumulation kernel, completeness) in a ``torch.cuda.CUDAGraph`` on first
    use, keyed on shapes, dtype, device and settings. Later calls copy the new
    inputs into the graph's buffers and replay it: a handful of launches.

    The graph reads the model's parameters where they live, so in-place updates
    (an optimizer step, ``load_state_dict``) are seen by the next replay;
    replacing a parameter tensor object is not: call :meth:`clear` after that.
    Finite differences, ``n_steps="auto"``, CPU tensors and forwards that cannot
    be captured (host syncs, data-dependent shapes) run eagerly; a failed
    capture falls back to eager with one warning per key. The forward must be
    deterministic and free of side effects for a replay to mean the same as a
    call (no dropout in training mode, no noise drawn inside the forward).

    The NaN/Inf check of the inputs (``check_finite``) is a host sync; the
    engine skips it for a tensor it has already checked and that has not been
    modified since (same object, same version counter), which is what a
    callback passing the same held-out states sees.

    Args:
        forward: as for :func:`integrated_gradients`.
        **defaults: any keyword option of :func:`integrated_gradients`, plus
            ``cuda_graph``: ``"auto"`` (default: capture on CUDA devices), ``True``
            (capture, warn and fall back when it fails) or ``False`` (always eager).

    Raises:
        TypeError: a non-callable forward or an unknown option.
        ValueError: a bad option value (checked here, not at the first call).

    Example::

        engine = IntegratedGradients(q_network, target="mean", n_steps=50)
        for states in batches:
            result = engine.attribute(states)   # replays a CUDA graph after the first call
    """

    def __init__(self, forward: Callable[[Tensor], Tensor], **defaults: Any) -> None:
        _check_forward(forward)
        self._default_settings = _settings(defaults)  # rejects bad defaults now
        self.forward = forward
        self.defaults = dict(defaults)
        self._plans: dict[tuple[Any, ...], _GraphPlan | None] = {}
        self._checked: dict[str, tuple[weakref.ref[Tensor], int]] = {}
        self.last_mode: str | None = None  # "graph", "capture" or "eager": how the last call ran
        # (shape, dtype, device, plan, target label) of the last default-settings, zero-baseline replay
        self._fast: tuple[torch.Size, torch.dtype, torch.device, _GraphPlan, str] | None = None

    def clear(self) -> None:
        """Drop every captured graph (they are captured again on next use)."""
        self._plans.clear()
        self._checked.clear()
        self._fast = None

    def attribute(self, inputs: Tensor, baselines: Baselines = None, **overrides: Any) -> IGResult:
        """Attribute ``inputs``; ``overrides`` replace the defaults for this call.

        Args:
            inputs: ``(B, *feature_shape)``.
            baselines: as for :func:`integrated_gradients`.
            **overrides: options of :func:`integrated_gradients` and ``cuda_graph``.

        Returns:
            An :class:`IGResult` (its tensors are fresh, not the graph's buffers).

        Raises:
            The errors of :func:`integrated_gradients`.
        """
        if not overrides and self._fast is not None:
            result = self._attribute_fast(inputs, baselines)
            if result is not None:
                return result
        settings = _settings({**self.defaults, **overrides}) if overrides else self._default_settings
        with torch.inference_mode(False), torch.enable_grad():
            if not self._graph_wanted(settings, inputs):
                self.last_mode = "eager"
                return _attribute_eager(self.forward, inputs, baselines, settings)
            return self._attribute_graph(inputs, baselines, settings)

    # -- CUDA graphs
    def _attribute_fast(self, inputs: Any, baselines: Baselines) -> IGResult | None:
        """The callback's case, kept lean: default settings, zero baselines, same shapes as the last replay.

        Returns ``None`` when the call is not that case; the general path then runs.
        """
        shape, dtype, device, plan, label = self._fast
        if not (
            isinstance(inputs, Tensor)
            and (baselines is None or (isinstance(baselines, str) and baselines == "zeros"))
            and inputs.shape == shape
            and inputs.dtype == dtype
            and inputs.device == device
        ):
            return None
        settings = self._default_settings
        if torch.is_inference_mode_enabled():  # entering the context costs more than the check
            with torch.inference_mode(False):
                out = self._replay_fast(plan, inputs, settings.check_finite)
        else:
            out = self._replay_fast(plan, inputs, settings.check_finite)
        self.last_mode = "graph"
        if plan.zero_baselines is None:
            plan.zero_baselines = torch.zeros((1,) * inputs.dim(), dtype=dtype, device=device).expand(shape)
        return _result(out, plan.zero_baselines, plan.run.spec, settings, plan.run.backend, int(settings.n_steps),
                       plan.run, graph=True, stochastic=plan.stochastic)  # fmt: skip

    def _replay_fast(self, plan: _GraphPlan, inputs: Tensor, check_finite: bool) -> dict[str, Tensor]:
        if check_finite:
            self._check_once("inputs", inputs, inputs)
        if plan.static_x_view is None or plan.static_x_view.shape != inputs.shape:
            plan.static_x_view = plan.static_x.view(inputs.shape)
        plan.static_x_view.copy_(inputs)
        plan.graph.replay()
        return plan.results()

    @staticmethod
    def _graph_wanted(settings: _Settings, inputs: Any) -> bool:
        return (
            settings.cuda_graph is not False
            and isinstance(inputs, Tensor)
            and inputs.device.type == "cuda"
            and settings.n_steps != "auto"
            and settings.gradient == "autograd"
            and hasattr(torch.cuda, "CUDAGraph")
        )

    def _check_once(self, name: str, tensor: Tensor, given: Any) -> None:
        # The same tensor object, unmodified since it was checked (its version counter), is not checked again:
        # the callback passes the same held-out states every time, and the check is a host sync.
        if given.is_inference():  # no version counter to tell whether it changed: check every time
            check_finite(name, tensor)
            return
        seen = self._checked.get(name)
        if seen is not None and seen[0]() is given and seen[1] == given._version:
            return
        check_finite(name, tensor)
        self._checked[name] = (weakref.ref(given), given._version)

    def _attribute_graph(self, inputs: Tensor, baselines: Baselines, settings: _Settings) -> IGResult:
        x, b, resolved, spec, backend = _prepare(self.forward, inputs, baselines, settings)
        if settings.check_finite:
            self._check_once("inputs", x, inputs)
            if isinstance(baselines, Tensor):
                self._check_once("baselines", b, baselines)
        baseline_key: tuple[Any, ...]
        if isinstance(baselines, Tensor):
            baseline_key = ("tensor",)
        elif isinstance(baselines, (int, float)) and not isinstance(baselines, bool):
            baseline_key = ("scalar", float(baselines))
        else:
            baseline_key = (baselines or "zeros",)
        key = (tuple(inputs.shape), inputs.dtype, inputs.device, baseline_key, spec.key(), backend, settings.n_steps,
               settings.method, settings.internal_batch_size, settings.fd_step)  # fmt: skip
        plan = self._plans.get(key, _MISSING)
        if plan is None:  # capture failed before: eager
            self.last_mode = "eager"
            return _attribute_eager(self.forward, inputs, baselines, settings)
        if plan is _MISSING:
            plan = self._capture(key, x, b, baselines, spec, settings, backend, inputs.shape[1:])
            if plan is None:
                self.last_mode = "eager"
                return _attribute_eager(self.forward, inputs, baselines, settings)
            self.last_mode = "capture"
        else:
            self.last_mode = "graph"
        assert isinstance(plan, _GraphPlan)
        plan.static_x.copy_(x)
        if plan.static_b is not None:
            plan.static_b.copy_(b)
        if plan.static_rows is not None:
            assert spec.rows is not None
            if spec.rows_max >= plan.run.output_width:  # checked here: a replay's gather has no bounds check
                actions = plan.run.output_width
                raise ValueError(f"target holds index {spec.rows_max}, out of range for a forward with {actions} outputs; use 0..{actions - 1}")
            plan.static_rows.copy_(spec.rows)
        plan.graph.replay()
        out = plan.results()
        if (settings is self._default_settings and baseline_key == ("zeros",) and spec.kind != "per_row"
                and spec.kind != "callable"):  # fmt: skip
            self._fast = (inputs.shape, inputs.dtype, inputs.device, plan, spec.label)
        return _result(out, resolved, spec, settings, plan.run.backend, int(settings.n_steps), plan.run, graph=True,
                       stochastic=plan.stochastic)  # fmt: skip

    def _capture(self, key: tuple[Any, ...], x: Tensor, b: Tensor, baselines: Baselines, spec: _TargetSpec,
                 settings: _Settings, backend: str, feature_shape: torch.Size) -> _GraphPlan | None:  # fmt: skip
        static_x = x.clone()
        computed_baseline = not isinstance(baselines, Tensor)
        static_b = None if computed_baseline else b.clone()
        static_rows = spec.rows.clone() if spec.rows is not None else None
        graph_spec = dataclasses.replace(spec, rows=static_rows) if static_rows is not None else spec
        n_steps = int(settings.n_steps)
        acc = _accumulate_dtype(x.dtype)
        alphas, weights = _rule_tensors(settings.method, n_steps, acc, x.device)
        batch = x.shape[0]
        run = _Run(self.forward, static_x, b, tuple(feature_shape), graph_spec, settings, backend, _chunk_rows(settings, x))

        def compute() -> dict[str, Tensor]:
            if computed_baseline:
                # The baseline comes from the inputs inside the graph ("zeros", "mean" or a number).
                run.b = _resolve_baselines(baselines, static_x.view(batch, *feature_shape)).reshape(batch, -1)
            else:
                run.b = static_b
            grads, ends = run.gradients(alphas, with_ends=True)
            assert ends is not None
            return run.finish(weights, grads, ends)

        compute()  # eager first: shape and autograd errors surface as they would without a graph
        stochastic = bool(run.stochastic_flag())  # the ends evaluated twice, as on every eager call
        if stochastic:
            _warn_stochastic(self.forward, stacklevel=5)
        run.check_stochastic = False  # not in the warm-up nor the capture: its answer needs a host read
        run.allow_oom_retry = False  # a retry cannot happen inside a capture
        # With the CUDA kernels first; should their capture fail, the torch twins (same arithmetic) still beat eager.
        failures: list[str] = []
        for attempt in [backend, "torch"] if backend == "cuda" else [backend]:
            run.backend = attempt
            try:
                graph, outputs, packed = _capture_graph(compute, x.device)
                break
            except Exception as error:  # noqa: BLE001 - any capture failure means: try the next way, then eager
                failures.append(f"backend={attempt!r}: {type(error).__name__}: {error}")
        else:
            warnings.warn(
                f"CUDA graph capture of the attribution failed ({'; '.join(failures)}); running eagerly "
                "for these shapes (pass cuda_graph=False to skip the attempt)",
                RuntimeWarning,
                stacklevel=4,
            )
            self._plans[key] = None
            return None
        if failures:
            warnings.warn(
                f"CUDA graph capture with the CuPy kernels failed ({failures[0]}); captured the torch twins instead",
                RuntimeWarning,
                stacklevel=4,
            )
        plan = _GraphPlan(graph, static_x, static_b, static_rows, outputs, packed, run, spec.fn)
        plan.stochastic = stochastic
        if len(self._plans) >= _MAX_GRAPHS:  # each graph holds its memory pool: keep the most recent few
            evicted = self._plans.pop(next(iter(self._plans)))
            if self._fast is not None and self._fast[3] is evicted:
                self._fast = None
        self._plans[key] = plan
        return plan


def _capture_graph(compute: Callable[[], dict[str, Tensor]], device: torch.device) -> tuple[Any, dict[str, Tensor], Tensor | None]:
    """Warm ``compute`` up on a side stream, then capture it in a ``torch.cuda.CUDAGraph``.

    Returns the graph (anything with ``replay()``), the static outputs and, when
    attributions and stats share a dtype, both packed into one flat buffer.
    """
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    # The warm-up runs with torch's sync debug mode set to "error", so a forward
    # that synchronises with the host (.item(), .cpu(), data-dependent shapes)
    # fails here, before any capture begins. A capture that fails part-way
    # leaves the CUDA generator in its capture state, and every later random
    # draw on the device raises "Offset increment outside graph capture".
    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sync debug mode is a prototype feature": ours, not the user's
        torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            compute()  # warm-up on a side stream, as torch.cuda.graph's documentation asks
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode(previous_mode)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    rng_state = torch.cuda.get_rng_state(device)
    try:
        with torch.cuda.graph(graph):
            outputs = compute()
            packed = _pack(outputs)
    finally:
        # Capture registers the device's generator with the graph; the training run's RNG stream must not
        # notice (nothing here draws random numbers).
        torch.cuda.set_rng_state(rng_state, device)
    return graph, outputs, packed


def _pack(outputs: dict[str, Tensor]) -> Tensor | None:
    attributions, stats = outputs["attributions"], outputs["stats"]
    if attributions.dtype != stats.dtype:
        return None
    return torch.cat([attributions.reshape(-1), stats.reshape(-1)])  # (T * B * F + 6 * T * B,)


_MISSING: Any = object()
_MAX_GRAPHS = 8
