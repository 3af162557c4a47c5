"""The path integral: interpolation, chunked forwards, gradients (autograd or finite differences), refinement.

A :class:`PathRun` holds one attribution problem with its states flattened to ``(B, F)``; the same code runs eagerly and
under CUDA-graph capture. All ``n_steps x B`` path points and the two ends (twice: the stochastic-forward check) come
from one interpolation and are evaluated in batched forwards of at most ``chunk_rows`` rows (halved on a CUDA
out-of-memory, eager runs only). Gradients are one ``torch.autograd.grad`` per chunk and target w.r.t. the points
(never ``.backward()``, never a parameter's ``.grad``), or central differences with ``h_i = fd_step * max(1, |x_i|,
|b_i|)``. The node values are kept for the error estimate (:mod:`~lightning_ig.attribution.estimate`);
``target="contrast"`` chooses its pairs from one forward at ``x`` before the path; the backend sums the attributions
and their completeness. Each step and why: ``docs/ARCHITECTURE.md`` (the engine).

``n_steps="auto"`` is :mod:`~lightning_ig.attribution.auto_steps`' (sub-batches of this class).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from lightning_ig.attribution.budget import STEP_CHOICES
from lightning_ig.attribution.estimate import accuracy_rows, error_estimate
from lightning_ig.attribution.inputs import raise_if_dtype_mismatch, uses_batch_statistics
from lightning_ig.attribution.kinks import BUDGET_NODES, kink_rule
from lightning_ig.attribution.quadrature import quadrature
from lightning_ig.attribution.settings import DEFAULT_MAX_STEPS, IGOptions
from lightning_ig.attribution.targets import EACH, Target, choose_contrast
from lightning_ig.ops.dtypes import accumulate_dtype
from lightning_ig.ops.ig import STATS, IGOps
from lightning_ig.vocabulary import KINK_METHOD, check_memory

__all__ = ["CPU_CHUNK_ROWS", "PathGradients", "PathRun", "check_run_memory", "chunk_rows", "rule_tensors"]

_SMALL_WORK_BYTES = 256 << 20
CPU_CHUNK_ROWS = 1024
"""The most rows per forward on the CPU (``internal_batch_size=None``)."""
_REPEAT_DIFFERS = STATS.index("repeat_differs")
_FD_HINT = "pass gradient='finite_difference' for such forwards"
_RULE_CACHE: dict[tuple[str, int, torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}


def rule_tensors(method: str, n_steps: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(alphas, weights)`` as tensors on ``device``, cached: a host-to-device copy per call is a sync we skip."""
    key = (method, n_steps, dtype, device)
    if (cached := _RULE_CACHE.get(key)) is None:
        alphas, weights = quadrature(method, n_steps)
        cached = (torch.tensor(alphas, dtype=dtype, device=device), torch.tensor(weights, dtype=dtype, device=device))
        if len(_RULE_CACHE) < 256:
            _RULE_CACHE[key] = cached
    return cached


