"""Writing checkpoints: one model, several heads, or single-model files merged into one.

Every write checks its path first, goes to a temporary file beside the target and is renamed over it (readers never
see half a checkpoint), with the mode any program's output gets (:func:`lightning_ig._files.atomic_path`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import prune

from lightning_ig._files import atomic_path, check_output_file
from lightning_ig.attribution.checks import check_finite, check_states
from lightning_ig.checkpoint.building import shape_mismatch, state_shapes
from lightning_ig.checkpoint.layout import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    FEATURE_NAMES_KEY,
    FORMAT_KEY,
    FORMAT_VERSION,
    HEADS_KEY,
    RESERVED_PREFIX,
    STATES_KEY,
    CheckpointError,
    check_format,
    head_prefix,
    json_metadata,
    read_metadata,
)
from lightning_ig.models import build_model, model_config, model_name
from lightning_ig.vocabulary import check_feature_names, check_path, shown

__all__ = ["merge_checkpoints", "save_checkpoint", "save_merged_checkpoint"]


def save_checkpoint(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    feature_names: Sequence[str] | None = None,
    states: Tensor | None = None,
    metadata: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` to a safetensors file that :func:`~lightning_ig.checkpoint.load_checkpoint` rebuilds alone.

    Args:
        model: The model (``torch.compile`` and DDP wrappers are looked through). Its class should be registered
            (:func:`~lightning_ig.models.register_model`) or importable as ``package.module:Class``, with a ``config()``
            method returning its constructor's keyword arguments (or pass ``config``). A file naming an unregistered
            class is read back only with ``load_checkpoint(..., architecture=...)`` or ``trust_remote_code=True``.
        path: Where to write (parents are created). Written atomically; a new file gets
            ``0o666 & ~umask``, an overwritten one keeps its mode; a symbolic link is written through.
        feature_names: One printable, distinct name per input feature, stored in the metadata. Default ``None``.
        states: Held-out states ``(num_states, *feature_shape)``, finite, stored as ``__states__`` (float32).
            Default ``None``.
        metadata: Extra ``str -> str`` metadata. Keys may not start with ``"lightning_ig."``.
        config: The constructor's keyword arguments when the model has no ``config()``. Default ``None``.

    Returns:
        The path written.

    Raises:
        TypeError: If an argument has the wrong type or the config is not JSON-serialisable.
        ValueError: If ``states`` has a bad shape or NaN/Inf, ``feature_names`` are blank, repeated or do not match the
            states' width (or a network's ``state_dim``, which the states' width must match too), ``metadata`` uses a
            reserved key, ``path`` is a folder, a device or a FIFO, or ``config`` builds the model's class with other
            tensors than the model's (the file could not be loaded), or the model's tensors are on the meta device.

    Example::

        >>> from lightning_ig.models import DuelingQNetwork
        >>> from lightning_ig.checkpoint import load_checkpoint
        >>> import tempfile, os
        >>> net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
        >>> path = os.path.join(tempfile.mkdtemp(), "q.safetensors")
        >>> _ = save_checkpoint(net, path, feature_names=["x", "v", "theta", "omega"], states=torch.zeros(3, 4))
        >>> loaded = load_checkpoint(path)
        >>> loaded.feature_names, tuple(loaded.states.shape)
        (['x', 'v', 'theta', 'omega'], (3, 4))
    """
    model = _unwrap(model)
    tensors = _model_tensors(model)
    stored_states = None if states is None else _stored_states(states)
    names = _checked_names(feature_names, _width(model, stored_states, "states"))
    architecture, model_kwargs = _architecture(model, config)
    if config is not None or model_kwargs is None:  # the caller's words must rebuild it; no words: warned if not
        _check_rebuilds(architecture, dict(config or {}), tensors, warn=config is None)
    meta = {**_metadata(metadata), ARCHITECTURE_KEY: architecture}
    if model_kwargs is not None:
        meta[CONFIG_KEY] = json.dumps(model_kwargs, sort_keys=True)
    if names is not None:
        meta[FEATURE_NAMES_KEY] = json.dumps(names)
    if stored_states is not None:
        if STATES_KEY in tensors:
            raise ValueError(
                f"the model has a tensor named {STATES_KEY!r}, which is reserved for the states; rename it"
            )
        tensors[STATES_KEY] = stored_states
    return _atomic_save(tensors, path, meta)


