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

The front doors are :func:`integrated_gradients` (one eager call) and
:class:`IntegratedGradients` (defaults, and graph replay for repeated shapes). The modules, in the order a call runs
through them, and where a new engine option goes: ``docs/ARCHITECTURE.md`` (the wings; the engine).

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
