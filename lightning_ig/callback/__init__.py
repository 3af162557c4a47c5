"""The callback's wing: :class:`IntegratedGradientsCallback` and the steps of its runs.

* :mod:`~lightning_ig.callback.callback`: the Lightning hooks, and one run top to bottom (attribute, gather,
  summarize, log, write); :class:`NonFiniteAttributionError`.
* :mod:`~lightning_ig.callback.options`: every option checked once, when the callback is made, and fixed afterwards
  (:class:`~lightning_ig.callback.options.Options`; the grouped knobs are :class:`~lightning_ig.attribution.IGOptions`
  and :class:`~lightning_ig.views.ViewOptions`).
* :mod:`~lightning_ig.callback.fit`: what one fit holds, made at set-up and at fit start; a run reads it as plain
  data. From :mod:`~lightning_ig.callback.heldout` (the held-out states, the baselines, what is attributed
  (``target``, ``forward``), the engine tried on two states, each rank's share) and
  :mod:`~lightning_ig.callback.setup` (the units a run logs, features or groups, and their tags; the report folder).
* :mod:`~lightning_ig.callback.reports`: the JSON report of each run in ``report_dir``;
  :mod:`~lightning_ig.trust`: the trust checks and the run's verdict.

A new option goes first into the group it belongs to (:class:`~lightning_ig.attribution.IGOptions`: how IG runs;
:class:`~lightning_ig.views.ViewOptions`: what is logged and drawn), checked in its ``__post_init__``; only an option
that is the callback's own becomes a parameter of ``__init__`` (no more than today's 19), documented in the class's
``Args``, a field of :class:`~lightning_ig.callback.options.Options` checked there, used at set-up
(:mod:`~lightning_ig.callback.fit`) or in the run (``self.options``); each gets a row in the table of its test.
"""

from lightning_ig.callback.callback import IntegratedGradientsCallback, NonFiniteAttributionError

__all__ = ["IntegratedGradientsCallback", "NonFiniteAttributionError"]
