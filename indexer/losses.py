"""Training losses for ``vecplug train``: bi-encoder losses on embeddings, cross-encoder losses
on scores, a registry the trainer and the config checks read, and two monitoring measures.

Every loss takes torch tensors and returns a differentiable scalar (a mean over the batch).
Bi-encoder losses accept vectors of any norm and normalise inside where they are defined on
the cosine. This module is imported only when training, so it imports torch at the top.

Bi-encoder (``model="bi"``):

* ``ranking`` - in-batch negatives ranking (MultipleNegativesRanking / InfoNCE) on scaled
  cosine, with hard negatives, the LaBSE additive margin, a symmetric variant and masking of
  rows that share a positive (translation data repeats the same English sentence), of padded
  hard negatives and of hard negatives that are a row's own positive.
* ``triplet`` - the triplet loss with batch negatives of the Microsoft "unbiased sentence
  encoder" recipe, with batch-all, batch-hard and semi-hard selection.
* ``cosine_bce`` - the same recipe's NLI task: binary cross-entropy of max(0, cos).
* ``smooth_ordinal`` - graded relevance (Liu et al., COLING 2020): the Smooth Ordinal Search
  Loss on the smooth cosine similarity.
* ``simcse`` - supervised SimCSE (Gao et al. 2021).

Cross-encoder (``model="cross"``): ``pointwise_bce``, ``ranknet`` and ``listwise``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from vecplug.errors import ConfigError, VecplugError

TRIPLET_STRATEGIES = ("batch_all", "hard", "semi_hard")
TRIPLET_DISTANCES = ("cosine", "l2", "l1")
#: default thresholds of the ordinal loss: four grades 0..3 (cosine bands)
DEFAULT_THRESHOLDS = (0.25, 0.5, 0.75)
#: clamp of probabilities before a logarithm (float32 cannot tell 1 - 1e-7 from 1)
_PROB_EPS = 1e-6


class LossInputError(VecplugError, ValueError):
    """Tensors of the wrong shape or content were passed to a loss."""


# -- helpers --------------------------------------------------------------------------

def _unit(x: torch.Tensor) -> torch.Tensor:
    # eps keeps a zero vector at zero instead of producing NaN
    return F.normalize(x, p=2, dim=-1, eps=1e-12)


def _zero(*tensors: torch.Tensor) -> torch.Tensor:
    """A zero that stays on the autograd graph, so ``backward()`` works on an empty batch."""
    return sum((t.sum() * 0.0 for t in tensors), torch.zeros((), device=tensors[0].device))


def _check_pair(a: torch.Tensor, b: torch.Tensor, names: str = "anchors/positives") -> None:
    if a.dim() != 2 or b.shape != a.shape:
        raise LossInputError(f"{names} must both be (batch, dim), got {tuple(a.shape)} and {tuple(b.shape)}")


def _negatives_3d(neg: torch.Tensor | None, batch: int, dim: int, what: str) -> torch.Tensor | None:
    """(B, d) or (B, H, d) -> (B, H, d); None stays None."""
    if neg is None:
        return None
    if neg.dim() == 2:
        neg = neg.unsqueeze(1)
    if neg.dim() != 3 or neg.shape[0] != batch or neg.shape[2] != dim:
        raise LossInputError(f"{what} must be ({batch}, H, {dim}) or ({batch}, {dim}), got {tuple(neg.shape)}")
    return neg


def _row_vector(x: torch.Tensor, batch: int, what: str) -> torch.Tensor:
    if x.dim() != 1 or x.shape[0] != batch:
        raise LossInputError(f"{what} must be ({batch},), got {tuple(x.shape)}")
    return x


def _ids(ids: torch.Tensor | None, batch: int, what: str, device: torch.device) -> torch.Tensor:
    """The rows' question ids; without any, every row is its own question."""
    if ids is None:
        return torch.arange(batch, device=device)
    return _row_vector(ids, batch, what)


def _same_id(ids: torch.Tensor) -> torch.Tensor:
    """(B, B): True where column j is another row of row i's question (not a negative)."""
    eye = torch.eye(len(ids), dtype=torch.bool, device=ids.device)
    return (ids[:, None] == ids[None, :]) & ~eye


