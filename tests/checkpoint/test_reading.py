"""Rebuilding a model from a checkpoint: the file's values loaded as they are, on a device that exists, within memory.

A weight is never cast to a dtype that changes it without a word: a wider float builds the model in its dtype, a
narrower one loads exactly, a bool or an integer where the model has a float is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file, save_file

from lightning_ig import vocabulary
from lightning_ig.checkpoint import CheckpointError, layout, load_checkpoint, read_metadata, save_checkpoint
from lightning_ig.models import DuelingQNetwork


def _saved(tmp_path: Path) -> tuple[Path, DuelingQNetwork]:
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,)).eval()
    path = tmp_path / "q.safetensors"
    save_checkpoint(net, path, states=torch.randn(3, 4))
    return path, net


def _rewritten(path: Path, change: dict[str, torch.dtype] | torch.dtype) -> Path:
    """The checkpoint with its weights stored in other dtypes (one dtype for all, or per key)."""
    tensors = load_file(str(path))
    for key, tensor in tensors.items():
        dtype = change.get(key) if isinstance(change, dict) else change
        if dtype is not None and key != "__states__":
            tensors[key] = tensor.to(dtype)
    out = path.with_name(f"{path.stem}.{len(list(path.parent.iterdir()))}.safetensors")
    save_file(tensors, str(out), metadata=read_metadata(path))
    return out


def test_float64_weights_build_the_model_in_float64_rather_than_rounding_them(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    tensors = load_file(str(path))
    stored = {
        key: value.double() + (1e-12 if value.is_floating_point() and key != "__states__" else 0)
        for key, value in tensors.items()
    }
    wide = tmp_path / "f64.safetensors"
    save_file(stored, str(wide), metadata=read_metadata(path))
    model = load_checkpoint(wide).model
    assert {tensor.dtype for tensor in model.parameters()} == {torch.float64}
    for key, value in model.state_dict().items():
        if key in stored and value.is_floating_point():
            assert torch.equal(value, stored[key]), f"{key} was rounded"


def test_narrower_float_weights_load_exactly_into_the_models_float32(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
        narrow = _rewritten(path, dtype)
        stored = load_file(str(narrow))
        model = load_checkpoint(narrow).model
        assert {tensor.dtype for tensor in model.parameters()} == {torch.float32}, dtype
        for key, value in model.state_dict().items():
            if value.is_floating_point() and key in stored:
                assert torch.equal(value, stored[key].float()), (dtype, key)  # every value kept


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int64])
def test_bool_or_integer_weights_where_the_model_has_floats_are_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    path, net = _saved(tmp_path)
    key = next(name for name, value in net.state_dict().items() if value.is_floating_point())
    with pytest.raises(CheckpointError, match=f"'{key}' is stored as {dtype} but the model's is torch.float32"):
        load_checkpoint(_rewritten(path, {key: dtype}))


def test_the_stored_states_come_in_the_models_dtype_so_the_model_takes_them(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,)).double().eval()
    states = torch.randn(3, 4, dtype=torch.float64)
    save_checkpoint(net, tmp_path / "f64.safetensors", states=states)  # states stored as float32
    loaded = load_checkpoint(tmp_path / "f64.safetensors")
    assert loaded.states is not None and loaded.states.dtype == torch.float64
    assert torch.equal(loaded.states, states.float().double())
    assert loaded.model(loaded.states).dtype == torch.float64  # the docstring's own example
    tensors = load_file(str(tmp_path / "f64.safetensors"))
    tensors["__states__"] = states  # a float64 file keeps its states' precision
    save_file(tensors, str(tmp_path / "wide.safetensors"), metadata=read_metadata(tmp_path / "f64.safetensors"))
    wide = load_checkpoint(tmp_path / "wide.safetensors").states
    assert wide is not None and torch.equal(wide, states)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_stored_states_that_are_not_real_numbers_are_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    path, _ = _saved(tmp_path)
    tensors = load_file(str(path))
    tensors["__states__"] = tensors["__states__"].to(dtype)
    save_file(tensors, str(tmp_path / "odd.safetensors"), metadata=read_metadata(path))
    with pytest.raises(CheckpointError, match=f"states in .*odd.safetensors' are stored as {dtype}"):
        load_checkpoint(tmp_path / "odd.safetensors")


def test_a_device_that_cannot_hold_the_model_is_said_before_anything_is_read(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    with pytest.raises(ValueError, match="the meta device holds shapes, not values"):
        load_checkpoint(path, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda': torch sees no CUDA device here"):
            load_checkpoint(path, device="cuda")


def test_a_checkpoint_larger_than_the_memory_available_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _saved(tmp_path)
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 100)
    with pytest.raises(CheckpointError, match=r"loading the tensors of .* needs about .* of memory, more than the"):
        load_checkpoint(path)


def test_stored_states_count_in_the_memory_a_load_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # guards against: 40 MB of stored states read whole where the same states from a file were refused
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    path = save_checkpoint(net, tmp_path / "big.safetensors", states=torch.zeros(250_000, 4))
    weights = sum(tensor.numel() * 4 for tensor in net.state_dict().values())
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 4 * weights + 2**20)  # the weights fit, not the states
    with pytest.raises(CheckpointError, match=r"loading the tensors of .* needs about 7.6 MiB of memory"):
        load_checkpoint(path)
    save_checkpoint(net, tmp_path / "small.safetensors", states=torch.zeros(4, 4))
    assert load_checkpoint(tmp_path / "small.safetensors").states.shape == (4, 4)


def test_a_file_too_large_to_map_is_said_to_be_too_large_not_unreadable(tmp_path: Path) -> None:
    error = RuntimeError("unable to mmap 120000000352 bytes from file <x>: Cannot allocate memory (12)")
    assert "is too large to map into this machine's memory" in str(layout.open_error(tmp_path / "x", error))


def test_load_errors_are_checkpoint_errors_that_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")
    path, _ = _saved(tmp_path)
    with pytest.raises(CheckpointError, match="do not fit DuelingQNetwork"):
        load_checkpoint(path, config={"state_dim": 5, "num_actions": 2, "hidden_sizes": [8]})
    with pytest.raises(CheckpointError, match="single-model file"):
        load_checkpoint(path, head="trending")


class LightningWithoutHyperparameters(pl.LightningModule):
    """Its __init__ takes an argument it does not keep (no save_hyperparameters())."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Linear(width, 2)


