"""Saliency pictures of held-out observations that show the game, at the size TensorBoard shows them (1.0x).

For states with spatial dimensions, ``(C, H, W)`` (more leading dimensions are read as channels):

* :func:`saliency_grid`: up to five frames and a legend tile on a 320 x 215 card, each frame drawn as its objects,
  one colour per channel on a dark ground (as MinAtar's own display does), every game cell at least 8 screen pixels
  where the frame allows it (MinAtar's 10 x 10: 8 px), with the cell's signed attribution (summed over channels) as
  a square inside it: blue where it raises the target above its value at the baseline, red where it lowers it,
  larger and darker where it is larger, on one scale for the card. Under each frame the target's value ``F(x)``
  and its change from the baseline ``F(x) - F(b)``, which the squares add up to. Frames too large for a tile
  (Atari's 84 x 84) are pooled by whole blocks: the objects by their maximum, the attributions by their sum;
* :func:`mean_abs_map`: the mean ``|attribution|`` per pixel, a tile per channel (``lightning-ig diag --saliency``).

``(C, L)`` states (1-d signals with channels) are heat strips: channels down, positions across.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_ig._files import atomic_path
from lightning_ig.views.pictures.raster import (
    CARD_HEIGHT,
    CARD_WIDTH,
    DIVERGING_LUT,
    NEGATIVE,
    POSITIVE,
    SEQUENTIAL_LUT,
    SMALL_SIZE,
    TEXT_SIZE,
    Canvas,
    categorical_colours,
    rgb,
)
from lightning_ig.views.text import format_value

__all__ = [
    "BORDER",
    "GRID_FRAMES",
    "GROUND",
    "LINE",
    "MUTED",
    "SaliencyPicture",
    "check_saliency_channel",
    "first_distinct",
    "frame_colours",
    "mean_abs_map",
    "nice_scale",
    "robust_max",
    "saliency_grid",
    "saliency_kind",
    "write_png",
]

GROUND = np.array([38, 38, 38], dtype=np.float64)  # the frame's empty cells: dark grey, so that black is no colour
BORDER = "#7f7f7f"
MUTED = "#555555"
LINE = 14  # a line of text at SMALL_SIZE
GRID_FRAMES = 5
"""Frames in a saliency grid: three slots across and two down at 8 px per MinAtar cell, the sixth the legend."""
_COLUMNS, _ROWS, _TOP = 3, 2, 16  # the grid's slots, and the line above them
_MAX_CELL = 16
_LEGEND_LINE = 12  # the legend's lines, packed so that four channels, the scale and its change fit beside a frame
_ROBUST_PERCENTILE = 99.5  # the colour scale's end: one extreme pixel does not wash out the rest
_SCALE_CHANGE = 0.25  # a scale this much larger or smaller than the previous picture's is pointed out
_PALEST = 0.6  # the palest marker colour, as a fraction of the way from white to the sign's darkest colour
_MAGNITUDE_STEPS = 63  # 64 colours for magnitudes: an exact palette PNG


@dataclass(frozen=True)
class SaliencyPicture:
    """An RGB picture ``pixels (H, W, 3)`` uint8 and the end of its colour scale (``[-scale, scale]`` for signed
    maps; for :func:`mean_abs_map` the largest of the channels' own scales, each in ``scales``)."""

    pixels: np.ndarray
    scale: float
    scales: tuple[float, ...] = ()


def saliency_kind(feature_shape: tuple[int, ...]) -> str | None:
    """``"image"`` for ``(C, H, W)`` (or more dims), ``"strip"`` for ``(C, L)``, ``None`` for flat vectors."""
    return "image" if len(feature_shape) >= 3 else "strip" if len(feature_shape) == 2 else None


def check_saliency_channel(channel: int | None, feature_shape: tuple[int, ...]) -> None:
    """Raise where ``channel`` (the one channel drawn) is not a channel of ``(C, H, W)`` states (leading dimensions
    folded into channels); states of other shapes draw no frame, so any ``channel`` passes for them.

    Raises:
        ValueError: ``channel`` is past the last channel.
    """
    if channel is None or saliency_kind(feature_shape) != "image":
        return
    if not 0 <= channel < (channels := math.prod(feature_shape[:-2])):
        raise ValueError(
            f"saliency_channel={channel} is out of range for {channels} channels (feature shape {feature_shape}); "
            f"pick 0..{channels - 1}, or None for every channel in its colour"
        )


def robust_max(values: np.ndarray) -> float:
    """A high percentile of the non-zero ``|values|`` (zeros would pull it to 0); 1 where there are none."""
    finite = np.abs(values[np.isfinite(values)])
    finite = finite[finite > 0]
    if finite.size == 0:
        return 1.0
    top = float(np.percentile(finite, _ROBUST_PERCENTILE))
    return top if top > 0 else float(finite.max())


def nice_scale(value: float) -> float:
    """The colour scale's end rounded up to 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten, so that it stays
    put between pictures while the attributions grow or shrink a little."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if value <= step * power * (1 + 1e-6):  # float32 attributions: 0.4 is 0.40000000596
            return step * power
    return 10.0 * power


def first_distinct(states: np.ndarray, count: int) -> np.ndarray:
    """The indices of the first ``count`` states that differ from every earlier one (random play repeats frames)."""
    flat = np.ascontiguousarray(np.asarray(states).reshape(len(states), -1))
    _, first = np.unique(flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))), return_index=True)
    return np.sort(first)[:count]


def _colours(channel_colours: Sequence[str] | None, channel_names: Sequence[str] | None, channels: int) -> tuple:
    """``(C, 3)`` float64 colours and one label per channel, checked against the channels."""
    colours = list(channel_colours) if channel_colours is not None else categorical_colours(channels)
    labels = [f"channel {c}" for c in range(channels)] if channel_names is None else [str(n) for n in channel_names]
    if len(colours) != channels or len(labels) != channels:
        raise ValueError(
            f"got {len(colours)} channel colours and {len(labels)} channel names for {channels} channels; "
            "give one per channel"
        )
    return np.array([rgb(colour) for colour in colours], dtype=np.float64), labels


def frame_colours(images: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """Frames ``(S, C, H, W)`` as pixels ``(S, H, W, 3)`` uint8: each channel in its colour on a dark ground.

    Channels of objects (two values each, as MinAtar's 0/1 planes): a cell shows the rarest object present, so
    small objects are never hidden (a ball over the bricks). Channels of intensities: the channels' colours mixed by
    value, as bright as the brightest. Each channel is scaled to ``[0, 1]`` once over all frames, never per frame.
    """
    low, high = images.min(axis=(0, 2, 3), keepdims=True), images.max(axis=(0, 2, 3), keepdims=True)
    unit = np.where(high > low, (images - low) / np.where(high > low, high - low, 1.0), 0.0)  # (S, C, H, W)
    if all(np.unique(images[:, c]).size <= 2 for c in range(images.shape[1])):
        present = unit > 0.5
        order = np.argsort(-present.mean(axis=(0, 2, 3)), kind="stable")  # the commonest first, the rarest on top
        pixels = np.broadcast_to(GROUND, (*images.shape[:1], *images.shape[2:], 3)).copy()
        for channel in order:
            pixels[present[:, channel]] = colours[channel]
        return pixels.astype(np.uint8)
    weight = unit.sum(axis=1)[..., None]  # (S, H, W, 1)
    mix = np.einsum("schw,ck->shwk", unit, colours) / np.where(weight > 0, weight, 1.0)
    return np.clip(GROUND + (mix - GROUND) * unit.max(axis=1)[..., None], 0, 255).astype(np.uint8)


def _pool(values: np.ndarray, factor: int, reduce: str) -> np.ndarray:
    """``(..., H, W)`` pooled over ``factor`` x ``factor`` blocks (zeros pad the edge) by ``"max"`` or ``"sum"``."""
    if factor == 1:
        return values
    height, width = values.shape[-2:]
    pad = [(0, 0)] * (values.ndim - 2) + [(0, -height % factor), (0, -width % factor)]
    padded = np.pad(values, pad)
    blocks = padded.reshape(*values.shape[:-2], padded.shape[-2] // factor, factor, padded.shape[-1] // factor, factor)
    return blocks.max(axis=(-3, -1)) if reduce == "max" else blocks.sum(axis=(-3, -1))


def _markers(maps: np.ndarray, scale: float, cell: int) -> tuple[np.ndarray, np.ndarray]:
    """Per cell a centred square whose area grows with ``|attribution| / scale`` (full: the cell less a one-pixel rim,
    so the object's colour shows around it), in the sign's colour, darker where larger: ``(mask, colour)`` at
    ``cell`` x enlargement."""
    unit = np.clip(np.nan_to_num(maps / scale), -1.0, 1.0)  # (S, H, W)
    largest = max(cell - 2, 1)
    side = np.round(largest * np.sqrt(np.abs(unit))).astype(np.intp)  # 0..largest: negligible values draw nothing
    offsets = np.arange(cell)
    squares = np.zeros((largest + 1, cell, cell), dtype=bool)
    for k in range(1, largest + 1):
        inside = (offsets >= (cell - k + 1) // 2) & (offsets < (cell - k + 1) // 2 + k)
        squares[k] = inside[:, None] & inside[None, :]
    count, height, width = maps.shape
    mask = squares[side].transpose(0, 1, 3, 2, 4).reshape(count, height * cell, width * cell)
    levels = np.round(127.5 + 127.5 * np.sign(unit) * (_PALEST + (1 - _PALEST) * np.abs(unit))).astype(np.intp)
    return mask, DIVERGING_LUT[levels].repeat(cell, axis=1).repeat(cell, axis=2)


def _captions(
    f_input: np.ndarray | None, f_delta: np.ndarray | None, count: int, fits: Callable[[str], bool] = lambda line: True
) -> list[str] | None:
    """``F(x) F(x)-F(b)`` per frame: both columns with the decimals of the smaller's two significant digits (so they
    subtract to one ``F(b)``) where every line ``fits`` under its frame, else each column with its own two."""
    pairs = ((f_input, ""), (f_delta, "+"))
    given = [(np.asarray(values, dtype=np.float64).reshape(-1), sign) for values, sign in pairs if values is not None]
    for array, _ in given:
        if array.shape[0] != count:
            raise ValueError(f"got {array.shape[0]} values under the frames for {count} frames; give one per frame")
    tops = [float(np.abs(array[np.isfinite(array)]).max(initial=0.0)) for array, _ in given]
    decimals = [2 if top == 0 else int(min(4, max(0, 1 - math.floor(math.log10(top))))) for top in tops]
    for places in ([max(decimals, default=0)] * len(given), decimals):
        columns = [
            [f"{v:{sign}.{d}f}" if math.isfinite(v) else str(v) for v in a] for (a, sign), d in zip(given, places)
        ]
        lines = [" ".join(words) for words in zip(*columns)]
        if all(fits(line) for line in lines):
            break
    return lines if given else None


def saliency_grid(
    states: np.ndarray,
    attributions: np.ndarray,
    *,
    channel: int | None = None,
    channel_names: Sequence[str] | None = None,
    channel_colours: Sequence[str] | None = None,
    target_label: str = "V(s)",
    baseline_label: str = "the all-zero frame",
    f_input: np.ndarray | None = None,
    f_delta: np.ndarray | None = None,
    previous_scale: float | None = None,
) -> SaliencyPicture:
    """The first :data:`GRID_FRAMES` observations with their signed attributions, on one card (a strip per state for
    1-d signals).

    Args:
        states: ``(S, *feature_shape)`` the observations.
        attributions: ``(S, *feature_shape)`` their attributions.
        channel: draw this channel only (``None``, default: every channel in its colour).
        channel_names: one name per channel, for the legend (default ``channel 0``, ...).
        channel_colours: one ``"#rrggbb"`` per channel (default: the categorical colours).
        target_label: what is attributed, as the legend names it (default ``"V(s)"``).
        baseline_label: what the attribution is relative to (default ``"the all-zero frame"``).
        f_input: ``(S,)`` the target's value at each state, written under its frame.
        f_delta: ``(S,)`` ``F(x) - F(b)``, the change from the baseline, written beside it.
        previous_scale: the scale of the previous grid; a change of more than 25% is written in the legend.

    Returns:
        The picture and its scale (the attribution at which a square is full).

    Raises:
        ValueError: shapes that differ or have no spatial dimension, a channel out of range, names, colours or
            values under the frames that do not match the states.
    """
    states = np.asarray(states, dtype=np.float32)
    attributions = np.asarray(attributions, dtype=np.float32)
    kind = saliency_kind(tuple(states.shape[1:]))
    if states.shape != attributions.shape or kind is None:
        raise ValueError(
            f"saliency needs states and attributions of one shape (S, C, H, W) or (S, C, L), got "
            f"{tuple(states.shape)} and {tuple(attributions.shape)}"
        )
    slot_width, slot_height = CARD_WIDTH // _COLUMNS, (CARD_HEIGHT - _TOP) // _ROWS
    canvas = Canvas(CARD_WIDTH, CARD_HEIGHT)
    captions = _captions(
        f_input, f_delta, len(states), lambda t: canvas.text_width(t, size=SMALL_SIZE) <= slot_width - 4
    )
    if kind == "image" and 1 in states.shape[-2:]:  # a frame one cell high or wide is a 1-d signal: its strips
        kind, attributions = "strip", attributions.reshape(len(states), -1, math.prod(states.shape[-2:]))
    if kind == "strip":
        return _strips(attributions, target_label, baseline_label)
    check_saliency_channel(channel, tuple(states.shape[1:]))
    count = min(len(states), GRID_FRAMES)
    images = states[:count].reshape(count, -1, *states.shape[-2:])  # (S, C, H, W)
    maps = attributions[:count].reshape(images.shape).sum(axis=1)  # (S, H, W)
    colours, labels = _colours(channel_colours, channel_names, images.shape[1])
    if channel is not None:
        images, colours, labels = images[:, channel : channel + 1], colours[channel : channel + 1], [labels[channel]]
    if len(labels) > 5 and not _fits_two(canvas, labels, slot_width - 4) and count == GRID_FRAMES:  # two slots
        count, images, maps = count - 1, images[:-1], maps[:-1]
    room = (slot_height - LINE - 4, slot_width - 6)  # a frame, its border and its caption in a slot
    block = max(1, math.ceil(images.shape[2] / room[0]), math.ceil(images.shape[3] / room[1]))
    images, maps = _pool(images, block, "max"), _pool(maps, block, "sum")  # objects kept; attributions add up
    cell = max(1, min(_MAX_CELL, room[0] // images.shape[2], room[1] // images.shape[3]))
    scale = nice_scale(robust_max(maps))
    frames = frame_colours(images, colours).repeat(cell, axis=1).repeat(cell, axis=2)  # (S, H*cell, W*cell, 3)
    mask, marker = _markers(maps, scale, cell)
    tiles = np.where(mask[..., None], marker, frames).astype(np.uint8)
    x, tail = 3.0, f" lowers it, vs {baseline_label}"
    if canvas.text_width(f"blue raises {target_label}, red{tail}", size=SMALL_SIZE) > CARD_WIDTH - 6:
        tail = " lowers it"  # whole words, not cut: the verdict card's legend names the baseline too
    for words, colour, bold in (
        ("blue", POSITIVE, True),
        (f" raises {target_label}, ", "#222222", False),
        ("red", NEGATIVE, True),
        (tail, "#222222", False),
    ):
        text = canvas.fit(words, CARD_WIDTH - x - 2, size=SMALL_SIZE, bold=bold)
        canvas.text((x, 1), text, size=SMALL_SIZE, colour=colour, bold=bold)
        x += canvas.text_width(text, size=SMALL_SIZE, bold=bold)
    height, width = tiles.shape[1:3]
    for index in range(count + 1):
        slot_left, top = (index % _COLUMNS) * slot_width, _TOP + (index // _COLUMNS) * slot_height
        if index == count:  # the legend in the next slot: the channels, the scale, the numbers under the frames
            _legend(canvas, slot_left + 4, top, labels, colours, scale, previous_scale, target_label, captions, block)
            break
        left = slot_left + (slot_width - width - 2) // 2
        canvas.outline((left, top, left + width + 1, top + height + 1), BORDER)
        canvas.paste(tiles[index], left + 1, top + 1)
        if captions is not None:
            text = canvas.fit(captions[index], slot_width - 4, size=SMALL_SIZE)
            canvas.text((slot_left + slot_width / 2, top + height + 3), text, size=SMALL_SIZE, anchor="ma")
    return SaliencyPicture(canvas.pixels, scale)


def _fits_two(canvas: Canvas, labels: list[str], room: float) -> bool:
    """Whether the legend's first 10 channel names fit two columns of swatches in ``room`` pixels."""
    return max(canvas.text_width(label, size=SMALL_SIZE) for label in labels[:10]) <= room / 2 - 16


def _legend(
    canvas: Canvas,
    left: float,
    top: float,
    labels: list[str],
    colours: np.ndarray,
    scale: float,
    previous: float | None,
    target: str,
    captions: list[str] | None,
    block: int,
) -> None:
    """The legend tile: a swatch per channel, the first 10 (two columns where the names fit them), the squares'
    scale, what the numbers under the frames are, the scale's change; lines that would pass the card's foot are left
    out, from the last."""
    room, labels = CARD_WIDTH - left - 2, labels[:10]  # the first 10 channels: the lines below are placed after them
    columns = 2 if len(labels) > 5 or (len(labels) > 2 and _fits_two(canvas, labels, room)) else 1
    for index, (label, colour) in enumerate(zip(labels, colours)):
        x, y = left + (index % columns) * room / columns, top + (index // columns) * _LEGEND_LINE + 6
        canvas.rectangle((x, y - 6, x + 11, y + 5), tuple(int(v) for v in GROUND))
        canvas.rectangle((x + 2, y - 4, x + 9, y + 3), tuple(int(v) for v in colour))
        canvas.text((x + 14, y), canvas.fit(label, room / columns - 16, size=SMALL_SIZE), size=SMALL_SIZE, anchor="lm")
    y = top + math.ceil(len(labels) / columns) * _LEGEND_LINE + 1
    changed = previous is not None and math.isfinite(previous) and abs(scale - previous) > _SCALE_CHANGE * previous
    lines = [f"full ■: ±{format_value(scale)}"]
    lines += [f"(was ±{format_value(previous)})"] if changed and previous is not None else []  # before what may go
    lines += [f"per {block}x{block} block"] if block > 1 else []
    if captions is not None:  # the numbers under the frames
        lines += [f"below: {target if len(target) <= 7 else 'value'},", "and its change"]
    kept = lines[: max(1, int((CARD_HEIGHT - y - 16) // _LEGEND_LINE) + 1)]
    for line in kept[:-1] if kept[-1].startswith("below:") else kept:  # "below: V(s)," only with its second line
        canvas.text((left, y), canvas.fit(line, room, size=SMALL_SIZE), size=SMALL_SIZE, colour=MUTED)
        y += LINE - 1


def _sequential(values: np.ndarray, scale: float) -> np.ndarray:
    """Magnitudes on ``[0, scale]`` in 64 steps of viridis: few colours, for an exact palette PNG."""
    unit = np.clip(np.nan_to_num(values / scale), 0.0, 1.0)
    return SEQUENTIAL_LUT[np.round(np.round(unit * _MAGNITUDE_STEPS) * (255.0 / _MAGNITUDE_STEPS)).astype(np.intp)]


def _strip_picture(
    strips: list[np.ndarray], captions: list[str], scale: float, *, signed: bool, what: str
) -> np.ndarray:
    """Heat strips (rows 6 px high, each under its caption) over a colour bar with its ends and what it shows."""
    factor = max(1, (CARD_WIDTH - 8) // strips[0].shape[1])
    strips = [np.clip(s, 0, 255).astype(np.uint8).repeat(6, axis=0).repeat(factor, axis=1) for s in strips]
    pitch = strips[0].shape[0] + LINE + 2
    width = max(CARD_WIDTH, strips[0].shape[1])
    canvas = Canvas(width, len(strips) * pitch + 2 * LINE + 8)
    for index, strip in enumerate(strips):
        canvas.text((2, index * pitch + 1), captions[index], size=SMALL_SIZE)
        canvas.paste(strip, 0, index * pitch + LINE)
    y = len(strips) * pitch + 4
    low, high = (f"-{format_value(scale)}", f"+{format_value(scale)}") if signed else ("0", format_value(scale))
    left = 6 + canvas.text_width(low, size=SMALL_SIZE)
    right = min(width - 8 - canvas.text_width(high, size=SMALL_SIZE), left + 200)
    ramp = np.linspace(-1.0 if signed else 0.0, 1.0, int(right - left))
    bar = DIVERGING_LUT[np.round((ramp + 1.0) * 127.5).astype(np.intp)] if signed else _sequential(ramp, 1.0)
    canvas.paste(np.repeat(bar.astype(np.uint8)[None], 10, axis=0), int(left), y + 3)
    canvas.text((2, y + 8), low, size=SMALL_SIZE, anchor="lm")
    canvas.text((right + 4, y + 8), high, size=SMALL_SIZE, anchor="lm")
    canvas.text((2, y + LINE + 8), canvas.fit(what, width - 4, size=TEXT_SIZE), size=TEXT_SIZE, anchor="lm")
    return canvas.pixels


def _strips(attributions: np.ndarray, target: str, baseline: str) -> SaliencyPicture:
    """``(S, C, L)`` attributions: one heat strip per state (channels down, positions across), one scale."""
    scale = robust_max(attributions)
    levels = np.round((np.clip(np.nan_to_num(attributions / scale), -1, 1) + 1.0) * 127.5).astype(np.intp)
    strips, captions = [DIVERGING_LUT[level] for level in levels], [f"state {i}" for i in range(len(levels))]
    what = f"blue raises {target}, red lowers it vs {baseline}"
    return SaliencyPicture(_strip_picture(strips, captions, scale, signed=True, what=what), scale)


def mean_abs_map(
    mean_abs: np.ndarray,
    num_states: int | None = None,
    channel_names: Sequence[str] | None = None,
    *,
    channel_colours: Sequence[str] | None = None,
) -> SaliencyPicture:
    """Mean ``|attribution|`` per pixel as a picture: one tile per channel, each on its own scale (under it: its full
    colour, the 99.5th percentile, so that one extreme cell does not wash out the rest).

    Args:
        mean_abs: ``feature_shape`` mean ``|attr|`` per pixel over the states.
        num_states: how many states it is the mean over (for the title).
        channel_names: one label per channel tile (default ``channel 0``, ``channel 1``, ...).
        channel_colours: one ``"#rrggbb"`` per channel, for the swatch beside each name.

    Raises:
        ValueError: names or colours that do not match the channels.
    """
    values = np.asarray(mean_abs, dtype=np.float64)
    over = "" if num_states is None else f", {num_states} states"
    if saliency_kind(values.shape) == "strip":
        scale = robust_max(values)
        pixels = _strip_picture(
            [_sequential(values, scale)], ["all channels"], scale, signed=False, what=f"mean |attribution|{over}"
        )
        return SaliencyPicture(pixels, scale)
    channels = values.reshape(-1, *values.shape[-2:])  # (C, H, W)
    count, height, width = channels.shape
    colours, labels = _colours(channel_colours, channel_names, count)
    scales = [robust_max(np.nan_to_num(tile)) for tile in channels]
    tops = [f"full {format_value(v)}" if np.nan_to_num(t).any() else "full 0" for v, t in zip(scales, channels)]
    columns = min(count, 4)
    rows = math.ceil(count / columns)
    room = ((CARD_HEIGHT - 2 * LINE - 6) // rows - 2 * LINE - 4, CARD_WIDTH // columns - 10)
    cell = max(1, min(8, room[0] // height, room[1] // width))
    pitch_x, pitch_y = max(width * cell + 10, CARD_WIDTH // columns), height * cell + 2 * LINE + 4
    canvas = Canvas(max(CARD_WIDTH, columns * pitch_x), 2 * LINE + 6 + rows * pitch_y)
    if max(canvas.text_width(top) for top in tops) > pitch_x - 14:  # the title says what the numbers are
        tops = [top.removeprefix("full ") for top in tops]
    canvas.text((2, 2), f"mean |attribution| per pixel{over}", size=TEXT_SIZE)
    canvas.text((2, LINE + 3), "each tile on its own scale, 0 to full", size=SMALL_SIZE, colour=MUTED)
    for index in range(count):
        left, top = (index % columns) * pitch_x + 2, 2 * LINE + 6 + (index // columns) * pitch_y
        canvas.rectangle((left, top + 2, left + 11, top + 13), tuple(int(v) for v in GROUND))
        canvas.rectangle((left + 2, top + 4, left + 9, top + 11), tuple(int(v) for v in colours[index]))
        canvas.text(
            (left + 14, top + 8), canvas.fit(labels[index], pitch_x - 16, size=SMALL_SIZE), size=SMALL_SIZE, anchor="lm"
        )
        tile = _sequential(channels[index], scales[index]).astype(np.uint8)
        canvas.outline((left, top + LINE + 1, left + width * cell + 1, top + LINE + height * cell + 2), BORDER)
        canvas.paste(tile.repeat(cell, axis=0).repeat(cell, axis=1), left + 1, top + LINE + 2)
        canvas.text((left, top + LINE + height * cell + 4), tops[index], size=SMALL_SIZE)
    return SaliencyPicture(canvas.pixels, max(scales), tuple(scales))


def write_png(pixels: np.ndarray, path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> Path:
    """Write an ``(H, W, 3)`` uint8 picture as a PNG, atomically, with the umask's mode.

    Args:
        pixels: from :func:`saliency_grid` or :func:`mean_abs_map` (``.pixels``).
        path: the file to write.
        follow_symlinks: ``True`` (default: ``path`` is the user's): a symbolic link is written through to its
            target; ``False`` (a name the caller made up): a link there is replaced itself, its target never touched.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    from PIL import Image  # noqa: PLC0415

    target = Path(path)
    with atomic_path(target, follow_symlinks=follow_symlinks) as temporary:
        Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(temporary, format="PNG")
    return target
