"""Quadrature rules for the straight-line path integral of Integrated Gradients.

Each rule is a pure function ``n -> (alphas, weights)``: ``alphas`` are the
positions in ``[0, 1]`` at which the path ``b + alpha (x - b)`` is sampled and
``weights`` the step sizes they are summed with, so that
``integral_0^1 g(alpha) d alpha ~= sum_k weights[k] * g(alphas[k])``.
Names and values match Captum's ``approximation_methods`` for the same ``n``
(alphas to float32 rounding: Captum builds them with a float32 ``linspace``),
except the trapezoid weights, where Captum's do not sum to one (see
:func:`riemann_trapezoid`).
"""

from __future__ import annotations

from typing import Callable, Literal

import numpy as np

__all__ = [
    "METHODS",
    "Method",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
    "gausslegendre",
    "quadrature",
    "nests_on_doubling",
]

Method = Literal["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre"]

Rule = tuple[list[float], list[float]]


def _check_n(n: int, smallest: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n_steps must be an int, got {type(n).__name__} ({n!r})")
    if n < smallest:
        raise ValueError(f"n_steps must be >= {smallest}, got {n}")
    return int(n)


def _linspace(start: float, stop: float, n: int) -> list[float]:
    # Computed in float64 like numpy.linspace; n == 1 gives [start].
    return np.linspace(start, stop, n, dtype=np.float64).tolist()


def riemann_left(n: int) -> Rule:
    """Left Riemann sum: ``alphas = 0, 1/n, ..., 1 - 1/n``, each weight ``1/n``."""
    n = _check_n(n)
    return _linspace(0.0, 1.0 - 1.0 / n, n), [1.0 / n] * n


def riemann_right(n: int) -> Rule:
    """Right Riemann sum: ``alphas = 1/n, ..., 1``, each weight ``1/n``."""
    n = _check_n(n)
    return _linspace(1.0 / n, 1.0, n), [1.0 / n] * n


def riemann_middle(n: int) -> Rule:
    """Midpoint rule: ``alphas = 1/2n, 3/2n, ..., 1 - 1/2n``, each weight ``1/n``."""
    n = _check_n(n)
    return _linspace(1.0 / (2 * n), 1.0 - 1.0 / (2 * n), n), [1.0 / n] * n


def riemann_trapezoid(n: int) -> Rule:
    """Trapezoid rule on ``n`` points including both ends (``n >= 2``).

    The weights are ``h/2, h, ..., h, h/2`` with ``h = 1/(n - 1)``, so they sum
    to one and a linear model is integrated exactly. Captum 0.9 uses the same
    alphas with weights ``1/2n, 1/n, ..., 1/2n``, which sum to ``(n - 1)/n``
    and scale every attribution by that factor; this is the one rule where we
    deliberately differ from Captum.
    """
    n = _check_n(n, smallest=2)
    inner = 1.0 / (n - 1)
    weights = [inner / 2] + [inner] * (n - 2) + [inner / 2]
    return _linspace(0.0, 1.0, n), weights


def gausslegendre(n: int) -> Rule:
    """Gauss-Legendre nodes and weights mapped from ``[-1, 1]`` to ``[0, 1]``.

    Exact for polynomials of degree ``2n - 1`` along the path, which is why it
    is the default: 50 points reach a completeness error far below a Riemann
    rule's on smooth models.
    """
    n = _check_n(n)
    nodes, weights = np.polynomial.legendre.leggauss(n)
    return (0.5 * (nodes + 1.0)).tolist(), (0.5 * weights).tolist()


_RULES: dict[str, Callable[[int], Rule]] = {
    "riemann_left": riemann_left,
    "riemann_right": riemann_right,
    "riemann_middle": riemann_middle,
    "riemann_trapezoid": riemann_trapezoid,
    "gausslegendre": gausslegendre,
}

METHODS: tuple[str, ...] = tuple(_RULES)


def quadrature(method: str, n: int) -> Rule:
    """The ``(alphas, weights)`` of ``method`` with ``n`` points.

    Args:
        method: one of :data:`METHODS`.
        n: the number of points (``n_steps``); ``riemann_trapezoid`` needs ``n >= 2``.

    Raises:
        ValueError: an unknown method or ``n`` below the rule's minimum.
        TypeError: ``n`` is not an integer.
    """
    try:
        rule = _RULES[method]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}") from None
    return rule(n)


def nests_on_doubling(method: str) -> bool:
    """Whether the points of ``n`` steps are a subset of those of the refined rule.

    ``riemann_trapezoid`` with ``n`` points nests in ``2n - 1`` points and
    ``riemann_left``/``riemann_right`` with ``n`` in ``2n``, so a refinement can
    reuse every gradient already evaluated; midpoint and Gauss-Legendre do not nest.
    """
    return method in ("riemann_left", "riemann_right", "riemann_trapezoid")
