"""Dueling NoisyNet DQN on Gymnasium's CartPole-v1, trained with Lightning and watched by Integrated Gradients.

While the agent learns, lightning-ig's IntegratedGradientsCallback attributes the
state value V(s) (the mean of the dueling Q-values) to CartPole's four state
features on held-out states, with the NoisyNet noise switched off, and logs the
attributions, their completeness error and their drift to TensorBoard under
runs/<env>__<name>__<seed>__<time> (or to W&B or MLflow: --logger). An auxiliary head learns a +/-1 label (will
the pole lean further at the next step?) with a soft-margin loss. At the end the
Q-network and the held-out states go to a safetensors checkpoint that
`lightning-ig diag --states auto` reads.

An 18K-parameter MLP stepping one environment trains faster on a CPU than on a
GPU (per-step launch and transfer costs dominate), so the example trains on the
CPU unless you pass --accelerator gpu.

Run (after the README's set-up, which installs into .venv without activating it)::

    .venv/bin/python examples/dqn_cartpole.py                  # 2 CPU cores: about 70 seconds
    .venv/bin/python examples/dqn_cartpole.py --accelerator gpu
    .venv/bin/tensorboard --logdir runs
    .venv/bin/python examples/dqn_cartpole.py --ig-target each # every action's Q too: ig/3_actions, ig/action/...
    WANDB_MODE=offline .venv/bin/python examples/dqn_cartpole.py --logger wandb   # W&B, on disk: `wandb sync` later
    .venv/bin/python examples/dqn_cartpole.py --logger mlflow  # MLflow: a file store in runs/<run>/mlruns
    .venv/bin/lightning-ig diag --checkpoint runs/<run>/q_network.safetensors --states auto
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
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

#: CartPole-v1's observation, in order (Gymnasium's documentation).
FEATURE_NAMES = ["cart position", "cart velocity", "pole angle", "pole angular velocity"]
POLE_ANGLE = FEATURE_NAMES.index("pole angle")
#: CartPole-v1's actions: push the cart to the left, to the right.
ACTION_NAMES = ["left", "right"]


def make_ig_callback(args: argparse.Namespace, held_out: Tensor) -> IntegratedGradientsCallback:
    """What lightning-ig adds to a training run: IG of V(s) on held-out states, logged to ``--logger``."""
    return IntegratedGradientsCallback(
        held_out,  # (num_held_out, 4), never trained on
        feature_names=FEATURE_NAMES,
        every_n_steps=args.ig_every_n_steps,
        target=args.ig_target,  # "mean": V(s), the mean of the dueling Q-values; "each", "contrast": per action
        action_names=None if args.ig_target == "mean" else ACTION_NAMES,  # ig/3_actions' panels, contrast's pair
        engine=IGOptions(n_steps=args.ig_n_steps),
        overhead=args.ig_overhead,
        views=ViewOptions(top_k=len(FEATURE_NAMES)),
    )


def print_overhead(trainer: Any) -> None:
    """The closing line of the IG callback's cost: its share of the fit's wall time at its last run (ig/overhead)."""
    ig = next((c for c in trainer.callbacks if isinstance(c, IntegratedGradientsCallback)), None)
    if ig is not None and ig.history:
        share, budget = ig.history[-1]["overhead"], "none" if ig.overhead is None else f"{ig.overhead:.0%}"
        runs = f"{len(ig.history)} run{'s' * (len(ig.history) > 1)}"
        print(f"IG overhead         {share:.1%} of the fit's wall time (budget {budget}), {runs}")


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
    """The command line; a bad flag or value exits with status 2 and a message, before anything runs.

    The defaults reach a mean evaluation return >= 195 on two CPU cores in about 70 seconds (README: seeds 1-5).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add = parser.add_argument
    add(
        "--exp-name",
        type=name_arg,
        default=Path(__file__).stem,
        help="the name of this experiment (part of the run folder's name)",
    )
    add("--seed", type=seed_arg, default=1, help="seed of the network, the noise, replay sampling and the environments")
    add(
        "--env-id",
        default="CartPole-v1",
        help="the Gymnasium environment id: CartPole-v1 or another made by Gymnasium's CartPoleEnv (CartPole-v0); "
        "the example reads CartPole's 4 features",
    )
    add(
        "--accelerator",
        choices=("cpu", "gpu", "auto"),
        default=None,
        help="where the network trains; default: the CPU, faster than a GPU for this network "
        "(auto: Lightning's choice)",
    )
    add("--num-threads", type=at_least(1), default=1, help="torch CPU threads; 1 is fastest here and bit-reproducible")
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
    add("--total-timesteps", type=at_least(1), default=25_000, help="environment steps, warm-up included")
    add(
        "--learning-starts",
        type=at_least(0),
        default=1_000,
        help="environment steps with random actions that fill the replay buffer first",
    )
    add("--train-frequency", type=at_least(1), default=1, help="environment steps per gradient step")
    add("--buffer-size", type=at_least(1), default=50_000, help="replay buffer capacity (transitions)")
    add("--batch-size", type=at_least(1), default=128, help="transitions per gradient step")
    add("--learning-rate", type=finite_float, default=2e-3, help="Adam's initial learning rate")
    add(
        "--anneal-lr", action=argparse.BooleanOptionalAction, default=True, help="decay the learning rate linearly to 0"
    )
    add("--gamma", type=finite_float, default=0.99, help="discount factor, in (0, 1]")
    add("--n-step", type=at_least(1), default=3, help="rewards summed over this many steps before bootstrapping")
    add("--target-network-frequency", type=at_least(1), default=250, help="gradient steps between target updates")
    add("--tau", type=finite_float, default=1.0, help="target update rate, in (0, 1] (1: copy the weights)")
    add("--max-grad-norm", type=at_least(0.0, float), default=10.0, help="clip gradients to this norm (0: no clipping)")
    add("--hidden-size", type=at_least(1), default=128, help="width of the Q-network's two hidden layers")
    add(
        "--activation",
        choices=("relu", "tanh", "softplus", "silu", "gelu"),
        default="tanh",
        help="the network's activation; a smooth one keeps IG's attribution error (the 'IG verdict' line) small "
        "at --ig-n-steps points, where ReLU's kinks make it larger",
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
        default=256,
        help="held-out states for IG, from random rollouts, never trained on",
    )
    add("--ig-every-n-steps", type=at_least(1), default=500, help="gradient steps between IG runs")
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
        "batched call (adds ig/3_actions, 'What favours each action'); contrast, per state the greedy action's Q "
        "minus the other's ('Why left rather than right')",
    )
    add("--top-k", type=at_least(1), default=4, help="features printed at the end")
    add("--eval-episodes", type=at_least(1), default=10, help="greedy evaluation episodes (noise off) at the end")
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
    if args.learning_starts < args.n_step:  # fewer random steps than one n-step window: no transition to sample
        parser.error(
            f"--learning-starts must be at least {args.n_step} with --n-step {args.n_step} (the random steps must "
            f"fill the replay buffer with a transition before the first gradient step), got {args.learning_starts}"
        )
    if args.total_timesteps - args.learning_starts < args.train_frequency:
        parser.error("no gradient step would run: raise --total-timesteps or lower --learning-starts/--train-frequency")
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    for name in ("gamma", "tau"):
        if not 0 < getattr(args, name) <= 1:
            parser.error(f"--{name} must be in (0, 1], got {getattr(args, name)}")
    check_env_id(parser, args.env_id)
    return args


