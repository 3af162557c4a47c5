"""Rebuilding a model from a checkpoint: choose the head, build the architecture, load the weights."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from lightning_ig.checkpoint.heads import head_entry, heads_in, select_prefix
from lightning_ig.checkpoint.layout import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    FEATURE_NAMES_KEY,
    HEAD_SEPARATOR,
    STATES_KEY,
    CheckpointError,
    LoadedCheckpoint,
    existing_file,
    few,
    head_prefix,
    json_metadata,
    open_error,
    read_metadata,
    tensor_keys,
)
from lightning_ig.models import build_model, resolve_model_class
from lightning_ig.vocabulary import check_device, check_mapping, check_text

__all__ = ["load_checkpoint", "load_lightning_checkpoint"]


@dataclass
class _Recipe:
    """What the metadata (or the caller's overrides) say about the model to build."""

    architecture: str
    config: dict[str, Any]
    feature_names: list[str] | None


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    device: str | torch.device = "cpu",
    head: str | None = None,
    architecture: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> LoadedCheckpoint:
    """Rebuild the model stored in a safetensors checkpoint and load its weights.

    Args:
        path: The checkpoint.
        prefix: For a merged file, the key prefix of the head to load (``"trending__"``, or
            the head's name); only those tensors are read and the prefix is stripped. Default ``None``.
        device: Where the model and states go. Default ``"cpu"``.
        head: The head by name (``"trending"`` = ``prefix="trending__"``); not with ``prefix``.
        architecture: Override (or supply, for files without it) the architecture:
            a registered name or ``"package.module:Class"``.
        config: Override (or supply) the constructor's keyword arguments.

    Returns:
        A :class:`LoadedCheckpoint`, the model in eval mode, the stored states (if any)
        as float32 on ``device``, as they are stored; whoever uses them checks them.

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors; the prefix is
            not a head of the file (the message lists the heads that are); the file holds
            several heads and none was chosen; the architecture is unknown; or the weights
            do not fit it.
        ValueError: If both ``head`` and ``prefix`` are given.

    Example::

        >>> loaded = load_checkpoint("heads.safetensors", head="trending")  # doctest: +SKIP
        >>> loaded.model(loaded.states).shape  # doctest: +SKIP
        torch.Size([64, 3])
    """
    device = check_device(device, "device")
    architecture = None if architecture is None else check_text(architecture, "architecture")
    config = None if config is None else check_mapping(config, "config")
    file = existing_file(path)
    metadata, keys = read_metadata(file), tensor_keys(file)
    prefix = select_prefix(_requested_prefix(prefix, head), heads_in(metadata, keys, file), keys, file)
    recipe = _recipe(metadata, head_entry(metadata, prefix, file), file, architecture, config)
    try:
        model = build_model(recipe.architecture, dict(recipe.config))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"cannot rebuild the model of {str(file)!r}: {error}") from error
    weights, states = _read_tensors(file, keys, prefix)
    _load_weights(model, weights, recipe, f"the weights in {str(file)!r}{' under ' + repr(prefix) if prefix else ''}")
    model.to(device).eval()
    return LoadedCheckpoint(
        model=model,
        feature_names=recipe.feature_names,
        states=None if states is None else states.to(device=device, dtype=torch.float32),
        metadata=metadata,
        prefix=prefix,
        architecture=recipe.architecture,
        config=dict(recipe.config),
        path=file,
    )


def _requested_prefix(prefix: str | None, head: str | None) -> str | None:
    if head is not None and prefix is not None:
        raise ValueError(f"give a head ({head!r}) or a prefix ({prefix!r}), not both")
    if head is not None:
        return head_prefix(head)
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise ValueError(f"prefix must be a non-empty string such as 'trending__', got {prefix!r}")
    return prefix


def _recipe(
    metadata: Mapping[str, str], entry: Mapping[str, Any], file: Path, architecture: str | None, config: Mapping[str, Any] | None
) -> _Recipe:
    """Architecture, config and feature names: the caller's overrides, else the head's entry, else the file's."""
    architecture = architecture or entry.get("architecture") or metadata.get(ARCHITECTURE_KEY)
    if architecture is None:
        raise CheckpointError(
            f"{str(file)!r} does not say which architecture it holds; name the class with "
            "--model package.module:Class and --model-kwargs JSON (architecture=, config=)"
        )
    if config is None:
        config = entry["config"] if "config" in entry else _file_value(metadata, CONFIG_KEY, file, default={})
    if not isinstance(config, Mapping):
        raise CheckpointError(f"the model config for {str(file)!r} must be a JSON object, got {config!r}")
    names = entry.get("feature_names")
    if names is None:
        names = _file_value(metadata, FEATURE_NAMES_KEY, file, default=None)
    if names is not None and (not isinstance(names, list) or not all(isinstance(name, str) for name in names)):
        raise CheckpointError(f"feature names in {str(file)!r} must be a JSON array of strings, got {names!r}")
    return _Recipe(architecture, dict(config), None if names is None else list(names))


