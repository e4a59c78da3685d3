"""Writing files so that nothing is lost: atomic files, and one writer per folder.

* Atomic file writing (:func:`atomic_path`): write to a temporary name in the same folder, then ``os.replace``. An
  interrupted write leaves either the old file or none, never a partial one.
* One writer per folder (:func:`lock_folder`, :func:`folder_lock`): a command that writes a run or output folder
  (``train``, ``zoo build``, ``embed``'s parts folder, ``tag|classify train``) first takes an exclusive ``flock`` on
  :data:`LOCK_NAME` in it. A second writer is refused at once (:class:`~elmokit.errors.FolderInUseError`, naming the
  holder's pid, start time and command) — also with ``--overwrite`` or ``--resume``, which would otherwise delete or
  continue the live run's files. The operating system releases the lock when its process ends, however it ends, so a
  lock left by a killed process (``kill -9``, a crash, a reboot) never blocks.
* Outputs that never clobber (:func:`check_output_path`): an output is never one of the command's inputs (the same
  file after symlinks and hard links), and ``--overwrite`` replaces only a file elmokit wrote and recognises.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import logging
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from elmokit import interrupts
from elmokit.errors import FolderInUseError, MissingFileError, UsageError

try:
    import fcntl
except ImportError:  # not a POSIX system: folders are not locked (see lock_folder)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "atomic_path",
    "atomic_write_text",
    "atomic_write_bytes",
    "file_sha256",
    "lock_folder",
    "folder_lock",
    "FolderLock",
    "LOCK_NAME",
    "check_creatable_folder",
    "same_file",
    "check_not_an_input",
    "check_writable_folder",
    "check_writable_place",
    "check_output_path",
]

logger = logging.getLogger(__name__)

#: The lock file a writer holds in its folder (removed when it releases the lock; a killed writer's stays, unlocked).
LOCK_NAME = ".elmokit.lock"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``, on error deleted.

    Use for libraries that want a file name (h5py, safetensors): ``with atomic_path(p) as tmp: save(tmp)``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = None
    try:
        # created and known together: Ctrl-C/SIGTERM in between (under elmokit.interrupts) would leave it behind
        with interrupts.shielded():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
            tmp_path = Path(tmp)
            os.close(fd)
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the permissions open() would
        os.replace(tmp_path, path)
    except BaseException:
        if tmp_path is not None:
            with contextlib.suppress(FileNotFoundError):
                tmp_path.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (fsync before rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- one writer per folder
class FolderLock:
    """The writer lock of one folder, held by this process (see :func:`lock_folder`); :meth:`release` (or leaving the
    ``with`` block) gives it back. Holding it again in the same process (e.g. the CLI, then the library function it
    calls) is counted, and only the outermost release gives it back."""

    def __init__(self, folder: Path, key: str, fd: int | None, created: bool) -> None:
        self.folder = folder
        self._key = key
        self._fd = fd
        self._created = created
        self._depth = 1

    @property
    def held(self) -> bool:
        return self._depth > 0

    def release(self) -> None:
        """Give the lock back (remove the lock file, then unlock), and remove the folder when this lock created it
        and it is still empty. Releasing twice does nothing."""
        if self._depth <= 0:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        _HELD.pop(self._key, None)
        if self._fd is not None:
            path = self.folder / LOCK_NAME
            with contextlib.suppress(OSError):
                mine, there = os.fstat(self._fd), os.stat(path)
                if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                    path.unlink()  # while still locked: a waiter then finds it gone and starts afresh
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._created:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only when empty: nothing was written

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


#: Folders this process holds, by real path.
_HELD: dict[str, FolderLock] = {}


def check_creatable_folder(folder: str | os.PathLike, what: str) -> None:
    """Raise :class:`~elmokit.errors.UsageError` when ``folder`` is a file or cannot be created because a path above it
    is a file (e.g. ``--out-dir corpus.txt/run``); the message names ``what`` (e.g. ``"--out-dir"``) and that file."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {folder} is a file: give a folder (it is created if missing)")
    for parent in folder.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{what} {folder} cannot be created: {parent} is a file, not a folder")
            break


