"""Stateful tests of the store contract (vecplug.adapters.stores.base.VectorStore).

A seeded, derandomised Hypothesis state machine drives every embedded store with upserts,
edits, deletes, commits, crashes (close without commit) and reopens, and after every step
compares what the store reports with a plain dict: the staged view while the store is open,
the committed view after a crash or a reopen ("an index opens as exactly some committed
state"). Below it, the embedded Qdrant store's redo log: a crash after the commit point
(the redo file's rename) and before the shard has the ops, real SIGKILLs, torn redo files.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings, strategies as st  # noqa: E402
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition,  # noqa: E402
                                 rule, run_state_machine_as_test)

from vecplug.adapters.stores.base import Record  # noqa: E402
from vecplug.errors import CorruptIndexError, VecplugError  # noqa: E402

DIM = 8
POOL = [f"doc-{i}" for i in range(6)]  # small: edits, re-adds and deletes of known ids are common
LANGS = ["en", "de", None]
MANIFEST = {"document_encoder": "fake"}
SETTINGS = settings(max_examples=30, stateful_step_count=30, deadline=None, derandomize=True,
                    database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _hnsw() -> type:
    from vecplug.adapters.stores.hnsw import HnswStore
    return HnswStore


def _qdrant() -> type:
    pytest.importorskip("qdrant_edge")
    from vecplug.adapters.stores.qdrant import QdrantStore
    return QdrantStore


STORES = {"hnswlib": _hnsw, "qdrant-edge": _qdrant}
#: options a store is created with, by name: hnswlib also with its graph of language-centred
#: vectors, whose anchors are set again as languages grow (its documents moved in the graph)
VARIANTS = {"hnswlib": ("hnswlib", {}), "hnswlib-centred": ("hnswlib", {"centred": True}),
            "qdrant-edge": ("qdrant-edge", {})}


def vector(seed: int) -> np.ndarray:
    """The vector of a content: fixed per seed, so equal contents tie exactly."""
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def record(doc_id: str, seed: int, lang: str | None, version: int) -> Record:
    return Record(doc_id, f"text {seed} — grüße 文档", f"src/{doc_id}.md", version, lang,
                  {"seed": seed, "version": version, "tags": ["a", {"b": [1, 2.5, None]}]})


Model = dict[str, tuple[Record, np.ndarray]]


def check_store(store: Any, model: Model) -> None:
    """Everything the store reports agrees with ``model``."""
    expect = [model[i][0] for i in POOL + ["never"] if i in model]
    assert store.get(POOL + ["never"]) == expect
    assert store.get(list(reversed(POOL))) == list(reversed(expect))
    assert store.count() == len(model)
    assert sorted(store.ids()) == sorted(model)
    ids = sorted(model)
    got = store.vectors(ids)
    assert got.shape == (len(ids), DIM)
    if ids:
        np.testing.assert_allclose(got, np.stack([model[i][1] for i in ids]), atol=1e-5)
    missing = next((i for i in POOL if i not in model), "never")  # deleted, if one is
    with pytest.raises(KeyError):
        store.vectors([*ids[:1], missing])
    langs = collections.Counter(rec.lang or "und" for rec, _ in model.values())
    assert {k: v for k, v in store.languages().items() if v} == dict(langs)


class StoreMachine(RuleBasedStateMachine):
    """One store in a fresh folder; ``model`` is the staged view, ``committed`` the last commit."""

    store_cls: type
    create_options: dict[str, Any] = {}

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="vecplug-sm-"))
        self.location = str(self.folder / "idx")
        self.store: Any = self.store_cls.create(self.location, DIM, dict(MANIFEST), dict(self.create_options))
        self.model: Model = {}
        self.committed: Model = {}
        self.version = 0
        self.commits = 0

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _upsert(self, ids: list[str], seeds: list[int], langs: list[str | None]) -> None:
        self.version += 1
        recs = [record(i, s, lang, self.version) for i, s, lang in zip(ids, seeds, langs)]
        vecs = np.stack([vector(s) for s in seeds])
        self.store.upsert(recs, vecs)
        self.model.update((r.id, (r, v)) for r, v in zip(recs, vecs))

    def _open(self, writable: bool) -> None:
        self.store = self.store_cls.open(self.location, {}, writable=writable)

    # -- rules ----------------------------------------------------------------------------

    @rule(ids=st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True),
          seeds=st.lists(st.integers(0, 40), min_size=3, max_size=3),
          langs=st.lists(st.sampled_from(LANGS), min_size=3, max_size=3))
    def add(self, ids: list[str], seeds: list[int], langs: list[str | None]) -> None:
        self._upsert(ids, seeds[:len(ids)], langs[:len(ids)])

    @precondition(lambda self: self.model)
    @rule(data=st.data(), seed=st.integers(0, 40), lang=st.sampled_from(LANGS))
    def edit(self, data: st.DataObject, seed: int, lang: str | None) -> None:
        doc_id = data.draw(st.sampled_from(sorted(self.model)), label="edited")
        self._upsert([doc_id], [seed], [lang])

    @rule(ids=st.lists(st.sampled_from(POOL + ["never"]), min_size=1, max_size=3))
    def delete(self, ids: list[str]) -> None:
        self.store.delete(ids)
        for i in ids:
            self.model.pop(i, None)

    @rule()
    def commit(self) -> None:
        self.commits += 1
        self.store.commit({"commits": self.commits})
        self.committed = dict(self.model)

    @rule()
    def crash(self) -> None:
        """Close without commit, reopen: the last commit, nothing staged after it."""
        self.store.close()
        self.store = None
        self._open(writable=True)
        self.model = dict(self.committed)

    @rule()
    def reopen(self) -> None:
        """Commit, close, look at it read-only, reopen for writing."""
        self.commit()
        self.store.close()
        self.store = None
        self._open(writable=False)
        check_store(self.store, self.committed)
        self.store.close()
        self.store = None
        self._open(writable=True)

    @rule()
    def peek(self) -> None:
        """A second, read-only handle while the writer has staged writes: the last commit
        (hnswlib), or a clean refusal (an edge shard is held by one handle at a time)."""
        try:
            other = self.store_cls.open(self.location, {})
        except VecplugError as exc:
            assert self.store_cls.name == "qdrant" and "open elsewhere" in str(exc)
            return
        try:
            check_store(other, self.committed)
            assert other.manifest.get("commits") == (self.commits or None)
        finally:
            other.close()

    @precondition(lambda self: self.model)
    @rule(data=st.data(), k=st.integers(1, len(POOL) + 1),
          lang=st.sampled_from([None, "en", "de", "und"]))
    def search(self, data: st.DataObject, k: int, lang: str | None) -> None:
        target = data.draw(st.sampled_from(sorted(self.model)), label="target")
        query = self.model[target][1]
        langs = None if lang is None else [lang]
        eligible = {i: e for i, e in self.model.items() if lang is None or (e[0].lang or "und") == lang}
        hits = self.store.search(query, k, langs)
        assert len(hits) == min(k, len(eligible))
        assert len({h.record.id for h in hits}) == len(hits)
        for h in hits:  # only docs of the current view, as they are now
            assert h.record.id in eligible
            rec, vec = eligible[h.record.id]
            assert h.record == rec
            assert h.score == pytest.approx(float(vec @ query), abs=1e-4)
        best = sorted((float(v @ query) for _, v in eligible.values()), reverse=True)[:k]
        np.testing.assert_allclose([h.score for h in hits], best, atol=1e-4)
        if target in eligible:  # the doc itself is found, unless as many exact ties beat it
            assert hits[0].score == pytest.approx(1.0, abs=1e-4)
            ties = sum(1 for _, v in eligible.values() if float(v @ query) > 1 - 1e-4)
            if ties <= k:
                assert target in {h.record.id for h in hits}

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        check_store(self.store, self.model)

    @invariant()
    def manifest_is_last_commit(self) -> None:
        manifest = self.store.manifest
        assert manifest["document_encoder"] == "fake" and manifest["dim"] == DIM
        assert manifest.get("commits") == (self.commits or None)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_store_state_machine(name: str) -> None:
    store, options = VARIANTS[name]
    cls = STORES[store]()
    machine = type(f"{cls.__name__}Machine", (StoreMachine,), {"store_cls": cls, "create_options": options})
    run_state_machine_as_test(machine, settings=SETTINGS)


# -- the embedded Qdrant store's redo log -----------------------------------------------------

def _docs(n: int, start: int = 0, seed: int = 0) -> tuple[list[Record], np.ndarray]:
    recs = [record(f"doc-{i}", seed + i, LANGS[i % 3], 0) for i in range(start, start + n)]
    return recs, np.stack([vector(seed + i) for i in range(start, start + n)])


def check_model(store: Any, model: Model) -> None:
    ids = sorted(model)
    assert store.count() == len(model)
    assert sorted(store.ids()) == ids
    assert store.get(ids + ["never"]) == [model[i][0] for i in ids]
    np.testing.assert_allclose(store.vectors(ids), np.stack([model[i][1] for i in ids]), atol=1e-5)
    langs = collections.Counter(rec.lang or "und" for rec, _ in model.values())
    assert {k: v for k, v in store.languages().items() if v} == dict(langs)


def _state(store: Any) -> dict[str, Any]:
    ids = sorted(store.ids())
    return {"ids": ids, "count": store.count(), "records": store.get(ids),
            "vectors": store.vectors(ids).round(5).tolist(), "languages": store.languages(),
            "manifest": store.manifest}


def _staged_second_commit(location: str) -> tuple[Any, dict[str, Any], Model]:
    """An index committed once (doc-0..9), then staged: doc-7..9 edited, 297 new docs (two
    upsert batches), doc-0 and doc-1 deleted. Returns the open writer, the first commit's
    state, and the model of the state the next commit makes."""
    store = _qdrant().create(location, DIM, dict(MANIFEST), {})
    recs, vecs = _docs(10)
    store.upsert(recs, vecs)
    store.commit({"commits": 1})
    first = _state(store)
    model: Model = {r.id: (r, v) for r, v in zip(recs, vecs)}
    recs, vecs = _docs(300, start=7, seed=1000)
    store.upsert(recs, vecs)
    store.delete(["doc-0", "doc-1", "never"])
    model.update((r.id, (r, v)) for r, v in zip(recs, vecs))
    del model["doc-0"], model["doc-1"]
    return store, first, model


def test_qdrant_crash_after_commit_point_is_finished_on_open(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The redo file is in place but the shard never saw its ops: the commit happened, and
    the next open (read-only here) applies it."""
    from vecplug.adapters.stores import qdrant

    folder = tmp_path / "idx"
    writer, _, model = _staged_second_commit(str(folder))
    check_model(writer, model)  # the staged view over the shard: deletes and edits shadow it
    assert {h.record.id for h in writer.search(_docs(1)[1][0], 3)}.isdisjoint({"doc-0"})

    def crash(self: Any, *args: Any) -> None:
        raise KeyboardInterrupt("simulated crash after the rename")

    monkeypatch.setattr(qdrant._Edge, "_apply", crash)
    with pytest.raises(KeyboardInterrupt):
        writer.commit({"commits": 2})
    monkeypatch.undo()
    writer.close()
    assert (folder / qdrant.REDO).is_file()
    assert json.loads((folder / "manifest.json").read_text())["manifest"]["commits"] == 1

    reader = _qdrant().open(str(folder), {})
    try:
        assert not (folder / qdrant.REDO).exists()
        assert json.loads((folder / "manifest.json").read_text())["manifest"]["commits"] == 2
        assert reader.manifest["commits"] == 2 and reader.count() == len(model) == 305
        check_model(reader, model)
        rec, vec = model["doc-12"]
        hit = reader.search(vec, 1)[0]
        assert hit.record == rec and hit.score == pytest.approx(1.0, abs=1e-4)
    finally:
        reader.close()


