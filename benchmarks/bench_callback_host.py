"""The host time one steady callback run holds the training thread, on any machine (issue 22).

``bench_callback_training.py`` times whole fits on the GPU; this measures the part of a run that is Python and
launches on the training thread, which the CPU shows as well as the GPU. The engine's graph capture is replaced by
one whose replay is free (the captured outputs stay as they are, as a replay that costs no host time would leave
them), so a run's time is everything around the IG: the copy in, the host result's reductions (on the CPU they
run at once; on a GPU they are launches), the summary, the trust verdict, the scalars, histograms and text to a
``TensorBoardLogger``. The model is small (one strided convolution and a NoisyLinear head) so that the first run's
eager work (capture, trust checks) takes seconds, not minutes, on a CPU; the host work of a run does
not depend on the model.

Reported per kind of run (steady: no picture or trust check due; and those that are), the median host
milliseconds of ``_start`` (the run's start, at a batch end) and ``_finish`` (its end, at a later batch end), the
CPU time the other threads (TensorBoard's writer, the picture worker) spent per run, and with ``--profile`` the
functions of a steady run by cumulative time (cProfile).

Usage (repository root)::

    PYTHONPATH=. python benchmarks/bench_callback_host.py [--runs 60] [--states 32] [--profile 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader

import lightning_ig.attribution.engine as engine_module
from lightning_ig import IntegratedGradientsCallback, NoisyLinear
from lightning_ig.attribution import IGOptions
from lightning_ig.callback import monitor as monitor_module
from lightning_ig.views import ViewOptions
from lightning_ig.views.loggers import outputs as tensorboard_module


class FreeReplay:
    """A "graph" whose replay costs nothing: its outputs stay as the capture left them."""

    def replay(self) -> None:
        pass


class FreeCapture:
    """Captures on any device: runs the computation once, eagerly; replays are free."""

    def available(self, device: torch.device) -> bool:
        return True

    def capture(self, compute: Callable[[], dict[str, Tensor]], device: torch.device) -> tuple[Any, dict[str, Tensor]]:
        return FreeReplay(), compute()


class SmallQNet(pl.LightningModule):
    """(4, 84, 84) frames -> 6 Q-values: a strided convolution and a NoisyLinear head; a DQN-like update."""

    def __init__(self, frame_shape: tuple[int, int, int]) -> None:
        super().__init__()
        channels, height, width = frame_shape
        self.encoder = nn.Sequential(nn.Conv2d(channels, 8, 8, stride=8), nn.ReLU(), nn.Flatten())
        size = 8 * ((height - 8) // 8 + 1) * ((width - 8) // 8 + 1)
        self.head = NoisyLinear(size, 6)
        self.frame_shape = frame_shape

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        self.head.reset_noise()
        frames = torch.rand((8, *self.frame_shape))
        return self(frames).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class RunClock:
    """Wraps the callback's ``_start`` and ``_finish``: host ms of each, by the step the run started at."""

    def __init__(self, profile_runs: int) -> None:
        self.start_ms: dict[int, float] = {}
        self.finish_ms: dict[int, float] = {}
        self.cpu_ms: dict[int, float] = {}  # the training thread's CPU time in both (not waiting for a core or the GIL)
        self.finish_cpu_ms: dict[int, float] = {}  # ... in the finish alone
        self.kinds: dict[int, set[str]] = {}
        self.profile_runs = profile_runs
        self.profiler = cProfile.Profile(time.thread_time)  # CPU time: a shared machine's stalls left out
        self.profiled = 0
        self.current: int | None = None

    def note(self, kind: str) -> None:
        if self.current is not None:
            self.kinds.setdefault(self.current, set()).add(kind)

    def wrap(self, method: Any, step_of: Callable[[Any], int], into: dict[int, float]) -> Any:
        clock = self

        def timed(callback: Any, *args: Any, **kwargs: Any) -> Any:
            step = step_of(args)
            clock.current = step
            index = step - 1  # every_n_steps=1: the run at step s is run s - 1
            steady = index % 10 not in (0, 2, 5, 7) and index % 5 != 0  # the defaults' picture and check runs
            profiling = steady and 0 < index <= clock.profile_runs * 2
            if profiling:
                clock.profiler.enable()
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return method(callback, *args, **kwargs)
            finally:
                into[step] = into.get(step, 0.0) + (time.perf_counter() - started) * 1e3
                spent = (time.thread_time() - cpu) * 1e3
                clock.cpu_ms[step] = clock.cpu_ms.get(step, 0.0) + spent
                if into is clock.finish_ms:
                    clock.finish_cpu_ms[step] = clock.finish_cpu_ms.get(step, 0.0) + spent
                if profiling:
                    clock.profiler.disable()
                clock.current = None

        return timed


