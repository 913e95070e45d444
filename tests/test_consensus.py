"""Translation consensus (vecplug.adapters.consensus): an answer's copies in other languages
count for it and rank right behind it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import vecplug
from vecplug.adapters.bias import LanguageStats
from vecplug.adapters.consensus import WEIGHTS, Consensus, consensus_scores
from vecplug.adapters.modes import first_stage
from vecplug.adapters.stores import Record, StoreHit, get_store_class
from vecplug.cli import cli
from vecplug.evaluate import make_runs

DIM = 12


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_scores_by_hand() -> None:
    """An English answer (0.9), its German translation (0.5) and an unrelated German document
    (0.6): the translation takes the group's mean and best, the other keeps its own score."""
    en_a, de_a, de_b = np.eye(3, dtype=np.float32)
    de_a = unit(en_a + 0.3 * de_a)  # cosine 0.96 to en_a
    scores = consensus_scores(np.array([0.9, 0.5, 0.6]), np.stack([en_a, de_a, de_b]), ["en", "de", "de"], 0.4)
    own, mean, best = WEIGHTS
    assert scores == pytest.approx([own * 0.9 + mean * 0.7 + best * 0.9,
                                    own * 0.5 + mean * 0.7 + best * 0.9,
                                    0.6])
    assert scores[1] > scores[2]  # the translation now follows its answer
    # the same partner below the threshold: nobody moves
    assert consensus_scores(np.array([0.9, 0.5, 0.6]), np.stack([en_a, de_a, de_b]),
                            ["en", "de", "de"], 0.97) == pytest.approx([0.9, 0.5, 0.6])


def test_partners_are_other_languages_one_per_language() -> None:
    """Two near-copies in one language are not partners (same language: siblings, not
    translations), and of two German copies of an English text only the closer one counts."""
    base = np.eye(4, dtype=np.float32)
    en = unit(base[0])
    de_close, de_far = unit(base[0] + 0.1 * base[1]), unit(base[0] + 0.4 * base[2])
    en_copy = unit(base[0] + 0.05 * base[3])
    scores = np.array([0.2, 0.8, 0.9, 0.1])
    out = consensus_scores(scores, np.stack([en, de_close, de_far, en_copy]), ["en", "de", "de", "en"], 0.5)
    own, mean, best = WEIGHTS
    # en's partner in German is de_close (0.8), not de_far (0.9); en_copy is no partner of en
    assert out[0] == pytest.approx(own * 0.2 + mean * 0.5 + best * 0.8)
    # both German copies find en (their closest English candidate) as their partner
    assert out[2] == pytest.approx(own * 0.9 + mean * (0.9 + 0.2) / 2 + best * 0.9)
    # one language, or a lone candidate: unchanged
    assert consensus_scores(scores[:1], en[None], ["en"], 0.5) == pytest.approx([0.2])
    same = consensus_scores(scores[[0, 3]], np.stack([en, en_copy]), ["en", "en"], 0.0)
    assert same == pytest.approx(scores[[0, 3]])
    # None is a language of its own (und), partner of the others as any language is
    assert consensus_scores(np.array([0.2, 0.8]), np.stack([en, de_close]), [None, "de"], 0.5)[0] == \
        pytest.approx(own * 0.2 + mean * 0.5 + best * 0.8)
    with pytest.raises(ValueError, match="2 scores, 1 vectors"):
        consensus_scores(scores[:2], en[None], ["en", "de"], 0.5)


def parallel_corpus(seed: int = 0) -> tuple[list[Record], np.ndarray]:
    """Five topics, each text in en, de and es (a shared topic direction plus its language's
    direction and a little noise of its own), and per language one 'near miss' of topic 0
    (topic 0 plus a direction of its own): a raw pool puts the query language's near miss
    above the answer's translations."""
    rng = np.random.default_rng(seed)
    langs = {"en": 9, "de": 10, "es": 11}
    records, vecs = [], []
    for lang, axis in langs.items():
        for topic in range(5):
            v = 2.0 * np.eye(DIM)[topic] + 1.5 * np.eye(DIM)[axis] + rng.normal(scale=0.1, size=DIM)
            records.append(Record(f"{lang}-{topic}", f"topic {topic}", f"{lang}.txt", topic, lang))
            vecs.append(unit(v))
        miss = 1.2 * np.eye(DIM)[0] + 1.6 * np.eye(DIM)[5 + list(langs).index(lang)] + 1.5 * np.eye(DIM)[axis]
        records.append(Record(f"{lang}-miss", "near miss", f"{lang}.txt", 9, lang))
        vecs.append(unit(miss))
    return records, np.stack(vecs)


