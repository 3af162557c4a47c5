"""Held-out states in files of their own: ``.json``, ``.npy`` or ``.safetensors``, and where to find them."""

from __future__ import annotations

import math
import os
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_ig._files import open_input
from lightning_ig._json import MEMORY_PER_BYTE, parse_json
from lightning_ig.attribution.checks import check_float_dtype
from lightning_ig.checkpoint.layout import STATES_KEY, TRUNCATED, CheckpointError, cut_short, existing_file, few
from lightning_ig.vocabulary import check_memory, check_text

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

    States are numbers (floats or integers, such as ``uint8`` frames) in every form: booleans (``true``, a ``bool``
    array or tensor) are refused, as text and Python objects are. The path must be a regular file (a FIFO or a device is
    refused before it is read), and states that would not fit in the memory available are refused before they are read.

    Args:
        path: The file.
        prefix: A head prefix to look for first in a ``.safetensors`` file.
        dtype: The floating-point dtype of the result. Default ``torch.float32``; pass the
            model's (e.g. ``torch.float64``) to keep the file's precision.

    Returns:
        States ``(num_states, *feature_shape)`` of ``dtype`` on the CPU.

    Raises:
        CheckpointError: If the file is missing, not a regular file, unreadable, of an unknown kind, too large
            for the memory available, holds no usable states, or values past the range of ``dtype``.

    Example::

        >>> states = load_states("held_out.npy")  # doctest: +SKIP
    """
    prefix = None if prefix is None else check_text(prefix, "prefix")
    dtype, file = check_float_dtype(dtype, "dtype"), existing_file(path, "states file")
    if (reader := _READERS.get(file.suffix.lower())) is None:
        raise CheckpointError(
            f"states file {str(file)!r} must end in .json, .npy or .safetensors, not {file.suffix or 'nothing'!r}"
        )
    try:
        stored = reader(file, prefix)
        stored = stored.float() if stored.is_floating_point() and stored.element_size() == 1 else stored  # float8
        states = stored.to(dtype)
    except CheckpointError:
        raise
    except Exception as error:  # JSON syntax, ragged lists, corrupt files
        first_line = str(error).splitlines()[0] if str(error) else ""
        if any(text in first_line for text in TRUNCATED):
            raise cut_short(file, "states file ") from error
        raise CheckpointError(
            f"cannot read states from {str(file)!r} ({type(error).__name__}: {first_line}); check the file"
        ) from error
    overflowed = (torch.isinf(states) & torch.isfinite(stored)).nonzero()  # finite in the file, not in ``dtype``
    if len(overflowed):
        where = tuple(overflowed[0].tolist())
        raise CheckpointError(
            f"states file {str(file)!r} holds {stored[where].item():.4g} at index {where}, past the range of {dtype} "
            f"(at most {torch.finfo(dtype).max:.3g} in size): scale the states, or use a model of a wider dtype"
        )
    if states.ndim == 1 and states.numel():
        raise CheckpointError(
            f"states in {str(file)!r} have shape {tuple(states.shape)}: expected (num_states, state_dim); wrap one "
            "state as [[...]]"
        )
    if states.ndim < 2 or states.shape[0] == 0:
        raise CheckpointError(f"states in {str(file)!r} have shape {tuple(states.shape)}: expected at least one state")
    return states.contiguous()


def _fits(needed: int, file: Path) -> None:
    try:
        check_memory(needed, f"the states in {str(file)!r}", "give fewer states")
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def _refuse_kind(file: Path, kind: str) -> None:
    raise CheckpointError(f"states file {str(file)!r} holds {kind} values; states are numbers: save a float array")


def _read_json(file: Path, prefix: str | None) -> Tensor:
    with open_input(file, "states file") as handle:
        _fits(os.fstat(handle.fileno()).st_size * MEMORY_PER_BYTE, file)
        text = handle.read()
    document = parse_json(text)
    rows = document.get("states") if isinstance(document, dict) else document
    if rows is None:
        raise CheckpointError(f'states file {str(file)!r} has no "states" key; write {{"states": [[...], ...]}}')
    _check_numbers(rows, file)
    stored = torch.tensor(rows, dtype=torch.float64)  # the file's precision; load_states converts
    infinite = stored.isinf().nonzero()
    if len(infinite) and (b"Infinity" if isinstance(text, bytes) else "Infinity") not in text:  # 1e999: json's inf
        raise CheckpointError(
            f"states file {str(file)!r} holds a number past float64's range at index "
            f"{tuple(infinite[0].tolist())}; write finite values"
        )
    return stored


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


# What a file that is not .npy most likely is, by its first bytes.
_NOT_NPY = {b"\x1f\x8b": "gzip-compressed: decompress it first", b"PK": "a zip archive (.npz?): save one array"}


def _read_npy(file: Path, prefix: str | None) -> Tensor:
    import numpy as np  # noqa: PLC0415
    from numpy.lib import format as npy  # noqa: PLC0415

    with open_input(file, "states file") as handle:
        if (start := handle.read(6)) != npy.MAGIC_PREFIX:
            hint = next((text for magic, text in _NOT_NPY.items() if start.startswith(magic)), "not a .npy file")
            raise CheckpointError(f"states file {str(file)!r} is {hint}; write the states with numpy.save")
        handle.seek(0)
        try:  # the header alone: the array is read only once it is known to be numbers that fit
            major, _ = npy.read_magic(handle)
            read_header = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
            shape, _, dtype = read_header(handle)
        except (ValueError, tokenize.TokenError) as error:  # numpy's words (Python 3.12+: a TokenError), not its advice
            raise CheckpointError(f"states file {str(file)!r} is a damaged .npy file ({error})") from None
        if dtype.hasobject or dtype.kind not in "iuf":
            _refuse_kind(file, "Python-object" if dtype.hasobject else str(dtype))
        values = math.prod(shape)
        if (held := os.fstat(handle.fileno()).st_size - handle.tell()) < values * dtype.itemsize:
            raise CheckpointError(
                f"states file {str(file)!r} is cut short: its header announces {values * dtype.itemsize:,} bytes of "
                f"states, it holds {held:,}; write it again"
            )
        _fits(values * (dtype.itemsize + 16), file)
        handle.seek(0)
        array = npy.read_array(handle, allow_pickle=False)
    return torch.from_numpy(np.asarray(array, dtype=np.float64, order="C"))  # native, 0-d kept; load_states converts


def _read_safetensors(file: Path, prefix: str | None) -> Tensor:
    from safetensors import safe_open  # noqa: PLC0415 - keeps `import lightning_ig` light

    with safe_open(os.fspath(file), framework="pt", device="cpu") as handle:
        keys = list(handle.keys())
        candidates = ([prefix + STATES_KEY] if prefix else []) + [STATES_KEY, "states"]
        if (key := next((k for k in candidates if k in keys), keys[0] if len(keys) == 1 else None)) is None:
            raise CheckpointError(
                f"states file {str(file)!r} has no {STATES_KEY!r} or 'states' tensor (it has {few(keys)}); "
                "store the states under one of those keys"
            )
        header = handle.get_slice(key)
        if (kind := header.get_dtype()) == "BOOL" or kind.startswith("C"):  # a mask or complex numbers, not states
            _refuse_kind(file, kind.lower())
        _fits(math.prod(header.get_shape()) * 24, file)  # as stored (8 bytes a value at most), float64, the dtype
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
    names = [base + suffix for base in (f"{file.stem}.states", "states") for suffix in STATE_SUFFIXES]
    return next((found for name in names if (found := file.with_name(name)).is_file() and found != file), None)
