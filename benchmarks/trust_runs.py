"""The agents ``bench_trust.py`` reads from ``--runs``: trained by the examples, one Nature-CNN distilled, sequentially.

    PYTHONPATH=. python benchmarks/trust_runs.py [--runs .bench_runs] [--only distill]

Into ``--runs`` (about 20 MB; ``.bench_runs/`` is git-ignored), one process at a time, each step skipped when its
output is already there:

* ``examples/dqn_cartpole.py --activation relu --seed S`` and ``examples/dqn_minatar.py --activation relu --seed S``
  for S = 1, 2, 3 (``--no-ig``: training is bit-identical with and without the callback, and faster without);
* the smooth controls in ``smooth/``: ``dqn_cartpole.py --activation tanh --seed 1`` and
  ``dqn_minatar.py --activation silu --seed 1`` (experiment names ``dqn_cartpole_tanh``, ``dqn_minatar_silu``);
* ``nature_distilled/nature_relu_distilled.pt``: a ReLU Nature-CNN (no noise) trained to reproduce the seed-1 MinAtar
  agent's Q-values on 4096 frames of random play (seed 7), each drawn grey and upscaled to 4x84x84 as
  ``bench_trust`` draws them; saved with its ``state_dict``, the fit's held-out R^2 and, as ``held_out``, the grey
  stacks of the agent's own first 16 held-out frames.

On 2 CPU cores: about 4 minutes of CartPole, 30-40 of MinAtar (the examples on the CPU), 3 of distillation.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.bench_trust import _grey_stacks
from lightning_ig.checkpoint import load_checkpoint
from lightning_ig.models import NatureQNetwork

SEEDS = (1, 2, 3)
DISTILLED = Path("nature_distilled") / "nature_relu_distilled.pt"
_ROOT = Path(__file__).resolve().parent.parent


def _examples(runs: Path) -> list[tuple[str, list[str]]]:
    """(the folder pattern a finished run leaves, the example's command line) of every example run."""
    smooth, jobs = runs / "smooth", []
    for seed in SEEDS:
        jobs.append((runs / f"CartPole-v1__dqn_cartpole__{seed}__*", ["dqn_cartpole.py", "--activation", "relu"]))
        jobs[-1][1].extend(["--seed", str(seed), "--runs-dir", str(runs)])
    for seed in SEEDS:
        jobs.append((runs / f"MinAtar-breakout__dqn_minatar__{seed}__*", ["dqn_minatar.py", "--activation", "relu"]))
        jobs[-1][1].extend(["--seed", str(seed), "--runs-dir", str(runs), "--accelerator", "cpu"])
    tanh = ["dqn_cartpole.py", "--activation", "tanh", "--exp-name", "dqn_cartpole_tanh", "--seed", "1"]
    jobs.append((smooth / "CartPole-v1__dqn_cartpole_tanh__1__*", [*tanh, "--runs-dir", str(smooth)]))
    silu = ["dqn_minatar.py", "--activation", "silu", "--exp-name", "dqn_minatar_silu", "--seed", "1"]
    jobs.append((smooth / "MinAtar-breakout__dqn_minatar_silu__1__*", [*silu, "--runs-dir", str(smooth)]))
    jobs[-1][1].extend(["--accelerator", "cpu"])
    # training is bit-identical with and without the callback, and faster without it
    return [(str(pattern), [*command, "--no-ig", "--no-progress-bar"]) for pattern, command in jobs]


def _random_frames(count: int, seed: int) -> torch.Tensor:
    """``(count, 4, 10, 10)`` MinAtar Breakout frames from uniformly random play in 8 games."""
    from minatar import Environment  # an optional dependency, as in the example

    rng = np.random.default_rng(seed)
    games = [Environment("breakout") for _ in range(8)]
    frames = []
    for index, game in enumerate(games):
        game.seed(seed + index)
        game.reset()
    actions = games[0].minimal_action_set()
    while len(frames) < count:
        for game in games:
            _, terminal = game.act(actions[rng.integers(len(actions))])
            if terminal:
                game.reset()
            frames.append(game.state().transpose(2, 0, 1).copy())
    return torch.from_numpy(np.stack(frames[:count])).float()


def distill(runs: Path, epochs: int = 12) -> Path:
    """Train the ReLU Nature-CNN on the seed-1 MinAtar agent's Q-values (see the module docstring)."""
    [teacher_path] = sorted(glob.glob(str(runs / "MinAtar-breakout__dqn_minatar__1__*" / "q_network.safetensors")))[:1]
    teacher = load_checkpoint(teacher_path)
    torch.manual_seed(0)
    frames = _random_frames(4096, seed=7)
    with torch.no_grad():
        targets = teacher.model.eval()(frames)  # (N, 3) Q-values
    stacks = _grey_stacks(frames)
    student = NatureQNetwork(in_channels=4, num_actions=3, noisy=False, activation="relu")
    optimiser = torch.optim.Adam(student.parameters(), lr=2.5e-4)
    train, test = slice(0, 3584), slice(3584, None)
    for _ in range(epochs):
        order = torch.randperm(3584)
        for first in range(0, 3584, 64):
            rows = order[first : first + 64]
            loss = F.mse_loss(student(stacks[train][rows]), targets[train][rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        value, predicted = targets[test].mean(1), student.eval()(stacks[test]).mean(1)
        r2 = float(1 - (predicted - value).pow(2).mean() / value.var())
    path = runs / DISTILLED
    path.parent.mkdir(parents=True, exist_ok=True)
    held_out = _grey_stacks(teacher.states[:16].float())
    torch.save({"state_dict": student.state_dict(), "held_out": held_out, "r2": r2}, path)
    print(f"distilled: V(s) R^2 {r2:.3f} on 512 frames it did not see -> {path}", flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path(".bench_runs"), help="where the runs go")
    parser.add_argument("--only", choices=("examples", "distill"), default=None, help="one part only")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    if args.only != "distill":
        for pattern, command in _examples(args.runs):
            if glob.glob(str(Path(pattern) / "q_network.safetensors")):
                continue
            started = time.perf_counter()
            subprocess.run([sys.executable, str(_ROOT / "examples" / command[0]), *command[1:]], env=env, check=True)
            print(f"{' '.join(command)}: {time.perf_counter() - started:.0f} s", flush=True)
    if args.only != "examples" and not (args.runs / DISTILLED).exists():
        distill(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
