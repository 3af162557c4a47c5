"""``method="kink_midpoint"``: the midpoint rule with certified kink corrections, and its error estimate.

Along the path a ReLU network is piecewise linear, and the midpoint rule errs where a kink falls between two nodes.
From the one pass at the ``n`` midpoint nodes (gradients and forward values) each stretch's kink is located; one
forward-only pass checks the largest ``ceil(n / 4)`` of them (the certificate: :func:`torch.topk`, a fixed shape, no
host sync), and the certified corrections become per-node, per-state weights, blended with end-corrected midpoint
weights by the path's roughness and summed by the backend's accumulation. The estimate keeps what was not corrected.
The formulas, the thresholds and when the estimate reads wrong: ``docs/trust.md`` (the default rule and its estimate).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_ig.attribution.estimate import ROUGHNESS, block_size, kinked_share, slopes_and_roughness

__all__ = ["BUDGET_NODES", "kink_rule"]

BUDGET_NODES = 56
"""The kink rule's nodes where ``n_steps="budget"`` gives 64 points (112 for 128): 56 gradient rows and the
certificate's 18 forward rows per state cost about what 64 gradient rows do (docs/benchmarks.md)."""

_CERTIFIED = 0.25  # the stretches certified per state: ceil(n / 4)
_PROBED = 0.25  # of those, the largest corrections' share checked at a second place too
_FLOOR = 32.0  # the certificate's rounding floor, in eps x the largest |value| on the path
_CANCELLING = (15.0, 30.0)  # N_k from which a correction fades out, and where it is off
_CORRECTED = (0.85, 0.95)  # the roughness from which kinks are corrected, and where in full (ReLU states: >= 0.96)
_ESTIMATED = (0.3, 0.6)  # the roughness from which the estimate reads the kink model, and where in full
_SMOOTH_PAIRS = 4  # end-corrected midpoint weights exact to degree 2 x 4 - 1 = 7
_ROUNDING = 2.0  # the float32 sums' rounding, in eps x sum_k h ||(x - b) g_k||_1
_MEASURED = 0.1  # the rounding is measured where its bound is above this share of the other figures (CPU)
_WEIGHTS: dict[tuple[int, int, bool, torch.dtype, torch.device], Tensor] = {}
_Rows = Callable[[Tensor], Tensor]


