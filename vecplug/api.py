"""The Python API (the CLI is a thin layer over it).

>>> import vecplug
>>> with vecplug.create_index("docs/", path=".vecplug") as index:   # doctest: +SKIP
...     report = index.report
>>> index = vecplug.open_index(".vecplug")                          # doctest: +SKIP
>>> for hit in index.search("Wie hoch ist der Everest?", k=5):     # doctest: +SKIP
...     print(hit.rank, hit.score, hit.lang, hit.source)
"""
from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vecplug._version import __version__
from vecplug.config import Settings, load_settings
from vecplug.errors import IndexNotFoundError, ModelMismatchError, VecplugError
from vecplug.indexer.pipeline import IndexReport
from vecplug.types import Document, Hit

DEFAULT_MODEL = "me5-small"


@dataclass
class SearchResult:
    """Hits of one query, with the language and mode it was answered in."""

    query: str
    lang: str | None
    mode: str
    hits: list[Hit]
    seconds: float

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, i: int) -> Hit:
        return self.hits[i]

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "lang": self.lang, "mode": self.mode,
                "seconds": self.seconds, "hits": [h.to_dict() for h in self.hits]}


def _store_target(settings: Settings) -> tuple[type, str, dict[str, Any]]:
    from vecplug.adapters.stores import get_store_class

    ix = settings.index
    name = "qdrant" if ix.url and ix.store == "hnswlib" else ix.store
    cls = get_store_class(name)
    if name == "hnswlib":
        return cls, ix.path, {"M": ix.hnsw_m, "ef_construction": ix.hnsw_ef_construction,
                              "ef_search": ix.hnsw_ef_search}
    options: dict[str, Any] = {"collection": ix.collection}
    if ix.api_key:
        options["api_key"] = ix.api_key
    return cls, ix.url or ix.path, options


