"""Models and helpers of the trust checks' tests (tests/trust/).

The trained network is a NoisyNet dueling MLP fit (about half a second) to a value that only four small-scale
features of 32 carry: a random network's map follows the input scales, the trained one's follows the value, so the
two rank the features differently.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import budget
from lightning_ig.models import DuelingQNetwork, NoisyLinear
from lightning_ig.trust import AttributionSettings
from lightning_ig.trust.common import structure_copy
from lightning_ig.trust.replica import redraw
from lightning_ig.views.loggers.worker import PictureWriter

FEATURES = 32
SCALES = torch.logspace(0.5, -0.5, FEATURES)  # feature i's input scale: what a random network's map follows
SETTINGS = AttributionSettings(target="mean", options=IGOptions(n_steps=32))


def value(x: torch.Tensor) -> torch.Tensor:
    """What four of the six smallest-scale features say, in units of their own scales."""
    z = x / SCALES.to(x.device)
    return 3 * z[:, -6] - 2 * z[:, -4] + z[:, -3] * z[:, -1]


def network(train_steps: int, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A NoisyNet dueling MLP fit by Adam for ``train_steps`` steps (noise on, as NoisyNet trains), and 32 states."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DuelingQNetwork(FEATURES, 2, hidden_sizes=(64, 64), noisy=True, activation="relu")
    data = torch.randn(2048, FEATURES, generator=generator) * SCALES
    target = value(data)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(train_steps):
        rows = torch.randint(0, len(data), (128,), generator=generator)
        model.reset_noise(generator)
        loss = ((model(data[rows]).mean(dim=1) - target[rows]) ** 2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    optimiser.zero_grad(set_to_none=True)
    states = torch.randn(32, FEATURES, generator=torch.Generator().manual_seed(99)) * SCALES
    return model.eval(), states


class InputDriven(nn.Module):
    """``Q = Linear(sum(x^2))``: the output depends on the weights; IG's map, ``mean(w) x_i^2``, ranks alike for any."""

    def __init__(self, num_actions: int = 2) -> None:
        super().__init__()
        self.head = nn.Linear(1, num_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head((x**2).flatten(1).sum(dim=1, keepdim=True))


def attribute(model: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """``(B, F)``: the model's IG with :data:`SETTINGS` and a zero baseline, flattened per state."""
    return SETTINGS.attribute(model, states, torch.zeros_like(states)).flatten(1)


def snapshot(model: nn.Module) -> dict:
    """Everything a check must leave as it was: tensors, modes, noise switches, grads and the random generators."""
    return {
        "tensors": {name: value.detach().clone() for name, value in model.state_dict(keep_vars=True).items()},
        "modes": [module.training for module in model.modules()],
        "noise": [module.noise_enabled for module in model.modules() if isinstance(module, NoisyLinear)],
        "requires_grad": [parameter.requires_grad for parameter in model.parameters()],
        "grads": [parameter.grad is None for parameter in model.parameters()],
        "cpu_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def assert_unchanged(model: nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["tensors"].keys() == before["tensors"].keys()
    for name, tensor in before["tensors"].items():
        assert torch.equal(after["tensors"][name], tensor), f"{name} changed"
    for key in ("modes", "noise", "requires_grad", "grads"):
        assert after[key] == before[key], key
    assert torch.equal(after["cpu_rng"], before["cpu_rng"]), "the global CPU generator moved"
    if before["cuda_rng"] is not None:
        assert all(torch.equal(a, b) for a, b in zip(after["cuda_rng"], before["cuda_rng"])), "a CUDA generator moved"


def loud(model: nn.Module, factor: float) -> nn.Module:
    """A copy of a NoisyNet whose noise scales are ``factor`` times larger."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for layer in twin.modules():
            if isinstance(layer, NoisyLinear):
                layer.weight_sigma.mul_(factor)
                layer.bias_sigma.mul_(factor)
    return twin


def shuffled(units: torch.Tensor, seed: int) -> torch.Tensor:
    """Each state's attributions permuted among its units: a map with the right values in the wrong places."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([row[torch.randperm(row.numel(), generator=generator)] for row in units])


def frozen_clock() -> float:
    """A clock that never moves (a module function: a spawned DDP worker unpickles it)."""
    return 0.0


def cpu_seconds(_writer: PictureWriter) -> float:
    """``PictureWriter.cpu_seconds``, not counted (its name: a pickled bound method is looked up by it)."""
    return 0.0


REAL_CPU_SECONDS = PictureWriter.cpu_seconds  # the callback's background, for a test that counts it


@contextlib.contextmanager
def checks_without_budget() -> Iterator[None]:
    """The callback's budget on a frozen clock, the background threads not counted: every run in full, every trust
    check at the first run of a fit and each again every ``CHECK_EVERY`` runs, whatever the machine's speed.

    A fit in a test is short and tiny, so a wall-clock budget would defer and reduce its runs differently from one
    run of the suite to the next; the suite runs on this (tests/conftest.py), and the budget's decisions are tested
    on their own fake clocks (tests/callback/test_budget.py).
    """
    saved = budget.default_clock, PictureWriter.cpu_seconds
    budget.default_clock, PictureWriter.cpu_seconds = frozen_clock, cpu_seconds  # type: ignore[method-assign]
    try:
        yield
    finally:
        budget.default_clock, PictureWriter.cpu_seconds = saved  # type: ignore[method-assign]


def trust_scalar_tags(prefix: str, *, noisy: bool) -> list[str]:
    """Every scalar tag the trust checks log under ``prefix`` (``"ig"`` or ``"ig/<name>"``): the stability check's
    only for a model with NoisyLinear layers (``noisy``). A check's tags appear at the runs it makes."""
    tags = [
        "sanity/randomization_rank_correlation",
        "sanity/copy_rank_correlation",
        "faithfulness/deletion_auc",
        "faithfulness/deletion_auc_random",
        *(["stability/noise_rank_correlation"] if noisy else []),
        "trust/status",
    ]
    return [f"{prefix}/{tag}" for tag in tags]


def reinitialised_copy(model: nn.Module, seed: int) -> tuple[nn.Module, int, int]:
    """A copy of ``model`` with every parameter drawn again under ``seed``: ``(copy, shuffled, kept)``."""
    clone = structure_copy(model)
    return (clone, *redraw(clone, seed))
