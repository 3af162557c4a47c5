"""Training-time Integrated Gradients: a Lightning callback that watches what the model relies on.

While a model trains, :class:`IntegratedGradientsCallback` periodically runs
Integrated Gradients on a fixed, held-out batch of input states, with
NoisyNet exploration noise switched off and the model in eval mode, and logs
per-feature attributions, the completeness error and drift between runs
(see :mod:`lightning_ig.tensorboard` for the tags). Every run leaves training
exactly as it found it: model mode, noise, parameters and their ``.grad``,
optimizer state and random generators.

The callback only orchestrates: the engine is
:class:`~lightning_ig.attribution.IntegratedGradients`, the statistics and the
JSON report come from :mod:`lightning_ig.report`, the logging from
:mod:`lightning_ig.tensorboard`.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

import lightning.pytorch as pl
from lightning_ig import report as reports
from lightning_ig import tensorboard as tb
from lightning_ig.attribution import IntegratedGradients, check_finite
from lightning_ig.noise import noise_disabled
from lightning_ig.quadrature import METHODS

__all__ = ["IntegratedGradientsCallback"]

StatesSource = Union[Tensor, str, "os.PathLike[str]", Callable[["pl.Trainer", "pl.LightningModule"], Tensor]]
TargetSpec = Union[Literal["mean"], int, Callable[["pl.LightningModule", Tensor], Tensor]]

# "auto" figures: drawn at the last run, and before it only while the time spent drawing them stays
# under this share of the training's wall time; the first drawing is assumed to cost this much.
_FIGURE_TIME_SHARE = 0.005
_FIRST_FIGURE_SECONDS = 0.25


class IntegratedGradientsCallback(Callback):
    r"""Run Integrated Gradients on held-out states during training and log what the model relies on.

    Each run attributes a scalar of the model (by default the mean over its
    outputs, which is ``V(s)`` for a dueling Q-network) to the input features
    of every held-out state, then logs:

    * to every logger (``log_metrics``): ``ig/mean_abs/<feature>``,
      ``ig/mean_signed/<feature>``, ``ig/completeness/worst_relative_error``,
      ``ig/completeness/mean_abs_error``, ``ig/drift/spearman_prev``,
      ``ig/drift/spearman_first``, ``ig/drift/topk_jaccard_prev`` and ``ig/time_ms``;
    * to a ``TensorBoardLogger`` also: histograms ``ig/attributions/<feature>``,
      the figures ``ig/top_features`` and ``ig/heatmap``, the text ``ig/report``
      and a custom-scalars layout that groups the per-feature lines;
    * to ``report_dir``: a schema-version-1 JSON report per run.

    Runs happen every ``every_n_steps`` optimizer steps and/or every
    ``every_n_epochs`` epochs, and once more when training ends. During a run
    the model is in eval mode with its noisy layers deterministic
    (:func:`~lightning_ig.noise.noise_disabled`); afterwards the model's mode,
    noise, parameters, their ``.grad``, the optimizer state and the random
    generators (torch CPU and CUDA, numpy, python) are as they were, so training
    with the callback gives bit-identical weights to training without it.

    Under DDP the held-out states are split across ranks (the last rank's share
    padded to the same size), the results all-gathered, and only global rank
    zero logs and writes files. Every rank makes the same collective calls.

    Args:
        states: The held-out states ``(num_states, *feature_shape)``: a tensor; a
            path to a ``.safetensors`` (tensor ``__states__``, ``states`` or the
            only one), ``.npy`` or ``.json`` (``{"states": [[...], ...]}``) file;
            or a callable ``(trainer, pl_module) -> Tensor`` called at setup.
        every_n_steps: Run every this many optimizer steps (default 100); ``None``
            for no step cadence.
        every_n_epochs: Run at the end of every this many training epochs
            (default ``None``: no epoch cadence).
        run_at_train_end: Run once more when training ends (default ``True``),
            unless a run already happened at that step.
        feature_names: One name per (flattened) feature; default ``x0, x1, ...``.
        baseline: ``"zeros"`` (default), ``"mean"`` (the mean of all held-out
            states), or a tensor of shape ``feature_shape`` or
            ``(num_states, *feature_shape)``.
        target: What to attribute: ``"mean"`` (default: the mean over the model's
            outputs, or the output itself when the model returns one value per
            state), an output index (e.g. an action), or a callable
            ``(pl_module, x) -> (N,)``.
        n_steps: Quadrature points along the path (default 50), or ``"auto"``
            (refine until the completeness error is below ``completeness_tol``).
        method: Quadrature rule: ``"gausslegendre"`` (default), ``"riemann_left"``,
            ``"riemann_right"``, ``"riemann_middle"``, ``"riemann_trapezoid"``.
        gradient: ``"autograd"`` (default) or ``"finite_difference"``.
        backend: ``"auto"`` (default: CUDA kernels on a CUDA model when CuPy is
            installed), ``"cuda"`` or ``"torch"``.
        internal_batch_size: Rows per forward inside the engine; ``None``
            (default) picks it from free memory.
        top_k: Features in the top-k table, chart and Jaccard drift (default 10).
        completeness_tol: Warn (once, on rank zero) when the worst relative
            completeness error exceeds this (default 0.01); also the target of
            ``n_steps="auto"``.
        report_dir: Folder for a JSON report per run
            (``ig_report_step=<step>.json``). ``None`` (default): no reports,
            except without a logger, where they go to
            ``<default_root_dir>/ig_reports`` so the results are not lost.
        log_histograms: Log per-feature histograms to TensorBoard (default ``True``).
        figure_every_n_runs: Draw ``ig/top_features`` and ``ig/heatmap`` every
            this many runs, counting from the first, and at the last run.
            ``"auto"`` (default) draws them at the last run and, before it, as
            often as keeps the drawing under 0.5% of the training's wall time
            (matplotlib takes tens of milliseconds per figure, a few hundred
            for the first): in a long run every half minute or so, in a
            run of seconds only at the end. ``None`` draws none.

    Raises:
        MisconfigurationException: No cadence at all, or a non-positive cadence.
        TypeError: An argument of the wrong type (the message names it).
        ValueError: A bad value: unknown ``method``/``gradient``/``backend``,
            ``n_steps < 1``, ``top_k < 1``, negative ``target``, non-finite states.
            At setup / fit start (before the first training step): states whose
            feature shape does not fit the model, NaN/Inf in the states,
            ``feature_names`` of the wrong length, a ``baseline`` of the wrong
            shape, or a ``target`` index the model's output does not have.

    Example::

        from lightning.pytorch import Trainer
        from lightning_ig import IntegratedGradientsCallback

        ig = IntegratedGradientsCallback(
            states="held_out_states.npy",
            feature_names=["cart position", "cart velocity", "pole angle", "pole angular velocity"],
            every_n_steps=500,
        )
        Trainer(callbacks=[ig]).fit(model, datamodule)
    """

    def __init__(
        self,
        states: StatesSource,
        *,
        every_n_steps: int | None = 100,
        every_n_epochs: int | None = None,
        run_at_train_end: bool = True,
        feature_names: Sequence[str] | None = None,
        baseline: Literal["zeros", "mean"] | Tensor = "zeros",
        target: TargetSpec = "mean",
        n_steps: int | Literal["auto"] = 50,
        method: Literal[
            "gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"
        ] = "gausslegendre",
        gradient: Literal["autograd", "finite_difference"] = "autograd",
        backend: Literal["auto", "cuda", "torch"] = "auto",
        internal_batch_size: int | None = None,
        top_k: int = 10,
        completeness_tol: float = 0.01,
        report_dir: str | os.PathLike[str] | None = None,
        log_histograms: bool = True,
        figure_every_n_runs: int | Literal["auto"] | None = "auto",
    ) -> None:
        super().__init__()
        if not (isinstance(states, (Tensor, str, os.PathLike)) or callable(states)):
            raise TypeError(
                "states must be a tensor (num_states, *feature_shape), a path to a .safetensors/.npy/.json file, "
                f"or a callable (trainer, pl_module) -> Tensor; got {type(states).__name__}"
            )
        if isinstance(states, Tensor):
            _check_states(states, "states")
        self.every_n_steps = _check_cadence(every_n_steps, "every_n_steps")
        self.every_n_epochs = _check_cadence(every_n_epochs, "every_n_epochs")
        if self.every_n_steps is None and self.every_n_epochs is None:
            raise MisconfigurationException(
                "IntegratedGradientsCallback needs a cadence: set every_n_steps (e.g. 100) and/or every_n_epochs "
                "(e.g. 1); both are None"
            )
        if feature_names is not None:
            if isinstance(feature_names, str) or not all(isinstance(name, str) for name in feature_names):
                raise TypeError(f"feature_names must be a sequence of strings, got {feature_names!r}")
            feature_names = list(feature_names)
        if isinstance(baseline, str):
            if baseline not in ("zeros", "mean"):
                raise ValueError(f"baseline must be 'zeros', 'mean' or a tensor, got {baseline!r}")
        elif isinstance(baseline, Tensor):
            if not baseline.is_floating_point():
                raise TypeError(f"baseline must be a floating-point tensor, got dtype {baseline.dtype}")
        else:
            raise TypeError(f"baseline must be 'zeros', 'mean' or a tensor, got {type(baseline).__name__}")
        if isinstance(target, bool) or not (target == "mean" or isinstance(target, int) or callable(target)):
            raise ValueError(
                "target must be 'mean', an output index (int >= 0) or a callable (pl_module, x) -> (N,), "
                f"got {target!r}"
            )
        if isinstance(target, int) and target < 0:
            raise ValueError(f"target must be an output index >= 0, got {target}")
        if n_steps != "auto" and (isinstance(n_steps, bool) or not isinstance(n_steps, int)):
            raise TypeError(f"n_steps must be an int >= 1 or 'auto', got {type(n_steps).__name__} ({n_steps!r})")
        if isinstance(n_steps, int) and n_steps < 1:
            raise ValueError(f"n_steps must be >= 1 or 'auto', got {n_steps}; 50 is a good default")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if gradient not in ("autograd", "finite_difference"):
            raise ValueError(f"gradient must be 'autograd' or 'finite_difference', got {gradient!r}")
        if backend not in ("auto", "cuda", "torch"):
            raise ValueError(f"backend must be 'auto', 'cuda' or 'torch', got {backend!r}")
        if internal_batch_size is not None and (
            isinstance(internal_batch_size, bool) or not isinstance(internal_batch_size, int) or internal_batch_size < 1
        ):
            raise ValueError(f"internal_batch_size must be None or an int >= 1, got {internal_batch_size!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
        tol_is_number = isinstance(completeness_tol, (int, float)) and not isinstance(completeness_tol, bool)
        if not tol_is_number or not completeness_tol > 0:
            raise ValueError(f"completeness_tol must be a positive number, got {completeness_tol!r}")
        if report_dir is not None and not isinstance(report_dir, (str, os.PathLike)):
            raise TypeError(f"report_dir must be a path or None, got {type(report_dir).__name__}")
        if figure_every_n_runs not in ("auto", None) and (
            isinstance(figure_every_n_runs, bool) or not isinstance(figure_every_n_runs, int) or figure_every_n_runs < 1
        ):
            raise ValueError(f"figure_every_n_runs must be 'auto', None or an int >= 1, got {figure_every_n_runs!r}")

        self.states = states
        self.run_at_train_end = bool(run_at_train_end)
        self.feature_names = feature_names
        self.baseline = baseline
        self.target = target
        self.n_steps = n_steps
        self.method = method
        self.gradient = gradient
        self.backend = backend
        self.internal_batch_size = internal_batch_size
        self.top_k = top_k
        self.completeness_tol = float(completeness_tol)
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.log_histograms = bool(log_histograms)
        self.figure_every_n_runs = figure_every_n_runs

        # Kept across a resume (state_dict): one entry per run, for drift and the heatmap.
        self.history: list[dict[str, Any]] = []
        self._last_run_step: int | None = None
        # Set at setup / fit start.
        self._held_out: Tensor | None = None  # (B, *feature_shape) on the CPU, float32
        self._names: list[str] = []
        self._tags: list[str] = []
        self._engine: IntegratedGradients | None = None
        self._local_states: Tensor | None = None  # this rank's share, on the model's device
        self._local_baselines: Tensor | str = "zeros"
        self._report_dir: Path | None = None
        self._target_label = "mean"
        self._warned_completeness = False
        self._layout_written = False
        self._fit_started_at = 0.0
        self._figure_seconds = 0.0
        self._last_figure_cost = 0.0
        self._figures_step: int | None = None
        self._last_stats: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ Lightning plumbing

    @property
    @override
    def state_key(self) -> str:
        target = self.target if isinstance(self.target, (str, int)) else _callable_name(self.target)
        return self._generate_state_key(
            target=target, every_n_steps=self.every_n_steps, every_n_epochs=self.every_n_epochs
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "history": [dict(entry) for entry in self.history],
            "last_run_step": self._last_run_step,
            "feature_names": list(self._names),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(entry) for entry in state_dict.get("history", [])]
        self._last_run_step = state_dict.get("last_run_step")
        if self._names and state_dict.get("feature_names") and state_dict["feature_names"] != self._names:
            rank_zero_warn(
                "IntegratedGradientsCallback: the checkpoint's history was recorded for features "
                f"{state_dict['feature_names']}, not {self._names}; drift is measured against it anyway "
                "where the number of features matches"
            )

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage != TrainerFn.FITTING:
            return
        states = self._resolve_states(trainer, pl_module)
        feature_shape = tuple(states.shape[1:])
        num_features = int(math.prod(feature_shape))
        if self.feature_names is not None and len(self.feature_names) != num_features:
            raise ValueError(
                f"feature_names has {len(self.feature_names)} names but the states have {num_features} features "
                f"(feature shape {feature_shape}); pass one name per feature"
            )
        if isinstance(self.baseline, Tensor) and tuple(self.baseline.shape) not in (feature_shape, tuple(states.shape)):
            raise ValueError(
                f"baseline has shape {tuple(self.baseline.shape)} but the states have shape {tuple(states.shape)}; "
                f"pass one baseline of shape {feature_shape} or one per state of shape {tuple(states.shape)}"
            )
        if isinstance(self.baseline, Tensor):
            _check_states(self.baseline.reshape(-1, *feature_shape), "baseline")
        self._held_out = states
        self._last_run_step = None  # a new fit counts steps from zero; a resumed one gets it back from the checkpoint
        self._names = list(self.feature_names) if self.feature_names is not None else reports.default_feature_names(
            feature_shape
        )
        self._tags = tb.feature_tags(self._names)
        self._report_dir = self.report_dir
        if not trainer.loggers:
            if self._report_dir is None:
                self._report_dir = Path(trainer.default_root_dir) / "ig_reports"
            rank_zero_info(
                "IntegratedGradientsCallback: the trainer has no logger, so nothing is logged; "
                f"the JSON report of each run goes to {self._report_dir}"
            )

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._held_out is None:  # setup was not called for fitting (a bare hook call)
            self.setup(trainer, pl_module, TrainerFn.FITTING)
        assert self._held_out is not None
        device = pl_module.device
        dtype = next((p.dtype for p in pl_module.parameters() if p.is_floating_point()), torch.float32)
        forward, engine_target = self._check_model(pl_module, device, dtype)
        # The report's forward_target, named as the lightning-ig command names it.
        if engine_target is None:
            self._target_label = "output" if forward is pl_module else f"callable:{_callable_name(self.target)}"
        else:
            self._target_label = "mean" if engine_target == "mean" else f"action:{engine_target}"
        self._engine = IntegratedGradients(
            forward,
            target=engine_target,
            n_steps=self.n_steps,
            method=self.method,
            gradient=self.gradient,
            backend=self.backend,
            internal_batch_size=self.internal_batch_size,
            completeness_tol=self.completeness_tol,
        )
        # A two-state trial through the engine, eagerly: a backend, gradient mode or forward that cannot work
        # fails here, before training, not at the first run (and CUDA kernels compile now, not mid-training).
        trial_baselines = self._local_baselines_for(torch.arange(min(2, self._held_out.shape[0])), device, dtype)
        with _isolated(pl_module):
            self._engine.attribute(
                self._held_out[:2].to(device=device, dtype=dtype),
                baselines=trial_baselines,
                n_steps=2,
                cuda_graph=False,
            )
        # This rank's share of the states, padded to ceil(B / world) rows by repeating the last state so that
        # every rank attributes (and all-gathers) the same shape.
        num_states = self._held_out.shape[0]
        world, rank = max(1, trainer.world_size), trainer.global_rank
        share = -(-num_states // world)
        rows = torch.arange(rank * share, (rank + 1) * share).clamp_(max=num_states - 1)  # (share,)
        self._local_states = self._held_out[rows].to(device=device, dtype=dtype).contiguous()
        self._local_baselines = self._local_baselines_for(rows, device, dtype)
        if self.history and len(self.history[0]["mean_abs"]) != len(self._names):
            rank_zero_warn(
                "IntegratedGradientsCallback: the restored history has "
                f"{len(self.history[0]['mean_abs'])} features, the states have {len(self._names)}; "
                "starting a new history"
            )
            self.history = []
        self._fit_started_at = time.perf_counter()
        self._figure_seconds = 0.0

    def _local_baselines_for(self, rows: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor | str:
        """The baselines of the held-out states ``rows``, as the engine takes them."""
        assert self._held_out is not None
        if isinstance(self.baseline, Tensor):
            baseline = self.baseline.detach().to("cpu", torch.float32)
            if baseline.shape == self._held_out.shape:
                baseline = baseline[rows]  # one baseline per state: this rank's rows
            return baseline.to(device=device, dtype=dtype).contiguous()
        if self.baseline == "mean":
            # The mean over all held-out states (not this rank's share), in float64: the same on every rank.
            mean = self._held_out.double().mean(dim=0)  # (*feature_shape)
            return mean.to(device=device, dtype=dtype).contiguous()
        return "zeros"

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.every_n_steps is not None and step > 0 and step % self.every_n_steps == 0 and self._should_run(trainer):
            self._run(trainer, pl_module, final=False)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if (
            self.every_n_epochs is not None
            and (trainer.current_epoch + 1) % self.every_n_epochs == 0
            and self._should_run(trainer)
        ):
            self._run(trainer, pl_module, final=False)

    @override
    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.run_at_train_end and self._should_run(trainer):
            self._run(trainer, pl_module, final=True)
        elif self._engine is not None and self._last_run_step == trainer.global_step:
            self._final_figures(trainer)

    def _should_run(self, trainer: "pl.Trainer") -> bool:
        """Fitting, not sanity checking, set up, and no run yet at this global step."""
        return (
            trainer.state.fn == TrainerFn.FITTING
            and not trainer.sanity_checking
            and self._engine is not None
            and self._last_run_step != trainer.global_step
        )

    # ------------------------------------------------------------------ a run

    def _run(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", *, final: bool) -> None:
        assert self._engine is not None and self._local_states is not None and self._held_out is not None
        step = trainer.global_step
        started = time.perf_counter()
        with _isolated(pl_module):
            result = self._engine.attribute(self._local_states, baselines=self._local_baselines)
        gathered = self._gather(trainer, result)  # the one host sync of a run
        time_ms = (time.perf_counter() - started) * 1e3
        self._last_run_step = step

        mean_abs, stddev, mean_signed = reports.feature_moments(gathered.attributions)
        self._last_stats = (mean_abs, stddev, mean_signed)
        drift: dict[str, float] = {}
        if self.history:
            previous = np.asarray(self.history[-1]["mean_abs"], dtype=np.float64)
            first = np.asarray(self.history[0]["mean_abs"], dtype=np.float64)
            drift = {
                "spearman_prev": reports.spearman(mean_abs, previous),
                "spearman_first": reports.spearman(mean_abs, first),
                "topk_jaccard_prev": reports.topk_jaccard(mean_abs, previous, self.top_k),
            }
        self.history.append(
            {
                "global_step": int(step),
                "epoch": int(trainer.current_epoch),
                "mean_abs": mean_abs.tolist(),
                "mean_signed": mean_signed.tolist(),
            }
        )
        if not trainer.is_global_zero:
            return

        completeness = reports.completeness_summary(gathered, per_state=False)
        worst = completeness["worst_relative_error"]
        if not self._warned_completeness and worst is not None and worst > self.completeness_tol:
            self._warned_completeness = True
            rank_zero_warn(
                f"IntegratedGradientsCallback: the worst relative completeness error is {worst:.3g} at step {step}, "
                f"above completeness_tol={self.completeness_tol:g}: the attributions do not add up to "
                "F(x) - F(b); raise n_steps (or use n_steps='auto') or method='gausslegendre' (warned once)"
            )
        metrics = tb.scalar_metrics(
            tags=self._tags,
            mean_abs=mean_abs,
            mean_signed=mean_signed,
            worst_relative_error=worst,
            mean_abs_error=completeness["mean_abs_error"],
            drift=drift,
            time_ms=time_ms,
        )
        tb.log_scalars(trainer.loggers, metrics, step)

        # The full report (one entry per state) only when it is written; the text needs the summary alone.
        report = self._report(gathered, step, trainer, time_ms, drift) if self._report_dir is not None else None
        writers = [logger.experiment for logger in trainer.loggers if tb.is_tensorboard_logger(logger)]
        if writers:
            figures = self._figures(mean_abs, stddev, mean_signed, step, final=final)
            layout = None if self._layout_written else tb.custom_scalars_layout()
            summary = report or self._summary(gathered, step, completeness, mean_abs, stddev, mean_signed)
            markdown = tb.report_markdown(summary, drift)
            for writer in writers:
                tb.log_tensorboard_extras(
                    writer,
                    step=step,
                    tags=self._tags,
                    attributions=gathered.attributions if self.log_histograms else None,
                    markdown=markdown,
                    figures=figures,
                    layout=layout,
                )
            self._layout_written = True
        if report is not None and self._report_dir is not None:
            reports.write_report(report, self._report_dir / f"ig_report_step={step:08d}.json")

    def _gather(self, trainer: "pl.Trainer", result: Any) -> _HostResult:
        """All-gather the per-rank results (when distributed) and copy them to the host in one transfer."""
        assert self._held_out is not None
        share = result.attributions.shape[0]
        # (share, F + 6): attributions, f_input, f_baseline, delta, relative_error, degenerate, n_steps
        columns = [
            result.attributions.reshape(share, -1),
            result.f_input.reshape(share, 1),
            result.f_baseline.reshape(share, 1),
            result.delta.reshape(share, 1),
            result.relative_error.reshape(share, 1),
            result.degenerate.reshape(share, 1),
        ]
        dtype = torch.promote_types(result.attributions.dtype, torch.float32)
        packed = torch.cat([column.to(dtype) for column in columns], dim=1)
        packed = torch.cat([packed, packed.new_full((share, 1), float(result.n_steps))], dim=1)
        if trainer.world_size > 1:
            packed = trainer.strategy.all_gather(packed)  # (world, share, F + 6)
            packed = packed.reshape(-1, packed.shape[-1])  # (world * share, F + 6), rank-major = state order
        host = packed.to("cpu", torch.float64).numpy()[: self._held_out.shape[0]]  # drop the padding rows
        features = host.shape[1] - 6
        return _HostResult(
            attributions=host[:, :features],
            f_input=host[:, features],
            f_baseline=host[:, features + 1],
            delta=host[:, features + 2],
            relative_error=host[:, features + 3],
            degenerate=host[:, features + 4] != 0,
            n_steps=int(host[:, features + 5].max()),
            method=result.method,
            gradient=result.gradient,
            backend=result.backend,
            target=result.target,
        )

    def _summary(
        self,
        gathered: _HostResult,
        step: int,
        completeness: dict[str, Any],
        mean_abs: np.ndarray,
        stddev: np.ndarray,
        mean_signed: np.ndarray,
    ) -> dict[str, Any]:
        """What :func:`~lightning_ig.tensorboard.report_markdown` reads, without the per-state lists."""
        order = reports.rank_order(mean_abs)[: self.top_k]
        top = [
            {"name": self._names[i], "mean_abs": mean_abs[i], "stddev": stddev[i], "mean_signed": mean_signed[i]}
            for i in order.tolist()
        ]
        return {
            "num_states": int(gathered.attributions.shape[0]),
            "num_steps": gathered.n_steps,
            "forward_target": self._target_label,
            "top_10_by_mean_abs": top,
            "completeness": completeness,
            "method": gathered.method,
            "gradient": gathered.gradient,
            "backend": gathered.backend,
            "baseline": self._baseline_description(),
            "global_step": int(step),
        }

    def _baseline_description(self) -> str:
        return self.baseline if isinstance(self.baseline, str) else f"tensor{tuple(self.baseline.shape)}"

    def _report(
        self, gathered: _HostResult, step: int, trainer: "pl.Trainer", time_ms: float, drift: dict[str, float]
    ) -> dict[str, Any]:
        return reports.build_report(
            gathered,
            feature_names=self._names,
            checkpoint=None,
            forward_target=self._target_label,
            regime_head=None,
            top_k=self.top_k,
            extra={
                "baseline": self._baseline_description(),
                "global_step": int(step),
                "epoch": int(trainer.current_epoch),
                "run_index": len(self.history) - 1,
                "world_size": int(trainer.world_size),
                "drift": {name: reports._json_float(value) for name, value in drift.items()},
                "timings": {"ig_ms": time_ms},
            },
        )

    def _figures(
        self, mean_abs: np.ndarray, stddev: np.ndarray, mean_signed: np.ndarray, step: int, *, final: bool
    ) -> dict[str, tb.RenderedFigure]:
        if not self._figures_due(final):
            return {}
        started = time.perf_counter()
        assert self._held_out is not None
        figures = {
            "top_features": tb.top_features_figure(
                self._names,
                mean_abs,
                stddev,
                mean_signed,
                top_k=self.top_k,
                step=step,
                num_states=self._held_out.shape[0],
            ),
            "heatmap": self._heatmap(),
        }
        pixels = {name: tb.figure_to_png(figure) for name, figure in figures.items()}  # render now: time it
        cost = time.perf_counter() - started
        self._figure_seconds += cost
        self._last_figure_cost = cost
        self._figures_step = step
        return pixels

    def _heatmap(self) -> Any:
        steps = [entry["global_step"] for entry in self.history]
        history = np.asarray([entry["mean_abs"] for entry in self.history], dtype=np.float64)  # (runs, F)
        return tb.heatmap_figure(self._names, steps, history)

    def _figures_due(self, final: bool) -> bool:
        every = self.figure_every_n_runs
        if every is None:
            return False
        run_index = len(self.history) - 1
        if final:
            return True
        if every != "auto":
            return run_index % every == 0
        # Draw when the drawing so far plus the next one stays within the share of the elapsed training time;
        # the first one is gated too (matplotlib's import and first figure take a few hundred milliseconds).
        expected = self._last_figure_cost or _FIRST_FIGURE_SECONDS
        elapsed = time.perf_counter() - self._fit_started_at
        return self._figure_seconds + expected <= _FIGURE_TIME_SHARE * elapsed

    def _final_figures(self, trainer: "pl.Trainer") -> None:
        """The last cadence run fell on the final step (so no train-end run): draw its figures if it did not."""
        if not trainer.is_global_zero or self._last_stats is None or self._figures_step == self._last_run_step:
            return
        mean_abs, stddev, mean_signed = self._last_stats
        step = int(self._last_run_step or 0)
        figures = self._figures(mean_abs, stddev, mean_signed, step, final=True)
        for logger in trainer.loggers:
            if tb.is_tensorboard_logger(logger):
                tb.log_tensorboard_extras(logger.experiment, step=step, tags=self._tags, attributions=None,
                                          markdown=None, figures=figures)  # fmt: skip

    # ------------------------------------------------------------------ setup helpers

    def _resolve_states(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> Tensor:
        source = self.states
        if isinstance(source, Tensor):
            states = source
        elif isinstance(source, (str, os.PathLike)):
            from lightning_ig.checkpoint import load_states  # noqa: PLC0415 - safetensors only when needed

            states = load_states(source)
        else:
            states = source(trainer, pl_module)
            if not isinstance(states, Tensor):
                raise TypeError(
                    f"the states callable {_callable_name(source)} must return a tensor (num_states, *feature_shape), "
                    f"got {type(states).__name__}"
                )
        _check_states(states, "states")
        # A copy made here is a normal tensor even when the states were made under torch.inference_mode().
        return states.detach().to("cpu", torch.float32).clone(memory_format=torch.contiguous_format)

    def _check_model(
        self, pl_module: "pl.LightningModule", device: torch.device, dtype: torch.dtype
    ) -> tuple[Callable[[Tensor], Tensor], Any]:
        """Try the model on two held-out states; return the forward and the engine's target."""
        assert self._held_out is not None
        sample = self._held_out[:2].to(device=device, dtype=dtype)
        feature_shape = tuple(self._held_out.shape[1:])
        target = self.target
        forward: Callable[[Tensor], Tensor]
        if callable(target) and not isinstance(target, (str, int)):
            forward = _TargetForward(pl_module, target)
        else:
            forward = pl_module
        try:
            with _isolated(pl_module), torch.no_grad():
                output = forward(sample)
        except Exception as error:  # noqa: BLE001 - re-raised with what the user can change
            raise ValueError(
                f"IntegratedGradientsCallback: the model failed on the held-out states (feature shape {feature_shape}, "
                f"{self._held_out.shape[0]} states): {type(error).__name__}: {error}. Pass states whose feature "
                "shape matches the model's input"
            ) from error
        if not isinstance(output, Tensor):
            raise TypeError(
                f"IntegratedGradientsCallback: the model returned {type(output).__name__} on the held-out states; "
                "IG needs a tensor (N,) or (N, A), or pass target=callable(pl_module, x) -> (N,)"
            )
        rows = sample.shape[0]
        if output.ndim == 0 or output.shape[0] != rows:
            raise ValueError(
                f"IntegratedGradientsCallback: on {rows} states of feature shape {feature_shape} the model returned "
                f"shape {tuple(output.shape)}, not one row per state; check the states' feature shape"
            )
        if callable(target) and not isinstance(target, (str, int)):
            if output.shape != (rows,):
                raise ValueError(
                    f"the target callable {_callable_name(target)} must return one value per state, shape ({rows},), "
                    f"got {tuple(output.shape)}"
                )
            return forward, None
        if output.ndim > 2:
            raise ValueError(
                f"IntegratedGradientsCallback: the model returns shape {tuple(output.shape)} per batch; the target "
                "needs (N,) or (N, A): pass target=callable(pl_module, x) -> (N,)"
            )
        if output.ndim == 1:
            if isinstance(target, int) and target != 0:
                raise ValueError(
                    f"target={target} is out of range: the model returns one value per state (shape "
                    f"{tuple(output.shape)}); use target='mean' or 0"
                )
            return forward, None
        outputs = output.shape[1]
        if isinstance(target, int):
            if target >= outputs:
                raise ValueError(
                    f"target={target} is out of range: the model returns {outputs} outputs per state "
                    f"(shape {tuple(output.shape)}); pass an index in [0, {outputs - 1}]"
                )
            return forward, target
        return forward, "mean"


