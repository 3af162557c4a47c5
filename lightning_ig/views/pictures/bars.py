"""The bar charts: the top features (or groups) by mean ``|attr|``, each bar split by sign, with the verdict.

Drawn straight into pixels (:mod:`~lightning_ig.views.pictures.raster`) at the size
TensorBoard shows them (:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH` wide, text from
:data:`~lightning_ig.views.pictures.raster.SMALL_SIZE` up), so that the verdict, the legend and the units read without
"Show actual image size". A bar is the mean of ``|attr|`` = the mean of its positive part
plus the mean of its negative part, drawn blue then red: a feature whose attributions run both ways (the ball,
-1.4 to +1.0) is a two-tone bar, not a red one. The whiskers are the 95% interval of the mean ``|attr|`` over the
held-out states (``1.96 sd(|attr|) / sqrt(n)``): whether the order of two bars would survive other states. The
word "std" is left to the text and the JSON report, where it is the standard deviation of the signed attribution.

:func:`bar_chart` is the core; :func:`top_features_chart` (here) and
:func:`~lightning_ig.views.pictures.action_charts.contrast_chart` call it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import rank_order
from lightning_ig.views.pictures.raster import (
    CARD_HEIGHT,
    CARD_WIDTH,
    NEGATIVE,
    POSITIVE,
    SMALL_SIZE,
    TEXT_SIZE,
    TITLE_SIZE,
    Canvas,
    format_tick,
    nice_ticks,
    rgb,
)
from lightning_ig.views.text import format_value

__all__ = [
    "GRID",
    "GROUND",
    "INK",
    "LABEL_ROOM",
    "LINE",
    "MUTED",
    "NEGATIVE",
    "POSITIVE",
    "VERDICT_COLOURS",
    "VERDICT_HEADLINES",
    "Chart",
    "bar_chart",
    "draw_verdict",
    "finite",
    "label_swatch",
    "sign_legend",
    "sign_parts",
    "top_features_chart",
    "two_tone_bar",
]

INK = "#222222"
MUTED = "#555555"
GRID = "#e3e3e3"
GROUND = "#262626"  # the frames' ground: a swatch of a channel's colour is drawn on it, as in the frames
LINE = 15
LABEL_ROOM = 0.45  # at most this fraction of the width for labels
_WHISKER = "#222222"
VERDICT_COLOURS = {"pass": "#1b7837", "fail": "#b2182b", "non-finite": "#b2182b", "unchecked": "#8c510a"}
"""The colour of each completeness verdict's headline and line (green, red, red, brown)."""
VERDICT_HEADLINES = {
    "pass": "✓ attributions add up",
    "fail": "✗ attributions do NOT add up",
    "non-finite": "✗ NaN/Inf: do not trust these",
    "unchecked": "? completeness not checked",
}
"""What each completeness verdict (:attr:`lightning_ig.run.statistics.Completeness.verdict`) says, large."""
_Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


@dataclass(frozen=True)
class Chart:
    """A drawn chart and what it shows.

    Attributes:
        pixels: ``(H, W, 3)`` uint8, for ``SummaryWriter.add_image(..., dataformats="HWC")``.
        labels: the unit labels drawn, top to bottom.
        axis_limit: the value at the end of the value axis (bar chart) or colour scale (heatmap, shares: 1).
    """

    pixels: np.ndarray
    labels: tuple[str, ...]
    axis_limit: float


def finite(values: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)


def sign_parts(moments: Moments) -> tuple[np.ndarray, np.ndarray]:
    """The mean of the positive and of the negative part of each unit's attributions: they add up to mean ``|attr|``.

    ``mean(max(a, 0)) = (mean|a| + mean a) / 2`` and ``mean(max(-a, 0)) = (mean|a| - mean a) / 2``.
    """
    mean_abs, mean_signed = finite(moments.mean_abs), finite(moments.mean_signed)
    positive = np.clip((mean_abs + mean_signed) / 2, 0.0, None)
    return positive, np.clip(mean_abs - positive, 0.0, None)