@pytest.fixture
def parallel_store(tmp_path: Path):
    records, vecs = parallel_corpus()
    store = get_store_class("hnswlib").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    store.upsert(records, vecs)
    store.commit()
    stats = LanguageStats(DIM)
    stats.add([r.lang for r in records], vecs)
    yield store, stats.means()
    store.close()


def test_first_stage_ranks_an_answers_translations_behind_it(parallel_store) -> None:
    store, means = parallel_store
    records, vecs = parallel_corpus()
    answer = vecs[[r.id for r in records].index("de-0")]
    q = unit(answer + 0.05 * np.eye(DIM)[5 + 1])  # a German query: the answer, a little of the miss
    group = Consensus(means, 0.4, 10)
    for scoring in (means, None):  # with and without the correction
        plain = [h.record.id for h in first_stage(store, q, "de", "xy", 4, means=scoring)]
        grouped = first_stage(store, q, "de", "xy", 4, means=scoring, consensus=group)
        ids = [h.record.id for h in grouped]
        # alone, the German near miss beats one of the answer's translations; in consensus, not
        assert plain[0] == "de-0" and "de-miss" in plain[:3], plain
        assert ids[0] == "de-0" and set(ids[:3]) == {"en-0", "de-0", "es-0"} and ids[3] == "de-miss", ids
        assert [h.score for h in grouped] == sorted((h.score for h in grouped), reverse=True)
    # mono never regroups: one language
    mono = first_stage(store, q, "de", "mono", 3, means=means)
    assert [h.record.id for h in first_stage(store, q, "de", "mono", 3, means=means, consensus=group)] == \
        [h.record.id for h in mono]


def test_the_first_stage_regroups_its_scores_exactly(parallel_store) -> None:
    """The scores a consensus search reports are consensus_scores of the centred candidates
    (each language's best ``depth``), whatever hits were cut below k."""
    store, means = parallel_store
    records, vecs = parallel_corpus()
    q = unit(vecs[0] + vecs[6])
    group = Consensus(means, 0.3, 6)
    hits = first_stage(store, q, "en", "xy", 18, means=means, consensus=group)
    by_id = {r.id: i for i, r in enumerate(records)}
    idx = [by_id[h.record.id] for h in hits]
    langs = [records[i].lang for i in idx]
    centred = means.centre(vecs[idx], langs)
    expect = consensus_scores(centred @ means.centre_query(q, "en"), centred, langs, 0.3)
    assert [h.score for h in hits] == pytest.approx(list(expect), abs=1e-5)
    # without the correction: plain cosines regrouped, partners still found among centred vectors
    raw = first_stage(store, q, "en", "xy", 18, consensus=group)
    idx = [by_id[h.record.id] for h in raw]
    langs = [records[i].lang for i in idx]
    expect = consensus_scores(vecs[idx] @ q, means.centre(vecs[idx], langs), langs, 0.3)
    assert [h.score for h in raw] == pytest.approx(list(expect), abs=1e-5)
    # regroup (the reranker path) over the same candidates and their plain centred scores agrees
    plain = [StoreHit(h.record, float(s), h.vector)
             for h, s in zip(hits, centred @ means.centre_query(q, "en"))]
    again = group.regroup(store, plain)
    assert {h.record.id: h.score for h in again} == pytest.approx({h.record.id: h.score for h in hits}, abs=1e-5)


def test_regroup_keeps_a_candidate_whose_vector_is_gone(parallel_store) -> None:
    store, means = parallel_store
    gone = StoreHit(Record("gone", "", "x", 0, "fr"), 0.95)  # not in the store, no vector carried
    hits = [gone, *(StoreHit(r, 0.5) for r in store.get(["en-0", "de-0"]))]
    out = Consensus(means, 0.4, 5).regroup(store, hits)
    assert out[0].record.id == "gone" and out[0].score == 0.95
    assert {h.record.id for h in out[1:]} == {"en-0", "de-0"}


