"""The mean ``|attribution|`` per pixel of the held-out states: one tile per channel, each on its own scale, each
pixel averaged over the states where the channel's object is there.

Averaged over all states, a small object is black: the ball is in one pixel of a hundred, so its pixels' mean
``|attr|`` is a hundredth of what it is where the ball is. Averaged where present (:func:`mean_abs_where_present`),
the ball's tile shows where the ball matters; each tile on its own scale (written under it) shows each object's
pattern, however small its share (which the bar chart gives).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_ig.views.pictures.frames import (
    ABSENT,
    BORDER,
    GAP,
    LINE,
    MUTED,
    SaliencyPicture,
    bar_legend,
    cell_size,
    channel_labels,
    colour_table,
    robust_max,
    saliency_kind,
    sequential,
    stack,
    strip,
    swatch,
)
from lightning_ig.views.pictures.raster import CARD_WIDTH, SMALL_SIZE, TEXT_SIZE, Canvas
from lightning_ig.views.text import format_value

__all__ = ["mean_abs_map", "mean_abs_where_present"]


def mean_abs_where_present(states: np.ndarray, attributions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel and channel, the mean ``|attribution|`` over the states where the channel is non-zero there.

    Args:
        states: ``(B, *feature_shape)`` the states.
        attributions: ``(B, *feature_shape)`` their attributions.

    Returns:
        ``(mean_abs, presence)``, both ``feature_shape``: the mean ``|attr|`` over the states where the
        input is non-zero (NaN where it never is), and the fraction of states where it is non-zero.
        The callback can build both from two sums over the states: ``sum |attr| * (x != 0)`` and ``sum (x != 0)``.

    Raises:
        ValueError: the shapes differ.
    """
    states, attributions = np.asarray(states), np.asarray(attributions, dtype=np.float64)
    if states.shape != attributions.shape or states.ndim < 2:
        raise ValueError(
            f"states and attributions must have one shape (B, ...), got {states.shape} and {attributions.shape}"
        )
    present = states != 0
    counts = present.sum(axis=0)
    sums = np.where(present, np.abs(attributions), 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan), counts / len(states)


def mean_abs_map(
    mean_abs: np.ndarray,
    num_states: int | None = None,
    channel_names: Sequence[str] | None = None,
    *,
    presence: np.ndarray | None = None,
    channel_colours: Sequence[str] | None = None,
) -> SaliencyPicture:
    """Mean ``|attribution|`` per pixel as a picture: one tile per channel, each on its own scale.

    Args:
        mean_abs: ``feature_shape`` mean ``|attr|`` per pixel: over all states, or (with ``presence``) over
            the states where the channel is present there (:func:`mean_abs_where_present`; NaN where never).
        num_states: how many states it is the mean over (for the title).
        channel_names: one label per channel tile (default ``channel 0``, ``channel 1``, ...).
        presence: ``feature_shape``: the fraction of states where each pixel's channel is non-zero. Pixels
            where it is 0 are drawn grey (never present).
        channel_colours: one ``"#rrggbb"`` per channel, for the swatch beside each name.

    Returns:
        The picture, the largest channel scale, and each channel's own scale (:attr:`SaliencyPicture.scales`).

    Raises:
        ValueError: names, colours or ``presence`` that do not match the channels.
    """
    values = np.asarray(mean_abs, dtype=np.float64)
    over = "" if num_states is None else f", {num_states} states"
    if saliency_kind(values.shape) == "strip":
        scale = robust_max(values)
        body = stack([strip(sequential(values, scale))], ["all channels"])
        return SaliencyPicture(bar_legend(body, scale, signed=False, what=f"mean |attribution|{over}"), scale)
    channels = values.reshape(-1, *values.shape[-2:])  # (C, H, W)
    count = len(channels)
    labels = channel_labels(channel_names, count)
    colours = colour_table(channel_colours, count)
    present = None
    if presence is not None:
        present = np.asarray(presence, dtype=np.float64)
        if present.size != values.size:
            raise ValueError(f"presence has shape {present.shape}; give one fraction per feature, shape {values.shape}")
        present = present.reshape(channels.shape)
    scales = [robust_max(np.nan_to_num(tile)) for tile in channels]
    return _mean_abs_tiles(channels, present, scales=scales, labels=labels, colours=colours, over=over)


def _mean_abs_tiles(
    channels: np.ndarray,
    present: np.ndarray | None,
    *,
    scales: list[float],
    labels: list[str],
    colours: np.ndarray,
    over: str,
) -> SaliencyPicture:
    count, height, width = channels.shape
    columns = min(count, 4)
    rows = math.ceil(count / columns)
    cell = cell_size((height, width), columns, rows, reserved=2 * LINE + 6 + rows * (LINE + 2))
    pitch_x, pitch_y = width * cell + 2 + GAP, height * cell + 2 + 2 * LINE + 2
    used = columns * pitch_x - GAP
    canvas = Canvas(max(CARD_WIDTH, used), 2 * LINE + 6 + rows * pitch_y)
    where = "where each object is" if present is not None else "per pixel"
    room = canvas.image.width - 4
    title = canvas.first_fitting(
        [f"mean |attribution| {where}{over}", f"mean |attribution| {where}"], room, size=TEXT_SIZE
    )
    canvas.text((2, 2), title, size=TEXT_SIZE)
    subtitle = ["each tile on its own scale, 0 to max", "own scale per tile, 0 to max"]
    if present is not None:
        subtitle = [f"{subtitle[0]}; grey: never there", f"{subtitle[1]}; grey: never there"]
    canvas.text((2, LINE + 3), canvas.first_fitting(subtitle, room, size=SMALL_SIZE), size=SMALL_SIZE, colour=MUTED)
    left0 = max(0, (canvas.image.width - used) // 2)
    for index in range(count):
        left, top = left0 + (index % columns) * pitch_x, 2 * LINE + 6 + (index // columns) * pitch_y
        swatch(canvas, left, top + 8, colours[index])
        canvas.text(
            (left + 14, top + 8), canvas.fit(labels[index], pitch_x - 16, size=TEXT_SIZE), size=TEXT_SIZE, anchor="lm"
        )
        tile = sequential(channels[index], scales[index]).astype(np.uint8)
        if present is not None:
            tile[present[index] <= 0] = ABSENT
        canvas.outline((left, top + LINE, left + width * cell + 1, top + LINE + height * cell + 1), BORDER)
        canvas.paste(tile.repeat(cell, axis=0).repeat(cell, axis=1), left + 1, top + LINE + 1)
        below = top + LINE + height * cell + 3
        canvas.text((left, below), f"max {format_value(scales[index])}", size=SMALL_SIZE)
    return SaliencyPicture(canvas.pixels, max(scales), tuple(scales))
