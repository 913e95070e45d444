"""Training losses: hand-computed values, a few optimiser steps lower each loss, edge cases and
option checks. Expected values are worked out by hand (in the comments) or with numpy from the
definitions, never by calling the code under test."""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vecplug.errors import ConfigError  # noqa: E402
from vecplug.indexer import losses as L  # noqa: E402


def t(x, dtype=None) -> "torch.Tensor":
    return torch.tensor(x, dtype=dtype or torch.float32)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def ce(logits: np.ndarray, target: int) -> float:
    """-log softmax(logits)[target], from the definition."""
    return float(-logits[target] + np.log(np.exp(logits).sum()))


# -- ranking --------------------------------------------------------------------------

A2 = [[1.0, 0.0], [0.0, 1.0]]
P2 = [[2.0, 0.0], [1.0, 1.0]]          # p0 = (1, 0) after normalising, p1 = (.7071, .7071)


def test_ranking_hand_computed() -> None:
    # cos: row 0 -> [1, .7071], row 1 -> [0, .7071]; scale 2
    r = math.sqrt(0.5)
    row0 = -2 * 1 + math.log(math.exp(2) + math.exp(2 * r))
    row1 = -2 * r + math.log(math.exp(0) + math.exp(2 * r))
    got = L.ranking_loss(t(A2), t(P2), scale=2.0)
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-5)


def test_ranking_hard_negatives_are_columns_for_every_row() -> None:
    # hard negatives n0 = (0, 1), n1 = (-1, 0): columns [p0, p1, n0, n1] for both rows
    r = math.sqrt(0.5)
    row0 = ce(np.array([1, r, 0, -1]) * 2, 0)
    row1 = ce(np.array([0, r, 1, 0]) * 2, 1)
    hn = t([[[0.0, 3.0]], [[-1.0, 0.0]]])        # (B, H=1, d), n0 not unit on purpose
    got = L.ranking_loss(t(A2), t(P2), hn, scale=2.0)
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-5)
    # (B, d) is read as one hard negative per row
    assert L.ranking_loss(t(A2), t(P2), hn[:, 0, :], scale=2.0).item() == pytest.approx(got.item(), abs=1e-6)


def test_ranking_margin_is_subtracted_from_the_positive_before_scaling() -> None:
    r = math.sqrt(0.5)
    m = 0.3
    row0 = ce(np.array([1 - m, r]) * 2, 0)
    row1 = ce(np.array([0, r - m]) * 2, 1)
    got = L.ranking_loss(t(A2), t(P2), scale=2.0, margin=m)
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-5)
    assert got.item() > L.ranking_loss(t(A2), t(P2), scale=2.0).item()


def test_ranking_symmetric_averages_both_directions() -> None:
    r = math.sqrt(0.5)
    forward = (ce(np.array([1, r]) * 2, 0) + ce(np.array([0, r]) * 2, 1)) / 2
    # positive -> anchor: p0 . [a0, a1] = [1, 0]; p1 . [a0, a1] = [r, r]
    backward = (ce(np.array([1, 0]) * 2, 0) + ce(np.array([r, r]) * 2, 1)) / 2
    got = L.ranking_loss(t(A2), t(P2), scale=2.0, symmetric=True)
    assert got.item() == pytest.approx((forward + backward) / 2, abs=1e-5)


def test_ranking_symmetric_ignores_hard_negatives_in_the_backward_direction() -> None:
    r = math.sqrt(0.5)
    # hard negatives (-1, 0) and (-5, 0): both (-1, 0) once normalised
    hn = t([[[-1.0, 0.0]], [[-5.0, 0.0]]])
    # forward columns p0, p1, n0, n1; backward columns: the anchors only
    forward = (ce(np.array([1, r, -1, -1]) * 2, 0) + ce(np.array([0, r, 0, 0]) * 2, 1)) / 2
    backward = (ce(np.array([1, 0]) * 2, 0) + ce(np.array([r, r]) * 2, 1)) / 2
    got = L.ranking_loss(t(A2), t(P2), hn, scale=2.0, symmetric=True)
    assert got.item() == pytest.approx((forward + backward) / 2, abs=1e-5)


