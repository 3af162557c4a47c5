"""The numbers of IG runs: completeness and the accuracy verdict, where the mass sits, drift, one feature order.

Host-side and float64, on a :class:`~lightning_ig.run.host_result.HostResult` (an
:class:`~lightning_ig.attribution.IGResult` is brought to the host first). The callback's summary, the JSON
report all read them from here.

Completeness of a state is ``|sum(attr) - (F(x) - F(b))| / |F(x) - F(b)|``. A state whose ``|F(x) - F(b)|`` is too small
for that ratio (*degenerate*) is reported with its absolute error only; a state whose forward or attributions are
NaN/Inf (*non-finite*) is never counted as clean. The worst relative error is ``inf`` when any state is non-finite,
``nan`` when no state could be checked (every state degenerate), and otherwise the largest over the checked states:
never 0.0 for "nothing checked".

The verdict (:func:`accuracy_verdict`) is decided by the figures that tell the truth on the networks people train, not
by that ratio: the worst estimated attribution error and the worst mass-relative completeness error over the ordinary
states (not near the baseline). Both within ``sqrt(2) x tol`` is "within tol". The ratio ``|delta| / |dF|`` stays in the
report and the scalars (schema v1) but decides nothing: on a random-init ReLU network ``dF`` is a small fraction of the
attribution mass and the ratio reads large for accurate maps (``docs/trust.md``).

Drift compares one run's importance (the mean ``|attr|`` of its *units*: the features, or the groups when groups are in
use) with the previous run's and the first one's:

* ``spearman_prev`` / ``spearman_first``: Spearman rank correlation (ties get average ranks; +-1 by construction
  with 2 units, NaN with 1);
* ``topk_jaccard_prev``: the overlap ``|A & B| / |A | B|`` of the top-k units (1 by construction with ``top_k`` or
  fewer units). All three from the second run on, as schema-v1 reports have always held them; the pictures leave
  out a drift tag until it first moves below 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_ig.attribution.result import worst_relative_error
from lightning_ig.run.host_result import HostResult
from lightning_ig.vocabulary import check_positive_float, check_positive_int

__all__ = [
    "CONCENTRATION_SHARES",
    "VERDICT_FACTOR",
    "AccuracyVerdict",
    "Completeness",
    "accuracy_verdict",
    "completeness",
    "concentration",
    "drift",
    "json_float",
    "json_floats",
    "rank_order",
    "spearman",
    "topk_jaccard",
]


def json_float(value: float) -> float | None:
    """A float for strict JSON: non-finite values become ``None`` (``null``)."""
    value = float(value)
    return value if math.isfinite(value) else None


def json_floats(values: np.ndarray) -> list[float | None]:
    """``values.tolist()`` with non-finite entries as ``None`` (one vectorised check for the common case)."""
    listed = values.tolist()
    return listed if np.isfinite(values).all() else [value if math.isfinite(value) else None for value in listed]


def rank_order(values: np.ndarray) -> np.ndarray:
    """Indices of ``values`` by decreasing value; ties keep feature order; NaN last.

    The one ordering of features and groups used everywhere: the report's
    top-k, the Jaccard drift, the text table and the charts.
    """
    return np.argsort(-np.where(np.isnan(values), -np.inf, values), kind="stable")


VERDICT_FACTOR = math.sqrt(2)
""""within tol" iff the worst figures are <= this x tol.

