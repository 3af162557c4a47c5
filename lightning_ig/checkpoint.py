"""Safetensors checkpoints that rebuild their own model: architecture, config, feature names, held-out states.

File layout (one safetensors file):

* tensors: the model's ``state_dict()`` under its own keys, plus the held-out
  states, if any, as the float32 tensor ``__states__`` ``(num_states, *feature_shape)``;
* metadata (safetensors allows only ``str -> str``):

  ========================== ==========================================================
  ``lightning_ig.format``    ``"1"``
  ``lightning_ig.architecture`` a registered model name (``"DuelingQNetwork"``) or an
                             import path ``"package.module:Class"``
  ``lightning_ig.config``    the constructor's keyword arguments, JSON
  ``lightning_ig.feature_names`` JSON array of names, one per input feature (optional)
  ========================== ==========================================================

  plus any metadata of the user's own.

A *merged* file holds several heads, each under a prefix ``<head>__`` (for example
``trending__value.0.weight_mu`` and ``ranging__value.0.weight_mu``), the head's own
states as ``<head>____states__`` (its prefix + ``__states__``), and per-head
architecture, config and feature names in ``lightning_ig.heads``, a JSON object
``{"<head>": {"architecture": ..., "config": {...}, "feature_names": [...]}}``.
Loading with ``prefix="trending__"`` reads only the keys under that prefix and
strips it, so a head loads exactly like a single-model file. A head without its
own entry or states falls back on the file-level ones. Write merged files with
:func:`save_merged_checkpoint` (models) or :func:`merge_checkpoints` (files).

Every write goes to a temporary file in the target folder first, then is renamed
over the target, so a reader never sees a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn

from lightning_ig._files import atomic_path
from lightning_ig.models import build_model, model_config, model_name, resolve_model_class

__all__ = [
    "CheckpointError",
    "LoadedCheckpoint",
    "save_checkpoint",
    "save_merged_checkpoint",
    "merge_checkpoints",
    "load_checkpoint",
    "load_lightning_checkpoint",
    "list_heads",
    "read_metadata",
    "load_states",
    "states_beside",
    "head_prefix",
    "STATES_KEY",
    "HEAD_SEPARATOR",
    "FORMAT_KEY",
    "ARCHITECTURE_KEY",
    "CONFIG_KEY",
    "FEATURE_NAMES_KEY",
    "HEADS_KEY",
]

FORMAT_VERSION = "1"
FORMAT_KEY = "lightning_ig.format"
ARCHITECTURE_KEY = "lightning_ig.architecture"
CONFIG_KEY = "lightning_ig.config"
FEATURE_NAMES_KEY = "lightning_ig.feature_names"
HEADS_KEY = "lightning_ig.heads"
#: tensor key of the held-out states in a checkpoint (a head's are ``<head>__`` + this)
STATES_KEY = "__states__"
#: what separates a head's name from its tensor keys in a merged file
HEAD_SEPARATOR = "__"
_RESERVED_PREFIX = "lightning_ig."
#: file suffixes of the state files :func:`states_beside` looks for, in this order
STATE_SUFFIXES = (".safetensors", ".npy", ".json")


class CheckpointError(ValueError):
    """A checkpoint or states file that cannot be used; the message says why and what to do."""


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` returns.

    Attributes:
        model: The rebuilt model with the weights loaded, in eval mode, on the requested device.
        feature_names: Names of the input features from the metadata, or ``None``.
        states: Held-out states stored in the file ``(num_states, *feature_shape)``, or ``None``.
        metadata: The file's metadata (``str -> str``), all of it.
        prefix: The head prefix loaded (``"trending__"``), or ``None`` for a single-model file.
        architecture: The architecture name the model was built from.
        config: The config the model was built with.
        path: The file read.
    """

    model: nn.Module
    feature_names: list[str] | None
    states: Tensor | None
    metadata: dict[str, str]
    prefix: str | None = None
    architecture: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def head(self) -> str | None:
        """The head's name (the prefix without its trailing ``__``), or ``None``."""
        if self.prefix is None:
            return None
        return self.prefix[: -len(HEAD_SEPARATOR)] if self.prefix.endswith(HEAD_SEPARATOR) else self.prefix


