"""The error figures of a run, computed on the device from what the path pass already holds.

:func:`error_estimate` is the reference-free estimate of each state's ``||a - a_exact||_1 / ||a_exact||_1``;
:func:`accuracy_rows` puts it beside the mass-relative completeness error and the attribution mass. Both are
torch operations: no host synchronisation, no data-dependent shapes, no atomics, so they run inside a CUDA-graph
capture like the rest of the path, with the CUDA backend and the torch twins alike.

How the estimate is computed
    Two models of the integrand ``t(alpha) = (x - b) * g(alpha)`` (the path terms the accumulation sums, one per
    node ``t_k``; their sum ``s_k`` is the slope ``dF/dalpha`` at the node; the forward values ``v_k`` at the
    nodes come with the gradients), and the rounding of the sum itself:

    *Kinks.* Along the path a ReLU network is piecewise linear, so ``t`` is a step function. Every positive rule
    gives node ``k`` (at ``c_k``) the cell ``[beta_k, beta_{k+1}]`` with ``beta = [0, cumsum(w)]``; the stretch
    between two neighbouring nodes, split at ``beta = beta_{k+1}``, has the exact residual
    ``rho_k = v_{k+1} - v_k - s_k (beta - c_k) - s_{k+1} (c_{k+1} - beta)``. One kink at ``kappa`` in it makes
    the stretch's error vector ``J_k (beta - kappa)`` (``J_k = t_{k+1} - t_k``) and its residual
    ``sigma_k (beta - kappa)`` (``sigma_k = s_{k+1} - s_k``), so with ``o_k = rho_k / sigma_k`` clipped to the
    stretch::

        e = sum_k o_k J_k,   kink = ||e||_1 + sum_k |rho_k - sigma_k o_k| + |start| + |end|

    where the sum counts what one kink per stretch cannot explain (several kinks, a pulse) and ``start``/``end``
    are the residuals of ``[0, c_0]`` and ``[c_{n-1}, 1]``. Stretches where the gradient did not change at all
    (``sigma_k = 0``: one linear piece) carry only the rounding of the forward values in ``rho_k``; their
    residuals are summed per run of such stretches before the absolute value (the values telescope), so that
    rounding does not add up over hundreds of nodes while a pulse inside a run is still counted.

    *Curvature.* Where ``t`` is smooth (tanh, SiLU) each cell's error is ``-(t' m1_k + t'' m2_k / 2)`` with
    ``m1, m2`` the cell's first and second moments about its node and ``t', t''`` from the quadratic through the
    node and its neighbours (Euler-Maclaurin's end-derivative term for the uniform midpoint rule)::

        smooth = ||sum_k Gamma_k t_k||_1          (Gamma: a fixed stencil of the rule's nodes and weights)

    *Which model.* The roughness ``r = sum_k ||u_{k+1} - 2 u_k + u_{k-1}||_1 / sum_k ||u_{k+1} - u_k||_1``, with
    ``u_k`` the path terms summed in 8 groups of features (feature ``i`` in group ``i mod 8``), is about 2 for
    sparse kinks and 1.4 for dense random ones (0.97 and above on every ReLU state measured), and
    ``h |t''| / |t'|`` for a smooth integrand (0.62 and below on every tanh/SiLU state measured). With
    ``lam = clip((r - 0.6) / 0.3, 0, 1)`` (``lam = 1`` below 3 nodes)::

        attribution_error = (max(smooth, lam * kink) + ||a - a_64||_1) / ||a||_1

    where ``a_64`` is the same gradients summed in float64: the rounding of the accumulation (in float32 for
    float32 inputs, sequential, like the kernel), which is the whole error of a smooth network at 256 nodes.
    No gradient beyond the rule's is needed (with finite differences the node values are the mean of each
    node's probes, exact on a linear piece).

When it can be wrong (measured against exact references; ``docs/trust.md``)
    * Several kinks in one stretch: ``rho / sigma`` is a weighted mean of their places, so the vector is wrong and
      only the magnitude is about right; kinks whose scalar effects cancel (``rho ~ 0``) are invisible. With few
      features (CartPole, 4) this is not averaged out: at 64 nodes 80-96% of CartPole states within 2x, the
      misses over-estimates; fewer at 256 nodes, where fewer stretches hold two kinks.
    * A pulse (the gradient changes and changes back between two nodes) is seen by its residual only.
    * Kinks crowded at an end (inputs far off the training distribution): the end pieces count by their residual
      only and the estimate reads 0.5-0.6x with the midpoint rule.
    * Smooth networks with features only a few nodes wide (``r`` near 0.6): the curvature term over-reads 2-5x.
    * After refinement that chases the estimate it reads low; ``n_steps="auto"`` refines uniformly for this reason.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ACCURACY_ROWS", "ROUGHNESS", "accuracy_rows", "error_estimate", "slopes_and_roughness"]

ACCURACY_ROWS = ("attribution_error", "mass_relative_error", "attribution_mass")
"""The rows of :func:`accuracy_rows` ``(3, T, B)``."""

ROUGHNESS = (0.6, 0.9)
"""The roughness below which a state is read as smooth (curvature only) and above which as kinked (the kink model
in full); between them the kink model is weighted linearly. Measured: every tanh/SiLU state <= 0.62 (CartPole
tanh trained, 64 nodes), every ReLU state >= 0.97 (CartPole ReLU trained, 64 nodes)."""

# At most this many elements in a temporary the size of a block of gradients: the estimate streams over the nodes
# in blocks, so its memory stays bounded whatever n_steps (one block in the common case).
_BLOCK_ELEMENTS = 1 << 24
_GROUPS = 8  # the roughness is measured on the path terms summed in this many groups of features
_RULES: dict[tuple[int, int], tuple[weakref.ref[Tensor], weakref.ref[Tensor], _RuleParts]] = {}
_RULES_KEPT = 256  # as many as the path's cache of rule tensors


def error_estimate(
    grads: Tensor,
    values: Tensor,
    diff: Tensor,
    alphas: Tensor,
    weights: Tensor,
    f_input: Tensor,
    f_baseline: Tensor,
    attributions: Tensor,
) -> Tensor:
    """The unnormalised estimate of the rule's L1 error (the module docstring), per target and state ``(T, B)``.

    Args:
        grads: ``(T, n, B, F)`` the gradients at the nodes, in the accumulation dtype.
        values: ``(T, n, B)`` the forward values at the nodes.
        diff: ``(B, F)`` ``x - b`` in the accumulation dtype.
        alphas: ``(n,)`` the nodes, ascending, in the accumulation dtype.
        weights: ``(n,)`` their weights (positive, summing to one), in the accumulation dtype.
        f_input: ``(T, B)`` ``F(x)``.
        f_baseline: ``(T, B)`` ``F(b)``.
        attributions: ``(T, B, F)`` what the accumulation gave (its rounding is part of the error).

    Returns:
        ``(T, B)`` in the accumulation dtype: divide by ``||a||_1`` for the relative estimate (:func:`accuracy_rows`).
    """
    n, dtype = grads.shape[1], grads.dtype
    rule = _rule_parts(alphas, weights)
    slopes, roughness = slopes_and_roughness(grads, diff)  # (T, n, B), (T, B)
    f_input, f_baseline = f_input.to(dtype), f_baseline.to(dtype)
    ends = (values[:, 0] - f_baseline - slopes[:, 0] * rule.first).abs()  # [0, c_0]: the rule uses g_0 on it
    ends = ends + (f_input - values[:, -1] - slopes[:, -1] * rule.last).abs()  # [c_{n-1}, 1]: g_{n-1} on it
    if n == 1:
        rounding = _norms(grads, None, rule, diff, attributions)[-1]
        return ends + rounding.to(dtype)
    offsets, unexplained = _kinks(values, slopes, rule)
    coefficients = F.pad(offsets, (0, 0, 1, 0)) - F.pad(offsets, (0, 0, 0, 1))  # e = sum_j (o_{j-1} - o_j) t_j
    kink, smooth, rounding = _norms(grads, coefficients, rule, diff, attributions).to(dtype)
    kink = kink + unexplained + ends
    low, high = ROUGHNESS
    weight = ((roughness - low) / (high - low)).clamp(0, 1) if n >= 3 else torch.ones_like(roughness)
    return torch.maximum(smooth, weight * kink) + rounding


class _RuleParts(NamedTuple):
    """What the estimate needs of a rule, computed once per rule tensor (:func:`_rule_parts`)."""

    before: Tensor  # (n - 1, 1) beta_{k+1} - c_k: the part of stretch k the rule gives node k
    after: Tensor  # (n - 1, 1) c_{k+1} - beta_{k+1}: the part it gives node k + 1
    first: Tensor  # () c_0, the start piece [0, c_0]
    last: Tensor  # () 1 - c_{n-1}, the end piece
    stencil: Tensor  # (n,) the smooth stencil Gamma, in the rule's dtype
    weights64: Tensor  # (n,) the weights in float64


def _rule_parts(alphas: Tensor, weights: Tensor) -> _RuleParts:
    """:class:`_RuleParts` of a rule, remembered per rule tensor (the path's rule tensors are cached objects): about
    40 small kernels once, instead of at every call and in every captured graph. Not remembered while a CUDA graph
    is being captured (a tensor made then lives in the graph's memory pool); the eager run before a capture fills
    it."""
    key = (id(alphas), id(weights))
    known = _RULES.get(key)
    if known is not None and known[0]() is alphas and known[1]() is weights:
        return known[2]
    splits = torch.cumsum(weights, 0)[:-1].view(-1, 1)  # (n - 1, 1): beta_1 .. beta_{n-1}
    stencil = _smooth_stencil(alphas.to(torch.float64), weights.to(torch.float64)).to(alphas.dtype)
    parts = _RuleParts(
        before=splits - alphas[:-1].view(-1, 1),
        after=alphas[1:].view(-1, 1) - splits,
        first=alphas[0].clone(),
        last=1 - alphas[-1],
        stencil=stencil,
        weights64=weights.to(torch.float64),
    )
    capturing = alphas.is_cuda and torch.cuda.is_current_stream_capturing()
    # Never evicted while its rule tensors live: a captured graph reads these tensors where they are. An entry whose
    # rule tensors died (their ids reused) is replaced; past the limit nothing more is remembered.
    if not capturing and (key in _RULES or len(_RULES) < _RULES_KEPT):
        _RULES[key] = (weakref.ref(alphas), weakref.ref(weights), parts)
    return parts


def _kinks(values: Tensor, slopes: Tensor, rule: _RuleParts) -> tuple[Tensor, Tensor]:
    """The kink offsets ``o_k`` ``(T, n - 1, B)`` and what one kink per stretch leaves unexplained ``(T, B)``."""
    residual = values[:, 1:] - values[:, :-1] - slopes[:, :-1] * rule.before - slopes[:, 1:] * rule.after
    jump = slopes[:, 1:] - slopes[:, :-1]  # (T, n - 1, B)
    kinked = jump != 0
    offset = torch.where(kinked, residual / torch.where(kinked, jump, 1.0), 0.0)
    offset = torch.minimum(torch.maximum(offset, -rule.after), rule.before)  # the kink lies inside the stretch
    left = torch.where(kinked, residual - jump * offset, 0.0)
    return offset, left.abs().sum(1) + _runs(torch.where(kinked, 0.0, residual), kinked)


def _runs(residual: Tensor, kinked: Tensor) -> Tensor:
    """``(T, B)``: ``sum over runs of stretches without a jump of |the run's summed residual|`` (``residual`` is zero
    on the stretches with one).

    Without atomics (a scatter-add by run would not be deterministic on CUDA): the running sum ``C`` of the
    residuals is sampled at each run's last stretch; a run's sum is ``C`` there minus ``C`` at the run before.
    """
    total = torch.cumsum(residual, 1)  # (T, n - 1, B)
    last = ~kinked & F.pad(kinked, (0, 0, 0, 1), value=True)[:, 1:]  # a run's last stretch
    index = torch.arange(kinked.shape[1], device=kinked.device).view(1, -1, 1)
    latest = torch.cummax(torch.where(last, index, -1), 1).values  # the last run end at or before k
    before = F.pad(latest, (0, 0, 1, 0), value=-1)[:, :-1]  # ... strictly before k
    previous = torch.where(before >= 0, total.gather(1, before.clamp_min(0)), 0.0)
    return torch.where(last, (total - previous).abs(), 0.0).sum(1)


def _smooth_stencil(alphas: Tensor, weights: Tensor) -> Tensor:
    """``(n,)`` ``Gamma``: ``sum_k Gamma_k t_k`` is the rule's error for ``t`` quadratic through each node and its
    neighbours (the two end nodes use the first and last three nodes); zeros below 3 nodes."""
    n = alphas.shape[0]
    if n < 3:
        return torch.zeros_like(alphas)
    centre = alphas
    first = torch.arange(n, device=alphas.device).sub(1).clamp(0, n - 3)  # (n,) the first of each node's three
    x0, x1, x2 = alphas[first], alphas[first + 1], alphas[first + 2]
    bounds = torch.cat([torch.zeros_like(alphas[:1]), torch.cumsum(weights, 0)])  # (n + 1,)
    below, above = bounds[:-1] - centre, bounds[1:] - centre
    m1, m2 = (above**2 - below**2) / 2, (above**3 - below**3) / 3  # the cell's moments about its node
    pairs = ((x1, x2, x0 - x1, x0 - x2), (x0, x2, x1 - x0, x1 - x2), (x0, x1, x2 - x0, x2 - x1))
    # Lagrange basis i: its derivative at the node and its (constant) second derivative
    parts = [
        -(((centre - a) + (centre - b)) * m1 + m2) / (da * db)  # -(L_i'(c) m1 + L_i'' m2 / 2), L_i'' = 2 / (da db)
        for a, b, da, db in pairs
    ]
    stencil = torch.zeros_like(alphas)
    inner = slice(1, n - 1)  # nodes 1 .. n-2 use their neighbours: first = k - 1
    stencil[: n - 2] += parts[0][inner]
    stencil[1 : n - 1] += parts[1][inner]
    stencil[2:] += parts[2][inner]
    for k, start in ((0, 0), (n - 1, n - 3)):  # the end nodes use the first and last three
        for i in range(3):
            stencil[start + i] += parts[i][k]
    return stencil


def _block_size(grads: Tensor, copies: int = 1) -> int:
    return max(1, min(grads.shape[1], _BLOCK_ELEMENTS // max(1, copies * grads[:, :1].numel())))


def slopes_and_roughness(grads: Tensor, diff: Tensor) -> tuple[Tensor, Tensor]:
    """``(T, n, B)`` the slopes ``sum_i (x - b)_i g_k,i`` and ``(T, B)`` the roughness, in blocks of nodes.

    The roughness is measured on the path terms summed in :data:`_GROUPS` groups of features (feature ``i`` in group
    ``i mod 8``; every feature its own group below 9): a kink in any feature shows in its group, and the sums cost
    one pass over the gradients instead of the four that differences of every feature would (measured: the same
    separation, ReLU states 0.97 and above, tanh/SiLU states 0.62 and below).
    """
    n, features = grads.shape[1], grads.shape[-1]
    groups = min(features, _GROUPS)
    pad = -features % groups
    size = _block_size(grads, 2)
    grouped = []
    for k in range(0, n, size):
        terms = grads[:, k : k + size] * diff  # (T, m, B, F)
        if pad:
            terms = F.pad(terms, (0, pad))
        grouped.append(terms.view(*terms.shape[:-1], -1, groups).sum(-2))  # (T, m, B, groups)
    sums = grouped[0] if len(grouped) == 1 else torch.cat(grouped, 1)  # (T, n, B, groups)
    step = sums[:, 1:] - sums[:, :-1]
    first = step.abs().sum((1, -1))
    second = (step[:, 1:] - step[:, :-1]).abs().sum((1, -1))
    # no change at all (one linear piece, or one node): smooth, and both models read zero there
    roughness = torch.where(first > 0, second / first.clamp_min(torch.finfo(first.dtype).tiny), 0.0)
    return sums.sum(-1), roughness


def _norms(grads: Tensor, coefficients: Tensor | None, rule: _RuleParts, diff: Tensor, attributions: Tensor) -> Tensor:
    """``(3, T, B)`` float64: ``||(x - b) sum_k o_k g_k||_1`` (``o``: the kink coefficients ``(T, n, B)``),
    ``||(x - b) sum_k Gamma_k g_k||_1`` and ``||a - (x - b) sum_k w_k g_k||_1`` (the accumulation's rounding); the
    first two sums in the gradients' dtype (elementwise: no TF32 matmul), the last in float64; in blocks of nodes.
    ``(1, T, B)``, the rounding only, without ``coefficients``."""
    n, f64 = grads.shape[1], torch.float64
    size = _block_size(grads, 5)
    total: Tensor | None = None
    exact: Tensor | None = None
    for k in range(0, n, size):
        block = grads[:, k : k + size]  # (T, m, B, F)
        whole = torch.tensordot(rule.weights64[k : k + size], block.to(f64), dims=([0], [1]))  # (T, B, F)
        exact = whole if exact is None else exact + whole
        if coefficients is not None:
            stencil = rule.stencil[k : k + size].view(1, -1, 1).expand_as(coefficients[:, k : k + size])
            both = torch.stack([coefficients[:, k : k + size], stencil])  # (2, T, m, B)
            part = (both.unsqueeze(-1) * block).sum(2)  # (2, T, B, F)
            total = part if total is None else total + part
    assert exact is not None  # noqa: S101 - n >= 1
    diff64 = diff.to(f64)
    rounding = (diff64 * exact - attributions.to(f64)).abs().sum(-1).unsqueeze(0)  # (1, T, B)
    if total is None:
        return rounding
    return torch.cat([(total.to(f64) * diff64).abs().sum(-1), rounding])


def accuracy_rows(attributions: Tensor, stats: Tensor, numerator: Tensor) -> Tensor:
    """``(3, T, B)``: the relative estimate, the mass-relative completeness error, ``||a||_1``.

    ``mass_relative_error = |sum(a) - dF| / max(sum|a|, |dF|)``: well conditioned where ``dF`` is tiny next to
    the attribution mass (a random-init network: the ratio ``|delta| / |dF|`` then reads 60-100% for maps within
    1% of the truth), and still failing when the sum is wrong (a map that is all noise scores about 1). It is
    ``|sum e| / mass``, a lower bound of the per-feature error: it can fail a map, never vouch for one.

    Args:
        attributions: ``(T, B, F)``.
        stats: ``(7, T, B)`` the completeness statistics (``f_input``, ``f_baseline``, ``delta`` first).
        numerator: ``(T, B)`` from :func:`error_estimate`.
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
