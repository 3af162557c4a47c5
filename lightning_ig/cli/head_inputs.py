"""One head's inputs for ``lightning-ig diag`` (model, states in the model's dtype, feature names, groups, target,
baseline), loaded and checked before any IG work; every mistake is a :class:`~lightning_ig.cli.exits.UsageError`."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lightning_ig.attribution.checks import check_device, check_finite, check_states
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.path import check_run_memory
from lightning_ig.attribution.targets import Target
from lightning_ig.checkpoint import (
    CheckpointError,
    LoadedCheckpoint,
    load_checkpoint,
    load_lightning_checkpoint,
    load_states,
    states_beside,
)
from lightning_ig.cli.exits import UsageError, read_json_file
from lightning_ig.cli.feature_groups import resolve_feature_groups
from lightning_ig.cli.parser import AUTO_SAMPLES, baseline_path
from lightning_ig.views.pictures.saliency import saliency_kind
from lightning_ig.vocabulary import check_feature_names, default_feature_names

__all__ = ["HeadRun", "parse_device", "prepare_head"]


@dataclass
class HeadRun:
    """One head's inputs, prepared and checked before any IG run."""

    label: str | None  # head name for the report's regime_head, None for a single model
    prefix: str | None
    output: Path
    model: nn.Module
    states: Tensor  # (num_states, *feature_shape), the model's dtype and device
    feature_names: list[str]
    target: Target  # what is attributed, bound to the model's outputs (its label is the report's forward_target)
    baselines: Any
    extra: dict[str, Any] = field(default_factory=dict)
    groups: FeatureGroups | None = None  # --feature-groups, resolved against the states' feature shape


def parse_device(text: str) -> torch.device:
    """The ``--device`` as a torch device that exists here (:func:`~lightning_ig.attribution.checks.check_device`)."""
    try:
        device = check_device(text, "--device")
    except ValueError as error:
        raise UsageError(f"{str(error).replace('--device=', '--device ')} (--device cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {text!r}: only cpu and cuda devices are supported")
    return device


def prepare_head(
    args: argparse.Namespace, device: torch.device, prefix: str | None, label: str | None, output: Path
) -> HeadRun:
    """Load and check one head's model, states, names, target and baseline."""
    loaded = _load(args, prefix, device)
    model = loaded.model.eval().requires_grad_(False)  # gradients are taken w.r.t. the inputs only
    what = f"head {label!r} of {args.checkpoint}" if label else args.checkpoint
    states, extra = _states(args, loaded, prefix, device, _model_dtype(model), what)
    # the width first: the root of most mismatches
    target = _target(args.target, _probe(model, states, extra["states_from"], what))
    if (actions := target.rows_per_state) > 1:  # --target each keeps a path gradient per action, all at once
        _check_work(args, len(states) * actions, states[0], f"--target each ({actions} actions)")
    names = _feature_names(args, loaded, states, what)
    groups = resolve_feature_groups(args.feature_groups, states.shape[1:], names)
    if args.saliency is not None and saliency_kind(tuple(states.shape[1:])) is None:
        raise UsageError(
            f"--saliency draws states with spatial dimensions, (C, H, W) or (C, L); the states of {what} have feature "
            f"shape {tuple(states.shape[1:])}: drop --saliency (the report has every feature's attribution)"
        )
    baselines, baseline_label = _baseline(args.baseline, states)
    extra = {
        "architecture": loaded.architecture,
        "prefix": loaded.prefix,
        "device": str(device),
        "command": "diag",
        **extra,
        "baseline": baseline_label,
    }
    return HeadRun(label, prefix, output, model, states, names, target, baselines, extra, groups)


def _load(args: argparse.Namespace, prefix: str | None, device: torch.device) -> LoadedCheckpoint:
    try:
        if args.lightning_module:  # only on the user's explicit request: a .ckpt is a pickle
            return load_lightning_checkpoint(args.checkpoint, args.lightning_module, device=device)
        return load_checkpoint(
            args.checkpoint,
            prefix=prefix,
            device=device,
            architecture=args.model,
            config=args.model_kwargs,
            trust_remote_code=args.trust_remote_code,
        )
    except CheckpointError as error:  # the library's hints for Python, as diag's flags; the path as typed
        message = str(error).replace(" (prefix=NAME__)", "").replace("the head/prefix", "--head/--prefix")
        message = message.replace(repr(str(Path(args.checkpoint))), f"--checkpoint {args.checkpoint!r}", 1)
        if Path(args.checkpoint).suffix == ".ckpt" and not args.lightning_module and "safetensors" in message:
            message += "; for a Lightning .ckpt pass --lightning-module package.module:Class"
        raise UsageError(message) from None


