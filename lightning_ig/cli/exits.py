"""Exit statuses of the ``lightning-ig`` command, and the error that means "the user's mistake"."""

from __future__ import annotations

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
