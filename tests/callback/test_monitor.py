"""callback/monitor.py: the trust checks in the callback's runs.

The callback's checks must leave training alone (bit-identical weights and optimizer state, the random generators
as they were), run where the schedule says (the callback enters the monitor only there), and log their tags and the
verdict (ig/trust/status at every run, the report text, RunSummary.trust_checks), which says what has not run yet.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.monitor import trust_scalar_tags
from lightning_ig.trust import Schedule, TrustChecks
from lightning_ig.views import ViewOptions
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer

EVERYTHING = frozenset({"sanity", "deletion", "stability"})


# ---------------------------------------------------------------------------------------------- the option


def test_callback_option_is_checked_and_documented():
    for value, error in ((0, ValueError), (2.0, TypeError), (True, TypeError), ("5", TypeError)):
        with pytest.raises(error, match="checks_every_n_runs"):
            IntegratedGradientsCallback(held_out_states(), checks_every_n_runs=value)
    assert "checks_every_n_runs" in IntegratedGradientsCallback.__doc__
    assert IntegratedGradientsCallback(held_out_states(), checks_every_n_runs=None).checks_every_n_runs is None


# ---------------------------------------------------------------------------------------------- in the callback


def _checks_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check at every run, no budget: the most the checks can touch."""
    every = TrustChecks(sanity_every_n_runs=1, deletion_every_n_runs=1, stability_every_n_runs=1, budget=None)
    monkeypatch.setattr(TrustChecks, "every", classmethod(lambda cls, runs: every))


