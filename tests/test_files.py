"""lightning_ig/_files.py: outputs checked before the work, written atomically, with the user's modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lightning_ig._files import OutputPathError, atomic_path, check_output_dir, check_output_file


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
