"""TensorBoard's record checksum (masked CRC-32C) in numpy, for the event files the callback writes to.

TensorBoard's event writer checksums every record on its writer thread with a pure-Python CRC-32C (when TensorFlow
is not installed), one byte per loop step, holding the GIL: about 0.1-0.4 ms per KB, so a 60 KB picture costs the
training thread several milliseconds. :func:`masked_crc32c` computes the same checksum bit for bit with a few
hundred numpy operations whatever the size; :func:`speed_up` gives a ``SummaryWriter``'s record writer this
checksum (every record it writes, the user's too, gets the same bytes as before, sooner).

How: CRC-32C is linear over GF(2). Feeding a byte ``b`` to the state ``c`` gives ``Z(c) ^ T[b]``, with ``T`` the
byte table and ``Z`` the feeding of a zero byte, so a message's state is ``Z^n(init)`` xor, over its chunks of ``L``
bytes, each chunk's own CRC from state 0 shifted by the bytes after it. The chunks' CRCs are computed side by side
(``L`` vectorised table steps), then combined pairwise in a tree (one vectorised shift per level, by tables of
``Z^m`` built once per ``m``). Short records (the 8-byte headers) keep the byte loop.
"""

from __future__ import annotations

import functools
import logging
import struct
from typing import Any

import numpy as np

__all__ = ["crc32c", "masked_crc32c", "speed_up"]

_logger = logging.getLogger(__name__)

_POLY = 0x82F63B78  # Castagnoli, reflected
_MASK = 0xFFFFFFFF
_SHORT = 1536  # bytes below which the byte loop is about as quick as the vectorised steps


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _byte_table()
_TABLE_LIST = _TABLE.tolist()


def _loop(crc: int, data: bytes) -> int:
    """The byte loop from state ``crc`` (not inverted): what TensorBoard's stub does."""
    table = _TABLE_LIST
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


@functools.lru_cache(maxsize=64)
def _power(exponent: int) -> tuple[int, ...]:
    """``Z^exponent`` (``exponent`` a power of two) as the images of the 32 unit vectors (bit ``k`` of the state)."""
    if exponent == 1:
        return tuple(_loop(1 << k, b"\0") for k in range(32))
    half = _power(exponent // 2)
    return tuple(_apply(half, image) for image in half)


def _apply(operator: tuple[int, ...], state: int) -> int:
    out, bit = 0, 0
    while state:
        if state & 1:
            out ^= operator[bit]
        state >>= 1
        bit += 1
    return out


@functools.lru_cache(maxsize=64)
def _shift_tables(exponent: int) -> np.ndarray:
    """``(4, 256)`` uint32: ``Z^exponent`` (a power of two) of each byte value in each of the state's four bytes."""
    images = np.array(_power(exponent), dtype=np.uint32).reshape(4, 8)  # [byte of the state, bit of that byte]
    values = np.arange(256, dtype=np.uint32)
    tables = np.zeros((4, 256), dtype=np.uint32)
    for bit in range(8):
        tables ^= np.where((values >> bit) & 1, images[:, bit : bit + 1], np.uint32(0))
    return tables


def _shift(tables: np.ndarray, states: np.ndarray) -> np.ndarray:
    return (
        tables[0, states & 0xFF]
        ^ tables[1, (states >> 8) & 0xFF]
        ^ tables[2, (states >> 16) & 0xFF]
        ^ tables[3, states >> 24]
    )


def crc32c(data: bytes) -> int:
    """The CRC-32C of ``data`` (``crc32c(b"123456789") == 0xE3069283``)."""
    size = len(data)
    if size < _SHORT:
        return _loop(_MASK, data) ^ _MASK
    length = 16 if size <= 16384 else 32 if size <= 262144 else 64
    chunks = 1 << max(0, (-(-size // length) - 1).bit_length())  # a power of two: the tree pairs them
    padded = np.zeros(chunks * length, dtype=np.uint8)
    padded[chunks * length - size :] = np.frombuffer(data, dtype=np.uint8)  # leading zeros add nothing from 0
    rows = padded.reshape(chunks, length)
    states = np.zeros(chunks, dtype=np.uint32)
    for column in range(length):
        states = _TABLE[(states ^ rows[:, column]) & 0xFF] ^ (states >> 8)
    span = length
    while states.size > 1:
        states = _shift(_shift_tables(span), states[0::2]) ^ states[1::2]
        span *= 2
    return _shifted(_MASK, size) ^ int(states[0]) ^ _MASK


@functools.lru_cache(maxsize=64)
def _shift_lists(exponent: int) -> list[list[int]]:
    return _shift_tables(exponent).tolist()


def _shifted(state: int, count: int) -> int:
    """``Z^count(state)``: one table step per set bit of ``count``."""
    bit = 0
    while count:
        if count & 1:
            t = _shift_lists(1 << bit)
            state = t[0][state & 0xFF] ^ t[1][(state >> 8) & 0xFF] ^ t[2][(state >> 16) & 0xFF] ^ t[3][state >> 24]
        count >>= 1
        bit += 1
    return state


def masked_crc32c(data: bytes) -> int:
    """TensorBoard's record checksum of ``data``: the CRC-32C rotated and offset (``masked_crc32c`` of its stub)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & _MASK


def _write(self: Any, data: bytes) -> None:
    """``RecordWriter.write`` with this module's checksum: the same bytes."""
    header = struct.pack("<Q", len(data))
    record = header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
    self._writer.write(record)


def speed_up(writer: Any) -> bool:
    """Give ``writer``'s record writer (a ``SummaryWriter``'s, through its file writer) this module's checksum.

    Does nothing, and returns ``False``, where the writer is not laid out as TensorBoard's (another writer, a
    later version): its records keep TensorBoard's own checksum. Returns ``True`` once the record writer has it.
    """
    try:
        from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: PLC0415 - only with TensorBoard

        record_writer = writer._get_file_writer().event_writer._async_writer._writer
    except (AttributeError, ImportError) as error:
        _logger.debug("lightning_ig: TensorBoard's own record checksum kept (%r)", error)
        return False
    if type(record_writer) is not RecordWriter or not hasattr(record_writer, "_writer"):
        return False
    record_writer.write = _write.__get__(record_writer)  # this writer only; its thread calls it for every record
    return True
