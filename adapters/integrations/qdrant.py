"""Search a Qdrant collection that vecplug indexed, from a ``QdrantClient`` the user already has.

>>> from qdrant_client import QdrantClient                                   # doctest: +SKIP
>>> searcher = QdrantSearcher(QdrantClient(url="http://qdrant:6333"), "docs")
>>> searcher.search("Wie hoch ist der Everest?", k=5, mode="mono")
"""
from __future__ import annotations

from typing import Any

from vecplug.adapters.integrations import require


class QdrantSearcher:
    """Embeds queries as the collection's manifest says (its student by default) and searches it
    through the caller's client; language modes work through the ``lang`` payload index."""

    def __init__(self, client: Any, collection: str = "vecplug", *, query: str | None = None) -> None:
        require("qdrant")
        from vecplug.adapters.stores.qdrant import QdrantStore
        from vecplug.api import Index
        from vecplug.config import load_settings

        # the index is the caller's client's (no url, no folder: the store is given below)
        settings = load_settings(overrides={"model": {"query": query}})
        store = QdrantStore.open("client://", {"client": client, "collection": collection})
        # the settings' index folder is not this index: info() names the caller's collection
        self.index = Index(settings, store, writable=False, location=store.where)

    @property
    def encoder(self) -> Any:
        return self.index.encoder

    def embed_query(self, text: str) -> list[float]:
        """The query vector, for calling ``client.query_points`` yourself."""
        return self.index.encoder.encode_queries([text])[0].tolist()

    def search(self, query: str, k: int = 10, *, mode: str = "xy", lang: str | None = None,
               langs: Any = None, debias: bool | None = None, rerank: str | None = None,
               rerank_depth: int | None = None, ef: int | None = None,
               consensus: bool | None = None, rerank_gate: float | None = None) -> Any:
        """A :class:`vecplug.api.SearchResult` for ``query``; the arguments are
        :meth:`vecplug.api.Index.search`'s (``langs``: answers only in these languages)."""
        return self.index.search(query, k, mode=mode, lang=lang, langs=langs, debias=debias,
                                 rerank=rerank, rerank_depth=rerank_depth, ef=ef, consensus=consensus,
                                 rerank_gate=rerank_gate)

    def close(self) -> None:
        self.index.close()  # the caller's client stays open
