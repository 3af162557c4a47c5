"""trust/replica.py: the working copy computes what the model computes in attribution mode, draws copies and
noise in place, and never writes the model or the training run's generators."""

from __future__ import annotations

import torch
from torch import nn

from lightning_ig.models import NoisyLinear
from lightning_ig.models.noise import attribution_mode
from lightning_ig.trust import AttributionSettings, Replica
from lightning_ig.trust.replica import redraw
from tests.support.tiny import TinyQNet, held_out_states
from tests.support.trust import SETTINGS, assert_unchanged, reinitialised_copy, snapshot


class ForeignNoisy(nn.Module):
    """Another library's noisy layer: noise added in every mode from an epsilon buffer, no switch of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 4, generator=torch.Generator().manual_seed(0)))
        self.register_buffer("weight_epsilon", torch.ones(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.weight + self.weight_epsilon).T


def _synced_forward_is_the_models(replica: Replica, model: nn.Module, states: torch.Tensor) -> bool:
    replica.sync()
    with attribution_mode(model), torch.no_grad():
        expected = model(states)
    with torch.no_grad():
        return torch.equal(replica.module(states), expected)


def test_a_synced_replica_computes_the_models_attribution_mode_forward_bit_for_bit():
    model = TinyQNet()  # batch-norm, dropout and a NoisyLinear head: every mode attribution switches
    model.train()
    states = held_out_states(16)
    with torch.no_grad():
        model(states)  # moves batch-norm's running statistics: the replica must follow them
    replica = Replica(model, SETTINGS)
    with torch.no_grad():
        for parameter in model.parameters():  # an optimizer step after the copy was made
            parameter.add_(0.01)
        model(states)
    before = snapshot(model)
    assert _synced_forward_is_the_models(replica, model, states)
    assert_unchanged(model, before)
    assert model.training  # the model's own modes were never touched


class _Scaled(TinyQNet):
    """A forward that reads a float and a tensor that training sets anew (an observation scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.factor, self.shift = 1.0, torch.zeros(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.factor + self.shift)


def test_a_synced_replica_follows_plain_attributes_training_sets_anew_but_not_the_models_modes():
    model = _Scaled().train()
    states = held_out_states(16)
    replica = Replica(model, SETTINGS)
    model.factor, model.shift = 3.0, torch.full((4,), 0.5)  # set anew: the copy held the old objects
    for layer in model.modules():
        if isinstance(layer, NoisyLinear):
            layer.enable_noise()  # the model's noise switch set anew (on): the copy keeps its own (off)
    assert _synced_forward_is_the_models(replica, model, states)
    assert replica.module.factor == 3.0 and not replica.module.training and model.training
    assert all(not layer.noise_enabled for layer in replica.noisy)  # off for plain forwards, whatever the model's


class _WithScriptedTwin(nn.Module):
    """A net and its ``torch.jit.script`` twin, which shares the net's parameters: the model lists them once, under
    the net's names; the copy's twin holds copies of its own, listed under the twin's names too."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        self.scripted = torch.jit.script(self.net)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scripted(x)


def test_a_replica_of_a_model_with_shared_parameters_follows_them_under_every_name():
    model = _WithScriptedTwin().eval()
    model.inp, model.out = nn.Linear(4, 4), nn.Linear(4, 4)
    model.out.weight = model.inp.weight  # tied: one parameter under two names
    states = held_out_states(8)
    replica = Replica(model, SETTINGS)
    with torch.no_grad():
        for parameter in model.parameters():  # an optimizer step after the copy was made
            parameter.add_(0.01)
    assert _synced_forward_is_the_models(replica, model, states)  # refused as renamed (pruning?) before
    assert replica.module.out.weight is replica.module.inp.weight


def test_redraw_is_the_layers_own_initialisation_and_sync_brings_the_model_back():
    model = TinyQNet().eval()
    states = held_out_states(8)
    replica = Replica(model, SETTINGS)
    before = snapshot(model)
    shuffled, kept = replica.redraw(3)
    clone, expected_shuffled, expected_kept = reinitialised_copy(model, 3)
    assert (shuffled, kept) == (expected_shuffled, expected_kept)
    for (name, mine), (_, theirs) in zip(replica.module.named_parameters(), clone.named_parameters()):
        assert torch.equal(mine, theirs), name
    assert_unchanged(model, before)  # the model's weights and the training run's generators
    replica.sync()
    with attribution_mode(model), torch.no_grad():
        assert torch.equal(replica.module(states), model(states))


def test_redraw_never_writes_a_weight_the_models_hooks_derive():
    # guards against: the copy sharing a pruned (or torch.nn.utils.spectral_norm'd) layer's ``weight``, a plain tensor
    # its forward pre-hook derives, so that the layer's reset_parameters() re-drew the model's own ``weight`` in place
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0).eval()
    torch.nn.utils.prune.l1_unstructured(model.body[0], "weight", amount=0.5)
    torch.nn.utils.spectral_norm(model.body[-1])
    states = held_out_states(8)
    with torch.no_grad():
        model(states)  # the hooks set each ``weight``
    derived = [vars(model.body[i])["weight"].clone() for i in (0, -1)]
    replica = Replica(model, SETTINGS)
    for seed in (3, 4):
        replica.sync()
        replica.redraw(seed)
    assert all(torch.equal(vars(model.body[i])["weight"], d) for i, d in zip((0, -1), derived))
    assert _synced_forward_is_the_models(replica, model, states)


def test_redraw_draws_anew_the_weights_a_hook_derives_from():
    # guards against: a pruned layer's (or a torch.nn.utils.spectral_norm'd one's) weight_orig counted as re-drawn by
    # its reset_parameters(), which draws only the hook's derived ``weight``: the sanity check's copies kept the
    # trained weights and failed it ("the ranking hardly depends on what the weights learnt") for a sound model
    model = TinyQNet(noisy=False, batchnorm=False, dropout=0.0).eval()
    torch.nn.utils.prune.l1_unstructured(model.body[0], "weight", amount=0.5)
    torch.nn.utils.spectral_norm(model.body[-1])
    replica = Replica(model, SETTINGS)
    replica.sync()
    replica.redraw(3)
    for index in (0, -1):
        assert not torch.equal(replica.module.body[index].weight_orig, model.body[index].weight_orig), index


class _Gated(nn.Linear):
    """A layer with its own initialisation (the identity) and a plain tensor constant that no hook computes."""

    def __init__(self, width: int) -> None:
        super().__init__(width, width)
        self.gate = torch.ones(width)

    def reset_parameters(self) -> None:
        nn.init.eye_(self.weight)
        nn.init.zeros_(self.bias)


def test_redraw_leaves_a_plain_tensor_no_hook_computes_to_the_layers_own_initialisation():
    # guards against: any plain tensor attribute taken for a hook's weight, the layer's parameters shuffled after its
    # own initialisation (the identity shuffled into rows of zeros), and the tensor cloned for every sanity copy
    layer = _Gated(4)
    with torch.no_grad():
        layer.weight.fill_(0.5)
    assert redraw(nn.Sequential(layer), 3) == (0, 0)
    assert torch.equal(layer.weight, torch.eye(4))


def test_noise_draws_are_the_layers_own_from_a_private_generator_and_quiet_is_the_mean():
    model = TinyQNet().eval()
    states = held_out_states(8)
    replica = Replica(model, SETTINGS)
    replica.sync()
    twin = TinyQNet().eval()
    twin.load_state_dict(model.state_dict())
    before = snapshot(model)
    replica.noise(seed=5, draw=1, count=2)
    generator = torch.Generator().manual_seed(5)
    noisy_layers = [layer for layer in twin.modules() if isinstance(layer, NoisyLinear)]
    for _ in range(2):  # draw 1 of 2: the second round of each layer's reset_noise
        for layer in noisy_layers:
            layer.reset_noise(generator=generator)
    for layer in noisy_layers:
        layer.train()
    with torch.no_grad():
        with replica.noise_on() as noisy:  # the code path its IG takes
            assert torch.equal(noisy(states), twin(states))
        with attribution_mode(model):  # a plain forward: the mean weights
            assert torch.equal(replica.module(states), model(states))
        replica.quiet()
        with replica.noise_on() as noisy, attribution_mode(model):  # epsilon 0: the mean weights on the noisy path
            assert torch.equal(noisy(states), model(states))
    assert_unchanged(model, before)


def test_another_librarys_noise_is_off_in_the_replica_and_never_copied_from_the_model():
    model = nn.Sequential(ForeignNoisy())
    replica = Replica(model, AttributionSettings(target=0))
    x = torch.ones(3, 4)
    with torch.no_grad():
        assert torch.equal(replica.module(x), x @ model[0].weight.T)  # noise off: the mean weights
        model[0].weight_epsilon.fill_(5.0)
        replica.sync()
        assert torch.equal(replica.module(x), x @ model[0].weight.T)
        replica.redraw(1)  # an initialisation does not switch it back on
        replica.sync()
        assert torch.equal(replica.module(x), x @ model[0].weight.T)
    assert torch.equal(model[0].weight_epsilon, torch.full((2, 4), 5.0))


def test_redraw_keeps_the_tensors_a_captured_graph_reads():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    clone = reinitialised_copy(model, 0)[0]
    pointers = [parameter.data_ptr() for parameter in clone.parameters()]
    redraw(clone, 1)
    assert [parameter.data_ptr() for parameter in clone.parameters()] == pointers  # in place: a replay sees it


class _MixedBuffers(nn.Module):
    """Buffers of every element size in an order that leaves later ones unaligned in the packed bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))  # int64 count
        self.register_buffer("mask", torch.tensor([True, True, False, True, True]))  # 5 bytes
        self.register_buffer("mu", torch.arange(5, dtype=torch.float64))  # 8-byte elements after them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * self.mask - self.mu.float())


def test_packed_weights_of_mixed_element_sizes_unpack_into_another_copy_bit_for_bit():
    torch.manual_seed(0)
    model = _MixedBuffers().train()
    model(torch.randn(8, 5))  # batch-norm's running statistics and count move
    source, target = Replica(model, SETTINGS), Replica(_MixedBuffers(), SETTINGS)
    source.sync()
    target.unpack(source.packed())
    theirs = source.module.state_dict()
    for name, mine in target.module.state_dict().items():
        assert mine.dtype == theirs[name].dtype and torch.equal(mine, theirs[name]), name
    assert int(target.module.net[1].num_batches_tracked) == 1
