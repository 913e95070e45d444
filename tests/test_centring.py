"""The hnswlib store's graph of language-centred vectors (adapters/stores/centring.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vecplug.adapters import bias, modes
from vecplug.adapters.stores import Record, centring, hnsw
from vecplug.adapters.stores.hnsw import HnswStore

DIM = 24
LANGS = ("en", "de", "zh", "fr")


def corpus(n: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Unit vectors of 40 topics, each language's shifted its own way (a strong language bias:
    a plain ranking puts the query's language first), languages in turn."""
    rng = np.random.default_rng(seed)
    topics = rng.normal(size=(40, DIM))
    shift = rng.normal(size=(len(LANGS), DIM))
    which = np.arange(n) % len(LANGS)
    X = topics[rng.integers(0, 40, n)] + 0.9 * shift[which] + 0.5 * rng.normal(size=(n, DIM))
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32), [LANGS[i] for i in which]


def build(folder: Path, X: np.ndarray, langs: list[str], centred: bool, batch: int = 400,
          order: np.ndarray | None = None) -> bias.LanguageStats:
    order = np.arange(len(X)) if order is None else order
    store = HnswStore.create(str(folder), DIM, {"dim": DIM}, {"centred": True} if centred else {})
    stats = bias.LanguageStats(DIM)
    try:
        for a in range(0, len(order), batch):
            part = order[a:a + batch]
            store.upsert([Record(f"d{i}", f"t{i}", "s", 0, langs[i], {}) for i in part], X[part])
            stats.add([langs[i] for i in part], X[part])
        store.commit(stats.to_manifest())
    finally:
        store.close()
    return stats


def ids(hits: Any) -> list[int]:
    return [int(h.record.id[1:]) for h in hits]


