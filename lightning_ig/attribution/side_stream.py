"""A callback run's attribution beside training: replayed on a side CUDA stream, over a snapshot of the weights.

A DQN-like training step is launch-bound: the device idles most of each step. A run replayed on the training stream
adds its whole device time to the fit; replayed on a side stream it fills those idle gaps while the next steps run.
The side stream must then never read a tensor that training writes, so it reads a snapshot:

* :class:`WeightSnapshot` finds the parameters and buffers the forward reads (once: one forward watched operation
  by operation) and keeps a static copy of each; :meth:`WeightSnapshot.refresh` copies them all in one multi-tensor
  copy, on the training stream, at a run's start (so they are the weights as they are at that step).
* the attribution's CUDA graph is captured against the snapshot: the forward is reparametrised
  (``torch.func.functional_call``) while the side engine runs it eagerly and captures it, so the graph holds the
  snapshot's addresses. A ``forward(pl_module, x)`` of the user's is reparametrised the same way.
* :class:`SideStream`, at a run's start, on the training stream: wait (on the device) for the last run's replay to
  finish reading the snapshot, refresh it, and mark the point; on the side stream: wait for that point, replay the
  attribution, replay the run's reductions (:func:`~lightning_ig.attribution.host_result.reduce_rows`, captured once
  too) and copy them to pinned memory behind an event. Nothing waits on the host. The run ends at the first batch end
  where that event has completed (:meth:`~lightning_ig.attribution.host_result.HostTransfer.ready`), or when it must.

Training is the same bit for bit: the side stream writes only its own memory, and the training stream only waits.
Memory is safe across the streams: the snapshot, the states and the graphs' pools are the side engine's for the fit;
what a replay produces is made and used on the side stream; the host copy lands in a fresh pinned block per run.

Where a snapshot cannot cover what the forward reads (a tensor that is neither the module's parameter or buffer nor
made by the forward, a forward that writes its module's tensors, tensors on another device), or the settings run no
graph, :meth:`SideStream.prepare` returns ``None`` and says why in a debug log (``lightning_ig`` logger): the run
stays on the training stream, as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lightning_ig.attribution.engine import GraphPlan, IntegratedGradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.host_result import HostResult, HostTransfer, RunLabels, reduce_rows

__all__ = ["SideStream", "WeightSnapshot", "explain"]

_logger = logging.getLogger(__name__)

_Mode = Callable[[], contextlib.AbstractContextManager[Any]]


class _Reads(TorchDispatchMode):
    """Watches one forward: the storages its operations read and write that they did not make themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[tuple[str, int]] = set()
        self.written: set[tuple[str, int]] = set()
        self.made: set[tuple[str, int]] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.lift_fresh.default:  # a constant the forward made (torch.tensor(...) inside it)
            self.made.update(_key(leaf) for leaf in tree_leaves(args) if isinstance(leaf, Tensor))
        arguments = getattr(getattr(func, "_schema", None), "arguments", ())
        writes = {a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write}
        for position, value in enumerate(args):
            self._note(value, written=position < len(arguments) and arguments[position].name in writes)
        for name, value in kwargs.items():
            self._note(value, written=name in writes)
        out = func(*args, **kwargs)
        for leaf in tree_leaves(out):
            if isinstance(leaf, Tensor) and _key(leaf) not in self.read:
                self.made.add(_key(leaf))
        return out

    def _note(self, value: Any, *, written: bool) -> None:
        for leaf in tree_leaves(value):
            if isinstance(leaf, Tensor) and leaf.numel() and _key(leaf) not in self.made:
                self.read.add(_key(leaf))
                if written:
                    self.written.add(_key(leaf))


