"""The ``lightning-ig`` command: Integrated Gradients reports for saved Q-networks.

``lightning-ig diag`` rebuilds a model from a safetensors checkpoint (see
:mod:`lightning_ig.checkpoint`), switches its NoisyNet noise off, runs
Integrated Gradients on held-out states and writes the schema-version-1 JSON
report (see :mod:`lightning_ig.report`). ``lightning-ig show`` prints a report
as a table. Run ``lightning-ig diag --help`` for every flag.

Where the states come from: ``--states auto`` samples ``--auto-samples`` (16)
states without replacement, with a private generator seeded by ``--seed`` (42),
from the states stored in the checkpoint (``__states__``, or the head's own
``<head>____states__``), else from ``<name>.states.{safetensors,npy,json}`` or
``states.{...}`` beside it; the report records the indices drawn
(``state_indices``). ``--states PATH`` uses every state in the file.

Merged files: ``--head NAME`` (or ``--prefix NAME__``) attributes one head;
``--all-heads`` attributes each head and writes **one report per head**, named
after ``--output`` with the head before the suffix (``ig_report.json`` ->
``ig_report.trending.json``, ``ig_report.ranging.json``). One file per head
keeps every report a plain schema-version-1 document (``regime_head`` names its
head), so consumers of single reports read them unchanged. Every head is
checked before the first IG run and all reports are written at the end: a
mistake in any head writes none.

Exit status: 0 on success, 2 for a mistake in the command line or its inputs
(one line on stderr says what was wrong and what to do; no output file is
written), 1 for an unexpected failure (rerun with ``--debug`` for the traceback).

Example::

    lightning-ig diag --checkpoint q.safetensors --states auto --output ig_report.json
    lightning-ig show ig_report.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Sequence, TextIO

if TYPE_CHECKING:  # the heavy imports happen inside the commands, so `--help` is fast
    import torch

__all__ = ["main", "build_parser", "UsageError"]

PROG = "lightning-ig"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
_METHODS = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid")
_PROGRESS_AFTER_S = 3.0  # say nothing for quick runs
_PROGRESS_EVERY_S = 5.0


class UsageError(Exception):
    """A user mistake: the CLI prints its message as one line and exits with status 2."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: ...)`` where there is a default worth showing (not None, not an off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False) or "default" in text or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line on stderr (with the usual exit status 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}; see `{self.prog} --help`")


# --------------------------------------------------------------------------------------------------
# argument types: each raises ArgumentTypeError, which argparse turns into a one-line error


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _num_steps(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 or 'auto', got {text!r}") from None


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**63), got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _target(text: str) -> str | int:
    if text == "mean":
        return "mean"
    body = text[len("action:") :] if text.startswith("action:") else text
    try:
        index = int(body)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'mean', an action index N or 'action:N', got {text!r}") from None
    if index < 0:
        raise argparse.ArgumentTypeError(f"an action index must be >= 0, got {index}")
    return index


def _model_kwargs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error.msg} at column {error.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"state_dim\": 4}}', got {text!r}")
    return value


def _import_path(text: str) -> str:
    module, colon, name = text.partition(":")
    if not colon or not module or not name:
        raise argparse.ArgumentTypeError(f"expected package.module:Class, got {text!r}")
    return text


# --------------------------------------------------------------------------------------------------
# the parser


