"""The words every part of lightning-ig shares, and the argument checks written once; no torch.

The engine, the callback, the report and the command line all speak of the same things: a backend, a quadrature method,
a number of steps, held-out states, feature names. Their names and their checks live here, so a user sees one spelling
and one message for one mistake wherever it is made. Each layer calls these at its own boundary; so does the command
line's parser, which is why this module imports neither torch nor anything that does (``lightning-ig --help`` answers
without loading it). The checks on tensors and torch objects are :mod:`lightning_ig.attribution.checks`; the label of
what was attributed is :attr:`lightning_ig.attribution.targets.Target.label`.

The completeness error is a *fraction* wherever a user reads it: the JSON report, the TensorBoard scalars,
``completeness_tol`` / ``--completeness-tol`` (0.01), the callback's text, ``diag``'s and ``show``'s lines and the
examples' output all write ``relative error 3.76e-03`` (:func:`relative_error_text`), never a percentage, so that two
numbers that look alike are alike.

Errors say what was wrong, the value seen, and what to do:
``TypeError`` for a value of the wrong kind, ``ValueError`` for a bad value.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import re
import reprlib
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "AUTO_METHOD",
    "BACKENDS",
    "BUDGET",
    "GRADIENTS",
    "KINK_METHOD",
    "METHODS",
    "REFINED_METHODS",
    "TARGET_NAMES",
    "BackendName",
    "NSteps",
    "action_index",
    "available_memory",
    "callable_name",
    "check_bool",
    "check_choice",
    "check_feature_names",
    "check_int",
    "check_int_sequence",
    "check_mapping",
    "check_memory",
    "check_method",
    "check_n_steps",
    "check_names",
    "check_optional_positive_int",
    "check_path",
    "check_positive_float",
    "check_positive_int",
    "check_real",
    "check_text",
    "default_feature_names",
    "non_finite_words",
    "relative_error_text",
    "shown",
    "shown_with_type",
    "size_text",
]

BACKENDS = ("auto", "cuda", "torch")
"""``"auto"``: the CUDA kernels when the tensors are on a CUDA device and CuPy imports, else torch."""

BackendName = Literal["auto", "cuda", "torch"]
"""The type of a ``backend=`` option: one of :data:`BACKENDS`."""

GRADIENTS = ("autograd", "finite_difference")
"""How the engine takes gradients along the path."""

METHODS = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")
"""The quadrature rules, by Captum's names (:mod:`lightning_ig.attribution.quadrature` builds them)."""

KINK_METHOD = "kink_midpoint"
"""The midpoint rule with certified kink corrections, for ReLU networks where points are dear
(:mod:`lightning_ig.attribution.kinks`); beside :data:`METHODS`, which keep Captum's meaning."""

AUTO_METHOD = "auto"
"""``method="auto"``, the default: :data:`KINK_METHOD` where ``n_steps`` comes to 128 points or fewer (with
autograd gradients), else ``"riemann_middle"``; the result's ``method`` says which ran."""

REFINED_METHODS = (AUTO_METHOD, KINK_METHOD, "riemann_middle")  # n_steps="auto" triples midpoint nodes: these nest

TARGET_NAMES = ("mean", "each", "contrast")
"""The targets given by name, besides an output index ``N`` (also ``"action:N"``): what
:meth:`lightning_ig.attribution.targets.Target.parse` and ``--target`` take."""


def action_index(text: str) -> int | None:
    """``N`` of a target ``"action:N"``, or of a bare ``"N"``: digits 0-9, at most 18 (not int()'s " 3", "+3", "1_0"
    or other scripts' digits); ``None`` where ``text`` is no such index."""
    body = text.removeprefix("action:")
    return int(body) if body.isascii() and body.isdigit() and len(body) < 19 else None


BUDGET: Final = "budget"
"""``n_steps="budget"``, the default everywhere (engine, callback, command line): the number of points chosen from
the size of the work (:mod:`lightning_ig.attribution.budget`)."""

NSteps = int | Literal["auto", "budget"]
"""The type of an ``n_steps=`` option: a number of quadrature points, ``"auto"`` (refined per state) or ``"budget"``
(chosen from the work size: :mod:`lightning_ig.attribution.budget`)."""

_INTEGERS, _REALS = numbers.Integral, numbers.Real  # numpy's integers and floats too (it registers them)
_NUMBER_TEXT = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")  # "0.01", "1e-3": a number as text


