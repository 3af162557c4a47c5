"""The convolutional dueling NoisyNet Q-networks: shapes, the dueling identity, configs, noise, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lightning_ig import (
    integrated_gradients,
    load_checkpoint,
    noise_disabled,
    save_checkpoint,
)
from lightning_ig.models import (
    ConvDuelingQNetwork,
    DuelingQNetwork,
    MinAtarQNetwork,
    NatureQNetwork,
    build_model,
    model_config,
    model_name,
)
from lightning_ig.models.noise import NoisyLinear
from tests.support.tolerance import assert_close_scaled

CASES = [
    (lambda: MinAtarQNetwork(in_channels=4, num_actions=3), (4, 10, 10), 3),
    (lambda: MinAtarQNetwork(in_channels=10, num_actions=6, hidden_size=32, activation="silu"), (10, 10, 10), 6),
    (lambda: NatureQNetwork(in_channels=4, num_actions=6), (4, 84, 84), 6),
    (
        lambda: ConvDuelingQNetwork((2, 12, 9), 5, conv_layers=((8, 3, 2), (4, 2, 1)), hidden_sizes=(16, 8)),
        (2, 12, 9),
        5,
    ),
]


def _frames(shape: tuple[int, ...], n: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("make", "frame_shape", "num_actions"), CASES)
def test_q_values_have_one_column_per_action_and_mean_is_the_value_stream(make, frame_shape, num_actions) -> None:
    torch.manual_seed(0)
    net = make().eval().requires_grad_(False)
    frames = _frames(frame_shape)
    q_values = net(frames)
    assert q_values.shape == (3, num_actions)
    features = net.features(frames)
    value, advantage = net.head.value(features).squeeze(1), net.head.advantage(features)
    # V + A - mean(A), averaged over actions: a few roundings at the size of V and A
    scale = float(value.abs().max() + advantage.abs().max())
    assert_close_scaled(q_values.mean(dim=1), value, ulps=4 * num_actions, scale=scale)
    # one frame (C, H, W), as Conv2d takes it, is one row of Q-values (it failed in the head's matmul)
    one = net(frames[1])
    assert one.shape == (num_actions,)
    assert_close_scaled(one, q_values[1], ulps=64, scale=float(features[1].abs().max() + q_values[1].abs().max()))


@pytest.mark.parametrize(("make", "frame_shape", "num_actions"), CASES)
def test_config_rebuilds_the_same_architecture_under_its_registered_name(make, frame_shape, num_actions) -> None:
    torch.manual_seed(0)
    net = make()
    name = model_name(net)
    assert name == type(net).__name__  # registered: checkpoints name it without an import path
    rebuilt = build_model(name, model_config(net))
    assert type(rebuilt) is type(net) and rebuilt.config() == net.config()
    rebuilt.load_state_dict(net.state_dict())  # same parameter names and shapes
    frames = _frames(frame_shape)
    torch.testing.assert_close(rebuilt.eval()(frames), net.eval()(frames), rtol=0, atol=0)


def test_presets_are_the_published_shapes() -> None:
    minatar = MinAtarQNetwork(in_channels=4, num_actions=3)
    assert minatar.config() == {
        "in_channels": 4,
        "num_actions": 3,
        "hidden_size": 128,
        "noisy": True,
        "sigma0": 0.5,
        "activation": "relu",
    }
    conv = minatar.encoder[0]
    assert (conv.out_channels, conv.kernel_size, conv.stride) == (16, (3, 3), (1, 1))
    assert minatar.head.state_dim == 16 * 8 * 8 and minatar.head.hidden_sizes == (128,)  # the paper's network
    assert minatar.features(torch.zeros(1, 4, 10, 10)).shape == (1, 128)
    nature = NatureQNetwork(num_actions=6)
    assert [
        (c.out_channels, c.kernel_size[0], c.stride[0]) for c in nature.encoder if isinstance(c, torch.nn.Conv2d)
    ] == [(32, 8, 4), (64, 4, 2), (64, 3, 1)]
    assert nature.head.state_dim == 64 * 7 * 7 and nature.head.stream_hidden_size == 512


def test_noise_changes_q_in_training_and_not_under_noise_disabled() -> None:
    torch.manual_seed(0)
    net = MinAtarQNetwork(in_channels=4, num_actions=3).train()
    frames = _frames((4, 10, 10))
    generator = torch.Generator().manual_seed(1)
    net.reset_noise(generator)
    noisy_first = net(frames)
    net.reset_noise(generator)
    noisy_second = net(frames)
    assert not torch.equal(noisy_first, noisy_second)  # new noise, new Q-values
    with noise_disabled(net):
        quiet_first = net(frames)
        net.reset_noise(generator)
        quiet_second = net(frames)
    torch.testing.assert_close(quiet_first, quiet_second, rtol=0, atol=0)
    assert net.training  # noise_disabled put the mode back
    torch.testing.assert_close(quiet_first, net.eval()(frames), rtol=0, atol=0)  # eval mode: the mean weights


def test_noise_off_gives_a_deterministic_forward_for_integrated_gradients() -> None:
    torch.manual_seed(0)
    net = MinAtarQNetwork(in_channels=4, num_actions=3, activation="silu").train()
    frames = (_frames((4, 10, 10), n=4) > 0.7).float()  # MinAtar frames are 0/1
    with noise_disabled(net):
        result = integrated_gradients(net, frames, target="mean", n_steps=32)
    assert result.attributions.shape == (4, 4, 10, 10)
    assert not result.stochastic and result.num_non_finite == 0  # noise off: the same state, the same value
    assert result.worst_relative_error < 1e-2  # a smooth network: completeness holds at 32 steps


def test_checkpoint_round_trip_rebuilds_the_cnn_with_its_states(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = MinAtarQNetwork(in_channels=4, num_actions=3).eval()
    states = (_frames((4, 10, 10), n=5) > 0.5).float()
    path = save_checkpoint(net, tmp_path / "q.safetensors", states=states)
    loaded = load_checkpoint(path)
    assert isinstance(loaded.model, MinAtarQNetwork) and loaded.model.config() == net.config()
    torch.testing.assert_close(loaded.states, states, rtol=0, atol=0)
    torch.testing.assert_close(loaded.model.eval()(states), net(states), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"input_shape": (4, 10), "num_actions": 3}, ValueError, "input_shape must have 3 entries"),
        ({"input_shape": (4, 10, 0), "num_actions": 3}, ValueError, "input_shape[2] must be >= 1, got 0"),
        (
            {"input_shape": (4, 10, 10), "num_actions": 3, "conv_layers": ((16, 3),)},
            ValueError,
            "conv_layers[0] must have 3",
        ),
        (
            {"input_shape": (4, 10, 10), "num_actions": 3, "conv_layers": "16x3"},
            TypeError,
            "conv_layers must be a sequence",
        ),
        ({"input_shape": (4, 5, 5), "num_actions": 3, "conv_layers": ((8, 6, 1),)}, ValueError, "does not fit a frame"),
        (
            {"input_shape": (4, 10, 10), "num_actions": 3, "activation": "swish"},
            ValueError,
            "activation must be one of",
        ),
        ({"input_shape": (4, 10, 10), "num_actions": 2.5}, TypeError, "num_actions must be an int"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs: dict, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        ConvDuelingQNetwork(**kwargs)


def test_numpy_sizes_build_the_same_network_with_plain_ints_in_its_config() -> None:
    """Gymnasium's ``action_space.n`` is a numpy int: ``DuelingQNetwork(obs_dim, env.action_space.n)`` was refused."""
    for built, plain in (
        (DuelingQNetwork(np.int64(4), np.int64(2), hidden_sizes=(np.int32(8),)), DuelingQNetwork(4, 2, (8,))),
        (MinAtarQNetwork(np.int64(4), np.int64(3), hidden_size=np.int16(16)), MinAtarQNetwork(4, 3, 16)),
        (NatureQNetwork(np.int64(4), np.int64(6)), NatureQNetwork(4, 6)),
    ):
        assert json.dumps(built.config()) == json.dumps(plain.config())  # numpy ints are no JSON: a checkpoint's
    with pytest.raises(TypeError, match="num_actions must be an int"):
        DuelingQNetwork(4, np.float64(2.0))


