"""The indexing pipeline: documents -> language -> vectors -> store, in batches.

A batch is committed every ``commit_every`` documents (less often once commits get slow: see
:data:`COMMIT_TIME_SHARE`, up to :data:`MAX_UNCOMMITTED`), so an interrupted run keeps what it
finished; re-running skips documents whose text is already in the index unchanged, and with
``prune`` removes the documents the source no longer has. A run that changes nothing writes nothing.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import numbers
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vecplug.errors import ConfigError
from vecplug.types import Document, Problem, lang_code


class DocumentEncoder(Protocol):
    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray: ...


class Sink(Protocol):
    """The part of a vector store the pipeline needs."""

    @property
    def manifest(self) -> dict[str, Any]: ...
    def get(self, ids: Sequence[str]) -> list[Any]: ...
    def ids(self) -> Iterator[str]: ...
    def vectors(self, ids: Sequence[str]) -> np.ndarray: ...
    def upsert(self, records: Sequence[Any], vectors: np.ndarray) -> None: ...
    def delete(self, ids: Sequence[str]) -> None: ...
    def commit(self, manifest: dict[str, Any] | None = None) -> None: ...


@dataclass
class IndexReport:
    """What one indexing run did, and what it skipped."""

    files: int = 0
    documents: int = 0
    unchanged: int = 0
    removed: int = 0
    tokens: int = 0
    seconds: float = 0.0
    encode_seconds: float = 0.0
    languages: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    #: documents encoded this run whose text is longer than the document encoder keeps: only
    #: their beginning is embedded (records are not cut into passages; passages of an index
    #: built longer than the encoder keeps)
    cut: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["problems"] = [str(p) for p in self.problems]
        d["languages"] = dict(self.languages)
        return d


def batched(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    batch: list[Document] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


#: At most about this share of an indexing run goes to commits. A commit rewrites the graph
#: (hnswlib) or optimises segments (embedded Qdrant), so its cost grows with the index: about
#: 10 s at a million 384-d vectors (benchmarks/ann_scale.py), against ~50 s to encode 4,096
#: documents. When the last commit took more than :data:`SLOW_COMMIT` seconds, the next waits
#: until the time since it is at least (1 - share) / share times as long. An interrupted run
#: loses at most that much work.
COMMIT_TIME_SHARE = 0.1
SLOW_COMMIT = 1.0
#: ...but never more than this many documents wait for a commit, however slow commits get: the
#: store holds them in memory until then (embedded Qdrant stages every write; its one commit of
#: 1M documents peaked at 11.8 GB, benchmarks/results/ann_scale_qdrant_1m.md, ~12 KB a document).
MAX_UNCOMMITTED = 100_000


#: records read at a time when looking for the ones to remove
PRUNE_BATCH = 10_000


def run(documents: Iterable[Document], encoder: DocumentEncoder, store: Sink,
        make_record: Callable[[Document], Any], detect: Callable[[str], str] | None,
        lang: str | None = None, batch_size: int = 256, commit_every: int = 4096,
        manifest: dict[str, Any] | None = None, progress: bool = True,
        count_tokens: Callable[[], int] | None = None, stats: Any = None,
        prune: bool = False, keep_sources: Callable[[], Collection[str]] | None = None,
        owns: Callable[[Any], bool] | None = None,
        may_own: Callable[[str], bool] | None = None,
        on_torn: Callable[[], None] | None = None) -> IndexReport:
    """Index ``documents`` into ``store``; returns what was done and what was skipped.

    With ``prune`` the store ends up holding exactly ``documents`` among the records that
    ``owns`` (default: all) says come from the same source (``may_own``: a cheap test of
    the id first, so that the others' records are never read): every other such record is
    removed (in the final commit, so an interrupted run removes nothing), except records
    whose source is in ``keep_sources()`` (files that could not be read this time: their
    last good version stays). Interrupted (Ctrl-C) or failing (an error in the documents or
    the encoder) between batches, the run commits the documents it finished before it stops,
    so the next run starts from there; in the middle of a batch's writes, it commits nothing
    and calls ``on_torn`` (the writes staged through the store are half done).

    ``stats`` (a :class:`vecplug.adapters.bias.LanguageStats` or anything with
    ``add(langs, vectors, sign)`` and ``to_manifest()``) is kept in step with what is
    written: replaced documents' old vectors are subtracted and new ones added, and every
    commit stores it in the manifest with the records it describes.
    """
    from tqdm.auto import tqdm

    report = IndexReport()
    try:
        lang = lang_code(lang)
    except ValueError as exc:
        raise ConfigError(f"the documents' language: {exc}") from None
    tokens_before = count_tokens() if count_tokens else 0  # loads the encoder: not timed
    start = time.perf_counter()
    writer = _Writer(store, encoder, make_record, report, manifest, stats, commit_every)
    bar = tqdm(desc="indexing", unit="doc", disable=not progress)
    try:
        for batch in batched(_first_of_each_id(_storable(documents, report.problems), report.problems),
                             batch_size):
            # language: the flag, else the record's own, else detected; codes as the detector
            # writes them, so that filters match ("pt-BR " -> "pt")
            writer.add([_with_lang(d, lang or _own_lang(d, report.problems) or (detect(d.text) if detect else None))
                        for d in batch])
            bar.update(len(batch))
        if prune:
            # reading what to remove can take a while on a large index: an interrupt there
            # still keeps the documents encoded
            gone = _stale(store, writer.seen, set(keep_sources() if keep_sources else ()), owns, may_own)
            writer.writing = True  # from the first removal on: the final commit or nothing
            remove(store, gone, stats)
            report.removed = len(gone)
    except BaseException:
        # Ctrl-C mostly lands in the encoder, an error in a document stream or the encoder:
        # keep the documents finished so far (committed with the statistics that count them)
        if writer.writing:
            if on_torn is not None:
                on_torn()  # staged writes half done: nothing more may be committed through them
        elif writer.since_commit:
            writer.commit()
        raise
    finally:
        bar.close()
    wanted = manifest or {}
    if writer.since_commit or report.removed or any(store.manifest.get(k) != v for k, v in wanted.items()):
        writer.commit()
    report.seconds = time.perf_counter() - start
    report.tokens = (count_tokens() - tokens_before) if count_tokens else 0
    return report


@dataclass
class _Writer:
    """One run's writes: batches encoded and staged in the store, commits paced, and the ids
    the run has seen (what pruning keeps)."""

    store: Sink
    encoder: DocumentEncoder
    make_record: Callable[[Document], Any]
    report: IndexReport
    manifest: dict[str, Any] | None
    stats: Any
    commit_every: int
    seen: set[str] = field(default_factory=set)
    #: documents staged since the last commit
    since_commit: int = 0
    last_commit: float = field(default_factory=time.perf_counter)
    commit_cost: float = 0.0
    #: True from a batch's first write to its last, and during a commit: an interrupt there
    #: leaves the staged writes half done, so nothing is committed on the way out
    writing: bool = False

    def add(self, batch: list[Document]) -> None:
        """Encode and stage the documents of ``batch`` that are new or changed."""
        existing = {r.id: r for r in self.store.get([d.id for d in batch])}
        todo = [d for d in batch if not _unchanged(existing.get(d.id), d)]
        self.report.unchanged += len(batch) - len(todo)
        todo_ids = {d.id for d in todo}
        self.seen.update(d.id for d in batch if d.id not in todo_ids)
        # the same document at another line (lines above it added or removed): its record is
        # written again with its stored vector, not encoded again
        moved = [d for d in batch if d.id not in todo_ids and existing[d.id].position != d.position]
        if moved:
            stored = self.store.vectors([d.id for d in moved])  # a read: an interrupt here loses nothing
            self.writing = True
            self.store.upsert([self.make_record(d) for d in moved], stored)
            self.since_commit += len(moved)
            self.writing = False
        if not todo:
            if moved:
                self._pace()
            return
        t0 = time.perf_counter()
        cut_before = getattr(self.encoder, "documents_cut", 0)
        vectors = self.encoder.encode_documents([d.text for d in todo], progress=False)
        self.report.encode_seconds += time.perf_counter() - t0
        self.report.cut += getattr(self.encoder, "documents_cut", 0) - cut_before
        ok = np.isfinite(vectors).all(axis=1) & (np.linalg.norm(vectors, axis=1) > 1e-6)
        for d in (d for d, good in zip(todo, ok) if not good):
            self.report.problems.append(Problem(d.source, f"document {d.id} gave a non-finite or zero "
                                                         "vector: left out (a version already indexed stays)", d.position))
            self.seen.add(d.id)  # its last good version, if any, is not pruned as deleted
        keep = [d for d, good in zip(todo, ok) if good]
        replaced = [existing[d.id] for d in keep if d.id in existing] if self.stats is not None else []
        old = self.store.vectors([r.id for r in replaced]) if replaced else None  # before they change
        self.writing = True
        self.store.upsert([self.make_record(d) for d in keep], vectors[ok])
        if self.stats is not None:  # after the writes: a refused upsert counts nothing
            if replaced:
                self.stats.add([r.lang for r in replaced], old, -1)
            self.stats.add([d.lang for d in keep], vectors[ok])
        self.seen.update(d.id for d in keep)
        self.report.documents += len(keep)
        self.report.languages.update(d.lang or "und" for d in keep)
        self.since_commit += len(keep)
        self._pace()
        self.writing = False

    def _pace(self) -> None:
        """Commit every ``commit_every`` documents, less often when commits are slow (a large
        index): they take at most COMMIT_TIME_SHARE of the time, MAX_UNCOMMITTED at most apart."""
        now = time.perf_counter()
        if self.since_commit >= self.commit_every and (
                self.commit_cost < SLOW_COMMIT or self.since_commit >= MAX_UNCOMMITTED
                or now - self.last_commit >= self.commit_cost * (1 - COMMIT_TIME_SHARE) / COMMIT_TIME_SHARE):
            self.commit()
            self.last_commit = time.perf_counter()
            self.commit_cost = self.last_commit - now

    def commit(self) -> None:
        """Commit what is staged, with the manifest and the bias statistics it describes."""
        writing, self.writing = self.writing, True  # an interrupt inside: no second commit
        self.store.commit(stamped(self.manifest, self.stats))
        self.since_commit = 0
        self.writing = writing


def _storable(documents: Iterable[Document], problems: list[Problem]) -> Iterator[Document]:
    """Documents that can be stored and found; the others reported. The corpus reader never
    makes the unstorable ones; documents given through the API can be anything."""
    from vecplug.indexer.corpus import _UNSAFE_LABEL, _bad_value

    for doc in documents:
        why = None
        if not isinstance(doc.id, str) or not doc.id.strip():
            why = "an empty id"
        elif _UNSAFE_LABEL.search(doc.id):
            why = "its id holds a control character"
        elif not isinstance(doc.text, str) or not doc.text.strip():
            why = "no text"
        else:
            # a store coerces what it is given (SQLite's "5" for 5, 3 for 3.0): the record read
            # back would not be the one written, and hnswlib's row checksum would call the index
            # damaged. A path and a numpy integer are taken as the string and integer they are
            if isinstance(doc.source, os.PathLike):
                doc = dataclasses.replace(doc, source=os.fspath(doc.source))
            if isinstance(doc.position, numbers.Integral) and not isinstance(doc.position, bool):
                doc = dataclasses.replace(doc, position=int(doc.position))
            if not isinstance(doc.source, str):
                why = f"its source must be a string, not {type(doc.source).__name__}"
            elif type(doc.position) is not int or not -2**63 <= doc.position < 2**63:
                why = f"its position must be an integer of 64 bits, not {doc.position!r}"
            else:
                # apart: a list around them would count as one more level of the payload's nesting
                why = _bad_value(doc.text) or _bad_value(doc.source) or _bad_value(doc.payload)
        if why is None:
            yield doc
        else:
            line = doc.position if type(doc.position) is int else None
            problems.append(Problem(str(doc.source), f"document {doc.id!r}: {why}: skipped", line))


def _first_of_each_id(documents: Iterable[Document], problems: list[Problem]) -> Iterator[Document]:
    """Two documents with one id would replace each other on every run: keep the first."""
    first: dict[str, tuple[str, int]] = {}
    for doc in documents:
        if doc.id in first:
            source, position = first[doc.id]
            problems.append(Problem(doc.source, f"duplicate id {doc.id!r} (first at {source}:{position}): "
                                                "skipped", doc.position))
            continue
        first[doc.id] = (doc.source, doc.position)
        yield doc


def _stale(store: Sink, seen: set[str], keep_sources: set[str], owns: Callable[[Any], bool] | None,
           may_own: Callable[[str], bool] | None) -> list[Any]:
    """The records a pruning run removes: the source's (``owns``) that the run did not see,
    but for those of sources it could not read (``keep_sources``)."""
    stale = [rid for rid in store.ids() if rid not in seen and (may_own is None or may_own(rid))]
    return [r for i in range(0, len(stale), PRUNE_BATCH) for r in store.get(stale[i:i + PRUNE_BATCH])
            if not kept(r.source, keep_sources) and (owns is None or owns(r))]


def kept(source: str, keep: Collection[str]) -> bool:
    """Whether ``source`` is one of ``keep`` or lies in a folder of it: what could not be read
    this run is a file or a whole folder that could not be listed ("." the folder itself), and
    the documents of either must outlive the run."""
    if not keep:
        return False
    if source in keep or "." in keep:
        return True
    parts = source.split("/")
    return any("/".join(parts[:i]) in keep for i in range(1, len(parts)))


def remove(store: Sink, records: Sequence[Any], stats: Any) -> None:
    """Delete ``records`` from ``store`` (not committed), their vectors taken out of ``stats``
    first, so that the bias statistics stay those of what the store holds."""
    if records and stats is not None:
        stats.add([r.lang for r in records], store.vectors([r.id for r in records]), -1)
    store.delete([r.id for r in records])


def stamped(manifest: dict[str, Any] | None, stats: Any) -> dict[str, Any]:
    """What a commit writes into the manifest: ``manifest``, the time, the language stats."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {**(manifest or {}), "updated": now, **(stats.to_manifest() if stats is not None else {})}


def _own_lang(doc: Document, problems: list[Problem]) -> str | None:
    """The language a document gives, as the index keeps codes; one that is not a language
    code ("English" would match no query's language) is reported and detected instead."""
    try:
        return lang_code(doc.lang)
    except ValueError as exc:
        problems.append(Problem(str(doc.source), f"document {doc.id!r}: field lang: {exc}: detected instead",
                                doc.position, kept=True))
        return None


def _with_lang(doc: Document, lang: str | None) -> Document:
    from dataclasses import replace

    return doc if doc.lang == lang else replace(doc, lang=lang)


def _unchanged(old: Any, doc: Document) -> bool:
    """Whether ``doc`` needs no new vector: the same text, language, payload and source as the
    stored record ``old`` (its position may differ: :meth:`_Writer.add` rewrites the record)."""
    # a store reads an undetermined language back as None, where the detector says "und"
    return (old is not None and old.text == doc.text and (old.lang or "und") == (doc.lang or "und")
            and old.payload == doc.payload and old.source == doc.source)
