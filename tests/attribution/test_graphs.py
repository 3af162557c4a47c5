"""How a computation is captured as a graph: the fallback to the torch twins, then to eager after one warning (the
capture emulated on the CPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_ig.attribution import IntegratedGradients, integrated_gradients
from tests.support.graphs import EmulatedCapture, FailingCapture, KernelsThatCannotBeCaptured
from tests.support.models import seeded_dueling
from tests.support.tolerance import assert_close_scaled


def test_graph_capture_falls_back_to_the_torch_twins_when_the_kernels_cannot_be_captured() -> None:
    capture = EmulatedCapture()
    model = seeded_dueling(3, 2, seed=46)
    engine = IntegratedGradients(
        model, graph_capture=capture, backend=KernelsThatCannotBeCaptured(capture), target="mean", n_steps=4
    )
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="captured the torch twins instead"):
        result = engine.attribute(x)
    assert capture.attempts == 2 and result.cuda_graph and result.backend == "torch"
    again = engine.attribute(x)
    assert engine.last_mode == "graph" and again.backend == "torch" and len(capture.graphs) == 1
    assert_close_scaled(
        again.attributions,
        integrated_gradients(model, x, target="mean", n_steps=4).attributions,
        ulps=4,
        dtype=torch.float64,
    )


def test_graph_capture_failure_falls_back_to_eager_once() -> None:
    capture = FailingCapture()
    model = seeded_dueling(3, 2, seed=43)
    engine = IntegratedGradients(model, graph_capture=capture, target="mean", n_steps=4)
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture of the attribution failed"):
        result = engine.attribute(x)
    assert engine.last_mode == "eager" and not result.cuda_graph and capture.attempts == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.attribute(x)  # remembered: no second attempt, no second warning
    assert capture.attempts == 1
    assert_close_scaled(
        result.attributions,
        integrated_gradients(model, x, target="mean", n_steps=4).attributions,
        ulps=4,
        dtype=torch.float64,
    )
