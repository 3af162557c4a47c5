"""A LightningModule for `lightning-ig diag --lightning-module` (its import pulls in Lightning)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from lightning_ig.models import DuelingQNetwork


class TinyDQN(pl.LightningModule):
    """Wraps a DuelingQNetwork; forward returns Q-values (N, A); feature names live in hparams."""

    def __init__(self, state_dim: int = 4, num_actions: int = 2, feature_names: list[str] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.q = DuelingQNetwork(state_dim, num_actions, hidden_sizes=(16,), activation="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x)
