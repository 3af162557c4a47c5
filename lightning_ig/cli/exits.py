"""Exit statuses of the ``lightning-ig`` command, the error that means "the user's mistake", and reading a user's JSON file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NON_FINITE",
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
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as a shell reports it): one line; no report is left half-written."""


class UsageError(Exception):
    """A user mistake: the CLI prints its message as one line and exits with status 2."""


class NonFiniteError(Exception):
    """The model produced NaN/Inf: raised after the reports are written; one line, exit status 3."""


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (line breaks included) as one space."""
    return " ".join(str(text).split())


def read_json_file(
    path: str, what: str, fix: str, *, missing: str | None = None, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """The JSON value in the file ``path`` names, or a :class:`UsageError` that names the argument and the fix.

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
        return json.loads(file.read_text(encoding="utf-8"), object_pairs_hook=object_pairs_hook)
    except (OSError, UnicodeDecodeError, ValueError) as error:  # a UsageError from the hook passes through
        raise UsageError(f"{what} {path!r} is not readable JSON ({error}); {fix}") from None
