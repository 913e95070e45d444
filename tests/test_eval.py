"""``vecplug eval``: dataset loaders, scoring against a scripted index, the report, and the
whole command end to end (a tiny real transformer; the real model in a slow test)."""
from __future__ import annotations

import json
import math
import random
import re
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import REPO, TINY_TEXT, XQUAD
from vecplug.cli import cli
from vecplug.errors import ConfigError, VecplugError
from vecplug.evaluate import (
    EvalReport, Run, evaluate, heatmap_svg, make_runs, score_runs)
from vecplug.indexer.datasets import (
    DatasetError, EvalDataset, EvalQuery, load_beir, load_dataset, load_xquad_r, load_xquad_r_dataset)
from vecplug.types import Document, Hit

# -- tiny datasets written by the tests -------------------------------------------------------

#: words the tiny model's vocabulary knows whole, so that different sentences get different tokens
WORDS = sorted({w for line in TINY_TEXT[:8] for w in line.split()})


def _sentences(lang: str, para: int, n: int) -> list[str]:
    rng = random.Random(f"{lang}-{para}")
    return [" ".join(rng.sample(WORDS, 6)) for _ in range(n)]


def write_xquad(folder: Path, langs: tuple[str, ...] = ("en", "de", "es"), shuffled: bool = False) -> Path:
    """A parallel XQuAD-R-shaped dataset: 2 paragraphs, 2 questions each; German splits the first
    paragraph into 2 sentences where the others have 3 (so answers sit at other indices).

    Every question is an exact copy of its answer sentence in its own language; ``shuffled``
    copies a sentence of the other paragraph instead (the answers stay where they were)."""
    folder.mkdir(parents=True, exist_ok=True)
    counts = {0: 3, 1: 3}
    answers = {0: [0, 2], 1: [1, 2]}  # sentence index of each question's answer (3-sentence split)
    texts = {}
    for lang in langs:
        texts[lang] = {p: _sentences(lang, p, 2 if (lang == "de" and p == 0) else counts[p]) for p in counts}
    seen = [s for lang in langs for p in counts for s in texts[lang][p]]
    assert len(set(seen)) == len(seen)
    for lang in langs:
        paragraphs = []
        for p in counts:
            sents = texts[lang][p]
            context = " ".join(sents)
            breaks, pos = [], 0
            for s in sents:
                breaks.append([pos, pos + len(s)])
                pos += len(s) + 1
            qas = []
            for j, idx in enumerate(answers[p]):
                idx = min(idx, len(sents) - 1) if lang == "de" and p == 0 else idx  # merged sentences
                other = texts[lang][1 - p][j]
                qas.append({"id": f"q{p}{j}", "question": other if shuffled else sents[idx],
                            "answers": [{"answer_start": breaks[idx][0] + 1, "text": "x"}]})
            paragraphs.append({"context": context, "sentences": sents, "sentence_breaks": breaks, "qas": qas})
        (folder / f"{lang}.json").write_text(
            json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}, ensure_ascii=False), encoding="utf-8")
    return folder


