"""Quadrature rules for the straight-line path integral of Integrated Gradients.

Each rule is a pure function ``n -> (alphas, weights)``: ``alphas`` are the positions in ``[0, 1]`` at which the path
``b + alpha (x - b)`` is sampled and ``weights`` the step sizes they are summed with, so that
``integral_0^1 g(alpha) d alpha ~= sum_k weights[k] * g(alphas[k])``. Names and values match Captum's
``approximation_methods`` for the same ``n`` (alphas to float32 rounding: Captum builds them with a float32
``linspace``), except the trapezoid weights, where Captum's do not sum to one (see :func:`riemann_trapezoid`).

On a ReLU network every fixed rule is first order (``docs/trust.md`` compares the rules); the engine's default,
``method="auto"``, takes :func:`riemann_middle`'s nodes (:mod:`lightning_ig.attribution.kinks` weighs them per state).

Gauss-Legendre for any ``n`` up to :data:`MAX_GAUSS_LEGENDRE_STEPS` is built in O(n) memory and O(n) time: Newton's
method on ``P_n(cos theta)`` in the angle ``theta``, from Tricomi's and Gatteschi's first guesses, with ``P_n``
evaluated by Stieltjes' asymptotic expansion in the interior of ``[-1, 1]`` and by the three-term recurrence (written in
``1 - x`` so nodes near the ends keep their accuracy) for the few nodes near the ends, where the expansion does not
reach double precision. Nodes and weights agree with ``numpy.polynomial.legendre.leggauss`` (an O(n^2)-memory eigenvalue
method) to float64 rounding; rules are cached.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from lightning_ig.vocabulary import AUTO_METHOD, KINK_METHOD, METHODS, check_memory

__all__ = [
    "MAX_GAUSS_LEGENDRE_STEPS",
    "Rule",
    "check_rule",
    "gausslegendre",
    "quadrature",
    "riemann_left",
    "riemann_middle",
    "riemann_right",
    "riemann_trapezoid",
]

Rule = tuple[list[float], list[float]]

MAX_GAUSS_LEGENDRE_STEPS = 100_000
"""The most points a Gauss-Legendre rule is built with (about a second, once; then cached): a smooth model needs tens
to hundreds, a model with kinks (ReLU) gains nothing from more; past this size a Riemann rule (any size) is the tool."""


def _check_n(n: int, smallest: int = 1) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n (the number of points, n_steps) must be an int, got {type(n).__name__} ({n!r:.60})")
    if n < smallest:
        raise ValueError(f"n (the number of points, n_steps) must be >= {smallest}, got {n}")
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

    The weights are ``h/2, h, ..., h, h/2`` with ``h = 1/(n - 1)``, so they sum to one and a linear model is integrated
    exactly. Captum 0.9 uses the same alphas with weights ``1/2n, 1/n, ..., 1/2n``, which sum to ``(n - 1)/n`` and scale
    every attribution by that factor; this is the one rule where we deliberately differ from Captum.
    """
    n = _check_n(n, smallest=2)
    inner = 1.0 / (n - 1)
    return _linspace(0.0, 1.0, n), [inner / 2] + [inner] * (n - 2) + [inner / 2]


def gausslegendre(n: int) -> Rule:
    """Gauss-Legendre nodes and weights mapped from ``[-1, 1]`` to ``[0, 1]``.

    Exact for polynomials of degree ``2n - 1`` along the path: on smooth models (tanh, SiLU) 50 points reach an error
    far below a Riemann rule's. On ReLU networks its high order buys nothing (the integrand is a step function) and the
    midpoint rule, the default, is more accurate at the same cost. Built in O(n) memory and time (see the module
    docstring) and cached; ``n`` is at most :data:`MAX_GAUSS_LEGENDRE_STEPS`.

    Raises:
        ValueError: ``n < 1`` or ``n > MAX_GAUSS_LEGENDRE_STEPS``.
        TypeError: ``n`` is not an integer.
    """
    n = _check_n(n)
    check_rule("gausslegendre", n)
    alphas, weights = _gauss_legendre(n)
    return alphas.tolist(), weights.tolist()


# --------------------------------------------------------------------------- Gauss-Legendre in O(n)

# Zeros of the Bessel function J_0: Gatteschi's first guesses for the nodes nearest the ends.
_BESSEL_J0_ZEROS = (
    2.404825557695773,
    5.520078110286311,
    8.653727912911013,
    11.79153443901428,
    14.93091770848779,
    18.07106396791092,
    21.21163662987926,
    24.35247153074930,
    27.49347913204025,
    30.63460646843198,
)
# Stieltjes' expansion with this many terms is within float64 rounding where (n + 1/2) sin(theta) >= this bound
# (checked against the recurrence and 50-digit mpmath values in tests/attribution/test_quadrature.py).
_EXPANSION_TERMS = 30
_EXPANSION_FROM = 20.0
_NEWTON_ITERATIONS = 8
_NEWTON_POLISH_FROM = 1e-9  # relative step after which one more Newton step reaches float64 rounding