def save_merged_checkpoint(
    heads: Mapping[str, nn.Module],
    path: str | os.PathLike[str],
    *,
    feature_names: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    states: Tensor | Mapping[str, Tensor] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write several models ("heads") into one file, each under the prefix ``<head>__``.

    Args:
        heads: Head name -> model, e.g. ``{"trending": net_a, "ranging": net_b}``. Names may not contain ``"__"``.
        path: Where to write (atomically, modes as :func:`save_checkpoint`).
        feature_names: Names shared by every head (stored at file level), or head -> names.
        states: States shared by every head (stored as ``__states__``), or head -> states
            (stored as ``<head>____states__``).
        metadata: Extra ``str -> str`` metadata.

    Returns:
        The path written.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If there is no head, a head name is invalid, a mapping names an unknown head,
            or states or names are not usable (as in :func:`save_checkpoint`).

    Example::

        >>> save_merged_checkpoint({"trending": net_a, "ranging": net_b}, "heads.safetensors")  # doctest: +SKIP
    """
    if not isinstance(heads, Mapping) or not heads:
        raise ValueError(f"heads must be a non-empty mapping of head name -> model, got {heads!r}")
    per_head_names = feature_names if isinstance(feature_names, Mapping) else {}
    per_head_states = states if isinstance(states, Mapping) else {}
    for mapping, what in ((per_head_names, "feature_names"), (per_head_states, "states")):
        if unknown := set(mapping) - set(heads):
            raise ValueError(f"{what} names heads {sorted(unknown)} that are not in heads {sorted(heads)}")
    tensors: dict[str, Tensor] = {}
    if states is not None and not isinstance(states, Mapping):
        tensors[STATES_KEY] = _stored_states(states)
    shared_names = None if isinstance(feature_names, Mapping) else feature_names
    head_info: dict[str, dict[str, Any]] = {}
    for head, given in heads.items():
        prefix, model = head_prefix(head), _unwrap(given)
        if head in per_head_states:
            tensors[prefix + STATES_KEY] = _stored_states(per_head_states[head], f"states[{head!r}]")
        own = tensors.get(prefix + STATES_KEY, tensors.get(STATES_KEY))  # the head's, else the shared ones
        _checked_names(per_head_names.get(head, shared_names), _width(model, own, f"the states of head {head!r}"))
        head_info[head] = _head_info(model, per_head_names.get(head))
        tensors.update({prefix + key: value for key, value in _model_tensors(model, f"heads[{head!r}]").items()})
    meta = {**_metadata(metadata), HEADS_KEY: json.dumps(head_info, sort_keys=True)}
    if shared_names is not None:
        meta[FEATURE_NAMES_KEY] = json.dumps(_checked_names(shared_names, None))
    return _atomic_save(tensors, path, meta)


def merge_checkpoints(
    sources: Mapping[str, str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Merge single-model checkpoint files into one multi-head file.

    Each source's tensors (its states included) go under ``<head>__``; its
    architecture, config and feature names go into ``lightning_ig.heads``.

    Args:
        sources: Head name -> path of a checkpoint written by :func:`save_checkpoint`.
        path: The merged file to write (atomically); it may not be one of the sources.
        metadata: Extra ``str -> str`` metadata for the merged file.

    Returns:
        The path written.

    Raises:
        CheckpointError: If a source cannot be read or is itself a merged file.
        ValueError: If there is no source, a head name is invalid, or ``path`` is a source.

    Example::

        >>> sources = {"trending": "a.safetensors", "ranging": "b.safetensors"}
        >>> merge_checkpoints(sources, "heads.safetensors")  # doctest: +SKIP
    """
    from safetensors import safe_open  # noqa: PLC0415 - keeps `import lightning_ig` light

    if not isinstance(sources, Mapping) or not sources:
        raise ValueError(f"sources must be a non-empty mapping of head name -> checkpoint path, got {sources!r}")
    _check_path(path, inputs=list(sources.values()))
    tensors: dict[str, Tensor] = {}
    head_info: dict[str, dict[str, Any]] = {}
    for head, source in sources.items():
        prefix, source_meta = head_prefix(head), read_metadata(source)
        check_format(source_meta, source)
        if HEADS_KEY in source_meta:
            raise CheckpointError(f"{os.fspath(source)!r} is already a merged file; merge single-model checkpoints")
        head_info[head] = _source_info(source_meta, source)
        with safe_open(os.fspath(source), framework="pt", device="cpu") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a dict: keys() is its API
                tensors[prefix + key] = handle.get_tensor(key)
    return _atomic_save(tensors, path, {**_metadata(metadata), HEADS_KEY: json.dumps(head_info, sort_keys=True)})


def _checked_names(feature_names: Sequence[str] | None, width: int | None) -> list[str] | None:
    if feature_names is None:
        return None
    if isinstance(feature_names, (str, bytes)) or not isinstance(feature_names, Sequence):
        raise TypeError(f"feature_names must be a sequence of strings, got {feature_names!r}")
    return check_feature_names(feature_names, len(feature_names) if width is None else width)


def _width(model: nn.Module, states: Tensor | None, what: str) -> int | None:
    """The features a name per feature must match: the states', which must be a network's ``state_dim``."""
    takes = getattr(model, "state_dim", None)  # the package's networks say their input width; others are not asked
    width = None if states is None else int(states[0].numel())
    if type(takes) is int and states is not None and states.dim() == 2 and width != takes:
        raise ValueError(f"{what} have {width} features but the model takes {takes}: pass (num_states, {takes}) states")
    return (takes if type(takes) is int else None) if width is None else width


def _stored_states(states: Tensor, what: str = "states") -> Tensor:
    """``states`` checked and copied as stored: float32, contiguous, on the CPU."""
    stored = check_states(states, what).detach().to("cpu", torch.float32).contiguous().clone()
    check_finite(f"{what} as stored in float32", stored)  # finite float64 past float32's range would be inf
    return stored


def _metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The user's metadata, checked, with the format's version."""
    if metadata is None:
        return {FORMAT_KEY: FORMAT_VERSION}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str -> str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"metadata must map str to str (safetensors' rule), got {key!r}: {value!r}; json.dumps other values"
            )
        if key.startswith(RESERVED_PREFIX):
            raise ValueError(f"metadata key {key!r} uses the reserved prefix {RESERVED_PREFIX!r}; rename it")
    return {**metadata, FORMAT_KEY: FORMAT_VERSION}


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside ``torch.compile`` / DDP / DataParallel wrappers, whose keys and class are the real ones."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif type(model).__name__ == "OptimizedModule":  # torch.compile(model): the model is its one child
            (model,) = model.children()
        else:
            return model


def _model_tensors(model: nn.Module, what: str = "model") -> dict[str, Tensor]:
    # Copies on the CPU: safetensors refuses tensors that share storage (tied weights).
    state = model.state_dict()
    pruned = prune.is_pruned(model)  # torch.nn.utils.prune keeps weight_orig and weight_mask where the class has weight
    for key in [key for key in state if pruned and key.endswith("_orig") and f"{key[:-5]}_mask" in state]:
        state[key[:-5]] = state.pop(key) * state.pop(f"{key[:-5]}_mask")  # the weight it computes (prune.remove's)
    if meta := [key for key, value in state.items() if value.is_meta]:
        raise ValueError(
            f"{what} has tensors on the meta device, which hold no values ({meta[0]!r} among {len(meta)}): "
            "load or initialise its weights (model.to_empty(device='cpu'), then load_state_dict) before saving it"
        )
    return {key: value.detach().to("cpu").contiguous().clone() for key, value in state.items()}


def _check_rebuilds(architecture: str, config: dict[str, Any], tensors: dict[str, Tensor], warn: bool = False) -> None:
    """Refuse a ``config`` from which the model's class builds other tensors than the model's: the file would never
    load (``warn``: say so, for a model saved without one). A class not found by its name now (defined in
    ``__main__``) or not built on the meta device is not checked."""
    try:
        with torch.device("meta"):  # allocates nothing, whatever sizes the config asks for
            built = build_model(architecture, dict(config))
    except Exception as error:  # noqa: BLE001 - no such name here, or a constructor that reads values: loading checks it
        if not (warn and isinstance(error.__cause__, TypeError)):  # a class that takes arguments: warned below
            return
        mismatch: str | None = f"it cannot be built without them: {error.__cause__}"
    else:
        mismatch = shape_mismatch(state_shapes(built), {key: tuple(value.shape) for key, value in tensors.items()})
    if mismatch is not None and warn:
        warnings.warn(
            f"{architecture} built without arguments does not take the model's tensors ({mismatch}): the file loads "
            "only where you name a class and arguments that rebuild it, load_checkpoint(path, architecture=..., "
            "config=...) or diag --model package.module:Class --model-kwargs JSON; or save with config=",
            stacklevel=3,
        )
    elif mismatch is not None:
        raise ValueError(
            f"config={shown(config)} builds a {architecture} that does not take the model's tensors, which the file "
            f"holds ({mismatch}): it could not be loaded; pass the arguments the model was built with"
        )


def _architecture(model: nn.Module, config: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    if config is None:
        config = model_config(model)
    if config is not None:
        try:
            json.dumps(dict(config))
        except (TypeError, ValueError) as error:
            raise TypeError(f"the model config must be JSON-serialisable: {error}") from error
        config = dict(config)
    return model_name(model), config


def _head_info(model: nn.Module, names: Sequence[str] | None) -> dict[str, Any]:
    architecture, model_kwargs = _architecture(model, None)
    info = {"architecture": architecture, "config": model_kwargs, "feature_names": _checked_names(names, None)}
    return {key: value for key, value in info.items() if value is not None}


def _source_info(source_meta: Mapping[str, str], source: str | os.PathLike[str]) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if ARCHITECTURE_KEY in source_meta:
        info["architecture"] = source_meta[ARCHITECTURE_KEY]
    for name, key in (("config", CONFIG_KEY), ("feature_names", FEATURE_NAMES_KEY)):  # JSON in the metadata
        if key in source_meta:
            info[name] = json_metadata(source_meta, key, source)
    return info


def _check_path(path: str | os.PathLike[str], inputs: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Refuse a folder, a device, a FIFO or an input before writing; missing parent folders are created later."""
    target = check_path(path, "path")
    blocked = next((up for up in Path(os.path.abspath(target)).parents if up.exists() and not up.is_dir()), None)
    if blocked is not None:  # the OS would say "File exists", naming the file as if it were the checkpoint
        raise ValueError(f"checkpoint path {os.fspath(path)!r} goes through {str(blocked)!r}, a file; choose a folder")
    if os.fspath(path).endswith(os.sep):  # "runs/new/" names a folder, whether its parent exists or not
        raise ValueError(f"checkpoint path {os.fspath(path)!r} names a folder; give a file name ending in .safetensors")
    if Path(os.path.realpath(target)).parent.is_dir():
        check_output_file(target, what="checkpoint path", inputs=inputs)
    return target


def _atomic_save(tensors: dict[str, Tensor], path: str | os.PathLike[str], metadata: dict[str, str]) -> Path:
    from safetensors.torch import save_file  # noqa: PLC0415 - keeps `import lightning_ig` light

    target = _check_path(path)
    with atomic_path(target) as temporary:
        save_file(tensors, os.fspath(temporary), metadata=metadata)
    return target
