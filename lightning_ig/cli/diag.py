"""``lightning-ig diag``: check every output, prepare every head, attribute, write, say how it went.

The steps run in that order so that a mistake costs nothing: every file the command will write (each report, each
saliency picture) is checked as one plan before anything is loaded, every head's inputs before the first IG run, and the
reports are written only once every head has run (all or none).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from lightning_ig._files import (
    InputPathError,
    OutputPathError,
    OutputPlan,
    PlannedOutput,
    atomic_paths,
    check_input_file,
    check_output_file,
)
from lightning_ig.attribution.settings import DEFAULT_MAX_STEPS
from lightning_ig.checkpoint import CheckpointError, head_prefix, list_heads, states_beside
from lightning_ig.cli.exits import EXIT_NOT_WITHIN, EXIT_OK, PROG, NonFiniteError, UsageError
from lightning_ig.cli.feature_groups import is_named_form
from lightning_ig.cli.head_inputs import HeadRun, parse_device, prepare_head
from lightning_ig.cli.interrupts import Interrupts
from lightning_ig.cli.parser import SEED, baseline_path
from lightning_ig.cli.progress import Progress
from lightning_ig.cli.show import completeness_words
from lightning_ig.cli.terminal import printable
from lightning_ig.cli.verify import accuracy_words, verify_lines
from lightning_ig.vocabulary import REFINED_METHODS, non_finite_words

__all__ = ["DEFAULT_OUTPUT", "run_diag"]

DEFAULT_OUTPUT = "ig_report.json"
"""The report without ``--output``, in the working folder; never replacing a file already there."""


@dataclass
class _Attributed:
    """One head after its IG run."""

    run: HeadRun
    result: Any  # IGResult
    report: dict[str, Any]
    saliency: list[Path] = field(default_factory=list)  # the PNGs written for this head
    per_action: Any = None  # --target each: the IGResult of every action, or None


@dataclass(frozen=True)
class _HeadPlan:
    """One head to run and the files it writes, all checked before anything is loaded."""

    prefix: str | None
    label: str | None
    report: PlannedOutput
    pictures: tuple[PlannedOutput, ...] = ()  # --saliency: the grid and the mean |attribution| map


def run_diag(args: argparse.Namespace, progress: Progress, interrupts: Interrupts) -> int:
    """Run ``diag``; the exit status (see the module docstring of :mod:`lightning_ig.cli`)."""
    for flag in ("checkpoint", "states", "feature_names", "feature_groups", "baseline", "output", "saliency"):
        # the shell leaves "~" in "--output=~/r.json": read as a shell would, so outputs and inputs compare alike
        setattr(args, flag, None if (value := getattr(args, flag)) is None else os.path.expanduser(value))
    _check_flag_combinations(args)
    _check_inputs(args)  # nothing opened: a FIFO would block
    plan = _plan(args)  # every output checked before anything is loaded; --saliency made as it is written
    device = parse_device(args.device)
    if args.backend == "cuda" and device.type != "cuda":
        raise UsageError("--backend cuda runs on a CUDA device; add --device cuda (or use --backend auto)")

    progress.stage(f"loading {args.checkpoint}", checked=False)
    runs = [prepare_head(args, device, head.prefix, head.label, head.report.path) for head in plan]
    attributed = []
    for number, run in enumerate(runs, start=1):
        which = f" head {run.label} ({number}/{len(runs)})" if len(runs) > 1 else ""
        attributed.append(_attribute(run, args, progress, which))
    _refuse_stochastic(attributed)  # before writing: such attributions are not worth a report
    progress.stage("writing the report")
    with interrupts.raising():
        _write(attributed, plan, interrupts.written)
    progress.finish()  # the summary starts its own line, not the end of the progress line's
    try:
        _print_summaries(attributed, args)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as error:  # the reports are written: a stdout that cannot take the summary does not undo them
        print(
            f"{PROG} diag: cannot print the summary ({error.strerror or error}); the reports are written",
            file=sys.stderr,
        )
    _raise_if_non_finite(attributed)  # after writing: a user debugging a diverged run wants the reports
    return _verdict_status(attributed, args)


def _verdict_status(attributed: Sequence[_Attributed], args: argparse.Namespace) -> int:
    """0, or 4 with one line on stderr when a head (or an action of --target each) is not within tol."""
    for head in attributed:
        parts = [("", head.report["completeness"], head.result, None)] + [
            (f" (action {action['action']})", action["completeness"], head.per_action, action["action"])
            for action in head.report.get("actions", [])
        ]
        for where, completeness, result, action in parts:
            verdict = completeness.get("verdict", {})
            if verdict.get("within") is False:
                which = f"head {head.run.label}: " if head.run.label else ""
                if args.num_steps == "auto":
                    above = _states_above(result, action, args.completeness_tol)
                    advice = (
                        f"{above} state(s) still above tol at {result.n_steps} nodes, where --num-steps auto stops "
                        f"(three times as many would exceed its bound, {DEFAULT_MAX_STEPS}); pass a larger fixed "
                        f"--num-steps (e.g. {4 * DEFAULT_MAX_STEPS}), or check them with --verify N"
                    )
                else:  # auto refines only up to its bound: past it, only more fixed steps can help
                    past = isinstance(args.num_steps, int) and args.num_steps >= DEFAULT_MAX_STEPS
                    auto = "" if past or args.method not in REFINED_METHODS else "--num-steps auto (the default) or "
                    advice = f"try {auto}a larger --num-steps, or check it with --verify N"
                print(
                    printable(
                        f"{PROG} diag: not within --completeness-tol {args.completeness_tol:g}{where}: {which}"
                        f"{verdict['reason']}; the report {str(head.run.output)!r} is written: {advice}"
                    ),
                    file=sys.stderr,
                )
                return EXIT_NOT_WITHIN
    return EXIT_OK


def _states_above(result: Any, action: int | None, tol: float) -> int:
    """How many ordinary states (of ``action``'s row for --target each) have a figure above the verdict's bar."""
    figures = torch.maximum(result.attribution_error, result.mass_relative_error)
    ordinary = ~(result.near_baseline | result.non_finite)
    above = (figures > math.sqrt(2) * tol) & ordinary
    return int((above if action is None else above[action]).sum())


def _check_flag_combinations(args: argparse.Namespace) -> None:
    if args.output == "-":  # the usual spelling of stdout: a file of that name would surprise
        raise UsageError(
            "--output '-': diag writes its report to a file, not to stdout; give a file name and print it with "
            "`lightning-ig show FILE`"
        )
    if args.model_kwargs is not None and args.model is None:
        raise UsageError(
            "--model-kwargs needs --model package.module:Class; add --model, or drop --model-kwargs to use the "
            "checkpoint's own config"
        )
    if args.lightning_module and (args.head or args.prefix or args.all_heads):
        raise UsageError(
            "--head/--prefix/--all-heads apply to merged safetensors files, not to a Lightning .ckpt; drop them"
        )
    if args.num_steps == "auto" and args.method not in REFINED_METHODS:  # auto triples midpoint nodes
        raise UsageError(f"--num-steps auto refines midpoint nodes; with --method {args.method} give a --num-steps N")
    if args.lightning_module and args.trust_remote_code:
        raise UsageError(
            "--trust-remote-code is for safetensors checkpoints; --lightning-module names its class itself: drop one"
        )


def _check_inputs(args: argparse.Namespace) -> None:
    """Every input path is a regular file, said at once and by what it is: a FIFO would block the reader forever, a
    device (a link to ``/dev/zero``) feed it until memory runs out. Nothing is read yet."""
    groups = None if args.feature_groups is None or is_named_form(args.feature_groups) else args.feature_groups
    states = "a .json, .npy or .safetensors file"
    inputs = [  # flag, path, what to give, what else the flag takes
        ("--checkpoint", args.checkpoint, "a safetensors checkpoint", None),
        ("--states", None if args.states == "auto" else args.states, f"{states}, or 'auto'", None),
        ("--feature-names", args.feature_names, "a JSON file", None),
        (
            "--feature-groups",
            groups,
            "'channels', 'features' or a JSON file",
            "'channels', 'features' nor an existing JSON file",
        ),
        (
            "--baseline",
            baseline_path(args.baseline),
            f"zeros, mean, a number or {states}",
            "zeros, mean, a number nor an existing file",
        ),
    ]
    for flag, path, give, neither in inputs:
        if path is not None and neither is not None and not os.path.lexists(path):
            raise UsageError(f"{flag} {path!r} is neither {neither}; give one of those")
        if path is not None:
            _checked(check_input_file, path, flag, f"give {give}")


# ---------------------------------------------------------------------------------------------- outputs, checked first


def _plan(args: argparse.Namespace) -> list[_HeadPlan]:
    """The heads to run and every file they write, checked as one plan: against every input and each other.

    Nothing is loaded and nothing changes on disk before the whole plan passed; the ``--saliency`` folder is made
    as the reports are written, all or none (:func:`_write`: a failed run leaves none).
    """
    inputs = _inputs(args)
    plan = OutputPlan(inputs=inputs)
    named = args.output is not None
    output: str = args.output if named else DEFAULT_OUTPUT  # the user's spelling, for the messages
    pictures = None if args.saliency is None else _checked(plan.add_folder, args.saliency, what="--saliency")
    if args.all_heads:
        if named:  # not written itself, but an input named as the output is a mistake worth saying
            _checked(check_output_file, output, what="--output", inputs=inputs)
        heads = _heads(args.checkpoint)
        # Names made from --output's are the tool's: never written through a link (a user's --output is).
        reports = [
            _report(plan, path, f"the report of head {head!r}", made_up=True, default=None if named else output)
            for head, path in zip(heads, _head_outputs(Path(output), heads))
        ]
        targets: list[tuple[str | None, str | None, PlannedOutput]]
        targets = [(head_prefix(head), head, report) for head, report in zip(heads, reports)]
    else:
        what = "--output" if named else "the default --output"
        report = _report(plan, output, what, made_up=not named, default=None if named else output)
        targets = [(*_one_head(args), report)]
    heads_plan = []
    for prefix, label, report in targets:
        suffix = f".{label}" if args.all_heads else ""
        made: tuple[PlannedOutput, ...] = ()
        if pictures is not None:
            names = (f"saliency{suffix}.png", f"saliency_mean_abs{suffix}.png")
            made = tuple(
                _checked(plan.add_file, pictures / name, what="--saliency picture", made_up=True) for name in names
            )
        heads_plan.append(_HeadPlan(prefix, label, report, made))
    return heads_plan


def _one_head(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(key prefix, head label) of the one head to run: ``--head``, ``--prefix`` or the whole file."""
    if args.head is not None:
        try:
            return head_prefix(args.head), args.head
        except ValueError as error:
            raise UsageError(f"--head {args.head!r}: {error}") from None
    if args.prefix == "":  # the library's check names its keyword, prefix
        raise UsageError("--prefix '' names no head; give a head's key prefix such as 'trending__', or --head NAME")
    return (args.prefix, args.prefix.removesuffix("__")) if args.prefix is not None else (None, None)


def _report(plan: OutputPlan, path: str | Path, what: str, *, made_up: bool, default: str | None) -> PlannedOutput:
    """Plan one report; ``default``: the default --output it comes from, which never replaces a file."""
    if default is not None and os.path.lexists(path):
        raise UsageError(
            f"{str(path)!r} exists (an earlier run's report?) and diag without --output never replaces a file: "
            f"pass --output {default!r} to replace it, or --output NEW.json"
        )
    return _checked(plan.add_file, path, what=what, made_up=made_up)


def _checked(check: Any, *args: Any, **kwargs: Any) -> Any:
    """``check(*args, **kwargs)``, its :class:`OutputPathError` or :class:`InputPathError` a usage error (exit 2)."""
    try:
        return check(*args, **kwargs)
    except (OutputPathError, InputPathError) as error:
        raise UsageError(str(error)) from None


def _inputs(args: argparse.Namespace) -> list[str | Path]:
    """Every file this run may read; an output may be none of them."""
    inputs: list[str | Path] = [args.checkpoint]
    beside = states_beside(args.checkpoint) if args.states == "auto" else args.states
    inputs += [beside] if beside is not None else []
    if args.feature_names:
        inputs.append(args.feature_names)
    if baseline_path(args.baseline) is not None:
        inputs.append(args.baseline)
    if args.feature_groups is not None and not is_named_form(args.feature_groups):
        inputs.append(args.feature_groups)
    return inputs


def _heads(checkpoint: str) -> list[str]:
    try:
        heads = list_heads(checkpoint)
    except CheckpointError as error:
        raise UsageError(str(error)) from None
    if not heads:
        raise UsageError(f"--checkpoint {checkpoint!r} holds a single model, not several heads; drop --all-heads")
    return heads


def _head_outputs(output: Path, heads: Sequence[str]) -> list[Path]:
    return [output.with_name(f"{output.stem}.{head}{output.suffix or '.json'}") for head in heads]


# ----------------------------------------------------------------------------------- the IG run, the writes, the words


def _attribute(run: HeadRun, args: argparse.Namespace, progress: Progress, which: str) -> _Attributed:
    # imported here, as the other steps that need torch: `--help` or a bad flag should not wait for it
    from lightning_ig.attribution import integrated_gradients  # noqa: PLC0415
    from lightning_ig.attribution.result import stochastic_warnings_silenced  # noqa: PLC0415
    from lightning_ig.attribution.targets import EACH, Target  # noqa: PLC0415
    from lightning_ig.models.noise import noise_disabled  # noqa: PLC0415
    from lightning_ig.views.report import build_report  # noqa: PLC0415

    options = {
        "n_steps": args.num_steps,
        "method": args.method,
        "gradient": args.gradient,
        "backend": args.backend,
        "internal_batch_size": args.internal_batch_size,
        "completeness_tol": args.completeness_tol,
    }
    # A stochastic forward is said once, in this command's words (_refuse_stochastic), not as a warning too.
    each = run.target.every_output
    target = Target.parse("mean") if each else run.target  # "each": V(s) for the contract keys, every action beside
    with noise_disabled(run.model), stochastic_warnings_silenced():
        per_action = verified = None
        if each:  # first: a forward the engine refuses is refused as target='each', the flag the user typed
            progress.stage(f"integrated gradients of every action, {args.num_steps} steps{which}")
            per_action = integrated_gradients(run.model, run.states, run.baselines, target=EACH, **options)
        progress.stage(f"integrated gradients on {run.states.shape[0]} states, {args.num_steps} steps{which}")
        result = integrated_gradients(run.model, run.states, run.baselines, target=target, **options)
        if args.verify is not None:
            from lightning_ig.cli.verify import verify_key  # noqa: PLC0415

            progress.stage(f"--verify: the reference on {min(args.verify, run.states.shape[0])} states{which}")
            verified = verify_key(run.model, run.states, target, result, args.verify)
    extra = {**run.extra, "num_steps_requested": args.num_steps}
    if result.target_actions is not None:  # contrast: which two actions each state's difference is between
        extra["target_actions"] = [
            {"state_idx": i, "greedy": int(pair[0]), "runner_up": int(pair[1])}
            for i, pair in enumerate(result.target_actions.tolist())
        ]
    if per_action is not None:
        extra["actions"] = _actions_key(run, per_action, args)
    if verified is not None:
        extra["verify"] = verified
    report = build_report(
        result,
        feature_names=run.feature_names,
        checkpoint=args.checkpoint,
        forward_target=target.label,
        regime_head=run.label,
        top_k=args.top_k,
        extra=extra,
        groups=run.groups,
        tolerance=args.completeness_tol,
    )
    failing = [a for a in extra.get("actions", ()) if a["completeness"]["verdict"]["within"] is False]
    if failing and report["verdict"]["within"] is not False:  # the run's verdict is every action's, as the exit status
        report["verdict"].update(accuracy="fail", within=False)
    return _Attributed(run, result, report, per_action=per_action)


def _actions_key(run: HeadRun, per_action: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--target each``: per action, its top features and its completeness and accuracy (no per-state rows)."""
    import dataclasses  # noqa: PLC0415

    from lightning_ig.views.report import build_report  # noqa: PLC0415

    per_state = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite")
    optional = ("attribution_error", "mass_relative_error", "attribution_mass")  # None where not computed
    actions = []
    for k in range(per_action.attributions.shape[0]):
        fields = {
            name: getattr(per_action, name)[k]
            for name in (*per_state, *optional)
            if getattr(per_action, name) is not None
        }
        one = dataclasses.replace(per_action, attributions=per_action.attributions[k], target=f"action:{k}", **fields)
        report = build_report(
            one,
            feature_names=run.feature_names,
            forward_target=f"action:{k}",
            top_k=args.top_k,
            tolerance=args.completeness_tol,
        )
        completeness = {key: value for key, value in report["completeness"].items() if key != "per_state"}
        completeness.pop("degenerate_states", None)
        top = report["top_10_by_mean_abs"]
        actions.append(
            {"action": k, "forward_target": f"action:{k}", "top_10_by_mean_abs": top, "completeness": completeness}
        )
    return actions


def _refuse_stochastic(attributed: Sequence[_Attributed]) -> None:
    if stochastic := [head for head in attributed if head.result.stochastic]:
        which = f" (head {stochastic[0].run.label})" if stochastic[0].run.label else ""
        raise UsageError(
            f"the model's forward gives different values for the same state{which} even in eval mode with NoisyNet "
            "noise off: likely randomness in its forward that neither reaches (F.dropout(..., training=True), "
            "torch.randn, a noise layer without disable_noise()); its attributions would not be reproducible, so "
            "no report was written: make the forward deterministic"
        )


def _raise_if_non_finite(attributed: Sequence[_Attributed]) -> None:
    broken = [head for head in attributed if head.result.num_non_finite]
    if not broken:
        return
    head, result = broken[0], broken[0].result
    which = f"head {head.run.label}: " if head.run.label else ""
    more = f" (and {len(broken) - 1} more head(s))" if len(broken) > 1 else ""
    ends = torch.stack([result.f_input[result.non_finite], result.f_baseline[result.non_finite]])
    what, why = non_finite_words(bool(torch.isfinite(ends).all()))
    raise NonFiniteError(
        f"{which}{what} on {result.num_non_finite} of {head.run.states.shape[0]} states "
        f"(first: state_idx {result.first_non_finite}){more}{why}; the report {str(head.run.output)!r} lists them in "
        "non_finite_states: check the checkpoint's weights (a diverged run?), the model's forward and the states"
    )


def _write(attributed: Sequence[_Attributed], plan: Sequence[_HeadPlan], written: Callable[[], None]) -> None:
    """Every report and picture of the run, all or none (:func:`~lightning_ig._files.atomic_paths`): each is
    written to a temporary file beside its name, and only once all are written do they replace their names."""
    from lightning_ig.views.pictures.saliency import write_png  # noqa: PLC0415
    from lightning_ig.views.report import write_report  # noqa: PLC0415

    files: list[tuple[PlannedOutput, Callable[..., Any]]] = []
    for head, planned in zip(attributed, plan):
        if planned.pictures:  # first: a folder made to write (one that cannot be) is the pictures', never the report's
            pixels = _saliency_pixels(head)
            files += [(picture, partial(write_png, image)) for picture, image in zip(planned.pictures, pixels)]
        files.append((planned.report, partial(write_report, head.report)))
    targets = [(planned.path, not planned.made_up) for planned, _ in files]  # a user's path is written through a link
    done = -1  # -1: making the folders and temporaries, then the file being written, len(files): the renames
    try:
        with atomic_paths(targets, committed=written) as temporaries:
            for (_, write), temporary in zip(files, temporaries):
                done += 1
                write(temporary, follow_symlinks=False)  # the temporary is a plain file of this run's own
            done = len(files)
    except OSError as error:  # checked before the run; the disk or the folder changed since
        at = Path(str(error.filename or os.sep))  # outside a write: the folder, temporary or rename that failed
        folders = [Path(os.path.realpath(planned.path)).parent for planned, _ in files]
        there = [i for i, folder in enumerate(folders) if folder == at.parent or folder.is_relative_to(at)]
        failed = files[done if 0 <= done < len(files) else (there or [0])[0]][0]
        what = "--output" if failed.what.startswith("the ") else failed.what
        raise UsageError(
            f"cannot write {what} {str(failed.path)!r} ({error.strerror or error}); check the folder's space and "
            f"permissions; none of the {len(files)} file(s) was written"
        ) from None
    for head, planned in zip(attributed, plan):
        head.saliency = [picture.path for picture in planned.pictures]


def _saliency_pixels(head: _Attributed) -> list[Any]:
    """The report's states with their attributions blended over them, and the mean |attribution| per channel; the
    channels by name where the groups name them (``--feature-groups`` with one group per channel)."""
    import numpy as np  # noqa: PLC0415

    from lightning_ig.attribution.targets import Target  # noqa: PLC0415
    from lightning_ig.views.pictures.draw import baseline_words  # noqa: PLC0415
    from lightning_ig.views.pictures.saliency import mean_abs_map, saliency_grid  # noqa: PLC0415

    states = head.run.states.detach().to("cpu", torch.float64).numpy()
    attributions = head.result.attributions.detach().to("cpu", torch.float64).numpy()
    channel_names = head.run.groups.channel_names() if head.run.groups is not None else None
    words = Target.parse("mean").words if head.run.target.every_output else head.run.target.words  # as attributed
    against = baseline_words(str(head.run.extra.get("baseline")), spatial=True)  # zeros, mean, else "the baseline"
    grid = saliency_grid(states, attributions, channel_names=channel_names, target_label=words, baseline_label=against)
    mean_abs = mean_abs_map(np.abs(attributions).mean(axis=0), len(states), channel_names)
    return [grid.pixels, mean_abs.pixels]


def _print_summaries(attributed: Sequence[_Attributed], args: argparse.Namespace) -> None:
    """Per head: the report written, the accuracy verdict (per action for --target each), --verify's lines, the
    pictures."""
    if args.quiet:
        return
    for head in attributed:
        report, accuracy = head.report, accuracy_words(head.report)
        words = completeness_words(report, ratio=accuracy is None)
        what = f"{report['num_states']} states, {report['state_dim']} features, {report['num_steps']} steps"
        print(printable(f"wrote {head.run.output}: {what}" + ("" if words is None else f"; completeness: {words}")))
        if accuracy is not None:
            print(printable(f"  {accuracy}"))
        for action in report.get("actions", []):
            print(printable(f"  action {action['action']}: {accuracy_words(action)}"))
        for line in verify_lines(report["verify"]) if "verify" in report else []:
            print(printable(f"  {line}"))
        if head.saliency:
            print(printable(f"wrote {', '.join(map(str, head.saliency))}"))
    asks = {"--auto-samples": args.auto_samples is not None, "--replace": args.replace, "--seed": args.seed != SEED}
    unused = [flag for flag, asked in asks.items() if asked]
    if args.states != "auto" and unused:  # said, not refused: the scripts that pass them today keep working
        used = f"--states {args.states} was used whole"
        print(printable(f"note: {', '.join(unused)} shape only the --states auto sample; {used}"))
