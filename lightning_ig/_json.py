"""JSON from users' files and flags, parsed with bounds: any malformed input is a ``ValueError``, never a crash.

``json.loads`` alone takes an object that names a key twice (the last value wins, silently: ``{"states": [...],
"states": [...]}``) and lets three kinds of input escape as something other than "not valid JSON": a nesting bomb
(100000 ``[``) raises ``RecursionError``; an integer of thousands of digits raises ``ValueError`` on Python 3.11+ and
parses on 3.10, to fail later as an ``OverflowError`` wherever it becomes an index or a float; and a deeply nested value
that does parse sends later code that walks it into the recursion limit. :func:`parse_json` refuses all four with a
``ValueError`` that says what was wrong, so every reader (the command line's files and ``--model-kwargs``, checkpoint
metadata, states files) reports one kind of error for one kind of mistake.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "MEMORY_PER_BYTE", "parse_json"]

MAX_DEPTH = 64
"""The deepest nesting of lists and objects accepted (a report is 4 deep, a mask shaped like a state ndim + 1)."""

MAX_INT_DIGITS = 20
"""The most digits of an integer (int64 has 19): any index, count or seed fits."""

MEMORY_PER_BYTE = 12
"""Bytes of memory a byte of JSON can take once parsed and made a tensor, for a bound before a file is read: a number
of 2-5 characters (``1, `` or ``0.5, ``) becomes a Python object in a list (8 bytes, and 24 for a float), then a
float64 tensor (8) and the dtype asked for (4-8)."""


def parse_json(text: str | bytes) -> Any:
    """The JSON value of ``text``.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError`` is one), an object naming a key twice, nested deeper than
            :data:`MAX_DEPTH`, or an integer of more than :data:`MAX_INT_DIGITS` digits.
    """
    mark = b"\xef\xbb\xbf" if isinstance(text, bytes) else "\ufeff"  # a byte-order mark (Windows editors): not JSON
    text = text[len(mark) :] if text[: len(mark)] == mark else text
    try:
        value = json.loads(text, parse_int=_integer, object_pairs_hook=_object)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    _check_depth(value)
    return value


_TOO_DEEP = f"nested deeper than the {MAX_DEPTH} levels of lists and objects any lightning-ig file has"


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ValueError(f"an object names the key {key[:80]!r} twice; give each key once")
        value[key] = item
    return value


def _integer(digits: str) -> int:
    if (count := len(digits.lstrip("-"))) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {count} digits ({digits[:12]}...); no count or index is that large")
    return int(digits)


def _check_depth(value: Any) -> None:
    pending = [(value, 1)]
    while pending:  # iterative: the check must not hit the recursion limit it guards against
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise ValueError(_TOO_DEEP)
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
