"""A fused, numerically stable soft-margin loss: a drop-in for ``torch.nn.SoftMarginLoss``.

``loss = reduce(log(1 + exp(-y x)))`` for targets ``y`` in ``{-1, +1}``, computed as ``max(z, 0) + log1p(exp(-|z|))``
with ``z = -y x``, so it is finite for every finite input (torch's own loss overflows to ``inf`` once ``-y x`` passes
~88 in float32, and its gradient turns into NaN there).

Three layers with one stem, as in Liger-Kernel:

* the kernels (``kernels/soft_margin.cu``), their launchers and an :class:`torch.autograd.Function`, in
  :mod:`lightning_ig.ops.soft_margin` (for ``mean``/``sum`` ONE launch that also writes ``dL/dx``, which the backward
  scales by ``grad_output`` on the device, without a host sync);
* :class:`SoftMarginLoss`, a thin ``nn.Module`` with torch's constructor;
* :func:`soft_margin_loss`, the functional form, which checks the arguments and picks the path;

plus :func:`swap_soft_margin`, which switches an existing model over in one line;
:func:`lightning_ig.ops.soft_margin.soft_margin_torch` is the same math in plain torch: the path for CPU tensors and
float64, and the reference in tests.

Behaviour shared with torch: the output has the input's shape (``"none"``) and dtype; the target may broadcast to the
input's shape (never the other way) and is converted to the input's dtype where torch would; the mean of an empty
input is NaN and its sum 0; under ``torch.autocast`` half-precision inputs are computed in float32, as torch's
autocast does for this loss.

A target that requires a gradient gets one, ``dL/dy = -x sigmoid(-y x)`` (a learnt soft label, say), through the torch
twin, which is differentiable in both arguments: the fused kernels compute ``dL/dx`` only. Torch's own loss refuses
such a target ("not differentiable with respect to argument 'target'"); this one is a superset, with the same values
where torch's are defined.

Second derivatives (``create_graph=True``) are supported: when autograd records the backward, it is computed with
differentiable torch operations from the saved input and target, so ``torch.autograd.grad`` of a gradient is correct.
A second ``backward`` through a retained graph recomputes the gradient.

The CUDA path is deterministic: the same input on the same device gives bit-identical results (the reduction order
depends only on the size). Each (device, stream) gets a small reduction workspace once; a launch captured into a CUDA
graph gets its own, so a training step that uses the loss can be captured with ``torch.cuda.graph`` and replayed (warm
it up first, as torch's documentation asks: the first call compiles the kernels).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from lightning_ig.ops._cupy import choose_backend
from lightning_ig.ops.dtypes import KERNEL_DTYPES
from lightning_ig.ops.soft_margin import soft_margin_cuda, soft_margin_torch
from lightning_ig.vocabulary import BACKENDS, BackendName, check_bool, check_choice

__all__ = ["REDUCTIONS", "Reduction", "SoftMarginLoss", "soft_margin_loss", "swap_soft_margin"]

Reduction = Literal["none", "mean", "sum"]

REDUCTIONS = ("none", "mean", "sum")


def soft_margin_loss(
    input: Tensor,  # noqa: A002 - torch's name for it
    target: Tensor,
    reduction: Reduction = "mean",
    *,
    backend: BackendName = "auto",
) -> Tensor:
    """The soft-margin loss ``log(1 + exp(-target * input))``, reduced; fused on CUDA.

    Same results as :func:`torch.nn.functional.soft_margin_loss` where torch's are finite, and finite where torch's
    overflow.

    Args:
        input: Scores (logits) of any shape; floating point. The kernels read a contiguous buffer: a non-contiguous
            input is copied once (and its gradient comes back through that copy).
        target: Labels, usually ``-1``/``+1``; the input's shape or one that broadcasts to it (a broadcast target is
            materialised for the kernels). Converted to the input's dtype. A target that requires a gradient gets one
            (computed by the torch twin, on any device).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (elementwise, the input's shape).
        backend: ``"auto"`` (default) runs the CUDA kernels for float32, float16 and bfloat16 tensors on a CUDA device
            when CuPy imports, and plain torch otherwise (CPU, float64). ``"cuda"`` insists on the kernels and raises
            instead of falling back; ``"torch"`` always uses plain torch.

    Returns:
        The loss in the input's dtype: a 0-dim tensor for ``"mean"``/``"sum"``, the input's shape for ``"none"``.

    Raises:
        TypeError: ``input``/``target`` is not a tensor, ``input`` is not floating point, or ``backend="cuda"`` with a
            dtype the kernels do not take.
        ValueError: an unknown ``reduction`` or ``backend``, or ``backend="cuda"`` without a CUDA device / with tensors
            off the GPU.
        RuntimeError: as torch raises it: ``target`` does not broadcast to the input's shape, or its dtype cannot be
            cast to the input's; or ``backend="cuda"`` where CuPy cannot be imported, or with a target that requires a
            gradient (the kernels compute ``dL/dx`` only).

    Example::

        >>> x = torch.tensor([2.0, -1.0, 100.0], requires_grad=True)
        >>> y = torch.tensor([1.0, 1.0, -1.0])
        >>> loss = soft_margin_loss(x, y)  # torch.nn.functional.soft_margin_loss gives inf here
        >>> round(loss.item(), 4)
        33.8134
        >>> loss.backward()
    """
    reduction = _reduction(reduction)
    _check_arguments(input, target)
    if target.dim() == 0 and target.device.type == "cpu" and input.device.type != "cpu":
        target = target.to(input.device)  # torch takes a CPU scalar target with an input on any device
    check_choice(backend, BACKENDS, "backend")
    resolved = choose_backend(backend, input, target)
    if input.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(input.device.type):
        # torch's autocast runs soft_margin_loss in float32; do the same, so swapping is invisible
        input = input.float()  # noqa: A001 - torch's name for the argument
    target = _target_like(target, input)
    if _use_kernels(resolved, backend, input, target):
        if torch.compiler.is_compiling():
            # raw pointers and CuPy launches cannot be traced: torch.compile runs this part
            # eagerly (wrapped here, not at import, since the wrapper imports torch._dynamo)
            return torch.compiler.disable(soft_margin_cuda)(input, target, reduction)
        return soft_margin_cuda(input, target, reduction)
    return soft_margin_torch(input, target, reduction)


class SoftMarginLoss(nn.SoftMarginLoss):
    """Drop-in for :class:`torch.nn.SoftMarginLoss` that runs the fused, stable kernels.

    Same constructor as torch's (the deprecated ``size_average``/``reduce`` are turned into ``reduction`` by torch's own
    rules, with its warning) plus ``backend``. It subclasses ``torch.nn.SoftMarginLoss``, so ``isinstance`` checks in
    existing code keep working.

    Args:
        size_average: Deprecated (see ``reduction``). Default ``None``.
        reduce: Deprecated (see ``reduction``). Default ``None``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        backend: ``"auto"`` (default), ``"cuda"`` or ``"torch"``; see :func:`soft_margin_loss`.

    Raises:
        TypeError: ``size_average`` or ``reduce`` is neither ``None`` nor a bool, or ``reduction``/``backend`` is not a
            string.
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
        backend: BackendName = "auto",
    ) -> None:
        for name, value in (("size_average", size_average), ("reduce", reduce)):
            if value is not None:
                check_bool(value, name)  # torch reads any value as truthy: "no" would mean True
        super().__init__(size_average, reduce, reduction)
        self.reduction = _reduction(self.reduction)
        self.backend = check_choice(backend, BACKENDS, "backend")

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        """The loss of ``input`` against ``target``; see :func:`soft_margin_loss`."""
        return soft_margin_loss(input, target, self.reduction, backend=self.backend)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, backend={self.backend!r}"