def kink_rule(
    grads: Tensor, values: Tensor, ends: Tensor, diff: Tensor, alphas: Tensor, values_at: _Rows, eps: float
) -> tuple[Tensor, _Rows]:
    """The kink rule's node weights ``(T, n, B)`` in the gradients' dtype, and the unnormalised estimate ``(T, B)`` of
    the L1 error (divide by ``||a||_1``: :func:`~lightning_ig.attribution.estimate.accuracy_rows`) as a function of
    the attributions the weights gave (on the CPU it measures their rounding where it can be the error).

    Args:
        grads: ``(T, n, B, F)`` the gradients at the ``n`` midpoint nodes, in the accumulation dtype.
        values: ``(T, n, B)`` the forward values there.
        ends: ``(2 c, B, T)`` ``F(x)``, ``F(b)`` (then their repeats).
        diff: ``(B, F)`` ``x - b`` in the accumulation dtype.
        alphas: ``(n,)`` the midpoint nodes.
        values_at: the forward values ``(T, k, B)`` at per-state positions ``(T, k, B)`` along the path (float64;
            forward only): the certificate.
        eps: the forward's rounding unit (:func:`~lightning_ig.attribution.estimate.slopes_and_roughness`).
    """
    n, acc, f64 = grads.shape[1], grads.dtype, torch.float64
    h, tiny, diff64 = 1.0 / n, torch.finfo(f64).tiny, diff.to(f64)
    slopes, roughness = slopes_and_roughness(grads, diff, eps)  # (T, n, B), (T, B)
    slopes, values, roughness = slopes.to(f64), values.to(f64), roughness.to(f64)  # the scalar algebra in float64
    jump_l1, smooth, rounding = _passes(grads, diff, diff64, eps)
    sigma = slopes[:, 1:] - slopes[:, :-1]  # (T, n - 1, B)
    rho = values[:, 1:] - values[:, :-1] - (slopes[:, 1:] + slopes[:, :-1]) * (h / 2)
    kinked = sigma != 0
    offset = torch.where(kinked, rho / torch.where(kinked, sigma, 1.0), 0.0).clamp_(-h / 2, h / 2)  # 0 unkinked
    cancelling = jump_l1 / sigma.abs().clamp_min_(tiny)  # N_k >= 1 where kinked
    size = jump_l1 * offset.abs()  # ||o_k J_k||_1: the correction's size
    # Corrections only where the path is plainly kinked: a smooth transition about a node spacing wide (a trained
    # tanh agent's sharpest states) reads half kinked, and "corrections" there made the rule worse than the midpoint
    corrected = kinked_share(roughness, _CORRECTED, n)  # (T, B)
    count = min(n - 1, math.ceil(_CERTIFIED * n))
    if grads.device.type == "cpu" and not bool((corrected > 0).any()):  # a host check is free here: no state to
        count = 0  # correct (a smooth network), so no certificate pass: the weights are the same without it
    weight = excess = torch.zeros_like(rho)
    if count:
        top = size.topk(count, dim=1).indices  # (T, count, B)
        floor = _FLOOR * torch.finfo(acc).eps * values.abs().amax(1, keepdim=True)  # (T, 1, B): the rounding
        over = (_misses(values, slopes, offset, top, alphas.to(f64), values_at) - floor).clamp_min_(0)
        excess = excess.scatter(1, top, over)
        weight = weight.scatter(1, top, (1 - over / rho.gather(1, top).abs().clamp_min_(tiny)).clamp_(0, 1))
    low, high = _CANCELLING
    weight = weight * ((high - cancelling) / (high - low)).clamp_(0, 1) * corrected.unsqueeze(1)
    corrections = weight * offset  # (T, n - 1, B); every figure below is 0 where no kink was located (offset 0)
    lam = kinked_share(roughness, ROUGHNESS, n).unsqueeze(1)  # the weights: midpoint where kinked, end-corrected
    smooth_weights = _smooth_weights(n, _SMOOTH_PAIRS, f64, grads.device).view(1, n, 1)  # where smooth
    weights = smooth_weights + lam * (h - smooth_weights + _node_coefficients(corrections))
    # the estimate: the uncorrected kink models as one signed vector, the figures without a direction in quadrature
    signed = (_contract(_node_coefficients(offset - corrections), grads).to(f64) * diff64).abs_().sum(-1)
    f_input, f_baseline = ends[:2].to(f64).transpose(1, 2)  # (T, B) each
    start = values[:, 0] - f_baseline - slopes[:, 0] * (h / 2)  # [0, c_0]: the rule uses g_0 on it
    end = f_input - values[:, -1] - slopes[:, -1] * (h / 2)  # [c_n-1, 1]: g_n-1
    left = rho - sigma * offset  # what one kink per stretch leaves unexplained (a jumpless stretch: its rounding)
    leftover = weight * torch.minimum(excess * cancelling.clamp_(max=1e3), size)
    free = torch.cat([start.unsqueeze(1), end.unsqueeze(1), left, leftover], 1)  # (T, 2 n, B)
    kink = signed + (free * free).sum(1).sqrt_()
    read = kinked_share(roughness, _ESTIMATED, n)  # the estimate's ``lam``: the kink model from a lower roughness
    model = torch.maximum((1 - read) * smooth, read * kink)

    def numerator(attributions: Tensor) -> Tensor:
        measured = grads.device.type == "cpu" and eps <= torch.finfo(acc).eps  # where a host check is free
        at_rounding = (read == 0) & (rounding > _MEASURED * model) if measured else None  # the bound sets the figure
        if at_rounding is not None and bool(at_rounding.any()):
            return (model + _measured_rounding(rounding, at_rounding, weights, grads, diff, attributions)).to(acc)
        return (model + rounding).to(acc)

    return weights.to(acc), numerator


def _misses(values: Tensor, slopes: Tensor, offset: Tensor, top: Tensor, alphas: Tensor, at: _Rows) -> Tensor:
    """``(T, count, B)`` how far the value at each ``top`` stretch's located kink misses its neighbouring pieces,
    0 where one kink explains it: the certificate (float64, as :func:`kink_rule` has them)."""
    count, h = top.shape[1], 1.0 / values.shape[1]
    # Two kinks of opposite slope changes pass the check at the located kink (there the value is on both outer
    # lines): the largest corrections are checked once more, halfway from it to the stretch's farther end
    probed = math.ceil(_PROBED * count)
    index = torch.cat([top, top[:, :probed]], 1)  # (T, count + probed, B)
    inside = h / 2 - offset.gather(1, index)  # the located kink, from the stretch's left node
    right = inside[:, count:] <= h / 2  # the probe's side: the farther end
    inside[:, count:] = inside[:, count:] / 2 + right * (h / 2)
    found = at(alphas[index] + inside)  # (T, count + probed, B)
    # the value's distance from the pieces either side, each extended to where it was found
    off_left = (found - values[:, :-1].gather(1, index) - slopes[:, :-1].gather(1, index) * inside).abs_()
    off_right = (found - values[:, 1:].gather(1, index) + slopes[:, 1:].gather(1, index) * (h - inside)).abs_()
    miss = torch.maximum(off_left[:, :count], off_right[:, :count])  # on both pieces at the kink
    beyond = torch.where(right, off_right[:, count:], off_left[:, count:])  # on its side's piece at the probe
    miss[:, :probed] = torch.maximum(miss[:, :probed], beyond)
    return miss