# ---------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _HostResult:
    """The gathered IG result on the host (float64 numpy), with the fields report.py reads."""

    attributions: np.ndarray  # (B, F)
    f_input: np.ndarray  # (B,)
    f_baseline: np.ndarray  # (B,)
    delta: np.ndarray  # (B,)
    relative_error: np.ndarray  # (B,)
    degenerate: np.ndarray  # (B,) bool
    n_steps: int
    method: str
    gradient: str
    backend: str
    target: str


class _TargetForward:
    """``x -> target(pl_module, x)``: created once, so the engine's graph cache sees the same forward every run."""

    def __init__(
        self, pl_module: "pl.LightningModule", target: Callable[["pl.LightningModule", Tensor], Tensor]
    ) -> None:
        self.pl_module = pl_module
        self.target = target
        self.__name__ = _callable_name(target)

    def __call__(self, inputs: Tensor) -> Tensor:
        return self.target(self.pl_module, inputs)


@contextlib.contextmanager
def _isolated(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode, noise off, gradients on, random generators untouched; everything put back on exit."""
    modes = [(submodule, submodule.training) for submodule in module.modules()]
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        with noise_disabled(module), torch.inference_mode(False), torch.enable_grad():
            module.train(False)
            yield
    finally:
        for submodule, training in modes:
            submodule.training = training
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def _check_states(states: Tensor, name: str) -> None:
    if not isinstance(states, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(states).__name__}")
    if states.ndim < 2 or states.shape[0] == 0 or states[0].numel() == 0:
        raise ValueError(
            f"{name} must have shape (num_states >= 1, *feature_shape), got {tuple(states.shape)}; "
            "add the state dimension (e.g. states.unsqueeze(0)) for a single state"
        )
    if not states.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {states.dtype}; convert with .float()")
    check_finite(name, states)


def _check_cadence(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MisconfigurationException(
            f"{name} must be a positive int or None, got {type(value).__name__} ({value!r})"
        )
    if value < 1:
        raise MisconfigurationException(f"{name} must be a positive int or None, got {value}; e.g. {name}=100")
    return value


def _callable_name(function: Any) -> str:
    return getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or type(function).__name__
