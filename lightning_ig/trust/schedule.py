"""When the callback's trust checks run: what each costs, in IG runs, and a budget that accrues with every run.

**The cost model** (:class:`CheckCosts`). Each piece's cost is known from the fit's sizes and settings before it
runs, never read from a clock: the rows of forward and gradient work it does over the rows of one callback IG run
(``states x n_steps`` gradient rows, a gradient row counted as ``GRADIENT_ROW`` forward rows), plus what does not
scale with rows (Python, launches, the one host read: :class:`FixedCosts`, per kind of device). The once-per-fit
pieces (:data:`PIECES`: the model's working copy, :mod:`~lightning_ig.trust.replica`; the deletion check's
fixed rows; the capture of the copy's IG in a CUDA graph; the sanity check's re-initialised copies) are charged to
the first check that needs them.

**The schedule** (:class:`Schedule`). The checks may use ``budget`` (0.2) of the IG time: the budget accrues
``budget`` IG runs with every run, and a check that is due (its cadence: :class:`TrustChecks`) runs when what is
left covers its cost. So at every run, the checks' cumulative cost is at most ``budget`` times the runs so far, in
the model's units: at 10 runs as at 1000. The checks due are served oldest first; one the budget cannot cover yet
holds back half of what accrues while it waits (at most the costs it waits for), so that cheaper checks due after
it run on the other half and cannot starve it. Decisions read nothing but the runs, the costs and the checks made,
so two identical fits make the same checks at the same runs, on any number of ranks, and the run at which the next
check is due is known in advance (:meth:`Schedule.next_run`): the callback compares it with its run count and
enters this package only then.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from lightning_ig.vocabulary import check_int, check_positive_int, check_real

__all__ = [
    "AUTO_STEPS",
    "CHECKS",
    "DELETION_ORDERS",
    "EAGER",
    "GRADIENT_ROW",
    "PIECES",
    "REPLAYED",
    "Booked",
    "CheckCosts",
    "FixedCosts",
    "Schedule",
    "TrustChecks",
    "deletion_rows",
]

CHECKS = ("sanity", "deletion", "stability")
"""The checks, in the order a run makes them when they fall due together."""

GRADIENT_ROW = 3.0  # a gradient row (forward, then backward to the inputs) in forward rows
AUTO_STEPS = 16  # n_steps="auto" starts at 16 steps a state: the least an IG run does
DELETION_ORDERS = 3  # the attribution order for either sign of F(x) - F(b), and one random order


@dataclass(frozen=True)
class TrustChecks:
    """When the callback's trust checks are due, and how much of the IG time they may use.

    The callback's ``checks_every_n_runs=N`` is :meth:`TrustChecks.every` (N): these defaults at ``N = 5``. A check is
    due every so many runs from the start of a fit (and at the final run), and runs when the budget covers it
    (:class:`Schedule`).

    Attributes:
        sanity_every_n_runs: the randomisation sanity check every this many runs (default 5; ``None``: never).
            Once per fit it needs the reference: ``copies`` IG passes of re-initialised copies on a quarter of the
            states; afterwards it is a few rank correlations on the host.
        deletion_every_n_runs: the deletion check every this many runs (default 5; ``None``: never): one batched
            forward of ``2 + 3 (K - 1)`` rows a state, ``K <= 16`` fractions.
        stability_every_n_runs: the stability check every this many runs (default 20; ``None``: never): ``draws``
            IG passes on a quarter of the states, on NoisyNet models only.
        budget: the share of the IG time the checks may use (default 0.2), in the cost model's IG runs, at every
            run; ``None``: no limit (every check at its cadence).
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
        IG pass per draw on a quarter of the states) every ``4 * runs``, within the default budget."""
        runs = check_positive_int(runs, "checks_every_n_runs", example=5)
        return cls(sanity_every_n_runs=runs, deletion_every_n_runs=runs, stability_every_n_runs=4 * runs)

    def periods(self) -> dict[str, int]:
        """Each check's cadence in runs, the checks switched off (``None``) left out."""
        periods = {
            "sanity": self.sanity_every_n_runs,
            "deletion": self.deletion_every_n_runs,
            "stability": self.stability_every_n_runs,
        }
        return {name: every for name, every in periods.items() if every is not None}

    def quarter(self, num_states: int) -> int:
        """States the reference and each noise draw attribute: a quarter of the held-out states, at least 2."""
        return min(num_states, max(2, math.ceil(num_states / 4)))


