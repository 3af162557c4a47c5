"""Saliency pictures that show the game at 1.0x: objects in their colours, a square of each cell's signed
attribution inside it, one scale; the mean |attr| map per channel; the PNG file."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from PIL import Image

from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, DIVERGING_LUT, SEQUENTIAL_LUT, rgb
from lightning_ig.views.pictures.saliency import (
    GRID_FRAMES,
    first_distinct,
    frame_colours,
    mean_abs_map,
    nice_scale,
    saliency_grid,
    saliency_kind,
    write_png,
)

NAMES = ["paddle", "ball", "trail", "brick"]
COLOURS = ["#e69f00", "#f0f0f0", "#8c8c8c", "#f0e442"]
GROUND = (38, 38, 38)
FULL_BLUE, FULL_RED = (tuple(int(v) for v in DIVERGING_LUT[end]) for end in (255, 0))


def breakout_frames(count: int = 8) -> np.ndarray:
    """MinAtar-like (count, 4, 10, 10) 0/1 frames: bricks in rows 1-3, the ball and its trail moving, the paddle."""
    frames = np.zeros((count, 4, 10, 10), dtype=np.float32)
    for index in range(count):
        frames[index, 3, 1:4] = 1.0  # bricks
        frames[index, 0, 9, index % 10] = 1.0  # paddle
        frames[index, 1, 5, (index + 2) % 10] = 1.0  # ball
        frames[index, 2, 4, (index + 1) % 10] = 1.0  # trail
    frames[0, 2, 3, 0] = 1.0  # state 0: a trail cell over a brick
    return frames


def _where(pixels: np.ndarray, colour: tuple[int, ...]) -> np.ndarray:
    return np.all(pixels == np.asarray(colour, dtype=np.uint8), axis=2)


def test_kinds():
    assert saliency_kind((4, 84, 84)) == "image" and saliency_kind((2, 3, 8, 8)) == "image"
    assert saliency_kind((3, 50)) == "strip" and saliency_kind((128,)) is None


def test_objects_are_drawn_in_their_colours_the_rarest_on_top_on_one_scale_for_all_frames():
    frames = breakout_frames(2)
    colours = np.array([rgb(c) for c in COLOURS], dtype=np.float64)
    pixels = frame_colours(frames, colours)  # (2, 10, 10, 3)
    assert tuple(pixels[0, 9, 0]) == rgb(COLOURS[0])  # paddle
    assert tuple(pixels[0, 5, 2]) == rgb(COLOURS[1])  # ball
    assert tuple(pixels[0, 2, 5]) == rgb(COLOURS[3])  # brick
    assert tuple(pixels[0, 3, 0]) == rgb(COLOURS[2])  # the trail over a brick: the rarer object shows
    assert tuple(pixels[0, 7, 7]) == GROUND  # nothing there: the dark ground, never a colour
    assert np.array_equal(pixels[0, 1:3], pixels[1, 1:3])  # bricks look alike in every tile (no per-tile stretch)


def test_intensity_channels_mix_their_colours_by_value():
    frames = np.zeros((1, 2, 2, 2), dtype=np.float32)
    frames[0, 0, 0, 0] = 1.0  # channel 0 alone, full
    frames[0, :, 0, 1] = [0.5, 0.5]  # both at half
    frames[0, 1, 1, 0] = 1.0  # both channels span 0 to 1 over the frames
    frames[0, 1, 1, 1] = 0.25  # a third value: channels of intensities, not objects
    colours = np.array([[200.0, 0.0, 0.0], [0.0, 0.0, 200.0]])
    pixels = frame_colours(frames, colours).astype(float)
    assert np.allclose(pixels[0, 0, 0], [200, 0, 0], atol=1)
    mixed = np.array(GROUND) + (np.array([100.0, 0.0, 100.0]) - np.array(GROUND)) * 0.5
    assert np.allclose(pixels[0, 0, 1], mixed, atol=1)


def test_a_minatar_cell_is_at_least_8_screen_pixels_with_its_signed_square_inside():
    frames = breakout_frames()
    attributions = np.zeros_like(frames)
    attributions[:, 1, 5] = frames[:, 1, 5] * 0.4  # the ball raises the target
    attributions[:, 0, 9] = -frames[:, 0, 9] * 0.4  # the paddle lowers it
    grid = saliency_grid(
        frames, attributions, channel_names=NAMES, channel_colours=COLOURS, f_input=np.ones(8), f_delta=np.ones(8)
    )
    assert grid.pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3)  # Time Series shows it at 1.0x: no cell is scaled down
    assert grid.scale == pytest.approx(0.4)  # the robust end, already a round number
    blue, red, ball = (
        _where(grid.pixels, FULL_BLUE),
        _where(grid.pixels, FULL_RED),
        _where(grid.pixels, rgb(COLOURS[1])),
    )
    half, third = CARD_HEIGHT // 2, CARD_WIDTH // 3
    for marker in (blue, red):  # a full square in every frame: three frames above, two below (and the legend)
        assert all(marker[:half, k * third : (k + 1) * third].any() for k in range(3))
        assert all(marker[half:, k * third : (k + 1) * third].any() for k in range(2))
    rows, columns = np.nonzero(blue)
    first = (columns < third) & (rows < half)  # the first frame's square: the ball's cell, a rim of the ball around
    top, bottom, left, right = rows[first].min(), rows[first].max(), columns[first].min(), columns[first].max()
    side = right - left + 1
    assert side == bottom - top + 1 and side + 2 >= 8  # the cell: the square and its rim, >= 8 screen pixels
    assert ball[top - 1, left] and ball[bottom + 1, right] and ball[top, left - 1] and ball[bottom, right + 1]
    assert GRID_FRAMES == 5


def test_the_values_under_the_frames_and_a_changed_scale_are_written():
    frames = breakout_frames()
    attributions = frames * 0.3
    ones = saliency_grid(frames, attributions, f_input=np.ones(8), f_delta=np.ones(8))
    twos = saliency_grid(frames, attributions, f_input=np.full(8, 2.0), f_delta=np.ones(8))
    assert not np.array_equal(ones.pixels, twos.pixels)
    below = {"f_input": np.ones(8), "f_delta": np.ones(8)}  # with the values under the frames, as the callback draws
    steady = saliency_grid(frames, attributions, previous_scale=ones.scale * 1.2, **below).pixels
    assert np.array_equal(steady, ones.pixels)
    # guards against: the "(was ±...)" line placed after the captions' two lines, past the card's foot, never drawn
    assert not np.array_equal(
        steady, saliency_grid(frames, attributions, previous_scale=ones.scale * 2, **below).pixels
    )
    with pytest.raises(ValueError, match="got 3 values under the frames for 8 frames"):
        saliency_grid(frames, attributions, f_input=np.ones(3))


def test_the_title_keeps_whole_words_where_the_baseline_does_not_fit(monkeypatch):
    # guards against: target="each"'s grid titled "blue raises Q(s, a) (mean over a), red lowers it, v..." (cut)
    from lightning_ig.views.pictures.raster import Canvas

    drawn: list[str] = []
    original = Canvas.text

    def recording(self, xy, text, **kwargs):
        drawn.append(text)
        return original(self, xy, text, **kwargs)

    monkeypatch.setattr(Canvas, "text", recording)
    frames = breakout_frames()
    saliency_grid(frames, frames * 0.3, target_label="Q(s, a) (mean over a)", baseline_label="the all-zero frame")
    assert " lowers it" in drawn and not any(text.endswith("…") for text in drawn[:4])
    drawn.clear()
    saliency_grid(frames, frames * 0.3, target_label="V(s)", baseline_label="the all-zero frame")
    assert " lowers it, vs the all-zero frame" in drawn  # where it fits, the baseline is said


def test_scales_round_up_to_a_few_steps_per_decade():
    assert [nice_scale(v) for v in (0.445, 0.4, 0.0123, 7.0, 9.1)] == pytest.approx([0.5, 0.4, 0.015, 8.0, 10.0])
    assert nice_scale(0.0) == 1.0 and nice_scale(float("nan")) == 1.0


def test_large_frames_are_pooled_so_that_the_attributions_still_add_up():
    rng = np.random.default_rng(1)
    states = rng.random((5, 4, 84, 84)).astype(np.float32)
    attributions = np.zeros_like(states)
    attributions[:, 0, 10, 10] = 0.5  # two pixels of one block: +1 together
    attributions[:, 1, 11, 11] = 0.5
    grid = saliency_grid(states, attributions)
    assert grid.pixels.shape == (CARD_HEIGHT, CARD_WIDTH, 3)
    assert grid.scale == pytest.approx(1.0)  # the pooled block holds the sum


def test_a_chosen_channel_and_argument_errors():
    rng = np.random.default_rng(1)
    grid = saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel=1)
    assert grid.pixels.shape[1] == CARD_WIDTH
    with pytest.raises(ValueError, match="saliency_channel=2 is out of range for 2 channels"):
        saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel=2)
    with pytest.raises(ValueError, match="one shape"):
        saliency_grid(rng.random((3, 20)), rng.random((3, 20)))
    with pytest.raises(ValueError, match="got 1 channel colours and 2 channel names for 2 channels"):
        saliency_grid(
            rng.random((3, 2, 10, 10)),
            rng.normal(size=(3, 2, 10, 10)),
            channel_colours=["#ffffff"],
            channel_names=["a", "b"],
        )


def test_signals_are_heat_strips():
    rng = np.random.default_rng(2)
    grid = saliency_grid(rng.random((3, 2, 40)), rng.normal(size=(3, 2, 40)))
    assert grid.pixels.shape[1] == CARD_WIDTH and grid.pixels.dtype == np.uint8


@pytest.mark.parametrize("shape", [(2, 1, 30), (2, 30, 1)])
def test_frames_one_cell_high_or_wide_are_the_strips_of_their_signal(shape):
    """A (C, 1, W) or (C, H, 1) frame is a 1-d signal: drawn as its (C, L) heat strips, not as frames of 3-pixel cells
    with 1-pixel squares."""
    rng = np.random.default_rng(2)
    states, attributions = rng.random((5, 2, 30)), rng.normal(size=(5, 2, 30))
    strips = saliency_grid(states, attributions).pixels
    assert np.array_equal(saliency_grid(states.reshape(5, *shape), attributions.reshape(5, *shape)).pixels, strips)


def test_first_distinct_skips_repeated_frames():
    frames = breakout_frames(5)
    repeated = np.concatenate([frames[:2], frames[:1], frames[2:]])  # state 2 repeats state 0
    assert first_distinct(repeated, 8).tolist() == [0, 1, 3, 4, 5]
    assert first_distinct(repeated, 2).tolist() == [0, 1]


def test_mean_abs_tiles_each_have_their_own_scale():
    values = np.zeros((2, 4, 4))
    values[0] = 10.0  # a large channel
    values[1, 0, 0] = 0.01  # a small one: still reaches the top colour of its own scale
    image = mean_abs_map(values, 5, ["brick", "ball"])
    assert image.scales == pytest.approx((10.0, 0.01))
    assert image.pixels.shape[1] == CARD_WIDTH
    colours = {tuple(int(v) for v in p) for p in image.pixels.reshape(-1, 3)}
    assert tuple(int(v) for v in SEQUENTIAL_LUT[255]) in colours
    with pytest.raises(ValueError, match="2 channel names for 3 channels"):
        mean_abs_map(np.ones((3, 8, 8)), channel_names=["a", "b"])


def test_write_png_round_trips_and_follows_the_umask(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    previous = os.umask(0o022)
    try:
        path = write_png(pixels, tmp_path / "sub" / "saliency.png")
    finally:
        os.umask(previous)
    assert np.array_equal(np.asarray(Image.open(path)), pixels)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_the_two_captions_under_a_frame_share_their_decimals_so_they_subtract_to_one_baseline_value():
    from lightning_ig.views.pictures.saliency import _captions

    # F(b) = 1.04, 0.6 and 1.8: was "3 +2.0", "-8 -8.6", "11 +9.6", whose differences read 1, 0.6 and 1.4
    lines = _captions(np.array([3.04, -8.0, 11.4]), np.array([2.0, -8.6, 9.6]), 3)
    assert lines == ["3.0 +2.0", "-8.0 -8.6", "11.4 +9.6"]
    assert _captions(np.array([250.0, np.nan]), None, 2) == ["250", "nan"]  # one column: its own two digits
    # where the shared decimals do not fit under the frame, each column keeps its own two digits (never "+0")
    assert _captions(np.array([-0.0446]), np.array([0.0031]), 1) == ["-0.0446 +0.0031"]
    assert _captions(np.array([-0.0446]), np.array([0.0031]), 1, fits=lambda line: len(line) <= 14) == [
        "-0.045 +0.0031"
    ]
    assert _captions(np.array([-123.0]), np.array([0.0012]), 1, fits=lambda line: len(line) <= 14) == ["-123 +0.0012"]
