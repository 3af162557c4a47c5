"""The side stream on a GPU: the same numbers as the training stream's replay, training untouched, no host sync.

A run's attribution is replayed on a side CUDA stream over a snapshot of the weights
(:mod:`lightning_ig.attribution.side_stream`) while the next training steps run on the training stream. These tests
pin, on a real device and real CUDA graphs: the host result equals the engine's own replay on the training stream
(the forward values bit for bit, the gradient sums up to their rounding: the two graphs are captured apart) and
repeats bit for bit; training that writes the weights while the replay runs never reaches it; a steady run's start
makes no host sync; and a Lightning fit with the callback trains bit for bit as one without it and logs what runs on
the training stream log.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.host_result import HostResult
from lightning_ig.attribution.side_stream import SideStream
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback import fit as fit_module
from lightning_ig.models import NatureQNetwork
from lightning_ig.models.noise import attribution_mode
from tests.support.results import FoundCalibration, assert_same_host_results
from tests.support.tiny import make_trainer
from tests.support.tolerance import assert_close_scaled

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skip(
        reason="the side stream is off (lightning_ig.callback.fit.SIDE_STREAM): a run after a fit ended in a CUDA "
        "launch failure on an H200 (docs/gpu-validation.md); its runs' differences were cuDNN's, now deterministic"
    ),
]

SHAPE = (4, 84, 84)


def _network(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return NatureQNetwork(in_channels=4, num_actions=6, noisy=True).to(device)


def _states(count: int, device: torch.device) -> torch.Tensor:
    return torch.rand((count, *SHAPE), generator=torch.Generator().manual_seed(1)).to(device)


def _options(count: int) -> dict[str, Any]:
    groups = FeatureGroups.resolve("channels", SHAPE)
    return {"num_states": count, "groups": groups, "keep_attributions": True, "sample_states": 4}  # compared below


def _side(network: nn.Module, states: torch.Tensor, **engine: Any) -> SideStream:
    source = IntegratedGradients(network, target="mean", n_steps=engine.pop("n_steps", 32), **engine)
    side = SideStream.prepare(
        source, network, states, "zeros", _options(len(states)), lambda: attribution_mode(network)
    )
    assert side is not None
    return side


def _on_stream(network: nn.Module, states: torch.Tensor, **engine: Any) -> HostResult:
    """The engine's own replay on the training stream, on the live weights."""
    engine_ = IntegratedGradients(network, target="mean", n_steps=engine.pop("n_steps", 32), **engine)
    with attribution_mode(network):
        engine_.attribute(states)  # the capture
        result = engine_.attribute(states)
    assert engine_.last_mode == "graph"
    return HostResult.from_result(result, **_options(len(states)))


def _same_up_to_rounding(got: HostResult, expected: HostResult, n_steps: int) -> None:
    """The side run against the training stream's: two graphs captured apart may run other library kernels for the
    same convolutions (cuDNN picks by the workspace it finds at capture), so the sums of ``n_steps`` gradient terms
    may differ by their rounding; the forward values may not. Prints how far apart they were (``-s``)."""
    np.testing.assert_array_equal(got.f_input, expected.f_input)
    np.testing.assert_array_equal(got.f_baseline, expected.f_baseline)
    same = all(np.array_equal(getattr(got, n), getattr(expected, n)) for n in ("attributions", "delta"))
    difference = float(np.max(np.abs(got.sum_attributions - expected.sum_attributions)))
    print(f"side vs training stream: bit-identical {same}, largest difference of a state's sum {difference:.3g}")
    mass = float(np.max(np.abs(expected.attributions).sum(-1)))
    assert_close_scaled(got.sum_attributions, expected.sum_attributions, ulps=4 * n_steps, scale=mass)
    assert_close_scaled(got.delta, expected.delta, ulps=4 * n_steps, scale=mass)
    largest = float(np.max(np.abs(expected.attributions)))
    assert_close_scaled(got.attributions, expected.attributions, ulps=4 * n_steps, scale=largest)


def test_a_side_run_is_the_training_streams_replay_up_to_rounding(cuda_device: torch.device) -> None:
    network, states = _network(cuda_device), _states(32, cuda_device)
    side = _side(network, states)
    for step in range(4):  # the capture, then replays of both graphs
        _same_up_to_rounding(side.start().result(), _on_stream(network, states), 32)
        with torch.no_grad():
            for parameter in network.parameters():
                parameter.add_(1e-3 * (step + 1))
    assert side._replay is not None
    side.source.use_calibration(FoundCalibration("riemann_middle", 0.3))  # a new scale: the same graphs
    _same_up_to_rounding(side.start().result(), _on_stream(network, states, error_scale=0.3), 32)


