"""What one fit of the callback holds, decided once: at set-up (:func:`plan`) and at fit start (:func:`start`).

:func:`plan` (the ``setup`` hook, before the model is on its device) resolves the held-out states and checks them
against the options: the units a run logs and their tags, the saliency pictures, the report folder. :func:`start`
(``on_fit_start``, the model on its device) prepares the engine on two states, this rank's share of the states, the
run's settings, what the runs send to the loggers (:class:`~lightning_ig.views.loggers.outputs.RunOutputs`: the
pictures' cadences and inputs, the W&B and MLflow sinks), the trust checks and, on a CPU with a core to spare, the runs'
worker beside training (:class:`IdleCore`). A run reads the :class:`Fit` as plain data; :class:`PendingRun` is a run
between its start and its end.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import multiprocessing
import os
import pickle
import random
import signal
import sys
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.result import IGResult, stochastic_warnings_silenced
from lightning_ig.attribution.targets import Target
from lightning_ig.callback import heldout, reports, setup
from lightning_ig.callback.budget import Plan
from lightning_ig.callback.monitor import Beside, TrustMonitor
from lightning_ig.callback.options import Options
from lightning_ig.callback.per_action import pair_rows
from lightning_ig.callback.reports import ReportFolder
from lightning_ig.models.noise import attribution_mode
from lightning_ig.run.host_result import HostResult, HostTransfer
from lightning_ig.run.summary import RunSettings, RunSummary
from lightning_ig.trust.common import AttributionSettings, generators_kept
from lightning_ig.trust.replica import Replica
from lightning_ig.views.loggers.outputs import RunOutputs
from lightning_ig.views.loggers.sinks import picture_sinks
from lightning_ig.views.loggers.worker import PictureWriter
from lightning_ig.views.pictures.saliency import check_saliency_channel, saliency_kind
from lightning_ig.views.tags import display_labels

__all__ = [
    "Fit",
    "FitPlan",
    "IdleCore",
    "PendingRun",
    "ProcessTransfer",
    "idle_core",
    "physical_cores",
    "plan",
    "start",
]


@dataclass(frozen=True)
class FitPlan:
    """What set-up decides.

    Attributes:
        held_out: ``(B, *feature_shape)`` the held-out states on the CPU, in their own floating dtype (the same on
            every rank).
        units: the units a run logs one by one (features or groups) and their tags.
        saliency: the states are spatial and ``saliency_states`` is set: the saliency pictures are drawn.
        reports: the folder of the JSON report of each run, or ``None``.
        baseline: the callback's ``baseline`` (a tensor: rank zero's, as the states).
    """

    held_out: Tensor
    units: setup.LoggedUnits
    saliency: bool
    reports: ReportFolder | None
    baseline: Any

    @functools.cached_property
    def identity(self) -> dict[str, Any]:
        """What a run's history is about (kept in a checkpoint): its units, the states' shape and their CRC-32 (made
        once: a checkpoint's save reads it)."""
        names, values = list((self.units.groups or self.units).names), self.held_out.float().contiguous().numpy()
        return {"units": len(names), "names": names, "shape": [*self.held_out.shape], "values": zlib.crc32(values.data)}


@dataclass(frozen=True)
class Fit:
    """What a fit's runs read, set at fit start.

    Attributes:
        held_out, units, reports: set-up's (:class:`FitPlan`).
        engine: attributes this rank's share of the states (and replays its CUDA graph).
        target: what is attributed, bound to the model (its label, its actions' labels, its rows per state).
        states, baselines: this rank's share, on the model's device and in its dtype.
        outputs: what the runs send to the loggers.
        trust: the trust checks, on global rank zero when they are on; else ``None``.
        settings: what every run's summary is about (:class:`~lightning_ig.run.summary.RunSettings`).
        keep_attributions: a run keeps its ``(B, F)`` attributions (histograms, trust checks on features, the
            actions' units).
        sample_states: the saliency grid draws among a run's first this many rows.
        idle: the runs' worker on a core training leaves idle (:class:`IdleCore`), or ``None``: the runs attribute
            on the training thread (and after the fit: its end lets go of the worker, its model copy and trainer).
    """

    held_out: Tensor
    units: setup.LoggedUnits
    reports: ReportFolder | None
    engine: IntegratedGradients
    target: Target
    states: Tensor
    baselines: Tensor | str | float
    outputs: RunOutputs
    trust: TrustMonitor | None
    settings: RunSettings
    keep_attributions: bool
    sample_states: int
    idle: IdleCore | None = None


_INLINE = "they run on the training thread"
_DROPPED = "the fit is ending on {}: the run in hand is dropped, not made again"
_STALE = (
    "the model's forward gives other outputs at the held-out states than a copy with its parameters and buffers (it "
    "gained one since the fit started, or reads an attribute that training changes: make it a buffer to run beside "
    "training); runs on the training thread"
)

_STUCK = 10.0  # seconds (and 100 forwards) past which the worker's first answer to a run is not coming
_SLOW = 10_000  # the run's answer: past _STUCK and that many times the first (a first run with every check and
# n_steps="auto" can take some thousand forwards) or 10 times the longest run

_RESHAPED = "the model's parameters or buffers changed names or shapes (pruning?); runs on the training thread"


class IdleCore:
    """IG beside training, on a core that training leaves idle.

    The fit's working copy of the model (:class:`~lightning_ig.trust.replica.Replica`, eval mode, noise off) takes
    the model's weights at the run's step (an in-place copy); a worker process attributes its own copy, sent those
    weights and the states, makes the run's trust checks on it (its copy of the fit's
    :class:`~lightning_ig.callback.monitor.TrustMonitor`) and sends back the reduced result and the checks' while
    training goes on. The numbers land at a later batch end, as a GPU run's do. Training never shares a tensor with
    the worker: its weights are bit-identical.

    The worker is a fork of the training process at its first run (Linux only; a thread would hold the GIL between
    its torch calls, a spawned child would import the user's script again). It runs torch's CPU operations and this
    package only, as DataLoader's forked workers do, ignores Ctrl-C and ends with the training process. Where it
    cannot start, has ended or is stuck (its answer past what its earlier ones took: ended here), the runs go back to
    the training thread (the run in hand made again, unless the fit is ending on SIGTERM or Ctrl-C: then dropped where
    it has not come within a second), with a warning.

    :func:`idle_core` sets one up only where the copy's IG equals the model's bit for bit on the held-out states and
    its forward draws from no global generator (the worker cannot put back what it would take from training's).

    Attributes:
        replica: the copy the runs attribute.
        monitor: the fit's trust checks (``None``: off).
        cpu: the worker process's CPU seconds so far.
    """

    def __init__(self, replica: Replica, monitor: TrustMonitor | None = None, trainer: Any = None) -> None:
        self.replica, self.monitor, self.trainer = replica, monitor, trainer
        self.live = replica.settings.call(replica.model)  # the run's forward on the model: what the copy must match
        self.cpu = self.longest = 0.0  # the longest: a run's seconds from its start to its answer read
        self.exitcode: int | None = None  # the worker's, where it had ended before close (negative: a signal's)
        self._process: Any = None  # the worker process and the training end of its pipe
        self._pipe: Any = None
        self.alive = True  # until the process cannot start or has ended
        self.interrupted: str | None = None  # "Ctrl-C" where the fit ends on it (on_exception says so)

    def start(
        self,
        states: Tensor,
        baselines: Tensor | str | float,
        pair: bool,
        begin: Callable[[IGResult], HostTransfer],
        checks: tuple[str, ...] = (),
    ) -> ProcessTransfer | None:
        """Take the model's weights now, then attribute ``states``, reduce the result and make the trust ``checks``
        on the worker (``pair``: ``target="each"``'s rows per (state, action)). ``None`` where the worker cannot start
        or its copy computes other outputs at ``states`` than the model: this run and later ones stay on the training
        thread."""
        try:
            self.replica.sync()
        except (KeyError, RuntimeError):  # a parameter or buffer renamed or reshaped since the fit started (pruning)
            self.ended(_RESHAPED)
            return None
        job = (states, baselines, pair, begin)
        if self._process is None:
            try:
                self._fork()
            except OSError as error:  # said with its cause: a container's limit on processes (EAGAIN), memory
                self.ended(f"the runs' worker process could not start ({type(error).__name__}: {error}); {_INLINE}")
                return None
        began = time.perf_counter()
        try:
            with attribution_mode(self.replica.model), stochastic_warnings_silenced(), torch.no_grad():
                expected = self.live(states)  # one forward: what the worker's copy must compute bit for bit
            message = (self.replica.packed(), checks, expected, *job)
            self._pipe.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
            # its answer needs an unpack and this forward: far longer, it is stuck (a lock held at the fork), not slow
            if not self._pipe.poll(limit := _STUCK + 100 * (time.perf_counter() - began)):
                raise TimeoutError(f"did not answer a run within {limit:.0f} s (stuck?) and was ended")
            if pickle.loads(self._pipe.recv_bytes()):  # the worker's answer, before it attributes: its copy is stale
                self.ended(_STALE)
                return None
        except (OSError, EOFError) as error:  # ended or stuck: the transfer makes the run here
            self.ended(error)
        limit = _STUCK + max(_SLOW * (time.perf_counter() - began), 10 * self.longest)
        return ProcessTransfer(self, self._pipe, lambda: _attribute(self.replica, *job), began, limit)

    @property
    def ending(self) -> str | None:
        """What the fit is ending on: ``"SIGTERM"`` (set by Lightning's handler; the fit stops at the batch end),
        ``"Ctrl-C"`` (:attr:`interrupted`), or ``None``: it goes on."""
        return "SIGTERM" if getattr(self.trainer, "received_sigterm", False) else self.interrupted

    def ended(self, why: str | BaseException) -> None:
        """The worker process cannot start, has ended (said from its exit code), is stuck (a ``TimeoutError``: ended)
        or cannot follow the model: the runs stay on the training thread from here (said)."""
        self.close()
        if isinstance(why, BaseException):  # the run in hand made again on the training thread, unless the fit ends
            code = self.exitcode  # negative: the signal that ended it (None: ended by close(), stuck or not waited for)
            if code:
                how = next((f"was ended by {s.name}" for s in signal.Signals if -s == code), f"has ended (exit {code})")
            elif isinstance(why, TimeoutError):
                how = str(why)
            else:
                how = "has ended"
            why = f"the runs' worker process {how}; {_DROPPED.format(self.ending) if self.ending else _INLINE}"
        if self.alive:
            self.alive = False
            warnings.warn(f"IntegratedGradientsCallback: {why}", stacklevel=2)

    def close(self) -> None:
        """End the worker (killed if it has not ended within a second: a run it still makes is one nobody reads, as
        after Ctrl-C); a later fit forks anew."""
        if self._process is None:
            return
        with contextlib.suppress(OSError):
            self._pipe.send_bytes(pickle.dumps(None))
        self._pipe.close()  # an answer it is still writing fails at once (no one reads it now): it sees the stop
        self._process.join(timeout=1.0)  # every run that counts has been read: a busy worker's is not needed
        self.exitcode = self._process.exitcode
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = self._pipe = None

    def _fork(self) -> None:
        context = multiprocessing.get_context("fork")
        pipe, theirs = context.Pipe()
        args = (theirs, pipe, self.replica, self.monitor, torch.get_num_threads(), _current_cpu())
        process = context.Process(target=_serve, args=args, name="lightning-ig-run", daemon=True)
        say, warnings.showwarning = warnings.showwarning, lambda *a: None if a[1] is DeprecationWarning else say(*a)
        try:  # "this process is multi-threaded, fork() may deadlock" (see above) unsaid, and every other warning said
            process.start()
            self._process, self._pipe = process, pipe
        except OSError:
            pipe.close()
            raise
        finally:  # not by catch_warnings: leaving it resets Python's once-per-place memory (the user's said every fit)
            warnings.showwarning = say
            theirs.close()


def _attribute(replica: Replica, states: Tensor, baselines: Any, pair: bool, begin: Callable[..., Any]) -> HostResult:
    """A run's work: attribute the copy as it is, reduce the result."""
    result = replica.engine.attribute(states, baselines=baselines)  # it sets its own grad modes
    return begin(pair_rows(result) if pair else result).result()


def _serve(
    pipe: Any, training_end: Any, replica: Replica, monitor: TrustMonitor | None, threads: int, training_cpu: int | None
) -> None:
    """The worker process: runs until told to stop or the training process has gone."""
    training_end.close()  # the training process's end of the pipe: its exit is then this end's EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the training process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the training process's handlers (Lightning's)
    with contextlib.suppress(Exception):  # PR_SET_PDEATHSIG: ends with the training process, even stuck in a run
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    torch.set_num_threads(threads)
    others = os.sched_getaffinity(0) - {training_cpu}
    if others:  # off the core training ran on at the fork: waking there, it made the scheduler move training
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, others)
    while True:
        try:
            message = pickle.loads(pipe.recv_bytes())
        except (EOFError, OSError):
            return
        if message is None:
            return
        started, (weights, checks, expected, *job) = time.process_time(), message
        checked, stale = None, None
        try:
            replica.unpack(weights)
            with torch.no_grad():
                stale = not heldout.same_values(replica.forward(job[0]), expected)
            pipe.send_bytes(pickle.dumps(stale))  # the training thread waits for it, then makes the run if stale
            if stale:
                continue
            result = _attribute(replica, *job)
            if checks and monitor is not None:
                checked = monitor.check_beside(result, checks, replica.module)
            answer: HostResult | Exception = result
        except Exception as error:  # noqa: BLE001 - the run's error is raised where its numbers are read
            # Python 3.11+ prints notes under the error: where the user's code failed in the worker
            error.__notes__ = [*getattr(error, "__notes__", ()), f"in the runs' worker:\n{traceback.format_exc()}"]  # type: ignore[attr-defined]
            answer = error
        if stale is None:  # failed before the copy could be compared: the run raises it, here
            pipe.send_bytes(pickle.dumps(False))
        cpu = time.process_time() - started
        # what does not pickle: the checks are made again on the training thread, an error is sent as its text
        for reply in ((answer, checked, cpu), (answer, None, cpu), (RuntimeError(repr(answer)), None, cpu)):
            with contextlib.suppress(Exception):
                data = pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
                if any(isinstance(part, Exception) for part in (reply[0], *(reply[1] or ({}, {}))[0].values())):
                    pickle.loads(data)  # as the training process will: an exception's own __init__ may refuse its args
                pipe.send_bytes(data)
                break