#: The entry point of Gymnasium's CartPole (CartPole-v0, CartPole-v1): the four features the example names.
CARTPOLE_ENTRY_POINT = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"


def check_env_id(parser: argparse.ArgumentParser, env_id: str) -> None:
    """``--env-id`` names a registered Gymnasium environment made by CartPoleEnv, or the parser exits with a line
    that says why (before a run folder is made; gymnasium loads here, torch not yet)."""
    import gymnasium  # noqa: PLC0415 - after the command line: --help answers without it

    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error as error:
        parser.error(f"--env-id {env_id}: no such Gymnasium environment ({error})")
    entry_point = spec.entry_point
    if not isinstance(entry_point, str):  # a class or a function registered by itself
        entry_point = f"{getattr(entry_point, '__module__', '')}:{getattr(entry_point, '__qualname__', '')}"
    if entry_point != CARTPOLE_ENTRY_POINT:
        cartpoles = sorted(
            name for name, other in gymnasium.registry.items() if other.entry_point == CARTPOLE_ENTRY_POINT
        )
        parser.error(
            f"--env-id {env_id} is not supported: the example reads CartPole's four state features "
            f"({', '.join(FEATURE_NAMES)}); use one of {', '.join(cartpoles)}"
        )


if __name__ == "__main__":
    parse_args()  # --help and a mistyped flag answer here, before torch, Lightning and the games are imported

