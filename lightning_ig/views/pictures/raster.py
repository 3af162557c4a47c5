"""Drawing on pixel arrays: the card size, fonts, colour tables, text, tick values and compact PNGs.

Every picture the callback logs (the cards and the saliency pictures) is drawn straight into an ``(H, W, 3)`` uint8
array with numpy and Pillow: a plotting library's layout engine costs far more per chart (``docs/benchmarks.md``).
:func:`png_bytes` stores a picture with at most 256 colours (a palette PNG): a third of the bytes of an RGB one, which
matters because TensorBoard's event writer checksums every byte in Python.

Sizes are set by where TensorBoard shows a picture: a :data:`CARD_WIDTH` x :data:`CARD_HEIGHT` picture is bound by the
height of Time Series' image box and so shown at exactly 1.0x from a 1280 px window up (:func:`card_sized` pads shorter
ones; the measurements: ``docs/reading-tensorboard.md``). Text is drawn at the size it is read (:data:`TEXT_SIZE` and
up: a cap height of 9 px or more on screen).
"""

from __future__ import annotations

import functools
import importlib.util
import io
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CARD_HEIGHT",
    "CARD_WIDTH",
    "CATEGORICAL",
    "DIVERGING_LUT",
    "NEGATIVE",
    "POSITIVE",
    "SEQUENTIAL_LUT",
    "SMALL_SIZE",
    "TEXT_SIZE",
    "TITLE_SIZE",
    "Canvas",
    "card_sized",
    "categorical_colours",
    "font",
    "png_bytes",
    "rgb",
]

# ColorBrewer RdBu (11 classes), negative (red) to positive (blue); viridis anchors for magnitudes.
_DIVERGING = [
    "#67001f",
    "#b2182b",
    "#d6604d",
    "#f4a582",
    "#fddbc7",
    "#f7f7f7",
    "#d1e5f0",
    "#92c5de",
    "#4393c3",
    "#2166ac",
    "#053061",
]
_SEQUENTIAL = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]

CARD_WIDTH = 320
CARD_HEIGHT = 215
# DejaVu Sans: cap heights 9 px (12 and 13 px), 11 px (15 px).
SMALL_SIZE = 12  # tick values, captions under tiles
TEXT_SIZE = 13  # labels, legends
TITLE_SIZE = 15  # titles and the verdict, bold
# The sign of an attribution, everywhere: ColorBrewer RdBu's ends (readable for most colour-blind viewers).
POSITIVE = "#2166ac"
NEGATIVE = "#b2182b"
# Categorical colours for channels and groups, drawn on the dark ground of a frame with blue and red attribution
# markers over them: Okabe and Ito's colour-blind-safe set less its blues and reds (the markers' colours), with white
# and grey; ordered so that MinAtar's Breakout and Asterix read naturally (paddle or player orange, ball white, its
# trail grey: a dimmer ball, bricks or gold yellow), then green, purple, and the blue and vermillion last.
CATEGORICAL = ("#e69f00", "#f0f0f0", "#8c8c8c", "#f0e442", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")


def rgb(colour: str) -> tuple[int, int, int]:
    """``"#rrggbb"`` -> ``(r, g, b)``; a ``ValueError`` for a ``colour`` not of that form."""
    text = str(colour)
    if len(text) != 7 or text[0] != "#":
        raise ValueError(f"a colour is written '#rrggbb', got {text!r}")
    try:
        return int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16)
    except ValueError:
        raise ValueError(f"a colour is written '#rrggbb' in hexadecimal digits, got {text!r}") from None


