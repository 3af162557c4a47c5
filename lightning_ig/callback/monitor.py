"""The callback's trust checks over a fit: which run at which run (:mod:`~lightning_ig.trust.schedule`), and
the verdict of every run.

:class:`TrustMonitor` is made once per fit (:meth:`TrustMonitor.prepare`). The callback enters it only where it has
work: the first run of a fit, each run at which the schedule makes a check, and the final run. Which runs those are
is plain data, :attr:`TrustMonitor.next_run`, an int the callback compares with its run count; the runs in between
take their verdict from :attr:`TrustMonitor.carried`, made at the last check for each outcome of the run's own
accuracy verdict (``within`` True, False or None), so that they read a dictionary and run none of this package's
code. At a check, :meth:`TrustMonitor.step` runs the checks the schedule makes, on the run's per-state attributions
of the logged units (features, or groups), keeps each check's latest result, and joins them with the run's accuracy
into the run's :class:`~lightning_ig.trust.verdict.TrustSummary`: the scalars (``ig/sanity/...``,
``ig/faithfulness/...``, ``ig/stability/...``, ``ig/trust/...``) and the lines of the report text, which say what
has not run yet and when it will.

**Where they compute.** On the model's working copy (:class:`~lightning_ig.trust.replica.Replica`, made by
the first check and synced with the model before each use), never on the model: its IG replays a CUDA graph on a
GPU, the deletion check keeps its fixed rows (:class:`~lightning_ig.trust.faithfulness.DeletionPlan`), the
sanity reference is made once.

**Ranks.** The checks run on global rank zero alone, on the gathered result of all held-out states (which every
rank holds after the run's one collective) and the full set of states: they make no collective call, so every
rank makes exactly the collectives it would make without them, and only rank zero, which logs, computes what it
logs. The schedule counts all the held-out states, so one process and several make the same checks at the same
runs. Under a sharded strategy (FSDP, DeepSpeed, model parallel) a forward may need every rank, so the checks are
switched off there, with a warning.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.targets import Target
from lightning_ig.callback.heldout import baselines_for
from lightning_ig.models.noise import NoisyLinear
from lightning_ig.run.actions import state_rows
from lightning_ig.run.host_result import HostResult
from lightning_ig.run.statistics import AccuracyVerdict
from lightning_ig.run.summary import RunSummary
from lightning_ig.trust.common import AttributionSettings
from lightning_ig.trust.faithfulness import DeletionPlan
from lightning_ig.trust.replica import Replica
from lightning_ig.trust.sanity import RandomizationReference, randomization_check, randomization_reference
from lightning_ig.trust.schedule import CHECKS, CheckCosts, Schedule, TrustChecks
from lightning_ig.trust.stability import stability_check
from lightning_ig.trust.verdict import TrustSummary, trust_summary
from lightning_ig.vocabulary import shown

__all__ = ["CHECKS", "NEVER", "TrustChecks", "TrustMonitor", "trust_scalar_tags"]

NEVER = sys.maxsize  # next_run when no check is scheduled again

# The carried verdicts' words for the run's own accuracy (its numbers are in the report's completeness section).
_CARRIED_ACCURACY = {
    True: "within tolerance at this run (its figures: the completeness section)",
    False: "not within tolerance at this run (which figure and by how much: the completeness section)",
    None: "nothing to check at this run (no state away from the baseline)",
}


def trust_scalar_tags(prefix: str, *, noisy: bool) -> list[str]:
    """Every scalar tag the trust checks log under ``prefix`` (``"ig"`` or ``"ig/<name>"``): the stability check's
    only for a model with NoisyLinear layers (``noisy``). A check's tags appear at the runs it makes."""
    tags = [
        "sanity/randomization_rank_correlation",
        "sanity/copy_rank_correlation",
        "faithfulness/deletion_auc",
        "faithfulness/deletion_auc_random",
        *(["stability/noise_rank_correlation"] if noisy else []),
        "trust/status",
    ]
    return [f"{prefix}/{tag}" for tag in tags]


