"""The logging worker's run writer (views/loggers/worker.py ``add_run``): one event per run, the values add_* write.

A run's histograms and report text go to TensorBoard as one summary written on the worker thread; what TensorBoard
reads back must be exactly what ``add_histogram`` and ``add_text`` write one by one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lightning_ig.views.loggers.worker import HISTOGRAM_BINS, PictureWriter, add_run

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from torch.utils.tensorboard import SummaryWriter


def _read(folder: Path) -> EventAccumulator:
    events = EventAccumulator(str(folder), size_guidance={"histograms": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _summaries(folder: Path) -> list[Any]:
    (path,) = folder.glob("events.out.tfevents.*")
    return [event for event in EventFileLoader(str(path)).Load() if event.HasField("summary")]


def _run(rows: int = 40) -> tuple[list[tuple[str, np.ndarray]], str]:
    generator = np.random.default_rng(0)
    columns = generator.normal(size=(rows, 3))
    columns[0, 1] = np.nan  # a non-finite value is left out of its histogram
    columns[:, 2] = 1.5  # a constant column
    histograms = [(f"ig/group/attributions/channel {k}", columns[:, k]) for k in range(3)]
    histograms.append(("ig/group/attributions/empty", np.full(rows, np.inf)))  # nothing finite: no histogram
    return histograms, "| a | b |\n|---|---|\n| 1 | 2 |"


def test_a_run_is_one_event_with_what_the_add_calls_write(tmp_path: Path) -> None:
    histograms, text = _run()
    together, apart = SummaryWriter(str(tmp_path / "together")), SummaryWriter(str(tmp_path / "apart"))
    for step in (3, 7):
        add_run(together, step, histograms, ("ig/report", text))
        for tag, values in histograms:
            finite = values[np.isfinite(values)]
            if finite.size:
                apart.add_histogram(tag, finite, step, bins=HISTOGRAM_BINS)
        apart.add_text("ig/report", text, step)
    together.close()
    apart.close()
    assert len(_summaries(tmp_path / "together")) == 2  # one event per run
    assert len(_summaries(tmp_path / "apart")) == 2 * (3 + 1)
    got, expected = _read(tmp_path / "together"), _read(tmp_path / "apart")
    assert sorted(got.Tags()["histograms"]) == sorted(expected.Tags()["histograms"])
    assert len(expected.Tags()["histograms"]) == 3
    for tag in expected.Tags()["histograms"]:
        assert [(e.step, e.histogram_value) for e in got.Histograms(tag)] == [
            (e.step, e.histogram_value) for e in expected.Histograms(tag)
        ]
    assert got.Tags()["tensors"] == expected.Tags()["tensors"] == ["ig/report/text_summary"]
    assert [e.tensor_proto for e in got.Tensors("ig/report/text_summary")] == [
        e.tensor_proto for e in expected.Tensors("ig/report/text_summary")
    ]


class _PlainWriter:
    """A writer without PyTorch's file writer: gets the add_* calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def add_histogram(self, tag: str, values: np.ndarray, step: int, bins: int) -> None:
        assert np.isfinite(values).all() and bins == HISTOGRAM_BINS
        self.calls.append(("histogram", tag, step))

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.calls.append(("text", tag, step))


def test_a_writer_without_a_file_writer_gets_the_add_calls() -> None:
    histograms, text = _run()
    writer = _PlainWriter()
    add_run(writer, 5, histograms, ("ig/report", text))
    kinds = [kind for kind, _, _ in writer.calls]
    assert kinds == ["histogram"] * 3 + ["text"]
    assert {step for _, _, step in writer.calls} == {5}


def test_a_submit_waits_when_the_worker_falls_behind() -> None:
    pictures, running = PictureWriter(), threading.Event()
    done: list[int] = []

    def slow(index: int) -> None:
        running.wait()
        done.append(index)

    started = time.perf_counter()
    timer = threading.Timer(0.2, running.set)
    timer.start()
    for index in range(12):  # the ninth submit waits for the eight before it
        pictures.submit(slow, index)
    assert time.perf_counter() - started >= 0.15 and len(done) >= 8
    pictures.close()
    assert done == list(range(12))


def test_a_closed_writer_is_reopened_by_the_add_calls(tmp_path: Path) -> None:
    histograms, text = _run()
    writer = SummaryWriter(str(tmp_path))
    writer.close()  # file_writer is None now: the add_* calls open a new event file, as they do for the user
    add_run(writer, 4, histograms, ("ig/report", text))
    writer.close()
    events = _read(tmp_path)
    assert len(events.Tags()["histograms"]) == 3
    assert [e.step for e in events.Tensors("ig/report/text_summary")] == [4]
