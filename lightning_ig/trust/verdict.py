"""One verdict on a run's explanation: the accuracy of its numbers and the checks that can fail, and why not.

:func:`trust_summary` judges what it is given: the run's accuracy verdict (``Completeness.accuracy``: the engine's
figures against sqrt(2) x tol; one that could not be computed is not a pass) and the latest result of each check
(:mod:`~lightning_ig.trust.sanity`, :mod:`~lightning_ig.trust.faithfulness`, :mod:`~lightning_ig.trust.stability`;
one that does not apply is not judged). How the status follows is :class:`TrustSummary`'s. A check that has not run
yet in this fit is a note (``pending``), so the verdict stays ``"unresolved"`` until every check has spoken once. A
run that carries the verdict of the last run that checked (:attr:`~lightning_ig.callback.monitor.TrustMonitor.carried`)
reads its text without running this module's code.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lightning_ig.run.statistics import AccuracyVerdict
from lightning_ig.trust.faithfulness import DeletionCheck
from lightning_ig.trust.sanity import RandomizationCheck
from lightning_ig.trust.stability import StabilityCheck
from lightning_ig.vocabulary import shown

__all__ = ["TrustSummary", "trust_summary"]


@dataclass(frozen=True)
class TrustSummary:
    """One verdict on a run's explanation.

    ``status`` is ``"failed"`` when a figure failed (``reasons`` says which and by how much), ``"unresolved"`` when
    none failed but a check has not run yet (``notes``) or nothing was judged (a check that could not decide, the
    sanity check over a handful of units, is a note and leaves the status to the others), and ``"passed"`` otherwise.

    ``status``, ``headline()`` and ``lines()`` are written when the verdict is made (``headline`` and ``lines`` are
    C-level callables returning that text): reading them runs no code of this module.

    Attributes:
        passed: every figure given passed, and at least one was given.
        reasons: one sentence per failure: which figure or check, its value, its bound, by how much
            (``ig/trust/status`` is -1 when there is one).
        notes: what a passed figure cannot say here (a sanity check on a handful of units; a check not run yet).
        checks: how many figures were judged.
        accuracy, randomization, deletion, stability: what was judged (``None``: not given).
        steps: the global step each check's result comes from (a check runs every few runs; the verdict uses its
            latest result).
        upcoming: when the next checks run (a line of the text), or ``None``.
        status: ``"passed"``, ``"failed"`` or ``"unresolved"``.
        headline: ``() -> str``: one line: ``passed (4 figures judged)``, ``unresolved: <the first note>`` or
            ``failed: <the first reason> (+ n more)``.
        lines: ``() -> tuple[str, ...]``: the verdict as markdown, for the ``<prefix>/report`` text: the status,
            each failure, each figure, the notes, the next checks.
    """

    passed: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...]
    checks: int
    accuracy: AccuracyVerdict | None = None
    randomization: RandomizationCheck | None = None
    deletion: DeletionCheck | None = None
    stability: StabilityCheck | None = None
    steps: tuple[tuple[str, int], ...] = ()
    upcoming: str | None = None
    pending: tuple[str, ...] = ()
    status: str = field(init=False)
    headline: Callable[[], str] = field(init=False, repr=False, compare=False)
    lines: Callable[[], tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Only a check that has not run yet keeps the verdict open; a check that ran and could not decide (a sanity
        # check on too few units) is said in the notes and judged like a check that does not apply
        status = "failed" if self.reasons else "passed" if self.passed and not self.pending else "unresolved"
        object.__setattr__(self, "status", status)
        # functools.partial over a builtin: calling it returns the text without entering Python code
        object.__setattr__(self, "headline", functools.partial(str, self._headline()))
        object.__setattr__(self, "lines", functools.partial(tuple, self._lines()))

    def scalars(self) -> dict[str, float]:
        """Under the callback's prefix: ``trust/status``, 1 passed, 0 unresolved, -1 failed (why: ``lines()``)."""
        return {"trust/status": {"passed": 1.0, "unresolved": 0.0, "failed": -1.0}[self.status]}

    def _headline(self) -> str:
        judged = f"{self.checks} figure{'s' * (self.checks != 1)} judged"
        if self.status == "passed":
            return f"passed ({judged})" if not self.notes else f"passed ({judged}; note: {self.notes[0]})"
        if self.status == "unresolved":
            why = self.notes[0] if self.notes else "nothing was judged: no accuracy figure and no check result"
            return f"unresolved ({judged}, none failed): {why}"
        more = f" (+ {len(self.reasons) - 1} more)" if len(self.reasons) > 1 else ""
        return f"failed: {self.reasons[0]}{more}"

    def _lines(self) -> tuple[str, ...]:
        steps = dict(self.steps)
        lines = [f"**Trust: {self.status}**" + ("." if self.status == "passed" else ":")]
        if self.status == "unresolved" and not self.notes:
            lines.append("- nothing was judged: no accuracy figure and no check result")
        lines += [f"- {reason}" for reason in self.reasons]
        if self.accuracy is not None and self.accuracy.within:  # a failed one is among the reasons
            lines.append(f"- accuracy: {self.accuracy.reason} (passed)")
        if (sanity := self.randomization) is not None:
            lines.append(
                f"- sanity (step {steps.get('sanity', '?')}): rank correlation with a re-initialised copy "
                f"{sanity.randomization_rank_correlation:.3f}, two re-initialised copies "
                f"{sanity.copy_rank_correlation:.3f}, bar {sanity.threshold:.3f} over {sanity.num_units} units"
                f"{'' if sanity.resolved else ' (a ceiling: too few to resolve)'} "
                f"({'passed' if sanity.passed else 'failed'})"
            )
        if (deletion := self.deletion) is not None:
            lines.append(
                f"- faithfulness (step {steps.get('deletion', '?')}): deletion AUC {deletion.deletion_auc:.3f}, "
                f"random order {deletion.deletion_auc_random:.3f} ({'passed' if deletion.passed else 'failed'})"
            )
        if (stability := self.stability) is not None and stability.applicable:
            lines.append(
                f"- stability (step {steps.get('stability', '?')}): rank correlation under exploration noise "
                f"{stability.noise_rank_correlation:.3f} ({'passed' if stability.passed else 'failed'})"
            )
        lines += [f"- note: {note}" for note in self.notes]
        lines += [] if self.upcoming is None else [f"- {self.upcoming}"]
        return tuple(lines)


