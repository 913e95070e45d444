"""The embedded default store: hnswlib for vectors, SQLite for records, in one folder.

Folder layout::

    manifest.json        human-readable copy of the committed manifest
    records.sqlite       ids, text, payload; table ``meta`` holds the commit record
    vectors-<gen>.hnsw   the hnswlib graph of generation <gen>
    writer.lock          held (flock) by the one writer
    .verified.json       sizes and times of the files as last written or checked (a cache)

The commit point is the SQLite transaction: a commit first writes the new graph to a
new ``vectors-<gen>.hnsw`` file (temporary name, fsync, rename), then commits the
records together with the meta row naming that file, its checksum, and its size, time and
inode as the writer left it (``hnsw_stat``). A crash
before the SQLite commit leaves the previous generation intact (the orphan graph file is
removed by the next writer); hnswlib's own ``save_index`` overwrites in place, so it never
writes to a committed file. hnswlib files record neither dimension nor space: both are in
the manifest, and the file size is checked on open. A graph of language-centred vectors
(option ``centred``, ``centring.py``) has its anchors in the commit record too, so the graph
and the anchors it was centred by are always of one commit.

SQLite runs in WAL mode: readers in other processes keep answering from the last commit
while a writer works, and pick up a new generation at their next search.

Damage is detected, never trusted: every record row carries a checksum of its content
(checked whenever it is read), the commit record carries one of itself, and a file whose
size or time differs from what vecplug last wrote or checked is verified in full on open
(SHA-256 of the graph against the commit record, before hnswlib, which crashes on
damaged input, ever reads it; SQLite's ``integrity_check``). :func:`verify` checks
everything regardless of the cache.

A reader following the writer to a new generation cannot wait for ``.verified.json``: the
writer stamps it after the commit, which the reader sees first. It takes the database's
changes as SQLite's own (its connection saw them committed) and the graph file as written
when it is exactly as ``hnsw_stat`` recorded; otherwise, and for commit records made before
``hnsw_stat``, it checks in full as an open does.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.adapters.stores import centring
from vecplug.adapters.stores.base import (EXACT_FILTER_LIMIT, Candidate, Record, StoreHit, VectorStore,
                                          best_first, column_dots, ordered_vectors, refuse_unstorable)
from vecplug.adapters.stores.hnsw_format import check_graph_file
from vecplug.errors import (
    CorruptIndexError,
    IndexNotFoundError,
    MissingDependencyError,
    ModelMismatchError,
    StorageError,
    VecplugError,
)
from vecplug.fsutil import (WriterLock, atomic_write_json, file_sha256, fsync_path, json_checksum,
                            storage_error)
from vecplug.types import HNSW_DEFAULTS

DB_NAME = "records.sqlite"
MANIFEST_NAME = "manifest.json"
STAMP_NAME = ".verified.json"
#: language filters a handle keeps (their labels and vectors), least recently used dropped
#: first: each is a copy of its languages' vectors (up to :func:`scan_limit` of them), and
#: a service's users ask for many language sets. A corrected search asks for every language
#: at once, so the scanned ones must fit together: 408 MB on the Debian million (32 languages)
FILTER_CACHE_BYTES = 512 * 1024 * 1024
#: a filtered walk costs more the smaller its language's share of the index, an exact scan
#: more the more documents it reads. On the Debian million in 32 languages (modes_scale.py):
#: walks for the six languages of 21,000-35,000 documents (2-3.5%) took 7-15 ms each (its
#: result file as of 072d2eb), exact scans of them 2.9-5.7 ms (benchmarks/results/
#: modes_scale_debian.md). A language is scanned while documents x share, i.e. documents^2 /
#: index size, is at most this: at a million up to 50,000 documents (the cap), at 200,000 up
#: to 22,360, where the three walked languages (12-19%) cost 3.0-3.4 ms each. Measured with
#: ``--scan-limits`` (the same file): at a million, 50,000 against 20,000: 67 against 97 ms p50,
#: 115 against 224 p95, the same recall; at 200,000 scanning every language was slower than
#: walking the three largest (40 against 29 ms)
SCAN_SHARE_PRODUCT = 2_500
#: the most documents a language filter scans exactly however large the index: each scanned
#: filter is a copy of its vectors in the cache (50,000 x 384 float32: 77 MB)
SCAN_LIMIT_CAP = 50_000
#: a centred graph (option ``centred``: ``centring.py``) answers a plain-cosine search language by
#: language; a language it walks yields this many times the candidates asked, rescored with the
#: vectors as encoded: the graph's order within a language is the centred one, which differs,
#: and the graph does not keep a language's documents together (at a million, ``mono`` with 8
#: found 0.973 of the exact top 10: benchmarks/results/modes_scale_debian_centred.md)
CENTRED_WALK_OVERFETCH = 8
#: the corrected search's one walk of a centred graph is this many times as broad as the index's
#: ``ef_search`` (unless a search gives its own ``ef``): it replaces a search per language, and at
#: a million 256 found 0.982 of the exact centred top 10 in 2.6 ms, 128 0.968 in 2.0 (the same file)
CENTRED_EF_FACTOR = 2
#: a commit rebuilds the graph once deleted vectors are this share of it (and at least
#: COMPACT_MIN of them): hnswlib keeps deleted vectors in the graph, marked
COMPACT_SHARE = 0.25
COMPACT_MIN = 64
# a reader whose check of the generation it just read fails while a writer commits (which
# removes the last generation's graph file) reads the commit record again, this many times
_OPEN_RETRIES = 5
_SCHEMA = """
CREATE TABLE IF NOT EXISTS records(
    label INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, text TEXT NOT NULL,
    source TEXT NOT NULL, position INTEGER NOT NULL, lang TEXT, payload TEXT NOT NULL,
    crc TEXT);
CREATE INDEX IF NOT EXISTS records_lang ON records(lang);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_COLUMNS = "label, id, text, source, position, lang, payload"


def _hnswlib() -> Any:
    try:
        import hnswlib
    except ImportError as exc:
        raise MissingDependencyError("hnswlib", purpose="the hnswlib store") from exc
    return hnswlib


def _items(index: Any, labels: list[int]) -> np.ndarray:
    """Stored vectors by label, as float32 rows. hnswlib 0.8 builds its "numpy" result from
    Python lists, ~3x slower than taking the lists and converting once here."""
    return np.asarray(index.get_items(labels, return_type="list"), dtype=np.float32).reshape(len(labels), index.dim)


def _lang_in(langs: Sequence[str]) -> tuple[str, list[str]]:
    """A condition on records (with its arguments) for the languages ``langs``, ``und`` matching
    records without one too, written so that SQLite searches its index on ``lang``:
    ``COALESCE(lang, 'und') IN (...)`` reads every record (the Debian million, its pages cached:
    one language 0.11 s against 0.04, each of its 32 in turn 2.7 s against 0.45)."""
    cond = f"lang IN ({','.join('?' * len(langs))})"
    return (f"({cond} OR lang IS NULL)" if centring.UND in langs else cond), list(langs)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (a partial sort: O(n), not O(n log n))."""
    if k < len(scores):
        part = np.argpartition(-scores, k - 1)[:k]
        return part[np.argsort(-scores[part], kind="stable")]
    return np.argsort(-scores, kind="stable")


#: (filter, mean) pairs whose columns' scales a store keeps (the index's own means ask one per
#: language; a caller passing others would otherwise grow the cache without end)
MAX_COLUMN_SCALES = 64


def centred_column_scores(columns: np.ndarray, query: np.ndarray, mean: np.ndarray,
                          scales: np.ndarray) -> np.ndarray:
    """``query . (x - mean) / |x - mean|`` for each column ``x``: the language-bias correction's
    score of a document for a centred ``query`` (``adapters/bias.py``), as one product less a
    constant, times each column's scale (``centring.inverse_distances`` of the columns)."""
    return (column_dots(columns, query) - float(query @ mean)) * scales


#: values bound in one ``IN (...)`` statement (SQLite's bound variables: 999 in older builds)
IN_PART = 500


def _in_parts(values: Sequence[Any]) -> Iterator[tuple[list[Any], str]]:
    """``values`` in parts of :data:`IN_PART`, each with its ``?,?,...`` placeholders."""
    for i in range(0, len(values), IN_PART):
        part = list(values[i:i + IN_PART])
        yield part, ",".join("?" * len(part))


