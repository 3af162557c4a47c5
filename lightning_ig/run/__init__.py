"""A run's numbers: an IG result brought to the host and what every view reads of it. No words, no pixels.

The flow, top to bottom:

* :mod:`~lightning_ig.run.host_result`: :class:`HostResult`, a result gathered over ranks in one collective (with
  the rows that ride along: :mod:`~lightning_ig.run.gather`'s ``JointGather``), reduced on the device in float64
  and copied to the host once (:class:`~lightning_ig.run.host_result.HostTransfer` without waiting for it);
* :mod:`~lightning_ig.run.statistics`: completeness and :func:`accuracy_verdict`, concentration, drift, the one
  feature order (``rank_order``), Spearman and top-k Jaccard;
* :mod:`~lightning_ig.run.summary`: :func:`summarize` makes the :class:`RunSummary` of a callback run, the
  contract every view reads (kinds and values; the views say them);
* :mod:`~lightning_ig.run.actions`: a run per action (``target="each"``: :class:`~.actions.ActionSummary`;
  ``target="contrast"``: the greedy action against the runner-up);

A new number of a run goes into :mod:`~lightning_ig.run.statistics` and, for the callback, into
:class:`RunSummary`; its words go to :mod:`lightning_ig.views.text`.

Example::

    result = integrated_gradients(model, states)
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, tol=0.01)
    host = HostResult.from_result(result)  # float64 numpy on the host: host.features.mean_abs, ...
"""

from lightning_ig.run.host_result import HostResult
from lightning_ig.run.statistics import AccuracyVerdict, accuracy_verdict
from lightning_ig.run.summary import RunSettings, RunSummary, summarize

__all__ = ["AccuracyVerdict", "HostResult", "RunSettings", "RunSummary", "accuracy_verdict", "summarize"]
