"""callback/trust/monitor.py and verdict.py: the cadence within the budget, the verdict's words, the callback's run.

The callback's checks must leave training alone (bit-identical weights and optimizer state, the random generators
as they were) and log their tags and the verdict (ig/trust/status, the report text, RunSummary.trust_checks).
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

from lightning_ig.attribution.statistics import accuracy_verdict
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.trust import TrustChecks, trust_summary
from lightning_ig.callback.trust.faithfulness import deletion_check
from lightning_ig.callback.trust.monitor import trust_scalar_tags
from lightning_ig.callback.trust.sanity import randomization_check, randomization_reference
from lightning_ig.callback.trust.stability import stability_check
from lightning_ig.models import DuelingQNetwork
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer
from tests.support.trust import FEATURES, SETTINGS, attribute

EVERYTHING = frozenset({"sanity", "deletion", "stability"})


# ---------------------------------------------------------------------------------------------- the cadence


def test_cadence_runs_everything_first_and_last_then_by_period_within_the_budget():
    cadence = TrustChecks.every(5)
    free = {"check_seconds": 0.0, "ig_seconds": 1.0}
    assert cadence.due(0, first=True, **free) == EVERYTHING
    assert cadence.due(7, first=False, final=True, **free) == EVERYTHING
    assert cadence.due(5, first=False, **free) == {"sanity", "deletion"}
    assert cadence.due(20, first=False, **free) == EVERYTHING and cadence.due(7, first=False, **free) == set()
    assert cadence.due(5, first=False, check_seconds=3.0, ig_seconds=10.0) == set()  # 30 % used: over 20 %
    assert cadence.due(7, first=False, final=True, check_seconds=3.0, ig_seconds=10.0) == set()
    unlimited = TrustChecks(budget=None)
    assert unlimited.due(5, first=False, check_seconds=3.0, ig_seconds=10.0) == {"sanity", "deletion"}
    assert [cadence.quarter(b) for b in (1, 8, 64)] == [1, 2, 16]


def test_cadence_keeps_a_long_fit_within_its_budget_plus_the_first_run():
    """Simulated fit: expensive checks (the reference alone 3 IG calls); their share stays <= budget + one run."""
    cadence, runs, ig = TrustChecks.every(1), 400, 1.0
    cost = {"sanity": 3.5, "deletion": 1.0, "stability": 4.0}  # the sanity's first run makes the reference
    spent = 0.0
    for run in range(runs):
        due = cadence.due(run, first=run == 0, check_seconds=spent, ig_seconds=ig * (run + 1), final=run == runs - 1)
        spent += sum(cost[name] for name in due)
    assert spent / (runs * ig) <= cadence.budget + sum(cost.values()) / runs


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"sanity_every_n_runs": 0}, ValueError, "sanity_every_n_runs"),
        ({"deletion_every_n_runs": 2.5}, TypeError, "deletion_every_n_runs"),
        ({"copies": 1}, ValueError, "copies"),
        ({"draws": True}, TypeError, "draws"),
        ({"budget": -0.1}, ValueError, "budget"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_cadence_refuses_bad_values(arguments, error, match):
    with pytest.raises(error, match=match):
        TrustChecks(**arguments)


def test_callback_option_is_checked_and_documented():
    for value, error in ((0, ValueError), (2.0, TypeError), (True, TypeError), ("5", TypeError)):
        with pytest.raises(error, match="checks_every_n_runs"):
            IntegratedGradientsCallback(held_out_states(), checks_every_n_runs=value)
    assert "checks_every_n_runs" in IntegratedGradientsCallback.__doc__
    assert IntegratedGradientsCallback(held_out_states(), checks_every_n_runs=None).checks_every_n_runs is None


# ---------------------------------------------------------------------------------------------- the verdict


def test_verdict_says_passed_failed_or_unresolved_and_why(trained):
    model, states = trained
    units = attribute(model, states)
    sanity = randomization_check(units, randomization_reference(model, states, settings=SETTINGS))
    good = deletion_check(model, states, None, units, settings=SETTINGS)
    bad = deletion_check(model, states, None, -units, settings=SETTINGS)
    off = stability_check(DuelingQNetwork(FEATURES, 2, noisy=False), states, None, units, settings=SETTINGS)
    accurate = accuracy_verdict(0.004, 0.001, 0.01)  # both figures within sqrt(2) x 0.01
    wrong = accuracy_verdict(0.03, 0.001, 0.01)  # the estimated attribution error is not

    verdict = trust_summary(accuracy=accurate, randomization=sanity, deletion=good, stability=off)
    assert verdict.status == "passed" and verdict.passed and verdict.reasons == ()
    assert verdict.checks == 3  # stability does not apply: not judged
    assert verdict.scalars() == {"trust/status": 1.0}
    assert verdict.lines()[0] == "**Trust: passed**." and verdict.headline().startswith("passed (3 figures")
    assert "- accuracy: the worst estimated attribution error 4.00e-03 <= sqrt(2) x tol = 1.41e-02 (passed)" in (
        verdict.lines()
    )

    verdict = trust_summary(accuracy=wrong, deletion=bad)
    assert verdict.status == "failed" and verdict.scalars() == {"trust/status": -1.0}
    assert len(verdict.reasons) == 2 and "3.00e-02" in verdict.reasons[0] and verdict.reasons[1] == bad.reason
    assert all(f"- {reason}" in verdict.lines() for reason in verdict.reasons)

    nothing = trust_summary()
    assert nothing.status == "unresolved" and not nothing.passed and nothing.scalars() == {"trust/status": 0.0}
    assert "nothing was judged" in nothing.headline()
    with pytest.raises(TypeError, match="deletion"):
        trust_summary(deletion=sanity)


def test_an_unresolved_sanity_check_makes_the_verdict_unresolved_not_passed(untrained):
    model, states = untrained
    groups = torch.arange(FEATURES) // (FEATURES // 4)  # 4 units: the sanity check cannot resolve
    units = attribute(model, states).view(len(states), 4, -1).sum(dim=2)
    sanity = randomization_check(units, randomization_reference(model, states, settings=SETTINGS, groups=groups))
    assert not sanity.resolved
    verdict = trust_summary(randomization=sanity)
    if sanity.passed:
        assert verdict.status == "unresolved" and "unresolved" in verdict.headline() and verdict.notes
    else:
        assert verdict.status == "failed"


# ---------------------------------------------------------------------------------------------- in the callback


def _checks_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check at every run, no budget: the most the checks can touch."""
    every = TrustChecks(sanity_every_n_runs=1, deletion_every_n_runs=1, stability_every_n_runs=1, budget=None)
    monkeypatch.setattr(TrustChecks, "every", classmethod(lambda cls, runs: every))


