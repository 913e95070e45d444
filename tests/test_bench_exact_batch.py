"""benchmarks/exact_batch.py: an exact scan of a batch of queries in bfloat16 halves."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from conftest import crowded_vectors, exact_top_k

#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "exact_batch"


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_scan_finds_the_exact_top_k(bench: ModuleType, sign: float) -> None:
    import torch

    base, queries = crowded_vectors(9_000, 64, seed=3, sign=sign)
    ids, scores = exact_top_k(base, queries, 10)
    every = queries.astype(np.float64) @ base.T.astype(np.float64)
    gaps = scores[:, 9] - np.sort(every, axis=1)[:, -11]
    assert np.median(gaps) < 2e-3  # crowded: a bfloat16 product could not order them
    Q = torch.from_numpy(queries)
    # the scan's allowance for bfloat16 inputs, as exact_batch.py sets it from --check
    rounded = (Q.to(torch.bfloat16).float() @ torch.from_numpy(base).to(torch.bfloat16).float().T).double().numpy()
    allowed = bench.CHECK_ROOM * float(np.abs(rounded - every).max())
    for halves in (True, False):
        hi, lo = bench.split(base) if halves else (torch.from_numpy(base), None)
        for chunk in (4096, 1000):  # the last chunk partial; many chunks, with raised floors
            found, found_scores, stats = bench.scan(Q, hi, lo, 10, chunk=chunk, input_error=allowed)
            assert [set(r) for r in found.numpy()] == [set(r) for r in ids]
            # scored exactly (hi + lo is float32 within ~2^-17), best first
            assert np.abs(found_scores.numpy() - scores).max() < 1e-5
            assert (np.diff(found_scores.numpy(), axis=1) <= 0).all()
            assert 10 <= stats["candidates"] < 200 and 0 < stats["read_share"] <= 1


def test_halves_are_float32_to_the_last_bits(bench: ModuleType) -> None:
    import torch

    x = np.random.default_rng(0).standard_normal((100, 32)).astype(np.float32)
    hi, lo = bench.split(x)
    assert hi.dtype == lo.dtype == torch.bfloat16
    assert np.abs(hi.float().numpy() - x).max() > 1e-4  # one half alone is not it
    assert np.abs((hi.float() + lo.float()).numpy() - x).max() <= 2 ** -16 * np.abs(x).max()


def test_a_run_on_ann_scale_data(bench: ModuleType, tmp_path: Path) -> None:
    """Through main, on what ``ann_scale.py --data-only`` made: every batch size and every
    kind (the flat store's search_batch too) find the exact top 10 (strict recall 1.0), and the
    report says so."""
    import ann_scale

    work = tmp_path / "work"
    assert ann_scale.main(["--sizes", "5000", "--dim", "32", "--queries", "30", "--work", str(work),
                           "--data-only", "--json", str(tmp_path / "ann.json")]) == 0
    out = tmp_path / "out.json"
    assert bench.main(["--work", str(work), "--batches", "1", "7", "--threads", "1", "--float32",
                       "--store", "--check", "500", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    (s,) = r["sets"]
    assert s["n"] == 5000 and s["queries"] == 30 and s["input_error_allowed"] == pytest.approx(1.25 * s["input_error"])
    assert 0 < s["input_error"] < 0.01
    assert [k["kind"] for k in s["kinds"]] == ["bfloat16 hi + lo", "float32", "flat store"]
    runs = [x for k in s["kinds"] for x in k["runs"]]
    assert [(x["batch"], x["batches"]) for x in runs] == [(1, 30), (7, 5)] * 3
    assert all(x["recall"] == 1.0 and x["per_query_ms"] > 0 for x in runs)
    assert s["kinds"][0]["rss_added"] > 0 and s["kinds"][2]["build_s"] > 0
    assert not list(work.glob("flat-store-*"))  # the store's folder removed
    text = bench.render(r)
    assert "| threads | batch | ms per query |" in text and "1.0000" in text
    with pytest.raises(SystemExit, match="no ann_scale.py data"):
        bench.main(["--work", str(work), "--size", "123"])
    with pytest.raises(SystemExit, match="no ann_scale.py data"):
        bench.main(["--work", str(work), "--data", "debian-1m-me5-small.npy"])
    assert bench.main(["--work", str(work), "--data", "synthetic", "--batches", "30", "--threads", "1",
                       "--store", "--corrected", "--no-halves", "--json", str(out)]) == 0
    alone, corrected = json.loads(out.read_text())["sets"][0]["kinds"]
    assert alone["kind"] == "flat store" and alone["runs"][0]["recall"] == 1.0
    # the correction's candidates (each language's best by plain inner product with the centred
    # query) hold nearly all of the exact centred top 10
    assert corrected["kind"] == "flat store, corrected" and 0.9 <= corrected["runs"][0]["recall"] <= 1.0


def test_the_centred_truth_is_the_exact_centred_top_k(bench: ModuleType, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.adapters.bias import LanguageStats

    monkeypatch.setattr(bench, "BASE_CHUNK", 700)  # the best merged over several chunks

    base, queries = crowded_vectors(3_000, 24, seed=5)
    path = tmp_path / "base.npy"
    np.save(path, base)
    means = bench.language_means(path)
    stats = LanguageStats(24)
    stats.add(bench._langs(0, len(base)), base)
    np.testing.assert_allclose(means.of("de"), stats.means().of("de"))
    truth = bench.centred_truth(path, queries, means)
    scores = means.centre(queries, bench._langs(0, len(queries))) @ means.centre(base, bench._langs(0, len(base))).T
    want = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    assert [set(r) for r in truth] == [set(r) for r in want]


def test_fewer_documents_than_k(bench: ModuleType) -> None:
    """Five documents, top 10: all five, best first, then -1s (no error)."""
    import torch

    base, queries = crowded_vectors(5, 16, seed=1)
    for hi, lo in (bench.split(base), (torch.from_numpy(base), None)):
        ids, scores, _ = bench.scan(torch.from_numpy(queries[:3]), hi, lo, 10)
        exact_ids, _ = exact_top_k(base, queries[:3], 5)
        assert (ids[:, :5].numpy() == exact_ids).all() and (ids[:, 5:] == -1).all()
        assert torch.isinf(scores[:, 5:]).all()
