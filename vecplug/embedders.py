"""The stable embedding surface for other stacks: queries with the student, documents with the
teacher, in the vector space of a vecplug index.

>>> q = vecplug.QueryEncoder(index=".vecplug")        # doctest: +SKIP
>>> d = vecplug.DocumentEncoder(index=".vecplug")     # doctest: +SKIP
>>> scores = d.encode(["Der Everest ist 8.849 m hoch."]) @ q.encode(["How tall is Everest?"])[0]
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_MODEL = "me5-small"


def encode_documents(encoder: Any, texts: Sequence[str]) -> np.ndarray:
    """``encoder.encode_documents(texts)``, warning once per encoder when some texts reach the
    document length limit: a framework's chunks (LlamaIndex's 1,024 tokens, LangChain splitters'
    4,000 characters) are often longer, and what is past the limit is never embedded, nor found."""
    before = getattr(encoder, "documents_cut", 0)
    vectors = encoder.encode_documents(texts)
    cut = getattr(encoder, "documents_cut", 0) - before
    if cut and not getattr(encoder, "warned_cut", False):
        encoder.warned_cut = True
        warnings.warn(f"{cut} of {len(texts)} texts reach the document encoder's limit "
                      f"({encoder.document_max_length} tokens): only their beginning is embedded. Split "
                      "texts into smaller chunks (about 200 tokens: the size vecplug's passages have), or "
                      "give a longer model.document_max_length", UserWarning, stacklevel=3)
    return vectors


def load_encoder(document: str | None = None, query: str | None = None, *,
                 index: str | None = None, settings: Any = None, **options: Any) -> Any:
    """The encoder pair (``vecplug.indexer.encoder.Encoder``) of an index, or of the given models.

    With ``index`` (an index folder), the models, prefixes and lengths are the index's own
    (``document``/``query`` may still override, and are checked against it). Without it,
    ``document`` defaults to me5-small and ``query`` to the student registered for it.
    ``options`` are model settings (``runtime="onnx"``, ``query_quantize="none"``, ``threads``...).
    """
    from vecplug.api import Index, check_query_encoder, settings_for
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.models import DEFAULT_STUDENTS, resolve_model

    if index is not None or settings is not None:
        s = settings or settings_for(index, model={"document": document, "query": query, **options})
        with Index.open(s) as opened:
            return opened.encoder
    if document is None and query is not None:
        info = resolve_model(query)
        document = info.teacher.spec if info.teacher is not None else query
    document = document or DEFAULT_MODEL
    encoder = Encoder.from_specs(document, query or DEFAULT_STUDENTS.get(document), **options)
    check_query_encoder(encoder.describe())
    return encoder


class _Side:
    _encoder: Any

    def __init__(self, model: str | None = None, *, index: str | None = None,
                 encoder: Any = None) -> None:
        if encoder is not None and (model is not None or index is not None):
            raise ValueError("give a model, an index or an encoder, not several")
        self._encoder = encoder if encoder is not None else self._load(model, index)

    def _load(self, model: str | None, index: str | None) -> Any:
        raise NotImplementedError

    @property
    def encoder(self) -> Any:
        """The underlying encoder pair (shared between a QueryEncoder and its DocumentEncoder)."""
        return self._encoder

    @property
    def dim(self) -> int:
        return int(self._encoder.dim)

    def describe(self) -> dict[str, Any]:
        return self._encoder.describe()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError


class QueryEncoder(_Side):
    """Embeds queries: with the index's query encoder (its student by default).

    ``model`` names a query encoder (a student, or the document encoder itself); ``index``
    takes everything from an index's manifest; ``encoder`` shares an already loaded pair.
    """

    def _load(self, model: str | None, index: str | None) -> Any:
        return load_encoder(query=model, index=index)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dim) float32 unit vectors."""
        return self._encoder.encode_queries(texts)

    def document_encoder(self) -> "DocumentEncoder":
        """The twin that embeds documents into the same space (the student's teacher)."""
        return DocumentEncoder(encoder=self._encoder)


class DocumentEncoder(_Side):
    """Embeds documents with the document encoder (the teacher), as ``vecplug index`` does."""

    def _load(self, model: str | None, index: str | None) -> Any:
        return load_encoder(document=model, index=index)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dim) float32 unit vectors (a warning when some are cut at the length limit)."""
        return encode_documents(self._encoder, texts)

    def query_encoder(self) -> QueryEncoder:
        return QueryEncoder(encoder=self._encoder)

