"""Probe: the query student's int8 variants in ONNX Runtime, against fp32 and torch (issue 6).

The ``model.runtime: onnx`` recipe (``vecplug.indexer.onnx_runtime``) is one of several int8
settings; this script measures them side by side on the shipped student, which is how the
recipe was chosen. It needs ``pip install 'vecplug[onnx]'`` and a pooled XQuAD-R index of
me5-small documents (``make bench-eval`` builds one; its path is the ``--index`` here) for the
quality columns.

Each ORT variant is the library's exported, fused graph (``export_fused``), quantised with
``quantize_int8`` and its switches (below), and run through vecplug's own ``TextEncoder``
(``runtime="onnx"`` path). Latency: ``encode`` of one query at a time on one thread
(tokenisation included), the median question length. Quality: X-Y mAP@20 on all XQuAD-R
questions, plain and with the bias correction (documents as stored in the index).

    .venv/bin/python benchmarks/onnx_probe.py --index /tmp/idx/eval-xquad --work /tmp/onnx-probe
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import header_markdown, machine_info, markdown_table, percentile  # noqa: E402
from query_latency import timed  # noqa: E402
from xquad_data import DEFAULT_DATA_DIR  # noqa: E402

#: name -> quantize_int8's switches; the first is vecplug's recipe (its defaults)
VARIANTS = {
    "int8 (vecplug's recipe: reduce-range; attention QKV and FFN down fp32)": {},
    "int8, attention QKV too (QAttention)": {"attention": True},
    "int8, attention QKV and FFN down too": {"attention": True, "narrowing": True},
    "int8, every weight, no reduce-range": {"attention": True, "narrowing": True, "reduce_range": False},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True, help="pooled XQuAD-R index of me5-small documents")
    ap.add_argument("--xquad", default=str(DEFAULT_DATA_DIR))
    ap.add_argument("--work", default="/tmp/onnx-probe")
    ap.add_argument("--student", default="me5-small-student-k6")
    ap.add_argument("--latency-queries", type=int, default=300)
    args = ap.parse_args()

    import onnxruntime as ort
    import torch

    from vecplug.adapters.bias import LanguageStats
    from vecplug.api import open_index
    from vecplug.indexer.datasets import load_xquad_r
    from vecplug.indexer.encoder import Encoder, _int8
    from vecplug.indexer.onnx_runtime import OnnxLayers, export_fused, quantize_int8
    from vecplug.metrics import average_precision_at_k

    torch.set_num_threads(1)
    info = machine_info()  # after the thread setting, which it reports
    work = Path(args.work) / args.student  # the graphs are rebuilt each run, into this folder
    work.mkdir(parents=True, exist_ok=True)
    enc = Encoder.from_specs("me5-small", args.student, query_quantize=None)
    student = enc.query  # torch fp32; its ``onnx`` slot takes each variant's session in turn
    export_fused(student.model, work / "fp32.onnx")
    paths = {"fp32": work / "fp32.onnx"}
    for i, (name, switches) in enumerate(VARIANTS.items()):
        paths[name] = work / f"int8-{i}.onnx"
        quantize_int8(paths["fp32"], paths[name], **switches)

    data = load_xquad_r(args.xquad)
    questions = data.questions()
    texts = [q.text for q in questions]
    sentences = data.sentences()
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

    def row(name: str) -> tuple[str, float, float, float, float]:
        """Latency of one query at a time, then X-Y mAP@20, plain and with the bias correction."""
        times = timed(lambda t: encode([t]), sample)
        vectors = encode(texts)
        quality = []
        for q_vecs, d_vecs in ((vectors, docs), (means.centre(vectors, query_langs), centred_docs)):
            scores = q_vecs @ d_vecs.T
            top = np.argpartition(-scores, 20, axis=1)[:, :20]
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)
            quality.append(float(np.mean([average_precision_at_k(list(doc_ids[t]), rel, 20)
                                          for t, rel in zip(top, relevant)])))
        return (name, percentile(times, 50) * 1e3, percentile(times, 95) * 1e3, *quality)

    rows = [row("torch fp32")]
    for name, path in paths.items():
        student.onnx = OnnxLayers(path, threads=1)
        rows.append(row(f"ORT {name}"))
    student.onnx = None
    student.model = _int8(student.model)
    rows.append(row("torch int8 (vecplug's recipe)"))
    tokens = int(np.median([len(x) for x in student.tokenize(sample, enc.query_prefix, enc.query_max_length)]))

    print(header_markdown(f"{args.student} query encoding: torch vs ONNX Runtime", info))
    print(f"\nOne query at a time on one thread ({len(sample)} questions, median "
          f"{tokens} tokens); onnxruntime {ort.__version__}. "
          f"X-Y mAP@20 over all {len(questions):,} questions.\n")
    print(markdown_table(["encoder", "p50 ms", "p95 ms", "X-Y mAP@20", "with the correction"],
                         [(name, f"{p50:.1f}", f"{p95:.1f}", f"{plain:.3f}", f"{centred:.3f}")
                          for name, p50, p95, plain, centred in rows]))


if __name__ == "__main__":
    main()
