"""Hard negatives: texts that look relevant to an anchor but are not its positives.

Two miners rank a pool of texts (default: every positive of every example) for each
example's anchor and add the best-ranked acceptable ones as negatives:
:func:`mine_bm25` by lexical overlap (:class:`BM25`), :func:`mine_with_model` by the cosine
of an embedding model's vectors.

A candidate is never a known positive: no text equal (after
:func:`~vecplug.indexer.train_data.normalise`) to a positive of ANY example with the same
anchor (a query with several relevant answers spread over several pairs), nor the anchor
itself, nor one of the example's negatives. Examples with a label (the "labelled" format, for
scoring losses) are returned unchanged, and the positives of pairs labelled 0 or less do not
count as known positives. After those, the first ``skip_top`` acceptable candidates are
skipped too (top-ranked texts are often unlabelled positives), then ``per_example`` are taken.

Both return a :class:`MiningReport`: the new examples (in the input order) and counts.
"""
from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from vecplug.errors import ConfigError
from vecplug.indexer.checkpoint import numpy_seed
from vecplug.indexer.train_data import Example, normalise

# Han (with extensions and compatibility ideographs), kana, Hangul: scripts written without
# spaces between words (Korean has spaces, but particles stick to words) are cut into
# character unigrams and bigrams, as Lucene's CJK analyzer does
_CJK = ("\u2e80-\u2fdf\u3005\u3040-\u30ff\u3100-\u312f\u31a0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
        "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f")
