"""LlamaIndex: query embeddings from the student, text embeddings from the document encoder."""
from __future__ import annotations

from typing import Any

from vecplug.adapters.integrations import require

require("llamaindex")

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402  (comes with llama-index-core)


class VecplugEmbedding(BaseEmbedding):
    """A LlamaIndex ``BaseEmbedding`` backed by a vecplug encoder pair (see VecplugEmbeddings)."""

    _encoder: Any = PrivateAttr()

    def __init__(self, *, index: str | None = None, document: str | None = None,
                 query: str | None = None, encoder: Any = None, **kwargs: Any) -> None:
        from vecplug.embedders import load_encoder

        enc = encoder if encoder is not None else load_encoder(document, query, index=index)
        kwargs.setdefault("model_name", f"vecplug:{enc.describe()['document_encoder']}")
        super().__init__(**kwargs)
        self._encoder = enc

    @classmethod
    def class_name(cls) -> str:
        return "VecplugEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encoder.encode_queries([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._encoder.encode_documents([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encoder.encode_documents(list(texts)).tolist()
