"""Small models the tests share."""

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


class PlainMLP(torch.nn.Module):
    """A user architecture with no config() and no registration: named by import path."""

    def __init__(self, width: int = 3, outputs: int = 2) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def seeded_mlp(
    features: int,
    outputs: int,
    *,
    seed: int,
    hidden: int = 16,
    act: type[torch.nn.Module] = torch.nn.Tanh,
    dtype: torch.dtype = torch.float64,
) -> torch.nn.Module:
    """A two-hidden-layer MLP ``(N, features) -> (N, outputs)`` in eval mode, its weights drawn after ``seed``."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(features, hidden),
        act(),
        torch.nn.Linear(hidden, hidden),
        act(),
        torch.nn.Linear(hidden, outputs),
    )
    return model.to(dtype).eval()


def seeded_dueling(features: int, actions: int, *, seed: int) -> torch.nn.Module:
    """A float64 :class:`DuelingMLP` in eval mode, its weights drawn after ``seed``."""
    torch.manual_seed(seed)
    return DuelingMLP(features, actions).double().eval()


def kinked_relu(kinks: list[float], signs: list[float]) -> torch.nn.Module:
    """``sum_i signs_i relu(z_i - kinks_i)`` as a two-layer ReLU network (Linear, ReLU, Linear), float64: one kink per
    feature, exactly where given."""
    features = len(kinks)
    net = torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.ReLU(), torch.nn.Linear(features, 1))
    net = net.double()  # before the weights are set: the kinks exactly as given, not rounded to float32
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(features, dtype=torch.float64))
        net[0].bias.copy_(-torch.tensor(kinks, dtype=torch.float64))
        net[2].weight.copy_(torch.tensor([signs], dtype=torch.float64))
        net[2].bias.zero_()
    return net


def kinked_relu_attributions(x: torch.Tensor, kinks: list[float], signs: list[float]) -> torch.Tensor:
    """The exact IG attributions of :func:`kinked_relu` from the zero baseline (kinks in ``(0, x)``)."""
    return torch.tensor(signs, dtype=torch.float64) * (x - torch.tensor(kinks, dtype=torch.float64)).clamp_min(0)