def write_beir(folder: Path, bad_lines: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qrels").mkdir(exist_ok=True)
    corpus = [
        {"_id": "d1", "title": "fox", "text": "the quick brown fox jumps", "lang": "EN", "url": "http://x"},
        {"_id": "d2", "title": "fuchs", "text": "der schnelle braune fuchs springt", "lang": "de"},
        {"_id": "d3", "title": "", "text": "el agua hierve a cien grados", "lang": "es-MX"},
        {"_id": "d4", "title": "wasser", "text": "wasser kocht bei hundert grad", "lang": "de"},
        {"_id": "d5", "text": "the lazy dog over the water"},  # no lang: detected when indexed
    ]
    lines = [json.dumps(d, ensure_ascii=False) for d in corpus]
    if bad_lines:
        lines[1:1] = ["{not json", json.dumps({"title": "no id"}), json.dumps({"_id": "d1", "text": "again"}),
                      '{"_id": "d9", "text": NaN}', json.dumps({"_id": "d8", "title": "", "text": " "})]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    queries = [{"_id": "q1", "text": "fox the quick brown fox jumps", "lang": "en"},
               {"_id": "q2", "text": "el agua hierve a cien grados", "lang": "es"},
               {"_id": "q3", "text": "unjudged query", "lang": "en"},
               {"_id": "q4", "text": "only judged not relevant", "lang": "en"}]
    qlines = [json.dumps(q, ensure_ascii=False) for q in queries]
    if bad_lines:
        qlines.append(json.dumps({"_id": "q5"}))
    (folder / "queries.jsonl").write_text("\n".join(qlines) + "\n", encoding="utf-8")
    qrels = ["query-id\tcorpus-id\tscore", "q1\td1\t2", "q1\td2\t1", "q2\td3\t1", "q4\td4\t0"]
    if bad_lines:
        qrels += ["q1\td2", "q2\td4\tone", "qX\td1\t1", "q2\tdX\t1"]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return folder


#: three queries per language, none tagged: their languages are detected
UNTAGGED = {"en": ["the quick brown fox jumps over the lazy dog", "water boils at one hundred degrees",
                   "the lazy dog sleeps in the sun"],
            "de": ["der schnelle braune fuchs springt über den faulen hund", "wasser kocht bei hundert grad",
                   "der faule hund schläft in der sonne"],
            "es": ["el rápido zorro marrón salta sobre el perro perezoso", "el agua hierve a cien grados",
                   "el perro perezoso duerme al sol"]}


def write_beir_untagged(folder: Path) -> Path:
    """A BEIR folder whose 9 queries (en, de, es interleaved) carry no ``lang``; each query's
    relevant document is a copy of it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qrels").mkdir(exist_ok=True)
    texts = [UNTAGGED[lang][i] for i in range(3) for lang in ("en", "de", "es")]
    for name, prefix in (("corpus.jsonl", "d"), ("queries.jsonl", "q")):
        lines = [json.dumps({"_id": f"{prefix}{i}", "text": t}, ensure_ascii=False) for i, t in enumerate(texts)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    qrels = ["query-id\tcorpus-id\tscore", *(f"q{i}\td{i}\t1" for i in range(len(texts)))]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return folder


# -- loaders ----------------------------------------------------------------------------------

def test_xquad_r_loader(tmp_path: Path) -> None:
    folder = write_xquad(tmp_path / "xq")
    data = load_xquad_r(folder)
    assert data.langs == ["de", "en", "es"] and data.paragraphs == 2
    assert data.sentence_count_mismatches() == {"de": 1, "en": 0, "es": 0}
    # German merged sentences: its answer sits at another index than English's
    assert data.relevant["q01"] == {"de": "de:0:1", "en": "en:0:2", "es": "es:0:2"}
    ds = load_xquad_r_dataset(folder, ["en", "de"])
    assert ds.name == "xquad-r" and ds.info["format"] == "xquad-r"
    assert len(ds.documents) == 6 + 5 and {d.lang for d in ds.documents} == {"en", "de"}
    assert ds.documents[0].id == "en:0:0" and ds.documents[0].source == "xquad-r/en"
    assert [q.id for q in ds.queries][:2] == ["en:q00", "en:q01"]  # question ids are per language
    assert ds.qrels["de:q01"] == {"en:0:2": 1, "de:0:1": 1}
    assert ds.mono_qrels is not None and ds.mono_qrels["de:q01"] == {"de:0:1": 1}
    limited = ds.limited(1)
    assert [q.id for q in limited.queries] == ["en:q00", "de:q00"] and set(limited.qrels) == {"en:q00", "de:q00"}
    assert len(limited.documents) == len(ds.documents)  # the pool stays whole
    # a language given twice is pooled once (its sentences and questions were counted twice)
    twice = load_xquad_r_dataset(folder, ["en", "de", "en"])
    assert len(twice.documents) == 6 + 5 and len(twice.queries) == len(ds.queries)
    # files named otherwise than the codes the index keeps: their languages spelt as it spells
    # them (a hit's language and the query's are compared), the ids as the files name them
    odd = load_xquad_r_dataset(write_xquad(tmp_path / "odd", langs=("EN", "deu", "pt-BR")))
    assert {d.lang for d in odd.documents} == {q.lang for q in odd.queries} == {"en", "de", "pt"}
    assert {d.id.split(":")[0] for d in odd.documents} == {"EN", "deu", "pt-BR"}
    with pytest.raises(DatasetError, match=r"XQuAD-R file xx1.json: its name is not a language code"):
        load_xquad_r_dataset(write_xquad(tmp_path / "bad", langs=("en", "xx1")))
    with pytest.raises(DatasetError, match=r"XQuAD-R files en.json, en_GB.json hold one language, en"):
        load_xquad_r_dataset(write_xquad(tmp_path / "twice", langs=("en", "en_GB")))


def test_xquad_r_checks(tmp_path: Path) -> None:
    folder = write_xquad(tmp_path / "xq")
    with pytest.raises(FileNotFoundError, match="fr"):
        load_xquad_r(folder, ["en", "fr"])
    raw = json.loads((folder / "es.json").read_text())
    raw["data"][0]["paragraphs"][1]["qas"][0]["id"] = "other"
    (folder / "es.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="not parallel"):  # DatasetError is a ValueError, as before
        load_xquad_r(folder)
    raw["data"][0]["paragraphs"][1]["sentences"][0] = "changed"
    (folder / "es.json").write_text(json.dumps(raw))
    with pytest.raises(DatasetError, match="differs from its break span"):
        load_xquad_r(folder, ["es"])
    (folder / "es.json").write_text(json.dumps({"data": [{"paragraphs": [{"context": "x"}]}]}))
    with pytest.raises(DatasetError, match="not XQuAD-R"):
        load_xquad_r(folder, ["es"])


def test_xquad_r_values_of_the_wrong_shape(tmp_path: Path) -> None:
    """A value of the right type but the wrong shape (a ValueError inside the loader) is the
    loader's own error naming the file, as a missing field is."""
    def paragraph(breaks: list[list[int]], answer_start: Any) -> dict[str, Any]:
        return {"data": [{"paragraphs": [{
            "context": "Ab. Cd.", "sentences": ["Ab.", "Cd."], "sentence_breaks": breaks,
            "qas": [{"id": "q1", "question": "what?", "answers": [{"answer_start": answer_start, "text": "C"}]}]}]}]}

    folder = tmp_path / "xq"
    folder.mkdir()
    for breaks, start, why in (([[0, 3], [4, 7]], "abc", "invalid literal"),
                               ([[0, 3, 1], [4, 7, 1]], 4, "too many values")):
        (folder / "en.json").write_text(json.dumps(paragraph(breaks, start)))
        with pytest.raises(DatasetError, match=f"en.json: not XQuAD-R .*paragraph 0: ValueError {why}"):
            load_xquad_r(folder)
    (folder / "en.json").write_text(json.dumps(paragraph([[0, 3], [4, 7]], 9)))
    with pytest.raises(DatasetError, match="answer_start 9 lies in no sentence"):  # its own message kept
        load_xquad_r(folder)


def test_benchmarks_keep_their_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import xquad_data

    folder = write_xquad(tmp_path / "xq")
    assert xquad_data.load_xquad_r(folder, ["en"]).relevant["q00"] == {"en": "en:0:0"}
    assert xquad_data.parse_langs(["en,de", "de"], folder) == ["en", "de"]
    assert xquad_data.DEFAULT_DATA_DIR == XQUAD.resolve()


def test_beir_loader(tmp_path: Path) -> None:
    folder = write_beir(tmp_path / "mini")
    ds = load_beir(folder)
    assert ds.name == "mini" and ds.info["split"] == "test" and ds.mono_qrels is None
    docs = {d.id: d for d in ds.documents}
    assert list(docs) == ["d1", "d2", "d3", "d4", "d5"]
    assert docs["d1"].text == "fox\nthe quick brown fox jumps"  # the title is embedded first
    assert docs["d1"].payload == {"id": "d1", "title": "fox", "url": "http://x"} and docs["d1"].lang == "en"
    assert docs["d3"].text == "el agua hierve a cien grados" and docs["d5"].lang is None
    assert docs["d3"].lang == "es"  # as the index stores it (the bias measures compare them)
    # only queries with a relevant document; grade 0 means not relevant
    assert [q.id for q in ds.queries] == ["q1", "q2"] and ds.queries[1].lang == "es"
    assert ds.qrels == {"q1": {"d1": 2, "d2": 1}, "q2": {"d3": 1}}
    where = {(Path(p.path).name, p.line) for p in ds.problems}
    assert where == {("corpus.jsonl", 2), ("corpus.jsonl", 3), ("corpus.jsonl", 4), ("corpus.jsonl", 5),
                     ("corpus.jsonl", 6), ("queries.jsonl", 5), ("test.tsv", 6), ("test.tsv", 7),
                     ("test.tsv", 8), ("test.tsv", 9)}
    assert any("NaN" in p.reason for p in ds.problems)
    # q4 is judged, with nothing relevant: left out, and counted; skipped lines are not judgements
    assert ds.info["queries_without_relevant"] == 1 and ds.info["judgements"] == 4


def test_beir_qrels_first_line_and_repeats(tmp_path: Path) -> None:
    """A first line naming a known query is a judgement (a bad score is reported, not taken for
    a header), and a pair judged twice keeps its first grade, the repeat reported."""
    folder = write_beir(tmp_path / "mini", bad_lines=False)
    qrels = folder / "qrels" / "test.tsv"
    qrels.write_text("q3\td3\tx\nq1\td1\t1\nq1\td1\t0\nq2\td3\t2\nq2\td3\t1\n")
    ds = load_beir(folder)
    assert ds.qrels == {"q1": {"d1": 1}, "q2": {"d3": 2}}
    assert [(p.line, p.reason) for p in ds.problems] == [
        (1, "score 'x' is not an integer"),
        (3, "query q1 and document d1 are judged again: skipped"),
        (5, "query q2 and document d3 are judged again: skipped")]
    qrels.write_text("query_id corpus_id relevance\nq1\td1\t1\n")  # another header's spelling
    assert load_beir(folder).problems == [] and load_beir(folder).qrels == {"q1": {"d1": 1}}
    with open(folder / "corpus.jsonl", "a") as fh:
        fh.write(json.dumps({"_id": "d7", "text": ["a", "b"]}) + "\n")
    with open(folder / "queries.jsonl", "a") as fh:
        fh.write(json.dumps({"_id": "q7", "text": {"a": 1}}) + "\n")
    ds = load_beir(folder)
    assert [str(p).split("/")[-1] for p in ds.problems] == ["corpus.jsonl:6: document d7: text is not a string",
                                                           "queries.jsonl:5: query text is not a string"]


def test_beir_language_names_are_reported_and_detected(tmp_path: Path) -> None:
    """A language name where a code belongs ("English" would match no detected language, so
    mono would find nothing) is reported by line; the record is kept, its language detected."""
    folder = write_beir(tmp_path / "mini", bad_lines=False)
    with open(folder / "corpus.jsonl", "a") as fh:
        fh.write(json.dumps({"_id": "d6", "text": "the water is warm", "lang": "English"}) + "\n")
    with open(folder / "queries.jsonl", "a") as fh:
        fh.write(json.dumps({"_id": "q6", "text": "is the water warm", "lang": "Inglés"}) + "\n")
    with open(folder / "qrels" / "test.tsv", "a") as fh:
        fh.write("q6\td6\t1\n")
    ds = load_beir(folder)
    assert [(Path(p.path).name, p.line) for p in ds.problems] == [("corpus.jsonl", 6), ("queries.jsonl", 5)]
    assert all("is not a language code" in p.reason for p in ds.problems)
    assert {d.id: d.lang for d in ds.documents}["d6"] is None
    assert {q.id: q.lang for q in ds.queries}["q6"] is None


def test_limit_per_language_needs_query_languages(tmp_path: Path) -> None:
    ds = load_beir(write_beir_untagged(tmp_path / "untagged"))
    assert len(ds.queries) == 9 and ds.query_languages() == {None: 9}
    # lumped together, untagged queries would be cut to 2 in all: refused, not done quietly
    with pytest.raises(DatasetError, match="9 queries have no language"):
        ds.limited(2)
    lang_of = {t: lang for lang, texts in UNTAGGED.items() for t in texts}
    tagged = ds.with_query_langs(lambda text: lang_of[text])
    assert all(q.detected for q in tagged.queries) and not any(q.detected for q in ds.queries)
    limited = tagged.limited(2)
    assert [q.id for q in limited.queries] == ["q0", "q1", "q2", "q3", "q4", "q5"]
    assert limited.query_languages() == {"en": 2, "de": 2, "es": 2}
    assert set(limited.qrels) == {q.id for q in limited.queries}
    assert limited.info["limit_per_language"] == 2 and len(limited.documents) == 9
    assert ds.with_query_langs(lambda text: "xx").with_query_langs(lambda text: "yy").queries[0].lang == "xx"


def test_load_dataset_specs(tmp_path: Path) -> None:
    xq = write_xquad(tmp_path / "xq")
    beir = write_beir(tmp_path / "beir", bad_lines=False)
    assert load_dataset(f"xquad-r:{xq}", langs=["en"]).info["langs"] == ["en"]
    assert load_dataset(str(xq)).info["format"] == "xquad-r"  # detected by its files
    assert load_dataset(f"beir:{beir}").info["format"] == "beir"
    assert load_dataset(str(beir)).info["format"] == "beir"
    with pytest.raises(DatasetError, match="BEIR"):
        load_dataset(str(beir), langs=["en"])
    with pytest.raises(VecplugError, match="not found"):
        load_dataset(f"beir:{tmp_path / 'nowhere'}")
    with pytest.raises(VecplugError, match="no qrels/dev.tsv"):
        load_dataset(str(beir), split="dev")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VecplugError, match="neither"):
        load_dataset(str(tmp_path / "empty"))


