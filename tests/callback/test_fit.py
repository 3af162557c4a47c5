"""callback/fit.py: the set-up a fit makes once (the plan) and what a fit holds after its start."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from lightning_ig import IntegratedGradientsCallback
from lightning_ig.callback import fit
from lightning_ig.callback import monitor as monitor_module
from lightning_ig.callback.monitor import TrustMonitor
from lightning_ig.views import ViewOptions
from tests.support.tiny import ConvQNet, TinyQNet, dataset, frames, held_out_states, make_trainer


def test_the_plan_holds_the_states_the_units_and_the_report_folder(tmp_path: Path) -> None:
    states = held_out_states(12).double()
    callback = IntegratedGradientsCallback(states, every_n_steps=5, feature_names=["a", "b", "c", "d"])
    trainer = make_trainer(tmp_path, [callback])
    planned = fit.plan(callback.options, trainer, TinyQNet(), [None])
    assert planned.held_out.dtype == torch.float64 and torch.equal(planned.held_out, states)
    assert planned.units.names == ["a", "b", "c", "d"] and planned.units.log_features
    assert not planned.saliency  # flat states: no saliency grid
    assert planned.reports is not None and planned.reports.folder == tmp_path / "ig_reports"  # no logger


def test_fast_dev_run_without_a_logger_plans_no_report_folder(tmp_path: Path) -> None:
    # guards against: the no-logger folder <default_root_dir>/ig_reports in a fast_dev_run (said to go nowhere), whose
    # reports replaced a real fit's at the same steps
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=5)
    trainer = make_trainer(tmp_path, [callback], fast_dev_run=True)
    assert fit.plan(callback.options, trainer, TinyQNet(), [None]).reports is None
    given = IntegratedGradientsCallback(held_out_states(), every_n_steps=5, report_dir=tmp_path / "mine")
    assert fit.plan(given.options, trainer, TinyQNet(), [None]).reports is not None  # asked for: written


def test_frames_are_planned_with_channel_groups_and_a_saliency_grid(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(frames(6, (3, 8, 8)), every_n_steps=5, views=ViewOptions(saliency_states=2))
    planned = fit.plan(callback.options, make_trainer(tmp_path, [callback]), ConvQNet(), [None])
    assert planned.saliency and planned.units.groups is not None and len(planned.units.groups) == 3


def test_a_bad_saliency_channel_fails_at_set_up_not_mid_training(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(
        frames(6, (3, 8, 8)), every_n_steps=5, views=ViewOptions(saliency_states=2, saliency_channel=7)
    )
    with pytest.raises(ValueError, match="saliency_channel"):
        fit.plan(callback.options, make_trainer(tmp_path, [callback]), ConvQNet(), [None])


def test_after_fit_start_the_fit_holds_the_engine_and_this_ranks_states(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(held_out_states(10), every_n_steps=1000)
    trainer = make_trainer(tmp_path, [callback], max_steps=1)
    trainer.fit(TinyQNet(noisy=False), DataLoader(dataset(), batch_size=32))
    held = callback._fit
    assert held is not None and held.states.shape == (10, 4) and held.target.label == "mean"
    assert held.trust is not None  # the default budget keeps the trust checks on


# -- runs beside training (IdleCore)

needs_a_spare_core = pytest.mark.skipif(
    fit.physical_cores() < 2 or not sys.platform.startswith("linux"),
    reason="needs a core training leaves idle, and Linux (the worker is a forked process)",
)


@pytest.fixture
def one_thread():
    """Training on one torch thread, as the examples train: a second core is idle."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Worker(Callback):
    """Keeps the IG callback's runs' worker in this fit (``None``: none) as training starts, to read what it did after
    the fit: the fit's end ends it and lets go of it (test_a_callback_kept_after_its_fit_keeps_no_copy_of_the_model)."""

    def __init__(self, ig: IntegratedGradientsCallback) -> None:
        self.ig, self.idle = ig, None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.idle = None if self.ig._fit is None else self.ig._fit.idle


