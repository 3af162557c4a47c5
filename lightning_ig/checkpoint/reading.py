"""Rebuilding a model from a checkpoint: choose the head, build the architecture, load the weights."""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lightning_ig.attribution.checks import check_device
from lightning_ig.checkpoint.building import Recipe, build_checked, states_key, stored_tensors, weight_keys
from lightning_ig.checkpoint.heads import head_entry, heads_in, select_prefix
from lightning_ig.checkpoint.layout import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    FEATURE_NAMES_KEY,
    CheckpointError,
    LoadedCheckpoint,
    cut_short,
    existing_file,
    few,
    head_prefix,
    json_metadata,
    open_safetensors,
    read_metadata,
    tensor_keys,
)
from lightning_ig.models import resolve_model_class
from lightning_ig.vocabulary import check_bool, check_mapping, check_memory, check_text, shown

__all__ = ["load_checkpoint", "load_lightning_checkpoint"]

_QUOTED = r'"([^"]+)"'  # a key in load_state_dict's lists


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    device: str | torch.device = "cpu",
    head: str | None = None,
    architecture: str | None = None,
    config: Mapping[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> LoadedCheckpoint:
    """Rebuild the model stored in a safetensors checkpoint and load its weights.

    The file is data: its tensors and metadata are read, never executed, and nothing in it is unpickled. Only
    *registered* architectures (:func:`~lightning_ig.models.register_model`, the built-in networks) are built from its
    metadata. An import path ``"package.module:Class"`` the file names is refused with a :class:`CheckpointError` before
    anything is imported, unless you name the class yourself (``architecture=``) or pass ``trust_remote_code=True``. The
    config is bounded by the file: the model is first built on the ``meta`` device (nothing allocated) and refused when
    it holds more than the tensors stored (twice their values plus 2**20) or when its state-dict shapes differ from
    theirs; so the class's constructor runs twice, on ``meta`` and then for real (once, for real, if it cannot run on
    ``meta``).

    Args:
        path: The checkpoint.
        prefix: For a merged file, the key prefix of the head to load (``"trending__"``, or the head's name); only those
            tensors are read and the prefix is stripped. Default ``None``.
        device: Where the model and states go. Default ``"cpu"``.
        head: The head by name (``"trending"`` = ``prefix="trending__"``); not with ``prefix``.
        architecture: Override (or supply, for files without it) the architecture: a registered name or
            ``"package.module:Class"``, imported because you name it. Default ``None``: the file's, which must be
            registered.
        config: Override (or supply) the constructor's keyword arguments. Default ``None``: the file's. Names inside it
            are yours, so they may be import paths; names inside the file's config must be registered.
        trust_remote_code: Import the import paths the *file* names (its architecture and those inside its config),
            which runs those modules' code. Only for files whose origin you trust, with the modules they name on your
            path. Default ``False``.

    The weights are loaded as stored: a float tensor the model's dtype holds exactly (float16 into float32) is loaded
    into it, a wider one (float64 into a float32 model) builds the model in the wider dtype rather than rounding it; a
    bool or integer tensor where the model has a float one (or the other way round) is refused.

    Returns:
        A :class:`LoadedCheckpoint`, the model in eval mode, the stored states (if any) on ``device`` in the dtype of
        the model's floating-point parameters (float32 unless its weights were stored wider), their values otherwise as
        stored; whoever uses them checks them.

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors; the prefix is not a head of the file
            (the message lists the heads that are); the file holds several heads and none was chosen; the architecture
            is unknown, or an import path from the file without ``trust_remote_code`` (nothing is imported); the config
            describes a model larger than the stored tensors (nothing is allocated); the weights do not fit it (their
            shapes, or a dtype that would change their meaning), or not in the memory available; the stored states are
            booleans or complex numbers; or the file is in another format than this version's (``lightning_ig.format``).
        ValueError: If both ``head`` and ``prefix`` are given.
        TypeError: If ``architecture``, ``config`` or ``trust_remote_code`` has the wrong type.

    Example::

        >>> loaded = load_checkpoint("heads.safetensors", head="trending")  # doctest: +SKIP
        >>> loaded.model(loaded.states).shape  # doctest: +SKIP
        torch.Size([64, 3])
    """
    device = check_device(device, "device")
    architecture = None if architecture is None else check_text(architecture, "architecture")
    config = None if config is None else check_mapping(config, "config")
    trust_remote_code = check_bool(trust_remote_code, "trust_remote_code")
    file = existing_file(path)
    metadata, keys = read_metadata(file), tensor_keys(file)
    prefix = select_prefix(_requested_prefix(prefix, head), heads_in(metadata, keys, file), keys, file)
    recipe = _recipe(metadata, head_entry(metadata, prefix, file), file, architecture, config)
    where = f"the weights in {str(file)!r}{' under ' + repr(prefix) if prefix else ''}"
    stored = stored_tensors(file, keys, prefix)
    try:  # the tensors are read, and a model as large is built: both must fit
        check_memory(
            2 * stored.nbytes, f"loading the tensors of {str(file)!r}", "load it on a machine with more memory"
        )
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    model = build_checked(recipe, stored, trust_remote_code=trust_remote_code, file=file, where=where)
    weights, states = _read_tensors(file, keys, prefix)
    _load_weights(model, weights, recipe, where)
    model.to(device).eval()
    # the states in the dtype the model computes in, so that it takes them (a float64 model, float32 states)
    dtype = next((tensor.dtype for tensor in model.parameters() if tensor.is_floating_point()), torch.float32)
    return LoadedCheckpoint(
        model=model,
        feature_names=recipe.feature_names,
        states=None if states is None else states.to(device=device, dtype=dtype),
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
    metadata: Mapping[str, str],
    entry: Mapping[str, Any],
    file: Path,
    architecture: str | None,
    config: Mapping[str, Any] | None,
) -> Recipe:
    """Architecture, config and feature names: the caller's overrides, else the head's entry, else the file's."""
    from_caller = (architecture is not None, config is not None)
    architecture = architecture or entry.get("architecture") or metadata.get(ARCHITECTURE_KEY)
    if architecture is not None and not isinstance(architecture, str):
        raise CheckpointError(f"the architecture named in {str(file)!r} must be a string, got {shown(architecture)}")
    if architecture is None:
        raise CheckpointError(
            f"{str(file)!r} does not say which architecture it holds; name the class with "
            "--model package.module:Class and --model-kwargs JSON (architecture=, config=)"
        )
    if config is None:
        config = entry["config"] if "config" in entry else _file_value(metadata, CONFIG_KEY, file, default={})
    if not isinstance(config, Mapping):
        raise CheckpointError(f"the model config for {str(file)!r} must be a JSON object, got {shown(config)}")
    names = entry.get("feature_names")
    if names is None:
        names = _file_value(metadata, FEATURE_NAMES_KEY, file, default=None)
    if names is not None and (not isinstance(names, list) or not all(isinstance(name, str) for name in names)):
        raise CheckpointError(f"feature names in {str(file)!r} must be a JSON array of strings, got {shown(names)}")
    return Recipe(architecture, dict(config), None if names is None else list(names), *from_caller)


def _file_value(metadata: Mapping[str, str], key: str, file: Path, *, default: Any) -> Any:
    return json_metadata(metadata, key, file) if key in metadata else default


def _read_tensors(file: Path, keys: list[str], prefix: str | None) -> tuple[dict[str, Tensor], Tensor | None]:
    """The model's tensors (prefix stripped) and the states: the head's own, else the file's shared ones."""
    selected, stored = weight_keys(keys, prefix), states_key(keys, prefix)
    weights: dict[str, Tensor] = {}
    states: Tensor | None = None
    with open_safetensors(file) as handle:
        for key, model_key in selected.items():
            weights[model_key] = handle.get_tensor(key)
        if stored is not None:  # the head's own, else the file-level states, shared by every head
            states = handle.get_tensor(stored)
    if states is not None and (states.dtype == torch.bool or states.is_complex()):  # a mask or complex: not states
        raise CheckpointError(
            f"the states in {str(file)!r} are stored as {states.dtype}; states are real numbers: store them as "
            "floats (save_checkpoint(..., states=)) or pass --states PATH"
        )
    return weights, states


def _load_weights(model: nn.Module, weights: dict[str, Tensor], recipe: Recipe, where: str) -> None:
    fit = recipe.described
    _match_dtypes(model, weights, where)
    try:
        result = model.load_state_dict(weights, strict=False)
    except RuntimeError as error:  # shapes that do not match
        mismatch = next((line.strip() for line in str(error).splitlines() if "size mismatch" in line), str(error))
        raise CheckpointError(
            f"{where} do not fit {fit} ({mismatch}); check --model/--model-kwargs or the head"
        ) from error
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{where} do not fit {fit}: missing {few(result.missing_keys)}, "
            f"unexpected {few(result.unexpected_keys)}; check --model/--model-kwargs or the head"
        )


