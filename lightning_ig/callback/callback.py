"""Training-time Integrated Gradients: a Lightning callback that watches what the model relies on.

The Lightning hooks, and one run top to bottom (:meth:`~IntegratedGradientsCallback._start`: attribute, gather;
:meth:`~IntegratedGradientsCallback._finish`: summarize, check, warn, log, write). What is decided once is elsewhere:
the options (:mod:`~lightning_ig.callback.options`) and what a fit holds (:mod:`~lightning_ig.callback.fit`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_ig.attribution import IGOptions
from lightning_ig.attribution.groups import GroupSpec
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.callback import fit, heldout, setup
from lightning_ig.callback.budget import Budget, Plan
from lightning_ig.callback.heldout import NonFiniteAttributionError
from lightning_ig.callback.options import Options, option_assignment, option_attribute
from lightning_ig.callback.per_action import pair_rows
from lightning_ig.models.noise import attribution_mode
from lightning_ig.run.gather import JointGather
from lightning_ig.run.host_result import HostResult, HostTransfer
from lightning_ig.run.summary import RunSummary, summarize
from lightning_ig.trust.common import generators_kept
from lightning_ig.views import ViewOptions, text
from lightning_ig.views.loggers.worker import PictureWriter

__all__ = ["IntegratedGradientsCallback", "NonFiniteAttributionError"]


_MIN_WINDOWED_STATES = 16  # fewer held-out states are always attributed together
# Hooks Lightning calls at every step (or batch) that this callback leaves as Callback's no-ops: each call costs a
# profiler context and a formatted name, ~2.5 us, 0.5% of a CartPole step for the five training ones together
_STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
)


def _timed(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A hook whose time on the training thread is booked to the callback's budget (a hook inside another counts
    once; set-up makes a new budget, so the time is booked to the one there when the hook leaves)."""
    hook = getattr(torch.compiler, "set_stance", lambda _: lambda hook: hook)("force_eager")(hook)  # no recompiles

    @functools.wraps(hook)
    def timed(self: IntegratedGradientsCallback, *args: Any, **kwargs: Any) -> Any:
        entered = self._budget.clock()
        self._depth += 1
        try:  # anomaly mode (Trainer(detect_anomaly=True)) is training's: off for the runs, whose dropped rows may NaN
            with torch.autograd.set_detect_anomaly(False):
                return hook(self, *args, **kwargs)
        finally:
            self._depth -= 1
            if self._depth == 0:  # set-up is paid once: amortised over the fit like the checks' first passes
                self._budget.add(self._budget.clock() - entered, once=hook.__name__ in ("setup", "on_fit_start"))

    return timed


if TYPE_CHECKING:  # the options read through __getattr__ (ig.overhead), which type checkers skip: read-only fields

    class _OptionAttributes(Options):
        def __init__(self) -> None: ...  # super().__init__() in the callback is Callback's, which takes nothing

else:
    _OptionAttributes = object


