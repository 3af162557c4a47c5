"""callback/monitor.py: the trust checks in the callback's runs.

The callback's checks must leave training alone (bit-identical weights and optimizer state, the random generators
as they were), run where the budget says (the callback enters the monitor only there), and log their tags and the
verdict (ig/trust/status at every run, the report text, RunSummary.trust_checks).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

import lightning_ig.callback.callback as callback_module
import lightning_ig.callback.fit as fit_module
from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback, budget
from lightning_ig.models.noise import attribution_mode
from lightning_ig.views import ViewOptions
from tests.support.tiny import ConvQNet, TinyQNet, dataset, frame_dataset, frames, held_out_states, make_trainer
from tests.support.trust import trust_scalar_tags

EVERYTHING = frozenset({"sanity", "deletion", "stability"})


# ---------------------------------------------------------------------------------------------- in the callback


def _checks_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check at every run (the suite's frozen clock: no budget limits them): the most the checks can touch."""
    monkeypatch.setattr(budget, "CHECK_EVERY", 1)


def _fit(tmp_path: Path, checks: str | None, *, logger=None) -> tuple[TinyQNet, pl.Trainer]:
    pl.seed_everything(123)
    model = TinyQNet()
    callbacks = []
    if checks != "no callback":
        callbacks.append(
            IntegratedGradientsCallback(
                held_out_states(),
                every_n_steps=3,
                overhead=None if checks is None else 0.02,
                engine=IGOptions(n_steps=8),
                views=ViewOptions(figure_every_n_runs=None),
            )
        )
    trainer = make_trainer(tmp_path, callbacks, max_steps=12, **({} if logger is None else {"logger": logger}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(dataset(), batch_size=16, shuffle=True))
    return model, trainer


def test_training_is_bit_identical_with_checks_at_every_run(tmp_path, monkeypatch):
    _checks_every_run(monkeypatch)
    without, trainer_without = _fit(tmp_path / "a", "no callback")
    generator_without = torch.get_rng_state()
    with_checks, trainer_with = _fit(tmp_path / "b", "checks")
    assert torch.equal(generator_without, torch.get_rng_state())
    monitor = trainer_with.callbacks[0]._fit.trust
    assert trainer_with.callbacks[0]._budget.last_checks == dict.fromkeys(EVERYTHING, 3)  # each check at all 4 runs
    assert all(monitor.seconds[name] > 0 for name in ("replica", "reference", "sanity", "deletion", "stability"))
    for (name, a), (_, b) in zip(without.state_dict().items(), with_checks.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs"  # weights, BatchNorm statistics, noise buffers
    state_a, state_b = trainer_without.optimizers[0].state_dict(), trainer_with.optimizers[0].state_dict()
    for key, state in state_a["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_b["state"][key][name])), name


def test_a_run_with_checks_under_inference_mode_leaves_the_generators(tmp_path, monkeypatch):
    _checks_every_run(monkeypatch)
    model, trainer = _fit(tmp_path, "checks")
    callback = trainer.callbacks[0]
    before = (torch.get_rng_state(), {name: value.clone() for name, value in model.state_dict().items()})
    spent = sum(callback._fit.trust.seconds.values())
    with torch.inference_mode():
        callback._run(trainer, model, final=True)
    assert sum(callback._fit.trust.seconds.values()) > spent  # the checks ran
    assert torch.equal(before[0], torch.get_rng_state())
    assert all(torch.equal(value, model.state_dict()[name]) for name, value in before[1].items())


def test_the_checks_are_logged_with_the_verdict_in_the_summary_and_the_report_text(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb")
    _, trainer = _fit(tmp_path, "checks", logger=logger)
    callback = trainer.callbacks[0]
    verdict = callback._last.trust_checks
    assert verdict is not None and verdict.status in {"passed", "failed", "unresolved"}
    assert verdict.randomization is not None and verdict.deletion is not None and verdict.stability.applicable
    assert not verdict.randomization.resolved  # 4 features: said so, never a plain pass
    assert verdict.status in {"passed", "failed"}  # the others decide; the note says what a pass cannot
    assert (verdict.randomization.note in verdict.notes) == verdict.randomization.passed
    assert verdict.status == "failed" or verdict.randomization.note in verdict.headline()
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert set(trust_scalar_tags("ig", noisy=True)) <= scalars
    # runs at steps 3, 6, 9, 12 (the train-end run is skipped: step 12 ran): every check at the first run and at the
    # last, the fit's final answer (the next turn would be run 5), the verdict at every run, resting on the latest
    # results (carried between checks)
    assert [event.step for event in events.Scalars("ig/sanity/randomization_rank_correlation")] == [3, 12]
    assert [event.step for event in events.Scalars("ig/trust/status")] == [3, 6, 9, 12]
    rho = events.Scalars("ig/sanity/randomization_rank_correlation")[-1].value
    assert math.isclose(rho, verdict.randomization.randomization_rank_correlation, rel_tol=1e-6)
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert f"**Trust: {verdict.status}**" in text and "sanity (step 12)" in text and "deletion AUC" in text
    # the status and its failures first, then what V(s) relies on (in TensorBoard's box), then every check's figures
    assert text.index("**Trust: ") < text.index("What V(s) relies on") < text.index("sanity (step 12)")


def test_the_checks_run_where_the_budget_says_and_the_runs_between_carry_the_verdict(tmp_path):
    """A 12-run fit (the suite's frozen clock: the budget never binds): every check at the first run, each again
    CHECK_EVERY runs later and at the last run (at the fit's last step: the final answer); a check's tags appear at
    exactly those runs; the other runs carry the last verdict."""
    pl.seed_everything(123)
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=1, engine=IGOptions(n_steps=8), views=ViewOptions(figure_every_n_runs=None)
    )
    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = make_trainer(tmp_path, [callback], max_steps=12, logger=logger)
    verdicts, carried = [], []  # each run's verdict, and what the monitor had made for it to carry
    finish = IntegratedGradientsCallback._finish

    def recording(self, pending, **kwargs):
        trust = self._fit.trust if self._fit is not None else None
        before = trust.carried if trust is not None else {}
        finish(self, pending, **kwargs)
        verdicts.append(self._last.trust_checks)
        carried.append(before.get(self._last.completeness.accuracy.within, (None, None))[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(IntegratedGradientsCallback, "_finish", recording)
            trainer.fit(TinyQNet(), DataLoader(dataset(), batch_size=16, shuffle=True))
    monitor = callback._fit.trust
    made = {run: run % budget.CHECK_EVERY == 0 or run == 11 for run in range(12)}
    assert callback._budget.last_checks == dict.fromkeys(EVERYTHING, 11)
    first = verdicts[0]
    assert first.deletion is not None and first.randomization is not None and first.stability is not None
    assert not any("not run yet" in note for note in first.notes)  # every check decides at the first run
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: [event.step for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert logged["ig/trust/status"] == logged["ig/overhead"] == list(range(1, 13))  # at every run (run r: step r + 1)
    assert logged["ig/faithfulness/deletion_auc"] == [run + 1 for run, made_one in made.items() if made_one]
    assert carried[0] is None  # the first run makes its verdict
    for run in range(1, 12):  # a run between checks carries the verdict made at the last, for its own accuracy
        assert (verdicts[run] is carried[run]) == (not made[run]), run
    within = {key: verdict.status for key, (verdict, _) in monitor.carried.items()}
    assert within[False] == within[None] == "failed"  # this run's accuracy failing fails the carried verdict
    assert monitor.carried[False][1] == {"ig/trust/status": -1.0}


class _Reshaped(TinyQNet):
    """Gains a buffer its forward never reads at step 3, has its activation swapped at step 6 (the names kept) and its
    first layer pruned at step 9 (``weight`` becomes ``weight_orig``)."""

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        if self.global_step == 3:
            self.register_buffer("unread", torch.zeros(1))  # changes nothing the model computes: no warning
        if self.global_step == 6:
            self.body[2] = torch.nn.ReLU()
        if self.global_step == 9:
            torch.nn.utils.prune.l1_unstructured(self.body[0], "weight", amount=0.5)


class _Copy(Callback):
    """Keeps the trust checks' working copy of the model as training ends (the fit's end lets go of it)."""

    def __init__(self, ig: IntegratedGradientsCallback) -> None:
        self.ig, self.replica = ig, None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.replica = None if self.ig._fit is None or self.ig._fit.trust is None else self.ig._fit.trust._replica


@pytest.mark.parametrize("target", ["mean", "each"])
def test_a_model_that_changes_structure_mid_fit_has_its_checks_copy_made_anew(tmp_path, monkeypatch, target):
    # guards against: the checks' working copy, made at the first check, judging the old network for the rest of the
    # fit (its parameter names unchanged, so sync() took the weights) and the verdict saying passed, without a word;
    # and the checks switched off for the rest of the fit once pruning renamed a weight (the copy could not sync)
    _checks_every_run(monkeypatch)
    monkeypatch.setattr(fit_module, "idle_core", lambda *args: None)  # the training thread's path
    pl.seed_everything(0)
    callback = IntegratedGradientsCallback(
        held_out_states(),
        every_n_steps=3,
        target=target,
        engine=IGOptions(n_steps=8),
        views=ViewOptions(figure_every_n_runs=None),
    )
    model, copy = _Reshaped(noisy=False), _Copy(callback)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback, copy], max_steps=12).fit(model, DataLoader(dataset(), batch_size=16))
    assert len([w for w in caught if "made anew" in str(w.message)]) == 2  # at the first check after each change
    assert not [w for w in caught if "could not run" in str(w.message)]
    replica = copy.replica  # the last check's (the final run's), listed after the callback: its train end first
    assert replica is not None
    replica.sync()
    with torch.no_grad(), attribution_mode(model):
        assert torch.equal(replica.module(held_out_states()), model(held_out_states()))  # the model as it is


class _PrunedAtStep4(TinyQNet):
    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        if self.global_step == 4:
            torch.nn.utils.prune.l1_unstructured(self.body[0], "weight", amount=0.5)


def test_a_layer_pruned_mid_fit_has_the_copy_made_anew_where_the_values_are_not_compared(tmp_path, monkeypatch):
    # guards against: a NoisyNet model attributed with target="contrast" (a stochastic run, outputs picked by state:
    # the copy's values are not compared), pruned mid-fit: the copy never synced before the checks, so the stability
    # check could not run ("KeyError: 'body.0.weight'", the key alone) and was off for the rest of the fit
    _checks_every_run(monkeypatch)
    monkeypatch.setattr(fit_module, "idle_core", lambda *args: None)  # the training thread's path
    pl.seed_everything(0)
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=3, target="contrast", engine=IGOptions(n_steps=8)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=12).fit(
            _PrunedAtStep4(batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16)
        )
    assert not [w for w in caught if "could not run" in str(w.message)]
    assert len([w for w in caught if "made anew" in str(w.message)]) == 1
    assert callback.history[-1]["trust"] == "passed"


class _CopyOutOfMemory(TinyQNet):
    """Its forward runs out of memory on the checks' copy (no gradients: the copy's weights) from step 6 on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.body[0].weight.requires_grad and self.global_step >= 6:  # a GPU full with training's tensors
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x)


def test_a_copy_whose_forward_fails_is_said_with_its_error_and_not_made_anew(tmp_path, monkeypatch):
    # guards against: an error of the copy's forward taken for a model changed since the copy was made: the copy made
    # anew (more memory, on an out-of-memory), "a module swapped, added or pruned" said, then the checks switched off
    # as "the model's working copy does not compute the values the run attributed", the error itself never said
    _checks_every_run(monkeypatch)
    monkeypatch.setattr(fit_module, "idle_core", lambda *args: None)  # the training thread's path
    pl.seed_everything(0)
    callback = IntegratedGradientsCallback(held_out_states(), every_n_steps=3, engine=IGOptions(n_steps=8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=9).fit(
            _CopyOutOfMemory(noisy=False, batchnorm=False, dropout=0.0), DataLoader(dataset(), batch_size=16)
        )
    said = [str(w.message) for w in caught if "could not run" in str(w.message) or "made anew" in str(w.message)]
    assert said and all("could not run (OutOfMemoryError: 'CUDA out of memory" in message for message in said), said


def test_no_checks_no_trust_tags(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb")
    _, trainer = _fit(tmp_path, None, logger=logger)
    assert trainer.callbacks[0]._last.trust_checks is None and trainer.callbacks[0]._fit.trust is None
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    assert not any(tag.startswith(("ig/sanity", "ig/trust", "ig/faith")) for tag in events.Tags()["scalars"])


class SamplingQNet(TinyQNet):
    """A forward that samples from torch's global generator in every mode, eval included."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + 1e-3 * torch.randn(x.shape[0], 2, device=x.device)


def test_training_is_bit_identical_when_the_forward_samples_in_eval_mode_and_not_without_the_guard(
    tmp_path, monkeypatch
):
    _checks_every_run(monkeypatch)

    def weights(folder: str, callback: bool) -> dict[str, torch.Tensor]:
        pl.seed_everything(123)
        model = SamplingQNet()
        options = {"every_n_steps": 3, "engine": IGOptions(n_steps=8), "views": ViewOptions(figure_every_n_runs=None)}
        callbacks = [IntegratedGradientsCallback(held_out_states(), **options)] if callback else []
        trainer = make_trainer(tmp_path / folder, callbacks, max_steps=12)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, DataLoader(dataset(), batch_size=16, shuffle=True))
        if callback:  # every check at every run: the working copy's forwards sampled
            assert callbacks[0]._budget.last_checks == dict.fromkeys(EVERYTHING, 3)
        return model.state_dict()

    without, guarded = weights("none", False), weights("guarded", True)
    assert all(torch.equal(without[name], guarded[name]) for name in without)
    monkeypatch.setattr(callback_module, "generators_kept", lambda module: contextlib.nullcontext())
    unguarded = weights("unguarded", True)  # the checks' forwards draw what training would have drawn
    assert not all(torch.equal(without[name], unguarded[name]) for name in without)


def _fit_to(
    tmp_path: Path,
    max_steps: int,
    checkpoint: Path | None,
    seen: list[tuple[list[str], dict[str, int]]] | None = None,
    states: torch.Tensor | None = None,
) -> IntegratedGradientsCallback:
    """A fit with every check due at its first run and its last; a fresh one (no ``checkpoint``) saves ``half.ckpt``
    at its end. ``seen`` gets each run's checks and the step each check's standing result comes from."""
    pl.seed_everything(123)
    callback = IntegratedGradientsCallback(
        held_out_states() if states is None else states,
        every_n_steps=3,
        engine=IGOptions(n_steps=8),
        views=ViewOptions(figure_every_n_runs=None),
    )
    trainer = make_trainer(tmp_path, [callback], max_steps=max_steps)
    finish = IntegratedGradientsCallback._finish

    def recording(self, pending, **kwargs):
        finish(self, pending, **kwargs)
        if seen is not None:
            seen.append((self._last.budget["checks"], dict(self._fit.trust._steps)))

    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore")
        patch.setattr(IntegratedGradientsCallback, "_finish", recording)
        trainer.fit(TinyQNet(), DataLoader(dataset(), batch_size=16), ckpt_path=checkpoint)
    if checkpoint is None:
        trainer.save_checkpoint(tmp_path / "half.ckpt")
    return callback


def test_a_resumed_fit_keeps_the_checks_results_until_they_run_again(tmp_path):
    first = _fit_to(tmp_path, 12, None)  # every check at run 0 (step 3) and at the last, run 3 (step 12)
    seen: list[tuple[list[str], dict[str, int]]] = []
    resumed = _fit_to(tmp_path, 18, tmp_path / "half.ckpt", seen)  # run 4 (step 15): no check due; run 5: the last
    assert resumed.history[4]["global_step"] == 15
    # the results the checkpoint's fit made still stand: not "unresolved" as if no check had ever run
    assert resumed.history[4]["trust"] == first.history[3]["trust"] != "unresolved"
    assert resumed._fit is not None and resumed._fit.trust is not None
    assert seen[0] == ([], dict.fromkeys(EVERYTHING, 12))  # each result names the step it comes from
    resumed._fit.trust.restore_results({"sanity": {"step": 1, "no_such_field": 0.5}})  # another version's fields
    assert resumed._fit.trust._steps["sanity"] == 18  # left out: the result kept stands (the last run's)


def test_a_fit_resumed_on_other_states_makes_the_checks_from_its_first_run(tmp_path):
    # guards against: a new history (other held-out states) kept the checks' schedule of the one it replaced, whose
    # run indices are past its own: no check due for CHECK_EVERY runs and more, the earlier states' results dropped
    _fit_to(tmp_path, 12, None)  # runs 0-3: every check at run 0 and at run 3
    seen: list[tuple[list[str], dict[str, int]]] = []
    resumed = _fit_to(tmp_path, 18, tmp_path / "half.ckpt", seen, held_out_states(seed=7))
    assert [entry["global_step"] for entry in resumed.history] == [15, 18]
    assert [set(checks) for checks, _ in seen] == [EVERYTHING, EVERYTHING]  # as a new fit's first run and its last
    assert seen[0][1] == dict.fromkeys(EVERYTHING, 15) and resumed._budget.last_checks == dict.fromkeys(EVERYTHING, 1)


def test_a_resumed_fit_continues_the_checks_schedule_and_the_budget(tmp_path):
    first = _fit_to(tmp_path, 12, None)  # runs 0-3 at steps 3-12: every check at run 0 and at the last, run 3
    state = first.state_dict()["budget"]
    assert state["last_checks"] == dict.fromkeys(EVERYTHING, 3) and state["elapsed"] >= 0
    seen: list[tuple[list[str], dict[str, int]]] = []
    resumed = _fit_to(tmp_path, 30, tmp_path / "half.ckpt", seen)  # runs 4-9 at steps 15-30
    # the schedule goes on: each check again CHECK_EVERY runs after run 3 (run 8, step 27), not at the resumed fit's
    # first run as a new fit would make them; and at its last run (run 9, step 30)
    assert [set(checks) for checks, _ in seen] == [set(), set(), set(), set(), EVERYTHING, EVERYTHING]
    assert resumed._budget.last_checks == dict.fromkeys(EVERYTHING, 9)
    assert resumed._fit.trust._steps == dict.fromkeys(EVERYTHING, 30)
    assert resumed._budget.spent >= state["spent"] and len(resumed.history) == 10


class RainbowNoisyLinear(torch.nn.Module):
    """The common Rainbow-style layer (weight_mu, weight_sigma, weight_epsilon): noise only in training mode."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(in_features)
        self.weight_mu = torch.nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.weight_sigma = torch.nn.Parameter(torch.full((out_features, in_features), 0.5 * bound))
        self.register_buffer("weight_epsilon", torch.randn(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = self.weight_sigma * self.weight_epsilon if self.training else 0.0
        return torch.nn.functional.linear(x, self.weight_mu + noise)


@pytest.mark.parametrize("theirs", [True, False])
@pytest.mark.parametrize("ours", [False, True])
def test_noisy_layers_the_stability_check_cannot_draw_are_said_once(tmp_path, ours, theirs):
    # Another library's noisy layers have no seeded draw here: without a word the verdict passed, noise never checked
    model = TinyQNet(noisy=ours)
    if theirs:
        model.body.insert(0, RainbowNoisyLinear(4, 4))
    callback = IntegratedGradientsCallback(held_out_states(), views=ViewOptions(figure_every_n_runs=None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=2).fit(model, DataLoader(dataset(), batch_size=16))
    said = [str(w.message) for w in caught if "go unchecked" in str(w.message)]
    assert len(said) == theirs and all("noisy layers RainbowNoisyLinear go unchecked" in line for line in said)
    assert ("stability" in callback._fit.trust.names) is ours  # ours are still checked


@pytest.mark.parametrize("channels", [1, 2])
def test_one_channel_frames_that_make_one_group_are_checked_on_their_features(tmp_path, channels):
    # (1, 10, 10) frames: 100 features, more than max_logged_features, grouped by channel into a single unit, which
    # no check can rank: every check was left out and the trust status read "passed" on the accuracy alone
    shape = (channels, 10, 10)
    callback = IntegratedGradientsCallback(frames(16, shape, seed=1), views=ViewOptions(figure_every_n_runs=None))
    make_trainer(tmp_path, [callback], max_steps=2).fit(
        ConvQNet(shape), DataLoader(frame_dataset(32, shape), batch_size=8)
    )
    trust = callback._fit.trust
    assert trust.names == ["sanity", "deletion"]  # both made at the first run (no NoisyNet: no stability)
    assert (trust.groups is None) == (channels == 1)  # one group: the checks rank the 100 features
    made = trust.latest
    assert made.randomization is not None and made.deletion is not None  # judged: ranks over the units
    assert made.randomization.num_units == (100 if channels == 1 else 2)
