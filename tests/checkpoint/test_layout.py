"""The checkpoint file format's names and its readers of metadata: what a file is, said in one error kind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lightning_ig.checkpoint import list_heads, load_checkpoint, merge_checkpoints, save_checkpoint
from lightning_ig.checkpoint.layout import (
    HEAD_SEPARATOR,
    CheckpointError,
    LoadedCheckpoint,
    existing_file,
    few,
    head_prefix,
    json_metadata,
    read_metadata,
    tensor_keys,
)
from lightning_ig.models import DuelingQNetwork


def test_a_heads_prefix_is_its_name_and_the_separator() -> None:
    assert head_prefix("trending") == "trending" + HEAD_SEPARATOR == "trending__"
    # a head's name is part of file names (ig_report.<head>.json) and printed lines: no NUL, no separator, no break
    # nor a trailing "_": head "a_"'s keys (a___...) would start with head "a"'s prefix, and "a" could not load
    for bad in ("", " ", "a__b", "__", 3, "a\x00b", "a/b", "..", "a\nb", "\x1b[2J", "a_", "_"):
        with pytest.raises(ValueError, match="a head name must be printable text without '__', a trailing '_' or a"):
            head_prefix(bad)  # type: ignore[arg-type]


def test_a_head_name_no_file_can_take_is_refused_when_the_heads_are_read(tmp_path: Path) -> None:
    path = tmp_path / "heads.safetensors"
    heads = json.dumps({"ok": {}, "a\x00b": {}})
    save_file({"ok__w": torch.zeros(1)}, str(path), metadata={"lightning_ig.format": "1", "lightning_ig.heads": heads})
    with pytest.raises(CheckpointError, match=r"names the head 'a\\x00b'; a head's name is printable text"):
        list_heads(path)


def test_a_format_this_version_does_not_know_is_refused_by_every_reader(tmp_path: Path) -> None:
    path = tmp_path / "q2.safetensors"
    save_checkpoint(DuelingQNetwork(2, 2, hidden_sizes=(4,)), path)
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata={**read_metadata(path), "lightning_ig.format": "2"})
    for read in (list_heads, load_checkpoint, lambda file: merge_checkpoints({"a": file}, tmp_path / "m.safetensors")):
        with pytest.raises(
            CheckpointError, match="is in lightning-ig checkpoint format '2'; this version reads format 1"
        ):
            read(path)
    assert not (tmp_path / "m.safetensors").exists()


def test_a_loaded_checkpoint_names_its_head_without_the_separator() -> None:
    model = torch.nn.Linear(1, 1)
    assert LoadedCheckpoint(model, None, None, {}, prefix="ranging__").head == "ranging"
    assert LoadedCheckpoint(model, None, None, {}, prefix="raw.").head == "raw."  # a raw prefix stays as given
    assert LoadedCheckpoint(model, None, None, {}).head is None


def test_few_lists_at_most_four_keys_and_counts_them_all() -> None:
    assert few([]) == "none"
    assert few(["a", "b"]) == "[a, b] (2)"
    assert few([f"k{i}" for i in range(9)]) == "[k0, k1, k2, k3, ...] (9)"
    assert few(["ok", "\x1b[2J"]) == "[ok, '\\x1b[2J'] (2)"  # a file's keys are data: a control character is quoted


def test_existing_file_says_what_is_wrong_with_a_path(tmp_path: Path) -> None:
    file = tmp_path / "q.safetensors"
    file.write_bytes(b"x")
    assert existing_file(file) == file and existing_file(str(file)) == file
    with pytest.raises(CheckpointError, match=r"checkpoint '.*missing' does not exist; check the path"):
        existing_file(tmp_path / "missing")
    with pytest.raises(CheckpointError, match=r"states file '.*' is a folder, not a regular file; check the path"):
        existing_file(tmp_path, "states file")
    os.mkfifo(tmp_path / "pipe")  # opening it would block forever
    with pytest.raises(CheckpointError, match=r"checkpoint '.*pipe' is a FIFO \(a named pipe\), not a regular file"):
        existing_file(tmp_path / "pipe")
    (tmp_path / "zeros").symlink_to("/dev/zero")  # reading it would never end
    with pytest.raises(CheckpointError, match=r"checkpoint '.*zeros' is a device, not a regular file"):
        existing_file(tmp_path / "zeros")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(CheckpointError, match=r"checkpoint '.*loop' is a symbolic-link loop; check the path"):
        existing_file(tmp_path / "loop")
    with pytest.raises(TypeError, match="checkpoint path must be a str or os.PathLike, got int"):
        existing_file(3)  # type: ignore[arg-type]
    if hasattr(os, "geteuid") and os.geteuid() != 0:  # root reads anything
        file.chmod(0)
        with pytest.raises(CheckpointError, match="is not readable"):
            existing_file(file)


def test_metadata_and_keys_are_read_in_the_files_order(tmp_path: Path) -> None:
    path = tmp_path / "q.safetensors"
    save_file({"b": torch.zeros(1), "a": torch.ones(2)}, str(path), metadata={"k": "v"})
    assert read_metadata(path) == {"k": "v"}
    assert sorted(tensor_keys(path)) == ["a", "b"]
    bare = tmp_path / "bare.safetensors"
    save_file({"x": torch.zeros(1)}, str(bare))
    assert read_metadata(bare) == {}  # no metadata at all reads as none


def test_a_file_that_is_not_safetensors_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.safetensors"
    path.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        read_metadata(path)
    with pytest.raises(CheckpointError, match="give a checkpoint written by lightning_ig.save_checkpoint"):
        tensor_keys(path)


def test_json_metadata_parses_with_bounds_and_names_the_key(tmp_path: Path) -> None:
    assert json_metadata({"cfg": '{"width": 4}'}, "cfg", tmp_path) == {"width": 4}
    for text in ("{not json", "[" * 100, '{"n": ' + "9" * 30 + "}"):
        with pytest.raises(CheckpointError, match="metadata 'cfg' of .* is not valid JSON"):
            json_metadata({"cfg": text}, "cfg", tmp_path)
