"""NoisyNet exploration noise switched off for attribution, and everything put back afterwards.

The same state must give the same output at every point of the IG path: :func:`noise_disabled` makes every noisy
layer of a model deterministic for a ``with`` block and puts back exactly what was there, for this package's
:class:`NoisyLinear` (defined in :mod:`.noisy_linear`, imported from here) and the conventions of other libraries.
:func:`attribution_mode` adds what a run during training needs: eval mode, gradients on, random generators kept.
"""

from __future__ import annotations

import contextlib
import enum
import random
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, TypeVar

import torch
from torch import Tensor, nn

from lightning_ig.models.noisy_linear import BEFORE_NOISE_WRITE, NoisyLinear

__all__ = ["NoisyLinear", "attribution_mode", "is_noisy_layer", "noise_disabled"]

_ModuleT = TypeVar("_ModuleT", bound=nn.Module)  # the blocks yield the module given, typed as given


# Names of tensors that hold the noise sample of a noisy layer elsewhere: weight_epsilon,
# bias_epsilon (TorchRL, Tianshou, Kaixhin's Rainbow), epsilon_weight, eps_in, eps_out, noise_w, ...
_EPSILON_NAME = re.compile(r"(^|_)(eps|epsilon|noise)(_|$|[0-9])", re.IGNORECASE)
# ... and of the learnt noise scales: weight_sigma, sigma_weight, sigma_w, ...
_SIGMA_NAME = re.compile(r"(^|_)sigma(_|$|[0-9])", re.IGNORECASE)


class _Switchable(Protocol):
    def disable_noise(self) -> None: ...

    def enable_noise(self) -> None: ...


def _has_switch(module: nn.Module) -> TypeGuard[_Switchable]:
    return callable(getattr(module, "disable_noise", None)) and callable(getattr(module, "enable_noise", None))


def is_noisy_layer(module: nn.Module) -> bool:
    """Whether ``module`` looks like a NoisyNet layer that :func:`noise_disabled` should switch.

    It is one when it is this package's :class:`NoisyLinear`; when it has ``disable_noise()`` and
    ``enable_noise()`` methods; or when it owns parameters or buffers itself (a layer, not a container) and
    either its class name contains ``"noisy"`` or it owns a tensor named like a noise sample or scale
    (``weight_epsilon``, ``eps_in``, ``weight_sigma``, ...; a 0-dim ``eps`` is a constant, not a sample).

    Args:
        module: Any module.

    Returns:
        ``True`` for a noisy layer.
    """
    if isinstance(module, NoisyLinear) or _has_switch(module):
        return True
    tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    if not tensors:
        return False  # a container: its children are looked at one by one
    if "noisy" in type(module).__name__.lower():
        return True
    # a 0-dim "eps" is a numerical constant (a norm layer's), never a noise sample
    return any(_SIGMA_NAME.search(name) or (_EPSILON_NAME.search(name) and t.dim()) for name, t in tensors)


@dataclass
class _LayerSnapshot:
    """Everything about one noisy layer that ``noise_disabled`` may change, to put back bit-exactly."""

    module: nn.Module
    training: bool
    attributes: dict[str, Any]  # plain (non-tensor) attributes in the module's __dict__
    parameters: dict[str, nn.Parameter]  # name -> the Parameter object (identity restored)
    buffers: dict[str, Tensor]  # name -> the buffer object (identity restored)
    buffer_values: dict[str, Tensor]  # name -> a copy of its values
    tensor_attributes: dict[str, Tensor] = field(default_factory=dict)  # plain tensor attributes
    tensor_attribute_values: dict[str, Tensor] = field(default_factory=dict)
    lazy: bool = False  # buffer_values filled by copy_buffers, just before the layer's reset_noise writes

    def copy_buffers(self) -> None:
        """Copy the buffers' values, once: called by this package's layer before it draws new noise."""
        if self.lazy and not self.buffer_values:
            with torch.no_grad():
                self.buffer_values = {name: value.detach().clone() for name, value in self.buffers.items()}


_PLAIN = (bool, int, float, str, type(None), enum.Enum)  # an Enum member is a switch's state too
# nn.Module's own bookkeeping (training flag, hook flags): never a layer's noise switch, and code in
# the block (a hook registered by an attribution library) may change it legitimately
_MODULE_INTERNALS = frozenset(vars(nn.Module()))


def _is_plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(_is_plain(item) for item in value))


