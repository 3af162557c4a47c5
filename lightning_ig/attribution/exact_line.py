"""High-resolution references to check the engine against: :func:`exact_line` and :func:`midpoint_reference`.

Along the IG line ``b + alpha (x - b)`` a network of ``Linear``/``Conv2d``/``ReLU``/``Flatten`` (and the package's
dueling heads, ``NoisyLinear`` in eval mode) is piecewise linear. :func:`exact_line` (ExactLine, Sotoudeh & Thakur
2019) walks each state's line region by region: one forward-mode pass at a region's start gives every ReLU's
pre-activation ``z`` and ``dz/dalpha``, affine inside the region, so the region ends at the first zero ahead, and one
gradient inside it is the region's. The integral is exact up to float64 rounding, at two passes per region (thousands
of gradients per state on a conv net): a ground truth for ``lightning-ig diag --verify``, never a default. Its
self-check is completeness: a non-linearity its hooks cannot see (``F.relu`` inside a ``forward``) leaves kinks inside
"regions", and it raises :class:`ExactLineError` rather than return a wrong "truth".

:func:`midpoint_reference` (``>= 8192`` float64 midpoint steps; how far from the exact line: ``docs/trust.md``) is the
fallback for every other network; :func:`reference` picks the exact line where it applies.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_ig.attribution.targets import Target, choose_contrast

__all__ = [
    "MAX_REGIONS",
    "MIN_REFERENCE_STEPS",
    "ExactLineError",
    "Reference",
    "UnsupportedModelError",
    "exact_line",
    "midpoint_reference",
    "reference",
]

MIN_REFERENCE_STEPS = 8192
"""The fewest midpoint steps :func:`midpoint_reference` accepts: fewer is not a reference."""
MAX_REGIONS = 1_000_000
"""The most activation regions one walk of :func:`exact_line` crosses before it gives up (:class:`ExactLineError`)."""

# Leaf modules whose composition is piecewise linear (ReLU) or linear; containers (Sequential, the package's
# networks) only wire them, and a container's own arithmetic is checked by completeness after the walk.
_LINEAR_LEAVES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d, nn.Flatten, nn.Identity, nn.Unflatten)
_LINEAR_LEAF_NAMES = ("NoisyLinear",)  # the package's, by name: this module imports nothing from models/

# A walk's relative completeness |sum(a) - dF| / max(1, |F(x)|, |F(b)|) is ~1e-13 when exact; a kink missed inside
# a region costs its jump times its offset, orders of magnitude more. Regions shorter than _NUDGE are stepped over
# (their weight is below _NUDGE x the jump), which is what the bound leaves room for.
_NUDGE = 1e-9
_SELF_CHECK = 1e-7


class UnsupportedModelError(ValueError):
    """The network holds a module :func:`exact_line` cannot walk; use :func:`midpoint_reference` instead."""


class ExactLineError(ValueError):
    """The exact line's self-check failed: the network has a non-linearity its hooks did not see."""


@dataclass(frozen=True)
class Reference:
    """A reference attribution: float64 on the host, in the states' shape.

    Attributes:
        attributions: ``(B, *feature_shape)`` (``(A, B, *feature_shape)`` for ``target="each"``), float64.
        f_input: ``(B,)`` (``(A, B)``) the target at the states.
        f_baseline: ``(B,)`` (``(A, B)``) the target at the baselines.
        method: ``"exact_line"`` or ``"midpoint:<n>"``.
        completeness: ``(B,)`` (``(A, B)``) ``|sum(a) - (F(x) - F(b))| / max(1, |F(x)|, |F(b)|)``.
        regions: ``(B,)`` (``(A, B)``) int64, the linear regions each state's line crossed (exact line), or
            ``None`` (midpoint).
        gradients: gradient evaluations spent, all states together.
        seconds: wall time.
    """

    attributions: Tensor
    f_input: Tensor
    f_baseline: Tensor
    method: str
    completeness: Tensor
    regions: Tensor | None
    gradients: int
    seconds: float


# -------------------------------------------------- targets: (N, A) outputs of rows belonging to states `rows` -> (N,)

_RowTarget = Callable[[Tensor, Tensor], Tensor]