def chunk_rows(settings: IGOptions, x: Tensor) -> int:
    """Rows per forward: ``internal_batch_size``, or a quarter of the free memory by a rough per-row guess, and on
    the CPU at most :data:`CPU_CHUNK_ROWS`.

    The guess is 32 copies of a row plus 16 KiB of activations; work that needs at most 256 MiB by it runs in one chunk
    without asking the device.
    """
    if settings.internal_batch_size is not None:
        return settings.internal_batch_size
    batch, features = x.shape
    steps = settings.max_steps if settings.n_steps == "auto" else int(settings.n_steps)
    per_point = 2 * features if settings.gradient == "finite_difference" else 1
    rows_needed = steps * batch * per_point + 4 * batch  # the path (or its probes) and the two ends, twice
    per_row = 32 * features * x.element_size() + 16 * 1024
    if x.device.type != "cuda":
        # a CPU's caches, not its memory, decide: chunks of about a thousand rows ran faster than one large batch
        return max(1, min(CPU_CHUNK_ROWS, rows_needed, int((1 << 30) // per_row)))
    if rows_needed * per_row <= _SMALL_WORK_BYTES:
        return max(1, rows_needed)
    free, _ = torch.cuda.mem_get_info(x.device)
    cached = torch.cuda.memory_reserved(x.device) - torch.cuda.memory_allocated(x.device)
    return max(1, int((free + max(cached, 0)) // 4 // per_row))


def check_run_memory(
    rows: int,
    width: int,
    n_steps: int | str,
    what: str,
    fix: str,
    max_steps: int = DEFAULT_MAX_STEPS,
    fewest: bool = False,
) -> None:
    """Refuse IG of ``rows`` rows of ``width`` features whose path needs more memory than is available (``ValueError``:
    ``what`` needs..., ``fix``) at ``"auto"``'s (to ``max_steps``) or ``"budget"``'s most nodes, or ``fewest``."""
    steps = {"auto": (min(BUDGET_NODES, max_steps), max_steps), "budget": (min(STEP_CHOICES), max(STEP_CHOICES))}
    nodes = steps[n_steps][not fewest] if isinstance(n_steps, str) else n_steps
    # A few copies of a state; 2 KB a state (its result's and report's rows), 128 B a node beside its 8 B a feature
    # (110 B at 4 features, 15 KB at 2,000). A fit's peak, every state refined: 1.0-1.4 times this (trust checks).
    check_memory(rows * (2048 + 64 * width + nodes * (128 + 8 * width)), what, fix)


class PathGradients(NamedTuple):
    """What one pass along the path gives: gradients, the target at the ends, the target at the nodes."""

    grads: Tensor  # (T, m, B, F) in the accumulation dtype
    ends: Tensor | None  # (2 c, B, T): F(x) and F(b), c copies
    values: Tensor  # (T, m, B) the forward values at the nodes


class PathRun:
    """One attribution problem, states flattened to ``(B, F)``; see the module docstring.

    Attributes:
        backend: the operations' implementation (swapped for its twin when a capture fails).
        check_stochastic: evaluate the ends twice and compare (off inside a capture).
        stochastic: the 0-dim bool device tensor of that check, once run.
        allow_oom_retry: halve the chunk on out-of-memory (off inside a capture).
        output_width: the forward's ``A`` seen last (per-row targets are checked against it on replay).
        pairs: ``(B, 2)`` the greedy and runner-up outputs of each state for ``target="contrast"``, else ``None``.
        choose_pairs: choose :attr:`pairs` from ``F(x)`` at each pass (off for a sub-batch that was given them).
    """

    def __init__(
        self,
        forward: Callable[[Tensor], Tensor],
        x: Tensor,
        b: Tensor,
        feature_shape: tuple[int, ...],
        spec: Target,
        settings: IGOptions,
        backend: IGOps,
        rows_per_chunk: int,
    ) -> None:
        self.forward = forward
        self.x = x  # (B, F)
        self.b = b  # (B, F)
        self.feature_shape, self.spec, self.settings = feature_shape, spec, settings
        self.backend, self.chunk_rows = backend, rows_per_chunk
        self.acc = accumulate_dtype(x.dtype)
        self.batch, self.features = x.shape
        finite_difference = settings.gradient == "finite_difference"
        self.fd_step = (settings.fd_step or float(torch.finfo(x.dtype).eps) ** (1 / 3)) if finite_difference else None
        if self.fd_step is not None and self.fd_step < 16 * torch.finfo(x.dtype).eps:  # x +- h rounds to x: zeros
            raise ValueError(
                f"fd_step {self.fd_step:.3g} is below 16 eps of {x.dtype} ({16 * torch.finfo(x.dtype).eps:.3g}), the "
                "inputs' dtype; leave it None (the default, eps ** (1/3)) or give a larger step"
            )
        self.allow_oom_retry = True
        self.output_width = 0
        self.check_stochastic = True
        self.stochastic: Tensor | None = None
        self.pairs: Tensor | None = None
        self.choose_pairs = spec.chooses_pairs
        if self.choose_pairs:  # a buffer the pass fills (a captured graph's replay refills it for its inputs)
            self.pairs = torch.zeros((self.batch, 2), dtype=torch.int64, device=x.device)
            self.spec = dataclasses.replace(spec, rows=self.pairs)

    def subset(self, states: Tensor) -> PathRun:
        """A run over the states ``states`` (indices) only, with their targets fixed: ``n_steps="auto"``'s sub-batch."""
        sub = PathRun(
            self.forward,
            self.x[states],
            self.b[states],
            self.feature_shape,
            self.spec.subset(states),
            self.settings,
            self.backend,
            self.chunk_rows,
        )
        sub.check_stochastic = False
        sub.pairs = None if self.pairs is None else self.pairs[states]
        return sub

    # -- the whole attribution
    def attribute(self, n_steps: int) -> dict[str, Tensor]:
        """Attributions ``(T, B, F)``, ``stats (7, T, B)`` and ``accuracy (3, T, B)`` with ``n_steps`` points."""
        alphas, weights = rule_tensors(self.settings.method, n_steps, self.acc, self.x.device)
        path = self.gradients(alphas, with_ends=True)
        assert path.ends is not None  # noqa: S101 - with_ends=True
        return self.finish(alphas, weights, path.grads, path.ends, path.values)

    def finish(
        self, alphas: Tensor, weights: Tensor, grads: Tensor, ends: Tensor, values: Tensor, *, kinks: bool | None = None
    ) -> dict[str, Tensor]:
        """Attributions ``(T, B, F)``, the completeness ``stats (7, T, B)`` (rows ``STATS``) and the error figures
        ``accuracy (3, T, B)`` (rows :data:`~lightning_ig.attribution.estimate.ACCURACY_ROWS`), all on the device.

        ``ends (2 c, B, T)``: with two copies, :attr:`stochastic` becomes whether they differ. With ``kinks`` (by
        default: where the settings' method is ``"kink_midpoint"``) the nodes are the midpoint rule's and
        :mod:`~lightning_ig.attribution.kinks` weighs them per state (one more, forward-only pass: the certificate).
        """
        diff = self.x.to(self.acc) - self.b.to(self.acc)
        eps = float(torch.finfo(self.x.dtype).eps)  # the forward's rounding unit, for the figures' noise floors
        if self.settings.method == KINK_METHOD if kinks is None else kinks:
            node_weights, estimate = kink_rule(grads, values, ends, diff, alphas, self.values_at, eps)
            attributions = self.backend.accumulate(self.x, self.b, node_weights, grads.contiguous())  # (T, B, F)
            numerator = estimate(attributions)
            stats = self._completeness(attributions, ends)
        else:
            attributions = self.backend.accumulate(self.x, self.b, weights, grads.contiguous())  # (T, B, F)
            stats = self._completeness(attributions, ends)
            numerator = error_estimate(grads, values, diff, alphas, weights, stats[0], stats[1], attributions, eps)
        accuracy = accuracy_rows(attributions, stats, numerator, eps)
        return {"attributions": attributions, "stats": stats, "accuracy": accuracy}

    def _completeness(self, attributions: Tensor, ends: Tensor) -> Tensor:
        stats = self.backend.completeness(attributions, ends.contiguous())
        if ends.shape[0] == 4:
            self.stochastic = stats[_REPEAT_DIFFERS].any()
            if uses_batch_statistics(self.forward):  # identical rows of one batch agree then: found by looking
                self.stochastic = torch.ones_like(self.stochastic)
        return stats

    def values_at(self, positions: Tensor) -> Tensor:
        """The target's values ``(T, k, B)`` at ``b + positions (x - b)``, ``positions (T, k, B)`` (forward only, in
        chunks; float64 like ``positions``)."""
        n_targets, count, batch = positions.shape
        out = torch.empty_like(positions)
        b, diff = self.b.to(positions.dtype), (self.x.to(positions.dtype) - self.b.to(positions.dtype))
        size = max(batch, (self.chunk_rows // batch) * batch)
        with torch.no_grad():
            for t in range(n_targets):
                rows = (b + positions[t].unsqueeze(-1) * diff).to(self.x.dtype).view(-1, self.features)  # (k B, F)
                found = [self._evaluate(rows[s : s + size], s)[:, t] for s in range(0, rows.shape[0], size)]
                out[t] = torch.cat(found).view(count, batch).to(positions.dtype)
        return out

    def stochastic_flag(self) -> Tensor:
        """The 0-dim bool of the repeated-ends check (False where it did not run)."""
        return torch.zeros((), dtype=torch.bool, device=self.x.device) if self.stochastic is None else self.stochastic

    # -- gradients along the path
    def gradients(self, alphas: Tensor, with_ends: bool) -> PathGradients:
        """``grads (T, m, B, F)`` and the target's values ``(T, m, B)`` at ``alphas (m,)`` and, with ends, its values
        ``(2 c, B, T)`` at x and b.

        With ends and :attr:`check_stochastic`, the ends ride twice (``c = 2``) in the same forwards, for :meth:`finish`
        to compare.
        """
        if self.choose_pairs:
            self._choose_pairs()
        end_copies = (2 if self.check_stochastic else 1) if with_ends else 0
        points = self.backend.interpolate(self.x, self.b, alphas, end_copies).view(-1, self.features)  # ((m + 2c) B, F)
        along = self._autograd if self.settings.gradient == "autograd" else self._finite_difference
        return self._own_columns(along(points, alphas.shape[0]))

    def _choose_pairs(self) -> None:
        """Fill :attr:`pairs` with each state's greedy and runner-up outputs at ``x`` (one forward of ``B`` rows)."""
        assert self.pairs is not None  # noqa: S101 - set for every contrast run
        with torch.no_grad():
            try:
                outputs = self.forward(self.x.view(self.batch, *self.feature_shape).clone())  # x may be the caller's
            except RuntimeError as error:
                raise_if_dtype_mismatch(self.forward, self.x, error)
                raise
        self.pairs.copy_(choose_contrast(outputs, self.batch))

    def _evaluate(self, rows: Tensor, first_row: int, spec: Target | None = None) -> Tensor:
        """The target values ``(n, T)`` of ``rows (n, F)``, rows ``first_row...`` of the ``(*, B)`` layout."""
        n_rows = rows.shape[0]
        try:
            outputs = self.forward(rows.view(n_rows, *self.feature_shape))
        except RuntimeError as error:
            raise_if_dtype_mismatch(self.forward, rows, error)
            raise
        batch = self.batch
        selected = (spec or self.spec).select(
            outputs, n_rows, lambda: torch.arange(first_row, first_row + n_rows, device=outputs.device) % batch
        )  # row r of the (*, B) layout is state r % B
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
                oom = isinstance(error, RuntimeError) and "out of memory" in str(error)  # torch.OutOfMemoryError too
                if not (self.allow_oom_retry and oom) or size == 1:
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

    def _autograd(self, points: Tensor, n_alphas: int) -> PathGradients:
        path_rows, collected = n_alphas * self.batch, _Collected()
        self._chunked(
            points.shape[0], 1, lambda start, stop: self._autograd_chunk(points, start, stop, path_rows, collected)
        )
        return collected.path(n_alphas, self.batch, self.features)

    def _autograd_chunk(self, points: Tensor, start: int, stop: int, path_rows: int, collected: _Collected) -> None:
        on_path = start < path_rows  # rows past the path are the two ends: values only
        rows = points[start:stop].detach().requires_grad_(on_path)
        with torch.set_grad_enabled(on_path):
            values = self._evaluate(rows, start)  # (n, T)
        if on_path and not values.requires_grad:
            raise ValueError(
                "gradient='autograd' needs a forward that autograd can differentiate, but its output has no "
                "grad_fn (it was computed outside autograd: numpy, .detach(), torch.no_grad inside the forward, ...); "
                f"{_FD_HINT}"
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
            path_stop = min(stop, path_rows)
            if collected.values is None:
                collected.values = torch.empty((n_targets, path_rows), dtype=self.acc, device=points.device)
            collected.values[:, start:path_stop] = values[: path_stop - start].detach().T
            self._collect_gradients(values, rows, start, path_stop, path_rows, collected)

    def _collect_gradients(
        self, values: Tensor, rows: Tensor, start: int, path_stop: int, path_rows: int, collected: _Collected
    ) -> None:
        n_targets = values.shape[1]
        for t in range(n_targets):
            try:
                (grad,) = torch.autograd.grad(
                    values[:, t].sum(), rows, retain_graph=t + 1 < n_targets, allow_unused=True
                )
            except RuntimeError as error:  # an op without a derivative (heaviside, ...): torch's message names it
                if "not implemented" not in str(error):
                    raise
                raise ValueError(f"gradient='autograd' failed: {error}; {_FD_HINT}") from error
            if grad is None:
                raise ValueError(
                    "gradient='autograd' could not differentiate the forward's output w.r.t. its input (the input "
                    f"does not reach the output through autograd); {_FD_HINT}"
                )
            grad = grad[: path_stop - start]  # (rows on the path, F)
            if start == 0 and path_stop == path_rows and n_targets == 1 and grad.dtype == self.acc:
                collected.single = grad  # the whole path in one chunk: no copy
                continue
            if collected.grads is None:
                collected.grads = torch.empty((n_targets, path_rows, self.features), dtype=self.acc, device=rows.device)
            collected.grads[t, start:path_stop] = grad

    def _finite_difference(self, points: Tensor, n_alphas: int) -> PathGradients:
        assert self.fd_step is not None  # noqa: S101 - set for gradient="finite_difference"
        path_points = n_alphas * self.batch
        xa, ba = self.x.to(self.acc), self.b.to(self.acc)
        h = self.fd_step * torch.maximum(torch.maximum(xa.abs(), ba.abs()), torch.ones_like(xa))  # (B, F)
        collected = _Collected()

        def body(start: int, stop: int) -> None:
            self._finite_difference_chunk(points, h, start, stop, path_points, points.shape[0] - path_points, collected)

        self._chunked(path_points, 2 * self.features, body)  # 2 F probe rows per path point
        return collected.path(n_alphas, self.batch, self.features)

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
        # Per-row and contrast targets pick columns by state, but probe rows do not follow the (*, B) layout: finite
        # differences evaluate every column ("each") and keep each state's own afterwards (_own_columns).
        with torch.no_grad():
            values = self._evaluate(buffer, 0, EACH if self.spec.by_state else self.spec).to(self.acc)
        n_targets = values.shape[1]
        if collected.grads is None or collected.values is None:
            collected.grads = torch.empty((n_targets, path_points, features), dtype=self.acc, device=self.x.device)
            collected.values = torch.empty((n_targets, path_points), dtype=self.acc, device=self.x.device)
        f = values[:probe_rows].view(count, 2, features, n_targets)  # (P, 2, F, T)
        self.backend.fd_gradient(chunk_points, h, f.contiguous(), start, collected.grads[:, start:stop])
        # The value at a node: the mean of its 2 F probes, F(p) + O(h^2) (exact on a linear piece); no extra forward.
        collected.values[:, start:stop] = f.mean(dim=(1, 2)).T
        if extra:
            collected.ends = values[probe_rows:].contiguous()

    def _own_columns(self, path: PathGradients) -> PathGradients:
        """With per-row or contrast targets under finite differences, each state's own columns of ``"each"``."""
        if not self.spec.by_state or self.settings.gradient != "finite_difference":
            return path
        assert self.spec.rows is not None  # noqa: S101 - set for every per-row and contrast spec
        rows = self.spec.rows  # (B,) or (B, 2): greedy, runner-up
        states = torch.arange(self.batch, device=rows.device)
        pick = rows if rows.dim() == 1 else rows[:, 0]
        grads = path.grads[pick, :, states]  # (A, m, B, F) -> (B, m, F)
        values = path.values[pick, :, states]  # (A, m, B) -> (B, m)
        ends = None if path.ends is None else path.ends[:, states, pick]  # (2 c, B, A) -> (2 c, B)
        if rows.dim() == 2:  # contrast: the greedy column minus the runner-up's
            grads = grads - path.grads[rows[:, 1], :, states]
            values = values - path.values[rows[:, 1], :, states]
            if path.ends is not None:
                ends = path.ends[:, states, pick] - path.ends[:, states, rows[:, 1]]
        return PathGradients(
            grads.transpose(0, 1).unsqueeze(0).contiguous(),  # (1, m, B, F)
            None if ends is None else ends.unsqueeze(-1),  # (2 c, B, 1)
            values.T.unsqueeze(0).contiguous(),  # (1, m, B)
        )


class _Collected:
    """What the chunks of one pass produce: gradients ``(T, rows, F)``, node values ``(T, rows)``, ends ``(2 B, T)``."""

    def __init__(self) -> None:
        self.grads: Tensor | None = None
        self.values: Tensor | None = None
        self.ends: Tensor | None = None
        self.single: Tensor | None = None  # the whole path's gradient as autograd returned it (one chunk, one target)

    def path(self, n_alphas: int, batch: int, features: int) -> PathGradients:
        grads = self.single.unsqueeze(0) if self.single is not None else self.grads
        assert grads is not None and self.values is not None  # noqa: S101 - every pass has rows on the path
        ends = None if self.ends is None else self.ends.view(-1, batch, self.ends.shape[1])  # (2 c, B, T)
        return PathGradients(grads.view(-1, n_alphas, batch, features), ends, self.values.view(-1, n_alphas, batch))
