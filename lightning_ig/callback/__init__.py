"""The callback's wing: :class:`IntegratedGradientsCallback` and the steps of its runs.

* :mod:`~lightning_ig.callback.callback`: the Lightning hooks, and one run top to bottom (attribute, gather,
  summarize, log, write); :class:`NonFiniteAttributionError`.
* :mod:`~lightning_ig.callback.options`: every option checked once, when the callback is made
  (:class:`~lightning_ig.callback.options.Options`).
* :mod:`~lightning_ig.callback.fit`: what one fit holds, made at set-up and at fit start; a run reads it as plain
  data. From :mod:`~lightning_ig.callback.heldout` (the held-out states, the baselines, what is attributed
  (``target``, ``forward``), the engine tried on two states, each rank's share) and
  :mod:`~lightning_ig.callback.setup` (the units a run logs, features or groups, and their tags; the report folder).
* :mod:`~lightning_ig.callback.reports`: the JSON report of each run in ``report_dir``;
  :mod:`~lightning_ig.trust`: the trust checks and the run's verdict.

A new option of the callback is a parameter of ``__init__``, documented in the class's ``Args``, checked in
:func:`~lightning_ig.callback.options.check_options` (with :mod:`lightning_ig.vocabulary`'s checks, or one of
:mod:`~lightning_ig.callback.options`), used at set-up (:mod:`~lightning_ig.callback.fit`) or in the run
(``self.options``); ``tests/test_option_types.py`` feeds it every wrong kind the day it exists.
"""

from lightning_ig.callback.callback import IntegratedGradientsCallback, NonFiniteAttributionError

__all__ = ["IntegratedGradientsCallback", "NonFiniteAttributionError"]
