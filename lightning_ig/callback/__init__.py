"""The callback's wing: :class:`IntegratedGradientsCallback` and the steps of its runs.

* :mod:`~lightning_ig.callback.callback`: the Lightning hooks, and one run top to bottom (attribute, gather,
  summarize, log, write); :class:`NonFiniteAttributionError`.
* :mod:`~lightning_ig.callback.heldout`: once per fit, the held-out states, the baselines, what is attributed
  (``target``, ``forward``), the engine tried on two states, each rank's share.
* :mod:`~lightning_ig.callback.setup`: the options only the callback has, the units a run logs (features or
  groups) and their tags, the report folder.
* :mod:`~lightning_ig.callback.reports`: the JSON report of each run in ``report_dir``.

A new option of the callback is checked in ``__init__`` (with :mod:`lightning_ig.vocabulary`'s checks, or one in
:mod:`~lightning_ig.callback.setup`), used at set-up or in the run, and documented in the class's ``Args``;
``tests/test_option_types.py`` feeds it every wrong kind the day it exists.
"""

from lightning_ig.callback.callback import IntegratedGradientsCallback, NonFiniteAttributionError

__all__ = ["IntegratedGradientsCallback", "NonFiniteAttributionError"]