class TrustMonitor:
    """The trust checks of one callback over one fit, on global rank zero.

    Attributes:
        options: the cadence and budget.
        schedule: what runs when (:class:`~lightning_ig.trust.schedule.Schedule`).
        next_run: the run (the callback's run index: its history's length) at which the callback next enters
            :meth:`step`; 0 before the first run, :data:`NEVER` when no check is scheduled again.
        carried: ``{accuracy within (True, False, None): (verdict, scalars)}``: the verdict and scalars of a run
            that does not enter :meth:`step`, made at the last one.
        latest: the last verdict made (``None`` before the first run).
        seconds: the time each piece took over this fit (``replica``, ``reference``, the checks, ``verdict``).
    """

    def __init__(
        self,
        options: TrustChecks,
        model: torch.nn.Module,
        states: torch.Tensor,
        baselines: Any,
        settings: AttributionSettings,
        groups: FeatureGroups | None,
        prefix: str,
        *,
        replays: bool = False,
        rows_per_state: int = 1,
    ) -> None:
        self.options, self.model, self.states, self.baselines = options, model, states, baselines
        self.rows_per_state = rows_per_state  # a "each" run's rows: (state, action) pairs, state-major
        self.settings, self.groups, self.prefix = settings, groups, prefix
        noisy = any(isinstance(module, NoisyLinear) for module in model.modules())
        units = states[0].numel() if groups is None else len(groups)
        steps = settings.options.n_steps
        self.costs = CheckCosts.estimate(
            options, num_states=len(states), num_units=units, n_steps=steps, replays=replays
        )
        self.schedule = Schedule(options, self.costs, [name for name in CHECKS if noisy or name != "stability"])
        self.next_run = 0
        self.carried: dict[bool | None, tuple[TrustSummary, dict[str, float]]] = {}
        self.latest: TrustSummary | None = None
        self.seconds = dict.fromkeys(("replica", "reference", *CHECKS, "verdict"), 0.0)
        self._start: int | None = None  # the run index of this fit's first run
        self._replica: Replica | None = None
        self._reference: RandomizationReference | None = None
        self._deletion: DeletionPlan | None = None
        self._results: dict[str, Any] = {}  # each check's latest result
        self._steps: dict[str, int] = {}  # ... and its global step
        self._errors: dict[str, str] = {}  # checks that could not run (switched off for the fit)
        # the run of the fit at which each check first runs: made at set-up, outside the runs' time (the schedule
        # follows it run for run; made again if a check is switched off)
        self._plan: dict[str, int] | None = self.schedule.plan(-1)

    @classmethod
    def prepare(
        cls,
        options: TrustChecks | None,
        trainer: Any,
        pl_module: torch.nn.Module,
        engine: Any,
        forward: Any,
        held_out: torch.Tensor,
        baseline: Any,
        groups: FeatureGroups | None,
        prefix: str,
    ) -> TrustMonitor | None:
        """The monitor of this fit, or ``None``: checks off, not global rank zero, or a sharded strategy."""
        if options is None or not trainer.is_global_zero:
            return None
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: PLC0415 - at set-up only

        if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
            rank_zero_warn(
                f"IntegratedGradientsCallback: the trust checks run on global rank zero alone, and under "
                f"{type(trainer.strategy).__name__} a forward may need every rank: switched off "
                "(pass checks_every_n_runs=None to silence this)"
            )
            return None
        dtype = next((p.dtype for p in pl_module.parameters() if p.is_floating_point()), torch.float32)
        device = pl_module.device
        states = held_out.to(device=device, dtype=dtype)
        zeros = isinstance(baseline, str) and baseline == "zeros"  # the engines' fast path: no baseline tensor
        baselines = None if zeros else baselines_for(baseline, held_out, torch.arange(len(held_out)), device, dtype)
        # target="each": the checks judge the mean over the actions. IG is linear in the target, so a state's action
        # rows averaged (step) are the attributions of mean_a Q(s, a), V(s) of a dueling network, which the checks
        # attribute again; a plain forward, so the deletion check runs too.
        target = engine.target
        checked = Target.parse("mean") if target.every_output else target
        settings = AttributionSettings(forward=forward, target=checked, options=engine.options)
        replays, rows = _replays(engine, device), target.rows_per_state
        monitor = cls(
            options, pl_module, states, baselines, settings, groups, prefix, replays=replays, rows_per_state=rows
        )
        if not settings.target.checks_deletion:  # a contrast's pair is chosen at each state and held fixed
            monitor._switch_off(
                "deletion",
                "deletion: not run for target='contrast' (its greedy/runner-up pair is chosen at each state and held "
                "fixed; a deleted state's forward cannot re-state it)",
            )
            monitor._plan = monitor.schedule.plan(-1)  # at set-up still
        return monitor

    def step(
        self, host: HostResult, summary: RunSummary, *, final: bool = False
    ) -> tuple[RunSummary, dict[str, float]]:
        """The checks the schedule makes at this run, and the run's verdict: ``(summary with trust_checks set,
        scalars)``. The scalars are this run's: each check that ran, and the verdict (``<prefix>/trust/...``)."""
        if self.rows_per_state > 1:  # "each": each state's action rows averaged (see prepare)
            host = dataclasses.replace(
                host,
                attributions=_state_means(host.attributions, self.rows_per_state),
                group_attributions=_state_means(host.group_attributions, self.rows_per_state),
            )
        started = time.perf_counter()
        if self._start is None:
            self._start = summary.run_index
        run = summary.run_index - self._start
        made = self.schedule.decide(run, final=final)
        spent = sum(self.seconds.values())
        scalars: dict[str, float] = {}
        for name in made:
            result = self._timed(name, host)
            if result is not None:
                self._results[name], self._steps[name] = result, summary.step
                scalars.update(result.scalars())
        self.schedule.record(run, made)  # booked as decided, also for a check that raised: the cost is the model's
        checks = sum(self.seconds.values()) - spent
        following = self.schedule.next_run(run)
        self.next_run = NEVER if following is None else self._start + following
        words = {"pending": self._pending(run, final), "upcoming": self._upcoming(following)}  # once: every variant's
        verdict = self._verdict(summary.completeness.accuracy, **words)
        self.latest = verdict
        scalars.update(verdict.scalars())
        self.carried = {within: self._carried(within, **words) for within in _CARRIED_ACCURACY}
        self.seconds["verdict"] += time.perf_counter() - started - checks
        return dataclasses.replace(summary, trust_checks=verdict), self._tagged(scalars)

    # -- the checks

    def _timed(self, name: str, host: HostResult) -> Any:
        """Run one check, timed into :attr:`seconds`; a check that raises is warned about once and switched off."""
        started = time.perf_counter()
        try:
            units = host.group_attributions if self.groups is not None else host.attributions
            if units is None:  # pragma: no cover - the callback keeps the attributions while checks are on
                raise ValueError("the run's per-state attributions were not kept")
            if self._replica is None:
                self._replica = Replica(self.model, self.settings)  # every check computes on it, never on the model
                started = self._book("replica", started)
            if name == "sanity" and self._reference is None:
                self._reference = self._make_reference()
                started = self._book("reference", started)
            return self._check(name, units)
        except Exception as error:  # noqa: BLE001 - a diagnostic must not stop training: said once, then off
            self._switch_off(name, f"{name}: could not run ({type(error).__name__}: {shown(str(error), 160)})")
            rank_zero_warn(f"IntegratedGradientsCallback: the {self._errors[name]}; it is off for the rest of the fit")
            return None
        finally:
            self.seconds[name] += time.perf_counter() - started

    def _book(self, piece: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[piece] += now - started
        return now

    def _make_reference(self) -> RandomizationReference:
        options = self.options
        return randomization_reference(
            self.model,
            self.states,
            self.baselines,
            settings=self.settings,
            groups=self.groups,
            num_copies=options.copies,
            num_states=options.quarter(len(self.states)),
            seed=options.seed,
            replica=self._replica,
        )

    def _check(self, name: str, units: Any) -> Any:
        options = self.options
        if name == "sanity":
            assert self._reference is not None  # noqa: S101 - made by _timed just before
            return randomization_check(units, self._reference)
        if name == "deletion":
            assert self._replica is not None  # noqa: S101 - made by _timed just before
            if self._deletion is None:
                self._deletion = DeletionPlan(self.states, self.baselines, self.groups, seed=options.seed)
            self._replica.sync()
            return self._deletion.run(self.settings.value(self._replica.module), units)
        return stability_check(
            self.model,
            self.states,
            self.baselines,
            units,
            settings=self.settings,
            groups=self.groups,
            num_draws=options.draws,
            num_states=options.quarter(len(self.states)),
            seed=options.seed,
            replica=self._replica,
        )

    def _switch_off(self, name: str, why: str) -> None:
        self._errors[name] = why
        self.schedule.drop(name)
        self._plan = None  # the others may run sooner: planned again from the run it happened at

    # -- the verdict

    def _verdict(self, accuracy: AccuracyVerdict | None, pending: list[str], upcoming: str | None) -> TrustSummary:
        return trust_summary(
            accuracy=accuracy,
            randomization=self._results.get("sanity"),
            deletion=self._results.get("deletion"),
            stability=self._results.get("stability"),
            errors=list(self._errors.values()),
            steps=sorted(self._steps.items()),
            pending=pending,
            upcoming=upcoming,
        )

    def _carried(
        self, within: bool | None, pending: list[str], upcoming: str | None
    ) -> tuple[TrustSummary, dict[str, float]]:
        """The verdict of a run between checks whose own accuracy verdict is ``within``, and its scalars."""
        accuracy = AccuracyVerdict(within, "none", float("nan"), float("nan"), _CARRIED_ACCURACY[within])
        verdict = self._verdict(accuracy, pending, upcoming)
        return verdict, self._tagged(verdict.scalars())

    def _pending(self, run: int, final: bool) -> list[str]:
        """A note for each check that has not run yet: what it costs and when the budget lets it run (the plan is
        made once: the schedule follows it run for run, a check switched off or the final run aside)."""
        waiting = [name for name in self.schedule.periods if name not in self._results]
        if not waiting or final:
            return [f"{name}: not run in this fit (the budget did not cover it)" for name in waiting]
        assert self._start is not None  # noqa: S101 - set by step
        if self._plan is None:
            self._plan = self.schedule.plan(run)
        planned = {name: self._start + at for name, at in self._plan.items()}
        budget = self.options.budget
        notes = []
        for name in waiting:
            cost = self.costs.of(name, self.schedule.made)
            within = "" if budget is None else f" within the {budget:.0%} budget"
            when = f"at run {planned[name]}" if name in planned else "not within the next 100000 runs"
            what = " with its re-initialised copies (once)" if name == "sanity" else ""
            notes.append(f"{name}: not run yet; it costs {cost:.2g} IG runs{what} and runs {when}{within}")
        return notes

    def _upcoming(self, following: int | None) -> str | None:
        if following is None:
            return None
        assert self._start is not None  # noqa: S101 - set by step
        names = self.schedule.decide(following)
        return f"next check{'s' * (len(names) > 1)}: {', '.join(names)} at run {self._start + following}"

    def _tagged(self, scalars: dict[str, float]) -> dict[str, float]:
        return {f"{self.prefix}/{tag}": float(value) for tag, value in scalars.items()}


def _replays(engine: Any, device: torch.device) -> bool:
    """Whether the callback's engine replays a CUDA graph on ``device`` (its settings allow one)."""
    settings = engine.options
    return (
        settings.cuda_graph is not False
        and settings.n_steps != "auto"
        and settings.gradient == "autograd"
        and engine.graph_capture.available(torch.device(device))
    )


def _state_means(values: np.ndarray | None, rows_per_state: int) -> np.ndarray | None:
    """``(B * A, ...)`` rows -> ``(B, ...)``: each state's rows averaged."""
    return None if values is None else state_rows(values, rows_per_state).mean(axis=1)
