"""TensorBoard's record checksum in numpy (views/checksum.py): the same number as TensorBoard's, the same file bytes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest

from lightning_ig.views.checksum import crc32c, masked_crc32c, speed_up

pytest.importorskip("tensorboard")

from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboards
from torch.utils.tensorboard import SummaryWriter


def test_the_check_value_of_crc32c() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C (Castagnoli)
    assert crc32c(b"") == 0


@pytest.mark.parametrize("size", [*range(70), 1535, 1536, 1537, 4095, 4096, 16384, 16385, 65537, 262145, 300001])
def test_the_masked_checksum_is_tensorboards(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert masked_crc32c(data) == tensorboards(data)


def test_runs_of_one_byte_and_zeros_are_checksummed_as_tensorboard_does() -> None:
    for data in (b"\0" * 5000, b"\xff" * 5000, b"\0" * 2000 + b"\x01", b"\x01" + b"\0" * 70000):
        assert masked_crc32c(data) == tensorboards(data)


def _write(folder: Path, fast: bool) -> bytes:
    writer = SummaryWriter(str(folder))
    if fast:
        assert speed_up(writer)
    for step in range(3):
        writer.add_scalar("a/b", 0.5 * step, step, walltime=100.0 + step)
        writer.add_text("t", "x" * 3000 + str(step), step, walltime=100.0 + step)  # past the byte loop's size
        writer.add_histogram("h", np.arange(500.0) * (step + 1), step, walltime=100.0 + step)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path.read_bytes()


def test_a_sped_up_writer_writes_the_same_bytes(tmp_path: Path) -> None:
    slow, fast = _write(tmp_path / "slow", False), _write(tmp_path / "fast", True)
    header = 8 + 4 + int.from_bytes(slow[:8], "little") + 4  # the first record: the file version, with its time
    assert len(slow) == len(fast) > header
    assert slow[header:] == fast[header:]


def test_a_writer_not_laid_out_as_tensorboards_is_left_alone() -> None:
    class Other:
        def _get_file_writer(self) -> object:
            return object()

    assert speed_up(Other()) is False
    assert speed_up(object()) is False


def test_random_bytes_of_many_sizes() -> None:
    for size in random.Random(0).sample(range(1, 200000), 12):
        data = os.urandom(size)
        assert masked_crc32c(data) == tensorboards(data), size