def trust_summary(
    *,
    accuracy: AccuracyVerdict | None = None,
    randomization: RandomizationCheck | None = None,
    deletion: DeletionCheck | None = None,
    stability: StabilityCheck | None = None,
    errors: Sequence[str] = (),
    steps: Sequence[tuple[str, int]] = (),
    pending: Sequence[str] = (),
    upcoming: str | None = None,
) -> TrustSummary:
    """Join the accuracy verdict and the checks into ``passed`` and its ``reasons``.

    Args:
        accuracy: the run's accuracy verdict (``Completeness.accuracy``, the engine's ``AccuracyVerdict``); ``None``:
            not judged.
        randomization, deletion, stability: the checks' latest results; ``None``: not judged.
        errors: checks that could not run, one sentence each (each is a reason: a check that did not run vouches
            for nothing).
        steps: ``(check, global step)`` of each result, for the text.
        pending: the checks that have not run yet, one sentence each saying when they will (each is a note: the
            verdict cannot pass before every check has run once).
        upcoming: when the next checks run, for the text.

    Returns:
        A :class:`TrustSummary`.

    Raises:
        TypeError: a check of the wrong kind, an accuracy verdict without its fields, ``errors`` or ``pending`` a str.
    """
    if isinstance(errors, str) or isinstance(pending, str):  # a str is a sequence of characters, not of sentences
        raise TypeError("errors and pending must be lists of sentences, not one string: wrap it as [text]")
    reasons, notes, checks = [], [], 0
    if accuracy is not None:
        if not all(hasattr(accuracy, name) for name in ("within", "figure", "value", "threshold", "reason")):
            raise TypeError(f"accuracy must be an accuracy verdict (within, figure, ...), got {shown(accuracy)}")
        checks += 1
        if accuracy.within is None:
            reasons.append(f"accuracy: could not be checked: {accuracy.reason}")
        elif not accuracy.within:
            by = accuracy.value - accuracy.threshold
            excess = f" (by {by:.3g})" if math.isfinite(by) else ""
            reasons.append(f"accuracy: {accuracy.reason}{excess}")
    for name, check, kind in (
        ("randomization", randomization, RandomizationCheck),
        ("deletion", deletion, DeletionCheck),
        ("stability", stability, StabilityCheck),
    ):
        if check is None:
            continue
        if not isinstance(check, kind):
            raise TypeError(f"{name} must be a {kind.__name__} or None, got {type(check).__name__}")
        if check.passed is None:  # a stability check that does not apply
            continue
        note = getattr(check, "note", None)
        checks += note is None or not check.passed  # one that could not decide judges nothing: the others decide
        if check.reason is not None:
            reasons.append(check.reason)
        if note is not None and check.passed:  # what a pass cannot say: nothing to say of a failure
            notes.append(note)
    reasons += [str(error) for error in errors]
    checks += len(errors)
    notes += [str(line) for line in pending]
    return TrustSummary(
        pending=tuple(str(line) for line in pending),
        passed=checks > 0 and not reasons,
        reasons=tuple(reasons),
        notes=tuple(notes),
        checks=checks,
        accuracy=accuracy,
        randomization=randomization,
        deletion=deletion,
        stability=stability,
        steps=tuple(steps),
        upcoming=upcoming,
    )
