"""``vecplug verify``: check an index in full and say what is wrong.

Checks, in order: the index opens (commit record, checksums of every file, read in full
regardless of the fast-open cache); the store's own full check (for hnswlib: SQLite's
integrity check, the graph's checksum and layout, every record's checksum); ids are unique
and counts agree; every vector is finite and of unit length; the language statistics of the
bias correction match the stored vectors; and a sample of documents re-encoded with the
document encoder gives back their stored vectors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vecplug.config import Settings
from vecplug.errors import ConfigError, ModelError, VecplugError

#: a re-encoded document must be this close (cosine) to its stored vector; batching and
#: padding move fp32 results a little, a different model or text moves them far
REENCODE_MIN_COSINE = 0.999
#: ...and this close with int8 document weights: dynamic quantisation gives each activation
#: tensor one scale over the whole batch, so a vector depends on its batch neighbours (ad hoc,
#: me5-small: one short document alone against in a batch, cosine 0.998; the same text cut at
#: 16 tokens instead of 256, 0.93)
REENCODE_MIN_COSINE_INT8 = 0.99


@dataclass
class VerifyReport:
    """What was checked and what was found wrong (no problems: the index is sound)."""

    location: str
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_index(settings: Settings, sample: int = 32, encode: bool = True) -> VerifyReport:
    """Check the index the settings point at; ``sample`` documents are re-encoded if ``encode``
    (none with ``sample`` 0)."""
    from vecplug.api import Index, _store_target

    if sample < 0:
        raise ConfigError(f"the sample of documents to re-encode must be 0 or more, not {sample}")
    report = VerifyReport(str(_store_target(settings)[1]))
    try:
        index = Index.open(settings)
    except VecplugError as exc:
        report.problems.append(f"cannot open: {exc}")
        return report
    with index:
        report.checks.append("opens: commit record and file checksums")
        _store_check(index.store, report)
        ids = _count_check(index.store, report)
        if ids is not None:
            _vector_check(index, ids, report)
            if encode and ids and sample == 0:
                report.checks.append("re-encoding: skipped (a sample of 0 documents)")
            elif encode and ids:
                try:
                    _reencode_check(index, ids, sample, report)
                except ModelError as exc:  # the other checks' findings still stand
                    report.problems.append(f"re-encoding: {exc}; --no-encode runs the other checks alone")
    return report


def _store_check(store: Any, report: VerifyReport) -> None:
    report.problems.extend(store.verify())
    report.checks.append(f"files: the {store.name} store's full check")


def _count_check(store: Any, report: VerifyReport) -> list[str] | None:
    ids = list(store.ids())
    report.checks.append(f"ids and counts: {len(ids)} documents")
    if len(set(ids)) != len(ids):
        report.problems.append(f"{len(ids) - len(set(ids))} duplicate ids")
    if store.count() != len(ids):
        report.problems.append(f"count() says {store.count()}, the ids are {len(ids)}")
    by_lang = sum(store.languages().values())
    if by_lang != len(ids):
        report.problems.append(f"the languages add up to {by_lang} documents, not {len(ids)}")
    return ids


def _with_vectors(store: Any, records: list[Any], report: VerifyReport) -> tuple[list[Any], Any]:
    """The records whose vectors the store holds, with them; each of the others reported."""
    import numpy as np

    kept, vectors = [], []
    for r in records:
        try:
            vectors.append(store.vectors([r.id])[0])
            kept.append(r)
        except (KeyError, RuntimeError):
            report.problems.append(f"document {r.id}: its record has no vector in the index")
    return kept, np.asarray(vectors, dtype=np.float32).reshape(len(kept), int(store.dim))


def _vector_check(index: Any, ids: list[str], report: VerifyReport) -> None:
    import numpy as np

    from vecplug.adapters.bias import LanguageStats

    store, bad = index.store, 0
    fitted = LanguageStats(int(store.dim))
    for start in range(0, len(ids), 4096):
        part = ids[start:start + 4096]
        records = store.get(part)
        try:
            vectors = store.vectors([r.id for r in records])
        except (KeyError, RuntimeError):  # hnswlib: "Label not found"; reported, not a traceback
            records, vectors = _with_vectors(store, records, report)
        norms = np.linalg.norm(vectors, axis=1)
        wrong = ~np.isfinite(vectors).all(axis=1) | (np.abs(norms - 1) > 1e-3)
        for r in (r for r, w in zip(records, wrong) if w):
            bad += 1
            if bad <= 5:  # the first five by name, then the count
                report.problems.append(f"document {r.id}: vector is not finite or not of unit length")
        fitted.add([r.lang for r in records], vectors)
    report.checks.append("vectors: finite, unit length")
    if bad > 5:
        report.problems.append(f"... {bad} such documents in all")
    stored = LanguageStats.from_manifest(store.manifest)
    if stored is None:
        report.checks.append("language statistics: none recorded (fitted on first use)")
        return
    report.checks.append("language statistics: match the stored vectors")
    live = {k: v for k, v in stored.counts.items() if v}
    if live != {k: v for k, v in fitted.counts.items() if v}:
        report.problems.append(f"language statistics count {live}, the index holds "
                               f"{ {k: v for k, v in fitted.counts.items() if v} }")
        return
    for lang in live:
        if not np.allclose(stored.sums[lang], fitted.sums[lang], atol=1e-3 * max(1, live[lang]) ** 0.5):
            report.problems.append(f"language statistics of '{lang}' do not match its stored vectors")


def _reencode_check(index: Any, ids: list[str], sample: int, report: VerifyReport) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    chosen = sorted(rng.choice(len(ids), size=min(sample, len(ids)), replace=False).tolist())
    records = index.store.get([ids[i] for i in chosen])
    try:
        stored = index.store.vectors([r.id for r in records])
    except (KeyError, RuntimeError):  # records without vectors: reported by the vector check
        records, stored = _with_vectors(index.store, records, VerifyReport(report.location))
    if not records:
        return
    fresh = index.encoder.encode_documents([r.text for r in records], progress=False)
    cosines = np.sum(stored * fresh, axis=1) / (
        np.linalg.norm(stored, axis=1) * np.linalg.norm(fresh, axis=1) + 1e-12)
    int8 = index.manifest.get("document_quantize") == "int8"
    least = REENCODE_MIN_COSINE_INT8 if int8 else REENCODE_MIN_COSINE
    report.checks.append(f"re-encoded {len(records)} documents with "
                         f"{index.manifest.get('document_encoder')}{' (int8)' if int8 else ''}: "
                         f"lowest cosine {cosines.min():.5f} (at least {least} expected)")
    for r, c in zip(records, cosines):
        if c < least:
            report.problems.append(f"document {r.id}: stored vector differs from its re-encoding "
                                   f"(cosine {c:.4f})")
