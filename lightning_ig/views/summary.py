"""The typed summary of one IG run, what every view reads, and its words.

:func:`summarize` turns a :class:`~lightning_ig.attribution.host_result.HostResult`
and the history of earlier runs into a :class:`RunSummary`: the settings, the
per-feature and per-group statistics, completeness with its verdict, drift
and concentration. Views read these fields; they never read the JSON
report's keys, so the file format and the pictures can change apart.

The words of a run live here too, beside the numbers they describe: the unit of
the attributions (:func:`target_unit`), the completeness verdict of the bar chart
(:func:`completeness_verdict`) and the ``<prefix>/report`` markdown TensorBoard
shows (:func:`report_markdown`). The completeness error is written as a fraction
(``relative error 3.76e-03 <= 0.01``), as the JSON report, the scalars and
``completeness_tol`` have it (:func:`lightning_ig.vocabulary.relative_error_text`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_ig.attribution.host_result import HostResult, Moments
from lightning_ig.attribution.statistics import (
    Completeness,
    completeness,
    concentration,
    drift,
    rank_order,
)
from lightning_ig.ensemble.agreement import EnsembleSummary
from lightning_ig.ensemble.members import MemberRun
from lightning_ig.views.number_format import format_percent, format_signed, format_value
from lightning_ig.views.per_action import ActionSummary
from lightning_ig.vocabulary import relative_error_text

__all__ = [
    "DRIFT_WORDS",
    "RunSettings",
    "RunSummary",
    "Units",
    "completeness_sentence",
    "completeness_verdict",
    "per_state_pointer",
    "report_markdown",
    "summarize",
    "target_unit",
]


@dataclass(frozen=True)
class Units:
    """Things with one name each that are logged one by one: the features, or the groups.

    Attributes:
        kind: ``"features"`` or ``"groups"``.
        names: one name per unit.
        moments: :class:`~lightning_ig.attribution.host_result.Moments` over the states, ``(U,)`` each.
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
class RunSettings:
    """What a run was asked to do, for the titles and the text."""

    target: str  # the target label: "mean", "action:1", "output", "callable:<name>"
    baseline: str  # "zeros", "mean" or "tensor(...)"
    tolerance: float  # completeness_tol
    top_k: int
    name: str | None = None  # the callback's name= (several callbacks in one Trainer)
    report_dir: str | None = None  # where the JSON reports go (the text says where the per-state numbers are)


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
        completeness: :class:`~lightning_ig.attribution.statistics.Completeness`.
        drift: the meaningful drift scalars (empty on the first run).
        concentration: share of the mass held by the top features.
        stochastic: the forward gave different values on the same rows.
        time_ms: wall time of the IG computation and the gather.
        ensemble: the members of an ensemble model, or ``None``.
        actions: a ``target="each"`` run per action (its rows are (state, action) pairs), or ``None``.
        trust_checks: the callback's trust verdict (``lightning_ig.callback.trust.TrustSummary``: ``status``,
            ``reasons``, ``notes``, ``headline()``, ``lines()``, the checks' results), or ``None`` (no checks).
        trust_scalars: the trust checks' scalars of this run, keyed by their full tags (``<prefix>/sanity/...``).
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
    actions: ActionSummary | None = None
    trust_checks: Any = None  # typed by the callback's wing, which the views do not import
    trust_scalars: Mapping[str, float] = field(default_factory=dict)

    def history_entry(self, epoch: int) -> dict[str, Any]:
        """This run as the callback's history keeps it (the heatmap's rows, drift's reference, ``state_dict``)."""
        moments = self.units.moments
        return {
            "global_step": self.step,
            "epoch": int(epoch),
            "mean_abs": moments.mean_abs.tolist(),
            "mean_signed": moments.mean_signed.tolist(),
        }

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
                f"no state could be checked for accuracy at step {step}: in all {numbers.num_states} states the "
                "attributions are (near) zero, F(x) = F(b) along the whole path (logged as nan); try baseline='mean' "
                "or another target"
            )
        elif numbers.verdict == "fail":
            messages["fail"] = (
                f"the accuracy check (estimated attribution error, mass-relative completeness error) fails at step "
                f"{step} with completeness_tol={numbers.tolerance:g}: {numbers.accuracy.reason}. Use n_steps='auto' "
                "(it refines each state until its error estimate is within tolerance) or more steps; fewer held-out "
                "states at more steps cost about the same"
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
        """What the charts, the text and drift are about: the groups when in use, else the features."""
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
    action_names: Sequence[str] | None = None,
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
        action_names: for a ``target="each"`` run (one row per state and action, state-major), one label per
            action: the summary gets the run per action (:class:`~lightning_ig.views.per_action.ActionSummary`).

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
    actions = None
    if action_names is not None and units is not None and units.values is not None:
        actions = ActionSummary.of_each(host, units.values, action_names)
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
        actions=actions,
    )


