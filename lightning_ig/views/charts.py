"""The two charts: the top features (or groups) as bars, and their importance over training as a heatmap.

Drawn straight into pixels (:mod:`lightning_ig.views.raster`), a millisecond or two
each, so that the runs that draw them cost about what the others do. Labels
stay readable from 4 to hundreds of features or groups: the bar chart shows
the top ``k``, the heatmap the 40 most important of the last run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_ig.attribution.host_result import Moments
from lightning_ig.attribution.statistics import rank_order
from lightning_ig.views.raster import SEQUENTIAL_LUT, Canvas, format_tick, nice_ticks, to_colour_index

__all__ = [
    "NEGATIVE",
    "POSITIVE",
    "Chart",
    "heatmap_chart",
    "top_features_chart",
]

# Colours for the sign of the mean attribution (ColorBrewer RdBu ends: readable for most colour-blind viewers).
POSITIVE = "#2166ac"
NEGATIVE = "#b2182b"
_INK = "#222222"
_WHISKER = "#444444"
_GRID = "#dddddd"
_VERDICT_COLOURS = {"pass": "#1b7837", "fail": "#b2182b", "non-finite": "#b2182b", "unchecked": "#8c510a"}
_HEATMAP_MAX_ROWS = 40
_LABEL_CHARACTERS = 28
# The axis ends this far past the largest bar; a whisker that would go further is cut there with an arrow.
_AXIS_HEADROOM = 1.3
_BAR_ROW = 34  # pixels per bar
_HEAT_ROW = 24  # pixels per heatmap row
_LABEL_SIZE = 12
_SMALL = 10
_TITLE_SIZE = 15


@dataclass(frozen=True)
class Chart:
    """A drawn chart and what it shows.

    Attributes:
        pixels: ``(H, W, 3)`` uint8, for ``SummaryWriter.add_image(..., dataformats="HWC")``.
        labels: the unit labels drawn, top to bottom.
        axis_limit: the value at the end of the value axis (bar chart) or colour scale (heatmap).
    """

    pixels: np.ndarray
    labels: tuple[str, ...]
    axis_limit: float


def _short(label: str) -> str:
    return label if len(label) <= _LABEL_CHARACTERS else label[: _LABEL_CHARACTERS - 1] + "…"


def _finite(values: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)


def _label_column(canvas: Canvas, labels: Sequence[str], size: int) -> int:
    """Pixels left of the plot for right-aligned labels of this font size."""
    return 16 + int(max((canvas.text_width(label, size=size) for label in labels), default=30.0))


def _value_axis(canvas: Canvas, left: int, right: int, y: int, limit: float, ticks: np.ndarray) -> None:
    """Tick marks and tick values of a value axis ``[0, limit]`` at height ``y``."""
    step = float(ticks[1]) if len(ticks) > 1 else limit
    for tick in ticks:
        x = left + (right - left) * float(tick) / limit
        canvas.line([(x, y), (x, y + 4)], _INK)
        canvas.text((x, y + 6), format_tick(float(tick), step), size=_SMALL + 1, anchor="ma")


def top_features_chart(
    labels: Sequence[str],
    moments: Moments,
    *,
    top_k: int = 10,
    title: str = "Top features by mean |IG attribution|",
    value_label: str = "mean |attribution|",
    verdict: tuple[str, str] | None = None,
) -> Chart:
    """Bar chart of the top-k units by mean ``|attr|``: whiskers the spread of ``|attr|``, colour the sign.

    Args:
        labels: one label per unit (feature or group).
        moments: the units' :class:`~lightning_ig.attribution.host_result.Moments`.
        top_k: how many bars (default 10).
        title: the title (the step is part of it).
        value_label: the x-axis label, with the unit of the target.
        verdict: ``(kind, text)``: the completeness verdict (``"pass"``, ``"fail"``,
            ``"non-finite"``, ``"unchecked"``) and a short sentence, written under the chart.

    Returns:
        The :class:`Chart` (640 pixels wide).
    """
    order = rank_order(moments.mean_abs)[:top_k]
    count = len(order)
    values, spread = _finite(moments.mean_abs[order]), _finite(moments.stddev_abs[order])
    shown = tuple(_short(str(labels[i])) for i in order)
    top, plot_height = 64, _BAR_ROW * max(count, 1)
    height = top + plot_height + 56 + (26 if verdict is not None else 0)
    canvas = Canvas(640, height)
    left, right, bottom = _label_column(canvas, shown, _LABEL_SIZE), 640 - 28, top + plot_height
    limit = float(values.max()) * _AXIS_HEADROOM if count and values.max() > 0 else 1.0
    ticks = nice_ticks(limit)
    for tick in ticks[1:]:  # grid lines behind the bars
        x = left + (right - left) * float(tick) / limit
        canvas.line([(x, top), (x, bottom)], _GRID)

    def x_of(value: float) -> float:
        return left + (right - left) * min(max(value, 0.0), limit) / limit

    for row, index in enumerate(order):
        centre, value = top + _BAR_ROW * row + _BAR_ROW / 2, float(values[row])
        colour = POSITIVE if moments.mean_signed[index] >= 0 else NEGATIVE
        if value > 0:
            canvas.rectangle((left, centre - 0.35 * _BAR_ROW, x_of(value), centre + 0.35 * _BAR_ROW), colour)
        canvas.text((left - 8, centre), shown[row], size=_LABEL_SIZE, anchor="rm")
        low, high = x_of(value - float(spread[row])), x_of(value + float(spread[row]))  # |attr| >= 0: stops at 0
        canvas.line([(low, centre), (high, centre)], _WHISKER)
        for end in (low, high):
            canvas.line([(end, centre - 4), (end, centre + 4)], _WHISKER)
        if value + float(spread[row]) > limit:  # the whisker goes on past the axis' end
            canvas.polygon([(right + 1, centre - 4), (right + 8, centre), (right + 1, centre + 4)], _WHISKER)
        canvas.text((x_of(value) + 4, centre - 4), f"{value:.3g}", size=_SMALL, anchor="ld")
    canvas.line([(left, top - 4), (left, bottom), (right, bottom)], _INK)
    _value_axis(canvas, left, right, bottom, limit, ticks)
    middle = (left + right) / 2
    canvas.text((middle, bottom + 24), value_label, size=_SMALL + 1, anchor="ma")
    canvas.text((middle, bottom + 38), "whiskers: ± std of |attribution| over the states", size=_SMALL + 1, anchor="ma")
    canvas.text((12, 10), title, size=_TITLE_SIZE)
    _sign_legend(canvas, right, 38)
    if verdict is not None:
        kind, text = verdict
        canvas.text(
            (12, height - 8), text, size=_LABEL_SIZE, colour=_VERDICT_COLOURS.get(kind, _INK), anchor="ld", bold=True
        )
    return Chart(canvas.pixels, shown, limit)


def _sign_legend(canvas: Canvas, right: float, y: float) -> None:
    """The two colour swatches of the bars' sign, right-aligned at ``right``."""
    entries = [(POSITIVE, "mean attribution > 0 (raises the target)"), (NEGATIVE, "< 0 (lowers it)")]
    x = right - sum(28 + canvas.text_width(text, size=_SMALL) for _, text in entries) + 8
    for colour, text in entries:
        canvas.rectangle((x, y - 4, x + 18, y + 4), colour)
        canvas.text((x + 22, y), text, size=_SMALL, anchor="lm")
        x += 28 + canvas.text_width(text, size=_SMALL)


