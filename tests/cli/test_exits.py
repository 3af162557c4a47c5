"""`lightning-ig diag` never destroys what it reads, says each mistake in one line, and stops cleanly on Ctrl-C.

Most cases run in-process through `cli.main` (the same code path as the console
script, without an interpreter start-up each); Ctrl-C needs real processes.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lightning_ig import cli
from lightning_ig.checkpoint import save_checkpoint, save_merged_checkpoint
from lightning_ig.models import DuelingQNetwork
from tests.support import REPO


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 3, hidden_sizes=(16,), activation="tanh")
    states = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    save_checkpoint(net, tmp_path / "q.safetensors", feature_names=["a", "b", "c", "d"], states=states)
    save_checkpoint(net, tmp_path / "unnamed.safetensors", states=states)
    save_merged_checkpoint({"trending": net, "ranging": net}, tmp_path / "heads.safetensors", states=states)
    (tmp_path / "held_out.json").write_text(json.dumps({"states": states[:4].tolist()}))
    (tmp_path / "names.json").write_text(json.dumps(["w", "x", "y", "z"]))
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


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
        ("missing/report.json", "does not exist; create it first"),
        ("pipe", "not a regular file"),
    ]
    if os.geteuid() == 0:  # only root can make a device node; /dev/null's numbers, in the test's folder
        os.mknod(workspace / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        cases.append(("null", "not a regular file"))
    for output, words in cases:
        code, _, err = _diag(capsys, "--output", output)
        _one_line_error(code, err, words, f"--output {output!r}")
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
    (workspace / "bad_names.json").write_text(json.dumps(names))
    code, _, err = _diag(capsys, "--feature-names", "bad_names.json", "--output", "out/r.json")
    _one_line_error(code, err, "--feature-names bad_names.json", words)


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


ODD_REPORTS = {
    "completeness_null": {"completeness": None},
    "completeness_list": {"completeness": [1, 2]},
    "worst_is_text": {"completeness": {"worst_relative_error": "small", "per_state": [1, {"relative_error": "x"}]}},
    "features_null": {"features": None, "top_10_by_mean_abs": None},
    "feature_without_numbers": {"features": [{"name": "a"}, "b", {"name": None, "mean_abs": "big"}]},
    "missing_keys": {"num_states": None, "state_dim": None, "forward_target": None, "num_steps": None},
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
        "(the report holds no completeness figures)"
        in (cli.main(["show", "completeness_null.json"]), capsys.readouterr().out)[1]
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


def test_an_interrupt_while_writing_leaves_no_report_at_all(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_ig.views.report

    written = lightning_ig.views.report.write_report
    calls = []

    def interrupted(report: dict, path: Path, **options: bool) -> None:
        calls.append(path)
        if len(calls) == 2:  # the second head's report: the first one is written already (to its temporary)
            raise KeyboardInterrupt
        written(report, path, **options)

    monkeypatch.setattr(lightning_ig.views.report, "write_report", interrupted)
    code, _, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--all-heads", "--output", "out/all.json")
    assert code == 130 and err.strip() == cli.interrupts.INTERRUPTED_WHILE_WRITING
    assert list((workspace / "out").iterdir()) == [], "all or none: no report, no temporary file"


# ---------------------------------------------------------------------------------------------
# Ctrl-C in a real process


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_ctrl_c_at_any_moment_exits_130_with_one_line(workspace: Path) -> None:
    # long enough to be running at every delay: 20 states x 400k steps
    command = [
        sys.executable,
        "-m",
        "lightning_ig.cli",
        "diag",
        "--checkpoint",
        "q.safetensors",
        "--auto-samples",
        "20",
        "--num-steps",
        "400000",
        "--method",
        "riemann_trapezoid",
        "--output",
        "out/interrupted.json",
    ]
    # The interpreter's own start-up comes before any lightning-ig code: measure it, and
    # interrupt from twice that on (imports, loading, the IG run), never earlier on a slow or busy machine.
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import lightning_ig.cli"], env=_env(), check=True)
    earliest = 2 * (time.monotonic() - started) + 0.02
    outcomes = []
    for delay in (earliest, *(max(earliest, d) for d in (0.3, 0.6, 1.0, 1.6, 2.5))):
        process = subprocess.Popen(
            command, cwd=workspace, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        outcomes.append((round(delay, 3), process.returncode, err))
    problems = [o for o in outcomes if o[1] != 130 or o[2].strip().splitlines() != [cli.interrupts.INTERRUPTED]]
    assert not problems, problems
    assert not (workspace / "out" / "interrupted.json").exists()
    assert list((workspace / "out").glob(".*.tmp")) == []

    # before any of our code runs, Python's own handling applies; it is never ignored
    process = subprocess.Popen(
        command, cwd=workspace, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode in (130, -signal.SIGINT)


@pytest.mark.parametrize("argv0", ["lightning-ig", "-m"])
def test_ctrl_c_while_the_command_is_still_importing_is_the_same_one_line(argv0: str) -> None:
    # the console script's argv[0], and python -m's while runpy imports the package: the handler is in place as soon
    # as lightning_ig.cli is imported, before main(); the interrupt is sent at that point, deterministically
    script = (
        f"import os, signal, sys; sys.argv[0] = {argv0!r}; import lightning_ig.cli; "
        "os.kill(os.getpid(), signal.SIGINT); import time; time.sleep(30); print('not interrupted')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr.strip().splitlines(), done.stdout) == (130, [cli.interrupts.INTERRUPTED], "")


def test_a_program_that_imports_the_cli_keeps_its_own_ctrl_c() -> None:
    script = (
        "import os, signal, sys; import lightning_ig.cli; "
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT); import time; time.sleep(30)\n"
        "except KeyboardInterrupt:\n    print('caught')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "caught"), done.stderr


def test_ctrl_c_after_the_reports_are_written_says_so_to_the_end_of_the_process(workspace: Path) -> None:
    # Ctrl-C while the summary prints, or while the interpreter exits (its atexit finalizers), is one line and 130:
    # never "nothing was written", a -2 or a KeyboardInterrupt traceback
    script = (
        "import os, signal, sys, atexit; sys.argv[0] = 'lightning-ig'; import lightning_ig.cli as cli; "
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), __import__('time').sleep(30))); "
        "status = cli.main(['diag', '--checkpoint', 'q.safetensors', '--output', 'out/r.json', '--quiet']); "
        "print('status', status, flush=True)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=workspace,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stderr.strip().splitlines()) == (130, [cli.interrupts.INTERRUPTED_AFTER_WRITING])
    assert done.stdout.split() == ["status", "0"] and (workspace / "out" / "r.json").is_file()
    assert list((workspace / "out").glob(".*.tmp")) == []


# ---------------------------------------------------------------------------------------------
# stdout that cannot take what is printed: the status stays the work's


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
def test_a_full_stdout_after_the_reports_does_not_turn_success_into_a_usage_error(workspace: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        with open("/dev/full", "w") as full:
            return subprocess.run(
                [sys.executable, "-m", "lightning_ig.cli", *args],
                cwd=workspace,
                env=_env(),
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


def test_an_ascii_only_stdout_gets_escapes_not_an_error(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _diag(capsys, "--feature-names", "names.json", "--output", "r.json")[0] in (0, 4)
    report = json.loads((workspace / "r.json").read_text())
    for feature in report["features"] + report["top_10_by_mean_abs"]:
        feature["name"] = "caf\u00e9 " + feature["name"]
    (workspace / "accents.json").write_text(json.dumps(report))
    done = subprocess.run(
        [sys.executable, "-m", "lightning_ig.cli", "show", "accents.json"],
        cwd=workspace,
        env={**_env(), "PYTHONIOENCODING": "ascii"},
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "caf\\xe9 w" in done.stdout


def test_show_into_a_pipe_closed_early_is_quiet_and_exits_141_as_cat_does(workspace: Path, capsys) -> None:
    assert _diag(capsys, "--output", "r.json")[0] in (0, 4)
    reports = ["r.json"] * 400  # far more than a pipe buffers
    process = subprocess.Popen(
        [sys.executable, "-m", "lightning_ig.cli", "show", *reports],
        cwd=workspace,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdout.readline()  # `| head -1`
    process.stdout.close()
    _, err = process.communicate(timeout=300)
    assert (process.returncode, err) == (141, b""), err


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