class ProcessTransfer:
    """A run's numbers on their way from the :class:`IdleCore` worker (the interface of
    :class:`~lightning_ig.run.host_result.HostTransfer`); where the process has ended before they come, or has not
    sent them ``limit`` seconds after ``began`` (stuck), the run is made again on the training thread (``again``)."""

    def __init__(self, core: IdleCore, pipe: Any, again: Callable[[], HostResult], began: float, limit: float) -> None:
        self.core, self.again, self.began, self.limit, self._pipe = core, again, began, limit, pipe  # pipe None: ended
        self._answer: HostResult | BaseException | None = None
        self.checks: Beside | None = None  # the trust checks the worker made (None: none, or made again here)

    def ready(self) -> bool:
        """Whether the numbers (or the process's end) have come (never waits)."""
        if self._answer is None and self._pipe is not None:
            with contextlib.suppress(OSError):  # a closed pipe: reading finds the end
                return self._pipe.poll()
        return True

    def result(self) -> HostResult | None:
        """The run's numbers (waits, up to its limit; a second at most as the fit ends: see ``ending``). Raises what the
        run raised. ``None``: dropped (see ``ended``)."""
        if self._answer is None and self._pipe is not None:
            try:
                ending, wait = self.core.ending, max(0.0, self.began + self.limit - time.perf_counter())
                if not self._pipe.poll(min(wait, 1.0) if ending else wait):  # ending: a second (a grace period)
                    stuck = f"did not finish a run within {self.limit:.0f} s (stuck?)"
                    raise TimeoutError(f"{'was still making a run' if ending else stuck} and was ended")
                self._answer, self.checks, cpu = pickle.loads(self._pipe.recv_bytes())  # or the run's error
                self.core.cpu += cpu
                self.core.longest = max(self.core.longest, time.perf_counter() - self.began)
            except (EOFError, OSError) as error:  # the process has ended, or is stuck
                self.core.ended(error)
        if self._answer is None:  # no process to read: the run on the training thread, unless the fit ends
            if self.core.ending:
                return None
            self._answer = self.again()
        if isinstance(self._answer, BaseException):
            raise self._answer
        return self._answer


