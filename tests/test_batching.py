"""Batch composition and task scheduling."""
from __future__ import annotations

import warnings
from collections import Counter

import pytest

from vecplug.errors import ConfigError
from vecplug.indexer.batching import COMPOSITIONS, SCHEDULES, compose_batches, schedule
from vecplug.indexer.train_data import Example, normalise


def multilingual(n_per: int = 60, pairs: tuple[tuple[str, str], ...] = (("en", "de"), ("en", "fr"), ("es", "es")),
                 group: bool = False) -> list[Example]:
    return [Example(f"q {a}-{b} {i}", (f"p {a}-{b} {i}",), anchor_lang=a, positive_lang=b,
                    group=(f"g{i % 3}" if i % 4 else None) if group else None)
            for a, b in pairs for i in range(n_per)]


def lang_pairs(examples: list[Example], batch: list[int]) -> set[tuple]:
    return {(examples[i].anchor_lang, examples[i].positive_lang) for i in batch}


def assert_partition(batches: list[list[int]], n: int) -> None:
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))


def test_names() -> None:
    assert COMPOSITIONS == ("xy", "mono", "xx", "random")
    assert SCHEDULES == ("sequential", "random", "proportional")


@pytest.mark.parametrize("composition", ["xy", "mono", "xx", "random"])
def test_every_index_once(composition: str) -> None:
    examples = multilingual(61)
    batches = compose_batches(examples, 16, composition=composition, warn=lambda m: None)
    assert_partition(batches, len(examples))
    assert all(2 <= len(b) <= 16 for b in batches)


def test_mono_batches_hold_one_language_pair() -> None:
    examples = multilingual(61)
    batches = compose_batches(examples, 16, composition="mono", seed=1)
    assert all(len(lang_pairs(examples, b)) == 1 for b in batches)
    # the pools are interleaved, not one language after the other
    firsts = [next(iter(lang_pairs(examples, b))) for b in batches[:6]]
    assert len(set(firsts)) > 1


def test_xy_batches_mix_languages() -> None:
    examples = multilingual(60)
    batches = compose_batches(examples, 16, composition="xy", seed=0)
    mixed = sum(len(lang_pairs(examples, b)) > 1 for b in batches)
    assert mixed >= len(batches) - 1


