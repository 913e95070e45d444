"""Files of the embedded Qdrant store: digests of the shard's files and their record, the
redo log's format, engine panics and full disks turned into vecplug's errors, how the file
system treats memory-mapped files, the free space a commit or a load needs, and readers'
checked, private copies of a shard with their folders. Used by :mod:`qdrant_edge`; see the
module docstring of :mod:`qdrant` for what is checked when.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from vecplug.errors import CorruptIndexError, StorageError
from vecplug.fsutil import json_checksum

if TYPE_CHECKING:
    from vecplug.adapters.stores.qdrant_edge import _Edge

_T = TypeVar("_T")
FORMAT = "vecplug.qdrant/1"
SHARD = "shard"
REDO = "pending.redo"  # a commit's ops, until the shard has them (module docstring)
REDO_MAGIC = b"VECPLUG-REDO/1\n"
# the engine writes a file by way of a temporary folder of this name (atomicwrites); one left
# by a process killed mid-write is never read by it, so it is neither recorded nor checked
ENGINE_TEMP = ".atomicwrite"

Files = dict[str, dict[str, Any]]  # shard file (relative, "/") -> size, digest, mtime_ns, inode
Stats = dict[str, list[int]]  # shard file -> [size, mtime_ns, inode]


_BLOCK = 1 << 16
_ZERO = bytes(_BLOCK)
# A file modified less than this before it was hashed may change again within the same mtime
# (a coarse clock tick: 1-10 ms on Linux), so its digest is not reused. Times in whole seconds
# (FAT, old ext3 inodes, some network file systems) stand for up to 2 s.
RACY_NS = 20_000_000
RACY_COARSE_NS = 2_000_000_000


def _racy(mtime_ns: int, now_ns: int) -> bool:
    """Whether a file modified at ``mtime_ns`` and hashed from ``now_ns`` on may have changed
    again since without moving its mtime."""
    return now_ns - mtime_ns < (RACY_NS if mtime_ns % 1_000_000_000 else RACY_COARSE_NS)


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The byte ranges of a file that may hold data (its holes left out), from SEEK_DATA and
    SEEK_HOLE; the whole file where the file system cannot tell."""
    extents, pos = [], 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, pos))
    except (OSError, AttributeError):
        return [(0, size)]
    return extents


def _blocks(fh: Any, path: str) -> Iterator[tuple[int, bytes | None]]:
    """The file as 64 KiB blocks: (offset, its bytes), or (offset, None) when the block is all
    zero or in a hole (blocks in a hole are not even read)."""
    size = os.fstat(fh.fileno()).st_size
    extents, i = _data_extents(fh.fileno(), size), 0
    for start in range(0, size, _BLOCK):
        end = min(start + _BLOCK, size)
        while i < len(extents) and extents[i][1] <= start:
            i += 1
        if i == len(extents) or extents[i][0] >= end:  # wholly in a hole
            yield start, None
            continue
        fh.seek(start)
        block = fh.read(end - start)
        if len(block) != end - start:
            raise OSError(f"{path} shrank while being read")
        yield start, None if block == _ZERO[:len(block)] else block


