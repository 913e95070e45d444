"""Translation consensus on XQuAD-R, by exact search over the encoded pool (no index).

What it measures (the figures of the README's "Modes" section that ``vecplug eval`` does not
give):

* the centred cosine of translation pairs (the same sentence in two languages) against random
  pairs of sentences: what ``search.consensus_threshold`` separates;
* consensus settings (threshold, weights) scored on two halves of the questions (those of
  even- and of odd-numbered paragraphs), each regrouping the best ``--depth`` candidates of
  each language, as the library does;
* a cascade that sends only the queries the student is least sure of to the teacher reranker:
  the share of the teacher's X-Y and mono gain recovered against the share of queries sent
  (simulated: the teacher's vectors of every query are computed, each query uses them or not).

Evaluation data only: nothing is trained. Usage::

    python benchmarks/consensus_probe.py [--langs ar de ...] [--depth 40] [--json out.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import header_markdown, machine_info, save_json  # noqa: E402
from xquad_data import load_xquad_r, parse_langs  # noqa: E402

from vecplug.adapters.bias import LanguageStats  # noqa: E402
from vecplug.adapters.consensus import consensus_scores  # noqa: E402
from vecplug.indexer.encoder import Encoder  # noqa: E402
from vecplug.metrics import average_precision_at_k, reciprocal_rank_at_k  # noqa: E402

SETTINGS = [(0.4, (0.2, 0.3, 0.5)), (0.3, (0.2, 0.3, 0.5)), (0.5, (0.2, 0.3, 0.5)),
            (0.4, (0.5, 0.5, 0.0)), (0.4, (0.3, 0.0, 0.7)), (0.4, (0.0, 0.3, 0.7))]


def regrouped(scores: np.ndarray, centred: np.ndarray, doc_langs: np.ndarray, depth: int,
              threshold: float, weights: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """(candidates, their consensus scores): the best ``depth`` of each language, regrouped."""
    cands = np.concatenate([np.flatnonzero(doc_langs == lang)[np.argsort(-scores[doc_langs == lang])[:depth]]
                            for lang in np.unique(doc_langs)])
    return cands, consensus_scores(scores[cands], centred[cands], list(doc_langs[cands]), threshold, weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--langs", nargs="*")
    ap.add_argument("--depth", type=int, default=40, help="candidates of each language regrouped")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    data = load_xquad_r(langs=parse_langs(args.langs))
    sents, questions = data.sentences(), data.questions()
    position = {s.doc_id: i for i, s in enumerate(sents)}
    relevant = [{position[d] for d in data.relevant[q.qid].values()} for q in questions]
    same = [position[data.relevant[q.qid][q.lang]] for q in questions]
    doc_langs = np.asarray([s.lang for s in sents])
    q_langs = [q.lang for q in questions]
    info = machine_info()
    print(header_markdown("Translation consensus on XQuAD-R (exact search)", info))

    t0 = time.perf_counter()
    teacher = Encoder.from_specs("me5-small")
    student = Encoder.from_specs("me5-small", "me5-small-student-k6")
    docs = teacher.encode_documents([s.text for s in sents], progress=False)
    texts = [q.text for q in questions]
    queries = {"teacher": teacher.encode_queries(texts, progress=False),
               "student": student.encode_queries(texts, progress=False)}
    print(f"- encoded {len(sents):,} sentences and {len(texts):,} questions twice in {time.perf_counter() - t0:.0f} s; "
          f"exact search; depth {args.depth} per language")
    stats = LanguageStats(docs.shape[1])
    stats.add(list(doc_langs), docs)
    means = stats.means()
    centred = means.centre(docs, list(doc_langs))
    scores = {name: means.centre(q, q_langs) @ centred.T for name, q in queries.items()}
    out: dict = {"machine": info, "depth": args.depth}

    # translation pairs: the same sentence of a paragraph in two languages
    by_key: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(sents):
        by_key.setdefault((s.para, s.index), []).append(i)
    pairs = [(a, b) for group in by_key.values() for a in group for b in group
             if a < b and doc_langs[a] != doc_langs[b]]
    trans = np.asarray([centred[a] @ centred[b] for a, b in pairs])
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(sents), size=(20000, 2))
    rand = np.asarray([centred[a] @ centred[b] for a, b in picks if doc_langs[a] != doc_langs[b]])
    out["translation_pairs"] = {f"p{p}": float(np.percentile(trans, p)) for p in (10, 50, 90)}
    out["random_pairs"] = {f"p{p}": float(np.percentile(rand, p)) for p in (50, 99)}
    print(f"\ncentred cosine, translation pairs ({len(trans):,}; sentence indices of one paragraph, "
          f"so a few are not translations): p10 {out['translation_pairs']['p10']:.3f}, p50 "
          f"{out['translation_pairs']['p50']:.3f}, p90 {out['translation_pairs']['p90']:.3f}; random "
          f"pairs of two languages ({len(rand):,}): p50 {out['random_pairs']['p50']:.3f}, p99 "
          f"{out['random_pairs']['p99']:.3f}")

    halves = [np.asarray([q.para % 2 == h for q in questions]) for h in (0, 1)]
    print("\n| query encoder | threshold | weights (own, mean, best) | X-Y mAP@20 even / odd | X-Y MRR@10 even / odd |")
    print("| --- | ---: | --- | ---: | ---: |")
    out["settings"] = []
    for name, s in scores.items():
        rows = [("-", None)] + [(t, w) for t, w in SETTINGS]
        for threshold, weights in rows:
            aps, rrs = [], []
            for i in range(len(questions)):
                if weights is None:
                    ranked = np.argsort(-s[i])[:20]
                else:
                    cands, new = regrouped(s[i], centred, doc_langs, args.depth, threshold, weights)
                    ranked = cands[np.argsort(-new, kind="stable")[:20]]
                aps.append(average_precision_at_k(list(ranked), relevant[i]))
                rrs.append(reciprocal_rank_at_k(list(ranked), relevant[i]))
            aps_a, rrs_a = np.asarray(aps), np.asarray(rrs)
            row = {"encoder": name, "threshold": threshold, "weights": weights,
                   "map@20": [float(aps_a[h].mean()) for h in halves],
                   "mrr@10": [float(rrs_a[h].mean()) for h in halves]}
            out["settings"].append(row)
            print(f"| {name} | {threshold} | {weights or 'no consensus'} | {row['map@20'][0]:.3f} / "
                  f"{row['map@20'][1]:.3f} | {row['mrr@10'][0]:.3f} / {row['mrr@10'][1]:.3f} |")

    # cascade: the student's top 50 rescored by the teacher for the least sure queries
    st, te = scores["student"], scores["teacher"]
    same_lang = doc_langs[None, :] == np.asarray(q_langs)[:, None]
    mono = np.where(same_lang, st, -np.inf)
    top2 = -np.sort(-mono, axis=1)[:, :2]
    margin = top2[:, 0] - top2[:, 1]

    def quality(use_teacher: np.ndarray) -> tuple[float, float]:
        aps, rrs = [], []
        for i in range(len(questions)):
            cands = np.argsort(-st[i])[:50]
            if use_teacher[i]:
                cands = cands[np.argsort(-te[i, cands], kind="stable")]
            aps.append(average_precision_at_k(list(cands), relevant[i]))
            m = np.where(same_lang[i], te[i] if use_teacher[i] else st[i], -np.inf)
            rrs.append(reciprocal_rank_at_k(list(np.argsort(-m)[:10]), {same[i]}))
        return float(np.mean(aps)), float(np.mean(rrs))

    none, every = quality(np.zeros(len(texts), bool)), quality(np.ones(len(texts), bool))
    print("\ncascade (student first stage with the correction, top 50; teacher rerank for the queries "
          "with the smallest same-language margin between the student's first two answers):")
    print("\n| queries sent to the teacher | X-Y mAP@20 | share of the gain | mono MRR@10 | share of the gain |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    out["cascade"] = []
    for share in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        got = none if share == 0 else every if share == 1 else quality(margin < np.quantile(margin, share))
        gains = [(g - n) / (e - n) if e != n else 1.0 for g, n, e in zip(got, none, every)]
        out["cascade"].append({"share": share, "map@20": got[0], "mono_mrr@10": got[1],
                               "gain_map": gains[0], "gain_mrr": gains[1]})
        print(f"| {share:.0%} | {got[0]:.3f} | {gains[0]:.0%} | {got[1]:.3f} | {gains[1]:.0%} |")
    save_json(args.json, out)


if __name__ == "__main__":
    main()
