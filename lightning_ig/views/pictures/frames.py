"""What the saliency pictures share: frames drawn as objects in their channels' colours, tiles sized to the card,
pooling of large frames, colour scales, swatches, heat strips, and the PNG writer.

Read by :mod:`~lightning_ig.views.pictures.saliency` (the grid of held-out frames) and
:mod:`~lightning_ig.views.pictures.saliency_map` (mean ``|attr|`` per pixel). The constants are the pictures' common
measures: the dark ground of a frame, the border of a tile, a text line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lightning_ig._files import atomic_path
from lightning_ig.views.pictures.raster import (
    CARD_HEIGHT,
    CARD_WIDTH,
    DIVERGING_LUT,
    SEQUENTIAL_LUT,
    SMALL_SIZE,
    TEXT_SIZE,
    Canvas,
    categorical_colours,
    rgb,
)
from lightning_ig.views.text import format_value

__all__ = [
    "ABSENT",
    "BORDER",
    "GAP",
    "GROUND",
    "INK",
    "LINE",
    "MAGNITUDE_STEPS",
    "MAX_CELL",
    "MUTED",
    "ROBUST_PERCENTILE",
    "STRIP_WIDTH",
    "SaliencyPicture",
    "as_images",
    "bar_legend",
    "cell_size",
    "channel_labels",
    "check_saliency_channel",
    "colour_table",
    "first_distinct",
    "frame_colours",
    "nice_scale",
    "pool",
    "pool_factor",
    "robust_max",
    "saliency_kind",
    "sequential",
    "stack",
    "strip",
    "swatch",
    "tile_room",
    "write_png",
]

GROUND = np.array([38, 38, 38], dtype=np.float64)  # the frame's empty cells: dark grey, so that black is no colour
BORDER = "#7f7f7f"
INK = "#222222"
MUTED = "#555555"
ABSENT = np.array([217, 217, 217], dtype=np.uint8)  # a pixel where a channel's object never is
GAP = 8
LINE = 14  # a line of text at SMALL_SIZE
MAX_CELL = 8
ROBUST_PERCENTILE = 99.5  # the colour scale's end: one extreme pixel does not wash out the rest
STRIP_WIDTH = CARD_WIDTH - 8
MAGNITUDE_STEPS = 63  # 64 colours for magnitudes: an exact palette PNG


@dataclass(frozen=True)
class SaliencyPicture:
    """An RGB picture and the value its colour scale ends at.

    Attributes:
        pixels: ``(H, W, 3)`` uint8.
        scale: the colour scale is ``[-scale, +scale]`` (signed maps) or ``[0, scale]`` (magnitudes; for
            :func:`mean_abs_map` the largest of the channels' own scales).
        scales: per channel tile, the end of its own scale (:func:`mean_abs_map`); empty otherwise.
    """

    pixels: np.ndarray
    scale: float
    scales: tuple[float, ...] = field(default=())


def saliency_kind(feature_shape: tuple[int, ...]) -> str | None:
    """``"image"`` for ``(C, H, W)`` (or more dims), ``"strip"`` for ``(C, L)``, ``None`` for flat vectors."""
    if len(feature_shape) >= 3:
        return "image"
    return "strip" if len(feature_shape) == 2 else None


def check_saliency_channel(channel: int | None, feature_shape: tuple[int, ...]) -> None:
    """Raise where ``channel`` (the one channel drawn) is not a channel of ``(C, H, W)`` states.

    Leading dimensions of more than three are folded into channels, as the pictures fold them. States of
    other shapes draw no frame, so any ``channel`` passes for them.

    Raises:
        ValueError: ``channel`` is past the last channel.
    """
    if channel is None or saliency_kind(feature_shape) != "image":
        return
    channels = math.prod(feature_shape[:-2])
    if not 0 <= channel < channels:
        raise ValueError(
            f"saliency_channel={channel} is out of range for {channels} channels (feature shape {feature_shape}); "
            f"pick 0..{channels - 1}, or None for every channel in its colour"
        )


def robust_max(values: np.ndarray) -> float:
    """The colour scale's end: a high percentile of the non-zero ``|values|`` (zeros would pull it to 0)."""
    finite = np.abs(values[np.isfinite(values)])
    finite = finite[finite > 0]
    if finite.size == 0:
        return 1.0
    top = float(np.percentile(finite, ROBUST_PERCENTILE))
    return top if top > 0 else float(finite.max())


def as_images(values: np.ndarray) -> np.ndarray:
    """``(S, *shape)`` -> ``(S, C, H, W)``: leading feature dims folded into channels."""
    return values.reshape(values.shape[0], -1, *values.shape[-2:])


def colour_table(channel_colours: Sequence[str] | None, channels: int) -> np.ndarray:
    """``(C, 3)`` float64 colours: those given (``"#rrggbb"``), else
    :func:`~lightning_ig.views.pictures.raster.categorical_colours`.

    Raises:
        ValueError: a number of colours other than ``channels``, or one not written ``#rrggbb``.
    """
    colours = list(channel_colours) if channel_colours is not None else categorical_colours(channels)
    if len(colours) != channels:
        raise ValueError(f"channel_colours has {len(colours)} colours for {channels} channels; give one per channel")
    return np.array([rgb(colour) for colour in colours], dtype=np.float64)


def channel_labels(channel_names: Sequence[str] | None, channels: int) -> list[str]:
    """One label per channel: the names given, or ``channel 0``, ``channel 1``, ...

    Raises:
        ValueError: a number of names other than ``channels``.
    """
    if channel_names is None:
        return [f"channel {c}" for c in range(channels)]
    labels = [str(name) for name in channel_names]
    if len(labels) != channels:
        raise ValueError(f"channel_names has {len(labels)} names for {channels} channels; give one per channel")
    return labels


def frame_colours(images: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """Frames ``(S, C, H, W)`` as pixels ``(S, H, W, 3)`` uint8: each channel in its colour on a dark ground.

    Channels that hold objects (at most two values each, as MinAtar's 0/1 planes) are drawn as objects: a
    cell shows the rarest object present in it (a ball over the bricks it crosses), so that small objects
    are never hidden. Channels of intensities (stacked grey frames) are mixed: a cell's colour is the
    mix of the channels' colours weighted by their values, as bright as the brightest channel. Every
    channel is scaled to ``[0, 1]`` once over all frames, never frame by frame, so one colour means one
    value in every tile.

    Args:
        images: ``(S, C, H, W)`` the frames.
        colours: ``(C, 3)`` one RGB colour per channel.
    """
    low = images.min(axis=(0, 2, 3), keepdims=True)
    high = images.max(axis=(0, 2, 3), keepdims=True)
    unit = np.where(high > low, (images - low) / np.where(high > low, high - low, 1.0), 0.0)  # (S, C, H, W)
    if all(np.unique(images[:, c]).size <= 2 for c in range(images.shape[1])):
        present = unit > 0.5
        rarity = present.mean(axis=(0, 2, 3))  # (C,) how often each channel's object is in a cell
        order = np.argsort(-rarity, kind="stable")  # the commonest first: the rarest is drawn last, on top
        pixels = np.broadcast_to(GROUND, (*images.shape[:1], *images.shape[2:], 3)).copy()
        for channel in order:
            pixels[present[:, channel]] = colours[channel]
        return pixels.astype(np.uint8)
    weight = unit.sum(axis=1)[..., None]  # (S, H, W, 1)
    mix = np.einsum("schw,ck->shwk", unit, colours) / np.where(weight > 0, weight, 1.0)
    brightness = unit.max(axis=1)[..., None]
    return np.clip(GROUND + (mix - GROUND) * brightness, 0, 255).astype(np.uint8)


def tile_room(columns: int, rows: int, reserved: int) -> tuple[int, int]:
    """The pixels a tile may take, ``(height, width)``, for ``rows`` x ``columns`` tiles inside the card: a tile, its
    border and a gap of at least :data:`GAP` in each ``CARD_WIDTH // columns`` slot across, a caption line under it."""
    across = CARD_WIDTH // columns - GAP - 2
    down = (CARD_HEIGHT - reserved) // rows - 2 - LINE
    return max(down, 1), max(across, 1)


def cell_size(frame: tuple[int, int], columns: int, rows: int, reserved: int) -> int:
    """The largest whole-pixel enlargement (1 to 8) that keeps ``rows`` x ``columns`` tiles inside the card."""
    room = tile_room(columns, rows, reserved)
    return int(max(1, min(MAX_CELL, room[0] // frame[0], room[1] // frame[1])))


def pool_factor(frame: tuple[int, int], columns: int, rows: int, reserved: int) -> int:
    """1, or the whole factor by which frames too large for their tile are pooled (84 x 84 Atari frames: 2)."""
    room = tile_room(columns, rows, reserved)
    return max(1, math.ceil(frame[0] / room[0]), math.ceil(frame[1] / room[1]))


def pool(values: np.ndarray, factor: int, reduce: str) -> np.ndarray:
    """``(..., H, W)`` pooled over ``factor`` x ``factor`` blocks (zeros pad the edge) by ``"max"`` or ``"sum"``."""
    if factor == 1:
        return values
    height, width = values.shape[-2:]
    pad = [(0, 0)] * (values.ndim - 2) + [(0, -height % factor), (0, -width % factor)]
    padded = np.pad(values, pad)
    blocks = padded.reshape(*values.shape[:-2], padded.shape[-2] // factor, factor, padded.shape[-1] // factor, factor)
    return blocks.max(axis=(-3, -1)) if reduce == "max" else blocks.sum(axis=(-3, -1))


def first_distinct(states: np.ndarray, count: int) -> np.ndarray:
    """The indices of the first ``count`` states that differ from every earlier one (fewer if there are not so many).

    Random play repeats frames (MinAtar's resets: 16 of 64 held-out frames were copies); a grid of copies shows
    less. The callback picks its saliency states with this, and keeps the indices so the report can name them.
    """
    flat = np.ascontiguousarray(np.asarray(states).reshape(len(states), -1))
    _, first = np.unique(flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))), return_index=True)
    return np.sort(first)[:count]


def nice_scale(value: float) -> float:
    """The colour scale's end rounded up to 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten.

    A grid's scale is a high percentile of its attributions; rounded up, it stays the same from one picture to
    the next while the attributions grow or shrink a little, so that equal colours mean equal values across
    steps (at the cost of at most a third of the colour range).
    """
    if not math.isfinite(value) or value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if value <= step * power * (1 + 1e-6):  # float32 attributions: 0.4 is 0.40000000596
            return step * power
    return 10.0 * power


def swatch(canvas: Canvas, left: float, middle: float, colour: np.ndarray) -> None:
    """A channel's colour as a cell of the frame: a square of it on the dark ground (white shows on white)."""
    canvas.rectangle((left, middle - 6, left + 11, middle + 5), tuple(int(v) for v in GROUND))
    canvas.rectangle((left + 2, middle - 4, left + 9, middle + 3), tuple(int(v) for v in colour))


def strip(colours: np.ndarray) -> np.ndarray:
    """``(C, L, 3)`` colours -> a strip, rows 6 px high, columns stretched to about the card's width."""
    factor = max(1, STRIP_WIDTH // colours.shape[1])
    return np.clip(colours, 0, 255).astype(np.uint8).repeat(6, axis=0).repeat(factor, axis=1)


def stack(strips: list[np.ndarray], captions: list[str]) -> np.ndarray:
    height, width = strips[0].shape[:2]
    cell = height + LINE + 2
    canvas = Canvas(max(width, CARD_WIDTH), len(strips) * cell)
    for index, strip in enumerate(strips):
        canvas.text((2, index * cell + 1), captions[index], size=SMALL_SIZE)
        canvas.paste(strip, 0, index * cell + LINE)
    return canvas.pixels


def bar_legend(body: np.ndarray, scale: float, *, signed: bool, what: str) -> np.ndarray:
    """``body`` above a horizontal colour bar with its ends written out and a line saying what it shows."""
    width = max(body.shape[1], CARD_WIDTH)
    canvas = Canvas(width, body.shape[0] + 2 * LINE + 8)
    canvas.paste(body, 0, 0)
    y = body.shape[0] + 4
    low, high = (f"-{format_value(scale)}", f"+{format_value(scale)}") if signed else ("0", format_value(scale))
    left = 6 + canvas.text_width(low, size=SMALL_SIZE)
    right = min(width - 8 - canvas.text_width(high, size=SMALL_SIZE), left + 200)
    ramp = np.linspace(-1.0 if signed else 0.0, 1.0, int(right - left))
    colours = DIVERGING_LUT[np.round((ramp + 1.0) * 127.5).astype(np.intp)] if signed else sequential(ramp, 1.0)
    canvas.paste(np.repeat(colours.astype(np.uint8)[None], 10, axis=0), int(left), y + 3)
    canvas.text((2, y + 8), low, size=SMALL_SIZE, anchor="lm")
    canvas.text((right + 4, y + 8), high, size=SMALL_SIZE, anchor="lm")
    canvas.text((2, y + LINE + 8), canvas.fit(what, width - 4, size=TEXT_SIZE), size=TEXT_SIZE, anchor="lm")
    return canvas.pixels


def sequential(values: np.ndarray, scale: float) -> np.ndarray:
    """Magnitudes on ``[0, scale]`` in 64 steps of viridis: few colours, for an exact palette PNG."""
    unit = np.clip(np.nan_to_num(values / scale), 0.0, 1.0)
    return SEQUENTIAL_LUT[np.round(np.round(unit * MAGNITUDE_STEPS) * (255.0 / MAGNITUDE_STEPS)).astype(np.intp)]


def write_png(pixels: np.ndarray, path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> Path:
    """Write an ``(H, W, 3)`` uint8 picture as a PNG, atomically, with the umask's mode.

    Args:
        pixels: from :func:`saliency_grid` or :func:`mean_abs_map` (``.pixels``).
        path: the file to write.
        follow_symlinks: ``True`` (default: ``path`` is the user's): a symbolic link is written
            through to its target; ``False`` (a name the caller made up): a link there is
            replaced itself, its target never touched.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    from PIL import Image  # noqa: PLC0415

    target = Path(path)
    with atomic_path(target, follow_symlinks=follow_symlinks) as temporary:
        Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(temporary, format="PNG")
    return target