def _fit(tmp_path: Path, checks: int | str | None, *, logger=None) -> tuple[TinyQNet, pl.Trainer]:
    pl.seed_everything(123)
    model = TinyQNet()
    callbacks = []
    if checks != "no callback":
        callbacks.append(
            IntegratedGradientsCallback(
                held_out_states(), every_n_steps=3, n_steps=8, figure_every_n_runs=None, checks_every_n_runs=checks
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
    assert monitor.runs == 4 and all(monitor.seconds[name] > 0 for name in ("reference", "sanity", "deletion"))
    assert monitor.seconds["stability"] > 0  # TinyQNet's head is a NoisyLinear
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
    spent = callback._fit.trust.spent()
    with torch.inference_mode():
        callback._run(trainer, model, final=True)
    assert callback._fit.trust.spent() > spent  # the checks ran
    assert torch.equal(before[0], torch.get_rng_state())
    assert all(torch.equal(value, model.state_dict()[name]) for name, value in before[1].items())


def test_the_checks_are_logged_with_the_verdict_in_the_summary_and_the_report_text(tmp_path):
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
    # next turn would be run 5), the verdict at every run, resting on the latest results
    assert [event.step for event in events.Scalars("ig/sanity/randomization_rank_correlation")] == [3]
    assert [event.step for event in events.Scalars("ig/trust/status")] == [3, 6, 9, 12]
    rho = events.Scalars("ig/sanity/randomization_rank_correlation")[-1].value
    assert math.isclose(rho, verdict.randomization.randomization_rank_correlation, rel_tol=1e-6)
    text = events.Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert f"**Trust: {verdict.status}**" in text and "sanity (step 3)" in text and "deletion AUC" in text


def test_no_checks_no_trust_tags(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb")
    _, trainer = _fit(tmp_path, None, logger=logger)
    assert trainer.callbacks[0]._last.trust_checks is None and trainer.callbacks[0]._fit.trust is None
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0})
    events.Reload()
    assert not any(tag.startswith(("ig/sanity", "ig/trust", "ig/faith")) for tag in events.Tags()["scalars"])