# --------------------------------------------------------------------------- the words of a run

DRIFT_WORDS = {
    "spearman_prev": "Spearman rank correlation with the previous run",
    "spearman_first": "with the first run",
    "topk_jaccard_prev": "top-{k} overlap (Jaccard) with the previous run",
}


def target_unit(target: str) -> str:
    """The unit of the attributions, from the target label: attributions add up to a change of the target."""
    if target == "mean":
        return "mean output = V(s)"
    if target == "contrast":
        return "Q(greedy) - Q(runner-up)"
    if target.startswith("action:"):
        return f"Q(s, {target.split(':', 1)[1]})"
    if target.startswith("callable:"):
        return target.split(":", 1)[1]
    return "model output"


def _number(value: float, spec: str = ".4g") -> str:
    return "nan" if value != value else format(value, spec)


def _figures_text(numbers: Completeness) -> str:
    """The two figures the verdict rests on, as every line writes them (fractions, as ``completeness_tol``)."""
    return (
        f"worst attribution error {relative_error_text(numbers.worst_attribution_error)} (estimated), worst "
        f"mass-relative completeness error {relative_error_text(numbers.worst_mass_relative_error)}"
    )


def per_state_pointer(summary: RunSummary) -> str:
    """Where a run's per-state numbers are: the JSON reports' folder with ``report_dir``, else how to get them."""
    folder = summary.settings.report_dir
    if folder is not None:
        return f"the per-state numbers are in the JSON reports in {folder}"
    return "pass report_dir= to the callback for a JSON report of every run with the per-state numbers"


