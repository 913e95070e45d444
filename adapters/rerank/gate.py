"""Which queries a reranker sees: all of them, or only those the first stage is unsure of.

A reranker that re-encodes the query (the teacher) costs more per query than the first stage
itself. Many queries do not need it: when the first stage's best answer stands clear of the
next one, a second opinion rarely changes the top. The gate measures that as a *margin* (the
score gap between the best and the second-best candidate in the query's language) and sends
to the reranker only the queries whose margin is below ``search.rerank_gate``.

The query's language, not the pooled list: in a pooled (X-Y) list an answer's translations
follow it closely, so the pooled gap between first and second is small whether the first
stage is sure or not. The margin is read from the first stage's ordinary top ``k``, at least
two (so a query the gate keeps from the reranker costs what a search without reranker costs;
only the ones it sends on are searched again to the rerank depth): when only one candidate of the query's language is
in it, the second lies below the list's last score, which bounds the margin from below. The
margin is in the first stage's scores (centred cosines when the language-bias correction is
on, plain cosines in ``mono``, where it does not apply), so a gate chosen for one does not
carry over to the other. Figures for me5-small's student on XQuAD-R are in the README.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from vecplug.adapters.stores.base import StoreHit


def margin(candidates: Sequence[StoreHit], query_lang: str | None) -> float:
    """How far the first stage's best answer leads, for one query's candidates (a top list):
    best minus second-best score among those in ``query_lang``; with one of them in the list,
    its score minus the list's lowest (the second is at most that: a lower bound); with none
    (or the language unknown), the pooled best minus second-best. ``inf`` with fewer than two
    candidates (nothing to reorder); a non-finite score counts as unsure (``-inf``)."""
    scores = [h.score for h in candidates]
    if len(scores) < 2:
        return math.inf
    if not all(math.isfinite(s) for s in scores):
        return -math.inf
    same = sorted((h.score for h in candidates if query_lang is not None and h.record.lang == query_lang),
                  reverse=True)
    if len(same) >= 2:
        return same[0] - same[1]
    if len(same) == 1:
        return same[0] - min(scores)
    first, second = sorted(scores, reverse=True)[:2]
    return first - second


def unsure(candidates: Sequence[Sequence[StoreHit]], query_langs: Sequence[str | None],
           gate: float | None) -> list[int]:
    """Positions of the queries the reranker should see: every one with candidates when
    ``gate`` is None, else those whose :func:`margin` is below ``gate``."""
    return [i for i, (c, lang) in enumerate(zip(candidates, query_langs))
            if len(c) and (gate is None or margin(c, lang) < gate)]
