"""lightning_ig/_files.py: inputs that are regular files; outputs checked before the work, written atomically (all
or none, also on SIGTERM), with the user's modes and never an unsafe bit."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ig._files import (
    InputPathError,
    OutputPathError,
    OutputPlan,
    atomic_path,
    atomic_paths,
    check_input_file,
    check_output_dir,
    check_output_file,
    file_name_limit,
)
from tests.support import REPO


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(text)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_file_mode_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        _write(tmp_path / "a.json", "{}")
        os.umask(0o002)
        _write(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.json") == 0o644
    assert _mode(tmp_path / "b.json") == 0o664


def test_an_overwritten_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    target.chmod(0o664)
    _write(target, "new")
    assert target.read_text() == "new"
    assert _mode(target) == 0o664


def test_a_symlink_is_written_through_not_replaced(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    _write(link, "new")
    assert link.is_symlink()
    assert real.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as temporary:
        temporary.write_text("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_check_output_file_refuses_inputs_folders_and_devices(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"weights")
    with pytest.raises(OutputPathError, match="also an input"):
        check_output_file(checkpoint, what="--output", inputs=[checkpoint])
    link = tmp_path / "alias.safetensors"
    link.symlink_to(checkpoint)
    with pytest.raises(OutputPathError, match="also an input"):  # the same file by another name
        check_output_file(link, what="--output", inputs=[checkpoint])
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output_file(tmp_path, what="--output")
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output_file(f"{tmp_path / 'missing'}{os.sep}", what="--output")
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output_file(tmp_path / "missing" / "r.json", what="--output")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError, match="not a regular file"):
        check_output_file(fifo, what="--output")
    if os.path.exists("/dev/null"):
        with pytest.raises(OutputPathError, match="not a regular file"):
            check_output_file("/dev/null", what="--output")
    assert checkpoint.read_bytes() == b"weights"
    assert check_output_file(tmp_path / "new.json", what="--output") == tmp_path / "new.json"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_check_output_file_refuses_an_unwritable_folder(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match="not writable"):
            check_output_file(locked / "r.json", what="--output")
    finally:
        locked.chmod(0o700)


def test_check_output_dir_creates_folders_and_refuses_files(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path / "a" / "b", what="report_dir").is_dir()
    existing = tmp_path / "file"
    existing.write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        check_output_dir(existing, what="report_dir")
    with pytest.raises(OutputPathError, match="cannot be created"):
        check_output_dir(existing / "below", what="report_dir")


def test_a_made_up_name_replaces_a_planted_link_never_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("nobody named me")
    victim.chmod(0o600)
    link = tmp_path / "ig_report_step=00000001.json"
    link.symlink_to(victim)
    old = os.umask(0o022)
    try:
        with atomic_path(link, follow_symlinks=False) as temporary:
            temporary.write_text("report")
    finally:
        os.umask(old)
    assert victim.read_text() == "nobody named me" and _mode(victim) == 0o600
    assert not link.is_symlink() and link.read_text() == "report"
    assert _mode(link) == 0o644, "a new file's mode, not the link target's"


def test_a_long_name_leaves_room_for_the_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / ("r" * (file_name_limit(tmp_path) - 5) + ".json")  # as long as the file system takes
    _write(target, "{}")
    assert target.read_text() == "{}"
    with pytest.raises(OutputPathError, match="the file name is .* bytes, more than the"):
        check_output_file(tmp_path / ("r" * file_name_limit(tmp_path) + ".json"), what="--output")


def test_a_hard_link_of_an_input_is_the_input(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"weights")
    os.link(checkpoint, tmp_path / "other_name.json")
    for made_up in (False, True):
        with pytest.raises(OutputPathError, match="'.*other_name.json' is also an input .*model.safetensors"):
            check_output_file(tmp_path / "other_name.json", what="--output", inputs=[checkpoint], made_up=made_up)
    assert checkpoint.read_bytes() == b"weights"


def test_a_made_up_name_that_is_a_link_is_refused_a_named_one_followed(tmp_path: Path) -> None:
    (tmp_path / "target.json").write_text("old")
    (tmp_path / "link.json").symlink_to("target.json")
    assert check_output_file(tmp_path / "link.json", what="--output") == tmp_path / "link.json"
    with pytest.raises(OutputPathError, match=r"is a symbolic link \(to 'target.json'\); lightning-ig makes this name"):
        check_output_file(tmp_path / "link.json", what="a picture", made_up=True)
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OutputPathError, match="leads to no file"):
        check_output_file(tmp_path / "loop", what="--output")


def test_a_plan_refuses_two_outputs_that_are_one_file_naming_both(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("a")
    os.link(tmp_path / "a.json", tmp_path / "hard.json")
    (tmp_path / "soft.json").symlink_to("a.json")
    for other, made_up in (("a.json", False), ("./a.json", True), ("hard.json", True), ("soft.json", False)):
        plan = OutputPlan()
        plan.add_file(tmp_path / "a.json", what="--output")
        with pytest.raises(OutputPathError, match=f"the picture '.*{other}' and --output '.*a.json' are the same file"):
            plan.add_file(f"{tmp_path}/{other}", what="the picture", made_up=made_up)
    plan = OutputPlan()
    plan.add_file(tmp_path / "a.json", what="--output")
    assert [planned.path.name for planned in plan.files] == ["a.json"]


def test_a_plan_changes_nothing_on_disk(tmp_path: Path) -> None:
    plan = OutputPlan(inputs=[tmp_path / "in.json", None])
    pictures = plan.add_folder(tmp_path / "new" / "pictures", what="--saliency")
    picture = plan.add_file(pictures / "saliency.png", what="--saliency picture", made_up=True)
    assert not (tmp_path / "new").exists() and picture.made_up
    with pytest.raises(OutputPathError, match="--output '.*new' and --saliency '.*pictures' are the same path"):
        plan.add_file(tmp_path / "new", what="--output")  # a file where a folder the plan makes goes
    with pytest.raises(OutputPathError, match="also an input"):
        plan.add_file(tmp_path / "in.json", what="--output")
    assert [planned.path for planned in plan.files] == [pictures / "saliency.png"] and not (tmp_path / "new").exists()
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OutputPathError, match="cannot be created"):
        OutputPlan().add_folder(tmp_path / "a_file" / "below", what="--saliency")


@pytest.mark.parametrize("follow_symlinks", [True, False])
def test_the_writers_follow_a_link_only_when_told(tmp_path: Path, follow_symlinks: bool) -> None:
    import numpy as np

    from lightning_ig.views.pictures.saliency import write_png
    from lightning_ig.views.report import write_report

    writers = {
        "r.json": lambda path: write_report({"a": 1}, path, follow_symlinks=follow_symlinks),
        "p.png": lambda path: write_png(np.zeros((2, 2, 3), np.uint8), path, follow_symlinks=follow_symlinks),
    }
    for name, write in writers.items():
        victim, link = tmp_path / f"victim.{name}", tmp_path / name
        victim.write_bytes(b"old")
        link.symlink_to(victim)
        write(link)
        assert link.is_symlink() is follow_symlinks, name
        assert (victim.read_bytes() != b"old") is follow_symlinks, name


# ---------------------------------------------------------------------------------------------
# inputs


def test_an_input_path_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # opening it would block forever
    (tmp_path / "zeros").symlink_to("/dev/zero")  # reading it would never end
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling").symlink_to("gone.json")
    (tmp_path / "folder").mkdir()
    cases = {
        tmp_path / "pipe": "is a FIFO (a named pipe), not a regular file",
        tmp_path / "zeros": "is a device, not a regular file",
        tmp_path / "loop": "is a symbolic-link loop",
        tmp_path / "dangling": "is a symbolic link to 'gone.json', which does not exist",
        tmp_path / "folder": "is a folder, not a regular file",
        tmp_path / "missing.json": "does not exist",
        tmp_path / ("a" * 5000): "is too long for the file system",
        f"{tmp_path}/a\x00b": "holds a NUL character",
    }
    for path, words in cases.items():
        with pytest.raises(InputPathError, match="--states .*" + words.replace("(", r"\(").replace(")", r"\)")):
            check_input_file(path, "--states")
    (tmp_path / "states.json").write_text("[]")
    assert check_input_file(tmp_path / "states.json", "--states") == tmp_path / "states.json"


def test_an_input_path_starting_with_a_tilde_is_in_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "states.json").write_text("[]")
    assert check_input_file("~/states.json", "states") == tmp_path / "states.json"


# ---------------------------------------------------------------------------------------------
# all or none, signals, modes


def test_the_files_of_one_write_are_all_written_or_none(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("old a")
    with (
        pytest.raises(OSError, match="No space left"),
        atomic_paths([(tmp_path / "a.json", True), (tmp_path / "b.json", True)]) as (a, b),
    ):
        a.write_text("new a")
        raise OSError(28, "No space left on device")  # the second file could not be written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"] and (tmp_path / "a.json").read_text() == "old a"
    committed = []
    with atomic_paths(
        [(tmp_path / "a.json", True), (tmp_path / "b.json", False)], committed=lambda: committed.append(1)
    ) as (a, b):
        a.write_text("new a")
        b.write_text("new b")
        assert not committed and (tmp_path / "a.json").read_text() == "old a", "nothing replaced before the end"
    assert committed == [1] and sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


def test_a_failed_write_removes_the_folders_it_made_and_only_those(tmp_path: Path) -> None:
    """A write into a new nested folder that fails (a full disk) leaves no empty folder behind (it left
    ``new/pictures``); a folder that was there before stays, and one made for a write that succeeds is kept."""
    (tmp_path / "old").mkdir()
    targets = [(tmp_path / "old" / "a.json", True), (tmp_path / "new" / "pictures" / "b.png", False)]
    with pytest.raises(OSError, match="No space left"), atomic_paths(targets) as (a, b):
        a.write_text("a")
        raise OSError(28, "No space left on device")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["old"]
    with atomic_paths(targets) as (a, b):
        a.write_text("a")
        b.write_text("b")
    assert (tmp_path / "new" / "pictures" / "b.png").read_text() == "b"


_SIGNAL_DURING_A_WRITE = """
import os, signal, sys, time
from lightning_ig._files import atomic_path, atomic_paths
folder = sys.argv[1]
signal.signal(getattr(signal, sys.argv[2]), signal.SIG_DFL)  # as a terminal leaves it (nohup's SIGHUP is ignored)
with atomic_paths([(folder + "/a.bin", True), (folder + "/b.bin", True)]) as temporaries:
    for temporary in temporaries:
        temporary.write_bytes(b"x" * 1_000_000)
    with atomic_path(temporaries[1], follow_symlinks=False) as inner:  # a writer inside, as write_report is
        inner.write_bytes(b"y" * 1_000_000)
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        time.sleep(30)
print("not ended")
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_that_ends_the_process_during_a_write_leaves_no_temporary_file(tmp_path: Path, name: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_DURING_A_WRITE, str(tmp_path), name],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -getattr(signal, name), done.stderr  # ended by the signal, as it would have been
    assert list(tmp_path.iterdir()) == [], "no hidden temporary file, no half of the files"


