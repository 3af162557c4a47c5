"""The logging worker: a run's TensorBoard events and pictures made and logged on one thread beside training, in order.

Every run hands its TensorBoard events here (:class:`PictureWriter`; :func:`add_run`, :func:`add_picture`) and goes on
training; when a run waits for the worker, and why: :class:`~lightning_ig.views.loggers.outputs.RunOutputs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from lightning_ig.views.pictures.raster import png_bytes

__all__ = ["HISTOGRAM_BINS", "PictureWriter", "add_picture", "add_run"]

HISTOGRAM_BINS = 30

_BACKLOG = 8  # jobs in flight before a submit waits for them (runs that draw nothing never wait otherwise)


def add_run(writer: Any, step: int, histograms: Sequence[tuple[str, np.ndarray]], text: tuple[str, str] | None) -> None:
    """Log one run's histograms and report text to TensorBoard as one summary (one event, one checksum).

    What ``add_histogram`` and ``add_text`` would write, value for value (the same summary values,
    made by the same functions of ``torch.utils.tensorboard.summary``), in one event instead of one each, handed to
    the writer's public ``file_writer``: TensorBoard's writer thread checksums every event in Python holding the GIL,
    so fewer events cost the training thread less. A writer without an open ``file_writer`` (closed, or not PyTorch's
    ``SummaryWriter``) gets those calls.

    Args:
        writer: ``TensorBoardLogger.experiment``.
        step: the global step.
        histograms: ``(tag, values)``: a histogram of each column's finite values (none where there are none).
        text: ``(tag, the markdown)``, or ``None``.
    """
    # a histogram of nothing is an error in TensorBoard
    finite = [(tag, kept) for tag, values in histograms if (kept := values[np.isfinite(values)]).size]
    if (file_writer := _file_writer(writer)) is None:
        for tag, values in finite:
            writer.add_histogram(tag, values, step, bins=HISTOGRAM_BINS)
        if text is not None:
            writer.add_text(text[0], text[1], step)
        return
    from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: PLC0415 - TensorBoard only when logging to it
    from torch.utils.tensorboard import summary as made  # noqa: PLC0415 - as above

    summaries = [value for tag, values in finite for value in made.histogram(tag, values, HISTOGRAM_BINS).value]
    if text is not None:
        summaries.extend(made.text(text[0], text[1]).value)  # listed as <tag>/text_summary, as add_text's
    if summaries:
        file_writer.add_summary(Summary(value=summaries), step)


def add_picture(writer: Any, tag: str, pixels: np.ndarray, step: int) -> None:
    """Log an ``(H, W, 3)`` uint8 picture as a palette PNG (:func:`~lightning_ig.views.pictures.raster.png_bytes`).

    ``SummaryWriter.add_image`` stores RGB PNGs, three times the bytes, and TensorBoard's event writer checksums every
    byte in Python on a thread that holds the GIL; so the image summary is built here and handed to the writer's
    public ``file_writer``, as ``add_image`` itself does. A writer without an open one gets ``add_image``.

    Args:
        writer: ``TensorBoardLogger.experiment``.
        tag: the image tag.
        pixels: ``(H, W, 3)`` uint8.
        step: the global step.
    """
    if (file_writer := _file_writer(writer)) is None:
        writer.add_image(tag, pixels, step, dataformats="HWC")
        return
    from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: PLC0415 - TensorBoard only when logging to it

    height, width = pixels.shape[:2]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=png_bytes(pixels))
    file_writer.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


def _file_writer(writer: Any) -> Any:
    """``SummaryWriter.file_writer`` when it is open (``None`` after ``close()``, or on another kind of writer)."""
    file_writer = getattr(writer, "file_writer", None)
    return file_writer if callable(getattr(file_writer, "add_summary", None)) else None


class PictureWriter:
    """Run picture jobs (encode, log) in order on a worker thread, created at the first job.

    Called from the thread that runs the callback's hooks only (Lightning's), so it holds no lock of its own.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self.cpu = 0.0  # the worker thread's CPU seconds in its jobs: what the callback's budget counts beside hooks

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        """Run ``job(*args)`` on the worker thread, after the jobs submitted before it.

        Waits first (:meth:`wait`) when several jobs are still in flight, so that a worker slower than the runs
        cannot fall ever further behind.

        Args:
            job: e.g. :func:`add_picture`, :func:`add_run`.
            args: its arguments; arrays among them are read later, so they must not be changed afterwards.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-ig-pictures")
        if len(self._pending) >= _BACKLOG:
            self._pending = [future for future in self._pending if not future.done() or future.exception()]
            if len(self._pending) >= _BACKLOG:
                self.wait()
        self._pending.append(self._pool.submit(self._timed, job, *args))

    def _timed(self, job: Callable[..., None], *args: Any) -> None:
        started = time.thread_time()
        try:
            job(*args)
        finally:
            self.cpu += time.thread_time() - started

    def cpu_seconds(self) -> float:
        """The worker thread's CPU seconds in its jobs so far (the budget's ``background``)."""
        return self.cpu

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
