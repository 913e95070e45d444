"""Which examples share a batch, and in which order the tasks' batches are trained.

With in-batch negatives (every other example's positive is a negative), a batch's make-up
decides what the model can learn from it (LAReQA, Roy et al. 2020; Reimers & Gurevych 2020):

========  =================================================================================
xy        languages mixed within each batch: a shuffle over all examples. Pairs whose anchor
          and positive are in different languages teach cross-lingual alignment
mono      each batch holds one language pair only (key ``(anchor_lang, positive_lang)``): the
          in-batch negatives share the positive's language, so the language cannot give the
          answer away
xx        languages mixed, but each example's anchor and positive share a language: the
          language alone tells the positive apart from most negatives, and the model learns
          to match languages instead of meaning (the LAReQA "X-X" failure). Allowed, with a
          warning (when the data holds more than one language)
random    a plain shuffle
========  =================================================================================

``by_group`` draws each batch from one ``group`` (a subforum, a tag: harder negatives from
the same topic); examples without a group form their own pool. Under ``mono`` the pool is the
(group, language pair). ``easy_share`` makes that fraction of the batches plain random
batches (easy negatives), built from examples set aside before the hard batches are made,
and shuffled in among them.

Duplicates: two examples with the same anchor or positive text (after
:func:`~vecplug.indexer.train_data.normalise`) in one batch make false negatives, and so does
an example whose hard negative is the anchor or a positive of another (every row's negatives
are columns for every row; BM25 mining picks other examples' positives), as
sentence-transformers' ``NoDuplicatesBatchSampler`` counts negatives too. Two examples that
only share a negative do not clash. (The losses mask whatever is left.) A pool is cut into
``ceil(len / batch_size)`` batches, filled in order by one greedy first-fit pass: an
example sharing a text with the batch being filled goes to the next open batch without that
text (among the next 32; a new one is started while fewer than ``ceil(len / batch_size)``
exist), and only when none is free of it does it go in with its duplicate; then such an
example is swapped with one of another batch when neither then has a duplicate. Best effort:
cheap (a few set look-ups per example), and what is left is rare. A batch of one (no
in-batch negative) then joins another batch of its pool or takes an example from one, when
that brings no duplicate together (with ``batch_size`` < 3 a batch may so hold one example
more than asked); a pool of a single example stays a batch of one.

:func:`schedule` orders the batches of several tasks (datasets) within an epoch.
"""
from __future__ import annotations

import math
import random
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence

from vecplug.errors import ConfigError
from vecplug.indexer.train_data import Example, normalise

COMPOSITIONS = ("xy", "mono", "xx", "random")
SCHEDULES = ("sequential", "random", "proportional")


def _keys(example: Example) -> tuple[frozenset[str], frozenset[str]]:
    """``(marks, probes)``: two examples clash when one's probes meet the other's marks.

    Marks are the example's own texts (anchor, positives) as ``+text`` and its negatives as
    ``-text``; probes are its own texts as both and its negatives as ``+text``. So own meets
    own, own meets negative, negative meets own, and negative never meets negative: a plain
    set test against the union of a batch's marks, and it is symmetric.
    """
    own = {normalise(t) for t in (example.anchor, *example.positives)}
    negatives = {normalise(t) for t in example.negatives} - own
    marks = frozenset({"+" + t for t in own} | {"-" + t for t in negatives})
    probes = frozenset({"+" + t for t in own | negatives} | {"-" + t for t in own})
    return marks, probes


#: how many open batches an example may try before it goes in with a duplicate
_LOOKAHEAD = 32


Keys = Sequence[tuple[frozenset[str], frozenset[str]]]


