"""The callback's budget: what it adds to the fit, measured online, and what each run may do to stay within it.

**The measure.** The seconds the training thread spends inside the callback's hooks (the runs, the trust checks, waits
for the logging worker, set-up), plus the CPU time of ``background`` (the callback's: the logging worker's thread
drawing and encoding the pictures; not training's own threads, autograd's on a GPU) beyond its rate before the
callback's first run, over the fit's wall time since set-up: ``ig/overhead``. On a machine whose cores are all busy a
second of a background thread's CPU is a second taken from training; on one with an idle core it counts what it may not
cost (the budget errs on the side of the fit). A run that attributes beside training (the run worker on a core training
leaves idle, a GPU) takes no time in the hooks, yet the steps it overlaps may be slower (shared caches and memory): what
those steps took beyond training's own pace, measured over the steps between such runs, counts in full
(:meth:`Budget.beside_from`, :meth:`Budget.landed`). The times are read from the budget's ``clock`` and ``background``
(a test passes fakes). A resumed fit carries them on (:meth:`Budget.state_dict`).

**The decision** (:meth:`Budget.plan`, at each run the cadence makes). The credit is ``overhead x wall time so far``
less what was spent. A run's cost is predicted from the last runs of its size (a run on ``1/k`` of the held-out
states, ``k`` in :data:`WINDOWS`, costs ``1/k`` of a full one until one is measured). The run takes the largest
share of the states the credit covers; the windows rotate so that every state is attributed over ``k`` runs. Only
when even the smallest does not fit is the run deferred: tried again at the first batch end by which the credit can
have grown to its cost (:meth:`Budget.retry_due`), and the next run says how many were. The final run, the fit's
closing answer, always runs in full with every check due.
The trust checks run at full runs only, each at most every :data:`CHECK_EVERY` runs, when the credit left covers
their last measured cost; overdue by another :data:`CHECK_EVERY` runs, the run waits for a full run with them
(:meth:`Budget.sizes`: window after window, a fit whose budget binds made them at its first and final runs only).
Their first passes (the sanity check's re-initialised copies, the deletion plan, the noise draws) are paid at the
fit's first run and amortised over its expected length, as set-up is: until then the part of them not yet earned
does not count against later runs.

Pure: nothing here reads torch, the trainer or a real clock but through ``clock`` and ``background``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CHECK_EVERY", "WINDOWS", "Budget", "Plan", "default_clock"]

default_clock: Callable[[], float] = time.perf_counter
"""The clock of a :class:`Budget` made without one (the callback's): seconds, monotonic."""

WINDOWS = (1, 2, 4)  # a run attributes all the held-out states, a half, or a quarter of them
CHECK_EVERY = 5  # a trust check is due again this many runs after its last pass


@dataclass(frozen=True)
class Plan:
    """What one run does.

    Attributes:
        windows: ``k``: the run attributes every ``k``-th state (1: all of them).
        window: which of the ``k`` windows (rows ``window::k``).
        checks: the trust checks it makes.
        waiting: the checks due that wait for the budget.
        deferred: the cadence points deferred since the last run.
    """

    windows: int = 1
    window: int = 0
    checks: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    deferred: int = 0

    def rows(self, first: int, count: int) -> list[int] | None:
        """The held-out states (of ``count``) this run attributes: the pictures' ``first``, then its window (or all)."""
        return None if self.windows == 1 else [*range(first), *range(first + self.window, count, self.windows)]

    def note(self, share: float | None) -> str | None:
        """What the budget changed at this run, in one sentence (``None``: nothing)."""
        said = []
        if self.windows > 1:
            said.append(f"attributed window {self.window + 1} of {self.windows} of the held-out states")
        if self.deferred:
            said.append(f"deferred {self.deferred} earlier run{'s' * (self.deferred > 1)} to later steps")
        if self.waiting:
            said.append(f"left {', '.join(self.waiting)} for a later run")
        if not said:
            return None
        within = "" if share is None else f", to keep the callback within overhead={share:.3g} of the fit"  # a resume
        return f"budget: this run {'; '.join(said)}{within}"


class Budget:
    """The callback's cost over one fit and the decisions that keep it within ``share`` (see the module's docstring).

    Args:
        share: the budget, a fraction of the fit's wall time; ``None``: measured, never acted on.
        clock: seconds, monotonic (default :data:`default_clock`, read when the budget is made).
        background: CPU seconds the callback's own threads have used (the callback's: its pictures thread's);
            ``None``: not counted.

    Attributes:
        spent: seconds spent on the training thread inside the callback's hooks.
        once: the part of ``spent`` paid once (set-up, the trust checks' first passes), amortised over the fit.
        reduced, deferred: runs made on a window of the states, cadence points deferred (over the fit).
        last_checks: the run at which each trust check last ran.
    """

    def __init__(
        self,
        share: float | None,
        *,
        clock: Callable[[], float] | None = None,
        background: Callable[[], float] | None = None,
    ) -> None:
        self.share, self.clock = share, default_clock if clock is None else clock
        self.background = background
        self._quiet: tuple[float, float] | None = None  # (background CPU, wall) at start: the rate before any run
        self._rate: tuple[float, float, float] | None = None  # (rate, background CPU, wall) at the first run
        self.spent = self.once = self.earlier = 0.0  # earlier: wall seconds of the fit before a resume
        self.reduced = self.deferred = self.cycle = self.owed = 0
        self._retry_at = 0.0  # the fit's wall seconds before which a deferred run cannot be afforded
        self.last_checks: dict[str, int] = {}
        self.run_costs: dict[int, float] = {}  # windows -> seconds of the last run of that size
        self.check_costs: dict[str, float] = {}
        self.started: float | None = None
        # Training's own pace: (clock, step, spent) where the quiet steps began; seconds a step; a run beside training
        # since (clock, step, spent); a window measured before the pace was (wall, steps), booked once it is.
        self._pace_from: tuple[float, int, float] | None = None
        self._pace: float | None = None
        self._beside: tuple[float, int, float] | None = None
        self._unbooked: list[tuple[float, int]] = []

    def start(self) -> None:
        """The fit starts now (set-up): its wall time counts from here (on from ``earlier`` after a resume)."""
        self.started = self.clock() - self.earlier
        self._quiet = None if self.background is None else (self.background(), self.elapsed())
        self._rate = None

    def beside_from(self, step: int, now: float) -> None:
        """A run starts beside training at the batch end of ``step`` (``now``: the clock as the hook began). The
        steps since the last run beside training (or the first batch end the callback saw) set training's pace."""
        self.settle(step, now)
        self._beside, self._pace_from = (now, step, self.spent), None

    def landed(self, step: int, now: float) -> float:
        """The run beside training landed by the batch end of ``step``: book, and return, what the steps since
        :meth:`beside_from` took beyond training's pace (0 where none was in hand; booked later where the pace is
        not measured yet). The quiet steps count from here."""
        since, self._beside = self._beside, None
        took = None if since is None else self._steps_took(since, step, now)
        if took is not None:
            self._unbooked.append(took)
        lost = self._book()
        self._pace_from = (now, step, self.spent)
        return lost

    def settle(self, step: int, now: float) -> None:
        """Measure training's pace over the quiet steps up to the batch end of ``step`` and book what the runs
        beside training measured before it cost (at a run beside training, and when training ends)."""
        took = None if self._pace_from is None else self._steps_took(self._pace_from, step, now)
        if took is not None:
            self._pace = took[0] / took[1]
            self._book()

    def _book(self) -> float:
        """Book the windows beside training measured so far, once training's pace is known: their seconds lost."""
        if self._pace is None:
            return 0.0
        lost = sum(max(0.0, wall - steps * self._pace) for wall, steps in self._unbooked)
        self.spent, self._unbooked = self.spent + lost, []
        return lost

    def quiet_from(self, step: int, now: float) -> None:
        """The steps from the batch end of ``step`` on are training's own, if nothing else set where they start."""
        if self._pace_from is None and self._beside is None:
            self._pace_from = (now, step, self.spent)

    def _steps_took(self, since: tuple[float, int, float], step: int, now: float) -> tuple[float, int] | None:
        """``(wall seconds, steps)`` from ``since`` to now, the callback's hooks in between left out."""
        clock, first, spent = since
        return None if step <= first else (max(0.0, now - clock - (self.spent - spent)), step - first)

    def elapsed(self) -> float:
        """The fit's wall time so far, in seconds."""
        return 0.0 if self.started is None else max(0.0, self.clock() - self.started)

    def fraction(self) -> float:
        """The share of the fit's wall time so far the callback took (``ig/overhead``)."""
        elapsed = self.elapsed()
        return self.used() / elapsed if elapsed > 0 else 0.0

    def used(self) -> float:
        """Seconds the callback took so far: its hooks' time and its background threads' extra CPU."""
        return self.spent + self.extra()

    def extra(self) -> float:
        """The other threads' CPU seconds beyond their rate before the first run (0 until the first run)."""
        if self.background is None or self._rate is None:
            return 0.0
        rate, cpu, wall = self._rate
        return max(0.0, self.background() - cpu - rate * (self.elapsed() - wall))

    def _first_run(self) -> None:
        """At the first run: the other threads' rate until now is training's own (nothing of the callback ran)."""
        if self.background is not None and self._quiet is not None and self._rate is None:
            cpu, wall = self.background(), self.elapsed()
            self._rate = ((cpu - self._quiet[0]) / max(wall - self._quiet[1], 1e-9), cpu, wall)

    def add(self, seconds: float, *, once: bool = False) -> None:
        """Book ``seconds`` the training thread spent inside a hook (``once``: set-up, amortised over the fit)."""
        self.spent += seconds
        if once:
            self.once += seconds

    # -- what things cost

    def run_cost(self, windows: int) -> float:
        """The predicted seconds of a run on ``1/windows`` of the states (0 before any run: it is measured)."""
        return self.run_costs.get(windows, min((cost * k / windows for k, cost in self.run_costs.items()), default=0.0))

    def ran(self, windows: int, seconds: float) -> None:
        """A run on ``1/windows`` of the states took ``seconds`` of the training thread (its checks excluded)."""
        self.run_costs[windows] = seconds

    def checked(self, name: str, seconds: float, run: int, *, first: bool) -> None:
        """Check ``name`` ran at run ``run`` and took ``seconds`` (its first pass in this fit if ``first``)."""
        self.last_checks[name] = run
        if first:  # the one-time pieces with it: what a later pass costs is measured at the next
            self.once += seconds
        else:
            self.check_costs[name] = seconds

    def due(self, run: int, names: Sequence[str], *, final: bool = False) -> list[str]:
        """The checks among ``names`` due at run ``run``: never made, or made ``CHECK_EVERY`` runs ago (all at the
        final run)."""
        return [n for n in names if final or n not in self.last_checks or run - self.last_checks[n] >= CHECK_EVERY]

    # -- the decision

    def retry_due(self) -> bool:
        """Whether a deferred run is owed and may be tried now: not before the credit can have grown to its cost (at
        most ``share`` a second, plus the other threads' rate while their extra CPU drains), so the batch ends in
        between skip the plan."""
        # no budget (DDP): never, since each rank's own clock would pick its own batch end for the retry's collective
        # within a nanosecond: a resumed fit's clock sums round otherwise, and a tie would be decided by the rounding
        return self.share is not None and self.owed > 0 and self.elapsed() >= self._retry_at - 1e-9

    def credit(self, progress: float | None) -> float:
        """Seconds the callback may still spend now: ``share x wall time`` less what was spent, the first passes'
        part not yet earned (``progress``: the fraction of the fit done) left out."""
        share = 0.0 if self.share is None else self.share
        unearned = self.once * (1.0 - min(1.0, progress)) if progress is not None and progress > 0 else self.once
        return share * self.elapsed() - (self.used() - unearned)

    def sizes(self, run: int, due: Sequence[str], *, can_window: bool = True) -> tuple[tuple[int, ...], float]:
        """The windows run ``run`` may take, largest share first, and the checks' cost it saves up for: checks due
        and overdue by another ``CHECK_EVERY`` runs want a full run with them (window after window, a fit whose
        budget binds made them at its first and final runs only)."""
        starved = bool(due) and run - min(self.last_checks.get(name, run) for name in due) >= 2 * CHECK_EVERY
        need = sum(self.check_costs.get(name, 0.0) for name in due) if starved else 0.0
        return (WINDOWS if can_window and not starved else WINDOWS[:1]), need

    def plan(
        self,
        run: int,
        checks: Sequence[str],
        *,
        progress: float | None = None,
        final: bool = False,
        can_window: bool = True,
        retry: bool = False,
    ) -> Plan | None:
        """What run ``run`` does, or ``None``: deferred (counted). The final run, and the run at which no check has
        run yet, are full and make every check due (the first passes are amortised over the fit).

        Args:
            run: the run's index in the fit.
            checks: the trust checks this fit makes.
            progress: the fraction of the fit done (by ``max_steps`` or ``max_epochs``), or ``None`` when unknown.
            final: the run when training ends.
            can_window: a run may attribute a window of the states (one process, one row per state).
            retry: a deferred run tried again (not a new cadence point: not counted again).
        """
        self._first_run()
        due = self.due(run, checks, final=final)
        deferred, self.owed = self.owed, 0
        if self.share is None or final or (due and not self.last_checks):  # no budget, the fit's answer, first checks
            return Plan(checks=tuple(due), deferred=deferred)
        credit = self.credit(progress)
        sizes, need = self.sizes(run, due, can_window=can_window)
        if (windows := next((k for k in sizes if self.run_cost(k) + need <= credit), None)) is None:
            self.owed, self.deferred = deferred + (not retry), self.deferred + (not retry)
            speed = self.share + (0.0 if self._rate is None else self._rate[0])
            shortfall = self.run_cost(sizes[-1]) + need - credit
            self._retry_at = self.elapsed() + shortfall / speed if speed > 0 else math.inf
            return None
        credit -= self.run_cost(windows)
        chosen: list[str] = []
        for name in due if windows == 1 else ():
            if (cost := self.check_costs.get(name, 0.0)) <= credit:
                chosen.append(name)
                credit -= cost
        window = 0
        if windows > 1:
            window, self.cycle, self.reduced = self.cycle % windows, self.cycle + 1, self.reduced + 1
        waiting = tuple(name for name in due if name not in chosen)
        return Plan(windows, window, tuple(chosen), waiting, deferred)

    # -- a resumed fit

    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit continues from: the measure, the counts, the rotation and the checks' schedule."""
        return {
            "elapsed": self.elapsed(),
            "spent": self.used(),  # the background's extra folded in: a resumed fit measures its rate again
            "once": self.once,
            "reduced": self.reduced,
            "deferred": self.deferred,
            "cycle": self.cycle,
            "owed": self.owed,
            "retry_at": self._retry_at,
            "last_checks": dict(self.last_checks),
            "run_costs": {str(k): v for k, v in self.run_costs.items()},
            "check_costs": dict(self.check_costs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (the wall time counts on from where it stopped, at :meth:`start`)."""
        self.earlier, self.spent, self.once = float(state["elapsed"]), float(state["spent"]), float(state["once"])
        self.reduced, self.deferred = int(state["reduced"]), int(state["deferred"])
        self.cycle, self.owed = int(state["cycle"]), int(state["owed"])
        self._retry_at = float(state.get("retry_at", 0.0))  # absent from an earlier version's checkpoint: at once
        self.last_checks = {str(k): int(v) for k, v in state["last_checks"].items()}
        self.run_costs = {int(k): float(v) for k, v in state["run_costs"].items()}
        self.check_costs = {str(k): float(v) for k, v in state["check_costs"].items()}
