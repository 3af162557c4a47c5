"""Dueling NoisyNet DQN on a MinAtar game from pixels, on a GPU if there is one, watched by Integrated Gradients.

MinAtar (Young & Tian, 2019; the `minatar` package, GPL-3.0-or-later, imported as a
separate optional package) shows a 10x10 frame with one channel per object:
Breakout's are paddle, ball, trail (where the ball was) and brick. While the
agent learns, lightning-ig's IntegratedGradientsCallback attributes V(s) (the
mean of the dueling Q-values) to every pixel of held-out frames with the
NoisyNet noise off, sums the attributions per channel (so TensorBoard shows how
much the value looks at the ball, the paddle, the bricks) and draws saliency
grids of the frames. An auxiliary head learns a +/-1 label (does a reward come
within the next n steps?) with a soft-margin loss. At the end the network and
the held-out frames go to a safetensors checkpoint that
`lightning-ig diag --states auto` reads.

TensorBoard is the default logger; ``--logger wandb`` or ``--logger mlflow`` sends the same scalars, pictures
and feature table to Weights & Biases or MLflow instead (and the JSON report, which W&B keeps in the run's files
and MLflow as an artifact).

Made for a GPU: several games stepped as one batch, the replay buffer and the
n-step targets on the device, and one transfer to the host per vector step
(the actions). Runs on a CPU too, more slowly.

Run (after the README's set-up, which installs into .venv without activating it)::

    .venv/bin/python examples/dqn_minatar.py                  # a GPU: a few minutes; 2 CPU cores: 4-10 minutes
    .venv/bin/python examples/dqn_minatar.py --total-timesteps 8000 --accelerator cpu   # a smoke run
    .venv/bin/tensorboard --logdir runs                       # Scalars: filter ig/group; Images: ig/2_saliency
    .venv/bin/python examples/dqn_minatar.py --ig-target each # every action's Q too: ig/3_actions, ig/action/...
    WANDB_MODE=offline .venv/bin/python examples/dqn_minatar.py --logger wandb   # W&B, on disk: `wandb sync` later
    .venv/bin/python examples/dqn_minatar.py --logger mlflow  # MLflow: a file store in runs/<run>/mlruns
    .venv/bin/lightning-ig diag --checkpoint runs/<run>/q_network.safetensors --states auto \
        --feature-groups runs/<run>/channel_groups.json --saliency runs/<run>/saliency
"""

from __future__ import annotations

# ruff: noqa: E402 - the heavy imports follow the command line: `--help` answers before torch and Lightning load
import argparse
import importlib.util
import json
import logging
import math
import os
import shlex
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse


def make_ig_callback(
    args: argparse.Namespace, held_out: Tensor, channels: list[str], actions: list[str]
) -> IntegratedGradientsCallback:
    """What lightning-ig adds to training: IG of V(s) on held-out frames, per channel, logged to ``--logger``."""
    return IntegratedGradientsCallback(
        held_out,  # (num_held_out, C, 10, 10), never trained on
        every_n_steps=args.ig_every_n_steps,
        target=args.ig_target,  # "mean": V(s), the mean of the dueling Q-values; "each", "contrast": per action
        feature_groups="channels",  # one group per object: the attributions of its pixels summed
        group_names=channels,
        feature_names=pixel_names(channels, held_out.shape[2:]),  # the JSON reports name pixels as the checkpoint does
        action_names=None if args.ig_target == "mean" else actions,  # the panels of ig/3_actions, the pair of contrast
        engine=IGOptions(n_steps=args.ig_n_steps),
        overhead=args.ig_overhead,
        views=ViewOptions(top_k=len(channels)),  # every channel in the text's table; ig/2_saliency: 5 held-out frames
    )


def pixel_names(channels: Sequence[str], frame: Sequence[int]) -> list[str]:
    """``<channel>[row,column]`` per feature, in the frames' (C, H, W) order."""
    return [f"{name}[{row},{column}]" for name in channels for row in range(frame[0]) for column in range(frame[1])]


#: MinAtar's action letters (its games' ``action_map``), as the pictures of ``--ig-target each|contrast`` name them.
ACTION_NAMES = {"n": "no-op", "l": "left", "u": "up", "r": "right", "d": "down", "f": "fire"}


def print_overhead(trainer: Any) -> None:
    """The closing line of the IG callback's cost: its share of the fit's wall time at its last run (ig/overhead)."""
    ig = next((c for c in trainer.callbacks if isinstance(c, IntegratedGradientsCallback)), None)
    if ig is not None and ig.history:
        share, budget = ig.history[-1]["overhead"], "none" if ig.overhead is None else f"{ig.overhead:.0%}"
        runs = f"{len(ig.history)} run{'s' * (len(ig.history) > 1)}"
        print(f"IG overhead         {share:.1%} of the fit's wall time (budget {budget}), {runs}")


#: Games played side by side for the held-out frames (seeded ``--seed + 2000 + i``).
HELD_OUT_GAMES = 8

#: The loggers --logger offers, and the package each needs.
LOGGER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def overhead_arg(text: str) -> float | None:
    """``--ig-overhead``: a share in (0, 1], or ``none``."""
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")  # not a number: the message below, not argparse's "invalid overhead_arg value"
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] or 'none', got {text}")
    return value


def finite_float(text: str) -> float:
    """An argparse ``type``: a float that is a number (``nan`` and ``inf`` are refused, the message names them)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


finite_float.__name__ = "float"  # argparse names it in "invalid float value"


def at_least(minimum: float, kind: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse ``type`` that rejects values below ``minimum`` and, for floats, ``nan`` and ``inf`` (which no
    comparison refuses: ``nan < 0`` is False); the message names the value."""

    def parse(text: str) -> Any:
        value = kind(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum}, got {text}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