import gymnasium as gym
import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_ig import (
    DuelingQNetwork,
    IntegratedGradientsCallback,
    integrated_gradients,
    noise_disabled,
    save_checkpoint,
    soft_margin_loss,
)
from lightning_ig.attribution import IGOptions
from lightning_ig.cli.parser import AUTO_SAMPLES
from lightning_ig.views import ViewOptions, feature_statistics
from lightning_ig.views.text import verdict_words


def choose_accelerator(requested: str | None, cuda_available: bool) -> tuple[str, str]:
    """Lightning's accelerator for the network and a line that says why.

    Without a request the CPU: one environment step and one small batch per
    gradient step leave a GPU waiting on launches and transfers.
    """
    if requested is not None:
        return requested, f"{requested} (--accelerator {requested})"
    if cuda_available:
        return "cpu", "cpu (a GPU is visible, but this small network trains faster on the CPU: --accelerator gpu)"
    return "cpu", "cpu"


def make_env(env_id: str, seed: int) -> gym.Env:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    return env


def collect_held_out_states(env_id: str, num_states: int, seed: int) -> Tensor:
    """``(num_states, 4)`` states from random-policy rollouts in an environment of their own."""
    env = make_env(env_id, seed)
    observation, _ = env.reset(seed=seed)
    states = []
    while len(states) < num_states:
        states.append(np.asarray(observation, dtype=np.float32))
        observation, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            observation, _ = env.reset()
    env.close()
    return torch.from_numpy(np.stack(states))


