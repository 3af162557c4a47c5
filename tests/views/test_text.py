"""How a run reads (views.text): numbers in plain decimals where they read well, never 0.00% for a tiny share."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lightning_ig.attribution.targets import Target
from lightning_ig.run.summary import RunSettings, summarize
from lightning_ig.views.tags import display_labels
from lightning_ig.views.text import (
    accuracy_line,
    format_percent,
    format_signed,
    format_value,
    report_markdown,
    troubles,
)
from tests.support.each import FEATURES, NAMES
from tests.support.each import each_run as make_each_run
from tests.support.summaries import make_summary


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0904, "1.09"),
        (1.0, "1"),
        (0.012345, "0.0123"),
        (-0.5, "-0.5"),
        (0.001, "0.001"),
        (12345.6, "12300"),
        (99999.7, "1e+05"),
        (123456.0, "1.23e+05"),
        (3.8e-05, "3.8e-05"),
        (0.0, "0"),
        (-2.5e-07, "-2.5e-07"),
    ],
)
def test_values_are_plain_decimals_between_a_thousandth_and_a_hundred_thousand(value, text):
    assert format_value(value) == text


def test_values_never_carry_an_exponent_of_zero():
    for value in (1.09, 2.0, 9.99, 0.45, 30.7):
        assert "e+00" not in format_value(value) and "e" not in format_value(value)


def test_non_finite_values_are_written_as_such():
    assert format_value(math.inf) == "inf" and format_value(math.nan) == "nan" and format_signed(-math.inf) == "-inf"


def test_signed_values_always_carry_their_sign():
    assert (format_signed(0.853), format_signed(-1.2), format_signed(0.0)) == ("+0.853", "-1.2", "0")


@pytest.mark.parametrize(
    ("fraction", "text"),
    [
        (0.31416, "31.4%"),
        (0.0025, "0.25%"),
        (0.5, "50%"),
        (1.0, "100%"),
        (0.0, "0%"),
        (3e-07, "<0.01%"),
        (9.99e-05, "<0.01%"),
        (1e-04, "0.01%"),
        (-3e-07, ">-0.01%"),
        (float("nan"), "nan%"),
        (1e308, "inf%"),  # was OverflowError: a finite share whose percent is not (a report's, in show)
        (-1e308, "-inf%"),
    ],
)
def test_shares_are_percentages_and_tiny_ones_are_not_zero(fraction, text):
    assert format_percent(fraction) == text


def test_a_non_finite_pair_is_named_by_its_state_and_action_in_the_words():
    host = make_each_run()["host"]
    flags = host.non_finite.copy()
    flags[3 * 4 + 2] = True  # state 4, action 2
    broken = dataclasses.replace(host, non_finite=flags, degenerate=host.degenerate & ~flags)
    settings = RunSettings(Target.parse("each").bind((9, 3), NAMES), "zeros", 0.01, 10)
    summary = summarize(broken, feature_names=FEATURES, log_features=True, settings=settings, step=3)
    assert "in 1 of 27 (state, action) pairs (first: state 4, right)" in troubles(summary)["non-finite"]
    text = report_markdown(summary, FEATURES, "ig")
    assert "NaN/Inf in 1 of 27 (state, action) pairs (first: state 4, right)" in text
    assert "9 states × 3 actions" in text and "**Per action**" in text


def words(summary) -> str:
    """The report text of a summary, under its unit labels as TensorBoard's tags show them."""
    return report_markdown(summary, display_labels(summary.units.names), "ig")


def test_the_text_right_aligns_numbers_and_says_pass_or_fail_in_plain_words():
    text = words(make_summary(worst=0.5))
    # the unit the JSON report and completeness_tol use: a fraction, never a percentage; the verdict is the accuracy
    # figures', not the ratio |delta| / |dF| (0.5 here: ill-conditioned where dF is tiny), which is shown beside them
    assert (
        "✓ The attributions add up: worst estimated attribution error 4.00e-03, worst mass-relative "
        "completeness error 1.00e-03, both <= sqrt(2) x completeness_tol 0.01 over 2 states." in text
    )
    assert "5.00e-01" not in text  # one figure everywhere: the ratio stays in the JSON report
    assert "What V(s) relies on" in text and text.split("```")[1].split()[:5] == [
        "rank",
        "feature",
        "share",
        "raises",
        "lowers",
    ]
    table = text.split("```")[1].strip("\n").splitlines()
    assert table[0].split()[:2] == ["rank", "feature"]
    assert table[1].split()[1] == "pole∕angle"  # the most important first
    # every number column ends at the same place: right-aligned
    assert len({len(line) for line in table}) == 1
    failing = words(make_summary(worst=0.001, mass_relative=0.2, near=1))
    assert "✗ The attributions do NOT add up: the worst mass-relative completeness error 2.00e-01 > sqrt(2)" in failing
    assert "n_steps='auto'" in failing
    assert "1 of 2 state(s) are near the baseline" in failing and "flagged, not scored" in failing
    assert "too close to judge" not in failing and "kept apart" not in failing  # no degenerate state here
    edge = math.sqrt(2) * 0.01
    assert "✓ The attributions add up" in words(make_summary(estimate=edge * (1 - 1e-9)))
    assert "✗ The attributions do NOT add up: the worst estimated attribution error" in words(
        make_summary(estimate=edge * (1 + 1e-9))
    )
    unchecked = words(make_summary(worst=math.nan, degenerate=2, estimate=math.nan, mass_relative=math.nan))
    assert "? Accuracy not checked: in all 2 states" in unchecked
    assert "The model produced NaN/Inf in 1 of 2 states (first: state 0)" in words(
        make_summary(worst=math.inf, non_finite=1)
    )
    summary = make_summary(worst=math.inf, non_finite=1)
    told = words(
        dataclasses.replace(summary, completeness=dataclasses.replace(summary.completeness, gradient_only=True))
    )
    assert "The gradient along the path was NaN/Inf in 1 of 2 states (first: state 0); the model's values" in told


