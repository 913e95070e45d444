"""Qdrant store: a Qdrant server/cluster by URL, or Qdrant's engine embedded in a folder.

``location`` starting with ``http://``/``https://`` (or ``options["client"]``, a ready
``QdrantClient``) selects server mode: one collection (``options["collection"]``, default
``"vecplug"``) whose metadata holds the manifest under ``"vecplug"``. Any other ``location``
is a folder with vecplug's ``manifest.json`` and a Qdrant Edge shard in ``shard/``.

Why ``qdrant-edge-py`` (Rust, Qdrant's own segments + WAL) and not ``qdrant-client``'s local
mode (``QdrantClient(path=...)``), measured with 0.9 vs 1.20, 10k x 384 vectors, 2 CPUs:

* safety: local mode keeps each point as a pickle in SQLite and ``pickle.loads`` every row on
  open, so a crafted folder runs code; edge keeps JSON config and binary segments, no pickle;
* atomicity: local mode commits one SQLite transaction per point (a crash leaves half a batch);
  edge logs each update batch to a WAL, locks it (a second opener fails with ``WouldBlock``
  instead of corrupting) and makes segments durable at ``flush()``;
* speed: upsert 10k: 0.45 s (with flush) vs 7.4 s; top-10 search: 0.6 ms vs 6.1 ms; with a
  ``lang`` filter: 0.5 ms vs 89 ms; reopen: 0.05 s vs 0.55 s (local mode unpickles all into
  RAM). Edge's ``optimize()`` (HNSW build) takes 2.5 s at 10k and ~0 when nothing changed;
  before it, search is brute force (0.8 ms). Disk use is alike (~40 MB).

Server mode: writes go straight to the collection (``wait=True``), so this store sees them at
once and :meth:`QdrantStore.commit` only replaces the manifest. A server cannot apply a batch
atomically across points: a client that dies mid-run leaves the writes it made (part of a
batch, writes after the last commit) in the collection, under the previous manifest.

Embedded mode keeps the base contract (an index opens as exactly some committed state) with a
redo log. Upserts and deletes are staged in memory (at most one commit's worth: the indexing
pipeline commits every 4096 documents) and the shard is not touched until commit. Every read
(``get``, ``vectors``, ``ids``, ``count``, ``languages``, ``search``) sees the committed shard
overlaid with the staged writes; ``search`` scores staged vectors exactly and merges them with
the shard's (over-fetched, shadowed points dropped) hits. :meth:`QdrantStore.commit`:

1. writes every staged op and the new manifest to ``pending.redo`` (temporary name, fsync,
   rename, fsync the folder): that rename is the commit point;
2. applies the ops to the shard (upserts with stable ids and deletes are idempotent), then
   flush (and ``optimize()`` + flush, unless ``options["optimize"]`` is false);
3. writes ``manifest.json`` atomically, with the record of the shard files (below);
4. removes ``pending.redo``; 5. stamps the files (below).

Opening (read or write: a shard takes one process at a time anyway) first finishes a
``pending.redo`` left by a crash: steps 2-4. A redo file only exists complete (it is renamed
into place after an fsync); it also ends with a SHA-256 of its contents, and one that does not
match raises :class:`~vecplug.errors.CorruptIndexError` instead of being applied. Its format
(no pickle): the line ``VECPLUG-REDO/1``, a little-endian u64 header length, a JSON header (``meta``,
``delete``: point ids, ``upsert``: point ids, ``payloads``), the upserted vectors as raw
little-endian float32 rows, the SHA-256 digest. ``close()`` without a commit drops staged
writes; a crash before the rename leaves the shard exactly as the last commit left it.

Damage is detected before the engine reads a byte, never trusted: on damaged segments the
engine panics, errors out or silently answers wrong (200 damaged copies opened with the check
below switched off: 7 wrong answers, e.g. points missing after a truncated version file, and 7
stray errors). What is checked, when:

* ``manifest.json`` carries ``checksum``, a SHA-256 of the rest of it (checked on every read of
  it, ``exists`` included), and ``files``: every file under ``shard/`` with its size and
  :func:`_digest` (SHA-256 over 64 KiB blocks, all-zero blocks as a marker: the engine
  preallocates files of 32 MiB that are mostly holes), and the (mtime_ns, inode) it had when
  hashed, so that a commit re-hashes only the files that changed. The WAL is recorded too:
  only the engine's updates write it.
* ``settled`` says whether that record was taken after a reload of the shard. The engine's
  first load after writes tidies its files (folds payload-tracker journals in and deletes
  them, rewrites a point version after deletes, and its config after create); a load of a
  settled shard changes no file's content (measured). A commit records the files as flushed
  (``settled: false``); ``close`` then closes, loads and closes the shard once and records it
  settled. If the writer died before that, the next open checks the files against the flushed
  record (nothing has loaded them since) and settles them. Either settle first writes an empty
  ``pending.redo``: a crash while the engine tidies replays an empty commit, which records the
  files afresh, instead of finding files that differ from the record.
* ``.verified.json`` (a cache) holds the (size, mtime_ns, inode) of every shard file as last
  seen matching the record, and a digest of that record. It is written at each commit and at
  ``close`` by whoever had the shard open (reader or writer: every opener holds the lock), after
  re-hashing the files whose stats moved since they were checked: the engine's load and close
  touch its tracker, flag and status files and rewrite ``segment.json`` and
  ``edge_config.json`` (new inode, same content). A file that no longer matches is left out.
* On open, before ``EdgeShard.load``: the manifest's checksum, then, unless the stamp matches
  the files exactly, every shard file against the record in full: a missing, extra, resized
  or changed file, or a symlink, raises :class:`~vecplug.errors.CorruptIndexError` naming it
  (the engine's own ``.atomicwrite*`` temporaries, which a kill can leave, are ignored: it
  never reads them). With a ``pending.redo`` the shard may be half-way through its ops and is
  not checked: the redo's checksum protects the ops, and applying them records fresh digests.
* An engine panic (pyo3's ``PanicException``, a BaseException) while loading, reading or
  applying becomes a CorruptIndexError, as does any engine error while loading.
* :meth:`QdrantStore.verify` checks the manifest and every file whatever the stamp says, then
  reads every point (its id derives from its ``_id``, its vector is finite) and the count.

Not covered: ``writer.lock`` (empty, only locked) and the stamp (damage costs a full check).
A change that keeps a file's size, mtime and inode (bit rot, a tool restoring times) passes a
stamped open; ``verify`` finds it. A shard found with a ``pending.redo`` (a crash mid-commit or
mid-settle) is not checked against the previous record. Indexes written before checksums open
unchecked until their next commit records them. Costs at 10k x 384 (2 CPUs): a commit +0.04 s
(digests of the changed files 0.03 s, the stamp; 0.04 -> 0.08 s for 50 documents), a writer's
``close`` +0.1 s (the settle), a stamped open +2 ms (0.05-0.07 s in all), an open with a full
check +0.06 s, a reader's ``close`` +6 ms, ``verify()`` 0.04 s for the files, 0.4 s with rows.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from vecplug.adapters.stores.base import Record, StoreHit, VectorStore
from vecplug.errors import (CorruptIndexError, IndexLockedError, IndexNotFoundError,
                             MissingDependencyError, VecplugError)
from vecplug.adapters.stores.qdrant_files import (
    FORMAT, REDO, SHARD, Files, Stats, _check_files, _digest, _engine, _engine_call,
    _files_digest, _read_redo, _record_files, _redo_bytes, _sealed, _shard_stats,
    _unsealed, _valid_files)
from vecplug.fsutil import (WriterLock, atomic_write_bytes, atomic_write_json, fsync_path,
                            json_checksum, storage_error)

ID_NAMESPACE = uuid.UUID("6f1c7d2e-4b0a-5e8f-9a3c-2d7b1e0f4a65")  # fixed: ids map stably
META_KEY = "vecplug"
MANIFEST = "manifest.json"
LOCK = "writer.lock"  # held (flock) while the shard is open: Qdrant Edge allows one opener
STAMP = ".verified.json"  # the shard files as last seen matching their checksums (a cache)
UND = "und"
_BATCH = 256
_T = TypeVar("_T")
Hits = list[tuple[dict[str, Any], float]]


def _point_id(doc_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, doc_id))


def _to_payload(rec: Record) -> dict[str, Any]:
    return {"_id": rec.id, "text": rec.text, "source": rec.source, "position": rec.position,
            "lang": rec.lang or UND, "payload": rec.payload}


def _to_record(p: dict[str, Any]) -> Record:
    lang = p.get("lang")
    return Record(p["_id"], p.get("text", ""), p.get("source", ""), int(p.get("position", 0)),
                  None if lang in (None, UND) else lang, dict(p.get("payload") or {}))


def _dense(vector: Any) -> list[float]:
    """A point's vector as a list: the default unnamed vector, however the client wraps it."""
    if isinstance(vector, dict):
        vector = vector.get("") if "" in vector else next(iter(vector.values()))
    return list(getattr(vector, "data", vector))


