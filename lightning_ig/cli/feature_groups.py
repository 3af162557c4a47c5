"""``--feature-groups``: ``channels``, ``features`` or a JSON file, read into
:class:`~lightning_ig.attribution.groups.FeatureGroups`.

A file holds ``{"name": [flat feature indices], ...}`` (features in no group form one more, ``other``),
``{"name": true/false mask shaped like one state, ...}`` or an integer mask shaped like one state (Captum's
``feature_mask``: equal ids form one group, ``group <id>``). Each mistake is one
:class:`~lightning_ig.cli.exits.UsageError` line naming the file, what was wrong and what to write instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.cli.exits import UsageError, read_json_file

__all__ = ["FORMS", "is_named_form", "resolve_feature_groups"]

FORMS = ("channels", "features")
"""The groupings named on the command line rather than read from a file."""

_FIX = (
    'write {"name": [flat indices], ...}, {"name": nested true/false mask, ...} or an integer mask shaped like one '
    "state (nested lists)"
)
# FeatureGroups' words for Python's argument, as the flag's (regular expressions): feature_groups['b'] is group 'b'
_SAID = {
    "feature_groups='channels' needs": "it needs",
    "'features', a mask or a dict": "'features' or a JSON file of groups",
    "feature_groups is an empty dict": "the file names no group",
    "feature_groups mask": "group mask",
}
_PYTHON = re.compile("|".join(_SAID) + r"|feature_groups\[('.*?'|\".*?\")\]")


def is_named_form(text: str | None) -> bool:
    """Whether ``--feature-groups`` names a grouping (``channels``, ``features``) rather than a file."""
    return text in FORMS


def resolve_feature_groups(
    text: str | None, feature_shape: Sequence[int], feature_names: Sequence[str]
) -> FeatureGroups | None:
    """The groups ``--feature-groups`` asks for, checked against the states' feature shape.

    Args:
        text: the flag's value (``None``: no groups).
        feature_shape: the shape of one state.
        feature_names: the feature names (the names of ``features`` groups).

    Returns:
        The groups, or ``None``.

    Raises:
        UsageError: a missing or unreadable file, a JSON value of none of the forms, or
            groups that do not fit the states (wrong shape, negative id, empty group, ...).
    """
    if text is None:
        return None
    shape = tuple(int(size) for size in feature_shape)
    spec = text if is_named_form(text) else _read(text)
    names = {"features": list(feature_names), "channels": _channel_names(feature_names, shape)}.get(text)
    try:
        return FeatureGroups.resolve(spec, shape, names)
    except (TypeError, ValueError) as error:
        where = f"--feature-groups {text}" if is_named_form(text) else f"--feature-groups {text!r}"
        message = _PYTHON.sub(lambda match: _SAID.get(match[0], f"group {match[1]}"), str(error))
        said = str(shape) in message  # most of FeatureGroups' errors name the shape already
        raise UsageError(f"{where}: {message}{'' if said else f' (the states have feature shape {shape})'}") from None


def _channel_names(feature_names: Sequence[str], shape: tuple[int, ...]) -> list[str] | None:
    """``channels``' names where every stored name of a channel is ``<its name>[...]`` (``paddle[0,3]``, as the
    MinAtar example writes them) and the channels' names differ; else ``None`` (``channel 0``, ...)."""
    per = math.prod(shape[1:])
    heads = [{name.partition("[")[0] for name in feature_names[c * per : (c + 1) * per]} for c in range(shape[0])]
    named = [head.pop() for head in heads if len(head) == 1 and "" not in head and len(shape) > 1]
    return named if len(named) == shape[0] and len(set(named)) == len(named) else None


def _read(path: str) -> Any:
    value = read_json_file(path, "--feature-groups", _FIX)  # a regular file: diag checked every input first
    if isinstance(value, dict):
        return {name: _members(members, path, name) for name, members in value.items()}
    if isinstance(value, list):
        return _array(value, f"--feature-groups {path!r}", integers_only=True)
    raise UsageError(f"--feature-groups {path!r} holds a JSON {type(value).__name__}; {_FIX}")


def _members(members: Any, path: str, name: str) -> np.ndarray:
    what = f"--feature-groups {path!r}: group {name!r}"
    if not isinstance(members, list):
        raise UsageError(f"{what} is a JSON {type(members).__name__}, not a list; {_FIX}")
    array = _array(members, what, integers_only=False)
    if array.dtype != np.bool_ and array.ndim != 1:
        raise UsageError(f"{what} is a nested list of numbers; list flat feature indices, or give a true/false mask")
    return array


def _array(value: list[Any], what: str, *, integers_only: bool) -> np.ndarray:
    """A nested JSON list as an int64 array (whole numbers) or a bool array (``true``/``false``)."""
    leaves = list(_leaves(value))
    if leaves and all(isinstance(leaf, bool) for leaf in leaves) and not integers_only:
        dtype: Any = np.bool_
    elif all(isinstance(leaf, int) and not isinstance(leaf, bool) for leaf in leaves):
        dtype = np.int64
    else:
        bad = next(leaf for leaf in leaves if isinstance(leaf, bool) == integers_only or not isinstance(leaf, int))
        kinds = "whole numbers (group ids)" if integers_only else "whole numbers (indices) or only true/false"
        raise UsageError(f"{what} must hold only {kinds}, found {bad!r}; {_FIX}")
    try:
        return np.array(value, dtype=dtype)
    except OverflowError:  # a whole number past int64: no feature has that index, no mask that id
        big = next(leaf for leaf in leaves if not -(2**63) <= leaf < 2**63)
        raise UsageError(f"{what} holds {big}, too large for a feature index or group id; {_FIX}") from None
    except ValueError:
        raise UsageError(
            f"{what} is a ragged nested list (rows of different lengths); shape it like one state"
        ) from None


def _leaves(value: Any) -> Iterator[Any]:
    pending = [value]
    while pending:  # iterative, in order: nesting costs no recursion
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(reversed(item))
        else:
            yield item
