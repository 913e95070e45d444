"""The indexing pipeline on re-runs: what it encodes again, what it keeps, on every store."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import FakeEncoder
from vecplug.adapters.stores import Record, get_store_class
from vecplug.types import Document

DIM = 16


class Counting(FakeEncoder):
    """The fake encoder, keeping every text it encodes."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__(dim)
        self.texts: list[str] = []

    def encode_documents(self, texts: list[str], progress: bool | None = None) -> np.ndarray:
        self.texts += texts
        return super().encode_documents(texts, progress)


def _offsets(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def _write(corpus: Path, records: list[dict[str, Any]], name: str = "lines.jsonl") -> None:
    corpus.mkdir(exist_ok=True)
    (corpus / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def _sync(store: Any, corpus: Path, encoder: FakeEncoder | None = None, **kwargs: Any) -> Any:
    """Bring ``store`` up to date with ``corpus``, as ``vecplug index`` does (pruning)."""
    from vecplug.adapters.bias import LanguageStats
    from vecplug.indexer import pipeline
    from vecplug.indexer.corpus import CorpusOptions, CorpusReader

    reader = CorpusReader(corpus, _offsets, CorpusOptions())
    stats = LanguageStats.from_manifest(store.manifest) or LanguageStats(DIM)
    return pipeline.run(reader.documents(), encoder or FakeEncoder(DIM), store, Record.from_document,
                        lambda text: "en", progress=False, stats=stats, prune=True,
                        keep_sources=lambda: reader.unread, **kwargs)


def _state(store: Any, stats: bool = True) -> dict[str, tuple[Any, ...]]:
    """{id: (text, position, payload)} of every record, each checked against its vector (the fake
    encoder's of its text), and the language statistics against the vectors (``stats``)."""
    from vecplug.adapters.bias import LanguageStats

    ids = sorted(store.ids())
    records = store.get(ids)
    np.testing.assert_allclose(store.vectors(ids), FakeEncoder(DIM).encode_documents([r.text for r in records]),
                               atol=1e-6)
    if not stats:
        return {r.id: (r.text, r.position, r.payload) for r in records}
    stored, fitted = LanguageStats.from_manifest(store.manifest), LanguageStats.fit(store)
    assert {k: v for k, v in stored.counts.items() if v} == fitted.counts
    for lang in fitted.counts:
        np.testing.assert_allclose(stored.sums[lang], fitted.sums[lang], atol=1e-4)
    return {r.id: (r.text, r.position, r.payload) for r in records}


def _clean(tmp_path: Path, corpus: Path) -> dict[str, tuple[Any, ...]]:
    """What a clean build of ``corpus`` holds."""
    store = get_store_class("hnswlib").create(str(tmp_path / "clean"), DIM, {"dim": DIM}, {})
    try:
        _sync(store, corpus)
        return _state(store)
    finally:
        store.close()
        shutil.rmtree(tmp_path / "clean")


def _open(target: tuple[type, str, dict[str, Any]], create: bool = False) -> Any:
    cls, location, options = target
    if create:
        return cls.create(location, DIM, {"dim": DIM}, options)
    return cls.open(location, options, writable=True)


RECORDS = [{"text": f"record {i} about water {i % 7}", "title": f"t{i}"} for i in range(50)]


def test_records_without_an_id_keep_their_vectors_when_lines_above_them_change(
        tmp_path: Path, target: tuple[type, str, dict[str, Any]]) -> None:
    """A record without an id is named by its line (path#L7): a line added at the top of a file
    of 50 renamed all 50, and the run encoded every one of them again. They are stored under
    their new lines with the vectors they had: one text is encoded, the new one."""
    corpus = tmp_path / "corpus"
    _write(corpus, RECORDS)
    store = _open(target, create=True)
    try:
        assert _sync(store, corpus).documents == 50
        _write(corpus, [{"text": "a new first line"}, *RECORDS])
        encoder = Counting()
        report = _sync(store, corpus, encoder, batch_size=16)
        assert encoder.texts == ["a new first line"]
        assert (report.documents, report.unchanged, report.removed) == (1, 50, 0)
        assert _state(store) == _clean(tmp_path, corpus)
        # two lines removed from the top: nothing encoded, the last two lines' ids removed
        _write(corpus, RECORDS[1:])
        encoder = Counting()
        report = _sync(store, corpus, encoder, batch_size=16)
        assert encoder.texts == []
        assert (report.documents, report.unchanged, report.removed) == (0, 49, 2)
        assert _state(store) == _clean(tmp_path, corpus)
    finally:
        store.close()
    store = _open(target)  # as committed
    try:
        assert _state(store) == _clean(tmp_path, corpus)
    finally:
        store.close()


def test_each_old_line_gives_its_vector_once(tmp_path: Path) -> None:
    """Identical records: each old line's vector goes to one record; one more copy is new, and
    encoded. A record whose other fields changed is encoded too (as an edited record with an
    id is), and so is one with an id: it is named by its id, not by a line."""
    corpus = tmp_path / "corpus"
    same = {"text": "the same words"}
    _write(corpus, [same, {"text": "other words"}, same, {"text": "edited", "url": "u1"}])
    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        _sync(store, corpus)
        _write(corpus, [{"text": "first"}, same, {"text": "other words"}, same, same,
                        {"text": "edited", "url": "u2"}, {"id": "k", "text": "other words"}])
        encoder = Counting()
        report = _sync(store, corpus, encoder)
        assert sorted(encoder.texts) == ["edited", "first", "other words", "the same words"]
        assert (report.documents, report.unchanged, report.removed) == (4, 3, 0)
        assert _state(store) == _clean(tmp_path, corpus)
    finally:
        store.close()


@pytest.mark.parametrize("progress", [True, False])
def test_the_encoder_shows_progress_inside_a_batch_when_the_run_does(tmp_path: Path, progress: bool) -> None:
    """The run's bar moves once per batch of BATCH_SIZE documents; within one, the encoder's
    own bar (its default rule) shows how far it is, unless the run shows nothing (``-q``)."""
    from vecplug.indexer import pipeline

    asked: list[bool | None] = []

    class Asked(FakeEncoder):
        def encode_documents(self, texts: list[str], progress: bool | None = None) -> np.ndarray:
            asked.append(progress)
            return super().encode_documents(texts, progress)

    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        documents = [Document(f"d{i}", f"words {i}", "src", i, "en") for i in range(5)]
        pipeline.run(documents, Asked(DIM), store, Record.from_document, None, progress=progress, batch_size=2)
    finally:
        store.close()
    assert asked == [None if progress else False] * 3


def test_records_moved_further_than_the_window_are_encoded_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are looked for within MOVE_WINDOW lines of their new line, above it and below:
    further away, they are encoded again (the index is right either way)."""
    from vecplug.indexer import pipeline

    monkeypatch.setattr(pipeline, "MOVE_WINDOW", 5)
    corpus = tmp_path / "corpus"
    new, newer = [{"text": f"new {i}"} for i in range(5)], [{"text": f"newer {i}"} for i in range(6)]
    _write(corpus, RECORDS[:20])
    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        _sync(store, corpus)
        for lines, encoded, counts in [
                (new + RECORDS[:20], 5, (5, 20, 0)),  # moved down 5 lines: found
                (new + newer + RECORDS[:20], 26, (26, 5, 0)),  # 6 more: not found
                (newer + RECORDS[:20], 0, (0, 26, 5)),  # moved up 5 lines: found
                (RECORDS[:20], 20, (20, 0, 6))]:  # 6 more: not found
            _write(corpus, lines)
            encoder = Counting()
            report = _sync(store, corpus, encoder, batch_size=4)
            assert (len(encoder.texts), (report.documents, report.unchanged, report.removed)) == (encoded, counts)
            assert _state(store) == _clean(tmp_path, corpus)
    finally:
        store.close()


@pytest.mark.parametrize("where", ["encoder", "prune", "writes"])
def test_a_run_moving_records_stopped_anywhere_leaves_a_sound_index(
        tmp_path: Path, target: tuple[type, str, dict[str, Any]], where: str) -> None:
    """Ctrl-C while records move to new lines: in the encoder or while reading what to prune,
    the run commits what it finished, every record with its own text's vector; in the middle
    of a batch's writes it commits nothing. The next run ends where a clean build does, and
    encodes no moved record again but for those of the batch a commit cut off."""
    corpus = tmp_path / "corpus"
    _write(corpus, RECORDS)
    store = _open(target, create=True)
    _sync(store, corpus)
    before = _state(store)
    edited = [{"text": "a new first line"}, *RECORDS[:40], {"text": "edited forty"}, *RECORDS[41:]]
    _write(corpus, edited)

    class Interrupting(Counting):
        def encode_documents(self, texts: list[str], progress: bool | None = None) -> np.ndarray:
            if "edited forty" in texts:
                raise KeyboardInterrupt
            return super().encode_documents(texts, progress)

    if where == "prune":
        store.ids = lambda: (_ for _ in ()).throw(KeyboardInterrupt)  # type: ignore[method-assign]
    if where == "writes":
        upsert, calls = store.upsert, []

        def interrupted_upsert(records: Any, vectors: Any) -> None:
            calls.append(len(records))
            if len(calls) == 3:
                upsert(records[:3], vectors[:3])
                raise KeyboardInterrupt
            upsert(records, vectors)

        store.upsert = interrupted_upsert  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        _sync(store, corpus, Interrupting() if where == "encoder" else Counting(), batch_size=10,
              commit_every=10)
    store.close()
    # a server took the torn batch's writes as they came, and the statistics never took them in
    # (an Index fits them again: tests/test_faults.py)
    torn_server = where == "writes" and target[1].startswith("http")
    store = _open(target)
    try:
        found = _state(store, stats=not torn_server)
        # the batches committed before the stop hold the records at their new lines, each with
        # its own text's vector; nothing is removed
        text, _, payload = before["lines.jsonl#L1"]
        assert found["lines.jsonl#L2"] == (text, 2, payload)
        assert len(found) == (51 if where == "prune" else 50)
        encoder = Counting()
        report = _sync(store, corpus, encoder, batch_size=10, commit_every=10)
        assert _state(store, stats=not torn_server) == _clean(tmp_path, corpus)
        # the edited record, unless encoded before the stop, and the record whose old line a
        # committed batch wrote over (its vector was held for the next batch)
        assert ("edited forty" in encoder.texts) == (where != "prune")
        assert len(encoder.texts) == (0 if where == "prune" else 2)
        assert report.documents + report.unchanged == 51
    finally:
        store.close()
