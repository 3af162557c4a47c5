"""The callback's trust checks over a fit: the checks the budget lets a run make, and the verdict of every run.

:class:`TrustMonitor` is made once per fit (:meth:`TrustMonitor.prepare`). Which checks a run makes is the budget's
decision (:meth:`~lightning_ig.callback.budget.Budget.plan`: every check at the fit's first run, then each at most
every few runs when the budget covers it); the callback enters the monitor only at a run that makes one, and at the
final run. The runs in between take their verdict from :attr:`TrustMonitor.carried`, made at the last check for each
outcome of the run's own accuracy verdict (``within`` True, False or None), so that they read a dictionary and run
none of this package's code. At a check, :meth:`TrustMonitor.step` runs the checks asked for on the run's per-state
attributions of the logged units (features, or groups), keeps each check's latest result, and joins them with the
run's accuracy into the run's :class:`~lightning_ig.trust.verdict.TrustSummary`: the scalars (``ig/sanity/...``,
``ig/faithfulness/...``, ``ig/stability/...``, ``ig/trust/...``) and the lines of the report text.

**Where they compute.** On the model's working copy (:class:`~lightning_ig.trust.replica.Replica`, made by
the first check and synced before each use with the weights the run attributed: the model's, or for a run made
beside training the worker's copy: the worker makes them there (:meth:`TrustMonitor.check_beside`), or, where it
ended first, the training thread on the copy that was sent, :meth:`~lightning_ig.trust.replica.Replica.following`),
never on the model: its IG replays a CUDA graph on a GPU, the deletion check keeps its fixed rows
(:class:`~lightning_ig.trust.faithfulness.DeletionPlan`), the sanity reference is made with the copy. Where the
synced copy no longer computes the run's values at the states (a module swapped or added), both are made anew, said.

**Ranks.** The checks run on global rank zero alone, on the gathered result of all held-out states (which every
rank holds after the run's one collective) and the full set of states: they make no collective call, so every
rank makes exactly the collectives it would make without them, and only rank zero, which logs, computes what it
logs. Under a sharded strategy (FSDP, DeepSpeed, model parallel) a forward may need every rank, so the checks are
switched off there, with a warning.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_ig.attribution.eager import deterministic_float32
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.targets import Target
from lightning_ig.callback.heldout import baselines_for, model_dtype
from lightning_ig.models.noise import NoisyLinear, is_noisy_layer
from lightning_ig.ops.ig import repeat_threshold
from lightning_ig.run.actions import state_rows
from lightning_ig.run.host_result import HostResult
from lightning_ig.run.statistics import AccuracyVerdict
from lightning_ig.run.summary import RunSummary
from lightning_ig.trust.common import AttributionSettings
from lightning_ig.trust.faithfulness import DeletionCheck, DeletionPlan
from lightning_ig.trust.replica import Replica
from lightning_ig.trust.sanity import (
    RandomizationCheck,
    RandomizationReference,
    randomization_check,
    randomization_reference,
)
from lightning_ig.trust.stability import StabilityCheck, stability_check
from lightning_ig.trust.verdict import TrustSummary, trust_summary
from lightning_ig.vocabulary import shown

__all__ = ["CHECKS", "COPIES", "DRAWS", "SEED", "Beside", "TrustMonitor", "quarter"]

CHECKS = ("sanity", "deletion", "stability")
"""The checks, in the order a run makes them when they fall due together."""
COPIES = 4  # re-initialised copies in the sanity reference
DRAWS = 2  # exploration-noise draws of the stability check
SEED = 0  # the copies', the random deletion order's and the noise draws' seed: private generators

Beside = tuple[dict[str, Any], dict[str, float]]
"""The checks the runs' worker made at a run: ``({check: result or the error it raised}, {piece: seconds})``."""

# A random forward's attributions change from call to call: a reason of the verdict (the checks cannot vouch for them)
_RANDOM = "random forward: different values on the same states in eval mode"
# The carried verdicts' words for the run's own accuracy (its numbers are in the report's completeness section).
_CARRIED_ACCURACY = {
    True: "within tolerance at this run (its figures: the completeness section)",
    False: "not within tolerance at this run (which figure and by how much: the completeness section)",
    None: "nothing to check at this run (no state away from the baseline)",
}