def _row_targets(target: Any, pairs: Tensor | None, model: nn.Module, states: Tensor) -> list[_RowTarget]:
    """One row-target per attributed scalar: a list of one, or of ``A`` for ``"each"`` (every output)."""
    checked = Target.parse(target).on(len(states), states.device)
    if checked.contrasts:
        if pairs is None:
            with torch.no_grad():
                pairs = choose_contrast(model(states), len(states))
        checked = dataclasses.replace(checked, rows=pairs.to(device=states.device, dtype=torch.long))
    count = 1
    if checked.every_output:
        with torch.no_grad():
            count = model(states[:1]).shape[1]
    return [functools.partial(_column, checked, k) for k in range(count)]


def _column(target: Target, k: int, outputs: Tensor, rows: Tensor) -> Tensor:
    return target.select(outputs, outputs.shape[0], lambda: rows)[:, k]


def _prepared(model: nn.Module, states: Tensor, baselines: Tensor | None) -> tuple[nn.Module, Tensor, Tensor]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(states, Tensor) or states.dim() < 2 or not states.dtype.is_floating_point:
        shape = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
        raise ValueError(f"states must be a floating-point tensor (B, *feature_shape), got {shape}")
    if baselines is None:
        baselines = torch.zeros_like(states)
    baselines = baselines.expand_as(states) if baselines.shape != states.shape else baselines
    double = copy.deepcopy(model).double().eval()  # eval: NoisyLinear computes with its mean weights
    for parameter in double.parameters():
        parameter.requires_grad_(False)
    return double, states.detach().double(), baselines.detach().double().contiguous()


