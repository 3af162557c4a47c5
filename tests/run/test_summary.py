"""run/summary.py: a run summary's units, history entry and kinds of trouble, from a host result."""

from __future__ import annotations

import dataclasses
import math

import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.targets import Target
from lightning_ig.run.host_result import HostResult
from lightning_ig.run.summary import RunSettings, summarize
from tests.support.summaries import make_summary


def _run(step: int = 7, history: list | None = None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    states = torch.randn(5, 3, dtype=torch.float64)
    host = HostResult.from_result(integrated_gradients(lambda x: model(x)[:, 0], states, n_steps=16))
    settings = RunSettings(Target.parse(None), "zeros", 0.01, 2)
    names = ["a", "b", "c"]
    return host, summarize(
        host, feature_names=names, log_features=True, settings=settings, step=step, history=history or []
    )


def test_a_summary_holds_the_runs_numbers_and_its_history_entry():
    host, summary = _run()
    assert summary.units is summary.logged_features and summary.units.names == ["a", "b", "c"]
    assert summary.units.moments.mean_abs.tolist() == host.features.mean_abs.tolist()
    assert summary.run_index == 0 and summary.drift == {}  # the first run has nothing to drift from
    entry = summary.history_entry(epoch=3)
    assert entry == {
        "global_step": 7,
        "epoch": 3,
        "mean_abs": host.features.mean_abs.tolist(),
        "mean_signed": host.features.mean_signed.tolist(),
        "mass": host.features.mean_abs.tolist(),  # a feature's mass is its mean |attr|
        "verdict": summary.completeness.verdict,
        "accuracy": {  # the figure that decided, for the examples' closing line
            "figure": summary.completeness.accuracy.figure,
            "value": summary.completeness.accuracy.value,
            "threshold": summary.completeness.accuracy.threshold,
        },
        "trust": None,  # no trust checks in this run
        "trust_reasons": [],
    }
    _, later = _run(step=9, history=[entry])
    assert later.run_index == 1 and later.drift["spearman_prev"] == 1.0  # the same numbers: the same order


def test_a_groups_mass_counts_each_cells_sign_so_cells_that_cancel_show_both():
    # two cells of one group, +1 and -1 in every state: the group's net is 0, its mass 2, half of each sign
    attributions = torch.tensor([[1.0, -1.0, 0.5], [1.0, -1.0, -0.5]], dtype=torch.float64)
    result = integrated_gradients(lambda x: x.sum(1), torch.ones(2, 3, dtype=torch.float64), n_steps=4)
    result = dataclasses.replace(result, attributions=attributions)
    groups = FeatureGroups.resolve({"pair": [0, 1], "single": [2]}, (3,))
    host = HostResult.from_result(result, groups=groups)
    settings = RunSettings(Target.parse(None), "zeros", 0.01, 2)
    units = summarize(host, feature_names=["a", "b", "c"], log_features=False, settings=settings, step=1).units
    assert units.kind == "groups" and units.moments.mean_abs.tolist() == [0.0, 0.5]  # the nets hide the pair
    positive, negative = units.parts
    assert positive.tolist() == [1.0, 0.25] and negative.tolist() == [1.0, 0.25]


def test_troubles_are_kinds_in_order_and_the_views_say_them():
    assert make_summary().troubles() == []
    assert make_summary(worst=math.inf, non_finite=1).troubles() == ["non-finite"]
    assert make_summary(worst=math.nan, degenerate=2, estimate=math.nan, mass_relative=math.nan).troubles() == [
        "unchecked"
    ]
    failing = dataclasses.replace(make_summary(estimate=0.5), stochastic=True)
    assert failing.troubles() == ["fail", "stochastic"]