def test_an_overwritten_file_never_keeps_setuid_setgid_sticky_or_others_write(tmp_path: Path) -> None:
    planted = tmp_path / "report.json"
    planted.write_text("old")
    planted.chmod(0o7777)  # its owner may set every bit, root or not
    _write(planted, "new")
    assert _mode(planted) == 0o775 and planted.read_text() == "new"


def test_every_reader_refuses_a_fifo_at_once_instead_of_blocking_on_it(tmp_path: Path) -> None:
    from lightning_ig import IntegratedGradientsCallback
    from lightning_ig.checkpoint import CheckpointError, list_heads, load_checkpoint, load_states
    from lightning_ig.cli.exits import UsageError, read_json_file

    for name in ("pipe.safetensors", "pipe.npy", "pipe.json"):
        os.mkfifo(tmp_path / name)
    readers = [
        (lambda: IntegratedGradientsCallback(tmp_path / "pipe.npy"), InputPathError),  # the callback's states path
        (lambda: load_states(tmp_path / "pipe.npy"), CheckpointError),
        (lambda: load_states(tmp_path / "pipe.json"), CheckpointError),
        (lambda: load_checkpoint(tmp_path / "pipe.safetensors"), CheckpointError),
        (lambda: list_heads(tmp_path / "pipe.safetensors"), CheckpointError),
        (lambda: read_json_file(str(tmp_path / "pipe.json"), "--feature-names", "give a file"), UsageError),
    ]
    for read, error in readers:
        with pytest.raises(error, match=r"is a FIFO \(a named pipe\), not a regular file"):
            read()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc's file-descriptor links")
def test_a_named_link_to_a_pipe_is_refused_before_the_work(tmp_path: Path) -> None:
    # guards against: `diag --output /dev/stdout | jq` or `--output >(cat)`: realpath of such a link names no file
    # ("/proc/<pid>/fd/pipe:[...]"), so the check passed and the write failed after the whole run with
    # "No such file or directory"
    reader, writer = os.pipe()
    try:
        with pytest.raises(OutputPathError, match="not a regular file"):
            check_output_file(f"/proc/self/fd/{writer}", what="--output")
    finally:
        os.close(reader)
        os.close(writer)
