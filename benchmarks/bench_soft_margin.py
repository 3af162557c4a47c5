"""Fused soft-margin loss vs torch eager and torch.compile, with the copy bandwidth as the ceiling.

Two problems, as issue 3 asks:

* 16384 x 16384 (bandwidth bound): forward (mean, input without grad) and
  forward + backward, time per call over a run of calls, and the fraction of the
  device-to-device copy bandwidth reached counting 8 bytes per element forward
  (read x, y) and 12 bytes forward + backward (read x, y, write dL/dx) in float32
  (half that for bfloat16).
* 512 x 4096 (the reference problem, host bound): one call timed with CUDA
  events around it (median over many calls, a sync between them), and a loop of
  1000 back-to-back calls with one sync at the end; host time per call of that
  loop; speedup over eager.

Every timed loop rotates through input sets of >= 256 MiB in all, so the 60 MB
L2 of an H200 cannot serve them. Run from the repository root:

    PYTHONPATH=. python3 benchmarks/bench_soft_margin.py [--quick] [--output PATH]

The markdown table is printed last and written to ``--output``.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch._dynamo
import torch.nn.functional as F

from lightning_ig.losses import soft_margin_loss

MiB = 1 << 20
DEVICE = "cuda"  # a module constant so that a CPU smoke test of this script can swap it
ROTATION_BYTES = 256 * MiB
TARGETS = {  # float32, from issue 3
    "fwd_pct": 90.0,
    "fwdbwd_pct": 85.0,
    "one_call_fwd_us": 35.0,
    "one_call_fwdbwd_us": 70.0,
    "loop_speedup": 2.5,
}


@dataclass
class Settings:
    big_shape: tuple[int, int]
    small_shape: tuple[int, int]
    big_reps: int
    one_call_samples: int
    loop_calls: int
    dtypes: list[torch.dtype]
    compile: bool
    time_budget_s: float
    started: float = field(default_factory=time.perf_counter)

    def time_left(self) -> float:
        return self.time_budget_s - (time.perf_counter() - self.started)


# --------------------------------------------------------------------------- implementations


def _ours(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return soft_margin_loss(x, y, "mean", backend="cuda")


def _eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.soft_margin_loss(x, y, reduction="mean")


def _compiled() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    # Dynamo caches per code object, not per wrapper: start each case from a clean
    # cache so 8 cases (shape x dtype x grad) never hit its recompile limit.
    torch._dynamo.reset()
    return torch.compile(_eager, dynamic=False)


# --------------------------------------------------------------------------- timing helpers


def _input_sets(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, grad: bool):
    """Enough (x, y) pairs to rotate through >= 256 MiB, at least two."""
    numel = math.prod(shape)
    set_bytes = 2 * numel * torch.finfo(dtype).bits // 8
    count = max(2, math.ceil(ROTATION_BYTES / set_bytes))
    generator = torch.Generator(device=device).manual_seed(0)
    sets = []
    for _ in range(count):
        x = (torch.randn(shape, device=device, generator=generator) * 2).to(dtype)
        y = (torch.randint(0, 2, shape, device=device, generator=generator) * 2 - 1).to(dtype)
        sets.append((x.requires_grad_(grad), y))
    return sets


def _step(fn, x: torch.Tensor, y: torch.Tensor, backward: bool) -> None:
    loss = fn(x, y)
    if backward:
        loss.backward()
        x.grad = None


def _time_per_call(fn, sets, backward: bool, reps: int) -> float:
    """Microseconds per call over ``reps`` back-to-back calls (rotating sets), one sync."""
    for i in range(2):
        _step(fn, *sets[i % len(sets)], backward)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        _step(fn, *sets[i % len(sets)], backward)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / reps


def _one_call(fn, sets, backward: bool, samples: int) -> float:
    """Median microseconds of one call with CUDA events right around it, a sync between calls."""
    for i in range(3):
        _step(fn, *sets[i % len(sets)], backward)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(samples):
        x, y = sets[i % len(sets)]
        torch.cuda.synchronize()
        start.record()
        loss = fn(x, y)
        if backward:
            loss.backward()
        end.record()
        torch.cuda.synchronize()
        if backward:
            x.grad = None
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def _loop(fn, sets, backward: bool, calls: int) -> tuple[float, float]:
    """(device us per call, host us per call) for ``calls`` back-to-back calls and one sync."""
    for i in range(3):
        _step(fn, *sets[i % len(sets)], backward)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_start = time.perf_counter()
    start.record()
    for i in range(calls):
        _step(fn, *sets[i % len(sets)], backward)
    end.record()
    host = (time.perf_counter() - host_start) * 1e6 / calls
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls, host


def _peak_extra_mib(fn, sets, backward: bool) -> float:
    """Peak memory above what was allocated before one call (outputs and temporaries)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _step(fn, *sets[0], backward)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MiB


