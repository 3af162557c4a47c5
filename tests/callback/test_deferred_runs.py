"""A run started at one batch end is ended (summarized, logged, written) at the next: nothing lost, nothing reordered.

The callback queues a run's reductions and its copy to the host at step ``s`` and reads them one step later, so
the training thread never waits for the attribution. These tests pin what that must not change: every run is in
the history and the reports under its own step, in order; an exception, the end of training or a checkpoint in
between still ends it; and the numbers are those of a run ended at once.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.run.host_result import HostResult, HostTransfer
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer


class _StopAt(Callback):
    """Raise in the training step after ``step`` (a crash between a run's start and its end)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("stopped by the test")


def _fit(tmp_path: Path, callbacks: list[Callback], max_steps: int, **model: object) -> pl.Trainer:
    pl.seed_everything(3)
    trainer = make_trainer(tmp_path, callbacks, max_steps=max_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyQNet(**model), DataLoader(dataset(64), batch_size=8))
    return trainer


def test_every_run_is_reported_under_its_own_step_in_order(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(
        held_out_states(16),
        every_n_steps=2,
        run_at_train_end=False,
        report_dir=tmp_path / "r",
        engine=IGOptions(n_steps=8),
    )
    _fit(tmp_path, [callback], max_steps=7)
    assert [entry["global_step"] for entry in callback.history] == [2, 4, 6]
    reports = sorted(path.name for path in (tmp_path / "r").glob("ig_report_step=*.json"))
    assert reports == [f"ig_report_step={step:08d}.json" for step in (2, 4, 6)]
    assert all(json.loads((tmp_path / "r" / name).read_text())["schema_version"] == 1 for name in reports)
    assert callback._pending is None


def test_a_run_started_before_an_exception_is_still_ended(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=3, report_dir=tmp_path / "r", engine=IGOptions(n_steps=8)
    )
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _fit(tmp_path, [callback, _StopAt(3)], max_steps=10)
    assert [entry["global_step"] for entry in callback.history] == [
        3
    ]  # started at step 3, the crash before step 4 ended
    assert (tmp_path / "r" / "ig_report_step=00000003.json").is_file()


class _SaveAt(Callback):
    """What a checkpoint saves of ``callback`` at the batch end of ``step`` (after the callback's own hook)."""

    def __init__(self, callback: IntegratedGradientsCallback, step: int) -> None:
        self.callback, self.step = callback, step
        self.saved: dict | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            self.saved = self.callback.state_dict()


def test_a_checkpoint_between_start_and_end_holds_the_run(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=2, run_at_train_end=False, engine=IGOptions(n_steps=8)
    )
    save = _SaveAt(callback, 2)
    _fit(tmp_path, [callback, save], max_steps=5)  # the run of step 2 started at that batch end, then the save
    assert save.saved is not None
    assert [entry["global_step"] for entry in save.saved["history"]] == [2]
    assert [entry["global_step"] for entry in callback.history] == [2, 4]


def test_a_deferred_run_gives_the_numbers_of_a_run_ended_at_once(tmp_path: Path) -> None:
    deferred = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=2, run_at_train_end=False, engine=IGOptions(n_steps=8)
    )
    trainer = _fit(tmp_path, [deferred], max_steps=3, lr=0.0, batchnorm=False)  # the weights stay as they are
    model = trainer.lightning_module
    at_once = deferred.history[-1]
    deferred._run(trainer, model, final=False)  # the same weights, ended at once
    again = deferred.history[-1]
    assert again["mean_abs"] == at_once["mean_abs"]


def test_the_transfer_on_the_cpu_is_ready_and_equals_from_result() -> None:
    from lightning_ig.attribution import integrated_gradients

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    result = integrated_gradients(model, torch.randn(5, 4), n_steps=8)
    transfer = HostResult.begin(result, sample_states=2)
    assert isinstance(transfer, HostTransfer)
    host, direct = transfer.result(), HostResult.from_result(result, sample_states=2)
    assert transfer.result() is host  # read once
    assert (host.features.mean_abs == direct.features.mean_abs).all()
    assert (host.sample_attributions == direct.sample_attributions).all()