def _fit_runs(
    tmp_path: Path, model: torch.nn.Module, **options: object
) -> tuple[IntegratedGradientsCallback, fit.IdleCore | None]:
    """The callback after a fit of 20 steps with a run every 3, and its runs' worker in that fit (``None``: none)."""
    torch.manual_seed(3)
    callback = IntegratedGradientsCallback(
        held_out_states(21), every_n_steps=3, views=ViewOptions(figure_every_n_runs=None), **options
    )
    worker = _Worker(callback)
    trainer = make_trainer(tmp_path, [callback, worker], max_steps=20)
    trainer.fit(model, DataLoader(dataset(), batch_size=16))
    return callback, worker.idle


def _reports(folder: Path) -> dict[str, dict]:
    reports = {}
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        report.pop("timings")  # the one figure that differs: where the time went
        report["budget"].pop("overhead")
        reports[path.name] = report
    return reports


@needs_a_spare_core
@pytest.mark.parametrize("overhead", [None, 1.0], ids=["no-checks", "checks"])
def test_runs_beside_training_log_what_runs_on_the_training_thread_log(tmp_path, one_thread, monkeypatch, overhead):
    torch.manual_seed(0)
    model = TinyQNet(batchnorm=False, dropout=0.0)
    twin = TinyQNet(batchnorm=False, dropout=0.0)
    twin.load_state_dict(model.state_dict())
    made_beside: list[tuple[str, ...]] = []  # the checks of each checked run that the worker made
    step = TrustMonitor.step

    def spy(self, host, summary, made, **keywords):
        if keywords.get("beside") is not None:
            results, _ = keywords["beside"]
            assert not any(isinstance(result, Exception) for result in results.values()), results
            made_beside.append(tuple(name for name in results if name != "reference"))
        return step(self, host, summary, made, **keywords)

    monkeypatch.setattr(TrustMonitor, "step", spy)
    beside, idle = _fit_runs(tmp_path / "beside", model, overhead=overhead)
    assert beside._fit is not None and idle is not None, "a spare core and the runs stayed on training's"
    # the checks of the two checked runs beside training were made by the worker (the final run's on the thread)
    assert made_beside == ([] if overhead is None else [("sanity", "deletion", "stability")] * 2)
    assert idle.cpu > 0.0  # the worker process attributed
    monkeypatch.setattr(fit, "idle_core", lambda *args: None)
    inline, none = _fit_runs(tmp_path / "inline", twin, overhead=overhead)
    assert inline._fit is not None and none is None
    assert len(beside.history) == len(inline.history) == 7  # steps 3, 6, ..., 18 and the end
    got, expected = _reports(tmp_path / "beside" / "ig_reports"), _reports(tmp_path / "inline" / "ig_reports")
    # every number of every run, bit for bit; with the checks on, those of the runs beside training (steps 3 and 18,
    # ended steps later) check the weights they attributed, as the runs on the training thread check them at once
    assert got.keys() == expected.keys() and got == expected
    checked = [name for name, report in got.items() if report["budget"]["checks"]]
    assert len(checked) == (0 if overhead is None else 3)
    for (name, a), (_, b) in zip(model.state_dict().items(), twin.state_dict().items()):
        assert torch.equal(a, b), f"{name}: training changed with the runs beside it"