def test_qdrant_crash_before_commit_point_keeps_last_commit(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Torn while writing the redo file (before its rename): the previous commit; the torn
    temporary file is removed by the next open."""
    from vecplug.adapters.stores import qdrant

    folder = tmp_path / "idx"
    writer, first, _ = _staged_second_commit(str(folder))

    def torn(path: Path, data: bytes) -> None:
        (path.parent / f".{path.name}.{os.getpid()}.tmp").write_bytes(data[:len(data) // 2])
        raise KeyboardInterrupt("simulated crash while writing the redo file")

    monkeypatch.setattr(qdrant, "atomic_write_bytes", torn)
    with pytest.raises(KeyboardInterrupt):
        writer.commit({"commits": 2})
    monkeypatch.undo()
    writer.close()
    assert not (folder / qdrant.REDO).exists()
    reopened = _qdrant().open(str(folder), {}, writable=True)
    try:
        assert _state(reopened) == first
        assert not [n for n in os.listdir(folder) if n.startswith(".pending")]
    finally:
        reopened.close()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_qdrant_damaged_redo_file_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         damage: str) -> None:
    from vecplug.adapters.stores import qdrant

    cls = _qdrant()
    loc = tmp_path / "idx"
    writer = cls.create(str(loc), DIM, dict(MANIFEST), {})
    writer.upsert(*_docs(10))
    writer.commit({"commits": 1})
    before = _state(writer)
    writer.upsert(*_docs(5, start=20))
    monkeypatch.setattr(qdrant._Edge, "_apply", lambda self, *a: None)  # crash after the rename
    writer.commit({"commits": 2})
    monkeypatch.undo()
    writer.close()
    redo = loc / qdrant.REDO
    data = redo.read_bytes()
    redo.write_bytes({"truncate": data[:-7], "flip": data[:100] + bytes([data[100] ^ 1]) + data[101:],
                      "garbage": b"not a redo file at all" * 3, "empty": b""}[damage])
    for writable in (False, True):  # and the failed open released the shard's lock
        with pytest.raises(CorruptIndexError, match="redo log"):
            cls.open(str(loc), {}, writable=writable)
    redo.unlink()  # what the message says to do: the previous commit
    store = cls.open(str(loc), {})
    try:
        assert _state(store) == before
    finally:
        store.close()


_CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_state_machine import _docs, DIM, MANIFEST
    from vecplug.adapters.stores import qdrant
    from vecplug.adapters.stores.qdrant import QdrantStore

    where = sys.argv[1]
    store = QdrantStore.create(sys.argv[2], DIM, dict(MANIFEST), {{}})
    store.upsert(*_docs(10))
    store.commit({{"commits": 1}})
    store.upsert(*_docs(300, start=7, seed=1000))
    store.delete(["doc-0", "doc-1"])
    if where == "staged":  # writes after the last commit, then killed
        os.kill(os.getpid(), signal.SIGKILL)
    real, calls = qdrant._Edge._apply, []
    def update_then_die(shard_update):
        def wrapped(op):
            shard_update(op)
            calls.append(op)
            if len(calls) == 2:  # the deletes and the first upsert batch are in the WAL
                os.kill(os.getpid(), signal.SIGKILL)
        return wrapped
    def apply(self, *args):
        self.shard = type("S", (), {{"update": staticmethod(update_then_die(self.shard.update)),
                                    "__getattr__": lambda s, n, sh=self.shard: getattr(sh, n)}})()
        real(self, *args)
    qdrant._Edge._apply = apply
    store.commit({{"commits": 2}})
    raise SystemExit("not killed")
""")


@pytest.mark.parametrize("where", ["staged", "mid-apply"])
def test_qdrant_sigkill(tmp_path: Path, where: str) -> None:
    """A real crash: SIGKILL with writes staged (the last commit survives), or half-way through
    applying a commit to the shard (the redo log finishes it on open)."""
    from vecplug.adapters.stores import qdrant

    cls = _qdrant()
    loc = tmp_path / "idx"
    code = _CHILD.format(tests=str(Path(__file__).parent))
    proc = subprocess.run([sys.executable, "-c", code, where, str(loc)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert (loc / qdrant.REDO).exists() == (where == "mid-apply")
    model: Model = {r.id: (r, v) for r, v in zip(*_docs(10))}
    if where == "mid-apply":
        model.update((r.id, (r, v)) for r, v in zip(*_docs(300, start=7, seed=1000)))
        del model["doc-0"], model["doc-1"]
    store = cls.open(str(loc), {}, writable=True)
    try:
        assert store.manifest["commits"] == (1 if where == "staged" else 2)
        check_model(store, model)
        assert not (loc / qdrant.REDO).exists()
    finally:
        store.close()
