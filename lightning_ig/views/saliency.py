"""Saliency pictures of held-out observations, built with numpy and Pillow.

For states with spatial dimensions, ``(C, H, W)`` (more leading dimensions are
read as channels):

* :func:`saliency_grid`: up to 8 observations side by side, each the
  observation in grey (one channel or frame, or the channel mean) with its
  signed attribution (summed over channels) blended over it: blue where the
  attribution raises the target, red where it lowers it, more opaque where it
  is larger. One symmetric scale for the whole grid, written under it;
* :func:`mean_abs_map`: the mean ``|attribution|`` over all states, one tile
  per channel side by side, one scale for all channels.

For ``(C, L)`` states (1-d signals with channels) both are heat strips:
channels down, positions across.

Each image is a ``(H, W, 3)`` uint8 array for ``SummaryWriter.add_image(...,
dataformats="HWC")`` or :func:`write_png`; small tiles are enlarged by whole
pixels so that they stay sharp. Captions and colour bars are drawn once per
layout and kept (text is the slowest part of a picture); a run draws only
its two scale numbers.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_ig._files import atomic_path
from lightning_ig.views.raster import DIVERGING_LUT, SEQUENTIAL_LUT, font

__all__ = ["SaliencyPicture", "check_saliency_channel", "mean_abs_map", "saliency_grid", "saliency_kind", "write_png"]

# Small observations are enlarged by whole pixels up to about this size (captions stay in proportion); larger
# ones are stored as they are: TensorBoard scales images up to its card without smoothing ("pixelated").
_TILE_PIXELS = 84
_STRIP_WIDTH = 384
_GAP = 4
_TEXT_ROW = 14
_CAPTION_SIZE = 10
_NUMBER_ROWS = _TEXT_ROW + 4  # the legend rows above its description: the colour bar and the scale numbers
_MAX_OPACITY = 0.9
_MAGNITUDE_STEPS = 63  # 64 colours for magnitudes
_ROBUST_PERCENTILE = 99.5  # the colour scale's end: one extreme pixel does not wash out the rest


@dataclass(frozen=True)
class SaliencyPicture:
    """An RGB picture and the value its colour scale ends at.

    Attributes:
        pixels: ``(H, W, 3)`` uint8.
        scale: the colour scale is ``[-scale, +scale]`` (signed maps) or ``[0, scale]`` (magnitudes).
    """

    pixels: np.ndarray
    scale: float


def saliency_kind(feature_shape: tuple[int, ...]) -> str | None:
    """``"image"`` for ``(C, H, W)`` (or more dims), ``"strip"`` for ``(C, L)``, ``None`` for flat vectors."""
    if len(feature_shape) >= 3:
        return "image"
    return "strip" if len(feature_shape) == 2 else None


def check_saliency_channel(channel: int | None, feature_shape: tuple[int, ...]) -> None:
    """Raise where ``channel`` (the one drawn in grey) is not a channel of ``(C, H, W)`` states.

    Leading dimensions of more than three are folded into channels, as the pictures fold them. States of
    other shapes draw no channel in grey, so any ``channel`` passes for them.

    Raises:
        ValueError: ``channel`` is past the last channel.
    """
    if channel is None or saliency_kind(feature_shape) != "image":
        return
    channels = math.prod(feature_shape[:-2])
    if not 0 <= channel < channels:
        raise ValueError(
            f"saliency_channel={channel} is out of range for {channels} channels (feature shape {feature_shape}); "
            f"pick 0..{channels - 1}, or None for the channel mean"
        )


def _robust_max(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    if finite.size == 0:
        return 1.0
    top = float(np.percentile(finite, _ROBUST_PERCENTILE))
    return top if top > 0 else (float(finite.max()) or 1.0)


def _enlarge(image: np.ndarray, factor: int) -> np.ndarray:
    pixels = image if image.dtype == np.uint8 else np.clip(image, 0, 255).astype(np.uint8)
    return pixels if factor == 1 else pixels.repeat(factor, axis=0).repeat(factor, axis=1)


def _tile_factor(height: int, width: int) -> int:
    return max(1, round(_TILE_PIXELS / max(height, width)))


def _as_images(values: np.ndarray) -> np.ndarray:
    """``(S, *shape)`` -> ``(S, C, H, W)``: leading feature dims folded into channels."""
    return values.reshape(values.shape[0], -1, *values.shape[-2:])


def _blend_table() -> np.ndarray:
    """``(256, 256, 3)`` uint8: a signed colour level (-scale to +scale) blended over a grey level.

    The opacity grows with the attribution's size, so that small attributions leave the observation visible.
    """
    unit = np.arange(256) / 127.5 - 1.0  # the signed value of each colour level
    opacity = _MAX_OPACITY * np.abs(unit)[:, None, None]
    grey = np.arange(256, dtype=np.float64)[None, :, None]
    return np.clip((1.0 - opacity) * grey + opacity * DIVERGING_LUT[:, None, :], 0, 255).astype(np.uint8)


_BLEND = _blend_table()


def _signed_level(signed: np.ndarray, scale: float) -> np.ndarray:
    """Signed values on ``[-scale, scale]`` (NaN as 0, clipped) -> colour levels 0..255 (127.5: zero)."""
    return np.round((np.clip(np.nan_to_num(signed / scale), -1.0, 1.0) + 1.0) * 127.5).astype(np.intp)


def _sequential(values: np.ndarray, scale: float) -> np.ndarray:
    """Magnitudes on ``[0, scale]`` in 64 steps of viridis: few enough colours, with the captions', for an exact
    palette PNG (a smooth ramp of 256 would be cut to visible steps by the palette's quantizer instead)."""
    unit = np.clip(np.nan_to_num(values / scale), 0.0, 1.0)
    return SEQUENTIAL_LUT[np.round(np.round(unit * _MAGNITUDE_STEPS) * (255.0 / _MAGNITUDE_STEPS)).astype(np.intp)]


def _grey(observations: np.ndarray) -> np.ndarray:
    """``(S, H, W)`` -> grey levels in ``[0, 255]``, each observation stretched to its own range."""
    low = observations.min(axis=(1, 2), keepdims=True)
    high = observations.max(axis=(1, 2), keepdims=True)
    span = np.where(high > low, high - low, 1.0)
    return np.where(high > low, (observations - low) / span, 0.5) * 255.0


def saliency_grid(
    states: np.ndarray, attributions: np.ndarray, *, channel: int | None = None, columns: int = 4
) -> SaliencyPicture:
    """The observations with their signed attributions blended over them, in a grid (a strip per state for 1-d).

    Args:
        states: ``(S, *feature_shape)`` the observations.
        attributions: ``(S, *feature_shape)`` their attributions.
        channel: the channel (or frame) drawn in grey; ``None`` (default) for the channel mean.
        columns: tiles per row (default 4).

    Returns:
        The picture and its scale (the attribution at which the colour is full).

    Raises:
        ValueError: shapes that differ or have no spatial dimension, or a channel out of range.
    """
    states = np.asarray(states, dtype=np.float32)
    attributions = np.asarray(attributions, dtype=np.float32)
    kind = saliency_kind(tuple(states.shape[1:]))
    if states.shape != attributions.shape or kind is None:
        raise ValueError(
            f"saliency needs states and attributions of one shape (S, C, H, W) or (S, C, L), got "
            f"{tuple(states.shape)} and {tuple(attributions.shape)}"
        )
    if kind == "strip":
        scale = _robust_max(attributions)
        strips = [_strip(_BLEND[_signed_level(a, scale), 255]) for a in attributions]  # blended over white
        body = _stack(strips, [f"state {i}" for i in range(len(strips))])
        return SaliencyPicture(
            _with_legend(body, scale, signed=True, what="attribution per channel and position"), scale
        )
    images, maps = _as_images(states), _as_images(attributions).sum(axis=1)  # (S, C, H, W), (S, H, W)
    check_saliency_channel(channel, tuple(states.shape[1:]))
    grey = np.round(_grey(images.mean(axis=1) if channel is None else images[:, channel])).astype(np.intp)  # (S, H, W)
    scale = _robust_max(maps)
    blended = _BLEND[_signed_level(maps, scale), grey]  # (S, H, W, 3) uint8: one table look-up per pixel
    factor = _tile_factor(*maps.shape[1:])
    tiles = [_enlarge(tile, factor) for tile in blended]
    body = _grid(tiles, [f"state {i}" for i in range(len(tiles))], columns)
    shown = "the channel mean" if channel is None else f"channel {channel}"
    legend = f"attribution (sum over channels) on {shown}"
    return SaliencyPicture(_with_legend(body, scale, signed=True, what=legend), scale)


def mean_abs_map(
    mean_abs: np.ndarray, num_states: int | None = None, channel_names: Sequence[str] | None = None
) -> SaliencyPicture:
    """Mean ``|attribution|`` per feature as a picture: one tile per channel (or a heat strip for ``(C, L)``).

    Args:
        mean_abs: ``feature_shape`` array of mean ``|attr|`` over the states.
        num_states: how many states it is the mean over (for the legend).
        channel_names: one label per channel tile (default ``channel 0``, ``channel 1``, ...).

    Returns:
        The picture and its scale (the value at the top of the colour scale; shared by all channels).
    """
    values = np.asarray(mean_abs, dtype=np.float32)
    scale = _robust_max(values)
    over = "" if num_states is None else f" over {num_states} states"
    if saliency_kind(values.shape) == "strip":
        body = _stack([_strip(_sequential(values, scale))], ["all channels"])
        return SaliencyPicture(_with_legend(body, scale, signed=False, what=f"mean |attribution|{over}"), scale)
    channels = values.reshape(-1, *values.shape[-2:])  # (C, H, W)
    factor = _tile_factor(*channels.shape[1:])
    tiles = [_enlarge(_sequential(tile, scale), factor) for tile in channels]
    labels = list(channel_names) if channel_names is not None else [f"channel {c}" for c in range(len(tiles))]
    if len(labels) != len(tiles):
        raise ValueError(f"channel_names has {len(labels)} names for {len(tiles)} channels; give one per channel")
    body = _grid(tiles, labels, columns=len(tiles))
    return SaliencyPicture(_with_legend(body, scale, signed=False, what=f"mean |attribution| per pixel{over}"), scale)


def _strip(colours: np.ndarray) -> np.ndarray:
    """``(C, L, 3)`` colours -> a strip, rows 6 px high, columns stretched to about ``_STRIP_WIDTH``."""
    factor = max(1, math.ceil(_STRIP_WIDTH / colours.shape[1]))
    return np.clip(colours, 0, 255).astype(np.uint8).repeat(6, axis=0).repeat(factor, axis=1)


def _canvas(height: int, width: int) -> np.ndarray:
    return np.full((height, width, 3), 255, dtype=np.uint8)


def _grid(tiles: list[np.ndarray], captions: list[str], columns: int) -> np.ndarray:
    height, width = tiles[0].shape[:2]
    columns = max(1, min(columns, len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    cell_height, cell_width = height + _TEXT_ROW, width + _GAP
    texts = tuple(
        ((index // columns) * cell_height, (index % columns) * cell_width, text) for index, text in enumerate(captions)
    )
    canvas = _captioned(rows * cell_height, columns * cell_width - _GAP, texts).copy()
    for index, tile in enumerate(tiles):
        top, left = (index // columns) * cell_height + _TEXT_ROW, (index % columns) * cell_width
        canvas[top : top + height, left : left + width] = tile
    return canvas


def _stack(strips: list[np.ndarray], captions: list[str]) -> np.ndarray:
    height, width = strips[0].shape[:2]
    cell = height + _TEXT_ROW + _GAP
    canvas = _captioned(
        len(strips) * cell, width, tuple((index * cell, 0, text) for index, text in enumerate(captions))
    ).copy()
    for index, strip in enumerate(strips):
        canvas[index * cell + _TEXT_ROW : index * cell + _TEXT_ROW + height] = strip
    return canvas


def _caption(canvas: np.ndarray, texts: tuple[tuple[int, int, str], ...]) -> np.ndarray:
    from PIL import Image, ImageDraw  # noqa: PLC0415

    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    for top, left, text in texts:
        draw.text((left + 1, top + 1), text, fill=(40, 40, 40), font=font(_CAPTION_SIZE))
    return np.asarray(image)


@functools.lru_cache(maxsize=32)
def _captioned(height: int, width: int, texts: tuple[tuple[int, int, str], ...]) -> np.ndarray:
    """A white canvas with ``texts`` (top, left, text) written on it; kept per layout, read-only: copy it."""
    canvas = _caption(_canvas(height, width), texts)
    canvas.flags.writeable = False
    return canvas


@functools.lru_cache(maxsize=32)
def _legend(width: int, signed: bool, what: str) -> np.ndarray:
    """The colour bar and its description, without the scale's numbers; kept per layout, read-only."""
    bar_width = min(width - 120, 256)
    legend = _canvas(2 * _TEXT_ROW + 10, width)
    ramp = np.linspace(-1.0, 1.0, bar_width) if signed else np.linspace(0.0, 1.0, bar_width)
    colours = DIVERGING_LUT[_signed_level(ramp, 1.0)] if signed else _sequential(ramp, 1.0)
    legend[4:14, 60 : 60 + bar_width] = np.clip(colours, 0, 255).astype(np.uint8)[None, :, :]
    legend = _caption(legend, ((_TEXT_ROW + 4, 2, what),))
    legend.flags.writeable = False
    return legend


def _with_legend(body: np.ndarray, scale: float, *, signed: bool, what: str) -> np.ndarray:
    """``body`` above a colour bar with its ends written out, as uint8."""
    width = max(body.shape[1], 320)
    bar_width = min(width - 120, 256)
    legend = _legend(width, signed, what)
    low = f"{-scale:+.2e}" if signed else "0"
    high = f"{scale:+.2e}" if signed else f"{scale:.2e}"
    numbers = _caption(legend[:_NUMBER_ROWS].copy(), ((2, 2, low), (2, 64 + bar_width, high)))  # above the description
    canvas = _canvas(body.shape[0] + legend.shape[0] + _GAP, width)
    canvas[: body.shape[0], : body.shape[1]] = body
    canvas[body.shape[0] + _GAP :] = legend
    canvas[body.shape[0] + _GAP : body.shape[0] + _GAP + _NUMBER_ROWS] = numbers
    return canvas


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