def _checks_without_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default cadence without the budget: every check at the first run, the next ones five runs later."""
    monkeypatch.setattr(TrustChecks, "every", classmethod(lambda cls, runs: TrustChecks(budget=None)))


def _fit(tmp_path: Path, checks: int | str | None, *, logger=None) -> tuple[TinyQNet, pl.Trainer]:
    pl.seed_everything(123)
    model = TinyQNet()
    callbacks = []
    if checks != "no callback":
        callbacks.append(
            IntegratedGradientsCallback(
                held_out_states(),
                every_n_steps=3,
                checks_every_n_runs=checks,
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
    with_checks, trainer_with = _fit(tmp_path / "b", 1)
    assert torch.equal(generator_without, torch.get_rng_state())
    monitor = trainer_with.callbacks[0]._fit.trust
    assert monitor.schedule.last == dict.fromkeys(EVERYTHING, 3)  # every check at each of the 4 runs
    assert all(monitor.seconds[name] > 0 for name in ("replica", "reference", "sanity", "deletion", "stability"))
    for (name, a), (_, b) in zip(without.state_dict().items(), with_checks.state_dict().items()):
        assert torch.equal(a, b), f"{name} differs"  # weights, BatchNorm statistics, noise buffers
    state_a, state_b = trainer_without.optimizers[0].state_dict(), trainer_with.optimizers[0].state_dict()
    for key, state in state_a["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_b["state"][key][name])), name


def test_a_run_with_checks_under_inference_mode_leaves_the_generators(tmp_path, monkeypatch):
    _checks_every_run(monkeypatch)
    model, trainer = _fit(tmp_path, 1)
    callback = trainer.callbacks[0]
    before = (torch.get_rng_state(), {name: value.clone() for name, value in model.state_dict().items()})
    spent = sum(callback._fit.trust.seconds.values())
    with torch.inference_mode():
        callback._run(trainer, model, final=True)
    assert sum(callback._fit.trust.seconds.values()) > spent  # the checks ran
    assert torch.equal(before[0], torch.get_rng_state())
    assert all(torch.equal(value, model.state_dict()[name]) for name, value in before[1].items())


def test_the_checks_are_logged_with_the_verdict_in_the_summary_and_the_report_text(tmp_path, monkeypatch):
    _checks_without_budget(monkeypatch)
    logger = TensorBoardLogger(tmp_path, name="tb")
    _, trainer = _fit(tmp_path, 5, logger=logger)
    callback = trainer.callbacks[0]
    verdict = callback._last.trust_checks
    assert verdict is not None and verdict.status in {"passed", "failed", "unresolved"}
    assert verdict.randomization is not None and verdict.deletion is not None and verdict.stability.applicable
    assert not verdict.randomization.resolved  # 4 features: said so, never a plain pass
    assert verdict.status != "passed"
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert set(trust_scalar_tags("ig", noisy=True)) <= scalars
    # runs at steps 3, 6, 9, 12 (the train-end run is skipped: step 12 ran): every check at the first run (the
    # next turn would be run 5), the verdict at every run, resting on the latest results (carried between checks)
    assert [event.step for event in events.Scalars("ig/sanity/randomization_rank_correlation")] == [3]
    assert [event.step for event in events.Scalars("ig/trust/status")] == [3, 6, 9, 12]
    rho = events.Scalars("ig/sanity/randomization_rank_correlation")[-1].value
    assert math.isclose(rho, verdict.randomization.randomization_rank_correlation, rel_tol=1e-6)
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert f"**Trust: {verdict.status}**" in text and "sanity (step 3)" in text and "deletion AUC" in text


def test_within_the_budget_the_checks_run_where_the_schedule_says_and_the_runs_between_carry_the_verdict(tmp_path):
    """The default budget on a 12-run fit: the first run says which checks have not run yet and when they will; a
    check's tags appear at exactly the runs the schedule makes it; the other runs carry the last verdict."""
    pl.seed_everything(123)
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=1, engine=IGOptions(n_steps=8), views=ViewOptions(figure_every_n_runs=None)
    )
    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = make_trainer(tmp_path, [callback], max_steps=12, logger=logger)
    verdicts, carried = [], []  # each run's verdict, and what the monitor had made for it to carry
    finish = IntegratedGradientsCallback._finish

    def recording(self, pending):
        trust = self._fit.trust if self._fit is not None else None
        before = trust.carried if trust is not None else {}
        finish(self, pending)
        verdicts.append(self._last.trust_checks)
        carried.append(before.get(self._last.completeness.accuracy.within, (None, None))[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(IntegratedGradientsCallback, "_finish", recording)
            trainer.fit(TinyQNet(), DataLoader(dataset(), batch_size=16, shuffle=True))
    monitor = callback._fit.trust
    replay = Schedule(TrustChecks.every(5), monitor.costs)  # the same decisions, from the costs alone
    planned = replay.plan(-1)
    made: dict[int, tuple[str, ...]] = {}
    for run in range(12):
        made[run] = replay.decide(run)
        replay.record(run, made[run])
    assert replay.spent <= 0.2 * 12 and replay.last == monitor.schedule.last
    first = verdicts[0]
    assert first.status == "unresolved" and first.deletion is None and first.randomization is None
    for name in ("sanity", "deletion", "stability"):  # the first run says when each will run
        assert any(
            note.startswith(f"{name}: not run yet") and f"at run {planned[name]}" in note for note in first.notes
        )
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: [event.step for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert logged["ig/trust/status"] == list(range(1, 13))  # at every run (run r at step r + 1)
    deletions = [run + 1 for run, names in made.items() if "deletion" in names]
    assert deletions and logged["ig/faithfulness/deletion_auc"] == deletions
    assert "ig/sanity/randomization_rank_correlation" not in logged or planned["sanity"] < 12
    assert carried[0] is None  # the first run makes its verdict
    for run in range(1, 12):  # a run between checks carries the verdict made at the last, for its own accuracy
        assert (verdicts[run] is carried[run]) == (not made[run]), run
    within = {key: verdict.status for key, (verdict, _) in monitor.carried.items()}
    assert within[False] == within[None] == "failed"  # this run's accuracy failing fails the carried verdict
    assert monitor.carried[False][1] == {"ig/trust/status": -1.0}


def test_no_checks_no_trust_tags(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb")
    _, trainer = _fit(tmp_path, None, logger=logger)
    assert trainer.callbacks[0]._last.trust_checks is None and trainer.callbacks[0]._fit.trust is None
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    assert not any(tag.startswith(("ig/sanity", "ig/trust", "ig/faith")) for tag in events.Tags()["scalars"])