@functools.lru_cache(maxsize=32)
def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Read-only ``(alphas, weights)`` on ``[0, 1]``, ascending, symmetric about 1/2."""
    theta, derivative = _legendre_angles(n)  # (m,) ascending in (0, pi/2], m = ceil(n / 2)
    low = np.sin(theta / 2) ** 2  # (1 - cos theta) / 2 without cancellation near alpha = 0
    high = 1.0 - low  # the mirror image: low + high == 1 to the last bit
    weights_half = 1.0 / derivative**2  # 2 / ((1 - x^2) P_n'(x)^2), halved for [0, 1]
    middle = n % 2  # an odd rule has the node x = 0 (alpha = 1/2) once, not twice
    if middle:
        low[-1] = high[-1] = 0.5
    alphas = np.concatenate([low, high[::-1][middle:]])
    weights = np.concatenate([weights_half, weights_half[::-1][middle:]])
    alphas.setflags(write=False)
    weights.setflags(write=False)
    return alphas, weights


def _legendre_angles(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The angles ``theta_k`` of the nodes ``x_k = cos(theta_k)`` in ``(0, pi/2]``, and ``dP_n(cos theta)/d theta``."""
    k = np.arange(1, (n + 1) // 2 + 1, dtype=np.float64)  # (m,)
    half = n + 0.5
    # Tricomi: x_k ~ (1 - 1/8n^2 + 1/8n^3) cos((4k - 1) pi / (4n + 2)); Gatteschi near the ends.
    phi = (4 * k - 1) * math.pi / (4 * n + 2)
    theta = np.arccos(np.clip((1 - 1 / (8 * n * n) + 1 / (8 * n**3)) * np.cos(phi), -1.0, 1.0))
    ends = min(len(_BESSEL_J0_ZEROS), theta.shape[0])
    theta[:ends] = np.array(_BESSEL_J0_ZEROS[:ends]) / math.sqrt(half * half + (1 - 4 / math.pi**2) / 12)
    if n % 2:
        theta[-1] = math.pi / 2  # the middle node, exactly
    interior = half * np.sin(theta) >= _EXPANSION_FROM  # fixed once, so each node keeps one evaluator
    scale = _stieltjes_constant(n) if interior.any() else 0.0
    derivative = np.empty_like(theta)
    polishing = False
    for _ in range(_NEWTON_ITERATIONS):
        value = np.empty_like(theta)
        value[interior], derivative[interior] = _legendre_stieltjes(n, theta[interior], scale)
        value[~interior], derivative[~interior] = _legendre_recurrence(n, theta[~interior])
        step = value / derivative
        if n % 2:
            step[-1] = 0.0  # P_n(0) = 0 for odd n: the middle node is exact
        theta -= step
        if polishing:
            break  # one step after a step below 1e-9: Newton squares the error, so this one is at rounding level
        polishing = bool(np.all(np.abs(step) <= _NEWTON_POLISH_FROM * theta))
    return theta, derivative


def _legendre_recurrence(n: int, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``P_n(cos theta)`` and its ``theta``-derivative by the three-term recurrence, in ``y = 1 - cos theta``. With
    ``D_k = P_k - P_{k-1}`` the recurrence reads ``D_{k+1} = (k D_k - (2k + 1) y P_k) / (k + 1)``,
    ``P_{k+1} = P_k + D_{k+1}``: no ``x P_k - P_{k-1}`` cancellation near ``x = 1``, where these nodes lie. O(n) per
    node; used for the few nodes outside the expansion's reach."""
    if theta.size == 0:
        return theta.copy(), theta.copy()
    y = 2 * np.sin(theta / 2) ** 2  # 1 - cos(theta), accurate for small theta
    p = 1 - y  # P_1
    d = -y  # D_1
    for k in range(1, n):
        d = (k * d - (2 * k + 1) * y * p) / (k + 1)
        p = p + d
    # dP_n/dtheta = -sin(theta) P_n'(x), P_n'(x) = n (x P_n - P_{n-1}) / (x^2 - 1) = -n (D_n - y P_n) / (y (2 - y))
    return p, np.sin(theta) * n * (d - y * p) / (y * (2 - y))


def _stieltjes_constant(n: int) -> float:
    """``C_n = (4 / pi) prod_{j=1..n} j / (j + 1/2)``, through an exactly rounded sum of logarithms."""
    j = np.arange(1, n + 1, dtype=np.float64)
    return 4 / math.pi * math.exp(math.fsum(np.log1p(-0.5 / (j + 0.5)).tolist()))


def _legendre_stieltjes(n: int, theta: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``P_n(cos theta)`` and its ``theta``-derivative by Stieltjes' expansion (Szego, Theorem 8.21.5).
    ``P_n(cos theta) = C_n sum_m h_m cos(a_m) / (2 sin theta)^(m + 1/2)`` with
    ``a_m = (n + m + 1/2) theta - (m + 1/2) pi / 2`` and ``h_m = prod_{j=1..m} (j - 1/2)^2 / (j (n + j + 1/2))``: O(1)
    per node."""
    twice_sin, twice_cos = 2 * np.sin(theta), 2 * np.cos(theta)
    power = twice_sin**-0.5  # (2 sin theta)^-(m + 1/2)
    coefficient = 1.0
    value, derivative = np.zeros_like(theta), np.zeros_like(theta)
    for m in range(_EXPANSION_TERMS):
        if m:
            coefficient *= (m - 0.5) ** 2 / (m * (n + m + 0.5))
        angle = (n + m + 0.5) * theta - (m + 0.5) * math.pi / 2
        cosine, sine = np.cos(angle), np.sin(angle)
        value += coefficient * cosine * power
        derivative -= coefficient * power * ((n + m + 0.5) * sine + (m + 0.5) * cosine * twice_cos / twice_sin)
        power = power / twice_sin
    return scale * value, scale * derivative


_RULES: dict[str, Callable[[int], Rule]] = {
    "riemann_left": riemann_left,
    "riemann_right": riemann_right,
    "riemann_middle": riemann_middle,
    "riemann_trapezoid": riemann_trapezoid,
    "gausslegendre": gausslegendre,
}

if tuple(_RULES) != METHODS:  # pragma: no cover - the one list of names, kept in step at import
    raise ImportError(f"quadrature rules {tuple(_RULES)} do not match lightning_ig.vocabulary.METHODS {METHODS}")
_NODES = {**_RULES, KINK_METHOD: riemann_middle, AUTO_METHOD: riemann_middle}  # the kink rule's nodes: the midpoint's


# Up to this many points a rule is built without asking how much memory is free (a read of the system's figures).
_UNCHECKED_NODES = 2**20
# What a point costs while its rule is built and used: numpy's float64, the list's float and pointer, the weight's
# pointer, the engine's two float64 tensors.
_BYTES_A_NODE = 64


def check_rule(method: str, n: int) -> None:
    """Raise where ``method`` with ``n`` points is not a rule this module builds; build nothing.

    The engine calls this when it reads its options, so a bad ``n_steps`` fails before any work.

    Raises:
        ValueError: an unknown method, ``riemann_trapezoid`` with ``n < 2``, ``gausslegendre`` with more than
            :data:`MAX_GAUSS_LEGENDRE_STEPS` points, or more points than the memory available holds (said before any is
            built).
    """
    if n > _UNCHECKED_NODES:  # a rule is lists and arrays of n floats: numpy's MemoryError, or an IndexError past 2**63
        check_memory(n * _BYTES_A_NODE, f"n_steps={n}", "pass fewer steps")
    if method not in _NODES:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(_NODES)}")
    if method == "riemann_trapezoid" and n < 2:
        raise ValueError(f"method='riemann_trapezoid' needs n_steps >= 2 (both ends of the path), got {n}")
    if method == "gausslegendre" and n > MAX_GAUSS_LEGENDRE_STEPS:
        raise ValueError(
            f"n_steps={n} is more than the {MAX_GAUSS_LEGENDRE_STEPS} points a Gauss-Legendre rule is built with: "
            f"with n of them it is exact for polynomials of degree 2n - 1, so a smooth model needs far fewer (50-500); "
            f"for a model with kinks (ReLU) that needs a fine grid use method='riemann_trapezoid' or 'riemann_middle', "
            f"which take any n_steps"
        )


def quadrature(method: str, n: int) -> Rule:
    """The ``(alphas, weights)`` of ``method`` with ``n`` points.

    Args:
        method: one of :data:`METHODS` (Captum's names), or ``"kink_midpoint"`` / ``"auto"`` (their nodes are the
            midpoint rule's; :mod:`lightning_ig.attribution.kinks` weighs them per state).
        n: the number of points (``n_steps``); ``riemann_trapezoid`` needs ``n >= 2``; ``gausslegendre`` takes at most
            :data:`MAX_GAUSS_LEGENDRE_STEPS`.

    Returns:
        Two lists of ``n`` floats: the positions in ``[0, 1]`` and their weights.

    Raises:
        ValueError: an unknown method, or ``n`` outside the rule's range.
        TypeError: ``n`` is not an integer.

    Example::

        alphas, weights = quadrature("gausslegendre", 50)
    """
    rule = _NODES.get(method) if isinstance(method, str) else None
    if rule is None:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(_NODES)}")
    return rule(n)
