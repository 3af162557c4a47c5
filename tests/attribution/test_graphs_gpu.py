"""The engine's CUDA-graph capture (attribution/graphs.py) on a GPU: it leaves the training run's cached memory be."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_ig.attribution import IntegratedGradients

pytestmark = pytest.mark.gpu


def test_a_capture_keeps_the_memory_the_caching_allocator_holds(cuda_device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(cuda_device)
    states = torch.rand(16, 32, device=cuda_device)
    block = torch.empty(256 << 20, dtype=torch.uint8, device=cuda_device)  # 256 MiB a training step would reuse
    del block
    torch.cuda.synchronize(cuda_device)
    reserved = torch.cuda.memory_reserved(cuda_device)
    engine = IntegratedGradients(model, target="mean", n_steps=16)
    generator = torch.cuda.get_rng_state(cuda_device)
    first = engine.attribute(states)
    assert engine.last_mode == "capture"
    assert torch.cuda.memory_reserved(cuda_device) >= reserved  # torch.cuda.graph's empty_cache would free it
    second = engine.attribute(states)
    assert engine.last_mode == "graph"
    assert torch.equal(first.attributions, second.attributions)
    assert torch.equal(torch.cuda.get_rng_state(cuda_device), generator)  # training's random stream untouched
