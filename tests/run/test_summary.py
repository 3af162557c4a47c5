"""The names, scalars and text TensorBoard shows, read from a typed run summary (never the JSON report)."""

from __future__ import annotations

import math

import numpy as np

from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import Completeness
from lightning_ig.run.summary import RunSettings, RunSummary, Units
from lightning_ig.views.loggers.outputs import COUNT_TAGS, TagNames, display_labels, report_markdown, scalar_metrics


def _summary(
    worst: float = 0.004,
    non_finite: int = 0,
    degenerate: int = 0,
    groups: bool = False,
    estimate: float = 0.004,
    mass_relative: float = 0.001,
    near: int = 0,
) -> RunSummary:
    moments = Moments.of(np.array([[1.0, -20.0, 3.0], [2.0, -30.0, 5.0]]))
    names = ["cart position", "pole/angle", "x2"]
    units = Units("groups" if groups else "features", names, moments, None, np.array([2, 2, 2]) if groups else None)
    return RunSummary(
        step=300,
        run_index=2,
        settings=RunSettings("mean", "zeros", 0.01, 10),
        num_states=2,
        feature_shape=(3,),
        n_steps=50,
        method="gausslegendre",
        gradient="autograd",
        backend="torch",
        features=moments,
        logged_features=None if groups else units,
        groups=units if groups else None,
        completeness=Completeness(
            worst,
            1e-4,
            2,
            degenerate,
            non_finite,
            0 if non_finite else None,
            0.01,
            worst_attribution_error=estimate,
            worst_mass_relative_error=mass_relative,
            num_near_baseline=near,
        ),
        drift={"spearman_prev": 0.5},
        concentration={"top1pct_share": 0.8, "top10pct_share": 0.8},
    )


def test_labels_are_readable_and_generated_ones_sort_numerically():
    assert display_labels(["cart position", "pole/angle"]) == ["cart position", "pole∕angle"]
    labels = display_labels(["x[0,3,9]", "x[0,10,2]", "x[1,0,0]"], generated=True)
    assert labels == ["x[00,03,09]", "x[00,10,02]", "x[01,00,00]"] and sorted(labels) == labels
    assert display_labels(["channel 0", "channel 10", "channel 2"], generated=True) == [
        "channel 00",
        "channel 10",
        "channel 02",
    ]


def test_scalars_say_inf_for_non_finite_and_nan_for_unchecked():
    tags = TagNames.build(
        None, ["cart position", "pole/angle", "x2"], None, generated_features=False, generated_groups=False
    )
    metrics = scalar_metrics(_summary(worst=math.inf, non_finite=2), tags)
    assert metrics["ig/completeness/worst_relative_error"] == math.inf
    assert metrics["ig/completeness/non_finite_states"] == 2.0
    assert metrics["ig/mean_abs/pole∕angle"] == 25.0 and metrics["ig/mean_signed/pole∕angle"] == -25.0
    assert metrics["ig/drift/spearman_prev"] == 0.5
    counts = {f"ig/{name}" for name in COUNT_TAGS}  # logged from their first non-zero run, not in scalar_tags
    assert set(metrics) - {"ig/drift/spearman_prev"} - counts <= set(tags.scalar_tags(top_k=10))
    named = TagNames.build("value", None, ["a", "b", "c"], generated_features=False, generated_groups=False)
    assert scalar_metrics(_summary(groups=True), named)["ig/value/group/mean_abs/b"] == 25.0


def test_the_text_right_aligns_numbers_and_says_pass_or_fail_in_plain_words():
    tags = TagNames.build(
        None, ["cart position", "pole/angle", "x2"], None, generated_features=False, generated_groups=False
    )
    text = report_markdown(_summary(worst=0.5), tags)
    # the unit the JSON report and completeness_tol use: a fraction, never a percentage; the verdict is the accuracy
    # figures', not the ratio |delta| / |dF| (0.5 here: ill-conditioned where dF is tiny), which is shown beside them
    assert (
        "Completeness passes: worst attribution error 4.00e-03 (estimated), worst mass-relative "
        "completeness error 1.00e-03, both <= sqrt(2) x tolerance 0.01 over 2 states." in text
    )
    assert "Relative completeness error |delta| / |dF|: 5.00e-01." in text
    table = text.split("```")[1].strip("\n").splitlines()
    assert table[0].split()[:2] == ["rank", "feature"]
    assert table[1].split()[1] == "pole∕angle"  # the most important first
    # every number column ends at the same place: right-aligned
    assert len({len(line) for line in table}) == 1
    failing = report_markdown(_summary(worst=0.001, mass_relative=0.2, near=1), tags)
    assert "Completeness FAILS: the worst mass-relative completeness error 2.00e-01 > sqrt(2)" in failing
    assert "n_steps='auto'" in failing
    assert "1 of 2 state(s) are near the baseline" in failing and "flagged, not scored" in failing
    assert "too close to judge" not in failing and "kept apart" not in failing  # no degenerate state here
    edge = math.sqrt(2) * 0.01
    assert "Completeness passes" in report_markdown(_summary(estimate=edge * (1 - 1e-9)), tags)
    assert "Completeness FAILS: the worst estimated attribution error" in report_markdown(
        _summary(estimate=edge * (1 + 1e-9)), tags
    )
    unchecked = report_markdown(_summary(worst=math.nan, degenerate=2, estimate=math.nan, mass_relative=math.nan), tags)
    assert "Completeness not checked: in all 2 states" in unchecked
    assert "The model produced NaN/Inf in 1 of 2 states (first: state 0)" in report_markdown(
        _summary(worst=math.inf, non_finite=1), tags
    )
