"""The ``lightning-ig`` command: Integrated Gradients reports for saved Q-networks.

``lightning-ig diag`` rebuilds a model from a safetensors checkpoint (see
:mod:`lightning_ig.checkpoint`), switches its NoisyNet noise off, runs
Integrated Gradients on held-out states and writes the schema-version-1 JSON
report (see :mod:`lightning_ig.views.report`). ``lightning-ig show`` prints a report
as a table. Run ``lightning-ig diag --help`` for every flag.

Where the states come from: ``--states auto`` samples ``--auto-samples`` (16)
states without replacement, with a private generator seeded by ``--seed`` (42),
from the states stored in the checkpoint (``__states__``, or the head's own
``<head>____states__``), else from ``<name>.states.{safetensors,npy,json}`` or
``states.{...}`` beside it; the report records the indices drawn
(``state_indices``). ``--states PATH`` uses every state in the file. States are
converted to the model's dtype (float64 states for a float32 model work).

Merged files: ``--head NAME`` (or ``--prefix NAME__``) attributes one head; a
prefix must name a whole head (the error lists the heads). ``--all-heads``
attributes each head and writes **one report per head**, named after
``--output`` with the head before the suffix (``ig_report.json`` ->
``ig_report.trending.json``, ``ig_report.ranging.json``). One file per head
keeps every report a plain schema-version-1 document (``regime_head`` names its
head), so consumers of single reports read them unchanged. Every head is
checked before the first IG run and all reports are written at the end: a
mistake in any head writes none.

Inputs: every path (``--checkpoint``, ``--states``, ``--baseline``,
``--feature-names``, ``--feature-groups``) must be a regular file, checked before
anything is read; a folder, a FIFO, a device, a symbolic-link loop or a missing
file is one line naming which. Work the user sizes (``--auto-samples``, the states
of a file, ``--num-steps``) must fit in the memory available: said before it is
allocated, never left to the out-of-memory killer.

Images, wide vectors and ensembles: ``--feature-groups channels|features|PATH``
adds the report's ``groups`` (a group's attribution is the sum of its members',
so completeness holds per group too); PATH is a JSON file holding
``{"name": [flat indices], ...}``, ``{"name": nested true/false mask, ...}`` or an
integer mask shaped like one state (Captum's ``feature_mask``).
``--saliency DIR`` also writes ``saliency.png`` (the report's states with their
signed attributions blended over them) and ``saliency_mean_abs.png`` for states
with spatial dimensions, ``(C, H, W)`` or ``(C, L)``. A checkpoint of an
:class:`~lightning_ig.ensemble.Ensemble` is attributed as its aggregate (target
``output``); every member's own signal is attributed too, in one batched run,
and summarized under the report's ``ensemble`` key (agreement with the
aggregate, per-member completeness and top features).

Outputs are one plan, checked before anything is loaded: every file diag will
write (``--output``, each ``--all-heads`` report, each ``--saliency`` picture)
may not be the checkpoint, a states, baseline, groups or feature-names file (by
any name: a symbolic or a hard link), two may not be the same file, none may be
a folder (``dir/`` included), a device or a FIFO, and their folders must exist
and be writable (the ``--saliency`` folder is made once the plan passed). A
symbolic link named by ``--output`` is written through to its target; the names
diag makes up (``saliency.png``, ``ig_report.<head>.json``, the default
``ig_report.json``) are never written through a link (one found there is
refused). Without ``--output`` an existing ``./ig_report.json`` is never
replaced: status 2, name it with ``--output`` to replace it. The files of a run
(every report and picture) are written all or none: each to a temporary file
beside it, then all renamed at the end; a full disk, Ctrl-C, SIGTERM or SIGHUP
before the renames leaves none of them and no temporary file. A new file gets
``0o666 & ~umask``, an overwritten one its old mode less setuid, setgid, sticky
and others' write.

Trust: a model whose forward or attributions are NaN/Inf on some states is never
reported as clean. The reports are still written (a user debugging a diverged run
wants them): the extra key ``non_finite_states`` lists those states, beside the
schema-v1 keys, and the command exits with status 3 and one line saying how many
states and the first. When every state is degenerate (``|F(x) - F(b)|`` too small
for a ratio) the summary says "no state could be checked", never "0%". A forward
that gives different values for the same state (dropout or batch-norm in train
mode, noise the CLI cannot switch off) is refused: status 2, one line naming the
likely cause, no report.

Hostile input: what a file holds (a report's names, a checkpoint's metadata, a
path) is printed as text, its control characters escaped (``\x1b``, ``\u202e``;
:mod:`.terminal`); JSON of any depth, integers of any size and values of the
wrong kind (``true`` among the states, ``"schema_version": true``) are one line
and status 2, like every other mistake in the inputs.

Exit status:

=====  ========================================================================
0      every report written; the model's outputs and attributions were finite
1      an unexpected failure (a bug): rerun with ``--debug`` for the traceback
2      a mistake in the command line or its inputs, or a stochastic forward:
       one line on stderr says what was wrong and what to do; no report written
3      the model produced NaN/Inf on some states: reports written (with
       ``non_finite_states``), one line on stderr
4      not within ``--completeness-tol`` by the accuracy verdict (the worst
       estimated attribution error or mass-relative completeness error over
       the states away from the baseline above sqrt(2) x tol): reports written,
       one line on stderr names the figure
130    interrupted (Ctrl-C), at any moment: one line on stderr saying whether the
       reports were written (all of them) or not (none)
141    stdout was closed by its reader (``| head``): nothing said, as ``cat`` or
       ``grep`` (128 + SIGPIPE); diag's reports are written before it prints
=====  ========================================================================

The status is the work's: 0, 3 and 4 say the reports are written, 2 and 130
(before the renames) that none is. Printing is not diag's work: a stdout that
cannot take the summary (a full disk) leaves the status as it is, with one line
on stderr, and a character the stdout's encoding lacks is printed as an escape.
For ``show`` the printing is the work: a stdout that cannot take it is status 2.

The parts: :mod:`.parser` (flags and help), :mod:`.diag` (the diag command's
steps), :mod:`.head_inputs` (one head's checked inputs), :mod:`.feature_groups`
(``--feature-groups``), :mod:`.show` (reading
and printing reports), :mod:`.progress`, :mod:`.interrupts` (Ctrl-C),
:mod:`.exits` (statuses and the user-mistake error).

Example::

    lightning-ig diag --checkpoint q.safetensors --states auto --output ig_report.json
    lightning-ig diag --checkpoint minatar.safetensors --feature-groups channels --saliency saliency/
    lightning-ig show ig_report.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from lightning_ig.cli.exits import (
    EXIT_CLOSED_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NON_FINITE,
    EXIT_NOT_WITHIN,
    EXIT_OK,
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

__all__ = [
    "EXIT_CLOSED_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NON_FINITE",
    "EXIT_NOT_WITHIN",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lightning-ig`` command.

    Args:
        argv: The arguments after the program name; default ``None`` reads ``sys.argv[1:]``.

    Returns:
        The exit status: 0 ok, 1 an unexpected failure, 2 a user mistake or a stochastic
        forward (one line on stderr), 3 NaN/Inf from the model (reports written, one line),
        4 not within ``--completeness-tol`` by the accuracy verdict (reports written, one line), 130 interrupted,
        141 stdout closed by its reader.

    Example::

        >>> main(["show", "ig_report.json"])  # doctest: +SKIP
        0
    """
    interrupts = Interrupts.install()  # first: from here on Ctrl-C is one line and status 130
    try:
        with _escaped_output():
            return _main(argv, interrupts)
    finally:
        interrupts.restore()


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
        if args.debug and not isinstance(error, (UsageError, NonFiniteError)):
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


def _failure(error: Exception, command: str) -> tuple[int, str]:
    """The exit status and the one line for a failure."""
    message = one_line(error) or type(error).__name__
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
