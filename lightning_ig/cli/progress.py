"""What a slow ``lightning-ig`` command is doing, on stderr, without breaking the one-line error rule."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from lightning_ig.cli.exits import PROG
from lightning_ig.cli.terminal import printable

__all__ = ["PROGRESS_AFTER_S", "PROGRESS_EVERY_S", "Progress"]

PROGRESS_AFTER_S = 3.0  # say nothing for quick runs
PROGRESS_EVERY_S = 5.0


class Progress:
    """Says on stderr what is running once a stage takes more than a few seconds; silent otherwise.

    On a terminal it is one line, rewritten in place and erased before an error is printed, so a failed run still ends
    with exactly one line of stderr. In a log (stderr not a terminal) it prints a line every few seconds, but only for
    stages that start after every input was checked (``checked=True``), for the same reason.
    """

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self._stream = stream
        self._enabled = enabled
        self._interactive = bool(getattr(stream, "isatty", lambda: False)())
        self._stage = ""
        self._checked = False
        self._started = time.monotonic()
        self._stage_started = self._started
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._spoke = False
        self._line_open = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self._enabled:
            self._thread = threading.Thread(target=self._watch, name="lightning-ig-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
        if self._spoke and exc[0] is None:
            print(f"{PROG}: done in {time.monotonic() - self._started:.0f} s", file=self._stream, flush=True)

    def finish(self) -> None:
        """Stop and erase the progress line: before the command prints to stdout, which a terminal shows on it."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._line_open:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._line_open = False

    def stage(self, text: str, *, checked: bool = True) -> None:
        """Start a stage; ``checked=False`` while user input may still be found wrong."""
        with self._lock:
            self._stage, self._checked, self._stage_started = text, checked, time.monotonic()

    def _watch(self) -> None:
        wait = PROGRESS_AFTER_S
        while not self._done.wait(wait):
            with self._lock:
                stage, checked, elapsed = self._stage, self._checked, time.monotonic() - self._stage_started
            if stage and elapsed >= PROGRESS_AFTER_S and (checked or self._interactive):
                self._spoke = True
                text = printable(f"{stage} ... {elapsed:.0f} s")  # a stage names the user's files: shown, not obeyed
                if self._interactive:
                    self._stream.write(f"\r{PROG}: {text}\033[K")
                    self._stream.flush()
                    self._line_open = True
                else:
                    print(f"{PROG}: {text}", file=self._stream, flush=True)
                wait = 1.0 if self._interactive else PROGRESS_EVERY_S
            else:
                wait = max(0.1, PROGRESS_AFTER_S - elapsed)