def _fill(order: Sequence[int], size: int, keys: Keys) -> list[list[int]]:
    """Cut ``order`` into ``ceil(len / size)`` batches of at most ``size``, keeping examples
    that clash (see :func:`_keys`) apart where a cheap first-fit can (see the module
    docstring)."""
    most = math.ceil(len(order) / size)
    batches: list[list[int]] = []
    seen: list[set[str]] = []
    first = 0  # the first batch that is not full: batches fill in order
    for i in order:
        while first < len(batches) and len(batches[first]) >= size:
            first += 1
        target = None
        for b in range(first, min(len(batches), first + _LOOKAHEAD)):
            if len(batches[b]) < size and seen[b].isdisjoint(keys[i][1]):
                target = b
                break
        if target is None:
            if len(batches) < most:  # a fresh batch, filled early with the one put off
                batches.append([])
                seen.append(set())
                target = len(batches) - 1
            else:  # every open batch holds a duplicate: best effort ends here
                target = next(b for b in range(first, len(batches)) if len(batches[b]) < size)
        batches[target].append(i)
        seen[target] |= keys[i][0]
    _swap_duplicates(batches, keys)
    _no_single(batches, size, keys)
    return batches


def _swap_duplicates(batches: list[list[int]], keys: Keys) -> None:
    """Repair what the first-fit left (duplicates near the end of a pool): swap an example
    that has a duplicate in its batch with one of another batch (among the next
    :data:`_LOOKAHEAD`) when neither then has a duplicate. Costs nothing without duplicates."""
    counts = [Counter(k for i in b for k in keys[i][0]) for b in batches]

    def clashes(x: int, i: int) -> bool:  # i's own marks do not count against it
        marks, probes = keys[i]
        return any(counts[x][k] - (k in marks) > 0 for k in probes)

    def fits(x: int, i: int, out: int) -> bool:  # i would have no duplicate in x without out
        return all(counts[x][k] - (k in keys[out][0]) == 0 for k in keys[i][1])

    for x, batch in enumerate(batches):
        for pos in range(len(batch)):
            i = batch[pos]
            if not clashes(x, i):
                continue
            for step in range(1, min(len(batches), _LOOKAHEAD + 1)):
                y = (x + step) % len(batches)
                j_pos = next((q for q, j in enumerate(batches[y])
                              if fits(x, j, i) and fits(y, i, j)), None)
                if j_pos is not None:
                    j = batches[y][j_pos]
                    batch[pos], batches[y][j_pos] = j, i
                    counts[x].subtract(keys[i][0])
                    counts[x].update(keys[j][0])
                    counts[y].subtract(keys[j][0])
                    counts[y].update(keys[i][0])
                    break


def _no_single(batches: list[list[int]], size: int, keys: Keys) -> None:
    """Avoid batches of one (no in-batch negative): join one to another batch with room, or
    take over an example of a batch of three or more; for ``size`` < 3 join one to a full
    batch (one over ``size``). Only moves that bring no duplicate together."""
    def marks(batch: list[int]) -> set[str]:
        return set().union(*(keys[i][0] for i in batch))

    for single in [b for b in batches if len(b) == 1]:
        if len(single) != 1:
            continue  # got a partner meanwhile
        (i,) = single
        others = [b for b in batches if b is not single and b]
        room = next((b for b in others if len(b) < size and marks(b).isdisjoint(keys[i][1])), None)
        if room is None and size < 3:
            room = next((b for b in others if marks(b).isdisjoint(keys[i][1])), None)
        if room is not None:
            room.append(i)
            single.clear()
            continue
        for b in others:
            if len(b) >= 3:
                j = next((j for j in reversed(b) if keys[j][1].isdisjoint(keys[i][0])), None)
                if j is not None:
                    b.remove(j)
                    single.append(j)
                    break
    batches[:] = [b for b in batches if b]


