"""The fused ensemble reduce: ``out[b] = sum_m w[m] * mean_k sigmoid(logits[b, m, k])``.

:func:`ensemble_reduce` checks its arguments and picks the backend (the kernels, their launchers, the autograd
Function and the torch twin are :mod:`lightning_ig.ops.ensemble_reduce`'s); :class:`EnsembleReduce` owns the weights.

Non-finite weights: checking CUDA weights on every call would cost a host sync (and could not run inside CUDA-graph
capture), so :func:`ensemble_reduce` checks them only when they are CPU tensors; :class:`EnsembleReduce` checks its
weights when they are set (construction, ``load_state_dict``). A NaN or Inf weight that slips through makes every
output row NaN or Inf, which the IG engine records as a non-finite result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.ops import ensemble_reduce as ops
from lightning_ig.ops._cupy import choose_backend
from lightning_ig.ops.dtypes import KERNEL_DTYPES
from lightning_ig.vocabulary import BACKENDS, BackendName, check_bool, check_choice, check_int

__all__ = ["REDUCE_DIMS", "EnsembleReduce", "ensemble_reduce", "member_means"]

REDUCE_DIMS = (-1, 2, -2, 1)
"""Allowed ``reduce_dim``: the axis of the K logits averaged per member. ``-1``/``2``:
logits ``(B, M, K)``; ``-2``/``1``: logits ``(B, K, M)``. Dim 0 is always the rows."""


def ensemble_reduce(logits: Tensor, weights: Tensor, *, reduce_dim: int = -1, backend: BackendName = "auto") -> Tensor:
    """The weighted sum over members of each member's mean sigmoid: ``(B,)`` from logits ``(B, M, K)``.

    ``out[b] = sum_m weights[m] * mean_k sigmoid(logits[b, m, k])``, fused on CUDA
    (one launch forward, one backward), deterministic (the same input on the same
    device gives the same bits), stable for any logit (``+/-inf`` included), and
    differentiable with respect to ``logits`` and ``weights`` (second derivatives too).

    Args:
        logits: ``(B, M, K)``: B rows, M members, K logits per member (for
            ``reduce_dim=1``: ``(B, K, M)``). float32, float16 or bfloat16 run the
            kernels on CUDA with float32 accumulation; float64 runs the torch twin.
            Any strides (non-contiguous views are read in place).
        weights: ``(M,)`` floating point, on the logits' device; may require a
            gradient. Read as float32 by the kernels.
        reduce_dim: the axis of the K logits that are averaged: ``-1`` or ``2``
            (default, logits ``(B, M, K)``), or ``-2`` or ``1`` (logits ``(B, K, M)``).
        backend: ``"auto"`` (default) runs the kernels for CUDA tensors of a
            kernel dtype when CuPy imports, else the torch twin; ``"cuda"`` insists
            on the kernels and raises instead of falling back; ``"torch"`` is the twin.

    Returns:
        ``(B,)`` in the logits' dtype.

    Raises:
        TypeError: ``logits``/``weights`` is not a tensor or not floating point,
            ``reduce_dim`` is not an int, or ``backend="cuda"`` with float64 logits.
        ValueError: logits not 3-D or with no members/logits, ``reduce_dim`` not in
            :data:`REDUCE_DIMS`, weights of the wrong shape, on another device, or
            holding NaN/Inf (checked when they are CPU tensors, see the module
            docstring), an unknown ``backend``, or ``backend="cuda"`` without a
            CUDA device / with CPU tensors.
        RuntimeError: ``backend="cuda"`` where CuPy cannot be imported.

    Example::

        >>> logits = torch.tensor([[[0.0, 0.0], [100.0, 100.0]]])  # 1 row, 2 members, 2 logits
        >>> ensemble_reduce(logits, torch.tensor([0.5, 0.5]))
        tensor([0.7500])
    """
    rows_members_logits = _rows_members_logits(logits, reduce_dim)
    _check_weights(weights, logits, rows_members_logits.shape[1])
    resolved = choose_backend(backend, logits, weights)
    if resolved == "cuda" and logits.dtype not in KERNEL_DTYPES:
        if backend == "cuda":
            raise TypeError(
                f"backend='cuda': the ensemble kernels take float32, float16 and bfloat16 logits, got {logits.dtype}; "
                "use backend='auto' or 'torch' for it"
            )
        resolved = "torch"
    needs_grad = torch.is_grad_enabled() and (logits.requires_grad or weights.requires_grad)
    if resolved == "torch":
        twin = ops.TorchReduce.apply if needs_grad else ops.forward_torch
        return twin(rows_members_logits, weights)
    if torch.compiler.is_compiling():
        # raw pointers and CuPy launches cannot be traced: torch.compile runs this part eagerly
        return torch.compiler.disable(ops.reduce_cuda)(rows_members_logits, weights, needs_grad)
    return ops.reduce_cuda(rows_members_logits, weights, needs_grad)


def member_means(logits: Tensor, *, reduce_dim: int = -1) -> Tensor:
    """Each member's own signal ``mean_k sigmoid(logits[b, m, k])``: ``(B, M)`` in the logits' dtype.

    The same stable operations, in the same order, as the per-member part of
    :func:`ensemble_reduce`, in plain differentiable torch (so
    ``ensemble_reduce(logits, w) == sum_m w[m] * member_means(logits)[:, m]`` up to
    the order of the final sum). This is what each member contributes, the
    target for attributing every member in one batched IG run (``target="each"``).

    Args:
        logits: as for :func:`ensemble_reduce`.
        reduce_dim: as for :func:`ensemble_reduce`.

    Returns:
        ``(B, M)``, each value in ``[0, 1]``.

    Raises:
        TypeError, ValueError: bad ``logits`` or ``reduce_dim``, as for :func:`ensemble_reduce`.

    Example::

        >>> member_means(torch.tensor([[[0.0, 0.0], [100.0, 100.0]]]))
        tensor([[0.5000, 1.0000]])
    """
    return ops.member_means_torch(_rows_members_logits(logits, reduce_dim)).to(logits.dtype)


class EnsembleReduce(nn.Module):
    """:func:`ensemble_reduce` as a module that owns the members' weights.

    The weights live in a buffer (or a parameter with ``learnable=True``) named
    ``weights``, float32, so they follow ``.to(device)`` and travel in the
    ``state_dict``. They are checked for NaN/Inf here and after every
    ``load_state_dict``, so the forward never needs a host sync for that.

    Args:
        weights: one weight per member (a sequence of numbers or a 1-D tensor), or
            an int ``M`` for ``M`` equal weights ``1 / M`` (a plain average).
        reduce_dim: see :func:`ensemble_reduce`. Default ``-1``.
        learnable: make the weights an ``nn.Parameter``. Default ``False``.
        backend: see :func:`ensemble_reduce`. Default ``"auto"``.

    Raises:
        TypeError: ``weights`` of the wrong kind or ``reduce_dim`` not an int.
        ValueError: no weights, NaN/Inf weights, or an unknown ``reduce_dim``/``backend``.

    Example::

        >>> reduce = EnsembleReduce(4)  # four members, averaged
        >>> reduce(torch.zeros(3, 4, 2))
        tensor([0.5000, 0.5000, 0.5000])
    """

    weights: Tensor

    def __init__(
        self,
        weights: int | Sequence[float] | Tensor,
        *,
        reduce_dim: int = -1,
        learnable: bool = False,
        backend: BackendName = "auto",
    ) -> None:
        super().__init__()
        _check_reduce_dim(reduce_dim)
        check_choice(backend, BACKENDS, "backend")
        values = _weights_tensor(weights)
        if check_bool(learnable, "learnable"):
            self.weights = nn.Parameter(values)
        else:
            self.register_buffer("weights", values)
        self.reduce_dim = reduce_dim
        self.backend = backend
        self.register_load_state_dict_post_hook(_check_loaded_weights)  # a named function: the module pickles

    @property
    def num_members(self) -> int:
        """How many members the weights are for."""
        return int(self.weights.shape[0])

    def forward(self, logits: Tensor) -> Tensor:
        """``(B, M, K)`` logits (``(B, K, M)`` for ``reduce_dim=1``) -> ``(B,)``."""
        return ensemble_reduce(logits, self.weights, reduce_dim=self.reduce_dim, backend=self.backend)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, reduce_dim={self.reduce_dim}, backend={self.backend!r}"


def _weights_tensor(weights: int | Sequence[float] | Tensor) -> Tensor:
    """Members' weights (numbers, a 1-D float tensor, or ``M`` for ``1 / M`` each) as a checked float32 CPU tensor."""
    if isinstance(weights, (int, np.integer)) and not isinstance(weights, bool):
        if weights < 1:
            raise ValueError(f"weights as a member count must be >= 1, got {weights}")
        return torch.full((int(weights),), 1.0 / int(weights), dtype=torch.float32, device="cpu")
    if isinstance(weights, Tensor):
        if not weights.is_floating_point():
            raise TypeError(
                f"weights must be a floating-point tensor, got {weights.dtype}; pass e.g. torch.tensor([0.5, 0.5])"
            )
        values = weights.detach().to("cpu", torch.float32).clone()
    elif isinstance(weights, Sequence) and not isinstance(weights, (str, bytes)):
        if not all(isinstance(w, (int, float, np.integer, np.floating)) and not isinstance(w, bool) for w in weights):
            raise TypeError(f"weights must be numbers, one per member, got {list(weights)!r:.80}")
        values = torch.tensor([float(w) for w in weights], dtype=torch.float32, device="cpu")
    else:
        raise TypeError(
            f"weights must be a member count, a sequence of numbers or a 1-D tensor, got {type(weights).__name__}"
        )
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(
            f"weights must be 1-D with one weight per member (at least one), got shape {tuple(values.shape)}"
        )
    _check_finite_weights(values)
    return values


