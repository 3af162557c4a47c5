"""The callback's trust checks: their cost against its IG time at every run, and whether the sanity check separates.

Two parts, both printed as tables (the summary table last):

1. **Cost.** On CartPole-, MinAtar- and Nature-shaped NoisyNet dueling networks (ReLU), one callback IG run (the
   engine at the callback's defaults plus the one gather to the host, as ``ig/time_ms`` counts it) and each piece
   of the checks as the callback runs them, at its sizes (units as it logs them: CartPole's 4 features, the 4
   channels of MinAtar and Nature frames): the working copy of the model, the deletion check's fixed rows, the
   capture of the copy's IG (a CUDA device only), the sanity reference (4 re-initialised copies), the sanity,
   deletion and stability checks. Medians of interleaved rounds, each over the IG time of its own round (a loaded
   machine's drift cancels). The callback pays the pieces made once at its first run and each check again as its
   budget allows (``lightning_ig/callback/budget.py``): these ratios say what one pass of each costs there.
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
from lightning_ig.attribution import IGOptions, IntegratedGradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.settings import DEFAULT_METHOD, DEFAULT_N_STEPS
from lightning_ig.callback.monitor import COPIES, DRAWS, SEED, quarter
from lightning_ig.checkpoint import load_checkpoint
from lightning_ig.models import DuelingQNetwork, MinAtarQNetwork, NatureQNetwork
from lightning_ig.models.noise import attribution_mode
from lightning_ig.run.host_result import HostResult
from lightning_ig.trust import (
    AttributionSettings,
    DeletionPlan,
    Replica,
    randomization_check,
    randomization_reference,
    stability_check,
)

DEFAULT_RUNS = Path("runs")  # where examples/dqn_*.py --activation relu write their runs
CALLBACK_IG = IGOptions(n_steps=DEFAULT_N_STEPS, method=DEFAULT_METHOD)  # the callback's defaults
SETTINGS = AttributionSettings(target="mean", options=CALLBACK_IG)
PIECE_NAMES = ("copy", "plan", "capture", "reference", "sanity", "deletion", "stability")


# ---------------------------------------------------------------------------------------------- the nets


def _families() -> list[dict[str, Any]]:
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


def _work(family: dict[str, Any]) -> dict[str, Callable[[], object]]:
    """One callback IG run and each piece of the checks as the monitor runs it, as callables."""
    model, states, groups = family["model"], family["states"], family["groups"]
    engine = IntegratedGradients(model, target="mean", **CALLBACK_IG.keywords())

    def ig() -> HostResult:  # what ig/time_ms counts: the engine's run and the one gather to the host
        with attribution_mode(model):
            result = engine.attribute(states)
        return HostResult.from_result(result, groups=groups, keep_attributions=True)

    host = ig()
    units = host.group_attributions if groups is not None else host.attributions  # on the host, as the monitor has
    quarter_states = quarter(len(states))
    sizes = {"settings": SETTINGS, "groups": groups}
    warm = Replica(model, SETTINGS)

    def reference(replica: Replica) -> Any:
        return randomization_reference(
            model, states, None, num_copies=COPIES, num_states=quarter_states, replica=replica, **sizes
        )

    made = reference(warm)  # captures the warm copy's graph on a GPU
    plan = DeletionPlan(states, None, groups, seed=SEED)

    def deletion() -> object:
        warm.sync()
        return plan.run(SETTINGS.value(warm.module), units)

    def stability() -> object:
        return stability_check(
            model, states, None, units, num_draws=DRAWS, num_states=quarter_states, replica=warm, **sizes
        )

    return {
        "ig": ig,
        "copy": lambda: Replica(model, SETTINGS),
        "first": lambda: reference(Replica(model, SETTINGS)),  # copy + capture + reference
        "plan": lambda: DeletionPlan(states, None, groups, seed=SEED),
        "reference": lambda: reference(warm),
        "sanity": lambda: randomization_check(units, made),
        "deletion": deletion,
        "stability": stability,
    }


def _timed(function: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - started


def cost(device: torch.device, repeats: int) -> list[dict[str, Any]]:
    rows = []
    print("## Cost: each piece over one IG run's time (medians of interleaved rounds)\n")
    print(f"| net | states | units | IG time | {' | '.join(PIECE_NAMES)} |")
    print(f"|---|---|---|---|{'---|' * len(PIECE_NAMES)}")
    for family in (_on(family, device) for family in _families()):
        work = _work(family)
        times: dict[str, list[float]] = {name: [] for name in work}
        for function in work.values():  # warm-up (allocations, the noise draws)
            function()
        for _ in range(repeats):
            for name, function in work.items():
                times[name].append(_timed(function, device))
        ratios = {name: statistics.median(t / i for t, i in zip(values, times["ig"])) for name, values in times.items()}
        measured = {name: ratios[name] for name in ("copy", "plan", "reference", "sanity", "deletion", "stability")}
        measured["capture"] = max(0.0, ratios["first"] - ratios["copy"] - ratios["reference"])
        units = 4 if family["groups"] is None else len(family["groups"])
        states = len(family["states"])
        rows.append({"name": family["name"], "measured": measured})
        cells = " | ".join(f"{measured[name]:.3f}" for name in PIECE_NAMES)
        ig_ms = 1e3 * statistics.median(times["ig"])
        print(f"| {family['name']} | {states} | {units} | {ig_ms:.1f} ms | {cells} |")
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
        for count, label in ((quarter(len(states)), "callback's"), (None, "all")):
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
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    printed = io.StringIO()
    with redirect_stdout(printed):
        print(
            f"# bench_checks on {device_name(device)} ({device}, {args.threads} thread(s)), torch {torch.__version__}"
        )
        print(f"IG: {CALLBACK_IG}, target mean, zero baseline; {COPIES} copies, {DRAWS} noise draws\n")
        costs = cost(device, args.repeats)
        sanity = separation(device, args.runs)
        print("\n## Summary\n")
        print("| what | value |")
        print("|---|---|")
        for row in costs:
            first = sum(row["measured"][name] for name in ("copy", "plan", "capture", "reference"))
            print(f"| {row['name']}: the pieces made once, in IG runs | {first:.2f} |")
            again = sum(row["measured"][name] for name in ("sanity", "deletion", "stability"))
            print(f"| {row['name']}: each check again, in IG runs | {again:.2f} |")
        for row in (row for row in sanity if row["label"] == "callback's"):
            verdict = "separates" if row["reinit"] - row["trained"] >= 0.10 else "does not separate"
            print(
                f"| {row['agent']}: trained vs reinit / reinit vs reinit | {row['trained']:.3f} / {row['reinit']:.3f} "
                f"({verdict}) |"
            )
    text = printed.getvalue()
    sys.stdout.write(text)
    write_output(text.rstrip("\n"), args.output)
    return 0 if all(math.isfinite(value) for row in costs for value in row["measured"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
