"""The callback's why-this-action target: ``target="contrast"`` (per state ``Q(greedy) - Q(runner-up)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_ig.attribution import integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.models.noise import noise_disabled
from lightning_ig.views.actions import greedy_and_runner_up
from tests.callback.test_callback import loader
from tests.support.tiny import FEATURES, TinyQNet, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled

REPO = Path(__file__).resolve().parents[2]
N_STEPS = 16


@pytest.fixture(scope="module")
def contrast_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fit with ``target="contrast"`` at ``lr=0``, runs at steps 5 and 10; the last run saw the final weights and
    batch-norm statistics (the model's BatchNorm still updates them in training mode at ``lr=0``)."""
    root = tmp_path_factory.mktemp("contrast")
    pl.seed_everything(0)
    model = TinyQNet(lr=0.0)
    states = held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        target="contrast",
        every_n_steps=5,
        feature_names=FEATURES,
        n_steps=N_STEPS,
        figure_every_n_runs=1,
        calibrate_every=None,  # the midpoint rule throughout, as the direct run below
    )
    tensorboard = TensorBoardLogger(root, name="tb")
    trainer = make_trainer(root, [callback], max_steps=10, logger=tensorboard)
    trainer.fit(model, loader())
    events = EventAccumulator(tensorboard.log_dir, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    model.eval()
    with noise_disabled(model):
        result = integrated_gradients(model, states, target="contrast", n_steps=N_STEPS)
        with torch.no_grad():
            q_values = model(states).double()
    model.train()
    return {"callback": callback, "events": events, "result": result, "q_values": q_values, "states": states}


def test_contrast_is_the_greedy_margin_and_its_scalars_equal_the_engines(contrast_run):
    result, events = contrast_run["result"], contrast_run["events"]
    # The engine's pairs are the greedy and runner-up outputs at each state, its target their difference.
    greedy, runner_up = greedy_and_runner_up(contrast_run["q_values"].numpy())
    assert np.array_equal(result.target_actions.numpy(), np.stack([greedy, runner_up], axis=1))
    margin = contrast_run["q_values"].max(1).values - contrast_run["q_values"].min(1).values  # two actions
    assert_close_scaled(result.f_input.double(), margin, ulps=8)
    assert contrast_run["callback"]._fit.target_label == "contrast"
    attributions = result.attributions.double()
    scale = float(attributions.abs().mean(0).max())
    logged_abs = [events.Scalars(f"ig/mean_abs/{name}")[-1] for name in FEATURES]
    assert [event.step for event in logged_abs] == [10] * len(FEATURES)
    # The same float32 IG on the same weights; TensorBoard keeps float32: roundings of mean |attr| bound it.
    assert_close_scaled([event.value for event in logged_abs], attributions.abs().mean(0), ulps=16, scale=scale)
    logged_signed = [events.Scalars(f"ig/mean_signed/{name}")[-1].value for name in FEATURES]
    assert_close_scaled(logged_signed, attributions.mean(0), ulps=16, scale=scale)
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "contrast" in text


def test_contrast_draws_the_actions_picture_at_the_figures_cadence(contrast_run):
    events = contrast_run["events"]
    assert [event.step for event in events.Images("ig/actions")] == [5, 10]
    assert [event.step for event in events.Images("ig/top_features")] == [5, 10]
    documented = (REPO / "docs" / "tensorboard-tags.md").read_text()
    for tag in events.Tags()["images"]:
        assert f"`{tag}`" in documented, tag
    assert 'target="contrast"' in documented


def test_contrast_leaves_training_bit_identical(tmp_path):
    def train(with_callback: bool) -> TinyQNet:
        pl.seed_everything(123)
        model = TinyQNet()
        callbacks = []
        if with_callback:
            callbacks.append(
                IntegratedGradientsCallback(held_out_states(), target="contrast", every_n_steps=3, n_steps=8)
            )
        make_trainer(tmp_path / str(with_callback), callbacks, max_steps=12).fit(model, loader(shuffle=True))
        return model

    without, with_ig = train(False), train(True)
    for (name, a), (_, b) in zip(without.state_dict().items(), with_ig.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs"


def test_contrast_needs_two_outputs_and_unknown_targets_are_refused(tmp_path):
    class OneOutput(TinyQNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)[:, 0]  # (N,)

    callback = IntegratedGradientsCallback(held_out_states(), target="contrast", every_n_steps=5)
    with pytest.raises(ValueError, match="target='contrast' needs at least two outputs"):
        make_trainer(tmp_path, [callback], max_steps=2).fit(OneOutput(), loader())
    with pytest.raises(ValueError, match="'contrast'"):
        IntegratedGradientsCallback(held_out_states(), target="greedy")


def test_contrast_under_ddp_gathers_every_state_and_draws_the_picture(tmp_path):
    """Two CPU ranks (gloo, ``ddp_spawn``): 37 states split unevenly, the Q-values gathered with the result."""
    pl.seed_everything(0)
    model = TinyQNet(lr=0.0, batchnorm=False)  # fixed weights: the run saw the weights the direct run sees
    states = held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        target="contrast",
        every_n_steps=4,
        n_steps=8,
        report_dir=tmp_path / "reports",
        figure_every_n_runs=1,
        checks_every_n_runs=None,
        calibrate_every=None,
    )
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    trainer = make_trainer(tmp_path, [callback], max_steps=4, logger=tensorboard, devices=2, strategy="ddp_spawn")
    trainer.fit(model, loader())
    report = json.loads((tmp_path / "reports" / "ig_report_step=00000004.json").read_text())
    model.eval()
    with noise_disabled(model):
        result = integrated_gradients(model, states, target="contrast", n_steps=8)
    assert report["num_states"] == len(states) and report["forward_target"] == "contrast"
    differences = [state["f_input_minus_f_baseline"] for state in report["completeness"]["per_state"]]
    expected = (result.f_input - result.f_baseline).double()
    assert_close_scaled(differences, expected, ulps=16)
    (log_dir,) = {path.parent for path in (tmp_path / "tb").rglob("events.out.tfevents.*")}  # rank zero's, spawned
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    events.Reload()
    assert [event.step for event in events.Images("ig/actions")] == [4]
