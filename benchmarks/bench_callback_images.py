"""What one callback run costs on image and wide-vector states, beside the IG alone; event-file growth; tags.

Three cases, default callback options but ``overhead=None`` (a run at every step: the budget would defer most;
50 steps, figures every 10 runs, the saliency pictures spread over the same cadence, groups):

* ``atari``: a Nature-CNN dueling Q-network, 32 held-out states of shape (4, 84, 84) of
  uniform noise (the worst case for the pictures' PNG size);
* ``atari-blocks``: the same network on frames like a paddle game's (bricks, paddle, ball);
* ``wide``: a dueling MLP on 256 states of 128 features in 8 named groups of 16.

For each case: the IG alone (the engine, the same settings, timed with the device
synchronised, median of repeated calls), then a training whose callback runs at every
step. Two timing callbacks sit before and after the IG callback, synchronise the
device and read the clock around its ``on_train_batch_end``, so a run's time holds
the IG, the gather, the statistics and all the logging; the run's own ``ig/time_ms``
(IG, gather, host copy) subtracted from it gives the logging alone, a number that
does not depend on a second timing of the IG. After each run the writer
is flushed (outside the timed span) and the event file's growth recorded. The first
run (kernel compilation, the first pictures, fonts loaded) is left out; the runs
that draw pictures (read back from the event file) are reported apart, each kind by
its worst run.

``--profile`` also prints, for the ``atari`` case, the top entries (cumulative time)
of cProfile over the part of one run after the IG and the gather (summary,
scalars, text, histograms, pictures, event-file writes): run 1 (no pictures), runs 3
and 6 (the shares over training, the saliency grid) and run 10 (the verdict card; with
``--runs`` of 11 or more). TensorBoard's
event writer checksums every event in pure Python on its own thread (about 0.1 ms
per KB, holding the GIL), which this thread's profile shows only as waiting; what
is left of that work when a run ends shows as the writer's catch-up, the time the
flush after the run waits for it and for the callback's picture worker (which
encodes the pictures beside the training loop).

Usage (repository root; an H200 in the lead's runs)::

    PYTHONPATH=. python benchmarks/bench_callback_images.py [--device cuda] [--runs 21] [--output FILE] [--profile]

It prints a markdown table (and writes it to ``--output`` when given). Targets
(issue 11): one run <= IG + 30 ms, event file <= 1 MB per run, a few hundred tags.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks._common import synchronize
from lightning_ig import IntegratedGradients, IntegratedGradientsCallback
from lightning_ig.models.noise import attribution_mode

KINDS = {"verdict": "ig/0_verdict", "shares": "ig/1_over_training", "grid": "ig/2_saliency"}


class NatureDuelingQ(nn.Module):
    """Nature-DQN convolutions (32 8x8/4, 64 4x4/2, 64 3x3/1), dueling streams of 512; mean over actions = V(s)."""

    def __init__(self, actions: int = 6) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(4, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.value = nn.Sequential(nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 1))
        self.advantage = nn.Sequential(nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.encoder(x)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(1, keepdim=True)


class DuelingMLP(nn.Module):
    def __init__(self, features: int = 128, actions: int = 6, hidden: int = 256) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.value, self.advantage = nn.Linear(hidden, 1), nn.Linear(hidden, actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.body(x)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(1, keepdim=True)


def block_frames(count: int, seed: int = 0) -> torch.Tensor:
    """``(count, 4, 84, 84)`` frames like a paddle game's: dark ground, a wall of bricks, a paddle and a ball
    that move over the 4 stacked frames; what a real agent sees, where noise frames are the worst case for PNG."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.zeros(count, 4, 84, 84)
    frames[:, :, 8:20, 4:80] = 0.6  # the bricks
    for index in range(count):
        paddle, ball_x, ball_y = (int(v) for v in torch.randint(4, 70, (3,), generator=generator))
        for t in range(4):
            frames[index, t, 78:80, paddle + t : paddle + t + 12] = 1.0
            frames[index, t, ball_y + 2 * t : ball_y + 2 * t + 2, ball_x + t : ball_x + t + 2] = 1.0
    return frames


