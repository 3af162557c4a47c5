"""Quadrature rules: pinned values for small n, Captum agreement, exactness, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_ig.quadrature import METHODS, nests_on_doubling, quadrature


def test_pinned_values_for_small_n() -> None:
    assert quadrature("riemann_left", 4) == ([0.0, 0.25, 0.5, 0.75], [0.25] * 4)
    assert quadrature("riemann_right", 4) == ([0.25, 0.5, 0.75, 1.0], [0.25] * 4)
    assert quadrature("riemann_middle", 2) == ([0.25, 0.75], [0.5, 0.5])
    assert quadrature("riemann_trapezoid", 3) == ([0.0, 0.5, 1.0], [0.25, 0.5, 0.25])
    alphas, weights = quadrature("gausslegendre", 2)
    root = 0.5 / math.sqrt(3.0)
    np.testing.assert_allclose(alphas, [0.5 - root, 0.5 + root], rtol=0, atol=1e-15)
    np.testing.assert_allclose(weights, [0.5, 0.5], rtol=0, atol=1e-15)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 3, 7, 50, 128])
def test_matches_captum(method: str, n: int) -> None:
    approximation_methods = pytest.importorskip("captum.attr._utils.approximation_methods")
    step_sizes, alphas = approximation_methods.approximation_parameters(method)
    ours_alphas, ours_weights = quadrature(method, n)
    # Captum's Riemann alphas come from a float32 linspace: equal to float32 rounding.
    np.testing.assert_allclose(ours_alphas, alphas(n), rtol=0, atol=1e-7)
    if method == "riemann_trapezoid":
        # Captum's trapezoid weights sum to (n-1)/n; ours are the true rule (same shape, rescaled).
        np.testing.assert_allclose(np.array(ours_weights) * (n - 1) / n, step_sizes(n), rtol=1e-12)
    else:
        np.testing.assert_allclose(ours_weights, step_sizes(n), rtol=1e-12)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 5, 33])
def test_rules_integrate_constants_and_lines_exactly(method: str, n: int) -> None:
    alphas, weights = map(np.asarray, quadrature(method, n))
    assert np.all((alphas >= 0) & (alphas <= 1))
    assert math.isclose(weights.sum(), 1.0, rel_tol=0, abs_tol=1e-12)
    if method in ("riemann_middle", "riemann_trapezoid", "gausslegendre"):
        assert math.isclose(float(weights @ alphas), 0.5, abs_tol=1e-12)


def test_gauss_legendre_is_exact_for_degree_2n_minus_1() -> None:
    alphas, weights = map(np.asarray, quadrature("gausslegendre", 4))
    # integral_0^1 a^7 da = 1/8
    assert math.isclose(float(weights @ alphas**7), 1 / 8, rel_tol=1e-13)


@pytest.mark.parametrize("method", ["riemann_left", "riemann_right", "riemann_trapezoid"])
def test_nesting_rules_reuse_their_points(method: str) -> None:
    assert nests_on_doubling(method)
    coarse, _ = quadrature(method, 5)
    refined_n = 9 if method == "riemann_trapezoid" else 10
    fine, _ = quadrature(method, refined_n)
    assert set(np.round(coarse, 12)) <= set(np.round(fine, 12))


def test_non_nesting_rules_say_so() -> None:
    assert not nests_on_doubling("gausslegendre")
    assert not nests_on_doubling("riemann_middle")


def test_unknown_method_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown method 'simpson'.*gausslegendre"):
        quadrature("simpson", 10)


@pytest.mark.parametrize("n", [0, -3])
def test_n_below_one_is_rejected(n: int) -> None:
    with pytest.raises(ValueError, match=f"n_steps must be >= 1, got {n}"):
        quadrature("gausslegendre", n)


def test_trapezoid_needs_two_points() -> None:
    with pytest.raises(ValueError, match="n_steps must be >= 2, got 1"):
        quadrature("riemann_trapezoid", 1)


@pytest.mark.parametrize("n", [2.5, "10", True])
def test_non_integer_n_is_rejected(n: object) -> None:
    with pytest.raises(TypeError, match="n_steps must be an int"):
        quadrature("riemann_left", n)  # type: ignore[arg-type]
