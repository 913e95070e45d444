"""benchmarks/batch_plan.py: a tiny run on the tiny model; the encoder's plan is restored after."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from conftest import XQUAD


#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "batch_plan"


def test_tiny_run(bench: ModuleType, tiny_model: Path) -> None:
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    from vecplug.indexer import length_batches

    original = length_batches.plan
    args = bench.parse_args(["--model", str(tiny_model), "--data", str(XQUAD), "--docs", "60", "--calls", "7", "60",
                             "--overheads", "0", "64", "--rounds", "2", "--threads", "1", "--precision", "float32"])
    r = bench.run(args)
    assert length_batches.plan is original
    json.dumps(r)
    rows = {(x["call"], x["plan"]): x for x in r["rows"]}
    assert set(rows) == {(c, p) for c in (7, 60) for p in ("fill", "plan-0", "plan-64")}
    for call in (7, 60):
        fill, free = rows[(call, "fill")], rows[(call, "plan-0")]
        assert fill["ratio_to_fill"] == 1.0 and len(fill["seconds"]) == 2
        # with no cost per forward pass the plan pads least, one batch per length if need be
        assert 1.0 <= free["padded_over_real"] <= fill["padded_over_real"]
        assert free["forwards"] >= fill["forwards"] >= -(-60 // call)
    assert rows[(7, "plan-0")]["padded_over_real"] >= rows[(60, "plan-0")]["padded_over_real"]
    assert "| texts a call |" in bench.render(r)
