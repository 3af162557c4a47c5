"""`diag --verify N`: the true error against the exact line beside the estimate, for the run it follows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lightning_ig import cli
from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.exact_line import exact_line
from lightning_ig.checkpoint import load_checkpoint
from lightning_ig.cli.exits import EXIT_USAGE
from lightning_ig.cli.verify import accuracy_words, verify_lines
from lightning_ig.models.noise import noise_disabled
from tests.support.cli_models import TinyQ
from tests.support.diag import read_valid_report, run_diag

EPS32 = torch.finfo(torch.float32).eps


def test_verify_reports_the_true_error_against_the_exact_line(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "r.json"
    status = run_diag(checkpoint, output, "--verify", "4", "--completeness-tol", "0.5")
    out = capsys.readouterr().out
    assert status == 0
    report = read_valid_report(output)
    key = report["verify"]
    assert key["reference"] == "exact_line" and key["num_states"] == 4 and len(key["per_state"]) == 4
    assert "verify: 4 states against exact_line" in out and "true error" in out
    assert cli.main(["show", str(output)]) == 0  # show prints the key as diag did
    shown = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "\n".join(line.strip() for line in verify_lines(key)) in "\n".join(shown)

    # the same truth in-process: the engine's attributions of the report's states against the exact line
    loaded = load_checkpoint(checkpoint)
    states = loaded.states[report["state_indices"]]
    with noise_disabled(loaded.model):
        ours = integrated_gradients(loaded.model, states, target="mean", n_steps="auto", completeness_tol=0.5)
        ours = ours.attributions[:4].double()  # the run diag made: its tolerance decides which states went on
    truth = exact_line(loaded.model, states[:4], target="mean").attributions
    expected = (ours - truth).abs().sum(1) / truth.abs().sum(1)
    got = torch.tensor([row["true_error"] for row in key["per_state"]], dtype=torch.float64)
    # float32 attributions from another run of the same code: the error moves by their rounding only
    assert torch.allclose(got, expected, rtol=0, atol=64 * EPS32)
    estimates = [row["attribution_error"] for row in key["per_state"]]
    assert estimates == [row["attribution_error"] for row in report["completeness"]["per_state"][:4]]
    ordinary = [row["true_error"] for row in key["per_state"] if not row["near_baseline"]]
    assert key["worst_true_error"] == max(ordinary)


@pytest.mark.parametrize("flags", [["--baseline", "mean"], ["--target", "contrast"], ["--baseline", "0.5"]])
def test_verify_checks_the_run_it_follows(checkpoint: Path, tmp_path: Path, flags: list[str]) -> None:
    # the reference takes the run's own baselines and contrast pairs: at many steps the truth is close, where the
    # zero baseline or another pair of actions would be far off (errors of order 1)
    output = tmp_path / "v.json"
    status = run_diag(checkpoint, output, *flags, "--num-steps", "1024", "--verify", "3", "--quiet")
    assert status == 0
    key = read_valid_report(output)["verify"]
    assert key["worst_true_error"] is not None and key["worst_true_error"] < 0.01
    assert all(row["true_error"] < 0.05 for row in key["per_state"])


@pytest.mark.parametrize(("within", "word"), [(True, "within"), (False, "NOT within"), ("no", None), (None, None)])
def test_a_verdict_that_is_not_a_json_boolean_is_not_read_as_within(within, word) -> None:
    # guards against: a report edited to "within": "no" shown by lightning-ig show as "accuracy: within tol"
    report = {"completeness": {"verdict": {"tolerance": 0.01, "within": within, "reason": "why"}}}
    words = accuracy_words(report)
    assert words is not None
    assert (
        words.startswith(f"accuracy: {word} tol 0.01") if word else words == "accuracy: nothing could be checked (why)"
    )


def test_each_states_ratio_is_written_so_that_a_tiny_one_is_not_zero() -> None:
    """A 0.002 ratio (the estimate 500x low) printed as "0.00x"; large ones keep two decimals."""
    rows = [
        {"state_idx": i, "true_error": 1e-3, "attribution_error": 1e-3 * r, "ratio": r, "near_baseline": False}
        for i, r in enumerate((0.002, 0.5, 123.4))
    ]
    key = {"reference": "exact_line", "num_states": 3, "seconds": 0.1, "gradients": 9, "per_state": rows}
    key |= {"worst_true_error": 1e-3, "worst_attribution_error": 0.12, "batch_true_error": 1e-3, "num_near_baseline": 0}
    told = verify_lines(key)[1:4]
    assert ["(0.002x the truth)" in told[0], "(0.50x the truth)" in told[1], "(123.40x the truth)" in told[2]] == [
        True
    ] * 3


@pytest.mark.parametrize("model", ["Detached", "Stepped"])
def test_verify_of_a_forward_autograd_cannot_take_is_a_mistake_not_a_bug(
    model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--gradient finite_difference attributes a forward autograd cannot differentiate (.detach(), a step); --verify's
    reference differentiates it all the same: that failed as "unexpected RuntimeError" (NotImplementedError from
    forward AD for the step), status 1, as a bug. It is said as the flag's limit, status 2, and no report is written."""
    torch.manual_seed(0)
    path, output = tmp_path / "q.safetensors", tmp_path / "r.json"
    save_file(TinyQ(4).state_dict(), str(path))
    np.save(tmp_path / "states.npy", np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
    flags = ["--model", f"tests.support.cli_models:{model}", "--model-kwargs", '{"width": 4}', "--num-steps", "16"]
    flags += ["--states", str(tmp_path / "states.npy"), "--gradient", "finite_difference", "--verify", "2"]
    assert run_diag(path, output, *flags, "--quiet") == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("lightning-ig diag: error: --verify's float64 autograd reference fails on the model")
    assert err.endswith("; drop --verify\n") and err.count("\n") == 1 and not output.exists(), err
