"""The views' wing: what a run becomes for people. It reads a finished run (a :class:`~lightning_ig.run.RunSummary`,
a :class:`~lightning_ig.run.HostResult`), never the engine's internals.

Words and files, here:

* :mod:`~lightning_ig.views.text`: how a run reads (numbers written for people, the completeness verdict in words,
  what is wrong with a run, the ``<prefix>/report`` text);
* :mod:`~lightning_ig.views.report`: the JSON report, schema version 1 (``report_schema_v1.json`` beside it):
  :func:`build_report`, :func:`write_report`, :func:`load_schema`, :func:`report_to_json`;
  :mod:`~lightning_ig.views.report_rows`: its rows (:func:`feature_statistics`, :func:`completeness_summary`);
* :mod:`~lightning_ig.views.tags`: what a callback logs: how much (:class:`ViewOptions`, the callback's ``views=``),
  its tags and their labels, decided once per fit.

Pixels, in :mod:`lightning_ig.views.pictures`; what a run sends to TensorBoard, W&B and MLflow, in
:mod:`lightning_ig.views.loggers`.

A new view reads a run summary (or, for a file, a host result); a number it needs that no summary holds goes into
:mod:`lightning_ig.run.statistics` and the summary first, its words into :mod:`~lightning_ig.views.text`.
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
from lightning_ig.views.tags import ViewOptions

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "ViewOptions",
    "build_report",
    "completeness_summary",
    "feature_statistics",
    "load_schema",
    "report_to_json",
    "write_report",
]