_WORD = re.compile(r"\w+")
_CJK_RUN = re.compile(f"[{_CJK}]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased ``\\w+`` words; runs of CJK characters inside them become character
    unigrams and bigrams (``東京都`` -> 東 京 都 東京 京都)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        start = 0
        for m in _CJK_RUN.finditer(word):
            if m.start() > start:
                out.append(word[start:m.start()])
            run = m.group()
            out += list(run)
            out += [run[i:i + 2] for i in range(len(run) - 1)]
            start = m.end()
        if start < len(word):
            out.append(word[start:])
    return out


class BM25:
    """Okapi BM25 over ``texts`` (pure Python and numpy).

    score(D, Q) = sum over the distinct terms q of Q of
    IDF(q) * f(q, D) * (k1 + 1) / (f(q, D) + k1 * (1 - b + b * |D| / avgdl)),
    IDF(q) = ln(1 + (N - n(q) + 0.5) / (n(q) + 0.5)) (Lucene's, never negative), with f the
    term's count in D, |D| its token count, avgdl the mean over the N texts and n(q) the
    number of texts holding q. The per-term weights are computed once, so a query costs its
    terms' posting lists.
    """

    def __init__(self, texts: Sequence[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.size = len(texts)
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lengths = np.zeros(self.size, dtype=np.float64)
        for d, text in enumerate(texts):
            counts = Counter(tokenize(text))
            lengths[d] = sum(counts.values())
            for term, tf in counts.items():
                postings[term].append((d, tf))
        avgdl = float(lengths.mean()) if self.size and lengths.mean() > 0 else 1.0
        norm = k1 * (1.0 - b + b * lengths / avgdl)
        self._ids: dict[str, np.ndarray] = {}
        self._weights: dict[str, np.ndarray] = {}
        for term, plist in postings.items():
            ids = np.fromiter((d for d, _ in plist), dtype=np.int64, count=len(plist))
            tf = np.fromiter((t for _, t in plist), dtype=np.float64, count=len(plist))
            idf = math.log(1.0 + (self.size - len(plist) + 0.5) / (len(plist) + 0.5))
            self._ids[term] = ids
            self._weights[term] = (idf * tf * (k1 + 1.0) / (tf + norm[ids])).astype(np.float32)
        self._scores = np.zeros(self.size, dtype=np.float32)

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, scores)`` of the texts sharing a term with ``query`` (unordered)."""
        terms = [t for t in dict.fromkeys(tokenize(query)) if t in self._ids]
        if not terms:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        buf = self._scores
        for t in terms:  # ids are distinct within a term, so += is exact
            buf[self._ids[t]] += self._weights[t]
        touched = np.unique(np.concatenate([self._ids[t] for t in terms]))
        values = buf[touched].copy()
        buf[touched] = 0.0  # reset only what was touched: a query never costs O(N) zeroing
        return touched, values

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best texts for ``query`` as ``(index, score)``, best first (ties: lower
        index first); only texts sharing a term with the query."""
        ids, values = self.scores(query)
        order = _best(ids, values, k, ids)
        return [(int(ids[i]), float(values[i])) for i in order]


def _best(ids: np.ndarray, values: np.ndarray, k: int, tie: np.ndarray) -> np.ndarray:
    """Positions of the ``k`` highest ``values``, best first, ties broken by ``tie``."""
    if k <= 0 or not len(ids):
        return np.zeros(0, dtype=np.int64)
    if k < len(values):
        # a partition keeps every value tied with the k-th, so the tie rule decides among them
        cut = np.partition(values, len(values) - k)[len(values) - k]
        keep = np.flatnonzero(values >= cut)
    else:
        keep = np.arange(len(values))
    order = keep[np.lexsort((tie[keep], -values[keep]))]
    return order[:k]


@dataclass
class MiningReport:
    """What a miner returns.

    ``examples``: the input examples, in order, with the mined negatives appended (new
    objects). ``short``: examples (without a label) that got fewer new negatives than asked.
    ``rejected_positives``: candidates dropped because they are a known positive of the
    anchor (the example's own positive usually ranks first, so expect about one per example
    when the pool holds the positives). ``too_similar``: candidates dropped by
    ``max_similarity`` (model mining only).
    """

    examples: list[Example]
    short: int
    rejected_positives: int
    too_similar: int = 0


def _check(per_example: int, skip_top: int) -> None:
    if per_example < 1:
        raise ConfigError(f"per_example must be at least 1, not {per_example}")
    if skip_top < 0:
        raise ConfigError(f"skip_top must be 0 or more, not {skip_top}")


def _known_positives(examples: Sequence[Example]) -> dict[str, set[str]]:
    known: dict[str, set[str]] = defaultdict(set)
    for ex in examples:
        if ex.label is None or ex.label > 0:
            known[normalise(ex.anchor)].update(normalise(p) for p in ex.positives)
    return known


def _default_pool(examples: Sequence[Example], pool: Sequence[str] | None) -> list[str]:
    texts = pool if pool is not None else [p for ex in examples for p in ex.positives]
    # one text per normalised form: a duplicate would only be rejected later
    seen: set[str] = set()
    out = []
    for t in texts:
        key = normalise(t)
        if key and key not in seen:
            seen.add(key)
            out.append(t)
    return out


class _Picker:
    """Walks one example's ranked candidates and keeps the acceptable ones."""

    def __init__(self, ex: Example, known: dict[str, set[str]], per_example: int, skip_top: int,
                 cap: float | None = None, extra: int = 0) -> None:
        anchor = normalise(ex.anchor)
        self.positives = known.get(anchor, set()) | {normalise(p) for p in ex.positives}
        self.other = {anchor} | {normalise(n) for n in ex.negatives}
        self.need, self.skip, self.cap, self.extra = per_example, skip_top, cap, extra
        self.chosen: list[str] = []
        self.rejected = self.too_similar = 0

    def budget(self) -> int:
        """How many top candidates are likely to be enough."""
        return self.need + len(self.positives) + len(self.other) + self.skip + self.extra + 8

    def offer(self, text: str, score: float) -> bool:
        """Consider one candidate; True when enough were chosen."""
        key = normalise(text)
        if key in self.positives:
            self.rejected += 1
        elif key in self.other:
            pass
        elif self.cap is not None and score > self.cap:
            self.too_similar += 1
            self.other.add(key)
        else:
            self.other.add(key)
            if self.skip:
                self.skip -= 1
            else:
                self.chosen.append(text)
        return len(self.chosen) >= self.need


def _pick(ex: Example, texts: Sequence[str], ids: np.ndarray, values: np.ndarray, tie: np.ndarray,
          make: Callable[[], _Picker]) -> _Picker:
    """Walk the best candidates (``ids`` with ``values``); when the first ``budget`` are not
    enough, walk them all again in full order (rare: costs a sort of every candidate)."""
    picker = make()
    k = min(len(ids), picker.budget())
    for full in (False, True):
        if full:
            if len(picker.chosen) >= picker.need or k >= len(ids):
                break
            picker = make()
        for pos in _best(ids, values, len(ids) if full else k, tie):
            if picker.offer(texts[int(ids[pos])], float(values[pos])):
                break
    return picker


def mine_bm25(examples: Sequence[Example], *, pool: Sequence[str] | None = None,
              per_example: int = 1, skip_top: int = 0, seed: int = 0) -> MiningReport:
    """Add up to ``per_example`` BM25 hard negatives to each example (see the module
    docstring). The anchor is the query; ``seed`` breaks ties between equal scores (so equal
    texts early in the pool are not always preferred). Pool texts sharing no word with the
    anchor are never chosen: such examples may come out short."""
    _check(per_example, skip_top)
    texts = _default_pool(examples, pool)
    bm25 = BM25(texts)
    tie = np.random.default_rng(numpy_seed(seed)).permutation(len(texts))
    known = _known_positives(examples)
    out: list[Example] = []
    short = rejected = 0
    for ex in examples:
        if ex.label is not None:
            out.append(ex)
            continue
        ids, values = bm25.scores(ex.anchor)
        picker = _pick(ex, texts, ids, values, tie[ids],
                       lambda: _Picker(ex, known, per_example, skip_top))
        rejected += picker.rejected
        short += len(picker.chosen) < per_example
        out.append(replace(ex, negatives=ex.negatives + tuple(picker.chosen)))
    return MiningReport(out, short, rejected)


def _embed(embed: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str], what: str) -> np.ndarray:
    vectors = np.asarray(embed(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ConfigError(f"embed returned shape {vectors.shape} for {len(texts)} {what}")
    return vectors


def mine_with_model(examples: Sequence[Example], embed: Callable[[Sequence[str]], np.ndarray], *,
                    pool: Sequence[str] | None = None, per_example: int = 1, skip_top: int = 0,
                    max_similarity: float | None = None, chunk_rows: int | None = None,
                    embed_anchors: Callable[[Sequence[str]], np.ndarray] | None = None) -> MiningReport:
    """Add up to ``per_example`` negatives to each example, ranking the pool by the cosine of
    ``embed``'s vectors (L2-normalised float32 rows) to the anchor's. ``embed_anchors`` embeds
    the anchors (default: ``embed``): with E5-style models, anchors are queries and take
    another prefix than the pool's documents, as in training.

    ``max_similarity`` (e.g. 0.95, NV-Retriever's "TopK-PercPos", Moreira et al. 2024) also
    drops candidates whose cosine to the anchor exceeds the cosine of the example's own
    positive (``positives[0]``) times that factor: texts the model finds about as close as
    the positive are likely unlabelled positives. They are dropped before ``skip_top`` counts.
    ``embed`` is called once for the pool, then per block of anchors (and their positives,
    with ``max_similarity``); the similarity matrix is computed a block at a time
    (``chunk_rows`` anchors, by default what keeps a block near 32 MB), so memory stays
    bounded for pools of 100k texts beside the pool's own vectors.
    """
    _check(per_example, skip_top)
    texts = _default_pool(examples, pool)
    known = _known_positives(examples)
    todo = [i for i, ex in enumerate(examples) if ex.label is None]
    out = list(examples)
    if not texts or not todo:
        return MiningReport(out, len(todo), 0)
    pool_vectors = _embed(embed, texts, "pool texts")
    rows = chunk_rows or max(1, min(4096, (8 << 20) // len(texts)))
    all_ids = np.arange(len(texts))
    short = rejected = similar = 0
    for start in range(0, len(todo), rows):
        block = todo[start:start + rows]
        batch = [examples[i] for i in block]
        anchors = _embed(embed_anchors or embed, [ex.anchor for ex in batch], "anchors")
        sims = anchors @ pool_vectors.T
        caps: list[float | None] = [None] * len(batch)
        if max_similarity is not None:
            positives = _embed(embed, [ex.positives[0] if ex.positives else ex.anchor for ex in batch],
                               "positives")
            caps = (np.einsum("ij,ij->i", anchors, positives) * max_similarity).tolist()
        for row, i, ex, cap in zip(sims, block, batch, caps):
            above = int((row > cap).sum()) if cap is not None else 0  # all dropped: walk past them
            picker = _pick(ex, texts, all_ids, row, all_ids,
                           lambda: _Picker(ex, known, per_example, skip_top, cap, above))
            rejected += picker.rejected
            similar += picker.too_similar
            short += len(picker.chosen) < per_example
            out[i] = replace(ex, negatives=ex.negatives + tuple(picker.chosen))
    return MiningReport(out, short, rejected, similar)
