"""The callback's ``target="each"``: every action's ``Q(s, a)`` in one batched run, a row per (state, action).

The engine's ``target="each"`` gives ``(A, B, *feature_shape)`` attributions and ``(A, B)`` per-state numbers (one
batched call; on CUDA the callback's engine replays its graph as for any target). A run hands them on as one row
per (state, action) pair, state-major (row ``s * A + a``: :func:`pair_rows`), so that the one gather, the
reductions on the device and the one copy to the host are those of any run and every pair is checked for
completeness like a state. Under DDP each rank's share is whole states, so the gathered rows are the pairs of the
states in order and the padding of an uneven split (the last rank's repeated last state) is at the end, where the
host result drops it. The views split the rows by action
(:class:`~lightning_ig.run.actions.ActionSummary`).

The trust checks judge the mean over the actions (:class:`ActionTrust`): IG is linear in the target, so a state's
action rows averaged are the attributions of ``mean_a Q(s, a)`` (``V(s)`` of a dueling network), and the checks
attribute that same target (``"mean"``) on re-initialised copies and under noise, and delete features in its order.
All three run (the deletion check too: unlike ``target="contrast"``, the mean over actions is a plain forward).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ig.attribution import IGOptions
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.result import IGResult
from lightning_ig.attribution.targets import Target
from lightning_ig.callback.monitor import TrustChecks, TrustMonitor
from lightning_ig.run.actions import state_rows
from lightning_ig.run.summary import RunSummary

__all__ = ["ActionTrust", "pair_rows"]


def pair_rows(result: IGResult) -> IGResult:
    """``result`` of ``target="each"`` as a row per (state, action) pair, state-major: ``(B * A, *feature_shape)``,
    ``(B * A,)``.

    On the device, queued (no host sync); the attributions are copied out of the engine's buffers, which its next run
    (a graph replay) writes again.

    Raises:
        ValueError: ``result`` is not one of ``target="each"`` (``f_input`` not ``(A, B)``).
    """
    if result.f_input.ndim != 2:
        raise ValueError(
            f"expected a target='each' result (f_input (A, B)), got f_input of shape {tuple(result.f_input.shape)}"
        )
    actions, states = result.f_input.shape

    def pairs(values: Tensor | None) -> Any:
        return None if values is None else values.transpose(0, 1).reshape(states * actions, *values.shape[2:])

    per_row = ("f_input", "f_baseline", "delta", "relative_error", "degenerate", "non_finite")
    optional = ("attribution_error", "mass_relative_error", "attribution_mass")
    steps = result.n_steps_per_state  # (B,): a state's actions stop together
    return dataclasses.replace(
        result,
        attributions=pairs(result.attributions),
        baselines=result.baselines.repeat_interleave(actions, dim=0),
        n_steps_per_state=None if steps is None else steps.repeat_interleave(actions),
        **{name: pairs(getattr(result, name)) for name in (*per_row, *optional)},
    )


@dataclass(frozen=True)
class _MeanOfActions:
    """The engine as :meth:`TrustMonitor.prepare` reads it (``target``, ``options``, ``graph_capture``), the target
    the mean over the actions: what the checks attribute again."""

    target: Target
    options: IGOptions  # the callback's engine's: whether it replays a graph is the same for the mean
    graph_capture: Any


class ActionTrust(TrustMonitor):
    """The trust checks of a ``target="each"`` fit: on the mean over the actions (see the module's docstring).

    A :class:`~lightning_ig.callback.monitor.TrustMonitor` whose checks attribute ``"mean"`` and whose runs
    are read as each state's action rows averaged (the attributions of the mean over the actions); the run's
    accuracy in the verdict stays that of every pair.
    """

    actions = 1  # the rows per state, set by prepare

    @classmethod
    def prepare(
        cls,
        options: TrustChecks | None,
        trainer: Any,
        pl_module: torch.nn.Module,
        engine: Any,
        forward: Any,
        held_out: Tensor,
        baseline: Any,
        groups: FeatureGroups | None,
        prefix: str,
    ) -> TrustMonitor | None:
        """The checks of this fit (``None``: off, or not global rank zero), as :meth:`TrustMonitor.prepare`, on
        the mean over the engine's actions."""
        mean = _MeanOfActions(Target.parse("mean"), engine.options, engine.graph_capture)
        monitor = super().prepare(options, trainer, pl_module, mean, forward, held_out, baseline, groups, prefix)
        if isinstance(monitor, ActionTrust):
            monitor.actions = engine.target.rows_per_state
        return monitor

    def step(self, host: Any, summary: RunSummary, *, final: bool = False) -> tuple[RunSummary, dict[str, float]]:
        """:meth:`TrustMonitor.step` on each state's action rows averaged."""
        per_state = dataclasses.replace(
            host,
            attributions=self._mean(host.attributions),
            group_attributions=self._mean(host.group_attributions),
        )
        return super().step(per_state, summary, final=final)

    def _mean(self, values: np.ndarray | None) -> np.ndarray | None:
        return None if values is None else state_rows(values, self.actions).mean(axis=1)
