"""The indexing pipeline: documents -> language -> vectors -> store, in batches.

A batch is committed every ``commit_every`` documents, so an interrupted run keeps what
it finished; re-running skips documents whose text is already in the index unchanged.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vecplug.types import Document, Problem


class DocumentEncoder(Protocol):
    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray: ...


class Sink(Protocol):
    """The part of a vector store the pipeline needs."""

    def get(self, ids: Sequence[str]) -> list[Any]: ...
    def vectors(self, ids: Sequence[str]) -> np.ndarray: ...
    def upsert(self, records: Sequence[Any], vectors: np.ndarray) -> None: ...
    def commit(self, manifest: dict[str, Any] | None = None) -> None: ...


@dataclass
class IndexReport:
    """What one indexing run did, and what it skipped."""

    files: int = 0
    documents: int = 0
    unchanged: int = 0
    tokens: int = 0
    seconds: float = 0.0
    encode_seconds: float = 0.0
    languages: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)

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


def run(documents: Iterable[Document], encoder: DocumentEncoder, store: Sink,
        make_record: Callable[[Document], Any], detect: Callable[[str], str] | None,
        lang: str | None = None, batch_size: int = 256, commit_every: int = 4096,
        manifest: dict[str, Any] | None = None, progress: bool = True,
        count_tokens: Callable[[], int] | None = None, stats: Any = None) -> IndexReport:
    """Index ``documents`` into ``store``; returns what was done and what was skipped.

    ``stats`` (a :class:`vecplug.adapters.bias.LanguageStats` or anything with
    ``add(langs, vectors, sign)`` and ``to_manifest()``) is kept in step with what is written:
    replaced documents' old vectors are subtracted and new ones added, and every commit
    stores it in the manifest with the records it describes.
    """
    from tqdm.auto import tqdm

    report = IndexReport()
    tokens_before = count_tokens() if count_tokens else 0  # loads the encoder: not timed
    start = time.perf_counter()
    since_commit = 0
    bar = tqdm(desc="indexing", unit="doc", disable=not progress)
    for batch in batched(documents, batch_size):
        # language: the flag, else the record's own, else detected
        batch = [d if (d.lang and not lang) else _with_lang(d, lang or (detect(d.text) if detect else None))
                 for d in batch]
        existing = {r.id: r for r in store.get([d.id for d in batch])}
        todo = [d for d in batch if not _unchanged(existing.get(d.id), d)]
        report.unchanged += len(batch) - len(todo)
        if todo:
            t0 = time.perf_counter()
            vectors = encoder.encode_documents([d.text for d in todo], progress=False)
            report.encode_seconds += time.perf_counter() - t0
            ok = np.isfinite(vectors).all(axis=1) & (np.linalg.norm(vectors, axis=1) > 1e-6)
            for d in (d for d, good in zip(todo, ok) if not good):
                report.problems.append(Problem(d.source, f"document {d.id} gave a non-finite or zero "
                                                        "vector: left out", d.position))
            keep = [d for d, good in zip(todo, ok) if good]
            if stats is not None:
                replaced = [existing[d.id] for d in keep if d.id in existing]
                if replaced:
                    stats.add([r.lang for r in replaced], store.vectors([r.id for r in replaced]), -1)
                stats.add([d.lang for d in keep], vectors[ok])
            store.upsert([make_record(d) for d in keep], vectors[ok])
            report.documents += len(keep)
            report.languages.update(d.lang or "und" for d in keep)
            since_commit += len(keep)
            if since_commit >= commit_every:
                store.commit(_with_stats(manifest, stats))
                since_commit = 0
        bar.update(len(batch))
    bar.close()
    store.commit(_with_stats(manifest, stats))
    report.seconds = time.perf_counter() - start
    report.tokens = (count_tokens() - tokens_before) if count_tokens else 0
    return report


def _with_stats(manifest: dict[str, Any] | None, stats: Any) -> dict[str, Any] | None:
    if stats is None:
        return manifest
    return {**(manifest or {}), **stats.to_manifest()}


def _with_lang(doc: Document, lang: str | None) -> Document:
    from dataclasses import replace

    return replace(doc, lang=lang)


def _unchanged(old: Any, doc: Document) -> bool:
    return (old is not None and old.text == doc.text and old.lang == doc.lang
            and old.payload == doc.payload and old.source == doc.source)
