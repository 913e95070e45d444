"""BM25 and hard-negative mining."""
from __future__ import annotations

import math

import numpy as np
import pytest

from vecplug.errors import ConfigError
from vecplug.indexer.mining import BM25, MiningReport, mine_bm25, mine_with_model, tokenize
from vecplug.indexer.train_data import Example, normalise


def test_bm25_hand_computed() -> None:
    # N=3, lengths 2, 3, 1: avgdl 2; k1 1.5, b 0.75
    bm25 = BM25(["a b", "A a c", "d"])
    idf_a = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # a in 2 texts
    idf_c = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))  # c in 1 text
    norm0 = 1.5 * (1 - 0.75 + 0.75 * 2 / 2)
    norm1 = 1.5 * (1 - 0.75 + 0.75 * 3 / 2)
    doc0 = idf_a * 1 * 2.5 / (1 + norm0)
    doc1 = idf_a * 2 * 2.5 / (2 + norm1) + idf_c * 1 * 2.5 / (1 + norm1)
    assert doc0 == pytest.approx(0.4700036)  # ln 1.6: one match in an average-length text
    top = bm25.top("c a a", 5)  # a repeated query term counts once
    assert [i for i, _ in top] == [1, 0]  # text 2 shares no term: not returned
    assert [s for _, s in top] == pytest.approx([doc1, doc0], rel=1e-6)
    assert bm25.top("c a", 1) == [(1, pytest.approx(doc1, rel=1e-6))]
    assert bm25.top("zzz", 3) == []
    # k1 and b are settings: b=0 ignores length, so both single matches score the same
    flat = BM25(["a b", "a c c c"], b=0.0)
    (i0, s0), (i1, s1) = flat.top("a", 2)
    assert (i0, i1) == (0, 1) and s0 == pytest.approx(s1)


def test_bm25_scores_reset_between_queries() -> None:
    bm25 = BM25(["red apple", "green apple", "blue sky"])
    first = bm25.top("apple", 3)
    bm25.top("red green", 3)
    assert bm25.top("apple", 3) == first


def test_tokenize_cjk() -> None:
    assert tokenize("Hello, WORLD! Ça va?") == ["hello", "world", "ça", "va"]
    assert tokenize("東京都に住む") == ["東", "京", "都", "に", "住", "む",
                                  "東京", "京都", "都に", "に住", "住む"]
    assert tokenize("iPhone手机") == ["iphone", "手", "机", "手机"]
    assert tokenize("서울에 살아요") == ["서", "울", "에", "서울", "울에", "살", "아", "요", "살아", "아요"]
    bm25 = BM25(["我喜欢猫", "我喜欢狗", "the cat"])
    assert bm25.top("猫", 3)[0][0] == 0
    assert [i for i, _ in bm25.top("喜欢猫", 3)] == [0, 1]


# -- BM25 mining --------------------------------------------------------------------------------

def cat_examples() -> list[Example]:
    return [
        Example("what is a cat", ("a cat is an animal",)),
        Example("What is a  CAT", ("a cat is a small animal that purrs",)),  # same anchor
        Example("what is a dog", ("a dog is an animal that barks",)),
        Example("what is a car", ("a car is a machine",)),
        Example("how old is the sun", ("the sun is old",)),
    ]


def test_mine_bm25_never_a_positive_nor_the_anchor() -> None:
    examples = cat_examples()
    pool = [p for ex in examples for p in ex.positives] + ["What is a cat", "my cat sleeps all day"]
    bm25 = BM25(pool)
    ranked = [pool[i] for i, _ in bm25.top("what is a cat", 5)]
    # the anchor, the known positives (the other example's too) would be chosen without the check
    assert ranked[:4] == ["What is a cat", "a cat is an animal", "a cat is a small animal that purrs",
                          "a car is a machine"]
    report = mine_bm25(examples, pool=pool, per_example=2)
    assert isinstance(report, MiningReport)
    forbidden = {normalise(t) for t in ("what is a cat", "a cat is an animal", "a cat is a small animal that purrs")}
    for ex in report.examples[:2]:
        assert len(ex.negatives) == 2
        assert not {normalise(n) for n in ex.negatives} & forbidden
    assert report.examples[0].negatives == ("a car is a machine", "my cat sleeps all day")
    for ex in report.examples:
        assert not {normalise(n) for n in ex.negatives} & {normalise(ex.anchor), *map(normalise, ex.positives)}
        assert len(set(ex.negatives)) == len(ex.negatives)
    assert report.rejected_positives >= 4  # two known positives skipped for each cat example
    assert [ex.anchor for ex in report.examples] == [ex.anchor for ex in examples]
    assert examples[0].negatives == ()  # inputs untouched


