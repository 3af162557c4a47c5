"""What the IG callback costs the MinAtar example: examples/dqn_minatar.py with and without it, side by side.

The same shortened training (same seed, same number of gradient steps) runs
with ``--ig`` and ``--no-ig`` in one process, in the order off, on, on, off, ...
so that drift in clocks or caches falls on both sides alike, after a warm-up
run with the callback that compiles the kernels and fills the caches (CUDA
context, cuDNN, CuPy modules, the IG graph), which a long training pays once.
The time compared is the example's own training-loop time (after the replay
warm-up, up to the end of training, the callback's final run included), and
with it the example's env steps/s and gradient steps/s.

Usage (from the repository root; minatar must import)::

    PYTHONPATH=. python benchmarks/bench_minatar_overhead.py --accelerator gpu [--total-timesteps 96000] [--pairs 1]

It prints a markdown table last and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dqn_minatar.py"


def load_example() -> ModuleType:
    """Import examples/dqn_minatar.py as a module (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location("dqn_minatar_example", EXAMPLE)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load the example from {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--accelerator", choices=("gpu", "cpu"), default="gpu", help="where training and IG run")
    parser.add_argument("--total-timesteps", type=int, default=96_000, help="environment steps per timed run")
    parser.add_argument("--pairs", type=int, default=1, help="off/on pairs, in ABBA order")
    parser.add_argument(
        "--warm-up-timesteps",
        type=int,
        default=None,
        help="environment steps of the warm-up run (default: two IG runs' worth of learning)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of every run")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("benchmarks/results/bench_minatar_overhead.md"),
        help="where the markdown goes",
    )
    options = parser.parse_args()
    if options.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {options.pairs}")
    if options.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu needs a CUDA device; none is visible (use --accelerator cpu to try it here)")
    warnings.filterwarnings("ignore", message=".*completeness.*")
    example = load_example()
    device_name = torch.cuda.get_device_name() if options.accelerator == "gpu" else platform.processor() or "CPU"

    started = time.perf_counter()
    results: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench_minatar_") as runs_dir:

        def train(total: int, ig: bool) -> dict:
            flags = [
                "--accelerator",
                options.accelerator,
                "--seed",
                str(options.seed),
                "--total-timesteps",
                str(total),
                "--eval-episodes",
                "1",
                "--random-episodes",
                "1",
                "--no-progress-bar",
                "--runs-dir",
                runs_dir,
                "--ig" if ig else "--no-ig",
            ]
            with contextlib.redirect_stdout(io.StringIO()):
                return example.main(flags)

        base = example.parse_args([])
        warm_up = options.warm_up_timesteps or base.learning_starts + 2 * base.ig_every_n_steps * base.num_envs
        train(warm_up, ig=True)
        order = [False, True, True, False] * ((options.pairs + 1) // 2)
        for index, ig in enumerate(order[: 2 * options.pairs]):
            result = train(options.total_timesteps, ig)
            results[ig].append(result)
            print(
                f"run {index} ({'on' if ig else 'off'}): {result['train_seconds']:.2f} s, "
                f"{result['env_steps_per_second']:.0f} env steps/s, {result['gradient_steps_per_second']:.1f} "
                "gradient steps/s",
                flush=True,
            )

    def median(ig: bool, key: str) -> float:
        return statistics.median(result[key] for result in results[ig])

    off, on = median(False, "train_seconds"), median(True, "train_seconds")
    gradient_steps = (options.total_timesteps - base.learning_starts) // base.num_envs
    lines = [
        "## bench_minatar_overhead",
        "",
        (
            f"examples/dqn_minatar.py on {device_name} ({options.accelerator}), torch {torch.__version__}; "
            f"{options.total_timesteps} env steps per run ({gradient_steps} gradient steps, {base.num_envs} games, "
            f"batch {base.batch_size}), seed {options.seed}; {options.pairs} off/on pair(s) in ABBA order after a "
            f"warm-up; callback: IG on {base.num_held_out} held-out frames, n_steps={base.ig_n_steps}, every "
            f"{base.ig_every_n_steps} steps; benchmark wall time {time.perf_counter() - started:.0f} s."
        ),
        "",
        "| case | training loop (s, median) | env steps/s | gradient steps/s |",
        "|---|---:|---:|---:|",
    ]
    for ig, label in ((False, "without callback"), (True, "with callback")):
        lines.append(
            f"| {label} | {median(ig, 'train_seconds'):.2f} | {median(ig, 'env_steps_per_second'):.0f} | "
            f"{median(ig, 'gradient_steps_per_second'):.1f} |"
        )
    lines += ["", f"Overhead of the callback (wall time): {(on - off) / off * 100:+.1f}%."]
    table = "\n".join(lines)
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(table + "\n", encoding="utf-8")
    print()
    print(table)


if __name__ == "__main__":
    main()