def _file_value(metadata: Mapping[str, str], key: str, file: Path, *, default: Any) -> Any:
    return json_metadata(metadata, key, file) if key in metadata else default


def _read_tensors(file: Path, keys: list[str], prefix: str | None) -> tuple[dict[str, Tensor], Tensor | None]:
    """The model's tensors (prefix stripped) and the states: the head's own, else the file's shared ones."""
    from safetensors import safe_open  # noqa: PLC0415 - keeps `import lightning_ig` light

    selected = keys if prefix is None else [key for key in keys if key.startswith(prefix)]
    own_states_key = (prefix or "") + STATES_KEY
    weights: dict[str, Tensor] = {}
    states: Tensor | None = None
    try:
        with safe_open(os.fspath(file), framework="pt", device="cpu") as handle:
            for key in selected:
                if key == own_states_key:
                    states = handle.get_tensor(key)
                elif not key.startswith(HEAD_SEPARATOR):  # other tensors reserved by this format
                    weights[key[len(prefix or "") :]] = handle.get_tensor(key)
            if states is None and prefix is not None and STATES_KEY in keys:
                states = handle.get_tensor(STATES_KEY)  # the file-level states, shared by every head
    except Exception as error:
        raise open_error(file, error) from error
    return weights, states


def _load_weights(model: nn.Module, weights: dict[str, Tensor], recipe: _Recipe, where: str) -> None:
    fit = f"{recipe.architecture} with config {recipe.config}"
    try:
        result = model.load_state_dict(weights, strict=False)
    except RuntimeError as error:  # shapes that do not match
        mismatch = next((line.strip() for line in str(error).splitlines() if "size mismatch" in line), str(error))
        raise CheckpointError(f"{where} do not fit {fit} ({mismatch}); check --model/--model-kwargs or the head") from error
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{where} do not fit {fit}: missing {few(result.missing_keys)}, "
            f"unexpected {few(result.unexpected_keys)}; check --model/--model-kwargs or the head"
        )


def load_lightning_checkpoint(
    path: str | os.PathLike[str], module_class: str, *, device: str | torch.device = "cpu"
) -> LoadedCheckpoint:
    """Load a Lightning ``.ckpt`` through its LightningModule's ``load_from_checkpoint``.

    Feature names come from the module's ``hparams["feature_names"]`` when it has them.

    Args:
        path: The ``.ckpt`` file.
        module_class: ``"package.module:Class"`` of the LightningModule.
        device: Where to put the module. Default ``"cpu"``.

    Returns:
        A :class:`LoadedCheckpoint` whose ``model`` is the LightningModule in eval mode.

    Raises:
        CheckpointError: If the file is missing or the module cannot load it.

    Example::

        >>> loaded = load_lightning_checkpoint("last.ckpt", "my_project.agents:DQN")  # doctest: +SKIP
    """
    file = existing_file(path)
    try:
        cls = resolve_model_class(module_class)
    except ValueError as error:
        raise CheckpointError(str(error)) from error
    loader = getattr(cls, "load_from_checkpoint", None)
    if not callable(loader):
        raise CheckpointError(f"{module_class!r} has no load_from_checkpoint(); name a LightningModule class")
    try:
        module = loader(os.fspath(file), map_location=torch.device(device))
    except Exception as error:  # pickle, key mismatches, the user's __init__
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(
            f"{module_class} cannot load {str(file)!r} ({type(error).__name__}: {first_line}); "
            "check that the file is a Lightning checkpoint of that class"
        ) from error
    module.eval()
    hparams = getattr(module, "hparams", {}) or {}
    names = hparams.get("feature_names") if hasattr(hparams, "get") else None
    return LoadedCheckpoint(
        model=module,
        feature_names=list(names) if names is not None else None,
        states=None,
        metadata={},
        prefix=None,
        architecture=module_class,
        config={},
        path=file,
    )
