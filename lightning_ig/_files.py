"""Atomic file replacement, shared by the report and checkpoint writers.

Readers of a path written here see the old file or the new one, never half of
one, and a failed write leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """A temporary file beside ``target`` that replaces it when the block succeeds.

    Missing parent folders are created. On any exception inside the block the
    temporary file is removed and ``target`` is left as it was.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(descriptor)
    try:
        yield Path(temporary)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
