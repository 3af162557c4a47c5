"""Small pieces the benchmarks share: device synchronisation, per-call timing, the machine's name, the output.

Imported as ``benchmarks._common`` with the repository root on ``PYTHONPATH`` (every benchmark's usage
line runs ``PYTHONPATH=. python benchmarks/<name>.py``).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["device_name", "median_ms", "synchronize", "write_output"]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, *, repeats: int, warmup: int = 2) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``warmup`` ones.

    On a CUDA device each call is bracketed by CUDA events and synchronised (a per-call latency that
    holds the host's launch time); on the CPU by ``time.perf_counter``.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def device_name(device: torch.device) -> str:
    """``NVIDIA H200`` on a CUDA device, the processor's name (or ``CPU``) otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or "CPU"


def write_output(text: str, output: Path | None) -> None:
    """Write ``text`` (a markdown table) to ``output`` when one is given, its folder created."""
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n", encoding="utf-8")
