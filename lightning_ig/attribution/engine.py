"""The reusable front door, :class:`IntegratedGradients`: default settings, and CUDA graphs for repeated shapes.

The engine keeps one :class:`GraphPlan` per key (shapes, dtype, device, settings) in a :class:`PlanCache` and replays
it; :mod:`~lightning_ig.attribution.graphs` captures them. A call on the callback's shapes with the default settings
takes the fast path: copy the inputs in, replay, build the result (this module and
:mod:`~lightning_ig.attribution.result`, nothing else).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_ig.attribution.budget import resolve_budget
from lightning_ig.attribution.checks import check_finite
from lightning_ig.attribution.eager import attribute_eager, deterministic_float32
from lightning_ig.attribution.graphs import Captured, GraphCapture, capture_attribution
from lightning_ig.attribution.inputs import Baselines, Prepared, check_forward, prepare
from lightning_ig.attribution.result import IGResult, build_result
from lightning_ig.attribution.settings import IGOptions, options_with
from lightning_ig.attribution.targets import Target, check_rows_in_range

__all__ = ["GraphPlan", "IntegratedGradients", "PlanCache"]


class IntegratedGradients:
    """A reusable Integrated Gradients engine for one forward.

    Holds default settings and, for repeated calls on the same shapes (what the training callback does), captures the
    whole autograd computation (interpolation kernel, batched forward, ``torch.autograd.grad``, accumulation kernel,
    completeness) in a ``torch.cuda.CUDAGraph`` on first use, keyed on shapes, dtype, device and settings. Later calls
    copy the new inputs into the graph's buffers and replay it: a handful of launches.

    The graph reads the model's parameters where they live, so in-place updates (an optimizer step, ``load_state_dict``)
    are seen by the next replay; replacing a parameter tensor object is not: call :meth:`clear` after that. Finite
    differences, ``n_steps="auto"``, CPU tensors and forwards that cannot be captured (host syncs, data-dependent
    shapes) run eagerly; a failed capture falls back to eager with one warning per key. The forward must be
    deterministic and free of side effects for a replay to mean the same as a call: the run before a capture checks it
    (:attr:`IGResult.stochastic`). The one side effect the engine undoes is batch-norm's in train mode: the running
    statistics its forwards move are put back after every call (inside the captured graph, so a replay puts them back
    too), and the result is still flagged stochastic (its values depend on the batch).

    The NaN/Inf check of the inputs (``check_finite``) is a host sync at every call; a caller that attributes the same
    checked states again and again (the callback) passes ``check_finite=False``.

    Args:
        forward: as for :func:`~lightning_ig.attribution.integrated_gradients`.
        graph_capture: how graphs are captured (default: a :class:`~lightning_ig.attribution.graphs.GraphCapture` on
            ``torch.cuda.graph``); tests pass an emulation.
        **defaults: ``target`` and any option of :class:`~lightning_ig.attribution.IGOptions` (the keyword options of
            :func:`~lightning_ig.attribution.integrated_gradients`, and ``cuda_graph``: ``"auto"``, the default: capture
            on CUDA devices; ``True``: capture, warn and fall back when it fails; ``False``: always eager).

    Raises:
        TypeError: a non-callable forward, an unknown option, an option of the wrong kind, or a ``graph_capture``
            without ``available`` and ``capture``.
        ValueError: a bad option value (checked here, not at the first call).

    Example::

        engine = IntegratedGradients(q_network, target="mean", n_steps=50)
        for states in batches:
            result = engine.attribute(states)   # replays a CUDA graph after the first call
    """

    def __init__(
        self, forward: Callable[[Tensor], Tensor], *, graph_capture: GraphCapture | None = None, **defaults: Any
    ) -> None:
        check_forward(forward)
        given = dict(defaults)
        self._target = Target.parse(given.pop("target", None))  # rejects a bad target now ...
        self._options = options_with(IGOptions(), given)  # ... and bad options
        self.forward = forward
        self.graph_capture = GraphCapture() if graph_capture is None else _check_graph_capture(graph_capture)
        self._plans = PlanCache()
        self.last_mode: str | None = None  # "graph", "capture" or "eager": how the last call ran
        # (shape, dtype, device, plan) of the last default-settings, zero-baseline replay
        self._fast: tuple[torch.Size, torch.dtype, torch.device, GraphPlan] | None = None

    @property
    def options(self) -> IGOptions:
        """The options of a call without overrides."""
        return self._options

    @property
    def target(self) -> Target:
        """What a call without a ``target`` override attributes."""
        return self._target

    def clear(self) -> None:
        """Drop every captured graph (they are captured again on next use)."""
        self._plans.clear()
        self._fast = None

    def attribute(self, inputs: Tensor, baselines: Baselines = None, **overrides: Any) -> IGResult:
        """Attribute ``inputs``; ``overrides`` replace the defaults for this call.

        Args:
            inputs: ``(B, *feature_shape)``.
            baselines: as for :func:`~lightning_ig.attribution.integrated_gradients`.
            **overrides: options of :func:`~lightning_ig.attribution.integrated_gradients` and ``cuda_graph``.

        Returns:
            An :class:`IGResult` (its tensors are fresh, not the graph's buffers).

        Raises:
            The errors of :func:`~lightning_ig.attribution.integrated_gradients`.
        """
        if not overrides and self._fast is not None and (result := self._attribute_fast(inputs, baselines)) is not None:
            return result
        given = dict(overrides)
        target = Target.parse(given.pop("target")) if "target" in given else self._target
        settings = options_with(self._options, given)
        with torch.inference_mode(False), torch.enable_grad(), deterministic_float32():  # a capture keeps the math
            if not self._graph_wanted(settings, inputs):
                self.last_mode = "eager"
                return attribute_eager(self.forward, inputs, baselines, settings, target)
            return self._attribute_graph(inputs, baselines, settings, target)

    # -- the callback's case, kept lean
    def _attribute_fast(self, inputs: Any, baselines: Baselines) -> IGResult | None:
        """Default settings, zero baselines, same shapes as the last replay; ``None`` when the call is not that case."""
        assert self._fast is not None  # noqa: S101 - checked by the caller
        shape, dtype, device, plan = self._fast
        if not (
            isinstance(inputs, Tensor)
            and (baselines is None or (isinstance(baselines, str) and baselines == "zeros"))
            and inputs.shape == shape
            and inputs.dtype == dtype
            and inputs.device == device
        ):
            return None
        settings = self._options
        if torch.is_inference_mode_enabled():  # entering the context costs more than the check
            with torch.inference_mode(False):
                out = self._replay_fast(plan, inputs, settings.check_finite)
        else:
            out = self._replay_fast(plan, inputs, settings.check_finite)
        self.last_mode = "graph"
        if plan.zero_baselines is None:
            plan.zero_baselines = torch.zeros((1,) * inputs.dim(), dtype=dtype, device=device).expand(shape)
        # the plan's settings: method="auto" and n_steps="budget" resolved for this shape
        return plan.result(out, plan.zero_baselines, plan.run.spec, plan.run.settings)

    def _replay_fast(self, plan: GraphPlan, inputs: Tensor, check_inputs: bool) -> dict[str, Tensor]:
        if check_inputs:
            check_finite("inputs", inputs)
        if plan.static_x_view is None or plan.static_x_view.shape != inputs.shape:
            plan.static_x_view = plan.static_x.view(inputs.shape)
        plan.static_x_view.copy_(inputs)
        return plan.replay()

    def _graph_wanted(self, settings: IGOptions, inputs: Any) -> bool:
        return (
            settings.cuda_graph is not False
            and isinstance(inputs, Tensor)
            and settings.n_steps != "auto"
            and settings.gradient == "autograd"
            and self.graph_capture.available(inputs.device)
        )

    def _attribute_graph(self, inputs: Tensor, baselines: Baselines, settings: IGOptions, target: Target) -> IGResult:
        prepared = prepare(self.forward, inputs, baselines, settings, target)
        defaults = settings is self._options and target is self._target
        settings = resolve_budget(self.forward, prepared, settings)  # n_steps="budget": before the key and capture
        if settings.check_finite:
            check_finite("inputs", prepared.x)
            if isinstance(baselines, Tensor):
                check_finite("baselines", prepared.b)
        key = _graph_key(inputs, baselines, prepared, settings)
        if key in self._plans and self._plans.get(key) is None:  # capture failed before: eager
            self.last_mode = "eager"
            return attribute_eager(self.forward, inputs, baselines, settings, target)
        plan = self._plans.get(key)
        if plan is None:
            captured = capture_attribution(self.forward, prepared, baselines, settings, self.graph_capture)
            plan = None if captured is None else GraphPlan(captured)
            evicted = self._plans.put(key, plan)
            if evicted is not None and self._fast is not None and self._fast[3] is evicted:
                self._fast = None
            if plan is None:
                self.last_mode = "eager"
                return attribute_eager(self.forward, inputs, baselines, settings, target)
            self.last_mode = "capture"
        else:
            self.last_mode = "graph"
        out = _replay(plan, prepared)
        if defaults and key[3] == ("zeros",) and prepared.spec.same_each_call:
            self._fast = (inputs.shape, inputs.dtype, inputs.device, plan)
        return plan.result(out, prepared.resolved, prepared.spec, settings)


class GraphPlan:
    """A captured attribution the engine keeps for one key: static inputs, the graph, its outputs; replayed.

    When attributions and statistics share a dtype the graph also packs both into one flat buffer, so a replay's results
    cost one copy.
    """

    def __init__(self, captured: Captured) -> None:
        self.graph = captured.graph
        self.static_x = captured.static_x  # (B, F)
        self.static_b = captured.static_b  # (B, F), or None where the baseline is computed inside the graph
        self.static_rows = captured.static_rows  # (B,) per-row target indices, or None
        self.outputs = outputs = captured.outputs  # "attributions" (T, B, F), "stats", "accuracy" [, "packed"]
        self.run = captured.run
        self.keep = captured.keep  # objects whose id() is part of the key (a target callable)
        self.stochastic = captured.stochastic  # what the eager run before the capture found
        self.shapes = {name: outputs[name].shape for name in _OUTPUTS}
        self.split_sizes = [outputs[name].numel() for name in _OUTPUTS]
        self.zero_baselines: Tensor | None = None  # set by the engine's fast path: a read-only expanded zero
        self.static_x_view: Tensor | None = None  # static_x viewed as (B, *feature_shape), for the fast path

    def replay(self) -> dict[str, Tensor]:
        """Replay the graph; fresh copies of its outputs."""
        self.graph.replay()
        packed = self.outputs.get("packed")
        if packed is None:
            return {name: self.outputs[name].clone() for name in _OUTPUTS}
        pieces = packed.clone().split(self.split_sizes)
        return {name: piece.view(self.shapes[name]) for name, piece in zip(_OUTPUTS, pieces)}

    def result(self, out: dict[str, Tensor], baselines: Tensor, spec: Target, settings: IGOptions) -> IGResult:
        """The :class:`IGResult` of a replay's ``out``; ``settings.n_steps`` is a number (resolved for the shape)."""
        return build_result(
            out, baselines, spec, settings, self.run, int(settings.n_steps), graph=True, stochastic=self.stochastic
        )


_OUTPUTS = ("attributions", "stats", "accuracy")


class PlanCache(dict[tuple[Any, ...], "GraphPlan | None"]):
    """Plans by key; a key whose capture failed maps to ``None``. Keeps the most recent ``limit`` plans.

    Each captured graph holds its own memory pool, so old plans are dropped.
    """

    limit = 8

    def put(self, key: tuple[Any, ...], plan: GraphPlan | None) -> GraphPlan | None:
        """Store ``plan``; return the plan evicted to make room, if any."""
        evicted = self.pop(next(iter(self))) if plan is not None and len(self) >= self.limit else None
        self[key] = plan
        return evicted


def _check_graph_capture(capture: Any) -> GraphCapture:
    if not (callable(getattr(capture, "available", None)) and callable(getattr(capture, "capture", None))):
        raise TypeError(
            f"graph_capture must be None or an object with available(device) and capture(compute, device) "
            f"(a GraphCapture), got {type(capture).__name__}"
        )
    return capture


def _graph_key(inputs: Tensor, baselines: Baselines, prepared: Prepared, settings: IGOptions) -> tuple[Any, ...]:
    """What a captured graph depends on: shapes, dtype, device, the baseline's form, the target, the settings."""
    baseline_key: tuple[Any, ...]
    if isinstance(baselines, Tensor):
        baseline_key = ("tensor",)
    elif isinstance(baselines, (int, float)) and not isinstance(baselines, bool):
        baseline_key = ("scalar", float(baselines))
    else:
        baseline_key = (baselines or "zeros",)
    return (
        tuple(inputs.shape),
        inputs.dtype,
        inputs.device,
        baseline_key,
        prepared.spec.key(),
        prepared.backend,
        settings.n_steps,
        settings.method,
        settings.internal_batch_size,
        settings.fd_step,
    )


def _replay(plan: GraphPlan, prepared: Prepared) -> dict[str, Tensor]:
    """Copy this call's inputs into the plan's static buffers and replay it."""
    plan.static_x.copy_(prepared.x)
    if plan.static_b is not None:
        plan.static_b.copy_(prepared.b)
    if plan.static_rows is not None:
        assert prepared.spec.rows is not None  # noqa: S101 - a plan with static rows was captured for a per-row target
        check_rows_in_range(prepared.spec, plan.run.output_width)  # here: a replay's gather has no bounds check
        plan.static_rows.copy_(prepared.spec.rows)
    return plan.replay()
