"""The ``lightning-ig`` command line: sub-commands, flags, their types and help."""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

from lightning_ig._json import parse_json
from lightning_ig._version import __version__
from lightning_ig.cli.exits import PROG, UsageError
from lightning_ig.vocabulary import (  # torch-free: --help answers without loading torch
    AUTO_METHOD,
    BACKENDS,
    GRADIENTS,
    TARGET_NAMES,
    action_index,
    check_int,
    check_method,
    check_n_steps,
    check_positive_float,
    check_positive_int,
)

__all__ = ["EXIT_STATUS_HELP", "baseline_path", "build_parser"]

EXIT_STATUS_HELP = """\
exit status:
  0    every report written; the model's outputs were finite (where every state is
       degenerate, |F(x) - F(b)| too small for a ratio, it says "no state could be
       checked", never 0%)
  1    an unexpected failure (a bug): rerun with --debug for the traceback
  2    a mistake in the command line or its inputs, or a forward that gives different
       values for the same state (dropout, batch-norm in train mode, noise left on):
       one line on stderr, no report written
  3    the model produced NaN/Inf on some states: the reports are still written (their
       "non_finite_states" lists those states) and one line on stderr says how many
       and the first
  4    the attributions are not within --completeness-tol: the worst estimated
       attribution error or mass-relative completeness error over the states away
       from the baseline is above sqrt(2) x TOL (with --num-steps auto, the default:
       still so where its refinement stopped: 504 nodes, within its bound, 512); the
       reports are written and one line on stderr names the figure (3 wins when both
       apply)
  130  interrupted (Ctrl-C): one line on stderr says whether the reports were written
       (all of them) or not (none)
  141  stdout closed by its reader (| head): nothing said, as cat or grep; the reports
       are written before diag prints
  The status is the work's: a stdout that cannot take the summary (a full disk) is
  one line on stderr and leaves it as it is.

outputs: every file diag writes (--output, each --all-heads report, each --saliency
picture) is checked, all together, before anything is loaded: none may be the
checkpoint, a states, baseline, groups or feature-names file (by any name: a symbolic
or a hard link), two may not be the same file, none may be a folder, a device or a
FIFO, and their folders must exist (--saliency DIR is made). A symbolic link named by
--output is written through to its target; the names diag makes up (saliency.png,
ig_report.<head>.json, the default ig_report.json) are never written through a link:
an existing link there is refused. Without --output, an existing ./ig_report.json is
never replaced: diag stops (exit 2); name it with --output to replace it. A new file
gets the usual mode (0666 minus the umask), an overwritten one keeps its mode (never
setuid or writable by everyone); the files of a run are written all or none, so
readers never see half of one."""

AUTO_SAMPLES, SEED = 16, 42  # --states auto's sample: its size and seed by default
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|[-+]?(nan|inf|infinity)", re.ASCII | re.IGNORECASE)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: ...)`` where there is a default worth showing (not None, not an off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False) or "default" in text or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line on stderr (with the usual exit status 2)."""

    # typeshed overloads this method by its namespace's type; one signature is all the commands use
    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:  # type: ignore[override]
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and " " in self.prog:  # a command's flag mistyped: said with the command's help and the nearest flag
            close = difflib.get_close_matches(extra[0].split("=")[0], re.findall(r"--[\w-]+", self.format_help()), 1)
            self.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {close[0]}?)" if close else ""))
        return parsed, extra

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument (--[\w-]+)(?:/[^:]*)?: \1 ", r"\1 ", message)  # the flag once (_checked)
        message = re.sub(
            r"^(argument (--[\w-]+).*: expected one argument)$", r"\1 (a value starting with '-': \2=VALUE)", message
        )
        raise UsageError(f"{self.prog}: error: {message}; see `{self.prog} --help`")


# argument types: text parsed here, then the shared checks of lightning_ig.vocabulary; each raises
# ArgumentTypeError, which argparse turns into one line naming the flag


