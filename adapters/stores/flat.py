"""The flat store: exact search, and batches of queries answered by one scan.

Records, commits, checks and the folder's layout are the hnswlib store's (``hnsw.py``), with
the graph file replaced by ``vectors-<gen>.flat`` (``flat_index.py``: the float32 vectors,
nothing else) and a ``.store-flat`` file marking the folder. Every search scores every vector
(or every vector of the languages asked), so it finds the exact top ``k``, and costs what
reading the vectors costs: ~150 ms for one query at a million vectors on the Zen 4 machine of
the README's "Read as throughput" (a graph walk: about a millisecond). It serves in the
vectors' size (float32) plus the records.

:meth:`FlatStore.search_batch` answers many queries at once by ``scan.scan``: one product of
the queries by the vectors, in bfloat16 where the CPU multiplies it natively (AMX, AVX-512
BF16; option ``precision``) and the batch is large enough to pay for converting the vectors a
step at a time (``scan.BF16_MIN_QUERIES``; fewer queries are multiplied in float32), with
each query's floor inside the product and the few candidates above it rescored in float32:
still exact (the slack is a bound, ``scan.error_bound``). In batches of 1,000 at a million
vectors: 2.7-2.9 ms a query on that Zen 4 machine; the bare scan took 0.71 ms on one with AMX.
:meth:`FlatStore.centred_candidates_per_language` scans each language's rows the same way (in
place, a step at a time), ranking them by centred cosine, for the language-bias correction:
exact too (:meth:`FlatStore.centred_search_batch`, a batch's or one query's, keeps only each
query's best of them; consensus regroups every language's). Evaluation, offline
labelling and deduplication ask in batches; an interactive search asks one query at a time,
where the hnswlib store's graph is the faster.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.adapters.stores import centring, scan
from vecplug.adapters.stores.base import Candidate, StoreHit
from vecplug.adapters.stores.flat_index import FlatIndex, check_flat_file
from vecplug.adapters.stores.hnsw import HnswStore
from vecplug.errors import ConfigError

#: ``precision`` option values of the batch scan: ``auto`` is bfloat16 where the CPU multiplies
#: it natively (``indexer.precision.bf16_matmul``), else float32
PRECISIONS = ("auto", "bfloat16", "float32")
#: queries a batch scan takes at once (more: scanned in groups of this many): the scan holds a
#: (queries x 4,096) product a step and each query's candidates
BATCH = 1024


@dataclass(frozen=True)
class _Rows:
    """A language filter's rows in the flat index, as of its ``version``."""

    labels: np.ndarray
    rows: np.ndarray
    version: int

    def __len__(self) -> int:
        return len(self.labels)


