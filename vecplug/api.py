"""The Python API (the CLI is a thin layer over it).

>>> import vecplug
>>> with vecplug.create_index("docs/", path=".vecplug") as index:   # doctest: +SKIP
...     report = index.report
>>> index = vecplug.open_index(".vecplug")                          # doctest: +SKIP
>>> for hit in index.search("Wie hoch ist der Everest?", k=5):     # doctest: +SKIP
...     print(hit.rank, hit.score, hit.lang, hit.source)
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import operator
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vecplug._version import __version__
from vecplug.config import DEFAULT_COLLECTION, MAX_COUNT, Settings, load_settings, normalise_langs
from vecplug.config import rerank_gate as check_gate
from vecplug.errors import ConfigError, IndexNotFoundError, ModelError, ModelMismatchError, QueryError, VecplugError
from vecplug.indexer.pipeline import IndexReport
from vecplug.types import Document, Hit, lang_code

DEFAULT_MODEL = "me5-small"


@dataclass
class SearchResult:
    """Hits of one query, with the language and mode it was answered in."""

    query: str
    lang: str | None
    mode: str
    hits: list[Hit]
    #: this query's share of the time spent (encode, search, rerank)
    seconds: float
    #: the first-stage query vector
    vector: Any = field(default=None, repr=False)
    #: whether a reranker rescored this query's candidates (None: no reranker asked; False:
    #: not rescored, because the gate, ``search.rerank_gate``, found the first stage sure
    #: enough, or because the first stage found nothing)
    reranked: bool | None = None

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, i: int) -> Hit:
        return self.hits[i]

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "lang": self.lang, "mode": self.mode,
                "seconds": self.seconds, "reranked": self.reranked,
                "hits": [h.to_dict() for h in self.hits]}


def _store_target(settings: Settings, name: str | None = None) -> tuple[type, str, dict[str, Any]]:
    from vecplug.adapters.stores import get_store_class

    ix = settings.index
    # a URL means a Qdrant server, over a folder's store named by a layer below it (the
    # settings drop the URL when a layer above names one)
    name = name or ("qdrant" if ix.url and ix.store in ("hnswlib", "flat") else ix.store)
    cls = get_store_class(name)
    if name in ("hnswlib", "flat", "qdrant") and not ix.url and ix.collection != DEFAULT_COLLECTION:
        # ignored, two corpora given two collections would merge into the folder's one index
        raise ConfigError(f"index.collection ({ix.collection!r}) names a collection on a Qdrant server "
                          "(index.url); an index folder holds one index: give each its own folder (--index)")
    if name == "hnswlib":
        # only the parameters set: the store takes the others from the index's manifest (what
        # it was built and tuned with), else its defaults; passing defaults would override those
        given = {"M": ix.hnsw_m, "ef_construction": ix.hnsw_ef_construction, "ef_search": ix.hnsw_ef_search,
                 "centred": ix.hnsw_centred}
        # "~/idx" from YAML or the environment (no shell expands it) made a folder named "~"
        return cls, os.path.expanduser(ix.path), {key: value for key, value in given.items() if value is not None}
    if name == "flat":  # exact search: no graph parameters (its batch scan's precision: auto)
        return cls, os.path.expanduser(ix.path), {}
    options: dict[str, Any] = {"collection": ix.collection}
    if ix.api_key:
        options["api_key"] = ix.api_key
    if ix.reader_copy:
        options["snapshot"] = True
    return cls, ix.url or os.path.expanduser(ix.path), options


#: documents of a folder compared with the index's to tell its first folder, moved (of at most
#: RELOCATION_SCAN read from its start: documents added since are not compared)
RELOCATION_SAMPLE = 16
RELOCATION_SCAN = 1024


#: the manifest value of an index made before a key was recorded (a string: values are copies)
_UNRECORDED = "\0unrecorded"


def _source_kind(built_from: str | None) -> str:
    """What an index's first source was, for an index made before it was recorded: a file
    when it is one (or, gone, was named as one), else a folder."""
    if built_from is None:
        return "folder"
    from vecplug.indexer.corpus import SUFFIXES

    if os.path.isdir(built_from):
        return "folder"
    return "file" if os.path.isfile(built_from) or built_from.lower().endswith(SUFFIXES) else "folder"


def _query_lang(value: str | None, i: int, count: int) -> str | None:
    """A query's given language as the index keeps codes; refused with its query named."""
    try:
        return lang_code(value)
    except ValueError as exc:
        raise ConfigError(f"the query's language: {exc}" if count == 1 else f"query {i}'s language: {exc}") from None