def copy_bandwidth(device: torch.device, quick: bool) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written)."""
    numel = (256 if quick else 1024) * MiB // 4
    sources = [torch.empty(numel, device=device).normal_() for _ in range(2)]
    destination = torch.empty(numel, device=device)
    for source in sources:
        destination.copy_(source)
    torch.cuda.synchronize()
    reps = 10 if quick else 30
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        destination.copy_(sources[i % 2])
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000.0 / reps
    return 2 * numel * 4 / seconds / 1e9


# --------------------------------------------------------------------------- the runs


def _implementations(settings: Settings) -> list[tuple[str, Callable | None]]:
    names: list[tuple[str, Callable | None]] = [("torch eager", _eager), ("torch.compile", None), ("ours", _ours)]
    return names if settings.compile else [n for n in names if n[0] != "torch.compile"]


def _safe(label: str, thunk: Callable[[], object], notes: list[str]) -> object:
    try:
        return thunk()
    except Exception as error:  # noqa: BLE001 - keep the table going; the log has the traceback
        traceback.print_exc()
        notes.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
        return None


def run_big(settings: Settings, dtype: torch.dtype, bandwidth: float, notes: list[str]) -> list[dict]:
    device = torch.device(DEVICE)
    itemsize = torch.finfo(dtype).bits // 8
    numel = math.prod(settings.big_shape)
    rows = []
    for backward in (False, True):
        sets = _input_sets(settings.big_shape, dtype, device, grad=backward)
        bytes_per_element = (3 if backward else 2) * itemsize
        for name, listed in _implementations(settings):
            label = f"{'x'.join(map(str, settings.big_shape))} {dtype} {'fwd+bwd' if backward else 'fwd'} {name}"
            if listed is None and settings.time_left() < 60:
                notes.append(f"{label}: skipped, out of time budget")
                continue
            fn = _compiled() if listed is None else listed
            print(f"-- {label}", flush=True)
            us = _safe(label, functools.partial(_time_per_call, fn, sets, backward, settings.big_reps), notes)
            memory = _safe(label + " memory", functools.partial(_peak_extra_mib, fn, sets, backward), notes)
            if us is None:
                continue
            achieved = numel * bytes_per_element / (us * 1e-6) / 1e9
            rows.append(
                {
                    "problem": "x".join(map(str, settings.big_shape)),
                    "dtype": str(dtype).replace("torch.", ""),
                    "mode": "fwd+bwd" if backward else "fwd",
                    "impl": name,
                    "us": us,
                    "GB/s": achieved,
                    "pct_copy": 100.0 * achieved / bandwidth,
                    "B/elem": bytes_per_element,
                    "peak_extra_MiB": memory,
                }
            )
        del sets
        torch.cuda.empty_cache()
    return rows


def run_small(settings: Settings, dtype: torch.dtype, notes: list[str]) -> list[dict]:
    device = torch.device(DEVICE)
    rows = []
    for backward in (False, True):
        sets = _input_sets(settings.small_shape, dtype, device, grad=backward)
        for name, listed in _implementations(settings):
            label = f"{'x'.join(map(str, settings.small_shape))} {dtype} {'fwd+bwd' if backward else 'fwd'} {name}"
            if listed is None and settings.time_left() < 60:
                notes.append(f"{label}: skipped, out of time budget")
                continue
            fn = _compiled() if listed is None else listed
            print(f"-- {label}", flush=True)
            one = _safe(
                label + " one call", functools.partial(_one_call, fn, sets, backward, settings.one_call_samples), notes
            )
            loop = _safe(label + " loop", functools.partial(_loop, fn, sets, backward, settings.loop_calls), notes)
            rows.append(
                {
                    "problem": "x".join(map(str, settings.small_shape)),
                    "dtype": str(dtype).replace("torch.", ""),
                    "mode": "fwd+bwd" if backward else "fwd",
                    "impl": name,
                    "one_call_us": one,
                    "loop_us": loop[0] if loop else None,
                    "host_us": loop[1] if loop else None,
                }
            )
        del sets
        torch.cuda.empty_cache()
    return rows


def lone_add(settings: Settings, notes: list[str]) -> None:
    """A lone torch.add timed like one call, for scale: the events and the sync cost something too."""
    a = torch.randn(settings.small_shape, device=DEVICE)
    add_us = _safe("torch.add one call", lambda: _one_call(torch.add, [(a, a)], False, 200), notes)
    if add_us is not None:
        notes.append(f"a lone torch.add on {settings.small_shape} float32, one call with events: {add_us:.1f} us")
    # The floor of any forward + backward through autograd: one reduction and the engine's backward pass
    # (on CUDA it runs on the engine's device thread, so it includes two thread hand-offs).
    leaf = torch.randn(settings.small_shape, device=DEVICE, requires_grad=True)
    floor_us = _safe(
        "x.sum().backward() one call", lambda: _one_call(lambda x, y: x.sum(), [(leaf, leaf)], True, 200), notes
    )
    if floor_us is not None:
        notes.append(
            f"autograd floor: x.sum().backward() on {settings.small_shape} float32, one call with events: "
            f"{floor_us:.1f} us (no fused loss's forward + backward can take less)"
        )


def host_breakdown(settings: Settings, notes: list[str]) -> list[tuple[str, float]]:
    """Host microseconds per call of the pieces of our 512x4096 call path (no syncs inside)."""
    from lightning_ig.ops import _cupy, soft_margin

    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(settings.small_shape, device=device)
    y = torch.ones(settings.small_shape, device=device)
    g = torch.ones((), device=device)  # grad_output == 1: the scale kernel returns at once
    scale = soft_margin._kernel("soft_margin_scale", torch.float32, device.index)
    scale_args = (_cupy.pointer(x), _cupy.pointer(g), _cupy.int64(x.numel()))
    x_grad = x.clone().requires_grad_()

    def fwd_bwd() -> None:
        soft_margin_loss(x_grad, y, backend="cuda").backward()
        x_grad.grad = None

    pieces: list[tuple[str, Callable[[], object]]] = [
        ("_cupy.launch (one tiny kernel, args ready)", lambda: _cupy.launch(scale, 1, 256, scale_args, device=device)),
        ("torch.cuda.current_stream(index)", lambda: torch.cuda.current_stream(device.index)),
        ("torch.cuda.is_current_stream_capturing()", torch.cuda.is_current_stream_capturing),
        ("torch.empty((), device) (the loss)", lambda: torch.empty((), device=device)),
        ("torch.empty_like(x) (the gradient)", lambda: torch.empty_like(x)),
        ("_cupy.choose_backend('cuda', x, y)", lambda: _cupy.choose_backend("cuda", x, y)),
        ("torch.add(x, y) (one torch kernel, for scale)", lambda: torch.add(x, y)),
        ("soft_margin_loss(x, y) forward, no grad", lambda: soft_margin_loss(x, y, backend="cuda")),
        ("soft_margin_loss(x, y).backward(), x needs grad", fwd_bwd),
    ]
    rows = []
    for label, thunk in pieces:

        def timed(thunk=thunk) -> float:
            for _ in range(50):
                thunk()
            torch.cuda.synchronize()
            calls = 500 if settings.loop_calls >= 1000 else 100
            start = time.perf_counter()
            for _ in range(calls):
                thunk()
            host = (time.perf_counter() - start) * 1e6 / calls
            torch.cuda.synchronize()
            return host

        value = _safe(f"host breakdown: {label}", timed, notes)
        if value is not None:
            rows.append((label, value))
    return rows


# --------------------------------------------------------------------------- the report


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render(
    big: list[dict],
    small: list[dict],
    bandwidth: float,
    settings: Settings,
    notes: list[str],
    host: list[tuple[str, float]] | None = None,
) -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:  # noqa: BLE001 - the table still says what ran
        cupy_version = "not importable"
    lines = [
        "# Fused SoftMarginLoss benchmark",
        "",
        f"- device: {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)",
        (
            f"- torch {torch.__version__} (CUDA {torch.version.cuda}), cupy {cupy_version}, "
            f"python {sys.version.split()[0]}"
        ),
        f"- device-to-device copy bandwidth (read + write): **{bandwidth:.0f} GB/s**",
        f"- input sets rotated per timed loop: >= {ROTATION_BYTES // MiB} MiB in all"
        + (" (quick mode: smaller sizes, fewer calls)" if settings.big_shape != (16384, 16384) else ""),
        "",
        f"## {settings.big_shape[0]} x {settings.big_shape[1]}: time per call and share of the copy bandwidth",
        "",
        "| dtype | mode | impl | us / call | GB/s | % of copy | bytes / elem | peak extra MiB |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['dtype']} | {row['mode']} | {row['impl']} | {_fmt(row['us'])} | {_fmt(row['GB/s'], 0)} "
        f"| {_fmt(row['pct_copy'])} | {row['B/elem']} | {_fmt(row['peak_extra_MiB'], 0)} |"
        for row in big
    ]
    lines += [
        "",
        (
            f"## {settings.small_shape[0]} x {settings.small_shape[1]}: one call (CUDA events around it) and a loop of "
            f"{settings.loop_calls} calls"
        ),
        "",
        "| dtype | mode | impl | one call us (median) | loop us / call | host us / call | loop speedup vs eager |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    eager_loop = {(r["dtype"], r["mode"]): r["loop_us"] for r in small if r["impl"] == "torch eager"}
    for row in small:
        base = eager_loop.get((row["dtype"], row["mode"]))
        speedup = base / row["loop_us"] if base and row["loop_us"] else None
        lines.append(
            f"| {row['dtype']} | {row['mode']} | {row['impl']} | {_fmt(row['one_call_us'])} | {_fmt(row['loop_us'])} "
            f"| {_fmt(row['host_us'])} | {_fmt(speedup, 2) + 'x' if speedup else '-'} |"
        )
    lines += ["", "## Targets (float32, issue 3)", "", "| target | measured | met |", "|---|---:|---|"]
    lines += _targets(big, small, eager_loop)
    if host:
        lines += ["", "## Host time of the pieces of one 512x4096 call", "", "| piece | host us / call |", "|---|---:|"]
        lines += [f"| {label} | {value:.1f} |" for label, value in host]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _targets(big: list[dict], small: list[dict], eager_loop: dict) -> list[str]:
    def find(rows: list[dict], mode: str, impl: str = "ours") -> dict | None:
        return next((r for r in rows if r["dtype"] == "float32" and r["mode"] == mode and r["impl"] == impl), None)

    checks = []
    for mode, key, goal in (
        ("fwd", "fwd_pct", "fwd (mean) >= 90% of copy at 8 B/elem"),
        ("fwd+bwd", "fwdbwd_pct", "fwd+bwd >= 85% of copy at 12 B/elem"),
    ):
        row = find(big, mode)
        value = row["pct_copy"] if row else None
        checks.append((goal, value, value is not None and value >= TARGETS[key], "%"))
    for mode, key, goal in (
        ("fwd", "one_call_fwd_us", "512x4096 one call fwd <= 35 us"),
        ("fwd+bwd", "one_call_fwdbwd_us", "512x4096 one call fwd+bwd <= 70 us"),
    ):
        row = find(small, mode)
        value = row["one_call_us"] if row else None
        checks.append((goal, value, value is not None and value <= TARGETS[key], " us"))
    for mode in ("fwd", "fwd+bwd"):
        row = find(small, mode)
        base = eager_loop.get(("float32", mode))
        value = base / row["loop_us"] if row and base and row["loop_us"] else None
        checks.append((f"512x4096 loop {mode} >= 2.5x eager", value, value is not None and value >= 2.5, "x"))
    return [
        f"| {goal} | {_fmt(value, 2 if unit == 'x' else 1)}{unit if value is not None else ''} | "
        f"{'yes' if met else 'NO'} |"
        for goal, value, met, unit in checks
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few calls: a smoke run")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/bench_soft_margin.md"))
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, default float32,bfloat16")
    parser.add_argument("--time-budget", type=float, default=200.0, help="seconds; later compile cases are skipped")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_soft_margin: needs a CUDA device", file=sys.stderr)
        return 2
    dtypes = [getattr(torch, name.strip()) for name in args.dtypes.split(",") if name.strip()]
    settings = Settings(
        big_shape=(4096, 4096) if args.quick else (16384, 16384),
        small_shape=(512, 4096),
        big_reps=5 if args.quick else 20,
        one_call_samples=30 if args.quick else 300,
        loop_calls=100 if args.quick else 1000,
        dtypes=dtypes,
        compile=not args.no_compile,
        time_budget_s=args.time_budget,
    )
    notes: list[str] = []
    bandwidth = copy_bandwidth(torch.device(DEVICE), args.quick)
    print(f"copy bandwidth: {bandwidth:.0f} GB/s", flush=True)
    lone_add(settings, notes)
    big: list[dict] = []
    small: list[dict] = []
    for dtype in dtypes:
        small += run_small(settings, dtype, notes)
        big += run_big(settings, dtype, bandwidth, notes)
    host = _safe("host breakdown", lambda: host_breakdown(settings, notes), notes)
    table = render(big, small, bandwidth, settings, notes, host)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table, encoding="utf-8")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
