"""Reading and writing files safely: inputs that are files, outputs checked before any work and replaced atomically.

Every file lightning-ig reads must be a regular file (:func:`check_input_file`, :func:`open_input`): a FIFO never
blocks the reader, a link to ``/dev/zero`` never feeds it until memory runs out, and the message names what the path
is instead. Every file it writes goes through here, so the rules hold everywhere:

* the files a command writes are checked together *before* the work (:class:`OutputPlan`, :func:`check_output_file`,
  :func:`check_output_dir`): none may be an input of the run (by path, symbolic or hard link), no two the same file;
* a path the *user* named is written *through* a symbolic link; a name the *tool* makes up inside a folder never is;
* readers see the old file or the new one, never half of one; a command's files are written all or none
  (:func:`atomic_paths`), and SIGTERM or SIGHUP during a write removes the temporary files;
* modes follow the user's umask; an overwritten file keeps its permission bits, never setuid, setgid, sticky or
  writable by everyone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "InputPathError",
    "OutputPathError",
    "OutputPlan",
    "PlannedOutput",
    "atomic_path",
    "atomic_paths",
    "check_input_file",
    "check_output_dir",
    "check_output_file",
    "file_name_limit",
    "open_input",
]

_Paths = Iterable["str | os.PathLike[str] | None"]


class OutputPathError(ValueError):
    """An output path that must not or cannot be written; the message says which and what to do."""


class InputPathError(ValueError):
    """An input path that is not a readable regular file; the message says what it is and what to do."""


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_input_file(path: str | os.PathLike[str], what: str, fix: str = "give a regular file") -> Path:
    """``path`` as a :class:`Path` when it names a regular file this process may read (symbolic links followed, a
    leading ``~`` expanded). Nothing is opened: a FIFO or a device (``/dev/zero``) cannot hang the check.

    Args:
        path: the file.
        what: how the user named it (``"--states"``, ``"checkpoint"``), for the message.
        fix: what to do, ending the message.

    Raises:
        InputPathError: the path does not exist, is a symbolic-link loop, a folder, a FIFO, a device or a socket,
            is too long for the file system, holds a NUL character, or is not readable; the message says which.
    """
    named = f"{what} {os.fspath(path)!r}"
    path = os.path.expanduser(os.fspath(path))  # "~/states.npy", as a shell and every path option read it
    try:
        info = os.stat(path)
    except ValueError:  # a NUL character: no system call takes it
        raise InputPathError(f"{named} holds a NUL character, which no file name can; {fix}") from None
    except OSError as error:
        raise InputPathError(f"{named} {_unreachable(path, error)}; {fix}") from None
    if (kind := next((name for test, name in _KINDS if test(info.st_mode)), None)) is not None:
        raise InputPathError(f"{named} is {kind}, not a regular file; {fix}")
    if not os.access(path, os.R_OK):
        raise InputPathError(f"{named} is not readable (permission denied); check its permissions")
    return Path(path)


def _unreachable(path: str | os.PathLike[str], error: OSError) -> str:
    """Why ``os.stat(path)`` failed, in words."""
    if error.errno == errno.ELOOP:
        return "is a symbolic-link loop"
    if error.errno == errno.ENAMETOOLONG:
        return f"is too long for the file system ({len(os.fsencode(path)):,} bytes)"
    if error.errno == errno.ENOENT and os.path.islink(path):
        return f"is a symbolic link to {os.readlink(path)!r}, which does not exist"
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        return "does not exist"
    return f"cannot be read ({_reason(error)})"


@contextlib.contextmanager
def open_input(path: str | os.PathLike[str], what: str, fix: str = "give a regular file") -> Iterator[BinaryIO]:
    """The regular file ``path`` open for reading, checked as :func:`check_input_file` checks it.

    It is opened without blocking and checked again once open, so a FIFO put in its place since the check cannot
    block the reader. A reader that parses the file into more memory than its size bounds it first
    (:func:`~lightning_ig.vocabulary.check_memory`, with ``os.fstat(handle.fileno()).st_size``).

    Raises:
        InputPathError: as :func:`check_input_file`.
        OSError: the file cannot be opened.
    """
    path = check_input_file(path, what, fix)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise InputPathError(f"{what} {os.fspath(path)!r} is no longer a regular file; {fix}")
        yield handle


@dataclass(frozen=True)
class PlannedOutput:
    """One file a command will write, as checked by :class:`OutputPlan`.

    Attributes:
        path: the path as the user (or the tool) spelt it.
        what: how it is named in messages (``"--output"``, ``"--saliency picture"``).
        made_up: the tool made the name up inside a folder: it is never written through a symbolic link.
    """

    path: Path
    what: str
    made_up: bool = False


def _resolved(path: Path) -> Path:
    """The real path behind ``path`` (links followed), whether it exists or not."""
    return Path(os.path.realpath(path))


def _destination(path: Path, *, follow_symlinks: bool) -> Path:
    """The directory entry a write replaces: a link's target for a user's path, the name itself for a made-up one."""
    return _resolved(path) if follow_symlinks else _resolved(path.parent) / path.name


def _identity(path: Path, *, follow_symlinks: bool = True) -> tuple[int, int] | None:
    """(device, inode) of an existing file, which hard links share; ``None`` for a missing one."""
    try:
        info = os.stat(path, follow_symlinks=follow_symlinks)
    except (OSError, ValueError):  # missing, a dangling link, a name the system cannot take
        return None
    return info.st_dev, info.st_ino


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def file_name_limit(folder: str | os.PathLike[str]) -> int:
    """The longest file name, in bytes, that the file system holding ``folder`` takes (255 where it does not say).

    A folder that does not exist yet is asked through its nearest existing parent.
    """
    real = _resolved(Path(folder))
    existing = next((parent for parent in (real, *real.parents) if parent.is_dir()), real.anchor or os.sep)
    try:
        return int(os.pathconf(existing, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or the system does not know
        return 255


def check_output_file(
    path: str | os.PathLike[str], *, what: str = "output", inputs: _Paths = (), made_up: bool = False
) -> Path:
    """Check, before any work, that ``path`` can take an output file; return it as a :class:`Path`.

    Args:
        path: the file to write.
        what: how the user named it (``"--output"``, ``"report_dir"``), for the message.
        inputs: files the same run reads; writing over one of them (by any name: a symbolic or a hard link) is refused.
        made_up: the tool made the name up inside a folder (default ``False``: the user named ``path``, and a
            symbolic link there is written through to its target). A made-up name that is a link is refused.

    Raises:
        OutputPathError: ``path`` is one of ``inputs``, is a folder, a device, a FIFO or
            another non-regular file, a symbolic link at a made-up name, has a name longer
            than the file system takes, names a missing folder, or is not writable.
    """
    return _check_file(Path(path), os.fspath(path), what, [Path(p) for p in inputs if p is not None], made_up=made_up)


def _check_file(
    target: Path, shown: str, what: str, inputs: list[Path], *, made_up: bool, folder_planned: bool = False
) -> Path:
    """:func:`check_output_file`; ``folder_planned``: the folder may be missing, it is made once every check passed."""
    if not shown or shown.endswith(os.sep):
        why = f"is a folder name (it ends with {os.sep!r})" if shown else "is empty"
        raise OutputPathError(f"{what} {shown!r} {why}; give a file name")
    named = f"{what} {shown!r}"
    destination = _destination(target, follow_symlinks=not made_up)
    size, limit = len(os.fsencode(destination.name)), file_name_limit(destination.parent)
    if size > limit:  # checked first: the system refuses to look such a name up at all
        raise OutputPathError(
            f"{named}: the file name is {size} bytes, more than the {limit} its folder's file system takes; "
            "choose a shorter name"
        )
    mine = _identity(target, follow_symlinks=not made_up)  # a hard link to an input is that input
    for source in inputs:  # writing the output would replace the input, or the link by which the run reads it
        if destination in (_resolved(source), _resolved(source.parent) / source.name) or (
            mine is not None and mine == _identity(source)
        ):
            raise OutputPathError(
                f"{named} is also an input of this run ({os.fspath(source)!r}); "
                "writing the output there would destroy it: choose another file name"
            )
    try:
        mode: int | None = os.lstat(destination).st_mode
    except FileNotFoundError:  # or a link to what has no path (/dev/stdout on a pipe, >(cmd)): realpath names no file
        mode = os.stat(target).st_mode if not made_up and os.path.exists(target) else None
    except OSError as error:
        raise OutputPathError(f"{named} cannot be used ({_reason(error)}); choose another file name") from None
    if mode is not None:  # an existing entry at the destination must be a regular file (a made-up name: not a link)
        if stat.S_ISLNK(mode) and not made_up:  # a user's path was resolved: realpath gives up only on a loop of links
            raise OutputPathError(f"{named} is a symbolic link that leads to no file (a loop); give a plain file name")
        if stat.S_ISLNK(mode):
            raise OutputPathError(
                f"{named} is a symbolic link (to {os.readlink(destination)!r}); lightning-ig makes this name "
                "itself and never writes through a link: remove the link, or choose another folder"
            )
        if stat.S_ISDIR(mode):
            raise OutputPathError(f"{named} is a folder; give a file name inside it")
        if not stat.S_ISREG(mode):
            raise OutputPathError(f"{named} is not a regular file (a device, FIFO or socket); give a plain file name")
    folder = destination.parent
    if folder_planned and not folder.exists():
        return target  # the plan checked the folder and makes it: nothing can be in it yet
    if not folder.is_dir():
        raise OutputPathError(f"{named}: the folder {str(folder)!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (mode is not None and not os.access(destination, os.W_OK)):
        raise OutputPathError(f"{named} is not writable; choose a folder you can write to")
    return target


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output folder", create: bool = True) -> Path:
    """Check, before any work, that ``path`` is or can become a writable folder.

    Args:
        path: the folder.
        what: how the user named it, for the message.
        create: make the missing folders now (default ``True``); ``False``: only check that
            they can be made (:class:`OutputPlan` makes them once every output passed).

    Raises:
        OutputPathError: ``path`` (or a parent) is a file, or the folder cannot be created or written.
    """
    folder = Path(path)
    if not os.fspath(path):  # Path("") is the current folder: nobody names it so
        raise OutputPathError(f"{what} '' is empty; give a folder path ('.' for the current folder)")
    real, named = _resolved(folder), f"{what} {str(folder)!r}"
    if real.exists() and not real.is_dir():
        raise OutputPathError(f"{named} is a file, not a folder; give a folder path")
    if create:
        try:
            real.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputPathError(f"{named} cannot be created ({error.strerror}); choose another folder") from None
    existing = next(parent for parent in (real, *real.parents) if parent.exists())  # real itself once made
    if not existing.is_dir():
        raise OutputPathError(f"{named} cannot be created ({str(existing)!r} is a file); choose another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"{named} is not writable; choose a folder you can write to")
    return folder


class OutputPlan:
    """Every file one command will write, checked together before any work.

    Each file is checked as :func:`check_output_file` checks one, against every input, and against every file and folder
    planned before it: two outputs that are the same file (by their path, a symbolic link or a hard link) or a file
    where a planned folder goes are refused, naming both. Nothing is changed on disk: a planned folder is made by
    :func:`atomic_paths` as it writes the files in it (and removed again if the write fails).

    Args:
        inputs: the files the command reads (``None`` entries are skipped).

    Example::

        plan = OutputPlan(inputs=[checkpoint])
        pictures = plan.add_folder("saliency", what="--saliency")
        report = plan.add_file("r.json", what="--output")
        picture = plan.add_file(pictures / "saliency.png", what="--saliency picture", made_up=True)
    """

    def __init__(self, inputs: _Paths = ()) -> None:
        self._inputs = [Path(path) for path in inputs if path is not None]
        self._files: list[tuple[PlannedOutput, Path, tuple[int, int] | None]] = []  # with destination, identity
        self._folders: list[tuple[Path, str, set[Path]]] = []  # the user's path, what, the folders to make

    @property
    def files(self) -> list[PlannedOutput]:
        """The planned files, in the order they were added."""
        return [planned for planned, _, _ in self._files]

    def add_folder(self, path: str | os.PathLike[str], *, what: str) -> Path:
        """Plan a folder (made, with its missing parents, as its files are written); return it as a :class:`Path`.

        Raises:
            OutputPathError: as :func:`check_output_dir`, or a planned file is where the folder goes.
        """
        folder = check_output_dir(path, what=what, create=False)
        real = _resolved(folder)
        missing = {parent for parent in (real, *real.parents) if not parent.exists()}
        for planned, destination, _ in self._files:
            if destination in missing:
                raise _folder_and_file(f"{what} {str(folder)!r}", f"{planned.what} {os.fspath(planned.path)!r}")
        self._folders.append((folder, what, missing | {real}))
        return folder

    def add_file(self, path: str | os.PathLike[str], *, what: str, made_up: bool = False) -> PlannedOutput:
        """Plan a file; ``made_up``: the tool made its name up (see :func:`check_output_file`).

        Raises:
            OutputPathError: as :func:`check_output_file`, or the file is one planned before it
                (by any name) or a planned folder.
        """
        target = Path(path)
        destination = _destination(target, follow_symlinks=not made_up)
        folder_planned = any(destination.parent in made for _, _, made in self._folders)
        _check_file(target, os.fspath(path), what, self._inputs, made_up=made_up, folder_planned=folder_planned)
        identity = _identity(target, follow_symlinks=not made_up)
        shown = f"{what} {os.fspath(path)!r}"
        for other, other_destination, other_identity in self._files:
            if destination == other_destination or (identity is not None and identity == other_identity):
                raise OutputPathError(
                    f"{shown} and {other.what} {os.fspath(other.path)!r} are the same file: one would overwrite "
                    "the other; choose another name for one of them"
                )
        for folder, folder_what, made in self._folders:
            if destination in made:
                raise _folder_and_file(shown, f"{folder_what} {str(folder)!r}")
        planned = PlannedOutput(target, what, made_up)
        self._files.append((planned, destination, identity))
        return planned


def _folder_and_file(first: str, second: str) -> OutputPathError:
    return OutputPathError(
        f"{first} and {second} are the same path: one would be a folder, the other a file; choose another name for "
        "one of them"
    )


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, follow_symlinks: bool = True) -> Iterator[Path]:
    """A temporary file beside the file ``target`` names; it replaces that file when the block succeeds.

    Args:
        target: the file to write. Missing parent folders are created (and removed if the block fails).
        follow_symlinks: ``True`` (default, for a path the user named): when ``target`` is a symbolic link the file it
            points to is replaced and the link stays. ``False`` (for a name the tool made up inside a folder): the name
            itself is replaced, a link there included, and never what it points to.

    The new file keeps the old regular file's permission bits, less setuid, setgid, sticky and others' write
    (``0o666 & ~umask`` for a new one). The temporary is made with ``O_EXCL``, so it follows no link either; on any
    exception inside the block, and on SIGTERM or SIGHUP, it is removed and the old file is left as it was.
    """
    with atomic_paths([(target, follow_symlinks)]) as (temporary,):
        yield temporary


@contextlib.contextmanager
def atomic_paths(
    targets: Sequence[tuple[str | os.PathLike[str], bool]], *, committed: Callable[[], None] | None = None
) -> Iterator[list[Path]]:
    """Temporary files beside the files ``targets`` name; they replace those files together when the block succeeds.

    All or none: the files are written to their temporaries inside the block, and only once every one is written are
    they renamed over their targets, with SIGINT, SIGTERM and SIGHUP held until the last rename (a rename cannot
    run out of space). An exception inside the block removes every temporary and every folder made for them, and
    leaves every old file as it was. SIGTERM and SIGHUP inside the block, where nobody handles them, are turned into an
    exception there, so that the temporaries are removed; then the process ends by the signal, as it would have (in
    the main thread only: only there can Python handle a signal).

    Args:
        targets: ``(path, follow_symlinks)`` per file, as :func:`atomic_path` takes them.
        committed: called once every file is in place, before a held signal is delivered.

    Yields:
        The temporary files, in the order of ``targets``.
    """
    temporaries: list[tuple[Path, Path, int]] = []  # temporary, destination, mode
    made: list[Path] = []  # the folders this writer made, outermost first: a failed write leaves none of them
    ending: list[int] = []  # the signals this writer turned into _Ended (none in a nested one: the outer did)
    try:
        with _handlers(_end, _ENDING, only_default=True) as ending:
            for target, follow_symlinks in targets:
                real = _destination(Path(target), follow_symlinks=follow_symlinks)
                made += reversed([folder for folder in (real.parent, *real.parent.parents) if not folder.exists()])
                real.parent.mkdir(parents=True, exist_ok=True)
                # The temporary name is kept short, so that a final name near the file system's limit still works.
                descriptor, name = tempfile.mkstemp(prefix=f".{real.name[:64]}.", suffix=".tmp", dir=real.parent)
                os.close(descriptor)
                temporaries.append((Path(name), real, _mode(real)))
            yield [temporary for temporary, _, _ in temporaries]
            with _signals_held():
                for temporary, real, mode in temporaries:
                    os.chmod(temporary, mode)  # mkstemp made it 0600
                    os.replace(temporary, real)  # replaces the name: a link there is replaced, not followed
                if committed is not None:
                    committed()
    except BaseException as error:
        for temporary, _, _ in temporaries:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        for folder in reversed(made):
            with contextlib.suppress(OSError):  # one that holds another's files since is not empty: it stays
                folder.rmdir()
        if isinstance(error, _Ended) and error.args[0] in ending:  # the temporaries are gone: end as asked
            signal.signal(error.args[0], signal.SIG_DFL)
            signal.raise_signal(error.args[0])
        raise


def _mode(real: Path) -> int:
    """The mode of the file replacing ``real``: its permission bits, less setuid, setgid, sticky and others' write."""
    try:
        old = os.lstat(real)
    except FileNotFoundError:
        old = None
    if old is None or not stat.S_ISREG(old.st_mode):
        umask = os.umask(0)  # the only portable way to read it; set back at once
        os.umask(umask)
        return 0o666 & ~umask
    return stat.S_IMODE(old.st_mode) & 0o775  # never setuid, setgid, sticky or writable by everyone


