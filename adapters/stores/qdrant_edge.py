"""The embedded Qdrant store's engine side: a Qdrant Edge shard in a folder, written through a
redo log, opened in place by one process at a time, or read from a private, checked copy by
readers in other processes. The protocol (commit, checks, copies, free space) is described in
the module docstring of :mod:`vecplug.adapters.stores.qdrant`, which holds the store itself.
"""
from __future__ import annotations

import copy
import fcntl
import json
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from vecplug.adapters.stores.base import EXACT_FILTER_LIMIT
from vecplug.adapters.stores.qdrant_files import (
    ENGINE_RESERVE, FORMAT, OPTIMIZE_REFUSED, REDO, SETTLE_RESERVE, SHARD, SNAPSHOT_RESERVE, Files, Stats, _aged,
    _allocated, _check_files, _commit_need, _copy_shard, _digest, _engine, _engine_call,
    _ensure_space, _files_digest, _flock, _fs_traits, _holes, _no_space, _private_folder, _read_redo,
    _record_files, _redo_bytes, _sealed, _shard_stats, _Snapshot, _Stale, _stats_trusted,
    _unsealed, _valid_files)
from vecplug.errors import (CorruptIndexError, IndexLockedError, IndexNotFoundError,
                             MissingDependencyError, StorageError, VecplugError)
from vecplug.fsutil import (WriterLock, atomic_write_bytes, atomic_write_json, fsync_path,
                            json_checksum, storage_error)

ID_NAMESPACE = uuid.UUID("6f1c7d2e-4b0a-5e8f-9a3c-2d7b1e0f4a65")  # fixed: ids map stably
MANIFEST = "manifest.json"
LOCK = "writer.lock"  # held (flock) while the shard is open: Qdrant Edge allows one opener
STAMP = ".verified.json"  # the shard files as last seen matching their checksums (a cache)
PROBE = STAMP + ".probe-"  # a one-page file that tells whether stats can be trusted (qdrant_files)
UND = "und"
_BATCH = 256
SNAPSHOT_WAIT = 30.0  # seconds a reader tries to copy a shard that a writer keeps changing
COPY_LOCK = "copy.lock"  # shared while readers copy the shard, exclusive while it changes
TURN_LOCK = "turn.lock"  # shared while readers wait for a copy: the writer lets them in first
COPY_WAIT = 5.0  # seconds a writer waits for readers' copies before it changes the shard anyway
_FOLLOW_BACKOFF = (0.05, 1.0)  # a reader whose copy of a new commit failed waits, then retries
Hits = list[tuple[dict[str, Any], float]]
#: hits with their stored vectors (None where not asked for)
VectorHits = list[tuple[dict[str, Any], float, "np.ndarray | None"]]
_FILLS = " (on this file system the engine's mapped files take their full size once loaded)"
Staged = dict[str, "tuple[dict[str, Any], np.ndarray] | None"]


def _point_id(doc_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, doc_id))


def _dense(vector: Any) -> list[float]:
    """A point's vector as a list: the default unnamed vector, however the client wraps it."""
    if isinstance(vector, dict):
        vector = vector.get("") if "" in vector else next(iter(vector.values()))
    return list(getattr(vector, "data", vector))


def _array(vector: Any) -> np.ndarray:
    """A point's vector (as :func:`_dense` finds it) as a float32 array."""
    return np.asarray(_dense(vector), dtype=np.float32)


#: the folder vecplug makes in a store option ``snapshot_dir`` for readers' copies
COPIES = "vecplug-copies"


def _snapshot_base(option: Any) -> str:
    """Where readers' copies go, a folder of vecplug's own: ``vecplug-copies`` in the store
    option ``snapshot_dir`` (any folder of the user's, whose other entries are never touched),
    else a folder of this user's under the system's temporary folder (``$TMPDIR``)."""
    if option:
        return os.path.join(os.path.abspath(os.path.expanduser(str(option))), COPIES)
    return os.path.join(tempfile.gettempdir(), f"vecplug-qdrant-{os.getuid()}")


class _Copy(NamedTuple):
    """A reader's copy of one commit: its manifest, the manifest file's stats when read, the
    folder and the engine that has it loaded (None, None: the commit served already)."""

    meta: dict[str, Any]
    key: tuple[int, int, int] | None
    snap: _Snapshot | None
    shard: Any


def full_scan_threshold(dim: int) -> int:
    """Qdrant's full_scan_threshold (KB of float32 vectors) for EXACT_FILTER_LIMIT vectors of
    ``dim``. Qdrant's default, 10,000 KB, is ~6,700 384-d vectors: a one-language filter over
    16,667 of 100k went to the filtered graph walk."""
    return math.ceil(EXACT_FILTER_LIMIT * dim * 4 / 1024)


def search_params(models: Any, ef: int | None, filtered: bool, acorn: bool) -> Any:
    """The SearchParams of a search (``models``: qdrant_edge or qdrant_client.models, which
    name them alike), or None for the engine's defaults. A filter above the full-scan
    threshold walks the graph. Qdrant's plain filtered walk never steps through points outside
    the filter, and it adds per-value links only for values under ~4/m of the points: one
    language of five or six gets none, and its walk found about half of the filter's exact top
    10 (ann_scale.py at 200k). ACORN also steps through neighbours' neighbours; the engine
    applies it to filters matching under 40% of the points (its default), and the plain walk to
    the rest. ACORN costs time (~5x at 200k); options["acorn"] = False trades that recall back."""
    if filtered and acorn:
        return models.SearchParams(hnsw_ef=ef, acorn=models.AcornSearchParams(enable=True))
    return models.SearchParams(hnsw_ef=ef) if ef else None


