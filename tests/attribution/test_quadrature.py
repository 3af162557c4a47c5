"""Quadrature rules: pinned values for small n, Captum agreement, exactness, large n in O(n) memory, bad input."""

from __future__ import annotations

import importlib
import math
import re
import tracemalloc

import numpy as np
import pytest

from lightning_ig import vocabulary
from lightning_ig.attribution import IGOptions
from lightning_ig.attribution.quadrature import MAX_GAUSS_LEGENDRE_STEPS, check_rule, quadrature
from lightning_ig.vocabulary import METHODS, check_method
from tests.support.tolerance import eps

EPS64 = eps(np.float64)


def test_pinned_values_for_small_n() -> None:
    assert quadrature("riemann_left", 4) == ([0.0, 0.25, 0.5, 0.75], [0.25] * 4)
    assert quadrature("riemann_right", 4) == ([0.25, 0.5, 0.75, 1.0], [0.25] * 4)
    assert quadrature("riemann_middle", 2) == ([0.25, 0.75], [0.5, 0.5])
    assert quadrature("riemann_trapezoid", 3) == ([0.0, 0.5, 1.0], [0.25, 0.5, 0.25])
    alphas, weights = quadrature("gausslegendre", 2)
    root = 0.5 / math.sqrt(3.0)
    np.testing.assert_allclose(alphas, [0.5 - root, 0.5 + root], rtol=0, atol=4 * EPS64)  # a few roundings of 1/2
    np.testing.assert_allclose(weights, [0.5, 0.5], rtol=0, atol=4 * EPS64)
    assert quadrature("gausslegendre", 1) == ([0.5], [1.0])
    assert quadrature("gausslegendre", 3)[0][1] == 0.5  # an odd rule's middle node, exactly


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 3, 7, 50, 128])
def test_matches_captum(method: str, n: int) -> None:
    approximation_methods = pytest.importorskip("captum.attr._utils.approximation_methods")
    step_sizes, alphas = approximation_methods.approximation_parameters(method)
    ours_alphas, ours_weights = quadrature(method, n)
    # Captum's Riemann alphas come from a float32 linspace: equal to float32 rounding (of numbers <= 1).
    np.testing.assert_allclose(ours_alphas, alphas(n), rtol=0, atol=eps(np.float32))
    if method == "riemann_trapezoid":
        # Captum's trapezoid weights sum to (n-1)/n; ours are the true rule (same shape, rescaled).
        np.testing.assert_allclose(np.array(ours_weights) * (n - 1) / n, step_sizes(n), rtol=4 * EPS64)
    elif method == "gausslegendre":
        # Captum's are numpy's leggauss weights, whose error grows with n (see the leggauss test below).
        np.testing.assert_allclose(ours_weights, step_sizes(n), rtol=_leggauss_weight_error(n))
    else:
        np.testing.assert_allclose(ours_weights, step_sizes(n), rtol=4 * EPS64)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 5, 33])
def test_rules_integrate_constants_and_lines_exactly(method: str, n: int) -> None:
    alphas, weights = map(np.asarray, quadrature(method, n))
    assert np.all((alphas >= 0) & (alphas <= 1))
    assert math.isclose(weights.sum(), 1.0, rel_tol=0, abs_tol=2 * n * EPS64)  # n roundings of numbers <= 1
    if method in ("riemann_middle", "riemann_trapezoid", "gausslegendre"):
        assert math.isclose(float(weights @ alphas), 0.5, abs_tol=4 * n * EPS64)


def test_gauss_legendre_is_exact_for_degree_2n_minus_1() -> None:
    alphas, weights = map(np.asarray, quadrature("gausslegendre", 4))
    # integral_0^1 a^7 da = 1/8
    assert math.isclose(float(weights @ alphas**7), 1 / 8, rel_tol=32 * EPS64)


def test_the_kink_rule_and_auto_sample_the_midpoint_nodes() -> None:
    assert quadrature("kink_midpoint", 7) == quadrature("auto", 7) == quadrature("riemann_middle", 7)
    assert check_method("kink_midpoint") == "kink_midpoint" and check_method("auto") == "auto"


@pytest.mark.parametrize("bad", ["warped_middle:2", "cosine_middle", "Riemann_Middle", ""])
def test_names_outside_the_list_say_what_to_pass(bad: str) -> None:
    with pytest.raises(ValueError, match="kink_midpoint"):
        check_method(bad)
    with pytest.raises(ValueError, match=re.escape(repr(bad))):  # the message shows what was given
        check_rule(bad, 8)


def test_unknown_method_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown method 'simpson'.*gausslegendre"):
        quadrature("simpson", 10)


@pytest.mark.parametrize("n", [0, -3])
def test_n_below_one_is_rejected(n: int) -> None:
    with pytest.raises(ValueError, match=rf"n \(the number of points, n_steps\) must be >= 1, got {n}"):
        quadrature("gausslegendre", n)


@pytest.mark.parametrize("n", [2**30, 2**63])
def test_more_points_than_memory_holds_are_refused_before_any_is_built(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 2**30)  # 1 GiB free, on any machine
    with pytest.raises(ValueError, match=f"n_steps={n} needs about .* more than the 1.0 GiB available here"):
        check_rule("riemann_middle", n)
    with pytest.raises(ValueError, match=f"n_steps={n} needs about"):  # the engine's options, before any work
        IGOptions(n_steps=n)
    check_rule("riemann_middle", 2**20)  # a large count that fits: built as before


