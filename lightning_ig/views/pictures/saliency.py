"""Saliency pictures of held-out observations that show the game, built with numpy and Pillow.

For states with spatial dimensions, ``(C, H, W)`` (more leading dimensions are read as channels):

* :func:`saliency_grid`: up to 8 observations in a grid, each frame drawn as its objects, one colour per
  channel on a dark ground (as MinAtar's own display does), with its signed attribution (summed over
  channels) as a square in each cell: blue where the attribution raises the target above its value at
  the baseline, red where it lowers it, larger and darker where it is larger. One scale for the whole
  grid, a legend of the channels and of the colours, a border per tile, and under each tile the
  target's value ``F(x)`` and its change from the baseline ``F(x) - F(b)``. Frames too large for a tile
  of the card (Atari's 84 x 84) are pooled by whole blocks: the objects by their maximum, the
  attributions by their sum, so the markers still add up to ``F(x) - F(b)``. Cells too small for a
  square inside (under 4 px) get the sign's colour blended over the frame instead;
* :func:`mean_abs_map` and :func:`mean_abs_where_present` (from :mod:`~lightning_ig.views.pictures.saliency_map`, kept
  importable from here): the mean ``|attribution|`` per pixel, one tile per channel, each on its own scale, averaged
  where each object is.

For ``(C, L)`` states (1-d signals with channels) both are heat strips: channels down, positions across.

Each picture is a ``(H, W, 3)`` uint8 array for ``SummaryWriter.add_image(..., dataformats="HWC")`` or
:func:`write_png`, sized for TensorBoard's card (:data:`~lightning_ig.views.pictures.raster.CARD_WIDTH` wide; see
:mod:`~lightning_ig.views.pictures.raster`): small frames are enlarged by whole pixels, to the largest cell that keeps
the grid within the card.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lightning_ig.views.pictures.frames import (
    BORDER,
    GAP,
    INK,
    LINE,
    MUTED,
    SaliencyPicture,
    as_images,
    bar_legend,
    cell_size,
    channel_labels,
    check_saliency_channel,
    colour_table,
    first_distinct,
    frame_colours,
    nice_scale,
    pool,
    pool_factor,
    robust_max,
    saliency_kind,
    stack,
    strip,
    swatch,
    write_png,
)
from lightning_ig.views.pictures.raster import CARD_WIDTH, DIVERGING_LUT, NEGATIVE, POSITIVE, SMALL_SIZE, Canvas, font
from lightning_ig.views.pictures.saliency_map import mean_abs_map, mean_abs_where_present
from lightning_ig.views.text import format_value

__all__ = [
    "SaliencyPicture",
    "check_saliency_channel",
    "first_distinct",
    "frame_colours",
    "mean_abs_map",
    "mean_abs_where_present",
    "nice_scale",
    "saliency_grid",
    "saliency_kind",
    "write_png",
]

_SCALE_CHANGE = 0.25  # a scale this much larger or smaller than the previous picture's is pointed out
_PALEST = 0.6  # the palest marker colour, as a fraction of the way from white to the sign's darkest colour
_SMALLEST_MARKER_CELL = 4  # pixels per cell below which a marker would hide the object: blend instead
_MAX_OPACITY = 0.85
_LEGEND_HEIGHT = 4 * LINE + 4
_CAPTION_SEPARATION = 8  # blank pixels between neighbouring captions: twice the space between the two numbers


def _markers(maps: np.ndarray, scale: float, cell: int, rim: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel attribution markers: ``(mask, colour)`` at ``cell`` x enlargement.

    A centred square per cell whose area grows with ``|attribution| / scale`` (full: the cell less a rim of
    ``rim`` pixels, so the object's colour always shows around it), in the sign's colour, darker where larger
    (never paler than a third of the way, so that a small marker does not read as a white dot).
    """
    unit = np.clip(np.nan_to_num(maps / scale), -1.0, 1.0)  # (S, H, W)
    largest = max(cell - 2 * rim, 1)
    side = np.round(largest * np.sqrt(np.abs(unit))).astype(np.intp)  # 0..largest: negligible values draw nothing
    offsets = np.arange(cell)
    squares = np.zeros((largest + 1, cell, cell), dtype=bool)
    for k in range(1, largest + 1):
        start = (cell - k + 1) // 2
        inside = (offsets >= start) & (offsets < start + k)
        squares[k] = inside[:, None] & inside[None, :]
    count, height, width = maps.shape
    mask = squares[side].transpose(0, 1, 3, 2, 4).reshape(count, height * cell, width * cell)
    levels = np.round(127.5 + 127.5 * np.sign(unit) * (_PALEST + (1 - _PALEST) * np.abs(unit))).astype(np.intp)
    colour = DIVERGING_LUT[levels].repeat(cell, axis=1).repeat(cell, axis=2)  # (S, H*cell, W*cell, 3)
    return mask, colour


