"""vecplug.metrics against cases computed by hand."""
from __future__ import annotations

import math
import random

import pytest

from vecplug import metrics as m


def test_average_precision_at_k_lareqa() -> None:
    # relevant at ranks 2 and 4: (1/2 + 2/4) / min(2, 20)
    assert m.average_precision_at_k(["a", "b", "c", "d"], {"b", "d"}, 20) == pytest.approx(0.5)
    # cut at k=2: only the hit at rank 2 counts, divided by min(3, 2) = 2
    assert m.average_precision_at_k(["x", "a", "b"], {"a", "b", "c"}, 2) == pytest.approx(0.25)
    # more relevant documents than k: the divisor is k, so a perfect top k scores 1
    assert m.average_precision_at_k(["a", "b", "x"], {"a", "b", "c"}, 2) == pytest.approx(1.0)
    # a relevant document never retrieved still counts in the divisor: (1/1) / 3
    assert m.average_precision_at_k(["a", "x"], {"a", "b", "c"}, 20) == pytest.approx(1 / 3)
    assert m.average_precision_at_k(["a"], set(), 20) == 0.0
    assert m.average_precision_at_k([], {"a"}, 20) == 0.0


def test_grades_of_zero_are_not_relevant_and_strings_are_refused() -> None:
    assert m.average_precision_at_k(["a", "b"], {"a": 0, "b": 2}, 20) == pytest.approx(0.5)
    assert m.relevant_ids({"a": 0, "b": 1, "c": -1}) == {"b"}
    with pytest.raises(TypeError):
        m.reciprocal_rank_at_k(["abc"], "abc", 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.ndcg_at_k(["a"], "a", 10)  # type: ignore[arg-type]


def _old_benchmark_ap(ranked: list[str], relevant: set[str], k: int) -> float:
    """benchmarks/xquad_r.py's average_precision_at_k before it moved into the package."""
    hits, total = 0, 0.0
    for rank, item in enumerate(ranked[:k], 1):
        if item in relevant:
            hits += 1
            total += hits / rank
    return total / min(len(relevant), k) if relevant else 0.0


def test_same_definition_as_the_benchmark_had() -> None:
    rng = random.Random(0)
    pool = [f"d{i}" for i in range(40)]
    for _ in range(200):
        ranked = rng.sample(pool, 25)
        relevant = set(rng.sample(pool, rng.randint(0, 8)))
        k = rng.choice([1, 5, 10, 20])
        assert m.average_precision_at_k(ranked, relevant, k) == pytest.approx(_old_benchmark_ap(ranked, relevant, k))


def test_uncut_average_precision() -> None:
    # relevant at ranks 2 and 4 of three relevant: (1/2 + 2/4) / 3
    assert m.average_precision(["x", "a", "y", "b"], {"a", "b", "c"}) == pytest.approx(1 / 3)


def test_ndcg_graded() -> None:
    grades = {"a": 3, "b": 2, "c": 1}
    # DCG = 2/log2(2) + 0 + 3/log2(4) = 3.5; ideal = 3 + 2/log2(3) + 1/2
    ideal = 3 + 2 / math.log2(3) + 0.5
    assert m.ndcg_at_k(["b", "x", "a"], grades, 3) == pytest.approx(3.5 / ideal)
    assert m.ndcg_at_k(["a", "b", "c"], grades, 3) == pytest.approx(1.0)
    # k=1: only the first rank, against the best single grade (3)
    assert m.ndcg_at_k(["b"], grades, 1) == pytest.approx(2 / 3)
    # a collection means grade 1 for each: one hit at rank 2 of one relevant
    assert m.ndcg_at_k(["x", "a"], {"a"}, 10) == pytest.approx(1 / math.log2(3))
    assert m.ndcg_at_k(["x"], {"a": 0}, 10) == 0.0


def test_reciprocal_rank_recall_precision() -> None:
    assert m.reciprocal_rank_at_k(["x", "y", "a"], {"a"}, 10) == pytest.approx(1 / 3)
    assert m.reciprocal_rank_at_k(["x", "y", "a"], {"a"}, 2) == 0.0
    assert m.reciprocal_rank_at_k(["x", "b", "a"], {"a", "b"}, 10) == pytest.approx(1 / 2)
    assert m.recall_at_k(["a", "x", "b"], {"a", "b", "c", "d"}, 2) == pytest.approx(1 / 4)
    assert m.recall_at_k(["a", "x", "b"], {"a", "b", "c", "d"}, 3) == pytest.approx(2 / 4)
    assert m.precision_at_1(["a", "x"], {"a"}) == 1.0
    assert m.precision_at_1(["x", "a"], {"a"}) == 0.0
    assert m.precision_at_1([], {"a"}) == 0.0


def test_a_repeated_id_counts_at_its_first_rank_only() -> None:
    """A ranking that repeats a relevant id (a third-party reranker's) scored AP 2.0 and nDCG
    above 1; a repeat is skipped without moving the ranks after it (ml_metrics' AP)."""
    assert m.average_precision_at_k(["a", "a", "b"], {"a": 1}, 20) == pytest.approx(1.0)
    assert m.average_precision(["a", "a", "b"], {"a"}) == pytest.approx(1.0)
    assert m.ndcg_at_k(["a", "a", "b"], {"a": 1}, 10) == pytest.approx(1.0)
    # b keeps its rank 3: (1/1 + 2/3) / 2
    assert m.average_precision_at_k(["a", "a", "b"], {"a", "b"}, 20) == pytest.approx((1 + 2 / 3) / 2)
    ideal = 1 + 1 / math.log2(3)
    assert m.ndcg_at_k(["a", "a", "b"], {"a", "b"}, 10) == pytest.approx((1 + 1 / math.log2(4)) / ideal)
    for metric in (m.average_precision_at_k, m.ndcg_at_k, m.reciprocal_rank_at_k, m.recall_at_k):
        for relevant in ({"a"}, set()):  # refused with nothing relevant too
            with pytest.raises(ValueError, match="k must be at least 1"):
                metric(["a"], relevant, 0)


def test_language_bias_measures() -> None:
    assert m.same_language_share(["de", "en", "de", "fr"], "de", 3) == pytest.approx(2 / 3)
    assert m.same_language_share(["de", "en"], "de", 10) == pytest.approx(1 / 2)  # of those returned
    assert m.same_language_share([], "de", 10) == 0.0
    # XQuAD-R with four pooled languages: one relevant sentence per language
    assert m.expected_same_language_share(["en", "de", "fr", "ru"], "de") == pytest.approx(0.25)
    assert m.expected_same_language_share([], "de") == 0.0
    assert m.relevant_score_gap([0.9], [0.5, 0.7]) == pytest.approx(0.3)
    assert m.relevant_score_gap([0.8, 0.6], [0.7]) == pytest.approx(0.0)
    assert m.relevant_score_gap([], [0.5]) is None
    assert m.relevant_score_gap([0.5], []) is None


def test_mean_skips_missing() -> None:
    assert m.mean([1.0, None, float("nan"), 3.0]) == pytest.approx(2.0)
    assert m.mean([]) is None and m.mean([None]) is None
