"""The pictures, the feature table and the JSON report for the loggers besides TensorBoard: W&B and MLflow.

Scalars reach every Lightning logger through ``logger.log_metrics``. What else a run makes goes where each
logger keeps such things, through Lightning's logger API and the tracking client it hands out: a ``WandbLogger``'s
(:class:`WandbSink`) and an ``MLFlowLogger``'s (:class:`MlflowSink`), each method saying where; any other logger:
nothing here. TensorBoard has its own writer; CSV and the rest keep scalars.

:func:`picture_sinks` picks a sink per logger; the callback calls them on global rank zero, where it writes
TensorBoard's pictures, and may call them from its picture thread (each sink holds its own lock). MLflow's versions
and stores: the README.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["MlflowSink", "PictureSink", "WandbSink", "mlflow_metrics", "picture_sinks", "unit_table"]

_MLFLOW_KEY = re.compile(r"[^a-zA-Z0-9_\-./ ]")  # what MLflow accepts in an image key; the rest becomes "_"
_ARTIFACT_FORBIDDEN = re.compile(r"[\"',:\[\]{}]")  # what MLflow refuses in an artifact path
_MLFLOW_READABLE_IMAGES = (3, 11)  # the first MLflow whose image artifacts of keys with "/" can be read back


class PictureSink(Protocol):
    """Where a run's pictures, table and report go for one logger."""

    def pictures(self, pictures: Mapping[str, np.ndarray], step: int) -> None:
        """Store a run's ``(H, W, 3)`` uint8 pictures, each under its tag, at ``step``."""

    def table(self, tag: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        """Store a table (the top features) under ``tag`` at ``step``."""

    def report(self, name: str, report: Mapping[str, Any], step: int) -> None:
        """Store the JSON report (schema v1 keys and more) as the file ``name``."""


def picture_sinks(loggers: Iterable[Any]) -> list[PictureSink]:
    """A sink for each logger that keeps pictures besides TensorBoard: W&B and MLflow; none for the others.

    Args:
        loggers: ``trainer.loggers``.

    Returns:
        The sinks, in the loggers' order. ``TensorBoardLogger`` gets none (the TensorBoard writer draws
        there), nor do ``CSVLogger`` and loggers this package does not know (they keep scalars).

    Example::

        for sink in picture_sinks(trainer.loggers):
            sink.pictures({"ig/0_verdict": card.pixels}, trainer.global_step)
    """
    return [sink_class(logger) for logger in loggers if (sink_class := _sink_class(logger)) is not None]


def mlflow_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` with keys an MLflow logger keeps apart: Lightning's drops what MLflow refuses (``ig/x/速度`` would
    be ``ig/x/``, refused mid-fit) and MLflow refuses a key over 250 characters mid-fit; such a key gets ``_`` there,
    is cut, and gets its CRC-32, the same at every step."""
    return {_mlflow_key(key): value for key, value in metrics.items()}


def _mlflow_key(key: str, most: int = 250) -> str:
    kept = _MLFLOW_KEY.sub("_", key)
    return key if kept == key and len(key) <= most else f"{kept[: most - 9]} {zlib.crc32(key.encode()):08x}"


def _sink_class(logger: Any) -> type[WandbSink] | type[MlflowSink] | None:
    """:class:`WandbSink`, :class:`MlflowSink` or ``None``, by Lightning's classes (importing them imports neither
    package)."""
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger  # noqa: PLC0415 - only when there are loggers

    return WandbSink if isinstance(logger, WandbLogger) else MlflowSink if isinstance(logger, MLFlowLogger) else None


def _pixels(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` checked: ``(H, W, 3)`` uint8, contiguous (what both loggers encode as a PNG unchanged)."""
    array = np.asarray(pixels)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise ValueError(f"a picture is an (H, W, 3) uint8 array, got shape {array.shape} and dtype {array.dtype}")
    return np.ascontiguousarray(array)


class WandbSink:
    """Pictures, tables and reports for a Lightning ``WandbLogger`` (online or offline alike).

    Args:
        logger: the ``WandbLogger``.
    """

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self._lock = threading.Lock()

    def pictures(self, pictures: Mapping[str, np.ndarray], step: int) -> None:
        """PNGs under ``media/images/`` of the run, shown by tag with a step slider: one ``log_metrics`` call, as
        ``log_image`` makes it for one, so that a run's pictures share one W&B step (each call is a step of its own);
        the trainer's step goes with them as ``trainer/global_step``."""
        import wandb  # noqa: PLC0415 - the [wandb] extra, there when a WandbLogger is

        with self._lock:
            images = {tag: [wandb.Image(_pixels(pixels))] for tag, pixels in pictures.items()}
            self.logger.log_metrics(images, step=int(step))

    def table(self, tag: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        """``log_table``: a ``wandb.Table`` under ``tag``."""
        with self._lock:
            self.logger.log_table(key=tag, columns=list(columns), data=[list(row) for row in rows], step=int(step))

    def report(self, name: str, report: Mapping[str, Any], step: int) -> None:
        """The report as ``name`` in the run's folder (``files/``), which W&B keeps with the run (and syncs)."""
        from lightning_ig.views.report import report_to_json  # noqa: PLC0415 - the one strict JSON writer

        with self._lock:
            target = Path(self.logger.experiment.dir) / _safe_path(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(report_to_json(report), encoding="utf-8")
            del step  # the name carries it


class MlflowSink:
    """Pictures, tables and reports for a Lightning ``MLFlowLogger``: artifacts of its run.

    Args:
        logger: the ``MLFlowLogger`` (``logger.experiment`` is its ``MlflowClient``, ``logger.run_id`` its run).
    """

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self._lock = threading.Lock()
        self._keys: set[str] | None = None  # read at the first pictures (a store down then is a refused write)
        _warn_unreadable_images()

    def pictures(self, pictures: Mapping[str, np.ndarray], step: int) -> None:
        """A time-stepped image per tag (``images/<key>+step+<step>+...png``, keys as :func:`mlflow_metrics` makes).

        MLflow's client keys an image by its step in the file name, and its UI opens an image card at step 0 and
        shows only an image logged at exactly the slider's step; so a key's first picture in the run (a resumed one
        has some) is logged at step 0 too (the card opens on it; its title names the step it was drawn at). The key
        leaves room in a file name of 255 bytes for MLflow's ``+step+...`` (about 85).
        """
        client, run = self.logger.experiment, self.logger.run_id
        with self._lock:
            if self._keys is None:  # a run resumed: its keys have their step-0 pictures
                images = client.list_artifacts(run, "images")
                self._keys = {info.path.rsplit("/", 1)[-1].split("+step+")[0].replace("~", "/") for info in images}
            for key, pixels in ((_mlflow_key(tag, 150), pixels) for tag, pixels in pictures.items()):
                steps = [int(step)] if key in self._keys or int(step) == 0 else [0, int(step)]
                self._keys.add(key)
                for at in steps:
                    client.log_image(run, _pixels(pixels), key=key, step=at, synchronous=True)

    def table(self, tag: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        """A JSON table artifact per step: ``lightning_ig/<tag>/step_<step>.json`` (MLflow's table viewer reads it)."""
        data = {str(column): [row[index] for row in rows] for index, column in enumerate(columns)}
        with self._lock:
            self.logger.experiment.log_table(
                self.logger.run_id, data=data, artifact_file=f"lightning_ig/{_safe_path(tag)}/step_{int(step):08d}.json"
            )

    def report(self, name: str, report: Mapping[str, Any], step: int) -> None:
        """The report as the artifact ``lightning_ig/<name>`` (the project's strict JSON)."""
        from lightning_ig.views.report import report_to_json  # noqa: PLC0415

        with self._lock:
            self.logger.experiment.log_text(
                self.logger.run_id, report_to_json(report), artifact_file=f"lightning_ig/{_safe_path(name)}"
            )
            del step


def _warn_unreadable_images() -> None:
    """Warn where the installed MLflow writes image artifacts it cannot read back (before 3.11: ``/`` became ``#``)."""
    import mlflow  # noqa: PLC0415 - only with an MLFlowLogger, which imported it already

    release = re.match(r"(\d+)\.(\d+)", mlflow.__version__)
    if release is not None and (int(release[1]), int(release[2])) < _MLFLOW_READABLE_IMAGES:
        warnings.warn(
            f"MLflow {mlflow.__version__} stores the pictures under names that neither its client nor its UI "
            "reads back (an image key with '/' becomes '#', mlflow/mlflow#22165); upgrade with "
            "pip install 'mlflow>=3.11' (or mlflow-skinny>=3.11)",
            stacklevel=3,
        )


def _safe_path(name: str) -> str:
    """A relative artifact path from a tag or a file name: no characters MLflow refuses, no ``..`` or absolute part."""
    parts = _ARTIFACT_FORBIDDEN.sub("_", str(name)).replace(os.sep, "/").split("/")
    if not (parts := [part for part in parts if part not in ("", ".", "..")]):
        raise ValueError(f"{name!r} names no file; give a tag or a file name such as 'ig/report.json'")
    return "/".join(parts)


def unit_table(labels: Sequence[str], units: Any, top_k: int | None = None) -> tuple[list[str], list[list[Any]]]:
    """The units (features or groups) as a table, ranked as the verdict card ranks them: by mass.

    Args:
        labels: one label per unit.
        units: their :class:`~lightning_ig.run.summary.Units` (``parts``: the positive and negative mass).
        top_k: how many rows (``None``: all).

    Returns:
        ``(columns, rows)``: rank, name, share of the mass, the part that raises the target, the part that lowers
        it, mean ``|attr|``, mean attr, std of attr (the JSON report's ``stddev``).
    """
    from lightning_ig.run.statistics import rank_order  # noqa: PLC0415

    positive, negative = units.parts
    mass = positive + negative
    whole, moments = float(mass.sum()) or 1.0, units.moments
    order = rank_order(mass)[: top_k if top_k is not None else len(mass)]
    columns = ["rank", "name", "share", "raises", "lowers", "mean |attr|", "mean attr", "std of attr"]
    figures = np.stack([mass / whole, positive, negative, moments.mean_abs, moments.mean_signed, moments.stddev], 1)
    rows = [[rank, str(labels[i]), *map(float, figures[i])] for rank, i in enumerate(order, start=1)]
    return columns, rows
