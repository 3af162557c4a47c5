"""How far the engine's attributions and its trust figures are from the truth, and what the default costs.

    PYTHONPATH=. python benchmarks/bench_trust.py [--quick] [--device cpu|cuda] [--runs DIR] [--threads N]
        [--references DIR] [--output FILE] [--only PREFIX]

The agents in ``--runs`` come from ``PYTHONPATH=. python benchmarks/trust_runs.py --runs DIR`` (the examples,
trained one after the other, and the distilled Nature-CNN; about 20 MB).

Families (zero baseline, target V(s) = mean over actions):

* ``cartpole_relu_trained_sS`` / ``minatar_relu_trained_sS``: the agents ``examples/dqn_cartpole.py --activation
  relu`` and ``examples/dqn_minatar.py --activation relu`` trained with seed S, read from ``--runs`` (folders
  ``CartPole-v1__dqn_cartpole__S__*`` and ``MinAtar-breakout__dqn_minatar__S__*`` holding ``q_network.safetensors``
  with its held-out states); ``*_relu_init_sS``: the same architecture at random init (seed 100 + S) on the
  agent's states;
* ``nature_relu_trained``: a ReLU Nature-CNN distilled on the MinAtar agent's V(s)
  (``--runs``/nature_distilled/nature_relu_distilled.pt: its ``state_dict`` and held-out 4x84x84 stacks);
  ``nature_relu_init``: the Nature-CNN at random init (seed 301) on the same stacks (or, without the distilled
  file, on the MinAtar agent's frames drawn grey and upscaled to 84x84);
* smooth controls: the tanh CartPole and the SiLU MinAtar networks at random init, and the trained ones in
  ``--runs``/smooth when present.

References (:mod:`lightning_ig.attribution.exact_line`): the exact line for the ReLU networks of up to
``--exact-max-features`` features, 8192 midpoint steps with the model and the sums in float64 otherwise.
Figures per family and rule, over the *ordinary* states (``||a_ref||_1`` at least a tenth of the batch median; the
others are counted, ``near``): the true worst error ``||a - a_ref||_1 / ||a_ref||_1``, the batch error
``sum|A - A_ref| / sum|A_ref|``, the estimate ``attribution_error``'s ratio to the truth (share of states within
2x, the ratio on the truly worst state), the completeness figures (today's worst ``|delta| / |dF|`` and the
worst mass-relative error), the verdict at tol 1% (right, wrong, or either where the truth lies in (tol, 2 tol]),
the median time of one engine call and its time over Gauss-Legendre's at 50 points (paired: every rule once per
round, in a shuffled order, the ratio taken within the round, the median over the rounds: robust to a shared
machine's drifts). The rules: the engine's default (``method="auto"``, ``n_steps="budget"``: the rule and the points
it chose are in brackets), Gauss-Legendre at 50 (the time reference), the midpoint rule at 64, 128 and 256, the
kink rule at 56, and ``n_steps="auto"`` (diag's default) with its time when every state goes to its bound (tol
1e-9: 504 nodes). The target table says met / not met for each target of issue 32 for the default call.
References are cached in ``--references`` (``<family>_<states>.pt``, the ``(B, F)`` float64 attributions).
"""

from __future__ import annotations

import argparse
import glob
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks._common import device_name, synchronize, write_output
from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.exact_line import exact_line, midpoint_reference
from lightning_ig.checkpoint import load_checkpoint
from lightning_ig.models import DuelingQNetwork, MinAtarQNetwork, NatureQNetwork
from lightning_ig.run.statistics import accuracy_verdict

DEFAULT_RUNS = Path("runs")  # where examples/dqn_*.py --activation relu write their runs (benchmarks/trust_runs.py)
TOL = 0.01
# (label, method, n_steps); the first is the default call (method="auto", n_steps="budget": the rule and the points
# chosen from the work's size on this device), "gausslegendre:50" is the time reference; the fixed midpoint rules
# show what the points buy, the kink rule at 56 what the default is where points are dear; "auto" is diag's default.
RULES: list[tuple[str, str, int | str]] = [
    ("default", "auto", "budget"),
    ("gausslegendre:50", "gausslegendre", 50),
    ("riemann_middle:64", "riemann_middle", 64),
    ("riemann_middle:128", "riemann_middle", 128),
    ("riemann_middle:256", "riemann_middle", 256),
    ("kink_midpoint:56", "kink_midpoint", 56),
    ("n_steps=auto", "auto", "auto"),
]
DEFAULT_RULE, TIME_RULE, AUTO_RULE = RULES[0][0], RULES[1][0], RULES[-1][0]
GREY = torch.tensor([1.0, 0.75, 0.4, 0.55])  # paddle, ball, trail, brick: MinAtar's channels drawn as one image

