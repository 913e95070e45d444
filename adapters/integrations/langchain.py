"""LangChain: ``embed_query`` with the student, ``embed_documents`` with the document encoder.

>>> from vecplug.adapters.integrations.langchain import VecplugEmbeddings   # doctest: +SKIP
>>> emb = VecplugEmbeddings(index=".vecplug")       # the models of an existing vecplug index
"""
from __future__ import annotations

import os
from typing import Any

from vecplug.adapters.integrations import require

require("langchain")

from langchain_core.embeddings import Embeddings  # noqa: E402


class VecplugEmbeddings(Embeddings):
    """A LangChain ``Embeddings`` backed by a vecplug encoder pair.

    Give an ``index`` folder to embed in its space, or ``document``/``query`` model specs
    (default: me5-small and its registered student). A copy (``copy.deepcopy``) shares the
    loaded models; a pickled one (worker processes) loads the same models again, as
    LlamaIndex's does (given only an ``encoder``, its models' specs are recorded).
    """

    def __init__(self, *, index: str | os.PathLike[str] | None = None, document: str | None = None,
                 query: str | None = None, encoder: Any = None) -> None:
        from vecplug.embedders import load_encoder

        index, document, query = (None if v is None else os.fspath(v) for v in (index, document, query))
        self.encoder = encoder if encoder is not None else load_encoder(document, query, index=index)
        if encoder is not None and index is None and document is None and query is None:
            described = encoder.describe()
            document, query = described["document_encoder"], described["query_encoder"]
        self._specs = {"index": index, "document": document, "query": query}

    def __deepcopy__(self, memo: dict[int, Any]) -> "VecplugEmbeddings":
        # the models are read-only once loaded (and hold locks, which cannot be copied); the
        # specs go along, so that the copy pickles as the original does (an index's prefixes,
        # lengths and quantisation with it)
        copy = type(self).__new__(type(self))
        copy.encoder, copy._specs = self.encoder, dict(self._specs)
        return copy

    def __reduce__(self) -> tuple[Any, ...]:
        return _reloaded, (type(self), self._specs)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        from vecplug.embedders import encode_documents

        return encode_documents(self.encoder, texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encoder.encode_queries([text])[0].tolist()


def _reloaded(cls: type[VecplugEmbeddings], specs: dict[str, Any]) -> VecplugEmbeddings:
    """An unpickled :class:`VecplugEmbeddings`: the same models, loaded again."""
    return cls(**specs)