@needs_a_spare_core
def test_no_worker_where_torch_uses_every_core(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", fit.physical_cores)
    callback, idle = _fit_runs(tmp_path, TinyQNet(noisy=False), overhead=None)
    assert callback._fit is not None and idle is None and callback.history


def test_no_worker_where_torch_trains_on_several_threads(tmp_path, monkeypatch):
    # guards against: a worker forked from training on 2 threads of 4 cores, whose own OpenMP threads hung at its
    # first run (the parent's thread pool is not in the fork) until it was ended as stuck, 12 s on, with a warning
    monkeypatch.setattr(fit, "physical_cores", lambda: 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    callback, idle = _fit_runs(tmp_path, TinyQNet(noisy=False), overhead=None)
    assert callback._fit is not None and idle is None and callback.history


@needs_a_spare_core
def test_a_fit_in_a_daemonic_process_keeps_its_runs_on_the_training_thread(tmp_path, one_thread, monkeypatch):
    # guards against: "AssertionError: daemonic processes are not allowed to have children" at the first run of a fit
    # in a multiprocessing.Pool's worker (daemonic), which fits without the callback
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)
    callback, idle = _fit_runs(tmp_path, TinyQNet(noisy=False), overhead=None)
    assert callback._fit is not None and idle is None and len(callback.history) == 7


class _DrawingNet(TinyQNet):
    """A deterministic forward that still draws from torch's global generator: a run beside training would take
    draws that are training's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.rand(1)
        return super().forward(x)


@needs_a_spare_core
def test_a_forward_that_draws_from_the_global_generator_runs_on_the_training_thread(tmp_path, one_thread):
    callback, idle = _fit_runs(tmp_path, _DrawingNet(noisy=False, batchnorm=False, dropout=0.0), overhead=None)
    assert callback._fit is not None and idle is None and callback.history


_TRAINING_PROCESS = os.getpid()


class _WarningNet(TinyQNet):
    """Its forward gives the user's own warning, as a deprecated path of a library it calls would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("the user's own warning", UserWarning, stacklevel=1)  # Python shows it once at this place
        return super().forward(x)


@needs_a_spare_core
def test_the_users_warnings_are_shown_once_over_fits_whose_runs_go_to_a_worker(tmp_path, one_thread, monkeypatch):
    # guards against: the worker's fork silenced Python 3.12's "this process is multi-threaded, use of fork() may lead
    # to deadlocks" with warnings.catch_warnings, whose exit resets Python's once-per-place memory of every warning: a
    # sweep of fits in one process showed the user's (and Lightning's) warnings again at every fit, twice in the first
    fork = os.fork

    def warning_fork() -> int:  # as Python 3.12 and later warn in a process with threads (this one has none to warn)
        warnings.warn("This process is multi-threaded, use of fork() may lead to deadlocks", DeprecationWarning, 2)
        return fork()

    monkeypatch.setattr(os, "fork", warning_fork)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # Python's default for a UserWarning: once per place; DeprecationWarning shown
        for trial in range(2):  # a hyperparameter sweep: a new model, callback and Trainer each
            callback, idle = _fit_runs(tmp_path / str(trial), _WarningNet(noisy=False, batchnorm=False, dropout=0.0))
            assert idle is not None and callback.history  # the runs went to the worker, forked in each fit
    messages = [str(warning.message) for warning in seen]
    assert messages.count("the user's own warning") == 1 and not [
        message for message in messages if "fork()" in message
    ]


class _FailingNet(TinyQNet):
    """Its forward fails on any thread but the main one: every run beside training."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.steps: list[int] = []  # a plain list: the working copy shares it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread() is not threading.main_thread() or os.getpid() != _TRAINING_PROCESS:
            raise RuntimeError("the forward broke mid-fit")
        return super().forward(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.steps.append(batch_idx)
        return super().training_step(batch, batch_idx)


@needs_a_spare_core
def test_a_run_that_fails_beside_training_stops_the_fit_with_its_error(tmp_path, one_thread):
    model = _FailingNet()
    callback = IntegratedGradientsCallback(held_out_states(21), every_n_steps=3, overhead=None)
    worker = _Worker(callback)
    trainer = make_trainer(tmp_path, [callback, worker], max_steps=20)
    with pytest.raises(RuntimeError, match="the forward broke mid-fit"):
        trainer.fit(model, DataLoader(dataset(), batch_size=16))
    assert callback._fit is not None and worker.idle is not None  # it failed on the worker
    assert len(model.steps) <= 6  # raised at a batch end after the first run (step 3), by step 6's run at the latest


@needs_a_spare_core
def test_a_check_that_fails_on_the_worker_is_said_once_and_switched_off(tmp_path, one_thread, monkeypatch):
    def broken(*args: object, **keywords: object) -> object:
        if os.getpid() == _TRAINING_PROCESS:
            pytest.fail("the stability check was made on the training process")
        raise RuntimeError("the noise draws broke")

    monkeypatch.setattr(monitor_module, "stability_check", broken)  # the forked worker inherits it
    with pytest.warns(UserWarning, match=r"stability: could not run \(RuntimeError: .the noise draws broke") as seen:
        callback, idle = _fit_runs(tmp_path, TinyQNet(batchnorm=False, dropout=0.0), overhead=1.0)
    assert sum("the noise draws broke" in str(warning.message) for warning in seen) == 1
    assert callback._fit is not None and idle is not None and callback._fit.trust is not None
    assert callback._fit.trust.names == ["sanity", "deletion"]  # the others go on
    verdict = callback._last.trust_checks if callback._last is not None else None
    assert verdict is not None and verdict.randomization is not None and verdict.deletion is not None
    assert verdict.status == "failed" and any("stability: could not run" in reason for reason in verdict.reasons)


class _ScaledNet(TinyQNet):
    """A forward that reads more than its weights: an observation scale training changes, as a plain tensor updated
    in place (``reassign=False``) or a float set anew (``reassign=True``); neither reaches a copy that follows the
    parameters and buffers."""

    def __init__(self, reassign: bool) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.reassign, self.scale, self.factor = reassign, torch.ones(4), 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.scale * self.factor)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.reassign:
            self.factor = 1.0 + 0.5 * self.global_step
        else:
            self.scale.fill_(1.0 + 0.5 * self.global_step)
        return super().training_step(batch, batch_idx)


@needs_a_spare_core
@pytest.mark.parametrize("reassign", [False, True], ids=["in-place", "reassigned"])
def test_a_forward_that_reads_more_than_its_weights_keeps_its_runs_on_the_training_thread(
    tmp_path, one_thread, monkeypatch, reassign
):
    # guards against: the worker's copy, frozen at the fork (or at the fit's start), attributing a stale model
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="reads an attribute that training changes") as seen:
        beside, idle = _fit_runs(tmp_path / "beside", _ScaledNet(reassign), overhead=None)
    assert sum("reads an attribute" in str(warning.message) for warning in seen) == 1
    assert beside._fit is not None and idle is not None and not idle.alive
    monkeypatch.setattr(fit, "idle_core", lambda *args: None)
    torch.manual_seed(0)
    inline, _ = _fit_runs(tmp_path / "inline", _ScaledNet(reassign), overhead=None)
    assert len(beside.history) == len(inline.history) == 7
    assert _reports(tmp_path / "beside" / "ig_reports") == _reports(tmp_path / "inline" / "ig_reports")


class _KillsTheWorker(Callback):
    """Kills the runs' worker process once it has made a run (as the OOM killer would), mid-way through the next."""

    def __init__(self, ig: IntegratedGradientsCallback) -> None:
        self.ig, self.killed = ig, False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        idle = None if self.ig._fit is None else self.ig._fit.idle
        forked = None if idle is None else idle._process
        if forked is not None and not self.killed and idle is not None and idle.cpu > 0.0:
            forked.kill()
            forked.join()
            self.killed = True


@needs_a_spare_core
def test_a_worker_process_that_dies_hands_its_runs_to_the_training_thread_and_none_is_lost(tmp_path, one_thread):
    torch.manual_seed(3)
    callback = IntegratedGradientsCallback(
        held_out_states(21), every_n_steps=3, views=ViewOptions(figure_every_n_runs=None), overhead=None
    )
    killer, worker = _KillsTheWorker(callback), _Worker(callback)
    trainer = make_trainer(tmp_path, [callback, killer, worker], max_steps=20)
    with pytest.warns(UserWarning, match="worker process was ended by SIGKILL; they run on the training thread"):
        trainer.fit(TinyQNet(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16))
    assert killer.killed
    assert len(callback.history) == 7  # steps 3, 6, ..., 18 and the end: every run logged
    assert callback._fit is not None and worker.idle is not None and not worker.idle.alive


@needs_a_spare_core
@pytest.mark.parametrize(
    ("refused", "error"),
    [
        ("Pipe", OSError(errno.EMFILE, os.strerror(errno.EMFILE))),  # its pipe past the limit on open files
        ("start", BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))),  # fork past a container's pids.max
    ],
)
def test_a_worker_process_that_cannot_start_leaves_the_runs_on_the_training_thread(
    tmp_path, one_thread, monkeypatch, refused, error
):
    # guards against: the pipe's OSError stopping the fit at its first run, and "could not start or has ended" with
    # the fork's error (what to look at) left unsaid
    real = fit.multiprocessing.get_context

    def refuse(*args: Any) -> Any:
        raise error

    class _NoFork:
        def __init__(self, method: str) -> None:
            self.context = real(method)

        def Pipe(self) -> Any:  # multiprocessing's names
            return refuse() if refused == "Pipe" else self.context.Pipe()

        def Process(self, **kwargs: Any) -> Any:
            process = self.context.Process(**kwargs)
            if refused == "start":
                process.start = refuse
            return process

    monkeypatch.setattr(fit.multiprocessing, "get_context", _NoFork)
    said = f"could not start ({type(error).__name__}: {error}); they run on the training thread"
    with pytest.warns(UserWarning, match=re.escape(said)):
        callback, idle = _fit_runs(tmp_path, TinyQNet(noisy=False, batchnorm=False, dropout=0.0), overhead=None)
    assert len(callback.history) == 7  # every run, on the training thread
    assert callback._fit is not None and idle is not None and not idle.alive


