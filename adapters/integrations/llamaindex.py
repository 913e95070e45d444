"""LlamaIndex: query embeddings from the student, text embeddings from the document encoder."""
from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any, Callable, TypeVar

from vecplug.adapters.integrations import require

require("llamaindex")

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from pydantic import Field, PrivateAttr  # noqa: E402  (comes with llama-index-core)

#: texts per call to the document encoder (LlamaIndex's default, 10, is too few for vecplug's
#: length-sorted batches)
DEFAULT_BATCH_SIZE = 128

_T = TypeVar("_T")
_A = TypeVar("_A")

# LlamaIndex's aget_text_embedding_batch gathers every batch at once; the model already uses
# every core, so concurrent encodes only contend. Async calls take turns, waiting in the event
# loop (a lock taken inside the worker threads would hold the loop's default executor threads
# that the application's other to_thread work needs); synchronous callers are left as they are.
# Queries take turns among themselves only: behind the documents' queue, a query asked while
# an ingestion runs on the same loop waited for all of it (30 s for 1,500 texts)
_TURNS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]]" = weakref.WeakKeyDictionary()


async def _in_turn(side: str, fn: Callable[[_A], _T], arg: _A) -> _T:
    turns = _TURNS.setdefault(asyncio.get_running_loop(), {})
    async with turns.setdefault(side, asyncio.Lock()):
        return await asyncio.to_thread(fn, arg)


class VecplugEmbedding(BaseEmbedding):
    """A LlamaIndex ``BaseEmbedding`` backed by a vecplug encoder pair (see VecplugEmbeddings).

    ``index``, ``document`` and ``query`` are fields, so ``to_dict``/``from_dict`` and pickling
    (LlamaIndex's worker processes) load the same models again; given only an ``encoder``,
    its document and query models' specs are recorded (an index's own prefixes and lengths
    come back only with ``index``).
    """

    index: str | None = Field(default=None, description="vecplug index folder whose models embed")
    document: str | None = Field(default=None, description="document encoder spec")
    query: str | None = Field(default=None, description="query encoder spec")
    _encoder: Any = PrivateAttr()

    def __init__(self, *, index: str | os.PathLike[str] | None = None, document: str | None = None,
                 query: str | None = None, encoder: Any = None, **kwargs: Any) -> None:
        from vecplug.embedders import load_encoder

        # as the other integrations take them (a Path was a validation error, after the load)
        index, document, query = (None if v is None else os.fspath(v) for v in (index, document, query))
        enc = encoder if encoder is not None else load_encoder(document, query, index=index)
        described = enc.describe()
        if encoder is not None and index is None and document is None and query is None:
            document, query = described["document_encoder"], described["query_encoder"]
        kwargs.setdefault("model_name", f"vecplug:{described['document_encoder']}")
        kwargs.setdefault("embed_batch_size", DEFAULT_BATCH_SIZE)
        super().__init__(index=index, document=document, query=query, **kwargs)
        self._encoder = enc

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> "VecplugEmbedding":  # pydantic: no memo
        # a copy shares the loaded models: they are read-only once loaded, and hold locks,
        # which cannot be copied (pydantic's deep copy failed on them)
        return self.model_copy()

    @classmethod
    def class_name(cls) -> str:
        return "VecplugEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.encode_queries([query])[0].tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        from vecplug.embedders import encode_documents

        return encode_documents(self._encoder, texts).tolist()

    # async: the model runs in a worker thread (the event loop goes on), one batch per call
    # (LlamaIndex's default would gather one call per text), one call at a time
    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await _in_turn("query", self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await _in_turn("documents", self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await _in_turn("documents", self._get_text_embeddings, texts)
