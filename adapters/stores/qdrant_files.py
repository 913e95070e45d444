"""Files of the embedded Qdrant store: digests of the shard's files, the redo log's format,
and engine panics turned into vecplug's errors. Used by :mod:`qdrant_edge`; see the module
docstring of :mod:`qdrant` for what is checked when.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from vecplug.errors import CorruptIndexError
from vecplug.fsutil import json_checksum

if TYPE_CHECKING:
    from vecplug.adapters.stores.qdrant import _Edge

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


def _digest(path: str) -> str:
    """SHA-256 over the file as 64 KiB blocks, each fed as ``b"D"`` + its bytes or, when all
    zero, as ``b"Z"``. The encoding is one-to-one (with the size, which is recorded too), so
    this is as strong as a SHA-256 of the file, but the 32 MiB files the engine preallocates
    and fills slowly cost what their data costs: zero blocks are compared, not hashed, and
    blocks in a hole are not even read (a plain SHA-256 of them took ~0.2 s a commit)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        extents, i = _data_extents(fh.fileno(), size), 0
        for start in range(0, size, _BLOCK):
            end = min(start + _BLOCK, size)
            while i < len(extents) and extents[i][1] <= start:
                i += 1
            if i == len(extents) or extents[i][0] >= end:  # wholly in a hole
                h.update(b"Z")
                continue
            fh.seek(start)
            block = fh.read(end - start)
            if len(block) != end - start:
                raise OSError(f"{path} shrank while being read")
            h.update(b"Z" if block == _ZERO[:len(block)] else b"D" + block)
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


def _record_files(root: str, previous: Files | None) -> Files:
    """Size and :func:`_digest` of every shard file; a file whose (size, mtime_ns, inode) is what the
    previous record saw keeps its checksum (commits stay cheap when few files change). That
    never blesses damage: a file changed behind such stats keeps its old, now wrong, checksum."""
    stats, odd = _shard_stats(root)
    if odd:
        raise CorruptIndexError(f"{root}/{odd[0]} is not a plain file or folder")
    files: Files = {}
    for rel, (size, mtime, inode) in sorted(stats.items()):
        old = (previous or {}).get(rel)
        same = old is not None and [old.get("size"), old.get("mtime_ns"), old.get("inode")] == [
            size, mtime, inode]
        files[rel] = {"size": size, "mtime_ns": mtime, "inode": inode,
                      "digest": old["digest"] if same else _digest(os.path.join(root, rel))}
    return files


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
    return isinstance(files, dict) and all(
        isinstance(rel, str) and isinstance(f, dict) and isinstance(f.get("size"), int)
        and isinstance(f.get("digest"), str) for rel, f in files.items())


def _is_panic(exc: BaseException) -> bool:
    """A Rust panic in the engine: pyo3 raises it as ``PanicException``, a BaseException."""
    return type(exc).__name__ == "PanicException"


@contextmanager
def _engine(where: str) -> Iterator[None]:
    """Engine calls on the shard's files: a panic there means damaged files (the engine checks
    its input with assertions), so it becomes a CorruptIndexError instead of a crash."""
    try:
        yield
    except BaseException as exc:
        if not _is_panic(exc):
            raise
        raise CorruptIndexError(f"the Qdrant engine failed on the shard in {where} ({exc}): its "
                                "files are damaged; rebuild the index or restore a copy") from exc


def _engine_call(method: Callable[..., _T]) -> Callable[..., _T]:
    """:func:`_engine` around an :class:`_Edge` method."""
    @functools.wraps(method)
    def wrapped(self: "_Edge", *args: Any, **kwargs: Any) -> _T:
        with _engine(self.where):
            return method(self, *args, **kwargs)
    return wrapped


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