def swap_soft_margin(module: nn.Module, *, backend: BackendName = "auto") -> int:
    """Replace every ``torch.nn.SoftMarginLoss`` inside ``module`` with the fused one, in place.

    The one-line loss option for an existing model or LightningModule: it walks the whole module tree (nested modules,
    ``ModuleList``, ``ModuleDict``, ``Sequential``), keeps each loss's ``reduction`` and training flag, and keeps
    aliases aliased: every name of one loss (``m.criterion = m.aux = loss``, a loss shared by several parents or listed
    twice in a container) gets the same new loss. Only modules whose type is exactly ``torch.nn.SoftMarginLoss`` are
    replaced: a user subclass may have changed ``forward``, and losses already fused are left alone. Hooks registered on
    an old loss do not move to its replacement; a loss held outside the module tree (a plain list, a closure) is not
    seen.

    Args:
        module: The model whose losses to replace.
        backend: The ``backend`` of the new losses. Default ``"auto"``.

    Returns:
        How many distinct losses were replaced (a loss with several names counts once).

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
        ValueError: ``module`` is itself a ``torch.nn.SoftMarginLoss`` (there is no parent to put the new one in), or
            ``backend`` is unknown.

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
    check_choice(backend, BACKENDS, "backend")
    replacements: dict[int, SoftMarginLoss] = {}
    # Every name of every loss, aliases included: named_children() and modules() skip a module already seen, so
    # `m.criterion = m.aux = loss` would leave m.aux behind. A list first: the tree changes under the loop.
    found = [
        (name, child)
        for name, child in module.named_modules(remove_duplicate=False)
        if type(child) is nn.SoftMarginLoss
    ]
    for qualified_name, child in found:
        if (fused := replacements.get(id(child))) is None:
            fused = SoftMarginLoss(reduction=child.reduction, backend=backend)  # type: ignore[arg-type]
            fused.train(child.training)
            replacements[id(child)] = fused
        parent_name, _, name = qualified_name.rpartition(".")
        setattr(module.get_submodule(parent_name), name, fused)
    return len(replacements)


def _reduction(reduction: Any) -> Reduction:
    """torch's losses still take its old name ``"elementwise_mean"`` for ``"mean"``, with this warning: so do these."""
    if reduction == "elementwise_mean":
        warnings.warn("reduction='elementwise_mean' is deprecated. Please use reduction='mean' instead.", stacklevel=3)
        return "mean"
    return cast(Reduction, check_choice(reduction, REDUCTIONS, "reduction"))


