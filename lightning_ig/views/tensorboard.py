"""What one IG run sends to the loggers: scalars to every logger, and to TensorBoard histograms, text and pictures.

Scalars reach every Lightning logger through ``logger.log_metrics`` (CSV,
MLflow, W&B and TensorBoard alike; :func:`scalar_metrics`, :func:`log_scalars`).
A ``TensorBoardLogger`` also gets the extras through its ``SummaryWriter``
(``add_histogram``, ``add_text``, ``add_custom_scalars``; pictures as palette
PNGs through its file writer, :func:`add_picture`), run after run, by the
callback's :class:`TensorBoardRuns`: the histograms and the ``<prefix>/report``
text every run, the pictures on their cadences (:func:`pictures_due`; drawn by
:mod:`~lightning_ig.views.pictures`), encoded and logged on one worker thread
(:class:`PictureWriter`). The tags are listed, once, in ``docs/tensorboard-tags.md``.

This module reads a :class:`~lightning_ig.views.summary.RunSummary`, never the
JSON report. Names are shown the same way in tags, charts and text
(:func:`display_labels`): a user's names as given (a ``/`` would nest the tag,
so it becomes ``∕``), generated names (``x[0,3,9]``, ``channel 3``) with their
numbers zero-padded so that they sort numerically.

A new logger output goes here: a scalar into :func:`scalar_metrics` (and its tag into
:meth:`TagNames.scalar_tags` and docs/tensorboard-tags.md), a TensorBoard extra into :meth:`TensorBoardRuns.log`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.attribution.host_result import HostResult
from lightning_ig.attribution.statistics import CONCENTRATION_SHARES, drift_tags
from lightning_ig.ensemble.agreement import ensemble_scalar_names
from lightning_ig.views.raster import png_bytes
from lightning_ig.views.summary import RunSummary, Units
from lightning_ig.views.summary import report_markdown as _markdown

__all__ = [
    "PICTURES",
    "TAG_ROOT",
    "PictureWriter",
    "TagNames",
    "TensorBoardRuns",
    "add_picture",
    "display_labels",
    "feature_tags",
    "is_tensorboard_logger",
    "log_scalars",
    "pictures_due",
    "report_markdown",
    "scalar_metrics",
]

TAG_ROOT = "ig"
_HISTOGRAM_BINS = 30

PICTURES = ("top_features", "heatmap", "saliency", "saliency_map")
"""The kinds of picture a run may draw; the tags are ``<prefix>/<kind>``, the map's ``<prefix>/saliency/mean_abs``."""


# --------------------------------------------------------------------------- tags and scalars, for every logger


def display_labels(names: Sequence[str], *, generated: bool = False) -> list[str]:
    """How names appear in tags, charts and text.

    Args:
        names: feature or group names (distinct).
        generated: the names were made up by lightning-ig (``x[0,3,9]``, ``channel 3``,
            ``x0..x7``): their numbers are zero-padded to one width so that
            ``x[0,03,09]`` sorts before ``x[0,10,02]`` as text.

    Returns:
        One distinct label per name.

    Example::

        >>> display_labels(["pole/angle", "cart x"])
        ['pole∕angle', 'cart x']
        >>> display_labels(["x[0,3]", "x[0,10]"], generated=True)
        ['x[00,03]', 'x[00,10]']
    """
    labels = [str(name).replace("/", "∕") for name in names]
    if generated:
        width = max((len(run) for label in labels for run in re.findall(r"\d+", label)), default=1)
        labels = [re.sub(r"\d+", lambda match: match.group().zfill(width), label) for label in labels]
    seen: set[str] = set()
    for index, label in enumerate(labels):
        if label in seen:
            labels[index] = f"{label} ({index})"
        seen.add(labels[index])
    return labels


def feature_tags(feature_names: Sequence[str]) -> list[str]:
    """The tag suffix of each user-named feature: ``ig/mean_abs/<suffix>`` (the names as shown everywhere).

    Example::

        >>> feature_tags(["cart position", "pole/angle"])
        ['cart position', 'pole∕angle']
    """
    return display_labels(feature_names)


