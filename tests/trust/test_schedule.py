"""trust/schedule.py: the cost model, and a schedule that keeps the checks within the budget at every run.

The schedule is simulated here as the monitor drives it: decide at a run, book what ran, jump to the next run it
names; every run in between is asked too, to show that nothing would have run there.
"""

from __future__ import annotations

import itertools
import random

import pytest

from lightning_ig.trust.schedule import (
    EAGER,
    GRADIENT_ROW,
    PIECES,
    REPLAYED,
    CheckCosts,
    Schedule,
    TrustChecks,
    deletion_rows,
)

EVERYTHING = ("sanity", "deletion", "stability")


def _costs(deletion: float, sanity: float, stability: float, copy: float, capture: float, reference: float):
    return CheckCosts(deletion, sanity, stability, copy=copy, plan=0.0, capture=capture, reference=reference)


def _fit(schedule: Schedule, runs: int) -> list[tuple[int, tuple[str, ...]]]:
    """The checks made over ``runs`` runs (the last one final), asking every run; each run's booking checked."""
    budget = schedule.options.budget
    events, expected = [], schedule.next_run(-1) if schedule.decide(0) == () else 0
    for run in range(runs):
        final = run == runs - 1
        made = schedule.decide(run, final=final)
        if not final:
            assert bool(made) == (run == expected), (run, made, expected)  # next_run named exactly this run
        schedule.record(run, made)
        if made:
            events.append((run, made))
            expected = schedule.next_run(run)
        if budget is not None:
            assert schedule.spent <= budget * (run + 1) * (1 + 1e-12), (run, schedule.spent)  # at every run
    return events


def test_costs_are_rows_over_an_ig_runs_rows_plus_the_fixed_part():
    options = TrustChecks.every(5)
    eager = CheckCosts.estimate(options, num_states=64, num_units=4, n_steps=64, replays=False)
    run_rows = GRADIENT_ROW * 64 + 2
    assert deletion_rows(4) == 2 + 3 * 3 and deletion_rows(400) == 2 + 3 * 15 and deletion_rows(1) == 5
    assert eager.deletion == pytest.approx(EAGER.host + deletion_rows(4) / run_rows)
    one_pass = 16 / 64 + EAGER.per_pass * (1 - 16 / 64)  # a quarter of the states, and what does not shrink
    assert eager.reference == pytest.approx(EAGER.host + 4 * one_pass)
    assert eager.stability == pytest.approx(EAGER.host + 2 * one_pass)
    assert (eager.copy, eager.capture, eager.sanity) == (EAGER.copy, EAGER.capture, EAGER.host)
    replayed = CheckCosts.estimate(options, num_states=64, num_units=4, n_steps=64, replays=True)
    assert replayed.capture == REPLAYED.capture and replayed.deletion > eager.deletion
    auto = CheckCosts.estimate(options, num_states=64, num_units=4, n_steps="auto", replays=False)
    assert auto.deletion == pytest.approx(EAGER.host + deletion_rows(4) / (GRADIENT_ROW * 16 + 2))
    assert eager.of("sanity") == pytest.approx(eager.sanity + eager.copy + eager.capture + eager.reference)
    assert eager.of("sanity", PIECES["stability"]) == pytest.approx(eager.sanity + eager.reference)
    assert eager.of("deletion", {"copy", "plan"}) == eager.deletion
    assert eager.of("deletion") == pytest.approx(eager.deletion + eager.copy + EAGER.host)


@pytest.mark.parametrize("seed", range(12))
def test_the_checks_stay_within_the_budget_at_every_run_and_none_starves(seed):
    draw = random.Random(seed)
    options = TrustChecks(
        sanity_every_n_runs=draw.choice([1, 2, 5]),
        deletion_every_n_runs=draw.choice([1, 3, 5]),
        stability_every_n_runs=draw.choice([1, 7, 20]),
        budget=draw.choice([0.05, 0.2, 0.5]),
    )
    costs = _costs(*(draw.uniform(0.01, 3.0) for _ in range(3)), draw.uniform(0, 2), draw.uniform(0, 15), 3.0)
    events = _fit(Schedule(options, costs), 400)
    first = {name: min(run for run, made in events if name in made) for name in EVERYTHING}
    for name, run in first.items():  # half of what accrues is held for a waiting check: it waits at most this
        assert run <= 2 * sum(costs.of(other) for other in EVERYTHING) / options.budget + 1, (name, run)


