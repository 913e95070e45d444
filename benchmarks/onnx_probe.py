"""Probe: the query student's int8 variants in ONNX Runtime, against fp32 and torch (issue 6).

The ``model.runtime: onnx`` recipe (``vecplug.indexer.onnx_runtime``) is one of several int8
settings; this script measures them side by side on the shipped student, which is how the
recipe was chosen. It needs ``pip install 'vecplug[onnx]'`` and a pooled XQuAD-R index of
me5-small documents (``make bench-eval`` builds one; its path is the ``--index`` here) for the
quality columns.

Each ORT variant is the library's exported, fused graph (``export_fused``) put into int8 by
the library's ``quantize_recipe`` (smoothing calibrated on the shipped sentences, as the
library does) with a recipe (below), and run through
vecplug's own ``TextEncoder`` (``runtime="onnx"`` path). Two more rows fuse what the library
leaves apart (the residual additions into their layer norms, ``onnx_runtime.UNFUSED``): in
fp32 and in the role's recipe. Latency: ``encode`` of one query at a time on one thread
(tokenisation included), every engine in turn on each question, so that the machine's drift
(runs here vary by 15%) falls on all of them alike. Quality: X-Y mAP@20 on all XQuAD-R
questions, plain and with the bias correction (documents as stored in the index).

    .venv/bin/python benchmarks/onnx_probe.py --index /tmp/idx/eval-xquad --work /tmp/onnx-probe
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import header_markdown, machine_info, markdown_table, percentile, x_y_map  # noqa: E402
from xquad_data import DEFAULT_DATA_DIR  # noqa: E402

from vecplug.indexer.onnx_runtime import INT8_RECIPES, SMOOTH_ALPHA, SMOOTHABLE  # noqa: E402


def _recipe(base: str, **changes: Any) -> dict[str, Any]:
    return {**INT8_RECIPES[base], **changes}


#: name -> (recipe in INT8_RECIPES' form, smoothing alpha); the library's recipes first
VARIANTS: dict[str, tuple[dict[str, Any], float]] = {
    f"int8-query (vecplug's for queries: every weight, FFN down smoothed, alpha {SMOOTH_ALPHA})":
        (INT8_RECIPES["int8-query"], SMOOTH_ALPHA),
    "int8 (vecplug's for documents: FFN down fp32, attention Q, K, V smoothed)": (INT8_RECIPES["int8"], SMOOTH_ALPHA),
    "int8, attention Q, K, V smoothed at alpha 0.5": (INT8_RECIPES["int8"], 0.5),
    "int8-v1 (documents' version 1: FFN down and attention Q, K, V fp32)": (INT8_RECIPES["int8-v1"], SMOOTH_ALPHA),
    "int8, FFN down fp32, attention Q, K, V unsmoothed": (_recipe("int8", smooth=()), SMOOTH_ALPHA),
    "int8, every weight, Q, K, V and FFN down smoothed": (_recipe("int8", smooth=SMOOTHABLE, narrowing=True), SMOOTH_ALPHA),
    "int8-query smoothed at alpha 0.5": (INT8_RECIPES["int8-query"], 0.5),
    "int8-query smoothed at alpha 0.9": (INT8_RECIPES["int8-query"], 0.9),
    "int8, every weight, unsmoothed": (_recipe("int8-query", smooth=()), SMOOTH_ALPHA),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True, help="pooled XQuAD-R index of me5-small documents")
    ap.add_argument("--xquad", default=str(DEFAULT_DATA_DIR))
    ap.add_argument("--work", default="/tmp/onnx-probe")
    ap.add_argument("--student", default="me5-small-student-k6")
    ap.add_argument("--latency-queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2, help="times each latency question is run per engine")
    ap.add_argument("--questions", type=int, help="score on the first N questions only (a quick check)")
    ap.add_argument("--sentences", type=int, help="--documents: the first N sentences only (a quick check)")
    ap.add_argument("--documents", action="store_true",
                    help="the document encoder's passages instead: me5-small in each variant encodes the "
                         "XQuAD-R sentences (throughput on --threads), searched by its fp32 queries")
    ap.add_argument("--threads", type=int, help="[default: 1 for queries, 2 for documents]")
    args = ap.parse_args()
    args.threads = args.threads or (2 if args.documents else 1)

    import onnxruntime as ort
    import torch

    from vecplug.adapters.bias import LanguageStats
    from vecplug.api import open_index
    from vecplug.indexer.datasets import load_xquad_r
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.onnx_runtime import export_fused, quantize_recipe

    torch.set_num_threads(args.threads)
    info = machine_info()  # after the thread setting, which it reports
    # the graphs are rebuilt each run, into this folder
    work = Path(args.work) / ("me5-small-documents" if args.documents else args.student)
    work.mkdir(parents=True, exist_ok=True)
    # not traced: engines are swapped by assigning ``student.model``, and a traced graph (made
    # after a few small forwards) would run in place of whichever model is assigned
    enc = Encoder.from_specs("me5-small", args.student, query_quantize=None, trace=False)
    # torch fp32; its ``onnx`` slot takes each variant's session in turn
    student = enc.document if args.documents else enc.query
    export_fused(student.model, work / "fp32.onnx")
    paths = {"fp32": work / "fp32.onnx"}

    def int8(fp32: Path, recipe: dict[str, Any], alpha: float, tag: str) -> Path:
        """``fp32`` in int8 by ``recipe`` (smoothed at ``alpha``), as the library builds it."""
        quantize_recipe(fp32, work / f"int8-{tag}.onnx", recipe, student.calibration_feeds, alpha)
        return work / f"int8-{tag}.onnx"

    for i, (name, (recipe, alpha)) in enumerate(VARIANTS.items()):
        paths[name] = int8(paths["fp32"], recipe, alpha, str(i))
    # what the library leaves unfused (onnx_runtime.UNFUSED), fused: in fp32 and in the role's
    # int8 recipe
    role = "int8" if args.documents else "int8-query"
    fused = paths["fp32, residual norms fused"] = work / "fp32-residual-norms.onnx"
    export_fused(student.model, fused, residual_norms=True)
    paths[f"{role}, residual norms fused"] = int8(fused, INT8_RECIPES[role], SMOOTH_ALPHA, "residual-norms")

    data = load_xquad_r(args.xquad)
    questions = data.questions()[:args.questions]
    texts = [q.text for q in questions]
    sentences = data.sentences()[:args.sentences]
    with open_index(args.index) as index:
        docs = index.store.vectors([s.doc_id for s in sentences])
        means = LanguageStats.fit(index.store).means()
    doc_ids = np.array([s.doc_id for s in sentences])
    centred_docs = means.centre(docs, [s.lang for s in sentences])
    query_langs = [q.lang for q in questions]
    relevant = [set(data.relevant[q.qid].values()) for q in questions]
    step = max(1, len(texts) // args.latency_queries)
    sample = texts[::step][:args.latency_queries]

    def encode(batch: list[str]) -> np.ndarray:
        return student.encode(batch, enc.query_prefix, enc.query_max_length, progress=False)

    if args.documents:  # the teacher's own fp32 queries, before any variant takes its slot
        return documents(args, info, student, encode(texts), sentences, questions, relevant, paths)

    # every engine at once: (torch model, ORT layers or None); the ORT rows use the fp32
    # model's vocabulary table only
    engines = all_engines(student.model, paths, args.threads)
    names = list(engines)

    def use(name: str) -> None:
        student.model, student.onnx = engines[name]
        assert student.graph is None, "a traced graph would run in place of the engine"

    # latency, interleaved so that the machine's drift is shared: each query runs on every
    # engine in turn, the order rotated from one query to the next
    times: dict[str, list[float]] = {name: [] for name in names}
    warm = sample[:20]
    for i, text in enumerate(warm + sample * args.rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            use(name)
            t0 = time.perf_counter()
            encode([text])
            if i >= len(warm):
                times[name].append(time.perf_counter() - t0)

    rows = []
    for name in names:
        use(name)
        rows.append((name, percentile(times[name], 50) * 1e3, percentile(times[name], 95) * 1e3,
                     *x_y_map(encode(texts), docs, means, centred_docs, query_langs, doc_ids, relevant)))
    tokens = int(np.median([len(x) for x in student.tokenize(sample, enc.query_prefix, enc.query_max_length)]))

    print(header_markdown(f"{args.student} query encoding: torch vs ONNX Runtime", info))
    print(f"\nOne query at a time on one thread ({len(sample)} questions x {args.rounds} rounds, median "
          f"{tokens} tokens; the engines interleaved, query by query); onnxruntime {ort.__version__}. "
          f"X-Y mAP@20 over all {len(questions):,} questions.\n")
    print(markdown_table(["encoder", "p50 ms", "p95 ms", "X-Y mAP@20", "with the correction"],
                         [(name, f"{p50:.1f}", f"{p95:.1f}", f"{plain:.3f}", f"{centred:.3f}")
                          for name, p50, p95, plain, centred in rows]))


def all_engines(fp32_model: Any, paths: dict[str, Path], threads: int) -> dict[str, tuple[Any, Any]]:
    """name -> (torch model, ORT layers or None): torch fp32, each graph in ``paths`` (which use
    the fp32 model's vocabulary table only) and torch int8 (the general recipe, ``encoder._int8``)."""
    from vecplug.indexer.encoder import _int8
    from vecplug.indexer.onnx_runtime import OnnxLayers

    return {"torch fp32": (fp32_model, None),
            **{f"ORT {name}": (fp32_model, OnnxLayers(path, threads=threads)) for name, path in paths.items()},
            "torch int8 (the general recipe)": (_int8(copy.deepcopy(fp32_model)), None)}  # in place


def documents(args: argparse.Namespace, info: dict[str, Any], teacher: Any, queries: np.ndarray,
              sentences: Sequence[Any], questions: Sequence[Any], relevant: Sequence[set[str]],
              paths: dict[str, Path]) -> None:
    """Each variant encodes every XQuAD-R sentence (the pooled documents), in chunks with the
    variants interleaved chunk by chunk; X-Y quality with the teacher's fp32 queries, the
    correction's language means taken from each variant's own document vectors."""
    import onnxruntime as ort

    from vecplug.adapters.bias import LanguageStats
    from vecplug.indexer.encoder import DEFAULT_DOCUMENT_MAX_LENGTH

    prefix = teacher.info.document_prefix
    engines = all_engines(teacher.model, paths, args.threads)
    names = list(engines)
    texts, langs = [s.text for s in sentences], [s.lang for s in sentences]
    chunks = np.array_split(np.arange(len(texts)), 8)
    vectors = {name: np.zeros((len(texts), teacher.out_dim), np.float32) for name in names}
    seconds = dict.fromkeys(names, 0.0)
    for name in names:  # warm-up, untimed: an engine's first batches allocate and plan
        teacher.model, teacher.onnx = engines[name]
        teacher.encode(texts[:32], prefix, DEFAULT_DOCUMENT_MAX_LENGTH, progress=False)
    for i, chunk in enumerate(chunks):
        for name in names[i % len(names):] + names[:i % len(names)]:
            teacher.model, teacher.onnx = engines[name]
            t0 = time.perf_counter()
            vectors[name][chunk] = teacher.encode([texts[j] for j in chunk], prefix,
                                                  DEFAULT_DOCUMENT_MAX_LENGTH, progress=False)
            seconds[name] += time.perf_counter() - t0
    doc_ids = np.array([s.doc_id for s in sentences])
    query_langs = [q.lang for q in questions]
    rows = []
    for name in names:
        stats = LanguageStats(vectors[name].shape[1])
        stats.add(langs, vectors[name])
        means = stats.means()
        plain, centred = x_y_map(queries, vectors[name], means, means.centre(vectors[name], langs),
                                 query_langs, doc_ids, relevant)
        rows.append((name, len(texts) / seconds[name], seconds["torch fp32"] / seconds[name], plain, centred))
    print(header_markdown("me5-small document encoding: torch vs ONNX Runtime", info))
    print(f"\n{len(texts):,} XQuAD-R sentences (the pooled documents) on {args.threads} thread(s), in "
          f"{len(chunks)} chunks with the engines interleaved chunk by chunk, after an untimed warm-up "
          f"of 32 sentences each; onnxruntime {ort.__version__}. "
          f"X-Y mAP@20 of the teacher's fp32 queries ({len(questions):,} questions) over each engine's "
          "documents; the correction uses each engine's own language means.\n")
    print(markdown_table(["encoder", "docs/s", "vs torch fp32", "X-Y mAP@20", "with the correction"],
                         [(name, f"{rate:.1f}", f"{ratio:.2f}x", f"{plain:.3f}", f"{centred:.3f}")
                          for name, rate, ratio, plain, centred in rows]))


if __name__ == "__main__":
    main()