TARGETS = [
    "Default call: worst ordinary-state error <= 1% on trained nets and <= 2% at random init",
    "the batch error sum|A - A_ref| / sum|A_ref| <= 0.5%",
    "at <= 1.3x the time of 50-step Gauss-Legendre",
    "the estimate within 2x on >= 90% of states, and never below half the truth on the worst state",
    'the verdict at tol 1% right on every family ("within" when the truth is <= tol, "not" when > 2 tol)',
]


@dataclass
class Family:
    name: str
    kind: str  # "trained", "init" or "smooth"
    model: torch.nn.Module
    states: torch.Tensor


@dataclass
class Row:
    family: str
    kind: str
    rule: str
    worst: float
    batch: float
    near: int
    within_2x: float
    worst_ratio: float
    old_completeness: float
    mass_relative: float
    within: bool | None
    verdict: str  # "right", "wrong", "either"
    ms: float
    ratios: list[float]
    n_steps: int = 0  # the points used (n_steps="budget": what the engine chose; "auto": the most any state used)
    mean_nodes: float = math.nan  # the points a state used, on average (n_steps for a fixed count)
    chosen: str = ""  # the rule that ran (method="auto": the result's method)
    time_ratio: float = math.nan  # paired time over gausslegendre:50's
    bound_ms: float = math.nan  # n_steps="auto": every state refined to the bound (tol 1e-9)


# --------------------------------------------------------------------------------------------------
# families


def _checkpoints(runs: Path, pattern: str) -> list[tuple[int, Path]]:
    paths = sorted(glob.glob(str(runs / pattern / "q_network.safetensors")))
    return [(int(Path(path).parent.name.split("__")[2]), Path(path)) for path in paths]


def _agents(runs: Path, game: str, seeds: tuple[int, ...], num_states: int) -> list[Family]:
    pattern, network = (
        ("CartPole-v1__dqn_cartpole__*", DuelingQNetwork)
        if game == "cartpole"
        else ("MinAtar-breakout__dqn_minatar__*", MinAtarQNetwork)
    )
    out = []
    for seed, path in _checkpoints(runs, pattern):
        if seed not in seeds:
            continue
        loaded = load_checkpoint(path)
        states = loaded.states[:num_states].float()
        out.append(Family(f"{game}_relu_trained_s{seed}", "trained", loaded.model.eval(), states))
        torch.manual_seed(100 + seed)
        out.append(Family(f"{game}_relu_init_s{seed}", "init", network(**loaded.config).eval(), states))
        if seed == seeds[0]:
            torch.manual_seed(200 + seed)
            smooth = dict(loaded.config, activation="tanh" if game == "cartpole" else "silu")
            out.append(
                Family(f"{game}_{smooth['activation']}_init_s{seed}", "smooth", network(**smooth).eval(), states)
            )
    smooth_pattern = "smooth/CartPole-v1__dqn_cartpole_tanh__*" if game == "cartpole" else "smooth/*minatar_silu__*"
    for _, path in _checkpoints(runs, smooth_pattern)[:1]:
        loaded = load_checkpoint(path)
        name = f"{game}_{'tanh' if game == 'cartpole' else 'silu'}_trained"
        out.append(Family(name, "smooth", loaded.model.eval(), loaded.states[:num_states].float()))
    return out


def _grey_stacks(frames: torch.Tensor) -> torch.Tensor:
    """MinAtar frames ``(B, 4, 10, 10)`` -> 4x84x84 stacks: each frame grey, upscaled, repeated over the 4 slots."""
    grey = torch.einsum("bcij,c->bij", frames.float(), GREY).clamp(max=1.0)
    big = F.interpolate(grey.unsqueeze(1), size=(84, 84), mode="nearest")
    return big.expand(-1, 4, -1, -1).contiguous()


