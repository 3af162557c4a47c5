"""What a slow command is doing, on stderr: said only for slow work, one line rewritten on a terminal."""

from __future__ import annotations

import pytest

from lightning_ig.cli import progress as progress_module


def test_progress_speaks_only_for_slow_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import time

    monkeypatch.setattr(progress_module, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(progress_module, "PROGRESS_EVERY_S", 0.05)
    stream = io.StringIO()
    with progress_module.Progress(stream, enabled=True) as progress:
        progress.stage("integrated gradients on 16 states")
        time.sleep(0.3)
    assert "integrated gradients on 16 states ..." in stream.getvalue() and "done in" in stream.getvalue()
    quiet = io.StringIO()
    with progress_module.Progress(quiet, enabled=True) as progress:
        progress.stage("quick")
    assert quiet.getvalue() == ""
    # in a log, a stage whose inputs may still be wrong stays silent: a failure prints one line only
    unchecked = io.StringIO()
    with progress_module.Progress(unchecked, enabled=True) as progress:
        progress.stage("loading q.safetensors", checked=False)
        time.sleep(0.3)
    assert unchecked.getvalue() == ""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    with pytest.raises(RuntimeError), progress_module.Progress(terminal, enabled=True) as progress:
        progress.stage("loading q.safetensors", checked=False)
        time.sleep(0.3)
        raise RuntimeError("a user error follows")
    text = terminal.getvalue()
    assert "\rlightning-ig: loading q.safetensors ..." in text and "\n" not in text
    assert text.endswith("\r\033[K"), "the progress line is erased before the error is printed"


def test_diag_names_each_slow_step_as_it_starts(
    checkpoint, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: a --verify reference (tens of seconds on a large net) or --target each's second pass shown as
    # the first pass still running
    from tests.support.diag import run_diag

    stages: list[str] = []
    monkeypatch.setattr(progress_module.Progress, "stage", lambda self, text, checked=True: stages.append(text))
    flags = ("--target", "each", "--num-steps", "8", "--verify", "30")  # the auto sample: 16 states
    assert run_diag(checkpoint, tmp_path / "r.json", *flags) in (0, 4)
    capsys.readouterr()
    assert stages[1:] == [  # every action first: a forward the engine refuses is said as --target each
        "integrated gradients of every action, 8 steps",
        "integrated gradients on 16 states, 8 steps",
        "--verify: the reference on 16 states",
        "writing the report",
    ], stages


def test_diag_summary_starts_its_own_line_on_a_terminal(checkpoint, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # guards against: on a terminal, where stdout and stderr are one screen, a slow run's summary was printed at the
    # end of the progress line, still open ("... 17 swrote r.json: ..."), and that line erased only after it
    import io
    import sys

    from tests.support.diag import run_diag

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def stage(self: progress_module.Progress, text: str, checked: bool = True) -> None:
        self._stream.write(f"\rlightning-ig: {text} ... 4 s\033[K")  # as the watcher draws a slow stage, at once
        self._line_open = True

    screen = Terminal()
    monkeypatch.setattr(progress_module.Progress, "stage", stage)
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    assert run_diag(checkpoint, tmp_path / "r.json", "--num-steps", "64") in (0, 4)
    text = screen.getvalue()
    assert f"\r\033[Kwrote {tmp_path / 'r.json'}: " in text, text