def _model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the model computes in: its floating-point parameters' (else its buffers'), else float32.

    Raises:
        UsageError: the parameters are of several dtypes (layers saved in different precisions): states of one
            dtype would fail in the other's layers.
    """
    floats = [tensor.dtype for tensor in model.parameters() if tensor.is_floating_point()]
    floats = floats or [tensor.dtype for tensor in model.buffers() if tensor.is_floating_point()]
    dtypes = sorted(set(floats), key=str)
    if len(dtypes) > 1:
        raise UsageError(
            f"the model's parameters are of {len(dtypes)} dtypes ({', '.join(map(str, dtypes))}: layers saved "
            "in different precisions?); one forward takes states of one dtype: convert the model to one "
            "(model.double() or .float()) and save it again"
        )
    return dtypes[0] if dtypes else torch.float32


# -------------------------------------------------------------------------------------------------------------- states


def _states(
    args: argparse.Namespace,
    loaded: LoadedCheckpoint,
    prefix: str | None,
    device: torch.device,
    dtype: torch.dtype,
    what: str,
) -> tuple[Tensor, dict[str, Any]]:
    """The states to attribute, and what the report says about where they came from."""
    if args.states != "auto":  # a regular file: checked with every input before anything was loaded
        states = _checked_states(
            _load_states("--states", args.states, prefix=prefix, dtype=dtype).to(device),
            f"--states {args.states!r}",
            "write at least one state of at least one feature",
        )
        _check_work(args, states.shape[0], states[0], f"the {states.shape[0]:,} states of --states {args.states!r}")
        return states, {"states_source": "path", "states_from": args.states}
    pool, where = loaded.states, what
    if pool is None:
        if (beside := states_beside(args.checkpoint)) is None:
            raise UsageError(
                f"no states are stored in {what} nor beside it (<name>.states.* or states.*: .safetensors, .npy, "
                ".json); pass --states PATH or save the checkpoint with states="
            )
        pool, where = _load_states("states file", str(beside), prefix=prefix, dtype=dtype), str(beside)
    pool = _checked_states(
        pool.to(device=device, dtype=dtype), where, "save the checkpoint with states=, or pass --states PATH"
    )
    # the default asks for no more states than are stored (--replace draws as many as ever)
    count = args.auto_samples or (AUTO_SAMPLES if args.replace else min(AUTO_SAMPLES, pool.shape[0]))
    _check_work(args, count, pool[0], f"--auto-samples {count}")
    states, indices = _sample(pool, count, args.seed, args.replace, where)
    return states, {
        "states_source": "auto",
        "states_from": where,
        "seed": args.seed,
        "state_indices": indices,
        "replace": args.replace,
    }


def _check_work(args: argparse.Namespace, count: int, state: Tensor, what: str) -> None:
    """``count`` states like ``state`` at ``--num-steps`` must fit in memory before any is drawn or attributed: the
    kernel's out-of-memory killer ends a process without a word (``--auto-samples 1000000000 --replace``)."""
    fix = "ask for fewer states or steps"
    try:
        check_run_memory(count, state.numel(), args.num_steps, f"{what} at --num-steps {args.num_steps}", fix)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _checked_states(states: Tensor, where: str, fix: str) -> Tensor:
    if states.ndim < 2 or states.shape[0] == 0 or math.prod(states.shape[1:]) == 0:
        raise UsageError(
            f"the states from {where} have shape {tuple(states.shape)}: expected (num_states >= 1, *feature_shape) "
            f"with at least one state and one feature; {fix}"
        )
    try:
        return check_states(states, f"states of {where}")
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


def _load_states(what: str, path: str, **options: Any) -> Tensor:
    try:
        return load_states(path, **options)
    except CheckpointError as error:  # a usage error, the path as typed: "--states 'x.json'", not "states file"
        file = repr(str(Path(path)))  # the reader's spelling of the path
        raise UsageError(
            str(error).replace(f"states file {file}", file, 1).replace(file, f"{what} {path!r}", 1)
        ) from None


def _sample(pool: Tensor, count: int, seed: int, replace: bool, where: str) -> tuple[Tensor, list[int]]:
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
    return pool[indices.to(pool.device)], indices.tolist()