def compose_batches(examples: Sequence[Example], batch_size: int, *, composition: str = "random",
                    easy_share: float = 0.0, by_group: bool = False, seed: int = 0, epoch: int = 0,
                    warn: Callable[[str], None] | None = None) -> list[list[int]]:
    """Batches of indices into ``examples`` for one epoch (see the module docstring).

    Every example appears exactly once. Deterministic given ``(seed, epoch)``; another epoch
    gives another order. ``warn`` (default :func:`warnings.warn`) receives the message about
    ``xx`` batches, and about ``mono`` when no example has a language.
    """
    if composition not in COMPOSITIONS:
        raise ConfigError(f"unknown batch composition {composition!r}; valid: {', '.join(COMPOSITIONS)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, not {batch_size!r}")
    if not 0.0 <= easy_share <= 1.0:
        raise ConfigError(f"easy_share must be in [0, 1], not {easy_share}")
    warn = warn or warnings.warn
    n = len(examples)
    if n == 0:
        return []
    langs = {lang for ex in examples for lang in (ex.anchor_lang, ex.positive_lang) if lang}
    if composition == "xx" and len(langs) > 1:
        warn("batch composition 'xx': each example's anchor and positive share a language while "
             "a batch mixes languages, so the language alone singles out the positive among the "
             "in-batch negatives and the model can learn to match languages instead of meaning; "
             "prefer 'mono' (one language per batch) or cross-lingual pairs with 'xy'")
    if composition == "xy" and len(langs) > 1:
        # xy's batches are xx's when the pairs are same-language: the same trap (LAReQA's X-X)
        same = sum(1 for ex in examples if ex.anchor_lang and ex.anchor_lang == ex.positive_lang)
        if same > n / 2:
            warn(f"batch composition 'xy': {same} of {n} examples pair texts of one language, in "
                 "batches that mix languages, so the language alone singles out most positives "
                 "(LAReQA's X-X setting); prefer 'mono' for same-language pairs")
    if composition == "mono" and not langs:
        warn("batch composition 'mono': no example has a language, so the batches are random")
    rng = random.Random(f"batches:{seed}:{epoch}")
    keys = [_keys(ex) for ex in examples]

    easy_batches = round(easy_share * math.ceil(n / batch_size))
    easy = set(rng.sample(range(n), min(n, easy_batches * batch_size))) if easy_batches else set()

    pools: dict[Hashable, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        if i in easy:
            continue
        key: tuple[Hashable, ...] = ()
        if by_group:
            key += (ex.group,)
        if composition == "mono":
            key += (ex.anchor_lang, ex.positive_lang)
        pools[key].append(i)

    batches: list[list[int]] = []
    # pools in first-seen order, each shuffled: the order depends on nothing but the seeds
    for pool in pools.values():
        rng.shuffle(pool)
        batches += _fill(pool, batch_size, keys)
    if easy:
        order = sorted(easy)
        rng.shuffle(order)
        batches += _fill(order, batch_size, keys)
    rng.shuffle(batches)  # interleaves pools, and the easy batches among the hard ones
    return batches


def schedule(batch_counts: Mapping[str, int], how: str, *, seed: int = 0,
             epoch: int = 0) -> list[tuple[str, int]]:
    """One epoch's order of ``(task name, batch number within the task)``.

    ``sequential``: all of the first task (mapping order), then the next... ``random``: at
    each step a task drawn uniformly among those with batches left. ``proportional``: at
    each step a task drawn with probability proportional to its batches left, i.e. a
    uniformly random order of all batches, so tasks interleave at rates proportional to their
    sizes throughout the epoch. Each task's batches come in order 0, 1, 2...
    """
    if how not in SCHEDULES:
        raise ConfigError(f"unknown task schedule {how!r}; valid: {', '.join(SCHEDULES)}")
    for name, count in batch_counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"task {name!r}: the batch count must be a non-negative integer, not {count!r}")
    rng = random.Random(f"schedule:{seed}:{epoch}")
    if how == "sequential":
        order = [name for name, count in batch_counts.items() for _ in range(count)]
    elif how == "proportional":
        order = [name for name, count in batch_counts.items() for _ in range(count)]
        rng.shuffle(order)
    else:
        left = {name: count for name, count in batch_counts.items() if count > 0}
        order = []
        while left:
            name = rng.choice(list(left))
            order.append(name)
            left[name] -= 1
            if not left[name]:
                del left[name]
    done: dict[str, int] = defaultdict(int)
    out = []
    for name in order:
        out.append((name, done[name]))
        done[name] += 1
    return out