def _holds(mine: torch.dtype, stored: torch.dtype) -> bool:
    """Every value of the floating dtype ``stored`` is one of ``mine`` (float16 in float32, float8 in bfloat16)."""
    wide, narrow = torch.finfo(mine), torch.finfo(stored)
    return wide.bits >= narrow.bits and wide.max >= narrow.max and wide.eps <= narrow.eps and wide.tiny <= narrow.tiny


def _match_dtypes(model: nn.Module, weights: dict[str, Tensor], where: str) -> None:
    """Load the file's values as they are (the rule :func:`load_checkpoint`'s docstring states); an integer narrowed is
    refused too: a cast would change what the tensor means."""
    own = model.state_dict()
    wider: torch.dtype | None = None
    for key, stored in weights.items():
        mine = own.get(key)
        if mine is None or stored.dtype == mine.dtype:
            continue
        floats = (stored.is_floating_point(), mine.is_floating_point())
        if all(floats):
            if not _holds(mine.dtype, stored.dtype):
                wider = torch.promote_types(wider or mine.dtype, stored.dtype)
        elif any(floats) or torch.promote_types(stored.dtype, mine.dtype) != mine.dtype:
            raise CheckpointError(
                f"{where}: {key!r} is stored as {stored.dtype} but the model's is {mine.dtype}; loading it would "
                "change its values' meaning: save the model's own state_dict (save_checkpoint), or give the "
                "architecture that made it (--model, architecture=)"
            )
    if wider is not None:
        model.to(wider)  # the file's precision kept: the model computes in it (the command line's states follow)