def _holder_record() -> dict[str, Any]:
    argv = list(sys.argv) or ["?"]
    name = Path(argv[0]).name
    program = f"python -m {Path(argv[0]).parent.name}" if name == "__main__.py" else name
    command = " ".join([program] + [shlex.quote(a) for a in argv[1:]])
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command if len(command) <= 300 else command[:297] + "...",
    }


def _describe_holder(path: Path) -> str:
    """The holder's record in ``path`` as words; it may be empty for a moment (the holder writes it after locking)."""
    for attempt in range(10):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            started = datetime.datetime.fromisoformat(record["started"]).strftime("%Y-%m-%d %H:%M:%S")
            host = record.get("host")
            where = f" on {host}" if host and host != socket.gethostname() else ""
            return f"pid {record['pid']}{where}, started {started}: `{record['command']}`"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.02 * (attempt + 1))
    return "its pid is not recorded yet"


def lock_folder(folder: str | os.PathLike, what: str = "folder") -> FolderLock:
    """Take the writer lock of ``folder`` (created if missing) for this process: an exclusive, non-blocking ``flock``
    on ``folder/.elmokit.lock``, which then records this process (pid, host, start time, command line) for the message
    another writer gets. The operating system drops the lock when the process ends, whatever the way (a lock file left
    by a killed process is taken over). Already held by this process: counted (see :class:`FolderLock`).

    Args:
        folder: the run or output folder. what: how messages name it (``"run folder (--out-dir)"``).

    Returns:
        The :class:`FolderLock`; call :meth:`FolderLock.release` (or use :func:`folder_lock`).

    Raises:
        FolderInUseError: another live process holds it (the message names the folder and that process).
        UsageError: ``folder`` is a file, or a path above it is (see :func:`check_creatable_folder`).
        OSError: the folder cannot be created or the lock file opened (permissions, a read-only file system).
    """
    folder = Path(folder)
    check_creatable_folder(folder, f"the {what}")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    held = _HELD.get(key)
    if held is not None and held.held:
        held._depth += 1
        return held
    if fcntl is None:  # no flock on this system: the folder is not protected against a second writer
        logger.debug("no fcntl on this system: %s is not locked", folder)
        lock = FolderLock(folder, key, None, created)
        _HELD[key] = lock
        return lock
    path = folder / LOCK_NAME
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            os.close(fd)
            raise FolderInUseError(
                f"the {what} {folder} is in use: another elmokit process is writing it "
                f"({_describe_holder(path)}); wait for it to end or stop it — two writers would "
                "mix or delete each other's files"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the holder before us may have removed the file between our open and our lock: then lock the new one
            mine, there = os.fstat(fd), os.stat(path)
            same = (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        record = json.dumps(_holder_record()).encode("ascii")  # ASCII: argv may hold undecodable bytes
        os.ftruncate(fd, 0)
        os.pwrite(fd, record + b"\n", 0)
        lock = FolderLock(folder, key, fd, created)
        _HELD[key] = lock
        return lock
    raise OSError(f"could not take the writer lock {path}: it kept being replaced")


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "folder") -> Iterator[FolderLock]:
    """``with folder_lock(path, "run folder"):`` — :func:`lock_folder` for the block (released however it ends)."""
    lock = lock_folder(folder, what)
    try:
        yield lock
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------- outputs that never clobber
def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: the same device and inode when both exist (so a symlink or a hard link
    to a file is that file), else the same resolved path."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _files_of(path: Path) -> list[Path]:
    """``path`` itself, and for a folder (a model folder) the files directly in it."""
    if path.is_dir():
        return [p for p in sorted(path.iterdir()) if p.is_file()]
    return [path]


def check_not_an_input(
    output: str | os.PathLike,
    inputs: Mapping[str, str | os.PathLike | None],
    what: str,
    fix: str = "choose another output path",
) -> None:
    """Refuse an ``output`` that is one of the command's ``inputs`` (role → path; ``None`` skipped): the same file
    after symlinks and hard links (:func:`same_file`). An input that is a folder (a model folder) protects the files
    in it, and an output inside it.

    Raises:
        UsageError: naming ``what`` (how the command line names the output), the output path, the input's role and
            ``fix`` (what to do instead).
    """
    output = Path(output)
    for role, path in inputs.items():
        if path is None:
            continue
        path = Path(path)
        real, folder = os.path.realpath(output), os.path.realpath(path)
        if path.is_dir() and (real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)):
            raise UsageError(f"{what} {output} is inside the {role} {path}: write it elsewhere")
        for file in _files_of(path):
            if file.exists() and same_file(output, file):
                shown = role if file == path else f"{role}'s file {file.name}"
                linked = os.path.islink(output) or os.path.realpath(output) != os.path.realpath(file)
                link = " (a link to it)" if linked else ""
                raise UsageError(f"{what} {output} is the {shown}{link}: {fix}")


