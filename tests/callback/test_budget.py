"""callback/budget.py: the callback's budget on a fake clock: kept within 1.5x, runs reduced before any is deferred,
a resumed fit continuing the same decisions; and a reduced run in the callback."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.budget import CHECK_EVERY, Budget, Plan
from lightning_ig.views import ViewOptions, text
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer

CHECKS = ("sanity", "deletion", "stability")


@dataclass
class FakeFit:
    """A fit on a fake clock: training steps of ``step`` seconds, a run every ``every`` steps costing ``fixed +
    per_state * states`` seconds of the training thread, each check ``check`` seconds (its first pass ``first``)."""

    step: float = 0.01
    every: int = 50
    num_states: int = 256
    fixed: float = 0.004
    per_state: float = 0.0004
    check: float = 0.002
    first: float = 0.05
    now: float = 0.0
    runs: int = 0
    skipped: int = 0
    plans: list[tuple[int, Plan | None]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def run(self, budget: Budget, steps: range, total: int, *, final_at: int | None = None) -> None:
        for step in steps:
            self.now += self.step  # the training step
            entered = self.now
            cadence = step % self.every == 0
            if budget.owed and not cadence and not budget.retry_due():  # skipped: the credit cannot cover a run yet
                self.skipped += 1
                sizes, need = budget.sizes(self.runs, budget.due(self.runs, CHECKS))  # what it saves up for
                assert budget.credit(step / total) < budget.run_cost(sizes[-1]) + need
            if cadence or budget.retry_due():
                plan = budget.plan(self.runs, CHECKS, progress=step / total, retry=not cadence)
                self.plans.append((step, plan))
                if plan is not None:
                    self.pay(budget, plan)
            budget.add(self.now - entered)  # the hook's time
        if final_at is not None:
            entered = self.now
            plan = budget.plan(self.runs, CHECKS, progress=1.0, final=True)
            self.plans.append((final_at, plan))
            assert plan is not None
            self.pay(budget, plan)
            budget.add(self.now - entered)

    def pay(self, budget: Budget, plan: Plan) -> None:
        cost = self.fixed + self.per_state * self.num_states / plan.windows
        self.now += cost
        budget.ran(plan.windows, cost)
        run, self.runs = self.runs, self.runs + 1
        for name in plan.checks:
            first = name not in budget.last_checks
            seconds = self.first if first else self.check
            self.now += seconds
            budget.checked(name, seconds, run, first=first)


def _fit(share: float | None, steps: int = 20_000, **sizes: float) -> tuple[Budget, FakeFit]:
    fake = FakeFit(**sizes)
    budget = Budget(share, clock=fake.clock)
    budget.start()
    fake.run(budget, range(1, steps + 1), steps, final_at=steps)
    return budget, fake


def test_a_fit_whose_runs_would_exceed_the_budget_keeps_within_one_and_a_half_times_it():
    unlimited, _ = _fit(None)
    assert unlimited.fraction() > 0.1  # every run in full: five times the budget and more
    for share in (0.02, 0.05):
        budget, fake = _fit(share)
        assert budget.fraction() <= 1.5 * share, (share, budget.fraction())
        made = [plan for _, plan in fake.plans if plan is not None]
        assert budget.reduced > 0 and budget.deferred > 0  # it had to do both here
        assert all(name in plan.checks for name in CHECKS for plan in made[:1])  # every check at the first run
        assert made[-1] is fake.plans[-1][1]  # the final run ran, on every state, with every check (the answer)
        assert made[-1].windows == 1 and made[-1].checks == tuple(CHECKS) and not made[-1].waiting
        retries = sum(1 for step, plan in fake.plans if step % fake.every and plan is None)
        assert fake.skipped > 10 * retries  # a deferred run is tried when it can be afforded, not at every batch end
        # guards against: window after window, the trust checks made at the first and the final run only (2 of 131
        # runs at 0.02): overdue by another CHECK_EVERY runs, the budget saves up for a full run that makes them
        checked = [i for i, plan in enumerate(made) if "deletion" in plan.checks]
        assert len(checked) > 4 and max(b - a for a, b in itertools.pairwise(checked[:-1])) <= 2 * CHECK_EVERY + 1


def test_runs_are_reduced_before_any_is_deferred():
    # a budget that a half or a quarter of the states fits: reduced runs, deferred only to save up for a full run
    # that makes the checks the reduced runs left overdue (below: every decision against what it saves up for)
    budget, fake = _fit(0.12)
    assert budget.reduced > 0 and budget.deferred < len(fake.plans) // 10
    # a tighter one: at every decision the largest share of the states the credit covers, deferred only where a
    # quarter did not fit
    fake = FakeFit()
    budget = Budget(0.02, clock=fake.clock)
    budget.start()
    decide = budget.plan
    seen = []

    def recording(run, checks, *, progress=None, final=False, can_window=True, retry=False):
        sizes, need = budget.sizes(run, budget.due(run, checks), can_window=can_window)
        credit = budget.credit(progress) - need  # what a window may take, less the overdue checks saved up for
        costs = {k: budget.run_cost(k) for k in sizes}
        plan = decide(run, checks, progress=progress, final=final, can_window=can_window, retry=retry)
        seen.append((credit, costs, plan))
        return plan

    budget.plan = recording
    fake.run(budget, range(1, 20_001), 20_000, final_at=20_000)
    for credit, costs, plan in seen[1:-1]:  # the first run pays the checks' first passes; the final
        if plan is None:
            assert costs[max(costs)] > credit
        else:
            assert costs[plan.windows] <= credit and (plan.windows == 1 or costs[plan.windows // 2] > credit)
    assert budget.reduced > 0 and budget.deferred > 0
    windows = [plan.window for _, plan in fake.plans if plan is not None and plan.windows == 4]
    assert set(windows) == {0, 1, 2, 3}  # the quarters rotate: every state is attributed over the runs
    said = [plan for _, plan in fake.plans if plan is not None and plan.deferred]
    assert said and all("deferred" in plan.note(0.02) for plan in said)  # never silently: the next run says so
    assert sum(plan.deferred for plan in said) == budget.deferred  # each cadence point deferred counted once


def test_checks_wait_for_full_runs_and_come_back_within_the_budget():
    _, fake = _fit(0.12)
    made = [plan for _, plan in fake.plans[:-1] if plan is not None]  # the final run makes every check it can
    assert all(not plan.checks for plan in made if plan.windows > 1)
    runs = [i for i, plan in enumerate(made) if "deletion" in plan.checks]
    assert runs[0] == 0 and len(runs) > 1 and min(b - a for a, b in itertools.pairwise(runs)) >= CHECK_EVERY


def test_a_resumed_budget_continues_the_same_decisions():
    steps = 10_000
    whole = FakeFit()
    budget = Budget(0.02, clock=whole.clock)
    budget.start()
    whole.run(budget, range(1, steps + 1), steps)
    halves = FakeFit()
    first = Budget(0.02, clock=halves.clock)
    first.start()
    halves.run(first, range(1, steps // 2 + 1), steps)
    state = first.state_dict()
    halves.now += 123.0  # the resumed process starts later: its wall time counts on from where the first stopped
    second = Budget(0.02, clock=halves.clock)
    second.load_state_dict(state)
    second.start()
    halves.run(second, range(steps // 2 + 1, steps + 1), steps)
    assert halves.plans == whole.plans
    assert second.last_checks == budget.last_checks and second.fraction() == pytest.approx(budget.fraction())


def test_a_run_owed_by_a_budgeted_fit_is_never_retried_without_a_budget():
    # guards against: a checkpoint of a one-process fit that owed a run, resumed under DDP (no budget): each rank's
    # own clock picked its own batch end for the retry's collective, and the fit hung
    fake = FakeFit()
    first = Budget(0.02, clock=fake.clock)
    first.start()
    fake.run(first, range(1, 20_001), 20_000)
    assert first.owed > 0
    state = first.state_dict()
    resumed = Budget(None, clock=fake.clock)
    resumed.load_state_dict(state)
    resumed.start()
    fake.now += 1e6  # long past any retry time
    assert resumed.owed > 0 and not resumed.retry_due()


def test_without_a_budget_every_run_is_full_and_each_check_comes_every_few_runs():
    _, fake = _fit(None, steps=2_000)
    made = [plan for _, plan in fake.plans]
    assert all(plan is not None and plan.windows == 1 for plan in made)
    assert [i for i, plan in enumerate(made) if plan.checks] == [*range(0, len(made) - 1, CHECK_EVERY), len(made) - 1]


def test_the_other_threads_cpu_counts_beyond_their_rate_before_the_first_run():
    now, cpu = [0.0], [0.0]
    budget = Budget(0.02, clock=lambda: now[0], background=lambda: cpu[0])
    budget.start()
    now[0], cpu[0] = 10.0, 1.0  # before the first run: 0.1 s of other threads' CPU a second (training's own)
    assert budget.plan(0, ()) is not None and budget.extra() == 0.0
    now[0], cpu[0] = 20.0, 2.5  # 1.5 s in the next 10 s: 0.5 s beyond that rate is the callback's
    assert budget.extra() == pytest.approx(0.5) and budget.fraction() == pytest.approx(0.5 / 20)
    now[0], cpu[0] = 30.0, 3.0  # less than the rate: nothing more, never negative
    assert budget.extra() == pytest.approx(0.0)


def test_a_deferred_run_is_retried_no_later_than_the_credit_could_cover_it():
    now, cpu = [0.0], [0.0]
    budget = Budget(0.02, clock=lambda: now[0], background=lambda: cpu[0])
    budget.start()
    now[0], cpu[0] = 10.0, 1.0  # the other threads' rate before the first run: 0.1 s a second
    assert budget.plan(0, ()) is not None
    budget.ran(1, 0.05)
    budget.ran(4, 0.02)
    now[0], cpu[0] = 20.0, 3.0  # 1 s of their CPU beyond that rate: the credit is short of any run
    assert budget.plan(1, ()) is None and budget.owed == 1
    assert not budget.retry_due()
    # the other threads go quiet: their extra drains at their rate and the credit grows faster than the share
    affordable = None
    for tenth in range(1, 2_000):
        now[0] = 20.0 + tenth / 10
        if affordable is None and budget.credit(None) >= budget.run_cost(4):
            affordable = now[0]
        if budget.retry_due():
            break
    assert affordable is not None and now[0] <= affordable  # never after the moment it could be afforded
    assert budget.plan(1, (), retry=True) is not None and budget.owed == 0


def test_a_worker_beside_training_counts_what_the_steps_beside_it_lose():
    now = [0.0]
    budget = Budget(0.02, clock=lambda: now[0], background=None)
    budget.start()
    budget.quiet_from(0, 0.0)
    budget.add(0.5)  # a check run's hook between: not training's pace
    now[0] = 100 * 0.002 + 0.5  # 100 quiet steps of 2 ms
    budget.beside_from(100, now[0])
    now[0] += 10 * 0.003  # 10 steps beside the run, 3 ms each
    lost = budget.landed(110, now[0])
    assert lost == pytest.approx(10 * 0.001)  # what the steps took beyond 2 ms each
    assert budget.used() == pytest.approx(0.5 + lost)
    now[0] += 50 * 0.002
    budget.beside_from(160, now[0])
    now[0] += 5 * 0.0019  # faster than the pace: nothing lost, never a credit
    assert budget.landed(165, now[0]) == 0.0


def test_a_run_beside_training_before_the_pace_is_known_is_booked_once_it_is():
    now = [0.0]
    budget = Budget(0.02, clock=lambda: now[0], background=None)
    budget.start()
    budget.beside_from(10, 1.0)  # no quiet steps measured yet
    assert budget.landed(20, 1.05) == 0.0 and budget.used() == 0.0
    budget.settle(120, 1.05 + 100 * 0.004)  # training's pace: 4 ms a step
    assert budget.used() == pytest.approx(0.05 - 10 * 0.004)


def test_a_run_the_budget_reduces_attributes_its_window_and_says_so(tmp_path):
    decide = Budget.plan

    def quarters(self, run, checks, **kwargs):  # every run after the first on a quarter of the states
        plan = decide(self, run, checks, **kwargs)
        return plan if run == 0 or plan is None else Plan(windows=4, window=run % 4, waiting=plan.checks)

    pl.seed_everything(0)
    states = held_out_states(32)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, engine=IGOptions(n_steps=8), views=ViewOptions(figure_every_n_runs=None)
    )
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch.setattr(Budget, "plan", quarters)
        make_trainer(tmp_path, [callback], max_steps=6).fit(TinyQNet(), DataLoader(dataset(), batch_size=16))
    summary = callback._last
    assert summary.num_states == 8 and summary.budget["windows"] == 4 and summary.budget["window"] == 2
    assert "window 3 of 4" in summary.budget["note"] and summary.trust_checks.upcoming == summary.budget["note"]
    assert len(callback.history) == 3 and all("overhead" in entry for entry in callback.history)


class _StopsAtStep4(TinyQNet):
    """Ends the fit at step 4 as early stopping or ``max_time`` would: unannounced, the bounds farther."""

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.trainer.should_stop = self.trainer.global_step >= 4


def test_a_fit_ended_unannounced_at_a_shortened_run_ends_on_a_full_one(tmp_path):
    # guards against: the fit's closing answer a quarter of the states with the checks left waiting (the run at the
    # last step was not known to be the last, and the end of training skipped its step)
    decide = Budget.plan

    def quarters(self, run, checks, **kwargs):  # every run but the first and the final on a quarter of the states
        plan = decide(self, run, checks, **kwargs)
        short = run == 0 or plan is None or kwargs["final"]
        return plan if short else Plan(windows=4, window=run % 4, waiting=plan.checks)

    pl.seed_everything(0)
    callback = IntegratedGradientsCallback(
        held_out_states(32), every_n_steps=2, engine=IGOptions(n_steps=8), views=ViewOptions(figure_every_n_runs=None)
    )
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch.setattr(Budget, "plan", quarters)
        trainer = make_trainer(tmp_path, [callback], max_steps=20)
        trainer.fit(_StopsAtStep4(), DataLoader(dataset(), batch_size=16))
    assert trainer.global_step == 4 and [entry["global_step"] for entry in callback.history] == [2, 4]
    summary = callback._last
    assert summary.num_states == 32 and summary.budget["windows"] == 1 and not summary.budget["waiting"]


class _NaNAtOneState(TinyQNet):
    """NaN for the held-out state whose first feature is 99, outside training."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if self.training else out.masked_fill(x[:, :1] == 99.0, float("nan"))


