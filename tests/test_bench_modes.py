"""benchmarks/modes_scale.py: each mode's first stage on an index of real languages."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "modes_scale"


def _data(folder: Path, n: int = 700, dim: int = 16, langs: tuple[str, ...] = ("en", "de", "ja")) -> tuple[Path, Path]:
    """Vectors with a direction per language (what the correction removes) and their corpus."""
    rng = np.random.default_rng(0)
    shared = rng.normal(size=dim)
    centre = {lang: shared + 0.8 * rng.normal(size=dim) for lang in langs}
    tags = [langs[i % len(langs)] for i in range(n)]
    V = np.stack([centre[t] + rng.normal(size=dim) for t in tags]).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "v.npy", V)
    (folder / "c.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "lang": t}) + "\n" for i, t in enumerate(tags)))
    return folder / "v.npy", folder / "c.jsonl"


def _fitted(bench: ModuleType, folder: Path, n: int) -> tuple[np.ndarray, list[str], Any]:
    """:func:`_data`'s unit vectors (8-d), their languages, and the means of all of them."""
    from vecplug.adapters.bias import LanguageStats

    vectors, corpus = _data(folder, n=n, dim=8)
    V = bench.unit(np.load(vectors))
    langs = bench.read_langs(corpus, len(V))
    stats = LanguageStats(8)
    stats.add(langs, V)
    return V, langs, stats.means()


def test_times_every_mode_and_scores_the_correction(bench: ModuleType, tmp_path: Path) -> None:
    vectors, corpus = _data(tmp_path / "data")
    work, out = tmp_path / "work", tmp_path / "out.json"
    args = ["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "400", "600", "--queries", "40",
            "--work", str(work), "--keep", "--json", str(out)]
    assert bench.main(args + ["--walk-shifts", "0", "2"]) == 0
    r = json.loads(out.read_text())
    assert r["store"] == "hnswlib"
    from vecplug.adapters import bias

    assert bias.WALK_SHIFT == r["results"][0]["walk_shift"] == 1.0  # the sweep put it back
    for res in r["results"]:
        # every language is scanned exactly at this size: the shift changes nothing found
        assert [s["shift"] for s in res["shifts"]] == [0, 2]
        assert all(s["recall"] == res["corrected_recall"] for s in res["shifts"])
    assert [res["n"] for res in r["results"]] == [400, 600]
    for res in r["results"]:
        assert sum(res["languages"].values()) == res["n"] and set(res["languages"]) == {"en", "de", "ja"}
        assert res["scan_limit"] == 20_000  # a small index: the fixed limit
        assert [m["mode"] for m in res["modes"]] == ["xy", "xy + correction", "mono", "prefer + correction",
                                                      "xy + consensus"]
        assert all(0 < m["p50_ms"] <= m["p95_ms"] for m in res["modes"])
        # three small languages: each scanned exactly, so the corrected first stage is the
        # exact centred ranking but for a candidate past a language's 2 x k by plain cosine
        assert 0.9 <= res["corrected_recall"] <= 1.0
        # each language's best 40 found exactly (every language scanned): the reference's own lists
        assert res["consensus_recall"] == 1.0
        assert res["mono_recall"] == 1.0 and 0.9 <= res["plain_recall"] <= 1.0  # scanned / one walk
        assert res["build_s"] > 0
        assert set(res["per_language"]) == {"en", "de", "ja"} and all(ms > 0 for ms in res["per_language"].values())
        assert list(res["per_language"].values()) == sorted(res["per_language"].values(), reverse=True)
    # kept in --work, the indexes are searched again without a build
    assert bench.main(args) == 0
    assert [res["build_s"] for res in json.loads(out.read_text())["results"]] == [None, None]
    # without --keep, the indexes are removed from --work
    assert bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "400", "--queries", "40",
                       "--work", str(tmp_path / "w2"), "--json", str(out)]) == 0
    assert list((tmp_path / "w2").iterdir()) == []


