"""The path integral: interpolation, chunked forwards, gradients (autograd or finite differences), refinement.

A :class:`PathRun` holds one attribution problem with its states flattened to
``(B, F)``. The same code runs eagerly and under CUDA-graph capture:

* all ``n_steps x B`` path points, plus the two ends ``x`` and ``b`` (twice:
  the stochastic-forward check), come from one interpolation and are evaluated
  in batched forwards of at most ``chunk_rows`` rows, so ``F(x)`` and ``F(b)``
  for completeness and their repeat cost no extra pass; a CUDA out-of-memory
  halves the chunk and retries (eager runs only);
* ``gradient="autograd"``: one ``torch.autograd.grad`` per chunk and target
  w.r.t. the path points only; never ``.backward()``, never a parameter's ``.grad``;
* ``gradient="finite_difference"``: central differences ``(F(p + h e_i) -
  F(p - h e_i)) / (p_i^+ - p_i^-)`` for every feature of every path point, all
  probes of a chunk built by one backend call and evaluated in one forward;
  ``h_i = fd_step * max(1, |x_i|, |b_i|)`` with ``fd_step = eps ** (1/3)`` of the
  inputs' dtype by default (truncation ``O(h^2)`` against rounding ``O(eps/h)``),
  and the divisor is the step as stored in the inputs' dtype;
* ``attributions = (x - b) * sum_k w_k g_k`` and the completeness statistics,
  both by the backend; the completeness operation also compares the two copies
  of the ends (the stochastic-forward check, a flag on the device that the
  caller reads where it syncs anyway; skipped inside a capture, where its
  answer could not be read). Identical rows of one batch agree even under
  batch-norm in train mode, so batch statistics are found by looking at the
  forward's module (:func:`~lightning_ig.attribution.inputs.uses_batch_statistics`);
  the running statistics those forwards move are put back by the callers
  (:class:`~lightning_ig.attribution.inputs.RunningStatistics`).

:func:`refine` is ``n_steps="auto"``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from lightning_ig.attribution.inputs import raise_if_dtype_mismatch, uses_batch_statistics
from lightning_ig.attribution.options import Settings
from lightning_ig.attribution.quadrature import nests_on_doubling, quadrature
from lightning_ig.attribution.targets import TargetSpec, select
from lightning_ig.ops.dtypes import accumulate_dtype
from lightning_ig.ops.ig import STATS, IGOps

__all__ = ["AUTO_FIRST_STEPS", "PathRun", "chunk_rows", "refine", "rule_tensors"]

AUTO_FIRST_STEPS = 16
_SMALL_WORK_BYTES = 256 << 20
_REPEAT_DIFFERS = STATS.index("repeat_differs")
_RULE_CACHE: dict[tuple[str, int, torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}


def rule_tensors(method: str, n_steps: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(alphas, weights)`` as tensors on ``device``, cached: a host-to-device copy per call is a sync we skip."""
    key = (method, n_steps, dtype, device)
    cached = _RULE_CACHE.get(key)
    if cached is None:
        alphas, weights = quadrature(method, n_steps)
        cached = (torch.tensor(alphas, dtype=dtype, device=device), torch.tensor(weights, dtype=dtype, device=device))
        if len(_RULE_CACHE) < 256:
            _RULE_CACHE[key] = cached
    return cached


def chunk_rows(settings: Settings, x: Tensor) -> int:
    """Rows per forward: ``internal_batch_size``, or a quarter of the free memory by a rough per-row guess.

    The guess is 32 copies of a row plus 16 KiB of activations; work that needs
    at most 256 MiB by it runs in one chunk without asking the device.
    """
    if settings.internal_batch_size is not None:
        return settings.internal_batch_size
    batch, features = x.shape
    steps = settings.max_steps if settings.n_steps == "auto" else int(settings.n_steps)
    per_point = 2 * features if settings.gradient == "finite_difference" else 1
    rows_needed = steps * batch * per_point + 4 * batch  # the path (or its probes) and the two ends, twice
    per_row = 32 * features * x.element_size() + 16 * 1024
    if rows_needed * per_row <= _SMALL_WORK_BYTES:
        return max(1, rows_needed)
    if x.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(x.device)
        cached = torch.cuda.memory_reserved(x.device) - torch.cuda.memory_allocated(x.device)
        budget = (free + max(cached, 0)) // 4
    else:
        budget = 1 << 30  # 1 GiB on the host: the torch path is the reference, not the fast path
    return max(1, int(budget // per_row))


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error)
    )


