"""What the IG callback costs ``trainer.fit``: DQN-like fits with and without it, per callback run (issue 22).

A user feels the time the callback adds to the fit, not the time of a run inside its hook: the first
run's capture, the picture worker and TensorBoard's writer thread taking the GIL between runs, host
syncs that stall the training work queued on the device. So this benchmark times whole fits.

The training step (:class:`DQNStep`): a dueling NoisyNet (``NatureQNetwork`` on (4, 84, 84) frames or
``MinAtarQNetwork`` on (4, 10, 10)), new noise in the online and target networks at every step, a batch
of 32 transitions sampled on the device from a synthetic replay buffer held there, the double-DQN target
from a frozen copy, Huber loss, Adam. Nothing syncs the host per step except Lightning's own logging of
the loss (every 50 steps).

Fits, each with a fresh Trainer, module and callback, the same seed, in one process, a TensorBoardLogger
in a temporary folder, and timed from the start of the first training batch to the end of
``on_train_end`` (the loggers flushed, the device synchronised at both ends; :class:`FitClock`, the last
callback). Kinds:

* ``off``: no callback;
* ``plain``: the callback with its pictures off (``figure_every_n_runs=None``, ``saliency_states=None``);
* ``defaults``: the callback with its defaults (50 steps, pictures every 10 runs, histograms, groups);
* ``cadence``: the defaults at the default cadence ``every_n_steps=100`` (Nature only);
* ``captum``: :class:`CaptumCallback`, what a user writes by hand with Captum.

The fits come in blocks, one fit of each kind (long: ``runs`` callback runs; short: one run), the order
of a block reversed in every other block (off, plain, ..., captum; captum, ..., plain, off: ABBA), so that
slow drift of the machine falls on both sides alike; a block is one pair per kind. Per block, with
``D(kind, n runs) = fit time - the block's off fit of the same length``:

* first run: ``D(kind, 1)``;
* plain runs: ``(D(plain, R) - D(plain, 1)) / (R - 1)``;
* defaults, mean per run: ``D(defaults, R) / R`` (the first run amortised over R = 100 runs);
* a picture: ``((D(defaults, R) - D(plain, R)) - (D(defaults, 1) - D(plain, 1)))`` divided by the
  pictures the long fit drew beyond the short one's (read back from its event file);
* Captum: ``D(captum, Rc) / Rc`` (its off time read off the line through the block's two off fits when
  its length is neither);
* the default cadence (fits of the long length with ``every_n_steps=100``): a run after the first,
  ``s = (D(cadence) - D(defaults, 1)) / (runs - 1)``; the share of a 100-run fit at that cadence, its
  first run included, ``(D(defaults, 1) + 99 s) / (100 * 100 * step time)`` (the target); beside it the
  share of the fit as measured (its first run amortised over few runs) and the share that the mean per
  run with defaults above gives.

Reported: the median over the blocks and [min, max]; IG alone (``IntegratedGradients.attribute``
repeated, CUDA events) and Captum's IG alone beside; the issue's targets, met or not; and whether the
final weights of the block's fits are bit-identical with and without a callback (cuDNN is put in
deterministic mode so that the check means something; ``--no-deterministic`` leaves torch's defaults).

``--budget-s`` sizes the run: after the warm-up fits (one short fit of each kind, which also measure the
step time and a fit's overhead) and IG alone, it picks the richest plan of :data:`LADDER` whose estimate
fits the time left: the issue's cadence of 20 steps, then a shorter cadence (the same 100 runs in fewer
steps), then fewer Captum runs and pairs and default-cadence fits, fewer pairs last. Blocks run in turn
for all cases, and after the second no block starts that the deadline would cut. The table says what ran.

Usage (repository root; captum must import for the Captum rows)::

    PYTHONPATH=. python benchmarks/bench_callback_training.py [--budget-s 240] [--output FILE]
    PYTHONPATH=. python benchmarks/bench_callback_training.py --quick --device cpu   # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader

from benchmarks._common import device_name, median_ms, write_output
from benchmarks._training import ACTIONS, CaptumCallback, DQNStep, FitClock, Replay
from lightning_ig import IntegratedGradients, IntegratedGradientsCallback, noise_disabled
from lightning_ig.attribution import IGOptions
from lightning_ig.models import MinAtarQNetwork, NatureQNetwork
from lightning_ig.views import ViewOptions

DEFAULT_EVERY = 100  # the callback's default every_n_steps
ISSUE_EVERY = 20  # the issue's cadence for the Nature and MinAtar cases
LONG_RUNS = 100
# (cadence, pairs, Captum pairs, Captum runs per case, default-cadence pairs), richest first: a shorter cadence
# first (the same 100 runs in fewer steps), then fewer Captum runs and pairs and default-cadence fits, the pairs last
LADDER = (
    (20, 5, 3, {"nature": 100, "minatar": 20}, 5),
    (10, 5, 3, {"nature": 100, "minatar": 20}, 5),
    (10, 5, 3, {"nature": 50, "minatar": 20}, 5),
    (5, 5, 3, {"nature": 50, "minatar": 20}, 5),
    (5, 5, 2, {"nature": 30, "minatar": 10}, 3),
    (5, 5, 2, {"nature": 20, "minatar": 10}, 2),
    (5, 4, 2, {"nature": 20, "minatar": 10}, 2),
    (5, 3, 2, {"nature": 20, "minatar": 10}, 2),
)
NONE = (math.nan, math.nan, math.nan)
KIND_LABELS = {
    "off": "off",
    "plain": "plain",
    "defaults": "defaults",
    "cadence": "default cadence",
    "captum": "Captum",
}


@dataclass(frozen=True)
class Case:
    name: str
    frame_shape: tuple[int, int, int]
    held_out: int
    binary: bool  # MinAtar's channels are 0/1 object maps
    default_cadence: bool  # whether the default-cadence fits run on this case

    def network(self) -> nn.Module:
        if self.name == "nature":
            return NatureQNetwork(in_channels=4, num_actions=ACTIONS, noisy=True)
        return MinAtarQNetwork(in_channels=4, num_actions=ACTIONS, noisy=True)


CASES = {
    "nature": Case("nature", (4, 84, 84), 32, binary=False, default_cadence=True),
    "minatar": Case("minatar", (4, 10, 10), 256, binary=True, default_cadence=False),
}


@dataclass(frozen=True)
class Plan:
    every: int  # cadence of the long and short fits
    runs: int  # callback runs per long fit
    pairs: int  # blocks
    captum_pairs: int
    captum_runs: dict[str, int]
    cadence_pairs: int  # blocks with a fit at the default cadence
    default_every: int = DEFAULT_EVERY

    def clamped(self) -> Plan:
        """No more Captum or default-cadence pairs than pairs."""
        return dataclasses.replace(
            self, captum_pairs=min(self.captum_pairs, self.pairs), cadence_pairs=min(self.cadence_pairs, self.pairs)
        )

    def long_steps(self) -> int:
        return self.every * self.runs

    def describe(self) -> str:
        captum = ", ".join(f"{name} {runs}" for name, runs in self.captum_runs.items())
        return (
            f"cadence every {self.every} steps (the issue's: {ISSUE_EVERY}), {self.runs} runs per long fit "
            f"({self.long_steps()} steps), {self.pairs} ABBA pairs; Captum: {self.captum_pairs} pairs of "
            f"({captum}) runs; default cadence: every {self.default_every} steps, {self.cadence_pairs} pairs of "
            f"{self.long_steps() // self.default_every} runs"
        )


# ---------------------------------------------------------------------- one fit


@dataclass
class Setting:
    """What every fit of a case shares."""

    case: Case
    device: torch.device
    replay: Replay
    states: Tensor  # (held_out, *frame_shape) on the CPU, in [0, 1]
    batch_size: int
    n_steps: int
    seed: int
    root: Path
    fits: int = 0


@dataclass
class Fit:
    seconds: float
    wall: float  # the whole trainer.fit call, with the Trainer's construction
    log_dir: Path
    step_s: float = math.nan  # from the mark on, when a mark was asked for
    weights: dict[str, Tensor] | None = None


def make_callbacks(kind: str, setting: Setting, plan: Plan) -> list[Callback]:
    states, n_steps, every = setting.states, setting.n_steps, plan.every
    if kind == "off":
        return []
    if kind == "plain":
        return [
            IntegratedGradientsCallback(
                states,
                every_n_steps=every,
                engine=IGOptions(n_steps=n_steps),
                views=ViewOptions(figure_every_n_runs=None, saliency_states=None),
            )
        ]
    if kind == "defaults":
        return [IntegratedGradientsCallback(states, every_n_steps=every, engine=IGOptions(n_steps=n_steps))]
    if kind == "cadence":
        return [
            IntegratedGradientsCallback(states, every_n_steps=plan.default_every, engine=IGOptions(n_steps=n_steps))
        ]
    if kind == "captum":
        return [CaptumCallback(states, every_n_steps=every, n_steps=n_steps)]
    raise ValueError(f"unknown kind {kind!r}")


def fit(
    setting: Setting, kind: str, steps: int, plan: Plan, *, mark: int | None = None, keep_weights: bool = False
) -> Fit:
    """One fit of ``kind`` over ``steps`` optimizer steps: a fresh module (same seed), callback, logger and Trainer."""
    gc.collect()  # outside the timed span: a collection of the previous fit's garbage falls on neither side
    begun = time.perf_counter()
    pl.seed_everything(setting.seed, verbose=False)
    module = DQNStep(setting.case.network(), setting.replay, setting.batch_size)
    clock = FitClock(mark)
    setting.fits += 1
    logger = TensorBoardLogger(
        setting.root, name=f"{setting.case.name}_{setting.fits:03d}_{kind}", version=0, default_hp_metric=False
    )
    trainer = pl.Trainer(
        accelerator="gpu" if setting.device.type == "cuda" else "cpu",
        devices=[setting.device.index] if setting.device.index is not None else 1,
        max_steps=steps,
        max_epochs=1,
        logger=logger,
        callbacks=[*make_callbacks(kind, setting, plan), clock],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=50,
    )
    trainer.fit(module, DataLoader(range(steps), batch_size=None))
    if trainer.global_step != steps:
        raise RuntimeError(f"{kind}: expected {steps} optimizer steps, ran {trainer.global_step}")
    weights = {k: v.detach().cpu().clone() for k, v in module.online.state_dict().items()} if keep_weights else None
    step_s = (clock.ended - clock.marked) / (steps - mark) if mark else math.nan
    return Fit(clock.seconds, time.perf_counter() - begun, Path(logger.log_dir), step_s, weights)


def count_pictures(log_dir: Path) -> int:
    """Images (charts, saliency grids, maps) the callback logged under ``ig/``, read back from the event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    return sum(len(events.Images(tag)) for tag in events.Tags()["images"] if tag.startswith("ig/"))