def _natures(runs: Path, minatar: list[Family], num_states: int) -> list[Family]:
    distilled = runs / "nature_distilled" / "nature_relu_distilled.pt"
    out = []
    if distilled.exists():
        saved = torch.load(distilled, weights_only=True)
        model = NatureQNetwork(in_channels=4, num_actions=3, noisy=False, activation="relu")
        model.load_state_dict(saved["state_dict"])
        states = saved["held_out"][:num_states].float()
        out.append(Family("nature_relu_trained", "trained", model.eval(), states))
    elif minatar:
        states = _grey_stacks(minatar[0].states[:num_states])
    else:
        return out
    torch.manual_seed(301)
    out.append(Family("nature_relu_init", "init", NatureQNetwork(in_channels=4, num_actions=3).eval(), states))
    return out


def families(runs: Path, quick: bool) -> list[Family]:
    seeds = (1,) if quick else (1, 2, 3)
    small = 32 if quick else 64
    cartpole = _agents(runs, "cartpole", seeds, small)
    minatar = _agents(runs, "minatar", seeds, 16 if quick else 64)
    nature = _natures(runs, [f for f in minatar if f.kind == "trained"], 2 if quick else 8)
    if quick:  # the smooth controls at init are enough to show the estimate's behaviour there
        minatar = [f for f in minatar if f.name != "minatar_silu_trained"]
    return cartpole + minatar + nature


# --------------------------------------------------------------------------------------------------
# measuring


def _reference(family: Family, exact_max_features: int, cache: Path | None) -> tuple[torch.Tensor, str, float]:
    started = time.perf_counter()
    path = None if cache is None else cache / f"{family.name}_{family.states.shape[0]}.pt"
    if path is not None and path.exists():
        return torch.load(path, weights_only=True), "cached", time.perf_counter() - started
    features = family.states[0].numel()
    if family.kind != "smooth" and features <= exact_max_features:
        ref = exact_line(family.model, family.states, target="mean")
    else:
        ref = midpoint_reference(
            family.model, family.states, target="mean", chunk_rows=8192 if features < 1000 else 512
        )
    attributions = ref.attributions.reshape(family.states.shape[0], -1).double().cpu()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(attributions, path)
    return attributions, ref.method, time.perf_counter() - started


def call_rule(family: Family, rule: tuple[str, str, int | str], device: torch.device, tol: float = TOL) -> Callable:
    """The engine call of ``rule`` (one of :data:`RULES`) on ``family``, ready to run (and time)."""
    _, method, steps = rule
    model, states = family.model.to(device), family.states.to(device)
    return lambda: integrated_gradients(
        model, states, target="mean", method=method, n_steps=steps, completeness_tol=tol
    )


def paired_ms(calls: dict[str, Callable], device: torch.device, repeats: int) -> dict[str, tuple[float, float]]:
    """Per call: the median milliseconds and the median ratio to :data:`TIME_RULE`'s time in the same round."""
    order, rng = list(calls), random.Random(0)
    for name in order:  # warm-up
        calls[name]()
    times: dict[str, list[float]] = {name: [] for name in order}
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            synchronize(device)
            started = time.perf_counter()
            calls[name]()
            synchronize(device)
            times[name].append((time.perf_counter() - started) * 1e3)
    reference = times[TIME_RULE]
    return {
        name: (statistics.median(t), statistics.median(a / b for a, b in zip(t, reference)))
        for name, t in times.items()
    }


def measure(family: Family, ref: torch.Tensor, rule: tuple[str, str, int | str], device: torch.device) -> Row:
    """``rule``'s accuracy figures on ``family`` against ``ref`` (``(B, F)`` float64 on the host); no time yet."""
    result = call_rule(family, rule, device)()
    per_state = result.n_steps_per_state  # n_steps="auto" only
    ours = result.attributions.detach().to("cpu", torch.float64).reshape(ref.shape)
    mass = ref.abs().sum(1)
    ordinary = mass >= 0.1 * mass.median()
    true = (ours - ref).abs().sum(1) / mass.clamp_min(torch.finfo(torch.float64).tiny)
    estimate = result.attribution_error.detach().to("cpu", torch.float64)
    ratios = (estimate / true)[ordinary]
    worst_index = int(torch.where(ordinary, true, torch.full_like(true, -1.0)).argmax())
    worst = float(true[worst_index])
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, TOL)
    if worst <= TOL:
        right = "right" if verdict.within is True else "wrong"
    elif worst > 2 * TOL:
        right = "right" if verdict.within is False else "wrong"
    else:
        right = "either"
    return Row(
        family=family.name,
        kind=family.kind,
        rule=rule[0],
        worst=worst,
        batch=float((ours - ref).abs().sum() / ref.abs().sum()),
        near=int((~ordinary).sum()),
        within_2x=float(((ratios >= 0.5) & (ratios <= 2.0)).double().mean()),
        worst_ratio=float(estimate[worst_index] / true[worst_index]),
        old_completeness=result.worst_relative_error,
        mass_relative=result.worst_mass_relative_error,
        within=verdict.within,
        verdict=right,
        ms=math.nan,
        ratios=ratios.tolist(),
        n_steps=result.n_steps,
        mean_nodes=float(result.n_steps if per_state is None else per_state.double().mean()),
        chosen=result.method,
    )