def test_a_half_precision_forward_that_fails_is_not_told_to_use_more_points():
    """A bfloat16 model's rounding (eps 7.8e-3) sets the estimate's floor at about the tolerance: n_steps='auto' and
    more points were the advice, which could not help."""
    failing = make_summary(estimate=0.02)
    bf16 = dataclasses.replace(failing, settings=dataclasses.replace(failing.settings, rounding=2.0**-7))
    for told in (words(bf16), troubles(bf16)["fail"]):
        assert "computes in half precision: its rounding (eps 7.8e-03)" in told and "n_steps='auto'" not in told
    assert "n_steps='auto'" in words(failing) and "n_steps='auto'" in troubles(failing)["fail"]
    # float16 (eps 9.8e-4) too: a 4-32-32-2 ReLU net's estimate read 0.027 at 504 points and 0.035 at 1512
    fp16 = dataclasses.replace(failing, settings=dataclasses.replace(failing.settings, rounding=2.0**-10))
    assert "computes in half precision" in words(fp16) and "n_steps='auto'" not in words(fp16)
    # far above eps too: a bfloat16 MLP's estimate read 17 eps at auto's 504 points and at 512 alike (its rounding
    # through the layers), so the advice is the same; a stochastic forward is told so, not to take more points
    far = make_summary(estimate=0.135)
    far = dataclasses.replace(far, settings=dataclasses.replace(far.settings, rounding=2.0**-7))
    assert "n_steps='auto'" not in words(far) and "half precision" in troubles(far)["fail"]
    moving = words(dataclasses.replace(failing, stochastic=True))
    assert "The forward is random" in moving and "n_steps='auto'" not in moving
    # guards against: a model in eval mode whose BatchNorm1d(track_running_stats=False) normalises by the batch told
    # only "dropout or batch-norm in train mode", which the callback had just switched off
    assert (
        "batch-norm without running statistics" in troubles(dataclasses.replace(failing, stochastic=True))["stochastic"]
    )


def test_a_failing_run_is_told_how_to_go_past_auto_where_auto_already_ran():
    """On a CPU the callback's default n_steps="budget" runs as "auto": a run that fails there stopped at auto's bound
    (504 points), and the advice was "Use n_steps='auto'", what had just run. The advice names the bound and a valid
    way past it, for the callback's engine= as the user writes it."""
    import re

    from lightning_ig.attribution import IGOptions
    from lightning_ig.attribution.auto_steps import levels

    failing = make_summary(estimate=0.02)
    for told in (words(failing), troubles(failing)["fail"]):
        assert (
            "n_steps='auto' (the default on a CPU)" in told
            and f"up to max_steps ({IGOptions().max_steps} by default;" in told
        )
        spelled = re.search(r"engine=IGOptions\(n_steps='auto', max_steps=(\d+)\)", told)
        assert spelled is not None
        options = IGOptions(n_steps="auto", max_steps=int(spelled.group(1)))  # what the text says, checked
        assert max(levels(options.max_steps)) > max(levels(IGOptions().max_steps))  # one more level than auto's


def test_the_closing_line_says_the_last_runs_verdict_as_its_card_does():
    from lightning_ig.views.text import verdict_words

    summary = make_summary(estimate=0.5)  # fails: the estimate is above sqrt(2) x 0.01
    entry = summary.history_entry(epoch=0)
    kind, line = accuracy_line(summary)
    words = verdict_words(entry)
    assert kind == "fail" and words.startswith("✗ attributions do NOT add up") and f"({line})" in words
    assert words.endswith("at step 300") and "trust" not in words
    passing = make_summary().history_entry(epoch=0)
    assert verdict_words({**passing, "trust": "unresolved"}).startswith("✓ attributions add up (estimated")
    assert ", trust checks unresolved, at step 300" in verdict_words({**passing, "trust": "unresolved"})
    assert verdict_words({"global_step": 5, "verdict": "non-finite", "trust": None}).startswith("✗ NaN/Inf")
    # a failed trust status names its first failed check other than accuracy (the headline says an accuracy failure)
    sanity = "sanity: the rank correlation with a re-initialised copy is 0.950, not below 0.500 (by 0.450; two ...)"
    failing = {**passing, "trust": "failed", "trust_reasons": ["accuracy: above tol", sanity]}
    expected = ", trust checks failed (sanity: the rank correlation with a re-initialised copy is 0.950), at step 300"
    assert verdict_words(failing).endswith(expected)
    assert verdict_words({**failing, "trust_reasons": ["accuracy: above tol"]}).endswith(
        ", trust checks failed, at step 300"
    )
    undefined = "faithfulness: the deletion curves are undefined (AUC nan, random nan, standard error nan): NaN/Inf"
    assert "trust checks failed (faithfulness: the deletion curves are undefined), at step 300" in verdict_words(
        {**failing, "trust_reasons": [undefined]}
    )


def test_drift_figures_fixed_by_construction_are_left_out_of_the_text():
    # 3 units, top_k 10: the top-10 overlap is 1 whatever the runs (the JSON report keeps it; the text says nothing)
    drift = {"spearman_prev": 0.5, "spearman_first": -0.5, "topk_jaccard_prev": 1.0}
    text = words(dataclasses.replace(make_summary(), drift=drift))
    assert "Spearman rank correlation with the previous run 0.500, with the first run -0.500." in text
    assert "overlap" not in text
