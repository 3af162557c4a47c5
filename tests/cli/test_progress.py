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
