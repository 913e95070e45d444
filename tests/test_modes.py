"""Retrieval modes and the language-bias correction (vecplug.adapters.modes / bias)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import vecplug
from vecplug.adapters.bias import SHRINK, LanguageStats
from vecplug.adapters.modes import apply_preference, first_stage, target_languages
from vecplug.adapters.stores import Record, StoreHit, get_store_class
from vecplug.errors import ConfigError, QueryError
from vecplug.indexer import pipeline

DIM = 8
COPIES = 20


def biased_corpus(seed: int = 0) -> tuple[list[Record], np.ndarray, dict[str, np.ndarray]]:
    """Topic t in language L: topic direction + a strong per-language direction, so that a
    raw cosine ranks any same-language document above the right topic in another language."""
    rng = np.random.default_rng(seed)
    lang_dirs = {"en": np.eye(DIM)[0] * 3.0, "de": np.eye(DIM)[1] * 3.0}
    topics = [np.eye(DIM)[2 + t] for t in range(5)]
    records, vecs = [], []
    for lang, offset in lang_dirs.items():
        for t, topic in enumerate(topics):
            for copy in range(COPIES):  # enough documents per language for a firm mean
                v = topic * 2.0 + offset + rng.normal(scale=0.05, size=DIM)
                records.append(Record(f"{lang}-{t}-{copy}", f"topic {t}", "x", t, lang))
                vecs.append(v / np.linalg.norm(v))
    return records, np.asarray(vecs, dtype=np.float32), lang_dirs


@pytest.fixture
def store(tmp_path: Path):
    records, vecs, _ = biased_corpus()
    s = get_store_class("hnswlib").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    s.upsert(records, vecs)
    s.commit()
    yield s
    s.close()


def query(topic: int, lang_dirs: dict[str, np.ndarray], lang: str = "en") -> np.ndarray:
    v = np.eye(DIM)[2 + topic] * 2.0 + lang_dirs[lang]
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_target_languages() -> None:
    assert target_languages("xy", "en") is None
    assert target_languages("xy", "en", ["de", "fr"]) == ["de", "fr"]
    assert target_languages("mono", "en", ["de"]) == ["en"]
    with pytest.raises(QueryError, match="--lang"):
        target_languages("mono", "und")
    with pytest.raises(ConfigError, match="unknown mode"):
        target_languages("zz", "en")


def test_language_bias_is_corrected(store) -> None:
    records, vecs, dirs = biased_corpus()
    stats = LanguageStats(DIM)
    stats.add([r.lang for r in records], vecs)
    means = stats.means()
    q = query(3, dirs)
    raw = first_stage(store, q, "en", "xy", 2 * COPIES)
    # without the correction every English document beats the German ones on the same topic
    assert {h.record.lang for h in raw} == {"en"}
    fixed = first_stage(store, q, "en", "xy", 2 * COPIES, means=means)
    assert {h.record.position for h in fixed} == {3} and {h.record.lang for h in fixed} == {"en", "de"}
    # centred scores are exact cosines of centred vectors
    de = next(h for h in fixed if h.record.lang == "de")
    d = vecs[[r.id for r in records].index(de.record.id)] - means.of("de")
    qc = q - means.of("en")
    assert de.score == pytest.approx(float(d @ qc / np.linalg.norm(d) / np.linalg.norm(qc)), abs=1e-5)
    # mono is untouched by the correction; target languages restrict the pool
    assert [h.record.lang for h in first_stage(store, q, "en", "mono", 3, means=means)] == ["en"] * 3
    assert {h.record.lang for h in first_stage(store, q, "en", "xy", 3, ["de"], means)} == {"de"}


@pytest.mark.parametrize("centred", [False, True], ids=["plain-graph", "centred-graph"])
def test_hnswlib_scanned_languages_rank_by_centred_cosine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          centred: bool) -> None:
    """The correction on the hnswlib store, every language small enough to scan (a graph of
    centred vectors: for a chosen set of languages, searched one by one as well): the scans
    rank by centred cosine (the means passed as hints), so it finds the exact top 10 by
    ``cos(q - m[lang(q)], d - m[lang(d)])`` (brute force), also with other means than the
    index's and after a write searched with the same means; on vectors where each language's best by ``q . x``, rescored, are not its best
    centred (the rule it followed before: shown missing). A walked language ignores the means."""
    from conftest import crowded_vectors, exact_top_k

    from vecplug.adapters import bias
    from vecplug.adapters.stores import hnsw

    dim, langs = 48, ("en", "de", "fr")
    base, queries = crowded_vectors(6_600, dim, seed=8, queries=20)
    shifts = 0.3 * np.random.default_rng(8).standard_normal((3, dim)).astype(np.float32) / np.sqrt(dim)
    base = base + shifts[np.arange(6_600) % 3]
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    doc_langs = [langs[i % 3] for i in range(6_600)]
    qlangs = [langs[i % 3] for i in range(len(queries))]
    stats = LanguageStats(dim)
    stats.add(doc_langs[:6_000], base[:6_000])
    means = stats.means()
    other = bias.LanguageMeans({lang: m + 0.2 * np.eye(dim, dtype=np.float32)[i]
                                for i, (lang, m) in enumerate(means.by_lang.items())}, means.overall)

    pool = ["en", "de"] if centred else list(langs)

    def exact(m: bias.LanguageMeans, n: int = 6_000) -> list[list[str]]:
        docs = np.asarray([i for i in range(n) if doc_langs[i] in pool])
        ids, _ = exact_top_k(m.centre(base[docs], [doc_langs[i] for i in docs]), m.centre(queries, qlangs), 10)
        return [[f"d{docs[j]}" for j in row] for row in ids]

    def search(m: bias.LanguageMeans) -> list[list[str]]:
        return [[h.record.id for h in bias.centred_search(store, m, q, ql, 10, pool)] for q, ql in zip(queries, qlangs)]

    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), dim, {"dim": dim},
                                              {"centred": True} if centred else {})
    try:
        store.upsert([Record(f"d{i}", "t", "s", i, doc_langs[i]) for i in range(6_000)], base[:6_000])
        store.commit(stats.to_manifest())
        for m in (means, other, means):  # (the scales kept per mean: the first ones again)
            assert search(m) == exact(m)
        centred_queries = means.centre(queries, qlangs)
        plain = [bias.best_centred(store, means, q, store.candidates_per_language(q, 20, pool), 10)
                 for q in centred_queries]
        assert [[h.record.id for h in hits] for hits in plain] != exact(means)
        # a write, searched with the same means: the scales kept for them went with it
        store.upsert([Record(f"d{i}", "t", "s", i, doc_langs[i]) for i in range(6_000, 6_600)], base[6_000:])
        stats.add(doc_langs[6_000:], base[6_000:])
        store.commit(stats.to_manifest())
        assert search(means) == exact(means, 6_600)
        # a language walked (every one here) is not ranked by the means: its walk's own order
        store._forget_filters()
        monkeypatch.setattr(hnsw, "scan_limit", lambda total: 10)
        walked = store.candidates_per_language(centred_queries[0], 5, ["en"], means={"en": means.of("en")})
        assert len(walked) == 5
        assert [c.score for c in walked] == pytest.approx(base[[c.key for c in walked]] @ centred_queries[0], abs=1e-5)
    finally:
        store.close()


def test_prefer_ranks_the_query_language_up(store) -> None:
    _, _, dirs = biased_corpus()
    hits = [StoreHit(Record("a", "", "", 0, "de"), 0.80), StoreHit(Record("b", "", "", 0, "en"), 0.77),
            StoreHit(Record("c", "", "", 0, "en"), 0.60)]
    assert [h.record.id for h in apply_preference(hits, "en", 0.05)] == ["b", "a", "c"]
    assert [h.record.id for h in apply_preference(hits, "en", 0.01)] == ["a", "b", "c"]
    # the candidates of prefer include the query language's best even when the pool's are all others
    cands = first_stage(store, query(1, dirs), "en", "prefer", 2, ["de"])
    assert {h.record.lang for h in cands} == {"de"}  # en is outside the chosen languages
    cands = first_stage(store, query(1, dirs, "de"), "en", "prefer", 2)
    assert "en" in {h.record.lang for h in cands}


@pytest.mark.parametrize("name", ["hnswlib", "qdrant-server"])
def test_prefer_has_nothing_to_prefer_for_a_query_of_unknown_language(tmp_path: Path, name: str) -> None:
    """``und`` (the detector's answer for short or unclear text) is no language to rank up: a
    query in it ranks under ``prefer`` as under ``xy``, on every store, whatever the documents
    of unknown language are stored as."""
    def unit(*v: float) -> np.ndarray:
        return (np.asarray(v, dtype=np.float32) / np.linalg.norm(v)).astype(np.float32)

    q = unit(1, 0, 0, 0)
    records = [Record("fr", "", "a.txt", 0, "fr"), Record("und", "", "b.txt", 0, "und"),
               Record("none", "", "c.txt", 0, None)]
    vecs = np.stack([unit(1, 0.1, 0, 0), unit(1, 0.3, 0, 0), unit(1, 0.35, 0, 0)])
    if name == "hnswlib":
        store = get_store_class("hnswlib").create(str(tmp_path / "idx"), 4, {"dim": 4}, {})
    else:
        client = pytest.importorskip("qdrant_client").QdrantClient(":memory:")
        store = get_store_class("qdrant").create("client://", 4, {"dim": 4}, {"client": client, "collection": "c"})
    try:
        store.upsert(records, vecs)
        store.commit()
        stats = LanguageStats(4)
        stats.add([r.lang for r in records], vecs)
        for means in (None, stats.means()):
            xy = first_stage(store, q, "und", "xy", 6, means=means)
            for lang in ("und", None):
                prefer = apply_preference(first_stage(store, q, lang, "prefer", 6, means=means), lang, 0.5)
                assert [(h.record.id, h.score) for h in prefer] == [(h.record.id, h.score) for h in xy]
        hits = [StoreHit(Record("a", "", "", 0, "fr"), 0.8), StoreHit(Record("b", "", "", 0, "und"), 0.7)]
        assert apply_preference(hits, "und", 0.5) == hits
    finally:
        store.close()


def test_shrinkage_keeps_a_lone_document() -> None:
    stats = LanguageStats(2)
    stats.add(["en"] * 4 + ["xx"], np.asarray([[1, 0]] * 4 + [[0, 1]], dtype=np.float32))
    means = stats.means()
    glob = np.asarray([0.8, 0.2])
    assert means.of("xx") == pytest.approx((np.asarray([0, 1]) + SHRINK * glob) / (1 + SHRINK))
    assert means.of(None) == pytest.approx(glob)  # unknown language: the overall mean
    assert np.linalg.norm(means.centre(np.asarray([[0, 1]], np.float32), ["xx"])) == pytest.approx(1.0)
    # each row is centred by its own language's mean (none or unknown: the overall mean)
    rows = np.asarray([[1, 0], [0, 1], [1, 1], [0.5, 0.5]], np.float32)
    langs = ["xx", "en", None, "zz"]
    want = rows - np.stack([means.of(lang) for lang in langs])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(means.centre(rows, langs), want, rtol=1e-6)


@pytest.mark.parametrize("name", ["hnswlib", "qdrant"])
def test_fit_leaves_out_documents_deleted_while_it_reads(tmp_path: Path, name: str) -> None:
    """A writer's commit between fit's record read and its vector read removes documents: they
    are left out of the statistics (a KeyError before)."""
    records, vecs, _ = biased_corpus()
    store = get_store_class(name).create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    store.upsert(records, vecs)
    store.commit()
    gone = {r.id for r in records if r.lang == "de" and r.position == 0}
    get = store.get

    def get_then_delete(ids):
        found = get(ids)
        store.delete(sorted(gone))
        store.commit()
        return found

    store.get = get_then_delete
    fitted = LanguageStats.fit(store)
    assert fitted.counts == {"en": 5 * COPIES, "de": 5 * COPIES - len(gone)}
    kept = [i for i, r in enumerate(records) if r.id not in gone and r.lang == "de"]
    np.testing.assert_allclose(fitted.sums["de"], vecs[kept].sum(axis=0), atol=1e-4)
    store.close()


def test_pipeline_keeps_stats_in_step(tmp_path: Path, fake_encoder) -> None:
    """Running sums in the manifest equal a fit from the stored vectors after adds and edits."""
    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), fake_encoder.dim,
                                              {"dim": fake_encoder.dim}, {})
    docs = [vecplug.Document(f"d{i}", f"word{i} shared", "s", i, "en" if i % 2 else "de") for i in range(10)]
    stats = LanguageStats(fake_encoder.dim)
    pipeline.run(docs, fake_encoder, store, Record.from_document, None, progress=False, stats=stats,
                 commit_every=3)
    edited = [vecplug.Document("d3", "something else", "s", 3, "fr"), vecplug.Document("d4", "word4 shared", "s", 4, "de")]
    pipeline.run(edited, fake_encoder, store, Record.from_document, None, progress=False, stats=stats)
    stored = LanguageStats.from_manifest(store.manifest)
    fitted = LanguageStats.fit(store)
    assert stored.counts == fitted.counts == {"de": 5, "en": 4, "fr": 1}
    for lang in fitted.counts:
        assert stored.sums[lang] == pytest.approx(fitted.sums[lang], abs=1e-5)
    store.close()


def test_pipeline_spaces_out_slow_commits(tmp_path: Path, fake_encoder,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Once commits get slow, they wait for enough work that they stay a small share of the run;
    everything is still committed at the end."""
    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), fake_encoder.dim,
                                              {"dim": fake_encoder.dim}, {})
    commits = []
    real_commit = store.commit

    def slow_commit(manifest=None):
        time.sleep(0.05)
        commits.append(store.count())
        real_commit(manifest)

    monkeypatch.setattr(store, "commit", slow_commit)
    monkeypatch.setattr(pipeline, "SLOW_COMMIT", 0.0)
    docs = [vecplug.Document(f"d{i}", f"word{i}", "s", i, "en") for i in range(60)]
    report = pipeline.run(docs, fake_encoder, store, Record.from_document, None, progress=False,
                          batch_size=2, commit_every=2)
    assert report.documents == 60 and commits[-1] == 60
    # instant batches after a 50 ms commit: commit_every=2 alone would commit 30 times
    assert 2 <= len(commits) < 10
    store.close()
    assert get_store_class("hnswlib").open(str(tmp_path / "idx"), {}).count() == 60