# --------------------------------------------------------------------------------------------- names, target, baseline


def _feature_names(args: argparse.Namespace, loaded: LoadedCheckpoint, states: Tensor, what: str) -> list[str]:
    count = int(states[0].numel())
    try:
        if args.feature_names:
            value = read_json_file(args.feature_names, "--feature-names", "give a JSON file holding an array of names")
            # {"feature_names": [...]} or the array itself; another object is said as one, not as its missing key's None
            names = value.get("feature_names", value) if isinstance(value, dict) else value
            return check_feature_names(names, count, f"--feature-names {args.feature_names!r}")
        if loaded.feature_names is not None:
            return check_feature_names(loaded.feature_names, count, f"the feature names stored in {what}")
    except (TypeError, ValueError) as error:
        raise UsageError(f"{error} (give a JSON array of names with --feature-names PATH)") from None
    return default_feature_names(states.shape[1:])


def _probe(model: nn.Module, states: Tensor, where: str, what: str) -> Tensor:
    """A forward on two copies of the first state, a batch as IG runs: the output's layout; a failing model caught."""
    try:
        with torch.no_grad():
            output = model(states[[0, 0]])
    except Exception as error:  # noqa: BLE001 - the model's own error (shapes, dtypes), said in the user's terms
        if states.ndim == 2 and (width := _expected_width(model)) is not None and states.shape[1] != width:
            raise UsageError(
                f"the states from {where} have {states.shape[1]} features but the model takes {width} ({what}); "
                f"give states with {width} columns (or the matching checkpoint/head)"
            ) from None
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(
            f"the model fails on states of shape {tuple(states.shape)} ({first_line}): check their width or the "
            f"forward of {what}"
        ) from None
    if not isinstance(output, Tensor):
        raise UsageError(
            f"the model returns {type(output).__name__}, not a tensor of Q-values; wrap it to return (N, A)"
        )
    return output


def _expected_width(model: nn.Module) -> int | None:
    """The input width the model says it takes (``state_dim``), or its first linear layer's."""
    if isinstance(width := getattr(model, "state_dim", None), int) and not isinstance(width, bool):
        return width
    for module in model.modules():  # the first module with a weight: a Linear says its width, a Conv2d none
        if any(p.dim() >= 2 for p in module.parameters(recurse=False)):
            in_features = getattr(module, "in_features", None)
            return in_features if isinstance(in_features, int) and not isinstance(in_features, bool) else None
    return None


def _target(requested: str, probe: Tensor) -> Target:
    """What integrated_gradients attributes (``--target``), bound to the model's outputs ``(N,)`` or ``(N, A)``."""
    if probe.ndim not in (1, 2):
        raise UsageError(
            f"the model returns shape {tuple(probe.shape)} per batch; lightning-ig diag needs (N,) or (N, A): check "
            "that the states' feature shape is the model's"
        )
    try:
        named = f"action:{requested}" if requested.isdigit() else requested  # N as action:N (the parser's digits)
        return Target.parse(named).bind(tuple(probe.shape), spelt=f"--target {requested}")
    except ValueError as error:
        raise UsageError(str(error)) from None


def _baseline(text: str, states: Tensor) -> tuple[Any, str]:
    """The baseline as integrated_gradients takes it, and its label in the report."""
    if text in ("zeros", "mean"):
        return text, text
    if baseline_path(text) is None:  # a number
        value = float(text)
        if not abs(value) <= torch.finfo(states.dtype).max:  # NaN, inf and 1e40 for float32 states
            raise UsageError(
                f"--baseline {text!r} is not a finite {states.dtype} number; give zeros, mean, a number of at most "
                f"{torch.finfo(states.dtype).max:.3g} in size or a states file"
            )
        return value, f"constant:{value!r}"
    loaded = _load_states("--baseline", text, dtype=states.dtype).to(states.device)  # a regular file: checked
    baselines = loaded[0] if loaded.shape[0] == 1 else loaded
    if baselines.shape not in (states.shape, states.shape[1:]):
        raise UsageError(
            f"--baseline {text!r} has shape {tuple(loaded.shape)}; give one baseline as a file of states, shape "
            f"{(1, *states.shape[1:])}, or one per state, {tuple(states.shape)}"
        )
    try:
        check_finite(f"--baseline {text!r}", baselines)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return baselines, f"file:{text}"
