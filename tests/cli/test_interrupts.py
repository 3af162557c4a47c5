"""Ctrl-C at any moment of a command: one line, exit status 130, and the reports all written or none."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightning_ig import cli
from tests.support import repo_env


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_the_children() -> Iterator[None]:
    """A background job of a script (`cmd &`) starts with SIGINT ignored, and so would every child: not here."""
    kept = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, kept)


def _diag(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["diag", "--checkpoint", "q.safetensors", "--quiet", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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
    subprocess.run([sys.executable, "-c", "import lightning_ig.cli"], env=repo_env(), check=True)
    earliest = 2 * (time.monotonic() - started) + 0.02
    outcomes = []
    for delay in (earliest, *(max(earliest, d) for d in (0.3, 0.6, 1.0, 1.6, 2.5))):
        process = subprocess.Popen(
            command, cwd=workspace, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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
        command, cwd=workspace, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode in (130, -signal.SIGINT)


def _python(script: str) -> subprocess.CompletedProcess[str]:
    """``python -c script`` in a fresh process, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", script], check=False, env=repo_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("argv0", ["lightning-ig", "-m"])
def test_ctrl_c_while_the_command_is_still_importing_is_the_same_one_line(argv0: str) -> None:
    # the console script's argv[0], and python -m's while runpy imports the package: the handler is in place as soon
    # as lightning_ig.cli is imported, before main(); the interrupt is sent at that point, deterministically
    script = (
        f"import os, signal, sys; sys.argv[0] = {argv0!r}; import lightning_ig.cli; "
        "os.kill(os.getpid(), signal.SIGINT); import time; time.sleep(30); print('not interrupted')"
    )
    done = _python(script)
    assert (done.returncode, done.stderr.strip().splitlines(), done.stdout) == (130, [cli.interrupts.INTERRUPTED], "")


def test_the_handler_is_in_place_before_the_heavy_imports() -> None:
    # guards against: a traceback for Ctrl-C in the command's first ~170 ms, while numpy loaded before the handler
    # (importing the command loads no numpy now: its --help answers without it)
    script = (
        "import signal, sys; sys.argv[0] = 'lightning-ig'; import builtins; real = builtins.__import__\n"
        "def spy(name, *args, **kwargs):\n"
        "    if name == 'numpy' and signal.getsignal(signal.SIGINT) is signal.default_int_handler:\n"
        "        print('numpy before the handler')\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = spy; import lightning_ig.cli; print('numpy' in sys.modules)"
    )
    done = _python(script)
    assert (done.returncode, done.stdout.split()) == (0, ["False"]), (done.stdout, done.stderr)


def test_a_program_that_imports_the_cli_keeps_its_own_ctrl_c() -> None:
    script = (
        "import os, signal, sys; import lightning_ig.cli; "
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT); import time; time.sleep(30)\n"
        "except KeyboardInterrupt:\n    print('caught')"
    )
    done = _python(script)
    assert (done.returncode, done.stdout.strip()) == (0, "caught"), done.stderr


def test_a_program_that_calls_main_keeps_its_process_on_ctrl_c(workspace: Path) -> None:
    # a notebook calling cli.main: Ctrl-C (the kernel's interrupt) mid-run ended the whole process with os._exit(130)
    # ("Kernel died"); it is the caller's KeyboardInterrupt there, which main turns into its one line and 130
    script = (
        "import os, signal, lightning_ig.cli as cli, lightning_ig.cli.diag as diag; real = diag._attribute\n"
        "diag._attribute = lambda *a: (os.kill(os.getpid(), signal.SIGINT), real(*a))[1]\n"
        "status = cli.main(['diag', '--checkpoint', 'q.safetensors', '--output', 'out/r.json', '--quiet'])\n"
        "print('status', status, signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=workspace, env=repo_env(), capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.split()) == (0, ["status", "130", "True"]), done
    assert done.stderr.strip().splitlines() == [cli.interrupts.INTERRUPTED] and not any((workspace / "out").iterdir())


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
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stderr.strip().splitlines()) == (130, [cli.interrupts.INTERRUPTED_AFTER_WRITING])
    assert done.stdout.split() == ["status", "0"] and (workspace / "out" / "r.json").is_file()
    assert list((workspace / "out").glob(".*.tmp")) == []
