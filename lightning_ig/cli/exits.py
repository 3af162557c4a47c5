"""Exit statuses of ``lightning-ig``, the error that means "the user's mistake", and reading a user's JSON file."""

from __future__ import annotations

import os
import re
from typing import Any

from lightning_ig._files import open_input
from lightning_ig._json import MEMORY_PER_BYTE, parse_json
from lightning_ig.cli.terminal import printable

__all__ = [
    "EXIT_CLOSED_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NON_FINITE",
    "EXIT_NOT_WITHIN",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "NonFiniteError",
    "UsageError",
    "one_line",
    "read_json_file",
]

PROG = "lightning-ig"

EXIT_OK = 0
"""Success: every report written, every state's forward and attributions finite."""
EXIT_FAILURE = 1
"""An unexpected failure (a bug): rerun with ``--debug`` for the traceback."""
EXIT_USAGE = 2
"""A mistake in the command line or its inputs, or a forward that is not deterministic: one line, no report."""
EXIT_NON_FINITE = 3
"""The model produced NaN/Inf: the reports are written (``non_finite_states`` marks the states), one line says so."""
EXIT_NOT_WITHIN = 4
"""The verdict: the attributions are not within ``--completeness-tol`` (the estimate or the mass-relative error of
some state away from the baseline is above ``sqrt(2) x tol``): the reports are written, one line says which figure."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as a shell reports it): one line; the reports are all written or none."""
EXIT_CLOSED_PIPE = 141
"""The reader of stdout went away (``| head``): nothing said, as ``cat`` or ``grep`` (128 + SIGPIPE, as a shell reports
a tool that SIGPIPE ended); diag's reports are written before it prints, so they are complete."""


class UsageError(Exception):
    """A user mistake: the CLI prints its message as one line and exits with status 2."""


class NonFiniteError(Exception):
    """The model produced NaN/Inf: raised after the reports are written; one line, exit status 3."""


def one_line(text: object) -> str:
    """``text`` as one printable line: each run of whitespace (line breaks included) one space, control characters
    escaped (:func:`~lightning_ig.cli.terminal.printable`), and a long quoted value cut short."""
    return _LONG_QUOTE.sub(_cut, printable(" ".join(str(text).split())))


# A quoted value longer than this is a file's or a flag's contents (a 100000-character flag, say), not a path one
# would want to read in full: its start is enough to recognise it, and the line stays a line.
_QUOTE_LIMIT = 240
_LONG_QUOTE = re.compile(f"'([^']{{{_QUOTE_LIMIT + 1},}})'|\"([^\"]{{{_QUOTE_LIMIT + 1},}})\"")


def _cut(match: re.Match[str]) -> str:
    value = match.group(1) if match.group(1) is not None else match.group(2)
    return f"'{value[: _QUOTE_LIMIT // 2]}...' ({len(value)} characters)"


def read_json_file(path: str, what: str, fix: str) -> Any:
    """The JSON value in the file ``path`` names, or a :class:`UsageError` that names the argument and the fix.

    The path must be a regular file (a folder, a FIFO, a device, a symbolic-link loop is named as such, never read)
    whose parsed value fits in memory; malformed JSON of any kind is that error too: bad syntax, a key named twice in
    one object, a nesting bomb, an integer of thousands of digits (:func:`lightning_ig._json.parse_json`).

    Args:
        path: the file, as the user gave it.
        what: how the message names it (``"--feature-names"``, ``"report"``).
        fix: what to do, ending each message (``"give a JSON array of names"``).
    """
    from lightning_ig.vocabulary import check_memory, size_text  # noqa: PLC0415 - numpy: not before Ctrl-C's handler

    try:
        with open_input(path, what, fix) as handle:
            size = os.fstat(handle.fileno()).st_size
            check_memory(size * MEMORY_PER_BYTE, f"{what} {path!r} ({size_text(size)})", "give a smaller file")
            text = handle.read()
    except OSError as error:
        raise UsageError(f"{what} {path!r} cannot be read ({error.strerror or error}); {fix}") from None
    except ValueError as error:  # not a regular file, or too large: the message is whole
        raise UsageError(str(error)) from None
    try:
        return parse_json(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{what} {path!r} is not readable JSON ({error}); {fix}") from None
