"""The deletion (faithfulness) check: MoRF deletion (Samek et al. 2017) and its AUC (Petsiuk et al. 2018).

The units (features or groups) are replaced by the baseline in order of decreasing contribution; the normalised
target must fall faster than when they are deleted in a random order. Forward passes only: one batched forward a
check, whose fixed part (:class:`DeletionPlan`: the states, the baselines, the random orders' rows) a fit keeps.

For state ``b`` with ``dF_b = F(x_b) - F(base_b)`` and ``s_b`` its sign, the units that differ from the baseline
are ranked by ``s_b * attribution``, largest first (what moved the target away from the baseline most), and
``x_{b,k}`` replaces the first ``round(k n_b / K)`` of the state's ``n_b`` such units by the baseline
(``x_{b,0} = x_b``, ``x_{b,K} = base_b``). Deleting a unit already at its baseline changes nothing, so fractions
count only those that differ (on sparse frames a fraction of all pixels would reward any map that puts lit pixels
first). The curve is the ``|dF|``-weighted mean of the per-state normalised curves::

    y_k = sum_b s_b (F(x_{b,k}) - F(base_b)) / sum_b |dF_b|,   y_0 = 1,  y_K = 0 deletion_auc = trapezoid over k / K

The weights keep a state near its baseline (an ill-conditioned ratio) from dominating. An AUC below 0 means the
curve overshoots past the baseline, as it does where attributions of both signs cancel (random-init networks):
removing the positive ones first sends F below F(b), exactly what the attributions predict.

**Pass rule:** ``gap = auc_random - auc >= DELETION_MARGIN`` and ``>= DELETION_Z`` standard errors of the gap
(over the states): the margin alone lets shuffled maps through, since one random order's AUC strays from another's.
IG passes at random init too (it is faithful to random networks: the check tests the explanation against the
model, not the training); shuffled maps and reversed orders fail (the figures: ``docs/trust.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.attribution.inputs import raise_if_dtype_mismatch
from lightning_ig.models.noise import attribution_mode
from lightning_ig.trust.common import (
    AttributionSettings,
    baselines_like,
    check_model,
    check_settings,
    check_state_batch,
    generators_kept,
    host_units,
    moved_units,
    pick_states,
    resolve_groups,
)
from lightning_ig.vocabulary import check_int, check_positive_int, check_real

__all__ = ["DELETION_FRACTIONS", "DELETION_MARGIN", "DELETION_Z", "DeletionCheck", "DeletionPlan", "deletion_check"]

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

    One batched forward of ``(2 + (2 + R)(K - 1)) B`` rows under ``torch.no_grad()`` (``max_rows`` at a time), inside
    :func:`~lightning_ig.models.noise.attribution_mode` (eval mode, noise off; the model is put back as it was): the
    states, their baselines, the attribution order for either sign of ``F(x) - F(b)`` (each state's sign picks one
    after the forward, so no second forward waits for it) and ``R`` random orders. The callback keeps a
    :class:`DeletionPlan` over a fit and runs it on the model's working copy.

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
    model, settings = check_model(model), check_settings(settings)
    if not settings.target.checks_deletion:  # a contrast's pair is chosen per state: a deleted state cannot re-state it
        raise ValueError(f"the deletion check cannot use target={settings.target.label!r} (it picks outputs per state)")
    plan = DeletionPlan(
        states,
        baselines,
        groups,
        num_fractions=num_fractions,
        num_random_orders=num_random_orders,
        num_states=num_states,
        seed=seed,
        max_rows=max_rows,
    )
    with attribution_mode(model), generators_kept(model):  # a forward that samples draws nothing of the caller's
        try:
            return plan.run(settings.value(model), units, margin=margin, z=z)
        except RuntimeError as error:  # float64 states for a float32 model: say which to convert
            raise_if_dtype_mismatch(model, plan.x, error)
            raise


class DeletionPlan:
    """The deletion check's fixed part over a fit: its states, baselines and fractions, the random orders' rows.

    All of it stays as it is while the states and baselines do: the units that differ from the baseline, how many
    each fraction deletes, the seeded random orders and the rows they make. A check (:meth:`run`) writes only the
    attribution order's rows, in place, into the buffer that holds the others, and runs one forward: a few dozen
    launches, no host sync, one host read of its numbers at the end.

    Args:
        states, baselines, groups, num_fractions, num_random_orders, num_states, seed, max_rows: as for
            :func:`deletion_check`.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or value (the message names it).
    """

    def __init__(
        self,
        states: Tensor,
        baselines: Any,
        groups: Any = None,
        *,
        num_fractions: int = DELETION_FRACTIONS,
        num_random_orders: int = 1,
        num_states: int | None = None,
        seed: int = 0,
        max_rows: int = 4096,
    ) -> None:
        states = check_state_batch(states)
        num_fractions = check_int(num_fractions, "num_fractions", minimum=2)
        self.random_orders = check_positive_int(num_random_orders, "num_random_orders")
        num_states = None if num_states is None else check_positive_int(num_states, "num_states")
        seed = check_int(seed, "seed", minimum=0, maximum=2**64 - 1)  # torch seeds are 64-bit
        self.max_rows = check_positive_int(max_rows, "max_rows")
        self.groups = resolve_groups(groups, states)
        self.states, self.total_states, self.device = states, states.shape[0], states.device
        self.index = pick_states(num_states, states.shape[0], self.device)
        self.subset = num_states is not None and num_states < states.shape[0]
        with torch.inference_mode(False), torch.no_grad():
            self._prepare(states, baselines, num_fractions, seed)

    def _prepare(self, states: Tensor, baselines: Any, num_fractions: int, seed: int) -> None:
        device = self.device
        x = states.detach().index_select(0, self.index)
        base = baselines_like(baselines, states).detach().index_select(0, self.index)
        self.moved = moved_units(x, base, self.groups)  # (B, G)
        batch, self.feature_shape = x.shape[0], x.shape[1:]
        self.steps = steps = max(2, min(num_fractions, self.moved.shape[1]))
        count = self.moved.sum(dim=1).to(torch.float64)  # (B,) n_b
        fractions = torch.arange(1, steps, device=device, dtype=torch.float64) / steps  # (K - 1,)
        self.deleted = (fractions[:, None] * count[None, :]).round()  # (K - 1, B)
        self.ids = None if self.groups is None else self.groups.ids.to(device)  # (F,) each feature's group
        self.lowest = torch.full((), -math.inf, dtype=torch.float64, device=device)
        self.positions = torch.arange(self.moved.shape[1], device=device)  # (G,) the ranks a sort hands out
        self.x, self.base = x.reshape(batch, -1), base.reshape(batch, -1)  # (B, F)
        # One forward's rows: the states, the baselines, the attribution order for a positive and for a negative
        # F(x) - F(b) ((2, K - 1, B, F), written by each check), the random orders ((R, K - 1, B, F), written now).
        inner = (steps - 1) * batch
        self.rows = torch.empty(
            (2 * batch + (2 + self.random_orders) * inner, self.x.shape[1]), dtype=x.dtype, device=device
        )
        self.rows[:batch], self.rows[batch : 2 * batch] = self.x, self.base
        generator = torch.Generator(device=device).manual_seed(seed)
        draws = torch.rand(
            (self.random_orders, *self.moved.shape), generator=generator, device=device, dtype=torch.float64
        )
        random_ranks = self._feature_ranks(torch.where(self.moved, draws, self.lowest))  # (R, B, F)
        self._write(random_ranks, self.rows[2 * batch + 2 * inner :])
        self.ordered = self.rows[2 * batch : 2 * batch + 2 * inner]  # the attribution orders' rows
        self.staging = None  # pinned host memory for host units: copied to the device without a host sync
        if device.type == "cuda":
            self.staging = torch.empty((self.total_states, self.moved.shape[1]), dtype=torch.float64).pin_memory()

    def run(
        self, value: Callable[[Tensor], Tensor], units: Any, *, margin: float = DELETION_MARGIN, z: float = DELETION_Z
    ) -> DeletionCheck:
        """One check: ``value`` (the attributed scalar, ``(N, *feature_shape) -> (N,)``, already in the mode to
        attribute) at the rows of this run's ``units`` (``(B, G)`` over the plan's states, a tensor or numpy).

        On the device: the attribution orders' ranks and rows, and the forward; then one read of the forward's
        values (``(2 + (2 + R)(K - 1)) B`` numbers), and the curves on the host (a few dozen small numpy operations
        instead of as many launches)."""
        margin = check_real(margin, "margin", above=-1, below=1)
        z = check_real(z, "z", above=-1e-300)
        with torch.inference_mode(False), torch.no_grad():
            scores = self._device_units(units)  # (B, G) float64
            if self.subset:
                scores = scores.index_select(0, self.index)
            keys = torch.stack([scores, -scores])  # (2, B, G): s_b * attribution for s_b = +1 and -1
            self._write(self._feature_ranks(torch.where(self.moved, keys, self.lowest)), self.ordered)
            orderless = ~torch.isfinite(scores).all() | (scores.amax(-1) == scores.amin(-1)).all()  # NaN, or no order
            chunks = (chunk.view(-1, *self.feature_shape) for chunk in self.rows.split(self.max_rows))
            values = torch.cat([*(value(chunk).reshape(-1) for chunk in chunks), orderless.reshape(1)])
            return self._judge(values.to(torch.float64).cpu().numpy(), margin, z)

    def _feature_ranks(self, keys: Tensor) -> Tensor:
        """``(..., B, G)`` sort keys -> ``(..., B, F)`` deletion ranks: by decreasing key, ties in unit order
        (stable), a feature taking its group's rank."""
        positions = torch.sort(keys, dim=-1, descending=True, stable=True).indices
        ranks = torch.empty_like(positions).scatter_(-1, positions, self.positions.expand_as(positions))
        return ranks if self.ids is None else ranks[..., self.ids]

    def _write(self, ranks: Tensor, out: Tensor) -> None:
        """The rows of ``ranks`` (``(O, B, F)``) into ``out`` (``(O (K - 1) B, F)``): fraction k of order o replaces
        the ``deleted[k, b]`` lowest-ranked features of state b by its baseline."""
        mask = ranks[:, None] < self.deleted[None, :, :, None]  # (O, K - 1, B, F)
        torch.where(mask, self.base, self.x, out=out.view(mask.shape))

    def _device_units(self, units: Any) -> Tensor:
        """The units as float64 on the plan's device: a tensor moves; host numbers go through pinned memory."""
        count = (self.total_states, self.moved.shape[1])
        if isinstance(units, Tensor) and tuple(units.shape) == count:
            return units.detach().to(self.device, torch.float64)
        values = torch.from_numpy(host_units(units, self.states, self.groups))
        if self.staging is None:
            return values.to(self.device)
        self.staging.copy_(values)
        return self.staging.to(self.device, non_blocking=True)

    def _judge(self, values: np.ndarray, margin: float, z: float) -> DeletionCheck:
        batch, steps, orderless, values = self.x.shape[0], self.steps, bool(values[-1]), values[:-1]
        f_input, f_baseline = values[:batch], values[batch : 2 * batch]
        inner = values[2 * batch :].reshape(2 + self.random_orders, steps - 1, batch)
        with np.errstate(invalid="ignore"):  # inf - inf where both ends are infinite: NaN, judged as such below
            delta = f_input - f_baseline  # (B,)
        sign = np.where(delta < 0, -1.0, 1.0)  # (B,)
        ordered = np.where(delta < 0, inner[1], inner[0])  # (K - 1, B): each state's own sign's order
        inside = np.concatenate([ordered[None], inner[2:]])  # (1 + R, K - 1, B)
        weight = np.abs(delta).sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            change = (inside - f_baseline) * sign  # (1 + R, K - 1, B): s_b (F(x_{b,k}) - F(base_b))
            areas = (change.sum(axis=1) + np.abs(delta) / 2) / steps  # (1 + R, B): trapezoids, ends |dF_b| and 0
            area, area_random = areas[0], areas[1:].mean(axis=0)  # (B,), (B,)
            middle = change.sum(axis=2) / weight  # (1 + R, K - 1)
            curves = np.pad(middle, ((0, 0), (1, 1)), constant_values=(1.0, 0.0))  # (1 + R, K + 1)
            auc, auc_random = area.sum() / weight, area_random.sum() / weight
            error = _weighted_standard_error(area_random - area, np.abs(delta), weight)
        if orderless or not (np.isfinite(inside).all() and np.isfinite(delta).all() and weight != 0):
            auc = auc_random = error = math.nan
        gap = float(auc_random - auc)
        needed = max(margin, z * error) if math.isfinite(error) else math.nan
        passed = math.isfinite(gap) and math.isfinite(needed) and gap >= needed
        return DeletionCheck(
            deletion_auc=float(auc),
            deletion_auc_random=float(auc_random),
            gap=gap,
            gap_standard_error=float(error),
            curve=tuple(curves[0].tolist()),
            curve_random=tuple(curves[1:].mean(axis=0).tolist()),
            passed=passed,
            needed=needed,
            num_fractions=steps,
            num_states=int((np.abs(delta) > 0).sum()),
            reason=None if passed else _reason(float(auc), float(auc_random), gap, float(error), needed, margin, z),
        )


