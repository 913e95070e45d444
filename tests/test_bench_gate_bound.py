"""benchmarks/gate_bound.py: how much of the teacher's quality each way of choosing the queries
it reranks reaches, the oracle's bound, and what the shares cost."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from conftest import XQUAD

#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "gate_bound"


def brute_quality(first: np.ndarray, second: np.ndarray, sent: np.ndarray) -> float:
    return float(np.where(np.isin(np.arange(len(first)), sent), second, first).mean())


def test_quality_and_the_share_needed_agree_with_a_brute_force(bench: ModuleType) -> None:
    rng = np.random.default_rng(3)
    first, second = rng.random(50), rng.random(50)
    order = rng.permutation(50)
    for share in (0.0, 0.1, 0.34, 0.5, 1.0):
        k = int(round(share * 50))
        assert bench.quality(order, first, second, share) == pytest.approx(brute_quality(first, second, order[:k]))
    target = brute_quality(first, second, order[:17])
    # the least prefix that reaches the target: 17 queries, or fewer when an earlier one did
    want = min(k for k in range(51) if brute_quality(first, second, order[:k]) >= target - 1e-12)
    assert bench.share_needed(order, first, second, target - 1e-12) == want / 50
    assert bench.share_needed(order, first, second, 2.0) is None  # out of reach
    assert bench.share_needed(order, first, second, 0.0) == 0.0  # nothing to send


def test_no_order_beats_the_oracle_s(bench: ModuleType) -> None:
    """The oracle sends the largest gains first: at every share, no other order of the same
    queries reaches more."""
    rng = np.random.default_rng(0)
    n = 200
    first, second = rng.random(n), rng.random(n)
    student = [[(f"d{q}-{i}", float(s), "en" if i % 2 else "de")
                for i, s in enumerate(sorted(rng.random(12), reverse=True))] for q in range(n)]
    reranked = [list(reversed(h)) if q % 3 else h for q, h in enumerate(student)]
    gates = bench.orders(student, reranked, ["en"] * n, second - first, np.arange(n) % 2)
    assert set(gates) == {"oracle", "margin", "top score", "learned", "random"}
    for name, order in gates.items():
        assert sorted(order) == list(range(n)), name  # each sends every query once, in some order
    for share in (0.05, 0.2, 0.5, 0.8):
        best = bench.quality(gates["oracle"], first, second, share)
        for name, order in gates.items():
            assert bench.quality(order, first, second, share) <= best + 1e-12, (name, share)
        assert best > bench.quality(gates["random"], first, second, share)
    # the margin order is the shipped gate's margin, smallest first
    margins = [bench.margin(h[:10], "en") for h in student]
    assert np.all(np.diff(np.array(margins)[gates["margin"]]) >= 0)


def test_features_read_the_top_ten_as_the_shipped_gate_does(bench: ModuleType) -> None:
    from vecplug.adapters.rerank.gate import margin

    hits = [("a", 0.9, "de"), ("b", 0.8, "en"), ("c", 0.7, "de"), ("d", 0.6, "en"), ("e", 0.5, "fr")] + \
        [(f"x{i}", 0.4 - i / 100, "fr") for i in range(6)]  # 11: the 11th is not read
    f = dict(zip(bench.FEATURES, bench.features(hits, "en")))
    shipped = margin([SimpleNamespace(score=s, record=SimpleNamespace(lang=l)) for _, s, l in hits[:10]], "en")
    assert f["margin"] == pytest.approx(shipped) == pytest.approx(0.2)
    assert f["top score"] == 0.9 and f["top - 2nd"] == pytest.approx(0.1)
    assert f["top - 10th"] == pytest.approx(0.9 - 0.36)  # the 10th, not the 11th (0.35)
    assert f["languages in top 10"] == 3 and f["query-language hits in top 10"] == 2
    assert f["best in query language"] == 0.8 and f["its lead"] == pytest.approx(0.2)
    assert f["its lead on the 3rd"] == pytest.approx(0.8 - 0.36)  # no third: the list's floor
    assert bench.overlap(hits, list(reversed(hits))) == pytest.approx(0.9)


def test_the_learned_gate_never_sees_the_labels_of_the_queries_it_orders(bench: ModuleType) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=80)
    folds = np.arange(80) % 2
    pred = bench.cross_fitted(x, y, folds)
    assert np.corrcoef(pred, y)[0, 1] > 0.95  # it learns
    y2 = y.copy()
    y2[folds == 0] = rng.normal(size=40)  # other labels for fold 0
    pred2 = bench.cross_fitted(x, y2, folds)
    np.testing.assert_allclose(pred2[folds == 0], pred[folds == 0])  # fold 0 predicted from fold 1 only
    assert not np.allclose(pred2[folds == 1], pred[folds == 1])
    ids = ["ar:q1", "de:q1", "en:q1", "ar:q2", "en:q2", "zh:q3"]
    h = bench.halves(ids)
    assert h[0] == h[1] == h[2] and h[3] == h[4]  # a question's translations in one half


def test_the_cost_of_a_share(bench: ModuleType) -> None:
    t = {"student_ms": 4.0, "every_query_sent_ms": 12.0, "teacher_ms": 8.0}
    assert bench.cost(0.0, t) == 0.5 and bench.cost(0.25, t) == 0.75 and bench.cost(1.0, t) == 1.5
    assert bench.cost(None, t) is None and bench.cost(0.3, None) is None


@pytest.mark.slow
def test_a_run_on_xquad_r_with_a_tiny_student(bench: ModuleType, tiny_model: Path, tiny_student: Path,
                                              tmp_path: Path) -> None:
    """End to end (a tiny teacher and its untrained student: the mechanics, not the figures):
    every gate at every share between the student's quality and the oracle's, the whole share
    reaching the reranked quality, the shares needed rising with the target."""
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    import torch

    out = tmp_path / "gb.json"
    threads = torch.get_num_threads()
    assert bench.main(["--index", str(tmp_path / "index"), "--model", str(tiny_model), "--student",
                       str(tiny_student), "--reranker", "teacher", "--langs", "en", "de", "--limit", "40",
                       "--queries", "5", "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the timing's one thread not left behind
    r = json.loads(out.read_text(encoding="utf-8"))
    assert r["queries"] == 80 and r["documents"] > 1000
    m = r["map@20"]
    assert 0 <= m["student"] <= m["best of both"] <= 1 and m["reranked"] <= m["best of both"]
    for name, curve in r["curves"].items():
        for share, value in curve.items():
            assert value <= r["curves"]["oracle"][share] + 1e-12, name
    for need in r["needed"].values():
        shares = [s for s in need.values() if s is not None]
        assert shares == sorted(shares)
    t = r["timing"]
    assert t["queries"] == 5 and min(t["student_ms"], t["every_query_sent_ms"], t["teacher_ms"]) > 0
    text = bench.render(r)
    assert "| oracle " in text and "cost at 99%" in text and "the teacher alone" in text
