"""Trust checks that can fail: is the explanation worth reading, not only is IG's arithmetic right. No Lightning.

Completeness and the error estimate say whether the attributions are computed right. These three say whether they
explain the model, and each fails when they do not:

* :mod:`~lightning_ig.trust.sanity`: the randomisation sanity check (Adebayo et al. 2018): re-initialised copies of
  the model must rank the units differently (:func:`randomization_reference` once per fit,
  :func:`randomization_check` each time);
* :mod:`~lightning_ig.trust.faithfulness`: the deletion curve (:func:`deletion_check`): deleting the most
  contributing units first must move the target more than deleting them in a random order;
* :mod:`~lightning_ig.trust.stability`: for NoisyNet agents, the ranking under the agent's own exploration noise
  (:func:`stability_check`).

:mod:`~lightning_ig.trust.verdict` joins them with the run's accuracy into one verdict, ``passed``, ``failed`` or
``unresolved``, and why (:func:`trust_summary`). The callback runs them
(:class:`lightning_ig.callback.monitor.TrustMonitor`) at the runs the callback's budget allows (``docs/trust.md``).
:mod:`~lightning_ig.trust.replica` is the model's working copy they compute on, and :mod:`~lightning_ig.trust.common`
holds what they share. Each check is a function of the model, the states, the baselines and this run's per-state
attributions of the units, draws its random numbers from private seeded generators, reads the host once, and leaves the
model as it was (parameters, buffers, modes, noise, ``.grad``, every random generator).

A new check goes in a module of its own here: a function returning a frozen result with ``passed``, ``reason`` and
``scalars()``, judged in :func:`trust_summary`, run by :class:`~lightning_ig.callback.monitor.TrustMonitor`, its tags in
docs/tensorboard-tags.md.
"""

from lightning_ig.trust.common import AttributionSettings
from lightning_ig.trust.faithfulness import DeletionCheck, DeletionPlan, deletion_check
from lightning_ig.trust.replica import Replica
from lightning_ig.trust.sanity import (
    RandomizationCheck,
    RandomizationReference,
    randomization_check,
    randomization_reference,
)
from lightning_ig.trust.stability import StabilityCheck, stability_check
from lightning_ig.trust.verdict import TrustSummary, trust_summary

__all__ = [
    "AttributionSettings",
    "DeletionCheck",
    "DeletionPlan",
    "RandomizationCheck",
    "RandomizationReference",
    "Replica",
    "StabilityCheck",
    "TrustSummary",
    "deletion_check",
    "randomization_check",
    "randomization_reference",
    "stability_check",
    "trust_summary",
]