def test_a_numpy_float_sigma0_is_taken_as_its_value() -> None:
    """A sigma0 read from a config file or computed with numpy (np.float32) was refused as not ``>= 0``."""
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,), sigma0=np.float32(0.25))
    assert json.dumps(net.config()) == json.dumps(DuelingQNetwork(4, 2, hidden_sizes=(8,), sigma0=0.25).config())
    assert net.value[0].sigma0 == 0.25


def test_dueling_identity_mean_q_is_the_value_stream() -> None:
    torch.manual_seed(0)
    net = DuelingQNetwork(5, 3, hidden_sizes=(16, 8), activation="tanh", stream_hidden_size=4).eval()
    x = torch.randn(7, 5)
    q = net(x)
    assert q.shape == (7, 3) and net.features(x).shape == (7, 8)
    # mean over actions of V + A - mean(A) is V up to the rounding of those sums, at the size of Q
    assert_close_scaled(
        q.mean(dim=1, keepdim=True).detach(),
        net.value(net.features(x)).detach(),
        ulps=8,
        scale=float(q.detach().abs().max()),
    )
    noisy_layers = [m for m in net.modules() if isinstance(m, NoisyLinear)]
    assert len(noisy_layers) == 4 and not any(isinstance(m, NoisyLinear) for m in net.body.modules())
    assert not any(isinstance(m, NoisyLinear) for m in DuelingQNetwork(5, 3, noisy=False).modules())
    assert isinstance(DuelingQNetwork(2, 2, hidden_sizes=(4,), activation="softplus").body[1], nn.Softplus)