class Index:
    """An open vecplug index: a vector store plus the encoders it was built with."""

    def __init__(self, settings: Settings, store: Any, writable: bool) -> None:
        self.settings = settings
        self.store = store
        self.writable = writable
        self._encoder: Any = None
        self._detector: Any = None
        self.report: IndexReport | None = None

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(cls, settings: Settings | None = None, *, writable: bool = False,
             create: bool = False) -> "Index":
        """Open the index the settings point at; with ``create``, make it if absent."""
        settings = settings or load_settings()
        store_cls, location, options = _store_target(settings)
        writable = writable or create
        if store_cls.exists(location, options):
            return cls(settings, store_cls.open(location, options, writable=writable), writable)
        if not create:
            raise IndexNotFoundError(f"no vecplug index at {location}; create one with: vecplug index PATH")
        index = cls(settings, None, True)
        encoder = index.encoder  # the manifest needs the model's dimension and checksum
        index.store = store_cls.create(location, encoder.dim, index._new_manifest(), options)
        return index

    def _new_manifest(self) -> dict[str, Any]:
        c = self.settings.corpus
        return {
            **self.encoder.describe(),
            "vecplug_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "corpus": {"chunk_tokens": c.chunk_tokens, "chunk_overlap": c.chunk_overlap,
                       "embed_fields": list(c.embed_fields)},
        }

    @property
    def manifest(self) -> dict[str, Any]:
        return self.store.manifest if self.store is not None else {}

    @property
    def encoder(self) -> Any:
        """The encoders the index was built with (loaded on first use, checked against the manifest)."""
        if self._encoder is None:
            from vecplug.indexer.encoder import Encoder

            from vecplug.indexer.models import DEFAULT_STUDENTS

            m = self.settings.model
            built = self.manifest
            document = m.document or built.get("document_encoder") or DEFAULT_MODEL
            # queries: the flag, else what the index was built with, else the student
            # registered for the document encoder (if any), else the document encoder
            query = m.query or built.get("query_encoder") or DEFAULT_STUDENTS.get(document)
            prefixes = {"query_prefix": m.query_prefix, "document_prefix": m.document_prefix}
            for key in prefixes:
                if prefixes[key] is None and key in built:
                    prefixes[key] = built[key]
            encoder = Encoder.from_specs(
                document, query, batch_tokens=m.batch_tokens, threads=m.threads,
                query_max_length=m.query_max_length, document_max_length=m.document_max_length,
                **prefixes)
            if built:
                check_encoder(built, encoder.describe())
            check_query_encoder(encoder.describe())
            self._encoder = encoder
        return self._encoder

    @property
    def detector(self) -> Any:
        if self._detector is None:
            from vecplug.indexer.langid import LanguageDetector

            self._detector = LanguageDetector()
        return self._detector

    # -- writing -----------------------------------------------------------

    def add_documents(self, documents: Iterable[Document], *, lang: str | None = None,
                      progress: bool = False) -> IndexReport:
        """Encode and store documents (replacing those with the same id); commits at the end."""
        from vecplug.adapters.stores import Record
        from vecplug.indexer import pipeline

        if not self.writable:
            raise VecplugError("the index was opened read-only")
        encoder = self.encoder
        return pipeline.run(
            documents, encoder, self.store, Record.from_document, self.detector.detect,
            lang=lang or self.settings.corpus.lang, manifest=self._manifest_update(),
            progress=progress, count_tokens=lambda: encoder.document.tokens_seen)

    def index_path(self, path: str | Path, *, lang: str | None = None,
                   progress: bool = False) -> IndexReport:
        """Read a folder (or one file) and index every document in it; bad input is reported."""
        from vecplug.indexer.corpus import CorpusOptions, CorpusReader

        root = Path(path)
        if not root.exists():
            raise VecplugError(f"{root} does not exist")
        c = self.settings.corpus
        tokenizer = self.encoder.document.tokenizer

        def offsets(text: str) -> list[tuple[int, int]]:
            return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]

        reader = CorpusReader(root, offsets, CorpusOptions(
            chunk_tokens=c.chunk_tokens, chunk_overlap=c.chunk_overlap, embed_fields=c.embed_fields,
            max_file_bytes=c.max_file_mb * 1024 * 1024))
        report = self.add_documents(reader.documents(), lang=lang, progress=progress)
        report.files = reader.files
        report.problems = reader.problems + report.problems
        self.report = report
        return report

    def _manifest_update(self) -> dict[str, Any]:
        return {"updated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "vecplug_version": __version__}

    # -- reading -----------------------------------------------------------

    def search(self, query: str, k: int | None = None, *, mode: str | None = None,
               lang: str | None = None) -> SearchResult:
        """The ``k`` best documents for ``query`` under ``mode`` (``xy`` or ``mono``)."""
        import numpy as np

        from vecplug.adapters.modes import target_languages

        if not query.strip():
            raise VecplugError("the query is empty")
        s = self.settings.search
        k = k or s.k
        mode = mode or s.mode
        encoder, detector = self.encoder, self.detector
        encoder.query  # the query model loads on first use: load it before timing
        t0 = time.perf_counter()
        qlang = lang or s.lang or detector.detect(query)
        langs = target_languages(mode, qlang)
        vector = encoder.encode_queries([query])[0]
        if not np.isfinite(vector).all() or float(np.linalg.norm(vector)) < 1e-6:
            raise VecplugError(f"the query encoder gave a non-finite or zero vector for {query!r}")
        hits = [Hit(h.record.id, float(h.score), h.record.text, h.record.lang, h.record.source,
                    h.record.payload, rank)
                for rank, h in enumerate(self.store.search(vector, k, langs), 1)]
        return SearchResult(query, qlang, mode, hits, time.perf_counter() - t0)

    def info(self) -> dict[str, Any]:
        """What the index holds and what it was built with."""
        return {"location": _store_target(self.settings)[1], "documents": self.store.count(),
                "languages": self.store.languages(), "manifest": self.manifest}

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_encoder(built: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse an encoder that differs from the one the index was built with."""
    checks = (("document_encoder_checksum", "document encoder", "document_encoder"),
              ("dim", "dimension", None), ("normalize", "normalisation", None),
              ("pooling", "pooling", None), ("document_prefix", "document prefix", None),
              ("query_prefix", "query prefix", None))
    built_proj, cur_proj = built.get("projection"), current.get("projection")
    if "projection" in built and (built_proj or {}).get("checksum") != (cur_proj or {}).get("checksum"):
        def show(p: dict[str, Any] | None) -> str:
            return f"a {p['dim']}-d projection from {p['by']}" if p else "no projection"

        raise ModelMismatchError(f"projection mismatch: the index was built with {show(built_proj)}, "
                                 f"but this run uses {show(cur_proj)}")
    for key, what, name in checks:
        if key in built and built[key] != current.get(key):
            left = f"{built.get(name)} ({built[key]})" if name else repr(built[key])
            right = f"{current.get(name)} ({current.get(key)})" if name else repr(current.get(key))
            raise ModelMismatchError(f"{what} mismatch: the index was built with {left}, "
                                     f"but this run uses {right}")


def check_query_encoder(current: dict[str, Any]) -> None:
    """A query encoder must be the document encoder or a student distilled from it."""
    if current["query_encoder_teacher_checksum"] != current["document_encoder_checksum"]:
        raise ModelMismatchError(
            f"query encoder {current['query_encoder']} was distilled from a teacher with checksum "
            f"{current['query_encoder_teacher_checksum']}, but the documents are encoded by "
            f"{current['document_encoder']} ({current['document_encoder_checksum']})")


def settings_for(path: str | None = None, **sections: dict[str, Any]) -> Settings:
    overrides = {k: dict(v) for k, v in sections.items()}
    if path is not None:
        overrides.setdefault("index", {})["path"] = path
    return load_settings(overrides=overrides)


def open_index(path: str | None = None, *, settings: Settings | None = None,
               writable: bool = False) -> Index:
    """Open an existing index (default ``.vecplug`` in the current folder)."""
    return Index.open(settings or settings_for(path), writable=writable)


def create_index(corpus: str | Path | None = None, *, path: str | None = None,
                 settings: Settings | None = None, progress: bool = False) -> Index:
    """Open or create an index for writing; with ``corpus``, index that folder into it."""
    index = Index.open(settings or settings_for(path), create=True)
    if corpus is not None:
        try:
            index.index_path(corpus, progress=progress)
        except BaseException:
            index.close()
            raise
    return index