# -- scoring against a scripted index -----------------------------------------------------------

class ScriptedIndex:
    """A stand-in for :class:`vecplug.api.Index`: fixed rankings per (mode, query text)."""

    def __init__(self, rankings: dict[tuple[str, str], list[str]], scores: dict[str, float],
                 doc_langs: dict[str, str], detected: str = "fr") -> None:
        self.rankings, self.scores, self.doc_langs, self.detected = rankings, scores, doc_langs, detected
        self.calls: list[dict[str, Any]] = []
        self.closed = 0

    def search_batch(self, queries: list[str], k: int, *, mode: str, langs: list[str | None] | None = None,
                     target_langs: Any = None, rerank: str | None = None, rerank_depth: int | None = None,
                     debias: bool | None = None, progress: bool = False, **more: Any) -> list[Any]:
        self.calls.append({"mode": mode, "k": k, "langs": langs, "rerank": rerank, "debias": debias,
                           "rerank_depth": rerank_depth, **more})
        out = []
        for text, lang in zip(queries, langs or [None] * len(queries)):
            ids = self.rankings[(mode, text)][:k]
            hits = [Hit(i, self.scores[i], "", self.doc_langs[i], "stub", {}, r) for r, i in enumerate(ids, 1)]
            out.append(SimpleNamespace(query=text, lang=lang or self.detected, mode=mode, hits=hits,
                                       seconds=0.01, vector=np.ones(2, dtype=np.float32)))
        return out

    def score_ids(self, vector: Any, ids: list[str], query_lang: str | None, debias: bool | None = None) -> Any:
        return np.array([self.scores[i] for i in ids])

    def close(self) -> None:
        self.closed += 1