def test_pipeline_caps_uncommitted_documents(tmp_path: Path, fake_encoder,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """However slow commits are, no more than MAX_UNCOMMITTED documents wait for one."""
    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), fake_encoder.dim,
                                              {"dim": fake_encoder.dim}, {})
    commits = []
    real_commit = store.commit

    def slow_commit(manifest=None):
        commits.append(store.count())
        real_commit(manifest)

    monkeypatch.setattr(store, "commit", slow_commit)
    monkeypatch.setattr(pipeline, "SLOW_COMMIT", 0.0)
    monkeypatch.setattr(pipeline, "COMMIT_TIME_SHARE", 1e-9)  # the time rule alone: one commit, at the end
    monkeypatch.setattr(pipeline, "MAX_UNCOMMITTED", 8)
    docs = [vecplug.Document(f"d{i}", f"word{i}", "s", i, "en") for i in range(30)]
    report = pipeline.run(docs, fake_encoder, store, Record.from_document, None, progress=False,
                          batch_size=2, commit_every=2)
    store.close()
    assert report.documents == 30
    assert commits == [2, 10, 18, 26, 30]  # the first commit (fast until timed), then every 8


def test_api_modes_debias_and_batch(tmp_path: Path, tiny_model: Path) -> None:
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx"), "debias": True},
                                                "model": {"document": str(tiny_model)}})
    docs = [vecplug.Document("en1", "water boils at one hundred degrees", "s", 0, "en"),
            vecplug.Document("de1", "wasser kocht bei hundert grad", "s", 1, "de"),
            vecplug.Document("es1", "el agua hierve a cien grados", "s", 2, "es"),
            vecplug.Document("en2", "the quick brown fox", "s", 3, "en")]
    with vecplug.create_index(settings=settings) as index:
        index.add_documents(docs)
        assert index.manifest["debias"] is True
        assert index.manifest["language_stats"]["counts"] == {"de": 1, "en": 2, "es": 1}
    index = vecplug.open_index(str(tmp_path / "idx"))
    try:
        batch = index.search_batch(["water boils", "wasser kocht"], k=4, langs=["en", "de"])
        single = [index.search("water boils", k=4, lang="en"), index.search("wasser kocht", k=4, lang="de")]
        for b, s in zip(batch, single):
            assert [h.id for h in b] == [h.id for h in s]
            assert [h.score for h in b] == pytest.approx([h.score for h in s], abs=1e-5)
            assert b.vector.shape == (index.encoder.dim,)
            # the reported scores are the exact (centred) scores of those documents
            assert index.score_ids(b.vector, [h.id for h in b], b.lang) == \
                pytest.approx([h.score for h in b], abs=1e-5)
        raw = index.search("water boils", k=4, lang="en", debias=False)
        assert raw[0].score != pytest.approx(batch[0][0].score)
        mono = index.search("water boils", k=4, mode="mono", lang="en")
        assert {h.lang for h in mono} == {"en"} and len(mono) == 2
        only = index.search("water boils", k=4, lang="en", langs=["de", "es"])
        assert {h.lang for h in only} == {"de", "es"}
        pref = index.search("water boils", k=4, mode="prefer", lang="es")
        assert pref.mode == "prefer" and len(pref) == 4
    finally:
        index.close()