class _ReadsTheTrainer(TinyQNet):
    """A forward that reads ``self.trainer`` (here its step count, as one reading ``self.trainer.datamodule`` would):
    a LightningModule's pickled state leaves its trainer out, so a copy made by deepcopy has none."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * (1.0 + 0.0 * self.trainer.global_step)


def test_a_forward_that_reads_the_trainer_fits_with_the_callback_at_its_defaults(tmp_path, one_thread):
    """A model whose forward reads ``self.trainer`` fits with the callback at its defaults, its trust checks made: the
    copies (the runs beside training, the checks' copy) share the trainer (a copy used to have none: the forward
    raised, stopping the fit where a core was spare, and switching the checks off with a warning)."""
    torch.manual_seed(0)
    callback = IntegratedGradientsCallback(held_out_states(8))
    model = _ReadsTheTrainer(noisy=False, batchnorm=False, dropout=0.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=4).fit(model, DataLoader(dataset(), batch_size=16))
    assert not [str(warning.message) for warning in seen if "could not run" in str(warning.message)]
    assert [entry["global_step"] for entry in callback.history] == [4]  # the run at the end of training


class _StuckNet(TinyQNet):
    """Its forward never returns in the forked worker (a lock another thread held at the fork stays held there)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != _TRAINING_PROCESS:
            time.sleep(3600)
        return super().forward(x)


