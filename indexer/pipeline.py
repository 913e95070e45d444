"""The indexing pipeline: documents -> language -> vectors -> store, in batches.

A batch is committed every ``commit_every`` documents (less often once commits get slow: see
:data:`COMMIT_TIME_SHARE`, up to :data:`MAX_UNCOMMITTED`), so an interrupted run keeps what it
finished; re-running skips documents whose text is already in the index unchanged, and with
``prune`` removes the documents the source no longer has (and finds records named by their line
at their new lines: :class:`_Lines`). A run that changes nothing writes nothing.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import numbers
import os
import sys
import time
from collections import Counter, deque
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
    #: documents already indexed, not encoded: at their id, or (records named by their line)
    #: found at an old line and stored under their new one with its vector
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
#: documents read, encoded and staged together. The encoder sorts a call's texts by length and
#: pads each batch to its longest, so a bigger call makes batches of nearer lengths: indexing
#: XQuAD-R's 7,308 sentences took 25.4 s with 2,048 against 33.8 with 256 (benchmarks/xquad_r.py,
#: README "Speed"). An interrupt loses at most one such batch's encoding; commits stay every
#: ``commit_every`` documents (a multiple of it)
BATCH_SIZE = 2048

#: A record named by its line (no id: ``path#L7``) that lines added or removed above it moved
#: is looked for this many lines around its new line, and takes the vector stored under its old
#: one instead of being encoded again. The records read around each new or edited record, and
#: the vectors held after their lines are overwritten, are about twice this many per file.
MOVE_WINDOW = 1000
#: line ids read at a time when looking for moved records; a read past the end of what the
#: index holds of a file that finds none ends the looking there
LINE_PROBE = 250


def run(documents: Iterable[Document], encoder: DocumentEncoder, store: Sink,
        make_record: Callable[[Document], Any], detect: Callable[[str], str] | None,
        lang: str | None = None, batch_size: int = BATCH_SIZE, commit_every: int = 4096,
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

    A pruning run also finds the records named by their line (``path#L7``: no id) that lines
    added or removed above them moved: each takes the vector stored under its old line instead
    of being encoded again, and counts as unchanged (:class:`_Lines`).

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
    writer = _Writer(store, encoder, make_record, report, manifest, stats, commit_every, progress=progress)
    if prune:  # the old lines of the records found at new ones are removed (or overwritten)
        writer.lines = _Lines(store, writer.seen, owns, may_own)
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
    #: where records named by their line are looked for at their old lines (pruning runs)
    lines: _Lines | None = None
    #: the run shows progress: the encoder then shows its own bar inside each batch (its rule:
    #: calls of 512 texts and more), since the run's moves once per batch of BATCH_SIZE
    progress: bool = False

    def add(self, batch: list[Document]) -> None:
        """Encode and stage the documents of ``batch`` that are new or changed."""
        existing = {r.id: r for r in self.store.get([d.id for d in batch])}
        todo = [d for d in batch if not _unchanged(existing.get(d.id), d)]
        todo_ids = {d.id for d in todo}
        kept = [d.id for d in batch if d.id not in todo_ids]
        self.seen.update(kept)
        found: dict[str, np.ndarray] = {}
        if self.lines is not None:  # reads only: an interrupt here loses nothing
            self.lines.begin(batch, kept)
            found = self.lines.take(todo)
            self.lines.hold([d.id for d in todo])  # before the writes below replace them
        self.report.unchanged += len(batch) - len(todo) + len(found)
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
        vectors = self._vectors(todo, found)
        ok = np.isfinite(vectors).all(axis=1) & (np.linalg.norm(vectors, axis=1) > 1e-6)
        for d in (d for d, good in zip(todo, ok) if not good):
            self.report.problems.append(Problem(d.source, f"document {d.id} gave a non-finite or zero "
                                                         "vector: left out (a version already indexed stays)", d.position))
            self.seen.add(d.id)  # its last good version, if any, is not pruned as deleted
        keep = [d for d, good in zip(todo, ok) if good]
        replaced = [existing[d.id] for d in keep if d.id in existing] if self.stats is not None else []
        old = self.store.vectors([r.id for r in replaced]) if replaced else None  # before they change
        # the records found at their new lines are written with the encoded ones, in reading
        # order: an interrupt in the encoder leaves none of the batch written
        self.writing = True
        self.store.upsert([self.make_record(d) for d in keep], vectors[ok])
        if self.stats is not None:  # after the writes: a refused upsert counts nothing
            if replaced:
                self.stats.add([r.lang for r in replaced], old, -1)
            self.stats.add([d.lang for d in keep], vectors[ok])
        self.seen.update(d.id for d in keep)
        encoded = [d for d in keep if d.id not in found]
        self.report.documents += len(encoded)
        self.report.languages.update(d.lang or "und" for d in encoded)
        self.since_commit += len(keep)
        self._pace()
        self.writing = False

    def _vectors(self, todo: list[Document], found: dict[str, np.ndarray]) -> np.ndarray:
        """The vectors of ``todo``, in its order: those ``found`` at an old line, the others
        encoded (the encoder's time and cut documents counted)."""
        texts = [d.text for d in todo if d.id not in found]
        if not texts:
            return np.stack([found[d.id] for d in todo])
        t0 = time.perf_counter()
        cut_before = getattr(self.encoder, "documents_cut", 0)
        vectors = self.encoder.encode_documents(texts, progress=None if self.progress else False)
        self.report.encode_seconds += time.perf_counter() - t0
        self.report.cut += getattr(self.encoder, "documents_cut", 0) - cut_before
        if not found:
            return vectors
        encoded = iter(vectors)
        return np.stack([found[d.id] if d.id in found else next(encoded) for d in todo]).astype(np.float32)

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


@dataclass
class _Around:
    """The lines of one file around where the run is in it: the records named by their line
    that the index holds there and no document of the run has taken, and the vectors of those
    whose line the run has written over since."""

    #: lines lo..hi were read (hi: sys.maxsize once a read found the file's old records ended)
    lo: int
    hi: int
    records: dict[int, Any] = field(default_factory=dict)
    #: the lines of each record (:func:`_same`): identical records share one entry
    by_record: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    keys: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    held: dict[int, np.ndarray] = field(default_factory=dict)
    #: the lines read, in order (reads only go forward): the first ones are the first left behind
    order: deque[int] = field(default_factory=deque)

    def add(self, record: Any) -> None:
        line = record.position
        self.records[line], self.keys[line] = record, _same(record)
        self.by_record.setdefault(self.keys[line], []).append(line)
        self.order.append(line)

    def find(self, doc: Document) -> int | None:
        """The first old line within MOVE_WINDOW of ``doc``'s holding its record, if any."""
        return next((n for n in self.by_record.get(_same(doc), ())
                     if n <= doc.position + MOVE_WINDOW and _unchanged(self.records[n], doc)), None)

    def drop(self, line: int) -> None:
        """Forget an old line: taken by a document, kept as it is, or left behind."""
        if self.records.pop(line, None) is not None:
            key = self.keys.pop(line)
            lines = self.by_record[key]
            lines.remove(line)  # mostly the first: lines are taken and left behind in order
            if not lines:
                del self.by_record[key]
        self.held.pop(line, None)

    def leave(self, lo: int) -> None:
        """Forget the old lines before ``lo``: the documents further down do not look there."""
        self.lo = lo
        while self.order and self.order[0] < lo:
            self.drop(self.order.popleft())


@dataclass
class _Lines:
    """Records named by their line (``path#L7``: JSONL and CSV records without an id) found at
    another line. Lines added or removed above a record change its id, not the record: the
    document at its new line takes the vector stored under its old one instead of being encoded
    again, when the record there is the same (text, language, payload and source, what
    :func:`_unchanged` compares; the vector depends on the text alone, and an index's vectors
    all come from its one document encoder). Each old line gives its vector once (identical
    records: one each); the old id is then written over by the document now at that line, or
    pruned with the run's last commit, as any id the source no longer has.

    Records are looked for :data:`MOVE_WINDOW` lines around each new or edited document, read
    ahead as the run goes down a file (a file's documents come together, in line order); an
    old line that a write is about to replace has its vector read first and held until the
    window has passed it. What is read and held stays bounded by the window, whatever the size
    of the file or of the index (nothing lists the index), and the store is only read: each
    record written is a document of this run with the vector of its own text, so a run stopped
    anywhere leaves a sound index.
    """

    store: Sink
    #: the run's ids: a line written or kept by this run is no longer an old line
    seen: set[str]
    owns: Callable[[Any], bool] | None = None
    may_own: Callable[[str], bool] | None = None
    files: dict[str, _Around] = field(default_factory=dict)

    def begin(self, batch: Sequence[Document], kept: Iterable[str]) -> None:
        """Forget the files the run is done with (a file's documents come together) and the
        old lines the batch keeps as they are."""
        sources = {d.source for d in batch}
        for source in [s for s in self.files if s not in sources]:
            del self.files[source]
        for source, line in filter(None, map(_line_of, kept)):
            if source in self.files:
                self.files[source].drop(line)

    def take(self, todo: Sequence[Document]) -> dict[str, np.ndarray]:
        """The stored vectors of the documents of ``todo`` whose record is at an old line, by
        id; those old lines are taken."""
        taken: list[tuple[str, np.ndarray | None, str]] = []  # id, the old line's vector if held, its id
        for doc in todo:
            if not _by_line(doc):
                continue
            around = self._around(doc.source, doc.position)
            line = around.find(doc)
            if line is not None:
                taken.append((doc.id, around.held.get(line), around.records[line].id))
                around.drop(line)
        unread = [old for _, vector, old in taken if vector is None]
        read = dict(zip(unread, self.store.vectors(unread))) if unread else {}
        return {rid: read[old] if vector is None else vector for rid, vector, old in taken}

    def hold(self, ids: Iterable[str]) -> None:
        """Read and keep the vectors of the old lines that writes of ``ids`` are about to
        replace: a document further down may still find its record there."""
        wanted: list[tuple[_Around, int, str]] = []
        for rid in ids:
            at = _line_of(rid)
            around = self.files.get(at[0]) if at else None
            if around is not None and at[1] in around.records and at[1] not in around.held:
                wanted.append((around, at[1], rid))
        if wanted:
            for (around, line, _), vector in zip(wanted, self.store.vectors([rid for _, _, rid in wanted])):
                around.held[line] = vector

    def _around(self, source: str, line: int) -> _Around:
        """The old lines of ``source`` within MOVE_WINDOW of ``line``, read as needed."""
        lo, hi = max(1, line - MOVE_WINDOW), line + MOVE_WINDOW
        around = self.files.get(source)
        if around is None or lo > around.hi + 1:
            # a file the run just reached, or a jump past lines that needed nothing
            around = self.files[source] = _Around(lo, lo - 1)
        if lo > around.lo:
            around.leave(lo)
        # only ever forward, past every line read before: no old line is read, and taken, twice
        while around.hi < hi:  # LINE_PROBE lines at a time, not one more line per document
            first, last = around.hi + 1, around.hi + LINE_PROBE
            if not self._read(source, around, first, last):
                around.hi = sys.maxsize  # past the end of the file's old records
            else:
                around.hi = last
        return around

    def _read(self, source: str, around: _Around, first: int, last: int) -> bool:
        """Add the records at lines ``first``..``last`` that this run has neither written nor
        kept and would prune; whether the index holds any of those lines."""
        ids = [f"{source}#L{n}" for n in range(first, last + 1)]
        fresh = [i for i in ids if i not in self.seen]
        records = self.store.get(fresh) if fresh else []
        for record in records:
            mine = (self.may_own is None or self.may_own(record.id)) and (self.owns is None or self.owns(record))
            if mine and _by_line(record) and record.source == source:
                around.add(record)
        return bool(records) or len(fresh) < len(ids)


def _by_line(item: Any) -> bool:
    """Whether a document or record is named by its line (``path#L7`` at line 7)."""
    return item.id == f"{item.source}#L{item.position}"


def _same(item: Any) -> tuple[str, str, str]:
    """What :func:`_unchanged` compares of a document or record but its source, as a key:
    records of one text that differ in their other fields (a CSV of product rows) are told
    apart without comparing each. A payload a store gives back otherwise written (1.0 for 1)
    only misses the record: it is encoded again."""
    return item.text, item.lang or "und", json.dumps(item.payload, sort_keys=True, default=str)


def _line_of(rid: str) -> tuple[str, int] | None:
    """The source and line of an id that names a line (``path#L7``), else None."""
    source, mark, line = rid.rpartition("#L")
    if mark and line.isascii() and line.isdigit() and str(int(line)) == line:
        return source, int(line)
    return None


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