def _checked(parse: Callable[[str], Any], check: Callable[..., Any], expected: str, **bounds: Any) -> Any:
    """An argparse type for one flag: ``parse`` the text (else "expected ``expected``"), then the shared ``check``. The
    check's message names the flag (``--top-k must be an int >= 1, got 0``); :meth:`_Parser.error` drops argparse's own
    ``argument --top-k:`` before it, so the line names the flag once."""

    def for_flag(flag: str) -> Callable[[str], Any]:
        def convert(text: str) -> Any:
            try:
                value = parse(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
            try:
                return check(value, flag, **bounds)
            except (TypeError, ValueError) as error:
                raise argparse.ArgumentTypeError(str(error)) from None

        return convert

    return for_flag


def _whole(text: str) -> int:
    """A whole number as typed: digits 0-9 after an optional '-'; not int()'s " 3", "+3", "1_0" or other scripts'."""
    if not (text.isascii() and text.removeprefix("-").isdigit()):
        raise ValueError(text)
    return int(text)


def _number(text: str) -> float:
    """A number as typed: [-]digits[.digits][e[+-]digits] in 0-9, nan or inf; not float()'s " 3", "+3" or "1_0"."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return float(text)


def baseline_path(text: str) -> str | None:
    """``--baseline`` when it names a file: neither ``zeros``, ``mean`` nor a number (:func:`_number`)."""
    return None if text in ("zeros", "mean") or _NUMBER.fullmatch(text) else text


def _int_or_auto(text: str) -> int | str:
    return text if text in ("auto", "budget") else _whole(text)


_positive_int = _checked(_whole, check_positive_int, "a whole number >= 1")
_count = _checked(_whole, check_int, "a whole number >= 0", minimum=0)
_seed = _checked(_whole, check_int, "a whole number", minimum=0, maximum=2**63 - 1)
_positive_float = _checked(_number, check_positive_float, "a number > 0")
_num_steps = _checked(_int_or_auto, check_n_steps, "a whole number >= 1, 'budget' or 'auto'")
_method = _checked(str, check_method, "a quadrature rule")  # auto, kink_midpoint or one of METHODS


def _target(text: str) -> str:
    if text in TARGET_NAMES or action_index(text) is not None:  # N or action:N as Target.parse reads it
        return text  # as typed, for the messages (--target 007, not --target 7)
    raise argparse.ArgumentTypeError(
        f"expected 'mean', 'each', 'contrast', an action index N or 'action:N' (N = 0, 1, 2, ... in digits 0-9), "
        f"got {text!r}"
    )


def _model_kwargs(text: str) -> dict[str, Any]:
    try:
        value = parse_json(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error.msg} at column {error.colno}): {text!r}") from None
    except ValueError as error:  # too deep, or an integer of thousands of digits
        raise argparse.ArgumentTypeError(f"not valid here ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"state_dim\": 4}}', got {text!r}")
    return value


def _import_path(text: str) -> str:
    module, colon, name = text.partition(":")
    if not colon or not all(part.isidentifier() for part in [*module.split("."), *name.split(".")]):
        raise argparse.ArgumentTypeError(f"expected package.module:Class (Python names), got {text!r}")
    return text


# ---------------------------------------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    """The ``lightning-ig`` argument parser (``diag`` and ``show`` sub-commands).

    Returns:
        The parser; each sub-command sets ``command`` to its name (``"diag"`` or ``"show"``).

    Example::

        >>> args = build_parser().parse_args(["show", "ig_report.json"])
        >>> args.command, args.reports
        ('show', ['ig_report.json'])
    """
    parser = _Parser(
        prog=PROG,
        description="Integrated Gradients reports for saved Q-networks (lightning-ig).",
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_diag(commands)
    _add_show(commands)
    return parser


def _add_diag(commands: Any) -> None:
    diag = commands.add_parser(
        "diag",
        help="run IG on a checkpoint and write a JSON report",
        description=(
            "Rebuild the model of a safetensors checkpoint, switch NoisyNet noise off, run Integrated\n"
            "Gradients on held-out states and write the schema-version-1 JSON report. The same checkpoint,\n"
            "states and settings give a bit-identical report. The checkpoint is data: only registered\n"
            "architectures are built from its metadata, no bigger than the tensors it stores; an import path\n"
            "is followed only with --model or --trust-remote-code."
        ),
        epilog=EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
    )
    source = diag.add_argument_group("model")
    source.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="safetensors checkpoint (or a Lightning .ckpt with --lightning-module)",
    )
    heads = source.add_mutually_exclusive_group()
    heads.add_argument(
        "--head", metavar="NAME", help="in a merged file, the head to load (its tensors are under NAME__)"
    )
    heads.add_argument(
        "--prefix", metavar="STR", help="in a merged file, the key prefix of a head to load (e.g. trending__)"
    )
    heads.add_argument(
        "--all-heads",
        action="store_true",
        help="run every head of a merged file; writes one schema-v1 report per head, OUTPUT with .<head> before its "
        "suffix (ig_report.trending.json, ...), all or none",
    )
    kinds = source.add_mutually_exclusive_group()
    kinds.add_argument(
        "--model",
        type=_import_path,
        metavar="package.module:Class",
        help="architecture, for files that do not name theirs (or to override it); imported because you name it",
    )
    kinds.add_argument(
        "--lightning-module",
        type=_import_path,
        metavar="package.module:Class",
        help="read CHECKPOINT as a Lightning .ckpt through this LightningModule's load_from_checkpoint; a .ckpt is "
        "a pickle, which can run code: only for files you made",
    )
    source.add_argument(
        "--model-kwargs",
        type=_model_kwargs,
        metavar="JSON",
        help="constructor keyword arguments for --model (a JSON object)",
    )
    source.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the checkpoint's metadata name an unregistered architecture by import path (package.module:Class, "
        "its own or one its config names) and import it, which runs that module's code; without it only registered "
        "architectures are built from a file. Only for files whose origin you trust",
    )

    data = diag.add_argument_group("states")
    data.add_argument(
        "--states",
        default="auto",
        metavar="auto|PATH",
        help="'auto' samples --auto-samples states from those stored in the checkpoint (or in <name>.states.* / "
        'states.* beside it); PATH is .json {"states": [[...], ...]}, .npy or .safetensors, used whole; '
        "states are converted to the model's dtype",
    )
    data.add_argument(
        "--auto-samples",
        type=_positive_int("--auto-samples"),
        metavar="N",
        help=f"how many states --states auto samples (default: {AUTO_SAMPLES}, or every stored state where fewer)",
    )
    data.add_argument(
        "--replace",
        action="store_true",
        help="let --states auto sample with replacement when N exceeds the stored states",
    )
    data.add_argument(
        "--seed", type=_seed("--seed"), default=SEED, help="seed of the --states auto sample (a private generator)"
    )
    data.add_argument(
        "--feature-names",
        metavar="PATH",
        help="JSON array of one distinct, printable name per feature (default: the checkpoint's, else x0, x1, ...)",
    )

    ig = diag.add_argument_group("integrated gradients")
    ig.add_argument(
        "--num-steps",
        type=_num_steps("--num-steps"),
        default="auto",
        metavar="N|budget|auto",
        help="quadrature steps; 'auto' (default): the kink rule at 56 nodes, then the states whose error figures are "
        "above half of --completeness-tol (a quarter, and the kink rule's corrections too, after the kink rule) "
        "refined by tripling the midpoint nodes, up to 512 (56, 168, 504 on any device; the report's num_steps says "
        "the most any state used); 'budget': 256, 128 or 64, the most the device runs in about the time of its "
        "launches (the kink rule's 56 or 112 where that is 64 or 128)",
    )
    ig.add_argument(
        "--method",
        type=_method("--method"),
        default=AUTO_METHOD,
        metavar="RULE",
        help="quadrature rule: auto (default: kink_midpoint at 128 steps or fewer, else riemann_middle, which "
        "--num-steps auto refines with; the report's method is the first), kink_midpoint (midpoints, certified kink "
        "corrections), or Captum's riemann_middle, riemann_left, riemann_right, riemann_trapezoid, gausslegendre",
    )
    ig.add_argument("--gradient", choices=GRADIENTS, default="autograd", help="how path gradients are computed")
    ig.add_argument(
        "--baseline",
        default="zeros",
        metavar="zeros|mean|NUMBER|PATH",
        help="zeros, the mean of the states, a constant, or a states file with one baseline (or one per state)",
    )
    ig.add_argument(
        "--target",
        type=_target,
        default="mean",
        metavar="mean|N|action:N|each|contrast",
        help="the scalar attributed: mean Q over actions (V(s) for a dueling network), action N, 'each' (every "
        "action's Q in one batched run: the report's 'actions' key, beside V(s)'s contract keys) or 'contrast' "
        "(per state, the greedy action's Q minus the runner-up's, both chosen at the state: 'why this action')",
    )
    ig.add_argument(
        "--completeness-tol",
        type=_positive_float("--completeness-tol"),
        default=0.01,
        metavar="TOL",
        help="the accuracy asked for: the run is 'within tol' when its worst estimated attribution error and its "
        "worst mass-relative completeness error (over the states away from the baseline) are <= sqrt(2) x TOL; "
        "otherwise diag exits with status 4 (the reports are written)",
    )
    ig.add_argument(
        "--verify",
        type=_positive_int("--verify"),
        default=None,
        metavar="N",
        help="attribute the first N states again against a high-resolution reference (the exact line for "
        "Linear/Conv2d/ReLU networks, else 8192 float64 midpoint steps) and report each state's true error beside "
        "the estimate (the report's 'verify' key); costs tens to thousands of gradients per state",
    )
    ig.add_argument(
        "--internal-batch-size",
        type=_positive_int("--internal-batch-size"),
        default=None,
        metavar="N",
        help="rows per forward pass (default: chosen from the free memory)",
    )
    ig.add_argument("--device", default="cpu", help="where to run: cpu, cuda, cuda:1, ...")
    ig.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="IG kernels: CUDA (CuPy) or torch; auto picks CUDA on a CUDA device",
    )

    out = diag.add_argument_group("output")
    out.add_argument(
        "--output",
        metavar="PATH",
        help="the JSON report (checked first, written atomically; an existing file named here is replaced); default: "
        "ig_report.json in the working folder, which is never replaced: diag stops (exit 2) if it exists",
    )
    out.add_argument(
        "--top-k", type=_positive_int("--top-k"), default=10, metavar="K", help="features listed in top_10_by_mean_abs"
    )
    out.add_argument(
        "--feature-groups",
        metavar="channels|features|PATH",
        help="also report feature groups (the report's 'groups': a group's attribution is the sum of its members'): "
        "'channels' (dim 0 of (C, H, W) or (C, L) states; named by the stored names' '<name>[...]'), 'features', "
        'or a JSON file holding {"name": [flat indices], ...}, {"name": nested true/false mask shaped like a state, '
        "...} or an integer mask shaped like a state (equal ids form a group)",
    )
    out.add_argument(
        "--saliency",
        metavar="DIR",
        help="also write saliency PNGs of the report's states to DIR (created if missing, checked first): "
        "saliency.png (each state with its signed attribution over it) and saliency_mean_abs.png (mean |attribution| "
        "per channel); with --all-heads, saliency.<head>.png, ...; needs states with spatial dims, (C, H, W) or (C, L)",
    )
    out.add_argument("--quiet", action="store_true", help="no progress or summary lines")
    out.add_argument("--debug", action="store_true", help="show the traceback of an unexpected failure")


def _add_show(commands: Any) -> None:
    show = commands.add_parser(
        "show",
        help="print a report as a table",
        description="Print the top features and the completeness figures of lightning-ig JSON reports.",
        epilog="exit status: 0 printed (a part missing from a report is said, not fatal), "
        "2 a file that is not a readable lightning-ig report or a stdout that cannot take the table (one line on "
        "stderr), 130 interrupted, 141 stdout closed by its reader (| head: nothing said, as cat).",
        formatter_class=_HelpFormatter,
    )
    show.add_argument(
        "reports", nargs="+", metavar="REPORT.json", help="reports written by lightning-ig diag (or the callback)"
    )
    show.add_argument("--top", type=_positive_int("--top"), default=10, metavar="K", help="how many features to list")
    show.add_argument(
        "--worst-states",
        type=_count("--worst-states"),
        default=5,
        metavar="N",
        help="how many states with the largest estimated attribution error (the verdict's figure) to list",
    )
    show.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