class _Edge:
    """A Qdrant Edge shard embedded in ``<folder>/shard``, with writes staged until commit.

    ``staged`` maps a point id to its new ``(payload, unit vector)``, or to None for a delete:
    the last write per point wins, so the ops of one commit are independent of order.
    ``files`` is the record of the shard files that the last commit left (None for an index
    made before checksums), ``settled`` whether it was taken after a reload of the shard (see
    :meth:`_settle`); ``checked`` the stats at which each file was last seen to match it;
    ``sound`` says that the shard is as recorded, so that ``close`` may settle and stamp it.

    A reader that cannot open the shard in place (another process has it) serves a private
    copy instead: ``snap`` is its folder, ``served`` the manifest of the commit it holds, and
    ``follow`` moves it to a newer commit. Reads hold ``mutex``, so that a copy is never
    swapped under a search in another thread.
    """

    def __init__(self, folder: str, options: dict[str, Any]) -> None:
        try:
            import qdrant_edge
        except ImportError:
            raise MissingDependencyError("qdrant-edge-py", extra="qdrant",
                                         purpose="the embedded qdrant store") from None
        self.q, self.folder, self.where = qdrant_edge, folder, f"folder {folder}"
        self.path = os.path.join(folder, SHARD)
        self.redo = os.path.join(folder, REDO)
        self.stamp = os.path.join(folder, STAMP)
        self.optimize = bool(options.get("optimize", True))
        self.acorn = bool(options.get("acorn", True))  # for large filters: see search_params
        self.snapshot_dir = options.get("snapshot_dir")
        self.snapshot_wait = float(options.get("snapshot_wait", SNAPSHOT_WAIT))
        self.always_copy = bool(options.get("snapshot", False))  # readers: a copy, even alone
        self.shard: Any = None
        self.lock: WriterLock | None = None
        self.staged: Staged = {}
        self._under: dict[str, str] | None = None  # staged point -> its committed lang, if any
        self.files: Files | None = None
        self.settled = False
        self.checked: Stats = {}
        self.sound = False
        self.broken = False  # a commit failed after its commit point: no more writes here
        self.mutex = threading.RLock()
        self.snap: _Snapshot | None = None
        self.served: dict[str, Any] | None = None
        self._seen: tuple[int, int, int] | None = None  # the manifest's stats when last read
        self._retry_at, self._backoff = 0.0, _FOLLOW_BACKOFF[0]
        self._lock_fds: tuple[int, ...] | None = None  # turn.lock, copy.lock (see _changing)
        self._follower: threading.Thread | None = None  # a background copy (see follow)
        self._ready: _Copy | None = None  # a copy it made, for the next read to serve
        self._stop = threading.Event()  # tells it that the store is closing
        self._closed = False

    @staticmethod
    def read_meta(folder: str) -> dict[str, Any] | None:
        """Our ``manifest.json``, its checksum verified; None when absent or someone else's.

        A manifest with our checksum or file record is ours whatever else it says, so damage
        to its ``format`` is a CorruptIndexError, not "no index here"."""
        try:
            with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
                meta = json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            return None  # nothing there, or a file where a folder would be
        except (OSError, ValueError) as exc:
            raise CorruptIndexError(f"unreadable {MANIFEST} in {folder}: {exc}") from exc
        if not isinstance(meta, dict):
            return None
        sealed = "checksum" in meta or "files" in meta
        if not sealed:  # another tool's, or one vecplug wrote before checksums
            return meta if meta.get("format") == FORMAT else None
        if meta.get("checksum") != json_checksum(meta) or meta.get("format") != FORMAT:
            raise CorruptIndexError(f"{MANIFEST} in {folder} fails its checksum: the index is "
                                    "damaged; rebuild it or restore a copy")
        if not _valid_files(meta.get("files")):
            raise CorruptIndexError(f"{MANIFEST} in {folder} has a malformed file record")
        return meta

    def meta(self) -> dict[str, Any] | None:
        return self.read_meta(self.folder)

    @classmethod
    def check_folder(cls, folder: str) -> None:
        """Refuse a folder that holds other files than a vecplug qdrant index (or what making
        one leaves when cut short): :meth:`create` would delete them."""
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return  # not there (yet): making it reports what is in the way
        leftovers = all(n in (SHARD, REDO, LOCK, COPY_LOCK, TURN_LOCK) or n.startswith(("." + MANIFEST, "." + REDO, STAMP))
                        for n in names)
        if not (leftovers or cls.read_meta(folder) is not None):
            raise VecplugError(f"{folder} is not empty and not a vecplug qdrant index")

    # -- opening -------------------------------------------------------------------------------

    def load(self, recover: bool = True, reader: bool = False) -> None:
        """Take the lock, check the shard files against the last commit's record (unless the
        stamp vouches for them), open the shard, then finish a commit a crash interrupted.
        ``recover=False``: only open the shard (to prove that nobody else has it). A
        ``reader`` that cannot have the shard (another process has it open, the folder is
        read-only, or the disk is too full for the engine, which writes as it opens) reads a
        private copy of the last commit instead (:meth:`_open_snapshot`), and so does every
        reader with the option ``snapshot`` (after finishing a commit or a settle in place)."""
        if not os.path.isdir(self.path):
            raise CorruptIndexError(f"{self.where} has no {SHARD}/ directory")
        # Our own lock first: a second EdgeShard.load of an open shard fails on the engine's
        # WAL lock only after touching its files (seen: a flush of the first opener then
        # failed on a short payload-index journal), so a second opener must not get that far.
        lock = WriterLock(Path(self.folder))
        try:
            lock.acquire()
        except StorageError as exc:
            if reader:
                return self._open_snapshot(self.snapshot_wait)
            if isinstance(exc, IndexLockedError):
                raise IndexLockedError(
                    f"the index in {self.folder} is open elsewhere, in another process or in a handle of this "
                    "one not closed yet: a writer, or a reader that found it free and opened it in place "
                    "(embedded Qdrant's engine serves one handle at a time). Readers opened while a "
                    "writer works read a copy; to "
                    "keep long-lived readers from ever holding writers out, open them with "
                    "index.reader_copy: true (VECPLUG_INDEX_READER_COPY=1)") from None
            raise
        self.lock = lock
        if reader and self.always_copy:  # never keep a writer out: a copy, once all is settled
            try:
                meta = self.meta()
                if os.path.exists(self.redo) or meta is not None and meta.get("settled") is False:
                    self._load_in_place(recover)  # a commit or a settle to finish first
            except OSError as exc:
                raise storage_error(exc, f"cannot open the index in {self.folder}") from exc
            finally:
                self.close()
                self._reopen()
            return self._open_snapshot(self.snapshot_wait)
        try:
            try:
                self._load_in_place(recover)
            except OSError as exc:  # our own writes on open: a settle, a recovery
                raise storage_error(exc, f"cannot open the index in {self.folder}") from exc
        except StorageError:
            self.close()
            if not reader or os.path.exists(self.redo):
                raise  # a commit to finish: no copy of the shard is a committed state
            self._reopen()
            self._open_snapshot(self.snapshot_wait)
        except BaseException:
            self.close()
            raise

    def _load_in_place(self, recover: bool) -> None:
        redo = None
        if recover:
            for name in os.listdir(self.folder):  # redo files torn before their rename
                if name.startswith(f".{REDO}.") and name.endswith(".tmp"):
                    os.remove(os.path.join(self.folder, name))
            if os.path.exists(self.redo):  # verified before the engine reads anything
                redo = _read_redo(self.redo, self.where)
                # the engine replays and applies it through memory maps, which crash the
                # process (SIGBUS) on a full disk: refuse first
                need = _commit_need(os.path.getsize(self.redo)) + self._load_need()
                _ensure_space(self.folder, need, f"finish the last commit ({REDO})",
                              "; free some space and open the index again")
            meta = self.meta()  # again, under the lock: the one this open will serve
            if meta is None:
                raise IndexNotFoundError(f"no vecplug qdrant index in {self.where}")
            self.files, self.settled = meta.get("files"), meta.get("settled") is True
            if redo is None and self.files is not None:
                # with a redo log the shard may be half-way through its ops: the log's own
                # checksum protects them, and applying it records fresh checksums
                self._check_on_open()
            if redo is None and self.sound and not self.settled:
                # its writer died before closing it: settle it now (the files were just
                # checked as that writer left them)
                self._settle(_unsealed(meta))
        if self.shard is None:
            if redo is None:  # (with one, the space was checked above)
                _ensure_space(self.folder, self._load_need(), "open the index", _FILLS)
            self.shard = self._engine_load()
        if redo is not None:
            self._apply(*redo)

    def _load_need(self) -> int:
        """Free space an engine load of the shard takes: its holes where reads fill them
        (tmpfs: :class:`~qdrant_files.FsTraits`), else none (it rewrites two small files)."""
        return _holes(self.path) if _fs_traits(self.folder, PROBE).reads_fill_holes else 0

    def _engine_load(self, path: str | None = None) -> Any:
        try:
            with _engine(self.where, self.folder):
                return self.q.EdgeShard.load(path or self.path)
        except (CorruptIndexError, StorageError):
            raise
        except Exception as exc:  # the bindings raise plain Exception
            if "WouldBlock" in str(exc):  # the WAL lock is held
                raise IndexLockedError(f"the index in {self.folder} is open elsewhere") from exc
            raise CorruptIndexError(f"cannot load the shard in {self.folder}: {exc}") from exc

    def _check_on_open(self) -> None:
        """The shard files against the record, in full unless the stamp vouches for them."""
        assert self.files is not None
        stats, odd = _shard_stats(self.path)
        if not odd and self._stamp_matches(stats):
            self.checked, self.sound = _aged(stats), True
            return
        problems, checked = _check_files(self.path, self.files, stats, odd, first=True)
        if problems:
            raise CorruptIndexError(f"the index in {self.folder} is damaged: {problems[0]}; "
                                    "rebuild it or restore a copy")
        # a file changed just before it was hashed may change again without moving its mtime
        self.checked, self.sound = _aged(checked), True

    def _stamp_matches(self, stats: Stats) -> bool:
        assert self.files is not None
        try:
            with open(self.stamp, encoding="utf-8") as f:
                stamp = json.load(f)
        except (OSError, ValueError):
            return False
        return (isinstance(stamp, dict) and stamp.get("files") == _files_digest(self.files)
                and stamp.get("stats") == stats and set(stats) == set(self.files))

    def _write_stamp(self, fresh: bool = False) -> None:
        """Remember the shard files as seen matching their record, so that the next open need
        not read them in full. A file whose stats changed since it was last checked (the
        engine touches some on load and close, and rewrites two JSON files with their content
        unchanged) is hashed again first, and so is every file where stats do not follow
        writes through memory maps (tmpfs) unless ``fresh`` (the record was just taken); one
        that no longer matches is left out, so the next open checks in full and reports it."""
        if not (self.sound and self.files is not None):
            return
        try:
            trusted = fresh or _stats_trusted(self.folder, PROBE)
            stats, _ = _shard_stats(self.path)
            good = {rel: st for rel, st in stats.items() if rel in self.files and (
                trusted and self.checked.get(rel) == st or st[0] == self.files[rel]["size"]
                and _digest(os.path.join(self.path, rel)) == self.files[rel]["digest"])}
            self.checked = good
            atomic_write_json(Path(self.stamp), {"files": _files_digest(self.files), "stats": good})
        except OSError:
            pass  # only a cache: the next open checks in full

    def _drop_stamp(self) -> None:
        """Before the shard changes: no stamp may vouch for files that differ from the record."""
        self.sound = False
        try:
            os.remove(self.stamp)
        except FileNotFoundError:
            pass

    # -- a reader's private copy ---------------------------------------------------------------

    def _manifest_key(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(os.path.join(self.folder, MANIFEST))
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns, st.st_ino

    @contextmanager
    def _copying(self, wait: float, stop: threading.Event | None = None) -> Iterator[bool | None]:
        """Hold ``copy.lock`` shared while copying the shard (waiting up to ``wait``): the
        writer holds it exclusive while it changes shard files, so that a copy under way is
        not spoiled by a commit, and it waits (within bounds) for copies under way. A reader
        that waits holds ``turn.lock`` shared meanwhile, which the writer takes exclusive
        before its next change: waiting readers get their copy between two commits however
        fast the writer commits (flock has no queue of its own). Only liveness hangs on these
        locks: the digests prove every copy. True when held, False when not, None when there
        are no lock files (no writer since they were introduced): the digests alone decide."""
        try:
            turn = os.open(os.path.join(self.folder, TURN_LOCK), os.O_RDONLY)
        except OSError:
            yield None
            return
        try:
            copying = os.open(os.path.join(self.folder, COPY_LOCK), os.O_RDONLY)
        except OSError:
            os.close(turn)
            yield None
            return
        try:
            deadline = time.monotonic() + wait
            held = (_flock(turn, fcntl.LOCK_SH, wait, stop)
                    and _flock(copying, fcntl.LOCK_SH, max(0.0, deadline - time.monotonic()), stop))
            os.close(turn)  # our turn came (or not): let the writer queue again
            yield held
        finally:
            os.close(copying)  # releases the lock

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """The shard's files are about to change (a commit's ops, a settle): let readers that
        wait for a copy have it first, wait up to :data:`COPY_WAIT` for copies under way, and
        keep new ones from starting (:meth:`_copying`)."""
        if self._lock_fds is None:
            try:
                self._lock_fds = tuple(os.open(os.path.join(self.folder, name), os.O_RDWR | os.O_CREAT,
                                               0o644) for name in (TURN_LOCK, COPY_LOCK))
            except OSError:  # a read-only folder: nobody changes it but us; copies are proven
                self._lock_fds = ()
        turn, copying = self._lock_fds or (None, None)
        held = False
        if turn is not None and copying is not None:
            queued = _flock(turn, fcntl.LOCK_EX, COPY_WAIT)
            held = _flock(copying, fcntl.LOCK_EX, COPY_WAIT)
            if queued:
                fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            if held and copying is not None:
                fcntl.flock(copying, fcntl.LOCK_UN)

    def _open_snapshot(self, wait: float) -> None:
        """Serve reads from a private copy of the last commit (:meth:`_copy`), taken again
        while a commit in flight spoils it, for up to ``wait`` seconds."""
        deadline, delay = time.monotonic() + wait, 0.02
        while True:
            if self._copy(max(0.0, deadline - time.monotonic())) is not None:
                return
            if time.monotonic() + delay > deadline:
                busy = (f"a commit is under way or unfinished ({REDO})" if os.path.exists(self.redo)
                        else "its files kept differing from the last commit's record (a writer "
                             "committing all the time, or damage: run vecplug verify)")
                raise IndexLockedError(f"no consistent copy of the index in {self.folder} "
                                       f"could be taken in {wait:.0f} s: {busy}; try again")
            time.sleep(delay)
            delay = min(2 * delay, 0.5)

    def _copy(self, wait: float) -> dict[str, Any] | None:
        """Make a copy of the last commit (:meth:`_prepare`) and serve it: its manifest, or
        None when no copy could be made now."""
        got = self._prepare(wait)
        if got is None:
            return None
        self._adopt(got)
        return got.meta

    def _prepare(self, wait: float, stop: threading.Event | None = None) -> _Copy | None:
        """Copy the last commit's recorded files, each proven against its digest as it is
        copied, and load the copy with an engine of our own (a :class:`_Copy` without a
        folder when the commit served is still the last). None when no copy could be made
        now: ``copy.lock`` not had within ``wait`` (or ``stop`` set), a commit under way
        (``pending.redo``), or a file that changed meanwhile."""
        with self._copying(wait, stop) as free:
            if free is False:
                return None
            key, meta = self._manifest_key(), self.meta()  # under the lock: the one to copy
            if meta is None:
                raise IndexNotFoundError(f"no vecplug qdrant index in {self.where}")
            if self.served is not None and meta.get("checksum") == self.served.get("checksum"):
                return _Copy(self.served, key, None, None)
            if meta.get("files") is None:
                raise IndexLockedError(
                    f"the index in {self.folder} is open elsewhere, and a copy of it cannot be "
                    "checked: it was made before file checksums (its next commit records them)")
            if not isinstance(meta.get("manifest"), dict) or (
                    self.served is not None and meta.get("dim") != self.served.get("dim")):
                raise VecplugError(f"the index in {self.folder} was made anew (or its manifest "
                                   "is malformed): open it again")
            if free is None and os.path.exists(self.redo):
                return None  # a commit under way (with the lock, its files wait for this copy)
            files: Files = meta["files"]
            base = _snapshot_base(self.snapshot_dir)
            _private_folder(base)
            fills = _fs_traits(base, PROBE).reads_fill_holes  # the copy is sparse: it fills up
            need = (_allocated(self.path, files) + (_holes(self.path, files) if fills else 0)
                    + SNAPSHOT_RESERVE)
            _ensure_space(base, need, "copy the index for a reader", "; set the store option "
                          "snapshot_dir to a folder with room, or serve many readers of a big "
                          "index from a Qdrant server")
            snap = _Snapshot(base)
            try:
                _copy_shard(self.path, snap.shard, files)
            except _Stale:
                snap.close()
                return None
            except BaseException:
                snap.close()
                raise
        try:
            return _Copy(meta, key, snap, self._engine_load(snap.shard))
        except BaseException:
            snap.close()
            raise

    def _adopt(self, new: _Copy) -> None:
        """Serve ``new`` (from the reading thread: the store's manifest moves with it) and drop
        the copy served until now."""
        with self.mutex:
            self._seen = new.key
            if new.snap is None:
                return
            old = _Copy(self.served or {}, None, self.snap, self.shard)
            self.snap, self.shard, self.served = new.snap, new.shard, new.meta
            self._discard(old)

    def _discard(self, old: _Copy) -> None:
        try:
            if old.shard is not None:
                with _engine(self.where):
                    old.shard.close()
        finally:
            if old.snap is not None:
                old.snap.close()

    def follow(self) -> dict[str, Any] | None:
        """A reader on a copy follows the writer. When the manifest has changed, a background
        thread copies the new commit (:meth:`_prepare`, waiting for its turn) while reads go on
        from the copy there is; the first read after the copy is ready serves it. Returns the
        manifest of the commit moved to, or None. Costs a ``stat`` when nothing changed, and
        never blocks a read on a copy."""
        if self.snap is None:
            return None
        with self.mutex:
            ready, self._ready = self._ready, None
            if ready is not None:
                self._adopt(ready)
            idle = self._follower is None or not self._follower.is_alive()
            if idle and not self._closed and time.monotonic() >= self._retry_at:
                key = self._manifest_key()
                if key is not None and key != self._seen:
                    self._follower = threading.Thread(target=self._follow, daemon=True,
                                                      name=f"vecplug-copy {self.folder}")
                    self._follower.start()
            return ready.meta if ready is not None and ready.snap is not None else None

    def _follow(self) -> None:
        """The background copy of :meth:`follow`; on failure the next read tries again after a
        backoff, and the copy there is keeps answering."""
        try:
            got = self._prepare(self.snapshot_wait, self._stop)
        except IndexNotFoundError:  # being made anew: keep answering from this copy
            got = None
        except Exception as exc:  # noqa: BLE001 - no room, damage: the copy there is stays
            warnings.warn(f"{exc}; answering from the commit before", RuntimeWarning, stacklevel=2)
            got = None
        with self.mutex:
            if got is not None and self._closed:
                self._discard(got)
            elif got is not None:
                self._ready = got
                self._retry_at, self._backoff = 0.0, _FOLLOW_BACKOFF[0]
            else:
                self._retry_at = time.monotonic() + self._backoff
                self._backoff = min(2 * self._backoff, _FOLLOW_BACKOFF[1])

    # -- creating and recording ----------------------------------------------------------------

    def create(self, dim: int, meta: dict[str, Any]) -> None:
        q, manifest = self.q, os.path.join(self.folder, MANIFEST)
        if os.path.isdir(self.folder):
            self.check_folder(self.folder)  # never delete what is not ours
            if self.meta() is not None:  # made and committed since the caller found none
                raise VecplugError(f"an index already exists at {self.folder}")
            try:  # taking the WAL lock proves that nobody has the old index open
                self.load(recover=False)
                self.close()
            except CorruptIndexError:
                pass  # no shard, or a broken leftover: nothing to protect
            self._reopen()
            if os.path.exists(manifest):  # first: a crash half-way leaves no index at all
                os.remove(manifest)
            for name in os.listdir(self.folder):  # the old index's redo log must never replay
                if name == REDO or name.startswith(("." + REDO, STAMP)):
                    os.remove(os.path.join(self.folder, name))
            shutil.rmtree(self.path, ignore_errors=True)
        os.makedirs(self.folder, exist_ok=True)
        self.lock = WriterLock(Path(self.folder))
        self.lock.acquire()
        try:
            _ensure_space(self.folder, ENGINE_RESERVE if _fs_traits(
                self.folder, PROBE).reads_fill_holes else SETTLE_RESERVE, "create an index", _FILLS)
            with _engine(self.where, self.folder):
                self.shard = q.EdgeShard.create(self.path, q.EdgeConfig(
                    vectors=q.EdgeVectorParams(size=dim, distance=q.Distance.Cosine),
                    # m and ef_construct are Qdrant's defaults; only the full-scan threshold changes
                    hnsw_config=q.HnswIndexConfig(
                        m=16, ef_construct=100,
                        full_scan_threshold=full_scan_threshold(dim))))
                self.shard.update(q.UpdateOperation.create_field_index("lang", q.PayloadSchemaType.Keyword))
                self.shard.flush()
            self._record(meta, settled=False)
        except BaseException:
            self.close()
            raise

    def save_meta(self, meta: dict[str, Any]) -> None:
        """Write ``manifest.json`` atomically: temp file, fsync, rename, fsync the folder."""
        atomic_write_json(Path(self.folder) / MANIFEST, meta)

    def _settle(self, meta: dict[str, Any]) -> None:
        """Load the shard again (closing it first if open) and record its files as that load
        left them. The engine's first load after writes tidies its files (folds payload-tracker
        journals in and deletes them, rewrites a point version after deletes, and its config
        after create), and a load of a settled shard changes no file's content (measured), so
        a settled record holds for every later open. Done once per session, at ``close`` (or on
        open after a writer that died before it): 0.05-0.1 s at 10k. An empty redo log covers the
        tidying: a crash in it replays an empty commit, which records the files afresh, instead
        of finding files that differ from the record. The tidying writes through memory maps:
        with less than :data:`SETTLE_RESERVE` free it is refused (StorageError) untouched."""
        _ensure_space(self.folder, SETTLE_RESERVE + self._load_need(), "open the index",
                      " (the engine's first load after a commit tidies its files)")
        atomic_write_bytes(Path(self.redo), _redo_bytes(
            meta, [], [], [], np.zeros((0, int(meta["dim"])), dtype=np.float32)))
        with self._changing():
            self._drop_stamp()
            with _engine(self.where, self.folder):
                if self.shard is not None:
                    shard, self.shard = self.shard, None
                    shard.close()
                self.shard = self._engine_load()
            self._record(meta, settled=True)
            os.remove(self.redo)
            fsync_path(Path(self.folder))

    def _record(self, meta: dict[str, Any], settled: bool) -> None:
        """Write the manifest with a fresh record of the shard files and its checksum, then
        stamp the files (the writer's view of them needs no check at the next open)."""
        files = _record_files(self.path, self.files, _stats_trusted(self.folder, PROBE))
        self.save_meta(_sealed(meta, files, settled))
        self.files, self.settled, self.sound = files, settled, True
        self.checked = {rel: [f["size"], f["mtime_ns"], f["inode"]] for rel, f in files.items()}
        self._write_stamp(fresh=True)  # nothing changed since they were hashed
        # ...but a file changed just before may change again without moving its mtime
        self.checked = {rel: st for rel, st in self.checked.items() if not files[rel].get("racy")}

    # -- staging -------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self.broken:
            raise StorageError(f"a commit to {self.folder} failed after its commit point: open "
                               "the index again (the open finishes that commit)")

    def upsert(self, ids: list[str], vecs: np.ndarray, payloads: list[dict[str, Any]]) -> None:
        self._writable()
        vecs = np.array(vecs, dtype=np.float32)  # a copy, normalised as Qdrant stores it
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = np.divide(vecs, norms, out=vecs, where=norms > 0)
        for i, v, p in zip(ids, vecs, payloads):
            # JSON round trip: stored by value, as the shard would. What JSON can carry but the
            # engine cannot (deep nesting, NaN, ints beyond 64 bits) QdrantStore.upsert refused
            # already (base.refuse_unstorable): the engine would fail after the commit point
            self.staged[i] = (json.loads(json.dumps(p, ensure_ascii=False)), v)
        self._under = None

    def delete(self, ids: list[str]) -> None:
        self._writable()
        for i in ids:
            self.staged[i] = None
        self._under = None

    @_engine_call
    def under(self) -> dict[str, str]:
        """The staged points the shard holds, with their committed language (cached)."""
        if self._under is None:
            pids, under = list(self.staged), {}
            for a in range(0, len(pids), 1000):
                for p in self.shard.retrieve(pids[a:a + 1000], ["lang"], False):
                    under[str(p.id)] = (p.payload or {}).get("lang", UND)
            self._under = under
        return self._under

    # -- reading: the shard overlaid with the staged writes ------------------------------------

    @_engine_call
    def search(self, vec: np.ndarray, k: int, langs: list[str] | None, ef: int | None = None) -> Hits:
        return [(p, score) for p, score, _ in self._query(vec, k, langs, ef, False)]

    @_engine_call
    def search_vectors(self, asks: list[tuple[np.ndarray, list[str] | None]], k: int,
                       ef: int | None = None) -> list[VectorHits]:
        """For each (vector, languages) of ``asks``, its ``k`` best with their stored vectors
        (read by the search itself: one engine call, not a search and a retrieve)."""
        return [self._query(vec, k, langs, ef, True) for vec, langs in asks]

    def _query(self, vec: np.ndarray, k: int, langs: list[str] | None, ef: int | None,
               with_vector: bool) -> VectorHits:
        q = self.q
        shadowed = len(self.under()) if self.staged else 0  # hits that staged writes replace
        flt = langs and q.Filter(must=[q.FieldCondition("lang", match=q.MatchAny(langs))])
        params = search_params(q, ef, bool(flt), self.acorn)
        res = self.shard.query(q.QueryRequest(query=q.Query.Nearest(vec.tolist()),
                                              limit=k + shadowed, filter=flt or None,
                                              with_payload=True, with_vector=with_vector, params=params))
        hits = [(p.payload or {}, float(p.score), _array(p.vector) if with_vector else None)
                for p in res if str(p.id) not in self.staged]
        if self.staged:
            unit = vec / max(float(np.linalg.norm(vec)), 1e-30)
            hits += [(p, float(v @ unit), np.array(v, dtype=np.float32) if with_vector else None) for p, v in
                     (s for s in self.staged.values() if s is not None)
                     if langs is None or p.get("lang", UND) in langs]
            hits.sort(key=lambda h: -h[1])
            hits = [(copy.deepcopy(p), score, v) for p, score, v in hits[:k]]
        return hits[:k]

    @_engine_call
    def retrieve(self, ids: list[str]) -> list[dict[str, Any]]:
        fresh = [i for i in ids if i not in self.staged]
        # with_payload/with_vector are required positionals, although the .pyi says optional
        found = [p.payload or {} for p in self.shard.retrieve(fresh, True, False)] if fresh else []
        return found + [copy.deepcopy(s[0]) for s in map(self.staged.get, ids) if s is not None]

    @_engine_call
    def retrieve_vectors(self, ids: list[str]) -> dict[str, list[float]]:
        fresh = [i for i in ids if i not in self.staged]
        found = {(p.payload or {})["_id"]: p.vector
                 for p in self.shard.retrieve(fresh, ["_id"], True)} if fresh else {}
        found.update((s[0]["_id"], s[1].tolist())
                     for s in map(self.staged.get, ids) if s is not None)
        return found

    def scroll_ids(self) -> Iterator[str]:
        if self.snap is not None:  # a copy may be swapped between pages: read it all at once
            with self.mutex:
                return iter(list(self._scroll_ids()))
        return self._scroll_ids()

    def _scroll_ids(self) -> Iterator[str]:
        staged = dict(self.staged)  # what is staged now; later writes do not change this scan
        offset = None
        while True:
            with self.mutex, _engine(self.where, self.folder):
                points, offset = self.shard.scroll(self.q.ScrollRequest(
                    offset=offset, limit=1000, with_payload=["_id"], with_vector=False))
            yield from ((p.payload or {})["_id"] for p in points if str(p.id) not in staged)
            if offset is None:
                break
        yield from (s[0]["_id"] for s in staged.values() if s is not None)

    @_engine_call
    def count(self) -> int:
        n = int(self.shard.count(self.q.CountRequest(exact=True)))
        if self.staged:
            under = self.under()
            n += sum(1 for i, s in self.staged.items() if s is not None and i not in under)
            n -= sum(1 for i, s in self.staged.items() if s is None and i in under)
        return n

    @_engine_call
    def facet(self) -> dict[str, int]:
        hits = self.shard.facet(self.q.FacetRequest("lang", limit=100_000, exact=True))
        counts = {str(h.value): int(h.count) for h in hits}
        if self.staged:
            for lang in self.under().values():
                counts[lang] = counts.get(lang, 0) - 1
            for s in self.staged.values():
                if s is not None:
                    lang = s[0].get("lang", UND)
                    counts[lang] = counts.get(lang, 0) + 1
        return counts

    # -- committing ----------------------------------------------------------------------------

    def commit(self, meta: dict[str, Any],
               write: Callable[[Path, bytes], None] = atomic_write_bytes) -> None:
        """Steps 1-5 of a commit (module docstring of :mod:`qdrant`); ``write`` writes the
        redo log atomically (its rename is the commit point)."""
        self._writable()
        meta = _unsealed(meta)
        if not self.staged:  # nothing for the shard: the manifest alone is the commit
            if self.files is None:  # made before checksums: record them now
                self._record(meta, settled=False)
            else:  # same files, same record: the stamp stays valid
                self.save_meta(_sealed(meta, self.files, self.settled))
            return
        deletes = [i for i, s in self.staged.items() if s is None]
        ups = [(i, s) for i, s in self.staged.items() if s is not None]
        vecs = (np.stack([s[1] for _, s in ups]) if ups
                else np.zeros((0, int(meta["dim"])), dtype=np.float32))
        ops = (deletes, [i for i, _ in ups], [s[0] for _, s in ups], vecs)
        data = _redo_bytes(meta, *ops)
        _ensure_space(self.folder, _commit_need(len(data)), "commit",
                      "; free some space or commit fewer documents at a time; the last commit "
                      "is intact")
        write(Path(self.redo), data)  # <- the commit point (its rename)
        # staged writes stay readable until the shard has them; if this fails, the commit
        # still happened (its redo file is in place): the next open finishes it
        try:
            self._apply(meta, *ops)
        except BaseException as exc:
            self.broken = True  # the engine may hold part of the ops: only an open recovers
            if isinstance(exc, (OSError, StorageError)):
                raise StorageError(
                    f"a commit to {self.folder} is recorded ({REDO}) but could not be applied: "
                    f"{exc}; opening the index again (with enough free space) finishes it") from exc
            raise
        finally:
            self._under = None  # the shard may hold some of the staged points now
        self.staged = {}

    def _apply(self, meta: dict[str, Any], deletes: list[str], upserts: list[str],
               payloads: list[dict[str, Any]], vecs: np.ndarray) -> None:
        """Steps 2-5 of a commit (module docstring); idempotent, so a crash may repeat them.
        Readers' copies in progress are waited for (a little) first (:meth:`_changing`)."""
        with self._changing():
            self._drop_stamp()  # from here on the shard may differ from its record
            self._apply_ops(meta, deletes, upserts, payloads, vecs)

    def _apply_ops(self, meta: dict[str, Any], deletes: list[str], upserts: list[str],
                   payloads: list[dict[str, Any]], vecs: np.ndarray) -> None:
        """The ops into the shard, flush, optimise, record, and the redo log gone."""
        q = self.q
        with _engine(self.where, self.folder):
            for a in range(0, len(deletes), _BATCH):  # unknown ids are no-ops in Qdrant
                self.shard.update(q.UpdateOperation.delete_points(deletes[a:a + _BATCH]))
            for a in range(0, len(upserts), _BATCH):
                self.shard.update(q.UpdateOperation.upsert_points(
                    [q.Point(i, v.tolist(), p) for i, v, p in
                     zip(upserts[a:a + _BATCH], vecs[a:a + _BATCH], payloads[a:a + _BATCH])]))
            self.shard.flush()
            # (re)builds HNSW for grown segments; ~free when nothing changed, and then it says
            # so (False) and the second flush (~20 ms) is saved
            if self.optimize and self._optimize():
                self.shard.flush()
        # data first: the manifest never describes writes not yet durable. The record is of
        # the files as flushed; ``close`` settles it (a reload per commit cost ~0.03-0.08 s)
        self._record(_unsealed(meta), settled=False)
        os.remove(self.redo)
        fsync_path(Path(self.folder))

    def _optimize(self) -> bool:
        """The engine's optimize(); skipped with a warning when the engine finds too little
        free space for it (it checks before it changes anything): the commit stands, searches
        scan the unoptimised segments, and a later commit with room optimises them."""
        try:
            return bool(self.shard.optimize())
        except Exception as exc:  # the bindings raise plain Exception
            if OPTIMIZE_REFUSED not in str(exc):
                raise
            warnings.warn(f"the shard in {self.folder} was not optimised: {exc}", RuntimeWarning,
                          stacklevel=2)
            return False

    # -- checking ------------------------------------------------------------------------------

    def verify(self, rows: bool, dim: int) -> list[str]:
        """Everything wrong with the committed files, read in full whatever the stamp says:
        the manifest's checksum, every shard file against its record, and with ``rows`` every
        point as the engine reads it (its id derives from its ``_id``, its vector is finite).
        A reader on a copy checks the files in the index folder while a writer may be
        committing: findings that a commit in flight explains are checked again."""
        with self.mutex:
            deadline = time.monotonic() + self.snapshot_wait
            while True:
                left = max(0.0, deadline - time.monotonic())
                with self._copying(left) if self.snap is not None else nullcontext():
                    key = self._manifest_key()
                    problems = self._verify_files()
                if (not problems or self.snap is None or time.monotonic() > deadline
                        or key == self._manifest_key() and not os.path.exists(self.redo)):
                    break
                time.sleep(0.1)
            if rows and not problems:
                problems += self._check_points(dim)
            return problems

    def _verify_files(self) -> list[str]:
        try:
            meta = self.meta()
        except CorruptIndexError as exc:
            return [str(exc)]
        if meta is None:
            return [f"{MANIFEST} in {self.folder} is gone"]
        if os.path.exists(self.redo):
            return [f"a commit is unfinished ({REDO} in {self.folder}): reopen the index to finish it"]
        files = meta.get("files")
        if files is None:
            return [f"the index in {self.folder} has no file checksums (made before them): "
                    "any commit records them"]
        stats, odd = _shard_stats(self.path)
        problems, matching = _check_files(self.path, files, stats, odd)
        if files == self.files:
            self.checked.update(_aged(matching))
        return problems

    def _check_points(self, dim: int) -> list[str]:
        problems: list[str] = []
        offset, n = None, 0
        try:
            with _engine(self.where, self.folder):
                while True:
                    points, offset = self.shard.scroll(self.q.ScrollRequest(
                        offset=offset, limit=1000, with_payload=["_id"], with_vector=True))
                    for p in points:
                        n += 1
                        doc = (p.payload or {}).get("_id")
                        vec = _dense(p.vector) if p.vector is not None else []
                        if not isinstance(doc, str) or _point_id(doc) != str(p.id):
                            problems.append(f"point {p.id} does not belong to its document {doc!r}")
                        elif len(vec) != dim or not all(map(math.isfinite, vec)):
                            problems.append(f"the vector of {doc!r} is malformed")
                    if offset is None:
                        break
                count = int(self.shard.count(self.q.CountRequest(exact=True)))
        except CorruptIndexError as exc:
            return problems + [str(exc)]
        except Exception as exc:  # noqa: BLE001 - what the engine says is the finding
            return problems + [f"the shard in {self.folder} cannot be read in full: {exc}"]
        if count != n:
            problems.append(f"the shard counts {count} points, a full scan finds {n}")
        return problems[:20]

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop staged writes, settle the record if this session committed (see
        :meth:`_settle`), close the shard, stamp its files and release the lock; a reader on
        a copy removes it (after its background copy, if one is under way)."""
        self.staged, self._under = {}, None  # never committed: dropped
        with self.mutex:
            self._closed = True
        self._stop.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(self.snapshot_wait)  # a copy under way; it waits for no lock now
        with self.mutex:
            ready, self._ready = self._ready, None
        if ready is not None:
            self._discard(ready)
        try:
            meta = self.meta() if self._settle_due() else None
            if meta is not None:
                try:
                    self._settle(_unsealed(meta))
                except (StorageError, OSError) as exc:
                    if not (isinstance(exc, StorageError) or _no_space(exc)):
                        raise
                    # a full disk: the record stays as flushed, which the next open settles
            self._close_engine()
            if self.lock is not None:
                self._write_stamp()  # after the engine's close, which touches some files
        finally:
            try:
                self._close_engine()  # if the above failed
            finally:
                if self.lock is not None:
                    self.lock, lock = None, self.lock
                    lock.release()
                if self.snap is not None:
                    self.snap, snap = None, self.snap
                    snap.close()
                for fd in self._lock_fds or ():
                    os.close(fd)
                self._lock_fds = None

    def _reopen(self) -> None:
        """After a ``close`` that was part of opening: this object serves on."""
        self._closed = False
        self._stop.clear()

    def _settle_due(self) -> bool:
        """The shard is open, as recorded, the record is not settled, and no commit is pending
        (a failed one leaves its redo log to the next open, which must not be overwritten)."""
        return (self.shard is not None and self.sound and self.files is not None
                and not self.settled and not os.path.exists(self.redo))

    def _close_engine(self) -> None:
        if self.shard is not None:
            self.shard, shard = None, self.shard
            with _engine(self.where):
                shard.close()
