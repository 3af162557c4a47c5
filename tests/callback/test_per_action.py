"""lightning_ig.callback.per_action: a ``target="each"`` result as a row per (state, action), and its trust checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import lightning_ig.attribution.engine as engine_module
import lightning_ig.callback.fit as fit_module
from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.monitor import TrustMonitor
from lightning_ig.callback.per_action import pair_rows
from lightning_ig.models.noise import noise_disabled
from tests.callback.test_callback import loader
from tests.support.graphs import EmulatedCapture
from tests.support.tiny import TinyQNet, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled
from tests.support.trust import checks_without_budget


def _each(n_steps: int | str = 16) -> tuple[torch.nn.Module, torch.Tensor, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    states = torch.randn(5, 4)
    return model, states, integrated_gradients(model, states, target="each", n_steps=n_steps)


def test_the_rows_are_the_pairs_state_major():
    _, _, result = _each()
    rows = pair_rows(result)
    assert rows.attributions.shape == (15, 4) and rows.f_input.shape == (15,)
    for state in range(5):
        for action in range(3):
            row = 3 * state + action
            assert torch.equal(rows.attributions[row], result.attributions[action, state])
            for name in ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite"):
                assert torch.equal(getattr(rows, name)[row], getattr(result, name)[action, state]), name
            for name in ("attribution_error", "mass_relative_error", "attribution_mass"):
                assert torch.equal(getattr(rows, name)[row], getattr(result, name)[action, state]), name
            assert torch.equal(rows.baselines[row], result.baselines[state])
    assert rows.target == "each" and rows.n_steps_per_state is None


def test_with_auto_steps_a_states_actions_share_its_steps():
    _, _, result = _each("auto")
    rows = pair_rows(result)
    assert torch.equal(rows.n_steps_per_state, result.n_steps_per_state.repeat_interleave(3))


def test_a_result_of_another_target_is_refused():
    model, states, _ = _each()
    with pytest.raises(ValueError, match="f_input of shape \\(5,\\)"):
        pair_rows(integrated_gradients(model, states, target="mean", n_steps=4))


def test_the_trust_checks_of_each_attribute_the_mean_over_the_actions(tmp_path, monkeypatch):
    seen = []
    attempt = TrustMonitor._attempt

    def spy(self, name, host, *rest):
        seen.append(host)
        return attempt(self, name, host, *rest)

    monkeypatch.setattr(TrustMonitor, "_attempt", spy)  # what each check reads
    model, states = TinyQNet(lr=0.0, batchnorm=False), held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        target="each",
        every_n_steps=4,
        overhead=0.02,
        engine=IGOptions(n_steps=16),
    )
    with warnings.catch_warnings(), checks_without_budget():  # every check at the one run of this short fit
        warnings.simplefilter("ignore")
        make_trainer(tmp_path, [callback], max_steps=4).fit(model, loader())
    trust = callback._fit.trust
    assert trust.rows_per_state == 2 and trust.settings.target.label == "mean"
    # All three checks ran: the deletion check too (the mean over the actions is a plain forward).
    verdict = callback._last.trust_checks
    assert verdict.randomization is not None and verdict.deletion is not None and verdict.stability.applicable
    model.eval()
    with noise_disabled(model):
        value = integrated_gradients(model, states, target="mean", n_steps=16).attributions.double().numpy()
    # The checks read each state's action rows averaged: by linearity, the attributions of the mean Q (V(s)).
    host = seen[0]  # one run, at step 4 (the end of training is the same step); every check reads the same rows
    assert all(other is host for other in seen) and host.attributions.shape == (len(states), 4)
    assert_close_scaled(host.attributions, value, ulps=64, scale=float(np.abs(value).sum(1).max()))


def test_an_each_run_replays_its_graph_and_holds_what_an_eager_run_computes(tmp_path, monkeypatch):
    """The capture emulated on the CPU (as in test_run_path.py): the runs after the first replay the graph of every
    action's Q; what they log equals an eager ``target="each"`` call on the same weights."""
    monkeypatch.setattr(engine_module, "GraphCapture", EmulatedCapture)
    monkeypatch.setattr(fit_module, "idle_core", lambda *args: None)  # a device's path: runs on the training thread
    model, states = TinyQNet(lr=0.0, batchnorm=False), held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        target="each",
        every_n_steps=2,
        overhead=None,
        engine=IGOptions(n_steps=8),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_trainer(tmp_path, [callback], max_steps=6).fit(model, loader())
    assert [entry["global_step"] for entry in callback.history] == [2, 4, 6]
    assert callback._fit.engine.last_mode == "graph"
    model.eval()
    with noise_disabled(model):
        eager = integrated_gradients(model, states, target="each", n_steps=8).attributions.double()  # (A, B, F)
    expected = eager.abs().mean((0, 1)).numpy()  # the plain numbers: the mean over the actions
    for entry in callback.history:
        assert_close_scaled(entry["mean_abs"], expected, ulps=16)
    actions = callback._last.actions
    for action in range(2):
        assert_close_scaled(actions.moments[action].mean_abs, eager[action].abs().mean(0).numpy(), ulps=16)
