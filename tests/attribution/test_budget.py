"""n_steps="budget" and method="auto" (lightning_ig/attribution/budget.py): the work counted, the number of points
and the rule chosen from it."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from lightning_ig.attribution import budget as budget_module
from lightning_ig.attribution.budget import PROFILES, STEP_CHOICES, Profile, budget_steps, row_flops
from lightning_ig.attribution.kinks import BUDGET_NODES
from lightning_ig.models import NoisyLinear


class _Counted(torch.nn.Module):
    """A module that counts its forward calls and the rows they held."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls, self.rows = inner, 0, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.rows += x.shape[0]
        return self.inner(x)


def _mlp(features: int = 4, hidden: int = 32, outputs: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, outputs)
    ).eval()


def test_a_forward_row_counts_two_flops_per_weight_use() -> None:
    mlp = _mlp(4, 32, 3)
    assert row_flops(mlp, torch.zeros(1, 4)) == (2 * (4 * 32 + 32 * 3), 3)
    conv = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, stride=2), torch.nn.Flatten()).eval()
    # a 9x9 frame, 3x3 kernel, stride 2: 4x4 outputs per channel, each 4 x 3 x 3 multiply-adds
    assert row_flops(conv, torch.zeros(1, 4, 9, 9)) == (2 * (4 * 3 * 3) * 8 * 16, 128)
    noisy = NoisyLinear(6, 5).eval()  # two weight matrices (mean and noise scale): one product is counted
    assert row_flops(noisy, torch.zeros(1, 6)) == (2 * 6 * 5, 5)
    assert row_flops(lambda z: (z**2).sum(-1), torch.zeros(1, 3)) == (0, 1)  # no module: nothing to count
    # a weight made by a parametrization (weight_norm, spectral_norm) is the layer's: counted once, for the layer
    normed = torch.nn.Sequential(
        torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 32)),
        torch.nn.ReLU(),
        torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(32, 3)),
    ).eval()
    assert row_flops(normed, torch.zeros(1, 4)) == row_flops(mlp, torch.zeros(1, 4))