def test_uncentre_gives_back_unit_vectors() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, DIM)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    # anchors of every size a mean of unit vectors can have, down to 0 (no centring) and up to 1
    A = rng.normal(size=(200, DIM))
    A *= (np.linspace(0.0, 1.0, 200) / np.linalg.norm(A, axis=1))[:, None]
    A[-1] = X[-1]  # a document that is its own anchor (centred: zero) comes back too
    C = centring.centre(X, A.astype(np.float32))
    assert np.allclose(np.linalg.norm(C[:-1], axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(centring.uncentre(C, A.astype(np.float32)), X, atol=2e-5)


def test_anchors_are_reset_as_a_language_grows_until_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(centring, "ANCHOR_SETTLED", 64)
    anchors = centring.Anchors(DIM)
    X, _ = corpus(1000)
    due, start = [], 0
    for n in (3, 8, 1, 40, 200, 400):
        due.append(anchors.add(["en"] * n, X[start:start + n]))
        start += n
        for lang in due[-1]:
            anchors.reset(lang)
    # counts: 3 (new), 11 (< 4 x 3), 12 (set), 52 (>= 4 x 12), 252 (>= 4 x 52, set from 52 < 64),
    # 652 (set from 252: settled)
    assert due == [["en"], [], ["en"], ["en"], ["en"], []]
    assert anchors.anchored["en"] == 252 and anchors.counts["en"] == 652
    back = centring.Anchors.from_meta(anchors.to_meta(), DIM)
    assert back.anchored == anchors.anchored and back.counts == anchors.counts
    np.testing.assert_array_equal(back.anchors["en"], anchors.anchors["en"])
    # a language's anchor is its mean, shrunk towards everything's by SHRINK documents' worth
    assert np.allclose(back.anchors["en"], X[:252].mean(axis=0), atol=0.05)
    np.testing.assert_array_equal(anchors.rows(["xx"])[0], np.zeros(DIM, dtype=np.float32))


def test_the_corrected_search_is_one_walk_on_a_centred_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    X, langs = corpus(4000)
    stats = build(tmp_path / "c", X, langs, centred=True)
    build(tmp_path / "p", X, langs, centred=False)
    means = stats.means()
    C = means.centre(X, langs)
    asked: list[str] = []
    real = HnswStore.candidates_per_language
    monkeypatch.setattr(HnswStore, "candidates_per_language",
                        lambda self, *a, **kw: asked.append(str(self.folder)) or real(self, *a, **kw))
    scanned: list[str] = []
    real_scan = HnswStore.centred_search_batch
    monkeypatch.setattr(HnswStore, "centred_search_batch",
                        lambda self, *a, **kw: scanned.append(str(self.folder)) or real_scan(self, *a, **kw))
    centred, plain = HnswStore.open(str(tmp_path / "c"), {}), HnswStore.open(str(tmp_path / "p"), {})
    try:
        assert centred.centred and not plain.centred
        found = 0
        for qi in range(0, 400, 10):
            truth = np.argsort(-(C @ means.centre_query(X[qi], langs[qi])))[:10]
            hits = modes.first_stage(centred, X[qi], langs[qi], "xy", 10, None, means)
            found += len(set(ids(hits)) & set(truth.tolist()))
            # exact centred cosines, best first
            np.testing.assert_allclose([h.score for h in hits], C[ids(hits)] @ means.centre_query(X[qi], langs[qi]),
                                       atol=1e-5)
        assert found / 400 >= 0.95
        assert not asked  # no language asked on its own
        # no second copy of the vectors: one of the index's dimension a document, as in a plain
        # graph, whose file is as large (but for hnswlib's random upper levels: a few link lists)
        assert (centred._index.dim, centred._index.get_current_count()) == (plain._index.dim, 4000) == (DIM, 4000)
        sizes = [next((tmp_path / name).glob("vectors-*.hnsw")).stat().st_size for name in ("c", "p")]
        assert abs(sizes[0] - sizes[1]) < 0.005 * sizes[1]
        assert not scanned  # the centred graph's one walk comes first
        # a plain graph whose languages it scans: one exact scan of them all, ranked at once
        modes.first_stage(plain, X[0], langs[0], "xy", 10, None, means)
        assert (asked, scanned) == ([], [str(tmp_path / "p")])
        monkeypatch.setattr(hnsw, "scan_limit", lambda total: 10)  # ... and one it walks
        plain._forget_filters()  # (kept until the next write)
        modes.first_stage(plain, X[0], langs[0], "xy", 10, None, means)
        assert asked == [str(tmp_path / "p")]
        # a chosen set of languages, and consensus, still go language by language
        modes.first_stage(centred, X[0], langs[0], "xy", 10, ["de", "zh"], means)
        assert asked[-1] == str(tmp_path / "c")
    finally:
        centred.close()
        plain.close()


@pytest.mark.parametrize("scan", ["exact scans", "walks"])
def test_plain_searches_on_a_centred_graph_answer_as_a_plain_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 scan: str) -> None:
    if scan == "walks":  # every language walked (the graph's order is the centred one)
        monkeypatch.setattr(hnsw, "scan_limit", lambda total: 10)
    X, langs = corpus(4000)
    build(tmp_path / "c", X, langs, centred=True)
    store = HnswStore.open(str(tmp_path / "c"), {})
    L = np.asarray(langs)
    try:
        pooled = mono = 0
        for qi in range(1, 400, 10):
            q = X[qi]
            hits = store.search(q, 10)
            pooled += len(set(ids(hits)) & set(np.argsort(-(X @ q))[:10].tolist()))
            np.testing.assert_allclose([h.score for h in hits], X[ids(hits)] @ q, atol=1e-5)
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            own = modes.first_stage(store, q, langs[qi], "mono", 10)
            assert {h.record.lang for h in own} == {langs[qi]}
            mono += len(set(ids(own)) & set(np.argsort(-np.where(L == langs[qi], X @ q, -2.0))[:10].tolist()))
        floor = 400 if scan == "exact scans" else 0.95 * 400
        assert pooled >= floor and mono >= floor
    finally:
        store.close()


def test_a_corpus_arriving_language_by_language_is_centred_by_its_own_means(tmp_path: Path) -> None:
    """Each language's first documents come at the end of a batch of another's: its anchor, set
    from a few, is set again as it grows, its documents moved in the graph with it."""
    X, langs = corpus(4000)
    order = np.argsort(np.asarray(langs), kind="stable")
    stats = build(tmp_path / "c", X, langs, centred=True, batch=300, order=order)
    store = HnswStore.open(str(tmp_path / "c"), {"centred": False})  # not an option at open
    try:
        assert store.centred
        anchors = store._anchor_state()
        means = stats.means()
        for lang in LANGS:
            assert anchors.anchored[lang] >= 256  # set again, from many
            assert np.linalg.norm(anchors.anchors[lang] - means.of(lang)) < 0.1
        every = [f"d{i}" for i in range(len(X))]
        np.testing.assert_allclose(store.vectors(every), X, atol=2e-5)
        # the graph's nodes moved with their anchors: each document finds itself first
        for qi in range(0, 4000, 97):
            assert ids(store.hits(store.centred_candidates(means.centre(X[qi:qi + 1], [langs[qi]])[0], 1))) == [qi]
    finally:
        store.close()


def test_a_plain_graph_stays_plain_and_answers_no_centred_walk(tmp_path: Path) -> None:
    X, langs = corpus(200)
    build(tmp_path / "p", X, langs, centred=False)
    store = HnswStore.open(str(tmp_path / "p"), {"centred": True})
    try:
        assert not store.centred and store.centred_candidates(X[0], 5) is None
        assert "centred" not in store.manifest["store"]
        np.testing.assert_array_equal(store.vectors(["d3"])[0], X[3])
    finally:
        store.close()


def test_a_failed_commit_drops_the_anchors_it_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    X, langs = corpus(600)
    build(tmp_path / "c", X[:300], langs[:300], centred=True)
    store = HnswStore.open(str(tmp_path / "c"), {}, writable=True)
    try:
        before = store._anchor_state().to_meta()
        store.upsert([Record(f"n{i}", "t", "s", 0, "ja", {}) for i in range(300, 600)], X[300:])
        assert "ja" in store._anchor_state().anchors
        monkeypatch.setattr(hnsw, "file_sha256", lambda path: (_ for _ in ()).throw(OSError(28, "No space left")))
        with pytest.raises(Exception, match="No space left"):
            store.commit()
        assert store._anchor_state().to_meta() == before
    finally:
        store.close()
    reopened = HnswStore.open(str(tmp_path / "c"), {})
    try:
        assert "ja" not in reopened._anchor_state().anchors
        np.testing.assert_allclose(reopened.vectors(["d7"])[0], X[7], atol=2e-5)
    finally:
        reopened.close()
