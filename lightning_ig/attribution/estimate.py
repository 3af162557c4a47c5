"""The error figures of a run, computed on the device from what the path pass already holds.

:func:`kink_estimate` is the reference-free estimate of each state's ``||a - a_exact||_1 / ||a_exact||_1``;
:func:`accuracy_rows` puts it beside the mass-relative completeness error and the attribution mass. Both are
torch operations in the accumulation dtype: no host synchronisation, no data-dependent shapes, so they run
inside a CUDA-graph capture like the rest of the path.

How the estimate is computed
    Along the path a ReLU network is piecewise linear, so the integrand ``g(alpha)`` (the gradient at
    ``b + alpha (x - b)``) is a step function. Every positive rule gives node ``k`` (at ``c_k``) the cell
    ``[beta_k, beta_{k+1}]`` with ``beta = [0, cumsum(w)]``, so the rule's error is made where a kink falls
    inside a cell. With the path terms ``t_k = (x - b) * g_k`` (what the accumulation sums), their sum
    ``s_k`` (the slope ``dF/dalpha`` at the node) and the forward values ``v_k`` at the nodes, the stretch
    between two neighbouring nodes, split by the rule at ``beta = beta_{k+1}``, has the exact residual
    ``rho_k = v_{k+1} - v_k - s_k (beta - c_k) - s_{k+1} (c_{k+1} - beta)``. One kink at ``kappa`` in the
    stretch makes the stretch's error vector exactly ``J_k (beta - kappa)`` (``J_k = t_{k+1} - t_k``) and
    its residual ``sigma_k (beta - kappa)`` (``sigma_k = s_{k+1} - s_k``): the residual locates the kink, the
    jump gives its per-feature error. So with ``o_k = rho_k / sigma_k`` clipped to the stretch (0 where
    ``sigma_k = 0``)::

        e = sum_k o_k J_k                                                  # signed per-feature error, (B, F)
        u = sum_k |rho_k - sigma_k o_k| + |v_0 - F(b) - s_0 c_0| + |F(x) - v_{n-1} - s_{n-1} (1 - c_{n-1})|
        attribution_error = error_scale * (||e||_1 + u) / ||a||_1

    ``u`` counts unsigned what one kink per stretch cannot explain (several kinks, a pulse) and the two end
    pieces, which have no gradient at ``b`` or ``x``. No gradient beyond the rule's is needed: the forward
    values come with the gradients (autograd computes them; with finite differences they are the mean of each
    node's probes, ``F(p) + O(h^2)``, exact on a linear piece).

When it can be wrong (measured against exact references; ``docs/trust.md``)
    * Several kinks in one stretch: ``rho / sigma`` is a weighted mean of their places, so the vector is wrong and
      only the magnitude is about right (MinAtar); kinks whose scalar effects cancel (``rho ~ 0``) are invisible.
      With few features (CartPole, 4) this is not averaged out: 80-96% of states within 2x at 64 nodes, the
      misses mostly over-estimates.
    * A pulse (the gradient changes and changes back between two nodes) is seen by its residual only.
    * Kinks crowded at an end (inputs far off the training distribution): the end pieces count by their residual
      only and the estimate reads 0.5-0.6x with the midpoint rule; the calibrated rule or scale corrects it.
    * Smooth networks: the one-direction model misreads curvature and overstates 4-10x (midpoint) or far more
      (Gauss-Legendre); the calibrated scale (0.05-0.44 measured) corrects it.
    * After refinement that chases the estimate it reads low; ``n_steps="auto"`` refines uniformly for this reason.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ACCURACY_ROWS", "accuracy_rows", "kink_estimate"]

ACCURACY_ROWS = ("attribution_error", "mass_relative_error", "attribution_mass")
"""The rows of :func:`accuracy_rows` ``(3, T, B)``; ``attribution_error`` is unscaled (``error_scale`` 1)."""

# At most this many elements in a temporary the size of a block of gradients: the estimate streams over the nodes
# in blocks, so its memory stays bounded whatever n_steps (one block in the common case).
_BLOCK_ELEMENTS = 1 << 26


def kink_estimate(
    grads: Tensor, values: Tensor, diff: Tensor, alphas: Tensor, weights: Tensor, f_input: Tensor, f_baseline: Tensor
) -> Tensor:
    """The unnormalised estimate ``||e||_1 + u`` of the rule's L1 error, per target and state ``(T, B)``.

    Args:
        grads: ``(T, n, B, F)`` the gradients at the nodes, in the accumulation dtype.
        values: ``(T, n, B)`` the forward values at the nodes.
        diff: ``(B, F)`` ``x - b`` in the accumulation dtype.
        alphas: ``(n,)`` the nodes, ascending.
        weights: ``(n,)`` their weights (positive, summing to one).
        f_input: ``(T, B)`` ``F(x)``.
        f_baseline: ``(T, B)`` ``F(b)``.

    Returns:
        ``(T, B)``: divide by ``||a||_1`` for the relative estimate (:func:`accuracy_rows`).
    """
    n = grads.shape[1]
    dtype = grads.dtype
    alphas, weights, diff = alphas.to(dtype), weights.to(dtype), diff.to(dtype)
    slopes = _slopes(grads, diff)  # (T, n, B)
    f_input, f_baseline = f_input.to(dtype), f_baseline.to(dtype)
    start = (values[:, 0] - f_baseline - slopes[:, 0] * alphas[0]).abs()  # [0, c_0]: the rule uses g_0 on it
    end = (f_input - values[:, -1] - slopes[:, -1] * (1 - alphas[-1])).abs()  # [c_{n-1}, 1]: g_{n-1} on it
    if n == 1:
        return start + end
    bounds = torch.cumsum(weights, 0)[:-1]  # (n - 1,): beta_1 .. beta_{n-1}, the splits between neighbours
    low, high = alphas[:-1].view(-1, 1), alphas[1:].view(-1, 1)  # (n - 1, 1)
    split = bounds.view(-1, 1)
    residual = values[:, 1:] - values[:, :-1] - slopes[:, :-1] * (split - low) - slopes[:, 1:] * (high - split)
    jump = slopes[:, 1:] - slopes[:, :-1]  # (T, n - 1, B)
    nonzero = jump != 0
    offset = torch.where(nonzero, residual / torch.where(nonzero, jump, torch.ones_like(jump)), 0.0)
    offset = torch.minimum(torch.maximum(offset, split - high), split - low)  # the kink lies inside the stretch
    unexplained = (residual - jump * offset).abs().sum(1)  # (T, B)
    # e = sum_k o_k (t_{k+1} - t_k) = diff * sum_j (o_{j-1} - o_j) g_j, with o_{-1} = o_{n-1} = 0
    zero = torch.zeros_like(offset[:, :1])
    coefficients = torch.cat([zero, offset], 1) - torch.cat([offset, zero], 1)  # (T, n, B)
    error = (diff * _weighted_sum(grads, coefficients)).abs().sum(-1)  # (T, B)
    return error + unexplained + start + end


def _block_size(grads: Tensor) -> int:
    return max(1, min(grads.shape[1], _BLOCK_ELEMENTS // max(1, grads[:, :1].numel())))


def _slopes(grads: Tensor, diff: Tensor) -> Tensor:
    """``(T, n, B)``: ``sum_i (x - b)_i g_k,i``, the slope ``dF/dalpha`` at each node, in blocks of nodes."""
    size = _block_size(grads)
    return torch.cat([(grads[:, k : k + size] * diff).sum(-1) for k in range(0, grads.shape[1], size)], 1)


def _weighted_sum(grads: Tensor, coefficients: Tensor) -> Tensor:
    """``(T, B, F)``: ``sum_k coefficients_k g_k`` with one coefficient per node and state, in blocks of nodes."""
    size = _block_size(grads)
    total = (coefficients[:, :size, :, None] * grads[:, :size]).sum(1)
    for k in range(size, grads.shape[1], size):
        total = total + (coefficients[:, k : k + size, :, None] * grads[:, k : k + size]).sum(1)
    return total


def accuracy_rows(attributions: Tensor, stats: Tensor, numerator: Tensor) -> Tensor:
    """``(3, T, B)``: the relative estimate (unscaled), the mass-relative completeness error, ``||a||_1``.

    ``mass_relative_error = |sum(a) - dF| / max(sum|a|, |dF|)``: well conditioned where ``dF`` is tiny next to
    the attribution mass (a random-init network: the ratio ``|delta| / |dF|`` then reads 60-100% for maps within
    1% of the truth), and still failing when the sum is wrong (a map that is all noise scores about 1). It is
    ``|sum e| / mass``, a lower bound of the per-feature error: it can fail a map, never vouch for one.

    Args:
        attributions: ``(T, B, F)``.
        stats: ``(7, T, B)`` the completeness statistics (``f_input``, ``f_baseline``, ``delta`` first).
        numerator: ``(T, B)`` from :func:`kink_estimate`.
    """
    dtype = numerator.dtype
    mass = attributions.to(dtype).abs().sum(-1)  # (T, B)
    change = (stats[0] - stats[1]).to(dtype).abs()
    delta = stats[2].to(dtype).abs()
    scale = torch.maximum(mass, change)
    tiny = torch.finfo(dtype).tiny
    mass_relative = torch.where(scale > 0, delta / scale.clamp_min(tiny), delta * 0)  # 0/0 -> 0, NaN stays NaN
    # A state without attribution mass (x = b): no error to speak of where the estimate is 0 too, else infinite.
    relative = torch.where(
        mass > 0, numerator / mass.clamp_min(tiny), torch.where(numerator == 0, numerator * 0, numerator / 0)
    )
    return torch.stack([relative, mass_relative, mass])
