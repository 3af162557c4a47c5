"""Saliency pictures that show the game: objects in their colours, markers of the signed attribution, one scale,
sized for TensorBoard's card; the mean |attr| map per channel, where each object is."""

from __future__ import annotations

import itertools
import os
import stat

import numpy as np
import pytest
from PIL import Image

from lightning_ig.views.pictures.frames import BORDER
from lightning_ig.views.pictures.raster import CARD_HEIGHT, CARD_WIDTH, DIVERGING_LUT, rgb
from lightning_ig.views.pictures.saliency import (
    _caption_lines,
    first_distinct,
    frame_colours,
    mean_abs_where_present,
    nice_scale,
    saliency_grid,
    saliency_kind,
    write_png,
)
from lightning_ig.views.pictures.saliency import (
    mean_abs_map as mean_abs_image,
)

NAMES = ["paddle", "ball", "trail", "brick"]
COLOURS = ["#e69f00", "#f0f0f0", "#8c8c8c", "#f0e442"]
GROUND = (38, 38, 38)


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


def test_the_grid_of_eight_minatar_frames_fits_the_card_and_shows_markers_of_each_sign():
    frames = breakout_frames()
    attributions = np.zeros_like(frames)
    attributions[:, 1, 5] = frames[:, 1, 5] * 0.4  # the ball raises the target
    attributions[:, 0, 9] = -frames[:, 0, 9] * 0.4  # the paddle lowers it
    grid = saliency_grid(
        frames,
        attributions,
        channel_names=NAMES,
        channel_colours=COLOURS,
        f_input=np.linspace(0.1, 0.8, 8),
        f_delta=np.linspace(0.0, 0.7, 8),
    )
    assert grid.pixels.dtype == np.uint8 and grid.pixels.shape[1] == CARD_WIDTH
    assert grid.pixels.shape[0] <= CARD_HEIGHT  # Time Series shows it at 1.0x: nothing is dropped
    assert grid.scale == pytest.approx(0.4)  # the robust end, already a round number
    blue, red = DIVERGING_LUT[255], DIVERGING_LUT[0]  # full markers: the darkest end of each sign
    colours = {tuple(int(v) for v in pixel) for pixel in grid.pixels.reshape(-1, 3)}
    assert tuple(int(v) for v in blue) in colours and tuple(int(v) for v in red) in colours


def test_a_marker_sits_inside_its_object_with_the_object_colour_around_it():
    frames = breakout_frames(1)
    attributions = np.zeros_like(frames)
    attributions[0, 1, 5, 2] = 1.0  # the ball only
    grid = saliency_grid(frames, attributions, channel_colours=COLOURS, columns=1)
    pixels = grid.pixels[:100].astype(int)  # the tile, above the legend (whose colour bar ends in the same blue)
    is_ball = np.all(pixels == rgb(COLOURS[1]), axis=2)
    is_marker = np.all(pixels == DIVERGING_LUT[255].astype(np.uint8).astype(int), axis=2)
    rows, cols = np.nonzero(is_marker)
    assert rows.size > 0
    top, bottom, left, right = rows.min(), rows.max(), cols.min(), cols.max()
    assert is_ball[top - 1, left] and is_ball[bottom + 1, right]  # a rim of the ball's colour around the marker


def test_the_values_under_the_tiles_are_written_below_each_tile():
    frames = breakout_frames()
    attributions = np.random.default_rng(0).normal(size=frames.shape).astype(np.float32) * frames
    plain = saliency_grid(frames, attributions).pixels
    ones = saliency_grid(frames, attributions, f_input=np.ones(8), f_delta=np.ones(8)).pixels
    twos = saliency_grid(frames, attributions, f_input=np.full(8, 2.0), f_delta=np.ones(8)).pixels
    assert ones.shape[0] > plain.shape[0]  # a caption row under each row of tiles, and a line saying what it is
    differs = np.nonzero(np.any(ones != twos, axis=(1, 2)))[0]
    tile_rows = 2 + 10 * 6  # the first row of tiles: border and 10 cells of 6 px
    assert differs.size and differs.min() >= tile_rows  # the numbers are under the tiles, not over them
    with pytest.raises(ValueError, match="f_delta has 3 values for 8 states"):
        saliency_grid(frames, attributions, f_delta=np.ones(3))


