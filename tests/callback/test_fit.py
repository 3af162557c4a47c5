"""callback/fit.py: the set-up a fit makes once (the plan) and what a fit holds after its start."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_ig import IntegratedGradientsCallback
from lightning_ig.callback import fit
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
