"""How far any rerank gate can go: the teacher's quality for how much of its cost.

A gated reranker (``search.rerank_gate``) answers every query with the student's search and
sends only some queries on to the teacher. Its cost is the student's search plus, for the
share ``g`` of queries sent on, a second search and a teacher pass; its quality depends on
*which* queries it sends. This script measures, on the pooled XQuAD-R set (X-Y, the index's
language-bias correction), the quality each way of choosing reaches at each share:

- ``oracle``: the queries whose mAP@20 the teacher raises most, first (it knows the answers: no
  gate can choose better, so its curve bounds every gate's);
- ``margin``: the shipped gate (:func:`vecplug.adapters.rerank.gate.margin`, smallest first);
- ``top score``: the student's best score, lowest first;
- ``learned``: a least-squares fit, on features of the student's top 10 (the list the shipped
  gate reads), of how much the teacher would change that top 10 (1 - overlap of the two top
  10s): no relevance judgements are used, so any sample of queries could train it; fitted on
  half of the questions and applied to the other half, both ways (a question's translations
  in one half);
- ``random``.

Then the share each needs for 97, 98 and 99% of the teacher's own X-Y mAP@20 (the teacher
searching alone, its queries quantised as the reranker's are), and what that share costs:
one query at a time on one thread, the student's search (``a``), the gated path with every
query sent on (``b``) and the teacher alone (``t``) are timed on ``--queries`` questions,
interleaved; a gate sending ``g`` costs ``a + g (b - a)``, given as a share of ``t``.

Usage::

    python benchmarks/gate_bound.py --index DIR [--student me5-small-student-k6]
        [--reranker teacher:int8] [--limit N] [--queries 300] [--json out.json]

Evaluation only: XQuAD-R is a development set, and the learned gate is fitted on half of it.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402
    header_markdown, interleaved, keeps_torch_threads, machine_info, markdown_table, measure_matmul_gflops,
    run_main)
from xquad_data import DEFAULT_DATA_DIR, parse_langs  # noqa: E402

SHARES = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8)
TARGETS = (0.97, 0.98, 0.99)
#: a gate above every margin: each query takes the gated path (first search, then the second)
EVERY = 1e9
#: how many of the student's top hits the gates read (the shipped gate reads the top 10)
TOP = 10
FEATURES = ("margin", "top score", "top - 2nd", "top - 10th", "top 10 spread", "languages in top 10",
            "query-language hits in top 10", "best in query language", "its lead", "its lead on the 3rd")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--index", type=Path, required=True, help="pooled XQuAD-R index folder (built if absent)")
    p.add_argument("--model", default="me5-small", help="document encoder (the teacher)")
    p.add_argument("--student", default="me5-small-student-k6", help="the first stage's query encoder")
    p.add_argument("--reranker", default="teacher:int8", choices=("teacher", "teacher:int8"))
    p.add_argument("--rerank-depth", type=int, default=50)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--langs", nargs="+")
    p.add_argument("--limit", type=int, help="the first N questions of each language (every document stays)")
    p.add_argument("--queries", type=int, default=300, help="questions timed one at a time (0: no timing)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


# -- the gates ----------------------------------------------------------------------------------

Hit = tuple[str, float, str | None]  # (id, score, language) of one result


def margin(hits: Sequence[Hit], lang: str | None) -> float:
    """The shipped gate's margin of a top list (the function the search calls)."""
    from vecplug.adapters.rerank.gate import margin as shipped

    return shipped([SimpleNamespace(score=s, record=SimpleNamespace(lang=l)) for _, s, l in hits], lang)


def features(hits: Sequence[Hit], lang: str | None) -> list[float]:
    """What a gate can read from the student's top ``TOP`` (``FEATURES``, in order)."""
    top = list(hits[:TOP])
    scores = np.array([s for _, s, _ in top], dtype=np.float64)
    same = [s for _, s, l in top if l == lang]
    floor = float(scores[-1])
    best = same[0] if same else floor
    return [margin(top, lang), float(scores[0]), float(scores[0] - scores[1]), float(scores[0] - floor),
            float(scores.std()), float(len({l for _, _, l in top})), float(len(same)), best,
            best - (same[1] if len(same) > 1 else floor), best - (same[2] if len(same) > 2 else floor)]


def overlap(a: Sequence[Hit], b: Sequence[Hit], k: int = TOP) -> float:
    """The share of ``a``'s top ``k`` ids in ``b``'s top ``k``."""
    return len({h[0] for h in a[:k]} & {h[0] for h in b[:k]}) / k