def top_features_chart(
    labels: Sequence[str],
    moments: Moments,
    *,
    top_k: int = 10,
    title: str | Sequence[str] = "Top features by mean |IG attribution|",
    value_label: str | Sequence[str] = "mean |attribution|",
    verdict: tuple[str, str] | None = None,
    num_states: int | None = None,
    label_colours: Sequence[str] | None = None,
    target_label: str = "the target",
) -> Chart:
    """Bar chart of the top-k units by mean ``|attr|``, each bar split into its positive and negative mass.

    Args:
        labels: one label per unit (feature or group).
        moments: the units' :class:`~lightning_ig.run.host_result.Moments`.
        top_k: how many bars (default 10).
        title: the title, or wordings of it, the longest first: the first that fits the width is drawn.
        value_label: the x-axis label, with the unit of the target (or wordings of it, the longest first).
        verdict: ``(kind, detail)``: the completeness verdict (``"pass"``, ``"fail"``, ``"non-finite"``,
            ``"unchecked"``) and a short line of numbers, written large under the title.
        num_states: how many states the moments are over: whiskers show the 95% interval of each mean
            (``None``, default: no whiskers).
        label_colours: one ``"#rrggbb"`` per unit, drawn as a swatch beside its label (the channels' colours
            in the saliency pictures).
        target_label: what the attributions are of, for the sign legend (``"V(s)"``; default ``"the target"``).

    Returns:
        The :class:`Chart` (:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH` pixels wide).
    """
    positive, negative = sign_parts(moments)
    return bar_chart(
        labels,
        positive,
        negative,
        spread=moments.stddev_abs,
        top_k=top_k,
        title=title,
        value_label=value_label,
        verdict=verdict,
        num_states=num_states,
        label_colours=label_colours,
        legend=(f"raises {target_label}", "lowers it"),
    )


