"""The words every part of lightning-ig shares, and the argument checks written once.

The engine, the callback, the report and the command line all speak of the
same things: a backend, a quadrature method, a number of steps, held-out
states, feature names, what was attributed (the *target label*). Their names
and their checks live here, so a user sees one spelling and one message for
one mistake wherever it is made. Each layer calls these at its own boundary.

Errors say what was wrong, the value seen, and what to do:
``TypeError`` for a value of the wrong kind, ``ValueError`` for a bad value.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import numpy as np
import torch
from torch import Tensor

from lightning_ig.quadrature import METHODS

__all__ = [
    "BACKENDS",
    "GRADIENTS",
    "METHODS",
    "check_choice",
    "check_positive_int",
    "check_optional_positive_int",
    "check_positive_float",
    "check_n_steps",
    "check_finite",
    "check_states",
    "default_feature_names",
    "check_feature_names",
    "target_label",
    "callable_name",
    "short_repr",
]

BACKENDS = ("auto", "cuda", "torch")
"""``"auto"``: the CUDA kernels when the tensors are on a CUDA device and CuPy imports, else torch."""

GRADIENTS = ("autograd", "finite_difference")
"""How the engine takes gradients along the path."""

NSteps = Union[int, Literal["auto"]]


def check_choice(value: Any, choices: Sequence[str], name: str) -> str:
    """``value`` if it is one of ``choices``; else a ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_positive_int(value: Any, name: str, *, example: int | None = None) -> int:
    """``value`` as an int >= 1 (bools are refused: ``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__} ({value!r})")
    if value < 1:
        hint = f"; e.g. {name}={example}" if example is not None else ""
        raise ValueError(f"{name} must be an int >= 1, got {value}{hint}")
    return int(value)


def check_optional_positive_int(value: Any, name: str) -> int | None:
    """``None`` or an int >= 1."""
    return None if value is None else check_positive_int(value, name)


def check_positive_float(value: Any, name: str) -> float:
    """``value`` as a finite float > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number > 0, got {type(value).__name__} ({value!r})")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_n_steps(value: Any, name: str = "n_steps") -> NSteps:
    """An int >= 1 or ``"auto"`` (refine until the completeness error is within tolerance)."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"{name} must be an int >= 1 or 'auto', got {value!r}")
        return "auto"
    return check_positive_int(value, name, example=50)


def check_finite(name: str, tensor: Tensor, flag: Tensor | None = None) -> None:
    """Raise a ``ValueError`` naming ``name``, the count and the first index of NaN/Inf values.

    One host sync; the slow path (count and first index) runs only when something is
    wrong. ``flag`` is ``torch.isfinite(tensor).all()`` queued earlier, so that the sync
    finds it long done.
    """
    if bool(torch.isfinite(tensor).all() if flag is None else flag):
        return
    bad = ~torch.isfinite(tensor)
    count = int(bad.sum())
    first = tuple(int(i) for i in bad.nonzero()[0])
    raise ValueError(
        f"{name} holds {count} NaN/Inf value(s), the first at index {first} (value {float(tensor[first])}); "
        f"IG needs finite {name}: clean or drop those states"
    )


def check_states(states: Any, name: str = "states") -> Tensor:
    """``states`` if it is a finite floating-point tensor ``(num_states >= 1, *feature_shape)`` with features.

    Raises:
        TypeError: not a tensor, or not floating point.
        ValueError: no state dimension, no states, no features (e.g. shape ``(5, 0)``), or NaN/Inf.
    """
    if not isinstance(states, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (num_states, *feature_shape), got {type(states).__name__}")
    if states.ndim < 2 or states.shape[0] == 0 or math.prod(states.shape[1:]) == 0:
        raise ValueError(
            f"{name} must have shape (num_states >= 1, *feature_shape) with at least one feature, got "
            f"{tuple(states.shape)}; add the state dimension (states.unsqueeze(0)) for a single state"
        )
    if not states.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {states.dtype}; convert with .float()")
    check_finite(name, states)
    return states


def default_feature_names(feature_shape: Sequence[int]) -> list[str]:
    """Names of unnamed features: ``x0, x1, ...``, or ``x[c,i,j]`` for multi-dimensional states.

    The one default everywhere (callback, report, command line), in row-major
    (flattened) order.
    """
    shape = tuple(int(size) for size in feature_shape)
    if len(shape) <= 1:
        return [f"x{i}" for i in range(shape[0] if shape else 1)]
    return ["x[" + ",".join(str(i) for i in index) + "]" for index in np.ndindex(*shape)]


def check_feature_names(names: Any, num_features: int, name: str = "feature_names") -> list[str]:
    """One printable, distinct, non-blank string per feature.

    Raises:
        TypeError: not a sequence of strings (a single string included).
        ValueError: the wrong count, a blank name, a name with a line break or other
            control character (it would break tables and tags), or a repeated name.
    """
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"{name} must be a list of strings, one per feature, got {type(names).__name__} ({names!r:.60})")
    listed = list(names)
    bad_type = next((item for item in listed if not isinstance(item, str)), None)
    if bad_type is not None:
        raise TypeError(f"{name} must all be strings, got {bad_type!r} ({type(bad_type).__name__})")
    if len(listed) != num_features:
        raise ValueError(f"{name} has {len(listed)} names but there are {num_features} features; pass one name per feature")
    for index, item in enumerate(listed):
        if not item.strip():
            raise ValueError(f"{name}[{index}] is blank ({item!r}); give every feature a visible name")
        if any(not character.isprintable() for character in item):
            raise ValueError(f"{name}[{index}] = {item!r} holds a line break or control character; use plain text")
    if len(set(listed)) != len(listed):
        repeated = sorted({item for item in listed if listed.count(item) > 1})
        raise ValueError(f"{name} repeats {repeated}; give each feature its own name")
    return listed


def callable_name(function: Any) -> str:
    """A readable name for a function or callable object."""
    return getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or type(function).__name__


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters (``...`` where cut).

    Containers are abbreviated as they are written (:mod:`reprlib`), so a list of
    millions of items costs no more than a short one. Never raises: a value whose
    repr fails (an int past Python's digit limit) is named by its type.
    """
    try:
        text = _SHORT.repr(value)
    except (ValueError, RecursionError):
        text = f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SHORT = reprlib.Repr()
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 8
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlong = 40


def target_label(target: Any) -> str:
    """What was attributed, in the one form the result, the report and the command line all use.

    ``None`` -> ``"output"`` (the forward returns one value per row); ``"mean"``;
    ``"each"``; an int ``k`` -> ``"action:k"``; a tensor of one index per state ->
    ``"per_row"``; a callable -> ``"callable:<name>"``.
    """
    if target is None:
        return "output"
    if isinstance(target, str):
        return target
    if isinstance(target, Tensor):
        return f"action:{int(target)}" if target.dim() == 0 else "per_row"
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        return f"action:{int(target)}"
    if isinstance(target, Callable):  # type: ignore[arg-type]
        return f"callable:{callable_name(target)}"
    raise TypeError(f"target must be None, 'mean', 'each', an int, a LongTensor or a callable, got {type(target).__name__}")
