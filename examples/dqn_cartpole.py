"""Dueling NoisyNet DQN on Gymnasium's CartPole-v1, trained with Lightning and watched by Integrated Gradients.

One file, top to bottom (in the spirit of CleanRL): the arguments, the
environment, the replay buffer, the LightningModule, evaluation, and the run.

While the agent learns, :class:`lightning_ig.IntegratedGradientsCallback`
attributes the state value ``V(s)`` (the mean of the dueling Q-values) to
CartPole's four state features on held-out states, with the NoisyNet
exploration noise switched off, and logs the attributions, their completeness
error and their drift to TensorBoard under ``runs/<env>__<name>__<seed>__<time>``.
An auxiliary head learns a self-supervised +/-1 label (will the pole lean
further at the next step?) with the soft-margin loss: the package's fused loss
(``--fused-loss``, the default on a CUDA device; its torch twin on the CPU) or
torch's own (``--no-fused-loss``). At the end the Q-network and the held-out
states go to a safetensors checkpoint that ``lightning-ig diag`` reads, and the
mean return over 10 greedy evaluation episodes and the top features are printed.

Run::

    python examples/dqn_cartpole.py                 # 2 CPU cores: about 3 minutes, mean eval return >= 195
    python examples/dqn_cartpole.py --accelerator gpu
    tensorboard --logdir runs
    lightning-ig diag --checkpoint runs/<run>/q_network.safetensors --states auto
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import time
import typing
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, NamedTuple, Sequence

import gymnasium as gym
import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_ig.attribution import integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.checkpoint import save_checkpoint
from lightning_ig.losses import soft_margin_loss
from lightning_ig.models import DuelingQNetwork
from lightning_ig.noise import noise_disabled
from lightning_ig.report import feature_statistics, top_features

#: CartPole-v1's observation, in order (Gymnasium's documentation).
FEATURE_NAMES = ["cart position", "cart velocity", "pole angle", "pole angular velocity"]
POLE_ANGLE = FEATURE_NAMES.index("pole angle")


@dataclass
class Args:
    """The run's settings; the docstring under each field is its ``--help`` text (see :func:`build_parser`).

    The defaults are tuned to reach a mean evaluation return >= 195 within about three minutes on two
    CPU cores: seeds 1-7 gave 500, 500, 500, 406, 273, 437 and 415.
    """

    exp_name: str = Path(__file__).stem
    """the name of this experiment (part of the run folder's name)"""
    seed: int = 1
    """seed of the experiment: network initialisation, noise, replay sampling and the environments"""
    env_id: str = "CartPole-v1"
    """the Gymnasium environment id (a 4-feature CartPole observation is assumed by the feature names)"""
    accelerator: Literal["auto", "cpu", "gpu", "cuda"] = "auto"
    """Lightning accelerator: auto picks a GPU when there is one"""
    num_threads: int = 1
    """torch CPU threads; 1 is fastest for this small network and keeps CPU runs bit-reproducible"""
    runs_dir: str = "runs"
    """parent folder of the TensorBoard run folder and the checkpoint"""
    progress_bar: bool = True
    """show Lightning's progress bar"""

    # DQN
    total_timesteps: int = 25_000
    """environment steps in training, warm-up included; one gradient step per step after the warm-up"""
    learning_starts: int = 1_000
    """environment steps with random actions that fill the replay buffer before learning starts"""
    train_frequency: int = 1
    """environment steps per gradient step"""
    buffer_size: int = 50_000
    """replay buffer capacity (transitions)"""
    batch_size: int = 128
    """transitions per gradient step"""
    learning_rate: float = 2e-3
    """Adam's (initial) learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to zero, so the final policy settles instead of drifting"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 3
    """n-step returns: rewards summed over this many steps before bootstrapping"""
    target_network_frequency: int = 250
    """gradient steps between target network updates"""
    tau: float = 1.0
    """target network update rate (1.0: copy the weights)"""
    max_grad_norm: float = 10.0
    """clip gradients to this global norm (0: no clipping)"""
    hidden_size: int = 128
    """width of the Q-network's two hidden layers"""
    activation: Literal["relu", "tanh", "softplus", "silu", "gelu"] = "tanh"
    """the Q-network's activation; a smooth one keeps IG's completeness error near 1e-4 at 50 steps, where ReLU's kinks leave it at 0.1-0.5"""
    sigma0: float = 0.5
    """NoisyNet's initial noise scale (exploration comes from the noise, not from epsilon-greedy)"""

    # auxiliary head
    aux_coef: float = 0.1
    """weight of the auxiliary soft-margin loss (will |pole angle| grow at the next step?)"""
    fused_loss: bool | None = None
    """the auxiliary loss: lightning-ig's fused soft-margin loss (CUDA kernel on a GPU, its torch twin on the CPU) or torch's F.soft_margin_loss; default: fused on a CUDA device"""

    # Integrated Gradients
    ig: bool = True
    """run the IntegratedGradientsCallback during training"""
    num_held_out: int = 256
    """held-out states, from random-policy rollouts in an environment of their own, never trained on"""
    ig_every_n_steps: int = 500
    """gradient steps between IG runs (one run on 256 states costs ~0.1 s on a CPU core)"""
    ig_n_steps: int = 50
    """quadrature points along the IG path"""
    top_k: int = 4
    """features printed at the end"""

    # evaluation
    eval_episodes: int = 10
    """greedy evaluation episodes (noise off) at the end"""


# --------------------------------------------------------------------------- arguments


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (what CleanRL's tyro shows as --help)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = following.value.value
    return docs


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one ``--flag`` per field of :class:`Args`, its docstring as the help."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    docs = _field_docs(Args)
    hints = typing.get_type_hints(Args)
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        help_text = docs.get(field.name, "")
        if kind is bool or kind == (bool | None):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default, help=help_text)
        elif typing.get_origin(kind) is Literal:
            parser.add_argument(flag, choices=typing.get_args(kind), default=field.default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=field.default, metavar=kind.__name__.upper(), help=help_text)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """Parse the command line into :class:`Args`; a bad flag or value exits with status 2 and a message."""
    parser = build_parser()
    args = Args(**vars(parser.parse_args(argv)))
    positive = ["total_timesteps", "train_frequency", "buffer_size", "batch_size", "n_step",
                "target_network_frequency", "hidden_size", "num_threads", "num_held_out",
                "ig_every_n_steps", "ig_n_steps", "top_k", "eval_episodes"]  # fmt: skip
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        parser.error(
            f"--learning-starts must be in [0, --total-timesteps), got {args.learning_starts} "
            f"with --total-timesteps {args.total_timesteps}; lower it or train longer"
        )
    if (args.total_timesteps - args.learning_starts) < args.train_frequency:
        parser.error("no gradient step would run: raise --total-timesteps or lower --learning-starts/--train-frequency")
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.max_grad_norm < 0:
        parser.error(f"--max-grad-norm must be >= 0 (0: no clipping), got {args.max_grad_norm}")
    if not 0 < args.gamma <= 1:
        parser.error(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0 < args.tau <= 1:
        parser.error(f"--tau must be in (0, 1], got {args.tau}")
    if args.sigma0 < 0 or args.aux_coef < 0:
        parser.error(f"--sigma0 and --aux-coef must be >= 0, got {args.sigma0} and {args.aux_coef}")
    return args


# --------------------------------------------------------------------------- environment


def make_env(env_id: str, seed: int) -> gym.Env:
    """A single environment whose action space draws from ``seed`` (reset it with ``seed`` too)."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    return env


def collect_held_out_states(env_id: str, num_states: int, seed: int) -> Tensor:
    """States from random-policy rollouts in an environment of their own, kept aside for IG.

    They never enter the replay buffer, so IG looks at states the network was
    not fitted on, and they are the same for every run with the same seed.

    Returns:
        ``(num_states, state_dim)`` float32.
    """
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


# --------------------------------------------------------------------------- replay


class Batch(NamedTuple):
    observations: Tensor  # (B, state_dim)
    actions: Tensor  # (B,) int64
    returns: Tensor  # (B,) discounted n-step reward sum
    next_observations: Tensor  # (B, state_dim) the state n steps later
    discounts: Tensor  # (B,) gamma^n, or 0 where the episode terminated within the n steps
    angle_grows: Tensor  # (B,) +1 if |pole angle| grew at the next step, else -1


class ReplayBuffer:
    """A ring buffer of n-step transitions in preallocated CPU tensors, sampled with its own generator."""

    def __init__(self, capacity: int, state_dim: int, seed: int) -> None:
        self.capacity = capacity
        self.observations = torch.zeros(capacity, state_dim)
        self.next_observations = torch.zeros(capacity, state_dim)
        self.actions = torch.zeros(capacity, dtype=torch.long)
        self.returns = torch.zeros(capacity)
        self.discounts = torch.zeros(capacity)
        self.angle_grows = torch.zeros(capacity)
        self.size = 0
        self._next = 0
        self._generator = torch.Generator().manual_seed(seed)

    def add(
        self, observation: np.ndarray, action: int, ret: float, next_observation: np.ndarray, discount: float, angle_grows: float
    ) -> None:
        i = self._next
        self.observations[i] = torch.from_numpy(observation)
        self.next_observations[i] = torch.from_numpy(next_observation)
        self.actions[i] = action
        self.returns[i] = ret
        self.discounts[i] = discount
        self.angle_grows[i] = angle_grows
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> Batch:
        index = torch.randint(self.size, (batch_size,), generator=self._generator)
        return Batch(
            self.observations[index], self.actions[index], self.returns[index],
            self.next_observations[index], self.discounts[index], self.angle_grows[index],
        )  # fmt: skip


class ReplayDataset(IterableDataset):
    """An endless stream of batches sampled from the replay buffer, which the agent fills as it trains."""

    def __init__(self, buffer: ReplayBuffer, batch_size: int) -> None:
        self.buffer = buffer
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.buffer.sample(self.batch_size)


# --------------------------------------------------------------------------- agent


class DQNAgent(L.LightningModule):
    """Double DQN with a dueling NoisyNet Q-network, n-step returns, a target network and an auxiliary head.

    Every training step first plays ``train_frequency`` environment steps with
    the current (noisy) network, then takes one gradient step on a replay batch.

    Args:
        args: The run's arguments.
    """

    def __init__(self, args: Args) -> None:
        super().__init__()
        self.args = args
        self.env = make_env(args.env_id, args.seed)
        state_dim = int(self.env.observation_space.shape[0])
        num_actions = int(self.env.action_space.n)
        network_config = dict(
            state_dim=state_dim, num_actions=num_actions, hidden_sizes=(args.hidden_size, args.hidden_size),
            sigma0=args.sigma0, activation=args.activation,
        )  # fmt: skip
        self.q_network = DuelingQNetwork(**network_config)
        self.target_network = DuelingQNetwork(**network_config)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.target_network.requires_grad_(False)
        # Logit of "will |pole angle| grow at the next step?", read off the Q-network's body.
        self.aux_head = nn.Linear(args.hidden_size, 1)
        self.buffer = ReplayBuffer(args.buffer_size, state_dim, seed=args.seed)
        self.use_fused_loss = bool(args.fused_loss)  # resolved against the device in setup()
        self._noise_generator: torch.Generator | None = None
        self._observation: np.ndarray = self.env.reset(seed=args.seed)[0].astype(np.float32)
        self._pending: deque[tuple[np.ndarray, int, float, float]] = deque()  # the last n steps, not yet a transition
        self._episode_return = 0.0
        self.episode_returns: list[float] = []
        self.env_steps = 0

    def forward(self, x: Tensor) -> Tensor:
        """Q-values ``(N, state_dim) -> (N, num_actions)``; their mean over actions is V(s), what IG attributes."""
        return self.q_network(x)

    def on_fit_start(self) -> None:
        # Here, not in setup(): Lightning moves the model to its device between the two.
        if self.args.fused_loss is None:
            self.use_fused_loss = self.device.type == "cuda"
        # NoisyNet draws from a generator of its own, on the model's device: the noise sequence does not
        # depend on who else uses torch's global generator.
        self._noise_generator = torch.Generator(device=self.device).manual_seed(self.args.seed + 1)
        for _ in range(self.args.learning_starts):
            self.play_step(random_action=True)

    # ---------------------------------------------------------------- acting

    @torch.no_grad()
    def play_step(self, random_action: bool = False) -> None:
        """One environment step; finished n-step transitions go to the replay buffer."""
        if random_action:
            action = int(self.env.action_space.sample())
        else:
            observation = torch.from_numpy(self._observation).to(self.device).unsqueeze(0)
            action = int(self.q_network(observation).argmax(dim=1).item())
        next_observation, reward, terminated, truncated, _ = self.env.step(action)
        next_observation = next_observation.astype(np.float32)
        self.env_steps += 1
        self._episode_return += float(reward)
        angle_grows = 1.0 if abs(next_observation[POLE_ANGLE]) > abs(self._observation[POLE_ANGLE]) else -1.0
        self._pending.append((self._observation, action, float(reward), angle_grows))
        if len(self._pending) == self.args.n_step:
            self._emit(next_observation, terminated)
        if terminated or truncated:
            # Flush the shorter tails; a time-limit truncation still bootstraps from the last state.
            while self._pending:
                self._emit(next_observation, terminated)
            self.episode_returns.append(self._episode_return)
            for logger in self.loggers:
                logger.log_metrics({"charts/episodic_return": self._episode_return}, step=self.global_step)
            self._episode_return = 0.0
            next_observation = self.env.reset()[0].astype(np.float32)
        self._observation = next_observation

    def _emit(self, next_observation: np.ndarray, terminated: bool) -> None:
        gamma = self.args.gamma
        observation, action, _, angle_grows = self._pending[0]
        ret = sum(gamma**k * reward for k, (_, _, reward, _) in enumerate(self._pending))
        discount = 0.0 if terminated else gamma ** len(self._pending)
        self.buffer.add(observation, action, ret, next_observation, discount, angle_grows)
        self._pending.popleft()

    # ---------------------------------------------------------------- learning

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        for _ in range(self.args.train_frequency):
            self.play_step()
        # Fresh noise for this update and for the acting that follows it (Fortunato et al.).
        self.q_network.reset_noise(self._noise_generator)
        self.target_network.reset_noise(self._noise_generator)

        batch_size = batch.observations.shape[0]
        # One online forward for both ends of the transitions: on a CPU the per-call overhead of a
        # network this small costs more than its arithmetic.
        q_both = self.q_network(torch.cat([batch.observations, batch.next_observations]))  # (2B, A)
        q_values, next_q_online = q_both[:batch_size], q_both[batch_size:].detach()
        with torch.no_grad():
            # Double DQN: the online network picks the next action, the target network values it.
            next_actions = next_q_online.argmax(dim=1, keepdim=True)
            next_q = self.target_network(batch.next_observations).gather(1, next_actions).squeeze(1)
            td_target = batch.returns + batch.discounts * next_q
        q_taken = q_values.gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        td_loss = F.smooth_l1_loss(q_taken, td_target)

        logits = self.aux_head(self.q_network.features(batch.observations)).squeeze(1)
        if self.use_fused_loss:
            aux_loss = soft_margin_loss(logits, batch.angle_grows)
        else:
            aux_loss = F.soft_margin_loss(logits, batch.angle_grows)
        loss = td_loss + self.args.aux_coef * aux_loss

        if self.global_step % self.args.target_network_frequency == 0:
            with torch.no_grad():
                for target, online in zip(self.target_network.parameters(), self.q_network.parameters()):
                    target.lerp_(online, self.args.tau)
        if self.global_step % 100 == 0:
            # Straight to the loggers, only every 100 steps: self.log's per-step cost is a real share of a
            # step this small on a CPU.
            metrics = {
                "losses/td_loss": td_loss.item(),
                "losses/aux_soft_margin": aux_loss.item(),
                "losses/q_values": q_taken.mean().item(),
                "charts/learning_rate": self.optimizers().param_groups[0]["lr"],  # type: ignore[union-attr]
                "charts/env_steps": float(self.env_steps),
            }
            for logger in self.loggers:
                logger.log_metrics(metrics, step=self.global_step)
        return loss

    def configure_optimizers(self) -> Any:
        parameters = [p for p in self.parameters() if p.requires_grad]
        try:
            # fused: one kernel for all parameters, also on the CPU, where torch's default is a per-tensor
            # loop that costs a fifth of a step here. Older torch has no fused CPU Adam.
            optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate, fused=True)
        except RuntimeError:
            optimizer = torch.optim.Adam(parameters, lr=self.args.learning_rate)
        if not self.args.anneal_lr:
            return optimizer
        total = max(self.trainer.max_steps, 1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(1.0 - step / total, 0.0))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        # The dataset yields whole batches, so no collation: batch_size=None.
        return DataLoader(ReplayDataset(self.buffer, self.args.batch_size), batch_size=None)


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(q_network: nn.Module, env_id: str, episodes: int, seed: int, device: torch.device) -> list[float]:
    """Greedy returns with the NoisyNet noise off, one episode per seed ``seed, seed + 1, ...``."""
    env = make_env(env_id, seed)
    returns = []
    with noise_disabled(q_network):
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode)
            done, total = False, 0.0
            while not done:
                state = torch.as_tensor(observation, dtype=torch.float32, device=device).unsqueeze(0)
                action = int(q_network(state).argmax(dim=1).item())
                observation, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    env.close()
    return returns


# --------------------------------------------------------------------------- run


def hyperparameter_table(args: Args) -> str:
    """The arguments as a markdown table (TensorBoard's text tab)."""
    rows = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    return f"|param|value|\n|-|-|\n{rows}"


def make_trainer(args: Args, logger: Any, callbacks: list[Any]) -> L.Trainer:
    """The Trainer: one device, ``(total_timesteps - learning_starts) // train_frequency`` gradient steps."""
    if args.progress_bar:
        callbacks = [*callbacks, TQDMProgressBar(refresh_rate=250)]
    return L.Trainer(
        accelerator="gpu" if args.accelerator == "cuda" else args.accelerator,
        devices=1,
        max_steps=(args.total_timesteps - args.learning_starts) // args.train_frequency,
        max_epochs=-1,  # one endless epoch over the replay stream: max_steps ends training
        logger=logger,
        callbacks=callbacks,
        gradient_clip_val=args.max_grad_norm or None,
        enable_checkpointing=False,
        enable_progress_bar=args.progress_bar,
        log_every_n_steps=100,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train, evaluate, save; returns what it printed as a dict."""
    started = time.perf_counter()
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    L.seed_everything(args.seed, workers=True, verbose=False)
    # Expected here and harmless: the replay stream has no length, and a single process loads it.
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")

    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    logger = TensorBoardLogger(save_dir=args.runs_dir, name=run_name, version="", default_hp_metric=False)
    logger.experiment.add_text("hyperparameters", hyperparameter_table(args))
    run_dir = Path(logger.log_dir)

    held_out = collect_held_out_states(args.env_id, args.num_held_out, seed=args.seed + 2_000)
    agent = DQNAgent(args)
    callbacks: list[Any] = []
    if args.ig:
        callbacks.append(
            IntegratedGradientsCallback(
                held_out,
                feature_names=FEATURE_NAMES,
                every_n_steps=args.ig_every_n_steps,
                target="mean",  # V(s) of the dueling network
                n_steps=args.ig_n_steps,
                top_k=len(FEATURE_NAMES),
            )
        )
    trainer = make_trainer(args, logger, callbacks)
    fit_started = time.perf_counter()
    trainer.fit(agent)
    fit_seconds = time.perf_counter() - fit_started

    q_network = agent.q_network.eval()
    device = agent.device
    returns = evaluate(q_network, args.env_id, args.eval_episodes, seed=args.seed + 1_000, device=device)
    mean_return = float(np.mean(returns))
    logger.log_metrics({"eval/mean_return": mean_return}, step=trainer.global_step)

    with noise_disabled(q_network):
        result = integrated_gradients(q_network, held_out.to(device), target="mean", n_steps=args.ig_n_steps)
    ranked = top_features(feature_statistics(result.attributions.cpu(), FEATURE_NAMES), k=args.top_k)

    checkpoint = save_checkpoint(
        q_network,
        run_dir / "q_network.safetensors",
        feature_names=FEATURE_NAMES,
        states=held_out,
        metadata={
            "env_id": args.env_id,
            "run_name": run_name,
            "global_step": str(trainer.global_step),
            "eval_mean_return": f"{mean_return:.1f}",
            "args": json.dumps(vars(args)),
        },
    )
    logger.finalize("success")

    print(f"\nrun folder          {run_dir}")
    print(f"checkpoint          {checkpoint}")
    print(f"auxiliary loss      {'lightning-ig fused soft-margin' if agent.use_fused_loss else 'torch F.soft_margin_loss'}")
    print(f"training            {trainer.global_step} gradient steps, {agent.env_steps} env steps, {fit_seconds:.1f} s")
    print(f"eval return         mean {mean_return:.1f} over {len(returns)} episodes (min {min(returns):.0f}, max {max(returns):.0f})")
    print(f"IG completeness     worst relative error {result.worst_relative_error:.2e} ({args.ig_n_steps} steps)")
    print("top features by mean |attribution| of V(s) on the held-out states:")
    for rank, feature in enumerate(ranked, start=1):
        print(f"  {rank}. {feature['name']:<22} mean |attr| {feature['mean_abs']:.4f}   mean signed {feature['mean_signed']:+.4f}")
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