#: What ``--seed`` takes: Lightning's ``seed_everything`` and numpy take seeds in [0, 2**32 - 1].
MAX_SEED = 2**32 - 1


def seed_arg(text: str) -> int:
    """``--seed``: a whole number in [0, 2**32 - 1]."""
    value = int(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_SEED}], got {text}")
    return value


seed_arg.__name__ = "int"  # argparse names it in "invalid int value"


def name_arg(text: str) -> str:
    """``--exp-name``: part of the run folder's name, so no path separator (nor a NUL, which no path holds)."""
    if any(character in text for character in {"/", os.sep, os.altsep or "/", "\0"}):
        raise argparse.ArgumentTypeError(f"must not contain a path separator ('/') or a NUL character, got {text!r}")
    return text


def n_steps_arg(text: str) -> int | str:
    """``--ig-n-steps``: what the library's ``n_steps`` takes: a whole number >= 1, ``budget`` or ``auto``;
    a number as the library checks it (``IGOptions``), here rather than when the callback is built."""
    if text in ("auto", "budget"):
        return text
    try:
        value = int(text)
    except ValueError:  # "lots"; "²" too, which str.isdigit() calls a digit
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, 'budget' or 'auto', got {text!r}")
    from lightning_ig.attribution import IGOptions  # noqa: PLC0415 - only for a number: --help loads no torch

    try:
        IGOptions(n_steps=value)
    except (ValueError, TypeError) as error:  # a count past what the rule or this machine's memory takes
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: ...)`` after each flag's help, except where there is no default to show (``None``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def command(name: str) -> str | None:
    """How to run the script ``name`` from here, as this interpreter installed it (``.venv/bin/lightning-ig``
    after the README's commands, which never activate the venv); ``None`` where it installed none."""
    script = Path(sys.executable).parent / name
    if not script.exists():
        return None
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") and os.sep in relative else str(script)