def _check_walkable(model: nn.Module) -> list[nn.Module]:
    """The model's ``nn.ReLU`` modules; :class:`UnsupportedModelError` for any leaf that is not linear or ReLU."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    relus: list[nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ReLU):
            relus.append(module)
        elif list(module.children()):
            continue  # a container: its arithmetic is checked by completeness
        elif not (isinstance(module, _LINEAR_LEAVES) or type(module).__name__ in _LINEAR_LEAF_NAMES):
            raise UnsupportedModelError(
                f"exact_line walks networks of Linear/Conv2d/ReLU/Flatten (NoisyLinear in eval); module "
                f"{name or 'model'!r} is a {type(module).__name__}: use midpoint_reference (>= "
                f"{MIN_REFERENCE_STEPS} float64 midpoint steps), which works for any network"
            )
    return relus


# ------------------------------------------------------------------------------------------------------ the exact line


def exact_line(
    model: nn.Module,
    states: Tensor,
    baselines: Tensor | None = None,
    *,
    target: Any = "mean",
    pairs: Tensor | None = None,
) -> Reference:
    """Exact IG of a piecewise-linear network on each state, by walking its activation regions along the line.

    Args:
        model: a network of ``Linear``/``Conv2d``/``ReLU``/``Flatten`` (and ``NoisyLinear``, used in eval mode
            with its mean weights); a float64 copy is walked, the model is left as it is.
        states: ``(B, *feature_shape)``.
        baselines: the same shape (or broadcastable); zeros by default.
        target: as for :func:`~lightning_ig.attribution.integrated_gradients` (an index also as ``"action:N"``);
            ``"contrast"``'s greedy and runner-up are ``pairs`` or chosen again in float64.
        pairs: ``(B, 2)`` the contrast's greedy and runner-up outputs (an ``IGResult.target_actions``), so the
            reference attributes the same difference as the run it checks.

    Returns:
        The :class:`Reference`, ``method="exact_line"``.

    Raises:
        TypeError: ``model`` is not a module.
        UnsupportedModelError: a leaf module that is neither linear nor ``nn.ReLU``.
        ExactLineError: the self-check by completeness failed (a non-linearity the walk cannot see), or the walk
            passed :data:`MAX_REGIONS`.

    Example::

        truth = exact_line(q_network, states, target="mean")
        error = (result.attributions - truth.attributions).abs().flatten(1).sum(1) / truth.attributions.abs()...
    """
    relus = _check_walkable(model)
    double, xs, bs = _prepared(model, states, baselines)
    started = time.perf_counter()
    targets = _row_targets(target, pairs, double, xs)
    by_name, names = dict(double.named_modules()), {id(module): name for name, module in model.named_modules()}
    copies = [by_name[names[id(relu)]] for relu in relus]  # the float64 copy's ReLUs, in the order of the model's
    walks = [_walk(double, copies, xs, bs, one) for one in targets]
    return _stacked(walks, Target.parse(target).every_output, "exact_line", time.perf_counter() - started)


def _walk(model: nn.Module, relus: list[nn.Module], xs: Tensor, bs: Tensor, target: _RowTarget) -> dict[str, Any]:
    batch, feature_shape = xs.shape[0], tuple(xs.shape[1:])
    xf, bf = xs.reshape(batch, -1), bs.reshape(batch, -1)
    diff = xf - bf
    captured: list[tuple[Tensor, Tensor]] = []

    def hook(_module: nn.Module, inputs: tuple[Tensor, ...]) -> None:  # before the ReLU: ReLU(inplace=True) clips it
        primal, tangent = torch.autograd.forward_ad.unpack_dual(inputs[0])
        rows = primal.shape[0]
        tangent = torch.zeros_like(primal) if tangent is None else tangent
        captured.append((primal.reshape(rows, -1).clone(), tangent.reshape(rows, -1).clone()))

    handles = [relu.register_forward_pre_hook(hook) for relu in relus]
    integral = torch.zeros_like(xf)
    alpha = torch.zeros(batch, dtype=torch.float64, device=xf.device)
    regions = torch.zeros(batch, dtype=torch.long, device=xf.device)
    gradients = 0
    try:
        for _ in range(MAX_REGIONS):
            active = (alpha < 1.0).nonzero().squeeze(1)
            if active.numel() == 0:
                break
            probe = torch.clamp(alpha[active] + _NUDGE, max=1.0)
            point = bf[active] + probe.unsqueeze(1) * diff[active]
            captured.clear()
            with torch.no_grad(), torch.autograd.forward_ad.dual_level():
                dual = torch.autograd.forward_ad.make_dual(
                    point.view(-1, *feature_shape), diff[active].view(-1, *feature_shape)
                )
                model(dual)
            end = torch.ones_like(probe)
            if captured:
                z = torch.cat([p for p, _ in captured], 1)
                dz = torch.cat([t for _, t in captured], 1)
                ahead = -z / torch.where(dz != 0, dz, torch.ones_like(dz))
                ahead = torch.where((dz != 0) & (ahead > 0), ahead, torch.full_like(ahead, math.inf))
                end = torch.clamp(probe + ahead.min(1).values, max=1.0)
            end = torch.maximum(end, probe)
            middle = (alpha[active] + end) / 2
            mid_point = (bf[active] + middle.unsqueeze(1) * diff[active]).requires_grad_(True)
            with torch.enable_grad():
                out = target(model(mid_point.view(-1, *feature_shape)), active)
                (grad,) = torch.autograd.grad(out.sum(), mid_point)
            gradients += active.numel()
            integral[active] += (end - alpha[active]).unsqueeze(1) * grad
            regions[active] += 1
            alpha[active] = end
        else:
            raise ExactLineError(
                f"the exact line passed {MAX_REGIONS} regions on some state; use midpoint_reference (or reference)"
            )
    finally:
        for handle in handles:
            handle.remove()
    walked = {**_ends(model, xs, bs, target, diff * integral), "regions": regions, "gradients": gradients}
    if not (worst := float(walked["completeness"].max())) <= _SELF_CHECK:  # NaN fails too
        state = int(walked["completeness"].argmax())
        raise ExactLineError(
            f"the exact line's self-check failed: its regions integrate to F(x) - F(b) only to {worst:.3g} (state "
            f"{state}; exact is ~1e-13): the network has a non-linearity its nn.ReLU hooks do not see (F.relu or "
            "another activation inside a forward); use midpoint_reference"
        )
    return walked


def _ends(model: nn.Module, xs: Tensor, bs: Tensor, target: _RowTarget, attributions: Tensor) -> dict[str, Any]:
    """A walk's ``(B, F)`` attributions in the states' shape, the target at both ends, each state's completeness."""
    rows = torch.arange(xs.shape[0], device=xs.device)
    with torch.no_grad():
        f_b, f_x = target(model(bs), rows), target(model(xs), rows)
    scale = torch.maximum(torch.maximum(f_x.abs(), f_b.abs()), torch.ones_like(f_x))
    return {
        "attributions": attributions.view_as(xs),
        "f_input": f_x,
        "f_baseline": f_b,
        "completeness": (attributions.sum(1) - (f_x - f_b)).abs() / scale,
    }


