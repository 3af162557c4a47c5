"""The error figures of a run, computed on the device from what the path pass already holds.

:func:`error_estimate` is the reference-free estimate of each state's ``||a - a_exact||_1 / ||a_exact||_1`` for
the quadrature rules (the kink rule has its own: :mod:`~lightning_ig.attribution.kinks`); :func:`accuracy_rows`
puts it beside the mass-relative completeness error and the attribution mass. Torch operations only: no host
sync, no data-dependent shapes, no atomics, so they run inside a CUDA-graph capture, with either backend.

From the path terms ``t_k = (x - b) g_k`` at the nodes and the forward values there it models each stretch's kink
and each cell's curvature, adds the float32 sums' rounding as a vector, and weighs the models by the roughness of
the path terms. The formulas, and when and how often the estimate is wrong: ``docs/trust.md`` (the midpoint
estimate).
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ACCURACY_ROWS",
    "NOISE",
    "ROUGHNESS",
    "accuracy_rows",
    "block_size",
    "error_estimate",
    "kinked_share",
    "slopes_and_roughness",
]

ACCURACY_ROWS = ("attribution_error", "mass_relative_error", "attribution_mass")
"""The rows of :func:`accuracy_rows` ``(3, T, B)``."""

ROUGHNESS = (0.6, 0.9)
"""The roughness below which a state is read as smooth (curvature only) and above which as kinked (the kink model
in full); linear in between. Every tanh/SiLU and every ReLU state measured falls outside it (``docs/trust.md``)."""

NOISE = 4.0
"""Float rounding, in the forward's eps: what a second difference of the path terms (measured 1-3 eps sum|u| on
near-constant paths) and a completeness sum's ``F(x) - F(b)`` may carry without meaning anything."""

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
    eps: float,
) -> Tensor:
    """The unnormalised estimate of the rule's L1 error (``docs/trust.md``), per target and state ``(T, B)``.

    Args:
        grads: ``(T, n, B, F)`` the gradients at the nodes, in the accumulation dtype.
        values: ``(T, n, B)`` the forward values at the nodes.
        diff: ``(B, F)`` ``x - b`` in the accumulation dtype.
        alphas: ``(n,)`` the nodes, ascending, in the accumulation dtype.
        weights: ``(n,)`` their weights (positive, summing to one), in the accumulation dtype.
        f_input: ``(T, B)`` ``F(x)``.
        f_baseline: ``(T, B)`` ``F(b)``.
        attributions: ``(T, B, F)`` what the accumulation gave (its rounding is part of the error).
        eps: the forward's rounding unit (:func:`slopes_and_roughness`).

    Returns:
        ``(T, B)`` in the accumulation dtype: divide by ``||a||_1`` for the relative estimate (:func:`accuracy_rows`).
    """
    n, dtype = grads.shape[1], grads.dtype
    rule = _rule_parts(alphas, weights)
    slopes, roughness = slopes_and_roughness(grads, diff, eps)  # (T, n, B), (T, B)
    f_input, f_baseline = f_input.to(dtype), f_baseline.to(dtype)
    start = values[:, 0] - f_baseline - slopes[:, 0] * rule.first  # [0, c_0]: the rule uses g_0 on it
    end = f_input - values[:, -1] - slopes[:, -1] * rule.last  # [c_{n-1}, 1]: g_{n-1} on it
    if n == 1:
        rounding = _norms(grads, None, rule, diff, attributions)[-1]
        return (_squared(start) + _squared(end)).sqrt().to(dtype) + rounding.to(dtype)
    offsets, unexplained = _kinks(values, slopes, rule)
    coefficients = F.pad(offsets, (0, 0, 1, 0)) - F.pad(offsets, (0, 0, 0, 1))  # e = sum_j (o_{j-1} - o_j) t_j
    kink, rounding, smooth = _norms(grads, coefficients, rule, diff, attributions).to(dtype)
    if eps > torch.finfo(dtype).eps:  # a half-precision forward: its gradients' rounding, which no sum here measures
        size = block_size(grads)
        blocks = [slice(k, k + size) for k in range(0, n, size)]  # no temporary of all n
        mass = functools.reduce(torch.add, (torch.tensordot(weights[k], grads[:, k].abs(), ([0], [1])) for k in blocks))
        rounding = rounding + eps * (mass * diff.abs()).sum(-1)
    kink = kink + (unexplained + _squared(start) + _squared(end)).sqrt().to(dtype)
    return torch.maximum(smooth, kinked_share(roughness, ROUGHNESS, n) * kink + rounding)


def kinked_share(roughness: Tensor, window: tuple[float, float], n: int) -> Tensor:
    """How far a path of this roughness reads as kinked: 0 below ``window``'s low end (smooth), 1 above its high end,
    linear in between; 1 under four nodes, where the smooth models are blind (three nodes hold one quadratic, which
    Gauss-Legendre integrates exactly, and one second difference)."""
    low, high = window
    return ((roughness - low) / (high - low)).clamp(0, 1) if n >= 4 else torch.ones_like(roughness)