def lightning_ig_command() -> str:
    """``lightning-ig`` as installed here, or through ``-m`` where no script was installed; shell-quoted."""
    script = command("lightning-ig")
    return shlex.quote(script) if script else f"{shlex.quote(sys.executable)} -m lightning_ig.cli"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; a bad flag or value exits with status 2 and a message, before anything runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add = parser.add_argument
    add(
        "--exp-name",
        type=name_arg,
        default=Path(__file__).stem,
        help="the name of this experiment (part of the run folder's name)",
    )
    add("--seed", type=seed_arg, default=1, help="seed of the network, the noise, replay sampling and the games")
    add(
        "--game",
        default="breakout",
        choices=("breakout", "asterix", "freeway", "seaquest", "space_invaders"),
        help="the MinAtar game (the defaults are tuned on breakout)",
    )
    add(
        "--accelerator",
        choices=("cpu", "gpu", "auto"),
        default="auto",
        help="where the network trains (auto: a GPU if there is one)",
    )
    add("--num-threads", type=at_least(1), default=1, help="torch CPU threads; 1 is fastest for this small network")
    add("--runs-dir", default="runs", help="parent folder of the run folder (the logs, the checkpoint)")
    add("--progress-bar", action=argparse.BooleanOptionalAction, default=True, help="show Lightning's progress bar")
    # logging
    add(
        "--logger",
        choices=tuple(LOGGER_PACKAGES),
        default="tensorboard",
        help="where the scalars, the IG pictures and the feature table go: TensorBoard (runs/<run>); Weights & "
        "Biases (pip install 'lightning-ig[wandb]'; `wandb login` first, or WANDB_MODE=offline to keep the run on "
        "disk in runs/<run>/wandb for a later `wandb sync`); MLflow (pip install 'lightning-ig[mlflow]')",
    )
    add("--wandb-project", default="lightning-ig", help="the W&B project of the run (--logger wandb)")
    add(
        "--mlflow-tracking-uri",
        default=None,
        help="the MLflow tracking server or store (--logger mlflow); default: a file store in runs/<run>/mlruns",
    )
    # DQN
    add(
        "--total-timesteps",
        type=at_least(1),
        default=400_000,
        help="environment steps over all games, warm-up included",
    )
    add("--num-envs", type=at_least(1), default=16, help="games stepped as one batch; one gradient step per batch step")
    add("--learning-starts", type=at_least(0), default=5_000, help="random-action environment steps before learning")
    add("--buffer-size", type=at_least(1), default=200_000, help="replay buffer capacity (environment steps)")
    add("--batch-size", type=at_least(1), default=128, help="transitions per gradient step")
    add("--learning-rate", type=finite_float, default=5e-4, help="Adam's initial learning rate")
    add(
        "--anneal-lr", action=argparse.BooleanOptionalAction, default=True, help="decay the learning rate linearly to 0"
    )
    add("--gamma", type=finite_float, default=0.99, help="discount factor, in (0, 1]")
    add("--n-step", type=at_least(1), default=3, help="rewards summed over this many steps before bootstrapping")
    add("--target-network-frequency", type=at_least(1), default=500, help="gradient steps between target updates")
    add("--max-grad-norm", type=at_least(0.0, float), default=10.0, help="clip gradients to this norm (0: no clipping)")
    add("--hidden-size", type=at_least(1), default=128, help="units of the hidden layer after the convolution")
    add(
        "--activation",
        choices=("relu", "tanh", "softplus", "silu", "gelu"),
        default="relu",
        help="the network's activation; ReLU (the default) is MinAtar's and the Nature network's own. Its kinks "
        "make IG's attribution error (the 'IG verdict' line) larger at --ig-n-steps points than a smooth one's; "
        "the callback's checks say so",
    )
    add("--sigma0", type=at_least(0.0, float), default=0.5, help="NoisyNet's initial noise scale (the exploration)")
    # auxiliary head
    add("--aux-coef", type=at_least(0.0, float), default=0.1, help="weight of the auxiliary soft-margin loss")
    add(
        "--fused-loss",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lightning-ig's fused soft-margin loss (CUDA kernel, torch twin on the CPU) or torch's; "
        "default: fused on a GPU",
    )
    # Integrated Gradients
    add("--ig", action=argparse.BooleanOptionalAction, default=True, help="run the IntegratedGradientsCallback")
    add(
        "--num-held-out",
        type=at_least(1),
        default=64,
        help="held-out frames for IG, from random play, never trained on",
    )
    add("--ig-every-n-steps", type=at_least(1), default=1_000, help="gradient steps between IG runs")
    add(
        "--ig-overhead",
        type=overhead_arg,
        default=0.02,
        help="the IG callback's budget, a share of the fit's wall time; 'none': every run in full, no trust checks",
    )
    add(
        "--ig-n-steps",
        type=n_steps_arg,
        default="budget",
        help="quadrature points along the IG path: 'budget' (the library's default: from the work's size; on a CPU "
        "the states above tolerance are refined), 'auto' (refined per state until within the tolerance) or "
        "a number",
    )
    add(
        "--ig-target",
        choices=("mean", "each", "contrast"),
        default="mean",
        help="what IG attributes: mean, V(s) (the mean of the Q-values); each, every action's Q(s, a) in one "
        "batched call (adds ig/3_actions, 'What favours each action'); contrast, per frame the greedy action's Q "
        "minus the runner-up's ('Why right rather than no-op')",
    )
    # evaluation
    add("--eval-episodes", type=at_least(1), default=10, help="greedy evaluation episodes (noise off) at the end")
    add(
        "--random-episodes",
        type=at_least(1),
        default=100,
        help="episodes of the uniformly random policy, for comparison",
    )
    add("--eval-max-steps", type=at_least(1), default=10_000, help="an evaluation episode stops after this many steps")
    args = parser.parse_args(argv)
    package = LOGGER_PACKAGES[args.logger]
    if importlib.util.find_spec(package) is None:
        parser.error(f"--logger {args.logger} needs the {package} package: pip install 'lightning-ig[{package}]'")
    if args.logger == "mlflow" and ("'" in args.exp_name or not args.exp_name):  # MLflow's search refuses them
        parser.error(
            f"--logger mlflow takes no empty --exp-name nor one with a single quote ('), got {args.exp_name!r}"
        )
    if args.learning_starts >= args.total_timesteps:
        parser.error(
            f"--learning-starts must be in [0, --total-timesteps), got {args.learning_starts} with "
            f"--total-timesteps {args.total_timesteps}; lower it or train longer"
        )
    # the warm-up's vector steps must leave a step with --n-step later ones stored: the replay's first sample
    smallest_start = args.num_envs * args.n_step + 1
    if args.learning_starts < smallest_start:
        parser.error(
            f"--learning-starts must be at least {smallest_start} with --num-envs {args.num_envs} and --n-step "
            f"{args.n_step} (the random steps must fill the replay buffer before the first gradient step), "
            f"got {args.learning_starts}"
        )
    # each game of the run, the held-out and the evaluation games get a numpy seed: --seed plus up to this
    offset = max(
        args.num_envs - 1, 2_000 + HELD_OUT_GAMES - 1, 1_000 + max(args.eval_episodes, args.random_episodes) - 1
    )
    if args.seed > MAX_SEED - offset:
        parser.error(
            f"--seed must be in [0, {MAX_SEED - offset}] with these settings (the games are seeded with --seed plus "
            f"up to {offset}, and numpy takes seeds up to {MAX_SEED}), got {args.seed}"
        )
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    if not 0 < args.gamma <= 1:
        parser.error(f"--gamma must be in (0, 1], got {args.gamma}")
    if args.buffer_size < 2 * args.num_envs * (args.n_step + 1):
        parser.error(
            f"--buffer-size {args.buffer_size} is too small for --num-envs {args.num_envs}: "
            f"use at least {2 * args.num_envs * (args.n_step + 1)}"
        )
    return args


if __name__ == "__main__":
    parse_args()  # --help and a mistyped flag answer here, before torch, Lightning and the games are imported

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from minatar import Environment
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_ig import (
    IntegratedGradientsCallback,
    integrated_gradients,
    noise_disabled,
    save_checkpoint,
    soft_margin_loss,
)
from lightning_ig.attribution import IGOptions
from lightning_ig.cli.parser import AUTO_SAMPLES
from lightning_ig.models import MinAtarQNetwork
from lightning_ig.views import ViewOptions, feature_statistics
from lightning_ig.views.text import verdict_words