class ReplayBuffer(IterableDataset):
    """n-step transitions in preallocated CPU tensors (a ring); iterating yields sampled batches forever."""

    FIELDS = ("observations", "actions", "returns", "next_observations", "discounts", "angle_grows")

    def __init__(self, capacity: int, state_dim: int, batch_size: int, seed: int) -> None:
        self.capacity, self.batch_size, self.size, self.next = capacity, batch_size, 0, 0
        shapes = {"observations": (state_dim,), "next_observations": (state_dim,)}
        self.data = {name: torch.zeros(capacity, *shapes.get(name, ())) for name in self.FIELDS}
        self.data["actions"] = self.data["actions"].long()
        self.generator = torch.Generator().manual_seed(seed)

    def add(self, *transition: Any) -> None:
        for name, value in zip(self.FIELDS, transition):
            self.data[name][self.next] = torch.as_tensor(value)
        self.next = (self.next + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        while True:
            index = torch.randint(self.size, (self.batch_size,), generator=self.generator)
            yield tuple(self.data[name][index] for name in self.FIELDS)


class DQNAgent(L.LightningModule):
    """Double DQN, dueling NoisyNet Q-network, n-step returns, an auxiliary soft-margin head.

    Every training step plays ``train_frequency`` environment steps with the
    current (noisy) network, then takes one gradient step on a replay batch.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.env = make_env(args.env_id, args.seed)
        state_dim, num_actions = self.env.observation_space.shape[0], int(self.env.action_space.n)
        config = {
            "state_dim": state_dim,
            "num_actions": num_actions,
            "hidden_sizes": (args.hidden_size,) * 2,
            "sigma0": args.sigma0,
            "activation": args.activation,
        }
        self.q_network = DuelingQNetwork(**config)
        self.target_network = DuelingQNetwork(**config).requires_grad_(False)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.aux_head = nn.Linear(args.hidden_size, 1)  # logit of "will |pole angle| grow at the next step?"
        self.buffer = ReplayBuffer(args.buffer_size, state_dim, args.batch_size, seed=args.seed)
        self.use_fused_loss = bool(args.fused_loss)
        self.observation = self.env.reset(seed=args.seed)[0].astype(np.float32)
        self.pending: deque[tuple[np.ndarray, int, float, float]] = deque()  # the last n steps, not yet a transition
        self.episode_return, self.env_steps = 0.0, 0

    def forward(self, x: Tensor) -> Tensor:
        return self.q_network(x)  # (N, 4) -> (N, 2) Q-values; their mean is V(s)

    def on_fit_start(self) -> None:  # not setup(): Lightning moves the model to its device between the two
        if self.args.fused_loss is None:
            self.use_fused_loss = self.device.type == "cuda"
        # NoisyNet draws from its own generator, so the noise does not depend on other users of the global one.
        self.noise_generator = torch.Generator(device=self.device).manual_seed(self.args.seed + 1)
        for _ in range(self.args.learning_starts):
            self.play_step(random_action=True)

    @torch.no_grad()
    def play_step(self, random_action: bool = False) -> None:
        """One environment step; finished n-step transitions go to the replay buffer."""
        if random_action:
            action = int(self.env.action_space.sample())
        else:
            state = torch.from_numpy(self.observation).to(self.device).unsqueeze(0)
            action = int(self.q_network(state).argmax(dim=1).item())
        next_observation, reward, terminated, truncated, _ = self.env.step(action)
        next_observation = next_observation.astype(np.float32)
        self.env_steps += 1
        self.episode_return += float(reward)
        angle_grows = 1.0 if abs(next_observation[POLE_ANGLE]) > abs(self.observation[POLE_ANGLE]) else -1.0
        self.pending.append((self.observation, action, float(reward), angle_grows))
        # A full window makes one transition; at the episode's end every shorter tail does too. A time-limit
        # truncation still bootstraps from the last state (its discount stays gamma^k).
        while len(self.pending) == self.args.n_step or (self.pending and (terminated or truncated)):
            observation, first_action, _, first_angle_grows = self.pending[0]
            ret = sum(self.args.gamma**k * r for k, (_, _, r, _) in enumerate(self.pending))
            discount = 0.0 if terminated else self.args.gamma ** len(self.pending)
            self.buffer.add(observation, first_action, ret, next_observation, discount, first_angle_grows)
            self.pending.popleft()
        if terminated or truncated:
            for logger in self.loggers:
                logger.log_metrics({"charts/episodic_return": self.episode_return}, step=self.global_step)
            self.episode_return = 0.0
            next_observation = self.env.reset()[0].astype(np.float32)
        self.observation = next_observation

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        for _ in range(self.args.train_frequency):
            self.play_step()
        # Fresh noise for this update and the acting that follows it (Fortunato et al.).
        self.q_network.reset_noise(self.noise_generator)
        self.target_network.reset_noise(self.noise_generator)

        observations, actions, returns, next_observations, discounts, angle_grows = batch
        # One online forward for both ends: on a CPU a call of this small network costs more than its arithmetic.
        q_both = self.q_network(torch.cat([observations, next_observations]))  # (2B, A)
        q_values, next_q_online = q_both[: len(actions)], q_both[len(actions) :].detach()
        with torch.no_grad():  # Double DQN: the online network picks the next action, the target network values it
            next_q = self.target_network(next_observations).gather(1, next_q_online.argmax(dim=1, keepdim=True))
            td_target = returns + discounts * next_q.squeeze(1)
        q_taken = q_values.gather(1, actions.unsqueeze(1)).squeeze(1)
        td_loss = F.smooth_l1_loss(q_taken, td_target)
        logits = self.aux_head(self.q_network.features(observations)).squeeze(1)
        soft_margin = soft_margin_loss if self.use_fused_loss else F.soft_margin_loss
        aux_loss = soft_margin(logits, angle_grows)

        if self.global_step % self.args.target_network_frequency == 0:
            with torch.no_grad():
                for target, online in zip(self.target_network.parameters(), self.q_network.parameters()):
                    target.lerp_(online, self.args.tau)
        if self.global_step % 100 == 0:  # straight to the loggers: self.log's per-step cost is real at this size
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
        try:  # fused: one kernel for all parameters, also on the CPU (torch's default loops over tensors)
            optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate, fused=True)
        except RuntimeError:  # torch < 2.4 has no fused CPU Adam
            optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate)
        if not self.args.anneal_lr:
            return optimizer
        total = max(self.trainer.max_steps, 1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(1.0 - step / total, 0.0))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.buffer, batch_size=None)  # the buffer yields whole batches


@torch.no_grad()
def evaluate(q_network: nn.Module, env_id: str, episodes: int, seed: int, device: torch.device) -> list[float]:
    """Greedy returns with the noise off, one episode per seed ``seed, seed + 1, ...``."""
    env = make_env(env_id, seed)
    returns = []
    with noise_disabled(q_network):
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode)
            done, total = False, 0.0
            while not done:
                state = torch.as_tensor(observation, dtype=torch.float32, device=device).unsqueeze(0)
                observation, reward, terminated, truncated, _ = env.step(int(q_network(state).argmax(dim=1).item()))
                total, done = total + float(reward), terminated or truncated
            returns.append(total)
    env.close()
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
    output: Path | str,
    target: str = "mean",
    n_steps: int | str = "auto",
    device: str = "cpu",
) -> str:
    """The ``lightning-ig diag`` line that reads the checkpoint and its ``num_states`` stored states, shell-quoted;
    with ``--auto-samples`` where more or fewer are stored than diag samples unless told (all of them: the report's
    figures are then the closing lines' and the last run's), and the run's ``--ig-target`` and the closing lines'
    ``n_steps`` (``--num-steps``) and CUDA ``device`` (``--device``) where they are not diag's defaults."""
    words = ["diag", "--checkpoint", str(checkpoint), "--states", "auto"]
    if num_states != AUTO_SAMPLES:
        words += ["--auto-samples", str(num_states)]
    words += [] if target == "mean" else ["--target", target]
    words += [] if n_steps == "auto" else ["--num-steps", str(n_steps)]  # --ig-n-steps 8: the report's figures at 8
    words += ["--device", device] if device.startswith("cuda") else []  # "budget": the GPU's points, not the CPU's
    return f"{lightning_ig_command()} {shlex.join([*words, '--output', str(output)])}"


def make_trainer(args: argparse.Namespace, logger: Any, callbacks: list[Any]) -> L.Trainer:
    """One device, ``(total_timesteps - learning_starts) // train_frequency`` gradient steps in one endless epoch."""
    accelerator, _ = choose_accelerator(args.accelerator, torch.cuda.is_available())
    progress = [TQDMProgressBar(refresh_rate=250)] if args.progress_bar else []
    return L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_epochs=-1,
        logger=logger,
        callbacks=[*callbacks, *progress],
        max_steps=(args.total_timesteps - args.learning_starts) // args.train_frequency,
        gradient_clip_val=args.max_grad_norm or None,
        enable_checkpointing=False,
        enable_progress_bar=args.progress_bar,
        log_every_n_steps=100,
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


def ranked_features(features: list[dict[str, Any]], top_k: int) -> list[dict[str, Any]]:
    """The ``top_k`` features by mean |attribution|, largest first; those without a finite one (NaN/Inf) last."""

    def key(feature: dict[str, Any]) -> float:
        mean_abs = feature["mean_abs"]
        return -mean_abs if mean_abs is not None and math.isfinite(mean_abs) else math.inf

    return sorted(features, key=key)[:top_k]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    args = parse_args(argv)
    if args.accelerator == "gpu" and not torch.cuda.is_available():  # said before a run folder or a logger is made
        error_exit("--accelerator gpu, but torch sees no CUDA GPU: use --accelerator cpu")
    torch.set_num_threads(args.num_threads)
    L.seed_everything(args.seed, workers=True, verbose=False)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # one process feeds the replay
    warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")  # the replay stream has no length
    quiet_third_parties()
    try:
        run_dir = new_run_dir(args.runs_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
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
    print(f"device              {choose_accelerator(args.accelerator, torch.cuda.is_available())[1]}")

    held_out = collect_held_out_states(args.env_id, args.num_held_out, seed=args.seed + 2_000)
    agent = DQNAgent(args)
    callbacks = [make_ig_callback(args, held_out)] if args.ig else []
    trainer = make_trainer(args, logger, callbacks)
    fit_started = time.perf_counter()
    try:
        trainer.fit(agent)
    except SystemExit as stop:  # Lightning answers Ctrl-C with exit 1 after its graceful shutdown: said as Ctrl-C
        if stop.code == 1 and trainer.interrupted:
            raise KeyboardInterrupt from None
        raise
    fit_seconds = time.perf_counter() - fit_started

    q_network, device = agent.q_network.eval(), agent.device
    metadata = {"env_id": args.env_id, "run_name": run_name, "global_step": str(trainer.global_step)}
    metadata["args"] = json.dumps(vars(args))
    try:  # the trained network is saved whatever stops the evaluation (Ctrl-C, SIGTERM, the environment's error)
        returns = evaluate(q_network, args.env_id, args.eval_episodes, seed=args.seed + 1_000, device=device)
        metadata["eval_mean_return"] = f"{np.mean(returns):.1f}"
    finally:
        checkpoint = save_checkpoint(
            q_network,
            run_dir / "q_network.safetensors",
            feature_names=FEATURE_NAMES,
            states=held_out,
            metadata=metadata,
        )
    mean_return = float(np.mean(returns))
    logger.log_metrics({"eval/mean_return": mean_return}, step=trainer.global_step)
    with noise_disabled(q_network):
        # as the callback's runs: on a CPU its "budget" refines the states above the tolerance ("auto")
        n_steps = "auto" if args.ig_n_steps == "budget" and device.type == "cpu" else args.ig_n_steps
        result = integrated_gradients(q_network, held_out.to(device), target="mean", n_steps=n_steps)
    features = feature_statistics(result.attributions.cpu(), FEATURE_NAMES)
    ranked = ranked_features(features, args.top_k)
    look_with = close_logger(logger, args, run_dir)

    print(f"\nrun folder          {run_dir}")
    print(f"{args.logger:<20}{look_with}")  # how to look at the run in its logger
    print(f"checkpoint          {checkpoint}")
    diag = diag_command(checkpoint, len(held_out), run_dir / "ig_report.json", args.ig_target, n_steps, str(device))
    print(f"diagnose it with    {diag}")
    loss_name = "lightning-ig fused soft-margin" if agent.use_fused_loss else "torch F.soft_margin_loss"
    print(f"auxiliary loss      {loss_name}")
    print(f"training            {trainer.global_step} gradient steps, {agent.env_steps} env steps, {fit_seconds:.1f} s")
    print(
        f"eval return         mean {mean_return:.1f} over {len(returns)} episodes "
        f"(min {min(returns):.0f}, max {max(returns):.0f})"
    )
    print_overhead(trainer)
    if callbacks and callbacks[0].history:  # the last IG run's verdict, as its card, ig/report and the JSON say it
        print(f"IG verdict          {verdict_words(callbacks[0].history[-1])}")
    print("top features by mean |attribution| of V(s) on the held-out states:")
    for rank, feature in enumerate(ranked, start=1):
        name, mean_abs, mean_signed = (
            feature["name"],
            number(feature["mean_abs"], ".4f"),
            number(feature["mean_signed"], "+.4f"),
        )
        print(f"  {rank}. {name:<22} mean |attr| {mean_abs}   mean signed {mean_signed}")
    print(f"wall time           {time.perf_counter() - started:.1f} s")
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "mean_return": mean_return,
        "returns": returns,
        "fit_seconds": fit_seconds,
        "top_features": ranked,
    }


if __name__ == "__main__":
    main()