# ---------------------------------------------------------------------- the plan


@dataclass
class Measured:
    """What the warm-up fits and the IG-alone timings say about a case, for the plan's estimate."""

    step_s: float
    overhead_s: float  # a fit's wall time outside its timed span (Trainer, set-up, teardown)
    ig_ms: float
    captum_ms: float

    def seconds(self, steps: int, runs: int, per_run_ms: float) -> float:
        return self.overhead_s + steps * self.step_s + runs * per_run_ms / 1e3


def estimate_seconds(plan: Plan, cases: list[Case], measured: dict[str, Measured], captum: bool) -> float:
    """A rough duration of ``plan``: per-run costs guessed from IG alone (the issue's runs were 6-9x it)."""
    total = 0.0
    for case in cases:
        m = measured[case.name]
        plain_ms, defaults_ms, first_ms = m.ig_ms + 10, m.ig_ms + 35, 300.0
        short, long = plan.every, plan.long_steps()
        block = m.seconds(short, 0, 0) + m.seconds(short, 1, first_ms) + m.seconds(short, 1, first_ms + 100)
        block += m.seconds(long, 0, 0) + m.seconds(long, plan.runs, plain_ms) + m.seconds(long, plan.runs, defaults_ms)
        total += plan.pairs * block
        if case.default_cadence:
            total += plan.cadence_pairs * m.seconds(long, long // plan.default_every + 1, defaults_ms)
        if captum:
            runs = plan.captum_runs[case.name]
            total += plan.captum_pairs * m.seconds(plan.every * runs, runs, 1.1 * m.captum_ms + 10)
    return total


def choose_plan(
    options: argparse.Namespace, cases: list[Case], measured: dict[str, Measured], captum: bool, left_s: float
) -> tuple[Plan, float, bool]:
    """The richest plan of the ladder whose estimate fits ``left_s`` (the leanest if none does), with the options'
    fixed values applied to every rung; returns it, its estimate and whether it fits."""
    rungs = [
        Plan(every, LONG_RUNS, pairs, captum_pairs, dict(runs), cadence)
        for every, pairs, captum_pairs, runs, cadence in LADDER
    ]
    if options.quick:
        rungs = [Plan(1, 12, 2, 1, {"nature": 4, "minatar": 4}, 2, default_every=3)]
    fixed = {key: getattr(options, key) for key in ("every", "runs", "pairs", "captum_pairs") if getattr(options, key)}
    if options.captum_runs:
        fixed["captum_runs"] = dict.fromkeys(CASES, options.captum_runs)
    fixed_rungs = [dataclasses.replace(rung, **fixed).clamped() for rung in rungs]
    rungs = [rung for index, rung in enumerate(fixed_rungs) if rung not in fixed_rungs[:index]]  # each plan once
    for rung in rungs:
        seconds = estimate_seconds(rung, cases, measured, captum)
        if seconds <= left_s:
            return rung, seconds, True
    return rungs[-1], estimate_seconds(rungs[-1], cases, measured, captum), False


# ---------------------------------------------------------------------- measuring a case


@dataclass
class CaseResult:
    case: Case
    ig_ms: float
    captum_alone_ms: float
    times: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)  # (kind, length) -> block -> s
    pictures: int = 0  # pictures of the long defaults fit beyond the short one's
    weights: dict[tuple[str, int], dict[str, Tensor]] = field(default_factory=dict)  # (kind, block) -> final weights


