"""Pictures encoded and handed to TensorBoard on one worker thread, beside the training loop.

Encoding a picture (Pillow's quantizer and zlib, :func:`~lightning_ig.raster.png_bytes`)
runs in C without Python's GIL, so on a worker thread it takes another core
instead of the training loop's time. One worker per callback keeps the pictures
in order. :meth:`PictureWriter.wait` returns when everything submitted is in
the writer's queue and raises the first error a picture met; the callback waits
before its next pictures and at the end of training, so nothing is lost and at
most one run's pictures are ever in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["PictureWriter"]


class PictureWriter:
    """Run picture jobs (encode, log) in order on a worker thread, created at the first job.

    Called from the thread that runs the callback's hooks only (Lightning's), so it holds no lock of its own.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        """Run ``job(*args)`` on the worker thread, after the jobs submitted before it.

        Args:
            job: e.g. :func:`lightning_ig.tensorboard.add_picture`.
            args: its arguments; arrays among them are read later, so they must not be changed afterwards.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-ig-pictures")
        self._pending.append(self._pool.submit(job, *args))

    def wait(self) -> None:
        """Return when every submitted picture is in the writer's queue; raise the first error one met."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        """Wait for the pictures (:meth:`wait`), then stop the worker thread; a later picture starts a new one."""
        try:
            self.wait()
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles (e.g. ``copy.deepcopy`` of the callback) start without a worker or pictures."""
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