def _digest(path: str) -> str:
    """SHA-256 over the file as 64 KiB blocks, each fed as ``b"D"`` + its bytes or, when all
    zero, as ``b"Z"``. The encoding is one-to-one (with the size, which is recorded too), so
    this is as strong as a SHA-256 of the file, but the 32 MiB files the engine preallocates
    and fills slowly cost what their data costs: zero blocks are compared, not hashed, and
    blocks in a hole are not even read (a plain SHA-256 of them took ~0.2 s a commit)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for _, block in _blocks(fh, path):
            h.update(b"Z" if block is None else b"D" + block)
    return h.hexdigest()


def _copy_file(src: str, dst: str) -> str:
    """Copy ``src`` to a new file ``dst`` with its zero blocks left as holes (the engine's
    32 MiB files stay sparse), and return the :func:`_digest` of what was copied, computed
    from the very bytes written: one read of ``src``, and a match proves the copy."""
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        for start, block in _blocks(fi, src):
            if block is None:
                h.update(b"Z")
            else:
                h.update(b"D" + block)
                fo.seek(start)
                fo.write(block)
        fo.truncate(os.fstat(fi.fileno()).st_size)
    return h.hexdigest()


def _files_digest(files: Files) -> str:
    """What a stamp was checked against: the recorded sizes and checksums (not their stats)."""
    body = {rel: [f["size"], f["digest"]] for rel, f in files.items()}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _shard_stats(root: str) -> tuple[Stats, list[str]]:
    """Every file under the shard folder with its (size, mtime_ns, inode), and the entries that
    are not plain files or folders (a symlink would let the engine read outside the index)."""
    stats: Stats = {}
    odd: list[str] = []
    for top, dirs, names in os.walk(root):
        rel_top = os.path.relpath(top, root)
        for d in list(dirs):
            if d.startswith(ENGINE_TEMP) or os.path.islink(os.path.join(top, d)):
                dirs.remove(d)
                if not d.startswith(ENGINE_TEMP):
                    odd.append(os.path.normpath(os.path.join(rel_top, d)).replace(os.sep, "/"))
        for name in names:
            rel = os.path.normpath(os.path.join(rel_top, name)).replace(os.sep, "/")
            st = os.lstat(os.path.join(top, name))
            if stat.S_ISREG(st.st_mode):
                stats[rel] = [st.st_size, st.st_mtime_ns, st.st_ino]
            else:
                odd.append(rel)
    return stats, odd


#: a write-ahead-log segment the engine is still creating: a background thread of an open
#: shard writes ``wal/tmp-open-N`` and renames it ``open-N`` (seen in a CI run under load: a
#: record listed the first name, then found neither; one that had hashed it in time would have
#: recorded a name gone a moment later, which the next open calls missing)
_WAL_CREATING = re.compile(r"(^|/)wal/tmp-")
#: how long a record waits for such a segment (then records what it finds, as before)
WAL_WAIT_SECONDS = 5.0


def _record_files(root: str, previous: Files | None, trusted: bool) -> Files:
    """Size and :func:`_digest` of every shard file. With ``trusted`` (see :func:`_stats_trusted`)
    a file whose (size, mtime_ns, inode) is what the previous record saw keeps its checksum
    (commits stay cheap when few files change), unless that record marked it ``racy``: it had
    been modified just before it was hashed, so a later change could have kept its mtime (a
    coarse clock tick, :func:`_racy`). A file changed behind unchanged stats by anything else
    keeps its old, now wrong, checksum: never blessed, found by the next full check. A record
    made while the engine creates a log segment (:data:`_WAL_CREATING`), or that loses a file
    between listing and hashing it, waits and lists again."""
    deadline = time.monotonic() + WAL_WAIT_SECONDS
    while True:
        stats, odd = _shard_stats(root)
        settling = time.monotonic() < deadline
        if settling and any(_WAL_CREATING.search(rel) for rel in stats):
            time.sleep(0.005)
            continue
        try:
            return _hashed_files(root, stats, odd, previous, trusted)
        except FileNotFoundError:
            if not settling:
                raise
            time.sleep(0.005)


def _hashed_files(root: str, stats: Stats, odd: list[str], previous: Files | None, trusted: bool) -> Files:
    """:func:`_record_files` for one listing of the shard."""
    if odd:
        raise CorruptIndexError(f"{root}/{odd[0]} is not a plain file or folder")
    now = time.time_ns()  # before hashing: a file changed later than this is re-hashed anyway
    files: Files = {}
    for rel, (size, mtime, inode) in sorted(stats.items()):
        old = (previous or {}).get(rel)
        same = trusted and old is not None and not old.get("racy") and [
            old.get("size"), old.get("mtime_ns"), old.get("inode")] == [size, mtime, inode]
        files[rel] = {"size": size, "mtime_ns": mtime, "inode": inode,
                      "digest": old["digest"] if same else _digest(os.path.join(root, rel))}
        if _racy(mtime, now):
            files[rel]["racy"] = True
    return files


def _aged(stats: Stats) -> Stats:
    """The entries of files not :func:`_racy` now: only their stats may vouch for their
    content later (a change to a younger file might keep its mtime)."""
    now = time.time_ns()
    return {rel: st for rel, st in stats.items() if not _racy(st[1], now)}


class FsTraits(NamedTuple):
    """How a file system treats memory-mapped files, which is how the engine writes and reads
    its segments (measured: ext4 is (True, False), tmpfs (False, True))."""

    #: a write through a shared mapping moves the file's mtime (at the first write after each
    #: flush): only then may unchanged stats stand for unchanged content
    mtime_follows_maps: bool
    #: reading a hole through a mapping allocates it: on tmpfs the engine's every load makes
    #: its mapped files (a 32 MiB vector chunk, flag and index pages) take their full size
    reads_fill_holes: bool


_TRAITS: dict[int, FsTraits] = {}  # st_dev -> its traits, probed once per process
# file systems in memory: a page read through a mapping is allocated, even over a hole
_MEMORY_FS = frozenset({"tmpfs", "ramfs", "shm", "hugetlbfs"})


def _fs_traits(folder: str, probe_prefix: str) -> FsTraits:
    """The :class:`FsTraits` of the file system of ``folder``: whether reads fill holes from
    its type (a probe of that would crash with SIGBUS on a full tmpfs), whether mtime follows
    mapped writes from a one-page file (``probe_prefix`` + random) in ``folder``, ~20 ms.
    Probed once per device and process; unknown answers are the cautious ones."""
    try:
        dev = os.stat(folder).st_dev
    except OSError:
        return FsTraits(False, True)
    if dev in _TRAITS:
        return _TRAITS[dev]
    kind = _fs_type(folder)
    fills = kind is None or kind in _MEMORY_FS
    follows = _mtime_follows_maps(folder, probe_prefix)
    if follows is None:  # no room or no right to probe: cautious, and asked again next time
        return FsTraits(False, fills)
    _TRAITS[dev] = FsTraits(follows, fills)
    return _TRAITS[dev]


def _stats_trusted(folder: str, probe_prefix: str) -> bool:
    """Whether unchanged (size, mtime_ns, inode) may stand for unchanged content in ``folder``
    (tmpfs: no; a record that trusted them there kept stale digests of ten files)."""
    return _fs_traits(folder, probe_prefix).mtime_follows_maps


def _fs_type(path: str) -> str | None:
    """The type of the file system that holds ``path`` (from /proc/self/mountinfo: the last
    mount on the longest mount point above it), None when unknown."""
    try:
        real = os.path.realpath(path)
        best, kind = "", None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, sep, right = line.partition(" - ")
                fields = left.split()
                if not sep or len(fields) < 5 or not right.split():
                    continue
                mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, right.split()[0]
        return kind
    except OSError:
        return None


def _mtime_follows_maps(folder: str, prefix: str) -> bool | None:
    """Whether a write through a shared mapping moves the mtime of a file in ``folder``; None
    when the probe cannot run. Its page is written and synced first, so that the mapped
    write never needs new space (which a full disk answers with SIGBUS)."""
    try:
        fd, path = tempfile.mkstemp(prefix=prefix, dir=folder)
    except OSError:
        return None
    try:
        os.write(fd, bytes(mmap.PAGESIZE))
        os.fsync(fd)
        with mmap.mmap(fd, mmap.PAGESIZE) as mm:
            mm[0] = 1
            mm.flush()
            before = os.fstat(fd).st_mtime_ns
            time.sleep(0.02)  # more than a coarse clock tick (1-10 ms)
            mm[0] = 2
            mm.flush()
            return os.fstat(fd).st_mtime_ns != before
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
        os.unlink(path)


def _check_files(root: str, files: Files, stats: Stats, odd: list[str],
                 first: bool = False) -> tuple[list[str], Stats]:
    """What differs between the shard files and their record (missing, extra, size, then
    digest; ``first``: stop at the first problem), and the stats of the files that match."""
    problems = [f"{SHARD}/{rel} is not a plain file or folder" for rel in odd]
    problems += [f"{SHARD}/{rel} is missing" for rel in sorted(set(files) - set(stats))]
    problems += [f"{SHARD}/{rel} is not part of the last commit" for rel in sorted(set(stats) - set(files))]
    problems += [f"{SHARD}/{rel} has {stats[rel][0]} bytes, the last commit recorded {f['size']}"
                 for rel, f in sorted(files.items()) if rel in stats and stats[rel][0] != f["size"]]
    matching: Stats = {}
    for rel, f in sorted(files.items()):
        if first and problems:
            break
        if rel in stats and stats[rel][0] == f["size"]:
            if _digest(os.path.join(root, rel)) == f["digest"]:
                matching[rel] = stats[rel]
            else:
                problems.append(f"{SHARD}/{rel} does not match its checksum in the last commit")
    return problems, matching


def _valid_files(files: Any) -> bool:
    """A well-formed record: relative paths that stay inside the shard (a reader copies
    what it names), each with an integer size and a digest."""
    return isinstance(files, dict) and all(
        isinstance(rel, str) and rel == os.path.normpath(rel) and not os.path.isabs(rel)
        and not rel.startswith("..") and "\\" not in rel
        and isinstance(f, dict) and isinstance(f.get("size"), int)
        and isinstance(f.get("digest"), str) for rel, f in files.items())


def _is_panic(exc: BaseException) -> bool:
    """A Rust panic in the engine: pyo3 raises it as ``PanicException``, a BaseException."""
    return type(exc).__name__ == "PanicException"


# how the engine words a full disk or quota: it raises a plain Exception that quotes the OS error
_NO_SPACE = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122",
             "Not enough space available")
# what optimize() says when twice the segments it would rewrite are not free: it checks that
# before it changes anything (Qdrant's check_segments_size), so the shard is as it was
OPTIMIZE_REFUSED = "Not enough space available for optimization"


def _no_space(exc: BaseException) -> bool:
    """Whether an error (an OSError, or the engine's Exception or panic quoting one) says that
    the disk or the quota is full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return (isinstance(exc, Exception) or _is_panic(exc)) and any(s in str(exc) for s in _NO_SPACE)


@contextmanager
def _engine(where: str, folder: str | None = None) -> Iterator[None]:
    """Engine calls on the shard's files: a full disk becomes a StorageError (with the free
    space of ``folder``), a panic a CorruptIndexError (the engine checks its input with
    assertions, so a panic there means damaged files), instead of a crash."""
    try:
        yield
    except BaseException as exc:
        if _no_space(exc):
            free = _free(folder) if folder else None
            raise StorageError(f"no space left for the shard in {where}"
                               f"{'' if free is None else f' ({_mib(free)} free)'}: {exc}") from exc
        if not _is_panic(exc):
            raise
        raise CorruptIndexError(f"the Qdrant engine failed on the shard in {where} ({exc}): its "
                                "files are damaged; rebuild the index or restore a copy") from exc


def _engine_call(method: Callable[..., _T]) -> Callable[..., _T]:
    """:func:`_engine` around an :class:`_Edge` method, which holds the shard's mutex (a
    reader's copy is never swapped under a read in another thread)."""
    @functools.wraps(method)
    def wrapped(self: "_Edge", *args: Any, **kwargs: Any) -> _T:
        with self.mutex, _engine(self.where, self.folder):
            return method(self, *args, **kwargs)
    return wrapped


# -- free space ------------------------------------------------------------------------------

MiB = 1 << 20
# What the engine may allocate in one commit besides the data it is given, measured on tmpfs
# (which allocates as written): a segment it creates writes its 32 MiB vector chunk in full,
# with a 4 MiB payload-index page and 1 MiB flag files; peaks were up to 41 MiB above 3x the
# redo log (1,000-4,000 points of 384 dimensions a commit, with deletes and optimize()).
ENGINE_RESERVE = 48 * MiB
# a reload after writes (settling) tidies journals and flags in place: a few pages
SETTLE_RESERVE = 8 * MiB


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


def _free(folder: str) -> int | None:
    """Bytes an unprivileged writer may still use on the device of ``folder`` (None: unknown)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _allocated(root: str, names: Iterable[str] | None = None) -> int:
    """Bytes on disk (holes left out) of the files under ``root`` (or of ``names`` in it)."""
    total = 0
    paths = (os.path.join(root, n) for n in names) if names is not None else (
        os.path.join(top, n) for top, _, ns in os.walk(root) for n in ns)
    for path in paths:
        try:
            total += os.lstat(path).st_blocks * 512
        except OSError:
            pass
    return total


# files an engine load does not read in full (measured on tmpfs, where a load allocated every
# other mapped file to its full size): the write-ahead log and the payload pages
_UNREAD = re.compile(r"(^|/)(wal/|payload_storage/page_)")


def _holes(root: str, names: Iterable[str] | None = None) -> int:
    """Bytes of holes in the files under ``root`` (or ``names`` in it) that an engine load
    reads through its mappings: what the load allocates where reads fill holes (tmpfs)."""
    total = 0
    paths = (os.path.join(root, n) for n in names) if names is not None else (
        os.path.join(top, n) for top, _, ns in os.walk(root) for n in ns)
    for path in paths:
        if _UNREAD.search(os.path.relpath(path, root).replace(os.sep, "/")):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        total += max(0, st.st_size - st.st_blocks * 512)
    return total


def _commit_need(redo: int) -> int:
    """A conservative bound on the free space that writing a redo log of ``redo`` bytes and
    applying it takes: the log itself, the engine's write-ahead log and segments (each about
    the log's size again: 3x, measured) and what the engine allocates besides
    (:data:`ENGINE_RESERVE`). An optimisation, which writes segments anew before it removes
    the old ones, is guarded by the engine itself: it needs twice the segments it rewrites
    free and otherwise refuses before it starts (:data:`OPTIMIZE_REFUSED`)."""
    return 3 * redo + ENGINE_RESERVE


def _ensure_space(folder: str, need: int, doing: str, hint: str = "") -> None:
    """StorageError unless ``need`` bytes are free under ``folder``. The engine writes through
    memory maps: on a full disk its writes end in SIGBUS, a crash no handler can catch, so a
    write that may not fit is refused before it starts."""
    free = _free(folder)
    if free is not None and free < need:
        raise StorageError(f"not enough free space to {doing} in {folder}: {_mib(free)} free, "
                           f"about {_mib(need)} needed{hint}")


def _sealed(meta: dict[str, Any], files: Files, settled: bool) -> dict[str, Any]:
    """The manifest as written: with the record of the shard files and its own checksum."""
    out = {**_unsealed(meta), "files": files, "settled": settled}
    out["checksum"] = json_checksum(out)
    return out


def _unsealed(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in ("files", "settled", "checksum")}


def _redo_bytes(meta: dict[str, Any], deletes: list[str], upserts: list[str],
                payloads: list[dict[str, Any]], vecs: np.ndarray) -> bytes:
    """A redo file: magic, u64 header length, JSON header, float32 rows, SHA-256 of it all."""
    header = json.dumps({"meta": meta, "delete": deletes, "upsert": upserts, "payloads": payloads,
                         "dim": int(vecs.shape[1])}, ensure_ascii=False).encode()
    body = b"".join([REDO_MAGIC, len(header).to_bytes(8, "little"), header,
                     np.ascontiguousarray(vecs, dtype="<f4").tobytes()])
    return body + hashlib.sha256(body).digest()


def _read_redo(path: str, where: str) -> tuple[dict[str, Any], list[str], list[str],
                                                list[dict[str, Any]], np.ndarray]:
    """Parse and verify a redo file; CorruptIndexError unless it is exactly as written."""
    def bad(why: str) -> CorruptIndexError:
        return CorruptIndexError(f"the redo log {REDO} in {where} is damaged ({why}); it is "
                                 "not applied: remove it to open the previous commit")
    with open(path, "rb") as f:
        data = f.read()
    head = len(REDO_MAGIC) + 8
    if len(data) < head + 32 or not data.startswith(REDO_MAGIC):
        raise bad("truncated or not a redo file")
    body, digest = data[:-32], data[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise bad("checksum mismatch")
    size = int.from_bytes(body[len(REDO_MAGIC):head], "little")
    try:
        h = json.loads(body[head:head + size].decode())
        meta, deletes, upserts, payloads, dim = (h["meta"], h["delete"], h["upsert"],
                                                 h["payloads"], int(h["dim"]))
        vecs = np.frombuffer(body[head + size:], dtype="<f4").astype(np.float32)
        vecs = vecs.reshape(len(upserts), dim)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise bad(f"malformed: {exc}") from exc
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT
            and all(isinstance(x, list) for x in (deletes, upserts, payloads))
            and all(isinstance(i, str) for i in deletes + upserts)
            and all(isinstance(p, dict) for p in payloads) and len(payloads) == len(upserts)):
        raise bad("malformed header")
    return meta, list(deletes), list(upserts), list(payloads), vecs


# -- readers' private copies ------------------------------------------------------------------

# free space a copy needs besides its data: the engine's first load of it tidies it in place
SNAPSHOT_RESERVE = 16 * MiB


class _Stale(Exception):
    """A copied file differs from the record it was copied for, or is gone: a commit (or a
    settle) is changing the shard. The copy is retried."""


def _copy_shard(src: str, dst: str, files: Files) -> None:
    """Copy the shard files of the record ``files`` from ``src`` to the new folder ``dst``,
    each proven against its record as it is copied. :class:`_Stale` when one differs or is
    missing; CorruptIndexError when the shard holds a symlink (never the engine's doing);
    StorageError when the copy does not fit or cannot be written."""
    stats, odd = _shard_stats(src)
    if odd:
        raise CorruptIndexError(f"{src}/{odd[0]} is not a plain file or folder")
    for rel, f in sorted(files.items()):
        if rel not in stats or stats[rel][0] != f["size"]:
            raise _Stale(rel)
        target = os.path.join(dst, rel)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            digest = _copy_file(os.path.join(src, rel), target)
        except OSError as exc:
            if exc.errno in (None, errno.ENOENT):  # gone, or shrank while being read
                raise _Stale(rel) from exc
            free = _free(dst)
            raise StorageError(f"cannot copy {SHARD}/{rel} to {dst}"
                               f"{'' if free is None else f' ({_mib(free)} free)'}: {exc}") from exc
        if digest != f["digest"]:
            raise _Stale(rel)


def _flock(fd: int, mode: int, wait: float, stop: threading.Event | None = None) -> bool:
    """Take ``flock`` ``mode`` on ``fd``, polling for up to ``wait`` seconds (or until ``stop``
    is set); False if not had."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline or stop is not None and stop.is_set():
                return False
            time.sleep(0.002)


def _private_folder(path: str) -> None:
    """Make sure ``path`` is a folder of this user's (created 0700 if absent), not a symlink:
    under a shared temporary folder, another user could have made it first."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise StorageError(f"cannot make the folder {path} for readers' copies: {exc}; set the "
                           "store option snapshot_dir") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise StorageError(f"{path} is not a folder of this user's; set the store option "
                           "snapshot_dir to one")


#: the name of a reader's copy (and, with ``.lock``, of its lock file): cleaning touches
#: nothing else, whatever else the folder holds (a snapshot_dir may be any folder of the user's)
COPY_NAME = re.compile(r"vecplug-copy-[0-9]+-[0-9a-f]{12}")


def _remove_copy(folder: str, lockpath: str, fd: int) -> None:
    """Remove a reader's copy, then its lock file, then release the lock."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.unlink(lockpath)
    except OSError:
        pass
    os.close(fd)


class _Snapshot:
    """The folder of one reader's private copy of a shard, ``<base>/<token>/shard``, owned
    while ``<base>/<token>.lock`` is locked (flock: the kernel releases it when the owner dies,
    even by SIGKILL). Every new snapshot first removes the copies whose owner is gone, so a
    killed reader's copy lasts until the next reader opens, not forever. Tokens match
    :data:`COPY_NAME`; nothing else in ``base`` is ever removed."""

    def __init__(self, base: str) -> None:
        _private_folder(base)
        self.base = base
        self._clean()
        self.fd, token = self._claim()
        self.dir = os.path.join(base, token)
        self.lockpath = self.dir + ".lock"
        self.shard = os.path.join(self.dir, SHARD)
        # a reader dropped without close (open_index(p).search(q)) kept its copy and its lock
        # until the process ended, and a writer of the folder was refused meanwhile
        self._finalizer = weakref.finalize(self, _remove_copy, self.dir, self.lockpath, self.fd)
        try:
            os.mkdir(self.dir, 0o700)
        except OSError as exc:
            self.close()
            raise StorageError(f"cannot make a reader's copy in {base}: {exc}") from exc

    def _claim(self) -> tuple[int, str]:
        """A new lock file, locked and still in place (a cleaner may unlink one it took for a
        dead owner's between its creation and our lock: then another name)."""
        for _ in range(20):
            token = f"vecplug-copy-{os.getpid()}-{os.urandom(6).hex()}"  # COPY_NAME
            path = os.path.join(self.base, token + ".lock")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError as exc:
                raise StorageError(f"cannot make a reader's copy in {self.base}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    return fd, token
            except OSError:
                pass
            os.close(fd)
        raise StorageError(f"cannot lock a reader's copy in {self.base}")

    def _clean(self) -> None:
        """Remove the copies of owners that are gone (their lock can be taken), and copies
        left without a lock file (an owner killed while removing its copy): only entries named
        as this class names them (:data:`COPY_NAME`), never another folder or file."""
        try:
            names = set(os.listdir(self.base))
        except OSError:
            return
        for name in sorted(names):
            path = os.path.join(self.base, name)
            if not COPY_NAME.fullmatch(name.removesuffix(".lock")):
                continue  # not a copy of ours
            if name.endswith(".lock"):
                try:
                    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if os.fstat(fd).st_ino != os.stat(path).st_ino:
                        continue  # removed and made anew meanwhile: not the one we locked
                    shutil.rmtree(path[:-5], ignore_errors=True)
                    os.unlink(path)
                except OSError:
                    pass  # its owner is alive, or another reader cleans it right now
                finally:
                    os.close(fd)
            elif not os.path.lexists(path + ".lock") and os.path.isdir(path):
                # a lock file is made before its folder and removed after it: this one's owner
                # was removing it when it died
                shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Remove the copy, then the lock file, then release the lock."""
        if self.fd is None:
            return
        self._finalizer()  # once: the finalizer is dead after this call
        self.fd = None
