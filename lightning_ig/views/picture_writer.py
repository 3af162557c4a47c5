"""The picture worker: pictures encoded and logged on one thread beside the training loop, in order.

A run that draws pictures hands them here (:class:`PictureWriter`) and goes on training; the worker encodes each
one as a palette PNG and logs it (:func:`add_picture` for TensorBoard; the W&B and MLflow sinks of
:mod:`~lightning_ig.views.loggers` for those loggers). The next run that draws waits for the last run's pictures
first, so at most one run's are in flight and their errors surface in the training thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from lightning_ig.views.raster import png_bytes

__all__ = ["PictureWriter", "add_picture"]


def add_picture(writer: Any, tag: str, pixels: np.ndarray, step: int) -> None:
    """Log an ``(H, W, 3)`` uint8 picture as a palette PNG (:func:`~lightning_ig.views.raster.png_bytes`).

    ``SummaryWriter.add_image`` stores RGB PNGs, three times the bytes, and
    TensorBoard's event writer checksums every byte in Python on a thread that
    holds the GIL; so the image summary is built here and handed to the
    writer's file writer, as ``add_image`` itself does. A writer without one
    (not PyTorch's ``SummaryWriter``) gets ``add_image``.

    Args:
        writer: ``TensorBoardLogger.experiment``.
        tag: the image tag.
        pixels: ``(H, W, 3)`` uint8.
        step: the global step.
    """
    file_writer = getattr(writer, "_get_file_writer", None)
    if file_writer is None:
        writer.add_image(tag, pixels, step, dataformats="HWC")
        return
    from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: PLC0415 - TensorBoard only when logging to it

    height, width = pixels.shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=png_bytes(pixels))
    file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


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
            job: e.g. :func:`add_picture`.
            args: its arguments; arrays among them are read later, so they must not be changed afterwards.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-ig-pictures")
        self._pending.append(self._pool.submit(job, *args))

    @property
    def pending(self) -> bool:
        """Whether jobs were submitted since the last :meth:`wait` (a run with nothing in flight skips the call)."""
        return bool(self._pending)

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