def fit_ridge(x: np.ndarray, y: np.ndarray, alpha: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares (ridge ``alpha``) of ``y`` on standardised ``x``: (mean, scale, weights)."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    a = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    w = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ y)
    return mu, sd, w


def predict(model: tuple[np.ndarray, np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    mu, sd, w = model
    return np.hstack([(x - mu) / sd, np.ones((len(x), 1))]) @ w


def cross_fitted(x: np.ndarray, y: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Each row's prediction by a fit on the other folds' rows only."""
    out = np.zeros(len(y))
    for f in np.unique(folds):
        out[folds == f] = predict(fit_ridge(x[folds != f], y[folds != f]), x[folds == f])
    return out


def halves(question_ids: Sequence[str]) -> np.ndarray:
    """Two folds of questions, a question's translations in one (XQuAD-R ids are ``lang:id``)."""
    import zlib

    return np.array([zlib.crc32(q.split(":", 1)[-1].encode()) % 2 for q in question_ids])


def orders(student: Sequence[Sequence[Hit]], reranked: Sequence[Sequence[Hit]], langs: Sequence[str | None],
           gain: np.ndarray, folds: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Each gate's order of the queries, the first sent to the teacher first."""
    x = np.array([features(h, l) for h, l in zip(student, langs)])
    change = np.array([1 - overlap(s, r) for s, r in zip(student, reranked)])
    n = len(gain)
    # ties broken by position: a stable sort keeps every order reproducible
    return {"oracle": np.argsort(-gain, kind="stable"),
            "margin": np.argsort(x[:, 0], kind="stable"),
            "top score": np.argsort(x[:, 1], kind="stable"),
            "learned": np.argsort(-cross_fitted(x, change, folds), kind="stable"),
            "random": np.random.default_rng(seed).permutation(n)}


def quality(order: np.ndarray, first: np.ndarray, second: np.ndarray, share: float) -> float:
    """Mean of ``second`` over the first ``share`` of ``order`` and of ``first`` elsewhere."""
    k = int(round(share * len(order)))
    return float((first.sum() + (second - first)[order[:k]].sum()) / len(order))


def share_needed(order: np.ndarray, first: np.ndarray, second: np.ndarray, target: float) -> float | None:
    """The least share of queries, sent in ``order``, whose mean reaches ``target`` (None: never)."""
    means = (first.sum() + np.concatenate([[0.0], np.cumsum((second - first)[order])])) / len(order)
    reached = np.flatnonzero(means >= target)
    return None if not len(reached) else float(reached[0] / len(order))


# -- the run ------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> dict[str, Any]:
    from vecplug.api import Index, settings_for
    from vecplug.indexer.datasets import load_xquad_r_dataset
    from vecplug.metrics import average_precision_at_k

    info = machine_info()
    data = load_xquad_r_dataset(args.data, args.langs).limited(args.limit)
    texts, langs = [q.text for q in data.queries], [q.lang for q in data.queries]
    ids = [q.id for q in data.queries]
    base = settings_for(str(args.index), model={"document": args.model})
    with Index.open(base, create=True) as index:  # unchanged documents are skipped
        index.add_documents(data.documents, progress=True)
        documents, debias = index.store.count(), bool(index.manifest.get("debias"))
    quantize = "int8" if args.reranker == "teacher:int8" else "none"
    student_model = {"document": args.model, "query": args.student}
    teacher_model = {"document": args.model, "query": args.model, "query_quantize": quantize}

    def lists(model: dict[str, Any], **how: Any) -> list[list[Hit]]:
        with Index.open(settings_for(str(args.index), model=model)) as index:
            found = index.search_batch(texts, 20, mode="xy", langs=langs, target_langs=(),
                                       rerank_depth=args.rerank_depth, **how)
        return [[(h.id, float(h.score), h.lang) for h in r.hits] for r in found]

    t0 = time.perf_counter()
    student = lists(student_model, rerank="none")
    reranked = lists(student_model, rerank=args.reranker)
    teacher = lists(teacher_model, rerank="none")
    searched = time.perf_counter() - t0

    def ap(hits: Sequence[Sequence[Hit]]) -> np.ndarray:
        return np.array([average_precision_at_k([h[0] for h in x], data.qrels[q], 20) for x, q in zip(hits, ids)])

    first, second, alone = ap(student), ap(reranked), ap(teacher)
    gates = orders(student, reranked, langs, second - first, halves(ids))
    curves = {name: {f"{s:g}": quality(o, first, second, s) for s in SHARES} for name, o in gates.items()}
    needed = {name: {f"{t:g}": share_needed(o, first, second, t * alone.mean()) for t in TARGETS}
              for name, o in gates.items()}
    timing = _timing(args, texts, student_model, teacher_model) if args.queries else None
    return {"benchmark": "gate_bound", "machine": info, "langs": args.langs, "documents": documents,
            "queries": len(ids), "debias": debias, "student": args.student, "reranker": args.reranker,
            "rerank_depth": args.rerank_depth, "searched_s": searched,
            "map@20": {"student": float(first.mean()), "reranked": float(second.mean()),
                       "teacher": float(alone.mean()), "best of both": float(np.maximum(first, second).mean())},
            "reranking": {"raises": float((second > first).mean()), "lowers": float((second < first).mean())},
            "shares": list(SHARES), "targets": list(TARGETS), "curves": curves, "needed": needed,
            "timing": timing}


@keeps_torch_threads
def _timing(args: argparse.Namespace, texts: Sequence[str], student_model: dict[str, Any],
            teacher_model: dict[str, Any]) -> dict[str, Any]:
    """Mean ms, one query at a time on one thread: the student's search, the gated path with
    every query sent on, the teacher alone; interleaved query by query."""
    import torch

    from vecplug.api import Index, settings_for

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    sample = [texts[i] for i in rng.choice(len(texts), min(args.queries, len(texts)), replace=False)]
    speed = {"before": measure_matmul_gflops(1)}
    with Index.open(settings_for(str(args.index), model={**student_model, "threads": 1})) as s, \
            Index.open(settings_for(str(args.index), model={**teacher_model, "threads": 1})) as t:
        fns = [lambda q: s.search(q, 10, mode="xy"),
               lambda q: s.search(q, 10, mode="xy", rerank=args.reranker, rerank_depth=args.rerank_depth,
                                  rerank_gate=EVERY),
               lambda q: t.search(q, 10, mode="xy")]
        for fn in fns:
            for q in sample[:20]:  # models load and warm up outside the clock
                fn(q)
        times = interleaved(fns, sample)
    speed["after"] = measure_matmul_gflops(1)
    a, b, t_ = (1e3 * float(np.mean(x)) for x in times)
    return {"queries": len(sample), "student_ms": a, "every_query_sent_ms": b, "teacher_ms": t_,
            "matmul_1_thread": speed}


def cost(share: float | None, timing: dict[str, Any] | None) -> float | None:
    """A gate's cost sending ``share`` of the queries, as a share of the teacher's (the model
    of the module docstring)."""
    if share is None or timing is None:
        return None
    a, b = timing["student_ms"], timing["every_query_sent_ms"]
    return (a + share * (b - a)) / timing["teacher_ms"]


def render(r: dict[str, Any]) -> str:
    m = r["map@20"]
    out = [header_markdown("How far any rerank gate can go", r["machine"]), "",
           f"Pooled XQuAD-R ({', '.join(r['langs'])}; {r['documents']:,} documents, {r['queries']:,} "
           f"questions), X-Y, language-bias correction {'on' if r['debias'] else 'off'}. First stage "
           f"{r['student']}; reranker {r['reranker']} (depth {r['rerank_depth']}). X-Y mAP@20: student "
           f"{m['student']:.4f}, every query reranked {m['reranked']:.4f}, the teacher alone "
           f"{m['teacher']:.4f}; the better of the two lists for each query {m['best of both']:.4f}. "
           f"Reranking raises {r['reranking']['raises']:.0%} of the questions' AP@20 and lowers "
           f"{r['reranking']['lowers']:.0%}.", "",
           "**X-Y mAP@20 as a share of the teacher's, by the share of queries sent to the teacher**", "",
           markdown_table(["gate"] + [f"{s:.0%} sent" for s in r["shares"]],
                          [[name] + [f"{v / m['teacher']:.1%}" for v in c.values()]
                           for name, c in r["curves"].items()], "l" + "r" * len(r["shares"])), ""]
    t = r["timing"]
    head = ["gate"] + [f"{x:.0%} of the teacher's mAP: sent" for x in r["targets"]]
    if t:
        head += [f"cost at {x:.0%}" for x in r["targets"]]
    rows = []
    for name, need in r["needed"].items():
        shares = list(need.values())
        row = [name] + ["never" if s is None else f"{s:.0%}" for s in shares]
        if t:
            row += ["-" if c is None else f"{c:.0%}" for c in (cost(s, t) for s in shares)]
        rows.append(row)
    out += ["**The share each gate needs, and its cost as a share of the teacher's**", "",
            markdown_table(head, rows, "l" + "r" * (len(head) - 1))]
    if t:
        speed = t["matmul_1_thread"]
        out += ["", f"Cost: one query at a time on one thread, {t['queries']} questions, interleaved, mean ms: "
                f"the student's search {t['student_ms']:.2f}, the gated path with every query sent on "
                f"{t['every_query_sent_ms']:.2f}, the teacher alone {t['teacher_ms']:.2f}; a gate sending g "
                f"costs student + g x (gated path - student). fp32 matrix multiply on one thread: "
                f"{speed['before']['median_gflops']:.0f} GFLOP/s before, {speed['after']['median_gflops']:.0f} after."]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
