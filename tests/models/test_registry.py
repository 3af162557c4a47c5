"""DuelingQNetwork, the architecture registry, and safetensors checkpoints (single and merged heads)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from lightning_ig.checkpoint import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    HEADS_KEY,
    STATES_KEY,
    CheckpointError,
    list_heads,
    load_checkpoint,
    load_states,
    merge_checkpoints,
    read_metadata,
    save_checkpoint,
    save_merged_checkpoint,
    states_beside,
)
from lightning_ig.models import DuelingQNetwork, build_model, model_name, register_model, resolve_model_class
from lightning_ig.models.noise import NoisyLinear, noise_disabled
from tests.support.tolerance import assert_close_scaled


class PlainMLP(nn.Module):
    """A user architecture with no config() and no registration: named by import path."""

    def __init__(self, width: int = 3, outputs: int = 2) -> None:
        super().__init__()
        self.layer = nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


# ---------------------------------------------------------------------------------------------
# models


def test_dueling_identity_mean_q_is_the_value_stream() -> None:
    torch.manual_seed(0)
    net = DuelingQNetwork(5, 3, hidden_sizes=(16, 8), activation="tanh", stream_hidden_size=4).eval()
    x = torch.randn(7, 5)
    q = net(x)
    assert q.shape == (7, 3) and net.features(x).shape == (7, 8)
    # mean over actions of V + A - mean(A) is V up to the rounding of those sums, at the size of Q
    assert_close_scaled(
        q.mean(dim=1, keepdim=True).detach(),
        net.value(net.features(x)).detach(),
        ulps=8,
        scale=float(q.detach().abs().max()),
    )
    noisy_layers = [m for m in net.modules() if isinstance(m, NoisyLinear)]
    assert len(noisy_layers) == 4 and not any(isinstance(m, NoisyLinear) for m in net.body.modules())
    assert not any(isinstance(m, NoisyLinear) for m in DuelingQNetwork(5, 3, noisy=False).modules())
    assert isinstance(DuelingQNetwork(2, 2, hidden_sizes=(4,), activation="softplus").body[1], nn.Softplus)


def test_noise_changes_q_in_training_and_not_under_noise_disabled() -> None:
    torch.manual_seed(1)
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    x = torch.randn(3, 4)
    first = net(x)
    net.reset_noise()
    assert not torch.equal(first, net(x))
    with noise_disabled(net):
        mean_q = net(x)
        assert net.training and torch.equal(net(x), mean_q)
    net.eval()
    torch.testing.assert_close(net(x), mean_q, rtol=0, atol=0)


def test_config_round_trips_through_the_registry_and_import_paths() -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8, 8), sigma0=0.3, activation="tanh")
    assert model_name(net) == "DuelingQNetwork"
    rebuilt = build_model("DuelingQNetwork", json.loads(json.dumps(net.config())))
    assert rebuilt.config() == net.config()
    assert model_name(PlainMLP()) == "tests.models.test_registry:PlainMLP"
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
    with pytest.raises(ValueError, match="without ':'"):
        register_model("a:b")
    with pytest.raises(ValueError, match="hidden_sizes\\[1\\]"):
        DuelingQNetwork(4, 2, hidden_sizes=(8, 0))
    with pytest.raises(TypeError, match="state_dim"):
        DuelingQNetwork(4.0, 2)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# checkpoints


def test_save_and_load_rebuild_the_same_function(tmp_path: Path) -> None:
    torch.manual_seed(2)
    net = DuelingQNetwork(4, 3, hidden_sizes=(16,), activation="tanh")
    states = torch.randn(9, 4, dtype=torch.float64)
    path = save_checkpoint(
        net, tmp_path / "sub" / "q.safetensors", feature_names=list("abcd"), states=states, metadata={"run": "7"}
    )
    assert [p.name for p in path.parent.iterdir()] == ["q.safetensors"], "no temporary file is left behind"
    metadata = read_metadata(path)
    assert metadata[ARCHITECTURE_KEY] == "DuelingQNetwork" and json.loads(metadata[CONFIG_KEY]) == net.config()
    assert metadata["run"] == "7"
    with safe_open(str(path), framework="pt") as handle:
        assert handle.get_tensor(STATES_KEY).dtype == torch.float32
    loaded = load_checkpoint(path)
    assert loaded.feature_names == list("abcd") and loaded.prefix is None and list_heads(path) == []
    assert not loaded.model.training
    torch.testing.assert_close(loaded.states, states.float(), rtol=0, atol=0)
    net.eval()
    torch.testing.assert_close(loaded.model(loaded.states), net(states.float()), rtol=0, atol=0)


def test_compiled_and_wrapped_models_save_as_the_model_inside(tmp_path: Path) -> None:
    class OptimizedModuleLookAlike(nn.Module):  # torch.compile's wrapper keeps the model as _orig_mod
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self._orig_mod = inner

    net = DuelingQNetwork(3, 2, hidden_sizes=(4,))
    path = save_checkpoint(OptimizedModuleLookAlike(net), tmp_path / "compiled.safetensors")
    assert read_metadata(path)[ARCHITECTURE_KEY] == "DuelingQNetwork"
    with safe_open(str(path), framework="pt") as handle:
        assert set(handle.keys()) == set(net.state_dict())
    path = save_checkpoint(nn.DataParallel(net), tmp_path / "parallel.safetensors")
    assert load_checkpoint(path).config == net.config()


def test_merged_heads_load_by_prefix_and_fall_back_to_shared_states(tmp_path: Path) -> None:
    torch.manual_seed(3)
    trending, ranging = DuelingQNetwork(3, 2, hidden_sizes=(8,)), DuelingQNetwork(3, 4, hidden_sizes=(6,), noisy=False)
    shared = torch.randn(5, 3)
    own = torch.randn(2, 3)
    path = save_merged_checkpoint(
        {"trending": trending, "ranging": ranging},
        tmp_path / "heads.safetensors",
        feature_names=["p", "q", "r"],
        states={"ranging": own},
    )
    assert list_heads(path) == ["ranging", "trending"]
    loaded = load_checkpoint(path, head="ranging")
    assert loaded.prefix == "ranging__" and loaded.head == "ranging" and loaded.feature_names == ["p", "q", "r"]
    torch.testing.assert_close(loaded.states, own, rtol=0, atol=0)  # stored and read back: exact
    assert loaded.model(own).shape == (2, 4)
    torch.testing.assert_close(loaded.model(own), ranging.eval()(own), rtol=0, atol=0)
    assert load_checkpoint(path, prefix="trending__").states is None
    assert load_checkpoint(path, prefix="ranging").prefix == "ranging__", "a head's bare name works as its prefix"

    a = save_checkpoint(trending, tmp_path / "a.safetensors", states=shared)
    b = save_checkpoint(ranging, tmp_path / "b.safetensors")
    merged = merge_checkpoints({"up": a, "down": b}, tmp_path / "merged.safetensors")
    assert json.loads(read_metadata(merged)[HEADS_KEY])["down"]["architecture"] == "DuelingQNetwork"
    torch.testing.assert_close(load_checkpoint(merged, head="up").states, shared, rtol=0, atol=0)
    torch.testing.assert_close(
        load_checkpoint(merged, head="up").model(shared), trending.eval()(shared), rtol=0, atol=0
    )

    with pytest.raises(CheckpointError, match="holds several heads .*--head"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="heads in it are: .*trending"):
        load_checkpoint(path, head="sideways")


def test_foreign_merged_file_heads_are_inferred_from_keys(tmp_path: Path) -> None:
    net = PlainMLP()
    tensors = {f"{head}__{key}": value.clone() for head in ("x", "y") for key, value in net.state_dict().items()}
    tensors[STATES_KEY] = torch.ones(2, 3)
    save_file(tensors, str(tmp_path / "foreign.safetensors"))
    assert list_heads(tmp_path / "foreign.safetensors") == ["x", "y"]
    with pytest.raises(CheckpointError, match="--model package.module:Class"):
        load_checkpoint(tmp_path / "foreign.safetensors", head="x")
    loaded = load_checkpoint(
        tmp_path / "foreign.safetensors", head="y", architecture="tests.models.test_registry:PlainMLP"
    )
    torch.testing.assert_close(
        loaded.model.layer.weight, net.layer.weight, rtol=0, atol=0
    )  # stored and read back: exact
    torch.testing.assert_close(loaded.states, torch.ones(2, 3), rtol=0, atol=0)


def test_load_errors_are_checkpoint_errors_that_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")
    path = save_checkpoint(DuelingQNetwork(4, 2, hidden_sizes=(8,)), tmp_path / "q.safetensors")
    with pytest.raises(CheckpointError, match="do not fit DuelingQNetwork"):
        load_checkpoint(path, config={"state_dim": 5, "num_actions": 2, "hidden_sizes": [8]})
    with pytest.raises(CheckpointError, match="single-model file"):
        load_checkpoint(path, head="trending")
    with pytest.raises(ValueError, match="reserved prefix"):
        save_checkpoint(DuelingQNetwork(4, 2), tmp_path / "x.safetensors", metadata={"lightning_ig.format": "2"})
    with pytest.raises(ValueError, match="3 names but there are 4 features"):
        save_checkpoint(
            DuelingQNetwork(4, 2), tmp_path / "x.safetensors", feature_names=list("abc"), states=torch.zeros(1, 4)
        )
    assert not (tmp_path / "x.safetensors").exists()


def test_states_files_in_every_format(tmp_path: Path) -> None:
    states = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 7
    (tmp_path / "s.json").write_text(json.dumps({"states": states.tolist()}))
    np.save(tmp_path / "s.npy", states.double().numpy())
    save_file({"states": states}, str(tmp_path / "s.safetensors"))
    for name in ("s.json", "s.npy", "s.safetensors"):
        torch.testing.assert_close(load_states(tmp_path / name), states, rtol=0, atol=0)
    (tmp_path / "one.json").write_text(json.dumps({"states": [1.0, 2.0]}))
    with pytest.raises(CheckpointError, match=r"wrap one state as \[\[\.\.\.\]\]"):
        load_states(tmp_path / "one.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read states"):
        load_states(tmp_path / "bad.json")
    (tmp_path / "s.csv").write_text("1,2\n")
    with pytest.raises(CheckpointError, match=r"\.json, \.npy or \.safetensors"):
        load_states(tmp_path / "s.csv")
    checkpoint = tmp_path / "model.safetensors"
    assert states_beside(checkpoint) is None
    (tmp_path / "model.states.npy").write_bytes((tmp_path / "s.npy").read_bytes())
    assert states_beside(checkpoint) == tmp_path / "model.states.npy"
    assert states_beside(tmp_path / "other.safetensors") is None
    (tmp_path / "states.json").write_text(json.dumps({"states": [[0.0, 1.0, 2.0]]}))
    assert states_beside(tmp_path / "other.safetensors") == tmp_path / "states.json"


# ---------------------------------------------------------------------------------------------
# where checkpoints are written, and what a head prefix may be


@pytest.fixture
def umask():
    """Set the process umask for one test and put the old one back."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