class _RuleParts(NamedTuple):
    """What the estimate needs of a rule, computed once per rule tensor (:func:`_rule_parts`)."""

    before: Tensor  # (n - 1, 1) beta_{k+1} - c_k: the part of stretch k the rule gives node k
    after: Tensor  # (n - 1, 1) c_{k+1} - beta_{k+1}: the part it gives node k + 1
    first: Tensor  # () c_0, the start piece [0, c_0]
    last: Tensor  # () 1 - c_{n-1}, the end piece
    stencil: Tensor  # (n,) the smooth stencil Gamma, in the rule's dtype
    weights64: Tensor  # (n,) the weights in float64


def _rule_parts(alphas: Tensor, weights: Tensor) -> _RuleParts:
    """:class:`_RuleParts` of a rule, remembered per rule tensor (the path's rule tensors are cached objects): about 40
    small kernels once, instead of at every call and in every captured graph. Not remembered while a CUDA graph is being
    captured (a tensor made then lives in the graph's memory pool); the eager run before a capture fills it."""
    key = (id(alphas), id(weights))
    if (known := _RULES.get(key)) is not None and known[0]() is alphas and known[1]() is weights:
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
    """The kink offsets ``o_k`` ``(T, n - 1, B)`` and the sum of squares of what one kink per stretch leaves
    unexplained ``(T, B)`` (a run of jumpless stretches counts once)."""
    residual = values[:, 1:] - values[:, :-1] - slopes[:, :-1] * rule.before - slopes[:, 1:] * rule.after
    jump = slopes[:, 1:] - slopes[:, :-1]  # (T, n - 1, B)
    kinked = jump != 0
    offset = torch.where(kinked, residual / torch.where(kinked, jump, 1.0), 0.0)
    offset = torch.minimum(torch.maximum(offset, -rule.after), rule.before)  # the kink lies inside the stretch
    left = torch.where(kinked, residual - jump * offset, 0.0)
    return offset, _squared(left).sum(1) + _runs(torch.where(kinked, 0.0, residual), kinked)


def _runs(residual: Tensor, kinked: Tensor) -> Tensor:
    """``(T, B)``: ``sum over runs of stretches without a jump of the run's summed residual squared`` (``residual`` is
    zero on the stretches with one). Without atomics (a scatter-add by run would not be deterministic on CUDA): the
    running sum ``C`` of the residuals is sampled at each run's last stretch; a run's sum is ``C`` there minus ``C`` at
    the run before."""
    total = torch.cumsum(residual, 1)  # (T, n - 1, B)
    last = ~kinked & F.pad(kinked, (0, 0, 0, 1), value=True)[:, 1:]  # a run's last stretch
    index = torch.arange(kinked.shape[1], device=kinked.device).view(1, -1, 1)
    latest = torch.cummax(torch.where(last, index, -1), 1).values  # the last run end at or before k
    before = F.pad(latest, (0, 0, 1, 0), value=-1)[:, :-1]  # ... strictly before k
    previous = torch.where(before >= 0, total.gather(1, before.clamp_min(0)), 0.0)
    return torch.where(last, _squared(total - previous), 0.0).sum(1)