class MinAtarVectorEnv:
    """``num_envs`` MinAtar games stepped together; finished games restart at once.

    Observations are one ``(num_envs, C, 10, 10)`` uint8 array (channels first),
    rewards and terminals one ``(2, num_envs)`` float32 array, both rewritten in
    place by every step: two host-to-device copies per vector step.
    """

    def __init__(self, game: str, num_envs: int, seed: int) -> None:
        self.games = [Environment(game) for _ in range(num_envs)]
        for index, env in enumerate(self.games):
            env.seed(seed + index)
        self.action_set = self.games[0].minimal_action_set()  # Breakout: no-op, left, right
        self.action_names = [ACTION_NAMES[self.games[0].env.action_map[action]] for action in self.action_set]
        channels = self.games[0].env.channels  # name -> index
        self.channel_names = sorted(channels, key=channels.get)
        self.observations = np.zeros((num_envs, len(self.channel_names), 10, 10), dtype=np.uint8)
        self.rewards_terminals = np.zeros((2, num_envs), dtype=np.float32)

    def reset(self) -> np.ndarray:
        for index, env in enumerate(self.games):
            env.reset()
            self.observations[index] = env.state().transpose(2, 0, 1)
        return self.observations

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Play ``actions`` (indices into the minimal action set); returns the observations and
        ``(rewards, terminals)``, a ``(2, num_envs)`` array."""
        for index, (env, action) in enumerate(zip(self.games, actions)):
            reward, terminal = env.act(self.action_set[action])
            self.rewards_terminals[:, index] = reward, terminal
            if terminal:
                env.reset()
            self.observations[index] = env.state().transpose(2, 0, 1)
        return self.observations, self.rewards_terminals


def collect_held_out_states(game: str, num_states: int, seed: int) -> Tensor:
    """``(num_states, C, 10, 10)`` float frames from uniformly random play in games of their own.

    Drawn from a pool of four times as many distinct frames, so that the frames (and the saliency grid) are not
    the first steps of a few games side by side, nor one frame several times (every game starts from the same
    frame, and a game's frames repeat after a reset): a repeated state would weigh the means toward it.
    """
    envs, rng = MinAtarVectorEnv(game, HELD_OUT_GAMES, seed), np.random.default_rng(seed)
    frames = [envs.reset().copy()]
    pool = np.unique(frames[0], axis=0)
    for _ in range(64 * num_states):  # a game of few distinct frames stops here
        if len(pool) >= 4 * num_states:
            break
        frames.append(envs.step(rng.integers(len(envs.action_set), size=HELD_OUT_GAMES))[0].copy())  # (8, C, 10, 10)
        pool = np.unique(np.concatenate(frames), axis=0)
    return torch.from_numpy(pool[rng.choice(len(pool), num_states, replace=len(pool) < num_states)]).float()


class ReplayBuffer(IterableDataset):
    """Per-step observations, actions, rewards and terminals of every game in device tensors, a ring in time.

    n-step returns are computed at sampling time on the device, so adding a
    step is four copies and sampling needs nothing from the host. Iterating
    yields sampled batches forever.
    """

    def __init__(self, args: argparse.Namespace, frame_shape: Sequence[int], device: torch.device) -> None:
        self.capacity, self.num_envs = max(args.buffer_size // args.num_envs, args.n_step + 2), args.num_envs
        self.batch_size, self.n_step, self.size, self.next = args.batch_size, args.n_step, 0, 0
        steps = (self.capacity, self.num_envs)
        self.observations = torch.zeros(*steps, *frame_shape, dtype=torch.uint8, device=device)
        self.actions = torch.zeros(steps, dtype=torch.long, device=device)
        self.rewards = torch.zeros(steps, device=device)
        self.terminals = torch.zeros(steps, device=device)
        self.gamma_powers = args.gamma ** torch.arange(args.n_step + 1, device=device, dtype=torch.float32)
        self.offsets = torch.arange(args.n_step, device=device)
        self.generator = torch.Generator(device=device).manual_seed(args.seed)

    def add(self, observations: Tensor, actions: Tensor, rewards: Tensor, terminals: Tensor) -> None:
        """One vector step: what each game saw, did and got (a terminal game's next frame is a new game)."""
        for store, value in (
            (self.observations, observations),
            (self.actions, actions),
            (self.rewards, rewards),
            (self.terminals, terminals),
        ):
            store[self.next].copy_(value)
        self.next = (self.next + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self) -> tuple[Tensor, ...]:
        device = self.rewards.device
        # start steps with n later steps stored: the oldest size - n of the ring
        age = torch.randint(self.size - self.n_step, (self.batch_size,), device=device, generator=self.generator)
        start = (self.next - self.size + age) % self.capacity  # (B,)
        game = torch.randint(self.num_envs, (self.batch_size,), device=device, generator=self.generator)
        steps = (start[:, None] + self.offsets) % self.capacity  # (B, n)
        rewards, terminals = self.rewards[steps, game[:, None]], self.terminals[steps, game[:, None]]  # (B, n)
        alive = torch.cumprod(1.0 - terminals, dim=1)  # the game still runs after step k
        alive_before = torch.cat([torch.ones_like(alive[:, :1]), alive[:, :-1]], dim=1)
        returns = (rewards * alive_before * self.gamma_powers[:-1]).sum(dim=1)
        discounts = self.gamma_powers[-1] * alive[:, -1]  # 0 where the game ended within the n steps
        next_observations = self.observations[(start + self.n_step) % self.capacity, game]
        reward_soon = torch.where((rewards * alive_before).sum(dim=1) > 0, 1.0, -1.0)  # the auxiliary label
        observations, actions = self.observations[start, game], self.actions[start, game]
        return observations, actions, returns, next_observations, discounts, reward_soon

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        while True:
            yield self.sample()


class DQNAgent(L.LightningModule):
    """Double DQN, dueling NoisyNet CNN, n-step returns, an auxiliary soft-margin head.

    Every training step plays one step of every game with the current (noisy)
    network, then takes one gradient step on a replay batch.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.envs = MinAtarVectorEnv(args.game, args.num_envs, args.seed)
        channels, num_actions = len(self.envs.channel_names), len(self.envs.action_set)
        config = {
            "in_channels": channels,
            "num_actions": num_actions,
            "hidden_size": args.hidden_size,
            "sigma0": args.sigma0,
            "activation": args.activation,
        }
        self.q_network = MinAtarQNetwork(**config)
        self.target_network = MinAtarQNetwork(**config).requires_grad_(False)
        self.target_network.load_state_dict(self.q_network.state_dict())
        width = self.q_network.features(torch.zeros(1, channels, 10, 10)).shape[1]
        self.aux_head = nn.Linear(width, 1)  # logit of "does a reward come within the next n steps?"
        self.use_fused_loss = bool(args.fused_loss)
        self.episode_returns = np.zeros(args.num_envs)
        self.env_steps, self.warm_up_env_steps, self.train_started = 0, 0, 0.0

    def forward(self, x: Tensor) -> Tensor:
        return self.q_network(x)  # (N, C, 10, 10) -> (N, A) Q-values; their mean is V(s)

    def on_fit_start(self) -> None:  # not setup(): Lightning moves the model to its device between the two
        if self.args.fused_loss is None:
            self.use_fused_loss = self.device.type == "cuda"
        self.noise_generator = torch.Generator(device=self.device).manual_seed(self.args.seed + 1)
        self.buffer = ReplayBuffer(self.args, self.envs.observations.shape[1:], self.device)
        self.observations = torch.from_numpy(self.envs.reset()).to(self.device, copy=True)
        random_actions = np.random.default_rng(self.args.seed)
        while self.env_steps < self.args.learning_starts:
            self.play_step(random_actions.integers(len(self.envs.action_set), size=self.args.num_envs))
        self.warm_up_env_steps, self.train_started = self.env_steps, time.perf_counter()
        self.trained_on = self.device  # Lightning moves the module back to the CPU when fit ends

    @torch.no_grad()
    def play_step(self, actions: np.ndarray | None = None) -> None:
        """One step of every game (the noisy network's choice unless ``actions`` are given) into the buffer."""
        if actions is None:
            device_actions = self.q_network(self.observations.float()).argmax(dim=1)
            actions = device_actions.cpu().numpy()  # the one host transfer per vector step: the games need it
        else:
            device_actions = torch.from_numpy(actions).to(self.device)
        next_observations, rewards_terminals = self.envs.step(actions)
        # copies (copy=True: the arrays are rewritten by the next step, and .to("cpu") would not copy)
        device_rewards, device_terminals = torch.from_numpy(rewards_terminals).to(self.device, copy=True)
        self.buffer.add(self.observations, device_actions, device_rewards, device_terminals)
        self.observations = torch.from_numpy(next_observations).to(self.device, copy=True)
        self.env_steps += self.args.num_envs
        self.episode_returns += rewards_terminals[0]
        for game in np.flatnonzero(rewards_terminals[1]):
            for logger in self.loggers:
                logger.log_metrics({"charts/episodic_return": self.episode_returns[game]}, step=self.global_step)
            self.episode_returns[game] = 0.0

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        self.play_step()
        # Fresh noise for this update and the acting that follows it (Fortunato et al.).
        self.q_network.reset_noise(self.noise_generator)
        self.target_network.reset_noise(self.noise_generator)

        observations, actions, returns, next_observations, discounts, reward_soon = batch
        observations, next_observations = observations.float(), next_observations.float()  # (B, C, 10, 10)
        q_both = self.q_network(torch.cat([observations, next_observations]))  # (2B, A): one forward for both ends
        q_values, next_q_online = q_both[: len(actions)], q_both[len(actions) :].detach()
        with torch.no_grad():  # Double DQN: the online network picks the next action, the target network values it
            next_q = self.target_network(next_observations).gather(1, next_q_online.argmax(dim=1, keepdim=True))
            td_target = returns + discounts * next_q.squeeze(1)
        q_taken = q_values.gather(1, actions.unsqueeze(1)).squeeze(1)
        td_loss = F.smooth_l1_loss(q_taken, td_target)
        logits = self.aux_head(self.q_network.features(observations)).squeeze(1)
        soft_margin = soft_margin_loss if self.use_fused_loss else F.soft_margin_loss
        aux_loss = soft_margin(logits, reward_soon)

        if self.global_step % self.args.target_network_frequency == 0:
            self.target_network.load_state_dict(self.q_network.state_dict())
        if self.global_step % 500 == 0:  # .item() waits for the device: only now and then
            metrics = {
                "losses/td_loss": td_loss.item(),
                "losses/aux_soft_margin": aux_loss.item(),
                "losses/q_values": q_taken.mean().item(),
                "charts/env_steps": float(self.env_steps),
                "charts/learning_rate": self.optimizers().param_groups[0]["lr"],
            }
            for logger in self.loggers:
                logger.log_metrics(metrics, step=self.global_step)
        return td_loss + self.args.aux_coef * aux_loss

    def configure_optimizers(self) -> Any:
        parameters = [p for p in self.parameters() if p.requires_grad]
        try:  # fused: one kernel for all parameters
            optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate, fused=True)
        except RuntimeError:  # torch < 2.4 has no fused CPU Adam
            optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate)
        if not self.args.anneal_lr:
            return optimizer
        total = max(self.trainer.max_steps, 1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(1.0 - step / total, 0.0))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.buffer, batch_size=None)  # the buffer yields whole batches, already on the device


