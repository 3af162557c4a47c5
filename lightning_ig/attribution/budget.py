"""The defaults resolved for a call: ``n_steps="budget"`` (points from the size of the work) and ``method="auto"``.

Points buy accuracy on a ReLU network, and their cost depends on the device, so the engine counts the work, never
times it: the forward's multiply-adds on one state (counted once per forward, feature shape, dtype and device), times
the states, times the passes per node. ``n_steps`` is the largest of :data:`STEP_CHOICES` whose work fits the
device's :class:`Profile`, the smallest when none does or nothing could be counted. ``method="auto"`` is then the kink
rule at :data:`KINK_LIMIT` points or fewer with autograd (``"budget"``: 7/8 of the points, the certificate's rows the
rest: :data:`~lightning_ig.attribution.kinks.BUDGET_NODES` for 64), else the midpoint rule. How the work is counted,
and the profiles: ``docs/trust.md``.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor
from torch.nn.utils import parametrize

from lightning_ig.attribution.inputs import Prepared, RunningStatistics, raise_if_dtype_mismatch
from lightning_ig.attribution.kinks import BUDGET_NODES
from lightning_ig.attribution.settings import BUDGET, IGOptions
from lightning_ig.vocabulary import AUTO_METHOD, KINK_METHOD

__all__ = ["KINK_LIMIT", "PROFILES", "STEP_CHOICES", "Profile", "budget_steps", "resolve_budget", "row_flops"]

STEP_CHOICES = (256, 128, 64)
"""The numbers of points ``n_steps="budget"`` picks from, largest first."""

KINK_LIMIT = 128
"""``method="auto"`` is the kink rule at this many points or fewer, the midpoint rule (better read) above."""


class Profile(NamedTuple):
    """A kind of device's budget: the work (2 x multiply-adds) a call may spend per node count."""

    name: str  # as docs/trust.md lists it
    flops: float  # the work the device runs in about the fixed cost of one call
    multiprocessors: int = 0  # a GPU's budget scales with its multiprocessors against this many (0: fixed)


PROFILES = {"cuda": Profile("h200", 48e9, 132), "cpu": Profile("cpu", 1e8)}
"""The profile per device type (any device that is not CUDA uses ``"cpu"``)."""

_FLOPS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[int, int]]] = weakref.WeakKeyDictionary()


def resolve_budget(forward: Callable[[Tensor], Tensor], prepared: Prepared, settings: IGOptions) -> IGOptions:
    """``settings`` with ``n_steps="budget"`` and ``method="auto"`` replaced by what they come to for ``prepared``'s
    states (``settings`` itself when neither is given); ``n_steps="auto"`` keeps its name and starts from the kink
    rule (the midpoint rule with finite differences)."""
    n_steps, method = settings.n_steps, settings.method
    if n_steps == BUDGET:
        row = prepared.x[:1].view(1, *prepared.feature_shape)
        fd = settings.gradient == "finite_difference"
        n_steps = budget_steps(forward, row, prepared.x.shape[0], each=prepared.spec.every_output, finite_difference=fd)
    if method == AUTO_METHOD:
        kinks = settings.gradient == "autograd" and (n_steps == "auto" or int(n_steps) <= KINK_LIMIT)
        method = KINK_METHOD if kinks else "riemann_middle"
    if settings.n_steps == BUDGET and method == KINK_METHOD:
        n_steps = BUDGET_NODES * int(n_steps) // STEP_CHOICES[-1]
    if (n_steps, method) == (settings.n_steps, settings.method):
        return settings
    return dataclasses.replace(settings, n_steps=n_steps, method=method)


def budget_steps(
    forward: Callable[[Tensor], Tensor], row: Tensor, batch: int, *, each: bool, finite_difference: bool
) -> int:
    """The ``n_steps`` of ``n_steps="budget"`` for ``batch`` states like ``row``.

    Args:
        forward: the model (called once on two copies of ``row`` the first time, under ``no_grad``; the buffers of
            layers in train mode, batch-norm's running statistics among them, are put back).
        row: ``(1, *feature_shape)`` one state, on the device and in the dtype of the run.
        batch: how many states the call attributes.
        each: ``target="each"`` (one backward per output).
        finite_difference: ``gradient="finite_difference"`` (``2 F`` forwards per node, no backward).
    """
    flops, outputs = row_flops(forward, row)
    if flops == 0:
        return STEP_CHOICES[-1]
    node = flops * (2 * row[0].numel() if finite_difference else 1 + (outputs if each else 1)) * batch
    profile = PROFILES["cuda" if row.device.type == "cuda" else "cpu"]
    budget = profile.flops
    if profile.multiprocessors:
        budget *= torch.cuda.get_device_properties(row.device).multi_processor_count / profile.multiprocessors
    return next((n for n in STEP_CHOICES if n * node <= budget), STEP_CHOICES[-1])


def row_flops(forward: Callable[[Tensor], Tensor], row: Tensor) -> tuple[int, int]:
    """``(multiply-adds x 2 of one forward row, the forward's output width A)``, counted once and remembered per
    forward, feature shape, dtype and device (see the module docstring)."""
    owner = getattr(forward, "__self__", forward)  # a bound method is a new object at every access: key its owner
    key = (getattr(forward, "__func__", None), tuple(row.shape[1:]), row.dtype, row.device)
    try:
        known = _FLOPS.setdefault(owner, {})
    except TypeError:  # not weakly referable: counted every time
        known = {}
    if key not in known:
        known[key] = _count(forward, row)
    return known[key]


def _count(forward: Callable[[Tensor], Tensor], row: Tensor) -> tuple[int, int]:
    total = 0

    def hook(module: torch.nn.Module, _args: Any, output: Any) -> None:
        nonlocal total
        if isinstance(module, parametrize.ParametrizationList):  # makes a weight (weight_norm's), not a layer's output
            return
        weights = [p for p in module.parameters(recurse=False) if p.dim() >= 2]
        if parametrize.is_parametrized(module):  # its weight is made by a parametrization: counted as the layer's
            names = cast(torch.nn.ModuleDict, module.parametrizations)
            weights += [value for name in names if (value := getattr(module, name)).dim() >= 2]
        out = output[0] if isinstance(output, (tuple, list)) else output
        if weights and isinstance(out, Tensor):
            largest = max(weights, key=lambda p: p.numel())
            total += 2 * largest.numel() * (out.numel() // max(1, largest.shape[0]))

    pair = torch.cat([row, row])  # two rows (batch-norm in train mode refuses one), a copy a forward may view or change
    statistics = RunningStatistics(forward)
    saved = statistics.save()
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        with torch.no_grad():
            output = forward(pair)
    except RuntimeError as error:
        raise_if_dtype_mismatch(forward, row, error)
        raise
    finally:
        handle.remove()
        statistics.restore(saved)
    width = output.shape[1] if isinstance(output, Tensor) and output.dim() == 2 else 1
    return total // 2, width