def build_parser() -> argparse.ArgumentParser:
    """The ``lightning-ig`` argument parser (``diag`` and ``show`` sub-commands).

    Returns:
        The parser; each sub-command sets ``handler`` to the function that runs it.
    """
    from lightning_ig import __version__  # noqa: PLC0415

    parser = _Parser(
        prog=PROG,
        description="Integrated Gradients reports for saved Q-networks (lightning-ig).",
        epilog="Exit status: 0 ok, 2 a mistake in the command or its inputs (one line on stderr), 1 an unexpected failure.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    diag = commands.add_parser(
        "diag",
        help="run IG on a checkpoint and write a JSON report",
        description=(
            "Rebuild the model of a safetensors checkpoint, switch NoisyNet noise off, run Integrated Gradients "
            "on held-out states and write the schema-version-1 JSON report. The same checkpoint, states and "
            "settings give a bit-identical report."
        ),
        formatter_class=_HelpFormatter,
    )
    source = diag.add_argument_group("model")
    source.add_argument("--checkpoint", required=True, metavar="PATH", help="safetensors checkpoint (or a Lightning .ckpt with --lightning-module)")
    heads = source.add_mutually_exclusive_group()
    heads.add_argument("--head", metavar="NAME", help="in a merged file, the head to load (its tensors are under NAME__)")
    heads.add_argument("--prefix", metavar="STR", help="in a merged file, the raw key prefix to load (e.g. trending__)")
    heads.add_argument(
        "--all-heads",
        action="store_true",
        help="run every head of a merged file; writes one schema-v1 report per head, OUTPUT with .<head> before its "
        "suffix (ig_report.trending.json, ...), all or none",
    )
    kinds = source.add_mutually_exclusive_group()
    kinds.add_argument("--model", type=_import_path, metavar="package.module:Class", help="architecture, for files that do not name theirs (or to override it)")
    kinds.add_argument(
        "--lightning-module", type=_import_path, metavar="package.module:Class",
        help="read CHECKPOINT as a Lightning .ckpt through this LightningModule's load_from_checkpoint",
    )
    source.add_argument("--model-kwargs", type=_model_kwargs, metavar="JSON", help="constructor keyword arguments for --model (a JSON object)")

    data = diag.add_argument_group("states")
    data.add_argument(
        "--states", default="auto", metavar="auto|PATH",
        help="'auto' samples --auto-samples states from those stored in the checkpoint (or in <name>.states.* / "
        "states.* beside it); PATH is .json {\"states\": [[...], ...]}, .npy or .safetensors, used whole",
    )
    data.add_argument("--auto-samples", type=_positive_int, default=16, metavar="N", help="how many states --states auto samples")
    data.add_argument("--replace", action="store_true", help="let --states auto sample with replacement when N exceeds the stored states")
    data.add_argument("--seed", type=_seed, default=42, help="seed of the --states auto sample (a private generator)")
    data.add_argument("--feature-names", metavar="PATH", help="JSON array of one name per feature (default: the checkpoint's, else f0, f1, ...)")

    ig = diag.add_argument_group("integrated gradients")
    ig.add_argument("--num-steps", type=_num_steps, default=50, metavar="N|auto", help="quadrature steps, or 'auto' to refine until --completeness-tol is met")
    ig.add_argument("--method", choices=_METHODS, default="gausslegendre", help="quadrature rule (Captum's names)")
    ig.add_argument("--gradient", choices=("autograd", "finite_difference"), default="autograd", help="how path gradients are computed")
    ig.add_argument("--baseline", default="zeros", metavar="zeros|mean|NUMBER|PATH", help="zeros, the mean of the states, a constant, or a states file with one baseline (or one per state)")
    ig.add_argument("--target", type=_target, default="mean", metavar="mean|N", help="the scalar attributed: mean Q over actions (V(s) for a dueling network) or action N")
    ig.add_argument("--completeness-tol", type=_positive_float, default=0.01, metavar="TOL", help="relative completeness error --num-steps auto aims for; larger ones are warned about")
    ig.add_argument("--internal-batch-size", type=_positive_int, default=None, metavar="N", help="rows per forward pass (default: chosen from the free memory)")
    ig.add_argument("--device", default="cpu", help="where to run: cpu, cuda, cuda:1, ...")
    ig.add_argument("--backend", choices=("auto", "cuda", "torch"), default="auto", help="IG kernels: CUDA (CuPy) or torch; auto picks CUDA on a CUDA device")

    out = diag.add_argument_group("output")
    out.add_argument("--output", default="ig_report.json", metavar="PATH", help="the JSON report (written atomically)")
    out.add_argument("--top-k", type=_positive_int, default=10, metavar="K", help="features listed in top_10_by_mean_abs")
    out.add_argument("--quiet", action="store_true", help="no progress or summary lines")
    out.add_argument("--debug", action="store_true", help="show the traceback of an unexpected failure")
    diag.set_defaults(handler=_run_diag)

    show = commands.add_parser(
        "show", help="print a report as a table",
        description="Print the top features and the completeness figures of lightning-ig JSON reports.",
        formatter_class=_HelpFormatter,
    )
    show.add_argument("reports", nargs="+", metavar="REPORT.json", help="reports written by lightning-ig diag (or the callback)")
    show.add_argument("--top", type=_positive_int, default=10, metavar="K", help="how many features to list")
    show.add_argument("--worst-states", type=int, default=5, metavar="N", help="how many states with the largest completeness error to list")
    show.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    show.set_defaults(handler=_run_show)
    return parser