DOC_LANGS = {"en1": "en", "en2": "en", "de1": "de", "de2": "de", "fr1": "fr"}


def small_dataset() -> EvalDataset:
    docs = [Document(i, f"text {i}", "stub", 0, lang) for i, lang in DOC_LANGS.items()]
    return EvalDataset("small", docs, [EvalQuery("q1", "one", "en"), EvalQuery("q2", "two", "de")],
                       {"q1": {"en1": 1, "de1": 1, "fr1": 1}, "q2": {"de2": 1, "en2": 1}}, None,
                       info={"format": "test", "langs": ["en", "de", "fr"]})


def scripted() -> ScriptedIndex:
    return ScriptedIndex(
        {("xy", "one"): ["en2", "en1", "de2", "fr1", "de1"], ("xy", "two"): ["de2", "de1", "fr1", "en1", "en2"],
         ("mono", "one"): ["en2", "en1"], ("mono", "two"): ["de2", "de1"]},
        {"en1": 0.9, "de1": 0.6, "fr1": 0.5, "de2": 0.8, "en2": 0.4}, DOC_LANGS)


def test_score_runs_hand_computed() -> None:
    index = scripted()
    opened: list[str | None] = []

    def open_index(query_encoder: str | None) -> ScriptedIndex:
        opened.append(query_encoder)
        return index

    runs = make_runs([None], ["xy", "mono"], [None], [None])
    xy, mono = score_runs(small_dataset(), runs, open_index, k=3)
    assert opened == [None] and index.closed == 1  # one open per query encoder
    assert [c["mode"] for c in index.calls] == ["xy", "mono"]
    assert index.calls[0]["langs"] == ["en", "de"] and index.calls[0]["rerank"] == "none"
    assert index.calls[0]["k"] == 3

    # q1 top 3 [en2 en1 de2] of relevant {en1 de1 fr1}; q2 top 3 [de2 de1 fr1] of {de2 en2}
    o = xy.summary["overall"]
    assert o["queries"] == 2
    assert o["map@20"] == pytest.approx((1 / 2 / 3 + 1 / 2) / 2)  # (1/6 + 1/2) / 2
    assert o["mrr@10"] == pytest.approx(0.75) and o["p@1"] == pytest.approx(0.5)
    assert o["recall@20"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    ndcg_q1 = (1 / math.log2(3)) / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    ndcg_q2 = 1 / (1 + 1 / math.log2(3))
    assert o["ndcg@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 2)
    assert xy.summary["by_query_lang"]["en"]["map@20"] == pytest.approx(1 / 6)
    assert xy.summary["by_query_lang"]["de"]["mrr@10"] == pytest.approx(1.0)
    assert xy.summary["by_doc_lang"] == {"de": {"recall@20": 0.5, "queries": 2},
                                         "en": {"recall@20": 0.5, "queries": 2},
                                         "fr": {"recall@20": 0.0, "queries": 1}}
    assert xy.summary["pairs"] == {"de": {"de": 1.0, "en": 0.0}, "en": {"de": 0.0, "en": 1.0, "fr": 0.0}}
    bias = xy.summary["bias"]
    assert bias["same_lang@10"] == pytest.approx(2 / 3)
    assert bias["expected_same_lang"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert bias["excess"] == pytest.approx(2 / 3 - 5 / 12)
    # q1: 0.9 - mean(0.6, 0.5) = 0.35; q2: 0.8 - 0.4 = 0.4
    assert bias["score_gap"] == pytest.approx(0.375) and bias["score_gap_queries"] == 2
    assert xy.summary["timing"]["ms_per_query"] == pytest.approx(10.0)
    assert [r["id"] for r in xy.queries] == ["q1", "q2"]

    # mono: qrels restricted to the query's language (the dataset has no mono_qrels)
    m = mono.summary["overall"]
    assert m["mrr@10"] == pytest.approx(0.75) and m["map@20"] == pytest.approx(0.75) and m["p@1"] == 0.5
    assert "bias" not in mono.summary and mono.summary["skipped_queries"] == 0


def test_mono_uses_detected_language_and_skips_queries_without_answers() -> None:
    ds = small_dataset()
    ds.queries.append(EvalQuery("q3", "three", None))  # detected as "fr" by the scripted index
    ds.qrels["q3"] = {"fr1": 2, "en1": 1}
    ds.queries.append(EvalQuery("q4", "four", "de"))
    ds.qrels["q4"] = {"en1": 1}  # nothing in German: not scorable in mono
    index = scripted()
    index.rankings.update({("mono", "three"): ["fr1"], ("mono", "four"): ["de1"],
                           ("xy", "three"): ["en1", "fr1"], ("xy", "four"): ["en1"]})
    xy, mono = score_runs(ds, make_runs([None], ["xy", "mono"]), lambda q: index, k=3)
    assert index.calls[0]["langs"] == ["en", "de", None, "de"]
    assert mono.summary["skipped_queries"] == 1 and mono.summary["overall"]["queries"] == 3
    assert mono.summary["by_query_lang"]["fr"]["mrr@10"] == pytest.approx(1.0)
    q3 = next(r for r in xy.queries if r["id"] == "q3")
    assert q3["lang"] == "fr" and q3["search_lang"] == "fr"
    # ranked [en1 (grade 1), fr1 (grade 2)]: (1 + 2/log2(3)) / (2 + 1/log2(3))
    assert q3["ndcg@10"] == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert q3["score_gap"] == pytest.approx(0.5 - 0.9)


def test_runs() -> None:
    runs = make_runs(["student", "teacher"], ["xy", "mono"], [None, "none", "teacher"], [False, True])
    # xy: every combination; mono: the correction cannot change its ranking, one run per pair
    assert len(runs) == 2 * 2 * 2 + 2 * 2 and runs[0].mode == "xy" and runs[-1].mode == "mono"
    assert {r.debias for r in runs if r.mode == "mono"} == {None}
    assert runs[0].label == "student + no debias" and runs[3].label == "student + rerank teacher + debias"
    assert make_runs()[0] == Run("default query encoder", None, "xy", None, None)
    with pytest.raises(ConfigError, match="unknown mode"):
        Run("x", mode="sideways")
    with pytest.raises(ConfigError, match="both labelled"):
        score_runs(small_dataset(), [Run("a"), Run("a")], lambda q: scripted())


def test_query_encoder_folders_of_the_same_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two students each in a folder called ``student`` are two runs, labelled by as much of
    their paths as tells them apart."""
    for run in ("runA", "runB", "runC/x"):
        (tmp_path / run / "student").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    runs = make_runs(["runA/student", str(tmp_path / "runB" / "student"), "me5-small"], ["xy"])
    assert [r.label for r in runs] == ["runA/student", "runB/student", "me5-small"]
    assert [r.label for r in make_runs(["runC/x/student", "runA/student"], ["xy"])] == [
        "x/student", "runA/student"]
    assert make_runs(["runA/student"], ["xy"])[0].label == "student"  # alone: its name
    results = score_runs(small_dataset(), runs[:2], lambda q: scripted(), k=3)  # not refused as one
    assert [r.run.query_encoder for r in results] == ["runA/student", str(tmp_path / "runB" / "student")]


def test_runs_record_the_effective_debias() -> None:
    """A run that leaves the correction to the index reports what the index used."""
    class DebiasingIndex(ScriptedIndex):
        def debias_for(self, debias: bool | None) -> bool:  # as vecplug.api.Index resolves it
            return True if debias is None else debias

    base = scripted()
    index = DebiasingIndex(base.rankings, base.scores, DOC_LANGS)
    runs = make_runs([None], ["xy", "mono"], [None], [None, False])
    results = score_runs(small_dataset(), runs, lambda q: index, k=3)
    assert [(r.run.mode, r.run.debias, r.debias) for r in results] == [
        ("xy", None, True), ("xy", False, False), ("mono", None, True)]
    as_json = results[0].to_dict()["run"]
    assert as_json["debias"] is None and as_json["debias_effective"] is True  # asked for, and what it meant
    # a stand-in that cannot say leaves it unknown
    assert score_runs(small_dataset(), runs[:1], lambda q: scripted(), k=3)[0].debias is None
    from vecplug.evaluate import dataset_summary

    report = EvalReport({"date_utc": "d", "platform": "p", "cpu": "c", "cores": 1, "torch_threads": 1,
                         "load_average": None, "python": "3", "torch": "t", "vecplug": "v", "command": "c",
                         "cwd": "/"}, dataset_summary(small_dataset()), {}, {"k": 3}, results)
    md = re.sub(r" +", " ", report.markdown())  # table cells without their padding
    assert "| language-bias correction | on (the index's setting) | off |" in md
    assert "on (the index's setting), not applied in mono" in md
    assert "| default query encoder | xy | on (the index's setting) |" in md


#: the report header's machine fields, fixed
MACHINE = {"date_utc": "2026-01-01T00:00:00+00:00", "platform": "p", "cpu": "c", "cores": 2,
           "torch_threads": 1, "load_average": [0.0], "python": "3", "torch": "t", "vecplug": "v",
           "command": "vecplug eval small", "cwd": "/"}


def test_report_renders_and_writes(tmp_path: Path) -> None:
    runs = make_runs([None], ["xy", "mono"])
    results = score_runs(small_dataset(), runs, lambda q: scripted(), k=3)
    from vecplug.evaluate import LAREQA_REFERENCE, dataset_summary

    report = EvalReport(MACHINE, dataset_summary(small_dataset()),
                        {"path": None, "documents": 5, "reused": False, "report": {"documents": 5, "seconds": 1.0},
                         "encoder": {"document_encoder": "tiny"}},
                        {"k": 3, "rerank_depth": None}, results, [LAREQA_REFERENCE])
    md = report.markdown()
    assert "## vecplug eval: small" in md and "`vecplug eval small`" in md
    assert "### X-Y: every language pooled" in md and "### X-X-mono: the query's language only" in md
    assert "| mAP@20 " in md and "0.333" in md  # the hand-computed X-Y mAP@20
    assert "### Language bias" in md and "0.375" in md
    assert "a different setting" in md and "0.66" in md and "0.52" in md
    files = {p.name for p in report.write(tmp_path / "out")}
    assert files == {"report.md", "report.json", "heatmap-xy-default-query-encoder.svg"}
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["runs"][0]["summary"]["overall"]["map@20"] == pytest.approx(1 / 3)
    assert len(data["runs"][0]["queries"]) == 2
    report.write(tmp_path / "summary", per_query=False)
    short = json.loads((tmp_path / "summary" / "report.json").read_text())
    assert "queries" not in short["runs"][0] and short["runs"][0]["summary"] == data["runs"][0]["summary"]
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(VecplugError, match="cannot write the report into .*a-file/sub: Not a directory"):
        report.write(tmp_path / "a-file" / "sub")
    svg = ET.parse(tmp_path / "out" / "heatmap-xy-default-query-encoder.svg").getroot()
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "100%" in texts and "0%" in texts and "-" in texts  # de -> fr has no relevant document
    assert {"en", "de", "fr"} <= set(texts)


def test_heatmap_files_of_colliding_labels_do_not_overwrite_each_other(tmp_path: Path) -> None:
    """``org/model`` and ``org_model`` (and two Cyrillic names) made the same file name: the
    second heatmap replaced the first and the Markdown named one file for both."""
    runs = make_runs(["org/model", "org_model", "модель", "студент"], ["xy"])
    results = score_runs(small_dataset(), runs, lambda q: scripted(), k=3)
    from vecplug.evaluate import dataset_summary

    report = EvalReport(MACHINE, dataset_summary(small_dataset()),
                        {"path": None, "documents": 5, "reused": False, "report": {"documents": 5},
                         "encoder": {}}, {"k": 3}, results)
    svgs = sorted(p.name for p in report.write(tmp_path / "out") if p.suffix == ".svg")
    assert svgs == ["heatmap-xy-org-model-2.svg", "heatmap-xy-org-model.svg",
                    "heatmap-xy-модель.svg", "heatmap-xy-студент.svg"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert all(f"(`{name}`)" in md for name in svgs)


def test_heatmap_colours_follow_values() -> None:
    svg = heatmap_svg({"a": {"a": 1.0, "b": 0.0}}, ["a"], ["a", "b"], "t <&>")
    root = ET.fromstring(svg)  # well-formed, title escaped
    fills = [r.get("fill") for r in root.iter("{http://www.w3.org/2000/svg}rect")][1:]
    assert fills == ["#08306b", "#f7fbff"]


# -- end to end with a tiny real transformer ------------------------------------------------------

def _runs_by(report: EvalReport) -> dict[tuple[str, str], Any]:
    return {(r.run.mode, r.run.label): r.summary for r in report.results}


def test_evaluate_end_to_end_tiny_model(tmp_path: Path, tiny_model: Path) -> None:
    """Questions that copy their answer sentence must rank it first; copies of another sentence
    must not. Real Index (hnswlib), real encoder."""
    copy = load_xquad_r_dataset(write_xquad(tmp_path / "copy"))
    runs = make_runs([None], ["xy", "mono", "prefer"])
    report = evaluate(copy, runs, index_dir=tmp_path / "idx", model=str(tiny_model), command="test")
    s = _runs_by(report)
    xy, mono = s[("xy", "default query encoder")], s[("mono", "default query encoder")]
    assert xy["overall"]["queries"] == 12 and mono["overall"]["queries"] == 12
    assert xy["overall"]["mrr@10"] == pytest.approx(1.0) and xy["overall"]["p@1"] == pytest.approx(1.0)
    assert mono["overall"]["mrr@10"] == pytest.approx(1.0) and mono["overall"]["map@20"] == pytest.approx(1.0)
    # the pool (17 sentences) is smaller than 20: every relevant sentence is in the top 20
    assert xy["overall"]["recall@20"] == pytest.approx(1.0)
    assert 0 < xy["overall"]["map@20"] <= 1
    assert xy["bias"]["expected_same_lang"] == pytest.approx(1 / 3)
    assert xy["bias"]["score_gap_queries"] == 12 and xy["bias"]["score_gap"] > 0  # the copy scores ~1
    assert set(xy["pairs"]) == {"de", "en", "es"} and xy["pairs"]["de"]["en"] == pytest.approx(1.0)
    assert s[("prefer", "default query encoder")]["overall"]["p@1"] == pytest.approx(1.0)
    assert report.index["documents"] == 17 and not report.index["reused"]
    assert report.index["encoder"]["document_encoder"] == str(tiny_model)
    assert xy["timing"]["ms_per_query"] > 0

    # the same index again: reused, nothing re-encoded; questions now copy a wrong sentence
    shuffled = load_xquad_r_dataset(write_xquad(tmp_path / "shuffled", shuffled=True))
    again = evaluate(shuffled, runs, index_dir=tmp_path / "idx", model=str(tiny_model), command="test")
    assert again.index["reused"] and again.index["report"]["documents"] == 0
    s2 = _runs_by(again)
    assert s2[("mono", "default query encoder")]["overall"]["p@1"] == 0.0
    assert s2[("mono", "default query encoder")]["overall"]["mrr@10"] < 1.0
    assert s2[("xy", "default query encoder")]["overall"]["mrr@10"] < 1.0

    # an index holding documents the dataset does not have is refused, not silently mixed in
    subset = load_xquad_r_dataset(tmp_path / "copy", ["en", "de"])
    with pytest.raises(VecplugError, match="not in xquad-r"):
        evaluate(subset, runs, index_dir=tmp_path / "idx", model=str(tiny_model), command="test")


def test_evaluate_beir_tiny_model(tmp_path: Path, tiny_model: Path) -> None:
    ds = load_beir(write_beir(tmp_path / "beir"))
    report = evaluate(ds, make_runs([None], ["xy", "mono"], [None], [False, True]), model=str(tiny_model),
                      command="test")
    assert report.index["path"] is None  # a temporary index
    assert len(report.dataset["problems"]) == 10
    s = _runs_by(report)
    for label in ("default query encoder + no debias", "default query encoder + debias"):
        xy = s[("xy", label)]
        assert xy["overall"]["queries"] == 2 and xy["overall"]["mrr@10"] == pytest.approx(1.0)
        # q1's first hit is its grade-2 copy; its grade-1 German document is somewhere below
        assert 0.6 < xy["overall"]["ndcg@10"] <= 1.0
    mono = s[("mono", "default query encoder")]
    # mono: relevance restricted to the query's language (q1: d1 only, q2: d3)
    assert mono["overall"]["queries"] == 2 and mono["overall"]["mrr@10"] == pytest.approx(1.0)
    assert s[("xy", "default query encoder + no debias")]["by_doc_lang"]["de"]["queries"] == 1
    assert "The first" not in report.markdown()


def test_a_beir_query_s_own_document_is_not_an_answer(tmp_path: Path, tiny_model: Path) -> None:
    """As BEIR's evaluation does: a corpus that holds the queries themselves (ArguAna, Quora)
    does not score a query's own document as a miss at rank 1; k answers remain."""
    folder = write_beir(tmp_path / "beir", bad_lines=False)
    text = "wasser kocht bei hundert grad im topf"
    for name, line in (("corpus.jsonl", {"_id": "q9", "text": text, "lang": "de"}),  # the query itself
                       ("queries.jsonl", {"_id": "q9", "text": text, "lang": "de"})):
        with (folder / name).open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    with (folder / "qrels" / "test.tsv").open("a", encoding="utf-8") as f:
        f.write("q9\td4\t1\n")
    ds = load_beir(folder)
    report = evaluate(ds, make_runs([None], ["xy"], [None], [False]), model=str(tiny_model), command="test", k=3)
    rows = {r["id"]: r for r in report.results[0].queries}
    assert rows["q9"]["mrr@10"] == pytest.approx(1.0) and rows["q9"]["p@1"] == 1.0
    # the search itself finds the copy first: it is the evaluation that sets it aside
    from vecplug.api import Index
    from vecplug.evaluate import index_settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = index_settings(str(Path(tmp) / "idx"), True, document=str(tiny_model))
        with Index.open(settings, create=True) as index:
            index.add_documents(ds.documents)
            assert [h.id for h in index.search(text, 2, lang="de", debias=False)] == ["q9", "d4"]


def test_eval_drops_and_reports_documents_the_index_refuses(tmp_path: Path, tiny_model: Path) -> None:
    """A document the loader accepts but no store can hold (an integer beyond 64 bits in a
    field) is reported with the index's reason and its judgements are dropped: the pooled run
    used to fail after all the searching (score_ids) and mono counted it as a miss."""
    folder = write_beir(tmp_path / "beir", bad_lines=False)
    corpus = (folder / "corpus.jsonl").read_text().splitlines()
    d1 = json.loads(corpus[0])
    corpus[0] = json.dumps(d1)[:-1] + ', "views": 99999999999999999999999}'
    (folder / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    result = CliRunner().invoke(cli, ["eval", f"beir:{folder}", "--model", str(tiny_model), "--mode", "xy",
                                      "--mode", "mono", "--out", str(tmp_path / "out"), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "corpus.jsonl:1: document 'd1'" in result.stderr and "64 bits" in result.stderr
    assert "document d1 is not in the index: its relevance judgements are dropped" in result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    runs = {r["run"]["mode"]: r["summary"] for r in report["runs"]}
    # q1 keeps its German document in xy; in mono (English only) it has nothing left: skipped
    assert runs["xy"]["overall"]["queries"] == 2 and runs["mono"]["skipped_queries"] == 1
    assert len(report["dataset"]["problems"]) == 2


def run_cli(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert (result.exit_code == 0) == ok, result.output
    return result.output


def test_cli_eval(tmp_path: Path, tiny_model: Path) -> None:
    data = write_xquad(tmp_path / "xq")
    out = run_cli("eval", f"xquad-r:{data}", "--langs", "en,de", "--model", str(tiny_model),
                  "--mode", "xy", "--mode", "prefer", "--mode", "mono", "--debias", "both",
                  "--rerank", "none", "--limit", "1", "--out", str(tmp_path / "out"),
                  "--index", str(tmp_path / "idx"), "-q")
    assert "## vecplug eval: xquad-r" in out and "the first 1 per language" in out
    assert f"index: {tmp_path / 'idx'}, 11 documents" in out and (tmp_path / "idx" / "manifest.json").is_file()
    assert "### X-Y: every language pooled" in out and "### prefer:" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(report["runs"]) == 2 * 2 + 1  # xy and prefer with and without debias; mono once
    assert report["dataset"]["queries"] == 2 and report["dataset"]["documents"] == 11
    assert {r["run"]["debias"] for r in report["runs"]} == {False, True, None}
    for r in report["runs"]:
        assert r["summary"]["overall"]["mrr@10"] == pytest.approx(1.0)
    svgs = sorted(p.name for p in (tmp_path / "out").glob("heatmap-*.svg"))
    assert svgs == ["heatmap-prefer-default-query-encoder-debias.svg",
                    "heatmap-prefer-default-query-encoder-no-debias.svg",
                    "heatmap-xy-default-query-encoder-debias.svg",
                    "heatmap-xy-default-query-encoder-no-debias.svg"]


def test_cli_eval_limit_per_detected_language(tmp_path: Path, tiny_model: Path) -> None:
    """--limit N keeps the first N queries of each language, detected when the dataset gives
    none; the report says so, and says the correction the index applied when --debias is not
    given."""
    beir = write_beir_untagged(tmp_path / "untagged")
    out = run_cli("eval", f"beir:{beir}", "--model", str(tiny_model), "--mode", "xy", "--limit", "2",
                  "--out", str(tmp_path / "out"), "-q")
    assert "6 queries (de 2, en 2, es 2; the language of 6 detected), the first 2 per language" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["dataset"]["queries"] == 6 and report["dataset"]["queries_detected"] == 6
    assert report["dataset"]["queries_by_lang"] == {"de": 2, "en": 2, "es": 2}
    run = report["runs"][0]
    assert {q["lang"] for q in run["queries"]} == {"de", "en", "es"}
    # the correction is on by default for a new index; the report says so rather than null
    assert run["run"]["debias"] is None and run["run"]["debias_effective"] is True
    assert "on (the index's setting)" in (tmp_path / "out" / "report.md").read_text()


def test_cli_eval_names_the_users_debias_setting(tmp_path: Path, tiny_model: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With the user's search.debias set, the report credited the index with it."""
    beir = write_beir_untagged(tmp_path / "untagged")
    monkeypatch.setenv("VECPLUG_SEARCH_DEBIAS", "0")
    out = run_cli("eval", f"beir:{beir}", "--model", str(tiny_model), "--mode", "xy", "--limit", "1", "-q")
    assert "off (search.debias)" in out and "the index's setting" not in out


def test_cli_eval_no_queries_shows_problems(tmp_path: Path, tiny_model: Path) -> None:
    """When the skipped lines leave nothing to evaluate, they say why."""
    beir = write_beir(tmp_path / "beir", bad_lines=False)
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td77\t1\n", encoding="utf-8")
    out = run_cli("eval", f"beir:{beir}", "--model", str(tiny_model), "-q", ok=False)
    assert "no queries to evaluate" in out
    assert "document d77 is not in corpus.jsonl" in out
    assert "skipped " in out  # every skipped line is listed, before the evaluation


def test_cli_eval_errors(tmp_path: Path, tiny_model: Path) -> None:
    out = run_cli("eval", f"xquad-r:{tmp_path / 'missing'}", "--model", str(tiny_model), ok=False)
    assert "XQuAD-R folder not found" in out
    beir = write_beir(tmp_path / "beir", bad_lines=False)
    out = run_cli("eval", str(beir), "--langs", "en", ok=False)
    assert "BEIR dataset is evaluated whole" in out
    out = run_cli("eval", str(beir), "--mode", "sideways", ok=False)
    assert "sideways" in out
    # --no-debias is --debias off: beside --debias on it contradicts, rather than meaning both
    for given in ("on", "both"):
        result = CliRunner().invoke(cli, ["eval", str(beir), "--model", str(tiny_model), "--debias", given,
                                          "--no-debias", "-q"])
        assert result.exit_code == 2 and "--no-debias (= --debias off) contradicts" in result.output


def test_cli_eval_out_that_cannot_be_written(tmp_path: Path, tiny_model: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """--out in a folder that cannot be made fails at once, cleanly, before any evaluating."""
    import vecplug.evaluate

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("evaluated before checking --out")

    monkeypatch.setattr(vecplug.evaluate, "evaluate", never)
    (tmp_path / "a-file").write_text("x")
    out = run_cli("eval", str(write_beir(tmp_path / "beir")), "--model", str(tiny_model),
                  "--out", str(tmp_path / "a-file" / "sub"), "-q", ok=False)
    assert f"Error: cannot write the report into {tmp_path / 'a-file' / 'sub'}: Not a directory" in out


def test_eval_index_ignores_the_user_s_store_and_corpus_settings(tmp_path: Path, tiny_model: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary eval index is eval's own: no VECPLUG_INDEX_* sends the dataset elsewhere (a
    Qdrant server), no corpus.lang relabels its documents; the model settings, what is
    evaluated, still apply."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("VECPLUG_INDEX_URL", url)
    monkeypatch.setenv("VECPLUG_INDEX_STORE", "qdrant")
    monkeypatch.setenv("VECPLUG_INDEX_HNSW_EF_SEARCH", "512")
    monkeypatch.setenv("VECPLUG_CORPUS_LANG", "de")
    monkeypatch.setenv("VECPLUG_MODEL_DOCUMENT_MAX_LENGTH", "48")
    ds = load_xquad_r_dataset(write_xquad(tmp_path / "xq"), ["en", "de"])
    report = evaluate(ds, make_runs([None], ["mono"]), model=str(tiny_model), command="test")
    assert report.index["path"] is None and report.index["documents"] == 11
    assert report.index["report"]["languages"] == {"en": 6, "de": 5}  # the dataset's, not all "de"
    assert report.index["encoder"]["document_max_length"] == 48
    assert report.results[0].summary["overall"]["mrr@10"] == pytest.approx(1.0)

    # an index folder given to eval: the user's index settings apply (the graph's search
    # breadth here), the corpus ones still not
    from vecplug.evaluate import index_settings

    kept = index_settings(str(tmp_path / "idx"), False, document=str(tiny_model))
    assert (kept.index.path, kept.index.hnsw_ef_search, kept.corpus.lang) == (str(tmp_path / "idx"), 512, None)
    # ... but the folder is the index: a server URL in the user's settings does not take the
    # dataset to the server (with the folder unused)
    assert (kept.index.url, kept.index.store) == (None, "qdrant")
    monkeypatch.setenv("VECPLUG_INDEX_STORE", "hnswlib")
    report = evaluate(ds, make_runs([None], ["mono"]), model=str(tiny_model), command="test",
                      index_dir=tmp_path / "idx")
    assert report.index["path"] == str(tmp_path / "idx") and (tmp_path / "idx").is_dir()
    assert report.results[0].summary["overall"]["mrr@10"] == pytest.approx(1.0)
    private = index_settings(str(tmp_path / "tmp"), True, document=str(tiny_model), query=None)
    assert private.index.hnsw_ef_search is None and private.model.document == str(tiny_model)
    # a graph of language-centred vectors for an index folder eval creates, and said so
    from vecplug.evaluate import render_markdown

    assert not report.index["centred_graph"] and "language-centred" not in render_markdown(report)
    monkeypatch.setenv("VECPLUG_INDEX_HNSW_CENTRED", "true")
    report = evaluate(ds, make_runs([None], ["xy", "mono"]), model=str(tiny_model), command="test",
                      index_dir=tmp_path / "cidx")
    assert report.index["centred_graph"] and "its graph holds language-centred vectors" in render_markdown(report)
    assert report.results[1].summary["overall"]["mrr@10"] == pytest.approx(1.0)


def test_rerank_run_tiny_model(tmp_path: Path, tiny_model: Path) -> None:
    """A run with the teacher reranker goes through the real second stage."""
    ds = load_xquad_r_dataset(write_xquad(tmp_path / "xq"), ["en", "de"])
    from vecplug.indexer.encoder import teacher_quantize_for
    from vecplug.indexer.precision import resolve_precision

    report = evaluate(ds, make_runs([None], ["xy"], [None, "teacher", "teacher:auto"]), model=str(tiny_model),
                      rerank_depth=10, command="test")
    s = _runs_by(report)
    assert s[("xy", "default query encoder + rerank teacher")]["overall"]["mrr@10"] == pytest.approx(1.0)
    assert report.settings["rerank_depth"] == 10
    # the report says which reranker each run had; teacher:auto, what it resolved to here
    described = [r.to_dict()["reranker"] for r in report.results]
    assert described[0] is None and described[1]["quantize"] == "none" and "resolved" not in described[1]
    assert described[2]["quantize"] == "auto"
    assert described[2]["resolved"] == (teacher_quantize_for("auto", resolve_precision(None), "torch") or "none")


# -- the real model on the real data ------------------------------------------------------------

@pytest.mark.slow
def test_cli_eval_xquad_r_real_model(tmp_path: Path, built_me5: Path) -> None:
    if not XQUAD.is_dir():
        pytest.skip(f"XQuAD-R is not at {XQUAD} (../shared/data/xquad-r)")
    out = run_cli("eval", f"xquad-r:{XQUAD}", "--langs", "en,de", "--limit", "20",
                  "--out", str(tmp_path / "out"), "-q")
    assert "### X-Y: every language pooled" in out and "LAReQA" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["dataset"]["queries"] == 40 and report["dataset"]["documents"] > 2000
    by_mode = {r["run"]["mode"]: r["summary"] for r in report["runs"]}
    assert set(by_mode) == {"xy", "mono"}
    assert 0 < by_mode["xy"]["overall"]["map@20"] <= 1
    assert 0.3 < by_mode["mono"]["overall"]["mrr@10"] <= 1
    assert by_mode["xy"]["bias"]["expected_same_lang"] == pytest.approx(0.5)  # two languages pooled
    assert (tmp_path / "out" / "heatmap-xy-default-query-encoder.svg").is_file()


def test_a_one_character_right_aligned_column_still_has_a_dash() -> None:
    """GitHub reads a separator cell only with a dash in it: ``:`` alone broke the table."""
    from vecplug.report import markdown_table

    assert markdown_table(["lang", "n"], [["de", 3]]).splitlines()[1] == "| ---- | -: |"