def instrument(clock: RunClock) -> None:
    """Wrap the hooks' run methods and note which runs drew or checked."""
    callback = IntegratedGradientsCallback
    callback._start = clock.wrap(callback._start, lambda args: args[0].global_step, clock.start_ms)  # type: ignore[method-assign]
    callback._finish = clock.wrap(callback._finish, lambda args: args[0].step, clock.finish_ms)  # type: ignore[method-assign]

    def noting(kind: str, function: Any, when: Callable[..., bool] = lambda *a, **k: True) -> Any:
        def noted(*args: Any, **kwargs: Any) -> Any:
            if when(*args, **kwargs):
                clock.note(kind)
            return function(*args, **kwargs)

        return noted

    monitor_module.TrustMonitor._attempt = noting("trust", monitor_module.TrustMonitor._attempt)  # type: ignore[method-assign]
    original_due = tensorboard_module.pictures_due

    def pictures_due(*args: Any, **kwargs: Any) -> Any:
        due = original_due(*args, **kwargs)
        if any(due.values()):
            clock.note("picture")  # drawn on the logging worker; the run hands it over
        return due

    tensorboard_module.pictures_due = pictures_due


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="callback runs (one per step)")
    parser.add_argument("--states", type=int, default=32, help="held-out (4, 84, 84) frames")
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--profile", type=int, default=0, help="cProfile this many steady runs; print the top")
    parser.add_argument("--plain", action="store_true", help="pictures off (figure_every_n_runs=None, ...)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    engine_module.GraphCapture = FreeCapture  # type: ignore[misc, assignment]
    clock = RunClock(options.profile)
    instrument(clock)
    shape = (4, 84, 84)
    states = torch.rand((options.states, *shape), generator=torch.Generator().manual_seed(0))
    views = ViewOptions(figure_every_n_runs=None, saliency_states=None) if options.plain else None  # no pictures
    callback = IntegratedGradientsCallback(  # overhead=None: a run at every step (the 2% budget would defer most)
        states, every_n_steps=1, overhead=None, engine=IGOptions(n_steps=options.n_steps), views=views
    )
    pl.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as folder:
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=options.runs + 1,
            logger=TensorBoardLogger(folder, name="host", default_hp_metric=False),
            callbacks=[callback],
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            log_every_n_steps=50,
        )
        cpu_started, thread_started = time.process_time(), time.thread_time()
        trainer.fit(SmallQNet(shape), DataLoader(range(options.runs + 1), batch_size=None))
        others_s = (time.process_time() - cpu_started) - (time.thread_time() - thread_started)
        event_bytes = sum(path.stat().st_size for path in Path(folder).rglob("events.out.tfevents.*"))
    steps = sorted(clock.start_ms)
    rows = {}
    for step in steps[1:-1]:  # the first run captures; the last is the end of training
        kinds = clock.kinds.get(step, set())
        label = "steady" if not kinds else "+".join(sorted(kinds))
        finish_cpu = clock.finish_cpu_ms.get(step, float("nan"))
        times = (clock.start_ms[step], clock.finish_ms.get(step, float("nan")), clock.cpu_ms[step], finish_cpu)
        rows.setdefault(label, []).append(times)
    print(
        f"bench_callback_host: {options.states} held-out (4, 84, 84) states, n_steps {options.n_steps}, "
        f"{len(steps)} runs, {'pictures off' if options.plain else 'defaults'}, torch {torch.__version__} "
        f"(1 thread), free graph replay"
    )
    print(f"first run: start {clock.start_ms[steps[0]]:.1f} ms, finish {clock.finish_ms[steps[0]]:.1f} ms")
    print("| runs | count | start ms | finish ms | start + finish ms | training thread's CPU ms | of which finish |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, values in sorted(rows.items(), key=lambda item: -len(item[1])):
        starts, finishes, cpu, finish_cpu = ([v[k] for v in values] for k in range(4))
        totals = [a + b for a, b, _, _ in values]
        columns = (starts, finishes, totals, cpu, finish_cpu)
        medians = " | ".join(f"{statistics.median(column):.2f}" for column in columns)
        print(f"| {label} | {len(values)} | {medians} |")
    print("(medians over the runs of each kind; wall times include waiting for a core on a shared machine)")
    others_ms = others_s * 1e3 / len(steps)
    print(
        f"other threads' CPU time (TensorBoard writer, picture worker, ...): {others_ms:.2f} ms/run; event file "
        f"{event_bytes / len(steps) / 1024:.1f} KiB/run (checksummed in Python by TensorBoard's writer thread)"
    )
    if options.profile:
        text = io.StringIO()
        stats = pstats.Stats(clock.profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(45)
        print(text.getvalue())


if __name__ == "__main__":
    main()
