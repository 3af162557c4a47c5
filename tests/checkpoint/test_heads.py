"""Merged checkpoints: which heads a file holds, and which keys a head or a prefix selects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lightning_ig.checkpoint import load_checkpoint, save_checkpoint, save_merged_checkpoint
from lightning_ig.checkpoint.heads import head_entry, heads_in, list_heads, select_prefix
from lightning_ig.checkpoint.layout import FORMAT_KEY, HEADS_KEY, STATES_KEY, CheckpointError
from lightning_ig.models import DuelingQNetwork
from tests.support.models import PlainMLP


def _net() -> DuelingQNetwork:
    return DuelingQNetwork(4, 2, hidden_sizes=(8,), noisy=False)


def test_the_heads_of_a_merged_file_in_its_order(tmp_path: Path) -> None:
    save_merged_checkpoint({"trending": _net(), "ranging": _net()}, tmp_path / "heads.safetensors")
    save_checkpoint(_net(), tmp_path / "q.safetensors")
    assert list_heads(tmp_path / "heads.safetensors") == ["ranging", "trending"]  # written sorted, read in order
    assert list_heads(tmp_path / "q.safetensors") == []


def test_heads_of_a_file_merged_by_another_tool_come_from_its_keys() -> None:
    keys = ["up__w", "up__b", "down__w", STATES_KEY]
    assert heads_in({}, keys, Path("f")) == ["up", "down"]  # the states tensor belongs to no head
    assert heads_in({}, ["w", "up__b"], Path("f")) == []  # one key without a head: a single model
    assert heads_in({}, ["up__"], Path("f")) == []  # nothing after the separator is not a head's key
    assert heads_in({FORMAT_KEY: "1"}, keys, Path("f")) == []  # save_checkpoint's own file: one model


def test_a_heads_entry_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(CheckpointError, match="must be a JSON object of heads"):
        heads_in({HEADS_KEY: "[1, 2]"}, [], Path("f"))
    metadata = {HEADS_KEY: json.dumps({"up": {"architecture": "X"}, "bad": [1]})}
    assert head_entry(metadata, "up__", Path("f")) == {"architecture": "X"}
    assert head_entry(metadata, "missing__", Path("f")) == {}
    assert head_entry({}, "up__", Path("f")) == {} and head_entry(metadata, None, Path("f")) == {}
    with pytest.raises(CheckpointError, match="the entry of head 'bad' .* must be a JSON object"):
        head_entry(metadata, "bad__", Path("f"))


def test_a_head_is_chosen_whole_by_name_or_prefix() -> None:
    heads, keys = ["trending", "ranging"], ["trending__w", "ranging__w"]
    assert select_prefix("trending", heads, keys, Path("f")) == "trending__"
    assert select_prefix("ranging__", heads, keys, Path("f")) == "ranging__"
    for prefix in ("tre", "trend__", "trending_", "up__"):  # a part of a name is not a head
        with pytest.raises(CheckpointError, match="no head .* the heads in it are: trending, ranging"):
            select_prefix(prefix, heads, keys, Path("f"))
    with pytest.raises(CheckpointError, match="holds several heads .* --all-heads"):
        select_prefix(None, heads, keys, Path("f"))
    with pytest.raises(CheckpointError, match=r"'f' holds one head \(trending\); choose it with --head NAME"):
        select_prefix(None, heads[:1], keys[:1], Path("f"))  # a merged file of one head is not said to hold several


def test_a_single_model_file_takes_a_raw_prefix_only_if_some_key_has_it(tmp_path: Path) -> None:
    path = tmp_path / "raw.safetensors"
    save_file({"net.w": torch.zeros(1)}, str(path))
    assert select_prefix(None, [], ["net.w"], path) is None
    assert select_prefix("net.", [], ["net.w"], path) == "net."
    with pytest.raises(CheckpointError, match="no tensors under prefix 'other.' .* drop the head/prefix"):
        select_prefix("other.", [], ["net.w"], path)


def test_foreign_merged_file_heads_are_inferred_from_keys(tmp_path: Path) -> None:
    net = PlainMLP()
    tensors = {f"{head}__{key}": value.clone() for head in ("x", "y") for key, value in net.state_dict().items()}
    tensors[STATES_KEY] = torch.ones(2, 3)
    save_file(tensors, str(tmp_path / "foreign.safetensors"))
    assert list_heads(tmp_path / "foreign.safetensors") == ["x", "y"]
    with pytest.raises(CheckpointError, match="--model package.module:Class"):
        load_checkpoint(tmp_path / "foreign.safetensors", head="x")
    loaded = load_checkpoint(tmp_path / "foreign.safetensors", head="y", architecture="tests.support.models:PlainMLP")
    torch.testing.assert_close(
        loaded.model.layer.weight, net.layer.weight, rtol=0, atol=0
    )  # stored and read back: exact
    torch.testing.assert_close(loaded.states, torch.ones(2, 3), rtol=0, atol=0)