# --------------------------------------------------------------------------------------------------
# progress


class _Progress:
    """Says on stderr what is running once a stage takes more than a few seconds; silent otherwise.

    On a terminal it is one line, rewritten in place and erased before an error
    is printed, so a failed run still ends with exactly one line of stderr. In a
    log (stderr not a terminal) it prints a line every few seconds, but only for
    stages that start after every input was checked (``checked=True``), for the
    same reason.
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

    def __enter__(self) -> _Progress:
        if self._enabled:
            self._thread = threading.Thread(target=self._watch, name="lightning-ig-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._line_open:
            self._stream.write("\r\033[K")  # erase the progress line
            self._stream.flush()
        if self._spoke and exc[0] is None:
            print(f"{PROG}: done in {time.monotonic() - self._started:.0f} s", file=self._stream, flush=True)

    def stage(self, text: str, *, checked: bool = True) -> None:
        """Start a stage; ``checked=False`` while user input may still be found wrong."""
        with self._lock:
            self._stage, self._checked, self._stage_started = text, checked, time.monotonic()

    def _say(self, text: str) -> None:
        if self._interactive:
            self._stream.write(f"\r{PROG}: {text}\033[K")
            self._stream.flush()
            self._line_open = True
        else:
            print(f"{PROG}: {text}", file=self._stream, flush=True)

    def _watch(self) -> None:
        wait = _PROGRESS_AFTER_S
        while not self._done.wait(wait):
            with self._lock:
                stage, checked, elapsed = self._stage, self._checked, time.monotonic() - self._stage_started
            if stage and elapsed >= _PROGRESS_AFTER_S and (checked or self._interactive):
                self._spoke = True
                self._say(f"{stage} ... {elapsed:.0f} s")
                wait = 1.0 if self._interactive else _PROGRESS_EVERY_S
            else:
                wait = max(0.1, _PROGRESS_AFTER_S - elapsed)


# --------------------------------------------------------------------------------------------------
# diag


@dataclass
class _HeadRun:
    """One head's inputs, prepared and checked before any IG work starts."""

    label: str | None  # head name for the report's regime_head, None for a single model
    prefix: str | None
    output: Path
    model: Any
    states: Any
    feature_names: list[str]
    target: Any
    forward_target: str
    baselines: Any
    extra: dict[str, Any] = field(default_factory=dict)


def _device(text: str) -> torch.device:
    import torch  # noqa: PLC0415

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text}: torch sees no CUDA device here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {text}: there are {torch.cuda.device_count()} CUDA devices; use cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise UsageError(f"--device {text}: only cpu and cuda devices are supported")
    return device


def _head_outputs(output: Path, heads: Sequence[str]) -> list[Path]:
    suffix = output.suffix or ".json"
    stem = output.name[: -len(output.suffix)] if output.suffix else output.name
    return [output.with_name(f"{stem}.{head}{suffix}") for head in heads]