def _integer(name: str, value: Any) -> int:
    """``value`` as an int (numpy integers too); a float, a string or a bool refused."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, not {type(value).__name__}") from None


def _blank(text: str) -> bool:
    """Nothing to search for: only white space and invisible format characters (bidi marks
    such as U+200F, zero-width joiners), which a copied right-to-left query may carry."""
    import unicodedata

    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def _undecodable(text: str) -> bool:
    """A NUL or a lone surrogate (an undecodable byte of a shell argument): the language
    detector and the tokenizer fail on them with a TypeError."""
    from vecplug.indexer.corpus import _BAD_TEXT

    return _BAD_TEXT.search(text) is not None


def _store_in_folder(folder: str) -> str | None:
    """The built-in store whose index is in ``folder``, if any (none of them needs its
    engine to tell)."""
    from vecplug.adapters.stores import get_store_class
    from vecplug.adapters.stores.registry import BUILTIN_STORES

    for name in BUILTIN_STORES:
        if get_store_class(name).exists(folder, {}):
            return name
    return None


class Index:
    """An open vecplug index: a vector store plus the encoders it was built with."""

    def __init__(self, settings: Settings, store: Any, writable: bool, *,
                 location: str | None = None) -> None:
        self.settings = settings
        self.store = store
        self.writable = writable
        #: what :meth:`info` names as the index's location (default: the settings' folder or URL)
        self.location = location
        self._encoder: Any = None
        self._detector: Any = None
        self._stats: Any = None
        self._means: Any = None
        self._stats_commit: Any = None  # the store's commit token when the stats were read
        self._rerankers: dict[str, Any] = {}
        #: a run stopped in the middle of a batch's writes: this handle writes no more
        self._torn = False
        #: one write at a time through this handle: each takes the language statistics of the
        #: last commit and commits its own, so two at once would drop each other's documents
        #: from them (the records stay; the correction's means and counts would not)
        self._writing = threading.RLock()
        self.report: IndexReport | None = None

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(cls, settings: Settings | None = None, *, writable: bool = False,
             create: bool = False) -> "Index":
        """Open the index the settings point at; with ``create``, make it if absent."""
        settings = settings or load_settings()
        store_cls, location, options = _store_target(settings)
        writable = writable or create
        if not store_cls.exists(location, options) and not settings.index.url:
            # a folder holds the index of the store it was made with, whatever the setting
            # says: open that one rather than report no index (or make a second one over it)
            store_cls, location, options = _store_target(settings, _store_in_folder(location) or store_cls.name)
        if store_cls.exists(location, options):
            return cls(settings, store_cls.open(location, options, writable=writable), writable)
        if not create:
            raise IndexNotFoundError(f"no vecplug index at {location}; create one with: vecplug index PATH")
        store_cls.check_location(location, options)  # before a model is built and loaded for it
        index = cls(settings, None, True)
        encoder = index.encoder  # the manifest needs the model's dimension and checksum
        index.store = store_cls.create(location, encoder.dim, index._new_manifest(), options)
        return index

    def _new_manifest(self) -> dict[str, Any]:
        c = self.corpus_settings(self.encoder.document_room())
        return {
            **self.encoder.describe(),
            "vecplug_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "corpus": {**c, "embed_fields": list(c["embed_fields"])},
            "debias": self.settings.index.debias,
            # no folder indexed yet (documents given through the API may come first): the
            # first folder indexed records itself here. Absent: an index of a vecplug that
            # did not record it
            "source_root": None,
        }

    def corpus_settings(self, room: int | None = None) -> dict[str, Any]:
        """``chunk_tokens``, ``chunk_overlap`` and ``embed_fields`` as a run cuts and reads
        documents: each as set, else as the index was built (cut otherwise, every document
        would be encoded again), else the defaults of a new index. The overlap goes with the
        passage length: passages of another length than the index's take the default overlap
        (32 tokens, at most a quarter of a passage) unless one is set.

        ``room``: the tokens of a passage the document encoder keeps. The default passage
        length is cut to it; a length set above it is refused: the end of every passage would
        never be embedded, nor found. An index's own length above it (built before passages
        were fitted) is kept: another would cut and encode every passage again (a run counts
        the passages it cuts short, :attr:`IndexReport.cut`)."""
        from vecplug.config import CORPUS_DEFAULTS

        built = (self.manifest.get("corpus") or {}) if self.store is not None else {}
        c = self.settings.corpus
        tokens = int(c.chunk_tokens or built.get("chunk_tokens") or CORPUS_DEFAULTS["chunk_tokens"])
        if room is not None and tokens > room:
            if c.chunk_tokens and c.chunk_tokens != built.get("chunk_tokens"):  # the index's own: kept
                raise ConfigError(
                    f"corpus.chunk_tokens ({tokens} tokens) is more than the document encoder keeps of a "
                    f"passage: {room} tokens (model.document_max_length {self.encoder.document_max_length}, "
                    f"less the prefix and special tokens); the rest of every passage would never be "
                    f"embedded. Set --chunk-tokens {room} or less (an existing index then cuts and encodes "
                    f"its passages anew), or, for a new index, a longer model.document_max_length")
            if not built.get("chunk_tokens"):
                tokens = room
        if c.chunk_overlap is not None:
            overlap = c.chunk_overlap
        elif built.get("chunk_tokens") == tokens and isinstance(built.get("chunk_overlap"), int):
            overlap = built["chunk_overlap"]
        else:
            overlap = min(CORPUS_DEFAULTS["chunk_overlap"], tokens // 4)
        if not 0 <= overlap < tokens:
            raise ConfigError(f"corpus.chunk_overlap ({overlap}) must be smaller than corpus.chunk_tokens ({tokens})")
        if overlap > tokens // 2:
            if c.chunk_overlap is not None:  # passages would be cut with half of it, without a word
                raise ConfigError(f"corpus.chunk_overlap ({overlap}) must be at most half of corpus.chunk_tokens "
                                  f"({tokens}): {tokens // 2} or less")
            overlap = tokens // 2  # an index's, recorded before this was checked: what its passages were cut with
        fields = c.embed_fields if c.embed_fields is not None else built.get("embed_fields")
        return {"chunk_tokens": tokens, "chunk_overlap": overlap,
                "embed_fields": tuple(fields or CORPUS_DEFAULTS["embed_fields"])}

    @property
    def manifest(self) -> dict[str, Any]:
        return self.store.manifest if self.store is not None else {}

    @property
    def encoder(self) -> Any:
        """The encoders the index was built with (loaded on first use, once whichever threads
        ask at once; checked against the manifest)."""
        if self._encoder is None:
            from vecplug.indexer.models import LOAD_LOCK

            with LOAD_LOCK:
                if self._encoder is None:
                    self._encoder = self._load_encoder()
        return self._encoder

    def _load_encoder(self) -> Any:
        from vecplug.indexer.encoder import Encoder
        from vecplug.indexer.models import DEFAULT_STUDENTS

        m = self.settings.model
        built = self.manifest
        document = m.document or built.get("document_encoder") or DEFAULT_MODEL
        if built and m.document:
            # another document encoder is refused naming both before any query encoder is
            # paired with it (the index's student would fail first, on its dimension)
            from vecplug.indexer.models import resolve_model

            given = resolve_model(m.document)
            check_encoder({k: built[k] for k in ("document_encoder", "document_encoder_checksum") if k in built},
                          {"document_encoder": given.spec, "document_encoder_checksum": given.checksum})
        # queries: the flag, else what the index was built with, else the student
        # registered for the document encoder (if any), else the document encoder
        query = m.query or built.get("query_encoder") or DEFAULT_STUDENTS.get(document)
        # prefixes: the setting, else the index's, else the model's; lengths the same way
        # (the encoder takes the index's as recorded: it may predate the model's cap)
        given = {"query_prefix": m.query_prefix, "document_prefix": m.document_prefix,
                 "query_max_length": m.query_max_length, "document_max_length": m.document_max_length}
        for key in ("query_prefix", "document_prefix"):
            if given[key] is None and built.get(key) is not None:
                given[key] = built[key]
        recorded = {k: built[k] for k in ("query_max_length", "document_max_length")
                    if isinstance(built.get(k), int)}
        try:
            encoder = Encoder.from_specs(
                document, query, batch_tokens=m.batch_tokens, threads=m.threads,
                query_quantize=m.query_quantize,
                document_quantize=m.document_quantize or built.get("document_quantize"),
                runtime=m.runtime or built.get("runtime") or "torch",
                document_int8_version=built_int8_version(built), recorded_lengths=recorded, trace=m.trace,
                precision=m.precision, compile=m.compile,
                **{k: v for k, v in given.items() if v is not None})
        except ModelError as exc:
            recorded_specs = list(dict.fromkeys(
                spec for what, spec, own in (("document", document, m.document), ("query", query, m.query))
                if spec and not own and spec == built.get(f"{what}_encoder")))
            if not recorded_specs:
                raise
            # a model moved or deleted after indexing: say that it is the index's own
            raise ModelError(f"{exc} (the index at {self.location or self.settings.index.path} was built "
                             f"with {' and '.join(recorded_specs)}: put the model back there, "
                             "or give it with --model / --query-encoder)") from None
        if built:
            from vecplug.indexer.encoder import max_tokens

            if "document_max_length" in recorded:  # texts were never cut past the model's maximum
                built = {**built, "document_max_length": min(
                    recorded["document_max_length"], max_tokens(encoder.document_info))}
            check_encoder(built, encoder.describe())
        check_query_encoder(encoder.describe())
        return encoder

    @property
    def detector(self) -> Any:
        if self._detector is None:
            from vecplug.indexer.langid import LanguageDetector
            from vecplug.indexer.models import LOAD_LOCK

            with LOAD_LOCK:
                if self._detector is None:
                    self._detector = LanguageDetector()
        return self._detector

    # -- writing -----------------------------------------------------------

    def add_documents(self, documents: Iterable[Document], *, lang: str | None = None,
                      progress: bool = False) -> IndexReport:
        """Encode and store documents (replacing those with the same id); commits at the end."""
        if isinstance(documents, (str, bytes, Document)) or not isinstance(documents, Iterable):
            raise VecplugError(f"add_documents takes a list of vecplug.Document, not {type(documents).__name__}")

        def check(i: int, doc: Any) -> Document:
            if not isinstance(doc, Document):  # a text where a Document belongs: AttributeError
                raise VecplugError(f"documents[{i}] is {type(doc).__name__}, not a vecplug.Document "
                                   "(Document(id=..., text=..., source=...))")
            return doc

        if isinstance(documents, Sequence):  # a list is checked whole, before anything is written
            documents = [check(i, doc) for i, doc in enumerate(documents)]
        else:  # a stream as it comes (what was written before stays staged, with its statistics)
            documents = (check(i, doc) for i, doc in enumerate(documents))
        return self._add(documents, lang=lang, progress=progress)

    def delete_documents(self, ids: Iterable[str]) -> int:
        """Remove the documents with these ids (ids not in the index are ignored) and commit;
        returns how many were removed. The language statistics of the bias correction are
        kept in step."""
        self._check_whole()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise VecplugError(f"delete_documents takes a list of ids, not {type(ids).__name__}")
        ids = list(ids)
        other = next((i for i, rid in enumerate(ids) if not isinstance(rid, str)), None)
        if other is not None:
            raise VecplugError(f"ids[{other}] is {type(ids[other]).__name__}, not a string")
        from vecplug.indexer.pipeline import remove, stamped

        with self._writing:
            try:
                records = self.store.get(list(dict.fromkeys(ids)))
                if records:
                    stats = self.language_stats
                    remove(self.store, records, stats)
                    self.store.commit(stamped({"vecplug_version": __version__}, stats))
            finally:
                self._stats = self._means = None
        return len(records)

    def _check_whole(self) -> None:
        if not self.writable:
            raise VecplugError("the index was opened read-only")
        if self._torn:
            raise VecplugError("an earlier run through this handle stopped in the middle of its writes: "
                               "open the index again (its last commit is intact)")

    def _tear(self) -> None:
        self._torn = True

    def _add(self, documents: Iterable[Document], *, lang: str | None, progress: bool,
             manifest: dict[str, Any] | None = None, prune: bool = False,
             keep_sources: Any = None, owns: Any = None, may_own: Any = None) -> IndexReport:
        from vecplug.adapters.stores import Record
        from vecplug.indexer import pipeline

        self._check_whole()
        encoder = self.encoder
        with self._writing:
            try:
                return pipeline.run(
                    documents, encoder, self.store, Record.from_document, self.detector.detect,
                    lang=lang or self.settings.corpus.lang,
                    manifest={"vecplug_version": __version__, **(manifest or {})},
                    progress=progress, count_tokens=lambda: encoder.document.tokens_seen,
                    stats=self.language_stats, prune=prune, keep_sources=keep_sources, owns=owns,
                    may_own=may_own, on_torn=self._tear)
            finally:
                # a run commits what it finished, even when it fails: the statistics are re-read
                # from the commit when next needed
                self._stats = self._means = None

    def index_path(self, path: str | Path, *, lang: str | None = None,
                   progress: bool = False) -> IndexReport:
        """Read a folder (or one file) and index every document in it; bad input is reported.

        Re-running on the same folder brings the index up to date: new and edited documents
        are encoded, unchanged ones skipped (a record without an id, named by its line, that
        lines above it moved takes its new line with the vector it had), and documents whose
        file is gone (or no longer has them) removed; files that cannot be read this time keep
        their last good version.
        The first folder's documents are named by their paths inside it; a subfolder or a file
        of it given alone updates just its own documents there. Another folder given to the
        same index is added under its absolute path (``/abs/folder/a.txt#0``), so the two never
        replace each other, and kept up to date the same way by its own runs (a file given
        alone: only its own documents). The first folder moved or renamed (gone from its old
        path) is recognised by its documents (relative ids and texts the index holds) and stays
        the first; a copy of it while it is still there is another folder. A folder holding the
        first folder (or first file) becomes the first: the documents held are renamed as it
        names them, vectors kept (and other folders' inside it too). Documents added with
        :meth:`add_documents` are left alone by folder runs unless their source names a file of
        the first folder (a relative path ending in .txt, .md, .jsonl or .csv).
        """
        with self._writing:  # (its renames too: one write at a time, as in _add)
            return self._index_path(path, lang=lang, progress=progress)

    def _index_path(self, path: str | Path, *, lang: str | None, progress: bool) -> IndexReport:
        from dataclasses import replace
        from itertools import chain

        from vecplug.indexer.corpus import SUFFIXES, CorpusOptions, CorpusReader

        self._check_whole()  # before anything is read or renamed
        root, source_root = _corpus_root(path)
        try:
            lang = lang_code(lang)
        except ValueError as exc:
            raise ConfigError(f"the documents' language: {exc}") from None
        room = self.encoder.document_room()
        c, cut = self.settings.corpus, self.corpus_settings(room)
        reader = CorpusReader(root, self.encoder.document.offsets, CorpusOptions(
            chunk_tokens=cut["chunk_tokens"], chunk_overlap=cut["chunk_overlap"], embed_fields=cut["embed_fields"],
            max_file_bytes=c.max_file_mb * 1024 * 1024, room=room))
        # None: no folder indexed yet (documents given through the API only); unrecorded: an
        # index of a vecplug that did not record its first folder
        recorded = self.store.manifest_value("source_root", _UNRECORDED)
        built_from = None if recorded == _UNRECORDED else recorded
        built_kind = self.store.manifest_value("source_kind") or _source_kind(built_from)
        manifest: dict[str, Any] = {"corpus": {**cut, "embed_fields": list(cut["embed_fields"])}}
        documents: Iterable[Document] = reader.documents()
        if not (lang or c.lang):
            from vecplug.indexer.langid import one_language_per_file

            documents = one_language_per_file(documents, self.detector.detect)
        kind = "folder" if root.is_dir() else "file"
        first = built_from == source_root or (built_from is None and (recorded is None or self.store.count() == 0))
        if built_from is None and not first:
            # an index of a vecplug that did not record its first folder: its documents have
            # their ids relative to it. This folder is that one when it names them so, with
            # their texts (as for a moved folder: another folder that shares a file name must
            # not become the first and prune the rest); named by absolute path, every document
            # would be encoded again beside the old ones, and those kept for good
            rest = iter(documents)
            first, head = self._moved_here(rest)
            documents = chain(head, rest)
        if (not first and built_from is not None and not os.path.lexists(built_from)
                and kind == built_kind):
            # the first folder moved (renamed, mounted elsewhere): its documents are here under
            # their relative ids with the same text; named by absolute path they would all be
            # encoded again, beside the old ones. Only when it is gone from where it was, and
            # only a folder for a folder: a copy of it, or one file of it given alone, would
            # match as well, and taken for the first folder would prune the rest of it
            rest = iter(documents)
            first, head = self._moved_here(rest)
            documents = chain(head, rest)
        if not first and built_from is not None and kind == "folder":
            # a folder holding the first folder (or the folder of a first file): its documents
            # would be read again under new names beside the old ones, and the old ones kept
            # for good (no later run owns them). It becomes the first folder: the documents
            # already held are renamed as it names them, with their vectors
            old_base = built_from if built_kind == "folder" else os.path.dirname(built_from)
            inside = os.path.relpath(built_from, source_root).split(os.sep)
            # not through a hidden folder or file: the reader skips those, so the renamed
            # documents would be pruned (it stays another folder, as before)
            if Path(old_base).is_relative_to(source_root) and not any(p.startswith(".") and p not in (".", "..")
                                                                      for p in inside):
                # read before the renames (which keep vectors and languages: the statistics
                # stay): after them, a server's mark of uncommitted writes would have them
                # fitted again from every stored vector
                stats = self.language_stats
                self._rebase(source_root, os.path.relpath(old_base, source_root))
                # committed at once with the folder that names them: a run that fails or is
                # interrupted later leaves renamed documents under the root that names them
                from vecplug.indexer.pipeline import stamped

                self.store.commit(stamped({"vecplug_version": __version__, **manifest, "source_root": source_root,
                                           "source_kind": kind}, stats))
                first = True
        if first:
            manifest["source_root"], manifest["source_kind"] = source_root, kind

            def owns(record: Any) -> bool:  # a file of this folder, not another's or the API's
                return not os.path.isabs(record.source) and Path(record.source).suffix.lower() in SUFFIXES

            def may_own(rid: str) -> bool:
                return not rid.startswith("/")

            def keep() -> set[str]:
                return set(reader.unread)
        else:
            folder = kind == "folder"  # once: owns runs for every record a prune reads
            base = source_root if folder else str(Path(source_root).parent)
            # a part of the first folder (a subfolder or file of it given alone) is named as the
            # first folder names it, so its run updates those documents; anything else by its
            # absolute path, so two folders never replace each other's documents
            inside = (built_from is not None and built_kind == "folder"
                      and Path(source_root).is_relative_to(built_from) and os.path.isdir(built_from))
            space = os.path.relpath(base, built_from) if inside else base
            scope = os.path.relpath(source_root, built_from) if inside else source_root

            def named(label: str) -> str:
                return label if space == "." else f"{space}/{label}"

            documents = (replace(d, id=named(d.id), source=named(d.source)) for d in documents)
            # a folder owns what lies under it; a file given alone, only its own documents
            mine = scope + "/" if folder else scope

            def owns(record: Any) -> bool:
                if not folder:
                    return record.source == mine
                return record.source.startswith(mine) and (
                    not inside or Path(record.source).suffix.lower() in SUFFIXES)  # not the API's

            def may_own(rid: str) -> bool:
                return rid.startswith(mine)

            def keep() -> set[str]:
                return {scope if u == "." else named(u) for u in reader.unread}
        report = self._add(documents, lang=lang, progress=progress, prune=True, manifest=manifest,
                           keep_sources=keep, owns=owns, may_own=may_own)
        report.files = reader.files
        report.problems = reader.problems + report.problems
        self.report = report
        return report

    def _rebase(self, root: str, prefix: str) -> None:
        """Stage the renames that make ``root`` the first folder: the first folder's documents
        (relative ids) prefixed with its place in ``root`` (``prefix``, "." for none), and other
        folders' documents under ``root`` (absolute ids) named relative to it. Vectors are kept
        (nothing is encoded); the renames are committed with the run's first commit."""
        from vecplug.indexer.corpus import SUFFIXES

        def renamed(label: str) -> str | None:
            if label.startswith("/"):
                return os.path.relpath(label, root) if label.startswith(root + "/") else None
            return None if prefix == "." else f"{prefix}/{label}"

        ids = list(self.store.ids())
        for start in range(0, len(ids), 1024):
            records = [r for r in self.store.get(ids[start:start + 1024])
                       if Path(r.source).suffix.lower() in SUFFIXES and renamed(r.id) is not None]
            if not records:
                continue
            vectors = self.store.vectors([r.id for r in records])
            self.store.upsert([dataclasses.replace(r, id=renamed(r.id), source=renamed(r.source) or r.source)
                               for r in records], vectors)
            self.store.delete([r.id for r in records])

    def _moved_here(self, documents: Iterator[Document]) -> tuple[bool, list[Document]]:
        """Whether a folder's documents are the first folder's, moved: of the first documents
        the index holds by their relative ids (up to RELOCATION_SAMPLE of them, among at most
        RELOCATION_SCAN read), at least half have the same text. Documents the index does not
        hold yet (files added since, sorting first) say nothing either way. Returns the
        verdict and the documents read, to be indexed as well."""
        from itertools import islice

        head: list[Document] = []
        held = same = 0
        for part in iter(lambda: list(islice(documents, RELOCATION_SAMPLE)), []):
            head.extend(part)
            stored = {r.id: r for r in self.store.get([d.id for d in part])}
            for d in part:
                if d.id in stored and held < RELOCATION_SAMPLE:
                    held += 1
                    same += stored[d.id].text == d.text
            if held >= RELOCATION_SAMPLE or len(head) >= RELOCATION_SCAN:
                break
        return same > 0 and 2 * same >= held, head

    # -- reading -----------------------------------------------------------

    def search(self, query: str, k: int | None = None, *, mode: str | None = None,
               lang: str | None = None, langs: Sequence[str] | None = None,
               rerank: str | None = None, rerank_depth: int | None = None,
               debias: bool | None = None, ef: int | None = None,
               consensus: bool | None = None, rerank_gate: float | None = None) -> SearchResult:
        """The ``k`` best documents for ``query``.

        ``mode``: ``xy`` (every language), ``mono`` (the query's language) or ``prefer``
        (every language, the query's ranked up); ``lang`` is the query's language (default:
        detected); ``langs`` limits the answers to those languages; ``rerank`` names a
        second stage (``teacher``, ``fields``, ``cross-encoder:MODEL``) applied to the top
        ``rerank_depth`` candidates, for every query or, with ``rerank_gate``, only when the
        first stage's margin (its best minus its second-best score in the query's language;
        :mod:`vecplug.adapters.rerank.gate`) is below it; ``debias`` switches the language-bias
        correction; ``ef`` sets the HNSW search breadth for this query (more exact, slower); ``consensus``
        switches translation consensus (pooled modes: an answer's copies in other languages
        count for it and follow it; :mod:`vecplug.adapters.consensus`).
        Unset arguments come from the settings (and ``debias`` from the index).
        """
        if not isinstance(query, str):
            raise QueryError(f"the query must be a string, not {type(query).__name__}")
        if _blank(query):
            raise QueryError("the query is empty")
        if _undecodable(query):
            raise QueryError("the query holds a NUL or an undecodable byte (not UTF-8?)")
        return self.search_batch([query], k, mode=mode, langs=[lang], target_langs=langs,
                                 rerank=rerank, rerank_depth=rerank_depth, debias=debias, ef=ef,
                                 consensus=consensus, rerank_gate=rerank_gate)[0]

    def search_batch(self, queries: Sequence[str], k: int | None = None, *, mode: str | None = None,
                     langs: Sequence[str | None] | None = None,
                     target_langs: Sequence[str] | None = None, rerank: str | None = None,
                     rerank_depth: int | None = None, debias: bool | None = None,
                     ef: int | None = None, consensus: bool | None = None,
                     rerank_gate: float | None = None, progress: bool = False) -> list[SearchResult]:
        """:meth:`search` for many queries at once (queries are encoded in batches).

        Here ``langs`` gives each query's language, one per query (None entries are
        detected), and ``target_langs`` limits the answers to those languages (what
        :meth:`search` calls ``langs``)."""
        import numpy as np

        from vecplug.adapters import modes

        s = self.settings.search
        k = _integer("k", s.k if k is None else k)
        if not 1 <= k <= MAX_COUNT:
            raise VecplugError(f"k must be between 1 and {MAX_COUNT}, not {k}")
        if isinstance(queries, str) or isinstance(langs, str):
            raise VecplugError("search_batch takes a list of queries and a list of their languages; "
                               "for one query, use search()")
        if langs is not None and len(langs) != len(queries):
            raise VecplugError(f"langs gives {len(langs)} languages for {len(queries)} queries: one per "
                               "query (None: detected); target_langs limits the answers' languages")
        given = [_query_lang(v, i, len(queries)) for i, v in
                 enumerate(langs if langs is not None else [None] * len(queries))]
        other = next((i for i, q in enumerate(queries) if not isinstance(q, str)), None)
        if other is not None:
            raise QueryError(f"query {other} must be a string, not {type(queries[other]).__name__}")
        empty = next((i for i, q in enumerate(queries) if _blank(q)), None)
        if empty is not None:
            raise QueryError(f"query {empty} is empty")
        bad = next((i for i, q in enumerate(queries) if _undecodable(q)), None)
        if bad is not None:
            raise QueryError(f"query {bad} holds a NUL or an undecodable byte (not UTF-8?)")
        mode = mode or s.mode
        if mode not in modes.MODES:
            raise VecplugError(f"unknown mode '{mode}'; modes: {', '.join(modes.MODES)}")
        # language codes as the index keeps them: " de , FR" means de and fr
        target = list(normalise_langs(target_langs if target_langs is not None else s.langs)) or None
        debias = self.debias_for(debias)
        # "is None", not "or": 0 is a value to refuse, as the settings refuse it, not "unset"
        ef = s.ef if ef is None else _integer("ef", ef)
        if ef is not None and ef < 1:
            raise ConfigError(f"ef must be at least 1, not {ef}")
        rerank_depth = _integer("rerank_depth", s.rerank_depth if rerank_depth is None else rerank_depth)
        if rerank_depth < 1:
            raise ConfigError(f"rerank_depth must be at least 1, not {rerank_depth}")
        reranker = self._reranker(rerank if rerank is not None else s.rerank)
        gate = check_gate(s.rerank_gate if rerank_gate is None else rerank_gate)
        shallow = 2 * k if mode == "prefer" else k  # prefer: room for the boost to reorder
        depth = max(shallow, rerank_depth) if reranker is not None else shallow
        encoder, detector = self.encoder, self.detector
        encoder.query  # the query model loads on first use: load it before timing
        means = self.language_means() if debias and mode != "mono" else None
        group = None  # translation consensus: pooled lists only (mono's share one language)
        if (s.consensus if consensus is None else consensus) and mode != "mono":
            from vecplug.adapters.consensus import Consensus

            # partners are found among centred vectors whether or not the scores are centred
            group = Consensus(means if means is not None else self.language_means(),
                              s.consensus_threshold, s.consensus_depth)
        context = None
        if reranker is not None:
            from vecplug.adapters.bias import exact_scores
            from vecplug.adapters.rerank import Query, RerankContext
            from vecplug.adapters.rerank.gate import unsure

            context = RerankContext(encoder, self.store,
                                    lambda qv, cands, ql: exact_scores(self.store, means, qv, ql, cands),
                                    means)
            reranker.warm_up(context)  # models load before the clock starts
        t0 = time.perf_counter()
        qlangs = [given[i] or s.lang or detector.detect(q) for i, q in enumerate(queries)]
        vectors = encoder.encode_queries(list(queries), progress=progress)
        bad = ~(np.isfinite(vectors).all(axis=1) & (np.linalg.norm(vectors, axis=1) > 1e-6))
        if bad.any():
            raise QueryError("the query encoder gave a non-finite or zero vector for "
                             f"{queries[int(np.argmax(bad))]!r}")
        # with a reranker, consensus regroups the reranker's list instead of the first stage's
        first_group = group if reranker is None else None
        # with a gate, every query first gets the search it would get without a reranker
        # (consensus included); the gate reads its margin there, and only the queries it sends
        # on to the reranker are searched again, to the reranker's depth
        gate_first = reranker is not None and gate is not None
        # (the gate reads at least two: a margin needs a second answer; k = 1 was never reranked)
        first_depth, first_consensus = (max(shallow, 2), group) if gate_first else (depth, first_group)
        candidates = modes.first_stage_batch(self.store, vectors, qlangs, mode, first_depth, target, means, ef,
                                             first_consensus)
        if candidates is None:
            candidates = [self._first_stage(v, ql, mode, first_depth, target, means, ef, first_consensus,
                                            single=len(queries) == 1)
                          for v, ql in zip(vectors, qlangs)]
        boosts = [s.prefer_boost] * len(queries)
        # None: no reranker asked; False until the reranker has rescored the query's candidates
        reranked: list[bool | None] = [None if reranker is None else False] * len(queries)
        if reranker is not None:
            chosen = unsure(candidates, qlangs, gate)
            if gate_first and (depth > first_depth or group is not None):
                for i in chosen:
                    candidates[i] = self._first_stage(vectors[i], qlangs[i], mode, depth, target, means, ef,
                                                      first_group, single=len(queries) == 1)
            elif gate_first:  # (a rerank depth of 1: the reranker reads that many)
                for i in chosen:
                    candidates[i] = candidates[i][:depth]
            if mode == "prefer":
                # the reranker reads rerank_depth candidates, as in the other modes: the best
                # with the preference (the first stage gave the pooled and same-language lists)
                cut = max(k, rerank_depth)
                for i in chosen:
                    candidates[i] = modes.apply_preference(candidates[i], qlangs[i], s.prefer_boost,
                                                           keep_scores=True)[:cut]
            if chosen:
                rescored = reranker.rerank([Query(queries[i], qlangs[i], vectors[i]) for i in chosen],
                                           [candidates[i] for i in chosen], context)
                for i, new in zip(chosen, rescored):
                    if mode == "prefer":  # the boost on the reranker's scale
                        boosts[i] = modes.boost_on_scale(s.prefer_boost, candidates[i], new)
                    candidates[i], reranked[i] = new, True
            if group is not None:  # the reranked lists (the others were regrouped in the search)
                candidates = [group.regroup(self.store, c) if done else c for c, done in zip(candidates, reranked)]
        if mode == "prefer":
            candidates = [modes.apply_preference(c, ql, b) for c, ql, b in zip(candidates, qlangs, boosts)]
        share = (time.perf_counter() - t0) / max(1, len(queries))
        return [SearchResult(q, ql, mode,
                             [Hit(h.record.id, float(h.score), h.record.text, h.record.lang, h.record.source,
                                  h.record.payload, rank) for rank, h in enumerate(c[:k], 1)],
                             share, v, done)
                for q, ql, c, v, done in zip(queries, qlangs, candidates, vectors, reranked)]

    def _first_stage(self, vector: Any, query_lang: str | None, mode: str, depth: int,
                     target: list[str] | None, means: Any, ef: int | None, group: Any,
                     single: bool) -> list[Any]:
        from vecplug.adapters import modes

        try:
            return modes.first_stage(self.store, vector, query_lang, mode, depth, target, means, ef, group)
        except QueryError:
            if single:
                raise
            return []  # in a batch, a mono query of unknown language finds nothing

    def score_ids(self, vector: Any, ids: Sequence[str], query_lang: str | None,
                  debias: bool | None = None) -> Any:
        """Exact first-stage scores of documents ``ids`` for a query vector (as :meth:`search`
        scores them, with the language-bias correction when it is on)."""
        from vecplug.adapters.bias import exact_scores
        from vecplug.adapters.stores import StoreHit

        means = self.language_means() if self.debias_for(debias) else None
        hits = [StoreHit(r, 0.0) for r in self.store.get(list(ids))]
        if len(hits) != len(ids):
            raise VecplugError("score_ids: some ids are not in the index")
        return exact_scores(self.store, means, vector, query_lang, hits)

    def debias_for(self, debias: bool | None) -> bool:
        """Whether a search given ``debias`` applies the language-bias correction: ``debias``,
        else ``search.debias``, else the index's own setting (its manifest)."""
        if debias is not None:
            return debias
        if self.settings.search.debias is not None:
            return self.settings.search.debias
        # one entry, not the whole manifest: a copy of its language statistics cost ~3.6 ms a search
        return bool(self.store.manifest_value("debias", False)) if self.store is not None else False

    @property
    def language_stats(self) -> Any:
        """Per-language sums of document vectors (from the manifest; recomputed from the stored
        vectors when it has none, an index written before vecplug kept them, or when a store
        that writes through (a Qdrant server: ``VectorStore.writes_through``) may hold other
        points than they describe: a run killed between its writes and their commit left
        points its statistics never took in (their count differs), or overwrote documents
        (the count agrees; the mark of ``VectorStore.uncommitted_writes`` tells); not while
        another process writes: its points are counted at its next commit, and every reader
        would read every vector meanwhile). A writer commits the statistics it fitted."""
        stats = self._stats  # one read: another thread's language_means may reset it
        if stats is None:
            from vecplug.adapters.bias import LanguageStats

            stats = LanguageStats.from_manifest(self.manifest)
            if stats is None or (self.store.writes_through
                                 and (self.store.uncommitted_writes()  # first: no round trip
                                      or sum(stats.counts.values()) != self.store.count())
                                 and (self.writable or not self.store.writer_running())):
                stats = LanguageStats.fit(self.store)
                if self.writable:
                    self.store.commit(stats.to_manifest())
            self._stats = stats
        return stats

    def language_means(self) -> Any:
        """The per-language mean vectors the language-bias correction removes, as of the
        store's current commit: a reader follows a writer's (new languages with them)."""
        token = self.store.commit_token()  # before the manifest is read: a later commit rebuilds
        if token != self._stats_commit:
            self._stats = self._means = None
            self._stats_commit = token
        means = self._means  # one read, as in language_stats
        if means is None:
            means = self._means = self.language_stats.means()
        return means

    def _reranker(self, spec: str | None) -> Any:
        if not spec or spec == "none":
            return None
        if not isinstance(spec, str):
            return spec  # a Reranker instance
        if spec not in self._rerankers:
            from vecplug.adapters.rerank import get_reranker
            from vecplug.indexer.models import LOAD_LOCK

            # the cross-encoder's own settings (not a plugin's whose name starts alike)
            options = ({"max_length": self.settings.search.rerank_max_length,
                        "precision": self.settings.model.precision}
                       if spec.partition(":")[0].strip() == "cross-encoder" else {})
            with LOAD_LOCK:  # one reranker per spec, whichever threads ask at once
                if spec not in self._rerankers:
                    self._rerankers[spec] = get_reranker(spec, **options)
        return self._rerankers[spec]

    def describe_reranker(self, spec: str | None) -> dict[str, Any] | None:
        """What the reranker named by ``spec`` is, for reports (its ``describe()``; after a
        search, ``teacher:auto`` says what it resolved to); None for no reranker."""
        reranker = self._reranker(spec)
        if reranker is None:
            return None
        describe = getattr(reranker, "describe", None)  # a duck-typed reranker may have none
        return describe() if callable(describe) else {"name": getattr(reranker, "name", type(reranker).__name__)}

    def info(self) -> dict[str, Any]:
        """What the index holds and what it was built with."""
        manifest = self.manifest
        manifest.pop("language_stats", None)  # hundreds of numbers per language: not for reading
        location = self.location or _store_target(self.settings)[1]
        return {"location": location, "documents": self.store.count(),
                "languages": self.store.languages(), "manifest": manifest}

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
              ("query_prefix", "query prefix", None),
              ("document_max_length", "document length limit (tokens)", None),
              ("document_quantize", "document quantisation", None))
    # the store's similarity: vecplug writes and searches unit vectors by cosine (inner
    # product); an index whose manifest names another space would be ranked wrongly
    store = built.get("store")
    space = store.get("space") if isinstance(store, dict) else None
    expected = current.get("space", "cosine")
    if space is not None and space != expected:
        raise ModelMismatchError(f"space mismatch: the index was built for {space!r} similarity, "
                                 f"but this run searches by {expected!r}")
    built_proj, cur_proj = built.get("projection"), current.get("projection")
    if "projection" in built and (built_proj or {}).get("checksum") != (cur_proj or {}).get("checksum"):
        def show(p: dict[str, Any] | None) -> str:
            return f"a {p['dim']}-d projection from {p['by']}" if p else "no projection"

        raise ModelMismatchError(f"projection mismatch: the index was built with {show(built_proj)}, "
                                 f"but this run uses {show(cur_proj)}")

    def shown(key: str, value: Any) -> str:
        # no document quantisation is float32 weights ("built with None" said nothing)
        return "float32" if key == "document_quantize" and value is None else repr(value)

    for key, what, name in checks:
        if key in built and built[key] != current.get(key):
            left = f"{built.get(name)} ({built[key]})" if name else shown(key, built[key])
            right = f"{current.get(name)} ({current.get(key)})" if name else shown(key, current.get(key))
            raise ModelMismatchError(f"{what} mismatch: the index was built with {left}, "
                                     f"but this run uses {right}")


def built_int8_version(built: dict[str, Any]) -> int | None:
    """The version of the documents' int8 recipe an index was built with (None: not int8).
    The index's encoder encodes new documents with that version's recipe, so an index never
    mixes two recipes' vectors; one this vecplug does not know is refused when the encoder
    loads (``Encoder.document``)."""
    if built.get("document_quantize") != "int8":
        return None
    return int(built.get("document_int8_version") or 1)  # indexes from before it was recorded: 1


def check_query_encoder(current: dict[str, Any]) -> None:
    """A query encoder must be the document encoder or a student distilled from it."""
    if (current["document_encoder"] == current["query_encoder"]
            and current["query_encoder_teacher_checksum"] != current["query_encoder_checksum"]):
        # a student given as the document encoder (--model): it was made to encode queries
        raise ModelMismatchError(
            f"{current['document_encoder']} is a query student (distilled from the teacher with checksum "
            f"{current['query_encoder_teacher_checksum']}): it encodes queries only; give its teacher "
            "as the document encoder (--model) and it as the query encoder (--query-encoder)")
    if current["query_encoder_teacher_checksum"] != current["document_encoder_checksum"]:
        if current["query_encoder_teacher_checksum"] == current["query_encoder_checksum"]:
            raise ModelMismatchError(
                f"query encoder {current['query_encoder']} ({current['query_encoder_checksum']}) is "
                f"not a student of the document encoder {current['document_encoder']} "
                f"({current['document_encoder_checksum']}), nor that encoder itself: its vectors "
                "would not be comparable with the documents'")
        raise ModelMismatchError(
            f"query encoder {current['query_encoder']} was distilled from a teacher with checksum "
            f"{current['query_encoder_teacher_checksum']}, but the documents are encoded by "
            f"{current['document_encoder']} ({current['document_encoder_checksum']})")


def settings_for(path: str | None = None, **sections: dict[str, Any]) -> Settings:
    overrides = {k: dict(v) for k, v in sections.items()}
    if path is not None:
        overrides.setdefault("index", {})["path"] = path
    return load_settings(overrides=overrides)


def _settings_at(path: str | None, settings: Settings | None) -> Settings:
    """``settings`` (default: loaded as the CLI does) with ``path`` as the index's folder when
    given: a path beside settings was dropped, and the index made in ``.vecplug`` instead."""
    if settings is None:
        return settings_for(path)
    if path is None:
        return settings
    return dataclasses.replace(settings, index=dataclasses.replace(settings.index, path=str(path)))


def open_index(path: str | None = None, *, settings: Settings | None = None,
               writable: bool = False) -> Index:
    """Open an existing index (default ``.vecplug`` in the current folder, or the settings')."""
    return Index.open(_settings_at(path, settings), writable=writable)


def _corpus_root(path: str | Path) -> tuple[Path, str]:
    """``path`` as a corpus to index and its absolute path, or a VecplugError: it must exist,
    and its absolute path must be text (it is recorded in the manifest, and names another
    folder's documents)."""
    from vecplug.indexer.corpus import _BAD_TEXT, shown

    root = Path(path)
    if not root.exists():
        raise VecplugError(f"{root} does not exist")
    absolute = str(root.resolve())
    if _BAD_TEXT.search(absolute):  # undecodable bytes of a name are lone surrogates in a str
        raise VecplugError(f"{shown(absolute)}: the path holds bytes that are not UTF-8; "
                           "rename the folder (or a folder above it) to index it")
    return root, absolute


def create_index(corpus: str | Path | None = None, *, path: str | None = None,
                 settings: Settings | None = None, progress: bool = False) -> Index:
    """Open or create an index for writing; with ``corpus``, index that folder into it."""
    if corpus is not None:
        _corpus_root(corpus)  # refused before an empty index is made
    index = Index.open(_settings_at(path, settings), create=True)
    if corpus is not None:
        try:
            index.index_path(corpus, progress=progress)
        except BaseException:
            index.close()
            raise
    return index
