"""``n_steps="budget"`` (the default): the number of quadrature points chosen from the size of the work.

On ReLU networks every fixed rule is first order, so points are what buy accuracy: 64 midpoint nodes leave 1-3%
on the worst states of small trained agents, 256 leave 0.3-0.7% (``docs/trust.md``). What points cost depends on
the device: a GPU runs a small network's path at the cost of its launches whatever the rows (on an H200, 256
nodes of a CartPole or MinAtar network on 64 states cost about what 50 did), while a CPU or a large network pays
per row. So the engine counts the work, it does not time it (a choice from timings would differ from call to
call and machine to machine):

* the forward's multiply-adds on one state, counted once per forward, feature shape and dtype: every module the
  forward calls whose largest parameter has two or more dimensions (``Linear``, ``Conv*``, this package's
  ``NoisyLinear``, ...) adds ``2 x that parameter's elements x the output positions`` (elements of its output per
  output channel): a Linear layer ``2 in out``, a Conv2d ``2 (C_in / groups) k_h k_w C_out H_out W_out``;
* the work of one node: that count times the states times ``1 + T`` (a forward and one backward per target,
  ``T = A`` for ``target="each"``), or times ``2 F`` probes for finite differences;
* ``n_steps`` = the largest of :data:`STEP_CHOICES` (256, 128, 64) whose work fits :func:`budget_flops` of the
  device: :data:`CUDA_BUDGET_FLOPS` scaled by the GPU's multiprocessors against an H200's 132, or
  :data:`CPU_BUDGET_FLOPS`; 64 when even that does not fit, and when the forward calls no module with a weight
  (the work cannot be counted).

On an H200 this gives 256 nodes to 64 or 256 states of the CartPole and MinAtar networks, 128 to 8 Nature-CNN
states and 64 to 32 of them; on a CPU, 64 to anything larger than a few CartPole states.
The budgets are the work each device does in about the fixed cost of one call (an H200's launches: ~2.5 ms at
~6 TFLOP/s effective; a CPU's Python and small operations: a few ms at a few tens of GFLOP/s).
The choice is deterministic for a forward, a batch size and a device, and it is the result's
:attr:`~lightning_ig.attribution.IGResult.n_steps` (and the report's ``num_steps``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_ig.attribution.inputs import Prepared, RunningStatistics, raise_if_dtype_mismatch
from lightning_ig.attribution.settings import BUDGET, IGOptions

__all__ = [
    "CPU_BUDGET_FLOPS",
    "CUDA_BUDGET_FLOPS",
    "STEP_CHOICES",
    "budget_flops",
    "budget_steps",
    "resolve_budget",
    "row_flops",
]

STEP_CHOICES = (256, 128, 64)
"""The numbers of points ``n_steps="budget"`` picks from, largest first (powers of two: the midpoint rule of
``2 n`` nodes is not nested in that of ``n``, but every choice is a whole rule of its own)."""

CUDA_BUDGET_FLOPS = 48e9
"""Multiply-adds (x2) per call that an H200 (132 multiprocessors) runs in not much more than the time its launches
take: 256 nodes x 256 states of the MinAtar network (44e9) and 128 nodes x 8 Nature-CNN states (44e9) fit, 64 nodes
x 32 Nature-CNN states (88e9) does not. Measured on an H200 (bench_trust, 8 Nature-CNN states): 128 nodes took
1.11-1.15x the time of 50 Gauss-Legendre nodes, 256 nodes 1.14-1.32x."""

CPU_BUDGET_FLOPS = 1e8
"""The same on a CPU (a few milliseconds of one core, about a call's own overhead there): every row costs, so a
CartPole network's batch of 16 or more states gets 64 nodes, and only work the size of a unit test more."""

_H200_MULTIPROCESSORS = 132
_FLOPS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], int]] = weakref.WeakKeyDictionary()


def resolve_budget(forward: Callable[[Tensor], Tensor], prepared: Prepared, settings: IGOptions) -> IGOptions:
    """``settings`` with ``n_steps="budget"`` replaced by the number :func:`budget_steps` picks for ``prepared``'s
    states (``settings`` itself otherwise)."""
    if settings.n_steps != BUDGET:
        return settings
    row = prepared.x[:1].view(1, *prepared.feature_shape)
    n = budget_steps(
        forward,
        row,
        prepared.x.shape[0],
        each=prepared.spec.every_output,
        finite_difference=settings.gradient == "finite_difference",
    )
    return dataclasses.replace(settings, n_steps=n)


def budget_flops(device: torch.device) -> float:
    """The work per call :func:`budget_steps` allows on ``device`` (see the module docstring)."""
    if device.type == "cuda":
        multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
        return CUDA_BUDGET_FLOPS * multiprocessors / _H200_MULTIPROCESSORS
    return CPU_BUDGET_FLOPS


def budget_steps(
    forward: Callable[[Tensor], Tensor],
    row: Tensor,
    batch: int,
    *,
    each: bool,
    finite_difference: bool,
) -> int:
    """The ``n_steps`` of ``n_steps="budget"`` for ``batch`` states like ``row``.

    Args:
        forward: the model (called once on two copies of ``row`` the first time, under ``no_grad``; the running
            statistics of batch-norm layers in train mode are put back).
        row: ``(1, *feature_shape)`` one state, on the device and in the dtype of the run.
        batch: how many states the call attributes.
        each: ``target="each"`` (one backward per output).
        finite_difference: ``gradient="finite_difference"`` (``2 F`` forwards per node, no backward).
    """
    flops, outputs = row_flops(forward, row)
    if flops == 0:
        return STEP_CHOICES[-1]
    per_row = flops * (2 * row[0].numel() if finite_difference else 1 + (outputs if each else 1))
    node = per_row * batch
    budget = budget_flops(row.device)
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
        weights = [p for p in module.parameters(recurse=False) if p.dim() >= 2]
        out = output[0] if isinstance(output, (tuple, list)) else output
        if weights and isinstance(out, Tensor):
            largest = max(weights, key=lambda p: p.numel())
            total += 2 * largest.numel() * (out.numel() // max(1, largest.shape[0]))

    pair = row.expand(2, *row.shape[1:])  # two rows: batch-norm in train mode refuses one
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
