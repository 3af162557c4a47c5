"""The callback's trust checks: their cost against its IG time, and whether the sanity check separates.

Two parts, both printed as tables (the summary table last):

1. **Cost.** On CartPole-, MinAtar- and Nature-shaped NoisyNet dueling networks (ReLU), the callback's IG time of
   one run (the engine at the callback's defaults plus the one gather to the host, as ``ig/time_ms`` counts it)
   and each piece of the checks at the callback's sizes (units as the callback logs them: CartPole's 4 features,
   the 4 channels of MinAtar and Nature frames): the sanity reference (once per fit), the sanity check, the
   deletion check, the stability check. Medians of interleaved rounds, each piece over the IG time of its own
   round (a loaded machine's drift cancels). Then the checks' average share of the IG time over fits of R runs
   at the default cadence (``checks_every_n_runs=5``: sanity and deletion every 5 runs, stability every 20,
   everything at the first and the final run, the 20% budget gate), simulated with those ratios exactly as
   :class:`~lightning_ig.callback.trust.TrustChecks` decides.
2. **Separation.** On trained agents (``--runs``: folders with ``q_network.safetensors`` as the examples write
   them; without any, a quick deterministic supervised training of a 32-feature dueling network), the model's
   rank correlation with re-initialised copies (trained vs reinit) beside the copies' among themselves (reinit vs
   reinit), at the callback's sizes (4 copies, a quarter of the held-out states) and on all states.

Run (CPU here; ``--device cuda`` on a GPU)::

    PYTHONPATH=. python benchmarks/bench_checks.py --output benchmarks/results/bench_checks_cpu.txt
    PYTHONPATH=. python benchmarks/bench_checks.py --device cuda --runs /path/to/runs --output results.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks._common import device_name, synchronize, write_output
from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.host_result import HostResult
from lightning_ig.callback.trust import (
    AttributionSettings,
    TrustChecks,
    deletion_check,
    randomization_check,
    randomization_reference,
    stability_check,
)
from lightning_ig.checkpoint import load_checkpoint
from lightning_ig.models import DuelingQNetwork, MinAtarQNetwork, NatureQNetwork
from lightning_ig.models.noise import attribution_mode

DEFAULT_RUNS = Path("runs")  # where examples/dqn_*.py --activation relu write their runs
CALLBACK_IG = {"n_steps": 50, "method": "gausslegendre"}  # the callback's defaults
SETTINGS = AttributionSettings(target="mean", options=CALLBACK_IG)
CADENCE = TrustChecks.every(5)  # the callback's default checks_every_n_runs=5


# ---------------------------------------------------------------------------------------------- the nets


def _families(device: torch.device) -> list[dict[str, Any]]:
    """The three shapes at random init (ReLU NoisyNets, as the examples build them), with states of their kind."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cartpole = DuelingQNetwork(4, 2, hidden_sizes=(128, 128), activation="relu")
        minatar = MinAtarQNetwork(in_channels=4, num_actions=3, activation="relu")
        nature = NatureQNetwork(in_channels=4, num_actions=18, activation="relu")
    cartpole_states = torch.randn(64, 4, generator=generator) * torch.tensor([1.0, 0.5, 0.1, 0.5])
    minatar_states = (torch.rand(64, 4, 10, 10, generator=generator) < 0.08).float()
    nature_states = torch.randint(0, 256, (8, 4, 84, 84), generator=generator).float() / 255
    return [
        {"name": "CartPole MLP", "model": cartpole, "states": cartpole_states, "groups": None},
        {"name": "MinAtar CNN", "model": minatar, "states": minatar_states, "groups": "channels"},
        {"name": "Nature CNN", "model": nature, "states": nature_states, "groups": "channels"},
    ]


def _on(family: dict[str, Any], device: torch.device) -> dict[str, Any]:
    states = family["states"].to(device)
    groups = None if family["groups"] is None else FeatureGroups.resolve(family["groups"], tuple(states.shape[1:]))
    return {**family, "model": family["model"].to(device).eval(), "states": states, "groups": groups}


def _units(attributions: torch.Tensor, groups: FeatureGroups | None) -> torch.Tensor:
    flat = attributions.reshape(attributions.shape[0], -1)
    return flat if groups is None else groups.sum(flat)


# ---------------------------------------------------------------------------------------------- part 1: cost


