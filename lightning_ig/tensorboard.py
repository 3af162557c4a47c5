"""What one IG run sends to the loggers: scalars to every logger, and to TensorBoard also histograms, images and text.

Scalars reach every Lightning logger through ``logger.log_metrics`` (CSV,
MLflow, W&B and TensorBoard alike). A ``TensorBoardLogger`` also gets the
extras through its ``SummaryWriter`` (``add_histogram``, ``add_text``,
``add_custom_scalars``; pictures as palette PNGs through its file writer, see
:func:`add_picture`). The tags are listed, once, in ``docs/tensorboard-tags.md``.

This module reads a :class:`~lightning_ig.summary.RunSummary`, never the JSON
report. Names are shown the same way in tags, figures and text
(:func:`display_labels`): a user's names as given (a ``/`` would nest the tag,
so it becomes ``∕``), generated names (``x[0,3,9]``, ``channel 3``) with their
numbers zero-padded so that they sort numerically.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.drift import drift_tags
from lightning_ig.ensemble.agreement import ensemble_scalar_names
from lightning_ig.figures import Chart, heatmap_figure, top_features_figure
from lightning_ig.host_result import HostResult
from lightning_ig.picture_writer import PictureWriter
from lightning_ig.raster import png_bytes
from lightning_ig.run_text import DRIFT_WORDS, completeness_verdict, target_unit
from lightning_ig.run_text import report_markdown as _markdown
from lightning_ig.saliency import mean_abs_image, saliency_grid
from lightning_ig.statistics import CONCENTRATION_SHARES, rank_order
from lightning_ig.summary import RunSummary, Units

__all__ = [
    "PICTURES",
    "TAG_ROOT",
    "RunExtras",
    "TagNames",
    "add_picture",
    "custom_scalars_layout",
    "display_labels",
    "feature_tags",
    "heatmap_chart",
    "is_tensorboard_logger",
    "log_scalars",
    "mean_abs_picture",
    "pictures_due",
    "report_markdown",
    "run_extras",
    "saliency_grid_image",
    "scalar_metrics",
    "target_unit",
    "top_features_chart",
    "write_extras",
]

TAG_ROOT = "ig"
_HISTOGRAM_BINS = 30
_LAYOUT_UNIT_CHARTS = 12
_ENSEMBLE_CHARTS = {
    "spearman_min": "lowest Spearman correlation of a member's ranking with the aggregate's",
    "relative_spread": "spread of mean |attribution| across members (relative)",
    "completeness/worst_relative_error": "worst relative completeness error of a member",
}


def display_labels(names: Sequence[str], *, generated: bool = False) -> list[str]:
    """How names appear in tags, figures and text.

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
    """Whether ``logger`` is Lightning's ``TensorBoardLogger`` (which also gets histograms, images and text)."""
    from lightning.pytorch.loggers import TensorBoardLogger  # noqa: PLC0415 - keep the import lazy

    return isinstance(logger, TensorBoardLogger)


@dataclass(frozen=True)
class RunExtras:
    """What a run shows in TensorBoard besides scalars: saliency images, charts and the text (any may be empty)."""

    images: dict[str, np.ndarray]
    figures: dict[str, Chart]
    text: str | None


PICTURES = ("top_features", "heatmap", "saliency", "saliency_map")
"""The kinds of picture a run may draw; the tags are ``<prefix>/<kind>``, the map's ``<prefix>/saliency/mean_abs``."""


def run_extras(
    summary: RunSummary,
    tags: TagNames,
    host: HostResult | None,
    states: Any | None,
    channel: int | None,
    history: Sequence[Mapping[str, Any]],
    due: Mapping[str, bool],
    *,
    text: bool = True,
) -> RunExtras:
    """Build one run's pictures (those ``due``, see :data:`PICTURES`) and text.

    Args:
        summary: the run.
        tags: the callback's tags.
        host: the run's host result, or ``None`` (charts only).
        states: the held-out states (for the saliency grid of spatial states), or ``None``.
        channel: the channel drawn under the saliency maps (``None``: the channel mean).
        history: the runs so far (for the heatmap).
        due: which pictures to draw, by kind.
        text: build the ``<prefix>/report`` text (``False``: pictures only, e.g. the last run's at the end of training).
    """
    images: dict[str, np.ndarray] = {}
    scale = None
    if host is not None and states is not None and due.get("saliency"):
        images["saliency"], scale = saliency_grid_image(host, states[: len(host.sample_attributions)], channel)
    if host is not None and due.get("saliency_map"):
        images["saliency/mean_abs"] = mean_abs_picture(host)
    figures = {}
    if due.get("top_features"):
        figures["top_features"] = top_features_chart(summary, tags)
    if due.get("heatmap"):
        figures["heatmap"] = heatmap_chart(summary, tags, history)
    markdown = report_markdown(summary, tags, saliency_scale=scale) if text and host is not None else None
    return RunExtras(images, figures, markdown)