def _snapshot(module: nn.Module) -> _LayerSnapshot:
    # Values are copied without autograd history: the snapshot is a copy of state, not part of a graph.
    with torch.no_grad():
        attributes = {
            name: value for name, value in vars(module).items() if name not in _MODULE_INTERNALS and _is_plain(value)
        }
        buffers = dict(module.named_buffers(recurse=False))
        # This package's layer changes its noise only in reset_noise, which copies the buffers first (copy on write):
        # a block that does not redraw the noise copies nothing and writes nothing back.
        lazy = isinstance(module, NoisyLinear)
        buffer_values = {} if lazy else {name: value.detach().clone() for name, value in buffers.items()}
        tensor_attributes = {
            name: value
            for name, value in vars(module).items()
            if isinstance(value, Tensor) and not isinstance(value, nn.Parameter)
        }
        tensor_attribute_values = {name: value.detach().clone() for name, value in tensor_attributes.items()}
    snapshot = _LayerSnapshot(
        module=module,
        training=module.training,
        attributes=attributes,
        parameters=dict(module.named_parameters(recurse=False)),
        buffers=buffers,
        buffer_values=buffer_values,
        tensor_attributes=tensor_attributes,
        tensor_attribute_values=tensor_attribute_values,
        lazy=lazy,
    )
    if lazy:
        BEFORE_NOISE_WRITE.setdefault(module, []).append(snapshot.copy_buffers)
    return snapshot


def _put_back(module: nn.Module, kept: Mapping[str, Tensor], now: Mapping[str, Tensor], *, buffers: bool) -> None:
    """The parameters (or buffers) ``kept`` registered again as the same objects; any added since set to ``None``.
    ``now`` holds the tensors registered now (``named_parameters``/``named_buffers`` leave out names registered as
    ``None``, so an added name stays registered, as ``None``, rather than vanishing where it had been ``None``)."""
    for name in now.keys() - kept.keys():
        setattr(module, name, None)
    for name, value in kept.items():
        if now.get(name) is value:
            continue
        if buffers and name not in now:  # set to None or deleted in the block: registered again
            module.register_buffer(name, value)
        else:
            setattr(module, name, value)


def _restore(snapshot: _LayerSnapshot) -> None:
    module = snapshot.module
    if snapshot.lazy and snapshot.copy_buffers in (guards := BEFORE_NOISE_WRITE.get(module, [])):
        guards.remove(snapshot.copy_buffers)
    with torch.no_grad():
        # The model moved or cast in the block (model.to(device), .double()) stays so: its noise comes back converted.
        for name, now in module.named_buffers(recurse=False):
            kept = snapshot.buffers.get(name)
            if kept is not None and (kept.dtype, kept.device) != (now.dtype, now.device):
                snapshot.buffers[name] = kept.to(now.device, now.dtype)
        # Identity first (a switch may have re-assigned a tensor), then the values, bit for bit. Only a foreign switch
        # rebinds parameters: others assigned in the block (load_state_dict(..., assign=True)) are the user's and stay.
        if not snapshot.lazy and _has_switch(snapshot.module):
            _put_back(module, snapshot.parameters, dict(module.named_parameters(recurse=False)), buffers=False)
        _put_back(module, snapshot.buffers, dict(module.named_buffers(recurse=False)), buffers=True)
        for name, value in snapshot.buffer_values.items():
            snapshot.buffers[name].copy_(value)
        for name, value in snapshot.tensor_attributes.items():
            object.__setattr__(module, name, value)
            value.copy_(snapshot.tensor_attribute_values[name])
        # A noise flag a switch added is removed; every flag it changed is put back.
        added = [
            name
            for name, value in vars(module).items()
            if _is_plain(value) and name not in snapshot.attributes and name not in _MODULE_INTERNALS
        ]
        for name in added:
            if "noise" in name.lower() or "noisy" in name.lower():
                delattr(module, name)
        for name, value in snapshot.attributes.items():
            object.__setattr__(module, name, value)
        # Only this layer's own mode: its children (if any) keep theirs.
        module.training = snapshot.training


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Put every random generator back as it was: other libraries' switches may draw noise."""
    python_state, numpy = random.getstate(), sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