_ENDING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Ended(BaseException):
    """SIGTERM or SIGHUP arrived during a write (``args[0]``): raised there, so that the writer's cleanup runs."""


def _end(signum: int, frame: object) -> None:
    raise _Ended(signum)


@contextlib.contextmanager
def _handlers(
    handler: Callable[[int, object], None], signals: Sequence[int], only_default: bool
) -> Iterator[list[int]]:
    """``handler`` for ``signals`` inside the block, the previous handlers back after it; yields the signals taken. Only
    in the main thread (the only one where Python handles signals); an ignored signal is left alone, and so is one
    someone else handles where ``only_default``."""
    main = threading.current_thread() is threading.main_thread()
    previous = {number: signal.getsignal(number) for number in signals} if main else {}
    taken = [
        number
        for number, old in previous.items()
        if old not in (signal.SIG_IGN, None) and (old is signal.SIG_DFL or not only_default)
    ]
    for number in taken:
        signal.signal(number, handler)
    try:
        yield taken
    finally:
        for number in taken:
            signal.signal(number, previous[number])


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP recorded inside the block and delivered after it, to the handlers of before."""
    held: list[int] = []
    with _handlers(lambda signum, frame: held.append(signum), (signal.SIGINT, *_ENDING), only_default=False):
        yield
    for number in dict.fromkeys(held):
        signal.raise_signal(number)