@dataclass(frozen=True)
class FixedCosts:
    """What does not scale with rows, in IG runs, on one kind of device (:data:`EAGER`, :data:`REPLAYED`).

    Attributes:
        host: one check's host work: its Python, its launches, its one host read.
        copy: the model's working copy (a deep copy of the module tree), once per fit.
        per_pass: one IG pass of the working copy beyond its rows: the share of an IG run that does not shrink with
            the states (a pass on ``S`` of ``B`` states costs ``S/B + per_pass (1 - S/B)``).
        capture: the working copy's first IG pass beyond a later one, once per fit: its capture in a CUDA graph
            (three eager passes) where the callback's IG replays one, its engine's set-up where both run eagerly.
    """

    host: float
    copy: float
    per_pass: float
    capture: float


EAGER = FixedCosts(host=0.12, copy=0.3, per_pass=0.5, capture=0.5)
"""Where the callback's IG runs eagerly (the CPU): a pass of the copy is an IG run on fewer states. Each constant is
at or above what ``benchmarks/bench_checks.py`` measured on a CPU (``docs/trust.md``)."""

REPLAYED = FixedCosts(host=0.6, copy=1.5, per_pass=0.3, capture=9.0)
"""Where the callback's IG replays a CUDA graph: the checks are bound by their launches and Python. Each constant is
at or above the largest cost ``benchmarks/bench_checks.py`` measured on a GPU (``docs/trust.md``), so that the
budget holds where a piece costs what it cost there."""


def deletion_rows(num_units: int, *, fractions: int = 16) -> int:
    """Forward rows a state of the deletion check: the state, its baseline, and ``K - 1`` inner fractions in each
    of :data:`DELETION_ORDERS` orders (``K = min(fractions, units)``, at least 2)."""
    steps = max(2, min(fractions, num_units))
    return 2 + DELETION_ORDERS * (steps - 1)


@dataclass(frozen=True)
class CheckCosts:
    """What each piece of the checks costs, in IG runs of the callback.

    Attributes:
        deletion, sanity, stability: a check, once the pieces it needs are made.
        copy: the model's working copy (every check computes on it), once per fit.
        plan: the deletion check's fixed rows (its states, baselines and random orders), once per fit.
        capture: the working copy's first IG pass beyond a later one (on a GPU its capture in a CUDA graph), once
            per fit: for the sanity reference and the stability check.
        reference: the sanity check's re-initialised copies (their IG passes), once per fit.
    """

    deletion: float
    sanity: float
    stability: float
    copy: float
    plan: float
    capture: float
    reference: float

    @classmethod
    def estimate(
        cls,
        options: TrustChecks,
        *,
        num_states: int,
        num_units: int,
        n_steps: int | str,
        replays: bool,
        fractions: int = 16,
    ) -> CheckCosts:
        """The costs at a fit's sizes.

        Args:
            options: the cadence (``copies``, ``draws`` and the quarter of the states they attribute).
            num_states: the held-out states ``B`` (all of them: the checks run on the gathered result).
            num_units: the units compared (features, or groups).
            n_steps: the callback's ``n_steps`` (``"auto"`` counts as its 16 starting steps: the least a run does).
            replays: the callback's IG replays a CUDA graph (:data:`REPLAYED`), else :data:`EAGER`.
            fractions: the deletion check's ``K`` at most.
        """
        fixed = REPLAYED if replays else EAGER
        steps = AUTO_STEPS if isinstance(n_steps, str) else int(n_steps)
        run_rows = GRADIENT_ROW * steps + 2  # a state's rows in an IG run: the path, and its two ends
        share = options.quarter(num_states) / num_states
        one_pass = share + fixed.per_pass * (1 - share)
        return cls(
            deletion=fixed.host + deletion_rows(num_units, fractions=fractions) / run_rows,
            sanity=fixed.host,
            stability=fixed.host + options.draws * one_pass,
            copy=fixed.copy,
            plan=fixed.host,
            capture=fixed.capture,
            reference=fixed.host + options.copies * one_pass,
        )

    def of(self, name: str, made: Iterable[str] = ()) -> float:
        """The cost of check ``name``, with the once-per-fit pieces not in ``made`` that it needs."""
        return _cost(self, name, PIECES[name] - frozenset(made))