def test_checkpoints_get_the_modes_any_program_output_gets(tmp_path: Path, umask) -> None:
    net = DuelingQNetwork(3, 2, hidden_sizes=(4,))
    umask(0o022)
    assert stat.S_IMODE(save_checkpoint(net, tmp_path / "shared.safetensors").stat().st_mode) == 0o644
    umask(0o077)
    assert stat.S_IMODE(save_checkpoint(net, tmp_path / "private.safetensors").stat().st_mode) == 0o600
    # an overwritten checkpoint keeps its mode, whatever the umask
    (tmp_path / "shared.safetensors").chmod(0o664)
    path = save_merged_checkpoint({"a": net}, tmp_path / "shared.safetensors")
    assert stat.S_IMODE(path.stat().st_mode) == 0o664 and list_heads(path) == ["a"]


def test_checkpoint_paths_are_checked_and_links_written_through(tmp_path: Path) -> None:
    net = DuelingQNetwork(3, 2, hidden_sizes=(4,))
    with pytest.raises(ValueError, match="is a folder"):
        save_checkpoint(net, tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        save_checkpoint(net, fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode), "the FIFO is still there"
    target = save_checkpoint(net, tmp_path / "real.safetensors")
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target.name)
    save_checkpoint(net, link, states=torch.zeros(2, 3))
    assert link.is_symlink() and load_checkpoint(target).states.shape == (2, 3), "the link's target was replaced"
    a = save_checkpoint(net, tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match="also an input"):
        merge_checkpoints({"a": a}, a)
    assert list_heads(a) == [], "the source is intact"


