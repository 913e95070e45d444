"""The rerank gate: a reranker sees only the queries whose first stage is unsure
(:mod:`vecplug.adapters.rerank.gate`), from the API, the settings, the CLI and ``vecplug eval``."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import vecplug
from vecplug.adapters.rerank.gate import margin, unsure
from vecplug.adapters.stores import Record, StoreHit
from vecplug.cli import cli
from vecplug.errors import ConfigError


def hits(*scored: tuple[str, float]) -> list[StoreHit]:
    return [StoreHit(Record(f"d{i}", "t", "s", i, lang), score) for i, (lang, score) in enumerate(scored)]


def test_margin_is_taken_in_the_query_language() -> None:
    # a pooled list: an answer's translation follows it closely, the next German answer is far
    pooled = hits(("en", 0.90), ("de", 0.89), ("en", 0.70), ("de", 0.60))
    assert margin(pooled, "de") == pytest.approx(0.29)
    assert margin(pooled, "en") == pytest.approx(0.20)
    # none in the language (or the language unknown): the pooled list's
    assert margin(pooled, "fr") == pytest.approx(0.01)
    assert margin(pooled, None) == pytest.approx(0.01)
    # one: the second lies below the list's last, which bounds the margin from below
    assert margin(hits(("en", 0.9), ("de", 0.8), ("en", 0.7)), "de") == pytest.approx(0.1)
    assert margin(hits(("de", 0.9), ("en", 0.5)), "de") == pytest.approx(0.4)
    # nothing to reorder, and a broken score counts as unsure
    assert margin(hits(("en", 0.9)), "en") == math.inf and margin([], "en") == math.inf
    assert margin(hits(("en", 0.9), ("en", math.nan)), "en") == -math.inf
    # unsorted candidates (a reranker's list, prefer's) are read by score
    assert margin(hits(("en", 0.5), ("en", 0.9), ("en", 0.8)), "en") == pytest.approx(0.1)


def test_unsure_picks_the_queries_below_the_gate() -> None:
    clear, close = hits(("en", 0.9), ("en", 0.5)), hits(("en", 0.9), ("en", 0.88))
    lists = [clear, close, [], hits(("en", 0.9))]
    assert unsure(lists, ["en"] * 4, None) == [0, 1, 3]  # every query with candidates
    assert unsure(lists, ["en"] * 4, 0.1) == [1]
    assert unsure(lists, ["en"] * 4, 0.4) == [1]  # a margin of exactly the gate is sure
    assert unsure(lists, ["en"] * 4, 0.6) == [0, 1]


class CountingReranker:
    """Reverses each candidate list and records what it was given."""

    name = "reverse"
    seen: list[str] = []

    def warm_up(self, context: object) -> None:
        pass

    def rerank(self, queries: list, candidates: list, context: object) -> list:
        CountingReranker.seen.extend(q.text for q in queries)
        return [[StoreHit(h.record, float(i), h.vector) for i, h in enumerate(reversed(c))] for c in candidates]


@pytest.fixture
def reverse_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import vecplug.adapters.plugins as plugins
    import vecplug.adapters.rerank as registry

    monkeypatch.setattr(plugins, "entry_points", lambda group: [
        EntryPoint("reverse", f"{__name__}:CountingReranker", group)] if group == registry.ENTRY_POINT_GROUP else [])
    CountingReranker.seen = []


def _index(tmp_path: Path, tiny_model: Path, **search: Any) -> Any:
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx"), "debias": False},
                                                "model": {"document": str(tiny_model)}, "search": search})
    index = vecplug.create_index(settings=settings)
    words = ["water boils", "the quick fox", "a lazy dog", "snow falls", "green apples", "old books"]
    index.add_documents([vecplug.Document(f"d{i}", w, "s", i, "en") for i, w in enumerate(words)])
    return index


def test_search_reranks_only_below_the_gate(tmp_path: Path, tiny_model: Path, reverse_plugin: None) -> None:
    queries = ["water boils", "quick fox", "lazy dogs sleep", "falling snow"]
    with _index(tmp_path, tiny_model) as index:
        first = index.search_batch(queries, k=4, langs=["en"] * 4)
        margins = [h[0].score - h[1].score for h in (r.hits for r in first)]
        assert all(r.reranked is None for r in first)
        gate = sorted(margins)[1] + 1e-6  # two queries below it, two above
        got = index.search_batch(queries, k=4, langs=["en"] * 4, rerank="reverse", rerank_depth=4,
                                 rerank_gate=gate)
        below = [m < gate for m in margins]
        assert [r.reranked for r in got] == below and sum(below) == 2
        assert CountingReranker.seen == [q for q, b in zip(queries, below) if b]
        for before, after, b in zip(first, got, below):
            ids = [h.id for h in before]
            assert [h.id for h in after] == (ids[::-1] if b else ids)
            if not b:  # the first stage's answers as they were
                assert [h.score for h in after] == pytest.approx([h.score for h in before])
        # ungated: every query; the setting, and the argument over it
        CountingReranker.seen = []
        assert all(r.reranked for r in index.search_batch(queries, k=4, langs=["en"] * 4, rerank="reverse"))
        assert CountingReranker.seen == queries
        one = index.search(queries[0], k=4, lang="en", rerank="reverse", rerank_gate=1e-9)
        assert one.reranked is False and one.to_dict()["reranked"] is False
        with pytest.raises(ConfigError, match="rerank_gate is a score margin above 0"):
            index.search(queries[0], rerank="reverse", rerank_gate=0)
        with pytest.raises(ConfigError, match="rerank_gate is a score margin above 0"):
            index.search(queries[0], rerank="reverse", rerank_gate=float("nan"))
    with _index(tmp_path / "set", tiny_model, rerank_gate=1e-9) as index:
        CountingReranker.seen = []
        assert index.search(queries[0], rerank="reverse").reranked is False
        assert index.search(queries[0], rerank="reverse", rerank_gate=10.0).reranked is True
        assert CountingReranker.seen == [queries[0]]


def test_the_gate_reranks_a_search_of_one_answer(tmp_path: Path, tiny_model: Path, reverse_plugin: None) -> None:
    """k = 1: the gate reads two answers (a margin needs a second), so an unsure query is
    reranked (with one, every margin was infinite: never reranked, whatever the gate); a sure
    one keeps its plain answer; a rerank depth of 1 gives the reranker one candidate."""
    queries = ["water boils", "quick fox", "lazy dogs sleep", "falling snow"]
    with _index(tmp_path, tiny_model) as index:
        two = index.search_batch(queries, k=2, langs=["en"] * 4)
        margins = [r.hits[0].score - r.hits[1].score for r in two]
        gate = sorted(margins)[1] + 1e-6
        got = index.search_batch(queries, k=1, langs=["en"] * 4, rerank="reverse", rerank_depth=4,
                                 rerank_gate=gate)
        below = [m < gate for m in margins]
        assert [r.reranked for r in got] == below and sum(below) == 2
        for plain, after, b in zip(two, got, below):
            assert len(after.hits) == 1
            if not b:
                assert after.hits[0].id == plain.hits[0].id
        assert index.search(queries[0], k=1, lang="en", rerank="reverse", rerank_gate=1e6).reranked is True
        CountingReranker.seen = []
        one = index.search(queries[0], k=1, lang="en", rerank="reverse", rerank_depth=1, rerank_gate=1e6)
        assert one.reranked is True and [h.id for h in one] == [two[0].hits[0].id]  # one candidate: itself


def test_a_query_the_gate_lets_by_costs_a_plain_search(tmp_path: Path, tiny_model: Path, reverse_plugin: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate reads the search a query would get without a reranker (top k; prefer's 2k;
    consensus included) and only the queries it sends on are searched again, to the rerank
    depth: a sure query's answers are those of a search without reranker."""
    from vecplug.adapters import modes
    from vecplug.api import Index

    depths: list[int] = []
    plain_first_stage = Index._first_stage

    def spy(self: Any, vector: Any, lang: Any, mode: str, depth: int, *args: Any, **kw: Any) -> Any:
        depths.append(depth)
        return plain_first_stage(self, vector, lang, mode, depth, *args, **kw)

    monkeypatch.setattr(Index, "_first_stage", spy)
    # a pooled batch without the bias correction is asked of the store in one call
    plain_batch = modes.search_batch

    def batch_spy(store: Any, vectors: Any, k: int, *args: Any, **kw: Any) -> Any:
        depths.extend([k] * len(vectors))
        return plain_batch(store, vectors, k, *args, **kw)

    monkeypatch.setattr(modes, "search_batch", batch_spy)
    queries = ["water boils", "quick fox", "lazy dogs sleep", "falling snow"]
    with _index(tmp_path, tiny_model) as index:
        for mode, consensus in (("xy", False), ("prefer", False), ("xy", True), ("prefer", True)):
            plain = index.search_batch(queries, k=3, mode=mode, langs=["en"] * 4, consensus=consensus)
            shallow = 6 if mode == "prefer" else 3
            lead = [margin([StoreHit(Record(h.id, "t", "s", 0, h.lang), h.score) for h in r.hits], "en")
                    for r in plain]
            gate = sorted(lead)[1] + 1e-6
            depths.clear()
            got = index.search_batch(queries, k=3, mode=mode, langs=["en"] * 4, consensus=consensus,
                                     rerank="reverse", rerank_depth=8, rerank_gate=gate)
            sent = [m < gate for m in lead]
            assert [r.reranked for r in got] == sent and sum(sent) == 2, (mode, consensus)
            assert depths == [shallow] * 4 + [8] * 2, (mode, consensus)
            for before, after, s in zip(plain, got, sent):
                if not s:
                    assert [(h.id, h.score) for h in after] == [(h.id, h.score) for h in before]


