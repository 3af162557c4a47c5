"""The one-call front door, :func:`integrated_gradients`: every step run eagerly, no graph."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import Tensor

from lightning_ig.attribution.auto_steps import attribute_auto
from lightning_ig.attribution.budget import resolve_budget
from lightning_ig.attribution.checks import check_finite
from lightning_ig.attribution.inputs import Baselines, RunningStatistics, prepare, warn_stochastic
from lightning_ig.attribution.path import PathRun, chunk_rows
from lightning_ig.attribution.result import IGResult, build_result
from lightning_ig.attribution.settings import DEFAULT_MAX_STEPS, DEFAULT_METHOD, DEFAULT_N_STEPS, IGOptions
from lightning_ig.attribution.targets import Target, TargetLike
from lightning_ig.ops.ig import IGOps
from lightning_ig.vocabulary import BackendName

__all__ = ["attribute_eager", "deterministic_float32", "integrated_gradients"]


def integrated_gradients(
    forward: Callable[[Tensor], Tensor],
    inputs: Tensor,
    baselines: Baselines = None,
    *,
    target: TargetLike = None,
    n_steps: int | Literal["auto", "budget"] = DEFAULT_N_STEPS,
    method: str = DEFAULT_METHOD,
    gradient: Literal["autograd", "finite_difference"] = "autograd",
    internal_batch_size: int | None = None,
    backend: BackendName | IGOps = "auto",
    completeness_tol: float = 0.01,
    max_steps: int = DEFAULT_MAX_STEPS,
    fd_step: float | None = None,
    check_finite: bool = True,
) -> IGResult:
    """Integrated Gradients of ``forward`` at ``inputs`` against ``baselines``.

    The call runs eagerly (no CUDA graph); for repeated calls on the same shapes use
    :class:`~lightning_ig.attribution.IntegratedGradients`, which captures and replays the work. Works under
    ``torch.no_grad()`` and ``torch.inference_mode()``, leaves the model as it was (parameters, their ``.grad`` and
    ``requires_grad``, training mode, and the buffers of layers in train mode, which its forwards would move, as
    batch-norm's running statistics and spectral norm's vectors: they are put back after the call) and draws no random
    numbers of its own. The forward is called as it is: put the model in the mode you want attributed (``eval()``,
    noise off) first; a forward that gives different values for the same rows within the call (dropout, which draws
    them) is reported (:attr:`IGResult.stochastic`, :class:`~lightning_ig.attribution.StochasticForwardWarning`).

    Every result says how far to trust it: :attr:`IGResult.attribution_error` (a reference-free estimate of each state's
    ``||a - a_exact||_1 / ||a_exact||_1``), :attr:`IGResult.mass_relative_error`, the states near the baseline, and
    their worst values; :func:`~lightning_ig.run.statistics.accuracy_verdict` turns them into a verdict (how they are
    computed and when they can be wrong: ``docs/trust.md``).

    Args:
        forward: maps ``(N, *feature_shape)`` to ``(N,)``, or to ``(N, A)`` with ``target`` choosing what to attribute.
            Rows must be independent.
        inputs: ``(B, *feature_shape)`` floating-point states, at least one feature.
        baselines: ``None`` or ``"zeros"`` (default: zeros), ``"mean"`` (the batch mean), a number, one baseline
            ``(*feature_shape)`` or one per state ``(B, *feature_shape)``.
        target: ``None`` (forward returns ``(N,)``), ``"mean"`` (mean over ``A``: ``V(s)`` under the dueling identity;
            an ``(N,)`` output is its own mean), an int (one column), a LongTensor ``(B,)`` (one column per state),
            ``"each"`` (every column: attributions ``(A, B, *feature_shape)``), ``"contrast"`` (per state, the greedy
            column minus the runner-up's, both chosen from the forward at the state and held fixed along the path: "why
            this action rather than the next best"; :attr:`IGResult.target_actions`) or a callable ``(N, A) -> (N,)``.
        n_steps: quadrature points; ``"budget"`` (default): 256, 128 or 64, the most whose work (the forward's
            multiply-adds x states x nodes) fits the device's budget (the kink rule's 56 or 112 where that is 64 or 128)
            (:mod:`lightning_ig.attribution.budget`; the number used is :attr:`IGResult.n_steps`); or ``"auto"``: the
            kink rule at 56 nodes on any device (the midpoint rule for ``"riemann_middle"``), then the states whose
            error estimate or mass-relative error is above ``completeness_tol / 2`` (``/ 4`` after the kink rule)
            refined by tripling the midpoint nodes (168, 504, reusing every gradient), up to ``max_steps``; it stops at
            once on a non-finite state. :attr:`IGResult.n_steps_per_state` says what each used.
        method: ``"auto"`` (default): ``"kink_midpoint"`` where ``n_steps`` comes to 128 or fewer (autograd only), else
            ``"riemann_middle"``; :attr:`IGResult.method` says which ran. ``"kink_midpoint"``: the midpoint rule with
            certified kink corrections (:mod:`lightning_ig.attribution.kinks`, one more forward-only pass of
            ``ceil(n / 4)`` rows per state); Captum's ``"riemann_middle"``, ``"riemann_left"``, ``"riemann_right"``,
            ``"riemann_trapezoid"``, ``"gausslegendre"`` (at most 100000 points; for smooth models). ``docs/trust.md``
            compares the rules.
        gradient: ``"autograd"`` (default) or ``"finite_difference"`` for forwards autograd cannot go through (step: see
            :mod:`lightning_ig.attribution.path`).
        internal_batch_size: rows per forward (path points for autograd, probes for finite differences); ``None`` picks
            it from the free device memory. On CUDA out-of-memory the chunk is halved and retried, with a warning.
        backend: ``"auto"`` (the CUDA kernels when the inputs are on a CUDA device and CuPy imports, else torch),
            ``"cuda"``, ``"torch"``, or a :class:`~lightning_ig.ops.ig.IGOps` object.
        completeness_tol: the target of ``n_steps="auto"`` (default 0.01).
        max_steps: the most points ``n_steps="auto"`` may use (default 512).
        fd_step: relative finite-difference step, at least 16 eps of the inputs' dtype; ``None`` is ``eps ** (1/3)``.
        check_finite: check inputs and baselines for NaN/Inf first (one host sync). NaN/Inf *outputs* never raise: they
            are flagged in :attr:`IGResult.non_finite`.

    Returns:
        An :class:`IGResult`.

    Raises:
        TypeError: a non-callable forward, non-floating inputs or baselines, inputs of another dtype than the model's
            parameters, a bad type for an option, or a forward that returns no tensor.
        ValueError: inputs without states or features, baselines that do not match the inputs, NaN/Inf inputs,
            ``n_steps < 1`` (or past the rule's largest), an unknown method, a forward returning the wrong shape,
            ``gradient="autograd"`` on a forward autograd cannot differentiate, or ``backend="cuda"`` without a CUDA
            device.
        RuntimeError: ``backend="cuda"`` where CuPy is not installed.

    Example::

        model = DuelingQNetwork(4, 2).eval()
        result = integrated_gradients(model, states, target="mean")
        result.attributions        # (B, 4)
        result.worst_attribution_error, result.worst_mass_relative_error
    """
    options = IGOptions(
        n_steps=n_steps,
        method=method,
        gradient=gradient,
        backend=backend,
        internal_batch_size=internal_batch_size,
        completeness_tol=completeness_tol,
        max_steps=max_steps,
        fd_step=fd_step,
        check_finite=check_finite,
        cuda_graph=False,
    )
    checked = Target.parse(target)
    with torch.inference_mode(False), torch.enable_grad(), deterministic_float32():
        return attribute_eager(forward, inputs, baselines, options, checked)


@contextlib.contextmanager
def deterministic_float32() -> Iterator[None]:
    """cuDNN's deterministic algorithms and full float32 (no TF32) for the block, then as they were: cuDNN's own pick
    for a convolution's backward may sum with atomics (calls differ in their last bits), and its TF32, on by default
    (matmuls' where the user asked), is noise the float32 error estimate reads as kinks. A capture inside keeps both.
    """
    cudnn = torch.backends.cudnn
    previous = cudnn.deterministic, cudnn.allow_tf32, torch.get_float32_matmul_precision()
    cudnn.deterministic, cudnn.allow_tf32 = True, False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.allow_tf32 = previous[:2]
        torch.set_float32_matmul_precision(previous[2])


def attribute_eager(
    forward: Callable[[Tensor], Tensor], inputs: Tensor, baselines: Baselines, settings: IGOptions, target: Target
) -> IGResult:
    """One eager attribution with checked ``settings`` and ``target`` (the work of :func:`integrated_gradients`;
    the caller holds gradients on and float32 exact: :func:`deterministic_float32`)."""
    prepared = prepare(forward, inputs, baselines, settings, target)
    settings = resolve_budget(forward, prepared, settings)  # n_steps="budget": a number from the work's size
    x = prepared.x
    deferred: list[tuple[str, Tensor, Tensor]] = []
    if settings.check_finite:
        checks = [("inputs", x)]
        if isinstance(baselines, Tensor):  # as the path uses them: float32's 1e5 is inf in float16; a CPU one on a GPU
            cast = "" if baselines.dtype == x.dtype else f" as {x.dtype}"
            checks.append((f"baselines{cast}", baselines.detach().to(x.device, x.dtype)))
        if settings.n_steps == "auto" or x.device.type != "cuda":
            for name, tensor in checks:  # "auto" reads figures on the host as it goes: check first
                check_finite(name, tensor)
        else:
            # Queue the checks now and read them after the work is queued: the host waits for
            # nothing, and nothing the work does depends on them (no state changes, no side effects).
            deferred = [(name, tensor, torch.isfinite(tensor).all()) for name, tensor in checks]
    chunk = chunk_rows(settings, x)
    run = PathRun(forward, x, prepared.b, prepared.feature_shape, prepared.spec, settings, prepared.backend, chunk)
    statistics = RunningStatistics(forward)
    saved = statistics.save()
    try:
        if settings.n_steps == "auto":
            out = attribute_auto(run, settings)
            n_steps = int(out["n_steps_per_state"].max())  # known on the host anyway: auto synchronises per level
        else:
            n_steps = int(settings.n_steps)
            out = run.attribute(n_steps)
    finally:
        statistics.restore(saved)  # train-mode batch-norm statistics as they were, also when a forward raised
    # One host sync reads every flag queued above: the inputs' finite checks and the repeated ends.
    flags = torch.stack([flag for _, _, flag in deferred] + [run.stochastic_flag()]).tolist()
    for (name, tensor, _), flag in zip(deferred, flags):
        check_finite(name, tensor, flag)
    stochastic = bool(flags[-1])
    warn_stochastic(forward, 3, stochastic)  # to the caller of integrated_gradients or IntegratedGradients.attribute
    return build_result(
        out, prepared.resolved, prepared.spec, settings, run, n_steps, graph=False, stochastic=stochastic
    )
