"""A tiny Q-network LightningModule for the callback tests, and the DDP run they launch as a script.

As a script (``python -m tests.support.tiny --devices 2 --out DIR``, from the repository's root or with it
on ``PYTHONPATH``; Lightning's DDP launcher starts rank 1 the same way) it trains a
small conv net on image-shaped states with the callback under ``strategy="ddp"``
on the CPU (gloo; ``--accelerator gpu``: NCCL and the CUDA kernels), rank r
writing its JSON reports to ``DIR/reports_rank<r>`` and its event files to
``DIR/tb_rank<r>``; with ``--devices 1`` it runs the same training in one
process. tests/callback/test_callback_ddp.py compares the two. With ``--rank-baselines`` it makes
:func:`run_rank_baselines`' one run instead (each rank its own tensor baseline).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_ig.attribution import IGOptions
from lightning_ig.models.noise import NoisyLinear
from lightning_ig.views import ViewOptions

FEATURES = ["cart_x", "cart_v", "pole_theta", "pole_omega"]


class TinyQNet(pl.LightningModule):
    """4 inputs -> 2 Q-values, with the layers that make side effects likely.

    Dropout and a NoisyLinear draw random numbers in training mode, BatchNorm
    updates running statistics in training mode: a callback that left any of
    them switched on, or drew random numbers, would change training.
    """

    def __init__(self, lr: float = 0.05, noisy: bool = True, dropout: float = 0.1, batchnorm: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[torch.nn.Module] = [torch.nn.Linear(4, 16)]
        if batchnorm:
            layers.append(torch.nn.BatchNorm1d(16))
        layers += [torch.nn.Tanh(), torch.nn.Dropout(dropout)]
        layers.append(NoisyLinear(16, 2, sigma0=0.3) if noisy else torch.nn.Linear(16, 2))
        self.body = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # (N, 2)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        head = self.body[-1]
        if isinstance(head, NoisyLinear):
            head.reset_noise()  # consumes the global torch generator, as NoisyNet training does
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class ConvQNet(pl.LightningModule):
    """(C, H, W) or (C, L) frames (or flat vectors) -> 2 Q-values: a small smooth conv net for the image tests."""

    def __init__(self, input_shape: tuple[int, ...] = (3, 16, 16), lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        channels = input_shape[0]
        if len(input_shape) == 3:
            self.encoder = torch.nn.Sequential(
                torch.nn.Conv2d(channels, 4, 3, stride=2), torch.nn.Tanh(), torch.nn.Flatten()
            )
        elif len(input_shape) == 2:
            self.encoder = torch.nn.Sequential(
                torch.nn.Conv1d(channels, 4, 3, stride=2), torch.nn.Tanh(), torch.nn.Flatten()
            )
        else:
            self.encoder = torch.nn.Sequential(torch.nn.Linear(channels, 16), torch.nn.Tanh())
        width = self.encoder(torch.zeros(1, *input_shape)).shape[1]
        self.head = torch.nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))  # (N, 2)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class NatureDuelingQNet(pl.LightningModule):
    """The Nature-DQN convolutions (32 8x8/4, 64 4x4/2, 64 3x3/1) with dueling streams, for (4, 84, 84) frames."""

    def __init__(self, actions: int = 6, activation: type[torch.nn.Module] = torch.nn.ReLU) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(
            torch.nn.Conv2d(4, 32, 8, 4),
            activation(),
            torch.nn.Conv2d(32, 64, 4, 2),
            activation(),
            torch.nn.Conv2d(64, 64, 3, 1),
            activation(),
            torch.nn.Flatten(),
        )
        self.value = torch.nn.Sequential(torch.nn.Linear(3136, 512), activation(), torch.nn.Linear(512, 1))
        self.advantage = torch.nn.Sequential(torch.nn.Linear(3136, 512), activation(), torch.nn.Linear(512, actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.encoder(x)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(1, keepdim=True)  # (N, A); mean over A = V(s)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x).mean(1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def frames(n: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """``n`` random frames of ``shape`` in [0, 1] with a bright square (some structure for the saliency maps)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *shape, generator=generator) * 0.3
    if len(shape) == 3:
        x[:, :, shape[1] // 4 : shape[1] // 2, shape[2] // 4 : shape[2] // 2] += 0.6
    return x


def frame_dataset(n: int, shape: tuple[int, ...], outputs: int = 2, seed: int = 0) -> TensorDataset:
    x = frames(n, shape, seed)
    y = x.reshape(n, -1)[:, :outputs] * 2.0 - 1.0
    return TensorDataset(x, y if outputs > 1 else y[:, 0])


def dataset(n: int = 256, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = torch.stack([2.0 * x[:, 2] + x[:, 3], -x[:, 0] + 0.5 * x[:, 1]], dim=1)  # (n, 2)
    return TensorDataset(x, y)


def make_trainer(
    tmp_path: Path, callbacks: list, max_steps: int = 30, *, accelerator: str = "cpu", **kwargs: object
) -> pl.Trainer:
    """A quiet single-device Trainer for the tests; ``kwargs`` override the defaults."""
    options: dict = {
        "accelerator": accelerator,
        "devices": 1,
        "max_steps": max_steps,
        "default_root_dir": tmp_path,
        "logger": False,
        "callbacks": callbacks,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
    }
    options.update(kwargs)
    return pl.Trainer(**options)


def held_out_states(n: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))


def has_tensorboard() -> bool:
    """The GPU machine may run from the tree without TensorBoard: then the runs write reports only."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("tensorboard", "PIL"))


DDP_SHAPE = (2, 4, 4)  # frames small enough for a quick run, with the spatial dims that saliency maps need


def ddp_held_out_states() -> torch.Tensor:
    return frames(37, DDP_SHAPE, seed=1)  # 37 states: an uneven split over 2 ranks (19 + 18, padded to 19)


def run_ddp_comparison(devices: int, out: Path, batch_size: int, accelerator: str = "cpu") -> None:
    """Train a conv net on ``DDP_SHAPE`` frames twice, with the callback and without it, in each process.

    With the callback: per-feature and per-channel statistics, saliency images of 24 states (both ranks' shares);
    rank r writes its reports to ``out/reports_rank<r>`` and its TensorBoard logger to
    ``out/tb_rank<r>``, so the test can see that only rank zero writes. Rank zero saves the final weights of both
    fits to ``out/weights.pt``.
    """
    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_ig.callback import IntegratedGradientsCallback
    from tests.support.trust import checks_without_budget

    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning's launcher in the processes it starts
    weights = {}
    for with_callback in (True, False):
        pl.seed_everything(0)
        # No BatchNorm (its statistics are per rank under DDP), no noise draws (ranks would draw differently).
        model = ConvQNet(DDP_SHAPE, lr=0.01)
        callback = IntegratedGradientsCallback(
            # a callable that samples each rank's own states (a per-rank buffer): rank zero's are every rank's
            lambda trainer, module: ddp_held_out_states() + trainer.global_rank,
            every_n_steps=2,
            baseline="mean",
            feature_groups="channels",
            report_dir=out / f"reports_rank{rank}",
            engine=IGOptions(n_steps=16, backend="cuda" if accelerator == "gpu" else "torch"),
            views=ViewOptions(saliency_states=24, top_k=32, figure_every_n_runs=None),
        )
        trainer = pl.Trainer(
            accelerator=accelerator,
            devices=devices,
            strategy="ddp" if devices > 1 else "auto",
            max_steps=4,
            logger=TensorBoardLogger(out, name=f"tb_rank{rank}") if with_callback and has_tensorboard() else False,
            callbacks=[callback] if with_callback else [],
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,
        )
        # Every rank trains on the very batches of the one-process run: DDP's averaged gradient (g + g) / 2 is
        # that run's gradient g exactly, so the weights agree bit for bit and any difference left is the callback's.
        data = DataLoader(frame_dataset(128, DDP_SHAPE, seed=2), batch_size=batch_size, shuffle=False)
        with checks_without_budget():  # every trust check at the first run: their numbers compared across ranks
            trainer.fit(model, data)
        weights["with" if with_callback else "without"] = {
            k: v.detach().cpu().clone() for k, v in model.state_dict().items()
        }
    if rank == 0:
        torch.save(weights, out / "weights.pt")


def run_rank_baselines(devices: int, out: Path) -> None:
    """One run at step 2 of a tensor ``baseline`` (one per state) that each rank draws differently: rank zero's pairs
    with rank zero's states on every rank. Rank zero saves the weights attributed to ``out/weights.pt`` and writes
    the report to ``out/reports``."""
    from lightning_ig.callback import IntegratedGradientsCallback

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    pl.seed_everything(0)
    model = TinyQNet(noisy=False, dropout=0.0, batchnorm=False)
    states = held_out_states()
    callback = IntegratedGradientsCallback(
        states,
        every_n_steps=2,
        baseline=held_out_states(seed=2 + rank) * 0.5,  # what an unseeded draw gives: another tensor on each rank
        report_dir=out / "reports" if rank == 0 else out / f"reports_rank{rank}",
        engine=IGOptions(n_steps=16),
        overhead=None,
    )
    trainer = make_trainer(out, [callback], max_steps=2, devices=devices, strategy="ddp" if devices > 1 else "auto")
    trainer.fit(model, DataLoader(dataset(64), batch_size=16))
    if rank == 0:
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, out / "weights.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accelerator", default="cpu", help="cpu (gloo) or gpu (NCCL, the CUDA kernels)")
    parser.add_argument("--rank-baselines", action="store_true", help="run_rank_baselines instead")
    arguments = parser.parse_args()
    if arguments.rank_baselines:
        run_rank_baselines(arguments.devices, arguments.out)
    else:
        run_ddp_comparison(arguments.devices, arguments.out, arguments.batch_size, arguments.accelerator)
    # Lightning destroys NCCL's process group at exit, not gloo's: a gloo thread still freeing DDP's last allreduce
    # while the interpreter shuts down aborts the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
