"""The held-out states of the training callback: where they come from, what is attributed, each rank's share.

Set-up work of :class:`~lightning_ig.callback.IntegratedGradientsCallback`,
done once before training so that a bad input fails before the first step:

* :func:`resolve_states`: a tensor, a file or a callable, checked and copied to the CPU;
* :func:`check_baseline` / :func:`baselines_for`: ``"zeros"``, ``"mean"``, a number or a tensor, per rank;
* :func:`check_target` / :func:`probe_target`: what is attributed (the model's output through ``target``, or a
  ``forward`` of the user's), tried on the states and bound to the model's outputs;
* :func:`prepare_engine`: the engine for that target, tried on this rank's states (kernels compile then; NaN and
  changed buffers caught);
* :func:`rank_rows`: each rank's share of the states under DDP, padded to one size.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_ig._files import check_input_file
from lightning_ig.attribution import IGOptions, IntegratedGradients
from lightning_ig.attribution.checks import check_dense, check_states
from lightning_ig.attribution.path import check_run_memory, chunk_rows
from lightning_ig.attribution.result import stochastic_warnings_silenced
from lightning_ig.attribution.targets import Target
from lightning_ig.checkpoint import STATE_SUFFIXES, load_states
from lightning_ig.models.noise import attribution_mode
from lightning_ig.vocabulary import REFINED_METHODS, callable_name, check_real, non_finite_words, shown, shown_with_type

__all__ = [
    "BoundForward",
    "ForwardOption",
    "NonFiniteAttributionError",
    "StatesSource",
    "baseline_label",
    "baselines_for",
    "check_baseline",
    "check_baseline_shape",
    "check_states_source",
    "check_target",
    "model_dtype",
    "prepare_engine",
    "probe_target",
    "rank_rows",
    "resolve_states",
    "same_values",
]


class NonFiniteAttributionError(RuntimeError):
    """The model produced NaN/Inf on the held-out states and ``on_non_finite="raise"`` was asked for."""


StatesSource = Tensor | str | os.PathLike[str] | Callable[[Any, Any], Tensor]
ForwardOption = Callable[[Any, Tensor], Tensor]
"""The callback's ``forward``: ``(pl_module, x) -> (N,)``, the scalar attributed in place of the model's output."""


def check_states_source(states: Any) -> Any:
    """A tensor (checked now), a path, or a callable ``(trainer, pl_module) -> Tensor`` (checked at set-up)."""
    if isinstance(states, Tensor):  # a copy: the states as they are now, whatever the caller does with its tensor
        return check_states(states, "states").detach().to("cpu").clone(memory_format=torch.contiguous_format)
    if isinstance(states, (str, os.PathLike)):
        path = check_input_file(states, "states", "give a .safetensors, .npy or .json file")  # a FIFO, a device: now
        if path.suffix.lower() not in STATE_SUFFIXES:
            raise ValueError(f"states {shown(str(states))} must end in {'/'.join(STATE_SUFFIXES)}, or pass the tensor")
        return path
    if callable(states):
        return states
    parts = list(states.values()) if isinstance(states, dict) else states if isinstance(states, (tuple, list)) else ()
    several = bool(parts) and all(isinstance(part, Tensor) for part in parts)  # not a list of numbers: one input
    raise TypeError(
        "states must be a tensor (num_states, *feature_shape), a path to a .safetensors/.npy/.json file, "
        f"or a callable (trainer, pl_module) -> Tensor; got {type(states).__name__}"
        + (
            "; for a model of several inputs, concatenate them into one (N, F) tensor and split it again inside "
            "forward=callable(pl_module, x)"
            if several
            else ""
        )
    )


def resolve_states(source: Any, trainer: Any, pl_module: Any) -> Tensor:
    """The held-out states as a CPU tensor in their own floating dtype (a normal tensor even if made under inference
    mode): float64 states stay float64, so a float64 model sees them unrounded."""
    if isinstance(source, Tensor):
        states = source
    elif isinstance(source, (str, os.PathLike)):
        states = load_states(source, dtype=model_dtype(pl_module))  # as the CLI reads them: the model's precision
    else:
        try:
            states = source(trainer, pl_module)
        except Exception as error:  # the user's code: say where it ran, which is why a module attribute may be missing
            raise RuntimeError(
                f"the states callable {callable_name(source)} raised {type(error).__name__}: {error}; it runs at the "
                "callback's setup, before the LightningModule's setup() and configure_model(): make what it reads "
                "in the module's __init__, or pass the states"
            ) from error
        if not isinstance(states, Tensor):
            raise TypeError(
                f"the states callable {callable_name(source)} must return a tensor (num_states, *feature_shape), "
                f"got {type(states).__name__}"
            )
    check_states(states, "states")
    # numpy (the pictures) has no bfloat16; float32 holds every bfloat16 value exactly
    dtype = torch.float32 if states.dtype == torch.bfloat16 else states.dtype
    return states.detach().to("cpu", dtype).clone(memory_format=torch.contiguous_format)


def model_dtype(pl_module: Any) -> torch.dtype:
    """The model's floating dtype (its first floating parameter's; float32 for a model without one)."""
    return next((p.dtype for p in pl_module.parameters() if p.is_floating_point()), torch.float32)


def check_baseline(baseline: Any) -> Any:
    """``"zeros"``, ``"mean"`` (of the held-out states), a finite number (every feature that value, as the engine
    and ``--baseline`` take it) or a floating-point tensor (shape checked at set-up).

    Raises:
        TypeError: a tensor of integers or bools, a bool, or a value of another kind.
        ValueError: another name, a number that is NaN or infinite, or a sparse or meta tensor.
    """
    forms = "'zeros', 'mean', a finite number or a floating-point tensor"
    if isinstance(baseline, str) and baseline not in ("zeros", "mean"):
        raise ValueError(f"baseline must be {forms}, got {shown(baseline, 60)}")
    if isinstance(baseline, str):
        return baseline
    if isinstance(baseline, Tensor):
        if not baseline.is_floating_point():
            raise TypeError(f"baseline must be a floating-point tensor, got dtype {baseline.dtype}")
        check_dense(baseline, "baseline")  # a sparse or meta tensor has no values to copy
        return baseline.detach().to("cpu").clone(memory_format=torch.contiguous_format)  # as it is now
    try:
        return check_real(baseline, "baseline")  # NaN and Inf refused (ValueError): no value of a feature
    except TypeError:
        raise TypeError(f"baseline must be {forms}, got {shown_with_type(baseline)}") from None


def baseline_label(baseline: Any) -> str:
    """How the text and the report name the baseline: ``zeros``, ``mean``, ``constant:<value>`` (as ``diag``),
    ``tensor(<shape>)``."""
    if isinstance(baseline, Tensor):
        return f"tensor{tuple(baseline.shape)}"
    return baseline if isinstance(baseline, str) else f"constant:{baseline!r}"


def check_baseline_shape(baseline: Any, states: Tensor) -> None:
    """A tensor baseline has the states' feature shape (one for all) or their shape (one per state)."""
    if not isinstance(baseline, Tensor):
        return
    feature_shape = tuple(states.shape[1:])
    if tuple(baseline.shape) not in (feature_shape, tuple(states.shape)):
        raise ValueError(
            f"baseline has shape {tuple(baseline.shape)} but the states have shape {tuple(states.shape)}; "
            f"pass one baseline of shape {feature_shape} or one per state of shape {tuple(states.shape)}"
        )
    check_states(baseline.reshape(-1, *feature_shape), "baseline")