def check_writable_folder(folder: str | os.PathLike, output: str | os.PathLike, what: str) -> None:
    """Refuse, before any work, an ``output`` whose existing ``folder`` cannot be written in (a read-only file
    system, ``/proc``, no permission): a temporary file is created there and removed.

    Raises:
        UsageError: ``"{what} {output} cannot be written: its folder {folder} is not writable (reason)"``.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=".elmokit-probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        # ENOENT in a folder that exists: a file system that takes no new files (/proc, /sys)
        reason = "it takes no new files" if exc.errno == errno.ENOENT else (exc.strerror or type(exc).__name__)
        raise UsageError(f"{what} {output} cannot be written: its folder {folder} is not writable ({reason})") from None


def check_writable_place(path: str | os.PathLike, what: str) -> None:
    """A ``path`` to be created (a folder, with its missing parents): the nearest folder above it that exists can be
    written in (:func:`check_writable_folder`). Nothing is checked when that nearest existing path is a file (the
    caller's own check names it)."""
    nearest = next(p for p in Path(os.path.realpath(path)).parents if p.exists())
    if nearest.is_dir():
        check_writable_folder(nearest, path, what)


def check_output_path(
    output: str | os.PathLike,
    inputs: Mapping[str, str | os.PathLike | None],
    *,
    overwrite: bool,
    ours: Callable[[Path], bool],
    kind: str,
    what: str = "the output",
    overwrite_flag: str = "--overwrite",
    create_folder: bool = False,
) -> None:
    """The rules of every output file a command writes, checked before any work:

    * it is none of the ``inputs`` (:func:`check_not_an_input`: after symlinks and hard links; also with
      ``overwrite``);
    * its folder exists (or, with ``create_folder``, can be created: the nearest existing folder above it is a
      folder) and can be written in;
    * an existing file is replaced only with ``overwrite``, and only when ``ours(output)`` recognises it as a file
      elmokit wrote (``kind`` names it, e.g. ``"an elmokit HDF5 file"``): anything else is the user's to remove.

    Args:
        output: the file to write. inputs: role → path of every input (sentences, word lists, the model folder).
        overwrite: ``--overwrite`` given. ours: recognises a file elmokit wrote (reads only what it needs).
        kind: what ``ours`` recognises, for the message. what / overwrite_flag: how messages name the output / flag.
        create_folder: a missing folder is created by the writer (the library's ``atomic_path``), not an error.

    Raises:
        UsageError: a folder, an input, below a file, an unwritable folder, an existing file without ``overwrite``,
            or one ``ours`` does not recognise. MissingFileError: its folder does not exist.
    """
    output = Path(output)
    if output.is_dir():
        raise UsageError(f"{what} {output} is a folder: give a file path")
    check_not_an_input(output, inputs, what)
    parent = Path(os.path.realpath(output)).parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{what} {output} cannot be written: {existing} is a file, not a folder")
    if existing != parent and not create_folder:
        raise MissingFileError(f"{what} {output}: its folder {parent} does not exist (create it first)")
    check_writable_folder(existing, output, what)
    if not output.exists():
        return
    if not output.is_file():  # a FIFO, a device: never opened to recognise it (a FIFO would block), never replaced
        raise UsageError(f"{what} {output} exists and is not a regular file: choose another path")
    if not overwrite:
        raise UsageError(f"{what} {output} already exists: pass {overwrite_flag} to replace it, or choose another path")
    if not ours(output):
        raise UsageError(
            f"{what} {output} exists and is not {kind}: {overwrite_flag} replaces only a file elmokit wrote; "
            "remove it by hand if it is to go, or choose another path"
        )
