"""Fused ensemble reduce vs torch eager, torch.compile and the seed's single-block kernel.

``out[b] = sum_m w[m] * mean_k sigmoid(logits[b, m, k])`` at (B, M, K) = (4096, 8, 1),
(4096, 32, 16), (65536, 64, 4) and (16, 8, 1), forward and forward + backward
(``d out / d logits``, the logits requiring a gradient and the weights not: the
IG case), for:

* torch eager: ``(torch.sigmoid(x).mean(-1) * w).sum(-1)``;
* ``torch.compile`` of the same (float32 only unless ``--compile-dtypes`` says more);
* ours: :func:`lightning_ig.ensemble.ensemble_reduce` (``backend="cuda"``);
* the seed probe: the design this package grew from, one block, one thread per
  member looping over the rows, float32, forward only (its kernel is in this file).

Two timings per row:

* *one call*: the host clock around one call with a sync before and after, as a
  user calls it (median over many calls); the (16, 8, 1) call is launch-bound;
* *graph loop*: device time per call from a CUDA graph of back-to-back calls,
  replayed, rotating through input sets of >= 256 MiB in all where the problem is
  large (the 50 MB L2 of an H200 cannot serve them; the small problems stay in L2,
  as they would in use), reported as GB/s of the bytes the op must move (forward:
  read the logits; forward + backward: read them twice and write the gradient) and
  as a share of a device-to-device copy: of a 1 GiB copy, and of a copy of the same
  bytes as one call (the ceiling at that size, launch costs included).

Run from the repository root (about a minute on an H200, most of it torch.compile):

    PYTHONPATH=. python3 benchmarks/bench_ensemble.py [--quick] [--output PATH]

The markdown table is printed last and written to ``--output``.

``--variants [NAME,...]`` (all when no names are given) instead times the kernel
variants of ``lightning_ig.ops.ensemble_reduce.VARIANTS`` against each other at
(65536, 64, 4) and (4096, 32, 16) float32, checks that each gives the default
variant's bits, and names the fastest (``benchmarks/ensemble_variants.py``; about
30 s on an H200):

    PYTHONPATH=. python3 benchmarks/bench_ensemble.py --variants [--output PATH]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ensemble_variants  # beside this file: the graph capture and the --variants mode
import torch
import torch._dynamo

from lightning_ig.ensemble import ensemble_reduce
from lightning_ig.ops import _cupy

MiB = 1 << 20
SHAPES = [(4096, 8, 1), (4096, 32, 16), (65536, 64, 4), (16, 8, 1)]
LARGE = (65536, 64, 4)  # the bandwidth target's problem
LAUNCH_BOUND = (16, 8, 1)  # the one-call target's problem
ROTATION_BYTES = 256 * MiB
MAX_SETS = 64
TARGET_PCT = 85.0
DEFAULT_OUTPUT = Path("benchmarks/results/bench_ensemble.md")

SEED_SOURCE = r"""
// The seed's design: ONE block, one thread per member, rows one after another;
// float32, forward only, a shared-memory sum over members per row.
extern "C" __global__ void seed_ensemble_forward(const float* logits, const float* weights, float* out,
                                                 int rows, int members, int K) {
    extern __shared__ float member_values[];
    for (int row = 0; row < rows; ++row) {
        for (int m = threadIdx.x; m < members; m += blockDim.x) {
            const float* p = logits + ((long long)row * members + m) * K;
            float sum = 0.0f;
            for (int k = 0; k < K; ++k) sum += 1.0f / (1.0f + expf(-p[k]));
            member_values[m] = weights[m] * (sum / K);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float total = 0.0f;
            for (int m = 0; m < members; ++m) total += member_values[m];
            out[row] = total;
        }
        __syncthreads();
    }
}
"""


@dataclass
class Settings:
    dtypes: list[torch.dtype]
    compile_dtypes: list[torch.dtype]
    one_call_samples: int
    replays: int
    time_budget_s: float
    started: float = field(default_factory=time.perf_counter)

    def time_left(self) -> float:
        return self.time_budget_s - (time.perf_counter() - self.started)


# --------------------------------------------------------------------------- implementations
# Each takes (logits, weights in the logits' dtype, float32 weights): torch's formula
# computes in the logits' dtype; our kernels (and the seed's) read float32 weights,
# which is how EnsembleReduce and Ensemble hold them.


def eager_formula(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.sigmoid(x).mean(-1) * w).sum(-1)


def eager(x: torch.Tensor, w: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    return eager_formula(x, w)


def ours(x: torch.Tensor, w: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    return ensemble_reduce(x, w32, backend="cuda")


_seed_kernel = None


def seed_probe(x: torch.Tensor, w: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    global _seed_kernel  # noqa: PLW0603 - compiled once, on first use
    if _seed_kernel is None:
        cupy = _cupy.require_cupy()
        _seed_kernel = cupy.RawKernel(SEED_SOURCE, "seed_ensemble_forward")
    rows, members, per_member = x.shape
    out = torch.empty(rows, device=x.device)
    threads = min(1024, 32 * math.ceil(members / 32))
    args = (
        _cupy.pointer(x),
        _cupy.pointer(w32),
        _cupy.pointer(out),
        _cupy.int32(rows),
        _cupy.int32(members),
        _cupy.int32(per_member),
    )
    _cupy.launch(_seed_kernel, 1, threads, args, device=x.device, shared_mem=4 * members)
    return out


def compiled(settings: Settings) -> Callable[..., torch.Tensor] | None:
    if settings.time_left() < 25:
        return None
    function = torch.compile(eager_formula, dynamic=False)
    return lambda x, w, w32: function(x, w)


# --------------------------------------------------------------------------- timing


def input_sets(shape, dtype, device, grad: bool, large: bool) -> list[tuple[torch.Tensor, ...]]:
    """(logits, weights, float32 weights, grad_output) sets: >= 256 MiB in all for large problems, else a few."""
    set_bytes = math.prod(shape) * torch.finfo(dtype).bits // 8
    count = max(2, min(MAX_SETS, math.ceil(ROTATION_BYTES / set_bytes))) if large else 4
    generator = torch.Generator(device=device).manual_seed(0)
    sets = []
    for _ in range(count):
        x = (torch.randn(shape, device=device, generator=generator) * 3).to(dtype).requires_grad_(grad)
        w32 = torch.rand(shape[1], device=device, generator=generator)
        g = torch.randn(shape[0], device=device, generator=generator).to(dtype)
        sets.append((x, w32.to(dtype), w32, g))
    return sets


def call(fn, x, w, w32, g, backward: bool):
    out = fn(x, w, w32)
    if backward:
        return torch.autograd.grad(out, x, g)[0]
    return out


def one_call_us(fn, sets, backward: bool, samples: int) -> float:
    """Median host-clock microseconds of one call, synchronised before and after."""
    for i in range(3):
        call(fn, *sets[i % len(sets)], backward)
    times = []
    for i in range(samples):
        one_set = sets[i % len(sets)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        call(fn, *one_set, backward)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def graph_loop_us(fn, sets, backward: bool, replays: int, calls_per_graph: int) -> float:
    """Device microseconds per call: a CUDA graph of back-to-back calls over the sets, replayed."""
    graph = ensemble_variants.capture_graph(fn, sets, backward, calls_per_graph, call)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1000.0 / (replays * calls_per_graph)
    del graph
    return us


def copy_gbs(numel: int, dtype: torch.dtype, replays: int) -> float:
    """Device-to-device copy bandwidth (bytes read + written) for buffers of ``numel`` elements, graph-replayed."""
    large = numel * torch.finfo(dtype).bits // 8 >= 64 * MiB
    count = 2 if large else MAX_SETS
    sources = [torch.empty(numel, device="cuda", dtype=dtype).normal_() for _ in range(count)]
    destination = torch.empty(numel, device="cuda", dtype=dtype)
    fn = lambda x, w, w32: destination.copy_(x)  # noqa: E731
    sets = [(s, s, s, s) for s in sources]
    us = graph_loop_us(fn, sets, False, replays, count * (1 if large else 4))
    return 2 * numel * torch.finfo(dtype).bits / 8 / (us * 1e-6) / 1e9


# --------------------------------------------------------------------------- the runs


def safe(label: str, thunk: Callable[[], object], notes: list[str]) -> object:
    try:
        return thunk()
    except Exception as error:  # noqa: BLE001 - keep the table going; the log has the traceback
        traceback.print_exc()
        notes.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}")
        return None


def implementations(dtype: torch.dtype, backward: bool, settings: Settings):
    rows: list[tuple[str, Callable | None]] = [("torch eager", eager)]
    if dtype in settings.compile_dtypes:
        rows.append(("torch.compile", None))  # built when its turn comes (time budget)
    rows.append(("ours", ours))
    if dtype == torch.float32 and not backward:
        rows.append(("seed probe (1 block, thread/member)", seed_probe))
    return rows


def run_shape(shape, dtype, settings: Settings, big_copy: float, notes: list[str]) -> list[dict]:
    numel = math.prod(shape)
    large = numel * torch.finfo(dtype).bits // 8 >= 4 * MiB
    same_size_copy = safe(f"copy {shape}", lambda: copy_gbs(numel, dtype, settings.replays), notes)
    results = []
    for backward in (False, True):
        sets = input_sets(shape, dtype, "cuda", backward, large)
        for name, fn in implementations(dtype, backward, settings):
            row = run_row(name, fn, sets, backward, settings, notes)
            if row is not None:
                row["pct_copy"] = 100.0 * row["GB/s"] / big_copy if row["GB/s"] else None
                row["pct_same_size_copy"] = (
                    100.0 * row["GB/s"] / same_size_copy if row["GB/s"] and same_size_copy else None
                )
                results.append(row)
        sets.clear()
        torch.cuda.empty_cache()
    return results


def run_row(name: str, fn, sets, backward: bool, settings: Settings, notes: list[str]) -> dict | None:
    """One implementation on one problem: one call and graph loop timings."""
    x = sets[0][0]
    shape, dtype, numel = tuple(x.shape), x.dtype, x.numel()
    label = f"{shape} {str(dtype).replace('torch.', '')} {'fwd+bwd' if backward else 'fwd'} {name}"
    if name == "torch.compile":
        fn = compiled(settings)
        if fn is None:
            notes.append(f"{label}: skipped, out of time budget")
            return None
    print(f"-- {label}", flush=True)
    slow = name.startswith("seed") and numel > 1 << 20  # the seed takes ~0.1 s per call there
    one = safe(
        label + " one call", lambda: one_call_us(fn, sets, backward, 3 if slow else settings.one_call_samples), notes
    )
    calls = len(sets) if slow else MAX_SETS
    loop = safe(
        label + " graph loop", lambda: graph_loop_us(fn, sets, backward, 1 if slow else settings.replays, calls), notes
    )
    itemsize = torch.finfo(dtype).bits // 8
    moved = (3 if backward else 1) * numel * itemsize + shape[0] * itemsize
    return {
        "shape": shape,
        "dtype": str(dtype).replace("torch.", ""),
        "mode": "fwd+bwd" if backward else "fwd",
        "impl": name,
        "one_call_us": one,
        "loop_us": loop,
        "GB/s": moved / (loop * 1e-6) / 1e9 if loop else None,
    }


# --------------------------------------------------------------------------- the report


def fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def targets(rows: list[dict]) -> list[str]:
    def find(shape, mode, impl):
        return next(
            (
                r
                for r in rows
                if r["shape"] == shape and r["dtype"] == "float32" and r["mode"] == mode and r["impl"] == impl
            ),
            None,
        )

    lines = ["| target (float32) | measured | met |", "|---|---:|---|"]
    large = find(LARGE, "fwd", "ours")
    pct = large["pct_copy"] if large else None
    lines.append(
        f"| {LARGE} forward >= {TARGET_PCT:.0f}% of copy bandwidth | {fmt(pct)}% | "
        f"{'yes' if pct and pct >= TARGET_PCT else 'NO'} |"
    )
    for mode in ("fwd", "fwd+bwd"):
        mine, theirs = find(LAUNCH_BOUND, mode, "ours"), find(LAUNCH_BOUND, mode, "torch eager")
        a = mine["one_call_us"] if mine else None
        b = theirs["one_call_us"] if theirs else None
        met = a is not None and b is not None and a <= b
        lines.append(
            f"| {LAUNCH_BOUND} one call {mode} no slower than eager | {fmt(a)} us vs {fmt(b)} us | "
            f"{'yes' if met else 'NO'} |"
        )
    return lines


def render(rows: list[dict], big_copy: float, notes: list[str]) -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:  # noqa: BLE001 - the table still says what ran
        cupy_version = "not importable"
    lines = [
        "# Fused ensemble reduce benchmark",
        "",
        (
            f"- device: {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB); torch "
            f"{torch.__version__} (CUDA {torch.version.cuda}), cupy {cupy_version}, python {sys.version.split()[0]}"
        ),
        f"- device-to-device copy of 1 GiB (read + write): **{big_copy:.0f} GB/s**",
        (
            "- one call: host clock, synchronised before and after (median); graph loop: device time per call in a "
            "replayed CUDA graph; GB/s of the bytes the op must move (fwd: read the logits; fwd+bwd: read them twice, "
            "write the gradient); % of the 1 GiB copy and of a copy of one call's bytes"
        ),
        "",
        "| (B, M, K) | dtype | mode | impl | one call us | graph us / call | GB/s | % of copy | % of same-size copy |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['shape']} | {row['dtype']} | {row['mode']} | {row['impl']} | {fmt(row['one_call_us'])} | "
        f"{fmt(row['loop_us'], 2)} | {fmt(row['GB/s'], 0)} | {fmt(row['pct_copy'])} | "
        f"{fmt(row['pct_same_size_copy'])} |"
        for row in rows
    ]
    lines += ["", *targets(rows)]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, default float32,bfloat16")
    parser.add_argument("--compile-dtypes", default="float32", help="dtypes torch.compile runs for ('' for none)")
    parser.add_argument("--time-budget", type=float, default=80.0, help="seconds; later torch.compile rows are skipped")
    parser.add_argument(
        "--variants",
        nargs="?",
        const="all",
        default=None,
        metavar="NAME,...",
        help="time the kernel variants (all, or these) against each other instead",
    )
    parser.add_argument("--replays", type=int, default=30, help="--variants: graph replays per variant and problem")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_ensemble: needs a CUDA device", file=sys.stderr)
        return 2
    if args.variants is not None:
        from lightning_ig.ops import ensemble_reduce as ops

        names = (
            list(ops.VARIANTS) if args.variants == "all" else [n.strip() for n in args.variants.split(",") if n.strip()]
        )
        output = (
            args.output if args.output != DEFAULT_OUTPUT else DEFAULT_OUTPUT.with_name("bench_ensemble_variants.md")
        )
        return ensemble_variants.run(names, output, args.replays, copy_gbs, input_sets, call)
    names = lambda text: [getattr(torch, n.strip()) for n in text.split(",") if n.strip()]  # noqa: E731
    settings = Settings(
        dtypes=names(args.dtypes),
        compile_dtypes=names(args.compile_dtypes),
        one_call_samples=20 if args.quick else 200,
        replays=3 if args.quick else 10,
        time_budget_s=args.time_budget,
    )
    for limit in ("recompile_limit", "cache_size_limit"):  # one compiled graph per shape and mode
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    notes: list[str] = []
    big_copy = copy_gbs(256 * MiB, torch.float32, settings.replays)
    print(f"copy bandwidth: {big_copy:.0f} GB/s", flush=True)
    rows: list[dict] = []
    for dtype in settings.dtypes:
        for shape in SHAPES:
            rows += run_shape(shape, dtype, settings, big_copy, notes)
    table = render(rows, big_copy, notes)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table, encoding="utf-8")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