def test_a_lightning_module_that_does_not_keep_its_arguments_is_told_to_save_them(tmp_path: Path) -> None:
    # guards against: "check that the file is a Lightning checkpoint of that class" for a file that is one, of a
    # module whose __init__(width) Lightning could not call without the saved hyperparameters
    from lightning_ig.checkpoint import load_lightning_checkpoint

    module = LightningWithoutHyperparameters(4)
    torch.save({"state_dict": module.state_dict(), "pytorch-lightning_version": "2.6.6"}, tmp_path / "m.ckpt")
    with pytest.raises(CheckpointError, match=r"missing 1 required positional argument.*save_hyperparameters\(\)"):
        load_lightning_checkpoint(tmp_path / "m.ckpt", f"{__name__}:LightningWithoutHyperparameters")


def test_a_lightning_checkpoint_whose_keys_differ_from_the_class_says_which(tmp_path: Path) -> None:
    # guards against: "(RuntimeError: Error(s) in loading state_dict for ...:)", load_state_dict's header alone, for
    # a module saved with a compiled (or wrapped) submodule and read through a class that does not compile it
    from lightning_ig.checkpoint import load_lightning_checkpoint

    saved = {f"net._orig_mod.{key}": value for key, value in torch.nn.Linear(4, 2).state_dict().items()}
    torch.save({"state_dict": saved, "pytorch-lightning_version": "2.6.6", "hyper_parameters": {}}, tmp_path / "m.ckpt")
    said = r"missing \[net.weight, net.bias\] \(2\), unexpected \[net._orig_mod.weight, net._orig_mod.bias\] \(2\)\)"
    said += r"; check .*compiled"  # the keys, a few of each list, not load_state_dict's every key nor its header alone
    with pytest.raises(CheckpointError, match=said):
        load_lightning_checkpoint(tmp_path / "m.ckpt", f"{__name__}:LightningWithPathHyperparameters")


