"""The verdict chart: the first card under ``ig/`` (``ig/0_verdict``), the answer before the detail.

TensorBoard's Time Series sorts every card of a run by tag, naturally (digits before letters), and a 1280 px window
shows the first row, two cards, without scrolling. The tag ``<prefix>/0_verdict`` sorts before every other tag of
the callback, so the first card a user sees says, in one picture at the size TensorBoard shows it
(:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH` wide): whether the attributions can be trusted (the completeness
verdict, large, in its colour, with its numbers), and what the target relies on: the top features or groups with
their share of the mean ``|attribution|``, each bar split by sign (blue raises the target, red lowers it), in the
channels' colours where the groups are channels, and how stable that ranking is (drift). The bar chart
(``top_features``) and the rest keep their tags; this card adds the summary in front of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_ig.run.host_result import Moments
from lightning_ig.run.statistics import rank_order
from lightning_ig.views.pictures.bars import (
    INK,
    LINE,
    MUTED,
    Chart,
    draw_verdict,
    finite,
    label_swatch,
    sign_legend,
    sign_parts,
    two_tone_bar,
)
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, SMALL_SIZE, TEXT_SIZE, Canvas
from lightning_ig.views.text import format_percent

__all__ = ["verdict_chart"]

_MOST_ROWS = 5  # the card holds the verdict, five units and two lines of legend within TensorBoard's 215 px
_ROW = 18


def verdict_chart(
    labels: Sequence[str],
    moments: Moments,
    *,
    verdict: tuple[str, str],
    title: str | Sequence[str],
    target_label: str = "the target",
    noun: str = "features",
    top_k: int = _MOST_ROWS,
    label_colours: Sequence[str] | None = None,
    footer: str | Sequence[str] | None = None,
    footer_colour: str = MUTED,
    footer_detail: str | Sequence[str] | None = None,
) -> Chart:
    """The verdict and the top units by share of the mean ``|attribution|``, in one card.

    Args:
        labels: one label per unit (feature or group).
        moments: the units' :class:`~lightning_ig.run.host_result.Moments` over the states.
        verdict: ``(kind, detail)`` as :func:`~lightning_ig.views.pictures.bars.draw_verdict` takes it.
        title: the card's title, or wordings of it, the longest first (the first that fits is drawn).
        target_label: what is attributed (``"V(s)"``), for the line above the bars and the legend.
        noun: ``"features"`` or ``"groups"``.
        top_k: how many units get a bar (at most 5: the card's height); the rest are summed in one line.
        label_colours: one ``"#rrggbb"`` per unit, drawn beside its label (the channels' colours).
        footer: a line under the legend (the trust checks' status, or drift), or wordings of it, the longest first;
            ``None``: none.
        footer_colour: the footer's colour (the trust status's: green, red or brown; default grey).
        footer_detail: a second line under the footer (why the status is what it is), or wordings of it, the
            longest first, the last cut to the card's width; drawn where the card stays within
            :data:`~lightning_ig.views.pictures.raster.CARD_HEIGHT`, else left out.

    Returns:
        The :class:`~lightning_ig.views.pictures.bars.Chart`; its ``axis_limit`` is the largest share drawn.

    Raises:
        ValueError: labels, moments or colours of different lengths.
    """
    positive, negative = sign_parts(moments)
    totals = positive + negative
    if len(labels) != len(totals) or (label_colours is not None and len(label_colours) != len(labels)):
        raise ValueError(
            f"got {len(labels)} labels for {len(totals)} units"
            + ("" if label_colours is None else f" and {len(label_colours)} colours")
            + "; give one per unit"
        )
    whole = float(totals.sum())
    share = totals / whole if whole > 0 else np.zeros_like(totals)
    order = rank_order(totals)[: max(1, min(int(top_k), _MOST_ROWS))]
    rest = len(totals) - len(order)
    rows_top = 4 * LINE + 10  # the title, the verdict's two lines and the line above the bars
    height = rows_top + _ROW * len(order) + (LINE if rest else 0) + LINE + 4 + (LINE + 2 if footer else 0) + 2
    detail = bool(footer and footer_detail) and height + LINE <= CARD_HEIGHT  # never past Time Series' box
    height += LINE if detail else 0
    canvas = Canvas(CARD_WIDTH, height)
    titles = [title] if isinstance(title, str) else list(title)
    canvas.text(
        (3, 2), canvas.first_fitting(titles, CARD_WIDTH - 6, size=TEXT_SIZE, bold=True), size=TEXT_SIZE, bold=True
    )
    y = draw_verdict(canvas, LINE + 4, verdict)
    relies = [
        f"What {target_label} relies on: share of mean |attribution|",
        f"What {target_label} relies on: share of mean |attr|",
        f"What {target_label} relies on",
    ]
    canvas.text((3, y + 2), canvas.first_fitting(relies, CARD_WIDTH - 6, size=TEXT_SIZE), size=TEXT_SIZE, colour=INK)
    _bars(canvas, labels, share, positive, negative, order, label_colours, top=rows_top)
    y = rows_top + _ROW * len(order)
    if rest:
        others = float(1.0 - share[order].sum()) if whole > 0 else 0.0
        canvas.text((3, y + 1), f"the other {rest} {noun}: {format_percent(max(others, 0.0))}", size=SMALL_SIZE)
        y += LINE
    sign_legend(canvas, y, (f"raises {target_label}", "lowers it"))
    if footer:
        wordings = [footer] if isinstance(footer, str) else list(footer)
        line = canvas.first_fitting(wordings, CARD_WIDTH - 6, size=SMALL_SIZE)
        canvas.text((3, y + LINE + 3), line, size=SMALL_SIZE, colour=footer_colour)
    if detail and footer_detail:
        wordings = [footer_detail] if isinstance(footer_detail, str) else list(footer_detail)
        line = canvas.first_fitting(wordings, CARD_WIDTH - 6, size=SMALL_SIZE)
        canvas.text((3, y + 2 * LINE + 3), line, size=SMALL_SIZE, colour=MUTED)
    shown = tuple(str(labels[i]) for i in order)
    return Chart(canvas.pixels, shown, float(share[order].max()) if whole > 0 else 0.0)


def _bars(
    canvas: Canvas,
    labels: Sequence[str],
    share: np.ndarray,
    positive: np.ndarray,
    negative: np.ndarray,
    order: np.ndarray,
    label_colours: Sequence[str] | None,
    *,
    top: int,
) -> None:
    """One row per unit: its swatch and label, a two-tone bar as long as its share (the largest fills the row)."""
    swatch = 12 if label_colours is not None else 0
    # names up to half the card whole (a cut "pole angular ve..." leaves the reader guessing); the bars get the rest
    shown = [canvas.fit(str(labels[i]), int(CARD_WIDTH * 0.5) - swatch, size=TEXT_SIZE) for i in order]
    left = 10 + swatch + int(max(canvas.text_width(text, size=TEXT_SIZE) for text in shown))
    percents = [format_percent(float(share[i]), 2) for i in order]
    right = CARD_WIDTH - 8 - int(max(canvas.text_width(text, size=SMALL_SIZE) for text in percents))
    largest = float(share[order].max())
    totals = finite(positive + negative)
    for index, unit in enumerate(order):
        centre = top + _ROW * index + _ROW / 2
        if label_colours is not None:
            label_swatch(canvas, left - swatch - 4, centre, label_colours[unit])
        canvas.text((left - 8 - swatch, centre), shown[index], size=TEXT_SIZE, anchor="rm")  # 4 px clear of it
        length = (right - 4 - left) * (float(share[unit]) / largest if largest > 0 else 0.0)
        blue = length * (float(positive[unit]) / float(totals[unit]) if totals[unit] > 0 else 0.0)
        two_tone_bar(canvas, left, left + blue, left + length, centre=centre, half=0.33 * _ROW)
        canvas.text((left + length + 4, centre), percents[index], size=SMALL_SIZE, anchor="lm")
