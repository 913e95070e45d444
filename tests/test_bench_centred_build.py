"""benchmarks/centred_build.py: a plain and a centred graph built from the same documents."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np

#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "centred_build"


def test_builds_both_graphs_taking_turns(bench: ModuleType, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    langs = ["de"] * 700 + ["fr"] * 500 + ["ja"] * 300  # arriving language by language
    V = rng.standard_normal((len(langs), 16)).astype(np.float32)
    np.save(tmp_path / "v.npy", V)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"lang": lang}) + "\n" for lang in langs))
    work, out = tmp_path / "scratch", tmp_path / "out.json"
    work.mkdir()
    assert bench.main(["--vectors", str(tmp_path / "v.npy"), "--corpus", str(tmp_path / "c.jsonl"),
                       "--sizes", "1000", "1400", "--queries", "50", "--rounds", "2", "--work", str(work),
                       "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [res["n"] for res in r["results"]] == [1000, 1400]
    for res in r["results"]:
        assert res["languages"] == 3
        for kind in ("plain", "centred"):
            assert len(res["builds"][kind]) == 2
            # a graph of one 16-d vector a document, and the records: some bytes a document
            assert all(b["build_s"] > 0 and b["disk"] > res["n"] * 16 * 4 for b in res["builds"][kind])
    assert list(work.iterdir()) == []  # every folder removed
    text = bench.render(r)
    assert " 1,400 |" in text and "| centred |" in text and "1.00x" in text  # plain against itself
