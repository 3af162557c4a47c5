"""The secant rule, tried for issue 32 and not shipped: 10x the accuracy at the same rows, but no honest estimate.

    PYTHONPATH=. python benchmarks/secant_experiment.py [--runs .bench_runs] [--references DIR]

Along a cell of the path a ReLU unit whose pre-activation is affine is on for a share of the cell that its values at
the cell's ends give exactly. A backward in which every ReLU passes that share (its secant between the ends) instead of
its 0/1 derivative gives each cell's mean gradient to second order; the first layer is exact, and each cell's
attributions sum to ``F(end) - F(start)`` (the discrete chain rule). Here it runs under a torch-function mode on the
families of ``bench_trust.py`` (the same ``--runs`` and cached references), beside the midpoint rule at the same rows.

What it shows (``benchmarks/results/secant_experiment_cpu.txt``): the error per state, and why the rule's error is
invisible to any comparison of two grids. Its largest errors come from a unit whose pre-activation dips below zero
(or bends) inside one cell: both ends agree, the chord misses the dip, and the error is the dip's width whatever the
cell's size, until a cell is narrower than the dip. So the worst state's error is flat from 10 to 80 cells and then
falls, and ``|a_n - a_n/2|`` (or any other grid) reads it low by up to 20x. The rule stays out of the package until
it has an estimate that sees such cells (``docs/trust.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from benchmarks.bench_trust import families

CELLS = (10, 20, 40, 80, 160)


class _Chord(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, batch: int) -> torch.Tensor:  # type: ignore[override]
        start, end = z, torch.cat([z[batch:], z[-batch:]])  # a row's cell runs to the row one node later
        share = torch.maximum(start, end) / (end - start).abs().clamp_min(torch.finfo(z.dtype).tiny)
        ctx.save_for_backward(share.clamp(0, 1))
        return z.clamp_min(0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (share,) = ctx.saved_tensors
        return grad * share, None


class _Secants(TorchFunctionMode):
    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func in (F.relu, torch.relu, torch.Tensor.relu):
            return _Chord.apply(args[0], self.batch)
        return func(*args, **(kwargs or {}))


def secant(model: torch.nn.Module, x: torch.Tensor, cells: int) -> torch.Tensor:
    """IG from the zero baseline, target the mean over actions, by the secant rule on ``cells`` cells (float64)."""
    batch = x.shape[0]
    alphas = torch.arange(cells + 1, dtype=torch.float64) / cells
    rows = (alphas.view(-1, 1, *[1] * (x.dim() - 1)) * x.unsqueeze(0)).reshape(-1, *x.shape[1:]).requires_grad_(True)
    with _Secants(batch):
        values = model(rows).mean(-1).view(cells + 1, batch)
    (grad,) = torch.autograd.grad(values[:-1].sum(), rows)  # the last node ends the last cell
    return x * grad.view(cells + 1, batch, *x.shape[1:])[:-1].sum(0) / cells


def midpoint(model: torch.nn.Module, x: torch.Tensor, n: int) -> torch.Tensor:
    alphas = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    rows = (alphas.view(-1, 1, *[1] * (x.dim() - 1)) * x.unsqueeze(0)).reshape(-1, *x.shape[1:]).requires_grad_(True)
    (grad,) = torch.autograd.grad(model(rows).mean(-1).sum(), rows)
    return x * grad.view(n, *x.shape).sum(0) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path(".bench_runs"), help="as bench_trust.py's")
    parser.add_argument("--references", type=Path, required=True, help="bench_trust.py's cached references")
    parser.add_argument("--only", default="", help="only the families whose names start with this")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        parser.error(f"--runs {str(args.runs)!r} is not a folder: give the folder the example agents were trained into")
    torch.set_num_threads(1)
    lines = [
        (
            "| family | rule | rows / state | batch error | worst state | worst state's error at 10/20/40/80/160 "
            "cells | estimate / truth there (n = 40 against 20) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for family in families(args.runs, quick=False):
        cached = args.references / f"{family.name}_{family.states.shape[0]}.pt"
        if family.kind == "smooth" or not family.name.startswith(args.only) or not cached.exists():
            continue
        ref = torch.load(cached, weights_only=True)
        model = family.model.double().eval()
        x = family.states.double()
        mass = ref.abs().sum(1)
        ordinary = mass >= 0.1 * mass.median()

        def errors(a: torch.Tensor, ref: torch.Tensor = ref, mass: torch.Tensor = mass) -> torch.Tensor:
            return (a.reshape(ref.shape) - ref).abs().sum(1) / mass

        found = {n: secant(model, x, n).reshape(ref.shape) for n in CELLS}
        per_state = {n: errors(a) for n, a in found.items()}
        worst = int(torch.where(ordinary, per_state[40], -1.0).argmax())
        estimate = (found[40] - found[20]).abs().sum(1)[worst] / mass[worst] / 2
        batch = float((found[40] - ref).abs().sum() / ref.abs().sum())
        middle = midpoint(model, x, 62).reshape(ref.shape)
        flat = " / ".join(f"{100 * float(per_state[n][worst]):.2f}" for n in CELLS)
        lines.append(
            f"| {family.name} | secant, 40 cells + 20 for the estimate | 62 | {100 * batch:.3f}% | "
            f"{100 * float(per_state[40][worst]):.3f}% | {flat} (%) | {float(estimate / per_state[40][worst]):.2f} |"
        )
        lines.append(
            f"| {family.name} | midpoint, 62 points | 62 | "
            f"{100 * float((middle - ref).abs().sum() / ref.abs().sum()):.3f}% | "
            f"{100 * float(errors(middle)[ordinary].max()):.3f}% | | |"
        )
        print(lines[-2], file=sys.stderr, flush=True)
    print("\n".join(lines))
    if len(lines) == 2:
        print(f"no family with a reference in {args.references}: run bench_trust.py --references DIR without --quick")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
