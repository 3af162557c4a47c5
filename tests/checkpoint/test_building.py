"""A checkpoint is data: what a file names is not imported, and what its config asks for is not allocated.

A marker module (tests/support/markermod.py) writes a file when it is imported, so
"nothing was imported" is seen on the disk and in ``sys.modules``. The sizes tests watch
every ``nn.Linear`` that gets made, so "refused before anything was allocated" is seen
too, not inferred from a message.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from lightning_ig import cli
from lightning_ig.checkpoint import (
    ARCHITECTURE_KEY,
    CONFIG_KEY,
    FORMAT_KEY,
    HEADS_KEY,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from lightning_ig.models import (
    DuelingQNetwork,
    UnregisteredModelError,
    build_model,
    register_model,
    resolve_model_class,
)
from tests.support import REPO
from tests.support.tolerance import assert_close_scaled

MARKER = "tests.support.markermod"


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tests.support.markermod`` not imported yet; yields the file its import would create."""
    path = tmp_path / "MARKER"
    monkeypatch.setenv("LIGHTNING_IG_TEST_MARKER", str(path))
    sys.modules.pop(MARKER, None)
    yield path
    sys.modules.pop(MARKER, None)


def _net_tensors(width: int = 4, outputs: int = 2, prefix: str = "") -> dict[str, torch.Tensor]:
    layer = nn.Linear(width, outputs)
    return {f"{prefix}layer.weight": layer.weight.detach().clone(), f"{prefix}layer.bias": layer.bias.detach().clone()}


def _file(path: Path, tensors: dict[str, torch.Tensor], architecture: str, config: dict[str, Any]) -> Path:
    metadata = {FORMAT_KEY: "1", ARCHITECTURE_KEY: architecture, CONFIG_KEY: json.dumps(config)}
    save_file(tensors, str(path), metadata=metadata)
    return path


def _with_config(path: Path, target: Path, **changes: Any) -> Path:
    """A copy of checkpoint ``path`` whose metadata config has ``changes``: the same (small) tensors."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open's API, not a dict
    metadata[CONFIG_KEY] = json.dumps({**json.loads(metadata[CONFIG_KEY]), **changes})
    save_file(tensors, str(target), metadata=metadata)
    return target


@register_model("Composite")
class Composite(nn.Module):
    """A registered model that builds its members from names in its config: the names inside a file's config."""

    def __init__(self, members: list[dict[str, Any]]) -> None:
        super().__init__()
        self.members = nn.ModuleList(build_model(member["name"], member.get("config")) for member in members)
        self._config = {"members": members}

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.members[0](x)).mean(dim=1)  # (N,)


def _composite_naming(path: Path, member: str) -> Path:
    """A Composite checkpoint whose one member is named ``member``, with that member's (Net's) tensors."""
    config = {"members": [{"name": member, "config": {"width": 4}}]}
    return _file(path, _net_tensors(prefix="members.0."), "Composite", config)


# ---------------------------------------------------------------------------------------------
# names: only registered architectures are built from a file


def test_a_file_naming_an_import_path_imports_nothing(tmp_path: Path, marker: Path) -> None:
    path = _file(tmp_path / "q.safetensors", _net_tensors(), "tests.support.markermod:Net", {"width": 4})
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert not marker.exists() and MARKER not in sys.modules
    message = str(refused.value)
    for words in (
        "'tests.support.markermod:Net'",
        "not a registered architecture",
        "--model tests.support.markermod:Net",
        "--trust-remote-code",
        "trust_remote_code=True",
        "architecture='tests.support.markermod:Net'",
    ):
        assert words in message, (words, message)


