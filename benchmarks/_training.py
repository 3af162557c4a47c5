"""The instruments of bench_callback_training.py: a DQN-like training step, a fit clock, a hand-written Captum callback.

* :class:`Replay` and :class:`DQNStep`: one double-DQN update per training step on a dueling NoisyNet, its
  batch sampled on the device from a synthetic replay buffer held there; nothing syncs the host per step
  except Lightning's own logging of the loss.
* :class:`FitClock`: a fit's time as a user feels it, from the first training batch to the end of training.
* :class:`CaptumCallback`: what a user writes by hand with Captum to watch the same things.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn

from benchmarks._common import synchronize

__all__ = ["ACTIONS", "CaptumCallback", "DQNStep", "FitClock", "Replay"]

ACTIONS = 6
GAMMA = 0.99


class Replay:
    """A synthetic replay buffer on the device: uint8 frames, actions, rewards and done flags."""

    def __init__(self, capacity: int, shape: tuple[int, ...], binary: bool, device: torch.device, seed: int) -> None:
        generator = torch.Generator(device=device).manual_seed(seed)
        size = (capacity, *shape)
        if binary:
            self.frames = (torch.rand(size, generator=generator, device=device) < 0.1).to(torch.uint8) * 255
        else:
            self.frames = torch.randint(0, 256, size, generator=generator, device=device, dtype=torch.uint8)
        self.actions = torch.randint(0, ACTIONS, (capacity,), generator=generator, device=device)
        self.rewards = torch.randn(capacity, generator=generator, device=device)
        self.dones = (torch.rand(capacity, generator=generator, device=device) < 0.01).float()

    def sample(self, batch: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        # the global generator: the one a callback must leave as it found it
        index = torch.randint(0, len(self.frames) - 1, (batch,), device=self.frames.device)
        frames = self.frames[index].float().div_(255)  # (batch, *shape)
        following = self.frames[index + 1].float().div_(255)
        return frames, self.actions[index], self.rewards[index], self.dones[index], following


class DQNStep(pl.LightningModule):
    """One double-DQN update per training step on a dueling NoisyNet; the target network copied every 1000 steps."""

    def __init__(self, network: nn.Module, replay: Replay, batch_size: int, target_every: int = 1000) -> None:
        super().__init__()
        self.online = network
        self.target = copy.deepcopy(network).requires_grad_(False)
        self.replay, self.batch_size, self.target_every = replay, batch_size, target_every

    def forward(self, x: Tensor) -> Tensor:
        return self.online(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        self.online.reset_noise()
        self.target.reset_noise()
        frames, actions, rewards, dones, following = self.replay.sample(self.batch_size)
        q = self.online(frames).gather(1, actions.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            greedy = self.online(following).argmax(1, keepdim=True)
            bootstrap = self.target(following).gather(1, greedy).squeeze(1)
            target = rewards + GAMMA * (1 - dones) * bootstrap
        loss = nn.functional.smooth_l1_loss(q, target)
        self.log("train/loss", loss)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step % self.target_every == 0:
            self.target.load_state_dict(self.online.state_dict())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.online.parameters(), lr=6.25e-5, eps=1.5e-4)


class FitClock(Callback):
    """Seconds from the first training batch's start to the end of ``on_train_end``, device synchronised at both.

    Last in the callback list, so the IG callback's end of training (its last pictures) is inside; the
    loggers are flushed before the clock stops, so what waits in TensorBoard's writer thread is inside too.
    ``mark``: also read the clock (synchronised) at the start of that batch, for the step time.
    """

    def __init__(self, mark: int | None = None) -> None:
        self.mark = mark
        self.started = self.marked = self.ended = math.nan

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 0 or batch_idx == self.mark:
            synchronize(pl_module.device)
            now = time.perf_counter()
            self.started, self.marked = (now, self.marked) if batch_idx == 0 else (self.started, now)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for logger in trainer.loggers:
            flush = getattr(logger.experiment, "flush", None)
            if callable(flush):
                flush()
        synchronize(pl_module.device)
        self.ended = time.perf_counter()

    @property
    def seconds(self) -> float:
        return self.ended - self.started


class CaptumCallback(Callback):
    """What a user writes by hand with Captum: IG every ``every_n_steps`` steps, the same scalars, a saliency grid.

    ``captum.attr.IntegratedGradients`` on ``V(s)`` (the mean over actions) of the held-out states against
    zeros, ``n_steps`` Gauss-Legendre points, ``return_convergence_delta=True``; the model in eval mode and
    its NoisyNet layers' own ``disable_noise()`` around it. Logged through the trainer's loggers: per channel
    the mean ``|attr|`` and mean ``attr``, and the completeness worst relative error
    ``|delta| / |F(x) - F(b)|`` (``F(x) - F(b) = sum(attr) - delta``: no extra forward); every
    ``image_every_n_runs`` runs, ``add_image`` of the first ``saliency_states`` states' ``|attr|`` maps.
    """

    def __init__(
        self,
        states: Tensor,
        *,
        every_n_steps: int,
        n_steps: int = 50,
        image_every_n_runs: int = 10,
        saliency_states: int = 8,
    ) -> None:
        from captum.attr import IntegratedGradients as CaptumIG

        self.states, self.every_n_steps, self.n_steps = states, every_n_steps, n_steps
        self.image_every_n_runs, self.saliency_states = image_every_n_runs, saliency_states
        self._captum_ig = CaptumIG
        self.runs = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._states = self.states.to(pl_module.device)
        self._baselines = torch.zeros_like(self._states)
        self._ig = self._captum_ig(lambda x: pl_module(x).mean(dim=1))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every_n_steps:
            return
        attributions, delta = self._attribute(pl_module)  # (B, C, H, W), (B,)
        difference = attributions.sum(dim=(1, 2, 3)) - delta  # F(x) - F(b)
        worst = (delta.abs() / difference.abs()).max()
        values = torch.cat([attributions.abs().mean(dim=(0, 2, 3)), attributions.mean(dim=(0, 2, 3)), worst[None]])
        values = values.tolist()  # one copy to the host
        channels = attributions.shape[1]
        metrics = {f"captum/channel_{c}/mean_abs": values[c] for c in range(channels)}
        metrics |= {f"captum/channel_{c}/mean": values[channels + c] for c in range(channels)}
        metrics["captum/completeness/worst_relative_error"] = values[-1]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        if self.runs % self.image_every_n_runs == 0:
            grid = self._grid(attributions)
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_image("captum/saliency", grid, step, dataformats="HW")
        self.runs += 1

    def _attribute(self, pl_module: pl.LightningModule) -> tuple[Tensor, Tensor]:
        training = pl_module.training
        noisy = [module for module in pl_module.modules() if hasattr(module, "disable_noise")]
        pl_module.eval()
        for module in noisy:
            module.disable_noise()
        try:
            return self._ig.attribute(
                self._states,
                baselines=self._baselines,
                n_steps=self.n_steps,
                method="gausslegendre",
                return_convergence_delta=True,
            )
        finally:
            for module in noisy:
                module.enable_noise()
            pl_module.train(training)

    def _grid(self, attributions: Tensor) -> Tensor:
        """``(H, k * W)`` in [0, 1]: each state's ``|attr|`` summed over channels, scaled by its own maximum."""
        heat = attributions[: self.saliency_states].detach().abs().sum(dim=1)  # (k, H, W)
        heat = heat / heat.flatten(1).amax(dim=1).clamp_min(1e-12)[:, None, None]
        return torch.cat(list(heat), dim=1).cpu()