def _read_feature_names(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--feature-names {path!r} does not exist; give a JSON file holding an array of names")
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--feature-names {path!r} is not readable JSON ({error}); write a JSON array of names") from None
    if isinstance(value, dict):
        value = value.get("feature_names")
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        raise UsageError(f"--feature-names {path!r} must hold a JSON array of strings, e.g. [\"x\", \"v\"]")
    if len(set(value)) != len(value):
        repeated = sorted({name for name in value if value.count(name) > 1})
        raise UsageError(f"--feature-names {path!r} repeats {repeated}; give each feature its own name")
    return value


def _expected_width(model: Any) -> int | None:
    """The input width the model takes, if it says (``state_dim``) or its first linear layer does."""
    width = getattr(model, "state_dim", None)
    if isinstance(width, int) and not isinstance(width, bool):
        return width
    for module in model.modules():
        in_features = getattr(module, "in_features", None)
        if isinstance(in_features, int) and not isinstance(in_features, bool):
            return in_features
    return None


def _check_states(states: torch.Tensor, model: Any, where: str) -> None:
    import torch  # noqa: PLC0415

    width = _expected_width(model)
    if states.ndim == 2 and width is not None and states.shape[1] != width:
        raise UsageError(
            f"the states from {where} have {states.shape[1]} features but the model takes {width}; "
            f"give states with {width} columns (or the matching checkpoint/head)"
        )
    finite = torch.isfinite(states.reshape(states.shape[0], -1)).all(dim=1)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        shown = ", ".join(str(i) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise UsageError(f"the states from {where} hold NaN or Inf values (state {shown}); remove or fix those states")


def _sample(pool: torch.Tensor, count: int, seed: int, replace: bool, where: str) -> tuple[torch.Tensor, list[int]]:
    import torch  # noqa: PLC0415

    available = pool.shape[0]
    generator = torch.Generator().manual_seed(seed)  # private: the global generators are left alone
    if count > available and not replace:
        raise UsageError(
            f"--auto-samples {count} is more than the {available} states stored in {where}; "
            f"pass --auto-samples {available} or fewer, or --replace to sample with replacement"
        )
    if replace:
        indices = torch.randint(available, (count,), generator=generator)
    else:
        # sorted, so that state_idx in the report follows the stored order
        indices = torch.randperm(available, generator=generator)[:count].sort().values
    return pool[indices], indices.tolist()


def _baseline(text: str, states: torch.Tensor) -> tuple[Any, str]:
    import torch  # noqa: PLC0415

    from lightning_ig.checkpoint import load_states  # noqa: PLC0415

    if text in ("zeros", "mean"):
        return text, text
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value):
            raise UsageError(f"--baseline {text!r} is not finite; give zeros, mean, a finite number or a states file")
        return value, f"constant:{value!r}"
    if not Path(text).exists():
        raise UsageError(f"--baseline {text!r} is neither zeros, mean, a number nor an existing file; give one of those")
    baselines = load_states(text)
    if baselines.shape[0] == 1:
        baselines = baselines[0]
    if baselines.shape not in (states.shape, states.shape[1:]):
        raise UsageError(
            f"--baseline {text!r} has shape {tuple(baselines.shape)}; give one baseline of shape {tuple(states.shape[1:])} "
            f"or one per state, {tuple(states.shape)}"
        )
    if not bool(torch.isfinite(baselines).all()):
        raise UsageError(f"--baseline {text!r} holds NaN or Inf values; fix the file")
    return baselines, f"file:{text}"


def _load(args: argparse.Namespace, prefix: str | None, device: torch.device) -> Any:
    from lightning_ig.checkpoint import CheckpointError, load_checkpoint, load_lightning_checkpoint  # noqa: PLC0415

    try:
        if args.lightning_module:
            return load_lightning_checkpoint(args.checkpoint, args.lightning_module, device=device)
        return load_checkpoint(args.checkpoint, prefix=prefix, device=device, architecture=args.model, config=args.model_kwargs)
    except CheckpointError as error:
        message = str(error)
        if Path(args.checkpoint).suffix == ".ckpt" and not args.lightning_module and "safetensors" in message:
            message += "; for a Lightning .ckpt pass --lightning-module package.module:Class"
        raise UsageError(message) from None


def _prepare_head(args: argparse.Namespace, device: torch.device, prefix: str | None, label: str | None, output: Path) -> _HeadRun:
    import torch  # noqa: PLC0415

    from lightning_ig.checkpoint import load_states, states_beside  # noqa: PLC0415

    loaded = _load(args, prefix, device)
    model = loaded.model
    model.eval()
    model.requires_grad_(False)  # gradients are taken w.r.t. the inputs only
    extra: dict[str, Any] = {"architecture": loaded.architecture, "prefix": loaded.prefix, "device": str(device), "command": "diag"}
    what = f"head {label!r} of {args.checkpoint}" if label else args.checkpoint

    if args.states == "auto":
        pool, where = loaded.states, f"{what}"
        if pool is None:
            beside = states_beside(args.checkpoint)
            if beside is None:
                raise UsageError(
                    f"no states are stored in {what} nor beside it (<name>.states.json/.npy/.safetensors); "
                    "pass --states PATH or save the checkpoint with states="
                )
            pool, where = load_states(beside, prefix=prefix), str(beside)
        pool = pool.to(device=device, dtype=torch.float32)
        _check_states(pool, model, where)
        states, indices = _sample(pool, args.auto_samples, args.seed, args.replace, where)
        extra.update({"states_source": "auto", "states_from": where, "seed": args.seed, "state_indices": indices, "replace": args.replace})
    else:
        if not Path(args.states).exists():
            raise UsageError(f"--states {args.states!r} does not exist; give a .json, .npy or .safetensors file, or 'auto'")
        states = load_states(args.states, prefix=prefix).to(device=device, dtype=torch.float32)
        _check_states(states, model, args.states)
        extra.update({"states_source": "path", "states_from": args.states})

    feature_count = int(states[0].numel())
    if args.feature_names:
        names = _read_feature_names(args.feature_names)
        if len(names) != feature_count:
            raise UsageError(
                f"--feature-names {args.feature_names!r} has {len(names)} names but the states have {feature_count} features; "
                "give one name per feature"
            )
    elif loaded.feature_names is not None:
        names = loaded.feature_names
        if len(names) != feature_count:
            raise UsageError(
                f"{what} stores {len(names)} feature names but the states have {feature_count} features; "
                "pass --feature-names PATH with one name per feature"
            )
    else:
        names = [f"f{i}" for i in range(feature_count)]

    # One forward on one state tells the output's layout, and catches a model that rejects the states.
    try:
        with torch.no_grad():
            probe = model(states[:1])
    except Exception as error:  # the model's own error: shapes, dtypes
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"the model rejects the states of shape {tuple(states.shape)} ({first_line}); check the states' width") from None
    if not isinstance(probe, torch.Tensor):
        raise UsageError(f"the model returns {type(probe).__name__}, not a tensor of Q-values; wrap it to return (N, A)")
    if probe.ndim == 1 or (probe.ndim == 2 and probe.shape[1] == 1):
        target, forward_target = None, "output"
        if args.target != "mean" and args.target != 0:
            raise UsageError(f"--target {args.target} needs a model with several outputs; this one returns one value per state")
    elif probe.ndim == 2:
        actions = probe.shape[1]
        if args.target == "mean":
            target, forward_target = "mean", "mean"
        elif args.target >= actions:
            raise UsageError(f"--target {args.target} is out of range for a model with {actions} actions; use mean or 0..{actions - 1}")
        else:
            target, forward_target = int(args.target), f"action:{args.target}"
    else:
        raise UsageError(f"the model returns shape {tuple(probe.shape)} per batch; lightning-ig diag needs (N,) or (N, A)")

    baselines, baseline_label = _baseline(args.baseline, states)
    if isinstance(baselines, torch.Tensor):
        baselines = baselines.to(device=device, dtype=torch.float32)
    extra["baseline"] = baseline_label
    return _HeadRun(label, prefix, output, model, states, names, target, forward_target, baselines, extra)


