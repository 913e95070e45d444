"""The contract every vector store implements.

A store holds, per document, a unit vector and a record (text, source, language, payload),
and a JSON manifest describing how the index was built. Writes are staged and become
visible to a freshly opened store only at :meth:`VectorStore.commit`: an index opens as
exactly some committed state.
"""
from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vecplug.errors import StorageError
from vecplug.types import Document, unstorable


@dataclass(frozen=True)
class Record:
    """What a store keeps beside a vector."""

    id: str
    text: str
    source: str
    position: int
    lang: str | None
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_document(cls, doc: Document) -> "Record":
        return cls(doc.id, doc.text, doc.source, doc.position, doc.lang, dict(doc.payload))


@dataclass(frozen=True)
class StoreHit:
    record: Record
    score: float
    #: the stored vector, when the store had it at hand while searching (None otherwise):
    #: spares a second stage fetching it again (hnswlib's get_items costs ~0.1 ms a vector)
    vector: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Candidate:
    """A search result before its record is read (:meth:`VectorStore.candidates`): enough to
    rescore it. ``key`` is the store's own handle for it."""

    key: Any
    #: the language searched for (``und``: none), or the record's
    lang: str | None
    score: float
    vector: np.ndarray | None = field(default=None, compare=False, repr=False)


#: A language filter matching at most this many vectors is answered by exact search over them
#: (hnswlib store, which raises it in an index of more than 160,000: ``hnsw.scan_limit``; Qdrant
#: through its full_scan_threshold): cheaper than a filtered graph walk, and never short of
#: results. A filtered walk found 58% of the exact top 10 for one language of 100k vectors in
#: embedded Qdrant (benchmarks/ann_scale.py); exact search: 100%.
EXACT_FILTER_LIMIT = 20_000
#: rounds :meth:`VectorStore.vectors_found` reads again without finding an id fewer
_FIND_ROUNDS = 3


