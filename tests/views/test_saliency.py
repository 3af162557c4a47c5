"""Saliency pictures: sizes, dtype, the colour scale, and PNG files that honour the umask."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from PIL import Image

from lightning_ig.views.saliency import mean_abs_map, saliency_grid, saliency_kind, write_png


def test_kinds():
    assert saliency_kind((4, 84, 84)) == "image" and saliency_kind((2, 3, 8, 8)) == "image"
    assert saliency_kind((3, 50)) == "strip" and saliency_kind((128,)) is None


def test_grid_of_atari_frames_is_small_and_symmetric():
    rng = np.random.default_rng(0)
    states = rng.random((8, 4, 84, 84))
    attributions = np.zeros((8, 4, 84, 84))
    attributions[:, :, 10, 20] = 1.0  # +4 per state after the sum over channels
    attributions[:, :, 30, 40] = -2.0  # -8
    grid = saliency_grid(states, attributions)
    assert grid.pixels.dtype == np.uint8 and grid.pixels.ndim == 3 and grid.pixels.shape[2] == 3
    assert grid.pixels.shape[1] == 4 * 84 + 3 * 4  # 4 tiles across, 84 px frames as they are
    assert grid.scale == pytest.approx(8.0)  # the largest |map| (robust percentile of a sparse map: its maximum)
    # state 0's tile starts under a 14 px caption; the -8 pixel is full red, the +4 pixel half-way to blue
    negative = grid.pixels[14 + 30, 40].astype(float)
    positive = grid.pixels[14 + 10, 20].astype(float)
    assert negative[0] > 100 and negative[2] < 60  # red
    assert positive[2] > positive[0]  # blue
    assert np.allclose(
        negative, 0.1 * grey_at(states, 0, 30, 40) + 0.9 * np.array([0x67, 0x00, 0x1F]), atol=1.0
    )  # RdBu's darkest red


def grey_at(states: np.ndarray, index: int, row: int, column: int) -> float:
    mean = states[index].mean(0)
    return float((mean[row, column] - mean.min()) / (mean.max() - mean.min()) * 255.0)


def test_a_chosen_channel_and_fewer_states():
    rng = np.random.default_rng(1)
    grid = saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel=1)
    assert grid.pixels.shape[:2] == (
        80 + 14 + 4 + 38,
        320,
    )  # 3 tiles of 10 px frames enlarged 8x in one row; the colour bar is 320 wide
    with pytest.raises(ValueError, match="saliency_channel=2 is out of range for 2 channels"):
        saliency_grid(rng.random((3, 2, 10, 10)), rng.normal(size=(3, 2, 10, 10)), channel=2)
    with pytest.raises(ValueError, match="one shape"):
        saliency_grid(rng.random((3, 20)), rng.random((3, 20)))


def test_mean_abs_tiles_share_one_scale():
    values = np.zeros((3, 8, 8))
    values[2] = 1.0
    image = mean_abs_map(values, num_states=5)
    assert image.scale == pytest.approx(1.0)
    assert image.pixels.shape[:2] == (80 + 14 + 4 + 38, 320)  # 3 tiles of 80 px (8x8 enlarged 10x), caption, colour bar


def test_mean_abs_tiles_carry_the_channel_names():
    values = np.random.default_rng(3).random((3, 8, 8))
    default = mean_abs_map(values).pixels
    named = mean_abs_map(values, channel_names=["paddle", "ball", "brick"]).pixels
    assert named.shape == default.shape and not np.array_equal(named, default)  # the captions differ
    body = slice(14, 14 + 80)  # below the captions the tiles are the same pixels
    assert np.array_equal(named[body], default[body])
    with pytest.raises(ValueError, match="2 names for 3 channels"):
        mean_abs_map(values, channel_names=["a", "b"])


def test_write_png_round_trips_and_follows_the_umask(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    previous = os.umask(0o022)
    try:
        path = write_png(pixels, tmp_path / "sub" / "saliency.png")
    finally:
        os.umask(previous)
    assert np.array_equal(np.asarray(Image.open(path)), pixels)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
