"""`lightning-ig diag`'s accuracy verdict (exit 4), `--verify N` against the exact line, `--target each|contrast`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lightning_ig.attribution import integrated_gradients
from lightning_ig.checkpoint import load_checkpoint, save_checkpoint
from lightning_ig.cli import exits
from lightning_ig.models import DuelingQNetwork
from lightning_ig.models.noise import noise_disabled
from tests.support.cli_models import Opposed
from tests.support.diag import read_valid_report, run_diag

EPS32 = torch.finfo(torch.float32).eps


def test_the_verdict_decides_the_exit_status_and_names_the_figure(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coarse = tmp_path / "coarse.json"
    assert run_diag(checkpoint, coarse, "--num-steps", "2") == exits.EXIT_NOT_WITHIN == 4
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not within --completeness-tol 0.01" in err, err
    report = read_valid_report(coarse)  # written all the same
    verdict = report["completeness"]["verdict"]
    assert verdict["within"] is False and verdict["reason"] in err
    assert verdict["value"] > verdict["threshold"] == pytest.approx(2**0.5 * 0.01)
    worst = max(report["completeness"]["worst_attribution_error"], report["completeness"]["worst_mass_relative_error"])
    assert verdict["value"] == worst

    loose = tmp_path / "loose.json"
    tol = 2 * worst  # the same run judged at a tolerance its figures meet
    assert run_diag(checkpoint, loose, "--num-steps", "2", "--completeness-tol", repr(tol)) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and f"accuracy: within tol {tol:g}" in captured.out
    assert f"both <= sqrt(2) x tol = {2**0.5 * tol:.2e})" in captured.out  # the bar a passing figure is judged by
    assert read_valid_report(loose)["completeness"]["verdict"]["within"] is True
    # the summary's first line leaves |delta| / |dF| (ill conditioned where dF is small) to `show`: the verdict's
    # figures are the ones it prints
    assert "worst relative error" not in captured.out and captured.out.index("steps\n") < captured.out.index("accuracy")


def test_the_default_refines_until_within_or_says_that_its_bound_is_spent(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --num-steps auto (the default): the kink rule at 56, then the states above tol / 4 (then tol / 2) refined to 504
    default = tmp_path / "default.json"
    assert run_diag(checkpoint, default, "--quiet") == 0
    report = read_valid_report(default)
    assert report["num_steps_requested"] == "auto" and report["completeness"]["verdict"]["within"] is True
    capsys.readouterr()
    strict = tmp_path / "strict.json"  # a tolerance no state meets at any node count here: the bound is spent
    assert run_diag(checkpoint, strict, "--completeness-tol", "1e-6", "--quiet") == exits.EXIT_NOT_WITHIN
    err = capsys.readouterr().err
    completeness = read_valid_report(strict)["completeness"]
    threshold = completeness["verdict"]["threshold"]
    above = [
        row
        for row in completeness["per_state"]
        if not row["near_baseline"] and max(row["attribution_error"], row["mass_relative_error"]) > threshold
    ]
    assert f"{len(above)} state(s) still above tol at 504 nodes, where --num-steps auto stops" in err, err
    assert len(err.strip().splitlines()) == 1 and "pass a larger fixed --num-steps (e.g. 2048)" in err
    # a fixed count past auto's bound is not sent back to auto, which stops earlier
    assert run_diag(checkpoint, strict, "--num-steps", "600", "--completeness-tol", "1e-6", "--quiet") == 4
    assert "try a larger --num-steps, or check it with --verify N" in capsys.readouterr().err
    assert run_diag(checkpoint, strict, "--num-steps", "budget", "--completeness-tol", "1e-6", "--quiet") == 4
    assert "try --num-steps auto (the default) or a larger --num-steps" in capsys.readouterr().err
    # a rule auto cannot refine is not sent to it
    flags = ("--method", "riemann_trapezoid", "--num-steps", "16", "--completeness-tol", "1e-6", "--quiet")
    assert run_diag(checkpoint, strict, *flags) == 4
    assert "try a larger --num-steps, or check it with --verify N" in capsys.readouterr().err


def test_target_contrast_attributes_greedy_minus_runner_up(checkpoint: Path, tmp_path: Path) -> None:
    output = tmp_path / "contrast.json"
    assert run_diag(checkpoint, output, "--target", "contrast", "--completeness-tol", "0.5", "--quiet") == 0
    report = read_valid_report(output)
    assert report["forward_target"] == "contrast"
    loaded = load_checkpoint(checkpoint)
    states = loaded.states[report["state_indices"]]
    with noise_disabled(loaded.model), torch.no_grad():
        q, q0 = loaded.model(states), loaded.model(torch.zeros_like(states))  # the zero baseline
    top2 = q.topk(2, dim=1).indices
    pairs = [[row["greedy"], row["runner_up"]] for row in report["target_actions"]]
    assert pairs == top2.tolist()
    for row, values, base, (g, r) in zip(report["completeness"]["per_state"], q, q0, pairs):
        # the pair is chosen at the state and held fixed: at the baseline it is the same two actions' difference
        change = float((values[g] - values[r]) - (base[g] - base[r]))
        scale = float(max(values.abs().max(), base.abs().max(), 1.0))
        assert abs(row["f_input_minus_f_baseline"] - change) <= 64 * EPS32 * scale


def test_target_each_reports_every_action_beside_v(checkpoint: Path, tmp_path: Path) -> None:
    mean, each = tmp_path / "mean.json", tmp_path / "each.json"
    assert run_diag(checkpoint, mean, "--completeness-tol", "0.5", "--quiet") == 0
    assert run_diag(checkpoint, each, "--target", "each", "--completeness-tol", "0.5", "--quiet") == 0
    v, per_action = read_valid_report(mean), read_valid_report(each)
    assert per_action["forward_target"] == "mean" and per_action["features"] == v["features"]
    assert [a["action"] for a in per_action["actions"]] == [0, 1, 2]
    assert [a["forward_target"] for a in per_action["actions"]] == ["action:0", "action:1", "action:2"]
    loaded = load_checkpoint(checkpoint)
    states = loaded.states[v["state_indices"]]
    with noise_disabled(loaded.model):
        first = integrated_gradients(loaded.model, states, target=1, n_steps="auto", completeness_tol=0.5)
    first = first.attributions.abs().mean(0).double()
    top = per_action["actions"][1]["top_10_by_mean_abs"][0]
    assert top["mean_abs"] == pytest.approx(float(first.max()), rel=64 * EPS32)
    assert all("verdict" in a["completeness"] and "per_state" not in a["completeness"] for a in per_action["actions"])


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--verify", "0"], "--verify must be"),
        (["--verify", "two"], "--verify"),
        (["--target", "contrasts"], "'contrast'"),
        (["--method", "warped_middle:2"], "--method"),
        (["--method", "riemann_trapezoid"], "--num-steps auto refines midpoint nodes; with --method riemann_trapezoid"),
    ],
)
def test_bad_new_flags_exit_2_with_one_line(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    assert run_diag(checkpoint, tmp_path / "x.json", *flags) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x.json").exists()


def test_contrast_and_each_need_several_actions() -> None:
    from lightning_ig.cli.head_inputs import _target  # the check diag calls on the width

    for target in ("contrast", "each"):
        with pytest.raises(exits.UsageError, match=f"--target {target} needs at least two outputs per state"):
            _target(target, torch.zeros(3, 1))
    assert _target("contrast", torch.zeros(3, 2)).contrasts and _target("each", torch.zeros(3, 2)).every_output


@pytest.mark.parametrize(("flags", "method"), [([], "kink_midpoint"), (["--num-steps", "256"], "riemann_middle")])
def test_the_report_says_which_rule_ran(checkpoint: Path, tmp_path: Path, flags: list[str], method: str) -> None:
    output = tmp_path / "rule.json"
    assert run_diag(checkpoint, output, *flags, "--completeness-tol", "0.5", "--quiet") == 0
    assert read_valid_report(output)["method"] == method


def test_target_each_with_an_action_not_within_fails_the_top_level_verdict(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--target each where V(s) is within the tolerance and one action is not: the exit status is 4 and the report's
    top-level verdict says so (within false, accuracy "fail"), as every action's verdict is the run's (it used to say
    V's alone: within, "pass", beside exit status 4)."""
    output = tmp_path / "each.json"
    flags = ("--target", "each", "--num-steps", "8", "--completeness-tol", "0.05", "--quiet")
    assert run_diag(checkpoint, output, *flags) == exits.EXIT_NOT_WITHIN == 4
    assert "(action " in capsys.readouterr().err
    report = read_valid_report(output)
    assert report["completeness"]["verdict"]["within"] is True  # V(s) alone is within: an action fails the run
    assert any(a["completeness"]["verdict"]["within"] is False for a in report["actions"])
    assert report["verdict"]["within"] is False and report["verdict"]["accuracy"] == "fail"