def completeness_verdict(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, one short line)`` for the bar chart: decided by
    :func:`~lightning_ig.attribution.statistics.accuracy_verdict`, naming the figure that decided."""
    numbers = summary.completeness
    tolerance, accuracy = numbers.tolerance, numbers.accuracy
    value = relative_error_text(accuracy.value)
    words = "estimated attribution error" if accuracy.figure == "attribution_error" else "mass-relative error"
    line = {
        "non-finite": f"NaN/Inf in {numbers.num_non_finite} of {numbers.num_states} states: not to be trusted",
        "unchecked": f"completeness not checked: the attributions are zero in all {numbers.num_states} states",
        "pass": (
            f"completeness passes: worst {words} {value} <= {relative_error_text(accuracy.threshold)} "
            f"(sqrt 2 x tol {tolerance:g})"
        ),
        "fail": (
            f"completeness FAILS: worst {words} {value} > {relative_error_text(accuracy.threshold)} "
            f"(sqrt 2 x tol {tolerance:g}); use n_steps='auto'"
        ),
    }[numbers.verdict]
    return numbers.verdict, line


def completeness_sentence(summary: RunSummary) -> tuple[str, str]:
    """``(verdict, sentence)`` in plain words, for the text: the accuracy verdict, the figures it rests on, the
    states near the baseline (flagged, not scored) and the relative completeness error beside them."""
    numbers, target = summary.completeness, summary.settings.target
    total = numbers.num_states
    if numbers.verdict == "non-finite":
        first = numbers.first_non_finite
        return "non-finite", (
            f"The model produced NaN/Inf in {numbers.num_non_finite} of {total} states (first: state "
            f"{first}): these attributions cannot be trusted."
        )
    if numbers.verdict == "unchecked":
        return "unchecked", (
            f"Completeness not checked: in all {total} states the attributions are zero, F(x) = F(b) along the whole "
            f"path (mean absolute completeness error {format_value(numbers.mean_abs_error)}, target {target})."
        )
    notes = ""
    if numbers.num_near_baseline:
        notes += (
            f" {numbers.num_near_baseline} of {total} state(s) are near the baseline (attribution mass below a tenth "
            f"of the median, where every relative figure is ill-conditioned): flagged, not scored "
            f"({per_state_pointer(summary)})."
        )
    if numbers.error_scale != 1.0:
        notes += f" The estimate is scaled by {numbers.error_scale:.3g} (calibration)."
    notes += f" Relative completeness error |delta| / |dF|: {relative_error_text(numbers.worst_relative_error)}."
    if numbers.verdict == "pass":
        return "pass", (
            f"Completeness passes: {_figures_text(numbers)}, both <= sqrt(2) x tolerance {numbers.tolerance:g} over "
            f"{total - numbers.num_near_baseline - numbers.num_non_finite} states.{notes}"
        )
    return "fail", (
        f"Completeness FAILS: {numbers.accuracy.reason} (tolerance {numbers.tolerance:g}): the attributions may be "
        f"off by more than the tolerance ({_figures_text(numbers)}). Use n_steps='auto' or more steps.{notes}"
    )


def report_markdown(
    summary: RunSummary, labels: Sequence[str], prefix: str, *, saliency_scale: float | None = None
) -> str:
    """The ``<prefix>/report`` text: settings, the completeness verdict, the top-k table, drift, concentration,
    the saliency scale and an ensemble's members.

    The table is a fixed-width block: TensorBoard's markdown drops table alignment, and numbers read best
    right-aligned.
    """
    settings = summary.settings
    units = summary.units
    noun = "groups" if units.kind == "groups" else "features"
    name = "" if settings.name is None else f" ({settings.name})"
    lines = [
        f"### Integrated Gradients{name} at step {summary.step}",
        "",
        (
            f"{summary.num_states} states, {summary.n_steps} steps ({summary.method}, {summary.gradient} gradients, "
            f"{summary.backend} backend), target `{settings.target}` ({target_unit(settings.target)}), baseline "
            f"`{settings.baseline}`."
        ),
        "",
        f"**{completeness_sentence(summary)[1]}**",
    ]
    numbers = summary.completeness
    if numbers.num_non_finite == 0 and numbers.num_degenerate == 0:
        lines += [
            "",
            (
                "No state gave NaN/Inf and none was too close to the baseline to check (the cards "
                f"`{prefix}/completeness/non_finite_states` and `degenerate_states` appear from the first run "
                "that has one)."
            ),
        ]
    if summary.stochastic:
        lines += [
            "",
            (
                "**The forward is random**: it gave different values on the same rows (dropout or batch-norm "
                "in train mode, noise left on); the attributions are not reproducible."
            ),
        ]
    order = rank_order(units.moments.mean_abs)[: settings.top_k]
    width = max([len(noun) - 1, *(len(labels[i]) for i in order)])
    rows = [f"{'rank':>4}  {noun[:-1]:<{width}}  {'mean |attr|':>11}  {'std of attr':>11}  {'mean attr':>10}"]
    for rank, index in enumerate(order, start=1):
        moments = units.moments
        rows.append(
            f"{rank:>4}  {labels[index]:<{width}}  {format_value(moments.mean_abs[index]):>11}  "
            f"{format_value(moments.stddev[index]):>11}  {format_signed(moments.mean_signed[index]):>10}"
        )
    lines += [
        "",
        f"Top {len(order)} {noun} by mean |attribution| (units of {target_unit(settings.target)}):",
        "",
        "```",
        *rows,
        "```",
    ]
    if summary.drift:
        words = [
            f"{DRIFT_WORDS[key].format(k=settings.top_k)} {_number(value, '.3f')}"
            for key, value in summary.drift.items()
        ]
        lines += ["", f"**Drift**: {', '.join(words)}."]
    shares = summary.concentration
    if shares:
        features = int(np.prod(summary.feature_shape))
        lines += [
            "",
            (
                f"**Concentration**: the top 1% of the {features} features hold "
                f"{format_percent(shares['top1pct_share'])} of the mean |attribution|, the top 10% hold "
                f"{format_percent(shares['top10pct_share'])}."
            ),
        ]
    if saliency_scale is not None:
        lines += [
            "",
            (
                f"**Saliency** (`{prefix}/saliency`): colour scale ±{format_value(saliency_scale)} per cell; blue "
                "raises the target, red lowers it."
            ),
        ]
    lines += ["", *summary.trust_checks.lines()] if summary.trust_checks is not None else []
    return "\n".join(lines + _ensemble_lines(summary, prefix)) + "\n"


def _ensemble_lines(summary: RunSummary, prefix: str) -> list[str]:
    """What the members of an ensemble say: their agreement with the aggregate and their completeness."""
    if summary.ensemble is None:
        return []
    scalars, count = summary.ensemble.scalars, summary.ensemble.report["num_members"]
    worst = scalars["completeness/worst_relative_error"]
    verdict = (
        "passes" if worst <= summary.completeness.tolerance else "was not checked" if math.isnan(worst) else "FAILS"
    )
    return [
        "",
        (
            f"**Ensemble** ({count} members, `{prefix}/ensemble/...`): Spearman correlation of the members' feature "
            f"rankings with the aggregate's: mean {_number(scalars['spearman_mean'], '.3f')}, lowest "
            f"{_number(scalars['spearman_min'], '.3f')}; relative spread of mean |attribution| across members "
            f"{_number(scalars['relative_spread'], '.3g')}. Member completeness {verdict}: worst relative error "
            f"{relative_error_text(worst)}."
        ),
    ]
