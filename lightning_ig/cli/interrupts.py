"""Ctrl-C: one line on stderr and exit status 130, at any moment of a command; the line says what was written.

Until the reports are being written the handler ends the process at once (``os._exit``): nothing can swallow the
interrupt (an import catching ``BaseException``, a thread join, a long kernel). While they are written
(:meth:`Interrupts.raising`) Ctrl-C raises ``KeyboardInterrupt``, so the writer removes its temporary files (all or
none, :func:`lightning_ig._files.atomic_paths`); once they are written (:meth:`Interrupts.written`) the line says so,
to the end of the process. A process started with Ctrl-C ignored keeps ignoring it; the package installs the
handler as soon as it is imported (:func:`handle_from_the_start`), so Ctrl-C while it starts is the same one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from lightning_ig.cli.exits import EXIT_INTERRUPTED, PROG

__all__ = [
    "INTERRUPTED",
    "INTERRUPTED_AFTER_WRITING",
    "INTERRUPTED_WHILE_WRITING",
    "Interrupts",
    "handle_from_the_start",
]

INTERRUPTED = f"{PROG}: interrupted (Ctrl-C); nothing was written"
INTERRUPTED_WHILE_WRITING = f"{PROG}: interrupted (Ctrl-C) while writing the reports; none was written (all or none)"
INTERRUPTED_AFTER_WRITING = f"{PROG}: interrupted (Ctrl-C) after every report was written; they are complete"

_said = {"line": INTERRUPTED}  # what the handler says: the phase of the command's one run


def _exit_now(signum: int, frame: FrameType | None) -> None:
    erase = "\r\033[K" if os.isatty(2) else ""  # a progress line may be open (False for a closed fd 2)
    with contextlib.suppress(OSError):  # stderr closed or full: Ctrl-C still ends the run, only unsaid
        os.write(2, f"{erase}{_said['line']}\n".encode())
    os._exit(EXIT_INTERRUPTED)


def handle_from_the_start() -> None:
    """Ctrl-C from now on exits 130 with one line, where this process is the ``lightning-ig`` command.

    Called as the CLI package is imported, before its other imports. It acts only for the command itself: the
    console script, or ``python -m lightning_ig.cli`` while runpy imports the package (``sys.argv[0]`` is ``"-m"``
    then), and only where Ctrl-C still has Python's default handler; a program that imports the CLI keeps its own.
    """
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    if (
        name.removesuffix(".exe") in {PROG, "-m"}
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _exit_now)


class Interrupts:
    """Ctrl-C in one command run: what it means at each phase, and a raising handler while the reports are written."""

    def __init__(self) -> None:
        self._command = False  # the command's handler is in place (handle_from_the_start): raising() swaps it
        self.writing = False  # inside raising(): a KeyboardInterrupt then means "while writing"
        self.done = False  # every report is written: a KeyboardInterrupt then means "after writing"

    @classmethod
    def install(cls) -> Interrupts:
        """A run's Ctrl-C: in the command, the start-up handler (:func:`handle_from_the_start`) says the run's phase; a
        program calling ``main`` (a notebook's kernel) keeps its own: Ctrl-C raises there, ``main`` returns 130."""
        interrupts = cls()
        _said["line"] = INTERRUPTED
        in_main = threading.current_thread() is threading.main_thread()
        interrupts._command = in_main and signal.getsignal(signal.SIGINT) is _exit_now
        return interrupts

    @property
    def line(self) -> str:
        """What a KeyboardInterrupt means now, in one line."""
        return INTERRUPTED_AFTER_WRITING if self.done else INTERRUPTED_WHILE_WRITING if self.writing else INTERRUPTED

    def written(self) -> None:
        """Every report is in place: from now on Ctrl-C says so (in the command, to the end of the process)."""
        self.done = True
        _said["line"] = INTERRUPTED_AFTER_WRITING

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Inside the block Ctrl-C raises ``KeyboardInterrupt``, so that writers can clean up."""
        self.writing = True
        if self._command:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            yield
        finally:
            if self._command:  # the start-up handler again: its line says what the run wrote, to the process's end
                signal.signal(signal.SIGINT, _exit_now)
        self.writing = False  # not reached when the block raised: main still knows it was writing