def nature_network() -> nn.Module:
    try:  # the registered model, where models.py has it
        from lightning_ig.models import NatureQNetwork

        return NatureQNetwork(in_channels=4, num_actions=6, noisy=True)
    except ImportError:
        return NatureDuelingQ()


class Module(pl.LightningModule):
    """A LightningModule around a Q-network; its training step is one small regression step."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x).mean(1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


class HookClock(Callback):
    """Reads the clock in ``on_train_batch_end`` (device synchronised); the second also flushes and sizes the log."""

    def __init__(self, starts: list[float] | None, log_dir: Path | None = None) -> None:
        self.starts, self.log_dir = starts, log_dir
        self.ends: list[float] = []
        self.sizes: list[int] = []
        self.flush_ms: list[float] = []
        self.pictures: Any = None  # the IG callback's picture worker, waited for before the flush

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        synchronize(pl_module.device)
        now = time.perf_counter()
        if self.starts is not None:
            self.starts.append(now)
            return
        self.ends.append(now)
        if self.pictures is not None:
            self.pictures.wait()  # the callback's worker: the run's pictures encoded and queued
        trainer.logger.experiment.flush()  # waits for the writer's thread to checksum and write what the run queued
        self.flush_ms.append((time.perf_counter() - now) * 1e3)
        self.sizes.append(
            sum(path.stat().st_size for path in Path(trainer.logger.log_dir).glob("events.out.tfevents.*"))
        )


def ig_alone(
    network: nn.Module, states: torch.Tensor, repeats: int, n_steps: Any = 50, warm: int = 3
) -> tuple[float, Any]:
    """Median ms of ``repeats`` IG calls after ``warm`` ones, and the last result."""
    engine = IntegratedGradients(network, target="mean", n_steps=n_steps, completeness_tol=0.01)
    times = []
    for _ in range(repeats + warm):
        synchronize(states.device)
        started = time.perf_counter()
        with attribution_mode(network):
            result = engine.attribute(states)
        float(result.f_input.sum())  # the callback's run ends with the host copy
        synchronize(states.device)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[warm:]), result


def completeness_costs(device: torch.device, repeats: int) -> list[str]:
    """What a trustworthy completeness error costs on the ReLU Nature-CNN: 50 steps, "auto", or fewer states."""
    torch.manual_seed(0)
    network, states = nature_network().to(device), torch.rand(32, 4, 84, 84, device=device)
    rows = ["| setting | states | steps used | worst relative error | IG time (ms) |", "|---|---:|---:|---:|---:|"]
    for label, count, n_steps in (
        ("50 steps (default)", 32, 50),
        ('n_steps="auto" (tol 0.01)', 32, "auto"),
        ("fewer states, more steps", 8, 256),
        ("fewer states, more steps", 4, 512),
    ):
        ms, result = ig_alone(network, states[:count], repeats, n_steps=n_steps, warm=1)
        rows.append(f"| {label} | {count} | {result.n_steps} | {result.worst_relative_error:.3g} | {ms:.1f} |")
    return rows


class RunProfile:
    """cProfile of chosen callback runs, from the end of the IG and gather to the run's end (``_finish``)."""

    def __init__(self, callback: IntegratedGradientsCallback, runs: tuple[int, ...], top: int = 15) -> None:
        self.runs, self.top, self.index = runs, top, 0
        self.reports: dict[int, str] = {}
        finish = callback._finish

        def profiled_finish(*args: Any, **kwargs: Any) -> Any:
            profiler = cProfile.Profile() if self.index in self.runs else None
            if profiler is not None:
                profiler.enable()
            try:
                return finish(*args, **kwargs)
            finally:
                if profiler is not None:
                    profiler.disable()
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(self.top)
                    self.reports[self.index] = out.getvalue()
                self.index += 1

        callback._finish = profiled_finish  # a benchmark's instrument, nothing more