@dataclass(frozen=True)
class TagNames:
    """The tags of one callback: ``ig/...``, or ``ig/<name>/...`` for a named callback.

    Attributes:
        prefix: ``"ig"`` or ``"ig/<name>"``.
        feature_labels: labels of the features logged one by one (``None``: too many to log).
        group_labels: labels of the groups (``None``: no groups).
        ensemble_members: the members of an ensemble model (``<prefix>/ensemble/...`` tags), or ``None``.
    """

    prefix: str
    feature_labels: list[str] | None
    group_labels: list[str] | None
    ensemble_members: int | None = None

    @classmethod
    def build(
        cls,
        name: str | None,
        feature_names: Sequence[str] | None,
        group_names: Sequence[str] | None,
        *,
        generated_features: bool,
        generated_groups: bool,
    ) -> TagNames:
        prefix = TAG_ROOT if name is None else f"{TAG_ROOT}/{display_labels([name])[0]}"
        features = None if feature_names is None else display_labels(feature_names, generated=generated_features)
        groups = None if group_names is None else display_labels(group_names, generated=generated_groups)
        return cls(prefix, features, groups)

    def unit_labels(self, units: Units) -> list[str]:
        labels = self.group_labels if units.kind == "groups" else self.feature_labels
        return list(labels or units.names)

    def scalar_tags(self, top_k: int) -> list[str]:
        """Every scalar tag a run logs from the second run on (the first has no drift)."""
        tags = [f"{self.prefix}/completeness/{name}" for name in _COMPLETENESS]
        for labels, group in ((self.feature_labels, ""), (self.group_labels, "group/")):
            for quantity in ("mean_abs", "mean_signed"):
                tags += [f"{self.prefix}/{group}{quantity}/{label}" for label in labels or []]
        tags += [f"{self.prefix}/concentration/{name}" for name in CONCENTRATION_SHARES]
        units = len(self.group_labels if self.group_labels is not None else self.feature_labels or [])
        tags += [f"{self.prefix}/drift/{name}" for name in drift_tags(units, top_k)]
        if self.ensemble_members is not None:
            tags += [f"{self.prefix}/ensemble/{name}" for name in ensemble_scalar_names(self.ensemble_members)]
        return [*tags, f"{self.prefix}/time_ms"]


_COMPLETENESS = ("worst_relative_error", "mean_abs_error", "non_finite_states", "degenerate_states")


def scalar_metrics(summary: RunSummary, tags: TagNames) -> dict[str, float]:
    """The scalars of one run, keyed by tag: completeness, per feature and group, concentration, drift, ensemble, time.

    ``worst_relative_error`` is logged as it is: ``inf`` when the model produced
    NaN/Inf, ``nan`` when no state could be checked.
    """
    prefix, completeness = tags.prefix, summary.completeness
    metrics = {
        f"{prefix}/completeness/worst_relative_error": completeness.worst_relative_error,
        f"{prefix}/completeness/mean_abs_error": completeness.mean_abs_error,
        f"{prefix}/completeness/non_finite_states": float(completeness.num_non_finite),
        f"{prefix}/completeness/degenerate_states": float(completeness.num_degenerate),
    }
    for units, group in ((summary.logged_features, ""), (summary.groups, "group/")):
        if units is None:
            continue
        labels = tags.unit_labels(units)
        metrics.update(zip((f"{prefix}/{group}mean_abs/{label}" for label in labels), units.moments.mean_abs.tolist()))
        metrics.update(
            zip((f"{prefix}/{group}mean_signed/{label}" for label in labels), units.moments.mean_signed.tolist())
        )
    metrics.update((f"{prefix}/concentration/{name}", value) for name, value in summary.concentration.items())
    metrics.update((f"{prefix}/drift/{name}", value) for name, value in summary.drift.items())
    if summary.ensemble is not None:
        metrics.update((f"{prefix}/ensemble/{name}", value) for name, value in summary.ensemble.scalars.items())
    metrics[f"{prefix}/time_ms"] = summary.time_ms
    return {tag: float(value) for tag, value in metrics.items()}


def log_scalars(loggers: Iterable[Any], metrics: Mapping[str, float], step: int) -> None:
    """Send the scalars to every logger through ``log_metrics`` (call on global rank zero only)."""
    for logger in loggers:
        logger.log_metrics(dict(metrics), step=step)


def is_tensorboard_logger(logger: Any) -> bool:
    """Whether ``logger`` is Lightning's ``TensorBoardLogger`` (which also gets histograms, pictures and text)."""
    from lightning.pytorch.loggers import TensorBoardLogger  # noqa: PLC0415 - keep the import lazy

    return isinstance(logger, TensorBoardLogger)


