"""Held-out evaluation during training.

For each task, on the examples kept out of training:

* bi-encoder, pairs: each anchor ranks every held-out positive; accuracy@1 and MRR@10 of its
  own, the anchor's other positives left out of its ranking (an English sentence with
  several translations: another of them ranking first is no miss), and Wang & Isola's
  alignment (mean squared distance of positive pairs; lower is better) and uniformity (log
  of the mean Gaussian potential between all vectors; lower is better);
* bi-encoder, labelled pairs: mean cosine of the pairs labelled relevant minus that of the
  others (the wider the gap, the better the labels are separated);
* cross-encoder: each anchor's positive among up to 9 other held-out positives (none of
  them a positive of the same anchor), MRR@10; on labelled pairs, the gap of its scores as for
  a bi-encoder's cosines.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from vecplug.indexer.train_data import normalise


#: the rank of a positive whose score is not a number: past any cut-off
UNRANKED = 1 << 30


def _mrr(rank_of_own: np.ndarray, k: int = 10) -> float:
    return float(np.mean(np.where(rank_of_own < k, 1.0 / (rank_of_own + 1), 0.0)))


def _relevant(held: Sequence[Any]) -> list[set[str]]:
    """Per held-out example: every positive (normalised) of any example with its anchor."""
    by_anchor: dict[str, set[str]] = defaultdict(set)
    for e in held:
        by_anchor[normalise(e.anchor)].update(normalise(p) for p in e.positives)
    return [by_anchor[normalise(e.anchor)] for e in held]


def _bi_pairs(model: Any, task: Any) -> dict[str, float]:
    from vecplug.indexer.losses import alignment, uniformity

    held = task.held_out
    c = task.config
    anchors = model.embed_all([e.anchor for e in held], model.prefix(c.anchor_prefix))
    texts = sorted({e.positives[0] for e in held})
    where = {t: i for i, t in enumerate(texts)}
    docs = model.embed_all(texts, model.prefix(c.other_prefix))
    own = np.array([where[e.positives[0]] for e in held])
    scores = anchors @ docs.T
    own_scores = scores[np.arange(len(held)), own].copy()
    # the anchor's other positives are not competitors of its own
    doc_of: dict[str, list[int]] = defaultdict(list)
    for j, text in enumerate(texts):
        doc_of[normalise(text)].append(j)
    for r, relevant in enumerate(_relevant(held)):
        for key in relevant:
            for j in doc_of.get(key, ()):
                if j != own[r]:
                    scores[r, j] = -np.inf
    # rank of the own positive: how many other texts score as high or higher (a tie counts
    # against the model: a collapsed one, all vectors equal, would otherwise rank first)
    rank = (scores >= own_scores[:, None]).sum(1) - 1
    rank[~np.isfinite(own_scores)] = UNRANKED  # a NaN (a diverged model) finds nothing
    import torch

    a, p = torch.from_numpy(anchors), torch.from_numpy(docs[own])
    return {"examples": len(held), "accuracy@1": float(np.mean(rank == 0)), "mrr@10": _mrr(rank),
            "alignment": float(alignment(a, p)), "uniformity": float(uniformity(torch.cat([a, p])))}


def _bi_labelled(model: Any, task: Any) -> dict[str, float]:
    held = task.held_out
    c = task.config
    a = model.embed_all([e.anchor for e in held], model.prefix(c.anchor_prefix))
    b = model.embed_all([e.positives[0] for e in held], model.prefix(c.other_prefix))
    return _score_gap((a * b).sum(1), held)


def _cross_labelled(model: Any, task: Any) -> dict[str, float]:
    """A cross-encoder on labelled pairs: the gap of its scores (logits), as for a bi-encoder's
    cosines (the held-out pairs were set aside and never scored)."""
    held = task.held_out
    return _score_gap(np.asarray(model.score_all([(e.anchor, e.positives[0]) for e in held])), held)


def _score_gap(scores: np.ndarray, held: Sequence[Any]) -> dict[str, float]:
    """Mean score of the pairs with the top label minus that of the others."""
    labels = np.array([float(e.label) for e in held])
    top = labels >= labels.max() if len(labels) else labels
    if top.all() or not top.any():
        return {"examples": len(held)}
    return {"examples": len(held), "score_gap": float(scores[top].mean() - scores[~top].mean())}


def _cross(model: Any, task: Any) -> dict[str, float]:
    held = task.held_out
    pool = [e.positives[0] for e in held]
    pairs, sizes = [], []
    for i, (e, relevant) in enumerate(zip(held, _relevant(held))):
        others = [pool[(i + j) % len(pool)] for j in range(1, min(10, len(pool)))]
        others = [o for o in others if normalise(o) not in relevant]
        cands = [e.positives[0]] + others
        pairs += [(e.anchor, d) for d in cands]
        sizes.append(len(cands))
    scores = model.score_all(pairs)
    ranks, at = [], 0
    for n in sizes:
        s = scores[at:at + n]
        # ties count against the model, as above; a NaN score ranks last
        ranks.append(int((s[1:] >= s[0]).sum()) if np.isfinite(s[0]) else UNRANKED)
        at += n
    r = np.array(ranks)
    return {"examples": len(held), "accuracy@1": float(np.mean(r == 0)), "mrr@10": _mrr(r)}


def evaluate_held_out(model: Any, tasks: list[Any]) -> dict[str, dict[str, float]]:
    """Metrics per task name (tasks with fewer than 2 held-out examples are skipped)."""
    out = {}
    for task in tasks:
        if len(task.held_out) < 2:
            continue
        if model.kind == "cross-encoder":
            out[task.name] = (_cross_labelled if task.config.format == "labelled" else _cross)(model, task)
        elif task.config.format == "labelled":
            out[task.name] = _bi_labelled(model, task)
        else:
            out[task.name] = _bi_pairs(model, task)
    return out