def load_lightning_checkpoint(
    path: str | os.PathLike[str], module_class: str, *, device: str | torch.device = "cpu"
) -> LoadedCheckpoint:
    """Load a Lightning ``.ckpt`` through its LightningModule's ``load_from_checkpoint``.

    Feature names come from the module's ``hparams["feature_names"]`` when it has them.

    Not for files of unknown origin: a ``.ckpt`` is a pickle, read by ``torch.load`` inside the module's
    ``load_from_checkpoint``, and unpickling can run code the file holds (how much torch allows depends on its
    ``weights_only`` default and on the module). :func:`load_checkpoint` never takes this path; only a call to this
    function (``lightning-ig diag --lightning-module``) does. ``module_class`` is imported because you name it.

    Args:
        path: The ``.ckpt`` file.
        module_class: ``"package.module:Class"`` of the LightningModule (imported).
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
        cls = resolve_model_class(module_class, allow_import=True)  # the caller's own words
    except ValueError as error:
        raise CheckpointError(str(error).replace("a model class", "a LightningModule class")) from error
    loader = getattr(cls, "load_from_checkpoint", None)
    if not callable(loader):
        raise CheckpointError(f"{module_class!r} has no load_from_checkpoint(); name a LightningModule class")
    with file.open("rb") as handle:  # torch.save writes a zip archive, its directory last: torch says "Errno 22"
        cut = handle.read(4) in (b"", b"PK\x03\x04") and not zipfile.is_zipfile(handle)  # empty: "(EOFError: )"
    if cut:
        raise cut_short(file)
    try:
        module = loader(os.fspath(file), map_location=torch.device(device))
    except Exception as error:  # pickle, key mismatches, the user's __init__
        # torch.load's weights-only unpickler (its default) gives its reason after a preamble on weights_only=False,
        # which diag never passes: the reason alone is said, its first sentence
        reason = str(error).partition("WeightsUnpickler error:")[2].strip() or str(error)
        lists = re.findall(r"(Missing|Unexpected) key\(s\) in state_dict: (.*)", reason)  # load_state_dict's: every key
        named = ", ".join(f"{kind.lower()} {few(re.findall(_QUOTED, listed))}" for kind, listed in lists)
        lines = [line.strip() for line in reason.splitlines() if line.strip()] or [""]  # else its header and first line
        first_line = named or " ".join(lines[:2] if lines[0].endswith(":") else lines[:1]).split(". ")[0]
        raise CheckpointError(
            f"{module_class} cannot load {str(file)!r} ({type(error).__name__}: {first_line}); "
            + (
                "it is read with torch.load(weights_only=True), which takes tensors and plain values only: check "
                "that the file is a Lightning checkpoint, and save its hyperparameters as plain values (vars(args), "
                "str(path))"
                if "WeightsUnpickler" in str(error)
                else "check that the file is a Lightning checkpoint of that class (its modules wrapped or compiled as "
                "when saved), and that its __init__ keeps the arguments it takes (self.save_hyperparameters()): "
                "load_from_checkpoint rebuilds it from them"
            )
        ) from error
    module.eval()
    hparams = getattr(module, "hparams", {}) or {}
    names = hparams.get("feature_names") if hasattr(hparams, "get") else None
    return LoadedCheckpoint(
        model=module,
        feature_names=list(names) if names is not None else None,
        states=None,
        metadata={},
        architecture=module_class,
        path=file,
    )