def _check_arguments(input: Tensor, target: Tensor) -> None:  # noqa: A002
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if not input.is_floating_point():
        raise TypeError(f"input must be a floating-point tensor, got {input.dtype}; convert it with .float()")


def _target_like(target: Tensor, input: Tensor) -> Tensor:  # noqa: A002
    """``target`` broadcast to the input's shape; a shape or a dtype torch refuses is refused (a RuntimeError)."""
    if target.shape != input.shape:
        try:
            target = target.expand(input.shape)
        except RuntimeError:
            raise RuntimeError(
                f"target of shape {tuple(target.shape)} does not broadcast to the input's shape "
                f"{tuple(input.shape)}; soft_margin_loss needs a target of the input's shape (or one that "
                "broadcasts to it, as in torch): reshape the target"
            ) from None
    if target.dtype != input.dtype and not torch.can_cast(torch.promote_types(input.dtype, target.dtype), input.dtype):
        raise RuntimeError(
            f"soft_margin_loss computes in the input's dtype {input.dtype}, and a target of dtype "
            f"{target.dtype} cannot be cast to it (torch refuses the same); pass a real-valued target"
        )
    return target


def _use_kernels(resolved: str, backend: str, input: Tensor, target: Tensor) -> bool:  # noqa: A002
    """Whether the fused kernels run: the backend is CUDA, they take the dtype, and only ``dL/dx`` is wanted."""
    if resolved != "cuda":
        return False
    if target.requires_grad and torch.is_grad_enabled():
        if backend == "cuda":
            raise RuntimeError(
                "backend='cuda': the fused kernels compute dL/dinput only, and target requires a gradient; use "
                "backend='auto' (the torch twin then differentiates both) or pass target.detach()"
            )
        return False  # the twin: differentiable with respect to the target too
    if input.dtype in KERNEL_DTYPES:
        return True
    if backend == "cuda":
        raise TypeError(
            f"backend='cuda': the fused kernels take float32, float16 and bfloat16, got {input.dtype}; "
            "use backend='auto' or 'torch' for it"
        )
    return False  # float64 on a CUDA device: the torch twin
