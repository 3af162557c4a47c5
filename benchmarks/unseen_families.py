"""The default call on ReLU networks bench_trust does not hold: random weights, Gaussian states, float64 references.

    PYTHONPATH=. python benchmarks/unseen_families.py [--device cpu|cuda] [--threads 1] [--rounds 21]

bench_trust's families are the agents this project trains, with their own states. These eight are what a user may
bring instead, at init (the hardest case: dense kinks): the package's ``DuelingQNetwork`` on 8 and 6 features (256
wide, states ``N(0, 1)`` and ``N(0, 2)``), a 256-256 ReLU MLP and a 128-128 LeakyReLU MLP, two seeds each, 64 states,
``target="mean"``. Per family: the true worst ordinary-state error and the batch error against an 8192-point
float64 midpoint reference, the estimate within 2x, its ratio on the worst state, the verdict at tol 1% (right,
wrong, or either where the truth is between tol and 2 tol) and the default call's time over 50-point
Gauss-Legendre (bench_trust's pairing: both calls once per round in a shuffled order, the median of ``--rounds``
rounds' ratios). The figures are bench_trust's (:func:`~benchmarks.bench_trust.measure`). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.bench_trust import DEFAULT_RULE, RULES, TIME_RULE, Family, call_rule, measure, paired_ms
from lightning_ig import DuelingQNetwork
from lightning_ig.attribution.exact_line import midpoint_reference

FAMILIES: tuple[tuple[str, Callable[[], nn.Module], float, int], ...] = (
    ("dueling_8x4", lambda: DuelingQNetwork(8, 4), 1.0, 8),
    ("dueling_6x3", lambda: DuelingQNetwork(6, 3), 2.0, 6),
    ("mlp_relu_256", lambda: _mlp(nn.ReLU), 1.0, 8),
    ("mlp_leaky_128", lambda: _mlp(lambda: nn.LeakyReLU(0.01), width=128), 1.0, 8),
)
_RULES = {rule[0]: rule for rule in RULES}


def _mlp(activation: Callable[[], nn.Module], width: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(8, width), activation(), nn.Linear(width, width), activation(), nn.Linear(width, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    parser.add_argument("--rounds", type=int, default=21, help="paired rounds per family for the time (default 21)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"# unseen_families: {name}, torch {torch.__version__}\n")
    print("| family | rule | true worst | batch | est. within 2x | worst-state ratio | verdict @1% | x GL50 |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in (11, 12):
        for label, build, scale, features in FAMILIES:
            torch.manual_seed(seed)
            model, states = build().eval().to(device), (scale * torch.randn(64, features)).to(device)
            family = Family(f"{label}_s{seed}", "init", model, states)
            ref = midpoint_reference(model, states, target="mean").attributions  # 8192 points, float64 on the host
            row = measure(family, ref, _RULES[DEFAULT_RULE], device)
            rules = (_RULES[DEFAULT_RULE], _RULES[TIME_RULE])
            timed = paired_ms({rule[0]: call_rule(family, rule, device) for rule in rules}, device, args.rounds)
            print(
                f"| {family.name} | {row.chosen}:{row.n_steps} | {100 * row.worst:.2f}% | {100 * row.batch:.2f}% | "
                f"{100 * row.within_2x:.0f}% | {row.worst_ratio:.2f} | {row.within} ({row.verdict}) | "
                f"{timed[DEFAULT_RULE][1]:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
