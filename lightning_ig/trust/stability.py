"""Stability of the explanation under the agent's own exploration noise (NoisyNet agents).

NoiseGrad (Bykov et al. 2022, arXiv 2106.10185) perturbs weights the same way. The callback explains the
noise-off network; a NoisyNet agent acts with ``mu + sigma * epsilon``. If the ranking of the units changes when
the exploration noise is on, the noise-off explanation does not describe the networks the agent acts with.

Per draw, the model's working copy (:class:`~lightning_ig.trust.replica.Replica`; the model is never touched)
computes with a fresh epsilon in every :class:`~lightning_ig.models.NoisyLinear` layer, the same seeded draws at every
check (the check follows the model, not the dice), and attributes the states with the run's settings. Not applicable
without NoisyLinear layers (other libraries' noisy layers have no generator-taking draw).

**Pass:** ``noise_rank_correlation >= STABILITY_FLOOR`` (0.80): trained agents read close to 1 at their own noise;
random-init NoisyNets, whose sigma is about ``|mu|``, read lower, since there the noise decides the map, and the
check fails (the figures: ``docs/trust.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.models.noise import NoisyLinear
from lightning_ig.trust.common import (
    ROUNDING,
    AttributionSettings,
    check_model,
    check_settings,
    check_state_batch,
    generators_kept,
    host_units,
    moved_units,
    pick_states,
    rank_correlation,
    read,
    resolve_groups,
    state_subset,
    unit_sums,
)
from lightning_ig.trust.replica import Replica
from lightning_ig.vocabulary import check_int, check_positive_int, check_real

__all__ = ["STABILITY_FLOOR", "StabilityCheck", "stability_check"]

STABILITY_FLOOR = 0.80  # the noise-off ranking must correlate at least this much with the noisy ones


@dataclass(frozen=True)
class StabilityCheck:
    """The stability check of one run.

    Attributes:
        applicable: the model has :class:`~lightning_ig.models.NoisyLinear` layers; when not, the numbers are
            ``None`` and the check neither passes nor fails (``passed`` is ``None``).
        noise_rank_correlation: Spearman's rho between the noise-off per-unit mean ``|attribution|`` and that under
            each noise draw, averaged over the draws (``ig/stability/noise_rank_correlation``).
        draw_rank_correlations: each draw's.
        floor: the lowest correlation that passes.
        passed: ``noise_rank_correlation`` is finite and at least ``floor`` (up to rounding); ``None`` when not
            applicable.
        reason: why it failed, in one sentence with the numbers (``None`` when it passed or does not apply).
    """

    applicable: bool
    noise_rank_correlation: float | None = None
    draw_rank_correlations: tuple[float, ...] = ()
    floor: float | None = None
    passed: bool | None = None
    reason: str | None = None

    def scalars(self) -> dict[str, float]:
        """Tags (under the callback's ``ig/`` prefix) and values; none when the check does not apply."""
        if not self.applicable or self.noise_rank_correlation is None:
            return {}
        return {"stability/noise_rank_correlation": self.noise_rank_correlation}


def stability_check(
    model: nn.Module,
    states: Tensor,
    baselines: Any,
    units: Any,
    *,
    settings: AttributionSettings | None = None,
    groups: Any = None,
    num_draws: int = 2,
    num_states: int | None = 16,
    floor: float = STABILITY_FLOOR,
    seed: int = 0,
    replica: Replica | None = None,
) -> StabilityCheck:
    """The noise-off map against the maps under ``num_draws`` seeded exploration-noise draws.

    Args:
        model: the model (not changed: the draws go to its working copy).
        states: ``(B, *feature_shape)``.
        baselines: as attributed.
        units: ``(B, G)`` this run's per-state attributions of the units (noise off), a tensor or a numpy array.
        settings: how the run attributes (default :class:`AttributionSettings()`).
        groups: compare groups (``None``: features).
        num_draws: noise draws (default 2), each one IG pass on ``num_states`` states.
        num_states: states used, spread evenly (default 16; ``None``: all).
        floor: the lowest correlation that passes (default ``STABILITY_FLOOR``).
        seed: the draws' seed (default 0).
        replica: the fit's working copy of ``model`` (default: a new one): synced with the model, its noise drawn,
            and left quiet (noise samples zero).

    Returns:
        A :class:`StabilityCheck`; ``applicable=False`` for a model without NoisyLinear layers.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or value (the message names it).
    """
    model, settings, states = check_model(model), check_settings(settings), check_state_batch(states)
    num_draws = check_positive_int(num_draws, "num_draws")
    num_states = None if num_states is None else check_positive_int(num_states, "num_states")
    floor = check_real(floor, "floor", above=-1 - ROUNDING, below=1 + ROUNDING)
    seed = check_int(seed, "seed", minimum=0, maximum=2**64 - 1)  # torch seeds are 64-bit
    resolved = resolve_groups(groups, states)
    values = host_units(units, states, resolved)
    if not any(isinstance(module, NoisyLinear) for module in model.modules()):
        return StabilityCheck(applicable=False)
    index = pick_states(num_states, states.shape[0])
    quiet = np.abs(values[index.numpy()]).mean(axis=0)  # (G,) noise off: this run's
    x, base, engine_base = state_subset(states, baselines, index)
    replica = Replica(model, settings) if replica is None else replica
    replica.sync()
    means = []
    with generators_kept(model):  # a forward that samples even in eval mode draws nothing of the caller's
        try:
            for draw in range(num_draws):
                replica.noise(seed, draw, num_draws)
                attributions = replica.attribute(x, engine_base).detach()
                means.append(unit_sums(attributions, resolved).abs().to(torch.float64).mean(dim=0))  # (G,)
        finally:
            replica.quiet()
    moved = moved_units(x, base, resolved).any(dim=0)
    numbers, count = read(torch.stack(means), moved), moved.numel()
    draws, included = numbers[:-count].reshape(num_draws, count), numbers[-count:] > 0
    correlations = tuple(rank_correlation(quiet, draw, included) for draw in draws)
    rho = float(np.mean(correlations))
    passed = math.isfinite(rho) and rho >= floor - ROUNDING
    return StabilityCheck(
        applicable=True,
        noise_rank_correlation=rho,
        draw_rank_correlations=correlations,
        floor=floor,
        passed=passed,
        reason=None if passed else _reason(rho, floor),
    )


def _reason(rho: float, floor: float) -> str:
    if not math.isfinite(rho):
        return f"stability: the rank correlation under exploration noise is undefined ({rho}): NaN/Inf or constant"
    return (
        f"stability: under exploration-noise draws the rank correlation with the noise-off map is {rho:.3f}, below "
        f"{floor:.2f} (by {floor - rho:.3f}): the agent acts on networks the noise-off explanation does not describe"
    )
