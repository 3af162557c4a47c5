"""The charts of a run over training: importance as a heatmap, and each group's share of the attribution, stacked.

Both read the history of IG runs (mean ``|attr|`` per unit per run) as shares of each run's total, so runs of
different value scales compare; drawn at the card's size like the bar charts of
:mod:`~lightning_ig.views.pictures.bars`, whose names this module also exports (the bar chart's old home).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_ig.run.statistics import rank_order
from lightning_ig.views.pictures.bars import (
    GROUND,
    INK,
    LABEL_ROOM,
    LINE,
    MUTED,
    NEGATIVE,
    POSITIVE,
    Chart,
    bar_chart,
    finite,
    sign_parts,
    top_features_chart,
)
from lightning_ig.views.pictures.raster import (
    CARD_HEIGHT,
    CARD_WIDTH,
    SEQUENTIAL_LUT,
    SMALL_SIZE,
    TEXT_SIZE,
    Canvas,
    categorical_colours,
    rgb,
    to_colour_index,
)
from lightning_ig.views.text import format_percent, format_value

__all__ = [
    "NEGATIVE",
    "POSITIVE",
    "Chart",
    "bar_chart",
    "format_step",
    "heatmap_chart",
    "shares_chart",
    "sign_parts",
    "top_features_chart",
]

_HEATMAP_MAX_ROWS = 40
_SHARES_MAX_BANDS = 7  # the largest groups by the last run; the rest are summed into "other"


def heatmap_chart(
    labels: Sequence[str],
    steps: Sequence[int],
    mean_abs_history: np.ndarray,
    *,
    title: str | Sequence[str] = "Importance over training",
) -> Chart:
    """Heatmap of importance (rows: units, the 40 largest of the last run) over IG runs (columns).

    Each column is one run's mean ``|attr|`` per unit divided by the run's total (its share), so runs of
    different value scales compare. The colour scale runs from 0 to a round share at or above the largest
    (25%, 50%, 100%, ...), so it changes only when a share crosses one of those steps.

    Args:
        labels: one label per unit.
        steps: the global step of each run (column labels).
        mean_abs_history: ``(num_runs, U)`` mean ``|attr|`` per run and unit.
        title: the title, or wordings of it, the longest first (the first that fits is drawn).

    Returns:
        The :class:`Chart` (:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH` pixels wide, whatever the number
        of runs).
    """
    shares = _shares(mean_abs_history)  # (R, U)
    runs, units = shares.shape
    order = rank_order(shares[-1])[:_HEATMAP_MAX_ROWS]
    rows = len(order)
    cells_of = shares[:, order].T  # (rows, R)
    row = int(max(12, min(22, (CARD_HEIGHT - 4 * LINE) // max(rows, 1))))
    size = SMALL_SIZE if row < 18 else TEXT_SIZE
    top = LINE + 6 + (LINE if rows < units else 0)
    canvas = Canvas(CARD_WIDTH, top + row * rows + 2 * LINE + 8)
    shown = [canvas.fit(str(labels[i]), int(CARD_WIDTH * LABEL_ROOM), size=size) for i in order]
    left = 8 + int(max((canvas.text_width(s, size=size) for s in shown), default=20.0))
    right, bottom = CARD_WIDTH - 48, top + row * rows
    scale = _round_share(float(cells_of.max()) if cells_of.size else 0.0)
    cells = SEQUENTIAL_LUT[to_colour_index(cells_of / scale)].astype(np.uint8)  # (rows, R, 3)
    columns = np.minimum((np.arange(right - left) * runs) // (right - left), runs - 1)  # pixel -> run
    canvas.paste(cells[:, columns].repeat(row, axis=0), left, top)
    for index, label in enumerate(shown):
        canvas.text((left - 6, top + row * index + row / 2), label, size=size, anchor="rm")
    _step_axis(canvas, left, right, bottom, steps)
    _title(canvas, title)
    if rows < units:
        canvas.text((3, LINE + 4), f"top {rows} of {units} by the last run", size=SMALL_SIZE, colour=MUTED)
    _colour_bar(canvas, right + 8, top, bottom, scale)
    return Chart(canvas.pixels, tuple(shown), scale)


def _title(canvas: Canvas, title: str | Sequence[str]) -> None:
    titles = [title] if isinstance(title, str) else list(title)
    canvas.text(
        (3, 2), canvas.first_fitting(titles, CARD_WIDTH - 6, size=TEXT_SIZE, bold=True), size=TEXT_SIZE, bold=True
    )


def _shares(history: np.ndarray) -> np.ndarray:
    """``(R, U)`` mean ``|attr|`` -> each run's shares (rows sum to 1; a run of zeros stays zeros)."""
    values = np.abs(finite(np.asarray(history, dtype=np.float64)))
    if values.ndim != 2 or values.shape[0] == 0:
        raise ValueError(f"mean_abs_history must be (num_runs, units) with at least one run, got shape {values.shape}")
    totals = values.sum(axis=1, keepdims=True)
    return values / np.where(totals > 0, totals, 1.0)


def _round_share(largest: float) -> float:
    """The colour scale's end: the first of 10%, 20%, 25%, 50%, 75%, 100% at or above ``largest`` (0.05 below)."""
    for end in (0.05, 0.1, 0.2, 0.25, 0.5, 0.75):
        if largest <= end:
            return end
    return 1.0


def format_step(step: int) -> str:
    """A global step as a tick label: ``250``, ``3,437``, ``24k``, ``1.2M`` (at most five characters past 9,999)."""
    step = int(step)
    if abs(step) < 10_000:
        return f"{step:,}"
    if abs(step) < 1_000_000:
        return f"{format_value(step / 1000, 3)}k"
    return f"{format_value(step / 1_000_000, 3)}M"


def _step_axis(canvas: Canvas, left: int, right: int, bottom: int, steps: Sequence[int]) -> None:
    """Tick labels under the runs (the first, the last, and between them those that do not overlap)."""
    runs = len(steps)
    candidates = np.unique(np.linspace(0, runs - 1, num=max(1, min(runs, 5))).round().astype(int))
    first, last = int(candidates[0]), int(candidates[-1])
    placed: list[tuple[float, float]] = []
    for tick in [first, last, *candidates[1:-1]]:  # the ends first: they always show
        x = left + (right - left) * (tick + 0.5) / runs
        text = format_step(steps[tick])
        width = canvas.text_width(text, size=SMALL_SIZE)
        start = min(max(x - width / 2, left - 4), right + 4 - width)  # the ends stay inside the plot's span
        if any(start < end + 6 and start + width + 6 > begin for begin, end in placed):
            continue
        placed.append((start, start + width))
        canvas.line([(x, bottom), (x, bottom + 3)], INK)
        canvas.text((start, bottom + 4), text, size=SMALL_SIZE, anchor="la")
    canvas.text(
        ((left + right) / 2, bottom + 4 + LINE),
        "global step of the IG run",
        size=SMALL_SIZE,
        anchor="ma",
        colour=MUTED,
    )


def _colour_bar(canvas: Canvas, left: int, top: int, bottom: int, scale: float) -> None:
    """A vertical viridis bar for shares ``[0, scale]``, its ends written as percentages."""
    ramp = np.linspace(1.0, 0.0, max(bottom - top, 2))  # top: the largest share
    canvas.paste(SEQUENTIAL_LUT[to_colour_index(ramp)].astype(np.uint8)[:, None, :].repeat(10, axis=1), left, top)
    canvas.text((left + 13, top), format_percent(scale), size=SMALL_SIZE, anchor="la")
    canvas.text((left + 13, bottom), "0%", size=SMALL_SIZE, anchor="ld")


def shares_chart(
    labels: Sequence[str],
    steps: Sequence[int],
    mean_abs_history: np.ndarray,
    *,
    title: str | Sequence[str] = "Share of |attribution| over training",
    colours: Sequence[str] | None = None,
) -> Chart:
    """Each unit's share of the run's total mean ``|attr|``, stacked, one column per IG run.

    The heatmap's numbers as parts of a whole: how much of what the model relies on is the ball, the paddle,
    the bricks, at each run (as ATOMs tracks objects' shares by hand). The seven largest units of the last
    run get a band each, the rest one grey "other" band; each band is labelled at the right with its last
    share. Runs are drawn as bars while there are few of them (gaps between), as an area when many.

    Args:
        labels: one label per unit.
        steps: the global step of each run.
        mean_abs_history: ``(num_runs, U)`` mean ``|attr|`` per run and unit.
        title: the title, or wordings of it, the longest first (the first that fits is drawn).
        colours: one ``"#rrggbb"`` per unit (default
            :func:`~lightning_ig.views.pictures.raster.categorical_colours`: the saliency pictures' channel colours,
            on the same dark ground).

    Returns:
        The :class:`Chart` (:attr:`Chart.labels`: the bands from the bottom up).

    Raises:
        ValueError: labels, colours and history that do not match.
    """
    shares = _shares(mean_abs_history)
    runs, units = shares.shape
    if len(labels) != units or (colours is not None and len(colours) != units) or len(steps) != runs:
        raise ValueError(
            f"shares_chart needs one label (got {len(labels)}) and colour per unit ({units}) and one "
            f"step per run ({runs}, got {len(steps)})"
        )
    palette = list(colours) if colours is not None else categorical_colours(units)
    order = rank_order(shares[-1])
    keep, rest = order[:_SHARES_MAX_BANDS], order[_SHARES_MAX_BANDS:]
    bands = shares[:, keep]  # (R, K), the largest first: drawn at the bottom
    names, band_colours = [str(labels[i]) for i in keep], [palette[i] for i in keep]
    if rest.size:
        bands = np.concatenate([bands, shares[:, rest].sum(axis=1, keepdims=True)], axis=1)
        names, band_colours = [*names, f"other {rest.size}"], [*band_colours, "#5a5a5a"]
    probe = Canvas(1, 1)
    label_width = min(
        int(CARD_WIDTH * 0.46), 24 + int(max(probe.text_width(f"100% {name}", size=SMALL_SIZE) for name in names))
    )
    top, left = LINE + 8, 40
    right, bottom = CARD_WIDTH - label_width, min(CARD_HEIGHT, 200) - 2 * LINE - 4
    canvas = Canvas(CARD_WIDTH, bottom + 2 * LINE + 6)
    _title(canvas, title)
    canvas.paste(_stacked(bands, band_colours, right - left, bottom - top), left, top)
    canvas.outline((left - 1, top - 1, right, bottom), INK)
    for value in (0.0, 0.5, 1.0):
        y = bottom - (bottom - top) * value
        canvas.line([(left - 3, y), (left - 1, y)], INK)
        canvas.text((left - 5, y), format_percent(value), size=SMALL_SIZE, anchor="rm")
    _band_labels(canvas, bands[-1], names, band_colours, left=right + 4, top=top, bottom=bottom)
    _step_axis(canvas, left, right, bottom, steps)
    return Chart(canvas.pixels, tuple(names), 1.0)


def _stacked(bands: np.ndarray, colours: Sequence[str], width: int, height: int) -> np.ndarray:
    """``(R, K)`` shares -> ``(height, width, 3)`` pixels: per run a column stacked bottom-up, on the dark ground."""
    runs, count = bands.shape
    table = np.array([rgb(GROUND), *(rgb(colour) for colour in colours), (255, 255, 255)], dtype=np.uint8)
    edges = np.cumsum(bands, axis=1)  # (R, K) the top of each band
    level = (np.arange(height)[::-1] + 0.5) / height  # (height,) the share at each pixel row, bottom = 0
    band = (level[:, None, None] >= edges[None, :, :]).sum(axis=2) + 1  # (height, R) 1..K, K+1 above all bands
    band = np.where(band > count, 0, band)  # above the stack (a run of zeros): the ground
    column_run = np.minimum((np.arange(width) * runs) // width, runs - 1)  # pixel column -> run
    index = band[:, column_run]  # (height, width)
    if runs <= width // 6:  # few runs: bars, a white gap between them
        starts = np.searchsorted(column_run, np.arange(1, runs))
        index[:, starts] = count + 1
    return table[index]


def _band_labels(
    canvas: Canvas, last: np.ndarray, names: list[str], colours: Sequence[str], *, left: int, top: int, bottom: int
) -> None:
    """Each band's name and last share beside the chart, at the band's height, pushed apart so none overlap; a
    name too long for the room goes on two lines (``58% pole angular`` over ``velocity``), never cut mid-word."""
    height, step = bottom - top, LINE - 1
    room = CARD_WIDTH - left - 16
    texts = [
        _wrapped(canvas, f"{format_percent(float(share), 2)} {name}", room)
        for name, share in zip(names, last, strict=True)
    ]
    half = [(len(lines) - 1) * step / 2 + LINE / 2 for lines in texts]  # from a label's centre to its edge
    centres = bottom - height * (np.cumsum(last) - last / 2)  # (K,) pixel rows, bottom band first
    wanted = list(centres)
    for index in range(1, len(wanted)):  # upwards: each label clear of the one below it
        apart = (len(texts[index]) + len(texts[index - 1])) * step / 2
        wanted[index] = min(wanted[index], wanted[index - 1] - apart)
    shift = max(0.0, top + half[-1] - wanted[-1]) if wanted else 0.0
    for index, (lines, colour) in enumerate(zip(texts, colours, strict=True)):
        y = min(wanted[index] + shift, bottom - half[index]) - (len(lines) - 1) * step / 2  # the first line's
        canvas.rectangle((left, y - 5, left + 10, y + 5), GROUND)
        canvas.rectangle((left + 2, y - 3, left + 8, y + 3), rgb(colour))
        for line, text in enumerate(lines):
            canvas.text((left + 14, y + line * step), text, size=SMALL_SIZE, anchor="lm")


def _wrapped(canvas: Canvas, text: str, room: float) -> list[str]:
    """``text`` on one line if it fits ``room`` pixels, else on two, broken at the last space that lets the first
    line fit (the second cut with an ellipsis if it must be); one cut line where even the first word is too wide."""
    if canvas.text_width(text, size=SMALL_SIZE) <= room:
        return [text]
    words = text.split(" ")
    for count in range(len(words) - 1, 0, -1):
        first = " ".join(words[:count])
        if canvas.text_width(first, size=SMALL_SIZE) <= room:
            return [first, canvas.fit(" ".join(words[count:]), room, size=SMALL_SIZE)]
    return [canvas.fit(text, room, size=SMALL_SIZE)]