def _negative_columns(negatives: torch.Tensor | None, negative_mask: torch.Tensor | None,
                      negative_ids: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
    """(B, B, H) bool: True where hard negative h of row j is a negative for row i.

    False for padding (``negative_mask`` False: a row with fewer negatives than the batch's
    most) and where the negative's text is a positive (or the anchor) of row i's question
    (``negative_ids`` equal to row i's id: mined negatives are other rows' positives). None
    when every hard negative counts for every row.
    """
    if negatives is None:
        if negative_mask is not None or negative_ids is not None:
            raise LossInputError("negative_mask and negative_ids need hard negatives")
        return None
    batch, h = negatives.shape[:2]
    cols = torch.ones(batch, batch, h, dtype=torch.bool, device=negatives.device)
    if negative_mask is not None:
        if negative_mask.shape != (batch, h):
            raise LossInputError(f"negative_mask must be ({batch}, {h}), got {tuple(negative_mask.shape)}")
        cols &= negative_mask.to(torch.bool)[None, :, :]
    if negative_ids is not None:
        if negative_ids.shape != (batch, h):
            raise LossInputError(f"negative_ids must be ({batch}, {h}), got {tuple(negative_ids.shape)}")
        cols &= negative_ids[None, :, :] != ids[:, None, None]
    return cols if negative_mask is not None or negative_ids is not None else None


def _in_batch_ce(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None,
                 scale: float, margin: float, same_id: torch.Tensor | None,
                 negative_columns: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of row i against column i over [positives | every row's negatives].

    Inputs are unit vectors; ``same_id`` (B, B) marks columns that are not negatives of a row,
    ``negative_columns`` (B, B, H) the hard negatives that are (see :func:`_negative_columns`).
    """
    batch = anchors.shape[0]
    cos = anchors @ positives.T
    if margin:
        cos = cos - margin * torch.eye(batch, dtype=cos.dtype, device=cos.device)
    logits = cos * scale
    if same_id is not None:
        logits = logits.masked_fill(same_id, float("-inf"))
    if negatives is not None:
        # every row's negatives are extra columns for every row (sentence-transformers MNRL)
        flat = negatives.reshape(-1, negatives.shape[-1])
        extra = (anchors @ flat.T) * scale
        if negative_columns is not None:
            extra = extra.masked_fill(~negative_columns.reshape(batch, -1), float("-inf"))
        logits = torch.cat([logits, extra], dim=1)
    target = torch.arange(batch, device=anchors.device)
    return F.cross_entropy(logits, target)


# -- option validation ----------------------------------------------------------------

def _number(name: str, value: Any, *, positive: bool = False, non_negative: bool = False,
            minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"loss option '{name}' must be a number, not {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"loss option '{name}' must be > 0, not {value}")
    if non_negative and value < 0:
        raise ConfigError(f"loss option '{name}' must be >= 0, not {value}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"loss option '{name}' must be >= {minimum}, not {value}")
    return float(value)


def _choice(name: str, value: Any, known: Sequence[str]) -> str:
    if value not in known:
        raise ConfigError(f"loss option '{name}' must be one of {', '.join(known)}, not {value!r}")
    return str(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"loss option '{name}' must be true or false, not {value!r}")
    return value


def _thresholds(value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ConfigError(f"loss option 'thresholds' must be a non-empty list of numbers, not {value!r}")
    out = tuple(_number("thresholds", v) for v in value)
    if any(not -1.0 <= t <= 1.0 for t in out):
        raise ConfigError(f"loss option 'thresholds' must lie in [-1, 1] (they bound cosines), not {list(out)}")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ConfigError(f"loss option 'thresholds' must be strictly increasing, not {list(out)}")
    return out


#: per option: a function that returns the cleaned value or raises ConfigError
_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "scale": lambda v: _number("scale", v, positive=True),
    "margin": lambda v: _number("margin", v, non_negative=True),
    "symmetric": lambda v: _flag("symmetric", v),
    "strategy": lambda v: _choice("strategy", v, TRIPLET_STRATEGIES),
    "distance": lambda v: _choice("distance", v, TRIPLET_DISTANCES),
    "thresholds": _thresholds,
    # power 1 is the plain ordinal hinge; below 1 the loss is not smooth at the thresholds
    "power": lambda v: _number("power", v, minimum=1.0),
    "eps": lambda v: _number("eps", v, positive=True),
    "temperature": lambda v: _number("temperature", v, positive=True),
}


# -- bi-encoder losses ----------------------------------------------------------------

def ranking_loss(anchors: torch.Tensor, positives: torch.Tensor, hard_negatives: torch.Tensor | None = None,
                 *, scale: float = 20.0, margin: float = 0.0, symmetric: bool = False,
                 positive_ids: torch.Tensor | None = None, negative_mask: torch.Tensor | None = None,
                 negative_ids: torch.Tensor | None = None) -> torch.Tensor:
    """In-batch negatives ranking loss (MultipleNegativesRanking / InfoNCE) on scaled cosine.

    Row i must rank its positive above every other row's positive and above every row's hard
    negatives: cross-entropy over ``scale * cos(anchor_i, column)`` with the columns
    [positives (B) | all hard negatives (B*H)], as sentence-transformers' MNRL does.

    Args:
        anchors, positives: (B, d), any norm (normalised here).
        hard_negatives: None, (B, H, d) or (B, d); row i's own hard negatives, which are also
            negatives for every other row.
        scale: inverse temperature.
        margin: LaBSE additive margin, subtracted from the positive (diagonal) cosine before
            scaling; the positive must then win by at least this much.
        symmetric: also rank anchors for each positive (columns: anchors only) and average the
            two directions.
        positive_ids: optional (B,) ints; rows whose positives share an id are not negatives
            of each other (their cross entries are masked out), e.g. several translations of
            the same English sentence in one batch.
        negative_mask: optional (B, H) bool, True for real hard negatives: rows with fewer
            negatives than the batch's most are padded, and a padded column is no row's
            negative.
        negative_ids: optional (B, H) ints: the id (as in ``positive_ids``; without those,
            the row number) of the rows whose positive (or anchor) the hard negative's text
            is, -1 for none; it is not a negative for those rows (a mined negative is often
            another row's positive).
    """
    _check_pair(anchors, positives)
    scale = _VALIDATORS["scale"](scale)
    margin = _VALIDATORS["margin"](margin)
    symmetric = _VALIDATORS["symmetric"](symmetric)
    batch, dim = anchors.shape
    negatives = _negatives_3d(hard_negatives, batch, dim, "hard_negatives")
    a, p = _unit(anchors), _unit(positives)
    n = _unit(negatives) if negatives is not None else None
    ids = _ids(positive_ids, batch, "positive_ids", anchors.device)
    same_id = _same_id(ids) if positive_ids is not None else None
    loss = _in_batch_ce(a, p, n, scale, margin, same_id, _negative_columns(n, negative_mask, negative_ids, ids))
    if symmetric:
        # positive -> anchor: the mask is symmetric, so the same one serves
        loss = (loss + _in_batch_ce(p, a, None, scale, margin, same_id)) / 2
    return loss


def _distances(x: torch.Tensor, y: torch.Tensor, distance: str) -> torch.Tensor:
    """Distances between x (..., d) and y (..., d) broadcast over the leading dimensions."""
    if distance == "cosine":
        return 1.0 - (_unit(x) * _unit(y)).sum(-1)
    order = 2 if distance == "l2" else 1
    # vector_norm has a zero (sub)gradient at a zero difference, unlike sqrt of a square sum
    return torch.linalg.vector_norm(x - y, ord=order, dim=-1)


def triplet_loss(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None = None,
                 *, strategy: str = "batch_all", distance: str = "cosine", margin: float = 0.5,
                 labels: torch.Tensor | None = None, negative_mask: torch.Tensor | None = None,
                 negative_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Triplet loss with batch negatives (the Microsoft "unbiased sentence encoder" recipe).

    The candidate negatives of row i are the positives of the other rows (minus those whose
    ``labels`` value equals row i's, when labels are given) plus ``negatives[i]`` (minus
    padding, where ``negative_mask`` (B, H) is False, and those whose ``negative_ids`` (B, H)
    equals row i's label: a text that is a positive of row i's question; see
    :func:`ranking_loss`). Each triplet costs ``max(0, d(a, p) - d(a, n) + margin)``.

    Distances: ``cosine`` (1 - cos), ``l2`` (Euclidean) and ``l1`` (Manhattan); l2 and l1 use
    the vectors as given (pass unit vectors for a scale-free margin).

    Strategies:
        * ``batch_all``: the mean over the violating triplets only (those with a positive
          loss); 0 when none violates, so easy triplets do not dilute the gradient.
        * ``hard``: per anchor the hardest negative (smallest d(a, n)); mean over anchors.
        * ``semi_hard``: per anchor the closest negative that is farther than the positive but
          inside the margin (d(a,p) < d(a,n) < d(a,p) + margin: FaceNet's semi-hard
          negatives); when an anchor has none, its hardest negative is used (the fallback this
          project chose: FaceNet defines none). TensorFlow Addons' ``triplet_semihard_loss``
          differs: it takes the closest negative farther than the positive with no upper bound
          (a loss of 0 when that one lies beyond the margin, where this falls back to the
          hardest), and the farthest negative only when none is farther than the positive.
          Mean over anchors.

    Anchors without any candidate negative (a batch of one, every row of one label) are
    left out of the mean; if no anchor has one, the loss is 0.
    """
    _check_pair(anchors, positives)
    strategy = _VALIDATORS["strategy"](strategy)
    distance = _VALIDATORS["distance"](distance)
    margin = _VALIDATORS["margin"](margin)
    batch, dim = anchors.shape
    extra = _negatives_3d(negatives, batch, dim, "negatives")

    d_ap = _distances(anchors, positives, distance)                                 # (B,)
    d_an = _distances(anchors[:, None, :], positives[None, :, :], distance)         # (B, B)
    lab = _ids(labels, batch, "labels", anchors.device)
    valid = ~_same_id(lab) & ~torch.eye(batch, dtype=torch.bool, device=anchors.device)
    own = _negative_columns(extra, negative_mask, negative_ids, lab)
    if extra is not None:
        d_an = torch.cat([d_an, _distances(anchors[:, None, :], extra, distance)], dim=1)
        # row i's own negatives only: the diagonal (i, i, :) of the (B, B, H) columns
        own_valid = (own[torch.arange(batch), torch.arange(batch)] if own is not None
                     else torch.ones(extra.shape[:2], dtype=torch.bool, device=valid.device))
        valid = torch.cat([valid, own_valid], dim=1)

    if strategy == "batch_all":
        losses = F.relu(d_ap[:, None] - d_an + margin)[valid]
        violating = losses > 0
        if not bool(violating.any()):
            return _zero(anchors, positives)
        return losses[violating].mean()

    has_negative = valid.any(dim=1)
    if not bool(has_negative.any()):
        return _zero(anchors, positives)
    inf = torch.tensor(float("inf"), dtype=d_an.dtype, device=d_an.device)
    hardest = torch.where(valid, d_an, inf).min(dim=1).values
    chosen = hardest
    if strategy == "semi_hard":
        semi = valid & (d_an > d_ap[:, None]) & (d_an < d_ap[:, None] + margin)
        closest_semi = torch.where(semi, d_an, inf).min(dim=1).values
        chosen = torch.where(semi.any(dim=1), closest_semi, hardest)
    per_anchor = F.relu(d_ap - chosen + margin)
    return per_anchor[has_negative].mean()


def label_rule(loss: str, options: Mapping[str, Any]) -> tuple[Callable[[float], bool], str] | None:
    """What labels ``loss`` (with its ``options``) takes, one label at a time: a test and its
    wording; None when it takes any. The same rules the losses check on a batch, for checking
    training data as it loads."""
    if loss == "cosine_bce":
        return (lambda g: g in (0, 1)), "labels 0 or 1"
    if loss == "smooth_ordinal":
        top = len(options.get("thresholds", DEFAULT_THRESHOLDS))
        return (lambda g: g == int(g) and 0 <= g <= top), f"whole grades 0..{top} with {top} thresholds"
    if loss == "pointwise_bce":  # soft labels are fine, but a probability is in [0, 1]
        return (lambda g: 0 <= g <= 1), "labels in [0, 1]"
    return None


def cosine_bce_loss(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of ``max(0, cos(a, b))`` against labels in {0, 1} (the Microsoft
    recipe's NLI task: entailment 1, contradiction 0).

    The score is clamped into [1e-6, 1 - 1e-6] before the logarithm. As in the recipe, a pair
    labelled 1 whose cosine is <= 0 gets no gradient (max(0, .) is flat there).
    """
    _check_pair(a, b, "a/b")
    target = _row_vector(labels, a.shape[0], "labels").to(a.dtype)
    if bool(((target != 0) & (target != 1)).any()):
        raise LossInputError("cosine_bce labels must be 0 or 1")
    score = F.relu(F.cosine_similarity(a, b, dim=-1, eps=1e-12))
    score = score.clamp(_PROB_EPS, 1.0 - _PROB_EPS)
    return F.binary_cross_entropy(score, target)


def smooth_cosine(a: torch.Tensor, b: torch.Tensor, *, eps: float = 0.01) -> torch.Tensor:
    """Smooth cosine similarity of the rows of a and b (both (B, d)): ``a.b / (|a||b| + eps)``.

    From Liu et al. (COLING 2020, "Cross-Lingual Document Retrieval with Smooth Learning"):
    the idea, a cosine whose gradient stays bounded when a vector's norm goes to 0 (plain
    cosine's gradient grows like 1/|a|). The exact formula of the paper could not be
    retrieved; this is our reading, the form that "smooth cosine similarity" has in the
    Neural Turing Machine implementations (a constant added to the product of the norms).
    Its magnitude is below 1 and tends to the cosine as the norms grow; for unit vectors it
    is ``cos / (1 + eps)``.
    """
    _check_pair(a, b, "a/b")
    eps = _VALIDATORS["eps"](eps)
    dot = (a * b).sum(-1)
    return dot / (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1) + eps)


def smooth_ordinal_loss(a: torch.Tensor, b: torch.Tensor, grades: torch.Tensor, *,
                        thresholds: Sequence[float] = DEFAULT_THRESHOLDS, power: float = 2.0,
                        eps: float = 0.01) -> torch.Tensor:
    """Smooth Ordinal Search Loss (SOSL, Liu et al., COLING 2020) for graded relevance.

    With K - 1 increasing thresholds t_1 < ... < t_{K-1} and grades 0..K-1, a pair of grade g
    should have its smooth cosine s above t_k for every k <= g and below t_k for every k > g,
    i.e. inside the band (t_g, t_{g+1}). Per pair::

        loss = sum_k max(0, y_k * (t_k - s)) ** power,   y_k = +1 if g >= k else -1

    averaged over the batch. What comes from the paper: the smooth cosine as the relevance
    score and this ordinal threshold loss, in the form of the authors' public code
    (github.com/JiapengL/multi_ling_search, ``cal_loss``: two thresholds for grades 0..2 and
    an exponent ``m``, our ``power``); the paper's own equations could not be retrieved. Our
    reading: "smooth" as the squared hinge (power 2, differentiable at the thresholds), any
    number of thresholds, and the defaults; the code's optional "leaky" term, which pushes a
    score towards the middle of its band, is not included.

    Args:
        a, b: (B, d) query and document vectors (any norm).
        grades: (B,) integer grades in 0..len(thresholds).
        thresholds: the band edges, strictly increasing, in [-1, 1].
        power: exponent of the hinge (1: plain hinge; 2: smooth).
        eps: the smooth cosine's constant.
    """
    _check_pair(a, b, "a/b")
    edges = _VALIDATORS["thresholds"](thresholds)
    power = _VALIDATORS["power"](power)
    g = _row_vector(grades, a.shape[0], "grades")
    if g.is_floating_point() and bool((g != g.round()).any()):
        raise LossInputError("grades must be whole numbers")
    if bool(((g < 0) | (g > len(edges))).any()):
        raise LossInputError(f"grades must lie in 0..{len(edges)} for {len(edges)} thresholds")
    s = smooth_cosine(a, b, eps=eps)
    t = torch.tensor(edges, dtype=s.dtype, device=s.device)                         # (K-1,)
    k = torch.arange(1, len(edges) + 1, device=s.device)
    sign = torch.where(g[:, None] >= k[None, :], 1.0, -1.0).to(s.dtype)            # (B, K-1)
    return (F.relu(sign * (t[None, :] - s[:, None])) ** power).sum(dim=1).mean()


def simcse_loss(anchors: torch.Tensor, positives: torch.Tensor, hard_negatives: torch.Tensor | None = None,
                *, temperature: float = 0.05, positive_ids: torch.Tensor | None = None,
                negative_mask: torch.Tensor | None = None,
                negative_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Supervised SimCSE (Gao et al. 2021): InfoNCE over ``cos / temperature``.

    Anchors (premises), positives (entailments, (B, d)) and optional hard negatives
    (contradictions, (B, d) or (B, H, d)); row i's columns are every positive of the batch and
    every hard negative of the batch, its own positive being the target. ``positive_ids``,
    ``negative_mask`` and ``negative_ids`` mask the columns that are not negatives of a row,
    as in :func:`ranking_loss` (a repeated premise or entailment in one batch).
    """
    _check_pair(anchors, positives)
    temperature = _VALIDATORS["temperature"](temperature)
    batch, dim = anchors.shape
    negatives = _negatives_3d(hard_negatives, batch, dim, "hard_negatives")
    n = _unit(negatives) if negatives is not None else None
    ids = _ids(positive_ids, batch, "positive_ids", anchors.device)
    same_id = _same_id(ids) if positive_ids is not None else None
    return _in_batch_ce(_unit(anchors), _unit(positives), n, 1.0 / temperature, 0.0, same_id,
                        _negative_columns(n, negative_mask, negative_ids, ids))


# -- cross-encoder losses -------------------------------------------------------------

def pointwise_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits; labels are floats in [0, 1] (soft labels allowed)."""
    if logits.shape != labels.shape:
        raise LossInputError(f"logits and labels must have the same shape, got {tuple(logits.shape)} "
                             f"and {tuple(labels.shape)}")
    target = labels.to(logits.dtype)
    if bool(((target < 0) | (target > 1)).any()):
        raise LossInputError("pointwise_bce labels must lie in [0, 1]")
    return F.binary_cross_entropy_with_logits(logits, target)


def _list_inputs(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if scores.dim() != 2 or labels.shape != scores.shape:
        raise LossInputError(f"scores and labels must both be (queries, candidates), got "
                             f"{tuple(scores.shape)} and {tuple(labels.shape)}")
    if mask is None:
        return torch.ones_like(scores, dtype=torch.bool)
    if mask.shape != scores.shape:
        raise LossInputError(f"mask must be {tuple(scores.shape)}, got {tuple(mask.shape)}")
    return mask.to(torch.bool)


def ranknet_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """RankNet: the mean over pairs (i, j) of one query's valid candidates with
    label_i > label_j of ``log(1 + exp(-(s_i - s_j)))``. 0 when the batch has no such pair.

    Args:
        scores, labels: (B, n); n candidates per query.
        mask: optional (B, n) bool, True for real candidates (False: padding).
    """
    valid = _list_inputs(scores, labels, mask)
    pair_ok = valid[:, :, None] & valid[:, None, :] & (labels[:, :, None] > labels[:, None, :])
    if not bool(pair_ok.any()):
        return _zero(scores)
    diff = scores[:, :, None] - scores[:, None, :]
    return F.softplus(-diff)[pair_ok].mean()


def listwise_ce(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Listwise softmax cross-entropy (ListNet with a top-one target).

    Per query: ``-sum_i p_i log softmax(s)_i`` over its valid candidates, where p is the label
    row normalised to sum 1. Queries without a positive label (sum <= 0 over valid entries)
    are skipped; the mean is over the others, 0 when there are none. Labels must be >= 0.
    """
    valid = _list_inputs(scores, labels, mask)
    target = labels.to(scores.dtype).masked_fill(~valid, 0.0)
    if bool((target < 0).any()):
        raise LossInputError("listwise labels must be >= 0")
    totals = target.sum(dim=1)
    keep = totals > 0
    if not bool(keep.any()):
        return _zero(scores)
    log_p = torch.log_softmax(scores.masked_fill(~valid, float("-inf")), dim=1)
    # padding has log_p = -inf and weight 0; fill it so 0 * -inf does not become NaN
    log_p = log_p.masked_fill(~valid, 0.0)
    per_query = -(target * log_p).sum(dim=1) / totals.clamp_min(1e-12)
    return per_query[keep].mean()


# -- monitoring -----------------------------------------------------------------------

def alignment(a: torch.Tensor, b: torch.Tensor, alpha: float = 2) -> torch.Tensor:
    """Alignment of Wang & Isola (2020): mean of ``|a_i - b_i| ** alpha`` over positive pairs
    of unit vectors (normalised here). Lower is better; 0 means identical directions."""
    _check_pair(a, b, "a/b")
    return torch.linalg.vector_norm(_unit(a) - _unit(b), dim=1).pow(alpha).mean()


def uniformity(x: torch.Tensor, t: float = 2) -> torch.Tensor:
    """Uniformity of Wang & Isola (2020): ``log mean_{i<j} exp(-t |x_i - x_j|^2)`` over unit
    vectors (normalised here). Lower is more uniform; 0 means all vectors coincide."""
    if x.dim() != 2 or x.shape[0] < 2:
        raise LossInputError(f"uniformity needs (n >= 2, dim) vectors, got {tuple(x.shape)}")
    return torch.pdist(_unit(x), p=2).pow(2).mul(-t).exp().mean().log()


# -- registry -------------------------------------------------------------------------

@dataclass(frozen=True)
class LossSpec:
    """A loss the trainer can name in a task.

    ``model`` is "bi" (embeddings in) or "cross" (scores in); ``needs`` names the shape of the
    data: "pairs", "triplets", "labelled", "graded" or "lists"; ``options`` are the keyword
    names the function accepts besides its tensors.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    model: str
    needs: str
    options: tuple[str, ...] = ()


LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in (
    LossSpec("ranking", ranking_loss, "bi", "pairs", ("scale", "margin", "symmetric")),
    LossSpec("triplet", triplet_loss, "bi", "triplets", ("strategy", "distance", "margin")),
    LossSpec("cosine_bce", cosine_bce_loss, "bi", "labelled"),
    LossSpec("smooth_ordinal", smooth_ordinal_loss, "bi", "graded", ("thresholds", "power", "eps")),
    LossSpec("simcse", simcse_loss, "bi", "triplets", ("temperature",)),
    LossSpec("pointwise_bce", pointwise_bce, "cross", "labelled"),
    LossSpec("ranknet", ranknet_loss, "cross", "lists"),
    LossSpec("listwise", listwise_ce, "cross", "lists"),
)}


def get_loss(name: str) -> LossSpec:
    """The registered loss ``name``; ConfigError naming the known ones otherwise."""
    try:
        return LOSSES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}") from None


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Check a task's loss options before training starts; return them cleaned (numbers as
    floats, thresholds as a tuple). ConfigError for an unknown loss, an option the loss does
    not take, or an invalid value (unknown strategy or distance, negative margin, scale or
    temperature <= 0, thresholds not increasing...)."""
    spec = get_loss(name)
    if not isinstance(options, Mapping):
        raise ConfigError(f"options of loss '{name}' must be a mapping, not {options!r}")
    cleaned: dict[str, Any] = {}
    for key, value in options.items():
        if key not in spec.options:
            known = ", ".join(spec.options) if spec.options else "none"
            raise ConfigError(f"loss '{name}' has no option {key!r}; its options: {known}")
        cleaned[key] = _VALIDATORS[key](value)
    return cleaned
