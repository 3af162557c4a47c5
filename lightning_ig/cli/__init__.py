"""The ``lightning-ig`` command: Integrated Gradients reports for saved Q-networks.

``lightning-ig diag`` rebuilds a model from a safetensors checkpoint (:mod:`lightning_ig.checkpoint`), switches its
NoisyNet noise off, runs Integrated Gradients on held-out states and writes the schema-version-1 JSON report
(:mod:`lightning_ig.views.report`); ``lightning-ig show`` prints a report as a table. The flags are documented by
``lightning-ig diag --help`` (:mod:`.parser`) and the README's "The command line"; the rules every run keeps:

* inputs (``--checkpoint``, ``--states``, ``--baseline``, ``--feature-names``, ``--feature-groups``) must be regular
  files, checked before anything is read; work the user sizes must fit in the memory available, said before it is
  allocated; what a file holds is printed as text, its control characters escaped (:mod:`.terminal`), and
  malformed JSON of any depth or size is one line and status 2;
* outputs are one plan, checked before anything is loaded (none may be an input, two may not be the same file), and
  written all or none: a full disk, Ctrl-C, SIGTERM or SIGHUP before the renames leaves none of them
  (:mod:`lightning_ig._files`);
* a model whose forward or attributions are NaN/Inf on some states is never reported as clean: the reports are
  written with the extra key ``non_finite_states`` and the command exits with status 3; when no state can be
  checked the summary says "no state could be checked", never "0%"; a stochastic forward is refused (status 2).

Exit status (``--help`` lists them, :mod:`.exits` defines them): 0 written and finite, 1 a bug, 2 the user's mistake
(no report), 3 NaN/Inf (reports written), 4 not within ``--completeness-tol`` (reports written), 130 Ctrl-C, 141
stdout closed by its reader. The status is the work's: 0, 3 and 4 say the reports are written, 2 and 130 (before the
renames) that none is; a stdout that cannot take diag's summary leaves it as it is (one line on stderr), while for
``show`` the printing is the work (status 2).

The parts: :mod:`.parser` (flags and help), :mod:`.diag` (the diag command's steps), :mod:`.head_inputs` (one head's
checked inputs), :mod:`.feature_groups`, :mod:`.show`, :mod:`.verify`, :mod:`.progress`, :mod:`.interrupts`
(Ctrl-C), :mod:`.exits` (statuses and the user-mistake error).

Example::

    lightning-ig diag --checkpoint q.safetensors --states auto --output ig_report.json
    lightning-ig diag --checkpoint minatar.safetensors --feature-groups channels --saliency saliency/
    lightning-ig show ig_report.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from lightning_ig.cli.exits import (
    EXIT_CLOSED_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NON_FINITE,
    EXIT_USAGE,
    PROG,
    NonFiniteError,
    UsageError,
    one_line,
)
from lightning_ig.cli.interrupts import Interrupts, handle_from_the_start

handle_from_the_start()  # Ctrl-C during the imports below is one line and status 130 too, not a traceback

from lightning_ig.cli.parser import build_parser  # noqa: E402 - after the handler
from lightning_ig.cli.progress import Progress  # noqa: E402 - after the handler

__all__ = ["build_parser", "main"]  # the exit statuses and UsageError are lightning_ig.cli.exits' to export


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lightning-ig`` command.

    Args:
        argv: The arguments after the program name; default ``None`` reads ``sys.argv[1:]``.

    Returns:
        The exit status: 0 ok, 1 an unexpected failure, 2 a user mistake or a stochastic forward (one line on stderr),
        3 NaN/Inf from the model (reports written, one line), 4 not within ``--completeness-tol`` by the accuracy
        verdict (reports written, one line), 130 interrupted, 141 stdout closed by its reader.

    Example::

        >>> main(["show", "ig_report.json"])  # doctest: +SKIP
        0
    """
    interrupts = Interrupts.install()  # first: from here on Ctrl-C is one line and status 130
    if sys.stdout is None:  # file descriptor 1 closed when the process started (cron, a daemon): print() drops text
        sys.stdout = _ClosedStdout()  # and the commands say what a full disk makes them say
    stderr, sys.stderr = sys.stderr, _Stderr(sys.stderr)
    try:
        with _escaped_output():
            return _main(argv, interrupts)
    finally:
        sys.stderr = stderr


class _ClosedStdout(io.TextIOBase):
    def write(self, text: str) -> int:
        raise OSError("stdout is closed")