def _attribute(run: _HeadRun, args: argparse.Namespace) -> dict[str, Any]:
    from lightning_ig.attribution import integrated_gradients  # noqa: PLC0415
    from lightning_ig.noise import noise_disabled  # noqa: PLC0415
    from lightning_ig.report import build_report  # noqa: PLC0415

    with noise_disabled(run.model):
        result = integrated_gradients(
            run.model,
            run.states,
            run.baselines,
            target=run.target,
            n_steps=args.num_steps,
            method=args.method,
            gradient=args.gradient,
            internal_batch_size=args.internal_batch_size,
            backend=args.backend,
            completeness_tol=args.completeness_tol,
        )
    extra = dict(run.extra)
    extra["num_steps_requested"] = args.num_steps
    return build_report(
        result,
        feature_names=run.feature_names,
        checkpoint=args.checkpoint,
        forward_target=run.forward_target,
        regime_head=run.label,
        top_k=args.top_k,
        extra=extra,
    )


def _run_diag(args: argparse.Namespace, progress: _Progress) -> int:
    from lightning_ig.checkpoint import head_prefix, list_heads  # noqa: PLC0415
    from lightning_ig.report import write_report  # noqa: PLC0415

    output = Path(args.output)
    if output.is_dir():
        raise UsageError(f"--output {args.output!r} is a directory; give a file name such as {str(output / 'ig_report.json')!r}")
    if args.model_kwargs is not None and args.model is None:
        raise UsageError("--model-kwargs needs --model package.module:Class; add --model, or drop --model-kwargs to use the checkpoint's own config")
    if args.lightning_module and (args.head or args.prefix or args.all_heads):
        raise UsageError("--head/--prefix/--all-heads apply to merged safetensors files, not to a Lightning .ckpt; drop them")
    device = _device(args.device)
    if args.backend == "cuda" and device.type != "cuda":
        raise UsageError("--backend cuda runs on a CUDA device; add --device cuda (or use --backend auto)")

    progress.stage(f"loading {args.checkpoint}", checked=False)
    if args.all_heads:
        try:
            heads = list_heads(args.checkpoint)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if not heads:
            raise UsageError(f"{args.checkpoint} holds a single model, not several heads; drop --all-heads")
        plan = [(head_prefix(head), head, path) for head, path in zip(heads, _head_outputs(output, heads))]
    elif args.head is not None:
        try:
            prefix = head_prefix(args.head)
        except ValueError as error:
            raise UsageError(f"--head {args.head!r}: {error}") from None
        plan = [(prefix, args.head, output)]
    elif args.prefix is not None:
        label = args.prefix[:-2] if args.prefix.endswith("__") else args.prefix
        plan = [(args.prefix, label, output)]
    else:
        plan = [(None, None, output)]

    # Check every head's inputs before the first IG run, then compute all, then write all:
    # a mistake anywhere leaves no output file.
    runs = [_prepare_head(args, device, prefix, label, path) for prefix, label, path in plan]
    reports = []
    for number, run in enumerate(runs, start=1):
        which = f" head {run.label} ({number}/{len(runs)})" if len(runs) > 1 else ""
        progress.stage(f"integrated gradients on {run.states.shape[0]} states, {args.num_steps} steps{which}")
        reports.append(_attribute(run, args))
    progress.stage("writing the report")
    for run, report in zip(runs, reports):
        write_report(report, run.output)
        if not args.quiet:
            worst = report["completeness"]["worst_relative_error"]
            worst_text = "n/a" if worst is None else f"{100 * worst:.3g}%"
            print(
                f"wrote {run.output}: {report['num_states']} states, {report['state_dim']} features, "
                f"{report['num_steps']} steps, worst completeness error {worst_text}"
            )
            if worst is not None and worst > args.completeness_tol:
                print(
                    f"{PROG}: warning: worst relative completeness error {100 * worst:.3g}% exceeds "
                    f"--completeness-tol {args.completeness_tol:g}; try --num-steps auto or more steps",
                    file=sys.stderr,
                )
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# show


