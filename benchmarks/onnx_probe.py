"""Probe: the query student through ONNX Runtime, fp32 and int8, against torch (issue 6).

Not part of ``run_all.sh``: ONNX Runtime is not a vecplug dependency yet. This script measures
whether it should be. It needs ``pip install onnxruntime onnx onnxscript`` (1.32 / 1.23 / 0.7
were used) and a pooled XQuAD-R index of me5-small documents (``make bench-eval`` builds one;
its path is the ``--index`` here) for the quality columns.

It exports the student (mean pooling and normalisation inside the graph), lets ORT's BERT
optimizer fuse it, and quantises its weight MatMuls dynamically (int8 weights per output
channel) in the variants named below. Latency: one query at a time, one thread, the median
question length. Quality: X-Y mAP@20 on all XQuAD-R questions, plain and with the bias
correction (documents as stored in the index); ORT encodes one unpadded question at a time,
the torch rows go through vecplug's own batched encode.

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

#: name -> (reduce_range, keep the FFN down-projections in float32)
VARIANTS = {"int8": (False, False), "int8 reduce-range": (True, False),
            "int8 down fp32": (False, True), "int8 reduce-range, down fp32": (True, True)}


def export(model, path: Path) -> None:
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            h = self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            return torch.nn.functional.normalize((h * w).sum(1) / w.sum(1).clamp(min=1), dim=-1)

    ids = torch.randint(5, 1000, (2, 12))
    torch.onnx.export(Pooled(model).eval(), (ids, torch.ones_like(ids)), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["emb"],
                      dynamic_axes={"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"},
                                    "emb": {0: "b"}}, opset_version=17, dynamo=False)


def quantise(src: Path, work: Path) -> dict[str, Path]:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    activations = [n.name for n in matmuls if not any(i in inits for i in n.input)]  # attention
    down = [n.name for n in matmuls if "/output/dense/" in n.name and "attention" not in n.name]
    out = {}
    for name, (reduce_range, keep_down) in VARIANTS.items():
        path = work / (name.replace(" ", "_").replace(",", "") + ".onnx")
        quantize_dynamic(str(src), str(path), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=reduce_range, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=activations + (down if keep_down else []),
                         extra_options={"DefaultTensorType": 1})
        out[name] = path
    return out


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
    from onnxruntime.transformers.optimizer import optimize_model

    from vecplug.adapters.bias import LanguageStats
    from vecplug.api import open_index
    from vecplug.indexer.datasets import load_xquad_r
    from vecplug.indexer.encoder import Encoder, _int8
    from vecplug.metrics import average_precision_at_k

    torch.set_num_threads(1)
    info = machine_info()  # after the thread setting, which it reports
    work = Path(args.work) / args.student  # the exported graph is reused on a rerun
    work.mkdir(parents=True, exist_ok=True)
    enc = Encoder.from_specs("me5-small", args.student, query_quantize=None)
    student = enc.query
    if not (work / "opt.onnx").exists():
        export(student.model, work / "fp32.onnx")
        optimize_model(str(work / "fp32.onnx"), model_type="bert", num_heads=student.model.config.num_attention_heads,
                       hidden_size=student.dim, opt_level=1).save_model_to_file(str(work / "opt.onnx"))
    paths = {"fp32": work / "opt.onnx", **quantise(work / "opt.onnx", work)}

    data = load_xquad_r(args.xquad)
    questions = data.questions()
    sentences = data.sentences()
    with open_index(args.index) as index:
        docs = index.store.vectors([s.doc_id for s in sentences])
        means = LanguageStats.fit(index.store).means()
    doc_ids = np.array([s.doc_id for s in sentences])
    centred_docs = means.centre(docs, [s.lang for s in sentences])
    query_langs = [q.lang for q in questions]
    relevant = [set(data.relevant[q.qid].values()) for q in questions]
    ids = student.tokenize([q.text for q in questions], enc.query_prefix, enc.query_max_length)
    step = max(1, len(ids) // args.latency_queries)
    sample = ids[::step][:args.latency_queries]

    def quality(vectors: np.ndarray) -> tuple[float, float]:
        """X-Y mAP@20, plain and with the bias correction."""
        res = []
        for q_vecs, d_vecs in ((vectors, docs), (means.centre(vectors, query_langs), centred_docs)):
            scores = q_vecs @ d_vecs.T
            top = np.argpartition(-scores, 20, axis=1)[:, :20]
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)
            res.append(float(np.mean([average_precision_at_k(list(doc_ids[t]), rel, 20)
                                      for t, rel in zip(top, relevant)])))
        return res[0], res[1]

    def latency(fn) -> tuple[float, float]:
        times = timed(fn, sample)
        return percentile(times, 50) * 1e3, percentile(times, 95) * 1e3

    def torch_encode(x):
        with torch.inference_mode():
            a = torch.tensor([x])
            h = student.model(input_ids=a, attention_mask=torch.ones_like(a)).last_hidden_state
            return torch.nn.functional.normalize(h.mean(1), dim=-1)

    rows = []
    fp32_vecs = student.encode([q.text for q in questions], enc.query_prefix, enc.query_max_length)
    rows.append(("torch fp32", *latency(torch_encode), *quality(fp32_vecs)))
    for name, path in paths.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

        def run(x, sess=sess):
            a = np.array([x], dtype=np.int64)
            return sess.run(None, {"input_ids": a, "attention_mask": np.ones_like(a)})[0]

        vecs = np.concatenate([run(x) for x in ids])
        rows.append((f"ORT {name}", *latency(run), *quality(vecs)))
    student.model = _int8(student.model)
    rows.append(("torch int8 (vecplug's recipe)", *latency(torch_encode),
                 *quality(student.encode([q.text for q in questions], enc.query_prefix, enc.query_max_length))))

    print(header_markdown(f"{args.student} query encoding: torch vs ONNX Runtime", info))
    print(f"\nOne query at a time on one thread ({len(sample)} questions, median "
          f"{int(np.median([len(x) for x in sample]))} tokens); onnxruntime {ort.__version__}. "
          f"X-Y mAP@20 over all {len(questions):,} questions.\n")
    print(markdown_table(["encoder", "p50 ms", "p95 ms", "X-Y mAP@20", "with the correction"],
                         [(name, f"{p50:.1f}", f"{p95:.1f}", f"{plain:.3f}", f"{centred:.3f}")
                          for name, p50, p95, plain, centred in rows]))


if __name__ == "__main__":
    main()