def test_the_gate_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert vecplug.load_settings().search.rerank_gate is None
    assert vecplug.load_settings(overrides={"search": {"rerank_gate": 0.05}}).search.rerank_gate == 0.05
    monkeypatch.setenv("VECPLUG_SEARCH_RERANK_GATE", "0.03")
    assert vecplug.load_settings().search.rerank_gate == 0.03
    for bad in ("0", "-0.1", "nan", "inf"):
        monkeypatch.setenv("VECPLUG_SEARCH_RERANK_GATE", bad)
        with pytest.raises(ConfigError, match="search.rerank_gate is a score margin above 0"):
            vecplug.load_settings()


def test_cli_search_takes_the_gate(tmp_path: Path, tiny_model: Path, reverse_plugin: None) -> None:
    _index(tmp_path, tiny_model).close()
    run = CliRunner().invoke(cli, ["search", "water boils", "--index", str(tmp_path / "idx"), "--lang", "en",
                                   "--rerank", "reverse", "--rerank-gate", "1e-9", "--json"])
    assert run.exit_code == 0, run.output
    assert '"reranked": false' in run.output and CountingReranker.seen == []
    run = CliRunner().invoke(cli, ["search", "water boils", "--index", str(tmp_path / "idx"),
                                   "--rerank", "reverse", "--rerank-gate", "-1"])
    assert run.exit_code != 0 and "search.rerank_gate is a score margin above 0" in run.output
    run = CliRunner().invoke(cli, ["search", "water boils", "--index", str(tmp_path / "idx"), "--rerank-gate", "0.1"])
    assert run.exit_code == 2 and "--rerank-gate gates a reranker: give one with --rerank" in run.output