def test_the_choice_is_the_most_points_whose_work_fits() -> None:
    mlp = _mlp(4, 32, 3)
    per_row = 2 * (4 * 32 + 32 * 3) * 2  # a forward and one backward
    row = torch.zeros(1, 4)
    budget = PROFILES["cpu"].flops
    for n in STEP_CHOICES:
        fits = int(budget // (n * per_row))  # the most states whose work at n points fits
        assert budget_steps(mlp, row, fits, each=False, finite_difference=False) == n
        smaller = next((m for m in STEP_CHOICES if m < n), STEP_CHOICES[-1])
        assert budget_steps(mlp, row, fits + 1, each=False, finite_difference=False) == smaller
    assert budget_steps(mlp, row, 10**9, each=False, finite_difference=False) == 64  # nothing fits: the fewest
    few = int(budget // (256 * per_row))
    # target="each": a backward per output (1 + 3 passes instead of 2); finite differences: 2 F forwards a node
    assert budget_steps(mlp, row, few, each=True, finite_difference=False) == 128
    assert budget_steps(mlp, row, few // 2, each=True, finite_difference=False) == 256
    assert budget_steps(mlp, row, few // 4, each=False, finite_difference=True) == 256
    assert budget_steps(mlp, row, few // 4 + 1, each=False, finite_difference=True) == 128
    assert budget_steps(lambda z: (z**2).sum(-1), row, 1, each=False, finite_difference=False) == 64


class _CudaRow:
    """A row on a CUDA device, as far as :func:`budget_steps` looks (its work counted by a stand-in)."""

    device = torch.device("cuda", 0)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(4)


def test_a_gpu_budget_scales_with_its_multiprocessors(monkeypatch: pytest.MonkeyPatch) -> None:
    flops = 2 * (4 * 32 + 32 * 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: types.SimpleNamespace(multi_processor_count=66))
    monkeypatch.setattr(budget_module, "row_flops", lambda *_: (flops, 3))
    profile = PROFILES["cuda"]
    fits = int(profile.flops * 66 / profile.multiprocessors // (256 * 2 * flops))  # half an H200's budget
    row: Any = _CudaRow()
    assert budget_steps(_mlp(), row, fits, each=False, finite_difference=False) == 256
    assert budget_steps(_mlp(), row, fits + 1, each=False, finite_difference=False) == 128


def test_the_default_call_uses_the_chosen_number_and_counts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Counted(_mlp())
    per_row = 2 * row_flops(_mlp(), torch.zeros(1, 4))[0]  # a forward and a backward (another object: not cached)
    # a CPU budget that 8 states x 256 nodes fill: 64 states do not fit even at 64 nodes
    monkeypatch.setitem(budget_module.PROFILES, "cpu", Profile("cpu", 256 * 8 * per_row))
    few, middle, more = torch.randn(8, 4), torch.randn(16, 4), torch.randn(64, 4)
    before = model.calls
    result = integrated_gradients(model, few, target="mean")
    counting = model.calls - before  # the count's one forward, and the call's own
    assert result.n_steps == 256
    explicit = integrated_gradients(model, few, target="mean", n_steps=256)
    assert torch.equal(result.attributions, explicit.attributions)
    own = model.calls - before - counting
    assert counting == own + 1
    again = model.calls
    assert integrated_gradients(model, few, target="mean").n_steps == 256
    assert model.calls - again == own  # the count is remembered per forward, feature shape, dtype and device
    dear = integrated_gradients(model, more, target="mean")  # 64 points: the kink rule, at its own count
    assert (dear.n_steps, dear.method) == (BUDGET_NODES, "kink_midpoint") and result.method == "riemann_middle"
    halved = integrated_gradients(model, middle, target="mean")  # 128 points: the kink rule, at twice 56
    assert (halved.n_steps, halved.method) == (2 * BUDGET_NODES, "kink_midpoint")
    engine = IntegratedGradients(model, target="mean")
    assert engine.attribute(few).n_steps == 256 and engine.attribute(more).n_steps == BUDGET_NODES
    assert engine.attribute(few).n_steps == 256  # one plan per shape, each with its own number


@pytest.mark.parametrize(
    ("options", "method", "n_steps"),
    [
        ({"n_steps": 64}, "kink_midpoint", 64),  # a count: the same choice, at the count given
        ({"n_steps": 128}, "kink_midpoint", 128),
        ({"n_steps": 129}, "riemann_middle", 129),
        ({"n_steps": 64, "gradient": "finite_difference"}, "riemann_middle", 64),  # the kink rule needs autograd
        ({"method": "kink_midpoint"}, "kink_midpoint", BUDGET_NODES),
        ({"method": "riemann_middle"}, "riemann_middle", 64),
        ({"method": "gausslegendre", "n_steps": 20}, "gausslegendre", 20),
    ],
)
def test_method_auto_picks_the_kink_rule_where_points_are_dear(options: dict, method: str, n_steps: int) -> None:
    states = torch.randn(2048, 4)  # more than the CPU's budget holds at 128 points: 64
    result = integrated_gradients(_mlp(), states, target="mean", **options)
    assert (result.method, result.n_steps) == (method, n_steps)


def test_batch_norm_in_train_mode_is_counted_without_moving_its_statistics() -> None:
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    model.train()
    before = [buffer.clone() for buffer in model[1].buffers()]
    flops, width = row_flops(model, torch.randn(1, 4))  # one state: counted on two copies (batch-norm needs two)
    assert (flops, width) == (2 * (4 * 16 + 16 * 1), 1)
    assert all(torch.equal(a, b) for a, b in zip(before, model[1].buffers()))


class _PerStep(torch.nn.Module):
    """A per-timestep MLP on ``(B, T, F)`` states: ``x.view(-1, F)``, then one value per state; with ``in_place``, the
    input is first normalised in place (``x.div_(255)``), as pixel models often do."""

    def __init__(self, features: int = 3, *, in_place: bool = False) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.features, self.in_place = features, in_place
        self.layer = torch.nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_place:
            x.div_(255)
        return self.layer(x.view(-1, self.features)).view(x.shape[0], -1).sum(1)


def test_the_budget_count_gives_a_forward_a_copy_it_may_view_or_change() -> None:
    """n_steps="budget" (the default): a forward that views the batch as ``(-1, F)`` is counted and attributed (the
    count's forward used to get a stride-0 expanded pair, which refuses the view), and one that normalises its input
    in place runs and leaves the caller's states as they were (finite differences: autograd refuses an in-place
    change of a path point)."""
    states = torch.rand(3, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 255
    viewing = _PerStep().double()
    result = integrated_gradients(viewing, states)
    explicit = integrated_gradients(viewing, states, n_steps=result.n_steps, method=result.method)
    assert torch.equal(result.attributions, explicit.attributions)
    kept = states.clone()
    integrated_gradients(_PerStep(in_place=True).double(), states, gradient="finite_difference")
    assert torch.equal(states, kept)