def evaluate(
    policy: Callable[[Tensor], np.ndarray], args: argparse.Namespace, episodes: int, device: torch.device
) -> np.ndarray:
    """Returns of ``episodes`` games played side by side until each ends; game ``i`` is seeded ``seed + 1000 + i``."""
    envs = MinAtarVectorEnv(args.game, episodes, args.seed + 1_000)
    observations, returns, running = envs.reset(), np.zeros(episodes), np.ones(episodes, dtype=bool)
    for _ in range(args.eval_max_steps):
        observations, (rewards, terminals) = envs.step(policy(torch.from_numpy(observations).to(device).float()))
        returns += rewards * running
        running &= terminals == 0
        if not running.any():
            break
    return returns


def make_logger(args: argparse.Namespace, run_name: str, run_dir: Path) -> Logger:
    """The logger ``--logger`` names, its run in ``run_dir``. The IG callback draws its pictures for each of the
    three: TensorBoard's images, W&B's ``log_image`` (and a table), MLflow's image artifacts (and a JSON report)."""
    if args.logger == "wandb":  # WANDB_MODE=offline: the run stays in run_dir/wandb, no network needed
        import wandb  # noqa: PLC0415 - only for --logger wandb

        # W&B warns on every run that the `anonymous` setting Lightning's WandbLogger passes has no effect: not the
        # user's concern. Its warnings are off for this script's run (its errors still show).
        wandb.setup(settings=wandb.Settings(show_warnings=False))
        logger = WandbLogger(project=args.wandb_project, name=run_name, save_dir=str(run_dir))
        try:  # the W&B run starts here: without `wandb login` (or the network) wandb's error, a traceback, was all
            logger.experiment  # noqa: B018 - the property starts the run
        except wandb.errors.Error as error:
            error_exit(
                f"--logger wandb cannot start the W&B run ({error}); run `wandb login` first, or set "
                f"WANDB_MODE=offline to keep the run on disk in {run_dir / 'wandb'} for a later `wandb sync`"
            )
    elif args.logger == "mlflow":
        uri = mlflow_tracking_uri(args, run_dir)
        if uri.startswith("file:"):  # MLflow 3 keeps its file store behind this switch (databases need nothing)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient  # noqa: PLC0415 - only for --logger mlflow
        from mlflow.exceptions import MlflowException, RestException  # noqa: PLC0415

        if not uri.startswith("file:"):  # MLflow retries a server that does not answer for minutes, without a word
            print(f"connecting to the MLflow tracking server {uri} ...", file=sys.stderr, flush=True)
        # Lightning's logger makes a missing experiment itself, with a warning that it was "not found" (a fresh store
        # is every run's here): made beforehand, the run starts without it
        client = MlflowClient(tracking_uri=uri)
        try:
            if client.get_experiment_by_name(args.exp_name) is None:
                client.create_experiment(args.exp_name)
        except MlflowException as error:
            # a server that answered (a login, a permission: not "start the server"), or a store on this machine
            if isinstance(error, RestException) or not uri.startswith(("http:", "https:")):
                error_exit(f"--mlflow-tracking-uri {uri}: MLflow refused ({error})")
            error_exit(
                f"--mlflow-tracking-uri {uri}: MLflow cannot reach it ({error}); start the server or name a reachable "
                "one (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 fails at once instead of retrying)"
            )
        logger = MLFlowLogger(experiment_name=args.exp_name, run_name=run_name, tracking_uri=uri)
    else:
        logger = TensorBoardLogger(save_dir=run_dir.parent, name=run_name, version="", default_hp_metric=False)
        table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        logger.experiment.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        return logger
    logger.log_hyperparams(vars(args))
    return logger


