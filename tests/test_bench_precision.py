"""benchmarks/precision_probe.py: a tiny real run on the real model, both precisions."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from conftest import XQUAD, quality_rows, run_on_xquad


#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "precision_probe"


@pytest.mark.slow
def test_tiny_run_on_the_real_model(bench: ModuleType, built_me5: Path, tmp_path: Path) -> None:
    r = run_on_xquad(bench, tmp_path / "probe.json", "--latency-queries", "3", "--chunks", "2")
    assert r["langs"] == ["ar", "de", "en", "es", "ru", "zh"]  # spread, not the first file's only
    assert r["document_cosine"]["min"] > 0.999  # bfloat16 vectors: nearly float32's
    rows = quality_rows(r)
    # the same queries over the two document sets rank nearly alike
    assert abs(rows[("bfloat16", "student int8")]["xy_map20"] - rows[("float32", "student int8")]["xy_map20"]) < 0.05
    latency = {x["queries"]: x for x in r["latency"]}
    assert set(latency) == {"teacher float32", "teacher bfloat16", "student float32", "student bfloat16",
                            "student int8"}
    assert all(x["p50_ms"] > 0 for x in latency.values())
    assert latency["teacher bfloat16"]["cos_to_float32"] > 0.999
    text = bench.render(r)
    assert "bfloat16 keeps, of float32's" in text and "| student int8" in text
    only = bench.run(bench.parse_args(["--data", str(XQUAD), "--limit", "12", "--documents-only", "--chunks", "2"]))
    assert "quality" not in only and "### Quality" not in bench.render(only)
