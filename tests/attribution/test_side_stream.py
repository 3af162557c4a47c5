"""The side-stream runs (attribution.side_stream) on the CPU: the snapshot, what it covers, the same numbers.

The CPU has no streams: the steps run in order, with the graph capture emulated (tests/support/graphs.py), which
is what the tests need to see: that a run reads the snapshot (not the live weights), that the snapshot holds what
the forward reads and nothing it cannot cover, and that a run's host result is the one the engine's own replay gives,
bit for bit. The streams themselves are tested on a GPU (test_side_stream_gpu.py).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from lightning_ig.attribution import IntegratedGradients
from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.host_result import HostResult
from lightning_ig.attribution.side_stream import SideStream, WeightSnapshot
from lightning_ig.models.noise import NoisyLinear, noise_disabled
from tests.support.graphs import EmulatedCapture
from tests.support.results import FoundCalibration, assert_same_host_results


class _Net(nn.Module):
    """(4, 10, 10) frames -> 3 outputs: a convolution, ReLU, a NoisyLinear head (noise off while attributing)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, stride=2)
        self.head = NoisyLinear(6 * 4 * 4, 3)
        self.unused = nn.Linear(3, 3)  # never read by the forward: not in the snapshot

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def _setup(baselines: Any = "zeros", target: Any = "mean", **host: Any) -> tuple[_Net, torch.Tensor, Any, dict]:
    torch.manual_seed(0)
    model = _Net().eval()
    states = torch.rand(5, 4, 10, 10)
    options = {"num_states": 5, "groups": None, "keep_attributions": True, "sample_states": 2, **host}
    return model, states, baselines, options


def _side(model: nn.Module, states: torch.Tensor, baselines: Any, options: dict, **engine: Any) -> SideStream:
    defaults = {"target": "mean", "n_steps": 16, **engine}
    source = IntegratedGradients(model, graph_capture=EmulatedCapture(), **defaults)
    side = SideStream.prepare(source, model, states, baselines, options, mode=lambda: noise_disabled(model))
    assert side is not None
    return side


def _reference(model: nn.Module, states: torch.Tensor, baselines: Any, options: dict, **engine: Any) -> HostResult:
    """The engine's own replay on the live model (the run on the training stream), brought to the host."""
    defaults = {"target": "mean", "n_steps": 16, **engine}
    engine_ = IntegratedGradients(model, graph_capture=EmulatedCapture(), **defaults)
    with noise_disabled(model):
        engine_.attribute(states, baselines=baselines)  # the capture
        result = engine_.attribute(states, baselines=baselines)
    assert engine_.last_mode == "graph"
    return HostResult.from_result(result, **options)


@pytest.mark.parametrize(
    ("baselines", "groups", "target", "n_steps"),
    [
        ("zeros", None, "mean", 16),
        ("zeros", "channels", "mean", 16),
        ("tensor", None, 1, 16),
        ("zeros", None, "contrast", 16),
        ("zeros", None, "mean", "budget"),  # the default: a number chosen for the shape before the capture
    ],
)
def test_a_side_run_gives_the_engines_replay_bit_for_bit(baselines: str, groups: Any, target: Any, n_steps) -> None:
    model, states, _, options = _setup()
    given = torch.full_like(states, 0.25) if baselines == "tensor" else baselines
    options["groups"] = None if groups is None else FeatureGroups.resolve(groups, (4, 10, 10))
    side = _side(model, states, given, options, target=target, n_steps=n_steps)
    for step in range(3):  # the capture, then replays (of both graphs where the baselines are zeros)
        side_result = side.start().result()
        reference = _reference(model, states, given, options, target=target, n_steps=n_steps)
        assert_same_host_results(side_result, reference)
        with torch.no_grad():  # an optimizer step between runs
            for parameter in model.parameters():
                parameter.add_(0.01 * (step + 1))
    assert (side._replay is not None) == (baselines == "zeros")


def test_a_replay_reads_the_snapshot_not_the_live_weights() -> None:
    model, states, baselines, options = _setup()
    side = _side(model, states, baselines, options)
    side.start().result()  # the capture
    before = side.start().result()
    assert side._replay is not None
    with torch.no_grad():
        model.conv.weight.mul_(2.0)  # training writes the live weights while a replay would run
    again = side._replay.start().result()  # replayed without a refresh: the snapshot as it was
    np.testing.assert_array_equal(again.f_input, before.f_input)
    refreshed = side.start().result()  # the next run's start copies the new weights in
    assert not np.array_equal(refreshed.f_input, before.f_input)
    assert_same_host_results(refreshed, _reference(model, states, baselines, options))


