"""The typed summary of one IG run: what TensorBoard (and any other view) draws.

:func:`summarize` turns a :class:`~lightning_ig.host_result.HostResult` and the
history of earlier runs into a :class:`RunSummary`: the settings, the
per-feature and per-group statistics, completeness with its verdict, drift
and concentration. Views read these fields; they never read the JSON
report's keys, so the file format and the pictures can change apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_ig.drift import drift
from lightning_ig.ensemble.agreement import agreement_scalars, completeness_scalars, member_summary
from lightning_ig.ensemble.members import MemberRun
from lightning_ig.host_result import HostResult, Moments
from lightning_ig.statistics import Completeness, completeness, concentration, json_float

__all__ = ["EnsembleSummary", "RunSettings", "RunSummary", "Units", "summarize"]


@dataclass(frozen=True)
class Units:
    """Things with one name each that are logged one by one: the features, or the groups.

    Attributes:
        kind: ``"features"`` or ``"groups"``.
        names: one name per unit.
        moments: :class:`~lightning_ig.host_result.Moments` over the states, ``(U,)`` each.
        values: ``(B, U)`` per-state attributions of the units (for histograms), or ``None``.
        sizes: ``(U,)`` members per group (``None`` for features).
    """

    kind: str
    names: list[str]
    moments: Moments
    values: np.ndarray | None = None
    sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class EnsembleSummary:
    """The members of an ensemble beside the aggregate: what is logged and what the report holds.

    Attributes:
        report: the report's ``"ensemble"`` key (:func:`~lightning_ig.ensemble.member_summary`).
        scalars: ``{tag suffix: value}`` logged as ``<prefix>/ensemble/<suffix>``: agreement
            (``spearman_mean``, ``spearman_min``, ``spread``, ``relative_spread``,
            ``spearman/member_<m>``) and completeness (``completeness/worst_relative_error``,
            ``completeness/member_<m>``; ``inf`` for NaN/Inf, NaN when nothing was checked).
    """

    report: dict[str, Any]
    scalars: dict[str, float]

    @classmethod
    def of(
        cls,
        aggregate_mean_abs: np.ndarray,
        members: MemberRun,
        *,
        feature_names: Sequence[str],
        feature_shape: tuple[int, ...],
        top_k: int,
    ) -> EnsembleSummary:
        report = member_summary(
            aggregate_mean_abs, members, feature_names=feature_names, top_k=top_k, feature_shape=feature_shape
        )
        return cls(report, {**agreement_scalars(report["agreement"]), **completeness_scalars(members)})


@dataclass(frozen=True)
class RunSettings:
    """What a run was asked to do, for the titles and the text."""

    target: str  # the target label: "mean", "action:1", "output", "callable:<name>"
    baseline: str  # "zeros", "mean" or "tensor(...)"
    tolerance: float  # completeness_tol
    top_k: int
    name: str | None = None  # the callback's name= (several callbacks in one Trainer)


@dataclass(frozen=True)
class RunSummary:
    """One IG run, ready to be drawn.

    Attributes:
        step: the global step of the run.
        run_index: 0 for the first run of the history.
        settings: :class:`RunSettings`.
        num_states: states attributed (all ranks).
        feature_shape: the shape of one state.
        n_steps, method, gradient, backend: how the engine ran.
        features: per-feature moments ``(F,)`` (any size).
        logged_features: the features logged one by one, or ``None`` when there are
            more than ``max_logged_features`` of them.
        groups: the groups, or ``None`` when none are in use.
        completeness: :class:`~lightning_ig.statistics.Completeness`.
        drift: the meaningful drift scalars (empty on the first run).
        concentration: share of the mass held by the top features.
        stochastic: the forward gave different values on the same rows.
        time_ms: wall time of the IG computation and the gather.
        ensemble: the members of an ensemble model, or ``None``.
    """

    step: int
    run_index: int
    settings: RunSettings
    num_states: int
    feature_shape: tuple[int, ...]
    n_steps: int
    method: str
    gradient: str
    backend: str
    features: Moments
    logged_features: Units | None
    groups: Units | None
    completeness: Completeness
    drift: dict[str, float] = field(default_factory=dict)
    concentration: dict[str, float] = field(default_factory=dict)
    stochastic: bool = False
    time_ms: float = 0.0
    ensemble: EnsembleSummary | None = None

    def report_extra(self, *, epoch: int, world_size: int) -> dict[str, Any]:
        """The keys a training run's JSON report holds beside the contract keys (and ``"ensemble"`` for an ensemble)."""
        extra: dict[str, Any] = {
            "baseline": self.settings.baseline,
            "global_step": self.step,
            "epoch": int(epoch),
            "run_index": self.run_index,
            "world_size": int(world_size),
            "callback_name": self.settings.name,
            "drift": {key: json_float(value) for key, value in self.drift.items()},
            "concentration": {key: json_float(value) for key, value in self.concentration.items()},
            "timings": {"ig_ms": self.time_ms},
        }
        if self.ensemble is not None:
            extra["ensemble"] = self.ensemble.report
        return extra

    def troubles(self) -> dict[str, str]:
        """What is wrong with this run, in words.

        Returns:
            ``{kind: message}`` for the kinds that apply: ``"non-finite"``, ``"unchecked"``, ``"fail"``,
            ``"stochastic"``, ``"members-fail"`` (an ensemble member's attributions do not add up).
        """
        numbers, step = self.completeness, self.step
        messages = {}
        if numbers.verdict == "non-finite":
            messages["non-finite"] = (
                f"the model produced NaN/Inf at step {step} in {numbers.num_non_finite} of {numbers.num_states} "
                f"held-out states (first: state {numbers.first_non_finite}); worst_relative_error is logged as inf"
            )
        elif numbers.verdict == "unchecked":
            messages["unchecked"] = (
                f"no state could be checked for completeness at step {step}: in all {numbers.num_states} states F(x) "
                "and F(b) are too close for a relative error (logged as nan); try baseline='mean' or another target"
            )
        elif numbers.verdict == "fail":
            messages["fail"] = (
                f"the worst relative completeness error is {numbers.worst_relative_error:.3g} at step {step}, above "
                f"completeness_tol={numbers.tolerance:g}: the attributions do not add up to F(x) - F(b). Use "
                "n_steps='auto' (it refines until they do) or more steps; fewer held-out states at more steps cost "
                "about the same"
            )
        if self.stochastic:
            messages["stochastic"] = (
                f"the forward gave different values on the same rows at step {step} (dropout or batch-norm in train "
                "mode, noise drawn inside forward?): the attributions are not reproducible"
            )
        member_worst = math.nan if self.ensemble is None else self.ensemble.scalars["completeness/worst_relative_error"]
        if math.isfinite(member_worst) and member_worst > numbers.tolerance:
            messages["members-fail"] = (
                f"the worst relative completeness error of an ensemble member is {member_worst:.3g} at step {step}, "
                f"above completeness_tol={numbers.tolerance:g} (ig/ensemble/completeness/...); use n_steps='auto' or "
                "more steps"
            )
        return messages

    @property
    def units(self) -> Units:
        """What the figures, the text and drift are about: the groups when in use, else the features."""
        units = self.groups if self.groups is not None else self.logged_features
        if units is None:  # pragma: no cover - the callback always has one or the other
            raise ValueError("a run summary needs logged features or groups")
        return units