def test_the_callers_opt_in_imports_and_builds_it(tmp_path: Path, marker: Path) -> None:
    tensors = _net_tensors()
    path = _file(tmp_path / "q.safetensors", tensors, "tests.support.markermod:Net", {"width": 4})
    loaded = load_checkpoint(path, trust_remote_code=True)
    assert marker.exists() and type(loaded.model).__module__ == MARKER
    torch.testing.assert_close(loaded.model.layer.weight, tensors["layer.weight"], rtol=0, atol=0)  # stored: exact
    marker.unlink()
    named = load_checkpoint(path, architecture="tests.support.markermod:Net")  # the caller's own words: fine to import
    torch.testing.assert_close(named.model.layer.bias, tensors["layer.bias"], rtol=0, atol=0)


def test_this_is_refused_and_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    already = "this" in sys.modules
    path = _file(tmp_path / "zen.safetensors", _net_tensors(), "this:X", {})
    with pytest.raises(CheckpointError, match="'this:X', which is not a registered architecture"):
        load_checkpoint(path)
    assert capsys.readouterr().out == "", "the Zen of Python was printed: module 'this' ran"
    assert already or "this" not in sys.modules


def test_a_class_saved_from_a_script_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # guards against: "names the architecture '__main__:Net' ... name the class yourself with --model __main__:Net",
    # advice that fails in any other process ("module '__main__' has no attribute 'Net'")
    path = _file(tmp_path / "script.safetensors", _net_tensors(), "__main__:Net", {"width": 4})
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert "class was defined in a script run as __main__" in message and "--model module:Net" in message
    assert "--model __main__:Net" not in message and "--trust-remote-code" not in message
    # guards against: the process that defined the class (a notebook, which saves and loads in one kernel) told only to
    # move the class to a module and save again, where architecture='__main__:Net' loads it there, as said
    assert "which only that process loads (architecture='__main__:Net')" in message

    class Net(nn.Module):  # the class as the notebook's __main__ holds it
        def __init__(self, width: int) -> None:
            super().__init__()
            self.layer = nn.Linear(width, 2)

    monkeypatch.setattr(sys.modules["__main__"], "Net", Net, raising=False)
    assert isinstance(load_checkpoint(path, architecture="__main__:Net").model, Net)


def test_a_member_named_inside_the_files_config_is_refused_unless_trusted(tmp_path: Path, marker: Path) -> None:
    path = _composite_naming(tmp_path / "composite.safetensors", "tests.support.markermod:Net")
    for kwargs in ({}, {"architecture": "Composite"}):  # naming the outer class does not vouch for its members
        with pytest.raises(CheckpointError) as refused:
            load_checkpoint(path, **kwargs)
        assert not marker.exists() and MARKER not in sys.modules
        assert "names the architecture 'tests.support.markermod:Net' inside it" in str(refused.value)
        assert "--trust-remote-code" in str(refused.value)
    states = torch.randn(3, 4)
    trusted = load_checkpoint(path, trust_remote_code=True)
    assert marker.exists() and isinstance(trusted.model, Composite)
    assert sys.modules[MARKER].TABLE.device.type == "cpu", "imported during the meta build, kept a meta tensor"
    expected = torch.sigmoid(trusted.model.members[0](states)).mean(dim=1)
    assert_close_scaled(trusted.model(states).detach(), expected.detach(), ulps=8, scale=1.0)  # means of sigmoids <= 1
    config = {"members": [{"name": "tests.support.markermod:Net", "config": {"width": 4}}]}
    assert isinstance(load_checkpoint(path, config=config).model, Composite), (
        "a config the caller wrote is the caller's"
    )


def test_a_merged_heads_entry_naming_an_import_path_is_refused(tmp_path: Path, marker: Path) -> None:
    tensors = _net_tensors(prefix="up__")
    heads = {"up": {"architecture": "tests.support.markermod:Net", "config": {"width": 4}}}
    save_file(tensors, str(tmp_path / "heads.safetensors"), metadata={FORMAT_KEY: "1", HEADS_KEY: json.dumps(heads)})
    with pytest.raises(CheckpointError, match="names the architecture 'tests.support.markermod:Net'"):
        load_checkpoint(tmp_path / "heads.safetensors", head="up")
    assert not marker.exists() and MARKER not in sys.modules


