"""``bench_ensemble.py --variants``: time every kernel variant of the fused ensemble reduce on one device.

The variants (``lightning_ig.ops.ensemble_reduce.VARIANTS``) are compile-time tunings of
``kernels/ensemble.cu`` that promise the same bits. This mode

1. compiles each (float32 entry points only) and checks it against the default
   variant on fresh random data (a few shapes, vectorized and scalar layouts,
   extreme logits, the forward and ``d out / d logits``; float16 / bfloat16
   forwards too): *bit-identical* means every output has the same bits (NaN
   equal to NaN);
2. times each at (65536, 64, 4) and (4096, 32, 16) float32, forward and forward +
   backward, as device time per call in a replayed CUDA graph of back-to-back
   calls rotating through >= 256 MiB of inputs (so L2 cannot serve them); the
   variants' graphs are replayed in turns, and each variant's time is the
   median over its replays;
3. prints one markdown table and the best variant: the bit-identical one with the
   lowest (65536, 64, 4) forward time (within 1% of it: the lowest geometric mean
   over the four timed rows).

About 30 s on an H200, compilation included.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import traceback
from pathlib import Path

import torch

from lightning_ig.ensemble import ensemble_reduce
from lightning_ig.ops import ensemble_reduce as ops

SHAPES = [(65536, 64, 4), (4096, 32, 16)]
# odd sizes, two lane chunks, many vectors per member, the scalar path (K % 4 != 0), a grid-stride tail
CHECK_SHAPES = [(65536, 64, 4), (4096, 32, 16), (1000, 33, 4), (257, 7, 3), (5, 2, 1000), (70_001, 5, 8), (3, 1, 4)]
HALF_CHECK_SHAPES = [(4096, 32, 16), (1000, 33, 4)]
TARGET_PCT = 85.0  # the bar for the (65536, 64, 4) forward


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    integer = {4: torch.int32, 2: torch.int16}[a.element_size()]
    equal = a.contiguous().view(integer) == b.contiguous().view(integer)
    both_nan = torch.isnan(a) & torch.isnan(b)
    return bool((equal | both_nan).all())


def _check_data(shape, dtype, generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(shape, device="cuda", generator=generator) * 4
    flat = x.view(-1)
    specials = torch.tensor([1e4, -1e4, math.inf, -math.inf, 0.0, -0.0, 88.0, -104.0, math.nan], device="cuda")
    positions = torch.randint(0, flat.numel(), (specials.numel(),), device="cuda", generator=generator)
    flat[positions] = specials
    weights = torch.randn(shape[1], device="cuda", generator=generator)
    grad_output = torch.randn(shape[0], device="cuda", generator=generator)
    return x.to(dtype), weights, grad_output.to(dtype)


def _outputs(x: torch.Tensor, weights: torch.Tensor, grad_output: torch.Tensor) -> list[torch.Tensor]:
    results = []
    unaligned = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape)
    unaligned.copy_(x)
    for layout in (x, unaligned):  # vector loads where K % 4 == 0, and the scalar path
        leaf = layout.detach().requires_grad_(layout.dtype == torch.float32)  # keeps the (un)alignment
        out = ensemble_reduce(leaf, weights, backend="cuda")
        results.append(out.detach())
        if leaf.requires_grad:
            results.append(torch.autograd.grad(out, leaf, grad_output)[0])
    return results


def bit_identity(names: list[str], seed: int) -> dict[str, bool]:
    """Whether each variant's outputs equal the default variant's, bit for bit, on fresh random data."""
    cases = [(shape, torch.float32) for shape in CHECK_SHAPES]
    cases += [(shape, dtype) for shape in HALF_CHECK_SHAPES for dtype in (torch.float16, torch.bfloat16)]
    generator = torch.Generator(device="cuda").manual_seed(seed)
    verdict = dict.fromkeys(names, True)
    for shape, dtype in cases:
        data = _check_data(shape, dtype, generator)
        with ops.use_variant(ops.DEFAULT_VARIANT):
            expected = _outputs(*data)
        for name in names:
            with ops.use_variant(name):
                got = _outputs(*data)
            if not all(_same_bits(a, b) for a, b in zip(got, expected)):
                verdict[name] = False
                print(f"   {name}: differs from {ops.DEFAULT_VARIANT} at {shape} {dtype}", flush=True)
    return verdict


def twin_identity(seed: int) -> bool:
    """The default variant's float32 forward against the torch twin (the tests' promise, as a sanity line)."""
    generator = torch.Generator(device="cuda").manual_seed(seed + 1)
    ok = True
    for shape in SHAPES:
        x, weights, _ = _check_data(shape, torch.float32, generator)
        with ops.use_variant(ops.DEFAULT_VARIANT):
            ok &= _same_bits(ensemble_reduce(x, weights, backend="cuda"), ops.forward_torch(x, weights))
    return ok


def capture_graph(fn, sets, backward: bool, calls: int, call) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back ``call(fn, *set, backward)`` over the input sets, warmed up first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch.cuda.graph asks
        for i in range(3):
            call(fn, *sets[i % len(sets)], backward)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(fn, *sets[i % len(sets)], backward)
    return graph


def time_variants(names: list[str], sets, backward: bool, replays: int, call) -> dict[str, float]:
    """Median device microseconds per call of each variant, the variants' graph replays taken in turns."""

    def ours(x: torch.Tensor, w: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
        return ensemble_reduce(x, w32, backend="cuda")

    calls = max(len(sets), 24)
    graphs = {}
    for name in names:
        with ops.use_variant(name):
            graphs[name] = capture_graph(ours, sets, backward, calls, call)
    for graph in graphs.values():
        graph.replay()
    torch.cuda.synchronize()
    events = {name: [] for name in names}
    for _ in range(replays):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    result = {
        name: statistics.median(s.elapsed_time(e) for s, e in pairs) * 1000.0 / calls for name, pairs in events.items()
    }
    graphs.clear()
    return result


def best_variant(times: dict[tuple, dict[str, float]], identical: dict[str, bool]) -> str | None:
    candidates = [name for name, ok in identical.items() if ok]
    if not candidates:
        return None
    key = (SHAPES[0], False)
    fastest = min(times[key][name] for name in candidates)
    close = [name for name in candidates if times[key][name] <= 1.01 * fastest]

    def geometric_mean(name: str) -> float:
        return math.exp(statistics.fmean(math.log(row[name]) for row in times.values()))

    return min(close, key=geometric_mean)


def render(names, times, identical, big_copy: float, best: str | None, twin_ok: bool, compile_s: float) -> str:
    props = torch.cuda.get_device_properties(0)

    def moved(shape, backward: bool) -> int:
        return ((3 if backward else 1) * math.prod(shape) + shape[0]) * 4

    head = ["variant", "R", "D", "blocks/SM", "lean"]
    for shape in SHAPES:
        head += [f"{shape} fwd us", "GB/s", "% of copy"]
    head += [f"{shape} fwd+bwd us" for shape in SHAPES] + ["bit-identical"]
    lines = [
        "# Ensemble-reduce kernel variants (float32)",
        "",
        (
            f"- device: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}; 1 GiB "
            f"device-to-device copy (read + write): **{big_copy:.0f} GB/s**; compile of all variants: {compile_s:.1f} s"
        ),
        (
            "- us: device time per call, median over replays of a CUDA graph of back-to-back calls over >= 256 MiB of "
            "inputs; GB/s: the logits read (+ the output) per second; bit-identical: every output equals the default "
            f"variant's ({ops.DEFAULT_VARIANT}) on fresh random data; default vs torch twin: "
            f"{'bit-identical' if twin_ok else 'DIFFERENT'}"
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 2) + "---|",
    ]
    for name in names:
        v = ops.VARIANTS[name]
        cells = [
            name + (" (default)" if name == ops.DEFAULT_VARIANT else ""),
            str(v.forward_rows),
            str(v.forward_depth),
            str(v.forward_min_blocks),
            "yes" if v.lean else "no",
        ]
        for shape in SHAPES:
            us = times[(shape, False)][name]
            gbs = moved(shape, False) / (us * 1e-6) / 1e9
            cells += [f"{us:.2f}", f"{gbs:.0f}", f"{100 * gbs / big_copy:.1f}"]
        cells += [f"{times[(shape, True)][name]:.2f}" for shape in SHAPES]
        cells.append("yes" if identical[name] else "NO")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if best is None:
        lines.append("best variant: none (no variant is bit-identical to the default)")
    else:
        where = "lightning_ig/ops/ensemble_reduce.py"
        lines.append(f'best variant: **{best}** (set `DEFAULT_VARIANT = "{best}"` in {where})')
        pct = 100 * moved(SHAPES[0], False) / (times[(SHAPES[0], False)][best] * 1e-6) / 1e9 / big_copy
        lines.append(
            f"target: {SHAPES[0]} forward >= {TARGET_PCT:.0f}% of copy: {pct:.1f}%, "
            f"{'met' if pct >= TARGET_PCT else 'NOT met'}"
        )
    return "\n".join(lines) + "\n"


def _compiles(name: str) -> bool:
    """Compile (float32 forward and backward, half forwards) before anything is timed."""
    warm = torch.randn(8, 4, 4, device="cuda")
    try:
        with ops.use_variant(name):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                _outputs(warm.to(dtype), torch.ones(4, device="cuda"), torch.ones(8, device="cuda").to(dtype))
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - one broken variant must not cost the whole run
        traceback.print_exc()
        print(f"   {name}: FAILED to compile or run; left out", flush=True)
        return False
    return True


def run(names: list[str], output: Path, replays: int, copy_gbs, input_sets, call) -> int:
    """The whole ``--variants`` mode; the helpers come from bench_ensemble.py."""
    unknown = [name for name in names if name not in ops.VARIANTS]
    if unknown:
        print(f"bench_ensemble: unknown variants {unknown}; known: {sorted(ops.VARIANTS)}")
        return 2
    started = time.perf_counter()
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"variants: {', '.join(names)}; check seed {seed}", flush=True)
    big_copy = copy_gbs(256 * (1 << 20), torch.float32, 10)
    print(f"copy bandwidth: {big_copy:.0f} GB/s ({time.perf_counter() - started:.1f} s)", flush=True)
    compile_start = time.perf_counter()
    failed = [name for name in names if not _compiles(name)]  # reported and left out
    names = [name for name in names if name not in failed]
    compile_s = time.perf_counter() - compile_start
    if not names:
        return 1
    print(f"compiled in {compile_s:.1f} s", flush=True)
    identical = bit_identity(names, seed)
    twin_ok = twin_identity(seed)
    print(f"bit checks done ({time.perf_counter() - started:.1f} s)", flush=True)
    times: dict[tuple, dict[str, float]] = {}
    for shape in SHAPES:
        for backward in (False, True):
            sets = input_sets(shape, torch.float32, "cuda", backward, True)
            times[(shape, backward)] = time_variants(names, sets, backward, replays, call)
            print(
                f"timed {shape} {'fwd+bwd' if backward else 'fwd'} ({time.perf_counter() - started:.1f} s)", flush=True
            )
            sets.clear()
            torch.cuda.empty_cache()
    table = render(names, times, identical, big_copy, best_variant(times, identical), twin_ok, compile_s)
    if failed:
        table += f"left out (failed to compile or run; the log has the error): {', '.join(failed)}\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(table, encoding="utf-8")
    print()
    print(table)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0