def measure(case: str, device: torch.device, runs: int, profile: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    if case in ("atari", "atari-blocks"):
        network = nature_network()
        states = torch.rand(32, 4, 84, 84) if case == "atari" else block_frames(32)
        options: dict[str, Any] = {}
    else:
        network, states = DuelingMLP(), torch.randn(256, 128)
        options = {
            "feature_groups": {f"family {k}": list(range(16 * k, 16 * k + 16)) for k in range(8)},
            "feature_names": [f"f{k}.{i}" for k in range(8) for i in range(16)],
        }
    network = network.to(device)
    ig_ms, _ = ig_alone(network, states.to(device), repeats=max(5, runs // 2))
    with tempfile.TemporaryDirectory(prefix="bench_images_") as folder:
        starts: list[float] = []
        before, after = HookClock(starts), HookClock(None)
        # overhead=None: a run at every step, each timed (the 2% budget would defer most of them; the trust checks'
        # cost is bench_checks.py's)
        callback = IntegratedGradientsCallback(
            states, every_n_steps=1, run_at_train_end=False, overhead=None, **options
        )
        after.pictures = callback._pictures  # a benchmark's instrument: the catch-up holds the picture worker's time
        profiler = RunProfile(callback, (1, 3, 6, 10)) if profile else None
        logger = TensorBoardLogger(folder, name=case, default_hp_metric=False)
        trainer = pl.Trainer(
            accelerator=device.type,
            devices=1,
            max_steps=runs + 1,
            logger=logger,
            callbacks=[before, callback, after],
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            log_every_n_steps=10**9,
        )
        data = TensorDataset(states[:8], torch.zeros(8))
        trainer.fit(Module(network), DataLoader(data, batch_size=8))
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(
            logger.log_dir, size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0}
        )
        events.Reload()
        tags = {
            kind: len([t for t in names if t.startswith("ig/")])
            for kind, names in events.Tags().items()
            if kind in ("scalars", "histograms", "images", "tensors")
        }
        # the IG, gather and host copy of each run, by its run (step - 1): a run that did not happen has none
        inside = {event.step - 1: event.value for event in events.Scalars("ig/time_ms")}
        # run i is at global step i + 1 (every_n_steps=1); which runs drew which pictures, as logged
        drawn = {
            kind: {event.step - 1 for event in events.Images(tag)} if tag in events.Tags()["images"] else set()
            for kind, tag in KINDS.items()
        }
    run_ms = [(end - start) * 1e3 for start, end in zip(starts, after.ends)]
    logging_ms = {i: run_ms[i] - own for i, own in inside.items() if i < len(run_ms)}  # the run less its own IG
    growth = [b - a for a, b in zip(after.sizes, after.sizes[1:])]  # bytes written by runs 1, 2, ...
    # run 0 left out; one more run was trained, whose missing pictures are drawn at the end
    later = [i for i in range(1, runs) if i in logging_ms]
    picture_runs = {i for i in later if any(i in runs_of_kind for runs_of_kind in drawn.values())}
    plain = [i for i in later if i not in picture_runs]

    def worst(kind: str) -> float:
        chosen = [logging_ms[i] for i in later if i in drawn[kind]]
        return max(chosen) if chosen else float("nan")

    return {
        "case": case,
        "ig_ms": ig_ms,
        "run_ms": statistics.median(run_ms[i] for i in plain),
        "logging_ms": statistics.median(logging_ms[i] for i in plain),
        "worst": {kind: worst(kind) for kind in KINDS},
        # the verdict card also comes at every failing run (a random ReLU network fails at every run): left out here
        "both": sorted(i for i in later if sum(i in drawn[kind] for kind in drawn if kind != "verdict") > 1),
        "catch_up_ms": max((after.flush_ms[i] for i in picture_runs), default=float("nan")),
        "mean_logging_ms": statistics.mean(logging_ms[i] for i in later),
        "growth_kb": statistics.median(growth[i - 1] for i in plain) / 1024,
        "growth_mean_kb": statistics.mean(growth[i - 1] for i in later) / 1024,
        "tags": tags,
        "runs": runs,
        "profiles": {} if profiler is None else profiler.reports,
    }


def _ms(value: float) -> str:
    return "n/a" if value != value else f"{value:+.1f}"  # NaN: no such run (flat states have no saliency pictures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=21, help="callback runs per case (the first is left out)")
    parser.add_argument("--cases", default="atari,atari-blocks,wide")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--completeness", action="store_true", help='also time n_steps="auto" and its alternatives on the Nature-CNN'
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print cProfile's top 15 (cumulative) of the atari case's runs 1, 3, 6 and 10 after the IG",
    )
    options = parser.parse_args()
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {options.device}: torch sees no CUDA device here; use --device cpu")
    warnings.filterwarnings("ignore")
    device = torch.device(options.device)
    rows = [
        measure(case, device, options.runs, profile=options.profile and case == "atari")
        for case in options.cases.split(",")
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    lines = [
        f"## bench_callback_images on {name} ({device.type}), torch {torch.__version__}, lightning {pl.__version__}",
        "",
        (
            f"{options.runs} callback runs per case (run 0 left out: compilation, first figures), default options "
            "but overhead=None (a run at every step), 50 steps; the pictures every 10 runs, spread over it: the "
            "verdict card at runs 10, 20, ... (and at a run "
            "whose verdict failed or changed), the shares over training at 3, 13, ..., the saliency grid at 6, 16, ... "
            "(flat states: the shares at 5, 15, ...). "
            '"- its own IG": the run\'s wall time less its own `ig/time_ms` (IG, gather, host copy). '
            "The writer's catch-up: how long the flush after a picture run waits for the callback's picture worker and "
            "TensorBoard's writer thread."
        ),
        "",
        (
            "| case | IG alone (ms) | run, median (ms) | run - IG alone (ms) | run - its own IG (ms) "
            "| run with a picture - its own IG (ms, worst): verdict card / shares / saliency grid "
            "| writer's catch-up after a picture run (ms, worst) | mean run - its own IG (ms) "
            "| event file per run (KB, median / mean) | tags (scalars / histograms / images / text) |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        tags = row["tags"]
        lines.append(
            f"| {row['case']} | {row['ig_ms']:.1f} | {row['run_ms']:.1f} | {row['run_ms'] - row['ig_ms']:+.1f} | "
            f"{row['logging_ms']:+.1f} | {' / '.join(_ms(value) for value in row['worst'].values())} | "
            f"{row['catch_up_ms']:.1f} | {row['mean_logging_ms']:+.1f} | {row['growth_kb']:.0f} / "
            f"{row['growth_mean_kb']:.0f} | {tags.get('scalars', 0)} / {tags.get('histograms', 0)} / "
            f"{tags.get('images', 0)} / {tags.get('tensors', 0)} |"
        )
    both = {row["case"]: row["both"] for row in rows if row["both"]}
    if both:
        lines += [
            "",
            (
                "Runs after run 0 that drew two kinds of picture besides a failing run's verdict card (there should be "
                f"none): {both}"
            ),
        ]
    if options.completeness:
        lines += [
            "",
            "Completeness on the ReLU Nature-CNN (random weights, random frames):",
            "",
            *completeness_costs(device, repeats=3),
        ]
    for row in rows:
        for index, report in row["profiles"].items():
            what = {0: "the verdict card", 3: "the shares over training", 6: "the saliency grid"}.get(
                index % 10, "no pictures"
            )
            lines += [
                "",
                f"cProfile of {row['case']} run {index} ({what}) after the IG and the gather:",
                "",
                "```",
                report.strip(),
                "```",
            ]
    table = "\n".join(lines)
    if options.output is not None:
        options.output.parent.mkdir(parents=True, exist_ok=True)
        options.output.write_text(table + "\n", encoding="utf-8")
    print(table)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