def _is_server(location: str, options: dict[str, Any]) -> bool:
    return options.get("client") is not None or location.startswith(("http://", "https://"))


def _scroll(page: Callable[[Any], tuple[list[Any], Any]]) -> Iterator[str]:
    """Every ``_id`` over the pages ``page(offset) -> (points, next offset or None)``."""
    offset = None
    while True:
        points, offset = page(offset)
        yield from ((p.payload or {})["_id"] for p in points)
        if offset is None:
            return


def _retry(fn: Callable[..., _T], *args: Any, tries: int = 3, **kwargs: Any) -> _T:
    """Call ``fn``; retry connection errors, timeouts, 429 and 5xx with backoff."""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse
    for attempt in range(tries):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified just below
            code = getattr(exc, "code", None)  # grpc.RpcError has .code()
            if not (isinstance(exc, ResponseHandlingException)
                    or getattr(exc, "status_code", 0) in (429, 500, 502, 503, 504)
                    and isinstance(exc, UnexpectedResponse)
                    or callable(code) and getattr(code(), "name", "") in (
                        "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")):
                raise
            if attempt == tries - 1:
                raise VecplugError(f"qdrant unreachable after {tries} tries: {exc}") from exc
            time.sleep(0.5 * 2 ** attempt)
    raise AssertionError("unreachable")