def test_trapezoid_needs_two_points() -> None:
    with pytest.raises(ValueError, match=r"n \(the number of points, n_steps\) must be >= 2, got 1"):
        quadrature("riemann_trapezoid", 1)


@pytest.mark.parametrize("n", [2.5, "10", True])
def test_non_integer_n_is_rejected(n: object) -> None:
    with pytest.raises(TypeError, match=r"n \(the number of points, n_steps\) must be an int"):
        quadrature("riemann_left", n)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Gauss-Legendre for any n


def _leggauss_weight_error(n: int) -> float:
    """A bound on numpy's leggauss weight error: its derivative-series evaluation loses about n^3 eps at worst.

    Measured for n <= 511: at most 2.5e6 ulps (n = 400), where n^3 = 6.4e7; our weights are the accurate
    side (see the 40-digit comparison below).
    """
    return max(n, 4) ** 3 * EPS64


def _reference_node(n: int, alpha: float) -> tuple[float, float]:
    """The node near ``alpha`` and its weight on [0, 1], to 40 digits (Newton on the recurrence in mpmath)."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        x = 2 * mpmath.mpf(alpha) - 1
        for _ in range(3):
            p0, p1 = mpmath.mpf(1), x
            for k in range(1, n):
                p0, p1 = p1, ((2 * k + 1) * x * p1 - k * p0) / (k + 1)
            derivative = n * (x * p1 - p0) / (x * x - 1)
            x -= p1 / derivative
        return float((x + 1) / 2), float(1 / ((1 - x * x) * derivative * derivative))


@pytest.mark.parametrize("n", [*list(range(1, 130)), 200, 255, 256, 300])
def test_gauss_legendre_matches_numpy_leggauss(n: int) -> None:
    nodes, weights = np.polynomial.legendre.leggauss(n)
    alphas, ours = map(np.asarray, quadrature("gausslegendre", n))
    # Nodes on [0, 1]: numpy's 0.5 (x + 1) is good to a rounding of numbers <= 1.
    np.testing.assert_allclose(alphas, 0.5 * (nodes + 1), rtol=0, atol=2 * EPS64)
    np.testing.assert_allclose(ours, 0.5 * weights, rtol=_leggauss_weight_error(n), atol=0)


@pytest.mark.parametrize("n", [2, 3, 7, 20, 50, 128, 300, 2000])
def test_gauss_legendre_matches_40_digit_values(n: int) -> None:
    alphas, weights = quadrature("gausslegendre", n)
    # Newton's last step lands within a few roundings of the root; the recurrence for the nodes near the
    # ends adds rounding errors that grow like sqrt(n).
    ulps = 4 * (1 + math.sqrt(n))
    for index in sorted(set(np.linspace(0, n - 1, 9).astype(int).tolist())):
        alpha, weight = _reference_node(n, alphas[index])
        assert abs(alphas[index] - alpha) <= ulps * EPS64 * alpha, (index, alphas[index], alpha)
        assert abs(weights[index] - weight) <= ulps * EPS64 * weight, (index, weights[index], weight)


@pytest.mark.parametrize("n", [1000, 4001, 20000])
def test_gauss_legendre_for_large_n_is_exact_symmetric_and_linear_in_memory(n: int) -> None:
    # numpy's leggauss builds an n x n companion matrix (3.2 GB at n = 20000; 74.5 GiB at 100000).
    quadrature_module = importlib.import_module("lightning_ig.attribution.quadrature")
    quadrature_module._gauss_legendre.cache_clear()
    tracemalloc.start()
    try:
        alphas, weights = map(np.asarray, quadrature("gausslegendre", n))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 1024 * n, f"{peak} bytes for n = {n}: not O(n)"
    assert np.all(np.diff(alphas) > 0) and alphas[0] > 0 and alphas[-1] < 1
    np.testing.assert_array_equal(alphas + alphas[::-1], np.ones(n))  # symmetric about 1/2 to the last bit
    np.testing.assert_array_equal(weights, weights[::-1])
    for degree in (0, 1, 5, 21, 2 * 60 - 1):  # exact for polynomials up to degree 2n - 1
        assert math.isclose(
            float(weights @ alphas**degree), 1 / (degree + 1), rel_tol=0, abs_tol=8 * math.sqrt(n) * EPS64
        )


def test_gauss_legendre_at_its_limit_builds_and_beyond_it_says_what_to_do() -> None:
    alphas, weights = quadrature("gausslegendre", MAX_GAUSS_LEGENDRE_STEPS)  # `--num-steps 100000`
    assert len(alphas) == MAX_GAUSS_LEGENDRE_STEPS
    assert math.isclose(math.fsum(weights), 1.0, rel_tol=0, abs_tol=16 * EPS64)
    beyond = MAX_GAUSS_LEGENDRE_STEPS + 1
    with pytest.raises(
        ValueError, match=rf"n_steps={beyond} is more than the {MAX_GAUSS_LEGENDRE_STEPS} points.*riemann_trapezoid"
    ):
        quadrature("gausslegendre", beyond)
    with pytest.raises(ValueError, match=rf"n_steps={beyond}"):
        check_rule("gausslegendre", beyond)
    assert len(quadrature("riemann_trapezoid", beyond)[0]) == beyond  # the Riemann rules take any n


def test_rules_are_cached_and_callers_cannot_corrupt_the_cache() -> None:
    first, _ = quadrature("gausslegendre", 37)
    first[0] = -1.0
    again, _ = quadrature("gausslegendre", 37)
    assert again[0] > 0
