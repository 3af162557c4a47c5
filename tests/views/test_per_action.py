"""The numbers of a ``target="each"`` run per action, and its JSON report (``lightning_ig.views.per_action``)."""

from __future__ import annotations

import dataclasses
import json
import types

import jsonschema
import numpy as np
import pytest
import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.host_result import HostResult, Moments
from lightning_ig.callback.per_action import ActionRows
from lightning_ig.views.per_action import ActionSummary, action_labels, each_report
from lightning_ig.views.report import build_report, load_schema, report_to_json
from lightning_ig.views.report_rows import completeness_summary, statistics_rows, top_features
from tests.support.tolerance import assert_close_scaled

NAMES = ["noop", "left", "right"]
FEATURES = ["x", "v", "theta", "omega", "extra"]


@pytest.fixture(scope="module")
def each_run() -> dict:
    """Every action's Q of a small float64 network on 9 states, as the callback hands it on: a row per pair."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    states = torch.randn(9, 5, dtype=torch.float64)
    result = integrated_gradients(model, states, target="each", n_steps=32)
    host = HostResult.from_result(ActionRows(NAMES).rows(result), keep_attributions=True)
    with torch.no_grad():
        q_values = model(states).numpy()
    return {
        "result": result,
        "host": host,
        "q_values": q_values,
        "summary": ActionSummary.of_each(host, host.attributions, NAMES),
    }


def test_labels_are_the_names_given_or_numbered():
    assert action_labels(None, 3) == ["action 0", "action 1", "action 2"]
    assert action_labels(("a", "b"), 2) == ["a", "b"]
    with pytest.raises(ValueError, match="action_names has 2 names but the model returns 3 actions"):
        action_labels(["a", "b"], 3)


def test_each_action_has_the_moments_of_its_own_attributions_and_its_advantage(each_run):
    result, summary = each_run["result"], each_run["summary"]
    each = result.attributions.numpy()  # (A, B, F)
    scale = float(np.abs(each).max())
    assert summary.names == NAMES and summary.num_states == 9
    for action in range(len(NAMES)):
        own, advantage = summary.moments[action], summary.advantage_moments[action]
        # the same float64 numbers, reduced in another order: a few roundings of the largest attribution
        assert_close_scaled(own.mean_abs, np.abs(each[action]).mean(0), ulps=16, dtype=np.float64, scale=scale)
        assert_close_scaled(own.mean_signed, each[action].mean(0), ulps=16, dtype=np.float64, scale=scale)
        expected = each[action] - each.mean(0)  # what favours the action over the mean action
        assert_close_scaled(advantage.mean_abs, np.abs(expected).mean(0), ulps=32, dtype=np.float64, scale=scale)
    greedy = np.bincount(each_run["q_values"].argmax(1), minlength=len(NAMES))
    assert summary.greedy_counts.tolist() == greedy.tolist()


def test_a_state_with_a_non_finite_q_value_counts_for_no_action():
    q_values = np.array([[1.0, 2.0], [np.nan, 0.0], [3.0, -1.0], [0.5, 0.5]])  # state-major rows below
    host = types.SimpleNamespace(f_input=q_values.reshape(-1))
    summary = ActionSummary.of_each(host, np.ones((8, 2)), ["a", "b"])
    assert summary.greedy_counts.tolist() == [2, 1]  # a tie goes to the lower index; the NaN state to none


def test_the_report_of_each_speaks_of_states_and_holds_each_actions_numbers(each_run):
    host, summary = each_run["host"], each_run["summary"]
    rows = build_report(host, feature_names=FEATURES, forward_target="each", top_k=3)
    assert rows["num_states"] == 27  # a row per (state, action) pair, state-major
    report = each_report(rows, summary, host, FEATURES, top_k=3, tolerance=0.01)
    jsonschema.validate(json.loads(report_to_json(report)), load_schema(), cls=jsonschema.Draft202012Validator)
    assert report["num_states"] == 9 and report["forward_target"] == "each"
    per_state = report["completeness"]["per_state"]
    assert [(row["state_idx"], row["action"]) for row in per_state] == [(s, a) for s in range(9) for a in range(3)]
    result = each_run["result"]
    change = (result.f_input - result.f_baseline).T.reshape(-1).tolist()  # (A, B) -> state-major
    assert [row["f_input_minus_f_baseline"] for row in per_state] == change
    assert [action["name"] for action in report["actions"]] == NAMES
    for index, action in enumerate(report["actions"]):
        assert action["forward_target"] == f"action:{index}" and action["units"] == "features"
        assert action["greedy_states"] == int(summary.greedy_counts[index])
        assert action["top_10_by_mean_abs"] == top_features(statistics_rows(FEATURES, summary.moments[index]), 3)
        # the action's own completeness: that of the engine's numbers of that action alone, as diag writes them
        fields = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite")
        fields += ("attribution_error", "mass_relative_error", "attribution_mass")
        one = dataclasses.replace(
            result, attributions=result.attributions[index], **{name: getattr(result, name)[index] for name in fields}
        )
        assert action["completeness"] == completeness_summary(one, per_state=False, tolerance=0.01)


def test_a_non_finite_pair_names_its_state_and_its_action(each_run):
    host, summary = each_run["host"], each_run["summary"]
    flags = host.non_finite.copy()
    flags[3 * 4 + 2] = True  # state 4, action 2
    broken = dataclasses.replace(host, non_finite=flags, degenerate=host.degenerate & ~flags)
    report = each_report(build_report(broken, feature_names=FEATURES, forward_target="each"), summary, broken, FEATURES)
    assert report["non_finite_states"] == [4]
    (row,) = [row for row in report["completeness"]["per_state"] if row["non_finite"]]
    assert (row["state_idx"], row["action"]) == (4, 2)
    assert [action["completeness"]["num_non_finite"] for action in report["actions"]] == [0, 0, 1]


def test_the_report_refuses_rows_that_are_not_the_states_times_the_actions(each_run):
    summary = each_run["summary"]
    rows = build_report(each_run["host"], feature_names=FEATURES, forward_target="each")
    two = dataclasses.replace(summary, names=NAMES[:2], moments=summary.moments[:2])
    with pytest.raises(ValueError, match="27 rows, not 9 states x 2 actions"):
        each_report(rows, two, each_run["host"], FEATURES)


def test_group_units_are_reported_with_their_members(each_run):
    host, summary = each_run["host"], each_run["summary"]
    groups = np.stack([host.attributions[:, :2].sum(1), host.attributions[:, 2:].sum(1)], axis=1)  # (27, 2)
    grouped = ActionSummary.of_each(host, groups, NAMES)
    report = each_report(
        build_report(host, feature_names=FEATURES, forward_target="each"), grouped, host, ["cart", "pole"], [2, 3]
    )
    first = report["actions"][0]
    assert first["units"] == "groups" and {row["members"] for row in first["top_10_by_mean_abs"]} == {2, 3}
    expected = Moments.of(groups.reshape(9, 3, 2)[:, 0])
    top = [row["mean_abs"] for row in first["top_10_by_mean_abs"]]
    assert_close_scaled(top, np.sort(expected.mean_abs)[::-1], ulps=4, dtype=np.float64)
    assert summary.moments[0].mean_abs.shape == (5,)  # the features' moments stay apart from the groups'


def test_a_non_finite_pair_is_named_by_its_state_and_action_in_the_words(each_run):
    from lightning_ig.views.summary import RunSettings, summarize
    from lightning_ig.views.text import report_markdown

    host = each_run["host"]
    flags = host.non_finite.copy()
    flags[3 * 4 + 2] = True  # state 4, action 2
    broken = dataclasses.replace(host, non_finite=flags, degenerate=host.degenerate & ~flags)
    settings = RunSettings("each", "zeros", 0.01, 10)
    summary = summarize(
        broken, feature_names=FEATURES, log_features=True, settings=settings, step=3, action_names=NAMES
    )
    assert "in 1 of 27 (state, action) pairs (first: state 4, right)" in summary.troubles()["non-finite"]
    text = report_markdown(summary, FEATURES, "ig")
    assert "NaN/Inf in 1 of 27 (state, action) pairs (first: state 4, right)" in text
    assert "9 states × 3 actions" in text and "**Per action**" in text