def test_side_runs_on_the_same_weights_are_bit_identical(cuda_device: torch.device) -> None:
    network, states = _network(cuda_device), _states(32, cuda_device)
    side = _side(network, states)
    side.start().result()  # the capture
    first = side.start().result()
    for _ in range(3):
        assert_same_host_results(side.start().result(), first)


def test_training_that_writes_the_weights_beside_a_replay_never_reaches_it(cuda_device: torch.device) -> None:
    network, states = _network(cuda_device), _states(64, cuda_device)
    side = _side(network, states, n_steps=64)
    side.start().result()
    side.start().result()
    for _ in range(3):
        before = copy.deepcopy(network)
        transfer = side.start()
        with torch.no_grad():  # on the training stream, queued while the side stream replays
            for _ in range(20):
                for parameter in network.parameters():
                    parameter.mul_(1.01).add_(0.1)
        _same_up_to_rounding(transfer.result(), _on_stream(before, states, n_steps=64), 64)


def test_a_steady_runs_start_makes_no_host_sync(cuda_device: torch.device) -> None:
    network, states = _network(cuda_device), _states(32, cuda_device)
    side = _side(network, states)
    side.start().result()  # the capture (it synchronises, once)
    side.start().result()
    for _ in range(3):
        torch.cuda.set_sync_debug_mode("error")
        try:
            transfer = side.start()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert transfer.event is not None
        transfer.result()
    assert torch.cuda.current_stream(cuda_device) == torch.cuda.default_stream(cuda_device)  # left as it was


class _DQN(pl.LightningModule):
    """A DQN-like update on the device: new noise every step, a frozen target copy, Adam."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.online = NatureQNetwork(in_channels=4, num_actions=6, noisy=True)
        self.target = copy.deepcopy(self.online).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.online(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.online.reset_noise()
        self.target.reset_noise()
        frames = torch.rand((32, *SHAPE), device=self.device)
        q = self.online(frames)[:, 0]
        with torch.no_grad():
            target = self.target(frames).max(1).values
        return nn.functional.smooth_l1_loss(q, target)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.online.parameters(), lr=1e-3)


def _fit(tmp_path: Path, callbacks: list, steps: int = 12) -> tuple[_DQN, pl.Trainer]:
    pl.seed_everything(0)
    model = _DQN()
    trainer = make_trainer(tmp_path, callbacks, steps, accelerator="gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(range(steps), batch_size=None))
    return model, trainer


@pytest.fixture
def deterministic() -> Any:
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


@pytest.mark.usefixtures("deterministic")
def test_a_fit_trains_as_without_the_callback_and_logs_the_training_streams_numbers(
    tmp_path: Path, cuda_device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = torch.rand((16, *SHAPE), generator=torch.Generator().manual_seed(2))
    starts: list[Any] = []
    start = SideStream.start

    def no_sync(side: SideStream) -> Any:  # a steady run's start, in the fit, with syncs as errors
        steady = side._replay is not None and side.source.defaults is side._followed
        if steady:
            torch.cuda.set_sync_debug_mode("error")
        try:
            transfer = start(side)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        starts.append(steady)
        return transfer

    monkeypatch.setattr(SideStream, "start", no_sync)
    monkeypatch.setattr(fit_module, "SIDE_STREAM", True)  # off by default: the mechanism under test
    side_callback = IntegratedGradientsCallback(states, every_n_steps=2, n_steps=16)
    side_model, _ = _fit(tmp_path / "side", [side_callback])
    assert side_callback._fit.side is not None and sum(starts) >= 3  # the steady runs replayed beside training
    monkeypatch.setattr(fit_module, "_side_stream", lambda *args: None)
    stream_callback = IntegratedGradientsCallback(states, every_n_steps=2, n_steps=16)
    stream_model, _ = _fit(tmp_path / "stream", [stream_callback])
    plain_model, _ = _fit(tmp_path / "plain", [])
    for name, value in plain_model.state_dict().items():
        assert torch.equal(value, side_model.state_dict()[name]), name
        assert torch.equal(value, stream_model.state_dict()[name]), name
    # what the runs log: the same numbers up to the rounding of a sum of n_steps terms (the graphs captured apart)
    assert len(side_callback.history) == len(stream_callback.history)
    for side_run, stream_run in zip(side_callback.history, stream_callback.history):
        assert side_run["global_step"] == stream_run["global_step"]
        for key in ("mean_abs", "mean_signed"):
            scale = float(np.max(np.abs(stream_run["mean_abs"])))
            assert_close_scaled(side_run[key], stream_run[key], ulps=4 * 16, scale=scale)
    side_last, stream_last = side_callback._last.completeness, stream_callback._last.completeness
    assert side_last.num_non_finite == stream_last.num_non_finite and side_last.verdict == stream_last.verdict
    values = stream_callback._last.groups.values
    assert_close_scaled(side_callback._last.groups.values, values, ulps=4 * 16, scale=float(np.max(np.abs(values))))