def shown(value: Any, width: int = 120) -> str:
    """``repr(value)`` for a message that quotes what was given, cut to about ``width`` characters (``...``).

    Containers are abbreviated as they are written (:mod:`reprlib`), so a list of millions of items costs no more than a
    short one. Never raises: a value whose repr fails (an int past Python's digit limit) is named by its type.
    """
    try:
        text = _SHORT.repr(value)
    except (ValueError, RecursionError):
        text = f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= width else text[: width - 3] + "..."


_SHORT = reprlib.Repr()
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 8
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlong = 40


def shown_with_type(value: Any) -> str:
    """``"<type> (<shown value>)"``: what a message about a value of the wrong kind quotes."""
    return f"{type(value).__name__} ({shown(value)})"


def check_choice(value: Any, choices: Sequence[str], name: str) -> str:
    """``value`` if it is one of ``choices``.

    Raises:
        TypeError: not a string.
        ValueError: a string that is none of ``choices`` (the message lists them).
    """
    listed = ", ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {listed}; got {shown_with_type(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {listed}; got {shown(value)}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is ``True`` or ``False``: a string (``"no"``) or a number is refused, never read as truthy."""
    import numpy as np  # noqa: PLC0415 - not at the top: `lightning-ig --help` answers without loading numpy

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {shown_with_type(value)}")


def check_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (bools are refused: ``True`` is not a number of anything).

    Raises:
        TypeError: not an int (a float, a string, a bool, ...).
        ValueError: outside the range.
    """
    if isinstance(value, bool) or not isinstance(value, _INTEGERS):
        raise TypeError(f"{name} must be an int, got {shown_with_type(value)}")
    number = int(value)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        low = "" if minimum is None else f" >= {minimum}"
        high = "" if maximum is None else f"{' and' if low else ''} <= {maximum}"
        raise ValueError(f"{name} must be an int{low}{high}, got {shown(number)}")
    return number


def check_positive_int(value: Any, name: str, *, example: int | None = None) -> int:
    """``value`` as an int >= 1 (bools are refused: ``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, _INTEGERS):
        raise TypeError(f"{name} must be an int >= 1, got {shown_with_type(value)}")
    if value < 1:
        hint = f"; e.g. {name}={example}" if example is not None else ""
        raise ValueError(f"{name} must be an int >= 1, got {shown(int(value))}{hint}")
    return int(value)


def check_optional_positive_int(value: Any, name: str) -> int | None:
    """``None`` or an int >= 1."""
    return None if value is None else check_positive_int(value, name)


def check_real(value: Any, name: str, *, above: float | None = None, below: float | None = None) -> float:
    """``value`` as a finite float, ``> above`` and ``< below`` where given.

    Raises:
        TypeError: not a real number (a string, a bool, a tensor, ...).
        ValueError: NaN, infinite, or outside the range.
    """
    if isinstance(value, bool) or not isinstance(value, _REALS):
        text = isinstance(value, str) and _NUMBER_TEXT.fullmatch(value)  # a YAML 1.1 loader (PyYAML) reads 1e-3 so
        hint = ": a number written as text (quoted, or YAML 1.1's 1e-3, read as text: write 1.0e-3)" if text else ""
        raise TypeError(f"{name} must be a number, got {shown_with_type(value)}{hint}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise ValueError(f"{name} must be a finite number, got an int of {len(str(abs(value)))} digits") from None
    within = math.isfinite(number) and (above is None or number > above) and (below is None or number < below)
    if not within:
        wanted = " and ".join(f"{sign} {bound}" for sign, bound in ((">", above), ("<", below)) if bound is not None)
        raise ValueError(f"{name} must be a finite number{' ' + wanted if wanted else ''}, got {shown(value)}")
    return number


def check_positive_float(value: Any, name: str) -> float:
    """``value`` as a finite float > 0."""
    return check_real(value, name, above=0)


def check_text(value: Any, name: str) -> str:
    """``value`` if it is a non-blank string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {shown_with_type(value)}")
    if not value.strip():
        raise ValueError(f"{name} must not be blank, got {shown(value)}")
    return value


def check_names(value: Any, name: str) -> list[str]:
    """``value`` as a list of distinct, printable, non-blank strings; a bare string is refused, not split."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, range)):
        hint = f"; for one name pass [{value!r}]" if isinstance(value, str) else ""
        raise TypeError(f"{name} must be a list of strings, got {shown_with_type(value)}{hint}")
    return check_feature_names(value, len(value), name)


def check_int_sequence(value: Any, name: str, *, minimum: int | None = None) -> list[int]:
    """``value`` as a list of ints (each ``>= minimum``); a bare int or string is refused."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of ints, got {shown_with_type(value)}")
    return [check_int(item, f"{name}[{index}]", minimum=minimum) for index, item in enumerate(value)]


def check_mapping(value: Any, name: str) -> dict[str, Any]:
    """``value`` as a dict with string keys."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {shown_with_type(value)}")
    if (bad := next((key for key in value if not isinstance(key, str)), None)) is not None:
        raise TypeError(f"{name} must have string keys, got the key {shown_with_type(bad)}")
    return dict(value)


