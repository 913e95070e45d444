"""The teacher reranker: multi-stage ranking with the index's own document encoder.

The first stage encodes the query with the fast query encoder (typically a distilled
student) and searches the index. This stage re-encodes the query with the full document
encoder, the "teacher" the student was distilled from, and rescores the candidates exactly
against their stored vectors: the teacher's accuracy on a short list, at the cost of one
teacher forward pass per query (no document is re-encoded). ``teacher:int8`` runs that pass
with the teacher's weights in int8, as its own int8 queries take them (under torch
``indexer.encoder.TEACHER_QUERY_RECIPE``: every linear int8 but the first layer's FFN
down-projection): on a CPU without AMX 6.5 ms a reranked query against the float32 teacher's
21.6, at 99.5% of its reranking's X-Y mAP@20 (README "The rerank gate"). ``teacher:auto``
takes int8 there (float32 under torch on x86) and the float teacher elsewhere (bfloat16 with
AMX, where int8 in the documents' recipe gained nothing).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from vecplug.adapters.rerank import order_by_scores
from vecplug.adapters.rerank.base import Query, Reranker, RerankContext
from vecplug.adapters.stores.base import StoreHit


class TeacherReranker(Reranker):
    """Rescores candidates with the query as the document encoder embeds it.

    The query keeps the query side's prefix (``query: `` for E5) and maximum length, so the
    teacher sees it as it was trained to; scores come from ``context.score_vectors``, hence
    in the first stage's geometry (language-bias correction included when it is on).
    """

    name: ClassVar[str] = "teacher"
    #: ``teacher:int8`` sets ``quantize``
    spec_argument: ClassVar[str] = "quantize"

    def __init__(self, quantize: str | None = None) -> None:
        """``quantize``: None or ``none`` (the document encoder as loaded for documents, in
        ``model.precision``), ``int8`` (its int8 query weights, loaded on first use), or
        ``auto`` (int8 where the float teacher would run in float32 under torch on x86:
        :func:`vecplug.indexer.encoder.teacher_quantize_for`, resolved per encoder)."""
        if quantize not in (None, "none", "int8", "auto"):
            from vecplug.errors import ConfigError

            raise ConfigError(f"teacher reranker: unknown quantisation '{quantize}' "
                              "(known: teacher, teacher:none, teacher:int8, teacher:auto)")
        self.quantize = None if quantize == "none" else quantize
        #: what ``auto`` resolved to for the last encoder it ran with (None: not yet)
        self._resolved: str | None = None

    def warm_up(self, context: RerankContext) -> None:
        self._teacher(context)  # loads the model (lazily made)

    def _teacher(self, context: RerankContext) -> Any:
        """The encoder's teacher for this reranker's quantisation."""
        return context.encoder.teacher_queries(self._quantize(context))

    def _quantize(self, context: RerankContext) -> str | None:
        """This reranker's quantisation for the context's encoder (``auto`` resolved here)."""
        enc = context.encoder
        quantize = self.quantize
        if quantize == "auto":
            from vecplug.indexer.encoder import teacher_quantize_for

            quantize = teacher_quantize_for("auto", enc.precision, enc.runtime)
            self._resolved = quantize or "none"
        return quantize

    def encode_queries(self, texts: Sequence[str], context: RerankContext) -> np.ndarray:
        """The teacher's vectors for query ``texts``, one batched pass (from the query student's
        kept states when it shares layers with the teacher: ``Encoder.teacher_vectors``)."""
        return context.encoder.teacher_vectors(list(texts), self._quantize(context))

    def rerank(self, queries: Sequence[Query], candidates: Sequence[Sequence[StoreHit]],
               context: RerankContext) -> list[list[StoreHit]]:
        if len(queries) != len(candidates):
            raise ValueError(f"{len(queries)} queries but {len(candidates)} candidate lists")
        # queries without candidates are not worth a forward pass
        todo = [i for i, c in enumerate(candidates) if len(c)]
        vectors = self.encode_queries([queries[i].text for i in todo], context)
        out: list[list[StoreHit]] = [list(c) for c in candidates]
        for row, i in enumerate(todo):
            scores = np.asarray(context.score_vectors(vectors[row], candidates[i], queries[i].lang))
            scores = scores.reshape(-1)
            # NaN: the candidate's vector is gone (a commit removed it since the first stage)
            kept = [j for j in range(len(scores)) if not np.isnan(scores[j])]
            out[i] = order_by_scores([candidates[i][j] for j in kept], scores[kept])
        return out

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "model": "the index's document encoder", "quantize": self.quantize or "none"}
        if self.quantize == "auto" and self._resolved is not None:
            out["resolved"] = self._resolved  # what this machine ran: int8 or none
        return out
