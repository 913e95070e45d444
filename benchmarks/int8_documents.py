"""torch's int8 documents (``--int8-documents``) against float32 and bfloat16: speed and XQuAD-R quality.

Every XQuAD-R sentence (the pooled candidates) is encoded by the document encoder several ways,
in ``--chunks`` chunks with the sets interleaved chunk by chunk (the machine's drift falls on
all), after an untimed warm-up: float32, bfloat16 (``model.precision: auto`` with AMX) and the
documents' int8 recipe run by torch (``indexer.torch_int8_documents``: its float layers in
``--int8-precision``, its weights packed for oneDNN where AMX is; ``--int8-engines fbgemm
onednn`` makes one int8 set per kind of kernel, to compare them in one run). Quality: exact
X-Y mAP@20 over the pooled documents, plain and with the language-bias correction (each
document set's own language means), and mono MRR@10, with the float32 teacher's queries and
with the shipped student's int8 queries (what searches use). Retention is the int8 figure over
float32's: the issue's bar is 99%. ``--compile`` adds bfloat16 and int8 with the documents'
batches compiled by ``torch.compile`` (``model.compile``, ``indexer.compiled``).

    .venv/bin/python benchmarks/int8_documents.py --json benchmarks/results/int8_documents.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    documents_interleaved, header_markdown, machine_info, markdown_table, run_main)
from precision_probe import _scores  # noqa: E402
from xquad_data import DEFAULT_DATA_DIR  # noqa: E402

#: the int8 weights' kernels by ``--int8-engines`` name: what the encoder asks for as it packs them
ENGINES = {"fbgemm": lambda compiled=False: None, "onednn": lambda compiled=False: "onednn"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="XQuAD-R folder")
    p.add_argument("--model", default="me5-small", help="document encoder (default: %(default)s)")
    p.add_argument("--student", default="me5-small-student-k6", help="query student (default: %(default)s)")
    p.add_argument("--int8-precision", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the int8 documents' float layers (default: %(default)s, as --int8-documents)")
    p.add_argument("--int8-engines", nargs="+", default=["auto"], choices=("auto", "fbgemm", "onednn"),
                   help="the kernels the int8 weights are packed for, one int8 set each (default: auto: "
                        "oneDNN with AMX, else torch's default, FBGEMM)")
    p.add_argument("--compile", action="store_true",
                   help="also bfloat16 and int8 with the documents' batches compiled (model.compile: "
                        "torch.compile, indexer.compiled); their first batch, which compiles, is timed apart")
    p.add_argument("--inductor-cache", type=Path,
                   help="Inductor's cache folder for --compile (default: as model.compile has it, "
                        "$VECPLUG_HOME/cache/inductor); an empty one times a cold compilation")
    p.add_argument("--threads", type=int, default=2, help="threads for the documents (default: %(default)s)")
    p.add_argument("--chunks", type=int, default=8, help="document chunks, interleaved (default: %(default)s)")
    p.add_argument("--limit", type=int, help="N sentences and N questions, spread over the languages (default: all)")
    p.add_argument("--json", type=Path, help="save the results as JSON here")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from vecplug.adapters.bias import LanguageStats
    from vecplug.indexer import torch_int8_documents
    from vecplug.indexer.datasets import load_xquad_r
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.precision import amx_bf16, amx_int8

    torch.set_num_threads(args.threads)
    data = load_xquad_r(args.data)
    sentences, questions = data.sentences(), data.questions()
    if args.limit:  # every n-th: the files come one language after another
        sentences = sentences[::max(1, len(sentences) // args.limit)][:args.limit]
        questions = questions[::max(1, len(questions) // args.limit)][:args.limit]
    enc = {"float32": Encoder.from_specs(args.model, args.student, precision="float32", threads=args.threads),
           "bfloat16": Encoder.from_specs(args.model, args.student, precision="bfloat16", threads=args.threads)}
    engines = {}  # int8 set -> the kernels its weights are packed for
    for name in dict.fromkeys(args.int8_engines):
        key = "int8" if args.int8_engines == ["auto"] else f"int8 {name}"
        engine = ENGINES.get(name, torch_int8_documents.document_engine)
        enc[key] = Encoder.from_specs(args.model, args.student, precision=args.int8_precision,
                                      document_quantize="int8", threads=args.threads)
        with mock.patch.object(torch_int8_documents, "document_engine", engine):
            enc[key].document  # noqa: B018 (loads the model: the weights are packed now)
        engines[key] = engine() or "torch's default (x86: FBGEMM)"
    compiled: dict[str, Any] = {}
    if args.compile:
        from vecplug.indexer.compiled import CACHE_VARIABLE, inductor_cache

        if args.inductor_cache:
            os.environ[CACHE_VARIABLE] = str(args.inductor_cache.resolve())
        cache = Path(inductor_cache())
        compiled["cache"] = str(cache)
        compiled["cache_was_empty"] = not cache.is_dir() or not any(cache.iterdir())
        for key, kw in (("bfloat16 compiled", {"precision": "bfloat16"}),
                        ("int8 compiled", {"precision": args.int8_precision, "document_quantize": "int8"})):
            enc[key] = Encoder.from_specs(args.model, args.student, threads=args.threads, compile=True, **kw)
            enc[key].document  # noqa: B018 (loads, calibrates, packs: not the compilation's time)
            t0 = time.perf_counter()  # the first batch compiles the graph
            enc[key].encode_documents([s.text for s in sentences[:32]], progress=False)
            compiled[key] = {"first_batch_s": time.perf_counter() - t0,
                             "fell_back": enc[key].document.compiled.compiled is None}
        engines["int8 compiled"] = torch_int8_documents.document_engine(True) or "torch's default (x86: FBGEMM)"
    sets = list(enc)
    texts = [s.text for s in sentences]
    doc_langs = np.array([s.lang for s in sentences])
    doc_ids = np.array([s.doc_id for s in sentences])
    vectors, seconds, tokens = documents_interleaved(enc, texts, args.chunks)
    documents = {k: {"docs_per_s": len(texts) / seconds[k], "tokens_per_s": tokens[k] / seconds[k],
                     "seconds": seconds[k], "vs_float32": seconds["float32"] / seconds[k],
                     "precision": enc[k].document.precision} for k in sets}
    cosine = {k: np.sum(vectors[k] * vectors["float32"], axis=1) for k in sets[1:]}

    qtexts = [q.text for q in questions]
    query_langs = [q.lang for q in questions]
    relevant = [set(data.relevant[q.qid].values()) & set(doc_ids) for q in questions]
    own = [{data.relevant[q.qid][q.lang]} & set(doc_ids) for q in questions]
    queries = {"teacher float32": Encoder.from_specs(args.model, precision="float32").encode_queries(qtexts),
               "student int8": enc["float32"].encode_queries(qtexts)}  # the student's int8 is float32 anywhere
    quality = []
    for k in sets:
        stats = LanguageStats(vectors[k].shape[1])
        stats.add(list(doc_langs), vectors[k])
        means = stats.means()
        for who, qv in queries.items():
            quality.append({"documents": k, "queries": who,
                            **_scores(qv, vectors[k], doc_ids, relevant, own, query_langs, doc_langs, means)})
    return {"machine": machine_info(), "amx_bf16": amx_bf16(), "amx_int8": amx_int8(),
            "int8_engines": engines, "compiled": compiled,
            "model": args.model, "student": args.student, "threads": args.threads,
            "sentences": len(texts), "questions": len(qtexts), "documents": documents,
            "cosine_to_float32": {k: {"mean": float(c.mean()), "min": float(c.min())} for k, c in cosine.items()},
            "quality": quality}


def render(r: dict[str, Any]) -> str:
    d = r["documents"]
    sets = list(d)
    rows = [(k, d[k]["precision"], f"{d[k]['docs_per_s']:.1f}", f"{d[k]['tokens_per_s']:,.0f}",
             f"{d[k]['seconds']:.1f}", f"{d[k]['vs_float32']:.2f}x",
             "-" if k == "float32" else f"{r['cosine_to_float32'][k]['mean']:.5f} / {r['cosine_to_float32'][k]['min']:.4f}")
            for k in sets]
    q = {(x["documents"], x["queries"]): x for x in r["quality"]}
    keys = ("xy_map20", "xy_map20_corrected", "mono_mrr10")
    quality = [(x["documents"], x["queries"], *(f"{x[k]:.4f}" for k in keys)) for x in r["quality"]]
    kept = [(f"{k} documents, {who} queries", *(f"{q[(k, who)][m] / q[('float32', who)][m]:.2%}" for m in keys))
            for k in sets[1:] for who in ("teacher float32", "student int8")]
    return "\n".join([
        header_markdown("int8 documents run by torch, against float32 and bfloat16", r["machine"]), "",
        f"- CPU has AMX int8 / bf16: {'yes' if r['amx_int8'] else 'no'} / {'yes' if r['amx_bf16'] else 'no'}"
        "; the int8 weights packed for: " + ", ".join(f"{k}: {e}" for k, e in r["int8_engines"].items()),
        f"- document encoder {r['model']}, query student {r['student']}; {r['sentences']:,} XQuAD-R sentences, "
        f"{r['questions']:,} questions", *_compiled_lines(r.get("compiled") or {}), "",
        f"### Documents ({r['threads']} threads, the {len(sets)} sets interleaved chunk by chunk)", "",
        markdown_table(["documents", "float layers", "docs/s", "tokens/s", "seconds", "vs float32",
                        "cosine to float32 (mean / min)"], rows), "",
        "### Quality (exact search; the correction uses each document set's own language means)", "",
        markdown_table(["documents", "queries", "X-Y mAP@20", "with the correction", "mono MRR@10"], quality), "",
        markdown_table(["kept, of float32 documents'", "X-Y mAP@20", "with the correction", "mono MRR@10"], kept), ""])


def _compiled_lines(compiled: dict[str, Any]) -> list[str]:
    """``--compile``: each compiled set's first batch (the compilation), untimed in the table."""
    if not compiled:
        return []
    firsts = "; ".join(f"{k}: {v['first_batch_s']:.1f} s" + (" (compilation failed: eager)" if v["fell_back"] else "")
                       for k, v in compiled.items() if isinstance(v, dict))
    cache = "empty (a cold compilation)" if compiled["cache_was_empty"] else "already filled by an earlier run"
    cache = f"{compiled.get('cache', '')} {cache}".strip()
    return [f"- compiled sets (`model.compile`): the first batch of 32 sentences, which compiles, took {firsts}; "
            f"Inductor's cache {cache}; the table times the batches after it"]


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