def idle_core(
    trainer: Any,
    pl_module: Any,
    engine: IntegratedGradients,
    forward: Any,
    states: Tensor,
    baselines: Any,
    monitor: TrustMonitor | None = None,
) -> IdleCore | None:
    """The fit's :class:`IdleCore`, or ``None`` where the runs stay on the training thread: not Linux, a GPU, more
    than one process, a daemonic process (a ``multiprocessing.Pool``'s worker: it may not start one), a target that
    gathers riders (``"contrast"``), one core the process may run on (:func:`physical_cores`), torch on more than one
    thread (a fork's OpenMP threads hang once the parent's pool has run: training's), or a copy of the model whose IG
    differs from the model's or draws from a global generator."""
    if not sys.platform.startswith("linux") or states.device.type != "cpu" or trainer.world_size > 1:
        return None
    if multiprocessing.current_process().daemon or engine.target.contrasts:
        return None
    if torch.get_num_threads() > 1 or physical_cores() < 2:
        return None
    replica = Replica(pl_module, AttributionSettings(forward=forward, target=engine.target, options=engine.options))
    replica.sync()
    trial = states[:2]
    per_state = isinstance(baselines, Tensor) and baselines.shape == states.shape
    trial_baselines = baselines[:2] if per_state else baselines
    with attribution_mode(pl_module), stochastic_warnings_silenced():
        theirs = engine.attribute(trial, baselines=trial_baselines, n_steps=2, cuda_graph=False)
    drawn = _generator_states()
    try:
        with generators_kept(pl_module), stochastic_warnings_silenced():
            mine = replica.engine.attribute(trial, baselines=trial_baselines, n_steps=2, cuda_graph=False)
            draws = not _same_generator_states(drawn, _generator_states())
    except Exception:  # noqa: BLE001 - a forward that cannot run on a copy: the runs stay on the training thread
        return None
    same = all(heldout.same_values(getattr(mine, k), getattr(theirs, k)) for k in ("attributions", "f_input"))
    return None if draws or mine.stochastic or not same else IdleCore(replica, monitor, trainer)


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on now (Linux's ``/proc/thread-self/stat``), or ``None``."""
    try:
        return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def physical_cores() -> int:
    """The cores the process may run on, hyper-threads of one core counted once (Linux's CPU topology; elsewhere
    every logical CPU counts)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def _generator_states() -> tuple[Any, ...]:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _same_generator_states(one: tuple[Any, ...], other: tuple[Any, ...]) -> bool:
    python, (_, keys, pos, *_), cpu = one
    python_now, (_, keys_now, pos_now, *_), cpu_now = other
    return python == python_now and pos == pos_now and np.array_equal(keys, keys_now) and torch.equal(cpu, cpu_now)


@dataclass(frozen=True)
class PendingRun:
    """A run started (attributed, gathered, its copy to the host queued) and not yet summarized and logged.

    ``riders`` are the rows gathered with the result, ``(world * share, W)`` each: for ``target="contrast"``, each
    state's greedy and runner-up actions.
    """

    run: Fit  # the fit it was started in
    trainer: Any
    transfer: HostTransfer | ProcessTransfer
    riders: list[Tensor]
    step: int
    epoch: int
    final: bool
    held_ms: float  # host time the start held the training loop
    plan: Plan  # what the budget let it do
    held: float  # the budget's clock over the start
    weights: torch.nn.Module | None = None  # the copy holding the weights attributed beside training (its checks')


def plan(options: Options, trainer: Any, pl_module: Any, names: Sequence[str | None]) -> FitPlan:
    """The ``setup`` hook's work: the states resolved and checked, the units, the report folder.

    Args:
        options: the callback's.
        trainer, pl_module: the fit's.
        names: the ``name`` of every IG callback of the trainer (two with one name would write the same tags).

    Raises:
        MisconfigurationException, TypeError, ValueError: see the callback's ``Raises``.
    """
    setup.check_unique_names(names)
    # a states callable that samples (a replay buffer) draws none of training's, on the device training runs on too
    with generators_kept(pl_module, trainer.strategy.root_device):
        states, baseline = heldout.resolve_states(options.states, trainer, pl_module), options.baseline
    if trainer.world_size > 1:  # rank zero's states on every rank (a callable may sample each rank's own), and its
        states, baseline = trainer.strategy.broadcast((states, baseline), src=0)  # baseline: they pair up by row
    shape, views = tuple(states.shape[1:]), options.views
    heldout.check_baseline_shape(baseline, states)
    check_saliency_channel(views.saliency_channel, shape)  # here, not at the first picture mid-training
    units = setup.logged_units(
        shape,
        name=options.name,
        feature_names=options.feature_names,
        feature_groups=options.feature_groups,
        group_names=options.group_names,
        max_features=views.max_logged_features,
    )
    saliency = saliency_kind(shape) is not None and views.saliency_states is not None
    if trainer.fast_dev_run and options.report_dir is None:  # Lightning's loggers write nothing there: nor does IG
        rank_zero_info("IntegratedGradientsCallback: fast_dev_run: the runs check the set-up, their numbers go nowhere")
    logs = bool(trainer.loggers or trainer.fast_dev_run)  # fast_dev_run: no report in <default_root_dir> either
    folder = setup.report_folder(options.report_dir, trainer.default_root_dir, logs, options.name, options.states)
    return FitPlan(held_out=states, units=units, saliency=saliency, reports=folder, baseline=baseline)


def start(
    options: Options,
    plan: FitPlan,
    trainer: Any,
    pl_module: Any,
    *,
    pictures: PictureWriter,
    ever_non_zero: Iterable[str],
    pairs: Callable[[], Any],
) -> Fit:
    """The ``on_fit_start`` hook's work: the engine tried on two states, the outputs, the trust checks.

    Args:
        options: the callback's.
        plan: what set-up decided.
        trainer, pl_module: the fit's (the model on its training device).
        pictures: the callback's picture worker.
        ever_non_zero: the count tags non-zero in an earlier run (restored from a checkpoint).
        pairs: the last run's ``(B, 2)`` greedy and runner-up actions, for the actions picture (``target="contrast"``).

    Raises:
        ValueError: ``action_names`` of another count than the model's outputs.
    """
    views, units = options.views, plan.units
    failed: Exception | None = None
    try:
        with generators_kept(pl_module):  # its trial forward draws nothing training would draw
            engine, target, states, baselines = heldout.prepare_engine(
                trainer,
                pl_module,
                options.target,
                options.forward,
                plan.held_out,
                plan.baseline,
                options.action_names,
                options.engine,
                options.on_non_finite,
            )
    except Exception as error:  # noqa: BLE001 - raised below, on every rank
        failed = error
    if trainer.world_size > 1 and trainer.strategy.reduce_boolean_decision(failed is not None, all=False):
        raise failed or RuntimeError(
            "IntegratedGradientsCallback: the set-up trial failed on another rank (see its log)"
        )
    if failed is not None:
        raise failed
    folder = None if plan.reports is None else str(plan.reports.folder)  # the text says where they are
    baseline = heldout.baseline_label(options.baseline)
    half = torch.finfo(states.dtype).eps if states.dtype in (torch.float16, torch.bfloat16) else 0.0
    settings = RunSettings(target, baseline, options.completeness_tol, views.top_k, options.name, folder, half)
    tags = units.tags
    if target.every_output:  # each action's mean |attr| per unit too, while actions x units stay within the limit
        count = len(units.groups) if units.groups is not None else len(units.names)
        logged = target.rows_per_state * count <= views.max_logged_features
        tags = dataclasses.replace(tags, action_labels=display_labels(target.actions or ()), action_units=logged)
    ranked = units.groups if units.groups is None or len(units.groups) > 1 else None  # one group: rank the features
    trust = TrustMonitor.prepare(
        options.overhead is not None,
        trainer,
        pl_module,
        engine,
        options.forward,
        plan.held_out,
        plan.baseline,
        ranked,
        tags.prefix,
    )

    def report(summary: RunSummary, host: HostResult, epoch: int) -> dict[str, Any]:  # the JSON one, W&B's, MLflow's
        return reports.run_report(summary, host, units.names, target.label, epoch=epoch, world_size=trainer.world_size)

    inputs = _picture_inputs(options, plan, pairs if target.contrasts else None)
    # every how many runs each kind of picture is drawn (None: never)
    every, saliency = views.figure_every_n_runs, views.saliency_every_n_runs if plan.saliency else None
    cadences = {"verdict": every, "shares": every, "saliency": saliency}
    if target.every_output or target.contrasts:  # why this action: per action, or the greedy one against the next
        cadences["actions"] = every
    outputs = RunOutputs(
        tags,
        cadences,
        views.log_histograms,
        inputs,
        pictures,
        picture_sinks(trainer.loggers) if trainer.is_global_zero else [],
        ever_non_zero,
        report=report,
    )
    picked, rows = inputs.picked, target.rows_per_state
    # the (B, F) attributions for the histograms of features logged one by one, for the trust checks when they rank
    # features (two or more groups: the group sums, which every run keeps) and for "each"'s actions' units
    features = (ranked is None and trust is not None) or (units.groups is None and target.every_output)
    return Fit(
        held_out=plan.held_out,
        units=units,
        reports=plan.reports,
        engine=engine,
        target=target,
        states=states,
        baselines=baselines,
        outputs=outputs,
        trust=trust,
        settings=settings,
        keep_attributions=(units.log_features and views.log_histograms) or features,
        sample_states=0 if picked is None or not len(picked) else (int(picked.max()) + 1) * rows,
        idle=idle_core(trainer, pl_module, engine, options.forward, states, baselines, trust),
    )


def _picture_inputs(options: Options, plan: FitPlan, pairs: Callable[[], Any] | None) -> Any:
    """What the pictures of this fit need besides a run (the states drawn, the channels' names, a contrast's pairs)."""
    from lightning_ig.views.pictures.draw import picture_inputs  # noqa: PLC0415 - the drawing modules only when drawn

    groups, views = plan.units.groups, options.views
    channel_names = None if groups is None else groups.channel_names()
    return picture_inputs(
        plan.held_out.numpy(),
        saliency_states=(views.saliency_states or 0) if plan.saliency else 0,
        channel=views.saliency_channel,
        channel_names=channel_names,
        groups_are_channels=channel_names is not None,
        baseline=heldout.baseline_label(options.baseline),
        spatial=saliency_kind(tuple(plan.held_out.shape[1:])) is not None,
        pairs=pairs,
    )
