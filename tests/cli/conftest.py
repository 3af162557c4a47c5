"""The command-line tests' workspace: checkpoints (named, unnamed, two heads), a states file and names, made the
current folder; and the small ReLU checkpoint the verdict tests share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_ig.checkpoint import save_checkpoint, save_merged_checkpoint
from lightning_ig.models import DuelingQNetwork


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 3, hidden_sizes=(16,), activation="tanh")
    states = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    save_checkpoint(net, tmp_path / "q.safetensors", feature_names=["a", "b", "c", "d"], states=states)
    save_checkpoint(net, tmp_path / "unnamed.safetensors", states=states)
    save_merged_checkpoint({"trending": net, "ranging": net}, tmp_path / "heads.safetensors", states=states)
    (tmp_path / "held_out.json").write_text(json.dumps({"states": states[:4].tolist()}))
    (tmp_path / "names.json").write_text(json.dumps(["w", "x", "y", "z"]))
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ReLU ``DuelingQNetwork(4, 3)`` with 24 stored states (the verdict and ``--verify`` tests)."""
    folder = tmp_path_factory.mktemp("verdict")
    torch.manual_seed(5)
    model = DuelingQNetwork(4, 3, hidden_sizes=(16, 16))
    path = folder / "q.safetensors"
    save_checkpoint(model, path, states=torch.randn(24, 4))
    return path
