"""The typed summary of one IG run: what every view reads.

:func:`summarize` turns a :class:`~lightning_ig.run.host_result.HostResult` and the history of earlier runs into a
:class:`RunSummary`: the settings, the per-feature and per-group statistics, completeness with its verdict, drift and
concentration. Views read these fields; they never read the JSON report's keys, so the file format and the pictures can
change apart. A run's numbers carry kinds and values; the words are :mod:`lightning_ig.views.text`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_ig.attribution.targets import Target
from lightning_ig.run.actions import ActionSummary
from lightning_ig.run.host_result import HostResult, Moments
from lightning_ig.run.statistics import Completeness, completeness, concentration, drift

__all__ = ["RunSettings", "RunSummary", "Units", "summarize"]


@dataclass(frozen=True)
class Units:
    """Things with one name each that are logged one by one: the features, or the groups.

    Attributes:
        kind: ``"features"`` or ``"groups"``.
        names: one name per unit.
        moments: :class:`~lightning_ig.run.host_result.Moments` over the states, ``(U,)`` each.
        values: ``(B, U)`` per-state attributions of the units (for histograms), or ``None``.
        sizes: ``(U,)`` members per group (``None`` for features).
        positive, negative: ``(U,)`` the mean over the states of the unit's positive and negative attribution mass
            (a magnitude), summed over its features one by one, so that a group whose cells cancel shows both
            (a feature's are ``(mean|a| +- mean a) / 2``), or ``None``: the units' own (:attr:`parts`).
    """

    kind: str
    names: list[str]
    moments: Moments
    values: np.ndarray | None = None
    sizes: np.ndarray | None = None
    positive: np.ndarray | None = None
    negative: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    @property
    def parts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(positive, negative)`` mass per unit, ``(U,)`` each: their sum is the unit's mass (what it relies on)."""
        if self.positive is not None and self.negative is not None:
            return self.positive, self.negative
        return _sign_parts(self.moments.mean_abs, self.moments.mean_signed)


@dataclass(frozen=True)
class RunSettings:
    """What a run was asked to do, for the titles and the text."""

    target: Target  # what was attributed, bound to the model (its label, its actions' labels, its words)
    baseline: str  # "zeros", "mean" or "tensor(...)"
    tolerance: float  # completeness_tol
    top_k: int
    name: str | None = None  # the callback's name= (several callbacks in one Trainer)
    report_dir: str | None = None  # where the JSON reports go (the text says where the per-state numbers are)
    rounding: float = 0.0  # a half-precision forward's eps: an error floor that no number of points lowers


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
        completeness: :class:`~lightning_ig.run.statistics.Completeness`.
        drift: the meaningful drift scalars (empty on the first run).
        concentration: share of the mass held by the top features.
        stochastic: the forward gave different values on the same rows.
        time_ms: wall time of the IG computation and the gather.
        actions: a ``target="each"`` run per action (its rows are (state, action) pairs), or ``None``.
        trust_checks: the callback's trust verdict (``lightning_ig.trust.TrustSummary``: ``status``,
            ``reasons``, ``notes``, ``headline()``, ``lines()``, the checks' results), or ``None`` (no checks).
        trust_scalars: the trust checks' scalars of this run, and ``<prefix>/overhead`` (the share of the fit's wall
            time the callback took so far), keyed by their full tags (``<prefix>/sanity/...``).
        budget: what the callback's budget did at this run (the JSON report's ``"budget"``; empty outside a fit).
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
    actions: ActionSummary | None = None
    trust_checks: Any = None  # typed by the callback's wing, which the views do not import
    trust_scalars: Mapping[str, float] = field(default_factory=dict)
    budget: Mapping[str, Any] = field(default_factory=dict)

    def history_entry(self, epoch: int) -> dict[str, Any]:
        """This run as the callback's history keeps it (drift's reference, the charts over training, ``state_dict``):
        the units' mean ``|attr|`` and mean attr, their mass (``positive + negative``), the accuracy verdict
        (``"pass"``, ``"fail"``, ``"unchecked"``, ``"non-finite"``) with the figure that decided it against its bar
        (``accuracy``: ``figure``, ``value``, ``threshold``), the trust status (``None``: no checks) and its reasons."""
        units, trust, accuracy = self.units, self.trust_checks, self.completeness.accuracy
        positive, negative = units.parts
        return {
            "global_step": self.step,
            "epoch": int(epoch),
            "mean_abs": units.moments.mean_abs.tolist(),
            "mean_signed": units.moments.mean_signed.tolist(),
            "mass": (positive + negative).tolist(),
            "verdict": self.completeness.verdict,
            "accuracy": {"figure": accuracy.figure, "value": accuracy.value, "threshold": accuracy.threshold},
            "trust": None if trust is None else str(trust.status),
            "trust_reasons": [] if trust is None else [str(reason) for reason in trust.reasons],
        }

    def troubles(self) -> list[str]:
        """The kinds of trouble of this run (the views say them: :func:`lightning_ig.views.text.troubles`).

        Returns:
            In order, those that apply: ``"non-finite"`` (NaN/Inf from the model), ``"unchecked"`` (no state could
            be checked), ``"fail"`` (not within tolerance), ``"stochastic"`` (the forward moved on the same rows).
        """
        verdict = self.completeness.verdict
        kinds = [verdict] if verdict in ("non-finite", "unchecked", "fail") else []
        if self.stochastic:
            kinds.append("stochastic")
        return kinds

    @property
    def moving_drift(self) -> dict[str, float]:
        """The drift figures that can move: the JSON report keeps every one, the text and the scalars leave out the
        top-k overlap with ``top_k`` or fewer units and the rank correlations with fewer than 3 (fixed by
        construction)."""
        fewest = {"topk_jaccard_prev": self.settings.top_k + 1}  # the rank correlations: 3
        count = len(self.units.moments.mean_abs)
        return {key: value for key, value in self.drift.items() if count >= fewest.get(key, 3)}

    @property
    def units(self) -> Units:
        """What the charts, the text and drift are about: the groups when in use, else the features."""
        units = self.groups if self.groups is not None else self.logged_features
        if units is None:  # pragma: no cover - the callback always has one or the other
            raise ValueError("a run summary needs logged features or groups")
        return units