def test_ranking_positive_ids_mask_duplicates() -> None:
    # rows 0 and 1 are translations of the same English sentence (the same positive)
    a = t([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    p = t([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    ids = torch.tensor([7, 7, 3])
    # cos(a_i, p_j): row 0 [1, 1, 0]; row 1 [.8, .8, .6]; row 2 [0, 0, 1]
    # masked: row 0 drops column 1, row 1 drops column 0
    row0 = ce(np.array([1, 0]) * 2, 0)
    row1 = ce(np.array([0.8, 0.6]) * 2, 0)
    row2 = ce(np.array([0, 0, 1]) * 2, 2)
    got = L.ranking_loss(a, p, scale=2.0, positive_ids=ids)
    assert got.item() == pytest.approx((row0 + row1 + row2) / 3, abs=1e-5)
    unmasked = L.ranking_loss(a, p, scale=2.0)
    assert unmasked.item() > got.item() + 0.1          # the duplicate counted as a negative
    # the mask applies in the backward direction too: p1 . [a0, a1, a2] = [1, .8, 0], drop a0
    sym = L.ranking_loss(a, p, scale=2.0, positive_ids=ids, symmetric=True)
    back = (ce(np.array([1, 0]) * 2, 0) + ce(np.array([0.8, 0]) * 2, 0) + ce(np.array([0, 0.6, 1]) * 2, 2)) / 3
    assert sym.item() == pytest.approx((got.item() + back) / 2, abs=1e-5)


def test_ranking_padded_hard_negatives_are_no_row_s_column() -> None:
    # row 0 has two hard negatives (0, 1) and (-1, 0); row 1 has one, (0, -1), padded with a
    # vector that would be a strong column if it counted: (1, 1)
    r = math.sqrt(0.5)
    hn = t([[[0.0, 1.0], [-1.0, 0.0]], [[0.0, -1.0], [1.0, 1.0]]])
    mask = torch.tensor([[True, True], [True, False]])
    # columns [p0, p1, n00, n01, n10] for both rows; cos of a0 = (1, 0): [1, r, 0, -1, 0],
    # of a1 = (0, 1): [0, r, 1, 0, -1]
    row0 = ce(np.array([1, r, 0, -1, 0]) * 2, 0)
    row1 = ce(np.array([0, r, 1, 0, -1]) * 2, 1)
    got = L.ranking_loss(t(A2), t(P2), hn, scale=2.0, negative_mask=mask)
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-5)
    with pytest.raises(L.LossInputError, match="negative_mask"):
        L.ranking_loss(t(A2), t(P2), hn, negative_mask=mask[:, :1])
    with pytest.raises(L.LossInputError, match="need hard negatives"):
        L.ranking_loss(t(A2), t(P2), negative_mask=mask)


def test_ranking_hard_negative_that_is_a_row_s_positive_is_masked_for_that_row_only() -> None:
    # a perfect encoder: a_i = p_i, rows orthogonal; row 0's mined negative IS p1, row 1's is
    # unrelated. For row 1 the column "row 0's negative" is its own positive again
    e = np.eye(4)
    a, p = t(e[:2].tolist()), t(e[:2].tolist())
    hn = t([[e[1].tolist()], [e[3].tolist()]])
    negative_ids = torch.tensor([[1], [-1]])       # row 0's negative is a positive of id 1
    ids = torch.tensor([0, 1])
    # row 0 columns [p0, p1, n0, n1]: cos [1, 0, 0, 0]; row 1 without n0: [p0, p1, n1] = [0, 1, 0]
    row0 = ce(np.array([1, 0, 0, 0]) * 20, 0)
    row1 = ce(np.array([0, 1, 0]) * 20, 1)
    got = L.ranking_loss(a, p, hn, scale=20, positive_ids=ids, negative_ids=negative_ids)
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)
    # unmasked, row 1 cannot do better than a tie with its own positive: log 2 / 2
    assert L.ranking_loss(a, p, hn, scale=20, positive_ids=ids).item() == pytest.approx(math.log(2) / 2, abs=1e-4)
    # without positive_ids the row number is the id
    assert L.ranking_loss(a, p, hn, scale=20, negative_ids=negative_ids).item() == pytest.approx(got.item())


# -- triplet --------------------------------------------------------------------------
# l1 case: a0 = (0, 0), p0 = (1, 0) -> d(a, p) = 1;  a1 = (10, 0), p1 = (10, 2) -> 2
# batch negatives: row 0 <- p1 at 12; row 1 <- p0 at 9 (both easy with margin .5)
# own negatives: row 0: (1, .2) at 1.2 (semi-hard, loss .3), (.5, .5) at 1.0 (hard, loss .5)
#                row 1: (10, -1) at 1 (hard, loss 1.5), (12, .3) at 2.3 (semi-hard, loss .2)

TA = [[0.0, 0.0], [10.0, 0.0]]
TP = [[1.0, 0.0], [10.0, 2.0]]
TN = [[[1.0, 0.2], [0.5, 0.5]], [[10.0, -1.0], [12.0, 0.3]]]


@pytest.mark.parametrize("strategy, expected", [
    ("batch_all", (0.3 + 0.5 + 1.5 + 0.2) / 4),   # mean over the 4 violating triplets only
    ("hard", (0.5 + 1.5) / 2),                      # hardest: 1.0 for row 0, 1 for row 1
    ("semi_hard", (0.3 + 0.2) / 2),                 # closest inside (d_ap, d_ap + margin)
])
def test_triplet_strategies_l1(strategy: str, expected: float) -> None:
    got = L.triplet_loss(t(TA), t(TP), t(TN), strategy=strategy, distance="l1", margin=0.5)
    assert got.item() == pytest.approx(expected, abs=1e-5)


def test_triplet_semi_hard_falls_back_to_the_hardest_negative() -> None:
    # row 0 keeps its semi-hard (1, .2) -> .3; row 1 has only a hard (1) and an easy (9)
    # negative: the fallback is the hardest, loss 1.5 (TensorFlow Addons would take the easy
    # one, farther than the positive though beyond the margin: loss 0)
    neg = t([[[1.0, 0.2]], [[10.0, -1.0]]])
    got = L.triplet_loss(t(TA), t(TP), neg, strategy="semi_hard", distance="l1", margin=0.5)
    assert got.item() == pytest.approx((0.3 + 1.5) / 2, abs=1e-5)


def test_triplet_l2() -> None:
    # a0 = (0, 0), p0 = (3, 4): 5; a1 = (0, 10), p1 = (0, 11): 1
    # batch: row 0 <- p1 at 11, row 1 <- p0 at sqrt(45): both easy
    # own: row 0 (-3, -4) at 5 -> 0 + .5 = .5; row 1 (0, 10.5) at .5 -> 1 - .5 + .5 = 1
    a, p = t([[0.0, 0.0], [0.0, 10.0]]), t([[3.0, 4.0], [0.0, 11.0]])
    n = t([[[-3.0, -4.0]], [[0.0, 10.5]]])
    for strategy in ("batch_all", "hard"):
        got = L.triplet_loss(a, p, n, strategy=strategy, distance="l2", margin=0.5)
        assert got.item() == pytest.approx(0.75, abs=1e-5)


def test_triplet_cosine_with_labels() -> None:
    # a = (1,0), (0,1), (1,0); p = (1,0), (0,1), (3,4) -> cos(a2, p2) = .6; d = 1 - cos
    # d_ap = 0, 0, .4; margin .5
    # without labels: row 0 <- p2 at .4 (loss .1), p1 at 1; row 1 <- p0 at 1, p2 at .2 (.3);
    #                 row 2 <- p0 at 0 (.9), p1 at 1
    a = t([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    p = t([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    assert L.triplet_loss(a, p).item() == pytest.approx((0.1 + 0.3 + 0.9) / 3, abs=1e-5)
    # labels (0, 1, 0): rows 0 and 2 are not negatives of each other -> only row 1's .3 left
    labels = torch.tensor([0, 1, 0])
    assert L.triplet_loss(a, p, labels=labels).item() == pytest.approx(0.3, abs=1e-5)
    # hard with labels: row 0 -> p1 at 1 (0), row 1 -> p2 at .2 (.3), row 2 -> p1 at 1 (0)
    got = L.triplet_loss(a, p, strategy="hard", labels=labels)
    assert got.item() == pytest.approx(0.3 / 3, abs=1e-5)


def test_triplet_no_violation_and_no_negative_give_a_differentiable_zero() -> None:
    a = t([[1.0, 0.0], [0.0, 1.0]]).requires_grad_()
    p = t([[1.0, 0.0], [0.0, 1.0]])
    got = L.triplet_loss(a, p, margin=0.5)          # d_ap 0, d_an 1: nothing violates
    assert got.item() == 0.0
    got.backward()
    single = t([[1.0, 0.0]]).requires_grad_()
    for strategy in L.TRIPLET_STRATEGIES:
        zero = L.triplet_loss(single, t([[0.0, 1.0]]), strategy=strategy)
        assert zero.item() == 0.0
        zero.backward()


def test_triplet_padded_and_own_positive_negatives_are_not_candidates() -> None:
    # the l1 case above with row 0's second negative padding and row 1's first a positive of
    # its own question: the hardest left are (1, .2) at 1.2 for row 0 (loss .3) and (12, .3)
    # at 2.3 for row 1 (loss .2); the batch negatives stay easy
    mask = torch.tensor([[True, False], [True, True]])
    negative_ids = torch.tensor([[-1, -1], [1, -1]])
    got = L.triplet_loss(t(TA), t(TP), t(TN), strategy="hard", distance="l1", margin=0.5,
                         labels=torch.tensor([0, 1]), negative_mask=mask, negative_ids=negative_ids)
    assert got.item() == pytest.approx((0.3 + 0.2) / 2, abs=1e-5)
    # every negative of a row masked: its candidates are the other rows' positives only
    none = L.triplet_loss(t(TA), t(TP), t(TN), strategy="hard", distance="l1", margin=0.5,
                          negative_mask=torch.zeros(2, 2, dtype=torch.bool))
    assert none.item() == pytest.approx(0.0)


# -- cosine_bce -----------------------------------------------------------------------

def test_cosine_bce_hand_computed() -> None:
    # cos = .6 (label 1), 0 (label 0), -.707 -> score 0 clamped to 1e-6 (label 0)
    a = t([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = t([[3.0, 4.0], [0.0, 1.0], [-1.0, 1.0]])
    expected = (-math.log(0.6) - math.log(1 - 1e-6) - math.log(1 - 1e-6)) / 3
    got = L.cosine_bce_loss(a, b, t([1.0, 0.0, 0.0]))
    assert got.item() == pytest.approx(expected, abs=1e-5)
    # a positive pair at cos <= 0 costs -log(1e-6), finite
    worst = L.cosine_bce_loss(a[2:], b[2:], t([1.0]))
    assert worst.item() == pytest.approx(-math.log(1e-6), rel=1e-3)


# -- smooth cosine and the ordinal loss -----------------------------------------------

def test_smooth_cosine() -> None:
    got = L.smooth_cosine(t([[3.0, 4.0], [1.0, 0.0]]), t([[6.0, 8.0], [0.0, 1.0]]), eps=0.01)
    assert got.tolist() == pytest.approx([50 / (5 * 10 + 0.01), 0.0], abs=1e-6)
    # bounded gradient at a zero vector, where the plain cosine has none
    z = torch.zeros(1, 2, requires_grad=True)
    L.smooth_cosine(z, t([[1.0, 0.0]]), eps=0.01).sum().backward()
    assert torch.isfinite(z.grad).all() and z.grad[0, 0].item() == pytest.approx(1 / 0.01, rel=1e-4)


# cos .6 grade 3: below t3 = .75 by .15; cos .6 grade 0: above .25 by .35 and .5 by .1;
# cos 0 grade 1: below .25 by .25
SA = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
SB = [[0.6, 0.8], [3.0, 4.0], [0.0, 2.0]]


@pytest.mark.parametrize("power, expected", [
    (2.0, (0.15 ** 2 + 0.35 ** 2 + 0.1 ** 2 + 0.25 ** 2) / 3),
    (1.0, (0.15 + 0.35 + 0.1 + 0.25) / 3),
])
def test_smooth_ordinal_hand_computed(power: float, expected: float) -> None:
    got = L.smooth_ordinal_loss(t(SA), t(SB), torch.tensor([3, 0, 1]), thresholds=(0.25, 0.5, 0.75),
                                power=power, eps=1e-6)
    assert got.item() == pytest.approx(expected, abs=1e-5)


def test_smooth_ordinal_in_band_is_free_and_grades_are_checked() -> None:
    # cos .6 is inside (.5, .75): grade 2 costs nothing
    assert L.smooth_ordinal_loss(t(SA[:1]), t(SB[:1]), torch.tensor([2])).item() == 0.0
    with pytest.raises(L.LossInputError, match="0..3"):
        L.smooth_ordinal_loss(t(SA[:1]), t(SB[:1]), torch.tensor([4]))
    with pytest.raises(L.LossInputError):
        L.smooth_ordinal_loss(t(SA[:1]), t(SB[:1]), t([1.5]))
    # two thresholds: grades 0..2 (the paper's setting)
    got = L.smooth_ordinal_loss(t(SA[:1]), t(SB[:1]), torch.tensor([0]), thresholds=[0.3, 0.7], eps=1e-6)
    assert got.item() == pytest.approx(0.3 ** 2, abs=1e-5)


# -- simcse ---------------------------------------------------------------------------

def test_simcse_hand_computed() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    p = np.array([[1.0, 1.0], [0.0, 2.0]])
    n = np.array([[-1.0, 0.0], [1.0, 0.0]])
    r = math.sqrt(0.5)
    # cos over columns [p0, p1, n0, n1]: row 0 [r, 0, -1, 1]; row 1 [r, 1, 0, 0]; / .5
    expected = (ce(np.array([r, 0, -1, 1]) / 0.5, 0) + ce(np.array([r, 1, 0, 0]) / 0.5, 1)) / 2
    got = L.simcse_loss(t(a.tolist()), t(p.tolist()), t(n.tolist()), temperature=0.5)
    assert got.item() == pytest.approx(expected, abs=1e-5)
    no_neg = (ce(np.array([r, 0]) / 0.5, 0) + ce(np.array([r, 1]) / 0.5, 1)) / 2
    assert L.simcse_loss(t(a.tolist()), t(p.tolist()), temperature=0.5).item() == pytest.approx(no_neg, abs=1e-5)


def test_simcse_masks_repeated_rows_and_padded_negatives() -> None:
    # the same premise and entailment twice in a batch: unmasked, each row ties with the other
    # (log 2); masked by positive_ids, no negative is left
    a = t([[1.0, 0.0], [1.0, 0.0]])
    assert L.simcse_loss(a, a, temperature=0.05).item() == pytest.approx(math.log(2), abs=1e-5)
    assert L.simcse_loss(a, a, temperature=0.05, positive_ids=torch.tensor([3, 3])).item() == pytest.approx(0.0)
    # padded and own-positive hard negatives are not columns (as in ranking_loss)
    r = math.sqrt(0.5)
    a2, p2 = t([[1.0, 0.0], [0.0, 1.0]]), t([[1.0, 1.0], [0.0, 2.0]])
    hn = t([[[-1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [5.0, 5.0]]])
    mask = torch.tensor([[True, True], [True, False]])
    negative_ids = torch.tensor([[-1, 1], [-1, -1]])   # n01 = (0, 1) is row 1's positive
    # row 0 columns [p0, p1, n00, n01, n10]: [r, 0, -1, 0, 1]; row 1 drops n01: [r, 1, 0, 0]
    expected = (ce(np.array([r, 0, -1, 0, 1]) / 0.5, 0) + ce(np.array([r, 1, 0, 0]) / 0.5, 1)) / 2
    got = L.simcse_loss(a2, p2, hn, temperature=0.5, negative_mask=mask, negative_ids=negative_ids)
    assert got.item() == pytest.approx(expected, abs=1e-5)


# -- cross-encoder losses -------------------------------------------------------------

def test_pointwise_bce_hand_computed() -> None:
    # logit 0, label .5: log 2; logit 2, label 1: -log sigmoid(2) = log(1 + e^-2)
    got = L.pointwise_bce(t([0.0, 2.0]), t([0.5, 1.0]))
    assert got.item() == pytest.approx((math.log(2) + math.log(1 + math.exp(-2))) / 2, abs=1e-6)
    with pytest.raises(L.LossInputError):
        L.pointwise_bce(t([0.0]), t([1.5]))


def test_ranknet_hand_computed_with_mask() -> None:
    # query 0: scores (2, 1, 0), labels (2, 0, 1): pairs (0,1) diff 1, (0,2) diff 2, (2,1) diff -1
    # query 1: scores (0, 5, -1), labels (1, 0, 3), candidate 2 padded: pair (0,1) diff -5
    scores = t([[2.0, 1.0, 0.0], [0.0, 5.0, -1.0]])
    labels = t([[2.0, 0.0, 1.0], [1.0, 0.0, 3.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    terms = [math.log(1 + math.exp(-d)) for d in (1, 2, -1, -5)]
    assert L.ranknet_loss(scores, labels, mask).item() == pytest.approx(sum(terms) / 4, abs=1e-5)
    # without the mask, candidate 2 of query 1 adds pairs (2,0) diff -1 and (2,1) diff -6
    terms += [math.log(1 + math.exp(1)), math.log(1 + math.exp(6))]
    assert L.ranknet_loss(scores, labels).item() == pytest.approx(sum(terms) / 6, abs=1e-5)


def test_ranknet_without_pairs_is_a_differentiable_zero() -> None:
    s = t([[1.0, 2.0]]).requires_grad_()
    got = L.ranknet_loss(s, t([[1.0, 1.0]]))
    assert got.item() == 0.0
    got.backward()


def test_listwise_hand_computed_mask_and_rows_without_positives() -> None:
    # row 0: targets (0, .5, .5): loss = lse(1, 2, 3) - (2 + 3) / 2
    # row 1: candidate 2 padded; targets (1, 0): loss = -log softmax(0, 0)[0] = log 2
    # row 2: no positive label: skipped
    scores = t([[1.0, 2.0, 3.0], [0.0, 0.0, 9.0], [5.0, 5.0, 5.0]])
    labels = t([[0.0, 1.0, 1.0], [1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
    lse = math.log(math.e + math.e ** 2 + math.e ** 3)
    got = L.listwise_ce(scores, labels, mask)
    assert got.item() == pytest.approx((lse - 2.5 + math.log(2)) / 2, abs=1e-5)
    assert torch.isfinite(got)
    empty = L.listwise_ce(scores[2:].clone().requires_grad_(), labels[2:])
    assert empty.item() == 0.0
    empty.backward()


# -- monitoring -----------------------------------------------------------------------

def test_alignment_and_uniformity() -> None:
    # pairs: (1,0)-(0,1) at squared distance 2, (0,1)-(0,2) at 0 after normalising
    assert float(L.alignment(t([[1.0, 0.0], [0.0, 1.0]]), t([[0.0, 1.0], [0.0, 2.0]]))) == pytest.approx(1.0)
    # (1,0), (-1,0), (0,1): squared distances 4, 2, 2
    expected = math.log((math.exp(-8) + 2 * math.exp(-4)) / 3)
    assert float(L.uniformity(t([[1.0, 0.0], [-1.0, 0.0], [0.0, 3.0]]))) == pytest.approx(expected, abs=1e-5)


# -- a few optimiser steps lower every loss -------------------------------------------

def _bi_case(name: str) -> tuple[list["torch.nn.Parameter"], Callable[[], "torch.Tensor"]]:
    """A tiny embedding table and the loss on fixed rows of it."""
    g = torch.Generator().manual_seed(0)
    table = torch.nn.Parameter(torch.randn(24, 8, generator=g))
    rows = torch.arange(6)

    def emb(offset: int) -> "torch.Tensor":
        return table[rows + offset]

    cases: dict[str, Callable[[], torch.Tensor]] = {
        "ranking": lambda: L.ranking_loss(emb(0), emb(6), emb(12).unsqueeze(1), scale=5.0),
        "triplet": lambda: L.triplet_loss(emb(0), emb(6), emb(12).unsqueeze(1), strategy="batch_all"),
        # b starts near a: max(0, cos) has no gradient for a positive pair at cos <= 0
        "cosine_bce": lambda: L.cosine_bce_loss(emb(0), emb(0) + 0.5 * emb(6), t([1, 0, 1, 0, 1, 0])),
        "smooth_ordinal": lambda: L.smooth_ordinal_loss(emb(0), emb(6), torch.tensor([0, 1, 2, 3, 0, 3])),
        "simcse": lambda: L.simcse_loss(emb(0), emb(6), emb(12), temperature=0.1),
    }
    return [table], cases[name]


def _cross_case(name: str) -> tuple[list["torch.nn.Parameter"], Callable[[], "torch.Tensor"]]:
    """A linear scorer on fixed random features of 4 queries x 5 candidates."""
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(4, 5, 6, generator=g)
    labels = torch.randint(0, 3, (4, 5), generator=g).float()
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[0, 4] = False
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 1)

    def scores() -> "torch.Tensor":
        return lin(feats).squeeze(-1)

    cases: dict[str, Callable[[], torch.Tensor]] = {
        "pointwise_bce": lambda: L.pointwise_bce(scores(), labels / 2),
        "ranknet": lambda: L.ranknet_loss(scores(), labels, mask),
        "listwise": lambda: L.listwise_ce(scores(), labels, mask),
    }
    return list(lin.parameters()), cases[name]


def _adam(params: list["torch.nn.Parameter"], loss_fn: Callable[[], "torch.Tensor"], steps: int, lr: float,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """Plain Adam (Kingma & Ba). torch.optim's first step imports torch._dynamo, which alone
    takes about 2 s; this file stays fast without it."""
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step in range(1, steps + 1):
        for p in params:
            p.grad = None
        loss_fn().backward()
        with torch.no_grad():
            for p, m_p, v_p in zip(params, m, v):
                m_p.mul_(betas[0]).add_(p.grad, alpha=1 - betas[0])
                v_p.mul_(betas[1]).addcmul_(p.grad, p.grad, value=1 - betas[1])
                m_hat = m_p / (1 - betas[0] ** step)
                v_hat = v_p / (1 - betas[1] ** step)
                p.sub_(lr * m_hat / (v_hat.sqrt() + eps))


@pytest.mark.parametrize("name", list(L.LOSSES))
def test_a_few_steps_lower_the_loss(name: str) -> None:
    params, loss_fn = (_bi_case if L.LOSSES[name].model == "bi" else _cross_case)(name)
    start = loss_fn().item()
    _adam(params, loss_fn, steps=30, lr=0.05)
    end = loss_fn().item()
    assert math.isfinite(end) and end < 0.8 * start, (name, start, end)


# -- registry and options -------------------------------------------------------------

def test_registry_entries_match_their_functions() -> None:
    assert set(L.LOSSES) == {"ranking", "triplet", "cosine_bce", "smooth_ordinal", "simcse",
                             "pointwise_bce", "ranknet", "listwise"}
    for name, spec in L.LOSSES.items():
        assert spec.name == name and spec.model in ("bi", "cross")
        assert spec.needs in ("pairs", "triplets", "labelled", "graded", "lists")
        keyword_only = {p.name for p in inspect.signature(spec.fn).parameters.values()
                        if p.kind is inspect.Parameter.KEYWORD_ONLY
                        and p.name not in ("positive_ids", "labels", "negative_mask", "negative_ids")}
        assert set(spec.options) == keyword_only, name
    assert L.get_loss("triplet").fn is L.triplet_loss
    assert L.get_loss("ranknet").model == "cross"


def test_unknown_loss_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="ranking.*listwise"):
        L.get_loss("contrastive")
    with pytest.raises(ConfigError, match="known"):
        L.check_options("nope", {})


@pytest.mark.parametrize("name, options, message", [
    ("ranking", {"temperature": 0.1}, "no option 'temperature'; its options: scale, margin, symmetric"),
    ("ranknet", {"scale": 1}, "its options: none"),
    ("ranking", {"scale": 0}, "> 0"),
    ("ranking", {"scale": True}, "number"),
    ("ranking", {"scale": "20"}, "number"),
    ("ranking", {"margin": -0.1}, ">= 0"),
    ("ranking", {"symmetric": "yes"}, "true or false"),
    ("triplet", {"strategy": "hardest"}, "batch_all, hard, semi_hard"),
    ("triplet", {"distance": "cos"}, "cosine, l2, l1"),
    ("triplet", {"margin": float("nan")}, "number"),
    ("simcse", {"temperature": -1}, "> 0"),
    ("smooth_ordinal", {"thresholds": [0.5, 0.25]}, "increasing"),
    ("smooth_ordinal", {"thresholds": [0.5, 1.5]}, r"\[-1, 1\]"),
    ("smooth_ordinal", {"thresholds": "0.5"}, "list"),
    ("smooth_ordinal", {"thresholds": []}, "list"),
    ("smooth_ordinal", {"power": 0.5}, ">= 1"),
    ("smooth_ordinal", {"eps": 0}, "> 0"),
])
def test_check_options_rejects(name: str, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        L.check_options(name, options)


def test_check_options_accepts_and_cleans() -> None:
    assert L.check_options("ranking", {"scale": 20, "symmetric": True}) == {"scale": 20.0, "symmetric": True}
    assert L.check_options("smooth_ordinal", {"thresholds": [0, 0.5]}) == {"thresholds": (0.0, 0.5)}
    assert L.check_options("listwise", {}) == {}


def test_functions_validate_their_options_too() -> None:
    a = t([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ConfigError):
        L.triplet_loss(a, a, strategy="hardest")
    with pytest.raises(ConfigError):
        L.ranking_loss(a, a, scale=-1.0)
    with pytest.raises(ConfigError):
        L.simcse_loss(a, a, temperature=0.0)
    with pytest.raises(L.LossInputError):
        L.ranking_loss(a, a[:1])
    with pytest.raises(L.LossInputError):
        L.ranking_loss(a, a, positive_ids=torch.tensor([1, 2, 3]))