def mlflow_tracking_uri(args: argparse.Namespace, run_dir: Path) -> str:
    """``--mlflow-tracking-uri``, or a file store in the run folder; a plain path (``./mlruns``) as the file URI
    MLflow reads it as, so that it is opened as a file store (``MLFLOW_ALLOW_FILE_STORE``) and named in full."""
    uri = args.mlflow_tracking_uri
    if uri and not urlparse(uri).scheme and not uri.startswith("databricks"):  # "databricks": its workspace
        return Path(uri).resolve().as_uri()
    return uri or (run_dir / "mlruns").resolve().as_uri()


def close_logger(logger: Logger, args: argparse.Namespace, run_dir: Path) -> str:
    """Ends the logger's run; returns how to look at it (a command, its paths shell-quoted)."""
    logger.finalize("success")
    if isinstance(logger, WandbLogger):
        run = logger.experiment
        wandb_command = shlex.quote(command("wandb") or "wandb")
        where = f"{wandb_command} sync {shlex.quote(str(Path(run.dir).parent))}" if run.offline else str(run.url)
        run.finish()  # the run's files written out (offline: the .wandb file that `wandb sync` uploads)
        return where
    if isinstance(logger, MLFlowLogger):  # `mlflow ui` is the full mlflow package's
        uri = mlflow_tracking_uri(args, run_dir)
        if not uri.startswith("file:"):
            return f"{uri} (run {logger.run_id})"
        mlflow_command = shlex.quote(command("mlflow") or "mlflow")
        return f"MLFLOW_ALLOW_FILE_STORE=true {mlflow_command} ui --backend-store-uri {shlex.quote(uri)}"
    return f"{shlex.quote(command('tensorboard') or 'tensorboard')} --logdir {shlex.quote(args.runs_dir)}"


def diag_command(
    checkpoint: Path | str,
    num_states: int,
    groups_file: Path | str,
    saliency: Path | str,
    output: Path | str,
    target: str = "mean",
    n_steps: int | str = "auto",
    device: str = "cpu",
) -> str:
    """The ``lightning-ig diag`` line that reads the checkpoint and its ``num_states`` stored frames, shell-quoted;
    with ``--auto-samples`` where more or fewer are stored than diag samples unless told (all of them: the report's
    figures are then the closing lines' and the last run's), and the run's ``--ig-target`` and the closing lines'
    ``n_steps`` (``--num-steps``) and CUDA ``device`` (``--device``) where they are not diag's defaults."""
    words = ["diag", "--checkpoint", str(checkpoint), "--states", "auto"]
    if num_states != AUTO_SAMPLES:
        words += ["--auto-samples", str(num_states)]
    words += [] if target == "mean" else ["--target", target]
    words += [] if n_steps == "auto" else ["--num-steps", str(n_steps)]  # --ig-n-steps 8: the report's figures at 8
    words += ["--device", device] if device.startswith("cuda") else []  # "budget": the GPU's points, not the CPU's
    words += ["--feature-groups", str(groups_file), "--saliency", str(saliency), "--output", str(output)]
    return f"{lightning_ig_command()} {shlex.join(words)}"


