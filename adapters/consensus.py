"""Translation consensus: a pooled search that counts an answer's translations as evidence.

A multilingual collection often holds the same text in several languages (a page and its
translations, the FAQ of each country). In a pooled (X-Y) search each copy is scored on its
own, and each score carries the noise of its language: the copy in one language ranks first,
its translations scatter down the list, and a wrong answer that happens to score well in one
language beats a right one that scores well in all of them.

Consensus rescores the candidates of a search together. Among the candidates, a document's
*partners* are its closest candidate in each other language, if that one is close enough to
be the same text (cosine of the language-centred document vectors at least ``threshold``).
Its new score blends its own score, the mean over it and its partners, and the best of them:

    score'(d) = w_own * s(d) + w_mean * mean(s(d), s(p1), ...) + w_best * max(s(d), s(p1), ...)

so the copies of one answer rise and fall together, right behind the best of them, and an
answer found in several languages outranks one found in a single language. A document without
partners keeps its score (mean and best are its own), so a collection without translations
ranks as before, and a same-language (``mono``) pool is left alone. The scores blended are
the search's last ones (a reranker's, when there is one), so the blend is on their scale; the
partners are found with the stored document vectors, centred per language (the language-bias
correction's means: uncentred, each language's vectors share a direction that a threshold on
their cosine would have to allow for, language pair by language pair).

On XQuAD-R (six languages pooled; README, "Modes") it raises X-Y mAP@20 by about 0.16 for
the teacher and the student, with the language-bias correction, at the same P@1; MRR@10 drops
by about 0.03 (a wrong first answer now brings its translations with it). It is off by
default: the top 10 then holds fewer distinct answers, in more languages, which is what X-Y
asks for and not what every user wants.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vecplug.adapters.bias import UND, LanguageMeans, top_hits
from vecplug.adapters.stores.base import Candidate, StoreHit, hit_vectors

#: weights of (own score, mean over the group, best of the group); they sum to 1
WEIGHTS = (0.2, 0.3, 0.5)


def consensus_scores(scores: np.ndarray, vectors: np.ndarray, langs: Sequence[str | None],
                     threshold: float, weights: tuple[float, float, float] = WEIGHTS) -> np.ndarray:
    """New scores for candidates with ``scores``, unit ``vectors`` (centred per language) and
    ``langs`` (None counts as ``und``, a language of its own); ``threshold``: the cosine from
    which two of them in different languages are partners (``search.consensus_threshold``).
    See the module docstring."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = len(scores)
    if n < 2:
        return scores.copy()
    codes = [lang or UND for lang in langs]
    if len(codes) != n or len(vectors) != n:
        raise ValueError(f"{n} scores, {len(vectors)} vectors and {len(codes)} languages")
    vectors = np.asarray(vectors, dtype=np.float32)
    sims = vectors @ vectors.T
    _, lang_of = np.unique(np.asarray(codes), return_inverse=True)
    total, count, best = scores.copy(), np.ones(n), scores.copy()
    rows = np.arange(n)
    for lang in range(int(lang_of.max()) + 1):
        cols = np.flatnonzero(lang_of == lang)
        closest = cols[np.argmax(sims[:, cols], axis=1)]  # each candidate's closest in ``lang``
        partner = (sims[rows, closest] >= threshold) & (lang_of != lang)
        total += np.where(partner, scores[closest], 0.0)
        count += partner
        best = np.where(partner, np.maximum(best, scores[closest]), best)
    own, mean, top = weights
    return own * scores + mean * total / count + top * best


@dataclass(frozen=True)
class Consensus:
    """Translation consensus as a search applies it (``search.consensus*`` settings).

    ``means`` centre the documents to find partners (the language-bias correction's, whether
    or not the scores are centred); ``threshold`` is :func:`consensus_scores`'s; ``depth`` is
    the candidates of each language the first stage regroups (with a reranker, the reranker's
    list is regrouped instead).
    """

    means: LanguageMeans
    threshold: float
    depth: int

    def scores(self, scores: np.ndarray, centred: np.ndarray, langs: Sequence[str | None]) -> np.ndarray:
        """:func:`consensus_scores` of candidates whose vectors are already centred."""
        return consensus_scores(scores, centred, langs, self.threshold)

    def search(self, store: Any, vector: np.ndarray, k: int, langs: Sequence[str] | None,
               ef: int | None = None) -> list[StoreHit]:
        """The ``k`` best of a pooled search without the correction (plain cosine scores),
        regrouped: the best ``depth`` (at least ``k``) of each language of ``langs`` (None: the
        index's), regrouped before their records are read."""
        every = list(langs) if langs else list(self.means.by_lang)
        # no walk hints (bias.WALK_SHIFT): towards the raw query plus a language's mean they made
        # this search faster but lost much of what it regroups: of the exact consensus top 10
        # (consensus over each language's exact best), 0.941 -> 0.837 / 0.743 (shift 0.5 / 1) on
        # the Debian million, 0.977 -> 0.918 / 0.849 at 200,000
        # (benchmarks/results/modes_scale_debian.md, --consensus-shifts)
        pooled: list[Candidate] = store.candidates_per_language(vector, max(k, self.depth), every, ef=ef)
        if not pooled:
            return []
        lang_of = [c.lang for c in pooled]
        centred = self.means.centre(np.stack([c.vector for c in pooled]), lang_of)
        scores = self.scores(np.asarray([c.score for c in pooled]), centred, lang_of)
        return top_hits(store, pooled, scores, k)

    def regroup(self, store: object, hits: Sequence[StoreHit]) -> list[StoreHit]:
        """``hits`` (one query's candidates, best first) rescored, best first. A candidate whose
        vector is gone (a commit removed it since it was found) keeps its score, partnerless."""
        if len({h.record.lang or UND for h in hits}) < 2:
            return list(hits)  # one language: nobody has a partner
        found = hit_vectors(store, hits)
        have = [i for i, v in enumerate(found) if v is not None]
        scores = np.asarray([h.score for h in hits], dtype=np.float64)
        if len(have) > 1:
            langs = [hits[i].record.lang for i in have]
            centred = self.means.centre(np.stack([found[i] for i in have]), langs)  # centre() casts
            scores[have] = self.scores(scores[have], centred, langs)
        order = np.argsort(-scores, kind="stable")
        return [StoreHit(hits[i].record, float(scores[i]), hits[i].vector) for i in order]
