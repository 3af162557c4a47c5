"""The default call and ``n_steps="auto"`` on ReLU networks bench_trust does not hold: random weights, float64 refs.

    PYTHONPATH=. python benchmarks/unseen_families.py [--device cpu|cuda] [--threads 1] [--rounds 21]

bench_trust's families are the agents this project trains, with their own states. These are what a user may bring
instead, at init (the hardest case: dense kinks), two seeds each, ``target="mean"``: the package's
``DuelingQNetwork`` on 8 and 6 features (256 wide, states ``N(0, 1)`` and ``N(0, 2)``) and on 16 features (128-128,
``N(0, 1.5)``), a 256-256 ReLU MLP and a 128-128 LeakyReLU(0.01) MLP on 8 features, a 128-128-128 ReLU MLP on 10
(``N(0, 3)``), a 64-64-64 LeakyReLU(0.1) MLP on 6 (``N(0, 2)``), 64 states each, and ``MinAtarQNetwork(6, 4)`` on 32
random frames (15% of the cells on). Per family and call (the default, and ``n_steps="auto"``: diag's default): the
true worst ordinary-state error and the batch error against an 8192-point float64 midpoint reference, the estimate
within 2x, its ratio on the worst state, the verdict at tol 1% (right, wrong, or either where the truth is between
tol and 2 tol), the mean nodes a state used, and the call's time over 50-point Gauss-Legendre (bench_trust's
pairing: the calls once per round in a shuffled order, the median of ``--rounds`` rounds' ratios). The figures are
bench_trust's (:func:`~benchmarks.bench_trust.measure`). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.bench_trust import AUTO_RULE, DEFAULT_RULE, RULES, TIME_RULE, Family, call_rule, measure, paired_ms
from lightning_ig import DuelingQNetwork
from lightning_ig.attribution.exact_line import midpoint_reference
from lightning_ig.models import MinAtarQNetwork


def _gaussian(scale: float, features: int) -> Callable[[], torch.Tensor]:
    return lambda: scale * torch.randn(64, features)


def _frames(count: int, channels: int) -> torch.Tensor:
    return (torch.rand(count, channels, 10, 10) < 0.15).float()


def _mlp(activation: Callable[[], nn.Module], width: int = 256, features: int = 8, depth: int = 2) -> nn.Module:
    layers: list[nn.Module] = []
    for index in range(depth):
        layers += [nn.Linear(features if index == 0 else width, width), activation()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


# (label, model, states): each seed makes the model, then its states
FAMILIES: tuple[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor]], ...] = (
    ("dueling_8x4", lambda: DuelingQNetwork(8, 4), _gaussian(1.0, 8)),
    ("dueling_6x3", lambda: DuelingQNetwork(6, 3), _gaussian(2.0, 6)),
    ("mlp_relu_256", lambda: _mlp(nn.ReLU), _gaussian(1.0, 8)),
    ("mlp_leaky_128", lambda: _mlp(lambda: nn.LeakyReLU(0.01), width=128), _gaussian(1.0, 8)),
    ("dueling_16x5", lambda: DuelingQNetwork(16, 5, hidden_sizes=(128, 128)), _gaussian(1.5, 16)),
    ("mlp3_relu_128", lambda: _mlp(nn.ReLU, 128, 10, 3), _gaussian(3.0, 10)),
    ("mlp3_leaky_64", lambda: _mlp(lambda: nn.LeakyReLU(0.1), 64, 6, 3), _gaussian(2.0, 6)),
    ("minatar_6x4", lambda: MinAtarQNetwork(6, 4), lambda: _frames(32, 6)),
)
_RULES = {rule[0]: rule for rule in RULES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    parser.add_argument("--rounds", type=int, default=21, help="paired rounds per family for the time (default 21)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"# unseen_families: {name}, torch {torch.__version__}\n")
    print("| family | call | true worst | batch | est. within 2x | worst-state ratio | verdict @1% | nodes | x GL50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in (11, 12):
        for label, build, make_states in FAMILIES:
            torch.manual_seed(seed)
            model = build().eval().to(device)
            states = make_states().to(device)
            family = Family(f"{label}_s{seed}", "init", model, states)
            chunk = 8192 if states[0].numel() < 1000 else 512
            ref = midpoint_reference(model, states, target="mean", chunk_rows=chunk).attributions  # float64, host
            ref = ref.reshape(states.shape[0], -1)
            rules = (_RULES[DEFAULT_RULE], _RULES[AUTO_RULE], _RULES[TIME_RULE])
            timed = paired_ms({rule[0]: call_rule(family, rule, device) for rule in rules}, device, args.rounds)
            for rule in rules[:2]:
                row = measure(family, ref, rule, device)
                print(
                    f"| {family.name} | {rule[0]}: {row.chosen} | {100 * row.worst:.2f}% | {100 * row.batch:.2f}% | "
                    f"{100 * row.within_2x:.0f}% | {row.worst_ratio:.2f} | {row.within} ({row.verdict}) | "
                    f"{row.mean_nodes:.0f} | {timed[rule[0]][1]:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
