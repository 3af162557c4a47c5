"""The checkpoint file's layout: metadata keys, the error type, what a load returns, and reading a file's header.

Shared by :mod:`.writing`, :mod:`.heads`, :mod:`.reading` and :mod:`.states`; the layout itself:
``docs/ARCHITECTURE.md`` (contracts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lightning_ig._files import InputPathError, check_input_file
from lightning_ig._json import parse_json
from lightning_ig.vocabulary import shown

__all__ = [
    "ARCHITECTURE_KEY",
    "CONFIG_KEY",
    "FEATURE_NAMES_KEY",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "HEADS_KEY",
    "HEAD_SEPARATOR",
    "RESERVED_PREFIX",
    "STATES_KEY",
    "TRUNCATED",
    "CheckpointError",
    "LoadedCheckpoint",
    "check_format",
    "cut_short",
    "existing_file",
    "few",
    "head_prefix",
    "json_metadata",
    "open_error",
    "open_safetensors",
    "read_metadata",
    "tensor_keys",
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
#: metadata keys under this prefix belong to the format, not to the user
RESERVED_PREFIX = "lightning_ig."


class CheckpointError(ValueError):
    """A checkpoint or states file that cannot be used; the message says why and what to do."""


@dataclass
class LoadedCheckpoint:
    """What :func:`~lightning_ig.checkpoint.load_checkpoint` returns.

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
        return None if self.prefix is None else self.prefix.removesuffix(HEAD_SEPARATOR)


def head_prefix(head: str) -> str:
    """The tensor-key prefix of a head: ``"trending" -> "trending__"``.

    A head's name is also part of file names (``ig_report.<head>.json``) and of printed lines, so it is printable
    text without a path separator.

    Raises:
        ValueError: If ``head`` is empty, contains the separator ``"__"``, ends in ``"_"`` (``a_``'s keys would
            start with ``a__``), contains a ``/``, a line break or another control character, or is ``.`` or ``..``.
    """
    if (
        not isinstance(head, str)
        or not head.strip()
        or HEAD_SEPARATOR in head
        or head.endswith("_")
        or "/" in head
        or os.sep in head
        or head in (".", "..")
        or not head.isprintable()
    ):
        raise ValueError(
            f"a head name must be printable text without {HEAD_SEPARATOR!r}, a trailing '_' or a path separator, got "
            f"{shown(head)}"
        )
    return head + HEAD_SEPARATOR


def few(keys: Sequence[str], limit: int = 4) -> str:
    """A short listing of ``keys`` for a message: ``[a, b, c, d, ...] (9)``."""
    if not keys:
        return "none"
    shown = ", ".join(key if key.isprintable() else repr(key) for key in keys[:limit])  # a file's keys are data
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)})"


TRUNCATED = ("not fully covered", "invalid header length", "header too small")
"""safetensors' words for a file whose size is not its header's: a save or a copy cut short."""


def cut_short(path: Path, what: str = "") -> CheckpointError:
    """The error for a file cut short (``what``: how the message names it, e.g. ``"states file "``)."""
    return CheckpointError(
        f"{what}{str(path)!r} looks truncated or corrupt ({path.stat().st_size} bytes): save it again"
    )


def open_error(path: Path, error: BaseException) -> CheckpointError:
    """The error for a file safetensors cannot read."""
    first_line = str(error).splitlines()[0] if str(error) else ""
    if "Cannot allocate memory" in first_line:  # a whole file too large to map (ENOMEM): not a broken one
        return CheckpointError(f"{str(path)!r} is too large to map into this machine's memory ({first_line})")
    if any(text in first_line for text in TRUNCATED):
        return cut_short(path)
    return CheckpointError(
        f"{str(path)!r} is not a readable safetensors file ({type(error).__name__}: {first_line}); "
        "give a checkpoint written by lightning_ig.save_checkpoint or safetensors"
    )


def existing_file(path: str | os.PathLike[str], what: str = "checkpoint") -> Path:
    """``path`` as a :class:`Path` if it is a readable regular file, else a :class:`CheckpointError` saying what it
    is (:func:`lightning_ig._files.check_input_file`: a folder, a FIFO, a device, a symbolic-link loop, missing)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} path must be a str or os.PathLike, got {type(path).__name__}")
    try:
        return check_input_file(path, what, "check the path")
    except InputPathError as error:
        raise CheckpointError(str(error)) from None


def check_format(metadata: Mapping[str, str], path: Any) -> None:
    """Refuse a file written in a format this version does not know (``lightning_ig.format`` other than ``"1"``)."""
    if (version := metadata.get(FORMAT_KEY, FORMAT_VERSION)) != FORMAT_VERSION:
        raise CheckpointError(
            f"{os.fspath(path)!r} is in lightning-ig checkpoint format {shown(version)}; this version reads format "
            f"{FORMAT_VERSION}: read it with the lightning-ig that wrote it, or a newer one"
        )


@contextmanager
def open_safetensors(path: Path) -> Iterator[Any]:
    """The safetensors file ``path`` open on the CPU; what fails to read it, in the block too, is :func:`open_error`."""
    from safetensors import safe_open  # noqa: PLC0415 - keeps `import lightning_ig` light

    try:
        with safe_open(os.fspath(path), framework="pt", device="cpu") as handle:
            yield handle
    except Exception as error:  # safetensors raises its own SafetensorError, or OSError
        raise open_error(path, error) from error


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of a safetensors file (``{}`` when it has none).

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors.
    """
    with open_safetensors(existing_file(path)) as handle:
        return dict(handle.metadata() or {})


def tensor_keys(path: Path) -> list[str]:
    """The tensor names in a safetensors file, in the file's order."""
    with open_safetensors(path) as handle:
        return list(handle.keys())


def json_metadata(metadata: Mapping[str, str], key: str, path: Any) -> Any:
    """The JSON value stored under ``key``; a :class:`CheckpointError` if it does not parse."""
    try:
        return parse_json(metadata[key])
    except ValueError as error:  # bad syntax, a nesting bomb, an integer of thousands of digits
        raise CheckpointError(
            f"metadata {key!r} of {os.fspath(path)!r} is not valid JSON ({error}); rewrite the checkpoint"
        ) from error
