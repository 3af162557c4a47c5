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

A second table, the host-time breakdown of case S (the single call and the
graph replay, both host-bound), so that the next regression shows where it is:

* per call, the host's time until the call returns (``time.perf_counter_ns``
  around it, the device idle before), the wall time until the device is done,
  and the device's span (CUDA events): host-bound when the first is most of
  the second;
* the call tree under cProfile over many calls: each function of the package
  below the public call, with its cumulative time per call and share of the
  call, and its phase (option parsing, input checks, target, path: forwards and
  gradients, kernels, accumulation, completeness, graph replay, result
  building) read off the module and function names; torch's functions are
  leaves. cProfile's own overhead inflates every row (the table says by how
  much against the un-profiled host time); shares are what to compare;
* the top 10 host functions by cumulative time per call, the package's and
  torch's alike.

Usage::

    PYTHONPATH=. python benchmarks/bench_ig.py [--quick] [--output benchmarks/results/bench_ig.md]
    PYTHONPATH=. python benchmarks/bench_ig.py --breakdown-only [--device cpu]   # the breakdown alone
"""

from __future__ import annotations

import argparse
import cProfile
import math
import platform
import pstats
import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import device_name, synchronize
from lightning_ig import IntegratedGradients, integrated_gradients
from lightning_ig.attribution.quadrature import quadrature

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


def _per_feature_loop(
    model: torch.nn.Module,
    x: torch.Tensor,
    b: torch.Tensor,
    h: torch.Tensor,
    alphas: list[float],
    weights: list[float],
    states: list[int],
    max_probes: int | None,
) -> tuple[float, int, torch.Tensor | None]:
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

    # Warm-up on another shape: compiles the kernels so "single call on new shapes" times the call, not NVRTC.
    backend = integrated_gradients(model, torch.randn(3, features, device=device), target="mean", n_steps=4).backend
    integrated_gradients(
        model, torch.randn(3, features, device=device), target="mean", n_steps=4, gradient="finite_difference"
    )

    ours = integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD)
    single_ms, single_mib = _time(
        lambda: integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD), repeats
    )
    rows.append(
        Row(
            case,
            f"ours, autograd, single call ({backend})",
            single_ms,
            single_mib,
            extra={"worst_relative_error": ours.worst_relative_error},
        )
    )

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
    rows.append(
        Row(
            case,
            "ours, autograd, repeated (CUDA graph)" if replayed.cuda_graph else "ours, autograd, repeated (eager)",
            repeat_ms,
            repeat_mib,
            note=capture_note,
            extra={"vs single call": _relative(replayed.attributions, ours.attributions)},
        )
    )

    fd = integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD, gradient="finite_difference")
    fd_ms, fd_mib = _time(
        lambda: integrated_gradients(
            model, x, target="mean", n_steps=N_STEPS, method=METHOD, gradient="finite_difference"
        ),
        max(3, repeats // 3),
    )
    rows.append(
        Row(
            case,
            f"ours, finite differences, single call ({backend})",
            fd_ms,
            fd_mib,
            extra={"vs autograd": _relative(fd.attributions, ours.attributions)},
        )
    )

    try:
        from captum.attr import IntegratedGradients as CaptumIG

        captum = CaptumIG(value)
        theirs = captum.attribute(x, b, n_steps=N_STEPS, method=METHOD)
        captum_ms, captum_mib = _time(
            lambda: captum.attribute(x, b, n_steps=N_STEPS, method=METHOD), max(3, repeats // 2)
        )
        rows.append(
            Row(
                case,
                "Captum IntegratedGradients",
                captum_ms,
                captum_mib,
                extra={"ours vs Captum": _relative(ours.attributions, theirs)},
            )
        )
    except ImportError:
        rows.append(Row(case, "Captum IntegratedGradients", None, None, note="n/a: captum not installed"))

    # The per-feature loop with our step h = fd_step * max(1, |x|, |b|), so the two agree up to rounding.
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
    rows.append(
        Row(
            case,
            "per-feature loop (extrapolated)",
            loop_ms,
            None,
            note=f"timed {probes} of {total_probes} probes ({per_probe_s * 1e6:.0f} us each) and extrapolated; "
            f"agreement on states {agreement_states}",
            extra=extra,
        )
    )

    points = (b.unsqueeze(0) + torch.tensor(alphas, device=device).view(-1, 1, 1) * (x - b).unsqueeze(0)).reshape(
        -1, features
    )
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
            ("loop / ours FD", ratio(loop, fd), ">= 1000 (S)", lambda v, case=case: v >= 1000 or case != "S"),
            (
                "ours vs Captum (max rel)",
                captum.extra.get("ours vs Captum") if captum else None,
                "<= 1e-4",
                lambda v: v <= 1e-4,
            ),
            ("FD vs loop (max rel)", loop.extra.get("FD vs loop") if loop else None, "<= 1e-3", lambda v: v <= 1e-3),
        ]
        for name, value, goal, ok in checks:
            met = "n/a" if value is None else ("yes" if ok(value) else "NO")
            shown = "n/a" if value is None else (f"{value:.3g}" if "rel" not in name else f"{value:.2e}")
            lines.append(f"| {case} | {name} | {shown} | {goal} | {met} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the host-time breakdown (case S)

# phase of a package function, read off its name first, then its module's (the engine's files say what they do)
_PHASE_BY_NAME = (
    ("complet", "completeness"),
    ("accumul", "accumulation"),
    ("interpol", "interpolation"),
    ("replay", "graph replay"),
    ("capture", "graph capture"),
    ("check", "input checks"),
    ("build_result", "result building"),
    ("backend", "backend choice"),
)
_PHASE_BY_MODULE = {
    "options": "option parsing",
    "inputs": "input checks and preparation",
    "targets": "target",
    "backends": "kernels",
    "ig": "kernels",
    "_cuda": "kernels",
    "_cupy": "kernels",
    "path": "path: forwards and gradients",
    "graphs": "graph capture and replay",
    "result": "result building",
    "quadrature": "quadrature",
    "eager": "eager call",
    "engine": "engine",
}


def _entry_single(model: torch.nn.Module, x: torch.Tensor) -> object:
    """The single call, as a function of this file: the profile's tree hangs below it."""
    return integrated_gradients(model, x, target="mean", n_steps=N_STEPS, method=METHOD)


