"""CUDA-graph capture of a whole attribution, once per key of :class:`~lightning_ig.attribution.IntegratedGradients`
(:func:`capture_attribution`); the engine keeps what comes back as a plan and replays it.

* The run before the capture is eager: shape and autograd errors surface as they would without a graph, and the path's
  ends ride twice in its forward there (the stochastic-forward check; a replay reports what its capture found, and the
  captured graph evaluates them once).
* Capture is tried with the run's backend and then with its twin (the CUDA kernels, then their torch twins: same
  arithmetic, still faster than eager); when both fail the key runs eagerly from then on, after one warning.
* How a computation is captured is a :class:`GraphCapture`; tests pass one that emulates a graph on the CPU.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_ig.attribution.inputs import Baselines, Prepared, RunningStatistics, resolve_baselines, warn_stochastic
from lightning_ig.attribution.path import PathRun, chunk_rows, rule_tensors
from lightning_ig.attribution.settings import IGOptions
from lightning_ig.ops.ig import IGOps

__all__ = ["Captured", "GraphCapture", "capture_attribution"]

_Compute = Callable[[], "dict[str, Tensor]"]


class Captured(NamedTuple):
    """What a capture leaves: the graph, its static inputs and outputs, and what the eager run before it found."""

    graph: Any  # has replay()
    static_x: Tensor  # (B, F)
    static_b: Tensor | None  # (B, F), or None where the baseline is computed inside the graph
    static_rows: Tensor | None  # (B,) per-row target indices, or None
    outputs: dict[str, Tensor]  # "attributions" (T, B, F), "stats" (7, T, B), "accuracy" (3, T, B) [, "packed"]
    run: PathRun
    keep: Any  # objects whose id() is part of the key (a target callable)
    stochastic: bool  # what the eager run before the capture found


class GraphCapture:
    """Captures a computation in a ``torch.cuda.CUDAGraph`` (the default :class:`GraphCapture`).

    A replacement (a test's emulation, say) provides the same two methods.
    """

    def available(self, device: torch.device) -> bool:
        """Whether computations on ``device`` can be captured."""
        return device.type == "cuda" and hasattr(torch.cuda, "CUDAGraph")

    def capture(self, compute: _Compute, device: torch.device) -> tuple[Any, dict[str, Tensor]]:
        """Warm ``compute`` up on a side stream, then capture it; return the graph (``replay()``) and its outputs.

        The warm-up runs with torch's sync debug mode set to ``"error"``, so a forward that synchronises with the host
        (``.item()``, ``.cpu()``, data-dependent shapes) fails there, before a capture begins: a capture that fails
        part-way leaves the CUDA generator in its capture state, and every later random draw on the device raises.
        """
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        previous_mode = torch.cuda.get_sync_debug_mode()
        _set_sync_debug_mode("error")
        try:
            with torch.cuda.stream(side):
                compute()  # warm-up on a side stream, as torch.cuda.graph's documentation asks
        finally:
            _set_sync_debug_mode(previous_mode)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        rng_state = torch.cuda.get_rng_state(device)
        try:
            with torch.cuda.graph(graph):
                outputs = compute()
        finally:
            # Capture registers the device's generator with the graph; the training run's RNG stream must not
            # notice (nothing here draws random numbers).
            torch.cuda.set_rng_state(rng_state, device)
        return graph, outputs


def _set_sync_debug_mode(mode: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sync debug mode is a prototype feature": ours, not the user's
        torch.cuda.set_sync_debug_mode(mode)


def _pack(outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    attributions, stats, accuracy = outputs["attributions"], outputs["stats"], outputs["accuracy"]
    if not attributions.dtype == stats.dtype == accuracy.dtype:
        return outputs
    flat = [attributions.reshape(-1), stats.reshape(-1), accuracy.reshape(-1)]
    return {**outputs, "packed": torch.cat(flat)}  # (T B F + 7 T B + 3 T B,)


def capture_attribution(
    forward: Callable[[Tensor], Tensor],
    prepared: Prepared,
    baselines: Baselines,
    settings: IGOptions,
    capturer: GraphCapture,
) -> Captured | None:
    """Run the attribution eagerly once, then capture it; ``None`` (after one warning) when capture fails."""
    x = prepared.x
    static_x = x.clone()
    static_b = None if not isinstance(baselines, Tensor) else prepared.b.clone()  # None: computed from the inputs
    spec = prepared.spec
    static_rows = spec.rows.clone() if spec.rows is not None else None
    graph_spec = dataclasses.replace(spec, rows=static_rows) if static_rows is not None else spec
    chunk = chunk_rows(settings, x)
    run = PathRun(forward, static_x, prepared.b, prepared.feature_shape, graph_spec, settings, prepared.backend, chunk)
    alphas, weights = rule_tensors(settings.method, int(settings.n_steps), run.acc, x.device)
    batch = x.shape[0]
    statistics = RunningStatistics(forward)  # found once; saved and restored inside the graph, so replays do it too

    def compute() -> dict[str, Tensor]:
        saved = statistics.save()
        if static_b is None:  # the baseline comes from the inputs inside the graph ("zeros", "mean" or a number)
            run.b = resolve_baselines(baselines, static_x.view(batch, *prepared.feature_shape)).reshape(batch, -1)
        else:
            run.b = static_b
        path = run.gradients(alphas, with_ends=True)
        assert path.ends is not None  # noqa: S101 - with_ends=True
        out = _pack(run.finish(alphas, weights, path.grads, path.ends, path.values))  # the kink rule runs forwards too
        statistics.restore(saved)
        return out

    saved = statistics.save()
    try:
        compute()  # eager first: shape and autograd errors surface as they would without a graph
        stochastic = bool(run.stochastic_flag())  # the ends evaluated twice, as on every eager call
        warn_stochastic(forward, 4, stochastic)  # to the caller of IntegratedGradients.attribute
        run.check_stochastic = False  # not in the warm-up nor the capture: its answer needs a host read
        run.allow_oom_retry = False  # a retry cannot happen inside a capture
        captured = _capture_with_fallback(run, compute, capturer, x.device)
    finally:
        statistics.restore(saved)  # also where a forward or the capture raised part-way
    if captured is None:
        return None
    graph, outputs = captured
    return Captured(graph, static_x, static_b, static_rows, outputs, run, spec.fn, stochastic)


def _capture_with_fallback(
    run: PathRun, compute: _Compute, capturer: GraphCapture, device: torch.device
) -> tuple[Any, dict[str, Tensor]] | None:
    failures: list[str] = []
    attempt: IGOps | None = run.backend
    while attempt is not None:
        run.backend = attempt
        try:
            captured = capturer.capture(compute, device)
        except Exception as error:  # noqa: BLE001 - any capture failure means: try the twin, then eager
            failures.append(f"backend={attempt.name!r}: {type(error).__name__}: {error}")
            attempt = attempt.twin
            continue
        if failures:
            warnings.warn(
                f"CUDA graph capture with the CuPy kernels failed ({failures[0]}); captured the torch twins instead",
                RuntimeWarning,
                stacklevel=5,
            )
        return captured
    warnings.warn(
        f"CUDA graph capture of the attribution failed ({'; '.join(failures)}); running eagerly "
        "for these shapes (pass cuda_graph=False to skip the attempt)",
        RuntimeWarning,
        stacklevel=5,
    )
    return None