def pictures_due(
    cadences: Mapping[str, int | None], drawn_steps: Mapping[str, int | None], summary: RunSummary, *, final: bool
) -> dict[str, bool]:
    """Which kinds of picture (e.g. ``"figures"``, ``"saliency"``, ``"saliency_map"``) a run draws.

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


def write_extras(
    writer: Any,
    summary: RunSummary,
    tags: TagNames,
    extras: RunExtras,
    *,
    histograms: bool,
    layout: Mapping[str, Any] | None,
    pictures: PictureWriter | None = None,
) -> None:
    """Write one run's histograms, images, figures, text and layout to a ``SummaryWriter``.

    Args:
        writer: ``TensorBoardLogger.experiment``.
        summary: the run.
        tags: the callback's tags.
        extras: from :func:`run_extras`.
        histograms: write ``<prefix>/attributions/<feature>`` (features logged one by one) and
            ``<prefix>/group/attributions/<group>`` histograms of the per-state attributions.
        layout: a Custom Scalars layout to write (the latest one written is the one TensorBoard shows), or ``None``.
        pictures: encode and log the pictures on this worker (``None``: here, before returning).
    """
    step = summary.step
    if histograms:
        for units, group in ((summary.logged_features, ""), (summary.groups, "group/")):
            if units is None or units.values is None:
                continue
            for label, column in zip(tags.unit_labels(units), units.values.T):
                finite = column[np.isfinite(column)]
                if finite.size:  # a histogram of nothing is an error in TensorBoard
                    writer.add_histogram(
                        f"{tags.prefix}/{group}attributions/{label}", finite, step, bins=_HISTOGRAM_BINS
                    )
    if extras.text is not None:
        writer.add_text(f"{tags.prefix}/report", extras.text, step)  # listed as <prefix>/report/text_summary
    if layout is not None:
        writer.add_custom_scalars(dict(layout))
    # Pictures last: the writer's thread checksums each event in Python (about 0.1 ms per KB, holding the GIL),
    # so the large ones are queued when this thread has little Python work left.
    add = add_picture if pictures is None else functools.partial(pictures.submit, add_picture)
    for name, chart in extras.figures.items():
        add(writer, f"{tags.prefix}/{name}", chart.pixels, step)
    for name, pixels in extras.images.items():
        add(writer, f"{tags.prefix}/{name}", pixels, step)


def add_picture(writer: Any, tag: str, pixels: np.ndarray, step: int) -> None:
    """Log an ``(H, W, 3)`` uint8 picture as a palette PNG (:func:`~lightning_ig.raster.png_bytes`).

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