def _tiles_and_caption_bands(pixels: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The tiles' ``(left, right)`` columns (border included) and each row of tiles' caption band ``(top, bottom)``,
    found from the tiles' grey borders: full rows of border colour are the tiles' top and bottom edges."""
    border = np.all(pixels == rgb(BORDER), axis=2)
    first_row = int(np.nonzero(border.any(axis=1))[0][0])
    edges = np.flatnonzero(np.diff(np.concatenate([[0], border[first_row].astype(int), [0]])))
    tiles = [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a > 8]
    left, right = tiles[0]
    full = np.nonzero(border[:, left : right + 1].all(axis=1))[0]  # top and bottom edges of the first column's tiles
    tops, bottoms = full[0::2], full[1::2]
    pitch = int(tops[1] - tops[0])  # two rows of tiles at least
    bands = [(int(bottom) + 1, int(top) + pitch - 1) for top, bottom in zip(tops, bottoms, strict=True)]
    return tiles, bands


@pytest.mark.parametrize(
    ("f_input", "f_delta"),
    [
        (
            [0.011, -0.0093, 0.0042, 0.0107, -0.011, 0.0, 0.0099, 0.0051],
            [0.06, -0.047, 0.0588, -0.0599, 0.01] + [0.02] * 3,
        ),
        ([-0.0011, 0.0009, -0.00096] + [-0.0011] * 5, [-0.006, 0.0048, -0.0059] + [0.006] * 5),  # two lines
        ([-12345.6, 9876.5, -10000.0] + [123.0] * 5, [-54321.0, 12.0, -99999.0] + [1.0] * 5),  # two lines, no zeros
        ([0.32, -0.45, 0.5, 0.29, 0.37, 0.22, 0.28, -0.4], [0.21, -0.39, 0.11, 0.29, 0.27, 0.19, 0.17, -0.34]),
    ],
)
def test_every_caption_inks_inside_its_tiles_slot_clear_of_its_neighbours_and_of_the_edges(f_input, f_delta):
    frames = breakout_frames()
    attributions = frames * np.float32(0.3)
    pixels = saliency_grid(frames, attributions, f_input=np.array(f_input), f_delta=np.array(f_delta)).pixels
    assert pixels.shape[1] == CARD_WIDTH and pixels.shape[0] <= CARD_HEIGHT
    tiles, bands = _tiles_and_caption_bands(pixels.astype(int))
    assert len(tiles) == 4 and len(bands) == 2
    # a slot reaches halfway to the neighbouring tiles (to the card's edges for the outer ones)
    bounds = [0] + [(right + left) // 2 for (_, right), (left, _) in itertools.pairwise(tiles)] + [pixels.shape[1] - 1]
    for top, bottom in bands:
        ink = np.any(pixels[top : bottom + 1] < 200, axis=2)  # dark grey text on white
        assert not ink[-1].any()  # clear of the next row of tiles
        columns = ink.any(axis=0)
        assert not columns[0] and not columns[-1]  # nothing cut by the card's edge
        for index, (left, right) in enumerate(tiles):
            assert not columns[bounds[index] - 1 : bounds[index] + 2].any() or index == 0  # clear of the neighbour
            inked = np.nonzero(columns[bounds[index] : bounds[index + 1] + 1])[0] + bounds[index]
            assert inked.size  # a caption under every tile
            centre = (left + right) / 2  # a caption spilling into the next slot would pull its ink off-centre
            assert abs((inked.min() + inked.max()) / 2 - centre) <= 1.5, (index, inked.min(), inked.max(), centre)


def test_captions_drop_the_leading_zero_before_taking_a_second_line_and_keep_their_digits():
    one_line = _caption_lines(np.array([0.32, -0.05]), np.array([0.21, -0.4]), room=72)
    assert one_line == [("0.32 +0.21",), ("-0.05 -0.40",)]
    short = _caption_lines(np.array([0.011, -0.0093]), np.array([0.06, -0.047]), room=72)
    assert short == [(".011 +.060",), ("-.009 -.047",)]  # two significant digits of each column's largest
    two = _caption_lines(np.array([-0.0011, 0.0009]), np.array([-0.006, 0.0048]), room=72)
    assert two == [("-0.0011", "-0.0060"), ("0.0009", "+0.0048")]
    cut = _caption_lines(np.array([-12345.6]), np.array([-54321.0]), room=30)
    assert cut is not None and all(text.endswith("…") for text in cut[0])
    assert _caption_lines(None, None, room=72) is None


def test_two_line_captions_make_room_by_smaller_cells_and_the_grid_stays_on_the_card():
    frames = breakout_frames()
    attributions = frames * np.float32(0.3)
    one = saliency_grid(frames, attributions, f_input=np.full(8, 0.3), f_delta=np.full(8, 0.2)).pixels
    two = saliency_grid(frames, attributions, f_input=np.full(8, -0.0011), f_delta=np.full(8, 0.006)).pixels
    assert one.shape[0] <= CARD_HEIGHT and two.shape[0] <= CARD_HEIGHT
    (one_tile, _), (two_tile, _) = _tiles_and_caption_bands(one.astype(int)), _tiles_and_caption_bands(two.astype(int))
    assert one_tile[0][1] - one_tile[0][0] == 10 * 6 + 1  # MinAtar's 10 cells of 6 px with one caption line
    assert two_tile[0][1] - two_tile[0][0] < one_tile[0][1] - one_tile[0][0]


def test_a_changed_scale_is_pointed_out_and_a_steady_one_is_not():
    frames = breakout_frames()
    attributions = frames * 0.3
    grid = saliency_grid(frames, attributions)
    steady = saliency_grid(frames, attributions, previous_scale=grid.scale * 1.2).pixels
    assert np.array_equal(steady, grid.pixels)
    moved = saliency_grid(frames, attributions, previous_scale=grid.scale * 2).pixels
    assert not np.array_equal(steady, moved)


def test_scales_round_up_to_a_few_steps_per_decade():
    assert [nice_scale(v) for v in (0.445, 0.4, 0.0123, 7.0, 9.1)] == pytest.approx([0.5, 0.4, 0.015, 8.0, 10.0])
    assert nice_scale(0.0) == 1.0 and nice_scale(float("nan")) == 1.0


def test_large_frames_are_pooled_so_that_the_attributions_still_add_up():
    rng = np.random.default_rng(1)
    states = rng.random((8, 4, 84, 84)).astype(np.float32)
    attributions = np.zeros_like(states)
    attributions[:, 0, 10, 10] = 0.5  # two pixels of one 2x2 block: +1 together
    attributions[:, 1, 11, 11] = 0.5
    grid = saliency_grid(states, attributions)
    assert grid.pixels.shape[1] == CARD_WIDTH and grid.pixels.shape[0] <= CARD_HEIGHT
    assert grid.scale == pytest.approx(1.0)  # the pooled block holds the sum


def test_a_chosen_channel_and_argument_errors():
    rng = np.random.default_rng(1)
    grid = saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel=1)
    assert grid.pixels.shape[1] == CARD_WIDTH
    with pytest.raises(ValueError, match="saliency_channel=2 is out of range for 2 channels"):
        saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel=2)
    with pytest.raises(ValueError, match="one shape"):
        saliency_grid(rng.random((3, 20)), rng.random((3, 20)))
    with pytest.raises(ValueError, match="channel_colours has 1 colours for 2 channels"):
        saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel_colours=["#ffffff"])
    with pytest.raises(ValueError, match="'#fff'"):
        saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel_colours=["#fff", "#000"])


def test_signals_are_heat_strips():
    rng = np.random.default_rng(2)
    grid = saliency_grid(rng.random((3, 2, 40)), rng.normal(size=(3, 2, 40)))
    assert grid.pixels.shape[1] == CARD_WIDTH and grid.pixels.dtype == np.uint8


def test_first_distinct_skips_repeated_frames():
    frames = breakout_frames(5)
    repeated = np.concatenate([frames[:2], frames[:1], frames[2:]])  # state 2 repeats state 0
    assert first_distinct(repeated, 8).tolist() == [0, 1, 3, 4, 5]
    assert first_distinct(repeated, 2).tolist() == [0, 1]


def test_mean_abs_where_present_matches_the_mean_over_the_states_with_the_object():
    rng = np.random.default_rng(3)
    states = (rng.random((50, 2, 4, 4)) < 0.2).astype(np.float32)
    attributions = rng.normal(size=states.shape) * states + rng.normal(size=states.shape) * 0.01
    means, presence = mean_abs_where_present(states, attributions)
    for index in np.ndindex(states.shape[1:]):
        present = states[(slice(None), *index)] != 0
        assert presence[index] == present.mean()
        if present.any():
            expected = np.abs(attributions[(slice(None), *index)][present]).mean()
            assert means[index] == pytest.approx(expected, rel=8 * np.finfo(np.float64).eps)
        else:
            assert np.isnan(means[index])


def test_mean_abs_tiles_each_have_their_own_scale_and_grey_where_the_object_never_is():
    values = np.zeros((2, 4, 4))
    values[0] = 10.0  # a large channel
    values[1, 0, 0] = 0.01  # a small one: still reaches the top colour of its own scale
    presence = np.ones((2, 4, 4))
    presence[1, 3, 3] = 0.0
    image = mean_abs_image(values, 5, ["brick", "ball"], presence=presence)
    assert image.scales == pytest.approx((10.0, 0.01))
    assert image.pixels.shape[1] == CARD_WIDTH and image.pixels.shape[0] <= CARD_HEIGHT
    colours = {tuple(int(v) for v in p) for p in image.pixels.reshape(-1, 3)}
    assert (217, 217, 217) in colours  # the never-present pixel
    assert tuple(int(v) for v in np.round(np.asarray(_viridis_top()))) in colours


def _viridis_top() -> np.ndarray:
    from lightning_ig.views.pictures.raster import SEQUENTIAL_LUT

    return SEQUENTIAL_LUT[255]


def test_mean_abs_tiles_carry_the_channel_names():
    values = np.random.default_rng(3).random((3, 8, 8))
    default = mean_abs_image(values).pixels
    named = mean_abs_image(values, channel_names=["paddle", "ball", "brick"]).pixels
    assert named.shape == default.shape and not np.array_equal(named, default)
    with pytest.raises(ValueError, match="2 names for 3 channels"):
        mean_abs_image(values, channel_names=["a", "b"])
    with pytest.raises(ValueError, match="presence has shape"):
        mean_abs_image(values, presence=np.ones((2, 8, 8)))


def test_write_png_round_trips_and_follows_the_umask(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    previous = os.umask(0o022)
    try:
        path = write_png(pixels, tmp_path / "sub" / "saliency.png")
    finally:
        os.umask(previous)
    assert np.array_equal(np.asarray(Image.open(path)), pixels)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