def head_prefix(head: str) -> str:
    """The tensor-key prefix of a head: ``"trending" -> "trending__"``.

    Raises:
        ValueError: If ``head`` is empty or contains the separator ``"__"``.
    """
    if not isinstance(head, str) or not head or HEAD_SEPARATOR in head:
        raise ValueError(f"a head name must be a non-empty string without {HEAD_SEPARATOR!r}, got {head!r}")
    return head + HEAD_SEPARATOR


# --------------------------------------------------------------------------------------------------
# writing


def _check_feature_names(feature_names: Sequence[str] | None) -> list[str] | None:
    if feature_names is None:
        return None
    if isinstance(feature_names, str) or not all(isinstance(name, str) for name in feature_names):
        raise TypeError(f"feature_names must be a sequence of strings, got {feature_names!r}")
    return list(feature_names)


def _check_states(states: Tensor | None, what: str = "states") -> Tensor | None:
    if states is None:
        return None
    if not isinstance(states, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of shape (num_states, *feature_shape), got {type(states).__name__}")
    if states.ndim < 2 or states.shape[0] < 1:
        raise ValueError(f"{what} must have shape (num_states >= 1, *feature_shape), got {tuple(states.shape)}")
    if not states.is_floating_point():
        raise TypeError(f"{what} must be floating point, got {states.dtype}")
    return states.detach().to("cpu", torch.float32).contiguous().clone()


def _check_user_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str -> str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str (safetensors' rule), got {key!r}: {value!r}; json.dumps other values")
        if key.startswith(_RESERVED_PREFIX):
            raise ValueError(f"metadata key {key!r} uses the reserved prefix {_RESERVED_PREFIX!r}; rename it")
    return dict(metadata)


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside ``torch.compile`` / DDP / DataParallel wrappers, whose keys and class are the real ones."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if inner is None and isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _model_tensors(model: nn.Module) -> dict[str, Tensor]:
    # Copies on the CPU: safetensors refuses tensors that share storage (tied weights).
    return {key: value.detach().to("cpu").contiguous().clone() for key, value in model.state_dict().items()}


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


def _atomic_save(tensors: dict[str, Tensor], path: str | os.PathLike[str], metadata: dict[str, str]) -> Path:
    from safetensors.torch import save_file  # noqa: PLC0415 - keeps `import lightning_ig` light

    target = Path(path)
    if target.is_dir():
        raise ValueError(f"checkpoint path {str(target)!r} is a directory; give a file name ending in .safetensors")
    with atomic_path(target) as temporary:
        save_file(tensors, os.fspath(temporary), metadata=metadata)
    return target


def save_checkpoint(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    feature_names: Sequence[str] | None = None,
    states: Tensor | None = None,
    metadata: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` to a safetensors file that :func:`load_checkpoint` rebuilds without user code.

    Args:
        model: The model (``torch.compile`` and DDP wrappers are looked through). Its class should be registered (:func:`~lightning_ig.models.register_model`)
            or importable as ``package.module:Class``, with a ``config()`` method returning its
            constructor's keyword arguments (or pass ``config``).
        path: Where to write (parents are created). Written atomically.
        feature_names: One name per input feature, stored in the metadata. Default ``None``.
        states: Held-out states ``(num_states, *feature_shape)`` stored as ``__states__`` (float32). Default ``None``.
        metadata: Extra ``str -> str`` metadata. Keys may not start with ``"lightning_ig."``.
        config: The constructor's keyword arguments when the model has no ``config()``. Default ``None``.

    Returns:
        The path written.

    Raises:
        TypeError: If an argument has the wrong type or the config is not JSON-serialisable.
        ValueError: If ``states`` has a bad shape, ``feature_names`` does not match the states'
            width, or ``metadata`` uses a reserved key.

    Example::

        >>> from lightning_ig.models import DuelingQNetwork
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
    names = _check_feature_names(feature_names)
    stored_states = _check_states(states)
    if names is not None and stored_states is not None and stored_states[0].numel() != len(names):
        raise ValueError(f"feature_names has {len(names)} names but the states have {stored_states[0].numel()} features; give one name per feature")
    architecture, model_kwargs = _architecture(model, config)
    meta = _check_user_metadata(metadata)
    meta[FORMAT_KEY] = FORMAT_VERSION
    meta[ARCHITECTURE_KEY] = architecture
    if model_kwargs is not None:
        meta[CONFIG_KEY] = json.dumps(model_kwargs, sort_keys=True)
    if names is not None:
        meta[FEATURE_NAMES_KEY] = json.dumps(names)
    if stored_states is not None:
        if STATES_KEY in tensors:
            raise ValueError(f"the model has a tensor named {STATES_KEY!r}, which is reserved for the states; rename it")
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
        path: Where to write (atomically).
        feature_names: Names shared by every head (stored at file level), or head -> names.
        states: States shared by every head (stored as ``__states__``), or head -> states
            (stored as ``<head>____states__``).
        metadata: Extra ``str -> str`` metadata.

    Returns:
        The path written.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If there is no head, a head name is invalid, or a mapping names an unknown head.
    """
    if not isinstance(heads, Mapping) or not heads:
        raise ValueError(f"heads must be a non-empty mapping of head name -> model, got {heads!r}")
    tensors: dict[str, Tensor] = {}
    head_info: dict[str, dict[str, Any]] = {}
    per_head_names = feature_names if isinstance(feature_names, Mapping) else {}
    per_head_states = states if isinstance(states, Mapping) else {}
    for mapping, what in ((per_head_names, "feature_names"), (per_head_states, "states")):
        unknown = set(mapping) - set(heads)
        if unknown:
            raise ValueError(f"{what} names heads {sorted(unknown)} that are not in heads {sorted(heads)}")
    for head, model in heads.items():
        prefix = head_prefix(head)
        model = _unwrap(model)
        architecture, model_kwargs = _architecture(model, None)
        info: dict[str, Any] = {"architecture": architecture}
        if model_kwargs is not None:
            info["config"] = model_kwargs
        if head in per_head_names:
            info["feature_names"] = _check_feature_names(per_head_names[head])
        head_info[head] = info
        tensors.update({prefix + key: value for key, value in _model_tensors(model).items()})
        if head in per_head_states:
            tensors[prefix + STATES_KEY] = _check_states(per_head_states[head], f"states[{head!r}]")  # type: ignore[assignment]
    meta = _check_user_metadata(metadata)
    meta[FORMAT_KEY] = FORMAT_VERSION
    meta[HEADS_KEY] = json.dumps(head_info, sort_keys=True)
    if feature_names is not None and not isinstance(feature_names, Mapping):
        meta[FEATURE_NAMES_KEY] = json.dumps(_check_feature_names(feature_names))
    if states is not None and not isinstance(states, Mapping):
        tensors[STATES_KEY] = _check_states(states)  # type: ignore[assignment]
    return _atomic_save(tensors, path, meta)


def merge_checkpoints(
    sources: Mapping[str, str | os.PathLike[str]], path: str | os.PathLike[str], *, metadata: Mapping[str, str] | None = None
) -> Path:
    """Merge single-model checkpoint files into one multi-head file.

    Each source's tensors (its states included) go under ``<head>__``; its
    architecture, config and feature names go into ``lightning_ig.heads``.

    Args:
        sources: Head name -> path of a checkpoint written by :func:`save_checkpoint`.
        path: The merged file to write (atomically).
        metadata: Extra ``str -> str`` metadata for the merged file.

    Returns:
        The path written.

    Raises:
        CheckpointError: If a source cannot be read or is itself a merged file.
        ValueError: If there is no source or a head name is invalid.
    """
    from safetensors import safe_open  # noqa: PLC0415

    if not isinstance(sources, Mapping) or not sources:
        raise ValueError(f"sources must be a non-empty mapping of head name -> checkpoint path, got {sources!r}")
    tensors: dict[str, Tensor] = {}
    head_info: dict[str, dict[str, Any]] = {}
    for head, source in sources.items():
        prefix = head_prefix(head)
        source_meta = read_metadata(source)
        if HEADS_KEY in source_meta:
            raise CheckpointError(f"{os.fspath(source)!r} is already a merged file; merge single-model checkpoints")
        info: dict[str, Any] = {}
        if ARCHITECTURE_KEY in source_meta:
            info["architecture"] = source_meta[ARCHITECTURE_KEY]
        if CONFIG_KEY in source_meta:
            info["config"] = _json_metadata(source_meta, CONFIG_KEY, source)
        if FEATURE_NAMES_KEY in source_meta:
            info["feature_names"] = _json_metadata(source_meta, FEATURE_NAMES_KEY, source)
        head_info[head] = info
        with safe_open(os.fspath(source), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                tensors[prefix + key] = handle.get_tensor(key)
    meta = _check_user_metadata(metadata)
    meta[FORMAT_KEY] = FORMAT_VERSION
    meta[HEADS_KEY] = json.dumps(head_info, sort_keys=True)
    return _atomic_save(tensors, path, meta)


# --------------------------------------------------------------------------------------------------
# reading


def _open_error(path: Path, error: BaseException) -> CheckpointError:
    return CheckpointError(
        f"{str(path)!r} is not a readable safetensors file ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
        "give a checkpoint written by lightning_ig.save_checkpoint or safetensors"
    )


def _existing_file(path: str | os.PathLike[str], what: str = "checkpoint") -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} path must be a str or os.PathLike, got {type(path).__name__}")
    file = Path(path)
    if not file.exists():
        raise CheckpointError(f"{what} {str(file)!r} does not exist; check the path")
    if file.is_dir():
        raise CheckpointError(f"{what} {str(file)!r} is a directory; give the file itself")
    if not os.access(file, os.R_OK):
        raise CheckpointError(f"{what} {str(file)!r} is not readable (permission denied); check its permissions")
    return file


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of a safetensors file (``{}`` when it has none).

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors.
    """
    from safetensors import safe_open  # noqa: PLC0415

    file = _existing_file(path)
    try:
        with safe_open(os.fspath(file), framework="pt", device="cpu") as handle:
            return dict(handle.metadata() or {})
    except Exception as error:  # safetensors raises its own SafetensorError, or OSError
        raise _open_error(file, error) from error


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open  # noqa: PLC0415

    try:
        with safe_open(os.fspath(path), framework="pt", device="cpu") as handle:
            return list(handle.keys())
    except Exception as error:
        raise _open_error(path, error) from error


def _json_metadata(metadata: Mapping[str, str], key: str, path: Any) -> Any:
    try:
        return json.loads(metadata[key])
    except json.JSONDecodeError as error:
        raise CheckpointError(f"metadata {key!r} of {os.fspath(path)!r} is not valid JSON ({error}); rewrite the checkpoint") from error


def _heads_from(metadata: Mapping[str, str], keys: Sequence[str], path: Path) -> list[str]:
    if HEADS_KEY in metadata:
        heads = _json_metadata(metadata, HEADS_KEY, path)
        if not isinstance(heads, dict):
            raise CheckpointError(f"metadata {HEADS_KEY!r} of {str(path)!r} must be a JSON object of heads")
        return list(heads)
    if FORMAT_KEY in metadata:
        return []  # written by save_checkpoint: a single model
    # Files merged by other tools: every key is "<head>__<rest>" with a non-empty head.
    heads: list[str] = []
    for key in keys:
        if key == STATES_KEY:
            continue
        head, separator, rest = key.partition(HEAD_SEPARATOR)
        if not separator or not head or not rest:
            return []
        if head not in heads:
            heads.append(head)
    return heads


def list_heads(path: str | os.PathLike[str]) -> list[str]:
    """The head names in a merged checkpoint (``[]`` for a single-model file).

    Args:
        path: A safetensors checkpoint.

    Returns:
        Head names, without the ``"__"`` that ends their prefix, in the order the file lists them.

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors.
    """
    file = _existing_file(path)
    return _heads_from(read_metadata(file), _keys(file), file)


def _strip_prefix(prefix: str | None, head: str | None) -> str | None:
    if head is not None and prefix is not None:
        raise ValueError(f"give a head ({head!r}) or a prefix ({prefix!r}), not both")
    if head is not None:
        return head_prefix(head)
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise ValueError(f"prefix must be a non-empty string such as 'trending__', got {prefix!r}")
    return prefix


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
        prefix: For a merged file, the key prefix of the head to load (``"trending__"``);
            only those tensors are read and the prefix is stripped. Default ``None``.
        device: Where the model and states go. Default ``"cpu"``.
        head: The head by name (``"trending"`` = ``prefix="trending__"``); not with ``prefix``.
        architecture: Override (or supply, for files without it) the architecture:
            a registered name or ``"package.module:Class"``.
        config: Override (or supply) the constructor's keyword arguments.

    Returns:
        A :class:`LoadedCheckpoint`, the model in eval mode.

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors; the prefix is not
            in the file (the message lists the heads that are); the file holds several heads and
            none was chosen; the architecture is unknown; or the weights do not fit it.
        ValueError: If both ``head`` and ``prefix`` are given.

    Example::

        >>> loaded = load_checkpoint("heads.safetensors", head="trending")  # doctest: +SKIP
        >>> loaded.model(loaded.states).shape  # doctest: +SKIP
        torch.Size([64, 3])
    """
    from safetensors import safe_open  # noqa: PLC0415

    prefix = _strip_prefix(prefix, head)
    file = _existing_file(path)
    metadata = read_metadata(file)
    keys = _keys(file)
    heads = _heads_from(metadata, keys, file)
    head_meta: dict[str, Any] = {}
    if prefix is not None and not prefix.endswith(HEAD_SEPARATOR) and prefix in heads:
        prefix += HEAD_SEPARATOR  # a head's name given as its prefix: "trending" means "trending__"
    if prefix is None and heads:
        raise CheckpointError(
            f"{str(file)!r} holds several heads ({', '.join(heads)}); choose one with --head NAME "
            "(prefix=NAME__) or run each with --all-heads"
        )
    if prefix is not None:
        selected = [key for key in keys if key.startswith(prefix)]
        if not selected:
            listing = f"the heads in it are: {', '.join(heads)}" if heads else "it is a single-model file; drop the head/prefix"
            raise CheckpointError(f"no tensors under prefix {prefix!r} in {str(file)!r}; {listing}")
        name = prefix[: -len(HEAD_SEPARATOR)] if prefix.endswith(HEAD_SEPARATOR) else prefix
        if HEADS_KEY in metadata:
            head_meta = dict(_json_metadata(metadata, HEADS_KEY, file).get(name) or {})
    else:
        selected = keys

    if architecture is None:
        architecture = head_meta.get("architecture") or metadata.get(ARCHITECTURE_KEY)
    if architecture is None:
        raise CheckpointError(
            f"{str(file)!r} does not say which architecture it holds; name the class with "
            "--model package.module:Class and --model-kwargs JSON (architecture=, config=)"
        )
    if config is None:
        if "config" in head_meta:
            config = head_meta["config"]
        elif CONFIG_KEY in metadata:
            config = _json_metadata(metadata, CONFIG_KEY, file)
        else:
            config = {}
    if not isinstance(config, Mapping):
        raise CheckpointError(f"the model config for {str(file)!r} must be a JSON object, got {config!r}")
    names_value = head_meta.get("feature_names")
    if names_value is None and FEATURE_NAMES_KEY in metadata:
        names_value = _json_metadata(metadata, FEATURE_NAMES_KEY, file)
    if names_value is not None and (not isinstance(names_value, list) or not all(isinstance(n, str) for n in names_value)):
        raise CheckpointError(f"feature names in {str(file)!r} must be a JSON array of strings, got {names_value!r}")

    try:
        model = build_model(architecture, dict(config))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"cannot rebuild the model of {str(file)!r}: {error}") from error

    strip = len(prefix) if prefix is not None else 0
    own_states_key = (prefix or "") + STATES_KEY
    weights: dict[str, Tensor] = {}
    states: Tensor | None = None
    try:
        with safe_open(os.fspath(file), framework="pt", device="cpu") as handle:
            for key in selected:
                if key == own_states_key:
                    states = handle.get_tensor(key)
                elif not key.startswith(HEAD_SEPARATOR):  # other tensors reserved by this format
                    weights[key[strip:]] = handle.get_tensor(key)
            if states is None and prefix is not None and STATES_KEY in keys:
                states = handle.get_tensor(STATES_KEY)  # the file-level states, shared by every head
    except Exception as error:
        raise _open_error(file, error) from error

    where = f"the weights in {str(file)!r}{' under ' + repr(prefix) if prefix else ''}"
    try:
        result = model.load_state_dict(weights, strict=False)
    except RuntimeError as error:  # shapes that do not match
        mismatch = next((line.strip() for line in str(error).splitlines() if "size mismatch" in line), str(error))
        raise CheckpointError(
            f"{where} do not fit {architecture} with config {dict(config)} ({mismatch}); check --model/--model-kwargs or the head"
        ) from error
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{where} do not fit {architecture} with config {dict(config)}: missing {_few(result.missing_keys)}, "
            f"unexpected {_few(result.unexpected_keys)}; check --model/--model-kwargs or the head"
        )
    model.to(device).eval()
    if states is not None:
        states = states.to(device=device, dtype=torch.float32)
    return LoadedCheckpoint(
        model=model,
        feature_names=list(names_value) if names_value is not None else None,
        states=states,
        metadata=metadata,
        prefix=prefix,
        architecture=architecture,
        config=dict(config),
        path=file,
    )


def _few(keys: Sequence[str], limit: int = 4) -> str:
    if not keys:
        return "none"
    shown = ", ".join(keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)})"


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
    """
    file = _existing_file(path)
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


# --------------------------------------------------------------------------------------------------
# states files


def load_states(path: str | os.PathLike[str], *, prefix: str | None = None) -> Tensor:
    """Read held-out states from ``.json``, ``.npy`` or ``.safetensors``.

    * ``.json``: ``{"states": [[...], ...]}`` (a bare list of lists is accepted too);
    * ``.npy``: a 2-d (or higher) float array;
    * ``.safetensors``: the tensor ``<prefix>__states__``, else ``__states__``, else
      ``states``, else the file's only tensor.

    Args:
        path: The file.
        prefix: A head prefix to look for first in a ``.safetensors`` file.

    Returns:
        float32 states ``(num_states, *feature_shape)`` on the CPU.

    Raises:
        CheckpointError: If the file is missing, unreadable, of an unknown kind, or holds no usable states.
    """
    file = _existing_file(path, "states file")
    suffix = file.suffix.lower()
    try:
        if suffix == ".json":
            document = json.loads(file.read_text(encoding="utf-8"))
            rows = document.get("states") if isinstance(document, dict) else document
            if rows is None:
                raise CheckpointError(f"states file {str(file)!r} has no \"states\" key; write {{\"states\": [[...], ...]}}")
            states = torch.tensor(rows, dtype=torch.float32)
        elif suffix == ".npy":
            import numpy as np  # noqa: PLC0415

            array = np.load(file, allow_pickle=False)
            if not np.issubdtype(array.dtype, np.number):
                raise CheckpointError(f"states file {str(file)!r} holds {array.dtype} values; save a float array")
            states = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
        elif suffix == ".safetensors":
            from safetensors import safe_open  # noqa: PLC0415

            with safe_open(os.fspath(file), framework="pt", device="cpu") as handle:
                keys = list(handle.keys())
                candidates = ([prefix + STATES_KEY] if prefix else []) + [STATES_KEY, "states"]
                key = next((k for k in candidates if k in keys), keys[0] if len(keys) == 1 else None)
                if key is None:
                    raise CheckpointError(
                        f"states file {str(file)!r} has no {STATES_KEY!r} or 'states' tensor (it has {_few(keys)}); "
                        "store the states under one of those keys"
                    )
                states = handle.get_tensor(key).to(torch.float32)
        else:
            raise CheckpointError(f"states file {str(file)!r} must end in .json, .npy or .safetensors, not {suffix or 'nothing'!r}")
    except CheckpointError:
        raise
    except Exception as error:  # JSON syntax, ragged lists, corrupt files
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(f"cannot read states from {str(file)!r} ({type(error).__name__}: {first_line}); check the file") from error
    if states.ndim == 1:
        raise CheckpointError(
            f"states in {str(file)!r} have shape {tuple(states.shape)}: expected (num_states, state_dim); wrap one state as [[...]]"
        )
    if states.ndim < 2 or states.shape[0] == 0:
        raise CheckpointError(f"states in {str(file)!r} have shape {tuple(states.shape)}: expected at least one state")
    return states.contiguous()


def states_beside(checkpoint: str | os.PathLike[str]) -> Path | None:
    """A states file next to ``checkpoint``: ``<stem>.states.{safetensors,npy,json}``, then ``states.{...}``.

    Args:
        checkpoint: The checkpoint's path.

    Returns:
        The first such file that exists, else ``None``.
    """
    file = Path(checkpoint)
    stem = file.name[: -len(file.suffix)] if file.suffix else file.name
    for base in (f"{stem}.states", "states"):
        for suffix in STATE_SUFFIXES:
            candidate = file.with_name(base + suffix)
            if candidate.is_file() and candidate != file:
                return candidate
    return None