def _stacked(walks: list[dict[str, Any]], each: bool, method: str, seconds: float) -> Reference:
    def field(name: str) -> Tensor | None:
        values = [walk[name] for walk in walks]
        return None if values[0] is None else (torch.stack(values) if each else values[0]).cpu()

    tensors = {name: field(name) for name in ("attributions", "f_input", "f_baseline", "completeness", "regions")}
    gradients = sum(walk["gradients"] for walk in walks)
    return Reference(**tensors, method=method, gradients=gradients, seconds=seconds)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- the midpoint fallback


def midpoint_reference(
    model: nn.Module,
    states: Tensor,
    baselines: Tensor | None = None,
    *,
    target: Any = "mean",
    pairs: Tensor | None = None,
    n_steps: int = MIN_REFERENCE_STEPS,
    chunk_rows: int = 8192,
) -> Reference:
    """IG with ``n_steps`` midpoint steps, the model and the sums in float64: a reference for any network.

    Args:
        model: any module; a float64 copy in eval mode runs.
        states: ``(B, *feature_shape)``.
        baselines: the same shape (or broadcastable); zeros by default.
        target: as :func:`exact_line`.
        pairs: as :func:`exact_line`.
        n_steps: at least :data:`MIN_REFERENCE_STEPS`.
        chunk_rows: rows per forward (memory ``chunk_rows x F``).

    Raises:
        TypeError: ``model`` is not a module, or ``n_steps`` not an int.
        ValueError: ``n_steps < MIN_REFERENCE_STEPS`` or ``chunk_rows < 1``.
    """
    if not isinstance(n_steps, int) or isinstance(n_steps, bool):
        raise TypeError(f"n_steps must be an int, got {type(n_steps).__name__}")
    if n_steps < MIN_REFERENCE_STEPS:
        raise ValueError(
            f"a midpoint reference needs n_steps >= {MIN_REFERENCE_STEPS}, got {n_steps}: fewer steps are not a "
            "reference; pass a larger n_steps"
        )
    if not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    double, xs, bs = _prepared(model, states, baselines)
    started = time.perf_counter()
    targets = _row_targets(target, pairs, double, xs)
    walks = [_midpoint(double, xs, bs, one, n_steps, chunk_rows) for one in targets]
    return _stacked(walks, Target.parse(target).every_output, f"midpoint:{n_steps}", time.perf_counter() - started)


def _midpoint(
    model: nn.Module, xs: Tensor, bs: Tensor, target: _RowTarget, n_steps: int, chunk_rows: int
) -> dict[str, Any]:
    batch, feature_shape = xs.shape[0], tuple(xs.shape[1:])
    xf, bf = xs.reshape(batch, -1), bs.reshape(batch, -1)
    diff = xf - bf
    total, per_chunk = torch.zeros_like(xf), max(1, chunk_rows // batch)
    rows = torch.arange(batch, device=xf.device)
    for first in range(0, n_steps, per_chunk):
        k = torch.arange(first, min(n_steps, first + per_chunk), dtype=torch.float64, device=xf.device)
        alphas = (k + 0.5) / n_steps  # (s,)
        points = (bf.unsqueeze(0) + alphas.view(-1, 1, 1) * diff.unsqueeze(0)).reshape(-1, xf.shape[1])
        points.requires_grad_(True)
        with torch.enable_grad():
            out = target(model(points.view(-1, *feature_shape)), rows.repeat(len(alphas)))
            (grad,) = torch.autograd.grad(out.sum(), points)
        total += grad.view(len(alphas), batch, -1).sum(0)
    return {**_ends(model, xs, bs, target, diff * total / n_steps), "regions": None, "gradients": n_steps * batch}


def reference(
    model: nn.Module,
    states: Tensor,
    baselines: Tensor | None = None,
    *,
    target: Any = "mean",
    pairs: Tensor | None = None,
    n_steps: int = MIN_REFERENCE_STEPS,
) -> Reference:
    """The exact line where the network allows it, else the float64 midpoint rule of ``n_steps`` steps.

    A network refused by the exact line (a module it cannot walk, a hidden non-linearity) gets the midpoint
    reference; ``Reference.method`` says which was used.
    """
    try:
        return exact_line(model, states, baselines, target=target, pairs=pairs)
    except (UnsupportedModelError, ExactLineError):
        return midpoint_reference(model, states, baselines, target=target, pairs=pairs, n_steps=n_steps)