def test_saved_states_and_names_are_checked_once_with_the_shared_words(tmp_path: Path) -> None:
    net = DuelingQNetwork(3, 2, hidden_sizes=(4,))
    nan_states = torch.zeros(2, 3)
    nan_states[1, 2] = float("nan")
    cases = [
        ({"states": nan_states}, "NaN/Inf"),
        ({"states": torch.zeros(0, 3)}, "num_states >= 1"),
        ({"feature_names": ["a", " ", "c"]}, "is blank"),
        ({"feature_names": ["a", "b\nc", "d"]}, "line break"),
        ({"feature_names": ["a", "a", "c"]}, "repeats"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words):
            save_checkpoint(net, tmp_path / "x.safetensors", **kwargs)
    assert not (tmp_path / "x.safetensors").exists()


def test_a_prefix_must_be_a_whole_head(tmp_path: Path) -> None:
    net = DuelingQNetwork(3, 2, hidden_sizes=(4,))
    path = save_merged_checkpoint({"trending": net, "ranging": net}, tmp_path / "heads.safetensors")
    for prefix in ("tre", "trend__", "trending_", "up__"):
        with pytest.raises(CheckpointError, match="heads in it are: ranging, trending"):
            load_checkpoint(path, prefix=prefix)
    assert load_checkpoint(path, prefix="trending__").head == "trending"


def test_states_files_keep_their_precision_on_request(tmp_path: Path) -> None:
    states = np.array([[0.1, 1 / 3], [2.0, -1e-9]])
    np.save(tmp_path / "s.npy", states)
    (tmp_path / "s.json").write_text(json.dumps({"states": states.tolist()}))
    for name in ("s.npy", "s.json"):
        loaded = load_states(tmp_path / name, dtype=torch.float64)
        assert loaded.dtype == torch.float64 and np.array_equal(loaded.numpy(), states)
        assert load_states(tmp_path / name).dtype == torch.float32
    np.save(tmp_path / "big_endian.npy", states.astype(">f8"))
    assert load_states(tmp_path / "big_endian.npy", dtype=torch.float64).numpy().tolist() == states.tolist()