def _foreign_files(folder: Path, marker: str | None = None) -> list[str]:
    """The names in ``folder`` that an hnswlib index in the making would not leave behind
    (a creation cut short leaves only its lock and temporary files, and ``marker``: the file
    naming a store built on this one, :attr:`HnswStore.marker`)."""
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []  # not there (yet): making it reports what is in the way
    except OSError as exc:
        raise storage_error(exc, f"cannot read the index folder {folder}") from exc
    ours: tuple[str, ...] = ("writer.lock", STAMP_NAME, "lost+found")  # lost+found: a fresh ext4 mount point
    if marker:
        ours += (marker,)
    if DB_NAME in names and _uncommitted(folder / DB_NAME):
        ours += _DB_FILES  # a creation cut short before its first commit: made again
    return [n for n in names if n not in ours and not n.startswith((f".{DB_NAME}.", f".{MANIFEST_NAME}."))]


_DB_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm")


def _read_only_folder(folder: Path) -> bool:
    """Whether this process may not write in ``folder`` (a read-only mount, another user's folder)."""
    return not os.access(folder, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def _wal_pending(path: Path) -> bool:
    """Whether the write-ahead log of the database at ``path`` holds anything (commits not yet
    in the database file; SQLite leaves an empty one behind an open connection)."""
    try:
        return Path(f"{path}-wal").stat().st_size > 0
    except FileNotFoundError:
        return False


def _reader_uri(path: Path) -> str:
    """The URI a reader opens the database at ``path`` with. SQLite makes a WAL database's log
    and its index beside it at every open, which a read-only folder refuses: there, with no
    log pending, the database is opened as immutable (read without them and without locks).
    No writer can be at work in a folder without a log (it would have made one); a writer
    who starts later is not followed. With a log pending, immutable would read the database
    without its last commits."""
    uri = path.resolve().as_uri() + "?mode=ro"
    if _read_only_folder(path.parent) and not _wal_pending(path):
        uri += "&immutable=1"
    return uri


def _uncommitted(path: Path) -> bool:
    """Whether the database at ``path`` holds no commit record: an index whose creation was
    cut short (by versions that put the database in place before its first commit). One that
    cannot be read is not taken for that: opening it reports the damage."""
    try:
        db = sqlite3.connect(_reader_uri(path), uri=True)
    except sqlite3.Error:
        return False
    try:
        return db.execute("SELECT COUNT(*) FROM meta WHERE key = 'manifest'").fetchone()[0] == 0
    except sqlite3.Error:
        return False
    finally:
        db.close()


def _row_crc(label: int, rid: str, text: str, source: str, position: int, lang: str | None,
             payload: str) -> str:
    data = json.dumps([label, rid, text, source, position, lang, payload], ensure_ascii=False)
    return hashlib.blake2b(data.encode(), digest_size=8).hexdigest()


def _sqlite_error(exc: sqlite3.Error, where: Path) -> VecplugError:
    """SQLite's error as ours: damage is a :class:`CorruptIndexError`, I/O a :class:`StorageError`."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    damaged = (name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or type(exc) is sqlite3.DatabaseError
               or "Could not decode" in str(exc))  # text that is not UTF-8: damaged bytes
    if damaged:
        return CorruptIndexError(f"{where} is damaged ({exc}); rebuild the index or run vecplug verify")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StorageError(f"{where} is busy ({exc}); try again")
    return StorageError(f"cannot use {where}: {exc}; the last commit is intact")


def _file_stats(folder: Path, names: Sequence[str]) -> dict[str, list[int] | None]:
    out: dict[str, list[int] | None] = {}
    for name in names:
        try:
            st = (folder / name).stat()
            out[name] = [st.st_size, st.st_mtime_ns, st.st_ino]
        except FileNotFoundError:
            out[name] = None
        # SQLite makes an empty write-ahead log at every open (a reader cannot remove it), so
        # a stamp taken when there was none would never match again: empty is as good as none
        if name.endswith("-wal") and out[name] is not None and out[name][0] == 0:  # type: ignore[index]
            out[name] = None
    return out


def _first_day_checksum(meta: dict[str, Any]) -> bool:
    """Whether the commit record carries the checksum of vecplug's first day (BLAKE2b-128 of
    its ASCII JSON, 2026-11-22): an intact index of then, which the next commit re-stamps
    with SHA-256, not a damaged one."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    digest = hashlib.blake2b(json.dumps(body, sort_keys=True).encode(), digest_size=16).hexdigest()
    return meta["checksum"] == digest


def _crc_column(db: sqlite3.Connection) -> str:
    """The records' checksum column; NULL (nothing to check) in an index made before row
    checksums, which a writer migrates but a reader reads as it is."""
    return "crc" if any(row[1] == "crc" for row in db.execute("PRAGMA table_info(records)")) else "NULL"


def scan_limit(total: int) -> int:
    """The most documents a language filter may match to be searched by an exact scan (more: a
    filtered graph walk) in an index of ``total`` documents: EXACT_FILTER_LIMIT, raised in a large
    index to where a scan costs what a walk costs (:data:`SCAN_SHARE_PRODUCT`), at most
    :data:`SCAN_LIMIT_CAP`. Below 160,000 documents it is EXACT_FILTER_LIMIT."""
    return max(EXACT_FILTER_LIMIT, min(SCAN_LIMIT_CAP, math.isqrt(SCAN_SHARE_PRODUCT * max(total, 0))))


def _filter_bytes(entry: tuple[np.ndarray, np.ndarray | frozenset[int]]) -> int:
    """About what a cached language filter takes: its labels and vectors, or its label set."""
    labels, columns_or_set = entry
    held = columns_or_set.nbytes if isinstance(columns_or_set, np.ndarray) else 64 * len(columns_or_set)
    return labels.nbytes + held


def _database_stats(folder: Path) -> dict[str, list[int] | None]:
    """The database and its write-ahead log as an immutable reader compares them: a change
    means a commit landed (see HnswStore._frozen)."""
    return _file_stats(folder, (DB_NAME, DB_NAME + "-wal"))