def test_mine_bm25_per_example_short_and_skip_top() -> None:
    examples = cat_examples()
    report = mine_bm25(examples, per_example=1)
    assert all(len(ex.negatives) == 1 for ex in report.examples) and report.short == 0
    # "how old is the sun" shares only "is" with other positives; the default pool has 5 texts
    big = mine_bm25(examples, per_example=4)
    assert [len(ex.negatives) for ex in big.examples] == [3, 3, 4, 4, 4]
    assert big.short == 2  # the cat examples have two positives among the five texts
    base = mine_bm25(examples, per_example=2).examples[2].negatives
    skipped = mine_bm25(examples, per_example=1, skip_top=1).examples[2].negatives
    assert skipped == base[1:]


def test_mine_bm25_keeps_existing_negatives_and_labels() -> None:
    examples = [Example("what is a cat", ("a cat is an animal",), ("a car is a machine",)),
                Example("what is a car", ("a car is a machine",)),
                Example("what is a dog", ("a dog is an animal",)),
                Example("cat", ("dog",), label=0.0)]
    report = mine_bm25(examples, per_example=1)
    first = report.examples[0]
    assert first.negatives[0] == "a car is a machine" and first.negatives[1] != "a car is a machine"
    assert report.examples[3] is examples[3]  # labelled: unchanged


def test_mine_errors() -> None:
    with pytest.raises(ConfigError):
        mine_bm25(cat_examples(), per_example=0)
    with pytest.raises(ConfigError):
        mine_bm25(cat_examples(), skip_top=-1)


# -- model mining -------------------------------------------------------------------------------

def unit(cos: float, k: int) -> list[float]:
    """A unit vector at cosine ``cos`` from [1, 0, 0, ...], distinct per ``k``."""
    v = np.zeros(8)
    v[0], v[1 + k] = cos, math.sqrt(1 - cos * cos)
    return list(v)


VECTORS = {"q": unit(1.0, 0), "Q": unit(1.0, 0), "p": unit(0.8, 1), "near": unit(0.9, 2),
           "mid": unit(0.7, 3), "low": unit(0.5, 4), "far": unit(0.1, 5), "other-p": unit(0.95, 6)}


def embed(texts) -> np.ndarray:
    embed.calls.append(len(texts))
    return np.asarray([VECTORS[t] for t in texts], dtype=np.float32)


embed.calls = []


def test_mine_with_model_ranks_by_cosine() -> None:
    examples = [Example("q", ("p",)), Example("Q", ("other-p",))]  # same anchor after normalising
    pool = ["far", "p", "mid", "near", "low", "other-p", "q"]
    report = mine_with_model(examples, embed, pool=pool, per_example=2)
    # other-p (0.95), q (the anchor, 1.0) and p (0.8) are never negatives
    assert [ex.negatives for ex in report.examples] == [("near", "mid"), ("near", "mid")]
    assert report.short == 0 and report.rejected_positives == 4
    skip = mine_with_model(examples, embed, pool=pool, per_example=1, skip_top=1)
    assert skip.examples[0].negatives == ("mid",)
    # alone, "q" has no known positive "other-p": the best text that is not "p" or "q"
    alone = mine_with_model(examples[:1], embed, pool=pool, per_example=1)
    assert alone.examples[0].negatives == ("other-p",)


def test_mine_with_model_max_similarity() -> None:
    examples = [Example("q", ("p",))]
    pool = ["far", "near", "mid", "low"]
    # the positive's cosine is 0.8: with 0.95 anything above 0.76 is a likely positive
    report = mine_with_model(examples, embed, pool=pool, per_example=2, max_similarity=0.95)
    assert report.examples[0].negatives == ("mid", "low") and report.too_similar == 1
    plain = mine_with_model(examples, embed, pool=pool, per_example=2)
    assert plain.examples[0].negatives == ("near", "mid") and plain.too_similar == 0
    few = mine_with_model(examples, embed, pool=pool, per_example=4, max_similarity=0.95)
    assert few.examples[0].negatives == ("mid", "low", "far") and few.short == 1


def test_mine_with_model_chunked_and_large_pool() -> None:
    rng = np.random.default_rng(0)
    table = rng.normal(size=(600, 16)).astype(np.float32)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    texts = [f"t{i}" for i in range(600)]
    lookup = {t: table[i] for i, t in enumerate(texts)}

    def vec(batch):
        return np.stack([lookup[t] for t in batch])

    examples = [Example(texts[i], (texts[i + 300],)) for i in range(100)]
    one = mine_with_model(examples, vec, pool=texts, per_example=3, chunk_rows=7)
    big = mine_with_model(examples, vec, pool=texts, per_example=3)
    assert one.examples == big.examples
    # against a brute-force ranking
    sims = table[:100] @ table.T
    for i, ex in enumerate(big.examples):
        order = [texts[j] for j in np.argsort(-sims[i], kind="stable") if j not in (i, i + 300)]
        assert ex.negatives == tuple(order[:3])