def test_target_each_fails_the_top_level_verdict_where_v_could_not_be_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """V(s) = 0 everywhere (two opposed actions) cannot be checked, while the actions fail: the report's verdict read
    "unchecked" beside exit status 4."""
    torch.manual_seed(6)
    path, output = tmp_path / "opposed.safetensors", tmp_path / "opposed.json"
    save_file(Opposed(4).state_dict(), str(path))
    np.save(tmp_path / "states.npy", np.random.default_rng(6).normal(size=(16, 4)).astype(np.float32))
    flags = ("--model", "tests.support.cli_models:Opposed", "--model-kwargs", '{"width": 4}', "--states")
    flags += (str(tmp_path / "states.npy"), "--target", "each", "--num-steps", "8", "--completeness-tol", "1e-6")
    assert run_diag(path, output, *flags) == exits.EXIT_NOT_WITHIN
    capsys.readouterr()
    report = read_valid_report(output)
    assert report["completeness"]["verdict"]["within"] is None  # V(s) alone: nothing to check
    assert report["verdict"]["within"] is False and report["verdict"]["accuracy"] == "fail"


def test_non_finite_rows_have_no_mass_relative_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint with a NaN weight: every per-state row flagged non_finite has mass_relative_error null (0/0 of a
    NaN change used to be written as 0.0, an exact attribution)."""
    torch.manual_seed(5)
    model = DuelingQNetwork(4, 3, hidden_sizes=(16, 16))
    with torch.no_grad():
        model.body[0].weight[0, 0] = float("nan")  # a diverged weight: NaN outputs on every state
    path = tmp_path / "nan.safetensors"
    save_checkpoint(model, path, states=torch.randn(24, 4))
    output = tmp_path / "nan.json"
    assert run_diag(path, output, "--num-steps", "8") == exits.EXIT_NON_FINITE
    assert "steps; completeness: NaN/Inf on 16 of 16 states (first: state 0)" in capsys.readouterr().out
    rows = read_valid_report(output)["completeness"]["per_state"]
    flagged = [row for row in rows if row["non_finite"]]
    assert flagged and all(row["mass_relative_error"] is None for row in flagged)
