"""Drift of attributions between IG runs: is the model still relying on the same features?

Each run's importance is the mean ``|attr|`` of its *units* (the features, or
the groups when groups are in use). Drift compares it with the previous run
and with the first one:

* ``spearman_prev`` / ``spearman_first``: Spearman rank correlation (ties get
  average ranks), reported only with at least 3 units: with 2 it is +-1 by
  construction;
* ``topk_jaccard_prev``: the overlap ``|A & B| / |A | B|`` of the top-k units,
  reported only when there are more units than ``top_k`` (with ``top_k`` or
  fewer units both sets are all units and the overlap is 1 by construction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_ig.statistics import rank_order
from lightning_ig.vocabulary import check_positive_int

__all__ = ["drift", "spearman", "topk_jaccard"]

_MIN_UNITS_FOR_RANKS = 3


def _vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}") from error


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given the mean of the ranks they span (vectorised)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])  # first index of each tie run
    stops = np.r_[starts[1:], values.size]  # one past the last
    run = np.repeat(np.arange(starts.size), stops - starts)
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = (starts[run] + stops[run] - 1) / 2.0 + 1.0
    return ranks


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation of two equally long vectors, ties given average ranks.

    Args:
        a: first vector (e.g. one run's mean ``|attr|`` per feature).
        b: second vector, as long as ``a``.

    Returns:
        The Pearson correlation of the rank vectors, in ``[-1, 1]``; ``nan`` when
        either vector is constant (length 1 included) or holds a NaN.

    Raises:
        ValueError: ``a`` and ``b`` differ in length or are empty.

    Example::

        >>> spearman([1.0, 2.0, 3.0], [10.0, 20.0, 20.0])
        0.8660254037844387
    """
    x, y = _vector(a, "a"), _vector(b, "b")
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"spearman needs two non-empty vectors of one length, got lengths {x.size} and {y.size}")
    if np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    rank_x = _average_ranks(x) - (x.size + 1) / 2.0
    rank_y = _average_ranks(y) - (y.size + 1) / 2.0
    denominator = math.sqrt(float(rank_x @ rank_x) * float(rank_y @ rank_y))
    if denominator == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float(rank_x @ rank_y) / denominator))


def topk_jaccard(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, k: int) -> float:
    """Jaccard overlap ``|A & B| / |A | B|`` of the top-``k`` entries of two score vectors.

    Ties keep feature order (lower index first), so the result is deterministic.

    Args:
        a: per-feature scores of one run (e.g. mean ``|attr|``).
        b: per-feature scores of another run, as long as ``a``.
        k: how many top entries to compare; clipped to the vectors' length.

    Returns:
        A value in ``[0, 1]``: 1 when both runs have the same top-``k`` set.

    Raises:
        ValueError: ``a`` and ``b`` differ in length or are empty, or ``k < 1``.
        TypeError: ``k`` is not an int.

    Example::

        >>> topk_jaccard([3.0, 2.0, 1.0, 0.0], [3.0, 0.0, 1.0, 2.0], k=2)
        0.3333333333333333
    """
    check_positive_int(k, "k")
    x, y = _vector(a, "a"), _vector(b, "b")
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"topk_jaccard needs two non-empty vectors of one length, got lengths {x.size} and {y.size}")
    k = min(int(k), x.size)
    top_a = set(rank_order(x)[:k].tolist())
    top_b = set(rank_order(y)[:k].tolist())
    return len(top_a & top_b) / len(top_a | top_b)


def drift(
    current: np.ndarray, previous: np.ndarray | None, first: np.ndarray | None, *, top_k: int
) -> dict[str, float]:
    """The drift scalars that mean something for these vectors (see the module docstring).

    Args:
        current: this run's mean ``|attr|`` per unit.
        previous: the previous run's, or ``None`` (first run: no drift).
        first: the first run's, or ``None``.
        top_k: the size of the top set for the Jaccard overlap.

    Returns:
        Any of ``spearman_prev``, ``spearman_first``, ``topk_jaccard_prev``; empty
        on the first run or when the previous run had another number of units.
    """
    current = _vector(current, "current")
    if previous is None or first is None or len(previous) != current.size or len(first) != current.size:
        return {}
    scalars: dict[str, float] = {}
    if current.size >= _MIN_UNITS_FOR_RANKS:
        scalars["spearman_prev"] = spearman(current, previous)
        scalars["spearman_first"] = spearman(current, first)
    if current.size > top_k:
        scalars["topk_jaccard_prev"] = topk_jaccard(current, previous, top_k)
    return scalars


def drift_tags(num_units: int, top_k: int) -> list[str]:
    """The drift scalars :func:`drift` reports from the second run on, for this many units."""
    names = ["spearman_prev", "spearman_first"] if num_units >= _MIN_UNITS_FOR_RANKS else []
    return names + (["topk_jaccard_prev"] if num_units > top_k else [])
