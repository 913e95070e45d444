"""benchmarks/product_ceiling.py: the matrix product alone, per kind, as an exact scan would run it."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "product_ceiling"


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
def test_each_kind_multiplies_what_it_says(bench: ModuleType, kind: str) -> None:
    """A step's product is the queries by the rows, in the kind's arithmetic: int8 sums exact
    in int32, the floating kinds within their rounding."""
    if bench.available(kind, 48) is not None:
        pytest.skip(f"{kind} products not available in this torch")
    q, x = bench.operands(kind, 300, 48, 7)
    assert q.shape == (7, 48) and x.shape == (300, 48)
    assert str(q.dtype) == str(x.dtype) == {"float32": "torch.float32", "bfloat16": "torch.bfloat16",
                                            "int8": "torch.int8"}[kind]
    want = q.double().numpy() @ x.double().numpy()[100:228].T
    got = bench.product(kind)(q, x[100:228]).double().numpy()
    if kind == "int8":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=(1e-4 if kind == "float32" else 0.25))
    assert np.abs(want).max() > 1  # (not a product of zeros)


def test_a_run_reports_every_setting(bench: ModuleType, tmp_path: Path) -> None:
    import torch

    out = tmp_path / "out.json"
    threads = torch.get_num_threads()
    assert bench.main(["--rows", "5000", "--dim", "32", "--batches", "4", "16", "--chunks", "512", "2048",
                       "--threads", "1", "--repeats", "3", "--kinds", "float32", "int8",
                       "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads  # (its one thread not left to the tests after it)
    r = json.loads(out.read_text())
    kinds = [k for k in ("float32", "int8") if k not in r["skipped"]]
    assert kinds and r["rows"] == 5000 and r["dim"] == 32
    assert [(x["kind"], x["batch"], x["chunk"]) for x in r["runs"]] == \
        [(k, b, c) for k in kinds for b in (4, 16) for c in (512, 2048)]
    for x in r["runs"]:
        assert len(x["passes_s"]) == 3 and x["pass_s"] == sorted(x["passes_s"])[1]
        assert x["per_query_ms"] == pytest.approx(x["pass_s"] / x["batch"] * 1e3)
        assert x["gops"] == pytest.approx(2 * x["batch"] * 5000 * 32 / x["pass_s"] / 1e9)
    fastest = bench.best(r)
    assert len(fastest) == 2 * len(kinds)
    for f in fastest:
        same = [x for x in r["runs"] if (x["kind"], x["batch"]) == (f["kind"], f["batch"])]
        assert f["pass_s"] == min(x["pass_s"] for x in same)
    text = bench.render(r)
    assert "**Each kind at its fastest step**" in text
    assert all(f"| {k} " in text for k in kinds)