def categorical_colours(count: int) -> list[str]:
    """``count`` distinct colours from :data:`CATEGORICAL`; past eight, lighter and darker variants of them."""
    colours = []
    for index in range(count):
        base = np.array(rgb(CATEGORICAL[index % len(CATEGORICAL)]), dtype=np.float64)
        if cycle := index // len(CATEGORICAL):  # alternately mixed with white and with black, further each cycle
            mix = np.array([255.0] * 3 if cycle % 2 else [0.0] * 3)
            base = base + (mix - base) * min(0.2 * ((cycle + 1) // 2), 0.6)
        colours.append("#" + "".join(f"{round(v):02x}" for v in base))
    return colours


def _lut(anchors: list[str]) -> np.ndarray:
    """A (256, 3) float32 table interpolated between the anchor colours."""
    colours = np.array([[int(c[i : i + 2], 16) for i in (1, 3, 5)] for c in anchors], dtype=np.float64)
    positions, grid = np.linspace(0.0, 1.0, len(anchors)), np.linspace(0.0, 1.0, 256)
    return np.stack([np.interp(grid, positions, colours[:, k]) for k in range(3)], axis=1).astype(np.float32)


DIVERGING_LUT = _lut(_DIVERGING)
SEQUENTIAL_LUT = _lut(_SEQUENTIAL)


def _dejavu(bold: bool) -> Path | None:
    """DejaVu Sans from a matplotlib installation (found without importing matplotlib), if there is one."""
    if (spec := importlib.util.find_spec("matplotlib")) is None or not spec.submodule_search_locations:
        return None
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    path = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf" / name
    return path if path.is_file() else None


@functools.lru_cache(maxsize=16)
def font(size: int, bold: bool = False) -> Any:
    """A Pillow font of ``size`` pixels: DejaVu Sans where matplotlib brings it, else Pillow's own scalable font."""
    from PIL import ImageFont  # noqa: PLC0415 - loaded when the first picture is drawn

    if (path := _dejavu(bold)) is not None:
        try:  # the basic layout: plain left-to-right labels need no shaping engine, which costs more per string
            return ImageFont.truetype(str(path), size, layout_engine=ImageFont.Layout.BASIC)
        except (OSError, ImportError):  # a Pillow built without FreeType
            pass
    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1
    except TypeError:
        return ImageFont.load_default()


class Canvas:
    """An RGB picture to draw shapes and text on; :attr:`pixels` is the ``(H, W, 3)`` uint8 result.

    Args:
        width: pixels across.
        height: pixels down.
        background: the colour it starts as (default white).
    """

    def __init__(self, width: int, height: int, background: str = "white") -> None:
        from PIL import Image, ImageDraw  # noqa: PLC0415

        self.image = Image.new("RGB", (int(width), int(height)), background)
        self.draw = ImageDraw.Draw(self.image)

    @property
    def pixels(self) -> np.ndarray:
        """The picture as an ``(H, W, 3)`` uint8 array."""
        return np.asarray(self.image)

    def text(
        self,
        xy: tuple[float, float],
        text: str,
        *,
        size: int = 12,
        colour: str = "#222222",
        anchor: str = "la",
        bold: bool = False,
    ) -> None:
        """Write ``text`` at ``xy``; ``anchor`` is Pillow's (``"la"``: left, ascender; ``"rm"``: right, middle; ...)."""
        mask, left, top = _text_mask(text, size, bold, anchor)
        if mask is not None:
            x, y = round(xy[0]) + left, round(xy[1]) + top
            self.image.paste(colour, (x, y, x + mask.width, y + mask.height), mask)

    def text_width(self, text: str, *, size: int = 12, bold: bool = False) -> float:
        """How wide ``text`` is in pixels."""
        return float(self.draw.textlength(text, font=font(size, bold)))

    def rectangle(self, box: tuple[float, float, float, float], colour: str | tuple[int, ...]) -> None:
        """Fill ``box`` = ``(left, top, right, bottom)``, edges included."""
        self.draw.rectangle(box, fill=colour)

    def outline(
        self, box: tuple[float, float, float, float], colour: str | tuple[int, int, int], width: int = 1
    ) -> None:
        """Draw the edges of ``box`` = ``(left, top, right, bottom)``, ``width`` pixels inwards."""
        self.draw.rectangle(box, outline=colour, width=width)

    def first_fitting(self, texts: list[str], width: float, *, size: int = 12, bold: bool = False) -> str:
        """The first of ``texts`` (longest wording first) no wider than ``width``; else the last, cut to fit."""
        for text in texts:
            if self.text_width(text, size=size, bold=bold) <= width:
                return text
        return self.fit(texts[-1], width, size=size, bold=bold)

    def fit(self, text: str, width: float, *, size: int = 12, bold: bool = False) -> str:
        """``text``, cut with an ellipsis where it is wider than ``width`` pixels."""
        if self.text_width(text, size=size, bold=bold) <= width:
            return text
        while len(text) > 1 and self.text_width(text + "…", size=size, bold=bold) > width:
            text = text[:-1]
        return text.rstrip() + "…"

    def line(self, points: list[tuple[float, float]], colour: str = "#444444", width: int = 1) -> None:
        """A polyline through ``points``."""
        self.draw.line(points, fill=colour, width=width)

    def paste(self, pixels: np.ndarray, left: int, top: int) -> None:
        """Copy an ``(h, w, 3)`` uint8 array onto the picture at ``(left, top)``."""
        from PIL import Image  # noqa: PLC0415

        self.image.paste(Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)), (int(left), int(top)))