class _Stderr(io.TextIOBase):
    """stderr that cannot fail: a line it cannot take (closed by ``2>&-``, a full disk) is dropped; it never changes
    the status (a failed print made 2 or 4 a 1) nor goes to stdout (where ``print(file=None)`` writes)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: closed at the start (None)
            self.stream.write(text)
            self.stream.flush()
        return len(text)

    def isatty(self) -> bool:  # the progress line is rewritten in place on a terminal
        with contextlib.suppress(ValueError, AttributeError):  # closed (ValueError) or None at the start
            return bool(self.stream.isatty())
        return False


@contextlib.contextmanager
def _escaped_output() -> Iterator[None]:
    """A character stdout's encoding lacks (a feature name in an ASCII-only terminal) is printed as an escape
    (``\\u00e9``), never a failure after the reports are written; the stream's own setting comes back after."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    errors = getattr(sys.stdout, "errors", None)
    if reconfigure is not None and errors is not None:
        reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        if reconfigure is not None and errors is not None:
            with contextlib.suppress(OSError, ValueError):  # a stream closed since, a closed pipe
                reconfigure(errors=errors)


def _main(argv: Sequence[str] | None, interrupts: Interrupts) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        print(one_line(error), file=sys.stderr)
        return EXIT_USAGE
    progress = Progress(sys.stderr, enabled=not getattr(args, "quiet", False))
    try:
        with progress:
            status = _run_command(args, progress, interrupts)
        sys.stdout.flush()  # a closed pipe is found here, not at the interpreter's exit
        return status
    except KeyboardInterrupt:  # only while writing (see interrupts), or where no handler could be installed
        print(interrupts.line, file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (`| head`): quiet, as cat and grep
        with contextlib.suppress(OSError, ValueError):  # nothing more reaches it, not even the final flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    except Exception as error:
        status, line = _failure(error, args.command)
        if args.debug and status == EXIT_FAILURE:  # a bug's traceback; a mistake (2) or NaN/Inf (3) keeps its status
            raise
        print(line, file=sys.stderr)
        return status


def _run_command(args: argparse.Namespace, progress: Progress, interrupts: Interrupts) -> int:
    # imported here: diag pulls in torch, and `--help` or a bad flag should not wait for it
    if args.command == "show":
        from lightning_ig.cli.show import run_show  # noqa: PLC0415

        return run_show(args)
    from lightning_ig.cli.diag import run_diag  # noqa: PLC0415

    return run_diag(args, progress, interrupts)


_ALLOCATION_FAILED = "can't allocate memory"
# The engine's option with its value (method='kink_midpoint' is diag's --method kink_midpoint), or n_steps alone.
_OPTION = re.compile(r"\b(n_steps|(?:method|gradient|backend|internal_batch_size|target)(?==))(?:=('?)([\w.]+)\2)?")
_FLAGS = {"n_steps": "--num-steps", "internal_batch_size": "--internal-batch-size"}  # else --NAME


def _failure(error: Exception, command: str) -> tuple[int, str]:
    """The exit status and the one line for a failure."""
    message = one_line(error) or type(error).__name__
    # The engine's errors name its options: said as diag's flags. diag's own name its flags already, and the user's
    # paths, which stay as typed (a sweep's folder "n_steps=64")
    if command == "diag" and not isinstance(error, (UsageError, NonFiniteError)):
        message = _OPTION.sub(lambda m: _FLAGS.get(m[1], f"--{m[1]}") + (f" {m[3]}" if m[3] else ""), message)
    prefix = f"{PROG} {command}"
    if isinstance(error, NonFiniteError):
        return EXIT_NON_FINITE, f"{prefix}: error: {message}"
    if isinstance(error, (UsageError, ValueError, TypeError, OSError)) or "CuPy" in message:
        # Library argument checks (checkpoint, engine, report) say what was wrong and what to do;
        # backend='cuda' without CuPy is the user's set-up, not a bug.
        return EXIT_USAGE, f"{prefix}: error: {message}"
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or _ALLOCATION_FAILED in message:
        # torch's CPU allocator says so in a RuntimeError: a size the user asked for (--auto-samples 10**11
        # --replace), not a bug
        return EXIT_USAGE, (
            f"{prefix}: error: out of memory ({message}); ask for less: fewer --auto-samples or "
            "--num-steps, or a smaller --internal-batch-size N"
        )
    return (
        EXIT_FAILURE,
        f"{prefix}: unexpected {type(error).__name__}: {message} (rerun with --debug for the traceback)",
    )