class _Server:
    """One collection on a Qdrant server (or in any ``QdrantClient``, e.g. ``:memory:``).

    Writes are not staged: each is acknowledged (``wait=True``) as it is made, so a commit is
    only the manifest, and a crash mid-run leaves uncommitted writes (see the module docstring).
    """

    def __init__(self, location: str, options: dict[str, Any]) -> None:
        try:
            from qdrant_client import QdrantClient, models
        except ImportError:
            raise MissingDependencyError("qdrant-client", extra="qdrant",
                                         purpose="the qdrant store") from None
        self.m, self.name = models, str(options.get("collection", "vecplug"))
        self.where = f"collection '{self.name}' at {location}"
        self.owned = options.get("client") is None  # never close a caller's client
        self.client = options.get("client") or QdrantClient(
            url=location, api_key=options.get("api_key"), timeout=options.get("timeout"),
            prefer_grpc=bool(options.get("prefer_grpc", False)))

    def meta(self) -> dict[str, Any] | None:
        """Our metadata entry; None when the collection or the entry is absent."""
        if not _retry(self.client.collection_exists, self.name):
            return None
        meta = (_retry(self.client.get_collection, self.name).config.metadata or {}).get(META_KEY)
        return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None

    def create(self, dim: int, meta: dict[str, Any]) -> None:
        if _retry(self.client.collection_exists, self.name):
            if self.meta() is None:  # someone else's collection: never drop it
                raise VecplugError(f"{self.where} exists and is not a vecplug index")
            _retry(self.client.delete_collection, self.name)
        _retry(self.client.create_collection, self.name, metadata={META_KEY: meta},
               vectors_config=self.m.VectorParams(size=dim, distance=self.m.Distance.COSINE))
        with warnings.catch_warnings():  # local mode warns that payload indexes are no-ops
            warnings.simplefilter("ignore")
            _retry(self.client.create_payload_index, self.name, "lang",
                   self.m.PayloadSchemaType.KEYWORD, wait=True)

    def save_meta(self, meta: dict[str, Any]) -> None:
        # update_collection merges metadata by top-level key: only ours is replaced
        _retry(self.client.update_collection, self.name, metadata={META_KEY: meta})

    def upsert(self, ids: list[str], vecs: np.ndarray, payloads: list[dict[str, Any]]) -> None:
        points = [self.m.PointStruct(id=i, vector=v.tolist(), payload=p)
                  for i, v, p in zip(ids, vecs, payloads)]
        _retry(self.client.upsert, self.name, points, wait=True)  # idempotent: safe to retry

    def delete(self, ids: list[str]) -> None:
        _retry(self.client.delete, self.name, self.m.PointIdsList(points=ids), wait=True)

    def search(self, vec: np.ndarray, k: int, langs: list[str] | None) -> Hits:
        m = self.m
        flt = langs and m.Filter(must=[m.FieldCondition(key="lang", match=m.MatchAny(any=langs))])
        res = _retry(self.client.query_points, self.name, query=vec.tolist(), limit=k,
                     query_filter=flt or None, with_payload=True)
        return [(p.payload or {}, float(p.score)) for p in res.points]

    def retrieve(self, ids: list[str]) -> list[dict[str, Any]]:
        return [p.payload or {} for p in _retry(self.client.retrieve, self.name, ids)]

    def retrieve_vectors(self, ids: list[str]) -> dict[str, list[float]]:
        points = _retry(self.client.retrieve, self.name, ids, with_payload=["_id"], with_vectors=True)
        return {(p.payload or {})["_id"]: p.vector for p in points}

    def scroll_ids(self) -> Iterator[str]:
        return _scroll(lambda off: _retry(self.client.scroll, self.name, limit=1000, offset=off,
                                          with_payload=["_id"], with_vectors=False))

    def count(self) -> int:
        return int(_retry(self.client.count, self.name, exact=True).count)

    def facet(self) -> dict[str, int]:
        hits = _retry(self.client.facet, self.name, "lang", limit=100_000, exact=True).hits
        return {str(h.value): int(h.count) for h in hits}

    def commit(self, meta: dict[str, Any]) -> None:
        self.save_meta(meta)  # every write was already acknowledged with wait=True

    def verify(self, rows: bool, dim: int) -> list[str]:
        """What a client can check: the collection is there, is ours, and has our dimension
        (the server keeps its files; ids and counts are checked by ``vecplug verify`` itself)."""
        if self.meta() is None:
            return [f"{self.where} is missing or holds no vecplug manifest"]
        params = _retry(self.client.get_collection, self.name).config.params.vectors
        size = getattr(params, "size", None)
        if size is not None and int(size) != dim:
            return [f"{self.where} holds vectors of dimension {size}, its manifest says {dim}"]
        return []

    def close(self) -> None:
        if self.owned:
            self.client.close()