def test_xx_warns_and_proceeds() -> None:
    examples = multilingual(20, pairs=(("de", "de"), ("fr", "fr")))
    messages: list[str] = []
    batches = compose_batches(examples, 8, composition="xx", warn=messages.append)
    assert len(messages) == 1 and "language alone" in messages[0]
    assert_partition(batches, len(examples))
    with pytest.warns(UserWarning, match="language alone"):
        compose_batches(examples, 8, composition="xx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one language: nothing to give away
        compose_batches(multilingual(20, pairs=(("de", "de"),)), 8, composition="xx")


def test_xy_on_same_language_pairs_warns_as_xx_does() -> None:
    """xy batches of same-language pairs are xx's batches: the same trap, said."""
    examples = multilingual(20, pairs=(("de", "de"), ("fr", "fr")))
    messages: list[str] = []
    compose_batches(examples, 8, composition="xy", warn=messages.append)
    assert len(messages) == 1 and "40 of 40 examples pair texts of one language" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cross-lingual pairs (the default mix: 1 in 3 same-language)
        compose_batches(multilingual(20), 8, composition="xy")


def test_by_group() -> None:
    examples = multilingual(60, group=True)
    batches = compose_batches(examples, 8, by_group=True, seed=2)
    assert_partition(batches, len(examples))
    assert all(len({examples[i].group for i in b}) == 1 for b in batches)
    assert {examples[b[0]].group for b in batches} == {"g0", "g1", "g2", None}
    mono = compose_batches(examples, 8, composition="mono", by_group=True, seed=2)
    assert all(len({(examples[i].group, examples[i].anchor_lang, examples[i].positive_lang) for i in b}) == 1
               for b in mono)


def test_easy_share() -> None:
    examples = multilingual(500, pairs=(("en", "de"), ("en", "fr")))  # 1000 examples
    batches = compose_batches(examples, 10, composition="mono", easy_share=0.1, seed=3)
    assert_partition(batches, 1000)
    easy = [k for k, b in enumerate(batches) if len(lang_pairs(examples, b)) > 1]
    # 10 of ~100 batches are random: mixing the two language pairs (all but ~0.2% of the time)
    assert 9 <= len(easy) <= 10
    assert min(easy) < len(batches) * 0.6 and max(easy) > len(batches) * 0.4  # interleaved
    none = compose_batches(examples, 10, composition="mono", easy_share=0.0, seed=3)
    assert all(len(lang_pairs(examples, b)) == 1 for b in none)


def test_deterministic_and_epochs_differ() -> None:
    examples = multilingual(40)
    a = compose_batches(examples, 8, composition="mono", seed=4, epoch=0)
    assert a == compose_batches(examples, 8, composition="mono", seed=4, epoch=0)
    assert a != compose_batches(examples, 8, composition="mono", seed=4, epoch=1)
    assert a != compose_batches(examples, 8, composition="mono", seed=5, epoch=0)


def test_duplicates_avoided() -> None:
    # 10 anchors each with 4 positives (a query with several answers), plus 10 examples whose
    # positive text is shared: with batches of 5, a careless shuffle puts copies together
    examples = [Example(f"Query {i}", (f"answer {i}.{j}",)) for i in range(10) for j in range(4)]
    examples += [Example(f"other {i}", ("The  SAME answer",)) for i in range(10)]
    for seed in range(5):
        batches = compose_batches(examples, 5, seed=seed)
        assert_partition(batches, len(examples))
        clashes = 0
        for b in batches:
            anchors = Counter(examples[i].anchor for i in b)
            same = sum(examples[i].positives == ("The  SAME answer",) for i in b)
            clashes += sum(c - 1 for c in anchors.values()) + max(0, same - 1)
        # 50 examples in 10 batches of 5 with 10 copies of one positive: one layout in very
        # few is free of duplicates (a plain shuffle averages ~8 clashes), the repair finds it
        assert clashes == 0, (seed, batches)


def test_a_negative_is_kept_apart_from_the_example_whose_text_it_is() -> None:
    # mined negatives are other examples' positives (here: each one's is the next one's, in
    # another case and spacing): every row's negatives are columns for every row, so such
    # examples in one batch make false negatives. A careless shuffle puts ~7 such pairs together
    n = 40
    examples = [Example(f"q{i}", (f"answer {i}",), (f"ANSWER  {(i + 1) % n}",)) for i in range(n)]
    for seed in range(5):
        batches = compose_batches(examples, 8, seed=seed)
        assert_partition(batches, n)
        for b in batches:
            positives = {normalise(examples[i].positives[0]) for i in b}
            assert not any(normalise(examples[i].negatives[0]) in positives for i in b), (seed, b)


def test_no_batch_of_one() -> None:
    examples = [Example(f"a{i}", (f"p{i}",)) for i in range(17)]
    for size, seed in ((8, 0), (4, 1), (2, 2)):
        batches = compose_batches(examples, size, seed=seed)
        assert_partition(batches, 17)
        assert min(map(len, batches)) >= 2
        assert max(map(len, batches)) <= max(size, 3)


def test_errors() -> None:
    examples = multilingual(2)
    with pytest.raises(ConfigError, match="valid: xy, mono, xx, random"):
        compose_batches(examples, 4, composition="lingual")
    with pytest.raises(ConfigError):
        compose_batches(examples, 0)
    with pytest.raises(ConfigError):
        compose_batches(examples, 4, easy_share=1.5)
    assert compose_batches([], 4) == []


# -- schedules ----------------------------------------------------------------------------------

def test_schedule_sequential() -> None:
    assert schedule({"a": 2, "b": 3, "c": 0}, "sequential") == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]


def test_schedule_random_skips_exhausted() -> None:
    order = schedule({"big": 50, "small": 2}, "random", seed=1)
    assert Counter(name for name, _ in order) == {"big": 50, "small": 2}
    assert [k for name, k in order if name == "small"] == [0, 1]
    # uniform over tasks left: "small" is drawn about every other step until it runs out
    assert max(i for i, (name, _) in enumerate(order) if name == "small") < 15


def test_schedule_proportional() -> None:
    order = schedule({"a": 300, "b": 100}, "proportional", seed=0)
    assert Counter(name for name, _ in order) == {"a": 300, "b": 100}
    assert [k for name, k in order if name == "b"] == list(range(100))
    for start in (0, 200, 360):  # the rates hold all through the epoch
        window = Counter(name for name, _ in order[start:start + 40])
        assert 22 <= window["a"] <= 38 and window["a"] + window["b"] == 40
    assert order == schedule({"a": 300, "b": 100}, "proportional", seed=0)
    assert order != schedule({"a": 300, "b": 100}, "proportional", seed=0, epoch=1)


def test_schedule_errors() -> None:
    with pytest.raises(ConfigError, match="valid: sequential, random, proportional"):
        schedule({"a": 1}, "round-robin")
    with pytest.raises(ConfigError):
        schedule({"a": -1}, "random")
