"""benchmarks/int8_documents.py: a tiny real run on the real model, the three document sets."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from conftest import XQUAD, quality_rows, run_on_xquad


#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "int8_documents"


@pytest.mark.slow
def test_tiny_run_on_the_real_model(bench: ModuleType, built_me5: Path, tmp_path: Path) -> None:
    r = run_on_xquad(bench, tmp_path / "int8.json", "--chunks", "3")
    assert set(r["documents"]) == {"float32", "bfloat16", "int8"}
    assert all(d["seconds"] > 0 for d in r["documents"].values())
    assert r["cosine_to_float32"]["int8"]["min"] > 0.99  # the documents' recipe: near float32
    rows = quality_rows(r)
    for who in ("teacher float32", "student int8"):
        assert abs(rows[("int8", who)]["xy_map20"] - rows[("float32", who)]["xy_map20"]) < 0.05
    text = bench.render(r)
    assert "kept, of float32 documents'" in text and "| int8 documents, student int8 queries" in text


@pytest.mark.slow
def test_one_int8_set_per_engine(bench: ModuleType, built_me5: Path) -> None:
    """``--int8-engines fbgemm onednn`` packs one int8 set for each kind of kernel, on any x86
    CPU, and leaves the library's own choice as it was for whatever runs next."""
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    import torch

    from vecplug.indexer import torch_int8_documents

    if "onednn" not in torch.backends.quantized.supported_engines:
        pytest.skip("torch built without oneDNN's quantised engine")
    before = torch_int8_documents.document_engine
    r = bench.run(bench.parse_args(["--data", str(XQUAD), "--limit", "12", "--chunks", "2",
                                    "--int8-engines", "fbgemm", "onednn"]))
    assert r["int8_engines"] == {"int8 fbgemm": "torch's default (x86: FBGEMM)", "int8 onednn": "onednn"}
    assert list(r["documents"]) == ["float32", "bfloat16", "int8 fbgemm", "int8 onednn"]
    assert torch_int8_documents.document_engine is before
    assert min(c["min"] for k, c in r["cosine_to_float32"].items() if k.startswith("int8")) > 0.99
    assert "| int8 onednn documents, student int8 queries" in bench.render(r)


@pytest.mark.slow  # compiles me5-small twice (~1 min)
def test_compiled_sets(bench: ModuleType, built_me5: Path, fresh_machine: Path) -> None:
    """``--compile`` adds bfloat16 and int8 compiled by torch.compile, their first batch
    (the compilation) timed apart, in a fresh machine's Inductor cache; the same vectors."""
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    from vecplug.indexer import torch_int8_documents

    r = bench.run(bench.parse_args(["--data", str(XQUAD), "--limit", "40", "--chunks", "2", "--compile"]))
    assert list(r["documents"]) == ["float32", "bfloat16", "int8", "bfloat16 compiled", "int8 compiled"]
    assert r["compiled"]["cache_was_empty"] is True
    assert r["compiled"]["bfloat16 compiled"]["first_batch_s"] > 0
    assert r["compiled"]["bfloat16 compiled"]["fell_back"] is False
    if torch_int8_documents.document_engine(compiled=True) == "onednn":  # its int8 product compiles
        assert r["compiled"]["int8 compiled"]["fell_back"] is False
        assert r["int8_engines"]["int8 compiled"] == "onednn"
    cos = r["cosine_to_float32"]
    assert cos["bfloat16 compiled"]["min"] > 0.999 and cos["int8 compiled"]["min"] > 0.99
    assert "which compiles, took bfloat16 compiled:" in bench.render(r)
