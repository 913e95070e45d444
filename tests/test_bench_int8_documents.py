"""benchmarks/int8_documents.py: a tiny real run on the real model, the three document sets."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO, XQUAD


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import int8_documents

    return int8_documents


@pytest.mark.slow
def test_tiny_run_on_the_real_model(bench: ModuleType, built_me5: Path, tmp_path: Path) -> None:
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    out = tmp_path / "int8.json"
    assert bench.main(["--data", str(XQUAD), "--limit", "60", "--chunks", "3", "--json", str(out)]) == 0
    r = json.loads(out.read_text(encoding="utf-8"))
    assert r["sentences"] == 60 and r["questions"] == 60
    assert set(r["documents"]) == {"float32", "bfloat16", "int8"}
    assert all(d["seconds"] > 0 for d in r["documents"].values())
    assert r["cosine_to_float32"]["int8"]["min"] > 0.99  # the documents' recipe: near float32
    rows = {(x["documents"], x["queries"]): x for x in r["quality"]}
    assert len(rows) == 6
    for x in rows.values():
        assert 0 < x["xy_map20"] <= 1 and 0 < x["mono_mrr10"] <= 1
    for who in ("teacher float32", "student int8"):
        assert abs(rows[("int8", who)]["xy_map20"] - rows[("float32", who)]["xy_map20"]) < 0.05
    text = bench.render(r)
    assert "kept, of float32 documents'" in text and "| int8 documents, student int8 queries" in text
