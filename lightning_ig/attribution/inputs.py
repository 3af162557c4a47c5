"""The tensors of one call, checked and flattened; the model behind a forward, for messages that say what to do.

Every call starts with :func:`prepare`: the forward is callable, the inputs are a floating tensor ``(B >= 1,
*feature_shape)`` with at least one feature, the baselines resolve to the inputs' shape, the target and the backend are
chosen. Inputs and baselines are flattened to ``(B, F)`` for the path.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_ig.attribution.checks import check_dense
from lightning_ig.attribution.result import SILENCED, StochasticForwardWarning
from lightning_ig.attribution.settings import IGOptions
from lightning_ig.attribution.targets import Target
from lightning_ig.ops.dtypes import accumulate_dtype
from lightning_ig.ops.ig import IGOps, ig_ops

__all__ = [
    "Baselines",
    "Prepared",
    "RunningStatistics",
    "check_forward",
    "module_of",
    "prepare",
    "raise_if_dtype_mismatch",
    "resolve_baselines",
    "uses_batch_statistics",
    "warn_stochastic",
]

Baselines = None | str | float | int | Tensor

_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_DTYPE_METHOD = {
    torch.float16: "half()",
    torch.bfloat16: "bfloat16()",
    torch.float32: "float()",
    torch.float64: "double()",
}
_BASELINE_FORMS = "None, 'zeros', 'mean', a number or a tensor"
# torch's public normalisation and dropout layers whose train mode makes a row depend on its batch or on chance
_BATCH_NORMS = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.LazyBatchNorm1d,
    torch.nn.LazyBatchNorm2d,
    torch.nn.LazyBatchNorm3d,
    torch.nn.SyncBatchNorm,
)
_DROPOUTS = (
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
    torch.nn.AlphaDropout,
    torch.nn.FeatureAlphaDropout,
)


@dataclass(frozen=True)
class Prepared:
    """One call's tensors: ``x``, ``b`` flattened to ``(B, F)``; ``resolved`` baselines in the inputs' shape."""

    x: Tensor
    b: Tensor
    resolved: Tensor
    spec: Target
    backend: IGOps
    feature_shape: tuple[int, ...]


def prepare(
    forward: Callable[[Tensor], Tensor], inputs: Any, baselines: Baselines, settings: IGOptions, target: Target
) -> Prepared:
    """Check and normalise what every call shares.

    Raises:
        TypeError: a non-callable forward; inputs or baselines of the wrong type or dtype.
        ValueError: inputs without states or features; baselines that do not fit; a bad target or backend.
    """
    check_forward(forward)
    _check_inputs(inputs)
    if inputs.is_inference():
        inputs = inputs.clone()  # inference tensors cannot be saved for autograd
    inputs = inputs.detach()
    resolved = resolve_baselines(baselines, inputs)
    batch = inputs.shape[0]
    return Prepared(
        x=inputs.reshape(batch, -1).contiguous(),  # (B, F)
        b=resolved.reshape(batch, -1).contiguous(),  # (B, F)
        resolved=resolved,
        spec=target.on(batch, inputs.device),
        backend=ig_ops(settings.backend, inputs),
        feature_shape=tuple(inputs.shape[1:]),
    )


def check_forward(forward: Any) -> None:
    """Raise a :class:`TypeError` unless ``forward`` is callable."""
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
    check_dense(inputs, "inputs")
    # vocabulary.check_states' words, for inputs that may also be (B,): one scalar feature per state
    if inputs.dim() < 1 or inputs.shape[0] == 0 or math.prod(inputs.shape[1:]) == 0:
        raise ValueError(
            f"inputs must have shape (num_states >= 1, *feature_shape) with at least one feature, got "
            f"{tuple(inputs.shape)}{'; add the state dimension (inputs.unsqueeze(0))' if inputs.dim() < 1 else ''}"
        )


def resolve_baselines(baselines: Baselines, inputs: Tensor) -> Tensor:
    """The baselines as a ``(B, *feature_shape)`` tensor of the inputs' dtype and device.

    Raises:
        TypeError: a bool, a non-floating tensor, or an unsupported type.
        ValueError: an unknown name, a non-finite number, or a tensor of another shape.
    """
    if baselines is None or (isinstance(baselines, str) and baselines == "zeros"):
        return torch.zeros_like(inputs)
    if isinstance(baselines, str):
        if baselines == "mean":
            mean = inputs.to(accumulate_dtype(inputs.dtype)).mean(dim=0, keepdim=True)
            return mean.to(inputs.dtype).expand_as(inputs).clone()
        raise ValueError(f"baselines must be {_BASELINE_FORMS}, got {baselines!r}")
    if isinstance(baselines, bool):
        raise TypeError(f"baselines must be {_BASELINE_FORMS}, got a bool ({baselines!r})")
    if isinstance(baselines, (int, float)):
        largest = torch.finfo(inputs.dtype).max
        try:
            number = float(baselines)
        except OverflowError:  # an int too large for any float
            number = math.inf
        if not math.isfinite(number) or abs(number) > largest:
            raise ValueError(
                f"baselines must be a finite number of the inputs' dtype {inputs.dtype} (at most {largest:.3g} in "
                f"size), got {baselines!r:.40}"
            )
        return torch.full_like(inputs, number)
    if not isinstance(baselines, Tensor):
        raise TypeError(f"baselines must be {_BASELINE_FORMS}, got {type(baselines).__name__}")
    if not baselines.dtype.is_floating_point:
        raise TypeError(f"baselines must be floating point, got dtype {baselines.dtype}; convert them with .float()")
    check_dense(baselines, "baselines")
    feature_shape = tuple(inputs.shape[1:])
    shape = tuple(baselines.shape)
    if shape not in ((), feature_shape, tuple(inputs.shape)):
        raise ValueError(
            f"baselines of shape {shape} do not match inputs of shape {tuple(inputs.shape)}; "
            f"pass a scalar, one baseline of shape {feature_shape} or one per state of shape {tuple(inputs.shape)}"
        )
    return baselines.detach().to(device=inputs.device, dtype=inputs.dtype).expand_as(inputs).clone()


def module_of(forward: Any, deep: bool = True) -> torch.nn.Module | None:
    """The ``nn.Module`` behind ``forward``: itself, a bound method's owner, a wrapper's ``__wrapped__``, or what a
    function, ``functools.partial`` or callable object holds (closure, arguments, globals it names, attributes, the
    values of a dict among them; several: one ``ModuleList``); ``deep``: also the attributes of the objects held
    (an agent's networks: its target network too, which the forward may not call)."""
    if isinstance(forward, torch.nn.Module):
        return forward  # first, without asking a module for attributes it lacks (slow: Module.__getattr__ raises)
    found = list({id(m): m for m in _held(forward, deep) if isinstance(m, torch.nn.Module)}.values())
    return None if not found else found[0] if len(found) == 1 else torch.nn.ModuleList(found)


_NOT_AGENTS = (torch.nn.Module, types.ModuleType)


def _held(forward: Any, deep: bool) -> list[Any]:
    held = [getattr(forward, "__self__", None), getattr(forward, "__wrapped__", None)]
    if isinstance(forward, functools.partial):
        held += [forward.func, *forward.args, *forward.keywords.values()]
    elif inspect.isfunction(forward):  # a lambda or a def: what it closes over and the globals it names
        held += [value for names in inspect.getclosurevars(forward)[:2] for value in names.values()]
        held += [*(forward.__defaults__ or ()), *(forward.__kwdefaults__ or {}).values()]  # lambda x, m=net: m(x)
    elif not inspect.isroutine(forward):  # a callable object (an agent's policy): its attributes
        held += list(getattr(forward, "__dict__", {}).values())
    # {"q": net}, and an agent's attributes: a bound method's owner, a global a lambda names (agent.net(x))
    inner = [getattr(one, "__dict__", one) if deep else one for one in held if not isinstance(one, _NOT_AGENTS)]
    return held + [value for one in inner if isinstance(one, dict) for value in one.values()]


def raise_if_dtype_mismatch(forward: Any, rows: Tensor, error: BaseException) -> None:
    """Turn torch's error for inputs of another dtype, or on another device, than the model's parameters (or for a
    forward that changes its input in place) into one that says what to do.

    Returns quietly when none of these, nor a shape the model does not take, is the cause (the caller re-raises).

    Raises:
        RuntimeError: the forward changed its input in place.
        TypeError: ``forward``'s module holds floating parameters of another dtype than ``rows``.
        ValueError: ``forward``'s module holds parameters on another device than ``rows``, or on the meta device.
    """
    if "leaf Variable that requires grad is being used in an in-place operation" in str(error):
        message = "the forward changes its input or a parameter in place (as x.mul_(2) or weight.clamp_() do): copy it"
        raise RuntimeError(f"{message} first (x = x * 2, x = x.clone()); IG takes gradients through both") from error
    module = module_of(forward)
    parameter = None if module is None else next((p for p in module.parameters() if p.is_floating_point()), None)
    if parameter is None:
        return _raise_if_shape(rows, error)
    if parameter.is_meta:  # model.to('cpu') cannot give it values, nor inputs.to('meta') a result
        raise ValueError(
            "the model's parameters are on the meta device (shapes without values): load its weights first "
            "(model.to_empty(device='cpu'), then model.load_state_dict(...))"
        ) from error
    if parameter.device != rows.device:
        raise ValueError(
            f"inputs are on {rows.device} but the model's parameters are on {parameter.device}; move one to the "
            f"other: inputs.to({str(parameter.device)!r}) or model.to({str(rows.device)!r})"
        ) from error
    dtype = rows.dtype
    if parameter.dtype == dtype:
        return _raise_if_shape(rows, error)
    fixes = [
        f"{what}.{_DTYPE_METHOD[to]}"
        for what, to in (("inputs", parameter.dtype), ("model", dtype))
        if to in _DTYPE_METHOD
    ]
    raise TypeError(
        f"inputs are {dtype} but the model's parameters are {parameter.dtype}; convert one to match the other: "
        f"{' or '.join(fixes)}"
    ) from error


def warn_stochastic(forward: Any, stacklevel: int, moved: bool = True) -> None:
    """Warn (:class:`StochasticForwardWarning`) that the forward is stochastic, naming the modules that likely are:
    ``moved``, it gave different values for the same inputs; else only where a noisy layer computes with its noise
    sample (fixed between its ``reset_noise()`` calls: the repeated inputs agree, the attributions are the sample's)."""
    if SILENCED.depth:
        return
    suspects = _stochastic_modules(module_of(forward, deep=moved))  # noise on in a network the forward may not call
    noisy = [suspect for suspect in suspects if suspect.endswith(": noise on)")]
    if not moved and not noisy:
        return
    named = suspects if moved else noisy
    cause = ", ".join(named[:5]) + (" ..." if len(named) > 5 else "")
    what = (
        "gave different values for the same inputs within one call (likely cause: "
        f"{cause or 'dropout or batch-norm in train mode, or NoisyNet noise left on'}); its attributions are not "
        "reproducible and completeness does not hold"
        if moved
        else f"computes with NoisyNet noise on ({cause}): the attributions are of one noise sample, not the mean"
    )
    warnings.warn(
        f"the forward {what}: call model.eval() and switch noise off (lightning_ig.noise_disabled(model)) before "
        "attributing",
        StochasticForwardWarning,
        stacklevel=stacklevel + 1,
    )


def uses_batch_statistics(forward: Any) -> bool:
    """Whether ``forward``'s module normalises with the statistics of its batch (batch-norm in train mode).

    Its values for a state then depend on the other rows of the batch, which a repeat inside the same batch cannot see.
    Only a module that :func:`module_of` finds is inspected.
    """
    module = module_of(forward)
    pending = [module] if module is not None else []
    seen: set[int] = set()
    while pending:  # Module.modules() without its name strings: this runs on every eager call
        child = pending.pop()
        if id(child) in seen:
            continue
        seen.add(id(child))
        if _is(child, _BATCH_NORMS) and (child.training or getattr(child, "running_mean", None) is None):
            return True
        pending.extend(child.children())
    return False


class RunningStatistics:
    """The buffers that ``forward``'s layers in train mode update, and a way to put them back.

    A batch-norm layer in train mode with ``track_running_stats`` moves ``running_mean`` and ``running_var`` and
    counts ``num_batches_tracked`` on every forward, spectral normalisation advances its power iteration's vectors;
    the engine's forwards of path points are not the user's batches, so every buffer of a layer in train mode is put
    back after the attribution as it was before. The layers are found once (host-side module inspection, no sync) in
    the module :func:`module_of` finds; with none in train mode, :meth:`save` and :meth:`restore` do nothing. Saving
    is a clone and restoring a copy on the device: no host sync, and both can be captured in a CUDA graph (the engine
    captures them with the path, so a replay restores too).
    """

    def __init__(self, forward: Any) -> None:
        self.buffers = _running_statistics(module_of(forward))

    def save(self) -> list[Tensor]:
        """Copies of the buffers as they are now."""
        return [buffer.clone() for buffer in self.buffers]

    def restore(self, saved: list[Tensor]) -> None:
        """Put back what :meth:`save` copied, in place (the same tensor objects: graphs and optimizers see them)."""
        with torch.no_grad():
            for buffer, value in zip(self.buffers, saved):
                buffer.copy_(value)


def _running_statistics(module: torch.nn.Module | None) -> list[Tensor]:
    if module is None:
        return []
    # each layer's own buffers (a batch-norm's statistics, a spectral norm's vectors), a shared one once
    found = {id(buffer): buffer for child in module.modules() if child.training for buffer in child.buffers(False)}
    return list(found.values())


def _is(module: torch.nn.Module, kinds: tuple[type[torch.nn.Module], ...]) -> bool:
    """``isinstance``, also for a ``torch.jit`` scripted or traced layer of such a class (its ``original_name``)."""
    scripted = isinstance(module, torch.jit.ScriptModule)
    return isinstance(module, kinds) or (scripted and module.original_name in {kind.__name__ for kind in kinds})


def _raise_if_shape(rows: Tensor, error: BaseException) -> None:
    """Torch's words for a shape the model does not take name rows the engine built: say they are the inputs'."""
    if not isinstance(error, torch.OutOfMemoryError) and re.search(r"shape|size|channels", str(error)):
        raise RuntimeError(
            f"the forward failed on rows the engine built from the inputs (each of {math.prod(rows.shape[1:])} "
            f"values; their count is not the inputs'): do the inputs have the shape the model takes? torch: {error}"
        ) from error


def _noisy_leaf(module: torch.nn.Module) -> bool:
    """No module inside ``module`` has ``reset_noise``: a layer, not a model passing the call on (its layers say)."""
    return not any(hasattr(inner, "reset_noise") for inner in module.modules() if inner is not module)


def _stochastic_modules(module: torch.nn.Module | None) -> list[str]:
    if module is None:
        return []
    found = []
    random_in_train = (*_DROPOUTS, *_BATCH_NORMS)
    for name, child in module.named_modules():
        if not child.training:
            continue
        if isinstance(child, random_in_train):
            found.append(f"{name or type(child).__name__} ({type(child).__name__} in train mode)")
        elif hasattr(child, "reset_noise") and getattr(child, "noise_active", True) and _noisy_leaf(child):
            found.append(f"{name or type(child).__name__} ({type(child).__name__}: noise on)")
    return found
