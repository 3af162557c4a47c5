"""Writing output files safely: checked before any work, replaced atomically, readable by others.

Every file lightning-ig writes (JSON reports, checkpoints, saliency images) goes
through here, so the rules hold everywhere:

* an output path is checked *before* the work that produces it
  (:func:`check_output_file`, :func:`check_output_dir`): it must not be one of
  the run's inputs, must be a regular file or a new name in an existing,
  writable folder; the error names the user's path and what to do;
* a symbolic link is written *through* (its target is replaced), never replaced
  by a regular file;
* readers see the old file or the new one, never half of one, and a failed
  write leaves nothing behind (:func:`atomic_path`);
* modes follow the user's umask: a new file gets ``0o666 & ~umask`` like any
  program's output, an overwritten file keeps its mode.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["OutputPathError", "atomic_path", "check_output_dir", "check_output_file"]


class OutputPathError(ValueError):
    """An output path that must not or cannot be written; the message says which and what to do."""


def _resolved(path: Path) -> Path:
    """The real path behind ``path`` (links followed), whether it exists or not."""
    return Path(os.path.realpath(path))


def check_output_file(
    path: str | os.PathLike[str], *, what: str = "output", inputs: Iterable[str | os.PathLike[str] | None] = ()
) -> Path:
    """Check, before any work, that ``path`` can take an output file; return it as a :class:`Path`.

    Args:
        path: the file to write (a symbolic link is written through to its target).
        what: how the user named it (``"--output"``, ``"report_dir"``), for the message.
        inputs: files the same run reads; writing over one of them is refused.

    Raises:
        OutputPathError: ``path`` is one of ``inputs``, is a folder, a device, a FIFO or
            another non-regular file, names a missing folder, or is not writable.
    """
    target = Path(path)
    shown = os.fspath(path)  # the user's spelling, for the messages
    real = _resolved(target)
    for source in inputs:
        if source is not None and _resolved(Path(source)) == real:
            raise OutputPathError(
                f"{what} {shown!r} is also an input of this run ({os.fspath(source)!r}); "
                "writing the output there would destroy it: choose another file name"
            )
    if real.is_dir():
        raise OutputPathError(f"{what} {shown!r} is a folder; give a file name inside it")
    if shown.endswith(os.sep):
        raise OutputPathError(f"{what} {shown!r} is a folder name (it ends with {os.sep!r}); give a file name")
    if real.exists() and not stat.S_ISREG(real.stat().st_mode):
        raise OutputPathError(
            f"{what} {shown!r} is not a regular file (a device, FIFO or socket); give a plain file name"
        )
    folder = real.parent
    if not folder.is_dir():
        raise OutputPathError(f"{what} {shown!r}: the folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (real.exists() and not os.access(real, os.W_OK)):
        raise OutputPathError(f"{what} {shown!r} is not writable; choose a folder you can write to")
    return target


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output folder") -> Path:
    """Check, before any work, that ``path`` is or can become a writable folder (missing folders are created).

    Raises:
        OutputPathError: ``path`` (or a parent) is a file, or the folder cannot be created or written.
    """
    folder = Path(path)
    real = _resolved(folder)
    if real.exists() and not real.is_dir():
        raise OutputPathError(f"{what} {str(folder)!r} is a file, not a folder; give a folder path")
    try:
        real.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(f"{what} {str(folder)!r} cannot be created ({error.strerror}); choose another folder") from None
    if not os.access(real, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what} {str(folder)!r} is not writable; choose a folder you can write to")
    return folder


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it; set back at once
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary file beside the file ``target`` names; it replaces that file when the block succeeds.

    ``target`` may be a symbolic link: the file it points to is replaced and the link
    stays. Missing parent folders are created. The new file's mode is the old file's,
    or ``0o666 & ~umask`` for a new one. On any exception inside the block the
    temporary file is removed and the old file is left as it was.
    """
    real = _resolved(Path(target))
    real.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(real.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    descriptor, temporary = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    os.close(descriptor)
    try:
        yield Path(temporary)
        os.chmod(temporary, mode)  # mkstemp made it 0600
        os.replace(temporary, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