@needs_a_spare_core
def test_a_worker_that_never_answers_hands_its_runs_to_the_training_thread_and_is_ended(
    tmp_path, one_thread, monkeypatch
):
    # guards against: a fit that waited forever for the worker's first answer, and the worker left behind
    monkeypatch.setattr(fit, "_STUCK", 0.5)
    with pytest.warns(UserWarning, match=r"worker process did not answer a run within \d+ s \(stuck\?\) and was ended"):
        callback, idle = _fit_runs(tmp_path, _StuckNet(noisy=False, batchnorm=False, dropout=0.0), overhead=None)
    assert len(callback.history) == 7  # every run, on the training thread
    assert callback._fit is not None and idle is not None and not idle.alive
    assert not [child for child in multiprocessing.active_children() if child.name == "lightning-ig-run"]


class _StuckMidRun(TinyQNet):
    """Its forward never returns in the worker's attribution (grad on: after the run's first answer) from the run of
    step 9 on (the step a buffer carries to the worker's copy): the worker answers the runs of steps 3 and 6."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.register_buffer("step", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != _TRAINING_PROCESS and torch.is_grad_enabled() and self.step >= 9:
            time.sleep(3600)
        return super().forward(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.step.fill_(self.global_step + 1)  # the step at this batch's end, where a run starts
        return super().training_step(batch, batch_idx)


def _kill_the_worker() -> None:
    for child in multiprocessing.active_children():
        if child.name == "lightning-ig-run":
            child.kill()


@needs_a_spare_core
def test_a_worker_stuck_mid_run_is_ended_and_its_run_made_on_the_training_thread(tmp_path, one_thread, monkeypatch):
    # guards against: a fit that waited forever for a run the worker had started (a deadlock, a lock held)
    monkeypatch.setattr(fit, "_STUCK", 0.5)
    monkeypatch.setattr(fit, "_SLOW", 10)
    torch.manual_seed(0)
    model, twin = _StuckMidRun(), _StuckMidRun()
    twin.load_state_dict(model.state_dict())
    watchdog = threading.Timer(300.0, _kill_the_worker)  # a fit that would wait for ever: its worker killed instead
    watchdog.start()
    try:
        with pytest.warns(UserWarning, match=r"did not finish a run within \d+ s \(stuck\?\) and was ended; they run"):
            beside, idle = _fit_runs(tmp_path / "beside", model, overhead=None)
    finally:
        watchdog.cancel()
    assert beside._fit is not None and idle is not None and not idle.alive
    assert idle.cpu > 0.0  # it had answered runs: steps 3 and 6
    assert not [child for child in multiprocessing.active_children() if child.name == "lightning-ig-run"]
    monkeypatch.setattr(fit, "idle_core", lambda *args: None)
    inline, _ = _fit_runs(tmp_path / "inline", twin, overhead=None)
    assert len(beside.history) == len(inline.history) == 7  # the stuck run made on the training thread, none lost
    assert _reports(tmp_path / "beside" / "ig_reports") == _reports(tmp_path / "inline" / "ig_reports")


class _Terminates(Callback):
    """At step 10 (the worker stuck in step 9's run), SIGTERM to the worker and the training process, as a job
    scheduler's to the process group."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 10:
            for child in multiprocessing.active_children():
                if child.name == "lightning-ig-run":
                    child.terminate()  # SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler: the fit ends at this batch's end


@needs_a_spare_core
def test_sigterm_says_the_worker_was_ended_by_it_and_drops_its_run(tmp_path, one_thread):
    # guards against: "could not start or has ended" and the worker's run made again on the training thread while
    # the fit shuts down on SIGTERM (time out of a scheduler's grace period, before a checkpoint's on_exception)
    callback = IntegratedGradientsCallback(held_out_states(21), every_n_steps=3, overhead=None)
    trainer = make_trainer(tmp_path, [callback, _Terminates()], max_steps=20)
    said = "was ended by SIGTERM; the fit is ending on SIGTERM: the run in hand is dropped"
    with pytest.warns(UserWarning, match=said), pytest.raises(SIGTERMException):
        trainer.fit(_StuckMidRun(), DataLoader(dataset(), batch_size=16))
    assert [entry["global_step"] for entry in callback.history] == [3, 6]  # step 9's run dropped, not made again
    assert not [child for child in multiprocessing.active_children() if child.name == "lightning-ig-run"]


class _Interrupts(Callback):
    """At step 10 (the worker stuck in step 9's run), Ctrl-C, or SIGTERM to the training process alone (``docker
    stop``'s and Kubernetes' reach a container's first process only): the worker goes on."""

    def __init__(self, how: str) -> None:
        self.how = how

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 10:
            if self.how == "Ctrl-C":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler: the fit ends at this batch's end


@needs_a_spare_core
@pytest.mark.parametrize(("how", "raised"), [("Ctrl-C", SystemExit), ("SIGTERM", SIGTERMException)])
def test_a_fit_ending_on_ctrl_c_or_sigterm_drops_the_run_its_stuck_worker_still_makes_without_waiting_for_it(
    tmp_path, one_thread, how, raised
):
    # guards against: the ending fit waiting for the worker's run up to its limit (124 s and 32 s here: past a
    # scheduler's grace period, before a checkpoint's on_exception; after Ctrl-C, with Lightning ignoring a second
    # one), then, after Ctrl-C, making that run again on the training thread. It waits a second at most.
    callback = IntegratedGradientsCallback(held_out_states(21), every_n_steps=3, overhead=None)
    trainer = make_trainer(tmp_path, [callback, _Interrupts(how)], max_steps=20)
    said = (
        f"worker process was still making a run and was ended; the fit is ending on {how}: the run in hand is dropped"
    )
    sigint = signal.getsignal(signal.SIGINT)
    watchdog = threading.Timer(300.0, _kill_the_worker)  # a fit that would wait for ever: its worker killed instead
    watchdog.start()
    try:
        with pytest.warns(UserWarning, match=said), pytest.raises(raised):  # Ctrl-C: Lightning's sys.exit(1)
            trainer.fit(_StuckMidRun(), DataLoader(dataset(), batch_size=16))
    finally:
        watchdog.cancel()
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores Ctrl-C from its first on
    assert [entry["global_step"] for entry in callback.history] == [3, 6]  # step 9's run dropped, not made again
    assert not [child for child in multiprocessing.active_children() if child.name == "lightning-ig-run"]


class _Prunes(Callback):
    """Prunes the first layer at step 7 (as Lightning's ModelPruning does: ``weight`` becomes ``weight_orig``)."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 7:
            torch.nn.utils.prune.l1_unstructured(pl_module.body[0], "weight", amount=0.5)


class _GainNet(TinyQNet):
    """A parameter of its own, outside any module with ``reset_parameters`` (a re-initialised copy keeps it)."""

    def __init__(self) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.gain = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.gain)


@needs_a_spare_core
def test_pruning_mid_fit_and_a_bare_parameter_leave_the_runs_as_the_training_thread_makes_them(
    tmp_path, one_thread, monkeypatch
):
    # guards against: a KeyError from the worker's copy after pruning renamed a weight (the fit crashed), and the
    # final run's sanity figures made against a second reference of the re-initialised copies (not the first run's)
    torch.manual_seed(3)
    callback = IntegratedGradientsCallback(held_out_states(21), every_n_steps=3, overhead=None)
    trainer = make_trainer(tmp_path / "pruned", [callback, _Prunes()], max_steps=20)
    with pytest.warns(UserWarning, match=r"parameters or buffers changed names or shapes \(pruning\?\)"):
        trainer.fit(TinyQNet(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16))
    assert len(callback.history) == 7
    monkeypatch.setattr(fit, "idle_core", lambda *args: None)  # on the thread, the trust checks' copy is made anew
    checked = IntegratedGradientsCallback(held_out_states(21), every_n_steps=3, overhead=1.0)
    trainer = make_trainer(tmp_path / "checked", [checked, _Prunes()], max_steps=20)
    with pytest.warns(UserWarning, match=r"added or pruned since it was made\?\): the copy is made anew"):
        trainer.fit(TinyQNet(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16))
    assert checked.history[-1]["trust"] == "passed"  # the checks go on judging the pruned model (switched off before)
    monkeypatch.undo()
    torch.manual_seed(0)
    model, twin = _GainNet(), _GainNet()
    twin.load_state_dict(model.state_dict())
    _fit_runs(tmp_path / "beside", model, overhead=1.0)
    monkeypatch.setattr(fit, "idle_core", lambda *args: None)
    _fit_runs(tmp_path / "inline", twin, overhead=1.0)
    assert _reports(tmp_path / "beside" / "ig_reports") == _reports(tmp_path / "inline" / "ig_reports")


@needs_a_spare_core
def test_runs_on_the_epoch_cadence_stay_on_the_training_thread(tmp_path, one_thread):
    # guards against: an epoch's run sent to the worker and waited for at once (no overlap: the copy, the pipe and
    # the wait on top of the run: 0.11-0.24 s a run against 0.06 s on the thread)
    callback = IntegratedGradientsCallback(held_out_states(21), every_n_steps=None, every_n_epochs=1, overhead=None)
    worker = _Worker(callback)
    trainer = make_trainer(tmp_path, [callback, worker], max_steps=-1, max_epochs=3)
    trainer.fit(TinyQNet(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16))
    assert [entry["global_step"] for entry in callback.history] == [16, 32, 48]  # each epoch's end
    assert callback._fit is not None and worker.idle is not None
    assert worker.idle.cpu == 0.0  # the worker made no run


class _SensorError(Exception):
    """An exception whose own ``__init__`` refuses the arguments pickle gives it back (``args`` is the message only)."""

    def __init__(self, message: str, sensor: int) -> None:
        super().__init__(message)
        self.sensor = sensor


class _SensorNet(TinyQNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != _TRAINING_PROCESS:
            raise _SensorError("sensor 3 is out of range", 3)
        return super().forward(x)


@needs_a_spare_core
def test_an_error_that_does_not_unpickle_reaches_the_fit_in_its_words(tmp_path, one_thread):
    # guards against: TypeError "__init__() missing 1 required positional argument" in place of the user's error
    callback = IntegratedGradientsCallback(held_out_states(21), every_n_steps=3, overhead=None)
    trainer = make_trainer(tmp_path, [callback], max_steps=20)
    with pytest.raises(RuntimeError, match="sensor 3 is out of range"):
        trainer.fit(_SensorNet(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16))


# -- what a callback kept after its fit holds


class _Counted(TinyQNet):
    """A model class of its own (its live instances: the model and every copy made of it); training fails at step
    ``fails_at``."""

    def __init__(self, fails_at: int | None = None) -> None:
        super().__init__(noisy=False, batchnorm=False, dropout=0.0)
        self.fails_at = fails_at

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fails_at:
            raise RuntimeError("training broke")
        return super().training_step(batch, batch_idx)


def _instances(kind: type) -> list[Any]:
    gc.collect()
    return [item for item in gc.get_objects() if type(item) is kind]


class _Copies(Callback):
    """Listed before the IG callback: counts the model's live instances mid-fit, and keeps the IG callback's
    ``state_dict`` as the fit ends (before the IG callback's own end of the fit)."""

    def __init__(self, ig: IntegratedGradientsCallback) -> None:
        self.ig, self.during, self.state = ig, 0, {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == 13:  # after the runs of steps 3 to 12: the copies made by then
            self.during = len(_instances(_Counted))

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.state = self.ig.state_dict()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.state = self.ig.state_dict()


@pytest.mark.parametrize("ending", ["end", "exception"])
def test_a_callback_kept_after_its_fit_keeps_no_copy_of_the_model(tmp_path, one_thread, ending):
    # guards against: each callback kept after its fit (a sweep in a notebook, its history read later) holding the
    # runs' worker's and the trust checks' working copies of the model (with the worker's trainer, and the engines'
    # captured graphs on a GPU): two model sizes of memory each, after the fit ended or an exception ended it
    def fitted() -> tuple[IntegratedGradientsCallback, _Copies, weakref.ref[_Counted]]:
        torch.manual_seed(0)
        model = _Counted(fails_at=14 if ending == "exception" else None)
        callback = IntegratedGradientsCallback(
            held_out_states(21), every_n_steps=3, views=ViewOptions(figure_every_n_runs=None), overhead=1.0
        )
        copies = _Copies(callback)
        trainer = make_trainer(tmp_path, [copies, callback], max_steps=20)
        with pytest.raises(RuntimeError, match="training broke") if ending == "exception" else contextlib.nullcontext():
            trainer.fit(model, DataLoader(dataset(), batch_size=16))
        return callback, copies, weakref.ref(model)

    callback, copies, model = fitted()
    assert copies.during > 1  # the model and the working copies of it while the fit ran
    alive = _instances(_Counted)  # the model alone, which Lightning keeps (the callback's log): no copy of it
    assert len(alive) == 1 and alive[0] is model(), f"{len(alive) - 1} copies of the model kept after the fit"
    assert copies.state["trust_results"] and callback.history  # the checks' results, what a checkpoint keeps ...
    after = callback.state_dict()
    assert {key: value for key, value in after.items() if key != "budget"} == {  # ... and the rest, as they were
        key: value for key, value in copies.state.items() if key != "budget"
    }
