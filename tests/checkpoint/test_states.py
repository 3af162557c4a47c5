"""Held-out states from files: every accepted form, the dtype asked for, and a clear error for each bad one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lightning_ig import vocabulary
from lightning_ig.checkpoint.layout import STATES_KEY, CheckpointError
from lightning_ig.checkpoint.states import STATE_SUFFIXES, load_states, states_beside

ROWS = [[0.1, -2.0, 3.5], [4.0, 0.0, -1e-3]]


def test_every_form_reads_the_same_states(tmp_path: Path) -> None:
    expected = torch.tensor(ROWS, dtype=torch.float64)
    (tmp_path / "s.json").write_text(json.dumps({"states": ROWS}))
    (tmp_path / "bare.json").write_text(json.dumps(ROWS))  # a bare list of lists is accepted too
    np.save(tmp_path / "s.npy", np.asarray(ROWS))
    save_file({STATES_KEY: expected}, str(tmp_path / "s.safetensors"))
    save_file({"only": expected}, str(tmp_path / "only.safetensors"))  # the file's one tensor
    for name in ("s.json", "bare.json", "s.npy", "s.safetensors", "only.safetensors"):
        states = load_states(tmp_path / name, dtype=torch.float64)
        assert states.dtype == torch.float64 and torch.equal(states, expected), name
    assert load_states(tmp_path / "s.npy").dtype == torch.float32  # the default dtype
    np.save(tmp_path / "big_endian.npy", np.asarray(ROWS, dtype=">f8"))
    assert torch.equal(load_states(tmp_path / "big_endian.npy", dtype=torch.float64), expected)


def test_a_heads_own_states_come_first_in_a_merged_file(tmp_path: Path) -> None:
    path = tmp_path / "heads.safetensors"
    save_file({"up__" + STATES_KEY: torch.ones(2, 3), STATES_KEY: torch.zeros(2, 3)}, str(path))
    assert torch.equal(load_states(path, prefix="up__"), torch.ones(2, 3))
    assert torch.equal(load_states(path), torch.zeros(2, 3))
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(2, 3)}, str(path))
    with pytest.raises(CheckpointError, match=r"has no '__states__' or 'states' tensor \(it has \[a, b\] \(2\)\)"):
        load_states(path)


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("s.json", json.dumps({"rows": ROWS}), 'has no "states" key'),
        ("s.json", json.dumps({"states": [[1.0, True]]}), r"holds True \(a JSON boolean\) among the states"),
        ("s.json", json.dumps({"states": [[1.0, "2"]]}), r"holds '2' \(a JSON str\) among the states"),
        (
            "s.json",
            json.dumps({"states": [1.0, 2.0]}),
            r"have shape \(2,\): expected .* wrap one state as \[\[\.\.\.\]\]",
        ),
        ("s.json", json.dumps({"states": []}), r"have shape \(0,\): expected at least one state$"),
        ("s.json", "{broken", "cannot read states from"),
        ("s.txt", "1 2 3", "must end in .json, .npy or .safetensors, not '.txt'"),
    ],
)
def test_each_bad_file_is_one_checkpoint_error_saying_why(tmp_path: Path, name: str, content: str, words: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(CheckpointError, match=words):
        load_states(tmp_path / name)


def test_an_array_of_other_values_or_arguments_of_the_wrong_kind_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "none.npy", np.zeros((0, 3)))
    with pytest.raises(CheckpointError, match=r"have shape \(0, 3\): expected at least one state"):
        load_states(tmp_path / "none.npy")
    np.save(tmp_path / "scalar.npy", np.float32(1))  # it was called shape (1,), a shape a state can have
    with pytest.raises(CheckpointError, match=r"have shape \(\): expected at least one state"):
        load_states(tmp_path / "scalar.npy")
    np.save(tmp_path / "s.npy", np.asarray([["a", "b"]]))
    with pytest.raises(CheckpointError, match="holds <U1 values; states are numbers: save a float array"):
        load_states(tmp_path / "s.npy")
    np.save(tmp_path / "ok.npy", np.zeros((2, 2)))
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        load_states(tmp_path / "ok.npy", dtype="float64")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
        load_states(tmp_path / "ok.npy", dtype=torch.int64)
    with pytest.raises(ValueError, match="prefix must not be blank"):
        load_states(tmp_path / "ok.npy", prefix=" ")


def test_states_beside_a_checkpoint_by_its_stem_first(tmp_path: Path) -> None:
    checkpoint = tmp_path / "q.safetensors"
    assert states_beside(checkpoint) is None
    (tmp_path / "states.json").write_text("[]")
    assert states_beside(checkpoint) == tmp_path / "states.json"
    (tmp_path / "q.states.npy").write_text("")
    assert states_beside(checkpoint) == tmp_path / "q.states.npy"  # the checkpoint's own before the folder's
    for suffix in STATE_SUFFIXES:
        (tmp_path / f"q.states{suffix}").write_text("")
    assert states_beside(checkpoint) == tmp_path / f"q.states{STATE_SUFFIXES[0]}"  # in the order of STATE_SUFFIXES
    (tmp_path / f"q.states{STATE_SUFFIXES[0]}").unlink()
    assert states_beside(checkpoint) == tmp_path / f"q.states{STATE_SUFFIXES[1]}"


def test_booleans_are_not_states_in_any_form(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"states": [[True, False]]}))
    np.save(tmp_path / "s.npy", np.asarray([[True, False]]))
    save_file({STATES_KEY: torch.tensor([[True, False]])}, str(tmp_path / "s.safetensors"))
    for name in ("s.json", "s.npy", "s.safetensors"):
        with pytest.raises(CheckpointError, match="(a JSON boolean|holds bool values; states are numbers)"):
            load_states(tmp_path / name)
    save_file({STATES_KEY: torch.tensor([[1, 255]], dtype=torch.uint8)}, str(tmp_path / "frames.safetensors"))
    assert load_states(tmp_path / "frames.safetensors").tolist() == [[1.0, 255.0]]  # integers are numbers


def test_finite_values_past_the_dtypes_range_are_said_as_such_not_as_nan_or_inf(tmp_path: Path) -> None:
    values = np.array([[0.0, 1e300], [2.0, 3.0]])
    np.save(tmp_path / "wide.npy", values)
    with pytest.raises(CheckpointError, match=r"holds 1e\+300 at index \(0, 1\), past the range of torch.float32"):
        load_states(tmp_path / "wide.npy")
    assert load_states(tmp_path / "wide.npy", dtype=torch.float64)[0, 1].item() == 1e300  # the file's own dtype
    np.save(tmp_path / "inf.npy", np.array([[0.0, np.inf]]))  # a NaN/Inf in the file is left to the states' check
    assert torch.isinf(load_states(tmp_path / "inf.npy")).any()


def test_a_json_number_past_float64_is_said_as_such_and_an_infinity_left_to_the_states_check(tmp_path: Path) -> None:
    (tmp_path / "wide.json").write_text("[[1e999, 2.0], [3.0, 4.0]]")  # json reads it as inf, silently
    with pytest.raises(CheckpointError, match=r"holds a number past float64's range at index \(0, 0\)"):
        load_states(tmp_path / "wide.json")
    (tmp_path / "inf.json").write_text("[[Infinity, 2.0], [3.0, 4.0]]")
    assert torch.isinf(load_states(tmp_path / "inf.json")).any()


def test_a_json_states_file_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"states": [[1.0, 2.0]], "states": [[3.0, 4.0]]}')
    with pytest.raises(CheckpointError, match="an object names the key 'states' twice"):
        load_states(tmp_path / "s.json")


def test_a_file_that_is_not_npy_is_said_without_numpys_advice_to_unpickle(tmp_path: Path) -> None:
    import gzip
    import pickle

    np.save(tmp_path / "plain.npy", np.asarray(ROWS))
    plain = (tmp_path / "plain.npy").read_bytes()
    (tmp_path / "packed.npy").write_bytes(gzip.compress(plain))
    (tmp_path / "pickled.npy").write_bytes(pickle.dumps(ROWS))
    (tmp_path / "damaged.npy").write_bytes(plain[:10] + b"{not a header" + plain[23:])
    (tmp_path / "short.npy").write_bytes(plain[:-8])
    np.save(tmp_path / "objects.npy", np.asarray([[1, None]], dtype=object), allow_pickle=True)
    cases = {
        "packed.npy": "is gzip-compressed: decompress it first",
        "pickled.npy": "is not a .npy file; write the states with numpy.save",
        "damaged.npy": "is a damaged .npy file",
        "short.npy": "is cut short: its header announces 48 bytes of states, it holds 40",
        "objects.npy": "holds Python-object values; states are numbers",
    }
    for name, words in cases.items():
        with pytest.raises(CheckpointError, match=words) as caught:
            load_states(tmp_path / name)
        assert "allow_pickle" not in str(caught.value), name


def test_states_larger_than_the_memory_available_are_refused_before_they_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    np.save(tmp_path / "s.npy", np.zeros((1000, 4), dtype=np.float32))  # 16,000 bytes, 80,000 once converted
    save_file({STATES_KEY: torch.zeros(1000, 4)}, str(tmp_path / "s.safetensors"))
    (tmp_path / "s.json").write_text(json.dumps({"states": np.zeros((1000, 4)).tolist()}))
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 50_000)
    for name in ("s.npy", "s.safetensors", "s.json"):
        with pytest.raises(CheckpointError, match="the states in .* needs about .* more than the 48.8 KiB available"):
            load_states(tmp_path / name)
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 10**9)
    assert load_states(tmp_path / "s.npy").shape == (1000, 4)


def test_float8_states_are_read_as_their_values(tmp_path: Path) -> None:
    """A float8 file reads as its values (torch's NaN/Inf checks do not take float8: it used to raise)."""
    values = torch.tensor([[0.5, -1.0, 2.0, 0.0]], dtype=torch.float8_e4m3fn)
    save_file({STATES_KEY: values}, str(tmp_path / "s.safetensors"))
    assert torch.equal(load_states(tmp_path / "s.safetensors"), values.float())


def test_a_states_file_cut_short_is_said_to_be_so_with_its_size(tmp_path: Path) -> None:
    # guards against: a .safetensors states file cut short said safetensors' "incomplete metadata, file not fully
    # covered; check the file", where a checkpoint cut short says it looks truncated and to save it again
    save_file({"__states__": torch.rand(64, 4)}, str(tmp_path / "s.safetensors"))
    whole = (tmp_path / "s.safetensors").read_bytes()
    for name, data in [("cut.safetensors", whole[: len(whole) // 2]), ("header.safetensors", whole[:40])]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match=rf"'.*{name}' looks truncated or corrupt \({len(data)} bytes\)"):
            load_states(tmp_path / name)