def test_exact_centred_is_the_brute_force_ranking(bench: ModuleType, tmp_path: Path) -> None:
    """The reference list: every document centred by its language's mean, the query by its own."""
    V, langs, means = _fitted(bench, tmp_path, 90)
    rows, qrows = bench.split(len(V), 80, 5, 0)
    assert not set(rows) & set(qrows) and len(rows) == 80 and len(qrows) == 5
    got = bench.exact_centred(V, langs, rows, means, V[qrows], [langs[i] for i in qrows])
    C = means.centre(V[rows], [langs[i] for i in rows])
    for q, found in zip(qrows, got):
        scores = C @ means.centre_query(V[q], langs[q])
        assert found == {f"d{rows[i]}" for i in np.argsort(-scores)[:bench.K]}


def test_refuses_a_corpus_shorter_than_the_vectors(bench: ModuleType, tmp_path: Path) -> None:
    vectors, corpus = _data(tmp_path, n=50)
    corpus.write_text("".join(corpus.read_text().splitlines(keepends=True)[:20]))
    with pytest.raises(SystemExit, match="20 lines for 50 vectors"):
        bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "30", "--queries", "5"])
    with pytest.raises(SystemExit, match="too few for 60 documents"):
        bench.split(50, 60, 5, 0)


def test_exact_consensus_regroups_each_languages_exact_best(bench: ModuleType, tmp_path: Path) -> None:
    """The consensus reference: each language's best ``depth`` by plain cosine, found by brute
    force, regrouped by ``consensus_scores`` as a search regroups what the store finds."""
    from vecplug.adapters.consensus import consensus_scores

    V, langs, means = _fitted(bench, tmp_path, 120)
    rows, qrows = bench.split(len(V), 110, 5, 0)
    depth = 12  # fewer than a language's documents: the cut matters
    got = bench.exact_consensus(V, langs, rows, means, V[qrows], 0.3, depth)
    plain: list[set[str]] = []
    for q, found in zip(qrows, got):
        pool = []
        for lang in ("en", "de", "ja"):
            mine = [i for i in rows if langs[i] == lang]
            pool += sorted(mine, key=lambda i: -float(V[i] @ V[q]))[:depth]
        scores = np.asarray([float(V[i] @ V[q]) for i in pool])
        new = consensus_scores(scores, means.centre(V[pool], [langs[i] for i in pool]), [langs[i] for i in pool], 0.3)
        assert found == {f"d{pool[i]}" for i in np.argsort(-new, kind="stable")[:bench.K]}
        plain.append({f"d{i}" for i in sorted(rows, key=lambda i: -float(V[i] @ V[q]))[:bench.K]})
    # the regrouping shows: a reference that skipped it would be the plain top 10
    assert any(found != p for found, p in zip(got, plain))


def test_builds_and_searches_an_embedded_qdrant_store(bench: ModuleType, tmp_path: Path) -> None:
    vectors, corpus = _data(tmp_path / "data", n=300)
    work, out = tmp_path / "work", tmp_path / "out.json"
    assert bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "250", "--queries", "20",
                       "--store", "qdrant", "--work", str(work), "--keep", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["store"] == "qdrant" and [p.name for p in work.iterdir()] == ["modes-qdrant-250-0"]
    (res,) = r["results"]
    assert sum(res["languages"].values()) == 250
    assert 0.9 <= res["corrected_recall"] <= 1.0 and res["consensus_recall"] == 1.0
    assert "embedded Qdrant store" in bench.render(r)


