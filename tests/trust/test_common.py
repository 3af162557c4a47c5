"""trust/common.py: the pieces every check shares: generators kept, states picked, units summed, ranks compared."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.trust.common import (
    generators_kept,
    moved_units,
    pick_states,
    rank_correlation,
    state_subset,
    structure_copy,
    unit_sums,
)
from lightning_ig.trust.replica import redraw
from tests.support.tiny import TinyQNet, make_trainer


def test_generators_kept_puts_back_torch_python_and_numpy_generators() -> None:
    model = nn.Linear(2, 2)  # made first: its initialisation draws from torch's generator
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    with generators_kept(model):
        torch.rand(50), random.random(), np.random.rand(7)  # a forward that samples
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_pick_states_spreads_evenly_and_takes_all_when_asked_for_more() -> None:
    assert pick_states(3, 9).tolist() == [0, 4, 8]
    assert pick_states(None, 4).tolist() == [0, 1, 2, 3] == pick_states(10, 4).tolist()


def test_unit_sums_and_moved_units_per_feature_and_per_group() -> None:
    values = torch.arange(8.0).view(2, 4)
    groups = FeatureGroups.resolve({"a": [0, 1], "b": [2, 3]}, (4,))
    assert torch.equal(unit_sums(values, None), values)
    assert unit_sums(values, groups).tolist() == [[1.0, 5.0], [9.0, 13.0]]
    states = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    moved = moved_units(states, torch.zeros_like(states), groups)
    assert moved.tolist() == [[True, False], [False, False]]


def test_state_subset_with_zero_and_tensor_baselines() -> None:
    states = torch.arange(12.0).view(3, 4)
    subset, base, given = state_subset(states, "zeros", torch.tensor([2, 0]))
    assert torch.equal(subset, states[[2, 0]]) and not base.any() and given is None
    _, base, given = state_subset(states, torch.ones(4), torch.tensor([1]))
    assert given is not None and torch.equal(base, torch.ones(1, 4))


def test_rank_correlation_is_spearmans_over_the_included_entries() -> None:
    first, second = np.array([1.0, 2.0, 3.0, 4.0]), np.array([10.0, 20.0, 30.0, -5.0])
    include = np.array([True, True, True, False])
    assert rank_correlation(first, second, include) == 1.0
    assert np.isnan(rank_correlation(first, second, np.array([True, False, False, False])))


def test_structure_copy_copies_the_weights_and_shares_the_rest() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model.replay_buffer = [1, 2, 3]  # not part of the module tree: shared, never copied
    copy = structure_copy(model)
    assert copy.replay_buffer is model.replay_buffer
    with torch.no_grad():
        copy[0].weight.add_(1.0)
    assert not torch.equal(copy[0].weight, model[0].weight)


class _OwnGeneratorNoisy(nn.Module):
    """A noisy layer of another library that draws its noise from a generator of its own, in reset_parameters too."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2, 2))
        self.register_buffer("weight_epsilon", torch.zeros(2, 2))
        self.generator = torch.Generator().manual_seed(5)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        self.reset_noise()

    def reset_noise(self) -> None:
        self.weight_epsilon.copy_(torch.randn(2, 2, generator=self.generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.weight + self.weight_epsilon).T


def test_a_copy_redrawn_leaves_a_layers_own_generator_as_training_left_it() -> None:
    # guards against: the generator shared with the copy, so the sanity check's re-initialised copies (redraw calls
    # every reset_parameters) advanced the layer's noise generator: training's next noise draws, and weights, changed
    model = nn.Sequential(nn.Linear(2, 2), _OwnGeneratorNoisy())
    state = model[1].generator.get_state()
    copy = structure_copy(model)
    redraw(copy, seed=3)
    assert torch.equal(model[1].generator.get_state(), state)
    assert not torch.equal(copy[1].generator.get_state(), state)  # the copy drew from its own


def test_a_copy_of_a_model_with_a_torchscript_part_leaves_the_models_weights_alone() -> None:
    """A ``torch.jit.script`` (or traced) submodule keeps its weights in its C++ module: shared with the copy, the
    copy's ``requires_grad_(False)`` froze them in the model (training stopped updating them) and a re-initialised
    copy's draws overwrote them."""
    model = nn.Sequential(torch.jit.script(nn.Sequential(nn.Linear(2, 3), nn.ReLU())), nn.Linear(3, 1))
    before = [parameter.detach().clone() for parameter in model.parameters()]
    copy = structure_copy(model)
    assert all(parameter.requires_grad for parameter in model.parameters())
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(1.0)
    assert all(torch.equal(now, then) for now, then in zip(model.parameters(), before))


def test_a_copy_of_a_module_fit_compiled_computes_with_its_own_weights() -> None:
    """``trainer.fit(torch.compile(model))``: Lightning sets the module's ``forward`` to a wrapper of the original's
    bound forward; shared, every copy (the sanity check's re-initialised ones) computed with the model's weights."""
    from lightning.pytorch.utilities.compile import from_compiled

    model = from_compiled(torch.compile(TinyQNet(noisy=False, batchnorm=False, dropout=0.0), backend="eager"))
    copy, states = structure_copy(model), torch.randn(4, 4)
    with torch.no_grad():
        copy.body[0].weight.add_(1.0)
        assert torch.equal(copy(states), type(model).forward(copy, states))
        assert not torch.equal(copy(states), model(states))


def test_a_copy_shares_the_hooks_another_object_holds_on_the_modules() -> None:
    """``Trainer(profiler="pytorch")`` hooks every submodule with a method of its record functions' keeper, whose
    records refuse a deep copy: the copy failed (the fit at its start, or every trust check), now the keeper is shared
    and a copy's forward is recorded like the model's."""
    from lightning.pytorch.profilers.pytorch import RegisterRecordFunction

    model, states = TinyQNet(noisy=False, batchnorm=False, dropout=0.0), torch.randn(4, 4)
    with RegisterRecordFunction(model), torch.no_grad():
        model(states)  # its records now hold the profiler's script objects
        copy = structure_copy(model)
        assert torch.equal(copy(states), model(states))
        copy.body[0].weight.add_(1.0)
        assert not torch.equal(copy(states), model(states))


def test_structure_copy_shares_a_lightning_modules_trainer(tmp_path: Path) -> None:
    """A LightningModule's pickled state leaves its trainer out: the copy shares the original's trainer (it used to
    have none, so a forward reading ``self.trainer`` raised on the copy)."""
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0)
    trainer = make_trainer(tmp_path, [])
    model.trainer = trainer
    copy = structure_copy(model)
    assert copy.trainer is trainer and model.trainer is trainer
    assert copy.body[0].weight is not model.body[0].weight
