"""Drawing primitives: palette PNGs that decode to the picture drawn, and card-sized canvases."""

from __future__ import annotations

import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")

from PIL import Image  # noqa: E402

from lightning_ig.views.pictures.raster import CARD_HEIGHT, Canvas, card_sized, png_bytes  # noqa: E402


def _decode(data: bytes) -> tuple[str, np.ndarray]:
    image = Image.open(io.BytesIO(data))
    return image.mode, np.asarray(image.convert("RGB"))


def test_png_of_few_colours_is_a_palette_png_that_decodes_exactly():
    canvas = Canvas(120, 40)
    canvas.rectangle((10, 10, 60, 30), "#2166ac")
    canvas.text((65, 20), "x 0.5", anchor="lm")  # anti-aliased: a few dozen greys
    pixels = canvas.pixels
    mode, decoded = _decode(png_bytes(pixels))
    assert mode == "P"
    np.testing.assert_array_equal(decoded, pixels)


def test_png_of_a_saliency_picture_keeps_its_colours_close_in_a_third_of_the_bytes():
    from lightning_ig.views.pictures.saliency import saliency_grid

    rng = np.random.default_rng(0)  # noise frames and attributions: the most colours a saliency grid has
    states, attributions = rng.random((8, 4, 84, 84)), rng.standard_normal((8, 4, 84, 84))
    pixels = saliency_grid(states, attributions).pixels
    data = png_bytes(pixels)
    mode, decoded = _decode(data)
    assert mode == "P" and decoded.shape == pixels.shape
    error = np.abs(decoded.astype(int) - pixels.astype(int))
    assert error.mean() <= 4.0 and error.max() <= 32  # of 255 levels; the octree alone is 2.7 and 42 here
    rgb = io.BytesIO()
    Image.fromarray(pixels).save(rgb, format="PNG")
    assert len(data) < 0.5 * len(rgb.getvalue())


def test_text_is_drawn_without_matplotlib_with_pillows_own_font(monkeypatch):
    from lightning_ig.views.pictures import raster

    monkeypatch.setattr(raster, "_dejavu", lambda bold: None)  # as where matplotlib is not installed
    raster.font.cache_clear()
    raster._text_mask.cache_clear()
    try:
        canvas = Canvas(200, 40)
        canvas.text((10, 20), "pole angle 0.25", size=12, anchor="lm")
        ink = (canvas.pixels < 128).all(axis=-1)
        rows, columns = np.nonzero(ink)
        assert ink.sum() > 30 and columns.min() >= 9 and rows.min() >= 8 and rows.max() <= 32
        assert canvas.text_width("pole angle 0.25", size=12) > canvas.text_width("pole", size=12) > 0
    finally:
        raster.font.cache_clear()
        raster._text_mask.cache_clear()


def test_colours_are_read_from_hex_and_bad_ones_are_refused():
    from lightning_ig.views.pictures.raster import rgb

    assert rgb("#e69f00") == (230, 159, 0)
    with pytest.raises(ValueError, match="'#fff'"):
        rgb("#fff")
    with pytest.raises(ValueError, match="hexadecimal digits, got '#gg0000'"):
        rgb("#gg0000")


def test_categorical_colours_stay_distinct_past_the_eight_base_colours():
    from lightning_ig.views.pictures.raster import CATEGORICAL, categorical_colours

    colours = categorical_colours(24)
    assert colours[:8] == list(CATEGORICAL) and len(set(colours)) == 24


def test_text_is_cut_to_a_width_and_the_first_wording_that_fits_is_chosen():
    canvas = Canvas(10, 10)
    long = "pole angular velocity of the cart"
    cut = canvas.fit(long, 80, size=12)
    assert cut.endswith("…") and canvas.text_width(cut, size=12) <= 80
    assert canvas.fit("short", 80, size=12) == "short"
    assert canvas.first_fitting([long, "pole ang. vel."], 100, size=12) == "pole ang. vel."
    assert canvas.first_fitting([long, long], 100, size=12).endswith("…")


def test_card_sized_pads_short_pictures_with_white_below_and_leaves_tall_ones():
    short = np.zeros((180, 320, 3), dtype=np.uint8)
    padded = card_sized(short)
    assert padded.shape == (CARD_HEIGHT, 320, 3) and padded.dtype == np.uint8
    assert np.array_equal(padded[:180], short) and (padded[180:] == 255).all()  # the content stays on top
    tall = np.zeros((CARD_HEIGHT + 30, 320, 3), dtype=np.uint8)
    assert card_sized(tall) is tall