def custom_scalars_layout(
    tag_sets: Sequence[tuple[str, TagNames, int, Sequence[str] | None]],
) -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout of every IG callback in the trainer: one chart per quantity.

    TensorBoard draws the lines of one run in one colour, so every chart holds one
    quantity: completeness's relative and absolute errors apart, each meaningful
    drift measure, an ensemble's agreement and member completeness, and the most
    important units (features or groups) one chart each.

    Args:
        tag_sets: per callback ``(title, tags, top_k, units_by_importance)``; the last is
            the unit labels, most important first (``None``: by name).

    Returns:
        A layout for ``SummaryWriter.add_custom_scalars``.
    """
    layout: dict[str, dict[str, list[Any]]] = {}
    for title, tags, top_k, ranked in tag_sets:
        prefix = re.escape(tags.prefix)
        charts: dict[str, list[Any]] = {
            "completeness: worst relative error": ["Multiline", [rf"^{prefix}/completeness/worst_relative_error$"]],
            "completeness: mean absolute error": ["Multiline", [rf"^{prefix}/completeness/mean_abs_error$"]],
            "states that could not be checked (NaN/Inf)": [
                "Multiline",
                [rf"^{prefix}/completeness/non_finite_states$"],
            ],
            "share of |attribution| in the top 1% of features": [
                "Multiline",
                [rf"^{prefix}/concentration/top1pct_share$"],
            ],
        }
        grouped = tags.group_labels is not None
        units = tags.group_labels if grouped else tags.feature_labels or []
        for name in drift_tags(len(units), top_k):
            words = (
                DRIFT_WORDS[name]
                .format(k=top_k)
                .replace("with the first run", "Spearman rank correlation with the first run")
            )
            charts[f"drift: {words}"] = ["Multiline", [rf"^{prefix}/drift/{name}$"]]
        if tags.ensemble_members is not None:
            charts.update(
                {
                    f"ensemble: {words}": ["Multiline", [rf"^{prefix}/ensemble/{name}$"]]
                    for name, words in _ENSEMBLE_CHARTS.items()
                }
            )
        quantity = "group/mean_abs" if grouped else "mean_abs"
        for rank, label in enumerate(list(ranked or units)[:_LAYOUT_UNIT_CHARTS], start=1):
            charts[f"#{rank} {label}: mean |attribution|"] = [
                "Multiline",
                [rf"^{prefix}/{quantity}/{re.escape(label)}$"],
            ]
        layout[title] = charts
    return layout


def ranked_labels(summary: RunSummary, tags: TagNames) -> list[str]:
    """The unit labels, most important (mean ``|attr|``) first."""
    labels = tags.unit_labels(summary.units)
    return [labels[i] for i in rank_order(summary.units.moments.mean_abs)]


def report_markdown(summary: RunSummary, tags: TagNames, *, saliency_scale: float | None = None) -> str:
    """The ``<prefix>/report`` text of a run (see :func:`lightning_ig.run_text.report_markdown`)."""
    return _markdown(summary, tags.unit_labels(summary.units), tags.prefix, saliency_scale=saliency_scale)


def _noun_and_name(summary: RunSummary) -> tuple[str, str]:
    noun = "groups" if summary.units.kind == "groups" else "features"
    return noun, "" if summary.settings.name is None else f" '{summary.settings.name}'"


def top_features_chart(summary: RunSummary, tags: TagNames) -> Chart:
    """The ``top_features`` bar chart of this run, with its completeness verdict."""
    labels = tags.unit_labels(summary.units)
    noun, name = _noun_and_name(summary)
    top = min(summary.settings.top_k, len(labels))
    unit = f"mean |attribution| over {summary.num_states} states ({target_unit(summary.settings.target)})"
    return top_features_figure(
        labels,
        summary.units.moments,
        top_k=summary.settings.top_k,
        value_label=unit,
        title=f"Top {top} {noun} by mean |IG attribution|{name} (step {summary.step})",
        verdict=completeness_verdict(summary),
    )


def heatmap_chart(summary: RunSummary, tags: TagNames, history: Sequence[Mapping[str, Any]]) -> Chart:
    """The ``heatmap`` of ``history`` (runs with ``global_step`` and ``mean_abs``)."""
    noun, name = _noun_and_name(summary)
    steps = [entry["global_step"] for entry in history]
    return heatmap_figure(
        tags.unit_labels(summary.units),
        steps,
        np.asarray([entry["mean_abs"] for entry in history]),
        title=f"{noun.capitalize()}{name}: share of mean |attribution| over training",
    )


def saliency_grid_image(host: HostResult, states: Any, channel: int | None) -> tuple[np.ndarray, float]:
    """The ``saliency`` grid of a run with spatial states, and its colour scale.

    Args:
        host: the run (``sample_attributions`` of the first states).
        states: the first held-out states, as many as ``host.sample_attributions`` (tensor or array).
        channel: the channel drawn in grey, or ``None`` for the channel mean.
    """
    grid = saliency_grid(np.asarray(states), host.sample_attributions, channel=channel)
    return grid.pixels, grid.scale


def mean_abs_picture(host: HostResult) -> np.ndarray:
    """The ``saliency/mean_abs`` picture: mean ``|attr|`` per pixel over all states, a tile per channel."""
    channel_names = host.groups.channel_names() if host.groups is not None else None
    return mean_abs_image(host.features.mean_abs.reshape(host.feature_shape), host.num_states, channel_names).pixels
