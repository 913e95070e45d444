"""benchmarks/ann_scale.py at a tiny size: every backend builds and searches in its own
process, and the JSON it writes holds sane numbers."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO

pytest.importorskip("hnswlib")
pytest.importorskip("qdrant_edge")


@pytest.fixture
def ann_scale(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - the module
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import ann_scale

    return ann_scale


def test_tiny_run_reports_sane_numbers(ann_scale, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ann.json"
    work = tmp_path / "work"
    argv = ["--sizes", "3000", "--dim", "32", "--queries", "50", "--filtered-queries", "30",
            "--ef", "16", "64", "--batch", "1000", "--commit-every", "2000", "--threads", "1",
            "--work", str(work), "--json", str(out)]
    assert ann_scale.main(argv) == 0
    r = json.loads(out.read_text())
    assert not (tmp_path / "ann.json.partial").exists()  # kept only while the run goes
    assert {row["backend"] for row in r["rows"]} == {"hnswlib", "qdrant", "raw-hnswlib"}
    stats = r["data"]["3000"]
    # shaped like e5 passage vectors: anisotropic (random pairs well above 0), close neighbours
    assert 0.6 < stats["random_cos"][1] < 0.9 and stats["nn1_cos"][1] > stats["random_cos"][1]
    for row in r["rows"]:
        build, serve = row["build"], row["serve"]
        assert row["n"] == 3000
        assert build["build_s"] > 0 and build["vectors_per_s"] > 0
        assert build["build_rss_peak"] > 0 and serve["serve_rss_peak"] > 0
        # a fresh process's own peak, not its parent's (which imported torch)
        assert serve["serve_rss_peak"] < 1.5 * 2 ** 30
        assert build["disk"]["allocated"] > 0 and build["disk"]["apparent"] > 0
        # 3000 vectors committed every 2000: two commits (2000, then the last 1000)
        assert build["commits"] == (1 if row["backend"] == "raw-hnswlib" else 2)
        assert serve["sweep"]
        for s in serve["sweep"]:
            assert 0.0 <= s["recall"] <= s["recall_ties"] <= 1.0  # an exact top-10 hit is within the ties
            assert "labels" not in s  # scored by the parent, not kept in the JSON
            assert 0 < s["p50_ms"] <= s["p95_ms"]
        if row["backend"] != "raw-hnswlib":
            f = serve["filtered"]
            assert 0.9 <= f["recall"] <= 1.0  # 500 documents per language: exact or nearly
            assert 0 < f["p50_ms"] <= f["p95_ms"] and f["serve_rss_peak"] > 0
    for backend in ("hnswlib", "raw-hnswlib"):
        row = next(x for x in r["rows"] if x["backend"] == backend)
        high = next(s for s in row["serve"]["sweep"] if s["ef"] == 128)
        assert high["recall"] >= 0.9
    # the store and the raw index hold the same graph: the same answers at the same ef
    store, raw = (next(x for x in r["rows"] if x["backend"] == b) for b in ("hnswlib", "raw-hnswlib"))
    assert [s["ef"] for s in store["serve"]["sweep"]] == [16, 64, 128]  # the default ef (128) joins the sweep
    qdrant = next(x for x in r["rows"] if x["backend"] == "qdrant")
    assert qdrant["serve"]["sweep"][0]["ef"] == "default"
    assert 0.9 <= qdrant["serve"]["filtered_plain"]["recall"] <= 1.0  # the store with ACORN off
    md = capsys.readouterr().out
    assert "## ANN index build and search at scale" in md and "raw hnswlib" in md
    assert "filtered graph walk" in md and re.search(r"\| +ACORN off \|", md)
    assert "with ties" in md and "recall@10 with ties" in md  # the column and the target lines
    # data and ground truth are cached in the work folder; the indexes are gone
    assert list(work.glob("base-*.npy")) and not list(work.glob("index-*"))


def test_ground_truth_is_exact(ann_scale, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2500, 8)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:20] + 0.01
    path = tmp_path / "base.npy"
    np.save(path, base)
    monkeypatch.setattr(ann_scale, "GT_CHUNK", 700)  # several chunks, the last one short
    ids, scores, fids, _ = ann_scale.ground_truth(path, queries)
    exact = np.argsort(-(queries @ base.T), axis=1)[:, :10]
    assert (ids == exact).all()
    assert np.allclose(scores, np.take_along_axis(queries @ base.T, exact, 1), atol=1e-5)
    for q in range(len(queries)):
        lang = q % len(ann_scale.LANGS)
        cols = np.arange(lang, len(base), len(ann_scale.LANGS))
        want = cols[np.argsort(-(base[cols] @ queries[q]))[:10]]
        assert (fids[q] == want).all()


def test_data_is_deterministic_and_chunk_independent(ann_scale, tmp_path: Path) -> None:
    model = ann_scale.DataModel(1000, 16, 0, None)
    a = model.sample(5, np.random.default_rng([0, 1, 0]))
    b = ann_scale.DataModel(1000, 16, 0, None).sample(5, np.random.default_rng([0, 1, 0]))
    assert np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    centres = tmp_path / "centres.npy"
    np.save(centres, np.random.default_rng(2).standard_normal((40, 16)).astype(np.float32))
    real = ann_scale.DataModel(1000, 16, 0, centres)
    assert real.C.shape == (40, 16)
    assert np.allclose(np.linalg.norm(real.sample(3, np.random.default_rng(0)), axis=1), 1, atol=1e-5)


def test_real_vectors_are_indexed_as_they_are(ann_scale, tmp_path: Path) -> None:
    """``--vectors``: base and queries are disjoint rows of the file, normalised, and too small
    a file is refused."""
    rows = np.random.default_rng(3).standard_normal((300, 16)).astype(np.float32) * 2
    path = tmp_path / "real.npy"
    np.save(path, rows)
    args = ann_scale.parse_args(["--vectors", str(path), "--dim", "16", "--queries", "20", "--sizes", "250"])
    data = ann_scale.make_data(args, 250, tmp_path / "work")
    base = np.load(data["paths"]["base"])
    queries = np.load(data["paths"]["queries"])
    assert base.shape == (250, 16) and queries.shape == (20, 16) and data["stats"]["centres"] is None
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    where = [int(np.argmax(unit @ v)) for v in np.concatenate([base, queries])]
    assert len(set(where)) == 270  # every row a distinct row of the file
    assert np.allclose(unit[where], np.concatenate([base, queries]), atol=1e-6)
    with pytest.raises(ValueError, match="too few"):
        ann_scale.make_data(args, 290, tmp_path / "work")
    with pytest.raises(SystemExit):  # one source of data, not two
        ann_scale.parse_args(["--vectors", str(path), "--centres", str(path)])


def test_recall_with_ties_counts_near_ties_only(ann_scale, tmp_path: Path) -> None:
    """A result within TIE_EPS of the exact K-th score is no miss; one further away is."""
    k = ann_scale.K
    base = np.zeros((k + 2, 2), dtype=np.float32)
    base[:, 0] = np.linspace(1.0, 0.9, k + 2)  # scores against the query (1, 0): falling
    base[k, 0] = base[k - 1, 0] - ann_scale.TIE_EPS / 2  # the 11th: a near-tie of the 10th
    path = tmp_path / "base.npy"
    np.save(path, base)
    queries = np.array([[1.0, 0.0]], dtype=np.float32)
    kth = np.array([base[k - 1, 0]])
    exact = list(range(k))
    assert ann_scale.recall_with_ties([exact], path, queries, kth) == 1.0
    tie = exact[:-1] + [k]
    assert ann_scale.recall_with_ties([tie], path, queries, kth) == 1.0
    far = exact[:-1] + [k + 1]
    assert ann_scale.recall_with_ties([far], path, queries, kth) == pytest.approx(0.9)
