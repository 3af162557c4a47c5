"""The deletion (faithfulness) check: MoRF deletion (Samek et al. 2017) and its AUC (Petsiuk et al. 2018).

The units (features or groups) are replaced by the baseline in order of decreasing contribution; the normalised
target must fall faster than when they are deleted in a random order. Forward passes only.

For state ``b`` with ``dF_b = F(x_b) - F(base_b)`` and ``s_b`` its sign, the units that differ from the baseline
are ranked by ``s_b * attribution``, largest first (what moved the target away from the baseline most), and
``x_{b,k}`` replaces the first ``round(k n_b / K)`` of the state's ``n_b`` such units by the baseline
(``x_{b,0} = x_b``, ``x_{b,K} = base_b``). Deleting a unit already at its baseline changes nothing, so fractions
count only those that differ (on sparse frames a fraction of all pixels would reward any map that puts lit pixels
first). The curve is the ``|dF|``-weighted mean of the per-state normalised curves::

    y_k = sum_b s_b (F(x_{b,k}) - F(base_b)) / sum_b |dF_b|,   y_0 = 1,  y_K = 0
    deletion_auc = trapezoid over k / K

The weights keep a state near its baseline (an ill-conditioned ratio) from dominating. An AUC below 0 means the
curve overshoots past the baseline, as it does where attributions of both signs cancel (random-init networks):
removing the positive ones first sends F below F(b), exactly what the attributions predict.

**Pass rule:** ``gap = auc_random - auc >= DELETION_MARGIN`` and ``>= DELETION_Z`` standard errors of the gap
(over the states). Measured: IG passes on trained CartPole, MinAtar (pixels and channels) and Nature-CNN agents
and at random init (z 6-26: IG is faithful to random networks too; the check tests the explanation against the
model, not the training); 0 of 150 shuffled maps and no reversed order passed. The margin alone let up to 7 of 10
shuffled maps through: one random order's AUC strays from another's by up to 0.2 at init.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_ig.callback.trust.common import (
    AttributionSettings,
    baselines_like,
    check_model,
    check_settings,
    check_state_batch,
    host_units,
    moved_units,
    pick_states,
    read,
    resolve_groups,
)
from lightning_ig.models.noise import attribution_mode
from lightning_ig.vocabulary import check_int, check_positive_int, check_real

__all__ = ["DELETION_FRACTIONS", "DELETION_MARGIN", "DELETION_Z", "DeletionCheck", "deletion_check"]

DELETION_FRACTIONS = 16  # K: the curve at 0, 1/16, ..., 1 of the units (at most one step per unit)
DELETION_MARGIN = 0.05  # the attribution order's AUC must be this far below the random order's
DELETION_Z = 3.0  # ... and by this many standard errors of that gap


@dataclass(frozen=True)
class DeletionCheck:
    """The deletion check of one run.

    Attributes:
        deletion_auc: area under the attribution-order curve; lower is more faithful (``ig/faithfulness/deletion_auc``).
        deletion_auc_random: the same for seeded random orders (``ig/faithfulness/deletion_auc_random``).
        gap: ``deletion_auc_random - deletion_auc``.
        gap_standard_error: the gap's standard error over the states (each state's gap weighted as in the curve).
        curve: ``(K + 1,)`` the attribution-order curve at fractions ``0, 1/K, ..., 1``; ``curve_random`` the random
            orders'.
        passed: ``gap >= margin`` and ``gap >= z * gap_standard_error`` (NaN never passes).
        needed: ``max(margin, z * gap_standard_error)``, the gap a pass needs.
        num_fractions: ``K``.
        num_states: states that carry weight (``F(x) != F(baseline)``).
        reason: why it failed, in one sentence with the numbers (``None`` when it passed).
    """

    deletion_auc: float
    deletion_auc_random: float
    gap: float
    gap_standard_error: float
    curve: tuple[float, ...]
    curve_random: tuple[float, ...]
    passed: bool
    needed: float
    num_fractions: int
    num_states: int
    reason: str | None

    def scalars(self) -> dict[str, float]:
        """Tags (under the callback's ``ig/`` prefix) and values."""
        return {
            "faithfulness/deletion_auc": self.deletion_auc,
            "faithfulness/deletion_auc_random": self.deletion_auc_random,
        }


def deletion_check(
    model: nn.Module,
    states: Tensor,
    baselines: Any,
    units: Any,
    *,
    settings: AttributionSettings | None = None,
    groups: Any = None,
    num_fractions: int = DELETION_FRACTIONS,
    num_random_orders: int = 1,
    num_states: int | None = None,
    margin: float = DELETION_MARGIN,
    z: float = DELETION_Z,
    seed: int = 0,
    max_rows: int = 4096,
) -> DeletionCheck:
    """The target as the most contributing units are replaced by the baseline, against random orders.

    All ``(1 + R)(K - 1) B + 2 B`` rows run as forwards under ``torch.no_grad()``, ``max_rows`` at a time, inside
    :func:`~lightning_ig.models.noise.attribution_mode` (eval mode, noise off; the model is put back as it was).

    Args:
        model: the model (not changed).
        states: ``(B, *feature_shape)``.
        baselines: ``None``/``"zeros"``, ``"mean"``, a number or a tensor, as attributed.
        units: ``(B, G)`` this run's per-state attributions of the units (``IGResult.grouped(groups)``, or the
            attributions flattened to ``(B, F)`` without groups), a tensor or a numpy array.
        settings: how the run attributes; only ``forward`` and ``target`` are used (default
            :class:`AttributionSettings()`).
        groups: delete whole groups (``None``: features).
        num_fractions: ``K`` (default ``DELETION_FRACTIONS``; at most one step per unit, at least 2).
        num_random_orders: random orders averaged for the random curve (default 1).
        num_states: states used, spread evenly (default ``None``: all).
        margin: the smallest AUC gap that passes (default ``DELETION_MARGIN``).
        z: the standard errors the gap must exceed (default ``DELETION_Z``).
        seed: the random orders' seed (default 0), drawn by a private generator on the states' device.
        max_rows: rows per forward (default 4096).

    Returns:
        A :class:`DeletionCheck`.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or value (the message names it).
    """
    model, settings, states = check_model(model), check_settings(settings), check_state_batch(states)
    num_fractions = check_int(num_fractions, "num_fractions", minimum=2)
    num_random_orders = check_positive_int(num_random_orders, "num_random_orders")
    num_states = None if num_states is None else check_positive_int(num_states, "num_states")
    margin = check_real(margin, "margin", above=-1, below=1)
    z = check_real(z, "z", above=-1e-300)
    seed = check_int(seed, "seed", minimum=0)
    max_rows = check_positive_int(max_rows, "max_rows")
    resolved = resolve_groups(groups, states)
    device = states.device
    index = pick_states(num_states, states.shape[0], device)
    scores = _device_units(units, states, resolved).index_select(0, index)  # (B, G) float64
    x = states.detach().index_select(0, index)
    base = baselines_like(baselines, states).detach().index_select(0, index)
    moved = moved_units(x, base, resolved)  # (B, G)
    batch, feature_shape = x.shape[0], x.shape[1:]
    steps = max(2, min(num_fractions, scores.shape[1]))
    value = settings.value(model)
    flat_x, flat_b = x.reshape(batch, -1), base.reshape(batch, -1)
    with attribution_mode(model), torch.no_grad():
        f_input, f_baseline = _forward_rows(value, torch.cat([x, base]), max_rows).to(torch.float64).chunk(2)
        delta = f_input - f_baseline  # (B,)
        sign = torch.where(delta < 0, -1.0, 1.0).to(torch.float64)  # (B,)
        ranks = _deletion_ranks(scores, moved, sign, num_random_orders, seed)  # (1 + R, B, G)
        if resolved is not None:
            ranks = ranks[..., resolved.ids.to(device)]  # (1 + R, B, F): a feature takes its group's rank
        count = moved.sum(dim=1).to(torch.float64)  # (B,) n_b
        fractions = torch.arange(1, steps, device=device, dtype=torch.float64) / steps  # (K - 1,)
        deleted = (fractions[:, None] * count[None, :]).round()  # (K - 1, B)
        inside = torch.stack(
            [_deletion_values(value, order, deleted, flat_x, flat_b, feature_shape, max_rows) for order in ranks]
        )  # (1 + R, K - 1, B)
    weight = delta.abs().sum()
    change = (inside - f_baseline) * sign  # (1 + R, K - 1, B): s_b (F(x_{b,k}) - F(base_b))
    areas = (change.sum(dim=1) + delta.abs() / 2) / steps  # (1 + R, B): per-state trapezoids, ends |dF_b| and 0
    area, area_random = areas[0], areas[1:].mean(dim=0)  # (B,), (B,)
    middle = change.sum(dim=2) / weight  # (1 + R, K - 1)
    ones = torch.ones(middle.shape[0], 1, dtype=torch.float64, device=device)
    curves = torch.cat([ones, middle, torch.zeros_like(ones)], dim=1)  # (1 + R, K + 1)
    auc, auc_random = area.sum() / weight, area_random.sum() / weight
    error, carrying = _weighted_standard_error(area_random - area, delta.abs(), weight)
    broken = ~torch.isfinite(inside).all() | ~torch.isfinite(delta).all() | (weight == 0)
    numbers = read(auc, auc_random, error, carrying, broken, curves[0], curves[1:].mean(dim=0))
    if numbers[4]:
        numbers[:3] = math.nan
    auc_value, random_value, error_value = (float(number) for number in numbers[:3])
    gap = random_value - auc_value
    needed = max(margin, z * error_value) if math.isfinite(error_value) else math.nan
    passed = math.isfinite(gap) and math.isfinite(needed) and gap >= needed
    return DeletionCheck(
        deletion_auc=auc_value,
        deletion_auc_random=random_value,
        gap=gap,
        gap_standard_error=error_value,
        curve=tuple(numbers[5 : 6 + steps].tolist()),
        curve_random=tuple(numbers[6 + steps :].tolist()),
        passed=passed,
        needed=needed,
        num_fractions=steps,
        num_states=int(numbers[3]),
        reason=None if passed else _reason(auc_value, random_value, gap, error_value, needed, margin, z),
    )


def _reason(auc: float, auc_random: float, gap: float, error: float, needed: float, margin: float, z: float) -> str:
    if not (math.isfinite(gap) and math.isfinite(error)):
        return (
            f"faithfulness: the deletion curves are undefined (AUC {auc}, random {auc_random}, standard error "
            f"{error}): NaN/Inf forward values, every state at its baseline, or fewer than two states"
        )
    return (
        f"faithfulness: deleting units in attribution order (AUC {auc:.3f}) beats a random order ({auc_random:.3f}) "
        f"by {gap:.3f}, {needed - gap:.3f} short of the {needed:.3f} needed (margin {margin:.2f}, {z:g} standard "
        f"errors of {error:.3f})"
    )


def _device_units(units: Any, states: Tensor, groups: Any) -> Tensor:
    """The units as float64 on the states' device: a tensor moves, a host array is copied there once."""
    count = states[0].numel() if groups is None else len(groups)
    if isinstance(units, Tensor) and tuple(units.shape) == (states.shape[0], count):
        return units.detach().to(states.device, torch.float64)
    return torch.from_numpy(host_units(units, states, groups)).to(states.device)


def _deletion_ranks(scores: Tensor, moved: Tensor, sign: Tensor, random_orders: int, seed: int) -> Tensor:
    """``(1 + R, B, G)`` deletion ranks: the attribution order, then ``R`` seeded random orders; unmoved units last."""
    lowest = torch.full((), -math.inf, dtype=torch.float64, device=scores.device)
    orders = [torch.where(moved, sign[:, None] * scores, lowest)]
    generator = torch.Generator(device=scores.device).manual_seed(seed)
    for _ in range(random_orders):
        draws = torch.rand(scores.shape, generator=generator, device=scores.device, dtype=torch.float64)
        orders.append(torch.where(moved, draws, lowest))
    return torch.stack([_descending_ranks(order) for order in orders])


def _weighted_standard_error(gaps: Tensor, weights: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """The standard error over states of ``gap = sum_b gaps_b / total``, the ``weights``-weighted mean gap.

    ``gaps_b`` are per-state areas (``weights_b`` times the state's normalised gap), so the gap is
    ``sum_b w_b d_b`` with ``w_b = weights_b / total``; its variance over a sample of states is
    ``B / (B - 1) * sum_b (gaps_b / total - w_b gap)^2``. NaN for a single state. Returns (error, the count of
    states with weight).
    """
    batch = gaps.shape[0]
    gap = gaps.sum() / total
    spread = ((gaps / total - weights / total * gap) ** 2).sum()
    factor = batch / (batch - 1) if batch > 1 else math.nan
    return (spread * factor).sqrt(), (weights > 0).sum()


def _descending_ranks(order: Tensor) -> Tensor:
    """``(B, G)`` ranks ``0..G-1`` by decreasing value, ties kept in unit order (stable)."""
    positions = torch.sort(order, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(positions)
    return ranks.scatter_(1, positions, torch.arange(order.shape[1], device=order.device).expand_as(positions))


def _deletion_rows(ranks: Tensor, deleted: Tensor, x: Tensor, base: Tensor, max_rows: int) -> Iterator[Tensor]:
    """The perturbed states, fraction by fraction, ``max_rows`` (at least one fraction's ``B``) at a time."""
    per_chunk = max(1, max_rows // x.shape[0])
    for start in range(0, deleted.shape[0], per_chunk):
        counts = deleted[start : start + per_chunk]  # (k, B)
        mask = ranks[None] < counts[..., None]  # (k, B, F)
        yield torch.where(mask, base[None], x[None]).reshape(-1, x.shape[1])


def _deletion_values(
    value: Callable[[Tensor], Tensor],
    ranks: Tensor,
    deleted: Tensor,
    x: Tensor,
    base: Tensor,
    feature_shape: torch.Size,
    max_rows: int,
) -> Tensor:
    """``(K - 1, B)`` float64 target values of the states with ``deleted[k, b]`` units replaced by the baseline."""
    rows = _deletion_rows(ranks, deleted, x, base, max_rows)
    values = torch.cat([value(chunk.reshape(-1, *feature_shape)).detach().to(torch.float64) for chunk in rows])
    return values.view(deleted.shape)


def _forward_rows(value: Callable[[Tensor], Tensor], rows: Tensor, max_rows: int) -> Tensor:
    return torch.cat([value(chunk).detach() for chunk in rows.split(max_rows)])
