"""lightning_ig.views.report: the schema-v1 JSON document, the file and its rows (per feature, the top features)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import jsonschema
import numpy as np
import pytest
import torch

from lightning_ig.run.actions import ActionSummary
from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import completeness
from lightning_ig.views import report as report_module
from lightning_ig.views.report import (
    SCHEMA_VERSION,
    build_report,
    completeness_summary,
    each_report,
    feature_statistics,
    load_schema,
    report_to_json,
    statistics_rows,
    top_features,
    write_report,
)
from lightning_ig.vocabulary import default_feature_names
from tests.support.each import FEATURES, NAMES
from tests.support.each import each_run as make_each_run
from tests.support.results import FakeResult, make_result, sample_result
from tests.support.tolerance import assert_close_scaled

CONTRACT_KEYS = [
    "schema_version",
    "checkpoint",
    "num_steps",
    "state_dim",
    "num_states",
    "forward_target",
    "regime_head",
    "features",
    "top_10_by_mean_abs",
    "completeness",
]


@pytest.fixture
def result() -> FakeResult:
    return sample_result()


def test_completeness_all_degenerate_reads_as_nothing_checked():
    # guards against: worst_relative_error 0.0, a perfect score for "no state could be checked"
    attributions = torch.zeros(3, 2)
    result = make_result(attributions, torch.zeros(3), torch.zeros(3))
    summary = completeness_summary(result)
    assert summary["worst_relative_error"] is None
    assert summary["num_degenerate"] == 3 and summary["num_checked"] == 0
    numbers = completeness(result)
    assert math.isnan(numbers.worst_relative_error) and numbers.verdict == "unchecked"
    report = build_report(result, feature_names=None, forward_target="mean")
    assert report["num_degenerate"] == 3 and report["non_finite_states"] == []
    jsonschema.validate(json.loads(report_to_json(report)), load_schema(), cls=jsonschema.Draft202012Validator)


def test_a_non_finite_state_is_never_clean():
    # guards against: an infinite output counted as "degenerate" and skipped, worst_relative_error 0.0
    attributions = torch.ones(3, 2)
    f_input = torch.tensor([2.0, math.inf, 2.0])
    result = make_result(attributions, f_input, torch.zeros(3))
    result = dataclasses.replace(result, degenerate=torch.tensor([False, True, False]))  # what the old engine said
    numbers = completeness(result)
    assert numbers.worst_relative_error == math.inf and numbers.verdict == "non-finite"
    assert numbers.num_non_finite == 1 and numbers.first_non_finite == 1 and numbers.num_degenerate == 0
    report = build_report(result, feature_names=None, forward_target="mean")
    assert report["non_finite_states"] == [1]
    assert report["completeness"]["worst_relative_error"] is None
    assert report["completeness"]["per_state"][1]["non_finite"] is True
    nan_attribution = dataclasses.replace(make_result(attributions, torch.full((3,), 2.0), torch.zeros(3)))
    nan_attribution.attributions[2, 0] = math.nan
    assert build_report(nan_attribution, feature_names=None, forward_target="mean")["non_finite_states"] == [2]


def test_build_report_has_exactly_the_contract_keys_first_and_validates(result):
    report = build_report(
        result,
        feature_names=["a", "b", "c", "d"],
        forward_target="mean",
        top_k=3,
        extra={"global_step": 7, "timings": {"ig_ms": 1.5}},
    )
    assert list(report)[: len(CONTRACT_KEYS)] == CONTRACT_KEYS
    assert report["schema_version"] == SCHEMA_VERSION == 1
    assert report["num_steps"] == 16 and report["state_dim"] == 4 and report["num_states"] == 6
    assert report["checkpoint"] is None and report["regime_head"] is None
    assert report["global_step"] == 7 and report["backend"] == "torch"
    assert [set(f) for f in report["features"]] == [{"name", "mean_abs", "stddev", "mean_signed"}] * 4
    assert len(report["top_10_by_mean_abs"]) == 3
    means = [f["mean_abs"] for f in report["top_10_by_mean_abs"]]
    assert means == sorted(means, reverse=True)
    assert means[0] == max(f["mean_abs"] for f in report["features"])
    assert set(report["completeness"]["per_state"][0]) >= {
        "state_idx",
        "sum_attributions",
        "f_input_minus_f_baseline",
        "relative_error",
    }
    document = json.loads(report_to_json(report))
    jsonschema.Draft202012Validator.check_schema(load_schema())
    jsonschema.validate(document, load_schema(), cls=jsonschema.Draft202012Validator)


def test_schema_rejects_a_report_missing_a_contract_key(result):
    report = json.loads(report_to_json(build_report(result, feature_names=None, forward_target="mean")))
    for key in CONTRACT_KEYS:
        broken = {k: v for k, v in report.items() if k != key}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, load_schema(), cls=jsonschema.Draft202012Validator)


def test_build_report_argument_errors(result):
    with pytest.raises(ValueError, match="contract keys"):
        build_report(result, feature_names=None, forward_target="mean", extra={"features": []})
    with pytest.raises(ValueError, match="top_k must be an int >= 1, got 0"):
        build_report(result, feature_names=None, forward_target="mean", top_k=0)
    with pytest.raises(ValueError, match="feature_names has 3 names"):
        build_report(result, feature_names=["a", "b", "c"], forward_target="mean")


def test_json_is_strict_and_deterministic(result, tmp_path):
    first = write_report(build_report(result, feature_names=None, forward_target="action:1"), tmp_path / "a.json")
    second = write_report(build_report(result, feature_names=None, forward_target="action:1"), tmp_path / "b.json")
    text = first.read_text()
    assert text == second.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["completeness"]["per_state"][2]["relative_error"] is None
    # floats round-trip exactly
    assert json.loads(text)["features"][0]["mean_abs"] == feature_statistics(result.attributions)[0]["mean_abs"]


def test_write_report_is_atomic_and_leaves_no_temporary_files(result, tmp_path, monkeypatch):
    path = tmp_path / "sub" / "report.json"
    write_report(build_report(result, feature_names=None, forward_target="mean"), path)
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(report_module.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_report(build_report(result, feature_names=None, forward_target="other"), path)
    assert path.read_bytes() == before  # the old report is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]


def test_non_finite_values_become_null(result):
    broken = dataclasses.replace(result, attributions=result.attributions.clone())
    broken.attributions[0, 1] = math.inf
    report = build_report(broken, feature_names=None, forward_target="mean")
    assert report["features"][1]["mean_abs"] is None
    document = json.loads(report_to_json(report))
    jsonschema.validate(document, load_schema(), cls=jsonschema.Draft202012Validator)


def test_groups_and_the_new_keys_validate_against_the_schema(result):
    report = build_report(
        result, feature_names=["a", "b", "c", "d"], forward_target="mean", groups={"ab": [0, 1], "c": [2]}
    )
    groups = report["groups"]
    assert [(g["name"], g["members"]) for g in groups] == [("ab", 2), ("c", 1), ("other", 1)]
    flat = result.attributions.double()
    ab = flat[:, 0] + flat[:, 1]
    assert groups[0]["mean_abs"] == pytest.approx(ab.abs().mean().item(), rel=1e-12)
    assert groups[0]["mean_signed"] == pytest.approx(ab.mean().item(), rel=1e-12)
    assert groups[0]["stddev"] == pytest.approx(ab.std(unbiased=False).item(), rel=1e-12)
    # the card's share: each feature's |attr| on its own (a group's cells that cancel keep their mass), summing to 1
    mass = flat.abs().mean(dim=0)
    shares = [(mass[0] + mass[1]) / mass.sum(), mass[2] / mass.sum(), mass[3] / mass.sum()]
    assert [g["share"] for g in groups] == pytest.approx([v.item() for v in shares], rel=1e-12)
    for bad in (math.inf, math.nan):  # no share is a number where one feature is not (never 0 beside an Inf)
        broken = dataclasses.replace(result, attributions=result.attributions.clone())
        broken.attributions[0, 2] = bad
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's inf / inf said nothing to a user
            odd = build_report(broken, feature_names=None, forward_target="mean", groups={"ab": [0, 1], "c": [2]})
        assert [g["share"] for g in odd["groups"]] == [None, None, None]
    assert report["stochastic_forward"] is False and report["non_finite_states"] == [] and report["num_degenerate"] == 1
    schema = load_schema()
    jsonschema.validate(json.loads(report_to_json(report)), schema, cls=jsonschema.Draft202012Validator)
    for key in ("groups", "non_finite_states", "num_degenerate", "stochastic_forward"):
        assert key in schema["properties"] and schema["properties"][key]["description"]
    broken = json.loads(report_to_json(report))
    broken["groups"][0]["members"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)
    broken["groups"][0] |= {"members": 2, "share": 1.5}
    with pytest.raises(jsonschema.ValidationError, match="1.5 is greater than the maximum of 1"):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_large_reports_are_written_one_feature_per_line(tmp_path):
    attributions = torch.randn(4, 3, 20, 20, generator=torch.Generator().manual_seed(3))
    result = make_result(attributions, attributions.reshape(4, -1).sum(1), torch.zeros(4))
    report = build_report(result, feature_names=None, forward_target="mean", groups="channels")
    text = report_to_json(report)
    assert json.loads(text) == json.loads(json.dumps(report))  # the same document as json.dumps writes
    lines = text.splitlines()
    assert sum(line.lstrip().startswith('{"name": "x[') for line in lines) == 1200 + 10  # features + top 10
    assert len(lines) < 1400


def test_report_files_follow_the_umask(result, tmp_path):
    import os
    import stat

    previous = os.umask(0o022)
    try:
        path = write_report(build_report(result, feature_names=None, forward_target="mean"), tmp_path / "r.json")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.fixture(scope="module")
def each_run() -> dict:
    return make_each_run()


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


# --------------------------------------------------------------------------- the rows


def test_feature_statistics_match_numpy():
    attributions = torch.tensor([[1.0, -2.0, 0.5], [3.0, 2.0, 0.5], [-1.0, 4.0, 0.5]])
    stats = feature_statistics(attributions, ["a", "b", "c"])
    array = attributions.double().numpy()
    assert [s["name"] for s in stats] == ["a", "b", "c"]
    np.testing.assert_allclose([s["mean_abs"] for s in stats], np.abs(array).mean(0))
    np.testing.assert_allclose([s["stddev"] for s in stats], array.std(0))
    np.testing.assert_allclose([s["mean_signed"] for s in stats], array.mean(0))
    assert stats[2]["stddev"] == 0.0


def test_feature_statistics_flatten_multidimensional_inputs():
    attributions = torch.arange(2 * 2 * 3, dtype=torch.float32).reshape(2, 2, 3)
    stats = feature_statistics(attributions)
    assert [s["name"] for s in stats] == default_feature_names((2, 3))
    assert stats[0]["name"] == "x[0,0]" and stats[-1]["name"] == "x[1,2]"
    flat = attributions.reshape(2, 6).double()
    np.testing.assert_allclose([s["mean_signed"] for s in stats], flat.mean(0).numpy())


def test_feature_names_checked():
    with pytest.raises(ValueError, match="feature_names has 2 names but there are 3 features"):
        feature_statistics(torch.zeros(2, 3), ["a", "b"])
    with pytest.raises(TypeError, match="feature_names must be a list of strings"):
        feature_statistics(torch.zeros(2, 3), "abc")
    with pytest.raises(ValueError, match="num_states"):
        feature_statistics(torch.zeros(3), None)


def test_top_features_order_and_ties():
    stats = feature_statistics(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), ["a", "b", "c", "d"])
    assert [f["name"] for f in top_features(stats, 3)] == ["b", "c", "d"]
    assert [f["name"] for f in top_features(stats, 10)] == ["b", "c", "d", "a"]
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        top_features(stats, 0)


def test_completeness_summary_keeps_degenerate_states_apart(result):
    summary = completeness_summary(result)
    expected = np.array([0.01, -0.02, 0.0, 0.03, 0.0, -0.005])
    difference = result.f_input.double().numpy()
    regular = [i for i in range(6) if i != 2]
    worst = max(abs(expected[i]) / abs(difference[i]) for i in regular)
    assert summary["worst_relative_error"] == pytest.approx(worst, rel=1e-4)
    assert summary["num_degenerate"] == 1
    assert summary["degenerate_states"][0]["state_idx"] == 2
    assert summary["degenerate_states"][0]["absolute_error"] == pytest.approx(abs(result.delta[2].item()))
    assert summary["per_state"][2]["relative_error"] is None
    assert summary["per_state"][2]["degenerate"] is True
    assert summary["mean_abs_error"] == pytest.approx(result.delta.abs().double().mean().item())
    for i in regular:  # delta was computed in float32 from numbers of this size
        state = summary["per_state"][i]
        size = abs(state["sum_attributions"]) + abs(state["f_input_minus_f_baseline"])
        gap = state["sum_attributions"] - state["f_input_minus_f_baseline"]
        assert abs(gap - result.delta[i].item()) <= 4 * float(torch.finfo(torch.float32).eps) * size


def test_a_training_runs_report_holds_its_verdict_and_trust_checks_and_validates():
    from lightning_ig.attribution import integrated_gradients
    from lightning_ig.attribution.targets import Target
    from lightning_ig.run.host_result import HostResult
    from lightning_ig.run.summary import RunSettings, summarize
    from lightning_ig.trust.sanity import randomization_check, randomization_reference
    from lightning_ig.trust.verdict import trust_summary
    from lightning_ig.views.report import with_verdict
    from lightning_ig.views.text import accuracy_line

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    states, names = torch.randn(16, 6), [f"f{i}" for i in range(6)]
    host = HostResult.from_result(integrated_gradients(model, states, n_steps=16), keep_attributions=True)
    settings = RunSettings(Target.parse("mean"), "zeros", 0.01, 10)
    summary = summarize(host, feature_names=names, log_features=True, settings=settings, step=50)
    sanity = randomization_check(host.attributions, randomization_reference(model, states, num_copies=2))
    pending = ["faithfulness: not run yet"]
    trust = trust_summary(
        accuracy=summary.completeness.accuracy, randomization=sanity, steps=[("sanity", 50)], pending=pending
    )
    summary = dataclasses.replace(summary, trust_checks=trust)
    document = json.loads(
        report_to_json(with_verdict(build_report(host, feature_names=names, forward_target="mean"), summary))
    )
    jsonschema.validate(document, load_schema(), cls=jsonschema.Draft202012Validator)
    assert document["verdict"]["accuracy"] == accuracy_line(summary)[0]  # what the cards and the text say
    assert document["verdict"]["trust"] == document["trust"]["status"] == str(trust.status)
    assert (
        document["completeness"]["verdict"]["within"]
        == document["verdict"]["within"]
        == (summary.completeness.accuracy.within)
    )
    checks = document["trust"]["checks"]
    assert checks["sanity"]["step"] == 50 and checks["faithfulness"] is None and checks["stability"] is None
    assert checks["sanity"]["randomization_rank_correlation"] == pytest.approx(sanity.randomization_rank_correlation)
    ratio = document["completeness"]["worst_relative_error"]  # the old key stays; its twin says what it is
    assert document["completeness"]["worst_delta_over_output_change"] == ratio
    broken = dict(document, verdict={**document["verdict"], "accuracy": "fine"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, load_schema(), cls=jsonschema.Draft202012Validator)
