"""The two matplotlib figures: the top features (or groups) as bars, and their importance over training.

Drawn with matplotlib's object API (no pyplot state, nothing left open),
small and plain so that drawing them costs tens of milliseconds. Labels stay
readable from 4 to hundreds of features or groups: the bar chart shows the
top ``k``, the heatmap the 40 most important of the last run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_ig.host_result import Moments
from lightning_ig.statistics import rank_order

__all__ = ["heatmap_figure", "top_features_figure"]

# Colours for the sign of the mean attribution (ColorBrewer RdBu ends: readable for most colour-blind viewers).
POSITIVE = "#2166ac"
NEGATIVE = "#b2182b"
_VERDICT_COLOURS = {"pass": "#1b7837", "fail": "#b2182b", "non-finite": "#b2182b", "unchecked": "#8c510a"}
_HEATMAP_MAX_ROWS = 40
_LABEL_CHARACTERS = 28
# The axis ends this far past the largest bar; a whisker that would go further is cut there with an arrow.
_AXIS_HEADROOM = 1.3


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # noqa: PLC0415 - matplotlib only when figures are drawn

    return Figure(figsize=(width, height), dpi=100, facecolor="white")


def _short(label: str) -> str:
    return label if len(label) <= _LABEL_CHARACTERS else label[: _LABEL_CHARACTERS - 1] + "…"


def _label_margin(labels: Sequence[str]) -> float:
    """Inches left of the axes for tick labels of this length (about 0.075 in per character at 9-10 pt)."""
    return 0.4 + 0.075 * max((len(_short(label)) for label in labels), default=4)


def top_features_figure(
    labels: Sequence[str],
    moments: Moments,
    *,
    top_k: int = 10,
    title: str = "Top features by mean |IG attribution|",
    value_label: str = "mean |attribution|",
    verdict: tuple[str, str] | None = None,
) -> Any:
    """Bar chart of the top-k units by mean ``|attr|``: whiskers the spread of ``|attr|``, colour the sign.

    Args:
        labels: one label per unit (feature or group).
        moments: the units' :class:`~lightning_ig.host_result.Moments`.
        top_k: how many bars (default 10).
        title: the title (the step is part of it).
        value_label: the x-axis label, with the unit of the target.
        verdict: ``(kind, text)``: the completeness verdict (``"pass"``, ``"fail"``,
            ``"non-finite"``, ``"unchecked"``) and a short sentence, written under the chart.

    Returns:
        A ``matplotlib.figure.Figure``.
    """
    from matplotlib.patches import Patch  # noqa: PLC0415

    order = rank_order(moments.mean_abs)[:top_k]
    count = len(order)
    figure = _new_figure(6.4, 2.0 + 0.34 * count)
    axes = figure.add_subplot()
    positions = np.arange(count)[::-1]  # largest on top
    values = np.nan_to_num(moments.mean_abs[order], nan=0.0, posinf=0.0)
    spread = np.nan_to_num(moments.stddev_abs[order], nan=0.0, posinf=0.0)
    colours = [POSITIVE if moments.mean_signed[i] >= 0 else NEGATIVE for i in order]
    axes.barh(positions, values, color=colours, edgecolor="none", height=0.7)
    limit = float(values.max()) * _AXIS_HEADROOM if count and values.max() > 0 else 1.0
    left = np.minimum(spread, values)  # |attr| >= 0: the whisker stops at 0
    right = np.minimum(spread, limit - values)  # and at the axis' end, where an arrow says it goes on
    axes.errorbar(values, positions, xerr=[left, right], fmt="none", ecolor="#444444", elinewidth=1.0, capsize=3)
    cut = values + spread > limit
    axes.plot(np.full(int(cut.sum()), limit), positions[cut], ">", color="#444444", markersize=5, clip_on=False)
    axes.set_xlim(0.0, limit)
    axes.set_yticks(positions, [_short(str(labels[i])) for i in order], fontsize=9)
    for position, value in zip(positions, values):
        axes.annotate(f"{value:.3g}", (value, position), xytext=(3, 6), textcoords="offset points", fontsize=7.5)
    axes.set_xlabel(f"{value_label}\nwhiskers: ± std of |attribution| over the states", fontsize=8.5)
    figure.suptitle(title, fontsize=11, x=0.02, ha="left")
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis="x", color="#dddddd", linewidth=0.8)
    axes.set_axisbelow(True)
    axes.legend(
        handles=[Patch(color=POSITIVE, label="mean attribution > 0 (raises the target)"),
                 Patch(color=NEGATIVE, label="< 0 (lowers it)")],
        loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=7.5, frameon=False, borderaxespad=0.2,
    )  # fmt: skip
    bottom = 0.8
    if verdict is not None:
        kind, text = verdict
        figure.text(0.02, 0.03, text, fontsize=8.5, color=_VERDICT_COLOURS.get(kind, "#222222"), ha="left", va="bottom",
                    fontweight="bold", wrap=True)  # fmt: skip
        bottom += 0.25
    height = figure.get_figheight()
    figure.subplots_adjust(
        left=_label_margin([str(labels[i]) for i in order]) / figure.get_figwidth(),
        right=0.95,
        top=1 - 0.75 / height,
        bottom=bottom / height,
    )
    return figure


def heatmap_figure(
    labels: Sequence[str],
    steps: Sequence[int],
    mean_abs_history: np.ndarray,
    *,
    title: str = "Importance over training",
) -> Any:
    """Heatmap of importance (rows: units, the 40 largest of the last run) over IG runs (columns).

    Each column is one run's mean ``|attr|`` per unit divided by the run's
    total, so runs with different value scales compare.

    Args:
        labels: one label per unit.
        steps: the global step of each run (column labels).
        mean_abs_history: ``(num_runs, U)`` mean ``|attr|`` per run and unit.
        title: the title.

    Returns:
        A ``matplotlib.figure.Figure``.
    """
    history = np.asarray(mean_abs_history, dtype=np.float64)  # (R, U)
    runs, units = history.shape
    order = rank_order(history[-1])[:_HEATMAP_MAX_ROWS]
    totals = np.nansum(np.abs(history), axis=1)  # (R,)
    values = history[:, order].T / np.where(totals > 0, totals, 1.0)[None, :]  # (rows, R): units down, runs across
    rows = len(order)
    shown = [_short(str(labels[i])) for i in order]
    figure = _new_figure(float(np.clip(4.5 + 0.1 * runs, 6.4, 10.0)), 1.5 + 0.24 * rows)
    axes = figure.add_subplot()
    image = axes.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0)
    axes.set_yticks(np.arange(rows), shown, fontsize=8 if rows > 20 else 9)
    ticks = np.unique(np.linspace(0, runs - 1, num=min(runs, 8)).round().astype(int))
    axes.set_xticks(ticks, [str(steps[i]) for i in ticks], fontsize=8)
    axes.set_xlabel("global step of the IG run", fontsize=9)
    suffix = "" if rows == units else f" (top {rows} of {units} by the last run)"
    axes.set_title(title + suffix, fontsize=11, loc="left")
    colourbar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    colourbar.set_label("share of the run's total mean |attr|", fontsize=8)
    colourbar.ax.tick_params(labelsize=7)
    height = figure.get_figheight()
    figure.subplots_adjust(
        left=_label_margin(shown) / figure.get_figwidth(),
        right=1 - 0.9 / figure.get_figwidth(),
        top=1 - 0.45 / height,
        bottom=0.6 / height,
    )
    return figure