def bar_chart(
    labels: Sequence[str],
    positive: np.ndarray,
    negative: np.ndarray,
    *,
    spread: np.ndarray | None = None,
    top_k: int = 10,
    title: str | Sequence[str],
    value_label: str | Sequence[str],
    verdict: tuple[str, str] | None = None,
    num_states: int | None = None,
    label_colours: Sequence[str] | None = None,
    legend: tuple[str, str] = ("raises the target", "lowers it"),
) -> Chart:
    """Sorted two-tone bars: ``positive + negative`` long, blue then red; the shared core of the bar charts.

    Args:
        labels: one label per unit.
        positive: ``(U,)`` the mean positive part of each unit's attributions.
        negative: ``(U,)`` the mean negative part (a magnitude, >= 0).
        spread: ``(U,)`` the standard deviation of ``|attr|`` over the states, for the whiskers.
        top_k: how many bars.
        title: the title, or wordings of it, the longest first: the first that fits is drawn.
        value_label: the x-axis label, or wordings of it, the longest first.
        verdict: as in :func:`top_features_chart`.
        num_states: with ``spread``, draws the 95% interval of each mean as a whisker.
        label_colours: a swatch per unit beside its label.
        legend: what the blue and the red part mean.

    Returns:
        The :class:`Chart`.

    Raises:
        ValueError: ``labels``, values or colours of different lengths.
    """
    positive, negative = finite(positive), finite(negative)
    _check_units(labels, positive, negative, label_colours)
    totals = positive + negative
    order = rank_order(totals)[:top_k]
    count = len(order)
    half = None
    if spread is not None and num_states:
        half = _Z95 * finite(spread)[order] / math.sqrt(num_states)
    header = LINE + 4 + (2 * LINE + 2 if verdict is not None else 0) + LINE
    row = int(max(16, min(24, (CARD_HEIGHT - header - 2 * LINE - 8) // max(count, 1))))
    top = header + 2
    height = top + row * max(count, 1) + 2 * LINE + 6
    canvas = Canvas(CARD_WIDTH, height)
    explained = _header(canvas, title, verdict, legend, whiskers=half is not None)
    shown = [str(labels[i]) for i in order]
    swatch = 12 if label_colours is not None else 0
    room = int(CARD_WIDTH * LABEL_ROOM) - swatch
    shown = [canvas.fit(label, room, size=TEXT_SIZE) for label in shown]
    left = 8 + swatch + int(max((canvas.text_width(s, size=TEXT_SIZE) for s in shown), default=20.0))
    values = [format_value(float(totals[unit])) for unit in order]
    room_right = 10 + int(max((canvas.text_width(v, size=SMALL_SIZE) for v in values), default=20.0))
    right, bottom = CARD_WIDTH - room_right, top + row * count  # room on the right for the values
    ends = totals[order] + (half if half is not None else 0.0)
    limit = float(ends.max()) if count and ends.max() > 0 else 1.0
    ticks = nice_ticks(limit, most=4)
    _grid_lines(canvas, ticks, limit, left=left, right=right, top=top, bottom=bottom)

    def x_of(value: float) -> float:
        return left + (right - left) * min(max(value, 0.0), limit) / limit

    for index, unit in enumerate(order):
        centre = top + row * index + row / 2
        blue_end, red_end = x_of(float(positive[unit])), x_of(float(totals[unit]))
        two_tone_bar(canvas, left, blue_end, red_end, centre=centre, half=0.34 * row)
        if label_colours is not None:
            label_swatch(canvas, left - swatch - 4, centre, label_colours[unit])
        canvas.text((left - 6 - swatch, centre), shown[index], size=TEXT_SIZE, anchor="rm")
        end = red_end
        if half is not None:
            low, high = x_of(float(totals[unit] - half[index])), x_of(float(totals[unit] + half[index]))
            _whisker(canvas, low, high, centre)
            end = max(end, high)
        canvas.text((end + 4, centre), values[index], size=SMALL_SIZE, anchor="lm")
    _value_axis(canvas, ticks, limit, left=left, right=right, top=top, bottom=bottom)
    wordings = [value_label] if isinstance(value_label, str) else list(value_label)
    if half is not None and not explained:
        wordings = [f"{wordings[0]}; whiskers: 95% interval", *wordings]
    footer = canvas.first_fitting(wordings, CARD_WIDTH - 6, size=SMALL_SIZE)
    canvas.text((3, bottom + 4 + LINE), footer, size=SMALL_SIZE, colour=MUTED)
    return Chart(canvas.pixels, tuple(shown), limit)


def _check_units(
    labels: Sequence[str], positive: np.ndarray, negative: np.ndarray, label_colours: Sequence[str] | None
) -> None:
    if not len(labels) == len(positive) == len(negative):
        raise ValueError(
            f"got {len(labels)} labels, {len(positive)} positive and {len(negative)} negative parts; "
            "give one of each per unit"
        )
    if label_colours is not None and len(label_colours) != len(labels):
        raise ValueError(f"label_colours has {len(label_colours)} colours for {len(labels)} units; give one per unit")


def _grid_lines(
    canvas: Canvas, ticks: np.ndarray, limit: float, *, left: int, right: int, top: int, bottom: int
) -> None:
    """Light vertical lines at the ticks, behind the bars."""
    for tick in ticks[1:]:
        x = left + (right - left) * float(tick) / limit
        canvas.line([(x, top), (x, bottom)], GRID)


def _value_axis(
    canvas: Canvas, ticks: np.ndarray, limit: float, *, left: int, right: int, top: int, bottom: int
) -> None:
    """The axes' lines and the value axis' ticks with their numbers under it."""
    canvas.line([(left, top - 2), (left, bottom), (right, bottom)], INK)
    step = float(ticks[1]) if len(ticks) > 1 else limit
    for tick in ticks:
        x = left + (right - left) * float(tick) / limit
        canvas.line([(x, bottom), (x, bottom + 3)], INK)
        canvas.text((x, bottom + 4), format_tick(float(tick), step), size=SMALL_SIZE, anchor="ma")


def _whisker(canvas: Canvas, low: float, high: float, centre: float) -> None:
    canvas.line([(low, centre), (high, centre)], _WHISKER)
    for tip in (low, high):
        canvas.line([(tip, centre - 3), (tip, centre + 3)], _WHISKER)


def label_swatch(canvas: Canvas, left: float, centre: float, colour: str) -> None:
    """A unit's colour (its channel's, in the frames) as a small square on the frames' dark ground."""
    canvas.rectangle((left, centre - 4, left + 8, centre + 4), GROUND)
    canvas.rectangle((left + 2, centre - 2, left + 6, centre + 2), rgb(colour))


def two_tone_bar(canvas: Canvas, left: float, blue_end: float, red_end: float, *, centre: float, half: float) -> None:
    """A bar from ``left``: blue up to ``blue_end``, red on to ``red_end``, on whole pixels (each part exactly as long
    as its share of the axis, rounded once)."""
    start, middle, end = round(left), round(blue_end), round(red_end)
    top, bottom = round(centre - half), round(centre + half)
    if middle > start:
        canvas.rectangle((start, top, middle - 1, bottom), POSITIVE)
    if end > middle:
        canvas.rectangle((middle, top, end - 1, bottom), NEGATIVE)


def sign_legend(canvas: Canvas, y: float, legend: tuple[str, str], *, whiskers: bool = False) -> bool:
    """One line at ``y``: the blue and the red swatch with what they mean, and the whisker if it fits.

    Returns:
        Whether the whisker's entry ("95% interval") was drawn (it is left out when the line is full).
    """
    x = 3.0
    for colour, meaning in ((POSITIVE, legend[0]), (NEGATIVE, legend[1])):
        canvas.rectangle((x, y + 4, x + 14, y + 11), colour)
        words = canvas.fit(meaning, CARD_WIDTH / 2 - 24, size=SMALL_SIZE)
        canvas.text((x + 18, y + 8), words, size=SMALL_SIZE, anchor="lm")
        x += 18 + canvas.text_width(words, size=SMALL_SIZE) + 12
    if not whiskers or x + 20 + canvas.text_width("95% interval", size=SMALL_SIZE) > CARD_WIDTH - 3:
        return False
    canvas.line([(x, y + 8), (x + 14, y + 8)], _WHISKER)
    for tip in (x, x + 14):
        canvas.line([(tip, y + 5), (tip, y + 11)], _WHISKER)
    canvas.text((x + 20, y + 8), "95% interval", size=SMALL_SIZE, anchor="lm")
    return True


def _header(
    canvas: Canvas,
    title: str | Sequence[str],
    verdict: tuple[str, str] | None,
    legend: tuple[str, str],
    *,
    whiskers: bool,
) -> bool:
    """The title, the verdict (large, coloured) with its numbers, and the bars' legend; whether the whiskers' fit."""
    titles = [title] if isinstance(title, str) else list(title)
    canvas.text(
        (3, 2), canvas.first_fitting(titles, CARD_WIDTH - 6, size=TEXT_SIZE, bold=True), size=TEXT_SIZE, bold=True
    )
    y = LINE + 4
    if verdict is not None:
        y = draw_verdict(canvas, y, verdict)
    return sign_legend(canvas, y, legend, whiskers=whiskers)


def draw_verdict(canvas: Canvas, y: float, verdict: tuple[str, str]) -> float:
    """The verdict's headline (large, in its colour) at ``y`` and its line of numbers under it; the next free ``y``.

    Args:
        canvas: the picture.
        y: the top of the headline.
        verdict: ``(kind, detail)``: a kind of :data:`VERDICT_HEADLINES` (another kind is written as it is) and a
            short line of numbers (cut with an ellipsis where it is wider than the card).
    """
    kind, detail = verdict
    colour = VERDICT_COLOURS.get(kind, INK)
    canvas.text((3, y), VERDICT_HEADLINES.get(kind, kind), size=TITLE_SIZE, bold=True, colour=colour)
    canvas.text((3, y + LINE + 3), canvas.fit(detail, CARD_WIDTH - 6, size=SMALL_SIZE), size=SMALL_SIZE, colour=colour)
    return y + 2 * LINE + 2
