"""The views' wing: what a run becomes for people. It reads a finished run (a summary, a host result), never the
engine's internals.

* :mod:`~lightning_ig.run.summary`: :class:`~lightning_ig.run.summary.RunSummary`, the typed summary of one
  callback run that every view reads; :mod:`~lightning_ig.views.text`: how it reads (numbers written for people,
  the completeness verdict in words, the ``<prefix>/report`` text).
* :mod:`~lightning_ig.views.report`: the JSON report, schema version 1 (``report_schema_v1.json`` beside it):
  :func:`build_report`, :func:`write_report`, :func:`load_schema`; :mod:`~lightning_ig.views.report_rows`: its rows
  (:func:`feature_statistics`, :func:`completeness_summary`).
* :mod:`~lightning_ig.views.tensorboard`: scalars to every Lightning logger; histograms, text and pictures to
  TensorBoard; the tags (every one listed in docs/tensorboard-tags.md). :mod:`~lightning_ig.views.layout`: its
  Custom Scalars page.
* :mod:`~lightning_ig.views.pictures`: the pictures a run draws, from :mod:`~lightning_ig.views.charts` (the bar
  chart and the heatmap), :mod:`~lightning_ig.views.saliency` (the saliency grid and the mean |attr| map) and
  :mod:`~lightning_ig.views.raster` (pixels, fonts, palette PNGs).

A new view goes here: it reads a :class:`~lightning_ig.run.summary.RunSummary` (or, for a file, a
:class:`~lightning_ig.run.host_result.HostResult`); a number it needs that no summary holds goes into
:mod:`lightning_ig.run.statistics` and the summary first.
"""

from lightning_ig.views.report import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    build_report,
    load_schema,
    report_to_json,
    write_report,
)
from lightning_ig.views.report_rows import completeness_summary, feature_statistics

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "build_report",
    "completeness_summary",
    "feature_statistics",
    "load_schema",
    "report_to_json",
    "write_report",
]