def ig_alone(setting: Setting, repeats: int) -> tuple[float, float]:
    """Median ms of the engine's repeated call and of Captum's IG on the held-out states (noise off, eval mode)."""
    torch.manual_seed(setting.seed)
    network = setting.case.network().to(setting.device).eval()
    states = setting.states.to(setting.device)
    engine = IntegratedGradients(network, target="mean", n_steps=setting.n_steps)
    with noise_disabled(network):
        ours = median_ms(lambda: engine.attribute(states), setting.device, repeats=repeats, warmup=3)
        try:
            from captum.attr import IntegratedGradients as CaptumIG
        except ImportError:
            return ours, math.nan
        captum = CaptumIG(lambda x: network(x).mean(dim=1))
        baselines = torch.zeros_like(states)
        theirs = median_ms(
            lambda: captum.attribute(
                states,
                baselines=baselines,
                n_steps=setting.n_steps,
                method="gausslegendre",
                return_convergence_delta=True,
            ),
            setting.device,
            repeats=max(3, repeats // 6),
            warmup=1,
        )
    return ours, theirs


def block_fits(case: Case, plan: Plan, block: int, captum: bool) -> list[tuple[str, str, int]]:
    """(kind, length, steps) of one block: forward in even blocks, reversed in odd ones (ABBA)."""
    short, long = plan.every, plan.long_steps()
    fits = [
        ("off", "short", short),
        ("plain", "short", short),
        ("defaults", "short", short),
        ("off", "long", long),
        ("plain", "long", long),
        ("defaults", "long", long),
    ]
    if case.default_cadence and long >= 2 * plan.default_every and block < plan.cadence_pairs:
        fits.append(("cadence", "long", long))
    if captum and block < plan.captum_pairs:
        fits.append(("captum", "captum", plan.every * plan.captum_runs[case.name]))
    return fits if block % 2 == 0 else fits[::-1]


def run_block(setting: Setting, result: CaseResult, plan: Plan, block: int, captum: bool) -> None:
    """One block's fits of a case; the first pair's weights kept for the bit-identity check, its pictures counted."""
    pictures = {}
    for kind, length, steps in block_fits(setting.case, plan, block, captum):
        keep = length != "short" and (block == 0 or (block == 1 and kind == "off"))
        done = fit(setting, kind, steps, plan, keep_weights=keep)
        result.times.setdefault((kind, length), {})[block] = done.seconds
        print(
            f"  {setting.case.name} block {block} {kind:>8} {length:>6} {steps:>5} steps: {done.seconds:8.3f} s "
            f"(fit call {done.wall:.2f} s)",
            flush=True,
        )
        if done.weights is not None:
            result.weights[kind, block] = done.weights
        if block == 0 and kind == "defaults":
            pictures[length] = count_pictures(done.log_dir)
    if len(pictures) == 2:
        result.pictures = pictures["long"] - pictures["short"]


def identical(result: CaseResult, plan: Plan) -> dict[str, bool]:
    """Whether the first pair's on fits end with the off fit's weights, and the next pair's off fit too."""

    def equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    kept, same = result.weights, {}
    off = kept.get(("off", 0))
    captum_same_length = plan.captum_runs[result.case.name] == plan.runs
    for kind in ("plain", "defaults", "cadence", "captum"):
        if off is not None and (kind, 0) in kept and (kind != "captum" or captum_same_length):
            same[KIND_LABELS[kind]] = equal(off, kept[kind, 0])
    if off is not None and ("off", 1) in kept:
        same["off vs off (next pair)"] = equal(off, kept["off", 1])
    return same


# ---------------------------------------------------------------------- analysis and table


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, min and max of the values that are numbers (NaN when none is)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return NONE
    return statistics.median(values), min(values), max(values)


def block_values(result: CaseResult, plan: Plan, block: int) -> dict[str, float]:
    """One block's derived per-run impacts (ms), step time (ms) and the default cadence's shares (%)."""
    times, runs, short, long = result.times, plan.runs, plan.every, plan.long_steps()
    off_short, off_long = times["off", "short"][block], times["off", "long"][block]

    def delta_ms(kind: str, length: str) -> float:
        return (times[kind, length][block] - (off_short if length == "short" else off_long)) * 1e3

    plain_1, defaults_1 = delta_ms("plain", "short"), delta_ms("defaults", "short")
    plain_r, defaults_r = delta_ms("plain", "long"), delta_ms("defaults", "long")
    step_ms = off_long * 1e3 / long
    values = {
        "plain first": plain_1,
        "defaults first": defaults_1,
        "plain": (plain_r - plain_1) / (runs - 1),
        "defaults": defaults_r / runs,
        "step": step_ms,
        "derived %": defaults_r / runs / (plan.default_every * step_ms) * 100,
    }
    if result.pictures > 0:
        values["picture"] = ((defaults_r - plain_r) - (defaults_1 - plain_1)) / result.pictures
    values["plain mean"] = plain_r / runs
    if block in times.get(("cadence", "long"), {}):
        cadence = delta_ms("cadence", "long")
        steady = (cadence - defaults_1) / (long // plan.default_every - 1)
        values["cadence run"] = steady
        values["cadence direct %"] = cadence / (off_long * 1e3) * 100
        values["cadence %"] = (defaults_1 + 99 * steady) / (100 * plan.default_every * step_ms) * 100
    if block in times.get(("captum", "captum"), {}):
        captum_runs = plan.captum_runs[result.case.name]
        steps = plan.every * captum_runs
        off = off_short + (steps - short) * (off_long - off_short) / (long - short)  # the block's off line
        values["captum"] = (times["captum", "captum"][block] - off) * 1e3 / captum_runs
        values["captum ratio"] = values["captum"] / values["defaults"]
    return values


def analyse(result: CaseResult, plan: Plan) -> dict[str, tuple[float, float, float]]:
    """Median, min and max over the blocks of each derived value."""
    per_block = [block_values(result, plan, block) for block in sorted(result.times["off", "long"])]
    keys = dict.fromkeys(key for values in per_block for key in values)
    return {key: spread([values[key] for values in per_block if key in values]) for key in keys}


def _interval(values: tuple[float, float, float], digits: int = 1) -> str:
    median, low, high = values
    if math.isnan(median):
        return "n/a"
    if low == high:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _met(value: float, ok: Callable[[float], bool]) -> str:
    return "" if math.isnan(value) else ("met" if ok(value) else "**not met**")


TABLE_HEAD = [
    (
        "| case | what | runs per fit | impact per run, ms: median [min, max] | x IG alone | Captum / ours | target "
        "| met |"
    ),
    "|---|---|---:|---:|---:|---:|---|---|",
]


def case_rows(result: CaseResult, plan: Plan) -> list[str]:
    """The table's rows of one case; the targets are the issue's (Nature and MinAtar)."""
    got, ig, name = analyse(result, plan), result.ig_ms, result.case.name
    nature = name == "nature"

    def row(what: str, runs: Any, key: str, ratio: str = "", target: str = "", met: str = "", digits: int = 1) -> str:
        values = (ig, ig, ig) if key == "ig" else got.get(key, NONE)
        if key == "captum alone":
            values = (result.captum_alone_ms,) * 3
        times_ig = "" if math.isnan(values[0]) or "%" in what else f"{values[0] / ig:.1f}x"
        return f"| {name} | {what} | {runs} | {_interval(values, digits)} | {times_ig} | {ratio} | {target} | {met} |"

    plain, defaults, ratio = got.get("plain", NONE)[0], got.get("defaults", NONE)[0], got.get("captum ratio", NONE)
    goal = 5 if nature else 10
    rows = [
        row("IG alone (engine, repeated call)", "", "ig", digits=2),
        row("Captum IG alone", "", "captum alone"),
        row(
            "callback, plain runs (after the first)",
            plan.runs,
            "plain",
            target=f"<= IG + 3 = {ig + 3:.1f}" if nature else "",
            met=_met(plain, lambda v: v <= ig + 3) if nature else "",
        ),
        row("callback, plain, mean per run (first run amortised)", plan.runs, "plain mean"),
        row("callback, a picture (over a plain run)", f"{result.pictures} pictures", "picture"),
        row("callback, first run, plain", 1, "plain first"),
        row("callback, first run, defaults (all pictures)", 1, "defaults first"),
        row(
            "callback, defaults, mean per run (first run amortised)",
            plan.runs,
            "defaults",
            target=f"<= IG + 8 = {ig + 8:.1f}" if nature else "",
            met=_met(defaults, lambda v: v <= ig + 8) if nature else "",
        ),
        row(
            "Captum callback, mean per run",
            plan.captum_runs[name],
            "captum",
            ratio=_interval(ratio) + "x",
            target=f"Captum / ours >= {goal}x",
            met=_met(ratio[0], lambda v: v >= goal),
        ),
    ]
    if result.case.default_cadence:
        every, long = plan.default_every, plan.long_steps()
        share = got.get("cadence %", NONE)[0]
        rows += [
            row(f"default cadence (every {every}): a run after the first", long // every, "cadence run"),
            row(
                f"default cadence: % of a {100 * every}-step fit (100 runs, first included)",
                100,
                "cadence %",
                target="<= 1%",
                met=_met(share, lambda v: v <= 1),
                digits=2,
            ),
            row(f"default cadence: % of the {long}-step fit as measured", long // every, "cadence direct %", digits=2),
            row("default cadence: % from the mean per run above", "", "derived %", digits=2),
        ]
    return rows


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", default="nature,minatar", help="comma-separated: nature, minatar")
    parser.add_argument("--budget-s", type=float, default=240.0, help="seconds the whole benchmark may take")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few fits: a smoke run (CPU is fine)")
    parser.add_argument(
        "--every", type=int, help=f"cadence of the fits (default: by the budget, {ISSUE_EVERY} at most)"
    )
    parser.add_argument("--runs", type=int, help=f"callback runs per long fit (default {LONG_RUNS})")
    parser.add_argument("--pairs", type=int, help="ABBA pairs (blocks) (default 5)")
    parser.add_argument("--captum-pairs", type=int, help="blocks with a Captum fit (default 3)")
    parser.add_argument("--captum-runs", type=int, help="Captum runs per fit (default: by the budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-deterministic", action="store_true", help="leave cuDNN's algorithm choice to torch")
    parser.add_argument("--output", type=Path, default=None, help="also write the markdown here")
    options = parser.parse_args()
    for key in ("every", "runs", "pairs", "captum_pairs", "captum_runs"):
        value, least = getattr(options, key), 2 if key == "runs" else 1
        if value is not None and value < least:
            parser.error(f"--{key.replace('_', '-')} must be >= {least}, got {value}")
    unknown = [name for name in options.cases.split(",") if name.strip() not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {unknown}; choose from {sorted(CASES)}")
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA device; none is visible (try --quick --device cpu)")
    return options


def quiet() -> None:
    """Lightning's per-fit banners and the warnings every fit would repeat."""
    for message in (
        ".*does not have many workers.*",
        ".*smaller than the logging interval.*",
        ".*completeness.*",
        ".*max_logged_features.*",
        ".*GPU available but not used.*",
        ".*IntegratedGradientsCallback.*",
        ".*LeafSpec.*",
    ):
        warnings.filterwarnings("ignore", message=message)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def prepare(
    case: Case, options: argparse.Namespace, device: torch.device, folder: Path, captum: bool
) -> tuple[Setting, CaseResult, Measured]:
    """The case's data, then its warm-up (one short fit of each kind: kernels compiled, caches filled, the step
    time and a fit's overhead measured) and IG alone."""
    quick = options.quick
    generator = torch.Generator().manual_seed(options.seed + 1)
    count = min(case.held_out, 2 if case.name == "nature" else 16) if quick else case.held_out
    states = torch.rand((count, *case.frame_shape), generator=generator)  # noise frames: the pictures' worst case
    states = (states < 0.1).float() if case.binary else states
    capacity = 64 if quick else (4096 if case.name == "nature" else 16384)
    replay = Replay(capacity, case.frame_shape, case.binary, device, options.seed + 2)
    n_steps, batch = (8, 4) if quick else (50, 32)
    setting = Setting(case, device, replay, states, batch, n_steps, options.seed, folder)
    warm = Plan(1 if quick else 5, 2, 1, 1, {}, 1, default_every=3 if quick else DEFAULT_EVERY)
    warm_steps = 6 if quick else 60
    off = fit(setting, "off", warm_steps, warm, mark=warm_steps // 3)
    overheads = [off.wall - off.seconds]
    for kind in ("plain", "defaults", "cadence", "captum"):
        if (kind == "cadence" and not case.default_cadence) or (kind == "captum" and not captum):
            continue
        done = fit(setting, kind, warm.default_every if kind == "cadence" else warm.long_steps(), warm)
        overheads.append(done.wall - done.seconds)
    ig_ms, captum_ms = ig_alone(setting, repeats=10 if quick else 30)
    measured = Measured(off.step_s, statistics.median(overheads), ig_ms, captum_ms)
    print(
        f"{case.name}: step {off.step_s * 1e3:.2f} ms, fit overhead {measured.overhead_s:.2f} s, IG alone "
        f"{ig_ms:.2f} ms, Captum IG alone {captum_ms:.1f} ms",
        flush=True,
    )
    return setting, CaseResult(case, ig_ms, captum_ms), measured


def render(
    results: list[CaseResult],
    settings: dict[str, Setting],
    plan: Plan,
    options: argparse.Namespace,
    captum_version: str | None,
    device: torch.device,
    notes: list[str],
) -> str:
    some = settings[results[0].case.name]
    frames = ", ".join(
        f"{r.case.name}: {len(settings[r.case.name].states)} held-out {r.case.frame_shape} frames, "
        f"step {analyse(r, plan)['step'][0]:.2f} ms"
        for r in results
    )
    lines = [
        (
            f"## bench_callback_training on {device_name(device)} ({device.type}), torch {torch.__version__}, "
            f"lightning {pl.__version__}, captum {captum_version or 'not installed'}"
        ),
        "",
        (
            f"{'QUICK (a smoke run, tiny sizes: not a measurement). ' if options.quick else ''}DQN-like step (dueling "
            f"NoisyNet, batch {some.batch_size}, double-DQN target, Adam, new noise every step); callback n_steps "
            f"{some.n_steps}; {plan.describe()}. Impact = (fit time with - without) per callback run, per ABBA pair; "
            f"median [min, max] over the pairs. {frames}."
        ),
        "",
        *TABLE_HEAD,
        *(line for result in results for line in case_rows(result, plan)),
        "",
    ]
    same = "; ".join(
        f"{r.case.name}: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in identical(r, plan).items())
        for r in results
    )
    lines.append(
        f"Training bit-identical with and without the callback (the online network's final weights and noise "
        f"buffers, torch.equal, same seed, first pair; cuDNN deterministic: {not options.no_deterministic}): "
        f"{same}."
    )
    for result in results:
        offs = list(result.times["off", "long"].values())
        middle = statistics.median(offs)
        lines.append(
            f"Off fits ({result.case.name}, {plan.long_steps()} steps): median {middle:.2f} s, from "
            f"{min(offs):.2f} to {max(offs):.2f} s ({(max(offs) - min(offs)) / middle * 100:.1f}% of the median)."
        )
    return "\n".join([*lines, *notes])


def main() -> None:
    options = parse_options()
    started = time.perf_counter()
    device = torch.device(options.device)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = not options.no_deterministic
    if device.type == "cpu":  # the CPU is for smoke runs; one thread, as spinning threads crawl on a shared box
        torch.set_num_threads(1)
    quiet()
    try:
        import captum

        captum_version: str | None = captum.__version__
    except ImportError:
        captum_version = None
    cases = [CASES[name.strip()] for name in options.cases.split(",") if name.strip()]
    margin = 5.0  # the analysis, the table and the temporary folder's removal
    with tempfile.TemporaryDirectory(prefix="bench_training_") as folder:
        settings, results, measured = {}, {}, {}
        for case in cases:
            settings[case.name], results[case.name], measured[case.name] = prepare(
                case, options, device, Path(folder), captum_version is not None
            )
        left = options.budget_s - (time.perf_counter() - started) - margin
        plan, estimate, fits = choose_plan(options, cases, measured, captum_version is not None, left)
        print(
            f"plan: {plan.describe()}; estimate {estimate:.0f} s of {left:.0f} s left"
            + ("" if fits else " (the leanest plan: over the budget)"),
            flush=True,
        )
        # blocks outside, cases inside: a plan cut short by the deadline still has as many pairs for every case
        deadline, last_block, done = started + options.budget_s - margin, 0.0, 0
        for block in range(plan.pairs):
            if block >= 2 and time.perf_counter() + last_block > deadline:
                break
            began = time.perf_counter()
            for case in cases:
                run_block(settings[case.name], results[case.name], plan, block, captum_version is not None)
            last_block, done = time.perf_counter() - began, block + 1
    notes = [] if done == plan.pairs else [f"Cut short by the budget: {done} of {plan.pairs} pairs ran."]
    plan = dataclasses.replace(plan, pairs=done).clamped()
    notes.append(
        f"Benchmark wall time {time.perf_counter() - started:.0f} s (budget {options.budget_s:.0f} s, plan "
        f"estimate {estimate:.0f} s after {options.budget_s - margin - left:.0f} s of warm-up)."
    )
    text = render(list(results.values()), settings, plan, options, captum_version, device, notes)
    write_output(text, options.output)
    print()
    print(text, flush=True)


if __name__ == "__main__":
    main()