def summarize(
    host: HostResult,
    *,
    feature_names: Sequence[str],
    log_features: bool,
    settings: RunSettings,
    step: int,
    run_index: int,
    previous: Sequence[float] | None = None,
    first: Sequence[float] | None = None,
    time_ms: float = 0.0,
    members: MemberRun | None = None,
) -> RunSummary:
    """The :class:`RunSummary` of one run.

    Args:
        host: the gathered result (with ``group_attributions`` when groups are in use,
            and ``attributions`` when the features are logged one by one).
        feature_names: one name per flattened feature.
        log_features: log the features one by one (there are few enough).
        settings: the run's :class:`RunSettings`.
        step: the global step.
        run_index: the run's index in the history.
        previous: the previous run's unit mean ``|attr|`` (for drift), or ``None``.
        first: the first run's, or ``None``.
        time_ms: wall time of the IG computation.
        members: the members' numbers when the model is an ensemble, else ``None``.

    Returns:
        The summary.
    """
    logged = None
    if log_features:
        logged = Units("features", list(feature_names), host.features, host.attributions)
    groups = None
    if host.groups is not None and host.group_attributions is not None:
        groups = Units(
            "groups",
            list(host.groups.names),
            Moments.of(host.group_attributions),
            host.group_attributions,
            host.groups.sizes.numpy(),
        )
    units = groups if groups is not None else logged
    unit_mean_abs = units.moments.mean_abs if units is not None else host.features.mean_abs
    return RunSummary(
        step=int(step),
        run_index=int(run_index),
        settings=settings,
        num_states=host.num_states,
        feature_shape=host.feature_shape,
        n_steps=host.n_steps,
        method=host.method,
        gradient=host.gradient,
        backend=host.backend,
        features=host.features,
        logged_features=logged,
        groups=groups,
        completeness=completeness(host, settings.tolerance),
        drift=drift(
            unit_mean_abs,
            None if previous is None else np.asarray(previous, dtype=np.float64),
            None if first is None else np.asarray(first, dtype=np.float64),
            top_k=settings.top_k,
        ),
        concentration=concentration(host.features.mean_abs),
        stochastic=host.stochastic,
        time_ms=float(time_ms),
        ensemble=None
        if members is None
        else EnsembleSummary.of(
            host.features.mean_abs,
            members,
            feature_names=feature_names,
            feature_shape=host.feature_shape,
            top_k=settings.top_k,
        ),
    )
