"""Ensembles: a fused, differentiable ensemble reduce and ensembles as attribution targets.

* :func:`ensemble_reduce` / :class:`EnsembleReduce`: ``out[b] = sum_m w[m] * mean_k sigmoid(logits[b, m, k])`` in one
  deterministic CUDA launch (one more for the backward), with a torch twin; :func:`member_means`: each member's own.
* :class:`Ensemble`: members mapping states to ``(N, K)``, whose forward is the aggregate ``(N,)`` and whose
  ``member_signals`` is ``(N, M)``; registered as ``"Ensemble"`` so checkpoints rebuild it.
* :class:`MemberAttribution`, :class:`MemberRun`: each member attributed in one batched run beside the aggregate.

How far the members agree with the aggregate is a run's number (:mod:`lightning_ig.run.agreement`).

Example::

    ensemble = Ensemble([DuelingQNetwork(4, 2) for _ in range(5)]).eval()
    aggregate = integrated_gradients(ensemble, states)
    members = integrated_gradients(ensemble.member_signals, states, target="each")
    summary = ensemble_summary(aggregate, members, weights=ensemble.weights)
"""

from lightning_ig.ensemble.members import MemberAttribution, MemberRun, find_ensemble, pack_members
from lightning_ig.ensemble.module import Ensemble, is_ensemble
from lightning_ig.ensemble.reduce import REDUCE_DIMS, EnsembleReduce, ensemble_reduce, member_means

__all__ = [
    "REDUCE_DIMS",
    "Ensemble",
    "EnsembleReduce",
    "MemberAttribution",
    "MemberRun",
    "ensemble_reduce",
    "find_ensemble",
    "is_ensemble",
    "member_means",
    "pack_members",
]
