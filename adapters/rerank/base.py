"""The contract every reranker implements.

A reranker is the optional second stage of a search: it rescores the top ``depth``
candidates of the first stage (a vector search with the fast query encoder) and reorders
them. It works on batches of queries so that evaluation and batch search pay model
overhead once.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from vecplug.adapters.stores.base import StoreHit


@dataclass(frozen=True)
class Query:
    """One query as the first stage saw it."""

    text: str
    #: detected or given language (None: unknown)
    lang: str | None
    #: the first-stage query vector (unit length, the index's space)
    vector: np.ndarray


@dataclass
class RerankContext:
    """What a reranker may use besides the candidates' own records.

    ``encoder`` is the index's :class:`vecplug.indexer.encoder.Encoder` (its ``document``
    side is the full document encoder, the "teacher"); ``store`` is the open
    :class:`~vecplug.adapters.stores.base.VectorStore`; ``score_vectors(query_vector,
    candidates, query_lang)`` returns the exact first-stage scores of the candidates' stored
    vectors for a query vector, with the index's language-bias correction applied when it is
    on, so that a reranker which re-embeds the query scores in the same geometry; NaN for a
    candidate that a commit removed since the first stage found it (its vector is gone).
    ``means``: the language means (:class:`vecplug.adapters.bias.LanguageMeans`) when the
    correction is on, None when off; a reranker that embeds vectors of its own centres them
    with these (``means.centre(vectors, langs)``) to score in the corrected geometry.
    """

    encoder: Any
    store: Any
    score_vectors: Callable[[np.ndarray, Sequence[StoreHit], str | None], np.ndarray]
    means: Any = None


class Reranker(ABC):
    """Rescores first-stage candidates; higher is better."""

    #: registry name, e.g. ``"teacher"``
    name: ClassVar[str]

    @abstractmethod
    def rerank(self, queries: Sequence[Query], candidates: Sequence[Sequence[StoreHit]],
               context: RerankContext) -> list[list[StoreHit]]:
        """For each query, its candidates with new scores, best first (same records, any subset
        order; none added, and none dropped but those removed from the index meanwhile)."""

    def warm_up(self, context: RerankContext) -> None:
        """Load models ahead of the first query (so that timings measure searching only)."""

    def describe(self) -> dict[str, Any]:
        """What the reranker is (name, model, checksum...), for reports."""
        return {"name": self.name}
