"""``target="each"`` in the callback on CUDA: the run replays its graph and holds what an eager run computes.

Needs a GPU and CuPy (``pytest -m gpu``)."""

from __future__ import annotations

import json
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.models.noise import noise_disabled
from tests.support.tiny import FEATURES, TinyQNet, dataset, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled

pytestmark = pytest.mark.gpu

N_STEPS = 32


def test_each_replays_its_graph_and_equals_the_eager_run(tmp_path, cuda_device):
    pl.seed_everything(0)
    model = TinyQNet(lr=0.0, batchnorm=False)  # the weights stay: every run and the eager one see the same model
    states = held_out_states(256)
    callback = IntegratedGradientsCallback(
        states,
        target="each",
        action_names=["left", "right"],
        every_n_steps=2,
        feature_names=FEATURES,
        overhead=None,
        run_at_train_end=False,
        report_dir=tmp_path / "reports",
        engine=IGOptions(n_steps=N_STEPS, backend="cuda"),
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=6, accelerator="gpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, DataLoader(dataset(), batch_size=32))
    capture_failures = [str(w.message) for w in caught if "CUDA graph capture" in str(w.message)]
    assert not capture_failures, capture_failures
    assert [entry["global_step"] for entry in callback.history] == [2, 4, 6]
    # captured at the first run, replayed at the later ones: every action's Q in one replay
    assert callback._fit.engine.last_mode == "graph" and callback._fit.target.every_output
    report = json.loads((tmp_path / "reports" / "ig_report_step=00000006.json").read_text())
    assert report["backend"] == "cuda" and report["num_states"] == 256

    model = model.to(cuda_device).eval()
    with noise_disabled(model):
        eager = integrated_gradients(model, states.to(cuda_device), target="each", n_steps=N_STEPS, backend="cuda")
    attributions = eager.attributions.double().cpu()  # (A, B, F)
    sums = attributions.sum(-1).T.reshape(-1)  # state-major, as the report's rows
    change = (eager.f_input - eager.f_baseline).double().cpu().T.reshape(-1)
    rows = report["completeness"]["per_state"]
    assert [(row["state_idx"], row["action"]) for row in rows] == [(s, a) for s in range(256) for a in range(2)]
    # The replay and the eager call run the same kernels on the same numbers; the rows per forward may differ.
    scale = float(attributions.abs().sum(-1).max())
    assert_close_scaled([row["sum_attributions"] for row in rows], sums, ulps=64, scale=scale)
    assert_close_scaled([row["f_input_minus_f_baseline"] for row in rows], change, ulps=64, scale=scale)
    for action, entry in enumerate(report["actions"]):
        top = {row["name"]: row["mean_abs"] for row in entry["top_10_by_mean_abs"]}
        expected = attributions[action].abs().mean(0)
        assert_close_scaled([top[name] for name in FEATURES], expected, ulps=64, scale=float(expected.max()))
    with torch.no_grad():
        greedy = torch.bincount(model(states.to(cuda_device)).argmax(1), minlength=2).tolist()
    assert [entry["greedy_states"] for entry in report["actions"]] == greedy
