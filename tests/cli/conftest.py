"""The command-line tests' workspace: checkpoints (named, unnamed, two heads), a states file and names, made the
current folder."""

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