def pictures_due(
    cadences: Mapping[str, int | None], drawn_steps: Mapping[str, int | None], summary: RunSummary, *, final: bool
) -> dict[str, bool]:
    """Which kinds of picture (of :data:`PICTURES`: the two charts, the saliency grid, the mean |attr| map) a run draws.

    Each kind is drawn at the first run, then every ``cadences[kind]`` runs (``None``: never), and at
    the end of training (``final``), but never twice at one step (``drawn_steps[kind]``). Kinds that
    share a cadence are spread evenly over it, in the order given (at 10: runs 0, 10, 20, ...;
    3, 13, 23, ...; 6, 16, 26, ...), so that besides the first and the last run no run draws two
    kinds, and a run costs about what one kind costs.
    """
    offsets: dict[str, int] = {}
    for every in {every for every in cadences.values() if every is not None}:
        sharing = [kind for kind, other in cadences.items() if other == every]
        offsets.update({kind: position * every // len(sharing) for position, kind in enumerate(sharing)})
    index = summary.run_index
    return {
        kind: every is not None
        and (final or index == 0 or (index - offsets[kind]) % every == 0)
        and drawn_steps.get(kind) != summary.step
        for kind, every in cadences.items()
    }


def report_markdown(summary: RunSummary, tags: TagNames, *, saliency_scale: float | None = None) -> str:
    """The ``<prefix>/report`` text of a run (see :func:`lightning_ig.views.summary.report_markdown`)."""
    return _markdown(summary, tags.unit_labels(summary.units), tags.prefix, saliency_scale=saliency_scale)


# --------------------------------------------------------------------------- TensorBoard's extras


class TensorBoardRuns:
    """What one callback sends to TensorBoard besides scalars, run after run.

    Every run: the attribution histograms and the ``<prefix>/report`` text; the Custom Scalars layout at the first
    run and with each bar chart; the pictures when :func:`pictures_due` says so, handed to a
    :class:`PictureWriter`, which encodes and logs them beside the training loop (the last run's pictures are
    waited for before a run writes its own, so at most one run's are in flight and their errors surface here).

    Args:
        tags: the callback's tags.
        cadences: ``{kind: every this many runs, or None}`` for each kind of :data:`PICTURES`.
        histograms: write the per-feature and per-group attribution histograms.
        states: the held-out states (the saliency grid draws the first ones), or ``None``.
        channel: the channel drawn under the saliency grid (``None``: the channel mean).
        pictures: the worker that logs the pictures.
    """

    def __init__(
        self,
        tags: TagNames,
        cadences: Mapping[str, int | None],
        histograms: bool,
        states: Any | None,
        channel: int | None,
        pictures: PictureWriter,
    ) -> None:
        self.tags = tags
        self.cadences = dict(cadences)
        self.histograms = histograms
        self.states = states
        self.channel = channel
        self.pictures = pictures
        self.drawn_steps: dict[str, int | None] = dict.fromkeys(PICTURES)
        self.last_host: HostResult | None = None  # the last run's, for the pictures drawn at the end of training

    def log(
        self,
        loggers: Iterable[Any],
        summary: RunSummary,
        host: HostResult | None,
        history: Sequence[Mapping[str, Any]],
        *,
        final: bool,
        layout: Callable[[], Mapping[str, Any]],
    ) -> None:
        """Histograms, text, layout and the pictures due, to every ``TensorBoardLogger`` in ``loggers``.

        Args:
            loggers: the trainer's loggers.
            summary: the run.
            host: the run's host result; ``None`` at the end of training without a run: the last run's pictures
                that were not drawn yet, no text.
            history: the runs so far (the heatmap's).
            final: the end of training (every kind of picture is due).
            layout: makes the Custom Scalars layout, when one is written.
        """
        if host is not None:
            self.last_host = host
        writers = [logger.experiment for logger in loggers if is_tensorboard_logger(logger)]
        due = pictures_due(self.cadences, self.drawn_steps, summary, final=final)
        if not writers or (host is None and not any(due.values())):
            return
        self.pictures.wait()  # the last run's pictures first: at most one run's are in flight
        pictures, scale = {}, None
        if any(due.values()):
            from lightning_ig.views.pictures import draw  # noqa: PLC0415 - Pillow and the drawing only when due

            labels = self.tags.unit_labels(summary.units)
            pictures, scale = draw(due, summary, labels, self.last_host, self.states, self.channel, history)
        text = report_markdown(summary, self.tags, saliency_scale=scale) if host is not None else None
        written_layout = layout() if due["top_features"] or summary.run_index == 0 else None
        for writer in writers:
            self._write(
                writer, summary, text, written_layout, pictures, histograms=self.histograms and host is not None
            )
        self.drawn_steps.update({kind: summary.step for kind, drawn in due.items() if drawn})

    def _write(
        self,
        writer: Any,
        summary: RunSummary,
        text: str | None,
        layout: Mapping[str, Any] | None,
        pictures: Mapping[str, np.ndarray],
        *,
        histograms: bool,
    ) -> None:
        tags, step = self.tags, summary.step
        if histograms:
            for units, group in ((summary.logged_features, ""), (summary.groups, "group/")):
                if units is None or units.values is None:
                    continue
                for label, column in zip(tags.unit_labels(units), units.values.T):
                    finite = column[np.isfinite(column)]
                    if finite.size:  # a histogram of nothing is an error in TensorBoard
                        tag = f"{tags.prefix}/{group}attributions/{label}"
                        writer.add_histogram(tag, finite, step, bins=_HISTOGRAM_BINS)
        if text is not None:
            writer.add_text(f"{tags.prefix}/report", text, step)  # listed as <prefix>/report/text_summary
        if layout is not None:
            writer.add_custom_scalars(dict(layout))
        # Pictures last: the writer's thread checksums each event in Python (about 0.1 ms per KB, holding the GIL),
        # so the large ones are queued when this thread has little Python work left.
        for name, pixels in pictures.items():
            self.pictures.submit(add_picture, writer, f"{tags.prefix}/{name}", pixels, step)

    def close(self) -> None:
        """Every picture in the writer's queue (the worker stopped): before the logger closes."""
        self.pictures.close()


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
