"""Held-out states in files of their own: ``.json``, ``.npy`` or ``.safetensors``, and where to find them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_ig._json import parse_json
from lightning_ig.attribution.checks import check_float_dtype
from lightning_ig.checkpoint.layout import STATES_KEY, CheckpointError, existing_file, few
from lightning_ig.vocabulary import check_text

__all__ = ["STATE_SUFFIXES", "load_states", "states_beside"]

#: file suffixes of the state files :func:`states_beside` looks for, in this order
STATE_SUFFIXES = (".safetensors", ".npy", ".json")


def load_states(
    path: str | os.PathLike[str], *, prefix: str | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Read held-out states from ``.json``, ``.npy`` or ``.safetensors``.

    * ``.json``: ``{"states": [[...], ...]}`` (a bare list of lists is accepted too);
    * ``.npy``: a 2-d (or higher) numeric array;
    * ``.safetensors``: the tensor ``<prefix>__states__``, else ``__states__``, else
      ``states``, else the file's only tensor.

    Args:
        path: The file.
        prefix: A head prefix to look for first in a ``.safetensors`` file.
        dtype: The floating-point dtype of the result. Default ``torch.float32``; pass the
            model's (e.g. ``torch.float64``) to keep the file's precision.

    Returns:
        States ``(num_states, *feature_shape)`` of ``dtype`` on the CPU.

    Raises:
        CheckpointError: If the file is missing, unreadable, of an unknown kind, or holds no usable states.

    Example::

        >>> states = load_states("held_out.npy")  # doctest: +SKIP
    """
    prefix = None if prefix is None else check_text(prefix, "prefix")
    dtype = check_float_dtype(dtype, "dtype")
    file = existing_file(path, "states file")
    reader = _READERS.get(file.suffix.lower())
    if reader is None:
        raise CheckpointError(
            f"states file {str(file)!r} must end in .json, .npy or .safetensors, not {file.suffix or 'nothing'!r}"
        )
    try:
        states = reader(file, prefix).to(dtype)
    except CheckpointError:
        raise
    except Exception as error:  # JSON syntax, ragged lists, corrupt files
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(
            f"cannot read states from {str(file)!r} ({type(error).__name__}: {first_line}); check the file"
        ) from error
    if states.ndim == 1:
        raise CheckpointError(
            f"states in {str(file)!r} have shape {tuple(states.shape)}: expected (num_states, state_dim); wrap one "
            "state as [[...]]"
        )
    if states.ndim < 2 or states.shape[0] == 0:
        raise CheckpointError(f"states in {str(file)!r} have shape {tuple(states.shape)}: expected at least one state")
    return states.contiguous()


def _read_json(file: Path, prefix: str | None) -> Tensor:
    document = parse_json(file.read_text(encoding="utf-8"))
    rows = document.get("states") if isinstance(document, dict) else document
    if rows is None:
        raise CheckpointError(f'states file {str(file)!r} has no "states" key; write {{"states": [[...], ...]}}')
    _check_numbers(rows, file)
    return torch.tensor(rows, dtype=torch.float64)  # the file's precision; load_states converts


def _check_numbers(rows: Any, file: Path) -> None:
    """Every leaf of the nested lists a number: ``true``/``false`` would become 1.0/0.0, a string fail later."""
    pending = [rows]
    while pending:  # iterative: the nesting is bounded by parse_json, the work by the file's size
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, bool) or not isinstance(item, (int, float)):
            kind = "a JSON boolean" if isinstance(item, bool) else f"a JSON {type(item).__name__}"
            raise CheckpointError(
                f"states file {str(file)!r} holds {item!r:.40} ({kind}) among the states; every value must be a number"
            )


def _read_npy(file: Path, prefix: str | None) -> Tensor:
    import numpy as np  # noqa: PLC0415

    array = np.load(file, allow_pickle=False)
    if not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
        raise CheckpointError(f"states file {str(file)!r} holds {array.dtype} values; save a float array")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))  # native byte order; load_states converts


def _read_safetensors(file: Path, prefix: str | None) -> Tensor:
    from safetensors import safe_open  # noqa: PLC0415 - keeps `import lightning_ig` light

    with safe_open(os.fspath(file), framework="pt", device="cpu") as handle:
        keys = list(handle.keys())
        candidates = ([prefix + STATES_KEY] if prefix else []) + [STATES_KEY, "states"]
        key = next((k for k in candidates if k in keys), keys[0] if len(keys) == 1 else None)
        if key is None:
            raise CheckpointError(
                f"states file {str(file)!r} has no {STATES_KEY!r} or 'states' tensor (it has {few(keys)}); "
                "store the states under one of those keys"
            )
        return handle.get_tensor(key)


_READERS: dict[str, Callable[[Path, str | None], Tensor]] = {
    ".json": _read_json,
    ".npy": _read_npy,
    ".safetensors": _read_safetensors,
}


def states_beside(checkpoint: str | os.PathLike[str]) -> Path | None:
    """A states file next to ``checkpoint``: ``<stem>.states.{safetensors,npy,json}``, then ``states.{...}``.

    Args:
        checkpoint: The checkpoint's path.

    Returns:
        The first such file that exists, else ``None``.

    Example::

        >>> states_beside("runs/q.safetensors")  # doctest: +SKIP
        PosixPath('runs/q.states.npy')
    """
    file = Path(checkpoint)
    stem = file.name[: -len(file.suffix)] if file.suffix else file.name
    for base in (f"{stem}.states", "states"):
        for suffix in STATE_SUFFIXES:
            candidate = file.with_name(base + suffix)
            if candidate.is_file() and candidate != file:
                return candidate
    return None
