"""Crash-safe file helpers: write to a temporary file, fsync, rename, fsync the folder; and a
one-writer lock. Below every layer (imports only the errors module)."""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

from vecplug.errors import IndexLockedError, StorageError


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def json_checksum(obj: dict[str, Any], skip: str = "checksum") -> str:
    """SHA-256 of a JSON object without its own checksum entry ``skip``: a record that
    carries a checksum of itself."""
    body = {k: v for k, v in obj.items() if k != skip}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_path(path.parent)


def make_readable(folder: Path) -> None:
    """Open a model folder written in private (``mkdtemp``'s 0700; transformers writes its
    weights to a private temporary file, 0600, and renames it) to everyone for reading: the
    folder 0755 and the files in it 0644, whatever the umask. A model folder is shared by the
    users and services of a machine, as the built models are."""
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o755 if f.is_dir() else 0o644)


def replace_folder(new: Path, target: Path) -> None:
    """Put the folder ``new`` in place of ``target`` (which may not exist) by renames.

    The old ``target`` is renamed aside, ``new`` renamed in, and only then the old one removed:
    an interruption at any point leaves a whole folder, the old or the new one (a process
    killed between the two renames leaves the old one as ``.old-<name>-<pid>-*`` beside it,
    which the next replacement removes). If ``new`` cannot be renamed in, the old one is put
    back and the error raised.
    """
    stale = _stale_copies(target)
    old = None
    if target.exists():
        old = target.with_name(f".old-{target.name}-{os.getpid()}-{time.time_ns()}")
        target.rename(old)
    try:
        new.rename(target)
    except BaseException:
        if old is not None and not target.exists():  # else someone else's folder took the place
            old.rename(target)
        raise
    fsync_path(target.parent)  # the renames themselves
    for folder in ([old] if old is not None else []) + stale:
        shutil.rmtree(folder, ignore_errors=True)


def _stale_copies(target: Path) -> list[Path]:
    """Old folders that earlier replacements of ``target`` set aside and, killed between their
    two renames, never removed: those of processes no longer running (a live one's is still
    in use). The next replacement of ``target`` removes them."""
    stale = []
    for path in target.parent.glob(f".old-{glob.escape(target.name)}-*"):
        pid, _, ns = path.name[len(f".old-{target.name}-"):].partition("-")
        if pid.isdigit() and ns.isdigit() and not process_running(int(pid)):  # not another folder's
            stale.append(path)
    return stale


def process_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; no pid of this system
        return True
    return True


#: :func:`atomic_write_bytes`'s temporary names: ``.<name>.<pid>.tmp``
TEMPORARY = re.compile(r"\..+\.([0-9]+)\.tmp")


def remove_dead_leftovers(folder: Path, pattern: re.Pattern[str] = TEMPORARY) -> None:
    """Remove the files and folders in ``folder`` named by ``pattern`` (its first group: the
    process that made them) whose process is gone: a process killed before it renamed or
    removed them left them for good (by default :func:`atomic_write_bytes`'s temporaries)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if not m or int(m.group(1)) == os.getpid() or process_running(int(m.group(1))):
            continue
        path = folder / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            pass  # another cleaner, or not ours to remove: it stays


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())


def storage_error(exc: OSError, doing: str) -> StorageError:
    """An OSError as a :class:`StorageError` that says what failed and that nothing was lost."""
    reason = exc.strerror or str(exc)
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return StorageError(f"{doing}: {reason}{where}; the last commit is intact")


class WriterLock:
    """An exclusive, non-blocking lock on a folder: one writer at a time.

    ``flock`` is released by the kernel when the process dies, so a killed writer
    never leaves a stale lock behind; a lock dropped without :meth:`release` (a handle never
    closed) closes its descriptor when it is collected, which releases it too. Taking it
    removes the temporary files killed writers left in the folder.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / "writer.lock"
        self._fd: int | None = None
        self._finalizer: weakref.finalize | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error(exc, f"cannot lock the index at {self.path.parent}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IndexLockedError(f"another process is writing to the index at {self.path.parent} (or "
                                   "a writable handle of this one is still open); wait for it to finish") from None
        self._fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)
        remove_dead_leftovers(self.path.parent)  # the folder is ours alone now

    def release(self) -> None:
        if self._fd is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
