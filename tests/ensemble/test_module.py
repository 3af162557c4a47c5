"""The Ensemble target: its forward and member signals, its checks, its config and checkpoint, and IG through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_ig.attribution import integrated_gradients
from lightning_ig.checkpoint import load_checkpoint, save_checkpoint
from lightning_ig.ensemble import (
    Ensemble,
    is_ensemble,
)
from lightning_ig.models import DuelingQNetwork, build_model
from tests.support import REPO
from tests.support.tolerance import assert_close_scaled


def _members(count: int = 3, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [DuelingQNetwork(4, 3, hidden_sizes=(16,), noisy=False, activation="tanh") for _ in range(count)]


def test_ensemble_forward_and_member_signals() -> None:
    members = _members()
    ensemble = Ensemble(members, weights=[0.5, 0.3, 0.2]).eval()
    states = torch.randn(6, 4)
    with torch.no_grad():
        out = ensemble(states)
        reference = _Unfused(members, torch.tensor([0.5, 0.3, 0.2]))(states)
        signals = ensemble.member_signals(states)
    assert out.shape == (6,) and is_ensemble(ensemble) and not is_ensemble(members[0])
    assert_close_scaled(out.double(), reference.double(), ulps=16, scale=1.0)
    assert signals.shape == (6, 3)
    assert_close_scaled(signals.double() @ ensemble.weights.double(), out.double(), ulps=16, scale=1.0)
    assert Ensemble(nn.ModuleList(members)).weights.tolist() == pytest.approx([1 / 3] * 3)


def test_ensemble_rejects_bad_members_and_weights() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        Ensemble([])
    with pytest.raises(TypeError, match=r"members\[1\] must be an nn.Module"):
        Ensemble([nn.Linear(4, 2), "net"])
    with pytest.raises(TypeError, match="members must be a list"):
        Ensemble(nn.Linear(4, 2))
    with pytest.raises(ValueError, match="weights has 2 entries for 3 members"):
        Ensemble(_members(), weights=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"members\[0\] must be \{'name'"):
        Ensemble([{"name": "DuelingQNetwork", "cfg": {}}])
    mixed = Ensemble([nn.Linear(4, 2), nn.Linear(4, 3)])
    with pytest.raises(ValueError, match=r"member 1 \(Linear\) returned \(5, 3\) for 5 states"):
        mixed(torch.zeros(5, 4))


def test_ensemble_config_rebuilds_it_and_a_checkpoint_loads_without_importing_it(tmp_path: Path) -> None:
    ensemble = Ensemble(_members(), weights=[0.5, 0.25, 0.25]).eval()
    rebuilt = build_model("Ensemble", json.loads(json.dumps(ensemble.config())))
    rebuilt.load_state_dict(ensemble.state_dict())
    states = torch.randn(5, 4)
    assert torch.equal(rebuilt.eval()(states), ensemble(states))
    path = save_checkpoint(ensemble, tmp_path / "ensemble.safetensors", states=states)
    assert torch.equal(load_checkpoint(path).model(states), ensemble(states))
    # a fresh process that never imported lightning_ig.ensemble: the name alone must find the class
    code = (
        "import sys, torch; from lightning_ig.checkpoint import load_checkpoint; "
        f"loaded = load_checkpoint({str(path)!r}); "
        "print(type(loaded.model).__name__, loaded.model.weights.tolist(), loaded.model(loaded.states).tolist())"
    )
    root = REPO
    environment = {**os.environ, "PYTHONPATH": str(root)}
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=environment
    ).stdout.split(" ", 1)
    assert output[0] == "Ensemble"
    assert output[1].strip() == f"{[0.5, 0.25, 0.25]} {ensemble(states).tolist()}"


def test_ig_through_the_fused_ensemble_equals_ig_through_plain_torch() -> None:
    members = _members(seed=1)
    weights = torch.tensor([0.6, 0.3, 0.1])
    ensemble = Ensemble(members, weights=weights).eval()
    states = torch.randn(8, 4)
    fused = integrated_gradients(ensemble, states, n_steps=32)
    plain = integrated_gradients(_Unfused(members, weights), states, n_steps=32)
    # forwards differ by a few float32 roundings, gradients too; summed over 32 steps (weights sum to 1)
    scale = float(plain.attributions.abs().max())
    assert_close_scaled(fused.attributions, plain.attributions, ulps=16, scale=scale)
    assert_close_scaled(fused.f_input, plain.f_input, ulps=16, scale=1.0)


def test_completeness_holds_for_the_aggregate_and_every_member_in_one_run() -> None:
    ensemble = Ensemble(_members(seed=2), weights=[0.2, 0.5, 0.3]).eval()
    states = torch.randn(6, 4) * 2
    # smooth members: Gauss-Legendre's order is what makes 48 steps reach 1e-3 (the midpoint rule, the default, is
    # for ReLU networks)
    aggregate = integrated_gradients(ensemble, states, n_steps=48, method="gausslegendre")
    members = integrated_gradients(ensemble.member_signals, states, target="each", n_steps=48, method="gausslegendre")
    assert members.attributions.shape == (3, 6, 4)
    assert aggregate.worst_relative_error < 1e-3
    assert members.worst_relative_error < 1e-3
    # IG is linear in the target: the aggregate's attributions are the weighted members'
    combined = torch.einsum("m,mbf->bf", ensemble.weights, members.attributions)
    assert_close_scaled(combined, aggregate.attributions, ulps=16, scale=float(aggregate.attributions.abs().max()))


class _Unfused(nn.Module):
    """The same math as Ensemble in plain torch ops: the reference for IG through the fused path."""

    def __init__(self, members: list[nn.Module], weights: torch.Tensor) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.register_buffer("weights", weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.stack([member(x) for member in self.members], dim=1)
        return (torch.sigmoid(logits).mean(-1) * self.weights).sum(-1)


def test_members_of_different_dtypes_are_refused_when_the_ensemble_is_made() -> None:
    with pytest.raises(ValueError, match=r"different dtypes \(member 0: torch.float32, member 1: torch.float64\)"):
        Ensemble([nn.Linear(4, 2), nn.Linear(4, 2).double()])
    both = Ensemble([nn.Linear(4, 2), nn.Linear(4, 2)]).double()  # one dtype for all, converted after: fine
    assert both(torch.randn(3, 4, dtype=torch.float64)).dtype == torch.float64