def test_consensus_with_walk_hints_is_timed_and_scored(bench: ModuleType, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--consensus-shifts``: consensus as it would be with walk hints, against the exact
    consensus. Every language walked here (a limit of 50 documents): a hint of the query itself
    (shift 0) walks as consensus does, a far one finds other candidates."""
    import vecplug.adapters.stores.hnsw as hnsw

    monkeypatch.setattr(hnsw, "scan_limit", lambda total: 50)
    vectors, corpus = _data(tmp_path / "data", n=700)
    out = tmp_path / "out.json"
    assert bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "600", "--queries", "30",
                       "--consensus-shifts", "0", "8", "--json", str(out)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    assert [s["shift"] for s in res["consensus_shifts"]] == [0, 8]
    unshifted, far = res["consensus_shifts"]
    assert unshifted["recall"] == res["consensus_recall"] and far["recall"] < unshifted["recall"]
    assert all(0 < s["p50_ms"] <= s["p95_ms"] for s in res["consensus_shifts"])
    assert "with walk hints" in bench.render(json.loads(out.read_text()))


def test_scan_limits_take_turns_and_count_the_copies(bench: ModuleType, tmp_path: Path) -> None:
    """``--scan-limits``: one handle per limit; below every language's size all are walked (label
    sets cached), above it all are scanned (copies of all 600 documents' vectors cached), and the
    scans find what the default limit's scans find."""
    vectors, corpus = _data(tmp_path / "data", n=700)
    out = tmp_path / "out.json"
    assert bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "600", "--queries", "30",
                       "--scan-limits", "50", "100000", "--json", str(out)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    walked, scanned = res["scan_limits"]
    assert (walked["limit"], walked["walked"], scanned["limit"], scanned["walked"]) == (50, 3, 100_000, 0)
    # the handle's filter cache: labels (8 bytes) and vectors (16 float32), or a label set (~64 bytes a label)
    assert scanned["cache_mb"] == pytest.approx(600 * (8 + 16 * 4) / 1e6)
    assert walked["cache_mb"] == pytest.approx(600 * (8 + 64) / 1e6)
    assert scanned["recall"] == res["corrected_recall"] >= 0.9  # the default limit scans all 3 here too
    assert all(0 < s["p50_ms"] <= s["p95_ms"] for s in res["scan_limits"])
    assert "other exact-scan limits" in bench.render(json.loads(out.read_text()))
    with pytest.raises(SystemExit):
        bench.parse_args(["--vectors", "v", "--corpus", "c", "--store", "qdrant", "--scan-limits", "10"])


def test_exact_plain_is_the_brute_force_ranking_overall_and_in_the_querys_language(bench: ModuleType,
                                                                                    tmp_path: Path) -> None:
    V, langs, _ = _fitted(bench, tmp_path, 90)
    rows, qrows = bench.split(len(V), 80, 5, 0)
    qlangs = [langs[i] for i in qrows]
    pooled, own = bench.exact_plain(V, langs, rows, V[qrows], qlangs)
    for q, ql, every, mine in zip(qrows, qlangs, pooled, own):
        assert every == {f"d{i}" for i in sorted(rows, key=lambda i: -float(V[i] @ V[q]))[:bench.K]}
        assert mine == {f"d{i}" for i in sorted((i for i in rows if langs[i] == ql),
                                                key=lambda i: -float(V[i] @ V[q]))[:bench.K]}
        assert mine != every  # the language filter shows


def test_a_centred_graph_is_built_and_its_modes_scored(bench: ModuleType, tmp_path: Path) -> None:
    from vecplug.adapters.stores.hnsw import HnswStore

    vectors, corpus = _data(tmp_path / "data", n=500)
    work, out = tmp_path / "work", tmp_path / "out.json"
    assert bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "400", "--queries", "30",
                       "--centred", "--corrected-efs", "10", "200", "--work", str(work), "--keep", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["centred"] and [p.name for p in work.iterdir()] == ["modes-hnswlib-centred-400-0"]
    store = HnswStore.open(str(work / "modes-hnswlib-centred-400-0"), {})
    try:
        assert store.centred and store.count() == 400
    finally:
        store.close()
    (res,) = r["results"]
    # small languages: xy and mono scan each exactly; the corrected search is one walk, rescored
    assert res["plain_recall"] == res["mono_recall"] == 1.0 and 0.9 <= res["corrected_recall"] <= 1.0
    assert "per_language" not in res  # the corrected search asks no language on its own
    # the walk's breadth passed on: a wider one finds at least as much (40 candidates: ef 40 at least)
    assert [s["ef"] for s in res["corrected_efs"]] == [10, 200]
    assert res["corrected_efs"][0]["recall"] <= res["corrected_efs"][1]["recall"]
    assert "other search breadths" in bench.render(r)
    assert "language-centred vectors" in bench.render(r)
    with pytest.raises(SystemExit):
        bench.main(["--vectors", str(vectors), "--corpus", str(corpus), "--store", "qdrant", "--centred"])