class HnswStore(VectorStore):
    """hnswlib + SQLite in a folder; see the module docstring for the commit protocol.

    A store that keeps its vectors another way subclasses this one (``flat.py``): it gives its
    vectors' class (:meth:`_new_graph`, with the subset of ``hnswlib.Index`` used here), their
    file's check and suffix, and a marker file that tells its folders from this store's."""

    name = "hnswlib"
    #: the file that marks a folder as a subclass's index (None: this store's, whose folders
    #: hold no ``.store-*`` file)
    marker: str | None = None
    #: the vectors' file: ``vectors-<gen><suffix>``
    graph_suffix = ".hnsw"
    #: the options a new index records when not given
    defaults: dict[str, Any] = HNSW_DEFAULTS

    def __init__(self, folder: Path, db: sqlite3.Connection, commit_meta: dict[str, Any],
                 index: Any, writable: bool, lock: WriterLock | None, options: dict[str, Any]) -> None:
        self.folder = folder
        self._db: sqlite3.Connection | None = db
        self._meta = commit_meta
        self._index = index
        self._writable = writable
        self._lock = lock
        self._options = {**self.defaults, **commit_meta["manifest"].get("store", {}), **options}
        self._next_label = int(commit_meta["next_label"])
        # the records' checksum column as this connection sees it (NULL before row checksums)
        self._crc = _crc_column(db)
        self._mutex = threading.RLock()  # hnswlib is not thread-safe between add and query
        self._dirty = False
        self._broken = False  # a commit failed: no more writes through this handle
        # a failed commit could not put the last commit's graph back (why): reads refuse
        self._graph_lost: str | None = None
        self._data_version: int | None = None  # PRAGMA data_version at the last _refresh
        # a reader opened as immutable (a folder it cannot write): its database files as they
        # were then. SQLite does not see another process's commits there (data_version never
        # moves), and reading on while they land mixes pages: a change means a new connection
        self._frozen: dict[str, list[int] | None] | None = None
        # per language set: labels, and their vectors as columns or (too many) a set of labels;
        # least recently used first, within FILTER_CACHE_BYTES (users' language sets are many)
        self._filter_cache: OrderedDict[tuple[str, ...], tuple[np.ndarray, np.ndarray | frozenset[int]]] = OrderedDict()
        #: per (filter, mean bytes): its columns' 1 / |x - mean| (``_scan_scores``)
        self._column_scales: dict[tuple[tuple[str, ...], bytes], np.ndarray] = {}
        # a centred graph (centring.py) is a property of the graph as built: never an option at open
        self._centred = bool(commit_meta["manifest"].get("store", {}).get("centred", False))
        self._anchors: centring.Anchors | None = None
        self._anchors_of: dict[str, Any] | None = None  # the commit record they were read from
        self._all_langs: list[str] | None = None  # a centred graph's languages, until the next write

    @property
    def centred(self) -> bool:
        """Whether the graph holds language-centred vectors (``centring.py``): built so, for good."""
        return self._centred

    @property
    def parameters(self) -> dict[str, int]:
        """The graph's ``M`` and ``ef_construction`` (as built; before a graph exists, what it
        will be built with) and the default search breadth ``ef_search`` of this handle (given
        at open, else the index's, else the default)."""
        with self._mutex:
            graph = self._index
            built = ({"M": int(graph.M), "ef_construction": int(graph.ef_construction)} if graph is not None
                     else {key: int(self._options[key]) for key in ("M", "ef_construction")})
        return {**built, "ef_search": int(self._options["ef_search"])}

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def exists(cls, location: str, options: dict[str, Any]) -> bool:
        path = Path(location) / DB_NAME
        return path.is_file() and not _uncommitted(path) and cls._marked(Path(location))

    @classmethod
    def _marked(cls, folder: Path) -> bool:
        """Whether ``folder`` is marked as this class's (a subclass's marker file; none for this one)."""
        if cls.marker:
            return (folder / cls.marker).is_file()
        try:
            return not any(name.startswith(".store-") for name in os.listdir(folder))
        except OSError:
            return True  # unreadable: opening it reports why

    @classmethod
    def check_location(cls, location: str, options: dict[str, Any]) -> None:
        foreign = _foreign_files(Path(location), cls.marker)
        if foreign:
            # another store's index, or someone's own files: never write over them
            raise VecplugError(f"{location} is not empty and not a vecplug {cls.name} index (it holds "
                               f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                               "give --index a new or empty folder")

    @classmethod
    def create(cls, location: str, dim: int, manifest: dict[str, Any],
               options: dict[str, Any]) -> "HnswStore":
        folder = Path(location)
        if cls.exists(location, options):
            raise VecplugError(f"an index already exists at {folder}")
        cls.check_location(location, options)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, f"cannot create the index folder {folder}") from exc
        lock = WriterLock(folder)
        lock.acquire()
        try:
            opts = {**cls.defaults, **options}
            manifest = {**manifest, "dim": dim,
                        "store": {"name": cls.name, "space": "cosine", **opts}}
            tmp_db = folder / f".{DB_NAME}.{os.getpid()}.tmp"
            try:
                if (folder / DB_NAME).is_file() and _uncommitted(folder / DB_NAME):
                    for name in _DB_FILES:  # a creation cut short (under the lock: nobody's now)
                        (folder / name).unlink(missing_ok=True)
                tmp_db.unlink(missing_ok=True)
                if cls.marker:  # before the database: the folder is never taken for another store's
                    with open(folder / cls.marker, "w", encoding="ascii") as fh:
                        fh.write(f"a vecplug {cls.name} index\n")
                        fh.flush()
                        os.fsync(fh.fileno())
                db = sqlite3.connect(tmp_db, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                # the first commit record goes in before the database takes its name: an index
                # exists only with one (a kill right after the rename left one without, that
                # every later run failed to open)
                meta: dict[str, Any] = {"manifest": manifest, "generation": 0, "next_label": 0,
                                        "hnsw_file": None, "count": 0}
                meta["checksum"] = json_checksum(meta)
                db.executemany("INSERT INTO meta(key, value) VALUES (?, ?)",
                               [(key, json.dumps(value)) for key, value in meta.items()])
                db.close()
                with open(tmp_db, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp_db, folder / DB_NAME)  # the index exists only once complete
                fsync_path(folder)
            except OSError as exc:
                raise storage_error(exc, f"cannot create the index at {folder}") from exc
            except sqlite3.Error as exc:
                raise _sqlite_error(exc, folder / DB_NAME) from exc
            finally:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{tmp_db}{suffix}").unlink(missing_ok=True)
            store = cls._open(folder, writable=True, lock=lock, options=options)
            store.commit()  # the stamp and manifest.json beside the record
            return store
        except BaseException:
            lock.release()
            raise

    @classmethod
    def open(cls, location: str, options: dict[str, Any], writable: bool = False) -> "HnswStore":
        folder = Path(location)
        if not cls.exists(location, options):
            raise IndexNotFoundError(f"no vecplug index at {folder} (run: vecplug index PATH --index {folder})")
        lock = None
        if writable:
            lock = WriterLock(folder)
            lock.acquire()
        try:
            return cls._open(folder, writable, lock, options)
        except BaseException:
            if lock:
                lock.release()
            raise

    @classmethod
    def _open(cls, folder: Path, writable: bool, lock: WriterLock | None,
              options: dict[str, Any]) -> "HnswStore":
        if not writable:
            db, meta, index, frozen = cls._open_reader(folder)
            store = cls(folder, db, meta, index, writable, lock, options)
            store._frozen = frozen
            return store
        path = folder / DB_NAME
        try:
            db = sqlite3.connect(path.resolve().as_uri(), uri=True, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, path) from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")  # indexes made before WAL switch here
            db.execute("PRAGMA synchronous=FULL")  # a commit is durable once it returns
            cls._migrate(db)
            meta, index = cls._load_current(folder, db)
            store = cls(folder, db, meta, index, writable, lock, options)
            store._remove_orphans()
            db.execute("BEGIN")
            return store
        except sqlite3.Error as exc:
            db.close()
            raise _sqlite_error(exc, path) from exc
        except BaseException:
            db.close()
            raise

    @classmethod
    def _open_reader(cls, folder: Path) -> tuple[sqlite3.Connection, dict[str, Any], Any,
                                                 dict[str, list[int] | None] | None]:
        """A reader's connection, the last commit's record and graph, and (opened as immutable)
        the database files' stats as they were just before."""
        path = folder / DB_NAME
        frozen = _database_stats(folder)
        uri = _reader_uri(path)
        try:
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, path) from exc
        try:
            meta, index = cls._load_current(folder, db)
            return db, meta, index, (frozen if uri.endswith("immutable=1") else None)
        except sqlite3.Error as exc:
            db.close()
            if getattr(exc, "sqlite_errorname", "") == "SQLITE_CANTOPEN" and _read_only_folder(folder):
                # SQLite says only that it cannot open the file
                why = (f", and reading the commits pending in {DB_NAME}-wal needs SQLite to write "
                       "beside it: open the index once where it can be written, or again when its "
                       "writer has finished" if _wal_pending(path) else "")
                raise StorageError(f"cannot read {path} ({exc}): its folder is read-only{why}") from exc
            raise _sqlite_error(exc, path) from exc
        except BaseException:
            db.close()
            raise

    @classmethod
    def _load_current(cls, folder: Path, db: sqlite3.Connection,
                      following: bool = False) -> tuple[dict[str, Any], Any]:
        """The last commit's record and its checked, loaded graph (``following``: see
        :meth:`_checked_graph`).

        The record and the rows are read in one transaction: read one statement at a time, a
        writer's commit between them made the row count disagree with the record. The graph
        file is outside it: a writer that commits a new generation removes the last one, which
        a reader may be about to check or load. A failed check is therefore damage only when the
        commit record did not move meanwhile; when it did, the new commit is read."""
        for _ in range(_OPEN_RETRIES):
            db.execute("BEGIN")  # deferred: the snapshot is the first read's
            try:
                meta = cls._read_meta(db, folder / DB_NAME)
                try:
                    return meta, cls._checked_graph(folder, db, meta, following)
                except (FileNotFoundError, CorruptIndexError) as exc:
                    failure: Exception = exc
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")  # only read
            last = cls._read_meta(db, folder / DB_NAME)  # the last commit now, past the snapshot
            if (last["generation"], last.get("checksum")) == (meta["generation"], meta.get("checksum")):
                if isinstance(failure, FileNotFoundError):
                    raise CorruptIndexError(f"{folder / str(meta['hnsw_file'])} is missing: "
                                            "the index is damaged") from None
                raise failure
        raise StorageError(f"the index at {folder} is busy: a writer committed {_OPEN_RETRIES} times "
                           "while it was being opened; try again")

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
        if "crc" not in columns:  # indexes made before row checksums: new rows get them
            db.execute("ALTER TABLE records ADD COLUMN crc TEXT")

    @staticmethod
    def _read_meta(db: sqlite3.Connection, path: Path) -> dict[str, Any]:
        rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
        meta: dict[str, Any] = {"manifest": {}, "generation": 0, "next_label": 0, "hnsw_file": None}
        try:
            meta.update({key: json.loads(value) for key, value in rows.items()})
        except ValueError as exc:
            raise CorruptIndexError(f"{path}: damaged commit record: {exc}") from exc
        if "checksum" in meta and meta["checksum"] != json_checksum(meta) and not _first_day_checksum(meta):
            raise CorruptIndexError(f"{path}: the commit record fails its checksum: the index is damaged")
        if not isinstance(meta.get("manifest"), dict) or not isinstance(meta.get("next_label"), int):
            raise CorruptIndexError(f"{path}: malformed commit record")
        return meta

    @classmethod
    def _checked_graph(cls, folder: Path, db: sqlite3.Connection, meta: dict[str, Any],
                       following: bool = False) -> Any:
        """Check the files against the commit record (in full unless unchanged since vecplug last
        wrote or checked them), then load the graph. FileNotFoundError: the graph file is gone.
        ``following``: ``db`` is a reader's connection that saw this commit land (see
        :meth:`_graph_as_committed`)."""
        names = [DB_NAME, DB_NAME + "-wal"] + ([meta["hnsw_file"]] if meta["hnsw_file"] else [])
        stats = _file_stats(folder, names)
        if meta["hnsw_file"] and stats[meta["hnsw_file"]] is None:
            raise FileNotFoundError(meta["hnsw_file"])
        if not (following and cls._graph_as_committed(stats, meta)) and not cls._stamp_matches(folder, stats):
            problems = cls._full_check(folder, db, meta)
            if problems:
                raise CorruptIndexError(f"the index at {folder} is damaged: {problems[0]}")
        if "count" in meta:
            count = int(db.execute("SELECT COUNT(*) FROM records").fetchone()[0])
            if count != meta["count"]:
                raise CorruptIndexError(f"{folder / DB_NAME} holds {count} records, its commit "
                                        f"recorded {meta['count']}: the index is damaged")
        return cls._load_graph(folder, meta) if meta["hnsw_file"] else None

    @classmethod
    def _full_check(cls, folder: Path, db: sqlite3.Connection, meta: dict[str, Any],
                    rows: bool = False) -> list[str]:
        """What is wrong with the files, checked in full; ``rows``: every record's checksum too."""
        problems = [f"{DB_NAME}: {r[0]}" for r in db.execute("PRAGMA integrity_check").fetchall()
                    if r[0] != "ok"]
        if meta["hnsw_file"]:
            path = folder / meta["hnsw_file"]
            if not path.is_file():
                problems.append(f"{path.name} is missing")
            elif meta.get("hnsw_size") is not None and path.stat().st_size != meta["hnsw_size"]:
                problems.append(f"{path.name} has {path.stat().st_size} bytes, the commit "
                                f"recorded {meta['hnsw_size']}")
            elif meta.get("hnsw_sha256") and file_sha256(path) != meta["hnsw_sha256"]:
                problems.append(f"{path.name} does not match the checksum of its commit")
            elif problem := cls._check_graph(path, int(meta["manifest"]["dim"])):
                problems.append(problem)
        if rows and not problems:
            for row in db.execute(f"SELECT {_COLUMNS}, {_crc_column(db)} FROM records"):
                if row[7] is not None and row[7] != _row_crc(*row[:7]):
                    problems.append(f"{DB_NAME}: record {row[1]!r} fails its checksum")
        return problems

    @staticmethod
    def _graph_as_committed(stats: dict[str, list[int] | None], meta: dict[str, Any]) -> bool:
        """Whether the graph file is exactly as the writer left it when it committed ``meta``
        (size, time and inode as recorded in the commit record, beside its SHA-256): written,
        its layout walked and hashed by the writer, not touched since.

        A reader following the writer relies on this instead of ``.verified.json``, which the
        writer stamps only after the commit the reader sees first (a reader of a busy writer
        checked the whole index at most commits). The database needs no stamp there: the
        reader's own connection saw its changes committed through SQLite, and it had checked
        the database (or found it stamped) when it opened. Commit records of versions before
        ``hnsw_stat`` have none: the stamp decides, as before."""
        graph, recorded = meta["hnsw_file"], meta.get("hnsw_stat")
        return graph is not None and recorded is not None and stats.get(graph) == recorded

    @staticmethod
    def _stamp_matches(folder: Path, stats: dict[str, list[int] | None]) -> bool:
        try:
            return json.loads((folder / STAMP_NAME).read_text()) == stats
        except (OSError, ValueError):
            return False

    def _write_stamp(self) -> None:
        """Remember the files as this writer left them: the next open need not check them in full."""
        names = [DB_NAME, DB_NAME + "-wal"] + ([self._meta["hnsw_file"]] if self._meta["hnsw_file"] else [])
        try:
            atomic_write_json(self.folder / STAMP_NAME, _file_stats(self.folder, names))
        except OSError:
            pass  # only a cache: the next open checks in full

    @classmethod
    def _new_graph(cls, dim: int) -> Any:
        """An empty ``hnswlib.Index`` (cosine as inner product of unit vectors)."""
        return _hnswlib().Index(space="ip", dim=dim)

    @classmethod
    def _check_graph(cls, path: Path, dim: int) -> str | None:
        """What is wrong with the vectors' file at ``path``; None if nothing."""
        return check_graph_file(path, dim)

    @classmethod
    def _load_graph(cls, folder: Path, meta: dict[str, Any]) -> Any:
        path = folder / meta["hnsw_file"]
        manifest = meta["manifest"]
        problem = cls._check_graph(path, int(manifest["dim"]))  # cheap; hnswlib would crash
        if problem:
            raise CorruptIndexError(f"the index at {folder} is damaged: {problem}")
        index = cls._new_graph(int(manifest["dim"]))
        try:
            index.load_index(str(path), max_elements=int(meta.get("capacity", 0)))
        except RuntimeError as exc:
            raise CorruptIndexError(f"{path} cannot be loaded ({exc}): the index is damaged") from exc
        return index

    def _remove_orphans(self) -> None:
        """Graph files of crashed commits, and old generations."""
        keep = self._meta["hnsw_file"]
        for f in self.folder.iterdir():
            if (f.name.startswith("vectors-") or f.name.startswith(".vectors-")) and f.name != keep:
                f.unlink(missing_ok=True)

    def close(self) -> None:
        with self._mutex:
            if self._db is not None:
                try:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    self._db.close()
                except sqlite3.Error:
                    pass  # closing: nothing left to protect
                self._db = None
                if self._writable:
                    self._write_stamp()  # after close: SQLite has folded its WAL into the file
            self._index = None
            self._forget_filters()  # copies of vectors: released with the graph
            if self._lock:
                self._lock.release()
                self._lock = None

    # -- reading -----------------------------------------------------------

    @property
    def manifest(self) -> dict[str, Any]:
        with self._mutex:
            self._refresh()  # a reader's manifest is the last commit's, as its searches are
            return json.loads(json.dumps(self._meta["manifest"]))

    def manifest_value(self, key: str, default: Any = None) -> Any:
        with self._mutex:
            self._refresh()
            return copy.deepcopy(self._meta["manifest"].get(key, default))

    def commit_token(self) -> tuple[int, str | None]:
        """The generation and checksum of the commit record read from: a commit of new
        vectors changes both, one of the manifest alone the checksum. Costs a one-row query."""
        with self._mutex:
            self._refresh()
            return int(self._meta["generation"]), self._meta.get("checksum")

    @property
    def dim(self) -> int:
        return int(self._meta["manifest"]["dim"])

    def _sql(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self._db is None:
            raise VecplugError(f"the index at {self.folder} is closed")
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            error = _sqlite_error(exc, self.folder / DB_NAME)
            if (isinstance(error, CorruptIndexError) and self._frozen is not None
                    and _database_stats(self.folder) != self._frozen):
                # a commit landing under an immutable reader, not damage: the next read reopens
                raise StorageError(f"{self.folder} changed while this reader (in a folder it cannot "
                                   "write) read it: try again") from exc
            raise error from exc

    def _records(self, where: str, args: Sequence[Any]) -> list[tuple[int, Record]]:
        out = []
        for r in self._sql(f"SELECT {_COLUMNS}, {self._crc} FROM records WHERE {where}", args):
            if r[7] is not None and r[7] != _row_crc(*r[:7]):
                raise CorruptIndexError(f"{self.folder / DB_NAME}: record {r[1]!r} fails its "
                                        "checksum: the index is damaged")
            try:
                payload = json.loads(r[6])
            except ValueError as exc:  # only reachable for rows written before checksums
                raise CorruptIndexError(f"{self.folder / DB_NAME}: record {r[1]!r}: {exc}") from exc
            # "und" is how the language detector says "undetermined": a record reads it as
            # None, as one stored without a language does (and as the Qdrant store reads both)
            lang = None if r[5] == "und" else r[5]
            out.append((r[0], Record(r[1], r[2], r[3], r[4], lang, payload)))
        return out

    def _refresh(self) -> None:
        """A reader follows the writer: when a new commit was made, read its record, and load
        its graph when it wrote a new generation (a commit of the manifest alone keeps the
        graph). Under the mutex."""
        if self._writable or self._db is None:
            return
        if self._frozen is not None:
            if _database_stats(self.folder) != self._frozen:
                self._reopen()
            return
        # SQLite's count of other connections' commits: one cheap pragma when nothing was
        # committed since the last look (a search looks several times: manifest, token, graph)
        version = self._sql("PRAGMA data_version")[0][0]
        if version == self._data_version:
            return
        # taken before the record is read (a commit after that is seen next time); dropped if
        # moving to the new commit fails, so that the next look tries again
        self._data_version = version
        try:
            self._move_to_last_commit()
        except BaseException:
            self._data_version = None
            raise

    def _reopen(self) -> None:
        """A reader opened as immutable whose database files changed: a new connection on the
        last commit (immutable again once the writer is done, else as a plain reader)."""
        db, meta, index, frozen = self._open_reader(self.folder)
        # the old connection is not closed here: another thread may be reading through it
        # (outside the mutex, as count() does); it closes when the last reference goes
        self._db, self._crc = db, _crc_column(db)
        self._meta, self._index, self._frozen = meta, index, frozen
        self._next_label = int(meta["next_label"])
        self._forget_filters()
        self._data_version = None

    def _commit_moved(self) -> bool:
        """Whether the last commit is another than the one this reader reads."""
        rows = {key: json.loads(value) for key, value in
                self._sql("SELECT key, value FROM meta WHERE key IN ('generation', 'checksum')")}
        return bool(rows) and (rows.get("generation"), rows.get("checksum")) != (
            self._meta["generation"], self._meta.get("checksum"))

    def _move_to_last_commit(self) -> None:
        if not self._commit_moved():
            return
        try:
            meta = self._read_meta(self._db, self.folder / DB_NAME)
            if meta["generation"] == self._meta["generation"]:  # same records, same graph file
                self._meta = meta
                return
            meta, index = self._load_current(self.folder, self._db, following=True)
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.folder / DB_NAME) from exc
        self._meta, self._index = meta, index
        self._next_label = int(meta["next_label"])
        self._forget_filters()

    def _follow(self) -> None:
        """Before reading the graph, under the mutex: a reader moves to the last commit
        (:meth:`_refresh`); a writer whose failed commit could not load the last commit's
        graph again refuses, rather than answer from the changes it dropped."""
        if self._graph_lost is not None:
            raise StorageError(f"a commit to {self.folder} failed and the last commit's graph could "
                               f"not be loaded again ({self._graph_lost}): reopen the index")
        self._refresh()

    def _labels(self, ids: Sequence[str]) -> dict[str, int]:
        """The labels of those of ``ids`` that the graph in memory has, by id. Under the mutex,
        after :meth:`_follow`. SQLite answers from the last commit, which a reader's graph may
        not have loaded yet: a record it added has a label past the graph's (labels are never
        reused) and counts as absent here."""
        labels: dict[str, int] = {}
        for part, marks in _in_parts(ids):
            labels.update(self._sql(f"SELECT id, label FROM records WHERE id IN ({marks}) AND label < ?",
                                    [*part, self._next_label]))
        return labels

    def _rows_current(self) -> None:
        """Before rows are read outside a search: a reader opened as immutable sees another
        process's commits only by reopening (searches move to the last commit as they start;
        a reopen inside one, as a refresh from its row reads did, left the language filter's
        cache on the old labels)."""
        if self._frozen is not None:
            with self._mutex:
                self._refresh()

    def get(self, ids: Sequence[str]) -> list[Record]:
        self._rows_current()
        found: dict[str, Record] = {}
        for part, marks in _in_parts(ids):
            found.update((r.id, r) for _, r in self._records(f"id IN ({marks})", part))
        return [found[i] for i in ids if i in found]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        return ordered_vectors(self.vectors_found(ids), ids, self.dim)

    def vectors_found(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        with self._mutex:
            self._follow()
            by_id = self._labels(ids)
            found = [rid for rid in dict.fromkeys(ids) if rid in by_id]
            if not found:
                return {}
            labels = [by_id[rid] for rid in found]
            return dict(zip(found, self._vectors_of(labels, self._langs_of(labels) if self._centred else ())))

    def ids(self) -> Iterator[str]:
        self._rows_current()
        for (rid,) in self._sql("SELECT id FROM records ORDER BY label"):
            yield rid

    def count(self) -> int:
        self._rows_current()
        return int(self._sql("SELECT COUNT(*) FROM records")[0][0])

    def languages(self) -> dict[str, int]:
        self._rows_current()
        rows = self._sql("SELECT COALESCE(lang, 'und'), COUNT(*) FROM records GROUP BY 1 ORDER BY 2 DESC")
        return {lang: n for lang, n in rows}

    def verify(self, rows: bool = True) -> list[str]:
        """Everything wrong with the committed files, checked in full (empty: all is well). A
        reader checks the last commit, and one that a writer's commit replaced while it was
        checked (its graph file removed) again, as opening does: that is not damage."""
        with self._mutex:
            for _ in range(_OPEN_RETRIES):
                if not self._writable:
                    self._refresh()
                try:
                    problems = self._full_check(self.folder, self._db, self._meta, rows=rows)
                except FileNotFoundError as exc:  # removed between its check and its read
                    problems = [f"{Path(str(exc.filename)).name} is missing"]
                except sqlite3.Error as exc:
                    problems = [str(_sqlite_error(exc, self.folder / DB_NAME))]
                if not problems or self._writable or not self._commit_moved():
                    break
            try:
                copy = json.loads((self.folder / MANIFEST_NAME).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                copy = None
            if copy != self._meta["manifest"]:
                problems.append(f"{MANIFEST_NAME} (a copy for people) differs from the committed "
                                "manifest; the next commit rewrites it")
            return problems

    def search(self, vector: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
               ef: int | None = None) -> list[StoreHit]:
        with self._mutex:
            return self._hits(*self._nearest(vector, k, langs, ef))

    def candidates(self, vector: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
                   ef: int | None = None) -> list[Candidate]:
        """Keyed by label. The language is the filter's when it names one, else one light
        query for the labels' languages (no payload, no checksum)."""
        with self._mutex:
            row = self._query_row(vector)
            return self._candidates(row, k, langs, ef) if row is not None else []

    def candidates_per_language(self, vector: np.ndarray, k: int, langs: Sequence[str], *,
                                ef: int | None = None,
                                walk_vectors: Mapping[str, np.ndarray] | None = None,
                                means: Mapping[str, np.ndarray] | None = None) -> list[Candidate]:
        """One lock and one look for a newer commit for every language (a corrected search of
        six languages spent ~0.1 ms a language on them). A language walked (more than
        :func:`scan_limit` documents) walks towards its ``walk_vectors`` entry when given; a
        language scanned ranks its documents by centred cosine with its ``means`` entry when
        given (:func:`centred_column_scores`: its exact best by the correction's score, which
        differ from its best by ``vector . x`` as centring re-normalises each document)."""
        with self._mutex:
            row = self._query_row(vector)
            if row is None:
                return []
            walks, centres = walk_vectors or {}, means or {}
            return [c for lang in langs for c in self._candidates(
                row, k, [lang], ef, None if walks.get(lang) is None else self._row(walks[lang], "walk vector"),
                None if centres.get(lang) is None else self._row(centres[lang], "language mean")[0])]

    def _row(self, vector: np.ndarray, what: str) -> np.ndarray:
        """``vector`` as a float32 ``(1, dim)`` row; a ModelMismatchError naming ``what`` when
        its dimension is not the index's."""
        row = np.asarray(vector, dtype=np.float32).reshape(1, -1)
        if row.shape[1] != self.dim:
            raise ModelMismatchError(f"{what} has dimension {row.shape[1]}, the index at {self.folder} has {self.dim}")
        return row

    def _candidates(self, row: np.ndarray, k: int, langs: Sequence[str] | None,
                    ef: int | None, walk: np.ndarray | None = None, mean: np.ndarray | None = None) -> list[Candidate]:
        pairs, vectors = self._nearest_to(row, k, langs, ef, walk, mean)
        if not pairs:
            return []
        if langs and len(set(langs)) == 1:
            lang_of = dict.fromkeys((lab for lab, _ in pairs), langs[0])
        else:
            lang_of = dict(zip((lab for lab, _ in pairs), self._langs_of([lab for lab, _ in pairs])))
        if vectors is None:  # a graph walk: the vectors from the graph
            vectors = self._vectors_of([lab for lab, _ in pairs], [lang_of[lab] for lab, _ in pairs])
            if walk is not None:  # walked towards the hint: scored against the query, best first
                order, scores = best_first(vectors, row[0])
                pairs, vectors = [(pairs[i][0], float(scores[i])) for i in order], vectors[order]
        return [Candidate(lab, lang_of.get(lab), score, vectors[i]) for i, (lab, score) in enumerate(pairs)]

    def centred_search_batch(self, vectors: np.ndarray, k: int, langs: Sequence[str],
                             means: Mapping[str, np.ndarray]) -> list[list[StoreHit]] | None:
        """Each row's exact best ``k`` over ``langs`` by centred cosine (see the base class),
        when the store scans every one of ``langs`` (none has more than :func:`scan_limit`
        documents; a graph of vectors as encoded): each language's scan scores the query by
        centred cosine (:meth:`_scan_scores`, as :meth:`candidates_per_language` ranks a scanned
        language), the scores of all of them are ranked at once, and only the ``k`` kept become
        hits, their records read. The same hits as each language's best ``2k`` rescored
        (``bias.best_centred``), without making and rescoring those candidates: a corrected
        search of XQuAD-R's six languages to depth 50 (a reranker's) took 3.5 ms that way, 1.9
        this one. None when a language of ``langs`` is walked, or the graph is centred: the
        correction then asks :meth:`candidates_per_language` query by query."""
        if self._centred:
            return None
        queries = np.asarray(vectors, dtype=np.float32)
        queries = queries.reshape(1, -1) if queries.ndim == 1 else queries
        with self._mutex:
            if not len(queries) or self._query_row(queries[0]) is None or k <= 0:
                return [[] for _ in queries]
            if queries.ndim != 2 or queries.shape[1] != self.dim:  # the first row's was checked
                raise ModelMismatchError(f"query vectors have shape {queries.shape}, the index at "
                                         f"{self.folder} has dimension {self.dim}")
            scanned = []
            for lang in dict.fromkeys(langs):
                labels, columns = self._filter_for((lang,))
                if not isinstance(columns, np.ndarray):
                    return None  # walked: candidates per language, rescored
                if len(labels):
                    scanned.append((lang, labels, columns, np.asarray(means[lang], dtype=np.float32)))
            if not scanned:
                return [[] for _ in queries]
            # every scanned document's label in the order their scores are joined, and where
            # each language's scores end in that order: the same for every query of the batch
            labels = np.concatenate([s[1] for s in scanned])
            ends = np.cumsum([len(s[1]) for s in scanned])
            starts = ends - [len(s[1]) for s in scanned]
            out = []
            for query in queries:
                # one query at a time, as a search of one query scores it: a batch's hits and
                # scores are the single searches', to the last bit
                every = np.concatenate([self._scan_scores((lang,), columns, query, mean)
                                        for lang, _, columns, mean in scanned])
                top = _top_k(every, k)
                part = np.searchsorted(ends, top, side="right")  # each kept score's language
                column = top - starts[part]
                pairs = list(zip(labels[top].tolist(), every[top].tolist()))
                kept = np.stack([scanned[p][2][:, c] for p, c in zip(part, column)])
                out.append(self._hits(pairs, kept))
            return out

    def centred_candidates(self, vector: np.ndarray, k: int, *, ef: int | None = None) -> list[Candidate] | None:
        """A centred graph's ``k`` nearest to ``vector`` (a query centred by its language's mean,
        as ``bias.centred_search`` makes it) in one walk over every language, with their vectors
        as encoded; their scores are the graph's (cosines with centred documents), for the caller
        to rescore. ``ef`` None: :data:`CENTRED_EF_FACTOR` times the index's ``ef_search``. None
        from a graph of the vectors as encoded."""
        if not self._centred:
            return None
        with self._mutex:
            row = self._query_row(vector)
            if row is None:
                return []
            pairs = self._knn(row, k, None, ef or CENTRED_EF_FACTOR * int(self._options["ef_search"]))
            labels = [lab for lab, _ in pairs]
            langs = self._langs_of(labels)
            vectors = self._vectors_of(labels, langs)
            return [Candidate(lab, lang, score, vectors[i]) for i, ((lab, score), lang) in enumerate(zip(pairs, langs))]

    def _langs_of(self, labels: Sequence[int]) -> list[str]:
        """The languages of records by label (``und`` for none, and for a label gone)."""
        found: dict[int, str] = {}
        for part, marks in _in_parts(labels):
            found.update(self._sql(f"SELECT label, COALESCE(lang, 'und') FROM records WHERE label IN ({marks})", part))
        return [found.get(int(lab), centring.UND) for lab in labels]

    def _vectors_of(self, labels: Sequence[int], langs: Sequence[str]) -> np.ndarray:
        """Vectors as encoded of graph labels (``langs``: theirs, read by a centred graph only)."""
        items = _items(self._index, list(labels))
        if not self._centred:
            return items
        return centring.uncentre(items, self._anchor_state().rows(langs))

    def _anchor_state(self) -> centring.Anchors:
        """A centred graph's anchors: the commit's this handle reads (a writer's, with the ones it
        set since). Under the mutex."""
        if self._anchors is None or (not self._writable and self._anchors_of is not self._meta):
            self._anchors = centring.Anchors.from_meta(self._meta.get("anchors"), self.dim)
            self._anchors_of = self._meta
        return self._anchors

    def hits(self, candidates: Sequence[Candidate]) -> list[StoreHit]:
        with self._mutex:
            return self._hits([(c.key, c.score) for c in candidates],
                              np.stack([c.vector for c in candidates]) if candidates else None)

    def _query_row(self, vector: np.ndarray) -> np.ndarray | None:
        """The query as a float32 ``(1, dim)`` row, once this reader follows the last commit;
        None when the index is empty. Under the mutex."""
        row = self._row(vector, "query vector")
        if self._db is None:  # a closed handle found nothing, silently (the Qdrant store refuses)
            raise VecplugError(f"the index at {self.folder} is closed")
        self._follow()
        return None if self._index is None else row

    def _nearest(self, vector: np.ndarray, k: int, langs: Sequence[str] | None,
                 ef: int | None) -> tuple[list[tuple[int, float]], np.ndarray | None]:
        """(label, score) of the ``k`` nearest, with their vectors when at hand (exact
        filtered search). Under the mutex."""
        row = self._query_row(vector)
        return self._nearest_to(row, k, langs, ef) if row is not None else ([], None)

    def _nearest_to(self, row: np.ndarray, k: int, langs: Sequence[str] | None, ef: int | None,
                    walk: np.ndarray | None = None,
                    mean: np.ndarray | None = None) -> tuple[list[tuple[int, float]], np.ndarray | None]:
        """:meth:`_nearest` for a row of :meth:`_query_row`; a filtered walk goes towards
        ``walk`` when given (its scores are then ``walk``'s: :meth:`_candidates` rescores); a
        scan of one language ranks by centred cosine with its ``mean`` when given (a mean is
        one language's: a filter of several ignores it)."""
        if k <= 0:
            return [], None
        if self._centred:
            return self._nearest_by_language(row, k, langs, ef, mean)
        if langs:
            key = tuple(sorted(set(langs)))
            labels, columns_or_set = self._filter_for(key)
            if not len(labels):
                return [], None
            if not isinstance(columns_or_set, np.ndarray):
                return self._filtered_knn(row if walk is None else walk, k, columns_or_set, ef), None
            scores = self._scan_scores(key, columns_or_set, row[0], mean if len(key) == 1 else None)
            top = _top_k(scores, k)
            return ([(int(labels[i]), float(scores[i])) for i in top],
                    np.ascontiguousarray(columns_or_set[:, top].T))
        return self._knn(row, k, None, ef), None

    def _nearest_by_language(self, row: np.ndarray, k: int, langs: Sequence[str] | None, ef: int | None,
                             mean: np.ndarray | None = None) -> tuple[list[tuple[int, float]], np.ndarray | None]:
        """A centred graph's plain-cosine search (of ``langs``, or of every language): its order
        is not the graph's, so language by language, an exact scan as a plain graph's filters make
        it, or a filtered walk for :data:`CENTRED_WALK_OVERFETCH` times ``k`` rescored exactly; the
        best ``k`` of them all, with their vectors (a search of one language scanned with its
        ``mean``: by centred cosine, as :meth:`_nearest_to`'s). Under the mutex."""
        if langs:
            every = sorted(set(langs))
        else:
            if self._all_langs is None:
                # every record's (from the index on lang; a language only of records past the
                # graph's labels finds no labels below, and is skipped)
                self._all_langs = list(dict.fromkeys(lang or centring.UND for (lang,) in self._sql(
                    "SELECT DISTINCT lang FROM records")))
            every = self._all_langs
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # labels, scores, vectors
        for lang in every:
            labels, columns_or_set = self._filter_for((lang,))
            if not len(labels):
                continue
            if isinstance(columns_or_set, np.ndarray):
                scores = self._scan_scores((lang,), columns_or_set, row[0], mean if len(every) == 1 else None)
                top = _top_k(scores, k)
                found.append((labels[top], scores[top], np.ascontiguousarray(columns_or_set[:, top].T)))
                continue
            walked = [lab for lab, _ in self._filtered_knn(row, CENTRED_WALK_OVERFETCH * k, columns_or_set, ef)]
            if walked:
                vectors = self._vectors_of(walked, [lang] * len(walked))
                order, scores = best_first(vectors, row[0])
                order = order[:k]
                found.append((np.asarray(walked, dtype=np.int64)[order], scores[order], vectors[order]))
        if not found:
            return [], None
        labels, scores, vectors = (np.concatenate(part) for part in zip(*found))
        top = _top_k(scores, k)
        return [(int(labels[i]), float(scores[i])) for i in top], vectors[top]

    def _filtered_knn(self, vector: np.ndarray, k: int, allowed: frozenset[int],
                      ef: int | None) -> list[tuple[int, float]]:
        """The ``k`` nearest of the labels ``allowed``, a filter too large for exact search:
        hnswlib's filtered walk, which calls the filter for every node it visits. The set's
        bound ``__contains__`` is the cheapest callable for that (no Python frame per call),
        and the set is built once per commit, not per query (a language of a million
        vectors is a set of 167k labels).

        Measured and not kept: walking unfiltered first for ``k / share x 4`` neighbours and
        keeping the filter's, falling back to this walk when too few pass. At 200,000 vectors
        it took 2.7 ms against 6.0, but found 93.4% of the exact top 10 against 99.6%
        (``benchmarks/results/ann_scale_filtered.md``): the tail of a long unfiltered answer is
        less exact than a filtered walk at the same ef, which visits about 1 / share times as
        many nodes. With real languages, which are directions in the space, it would also fall
        back more often.
        """
        return self._knn(vector, min(k, len(allowed)), allowed.__contains__, ef)

    def _knn(self, vector: np.ndarray, k: int, filt: Any, ef: int | None) -> list[tuple[int, float]]:
        # a reader sees exactly the last commit, whose count its metadata holds: COUNT(*) on
        # every query would cost more than the search itself at a million records (~8 ms)
        committed = None if self._writable else self._meta.get("count")
        live = int(committed) if committed is not None else self.count()
        k = min(k, live)
        if k <= 0:
            return []
        # set per call (under the mutex): ef is the index's state in hnswlib, not a query argument
        self._index.set_ef(max(int(ef or self._options["ef_search"]), k))

        def attempt(n: int) -> Any:
            try:
                return self._index.knn_query(vector, k=n, filter=filt)
            except RuntimeError:  # fewer than n reachable (hnswlib refuses a short answer)
                return None

        found = attempt(k)
        if found is None:
            # as many as the walk reaches: halve until one answers, then search between it
            # and the last that failed (halving alone returned about half of what it reaches)
            lo, hi = 0, k
            while found is None and hi > 1:
                lo = hi // 2
                found = attempt(lo)
                if found is None:
                    hi = lo
            if found is None:
                return []
            while hi - lo > 1:
                mid = (lo + hi) // 2
                more = attempt(mid)
                if more is None:
                    hi = mid
                else:
                    lo, found = mid, more
        labels, dist = found
        return [(int(lab), 1.0 - float(d)) for lab, d in zip(labels[0], dist[0])]

    def _forget_filters(self) -> None:
        """Drop what is kept per language until the next write (or commit followed)."""
        self._filter_cache.clear()
        self._column_scales.clear()
        self._all_langs = None

    def _scan_scores(self, key: tuple[str, ...], columns: np.ndarray, query: np.ndarray,
                     mean: np.ndarray | None) -> np.ndarray:
        """The scores of an exact scan of a filter's ``columns`` (``key``'s): ``query . x``, or
        with ``mean`` the centred cosine :func:`centred_column_scores` (the columns' scales kept
        per filter and mean until the next write). Under the mutex."""
        if mean is None:
            return column_dots(columns, query)
        scales, entry = self._column_scales, (key, mean.tobytes())
        cached = scales.get(entry)
        if cached is None:
            if len(scales) >= MAX_COLUMN_SCALES:  # other means than the index's own: a caller's
                scales.clear()
            cached = scales[entry] = centring.inverse_distances(columns.T, mean)
        return centred_column_scores(columns, query, mean, cached)

    def _filter_for(self, key: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | frozenset[int]]:
        """:meth:`_filter_candidates` of a language set, from the cache when it holds it. The
        cache keeps the most recently used sets within FILTER_CACHE_BYTES: each set is a copy
        of its languages' vectors, and a service's users ask for many sets. Under the mutex."""
        cache = self._filter_cache
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        cache[key] = found = self._filter_candidates(key)
        while len(cache) > 1 and sum(map(_filter_bytes, cache.values())) > FILTER_CACHE_BYTES:
            cache.popitem(last=False)
        return found

    def _filter_candidates(self, langs: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | frozenset[int]]:
        """Labels of the records in ``langs``, with their vectors (as the columns of a
        ``(dim, n)`` array, for :func:`column_dots`) when few enough for exact search
        (:func:`scan_limit`), else the labels as a set for the graph walk's filter.

        Cached per language set until the next write: a filtered query then costs one
        matrix-vector product (or set lookups) instead of a database scan and a copy out of
        the graph.
        """
        rows = self._labels_in(langs)
        labels = np.asarray([r[0] for r in rows], dtype=np.int64)
        if len(labels) > scan_limit(self._index.get_current_count()):
            return labels, frozenset(labels.tolist())
        return labels, np.ascontiguousarray(self._vectors_of(labels.tolist(), [r[1] for r in rows]).T)

    def _labels_in(self, langs: Sequence[str]) -> list[tuple[int, str]]:
        """(label, language) of the records in ``langs`` that the loaded vectors hold, by label."""
        cond, args = _lang_in(langs)
        # labels past the graph's: records of a commit this reader has not loaded (see _labels)
        return self._sql(f"SELECT label, COALESCE(lang, 'und') FROM records WHERE {cond} AND label < ? ORDER BY label",
                         [*args, self._next_label])

    def _hits(self, pairs: list[tuple[int, float]], vectors: np.ndarray | None = None) -> list[StoreHit]:
        if not pairs:
            return []
        by_label = self._records_by_label([p[0] for p in pairs])
        return [StoreHit(by_label[lab], score, None if vectors is None else vectors[i])
                for i, (lab, score) in enumerate(pairs) if lab in by_label]

    def _records_by_label(self, labels: Sequence[int]) -> dict[int, Record]:
        """The records of ``labels`` that exist."""
        found: dict[int, Record] = {}
        for part, marks in _in_parts(labels):
            found.update(self._records(f"label IN ({marks})", part))
        return found

    # -- writing -----------------------------------------------------------

    def _check_writable(self) -> None:
        if not self._writable or self._db is None:
            raise RuntimeError("store is not open for writing")
        if self._broken:
            raise StorageError(f"a commit to {self.folder} failed: reopen the index to go on "
                               "(the last commit is intact)")

    def _ensure_graph(self, extra: int) -> None:
        if self._index is None:
            self._index = self._new_graph(self.dim)
            self._index.init_index(max_elements=max(1024, extra), M=int(self._options["M"]),
                                   ef_construction=int(self._options["ef_construction"]))
            return
        need = self._index.get_current_count() + extra
        if need > self._index.get_max_elements():
            self._index.resize_index(max(need, 2 * self._index.get_max_elements()))

    def upsert(self, records: Sequence[Record], vectors: np.ndarray) -> None:
        self._check_writable()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (len(records), self.dim):
            raise ValueError(f"expected vectors of shape ({len(records)}, {self.dim}), got {vectors.shape}")
        refuse_unstorable(records)  # what Qdrant cannot keep, no store keeps: all hold the same
        if not len(records):
            return
        # every payload serialised before the first row is written: one that fails half-way
        # left rows staged without their vectors in the graph
        payloads = [json.dumps(rec.payload, ensure_ascii=False) for rec in records]
        with self._mutex:
            self._ensure_graph(len(records))
            if self._centred:
                vectors = self._centred_rows([rec.lang or centring.UND for rec in records], vectors)
            labels = []
            for rec, payload in zip(records, payloads):
                row = self._sql("SELECT label FROM records WHERE id = ?", (rec.id,))
                if not row:
                    label = self._next_label
                    self._next_label += 1
                else:
                    label = row[0][0]
                labels.append(label)
                values = (label, rec.id, rec.text, rec.source, rec.position, rec.lang, payload)
                self._sql(f"INSERT OR REPLACE INTO records({_COLUMNS}, crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (*values, _row_crc(*values)))
            labels_arr = np.asarray(labels, dtype=np.int64)
            # a re-added label may have been deleted earlier in this session
            for label in labels_arr:
                try:
                    self._index.unmark_deleted(int(label))
                except RuntimeError:
                    pass
            self._index.add_items(vectors, labels_arr)
            self._dirty = True
            self._forget_filters()

    def _centred_rows(self, langs: Sequence[str], vectors: np.ndarray) -> np.ndarray:
        """A centred graph's rows for documents about to be written: the anchors counted in, those
        due re-set (:meth:`centring.Anchors.add`) with their languages' documents moved in the
        graph, then the vectors (made unit: the way back needs it) centred. Under the mutex."""
        vectors = centring.unit_rows(vectors)
        anchors = self._anchor_state()
        due = anchors.add(langs, vectors)
        before = {lang: anchors.anchors.get(lang) for lang in due}
        for lang in due:
            anchors.reset(lang)
            if before[lang] is None:
                continue
            cond, args = _lang_in([lang])
            labels = [r[0] for r in self._sql(f"SELECT label FROM records WHERE {cond} AND label < ? ORDER BY label",
                                              [*args, self._next_label])]
            for start in range(0, len(labels), 65536):
                part = labels[start:start + 65536]
                raw = centring.uncentre(_items(self._index, part), np.broadcast_to(before[lang], (len(part), self.dim)))
                # an existing label: hnswlib moves the node and mends its links
                self._index.add_items(centring.centre(raw, anchors.anchors[lang]), np.asarray(part, dtype=np.int64))
        return centring.centre(vectors, anchors.rows(langs))

    def delete(self, ids: Sequence[str]) -> None:
        self._check_writable()
        with self._mutex:
            for rid in ids:
                row = self._sql("SELECT label FROM records WHERE id = ?", (rid,))
                if not row:
                    continue
                self._sql("DELETE FROM records WHERE label = ?", (row[0][0],))
                self._forget_filters()
                if self._index is not None:
                    try:
                        self._index.mark_deleted(int(row[0][0]))
                    except RuntimeError:
                        pass
                self._dirty = True

    def commit(self, manifest: dict[str, Any] | None = None) -> None:
        self._check_writable()
        with self._mutex:
            meta = dict(self._meta)
            if manifest is not None:
                meta["manifest"] = {**meta["manifest"], **manifest}
            written: Path | None = None
            committing = False  # set once the new meta is staged, COMMIT next
            try:
                if self._dirty and self._index is not None:
                    self._compact_if_worn()
                if self._dirty or meta["hnsw_file"] is None and self._index is not None:
                    gen = int(meta["generation"]) + 1
                    name = f"vectors-{gen}{self.graph_suffix}"
                    tmp = self.folder / f".{name}.tmp"
                    try:
                        self._index.save_index(str(tmp))
                        problem = self._check_graph(tmp, self.dim)
                        if problem:  # hnswlib does not report failed writes (full disk)
                            raise StorageError(f"writing the graph failed ({problem}): is the disk "
                                               "full? The last commit is intact")
                        with open(tmp, "rb+") as fh:
                            os.fsync(fh.fileno())
                        os.replace(tmp, self.folder / name)
                        written = self.folder / name
                        fsync_path(self.folder)
                    except RuntimeError as exc:  # hnswlib's own I/O errors
                        raise StorageError(f"cannot write {tmp}: {exc}; the last commit is intact") from exc
                    finally:
                        tmp.unlink(missing_ok=True)
                    # the file as it stays (a rename keeps its time and inode): a reader that
                    # follows this commit trusts a graph file that still matches (_graph_as_committed)
                    st = written.stat()
                    meta.update(generation=gen, hnsw_file=name, hnsw_size=st.st_size,
                                hnsw_stat=[st.st_size, st.st_mtime_ns, st.st_ino],
                                hnsw_sha256=file_sha256(written), capacity=self._index.get_max_elements())
                if self._centred:
                    meta["anchors"] = self._anchor_state().to_meta()
                meta["next_label"] = self._next_label
                meta["count"] = self.count()
                meta["checksum"] = json_checksum(meta)
                for key, value in meta.items():
                    self._sql("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))
                committing = True
                self._sql("COMMIT")  # <- the commit point
            except BaseException as exc:
                if committing and self._committed(meta):
                    # past the commit point (an interrupt raised on the way back from COMMIT):
                    # the new graph file is the index's now, and this handle goes on from it
                    self._after_commit(meta)
                    raise
                self._abandon(written)
                if isinstance(exc, OSError):
                    raise storage_error(exc, f"cannot commit to the index at {self.folder}") from exc
                raise
            self._after_commit(meta)

    def _committed(self, meta: dict[str, Any]) -> bool:
        """Whether SQLite holds ``meta`` as committed (after an exception around COMMIT: it may
        have taken, or been rolled back by SQLite itself on an I/O error)."""
        try:
            if self._db is None or self._db.in_transaction:
                return False
            row = self._db.execute("SELECT value FROM meta WHERE key = 'checksum'").fetchone()
            return row is not None and json.loads(row[0]) == meta["checksum"]
        except (sqlite3.Error, ValueError):
            return False

    def _after_commit(self, meta: dict[str, Any]) -> None:
        """This handle on the commit of ``meta``: the next transaction opened first (writes
        outside one would land a row at a time), then the last commit's graph file removed (a
        file that will not go is left for the next writer: the commit is done)."""
        old = self._meta.get("hnsw_file")
        self._meta = meta
        self._dirty = False
        self._sql("BEGIN")
        if old and old != meta["hnsw_file"]:
            try:
                (self.folder / old).unlink(missing_ok=True)
            except OSError:
                pass
        self._write_stamp()
        try:
            atomic_write_json(self.folder / MANIFEST_NAME, meta["manifest"])
        except OSError as exc:  # the copy for people: the commit itself is done
            raise storage_error(exc, f"committed, but cannot write {self.folder / MANIFEST_NAME}") from exc

    def _compact_if_worn(self) -> None:
        """Rebuild the graph from its live vectors once deleted ones are a quarter of it.

        hnswlib only marks a deleted vector: it stays in the graph, its memory and its file,
        and every commit writes it again. A corpus whose records are replaced run after run (a
        dated export renamed each day) grew without bound. Labels are kept, so the records
        need no change; the rebuild costs far less than encoding the documents that wore it."""
        total = self._index.get_current_count()
        deleted = total - self.count()
        if deleted < COMPACT_MIN or deleted < COMPACT_SHARE * total:
            return
        labels = [int(row[0]) for row in self._sql("SELECT label FROM records")]
        fresh = self._new_graph(self.dim)
        fresh.init_index(max_elements=max(1024, 2 * len(labels)), M=int(self._index.M),
                         ef_construction=int(self._index.ef_construction))
        for start in range(0, len(labels), 65536):  # the vectors a part at a time: a large index
            part = labels[start:start + 65536]
            fresh.add_items(_items(self._index, part), np.asarray(part, dtype=np.int64))
        self._index = fresh  # the old one is the last commit's on disk, should this commit fail

    def _abandon(self, written: Path | None) -> None:
        """After a failed commit: drop what was staged (SQLite may have rolled back already) and
        refuse further writes, which would otherwise land outside any transaction. The graph
        file it wrote is nobody's (the next writer would remove it too).

        The graph in memory holds the staged changes too (deleted labels marked, new ones
        added): the last commit's is loaded again, so that reads through this handle answer
        from the records SQLite kept. If that fails, reads refuse (:meth:`_follow`)."""
        self._broken = True
        try:
            if self._db is not None and self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if written is not None and written.name != self._meta.get("hnsw_file"):
            written.unlink(missing_ok=True)
        self._forget_filters()
        self._dirty = False
        self._next_label = int(self._meta["next_label"])
        self._anchors = None  # those set since the last commit went with its changes
        try:
            self._index = self._load_graph(self.folder, self._meta) if self._meta["hnsw_file"] else None
        except Exception as exc:  # noqa: BLE001 - the commit's own error is the one to raise
            self._index = None
            self._graph_lost = str(exc) or type(exc).__name__
