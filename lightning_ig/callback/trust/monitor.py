"""The callback's trust checks over a fit: when each runs (:class:`TrustChecks`), and each run's verdict.

:class:`TrustMonitor` is made once per fit (:meth:`TrustMonitor.prepare`) and called once per callback run
(:meth:`TrustMonitor.step`) with the run's gathered result and summary. It runs the checks that are due on the run's
per-state attributions of the logged units (features, or groups), keeps each check's latest result, and joins them
with the run's accuracy into the run's :class:`~lightning_ig.callback.trust.verdict.TrustSummary`: the scalars
(``ig/sanity/...``, ``ig/faithfulness/...``, ``ig/stability/...``, ``ig/trust/...``) and the lines of the report
text. A run where no check is due costs the verdict only (a few microseconds, no device work, no host sync).

**Ranks.** The checks run on global rank zero alone, on the gathered result of all held-out states (which every
rank holds after the run's one collective) and the full set of states: they make no collective call, so every
rank makes exactly the collectives it would make without them, and only rank zero, which logs, computes what it
logs. Under a sharded strategy (FSDP, DeepSpeed, model parallel) a forward may need every rank, so the checks are
switched off there, with a warning.

**Cost.** Every check and the reference run at the first run of a fit; afterwards each check at its cadence,
unless the checks have used more than ``budget`` of the IG time of this fit so far, in which case the due checks
wait for their next turn. Over a fit the checks cost at most ``budget`` of the IG time plus the first run's checks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.host_result import HostResult
from lightning_ig.callback.heldout import baselines_for
from lightning_ig.callback.trust.common import AttributionSettings
from lightning_ig.callback.trust.faithfulness import deletion_check
from lightning_ig.callback.trust.sanity import RandomizationReference, randomization_check, randomization_reference
from lightning_ig.callback.trust.stability import stability_check
from lightning_ig.callback.trust.verdict import TrustSummary, trust_summary
from lightning_ig.views.summary import RunSummary
from lightning_ig.vocabulary import check_int, check_positive_int, check_real, shown

__all__ = ["CHECKS", "TrustChecks", "TrustMonitor", "trust_scalar_tags"]

CHECKS = ("sanity", "deletion", "stability")
"""The checks, in the order a run makes them."""


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


@dataclass(frozen=True)
class TrustChecks:
    """When the callback's trust checks run, and how much of the IG time they may use.

    The callback's ``checks_every_n_runs=N`` is :meth:`TrustChecks.every` (N): these defaults at ``N = 5``. Runs are
    the callback's runs; every check runs at the first run of a fit and (within the budget) at the final run.

    Attributes:
        sanity_every_n_runs: the randomisation sanity check every this many runs (default 5; ``None``: never). After
            the once-per-fit reference (``copies`` IG calls on a quarter of the states) it is a few rank
            correlations on the host.
        deletion_every_n_runs: the deletion check every this many runs (default 5; ``None``: never): forwards of
            ``2 K`` copies of the states, ``K <= 16`` fractions.
        stability_every_n_runs: the stability check every this many runs (default 20; ``None``: never): ``draws``
            IG calls on a quarter of the states, on NoisyNet models only.
        budget: the share of the IG time (``ig/time_ms``) of the fit the checks may use (default 0.2); ``None``: no
            limit.
        copies: re-initialised copies in the sanity reference (default 4, at least 2).
        draws: exploration-noise draws of the stability check (default 2).
        seed: the seed of the copies, the random deletion order and the noise draws (default 0): private
            generators, the training run's are never touched.

    Raises:
        TypeError, ValueError: a cadence that is not ``None`` or an int >= 1, ``copies`` < 2, ``draws`` < 1, a
            budget that is not ``None`` or a number > 0, a negative seed.
    """

    sanity_every_n_runs: int | None = 5
    deletion_every_n_runs: int | None = 5
    stability_every_n_runs: int | None = 20
    budget: float | None = 0.2
    copies: int = 4
    draws: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sanity_every_n_runs", "deletion_every_n_runs", "stability_every_n_runs"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(value, name, example=5)
        check_int(self.copies, "copies", minimum=2)
        check_positive_int(self.draws, "draws")
        if self.budget is not None:
            check_real(self.budget, "budget", above=0)
        check_int(self.seed, "seed", minimum=0)

    @classmethod
    def every(cls, runs: int) -> TrustChecks:
        """The callback's ``checks_every_n_runs=runs``: sanity and deletion every ``runs`` runs, stability (about one
        IG call per draw on a quarter of the states) every ``4 * runs``, within the default budget."""
        runs = check_positive_int(runs, "checks_every_n_runs", example=5)
        return cls(sanity_every_n_runs=runs, deletion_every_n_runs=runs, stability_every_n_runs=4 * runs)

    def due(
        self, run: int, *, first: bool, check_seconds: float, ig_seconds: float, final: bool = False
    ) -> frozenset[str]:
        """The checks due at the callback's run ``run`` (its index in the history, from 0).

        Args:
            run: the run's index (the cadence counts from the first run of the history, kept across a resume).
            first: the first run of this fit: every check runs.
            check_seconds: the checks' time so far in this fit.
            ig_seconds: the IG time so far in this fit, this run's included.
            final: the run at the end of training: every check is due (within the budget), so that the last
                verdict rests on the final model.
        """
        periods = {"sanity": self.sanity_every_n_runs, "deletion": self.deletion_every_n_runs}
        periods["stability"] = self.stability_every_n_runs
        active = {name: every for name, every in periods.items() if every is not None}
        if first:
            return frozenset(active)
        if self.budget is not None and check_seconds > self.budget * ig_seconds:
            return frozenset()  # over budget: every due check waits for its next turn
        return frozenset(name for name, every in active.items() if final or run % every == 0)

    def quarter(self, num_states: int) -> int:
        """States the reference and each noise draw attribute: a quarter of the held-out states, at least 2."""
        return min(num_states, max(2, math.ceil(num_states / 4)))


class TrustMonitor:
    """The trust checks of one callback over one fit, on global rank zero.

    Attributes:
        options: the cadence.
        latest: the last run's verdict (``None`` before the first run).
        seconds: the time each piece took over this fit (``reference``, the checks, ``verdict``: the per-run
            joining), and ``ig``: the IG time the budget is measured against.
        runs: the runs of this fit.
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
    ) -> None:
        self.options, self.model, self.states, self.baselines = options, model, states, baselines
        self.settings, self.groups, self.prefix = settings, groups, prefix
        self.latest: TrustSummary | None = None
        self.seconds = dict.fromkeys(("ig", "reference", *CHECKS, "verdict"), 0.0)
        self.runs = 0
        self._reference: RandomizationReference | None = None
        self._results: dict[str, Any] = {}  # each check's latest result
        self._steps: dict[str, int] = {}  # ... and its global step
        self._errors: dict[str, str] = {}  # checks that could not run (switched off for the fit)

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
                "(pass trust_checks=False to silence this)"
            )
            return None
        dtype = next((p.dtype for p in pl_module.parameters() if p.is_floating_point()), torch.float32)
        device = pl_module.device
        states = held_out.to(device=device, dtype=dtype)
        baselines = baselines_for(baseline, held_out, torch.arange(len(held_out)), device, dtype)
        defaults = dict(engine.defaults)
        settings = AttributionSettings(forward=forward, target=defaults.pop("target", None), options=defaults)
        monitor = cls(options, pl_module, states, baselines, settings, groups, prefix)
        if settings.target == "contrast":  # the engine fixes each state's pair at the state: no forward re-states it
            monitor._errors["deletion"] = (
                "deletion: not run for target='contrast' (its greedy/runner-up pair is chosen at each state and held "
                "fixed; a deleted state's forward cannot re-state it)"
            )
        return monitor

    def step(
        self, host: HostResult, summary: RunSummary, *, final: bool = False
    ) -> tuple[RunSummary, dict[str, float]]:
        """The checks due at this run and the run's verdict: ``(summary with trust_checks set, scalars)``.

        The scalars are this run's: each check that ran, and the verdict (``<prefix>/trust/...``) at every run.
        """
        started = time.perf_counter()
        self.seconds["ig"] += summary.time_ms / 1e3
        spent = self.spent()
        first = self.runs == 0
        due = self.options.due(
            summary.run_index, first=first, check_seconds=spent, ig_seconds=self.seconds["ig"], final=final
        )
        self.runs += 1
        scalars: dict[str, float] = {}
        for name in (name for name in CHECKS if name in due and name not in self._errors):
            result = self._timed(name, host)
            if result is not None:
                self._results[name], self._steps[name] = result, summary.step
                scalars.update(result.scalars())
        checks = self.spent() - spent
        verdict = trust_summary(
            accuracy=summary.completeness.accuracy,
            randomization=self._results.get("sanity"),
            deletion=self._results.get("deletion"),
            stability=self._results.get("stability"),
            errors=list(self._errors.values()),
            steps=sorted(self._steps.items()),
        )
        self.latest = verdict
        scalars.update(verdict.scalars())
        summary = dataclasses.replace(summary, trust_checks=verdict)
        self.seconds["verdict"] += time.perf_counter() - started - checks
        return summary, {f"{self.prefix}/{tag}": float(value) for tag, value in scalars.items()}

    def will_check(self, run_index: int, *, final: bool = False) -> bool:
        """Whether a check is due at the run ``run_index`` (asked before the run ends; changes nothing)."""
        due = self.options.due(
            run_index, first=self.runs == 0, check_seconds=self.spent(), ig_seconds=self.seconds["ig"], final=final
        )
        return any(name in due and name not in self._errors for name in CHECKS)

    def spent(self) -> float:
        """The checks' time over this fit so far (seconds): the reference, the checks, the verdicts."""
        return sum(seconds for name, seconds in self.seconds.items() if name != "ig")

    def _timed(self, name: str, host: HostResult) -> Any:
        """Run one check, timed into :attr:`seconds`; a check that raises is warned about once and switched off."""
        started = time.perf_counter()
        try:
            units = host.group_attributions if self.groups is not None else host.attributions
            if units is None:  # pragma: no cover - the callback keeps the attributions while checks are on
                raise ValueError("the run's per-state attributions were not kept")
            if name == "sanity" and self._reference is None:
                self._reference = self._make_reference()
                self.seconds["reference"] += time.perf_counter() - started
                started = time.perf_counter()
            return self._check(name, units)
        except Exception as error:  # noqa: BLE001 - a diagnostic must not stop training: said once, then off
            self._errors[name] = f"{name}: could not run ({type(error).__name__}: {shown(str(error), 160)})"
            rank_zero_warn(f"IntegratedGradientsCallback: the {self._errors[name]}; it is off for the rest of the fit")
            return None
        finally:
            self.seconds[name] += time.perf_counter() - started

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
        )

    def _check(self, name: str, units: Any) -> Any:
        options, states, common = self.options, self.states, {"settings": self.settings, "groups": self.groups}
        if name == "sanity":
            assert self._reference is not None  # noqa: S101 - made by _timed just before
            return randomization_check(units, self._reference)
        if name == "deletion":
            return deletion_check(self.model, states, self.baselines, units, seed=options.seed, **common)
        return stability_check(
            self.model,
            states,
            self.baselines,
            units,
            num_draws=options.draws,
            num_states=options.quarter(len(states)),
            seed=options.seed,
            **common,
        )