def _sign_parts(mean_abs: np.ndarray, mean_signed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``mean(max(a, 0)) = (mean|a| + mean a) / 2`` and ``mean(max(-a, 0))``, non-finite values as 0."""
    mean_abs, mean_signed = np.nan_to_num(mean_abs, posinf=0.0), np.nan_to_num(mean_signed, posinf=0.0, neginf=0.0)
    positive = np.clip((mean_abs + mean_signed) / 2, 0.0, None)
    return positive, np.clip(mean_abs - positive, 0.0, None)


def summarize(
    host: HostResult,
    *,
    feature_names: Sequence[str],
    log_features: bool,
    settings: RunSettings,
    step: int,
    history: Sequence[Mapping[str, Any]] = (),
    time_ms: float = 0.0,
) -> RunSummary:
    """The :class:`RunSummary` of one run.

    Args:
        host: the gathered result (with ``group_attributions`` when groups are in use,
            and ``attributions`` when the features are logged one by one).
        feature_names: one name per flattened feature.
        log_features: log the features one by one (there are few enough).
        settings: the run's :class:`RunSettings`.
        step: the global step.
        history: the earlier runs, as :meth:`RunSummary.history_entry` writes them (this run's index is their
            count; drift compares this run with the previous one and the first).
        time_ms: wall time of the IG computation.

    Returns:
        The summary.
    """
    positive, negative = _sign_parts(host.features.mean_abs, host.features.mean_signed)  # (F,) each
    logged = None
    if log_features:
        logged = Units("features", list(feature_names), host.features, host.attributions, None, positive, negative)
    groups = None
    if host.groups is not None and host.group_attributions is not None:
        ids, count = host.groups.ids.numpy(), len(host.groups.names)
        groups = Units(
            "groups",
            list(host.groups.names),
            Moments.of(host.group_attributions),
            host.group_attributions,
            host.groups.sizes.numpy(),
            np.bincount(ids, weights=positive, minlength=count),  # each cell's own sign, never the group's net
            np.bincount(ids, weights=negative, minlength=count),
        )
    units = groups if groups is not None else logged
    unit_mean_abs = units.moments.mean_abs if units is not None else host.features.mean_abs
    actions = None
    names = settings.target.actions if settings.target.every_output else None  # rows: (state, action), state-major
    if names is not None and units is not None and units.values is not None:
        actions = ActionSummary.of_each(host, units.values, names)
    previous, first = (history[-1]["mean_abs"], history[0]["mean_abs"]) if history else (None, None)
    return RunSummary(
        step=int(step),
        run_index=len(history),
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
        actions=actions,
    )