def _squared(values: Tensor) -> Tensor:
    """``values ** 2`` in float64: float32 outputs past about 1e19 would overflow their squares to ``inf``."""
    return values.to(torch.float64).square()


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
    parts = [  # -(L_i'(c) m1 + L_i'' m2 / 2), L_i'' = 2 / (da db); nodes the dtype merged (n ~ 1e4) give no term
        -(((centre - a) + (centre - b)) * m1 + m2) / torch.where(da * db == 0, torch.inf, da * db)
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


def block_size(grads: Tensor, copies: int = 1) -> int:
    """Nodes per block: a temporary of ``copies`` blocks of gradients stays under :data:`_BLOCK_ELEMENTS` elements."""
    return max(1, min(grads.shape[1], _BLOCK_ELEMENTS // max(1, copies * grads[:, :1].numel())))


def slopes_and_roughness(grads: Tensor, diff: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(T, n, B)`` the slopes ``sum_i (x - b)_i g_k,i`` and ``(T, B)`` the roughness, in blocks of nodes.

    The roughness ``sum_k ||u_{k+1} - 2 u_k + u_{k-1}||_1 / sum_k ||u_{k+1} - u_k||_1`` (about 2 for sparse kinks,
    ``h |t''| / |t'|`` for a smooth integrand) is measured on the path terms summed in :data:`_GROUPS` groups of
    features ``u_k`` (feature ``i`` in group ``i mod 8``): a kink in any feature shows in its group, at one pass
    over the gradients instead of the four that every feature's differences would take. Second differences within
    :data:`NOISE` ``eps sum_k ||u_k||_1`` of zero are the gradients' rounding (``eps``: the forward's): a path nearly
    constant (states close to the baseline) reads smooth, not kinked.
    """
    n, features = grads.shape[1], grads.shape[-1]
    groups = min(features, _GROUPS)
    pad = -features % groups
    size = block_size(grads, 2)
    grouped = []
    for k in range(0, n, size):
        terms = grads[:, k : k + size] * diff  # (T, m, B, F)
        if pad:
            terms = F.pad(terms, (0, pad))
        grouped.append(terms.view(*terms.shape[:-1], -1, groups).sum(-2))  # (T, m, B, groups)
    sums = grouped[0] if len(grouped) == 1 else torch.cat(grouped, 1)  # (T, n, B, groups)
    step = sums[:, 1:] - sums[:, :-1]
    first = step.abs().sum((1, -1))
    second = ((step[:, 1:] - step[:, :-1]).abs().sum((1, -1)) - NOISE * eps * sums.abs().sum((1, -1))).clamp_min(0)
    # no change at all (one linear piece, or one node): smooth, and both models read zero there
    roughness = torch.where(first > 0, second / first.clamp_min(torch.finfo(first.dtype).tiny), 0.0)
    return sums.sum(-1), roughness


def _norms(grads: Tensor, coefficients: Tensor | None, rule: _RuleParts, diff: Tensor, attributions: Tensor) -> Tensor:
    """``(3, T, B)`` float64: ``||(x - b) sum_k o_k g_k||_1`` (``o``: the kink coefficients ``(T, n, B)``), ``||r||_1``
    with ``r = a - (x - b) sum_k w_k g_k`` (the accumulation's rounding) and ``||(x - b) sum_k Gamma_k g_k + r||_1``;
    the sums with ``o`` and ``Gamma`` in the gradients' dtype (elementwise: no TF32 matmul), the rule's in float64;
    in blocks of nodes. ``(1, T, B)``, the rounding only, without ``coefficients``."""
    n, f64 = grads.shape[1], torch.float64
    size = block_size(grads, 5)
    total: Tensor | None = None
    exact: Tensor | None = None  # the rule's sum in float64, added block by block in place
    for k in range(0, n, size):
        block = grads[:, k : k + size]  # (T, m, B, F)
        whole = torch.tensordot(rule.weights64[k : k + size], block.to(f64), dims=([0], [1]))  # (T, B, F)
        exact = whole if exact is None else exact.add_(whole)
        if coefficients is not None:
            stencil = rule.stencil[k : k + size].view(1, -1, 1).expand_as(coefficients[:, k : k + size])
            both = torch.stack([coefficients[:, k : k + size], stencil])  # (2, T, m, B)
            part = (both.unsqueeze(-1) * block).sum(2)  # (2, T, B, F)
            total = part if total is None else total + part
    assert exact is not None  # noqa: S101 - n >= 1
    diff64 = diff.to(f64)
    signed = attributions.to(f64) - diff64 * exact  # (T, B, F)
    rounding = signed.abs().sum(-1).unsqueeze(0)  # (1, T, B)
    if total is None:
        return rounding
    kink, smooth = total.to(f64) * diff64  # (T, B, F) each
    return torch.stack([kink.abs().sum(-1), rounding[0], (smooth + signed).abs().sum(-1)])


def accuracy_rows(attributions: Tensor, stats: Tensor, numerator: Tensor, eps: float) -> Tensor:
    """``(3, T, B)``: the relative estimate, the mass-relative completeness error, ``||a||_1``.

    ``mass_relative_error = |sum(a) - dF| / max(sum|a|, |dF|)``, ``|delta|`` counted beyond :data:`NOISE` ``eps
    (|F(x)| + |F(b)|)``: a lower bound of the per-feature error, well conditioned where ``dF`` is tiny; it can fail
    a map, never vouch for one (``docs/trust.md``).

    Args:
        attributions: ``(T, B, F)``.
        stats: ``(7, T, B)`` the completeness statistics (``f_input``, ``f_baseline``, ``delta`` first).
        numerator: ``(T, B)`` from :func:`error_estimate`.
        eps: the forward's rounding unit.
    """
    dtype = numerator.dtype
    mass = attributions.to(dtype).abs().sum(-1)  # (T, B)
    change = (stats[0] - stats[1]).to(dtype).abs()
    delta = (stats[2].to(dtype).abs() - NOISE * eps * (stats[0].abs() + stats[1].abs()).to(dtype)).clamp_min(0)
    scale, tiny = torch.maximum(mass, change), torch.finfo(dtype).tiny
    mass_relative = torch.where(scale > 0, delta / scale.clamp_min(tiny), delta * 0)  # 0/0 -> 0, NaN stays NaN
    # A state without attribution mass: at the baseline no error where the estimate is 0 too, else infinite; away from
    # it (its change past rounding) the exact attributions are not all zero, so zero ones are 100% off
    none = (delta > 0).to(dtype)  # 1 or 0; the branch holds only numerators of 0, so no NaN to keep
    relative = torch.where(mass > 0, numerator / mass.clamp_min(tiny), torch.where(numerator == 0, none, numerator / 0))
    return torch.stack([relative, mass_relative, mass])
