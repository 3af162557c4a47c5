"""What one IG run sends to the loggers: scalars to every logger; TensorBoard's extras; the pictures where kept.

The callback's :class:`RunOutputs` does it run after run (its docstring says what goes to which logger, on which
thread). Every tag is listed, once, in ``docs/tensorboard-tags.md``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.run.host_result import HostResult
from lightning_ig.run.summary import RunSummary, Units
from lightning_ig.views.loggers.sinks import MlflowSink, mlflow_metrics
from lightning_ig.views.loggers.worker import PictureWriter, add_picture, add_run
from lightning_ig.views.tags import PICTURE_TAGS, PICTURES, TagNames
from lightning_ig.views.text import report_markdown

__all__ = ["RunOutputs", "informative_scalars", "pictures_due", "scalar_metrics"]


def _one_by_one(summary: RunSummary, tags: TagNames) -> list[tuple[Units, str]]:
    """The units logged one by one, with their tags' part: the logged features, the groups where few enough."""
    both = ((summary.logged_features, ""), (summary.groups if tags.group_units else None, "group/"))
    return [(units, group) for units, group in both if units is not None]


def scalar_metrics(summary: RunSummary, tags: TagNames) -> dict[str, float]:
    """The scalars of one run, keyed by tag: the accuracy figures, per feature and group, concentration, drift,
    actions, time, the trust checks'. The accuracy figures are the two the verdict rests on, never the old
    ratio ``|delta| / |dF|`` (the JSON report's ``worst_relative_error``). Every scalar is here;
    :func:`informative_scalars` leaves out those that carry nothing.
    """
    prefix, completeness = tags.prefix, summary.completeness
    metrics = {
        f"{prefix}/completeness/worst_attribution_error": completeness.worst_attribution_error,
        f"{prefix}/completeness/worst_mass_relative_error": completeness.worst_mass_relative_error,
        f"{prefix}/completeness/mean_abs_error": completeness.mean_abs_error,
        f"{prefix}/completeness/non_finite_states": float(completeness.num_non_finite),
        f"{prefix}/completeness/degenerate_states": float(completeness.num_degenerate),
        f"{prefix}/completeness/near_baseline_states": float(completeness.num_near_baseline),
    }
    for units, group in _one_by_one(summary, tags):
        labels = tags.labels[units.kind]
        for quantity in ("mean_abs", "mean_signed"):
            values = getattr(units.moments, quantity).tolist()
            metrics.update(zip((f"{prefix}/{group}{quantity}/{label}" for label in labels), values))
    metrics.update((f"{prefix}/concentration/{name}", value) for name, value in summary.concentration.items())
    metrics.update((f"{prefix}/drift/{name}", value) for name, value in summary.moving_drift.items())
    metrics.update(summary.trust_scalars)  # already tagged by the callback's trust checks
    if (actions := summary.actions) is not None and tags.action_labels is not None:
        # <prefix>/action/<action>/greedy_states and, when few enough, each action's mean |attr| per unit
        labels = tags.labels[summary.units.kind]
        quantity = "group/mean_abs" if summary.units.kind == "groups" else "mean_abs"
        for index, action in enumerate(tags.action_labels):
            metrics[f"{prefix}/action/{action}/greedy_states"] = float(actions.greedy_counts[index])
            if tags.action_units:
                means = actions.moments[index].mean_abs.tolist()
                metrics.update(zip((f"{prefix}/action/{action}/{quantity}/{label}" for label in labels), means))
    metrics[f"{prefix}/time_ms"] = summary.time_ms
    return {tag: float(value) for tag, value in metrics.items()}