@functools.lru_cache(maxsize=1024)  # the schedule asks for the same few sums at every run it tries
def _cost(costs: CheckCosts, name: str, missing: frozenset[str]) -> float:
    parts = {"deletion": costs.deletion, "sanity": costs.sanity, "stability": costs.stability, "copy": costs.copy}
    parts.update(plan=costs.plan, capture=costs.capture, reference=costs.reference)
    return parts[name] + sum(parts[piece] for piece in sorted(missing))


PIECES = {
    "deletion": frozenset({"copy", "plan"}),
    "sanity": frozenset({"copy", "capture", "reference"}),
    "stability": frozenset({"copy", "capture"}),
}
"""The once-per-fit pieces each check needs (made by the first check that does)."""


@dataclass
class Booked:
    """What a schedule has booked: the cost so far, each check's last run and how long it had been due then, the
    once-per-fit pieces made."""

    spent: float = 0.0
    last: dict[str, int] = field(default_factory=dict)
    due_since: dict[str, int] = field(default_factory=dict)  # when each check's last run had fallen due
    made: frozenset[str] = frozenset()

    def copy(self) -> Booked:
        return Booked(self.spent, dict(self.last), dict(self.due_since), self.made)


class Schedule:
    """The checks of one fit: which run at each run, within the budget (see the module's docstring).

    Runs are counted from the fit's first run (0). :meth:`decide` says what runs; :meth:`record` books it;
    :meth:`next_run` is the next run at which a check will run (the final run aside, where every check is due).

    **The rule at a run.** The credit is ``budget x runs so far - spent``. The checks due are taken oldest first (the
    cheaper first among equals); each runs if the credit, less what the checks before it that the credit could not
    cover hold back, covers its cost. A check that waits holds back half of what accrued since it fell due, or since
    a check ahead of it last ran if that was later (at most the costs it waits for): cheaper checks due after it
    run on the other half, and it runs within two of its costs' worth of runs.

    Attributes:
        booked: what has been booked (:class:`Booked`).
    """

    def __init__(self, options: TrustChecks, costs: CheckCosts, checks: Iterable[str] = CHECKS) -> None:
        self.options, self.costs = options, costs
        wanted = set(checks)
        self.periods = {name: every for name, every in options.periods().items() if name in wanted}
        self.booked = Booked()

    @property
    def spent(self) -> float:
        """The cost booked so far, in IG runs."""
        return self.booked.spent

    @property
    def last(self) -> dict[str, int]:
        """Each check's last run."""
        return self.booked.last

    @property
    def made(self) -> frozenset[str]:
        """The once-per-fit pieces made (:data:`PIECES`)."""
        return self.booked.made

    def drop(self, name: str) -> None:
        """Never schedule ``name`` again (it could not run)."""
        self.periods.pop(name, None)

    def decide(self, run: int, *, final: bool = False) -> tuple[str, ...]:
        """The checks that run at run ``run``, in the order they run; changes nothing."""
        return self._decide(run, self.booked, final)

    def record(self, run: int, ran: Iterable[str]) -> None:
        """Book the checks made at run ``run`` (as :meth:`decide` said), in order."""
        self._book(run, ran, self.booked)

    def next_run(self, after: int, *, limit: int = 1_000_000) -> int | None:
        """The first run after ``after`` at which a check runs (``None``: none is scheduled)."""
        return self._next(after, self.booked, limit)

    def plan(self, after: int, *, limit: int = 100_000) -> dict[str, int]:
        """The run at which each check that has not run yet will first run, if the fit goes on that long (the
        schedule simulated from ``after`` on, event by event)."""
        booked = self.booked.copy()
        waiting = {name for name in self.periods if name not in booked.last}
        planned: dict[str, int] = {}
        run = self._next(after, booked, limit) if waiting else None
        while run is not None and run <= after + limit:
            ran = self._decide(run, booked, False)
            self._book(run, ran, booked)
            for name in waiting.intersection(ran):
                waiting.discard(name)
                planned[name] = run
            run = self._next(run, booked, after + limit - run) if waiting else None
        return planned

    # -- the rule

    def _since(self, name: str, booked: Booked) -> int:
        """The run from which ``name`` is due: the fit's first run, then its period after each run of it."""
        return booked.last[name] + self.periods[name] if name in booked.last else 0

    def _book(self, run: int, ran: Iterable[str], booked: Booked) -> None:
        for name in ran:
            booked.due_since[name] = min(run, self._since(name, booked))
            booked.spent += self.costs.of(name, booked.made)
            booked.made |= PIECES[name]
            booked.last[name] = run

    def _decide(self, run: int, booked: Booked, final: bool) -> tuple[str, ...]:
        due = sorted(
            (run if final else self._since(name, booked), self.costs.of(name, booked.made), name)
            for name in self.periods
            if final or self._since(name, booked) <= run
        )
        budget = self.options.budget
        if budget is None:
            return tuple(name for _, _, name in due)
        credit = budget * (run + 1) - booked.spent
        chosen: list[str] = []
        made = booked.made
        waiting_cost, hold_from = 0.0, None  # what the checks the credit cannot cover wait for; since when it accrues
        for since, _, name in due:
            cost = self.costs.of(name, made)  # a piece made by a check before it at this run is not paid twice
            held = 0.0 if hold_from is None else min(waiting_cost, budget / 2 * (run - hold_from + 1))
            if credit - held >= cost:
                chosen.append(name)
                credit -= cost
                made = made | PIECES[name]
            else:
                waiting_cost += cost
                if hold_from is None:  # the hold restarts where a check ahead of this one last ran
                    ahead = [ran for other, ran in booked.last.items() if booked.due_since[other] <= since]
                    hold_from = max([since, *(ran + 1 for ran in ahead)])
        return tuple(chosen)

    def _next(self, after: int, booked: Booked, limit: int) -> int | None:
        if not self.periods:
            return None
        run = after + 1
        while run <= after + limit:
            if self._decide(run, booked, False):
                return run
            run = max(run + 1, self._skip(run, booked))
        return None

    def _skip(self, run: int, booked: Booked) -> int:
        """A run no later than the next at which a check can run, from ``run`` where none does: the next check falling
        due, or the first run at which the budget could cover the cheapest check due (a long wait for an expensive
        one is jumped, not tried run by run)."""
        budget = self.options.budget
        upcoming = [self._since(name, booked) for name in self.periods if self._since(name, booked) > run]
        if budget is None:
            return min(upcoming, default=run + 1)
        due = [self.costs.of(name, booked.made) for name in self.periods if self._since(name, booked) <= run]
        if due:  # before this run the credit is below the cheapest cost, whatever is held back
            upcoming.append(math.floor((min(due) + booked.spent) / budget) - 1)
        return min(upcoming, default=run + 1)
