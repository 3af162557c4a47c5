"""The callback's runs on the side stream (callback/fit.py's ``Fit.side``), on the CPU with the graph capture emulated.

On the CPU the side stream's steps run in order on the one thread (tests/attribution/test_side_stream.py); what is
pinned here is the callback's side of it: the same numbers as runs on the training stream, training unchanged, a
run that stays pending until its numbers have landed and is then ended under its own step, and the paths that keep
the runs on the training stream.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_ig.attribution.engine as engine_module
from lightning_ig.attribution.host_result import HostTransfer
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback import fit as fit_module
from tests.support.graphs import EmulatedCapture
from tests.support.tiny import ConvQNet, TinyQNet, dataset, frame_dataset, frames, held_out_states, make_trainer


def _fit(tmp_path: Path, callbacks: list, max_steps: int, model: pl.LightningModule, data: Any) -> pl.LightningModule:
    trainer = make_trainer(tmp_path, callbacks, max_steps=max_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(data, batch_size=8))
    return model


def _tiny(seed: int = 3) -> TinyQNet:
    pl.seed_everything(seed)
    return TinyQNet()


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine captures with the CPU emulation: the callback's runs then replay, on the side stream."""
    monkeypatch.setattr(engine_module, "GraphCapture", EmulatedCapture)
    monkeypatch.setattr(fit_module, "SIDE_STREAM", True)  # the mechanism, on the CPU: off by default (fit.SIDE_STREAM)


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("checks", [None, 2])
def test_side_runs_log_the_numbers_of_runs_on_the_training_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checks: int | None
) -> None:
    def run(side: bool) -> tuple[IntegratedGradientsCallback, dict[str, torch.Tensor]]:
        if not side:
            monkeypatch.setattr(fit_module, "_side_stream", lambda *args: None)
        callback = IntegratedGradientsCallback(
            held_out_states(16), every_n_steps=2, n_steps=8, checks_every_n_runs=checks, calibrate_every=3
        )
        model = _fit(tmp_path / str(side), [callback], 13, _tiny(), dataset(64))
        assert (callback._fit.side is not None) == side
        return callback, {k: v.clone() for k, v in model.state_dict().items()}

    side, side_weights = run(True)
    stream, stream_weights = run(False)
    assert [e["global_step"] for e in side.history] == [2, 4, 6, 8, 10, 12, 13]
    assert side.history == stream.history  # every run's per-feature numbers, bit for bit (floats compared equal)
    timeless = [dataclasses.replace(c._last.completeness, calibration_ms=None) for c in (side, stream)]
    assert timeless[0] == timeless[1]  # the accuracy figures and the verdict too (the calibration's time aside)
    untouched = _fit(tmp_path / "off", [], 13, _tiny(), dataset(64))
    for name, value in untouched.state_dict().items():  # training as without the callback, bit for bit
        assert torch.equal(value, side_weights[name]) and torch.equal(value, stream_weights[name]), name


@pytest.mark.usefixtures("emulated")
def test_a_run_stays_pending_until_its_numbers_have_landed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: dict[int, int] = {}

    def ready(transfer: HostTransfer) -> bool:  # each run's copy lands at the third time a batch end asks
        asked[id(transfer)] = asked.get(id(transfer), 0) + 1
        return asked[id(transfer)] >= 3

    monkeypatch.setattr(HostTransfer, "ready", ready)
    ended: list[tuple[int, int]] = []  # (the run's step, the step at which it was ended)
    finish = IntegratedGradientsCallback._finish

    def noting(self: IntegratedGradientsCallback, pending: Any) -> None:
        ended.append((pending.step, pending.trainer.global_step))
        finish(self, pending)

    monkeypatch.setattr(IntegratedGradientsCallback, "_finish", noting)
    callback = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=4, n_steps=8, checks_every_n_runs=None, run_at_train_end=False
    )
    _fit(tmp_path, [callback], 13, _tiny(), dataset(128))  # one epoch: its end would end a pending run too
    # started at 4, asked at 5 and 6, landed at 7; the last one (12) is ended at the end of training (13)
    assert ended == [(4, 7), (8, 11), (12, 13)]
    assert [entry["global_step"] for entry in callback.history] == [4, 8, 12]


@pytest.mark.usefixtures("emulated")
def test_a_pending_run_ends_before_the_next_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HostTransfer, "ready", lambda transfer: False)  # never lands while training goes on
    callback = IntegratedGradientsCallback(held_out_states(16), every_n_steps=2, n_steps=8, checks_every_n_runs=None)
    _fit(tmp_path, [callback], 9, _tiny(), dataset(64))
    assert [entry["global_step"] for entry in callback.history] == [2, 4, 6, 8, 9]  # each ended by the next start


@pytest.mark.usefixtures("emulated")
def test_spatial_states_run_on_the_side_stream_with_their_groups(tmp_path: Path) -> None:
    shape = (3, 16, 16)
    callback = IntegratedGradientsCallback(frames(8, shape), every_n_steps=2, n_steps=8, max_logged_features=4)
    pl.seed_everything(0)
    _fit(tmp_path, [callback], 5, ConvQNet(shape), frame_dataset(32, shape))
    side = callback._fit.side
    assert side is not None and side._replay is not None  # the steady runs replayed both graphs
    assert callback._fit.host_options["keep_attributions"] is False  # groups: the checks read the group sums
    assert len(callback._last.groups.names) == 3 and callback._last.groups.values.shape == (8, 3)


def test_no_side_stream_without_a_graph(tmp_path: Path) -> None:
    callback = IntegratedGradientsCallback(held_out_states(16), every_n_steps=2, n_steps=8)
    _fit(tmp_path, [callback], 5, _tiny(), dataset(64))
    assert callback._fit.side is None  # the CPU captures no graph: the runs stay as they were
    assert [entry["global_step"] for entry in callback.history] == [2, 4, 5]


def test_the_side_stream_is_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off (fit.SIDE_STREAM, its docstring says why): the runs replay on the training stream."""
    monkeypatch.setattr(engine_module, "GraphCapture", EmulatedCapture)
    assert fit_module.SIDE_STREAM is False
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=2, n_steps=8, checks_every_n_runs=None)
    _fit(tmp_path, [callback], 4, _tiny(), dataset())
    assert callback._fit is not None and callback._fit.side is None and callback._fit.engine.last_mode == "graph"