def make_trainer(args: argparse.Namespace, logger: Any, callbacks: list[Any]) -> L.Trainer:
    """One device, one gradient step per vector step after the warm-up, in one endless epoch."""
    progress = [TQDMProgressBar(refresh_rate=500)] if args.progress_bar else []
    learning_steps = (args.total_timesteps - args.learning_starts) // args.num_envs
    return L.Trainer(
        accelerator=args.accelerator,
        devices=1,
        max_epochs=-1,
        max_steps=max(learning_steps, 1),
        logger=logger,
        callbacks=[*callbacks, *progress],
        gradient_clip_val=args.max_grad_norm or None,
        enable_checkpointing=False,
        enable_progress_bar=args.progress_bar,
        log_every_n_steps=500,
    )


def new_run_dir(runs_dir: str, name: str) -> Path:
    """A folder of this run's own under ``runs_dir``: two runs started in the same second get ``name`` and
    ``name-2``, never one folder (``mkdir`` is atomic: the second run's fails and it takes the next name)."""
    Path(runs_dir).mkdir(parents=True, exist_ok=True)
    folder, number = Path(runs_dir, name), 1
    while True:
        try:
            folder.mkdir()
            return folder
        except FileExistsError:  # noqa: PERF203 - mkdir is the atomic test of a free name
            number += 1
            folder = Path(runs_dir, f"{name}-{number}")


def quiet_third_parties() -> None:
    """Silence what is not the run's concern, in this script only: Lightning's tips (install litlogger, litmodels) and
    its device census (the script prints its own device line), and a deprecation inside Lightning's own pytree
    helper (Lightning's to fix; nothing the user wrote)."""
    noise = ("\N{ELECTRIC LIGHT BULB} Tip:", "GPU available:", "TPU available:", "HPU available:")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith(noise)
    )
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")


