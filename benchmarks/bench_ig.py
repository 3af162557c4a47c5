"""Side-by-side timing of the IG engine on a CUDA device (issue 2, "Performance").

Model: a dueling MLP (two hidden layers of 256, ReLU, 4 actions); target: the
mean over actions (V(s)); 50 Gauss-Legendre steps. Two cases:

* S: F = 32 features, B = 16 states
* L: F = 128 features, B = 256 states

Rows, all in the same process on the same device:

* ours, autograd, single call: ``integrated_gradients(...)`` eagerly (no graph
  cache); the kernels are compiled by a warm-up call on another shape first.
* ours, autograd, repeated: ``IntegratedGradients.attribute`` on the same shapes
  (what the callback does): a CUDA-graph replay after the first call.
* ours, finite differences, single call.
* Captum's ``IntegratedGradients`` (same method and steps), if captum imports.
* the per-feature loop: for each state, step and feature, two one-row forwards,
  each read back to the host (the per-probe design this engine replaces). Only a
  capped number of probes is timed and the total is extrapolated (the table says
  so); its attributions are computed in full for a few states and compared with
  ours in finite-difference mode, with the same step.
* the limit probe: one CUDA-graph replay of a single batched forward plus
  input-gradient over all ``B x n_steps`` points, the floor for any IG.

Times are medians over repetitions, each call bracketed by CUDA events and
synchronised, so they are per-call latencies including host launch overhead.
Peak memory is ``torch.cuda.max_memory_allocated`` above what was allocated
before the row ran.

Usage::

    PYTHONPATH=. python benchmarks/bench_ig.py [--quick] [--output benchmarks/results/bench_ig.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from lightning_ig import _cuda
from lightning_ig.attribution import IntegratedGradients, integrated_gradients

ACTIONS = 4
HIDDEN = 256
N_STEPS = 50
METHOD = "gausslegendre"
CASES = {"S": (32, 16), "L": (128, 256)}  # name -> (features, batch)


class DuelingMLP(torch.nn.Module):
    """Two hidden layers of 256 with ReLU, a value and an advantage head, Q = V + A - mean(A)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(features, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()
        )
        self.value = torch.nn.Linear(HIDDEN, 1)
        self.advantage = torch.nn.Linear(HIDDEN, ACTIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        advantage = self.advantage(hidden)
        return self.value(hidden) + advantage - advantage.mean(dim=1, keepdim=True)


@dataclass
class Row:
    case: str
    name: str
    median_ms: float | None
    peak_mib: float | None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def _time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median milliseconds per call (CUDA events around each call) and the peak MiB above the start."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return statistics.median(times), peak


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def _limit_probe(model: torch.nn.Module, points: torch.Tensor) -> Callable[[], object]:
    """One captured batched forward + input-gradient over all points; returns the replay."""
    static = points.clone().requires_grad_(True)

    def step() -> torch.Tensor:
        values = model(static).mean(dim=1)
        (grad,) = torch.autograd.grad(values.sum(), static)
        return grad

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _per_feature_loop(model: torch.nn.Module, x: torch.Tensor, b: torch.Tensor, h: torch.Tensor, alphas: list[float],
                      weights: list[float], states: list[int], max_probes: int | None) -> tuple[float, int, torch.Tensor | None]:  # fmt: skip
    """The per-probe design: two one-row forwards per (state, step, feature), each read back with .item().

    Returns the seconds per probe (a probe = one +h and one -h forward), the probes run and, when every
    probe of ``states`` ran, their attributions ``(len(states), F)``.
    """
    features = x.shape[1]
    probes = 0
    attributions = torch.zeros(len(states), features, dtype=torch.float64)
    complete = True
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        for row, s in enumerate(states):
            for alpha, weight in zip(alphas, weights):
                point = b[s] + alpha * (x[s] - b[s])
                for i in range(features):
                    if max_probes is not None and probes >= max_probes:
                        complete = False
                        break
                    plus = point.clone()
                    minus = point.clone()
                    plus[i] = point[i] + h[s, i]
                    minus[i] = point[i] - h[s, i]
                    f_plus = model(plus.unsqueeze(0)).mean().item()
                    f_minus = model(minus.unsqueeze(0)).mean().item()
                    step = float(plus[i]) - float(minus[i])  # the step the forward saw, as ours uses
                    attributions[row, i] += weight * (f_plus - f_minus) / step
                    probes += 1
    elapsed = time.perf_counter() - started
    if not complete:
        return elapsed / max(probes, 1), probes, None
    attributions *= (x[states] - b[states]).double().cpu()
    return elapsed / max(probes, 1), probes, attributions


def run_case(case: str, features: int, batch: int, *, quick: bool, device: torch.device) -> list[Row]:
    repeats = 5 if quick else 30
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = DuelingMLP(features).to(device).eval()
    x = torch.randn(batch, features, generator=generator).to(device)
    b = torch.zeros_like(x)
    value = lambda z: model(z).mean(dim=1)  # noqa: E731 - V(s) under the dueling identity
    rows: list[Row] = []
    backend = _cuda.resolve_backend("auto", x)

    # Warm-up on another shape: compiles the kernels so "single call on new shapes" times the call, not NVRTC.
    integrated_gradients(model, torch.randn(3, features, device=device), target="mean", n_steps=4)
    integrated_gradients(model, torch.randn(3, features, device=device), target="mean", n_steps=4, gradient="finite_difference")

    ours = integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD)
    single_ms, single_mib = _time(lambda: integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD), repeats)
    rows.append(Row(case, f"ours, autograd, single call ({backend})", single_ms, single_mib,
                    extra={"worst_relative_error": ours.worst_relative_error}))  # fmt: skip

    engine = IntegratedGradients(model, target="mean", n_steps=N_STEPS, method=METHOD)
    torch.cuda.synchronize()
    before_capture = torch.cuda.memory_allocated()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replayed = engine.attribute(x)
    torch.cuda.synchronize()
    pool_mib = (torch.cuda.memory_allocated() - before_capture) / 2**20
    capture_note = "; ".join(str(w.message) for w in caught) or f"graph pool {pool_mib:.1f} MiB (held between calls)"
    repeat_ms, repeat_mib = _time(lambda: engine.attribute(x), repeats * 3, warmup=3)
    rows.append(Row(case, "ours, autograd, repeated (CUDA graph)" if replayed.cuda_graph else "ours, autograd, repeated (eager)",
                    repeat_ms, repeat_mib, note=capture_note,
                    extra={"vs single call": _relative(replayed.attributions, ours.attributions)}))  # fmt: skip

    fd = integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD, gradient="finite_difference")
    fd_ms, fd_mib = _time(
        lambda: integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD, gradient="finite_difference"),
        max(3, repeats // 3),
    )
    rows.append(Row(case, f"ours, finite differences, single call ({backend})", fd_ms, fd_mib,
                    extra={"vs autograd": _relative(fd.attributions, ours.attributions)}))  # fmt: skip

    try:
        from captum.attr import IntegratedGradients as CaptumIG  # noqa: PLC0415 - optional

        captum = CaptumIG(value)
        theirs = captum.attribute(x, b, n_steps=N_STEPS, method=METHOD)
        captum_ms, captum_mib = _time(lambda: captum.attribute(x, b, n_steps=N_STEPS, method=METHOD), max(3, repeats // 2))
        rows.append(Row(case, "Captum IntegratedGradients", captum_ms, captum_mib,
                        extra={"ours vs Captum": _relative(ours.attributions, theirs)}))  # fmt: skip
    except ImportError:
        rows.append(Row(case, "Captum IntegratedGradients", None, None, note="n/a: captum not installed"))

    # The per-feature loop with our step h = fd_step * max(1, |x|, |b|), so the two agree up to rounding.
    from lightning_ig.quadrature import quadrature  # noqa: PLC0415

    alphas, weights = quadrature(METHOD, N_STEPS)
    h = (fd.fd_step or 0.0) * torch.maximum(torch.maximum(x.abs(), b.abs()), torch.ones_like(x))
    cap = 200 if quick else 2000
    per_probe_s, probes, _ = _per_feature_loop(model, x, b, h, alphas, weights, list(range(batch)), cap)
    total_probes = batch * N_STEPS * features
    loop_ms = per_probe_s * total_probes * 1e3
    extra: dict[str, float] = {}
    agreement_states = [0] if (quick or case == "L") else [0, batch - 1]
    _, _, loop_attr = _per_feature_loop(model, x, b, h, alphas, weights, agreement_states, None)
    if loop_attr is not None:
        extra["FD vs loop"] = _relative(fd.attributions[agreement_states].double().cpu(), loop_attr)
    rows.append(Row(case, "per-feature loop (extrapolated)", loop_ms, None,
                    note=f"timed {probes} of {total_probes} probes ({per_probe_s * 1e6:.0f} us each) and extrapolated; "
                         f"agreement on states {agreement_states}",
                    extra=extra))  # fmt: skip

    points = (b.unsqueeze(0) + torch.tensor(alphas, device=device).view(-1, 1, 1) * (x - b).unsqueeze(0)).reshape(-1, features)
    replay = _limit_probe(model, points)
    limit_ms, limit_mib = _time(replay, repeats * 3, warmup=3)
    rows.append(Row(case, "limit probe (graph: forward + input-gradient)", limit_ms, limit_mib))
    return rows


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:,.0f}"


def render(rows: list[Row], header: str) -> str:
    lines = [header, "", "| case | what | median ms | peak MiB | agreement / notes |", "|---|---|---:|---:|---|"]
    for row in rows:
        extra = ", ".join(f"{k}: {v:.2e}" for k, v in row.extra.items())
        notes = "; ".join(x for x in (extra, row.note) if x)
        lines.append(f"| {row.case} | {row.name} | {_fmt(row.median_ms)} | {_fmt(row.peak_mib)} | {notes} |")
    lines += ["", "| case | target | measured | goal | met |", "|---|---|---:|---:|---|"]
    for case in sorted({row.case for row in rows}, key=lambda c: list(CASES).index(c)):
        by = {row.name.split(" (")[0]: row for row in rows if row.case == case}
        single = by.get("ours, autograd, single call")
        repeated = next((r for r in rows if r.case == case and r.name.startswith("ours, autograd, repeated")), None)
        fd = by.get("ours, finite differences, single call")
        captum = by.get("Captum IntegratedGradients")
        loop = by.get("per-feature loop")
        limit = by.get("limit probe")

        def ratio(a: Row | None, b: Row | None) -> float | None:
            if a is None or b is None or a.median_ms is None or b.median_ms is None or b.median_ms == 0:
                return None
            return a.median_ms / b.median_ms

        checks = [
            ("Captum / ours single call", ratio(captum, single), ">= 10", lambda v: v >= 10),
            ("Captum / ours repeated", ratio(captum, repeated), ">= 20", lambda v: v >= 20),
            ("ours repeated / limit probe", ratio(repeated, limit), "<= 2", lambda v: v <= 2),
            ("loop / ours FD", ratio(loop, fd), ">= 1000 (S)", lambda v: v >= 1000 or case != "S"),
            ("ours vs Captum (max rel)", captum.extra.get("ours vs Captum") if captum else None, "<= 1e-4", lambda v: v <= 1e-4),
            ("FD vs loop (max rel)", loop.extra.get("FD vs loop") if loop else None, "<= 1e-3", lambda v: v <= 1e-3),
        ]
        for name, value, goal, ok in checks:
            met = "n/a" if value is None else ("yes" if ok(value) else "NO")
            shown = "n/a" if value is None else (f"{value:.3g}" if "rel" not in name else f"{value:.2e}")
            lines.append(f"| {case} | {name} | {shown} | {goal} | {met} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions and probes: a smoke run")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/bench_ig.md"), help="where the markdown goes")
    parser.add_argument("--cases", default="S,L", help="comma-separated cases to run (S, L)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_ig.py needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    try:
        import captum  # noqa: PLC0415

        captum_version = captum.__version__
    except ImportError:
        captum_version = "not installed"
    try:
        cupy_version = _cuda.require_cupy().__version__
    except RuntimeError:
        cupy_version = "not installed (torch backend)"
    header = (
        f"## bench_ig ({'quick' if args.quick else 'full'})\n\n"
        f"{torch.cuda.get_device_name(device)}; torch {torch.__version__}; CuPy {cupy_version}; Captum {captum_version}; "
        f"Python {platform.python_version()}. Dueling MLP {HIDDEN}x{HIDDEN} ReLU, {ACTIONS} actions, target mean, "
        f"n_steps {N_STEPS} ({METHOD}). Median per-call latency (CUDA events, synchronised per call)."
    )
    rows: list[Row] = []
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        features, batch = CASES[case]
        print(f"case {case}: F={features}, B={batch} ...", flush=True)
        rows += run_case(case, features, batch, quick=args.quick, device=device)
    table = render(rows, header)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table + "\n", encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
