"""The option names every layer shares, in a module that imports nothing heavy.

The command line's parser lists these names in ``--help`` and checks a flag
against them; it imports this module, not :mod:`lightning_ig.vocabulary`
(which holds the checks on tensors and imports torch), so ``lightning-ig
--help`` answers without loading torch or Lightning. :mod:`lightning_ig.vocabulary`
re-exports every name here; the quadrature rules of :mod:`lightning_ig.quadrature`
are keyed by :data:`METHODS`.
"""

from __future__ import annotations

__all__ = ["BACKENDS", "GRADIENTS", "METHODS"]

BACKENDS = ("auto", "cuda", "torch")
"""``"auto"``: the CUDA kernels when the tensors are on a CUDA device and CuPy imports, else torch."""

GRADIENTS = ("autograd", "finite_difference")
"""How the engine takes gradients along the path."""

METHODS = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")
"""The quadrature rules, by Captum's names."""

