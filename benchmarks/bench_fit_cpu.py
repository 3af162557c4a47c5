"""What the IG callback adds to ``trainer.fit`` where small agents train: the examples' fits on a CPU, one process each.

The CartPole and MinAtar examples (``examples/dqn_cartpole.py``, ``examples/dqn_minatar.py``) are trained at their
defaults on the CPU (one torch thread, the example's environments, replay, batch 128, Adam, the callback's cadence
and held-out states), each fit in a fresh process, by kind:

* ``none``: no callback;
* ``ours``: :class:`~lightning_ig.IntegratedGradientsCallback` as the example makes it (its defaults, the example's
  settings: every 500 steps on 256 states for CartPole, every 1000 steps on 64 frames grouped by channel for MinAtar,
  50 points);
* ``ours_inline`` (not run by default): ``ours`` with every run on the training thread, as where torch uses every
  core (the A/B of the runs beside training on a spare core);
* ``captum``: :class:`CaptumCallback`, what a user writes by hand instead: ``captum.attr.IntegratedGradients``,
  Gauss-Legendre 50 points, ``return_convergence_delta=True``, per-feature (per-channel) mean ``|attr|`` and the worst
  relative completeness error through ``trainer.logger.log_metrics``, the same cadence and states, the noise off
  (``noise_disabled``) and the model in eval mode during the run.

The fits come in blocks of one fit per kind, the order reversed in every other block (none, ours, captum; captum,
ours, none: ABBA), so that a slow drift of the machine falls on both sides alike; a block gives one pair per kind:
its fit against the block's ``none`` fit. Reported per case and kind, median [min, max] over the blocks:

* the fit's wall time (``trainer.fit``, the example's replay warm-up included) and the time added, ``fit / none - 1``
  per pair;
* the training thread's CPU time added per pair (``time.thread_time`` around the fit): what the callback did on the
  training thread, without the time other work held the cores, but blind to what a second thread does to training;
* the callback's hooks (``time.perf_counter`` and ``time.thread_time`` around every hook call): the batch ends' time
  per run (wherever a run starts or ends: the first run's calibration and checks included), a steady run's CPU time
  (its start and the next batch end, where ours ends it; Captum's ends at once), all hooks of the fit;
* the process's CPU time; whether the final weights are bit for bit those of the first kind;
* how busy the machine was with other work during each fit (``/proc/stat``'s busy time less the fit's own, in
  cores): on a shared machine that is the noise, and the line under each table says what one pair can resolve.

Accuracy is not compared here (the worst relative completeness errors of Captum and of the callback are not defined
alike); ``benchmarks/bench_trust.py`` measures it against exact references.

Each child process prints one JSON line (``--output`` keeps them beside the table); ``--kinds`` picks the kinds, the
first the reference of the pairs; a prototype registers its own in ``KINDS`` and calls :func:`main` (a callback's
``bench_extra()``, where it has one, adds its own numbers to the record).

Usage (repository root; gymnasium, minatar and captum must import)::

    PYTHONPATH=. python benchmarks/bench_fit_cpu.py [--cases cartpole minatar] [--pairs 5] [--output FILE]
    PYTHONPATH=. python benchmarks/bench_fit_cpu.py --cases cartpole --steps 3000 --pairs 1   # a quick look

The examples' lengths (24,000 and 24,687 gradient steps), both cases and 5 pairs make well over an hour on two cores;
``--steps`` shortens every fit at the same cadence (the fit's fixed costs, set-up and the last run, then weigh more).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
CASES = {"cartpole": "dqn_cartpole.py", "minatar": "dqn_minatar.py"}
DEFAULT_KINDS = ("none", "ours", "captum")
HOOKS = ("setup", "on_fit_start", "on_train_batch_end", "on_train_epoch_end", "on_train_end", "teardown")


def load_example(case: str) -> ModuleType:
    """Import the case's example script as a module (the examples folder is not a package)."""
    path = REPO / "examples" / CASES[case]
    spec = importlib.util.spec_from_file_location(f"{case}_example", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load the example from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


class CaptumCallback(Callback):
    """What a user writes by hand with Captum: IG every ``every_n_steps`` steps, per-feature scalars to the loggers.

    ``captum.attr.IntegratedGradients`` on ``V(s)`` (the mean over the actions) of the held-out states against zeros,
    ``n_steps`` Gauss-Legendre points, ``return_convergence_delta=True``, the model in eval mode and its noise off
    (``noise_disabled``) during the run. Logged: per feature (per channel for frames) the mean ``|attr|``, and the
    worst relative completeness error ``|delta| / |F(x) - F(b)|`` (``F(x) - F(b) = sum(attr) - delta``).
    """

    def __init__(self, states: torch.Tensor, *, every_n_steps: int, n_steps: int = 50) -> None:
        super().__init__()
        self.states, self.every_n_steps, self.n_steps = states, every_n_steps, n_steps
        self.runs = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from captum.attr import IntegratedGradients

        self._states = self.states.to(pl_module.device)
        self._ig = IntegratedGradients(lambda x: pl_module(x).mean(dim=1))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every_n_steps:
            return
        from lightning_ig import noise_disabled

        training = pl_module.training
        pl_module.eval()
        try:
            with noise_disabled(pl_module):
                attributions, delta = self._ig.attribute(
                    self._states,
                    baselines=torch.zeros_like(self._states),
                    n_steps=self.n_steps,
                    method="gausslegendre",
                    return_convergence_delta=True,
                )
        finally:
            pl_module.train(training)
        flat = attributions.detach().reshape(len(attributions), attributions.shape[1], -1)  # (B, F or C, pixels)
        difference = flat.sum(dim=(1, 2)) - delta  # F(x) - F(b)
        worst = float((delta.abs() / difference.abs()).max())
        mean_abs = flat.abs().sum(dim=2).mean(dim=0).tolist()  # per feature, or per channel summed over its pixels
        metrics = {f"captum/feature_{i}/mean_abs": value for i, value in enumerate(mean_abs)}
        metrics["captum/completeness/worst_relative_error"] = worst
        trainer.logger.log_metrics(metrics, step=step)
        self.runs += 1


def time_hooks(callback: Any) -> dict[str, list[tuple[int, float, float]]]:
    """Wrap the callback's hooks (instance attributes, which Lightning calls): ``(global_step, wall s, CPU s)``.

    The CPU time is the calling thread's: what the hook itself did, whatever else the machine ran meanwhile.
    """
    calls: dict[str, list[tuple[int, float, float]]] = {hook: [] for hook in HOOKS}
    for hook in HOOKS:
        method = getattr(callback, hook)

        @functools.wraps(method)
        def timed(trainer: Any, *args: Any, _method: Callable[..., Any] = method, _hook: str = hook, **kw: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return _method(trainer, *args, **kw)
            finally:
                calls[_hook].append((trainer.global_step, time.perf_counter() - wall, time.thread_time() - cpu))

        setattr(callback, hook, timed)
    return calls


class StepClock(Callback):
    """The training thread's CPU per optimizer step, placed first among the callbacks: ``inside`` from the batch's
    start to its end (the forward, backward and optimizer step, and every callback's hooks Lightning calls in
    between), ``between`` from a batch's end to the next one's start (the other callbacks' batch ends, the next
    batch's fetch)."""

    def __init__(self) -> None:
        self.inside: list[float] = []
        self.between: list[float] = []
        self.steps: list[int] = []
        self._started = self._ended = float("nan")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.thread_time()
        if self.steps:
            self.between.append(now - self._ended)
        self._started = now

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._ended = time.thread_time()
        self.inside.append(self._ended - self._started)
        self.steps.append(trainer.global_step)

    def after(self, every: int, steps: int = 40, before: int = 50) -> float:
        """Seconds of CPU the ``steps`` steps after each cadence point take beyond the median of the ``before`` steps
        before it, averaged over the points (the steps after a run; without a callback, the fit's own periodic
        work at those steps)."""
        excess = []
        for index, step in enumerate(self.steps):
            if step % every == 0 and before + 10 <= index and index + steps < len(self.steps):
                usual = statistics.median(self.inside[index - before - 10 : index - 10])
                excess.append(sum(self.inside[index + 1 : index + 1 + steps]) - steps * usual)
        return statistics.mean(excess) if excess else float("nan")


def busy_seconds() -> float:
    """Seconds of CPU the whole machine spent busy so far (``/proc/stat``; NaN where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer of ``module``, in name order: equal digests, the same bits."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _ours(case: str, example: ModuleType, args: Any, held_out: torch.Tensor, agent: Any) -> list:
    if case == "cartpole":
        return [example.make_ig_callback(args, held_out)]
    return [example.make_ig_callback(args, held_out, agent.envs.channel_names, agent.envs.action_names)]


def _captum(case: str, example: ModuleType, args: Any, held_out: torch.Tensor, agent: Any) -> list:
    # its own 50 Gauss-Legendre points, what a user writes by hand (the examples' n_steps may be "budget")
    return [CaptumCallback(held_out, every_n_steps=args.ig_every_n_steps)]


def _ours_inline(case: str, example: ModuleType, args: Any, held_out: torch.Tensor, agent: Any) -> list:
    """``ours`` with every run on the training thread, as on a machine without a core to spare (the A/B of the runs
    beside training)."""
    from lightning_ig.callback import fit  # this kind alone

    fit.idle_core = lambda *_: None  # this child process only
    return _ours(case, example, args, held_out, agent)


KINDS: dict[str, Callable[..., list]] = {
    "none": lambda *_: [],
    "ours": _ours,
    "ours_inline": _ours_inline,
    "captum": _captum,
}
"""Each kind's callbacks: ``maker(case, example, args, held_out, agent) -> list``."""


def example_args(case: str, example: ModuleType, steps: int | None, seed: int, runs_dir: str) -> Any:
    """The example's defaults on the CPU, ``steps`` gradient steps (``None``: the example's own length)."""
    flags = ["--seed", str(seed), "--accelerator", "cpu", "--no-progress-bar", "--runs-dir", runs_dir]
    base = example.parse_args(flags)
    if steps is not None:
        per_step = base.train_frequency if case == "cartpole" else base.num_envs
        flags += ["--total-timesteps", str(base.learning_starts + steps * per_step)]
    return example.parse_args(flags)


def fit_once(case: str, kind: str, steps: int | None, seed: int) -> dict[str, Any]:
    """One fit of ``kind`` in this process: its times, the callback's hooks, the final weights' digest."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")
    warnings.filterwarnings("ignore", message=".*IntegratedGradientsCallback.*")  # the trouble warnings: once each
    example = load_example(case)

    class LoopClock(Callback):
        """First training batch's start to the end of training (after every other callback's ``on_train_end``)."""

        started = ended = float("nan")

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                self.started = time.perf_counter()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            for logger in trainer.loggers:  # what waits in TensorBoard's writer thread is the fit's too
                logger.experiment.flush()
            self.ended = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="bench_fit_cpu_") as runs_dir:
        args = example_args(case, example, steps, seed, runs_dir)
        torch.set_num_threads(args.num_threads)
        L.seed_everything(args.seed, workers=True, verbose=False)
        held_out_seed = args.seed + 2_000
        game = args.env_id if case == "cartpole" else args.game
        held_out = example.collect_held_out_states(game, args.num_held_out, seed=held_out_seed)
        agent = example.DQNAgent(args)
        callbacks = KINDS[kind](case, example, args, held_out, agent)
        hooks = [time_hooks(callback) for callback in callbacks]
        clock, steps_clock = LoopClock(), StepClock()
        logger = TensorBoardLogger(save_dir=runs_dir, name="fit", version="", default_hp_metric=False)
        trainer = example.make_trainer(args, logger, [steps_clock, *callbacks, clock])
        load, busy, cpu, thread = os.getloadavg()[0], busy_seconds(), own_cpu_seconds(), time.thread_time()
        started = time.perf_counter()
        trainer.fit(agent)
        wall = time.perf_counter() - started
        cpu, busy, thread = own_cpu_seconds() - cpu, busy_seconds() - busy, time.thread_time() - thread
        logger.finalize("success")
    every = args.ig_every_n_steps
    record: dict[str, Any] = {
        "case": case,
        "kind": kind,
        "steps": trainer.global_step,
        "fit_s": wall,
        "loop_s": clock.ended - clock.started,
        "cpu_s": cpu,
        "training_thread_cpu_s": thread,
        "others_cores": (busy - cpu) / wall,
        "load": load,
        "digest": weights_digest(agent.q_network),
        "every": every,
        "inside_steps_s": sum(steps_clock.inside),
        "between_steps_s": sum(steps_clock.between),
        "after_point_ms": 1e3 * steps_clock.after(every),
        "step_cpu_us": 1e6 * statistics.median(steps_clock.inside),
    }
    for callback, calls in zip(callbacks, hooks):
        ends = {step: (seconds, cpu_seconds) for step, seconds, cpu_seconds in calls["on_train_batch_end"]}
        starts = [step for step in ends if step > 0 and step % every == 0]  # global_step after the batch
        nothing = (0.0, 0.0)
        batch_ends = calls["on_train_batch_end"]
        everything = [call for hook in HOOKS for call in calls[hook]]
        record.update(
            runs=getattr(callback, "runs", len(starts)),  # Captum's count; ours: its history, below
            periodic_runs=len(starts),  # started at a batch end (the runs at the end of training aside)
            run_ms=[1e3 * (ends[step][0] + ends.get(step + 1, nothing)[0]) for step in starts],
            run_cpu_ms=[1e3 * (ends[step][1] + ends.get(step + 1, nothing)[1]) for step in starts],
            batch_end_s=sum(seconds for _, seconds, _ in batch_ends),
            batch_end_cpu_s=sum(cpu_seconds for _, _, cpu_seconds in batch_ends),
            hooks_s=sum(seconds for _, seconds, _ in everything),
            hooks_cpu_s=sum(cpu_seconds for _, _, cpu_seconds in everything),
            fit_start_ms=1e3 * sum(seconds for _, seconds, _ in calls["setup"] + calls["on_fit_start"]),
            train_end_ms=1e3 * sum(seconds for _, seconds, _ in calls["on_train_end"]),
        )
        record.update(getattr(callback, "bench_extra", dict)())  # a prototype's own numbers
        history = getattr(callback, "history", None)
        if history is not None:
            record["runs"] = len(history)
            budget = callback._budget  # the callback's own measure: ig/overhead at its last run, what it reduced
            record.update(overhead=history[-1]["overhead"] if history else 0.0, reduced=budget.reduced)
            record.update(deferred=budget.deferred, full_run_ms=1e3 * budget.run_costs.get(1, float("nan")))
            # equal digests: the same numbers in every run (mean |attr| and mean attr of every unit)
            record["history_digest"] = hashlib.sha256(json.dumps(history, sort_keys=True).encode()).hexdigest()
    return record


def run_child(case: str, kind: str, steps: int | None, seed: int) -> dict[str, Any]:
    """One fit in a fresh process (this script, or the prototype that imported it, as ``sys.argv[0]``)."""
    return run_children(case, [kind], steps, seed)[0]


def run_children(case: str, kinds: Sequence[str], steps: int | None, seed: int) -> list[dict[str, Any]]:
    """A fit of each of ``kinds``, in this order, one after the other in one fresh process."""
    command = [sys.executable, sys.argv[0], "--child", case, ",".join(kinds), "--seed", str(seed)]
    if steps is not None:
        command += ["--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{case}/{kinds} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"case"')]


def spread(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    """``median [min, max]`` of ``values`` times ``scale``."""
    if not values:
        return "-"
    scaled = [value * scale for value in values]
    return f"{statistics.median(scaled):.{digits}f} [{min(scaled):.{digits}f}, {max(scaled):.{digits}f}]"


def table(case: str, records: list[dict[str, Any]], kinds: Sequence[str], pairs: int) -> list[str]:
    """The case's markdown table, one row per kind, and what one pair can resolve here."""
    by_kind = {kind: [r for r in records if r["kind"] == kind] for kind in kinds}
    reference = by_kind[kinds[0]]
    first = reference[0]
    lines = [
        f"### {case}: {first['steps']} steps, a run every {first['every']} steps, {pairs} ABBA pairs",
        "",
        (
            "| kind | runs | fit s | added to the fit, per pair | training thread's CPU added, per pair "
            "| hooks per run, ms (CPU ms) | steady run, CPU ms | hooks in all, s | process CPU s "
            f"| weights = {kinds[0]} | other work, cores | load (1 min) | ig/overhead | reduced / deferred "
            "| a full run, ms |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        mine = by_kind[kind]
        pairs_of = list(zip(mine, reference)) if kind != kinds[0] else []
        added = [r["fit_s"] / ref["fit_s"] - 1 for r, ref in pairs_of]
        thread = [r["training_thread_cpu_s"] / ref["training_thread_cpu_s"] - 1 for r, ref in pairs_of]
        timed = [r for r in mine if r.get("runs")]
        per_run = [1e3 * r["batch_end_s"] / r["periodic_runs"] for r in timed if r["periodic_runs"]]
        per_run_cpu = [1e3 * r["batch_end_cpu_s"] / r["periodic_runs"] for r in timed if r["periodic_runs"]]
        steady = [statistics.median(r["run_cpu_ms"][1:]) for r in timed if len(r["run_cpu_ms"]) > 1]
        same = all(r["digest"] == ref["digest"] for r, ref in zip(mine, reference))
        lines.append(
            f"| {kind} | {timed[0]['runs'] if timed else 0} | {spread([r['fit_s'] for r in mine], digits=1)} "
            f"| {percent(added)} | {percent(thread)} "
            f"| {spread(per_run, digits=1)} ({spread(per_run_cpu, digits=1)}) | {spread(steady, digits=1)} "
            f"| {spread([r.get('hooks_s', 0.0) for r in mine])} | {spread([r['cpu_s'] for r in mine], digits=1)} "
            f"| {'yes' if same else 'NO'} "
            f"| {spread([r['others_cores'] for r in mine])} | {spread([r['load'] for r in mine])} "
            f"| {percent([r['overhead'] for r in mine if 'overhead' in r])} "
            f"| {spread([r['reduced'] for r in mine if 'reduced' in r], digits=0)} / "
            f"{spread([r['deferred'] for r in mine if 'deferred' in r], digits=0)} "
            f"| {spread([r['full_run_ms'] for r in mine if 'full_run_ms' in r], digits=1)} |"
        )
    lines += [
        "",
        (
            "Where the training thread's CPU goes (seconds added per pair; the steps' hooks Lightning calls inside "
            "them count as the step's):"
        ),
        "",
        (
            "| kind | inside the steps, s | between the steps, s | of which the hooks (timed), s "
            "| a step, CPU us (median) | 40 steps after a cadence point, ms beyond the 50 before |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        mine = by_kind[kind]
        pairs_of = list(zip(mine, reference)) if kind != kinds[0] else []
        inside = [r["inside_steps_s"] - ref["inside_steps_s"] for r, ref in pairs_of]
        between = [r["between_steps_s"] - ref["between_steps_s"] for r, ref in pairs_of]
        hooks = [r.get("batch_end_cpu_s", 0.0) - ref.get("batch_end_cpu_s", 0.0) for r, ref in pairs_of]
        lines.append(
            f"| {kind} | {spread(inside) if inside else '-'} | {spread(between) if between else '-'} "
            f"| {spread(hooks) if hooks else '-'} | {spread([r['step_cpu_us'] for r in mine], digits=0)} "
            f"| {spread([r['after_point_ms'] for r in mine], digits=1)} |"
        )
    fits = [r["fit_s"] for r in reference]
    busy = [r["others_cores"] for r in records]
    width = (max(fits) - min(fits)) / statistics.median(fits)
    floor = (
        f"The {kinds[0]} fits alone spread {100 * width:.1f}% (max - min over the median)"
        if len(fits) > 1
        else f"One {kinds[0]} fit: its spread cannot be read"
    )
    lines += [
        "",
        (
            f"{floor} while other work used {min(busy):.2f}-{max(busy):.2f} cores: one pair cannot resolve a "
            "difference in fit time smaller than that here. The CPU times (the training thread's, the hooks') leave "
            "out the time other work held the cores and resolve much less, but miss what a second thread does to "
            "training (the GIL, a shared core)."
        ),
    ]
    return lines


def percent(values: Sequence[float]) -> str:
    return spread(values, 100, 1) + " %" if values else "-"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES), help="which examples")
    parser.add_argument("--kinds", nargs="+", default=list(DEFAULT_KINDS), help="the first is the pairs' reference")
    parser.add_argument("--pairs", type=int, default=5, help="blocks of one fit per kind, in ABBA order")
    parser.add_argument("--steps", type=int, default=None, help="gradient steps per fit (default: the example's)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every fit")
    parser.add_argument("--output", type=Path, default=None, help="also write the markdown and the records here")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="two blocks per process, in ABBA order within it: the process's own speed (it differs by a few percent "
        "from one process to the next here) cancels in its pairs",
    )
    parser.add_argument("--child", nargs=2, metavar=("CASE", "KINDS"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child is not None:
        case, kinds = options.child
        for kind in kinds.split(","):
            print(json.dumps(fit_once(case, kind, options.steps, options.seed)), flush=True)
        return
    unknown = [kind for kind in options.kinds if kind not in KINDS]
    if unknown or options.pairs < 1 or (options.in_process and "ours_inline" in options.kinds):
        parser.error(
            f"--kinds must be among {sorted(KINDS)} (ours_inline not --in-process) and --pairs >= 1, got "
            f"{options.kinds} and {options.pairs}"
        )
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    for case in options.cases:
        for kind in options.kinds:  # a short warm-up fit of each kind: files in the page cache, nothing measured
            run_child(case, kind, 600 if case == "cartpole" else 1100, options.seed)
        for block in range(options.pairs):
            order = options.kinds if block % 2 == 0 else options.kinds[::-1]
            if options.in_process and block % 2:
                continue  # made with the block before, in its process
            if options.in_process:  # this block and the next, reversed, in one process
                count = len(order) * (2 if block + 1 < options.pairs else 1)
                made = run_children(case, [*order, *order[::-1]][:count], options.steps, options.seed)
            else:
                made = [run_child(case, kind, options.steps, options.seed) for kind in order]
            for index, record in enumerate(made):
                record.update(block=block + index // len(order), process=block)
                records.append(record)
                kind, fit_s, loop_s = record["kind"], record["fit_s"], record["loop_s"]
                print(
                    f"{case} block {record['block']} {kind:>8}: fit {fit_s:.2f} s, loop {loop_s:.2f} s, "
                    f"others {record['others_cores']:.2f} cores, hooks {record.get('hooks_s', 0):.2f} s",
                    flush=True,
                )
    lines = [
        "## bench_fit_cpu",
        "",
        (
            f"{platform.processor() or 'CPU'}, {os.cpu_count()} cores, torch {torch.__version__}, one torch thread; "
            f"{time.perf_counter() - started:.0f} s in all. Medians [min, max] over the blocks."
        ),
        "",
    ]
    for case in options.cases:
        mine = sorted((r for r in records if r["case"] == case), key=lambda r: (r["block"], r["kind"]))
        lines += [*table(case, mine, options.kinds, options.pairs), ""]
    text = "\n".join(lines)
    print("\n" + text)
    if options.output is not None:
        options.output.parent.mkdir(parents=True, exist_ok=True)
        options.output.write_text(text + "\n", encoding="utf-8")
        options.output.with_suffix(".json").write_text(json.dumps(records, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