def heatmap_chart(
    labels: Sequence[str],
    steps: Sequence[int],
    mean_abs_history: np.ndarray,
    *,
    title: str = "Importance over training",
) -> Chart:
    """Heatmap of importance (rows: units, the 40 largest of the last run) over IG runs (columns).

    Each column is one run's mean ``|attr|`` per unit divided by the run's
    total, so runs with different value scales compare.

    Args:
        labels: one label per unit.
        steps: the global step of each run (column labels).
        mean_abs_history: ``(num_runs, U)`` mean ``|attr|`` per run and unit.
        title: the title.

    Returns:
        The :class:`Chart` (640 pixels wide, whatever the number of runs).
    """
    history = np.asarray(mean_abs_history, dtype=np.float64)  # (R, U)
    runs, units = history.shape
    order = rank_order(history[-1])[:_HEATMAP_MAX_ROWS]
    totals = np.nansum(np.abs(history), axis=1)  # (R,)
    shares = _finite(history[:, order].T / np.where(totals > 0, totals, 1.0)[None, :])  # (rows, R)
    rows = len(order)
    shown = tuple(_short(str(labels[i])) for i in order)
    size = _LABEL_SIZE - 1 if rows > 20 else _LABEL_SIZE
    width = 640  # as the bar chart: TensorBoard shows both at one scale (its cards are narrower still)
    top, plot_height = 44, _HEAT_ROW * rows
    canvas = Canvas(width, top + plot_height + 50)
    left, right, bottom = _label_column(canvas, shown, size), width - 72, top + plot_height
    scale = float(shares.max()) if shares.size and shares.max() > 0 else 1.0
    cells = SEQUENTIAL_LUT[to_colour_index(shares / scale)].astype(np.uint8)  # (rows, R, 3)
    columns = np.minimum((np.arange(right - left) * runs) // (right - left), runs - 1)  # pixel -> run
    canvas.paste(cells[:, columns].repeat(_HEAT_ROW, axis=0), left, top)
    for row, label in enumerate(shown):
        canvas.text((left - 8, top + _HEAT_ROW * row + _HEAT_ROW / 2), label, size=size, anchor="rm")
    ticks = np.unique(np.linspace(0, runs - 1, num=min(runs, 8)).round().astype(int))
    for tick in ticks:
        x = left + (right - left) * (tick + 0.5) / runs
        canvas.line([(x, bottom), (x, bottom + 4)], _INK)
        canvas.text((x, bottom + 6), str(steps[tick]), size=_SMALL + 1, anchor="ma")
    canvas.text(((left + right) / 2, bottom + 26), "global step of the IG run", size=_SMALL + 1, anchor="ma")
    suffix = "" if rows == units else f" (top {rows} of {units} by the last run)"
    canvas.text((12, 10), title + suffix, size=_TITLE_SIZE - 1)
    _colour_bar(canvas, right + 12, top, bottom, scale)
    return Chart(canvas.pixels, shown, scale)


def _colour_bar(canvas: Canvas, left: int, top: int, bottom: int, scale: float) -> None:
    """A vertical viridis bar for ``[0, scale]`` with round ticks (the title says what the colour is)."""
    ramp = np.linspace(1.0, 0.0, max(bottom - top, 2))  # top: the largest share
    canvas.paste(SEQUENTIAL_LUT[to_colour_index(ramp)].astype(np.uint8)[:, None, :].repeat(14, axis=1), left, top)
    ticks = nice_ticks(scale, most=5)
    step = float(ticks[1]) if len(ticks) > 1 else scale
    for tick in ticks:
        y = bottom - (bottom - top) * float(tick) / scale
        canvas.line([(left + 14, y), (left + 17, y)], _INK)
        canvas.text((left + 20, y), format_tick(float(tick), step), size=_SMALL, anchor="lm")