def _key(tensor: Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


class WeightSnapshot:
    """Static copies of the parameters and buffers a forward reads, refreshed by one multi-tensor copy.

    Attributes:
        names: ``{name in the module: static copy}``.
    """

    def __init__(self, module: nn.Module, live: Mapping[str, Tensor]) -> None:
        self.module = module
        by_tensor: dict[int, Tensor] = {}  # tied names share one static copy
        self.names: dict[str, Tensor] = {}
        for name, tensor in live.items():
            if id(tensor) not in by_tensor:
                static = torch.empty_like(tensor, memory_format=torch.preserve_format)
                by_tensor[id(tensor)] = static.requires_grad_(tensor.requires_grad)
            self.names[name] = by_tensor[id(tensor)]
        unique = {id(tensor): tensor for tensor in live.values()}
        self._live = list(unique.values())
        self._static = [by_tensor[key] for key in unique]
        self.refresh()

    @classmethod
    def find(cls, module: nn.Module, forward: Callable[[Tensor], Tensor], sample: Tensor) -> WeightSnapshot | str:
        """The snapshot of what ``forward(sample)`` reads of ``module``, or why there can be none.

        Run it in the mode the attribution runs in (eval mode, noise off): the same tensors are read then.
        """
        named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
        owned: dict[tuple[str, int], list[tuple[str, Tensor]]] = {}
        for name, tensor in named:
            owned.setdefault(_key(tensor), []).append((name, tensor))
        watch = _Reads()
        rows = sample.detach().clone().requires_grad_(True)
        watch.made.add(_key(rows))
        with torch.enable_grad(), watch:
            forward(rows)
        foreign = [key for key in watch.read if key not in owned]
        if foreign:
            return f"the forward reads {len(foreign)} tensor(s) that are not its module's parameters or buffers"
        if watch.written:
            return "the forward writes tensors it did not make (its module's parameters or buffers)"
        elsewhere = {device for device, _ in watch.read} - {str(sample.device)}
        if elsewhere:
            return f"the forward reads the module's tensors on {sorted(elsewhere)} besides {sample.device}"
        return cls(module, {name: tensor for key in watch.read for name, tensor in owned[key]})

    def refresh(self) -> None:
        """Copy the live tensors into the static ones (on the current stream; one multi-tensor copy)."""
        with torch.no_grad():
            torch._foreach_copy_(self._static, self._live)

    def bind(self, forward: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """``forward`` reading the static copies in place of the module's tensors."""
        return _SnapshotForward(self, forward)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._static)


class _Holder(nn.Module):
    """The module as a child (its tensors reachable as ``module.<name>``) and the forward to call."""

    def __init__(self, module: nn.Module, forward: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.module = module
        self.__dict__["call"] = forward  # not a child: the forward may be the module itself

    def forward(self, x: Tensor) -> Tensor:
        return self.__dict__["call"](x)


class _SnapshotForward:
    """``x -> forward(x)`` with the module's tensors swapped for the snapshot's (``torch.func.functional_call``)."""

    def __init__(self, snapshot: WeightSnapshot, forward: Callable[[Tensor], Tensor]) -> None:
        self._holder = _Holder(snapshot.module, forward)
        self._tensors = {f"module.{name}": tensor for name, tensor in snapshot.names.items()}
        self.__wrapped__ = forward  # module_of finds the module behind it, as for the forward itself
        self.__name__ = getattr(forward, "__name__", type(forward).__name__)

    def __call__(self, x: Tensor) -> Tensor:
        return torch.func.functional_call(self._holder, self._tensors, (x,), strict=False, tie_weights=True)


class _Replay:
    """The steady run: the attribution's graph and the reductions' graph, replayed; their flat output copied."""

    def __init__(self, plan: GraphPlan, graph: Any, flat: Tensor, scale: Tensor, unpacker: Callable[[float], Any]):
        self.plan, self.graph, self.flat, self.scale, self._unpacker = plan, graph, flat, scale, unpacker

    def rescale(self, error_scale: float) -> None:
        """A calibration changed the estimate's scale only: the same graphs, the new factor (on the current stream)."""
        self.scale.fill_(error_scale)
        self.unpack = self._unpacker(error_scale)

    def start(self) -> HostTransfer:
        self.plan.graph.replay()
        self.graph.replay()
        return HostTransfer(self.flat if self.flat.is_cuda else self.flat.clone(), self.unpack)


class SideStream:
    """Runs a callback's attributions on a side stream over a :class:`WeightSnapshot` (see the module docstring).

    Made by :meth:`prepare`; :meth:`start` starts a run and returns its transfer. On a device without streams (the
    CPU, with an emulated graph capture in the tests) the same steps run in order on the one thread.
    """

    def __init__(
        self,
        source: IntegratedGradients,
        snapshot: WeightSnapshot,
        states: Tensor,
        baselines: Any,
        host_options: Mapping[str, Any],
        mode: _Mode,
    ) -> None:
        self.source, self.snapshot, self.states, self.baselines = source, snapshot, states, baselines
        self.host_options, self.mode = dict(host_options), mode
        self.engine = IntegratedGradients(
            snapshot.bind(source.forward), graph_capture=source.graph_capture, **source.defaults
        )
        self.engine.follow(source)
        self._followed = source.defaults
        self._cuda = states.is_cuda
        self._side = torch.cuda.Stream(states.device) if self._cuda else None
        self._done: torch.cuda.Event | None = None  # the last run's copy landed (its replay read the snapshot)
        self._replay: _Replay | None = None
        self._failed: set[int] = set()  # plans whose reductions could not be captured
        if self._side is not None:
            states.record_stream(self._side)  # freed only after the side stream's last read
            for tensor in snapshot.names.values():
                tensor.record_stream(self._side)

    @classmethod
    def prepare(
        cls,
        engine: IntegratedGradients,
        module: nn.Module,
        states: Tensor,
        baselines: Any,
        host_options: Mapping[str, Any],
        mode: _Mode,
    ) -> SideStream | None:
        """The side stream for ``engine``'s runs on ``states``, or ``None`` (the reason in a debug log).

        Args:
            engine: the callback's engine (its forward, settings and graph capture; its settings are followed).
            module: the model the forward reads (the ``pl_module``).
            states, baselines: what every run attributes (this rank's states, on the device).
            host_options: :meth:`~lightning_ig.attribution.host_result.HostResult.begin`'s options of every run.
            mode: enters the mode a forward runs in (eval mode, noise off): at the snapshot's search and around every
                call that runs the forward (the capture, a run that does not replay).
        """
        settings = engine.default_settings
        if not (engine.graph_capture.available(states.device) and settings.cuda_graph is not False):
            return explain("no CUDA graph on this device")
        if settings.n_steps == "auto" or settings.gradient != "autograd":
            return explain("n_steps='auto' and finite differences run eagerly (no graph to replay)")
        with mode():
            found = WeightSnapshot.find(module, engine.forward, states[:2])
        if isinstance(found, str):
            return explain(found)
        _logger.debug("IntegratedGradientsCallback: side stream over a snapshot of %d bytes", found.nbytes())
        return cls(engine, found, states, baselines, host_options, mode)

    def start(self) -> HostTransfer:
        """Start a run: refresh the snapshot on the training stream, attribute and reduce on the side stream."""
        if self._side is None:
            self.snapshot.refresh()
            return self._attribute()
        training = torch.cuda.current_stream(self.states.device)
        if self._done is not None:
            training.wait_event(self._done)  # the last replay has read the snapshot before it is written
        self.snapshot.refresh()
        self._side.wait_stream(training)
        with torch.cuda.stream(self._side):
            transfer = self._attribute()
        self._done = transfer.event
        return transfer

    def _attribute(self) -> HostTransfer:
        if self.source.defaults is not self._followed:  # a calibration chose another rule or scale
            before = self.engine.default_settings
            self.engine.follow(self.source)
            self._followed, after = self.source.defaults, self.engine.default_settings
            if self._replay is not None and dataclasses.replace(before, error_scale=after.error_scale) == after:
                self._replay.rescale(after.error_scale)  # the same graphs: only the estimate's scale is new
            else:
                self._replay = None
        if self._replay is not None:
            return self._replay.start()
        with self.mode():  # the first run captures (and the runs that cannot replay run the forward)
            result = self.engine.attribute(self.states, baselines=self.baselines)
        transfer = HostResult.begin(result, **self.host_options)
        plan = self.engine.fast_plan(self.states) if isinstance(self.baselines, str) else None
        if plan is not None and id(plan) not in self._failed:
            self._replay = self._reductions(plan)
        return transfer

    def _reductions(self, plan: GraphPlan) -> _Replay | None:
        """Capture the run's reductions over ``plan``'s outputs (:func:`reduce_rows`); ``None`` when that fails."""
        # the plan's own settings: n_steps="budget" is a number there (chosen for these shapes before the capture)
        settings, outputs = plan.run.settings, plan.outputs
        stats = outputs["stats"]
        rows = stats.shape[-1]
        error_scale = self.engine.default_settings.error_scale  # the engine's now (a calibration may set a new one)
        scale = torch.full((), error_scale, dtype=outputs["accuracy"].dtype, device=stats.device)
        fixed = torch.tensor([float(int(settings.n_steps)), float(bool(plan.stochastic))], dtype=stats.dtype)
        fixed = fixed.to(stats.device)[:, None].expand(2, rows)  # the n_steps and stochastic columns
        options = {key: self.host_options[key] for key in ("groups", "keep_attributions", "sample_states")}
        layout: list[tuple[int, int, int]] = []

        def compute() -> dict[str, Tensor]:
            # pack()'s columns of an IGResult the engine would build from these outputs, in the same dtypes
            table, accuracy = stats.view(stats.shape[0], rows), outputs["accuracy"].view(-1, rows)
            columns = torch.cat(
                [
                    table[:4],
                    (table[4:6] != 0).to(table.dtype),
                    fixed,
                    (accuracy[:1] * scale).to(table.dtype),
                    accuracy[1:2].to(table.dtype),
                ]
            )
            flat, shape = reduce_rows(outputs["attributions"].view(rows, -1), columns, **options)
            layout[:] = [shape]
            return {"flat": flat}

        try:
            graph, captured = self.engine.graph_capture.capture(compute, stats.device)
        except Exception as error:  # noqa: BLE001 - any failure: these runs reduce eagerly, as before
            self._failed.add(id(plan))
            _logger.debug("IntegratedGradientsCallback: the reductions run eagerly (capture failed: %r)", error)
            return None
        labels = (int(settings.n_steps), settings.method, settings.gradient, plan.run.backend.name, plan.run.spec.label)
        groups: FeatureGroups | None = options["groups"]
        shape = tuple(self.states.shape[1:])

        def unpacker(error_scale: float) -> Callable[[Any], HostResult]:
            return HostResult.unpacker(RunLabels(*labels, error_scale), shape, layout[0], groups)

        replay = _Replay(plan, graph, captured["flat"], scale, unpacker)
        replay.unpack = unpacker(error_scale)
        return replay


def explain(reason: str) -> None:
    """Say at debug level why the runs stay on the training stream; ``None``."""
    _logger.debug("IntegratedGradientsCallback: the attribution stays on the training stream: %s", reason)