def _entry_replay(engine: IntegratedGradients, x: torch.Tensor) -> object:
    """The repeated call (a graph replay on a CUDA device), as a function of this file."""
    return engine.attribute(x)


def _label(func: tuple[str, int, str]) -> str:
    file, _, name = func
    if file == "~":
        return name.replace("<built-in method ", "<").replace("<method ", "<")
    parts = Path(file).parts
    for root in ("lightning_ig", "torch", "captum"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root) :]) + f":{name}"
    return f"{Path(file).name}:{name}"


def _ours(func: tuple[str, int, str]) -> bool:
    return "lightning_ig" in Path(func[0]).parts


def _phase(func: tuple[str, int, str]) -> str:
    if not _ours(func):
        return ""
    name = func[2].lower()
    for word, phase in _PHASE_BY_NAME:
        if word in name:
            return phase
    return _PHASE_BY_MODULE.get(Path(func[0]).stem, Path(func[0]).stem)


def _host_times(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, float, float]:
    """Median us per call: host until the call returns, wall until the device is done, the device's span."""
    host, wall, span = [], [], []
    cuda = device.type == "cuda"
    for _ in range(repeats):
        synchronize(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter_ns()
        fn()
        returned = time.perf_counter_ns()
        if cuda:
            end.record()
            end.synchronize()
        done = time.perf_counter_ns()
        host.append((returned - began) / 1e3)
        wall.append((done - began) / 1e3)
        span.append(start.elapsed_time(end) * 1e3 if cuda else math.nan)
    return statistics.median(host), statistics.median(wall), statistics.median(span)


def _profile(fn: Callable[[], object], calls: int) -> pstats.Stats:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    return pstats.Stats(profiler)


def _tree_rows(
    stats: pstats.Stats, root_name: str, calls: int, depth: int = 12, min_share: float = 0.01
) -> list[tuple[int, Any, float, float]]:
    """(level, function, us per call, share of the call) below ``root_name``: the package's functions opened up to
    ``depth`` levels, torch's as leaves, callees under ``min_share`` of the call folded into "other"."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined] - pstats' documented raw table
    children: dict[Any, dict[Any, float]] = defaultdict(dict)
    for func, (*_, callers) in table.items():
        for caller, timing in callers.items():
            children[caller][func] = timing[3]  # the callee's cumulative time when called from this caller
    # Matched by the file's name, not by __file__: how the path is spelt differs between Python versions.
    root = next((func for func in table if func[2] == root_name and Path(func[0]).name == Path(__file__).name), None)
    if root is None:
        return [(0, None, float("nan"), float("nan"))]  # shown as a row of "other": the breakdown never fails the run
    total = table[root][3]
    rows: list[tuple[int, Any, float, float]] = []

    def visit(func: Any, cumulative: float, level: int, path: frozenset[Any]) -> None:
        rows.append((level, func, cumulative / calls * 1e6, cumulative / total))
        if level >= depth or not (_ours(func) or (level == 0 and func == root)):
            return
        shown = 0.0
        for child, time_s in sorted(children[func].items(), key=lambda item: -item[1]):
            if time_s / total >= min_share and child not in path:
                visit(child, time_s, level + 1, path | {child})
                shown += time_s
        rest = cumulative - shown
        if rest / total >= min_share:
            rows.append((level + 1, None, rest / calls * 1e6, rest / total))

    for child, time_s in children[root].items():
        visit(child, time_s, 0, frozenset({root, child}))
    return rows


def _top_rows(stats: pstats.Stats, calls: int, count: int = 10) -> list[str]:
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    skipped = ("_entry_", "<method 'disable'", "<lambda>")
    ranked = sorted(
        (func for func in table if not any(word in func[2] for word in skipped)), key=lambda f: -table[f][3]
    )
    return [
        f"| {_label(func)} | {table[func][1] / calls:.3g} | {table[func][2] / calls * 1e6:.1f} "
        f"| {table[func][3] / calls * 1e6:.1f} |"
        for func in ranked[:count]
    ]


def host_breakdown(device: torch.device, quick: bool) -> str:
    """The second table: where the host's time goes in case S's single call and graph replay."""
    features, batch = CASES["S"]
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = DuelingMLP(features).to(device).eval()
    x = torch.randn(batch, features, generator=generator).to(device)
    integrated_gradients(model, torch.randn(3, features, device=device), target="mean", n_steps=4)  # compiles
    engine = IntegratedGradients(model, target="mean", n_steps=N_STEPS, method=METHOD)
    replayed = engine.attribute(x)  # the capture
    graph = device.type == "cuda" and replayed.cuda_graph
    replay_name = "graph replay" if graph else "repeated call (eager)"
    entries = {
        "single call": ("_entry_single", lambda: _entry_single(model, x), 40 if quick else 300),
        replay_name: ("_entry_replay", lambda: _entry_replay(engine, x), (400 if quick else 3000) if graph else 40),
    }
    timing = [
        (
            "| call | host until it returns (us) | wall until the device is done (us) | device span (us) "
            "| host under cProfile (us) |"
        ),
        "|---|---:|---:|---:|---:|",
    ]
    trees, tops = [], []
    for label, (root, fn, calls) in entries.items():
        for _ in range(5):
            fn()
        host, wall, span = _host_times(fn, device, repeats=max(20, calls // 5))
        stats = _profile(fn, calls)
        synchronize(device)
        profiled = stats.total_tt / calls * 1e6  # type: ignore[attr-defined]
        timing.append(
            f"| {label} | {host:.1f} | {wall:.1f} | {'n/a' if math.isnan(span) else f'{span:.1f}'} | {profiled:.1f} |"
        )
        trees += [
            f"| {label} | {'· ' * level}{'(other: own code, small callees)' if func is None else _label(func)} "
            f"| {'' if func is None else _phase(func)} | {us:.1f} | {share * 100:.1f}% |"
            for level, func, us, share in _tree_rows(stats, root, calls)
        ]
        tops += [
            f"Top 10 host functions of the {label} by cumulative time ({calls} calls under cProfile):",
            "",
            "| function | calls per call | own us per call | cumulative us per call |",
            "|---|---:|---:|---:|",
            *_top_rows(stats, calls),
            "",
        ]
    return "\n".join(
        [
            f"### Host-time breakdown, case S (F = {features}, B = {batch}) on {device_name(device)}",
            "",
            *timing,
            "",
            "The call tree under cProfile (the package's functions opened, torch's as leaves; shares of the call):",
            "",
            "| call | function | phase | us per call (cProfile) | share |",
            "|---|---|---|---:|---:|",
            *trees,
            "",
            *tops,
        ]
    ).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions and probes: a smoke run")
    parser.add_argument(
        "--output", type=Path, default=Path("benchmarks/results/bench_ig.md"), help="where the markdown goes"
    )
    parser.add_argument("--cases", default="S,L", help="comma-separated cases to run (S, L)")
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only with --breakdown-only")
    parser.add_argument("--breakdown-only", action="store_true", help="only the host-time breakdown of case S")
    parser.add_argument("--no-breakdown", action="store_true", help="leave the host-time breakdown out")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "bench_ig.py needs a CUDA device (the breakdown alone runs on the CPU: --breakdown-only --device cpu)"
        )
    if device.type != "cuda" and not args.breakdown_only:
        raise SystemExit(
            f"the side-by-side table needs a CUDA device, got --device {args.device}; add --breakdown-only"
        )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        import captum

        captum_version = captum.__version__
    except ImportError:
        captum_version = "not installed"
    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:  # noqa: BLE001 - any failure to import means the torch backend
        cupy_version = "not installed (torch backend)"
    header = (
        f"## bench_ig ({'quick' if args.quick else 'full'})\n\n"
        f"{device_name(device)}; torch {torch.__version__}; CuPy {cupy_version}; Captum {captum_version}; "
        f"Python {platform.python_version()}. Dueling MLP {HIDDEN}x{HIDDEN} ReLU, {ACTIONS} actions, target mean, "
        f"n_steps {N_STEPS} ({METHOD}). Median per-call latency (CUDA events, synchronised per call)."
    )
    parts = [header]
    if not args.breakdown_only:
        rows: list[Row] = []
        for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
            features, batch = CASES[case]
            print(f"case {case}: F={features}, B={batch} ...", flush=True)
            rows += run_case(case, features, batch, quick=args.quick, device=device)
        parts = [render(rows, header)]
        print(parts[0], flush=True)  # the main table first: a failure in the breakdown loses nothing of it
    if not args.no_breakdown:
        print("host-time breakdown of case S ...", flush=True)
        parts.append(host_breakdown(device, args.quick))
    table = "\n\n".join(parts)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table + "\n", encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