def test_the_snapshot_holds_what_the_forward_reads_with_the_noise_off() -> None:
    model = _Net()
    with noise_disabled(model):
        found = WeightSnapshot.find(model, model, torch.rand(2, 4, 10, 10))
    assert isinstance(found, WeightSnapshot)
    assert sorted(found.names) == ["conv.bias", "conv.weight", "head.bias_mu", "head.weight_mu"]
    for name, static in found.names.items():
        live = model.get_parameter(name)
        assert static is not live and torch.equal(static, live) and static.requires_grad == live.requires_grad
    assert found.nbytes() == sum(model.get_parameter(name).numel() * 4 for name in found.names)


def test_tied_weights_share_one_static_copy() -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    model = nn.Sequential(first, nn.Tanh(), second)
    found = WeightSnapshot.find(model, model, torch.rand(2, 4))
    assert isinstance(found, WeightSnapshot)
    assert found.names["0.weight"] is found.names["2.weight"]


def test_a_users_forward_of_the_module_is_reparametrised_too() -> None:
    model, states, baselines, options = _setup()

    def value(x: torch.Tensor) -> torch.Tensor:  # what forward=callable(pl_module, x) becomes
        return model(x).max(1).values

    source = IntegratedGradients(value, graph_capture=EmulatedCapture(), n_steps=16)
    side = SideStream.prepare(source, model, states, baselines, options, mode=lambda: noise_disabled(model))
    assert side is not None and "conv.weight" in side.snapshot.names
    side.start().result()
    before = side.start().result()
    with torch.no_grad():
        model.head.weight_mu.add_(1.0)
    np.testing.assert_array_equal(side._replay.start().result().f_input, before.f_input)


class _ReadsAGlobal(nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.scale = scale  # a plain attribute, not a buffer: no snapshot can cover it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


class _WritesABuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.linear(x)


@pytest.mark.parametrize(
    ("model", "engine", "reason"),
    [
        (_ReadsAGlobal(torch.ones(2)), {}, "not its module's parameters or buffers"),
        (_WritesABuffer(), {}, "writes tensors it did not make"),
        (nn.Linear(4, 2), {"n_steps": "auto"}, "no graph to replay"),
        (nn.Linear(4, 2), {"gradient": "finite_difference"}, "no graph to replay"),
        (nn.Linear(4, 2), {"cuda_graph": False}, "no CUDA graph"),
    ],
)
def test_no_side_stream_where_a_snapshot_cannot_cover_the_run(
    model: nn.Module, engine: dict, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = IntegratedGradients(model, graph_capture=EmulatedCapture(), target="mean", **engine)
    with caplog.at_level(logging.DEBUG, logger="lightning_ig"):
        side = SideStream.prepare(source, model, torch.rand(3, 4), "zeros", {}, mode=contextlib.nullcontext)
    assert side is None
    assert reason in caplog.text and "stays on the training stream" in caplog.text
    assert not any(record.levelno >= logging.WARNING for record in caplog.records)  # debug only: no warning


def test_a_calibrated_scale_is_followed_with_the_same_graphs() -> None:
    model, states, baselines, options = _setup()
    side = _side(model, states, baselines, options)
    side.start().result()
    side.start().result()
    replay, captures = side._replay, side.engine.graph_capture.attempts
    side.source.use_calibration(FoundCalibration("riemann_middle", 0.25))  # the same rule, a new scale
    scaled = side.start().result()
    assert side._replay is replay and side.engine.graph_capture.attempts == captures
    assert scaled.error_scale == 0.25
    assert_same_host_results(scaled, _reference(model, states, baselines, options, error_scale=0.25))


def test_a_calibrated_rule_is_captured_and_followed() -> None:
    model, states, baselines, options = _setup()
    side = _side(model, states, baselines, options)
    side.start().result()
    side.start().result()
    side.source.use_calibration(FoundCalibration("gausslegendre", 0.5))
    first = side.start().result()  # the new rule's capture
    second = side.start().result()  # and its replay
    assert first.method == second.method == "gausslegendre"
    reference = _reference(model, states, baselines, options, method="gausslegendre", error_scale=0.5)
    assert_same_host_results(first, reference)
    assert_same_host_results(second, reference)
