"""Training-time Integrated Gradients: a Lightning callback that watches what the model relies on.

The Lightning hooks, and one run top to bottom (:meth:`~IntegratedGradientsCallback._start`: attribute, gather;
:meth:`~IntegratedGradientsCallback._finish`: summarize, check, warn, log, write). What is decided once is elsewhere:
the options (:mod:`~lightning_ig.callback.options`) and what a fit holds (:mod:`~lightning_ig.callback.fit`).
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

from lightning_ig.attribution.groups import GroupSpec
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.attribution.settings import DEFAULT_METHOD, DEFAULT_N_STEPS
from lightning_ig.callback import fit, heldout, setup
from lightning_ig.callback.options import check_options, option_attribute
from lightning_ig.ensemble.members import pack_members
from lightning_ig.models.noise import attribution_mode
from lightning_ig.run.gather import JointGather
from lightning_ig.run.host_result import HostResult
from lightning_ig.run.summary import RunSummary, summarize
from lightning_ig.views import text
from lightning_ig.views.loggers.custom_scalars import trainer_layout
from lightning_ig.views.loggers.worker import PictureWriter
from lightning_ig.vocabulary import BackendName, NSteps

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
            returns one value per state), an output index, ``"each"`` (every action's ``Q(s, a)``
            in one batched run, a row per (state, action): ``ig/mean_abs/...`` is the mean over the
            actions, the verdict covers every pair, ``ig/action/<action>/...`` each action, the
            ``ig/actions`` picture what favours each; the trust checks judge the mean over the actions,
            ``V(s)`` of a dueling network), ``"contrast"`` (per state ``Q(greedy) - Q(runner-up)``: why
            this action rather than the next best; the pair is chosen at the state and held fixed along
            the path, and the ``ig/actions`` picture, drawn at ``figure_every_n_runs``, shows what favours
            the greedy action for the commonest pair; the deletion check does not run for it), or a
            callable mapping the outputs ``(N, A)`` to ``(N,)`` (as for
            :func:`~lightning_ig.attribution.integrated_gradients`).
        forward: ``None`` (default: the model's output, through ``target``) or a callable
            ``(pl_module, x) -> (N,)``: the scalar attributed, computed your way (``target`` stays
            ``"mean"``).
        n_steps: Quadrature points; ``"budget"`` (default): 256, 128 or 64, the most whose work fits the
            device, the kink rule's 56 where that is 64 (:mod:`lightning_ig.attribution.budget`; the summary's
            ``n_steps`` says which); or ``"auto"`` (refine per state until the error estimate is within
            ``completeness_tol / 2``).
        method: ``"auto"`` (default: the kink rule ``"kink_midpoint"`` at 64 points or fewer, else
            ``"riemann_middle"``), or another rule of :func:`~lightning_ig.attribution.integrated_gradients`
            (``"gausslegendre"``, ...).
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
        checks_every_n_runs: The trust checks (:mod:`lightning_ig.trust`: randomisation sanity,
            deletion, and noise stability for NoisyNet models) due every this many runs (stability every four times
            as many) and at the end, each run when the budget covers it: their cumulative cost stays within 20% of
            the IG time at every run (a cost model in IG runs, never a clock: identical fits check at identical
            runs); logged as ``ig/sanity|faithfulness|stability|trust/...`` with the verdict, and when the checks
            not run yet will, in the report text (default 5; ``None``: no checks). On global rank zero, with private
            seeded generators, on a working copy of the model: the model is left as it was.
        action_names: One name per output, for the tags and pictures of ``target="each"``, ``"contrast"`` or an
            output index (default ``None``: ``action 0``, ``action 1``, ...); counted against the model at fit start.

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
        checks_every_n_runs: int | None = 5,
        action_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()  # next: every argument checked once, kept as checked (callback/options.py)
        self.options = check_options({name: value for name, value in locals().items() if name != "self"})
        self.history: list[dict[str, Any]] = []  # one entry per run, kept across a resume (state_dict)
        self._last_run_step: int | None = None
        self._plan: fit.FitPlan | None = None  # set at set-up: the states, the units logged, the report folder
        self._fit: fit.Fit | None = None  # set at fit start: the engine, the outputs, the trust checks
        self._warned: set[str] = set()
        self._last: RunSummary | None = None
        self._pictures = PictureWriter()  # encodes and logs the pictures beside the training loop
        self._ever_non_zero: set[str] = set()  # count tags non-zero so far: logged from then on (state_dict)
        self._pending: fit.PendingRun | None = None  # a run started at the last batch end, ended at the next
        self._q_values: Any = None  # target="contrast": (B, A) the model's outputs at the last run's states

    __getattr__ = option_attribute  # callback.every_n_steps and the other options: self.options' (as checked)

    # ------------------------------------------------------------------ Lightning plumbing

    @property
    @override
    def state_key(self) -> str:
        # Lightning's documented form of a state key: the class's qualified name and the repr of what identifies it
        return f"{type(self).__qualname__}{self.options.identity()!r}"

    @override
    def state_dict(self) -> dict[str, Any]:
        self._finish_pending()  # a checkpoint holds every run started before it
        seen = self._ever_non_zero if self._fit is None else self._fit.outputs.ever_non_zero
        history = [dict(entry) for entry in self.history]
        return {"history": history, "last_run_step": self._last_run_step, "ever_non_zero": sorted(seen)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(entry) for entry in state_dict.get("history", [])]
        self._last_run_step = state_dict.get("last_run_step")
        self._ever_non_zero = set(state_dict.get("ever_non_zero", ()))

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == TrainerFn.FITTING:
            self._plan = fit.plan(self.options, trainer, pl_module, [c.options.name for c in _siblings(trainer)])
            self._last_run_step = None  # a new fit counts steps from zero; a resume restores it

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._plan is None:  # setup was not called for fitting (a bare hook call)
            self.setup(trainer, pl_module, TrainerFn.FITTING)
        assert self._plan is not None  # noqa: S101 - set by setup
        hooks = {"layout": lambda: _layout(trainer), "q_values": lambda: self._q_values, "pictures": self._pictures}
        self._fit = fit.start(self.options, self._plan, trainer, pl_module, ever_non_zero=self._ever_non_zero, **hooks)
        self.history = setup.history_to_continue(self.history, self._plan.units)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._finish_pending(landed=True)  # a run started steps ago whose numbers have landed (never waits)
        step, every = trainer.global_step, self.options.every_n_steps
        if every is not None and step > 0 and step % every == 0 and self._should_run(trainer):
            # Ended at a later batch end (the device attributes beside the next steps), or at once where a trust check
            # is due (it needs the model as attributed) and under DDP (every rank raises on NaN/Inf at one step).
            pending = self._start(trainer, pl_module, final=False)
            trust = pending.run.trust
            checking = trust is not None and len(self.history) >= trust.next_run  # trust: plain data
            if checking or trainer.world_size > 1:
                self._finish(pending)
            else:
                self._pending = pending

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        every = self.options.every_n_epochs
        self._finish_pending()
        if every is not None and (trainer.current_epoch + 1) % every == 0 and self._should_run(trainer):
            self._run(trainer, pl_module, final=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish_pending()
        if self.options.run_at_train_end and self._should_run(trainer):
            self._run(trainer, pl_module, final=True)
        elif self._last is not None and self._fit is not None and trainer.is_global_zero:
            self._fit.outputs.log(trainer.loggers, self._last, None, self.history, final=True)  # the last pictures
        self._pictures.close()  # every picture in the writer's queue before the logger closes
        losses = None if self._plan is None or self._plan.reports is None else self._plan.reports.losses()
        if losses is not None:
            rank_zero_warn(f"IntegratedGradientsCallback{setup.named(self.options.name)}: {losses}")

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        named = setup.named(self.options.name)
        try:
            self._finish_pending()  # the run started before the exception is still logged
        except Exception as error:  # noqa: BLE001 - the training's own exception is the one to see
            rank_zero_warn(f"IntegratedGradientsCallback{named}: the last run could not be logged: {error!r}")
        try:
            self._pictures.close()  # the pictures drawn so far still reach TensorBoard
        except Exception as error:  # noqa: BLE001 - the training's own exception is the one to see
            rank_zero_warn(f"IntegratedGradientsCallback{named}: a picture could not be logged: {error!r}")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._pending = None  # ended by on_train_end or on_exception; a bare teardown drops nothing logged twice
        self._pictures.close()

    def _should_run(self, trainer: pl.Trainer) -> bool:
        """Fitting, not sanity checking, set up, and no run yet at this global step."""
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        return fitting and self._fit is not None and self._last_run_step != trainer.global_step

    # ------------------------------------------------------------------ a run

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, final: bool) -> None:
        """One run from start to end: attribute, gather, summarize, log (see :meth:`_start` and :meth:`_finish`)."""
        self._finish(self._start(trainer, pl_module, final=final))

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, final: bool) -> fit.PendingRun:
        """Attribute, gather, queue the copy to the host without waiting; a run still pending ends first (in order)."""
        assert self._fit is not None  # noqa: S101 - _should_run checked it
        self._finish_pending()
        run = self._fit
        started = time.perf_counter()
        with attribution_mode(pl_module), stochastic_warnings_silenced():  # the callback warns once (_warn)
            result = run.engine.attribute(run.states, baselines=run.baselines)
            if run.actions is not None:  # target="each": (A, share, ...) as a row per (state, action), state-major
                result = run.actions.rows(result)
            members = None if run.members is None else run.members.attribute(run.states, run.baselines)
        riders = [] if members is None else [pack_members(members)]  # gathered with the result: one collective
        if run.target.contrasts:  # the Q-values the pairs were chosen from, for the actions picture
            with attribution_mode(pl_module), torch.no_grad():
                riders.append(pl_module(run.states))  # (share, A)
        gather = JointGather(trainer.strategy.all_gather, riders) if trainer.world_size > 1 else None
        options = run.host_options  # what the run keeps: fit.start's
        transfer = HostResult.begin(result, gather=gather, **options)
        self._last_run_step = trainer.global_step
        riders = riders if gather is None else gather.riders  # (world * share, W) each, padding rows included
        held_ms = (time.perf_counter() - started) * 1e3
        step, epoch = trainer.global_step, trainer.current_epoch
        return fit.PendingRun(run, trainer, transfer, riders, step, epoch, final, held_ms)

    def _finish_pending(self, *, landed: bool = False) -> None:
        """End the pending run, if any; with ``landed`` only if its numbers have landed (asked, never waited for)."""
        pending = self._pending
        if pending is not None and not (landed and not pending.transfer.ready()):
            self._pending = None
            self._finish(pending)

    def _finish(self, pending: fit.PendingRun) -> None:
        """Summarize a started run; on rank zero warn, log and write the report; then check for NaN/Inf."""
        trainer, run, num_states = pending.trainer, pending.run, len(pending.run.held_out)
        started = time.perf_counter()
        host = pending.transfer.result()
        members = None if run.members is None else run.members.host_run(pending.riders[0], num_states)
        if run.target.contrasts:  # the last rider: the Q-values, for the actions picture
            self._q_values = pending.riders[-1][:num_states].detach().to("cpu", torch.float64).numpy()
        time_ms = pending.held_ms + (time.perf_counter() - started) * 1e3  # the time the run held the training loop
        summary = summarize(
            host, step=pending.step, history=self.history, time_ms=time_ms, members=members, **run.summary_options
        )
        if run.trust is not None:  # the monitor at the runs it names; the others carry the verdict it made for them
            if pending.final or len(self.history) >= run.trust.next_run:
                summary, trust = run.trust.step(host, summary, final=pending.final)
            else:
                verdict, trust = run.trust.carried[summary.completeness.accuracy.within]
                summary = dataclasses.replace(summary, trust_checks=verdict)
            summary = dataclasses.replace(summary, trust_scalars=trust)
        self.history.append(summary.history_entry(pending.epoch))
        self._last = summary
        if trainer.is_global_zero:
            self._warn(summary)
            run.outputs.log(trainer.loggers, summary, host, self.history, final=pending.final)
            if run.reports is not None:
                names, label, epoch = run.units.names, run.target.label, pending.epoch
                run.reports.write_run(summary, host, names, label, epoch, trainer.world_size)
        if summary.completeness.num_non_finite and self.options.on_non_finite == "raise":  # on every rank: none waits
            raise NonFiniteAttributionError(
                f"IntegratedGradientsCallback{setup.named(self.options.name)}: {text.troubles(summary)['non-finite']}; "
                "training stopped (on_non_finite='raise')"
            )

    def _warn(self, summary: RunSummary) -> None:
        """Each kind of trouble once (NaN/Inf, nothing checked, completeness above tolerance, a random forward)."""
        if not summary.troubles():
            return
        for kind, message in text.troubles(summary).items():
            if kind not in self._warned:
                self._warned.add(kind)
                rank_zero_warn(f"IntegratedGradientsCallback{setup.named(self.options.name)}: {message} (warned once)")


def _siblings(trainer: pl.Trainer) -> list[IntegratedGradientsCallback]:
    return [callback for callback in trainer.callbacks if isinstance(callback, IntegratedGradientsCallback)]


def _layout(trainer: pl.Trainer) -> dict[str, Any]:
    """The Custom Scalars page of every IG callback of the trainer (made at a first run and with each bar chart)."""
    fits = [(sibling.options.name, sibling._fit, sibling._last) for sibling in _siblings(trainer)]
    return trainer_layout([(name, run.outputs, last) for name, run, last in fits if run is not None])
