"""The pictures a run draws for TensorBoard: the two charts and the two saliency pictures, from a run's summary.

A *picture* is anything logged as an image. The *charts* are the bar chart of the top features (or groups) and
the heatmap of their importance over training (:mod:`~lightning_ig.views.charts`); the *saliency grid* shows the
first held-out states with their signed attributions over them and the *mean |attr| map* the mean ``|attr|`` per
pixel over all states (:mod:`~lightning_ig.views.saliency`, for spatial states). Which ones a run draws is
:func:`lightning_ig.views.tensorboard.pictures_due`'s decision; this module draws them, and is only reached when
one is due.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_ig.attribution.host_result import HostResult
from lightning_ig.views.charts import Chart, heatmap_chart, top_features_chart
from lightning_ig.views.saliency import mean_abs_map, saliency_grid
from lightning_ig.views.summary import RunSummary, completeness_verdict, target_unit

__all__ = ["draw", "heatmap_picture", "mean_abs_map_picture", "saliency_grid_picture", "top_features_picture"]


def draw(
    due: Mapping[str, bool],
    summary: RunSummary,
    labels: Sequence[str],
    host: HostResult | None,
    states: Any | None,
    channel: int | None,
    history: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, np.ndarray], float | None]:
    """The pictures ``due`` (``{kind: bool}``, kinds of :data:`~lightning_ig.views.tensorboard.PICTURES`).

    Args:
        due: which pictures to draw.
        summary: the run.
        labels: the labels of the run's units (features or groups), as the tags show them.
        host: the run's host result (the saliency pictures need it), or ``None`` (charts only).
        states: the held-out states (for the saliency grid of spatial states), or ``None``.
        channel: the channel drawn under the saliency grid (``None``: the channel mean).
        history: the runs so far (for the heatmap).

    Returns:
        ``{tag suffix: (H, W, 3) uint8}``, the charts first, and the saliency grid's colour scale (``None`` when
        no grid was drawn): the run's text quotes it.
    """
    pictures: dict[str, np.ndarray] = {}
    if due.get("top_features"):
        pictures["top_features"] = top_features_picture(summary, labels).pixels
    if due.get("heatmap"):
        pictures["heatmap"] = heatmap_picture(summary, labels, history).pixels
    scale = None
    if host is not None and states is not None and due.get("saliency"):
        pictures["saliency"], scale = saliency_grid_picture(host, states[: len(host.sample_attributions)], channel)
    if host is not None and due.get("saliency_map"):
        pictures["saliency/mean_abs"] = mean_abs_map_picture(host)
    return pictures, scale


def _noun_and_name(summary: RunSummary) -> tuple[str, str]:
    noun = "groups" if summary.units.kind == "groups" else "features"
    return noun, "" if summary.settings.name is None else f" '{summary.settings.name}'"


def top_features_picture(summary: RunSummary, labels: Sequence[str]) -> Chart:
    """The ``top_features`` bar chart of this run, with its completeness verdict."""
    noun, name = _noun_and_name(summary)
    top = min(summary.settings.top_k, len(labels))
    unit = f"mean |attribution| over {summary.num_states} states ({target_unit(summary.settings.target)})"
    return top_features_chart(
        list(labels),
        summary.units.moments,
        top_k=summary.settings.top_k,
        value_label=unit,
        title=f"Top {top} {noun} by mean |IG attribution|{name} (step {summary.step})",
        verdict=completeness_verdict(summary),
    )


def heatmap_picture(summary: RunSummary, labels: Sequence[str], history: Sequence[Mapping[str, Any]]) -> Chart:
    """The ``heatmap`` of ``history`` (runs with ``global_step`` and ``mean_abs``)."""
    noun, name = _noun_and_name(summary)
    steps = [entry["global_step"] for entry in history]
    return heatmap_chart(
        list(labels),
        steps,
        np.asarray([entry["mean_abs"] for entry in history]),
        title=f"{noun.capitalize()}{name}: share of mean |attribution| over training",
    )


def saliency_grid_picture(host: HostResult, states: Any, channel: int | None) -> tuple[np.ndarray, float]:
    """The ``saliency`` grid of a run with spatial states, and its colour scale.

    Args:
        host: the run (``sample_attributions`` of the first states).
        states: the first held-out states, as many as ``host.sample_attributions`` (tensor or array).
        channel: the channel drawn in grey, or ``None`` for the channel mean.
    """
    grid = saliency_grid(np.asarray(states), host.sample_attributions, channel=channel)
    return grid.pixels, grid.scale


def mean_abs_map_picture(host: HostResult) -> np.ndarray:
    """The ``saliency/mean_abs`` picture: mean ``|attr|`` per pixel over all states, a tile per channel."""
    channel_names = host.groups.channel_names() if host.groups is not None else None
    return mean_abs_map(host.features.mean_abs.reshape(host.feature_shape), host.num_states, channel_names).pixels
