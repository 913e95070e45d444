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
batch, writes after the last commit) in the collection, under the previous manifest. So
before its first write after each commit a writer marks the manifest entry ``uncommitted``
(saved as a commit of the same manifest), and its next commit clears the mark: an open that
finds it knows that the points may differ from what the manifest's language statistics
describe even where their count agrees (documents overwritten), and ``Index.language_stats``
fits the statistics to the points again (a reader only when no writer holds the lease). A
reader sees points as they are written, and reads the manifest again (a round trip carrying
the language statistics) at most every :data:`SERVER_FOLLOW` seconds. One writer at a time: a
writer takes a lease on the collection when it opens it (or makes it), renews it as it writes
and gives it back at close (:mod:`.qdrant_lease`: a point in ``<collection>-vecplug-writer``,
changed by conditional upserts; a second writer gets IndexLockedError naming the first; a
killed writer's lease lapses in ``options["lease_seconds"]``, 60, or at once on its own
machine). Behind it, each commit saves the manifest with a new random ``commit`` id, after
checking that the id there is still the one this writer last read or saved; if another
writer committed meanwhile (it took the lease of one idle past it), the commit raises
IndexLockedError rather than overwrite that writer's manifest. ``create`` makes the collection marked as
being made (no manifest: it does not exist yet for vecplug), then the ``lang`` payload index,
then writes the manifest; an open that finds the index missing makes it.

Embedded mode keeps the base contract (an index opens as exactly some committed state) with a
redo log. Upserts and deletes are staged in memory (at most one commit's worth: the indexing
pipeline commits every 4096 documents, less often as commits slow down, and at most every
100,000: ``pipeline.MAX_UNCOMMITTED``) and the shard is not touched until commit. Every read
(``get``, ``vectors``, ``ids``, ``count``, ``languages``, ``search``) sees the committed shard
overlaid with the staged writes; ``search`` scores staged vectors exactly and merges them with
the shard's (over-fetched, shadowed points dropped) hits. :meth:`QdrantStore.commit`:

1. writes every staged op and the new manifest to ``pending.redo`` (temporary name, fsync,
   rename, fsync the folder): that rename is the commit point;
2. applies the ops to the shard (upserts with stable ids and deletes are idempotent), then
   flush (and ``optimize()`` + flush, unless ``options["optimize"]`` is false);
3. writes ``manifest.json`` atomically, with the record of the shard files (below);
4. removes ``pending.redo``; 5. stamps the files (below).

Opening in place (for writing, or for reading while nobody else has the shard: the engine
lets one process at a time open it) first finishes a ``pending.redo`` left by a crash: steps
2-4. A redo file only exists complete (it is renamed
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
  only the engine's updates write it. Unchanged stats stand for unchanged content only where
  writes through a memory map move a file's mtime (ext4 does; tmpfs never does: there a record
  that trusted stats kept stale digests of ten files, so every file is hashed each time; one
  probe per device and process, 20 ms), and only for files not modified just before they were
  hashed (within a clock tick, 20 ms; 2 s where times are whole seconds): ``racy`` files are
  hashed again next time. A writer idle between commits changes no shard file, not even its
  stats (60 s of searches watched).
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

One writer, many readers. A second writer of a folder fails at once
(:class:`~vecplug.errors.IndexLockedError`; of a server collection: its lease, see above).
A reader (``writable=False``) that cannot open the shard in place (another process has it, the
folder is read-only, or the disk is too full for the engine, which writes as it opens) reads a
private copy of the last commit instead:

