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


class Opposed(TinyQ):
    """Two actions ``f`` and ``-f``: their mean, V(s), is exactly 0 on every state (nothing to check), each is not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = torch.relu(self.hidden(x)).sum(1, keepdim=True)
        return torch.cat([half, -half], 1)


class TinyQ64(TinyQ):
    """TinyQ in float64: diag converts the (float32) states to the model's dtype."""

    def __init__(self, width: int, actions: int = 2) -> None:
        super().__init__(width, actions)
        self.double()


class Overflow(nn.Module):
    """One output per state, ``sum(1e38 * x)``: infinite where ``|sum(x)|`` passes ~3.4, finite elsewhere."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((width,), 1e38))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).sum(-1)


class Flat(nn.Module):
    """Q-values that do not depend on the state: every state is degenerate (F(x) - F(b) = 0)."""

    def __init__(self, width: int, actions: int = 2) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.arange(actions, dtype=torch.float32))
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] * 0 + self.bias


class Jittery(TinyQ):
    """TinyQ with noise drawn in its forward whatever the mode: a forward diag cannot make deterministic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 0.1 * torch.randn(x.shape[0], 1)


class MinAtarShaped(nn.Module):
    """(C, 10, 10) frames -> Q-values: a stand-in for models.MinAtarQNetwork on a tree that does not have it yet."""

    def __init__(self, in_channels: int = 4, num_actions: int = 3) -> None:
        super().__init__()
        self.in_channels, self.num_actions = in_channels, num_actions
        self.encoder = nn.Sequential(nn.Conv2d(in_channels, 16, 3), nn.Tanh(), nn.Flatten())
        self.head = nn.Linear(16 * 8 * 8, num_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def config(self) -> dict:
        return {"in_channels": self.in_channels, "num_actions": self.num_actions}


class MixedPrecision(TinyQ):
    """TinyQ whose output layer is float64: two precisions in one model, as layers saved apart."""

    def __init__(self, width: int, actions: int = 2) -> None:
        super().__init__(width, actions)
        self.out.double()


class Detached(TinyQ):
    """TinyQ computed outside autograd (as a forward through numpy would be): only finite differences take it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).detach()


class Stepped(TinyQ):
    """TinyQ plus a step, whose derivative autograd does not implement: only finite differences take it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = super().forward(x)
        return q + torch.heaviside(q, torch.zeros((), dtype=q.dtype))


class FirstRowOnly(TinyQ):
    """TinyQ that returns the first row's Q-values whatever the batch: fine on one state, wrong on the path's rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[:1]


class OneRowAtATime(TinyQ):
    """TinyQ that reshapes its input to one row: fine on one state, fails on any batch of more."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.reshape(1, -1))


class Rounded(TinyQ):
    """TinyQ whose Q-values are rounded to integers (int64): no gradient to attribute."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).round().long()


class Squeezed(TinyQ):
    """TinyQ that squeezes its output: (N, A) on a batch, (A,) on one row (a chunk of one path point)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).squeeze()