def _parallel_index(tmp_path: Path, tiny_model: Path, **search: object) -> vecplug.Index:
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}, "search": search})
    index = vecplug.create_index(settings=settings)
    texts = {"water boils at one hundred degrees": "wasser kocht bei hundert grad",
             "the quick brown fox": "der schnelle braune fuchs",
             "a lazy dog sleeps": "ein fauler hund schläft"}
    docs = [vecplug.Document(f"{lang}{i}", text, f"{lang}.txt", i, lang)
            for i, (en, de) in enumerate(texts.items()) for lang, text in (("en", en), ("de", de))]
    index.add_documents(docs)
    return index


def test_api_switch_setting_and_reranker(tmp_path: Path, tiny_model: Path) -> None:
    """search(consensus=) and search.consensus agree; the reported scores are the regrouped
    ones; mono ignores it; with a reranker, the reranker's list is regrouped."""
    with _parallel_index(tmp_path, tiny_model, consensus_threshold=-1.0) as index:
        means = index.language_means()
        plain = index.search("water boils", k=6, lang="en")
        grouped = index.search("water boils", k=6, lang="en", consensus=True)
        assert sorted(h.id for h in grouped) == sorted(h.id for h in plain)
        # every German document is some English one's partner at threshold -1: scores change
        assert [h.score for h in grouped] != pytest.approx([h.score for h in plain], abs=1e-6)
        vecs = index.store.vectors([h.id for h in grouped])
        langs = [h.lang for h in grouped]
        centred = means.centre(vecs, langs)
        base = index.score_ids(grouped.vector, [h.id for h in grouped], "en")
        assert [h.score for h in grouped] == pytest.approx(
            list(consensus_scores(base, centred, langs, -1.0)), abs=1e-5)
        mono = index.search("water boils", k=3, lang="en", mode="mono")
        assert [(h.id, h.score) for h in index.search("water boils", k=3, lang="en", mode="mono",
                                                      consensus=True)] == [(h.id, h.score) for h in mono]
        teacher = index.search("water boils", k=6, lang="en", rerank="teacher", rerank_depth=6, consensus=True)
        # the tiny model is its own teacher: its scores are the first stage's, regrouped once
        assert [h.score for h in teacher] == pytest.approx([h.score for h in grouped], abs=1e-5)
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "search": {"consensus": True, "consensus_threshold": -1.0}})
    with vecplug.Index.open(settings) as index:
        by_setting = index.search("water boils", k=6, lang="en")
        assert [h.id for h in by_setting] == [h.id for h in grouped]
        assert [h.score for h in by_setting] == pytest.approx([h.score for h in grouped])
        off = index.search("water boils", k=6, lang="en", consensus=False)
        assert [h.score for h in off] == pytest.approx([h.score for h in plain])


def test_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in (1.5, -2.0, float("nan")):
        with pytest.raises(vecplug.ConfigError, match="consensus_threshold is a cosine"):
            vecplug.load_settings(overrides={"search": {"consensus_threshold": value}})
    with pytest.raises(vecplug.ConfigError, match="consensus_depth must be at least 1"):
        vecplug.load_settings(overrides={"search": {"consensus_depth": 0}})
    monkeypatch.setenv("VECPLUG_SEARCH_CONSENSUS", "true")
    assert vecplug.load_settings().search.consensus is True


def test_cli_search_and_eval_runs(tmp_path: Path, tiny_model: Path) -> None:
    _parallel_index(tmp_path, tiny_model).close()
    runner = CliRunner()
    args = ["search", "water boils", "--index", str(tmp_path / "idx"), "--lang", "en", "-k", "6", "--json"]
    on = runner.invoke(cli, [*args, "--consensus"], env={"VECPLUG_SEARCH_CONSENSUS_THRESHOLD": "-1"})
    off = runner.invoke(cli, [*args, "--no-consensus"], env={"VECPLUG_SEARCH_CONSENSUS_THRESHOLD": "-1"})
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    assert [h["score"] for h in json.loads(on.output)["hits"]] != \
        pytest.approx([h["score"] for h in json.loads(off.output)["hits"]], abs=1e-6)
    assert "--consensus" in runner.invoke(cli, ["eval", "--help"]).output
    runs = make_runs([None], ["xy", "mono"], [None], [True], [False, True])
    assert [(r.mode, r.consensus) for r in runs] == [("xy", False), ("xy", True), ("mono", None)]
    assert runs[1].label == "default query encoder + debias + consensus"
