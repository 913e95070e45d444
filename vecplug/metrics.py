"""Retrieval metrics: pure functions of one ranked list of document ids and its judgements.

``ranked`` is a query's result list, best first. ``relevant`` is either a collection of
relevant ids or a mapping ``{doc id: grade}`` in which a grade > 0 means relevant (BEIR's qrels
convention; 0 means judged not relevant). A bare string is refused: it would silently be read as
a collection of characters.

Cut-off metrics look at ``ranked[:k]`` (``k`` >= 1); a query with no relevant document scores 0
(callers leave such queries out of their means). An id repeated in ``ranked`` counts at its
first rank only: a list from a third-party reranker that repeats a relevant document must not
score AP or nDCG above 1.

Language bias in a pooled multilingual setting (X-Y): :func:`same_language_share` of the top
10 beside :func:`expected_same_language_share` (the share of the query's relevant documents
that are in its language, what a language-blind ranker would put there on average), and
:func:`relevant_score_gap`, the mean score of the relevant same-language document(s) minus
the mean of the relevant other-language ones.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np

Relevance = Collection[str] | Mapping[str, int]


def relevant_ids(relevant: Relevance) -> set[str]:
    """The relevant ids of ``relevant`` (a collection, or grades of which > 0 count)."""
    if isinstance(relevant, str):
        raise TypeError("relevant must be a collection or mapping of ids, not a single string")
    if isinstance(relevant, Mapping):
        return {d for d, grade in relevant.items() if grade > 0}
    return set(relevant)


def _check_k(k: int) -> None:
    """Every cut-off metric refuses k < 1, whatever the ranking (not only when it gets to it)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")


def _first_ranks(ranked: Sequence[str], k: int | None = None) -> list[tuple[int, str]]:
    """``(rank, id)`` of ``ranked[:k]``, ranks from 1, each id at its first rank only: a later
    repeat is skipped without moving the ranks after it (as ml_metrics' AP does)."""
    seen: set[str] = set()
    out = []
    for rank, item in enumerate(ranked[:k] if k is not None else ranked, 1):
        if item not in seen:
            seen.add(item)
            out.append((rank, item))
    return out


def average_precision_at_k(ranked: Sequence[str], relevant: Relevance, k: int = 20) -> float:
    """AP@k as LAReQA defines it (their mAP@20): the precision at each rank <= k that holds a
    relevant document, summed and divided by ``min(#relevant, k)``.

    The same definition as ``benchmarks/xquad_r.py`` has always used, so figures compare. (The
    divisor is ``min(R, k)``, not R: a query with more relevant documents than k can still
    score 1.)
    """
    _check_k(k)
    rel = relevant_ids(relevant)
    if not rel:
        return 0.0
    hits, total = 0, 0.0
    for rank, item in _first_ranks(ranked, k):
        if item in rel:
            hits += 1
            total += hits / rank
    return total / min(len(rel), k)


def average_precision(ranked: Sequence[str], relevant: Relevance) -> float:
    """Un-cut AP over a whole ranking: precision at each relevant document's rank, over the
    number of relevant documents (those missing from ``ranked`` count 0)."""
    rel = relevant_ids(relevant)
    if not rel:
        return 0.0
    hits, total = 0, 0.0
    for rank, item in _first_ranks(ranked):
        if item in rel:
            hits += 1
            total += hits / rank
    return total / len(rel)


def ndcg_at_k(ranked: Sequence[str], relevant: Relevance, k: int = 10) -> float:
    """nDCG@k with graded gains: DCG = sum over ranks r <= k of grade / log2(r + 1), divided by
    the DCG of the ideal ordering of the judged grades.

    Linear gains (the grade itself), as trec_eval and BEIR compute it; a plain collection of
    ids gives every relevant document grade 1.
    """
    _check_k(k)
    if isinstance(relevant, str):
        relevant_ids(relevant)  # raises
    grades = ({d: g for d, g in relevant.items() if g > 0} if isinstance(relevant, Mapping)
              else {d: 1 for d in relevant})
    top = _first_ranks(ranked, k)
    if not grades:
        return 0.0
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = sum(grades.get(item, 0) * discounts[rank - 1] for rank, item in top)
    ideal = sorted(grades.values(), reverse=True)[:k]
    idcg = float(np.dot(ideal, discounts[:len(ideal)]))
    return float(dcg / idcg)


def reciprocal_rank_at_k(ranked: Sequence[str], relevant: Relevance, k: int = 10) -> float:
    """RR@k: 1 / the rank of the first relevant document within the top k, else 0 (MRR@k is
    its mean over queries)."""
    _check_k(k)
    rel = relevant_ids(relevant)
    for rank, item in _first_ranks(ranked, k):
        if item in rel:
            return 1.0 / rank
    return 0.0


def recall_at_k(ranked: Sequence[str], relevant: Relevance, k: int = 20) -> float:
    """Share of the relevant documents that are in the top k."""
    _check_k(k)
    rel = relevant_ids(relevant)
    if not rel:
        return 0.0
    return len(rel & {item for _, item in _first_ranks(ranked, k)}) / len(rel)


def precision_at_1(ranked: Sequence[str], relevant: Relevance) -> float:
    """1 if the first result is relevant, else 0."""
    rel = relevant_ids(relevant)
    return float(bool(ranked) and ranked[0] in rel)


# -- language bias ----------------------------------------------------------------------------

def same_language_share(hit_langs: Sequence[str | None], query_lang: str | None, k: int = 10) -> float:
    """Share of the top ``k`` results (of those returned, if fewer) in the query's language;
    0 for an empty list."""
    top = hit_langs[:k]
    if not top:
        return 0.0
    return sum(lang == query_lang for lang in top) / len(top)


def expected_same_language_share(relevant_langs: Sequence[str | None], query_lang: str | None) -> float:
    """Share of the query's relevant documents that are in its language: the same-language share
    a ranking that ignores language would give the relevant documents. For XQuAD-R with L
    pooled languages (one relevant sentence per language) it is 1/L."""
    if not relevant_langs:
        return 0.0
    return sum(lang == query_lang for lang in relevant_langs) / len(relevant_langs)


def relevant_score_gap(same_language_scores: Sequence[float],
                       other_language_scores: Sequence[float]) -> float | None:
    """Mean score of the relevant same-language document(s) minus the mean score of the relevant
    other-language documents: how much the scorer favours the query's language among answers
    that are equally right. None when either side is empty."""
    if len(same_language_scores) == 0 or len(other_language_scores) == 0:
        return None
    return float(np.mean(same_language_scores) - np.mean(other_language_scores))


def mean(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are not None (or NaN); None when there are none."""
    kept = [float(v) for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(kept)) if kept else None
