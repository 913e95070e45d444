"""Language-bias correction for pooled multilingual search.

A multilingual encoder places text partly by its language: each language's vectors share a
direction, so in one pooled index a query ranks documents of its own language higher just
for being in that language (LAReQA's "language bias"; 79% of me5-small's top 10 on XQuAD-R
share the question's language where a language-blind ranking would put 17% there).

The correction removes each language's mean document vector before scoring:
``score(q, d) = cos(q - m[lang(q)], d - m[lang(d)])``. The means are kept as running sums
per language in the index's manifest (the indexing pipeline adds and subtracts vectors as
documents are written and replaced), so the correction can be switched on and off at search
time, needs no re-encoding, and survives incremental updates.

Because stored vectors stay as encoded, the ANN graph is not built on centred vectors. A
corrected search therefore asks the store for each language of the pool separately (a
language filter: inside one language the mean is a constant, so the store's own ranking
is nearly the centred one) and rescores those candidates exactly with centred vectors (a
store that ranks by centred cosine itself, the flat store, gives each language's exact best
instead: ``centred_candidates_per_language``; the hnswlib store ranks the languages it scans
exactly by centred cosine, given the means). A language the store finds by a filtered
graph walk is walked from inside its own region (:data:`WALK_SHIFT`): the centred query lies
outside every language's region, and a walk from there for a language of a few percent of a
large index visited many of the other languages' nodes first.

A store built with a graph of language-centred vectors (the hnswlib store's ``centred``
option: ``stores/centring.py``) answers a search of every language in one walk instead
(:meth:`~vecplug.adapters.stores.base.VectorStore.centred_candidates`), for
:data:`CENTRED_OVERFETCH` times the results asked, rescored exactly the same way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from vecplug.adapters.stores import centring
from vecplug.adapters.stores.base import (Candidate, StoreHit, candidates_per_language, centred_candidates,
                                          centred_candidates_per_language, hit_vectors, row_dots)
from vecplug.adapters.stores.base import centred_search_batch as store_centred_search_batch

if TYPE_CHECKING:
    from vecplug.adapters.consensus import Consensus

UND = "und"
#: a language's mean is shrunk towards the global mean as if it had this many extra
#: documents: a language with a handful of documents must not have them cancelled out
#: (the mean of one document is that document)
SHRINK = 16.0
MANIFEST_KEY = "language_stats"
#: candidates fetched per language beyond k before exact rescoring
OVERFETCH = 2
#: a language searched by a filtered graph walk (a large one: more documents than the store
#: scans exactly) is walked towards the query plus this many times its mean: inside that
#: language's region, where the walk meets its nodes at once, instead of from the centred query,
#: outside every language's region, whose filtered walks crossed the other languages' nodes. The
#: candidates are rescored exactly, so the shift only chooses them: on a million Debian sentences
#: in 32 languages, 1 keeps the unshifted walks' recall of the exact centred top 10 at a fraction
#: of their cost (benchmarks/results/modes_scale_debian.md)
WALK_SHIFT = 1.0
#: a store whose graph is centred (``stores/centring.py``) is walked once for this many times the
#: results asked, rescored exactly: the graph is centred by its own anchors, not by the means of
#: the moment, and its walk is approximate
CENTRED_OVERFETCH = 4


@dataclass
class LanguageStats:
    """Running per-language sums and counts of document vectors."""

    dim: int
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> "LanguageStats | None":
        raw = manifest.get(MANIFEST_KEY)
        if not raw:
            return None
        dim = int(manifest["dim"])
        stats = cls(dim)
        for lang, n in raw["counts"].items():
            stats.counts[lang] = int(n)
            stats.sums[lang] = np.asarray(raw["sums"][lang], dtype=np.float64).reshape(dim)
        return stats

    def to_manifest(self) -> dict[str, Any]:
        langs = sorted(lang for lang, n in self.counts.items() if n > 0)
        return {MANIFEST_KEY: {"counts": {lang: self.counts[lang] for lang in langs},
                               "sums": {lang: self.sums[lang].tolist() for lang in langs}}}

    def add(self, langs: Iterable[str | None], vectors: np.ndarray, sign: int = 1) -> None:
        """Add (``sign=1``) or remove (``sign=-1``) documents' vectors."""
        vectors = np.asarray(vectors, dtype=np.float64)
        for lang, v in zip(langs, vectors):
            key = lang or UND
            if key not in self.sums:
                self.sums[key] = np.zeros(self.dim, dtype=np.float64)
                self.counts[key] = 0
            self.sums[key] += sign * v
            self.counts[key] += sign

    @classmethod
    def fit(cls, store: Any) -> "LanguageStats":
        """Recompute from every stored vector (indexes written before the stats existed, or whose
        statistics a killed server run left behind). Documents a concurrent writer deletes
        while this reads are left out, not a KeyError."""
        stats = cls(int(store.dim))
        ids = list(store.ids())
        for start in range(0, len(ids), 4096):
            records = store.get(ids[start:start + 4096])
            found = store.vectors_found([r.id for r in records])
            kept = [r for r in records if r.id in found]
            stats.add([r.lang for r in kept], [found[r.id] for r in kept])
        return stats

    def means(self) -> "LanguageMeans":
        total_n = sum(n for n in self.counts.values() if n > 0)
        if not total_n:
            return LanguageMeans({}, np.zeros(self.dim, dtype=np.float32))
        glob = sum(self.sums[lang] for lang, n in self.counts.items() if n > 0) / total_n
        means = {lang: ((self.sums[lang] + SHRINK * glob) / (n + SHRINK)).astype(np.float32)
                 for lang, n in self.counts.items() if n > 0}
        return LanguageMeans(means, glob.astype(np.float32))