def _check_reduce_dim(reduce_dim: Any) -> None:
    if check_int(reduce_dim, "reduce_dim") not in REDUCE_DIMS:
        raise ValueError(
            f"reduce_dim names the axis of the K logits averaged per member: -1 or 2 for logits (B, M, K), "
            f"-2 or 1 for logits (B, K, M) (dim 0 is always the rows); got {reduce_dim}"
        )


def _rows_members_logits(logits: Any, reduce_dim: int) -> Tensor:
    """``logits`` checked and viewed as ``(B, M, K)`` (a transpose for ``reduce_dim`` 1 / -2, no copy)."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits must be a torch.Tensor (B rows, M members, K logits), got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}; convert with .float()")
    if reduce_dim != -1:
        _check_reduce_dim(reduce_dim)
    if logits.dim() != 3:
        raise ValueError(
            f"logits must be 3-D (B rows, M members, K logits per member), got shape {tuple(logits.shape)}; "
            "stack the members' (B, K) outputs with torch.stack(outputs, dim=1)"
        )
    rows_members_logits = logits if reduce_dim in (-1, 2) else logits.transpose(1, 2)
    if rows_members_logits.shape[1] == 0 or rows_members_logits.shape[2] == 0:
        members, per_member = rows_members_logits.shape[1:]
        raise ValueError(
            f"logits of shape {tuple(logits.shape)} hold {members} member(s) with {per_member} logit(s) each "
            f"(reduce_dim={reduce_dim}); an ensemble needs at least one member with at least one logit"
        )
    return rows_members_logits


def _check_weights(weights: Any, logits: Tensor, members: int) -> None:
    if not isinstance(weights, Tensor):
        raise TypeError(f"weights must be a torch.Tensor of shape ({members},), got {type(weights).__name__}")
    if not weights.is_floating_point():
        raise TypeError(f"weights must be floating point, got {weights.dtype}; convert with .float()")
    if weights.dim() != 1 or weights.shape[0] != members:
        raise ValueError(
            f"weights must have shape ({members},), one per member of logits {tuple(logits.shape)}, "
            f"got shape {tuple(weights.shape)}"
        )
    if weights.get_device() != logits.get_device():
        raise ValueError(
            f"logits are on {logits.device} and weights on {weights.device}; move them to one device "
            "(weights.to(logits.device))"
        )
    if not weights.is_cuda:
        _check_finite_weights(weights)


def _check_finite_weights(weights: Tensor) -> None:
    finite = torch.isfinite(weights)
    if not bool(finite.all()):
        first = int((~finite).nonzero()[0, 0])
        raise ValueError(
            f"weights must be finite, got {float(weights[first])} at index {first} (weights "
            f"{weights.tolist()!r:.120}); fix the ensemble's weights"
        )


def _check_loaded_weights(module: EnsembleReduce, incompatible_keys: Any) -> None:
    _check_finite_weights(module.weights.detach())  # one host check at load time instead of one per forward