def _blended(frames: np.ndarray, maps: np.ndarray, scale: float, cell: int) -> np.ndarray:
    """``frames (S, H*cell, W*cell, 3)`` with the signed colour of ``maps (S, H, W)`` over them, opacity ``~ |a|``."""
    unit = np.clip(np.nan_to_num(maps / scale), -1.0, 1.0).repeat(cell, axis=1).repeat(cell, axis=2)
    colour = DIVERGING_LUT[np.round((unit + 1.0) * 127.5).astype(np.intp)]
    opacity = (_MAX_OPACITY * np.abs(unit))[..., None]
    return np.clip(frames * (1.0 - opacity) + colour * opacity, 0, 255).astype(np.uint8)


def saliency_grid(
    states: np.ndarray,
    attributions: np.ndarray,
    *,
    channel: int | None = None,
    columns: int | None = None,
    channel_names: Sequence[str] | None = None,
    channel_colours: Sequence[str] | None = None,
    target_label: str = "V(s)",
    baseline_label: str = "the all-zero frame",
    f_input: np.ndarray | None = None,
    f_delta: np.ndarray | None = None,
    previous_scale: float | None = None,
) -> SaliencyPicture:
    """The observations with their signed attributions, in a grid (a strip per state for 1-d signals).

    Args:
        states: ``(S, *feature_shape)`` the observations.
        attributions: ``(S, *feature_shape)`` their attributions.
        channel: draw this channel only (``None``, default: every channel in its colour).
        columns: tiles per row (default: as many as fit the card, at most 4).
        channel_names: one name per channel, for the legend (default ``channel 0``, ...).
        channel_colours: one ``"#rrggbb"`` per channel (default
            :func:`~lightning_ig.views.pictures.raster.categorical_colours`).
        target_label: what is attributed, as the legend names it (default ``"V(s)"``).
        baseline_label: what the attribution is relative to (default ``"the all-zero frame"``).
        f_input: ``(S,)`` the target's value at each state, written under its tile.
        f_delta: ``(S,)`` ``F(x) - F(b)``, the change from the baseline, written beside it.
        previous_scale: the scale of the previous grid; a change of more than 25% is written in the legend.

    Returns:
        The picture and its scale (the attribution at which the marker is full).

    Raises:
        ValueError: shapes that differ or have no spatial dimension, a channel out of range, names, colours
            or per-state values that do not match the states.
    """
    states = np.asarray(states, dtype=np.float32)
    attributions = np.asarray(attributions, dtype=np.float32)
    kind = saliency_kind(tuple(states.shape[1:]))
    if states.shape != attributions.shape or kind is None:
        raise ValueError(
            f"saliency needs states and attributions of one shape (S, C, H, W) or (S, C, L), got "
            f"{tuple(states.shape)} and {tuple(attributions.shape)}"
        )
    values = _per_state(f_input, "f_input", len(states)), _per_state(f_delta, "f_delta", len(states))
    if kind == "strip":
        return _strip_grid(attributions, target_label, baseline_label)
    check_saliency_channel(channel, tuple(states.shape[1:]))
    images, maps = as_images(states), as_images(attributions).sum(axis=1)  # (S, C, H, W), (S, H, W)
    labels = channel_labels(channel_names, images.shape[1])
    colours = colour_table(channel_colours, images.shape[1])
    if channel is not None:
        images, colours, labels = images[:, channel : channel + 1], colours[channel : channel + 1], [labels[channel]]
    count = len(images)
    columns = max(1, min(columns or 4, count))
    rows = math.ceil(count / columns)
    captions = _caption_lines(*values, room=CARD_WIDTH // columns - _CAPTION_SEPARATION)
    reserved = _LEGEND_HEIGHT + (rows * LINE if captions is not None and len(captions[0]) > 1 else 0)
    block = pool_factor(images.shape[2:], columns, rows, reserved=reserved)
    images, maps = pool(images, block, "max"), pool(maps, block, "sum")  # objects kept; attributions add up
    cell = cell_size(images.shape[2:], columns, rows, reserved=reserved)
    scale = nice_scale(robust_max(maps))
    frames = frame_colours(images, colours).repeat(cell, axis=1).repeat(cell, axis=2)  # (S, H*cell, W*cell, 3)
    if cell >= _SMALLEST_MARKER_CELL:
        mask, marker = _markers(maps, scale, cell, rim=1 if cell < 7 else 2)
        tiles = np.where(mask[..., None], marker, frames).astype(np.uint8)  # (S, H*cell, W*cell, 3)
    else:  # cells too small for a square inside: the sign's colour blended over the frame, as opaque as it is large
        tiles = _blended(frames, maps, scale, cell)
    canvas, legend_top = _tile_grid(tiles, captions, columns)
    pixels = _grid_legend(
        canvas,
        legend_top,
        labels=labels,
        colours=colours,
        scale=scale,
        previous=previous_scale,
        target=target_label,
        baseline=baseline_label,
        captioned=captions is not None,
        block=block,
    )
    return SaliencyPicture(pixels, scale)


def _per_state(values: np.ndarray | None, name: str, count: int) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.shape[0] != count:
        raise ValueError(f"{name} has {array.shape[0]} values for {count} states; give one per state drawn")
    return array


def _caption_lines(f_input: np.ndarray | None, f_delta: np.ndarray | None, room: int) -> list[tuple[str, ...]] | None:
    """Each tile's caption, ``F(x)`` and ``F(x) - F(b)``, as its lines: the first wording in which every caption is at
    most ``room`` pixels wide.

    Each column of numbers has the decimals that give its largest two significant digits (``0.32 +0.21``); where
    that is too wide, the zero before the decimal point is dropped (``.011 +.060``, as tables of values under 1
    write it); then the two numbers go on two lines (the grid makes room for the second), each cut to ``room`` if
    it must be (only where more than four tiles share a row).
    """
    columns = [values for values in (f_input, f_delta) if values is not None]
    if not columns:
        return None
    texts = [_fixed(values, signed=values is f_delta) for values in columns]
    for wording in (texts, [[_without_leading_zero(text) for text in column] for column in texts]):
        lines = [(" ".join(words),) for words in zip(*wording, strict=True)]
        if all(_ink_width(line[0]) <= room for line in lines):
            return lines
    return [tuple(_cut(text, room) for text in words) for words in zip(*texts, strict=True)]


def _fixed(values: np.ndarray, *, signed: bool) -> list[str]:
    """Numbers with the decimals that give the largest of them two significant digits (at least none, at most 4)."""
    finite = np.abs(values[np.isfinite(values)])
    largest = float(finite.max()) if finite.size else 0.0
    decimals = 2 if largest == 0 else int(min(4, max(0, 1 - math.floor(math.log10(largest)))))
    sign = "+" if signed else ""
    return [f"{value:{sign}.{decimals}f}" if math.isfinite(value) else str(value) for value in values]


def _without_leading_zero(text: str) -> str:
    """``0.011`` -> ``.011``, ``-0.5`` -> ``-.5``, ``+0.06`` -> ``+.06``; other numbers as they are."""
    sign, rest = (text[0], text[1:]) if text[:1] in "+-" else ("", text)
    return sign + rest[1:] if rest.startswith("0.") else text


def _ink_width(text: str) -> int:
    """How many pixels across ``text`` inks at the captions' size."""
    left, _, right, _ = font(SMALL_SIZE).getbbox(text, anchor="ma")
    return int(right - left)


def _cut(text: str, room: int) -> str:
    """``text``, or as much of it as fits ``room`` pixels with an ellipsis."""
    if _ink_width(text) <= room:
        return text
    while len(text) > 1 and _ink_width(text + "…") > room:
        text = text[:-1]
    return text + "…" if _ink_width(text + "…") <= room else ""


def _tile_grid(tiles: np.ndarray, captions: list[tuple[str, ...]] | None, columns: int) -> tuple[Canvas, int]:
    """The tiles with a border each and their captions on a white card as wide as the card; and where the legend
    goes (room is left below for it: three lines, four with the captions' line).

    Each tile is centred in a slot of ``CARD_WIDTH // columns`` pixels (wider only for tiles wider than that), and
    its caption is centred in the same slot: a caption of at most the slot less :data:`_CAPTION_SEPARATION` pixels
    stays inside it, clear of its neighbours' and of the card's edge.
    """
    count, height, width = tiles.shape[:3]
    rows = math.ceil(count / columns)
    pitch_x = max(width + 2 + GAP, CARD_WIDTH // columns)
    lines = len(captions[0]) if captions else 0
    pitch_y = height + 2 + (lines * LINE if lines else 4)
    canvas_width = max(CARD_WIDTH, columns * pitch_x)
    margin = (canvas_width - columns * pitch_x) // 2
    legend = _LEGEND_HEIGHT if captions is not None else _LEGEND_HEIGHT - LINE
    canvas = Canvas(canvas_width, rows * pitch_y + legend + 2)
    for index in range(count):
        slot, top = margin + (index % columns) * pitch_x, (index // columns) * pitch_y
        left = slot + (pitch_x - width - 2) // 2
        canvas.outline((left, top, left + width + 1, top + height + 1), BORDER)
        canvas.paste(tiles[index], left + 1, top + 1)
        for line, text in enumerate(captions[index] if captions is not None else ()):
            canvas.text((slot + pitch_x / 2, top + height + 3 + line * LINE), text, size=SMALL_SIZE, anchor="ma")
    return canvas, rows * pitch_y + 2


def _grid_legend(
    canvas: Canvas,
    top: int,
    *,
    labels: list[str],
    colours: np.ndarray,
    scale: float,
    previous: float | None,
    target: str,
    baseline: str,
    captioned: bool,
    block: int = 1,
) -> np.ndarray:
    """The lines under the grid from ``top``: the channels, the colour scale, what blue and red mean, the captions."""
    x, middle = 3, top + LINE // 2
    for label, colour in zip(labels, colours, strict=True):  # a swatch per channel, drawn as a cell of the frame
        swatch(canvas, x, middle, colour)
        canvas.text((x + 14, middle), label, size=SMALL_SIZE, anchor="lm")
        x += 14 + canvas.text_width(label, size=SMALL_SIZE) + 9
    middle += LINE
    low, high = f"-{format_value(scale)}", f"+{format_value(scale)}"
    bar_left = int(5 + canvas.text_width(low, size=SMALL_SIZE))
    bar_right = bar_left + 110
    ramp = np.linspace(-1.0, 1.0, bar_right - bar_left)
    levels = np.round(127.5 + 127.5 * np.sign(ramp) * (_PALEST + (1 - _PALEST) * np.abs(ramp))).astype(np.intp)
    canvas.paste(np.repeat(DIVERGING_LUT[levels].astype(np.uint8)[None], 9, axis=0), int(bar_left), middle - 4)
    canvas.text((2, middle), low, size=SMALL_SIZE, anchor="lm")
    canvas.text((bar_right + 3, middle), high, size=SMALL_SIZE, anchor="lm")
    note = _scale_note(scale, previous) or (f"per {block}x{block} block" if block > 1 else "")
    if note:
        canvas.text(
            (bar_right + 8 + canvas.text_width(high, size=SMALL_SIZE), middle),
            note,
            size=SMALL_SIZE,
            anchor="lm",
            colour=MUTED,
        )
    middle += LINE
    x = 2
    for text, colour, bold in (
        ("blue", POSITIVE, True),
        (f" raises {target}, ", INK, False),
        ("red", NEGATIVE, True),
        (f" lowers it, vs {baseline}", INK, False),
    ):
        canvas.text((x, middle), text, size=SMALL_SIZE, anchor="lm", colour=colour, bold=bold)
        x += canvas.text_width(text, size=SMALL_SIZE, bold=bold)
    if captioned:
        middle += LINE
        words = canvas.first_fitting(
            [
                f"under each frame: {target}, and its change from {baseline}",
                f"under each: {target}, and its change from {baseline}",
                f"under each frame: {target}, and its change from that",
            ],
            canvas.image.width - 4,
            size=SMALL_SIZE,
        )
        canvas.text((2, middle), words, size=SMALL_SIZE, anchor="lm", colour=MUTED)
    return canvas.pixels


def _scale_note(scale: float, previous: float | None) -> str:
    """``"was ±0.52"`` when the scale moved by more than a quarter since the previous picture."""
    if previous is None or not math.isfinite(previous) or previous <= 0:
        return ""
    if abs(scale - previous) <= _SCALE_CHANGE * previous:
        return ""
    return f"(scale was ±{format_value(previous)})"


def _strip_grid(attributions: np.ndarray, target: str, baseline: str) -> SaliencyPicture:
    """``(S, C, L)`` attributions: one heat strip per state (channels down, positions across), one scale."""
    scale = robust_max(attributions)
    levels = np.round((np.clip(np.nan_to_num(attributions / scale), -1, 1) + 1.0) * 127.5).astype(np.intp)
    strips = [strip(DIVERGING_LUT[level]) for level in levels]
    body = stack(strips, [f"state {i}" for i in range(len(strips))])
    return SaliencyPicture(
        bar_legend(body, scale, signed=True, what=f"blue raises {target}, red lowers it vs {baseline}"), scale
    )