@dataclass(frozen=True)
class LanguageMeans:
    """Per-language mean vectors (shrunk towards ``overall``) used to centre vectors."""

    by_lang: dict[str, np.ndarray]
    overall: np.ndarray

    def of(self, lang: str | None) -> np.ndarray:
        return self.by_lang.get(lang or UND, self.overall)

    @cached_property
    def _table(self) -> tuple[dict[str, int], np.ndarray]:
        """Row of each language in a matrix of the means, ``overall`` last (row -1): a search
        centres its ~120 candidates with one gather instead of a lookup per vector."""
        rows = {lang: i for i, lang in enumerate(self.by_lang)}
        return rows, np.stack([*self.by_lang.values(), self.overall]).astype(np.float32)

    def centre(self, vectors: np.ndarray, langs: Sequence[str | None]) -> np.ndarray:
        """Subtract each vector's language mean and re-normalise."""
        if not len(langs):
            return np.zeros((0, len(self.overall)), dtype=np.float32)
        rows, table = self._table
        index = np.fromiter((rows.get(lang or UND, -1) for lang in langs), dtype=np.intp, count=len(langs))
        return centring.centre(vectors, table[index])

    def centre_query(self, vector: np.ndarray, lang: str | None) -> np.ndarray:
        return self.centre(np.asarray(vector).reshape(1, -1), [lang])[0]


def exact_scores(store: Any, means: LanguageMeans | None, vector: np.ndarray,
                 query_lang: str | None, hits: Sequence[StoreHit]) -> np.ndarray:
    """Exact scores of the candidates' stored vectors for a query vector: plain cosine, or
    (``means`` given) centred cosine, the query centred by its language's mean.

    NaN for a candidate whose vector is gone: a commit since it was found (a writer's, that
    a reader follows) removed it."""
    vecs_of = hit_vectors(store, hits)  # the first stage's when it had them at hand
    if hits and all(v is not None for v in vecs_of):
        return _scores(means, vector, query_lang, np.stack([np.asarray(v, dtype=np.float32) for v in vecs_of]),
                       [h.record.lang for h in hits])
    kept = [i for i, v in enumerate(vecs_of) if v is not None]
    scores = np.full(len(hits), np.nan, dtype=np.float32)
    if kept:
        scores[kept] = _scores(means, vector, query_lang,
                               np.stack([np.asarray(vecs_of[i], dtype=np.float32) for i in kept]),
                               [hits[i].record.lang for i in kept])
    return scores


def _scores(means: LanguageMeans | None, vector: np.ndarray, query_lang: str | None,
            vecs: np.ndarray, langs: Sequence[str | None]) -> np.ndarray:
    query = np.asarray(vector, dtype=np.float32)
    if means is not None:
        vecs = means.centre(vecs, langs)
        query = means.centre_query(query, query_lang)
    return row_dots(vecs, query)