class _Edge:
    """A Qdrant Edge shard embedded in ``<folder>/shard``, with writes staged until commit.

    ``staged`` maps a point id to its new ``(payload, unit vector)``, or to None for a delete:
    the last write per point wins, so the ops of one commit are independent of order.
    ``files`` is the record of the shard files that the last commit left (None for an index
    made before checksums), ``settled`` whether it was taken after a reload of the shard (see
    :meth:`_settle`); ``checked`` the stats at which each file was last seen to match it;
    ``sound`` says that the shard is as recorded, so that ``close`` may settle and stamp it.
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
        self.shard: Any = None
        self.lock: WriterLock | None = None
        self.staged: dict[str, tuple[dict[str, Any], np.ndarray] | None] = {}
        self._under: dict[str, str] | None = None  # staged point -> its committed lang, if any
        self.files: Files | None = None
        self.settled = False
        self.checked: Stats = {}
        self.sound = False

    @staticmethod
    def read_meta(folder: str) -> dict[str, Any] | None:
        """Our ``manifest.json``, its checksum verified; None when absent or someone else's.

        A manifest with our checksum or file record is ours whatever else it says, so damage
        to its ``format`` is a CorruptIndexError, not "no index here"."""
        try:
            with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            return None
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

    def load(self, recover: bool = True) -> None:
        """Take the lock, check the shard files against the last commit's record (unless the
        stamp vouches for them), open the shard, then finish a commit a crash interrupted.
        ``recover=False``: only open the shard (to prove that nobody else has it)."""
        if not os.path.isdir(self.path):
            raise CorruptIndexError(f"{self.where} has no {SHARD}/ directory")
        # Our own lock first: a second EdgeShard.load of an open shard fails on the engine's
        # WAL lock only after touching its files (seen: a flush of the first opener then
        # failed on a short payload-index journal), so a second opener must not get that far.
        lock = WriterLock(Path(self.folder))
        try:
            lock.acquire()
        except IndexLockedError:
            raise IndexLockedError(f"the index in {self.folder} is open elsewhere (embedded Qdrant "
                                   "serves one process at a time)") from None
        self.lock = lock
        try:
            redo = None
            if recover:
                for name in os.listdir(self.folder):  # redo files torn before their rename
                    if name.startswith(f".{REDO}.") and name.endswith(".tmp"):
                        os.remove(os.path.join(self.folder, name))
                if os.path.exists(self.redo):  # verified before the engine reads anything
                    redo = _read_redo(self.redo, self.where)
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
                self.shard = self._engine_load()
            if redo is not None:
                self._apply(*redo)
        except BaseException:
            self.close()
            raise

    def _engine_load(self) -> Any:
        try:
            with _engine(self.where):
                return self.q.EdgeShard.load(self.path)
        except CorruptIndexError:
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
            self.checked, self.sound = stats, True
            return
        problems, self.checked = _check_files(self.path, self.files, stats, odd, first=True)
        if problems:
            raise CorruptIndexError(f"the index in {self.folder} is damaged: {problems[0]}; "
                                    "rebuild it or restore a copy")
        self.sound = True

    def _stamp_matches(self, stats: Stats) -> bool:
        assert self.files is not None
        try:
            with open(self.stamp, encoding="utf-8") as f:
                stamp = json.load(f)
        except (OSError, ValueError):
            return False
        return (isinstance(stamp, dict) and stamp.get("files") == _files_digest(self.files)
                and stamp.get("stats") == stats and set(stats) == set(self.files))

    def _write_stamp(self) -> None:
        """Remember the shard files as seen matching their record, so that the next open need
        not read them in full. A file whose stats changed since it was last checked (the
        engine touches some on load and close, and rewrites two JSON files with their content
        unchanged) is hashed again first; one that no longer matches is left out, so the next
        open checks in full and reports it."""
        if not (self.sound and self.files is not None):
            return
        try:
            stats, _ = _shard_stats(self.path)
            good = {rel: st for rel, st in stats.items() if rel in self.files and (
                self.checked.get(rel) == st or st[0] == self.files[rel]["size"]
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

    def create(self, dim: int, meta: dict[str, Any]) -> None:
        q, manifest = self.q, os.path.join(self.folder, MANIFEST)
        if os.path.isdir(self.folder):
            leftovers = all(n in (SHARD, REDO, LOCK) or n.startswith(("." + MANIFEST, "." + REDO, STAMP))
                            for n in os.listdir(self.folder))
            if not (leftovers or self.meta() is not None):  # never delete what is not ours
                raise VecplugError(f"{self.folder} is not empty and not a vecplug qdrant index")
            try:  # taking the WAL lock proves that nobody has the old index open
                self.load(recover=False)
                self.close()
            except CorruptIndexError:
                pass  # no shard, or a broken leftover: nothing to protect
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
            self.shard = q.EdgeShard.create(self.path, q.EdgeConfig(
                vectors=q.EdgeVectorParams(size=dim, distance=q.Distance.Cosine)))
            with _engine(self.where):
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
        of finding files that differ from the record."""
        atomic_write_bytes(Path(self.redo), _redo_bytes(
            meta, [], [], [], np.zeros((0, int(meta["dim"])), dtype=np.float32)))
        self._drop_stamp()
        with _engine(self.where):
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
        files = _record_files(self.path, self.files)
        self.save_meta(_sealed(meta, files, settled))
        self.files, self.settled, self.sound = files, settled, True
        self.checked = {rel: [f["size"], f["mtime_ns"], f["inode"]] for rel, f in files.items()}
        self._write_stamp()

    # -- staging -----------------------------------------------------------------------------

    def upsert(self, ids: list[str], vecs: np.ndarray, payloads: list[dict[str, Any]]) -> None:
        vecs = np.array(vecs, dtype=np.float32)  # a copy, normalised as Qdrant stores it
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = np.divide(vecs, norms, out=vecs, where=norms > 0)
        for i, v, p in zip(ids, vecs, payloads):
            # JSON round trip: stored by value, as the shard would, and a payload that cannot
            # be written fails now rather than at commit
            self.staged[i] = (json.loads(json.dumps(p, ensure_ascii=False)), v)
        self._under = None

    def delete(self, ids: list[str]) -> None:
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
    def search(self, vec: np.ndarray, k: int, langs: list[str] | None) -> Hits:
        q = self.q
        shadowed = len(self.under()) if self.staged else 0  # hits that staged writes replace
        flt = langs and q.Filter(must=[q.FieldCondition("lang", match=q.MatchAny(langs))])
        res = self.shard.query(q.QueryRequest(query=q.Query.Nearest(vec.tolist()),
                                              limit=k + shadowed, filter=flt or None,
                                              with_payload=True))
        hits = [(p.payload or {}, float(p.score)) for p in res if str(p.id) not in self.staged]
        if self.staged:
            unit = vec / max(float(np.linalg.norm(vec)), 1e-30)
            hits += [(p, float(v @ unit)) for p, v in
                     (s for s in self.staged.values() if s is not None)
                     if langs is None or p.get("lang", UND) in langs]
            hits.sort(key=lambda h: -h[1])
            hits = [(copy.deepcopy(p), score) for p, score in hits[:k]]
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
        staged = dict(self.staged)  # what is staged now; later writes do not change this scan
        offset = None
        while True:
            with _engine(self.where):
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

    # -- committing --------------------------------------------------------------------------

    def commit(self, meta: dict[str, Any]) -> None:
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
        atomic_write_bytes(Path(self.redo), _redo_bytes(  # <- the commit point (its rename)
            meta, deletes, [i for i, _ in ups], [s[0] for _, s in ups], vecs))
        # staged writes stay readable until the shard has them; if this fails, the commit
        # still happened (its redo file is in place): the next commit or open finishes it
        try:
            self._apply(meta, deletes, [i for i, _ in ups], [s[0] for _, s in ups], vecs)
        finally:
            self._under = None  # the shard may hold some of the staged points now
        self.staged = {}

    def _apply(self, meta: dict[str, Any], deletes: list[str], upserts: list[str],
               payloads: list[dict[str, Any]], vecs: np.ndarray) -> None:
        """Steps 2-5 of a commit (module docstring); idempotent, so a crash may repeat them."""
        q = self.q
        self._drop_stamp()  # from here on the shard may differ from its record
        with _engine(self.where):
            for a in range(0, len(deletes), _BATCH):  # unknown ids are no-ops in Qdrant
                self.shard.update(q.UpdateOperation.delete_points(deletes[a:a + _BATCH]))
            for a in range(0, len(upserts), _BATCH):
                self.shard.update(q.UpdateOperation.upsert_points(
                    [q.Point(i, v.tolist(), p) for i, v, p in
                     zip(upserts[a:a + _BATCH], vecs[a:a + _BATCH], payloads[a:a + _BATCH])]))
            self.shard.flush()
            # (re)builds HNSW for grown segments; ~free when nothing changed, and then it says
            # so (False) and the second flush (~20 ms) is saved
            if self.optimize and self.shard.optimize():
                self.shard.flush()
        # data first: the manifest never describes writes not yet durable. The record is of
        # the files as flushed; ``close`` settles it (a reload per commit cost ~0.03-0.08 s)
        self._record(_unsealed(meta), settled=False)
        os.remove(self.redo)
        fsync_path(Path(self.folder))

    def verify(self, rows: bool, dim: int) -> list[str]:
        """Everything wrong with the committed files, read in full whatever the stamp says:
        the manifest's checksum, every shard file against its record, and with ``rows`` every
        point as the engine reads it (its id derives from its ``_id``, its vector is finite)."""
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
            self.checked.update(matching)
        if rows and not problems:
            problems += self._check_points(dim)
        return problems

    def _check_points(self, dim: int) -> list[str]:
        problems: list[str] = []
        offset, n = None, 0
        try:
            with _engine(self.where):
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

    def close(self) -> None:
        """Drop staged writes, settle the record if this session committed (see
        :meth:`_settle`), close the shard, stamp its files and release the lock."""
        self.staged, self._under = {}, None  # never committed: dropped
        try:
            meta = self.meta() if self._settle_due() else None
            if meta is not None:
                self._settle(_unsealed(meta))
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


