"""The encoder's batch plan: every text once, within the budget, and the least costly cuts."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from vecplug.indexer.length_batches import plan


def _cost(batches: list[list[int]], lengths: list[int], hidden: int, overhead: int) -> float:
    return sum(len(b) * lengths[b[0]] * (1 + lengths[b[0]] / (6 * hidden)) + overhead for b in batches)


def _padded(batches: list[list[int]], lengths: list[int]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


@pytest.mark.parametrize("seed", range(5))
def test_every_text_once_longest_first_within_the_budget(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([3, 9, 20, 40, 80, 250, 600]) + rng.randrange(5) for _ in range(500)]
    batches = plan(lengths, batch_tokens=1000, max_rows=16, hidden=64, overhead=50)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)
    for b in batches:
        longest = lengths[b[0]]
        assert longest == max(lengths[i] for i in b)
        assert len(b) <= 16
        assert len(b) * longest <= 1000 or len(b) == 1  # a text over the budget goes alone


def test_the_cuts_are_the_cheapest_of_all_contiguous_cuts() -> None:
    """Against brute force: every way to cut the sorted lengths into batches."""
    rng = random.Random(1)
    for _ in range(40):
        n = rng.randrange(1, 8)
        lengths = [rng.randrange(1, 60) for _ in range(n)]
        hidden, overhead, budget, rows = 16, rng.choice([0, 10, 100]), 150, 4
        got = _cost(plan(lengths, budget, rows, hidden, overhead), lengths, hidden, overhead)
        order = sorted(range(n), key=lambda i: lengths[i], reverse=True)
        best = np.inf
        for cuts in itertools.product([False, True], repeat=n - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
            batches = [order[a:b] for a, b in zip(bounds, bounds[1:])]
            if all(len(b) <= rows and (len(b) * lengths[b[0]] <= budget or len(b) == 1) for b in batches):
                best = min(best, _cost(batches, lengths, hidden, overhead))
        assert got == pytest.approx(best), lengths


def test_a_small_call_pads_less_than_filling_each_batch() -> None:
    """256 texts of spread lengths: filled batches of 128 span half the lengths each."""
    rng = random.Random(0)
    lengths = [int(rng.lognormvariate(3.3, 0.6)) + 4 for _ in range(256)]
    order = sorted(range(256), key=lambda i: lengths[i], reverse=True)
    filled = [order[:128], order[128:]]
    planned = plan(lengths, 8192, 128)
    assert _padded(planned, lengths) < 0.85 * _padded(filled, lengths)
    assert len(planned) < 20  # and not a forward pass per text


def test_equal_lengths_fill_whole_batches() -> None:
    batches = plan([10] * 300, 8192, 128)
    assert len(batches) == 3 and sorted(map(len, batches)) == [44, 128, 128]
    assert plan([], 8192, 128) == []


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_encoder_plans_with_its_precisions_overhead(tiny_model, precision: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.indexer import length_batches
    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import resolve_model

    seen: list[int] = []
    original = length_batches.plan

    def spy(lengths, batch_tokens, max_rows, hidden, overhead):  # type: ignore[no-untyped-def]
        seen.append(overhead)
        return original(lengths, batch_tokens, max_rows, hidden, overhead)

    monkeypatch.setattr(length_batches, "plan", spy)
    enc = TextEncoder(resolve_model(str(tiny_model)), precision=precision, trace=False)
    vectors = enc.encode(["one", "two words", "three words here"] * 5)
    assert vectors.shape == (15, enc.dim)
    assert seen == [length_batches.FORWARD_OVERHEAD[precision]]