def _family_rows(family: Family, ref: torch.Tensor, device: torch.device, repeats: int) -> list[Row]:
    rows = [measure(family, ref, rule, device) for rule in RULES]
    calls = {rule[0]: call_rule(family, rule, device) for rule in RULES}
    timed = paired_ms(calls, device, repeats)
    for row in rows:
        row.ms, row.time_ratio = timed[row.rule]
    if family.kind != "smooth" and family.states[0].numel() < 1000:  # the bound's time: CartPole and MinAtar
        bound = paired_ms({TIME_RULE: calls[TIME_RULE], "bound": call_rule(family, RULES[-1], device, 1e-9)}, device, 3)
        rows[-1].bound_ms = bound["bound"][0]
    return rows


# --------------------------------------------------------------------------------------------------
# tables


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100 * value:.2f}%"


def _rule_text(r: Row) -> str:
    steps = "" if r.rule.endswith(f":{r.n_steps}") else f" ({r.n_steps})"
    chosen = f" ({r.chosen})" if r.rule in (DEFAULT_RULE, AUTO_RULE) else ""
    return f"{r.rule}{chosen}{steps}"


def _rows_table(rows: list[Row]) -> list[str]:
    lines = [
        (
            "| family | rule | true worst | batch | near | est. within 2x | worst-state ratio | |delta|/|dF| worst | "
            "mass-rel worst | verdict @1% | ms/call | x GL50 |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        within = {True: "within", False: "not within", None: "unchecked"}[r.within]
        lines.append(
            f"| {r.family} | {_rule_text(r)} | {_pct(r.worst)} | {_pct(r.batch)} | {r.near} | "
            f"{100 * r.within_2x:.0f}% | "
            f"{r.worst_ratio:.2f} | {_pct(r.old_completeness)} | {_pct(r.mass_relative)} | {within} ({r.verdict}) | "
            f"{r.ms:.2f} | {r.time_ratio:.2f}{'' if math.isnan(r.bound_ms) else f' (bound {r.bound_ms:.0f} ms)'} |"
        )
    return lines


def _targets_table(rows: list[Row], rule: str = DEFAULT_RULE) -> list[str]:
    default = [r for r in rows if r.rule == rule]
    over = [f"{r.family} {_pct(r.worst)}" for r in default if r.worst > (0.02 if r.kind == "init" else 0.01)]
    batch_over = [f"{r.family} {_pct(r.batch)}" for r in default if r.batch > 0.005]
    times = sorted(r.time_ratio for r in default)
    slow = [f"{r.family} {r.time_ratio:.2f}x" for r in default if r.time_ratio > 1.3]
    ratios = [ratio for r in default for ratio in r.ratios]
    share = sum(0.5 <= x <= 2.0 for x in ratios) / max(1, len(ratios))
    low_share = [f"{r.family} {100 * r.within_2x:.0f}%" for r in default if r.within_2x < 0.9]
    low = [f"{r.family} {r.worst_ratio:.2f}" for r in default if r.worst_ratio < 0.5]
    wrong = [f"{r.family} (true {_pct(r.worst)}, {r.within})" for r in default if r.verdict == "wrong"]

    def said(ok: bool, numbers: str) -> str:
        return f"{'met' if ok else 'NOT met'} | {numbers}"

    results = [
        said(not over, f"families over their bound: {', '.join(over) or 'none'}"),
        said(not batch_over, f"over 0.5%: {', '.join(batch_over) or 'none'}"),
        said(
            not slow,
            f"paired time over {TIME_RULE}: median {times[len(times) // 2]:.2f}x, max {times[-1]:.2f}x; over 1.3x: "
            f"{', '.join(slow) or 'none'}",
        ),
        said(
            share >= 0.9 and not low and not low_share,
            f"{100 * share:.0f}% of {len(ratios)} ordinary states within 2x; families under 90%: "
            f"{', '.join(low_share) or 'none'}; worst-state ratio < 0.5: {', '.join(low) or 'none'}",
        ),
        said(not wrong, f"wrong verdicts: {', '.join(wrong) or 'none'}"),
    ]
    lines = ["| target (issue 32) | met? | numbers (" + rule + ") |", "|---|---|---|"]
    lines += [f"| {target} | {result} |" for target, result in zip(TARGETS, results)]
    return lines


def _summary_table(rows: list[Row]) -> list[str]:
    """The short table printed last: per rule, over the ReLU families."""
    lines = ["| rule | worst true (trained / init) | worst batch | est. within 2x | wrong verdicts | x GL50 (median) |"]
    lines.append("|---|---|---|---|---|---|")
    for label, _, _ in RULES:
        mine = [r for r in rows if r.rule == label and r.kind != "smooth"]
        if not mine:
            continue
        trained = max((r.worst for r in mine if r.kind == "trained"), default=math.nan)
        init = max((r.worst for r in mine if r.kind == "init"), default=math.nan)
        ratios = [x for r in mine for x in r.ratios]
        share = sum(0.5 <= x <= 2.0 for x in ratios) / max(1, len(ratios))
        wrong = sum(r.verdict == "wrong" for r in rows if r.rule == label)
        times = sorted(r.time_ratio for r in mine)
        lines.append(
            f"| {label} | {_pct(trained)} / {_pct(init)} | {_pct(max(r.batch for r in mine))} | {100 * share:.0f}% | "
            f"{wrong} | {times[len(times) // 2]:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seed 1 only, fewer states (< 10 min on a 2-core CPU)")
    parser.add_argument("--device", default="cpu", help="where the engine runs (references run there too)")
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="the trained agents (see the docstring)")
    parser.add_argument("--exact-max-features", type=int, default=1000, help="exact line up to this many features")
    parser.add_argument("--repeats", type=int, default=21, help="timed rounds (every rule once per round)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--references", type=Path, default=None, help="cache the references in this folder")
    parser.add_argument("--output", type=Path, default=None, help="also write the tables to this file")
    parser.add_argument("--only", default="", help="only the families whose names start with this (e.g. cartpole)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    if not args.runs.is_dir():
        parser.error(f"--runs {str(args.runs)!r} is not a folder: give the folder the example agents were trained into")
    started = time.perf_counter()
    found = [family for family in families(args.runs, args.quick) if family.name.startswith(args.only)]
    if not found:
        parser.error(
            f"no agents under --runs {str(args.runs)!r} (CartPole-v1__dqn_cartpole__S__*/q_network.safetensors)"
        )
    mode = "quick" if args.quick else "full"
    header = [
        (
            f"# bench_trust: {device_name(device)}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"{mode} run, tol {TOL:g}"
        ),
        "",
        "| family | kind | states | features | reference | reference s |",
        "|---|---|---|---|---|---|",
    ]
    rows: list[Row] = []
    for family in found:
        family.model, family.states = family.model.to(device), family.states.to(device)
        ref, method, seconds = _reference(family, args.exact_max_features, args.references)
        header.append(
            f"| {family.name} | {family.kind} | {family.states.shape[0]} | {family.states[0].numel()} | {method} | "
            f"{seconds:.1f} |"
        )
        print(header[-1], file=sys.stderr, flush=True)
        rows += _family_rows(family, ref.cpu(), device, args.repeats)
    text = "\n".join(
        [
            *header,
            "",
            "## per family and rule (ordinary states; near = near the baseline, counted, not scored)",
            "",
            *_rows_table(rows),
            "",
            "## targets: the default call (method='auto', n_steps='budget')",
            "",
            *_targets_table(rows),
            "",
            f"total {time.perf_counter() - started:.0f} s",
            "",
            "## summary (ReLU families)",
            "",
            *_summary_table(rows),
        ]
    )
    print(text)
    write_output(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
