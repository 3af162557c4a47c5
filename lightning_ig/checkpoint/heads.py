"""Merged files: which heads a file holds, and which one a head name or key prefix selects."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_ig.checkpoint.layout import (
    FORMAT_KEY,
    HEAD_SEPARATOR,
    HEADS_KEY,
    STATES_KEY,
    CheckpointError,
    check_format,
    existing_file,
    head_prefix,
    json_metadata,
    read_metadata,
    tensor_keys,
)
from lightning_ig.vocabulary import shown

__all__ = ["head_entry", "heads_in", "list_heads", "select_prefix"]


def heads_in(metadata: Mapping[str, str], keys: Sequence[str], path: Path) -> list[str]:
    """The head names of a file from its metadata and keys (``[]`` for a single model); a file in another format
    than this version's is refused (:func:`~lightning_ig.checkpoint.layout.check_format`)."""
    check_format(metadata, path)
    if HEADS_KEY in metadata:
        if not isinstance(listed := json_metadata(metadata, HEADS_KEY, path), dict):
            raise CheckpointError(f"metadata {HEADS_KEY!r} of {str(path)!r} must be a JSON object of heads")
        if (bad := next((head for head in listed if not _usable(head)), None)) is not None:
            raise CheckpointError(
                f"metadata {HEADS_KEY!r} of {str(path)!r} names the head {shown(bad)}; a head's name is printable "
                f"text without {HEAD_SEPARATOR!r} or a path separator: rewrite the file"
            )
        return list(listed)
    if FORMAT_KEY in metadata:
        return []  # written by save_checkpoint: a single model
    # Files merged by other tools: every key is "<head>__<rest>" with a non-empty head.
    split = [key.partition(HEAD_SEPARATOR) for key in keys if key != STATES_KEY]
    if not all(separator and rest and _usable(head) for head, separator, rest in split):
        return []
    return list(dict.fromkeys(head for head, _, _ in split))  # each head once, in the file's order


def _usable(head: str) -> bool:
    try:
        head_prefix(head)
    except ValueError:
        return False
    return True


def list_heads(path: str | os.PathLike[str]) -> list[str]:
    """The head names in a merged checkpoint (``[]`` for a single-model file).

    Args:
        path: A safetensors checkpoint.

    Returns:
        Head names, without the ``"__"`` that ends their prefix, in the order the file lists them.

    Raises:
        CheckpointError: If the file is missing, unreadable or not safetensors.

    Example::

        >>> list_heads("heads.safetensors")  # doctest: +SKIP
        ['ranging', 'trending']
    """
    file = existing_file(path)
    return heads_in(read_metadata(file), tensor_keys(file), file)


def select_prefix(requested: str | None, heads: Sequence[str], keys: Sequence[str], path: Path) -> str | None:
    """The key prefix to load: a whole head of a merged file, or a raw prefix of a file without heads.

    ``requested`` is a prefix (``"trending__"``) or a head's name (``"trending"``). In a file with heads it must name
    one of them, so a part of a name (``"tre"``) is refused with the list of heads rather than loading a fragment.

    Raises:
        CheckpointError: No head chosen in a merged file, an unknown head, or a prefix no key starts with.
    """
    listing = f"the heads in it are: {', '.join(heads)}"
    if requested is None:
        if heads:
            several = len(heads) > 1
            raise CheckpointError(
                f"{str(path)!r} holds {'several heads' if several else 'one head'} ({', '.join(heads)}); choose "
                f"{'one' if several else 'it'} with --head NAME (prefix=NAME__) or run each with --all-heads"
            )
        return None
    if heads:
        name = requested.removesuffix(HEAD_SEPARATOR)
        if name not in heads:
            raise CheckpointError(
                f"no head {name!r} (prefix {requested!r}) in {str(path)!r}; {listing}: give one of them"
            )
        return head_prefix(name)
    if not any(key.startswith(requested) for key in keys):
        raise CheckpointError(
            f"no tensors under prefix {requested!r} in {str(path)!r}; it is a single-model file: drop the head/prefix"
        )
    return requested


def head_entry(metadata: Mapping[str, str], prefix: str | None, path: Path) -> dict[str, Any]:
    """A head's own entry in ``lightning_ig.heads`` (architecture, config, feature names), or ``{}``."""
    if prefix is None or HEADS_KEY not in metadata:
        return {}
    name = prefix.removesuffix(HEAD_SEPARATOR)
    if (entry := json_metadata(metadata, HEADS_KEY, path).get(name)) is not None and not isinstance(entry, dict):
        raise CheckpointError(
            f"the entry of head {name!r} in {HEADS_KEY!r} of {str(path)!r} must be a JSON object, got {entry!r}"
        )
    return dict(entry or {})
