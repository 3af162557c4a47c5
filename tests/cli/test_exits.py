"""`lightning-ig diag` never destroys what it reads, says each mistake in one line.

Most cases run in-process through `cli.main` (the same code path as the console
script, without an interpreter start-up each); Ctrl-C needs real processes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lightning_ig import cli
from tests.support import repo_env
from tests.support.cli_models import FirstRowOnly, OneRowAtATime, Rounded, Squeezed


def _diag(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["diag", "--checkpoint", "q.safetensors", "--quiet", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(code: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith("lightning-ig diag: error:") and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---------------------------------------------------------------------------------------------
# outputs


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "baseline.json").write_text(json.dumps({"states": [[0.0, 0.0, 0.0, 0.0]]}))
    (workspace / "link.json").symlink_to("q.safetensors")
    inputs = {
        name: (workspace / name).read_bytes()
        for name in ("q.safetensors", "held_out.json", "names.json", "baseline.json")
    }
    cases = [
        ["--output", "q.safetensors"],
        ["--output", "link.json"],  # a link to the checkpoint is the checkpoint
        ["--states", "held_out.json", "--output", "held_out.json"],
        ["--feature-names", "names.json", "--output", "names.json"],
        ["--baseline", "baseline.json", "--output", "baseline.json"],
        ["--output", "./q.safetensors", "--all-heads"],
    ]
    for args in cases:
        code, _, err = _diag(capsys, *args)
        _one_line_error(code, err, "also an input of this run", args[args.index("--output") + 1])
    assert {name: (workspace / name).read_bytes() for name in inputs} == inputs


def test_folders_devices_fifos_and_missing_folders_are_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(workspace / "pipe")
    cases = [
        ("out", "is a folder"),
        ("newdir/", "is a folder name"),  # a missing folder named with its slash: no file "newdir" appears
        ("", "is empty"),  # not the current folder
        ("missing/report.json", "does not exist; create it first"),
        ("pipe", "not a regular file"),
    ]
    if os.geteuid() == 0:  # only root can make a device node; /dev/null's numbers, in the test's folder
        os.mknod(workspace / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        cases.append(("null", "not a regular file"))
    for output, words in cases:
        code, _, err = _diag(capsys, "--output", output)
        _one_line_error(code, err, words, f"--output {output!r}")
    code, _, err = _diag(capsys, "--saliency", "")  # was: the pictures written into the current folder
    _one_line_error(code, err, "--saliency '' is empty; give a folder path")
    assert not (workspace / "newdir").exists() and not (workspace / "missing").exists()
    assert stat.S_ISFIFO((workspace / "pipe").stat().st_mode)
    if os.geteuid() == 0:
        assert stat.S_ISCHR((workspace / "null").stat().st_mode)


def test_outputs_are_checked_before_anything_is_loaded(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_ig.cli import head_inputs

    def must_not_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a checkpoint was loaded before the outputs were checked")

    monkeypatch.setattr(head_inputs, "load_checkpoint", must_not_load)
    (workspace / "out" / "all.ranging.json").mkdir()  # the second head's report cannot be written
    code, _, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--all-heads", "--output", "out/all.json")
    _one_line_error(code, err, "'out/all.ranging.json'", "is a folder")
    assert not (workspace / "out" / "all.trending.json").exists(), "all or none"


def test_links_are_written_through_and_modes_follow_the_umask(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = os.umask(0o027)
    try:
        assert _diag(capsys, "--output", "out/new.json")[0] == 0
        (workspace / "out" / "kept.json").write_text("old")
        (workspace / "out" / "kept.json").chmod(0o664)
        assert _diag(capsys, "--output", "out/kept.json")[0] == 0
        (workspace / "out" / "link.json").symlink_to("kept.json")
        assert _diag(capsys, "--output", "out/link.json", "--seed", "3")[0] == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE((workspace / "out" / "new.json").stat().st_mode) == 0o640
    kept = workspace / "out" / "kept.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o664, "an overwritten report keeps its mode"
    assert (workspace / "out" / "link.json").is_symlink(), "the link stays a link"
    assert json.loads(kept.read_text())["seed"] == 3, "the link's target got the report"


def test_a_write_that_fails_late_names_the_users_path(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_ig.views.report

    def full_disk(report: object, path: object, **options: object) -> None:
        raise OSError(28, "No space left on device", str(workspace / "out" / ".report.json.x1y2.tmp"))

    monkeypatch.setattr(lightning_ig.views.report, "write_report", full_disk)
    code, _, err = _diag(capsys, "--output", "out/report.json")
    _one_line_error(code, err, "cannot write --output 'out/report.json' (No space left on device)")
    assert ".tmp" not in err


# ---------------------------------------------------------------------------------------------
# the smaller cases


def test_empty_stored_states_are_one_clear_line(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with safe_open("q.safetensors", framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open's API, not a dict
        metadata = handle.metadata()
    for name, states in (("empty.safetensors", torch.zeros(0, 4)), ("flat.safetensors", torch.zeros(0))):
        save_file({**tensors, "__states__": states}, name, metadata=metadata)
        code, _, err = _diag(capsys, "--checkpoint", name, "--output", "out/r.json")
        _one_line_error(code, err, f"have shape {tuple(states.shape)}", "pass --states PATH")
    assert not (workspace / "out" / "r.json").exists()


@pytest.mark.parametrize(
    ("names", "words"),
    [
        (["w", " ", "y", "z"], "is blank"),
        (["w", "x\ny", "y", "z"], "line break or control character"),
        (["w", "x\ty", "y", "z"], "line break or control character"),
        (["w", "w", "y", "z"], "repeats ['w']"),
        (["w", "x", "y"], "3 names but there are 4 features"),
        (["w", "x", "y", 4], "must all be strings"),
    ],
)
def test_feature_names_that_would_break_a_table_are_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str], names: list, words: str
) -> None:
    # the path quoted as typed, as every other flag's file errors ("--feature-names bad names.json has 3 names")
    (workspace / "bad names.json").write_text(json.dumps(names))
    code, _, err = _diag(capsys, "--feature-names", "bad names.json", "--output", "out/r.json")
    _one_line_error(code, err, "--feature-names 'bad names.json'", words)


def test_unnamed_features_are_x0_x1_as_in_callback_reports(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _diag(capsys, "--checkpoint", "unnamed.safetensors", "--target", "1", "--output", "out/r.json")[0] == 0
    report = json.loads((workspace / "out" / "r.json").read_text())
    assert [feature["name"] for feature in report["features"]] == ["x0", "x1", "x2", "x3"]
    assert report["forward_target"] == "action:1"


@pytest.mark.parametrize("prefix", ["tre", "trending_", "rang__"])
def test_a_part_of_a_head_name_lists_the_heads(
    workspace: Path, capsys: pytest.CaptureFixture[str], prefix: str
) -> None:
    code, _, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--prefix", prefix, "--output", "out/r.json")
    _one_line_error(code, err, "the heads in it are: ranging, trending")
    assert "--model" not in err


def test_states_take_the_models_dtype(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.cli_models import TinyQ

    np.save("f64.npy", np.random.default_rng(2).normal(size=(5, 4)))  # float64 states, float32 model
    assert _diag(capsys, "--states", "f64.npy", "--output", "out/f64.json")[0] == 0
    save_file(TinyQ(4, 3).state_dict(), "tiny.safetensors")  # float32 weights, float64 model
    code, _, err = _diag(
        capsys,
        "--checkpoint",
        "tiny.safetensors",
        "--model",
        "tests.support.cli_models:TinyQ64",
        "--model-kwargs",
        '{"width": 4, "actions": 3}',
        "--states",
        "f64.npy",
        "--output",
        "out/tiny64.json",
    )
    assert code == 0, err
    assert json.loads((workspace / "out" / "tiny64.json").read_text())["num_states"] == 5


# ---------------------------------------------------------------------------------------------
# Ctrl-C in a real process


# ---------------------------------------------------------------------------------------------
# stdout that cannot take what is printed: the status stays the work's


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
def test_a_full_stdout_after_the_reports_does_not_turn_success_into_a_usage_error(workspace: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        with open("/dev/full", "w") as full:
            return subprocess.run(
                [sys.executable, "-m", "lightning_ig.cli", *args],
                cwd=workspace,
                env=repo_env(),
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=300,
                check=False,
            )

    done = run("diag", "--checkpoint", "q.safetensors", "--output", "r.json")
    assert done.returncode in (0, 4), done.stderr  # the work's status (4: not within the tolerance): not 2
    assert "cannot print the summary (No space left on device); the reports are written" in done.stderr
    assert json.loads((workspace / "r.json").read_text())["schema_version"] == 1
    shown = run("show", "r.json")  # show's work is the printing: one line, status 2
    assert (shown.returncode, shown.stderr.strip()) == (
        2,
        "lightning-ig show: error: cannot print to stdout (No space left on device)",
    )


def test_a_stdout_closed_from_the_start_is_said_not_a_bug(workspace: Path) -> None:
    """A daemon's or cron's process may start with file descriptor 1 closed (sys.stdout is None): diag's status was
    1 ("unexpected AttributeError") with its reports written, and show's 1 for printing nothing."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lightning_ig.cli", *args],
            cwd=workspace,
            env=repo_env(),
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
            preexec_fn=lambda: os.close(1),  # the child's own stdout
        )

    done = run("diag", "--checkpoint", "q.safetensors", "--output", "r.json")
    assert done.returncode in (0, 4), done.stderr
    assert "cannot print the summary (stdout is closed); the reports are written" in done.stderr
    quiet = run("diag", "--checkpoint", "q.safetensors", "--output", "r.json", "--quiet")  # prints nothing: no line
    assert quiet.returncode == done.returncode and "cannot print" not in quiet.stderr, quiet.stderr
    assert json.loads((workspace / "r.json").read_text())["schema_version"] == 1
    shown = run("show", "r.json")
    assert (shown.returncode, shown.stderr.strip()) == (
        2,
        "lightning-ig show: error: cannot print to stdout (stdout is closed)",
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
def test_a_closed_or_full_stderr_keeps_the_status_and_never_reaches_stdout(workspace: Path) -> None:
    """stderr closed (``2>&-``) or full: the status is the work's and stdout holds only what it always holds. With
    ``2>&-`` the error line went to stdout (``print(file=None)`` writes there); with a full stderr the status was 1,
    for a mistake (2) or a verdict not within tol (4), as the line failed; Ctrl-C was lost (the run went on)."""

    def run(*args: str, stderr: object) -> subprocess.CompletedProcess[str]:
        closed = stderr is None
        return subprocess.run(
            [sys.executable, "-m", "lightning_ig.cli", *args],
            cwd=workspace,
            env=repo_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if closed else stderr,
            text=True,
            timeout=300,
            check=False,
            preexec_fn=(lambda: os.close(2)) if closed else None,  # the child's own stderr
        )

    with open("/dev/full", "w") as full:
        for stderr in (None, full):
            missing = run("diag", "--checkpoint", "missing.safetensors", stderr=stderr)
            assert (missing.returncode, missing.stdout) == (2, ""), (stderr, missing)
            bad_flag = run("diag", "--num-steps", "0", stderr=stderr)
            assert (bad_flag.returncode, bad_flag.stdout) == (2, ""), (stderr, bad_flag)
            strict = run(
                "diag",
                "--checkpoint",
                "q.safetensors",
                "--output",
                "r.json",
                "--completeness-tol",
                "1e-12",
                stderr=stderr,
            )
            assert strict.returncode == 4 and strict.stdout.startswith("wrote r.json"), (stderr, strict)
            assert "not within" not in strict.stdout, strict.stdout
    ctrl_c = """
import os, signal, sys, time
sys.argv[0] = "lightning-ig"
from lightning_ig.cli.interrupts import Interrupts
os.close(2)
Interrupts.install()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(30)
print("not ended")
"""
    done = subprocess.run(
        [sys.executable, "-c", ctrl_c], env=repo_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout) == (130, ""), done


def test_the_engines_checks_of_the_flags_name_the_flags(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A combination of flags the engine refuses is said with the flags as typed: it read "method='riemann_trapezoid'
    needs n_steps >= 2", Python's argument names, which no diag user typed."""
    cases = [
        (["--num-steps", "1", "--method", "riemann_trapezoid"], "--method riemann_trapezoid needs --num-steps >= 2"),
        (
            ["--num-steps", "8", "--method", "kink_midpoint", "--gradient", "finite_difference"],
            "with --gradient finite_difference pass --method auto",
        ),
        (["--num-steps", "100001", "--method", "gausslegendre"], "--num-steps 100001 is more than the 100000 points"),
    ]
    for args, words in cases:
        code, out, err = _diag(capsys, *args, "--output", "r.json")
        _one_line_error(code, err, words)
        assert not any(name in err for name in ("n_steps", "method=", "gradient=")) and out == "", err
    assert not (workspace / "r.json").exists()
    sweep = "runs/method=kink_midpoint,n_steps=64/q.safetensors"  # a sweep's folder: the user's path is kept as typed
    code, _, err = _diag(capsys, "--checkpoint", sweep, "--output", "r.json")
    _one_line_error(code, err, f"--checkpoint {sweep!r} does not exist")


def test_debug_keeps_a_mistakes_status_and_line(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--debug shows the traceback of an unexpected failure (status 1) only: a mistake a library check found (a
    ValueError: status 2) raised its traceback and ended with status 1 instead, so a script passing --debug read
    every such mistake as a bug."""
    code, _, err = _diag(capsys, "--num-steps", "1", "--method", "riemann_trapezoid", "--output", "r.json", "--debug")
    _one_line_error(code, err, "--method riemann_trapezoid needs --num-steps >= 2")
    import lightning_ig.cli.diag

    def bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(lightning_ig.cli.diag, "_refuse_stochastic", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # a bug's traceback, as before
        _diag(capsys, "--output", "r.json", "--debug")
    assert not (workspace / "r.json").exists()


def test_an_ascii_only_stdout_gets_escapes_not_an_error(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _diag(capsys, "--feature-names", "names.json", "--output", "r.json")[0] in (0, 4)
    report = json.loads((workspace / "r.json").read_text())
    for feature in report["features"] + report["top_10_by_mean_abs"]:
        feature["name"] = "caf\u00e9 " + feature["name"]
    (workspace / "accents.json").write_text(json.dumps(report))
    done = subprocess.run(
        [sys.executable, "-m", "lightning_ig.cli", "show", "accents.json"],
        cwd=workspace,
        env={**repo_env(), "PYTHONIOENCODING": "ascii"},
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "caf\\xe9 w" in done.stdout


def test_a_json_input_too_large_for_the_memory_is_refused_before_it_is_read(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_ig import vocabulary
    from lightning_ig.cli.exits import UsageError, read_json_file

    monkeypatch.setattr(vocabulary, "available_memory", lambda: 100)  # 20 bytes of JSON take about 240 parsed
    with pytest.raises(UsageError, match=r"--feature-names 'names.json' \(20 bytes\) needs about 240 bytes of memory"):
        read_json_file("names.json", "--feature-names", "give a JSON array of names")
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 1000)
    assert read_json_file("names.json", "--feature-names", "give a JSON array of names") == ["w", "x", "y", "z"]


def test_the_checkpoints_hints_name_the_flags(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The checkpoint reader's hints are for Python too: diag said "choose one with --head NAME (prefix=NAME__)"
    and "drop the head/prefix", which name no flag a diag user could give."""
    cases = [
        (["--checkpoint", "heads.safetensors"], "choose one with --head NAME or run each with --all-heads"),
        (["--head", "trending"], "it is a single-model file: drop --head/--prefix"),
        (["--prefix", "trending__"], "it is a single-model file: drop --head/--prefix"),
    ]
    for args, words in cases:
        code, out, err = _diag(capsys, *args, "--output", "r.json")
        _one_line_error(code, err, words)
        assert "prefix=" not in err and "the head/prefix" not in err and out == "", err
    assert not (workspace / "r.json").exists()


def test_all_heads_of_a_single_model_file_quotes_the_file_as_typed(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: "my q.safetensors holds a single model, ...": the path unquoted, read as part of the sentence
    (workspace / "my q.safetensors").write_bytes((workspace / "q.safetensors").read_bytes())
    code = cli.main(["diag", "--checkpoint", "my q.safetensors", "--all-heads", "--output", "r.json", "--quiet"])
    err = capsys.readouterr().err
    _one_line_error(code, err, "--checkpoint 'my q.safetensors' holds a single model, not several heads")
    assert not (workspace / "r.my.json").exists()


@pytest.mark.parametrize("flag", ["--states", "--baseline"])
def test_a_file_of_nan_is_named_by_its_flag_and_quoted_path(
    flag: str, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: "states of bad states.npy holds 1 NaN/Inf value(s)", "--baseline bad states.npy holds ...": the
    # path unquoted, read as part of the sentence, where the flags' other file errors quote it
    values = np.zeros((1, 4), dtype=np.float32)  # one state: a baseline for every state
    values[0, 2] = np.nan
    np.save(workspace / "bad states.npy", values)
    code, _, err = _diag(capsys, flag, "bad states.npy", "--output", "r.json")
    _one_line_error(code, err, f"{flag} 'bad states.npy' holds 1 NaN/Inf value(s), the first at index")
    assert not (workspace / "r.json").exists()


def test_a_device_that_is_not_here_is_said_as_the_flag(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--device cuda without a CUDA device said "--device='cuda': torch sees no CUDA device here", the Python
    keyword's spelling: the line names the flag as typed, --device 'cuda'."""
    missing = "cuda:99" if torch.cuda.is_available() else "cuda"  # a CUDA device this machine lacks
    for device, words in [("meta", "the meta device holds shapes"), (missing, "CUDA device")]:
        code, out, err = _diag(capsys, "--device", device, "--output", "r.json")
        _one_line_error(code, err, f"--device {device!r}: ", words, "(--device cpu, cuda or cuda:N)")
        assert "--device=" not in err and out == "", err
    code, out, err = _diag(capsys, "--device", "mps", "--output", "r.json")  # a torch device diag does not run on
    _one_line_error(code, err, "--device 'mps': only cpu and cuda devices are supported")  # quoted as the others
    assert not (workspace / "r.json").exists()


def test_the_engines_target_checks_name_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A forward that returns one row whatever the batch passes diag's one-state probe and is refused while IG runs,
    in the engine's words: "with target='mean' forward must return (N, A) values", Python's keyword for --target."""
    save_file(FirstRowOnly(4, 3).state_dict(), str(tmp_path / "q.safetensors"))
    np.save(tmp_path / "states.npy", np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
    flags = ["--model", "tests.support.cli_models:FirstRowOnly", "--model-kwargs", '{"width": 4, "actions": 3}']
    flags += ["--states", str(tmp_path / "states.npy"), "--output", str(tmp_path / "r.json"), "--quiet"]
    cases = [("mean", "with --target mean forward must"), ("contrast", "--target contrast needs a")]
    # each attributes V(s) first, under the mean's name: the line said "with --target mean" to a user of each
    for target, words in [*cases, ("each", "with --target each forward must")]:
        code = cli.main(["diag", "--checkpoint", str(tmp_path / "q.safetensors"), *flags, "--target", target])
        captured = capsys.readouterr()
        _one_line_error(code, captured.err, words)
        assert "target=" not in captured.err and captured.out == "", captured.err
    assert not (tmp_path / "r.json").exists()


def test_a_forward_that_drops_the_batch_of_one_row_is_not_told_a_flag_value_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forward that squeezes (A,) out of one row passes diag's probe and fails on a chunk of one row, with the
    engine's hint "a forward with one output per row takes target=None", said as "--target None": no such value.
    diag binds a model of one output per row itself, so the line ends at what the forward returned."""
    save_file(Squeezed(4, 3).state_dict(), str(tmp_path / "q.safetensors"))
    np.save(tmp_path / "states.npy", np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
    flags = ["--model", "tests.support.cli_models:Squeezed", "--model-kwargs", '{"width": 4, "actions": 3}']
    flags += ["--states", str(tmp_path / "states.npy"), "--output", str(tmp_path / "r.json"), "--quiet"]
    flags += ["--internal-batch-size", "1", "--num-steps", "4", "--method", "riemann_middle"]  # chunks of one row
    for target in ("mean", "1"):
        code = cli.main(["diag", "--checkpoint", str(tmp_path / "q.safetensors"), *flags, "--target", target])
        captured = capsys.readouterr()
        _one_line_error(code, captured.err, f"with --target {target} forward must", "got (3,) for 1 rows")
        assert "None" not in captured.err and captured.err.rstrip().endswith("in chunks)"), captured.err
    assert not (tmp_path / "r.json").exists()


def test_a_forward_of_integers_is_told_its_dtype_whatever_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Q-values rounded to int64: --target mean said "got dtype torch.int64", --target contrast only "got Tensor"."""
    save_file(Rounded(4, 3).state_dict(), str(tmp_path / "q.safetensors"))
    np.save(tmp_path / "states.npy", np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
    flags = ["--model", "tests.support.cli_models:Rounded", "--model-kwargs", '{"width": 4, "actions": 3}']
    flags += ["--states", str(tmp_path / "states.npy"), "--output", str(tmp_path / "r.json"), "--quiet"]
    for target in ("mean", "contrast", "each", "1"):
        code = cli.main(["diag", "--checkpoint", str(tmp_path / "q.safetensors"), *flags, "--target", target])
        captured = capsys.readouterr()
        _one_line_error(code, captured.err, "floating-point", "got dtype torch.int64")
    assert not (tmp_path / "r.json").exists()


def test_a_forward_that_takes_one_row_at_a_time_is_refused_before_ig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """diag's probe ran one state, so a forward that takes one row at a time passed it and failed on the path's
    batches: "unexpected RuntimeError: the forward failed on rows the engine built ... (rerun with --debug)", status 1,
    as a bug of diag's. The probe is a batch (the first state twice): the model's mistake is one line, status 2."""
    save_file(OneRowAtATime(4, 3).state_dict(), str(tmp_path / "q.safetensors"))
    np.save(tmp_path / "states.npy", np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32))
    flags = ["--model", "tests.support.cli_models:OneRowAtATime", "--model-kwargs", '{"width": 4, "actions": 3}']
    flags += ["--states", str(tmp_path / "states.npy"), "--output", str(tmp_path / "r.json"), "--quiet"]
    code = cli.main(["diag", "--checkpoint", str(tmp_path / "q.safetensors"), *flags])
    captured = capsys.readouterr()
    _one_line_error(code, captured.err, "the model fails on states of shape (4, 4)", "check their width or the forward")
    assert not (tmp_path / "r.json").exists() and captured.out == ""


def test_the_stderr_wrapper_reads_a_closed_stream_as_no_terminal() -> None:
    # guards against: isatty() of a stream closed since (ValueError) raised from the progress line's terminal check
    import io

    from lightning_ig.cli import _Stderr

    closed = io.StringIO()
    closed.close()
    wrapped = _Stderr(closed)
    assert wrapped.isatty() is False
    assert wrapped.write("dropped\n") == len("dropped\n")  # and a line it cannot take is dropped, never raised