def error_exit(message: str) -> NoReturn:
    """The example's one-line error, as argparse words its own, and exit status 2."""
    print(f"{Path(__file__).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


#: What the summary prints for a statistic that is not finite.
NOT_FINITE = "n/a (NaN/Inf)"


def number(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``n/a (NaN/Inf)`` where it is not finite (``feature_statistics`` gives
    ``None`` then: a run that diverged)."""
    return NOT_FINITE if value is None or not math.isfinite(value) else format(value, spec)


def channel_order(mass: Tensor) -> list[int]:
    """The channels by attribution mass, largest first; those without a finite one (NaN/Inf) last."""
    values = [float(value) for value in mass]
    return sorted(range(len(values)), key=lambda c: (not math.isfinite(values[c]), -values[c]))


def ratio_to_random(mean_return: float, random_return: float) -> str:
    """How many times the random policy's mean return the agent's is; undefined unless the random one is positive."""
    if random_return > 0:
        return f"{mean_return / random_return:.1f}x"
    return f"ratio undefined (the random policy's mean return is {random_return:.2f})"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    args = parse_args(argv)
    if args.accelerator == "gpu" and not torch.cuda.is_available():  # said before a run folder or a logger is made
        error_exit("--accelerator gpu, but torch sees no CUDA GPU: use --accelerator cpu")
    torch.set_num_threads(args.num_threads)
    L.seed_everything(args.seed, workers=True, verbose=False)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # the replay is on the device
    warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")  # the replay stream has no length
    quiet_third_parties()
    try:
        run_dir = new_run_dir(args.runs_dir, f"MinAtar-{args.game}__{args.exp_name}__{args.seed}__{int(time.time())}")
    except OSError as error:  # --runs-dir is a file, not writable, or the name too long for the file system
        why = "it is not a folder" if Path(args.runs_dir).exists() and not Path(args.runs_dir).is_dir() else error
        error_exit(f"cannot make the run folder under --runs-dir {args.runs_dir}: {why}")
    try:
        return train_and_report(args, run_dir, started)
    except BaseException as error:
        # Lightning's SIGTERMException is a SystemExit without a code (it would exit 0); Ctrl-C is a KeyboardInterrupt
        signalled = signal.SIGTERM if isinstance(error, SIGTERMException) else None
        signalled = signal.SIGINT if isinstance(error, KeyboardInterrupt) else signalled
        if signalled or not (isinstance(error, SystemExit) and not error.code):  # not a clean exit: said
            say_the_run_failed(run_dir, error)
        if signalled:
            raise SystemExit(128 + signalled) from None  # as a shell reports a process the signal ended
        raise


def say_the_run_failed(run_dir: Path, error: BaseException) -> None:
    """One line on stderr where a run stopped after its folder was made: the folder is a failed run's."""
    checkpoint = run_dir / "q_network.safetensors"
    saved = f"; its checkpoint was saved: {checkpoint}" if checkpoint.exists() else ", no checkpoint"
    stopped = {KeyboardInterrupt: "was stopped (Ctrl-C)", SIGTERMException: "was stopped (SIGTERM)"}
    how = stopped.get(type(error), f"failed ({type(error).__name__})")
    print(
        f"\n{Path(__file__).name}: the run {how}: {run_dir} holds only what it wrote before the error{saved}",
        file=sys.stderr,
    )


def train_and_report(args: argparse.Namespace, run_dir: Path, started: float) -> dict[str, Any]:
    """The run in ``run_dir``: training, evaluation, the checkpoint (saved also where the evaluation is stopped, and
    before the attributions, which a run that diverged makes NaN), the summary."""
    run_name = run_dir.name
    logger = make_logger(args, run_name, run_dir)

    held_out = collect_held_out_states(args.game, args.num_held_out, seed=args.seed + 2_000)
    agent = DQNAgent(args)
    channel_names = agent.envs.channel_names
    callbacks = [make_ig_callback(args, held_out, channel_names, agent.envs.action_names)] if args.ig else []
    trainer = make_trainer(args, logger, callbacks)
    try:
        trainer.fit(agent)
    except SystemExit as stop:  # Lightning answers Ctrl-C with exit 1 after its graceful shutdown: said as Ctrl-C
        if stop.code == 1 and trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    train_seconds = time.perf_counter() - agent.train_started
    env_steps_per_second = (agent.env_steps - agent.warm_up_env_steps) / train_seconds
    gradient_steps_per_second = trainer.global_step / train_seconds

    q_network, device = agent.q_network.eval(), agent.device
    pixels = pixel_names(
        channel_names, held_out.shape[2:]
    )  # (10, 10) frames: by channel and cell, as reports name them
    metadata = {"game": args.game, "channel_names": json.dumps(channel_names), "run_name": run_name}
    metadata |= {"global_step": str(trainer.global_step), "args": json.dumps(vars(args))}
    try:  # the trained network is saved whatever stops the evaluation (Ctrl-C, SIGTERM, the environment's error)
        with noise_disabled(q_network), torch.no_grad():
            returns = evaluate(lambda x: q_network(x).argmax(dim=1).cpu().numpy(), args, args.eval_episodes, device)
        random_actions, num_actions = np.random.default_rng(args.seed + 3_000), len(agent.envs.action_set)
        uniform = evaluate(
            lambda x: random_actions.integers(num_actions, size=len(x)), args, args.random_episodes, device
        )
        metadata |= {"eval_mean_return": f"{returns.mean():.2f}", "random_mean_return": f"{uniform.mean():.2f}"}
    finally:
        checkpoint = save_checkpoint(
            q_network, run_dir / "q_network.safetensors", feature_names=pixels, states=held_out, metadata=metadata
        )
    mean_return, random_return = float(returns.mean()), float(uniform.mean())
    # The channels by name for `lightning-ig diag --feature-groups`: one (C, 1, 1) mask per channel (broadcast).
    groups_file = run_dir / "channel_groups.json"
    groups_file.write_text(json.dumps({name: [[[other == name]] for other in channel_names] for name in channel_names}))
    logger.log_metrics({"eval/mean_return": mean_return, "eval/random_mean_return": random_return}, trainer.global_step)
    with noise_disabled(q_network):
        # as the callback's runs: on a CPU its "budget" refines the states above the tolerance ("auto")
        n_steps = "auto" if args.ig_n_steps == "budget" and device.type == "cpu" else args.ig_n_steps
        result = integrated_gradients(q_network, held_out.to(device), target="mean", n_steps=n_steps)
    per_channel = result.grouped("channels").cpu()  # (num_held_out, C): completeness holds per channel too
    channels = feature_statistics(per_channel, channel_names)
    look_with = close_logger(logger, args, run_dir)

    loss_name = "lightning-ig fused soft-margin" if agent.use_fused_loss else "torch F.soft_margin_loss"
    print(f"\nrun folder          {run_dir}")
    print(f"{args.logger:<20}{look_with}")  # how to look at the run in its logger
    print(f"checkpoint          {checkpoint}")
    diag = diag_command(
        checkpoint,
        len(held_out),
        groups_file,
        run_dir / "saliency",
        run_dir / "ig_report.json",
        args.ig_target,
        n_steps,
        str(device),
    )
    print(f"diagnose it with    {diag}")
    print(f"device              trained on {agent.trained_on}, evaluated on {device}; auxiliary loss {loss_name}")
    print(
        f"training            {trainer.global_step} gradient steps, {agent.env_steps} env steps "
        f"({args.num_envs} game{'s' * (args.num_envs > 1)}), {train_seconds:.1f} s after the warm-up"
    )
    print(
        f"speed               {env_steps_per_second:.0f} env steps/s, {gradient_steps_per_second:.1f} gradient "
        f"steps/s (IG callback {'on' if args.ig else 'off'})"
    )
    print(
        f"eval return         mean {mean_return:.2f} over {len(returns)} episodes (min {returns.min():.0f}, "
        f"max {returns.max():.0f}); random policy {random_return:.2f} over {len(uniform)} episodes: "
        f"{ratio_to_random(mean_return, random_return)}"
    )
    print_overhead(trainer)
    if callbacks and callbacks[0].history:  # the last IG run's verdict, as its card, ig/report and the JSON say it
        print(f"IG verdict          {verdict_words(callbacks[0].history[-1])}")
    # Each cell with its own sign, then summed over the channel: cells that cancel show in both columns, as on the
    # verdict card, where the channel's net (its group's mean signed attribution) would hide them.
    cells = result.attributions.double().cpu().flatten(2)  # (num_held_out, C, H * W)
    raises, lowers = cells.clamp(min=0).sum(2).mean(0), (-cells).clamp(min=0).sum(2).mean(0)  # (C,) each
    print("attribution of V(s) per channel on the held-out frames (mass summed cell by cell, each cell's sign kept):")
    for index in channel_order(raises + lowers):
        up, down = float(raises[index]), float(lowers[index])
        up_text, down_text, net = number(up, ".4f"), number(down, ".4f"), number(up - down, "+.4f")
        width = max(len(name) for name in channel_names)
        print(f"  {channel_names[index]:<{width}} raises V(s) {up_text}   lowers it {down_text}   net {net}")
    print(f"wall time           {time.perf_counter() - started:.1f} s")
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "mean_return": mean_return,
        "random_return": random_return,
        "train_seconds": train_seconds,
        "channels": channels,
        "env_steps_per_second": env_steps_per_second,
        "gradient_steps_per_second": gradient_steps_per_second,
    }


if __name__ == "__main__":
    main()