class LightningWithPathHyperparameters(pl.LightningModule):
    """Keeps a pathlib.Path among its hyperparameters: torch.load's weights-only unpickler refuses it."""

    def __init__(self, data_dir: Path | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(4, 2)


def test_a_lightning_checkpoint_the_weights_only_unpickler_refuses_is_told_why(tmp_path: Path) -> None:
    # guards against: torch's preamble as the reason ("Weights only load failed. ... you have two options, " with its
    # terminal escapes, cut there), which diag cannot follow, and advice on __init__'s arguments that did not apply
    from lightning_ig.checkpoint import load_lightning_checkpoint

    module = LightningWithPathHyperparameters(tmp_path)
    checkpoint = {"state_dict": module.state_dict(), "pytorch-lightning_version": "2.6.6"}
    torch.save({**checkpoint, "hyper_parameters": dict(module.hparams)}, tmp_path / "m.ckpt")
    with pytest.raises(CheckpointError) as refused:
        load_lightning_checkpoint(tmp_path / "m.ckpt", f"{__name__}:LightningWithPathHyperparameters")
    # pathlib.PosixPath, or pathlib._local.PosixPath from Python 3.13
    assert re.search(r"GLOBAL pathlib\.[\w.]*Path was not an allowed global.*plain values", str(refused.value))
    assert "\x1b" not in str(refused.value) and "__init__" not in str(refused.value)
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint at all\n")
    with pytest.raises(CheckpointError, match=r"\(UnpicklingError: Unsupported operand \d+\).*Lightning checkpoint"):
        load_lightning_checkpoint(tmp_path / "junk.ckpt", f"{__name__}:LightningWithPathHyperparameters")


def test_a_checkpoint_cut_short_is_said_to_be_so_with_its_size(tmp_path: Path) -> None:
    # guards against: a Lightning .ckpt cut short said "(OSError: [Errno 22] Invalid argument)" or "failed finding
    # central directory" and to check the module's class; a safetensors one safetensors' "incomplete metadata, file
    # not fully covered" and to give a file written by save_checkpoint (it was one)
    from lightning_ig.checkpoint import load_lightning_checkpoint

    module = LightningWithPathHyperparameters()
    checkpoint = {"state_dict": module.state_dict(), "pytorch-lightning_version": "2.6.6"}
    torch.save({**checkpoint, "hyper_parameters": dict(module.hparams)}, tmp_path / "m.ckpt")
    whole = (tmp_path / "m.ckpt").read_bytes()
    assert load_lightning_checkpoint(tmp_path / "m.ckpt", f"{__name__}:LightningWithPathHyperparameters") is not None
    path, _ = _saved(tmp_path)
    stored = path.read_bytes()
    for name, data in [
        ("cut.ckpt", whole[: len(whole) // 2]),
        ("head.ckpt", whole[:100]),
        ("cut.safetensors", stored[: len(stored) // 2]),  # in the tensors
        ("header.safetensors", stored[:20]),  # in the header
        ("tiny.safetensors", stored[:5]),  # before the header's length
        ("longer.safetensors", stored + b"\0" * 8),  # not what the header says either
    ]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match=rf"looks truncated or corrupt \({len(data)} bytes\): save it again"):
            if name.endswith(".ckpt"):
                load_lightning_checkpoint(tmp_path / name, f"{__name__}:LightningWithPathHyperparameters")
            else:
                load_checkpoint(tmp_path / name)