def test_build_model_refuses_before_importing_when_told(marker: Path) -> None:
    with pytest.raises(UnregisteredModelError, match="'tests.support.markermod:Net' is not registered"):
        build_model("tests.support.markermod:Net", {"width": 4}, allow_import=False)
    with pytest.raises(UnregisteredModelError):
        resolve_model_class("tests.support.markermod:Net", allow_import=False)
    members = {"members": [{"name": "tests.support.markermod:Net", "config": {"width": 4}}]}
    with pytest.raises(UnregisteredModelError) as refused:  # a name inside the config, under a registered one
        build_model("Composite", members, allow_import=False)
    assert refused.value.name == "tests.support.markermod:Net"
    with pytest.raises(UnregisteredModelError):
        build_model("Composite", members, allow_import_in_config=False)
    assert not marker.exists() and MARKER not in sys.modules
    assert build_model("DuelingQNetwork", {"state_dim": 4, "num_actions": 2}, allow_import=False).num_actions == 2
    assert isinstance(build_model("tests.support.markermod:Net", {"width": 4}), nn.Module) and marker.exists(), (
        "the caller's literal"
    )
    with pytest.raises(TypeError, match="allow_import must be a bool"):
        build_model("DuelingQNetwork", {}, allow_import="no")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    ["a b:Net", ".tests.support.markermod:Net", "tests.support.markermod:Net;x", "markermod:", "class:Net", "x:1a"],
)
def test_a_name_that_is_not_an_import_path_is_refused_without_any_import(name: str, marker: Path) -> None:
    with pytest.raises(ValueError, match="is not an import path 'package.module:Class'"):
        resolve_model_class(name)
    assert not marker.exists()


def test_a_pickled_ckpt_is_only_unpickled_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return os.mkdir, (str(tmp_path / "UNPICKLED"),)

    (tmp_path / "evil.ckpt").write_bytes(pickle.dumps({"state_dict": Payload()}))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["diag", "--checkpoint", "evil.ckpt", "--states", "auto", "--quiet", "--output", "r.json"])
    err = capsys.readouterr().err
    assert code == 2 and "--lightning-module" in err, err
    assert not (tmp_path / "UNPICKLED").exists()
    code = cli.main(["diag", "--checkpoint", "evil.ckpt", "--lightning-module", "m:C", "--trust-remote-code"])
    assert code == 2 and "--trust-remote-code is for safetensors checkpoints" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# sizes: a config is bounded by the tensors stored beside it