def _number(value: Any, width: int = 11) -> str:
    if value is None:
        return "n/a".rjust(width)
    return f"{value:{width}.4g}"


def _format_report(report: dict[str, Any], path: str, top: int, worst_states: int) -> str:
    completeness = report["completeness"]
    lines = [
        f"{path}",
        f"  checkpoint {report.get('checkpoint') or '-'}   head {report.get('regime_head') or '-'}   "
        f"target {report['forward_target']}   steps {report['num_steps']}   "
        f"states {report['num_states']}   features {report['state_dim']}"
        + (f"   method {report['method']}" if "method" in report else ""),
        "",
        "  top features by mean |attribution|",
        f"  {'rank':>4}  {'feature':<24} {'mean_abs':>11} {'stddev':>11} {'mean_signed':>11}",
    ]
    features = report["features"]
    ranked = report.get("top_10_by_mean_abs") or []
    if top > len(ranked):  # the report lists top_k; rank the full list when more are asked for
        ranked = sorted(features, key=lambda f: -(f["mean_abs"] if f["mean_abs"] is not None else -math.inf))
    for rank, feature in enumerate(ranked[:top], start=1):
        lines.append(
            f"  {rank:>4}  {str(feature['name'])[:24]:<24} {_number(feature['mean_abs'])} "
            f"{_number(feature['stddev'])} {_number(feature['mean_signed'])}"
        )
    worst = completeness.get("worst_relative_error")
    degenerate = completeness.get("num_degenerate")
    lines += [
        "",
        "  completeness: worst relative error "
        + ("n/a" if worst is None else f"{100 * worst:.4g}%")
        + (f", mean |delta| {completeness['mean_abs_error']:.3g}" if completeness.get("mean_abs_error") is not None else "")
        + (f", {degenerate} degenerate state(s)" if degenerate else ""),
    ]
    per_state = [s for s in completeness.get("per_state", []) if s.get("relative_error") is not None]
    per_state.sort(key=lambda s: -s["relative_error"])
    if per_state and worst_states > 0:
        lines.append(f"  {'state':>6} {'sum(attr)':>11} {'F(x)-F(b)':>11} {'rel.error':>11}")
        for state in per_state[:worst_states]:
            lines.append(
                f"  {state['state_idx']:>6} {_number(state['sum_attributions'])} "
                f"{_number(state['f_input_minus_f_baseline'])} {_number(state['relative_error'])}"
            )
    return "\n".join(lines)


