"""Small models the engine tests share."""

from __future__ import annotations

import torch


class DuelingMLP(torch.nn.Module):
    """A ReLU dueling Q-network ``(N, features) -> (N, actions)``: V(s) + A(s, a) - mean_a A(s, a)."""

    def __init__(self, features: int, actions: int, hidden: int = 32) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU()
        )
        self.value = torch.nn.Linear(hidden, 1)
        self.advantage = torch.nn.Linear(hidden, actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=1, keepdim=True)
