"""The architecture registry: names and import paths, configs that round-trip, errors that say what to do."""

from __future__ import annotations

import json

import pytest
from torch import nn

from lightning_ig.models import DuelingQNetwork, build_model, model_name, register_model, resolve_model_class
from tests.support.models import PlainMLP


def test_config_round_trips_through_the_registry_and_import_paths() -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8, 8), sigma0=0.3, activation="tanh")
    assert model_name(net) == "DuelingQNetwork"
    rebuilt = build_model("DuelingQNetwork", json.loads(json.dumps(net.config())))
    assert rebuilt.config() == net.config()
    assert model_name(PlainMLP()) == "tests.support.models:PlainMLP"
    assert resolve_model_class("torch.nn:Linear") is nn.Linear
    assert build_model("torch.nn:Linear", {"in_features": 2, "out_features": 1}).in_features == 2


@pytest.mark.parametrize(
    ("name", "config", "words"),
    [
        ("NoSuchModel", {}, "registered models are .*DuelingQNetwork"),
        ("no_such_package.mod:Class", {}, "cannot import module 'no_such_package.mod'"),
        ("torch.nn:NoSuchClass", {}, "has no attribute 'NoSuchClass'"),
        ("math:pi", {}, "not a torch.nn.Module subclass"),
        ("DuelingQNetwork", {"state_dim": 4}, "cannot build model 'DuelingQNetwork'"),
        ("DuelingQNetwork", {"state_dim": 4, "num_actions": 2, "activation": "cubic"}, "activation"),
    ],
)
def test_model_name_errors_say_what_to_do(name: str, config: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build_model(name, config)


def test_register_model_refuses_a_taken_name_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_model("DuelingQNetwork")(PlainMLP)
    for bad in ("a:b", "", " ", " Net"):  # a blank name would be what a checkpoint records
        with pytest.raises(ValueError, match="non-blank string without ':' or edge spaces"):
            register_model(bad)
    with pytest.raises(ValueError, match="hidden_sizes\\[1\\]"):
        DuelingQNetwork(4, 2, hidden_sizes=(8, 0))
    with pytest.raises(TypeError, match="state_dim"):
        DuelingQNetwork(4.0, 2)  # type: ignore[arg-type]