def informative_scalars(
    metrics: Mapping[str, float], tags: TagNames, ever_non_zero: Iterable[str] = ()
) -> tuple[dict[str, float], set[str]]:
    """The scalars of one run worth a card, and the tags that have carried something so far.

    Time Series shows the cards in one list sorted by tag: a card that carries nothing pushes those that do down.
    Left out: the top-10% concentration where it equals the top-1% one (at most 10 features); the counts of
    :data:`~lightning_ig.views.tags.COUNT_TAGS` until they are first non-zero; the drift measures until the ranking
    first moves (below 1). From then on a tag is logged every run, so its curve has no gaps.

    Args:
        metrics: the run's scalars by tag (:func:`scalar_metrics`).
        tags: the callback's tags.
        ever_non_zero: the tags that carried something in an earlier run (the callback keeps them in its
            ``state_dict``, so a resumed fit goes on logging them).

    Returns:
        ``(metrics to log, ever_non_zero updated)``.

    Example::

        >>> tags = TagNames("ig", ["x"], None, num_features=1)
        >>> informative_scalars({"ig/completeness/non_finite_states": 0.0, "ig/time_ms": 3.0}, tags)
        ({'ig/time_ms': 3.0}, set())
    """
    seen, drift = set(ever_non_zero), f"{tags.prefix}/drift/"
    kept: dict[str, float] = {}
    for tag, value in metrics.items():
        moved = tag.startswith(drift) and value < 1.0  # a ranking that never moved is a flat line at 1
        if (tag in tags.count_tags and value != 0 and not math.isnan(value)) or moved:
            seen.add(tag)
        if (tag in tags.count_tags or tag.startswith(drift)) and tag not in seen:
            continue
        if tag != tags.concentration_twin:
            kept[tag] = value
    return kept, seen