def _run_show(args: argparse.Namespace, progress: _Progress) -> int:
    required = ("schema_version", "forward_target", "num_steps", "num_states", "state_dim", "features", "completeness")
    texts = []
    for path in args.reports:
        file = Path(path)
        if not file.is_file():
            raise UsageError(f"report {path!r} does not exist; give a JSON file written by lightning-ig diag")
        try:
            report = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"report {path!r} is not readable JSON ({error}); give a file written by lightning-ig diag") from None
        missing = [key for key in required if not isinstance(report, dict) or key not in report]
        if missing:
            raise UsageError(f"{path!r} is not a lightning-ig report (no {', '.join(missing)}); give a file written by lightning-ig diag")
        if report["schema_version"] != 1:
            raise UsageError(f"{path!r} has schema_version {report['schema_version']!r}; this lightning-ig reads version 1")
        try:
            texts.append(_format_report(report, path, args.top, args.worst_states))
        except (KeyError, TypeError, ValueError) as error:
            raise UsageError(f"{path!r} is not a well-formed lightning-ig report ({type(error).__name__}: {error})") from None
    print("\n\n".join(texts))
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# entry point


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lightning-ig`` command.

    Args:
        argv: The arguments after the program name; default ``None`` reads ``sys.argv[1:]``.

    Returns:
        The exit status: 0 ok, 2 a user mistake (one line on stderr), 1 an unexpected failure.

    Example::

        >>> main(["show", "ig_report.json"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        print(_one_line(str(error)), file=sys.stderr)
        return EXIT_USAGE
    progress = _Progress(sys.stderr, enabled=not getattr(args, "quiet", False))
    try:
        with progress:
            return args.handler(args, progress)
    except UsageError as error:
        print(f"{PROG} {args.command}: error: {_one_line(str(error))}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, TypeError, OSError) as error:
        if args.debug:
            raise
        # Library argument checks (checkpoint, engine, report) say what was wrong and what to do.
        print(f"{PROG} {args.command}: error: {_one_line(str(error)) or type(error).__name__}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; no report written", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        message = _one_line(str(error)) or type(error).__name__
        if "CuPy" in message:  # backend='cuda' on a machine without CuPy: the user's set-up, not a bug
            print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"{PROG} {args.command}: unexpected {type(error).__name__}: {message} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