def rescore(store: Any, means: LanguageMeans, vector: np.ndarray, query_lang: str | None,
            hits: Sequence[StoreHit]) -> list[StoreHit]:
    """Candidates with exact centred scores, best first; those removed meanwhile dropped."""
    if not hits:
        return []
    scores = exact_scores(store, means, vector, query_lang, hits)
    order = [i for i in np.argsort(-scores, kind="stable") if not np.isnan(scores[i])]
    return [StoreHit(hits[i].record, float(scores[i]), hits[i].vector) for i in order]


def centred_search(store: Any, means: LanguageMeans, vector: np.ndarray, query_lang: str | None,
                   k: int, langs: Sequence[str], ef: int | None = None,
                   consensus: "Consensus | None" = None) -> list[StoreHit]:
    """The ``k`` best documents of ``langs`` by centred cosine (see the module docstring);
    with ``consensus``, by its scores over the best ``consensus.depth`` of each language."""
    query = means.centre_query(vector, query_lang)
    fetch = k * OVERFETCH if consensus is None else max(k * OVERFETCH, consensus.depth)
    # candidates: only the k kept have their records read (consensus regroups before that)
    pooled: list[Candidate] | None = None
    if consensus is None and not set(means.by_lang) - set(langs):
        # every language of the index: a centred graph finds them in one walk (consensus needs
        # each language's own best, and a chosen set of languages is searched language by language)
        pooled = centred_candidates(store, query, k * CENTRED_OVERFETCH, ef)
    if pooled is None:
        of_langs = _means_of(means, langs)
        exact = None
        if consensus is None:
            # a store that ranks by centred cosine itself gives the exact top k outright
            top = store_centred_search_batch(store, query[None], k, langs, of_langs)
            if top is not None:
                return top[0]
        else:  # ... and each language's exact best, for consensus to regroup
            exact = centred_candidates_per_language(store, query[None], fetch, langs, of_langs)
        # else each language's candidates: those it scans ranked by centred cosine too (the
        # means), those it walks by the walk's own order, rescored below
        pooled = exact[0] if exact is not None else candidates_per_language(
            store, query, fetch, langs, ef, walk_vectors(means, query, langs), of_langs)
    return best_centred(store, means, query, pooled, k, consensus)


def centred_search_batch(store: Any, means: LanguageMeans, vectors: np.ndarray,
                         query_langs: Sequence[str | None], k: int, langs: Sequence[str]) -> list[list[StoreHit]] | None:
    """:func:`centred_search` (without consensus) of many query vectors in one store call
    (``centred_search_batch``: the flat store scans each language once for them all, ranking by
    centred cosine, and reads only the hits kept); None from a store that answers query by
    query (the caller asks :func:`centred_search` for each)."""
    queries = means.centre(np.asarray(vectors, dtype=np.float32), list(query_langs))
    return store_centred_search_batch(store, queries, k, langs, _means_of(means, langs))


def _means_of(means: LanguageMeans, langs: Sequence[str]) -> dict[str, np.ndarray]:
    """Each language's mean, as documents of it are centred (:meth:`LanguageMeans.centre`)."""
    return {lang: means.of(lang) for lang in langs}


def best_centred(store: Any, means: LanguageMeans, query: np.ndarray, pooled: Sequence[Candidate], k: int,
                 consensus: "Consensus | None" = None) -> list[StoreHit]:
    """The ``k`` best of a centred query's candidates by centred cosine (or by ``consensus``'s
    scores), as hits, best first."""
    if not pooled:
        return []
    lang_of = [c.lang for c in pooled]
    vectors = np.stack([c.vector for c in pooled])
    centred = means.centre(vectors, lang_of)
    scores = row_dots(centred, query)
    if consensus is not None:
        if consensus.means is not means:  # partners are found with the consensus's own centring
            centred = consensus.means.centre(vectors, lang_of)
        scores = consensus.scores(scores, centred, lang_of)
    return top_hits(store, pooled, scores, k)


def walk_vectors(means: LanguageMeans, vector: np.ndarray, langs: Sequence[str]) -> dict[str, np.ndarray]:
    """Per language, where a filtered graph walk for it should head (:data:`WALK_SHIFT`)."""
    return {lang: vector + WALK_SHIFT * means.of(lang) for lang in langs}


def top_hits(store: Any, pooled: Sequence[Candidate], scores: np.ndarray, k: int) -> list[StoreHit]:
    """The ``k`` best of rescored candidates as hits, best first: only their records are read."""
    top = np.argsort(-scores, kind="stable")[:k]
    return store.hits([dataclasses.replace(pooled[i], score=float(scores[i])) for i in top])