@pytest.fixture
def linears(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The device of every nn.Linear weight made from now on."""
    made: list[str] = []
    original = nn.Linear.__init__

    def watched(self: nn.Linear, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self.weight.device.type)

    monkeypatch.setattr(nn.Linear, "__init__", watched)
    return made


def _numel(config: dict[str, Any]) -> int:
    with torch.device("meta"):
        model = DuelingQNetwork(**config)
    return sum(t.numel() for t in [*model.parameters(), *model.buffers()])


def test_a_config_asking_for_160_gb_is_refused_before_allocating(tmp_path: Path, linears: list[str]) -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8, 8))
    small = save_checkpoint(net, tmp_path / "q.safetensors")
    huge = _with_config(small, tmp_path / "huge.safetensors", hidden_sizes=[200000, 200000])
    linears.clear()
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(huge)
    assert linears and set(linears) == {"meta"}, f"a real layer was made: {linears}"
    implied, stored = _numel({**net.config(), "hidden_sizes": [200000, 200000]}), _numel(net.config())
    message = str(refused.value)
    assert f"{implied:,} parameter and buffer values" in message and f"stores {stored:,} values" in message, message


def test_a_config_of_a_hundred_thousand_tiny_layers_is_stopped_early(tmp_path: Path, linears: list[str]) -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    small = save_checkpoint(net, tmp_path / "q.safetensors")
    deep = _with_config(small, tmp_path / "deep.safetensors", hidden_sizes=[1] * 100_000)
    linears.clear()
    with pytest.raises(CheckpointError, match="far larger than the weights stored in it"):
        load_checkpoint(deep)
    # each layer registers two tensors; a build is stopped past twice the stored tensors plus a slack of 64
    assert len(linears) <= len(net.state_dict()) + 32 + 1, f"{len(linears)} layers were built before it was stopped"


def test_a_config_that_differs_but_fits_names_the_tensor(tmp_path: Path, linears: list[str]) -> None:
    small = save_checkpoint(DuelingQNetwork(4, 2, hidden_sizes=(8,)), tmp_path / "q.safetensors")
    wider = _with_config(small, tmp_path / "wider.safetensors", hidden_sizes=[9])
    linears.clear()
    words = r"size mismatch for body.0.weight: the file holds \(8, 4\), the model has \(9, 4\)"
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(wider)
    assert set(linears) == {"meta"}, "the shapes are compared before the model is built for real"


@register_model("TestTableNet")
class TableNet(nn.Module):
    """A registered model with a non-persistent buffer sized by its config: not in the file, still memory."""

    def __init__(self, table: int = 4) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.register_buffer("table", torch.zeros(table), persistent=False)


@register_model("TestValueReadingNet")
class ValueReadingNet(nn.Module):
    """A registered model whose constructor reads a tensor's value, which the meta device cannot give."""

    def __init__(self, width: int = 4, table: int = 1) -> None:
        super().__init__()
        self.layer = nn.Linear(width, 2)
        self.register_buffer("table", torch.zeros(table), persistent=False)
        self.scale = float(torch.ones(1).sum().item())


@register_model("TestLazyNet")
class LazyNet(nn.Module):
    """A registered model with a lazy layer: its shape comes from the file's tensors when they are loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.LazyLinear(2)


def test_a_lazy_layer_takes_its_shape_from_the_file(tmp_path: Path) -> None:
    tensors = _net_tensors(width=5)
    loaded = load_checkpoint(_file(tmp_path / "lazy.safetensors", tensors, "TestLazyNet", {}))
    torch.testing.assert_close(loaded.model.layer.weight, tensors["layer.weight"], rtol=0, atol=0)  # stored: exact


def test_memory_a_file_does_not_store_is_counted_too(tmp_path: Path) -> None:
    path = _file(tmp_path / "t.safetensors", _net_tensors(), "TestTableNet", {"table": 4})
    assert load_checkpoint(path).model.table.shape == (4,)
    big = _file(tmp_path / "big.safetensors", _net_tensors(), "TestTableNet", {"table": 10**12})  # 4 TB of zeros
    with pytest.raises(CheckpointError, match=f"{10**12 + 10:,} parameter and buffer values"):
        load_checkpoint(big)


def test_a_model_that_cannot_be_built_on_meta_is_built_under_the_bound(tmp_path: Path) -> None:
    tensors = _net_tensors()
    loaded = load_checkpoint(_file(tmp_path / "v.safetensors", tensors, "TestValueReadingNet", {}))
    assert loaded.model.scale == 1.0
    torch.testing.assert_close(loaded.model.layer.weight, tensors["layer.weight"], rtol=0, atol=0)  # stored: exact
    stored = sum(t.numel() for t in tensors.values())
    too_big = 2 * stored + 2**20  # with the layer's values, past the bound: stopped as it is registered
    with pytest.raises(CheckpointError, match="far larger than the weights stored in it"):
        load_checkpoint(_file(tmp_path / "v.safetensors", tensors, "TestValueReadingNet", {"table": too_big}))


def test_absurd_sizes_and_unreadable_metadata_are_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"hidden_sizes\[0\] must be <= 2\*\*31 - 1"):
        DuelingQNetwork(4, 2, hidden_sizes=[2**31])
    small = save_checkpoint(DuelingQNetwork(4, 2, hidden_sizes=(8,)), tmp_path / "q.safetensors")
    with pytest.raises(CheckpointError, match=r"hidden_sizes\[0\] must be <= 2\*\*31 - 1"):
        load_checkpoint(_with_config(small, tmp_path / "overflow.safetensors", hidden_sizes=[2**40]))
    with pytest.raises(CheckpointError, match="no count or index is that large"):  # refused by the JSON reader
        load_checkpoint(_with_config(small, tmp_path / "overflow.safetensors", hidden_sizes=[2**70]))
    with safe_open(str(small), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open's API, not a dict
    for text in ('{"state_dim": ' + "1" * 5000 + "}", "[" * 100_000):
        metadata = {ARCHITECTURE_KEY: "DuelingQNetwork", CONFIG_KEY: text}
        save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=metadata)
        with pytest.raises(CheckpointError, match="is not valid JSON"):
            load_checkpoint(tmp_path / "bad.safetensors")


# ---------------------------------------------------------------------------------------------
# the command line, in a fresh interpreter: what the user's shell sees


def _shell(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "lightning_ig.cli", "diag", "--quiet", *args]
    return subprocess.run(
        command, check=False, capture_output=True, text=True, cwd=workspace, env=environment, timeout=300
    )


def test_diag_refuses_the_files_import_path_and_runs_it_only_on_the_flag(tmp_path: Path, marker: Path) -> None:
    _file(tmp_path / "q.safetensors", _net_tensors(), "tests.support.markermod:Net", {"width": 4})
    np.save(tmp_path / "st.npy", np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32))
    refused = _shell(tmp_path, "--checkpoint", "q.safetensors", "--states", "st.npy", "--output", "r.json")
    assert refused.returncode == 2 and not marker.exists() and not (tmp_path / "r.json").exists(), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "--trust-remote-code" in refused.stderr
    assert "--model tests.support.markermod:Net" in refused.stderr
    for flags in (["--trust-remote-code"], ["--model", "tests.support.markermod:Net"]):
        run = _shell(tmp_path, "--checkpoint", "q.safetensors", "--states", "st.npy", "--output", "r.json", *flags)
        assert run.returncode == 0 and marker.exists(), run.stderr
        assert json.loads((tmp_path / "r.json").read_text())["architecture"] == "tests.support.markermod:Net"
        marker.unlink()


def test_diag_on_a_file_naming_this_prints_nothing_and_exits_2(tmp_path: Path) -> None:
    _file(tmp_path / "zen.safetensors", _net_tensors(), "this:X", {})
    np.save(tmp_path / "st.npy", np.zeros((2, 4), dtype=np.float32))
    run = _shell(tmp_path, "--checkpoint", "zen.safetensors", "--states", "st.npy", "--output", "r.json")
    assert run.returncode == 2 and run.stdout == "" and "Beautiful is better" not in run.stderr, run
    assert "'this:X'" in run.stderr and "--trust-remote-code" in run.stderr


def test_diag_on_a_160_gb_config_exits_2_naming_the_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    net = DuelingQNetwork(4, 2, hidden_sizes=(8, 8))
    small = save_checkpoint(net, tmp_path / "q.safetensors", states=torch.zeros(3, 4))
    _with_config(small, tmp_path / "huge.safetensors", hidden_sizes=[200000, 200000])
    monkeypatch.chdir(tmp_path)
    code = cli.main(["diag", "--checkpoint", "huge.safetensors", "--auto-samples", "3", "--output", "r.json"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith("lightning-ig diag: error:"), err
    err = err.strip().splitlines()[-1]
    gib = _numel({**net.config(), "hidden_sizes": [200000, 200000]}) * 4 / 2**30
    assert "larger than the weights stored in it" in err and f"({gib:,.1f} GiB)" in err, err
    assert not (tmp_path / "r.json").exists()


def test_help_says_what_trust_remote_code_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["diag", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--trust-remote-code" in text and "runs that module's code" in text
    assert "only registered architectures are built from its metadata" in text


def test_a_plain_state_dict_named_without_its_arguments_is_told_how_to_give_them(tmp_path: Path) -> None:
    # guards against: "missing 2 required positional arguments" said alone, not how the file's reader passes them
    from safetensors.torch import save_file

    from lightning_ig import DuelingQNetwork, load_checkpoint

    path = tmp_path / "plain.safetensors"
    save_file({k: v.contiguous() for k, v in DuelingQNetwork(4, 2).state_dict().items()}, str(path))
    with pytest.raises(CheckpointError, match=r"missing 2 required .*give its arguments: diag's --model-kwargs JSON"):
        load_checkpoint(path, architecture="lightning_ig.models:DuelingQNetwork")
    loaded = load_checkpoint(
        path, architecture="lightning_ig.models:DuelingQNetwork", config={"state_dim": 4, "num_actions": 2}
    )
    assert sum(p.numel() for p in loaded.model.parameters()) > 0


@pytest.mark.parametrize(("wrap", "stem"), [("compiled", "_orig_mod."), ("wrapped", "agent.net.")])
def test_a_state_dict_saved_under_a_prefix_is_told_the_prefix_that_loads_it(
    tmp_path: Path, wrap: str, stem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: torch.compile(model).state_dict() (every key under '_orig_mod.') saved with save_file, said
    # only as 14 missing and 14 unexpected keys, not that --prefix _orig_mod. (prefix=) loads the file as it is
    from lightning_ig import DuelingQNetwork, load_checkpoint

    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    holder = torch.compile(net) if wrap == "compiled" else nn.ModuleDict({"agent": nn.ModuleDict({"net": net})})
    path = tmp_path / "state_dict.safetensors"
    save_file({k: v.contiguous() for k, v in holder.state_dict().items()}, str(path))
    named: dict[str, Any] = {"architecture": "lightning_ig.models:DuelingQNetwork", "config": net.config()}
    escaped = re.escape(stem)
    said = rf"unexpected \[{escaped}.*\] \(14\); each key is the model's under {escaped}: pass --prefix {escaped} \("
    with pytest.raises(CheckpointError, match=said):
        load_checkpoint(path, **named)
    model = ["--model", named["architecture"], "--model-kwargs", json.dumps(named["config"])]
    assert cli.main(["diag", "--checkpoint", str(path), *model, "--output", str(tmp_path / "r.json")]) == 2
    said_whole = f"pass --prefix {stem} (prefix=)); check --model/--model-kwargs or the head"
    assert capsys.readouterr().err.strip().endswith(said_whole)  # one line, nothing of it cut short
    loaded = load_checkpoint(path, prefix=stem, **named)
    for key, value in net.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    save_file({"x": torch.zeros(1)}, str(path))  # keys that are not the model's under any prefix: none said
    with pytest.raises(CheckpointError, match=r"unexpected \[x\] \(1\)\); check"):
        load_checkpoint(path, **named)


def test_the_prefix_told_for_a_state_dict_under_one_is_the_whole_one(tmp_path: Path) -> None:
    # guards against: a compiled submodule's keys read under the prefix given (--prefix agent.), told to pass
    # --prefix _orig_mod., which selects no key of the file: the prefix that loads it is agent._orig_mod.
    from lightning_ig import DuelingQNetwork, load_checkpoint

    net = DuelingQNetwork(4, 2, hidden_sizes=(8,))
    path = tmp_path / "state_dict.safetensors"
    save_file({f"agent._orig_mod.{key}": value.contiguous() for key, value in net.state_dict().items()}, str(path))
    named: dict[str, Any] = {"architecture": "lightning_ig.models:DuelingQNetwork", "config": net.config()}
    with pytest.raises(CheckpointError, match=r"under _orig_mod\.: pass --prefix agent\._orig_mod\. \(prefix=\)"):
        load_checkpoint(path, prefix="agent.", **named)
    loaded = load_checkpoint(path, prefix="agent._orig_mod.", **named)
    assert all(torch.equal(loaded.model.state_dict()[key], value) for key, value in net.state_dict().items())