def test_at_the_callbacks_sizes_the_cheap_check_runs_first_and_the_reference_when_affordable():
    options = TrustChecks.every(5)
    costs = CheckCosts.estimate(options, num_states=64, num_units=4, n_steps=64, replays=False)
    schedule = Schedule(options, costs)
    planned = schedule.plan(-1)
    events = _fit(schedule, 200)
    assert events[0][1] == ("deletion",) and events[0][0] <= costs.of("deletion") / 0.2  # the cheap check first
    assert {name: min(run for run, made in events if name in made) for name in EVERYTHING} == planned
    deletions = [run for run, made in events if "deletion" in made and run < 199]  # the final run aside
    assert all(b - a == 5 for a, b in itertools.pairwise(deletions))  # at its cadence while the reference waits
    assert schedule.spent <= 0.2 * 200


def test_a_check_waiting_for_an_expensive_piece_is_not_starved_by_a_cheap_one():
    options = TrustChecks(sanity_every_n_runs=1, deletion_every_n_runs=1, stability_every_n_runs=None, budget=0.2)
    costs = _costs(deletion=0.2, sanity=0.01, stability=1.0, copy=0.0, capture=0.0, reference=5.0)
    events = _fit(Schedule(options, costs), 200)
    sanity = min(run for run, made in events if "sanity" in made)
    assert sanity <= 2 * 5.01 / 0.2  # deletion alone would take the whole budget at every run
    deletions = [run for run, made in events if "deletion" in made and run < sanity]
    assert len(deletions) >= sanity // 3  # ... and still had half of it meanwhile


def test_the_final_run_makes_every_check_the_budget_covers():
    costs = _costs(deletion=0.1, sanity=0.1, stability=0.1, copy=0.0, capture=0.0, reference=0.1)
    schedule = Schedule(TrustChecks(budget=1.0), costs)
    schedule.record(0, schedule.decide(0))
    assert schedule.last == dict.fromkeys(EVERYTHING, 0)
    assert schedule.decide(3) == () and set(schedule.decide(3, final=True)) == set(EVERYTHING)
    poor = Schedule(TrustChecks(budget=0.01), costs)
    assert poor.decide(3, final=True) == ()  # the budget still decides


def test_without_a_budget_every_check_runs_at_its_cadence():
    options = TrustChecks(budget=None)
    costs = _costs(deletion=9.0, sanity=9.0, stability=9.0, copy=9.0, capture=9.0, reference=9.0)
    schedule = Schedule(options, costs)
    assert schedule.decide(0) == ("deletion", "stability", "sanity")  # oldest first, then the cheapest
    schedule.record(0, schedule.decide(0))
    assert schedule.next_run(0) == 5 and schedule.decide(5) == ("deletion", "sanity")
    assert schedule.plan(0) == {}


def test_a_dropped_check_is_never_scheduled_and_an_empty_schedule_names_no_run():
    options = TrustChecks.every(5)
    costs = _costs(deletion=0.1, sanity=0.1, stability=0.1, copy=0.0, capture=0.0, reference=0.1)
    schedule = Schedule(options, costs, checks=("deletion",))
    assert schedule.decide(0) == ("deletion",)
    schedule.drop("deletion")
    assert schedule.decide(0) == () and schedule.next_run(0) is None and schedule.plan(0) == {}


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
def test_options_refuse_bad_values(arguments, error, match):
    with pytest.raises(error, match=match):
        TrustChecks(**arguments)


def test_options_at_the_callbacks_cadence():
    every = TrustChecks.every(5)
    assert every.periods() == {"sanity": 5, "deletion": 5, "stability": 20}
    assert TrustChecks(stability_every_n_runs=None).periods().keys() == {"sanity", "deletion"}
    assert [every.quarter(b) for b in (1, 8, 64)] == [1, 2, 16]