def check_path(value: Any, name: str) -> Path:
    """``value`` as a :class:`~pathlib.Path`: a non-empty ``str`` or ``os.PathLike``, a leading ``~`` expanded as a
    shell does (``"~/runs"`` is the home folder's ``runs``, never a folder named ``~``)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {shown_with_type(value)}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path:
        error = ValueError if isinstance(path, str) else TypeError
        raise error(f"{name} must be a non-empty path, got {shown(value)}")
    if "\0" in path:
        raise ValueError(f"{name} holds a NUL character, which no file name can: {shown(path)}")
    return Path(os.path.expanduser(path))


def check_method(value: Any, name: str = "method") -> str:
    """A quadrature method's name: ``"auto"``, :data:`KINK_METHOD` or one of :data:`METHODS`.

    Raises:
        TypeError: not a string.
        ValueError: an unknown name.
    """
    return check_choice(value, (AUTO_METHOD, KINK_METHOD, *METHODS), name)


def check_n_steps(value: Any, name: str = "n_steps") -> NSteps:
    """An int >= 1, ``"auto"`` (refine per state until the error figures are within tolerance) or ``"budget"``
    (a number chosen from the size of the work)."""
    if isinstance(value, str):
        if value not in ("auto", "budget"):
            raise ValueError(f"{name} must be an int >= 1, 'budget' or 'auto', got {value!r}")
        return "auto" if value == "auto" else BUDGET
    return check_positive_int(value, name, example=64)


def default_feature_names(feature_shape: Sequence[int]) -> list[str]:
    """Names of unnamed features: ``x0, x1, ...``, or ``x[c,i,j]`` for multi-dimensional states.

    The one default everywhere (callback, report, command line), in row-major (flattened) order.
    """
    shape = tuple(int(size) for size in feature_shape)
    if len(shape) <= 1:
        return [f"x{i}" for i in range(shape[0] if shape else 1)]
    return ["x[" + ",".join(str(i) for i in index) + "]" for index in itertools.product(*map(range, shape))]


def check_feature_names(names: Any, num_features: int, name: str = "feature_names") -> list[str]:
    """One printable, distinct, non-blank string per feature.

    Raises:
        TypeError: not a sequence of strings (a single string included).
        ValueError: the wrong count, a blank name, a name with a line break or other
            control character (it would break tables and tags), or a repeated name.
    """
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(
            f"{name} must be a list of strings, one per feature, got {type(names).__name__} ({names!r:.60})"
        )
    listed = list(names)
    bad = next((index for index, item in enumerate(listed) if not isinstance(item, str)), None)  # None is a value
    if bad is not None:
        raise TypeError(f"{name} must all be strings, got {listed[bad]!r} ({type(listed[bad]).__name__})")
    if len(listed) != num_features:
        raise ValueError(
            f"{name} has {len(listed)} names but there are {num_features} features; pass one name per feature"
        )
    for index, item in enumerate(listed):
        if not item.strip():
            raise ValueError(f"{name}[{index}] is blank ({item!r}); give each one a visible name")
        if any(not character.isprintable() for character in item):
            raise ValueError(f"{name}[{index}] = {item!r} holds a line break or control character; use plain text")
    # Two spellings of one text (NFC "\u00e9", NFD "e\u0301") look alike everywhere they are shown: one name.
    normal = [unicodedata.normalize("NFC", item) for item in listed]
    if len(set(normal)) != len(normal):
        repeated = sorted({item for item, form in zip(listed, normal) if normal.count(form) > 1})
        raise ValueError(f"{name} repeats {repeated} (names that look alike are one name); give each its own name")
    return listed


def size_text(count: int) -> str:
    """``count`` bytes in binary units, as messages write a size: ``149.0 GiB`` (``512 bytes``)."""
    value, unit = float(count), "bytes"
    for larger in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{count:,} bytes" if unit == "bytes" else f"{value:,.1f} {unit}"


def available_memory() -> int | None:
    """The bytes of memory this process can still take: the system's available memory, less where a cgroup limits
    it (a container) or ``ulimit -v`` its address space; ``None`` where the system does not say (not Linux)."""
    this = "/proc/self/"  # a cgroup's usage counts its page cache (full once a data set was read), of which the kernel
    # reclaims the inactive files' before it refuses a page (docker stats too); v1's own, without "total_", leaves
    # out its children's
    # this process's cgroups: "0::/a/b" (v2), "4:memory:/a/b" (v1's memory controller: a SLURM job on RHEL 8)
    own = dict(re.findall(r"^\d+:(memory|):/(.*)$", _text(this + "cgroup"), re.MULTILINE))  # {"": v2's, "memory": v1's}
    caps = [  # (the most, what is taken of it, what of that is idle): a file missing or saying no number bounds nothing
        (_figure("/proc/meminfo", r"^MemAvailable:\s+(\d+) kB", 1024), 0),
        *(  # in each hierarchy, every cgroup from its root down to this process's (a container, a slice, a job)
            (
                _figure(f"{at}memory.{most}"),
                _figure(f"{at}memory.{used}"),
                _figure(f"{at}memory.stat", rf"^{idle} (\d+)"),
            )
            for key, most, used, idle in (
                ("", "max", "current", "inactive_file"),
                ("memory", "limit_in_bytes", "usage_in_bytes", "total_inactive_file"),
            )
            for at in _folders(f"{key}/{own.get(key, '')}")
        ),
        # ulimit -v: every mapping counts, resident or not (torch's allocator fails there, before the OOM killer)
        (_figure(this + "limits", r"^Max address space\s+(\d+)"), _figure(this + "status", r"^VmSize:\s+(\d+)", 1024)),
    ]
    left = [cap - used + sum(filter(None, cache)) for cap, used, *cache in caps if cap is not None and used is not None]
    return max(0, min(left)) if left else None


def _folders(path: str) -> Iterator[str]:  # /sys/fs/cgroup/ and each folder down to /sys/fs/cgroup/<path>/
    return itertools.accumulate((f"{name}/" for name in path.split("/") if name), initial="/sys/fs/cgroup/")


def _text(path: str) -> str:  # a file's text; "" where it cannot be read
    try:
        with open(path, encoding="ascii") as file:
            return file.read()
    except (OSError, ValueError):
        return ""


def _figure(path: str, pattern: str = r"\A(\d+)\s*\Z", unit: int = 1) -> int | None:  # a whole file's, or a line's
    return next((int(found) * unit for found in re.findall(pattern, _text(path), re.MULTILINE)), None)


def check_memory(needed: int, what: str, fix: str) -> None:
    """Refuse, before it is allocated, memory a user sized (a count, a file) that this machine does not have.

    The kernel's out-of-memory killer ends a process without a word; this check says what was asked and what to do.

    Args:
        needed: the bytes the work will take (an estimate from the sizes the user gave).
        what: what needs them, for the message (``"--auto-samples 1000000000 (16 bytes a state)"``).
        fix: what to do instead.

    Raises:
        ValueError: ``needed`` is more than :func:`available_memory`.
    """
    if (free := available_memory()) is not None and needed > free:
        raise ValueError(
            f"{what} needs about {size_text(needed)} of memory, more than the {size_text(free)} available here (swap "
            f"not counted: work that spills into it is slowed, and so is whatever runs beside it); {fix}"
        )


def callable_name(function: Any) -> str:
    """A readable name for a function or callable object."""
    return getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or type(function).__name__


def relative_error_text(value: float) -> str:
    """A relative completeness error as every message writes it: a fraction in scientific notation (``3.76e-03``).

    ``inf`` (NaN/Inf from the model) and ``nan`` (nothing could be checked) are written as such.
    """
    return f"{value:.2e}" if value == value and abs(value) != float("inf") else str(value)


def non_finite_words(gradient_only: bool) -> tuple[str, str]:
    """``(what, why)`` for states with NaN/Inf: the model's values, or (its values finite) only the path's gradient."""
    if not gradient_only:
        return "the model produced NaN/Inf", ""
    return "the gradient along the path was NaN/Inf", (
        "; the model's values at the states and baselines are finite (a branch torch.where does not take, or sqrt "
        "or log at 0, still puts NaN into the gradient)"
    )