The target asks for "within" when the true worst error is <= tol and "not within" when it is > 2 tol, and allows
either answer in between; a threshold at ``c tol`` gets both right whenever the estimate is within ``[c / 2, c]`` of
the truth on the worst state, and ``c = sqrt(2)`` gives the widest symmetric band, ``[0.71, 1.41]`` (how it fares on
trained and random-init agents: ``docs/trust.md``).
"""

_FIGURE_WORDS = {
    "attribution_error": "estimated attribution error",
    "mass_relative_error": "mass-relative completeness error",
}


@dataclass(frozen=True)
class AccuracyVerdict:
    """Whether a run's attributions are within tolerance, and which figure decided it.

    Attributes:
        within: ``True`` (within tol), ``False`` (not within, or NaN/Inf), ``None`` (nothing could be checked:
            no state away from the baseline).
        figure: the figure that decided: ``"attribution_error"`` or ``"mass_relative_error"`` (the larger of the
            two; for ``within=None``, ``"none"``).
        value: that figure's worst value.
        threshold: ``sqrt(2) x tol``.
        reason: one sentence saying so.
    """

    within: bool | None
    figure: str
    value: float
    threshold: float
    reason: str

    @property
    def words(self) -> str:
        """The figure in words (``"estimated attribution error"``)."""
        return _FIGURE_WORDS.get(self.figure, "no figure")


def accuracy_verdict(worst_attribution_error: float, worst_mass_relative_error: float, tol: float) -> AccuracyVerdict:
    """The verdict of a run from its two worst figures (over the ordinary states, as :class:`IGResult` gives them).

    "within tol" iff ``max(worst_attribution_error, worst_mass_relative_error) <= sqrt(2) * tol``
    (:data:`VERDICT_FACTOR`); ``None`` when both are NaN (no ordinary state); ``False`` when either is infinite
    (NaN/Inf from the model) or one is NaN while the other is not (a figure missing where there was a state to
    judge). The estimate catches per-feature errors (what a user reads), the mass-relative error the sum; neither
    alone decides, and the ratio ``|delta| / |dF|`` does not enter.

    Args:
        worst_attribution_error: e.g. :attr:`IGResult.worst_attribution_error`.
        worst_mass_relative_error: e.g. :attr:`IGResult.worst_mass_relative_error`.
        tol: the tolerance (``completeness_tol``), a fraction (0.01 = 1%).

    Returns:
        An :class:`AccuracyVerdict`.

    Raises:
        TypeError, ValueError: ``tol`` is not a positive number.

    Example::

        >>> accuracy_verdict(0.012, 0.003, 0.01).within   # 0.012 <= 1.41 x 0.01
        True
    """
    return _verdict(worst_attribution_error, worst_mass_relative_error, check_positive_float(tol, "tol"))


def _verdict(worst_attribution_error: float, worst_mass_relative_error: float, tol: float) -> AccuracyVerdict:
    """:func:`accuracy_verdict` of a checked ``tol`` (a run's summary: no vocabulary check on the run's path)."""
    threshold = VERDICT_FACTOR * tol
    figures = {
        "attribution_error": float(worst_attribution_error),
        "mass_relative_error": float(worst_mass_relative_error),
    }
    if all(math.isnan(value) for value in figures.values()):
        return AccuracyVerdict(
            None, "none", math.nan, threshold, "no state could be checked: every state is near the baseline"
        )
    if (broken := next((name for name, value in figures.items() if not math.isfinite(value)), None)) is not None:
        value = figures[broken]
        cause = "NaN/Inf in a value or gradient" if math.isinf(value) else "missing where the other figure is not"
        return AccuracyVerdict(
            False, broken, value, threshold, f"the worst {_FIGURE_WORDS[broken]} is {value} ({cause})"
        )
    figure = max(figures, key=figures.__getitem__)  # ties: the estimate, the figure a user reads
    value = figures[figure]
    within = value <= threshold
    reason = f"the worst {_FIGURE_WORDS[figure]} {value:.2e} {'<=' if within else '>'} sqrt(2) x tol = {threshold:.2e}"
    return AccuracyVerdict(within, figure, value, threshold, reason)


@dataclass(frozen=True)
class Completeness:
    """How well the attributions add up to ``F(x) - F(b)`` over the states of one run, and the accuracy verdict.

    Attributes:
        worst_relative_error: ``inf`` if any state is non-finite, ``nan`` when no
            state could be checked, else the largest relative error of a checked state.
        mean_abs_error: mean ``|delta|`` over the finite states (``nan`` if none).
        num_states: states attributed.
        num_degenerate: finite states whose ``|F(x) - F(b)|`` is too small for a ratio.
        num_non_finite: states with a NaN/Inf forward value or attribution.
        first_non_finite: the index of the first such state, or ``None``.
        tolerance: the ``completeness_tol`` the verdict is judged against.
        worst_attribution_error: the worst estimated attribution error over the ordinary states.
        worst_mass_relative_error: the worst mass-relative completeness error over the ordinary states.
        num_near_baseline: states near the baseline (flagged, not scored).
        gradient_only: there are NaN/Inf states and ``F(x)``, ``F(b)`` are finite in each: only the gradient is not.
    """

    worst_relative_error: float
    mean_abs_error: float
    num_states: int
    num_degenerate: int
    num_non_finite: int
    first_non_finite: int | None
    tolerance: float
    worst_attribution_error: float = math.nan
    worst_mass_relative_error: float = math.nan
    num_near_baseline: int = 0
    gradient_only: bool = False

    @property
    def num_checked(self) -> int:
        """States with a relative error: finite and not degenerate."""
        return self.num_states - self.num_degenerate - self.num_non_finite

    @property
    def accuracy(self) -> AccuracyVerdict:
        """The :func:`accuracy_verdict` of the two worst figures at :attr:`tolerance`."""
        return _verdict(self.worst_attribution_error, self.worst_mass_relative_error, self.tolerance)

    @property
    def verdict(self) -> str:
        """``"non-finite"``, ``"unchecked"`` (no state away from the baseline), ``"pass"`` or ``"fail"``.

        Decided by :attr:`accuracy` (the estimate and the mass-relative error), not by :attr:`worst_relative_error`.
        """
        if self.num_non_finite:
            return "non-finite"
        within = self.accuracy.within
        return "unchecked" if within is None else "pass" if within else "fail"


def completeness(result: Any, tolerance: float = 0.01) -> Completeness:
    """The :class:`Completeness` of a result (an IGResult or a :class:`HostResult`)."""
    host = HostResult.from_result(result)
    finite, first = np.abs(host.delta[~host.non_finite]), np.flatnonzero(host.non_finite)
    ends = np.concatenate([host.f_input[host.non_finite], host.f_baseline[host.non_finite]])
    flags = [torch.from_numpy(values) for values in (host.relative_error, host.degenerate, host.non_finite)]
    return Completeness(
        worst_relative_error=worst_relative_error(*flags),  # the engine's one definition, on the gathered states
        mean_abs_error=float(finite.mean()) if finite.size else math.nan,
        num_states=host.num_states,
        num_degenerate=int(host.degenerate.sum()),
        num_non_finite=int(host.non_finite.sum()),
        first_non_finite=int(first[0]) if first.size else None,
        tolerance=float(tolerance),
        worst_attribution_error=host.worst_attribution_error,
        worst_mass_relative_error=host.worst_mass_relative_error,
        num_near_baseline=host.num_near_baseline,
        gradient_only=bool(ends.size) and bool(np.isfinite(ends).all()),  # NaN/Inf states, finite values
    )


CONCENTRATION_SHARES = {"top1pct_share": 0.01, "top10pct_share": 0.10}
"""Scalars of where the attribution mass sits: the share held by the top 1% and 10% of features."""


def concentration(mean_abs: np.ndarray) -> dict[str, float]:
    """The share of the total mean ``|attr|`` held by the top 1% / 10% of features (at least one feature each).

    1.0 means one feature (or 1% of them) carries everything; an even spread gives about 0.01 / 0.1. ``nan`` when the
    total is 0 or not finite. Costs one partial sort of the ``F`` values, whatever the input size.

    Args:
        mean_abs: ``(F,)`` mean ``|attr|`` per feature.

    Returns:
        ``{"top1pct_share": ..., "top10pct_share": ...}``.
    """
    values = np.asarray(mean_abs, dtype=np.float64).reshape(-1)
    total, shares = float(values.sum()), {}
    for name, fraction in CONCENTRATION_SHARES.items():
        count = max(1, math.ceil(fraction * values.size))
        top = np.partition(values, values.size - count)[values.size - count :] if np.isfinite(total) else values
        shares[name] = float(top.sum()) / total if np.isfinite(total) and total > 0 else math.nan
    return shares


# --------------------------------------------------------------------------- drift between runs


def _vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}") from error


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given the mean of the ranks they span (vectorised)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # first index of each tie run, and one past the last (concatenate: np.r_'s index tricks cost more than the ranks)
    starts = np.flatnonzero(np.concatenate(([True], sorted_values[1:] != sorted_values[:-1])))
    stops = np.append(starts[1:], values.size)
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
    rank_x, rank_y = _average_ranks(x) - (x.size + 1) / 2.0, _average_ranks(y) - (y.size + 1) / 2.0
    denominator = math.sqrt(float(rank_x @ rank_x) * float(rank_y @ rank_y))
    return math.nan if denominator == 0.0 else max(-1.0, min(1.0, float(rank_x @ rank_y) / denominator))


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
    top_a, top_b = set(rank_order(x)[:k].tolist()), set(rank_order(y)[:k].tolist())
    return len(top_a & top_b) / len(top_a | top_b)


def drift(
    current: np.ndarray, previous: np.ndarray | None, first: np.ndarray | None, *, top_k: int
) -> dict[str, float]:
    """The drift scalars of these vectors (see the module docstring).

    Args:
        current: this run's mean ``|attr|`` per unit.
        previous: the previous run's, or ``None`` (first run: no drift).
        first: the first run's, or ``None``.
        top_k: the size of the top set for the Jaccard overlap.

    Returns:
        ``spearman_prev``, ``spearman_first`` and ``topk_jaccard_prev``; empty
        on the first run or when the previous run had another number of units.
    """
    current = _vector(current, "current")
    if previous is None or first is None or len(previous) != current.size or len(first) != current.size:
        return {}
    return {
        "spearman_prev": spearman(current, previous),
        "spearman_first": spearman(current, first),
        "topk_jaccard_prev": topk_jaccard(current, previous, top_k) if current.size > top_k else 1.0,  # all units
    }
