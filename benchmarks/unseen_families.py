"""The default call on ReLU networks bench_trust does not hold: random weights, Gaussian states, float64 references.

    PYTHONPATH=. python benchmarks/unseen_families.py [--device cpu|cuda] [--threads 1] [--rounds 21]

bench_trust's families are the agents this project trains, with their own states. These eight are what a user may
bring instead, at init (the hardest case: dense kinks): the package's ``DuelingQNetwork`` on 8 and 6 features (256
wide, states ``N(0, 1)`` and ``N(0, 2)``), a 256-256 ReLU MLP and a 128-128 LeakyReLU MLP, two seeds each, 64 states,
``target="mean"``. Per family: the true worst ordinary-state error and the batch error against an 8192-point
float64 midpoint reference, the estimate within 2x, its ratio on the worst state, the verdict at tol 1% (right,
wrong, or either where the truth is between tol and 2 tol) and the default call's time over 50-point
Gauss-Legendre (the median of ``--rounds`` ABBA pairs). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lightning_ig import DuelingQNetwork, integrated_gradients
from lightning_ig.attribution.exact_line import midpoint_reference
from lightning_ig.run import accuracy_verdict

TOL = 0.01
FAMILIES: tuple[tuple[str, Callable[[], nn.Module], float, int], ...] = (
    ("dueling_8x4", lambda: DuelingQNetwork(8, 4), 1.0, 8),
    ("dueling_6x3", lambda: DuelingQNetwork(6, 3), 2.0, 6),
    ("mlp_relu_256", lambda: _mlp(nn.ReLU), 1.0, 8),
    ("mlp_leaky_128", lambda: _mlp(lambda: nn.LeakyReLU(0.01), width=128), 1.0, 8),
)


def _mlp(activation: Callable[[], nn.Module], width: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(8, width), activation(), nn.Linear(width, width), activation(), nn.Linear(width, 4))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _paired_ratio(model: nn.Module, states: Tensor, device: torch.device, rounds: int) -> float:
    """The median of ``rounds`` ABBA pairs' time ratio: the default call over 50-point Gauss-Legendre."""
    ours = functools.partial(integrated_gradients, model, states, target="mean")
    theirs = functools.partial(ours, method="gausslegendre", n_steps=50)
    for call in (ours, theirs, ours, theirs):  # warm-up
        call()
    ratios = []
    for k in range(rounds):
        seconds = {}
        for name, call in (("ours", ours), ("theirs", theirs))[:: 1 if k % 2 == 0 else -1]:
            _synchronize(device)
            started = time.perf_counter()
            call()
            _synchronize(device)
            seconds[name] = time.perf_counter() - started
        ratios.append(seconds["ours"] / seconds["theirs"])
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    parser.add_argument("--rounds", type=int, default=21, help="ABBA pairs per family for the time (default 21)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"# unseen_families: {name}, torch {torch.__version__}\n")
    print("| family | rule | true worst | batch | est. within 2x | worst-state ratio | verdict @1% | x GL50 |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in (11, 12):
        for family, build, scale, features in FAMILIES:
            torch.manual_seed(seed)
            model, states = build().eval(), scale * torch.randn(64, features)
            model, states = model.to(device), states.to(device)
            result = integrated_gradients(model, states, target="mean")
            ref = midpoint_reference(model, states, target="mean").attributions.double()  # 8192 points
            ours = result.attributions.double()
            mass = ref.abs().sum(1)
            ordinary = mass >= 0.1 * mass.median()
            true = (ours - ref).abs().sum(1) / mass
            estimate = result.attribution_error.double()
            ratios = (estimate / true)[ordinary]
            worst = int(torch.where(ordinary, true, torch.full_like(true, -1.0)).argmax())
            within = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, TOL).within
            truth = float(true[worst])
            right = "either" if TOL < truth <= 2 * TOL else ("right" if within == (truth <= TOL) else "WRONG")
            ratio = _paired_ratio(model, states, device, args.rounds)
            print(
                f"| {family}_s{seed} | {result.method}:{result.n_steps} | {100 * truth:.2f}% | "
                f"{100 * float((ours - ref).abs().sum() / ref.abs().sum()):.2f}% | "
                f"{100 * float(((ratios >= 0.5) & (ratios <= 2)).double().mean()):.0f}% | "
                f"{float(estimate[worst] / true[worst]):.2f} | {within} ({right}) | {ratio:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
