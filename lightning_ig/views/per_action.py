"""The numbers of a run per action: ``target="each"`` (every action's Q) and ``target="contrast"`` (the greedy action
against the runner-up).

A ``target="each"`` run reaches the views as one row per (state, action) pair, state-major (row ``s * A + a`` is
state ``s``'s attribution of ``Q(s, a)``): one gather, one copy, and every pair checked for completeness like a
state. :class:`ActionSummary` splits the rows by action: each action's moments over the states, and in how many
states it is the greedy one (from ``Q(s, a)`` at the state itself, the rows' ``F(x)``).

The JSON report of a ``target="each"`` run (:func:`each_report`) speaks of the held-out states again: each per-state
row names its state and its action, and an ``actions`` key holds each action's top units and completeness, as
``lightning-ig diag --target each`` writes it.

A ``target="contrast"`` run has one row per state (``Q(s, greedy) - Q(s, runner-up)``); which two actions those are
is read from the model's Q-values at the states when its picture is drawn (:func:`contrast_numbers`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.attribution.host_result import HostResult, Moments
from lightning_ig.views.actions import action_pairs, greedy_and_runner_up
from lightning_ig.views.report_rows import completeness_summary, statistics_rows, top_features

__all__ = ["ActionSummary", "ContrastNumbers", "action_labels", "contrast_numbers", "each_report", "state_rows"]


def action_labels(names: Sequence[str] | None, count: int) -> list[str]:
    """One label per action: the names given, or ``action 0``, ``action 1``, ...

    Raises:
        ValueError: a number of names other than ``count``.
    """
    if names is None:
        return [f"action {index}" for index in range(count)]
    if len(names) != count:
        raise ValueError(
            f"action_names has {len(names)} names but the model returns {count} actions; give one name per output"
        )
    return [str(name) for name in names]


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
        moments: per action, the units' :class:`~lightning_ig.attribution.host_result.Moments` over the states.
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


# The per-row numbers of a host result: a target="each" run's are its (state, action) pairs.
_ROW_FIELDS = (
    "f_input",
    "f_baseline",
    "delta",
    "relative_error",
    "degenerate",
    "non_finite",
    "sum_attributions",
    "attributions",
    "group_attributions",
    "attribution_error",
    "mass_relative_error",
    "near_baseline",
    "attribution_mass",
    "n_steps_per_state",
)


def _action_rows(host: HostResult, action: int, actions: int) -> HostResult:
    """One action's rows of a ``target="each"`` run, for its completeness (``features`` stays the run's; the
    near-baseline flags stay those of the run: a tenth of the median over every pair)."""
    rows = {name: getattr(host, name) for name in _ROW_FIELDS}
    picked = {name: None if values is None else values[action::actions] for name, values in rows.items()}
    return dataclasses.replace(host, **picked)


def each_report(
    report: Mapping[str, Any],
    actions: ActionSummary,
    host: HostResult,
    unit_names: Sequence[str],
    unit_sizes: Sequence[int] | None = None,
    *,
    top_k: int = 10,
    tolerance: float | None = None,
) -> dict[str, Any]:
    """The JSON report of a ``target="each"`` run, from the document of its (state, action) rows.

    :func:`~lightning_ig.views.report.build_report` writes a row per pair (row ``s * A + a``); here the document
    speaks of the held-out states again: ``num_states`` counts them, each ``completeness.per_state`` (and
    ``degenerate_states``) row names its ``state_idx`` and its ``action``, ``non_finite_states`` lists the states
    with a NaN/Inf pair. The features, the groups and the completeness figures stay those of every pair (the
    callback's ``ig/mean_abs/...`` and verdict). The ``actions`` key holds, per action, as ``lightning-ig diag
    --target each`` writes it: ``action``, ``name``, ``forward_target`` (``action:<k>``), ``greedy_states``,
    ``units`` (``"features"`` or ``"groups"``: what the callback logs one by one), ``top_10_by_mean_abs`` (of those
    units, for ``Q(s, a)``) and ``completeness`` (without per-state rows).

    Args:
        report: the document of the run's rows.
        actions: the run per action.
        host: the run's host result (a row per pair).
        unit_names: one name per unit of ``actions.moments``.
        unit_sizes: the groups' sizes (``members``), or ``None`` for features.
        top_k: how many units each action lists.
        tolerance: ``completeness_tol``: each action's completeness gets its ``verdict``; ``None``: none.

    Raises:
        ValueError: the report's rows are not a whole number of states times the actions.
    """
    count = len(actions.names)
    if report["num_states"] != actions.num_states * count:
        raise ValueError(
            f"the report has {report['num_states']} rows, not {actions.num_states} states x {count} actions"
        )
    document = dict(report)
    document["num_states"] = actions.num_states
    completeness = dict(document["completeness"])
    for key in ("per_state", "degenerate_states"):
        if key in completeness:
            completeness[key] = [_pair_row(row, count) for row in completeness[key]]
    document["completeness"] = completeness
    document["non_finite_states"] = sorted({int(row) // count for row in report.get("non_finite_states", [])})
    kind = "features" if unit_sizes is None else "groups"
    document["actions"] = [
        {
            "action": action,
            "name": name,
            "forward_target": f"action:{action}",
            "greedy_states": int(actions.greedy_counts[action]),
            "units": kind,
            "top_10_by_mean_abs": top_features(statistics_rows(unit_names, actions.moments[action], unit_sizes), top_k),
            "completeness": completeness_summary(
                _action_rows(host, action, count), per_state=False, tolerance=tolerance
            ),
        }
        for action, name in enumerate(actions.names)
    ]
    return document


def _pair_row(row: Mapping[str, Any], actions: int) -> dict[str, Any]:
    """A per-pair row (``state_idx`` the row ``s * A + a``) as the state's: ``state_idx`` ``s``, then ``action``."""
    state, action = divmod(int(row["state_idx"]), actions)
    return {"state_idx": state, "action": action, **{key: value for key, value in row.items() if key != "state_idx"}}


@dataclass(frozen=True)
class ContrastNumbers:
    """Which two actions a ``target="contrast"`` run compared, and the moments of the commonest pair.

    Attributes:
        greedy: ``(B,)`` the greedy action of each state.
        runner_up: ``(B,)`` the runner-up of each state.
        pair: the commonest ``(greedy, runner-up)`` pair.
        count: how many states have it.
        moments: the units' moments over those states.
    """

    greedy: np.ndarray
    runner_up: np.ndarray
    pair: tuple[int, int]
    count: int
    moments: Moments


def contrast_numbers(q_values: np.ndarray, unit_values: np.ndarray) -> ContrastNumbers:
    """The pairs of a contrast run and the moments of its commonest pair.

    Args:
        q_values: ``(B, A)`` the model's outputs at the held-out states.
        unit_values: ``(B, U)`` the units' attributions of ``Q(greedy) - Q(runner-up)`` per state.

    Raises:
        ValueError: fewer than two actions, or a row count that differs.
    """
    greedy, runner_up = greedy_and_runner_up(q_values)
    values = np.asarray(unit_values, dtype=np.float64)
    if values.shape[0] != greedy.shape[0]:
        raise ValueError(f"got Q-values of {greedy.shape[0]} states and attributions of {values.shape[0]}")
    (pair, count), *_ = action_pairs(greedy, runner_up)
    chosen = (greedy == pair[0]) & (runner_up == pair[1])
    return ContrastNumbers(greedy, runner_up, pair, int(count), Moments.of(values[chosen]))
