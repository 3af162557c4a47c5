"""The callback's report files: one schema-v1 JSON report per run in ``report_dir``, under names the tool makes up.

The names are the tool's, so a link found at one is refused and one planted later is replaced, never followed; a
report that cannot be written (a full disk, a changed permission) is counted and said, and training goes on. The
document itself is :func:`lightning_ig.views.report.build_report`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_ig._files import OutputPathError, check_output_dir, check_output_file, file_name_limit
from lightning_ig.run.host_result import HostResult
from lightning_ig.run.statistics import json_float
from lightning_ig.run.summary import RunSummary
from lightning_ig.views.report import build_report, each_report, with_verdict, write_report

__all__ = ["ReportFolder", "run_extra", "run_report"]


class ReportFolder:
    """The folder where the callback writes one report per run, under names it makes up.

    The names are ``ig_report[_<name>]_step=<step, 8+ digits>.json``. Being the tool's own, they are never written
    through a symbolic link: a link found there is refused and one planted later is replaced, never followed. A report
    that cannot be written (a full disk, a changed permission, a refused link) does not stop training: :meth:`write`
    says why and counts it, and :meth:`losses` sums up the losses.

    Args:
        folder: the folder (made if missing).
        name: the callback's ``name`` (``None``: none), part of every file name.
        inputs: files the run reads (the held-out states file); a report never replaces one.
        what: how the folder is named in errors (``report_dir``, or where the reports go without one).

    Raises:
        OutputPathError: ``folder`` is a file, or cannot be made or written.
        ValueError: ``name`` makes file names longer than the folder's file system takes.
    """

    def __init__(
        self, folder: str | os.PathLike[str], name: str | None, *, inputs: Sequence[Any] = (), what: str = "report_dir"
    ) -> None:
        self.name = name
        self._inputs = [path for path in inputs if isinstance(path, (str, os.PathLike))]
        longest = self.file_name(2**63 - 1)  # the last step a run can have (a 64-bit step counter)
        size, limit = len(os.fsencode(longest)), file_name_limit(folder)
        if size > limit:  # before the folder is made: a refused set-up leaves nothing behind
            raise ValueError(
                f"name={_cut(name)!r} makes report file names of up to {size} bytes ({_cut(longest)!r}), more than the "
                f"{limit} the file system of {what} {os.fspath(folder)!r} takes: choose a name at least "
                f"{size - limit} bytes shorter"
            )
        self.folder = check_output_dir(folder, what=what)
        self.attempted = 0
        self.lost = 0
        self.first_loss: str | None = None

    def file_name(self, step: int) -> str:
        """The report's file name for the run at global step ``step``."""
        return f"ig_report{'' if self.name is None else '_' + self.name}_step={step:08d}.json"

    def existing(self, after: int) -> int:
        """How many files in the folder have this callback's report names at steps past ``after`` (an earlier fit's
        reports that this fit's runs would replace: a fit continued on its trainer starts past its own)."""
        head, tail = self.file_name(0).split("=")[0] + "=", ".json"
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        steps = (name[len(head) : -len(tail)] for name in names if name.startswith(head) and name.endswith(tail))
        return sum(step.isdigit() and int(step) > after for step in steps)

    def write(self, report: Mapping[str, Any], step: int) -> str | None:
        """Write the report of the run at ``step``; ``None``, or why it could not be (``"PATH (error)"``)."""
        self.attempted += 1
        path = self.folder / self.file_name(step)
        try:
            check_output_file(path, what="the report", inputs=self._inputs, made_up=True)
            write_report(report, path, follow_symlinks=False)
        except OutputPathError as error:
            failure = f"{path} ({error})"
        except OSError as error:
            failure = f"{path} ({error.strerror or error})"
        else:
            return None
        self.lost += 1
        self.first_loss = self.first_loss or failure
        return failure

    def write_run(
        self,
        summary: RunSummary,
        host: HostResult,
        feature_names: Sequence[str],
        forward_target: str,
        epoch: int,
        world_size: int,
    ) -> None:
        """Write the report of one callback run; the first one lost is warned about (the rest only counted)."""
        report = run_report(summary, host, feature_names, forward_target, epoch=epoch, world_size=world_size)
        failure = self.write(report, summary.step)  # a lost report is counted, never the end of training
        if failure is not None and self.lost == 1:
            named = "" if self.name is None else f" '{self.name}'"
            rank_zero_warn(
                f"IntegratedGradientsCallback{named}: a report could not be written: {failure}; training goes on, "
                "and the reports lost are counted at the end of training"
            )

    def losses(self) -> str | None:
        """``"N of M reports could not be written, the first: PATH (error)"``, or ``None`` when none was lost."""
        if not self.lost:
            return None
        return f"{self.lost} of {self.attempted} reports could not be written, the first: {self.first_loss}"


def _cut(text: str | None, size: int = 60) -> str | None:
    return text if text is None or len(text) <= size else f"{text[: size - 3]}..."


def run_report(
    summary: RunSummary,
    host: HostResult,
    feature_names: Sequence[str],
    forward_target: str,
    *,
    epoch: int,
    world_size: int,
) -> dict[str, Any]:
    """The JSON report of one callback run (the file in ``report_dir``, and what W&B and MLflow get), with the run's
    verdict and trust checks (:func:`~lightning_ig.views.report.with_verdict`).

    A ``target="each"`` run's document speaks of the held-out states, with an ``actions`` key
    (:func:`~lightning_ig.views.report.each_report`).
    """
    extra, top_k = run_extra(summary, epoch=epoch, world_size=world_size), summary.settings.top_k
    report = build_report(host, feature_names=feature_names, forward_target=forward_target, top_k=top_k, extra=extra)
    if summary.actions is not None:
        units = summary.units
        sizes = None if units.sizes is None else units.sizes.tolist()
        tolerance = summary.settings.tolerance
        report = each_report(report, summary.actions, host, units.names, sizes, top_k=top_k, tolerance=tolerance)
    return with_verdict(report, summary)  # the verdict and the trust checks, in the file as in W&B and MLflow


def run_extra(summary: RunSummary, *, epoch: int, world_size: int) -> dict[str, Any]:
    """The keys a training run's JSON report holds beside the contract keys."""
    extra: dict[str, Any] = {
        "baseline": summary.settings.baseline,
        "global_step": summary.step,
        "epoch": int(epoch),
        "run_index": summary.run_index,
        "world_size": int(world_size),
        "callback_name": summary.settings.name,
        "drift": {key: json_float(value) for key, value in summary.drift.items()},
        "concentration": {key: json_float(value) for key, value in summary.concentration.items()},
        "timings": {"ig_ms": summary.time_ms},
    }
    if summary.budget:
        extra["budget"] = dict(summary.budget)
    return extra
