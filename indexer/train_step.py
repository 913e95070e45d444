"""One training step's loss: a batch of examples -> the tensors a loss takes -> its value.

Bi-encoder losses see unit vectors: anchors with the anchor prefix (``query: `` for E5),
positives and negatives with the other prefix (``passage: ``). Cross-encoder losses see the
logits of (anchor, candidate) pairs; a candidate list is the example's positive, its own
negatives, then other rows' positives (in-batch negatives).

Rows that share an anchor or a positive are the same question asked twice (Tatoeba has the
same English sentence in many language files): their positives are not negatives of each
other, so such rows get one id and the losses mask them. Texts are compared after
:func:`~vecplug.indexer.train_data.normalise`, as the batches are composed, and every
positive of a row counts (a query with several positives), not only the one it trains on.

Hard negatives: each row keeps all of its own; rows with fewer than the batch's most are
padded, and the losses mask the padding. A hard negative whose text is the anchor or a
positive of a row's question (BM25 mining picks other rows' positives) is not a negative for
that row: the losses mask it for that row only.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vecplug.indexer.train_config import TaskConfig
from vecplug.indexer.train_data import normalise

LABELLED = ("cosine_bce", "smooth_ordinal")


def _own_texts(example: Any) -> list[str]:
    """A row's anchor and every positive, normalised: the texts that are not its negatives."""
    return [normalise(t) for t in (example.anchor, *example.positives)]


def same_question_ids(batch: Sequence[Any]) -> torch.Tensor:
    """(B,) ids: rows linked, directly or through others, by a text among their anchors and
    positives (all of them, after :func:`normalise`) share an id."""
    parent = list(range(len(batch)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    seen: dict[str, int] = {}
    for i, e in enumerate(batch):
        for k in _own_texts(e):
            if k in seen:
                parent[find(i)] = find(seen[k])
            else:
                seen[k] = i
    return torch.tensor([find(i) for i in range(len(batch))], dtype=torch.long)


def _negatives(batch: Sequence[Any], ids: torch.Tensor) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Every row's own negatives: the texts (row by row), a (B, H) mask of the real ones (H:
    the most any row has; the others are padded) and (B, H) ids of the question whose anchor
    or positive each negative is (-1: none)."""
    h = max(len(e.negatives) for e in batch)
    question = {k: int(q) for e, q in zip(batch, ids) for k in _own_texts(e)}
    mask = torch.zeros(len(batch), h, dtype=torch.bool)
    negative_ids = torch.full((len(batch), h), -1, dtype=torch.long)
    texts = []
    for i, e in enumerate(batch):
        mask[i, :len(e.negatives)] = True
        for j, t in enumerate(e.negatives):
            negative_ids[i, j] = question.get(normalise(t), -1)
        texts += e.negatives
    return texts, mask, negative_ids


def _bi(model: Any, task: TaskConfig, batch: Sequence[Any], fn: Any, options: dict[str, Any]) -> torch.Tensor:
    a_prefix, o_prefix = model.prefix(task.anchor_prefix), model.prefix(task.other_prefix)
    anchors = model.embed([e.anchor for e in batch], a_prefix)
    if task.loss in LABELLED:
        others = model.embed([e.positives[0] for e in batch], o_prefix)
        labels = torch.tensor([float(e.label) for e in batch])
        return fn(anchors, others, labels, **options)
    ids = same_question_ids(batch)
    negs, mask, negative_ids = _negatives(batch, ids)
    vectors = model.embed([e.positives[0] for e in batch] + negs, o_prefix)
    positives = vectors[:len(batch)]
    hard = None
    if negs:
        # (B, H, d) with zero rows for the padding (masked by the loss); row-major order of
        # the mask's True entries is the order of ``negs``
        hard = vectors.new_zeros(len(batch), mask.shape[1], vectors.shape[1])
        hard[mask] = vectors[len(batch):]
        options |= {"negative_mask": mask, "negative_ids": negative_ids}
    if task.loss == "triplet":
        return fn(anchors, positives, hard, labels=ids, **options)
    return fn(anchors, positives, hard, positive_ids=ids, **options)  # ranking, simcse


def candidate_lists(batch: Sequence[Any], size: int) -> tuple[list[list[str]], list[list[float]]]:
    """Per row: its positive, its own negatives (but none that is the anchor or a positive of
    its question), then other rows' positives that are not answers to the same question, from
    the next row on round the batch (taken in batch order, every row got row 0's positive
    first: with lists shorter than the batch, later rows' positives were never negatives);
    labels 1 for the positive and 0 for the rest."""
    ids = same_question_ids(batch).tolist()
    own: dict[int, set[str]] = {}
    for e, q in zip(batch, ids):
        own.setdefault(q, set()).update(_own_texts(e))
    lists, labels = [], []
    for i, e in enumerate(batch):
        cands = [e.positives[0]] + [n for n in e.negatives if normalise(n) not in own[ids[i]]]
        others = ((i + k) % len(batch) for k in range(1, len(batch)))
        cands += [batch[j].positives[0] for j in others if ids[j] != ids[i]]
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
