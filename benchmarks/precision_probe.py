"""bfloat16 against float32 (``model.precision``): speed and XQuAD-R quality, side by side.

``model.precision: auto`` computes the torch encoders in bfloat16 on a CPU with AMX
(``vecplug.indexer.precision``). This script shows what that costs and buys on this machine:

* documents: every XQuAD-R sentence (the pooled candidates, 6 languages) encoded by the
  document encoder in float32 and in bfloat16, on ``--threads`` threads, in chunks with the two
  interleaved chunk by chunk (the machine's drift falls on both), after an untimed warm-up;
* queries: one question at a time on one thread (what a user waits for), the encoders'
  traced graphs as a long-lived process runs them, every encoder in turn on each question;
* quality: exact X-Y mAP@20 over the pooled documents (LAReQA's measure), plain and with the
  language-bias correction (each document set's own language means), and mono MRR@10 (the
  question's language only; one relevant sentence, so mAP@10 is MRR@10), for each pairing of
  documents and queries that a setting produces: float32 with float32, bfloat16 with bfloat16,
  and each document set with the shipped student's int8 queries (``query_quantize: auto``).
  Retention is bfloat16's figure over float32's.

    .venv/bin/python benchmarks/precision_probe.py --json benchmarks/results/precision_probe.json

On a CPU without AMX, bfloat16 is emulated: the script still runs (slowly), which is the
measurement behind ``auto`` choosing float32 there. oneDNN's ``ONEDNN_MAX_CPU_ISA`` makes a
CPU with AMX behave like an older one (set before the process starts; the report names it):

    ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/precision_probe.py --documents-only --limit 1200
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    documents_interleaved, exact_map_at_k, header_markdown, interleaved, machine_info, markdown_table, percentile,
    run_main, x_y_map)
from xquad_data import DEFAULT_DATA_DIR  # noqa: E402

PRECISIONS = ("float32", "bfloat16")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="XQuAD-R folder")
    p.add_argument("--model", default="me5-small", help="document encoder (default: %(default)s)")
    p.add_argument("--student", default="me5-small-student-k6", help="query student (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="threads for the documents (default: %(default)s)")
    p.add_argument("--chunks", type=int, default=8, help="document chunks, interleaved (default: %(default)s)")
    p.add_argument("--latency-queries", type=int, default=300,
                   help="questions timed one at a time, spread over the languages (default: %(default)s)")
    p.add_argument("--limit", type=int,
                   help="N sentences and N questions, spread evenly over the languages (default: all)")
    p.add_argument("--cross-encoder", type=Path,
                   help="also a cross-encoder reranker (a trained folder, e.g. the one of "
                        "benchmarks/train_example.sh) in both precisions over the teacher's top candidates")
    p.add_argument("--rerank-questions", type=int, default=100,
                   help="questions per language the cross-encoder reranks (default: %(default)s)")
    p.add_argument("--rerank-depth", type=int, default=20, help="candidates reranked (default: %(default)s)")
    p.add_argument("--documents-only", action="store_true",
                   help="time the documents only (no queries, no quality): for emulated bfloat16")
    p.add_argument("--json", type=Path, help="save the results as JSON here")
    return p.parse_args(argv)


def _scores(queries: np.ndarray, docs: np.ndarray, doc_ids: np.ndarray, relevant: Sequence[set[str]],
            own: Sequence[set[str]], query_langs: Sequence[str], doc_langs: np.ndarray,
            means: Any) -> dict[str, float]:
    """X-Y mAP@20 plain and corrected (``relevant``: every language's answer sentence), mono
    MRR@10 (``own``: the answer sentence in the question's language; exact search)."""
    plain, corrected = x_y_map(queries, docs, means, means.centre(docs, list(doc_langs)), query_langs,
                               doc_ids, relevant)
    out = {"xy_map20": plain, "xy_map20_corrected": corrected}
    langs = np.asarray(query_langs)
    mono = []
    for lang in dict.fromkeys(query_langs):
        rows, cols = np.flatnonzero(langs == lang), np.flatnonzero(doc_langs == lang)
        mono.append((len(rows), exact_map_at_k(queries[rows] @ docs[cols].T, doc_ids[cols],
                                               [own[i] for i in rows], 10)))
    out["mono_mrr10"] = float(sum(n * v for n, v in mono) / sum(n for n, _ in mono))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from vecplug.adapters.bias import LanguageStats
    from vecplug.indexer.datasets import load_xquad_r
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.precision import amx_bf16

    torch.set_num_threads(args.threads)
    info = machine_info()
    data = load_xquad_r(args.data)
    sentences, questions = data.sentences(), data.questions()
    if args.limit:  # every n-th: the files come one language after another
        sentences = sentences[::max(1, len(sentences) // args.limit)][:args.limit]
        questions = questions[::max(1, len(questions) // args.limit)][:args.limit]
    # one Encoder per precision, each with the student (int8, as ``query_quantize: auto`` runs
    # it) and the document encoder; the teacher's own queries and the fp32/bf16 student too
    enc = {p: Encoder.from_specs(args.model, args.student, precision=p, threads=args.threads) for p in PRECISIONS}

    # -- documents, interleaved chunk by chunk
    texts = [s.text for s in sentences]
    doc_langs = np.array([s.lang for s in sentences])
    doc_ids = np.array([s.doc_id for s in sentences])
    vectors, seconds, tokens = documents_interleaved(enc, texts, args.chunks)
    documents = {p: {"docs_per_s": len(texts) / seconds[p], "tokens_per_s": tokens[p] / seconds[p],
                     "seconds": seconds[p]} for p in PRECISIONS}
    doc_cos = np.sum(vectors["float32"] * vectors["bfloat16"], axis=1)
    result: dict[str, Any] = {
        "machine": info, "amx_bf16": amx_bf16(), "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "model": args.model, "student": args.student, "threads": args.threads, "sentences": len(texts),
        "langs": sorted(set(doc_langs.tolist())),
        "documents": documents, "document_ratio": seconds["float32"] / seconds["bfloat16"],
        "document_cosine": {"mean": float(doc_cos.mean()), "min": float(doc_cos.min())}}
    if args.documents_only:
        return result
    teachers = {p: Encoder.from_specs(args.model, precision=p) for p in PRECISIONS}  # its own queries
    plain_student = {p: Encoder.from_specs(args.model, args.student, precision=p, query_quantize="none")
                     for p in PRECISIONS}

    # -- queries: every question, batched, for quality
    qtexts = [q.text for q in questions]
    query_langs = [q.lang for q in questions]
    relevant = [set(data.relevant[q.qid].values()) & set(doc_ids) for q in questions]
    own = [{data.relevant[q.qid][q.lang]} & set(doc_ids) for q in questions]
    torch.set_num_threads(1)
    query_encoders = {("teacher", p): teachers[p] for p in PRECISIONS}
    query_encoders.update({("student", p): plain_student[p] for p in PRECISIONS})
    query_encoders[("student", "int8")] = enc["float32"]  # the int8 student is float32 whatever the setting
    qvecs = {key: e.encode_queries(qtexts, progress=False) for key, e in query_encoders.items()}

    # -- latency: one question at a time, encoders in turn, after a warm-up that traces them;
    # on one thread, set again here: a model given ``threads`` sets torch's count as it loads
    # (the int8 student's Encoder has --threads, and its query model loaded just above)
    torch.set_num_threads(1)
    step = max(1, len(qtexts) // args.latency_queries)
    sample = qtexts[::step][:args.latency_queries]
    names = list(query_encoders)
    one = [lambda text, e=query_encoders[key]: e.encode_queries([text]) for key in names]
    interleaved(one, sample[:20])  # warm-up, untimed: the encoders trace their models here
    times = dict(zip(names, interleaved(one, sample)))
    traced = {key: query_encoders[key].query.graph is not None for key in names}

    # -- quality of each pairing
    means = {}
    for p in PRECISIONS:
        stats = LanguageStats(vectors[p].shape[1])
        stats.add(list(doc_langs), vectors[p])
        means[p] = stats.means()
    pairings = [("float32", ("teacher", "float32")), ("bfloat16", ("teacher", "bfloat16")),
                ("float32", ("student", "float32")), ("bfloat16", ("student", "bfloat16")),
                ("float32", ("student", "int8")), ("bfloat16", ("student", "int8"))]
    quality = [{"documents": d, "queries": f"{who} {p}",
                **_scores(qvecs[(who, p)], vectors[d], doc_ids, relevant, own, query_langs, doc_langs, means[d])}
               for d, (who, p) in pairings]
    latency = [{"queries": f"{who} {p}", "p50_ms": percentile(times[(who, p)], 50) * 1e3,
                "p95_ms": percentile(times[(who, p)], 95) * 1e3, "traced": traced[(who, p)],
                "cos_to_float32": (float(np.mean(np.sum(qvecs[(who, p)] * qvecs[(who, "float32")], axis=1)))
                                   if p != "float32" else None)} for who, p in names]
    result = {**result, "questions": len(qtexts), "latency_queries": len(sample), "quality": quality,
              "latency": latency}
    if args.cross_encoder:
        result["cross_encoder"] = _cross_encoder(args, qvecs[("teacher", "float32")], vectors["float32"],
                                                 doc_ids, texts, qtexts, query_langs, relevant)
    return result


def _cross_encoder(args: argparse.Namespace, queries: np.ndarray, docs: np.ndarray, doc_ids: np.ndarray,
                   texts: Sequence[str], qtexts: Sequence[str], query_langs: Sequence[str],
                   relevant: Sequence[set[str]]) -> dict[str, Any]:
    """The cross-encoder reranks the float32 teacher's top ``--rerank-depth`` (plain X-Y,
    exact) for the first ``--rerank-questions`` questions of each language, in each precision
    in turn query by query (``--threads`` threads, one query's pairs a call, as a search
    reranks them): ms per query, X-Y mAP@20 of the reranked lists, and how often the two
    precisions put the same candidate first."""
    import torch

    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker
    from vecplug.metrics import average_precision_at_k

    torch.set_num_threads(args.threads)
    rerankers = {p: CrossEncoderReranker(str(args.cross_encoder), precision=p, threads=args.threads)
                 for p in PRECISIONS}
    count: dict[str, int] = {}
    chosen = []
    for i, lang in enumerate(query_langs):
        if count.get(lang, 0) < args.rerank_questions:
            count[lang] = count.get(lang, 0) + 1
            chosen.append(i)
    depth = args.rerank_depth
    top = np.argsort(-(queries[chosen] @ docs.T), axis=1)[:, :depth]
    for reranker in rerankers.values():  # untimed warm-up: weights load, first batches plan
        reranker.score_pairs([(qtexts[chosen[0]], texts[j]) for j in top[0]])
    seconds = dict.fromkeys(PRECISIONS, 0.0)
    aps: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    first_stage, same_first = [], 0
    for row, i in enumerate(chosen):
        pairs = [(qtexts[i], texts[j]) for j in top[row]]
        firsts = {}
        for p in PRECISIONS[row % 2:] + PRECISIONS[:row % 2]:
            t0 = time.perf_counter()
            scores = rerankers[p].score_pairs(pairs)
            seconds[p] += time.perf_counter() - t0
            ranked = [str(doc_ids[top[row][j]]) for j in np.argsort(-scores, kind="stable")]
            aps[p].append(average_precision_at_k(ranked, relevant[i], 20))
            firsts[p] = ranked[0]
        first_stage.append(average_precision_at_k([str(doc_ids[j]) for j in top[row]], relevant[i], 20))
        same_first += firsts["float32"] == firsts["bfloat16"]
    return {"model": str(args.cross_encoder), "questions": len(chosen), "depth": depth,
            "first_stage_xy_map20": float(np.mean(first_stage)),
            "rows": {p: {"ms_per_query": seconds[p] / len(chosen) * 1e3, "xy_map20": float(np.mean(aps[p]))}
                     for p in PRECISIONS},
            "same_first": same_first / len(chosen)}


def render(r: dict[str, Any]) -> str:
    d = r["documents"]
    rows = [(p, f"{d[p]['docs_per_s']:.1f}", f"{d[p]['tokens_per_s']:,.0f}", f"{d[p]['seconds']:.1f}")
            for p in PRECISIONS]
    isa = r.get("onednn_max_cpu_isa")
    out = [
        header_markdown("bfloat16 against float32 (model.precision)", r["machine"]), "",
        f"- CPU has AMX bf16 (what `model.precision: auto` checks): {'yes' if r['amx_bf16'] else 'no'}"
        + (f"; oneDNN limited to {isa} (ONEDNN_MAX_CPU_ISA)" if isa else ""),
        f"- document encoder {r['model']}, query student {r['student']}; {r['sentences']:,} XQuAD-R "
        f"sentences (six languages)" + (f", {r['questions']:,} questions" if "questions" in r else ""), "",
        f"### Documents ({r['threads']} threads, float32 and bfloat16 interleaved chunk by chunk)", "",
        markdown_table(["precision", "docs/s", "tokens/s", "seconds"], rows), "",
        f"bfloat16 / float32: **{r['document_ratio']:.2f}x**; cosine of each document's two vectors: "
        f"mean {r['document_cosine']['mean']:.6f}, min {r['document_cosine']['min']:.6f}.", ""]
    if "quality" not in r:  # --documents-only
        return "\n".join(out)
    q = {(x["documents"], x["queries"]): x for x in r["quality"]}

    def retained(key: str, base: tuple[str, str], new: tuple[str, str]) -> str:
        return f"{q[new][key] / q[base][key]:.2%}"

    quality = [(x["documents"], x["queries"], f"{x['xy_map20']:.4f}", f"{x['xy_map20_corrected']:.4f}",
                f"{x['mono_mrr10']:.4f}") for x in r["quality"]]
    kept = [(label, *(retained(k, base, new) for k in ("xy_map20", "xy_map20_corrected", "mono_mrr10")))
            for label, base, new in (
                ("teacher documents and queries", ("float32", "teacher float32"), ("bfloat16", "teacher bfloat16")),
                ("teacher documents, student queries", ("float32", "student float32"),
                 ("bfloat16", "student bfloat16")),
                ("teacher documents, int8 student queries (the default queries)",
                 ("float32", "student int8"), ("bfloat16", "student int8")))]
    lat = [(x["queries"], f"{x['p50_ms']:.2f}", f"{x['p95_ms']:.2f}", "yes" if x["traced"] else "no",
            "-" if x["cos_to_float32"] is None else f"{x['cos_to_float32']:.5f}") for x in r["latency"]]
    ce = r.get("cross_encoder")
    if ce:
        out_ce = [f"### Cross-encoder reranker ({ce['model']}; the float32 teacher's top {ce['depth']}, "
                  f"{ce['questions']} questions, {r['threads']} threads, the precisions in turn query by query)", "",
                  markdown_table(["precision", "ms per query", "X-Y mAP@20 reranked"],
                                 [(p, f"{x['ms_per_query']:.1f}", f"{x['xy_map20']:.4f}")
                                  for p, x in ce["rows"].items()]), "",
                  f"First stage alone: X-Y mAP@20 {ce['first_stage_xy_map20']:.4f}. The two precisions put the same "
                  f"candidate first for {ce['same_first']:.1%} of the questions.", ""]
    else:
        out_ce = []
    return "\n".join(out + [
        "### Quality (exact search; the correction uses each document set's own language means)", "",
        markdown_table(["documents", "queries", "X-Y mAP@20", "with the correction", "mono MRR@10"], quality), "",
        markdown_table(["bfloat16 keeps, of float32's", "X-Y mAP@20", "with the correction", "mono MRR@10"], kept), "",
        f"### One query at a time (1 thread, {r['latency_queries']} questions, encoders in turn on each; "
        "encode only, tokenising included)", "",
        markdown_table(["query encoder", "p50 ms", "p95 ms", "traced", "cosine to its float32"], lat), "",
        *out_ce])


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
