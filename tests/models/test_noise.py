"""noise_disabled() across the NoisyNet conventions in use: detected, deterministic inside, restored bit for bit."""

from __future__ import annotations

import copy
import enum
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from lightning_ig.models import DuelingQNetwork
from lightning_ig.models.noise import NoisyLinear, attribution_mode, is_noisy_layer, noise_disabled


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------------------------------------
# NoisyLinear


# ---------------------------------------------------------------------------------------------
# Look-alike layers for the conventions noise_disabled() must handle


class TrainingGatedNoisyLinear(nn.Module):
    """TorchRL / Tianshou / Kaixhin style: noise iff self.training, epsilon in buffers."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight_mu = nn.Parameter(torch.randn(n_out, n_in))
        self.weight_sigma = nn.Parameter(torch.full((n_out, n_in), 0.5))
        self.bias_mu = nn.Parameter(torch.randn(n_out))
        self.bias_sigma = nn.Parameter(torch.full((n_out,), 0.5))
        self.register_buffer("weight_epsilon", torch.randn(n_out, n_in))
        self.register_buffer("bias_epsilon", torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return F.linear(
                x,
                self.weight_mu + self.weight_sigma * self.weight_epsilon,
                self.bias_mu + self.bias_sigma * self.bias_epsilon,
            )
        return F.linear(x, self.weight_mu, self.bias_mu)

    def mean_output(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_mu, self.bias_mu)


class CleanRLStyleLayer(nn.Module):
    """Found by a name-only match: sigma_w / eps_w tensors, gated on self.training."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.mu_w = nn.Parameter(torch.randn(n_out, n_in))
        self.sigma_w = nn.Parameter(torch.full((n_out, n_in), 0.3))
        self.register_buffer("eps_w", torch.randn(n_out, n_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.mu_w + self.sigma_w * self.eps_w if self.training else self.mu_w)


class AlwaysNoisyLayer(nn.Module):
    """Adds sigma * epsilon in every mode: only zeroing the epsilon buffer makes it deterministic."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in))
        self.weight_sigma = nn.Parameter(torch.full((n_out, n_in), 0.2))
        self.register_buffer("weight_epsilon", torch.randn(n_out, n_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight + self.weight_sigma * self.weight_epsilon)


class SwitchedLayer(nn.Module):
    """A foreign layer with disable_noise()/enable_noise(); its switch draws random numbers."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        self.use_noise = True
        self.register_buffer("noise", torch.randn(n_out))

    def disable_noise(self) -> None:
        self.use_noise = False
        torch.randn(3)  # e.g. a library that resamples on every switch
        random.random()
        np.random.rand()

    def enable_noise(self) -> None:
        self.use_noise = True
        self.noise.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        return out + self.noise if self.use_noise else out


class NoisyDuelingNet(nn.Module):
    """A container whose class name says 'Noisy': it must not be switched to eval as a whole."""

    def __init__(self) -> None:
        super().__init__()
        self.ours = NoisyLinear(4, 6)
        self.dropout = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(6)
        self.gated = TrainingGatedNoisyLinear(6, 5)
        self.cleanrl = CleanRLStyleLayer(5, 5)
        self.always = AlwaysNoisyLayer(5, 4)
        self.switched = SwitchedLayer(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.switched(self.always(self.cleanrl(self.gated(self.norm(self.dropout(self.ours(x)))))))


def _full_state(model: nn.Module) -> dict[str, object]:
    """Everything noise_disabled() could disturb, as comparable values (bit patterns for tensors)."""
    state: dict[str, object] = {}
    for name, module in model.named_modules():
        state[f"{name}.training"] = module.training
        state[f"{name}.vars"] = {
            k: v for k, v in vars(module).items() if isinstance(v, (bool, int, float, str, type(None)))
        }
        for key, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if tensor is not None:
                state[f"{name}.{key}"] = (id(tensor), _bits(tensor))
    return state


def _rng_states() -> tuple[object, ...]:
    return (random.getstate(), repr(np.random.get_state()), _bits(torch.get_rng_state()))


def test_detection_covers_each_convention_and_skips_containers() -> None:
    model = NoisyDuelingNet()
    found = {name for name, module in model.named_modules() if is_noisy_layer(module)}
    assert found == {"ours", "gated", "cleanrl", "always", "switched"}
    assert not is_noisy_layer(nn.Linear(2, 2)) and not is_noisy_layer(nn.BatchNorm1d(2))


def test_every_convention_is_deterministic_inside_and_restored_exactly_after() -> None:
    torch.manual_seed(0)
    model = NoisyDuelingNet()
    x = torch.randn(7, 4)
    before, rng_before = _full_state(model), _rng_states()
    with noise_disabled(model) as inside:
        assert inside is model
        assert _rng_states() == rng_before, "entering must not advance any random generator"
        # only the training-gated foreign layers go to eval; dropout and batch norm keep training mode
        assert model.training and model.dropout.training and model.norm.training and model.ours.training
        assert not model.gated.training and not model.cleanrl.training and not model.always.training
        assert not model.ours.noise_enabled and not model.switched.use_noise
        h = torch.randn(7, 5)
        torch.testing.assert_close(model.gated(torch.ones(2, 6)), model.gated.mean_output(torch.ones(2, 6)))
        torch.testing.assert_close(model.cleanrl(h), F.linear(h, model.cleanrl.mu_w))
        torch.testing.assert_close(model.always(h), F.linear(h, model.always.weight))
        torch.testing.assert_close(model.ours(x), F.linear(x, model.ours.weight_mu, model.ours.bias_mu))
        model.ours.reset_noise()  # the block may even draw new noise: it is undone on exit
        rng_inside = _rng_states()
    assert _rng_states() == rng_inside, "leaving must not advance any random generator"
    assert _full_state(model) == before


def test_restored_after_an_exception_and_when_nested() -> None:
    torch.manual_seed(2)
    model = NoisyDuelingNet()
    model.switched.use_noise = False  # already off before: must stay off, not be "re-enabled"
    model.gated.eval()
    before = _full_state(model)
    with pytest.raises(RuntimeError, match="boom"), noise_disabled(model):
        with noise_disabled(model):
            model.gated.weight_epsilon.fill_(float("nan"))
        assert not model.ours.noise_enabled, "the inner block restores the outer block's state"
        model.gated.train()
        raise RuntimeError("boom")
    assert _full_state(model) == before


def test_buffers_with_odd_values_come_back_bit_for_bit() -> None:
    layer = TrainingGatedNoisyLinear(3, 2)
    layer.weight_epsilon.copy_(torch.tensor([[-0.0, float("nan"), float("inf")], [1e-45, -1e38, 0.0]]))
    original = layer.weight_epsilon
    before = _bits(layer.weight_epsilon)
    with noise_disabled(layer):
        assert torch.count_nonzero(layer.weight_epsilon) == 0
        layer.weight_epsilon = torch.ones(2, 3)  # re-assigned, not just overwritten
    assert layer.weight_epsilon is original and _bits(layer.weight_epsilon) == before


def test_works_under_inference_mode_and_keeps_autograd_out_of_the_state() -> None:
    model = nn.Sequential(NoisyLinear(3, 4), nn.Tanh(), TrainingGatedNoisyLinear(4, 2))
    before = _full_state(model)
    x = torch.randn(5, 3)
    with torch.inference_mode(), noise_disabled(model):
        first, second = model(x), model(x)
    assert torch.equal(first, second)
    assert _full_state(model) == before
    with pytest.raises(TypeError, match="torch.nn.Module"), noise_disabled("not a model"):  # type: ignore[arg-type]
        pass


def test_a_block_that_changes_nothing_leaves_saved_autograd_tensors_valid() -> None:
    # The training step's graph saved weight_epsilon (for d/d sigma); running IG in between must not
    # bump its version, or the step's backward would fail with "modified by an inplace operation".
    layer = NoisyLinear(3, 2)
    loss = layer(torch.ones(4, 3)).square().sum()
    with noise_disabled(layer):
        layer(torch.ones(4, 3))
    loss.backward()
    assert layer.weight_sigma.grad is not None and layer.weight_sigma.grad.abs().sum() > 0


def test_layers_built_under_inference_mode_are_restored_too() -> None:
    with torch.inference_mode():
        layer = TrainingGatedNoisyLinear(3, 2)
        before = _bits(layer.weight_epsilon)
        with noise_disabled(layer):
            assert torch.count_nonzero(layer.weight_epsilon) == 0
        assert _bits(layer.weight_epsilon) == before and layer.training


def test_our_layers_noise_is_copied_only_when_reset_noise_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(5)
    layer = NoisyLinear(6, 3)
    before = (layer.weight_epsilon.clone(), layer.bias_epsilon.clone())
    copies: list[tuple[int, ...]] = []
    clone = torch.Tensor.clone

    def counting_clone(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copies.append(tuple(self.shape))
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counting_clone)
    with noise_disabled(layer):
        layer(torch.ones(2, 6))
    assert copies == []  # a block that does not redraw the noise copies nothing
    with noise_disabled(layer), noise_disabled(layer):  # nested: both blocks put the first noise back
        layer.reset_noise()
        assert not torch.equal(layer.weight_epsilon, before[0])
    assert (3, 6) in copies
    assert torch.equal(layer.weight_epsilon, before[0]) and torch.equal(layer.bias_epsilon, before[1])


class RebindingSwitchLayer(nn.Module):
    """A foreign switch that re-registers what it owns: a buffer dropped, a parameter replaced, one added."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 3))
        self.register_buffer("noise", torch.randn(2))

    def disable_noise(self) -> None:
        self.noise = None
        self.weight = nn.Parameter(torch.zeros(2, 3))
        self.extra = nn.Parameter(torch.ones(1))

    def enable_noise(self) -> None:  # never called by noise_disabled
        raise AssertionError("noise_disabled restores state, it does not switch back")


def test_a_switch_that_re_registers_tensors_is_undone_with_the_same_objects() -> None:
    layer = RebindingSwitchLayer()
    weight, noise, before = layer.weight, layer.noise, _full_state(layer)
    with noise_disabled(layer):
        assert layer.noise is None and layer.extra is not None
    assert layer.weight is weight and layer.noise is noise and _full_state(layer) == before
    assert [name for name, _ in layer.named_parameters()] == ["weight"]  # the added one is registered as None


class _Mode(enum.Enum):
    ON = "on"
    OFF = "off"


class EnumSwitchLayer(nn.Module):
    """A switch that keeps its state as an Enum member, not a bool."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.mode = nn.Linear(3, 2), _Mode.ON

    def disable_noise(self) -> None:
        self.mode = _Mode.OFF

    def enable_noise(self) -> None:
        self.mode = _Mode.ON


def test_a_switch_kept_as_an_enum_member_is_switched_back_on() -> None:
    layer = EnumSwitchLayer()
    with noise_disabled(layer):
        assert layer.mode is _Mode.OFF
    assert layer.mode is _Mode.ON  # was left OFF: exploration silently gone for the rest of training


def test_noise_changes_q_in_training_and_not_under_noise_disabled() -> None:
    torch.manual_seed(1)
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    x = torch.randn(3, 4)
    first = net(x)
    net.reset_noise()
    assert not torch.equal(first, net(x))
    with noise_disabled(net):
        mean_q = net(x)
        assert net.training and torch.equal(net(x), mean_q)
    net.eval()
    torch.testing.assert_close(net(x), mean_q, rtol=0, atol=0)


@pytest.mark.parametrize("switch", [noise_disabled, attribution_mode])
def test_a_non_module_is_refused_with_a_type_error_that_names_it(switch) -> None:
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got function"), switch(lambda x: x):
        pass


class EpsBufferNorm(nn.Module):
    """An RMSNorm that keeps its numerical ``eps`` as a 0-dim buffer: no noisy layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.register_buffer("eps", torch.tensor(1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_a_norm_layers_scalar_eps_buffer_is_no_noise_sample() -> None:
    model = nn.Sequential(EpsBufferNorm(4), DuelingQNetwork(4, 2, hidden_sizes=(8,)))
    assert not is_noisy_layer(model[0])
    with noise_disabled(model):  # its eps was zeroed: NaN at the all-zero baseline of integrated gradients
        assert model[0].eps.item() > 0 and torch.isfinite(model(torch.zeros(1, 4))).all()


def test_a_model_cast_inside_the_block_keeps_its_dtype_and_its_noise_after() -> None:
    # `with noise_disabled(model): model.double()` (or .to(device)): the buffers went back to the old tensors, in the
    # old dtype and device, beside the converted parameters; a .half() model then failed its next training forward.
    torch.manual_seed(4)
    for cast in (torch.float64, torch.float16):
        model = NoisyDuelingNet()
        expected = copy.deepcopy(model).to(cast)
        with noise_disabled(model):
            model.to(cast)
            model.ours.reset_noise()  # new noise drawn in the block is undone all the same
        for (name, value), (_, wanted) in zip(model.state_dict().items(), expected.state_dict().items(), strict=True):
            assert value.dtype == wanted.dtype and _bits(value) == _bits(wanted), name
        assert model.ours.weight_epsilon is model.ours.get_buffer("weight_epsilon")
        model.norm.eval()  # batch norm has no float16 kernel on every CPU build: its statistics are not the point
        model(torch.randn(3, 4, dtype=cast))


def test_weights_loaded_with_assign_inside_the_block_stay_and_only_the_noise_comes_back() -> None:
    # load_state_dict(assign=True) registers the loaded tensors themselves: every noisy layer's parameters went back to
    # the objects held before the block, the old weights, beside the loaded ones of every other layer.
    torch.manual_seed(5)
    model, trained = NoisyDuelingNet(), NoisyDuelingNet()
    noise = {name: _bits(buffer) for name, buffer in model.named_buffers() if not name.startswith("norm.")}
    with noise_disabled(model):
        model.load_state_dict(trained.state_dict(), assign=True)
    for name, parameter in model.named_parameters():
        assert _bits(parameter) == _bits(trained.get_parameter(name)), name
    for name, buffer in model.named_buffers():  # the noise is put back, as the block promises; the rest is loaded
        assert _bits(buffer) == noise.get(name, _bits(trained.get_buffer(name))), name