@functools.lru_cache(maxsize=2048)
def _text_mask(text: str, size: int, bold: bool, anchor: str) -> tuple[Any, int, int]:
    """The anti-aliased coverage of ``text`` (a Pillow "L" image, or ``None`` if empty) and its offset from the anchor.
    Rendered once per string and kept: a chart's labels, ticks and captions recur from run to run."""
    from PIL import Image, ImageDraw  # noqa: PLC0415

    left, top, right, bottom = font(size, bold).getbbox(text, anchor=anchor)
    if right <= left or bottom <= top:
        return None, 0, 0
    mask = Image.new("L", (right - left, bottom - top), 0)
    ImageDraw.Draw(mask).text((-left, -top), text, fill=255, font=font(size, bold), anchor=anchor)
    return mask, left, top


def card_sized(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` with white rows added at the bottom up to :data:`CARD_HEIGHT` (taller pictures as they are).

    Time Series scales a picture to fit its image box (215 px high, 324 px wide or more): a shorter picture is
    bound by the box's width and enlarged a little, unevenly (``pixelated``); one exactly as high as the box is
    bound by its height and shown at 1.0x. The content stays at the top, so titles line up across a row of cards.
    """
    height = pixels.shape[0]
    if height >= CARD_HEIGHT:
        return pixels
    white = np.full((CARD_HEIGHT - height, *pixels.shape[1:]), 255, dtype=pixels.dtype)
    return np.concatenate([pixels, white], axis=0)


def png_bytes(pixels: np.ndarray) -> bytes:
    """An ``(H, W, 3)`` uint8 picture as a PNG of at most 256 colours.

    Pictures of few colours are stored exactly. A picture of more colours (saliency maps, anti-aliased text) gets a
    palette of 256 from Pillow's fast octree, and each pixel the nearest of them (a few levels of 255 off on noisy
    saliency frames). Compared with an RGB PNG, a third of the bytes.
    """
    from PIL import Image  # noqa: PLC0415

    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8))
    if (colours := image.getcolors(256)) is None:
        octree = image.quantize(256, method=Image.Quantize.FASTOCTREE)
        palette = image.quantize(palette=octree, dither=Image.Dither.NONE)  # the nearest colour: half the worst error
    else:
        palette = _exact_palette(image, colours)
    buffer = io.BytesIO()
    # zlib at its fastest: a few KB more than level 6, half the time
    palette.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _exact_palette(image: Any, colours: list[Any]) -> Any:
    """``image`` (at most 256 colours) as a palette image that holds each colour exactly."""
    from PIL import Image  # noqa: PLC0415

    table = np.array([colour for _, colour in colours], dtype=np.uint8)  # (K, 3)
    pixels = np.asarray(image)
    keys = (pixels[..., 0].astype(np.uint32) << 16) | (pixels[..., 1].astype(np.uint32) << 8) | pixels[..., 2]
    table_keys = (table[:, 0].astype(np.uint32) << 16) | (table[:, 1].astype(np.uint32) << 8) | table[:, 2]
    order = np.argsort(table_keys)
    indices = order[np.searchsorted(table_keys[order], keys)].astype(np.uint8)
    palette = Image.frombytes("P", (pixels.shape[1], pixels.shape[0]), indices.tobytes())
    palette.putpalette(table.reshape(-1).tolist())
    return palette