class PathRun:
    """One attribution problem, states flattened to ``(B, F)``; see the module docstring.

    Attributes:
        backend: the operations' implementation (swapped for its twin when a capture fails).
        check_stochastic: evaluate the ends twice and compare (off inside a capture).
        stochastic: the 0-dim bool device tensor of that check, once run.
        allow_oom_retry: halve the chunk on out-of-memory (off inside a capture).
        output_width: the forward's ``A`` seen last (per-row targets are checked against it on replay).
    """

    def __init__(
        self,
        forward: Callable[[Tensor], Tensor],
        x: Tensor,
        b: Tensor,
        feature_shape: tuple[int, ...],
        spec: TargetSpec,
        settings: Settings,
        backend: IGOps,
        rows_per_chunk: int,
    ) -> None:
        self.forward = forward
        self.x = x  # (B, F)
        self.b = b  # (B, F)
        self.feature_shape = feature_shape
        self.spec = spec
        self.settings = settings
        self.backend = backend
        self.chunk_rows = rows_per_chunk
        self.acc = accumulate_dtype(x.dtype)
        self.batch, self.features = x.shape
        finite_difference = settings.gradient == "finite_difference"
        self.fd_step = (settings.fd_step or float(torch.finfo(x.dtype).eps) ** (1 / 3)) if finite_difference else None
        self.allow_oom_retry = True
        self.output_width = 0
        self.check_stochastic = True
        self.stochastic: Tensor | None = None

    # -- the whole attribution
    def attribute(self, n_steps: int) -> dict[str, Tensor]:
        """Attributions ``(T, B, F)`` and completeness ``stats (7, T, B)`` with ``n_steps`` points."""
        alphas, weights = rule_tensors(self.settings.method, n_steps, self.acc, self.x.device)
        grads, ends = self.gradients(alphas, with_ends=True)
        assert ends is not None  # noqa: S101 - with_ends=True
        return self.finish(weights, grads, ends)

    def finish(self, weights: Tensor, grads: Tensor, ends: Tensor) -> dict[str, Tensor]:
        """Attributions ``(T, B, F)`` and the completeness ``stats (7, T, B)`` (rows ``backends.STATS``).

        ``ends (2 c, B, T)``: with two copies, :attr:`stochastic` becomes whether they differ.
        """
        attributions = self.backend.accumulate(self.x, self.b, weights, grads.contiguous())  # (T, B, F)
        stats = self.backend.completeness(attributions, ends.contiguous())
        if ends.shape[0] == 4:
            self.stochastic = stats[_REPEAT_DIFFERS].any()
            if uses_batch_statistics(self.forward):  # identical rows of one batch agree then: found by looking
                self.stochastic = torch.ones_like(self.stochastic)
        return {"attributions": attributions, "stats": stats}

    def stochastic_flag(self) -> Tensor:
        """The 0-dim bool of the repeated-ends check (False where it did not run)."""
        if self.stochastic is None:
            return torch.zeros((), dtype=torch.bool, device=self.x.device)
        return self.stochastic

    # -- gradients along the path
    def gradients(self, alphas: Tensor, with_ends: bool) -> tuple[Tensor, Tensor | None]:
        """``grads (T, m, B, F)`` at ``alphas (m,)`` and, with ends, the target values ``(2 c, B, T)`` at x and b.

        With ends and :attr:`check_stochastic`, the ends ride twice (``c = 2``) in
        the same forwards, for :meth:`finish` to compare.
        """
        end_copies = (2 if self.check_stochastic else 1) if with_ends else 0
        points = self.backend.interpolate(self.x, self.b, alphas, end_copies).view(-1, self.features)  # ((m + 2c) B, F)
        if self.settings.gradient == "autograd":
            grads, ends = self._autograd(points, alphas.shape[0])
        else:
            grads, ends = self._finite_difference(points, alphas.shape[0])
        return self._own_columns(grads, ends)

    def _evaluate(self, rows: Tensor, first_row: int, spec: TargetSpec | None = None) -> Tensor:
        """The target values ``(n, T)`` of ``rows (n, F)``, rows ``first_row...`` of the ``(*, B)`` layout."""
        n_rows = rows.shape[0]
        try:
            outputs = self.forward(rows.view(n_rows, *self.feature_shape))
        except RuntimeError as error:
            raise_if_dtype_mismatch(self.forward, rows, error)
            raise
        selected = select(outputs, spec or self.spec, n_rows, first_row, self.batch)
        self.output_width = outputs.shape[1] if outputs.dim() == 2 else 1
        return selected

    def _chunked(self, total: int, unit: int, body: Callable[[int, int], None]) -> None:
        """Run ``body(start, stop)`` over ``[0, total)`` in chunks of whole ``unit``s; halve on CUDA OOM."""
        size = max(1, self.chunk_rows // unit)
        start = 0
        while start < total:
            stop = min(total, start + size)
            try:
                body(start, stop)
            except Exception as error:
                if not (self.allow_oom_retry and _is_oom(error)) or size == 1:
                    raise
                size = max(1, size // 2)
                warnings.warn(
                    f"CUDA ran out of memory with {(stop - start) * unit} rows per forward; retrying with "
                    f"internal_batch_size={size * unit} (pass a smaller internal_batch_size to skip this)",
                    RuntimeWarning,
                    stacklevel=5,
                )
                if self.x.device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            start = stop
        self.chunk_rows = size * unit

    def _autograd(self, points: Tensor, n_alphas: int) -> tuple[Tensor, Tensor | None]:
        path_rows = n_alphas * self.batch
        collected = _Collected()
        self._chunked(
            points.shape[0], 1, lambda start, stop: self._autograd_chunk(points, start, stop, path_rows, collected)
        )
        grads = collected.single.unsqueeze(0) if collected.single is not None else collected.grads
        grads = grads.view(-1, n_alphas, self.batch, self.features)  # (T, m, B, F)
        ends = collected.ends.view(-1, self.batch, collected.ends.shape[1]) if collected.ends is not None else None
        return grads, ends  # ends (2 c, B, T)

    def _autograd_chunk(self, points: Tensor, start: int, stop: int, path_rows: int, collected: _Collected) -> None:
        on_path = start < path_rows  # rows past the path are the two ends: values only
        rows = points[start:stop].detach().requires_grad_(on_path)
        with torch.set_grad_enabled(on_path):
            values = self._evaluate(rows, start)  # (n, T)
        if on_path and not values.requires_grad:
            raise ValueError(
                "gradient='autograd' needs a forward that autograd can differentiate, but its output has no "
                "grad_fn (it was computed outside autograd: numpy, .detach(), torch.no_grad inside the forward, ...); "
                "pass gradient='finite_difference' for such forwards"
            )
        n_targets = values.shape[1]
        if stop > path_rows:
            if collected.ends is None:
                collected.ends = torch.empty(
                    (points.shape[0] - path_rows, n_targets), dtype=self.acc, device=points.device
                )
            first_end = max(start, path_rows)
            collected.ends[first_end - path_rows : stop - path_rows] = values[first_end - start :].detach()
        if on_path:
            self._collect_gradients(values, rows, start, min(stop, path_rows), path_rows, collected)

    def _collect_gradients(
        self, values: Tensor, rows: Tensor, start: int, path_stop: int, path_rows: int, collected: _Collected
    ) -> None:
        n_targets = values.shape[1]
        for t in range(n_targets):
            (grad,) = torch.autograd.grad(values[:, t].sum(), rows, retain_graph=t + 1 < n_targets, allow_unused=True)
            if grad is None:
                raise ValueError(
                    "gradient='autograd' could not differentiate the forward's output w.r.t. its input (the input "
                    "does not reach the output through autograd); pass gradient='finite_difference' for such forwards"
                )
            grad = grad[: path_stop - start]  # (rows on the path, F)
            if start == 0 and path_stop == path_rows and n_targets == 1 and grad.dtype == self.acc:
                collected.single = grad  # the whole path in one chunk: no copy
                continue
            if collected.grads is None:
                collected.grads = torch.empty((n_targets, path_rows, self.features), dtype=self.acc, device=rows.device)
            collected.grads[t, start:path_stop] = grad

    def _finite_difference(self, points: Tensor, n_alphas: int) -> tuple[Tensor, Tensor | None]:
        assert self.fd_step is not None  # noqa: S101 - set for gradient="finite_difference"
        path_points = n_alphas * self.batch
        xa, ba = self.x.to(self.acc), self.b.to(self.acc)
        h = self.fd_step * torch.maximum(torch.maximum(xa.abs(), ba.abs()), torch.ones_like(xa))  # (B, F)
        collected = _Collected()

        def body(start: int, stop: int) -> None:
            self._finite_difference_chunk(points, h, start, stop, path_points, points.shape[0] - path_points, collected)

        self._chunked(path_points, 2 * self.features, body)  # 2 F probe rows per path point
        grads = collected.grads.view(-1, n_alphas, self.batch, self.features)  # (T, m, B, F)
        ends = collected.ends.view(-1, self.batch, collected.ends.shape[1]) if collected.ends is not None else None
        return grads, ends  # ends (2 c, B, T)

    def _finite_difference_chunk(
        self, points: Tensor, h: Tensor, start: int, stop: int, path_points: int, end_rows: int, collected: _Collected
    ) -> None:
        count, features = stop - start, self.features
        probe_rows = count * 2 * features
        extra = end_rows if stop == path_points else 0  # the ends (all copies) ride with the last chunk's probes
        buffer = torch.empty((probe_rows + extra, features), dtype=self.x.dtype, device=self.x.device)
        chunk_points = points[start:stop]
        self.backend.fd_probes(chunk_points, h, start, out=buffer[:probe_rows])
        if extra:
            buffer[probe_rows:] = points[path_points:]  # x then b, c times
        with torch.no_grad():
            values = self._evaluate(buffer, 0, self._probe_spec()).to(self.acc)
        n_targets = values.shape[1]
        if collected.grads is None:
            collected.grads = torch.empty((n_targets, path_points, features), dtype=self.acc, device=self.x.device)
        f = values[:probe_rows].view(count, 2, features, n_targets)  # (P, 2, F, T)
        self.backend.fd_gradient(chunk_points, h, f.contiguous(), start, collected.grads[:, start:stop])
        if extra:
            collected.ends = values[probe_rows:].contiguous()

    def _probe_spec(self) -> TargetSpec:
        # Per-row targets pick a column by state, but probe rows do not follow the (*, B) layout: finite
        # differences evaluate every column ("each") and keep each state's own afterwards (_own_columns).
        if self.spec.kind == "per_row":
            return TargetSpec("each", "each")
        return self.spec

    def _own_columns(self, grads: Tensor, ends: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """With per-row targets under finite differences, keep each state's own column of the ``"each"`` values."""
        if self.spec.kind != "per_row" or self.settings.gradient != "finite_difference":
            return grads, ends
        assert self.spec.rows is not None  # noqa: S101 - set for every per-row spec
        rows = self.spec.rows  # (B,)
        states = torch.arange(self.batch, device=rows.device)
        grads = grads[rows, :, states]  # (A, m, B, F) -> (B, m, F)
        grads = grads.transpose(0, 1).unsqueeze(0).contiguous()  # (1, m, B, F)
        if ends is not None:
            ends = ends[:, states, rows].unsqueeze(-1)  # (2, B, A) -> (2, B, 1)
        return grads, ends


class _Collected:
    """What the chunks of one pass produce: gradients ``(T, rows, F)``, end values ``(2 B, T)``."""

    def __init__(self) -> None:
        self.grads: Tensor | None = None
        self.ends: Tensor | None = None
        self.single: Tensor | None = None  # the whole path's gradient as autograd returned it (one chunk, one target)


def refine(run: PathRun, settings: Settings) -> tuple[dict[str, Tensor], int]:
    """``n_steps="auto"``: refine ``n`` until every state is within ``completeness_tol`` or ``max_steps`` is reached.

    Rules that nest (riemann_left/right on doubling, riemann_trapezoid on ``2n - 1``)
    reuse every gradient already evaluated; the others evaluate the new rule
    anew. The forward values at the ends are evaluated once. See
    :func:`_done` for when to stop.
    """
    method = settings.method
    n = max(2 if method == "riemann_trapezoid" else 1, min(AUTO_FIRST_STEPS, settings.max_steps))
    alphas, weights = rule_tensors(method, n, run.acc, run.x.device)
    grads, ends = run.gradients(alphas, with_ends=True)
    assert ends is not None  # noqa: S101 - with_ends=True
    while True:
        out = run.finish(weights, grads, ends)
        if n >= settings.max_steps or _done(out["stats"], settings.completeness_tol):
            return out, n
        refined = min(n * 2 - 1 if method == "riemann_trapezoid" else n * 2, settings.max_steps)
        grads = _refined_gradients(run, method, n, refined, grads)
        _, weights = rule_tensors(method, refined, run.acc, run.x.device)
        n = refined


def _refined_gradients(run: PathRun, method: str, n: int, refined: int, grads: Tensor) -> Tensor:
    """The gradients ``(T, refined, B, F)`` of the refined rule, reusing ``grads`` where the rule nests."""
    alphas, _ = rule_tensors(method, refined, run.acc, run.x.device)
    nested = refined == (n * 2 - 1 if method == "riemann_trapezoid" else n * 2)
    if not (nests_on_doubling(method) and nested):
        fresh, _ = run.gradients(alphas, with_ends=False)
        return fresh
    # Old points sit at every other index of the refined rule: even for left and trapezoid, odd for right.
    old_index = list(range(1 if method == "riemann_right" else 0, refined, 2))
    new_index = sorted(set(range(refined)) - set(old_index))
    fresh, _ = run.gradients(alphas[new_index], with_ends=False)
    merged = torch.empty((grads.shape[0], refined, *grads.shape[2:]), dtype=grads.dtype, device=grads.device)
    merged[:, old_index] = grads
    merged[:, new_index] = fresh
    return merged


def _done(stats: Tensor, tolerance: float) -> bool:
    """Whether ``n_steps="auto"`` stops here: every state within ``tolerance``, or a state non-finite.

    A checked state is judged by its relative error; a degenerate one (no ratio
    to form) by its absolute error ``|delta| <= tolerance * max(1, |F(x)|, |F(b)|)``,
    so a batch of degenerate states is refined like any other and never stops on
    a NaN. A non-finite state stops the refinement at once: more steps cannot
    repair NaN/Inf weights or outputs, and the result says so.
    """
    f_input, f_baseline, delta, relative, degenerate, non_finite, _ = stats  # each (T, B)
    scale = torch.maximum(torch.maximum(f_input.abs(), f_baseline.abs()), torch.ones_like(f_input))
    within = torch.where(degenerate != 0, delta.abs() <= tolerance * scale, relative <= tolerance)
    any_non_finite, all_within = torch.stack([(non_finite != 0).any(), within.all()]).tolist()  # one host sync
    return bool(any_non_finite or all_within)