class TrustMonitor:
    """The trust checks of one callback over one fit, on global rank zero.

    Attributes:
        names: the checks this fit makes (stability only for a model with NoisyLinear layers, every check only over
            two units or more, deletion not for ``target="contrast"``; a check that could not run is dropped).
        carried: ``{accuracy within (True, False, None): (verdict, scalars)}``: the verdict and scalars of a run
            that does not enter :meth:`step`, made at the last one.
        latest: the last verdict made (``None`` before the first run).
        seconds: the time each piece took over this fit (``replica``, ``reference``, the checks, ``verdict``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        states: torch.Tensor,
        baselines: Any,
        settings: AttributionSettings,
        groups: FeatureGroups | None,
        prefix: str,
        *,
        rows_per_state: int = 1,
    ) -> None:
        self.model, self.states, self.baselines = model, states, baselines
        self.rows_per_state = rows_per_state  # a "each" run's rows: (state, action) pairs, state-major
        self.settings, self.groups, self.prefix = settings, groups, prefix
        layers = [module for module in model.modules() if is_noisy_layer(module)]
        noisy = any(isinstance(module, NoisyLinear) for module in layers)
        if foreign := sorted({type(m).__name__ for m in layers if not isinstance(m, NoisyLinear)}):  # no seeded draw
            rank_zero_warn(  # said: else a verdict would pass with the agent's noise never checked
                f"IntegratedGradientsCallback: the stability check draws the exploration noise of lightning_ig's "
                f"NoisyLinear only: the model's noisy layers {', '.join(foreign)} go unchecked (make them NoisyLinear)"
            )
        self.names = [name for name in CHECKS if noisy or name != "stability"]
        self.carried: dict[bool | None, tuple[TrustSummary, dict[str, float]]] = {}
        self.latest: TrustSummary | None = None
        self.seconds = dict.fromkeys(("replica", "reference", *CHECKS, "verdict"), 0.0)
        self._replica: Replica | None = None
        self._reference: RandomizationReference | None = None
        self._compared: HostResult | None = None  # the run whose values the copy was last compared with: once a run
        self._deletion: DeletionPlan | None = None
        self._results: dict[str, Any] = {}  # each check's latest result
        self._steps: dict[str, int] = {}  # ... and its global step
        self._errors: dict[str, str] = {}  # checks that could not run (switched off for the fit)

    @classmethod
    def prepare(
        cls,
        on: bool,
        trainer: Any,
        pl_module: Any,
        engine: Any,
        forward: Any,
        held_out: torch.Tensor,
        baseline: Any,
        groups: FeatureGroups | None,
        prefix: str,
    ) -> TrustMonitor | None:
        """The monitor of this fit, or ``None``: checks off (``on`` False), not global rank zero, or a sharded
        strategy."""
        if not on or not trainer.is_global_zero:
            return None
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: PLC0415 - at set-up only

        if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
            rank_zero_warn(
                f"IntegratedGradientsCallback: the trust checks run on global rank zero alone, and under "
                f"{type(trainer.strategy).__name__} a forward may need every rank: switched off "
                "(pass overhead=None, which makes no check, to silence this)"
            )
            return None
        dtype, device = model_dtype(pl_module), pl_module.device
        states = held_out.to(device=device, dtype=dtype)
        zeros = isinstance(baseline, str) and baseline == "zeros"  # the engines' fast path: no baseline tensor
        baselines = None if zeros else baselines_for(baseline, held_out, torch.arange(len(held_out)), device, dtype)
        # target="each": the checks judge the mean over the actions. IG is linear in the target, so a state's action
        # rows averaged (step) are the attributions of mean_a Q(s, a), V(s) of a dueling network, which the checks
        # attribute again; a plain forward, so the deletion check runs too.
        target = engine.target
        checked = Target.parse("mean") if target.every_output else target
        settings = AttributionSettings(forward=forward, target=checked, options=engine.options)
        monitor = cls(pl_module, states, baselines, settings, groups, prefix, rows_per_state=target.rows_per_state)
        # Checks that cannot apply judge nothing (as stability without NoisyNet): one unit has no order to rank, and
        # a contrast's pair is chosen at each state and held fixed, which a deleted state's forward cannot re-state;
        # one state gives the deletion check no standard error over states.
        units, deletion = states[0].numel() if groups is None else len(groups), settings.target.checks_deletion
        skipped = set(CHECKS) if units < 2 else set() if deletion and len(states) > 1 else {"deletion"}
        monitor.names = [name for name in monitor.names if name not in skipped]
        return monitor

    def step(
        self,
        host: HostResult,
        summary: RunSummary,
        made: tuple[str, ...],
        *,
        final: bool = False,
        note: str | None,
        weights: torch.nn.Module | None = None,
        beside: Beside | None = None,
    ) -> tuple[RunSummary, dict[str, float]]:
        """The checks ``made`` at this run, and the run's verdict: ``(summary with trust_checks set, scalars)``. The
        scalars are this run's: each check that ran, and the verdict (``<prefix>/trust/...``); ``note``: what the
        budget changed at this run (a line of the text); ``weights``: a copy of the model that holds the weights the
        run attributed, where the model has trained on since (``None``: the model as it is); ``beside``: the checks
        the runs' worker made (:meth:`check_beside`), taken as they are."""
        results, seconds = beside if beside is not None else ({}, {})
        if self._reference is None:  # the worker's, made at its first check: the fit's one reference
            self._reference = results.get("reference")
        if any(name in self.names and name not in results for name in made):  # the worker's came averaged already
            host = self._state_means(host)
        for piece, taken in seconds.items():
            self.seconds[piece] += taken
        started = time.perf_counter()
        spent = sum(self.seconds.values())
        scalars: dict[str, float] = {}
        for name in made:
            if name not in self.names:
                continue
            result = results[name] if name in results else self._attempt(name, host, weights)
            if isinstance(result, Exception):  # a diagnostic must not stop training: said once, then off
                why = self._errors[name] = f"{name}: could not run ({type(result).__name__}: {shown(str(result), 160)})"
                self.names.remove(name)
                rank_zero_warn(f"IntegratedGradientsCallback: the {why}; it is off for the rest of the fit")
                continue
            self._results[name], self._steps[name] = result, summary.step
            scalars.update(result.scalars())
        checks = sum(self.seconds.values()) - spent
        pending = self._pending(final)
        self.latest = verdict = self._verdict(summary.completeness.accuracy, pending, note, summary.stochastic)
        scalars.update(verdict.scalars())
        self.carried = {within: self._carried(within, pending) for within in _CARRIED_ACCURACY}
        self.seconds["verdict"] += time.perf_counter() - started - checks
        return dataclasses.replace(summary, trust_checks=verdict), self._tagged(scalars)

    def check_beside(self, host: HostResult, made: tuple[str, ...], weights: torch.nn.Module) -> Beside:
        """The checks ``made`` of a run attributed by the runs' worker, made there on its copy ``weights``: each
        check's result or the error it raised, and the seconds each piece took (what :meth:`step` takes as
        ``beside``). The worker's monitor is a copy of this one made when it started."""
        host, before = self._state_means(host), dict(self.seconds)
        results = {name: self._attempt(name, host, weights) for name in made}
        results["reference"] = self._reference
        return results, {piece: self.seconds[piece] - before[piece] for piece in self.seconds}

    # -- the checks

    def _state_means(self, host: HostResult) -> HostResult:
        if self.rows_per_state == 1:
            return host
        return dataclasses.replace(  # "each": each state's action rows averaged (see prepare)
            host,
            attributions=_state_means(host.attributions, self.rows_per_state),
            group_attributions=_state_means(host.group_attributions, self.rows_per_state),
            f_input=state_rows(host.f_input, self.rows_per_state).mean(axis=1),
        )

    def _attempt(self, name: str, host: HostResult, weights: torch.nn.Module | None) -> Any:
        """One check, timed into :attr:`seconds`, on the working copy synced from ``weights``: its result, or the
        error it raised."""
        started = time.perf_counter()
        try:
            units = host.group_attributions if self.groups is not None else host.attributions
            if units is None:  # pragma: no cover - the callback keeps the attributions while checks are on
                raise ValueError("the run's per-state attributions were not kept")
            compare = host is not self._compared  # one forward a run, not one per check
            self._compared = host
            if self._replica is not None and compare and not self._computes(self._replica, host, weights):
                rank_zero_warn(
                    "IntegratedGradientsCallback: the model no longer computes what the trust checks' copy of it "
                    "computes (a module swapped, added or pruned since it was made?): the copy is made anew"
                )
                self._replica = self._reference = None  # the old network's: both made anew
            if self._replica is None:
                self._replica = Replica(self.model, self.settings)  # every check computes on it, never on the model
                started = self._book("replica", started)
                if not self._computes(self._replica, host, weights):
                    raise RuntimeError("the model's working copy does not compute the values the run attributed")
            with self._replica.following(weights):  # the weights the run attributed
                if name == "sanity" and self._reference is None:
                    self._replica.sync()  # the parameters of a layer without an initialisation are shuffled
                    self._reference = randomization_reference(
                        self.model,
                        self.states,
                        self.baselines,
                        settings=self.settings,
                        groups=self.groups,
                        num_copies=COPIES,
                        num_states=quarter(len(self.states)),
                        seed=SEED,
                        replica=self._replica,
                    )
                    started = self._book("reference", started)
                return self._check(name, units)
        except Exception as error:  # noqa: BLE001 - said and switched off by step
            return error
        finally:
            self.seconds[name] += time.perf_counter() - started

    def _computes(self, replica: Replica, host: HostResult, weights: torch.nn.Module | None) -> bool:
        """Whether ``replica``, synced, computes the run's values at the states, rounding apart."""
        with replica.following(weights), torch.no_grad(), deterministic_float32():  # the engine's float32
            try:
                replica.sync()
            except (KeyError, RuntimeError):  # a weight renamed or resized since the copy was made (pruning)
                return False  # the forward's own errors are the check's to say (out of memory)
            if host.stochastic or not self.settings.target.checks_deletion:  # moving values, outputs picked by state
                return True
            mine = self.settings.value(replica.module)(self.states).double().cpu().numpy()
        tolerance = repeat_threshold(self.states.dtype)  # a batch of other rows may round otherwise
        return mine.shape == host.f_input.shape and np.allclose(mine, host.f_input, tolerance, tolerance, True)

    def _book(self, piece: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[piece] += now - started
        return now

    def _check(self, name: str, units: Any) -> Any:
        if name == "sanity":
            assert self._reference is not None  # noqa: S101 - made by _attempt just before
            return randomization_check(units, self._reference)
        if name == "deletion":
            assert self._replica is not None  # noqa: S101 - made by _attempt just before
            if self._deletion is None:
                self._deletion = DeletionPlan(self.states, self.baselines, self.groups, seed=SEED)
            self._replica.sync()
            return self._deletion.run(self.settings.value(self._replica.module), units)
        return stability_check(
            self.model,
            self.states,
            self.baselines,
            units,
            settings=self.settings,
            groups=self.groups,
            num_draws=DRAWS,
            num_states=quarter(len(self.states)),
            seed=SEED,
            replica=self._replica,
        )

    # -- the verdict

    def _verdict(
        self, accuracy: AccuracyVerdict | None, pending: list[str], note: str | None, stochastic: bool = False
    ) -> TrustSummary:
        return trust_summary(
            accuracy=accuracy,
            randomization=self._results.get("sanity"),
            deletion=self._results.get("deletion"),
            stability=self._results.get("stability"),
            errors=list(self._errors.values()) + [_RANDOM] * stochastic,
            steps=sorted(self._steps.items()),
            pending=pending,
            upcoming=note,
        )

    def _carried(self, within: bool | None, pending: list[str]) -> tuple[TrustSummary, dict[str, float]]:
        """The verdict of a run between checks whose own accuracy verdict is ``within``, and its scalars."""
        accuracy = AccuracyVerdict(within, "none", float("nan"), float("nan"), _CARRIED_ACCURACY[within])
        verdict = self._verdict(accuracy, pending, None)
        return verdict, self._tagged(verdict.scalars())

    def close(self) -> None:
        """As the fit ends: let go of the working copy and the deletion rows (a later check makes them again)."""
        self._replica = self._deletion = None

    def results_state(self) -> dict[str, Any]:
        """Each check's latest result and its global step, as plain values: what a resumed fit's verdict rests on
        until the check runs again (the schedule goes on over a resume).

        Returns:
            ``{check: {"step": global step, **the result's fields}}`` for each check that has a result.
        """
        return {name: {"step": self._steps[name], **dataclasses.asdict(self._results[name])} for name in self._results}

    def restore_results(self, state: dict[str, Any]) -> None:
        """Take back :meth:`results_state` of the fit this one resumes (the checks this fit makes only).

        Args:
            state: :meth:`results_state` as a checkpoint kept it; an entry whose fields this version's result does not
                take is left out (that check runs again at its turn).
        """
        for name, entry in state.items():
            if name in self.names and name not in self._errors:
                fields = {key: tuple(v) if isinstance(v, list) else v for key, v in entry.items() if key != "step"}
                try:
                    self._results[name], self._steps[name] = _RESULT_TYPES[name](**fields), int(entry["step"])
                except (TypeError, KeyError, ValueError):  # another version's fields: the check runs again instead
                    continue

    def _pending(self, final: bool) -> list[str]:
        """A note for each check that has not run yet in this fit."""
        when = "not run in this fit (the budget did not cover it)" if final else "not run yet (waiting for the budget)"
        return [f"{name}: {when}" for name in self.names if name not in self._results]

    def _tagged(self, scalars: dict[str, float]) -> dict[str, float]:
        return {f"{self.prefix}/{tag}": float(value) for tag, value in scalars.items()}


_RESULT_TYPES: dict[str, Any] = {"sanity": RandomizationCheck, "deletion": DeletionCheck, "stability": StabilityCheck}


def quarter(num_states: int) -> int:
    """States the sanity reference and each noise draw attribute: a quarter of the held-out states, at least 2."""
    return min(num_states, max(2, -(-num_states // 4)))


def _state_means(values: np.ndarray | None, rows_per_state: int) -> np.ndarray | None:
    """``(B * A, ...)`` rows -> ``(B, ...)``: each state's rows averaged."""
    return None if values is None else state_rows(values, rows_per_state).mean(axis=1)