def pictures_due(
    cadences: Mapping[str, int | None],
    drawn_steps: Mapping[str, int | None],
    summary: RunSummary,
    *,
    final: bool,
    verdict_due: bool = False,
) -> dict[str, bool]:
    """Which kinds of picture (of :data:`~lightning_ig.views.tags.PICTURES`) a run draws.

    Each kind is drawn at the first run, then every ``cadences[kind]`` runs (``None``: never), and at the end of
    training (``final``), never twice at one step (``drawn_steps[kind]``); the verdict card also off its cadence
    (``verdict_due``: :class:`RunOutputs` sets it at a run that failed or whose verdict differs from the last card's),
    so that no failure goes unseen. Kinds that share a
    cadence are spread evenly over it in :data:`~lightning_ig.views.tags.PICTURES`' order (three at 10: runs 0, 10,
    ...; 3, 13, ...; 6, 16, ...), so that a run costs about what one picture costs. Other kinds are ignored.
    """
    kinds = {kind: cadences[kind] for kind in PICTURES if kind in cadences}
    offsets: dict[str, int] = {}
    for every in {every for every in kinds.values() if every is not None}:
        sharing = [kind for kind, other in kinds.items() if other == every]
        offsets.update({kind: position * every // len(sharing) for position, kind in enumerate(sharing)})
    index = summary.run_index
    return {
        kind: every is not None
        and (final or index == 0 or (index - offsets[kind]) % every == 0 or (kind == "verdict" and verdict_due))
        and drawn_steps.get(kind) != summary.step
        for kind, every in kinds.items()
    }


@dataclass(frozen=True)
class _RunJob:
    """What the logging worker writes for one run (made on the training thread; nothing in it changes later)."""

    summary: RunSummary
    due: dict[str, bool]  # the kinds of picture drawn
    host: HostResult | None  # the last run's host result, for the saliency grid
    history: list[Mapping[str, Any]]
    inputs: Any
    boards: list[tuple[Any, Any]]  # each TensorBoard writer, and its logger when the worker logs its scalars
    scalars: dict[str, float]
    histograms: list[tuple[str, np.ndarray]]
    text: bool  # the report text (a run, not the pictures left at the end of training)
    sinks: tuple[Any, Any] | None  # the sinks' table and report (with the verdict card), when there are sinks


class RunOutputs:
    """What one callback's runs send to the trainer's loggers, run after run.

    Every run: the informative scalars (:func:`informative_scalars`) to every logger; to each ``TensorBoardLogger``
    the attribution histograms and the ``<prefix>/report`` text. The pictures when :func:`pictures_due` says so, to
    TensorBoard and to the picture sinks (``WandbLogger``, ``MLFlowLogger``:
    :func:`~lightning_ig.views.loggers.sinks.picture_sinks`), which also get the table of units and the JSON report
    with each verdict card. All but the scalars are handed to a
    :class:`~lightning_ig.views.loggers.worker.PictureWriter`, which draws, encodes and logs them beside the training
    loop (a run that draws waits for the last run's pictures first: at most one run's in flight, their errors here).

    Args:
        tags: the callback's tags.
        cadences: ``{kind: every this many runs, or None}`` for the kinds of picture this callback draws (other
            kinds are ignored).
        histograms: write the per-feature and per-group attribution histograms.
        inputs: what the pictures need besides a run (:class:`~lightning_ig.views.pictures.draw.PictureInputs`).
        pictures: the logging worker.
        sinks: the picture sinks of the trainer's other loggers (W&B, MLflow), or none.
        ever_non_zero: the tags that carried something in an earlier run (restored from a checkpoint).
        report: makes a run's JSON report from its summary, host result and epoch, for the sinks; ``None``: none.
    """

    def __init__(
        self,
        tags: TagNames,
        cadences: Mapping[str, int | None],
        histograms: bool,
        inputs: Any,
        pictures: PictureWriter,
        sinks: Sequence[Any] = (),
        ever_non_zero: Iterable[str] = (),
        *,
        report: Callable[[RunSummary, HostResult, int], Mapping[str, Any]] | None = None,
    ) -> None:
        self.tags, self.report = tags, report
        self.cadences = dict(cadences)
        self.histograms, self.inputs, self.pictures = histograms, inputs, pictures
        self.sinks = list(sinks)
        self.mlflow = {id(sink.logger) for sink in self.sinks if isinstance(sink, MlflowSink)}  # keys made safe there
        self.ever_non_zero = set(ever_non_zero)
        self.drawn_steps: dict[str, int | None] = dict.fromkeys(PICTURES)
        self.drawn_verdict: tuple[str, str | None] | None = None  # the last verdict card's (verdict, trust status)
        self.last_host: HostResult | None = None  # the last run's, for the pictures drawn at the end of training
        self.saliency_scale: float | None = None  # the last saliency grid's: a change is pointed out in the next
        self.refused: set[int] = set()  # the sinks whose failure was said

    def log(
        self,
        loggers: Iterable[Any],
        summary: RunSummary,
        host: HostResult | None,
        history: Sequence[Mapping[str, Any]],
        *,
        final: bool,
    ) -> None:
        """One run's scalars, TensorBoard's extras and the pictures due.

        Args:
            loggers: the trainer's loggers.
            summary: the run.
            host: the run's host result; ``None`` at the end of training without a run: the last run's pictures
                that were not drawn yet, no scalars and no text.
            history: the runs so far, this one last.
            final: the end of training (every kind of picture is due).
        """
        from lightning.pytorch.loggers import TensorBoardLogger  # noqa: PLC0415 - keep the import lazy

        loggers = list(loggers)
        boards = [logger for logger in loggers if isinstance(logger, TensorBoardLogger)]  # histograms, pictures, text
        # Lightning's own log_metrics (thread-safe: SummaryWriter calls): the scalars are logged on the logging worker
        # with the run's other events; a logger of the user's own logs them on the training thread
        direct = [logger for logger in boards if type(logger).log_metrics is TensorBoardLogger.log_metrics]
        metrics: dict[str, float] = {}
        if host is not None:
            self.last_host = host
            metrics, self.ever_non_zero = informative_scalars(
                scalar_metrics(summary, self.tags), self.tags, self.ever_non_zero
            )
            for logger in loggers:
                if logger not in direct:
                    safe = mlflow_metrics(metrics) if id(logger) in self.mlflow else dict(metrics)
                    logger.log_metrics(safe, step=summary.step)
        trust = summary.trust_checks
        verdict = (summary.completeness.verdict, None if trust is None else str(trust.status))
        # every failing run gets its own card, and so does the first run after a change (back to a pass, say)
        failed = verdict[0] in ("fail", "non-finite") or verdict[1] == "failed"
        changed = failed or (self.drawn_verdict is not None and verdict != self.drawn_verdict)
        due = pictures_due(self.cadences, self.drawn_steps, summary, final=final, verdict_due=changed)
        due = {kind: drawn for kind, drawn in due.items() if drawn}
        if not (boards or self.sinks) or (host is None and not due):
            return
        if due and self.pictures.pending:
            self.pictures.wait()  # the jobs before it first: at most one run's pictures in flight, their errors here
        job = _RunJob(
            summary,
            due,
            self.last_host,
            list(history) if due else [],  # the history grows after this run: the worker draws what it was
            self._inputs_now() if due else self.inputs,
            [(logger.experiment, logger if logger in direct else None) for logger in boards],
            metrics,
            self._histograms(summary) if self.histograms and host is not None else [],
            host is not None,
            self._sink_extras(summary, history[-1]["epoch"]) if self.sinks and "verdict" in due else None,
        )
        self.pictures.submit(self._write, job)
        self.drawn_steps.update(dict.fromkeys(due, summary.step))
        if "verdict" in due:
            self.drawn_verdict = verdict

    def _histograms(self, summary: RunSummary) -> list[tuple[str, np.ndarray]]:
        """``(tag, the run's values of one unit)``: per feature logged one by one, per group."""
        tags, columns = self.tags, []
        for units, group in _one_by_one(summary, tags):
            if units.values is not None:
                labels = tags.labels[units.kind]
                prefix = f"{tags.prefix}/{group}attributions"
                columns += [(f"{prefix}/{label}", column) for label, column in zip(labels, units.values.T)]
        return columns

    def _inputs_now(self) -> Any:
        """The picture inputs with what they read of the callback (a contrast's last pairs) read now, for the worker."""
        if (pairs := getattr(self.inputs, "pairs", None)) is None:
            return self.inputs
        chosen = pairs()
        return dataclasses.replace(self.inputs, pairs=lambda: chosen)

    def _write(self, job: _RunJob) -> None:
        """On the worker: the pictures drawn, then every TensorBoard event of the run, then the sinks' part."""
        failed: Exception | None = None
        try:
            pictures = self._draw(job)
        except Exception as error:  # noqa: BLE001 - the run's scalars and text are still written; raised after
            pictures, failed = {}, error
        summary, step = job.summary, job.summary.step
        text = None
        if job.text:  # the report text names this run's saliency grid only
            scale = self.saliency_scale if job.due.get("saliency") and failed is None else None
            text = (
                f"{self.tags.prefix}/report",
                report_markdown(summary, self.tags.labels[summary.units.kind], self.tags.prefix, saliency_scale=scale),
            )
        for writer, logger in job.boards:
            if logger is not None and job.scalars:
                logger.log_metrics(job.scalars, step=step)
            add_run(writer, step, job.histograms, text)
            for tag, pixels in pictures.items():  # last: the largest events
                add_picture(writer, tag, pixels, step)
        for sink in self.sinks:
            self._to_sink(sink, job, pictures)
        if failed is not None:
            raise failed

    def _to_sink(self, sink: Any, job: _RunJob, pictures: Mapping[str, np.ndarray]) -> None:
        """A run's pictures, and with a verdict card its table of units and JSON report, to one W&B or MLflow sink; a
        store that refuses them (a remote one down, a full disk) is said once and training goes on."""
        step = job.summary.step
        try:
            if pictures:
                sink.pictures(pictures, step)
            if job.sinks is not None:
                table, document = job.sinks
                noun = "groups" if job.summary.units.kind == "groups" else "features"
                sink.table(f"{self.tags.prefix}/{noun}", *table, step)
                if document is not None:
                    sink.report(f"{self.tags.prefix}/report_step={step:08d}.json", document, step)
        except Exception as error:  # noqa: BLE001 - not the end of training
            if id(sink) not in self.refused:
                self.refused.add(id(sink))
                warnings.warn(
                    f"IntegratedGradientsCallback: {type(sink.logger).__name__} refused the run's pictures, table "
                    f"or report at step {step}: {type(error).__name__}: {error}; training goes on, later runs "
                    "try again (this is said once)",
                    RuntimeWarning,
                    stacklevel=1,
                )

    def _draw(self, job: _RunJob) -> dict[str, np.ndarray]:
        """The pictures due, by tag; the saliency grid's scale kept for the text and the next grid."""
        if not job.due:
            return {}
        from lightning_ig.views.pictures.draw import draw  # noqa: PLC0415 - Pillow and the drawing only when due

        labels = self.tags.labels[job.summary.units.kind]
        drawn, scale = draw(job.due, job.summary, labels, job.host, job.history, job.inputs, self.saliency_scale)
        if scale is not None:
            self.saliency_scale = scale
        return {f"{self.tags.prefix}/{PICTURE_TAGS[kind]}": pixels for kind, pixels in drawn.items()}

    def _sink_extras(self, summary: RunSummary, epoch: int) -> tuple[Any, Any]:
        """With the verdict card, the table of units and the JSON report (with the verdict and the trust checks) for
        the sinks, made here on the training thread: the report reads the trainer (its world size)."""
        from lightning_ig.views.loggers.sinks import unit_table  # noqa: PLC0415 - only with W&B or MLflow loggers

        table = unit_table(self.tags.labels[summary.units.kind], summary.units, summary.settings.top_k)
        host = self.last_host  # the run's: at the end of training without a run, the last run's
        return table, None if self.report is None or host is None else self.report(summary, host, epoch)

    def close(self) -> None:
        """Every picture in the writer's queue (the worker stopped): before the loggers close."""
        self.pictures.close()
