"""`lightning-ig diag` never reports a broken model as clean.

NaN/Inf from the model: the reports are written (``non_finite_states`` marks the
states), one line on stderr, exit status 3. Every state degenerate: "no state could
be checked", never "0%". A forward that is not deterministic: exit status 2, one
line naming the likely cause, no report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lightning_ig import cli
from lightning_ig.attribution import integrated_gradients
from lightning_ig.checkpoint import save_checkpoint, save_merged_checkpoint
from lightning_ig.models import DuelingQNetwork
from tests.support import REPO


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 3, hidden_sizes=(16,), activation="tanh")
    states = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    save_checkpoint(net, tmp_path / "q.safetensors", states=states)
    with safe_open(str(tmp_path / "q.safetensors"), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open's API, not a dict
        metadata = handle.metadata()
    first_weight = next(key for key in tensors if key.endswith("weight"))
    tensors[first_weight][0, 0] = float("nan")  # one diverged weight
    save_file(tensors, str(tmp_path / "nan.safetensors"), metadata=metadata)
    diverged = DuelingQNetwork(4, 3, hidden_sizes=(16,), activation="tanh")
    diverged.load_state_dict({k: v for k, v in tensors.items() if k != "__states__"})
    save_merged_checkpoint({"good": net, "bad": diverged}, tmp_path / "heads.safetensors", states=states)
    np.save(tmp_path / "states.npy", states.numpy())
    (tmp_path / "out").mkdir()
    return tmp_path


def _diag(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["diag", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _report(workspace: Path, name: str) -> dict:
    return json.loads((workspace / "out" / name).read_text())


def test_a_nan_weight_is_exit_3_with_the_report_written(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _diag(capsys, "--checkpoint", "nan.safetensors", "--output", "out/nan.json")
    assert code == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lightning-ig diag: error:"), err
    assert "NaN/Inf on 16 of 16 states (first: state_idx 0)" in lines[0] and "non_finite_states" in lines[0]
    report = _report(workspace, "nan.json")
    assert report["non_finite_states"] == list(range(16)) and report["schema_version"] == 1
    assert report["completeness"]["worst_relative_error"] is None, "inf is never written as a number, never 0"
    assert "0%" not in out and "NaN/Inf on 16 of 16 states" in out

    code = cli.main(["show", "out/nan.json"])
    shown = capsys.readouterr().out
    assert code == 0 and "completeness: NaN/Inf on 16 of 16 states (first: state 0)" in shown


def test_the_nan_line_names_the_report_as_typed(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # guards against: the rewriting of the engine's option names into diag's flags reaching this line's path, so
    # a sweep's folder read "the report 'runs/--method riemann_middle,--num-steps 64/r.json'"
    output = "runs/method=riemann_middle,n_steps=64/r.json"
    (workspace / output).parent.mkdir(parents=True)
    code, _, err = _diag(capsys, "--checkpoint", "nan.safetensors", "--output", output)
    assert code == 3 and f"the report {output!r} lists them" in err, err


def test_infinite_outputs_at_both_ends_are_exit_3_without_numpys_warnings(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: "RuntimeWarning: invalid value encountered in subtract" (inf - inf) printed before the one line
    net = DuelingQNetwork(4, 3, hidden_sizes=(16,), activation="tanh")
    with torch.no_grad():
        net.get_parameter("value.0.bias_mu").fill_(float("inf"))  # V(s) = inf at every state and the baseline
    save_checkpoint(net, workspace / "inf.safetensors", states=torch.randn(20, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, _, err = _diag(capsys, "--checkpoint", "inf.safetensors", "--output", "out/inf.json")
    assert code == 3 and len(err.strip().splitlines()) == 1 and "NaN/Inf on 16 of 16 states" in err, err


def test_an_overflowing_forward_marks_only_its_states(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.cli_models import Overflow

    save_file(Overflow(4).state_dict(), "overflow.safetensors")
    states = torch.from_numpy(np.load("states.npy"))
    expected = integrated_gradients(Overflow(4), states).non_finite
    assert 0 < int(expected.sum()) < len(states), "some states overflow, some do not"
    code, _, err = _diag(
        capsys,
        "--checkpoint",
        "overflow.safetensors",
        "--model",
        "tests.support.cli_models:Overflow",
        "--model-kwargs",
        '{"width": 4}',
        "--states",
        "states.npy",
        "--output",
        "out/overflow.json",
        "--quiet",
    )
    assert code == 3 and len(err.strip().splitlines()) == 1, err
    first = int(torch.nonzero(expected)[0])
    assert f"NaN/Inf on {int(expected.sum())} of 20 states (first: state_idx {first})" in err
    assert _report(workspace, "overflow.json")["non_finite_states"] == torch.nonzero(expected).flatten().tolist()


def test_one_broken_head_writes_every_report_and_names_the_head(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _diag(
        capsys, "--checkpoint", "heads.safetensors", "--all-heads", "--output", "out/all.json", "--quiet"
    )
    assert code == 3 and len(err.strip().splitlines()) == 1 and "head bad:" in err, err
    assert _report(workspace, "all.good.json")["non_finite_states"] == []
    assert _report(workspace, "all.bad.json")["non_finite_states"] == list(range(16))


def test_when_every_state_is_degenerate_no_state_could_be_checked(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli_models import Flat

    save_file(Flat(4, 3).state_dict(), "flat.safetensors")
    code, out, err = _diag(
        capsys,
        "--checkpoint",
        "flat.safetensors",
        "--model",
        "tests.support.cli_models:Flat",
        "--model-kwargs",
        '{"width": 4, "actions": 3}',
        "--states",
        "states.npy",
        "--target",
        "2",
        "--output",
        "out/flat.json",
    )
    assert code == 0, err
    assert "no state could be checked (20 degenerate" in out and "%" not in out
    report = _report(workspace, "flat.json")
    assert report["completeness"]["num_degenerate"] == 20
    assert cli.main(["show", "out/flat.json"]) == 0
    assert "completeness: no state could be checked (20 degenerate" in capsys.readouterr().out


def test_a_stochastic_forward_is_exit_2_naming_the_likely_cause(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli_models import TinyQ

    save_file(TinyQ(4, 3).state_dict(), "jittery.safetensors")
    code, _, err = _diag(
        capsys,
        "--checkpoint",
        "jittery.safetensors",
        "--model",
        "tests.support.cli_models:Jittery",
        "--model-kwargs",
        '{"width": 4, "actions": 3}',
        "--states",
        "states.npy",
        "--output",
        "out/jittery.json",
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "gives different values for the same state" in lines[0] and "F.dropout" in lines[0] and "Warning" not in err
    assert not (workspace / "out" / "jittery.json").exists()


def test_exit_statuses_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["diag", "--help"])
    text = capsys.readouterr().out
    for status in ("0 ", "1 ", "2 ", "3 ", "130"):
        assert f"\n  {status}" in text, status
    assert "non_finite_states" in text and "a device or a FIFO" in " ".join(text.split())
    for words in ("status 3", "non_finite_states", "no state could be checked", "Exit status"):
        assert words in (cli.__doc__ or ""), words


def test_the_console_entry_reports_nan_as_a_shell_sees_it(workspace: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_ig.cli",
            "diag",
            "--checkpoint",
            "nan.safetensors",
            "--output",
            "out/shell.json",
        ],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 3 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (workspace / "out" / "shell.json").exists()
