"""The work where ``n_steps="budget"`` gives 128 points on a CPU: which rule there, against float64 references.

    PYTHONPATH=. python benchmarks/small_work.py [--seeds 12] [--output FILE]

bench_trust's families are all 64 points on a CPU (the kink rule at 56); small networks get more. These are such
networks, ``target="mean"``, zero baseline, each at init and trained (300 SGD steps, batch 64, on ``3 sin(x W)`` of
512 Gaussian inputs), per seed: 8-64-64-4 MLPs with ReLU, PReLU, LeakyReLU(0.1) and ``abs()`` on 32 states
``N(0, 1)``; a 16-32-32-32-5 ReLU MLP on 64; the package's ``DuelingQNetwork(4, 2)`` at 64-64 on 32 states
``N(0, 1.5)`` (all 128 points) and at its default 256-256 (64 points: the kink rule at 56). References: the exact
line for the ReLU networks, 32,768 midpoint points in float64 otherwise. Per rule: the true worst-state error (the
ordinary states, as bench_trust), how many families are above 1% (trained) or 2% (at init), the verdict at tol 1%
falsely "within" (true worst above tol) or falsely not, the estimate within 2x (mean share of states) and the worst
state read below half. The rules: the default call, the midpoint rule at 128 and 256, the kink rule at 56, 112 and
224, and ``n_steps="auto"``. One CPU thread; about 5 minutes. Results: docs/benchmarks.md.

``--device cuda``: the GPU's 128 instead, the Nature-CNN at init (seeds 0 to 5) on 8 stacks of random MinAtar-like
frames drawn as bench_trust draws them (an H100 or H200 budget gives them 128 points), against 8192 midpoint points in
float64 on the device, with each rule's time over 50-point Gauss-Legendre (bench_trust's pairing, 21 rounds).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from benchmarks._common import write_output
from benchmarks.bench_trust import RULES as TRUST_RULES
from benchmarks.bench_trust import TIME_RULE, Family, Row, _grey_stacks, call_rule, measure, paired_ms
from lightning_ig import DuelingQNetwork
from lightning_ig.attribution.exact_line import exact_line, midpoint_reference
from lightning_ig.models import NatureQNetwork

TOL = 0.01
RULES: list[tuple[str, str, int | str]] = [
    ("default", "auto", "budget"),
    ("riemann_middle:128", "riemann_middle", 128),
    ("riemann_middle:256", "riemann_middle", 256),
    ("kink_midpoint:56", "kink_midpoint", 56),
    ("kink_midpoint:112", "kink_midpoint", 112),
    ("kink_midpoint:224", "kink_midpoint", 224),
    ("n_steps=auto", "auto", "auto"),
]


class _Abs(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs()


def _mlp(activation: Callable[[], nn.Module], sizes: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for width_in, width_out in itertools.pairwise(sizes[:-1]):
        layers += [nn.Linear(width_in, width_out), activation()]
    return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))


# (label, model, states, exact line): built under the seed
FAMILIES: tuple[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor], bool], ...] = (
    ("mlp_relu", lambda: _mlp(nn.ReLU, (8, 64, 64, 4)), lambda: torch.randn(32, 8), True),
    ("mlp_prelu", lambda: _mlp(nn.PReLU, (8, 64, 64, 4)), lambda: torch.randn(32, 8), False),
    ("mlp_leaky", lambda: _mlp(lambda: nn.LeakyReLU(0.1), (8, 64, 64, 4)), lambda: torch.randn(32, 8), False),
    ("mlp_abs", lambda: _mlp(_Abs, (8, 64, 64, 4)), lambda: torch.randn(32, 8), False),
    ("mlp3_relu", lambda: _mlp(nn.ReLU, (16, 32, 32, 32, 5)), lambda: torch.randn(64, 16), True),
    ("dueling_64", lambda: DuelingQNetwork(4, 2, hidden_sizes=(64, 64)), lambda: 1.5 * torch.randn(32, 4), True),
    ("dueling_256", lambda: DuelingQNetwork(4, 2), lambda: 1.5 * torch.randn(32, 4), True),
)


def _trained(model: nn.Module, features: int, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(512, features, generator=generator)
    y = 3 * torch.sin(x @ torch.randn(features, model(x[:1]).shape[1], generator=generator))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(300):
        batch = torch.randint(0, 512, (64,), generator=generator)
        loss = (model(x[batch]) - y[batch]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def _summary(rows: list[Row]) -> list[str]:
    head = "| rule | worst (median) | trained > 1% | init > 2% | falsely within | falsely not | est. within 2x |"
    lines = [head + " worst state read < 0.5x |", "|---|---|---|---|---|---|---|---|"]
    for label, *_ in RULES:
        own = [r for r in rows if r.rule == label]
        trained, init = [r for r in own if r.kind == "trained"], [r for r in own if r.kind == "init"]
        falsely = sum(r.within is True and r.worst > TOL for r in own)
        lines.append(
            f"| {label} | {100 * statistics.median(r.worst for r in own):.2f}% | "
            f"{sum(r.worst > TOL for r in trained)}/{len(trained)} | "
            f"{sum(r.worst > 2 * TOL for r in init)}/{len(init)} | {falsely} | "
            f"{sum(r.within is False and r.worst <= TOL for r in own)} | "
            f"{100 * statistics.mean(r.within_2x for r in own):.0f}% | {sum(r.worst_ratio < 0.5 for r in own)} |"
        )
    return lines


def _nature_on_the_device(seeds: int, device: torch.device) -> list[str]:
    timed = [*RULES[:2], next(rule for rule in TRUST_RULES if rule[0] == TIME_RULE)]
    lines = ["| family | rule | true worst | batch | est. within 2x | worst-state ratio | verdict @1% | x GL50 |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = NatureQNetwork(in_channels=4, num_actions=3).eval().to(device)
        states = _grey_stacks((torch.rand(8, 4, 10, 10) < 0.15).float()).to(device)
        ref = midpoint_reference(model, states, n_steps=8192, chunk_rows=512).attributions.reshape(8, -1).cpu()
        family = Family(f"nature_init_s{seed}", "init", model, states)
        ratios = paired_ms({rule[0]: call_rule(family, rule, device) for rule in timed}, device, 21)
        for rule in timed[:2]:
            r = measure(family, ref, rule, device)
            lines.append(
                f"| {family.name} | {rule[0]} ({r.chosen}:{r.n_steps}) | {100 * r.worst:.2f}% | {100 * r.batch:.2f}% | "
                f"{100 * r.within_2x:.0f}% | {r.worst_ratio:.2f} | {r.verdict} | {ratios[rule[0]][1]:.2f} |"
            )
        print(lines[-2], lines[-1], sep="\n", flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return [f"# small_work: {name}, torch {torch.__version__}", "", *lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=12, help="seeds per family and phase (default 12; 6 on cuda)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: the Nature-CNN at the GPU's 128")
    parser.add_argument("--output", type=Path, default=None, help="also write the tables to this file")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    if args.device != "cpu":
        lines = _nature_on_the_device(min(args.seeds, 6), torch.device(args.device))
        write_output("\n".join(lines), args.output)
        return
    torch.set_num_threads(1)
    rows: list[Row] = []
    lines = [f"# small_work: CPU, 1 thread, torch {torch.__version__}, {args.seeds} seeds", ""]
    for label, build, make_states, exact in FAMILIES:
        for kind in ("init", "trained"):
            own: list[Row] = []
            for seed in range(args.seeds):
                torch.manual_seed(seed)
                model, states = build(), make_states()
                if kind == "trained":
                    model = _trained(model, states.shape[1], seed)
                model.eval()
                reference = exact_line if exact else lambda m, s, **k: midpoint_reference(m, s, n_steps=32768, **k)
                ref = reference(model, states, target="mean").attributions.reshape(states.shape[0], -1)
                family = Family(f"{label}_{kind}_s{seed}", kind, model, states)
                own += [measure(family, ref, rule, torch.device("cpu")) for rule in RULES]
            chosen = {f"{r.chosen}:{r.n_steps}" for r in own if r.rule == "default"}
            print(f"{label} {kind}: the default is {', '.join(sorted(chosen))}", flush=True)
            rows += own
    for title, chosen in (("128 points (the budget's 128)", 112), ("64 points (the budget's 64)", 56)):
        names = {r.family for r in rows if r.rule == "default" and r.n_steps == chosen}
        lines += [f"## Families where the default call gets {title}: {len(names)} of them", ""]
        lines += [*_summary([r for r in rows if r.family in names]), ""]
    print("\n".join(lines))
    write_output("\n".join(lines), args.output)


if __name__ == "__main__":
    main()