def _reason(auc: float, auc_random: float, gap: float, error: float, needed: float, margin: float, z: float) -> str:
    if not (math.isfinite(gap) and math.isfinite(error)):
        return (
            f"faithfulness: the deletion curves are undefined (AUC {auc}, random {auc_random}, standard error "
            f"{error}): NaN/Inf forward values or attributions, attributions that order no unit (all equal), every "
            "state at its baseline, or fewer than two states"
        )
    return (
        f"faithfulness: deleting units in attribution order (AUC {auc:.3f}) beats a random order ({auc_random:.3f}) "
        f"by {gap:.3f} of the {needed:.3f} needed ({needed - gap:.3f} short; margin {margin:.2f}, {z:g} standard "
        f"errors of {error:.3f})"
    )


def _weighted_standard_error(gaps: np.ndarray, weights: np.ndarray, total: float) -> float:
    """The standard error over states of ``gap = sum_b gaps_b / total``, the ``weights``-weighted mean gap. ``gaps_b``
    are per-state areas (``weights_b`` times the state's normalised gap), so the gap is ``sum_b w_b d_b`` with
    ``w_b = weights_b / total``; its variance over a sample of states is
    ``B / (B - 1) * sum_b (gaps_b / total - w_b gap)^2``. NaN for a single state."""
    batch, gap = gaps.shape[0], gaps.sum() / total
    spread = ((gaps / total - weights / total * gap) ** 2).sum()
    factor = batch / (batch - 1) if batch > 1 else math.nan
    return float(np.sqrt(spread * factor))
