"""A ``target="each"`` run of a small float64 network, as the callback hands it on: a row per (state, action)."""

from __future__ import annotations

from typing import Any

import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.callback.per_action import pair_rows
from lightning_ig.run.actions import ActionSummary
from lightning_ig.run.host_result import HostResult

__all__ = ["FEATURES", "NAMES", "each_run"]

NAMES = ["noop", "left", "right"]
FEATURES = ["x", "v", "theta", "omega", "extra"]


def each_run() -> dict[str, Any]:
    """Every action's Q on 9 states: the result, its host result, the Q-values and the run per action."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    states = torch.randn(9, 5, dtype=torch.float64)
    result = integrated_gradients(model, states, target="each", n_steps=32)
    host = HostResult.from_result(pair_rows(result), keep_attributions=True)
    with torch.no_grad():
        q_values = model(states).numpy()
    return {
        "result": result,
        "host": host,
        "q_values": q_values,
        "summary": ActionSummary.of_each(host, host.attributions, NAMES),
    }
