"""The attribution wing: the IG engine, and what every consumer computes from its results.

The engine: :func:`integrated_gradients`, :class:`IntegratedGradients`, :class:`IGResult`; its options,
:class:`IGOptions` (the callback's ``engine=``); :class:`StochasticForwardWarning`, :func:`target_forward` and
:func:`worst_relative_error`.

Integrated Gradients (Sundararajan et al., 2017) attributes ``F(x) - F(b)`` to
the input features by integrating the gradient of ``F`` along the straight
path ``b + alpha (x - b)``, ``alpha`` in ``[0, 1]``::

    attributions_i = (x_i - b_i) * integral_0^1 dF/dx_i(b + alpha (x - b)) d alpha
                  ~= (x_i - b_i) * sum_k w_k g_k,i

with the quadrature ``(alpha_k, w_k)`` of :mod:`~lightning_ig.attribution.quadrature`.

The parts, in the order a call runs through them:

* :mod:`~lightning_ig.attribution.settings` checks the keyword options once; :mod:`~lightning_ig.attribution.inputs`
  checks and flattens the tensors (with :mod:`~lightning_ig.attribution.checks`, the tensor checks every wing shares);
  :mod:`~lightning_ig.attribution.targets` says what to attribute;
* the five operations of ``kernels/ig.cu`` (interpolation, finite-difference probes and gradients, accumulation,
  completeness) are :mod:`lightning_ig.ops.ig`'s, each CUDA launcher beside its bit-identical torch twin, chosen once
  per run;
* :mod:`~lightning_ig.attribution.quadrature` gives the rule; :mod:`~lightning_ig.attribution.path` runs the path:
  chunked batched forwards, autograd or finite differences, the stochastic-forward check;
  :mod:`~lightning_ig.attribution.estimate` computes the error figures beside it, :mod:`~lightning_ig.attribution.kinks`
  the kink rule and its figures; :mod:`~lightning_ig.attribution.budget` resolves ``n_steps="budget"`` and
  ``method="auto"``; :mod:`~lightning_ig.attribution.auto_steps` is ``n_steps="auto"``;
* :mod:`~lightning_ig.attribution.graphs` captures a whole attribution in a
  CUDA graph; the engine (:mod:`~lightning_ig.attribution.engine`) keeps and replays the plans;
* :mod:`~lightning_ig.attribution.result` is what comes back (:class:`IGResult`);
  :mod:`~lightning_ig.attribution.exact_line` the references to check it against.

The front doors are :func:`integrated_gradients` (one eager call) and
:class:`IntegratedGradients` (defaults, and graph replay for repeated shapes).

:mod:`~lightning_ig.attribution.groups` sums attributions per feature group; a run's numbers are
:mod:`lightning_ig.run`'s. A new engine option goes into :mod:`~lightning_ig.attribution.settings` (and
:func:`integrated_gradients`' signature).

What a result says about itself (its completeness, each state non-finite, degenerate or checked, the error
figures and the states near the baseline) is :mod:`~lightning_ig.attribution.result`'s docstring; how far to trust
it, ``docs/trust.md``.
"""

from __future__ import annotations

from lightning_ig.attribution.eager import integrated_gradients
from lightning_ig.attribution.engine import IntegratedGradients
from lightning_ig.attribution.result import IGResult, StochasticForwardWarning, worst_relative_error
from lightning_ig.attribution.settings import IGOptions
from lightning_ig.attribution.targets import target_forward

__all__ = [
    "IGOptions",
    "IGResult",
    "IntegratedGradients",
    "StochasticForwardWarning",
    "integrated_gradients",
    "target_forward",
    "worst_relative_error",
]