def row_dots(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``rows @ vector``, computed in the calling thread.

    numpy hands a matrix-vector product of a few hundred rows or more to its BLAS, which
    splits it over threads. Right after a query encode, torch's OpenMP threads are still
    spinning on the cores, and the BLAS threads wait for one: a bias-corrected ``xy`` search
    (six such products) took 74.1 ms p50 on 2 threads, 25.2 ms with this
    (``benchmarks/results/query_latency*.md``). ``einsum`` does the product without BLAS.
    """
    return np.einsum("ij,j->i", rows, vector)


def best_first(vectors: np.ndarray, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, scores): the rows of ``vectors`` scored against ``vector`` (:func:`row_dots`) and
    their order, best first (stable). What a store does with candidates it found walking towards
    a hint (:meth:`VectorStore.candidates_per_language`): their scores are the query's."""
    scores = row_dots(vectors, vector)
    return np.argsort(-scores, kind="stable"), scores


def column_dots(columns: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``columns.T @ vector`` for vectors kept as the columns of a C-contiguous ``(dim, n)``
    array, in the calling thread like :func:`row_dots`, and about twice its speed on many
    vectors: einsum's inner loop then runs along ``n`` contiguous floats (an axpy per
    dimension, which vectorises) instead of a short dot product per row (7,308 x 384:
    0.33 against 0.55-0.63 ms on one core here)."""
    return np.einsum("j,ji->i", vector, columns)


def refuse_unstorable(records: Sequence[Record]) -> None:
    """Raise ValueError naming the first of ``records`` whose payload a store cannot keep as
    it is (:func:`vecplug.types.unstorable`: too deep, NaN/infinity, an integer beyond 64
    bits). Stores call it at the top of ``upsert``, before anything of the batch is staged:
    embedded Qdrant's engine refused such a payload only after the commit point, which left
    the index unopenable."""
    for rec in records:
        why = unstorable(rec.payload)
        if why is not None:
            raise ValueError(f"document {rec.id!r} cannot be stored: {why}")


def search(store: "VectorStore", vector: np.ndarray, k: int, langs: Sequence[str] | None = None,
           ef: int | None = None) -> list[StoreHit]:
    """``store.search``, passing ``ef`` only when set, so a plugin's store written before the
    ``ef`` argument existed keeps working for every search that does not ask for one."""
    if ef is None:
        return store.search(vector, k, langs)
    return store.search(vector, k, langs, ef=ef)


def search_batch(store: "VectorStore", vectors: np.ndarray, k: int, langs: Sequence[str] | None = None,
                 ef: int | None = None) -> list[list[StoreHit]]:
    """``store.search_batch``; one :func:`search` per query for a plugin's store without it (one
    that does not subclass :class:`VectorStore`)."""
    method = getattr(store, "search_batch", None)
    if method is None:
        return [search(store, v, k, langs, ef) for v in np.asarray(vectors, dtype=np.float32)]
    return method(vectors, k, langs, ef=ef)


def candidates_per_language(store: "VectorStore", vector: np.ndarray, k: int, langs: Sequence[str],
                            ef: int | None = None,
                            walk_vectors: Mapping[str, np.ndarray] | None = None,
                            means: Mapping[str, np.ndarray] | None = None) -> list[Candidate]:
    """``store.candidates_per_language``, passing ``walk_vectors`` and ``means`` only to a store
    whose method takes them, so a plugin's store that overrode it before the hints existed
    keeps working."""
    hints: dict[str, Any] = {}
    for name, value in (("walk_vectors", walk_vectors), ("means", means)):
        if value is not None and _takes(type(store), "candidates_per_language", name):
            hints[name] = value
    return store.candidates_per_language(vector, k, langs, ef=ef, **hints)


def centred_candidates_per_language(store: "VectorStore", vectors: np.ndarray, k: int, langs: Sequence[str],
                                    means: Mapping[str, np.ndarray]) -> list[list[Candidate]] | None:
    """``store.centred_candidates_per_language``; None from a store without the method (a
    plugin's that does not subclass :class:`VectorStore`), as from one that cannot rank by
    centred cosine itself."""
    return _optional(store, "centred_candidates_per_language", vectors, k, langs, means)


def centred_search_batch(store: "VectorStore", vectors: np.ndarray, k: int, langs: Sequence[str],
                         means: Mapping[str, np.ndarray]) -> list[list[StoreHit]] | None:
    """``store.centred_search_batch``; None from a store without the method (a plugin's that
    does not subclass :class:`VectorStore`), as from one that cannot rank by centred cosine
    itself."""
    return _optional(store, "centred_search_batch", vectors, k, langs, means)


def centred_candidates(store: "VectorStore", vector: np.ndarray, k: int,
                       ef: int | None = None) -> list[Candidate] | None:
    """``store.centred_candidates``; None from a store without the method (a plugin's that does
    not subclass :class:`VectorStore`), as from one whose graph is not centred."""
    return _optional(store, "centred_candidates", vector, k, ef=ef)


def _optional(store: "VectorStore", name: str, *args: Any, **kwargs: Any) -> Any:
    """``store.<name>(*args, **kwargs)``, or None from a store without that method."""
    method = getattr(store, name, None)
    return None if method is None else method(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _takes(cls: type, method: str, argument: str) -> bool:
    """Whether ``cls.method`` accepts the keyword ``argument`` (by name or ``**kwargs``)."""
    params = inspect.signature(getattr(cls, method)).parameters
    return argument in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def hit_vectors(store: "VectorStore", hits: Sequence[StoreHit]) -> list[np.ndarray | None]:
    """Each hit's stored vector: the one it carries, else read (one :meth:`VectorStore.
    vectors_found` call for those without); None for a hit whose document a commit since the
    search removed."""
    missing = [h.record.id for h in hits if h.vector is None]
    found = store.vectors_found(missing) if missing else {}
    return [h.vector if h.vector is not None else found.get(h.record.id) for h in hits]


def ordered_vectors(found: dict[str, np.ndarray], ids: Sequence[str], dim: int) -> np.ndarray:
    """``found`` (vectors by id, as :meth:`VectorStore.vectors_found` gives them) as the (n, dim)
    array of :meth:`VectorStore.vectors`: in the order of ``ids``, KeyError naming one missing."""
    missing = next((i for i in ids if i not in found), None)
    if missing is not None:
        raise KeyError(missing)
    return np.asarray([found[i] for i in ids], dtype=np.float32).reshape(len(ids), dim)


class VectorStore(ABC):
    """A place to put vectors with records, and to search them by cosine similarity.

    Vectors given to :meth:`upsert` and :meth:`search` are L2-normalised float32, so
    inner product and cosine agree. ``location`` is a folder for embedded stores
    or a URL for servers; ``options`` are the store's own settings (from config).
    """

    #: registry name, e.g. ``"hnswlib"``
    name: ClassVar[str]
    #: True when writes reach the index as they are made, not at :meth:`commit` (a Qdrant
    #: server): a run killed between a write and its commit can leave points the manifest's
    #: language statistics never took in, or took in with other vectors, so an Index fits
    #: them again when :meth:`uncommitted_writes` says so, or when :meth:`count` disagrees
    writes_through: bool = False

    @classmethod
    @abstractmethod
    def exists(cls, location: str, options: dict[str, Any]) -> bool:
        """Whether a committed index exists at ``location``."""

    @classmethod
    def check_location(cls, location: str, options: dict[str, Any]) -> None:
        """Raise the error :meth:`create` would raise because of what is at ``location`` (a
        folder holding someone else's files): checked before a model is loaded for a new
        index. This default checks nothing."""

    @classmethod
    @abstractmethod
    def create(cls, location: str, dim: int, manifest: dict[str, Any],
               options: dict[str, Any]) -> "VectorStore":
        """Create a new, empty index (committed at once with ``manifest``) and open it for writing."""

    @classmethod
    @abstractmethod
    def open(cls, location: str, options: dict[str, Any], writable: bool = False) -> "VectorStore":
        """Open an existing index; raise :class:`~vecplug.errors.IndexNotFoundError` if absent."""

    @property
    @abstractmethod
    def manifest(self) -> dict[str, Any]:
        """The manifest of the last commit (a copy)."""

    def manifest_value(self, key: str, default: Any = None) -> Any:
        """One entry of :attr:`manifest` (a copy). Stores override it to skip copying the
        whole manifest, which holds the language statistics: the search path reads a flag."""
        return self.manifest.get(key, default)

    def writer_running(self) -> bool:
        """Whether a writer is writing through to this index now (only for
        :attr:`writes_through` stores): its written points are counted at its next commit, so
        a reader meanwhile finds more points than the manifest counts and must not take that
        for the remains of a killed run."""
        return False

    def uncommitted_writes(self) -> bool:
        """Whether a writer may have written to this index since its last commit (only for
        :attr:`writes_through` stores, which mark the commit before the first write after it
        and clear the mark at the next commit). Found while no writer runs
        (:meth:`writer_running`), the mark is a killed run's: the points may differ from what
        the manifest describes even where their count agrees (documents overwritten), and
        statistics kept of them are fitted again before they are used or committed. This
        default: never."""
        return False

    def commit_token(self) -> Any:
        """A value that changes whenever the commit this store reads from does: at its own
        commits, and for a reader at the commits of a writer that it follows (equal values:
        the same :attr:`manifest`). What a caller derives from the manifest and keeps (the
        language-bias correction's means) is rebuilt when it changes. A reader first moves to
        the newest commit it follows, as a search would, so that the manifest read next is
        that commit's (or a newer one).

        This default is the manifest itself: always right, for a copy of it at every call;
        stores override it with something cheap (a generation, a counter)."""
        return self.manifest

    @property
    @abstractmethod
    def dim(self) -> int:
        """Vector dimension."""

    @abstractmethod
    def upsert(self, records: Sequence[Record], vectors: np.ndarray) -> None:
        """Add or replace records (by id) with their vectors."""

    @abstractmethod
    def delete(self, ids: Sequence[str]) -> None:
        """Remove records by id; unknown ids are ignored."""

    @abstractmethod
    def search(self, vector: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
               ef: int | None = None) -> list[StoreHit]:
        """The ``k`` nearest records to ``vector``, best first; only ``langs`` if given.

        ``ef`` is the search-time breadth of an approximate index (HNSW's ef: higher finds
        more of the true neighbours and costs more) for this query only; None keeps the
        store's setting, and a store with no such knob ignores it."""

    def search_batch(self, vectors: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
                     ef: int | None = None) -> list[list[StoreHit]]:
        """:meth:`search` for each row of ``vectors`` (a ``(queries, dim)`` array), the same
        ``langs`` and ``ef`` for all. This default asks one query at a time; a store that answers
        a batch at once for less overrides it (the flat store: one scan for them all)."""
        return [search(self, v, k, langs, ef) for v in np.asarray(vectors, dtype=np.float32)]

    def candidates(self, vector: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
                   ef: int | None = None) -> list[Candidate]:
        """:meth:`search` in two steps, for a caller that rescores many candidates and keeps a
        few (the language-bias correction: k x 2 per language, 10 kept): this one returns each
        candidate with its stored vector, :meth:`hits` then reads the kept ones' records.
        Stores override it to skip reading records here (hnswlib: 3 ms of a corrected search);
        this default searches and carries the hits along. A commit between the two steps may
        drop a kept candidate that it removed, and one between the search and the read of the
        vectors drops the hits whose vector is gone."""
        hits = search(self, vector, k, langs, ef)
        return [Candidate(h, h.record.lang, h.score, vec)
                for h, vec in zip(hits, hit_vectors(self, hits)) if vec is not None]

    def candidates_per_language(self, vector: np.ndarray, k: int, langs: Sequence[str], *,
                                ef: int | None = None,
                                walk_vectors: Mapping[str, np.ndarray] | None = None,
                                means: Mapping[str, np.ndarray] | None = None) -> list[Candidate]:
        """:meth:`candidates` for each language of ``langs`` on its own (up to ``k`` of each,
        their lists one after the other): what the language-bias correction rescores. This
        default asks once per language; a store may answer all in one call (hnswlib: one lock,
        one check for a newer commit).

        ``walk_vectors`` (by language) are hints for a store that finds a language's candidates
        by a filtered graph walk: it may walk towards that vector instead (a point inside the
        language's region: the walk then meets that language's nodes at once instead of
        crossing the others'), still scoring the candidates against ``vector``. The candidates
        then are the language's nearest to the hint, not to ``vector``: the caller rescores
        them. Exact scans, and this default, ignore the hints.

        ``means`` (by language; ``vector`` then a query centred by its language's mean) are for a
        store that scans a language's documents exactly: it may rank them by centred cosine,
        ``vector . (x - m) / |x - m|``, and give that language's exact best by the correction's
        score instead of its best by ``vector . x`` (the hnswlib store does). Either way the
        caller rescores; this default ignores them."""
        out: list[Candidate] = []
        for lang in langs:
            out += self.candidates(vector, k, [lang], ef=ef)
        return out

    def centred_candidates_per_language(self, vectors: np.ndarray, k: int, langs: Sequence[str],
                                        means: Mapping[str, np.ndarray]) -> list[list[Candidate]] | None:
        """For each row of ``vectors`` (queries centred by their languages' means), each
        language of ``langs``'s exact best ``k`` by centred cosine, ``cos(q, d - means[lang])``
        (the language-bias correction's score, ``adapters/bias.py``), with their vectors as given
        to :meth:`upsert`, from a store that can rank its rows so (the flat store: one scan of
        each language's rows for all the queries). None (this default): the correction then asks
        :meth:`candidates_per_language` for each query and rescores what it finds."""
        return None

    def centred_search_batch(self, vectors: np.ndarray, k: int, langs: Sequence[str],
                             means: Mapping[str, np.ndarray]) -> list[list[StoreHit]] | None:
        """For each row of ``vectors`` (queries centred by their languages' means), the exact
        best ``k`` of the documents of ``langs`` by centred cosine (as
        :meth:`centred_candidates_per_language` scores them), as hits, best first: a batch's
        first stage, from a store that ranks by centred cosine itself. Only the hits kept are
        held and read (their records once for the batch), not every language's ``k``. None
        (this default): the correction then searches query by query."""
        return None

    def centred_candidates(self, vector: np.ndarray, k: int, *, ef: int | None = None) -> list[Candidate] | None:
        """For a store whose graph holds each document centred by its language's mean (the
        hnswlib store's option ``centred``: ``stores/centring.py``): the ``k`` nearest to
        ``vector``, a query centred the same way, in one walk over every language, with their
        vectors as given to :meth:`upsert` and the graph's scores (the caller rescores). None
        (this default) from a store that has no such graph: the language-bias correction then
        asks :meth:`candidates_per_language`."""
        return None

    def hits(self, candidates: Sequence[Candidate]) -> list[StoreHit]:
        """Candidates of :meth:`candidates` as hits, in the order and with the scores given; a
        store that reads their records here leaves out those a commit removed since."""
        return [StoreHit(c.key.record, c.score, c.vector) for c in candidates]

    @abstractmethod
    def get(self, ids: Sequence[str]) -> list[Record]:
        """Records for the ids that exist, in the order asked."""

    @abstractmethod
    def vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of ``ids`` as an (n, dim) array, in the order asked; every id must
        exist (KeyError naming one that does not)."""

    def vectors_found(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those of ``ids`` that exist, by id (never a KeyError).

        For a caller that found the ids in an earlier read (a search, then a rescoring): a
        commit in between, its own or a writer's that a reader follows, may have removed some,
        and those are left out. This default asks :meth:`vectors`, and when an id is gone asks
        again for the ids :meth:`get` still finds; stores override it with one read."""
        ids = list(dict.fromkeys(ids))
        stuck = 0
        while ids:
            try:
                return dict(zip(ids, self.vectors(ids)))
            except KeyError:
                present = [r.id for r in self.get(ids)]
                # each round follows a commit that removed some; none removed, the store's
                # records and vectors disagree for a moment (an id removed and added again)
                stuck = stuck + 1 if len(present) == len(ids) else 0
                if stuck == _FIND_ROUNDS:
                    raise StorageError(f"the vectors of {len(ids)} documents could not be read: "
                                       "the index kept changing; try again") from None
                ids = present
        return {}

    @abstractmethod
    def ids(self) -> Iterator[str]:
        """Every id in the index."""

    @abstractmethod
    def count(self) -> int:
        """Number of records."""

    @abstractmethod
    def languages(self) -> dict[str, int]:
        """Number of records per language (``"und"`` for unknown)."""

    def verify(self, rows: bool = True) -> list[str]:
        """Everything wrong with the index's files, read in full whatever the fast open trusted
        (empty: all is well); ``rows``: every record too. A store without a check of its own
        finds nothing to report."""
        return []

    @abstractmethod
    def commit(self, manifest: dict[str, Any] | None = None) -> None:
        """Make every staged change durable and visible at once, with an updated manifest."""

    @abstractmethod
    def close(self) -> None:
        """Release files and connections; staged changes not committed are dropped."""

    def __enter__(self) -> "VectorStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