def test_a_window_names_its_rows_by_their_held_out_states(tmp_path):
    # guards against: "NaN/Inf in 1 of 8 held-out states (first: state 3)" for held-out state 13 of 32
    decide = Budget.plan

    def window_one(self, run, checks, **kwargs):  # every run after the first on the second quarter of the states
        plan = decide(self, run, checks, **kwargs)
        return plan if run == 0 or plan is None else Plan(windows=4, window=1, waiting=plan.checks)

    pl.seed_everything(0)
    states = held_out_states(32)
    states[13, 0] = 99.0  # row 3 of window 1 (states 1, 5, 9, 13, ...)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, engine=IGOptions(n_steps=8), views=ViewOptions(figure_every_n_runs=None)
    )
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(Budget, "plan", window_one)
        make_trainer(tmp_path, [callback], max_steps=4).fit(_NaNAtOneState(), DataLoader(dataset(), batch_size=16))
    summary = callback._last
    assert summary.budget["state_indices"] == list(range(1, 32, 4))
    said = [str(warning.message) for warning in caught if "NaN/Inf" in str(warning.message)]
    assert len(said) == 1 and "in 1 of 32 held-out states (first: state 13)" in said[0], said  # the first run
    assert (
        "in 1 of 8 held-out states of the run's budget window (first: state 13)" in text.troubles(summary)["non-finite"]
    )


def test_a_resume_without_a_budget_says_what_the_earlier_fit_deferred():
    # guards against: TypeError formatting overhead=None, at a resumed fit's first run (or under DDP, share None)
    budget, _ = _fit(0.02, steps=2_000)
    owed = Budget(0.02)
    owed.load_state_dict({**budget.state_dict(), "owed": 3})
    resumed = Budget(None)
    resumed.load_state_dict(owed.state_dict())
    resumed.start()
    plan = resumed.plan(99, CHECKS, progress=0.5)
    assert plan is not None and plan.deferred == 3 and plan.windows == 1
    assert plan.note(resumed.share) == "budget: this run deferred 3 earlier runs to later steps"