@contextlib.contextmanager
def noise_disabled(module: _ModuleT) -> Iterator[_ModuleT]:
    """Make every noisy layer inside ``module`` deterministic; put everything back on exit.

    Inside the block each noisy layer computes with its mean weights:

    * this package's :class:`NoisyLinear`: :meth:`~NoisyLinear.disable_noise`;
    * any other module with ``disable_noise()`` / ``enable_noise()``: ``disable_noise()``;
    * layers that gate their noise on ``self.training`` (the TorchRL, Tianshou and CleanRL convention; found by a class
      name containing ``"Noisy"`` or tensors named like ``weight_epsilon`` / ``weight_sigma``): that layer alone, not
      the model, is put in eval mode, and its epsilon buffers are zeroed so that layers which add noise in every mode
      are covered too.

    On exit, also when the block raises, each layer's training flag, noise switch, plain attributes and buffers are
    restored exactly (buffers bit for bit, the same tensor objects; converted if the block moved or cast the model,
    ``model.to(...)``, which stays so). This package's :class:`NoisyLinear` changes its noise only in ``reset_noise()``,
    so its buffers are copied only when that is called inside the block (nothing is copied otherwise, and nothing is
    written back: a training step's saved tensors stay valid); write its noise inside the block only through
    ``reset_noise()``. Nothing else in the model is touched: dropout and batch-norm layers keep
    their mode. No random generator (torch CPU and CUDA, numpy, python) is advanced by entering or leaving, even when a
    third-party ``disable_noise()`` draws random numbers.

    Blocks nest: an inner block restores the state the outer one set.

    Args:
        module: The model (or a single layer). Wrappers such as DDP or ``torch.compile`` are looked through.

    Yields:
        ``module`` itself.

    Raises:
        TypeError: If ``module`` is not a ``torch.nn.Module``.

    Example::

        >>> model = torch.nn.Sequential(NoisyLinear(4, 8), torch.nn.ReLU(), NoisyLinear(8, 2))
        >>> with noise_disabled(model):
        ...     q1 = model(torch.ones(1, 4))
        ...     q2 = model(torch.ones(1, 4))
        >>> bool(torch.equal(q1, q2)) and model[0].noise_enabled
        True
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    layers = [layer for layer in module.modules() if is_noisy_layer(layer)]
    snapshots: list[_LayerSnapshot] = []
    try:
        # Snapshot everything before changing anything: a failure half-way still restores all.
        snapshots = [_snapshot(layer) for layer in layers]
        foreign_switches = [layer for layer in layers if not isinstance(layer, NoisyLinear) and _has_switch(layer)]
        for layer in layers:
            if isinstance(layer, NoisyLinear):
                # NoisyLinear.disable_noise() is this one assignment; made here, a run stays in this module
                layer._noise_enabled = False
        if foreign_switches:
            with _random_state_kept():
                for switch in foreign_switches:
                    switch.disable_noise()
        for layer in layers:
            if not isinstance(layer, NoisyLinear) and not _has_switch(layer):
                layer.training = False  # this layer only: children keep their mode
                with torch.no_grad():  # eps = 0: a layer that adds `sigma * eps` in any mode computes with its means
                    for name, buffer in layer.named_buffers(recurse=False):
                        if buffer.is_floating_point() and buffer.dim() and _EPSILON_NAME.search(name):
                            buffer.zero_()
        yield module
    finally:
        # Reverse order, so that a layer reached twice ends as it first was.
        for snapshot in reversed(snapshots):
            _restore(snapshot)


@contextlib.contextmanager
def attribution_mode(module: _ModuleT) -> Iterator[_ModuleT]:
    """The model as attribution needs it, and training's state untouched: everything put back on exit.

    Inside the block: every submodule in eval mode, noise off (:func:`noise_disabled`), gradients on even under
    ``torch.inference_mode()`` or ``torch.no_grad()``. On exit, also when the block raises: each submodule's
    training flag, the noise state and the random generators (python, numpy, torch CPU and CUDA) are as they
    were, so a run in the middle of training changes nothing that training would see.

    Args:
        module: The model.

    Yields:
        ``module`` itself.

    Raises:
        TypeError: If ``module`` is not a ``torch.nn.Module``.

    Example::

        with attribution_mode(pl_module):
            result = integrated_gradients(pl_module, states)
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    modes = [(submodule, submodule.training) for submodule in module.modules()]
    try:
        with _random_state_kept(), noise_disabled(module), torch.inference_mode(False), torch.enable_grad():
            module.train(False)
            yield module
    finally:
        for submodule, training in modes:
            submodule.training = training
