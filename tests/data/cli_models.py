"""User architectures for the CLI tests: found by import path, as a user's own code would be."""

from __future__ import annotations

import torch
from torch import nn


class TinyQ(nn.Module):
    """A Q-network of the user's own, not registered and without config(): named with --model/--model-kwargs."""

    def __init__(self, width: int, actions: int = 2) -> None:
        super().__init__()
        self.hidden = nn.Linear(width, 8)
        self.out = nn.Linear(8, actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


class TinyQ64(TinyQ):
    """TinyQ in float64: diag converts the (float32) states to the model's dtype."""

    def __init__(self, width: int, actions: int = 2) -> None:
        super().__init__(width, actions)
        self.double()