def test_eval_runs_one_reranked_run_per_gate() -> None:
    from vecplug.evaluate import Run, make_runs

    runs = make_runs(["s"], ["xy"], [None, "teacher"], [True], [None], [None, 0.05])
    assert [(r.rerank, r.rerank_gate) for r in runs] == [(None, None), ("teacher", None), ("teacher", 0.05)]
    assert runs[2].label == "s + rerank teacher below margin 0.05 + debias"
    assert runs[2].to_dict()["rerank_gate"] == 0.05
    with pytest.raises(ConfigError, match="gates a reranker"):
        Run("x", rerank_gate=0.05)
    bad = CliRunner().invoke(cli, ["eval", "somewhere", "--rerank", "teacher", "--rerank-gate", "soon"])
    assert bad.exit_code == 2 and "neither a margin above 0" in bad.output
    bad = CliRunner().invoke(cli, ["eval", "somewhere", "--rerank", "none", "--rerank-gate", "0.1"])
    assert bad.exit_code == 2 and "--rerank-gate gates a reranker" in bad.output


def test_eval_reports_the_share_reranked(tmp_path: Path, tiny_model: Path, reverse_plugin: None) -> None:
    from vecplug.evaluate import EvalDataset, EvalQuery, make_runs, score_runs

    with _index(tmp_path, tiny_model) as index:
        texts = ["water boils", "quick fox", "lazy dogs sleep", "falling snow"]
        first = index.search_batch(texts, k=4, langs=["en"] * 4)
        gate = sorted(h[0].score - h[1].score for h in (r.hits for r in first))[1] + 1e-6
    data = EvalDataset(name="t", documents=[], queries=[EvalQuery(f"q{i}", t, "en") for i, t in enumerate(texts)],
                       qrels={f"q{i}": {f"d{i}": 1} for i in range(4)})
    runs = make_runs([None], ["xy"], ["reverse"], [None], [None], [None, gate])
    results = score_runs(data, runs, lambda _: vecplug.open_index(str(tmp_path / "idx")),
                         doc_langs={f"d{i}": "en" for i in range(6)})
    assert [r.summary["reranked"] for r in results] == [1.0, 0.5]
    assert [q["reranked"] for q in results[1].queries].count(True) == 2
    # a plugin's reranker without describe() is named in the report by its name
    assert [r.to_dict()["reranker"] for r in results] == [{"name": "reverse"}] * 2
