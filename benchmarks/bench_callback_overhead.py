"""What the IG callback costs a training run: examples/dqn_cartpole.py with and without it, side by side.

The same training (same seed, same number of gradient steps, same logger) runs
with and without :class:`lightning_ig.IntegratedGradientsCallback` (IG on 256
held-out states, ``n_steps=50``, every 100 steps, histograms, text and
figures as the example logs them), in one process on one device, in the order
off, on, on, off, ... so that drift in clocks or caches falls on both sides
alike. A warm-up run with the callback first compiles the kernels and fills
the caches (CUDA context, cuBLAS, CuPy modules, the IG graph), which a long
training pays once.

Reported:

* wall time of the training loop (first training batch to the end of
  training, the replay warm-up with random actions left out), median per
  side, and the overhead ``(with - without) / without``; the target is <= 3%;
* the cost of one callback run in ms (median over the runs of the timed
  trainings, the final run at train end included): the host time of the
  callback's batch-end and train-end hooks from one run's numbers landing to
  the next's (a run starts at one batch end and lands at a later one while
  training goes on), the device synchronised after the hook that logs it.

The example's training step reads one action back to the host per environment
step, so the device is idle between steps: the callback's cost shows up in
full in the wall time, nothing hides it.

Usage (from the repository root, on a CUDA machine; gymnasium must import)::

    PYTHONPATH=. python benchmarks/bench_callback_overhead.py --accelerator gpu [--quick] \
        [--output benchmarks/results/bench_callback_overhead.md]

It prints a markdown table last and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.views import ViewOptions

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dqn_cartpole.py"
NUM_HELD_OUT = 256
IG_N_STEPS = 50
IG_EVERY_N_STEPS = 100


def load_example() -> ModuleType:
    """Import examples/dqn_cartpole.py as a module (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location("dqn_cartpole_example", EXAMPLE)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load the example from {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class LoopTimer(Callback):
    """Wall time from the first training batch to the end of training (device synchronised at both ends)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.seconds = 0.0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.started is None:
            _synchronize(pl_module.device)
            self.started = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Called after the IG callback's own on_train_end (callbacks run in list order; this one is last).
        _synchronize(pl_module.device)
        assert self.started is not None
        self.seconds = time.perf_counter() - self.started


class TimedIntegratedGradientsCallback(IntegratedGradientsCallback):
    """The callback, with its hooks' host time per run recorded: every batch-end and train-end hook from the end of
    one run to the end of the next (a run starts at one batch end and its numbers land at a later one, while training
    goes on), so a run's cost holds its start, its read-back, its logging and the per-step checks between runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_ms: list[float] = []
        self._spent = 0.0  # host seconds in the hooks since the last run landed

    def _timed(self, hook: Any, pl_module: L.LightningModule, *args: Any) -> None:
        # No device synchronisation around every hook: it would stop the device's work from overlapping the next
        # environment step and slow training itself; the hook that logs a run synchronises after, so the device
        # work of its logging counts.
        runs_before = len(self.history)
        started = time.perf_counter()
        hook(*args)
        if len(self.history) > runs_before:
            _synchronize(pl_module.device)
            self.run_ms.append((self._spent + time.perf_counter() - started) * 1e3)
            self._spent = 0.0
        else:
            self._spent += time.perf_counter() - started

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._timed(super().on_train_batch_end, pl_module, trainer, pl_module, *args)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timed(super().on_train_end, pl_module, trainer, pl_module)


def train_once(
    example: ModuleType,
    base: Any,
    held_out: torch.Tensor,
    *,
    with_callback: bool,
    steps: int,
    log_root: Path,
    label: str,
) -> tuple[float, list[float]]:
    """One training run of ``steps`` gradient steps; returns (loop seconds, per-run callback ms)."""
    args = copy.copy(base)  # the example's settings (a dataclass or an argparse.Namespace)
    args.total_timesteps = base.learning_starts + steps * base.train_frequency
    torch.set_num_threads(args.num_threads)
    L.seed_everything(args.seed, verbose=False)
    logger = TensorBoardLogger(save_dir=str(log_root), name=label, version="", default_hp_metric=False)
    timer = LoopTimer()
    callbacks: list[Callback] = []
    ig: TimedIntegratedGradientsCallback | None = None
    if with_callback:
        ig = TimedIntegratedGradientsCallback(
            held_out,
            feature_names=example.FEATURE_NAMES,
            every_n_steps=IG_EVERY_N_STEPS,
            target="mean",
            engine=IGOptions(n_steps=IG_N_STEPS),
            views=ViewOptions(top_k=len(example.FEATURE_NAMES)),
        )
        callbacks.append(ig)
    callbacks.append(timer)  # last, so its on_train_end sees the callback's final run
    agent = example.DQNAgent(args)
    trainer = example.make_trainer(args, logger, callbacks)
    trainer.fit(agent)
    logger.finalize("success")
    if trainer.global_step != steps:
        raise RuntimeError(f"{label}: expected {steps} gradient steps, ran {trainer.global_step}")
    return timer.seconds, (ig.run_ms if ig is not None else [])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--accelerator", choices=("gpu", "cpu"), default="gpu", help="where training and IG run")
    parser.add_argument(
        "--steps", type=int, default=None, help="gradient steps per timed run (default 3000, 500 with --quick)"
    )
    parser.add_argument(
        "--pairs", type=int, default=None, help="off/on pairs, in ABBA order (default 2, 1 with --quick)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of every run")
    parser.add_argument("--quick", action="store_true", help="short runs, one pair: a smoke run")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("benchmarks/results/bench_callback_overhead.md"),
        help="where the markdown goes",
    )
    options = parser.parse_args()
    steps = options.steps if options.steps is not None else (500 if options.quick else 3000)
    pairs = options.pairs if options.pairs is not None else (1 if options.quick else 2)
    if steps < IG_EVERY_N_STEPS or pairs < 1:
        parser.error(f"--steps must be >= {IG_EVERY_N_STEPS} and --pairs >= 1, got {steps} and {pairs}")
    if options.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu needs a CUDA device; none is visible (use --accelerator cpu to try it here)")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")
    warnings.filterwarnings("ignore", message=".*completeness.*")

    example = load_example()
    base = example.parse_args(["--seed", str(options.seed)])
    for name, value in (
        ("accelerator", options.accelerator),
        ("progress_bar", False),
        ("num_held_out", NUM_HELD_OUT),
        ("ig_every_n_steps", IG_EVERY_N_STEPS),
        ("ig_n_steps", IG_N_STEPS),
    ):
        setattr(base, name, value)
    held_out = example.collect_held_out_states(base.env_id, NUM_HELD_OUT, seed=base.seed + 2_000)
    device_name = torch.cuda.get_device_name() if options.accelerator == "gpu" else platform.processor() or "CPU"

    started = time.perf_counter()
    loop_seconds: dict[bool, list[float]] = {False: [], True: []}
    run_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench_callback_") as log_dir:
        log_root = Path(log_dir)
        warm_steps = 2 * IG_EVERY_N_STEPS
        train_once(example, base, held_out, with_callback=True, steps=warm_steps, log_root=log_root, label="warmup")
        order = [False, True, True, False] * ((pairs + 1) // 2)
        for index, with_callback in enumerate(order[: 2 * pairs]):
            label = f"{index}_{'on' if with_callback else 'off'}"
            seconds, ms = train_once(
                example, base, held_out, with_callback=with_callback, steps=steps, log_root=log_root, label=label
            )
            loop_seconds[with_callback].append(seconds)
            run_ms += ms
            print(
                f"run {label:>6}: {seconds:7.2f} s"
                + (f", {len(ms)} IG runs, median {statistics.median(ms):.2f} ms" if ms else ""),
                flush=True,
            )
    total = time.perf_counter() - started

    off = statistics.median(loop_seconds[False])
    on = statistics.median(loop_seconds[True])
    overhead = (on - off) / off * 100
    step_ms = off / steps * 1e3
    runs_per_training = len(run_ms) / pairs  # the overhead budget may space the runs out beyond the cadence
    verdict = "meets" if overhead <= 3.0 else "misses"
    lines = [
        f"## bench_callback_overhead ({'quick' if options.quick else 'full'})",
        "",
        (
            f"examples/dqn_cartpole.py on {device_name} ({options.accelerator}), torch {torch.__version__}, lightning "
            f"{L.__version__}; {steps} gradient steps per run (batch {base.batch_size}, hidden {base.hidden_size}), "
            f"seed {options.seed}; {pairs} off/on pair(s) in ABBA order after a warm-up; callback: IG on "
            f"{NUM_HELD_OUT} held-out states, n_steps={IG_N_STEPS}, every {IG_EVERY_N_STEPS} steps "
            f"at most ({runs_per_training:g} runs per training, the last at the final step); "
            f"benchmark wall time {total:.0f} s."
        ),
        "",
        "| case | training loop wall time (s, median) | per gradient step (ms) | runs |",
        "|---|---:|---:|---:|",
        (
            f"| without callback | {off:.2f} | {off / steps * 1e3:.3f} | "
            f"{', '.join(f'{s:.2f}' for s in loop_seconds[False])} |"
        ),
        f"| with callback | {on:.2f} | {on / steps * 1e3:.3f} | {', '.join(f'{s:.2f}' for s in loop_seconds[True])} |",
        "",
        "| metric | value |",
        "|---|---:|",
        f"| overhead of the callback (wall time) | {overhead:+.2f}% ({verdict} the <= 3% target) |",
        f"| one callback run (its hooks' host time), median | {statistics.median(run_ms):.2f} ms |",
        f"| one callback run, min / max | {min(run_ms):.2f} / {max(run_ms):.2f} ms |",
        f"| callback runs timed | {len(run_ms)} |",
        f"| training time between two runs ({IG_EVERY_N_STEPS} steps) | {step_ms * IG_EVERY_N_STEPS:.1f} ms |",
    ]
    table = "\n".join(lines)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(table + "\n", encoding="utf-8")
    print()
    print(table)


if __name__ == "__main__":
    main()
