"""benchmarks/modes_scale.py: each mode's first stage on an index of real languages."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

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


def test_times_every_mode_and_scores_the_correction(bench: ModuleType, tmp_path: Path) -> None:
    vectors, corpus = _data(tmp_path / "data")
    work, out = tmp_path / "work", tmp_path / "out.json"
    args = ["--vectors", str(vectors), "--corpus", str(corpus), "--sizes", "400", "600", "--queries", "40",
            "--work", str(work), "--keep", "--json", str(out)]
    assert bench.main(args + ["--walk-shifts", "0", "2"]) == 0
    r = json.loads(out.read_text())
    from vecplug.adapters import bias

    assert bias.WALK_SHIFT == r["results"][0]["walk_shift"] == 1.0  # the sweep put it back
    for res in r["results"]:
        # every language is scanned exactly at this size: the shift changes nothing found
        assert [s["shift"] for s in res["shifts"]] == [0, 2]
        assert all(s["recall"] == res["corrected_recall"] for s in res["shifts"])
    assert [res["n"] for res in r["results"]] == [400, 600]
    for res in r["results"]:
        assert sum(res["languages"].values()) == res["n"] and set(res["languages"]) == {"en", "de", "ja"}
        assert [m["mode"] for m in res["modes"]] == ["xy", "xy + correction", "mono", "prefer + correction",
                                                      "xy + consensus"]
        assert all(0 < m["p50_ms"] <= m["p95_ms"] for m in res["modes"])
        # three small languages: each scanned exactly, so the corrected first stage is the
        # exact centred ranking but for a candidate past a language's 2 x k by plain cosine
        assert 0.9 <= res["corrected_recall"] <= 1.0
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
    from vecplug.adapters.bias import LanguageStats

    vectors, corpus = _data(tmp_path, n=90, dim=8)
    V = bench.unit(np.load(vectors))
    langs = bench.read_langs(corpus, len(V))
    stats = LanguageStats(8)
    stats.add(langs, V)
    means = stats.means()
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
