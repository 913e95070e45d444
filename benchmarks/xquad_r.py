"""XQuAD-R retrieval benchmark, scored the LAReQA way, through vecplug's public API.

Pool: every sentence of every paragraph of every language given (``--langs``, default all
files in ``--data``), indexed once into one hnswlib index with ``Index.add_documents``.
A question's relevant candidates: in each pool language L, the sentence of L's paragraph
whose ``sentence_breaks`` span holds L's ``answer_start`` for that question (located per
language, because translations are split into different numbers of sentences).

Settings (names as in ``../shared/README.md``):

* **X-Y** (pooled): ``store.search(q, k=20)`` over the whole pool (the HNSW graph); ``R``
  relevant sentences, one per pool language. The score is LAReQA's mAP@20::

      AP@20(q) = sum_{r <= 20, hit at r} precision@r / min(R, 20)
      mAP@20   = mean of AP@20 over all questions (of all languages)

  With ``--exact`` the pool is also ranked exactly to depth ``--exact-depth`` (``store.search``
  with every pool language as filter, which the hnswlib store answers by brute force) to
  give the un-cut mAP, sum over the R relevant of precision at their rank / R. Over the whole
  pool (depth 0) that is what ``sklearn.metrics.average_precision_score(labels, scores)``
  computes (barring score ties), the form used by public LAReQA evaluation scripts; at the
  default depth 1000, relevant sentences ranked deeper count 0, which lowers AP by at most
  R/1000 (0.006 with 6 languages). It also gives the ANN's recall@20 against the exact top 20.
* **X-X-mono** (the pool cut to the question's language): ``store.search(q, k=10,
  langs=[question language])``; one relevant sentence; MRR@10 (1/rank if found in the top 10,
  else 0) and P@1.
* **X-X-mono, detected language**: as ``Index.search(mode="mono")`` does without ``--lang``:
  the question's language comes from ``index.detector`` and a misdetection searches the
  wrong language (or an absent one: no results).
* **Language bias**: the share of the X-Y top 10 in the question's own language, beside the
  share of the pool in that language (what a language-blind ranking would give).

LAReQA's published figures (anchors.md) are for mBERT dual encoders fine-tuned on SQuAD and
its translations, 11 languages pooled; "En-En", "X-X", "X-X-mono" and "X-Y" there name
*training setups*, each scored on the same pooled X-Y task. This run pools fewer languages
(6 by default): fewer distractors and fewer relevant sentences per question, so the figures
are not directly comparable.

Evaluation only: nothing is trained on XQuAD-R.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # no-op when run as a script

from bench_common import (  # noqa: E402
    fmt, header_markdown, machine_info, markdown_table, pct, percentile, run_main)
from xquad_data import DEFAULT_DATA_DIR, XQuADR, load_xquad_r, parse_langs  # noqa: E402

from vecplug import metrics as _metrics  # noqa: E402
from vecplug.metrics import average_precision, average_precision_at_k  # noqa: E402

#: LAReQA (Roy et al. 2020), XQuAD-R, 11 languages pooled, mAP@20, per training setup.
LAREQA_ANCHORS: dict[str, float] = {"En-En": 0.29, "X-X": 0.23, "X-X-mono": 0.52, "X-Y": 0.66}
#: ../shared/docs/findings.md: me5-small teacher, 11 languages pooled, passages cut at 128.
FINDINGS_11_LANGS: dict[str, float] = {"xy_map20": 0.249, "mono_mrr10": 0.797, "mono_p1": 0.711,
                                       "same_lang_top10": 0.71}


# -- metrics ------------------------------------------------------------------------------
# The definitions live in vecplug.metrics (``vecplug eval`` scores with the same functions);
# AP@k is LAReQA's: precision at each relevant hit in the top k, over min(|relevant|, k).
# average_precision_at_k and reciprocal_rank_at_k are imported from here by students.py.

def reciprocal_rank_at_k(ranked: Sequence[str], relevant: str, k: int) -> float:
    """RR@k of the one relevant id (``vecplug.metrics`` takes a collection of ids)."""
    return _metrics.reciprocal_rank_at_k(ranked, {relevant}, k)


@dataclass
class Scores:
    """Per-question scores of one question language."""

    xy_ap: list[float] = field(default_factory=list)
    xy_recall: list[float] = field(default_factory=list)
    same_lang: list[float] = field(default_factory=list)
    mono_rr: list[float] = field(default_factory=list)
    mono_p1: list[float] = field(default_factory=list)
    #: the question's language as the detector saw it, and X-X-mono searched in that language
    langid_ok: list[float] = field(default_factory=list)
    mono_rr_detected: list[float] = field(default_factory=list)
    full_ap: list[float] = field(default_factory=list)
    exact_ap: list[float] = field(default_factory=list)
    ann_recall: list[float] = field(default_factory=list)
    #: candidate language -> 1/0 per question: its relevant sentence there is in the X-Y top k
    found: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def extend(self, other: "Scores") -> None:
        for name in ("xy_ap", "xy_recall", "same_lang", "mono_rr", "mono_p1", "langid_ok",
                     "mono_rr_detected", "full_ap", "exact_ap", "ann_recall"):
            getattr(self, name).extend(getattr(other, name))
        for lang, values in other.found.items():
            self.found[lang].extend(values)

    def summary(self) -> dict[str, Any]:
        def mean(v: list[float]) -> float | None:
            return float(np.mean(v)) if v else None

        return {"questions": len(self.xy_ap), "xy_map20": mean(self.xy_ap),
                "xy_recall20": mean(self.xy_recall), "same_lang_top": mean(self.same_lang),
                "mono_mrr10": mean(self.mono_rr), "mono_p1": mean(self.mono_p1),
                "langid_accuracy": mean(self.langid_ok), "mono_mrr10_detected": mean(self.mono_rr_detected),
                "full_map": mean(self.full_ap), "exact_map20": mean(self.exact_ap),
                "ann_recall20": mean(self.ann_recall),
                "found_by_lang": {lang: mean(v) for lang, v in sorted(self.found.items())}}


# -- the run ------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                   help="XQuAD-R folder (default: %(default)s)")
    p.add_argument("--langs", nargs="+", help="pool languages, e.g. 'en de' or 'en,de' (default: all files)")
    p.add_argument("--model", default="me5-small", help="document encoder spec (default: %(default)s)")
    p.add_argument("--query-model",
                   help="query encoder spec (default: the index's, else the student registered "
                        "for the document model, else the document model)")
    p.add_argument("--index", type=Path, help="index folder to build/keep (default: a temporary folder)")
    p.add_argument("--k-xy", type=int, default=20, help="X-Y cut-off for mAP (default: %(default)s)")
    p.add_argument("--k-mono", type=int, default=10, help="X-X-mono cut-off for MRR (default: %(default)s)")
    p.add_argument("--bias-k", type=int, default=10,
                   help="top-k whose same-language share is reported (default: %(default)s)")
    p.add_argument("--ef-search", type=int, help="hnswlib ef at search time (default: vecplug's)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--limit", type=int, help="only the first N questions of each language (smoke tests)")
    p.add_argument("--exact", action="store_true",
                   help="also rank the pool exactly: un-cut mAP and the ANN's recall@k")
    p.add_argument("--exact-depth", type=int, default=1000,
                   help="ranks kept by --exact (0: the whole pool; slow) (default: %(default)s)")
    p.add_argument("--json", type=Path, help="save the results as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (stderr)")
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


def check_pool(index: Any, expected: int, langs: Sequence[str]) -> None:
    """Refuse an index (from ``--index``) holding anything but this pool."""
    found = index.store.languages()
    extra = sorted(set(found) - set(langs))
    if index.store.count() != expected or extra:
        raise SystemExit(f"the index at {index.settings.index.path} holds {index.store.count()} documents "
                         f"in {found}, expected exactly the {expected} sentences of {', '.join(langs)}: "
                         "give an empty --index folder")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from vecplug.api import Index, settings_for
    from vecplug.types import Document

    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info()
    print(header_markdown("XQuAD-R retrieval (LAReQA scoring)", info), flush=True)

    try:
        data: XQuADR = load_xquad_r(args.data, args.langs)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    langs = data.langs
    sentences = data.sentences()
    questions = [q for lang in langs for q in data.by_lang[lang].questions[:args.limit or None]]
    pool_size = len(sentences)
    pool_share = {lang: len(data.by_lang[lang].sentences) / pool_size for lang in langs}

    tmp = None
    if args.index:
        index_dir = args.index
    else:
        tmp = tempfile.TemporaryDirectory(prefix="vecplug-xquad-r-")
        index_dir = Path(tmp.name) / "index"
    settings = settings_for(str(index_dir),
                            model={"document": args.model, "query": args.query_model,
                                   "threads": args.threads},
                            index={"store": "hnswlib", "hnsw_ef_search": args.ef_search})
    try:
        t0 = time.perf_counter()
        index = Index.open(settings, create=True)
        encoder = index.encoder
        encoder.document, encoder.query  # both are loaded on first use: load them outside the timings
        load_seconds = time.perf_counter() - t0
        # the graph's parameters as the store uses them (a reused index keeps its own), the
        # search breadth as set for this run, else the recorded one
        hnsw = index.store.parameters
        try:
            # -- indexing
            docs = [Document(id=s.doc_id, text=s.text, source=f"xquad-r/{s.lang}", position=s.index,
                             lang=s.lang) for s in sentences]
            report = index.add_documents(docs, progress=not args.no_progress)
            check_pool(index, pool_size, langs)

            # -- query encoding (batched)
            tokens_before = encoder.query.tokens_seen
            t0 = time.perf_counter()
            qvecs = encoder.encode_queries([q.text for q in questions], progress=not args.no_progress)
            query_seconds = time.perf_counter() - t0
            query_tokens = encoder.query.tokens_seen - tokens_before

            # -- search and scoring
            by_lang: dict[str, Scores] = {lang: Scores() for lang in langs}
            xy_times: list[float] = []
            mono_times: list[float] = []
            exact_times: list[float] = []
            store = index.store
            detector = index.detector
            for q, vec in zip(questions, qvecs):
                s = by_lang[q.lang]
                relevant_by_lang = data.relevant[q.qid]
                relevant = set(relevant_by_lang.values())

                t0 = time.perf_counter()
                hits = store.search(vec, args.k_xy, None)
                xy_times.append(time.perf_counter() - t0)
                ranked = [h.record.id for h in hits]
                s.xy_ap.append(average_precision_at_k(ranked, relevant, args.k_xy))
                s.xy_recall.append(len(relevant & set(ranked[:args.k_xy])) / len(relevant))
                top = hits[:args.bias_k]
                s.same_lang.append(sum(h.record.lang == q.lang for h in top) / max(len(top), 1))
                for lang, rid in relevant_by_lang.items():
                    s.found[lang].append(float(rid in ranked[:args.k_xy]))

                t0 = time.perf_counter()
                mono = store.search(vec, args.k_mono, [q.lang])
                mono_times.append(time.perf_counter() - t0)
                mono_ranked = [h.record.id for h in mono]
                s.mono_rr.append(reciprocal_rank_at_k(mono_ranked, relevant_by_lang[q.lang], args.k_mono))
                s.mono_p1.append(float(bool(mono_ranked) and mono_ranked[0] == relevant_by_lang[q.lang]))

                # what Index.search(mode="mono") does without --lang: detect, then filter
                detected = detector.detect(q.text)
                s.langid_ok.append(float(detected == q.lang))
                if detected == q.lang:
                    s.mono_rr_detected.append(s.mono_rr[-1])
                else:
                    other = [h.record.id for h in store.search(vec, args.k_mono, [detected])]
                    s.mono_rr_detected.append(
                        reciprocal_rank_at_k(other, relevant_by_lang[q.lang], args.k_mono))

                if args.exact:
                    t0 = time.perf_counter()
                    full = [h.record.id for h in store.search(vec, args.exact_depth or pool_size, langs)]
                    exact_times.append(time.perf_counter() - t0)
                    s.full_ap.append(average_precision(full, relevant))
                    s.exact_ap.append(average_precision_at_k(full, relevant, args.k_xy))
                    s.ann_recall.append(len(set(full[:args.k_xy]) & set(ranked[:args.k_xy])) / args.k_xy)
        finally:
            index.close()
    finally:
        if tmp is not None:
            tmp.cleanup()

    overall = Scores()
    for lang in langs:
        overall.extend(by_lang[lang])

    def ms(times: list[float]) -> dict[str, float] | None:
        if not times:
            return None
        return {"mean_ms": 1000 * float(np.mean(times)), "p50_ms": 1000 * percentile(times, 50),
                "p99_ms": 1000 * percentile(times, 99)}

    m = settings.model
    return {
        "benchmark": "xquad_r",
        "machine": info,
        "settings": {
            "data": str(args.data), "langs": langs, "model": args.model,
            "model_checksum": encoder.document.info.checksum, "encoder": encoder.describe(),
            "query_prefix": encoder.query_prefix, "document_prefix": encoder.document_prefix,
            "query_max_length": encoder.query_max_length, "document_max_length": encoder.document_max_length,
            "batch_tokens": m.batch_tokens, "store": "hnswlib",
            "hnsw": hnsw,
            "k_xy": args.k_xy, "k_mono": args.k_mono, "bias_k": args.bias_k,
            "limit": args.limit, "exact": args.exact, "exact_depth": args.exact_depth or pool_size,
            "index": str(args.index) if args.index else None,
        },
        "data": {
            "paragraphs": data.paragraphs,
            "candidates": {lang: len(data.by_lang[lang].sentences) for lang in langs},
            "questions": {lang: len(data.by_lang[lang].questions) for lang in langs},
            "questions_evaluated": len(questions),
            "pool_size": pool_size, "pool_share": pool_share,
            "sentence_count_differs_from_ref": data.sentence_count_mismatches(),
            "answer_index_differs_from_ref": data.answer_index_differences(),
        },
        "timing": {
            "model_load_seconds": load_seconds,
            "index": {**report.to_dict(),
                      "docs_per_s": report.documents / report.seconds if report.seconds else None,
                      "tokens_per_s": report.tokens / report.seconds if report.seconds else None,
                      "encode_tokens_per_s": (report.tokens / report.encode_seconds
                                              if report.encode_seconds else None)},
            "queries": {"queries": len(questions), "tokens": query_tokens, "seconds": query_seconds,
                        "queries_per_s": len(questions) / query_seconds if query_seconds else None,
                        "tokens_per_s": query_tokens / query_seconds if query_seconds else None},
            "search_xy": ms(xy_times), "search_mono": ms(mono_times), "search_exact": ms(exact_times),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "results": {"by_lang": {lang: by_lang[lang].summary() for lang in langs},
                    "overall": overall.summary()},
        "anchors": {"lareqa_11_langs_map20": LAREQA_ANCHORS, "findings_11_langs": FINDINGS_11_LANGS},
    }


# -- report -------------------------------------------------------------------------------

def render(r: dict[str, Any]) -> str:
    """The Markdown tables (without the machine header, printed first)."""
    st, d, t, res = r["settings"], r["data"], r["timing"], r["results"]
    langs = st["langs"]
    enc = st["encoder"]
    system = enc["document_encoder"] if enc["query_encoder"] == enc["document_encoder"] else \
        f"{enc['document_encoder']} + query {enc['query_encoder']}"
    ref = "en" if "en" in langs else langs[0]
    out: list[str] = [
        f"- document encoder {enc['document_encoder']} ({enc['document_encoder_checksum'][:12]}), "
        f"query encoder {enc['query_encoder']} ({enc['query_encoder_checksum'][:12]}), "
        f"prefixes {st['query_prefix']!r}/"
        f"{st['document_prefix']!r}, max length query {st['query_max_length']} / document "
        f"{st['document_max_length']}, hnswlib M={st['hnsw']['M']} ef_construction="
        f"{st['hnsw']['ef_construction']} ef_search={st['hnsw']['ef_search']}",
        f"- pool: {len(langs)} language{'s' * (len(langs) != 1)} ({' '.join(langs)}), "
        f"{d['pool_size']:,} candidate sentences "
        f"from {d['paragraphs']} parallel paragraphs; {d['questions_evaluated']:,} questions evaluated",
        "",
        "### Data",
        "",
        markdown_table(
            ["lang", "candidates", "questions", f"paragraphs split differently from {ref}",
             f"answers at another sentence index than {ref}"],
            [[lang, d["candidates"][lang], d["questions"][lang],
              d["sentence_count_differs_from_ref"][lang], d["answer_index_differs_from_ref"][lang]]
             for lang in langs]),
        "",
        "### Speed",
        "",
    ]
    ix, qs = t["index"], t["queries"]
    rows = [
        ["model load", "", "", f"{t['model_load_seconds']:.1f}", "", ""],
        ["indexing (add_documents, wall)", f"{ix['documents']:,} docs", f"{ix['tokens']:,}",
         f"{ix['seconds']:.1f}", f"{ix['docs_per_s']:.1f} docs/s", f"{ix['tokens_per_s']:,.0f}"],
        ["  of which encoding", "", "", f"{ix['encode_seconds']:.1f}",
         f"{ix['documents'] / ix['encode_seconds']:.1f} docs/s" if ix["encode_seconds"] else "",
         f"{ix['encode_tokens_per_s']:,.0f}" if ix["encode_tokens_per_s"] else ""],
        ["query encoding (batched)", f"{qs['queries']:,} queries", f"{qs['tokens']:,}",
         f"{qs['seconds']:.1f}", f"{qs['queries_per_s']:.1f} q/s", f"{qs['tokens_per_s']:,.0f}"],
    ]
    out.append(markdown_table(["step", "items", "tokens", "seconds", "throughput", "tokens/s"], rows,
                              "lrrrrr"))
    out.append("")
    out.append("Tokens are those the encoder ran (prefix and special tokens included, after truncation). "
               "Search latency per query (store.search only, vectors given):")
    out.append("")
    srows = []
    for name, key in ((f"X-Y k={st['k_xy']} (HNSW)", "search_xy"),
                      (f"X-X-mono k={st['k_mono']} (language filter, exact)", "search_mono"),
                      (f"exact ranking to depth {st['exact_depth']} (--exact)", "search_exact")):
        if t[key]:
            srows.append([name, *(fmt(t[key][f"{m}_ms"], 2) for m in ("mean", "p50", "p99"))])
    out.append(markdown_table(["search", "mean ms", "p50 ms", "p99 ms"], srows))
    out += ["", f"Load average at the end: {t['load_average_at_end']} (other processes share this machine: "
                "timings are only as quiet as it was)."]
    out += ["", "### Quality", ""]

    exact = st["exact"]
    headers = ["question lang", "questions", f"X-Y mAP@{st['k_xy']}", f"X-Y recall@{st['k_xy']}",
               f"same-lang share of top {st['bias_k']}", "pool share (unbiased)",
               f"mono MRR@{st['k_mono']}", "mono P@1", "langid ok",
               f"mono MRR@{st['k_mono']}, detected lang"]
    if exact:
        headers[4:4] = [f"X-Y mAP (exact, depth {st['exact_depth']})", f"exact mAP@{st['k_xy']}",
                        f"ANN recall@{st['k_xy']}"]

    def row(name: str, s: dict[str, Any], share: float) -> list[str]:
        cells = [name, f"{s['questions']:,}", fmt(s["xy_map20"]), fmt(s["xy_recall20"]),
                 pct(s["same_lang_top"]), pct(share), fmt(s["mono_mrr10"]), fmt(s["mono_p1"]),
                 pct(s["langid_accuracy"]), fmt(s["mono_mrr10_detected"])]
        if exact:
            cells[4:4] = [fmt(s["full_map"]), fmt(s["exact_map20"]), fmt(s["ann_recall20"])]
        return cells

    qrows = [row(lang, res["by_lang"][lang], d["pool_share"][lang]) for lang in langs]
    qrows.append(row("**all**", res["overall"],
                     sum(d["pool_share"][lang] * res["by_lang"][lang]["questions"] for lang in langs)
                     / max(res["overall"]["questions"], 1)))
    out.append(markdown_table(headers, qrows))
    out += ["", f"Share of questions whose relevant sentence in each candidate language is in the X-Y "
                f"top {st['k_xy']} (rows: question language; columns: candidate language):", ""]
    out.append(markdown_table(
        ["question \\ candidate", *langs],
        [[lang, *(pct(res["by_lang"][lang]["found_by_lang"][c], 0) for c in langs)] for lang in langs]
        + [["**all**", *(pct(res["overall"]["found_by_lang"][c], 0) for c in langs)]]))

    o = res["overall"]
    f11 = r["anchors"]["findings_11_langs"]
    la = r["anchors"]["lareqa_11_langs_map20"]
    out += ["", "### Beside the anchors", "",
            markdown_table(
                ["system", "pool", "X-Y mAP@20", "mono MRR@10", "mono P@1", "same-lang top 10"],
                [[f"vecplug {system} (this run)", f"{len(langs)} langs", fmt(o["xy_map20"]),
                  fmt(o["mono_mrr10"]), fmt(o["mono_p1"]), pct(o["same_lang_top"], 0)],
                 ["me5-small teacher (findings.md, doc max 128)", "11 langs", fmt(f11["xy_map20"]),
                  fmt(f11["mono_mrr10"]), fmt(f11["mono_p1"]), pct(f11["same_lang_top10"], 0)],
                 ["LAReQA mBERT, trained X-Y", "11 langs", fmt(la["X-Y"], 2), "", "", ""],
                 ["LAReQA mBERT, trained X-X-mono", "11 langs", fmt(la["X-X-mono"], 2), "", "", ""],
                 ["LAReQA mBERT, trained X-X", "11 langs", fmt(la["X-X"], 2), "", "", ""],
                 ["LAReQA mBERT, trained En-En", "11 langs", fmt(la["En-En"], 2), "", "", ""]],
                "llrrrr"),
            "",
            "LAReQA's En-En / X-X / X-X-mono / X-Y are mBERT dual encoders fine-tuned on SQuAD (and its "
            "translations) under those training setups; every LAReQA figure is the pooled X-Y mAP@20 over "
            "11 languages. None is a same-language-pool score, so the mono columns have no LAReQA "
            f"counterpart. Pooling {len(langs)} languages instead of 11 leaves fewer relevant sentences and "
            "fewer distractors per question: not directly comparable either."]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