class QdrantStore(VectorStore):
    """Qdrant as a server collection or an embedded folder (see the module docstring)."""

    name: ClassVar[str] = "qdrant"

    def __init__(self, backend: _Server | _Edge, meta: dict[str, Any], writable: bool) -> None:
        self._b: _Server | _Edge | None = backend
        self._meta = meta  # {"format": FORMAT, "dim": int, "manifest": dict}
        self._dim = int(meta["dim"])
        self._writable = writable

    @staticmethod
    def _backend(location: str, options: dict[str, Any]) -> _Server | _Edge:
        return (_Server if _is_server(location, options) else _Edge)(location, options)

    @classmethod
    def exists(cls, location: str, options: dict[str, Any]) -> bool:
        if not _is_server(location, options):
            return _Edge.read_meta(location) is not None  # needs no engine import
        b = _Server(location, options)
        try:
            return b.meta() is not None
        finally:
            b.close()

    @classmethod
    def create(cls, location: str, dim: int, manifest: dict[str, Any],
               options: dict[str, Any]) -> "QdrantStore":
        b = cls._backend(location, options)
        store = {"name": cls.name, "space": "cosine",
                 "mode": "server" if isinstance(b, _Server) else "embedded (qdrant-edge)"}
        if isinstance(b, _Server):
            store["collection"] = b.name
        manifest = {**copy.deepcopy(manifest), "dim": int(dim), "store": store}
        meta = {"format": FORMAT, "dim": int(dim), "manifest": manifest}
        b.create(int(dim), meta)
        return cls(b, meta, writable=True)

    @classmethod
    def open(cls, location: str, options: dict[str, Any], writable: bool = False) -> "QdrantStore":
        b = cls._backend(location, options)
        meta = cls._checked(b, b.meta())  # before any engine file is read: crafted folders stay shut
        if isinstance(b, _Edge):
            b.load()  # finishes a commit a crash interrupted, which may write the manifest
            meta = cls._checked(b, b.meta())
        return cls(b, meta, writable)

    @staticmethod
    def _checked(b: _Server | _Edge, meta: dict[str, Any] | None) -> dict[str, Any]:
        if meta is None or not isinstance(meta.get("dim"), int) or not isinstance(
                meta.get("manifest"), dict):
            b.close()
            if meta is None:
                raise IndexNotFoundError(f"no vecplug qdrant index in {b.where}")
            raise CorruptIndexError(f"malformed vecplug manifest in {b.where}")
        return meta

    @property
    def manifest(self) -> dict[str, Any]:
        return copy.deepcopy(self._meta["manifest"])

    @property
    def dim(self) -> int:
        return self._dim

    def _live(self, write: bool = False) -> _Server | _Edge:
        if self._b is None:
            raise VecplugError("the qdrant store is closed")
        if write and not self._writable:
            raise VecplugError("the qdrant store was opened read-only")
        return self._b

    def upsert(self, records: Sequence[Record], vectors: np.ndarray) -> None:
        b = self._live(write=True)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.shape != (len(records), self._dim):
            raise ValueError(f"expected vectors of shape ({len(records)}, {self._dim}), "
                             f"got {vecs.shape}")
        for a in range(0, len(records), _BATCH):
            chunk = records[a:a + _BATCH]
            b.upsert([_point_id(r.id) for r in chunk], vecs[a:a + _BATCH],
                     [_to_payload(r) for r in chunk])

    def delete(self, ids: Sequence[str]) -> None:
        b = self._live(write=True)
        for a in range(0, len(ids), _BATCH):  # unknown ids are no-ops in Qdrant
            b.delete([_point_id(i) for i in ids[a:a + _BATCH]])

    def search(self, vector: np.ndarray, k: int,
               langs: Sequence[str] | None = None) -> list[StoreHit]:
        b = self._live()
        if k <= 0 or (langs is not None and len(langs) == 0):
            return []  # an empty language list matches nothing
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self._dim:
            raise ValueError(f"expected a vector of dimension {self._dim}, got {vec.shape[0]}")
        wanted = None if langs is None else sorted({lang or UND for lang in langs})
        return [StoreHit(_to_record(p), s) for p, s in b.search(vec, k, wanted)]

    def get(self, ids: Sequence[str]) -> list[Record]:
        b, found = self._live(), {}
        uniq = list(dict.fromkeys(ids))
        for a in range(0, len(uniq), 1000):
            found.update((p["_id"], _to_record(p))
                         for p in b.retrieve([_point_id(i) for i in uniq[a:a + 1000]]))
        return [found[i] for i in ids if i in found]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        b, found = self._live(), {}
        uniq = list(dict.fromkeys(ids))
        for a in range(0, len(uniq), 1000):
            found.update(b.retrieve_vectors([_point_id(i) for i in uniq[a:a + 1000]]))
        missing = [i for i in ids if i not in found]
        if missing:
            raise KeyError(missing[0])
        return np.asarray([_dense(found[i]) for i in ids], dtype=np.float32).reshape(len(ids), self._dim)

    def ids(self) -> Iterator[str]:
        return self._live().scroll_ids()

    def count(self) -> int:
        return self._live().count()

    def languages(self) -> dict[str, int]:
        return {lang: n for lang, n in self._live().facet().items() if n > 0}

    def verify(self, rows: bool = True) -> list[str]:
        """Everything wrong with the committed index, checked in full whatever the stamp says
        (empty: all is well). Embedded: the manifest's checksum, every shard file against its
        SHA-256, and with ``rows`` every point as the engine reads it. Server: what a client
        can see (the collection, its manifest and dimension)."""
        return self._live().verify(rows, self._dim)

    def commit(self, manifest: dict[str, Any] | None = None) -> None:
        b = self._live(write=True)
        merged = {**self._meta["manifest"], **copy.deepcopy(manifest or {})}
        meta = {**self._meta, "manifest": merged}
        try:
            b.commit(meta)  # edge: redo log, shard, then the manifest; server: the manifest
        except OSError as exc:  # before the redo file's rename nothing changed; after it, the
            # next open finishes the commit: either way no committed state is lost
            raise storage_error(exc, f"cannot commit to {b.where}") from exc
        self._meta = meta

    def close(self) -> None:
        if self._b is not None:
            self._b, b = None, self._b
            b.close()
