"""`lightning-ig diag` / `show` end to end, through subprocesses as a user runs them.

Every subprocess costs a couple of seconds of imports, so the runs are started
together (module-scoped fixtures, a small thread pool) and the tests inspect
their results.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_ig import cli
from lightning_ig.attribution import integrated_gradients
from lightning_ig.checkpoint import load_checkpoint, save_checkpoint, save_merged_checkpoint
from lightning_ig.models import DuelingQNetwork
from lightning_ig.models.noise import noise_disabled
from lightning_ig.views.report import load_schema
from tests.support import repo_env
from tests.support.tolerance import assert_close_scaled

FEATURES = ["cart_position", "cart_velocity", "pole_angle", "pole_velocity"]


@dataclass
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _run(args: list[str], cwd: Path, command: list[str] | None = None) -> Run:
    command = command or [sys.executable, "-m", "lightning_ig.cli"]
    done = subprocess.run(
        [*command, *args],
        cwd=cwd,
        env={**repo_env(), "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return Run(args, done.returncode, done.stdout, done.stderr)


def _run_all(jobs: list[list[str]], cwd: Path) -> list[Run]:
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda args: _run(args, cwd), jobs))


def _smooth_network(state_dim: int, actions: int, seed: int) -> DuelingQNetwork:
    # tanh, not ReLU: IG completeness converges fast only where the path does not cross kinks.
    torch.manual_seed(seed)
    net = DuelingQNetwork(state_dim, actions, hidden_sizes=(32, 32), activation="tanh", stream_hidden_size=16)
    net.reset_noise()  # the training-mode noise is live in the saved layers; diag must switch it off
    return net


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    (root / "out").mkdir()  # an output's folder must exist: diag checks it before any work
    (root / "errors").mkdir()
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(40, 4, generator=generator)
    trending, ranging = _smooth_network(4, 3, seed=1), _smooth_network(4, 2, seed=2)
    save_checkpoint(trending, root / "q.safetensors", feature_names=FEATURES, states=states)
    save_merged_checkpoint(
        {"trending": trending, "ranging": ranging}, root / "heads.safetensors", feature_names=FEATURES, states=states
    )
    save_checkpoint(trending, root / "bare.safetensors")  # no states, none beside it
    (root / "junk.safetensors").write_bytes(b"\x00" * 64)
    torch.save({"state_dict": trending.state_dict()}, root / "model.ckpt")
    (root / "wide.json").write_text(json.dumps({"states": torch.randn(3, 5, generator=generator).tolist()}))
    nan_states = torch.randn(4, 4, generator=generator).numpy()
    nan_states[2, 1] = np.nan
    np.save(root / "nan.npy", nan_states)
    (root / "three_names.json").write_text(json.dumps(["a", "b", "c"]))
    (root / "names.json").write_text(json.dumps(["w", "x", "y", "z"]))
    (root / "held_out.json").write_text(json.dumps({"states": states[:6].tolist()}))
    return root


@pytest.fixture(scope="module")
def runs(workspace: Path) -> dict[str, Run]:
    """The successful runs, started together."""
    jobs = {
        "default": ["diag", "--checkpoint", "q.safetensors", "--output", "out/default.json"],
        "repeat": ["diag", "--checkpoint", "q.safetensors", "--output", "out/repeat.json"],
        "auto": [
            "diag",
            "--checkpoint",
            "q.safetensors",
            "--num-steps",
            "auto",
            "--output",
            "out/auto.json",
            "--states",
            "held_out.json",
            "--feature-names",
            "names.json",
            "--target",
            "action:2",
        ],
        "head": [
            "diag",
            "--checkpoint",
            "heads.safetensors",
            "--head",
            "ranging",
            "--output",
            "out/head.json",
            "--auto-samples",
            "8",
            "--seed",
            "7",
        ],
        "all_heads": [
            "diag",
            "--checkpoint",
            "heads.safetensors",
            "--all-heads",
            "--output",
            "out/all.json",
            "--quiet",
        ],
    }
    results = _run_all(list(jobs.values()), workspace)
    return dict(zip(jobs, results))


def _validate(report: dict) -> None:
    # imported here, so that collecting this file (e.g. for `pytest -m gpu`) needs no jsonschema
    import jsonschema

    jsonschema.validate(report, load_schema())


def _report(workspace: Path, name: str) -> dict:
    return json.loads((workspace / "out" / name).read_text())


def test_diag_writes_a_valid_report_whose_attributions_are_the_engines(workspace: Path, runs: dict[str, Run]) -> None:
    run = runs["default"]
    assert run.returncode == 0, run.stderr
    assert "wrote out/default.json" in run.stdout and "16 states" in run.stdout
    report = _report(workspace, "default.json")
    _validate(report)
    assert report["schema_version"] == 1 and report["checkpoint"] == "q.safetensors" and report["regime_head"] is None
    assert report["num_states"] == 16 and report["state_dim"] == 4
    assert report["forward_target"] == "mean" and report["seed"] == 42 and report["method"] == "kink_midpoint"
    assert [feature["name"] for feature in report["features"]] == FEATURES
    assert report["completeness"]["worst_relative_error"] < 0.01
    assert len(report["completeness"]["per_state"]) == 16

    # The same numbers in-process: the sampled states, the mean-weight (noise-off) model, V(s) as target.
    loaded = load_checkpoint(workspace / "q.safetensors")
    indices = report["state_indices"]
    assert len(set(indices)) == 16 and indices == sorted(indices)
    with noise_disabled(loaded.model):
        expected = integrated_gradients(loaded.model, loaded.states[indices], target="mean", n_steps="auto")
    # n_steps="auto", the default: the most points any state used, said in the report
    assert report["num_steps"] == expected.n_steps and report["num_steps_requested"] == "auto"
    mean_abs = expected.attributions.abs().mean(dim=0).double()
    # float32 work in another process (whose thread count may differ): rounding of the size of the values
    assert_close_scaled([f["mean_abs"] for f in report["features"]], mean_abs.numpy(), ulps=64, dtype=torch.float32)
    top = [feature["name"] for feature in report["top_10_by_mean_abs"]]
    assert top == [FEATURES[i] for i in torch.argsort(mean_abs, descending=True, stable=True).tolist()]


def test_repeat_runs_are_bit_identical(workspace: Path, runs: dict[str, Run]) -> None:
    assert runs["repeat"].returncode == 0, runs["repeat"].stderr
    first, second = _report(workspace, "default.json"), _report(workspace, "repeat.json")
    assert json.dumps(first["features"]) == json.dumps(second["features"])
    # nothing in a report depends on the run (no timestamps, no timings): the whole file repeats
    assert (workspace / "out" / "default.json").read_bytes() == (workspace / "out" / "repeat.json").read_bytes()


def test_auto_steps_states_file_feature_names_and_action_target(workspace: Path, runs: dict[str, Run]) -> None:
    run = runs["auto"]
    assert run.returncode == 0, run.stderr
    report = _report(workspace, "auto.json")
    _validate(report)
    assert report["num_states"] == 6 and report["states_source"] == "path"
    assert [feature["name"] for feature in report["features"]] == ["w", "x", "y", "z"]
    assert report["forward_target"] == "action:2" and report["num_steps_requested"] == "auto"
    assert report["completeness"]["worst_relative_error"] < 0.01


def test_merged_file_one_head_and_all_heads(workspace: Path, runs: dict[str, Run]) -> None:
    assert runs["head"].returncode == 0, runs["head"].stderr
    head = _report(workspace, "head.json")
    assert head["regime_head"] == "ranging" and head["prefix"] == "ranging__" and head["num_states"] == 8
    assert head["seed"] == 7

    run = runs["all_heads"]
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and not (workspace / "out" / "all.json").exists()
    reports = {name: _report(workspace, f"all.{name}.json") for name in ("trending", "ranging")}
    for name, report in reports.items():
        _validate(report)
        assert report["regime_head"] == name
    # each head is its own model: the ranging report of --all-heads is the --head one with the default sample
    assert reports["trending"]["features"] != reports["ranging"]["features"]
    trending_alone = _report(workspace, "default.json")
    assert reports["trending"]["features"] == trending_alone["features"], "the merged head loads the same weights"


def test_show_prints_the_top_features_and_completeness(workspace: Path, runs: dict[str, Run]) -> None:
    assert runs["default"].returncode == 0
    run = _run(["show", "out/default.json", "out/head.json", "--top", "2"], workspace)
    assert run.returncode == 0, run.stderr
    report = _report(workspace, "default.json")
    best, second = (feature["name"] for feature in report["top_10_by_mean_abs"][:2])
    lines = run.stdout.splitlines()
    ranked = [row for row in (line.split() for line in lines) if len(row) == 5 and row[1] in FEATURES]
    assert [row[:2] for row in ranked[:2]] == [["1", best], ["2", second]] and len(ranked) == 4  # two per report
    assert "completeness: worst relative error" in run.stdout and "head ranging" in run.stdout


# Each user mistake, with words its one-line message must hold. The first group runs as real
# processes (exit status and stderr as a shell sees them); the rest run in-process through
# cli.main, the same code path, to keep the interpreter start-ups (~2 s each) few.
ERRORS_IN_SUBPROCESS = [
    (["--checkpoint", "missing.safetensors"], "does not exist"),
    (["--checkpoint", "heads.safetensors", "--head", "sideways"], "heads in it are: ranging, trending"),
    (["--checkpoint", "q.safetensors", "--states", "wide.json"], "have 5 features but the model takes 4"),
    (["--checkpoint", "q.safetensors", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--checkpoint", "q.safetensors", "--method", "simpson"], "--method must be one of"),
]
ERRORS_IN_PROCESS = [
    (["--checkpoint", "junk.safetensors"], "not a readable safetensors file"),
    (["--checkpoint", "errors"], "is a folder"),
    (["--checkpoint", "model.ckpt"], "--lightning-module"),
    (["--checkpoint", "heads.safetensors"], "several heads (ranging, trending)"),
    (["--checkpoint", "heads.safetensors", "--prefix", "up__"], "heads in it are: ranging, trending"),
    (["--checkpoint", "q.safetensors", "--all-heads"], "single model"),
    (["--checkpoint", "q.safetensors", "--states", "nan.npy"], "1 NaN/Inf value(s), the first at index (2, 1)"),
    (["--checkpoint", "q.safetensors", "--states", "nowhere.json"], "does not exist"),
    (["--checkpoint", "q.safetensors", "--feature-names", "three_names.json"], "3 names but there are 4 features"),
    (["--checkpoint", "q.safetensors", "--auto-samples", "41"], "more than the 40 states"),
    (["--checkpoint", "bare.safetensors"], "nor beside it (<name>.states.* or states.*: .safetensors, .npy, .json)"),
    (["--checkpoint", "q.safetensors", "--target", "3"], "--target 3 is out of range: the model returns 3 outputs"),
    # the values as typed: these were said as "--target 5" and "--target 7" (the parser's number)
    (["--checkpoint", "q.safetensors", "--target", "action:5"], "--target action:5 is out of range"),
    (["--checkpoint", "q.safetensors", "--target", "007"], "--target 007 is out of range"),
    # was "prefix must be a non-empty string" (the library's keyword) and "name a model class"
    (["--checkpoint", "heads.safetensors", "--prefix", ""], "--prefix '' names no head"),
    (["--checkpoint", "q.safetensors", "--lightning-module", "os:path"], "; name a LightningModule class"),
    (["--checkpoint", "q.safetensors", "--baseline", "banana"], "neither zeros, mean, a number"),
    (["--checkpoint", "q.safetensors", "--num-steps", "many"], "'auto'"),
    (["--checkpoint", "q.safetensors", "--model-kwargs", "{not json"], "not valid JSON"),
    (["--checkpoint", "q.safetensors", "--model-kwargs", "{}"], "--model-kwargs needs --model"),
    (["--states", "auto"], "required: --checkpoint"),
    (
        ["--checkpoint", "q.safetensors", "--device", "cuda"]
        if not torch.cuda.is_available()
        else ["--checkpoint", "q.safetensors", "--device", "tpu"],
        "device",
    ),
]


def _check_error(args: list[str], code: int, stderr: str, words: str, output: Path) -> list[str]:
    problems = []
    lines = stderr.strip().splitlines()
    if code != 2 or len(lines) != 1 or words not in stderr or "Traceback" in stderr:
        problems.append(f"{args}: exit {code}, stderr {stderr!r}")
    elif not lines[0].startswith("lightning-ig") or "; " not in lines[0]:
        problems.append(f"{args}: the line should name the tool and say what to do: {lines[0]!r}")
    if output.name == "existing.json":
        if output.read_text() != "old report\n":
            problems.append(f"{args}: the existing output was changed")
    elif output.exists():
        problems.append(f"{args}: wrote {output}")
    return problems


def test_user_errors_in_a_shell_exit_2_with_one_line_and_no_output(workspace: Path) -> None:
    (workspace / "existing.json").write_text("old report\n")
    outputs = [
        workspace / ("existing.json" if n == 2 else f"errors/{n}.json") for n in range(len(ERRORS_IN_SUBPROCESS))
    ]
    jobs = [["diag", *args, "--output", str(output)] for (args, _), output in zip(ERRORS_IN_SUBPROCESS, outputs)]
    problems = []
    for run, (_, words), output in zip(_run_all(jobs, workspace), ERRORS_IN_SUBPROCESS, outputs):
        problems += _check_error(run.args, run.returncode, run.stderr, words, output)
    assert not problems, "\n".join(problems)
    assert list(workspace.glob("**/.*.tmp")) == [], "no temporary file is left behind"


def test_every_other_user_error_exits_2_with_one_line_and_no_output(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workspace)
    (workspace / "errors").mkdir(exist_ok=True)
    problems = []
    for number, (args, words) in enumerate(ERRORS_IN_PROCESS):
        output = workspace / "errors" / f"in-process-{number}.json"
        code = cli.main(["diag", *args, "--output", str(output)])
        problems += _check_error(args, code, capsys.readouterr().err, words, output)
    assert not problems, "\n".join(problems)
    code = cli.main(["diag", "--checkpoint", "q.safetensors", "--output", "errors"])
    assert code == 2 and "is a folder" in capsys.readouterr().err


def test_installed_console_script(workspace: Path, runs: dict[str, Run]) -> None:
    script = Path(sys.executable).with_name("lightning-ig")
    found = str(script) if script.exists() else shutil.which("lightning-ig")
    if found is None:
        pytest.skip("the lightning-ig console script is not installed in this environment")
    run = _run(["show", "out/default.json"], workspace, command=[found])
    assert run.returncode == 0, run.stderr
    assert "top features by mean |attribution|" in run.stdout


# ---------------------------------------------------------------------------------------------
# in-process: the parts that need no fresh interpreter


def test_user_architecture_by_import_path_and_lightning_checkpoint(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    monkeypatch.chdir(workspace)
    from tests.support.cli_models import TinyQ

    torch.manual_seed(3)
    save_file(TinyQ(4, 3).state_dict(), "tiny.safetensors")
    np.save("tiny.states.npy", np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    assert cli.main(["diag", "--checkpoint", "tiny.safetensors", "--quiet", "--output", "out/tiny.json"]) == 2
    assert "--model package.module:Class" in capsys.readouterr().err
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            "tiny.safetensors",
            "--model",
            "tests.support.cli_models:TinyQ",
            "--model-kwargs",
            '{"width": 4, "actions": 3}',
            "--auto-samples",
            "10",
            "--quiet",
            "--output",
            "out/tiny.json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = _report(workspace, "tiny.json")
    assert report["architecture"] == "tests.support.cli_models:TinyQ" and report["num_states"] == 10
    assert report["states_from"].endswith("tiny.states.npy")

    pytest.importorskip("lightning")
    from tests.support.cli_lightning_module import TinyDQN

    module = TinyDQN(4, 2, feature_names=["a", "b", "c", "d"])
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": "2.6.6",
        },
        "dqn.ckpt",
    )
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            "dqn.ckpt",
            "--lightning-module",
            "tests.support.cli_lightning_module:TinyDQN",
            "--states",
            "tiny.states.npy",
            "--quiet",
            "--output",
            "out/lightning.json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = _report(workspace, "lightning.json")
    assert [f["name"] for f in report["features"]] == ["a", "b", "c", "d"] and report["num_states"] == 10
    _validate(report)
    # guards against: a copy cut short said "(OSError: [Errno 22] Invalid argument)" and to check the module's class
    whole = Path("dqn.ckpt").read_bytes()
    Path("cut.ckpt").write_bytes(whole[: len(whole) // 2])
    args = ["diag", "--checkpoint", "cut.ckpt", "--lightning-module", "tests.support.cli_lightning_module:TinyDQN"]
    assert cli.main([*args, "--states", "tiny.states.npy", "--quiet", "--output", "out/cut.json"]) == 2
    error = capsys.readouterr().err
    assert f"'cut.ckpt' looks truncated or corrupt ({len(whole) // 2} bytes): save it again" in error, error
    # guards against: an empty file said "(EOFError: )" (pickle's message, empty), naming neither flag nor size
    Path("empty.ckpt").write_bytes(b"")
    args[2] = "./empty.ckpt"
    assert cli.main([*args, "--states", "tiny.states.npy", "--quiet", "--output", "out/empty.json"]) == 2
    error = capsys.readouterr().err
    assert "--checkpoint './empty.ckpt' looks truncated or corrupt (0 bytes): save it again" in error, error


def test_help_lists_every_documented_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diag", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # help wraps lines
    for flag in (
        "--checkpoint",
        "--states",
        "--auto-samples",
        "--seed",
        "--feature-names",
        "--num-steps",
        "--output",
        "--head",
        "--prefix",
        "--all-heads",
        "--method",
        "--gradient",
        "--baseline",
        "--target",
        "--device",
        "--backend",
        "--model",
        "--model-kwargs",
        "--lightning-module",
        "--feature-groups",
        "--saliency",
    ):
        assert flag in text, flag
    for default in ("default: 16", "default: 42", "default: ig_report.json", "default: auto"):
        assert default in text, default
