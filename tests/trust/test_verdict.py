"""trust/verdict.py: one verdict from the checks and the run's accuracy, passed, failed or unresolved, and why."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from lightning_ig.models import DuelingQNetwork
from lightning_ig.run.statistics import accuracy_verdict
from lightning_ig.trust import trust_summary
from lightning_ig.trust.faithfulness import deletion_check
from lightning_ig.trust.sanity import randomization_check, randomization_reference
from lightning_ig.trust.stability import stability_check
from lightning_ig.views.text import trust_line
from tests.support.trust import FEATURES, SETTINGS, attribute


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


def test_a_check_not_run_yet_is_a_note_and_the_text_is_data(trained):
    model, states = trained
    units = attribute(model, states)
    good = deletion_check(model, states, None, units, settings=SETTINGS)
    accurate = accuracy_verdict(0.004, 0.001, 0.01)
    waiting = "sanity: not run yet; it costs 3.2 IG runs and runs at run 22 within the 20% budget"
    verdict = trust_summary(accuracy=accurate, deletion=good, pending=[waiting], upcoming="next check: deletion at 7")
    assert (
        verdict.status == "unresolved"
        and verdict.headline() == f"unresolved (2 figures judged, none failed): {waiting}"
    )
    assert verdict.lines()[-2:] == (f"- note: {waiting}", "- next check: deletion at 7")
    # the text was written when the verdict was made: reading it calls builtins only, no code of verdict.py
    assert isinstance(verdict.lines, functools.partial) and verdict.lines.func is tuple
    assert isinstance(verdict.headline, functools.partial) and verdict.headline.func is str
    assert trust_summary(accuracy=accurate, deletion=good).status == "passed"


def test_an_unresolved_sanity_check_is_a_note_and_the_other_checks_decide(untrained):
    model, states = untrained
    groups = torch.arange(FEATURES) // (FEATURES // 4)  # 4 units: the sanity check cannot resolve
    units = attribute(model, states).view(len(states), 4, -1).sum(dim=2)
    sanity = randomization_check(units, randomization_reference(model, states, settings=SETTINGS, groups=groups))
    assert not sanity.resolved
    verdict = trust_summary(randomization=sanity)
    if sanity.passed:  # it ran and could not decide: said, and the status is the other figures'
        # alone it judges nothing (it read "passed (1 figure judged)")
        assert verdict.status == "unresolved" and sanity.note in verdict.headline() and verdict.notes == (sanity.note,)
        accurate = accuracy_verdict(0.001, 0.001, 0.01)
        assert trust_summary(accuracy=accurate, randomization=sanity).headline().startswith("passed (1 figure judged")
        pending = trust_summary(accuracy=accurate, randomization=sanity, pending=("deletion: at the next run",))
        assert pending.status == "unresolved"
    else:
        assert verdict.status == "failed"


def test_one_string_of_errors_or_pending_is_refused_not_split_into_characters():
    # guards against: trust_summary(errors="sanity: could not run") giving 22 one-character reasons
    for given in ({"errors": "sanity: could not run"}, {"pending": "deletion: at the next run"}):
        with pytest.raises(TypeError, match="not one string: wrap it as"):
            trust_summary(**given)


def test_a_sanity_check_that_could_not_decide_judges_nothing_alone():
    # guards against: "passed (1 figure judged)" from an unresolved sanity check alone (4 units, CartPole's size)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    states = torch.randn(16, 4)
    units = attribute(model, states)
    sanity = randomization_check(units, randomization_reference(model, states, settings=SETTINGS))
    assert not sanity.resolved and sanity.passed and sanity.note is not None
    assert trust_summary(randomization=sanity).status == "unresolved"
    judged = trust_summary(accuracy=accuracy_verdict(0.001, 0.001, 0.01), randomization=sanity)
    assert judged.status == "passed" and judged.checks == 1 and judged.notes == (sanity.note,)


def test_a_failed_check_is_its_figure_on_the_card_and_no_note_says_it_cannot_tell(trained):
    # guards against: the card cutting "sanity: the rank correla…" mid-word, and a failed sanity check on 4 units
    # also noted as "it cannot tell a trained model from an untrained one" (what a pass cannot say)
    model, states = trained
    units = attribute(model, states)
    groups = torch.arange(FEATURES) // (FEATURES // 4)  # 4 units: unresolved
    four = units.view(len(states), 4, -1).sum(dim=2)
    sanity = randomization_check(four, randomization_reference(model, states, settings=SETTINGS, groups=groups))
    assert not sanity.resolved and sanity.note is not None
    failed = dataclasses.replace(sanity, passed=False, reason="sanity: the rank correlation ... hardly depends")
    verdict = trust_summary(randomization=failed)
    assert verdict.status == "failed" and verdict.notes == () and not any("cannot tell" in x for x in verdict.lines())
    rho, bar = failed.randomization_rank_correlation, failed.threshold
    assert f"bar {bar:.3f} over 4 units (a ceiling: too few to resolve) (failed)" in verdict.lines()[-1]
    assert trust_line(verdict) == f"sanity {rho:.2f} ≥ {bar:.2f}"

    bad = deletion_check(model, states, None, -units, settings=SETTINGS)
    assert not bad.passed
    line = trust_line(trust_summary(accuracy=accuracy_verdict(0.001, 0.001, 0.01), deletion=bad))
    assert line == f"faithfulness gap {bad.gap:.2f} < {bad.needed:.2f}"
    off = dataclasses.replace(sanity, randomization_rank_correlation=float("nan"), passed=False, reason="sanity: x, y")
    assert trust_line(trust_summary(randomization=off)) == "sanity: x"  # no figure: the sentence, short
    # a pass that could not decide judged nothing: the card's line does not list it among the checks that passed
    good = deletion_check(model, states, None, units, settings=SETTINGS)
    passing = trust_summary(accuracy=accuracy_verdict(0.001, 0.001, 0.01), randomization=sanity, deletion=good)
    assert (
        passing.status == "passed" and trust_line(passing) == "accuracy, faithfulness; sanity unresolved"
    )  # passed first