def _work(family: dict[str, Any], device: torch.device) -> dict[str, Callable[[], object]]:
    """One callback run's IG time and each piece of the checks, as callables."""
    model, states, groups = family["model"], family["states"], family["groups"]
    baselines = torch.zeros_like(states)
    engine = IntegratedGradients(model, target="mean", **CALLBACK_IG)

    def ig() -> HostResult:  # what ig/time_ms counts: the engine's run and the one gather to the host
        with attribution_mode(model):
            result = engine.attribute(states, baselines=baselines)
        return HostResult.from_result(result, groups=groups, keep_attributions=True)

    host = ig()
    units = host.group_attributions if groups is not None else host.attributions
    quarter = CADENCE.quarter(len(states))
    sizes = {"settings": SETTINGS, "groups": groups}

    def reference() -> object:
        return randomization_reference(model, states, baselines, num_copies=CADENCE.copies, num_states=quarter, **sizes)

    made = reference()
    return {
        "ig": ig,
        "reference": reference,
        "sanity": lambda: randomization_check(units, made),
        "deletion": lambda: deletion_check(model, states, baselines, units, seed=CADENCE.seed, **sizes),
        "stability": lambda: stability_check(
            model, states, baselines, units, num_draws=CADENCE.draws, num_states=quarter, seed=CADENCE.seed, **sizes
        ),
    }


