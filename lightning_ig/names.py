"""The option names every layer shares, and the one unit of the completeness error, in a module that imports nothing.

The command line's parser lists these names in ``--help`` and checks a flag
against them; it imports this module, not :mod:`lightning_ig.vocabulary`
(which holds the checks on tensors and imports torch), so ``lightning-ig
--help`` answers without loading torch or Lightning. :mod:`lightning_ig.vocabulary`
re-exports every name here; the quadrature rules of :mod:`lightning_ig.quadrature`
are keyed by :data:`METHODS`.

The completeness error is a *fraction* wherever a user reads it: the JSON
report, the TensorBoard scalars, ``completeness_tol`` / ``--completeness-tol``
(0.01), the callback's text, ``diag``'s and ``show``'s lines and the examples'
output all write ``relative error 3.76e-03`` (:func:`relative_error_text`), never
a percentage, so that two numbers that look alike are alike.
"""

from __future__ import annotations

__all__ = ["BACKENDS", "GRADIENTS", "METHODS", "relative_error_text"]

BACKENDS = ("auto", "cuda", "torch")
"""``"auto"``: the CUDA kernels when the tensors are on a CUDA device and CuPy imports, else torch."""

GRADIENTS = ("autograd", "finite_difference")
"""How the engine takes gradients along the path."""

METHODS = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")
"""The quadrature rules, by Captum's names."""


def relative_error_text(value: float) -> str:
    """A relative completeness error as every message writes it: a fraction in scientific notation (``3.76e-03``).

    ``inf`` (NaN/Inf from the model) and ``nan`` (nothing could be checked) are written as such.
    """
    return f"{value:.2e}" if value == value and abs(value) != float("inf") else str(value)
