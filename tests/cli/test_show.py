"""`lightning-ig show`: what it can of odd reports, one line for what is not a report, quiet into a closed pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ig import cli
from tests.support import repo_env


def _diag(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["diag", "--checkpoint", "q.safetensors", "--quiet", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


ODD_REPORTS = {
    "completeness_null": {"completeness": None},
    "completeness_list": {"completeness": [1, 2]},
    "worst_is_text": {"completeness": {"worst_relative_error": "small", "per_state": [1, {"relative_error": "x"}]}},
    "features_null": {"features": None, "top_10_by_mean_abs": None},
    "feature_without_numbers": {"features": [{"name": "a"}, "b", {"name": None, "mean_abs": "big"}]},
    "verify_odd": {"verify": {"num_states": 2, "per_state": [5]}},
    "missing_keys": {"num_states": None, "state_dim": None, "forward_target": None, "num_steps": None},
    "trust_odd": {"trust": {"status": ["x"], "reasons": "not a list"}, "global_step": {"a": 1}},
    # was exit 1, "unexpected OverflowError": a share finite in the file, its percent not (format_percent's log10)
    "group_share_huge": {"groups": [{"name": "g", "members": 1, "share": 1e308}, {"name": "h", "share": -1e308}]},
}


def test_show_prints_what_it_can_of_odd_reports(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _diag(capsys, "--output", "out/good.json")[0] == 0
    good = json.loads((workspace / "out" / "good.json").read_text())
    for name, change in ODD_REPORTS.items():
        (workspace / f"{name}.json").write_text(json.dumps({**good, **change}))
        code = cli.main(["show", f"{name}.json"])
        captured = capsys.readouterr()
        assert code == 0 and captured.err == "", (name, captured.err)
        assert f"{name}.json" in captured.out and "completeness:" in captured.out
    assert (
        "verify: in the report, but not in the form diag writes"
        in (cli.main(["show", "verify_odd.json"]), capsys.readouterr().out)[1]
    )
    assert (
        "(the report holds no completeness figures)"
        in (cli.main(["show", "completeness_null.json"]), capsys.readouterr().out)[1]
    )
    (workspace / "no_rows.json").write_text(json.dumps({**good, "completeness": {"worst_relative_error": 0.1}}))
    assert "(the report holds no per-state figures)" in (cli.main(["show", "no_rows.json"]), capsys.readouterr().out)[1]
    unrated = {
        **good["completeness"],
        "per_state": [
            {**row, "relative_error": None, "attribution_error": None} for row in good["completeness"]["per_state"]
        ],
    }
    (workspace / "unrated.json").write_text(json.dumps({**good, "completeness": unrated}))
    assert (
        "(the report holds no state with a relative error)"
        in (cli.main(["show", "unrated.json"]), capsys.readouterr().out)[1]
    )

    for name, text in (
        ("list.json", "[1, 2]"),
        ("v2.json", json.dumps({**good, "schema_version": 2})),
        ("bad.json", "{"),
    ):
        (workspace / name).write_text(text)
        code = cli.main(["show", name])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (name, err)


def test_show_says_a_callback_reports_trust_status_and_step(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: show printing "accuracy: within" alone for a run whose trust checks failed (the card, ig/report
    # and the closing line said "trust checks failed")
    assert _diag(capsys, "--output", "good.json")[0] == 0
    good = json.loads((workspace / "good.json").read_text())
    reason = "sanity: the rank correlation with a re-initialised copy is 0.950, not below 0.900"
    trust = {"status": "failed", "reasons": [reason], "notes": [], "checks": {}}
    (workspace / "run.json").write_text(json.dumps({**good, "global_step": 3437, "trust": trust}))
    assert cli.main(["show", "run.json"]) == 0
    out = capsys.readouterr().out
    assert "   step 3437   target " in out and f"  trust checks: failed\n    - {reason}\n" in out
    assert out.index("accuracy: within") < out.index("completeness: ") < out.index("trust checks")
    assert cli.main(["show", "good.json"]) == 0
    assert "trust checks" not in capsys.readouterr().out  # diag writes no trust checks


def test_show_into_a_pipe_closed_early_is_quiet_and_exits_141_as_cat_does(workspace: Path, capsys) -> None:
    assert _diag(capsys, "--output", "r.json")[0] in (0, 4)
    reports = ["r.json"] * 400  # far more than a pipe buffers
    process = subprocess.Popen(
        [sys.executable, "-m", "lightning_ig.cli", "show", *reports],
        cwd=workspace,
        env=repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdout.readline()  # `| head -1`
    process.stdout.close()
    _, err = process.communicate(timeout=300)
    assert (process.returncode, err) == (141, b""), err


def test_show_prints_each_actions_features_and_verdict(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # guards against: a --target each report shown as V(s) alone, its actions' figures and verdicts not printed
    assert _diag(capsys, "--output", "each.json", "--target", "each")[0] in (0, 4)
    actions = json.loads((workspace / "each.json").read_text())["actions"]
    assert cli.main(["show", "each.json", "--top", "2"]) == 0
    shown = capsys.readouterr().out.split("per action (mean |attribution|)\n")[1].splitlines()
    assert len(shown) == 2 * len(actions) == 6
    for action, (features, verdict) in zip(actions, zip(shown[::2], shown[1::2])):
        top = action["top_10_by_mean_abs"]
        listed = ", ".join(f"{unit['name']} {unit['mean_abs']:.4g}" for unit in top[:2])
        assert features == f"  action {action['action']}: {listed}", features
        word = "within" if action["completeness"]["verdict"]["within"] else "NOT within"
        assert verdict.startswith(f"    accuracy: {word} tol "), verdict


def test_a_name_is_cut_before_it_is_escaped_never_mid_escape(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: "aaaa...a\x" (half of the escape of ESC), cut after escaping
    assert _diag(capsys, "--output", "good.json")[0] == 0
    report = json.loads((workspace / "good.json").read_text())
    report["top_10_by_mean_abs"][0]["name"] = "a" * 22 + "\x1b[2J"
    (workspace / "odd.json").write_text(json.dumps(report))
    assert cli.main(["show", "odd.json", "--top", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("     1  "))
    assert row.split()[1] == "a" * 22 + "\\x1b[", row  # 24 characters: the escape whole


def test_the_worst_states_are_ranked_by_the_estimate_the_verdict_reads(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: the worst-state table ranked by |delta| / |dF| (ill conditioned where dF is small) while the
    # verdict reads the estimate, and a near-baseline state (not scored) listed first
    assert _diag(capsys, "--output", "good.json")[0] == 0
    report = json.loads((workspace / "good.json").read_text())
    base = report["completeness"]["per_state"][0]
    figures = [(0.5, 0.9, True), (0.02, 1e-3, False), (1e-3, 0.5, False), (0.01, None, False)]
    report["completeness"]["per_state"] = [
        {**base, "state_idx": index, "attribution_error": estimate, "relative_error": ratio, "near_baseline": near}
        for index, (estimate, ratio, near) in enumerate(figures)
    ]

    def ranked(report: dict) -> list[int]:
        (workspace / "ranked.json").write_text(json.dumps(report))
        assert cli.main(["show", "ranked.json", "--worst-states", "4"]) == 0
        lines = capsys.readouterr().out.split("sum(attr)")[1].splitlines()[1:]
        return [int(line.split()[0]) for line in lines]

    assert ranked(report) == [1, 3, 2, 0]  # the estimate's order, the near-baseline state last
    assert cli.main(["show", "ranked.json"]) == 0  # the old ratio beside a verdict: said as not judged
    assert "(|delta| / |dF|: large where dF is small; the verdict reads the figures above)" in capsys.readouterr().out
    for row in report["completeness"]["per_state"]:  # a report written before the estimate: the old ratio
        del row["attribution_error"], row["near_baseline"]
    assert ranked(report) == [0, 2, 1]
