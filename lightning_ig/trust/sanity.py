"""The randomisation sanity check (Adebayo et al., "Sanity checks for saliency maps", NeurIPS 2018).

The ranking of the units by mean ``|attribution|`` must differ from what re-initialised copies of the model give,
clearly more than two such copies differ from each other. A map that is a function of the input alone (``x *
something``) ranks the same for any weights, and fails. The copies' side is constant over a fit (fixed weights, fixed
held-out states), so :func:`randomization_reference` attributes the copies once, with their reference level (two copies
against each other), and each :func:`randomization_check` afterwards is a few rank correlations on the host.

**Resolved or not.** Over a handful of units (CartPole's 4 features, the 4 channels of MinAtar or of a Nature-CNN's
frame stack) Spearman moves in steps of 0.2 and random networks rank the units very differently from each other:
one more random network lands anywhere relative to the copies. The comparison with the copies' level then cannot
tell a trained model from an untrained one, and the check says so (``resolved=False``, its ``note``): it applies a
ceiling only, which still catches a map that ranks like every random network (the figures on trained and
random-init agents: ``docs/trust.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_ig.trust.common import (
    ROUNDING,
    AttributionSettings,
    check_model,
    check_settings,
    check_state_batch,
    generators_kept,
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

__all__ = [
    "SANITY_CEILING",
    "SANITY_MARGIN",
    "SANITY_MIN_UNITS",
    "RandomizationCheck",
    "RandomizationReference",
    "randomization_check",
    "randomization_reference",
]

# The pass rule's constants, each from the measurements in docs/trust.md.
SANITY_MARGIN = 0.10  # the model's correlation with a copy must be this far below two copies' correlation
SANITY_CEILING = 0.90  # ... and below this in any case: a map this close to a random network's is not the model's
SANITY_MIN_UNITS = 8  # with fewer units only the ceiling applies (Spearman over 4 values moves in steps of 0.2)


@dataclass(frozen=True)
class RandomizationReference:
    """Re-initialised copies of a model and what they attribute: constant over a fit, made once.

    Attributes:
        copy_means: ``(C, G)`` float64: each copy's mean ``|attribution|`` per unit over the reference's states.
        included: ``(G,)`` bool: the unit differs from the baseline in at least one of those states.
        state_index: ``(S,)`` which of the held-out states the reference covers.
        copy_rank_correlation: Spearman's rho between two copies' ``copy_means``, averaged over the ``C (C - 1) / 2``
            pairs: what "nothing learnt" looks like on these states.
        pair_rank_correlations: each pair's.
        num_units: ``G``.
        total_states: ``B``, the held-out states the reference's states were picked from.
        shuffled_parameters: parameters of modules without ``reset_parameters()`` (or whose weight a hook computes
            from them: pruning's), re-drawn by a seeded shuffle of their entries; ``kept_parameters``: single numbers.
    """

    copy_means: np.ndarray
    included: np.ndarray
    state_index: np.ndarray
    copy_rank_correlation: float
    pair_rank_correlations: tuple[float, ...]
    num_units: int
    total_states: int
    shuffled_parameters: int
    kept_parameters: int


@dataclass(frozen=True)
class RandomizationCheck:
    """The randomisation sanity check of one run.

    Attributes:
        randomization_rank_correlation: Spearman's rho between the model's per-unit mean ``|attribution|`` and a
            re-initialised copy's, averaged over the copies (``ig/sanity/randomization_rank_correlation``).
        copy_rank_correlation: the same between two copies, averaged over the pairs: the reference level
            (``ig/sanity/copy_rank_correlation``).
        copy_rank_correlations: the model against each copy.
        pair_spread: the standard deviation of the pairs' correlations.
        resolved: at least ``SANITY_MIN_UNITS`` units and ``pair_spread <= margin / 2``: the copies agree
            consistently enough for "below their level" to mean the model learnt something.
        threshold: ``min(copy_rank_correlation - margin, ceiling)`` when resolved, else ``ceiling``.
        passed: ``randomization_rank_correlation`` is finite and below ``threshold`` (equal up to rounding is not).
        num_units: units compared.
        reason: why it failed, in one sentence with the numbers (``None`` when it passed).
        note: what a pass cannot say when the reference is not resolved (``None`` when resolved).
    """

    randomization_rank_correlation: float
    copy_rank_correlation: float
    copy_rank_correlations: tuple[float, ...]
    pair_spread: float
    resolved: bool
    threshold: float
    passed: bool
    num_units: int
    reason: str | None
    note: str | None

    def scalars(self) -> dict[str, float]:
        """Tags (under the callback's ``ig/`` prefix) and values."""
        return {
            "sanity/randomization_rank_correlation": self.randomization_rank_correlation,
            "sanity/copy_rank_correlation": self.copy_rank_correlation,
        }


def randomization_reference(
    model: nn.Module,
    states: Tensor,
    baselines: Any = None,
    *,
    settings: AttributionSettings | None = None,
    groups: Any = None,
    num_copies: int = 4,
    num_states: int | None = 16,
    seed: int = 0,
    replica: Replica | None = None,
) -> RandomizationReference:
    """Attribute ``num_copies`` copies of ``model`` drawn again (:func:`~lightning_ig.trust.replica.redraw`).

    The copies attribute the same states with the same settings, in eval mode with their noise off: one reference
    serves every check of a fit. It costs ``num_copies`` IG passes on ``num_states`` states, through one working copy
    of the model whose parameters are drawn again in place for each (:class:`~lightning_ig.trust.replica.Replica`: on
    a CUDA device its IG is captured once and replayed).

    Args:
        model: the model the run attributes (not changed).
        states: ``(B, *feature_shape)`` held-out states.
        baselines: ``None``/``"zeros"`` (default), ``"mean"``, a number or a tensor, as the run attributes.
        settings: how the run attributes (default :class:`AttributionSettings()`).
        groups: ``None`` (features) or groups (a :class:`~lightning_ig.attribution.groups.FeatureGroups` or what
            its ``resolve`` takes).
        num_copies: copies, ``>= 2`` (default 4: six pairs for the level, four copies for the model).
        num_states: states covered, spread evenly over ``states`` (default 16; ``None``: all).
        seed: the copies' seeds are ``seed, seed + 1, ...`` (default 0).
        replica: the fit's working copy of ``model`` to draw the copies in (default: a new one); it is left with the
            last copy's weights (:meth:`~lightning_ig.trust.replica.Replica.sync` brings the model's back).

    Returns:
        A :class:`RandomizationReference`.

    Raises:
        TypeError, ValueError: an argument of the wrong kind or value (the message names it).
    """
    model, settings, states = check_model(model), check_settings(settings), check_state_batch(states)
    num_copies = check_int(num_copies, "num_copies", minimum=2)
    num_states = None if num_states is None else check_positive_int(num_states, "num_states")
    seed = check_int(seed, "seed", minimum=0, maximum=2**64 - num_copies)  # torch seeds are 64-bit
    resolved = resolve_groups(groups, states)
    replica = Replica(model, settings) if replica is None else replica
    index = pick_states(num_states, states.shape[0])
    subset, base, engine_base = state_subset(states, baselines, index)
    means, shuffled, kept = [], 0, 0
    with generators_kept(model):  # a forward that samples even in eval mode draws nothing of the caller's
        for copy_index in range(num_copies):
            shuffled, kept = replica.redraw(seed + copy_index)
            attributions = replica.attribute(subset, engine_base).detach()
            means.append(unit_sums(attributions, resolved).abs().to(torch.float64).mean(dim=0))  # (G,)
    moved = moved_units(subset, base, resolved).any(dim=0)  # (G,)
    numbers, count = read(torch.stack(means), moved), moved.numel()
    copy_means, included = numbers[:-count].reshape(num_copies, count), numbers[-count:] > 0
    pairs = [rank_correlation(copy_means[i], copy_means[j], included) for i, j in combinations(range(num_copies), 2)]
    return RandomizationReference(
        copy_means=copy_means,
        included=included,
        state_index=index.numpy(),
        copy_rank_correlation=float(np.mean(pairs)),
        pair_rank_correlations=tuple(pairs),
        num_units=count,
        total_states=states.shape[0],
        shuffled_parameters=shuffled,
        kept_parameters=kept,
    )


def randomization_check(
    units: Any,
    reference: RandomizationReference,
    *,
    margin: float = SANITY_MARGIN,
    ceiling: float = SANITY_CEILING,
    min_units: int = SANITY_MIN_UNITS,
) -> RandomizationCheck:
    """This run's attributions against the re-initialised copies' (rank correlations on the host, no attribution);
    the pass rule is :class:`RandomizationCheck`'s ``resolved``, ``threshold`` and ``passed``.

    Args:
        units: ``(B, G)`` this run's per-state attributions of the units, all held-out states (a tensor on any
            device, read once, or a numpy array).
        reference: from :func:`randomization_reference` on the same states and groups.
        margin: how far below the copies' level (default ``SANITY_MARGIN``).
        ceiling: the highest correlation that can pass (default ``SANITY_CEILING``).
        min_units: the fewest units for a resolved reference (default ``SANITY_MIN_UNITS``).

    Returns:
        A :class:`RandomizationCheck`.

    Raises:
        TypeError: a wrong kind of argument.
        ValueError: units that do not cover the reference's states or units.
    """
    if not isinstance(reference, RandomizationReference):
        raise TypeError(f"reference must be a RandomizationReference, got {type(reference).__name__}")
    margin = check_real(margin, "margin", above=-1, below=2)
    ceiling = check_real(ceiling, "ceiling", above=-1, below=1 + ROUNDING)
    min_units = check_positive_int(min_units, "min_units")
    shape = getattr(units, "shape", None)
    if shape is None or len(shape) != 2 or tuple(shape) != (reference.total_states, reference.num_units):
        raise ValueError(
            f"units of shape {shape} do not match the reference's {reference.total_states} states of "
            f"{reference.num_units} units; pass this run's attributions per unit of all the held-out states"
        )
    values = units.detach().to("cpu", torch.float64).numpy() if isinstance(units, Tensor) else np.asarray(units)
    model_means = np.abs(values[reference.state_index].astype(np.float64)).mean(axis=0)  # (G,)
    against = tuple(rank_correlation(model_means, copy, reference.included) for copy in reference.copy_means)
    rho, level, pairs = float(np.mean(against)), reference.copy_rank_correlation, reference.pair_rank_correlations
    spread = float(np.std(pairs)) if len(pairs) > 1 else math.inf  # NaN pairs (no unit moved): NaN, unresolved
    resolved = reference.num_units >= min_units and math.isfinite(level) and spread <= margin / 2
    threshold = min(level - margin, ceiling) if resolved else ceiling
    passed = math.isfinite(rho) and rho < threshold - ROUNDING
    return RandomizationCheck(
        randomization_rank_correlation=rho,
        copy_rank_correlation=level,
        copy_rank_correlations=against,
        pair_spread=spread,
        resolved=resolved,
        threshold=threshold,
        passed=passed,
        num_units=reference.num_units,
        reason=None if passed else _reason(rho, level, threshold),
        note=None if resolved else _note(reference.num_units, spread),
    )


def _reason(rho: float, level: float, threshold: float) -> str:
    if not math.isfinite(rho):
        return (
            f"sanity: the rank correlation with a re-initialised copy is undefined ({rho}): the attributions are "
            "constant or NaN/Inf, or cover fewer than two units"
        )
    return (
        f"sanity: the rank correlation with a re-initialised copy is {rho:.3f}, not below {threshold:.3f} (by "
        f"{rho - threshold:.3f}; two re-initialised copies: {level:.3f}): the ranking hardly depends on what the "
        "weights learnt"
    )


def _note(count: int, spread: float) -> str:
    return (
        f"sanity unresolved: with {count} units, on which random networks disagree this much among themselves "
        f"(spread {spread:.2f}), the check only catches maps that rank like every random network; it cannot tell "
        "a trained model from an untrained one"
    )