class _WideReranker:
    """Keeps the first stage's order with scores a hundred times wider (a cross-encoder's logits
    spread like that); records how many candidates each query brought."""

    name = "wide"
    seen: list[int] = []

    def __init__(self) -> None:
        pass

    def warm_up(self, context: object) -> None:
        pass

    def rerank(self, queries: list, candidates: list, context: object) -> list:
        _WideReranker.seen.extend(len(c) for c in candidates)
        return [[StoreHit(h.record, 100 * h.score, h.vector) for h in c] for c in candidates]


def test_prefer_with_a_reranker(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prefer's boost is in cosine units: added to a cross-encoder's logits it moved nothing. It
    is put on the reranker's scale (the spreads of the scores before and after), and the
    reranker gets rerank_depth candidates as in the other modes (it got the pooled and the
    same-language lists, twice as many)."""
    from importlib.metadata import EntryPoint

    import vecplug.adapters.plugins as plugins
    import vecplug.adapters.rerank as registry

    import vecplug.adapters.modes as modes

    monkeypatch.setattr(plugins, "entry_points", lambda group: [
        EntryPoint("wide", f"{__name__}:_WideReranker", group)] if group == registry.ENTRY_POINT_GROUP else [])
    # the tiny model's cosines spread about as little as the floor for near ties (tested on
    # its own below): which side of it six candidates fall on is not what this test is about
    monkeypatch.setattr(modes, "MIN_COSINE_SPREAD", 1e-6)
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx"), "debias": False},
                                                "search": {"prefer_boost": 0.5},
                                                "model": {"document": str(tiny_model)}})
    words = ["water boils", "wasser kocht", "el agua hierve", "the quick fox", "der schnelle fuchs",
             "el zorro rapido", "a lazy dog", "ein fauler hund"]
    docs = [vecplug.Document(f"d{i}-{lang}", f"{w} {j}", "s", i * 3 + j, lang)
            for i, w in enumerate(words) for j, lang in enumerate(["en", "de", "es"])]
    with vecplug.create_index(settings=settings) as index:
        index.add_documents(docs)
        plain = index.search("water boils", k=5, mode="prefer", lang="de")
        assert [h.lang for h in plain][:3] == ["de"] * 3  # the boost reorders
        _WideReranker.seen.clear()
        wide = index.search("water boils", k=5, mode="prefer", lang="de", rerank="wide", rerank_depth=6)
        assert [h.id for h in wide] == [h.id for h in plain]
        assert [h.score for h in wide] == pytest.approx([100 * h.score for h in plain], rel=1e-4)
        assert _WideReranker.seen == [6]


def test_the_boost_on_a_rerankers_scale_needs_a_spread() -> None:
    """Two candidates 0.001 apart made a boost of 500 logits: a spread of a few scores, with a
    floor for near-tied cosines."""
    from vecplug.adapters.modes import boost_on_scale

    def scored(scores: list[float]) -> list[StoreHit]:
        return [StoreHit(Record(f"d{i}", "t", "s", i, "en"), s) for i, s in enumerate(scores)]

    assert boost_on_scale(0.05, scored([0.801, 0.800]), scored([5.0, -5.0])) == 0.05
    tied = boost_on_scale(0.05, scored([0.8001, 0.8, 0.7999, 0.8, 0.8]), scored([5, -5, 3, 1, 0]))
    assert tied == pytest.approx(0.05 * np.std([5, -5, 3, 1, 0]) / 0.02)
    spread = boost_on_scale(0.05, scored([0.9, 0.8, 0.7, 0.6, 0.5]), scored([9, 8, 7, 6, 5]))
    assert spread == pytest.approx(0.05 * 10)


def test_per_language_walks_head_into_each_languages_region() -> None:
    """The corrected search asks the store for each language with a walk hint: the centred
    query plus WALK_SHIFT times that language's mean."""
    from vecplug.adapters import bias
    from vecplug.adapters.consensus import Consensus

    rng = np.random.default_rng(3)
    stats = LanguageStats(8)
    for lang in ("en", "de", "ja"):
        stats.add([lang] * 40, rng.normal(size=(40, 8)) + rng.normal(size=8))
    means = stats.means()

    class Spy:
        def __init__(self) -> None:
            self.asked: list[tuple[np.ndarray, dict[str, np.ndarray] | None]] = []

        def candidates_per_language(self, vector: np.ndarray, k: int, langs: list[str], *, ef: int | None = None,
                                    walk_vectors: dict[str, np.ndarray] | None = None) -> list:
            self.asked.append((vector, walk_vectors))
            return []

    q = rng.normal(size=8).astype(np.float32)
    q /= np.linalg.norm(q)
    spy = Spy()
    assert first_stage(spy, q, "de", "xy", 5, None, means) == []
    vector, walks = spy.asked[-1]
    np.testing.assert_allclose(vector, means.centre_query(q, "de"))
    assert set(walks) == {"en", "de", "ja"}
    for lang, walk in walks.items():
        np.testing.assert_allclose(walk, vector + bias.WALK_SHIFT * means.of(lang))
    # consensus asks without hints (they changed its lists and nothing measured which is right)
    assert Consensus(means, 0.4, 6).search(spy, q, 5, ["ja", "en"]) == []
    vector, walks = spy.asked[-1]
    np.testing.assert_allclose(vector, q)
    assert walks is None
