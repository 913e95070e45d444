"""benchmarks/ann_crowding.py: documents within d of each query's exact 10th neighbour."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "ann_crowding"


def test_counts_the_documents_near_the_tenth(bench: ModuleType, tmp_path: Path) -> None:
    # one query along the first axis; documents at cosines chosen by hand: 10 at 0.95 and
    # above, then 0.9495 (within 0.001 of the 10th), 0.947 (within 0.005), 0.5 (far)
    cosines = [0.99, 0.98, 0.97, 0.96, 0.959, 0.958, 0.957, 0.956, 0.955, 0.95, 0.9495, 0.947, 0.5]
    base = np.zeros((len(cosines), 4), dtype=np.float32)
    base[:, 0] = cosines
    base[:, 1] = np.sqrt(1 - np.square(cosines))
    query = np.asarray([[1, 0, 0, 0]], dtype=np.float32)
    key = "k1"
    np.save(tmp_path / f"base-{key}.npy", base)
    np.save(tmp_path / f"queries-{key}.npy", query)
    np.save(tmp_path / f"gt_scores-{key}.npy", (query @ base.T)[:, :10])
    np.save(tmp_path / f"gt-{key}.npy", np.arange(10)[None, :])
    (tmp_path / f"stats-{key}.json").write_text(json.dumps({"params": {"n": len(cosines), "vectors": None}}))
    (tmp_path / "stats-orphan.json").write_text("{}")  # no data beside it: skipped
    out = tmp_path / "out.json"
    assert bench.main(["--work", str(tmp_path), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    (s,) = r["sets"]
    assert s["n"] == 13 and s["data"] == "synthetic (clustered)"
    assert {d: w["median"] for d, w in s["within"].items()} == {"0.001": 11, "0.005": 12, "0.01": 12, "0.02": 12}
    assert s["tenth_cos"][1] == pytest.approx(0.95)
    with pytest.raises(SystemExit, match="no ann_scale.py data"):
        bench.main(["--work", str(tmp_path / "empty")])


def test_reads_what_ann_scale_made_with_data_only(bench: ModuleType, tmp_path: Path) -> None:
    """``ann_scale.py --data-only`` makes the data and its exact neighbours and builds nothing;
    this script counts on them (every query has at least its own 10 within any d)."""
    import ann_scale

    work, out = tmp_path / "work", tmp_path / "ann.json"
    assert ann_scale.main(["--sizes", "2000", "--dim", "16", "--queries", "20", "--work", str(work),
                           "--data-only", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["rows"] == [] and r["sweep"] == [] and r["data"]["2000"]["params"]["n"] == 2000
    assert not list(work.glob("*hnsw*")) and not list(work.glob("*qdrant*"))
    assert bench.main(["--work", str(work), "--json", str(tmp_path / "c.json")]) == 0
    (s,) = json.loads((tmp_path / "c.json").read_text())["sets"]
    medians = [w["median"] for w in s["within"].values()]
    assert s["n"] == 2000 and s["queries"] == 20 and 10 <= medians[0] <= medians[-1] <= 2000
    assert medians == sorted(medians)


def test_partitions_measure_an_exact_scan_of_the_nearest_lists(bench: ModuleType, tmp_path: Path) -> None:
    """``--partitions``: k-means lists, and the share of the exact top 10 in the probed lists.
    Four tight, far-apart groups of 64 rows: four lists find them; a query's 10 neighbours all
    sit in its own group, so one list probed holds them all and reads 64 vectors; a query
    whose neighbours straddle two groups finds half of them there."""
    rng = np.random.default_rng(0)
    centres = np.eye(8, dtype=np.float32)[:4]
    base = np.concatenate([c + 0.01 * rng.standard_normal((64, 8)).astype(np.float32) for c in centres])
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = np.stack([centres[0], centres[2]])
    truth = np.stack([np.arange(10), 128 + np.arange(10)])
    np.save(tmp_path / "base.npy", base)
    part = bench.partitions(tmp_path / "base.npy", queries, truth, lists=4, iterations=5)
    assert part["lists"] == 4 and part["list_size"] == [64, 64, 64, 64]
    first = part["probes"][0]
    assert first["probe"] == 1 and first["recall"] == 1.0 and first["scanned"] == 64
    # the second query's "neighbours": 5 in its group, 5 in another: its one list finds half
    straddle = np.stack([np.arange(10), np.r_[128 + np.arange(5), 64 + np.arange(5)]])
    half = bench.partitions(tmp_path / "base.npy", queries, straddle, lists=4, iterations=5)
    assert [r["probe"] for r in half["probes"]] == [1]  # 1/256 to 1/4 of 4 lists: 1
    assert half["probes"][0]["recall"] == pytest.approx(0.75)  # (1 + 0.5) / 2

    # through main: the Markdown has the table
    key = "p1"
    np.save(tmp_path / f"base-{key}.npy", base)
    np.save(tmp_path / f"queries-{key}.npy", queries)
    np.save(tmp_path / f"gt-{key}.npy", truth)
    np.save(tmp_path / f"gt_scores-{key}.npy", np.sort(queries @ base.T, axis=1)[:, ::-1][:, :10])
    (tmp_path / f"stats-{key}.json").write_text(json.dumps({"params": {"n": len(base), "vectors": None}}))
    out = tmp_path / "out.json"
    assert bench.main(["--work", str(tmp_path), "--partitions", "4", "--json", str(out)]) == 0
    (s,) = json.loads(out.read_text())["sets"]
    assert s["partitions"]["probes"][0]["recall"] == 1.0
    assert "recall@10 of an exact scan" in bench.render(json.loads(out.read_text()))