def _measured_rounding(
    bound: Tensor, chosen: Tensor, weights: Tensor, grads: Tensor, diff: Tensor, attributions: Tensor
) -> Tensor:
    """``(T, B)`` float64: ``||a - (x - b) sum_k w_k g_k||_1``, the sum in float64 (as the quadrature rules' estimate
    has it), for the ``chosen (T, B)`` states, whose error can be as small as the sums' rounding; the bound elsewhere"""
    states = chosen.any(0).nonzero().squeeze(1)  # (S,)
    grads64 = grads.index_select(2, states).to(torch.float64)  # (T, n, S, F)
    exact = (weights.index_select(2, states).unsqueeze(-1) * grads64).sum(1) * diff.index_select(0, states)
    measured = (exact - attributions.index_select(1, states)).abs().sum(-1)  # (T, S)
    kept = bound.index_select(1, states)
    return bound.index_copy(1, states, torch.where(chosen.index_select(1, states), measured, kept))


def _node_coefficients(per_stretch: Tensor) -> Tensor:
    """``(T, n, B)``: ``sum_k c_k (g_k+1 - g_k)`` as a coefficient per node, from ``c (T, n - 1, B)``."""
    return F.pad(per_stretch, (0, 0, 1, 0)) - F.pad(per_stretch, (0, 0, 0, 1))


def _contract(coefficients: Tensor, grads: Tensor) -> Tensor:
    """``(T, B, F)``: ``sum_k c_k g_k`` for ``c (T, n, B)`` (elementwise, in blocks of nodes: no TF32 matmul)."""
    coefficients, size = coefficients.to(grads.dtype), block_size(grads, 3)
    blocks = (slice(k, k + size) for k in range(0, grads.shape[1], size))
    return functools.reduce(torch.add, ((coefficients[:, k].unsqueeze(-1) * grads[:, k]).sum(1) for k in blocks))


def _passes(grads: Tensor, diff: Tensor, diff64: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """One pass over the gradients in blocks of nodes: ``||J_k||_1 (T, n - 1, B)``, the smooth model's figure and
    the rounding term ``(T, B)`` (in a half-precision forward's eps: its gradients carry it), all float64."""
    n, size = grads.shape[1], block_size(grads, 3)
    reach = diff.abs()
    jumps, masses = [], []
    for k in range(0, n, size):
        block = grads[:, k : k + size + 1]  # (T, m + 1, B, F): one node past the block for its last jump
        jumps.append((block[:, 1:] - block[:, :-1]).abs_().mul_(reach).sum(-1))  # in place: one temporary
        masses.append((block[:, : min(size, n - k)].abs().sum(1) * reach).sum(-1))  # (T, B)
    # the weights against those a degree pair lower (7 against 5 from 8 nodes) differ on the first and last nodes only
    pairs = min(_SMOOTH_PAIRS, n // 2)
    ends = _smooth_weights(n, pairs, grads.dtype, grads.device, gap=True).view(1, -1, 1, 1)
    smooth = (ends * torch.cat([grads[:, :pairs], grads[:, n - pairs :]], 1)).sum(1)  # (T, B, F)
    jump_l1 = (jumps[0] if len(jumps) == 1 else torch.cat(jumps, 1)).to(torch.float64)  # (T, n - 1, B)
    scale = max(_ROUNDING * torch.finfo(grads.dtype).eps, eps) / n
    rounding = functools.reduce(torch.add, masses).to(torch.float64).mul_(scale)
    return jump_l1, (smooth.to(torch.float64) * diff64).abs_().sum(-1), rounding


def _smooth_weights(n: int, pairs: int, dtype: torch.dtype, device: torch.device, *, gap: bool = False) -> Tensor:
    """``(n,)`` the midpoint weights with the first and last ``pairs`` corrected so the rule is exact for
    polynomials of degree ``2 pairs - 1`` (the plain midpoint rule for ``pairs = 0``); with ``gap``, the ``2 pairs``
    end weights' difference from those a degree pair lower (the smooth figure's); cached per device."""
    key = (n, pairs, gap, dtype, device)
    if key not in _WEIGHTS:
        tensor = torch.tensor(_end_corrected(n, pairs), dtype=dtype, device=device)
        if gap:  # the two weights as the rule has them, rounded to the dtype: their difference is the figure's
            tensor = tensor - torch.tensor(_end_corrected(n, max(pairs - 1, 0)), dtype=dtype, device=device)
            tensor = torch.cat([tensor[:pairs], tensor[n - pairs :]])
        if len(_WEIGHTS) >= 256 or (tensor.is_cuda and torch.cuda.is_current_stream_capturing()):
            return tensor
        _WEIGHTS[key] = tensor
    return _WEIGHTS[key]


@functools.lru_cache(maxsize=64)
def _end_corrected(n: int, pairs: int) -> tuple[float, ...]:
    """The weights of :func:`_smooth_weights` in float64: symmetric end factors ``1 + d_j`` on the first and last
    ``r = min(pairs, n // 2)`` nodes, chosen so the even moments ``(c - 1/2)^p``, ``p < 2 r``, integrate exactly."""
    r = min(pairs, n // 2)
    nodes, h = (np.arange(n) + 0.5) / n, 1.0 / n
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
