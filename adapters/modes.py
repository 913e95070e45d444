"""Retrieval modes (after the LAReQA settings) and the first stage of a search.

* ``xy``: one language-agnostic pool; the best answers in any language (X-Y).
* ``mono``: only documents in the query's language (X-X-mono), by a language filter.
* ``prefer``: the X-Y pool, with documents in the query's language ranked up by a fixed
  boost added to their score (``search.prefer_boost``, default 0.05 in cosine units): an
  answer in the user's language wins unless another language's is clearly better.

A query whose language is unknown (None, or ``und``: the detector's answer for short or unclear
text) has no language to prefer: ``prefer`` then ranks as ``xy`` (``mono`` refuses it).

Any mode but ``mono`` can be limited to chosen target languages (``search.langs``). With the
language-bias correction on (:mod:`vecplug.adapters.bias`), ``xy`` and ``prefer`` score by
centred cosine; ``mono`` is unaffected (inside one language the mean is a constant shift).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vecplug.adapters.bias import UND, LanguageMeans, centred_search, centred_search_batch, rescore
from vecplug.adapters.consensus import Consensus
from vecplug.adapters.stores.base import StoreHit, search, search_batch
from vecplug.errors import ConfigError, QueryError

MODES = {
    "xy": "cross-lingual: search every language",
    "mono": "same language: only documents in the query's language",
    "prefer": "every language, documents in the query's language ranked up by a boost",
}


def _known(query_lang: str | None) -> str | None:
    """The query's language, None when it is unknown (``und`` included): a language to prefer
    or to keep to. ``und`` also tags the documents of unknown language, which a query of
    unknown language has no reason to rank up."""
    return None if not query_lang or query_lang == UND else query_lang


def target_languages(mode: str, query_lang: str | None,
                     langs: Sequence[str] | None = None) -> list[str] | None:
    """Languages a query may be answered in under ``mode`` (None: all)."""
    if mode == "mono":
        if not _known(query_lang):
            raise QueryError("mono mode needs the query's language and it could not be detected; "
                             "give it with --lang")
        return [query_lang]
    if mode in MODES:
        return list(langs) if langs else None
    raise ConfigError(f"unknown mode '{mode}'; modes: {', '.join(MODES)}")


def first_stage(store: object, vector: np.ndarray, query_lang: str | None, mode: str, depth: int,
                langs: Sequence[str] | None = None,
                means: LanguageMeans | None = None, ef: int | None = None,
                consensus: Consensus | None = None) -> list[StoreHit]:
    """The ``depth`` best candidates for a query vector under ``mode``, best first.

    ``means`` switches the language-bias correction on (ignored in ``mono``). In ``prefer``
    the candidates are the union of the pooled and the same-language top ``depth``, so a
    same-language document the boost would promote is never missing from them. ``ef``: the
    approximate index's search breadth for this query (None: the index's setting).
    ``consensus`` regroups the pooled candidates by translation consensus (ignored in
    ``mono``); ``prefer``'s same-language additions, outside the pooled best, keep their scores.
    """
    pool = target_languages(mode, query_lang, langs)
    if mode == "mono":
        return search(store, vector, depth, pool, ef)  # type: ignore[arg-type]
    if means is not None:
        # the languages the means were kept for are the index's: no store round trip per query
        every = pool if pool is not None else list(means.by_lang)
        hits = centred_search(store, means, vector, query_lang, depth, every, ef, consensus)
    elif consensus is not None:
        hits = consensus.search(store, vector, depth, pool, ef)
    else:
        hits = search(store, vector, depth, pool, ef)  # type: ignore[arg-type]
    if mode == "prefer" and _known(query_lang) and (pool is None or query_lang in pool):
        seen = {h.record.id for h in hits}
        query = means.centre_query(vector, query_lang) if means is not None else vector
        extra = [h for h in search(store, query, depth, [query_lang], ef)  # type: ignore[arg-type]
                 if h.record.id not in seen]
        if means is not None:
            extra = rescore(store, means, vector, query_lang, extra)
        hits = sorted(hits + extra, key=lambda h: -h.score)
    return hits


def first_stage_batch(store: object, vectors: np.ndarray, query_langs: Sequence[str | None], mode: str,
                      depth: int, langs: Sequence[str] | None = None, means: LanguageMeans | None = None,
                      ef: int | None = None, consensus: Consensus | None = None) -> list[list[StoreHit]] | None:
    """:func:`first_stage` of many query vectors (languages ``query_langs``) in one store call,
    for pooled ``xy`` without consensus: without the correction, ``search_batch`` (the flat
    store answers it by one scan); with it, their exact top ``depth`` by centred cosine
    (``bias.centred_search_batch``: the flat store scans each language once). None otherwise,
    or from a store that answers query by query (hnswlib, Qdrant): the caller asks
    :func:`first_stage` for each."""
    if mode != "xy" or consensus is not None:
        return None
    pool = target_languages(mode, None, langs)
    if means is None:
        return search_batch(store, vectors, depth, pool, ef)  # type: ignore[arg-type]
    return centred_search_batch(store, means, vectors, query_langs, depth,
                                pool if pool is not None else list(means.by_lang))


#: candidates below which their scores' spread says nothing of a reranker's scale
MIN_SPREAD_SCORES = 5
#: the smallest spread (standard deviation) of first-stage cosines the boost's rescaling assumes
MIN_COSINE_SPREAD = 0.02


def boost_on_scale(boost: float, before: Sequence[StoreHit], after: Sequence[StoreHit]) -> float:
    """``boost`` (in first-stage cosine units) on a reranker's scale: times the ratio of the
    spreads (standard deviations) of the same candidates' scores after and before reranking.
    A cross-encoder's logits spread ten times wider than cosines, and 0.05 added to them moved
    nothing; a reranker scoring in cosines (teacher, fields) keeps about the boost given."""
    first = np.asarray([h.score for h in before], dtype=np.float64)
    then = np.asarray([h.score for h in after], dtype=np.float64)
    first, then = first[np.isfinite(first)], then[np.isfinite(then)]
    # a spread needs a few scores, and near-tied first-stage scores would blow the ratio up
    # (two candidates 0.001 apart made a boost of 500 logits): cosines spread at least this
    if min(len(first), len(then)) < MIN_SPREAD_SCORES or then.std() <= 1e-9:
        return boost
    return float(boost * then.std() / max(first.std(), MIN_COSINE_SPREAD))


def apply_preference(hits: Sequence[StoreHit], query_lang: str | None, boost: float,
                     keep_scores: bool = False) -> list[StoreHit]:
    """``prefer``: documents in the query's language get ``boost`` added; re-sorted, best first
    (a query of unknown language boosts none). ``keep_scores``: in that order, with their own
    scores (the candidates a reranker is to rescore)."""
    lang = _known(query_lang)

    def boosted(h: StoreHit) -> float:
        return h.score + boost if lang and h.record.lang == lang else h.score

    order = sorted(hits, key=lambda h: -boosted(h))
    return order if keep_scores else [StoreHit(h.record, boosted(h), h.vector) for h in order]
