"""The callback's calibration: the engine's rule and error scale chosen on the held-out states every K runs.

:func:`calibrate` runs :meth:`~lightning_ig.attribution.IntegratedGradients.calibrate` on the first
:data:`~lightning_ig.attribution.calibration.CALIBRATION_STATES` held-out states at the first run and every
``calibrate_every`` runs after it (the model changes as it trains, and with it where its kinks sit), before the
run's own attribution and outside its ``time_ms``; :func:`noted` puts what it cost into the run's summary
(:attr:`~lightning_ig.run.statistics.Completeness.calibration_ms`). Under DDP every rank calibrates on the
same states and takes rank zero's answer, so that all ranks attribute with one rule.

Runs with ``n_steps="auto"`` (which refines the midpoint rule whatever the rule) and with finite differences
(whose 1024-node reference would cost ``2 F`` forwards per node) are not calibrated.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from torch import Tensor

from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.calibration import CALIBRATION_STATES
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.callback.heldout import baselines_for, rank_rows
from lightning_ig.models.noise import attribution_mode
from lightning_ig.run.summary import RunSummary

__all__ = ["calibrate", "noted"]


def calibrate(
    engine: IntegratedGradients, trainer: Any, pl_module: Any, held_out: Tensor, baseline: Any
) -> float | None:
    """Calibrate ``engine`` on the first held-out states (the callback calls it when a calibration is due).

    Args:
        engine: the callback's engine; its default rule and error scale are replaced.
        trainer: the trainer (under DDP, rank zero's answer is broadcast through its strategy).
        pl_module: the model (put in :func:`~lightning_ig.models.noise.attribution_mode` meanwhile).
        held_out: all held-out states (CPU), the same on every rank.
        baseline: the callback's checked ``baseline``.

    Returns:
        The wall time in milliseconds (the device synchronised), or ``None`` when the engine's settings are not
        calibrated (``n_steps="auto"``, finite differences).
    """
    settings = engine.options
    if settings.n_steps == "auto" or settings.gradient != "autograd":
        return None
    started = time.perf_counter()
    dtype = next((p.dtype for p in pl_module.parameters() if p.is_floating_point()), torch.float32)
    states = held_out[:CALIBRATION_STATES].to(device=pl_module.device, dtype=dtype)
    rows = torch.arange(len(states))
    baselines = baselines_for(baseline, held_out, rows, states.device, dtype)
    batch = len(rank_rows(len(held_out), getattr(trainer, "world_size", 1), getattr(trainer, "global_rank", 0)))
    with attribution_mode(pl_module), stochastic_warnings_silenced():
        found = engine.calibrate(states, baselines=baselines, batch=batch)  # "budget" as this rank's runs resolve it
    if getattr(trainer, "world_size", 1) > 1:
        found = trainer.strategy.broadcast(found, src=0)  # one rule on every rank: rank zero's
        engine.use_calibration(found)
    return (time.perf_counter() - started) * 1e3


def noted(summary: RunSummary, calibration_ms: float | None) -> RunSummary:
    """``summary`` with the calibration's cost in its completeness part (unchanged when none ran)."""
    if calibration_ms is None:
        return summary
    completeness = dataclasses.replace(summary.completeness, calibration_ms=float(calibration_ms))
    return dataclasses.replace(summary, completeness=completeness)