class IntegratedGradientsCallback(Callback, _OptionAttributes):
    r"""Run Integrated Gradients on held-out states during training and log what the model relies on.

    Each run attributes a scalar of the model (by default the mean of its outputs, ``V(s)`` for a dueling
    Q-network) to the input features of every held-out state and logs, under ``ig/`` (or ``ig/<name>/``; every tag
    is in ``docs/tensorboard-tags.md``): the accuracy verdict and completeness, per-feature (or per-group) mean
    ``|attr|`` and mean ``attr``, where the mass sits, drift between runs, the trust checks and the time. Scalars go
    to every logger; a ``TensorBoardLogger`` also gets histograms, the pictures and a text report; W&B and MLflow
    get the pictures and the report.

    Runs happen every ``every_n_steps`` optimizer steps and/or every ``every_n_epochs`` epochs, and once more when
    training ends. The model, its noise, parameters and ``.grad``, the optimizer and the random generators are as
    they were after each run. Under DDP rank zero's states (and tensor baseline) are split across ranks and gathered
    with one collective call; only global rank zero logs and writes files. The options are fixed when the callback is
    made: assigning one raises ``AttributeError`` (make a new callback; ``dataclasses.replace`` the ``engine`` or
    ``views`` object).

    Args:
        states: ``(num_states, *feature_shape)``: a tensor, a ``.safetensors``/``.npy``/``.json`` file, or a
            callable ``(trainer, pl_module) -> Tensor`` called at set-up (the random generators put back after it).
        every_n_steps: Run every this many optimizer steps (default 100); ``None``: no step cadence.
        every_n_epochs: Run every this many epochs (default ``None``).
        run_at_train_end: Run once more when training ends (default ``True``).
        feature_names: One name per flattened feature; default ``x0, x1, ...`` (``x[c,i,j]``).
        feature_groups: ``"channels"``, ``"features"``, an integer mask (a tensor or array) or a dict
            ``{name: indices | bool mask}`` (:class:`~lightning_ig.FeatureGroups`); ``None`` (default): none up to
            ``views.max_logged_features`` features, beyond them ``"channels"`` for ``(C, ...)`` states, else blocks.
        group_names: Names for the groups (default ``channel 0``, ..., ``group <id>`` or the dict's keys).
        action_names: One name per output, for a target about actions (``"each"``, ``"contrast"``, an output index;
            default ``action 0``, ``action 1``, ...); counted against the model at fit start.
        baseline: ``"zeros"`` (default), ``"mean"`` of the held-out states, a finite number, or a tensor of shape
            ``feature_shape`` or ``(num_states, *feature_shape)``.
        target: ``"mean"`` (default: the mean of the outputs, or the output itself for one value per state), an
            output index, ``"each"`` (every action's ``Q(s, a)`` in one run, a row per (state, action); the trust
            checks judge the mean over the actions), ``"contrast"`` (``Q(greedy) - Q(runner-up)``, the pair chosen at
            each state; no deletion check) or a callable ``(N, A) -> (N,)``, as for
            :func:`~lightning_ig.attribution.integrated_gradients`.
        forward: ``None`` (default: the model's output, through ``target``) or a callable ``(pl_module, x) -> (N,)``
            (or ``(N, 1)``): the scalar attributed, computed your way (``target`` stays ``"mean"``).
        completeness_tol: The tolerance of the accuracy verdict and of ``n_steps="auto"`` (default 0.01).
        on_non_finite: ``"warn"`` (default: once; the error figures logged as ``inf``) or ``"raise"``
            (:class:`NonFiniteAttributionError`, which stops training) when the model produces NaN/Inf.
        report_dir: Folder for a JSON report per run; ``None`` (default): none, except without a logger
            (``<default_root_dir>/ig_reports``). Checked at set-up; a report that cannot be written later is warned
            about and training goes on.
        name: Tags under ``ig/<name>/`` and reports ``ig_report_<name>_step=...``; needed when two callbacks share a
            Trainer (default ``None``: ``ig/``).
        engine: How the engine attributes (:class:`~lightning_ig.attribution.IGOptions`: ``n_steps``, ``method``,
            ``gradient``, ``backend``, ``internal_batch_size``, ...); default ``None``: its defaults. The states are
            checked for NaN/Inf once. On a CPU, ``n_steps="budget"`` (the default) runs as ``n_steps="auto"``: the
            states whose estimated error is above half the tolerance (a quarter at 56) are refined (56, 168, 504 nodes).
        views: What the runs log and draw (:class:`~lightning_ig.views.ViewOptions`: ``top_k``, histograms, the
            pictures' cadences, ``max_logged_features``, the saliency grid); default ``None``: its defaults.
        overhead: The share of the fit's wall time the callback may add (default 0.02), measured online as its time
            on the training thread (runs, trust checks, the logging worker's waits) over the fit's wall time so far,
            logged as ``ig/overhead``. A run that would break it attributes a half or a quarter of the states
            (windows that rotate through them) and leaves the trust checks for later before it is deferred to a later
            step; the run says so (its report's ``budget``). The trust checks (:mod:`lightning_ig.trust`: randomisation
            sanity, deletion (not for ``"contrast"``) and noise stability for NoisyNet models, each over two units or
            more) all run at the first and the final run (which is full), between as the budget allows, on global
            rank zero, on a working copy of the model. ``None``: no budget, every run in full, no trust checks. Under
            DDP it is measured, never acted on.

    Raises:
        MisconfigurationException: No cadence or a non-positive one; at set-up, two callbacks with one ``name`` (two
            that also attribute one target are refused as the Trainer is made, by Lightning's state_key).
        TypeError, ValueError: A bad argument (the message names it): a value of the wrong kind is refused, never
            read as another (``run_at_train_end="no"`` is an error, not ``True``). At set-up: states that do not fit
            the model or (on a CPU) the memory, NaN/Inf in them, names or groups of the wrong size, a
            ``saliency_channel`` past the states' channels, a bad ``baseline``, ``target``, ``forward``, ``report_dir``.
        AttributeError: An option assigned after the callback is made.

    Example::

        ig = IntegratedGradientsCallback(
            states="held_out_states.npy",
            feature_names=["cart position", "cart velocity", "pole angle", "pole angular velocity"],
            every_n_steps=500,
            engine=IGOptions(n_steps=64),
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
        feature_groups: GroupSpec | None = None,
        group_names: Sequence[str] | None = None,
        action_names: Sequence[str] | None = None,
        baseline: Literal["zeros", "mean"] | float | Tensor = "zeros",
        target: str | int | Callable[[Tensor], Tensor] = "mean",
        forward: heldout.ForwardOption | None = None,
        completeness_tol: float = 0.01,
        on_non_finite: Literal["warn", "raise"] = "warn",
        report_dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        engine: IGOptions | None = None,
        views: ViewOptions | None = None,
        overhead: float | None = 0.02,
    ) -> None:
        super().__init__()
        given: dict[str, Any] = {key: value for key, value in locals().items() if key not in ("self", "__class__")}
        self.options = Options(**given)  # every argument checked once, kept as checked (callback/options.py)
        self.history: list[dict[str, Any]] = []  # one entry per run, kept across a resume (state_dict)
        self._last_run_step: int | None = None
        self._cadence: int | None = None  # step // every_n_steps at train start and each batch end: a run as it grows
        self._plan: fit.FitPlan | None = None  # set at set-up: the states, the units logged, the report folder
        self._fit: fit.Fit | None = None  # set at fit start: the engine, the outputs, the trust checks
        self._warned: set[str] = set()
        self._last: RunSummary | None = None
        self._pictures = PictureWriter()  # encodes and logs the pictures beside the training loop
        self._ever_non_zero: set[str] = set()  # count tags non-zero so far: logged from then on (state_dict)
        self._pending: fit.PendingRun | None = None  # a run started at the last batch end, ended at the next
        self._pairs: Any = None  # target="contrast": (B, 2) the last run's greedy and runner-up actions
        self._budget = Budget(None)  # made again at set-up (callback/budget.py)
        self._restored: dict[str, Any] | None = None  # the budget's state from a checkpoint, for on_fit_start
        self._trust_results: dict[str, Any] = {}  # the trust checks' latest results from a checkpoint, likewise
        self._depth = 0  # hooks entered and not left (a hook calling another is timed once)
        # Lightning's documented form of a state key: the class's qualified name and the repr of what identifies it;
        # made once (the options never change): Lightning reads it at every hook call of every step
        self._state_key = f"{type(self).__qualname__}{self.options.identity()!r}"
        # The trainer calls a callback's hook only where it is callable: None on the instance skips the no-ops (a
        # subclass's own hook is kept)
        for hook in _STEP_HOOKS:
            if getattr(type(self), hook) is getattr(Callback, hook):
                object.__setattr__(self, hook, None)

    __getattr__ = option_attribute  # callback.every_n_steps and the other options: self.options' (as checked)

    def __getstate__(self) -> dict[str, Any]:
        """A pickle (``ddp_spawn``, ``torch.save(trainer)``) leaves out what a fit holds: the next fit sets it up."""
        return {**vars(self), "_fit": None, "_pending": None}

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name == "history":  # its own state, set by every run: no option is named so
            object.__setattr__(self, name, value)
        else:
            option_assignment(self, name, value)  # an option is never assigned: a fit is set up from them once

    # ------------------------------------------------------------------ Lightning plumbing

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    @override
    @_timed
    def state_dict(self) -> dict[str, Any]:
        self._finish_pending()  # a checkpoint holds every run started before it
        seen = self._ever_non_zero if self._fit is None else self._fit.outputs.ever_non_zero
        trust = self._fit.trust if self._fit is not None else None
        return {
            "history": [dict(entry) for entry in self.history],
            "last_run_step": self._last_run_step,
            "ever_non_zero": sorted(seen),
            "budget": self._budget.state_dict(),  # the measure, and the trust checks' schedule
            "trust_results": self._trust_results if trust is None else trust.results_state(),
            "held_out": None if self._plan is None else self._plan.identity,  # what the history is about
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(entry) for entry in state_dict.get("history", [])]
        self._restored = state_dict.get("budget")
        if self._plan is not None and self.history:  # restored after the fit's set-up: what a history is about is known
            self.history = setup.history_to_continue(self.history, self._plan.identity, state_dict, self.options.name)
            if not self.history and self._restored is not None:  # a new history: its checks start afresh, as a fit's
                self._restored = {**self._restored, "last_checks": {}}
        self._last_run_step = state_dict.get("last_run_step")
        self._ever_non_zero = set(state_dict.get("ever_non_zero", ()))
        self._trust_results = dict(state_dict.get("trust_results", {}))

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # before load_state_dict: the state under an earlier version's key is moved to this one's
        setup.take_earlier_state(checkpoint.get("callbacks") or {}, self.state_key, self.options.identity())

    @override
    @_timed
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == TrainerFn.FITTING:
            continued = self.state_dict() if trainer.global_step and self._fit is not None else None  # its trainer's
            share = self.options.overhead if trainer.world_size == 1 else None  # ranks must make the same runs
            # background: the pictures' thread alone (training's own threads, autograd's on a GPU, are not IG's)
            self._budget = Budget(share, background=self._pictures.cpu_seconds)
            self._budget.start()
            self._plan = fit.plan(self.options, trainer, pl_module, [c.options.name for c in _siblings(trainer)])
            # A new fit starts afresh (a callback reused by a second Trainer too); a resume restores all of it next
            self._last_run_step, self._last, self._pairs, self._cadence = None, None, None, None
            self.history, self._ever_non_zero, self._warned, self._restored = [], set(), set(), None
            globals().pop("__warningregistry__", None)  # a fit says its own: Python says a text once at a place
            self._trust_results = {}
            if continued is not None:  # trainer.fit again on a trainer that has trained: as a resume from there
                self.load_state_dict(continued)

    @override
    @_timed
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._plan is None:  # setup was not called for fitting (a bare hook call)
            self.setup(trainer, pl_module, TrainerFn.FITTING)
        if self._plan is None:
            raise RuntimeError("IntegratedGradientsCallback: set-up did not run before the fit started")
        if self._restored is not None:  # after setup: Lightning restores the callbacks in between
            self._budget.load_state_dict(self._restored)
            self._budget.start()
            self._restored = None
        if self._plan.reports is not None and trainer.ckpt_path is None:  # a resumed fit continues its reports
            setup.warn_of_earlier_reports(self._plan.reports, self.options.name, trainer.global_step)
        self._fit = fit.start(
            self.options,
            self._plan,
            trainer,
            pl_module,
            pictures=self._pictures,
            ever_non_zero=self._ever_non_zero,
            pairs=lambda: self._pairs,
        )
        if self._fit.trust is not None and self.history:  # the checks' latest results stand until they run again
            self._fit.trust.restore_results(self._trust_results)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        every = self.options.every_n_steps  # multiples crossed from the step training starts at (a resume's) on: a
        self._cadence = None if every is None else trainer.global_step // every  # first batch may step several times

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning calls this at every step and most have nothing to do: a few attribute reads answer them, outside
        # the timed hook (its clock reads and bookkeeping cost more than the question).
        every, step = self.options.every_n_steps, trainer.global_step
        owed = self._budget.owed and self._budget.retry_due()  # an attribute read on the common step, no call
        if self._pending is None and not owed and (every is None or step // every == self._cadence):
            return
        self._batch_end(trainer, pl_module, (batch_idx + 1) / trainer.num_training_batches)

    @_timed
    def _batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch_done: float) -> None:
        """A batch end with something to do: end a run that has landed, start one the cadence or the budget owes
        (``epoch_done``: the share of the epoch's batches done)."""
        step, every, now = trainer.global_step, self.options.every_n_steps, self._budget.clock()
        self._budget.quiet_from(step, now)  # training's own pace is measured from the first such batch end
        self._finish_pending(landed=True)  # a run started steps ago whose numbers have landed (never waits)
        cadence = every is not None and self._cadence is not None and step > 0 and step // every > self._cadence
        self._cadence = None if every is None else step // every
        if (cadence or self._budget.retry_due()) and self._should_run(trainer):  # a run the budget deferred
            progress = _progress(trainer, epoch_done)
            plan = self._budget_plan(trainer, progress, final=(last := (progress or 0.0) >= 1.0), retry=not cadence)
            if plan is None:
                return
            # Ended at a later batch end (the device or the worker attributes beside the next steps), or at once where
            # a trust check needs the model as attributed and under DDP (every rank raises on NaN/Inf at one step).
            pending = self._start(trainer, pl_module, plan, final=last)  # the fit's last step: no run follows it
            if (plan.checks and pending.weights is None) or trainer.world_size > 1:
                self._finish(pending)
            else:  # beside the next steps: what they lose counts (the budget's beside_from and landed)
                self._budget.beside_from(step, now)
                self._pending = pending

    @override
    @_timed
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        every = self.options.every_n_epochs
        self._finish_pending()
        if every is not None and (trainer.current_epoch + 1) % every == 0 and self._should_run(trainer):
            self._run(trainer, pl_module, final=(_progress(trainer, 1.0) or 0.0) >= 1.0)  # the last epoch's: final

    @override
    @_timed
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish_pending()
        self._budget.settle(trainer.global_step, self._budget.clock())  # a run beside training measured, unbooked
        record = {} if self._last is None else self._last.budget or {}
        shortened = record.get("windows", 1) > 1 or bool(record.get("waiting"))
        if self.options.run_at_train_end and self._last_run_step == trainer.global_step and shortened:
            self.history.pop()  # ended unannounced (early stopping, max_time) at a run the budget shortened: the
            self._last_run_step = None  # closing answer is made again, in full
        if self.options.run_at_train_end and self._should_run(trainer):
            self._run(trainer, pl_module, final=True)
        elif self._last is not None and self._fit is not None and trainer.is_global_zero:
            self._fit.outputs.log(trainer.loggers, self._last, None, self.history, final=True)  # the last pictures
        self._pictures.close()  # every picture in the writer's queue before the logger closes
        if not self.history and not self.options.run_at_train_end:  # a fit shorter than the cadence
            rank_zero_warn(
                f"IntegratedGradientsCallback{setup.named(self.options.name)}: no run in this fit: it "
                f"ended at step {trainer.global_step}, before the first, and run_at_train_end is off"
            )
        losses = None if self._plan is None or self._plan.reports is None else self._plan.reports.losses()
        if losses is not None:
            rank_zero_warn(f"IntegratedGradientsCallback{setup.named(self.options.name)}: {losses}")

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        named = setup.named(self.options.name)
        if isinstance(exception, KeyboardInterrupt) and self._fit is not None and self._fit.idle is not None:
            self._fit.idle.interrupted = "Ctrl-C"  # a run the worker still makes: waited for a second at most
        try:
            self._finish_pending()  # the run started before the exception is still logged
        except Exception as error:  # noqa: BLE001 - the training's own exception is the one to see
            rank_zero_warn(f"IntegratedGradientsCallback{named}: the last run could not be logged: {error!r}")
        self._release_fit()
        try:
            self._pictures.close()  # the pictures drawn so far still reach TensorBoard
        except Exception as error:  # noqa: BLE001 - the training's own exception is the one to see
            rank_zero_warn(f"IntegratedGradientsCallback{named}: a picture could not be logged: {error!r}")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._pending = None  # ended by on_train_end or on_exception; a bare teardown drops nothing logged twice
        self._release_fit()
        self._pictures.close()

    def _release_fit(self) -> None:
        """At teardown, and on an exception (no teardown follows): end the runs' worker (its last run read first, where
        it could be) and let go of what only runs use: the copies of the model, the worker's trainer, the graphs."""
        if self._fit is not None:  # what state_dict, the history and a later fit read stays
            for held in (self._fit.idle, self._fit.trust):  # the worker ended, the copies of the model let go
                if held is not None:
                    held.close()
            self._fit.engine.clear()  # its captured graphs and their memory
            self._fit = dataclasses.replace(self._fit, idle=None)  # the worker's trainer, the training thread's runs

    def _should_run(self, trainer: pl.Trainer) -> bool:
        """Fitting, not sanity checking, set up, and no run yet at this global step."""
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        return fitting and self._fit is not None and self._last_run_step != trainer.global_step

    # ------------------------------------------------------------------ a run

    def _run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, final: bool) -> None:
        """One run from start to end, as the budget allows: attribute, gather, summarize, log (see :meth:`_start` and
        :meth:`_finish`)."""
        plan = self._budget_plan(trainer, _progress(trainer, 1.0), final=final)  # at an epoch's end, or training's
        if plan is not None:  # ended at once: the worker gains nothing
            self._finish(self._start(trainer, pl_module, plan, final=final, beside=False))

    def _budget_plan(
        self, trainer: pl.Trainer, progress: float | None, *, final: bool, retry: bool = False
    ) -> Plan | None:
        """What this run does within the budget (``None``: deferred to a later batch end; ``progress``: see
        :func:`_progress`); a run still pending ends first (its cost is booked, its index counted)."""
        self._finish_pending()
        run = self._fit
        if run is None:  # pragma: no cover - _should_run checked it
            raise RuntimeError("IntegratedGradientsCallback: a run outside a fit")
        one_row = run.target.rows_per_state == 1 and not run.target.contrasts
        can_window = trainer.world_size == 1 and one_row and len(run.states) >= _MIN_WINDOWED_STATES
        names = () if run.trust is None else tuple(run.trust.names)
        run_index = len(self.history)
        return self._budget.plan(run_index, names, progress=progress, final=final, can_window=can_window, retry=retry)

    def _start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, plan: Plan, *, final: bool, beside: bool = True
    ) -> fit.PendingRun:
        """Attribute, gather, queue the copy to the host without waiting; a run still pending ends first (in order).
        ``beside``: on the runs' worker where the fit has one (not for a run ended at once)."""
        self._finish_pending()
        run = self._fit
        if run is None:  # pragma: no cover - _should_run checked it
            raise RuntimeError("IntegratedGradientsCallback: a run outside a fit")
        started, entered = time.perf_counter(), self._budget.clock()
        states, baselines = run.states, run.baselines
        if plan.windows > 1:  # plan.rows: the pictures' first rows, then this window; sliced where they are (no sync)
            first, window = run.sample_states, slice(run.sample_states + plan.window, None, plan.windows)
            states = torch.cat([states[:first], states[window]])
            if isinstance(baselines, Tensor) and baselines.shape == run.states.shape:
                baselines = torch.cat([baselines[:first], baselines[window]])
        begin = functools.partial(
            HostResult.begin,
            num_states=(len(run.held_out) if plan.windows == 1 else len(states)) * run.target.rows_per_state,
            groups=run.units.groups,
            keep_attributions=run.keep_attributions,
            sample_states=run.sample_states,
        )
        riders: list[Tensor] = []  # gathered with the result: one collective
        transfer: HostTransfer | fit.ProcessTransfer | None = None
        weights = None
        if run.idle is not None and run.idle.alive and beside and not final:  # its checks read the copy it was sent
            transfer = run.idle.start(states, baselines, run.target.every_output, begin, plan.checks)
            weights = run.idle.replica.module if transfer is not None else None
        if transfer is None:
            with attribution_mode(pl_module), stochastic_warnings_silenced():  # generators kept; warned once
                result = run.engine.attribute(states, baselines=baselines)
                if run.target.every_output:  # "each": (A, share, ...) as a row per (state, action), state-major
                    result = pair_rows(result)
            if run.target.contrasts and result.target_actions is not None:  # each state's pair, for the actions picture
                riders.append(result.target_actions)  # (share, 2)
            gather = JointGather(trainer.strategy.all_gather, riders) if trainer.world_size > 1 else None
            transfer = begin(result, gather=gather)
            riders = riders if gather is None else gather.riders  # (world * share, W) each, padding rows included
        self._last_run_step = trainer.global_step
        # current_epoch is one past the weights' at training's end: the only hook where both counts are complete
        epochs, batches = trainer.fit_loop.epoch_progress.current, trainer.fit_loop.epoch_loop.batch_progress.current
        ended = (epochs.processed, batches.ready) == (epochs.completed, batches.completed)  # type: ignore[attr-defined]
        return fit.PendingRun(
            run=run,
            trainer=trainer,
            transfer=transfer,
            riders=riders,
            step=trainer.global_step,
            epoch=trainer.current_epoch - ended,  # (Lightning's `ready` count of epochs lags after a resume)
            final=final,
            held_ms=(time.perf_counter() - started) * 1e3,
            plan=plan,
            held=self._budget.clock() - entered,
            weights=weights,
        )

    def _finish_pending(self, *, landed: bool = False) -> None:
        """End the pending run, if any; with ``landed`` only if its numbers have landed (asked, never waited for)."""
        pending = self._pending
        if pending is not None and not (landed and not pending.transfer.ready()):
            self._pending = None
            self._finish(pending, lost=self._budget.landed(pending.trainer.global_step, self._budget.clock()))

    def _finish(self, pending: fit.PendingRun, *, lost: float = 0.0) -> None:
        """Summarize a started run; on rank zero warn, log and write the report; then check for NaN/Inf (``lost``:
        what the steps beside the run lost, part of its cost)."""
        trainer, run, num_states = pending.trainer, pending.run, len(pending.run.held_out)
        started, entered, plan, budget = time.perf_counter(), self._budget.clock(), pending.plan, self._budget
        if (host := pending.transfer.result()) is None:  # lost with the runs' worker as the fit ends on SIGTERM (said)
            return
        if run.target.contrasts:  # the last rider: the pairs, for the actions picture
            self._pairs = pending.riders[-1][:num_states].to("cpu", torch.int64).numpy()
        time_ms = pending.held_ms + (time.perf_counter() - started) * 1e3  # the time the run held the training loop
        units = run.units
        summary = summarize(
            host,
            feature_names=units.names,
            log_features=units.log_features,
            settings=run.settings,
            step=pending.step,
            history=self.history,
            time_ms=time_ms,
        )
        note, checks = plan.note(budget.share), 0.0
        scalars: dict[str, float] = {}
        if run.trust is not None:  # the monitor at the runs that make a check; the others carry its last verdict
            if plan.checks or pending.final or not run.trust.carried or summary.stochastic:  # a random forward fails
                before, made, checking = dict(run.trust.seconds), set(budget.last_checks), budget.clock()
                with generators_kept(pending.trainer.lightning_module):
                    beside = pending.transfer.checks if isinstance(pending.transfer, fit.ProcessTransfer) else None
                    summary, scalars = run.trust.step(
                        host,
                        summary,
                        plan.checks,
                        final=pending.final,
                        note=note,
                        weights=pending.weights,
                        beside=beside,
                    )
                checks = budget.clock() - checking
                seconds = {key: value - before[key] for key, value in run.trust.seconds.items()}
                for name in plan.checks:  # each its share of the step (the first, the working copy and reference too)
                    pieces = (name, "replica", "reference") if name == plan.checks[0] else (name,)
                    share = sum(seconds[piece] for piece in pieces) / max(sum(seconds.values()), 1e-9)
                    budget.checked(name, checks * share, len(self.history), first=name not in made)
            else:
                verdict, scalars = run.trust.carried[summary.completeness.accuracy.within]
                if note is not None:  # what the budget did at this run, in the verdict's text
                    verdict = dataclasses.replace(verdict, upcoming=note)
                summary = dataclasses.replace(summary, trust_checks=verdict)
        overhead = budget.fraction()
        record: dict[str, Any] = {"overhead": overhead, "limit": budget.share, "states": summary.num_states}
        record.update(note=note)
        record.update(windows=plan.windows, window=plan.window, state_indices=plan.rows(run.sample_states, num_states))
        record.update(checks=list(plan.checks), waiting=list(plan.waiting))
        record.update(deferred=plan.deferred, reduced_runs=budget.reduced, deferred_runs=budget.deferred)
        tagged = {**scalars, f"{run.units.tags.prefix}/overhead": overhead}
        summary = dataclasses.replace(summary, trust_scalars=tagged, budget=record)
        self.history.append({**summary.history_entry(pending.epoch), "overhead": overhead})
        self._last = summary
        if trainer.is_global_zero:
            self._warn(summary)
            run.outputs.log(trainer.loggers, summary, host, self.history, final=pending.final)
            if run.reports is not None:
                names, label, epoch = run.units.names, run.target.label, pending.epoch
                run.reports.write_run(summary, host, names, label, epoch, trainer.world_size)
        budget.ran(plan.windows, pending.held + budget.clock() - entered - checks + lost)
        if summary.completeness.num_non_finite and self.options.on_non_finite == "raise":  # on every rank: none waits
            raise NonFiniteAttributionError(
                f"IntegratedGradientsCallback{setup.named(self.options.name)}: {text.troubles(summary)['non-finite']}; "
                "training stopped (on_non_finite='raise')"
            )

    def _warn(self, summary: RunSummary) -> None:
        """Each kind of trouble once (NaN/Inf, nothing checked, completeness above tolerance, a random forward)."""
        if not summary.troubles():  # a steady run never enters the text module
            return
        for kind, message in text.troubles(summary).items():
            if kind not in self._warned:
                self._warned.add(kind)
                rank_zero_warn(f"IntegratedGradientsCallback{setup.named(self.options.name)}: {message} (warned once)")


def _progress(trainer: pl.Trainer, epoch_done: float) -> float | None:
    """The share of the fit done, ``epoch_done`` of the current epoch's batches done, by the bound that ends it first
    (1.0 or more at its last batch): ``max_steps``, in optimizer steps as ``global_step`` counts them (under manual
    optimisation each optimizer's, none on a batch that steps none), or ``max_epochs``; ``None``: neither bounds it."""
    done = [trainer.global_step / trainer.max_steps] if trainer.max_steps > 0 else []
    if (epochs := trainer.max_epochs or 0) > 0:
        done.append((trainer.current_epoch + epoch_done) / epochs)
    return max(done, default=None)


def _siblings(trainer: Any) -> list[IntegratedGradientsCallback]:
    return [callback for callback in trainer.callbacks if isinstance(callback, IntegratedGradientsCallback)]