* the files of the manifest's record are copied, holes kept, into ``vecplug-copies/`` in
  ``options["snapshot_dir"]``, by default into ``$TMPDIR/vecplug-qdrant-<uid>`` (either a
  folder of the user's own, made by vecplug), each hashed as it is
  read and compared with its digest; a copy that a commit spoiled (or a ``pending.redo``
  without the locks below) is taken again, with backoff, for up to ``options["snapshot_wait"]``
  seconds (30), then IndexLockedError. The reader's own engine loads the copy, so every answer
  is exactly some commit's, whatever the writer does meanwhile;
* each read first looks at the manifest's stats; when they changed, a background thread copies
  the new commit while reads go on from the old copy, and the next read after it is loaded
  serves it, with its manifest (on a writer committing back to back, readers moved every 2-3
  commits). A copy that cannot be made (no room) keeps the old one, with a warning;
* ``copy.lock`` and ``turn.lock`` only help copies succeed: a reader holds ``copy.lock``
  shared while it copies, and the writer holds it exclusive while it changes shard files
  (waiting up to 5 s for copies under way); a reader waiting for its copy holds ``turn.lock``
  shared, which the writer takes before each change, so that waiting readers get their copy
  between two commits however fast it commits (flock has no queue). Correctness rests on the
  digests alone: a writer that stops waiting spoils a copy, and the copy is taken again;
* a copy lives in ``vecplug-copy-<pid>-<random>/`` beside its ``.lock`` file, which its reader
  holds (flock) until it removes both at ``close``; a reader killed before that leaves them,
  and the next copy taken under the same folder removes them (their lock is free), so they
  never pile up. Cleaning touches only entries named so, never anything else in the folder.

With ``options["snapshot"]`` true, every reader reads a copy, even when the shard is free (it
first finishes a commit or a settle in place): a long-lived reader then never keeps a writer
out. A copy costs what the index takes on disk (39 MB at 10k x 384; on tmpfs, where reading a hole
through a map allocates it, the engine's mapped files take their full size: ~40 MiB more per
segment), 0.15-0.3 s to open and ~0.4 s to follow a commit at 10k (2 busy CPUs; a search on
the copy takes 1 ms, as in place): right for laptop-size indexes and a
few readers; many readers of a big index belong on a Qdrant server. Without the option, a
reader that gets the shard in place holds it like a writer: a writer that comes later gets
IndexLockedError.

Language filters (both modes): one matching at most ``EXACT_FILTER_LIMIT`` vectors is an exact
search (the collection's full_scan_threshold); a larger one walks the graph with ACORN, which
also steps through neighbours' neighbours outside the filter (Qdrant builds no per-value links
for a value held by more than ~4/m of the points, and its plain filtered walk then misses much
of the top k). ``options["acorn"] = False`` keeps Qdrant's plain filtered walk: faster, finds
less (README, "Speed"). The language-bias correction asks for every language of the index at
once (:meth:`QdrantStore.candidates_per_language`: one request to a server, one engine call per
language embedded, each candidate with the vector it read), and a language searched by a walk
(more than ``EXACT_FILTER_LIMIT`` documents, counted once per commit) heads for its walk hint
(``adapters/bias.py``, ``WALK_SHIFT``), its candidates scored against the query here.

Free space. The engine writes through memory maps: a write the disk cannot take is a SIGBUS,
not an error (measured on a full tmpfs: commits, and opens that finished a commit, died of it),
and its own writes that fail say ``No space left on device`` in a plain Exception. So:

* a commit is refused with a :class:`~vecplug.errors.StorageError` (path, free, needed) before
  its redo log is written unless 3x the log + 48 MiB are free (measured: the WAL and segments
  grow by about the log's size each, and a new segment writes its 32 MiB vector chunk, a 4 MiB
  page and flag files in full: peaks stayed 41 MiB above 3x the log); the engine refuses an
  ``optimize()`` itself unless twice the segments it rewrites are free, before it changes
  anything: the commit then stands unoptimised, with a warning;
* finishing a ``pending.redo`` at open needs the same, a settle (whose reload tidies files in
  place) 8 MiB, and on tmpfs every load also the holes it will fill: below that, a
  StorageError (a reader then reads a copy, unless a commit is to be finished); a writer's
  ``close`` skips a settle that does not fit (the next open does it);
* the engine's no-space errors become StorageErrors; a commit that fails after its commit point
  leaves its redo log, the store refuses further writes, and the next open with room finishes
  it. Left: a disk filled by someone else between the check and the engine's writes can still
  end in a SIGBUS; the redo log makes that a crash like any other (nothing committed is lost).

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
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from vecplug.adapters.stores.base import (EXACT_FILTER_LIMIT, Candidate, Record, StoreHit, VectorStore,
                                          best_first, ordered_vectors, refuse_unstorable)
from vecplug.adapters.stores.qdrant_edge import (UND, _BATCH, Hits, VectorHits, _array, _Edge,
                                                 _point_id, full_scan_threshold, search_params)
from vecplug.adapters.stores.qdrant_files import FORMAT, REDO
from vecplug.adapters.stores.qdrant_lease import LEASE_SECONDS, WriterLease, lease_held
from vecplug.errors import (CorruptIndexError, IndexLockedError, IndexNotFoundError,
                             MissingDependencyError, VecplugError)
from vecplug.fsutil import atomic_write_bytes, storage_error

__all__ = ["QdrantStore", "REDO"]
META_KEY = "vecplug"
#: key of a server collection's manifest entry set from before a writer's first write after a
#: commit until its next commit (:meth:`QdrantStore.uncommitted_writes`)
UNCOMMITTED = "uncommitted"
#: seconds between two reads of a server collection's manifest by a reader (it follows a
#: writer's commits, the language statistics of the bias correction with them)
SERVER_FOLLOW = 1.0
_T = TypeVar("_T")


def _to_payload(rec: Record) -> dict[str, Any]:
    return {"_id": rec.id, "text": rec.text, "source": rec.source, "position": rec.position,
            "lang": rec.lang or UND, "payload": rec.payload}


def _wanted(langs: Sequence[str | None] | None) -> list[str] | None:
    """A language filter as the backends take it: sorted, no repeats, ``und`` for none."""
    return None if langs is None else sorted({lang or UND for lang in langs})


def _candidate(payload: dict[str, Any], score: float, vector: np.ndarray | None) -> Candidate:
    hit = StoreHit(_to_record(payload), score, vector)
    return Candidate(hit, hit.record.lang, score, vector)


def _to_record(p: dict[str, Any], point: Any = None, where: str = "") -> Record:
    lang = p.get("lang")
    return Record(_vecplug_id(p, point, where), p.get("text", ""), p.get("source", ""),
                  int(p.get("position", 0)), None if lang in (None, UND) else lang, dict(p.get("payload") or {}))


def _vecplug_id(payload: dict[str, Any], point: Any = None, where: str = "") -> str:
    """The document id vecplug wrote with a point; a point written by something else (no
    ``_id``) is refused by name: its collection is a vecplug index, whose counts and
    statistics take in vecplug's points only."""
    if "_id" not in payload:
        raise CorruptIndexError(
            f"{where or 'the collection'} holds a point vecplug did not write (id {point}, no '_id' in its "
            "payload): a vecplug collection takes vecplug's writes only; delete that point, or keep your "
            "own points in another collection")
    return payload["_id"]


def _is_server(location: str, options: dict[str, Any]) -> bool:
    return options.get("client") is not None or location.lower().startswith(("http://", "https://"))


def _scroll(page: Callable[[Any], tuple[list[Any], Any]], where: str = "") -> Iterator[str]:
    """Every ``_id`` over the pages ``page(offset) -> (points, next offset or None)``."""
    offset = None
    while True:
        points, offset = page(offset)
        yield from (_vecplug_id(p.payload or {}, p.id, where) for p in points)
        if offset is None:
            return


def _retry(fn: Callable[..., _T], *args: Any, tries: int = 3, where: str = "", **kwargs: Any) -> _T:
    """Call ``fn``; retry connection errors, timeouts, 429 and 5xx with backoff. ``where``
    (the server's URL) is named when it stays unreachable."""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse
    for attempt in range(tries):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified just below
            code = getattr(exc, "code", None)  # grpc.RpcError has .code()
            at = f" at {where}" if where else ""  # the error alone says only "Connection refused"
            if not (isinstance(exc, ResponseHandlingException)
                    or getattr(exc, "status_code", 0) in (429, 500, 502, 503, 504)
                    and isinstance(exc, UnexpectedResponse)
                    or callable(code) and getattr(code(), "name", "") in (
                        "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")):
                refused = _refusal(exc, code, at, UnexpectedResponse)
                if refused is not None:
                    raise refused from exc
                if isinstance(exc, (ValueError, AssertionError)) and where.lower().startswith(("http://", "https://")):
                    # a server's answer the client could not read (a web page answering 200,
                    # JSON of another API): the client's own traceback named neither
                    raise VecplugError(f"qdrant{at} gave an answer that is not Qdrant's ({type(exc).__name__}: "
                                       f"{str(exc)[:200]}): is this the URL of a Qdrant server's REST API "
                                       "(port 6333)?") from exc
                raise
            if attempt == tries - 1:
                raise VecplugError(f"qdrant unreachable{at} after {tries} tries: {exc}") from exc
            time.sleep(0.5 * 2 ** attempt)
    raise AssertionError("unreachable")


def _refusal(exc: Exception, code: Any, at: str, unexpected: type) -> VecplugError | None:
    """A server's answer that no retry changes, as an error that says what to do: a wrong or
    missing API key (401/403), or a URL that is not a Qdrant server's REST API (404 and the
    like); None for anything else (a bug of ours stays the traceback it is)."""
    grpc = getattr(code(), "name", "") if callable(code) else ""
    status = getattr(exc, "status_code", None) if isinstance(exc, unexpected) else None
    if status in (401, 403) or grpc in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return VecplugError(f"qdrant{at} refused the request ({status or grpc}): check its API key "
                            "(index.api_key, or VECPLUG_INDEX_API_KEY)")
    if status is not None:
        reason = (getattr(exc, "reason_phrase", "") or "").strip()
        body = getattr(exc, "content", b"") or b""
        text = body.decode("utf-8", "replace").strip()[:200] if isinstance(body, bytes) else str(body)[:200]
        hint = ": is this the URL of a Qdrant server's REST API (port 6333)?" if status == 404 else ""
        return VecplugError(f"qdrant{at} answered {status} {reason}{hint}" + (f" ({text})" if text else ""))
    return None


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
        self.location = location
        self.where = f"collection '{self.name}' at {location}"
        self.owned = options.get("client") is None  # never close a caller's client
        self.info: Any = None  # the collection's info as :meth:`meta` last read it
        self.acorn = bool(options.get("acorn", True))  # for large filters: see search_params
        # an unreachable server: the client's version check (a thread of its own, so no
        # catch_warnings here can catch it) warns that it cannot get the version, next to our
        # error naming the URL: noise. Only that message is silenced; a version mismatch shows.
        warnings.filterwarnings("ignore", message="Failed to obtain server version", category=UserWarning)
        self.client = options.get("client") or QdrantClient(
            url=location, api_key=options.get("api_key"), timeout=options.get("timeout"),
            prefer_grpc=bool(options.get("prefer_grpc", False)))
        if options.get("client") is not None:  # errors name the caller's server, not "client://"
            given = getattr(self.client, "init_options", None) or {}
            named = given.get("url") or given.get("host") or given.get("path") or given.get("location")
            if named:
                self.location = str(named)
                self.where = f"collection '{self.name}' at {self.location}"
        # a caller's client in local mode (":memory:" or a path) searches exactly and warns
        # that it ignores search params: decided once here, so searches send none
        opts = getattr(self.client, "init_options", None) or {}
        self.local = opts.get("location") == ":memory:" or bool(opts.get("path"))

    def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` with :func:`_retry`, naming this server if it is unreachable."""
        return _retry(fn, *args, where=self.location, **kwargs)

    def take_lease(self, options: dict[str, Any]) -> WriterLease:
        """This writer's lease on the collection, taken (:mod:`.qdrant_lease`); IndexLockedError
        when another writer holds it."""
        lease = WriterLease(self.client, self.m, self.name, self.where, self._call,
                            float(options.get("lease_seconds", LEASE_SECONDS)))
        lease.take()
        return lease

    def _entry(self) -> tuple[Any, Any]:
        """The collection's info and our metadata entry in it as it is, or (None, None) when
        there is no collection."""
        if not self._call(self.client.collection_exists, self.name):
            return None, None
        info = self._call(self.client.get_collection, self.name)
        return info, (info.config.metadata or {}).get(META_KEY)

    def meta(self) -> dict[str, Any] | None:
        """Our manifest entry; None when the collection or the entry is absent, or the
        collection is still being made (:meth:`create`). Keeps the collection's info for
        :meth:`ensure_index`."""
        self.info, meta = self._entry()
        return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None

    def create(self, dim: int, meta: dict[str, Any]) -> dict[str, Any]:
        """Make the collection anew and return ``meta`` as saved (with its commit id). In an
        order that a crash or a retry at any step cannot turn into an index without its
        ``lang`` payload index: the collection first, marked with a token of this call but no
        manifest (:meth:`meta` says none, so ``exists`` is False and a later ``create`` makes it
        again), then the payload index, then the manifest. A retried ``create_collection`` that
        the server had applied (its answer lost) fails with "already exists": the collection
        with our token is the one just made."""
        mark = {"creating": uuid.uuid4().hex}
        info, entry = self._entry()
        if info is not None:
            ours = isinstance(entry, dict) and (entry.get("format") == FORMAT
                                                or set(entry) == {"creating"})  # half made
            if not ours:  # someone else's collection: never drop it
                raise VecplugError(f"{self.where} exists and is not a vecplug index")
            self._call(self.client.delete_collection, self.name)
        try:
            # a filter matching few vectors is searched exactly, as in the embedded store; a
            # server keeps its other HNSW defaults
            self._call(self.client.create_collection, self.name, metadata={META_KEY: mark},
                       vectors_config=self.m.VectorParams(size=dim, distance=self.m.Distance.COSINE),
                       hnsw_config=self.m.HnswConfigDiff(full_scan_threshold=full_scan_threshold(dim)))
        except Exception:
            if self._entry()[1] != mark:
                raise
        self.ensure_index()
        saved = {**meta, "commit": uuid.uuid4().hex}
        self.save_meta(saved)  # the last step: from here on the index exists
        return saved

    def ensure_index(self, info: Any = None) -> None:
        """Create the payload index on ``lang`` (which language filters and facets need) unless
        the collection ``info`` shows it: collections made before :meth:`create` wrote the
        manifest last could be left without one. Idempotent on the server; local mode keeps no
        payload indexes and shows none, so there it is asked for at each open (a no-op)."""
        if info is not None and "lang" in (getattr(info, "payload_schema", None) or {}):
            return
        with warnings.catch_warnings():  # local mode warns that payload indexes are no-ops
            warnings.simplefilter("ignore")
            self._call(self.client.create_payload_index, self.name, "lang",
                       self.m.PayloadSchemaType.KEYWORD, wait=True)

    def save_meta(self, meta: dict[str, Any]) -> None:
        # update_collection merges metadata by top-level key: only ours is replaced
        self._call(self.client.update_collection, self.name, metadata={META_KEY: meta})

    def upsert(self, ids: list[str], vecs: np.ndarray, payloads: list[dict[str, Any]]) -> None:
        points = [self.m.PointStruct(id=i, vector=v.tolist(), payload=p)
                  for i, v, p in zip(ids, vecs, payloads)]
        self._call(self.client.upsert, self.name, points, wait=True)  # idempotent: safe to retry

    def delete(self, ids: list[str]) -> None:
        self._call(self.client.delete, self.name, self.m.PointIdsList(points=ids), wait=True)

    def _filter_params(self, langs: list[str] | None, ef: int | None) -> tuple[Any, Any]:
        """A search's language filter (None: all) and search params (None for a local client,
        which searches exactly and warns about params)."""
        m = self.m
        flt = m.Filter(must=[m.FieldCondition(key="lang", match=m.MatchAny(any=langs))]) if langs else None
        return flt, None if self.local else search_params(m, ef, flt is not None, self.acorn)

    def search(self, vec: np.ndarray, k: int, langs: list[str] | None, ef: int | None = None) -> Hits:
        flt, params = self._filter_params(langs, ef)
        res = self._call(self.client.query_points, self.name, query=vec.tolist(), limit=k,
                         query_filter=flt, with_payload=True, search_params=params)
        for p in res.points:
            _vecplug_id(p.payload or {}, p.id, self.where)  # before a caller takes it for ours
        return [(p.payload or {}, float(p.score)) for p in res.points]

    def search_vectors(self, asks: list[tuple[np.ndarray, list[str] | None]], k: int,
                       ef: int | None = None) -> list[VectorHits]:
        """For each (vector, languages) of ``asks``, its ``k`` best with their stored vectors:
        one request (``query_batch_points``), one round trip for every language of a corrected
        search instead of a search and a retrieve for each."""
        requests = []
        for vec, langs in asks:
            flt, params = self._filter_params(langs, ef)
            requests.append(self.m.QueryRequest(query=vec.tolist(), limit=k, filter=flt, with_payload=True,
                                                with_vector=True, params=params))
        answers = self._call(self.client.query_batch_points, self.name, requests=requests) if requests else []
        out = []
        for res in answers:
            for p in res.points:
                _vecplug_id(p.payload or {}, p.id, self.where)  # before a caller takes it for ours
            out.append([(p.payload or {}, float(p.score), _array(p.vector)) for p in res.points])
        return out

    def retrieve(self, ids: list[str]) -> list[dict[str, Any]]:
        return [p.payload or {} for p in self._call(self.client.retrieve, self.name, ids)]

    def retrieve_vectors(self, ids: list[str]) -> dict[str, list[float]]:
        points = self._call(self.client.retrieve, self.name, ids, with_payload=["_id"], with_vectors=True)
        return {(p.payload or {})["_id"]: p.vector for p in points}

    def scroll_ids(self) -> Iterator[str]:
        return _scroll(lambda off: self._call(self.client.scroll, self.name, limit=1000, offset=off,
                                              with_payload=["_id"], with_vectors=False), self.where)

    def count(self) -> int:
        return int(self._call(self.client.count, self.name, exact=True).count)

    def facet(self) -> dict[str, int]:
        hits = self._call(self.client.facet, self.name, "lang", limit=100_000, exact=True).hits
        return {str(h.value): int(h.count) for h in hits}

    def commit(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Replace the manifest (every write was already acknowledged with ``wait=True``) and
        return it as saved, with a new commit id. Behind the writer lease: if the manifest
        there is no longer the one ``meta`` follows (another writer took the lease while this
        one was idle past it and committed, or made the collection anew), this raises
        IndexLockedError instead of overwriting that writer's manifest and language
        statistics."""
        current = self.meta()
        if current is None:
            raise IndexNotFoundError(f"{self.where} is gone or holds no vecplug manifest now")
        if current.get("commit") != meta.get("commit"):
            raise IndexLockedError(
                f"{self.where} was committed to by another writer since this one opened it (it "
                "took this writer's lease while this one was idle past it). This commit is "
                "refused so as not to overwrite that writer's manifest; the documents this one "
                "wrote are in the collection, and opening the index for writing again (vecplug "
                "index) fits the language statistics to them")
        saved = {**meta, "commit": uuid.uuid4().hex}
        self.save_meta(saved)
        return saved

    def verify(self, rows: bool, dim: int) -> list[str]:
        """What a client can check: the collection is there, is ours, and has our dimension
        (the server keeps its files; ids and counts are checked by ``vecplug verify`` itself)."""
        if self.meta() is None:
            return [f"{self.where} is missing or holds no vecplug manifest"]
        params = self._call(self.client.get_collection, self.name).config.params.vectors
        size = getattr(params, "size", None)
        if size is not None and int(size) != dim:
            return [f"{self.where} holds vectors of dimension {size}, its manifest says {dim}"]
        return []

    def close(self) -> None:
        if self.owned:
            self.client.close()


class QdrantStore(VectorStore):
    """Qdrant as a server collection or an embedded folder (see the module docstring)."""

    name: ClassVar[str] = "qdrant"

    def __init__(self, backend: _Server | _Edge, meta: dict[str, Any], writable: bool,
                 lease: WriterLease | None = None) -> None:
        self._b: _Server | _Edge | None = backend
        self._lease = lease  # a server writer's (an embedded one holds writer.lock)
        self._meta = meta  # {"format": FORMAT, "dim": int, "manifest": dict}
        self._dim = int(meta["dim"])
        self._writable = writable
        self._moves = 0  # times _meta moved to another commit: the commit token
        self.writes_through = isinstance(backend, _Server)  # nothing staged on a server
        self._looked = time.monotonic()  # when a server reader last read the manifest
        self._walked_at: tuple[int, frozenset[str]] | None = None  # (commit token, languages walked)

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
    def check_location(cls, location: str, options: dict[str, Any]) -> None:
        if not _is_server(location, options):  # a server's collection is checked as it is made
            _Edge.check_folder(location)

    @classmethod
    def create(cls, location: str, dim: int, manifest: dict[str, Any],
               options: dict[str, Any]) -> "QdrantStore":
        b = cls._backend(location, options)
        lease = None
        if isinstance(b, _Server):
            try:
                # before anything is made or dropped: another writer may be writing the collection,
                # or may have made and committed it since the caller found none
                lease = b.take_lease(options)
                if b.meta() is not None:
                    raise VecplugError(f"an index already exists in {b.where}")
            except BaseException:
                cls._give_up(b, lease)
                raise
        store = {"name": cls.name, "space": "cosine",
                 "mode": "server" if isinstance(b, _Server) else "embedded (qdrant-edge)"}
        if isinstance(b, _Server):
            store["collection"] = b.name
        manifest = {**copy.deepcopy(manifest), "dim": int(dim), "store": store}
        meta = {"format": FORMAT, "dim": int(dim), "manifest": manifest}
        if isinstance(b, _Server):
            try:
                meta = b.create(int(dim), meta)  # as saved: with the id a commit checks (_Server.commit)
            except BaseException:
                cls._give_up(b, lease)
                raise
        else:
            b.create(int(dim), meta)
        return cls(b, meta, writable=True, lease=lease)

    @classmethod
    def open(cls, location: str, options: dict[str, Any], writable: bool = False) -> "QdrantStore":
        b = cls._backend(location, options)
        meta = cls._checked(b, b.meta())  # before any engine file is read: crafted folders stay shut
        lease = None
        if isinstance(b, _Server):
            try:  # a failure from here gives the lease back before the client closes
                if writable:
                    lease = b.take_lease(options)
                    meta = cls._checked(b, b.meta(), close=False)  # as the last writer left it
                cls._index_lang(b, writable)
            except BaseException:
                cls._give_up(b, lease)
                raise
        if isinstance(b, _Edge):
            # finishes a commit a crash interrupted, which may write the manifest; a reader
            # may get a copy of the last commit instead (module docstring)
            b.load(reader=not writable)
            meta = cls._checked(b, b.served or b.meta())
        return cls(b, meta, writable, lease)

    @staticmethod
    def _give_up(b: _Server, lease: WriterLease | None) -> None:
        """After a failed create or open: the lease given back (best effort), the client closed."""
        try:
            if lease is not None:
                lease.give_back()
        except Exception:  # noqa: BLE001 - the error that brought us here is the one to see
            pass
        finally:
            b.close()

    @staticmethod
    def _index_lang(b: _Server, writable: bool) -> None:
        """Give a collection the ``lang`` payload index it lacks (:meth:`_Server.ensure_index`).
        A reader that may not (a read-only API key) warns and reads on: only language facets
        and filters suffer, and the next writer to open it repairs it."""
        try:
            b.ensure_index(b.info)
        except Exception as exc:  # noqa: BLE001 - the reader goes on; a writer must not
            if writable:
                raise  # the caller gives its lease back and closes
            warnings.warn(f"{b.where} has no payload index on 'lang' and this reader could not "
                          f"make it: {exc}", RuntimeWarning, stacklevel=3)

    @staticmethod
    def _checked(b: _Server | _Edge, meta: dict[str, Any] | None, close: bool = True) -> dict[str, Any]:
        """``meta`` if it is a manifest entry this store can serve, else an error (``b`` closed
        first unless ``close`` is False: the caller still has a lease to give back)."""
        if meta is None or not isinstance(meta.get("dim"), int) or not isinstance(
                meta.get("manifest"), dict):
            if close:
                b.close()
            if meta is None:
                raise IndexNotFoundError(f"no vecplug qdrant index in {b.where}")
            raise CorruptIndexError(f"malformed vecplug manifest in {b.where}")
        return meta

    @property
    def manifest(self) -> dict[str, Any]:
        return copy.deepcopy(self._meta["manifest"])

    def manifest_value(self, key: str, default: Any = None) -> Any:
        return copy.deepcopy(self._meta["manifest"].get(key, default))

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def where(self) -> str:
        """Where the index is, for people: ``collection 'docs' at http://...`` or ``folder ...``
        (a caller's client is named by the URL or path it was made with)."""
        return self._live().where

    def _live(self, write: bool = False) -> _Server | _Edge:
        if self._b is None:
            raise VecplugError("the qdrant store is closed")
        if write and not self._writable:
            raise VecplugError("the qdrant store was opened read-only")
        if write and self._lease is not None:
            self._lease.keep()  # renewed, or IndexLockedError before anything is written
        return self._b

    def writer_running(self) -> bool:
        """A server collection's writer holds its lease (this store's own, when it writes)."""
        b = self._live()
        if not isinstance(b, _Server):
            return False
        return self._lease is not None or lease_held(b.client, b.name, b._call)

    def uncommitted_writes(self) -> bool:
        """A server collection's manifest entry marked by a writer before its first write after
        a commit, and not cleared by a commit since (:meth:`_mark_writes`): as this store last
        read it (a reader: at most :data:`SERVER_FOLLOW` seconds ago)."""
        return bool(self._meta.get(UNCOMMITTED))

    def _mark_writes(self, b: _Server | _Edge) -> None:
        """Before a server writer's first write after its open or its last commit, mark the
        manifest entry ``uncommitted`` (saved like a commit, with the same manifest). The points
        written from here on may differ from what the manifest's language statistics describe
        even where their count agrees (documents overwritten, or as many added as deleted); the
        next commit, whose manifest describes them, clears the mark, so a writer killed before
        it leaves the mark to the next open (``Index.language_stats`` fits the statistics to
        the points again). One save of the manifest per commit interval; a store that stages
        its writes needs none: its commit is atomic."""
        if isinstance(b, _Server) and not self._meta.get(UNCOMMITTED):
            # not a move of the commit token: the manifest, and what is derived from it, stay
            self._meta = b.commit({**self._meta, UNCOMMITTED: True})

    def commit_token(self) -> int:
        """Counts the commits this store moved to: its own, a reader's copy following a
        writer's, a server reader's new manifest (read at most every :data:`SERVER_FOLLOW`
        seconds)."""
        self._reader()
        return self._moves

    def _reader(self) -> _Server | _Edge:
        """The backend, for a read: a reader on a copy first moves to the newest commit, and
        the manifest with it (the next read after a commit sees it, as hnswlib readers do); a
        reader of a server reads the manifest again when it last did over
        :data:`SERVER_FOLLOW` seconds ago (its points it sees as they are written)."""
        b = self._live()
        meta = None
        if isinstance(b, _Edge):
            meta = b.follow()
        elif not self._writable and time.monotonic() - self._looked >= SERVER_FOLLOW:
            self._looked = time.monotonic()
            meta = b.meta()  # None: the collection is gone or not ours now; keep what we had
            if meta is not None and (meta == self._meta or not isinstance(meta.get("manifest"), dict)
                                     or meta.get("dim") != self._dim):
                meta = None  # the same commit, or one this store cannot serve
        if meta is not None:
            self._meta = meta
            self._moves += 1
        return b

    def upsert(self, records: Sequence[Record], vectors: np.ndarray) -> None:
        b = self._live(write=True)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.shape != (len(records), self._dim):
            raise ValueError(f"expected vectors of shape ({len(records)}, {self._dim}), "
                             f"got {vecs.shape}")
        refuse_unstorable(records)  # the whole batch, before any of it is staged or sent
        if records:
            self._mark_writes(b)
        for a in range(0, len(records), _BATCH):
            chunk = records[a:a + _BATCH]
            if a and self._lease is not None:
                self._lease.keep()  # one call can outlast the lease: renewed per request
            b.upsert([_point_id(r.id) for r in chunk], vecs[a:a + _BATCH],
                     [_to_payload(r) for r in chunk])

    def delete(self, ids: Sequence[str]) -> None:
        b = self._live(write=True)
        if ids:
            self._mark_writes(b)
        for a in range(0, len(ids), _BATCH):  # unknown ids are no-ops in Qdrant
            if a and self._lease is not None:
                self._lease.keep()  # one call can outlast the lease: renewed per request
            b.delete([_point_id(i) for i in ids[a:a + _BATCH]])

    def search(self, vector: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
               ef: int | None = None) -> list[StoreHit]:
        b = self._reader()
        if k <= 0 or (langs is not None and len(langs) == 0):
            return []  # an empty language list matches nothing
        vec = self._vector(vector)
        return [StoreHit(_to_record(p), s) for p, s in b.search(vec, k, _wanted(langs), ef)]

    def candidates(self, vector: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
                   ef: int | None = None) -> list[Candidate]:
        """Each with the vector its search read: one engine call or request, not a search and
        a retrieve."""
        b = self._reader()
        if k <= 0 or (langs is not None and len(langs) == 0):
            return []
        (found,) = b.search_vectors([(self._vector(vector), _wanted(langs))], k, ef)
        return [_candidate(p, score, v) for p, score, v in found]

    def candidates_per_language(self, vector: np.ndarray, k: int, langs: Sequence[str], *,
                                ef: int | None = None,
                                walk_vectors: Mapping[str, np.ndarray] | None = None) -> list[Candidate]:
        """Every language's search at once (a server: one request for all), each candidate
        with the vector its search read. A language Qdrant walks (more than EXACT_FILTER_LIMIT
        documents at the commit this store follows: its full_scan_threshold) is searched towards
        its ``walk_vectors`` entry when given, and its candidates scored against ``vector``
        here."""
        b = self._reader()
        if k <= 0 or not langs:
            return []
        vec = self._vector(vector)
        hints = walk_vectors or {}
        walked = self._walked() if hints else frozenset()
        asks = []
        for lang in langs:
            hint = hints.get(lang) if (lang or UND) in walked else None
            asks.append((vec if hint is None else self._vector(hint, "walk vector"), [lang or UND]))
        unit = vec / max(float(np.linalg.norm(vec)), 1e-30)  # cosine: the store's scores are of unit vectors
        out: list[Candidate] = []
        for (asked, _), found in zip(asks, b.search_vectors(asks, k, ef)):
            if asked is vec:
                out += [_candidate(p, score, v) for p, score, v in found]
                continue
            if found:
                order, scores = best_first(np.stack([v for _, _, v in found]), unit)
                out += [_candidate(found[i][0], float(scores[i]), found[i][2]) for i in order]
        return out

    def _vector(self, vector: np.ndarray, what: str = "vector") -> np.ndarray:
        """``vector`` as a flat float32 array; a ValueError naming ``what`` when its dimension
        is not the index's."""
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self._dim:
            raise ValueError(f"expected a {what} of dimension {self._dim}, got {vec.shape[0]}")
        return vec

    def _walked(self) -> frozenset[str]:
        """The languages whose filters Qdrant walks (more than EXACT_FILTER_LIMIT documents), as
        counted once per commit this store follows. After a :meth:`_reader` call: its commit."""
        token = self._moves  # commit_token() without a second look for a newer commit
        if self._walked_at is None or self._walked_at[0] != token:
            self._walked_at = (token, frozenset(lang for lang, n in self.languages().items()
                                                if n > EXACT_FILTER_LIMIT))
        return self._walked_at[1]

    def get(self, ids: Sequence[str]) -> list[Record]:
        b, found = self._reader(), {}
        uniq = list(dict.fromkeys(ids))
        for a in range(0, len(uniq), 1000):
            found.update((p["_id"], _to_record(p))
                         for p in b.retrieve([_point_id(i) for i in uniq[a:a + 1000]]))
        return [found[i] for i in ids if i in found]

    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        return ordered_vectors(self.vectors_found(ids), ids, self._dim)

    def vectors_found(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        found = self._retrieve_vectors(ids)
        return {i: _array(found[i]) for i in dict.fromkeys(ids) if i in found}

    def _retrieve_vectors(self, ids: Sequence[str]) -> dict[str, Any]:
        """The stored vectors of those of ``ids`` that exist, by id, as the backend gives them."""
        b, found = self._reader(), {}
        uniq = list(dict.fromkeys(ids))
        for a in range(0, len(uniq), 1000):
            found.update(b.retrieve_vectors([_point_id(i) for i in uniq[a:a + 1000]]))
        return found

    def ids(self) -> Iterator[str]:
        return self._reader().scroll_ids()

    def count(self) -> int:
        return self._reader().count()

    def languages(self) -> dict[str, int]:
        return {lang: n for lang, n in self._reader().facet().items() if n > 0}

    def verify(self, rows: bool = True) -> list[str]:
        """Everything wrong with the committed index, checked in full whatever the stamp says
        (empty: all is well). Embedded: the manifest's checksum, every shard file against its
        SHA-256, and with ``rows`` every point as the engine reads it. Server: what a client
        can see (the collection, its manifest and dimension)."""
        return self._live().verify(rows, self._dim)

    def commit(self, manifest: dict[str, Any] | None = None) -> None:
        b = self._live(write=True)
        merged = {**self._meta["manifest"], **copy.deepcopy(manifest or {})}
        # the caller's manifest describes every write made before it: the mark goes
        meta = {key: value for key, value in self._meta.items() if key != UNCOMMITTED}
        meta["manifest"] = merged
        try:  # edge: redo log, shard, then the manifest; server: the manifest
            if isinstance(b, _Edge):
                b.commit(meta, write=atomic_write_bytes)  # tests tear the redo log through this name
            else:
                meta = b.commit(meta)  # as saved, with its new commit id
        except OSError as exc:  # before the redo file's rename nothing changed; after it, the
            # next open finishes the commit: either way no committed state is lost
            raise storage_error(exc, f"cannot commit to {b.where}") from exc
        self._meta = meta
        self._moves += 1

    def close(self) -> None:
        if self._b is not None:
            self._b, b = None, self._b
            lease, self._lease = self._lease, None
            try:
                if lease is not None:
                    lease.give_back()
            except Exception as exc:  # noqa: BLE001 - an unreachable server: the lease lapses
                warnings.warn(f"could not give back the writer lease of {b.where} ({exc}); it "
                              f"lapses within {lease.seconds:g} s", RuntimeWarning, stacklevel=2)
            finally:
                b.close()
