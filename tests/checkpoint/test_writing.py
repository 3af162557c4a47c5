"""Writing checkpoints: one model, merged heads, files merged into one; the modes, paths and links of each write, the
states and names checked as they are stored, and the model inside a ``torch.compile`` or DataParallel wrapper."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from lightning_ig.checkpoint import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    HEADS_KEY,
    STATES_KEY,
    CheckpointError,
    list_heads,
    load_checkpoint,
    merge_checkpoints,
    read_metadata,
    save_checkpoint,
    save_merged_checkpoint,
)
from lightning_ig.models import DuelingQNetwork


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


def test_a_config_that_does_not_rebuild_the_model_is_refused_at_save_not_at_load(tmp_path: Path) -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    wrong = {"state_dim": 4, "num_actions": 2, "noisy": False}  # the default hidden sizes: other shapes
    path = tmp_path / "q.safetensors"
    with pytest.raises(
        ValueError,
        match=r"builds a DuelingQNetwork that does not take the model.s tensors.*size mismatch for .*could not be",
    ):
        save_checkpoint(net, path, config=wrong)
    assert not path.exists()
    save_checkpoint(net, path, config=net.config())  # the arguments it was built with
    assert load_checkpoint(path).model.config() == net.config()


def test_a_model_on_the_meta_device_is_refused_with_what_to_do_not_torchs_copy_error(tmp_path: Path) -> None:
    """Its tensors hold no values: torch's own words were "Cannot copy out of meta tensor; no data!"."""
    with pytest.raises(ValueError, match=r"model has tensors on the meta device.*'weight' among 2.*load_state_dict"):
        save_checkpoint(nn.Linear(4, 2, device="meta"), tmp_path / "meta.safetensors")
    with pytest.raises(ValueError, match=r"heads\['b'\] has tensors on the meta device"):
        save_merged_checkpoint({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2, device="meta")}, tmp_path / "m.safetensors")
    assert not list(tmp_path.iterdir())


def test_a_model_its_class_cannot_rebuild_without_arguments_is_saved_with_a_warning_saying_how_to_load_it(
    tmp_path: Path,
) -> None:
    """An empty ``Sequential()`` takes none of the tensors: the file is written (the caller may rebuild the model) but
    loads only with a class named at load time, which the warning says; a model that rebuilds says nothing."""
    path = tmp_path / "seq.safetensors"
    with pytest.warns(UserWarning, match=r"Sequential built without arguments .*unexpected.*architecture=.*--model"):
        save_checkpoint(nn.Sequential(nn.Linear(4, 2)), path)
    with pytest.raises(CheckpointError, match="do not fit"):
        load_checkpoint(path, trust_remote_code=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_checkpoint(DuelingQNetwork(4, 2, hidden_sizes=(8,)), path)  # its config() rebuilds it
        save_checkpoint(nn.Sequential(), path)  # no tensors: the empty class takes them all
        save_checkpoint(nn.Linear(4, 2), path, config={"in_features": 4, "out_features": 2})  # the arguments given
    # a class that cannot be built without arguments at all: as unloadable as the Sequential, said the same way
    with pytest.warns(UserWarning, match=r"Linear built without arguments .*missing 2 required.*--model"):
        save_checkpoint(nn.Linear(4, 2), path)


def test_compiled_and_wrapped_models_save_as_the_model_inside(tmp_path: Path) -> None:
    net = DuelingQNetwork(3, 2, hidden_sizes=(4,))
    compiled = torch.compile(net)  # wrapping compiles nothing yet: no compiler needed
    assert set(compiled.state_dict()) != set(net.state_dict())  # the wrapper's keys are not the model's
    for wrapped in (compiled, nn.DataParallel(net), nn.DataParallel(compiled)):
        path = save_checkpoint(wrapped, tmp_path / "wrapped.safetensors")
        assert read_metadata(path)[ARCHITECTURE_KEY] == "DuelingQNetwork"
        with safe_open(str(path), framework="pt") as handle:
            assert set(handle.keys()) == set(net.state_dict())
        assert load_checkpoint(path).config == net.config()


def test_a_pruned_model_saves_the_weights_it_computes_which_its_class_loads(tmp_path: Path) -> None:
    # guards against: torch.nn.utils.prune's weight_orig and weight_mask saved where the class has weight: the file
    # saved without a word and never loaded ("missing [body.0.weight], unexpected [body.0.weight_mask, ...]")
    from torch.nn.utils import prune

    net = DuelingQNetwork(4, 2, hidden_sizes=(8,), noisy=False)
    prune.l1_unstructured(net.body[0], "weight", amount=0.5)
    loaded = load_checkpoint(save_checkpoint(net, tmp_path / "q.safetensors")).model.eval()
    x = torch.randn(5, 4)
    assert torch.equal(loaded(x), net.eval()(x))
    assert prune.is_pruned(net) and "body.0.weight_orig" in net.state_dict()  # the user's model left as it was


@pytest.mark.parametrize(
    ("names", "states"),
    [({"a": ["x"]}, torch.ones(2, 4)), (["x"], torch.ones(2, 4)), (["x"], {"a": torch.ones(2, 4)})],
)
def test_merged_feature_names_must_name_every_feature_of_the_states_as_in_save_checkpoint(tmp_path, names, states):
    # guards against: a merged file written with 1 name for 4 features, refused only later by diag
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="feature_names has 1 names but there are 4 features"):
        save_merged_checkpoint({"a": net, "b": net}, tmp_path / "m.safetensors", feature_names=names, states=states)
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize("states", [torch.ones(2, 4), {"five": torch.ones(2, 4)}])
def test_merged_states_must_have_each_heads_width_as_in_save_checkpoint(tmp_path, states) -> None:
    # guards against: a file whose 4-feature states were stored for a head that takes 5, refused only later by diag
    heads = {"four": DuelingQNetwork(4, 2, hidden_sizes=(8,)), "five": DuelingQNetwork(5, 2, hidden_sizes=(8,))}
    with pytest.raises(ValueError, match="the states of head 'five' have 4 features but the model takes 5"):
        save_merged_checkpoint(heads, tmp_path / "m.safetensors", states=states)
    assert not (tmp_path / "m.safetensors").exists()