def baselines_for(
    baseline: Any, states: Tensor, rows: Tensor, device: torch.device, dtype: torch.dtype
) -> Tensor | str | float:
    """The baselines of the held-out states ``rows``, as the engine takes them (a number as it is)."""
    if isinstance(baseline, Tensor):
        values = baseline.detach().to("cpu")  # its own dtype: a float64 baseline is not rounded on the way
        if values.shape == states.shape:
            values = values[rows]  # one baseline per state: these rows
        return values.to(device=device, dtype=dtype).contiguous()
    if baseline == "mean":
        # The mean over all held-out states (not one rank's share), in float64: the same on every rank.
        return states.double().mean(dim=0).to(device=device, dtype=dtype).contiguous()
    return baseline if isinstance(baseline, float) else "zeros"


def rank_rows(num_states: int, world: int, rank: int) -> Tensor:
    """This rank's rows: ``ceil(B / world)`` of them, the last rank's share padded by repeating the last state."""
    share = -(-num_states // max(1, world))
    return torch.arange(rank * share, (rank + 1) * share).clamp_(max=num_states - 1)  # (share,)


def check_target(target: Any, forward: Any = None) -> tuple[Target, Any]:
    """The callback's ``target`` and ``forward``, checked: ``(target, forward)``.

    ``target`` is ``"mean"``, ``"each"``, ``"contrast"``, an output index ``>= 0`` or a callable ``(N, A) -> (N,)``;
    ``forward`` is ``None`` or a callable ``(pl_module, x) -> (N,)``, which replaces the model's output (``target``
    then stays ``"mean"``).

    Raises:
        TypeError: a target or ``forward`` of the wrong kind.
        ValueError: an unknown target, a negative index, or a ``forward`` with a target other than ``"mean"``.
    """
    forms = (
        "target must be 'mean', 'each', 'contrast', an output index (int >= 0, or 'action:N' in digits 0-9) or a "
        "callable (outputs (N, A)) -> (N,)"
    )
    if target is None or isinstance(target, Tensor):
        raise TypeError(f"{forms}, got {shown_with_type(target)}; to attribute a scalar of your own, pass forward=")
    try:
        checked = Target.parse(target)
    except (TypeError, ValueError) as error:
        why = "" if isinstance(target, str) else f" ({error})"  # an unknown name: the engine's words say the same
        raise type(error)(f"{forms}, got {shown(target, 60)}{why}") from None
    if forward is not None and not callable(forward):
        raise TypeError(f"forward must be None or a callable (pl_module, x) -> (N,), got {shown_with_type(forward)}")
    if forward is not None and not (isinstance(target, str) and target == "mean"):
        raise ValueError(
            f"forward= gives the scalar attributed, so target must stay 'mean', got {shown(target, 60)}; pick the "
            "output inside forward"
        )
    return checked, forward


class BoundForward:
    """``x -> forward(pl_module, x)``: created once, so the engine's graph cache sees the same forward every run."""

    def __init__(self, pl_module: Any, forward: ForwardOption) -> None:
        self.pl_module, self.forward = pl_module, forward
        self.__name__ = callable_name(forward)

    def __call__(self, inputs: Tensor) -> Tensor:
        return self.forward(self.pl_module, inputs)


def probe_target(
    pl_module: Any,
    target: Target,
    sample: Tensor,
    num_states: int,
    forward: ForwardOption | None = None,
    action_names: Sequence[str] | None = None,
) -> tuple[Callable[[Tensor], Tensor], Target]:
    """Try the model on ``sample``; return the forward and the target bound to its outputs.

    Raises:
        ValueError: the model fails on the states, returns no row per state, has no output ``target``, or
            ``action_names`` are not one per output.
        TypeError: the model returns something other than a tensor.
    """
    given = forward
    attributed: Callable[[Tensor], Tensor] = pl_module if given is None else BoundForward(pl_module, given)
    feature_shape = tuple(sample.shape[1:])
    who = "the model" if given is None else f"the forward callable {callable_name(given)}"  # what the messages blame
    try:
        with attribution_mode(pl_module), torch.no_grad():
            output = attributed(sample)
    except Exception as error:
        missing = isinstance(error, NotImplementedError) and "forward" in str(error)  # nn.Module's: no forward
        first = (
            "Give the LightningModule a forward that returns the Q-values"
            if missing
            else "Pass states of the feature shape and dtype the model takes"
        )
        advice = (
            f"{first}, or forward=callable(pl_module, x) -> (N,) to call it your way"
            if given is None
            else "Check that forward(pl_module, x) runs on a batch x of held-out states and returns one value per state"
        )
        raise ValueError(
            f"IntegratedGradientsCallback: {who} failed on the held-out states (feature shape {feature_shape}, "
            f"{num_states} states, {len(sample)} at once): {type(error).__name__}: {error}. {advice}"
        ) from error
    if not isinstance(output, Tensor) or not output.dtype.is_floating_point:
        seen = f"{output.dtype} values" if isinstance(output, Tensor) else type(output).__name__
        fix = "pass forward=callable(pl_module, x) -> (N,), e.g. lambda m, x: m.q(x)"
        fix = fix if given is None else "make it return one value per state, e.g. q.max(-1).values (not q.argmax(-1))"
        raise TypeError(
            f"IntegratedGradientsCallback: {who} returned {seen} on the held-out states; IG needs floating-point "
            f"values (N,) or (N, A){', not actions' * isinstance(output, Tensor)}: {fix}"
        )
    rows, shape = sample.shape[0], tuple(output.shape)
    if output.ndim == 0 or shape[0] != rows:
        kept = "" if given is None else " and that it keeps one value per state (no sum or mean over the batch)"
        raise ValueError(
            f"IntegratedGradientsCallback: on {rows} states of feature shape {feature_shape} {who} returned "
            f"shape {shape}, not one row per state; check the states' feature shape{kept}"
        )
    if given is not None:
        if shape not in ((rows,), (rows, 1)):
            raise ValueError(
                f"the forward callable {callable_name(given)} must return one value per state, shape ({rows},), "
                f"got {shape}{'; pick it inside, e.g. q.max(-1).values or q[:, action]' if len(shape) == 2 else ''}"
            )
        return attributed, Target.of_forward(given)
    if len(shape) > 2:
        raise ValueError(
            f"IntegratedGradientsCallback: the model returns shape {shape} per batch; the target needs (N,) or "
            "(N, A): pass forward=callable(pl_module, x) -> (N,)"
        )
    return attributed, target.bind(shape, action_names)


def prepare_engine(
    trainer: Any,
    pl_module: Any,
    target: Target,
    forward: ForwardOption | None,
    states: Tensor,
    baseline: Any,
    action_names: Sequence[str] | None,
    options: IGOptions,
    on_non_finite: str = "warn",
) -> tuple[IntegratedGradients, Target, Tensor, Tensor | str | float]:
    """The engine for ``target`` on ``pl_module`` after a trial on this rank's states, and what its runs attribute.

    The trial runs eagerly before training, on every state this rank attributes and, on a CPU, on as many rows at
    once as a run's widest forward (a forward that fails only on bigger batches fails here): a target, backend or
    gradient mode that cannot work fails now, not at the first run, CUDA kernels compile now, a model whose outputs
    are NaN/Inf on the states stops the fit now under ``on_non_finite="raise"``, a forward that changes the
    model's buffers (which every run would do to training) is refused, and lazy parameters it initialises are warned of.

    Args:
        trainer: the trainer (this rank's share of the states: :func:`rank_rows`).
        pl_module: the model, on its training device.
        target: from :func:`check_target`.
        forward: from :func:`check_target`: ``None`` (the model's output) or ``(pl_module, x) -> (N,)``.
        states: the held-out states (CPU).
        baseline: from :func:`check_baseline`.
        action_names: one name per output, or ``None``.
        options: the engine's options.
        on_non_finite: the callback's ``on_non_finite``.

    Returns:
        The engine, the target bound to the model, and this rank's states and baselines on the model's device and in its
        floating dtype.

    Raises:
        NonFiniteAttributionError: NaN/Inf in the trial and ``on_non_finite="raise"``.
        ValueError: the model fails on the states, or its forward changed a buffer of the model.
    """
    dtype = model_dtype(pl_module)
    rows = rank_rows(len(states), trainer.world_size, trainer.global_rank)
    local_states = states[rows].to(device=pl_module.device, dtype=dtype).contiguous()
    local_baselines = baselines_for(baseline, states, rows, pl_module.device, dtype)
    every = (states.to(dtype), baselines_for(baseline, states, torch.arange(len(states)), torch.device("cpu"), dtype))
    for name, values in zip(("states", "baseline"), every):  # all rows on every rank: one rank alone must not stop
        if isinstance(values, Tensor) and not bool(torch.isfinite(values).all()):  # (finite as given: checked before)
            raise ValueError(
                f"IntegratedGradientsCallback: the {name} hold values past the range of the model's dtype {dtype} "
                f"(at most {torch.finfo(dtype).max:.3g} in size), inf once converted: scale them or use a wider dtype"
            )
    _warn_if_lazy(pl_module)
    buffers = {name: buffer.clone() for name, buffer in pl_module.named_buffers()}
    attributed, target = probe_target(pl_module, target, local_states, len(states), forward, action_names)
    # The states and baselines are checked here once (in the model's dtype), not by every run: one host sync less
    runs = options = dataclasses.replace(options, check_finite=False)
    refinable = options.method in REFINED_METHODS and options.gradient == "autograd"
    if options.n_steps == "budget" and refinable and local_states.device.type == "cpu":
        # On a CPU the budget's 56 kink-rule nodes leave ReLU agents' worst states above the tolerance; the runs
        # refine those states (n_steps="auto": 56, 168, 504 nodes), so the verdict a run shows is one it reached
        runs = dataclasses.replace(options, n_steps="auto")
    if local_states.device.type == "cpu":  # said now, not by the out-of-memory killer minutes into training
        processes = trainer.num_devices  # CPU DDP: each of this machine's processes takes its share of one memory
        units, width, n = len(local_states) * target.rows_per_state * processes, local_states[0].numel(), runs.n_steps
        each = f" for each of {target.rows_per_state} actions" if target.rows_per_state > 1 else ""
        told = f"IntegratedGradientsCallback: IG of {len(local_states):,} states of {width:,} features{each}"
        told += f" at n_steps={n!r}" + (f" times this machine's {processes} processes" if processes > 1 else "")
        # each check says a fix that helps it (n_steps=32 was offered to n_steps=16, max_steps to auto's 56 nodes)
        fix = "pass fewer held-out states, or a smaller fixed number of nodes a state: engine=IGOptions(n_steps=N)"
        check_run_memory(units, width, n, told, fix, runs.max_steps, fewest=True)  # the nodes every run takes
        try:  # "auto" takes its most nodes only at states it refines (training changes which): a warning
            fix = "pass fewer held-out states" + " or a lower engine=IGOptions(max_steps=N)" * (n == "auto")
            check_run_memory(units, width, n, f"{told}, every state refined,", fix, runs.max_steps)
        except ValueError as error:
            rank_zero_warn(str(error))
    engine = IntegratedGradients(attributed, target=target, **runs.keywords())
    # The most rows a run's forward takes on a CPU (its n_steps, or the most nodes "budget" and "auto" reach), more
    # than the trial's 2 nodes; on a GPU the engine halves a batch that runs out of memory
    deepest = runs if isinstance(runs.n_steps, int) else dataclasses.replace(runs, n_steps="auto", method="auto")
    flat = local_states.reshape(len(local_states), -1)  # (B, F)
    widest = chunk_rows(deepest, flat) if flat.device.type == "cpu" else 0
    try:
        with attribution_mode(pl_module), stochastic_warnings_silenced():
            trial = engine.attribute(local_states, baselines=local_baselines, n_steps=2, cuda_graph=False)
            if widest > len(local_states):
                with torch.no_grad():
                    attributed(local_states[torch.arange(widest) % len(local_states)])  # (rows, *feature_shape)
    except (TypeError, ValueError):
        raise  # the engine's own checks, which name the option
    except Exception as error:  # the model ran on the states at once: here batches are wider, and a backward runs
        size = f"up to {widest} rows" if widest else "more rows than states"
        raise ValueError(
            f"IntegratedGradientsCallback: the model ran on the {len(local_states)} held-out states but failed in "
            f"the set-up trial of IG (a gradient at points along the path, {size} in one batch, as the runs take "
            f"them): {type(error).__name__}: {error}. If it takes fewer rows at once, pass "
            "engine=IGOptions(internal_batch_size=<rows>)"
        ) from error
    _refuse_changed_buffers(pl_module, buffers)
    if on_non_finite == "raise" and bool(trial.non_finite.any()):
        ends = torch.stack([trial.f_input[trial.non_finite], trial.f_baseline[trial.non_finite]])
        what, why = non_finite_words(bool(torch.isfinite(ends).all()))
        distinct = len(torch.unique(rows))  # the padding of an uneven split repeats the last state
        count = int(trial.non_finite.view(-1, len(local_states)).any(0)[:distinct].sum())  # "each": per (action, state)
        raise NonFiniteAttributionError(
            f"IntegratedGradientsCallback: {what} on {count} of {distinct} held-out states in the set-up "
            f"trial, before training (on_non_finite='raise'){why}; check the model's weights, forward and the states"
        )
    return engine, target, local_states, local_baselines


def _warn_if_lazy(pl_module: Any) -> None:
    """Warn that the set-up trial's forward initialises the model's lazy parameters (``nn.LazyLinear``, ...): from the
    random generators as they are before training's first step, not as training's own first forward would."""
    lazy = [name for name, parameter in pl_module.named_parameters() if torch.nn.parameter.is_lazy(parameter)]
    if lazy:
        rank_zero_warn(
            f"IntegratedGradientsCallback: the model's lazy parameters {', '.join(lazy[:3])}{' ...' * (len(lazy) > 3)} "
            "are not initialised yet; the set-up trial's forward initialises them before training's first step, from "
            "another state of the random generators, so training will not be the same as without the callback. "
            "Run one forward on a batch of inputs before trainer.fit to initialise them"
        )


def _refuse_changed_buffers(pl_module: Any, before: dict[str, Tensor]) -> None:
    """Put back any buffer the trial's forwards changed, and refuse the model: every run would change training."""
    changed = [
        name for name, buffer in pl_module.named_buffers() if name in before and not same_values(buffer, before[name])
    ]
    if not changed:
        return
    with torch.no_grad():
        for name, buffer in pl_module.named_buffers():
            if name in before:
                buffer.copy_(before[name])
    raise ValueError(
        f"IntegratedGradientsCallback: the model's forward changed its buffer(s) {', '.join(changed[:5])} in eval "
        "mode with the noise off, so every IG run would change what training sees; leave buffers alone outside "
        "training (e.g. update them only when self.training) or pass forward= that does"
    )


def same_values(a: Tensor, b: Tensor) -> bool:
    """``torch.equal``, with NaN equal to NaN (weights gone NaN give NaN outputs on the model and on its copy)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.where(a.isnan(), b.isnan(), a == b).all())
