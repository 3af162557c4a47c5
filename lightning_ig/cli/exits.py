"""Exit statuses of ``lightning-ig``, the error that means "the user's mistake", and reading a user's JSON file."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_ig._json import parse_json
from lightning_ig.cli.terminal import printable

__all__ = [
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
"""Ctrl-C (128 + SIGINT, as a shell reports it): one line; no report is left half-written."""


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


def read_json_file(
    path: str,
    what: str,
    fix: str,
    *,
    missing: str | None = None,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The JSON value in the file ``path`` names, or a :class:`UsageError` that names the argument and the fix.

    Malformed JSON of any kind is that error: bad syntax, a nesting bomb, an integer of thousands of digits
    (:func:`lightning_ig._json.parse_json`).

    Args:
        path: the file, as the user gave it.
        what: how the message names it (``"--feature-names"``, ``"report"``).
        fix: what to do, ending each message (``"give a JSON array of names"``).
        missing: the whole message when the file does not exist (default: ``what`` and ``fix``).
        object_pairs_hook: passed to :func:`json.loads` (e.g. to refuse repeated keys with a UsageError).
    """
    file = Path(path)
    if not file.is_file():
        raise UsageError(missing or f"{what} {path!r} does not exist; {fix}")
    try:
        return parse_json(file.read_text(encoding="utf-8"), object_pairs_hook=object_pairs_hook)
    except (OSError, UnicodeDecodeError, ValueError) as error:  # a UsageError from the hook passes through
        raise UsageError(f"{what} {path!r} is not readable JSON ({error}); {fix}") from None