def _timed(function: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - started


def average_share(ratios: dict[str, float], runs: int, cadence: TrustChecks = CADENCE) -> float:
    """The checks' time over a fit of ``runs`` runs as a share of its IG time, deciding as the monitor does."""
    spent, ig, reference_made = 0.0, 0.0, False
    for run in range(runs):
        ig += ratios["ig"]
        due = cadence.due(run, first=run == 0, check_seconds=spent, ig_seconds=ig, final=run == runs - 1)
        for name in due:
            if name == "sanity" and not reference_made:
                spent, reference_made = spent + ratios["reference"], True
            spent += ratios[name]
    return spent / ig


def cost(device: torch.device, repeats: int) -> list[dict[str, Any]]:
    rows = []
    print("## Cost: each piece at the callback's sizes, over one run's IG time (medians of interleaved rounds)\n")
    print("| net | states | units | IG time | reference (once) | sanity | deletion | stability |")
    print("|---|---|---|---|---|---|---|---|")
    for family in (_on(family, device) for family in _families(device)):
        work = _work(family, device)
        times: dict[str, list[float]] = {name: [] for name in work}
        for function in work.values():  # warm-up (graph capture, caches)
            function()
        for _ in range(repeats):
            for name, function in work.items():
                times[name].append(_timed(function, device))
        ratios = {name: statistics.median(t / i for t, i in zip(values, times["ig"])) for name, values in times.items()}
        medians = {name: statistics.median(values) for name, values in times.items()}
        units = 4 if family["groups"] is None else len(family["groups"])
        share = {runs: average_share(ratios, runs) for runs in (10, 50, 100, 200)}
        unlimited = dataclasses.replace(CADENCE, budget=None)
        ungated = {runs: average_share(ratios, runs, unlimited) for runs in (10, 50, 100, 200)}
        rows.append({"name": family["name"], "ratios": ratios, "share": share, "ungated": ungated})
        pieces = " | ".join(
            f"{1e3 * medians[name]:.1f} ms ({ratios[name]:.3f}x)"
            for name in ("reference", "sanity", "deletion", "stability")
        )
        print(f"| {family['name']} | {len(family['states'])} | {units} | {1e3 * medians['ig']:.1f} ms | {pieces} |")
    print("\n## Average share of the IG time at checks_every_n_runs=5, by runs per fit (without the budget gate)\n")
    print("| net | 10 runs | 50 runs | 100 runs | 200 runs |")
    print("|---|---|---|---|---|")
    for row in rows:
        cells = " | ".join(f"{100 * row['share'][r]:.1f}% ({100 * row['ungated'][r]:.1f}%)" for r in (10, 50, 100, 200))
        print(f"| {row['name']} | {cells} |")
    return rows


# ---------------------------------------------------------------------------------------------- part 2: separation


def _quick_agent() -> tuple[str, nn.Module, torch.Tensor, str | None]:
    """A deterministic supervised stand-in for a trained agent: 32 features, a value only 4 small ones carry."""
    scales = torch.logspace(0.5, -0.5, 32)
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DuelingQNetwork(32, 2, hidden_sizes=(64, 64), activation="relu")
    data = torch.randn(2048, 32, generator=generator) * scales
    z = data / scales
    target = 3 * z[:, -6] - 2 * z[:, -4] + z[:, -3] * z[:, -1]
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):
        rows = torch.randint(0, len(data), (128,), generator=generator)
        model.reset_noise(generator)
        loss = ((model(data[rows]).mean(dim=1) - target[rows]) ** 2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    states = torch.randn(64, 32, generator=torch.Generator().manual_seed(99)) * scales
    return "synthetic 32-feature MLP (quick training)", model.eval(), states, None


def _agents(runs: Path) -> list[tuple[str, nn.Module, torch.Tensor, str | None]]:
    agents = []
    for pattern, groups in (("CartPole-v1__*", None), ("MinAtar-*", "channels"), ("MinAtar-*", None)):
        for path in sorted(runs.glob(f"{pattern}/q_network.safetensors")):
            loaded = load_checkpoint(path)
            seed = path.parent.name.split("__")[2]
            what = path.parent.name.split("__")[0] + f" seed {seed}"
            if pattern.startswith("MinAtar"):
                what += " (pixels)" if groups is None else " (channels)"
            agents.append((what, loaded.model.eval(), loaded.states[:64].contiguous(), groups))
    return agents or [_quick_agent()]


def separation(device: torch.device, runs: Path) -> list[dict[str, Any]]:
    rows = []
    print("\n## Sanity separation: trained vs reinit (the model against 4 re-initialised copies), reinit vs reinit\n")
    print("| agent | units | states | trained vs reinit | reinit vs reinit | gap | resolved | passed |")
    print("|---|---|---|---|---|---|---|---|")
    for name, agent, held_out, groups in _agents(runs):
        model, states = agent.to(device), held_out.to(device)
        resolved_groups = None if groups is None else FeatureGroups.resolve(groups, tuple(states.shape[1:]))
        baselines = torch.zeros_like(states)
        with attribution_mode(model):
            units = _units(SETTINGS.attribute(model, states, baselines), resolved_groups)
        for count, label in ((CADENCE.quarter(len(states)), "callback's"), (None, "all")):
            reference = randomization_reference(
                model, states, baselines, settings=SETTINGS, groups=resolved_groups, num_states=count, seed=0
            )
            check = randomization_check(units, reference)
            row = {
                "agent": name,
                "units": check.num_units,
                "states": len(reference.state_index),
                "label": label,
                "trained": check.randomization_rank_correlation,
                "reinit": check.copy_rank_correlation,
                "resolved": check.resolved,
                "passed": check.passed,
            }
            rows.append(row)
            print(
                f"| {name} | {row['units']} | {row['states']} ({label}) | {row['trained']:.3f} | {row['reinit']:.3f} "
                f"| {row['reinit'] - row['trained']:+.3f} | {row['resolved']} | {row['passed']} |"
            )
    return rows


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="folder of the examples' trained runs")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds per piece (default 7)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: less noise)")
    parser.add_argument("--output", type=Path, default=None, help="also write everything printed here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    printed = io.StringIO()
    with redirect_stdout(printed):
        print(
            f"# bench_checks on {device_name(device)} ({device}, {args.threads} thread(s)), torch {torch.__version__}"
        )
        print(f"IG: {CALLBACK_IG}, target mean, zero baseline; cadence {CADENCE}\n")
        costs = cost(device, args.repeats)
        sanity = separation(device, args.runs)
        print("\n## Summary\n")
        print("| what | value |")
        print("|---|---|")
        for row in costs:
            for runs in (10, 50, 100):
                share = row["share"][runs]
                met = "met" if share <= 0.2 else "not met"
                print(f"| {row['name']}: checks / IG time, {runs} runs | {100 * share:.1f}% (<= 20%: {met}) |")
        for row in (row for row in sanity if row["label"] == "callback's"):
            verdict = "separates" if row["reinit"] - row["trained"] >= 0.10 else "does not separate"
            print(
                f"| {row['agent']}: trained vs reinit / reinit vs reinit | {row['trained']:.3f} / {row['reinit']:.3f} "
                f"({verdict}) |"
            )
    text = printed.getvalue()
    sys.stdout.write(text)
    write_output(text.rstrip("\n"), args.output)
    return 0 if all(math.isfinite(row["share"][50]) for row in costs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