def test_a_null_feature_name_is_a_type_error(tmp_path: Path) -> None:
    # guards against: AttributeError 'NoneType' object has no attribute 'strip' (exit 1 from diag's --feature-names)
    with pytest.raises(TypeError, match=r"feature_names must all be strings, got None \(NoneType\)"):
        save_checkpoint(DuelingQNetwork(4, 2), tmp_path / "q.safetensors", feature_names=["a", "b", "c", None])


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
    save_checkpoint(net, tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match=r"goes through '.*a.safetensors', a file; choose a folder"):
        save_checkpoint(net, tmp_path / "a.safetensors" / "deeper" / "b.safetensors")
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
        ({"feature_names": ["a", "b"], "states": torch.zeros(1, 3)}, "2 names but there are 3 features"),
        ({"feature_names": ["a", "b"]}, "2 names but there are 3 features"),  # the network's state_dim: diag's width
        ({"states": torch.zeros(2, 5)}, "states have 5 features but the model takes 3"),
        ({"metadata": {"lightning_ig.format": "2"}}, "reserved prefix"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words):
            save_checkpoint(net, tmp_path / "x.safetensors", **kwargs)
    assert not (tmp_path / "x.safetensors").exists()
    # a model that does not say its width is not asked: its names and states are stored as given
    sequential = nn.Sequential(nn.Flatten(), nn.Linear(6, 2))
    with pytest.warns(UserWarning, match="built without arguments does not take"):  # it loads only with --model
        save_checkpoint(sequential, tmp_path / "y.safetensors", feature_names=list("ab"))
    assert json.loads(read_metadata(tmp_path / "y.safetensors")["lightning_ig.feature_names"]) == ["a", "b"]


def test_a_path_ending_in_a_separator_names_a_folder_even_where_its_parent_exists(tmp_path: Path) -> None:
    """``tmp/new/`` is a folder: refused, not written as a file named ``new`` (it was when ``tmp`` existed)."""
    with pytest.raises(ValueError, match="names a folder"):
        save_checkpoint(DuelingQNetwork(4, 2, hidden_sizes=(8,)), f"{tmp_path}/new{os.sep}")
    assert not (tmp_path / "new").exists()


def test_finite_float64_states_past_float32s_range_are_refused_not_stored_as_inf(tmp_path: Path) -> None:
    states = torch.full((2, 4), 1e300, dtype=torch.float64)
    with pytest.raises(ValueError, match="as stored in float32 holds 8 NaN/Inf"):
        save_checkpoint(DuelingQNetwork(4, 2, hidden_sizes=(8,)), tmp_path / "q.safetensors", states=states)
    assert not (tmp_path / "q.safetensors").exists()
