"""The embedded default store: hnswlib for vectors, SQLite for records, in one folder.

Folder layout::

    manifest.json        human-readable copy of the committed manifest
    records.sqlite       ids, text, payload; table ``meta`` holds the commit record
    vectors-<gen>.hnsw   the hnswlib graph of generation <gen>
    writer.lock          held (flock) by the one writer

The commit point is the SQLite transaction: a commit first writes the new graph to a
new ``vectors-<gen>.hnsw`` file (temporary name, fsync, rename), then commits the
records together with the meta row naming that file, its size and checksum. A crash
before the SQLite commit leaves the previous generation intact (the orphan graph file is
removed by the next writer); hnswlib's own ``save_index`` overwrites in place, so it never
writes to a committed file. hnswlib files record neither dimension nor space: both are in
the manifest, and the file size is checked on open.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.adapters.stores.base import Record, StoreHit, VectorStore
from vecplug.fsutil import WriterLock, atomic_write_json, fsync_path
from vecplug.errors import (
    CorruptIndexError,
    IndexNotFoundError,
    MissingDependencyError,
    ModelMismatchError,
    VecplugError,
)

DB_NAME = "records.sqlite"
MANIFEST_NAME = "manifest.json"
DEFAULTS = {"M": 16, "ef_construction": 200, "ef_search": 64}
# Below this many candidates a language filter is answered by exact search: cheaper than
# a filtered graph walk and never short of results.
EXACT_FILTER_LIMIT = 20000
_SCHEMA = """
CREATE TABLE IF NOT EXISTS records(
    label INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, text TEXT NOT NULL,
    source TEXT NOT NULL, position INTEGER NOT NULL, lang TEXT, payload TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_lang ON records(lang);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _hnswlib() -> Any:
    try:
        import hnswlib
    except ImportError as exc:
        raise MissingDependencyError("hnswlib", purpose="the hnswlib store") from exc
    return hnswlib


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


class HnswStore(VectorStore):
    """hnswlib + SQLite in a folder; see the module docstring for the commit protocol."""

    name = "hnswlib"

    def __init__(self, folder: Path, db: sqlite3.Connection, commit_meta: dict[str, Any],
                 index: Any, writable: bool, lock: WriterLock | None, options: dict[str, Any]) -> None:
        self.folder = folder
        self._db = db
        self._meta = commit_meta
        self._index = index
        self._writable = writable
        self._lock = lock
        self._options = {**DEFAULTS, **commit_meta["manifest"].get("store", {}), **options}
        self._next_label = int(commit_meta["next_label"])
        self._mutex = threading.RLock()  # hnswlib is not thread-safe between add and query
        self._dirty = False
        self._filter_cache: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray | None]] = {}

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def exists(cls, location: str, options: dict[str, Any]) -> bool:
        return (Path(location) / DB_NAME).is_file()

    @classmethod
    def create(cls, location: str, dim: int, manifest: dict[str, Any],
               options: dict[str, Any]) -> "HnswStore":
        folder = Path(location)
        if cls.exists(location, options):
            raise VecplugError(f"an index already exists at {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        lock = WriterLock(folder)
        lock.acquire()
        try:
            opts = {**DEFAULTS, **options}
            manifest = {**manifest, "dim": dim,
                        "store": {"name": cls.name, "space": "cosine", **opts}}
            tmp_db = folder / f".{DB_NAME}.{os.getpid()}.tmp"
            tmp_db.unlink(missing_ok=True)
            db = sqlite3.connect(tmp_db, isolation_level=None)
            db.executescript(_SCHEMA)
            db.close()
            os.replace(tmp_db, folder / DB_NAME)  # the index exists only once complete
            fsync_path(folder)
            store = cls._open(folder, writable=True, lock=lock, options=options)
            store.commit(manifest)
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
        uri = (folder / DB_NAME).resolve().as_uri() + ("" if writable else "?mode=ro")
        try:
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise CorruptIndexError(f"{folder / DB_NAME} is not a readable vecplug database: {exc}") from exc
        meta: dict[str, Any] = {"manifest": {}, "generation": 0, "next_label": 0, "hnsw_file": None}
        try:
            meta.update({key: json.loads(value) for key, value in rows.items()})
        except ValueError as exc:
            raise CorruptIndexError(f"{folder / DB_NAME}: damaged commit record: {exc}") from exc
        index = None
        if meta["hnsw_file"]:
            index = cls._load_graph(folder, meta)
        store = cls(folder, db, meta, index, writable, lock, options)
        if writable:
            store._remove_orphans()
            db.execute("BEGIN")
        return store

    @staticmethod
    def _load_graph(folder: Path, meta: dict[str, Any]) -> Any:
        path = folder / meta["hnsw_file"]
        expected = meta.get("hnsw_size")
        if not path.is_file():
            raise CorruptIndexError(f"{path} is missing: the index is damaged")
        if expected is not None and path.stat().st_size != expected:
            raise CorruptIndexError(f"{path} has {path.stat().st_size} bytes, the commit "
                                    f"recorded {expected}: the index is damaged")
        manifest = meta["manifest"]
        index = _hnswlib().Index(space="ip", dim=int(manifest["dim"]))
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
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._db.close()
                self._db = None
            self._index = None
            if self._lock:
                self._lock.release()
                self._lock = None

    # -- reading -----------------------------------------------------------

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._meta["manifest"]))

    @property
    def dim(self) -> int:
        return int(self._meta["manifest"]["dim"])

    def _records(self, where: str, args: Sequence[Any]) -> list[tuple[int, Record]]:
        rows = self._db.execute(
            f"SELECT label, id, text, source, position, lang, payload FROM records WHERE {where}", args)
        return [(r[0], Record(r[1], r[2], r[3], r[4], r[5], json.loads(r[6]))) for r in rows]

    def get(self, ids: Sequence[str]) -> list[Record]:
        found: dict[str, Record] = {}
        for i in range(0, len(ids), 500):
            part = list(ids[i:i + 500])
            marks = ",".join("?" * len(part))
            found.update((r.id, r) for _, r in self._records(f"id IN ({marks})", part))
        return [found[i] for i in ids if i in found]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        labels = []
        for rid in ids:
            row = self._db.execute("SELECT label FROM records WHERE id = ?", (rid,)).fetchone()
            if row is None:
                raise KeyError(rid)
            labels.append(row[0])
        if not labels:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._mutex:
            return np.asarray(self._index.get_items(labels, return_type="numpy"), dtype=np.float32)

    def ids(self) -> Iterator[str]:
        for (rid,) in self._db.execute("SELECT id FROM records ORDER BY label"):
            yield rid

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0])

    def languages(self) -> dict[str, int]:
        rows = self._db.execute("SELECT COALESCE(lang, 'und'), COUNT(*) FROM records GROUP BY 1 ORDER BY 2 DESC")
        return {lang: n for lang, n in rows}

    def search(self, vector: np.ndarray, k: int,
               langs: Sequence[str] | None = None) -> list[StoreHit]:
        vector = np.asarray(vector, dtype=np.float32).reshape(1, -1)
        if vector.shape[1] != self.dim:
            raise ModelMismatchError(f"query vector has dimension {vector.shape[1]}, "
                                     f"the index at {self.folder} has {self.dim}")
        with self._mutex:
            if self._index is None or k <= 0:
                return []
            if langs:
                key = tuple(sorted(set(langs)))
                if key not in self._filter_cache:
                    self._filter_cache[key] = self._filter_candidates(key)
                labels, vecs = self._filter_cache[key]
                if not len(labels):
                    return []
                if vecs is not None:
                    scores = vecs @ vector[0]
                    top = np.argsort(-scores)[:k]
                    return self._hits([(int(labels[i]), float(scores[i])) for i in top])
                allowed = set(labels.tolist())
                pairs = self._knn(vector, min(k, len(labels)), lambda label: label in allowed)
            else:
                pairs = self._knn(vector, k, None)
            return self._hits(pairs)

    def _knn(self, vector: np.ndarray, k: int, filt: Any) -> list[tuple[int, float]]:
        live = self.count()
        k = min(k, live)
        if k <= 0:
            return []
        self._index.set_ef(max(int(self._options["ef_search"]), k))
        while True:
            try:
                labels, dist = self._index.knn_query(vector, k=k, filter=filt)
                return [(int(lab), 1.0 - float(d)) for lab, d in zip(labels[0], dist[0])]
            except RuntimeError:  # fewer reachable results than k: ask for fewer
                if k == 1:
                    return []
                k = max(1, k // 2)

    def _filter_candidates(self, langs: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
        """Labels of the records in ``langs``, with their vectors when few enough for exact search.

        Cached per language set until the next write: a filtered query then costs one
        matrix-vector product instead of a database scan and a copy out of the graph.
        """
        marks = ",".join("?" * len(langs))
        labels = np.asarray([r[0] for r in self._db.execute(
            f"SELECT label FROM records WHERE COALESCE(lang, 'und') IN ({marks})", list(langs))],
            dtype=np.int64)
        if not len(labels) or len(labels) > EXACT_FILTER_LIMIT:
            return labels, None
        vecs = np.asarray(self._index.get_items(labels, return_type="numpy"), dtype=np.float32)
        return labels, vecs

    def _hits(self, pairs: list[tuple[int, float]]) -> list[StoreHit]:
        if not pairs:
            return []
        marks = ",".join("?" * len(pairs))
        by_label = dict(self._records(f"label IN ({marks})", [p[0] for p in pairs]))
        return [StoreHit(by_label[lab], score) for lab, score in pairs if lab in by_label]

    # -- writing -----------------------------------------------------------

    def _check_writable(self) -> None:
        if not self._writable or self._db is None:
            raise RuntimeError("store is not open for writing")

    def _ensure_graph(self, extra: int) -> None:
        if self._index is None:
            self._index = _hnswlib().Index(space="ip", dim=self.dim)
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
        if not len(records):
            return
        with self._mutex:
            self._ensure_graph(len(records))
            labels = []
            for rec in records:
                row = self._db.execute("SELECT label FROM records WHERE id = ?", (rec.id,)).fetchone()
                if row is None:
                    label = self._next_label
                    self._next_label += 1
                else:
                    label = row[0]
                labels.append(label)
                self._db.execute(
                    "INSERT OR REPLACE INTO records(label, id, text, source, position, lang, payload) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (label, rec.id, rec.text, rec.source, rec.position, rec.lang,
                     json.dumps(rec.payload, ensure_ascii=False)))
            labels_arr = np.asarray(labels, dtype=np.int64)
            # a re-added label may have been deleted earlier in this session
            for label in labels_arr:
                try:
                    self._index.unmark_deleted(int(label))
                except RuntimeError:
                    pass
            self._index.add_items(vectors, labels_arr)
            self._dirty = True
            self._filter_cache.clear()

    def delete(self, ids: Sequence[str]) -> None:
        self._check_writable()
        with self._mutex:
            for rid in ids:
                row = self._db.execute("SELECT label FROM records WHERE id = ?", (rid,)).fetchone()
                if row is None:
                    continue
                self._db.execute("DELETE FROM records WHERE label = ?", (row[0],))
                self._filter_cache.clear()
                if self._index is not None:
                    try:
                        self._index.mark_deleted(int(row[0]))
                    except RuntimeError:
                        pass
                self._dirty = True

    def commit(self, manifest: dict[str, Any] | None = None) -> None:
        self._check_writable()
        with self._mutex:
            meta = dict(self._meta)
            if manifest is not None:
                meta["manifest"] = {**meta["manifest"], **manifest}
            if self._dirty or meta["hnsw_file"] is None and self._index is not None:
                gen = int(meta["generation"]) + 1
                name = f"vectors-{gen}.hnsw"
                tmp = self.folder / f".{name}.tmp"
                self._index.save_index(str(tmp))
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, self.folder / name)
                fsync_path(self.folder)
                meta.update(generation=gen, hnsw_file=name,
                            hnsw_size=(self.folder / name).stat().st_size,
                            hnsw_sha256=_sha256(self.folder / name),
                            capacity=self._index.get_max_elements())
            meta["next_label"] = self._next_label
            for key, value in meta.items():
                self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                                 (key, json.dumps(value)))
            self._db.execute("COMMIT")  # <- the commit point
            old = self._meta.get("hnsw_file")
            self._meta = meta
            self._dirty = False
            atomic_write_json(self.folder / MANIFEST_NAME, meta["manifest"])
            if old and old != meta["hnsw_file"]:
                (self.folder / old).unlink(missing_ok=True)
            self._db.execute("BEGIN")