class FlatStore(HnswStore):
    """Exact search over float32 vectors + SQLite records, in a folder (module docstring)."""

    name = "flat"
    marker = ".store-flat"
    graph_suffix = ".flat"
    defaults: dict[str, Any] = {"precision": "auto"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # per language: (index version, mean), its rows in order of their centring scale, the
        # scales (_centring); forgotten with the filters, at a write or a commit followed
        self._centrings: dict[str, tuple[tuple[int, bytes], np.ndarray, Any]] = {}
        # the same for several languages at once, row by row (_row_groups): the key, each row's
        # language (its place in the languages asked; -1: none of them) and scale
        self._groups: tuple[Any, Any, Any] | None = None

    @classmethod
    def create(cls, location: str, dim: int, manifest: dict[str, Any], options: dict[str, Any]) -> "FlatStore":
        unknown = sorted(set(options) - set(cls.defaults))
        if unknown:
            raise ConfigError(f"the flat store has no option {', '.join(unknown)} (its options: "
                              f"{', '.join(cls.defaults)}); it searches exactly, without a graph")
        _precision(options)
        return super().create(location, dim, manifest, options)  # type: ignore[return-value]

    @classmethod
    def _new_graph(cls, dim: int) -> FlatIndex:
        return FlatIndex(dim)

    @classmethod
    def _check_graph(cls, path: Path, dim: int) -> str | None:
        return check_flat_file(path, dim)

    @property
    def parameters(self) -> dict[str, Any]:
        """The batch scan's precision as set (``auto``: decided per CPU)."""
        return {"precision": _precision(self._options)}

    def _ensure_graph(self, extra: int) -> None:
        if self._index is None:
            self._index = FlatIndex(self.dim)
            self._index.init_index(max(1024, extra))
            return
        need = self._index.get_current_count() + extra
        if need > self._index.get_max_elements():
            # to the rows needed: growing resizes in place, where the room is zero-filled at
            # once (room to spare would be memory held: doubling held up to twice the vectors)
            self._index.resize_index(need)

    def verify(self, rows: bool = True) -> list[str]:
        """The hnswlib store's checks, and that the vectors are the records' (one each)."""
        problems = super().verify(rows)
        if problems:
            return problems
        with self._mutex:
            labels = np.asarray([r[0] for r in self._sql("SELECT label FROM records")], dtype=np.int64)
            held = 0 if self._index is None else self._index.get_current_count()
            missing = int((self._index.rows(labels) < 0).sum()) if self._index is not None else len(labels)
        if missing or held != len(labels):
            problems.append(f"{self._meta['hnsw_file']}: {held} vectors for {len(labels)} records"
                            + (f" ({missing} of them without one)" if missing else ""))
        return problems

    # -- one query ----------------------------------------------------------

    def _knn(self, vector: np.ndarray, k: int, filt: Any, ef: int | None) -> list[tuple[int, float]]:
        if isinstance(filt, _Rows):
            labels, dist = self._index.knn_query(vector, k=k, rows=self._current_rows(filt))
        else:  # None, or a callable as the hnswlib store's filters are (asked per row)
            labels, dist = self._index.knn_query(vector, k=k, filter=filt)
        return [(int(lab), 1.0 - float(d)) for lab, d in zip(labels[0], dist[0])]

    def candidates_per_language(self, vector: np.ndarray, k: int, langs: Sequence[str], *,
                                ef: int | None = None,
                                walk_vectors: Mapping[str, np.ndarray] | None = None,
                                means: Mapping[str, np.ndarray] | None = None) -> list[Candidate]:
        """Each language scanned exactly, by ``vector . x``: the hints are not used (the
        correction's searches ask :meth:`centred_search_batch` or
        :meth:`centred_candidates_per_language` first)."""
        return super().candidates_per_language(vector, k, langs, ef=ef)

    def _filter_candidates(self, langs: tuple[str, ...]) -> tuple[np.ndarray, Any]:
        """The records of ``langs`` as rows of the flat index (no copy of their vectors: a scan
        of them reads them where they are)."""
        labels = np.asarray([r[0] for r in self._labels_in(langs)], dtype=np.int64)
        return labels, _Rows(labels, self._present(self._index.rows(labels)), self._index.version)

    def _forget_filters(self) -> None:
        super()._forget_filters()
        self._centrings.clear()
        self._groups = None

    def _filtered_knn(self, vector: np.ndarray, k: int, allowed: Any, ef: int | None) -> list[tuple[int, float]]:
        return self._knn(vector, min(k, len(allowed)), allowed, ef)

    def _current_rows(self, filt: _Rows) -> np.ndarray:
        """A filter's rows, found again when the index changed since it was made."""
        if filt.version == self._index.version:
            return filt.rows
        return self._present(self._index.rows(filt.labels))

    @staticmethod
    def _present(rows: np.ndarray) -> np.ndarray:
        return rows[rows >= 0]

    # -- many queries -------------------------------------------------------

    def search_batch(self, vectors: np.ndarray, k: int, langs: Sequence[str] | None = None, *,
                     ef: int | None = None) -> list[list[StoreHit]]:
        """:meth:`search` for each row of ``vectors``, all of them by one scan (module
        docstring; with ``langs``, of those languages' rows, read in place), exact as
        :meth:`search` is."""
        vectors = _batch(vectors)
        with self._mutex:
            queries = self._query_rows(vectors)
            if queries is None or k <= 0:
                return [[] for _ in vectors]
            select = self._current_rows(self._filter_for(tuple(sorted(set(langs))))[1]) if langs else None
            if select is not None and not len(select):
                return [[] for _ in vectors]
            return self._scan_hits(queries, k, select)

    def centred_candidates_per_language(self, vectors: np.ndarray, k: int, langs: Sequence[str],
                                        means: Mapping[str, np.ndarray]) -> list[list[Candidate]] | None:
        """Each language's exact best ``k`` by centred cosine for each row of ``vectors`` (see
        the base class), by one scan of the language's rows for them all, read where they are:
        ``q.(x - m) / |x - m|`` is ``(q.x - q.m) * scale``, a product less a constant per query,
        times a constant per row (``scan.scan``'s ``offset`` and ``scale``; the rows in order of
        their scale, so a step's rows share about one). Exact, where ranking by ``q.x`` and
        rescoring the best few is not: centring re-normalises each row by its distance from
        its language's mean, which reorders them (README, "Read as throughput")."""
        vectors = _batch(vectors)
        if self._centred:
            return None
        with self._mutex:
            found: list[list[Candidate]] = [[] for _ in vectors]
            index = self._index
            for lang, per_query in self._centred_scan(vectors, k, langs, means):
                for out, (best, scores) in zip(found, per_query):
                    out += [Candidate(int(label), lang, float(score), vector) for label, score, vector in
                            zip(index.labels[best], scores, index.vectors[best])]
            return found

    def centred_search_batch(self, vectors: np.ndarray, k: int, langs: Sequence[str],
                             means: Mapping[str, np.ndarray]) -> list[list[StoreHit]] | None:
        """Each row's exact best ``k`` over ``langs`` by centred cosine (see the base class):
        each language's best by :meth:`centred_candidates_per_language`'s scan, merged query by
        query as (row, score) pairs, and only the hits kept read, their records once for the
        batch (fewer queries than ``scan.BF16_MIN_QUERIES``: one pass over every row instead,
        :meth:`_centred_one_pass`). A million rows' batch of 1,000 queries in six languages
        would otherwise hold 60,000 candidates with their vectors, 90 MB, to keep 10,000 (the
        batch's peak at a million rows: 2,059 MB at commit ba7dc85, 1,968 at 0fe8740 with this
        method, ``benchmarks/results/exact_batch_synthetic_corrected.md``)."""
        vectors = _batch(vectors)
        if self._centred:
            return None
        with self._mutex:
            # (_query_rows first: it follows the last commit, whose rows _mostly counts)
            queries = self._query_rows(vectors) if len(vectors) < scan.BF16_MIN_QUERIES else None
            if queries is not None and self._mostly(langs, means):
                # a few queries, multiplied in float32: reading the rows is the cost, so every
                # language's are read once, in place, instead of gathered language by language
                # (one query at a million rows in six languages: 382 -> 166 ms, batches of 10
                # 73 -> 31 ms a query; README "Read as throughput"), when the languages asked
                # hold at least half of the rows (a row gathered cost about 2.3 times a row read in
                # place there: a few languages' rows are cheaper gathered than every row read)
                return self._centred_one_pass(queries, k, langs, means)
            scanned = self._centred_scan(vectors, k, langs, means)
            if not scanned:  # no query, no row of those languages, or no index yet
                return [[] for _ in vectors]
            labels = self._index.labels
            found: list[list[tuple[int, float]]] = []
            # each query's (rows, scores) of every language scanned, in the order asked
            for parts in zip(*(per_query for _, per_query in scanned)):
                rows, scores = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
                # each language best first, then a stable sort: the order, ties included, of
                # ranking their candidates one after the other
                top = np.argsort(-scores, kind="stable")[:k]
                found.append(list(zip(labels[rows[top]].tolist(), scores[top].tolist())))
            return self._hits_batch(found)

    def _mostly(self, langs: Sequence[str], means: Mapping[str, np.ndarray]) -> bool:
        """Whether the rows of ``langs`` are at least half of the index's. Under the mutex."""
        held = sum(len(self._centring(lang, np.asarray(means[lang], dtype=np.float32))[0])
                   for lang in dict.fromkeys(langs))
        return 2 * held >= self._index.get_current_count()

    def _centred_one_pass(self, queries: np.ndarray, k: int, langs: Sequence[str],
                          means: Mapping[str, np.ndarray]) -> list[list[StoreHit]]:
        """:meth:`centred_search_batch` by one scan of every row: each row's score its centred
        cosine with its own language's mean (``scan.scan``'s ``group``), rows of other
        languages not ranked. ``queries``: :meth:`_query_rows`'. Under the mutex."""
        langs = list(dict.fromkeys(langs))
        if k <= 0 or not langs:
            return [[] for _ in queries]
        of_langs = np.stack([np.asarray(means[lang], dtype=np.float32) for lang in langs])
        group, scale = self._row_groups(langs, of_langs)
        if not len(group):
            return [[] for _ in vectors]
        return self._scan_hits(queries, k, offset=queries @ of_langs.T, scale=scale, group=group)

    def _row_groups(self, langs: list[str], means: np.ndarray) -> tuple[Any, Any]:
        """For every row of the index: its language's place in ``langs`` (-1 for the rows of
        other languages) and its centring scale ``1 / |x - mean|`` (:meth:`_centring`'s), as
        tensors; empty when no row is of ``langs``. ``means``: one row per language of
        ``langs``. Kept until the index or a mean changes. Under the mutex."""
        import torch

        key = (self._index.version, tuple(langs), means.tobytes())
        if self._groups is not None and self._groups[0] == key:
            return self._groups[1], self._groups[2]
        count = self._index.get_current_count()
        group = np.full(count, -1, dtype=np.int64)
        scale = np.zeros(count, dtype=np.float32)
        for i, lang in enumerate(langs):
            rows, scales = self._centring(lang, means[i])
            group[rows], scale[rows] = i, scales.numpy()
        ranked = group >= 0
        if not ranked.any():
            out = (torch.empty(0, dtype=torch.int64), torch.empty(0))
        else:
            # the others' scale: the largest, which leaves a step's floor where the language's
            # rows put it (scan.scan divides by a step's largest scale for a floor above zero)
            scale[~ranked] = scale[ranked].max()
            out = (torch.from_numpy(group), torch.from_numpy(scale))
        self._groups = (key, *out)
        return out

    def _centred_scan(self, vectors: np.ndarray, k: int, langs: Sequence[str],
                      means: Mapping[str, np.ndarray]) -> list[tuple[str, list[tuple[np.ndarray, np.ndarray]]]]:
        """For each language of ``langs`` with rows, each query's best ``k`` of them by centred
        cosine as (rows, scores), best first. Under the mutex."""
        queries = self._query_rows(vectors)
        if queries is None or k <= 0:
            return []
        out = []
        for lang in langs:
            mean = np.asarray(means[lang], dtype=np.float32)
            rows, scale = self._centring(lang, mean)
            if len(rows):
                out.append((lang, self._scan(queries, k, rows, offset=queries @ mean, scale=scale)))
        return out

    def _centring(self, lang: str, mean: np.ndarray) -> tuple[np.ndarray, Any]:
        """The rows of ``lang`` in order of ``1 / |x - mean|`` (largest first) and those scales
        (a float32 tensor), kept until the index or the mean changes. Under the mutex."""
        import torch

        key = (self._index.version, mean.tobytes())
        kept = self._centrings.get(lang)
        if kept is not None and kept[0] == key:
            return kept[1], kept[2]
        rows = self._current_rows(self._filter_for((lang,))[1]).astype(np.int64)
        vectors = self._index.vectors
        # in numpy: torch's gathers here, as the scan's new array a step (now one buffer), left
        # freed memory that the C heap kept (the corrected batch's peak at a million rows,
        # benchmarks/results/exact_batch_synthetic_corrected.md: 2,166 MB with both, at commit
        # 642267b; 2,069 without, at 12aecd4)
        scale = np.concatenate([centring.inverse_distances(vectors[rows[a:a + scan.CONVERT_ROWS]], mean)
                                for a in range(0, len(rows), scan.CONVERT_ROWS)] or [np.empty(0, np.float32)])
        order = np.argsort(-scale, kind="stable")
        rows, ordered = rows[order], torch.from_numpy(scale[order])
        self._centrings[lang] = (key, rows, ordered)
        return rows, ordered

    def _query_rows(self, vectors: np.ndarray) -> np.ndarray | None:
        """The (queries, dim) float32 ``vectors`` of :func:`_batch`, once this reader follows the
        last commit (their width checked on the first); None when there are none or the index
        holds no vector. Under the mutex."""
        if not len(vectors) or self._query_row(vectors[0]) is None or not self._index.get_current_count():
            return None
        return vectors

    def _scan(self, queries: np.ndarray, k: int, select: np.ndarray | None = None,
              offset: np.ndarray | None = None, scale: Any = None,
              group: Any = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each query's exact best ``k`` rows of the flat index (of the rows ``select``, if
        given) and their scores, best first, by ``scan.scan`` (module docstring; ``offset``, one
        per query, or one per query and group with ``group``, and ``scale``, one per row
        scanned: its score). Under the mutex."""
        import torch

        index = self._index
        rows = torch.from_numpy(index.vectors)
        chosen = None if select is None else torch.from_numpy(np.ascontiguousarray(select, dtype=np.int64))
        k = min(k, len(rows) if select is None else len(select))
        precision = _precision(self._options)
        found: list[tuple[np.ndarray, np.ndarray]] = []
        for a in range(0, len(queries), BATCH):
            Q = torch.from_numpy(np.ascontiguousarray(queries[a:a + BATCH]))
            # a few queries: reading the rows is the cost, and converting them would add to it
            use_bf16 = precision == "bfloat16" and len(Q) >= scan.BF16_MIN_QUERIES
            slack = (scan.error_bound(Q, index.row_norm, index.residual_norm) if use_bf16
                     else scan.accumulation_bound(Q, index.row_norm))
            shift = None if offset is None else torch.from_numpy(np.ascontiguousarray(offset[a:a + BATCH]))
            ids, scores, _ = scan.scan(Q, rows, k, bfloat16=use_bf16, slack=slack, select=chosen,
                                       offset=shift, scale=scale, group=group)
            for r_ids, r_scores in zip(ids.numpy(), scores.numpy()):
                keep = r_ids >= 0
                found.append((r_ids[keep], r_scores[keep]))
        return found

    def _scan_hits(self, queries: np.ndarray, k: int, select: np.ndarray | None = None,
                   **scores: Any) -> list[list[StoreHit]]:
        """:meth:`_scan`'s rows as hits (``scores``: its ``offset``, ``scale`` and ``group``).
        Under the mutex."""
        labels = self._index.labels
        return self._hits_batch([list(zip(labels[rows].tolist(), found.tolist()))
                                 for rows, found in self._scan(queries, k, select, **scores)])

    def _hits_batch(self, found: list[list[tuple[int, float]]]) -> list[list[StoreHit]]:
        """Hits (with their vectors) of many queries' (label, score) lists: the records read
        once for them all."""
        wanted = sorted({lab for pairs in found for lab, _ in pairs})
        records = self._records_by_label(wanted)
        present = [lab for lab in wanted if lab in records]
        vectors = dict(zip(present, self._index.get_items(present))) if present else {}
        return [[StoreHit(records[lab], score, vectors[lab]) for lab, score in pairs if lab in records]
                for pairs in found]


def _batch(vectors: np.ndarray) -> np.ndarray:
    """Query vectors as a float32 ``(queries, dim)`` array; ValueError for another shape."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"a batch search takes a (queries, dim) array, not shape {vectors.shape}")
    return vectors


def _precision(options: dict[str, Any]) -> str:
    """The batch scan's precision, ``auto`` resolved for this CPU; ConfigError for another value."""
    value = options.get("precision", "auto")
    if value not in PRECISIONS:
        raise ConfigError(f"unknown flat store precision {value!r}; one of: {', '.join(PRECISIONS)}")
    if value != "auto":
        return str(value)
    from vecplug.indexer.precision import bf16_matmul

    return "bfloat16" if bf16_matmul() else "float32"
