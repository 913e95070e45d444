"""A graph of language-centred vectors: the anchors it is centred by, and the way back.

The language-bias correction (``adapters/bias.py``) ranks by ``cos(q - m[lang(q)], d - m[lang(d)])``.
On a graph of the vectors as encoded that ranking is no nearest-neighbour ranking, so a
corrected search asks for every language separately, a cost that grows with the languages of
the index (68 ms at a million documents in 32 languages). A store built with a *centred graph*
keeps each document in its graph as ``c = (d - a) / |d - a|``, ``a`` its language's *anchor*
(about its language's mean): the corrected search is then one walk for the centred query, its
candidates rescored exactly with the index's current means: at a million Debian sentences in 32
languages 2.6 ms instead of 68, the same recall (``benchmarks/results/modes_scale_debian_centred.md``).

No second copy of the vectors is kept: a unit vector comes back exactly from its centred form
and its anchor (:func:`uncentre`). Anchors are the store's own, from the vectors it was given:
a language's is set at its first documents and re-set (its documents moved in the graph) each
time its count has grown :data:`REANCHOR_GROWTH` times, until :data:`ANCHOR_SETTLED` documents
vouch for it, so a corpus that arrives language by language still has each language centred by
about its mean (``tests/test_centring.py``). The query side uses the index's means of the moment, which the anchors need not
equal: the graph only chooses the candidates, rescored exactly with those means.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

UND = "und"
#: a language's anchor is re-set each time its count of documents added reaches this many times
#: the count it was set with ...
REANCHOR_GROWTH = 4
#: ... until it was set from at least this many (its mean then moves little: re-setting it moves
#: every document of the language in the graph, at most ~1.3x this many re-insertions a language)
ANCHOR_SETTLED = 1024
#: an anchor is its language's mean shrunk towards the mean of everything added, as if the
#: language had this many more documents: the mean of one document is that document
SHRINK = 16.0


#: a unit vector closer than this to the point it is centred by has no direction left (float32
#: rounding, ~1e-7, is all there is: a language of one document, or of one text repeated, is
#: its own mean): its centred form is zero, its centred cosine with anything 0. Re-normalised,
#: that rounding gave any direction, and a store's scan, which multiplies ``q.x - q.m`` by
#: ``1 / |x - m|``, scores of +-15,000
MIN_DISTANCE = 1e-4


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Rows of ``X`` as float32 unit vectors (a zero row stays zero)."""
    X = np.asarray(X, dtype=np.float32)
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def inverse_distances(X: np.ndarray, point: np.ndarray) -> np.ndarray:
    """``1 / |x - point|`` for each row ``x`` of ``X`` (float32), 0 for a row within
    :data:`MIN_DISTANCE` of it (as :func:`centre` gives it no direction): what centring by
    ``point`` re-normalises each row by."""
    X = np.asarray(X, dtype=np.float32)
    d = np.linalg.norm(X - point, axis=1)
    return np.where(d >= MIN_DISTANCE, 1.0 / np.maximum(d, MIN_DISTANCE), 0.0).astype(np.float32)


def centre(X: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Rows of ``X`` minus their anchors (row by row), re-normalised; zero for a row within
    :data:`MIN_DISTANCE` of its anchor."""
    Y = np.asarray(X, dtype=np.float32) - anchors
    n = np.linalg.norm(Y, axis=1, keepdims=True)
    return np.where(n >= MIN_DISTANCE, Y / np.maximum(n, MIN_DISTANCE), 0.0).astype(np.float32)


def uncentre(C: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """The unit vectors whose :func:`centre` by ``anchors`` are ``C``: ``d = n c + a``, ``n`` the
    positive root of ``|n c + a|^2 = 1`` (an anchor is a mean of unit vectors: ``|a| <= 1``)."""
    C = np.asarray(C, dtype=np.float64)
    A = np.asarray(anchors, dtype=np.float64)
    b = np.einsum("ij,ij->i", C, A)
    n = -b + np.sqrt(np.maximum(b * b + 1.0 - np.einsum("ij,ij->i", A, A), 0.0))
    return (n[:, None] * C + A).astype(np.float32)


@dataclass
class Anchors:
    """Per-language anchors of a centred graph, with the running sums they are set from."""

    dim: int
    anchors: dict[str, np.ndarray] = field(default_factory=dict)
    #: vectors added per language (re-added ones count again: the sums only steer the anchors)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    #: the count each anchor was set with
    anchored: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_meta(cls, raw: dict[str, Any] | None, dim: int) -> "Anchors":
        out = cls(dim)
        for lang, entry in (raw or {}).items():
            out.anchors[lang] = np.asarray(entry["anchor"], dtype=np.float32).reshape(dim)
            out.sums[lang] = np.asarray(entry["sum"], dtype=np.float64).reshape(dim)
            out.counts[lang] = int(entry["count"])
            out.anchored[lang] = int(entry["anchored"])
        return out

    def to_meta(self) -> dict[str, Any]:
        return {lang: {"anchor": self.anchors[lang].tolist(), "sum": self.sums[lang].tolist(),
                       "count": self.counts[lang], "anchored": self.anchored[lang]} for lang in sorted(self.anchors)}

    def add(self, langs: Sequence[str], X: np.ndarray) -> list[str]:
        """Count unit vectors ``X`` of ``langs`` in; the languages whose anchor must now be set
        (:meth:`reset`): new ones, and those grown :data:`REANCHOR_GROWTH` times since."""
        for lang in dict.fromkeys(langs):
            if lang not in self.sums:
                self.sums[lang] = np.zeros(self.dim, dtype=np.float64)
                self.counts[lang] = 0
        for lang, row in zip(langs, np.asarray(X, dtype=np.float64)):
            self.sums[lang] += row
            self.counts[lang] += 1
        return [lang for lang in dict.fromkeys(langs)
                if lang not in self.anchors or (self.anchored[lang] < ANCHOR_SETTLED
                                                and self.counts[lang] >= REANCHOR_GROWTH * self.anchored[lang])]

    def reset(self, lang: str) -> None:
        total = sum(self.counts.values())
        overall = sum(self.sums.values()) / max(total, 1)
        self.anchors[lang] = ((self.sums[lang] + SHRINK * overall) / (self.counts[lang] + SHRINK)).astype(np.float32)
        self.anchored[lang] = self.counts[lang]

    def rows(self, langs: Sequence[str]) -> np.ndarray:
        """Each language's anchor, row by row (zeros for one without: centring by it changes nothing)."""
        zero = np.zeros(self.dim, dtype=np.float32)
        if not len(langs):
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.anchors.get(lang, zero) for lang in langs])
