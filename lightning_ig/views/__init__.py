"""The views' wing: what a run becomes for people. It reads a finished run (a :class:`~lightning_ig.run.RunSummary`,
a :class:`~lightning_ig.run.HostResult`), never the engine's internals.

* :mod:`~lightning_ig.views.text`: numbers for people, the verdict in words, the ``<prefix>/report`` text;
* :mod:`~lightning_ig.views.report`: the JSON report, schema version 1 (``report_schema_v1.json`` beside it), and its
  rows;
* :mod:`~lightning_ig.views.tags`: what a callback logs (:class:`ViewOptions`, the callback's ``views=``), its tags;
* :mod:`lightning_ig.views.pictures`: the pictures; :mod:`lightning_ig.views.loggers`: TensorBoard, W&B, MLflow.

A number a view needs that no summary holds goes into :mod:`lightning_ig.run` first, its words into
:mod:`~lightning_ig.views.text`.
"""

from lightning_ig.views.report import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    build_report,
    completeness_summary,
    feature_statistics,
    load_schema,
    report_to_json,
    write_report,
)
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
