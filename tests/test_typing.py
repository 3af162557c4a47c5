"""A user's type checker reads the public API as the README uses it: a typed script of its snippets passes
``mypy --strict``, but for the lines marked ``# E: <part of the error>``, which must fail so (were the package's
names ``Any``, they would pass).

The script is only type-checked, never run. mypy runs with the repository's configuration (the script asks for
``--strict``'s per-module flags inline), so it shares the cache that ``.ci/run``'s ``mypy`` fills: seconds once warm.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support import REPO

mypy_api = pytest.importorskip("mypy.api")

USER_SCRIPT = """\
# mypy: disallow-untyped-defs, disallow-incomplete-defs, disallow-untyped-calls, disallow-untyped-decorators
# mypy: disallow-any-generics, disallow-subclassing-any, warn-return-any
from __future__ import annotations

import dataclasses
from typing import Literal

import lightning as L
import torch
from torch import Tensor

from lightning_ig import DuelingQNetwork, IntegratedGradientsCallback, integrated_gradients, noise_disabled
from lightning_ig.attribution import IGOptions
from lightning_ig.models import attribution_mode
from lightning_ig.run import accuracy_verdict
from lightning_ig.views import ViewOptions
from lightning_ig import IntegratedGradientCallback  # E: has no attribute "IntegratedGradientCallback"


def callback(held_out: Tensor, agent: L.LightningModule) -> float:
    ig = IntegratedGradientsCallback(
        held_out,
        every_n_steps=500,
        feature_names=["cart position", "cart velocity", "pole angle", "pole angular velocity"],
        target="mean",
        engine=IGOptions(n_steps="auto"),
        views=ViewOptions(top_k=5, figure_every_n_runs=20),
    )
    L.Trainer(max_steps=50_000, callbacks=[ig]).fit(agent)
    # the options read back as attributes, typed as checked
    engine: IGOptions = dataclasses.replace(ig.engine, n_steps=64)
    every: int | None = ig.every_n_steps
    names: list[str] | None = ig.feature_names
    budget: float = 0.0 if ig.overhead is None else ig.overhead
    on_nan: Literal["warn", "raise"] = ig.on_non_finite
    print(engine, every, names, on_nan, ig.views.top_k, ig.history)
    ig.every_n_steps = 1  # E: Property "every_n_steps" defined in "Options" is read-only
    return budget


def engine(q_network: torch.nn.Module, states: Tensor) -> str:
    q_network.eval()
    result = integrated_gradients(q_network, states, target="mean")
    # every result has its per-state figures (B,): no None to rule out first
    per_state: Tensor = torch.maximum(result.attribution_error, result.mass_relative_error)
    flagged: Tensor = result.near_baseline & (result.attribution_mass > 0)
    verdict = accuracy_verdict(result.worst_attribution_error, result.worst_mass_relative_error, 0.01)
    print(per_state, flagged, result.grouped("channels").shape)
    return verdict.reason


def models() -> int:
    net = DuelingQNetwork(4, 2)
    with attribution_mode(net) as same, noise_disabled(same) as quiet:  # the model given, typed as given
        return same.num_actions + quiet.num_actions
"""


def test_the_readme_snippets_type_check_strictly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    monkeypatch.setenv("MYPYPATH", str(REPO))  # this checkout's package, whatever is installed
    stdout, stderr, _ = mypy_api.run(
        [str(script), "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(REPO / ".mypy_cache")]
    )
    assert not stderr, stderr
    found: dict[int, str] = {}
    for line in stdout.splitlines():
        where, _, error = line.partition(": error: ")
        if error:
            number = int(where.rsplit(":", 1)[1])
            found[number] = found.get(number, "") + error
    marked = {
        number: line.split("# E: ", 1)[1] for number, line in enumerate(USER_SCRIPT.splitlines(), 1) if "# E: " in line
    }
    assert sorted(found) == sorted(marked), textwrap.indent(stdout, "  ")
    for number, part in marked.items():
        assert part in found[number], (number, found[number])
