"""``method="kink_midpoint"``: the midpoint rule with certified kink corrections, and its error estimate.

Along the path a ReLU network is piecewise linear, so the integrand ``t(alpha) = (x - b) * g(alpha)`` is a step
function and the midpoint rule's error is made where a kink falls between two nodes. The rule finds those kinks
from what the gradient pass holds, checks each with one forward value, and corrects the ones the check confirms:

1. the gradients ``g_k`` and forward values ``v_k`` at the ``n`` midpoint nodes ``c_k = (k + 1/2) / n`` (one
   pass, as for ``riemann_middle``);
2. per stretch ``[c_k, c_k+1]`` (scalars in float64): the slopes ``s_k = (x - b) . g_k``, their jump
   ``sigma_k``, the value residual ``rho_k = v_k+1 - v_k - h (s_k + s_k+1) / 2``, the kink's offset from the
   stretch's middle ``o_k = rho_k / sigma_k`` (clipped to the stretch), the vector jump ``J_k = t_k+1 - t_k``: one
   kink makes the rule's error on the stretch ``o_k J_k`` exactly;
3. the certificate: one forward-only pass evaluates ``F`` at the located kink of the ``ceil(n / 4)`` stretches
   per state with the largest ``|o_k| ||J_k||_1`` (:func:`torch.topk`: a fixed shape, no host sync). With a single
   kink there the value lies on both neighbouring linear pieces; ``delta_k``, its distance from the nearer
   prediction's worse side, says how far the one-kink model is off. The stretch is corrected by ``w_k o_k J_k``,
   ``w_k = clamp(1 - (delta_k - rounding) / |rho_k|, 0, 1) * clamp((30 - N_k) / 15, 0, 1)``, where
   ``N_k = ||J_k||_1 / |sigma_k|`` (many features jumping against each other: the scalar residual cannot place
   the vector); stretches without a certificate are not corrected;
4. where the path looks smooth (the roughness of :mod:`~lightning_ig.attribution.estimate`: tanh, SiLU, GELU),
   the midpoint weights corrected at the ends to be exact for polynomials of degree 7 instead; in between, the
   two blended by the roughness weight ``lam``.

The attributions are ``(x - b) * sum_k W_k g_k`` with one weight per node and state ``W (T, n, B)``, accumulated
by the backend's operation (the CUDA kernel or its twin).

The estimate keeps what the rule did not correct and what the certificate left over:

    kink = ||sum_k (1 - w_k) o_k J_k||_1 + sqrt(r_0^2 + r_n^2 + sum_k left_k^2 + sum_k cert_k^2)

the uncorrected kink models as one signed vector (their directions add or cancel as the errors do), and the
figures without a direction in quadrature (independent errors of unknown sign): the end pieces' residuals
``r_0, r_n``, what one kink per stretch leaves unexplained ``left_k = rho_k - sigma_k o_k``, and the corrected
stretches' leftover ``cert_k = w_k min(delta_k N_k, ||o_k J_k||_1)``. With the smooth model's figure (the degree-7
weights against the degree-5 ones) and the rounding of the float32 sums::

    attribution_error = (max((1 - lam) smooth, lam kink) + 2 eps sum_k h ||(x - b) g_k||_1) / ||a||_1

When it can be wrong: several kinks in one stretch whose effects cancel in the value (``rho ~ 0``) are invisible
to the certificate and to the estimate; the value sees no direction, so with few features (CartPole's 4) the
estimate of a multi-kink error can be off either way; at many nodes (hundreds) the uncorrected remainder is
smaller than the models' own error and the estimate reads low: the rule is for the regime where points are dear
(``n_steps="budget"`` picks it where the budget gives 64 points or fewer). ``docs/trust.md`` has the figures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_ig.attribution.estimate import ROUGHNESS, slopes_and_roughness

__all__ = ["BUDGET_NODES", "KinkRule", "kink_estimate", "kink_rule"]

BUDGET_NODES = 56
"""The kink rule's nodes where ``n_steps="budget"`` gives 64 points: 56 gradient rows and the certificate's 14
forward rows per state cost about what 64 gradient rows do."""

_CERTIFIED = 0.25  # the stretches certified per state: ceil(n / 4)
_FLOOR = 32.0  # the certificate's rounding floor, in eps x the largest |value| on the path
_CANCELLING = (15.0, 30.0)  # N_k from which a correction fades out, and where it is off
_SMOOTH_PAIRS = 4  # end-corrected midpoint weights exact to degree 2 x 4 - 1 = 7
_ROUNDING = 2.0  # the float32 sums' rounding, in eps x sum_k h ||(x - b) g_k||_1
_BLOCK_ELEMENTS = 1 << 24  # the most elements of a temporary the size of a block of gradients
_WEIGHTS: dict[tuple[int, int, torch.dtype, torch.device], Tensor] = {}


class KinkRule(NamedTuple):
    """What :func:`kink_rule` found: the node weights, and what :func:`kink_estimate` needs besides."""

    weights: Tensor  # (T, n, B) the weight of each node per state, in the accumulation dtype
    remainder: Tensor  # (T, n, B) float64: the uncorrected kink models, as node coefficients
    unsigned: Tensor  # (T, B) float64: the squares of the stretches' figures without a direction, summed
    ends: tuple[Tensor, Tensor]  # (T, B) the values and slopes at the first and last node ...
    smooth: Tensor  # (T, B) float64: the smooth model's figure
    rounding: Tensor  # (T, B) float64
    lam: Tensor  # (T, B) float64: the roughness weight (1: kinks, 0: smooth)


def kink_rule(
    grads: Tensor, values: Tensor, diff: Tensor, alphas: Tensor, values_at: Callable[[Tensor], Tensor]
) -> KinkRule:
    """The node weights of the kink rule (the module docstring) and the parts of its estimate.

    Args:
        grads: ``(T, n, B, F)`` the gradients at the ``n`` midpoint nodes, in the accumulation dtype.
        values: ``(T, n, B)`` the forward values there.
        diff: ``(B, F)`` ``x - b`` in the accumulation dtype.
        alphas: ``(n,)`` the midpoint nodes.
        values_at: the forward values ``(T, k, B)`` at per-state positions ``(T, k, B)`` along the path (float64;
            forward only): the certificate.
    """
    n, acc, f64 = grads.shape[1], grads.dtype, torch.float64
    h = 1.0 / n
    slopes, roughness = slopes_and_roughness(grads, diff)  # (T, n, B), (T, B)
    slopes, values = slopes.to(f64), values.to(f64)  # the scalar algebra in float64: T n B numbers
    jump_l1, smooth, rounding = _passes(grads, diff, n)
    sigma = slopes[:, 1:] - slopes[:, :-1]  # (T, n - 1, B)
    rho = values[:, 1:] - values[:, :-1] - (slopes[:, 1:] + slopes[:, :-1]) * (h / 2)
    kinked = sigma != 0
    offset = torch.where(kinked, rho / torch.where(kinked, sigma, 1.0), 0.0).clamp(-h / 2, h / 2)
    tiny = torch.finfo(f64).tiny
    cancelling = jump_l1 / sigma.abs().clamp_min(tiny)  # N_k >= 1 where kinked
    left_node = alphas.to(f64)[:-1].view(1, -1, 1)  # (1, n - 1, 1)
    kappa = left_node + h / 2 - offset  # (T, n - 1, B) the located kinks
    count = min(n - 1, math.ceil(_CERTIFIED * n))
    top = (jump_l1 * offset.abs() * kinked).topk(count, dim=1).indices  # (T, count, B)
    excess = torch.zeros_like(rho)
    weight = torch.zeros_like(rho)
    if count:
        at = kappa.gather(1, top)
        certified = values_at(at)  # (T, count, B)
        start = left_node.expand_as(kappa).gather(1, top)
        miss = torch.maximum(
            (certified - values[:, :-1].gather(1, top) - slopes[:, :-1].gather(1, top) * (at - start)).abs(),
            (certified - values[:, 1:].gather(1, top) + slopes[:, 1:].gather(1, top) * (start + h - at)).abs(),
        )
        floor = _FLOOR * torch.finfo(acc).eps * values.abs().amax(1, keepdim=True)  # (T, 1, B)
        over = (miss - floor).clamp_min(0)
        excess = excess.scatter(1, top, over)
        weight = weight.scatter(1, top, (1 - over / rho.gather(1, top).abs().clamp_min(tiny)).clamp(0, 1))
    low, high = _CANCELLING
    weight = weight * ((high - cancelling) / (high - low)).clamp(0, 1) * kinked
    low, high = ROUGHNESS
    lam = ((roughness.to(f64) - low) / (high - low)).clamp(0, 1) if n >= 3 else torch.ones_like(roughness, dtype=f64)
    smooth_weights = _smooth_weights(n, _SMOOTH_PAIRS, f64, grads.device).view(1, n, 1)
    corrected = _node_coefficients(weight * offset)  # (T, n, B)
    weights = lam.unsqueeze(1) * (h + corrected) + (1 - lam.unsqueeze(1)) * smooth_weights
    left = rho - sigma * offset  # what one kink per stretch leaves unexplained (a jumpless stretch: its rounding)
    leftover = weight * torch.minimum(excess * cancelling.clamp(max=1e3), jump_l1 * offset.abs())
    return KinkRule(
        weights=weights.to(acc),
        remainder=_node_coefficients((1 - weight) * offset),
        unsigned=left.pow(2).sum(1) + leftover.pow(2).sum(1),
        ends=(torch.stack([values[:, 0], values[:, -1]]), torch.stack([slopes[:, 0], slopes[:, -1]])),
        smooth=smooth,
        rounding=rounding,
        lam=lam,
    )


def kink_estimate(rule: KinkRule, grads: Tensor, diff: Tensor, f_input: Tensor, f_baseline: Tensor) -> Tensor:
    """The unnormalised estimate ``(T, B)`` of the kink rule's L1 error (the module docstring), in the gradients'
    dtype: divide by ``||a||_1`` (:func:`~lightning_ig.attribution.estimate.accuracy_rows`).

    Args:
        rule: what :func:`kink_rule` returned for these gradients.
        grads: ``(T, n, B, F)``.
        diff: ``(B, F)``.
        f_input: ``(T, B)`` ``F(x)``.
        f_baseline: ``(T, B)`` ``F(b)``.
    """
    f64, half = torch.float64, 0.5 / grads.shape[1]
    signed = (_contract(rule.remainder, grads).to(f64) * diff.to(f64)).abs().sum(-1)  # (T, B)
    (first, last), (first_slope, last_slope) = rule.ends
    start = first - f_baseline.to(f64) - first_slope * half  # [0, c_0]: the rule uses g_0 on it
    end = f_input.to(f64) - last - last_slope * half  # [c_n-1, 1]: g_n-1
    kink = signed + (start.pow(2) + end.pow(2) + rule.unsigned).sqrt()
    return (torch.maximum((1 - rule.lam) * rule.smooth, rule.lam * kink) + rule.rounding).to(grads.dtype)


def _node_coefficients(per_stretch: Tensor) -> Tensor:
    """``(T, n, B)``: ``sum_k c_k (g_k+1 - g_k)`` as a coefficient per node, from ``c (T, n - 1, B)``."""
    return F.pad(per_stretch, (0, 0, 1, 0)) - F.pad(per_stretch, (0, 0, 0, 1))


def _block(grads: Tensor) -> int:
    return max(1, min(grads.shape[1], _BLOCK_ELEMENTS // max(1, 3 * grads[:, :1].numel())))


def _contract(coefficients: Tensor, grads: Tensor) -> Tensor:
    """``(T, B, F)``: ``sum_k c_k g_k`` for ``c (T, n, B)`` (elementwise, in blocks of nodes: no TF32 matmul)."""
    coefficients = coefficients.to(grads.dtype)
    size, total = _block(grads), None
    for k in range(0, grads.shape[1], size):
        part = (coefficients[:, k : k + size].unsqueeze(-1) * grads[:, k : k + size]).sum(1)
        total = part if total is None else total + part
    assert total is not None  # noqa: S101 - n >= 1
    return total


def _passes(grads: Tensor, diff: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """One pass over the gradients in blocks of nodes: ``||J_k||_1 (T, n - 1, B)``, the smooth model's figure and
    the rounding term ``(T, B)``, all float64."""
    f64, size = torch.float64, _block(grads)
    gap = _smooth_weights(n, _SMOOTH_PAIRS, grads.dtype, grads.device) - _smooth_weights(
        n, _SMOOTH_PAIRS - 1, grads.dtype, grads.device
    )  # (n,) the degree-7 weights against the degree-5 ones
    reach = diff.abs()
    jumps, smooth, size_sum = [], None, None
    for k in range(0, n, size):
        block = grads[:, k : k + size + 1]  # (T, m + 1, B, F): one node past the block for its last jump
        jumps.append((block[:, 1:] - block[:, :-1]).abs_().mul_(reach).sum(-1))  # in place: one temporary
        own = block[:, : min(size, n - k)]
        part = (gap[k : k + size].view(1, -1, 1, 1) * own).sum(1)  # (T, B, F)
        mass = (own.abs().sum(1) * reach).sum(-1)  # (T, B)
        smooth = part if smooth is None else smooth + part
        size_sum = mass if size_sum is None else size_sum + mass
    assert smooth is not None and size_sum is not None  # noqa: S101 - n >= 1
    jump_l1 = torch.cat(jumps, 1).to(f64)  # (T, n - 1, B)
    smooth_figure = (smooth.to(f64) * diff.to(f64)).abs().sum(-1)
    rounding = _ROUNDING * torch.finfo(grads.dtype).eps * size_sum.to(f64) / n
    return jump_l1, smooth_figure, rounding


def _smooth_weights(n: int, pairs: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``(n,)`` the midpoint weights with the first and last ``pairs`` corrected so the rule is exact for
    polynomials of degree ``2 pairs - 1`` (the plain midpoint rule for ``pairs = 0``); cached per device."""
    key = (n, pairs, dtype, device)
    if key not in _WEIGHTS:
        tensor = torch.tensor(_end_corrected(n, pairs), dtype=dtype, device=device)
        if len(_WEIGHTS) >= 256 or (tensor.is_cuda and torch.cuda.is_current_stream_capturing()):
            return tensor
        _WEIGHTS[key] = tensor
    return _WEIGHTS[key]


@functools.lru_cache(maxsize=64)
def _end_corrected(n: int, pairs: int) -> tuple[float, ...]:
    """The weights of :func:`_smooth_weights` in float64: symmetric end factors ``1 + d_j`` on the first and last
    ``r = min(pairs, n // 2)`` nodes, chosen so the even moments ``(c - 1/2)^p``, ``p < 2 r``, integrate exactly."""
    r = min(pairs, n // 2)
    nodes = (np.arange(n) + 0.5) / n
    h = 1.0 / n
    weights = np.full(n, h)
    if r == 0:
        return tuple(weights.tolist())
    system, rhs = np.zeros((r, r)), np.zeros(r)
    for i, p in enumerate(range(0, 2 * r, 2)):
        monomial = (nodes - 0.5) ** p
        rhs[i] = 0.5**p / (p + 1) - h * monomial.sum()  # integral of (c - 1/2)^p over [0, 1] minus the rule's
        for j in range(r):
            system[i, j] = h * (monomial[j] + monomial[n - 1 - j])
    factors = np.linalg.solve(system, rhs)
    weights[:r] *= 1 + factors
    weights[n - r :][::-1] *= 1 + factors
    return tuple(weights.tolist())
