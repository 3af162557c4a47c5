"""What the trust checks share: how the run attributes, their inputs checked, the units compared, copies of a model.

Every check compares *units*: the features, or the groups when groups are in use (what the callback logs and a
user reads). A check takes this run's per-state attributions of the units, ``(B, G)`` (``IGResult.grouped(groups)``
or the attributions flattened to ``(B, F)``), on any device or as a numpy array.

Rank correlations are Spearman's rho (:func:`lightning_ig.run.statistics.spearman`, the package's one
Spearman) over the units that differ from the baseline in at least one of the states compared: IG gives every other
unit exactly 0 whatever the weights, and those shared zeros would make any two maps look alike. A correlation that
is undefined (fewer than two such units, a constant side, NaN/Inf) is NaN, and NaN never passes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.attribution import IGOptions, target_forward
from lightning_ig.attribution.eager import attribute_eager, deterministic_float32
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.attribution.targets import Target
from lightning_ig.run.statistics import spearman
from lightning_ig.vocabulary import shown, shown_with_type

__all__ = [
    "ROUNDING",
    "AttributionSettings",
    "ModelForward",
    "baselines_like",
    "check_model",
    "check_settings",
    "check_state_batch",
    "generators_kept",
    "host_units",
    "moved_units",
    "pick_states",
    "rank_correlation",
    "read",
    "resolve_groups",
    "shared_attributes",
    "state_subset",
    "structure_copy",
    "unit_sums",
]

ModelForward = Callable[[nn.Module, Tensor], Tensor]
"""``(module, x) -> output``: how a model is called (the callback's ``forward=callable(pl_module, x)``)."""

# Spearman over a few units takes a few exact values (0.8 and 0.9 over 4) that float arithmetic lands a few ulps
# either side of: a correlation within this of a bound counts as on it (not below a ceiling, at a floor).
ROUNDING = 64 * float(np.finfo(np.float64).eps)
_MODULE_STATE = frozenset(vars(nn.Module()))  # a module's own state (mode, hooks, parameters): never shared


@dataclass(frozen=True)
class AttributionSettings:
    """How the run attributed, so that a check can do it again on a copy of the model or under noise.

    Attributes:
        forward: ``(module, x) -> (N,) | (N, A)``; ``None`` (default) calls the module itself.
        target: what the engine attributes (``None``, ``"mean"``, an output index, a callable ``(N, A) -> (N,)``
            or a :class:`~lightning_ig.attribution.targets.Target` of these), as
            :func:`~lightning_ig.attribution.target_forward` takes it. Default ``"mean"``.
        options: the engine's :class:`~lightning_ig.attribution.IGOptions` (default: the engine's defaults);
            kept with ``check_finite=False``: the checks pass states the run has checked.

    Raises:
        TypeError: ``forward`` is neither ``None`` nor callable, a target of the wrong kind, or ``options`` is not
            an :class:`~lightning_ig.attribution.IGOptions`.
        ValueError: an unknown target.
    """

    forward: ModelForward | None = None
    target: Any = "mean"
    options: IGOptions = field(default_factory=IGOptions)

    def __post_init__(self) -> None:
        if self.forward is not None and not callable(self.forward):
            raise TypeError(f"forward must be None or a callable (module, x) -> output, got {shown(self.forward)}")
        if not isinstance(self.options, IGOptions):
            raise TypeError(f"options must be an IGOptions, got {shown_with_type(self.options)}")
        object.__setattr__(self, "target", Target.parse(self.target))
        object.__setattr__(self, "options", dataclasses.replace(self.options, check_finite=False))

    def call(self, model: nn.Module) -> Callable[[Tensor], Tensor]:
        """The forward on ``model``: ``x -> output``."""
        forward = self.forward
        return model if forward is None else lambda x: forward(model, x)

    def value(self, model: nn.Module) -> Callable[[Tensor], Tensor]:
        """The attributed scalar per state on ``model``: ``x (N, ...) -> (N,)``."""
        return target_forward(self.call(model), self.target)

    def attribute(self, model: nn.Module, states: Tensor, baselines: Tensor) -> Tensor:
        """IG of ``model`` as it is (put it in the mode to attribute first): ``(B, *feature_shape)`` attributions."""
        # a noisy copy is deterministic between its draws: no warning
        with stochastic_warnings_silenced(), torch.inference_mode(False), torch.enable_grad(), deterministic_float32():
            result = attribute_eager(self.call(model), states, baselines, self.options, self.target)
        return result.attributions


def check_model(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {shown_with_type(model)}")
    return model


def check_settings(settings: Any) -> AttributionSettings:
    if settings is None:
        return AttributionSettings()
    if not isinstance(settings, AttributionSettings):
        raise TypeError(f"settings must be an AttributionSettings or None, got {type(settings).__name__}")
    if settings.target.every_output:  # the callback checks such runs through "mean" (IG is linear in the target)
        raise ValueError("target='each' cannot be checked (a map per action): pass target='mean', their average")
    return settings


def check_state_batch(states: Any) -> Tensor:
    """A floating-point tensor ``(B >= 1, *feature_shape)``; its values are not read (no host sync: the run's
    states were checked for NaN/Inf when they were set up)."""
    if not isinstance(states, Tensor) or not states.is_floating_point():
        kind = f"a tensor of dtype {states.dtype}" if isinstance(states, Tensor) else type(states).__name__
        raise TypeError(f"states must be a floating-point torch.Tensor (B, *feature_shape), got {kind}")
    if states.ndim < 2 or states.shape[0] == 0 or states[0].numel() == 0:
        raise ValueError(f"states must have shape (B >= 1, *feature_shape) with features, got {tuple(states.shape)}")
    return states


def baselines_like(baselines: Any, states: Tensor) -> Tensor:
    """``None``/``"zeros"``, ``"mean"``, a number or a tensor that broadcasts to the states: ``(B, *feature_shape)``."""
    if baselines is None or (isinstance(baselines, str) and baselines == "zeros"):
        return torch.zeros_like(states)
    if isinstance(baselines, str) and baselines == "mean":
        return states.mean(dim=0, keepdim=True).expand_as(states)
    if isinstance(baselines, (int, float)) and not isinstance(baselines, bool):
        return torch.full_like(states, float(baselines))
    if not isinstance(baselines, Tensor):
        raise TypeError(f"baselines must be None, 'zeros', 'mean', a number or a tensor, got {shown(baselines)}")
    try:
        return baselines.to(device=states.device, dtype=states.dtype).expand_as(states)
    except RuntimeError:
        raise ValueError(
            f"baselines of shape {tuple(baselines.shape)} do not fit states of shape {tuple(states.shape)}; pass "
            "(*feature_shape) or (B, *feature_shape)"
        ) from None


def resolve_groups(groups: Any, states: Tensor) -> FeatureGroups | None:
    """``None`` (the features) or the groups of the states' feature shape."""
    if groups is None or isinstance(groups, FeatureGroups):
        if groups is not None and tuple(groups.feature_shape) != tuple(states.shape[1:]):
            raise ValueError(
                f"groups are for feature shape {groups.feature_shape}, the states have {tuple(states.shape[1:])}"
            )
        return groups
    return FeatureGroups.resolve(groups, tuple(states.shape[1:]))


def unit_sums(values: Tensor, groups: FeatureGroups | None) -> Tensor:
    """``(B, *feature_shape)`` -> ``(B, G)``: per feature, or summed per group (float32 at least)."""
    if groups is None:
        return values.reshape(values.shape[0], -1).to(torch.promote_types(values.dtype, torch.float32))
    return groups.sum(values)


def host_units(units: Any, states: Tensor, groups: FeatureGroups | None, what: str = "units") -> np.ndarray:
    """This run's per-state unit attributions, checked, as float64 numpy ``(B, G)`` (a host read if on a device)."""
    count = states[0].numel() if groups is None else len(groups)
    if isinstance(units, Tensor):
        units = units.detach().to("cpu", torch.float64).numpy()
    if not isinstance(units, np.ndarray) or not np.issubdtype(units.dtype, np.number):
        raise TypeError(f"{what} must be a tensor or a numeric numpy array (B, G), got {shown_with_type(units)}")
    if units.shape != (states.shape[0], count):
        kind = f"{count} features" if groups is None else f"{count} groups"
        raise ValueError(
            f"{what} of shape {units.shape} do not match {states.shape[0]} states of {kind}; pass this run's "
            "attributions per unit: IGResult.grouped(groups), or the attributions flattened to (B, F)"
        )
    return units.astype(np.float64, copy=False)


def moved_units(states: Tensor, baselines: Tensor, groups: FeatureGroups | None) -> Tensor:
    """Bool ``(B, G)``: the feature (a member of the group) differs from the baseline in that state."""
    differs = (states != baselines).reshape(states.shape[0], -1)
    return differs if groups is None else groups.sum(differs.to(torch.float32)) > 0


@contextlib.contextmanager
def generators_kept(module: nn.Module, device: torch.device | None = None) -> Iterator[None]:
    """torch's global generators of the CPU and of every CUDA device ``module`` is on (and ``device``, where training
    will run: at set-up the model is still on the CPU) (:func:`torch.random.fork_rng`), Python's and numpy's are put
    back on exit: a forward inside that samples, even in eval mode, draws nothing that training would have drawn."""
    on = [t.device for t in module.parameters()] + ([device] if device is not None else [])
    devices = sorted({d.index or 0 for d in on if d.type == "cuda"})
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices, device_type="cuda"):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def pick_states(count: int | None, total: int, device: torch.device | str = "cpu") -> Tensor:
    """Indices of ``count`` states spread evenly over ``total`` (all of them for ``None``): the same every run.

    Made on ``device`` itself: a copy of CPU indices to a GPU would be a host sync.
    """
    if count is None or count >= total:
        return torch.arange(total, device=device)
    return torch.linspace(0, total - 1, count, device=device).round().long()


def state_subset(states: Tensor, baselines: Any, index: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """The states at ``index`` (CPU indices, moved to the states' device without a host sync), their baselines, and
    the baselines as an engine takes them: ``None`` for zeros (its fast path replays without a baseline copy)."""
    on_device = index.to(states.device, non_blocking=True)
    subset = states.detach().index_select(0, on_device)
    if baselines is None or (isinstance(baselines, str) and baselines == "zeros"):
        return subset, torch.zeros_like(subset), None
    base = baselines_like(baselines, states).detach().index_select(0, on_device)
    return subset, base, base


def read(*values: Tensor) -> np.ndarray:
    """The one host read of a check: its small device results, flattened and joined, as float64 numpy."""
    return torch.cat([value.detach().reshape(-1) for value in values]).to(torch.float64).cpu().numpy()  # promoted


def rank_correlation(first: np.ndarray, second: np.ndarray, include: np.ndarray) -> float:
    """Spearman's rho of ``first`` and ``second`` (``(G,)`` each) over the entries in ``include``; NaN if undefined."""
    a, b = first[include], second[include]
    return math.nan if a.size < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()) else spearman(a, b)


def structure_copy(model: nn.Module) -> nn.Module:
    """A deep copy of the module tree: parameters, buffers, submodules and a module's own ``torch.Generator`` (with its
    state) copied; every other attribute (a replay buffer, an environment, the trainer) shared, never copied. No
    gradients: IG differentiates the inputs only.

    A method of a module of the tree kept as an attribute (under DDP, Lightning sets the LightningModule's
    ``forward`` as an instance attribute) is bound to the copy's module instead: shared, the copy would call the
    original's weights; a ``forward`` wrapper of another kind (``torch.compile``'s) gives way to the class's. A
    TorchScript module (``torch.jit.script``, ``torch.jit.trace``) holds its weights in its C++ module: copied whole,
    never shared (shared, the copy's ``requires_grad_(False)`` would freeze the model's own weights)."""
    tree = {id(module) for module in model.modules()}
    memo: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, torch.jit.ScriptModule):
            continue  # its state is its C++ module (``_c``), which its own ``__deepcopy__`` copies
        for name, value in vars(module).items():
            bound_here = isinstance(value, types.MethodType) and id(value.__self__) in tree
            if isinstance(value, torch.Generator):  # a layer's own draws (its reset_parameters'): the copy's own
                memo[id(value)] = torch.Generator(value.device).set_state(value.get_state())
            elif name not in _MODULE_STATE and not isinstance(value, nn.Module) and not bound_here:
                memo[id(value)] = value
            for hook in value.values() if name.endswith("hooks") and isinstance(value, dict) else ():
                owner = getattr(getattr(hook, "func", hook), "__self__", None)  # a method, or a partial of one
                if owner is not None and id(owner) not in tree:  # another object's (a profiler's): shared
                    memo[id(owner)] = owner
    with torch.inference_mode(False), torch.no_grad():  # a copy made in inference mode could not be differentiated
        clone = copy.deepcopy(model, memo)
    for theirs, mine in zip(model.modules(), clone.modules(), strict=True):
        if isinstance(getattr(type(theirs), "trainer", None), property):  # a LightningModule's pickled state drops
            with contextlib.suppress(RuntimeError, AttributeError):  # its trainer: shared through the public property
                mine.trainer = theirs.trainer
        wrapper = vars(mine).get("forward")  # fit(torch.compile(model)): Lightning sets a wrapper of the original's
        if isinstance(wrapper, types.FunctionType) and type(mine).forward is not nn.Module.forward:
            del vars(mine)["forward"]  # bound forward, which computes with the original's weights: the class's
    for parameter in clone.parameters():
        parameter.grad = None
    return clone.requires_grad_(False)


def shared_attributes(model: nn.Module, clone: nn.Module) -> list[tuple[nn.Module, nn.Module, str]]:
    """``(module, copy, name)`` for each plain attribute ``clone`` (:func:`structure_copy`) shares with ``model``."""
    return [
        (theirs, mine, name)
        for theirs, mine in zip(model.modules(), clone.modules(), strict=True)
        for name, value in vars(theirs).items()
        if name not in _MODULE_STATE and vars(mine).get(name) is value and not isinstance(value, nn.Module)
    ]
