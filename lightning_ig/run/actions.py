"""The numbers of a run per action: ``target="each"`` (every action's Q) and ``target="contrast"`` (the greedy action
against the runner-up).

A ``target="each"`` run reaches the views as one row per (state, action) pair, state-major (row ``s * A + a`` is
state ``s``'s attribution of ``Q(s, a)``): one gather, one copy, and every pair checked for completeness like a
state. :class:`ActionSummary` splits the rows by action: each action's moments over the states, and in how many
states it is the greedy one (from ``Q(s, a)`` at the state itself, the rows' ``F(x)``).

The JSON report of such a run is :func:`lightning_ig.views.report.each_report`.

A ``target="contrast"`` run has one row per state (``Q(s, greedy) - Q(s, runner-up)``), the two actions chosen by the
engine at each state (``IGResult.target_actions``); its picture shows the commonest pair (:func:`contrast_numbers`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_ig.run.host_result import HostResult, Moments

__all__ = ["ActionSummary", "ContrastNumbers", "action_pairs", "contrast_numbers", "state_rows"]


def state_rows(values: np.ndarray, rows_per_state: int) -> np.ndarray:
    """``(B * A, ...)`` state-major rows -> ``(B, A, ...)``."""
    return values.reshape(values.shape[0] // rows_per_state, rows_per_state, *values.shape[1:])


@dataclass(frozen=True)
class ActionSummary:
    """A ``target="each"`` run, per action.

    Attributes:
        names: one label per action.
        greedy_counts: ``(A,)`` in how many states each action has the largest ``Q(s, a)`` (ties: the lower index;
            a state with a NaN/Inf Q-value counts for none).
        moments: per action, the units' :class:`~lightning_ig.run.host_result.Moments` over the states.
        advantage_moments: per action, the moments of the attributions of ``Q(s, a) - mean_a' Q(s, a')`` (IG is
            linear in the target: each action's attributions less their mean over the actions): what favours the
            action over the average one. In a dueling network every ``Q(s, a)`` holds ``V(s)``, so the actions'
            own moments look alike and these are what tell them apart.
        num_states: the held-out states (rows / actions).
    """

    names: list[str]
    greedy_counts: np.ndarray
    moments: list[Moments]
    advantage_moments: list[Moments]
    num_states: int

    @classmethod
    def of_each(cls, host: HostResult, unit_values: np.ndarray, names: Sequence[str]) -> ActionSummary:
        """Split a ``target="each"`` run's state-major rows by action.

        Args:
            host: the run (``host.f_input`` holds ``Q(s, a)`` per row).
            unit_values: ``(B * A, U)`` the units' attributions per row (features or groups).
            names: one label per action.
        """
        actions = len(names)
        q_values = state_rows(host.f_input, actions)  # (B, A)
        per_state = state_rows(np.asarray(unit_values, dtype=np.float64), actions)  # (B, A, U)
        finite = np.isfinite(q_values).all(axis=1)
        greedy = np.argmax(np.where(finite[:, None], q_values, 0.0), axis=1)[finite]
        advantages = per_state - per_state.mean(axis=1, keepdims=True)  # (B, A, U)
        return cls(
            names=list(names),
            greedy_counts=np.bincount(greedy, minlength=actions),
            moments=[Moments.of(per_state[:, action]) for action in range(actions)],
            advantage_moments=[Moments.of(advantages[:, action]) for action in range(actions)],
            num_states=int(q_values.shape[0]),
        )


@dataclass(frozen=True)
class ContrastNumbers:
    """Which two actions a ``target="contrast"`` run compared most often, and the moments of that pair.

    Attributes:
        pair: the commonest ``(greedy, runner-up)`` pair.
        count: how many states have it.
        moments: the units' moments over those states.
    """

    pair: tuple[int, int]
    count: int
    moments: Moments


def contrast_numbers(pairs: np.ndarray, unit_values: np.ndarray) -> ContrastNumbers:
    """The commonest pair of a contrast run and the moments of its states.

    Args:
        pairs: ``(B, 2)`` each state's greedy action and runner-up, as the engine chose them
            (:attr:`~lightning_ig.attribution.IGResult.target_actions`).
        unit_values: ``(B, U)`` the units' attributions of ``Q(greedy) - Q(runner-up)`` per state.

    Raises:
        ValueError: ``pairs`` not ``(B, 2)``, or a row count that differs.
    """
    chosen_pairs = np.asarray(pairs, dtype=np.int64)
    values = np.asarray(unit_values, dtype=np.float64)
    if chosen_pairs.ndim != 2 or chosen_pairs.shape[1] != 2 or values.shape[0] != chosen_pairs.shape[0]:
        raise ValueError(
            f"pairs must be (B, 2) for the {values.shape[0]} states' attributions, got shape {chosen_pairs.shape}"
        )
    greedy, runner_up = chosen_pairs.T
    (pair, count), *_ = action_pairs(greedy, runner_up)
    return ContrastNumbers(pair, int(count), Moments.of(values[(greedy == pair[0]) & (runner_up == pair[1])]))


def action_pairs(greedy: np.ndarray, runner_up: np.ndarray) -> list[tuple[tuple[int, int], int]]:
    """The ``(greedy, runner-up)`` pairs and how many states have each, the commonest first (ties: by the pair)."""
    counts = Counter(zip(np.asarray(greedy).tolist(), np.asarray(runner_up).tolist(), strict=True))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))
