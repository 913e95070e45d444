"""LangChain: ``embed_query`` with the student, ``embed_documents`` with the document encoder.

>>> from vecplug.adapters.integrations.langchain import VecplugEmbeddings   # doctest: +SKIP
>>> emb = VecplugEmbeddings(index=".vecplug")       # the models of an existing vecplug index
"""
from __future__ import annotations

from typing import Any

from vecplug.adapters.integrations import require

require("langchain")

from langchain_core.embeddings import Embeddings  # noqa: E402


class VecplugEmbeddings(Embeddings):
    """A LangChain ``Embeddings`` backed by a vecplug encoder pair.

    Give an ``index`` folder to embed in its space, or ``document``/``query`` model specs
    (default: me5-small and its registered student).
    """

    def __init__(self, *, index: str | None = None, document: str | None = None,
                 query: str | None = None, encoder: Any = None) -> None:
        from vecplug.embedders import load_encoder

        self.encoder = encoder if encoder is not None else load_encoder(document, query, index=index)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        from vecplug.embedders import encode_documents

        return encode_documents(self.encoder, texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encoder.encode_queries([text])[0].tolist()
