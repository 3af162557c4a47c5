"""IG on a convolutional network is the same bit for bit from call to call and from replay to replay on a GPU.

cuDNN's own choice of algorithm for a convolution's backward can sum with atomics; measured on an H200 before the
engine held cuDNN to its deterministic algorithms, a Nature-CNN's attributions differed from call to call by up to
6e-11 and their completeness deltas by 3e-9. The global flags are left as a user might set them for speed
(``benchmark=True``, ``deterministic=False``). And states on the CPU for a model on the GPU: the error says which
to move.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from lightning_ig.models import NatureQNetwork

pytestmark = pytest.mark.gpu


@pytest.fixture
def fast_cudnn() -> Iterator[None]:
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


def _network_and_states(device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(3)
    network = NatureQNetwork(in_channels=4, num_actions=6, noisy=False).to(device).eval()
    states = torch.rand((16, 4, 84, 84), generator=torch.Generator().manual_seed(4)).to(device)
    return network, states


@pytest.mark.usefixtures("fast_cudnn")
def test_eager_calls_on_a_conv_net_are_bit_identical(cuda_device: torch.device) -> None:
    network, states = _network_and_states(cuda_device)
    first = integrated_gradients(network, states, target="mean", n_steps=32)
    for _ in range(3):
        again = integrated_gradients(network, states, target="mean", n_steps=32)
        assert torch.equal(again.attributions, first.attributions)
        assert torch.equal(again.delta, first.delta)
    assert torch.backends.cudnn.deterministic is False  # the user's setting, put back


@pytest.mark.usefixtures("fast_cudnn")
def test_replays_on_a_conv_net_are_bit_identical_and_equal_the_eager_call(cuda_device: torch.device) -> None:
    network, states = _network_and_states(cuda_device)
    engine = IntegratedGradients(network, target="mean", n_steps=32)
    engine.attribute(states)  # the capture
    first = engine.attribute(states)
    assert engine.last_mode == "graph"
    for _ in range(3):
        again = engine.attribute(states)
        assert torch.equal(again.attributions, first.attributions)
        assert torch.equal(again.delta, first.delta)


def test_states_on_another_device_than_the_model_say_which_to_move(cuda_device: torch.device) -> None:
    network, states = _network_and_states(cuda_device)
    with pytest.raises(ValueError, match=r"inputs are on cpu but the model's parameters are on cuda:\d; move one"):
        integrated_gradients(network, states[:2].cpu(), target="mean", n_steps=4)
