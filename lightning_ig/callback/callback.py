"""Training-time Integrated Gradients: a Lightning callback that watches what the model relies on.

One run, top to bottom (:meth:`IntegratedGradientsCallback._run`): the engine attributes this rank's share of the
held-out states inside :func:`~lightning_ig.models.noise.attribution_mode`; one collective gathers it
(:class:`~lightning_ig.attribution.host_result.HostResult`); :func:`~lightning_ig.views.summary.summarize` turns
it into a :class:`~lightning_ig.views.summary.RunSummary`; global rank zero warns, logs
(:mod:`lightning_ig.views.tensorboard`) and writes the JSON report (:mod:`lightning_ig.callback.reports`).
Everything decided once per fit is in :mod:`~lightning_ig.callback.heldout` (the states, the target, the
engine) and :mod:`~lightning_ig.callback.setup` (the options, the units logged, the report folder).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.groups import GroupSpec, check_group_spec
from lightning_ig.attribution.host_result import HostResult, HostTransfer, JointGather
from lightning_ig.attribution.options import DEFAULT_METHOD, DEFAULT_N_STEPS
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.callback import calibration, heldout, reports, setup
from lightning_ig.callback.trust.monitor import TrustChecks, TrustMonitor
from lightning_ig.ensemble.members import MemberAttribution, MemberRun, pack_members
from lightning_ig.models.noise import attribution_mode
from lightning_ig.views.layout import custom_scalars_layout, ranked_labels
from lightning_ig.views.per_action import action_labels
from lightning_ig.views.report import build_report
from lightning_ig.views.saliency import check_saliency_channel, saliency_kind
from lightning_ig.views.summary import RunSettings, RunSummary, summarize
from lightning_ig.views.tensorboard import PictureWriter, RunOutputs, TagNames
from lightning_ig.vocabulary import (
    BACKENDS,
    GRADIENTS,
    BackendName,
    NSteps,
    callable_name,
    check_bool,
    check_choice,
    check_method,
    check_n_steps,
    check_names,
    check_optional_positive_int,
    check_path,
    check_positive_float,
    check_positive_int,
)

__all__ = ["IntegratedGradientsCallback", "NonFiniteAttributionError"]


class NonFiniteAttributionError(RuntimeError):
    """The model produced NaN/Inf on the held-out states and ``on_non_finite="raise"`` was asked for."""


class IntegratedGradientsCallback(Callback):
    r"""Run Integrated Gradients on held-out states during training and log what the model relies on.

    Each run attributes a scalar of the model (by default the mean of its outputs, ``V(s)`` for a
    dueling Q-network) to the input features of every held-out state and logs, under ``ig/`` (or
    ``ig/<name>/``; every tag is listed in ``docs/tensorboard-tags.md``): completeness (worst
    relative and mean absolute error, counts of non-finite and unchecked states), per-feature
    mean ``|attr|`` and mean ``attr`` up to ``max_logged_features`` features, per-group ones when
    groups are in use, where the mass sits (``concentration``), drift between runs and the time.
    Scalars go to every logger; a ``TensorBoardLogger`` also gets histograms, the saliency pictures
    of spatial states, the bar chart and the heatmap, a text report and a Custom Scalars layout.
    When the attributed output is an ensemble's aggregate (:class:`~lightning_ig.ensemble.Ensemble`),
    every member is attributed too (one batched run) and ``ig/ensemble/...`` says how far they agree.

    Runs happen every ``every_n_steps`` optimizer steps and/or every ``every_n_epochs`` epochs, and
    once more when training ends. The model, its noise, parameters and ``.grad``, the optimizer and
    the random generators are as they were after each run. Under DDP the states are split across
    ranks and gathered with one collective call; only global rank zero logs and writes files.

    Args:
        states: ``(num_states, *feature_shape)``: a tensor, a ``.safetensors``/``.npy``/``.json``
            file, or a callable ``(trainer, pl_module) -> Tensor`` called at set-up.
        every_n_steps: Run every this many optimizer steps (default 100); ``None``: no step cadence.
        every_n_epochs: Run every this many epochs (default ``None``).
        run_at_train_end: Run once more when training ends (default ``True``).
        feature_names: One name per flattened feature; default ``x0, x1, ...`` (``x[c,i,j]``).
        baseline: ``"zeros"`` (default), ``"mean"`` of the held-out states, or a tensor of shape
            ``feature_shape`` or ``(num_states, *feature_shape)``.
        target: ``"mean"`` (default: the mean of the outputs, or the output itself when the model
            returns one value per state), an output index, ``"contrast"`` (per state ``Q(greedy) -
            Q(runner-up)``: why this action rather than the next best; the pair is chosen at the state and
            held fixed along the path, and the ``ig/actions`` picture, drawn at ``figure_every_n_runs``,
            shows what favours the greedy action for the commonest pair; the deletion check does not run
            for it), or a callable mapping the outputs ``(N, A)`` to ``(N,)`` (as for
            :func:`~lightning_ig.attribution.integrated_gradients`).
        forward: ``None`` (default: the model's output, through ``target``) or a callable
            ``(pl_module, x) -> (N,)``: the scalar attributed, computed your way (``target`` stays
            ``"mean"``). A ``target`` callable of two arguments is the older spelling of this; it works,
            with a DeprecationWarning.
        n_steps: Quadrature points; ``"budget"`` (default): 256, 128 or 64, the most whose work fits the
            device (:mod:`lightning_ig.attribution.budget`: 256 for a small network's held-out batch on a GPU,
            64 for a Nature-CNN or on a CPU; the summary's ``n_steps`` says which); or ``"auto"`` (refine per
            state until the error estimate is within ``completeness_tol / 2``).
        method: ``"riemann_middle"`` (default), another rule of
            :func:`~lightning_ig.attribution.integrated_gradients` (``"gausslegendre"``, ``"warped_middle:2"``,
            ...); calibration (``calibrate_every``) may replace it by a rule that was twice as accurate.
        gradient: ``"autograd"`` (default) or ``"finite_difference"``.
        backend: ``"auto"`` (default), ``"cuda"`` or ``"torch"``.
        internal_batch_size: Rows per forward in the engine (default ``None``: from free memory).
        top_k: Entries of the top-k table and chart and of the Jaccard drift (default 10).
        completeness_tol: The worst relative completeness error that passes (default 0.01); above
            it, one warning suggests ``n_steps="auto"``.
        report_dir: Folder for a JSON report per run; ``None`` (default): none, except without a
            logger (``<default_root_dir>/ig_reports``). Checked at set-up; a report that cannot be
            written later (full disk, ...) is warned about once and training goes on (the losses
            are counted in a warning at the end of training). A link at a report's name is never
            followed.
        log_histograms: Log per-feature / per-group histograms (default ``True``).
        figure_every_n_runs: Draw the two charts (``top_features``, ``heatmap``) at the first
            run, every this many runs and always at the end (default 10); ``None``: never.
        name: Tags under ``ig/<name>/`` and reports ``ig_report_<name>_step=...``; needed when two
            callbacks share a Trainer (default ``None``: ``ig/``).
        feature_groups: ``"channels"``, ``"features"``, an integer mask or a dict
            ``{name: indices | bool mask}`` (see :class:`~lightning_ig.attribution.groups.FeatureGroups`);
            ``None`` (default): groups only when there are more than ``max_logged_features``
            features (``"channels"`` for ``(C, ...)`` states, else blocks; one warning says so).
        group_names: Names for the groups (default ``channel 0``, ..., ``group <id>`` or the dict keys).
        max_logged_features: The most features logged one by one (default 64).
        saliency_states: Held-out states in the ``ig/saliency`` grid of spatial states (default 8;
            ``None``: no saliency pictures).
        saliency_channel: The channel drawn under the attribution (default ``None``: channel mean).
        saliency_every_n_runs: Log the saliency grid and the mean ``|attr|`` map
            (``saliency/mean_abs``) at the first run, every this many runs and always at the end
            (default 10, as the charts; 1: every run). Pictures that share a cadence are spread
            evenly over it (all four at 10: the bar chart at runs 0, 10, ...; the heatmap at 2,
            12, ...; the grid at 5, 15, ...; the map at 7, 17, ...), so that besides the first
            and the last run a run draws at most one. TensorBoard shows 10 per tag by default.
        on_non_finite: ``"warn"`` (default: once, and log ``worst_relative_error`` as ``inf``) or
            ``"raise"`` (:class:`NonFiniteAttributionError`, which stops training) when the model
            produces NaN/Inf on the held-out states.
        calibrate_every: Re-run the calibration (:mod:`lightning_ig.attribution.calibration`: the rule
            and the error estimate's scale, on the first 8 held-out states against a reference of
            ``max(1024, 4 n_steps)`` midpoint steps) at the first run and every this many runs (default 50:
            8 x (1024 + 4 n_steps) gradient rows, 16384 at 256 steps, in one or two passes for a small
            network: about 1-3% of the IG time of 50 runs of 64 states); its wall time is the summary's
            ``completeness.calibration_ms``. ``None``: never (the midpoint rule, scale 1). Not for
            ``n_steps="auto"`` or finite differences.
        checks_every_n_runs: The trust checks (:mod:`lightning_ig.callback.trust`: randomisation sanity,
            deletion, and noise stability for NoisyNet models) at the first run, every this many runs (stability
            every four times as many) and at the end, while they have used at most 20% of the IG time of the fit;
            logged as ``ig/sanity|faithfulness|stability|trust/...`` with the verdict in the report text (default 5;
            ``None``: no checks). On global rank zero, with private seeded generators; the model is left as it was.

    Raises:
        MisconfigurationException: No cadence or a non-positive one; at set-up, two callbacks with one ``name``.
        TypeError, ValueError: A bad argument (the message names it): a value of the wrong kind is
            refused, never read as another (``run_at_train_end="no"`` is an error, not ``True``;
            ``group_names="abc"`` is not three names). At set-up: states that do not fit the model,
            NaN/Inf in the states, names or groups of the wrong size (more ``group_names`` than
            groups included), a ``saliency_channel`` past the states' channels, a bad ``baseline``,
            ``target``, ``forward`` or ``report_dir`` (an existing file, or not writable), a ``name``
            too long for the report file names in ``report_dir``.

    Example::

        ig = IntegratedGradientsCallback(
            states="held_out_states.npy",
            feature_names=["cart position", "cart velocity", "pole angle", "pole angular velocity"],
            every_n_steps=500,
        )
        Trainer(callbacks=[ig]).fit(model, datamodule)
    """

    def __init__(
        self,
        states: heldout.StatesSource,
        *,
        every_n_steps: int | None = 100,
        every_n_epochs: int | None = None,
        run_at_train_end: bool = True,
        feature_names: Sequence[str] | None = None,
        baseline: Literal["zeros", "mean"] | Tensor = "zeros",
        target: heldout.TargetOption = "mean",
        forward: heldout.ForwardOption | None = None,
        n_steps: NSteps = DEFAULT_N_STEPS,
        method: str = DEFAULT_METHOD,
        gradient: Literal["autograd", "finite_difference"] = "autograd",
        backend: BackendName = "auto",
        internal_batch_size: int | None = None,
        top_k: int = 10,
        completeness_tol: float = 0.01,
        report_dir: str | os.PathLike[str] | None = None,
        log_histograms: bool = True,
        figure_every_n_runs: int | None = 10,
        name: str | None = None,
        feature_groups: GroupSpec | None = None,
        group_names: Sequence[str] | None = None,
        max_logged_features: int = 64,
        saliency_states: int | None = 8,
        saliency_channel: int | None = None,
        saliency_every_n_runs: int = 10,
        on_non_finite: Literal["warn", "raise"] = "warn",
        calibrate_every: int | None = 50,
        checks_every_n_runs: int | None = 5,
    ) -> None:
        super().__init__()
        self.states = heldout.check_states_source(states)
        self.every_n_steps, self.every_n_epochs = setup.check_cadences(every_n_steps, every_n_epochs)
        self.run_at_train_end = check_bool(run_at_train_end, "run_at_train_end")
        self.feature_names = None if feature_names is None else check_names(feature_names, "feature_names")
        self.baseline = heldout.check_baseline(baseline)
        self.target, self.forward = heldout.check_target(target, forward)
        self.n_steps = check_n_steps(n_steps)
        self.method = check_method(method)
        self.gradient = check_choice(gradient, GRADIENTS, "gradient")
        self.backend = check_choice(backend, BACKENDS, "backend")
        self.internal_batch_size = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        self.top_k = check_positive_int(top_k, "top_k")
        self.completeness_tol = check_positive_float(completeness_tol, "completeness_tol")
        self.report_dir = None if report_dir is None else check_path(report_dir, "report_dir")
        self.log_histograms = check_bool(log_histograms, "log_histograms")
        self.figure_every_n_runs = check_optional_positive_int(figure_every_n_runs, "figure_every_n_runs")
        self.name = setup.check_name(name)
        self.feature_groups = check_group_spec(feature_groups)  # checked against the states' shape at set-up
        self.group_names = None if group_names is None else check_names(group_names, "group_names")
        self.max_logged_features = check_positive_int(max_logged_features, "max_logged_features", example=64)
        self.saliency_states = check_optional_positive_int(saliency_states, "saliency_states")
        self.saliency_channel = setup.check_saliency_channel_index(saliency_channel)
        self.saliency_every_n_runs = check_positive_int(saliency_every_n_runs, "saliency_every_n_runs", example=10)
        self.on_non_finite = check_choice(on_non_finite, ("warn", "raise"), "on_non_finite")
        self.calibrate_every = check_optional_positive_int(calibrate_every, "calibrate_every")
        self.checks_every_n_runs = check_optional_positive_int(checks_every_n_runs, "checks_every_n_runs")

        self.history: list[dict[str, Any]] = []  # one entry per run, kept across a resume (state_dict)
        self._last_run_step: int | None = None
        self._held_out: Tensor | None = None  # (B, *feature_shape) float32 on the CPU, set at set-up
        self._engine: IntegratedGradients | None = None  # set at fit start
        self._members: MemberAttribution | None = None  # set at fit start when the model is an ensemble
        self._warned: set[str] = set()
        self._last: RunSummary | None = None
        self._pictures = PictureWriter()  # encodes and logs the pictures beside the training loop
        self._tensorboard: RunOutputs | None = None  # set at fit start
        self._sample_states = 0  # the saliency grid draws states among the first this many (set at fit start)
        self._ever_non_zero: set[str] = set()  # count tags non-zero so far: logged from then on (state_dict)
        self._pending: _PendingRun | None = None  # a run started at the last batch end, ended at the next
        self._trust: TrustMonitor | None = None  # set at fit start, on global rank zero when checks are on
        self._q_values: Any = None  # target="contrast": (B, A) the model's outputs at the last run's states

    # ------------------------------------------------------------------ Lightning plumbing

    @property
    @override
    def state_key(self) -> str:
        given = self.forward if self.forward is not None else self.target
        target = given if isinstance(given, (str, int)) else callable_name(given)
        return self._generate_state_key(
            name=self.name, target=target, every_n_steps=self.every_n_steps, every_n_epochs=self.every_n_epochs
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        self._finish_pending()  # a checkpoint holds every run started before it
        seen = self._ever_non_zero if self._tensorboard is None else self._tensorboard.ever_non_zero
        return {
            "history": [dict(entry) for entry in self.history],
            "last_run_step": self._last_run_step,
            "ever_non_zero": sorted(seen),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(entry) for entry in state_dict.get("history", [])]
        self._last_run_step = state_dict.get("last_run_step")
        self._ever_non_zero = set(state_dict.get("ever_non_zero", ()))

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != TrainerFn.FITTING:
            return
        setup.check_unique_names([callback.name for callback in _siblings(trainer)])
        states = heldout.resolve_states(self.states, trainer, pl_module)
        shape = tuple(states.shape[1:])
        heldout.check_baseline_shape(self.baseline, states)
        check_saliency_channel(self.saliency_channel, shape)  # here, not at the first picture mid-training
        units = (self.name, self.feature_names, self.feature_groups, self.group_names, self.max_logged_features)
        self._units = setup.logged_units(shape, *units)
        self._saliency = saliency_kind(shape) is not None and self.saliency_states is not None
        self._reports = setup.report_folder(
            self.report_dir, trainer.default_root_dir, bool(trainer.loggers), self.name, self.states
        )
        self._held_out, self._last_run_step = states, None  # a new fit counts steps from zero; a resume restores it

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._held_out is None:  # setup was not called for fitting (a bare hook call)
            self.setup(trainer, pl_module, TrainerFn.FITTING)
        options = {"n_steps": self.n_steps, "method": self.method, "gradient": self.gradient, "backend": self.backend}
        options.update(completeness_tol=self.completeness_tol, internal_batch_size=self.internal_batch_size)
        prepared = heldout.prepare_engine(
            trainer, pl_module, self.target, self.forward, self._held_out, self.baseline, **options
        )
        self._engine, self._target_label, self._members, self._local_states, self._local_baselines = prepared
        baseline = heldout.baseline_label(self.baseline)
        folder = None if self._reports is None else str(self._reports.folder)  # the text says where they are
        self._settings = RunSettings(
            self._target_label, baseline, self.completeness_tol, self.top_k, self.name, report_dir=folder
        )
        members = None if self._members is None else self._members.num_members
        self._tags = dataclasses.replace(self._units.tags, ensemble_members=members)
        self._tensorboard = self._log_outputs(trainer)
        self.history = setup.history_to_continue(self.history, self._units)
        checks = None if self.checks_every_n_runs is None else TrustChecks.every(self.checks_every_n_runs)
        self._trust = TrustMonitor.prepare(
            checks,
            trainer,
            pl_module,
            self._engine,
            self.forward,
            self._held_out,
            self.baseline,
            self._units.groups,
            self._tags.prefix,
        )

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._finish_pending()  # the run started one step ago: its numbers landed while this step ran
        step = trainer.global_step
        if self.every_n_steps is not None and step > 0 and step % self.every_n_steps == 0 and self._should_run(trainer):
            # Started now, ended at the next batch end: the attribution runs on the device beside the next step
            # instead of the training thread waiting for it. Ended at once where a trust check is due (the checks
            # need the model as it was attributed) and under DDP (every rank raises on NaN/Inf at the same step).
            pending = self._start(trainer, pl_module, final=False)
            checking = self._trust is not None and self._trust.will_check(len(self.history))
            if checking or trainer.world_size > 1:
                self._finish(pending)
            else:
                self._pending = pending

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch_due = self.every_n_epochs is not None and (trainer.current_epoch + 1) % self.every_n_epochs == 0
        self._finish_pending()
        if epoch_due and self._should_run(trainer):
            self._run(trainer, pl_module, final=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish_pending()
        if self.run_at_train_end and self._should_run(trainer):
            self._run(trainer, pl_module, final=True)
        elif self._last is not None and self._tensorboard is not None and trainer.is_global_zero:
            self._log_tensorboard(trainer, self._last, None, True)  # the last run's pictures, always drawn
        self._pictures.close()  # every picture in the writer's queue before the logger closes
        reports = getattr(self, "_reports", None)  # set at set-up; absent when the hooks are called bare
        losses = None if reports is None else reports.losses()
        if losses is not None:
            rank_zero_warn(f"IntegratedGradientsCallback{setup.named(self.name)}: {losses}")

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        try:
            self._finish_pending()  # the run started before the exception is still logged
        except Exception as error:  # noqa: BLE001 - the training's own exception is the one to see
            rank_zero_warn(
                f"IntegratedGradientsCallback{setup.named(self.name)}: the last run could not be logged: {error!r}"
            )
        try:
            self._pictures.close()  # the pictures drawn so far still reach TensorBoard
        except Exception as error:  # noqa: BLE001 - the training's own exception is the one to see
            rank_zero_warn(
                f"IntegratedGradientsCallback{setup.named(self.name)}: a picture could not be logged: {error!r}"
            )

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._pending = None  # ended by on_train_end or on_exception; a bare teardown drops nothing logged twice
        self._pictures.close()

    def _should_run(self, trainer: pl.Trainer) -> bool:
        """Fitting, not sanity checking, set up, and no run yet at this global step."""
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        return fitting and self._engine is not None and self._last_run_step != trainer.global_step

    # ------------------------------------------------------------------ a run

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, final: bool) -> None:
        """One run from start to end: attribute, gather, summarize, log (see :meth:`_start` and :meth:`_finish`)."""
        self._finish(self._start(trainer, pl_module, final=final))

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, final: bool) -> _PendingRun:
        """Attribute and gather; queue the reductions and the copy to the host, without waiting for the device.

        A run before it that is still pending ends first, so runs end in order.
        """
        assert self._engine is not None  # noqa: S101 - _should_run checked it
        self._finish_pending()
        calibrated_ms = None  # the rule and error scale chosen again at the first run and every calibrate_every runs
        if self.calibrate_every is not None and len(self.history) % self.calibrate_every == 0:
            calibrated_ms = calibration.calibrate(self._engine, trainer, pl_module, self._held_out, self.baseline)
        started = time.perf_counter()
        states, baselines = self._local_states, self._local_baselines
        with attribution_mode(pl_module), stochastic_warnings_silenced():  # the callback warns once (_warn)
            result = self._engine.attribute(states, baselines=baselines)
            members = None if self._members is None else self._members.attribute(states, baselines)
        riders = [] if members is None else [pack_members(members)]  # gathered with the result: one collective
        if self.target == "contrast":  # the Q-values the pairs were chosen from, for the actions picture
            with attribution_mode(pl_module), torch.no_grad():
                riders.append(pl_module(states))  # (share, A)
        gather = JointGather(trainer.strategy.all_gather if trainer.world_size > 1 else None, riders)
        transfer = HostResult.begin(
            result,
            gather=gather,
            num_states=len(self._held_out),
            groups=self._units.groups,
            keep_attributions=(self._units.log_features and self.log_histograms) or self._trust is not None,
            sample_states=self._sample_states,
        )
        self._last_run_step = trainer.global_step
        rider = gather.riders[0] if members is not None else None
        q_values = gather.riders[-1] if self.target == "contrast" else None
        held_ms = (time.perf_counter() - started) * 1e3
        step, epoch = trainer.global_step, trainer.current_epoch
        return _PendingRun(trainer, transfer, rider, step, epoch, final, held_ms, calibrated_ms, q_values)

    def _finish_pending(self) -> None:
        """End the pending run, if any (its numbers have landed by now, or this waits for them)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._finish(pending)

    def _finish(self, pending: _PendingRun) -> None:
        """Summarize a started run; on rank zero warn, log and write the report; then check for NaN/Inf."""
        trainer = pending.trainer
        started = time.perf_counter()
        host = pending.transfer.result()
        rider, members = pending.members_rider, None
        if rider is not None and self._members is not None:
            members = self._members.host_run(rider, len(self._held_out))
        if pending.q_values is not None:
            self._q_values = pending.q_values[: len(self._held_out)].detach().to("cpu", torch.float64).numpy()
        time_ms = pending.held_ms + (time.perf_counter() - started) * 1e3  # the time the run held the training loop
        summary = self._summarize(host, members, pending.step, time_ms)
        if pending.calibrated_ms is not None:
            summary = calibration.noted(summary, pending.calibrated_ms)
        if self._trust is not None:
            summary, trust = self._trust.step(host, summary, final=pending.final)
            summary = dataclasses.replace(summary, trust_scalars=trust)
        self.history.append(summary.history_entry(pending.epoch))
        self._last = summary
        if trainer.is_global_zero:
            self._warn(summary)
            self._log_tensorboard(trainer, summary, host, pending.final)
            if self._reports is not None:
                names, label = self._units.names, self._target_label
                self._reports.write_run(summary, host, names, label, pending.epoch, trainer.world_size)
        if summary.completeness.num_non_finite and self.on_non_finite == "raise":  # on every rank: none waits
            message = summary.troubles()["non-finite"]
            raise NonFiniteAttributionError(
                f"IntegratedGradientsCallback{setup.named(self.name)}: {message}; training stopped "
                "(on_non_finite='raise')"
            )

    def _summarize(self, host: HostResult, members: MemberRun | None, step: int, time_ms: float) -> RunSummary:
        previous, first = (self.history[-1]["mean_abs"], self.history[0]["mean_abs"]) if self.history else (None, None)
        return summarize(
            host,
            feature_names=self._units.names,
            log_features=self._units.log_features,
            settings=self._settings,
            step=step,
            run_index=len(self.history),
            previous=previous,
            first=first,
            time_ms=time_ms,
            members=members,
        )

    def _warn(self, summary: RunSummary) -> None:
        """Each kind of trouble once (NaN/Inf, nothing checked, completeness above tolerance, a random forward)."""
        for kind, message in summary.troubles().items():
            if kind not in self._warned:
                self._warned.add(kind)
                rank_zero_warn(f"IntegratedGradientsCallback{setup.named(self.name)}: {message} (warned once)")

    def _log_tensorboard(self, trainer: pl.Trainer, summary: RunSummary, host: HostResult | None, final: bool) -> None:
        """Histograms, text and the pictures due; without ``host``, the last run's missing pictures (at the end)."""

        def layout() -> dict[str, Any]:  # every IG callback of the trainer on one page
            siblings = [sibling for sibling in _siblings(trainer) if sibling._tensorboard is not None]
            logged = set().union(*(sibling._tensorboard.logged for sibling in siblings))
            return custom_scalars_layout([sibling._layout_entry() for sibling in siblings], logged)

        def report() -> dict[str, Any]:  # the JSON report, for the W&B and MLflow loggers
            extra = reports.run_extra(summary, epoch=trainer.current_epoch, world_size=trainer.world_size)
            assert host is not None  # noqa: S101 - asked for only with a run
            return build_report(
                host, feature_names=self._units.names, forward_target=self._target_label, top_k=self.top_k, extra=extra
            )

        assert self._tensorboard is not None  # noqa: S101 - set at fit start, before any run
        report_maker = report if host is not None else None
        self._tensorboard.log(
            trainer.loggers, summary, host, self.history, final=final, layout=layout, report=report_maker
        )

    def _log_outputs(self, trainer: pl.Trainer) -> RunOutputs:
        """What the runs of this fit send to the loggers: the pictures' cadences and inputs, the W&B/MLflow sinks."""
        from lightning_ig.views.loggers import picture_sinks  # noqa: PLC0415 - the drawing modules only when drawn
        from lightning_ig.views.pictures import picture_inputs  # noqa: PLC0415

        assert self._held_out is not None  # noqa: S101 - set at set-up
        shape = tuple(self._held_out.shape[1:])
        spatial = saliency_kind(shape) is not None
        groups = self._units.groups
        channel_names = None if groups is None else groups.channel_names()
        inputs = picture_inputs(
            self._held_out.numpy(),
            saliency_states=(self.saliency_states or 0) if self._saliency else 0,
            channel=self.saliency_channel,
            channel_names=channel_names,
            groups_are_channels=channel_names is not None,
            baseline=heldout.baseline_label(self.baseline),
            spatial=spatial,
            **self._action_inputs(trainer.lightning_module),
        )
        picked = inputs.picked
        self._sample_states = 0 if picked is None or not len(picked) else int(picked.max()) + 1
        saliency = self.saliency_every_n_runs if self._saliency else None
        cadences = dict.fromkeys(("verdict", "top_features", "heatmap", "shares"), self.figure_every_n_runs)
        cadences.update(dict.fromkeys(("saliency", "saliency_map"), saliency))
        if self.target == "contrast":
            cadences["actions"] = self.figure_every_n_runs
        sinks = picture_sinks(trainer.loggers) if trainer.is_global_zero else []
        return RunOutputs(self._tags, cadences, self.log_histograms, inputs, self._pictures, sinks, self._ever_non_zero)

    def _action_inputs(self, pl_module: pl.LightningModule) -> dict[str, Any]:
        """For ``target="contrast"``: the actions' labels and the last run's Q-values (the ``actions`` picture)."""
        if self.target != "contrast":
            return {}
        with attribution_mode(pl_module), torch.no_grad():
            count = int(pl_module(self._local_states[:1]).shape[1])  # the outputs per state: checked at fit start
        return {"action_names": action_labels(None, count), "q_values": lambda: self._q_values}

    def _layout_entry(self) -> tuple[str | None, TagNames, list[str] | None]:
        """This callback's part of the Custom Scalars page (which holds every IG callback of the trainer)."""
        ranked = None if self._last is None else ranked_labels(self._last, self._tags)
        return self.name, self._tags, ranked


@dataclasses.dataclass(frozen=True)
class _PendingRun:
    """A run started (attributed, gathered, its copy to the host queued) and not yet summarized and logged."""

    trainer: pl.Trainer
    transfer: HostTransfer
    members_rider: Tensor | None  # the members' packed rows, gathered with the result (ensembles)
    step: int
    epoch: int
    final: bool
    held_ms: float  # host time the start held the training loop
    calibrated_ms: float | None  # the calibration made before this run, if any, and its time
    q_values: Tensor | None = None  # target="contrast": (world * share, A) the outputs at the states, gathered


def _siblings(trainer: pl.Trainer) -> list[IntegratedGradientsCallback]:
    return [callback for callback in trainer.callbacks if isinstance(callback, IntegratedGradientsCallback)]
