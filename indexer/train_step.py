"""One training step's loss: a batch of examples -> the tensors a loss takes -> its value.

Bi-encoder losses see unit vectors: anchors with the anchor prefix (``query: `` for E5),
positives and negatives with the other prefix (``passage: ``). Cross-encoder losses see the
logits of (anchor, candidate) pairs; a candidate list is the example's positive, its own
negatives, then other rows' positives (in-batch negatives).

Rows that share an anchor or a positive are the same question asked twice (Tatoeba has the
same English sentence in many language files): their positives are not negatives of each
other, so such rows get one id and the losses mask them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vecplug.indexer.train_config import TaskConfig

LABELLED = ("cosine_bce", "smooth_ordinal")


def same_question_ids(batch: Sequence[Any]) -> torch.Tensor:
    """(B,) ids: rows linked by an equal anchor or an equal first positive share an id."""
    parent = list(range(len(batch)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    seen: dict[tuple[str, str], int] = {}
    for i, e in enumerate(batch):
        keys = [("a", e.anchor.strip().lower())] + [("p", p.strip().lower()) for p in e.positives[:1]]
        for k in keys:
            if k in seen:
                parent[find(i)] = find(seen[k])
            else:
                seen[k] = i
    return torch.tensor([find(i) for i in range(len(batch))], dtype=torch.long)


def _negatives(batch: Sequence[Any]) -> list[list[str]]:
    """Each row's own negatives, cut to the smallest count in the batch (a (B, H) block)."""
    h = min(len(e.negatives) for e in batch)
    return [list(e.negatives[:h]) for e in batch] if h else []


def _bi(model: Any, task: TaskConfig, batch: Sequence[Any], fn: Any, options: dict[str, Any]) -> torch.Tensor:
    a_prefix, o_prefix = model.prefix(task.anchor_prefix), model.prefix(task.other_prefix)
    anchors = model.embed([e.anchor for e in batch], a_prefix)
    if task.loss in LABELLED:
        others = model.embed([e.positives[0] for e in batch], o_prefix)
        labels = torch.tensor([float(e.label) for e in batch])
        return fn(anchors, others, labels, **options)
    negs = _negatives(batch)
    texts = [e.positives[0] for e in batch] + [t for row in negs for t in row]
    vectors = model.embed(texts, o_prefix)
    positives = vectors[:len(batch)]
    hard = vectors[len(batch):].reshape(len(batch), len(negs[0]), -1) if negs else None
    ids = same_question_ids(batch)
    if task.loss == "ranking":
        return fn(anchors, positives, hard, positive_ids=ids, **options)
    if task.loss == "triplet":
        return fn(anchors, positives, hard, labels=ids, **options)
    return fn(anchors, positives, hard, **options)  # simcse


def candidate_lists(batch: Sequence[Any], size: int) -> tuple[list[list[str]], list[list[float]]]:
    """Per row: its positive, its own negatives, then other rows' positives that are not
    answers to the same question; labels 1 for the positive and 0 for the rest."""
    ids = same_question_ids(batch).tolist()
    lists, labels = [], []
    for i, e in enumerate(batch):
        cands = [e.positives[0]] + list(e.negatives)
        cands += [o.positives[0] for j, o in enumerate(batch) if j != i and ids[j] != ids[i]]
        cands = cands[:size]
        lists.append(cands)
        labels.append([1.0] + [0.0] * (len(cands) - 1))
    return lists, labels


def _cross(model: Any, task: TaskConfig, batch: Sequence[Any], fn: Any, options: dict[str, Any]) -> torch.Tensor:
    if task.loss == "pointwise_bce":
        if task.format == "labelled":
            pairs = [(e.anchor, e.positives[0]) for e in batch]
            labels = [float(e.label) for e in batch]
        else:  # a positive and one negative per row (its own, else the next row's positive)
            lists, _ = candidate_lists(batch, 2)
            pairs, labels = [], []
            for e, cands in zip(batch, lists):
                pairs += [(e.anchor, c) for c in cands]
                labels += [1.0] + [0.0] * (len(cands) - 1)
        logits = model.score([q for q, _ in pairs], [d for _, d in pairs])
        return fn(logits, torch.tensor(labels), **options)
    lists, labels = candidate_lists(batch, task.list_size)
    n = max(len(c) for c in lists)
    flat_q = [e.anchor for e, c in zip(batch, lists) for _ in c]
    flat_d = [d for c in lists for d in c]
    logits = model.score(flat_q, flat_d)
    scores = torch.zeros(len(batch), n)
    target = torch.zeros(len(batch), n)
    mask = torch.zeros(len(batch), n, dtype=torch.bool)
    at = 0
    for r, (c, lab) in enumerate(zip(lists, labels)):
        scores[r, :len(c)] = logits[at:at + len(c)]
        target[r, :len(c)] = torch.tensor(lab)
        mask[r, :len(c)] = True
        at += len(c)
    return fn(scores, target, mask=mask, **options)


def loss_of(model: Any, task: TaskConfig, batch: Sequence[Any]) -> torch.Tensor:
    """The loss of ``task`` on ``batch`` (examples) under ``model`` (a TrainableModel)."""
    from vecplug.indexer.losses import get_loss

    spec = get_loss(task.loss)
    options = dict(task.options)
    if model.kind == "cross-encoder":
        return _cross(model, task, batch, spec.fn, options)
    return _bi(model, task, batch, spec.fn, options)
