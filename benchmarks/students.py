"""Query students against their teacher: XQuAD-R quality, query latency, size.

For each query encoder given (the teacher itself and students distilled from it), over one
pooled XQuAD-R index whose documents the teacher encoded (built on first use in ``--index``):

* X-Y mAP@20 and X-X-mono MRR@10 (scored as ``xquad_r.py`` does; exact search here, so the
  numbers compare encoders, not ANN luck), and retention = student / teacher;
* query latency, one query at a time on one thread (``torch.set_num_threads(1)``), end to
  end through ``Encoder.encode_queries`` (tokenisation included): p50 and p95 over
  ``--latency-queries`` questions of all languages, after a warm-up;
* the artifact size on disk (a student shares the teacher's vocabulary table and holds only
  its layers) and its training record (time, steps).

Evaluation only: nothing is trained on XQuAD-R.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    exact_map_at_k, fmt, header_markdown, machine_info, markdown_table, pct, percentile, run_main)
from xquad_data import DEFAULT_DATA_DIR, load_xquad_r, parse_langs  # noqa: E402
from xquad_r import reciprocal_rank_at_k  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("query_encoders", nargs="+",
                   help="query encoder specs: the teacher (e.g. me5-small) and student folders or names; "
                        "NAME runs in float32, NAME+int8 with int8 weights")
    p.add_argument("--model", default="me5-small", help="document encoder (the teacher)")
    p.add_argument("--index", type=Path, required=True, help="pooled XQuAD-R index folder (built if absent)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--langs", nargs="+")
    p.add_argument("--latency-queries", type=int, default=300)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from vecplug.api import Index, settings_for
    from vecplug.types import Document

    info = machine_info()
    print(header_markdown("Query students vs teacher on XQuAD-R", info), flush=True)
    data = load_xquad_r(args.data, args.langs)
    questions = [q for lang in data.langs for q in data.by_lang[lang].questions]
    docs = [Document(s.doc_id, s.text, f"xquad-r/{s.lang}", s.index, s.lang) for s in data.sentences()]

    def pool(query_spec: str) -> tuple[Path, list[str], np.ndarray, np.ndarray]:
        """The pooled index for a query encoder: the teacher's, or, for a student with a
        projection to fewer dimensions, one whose documents are projected the same way."""
        from vecplug.indexer.models import resolve_model
        from vecplug.indexer.student import PROJECTION

        info = resolve_model(query_spec)
        folder = args.index
        if info.teacher is not None and (info.path / PROJECTION).is_file():
            folder = args.index.with_name(f"{args.index.name}-{info.path.name}")
        else:
            query_spec = args.model
        settings = settings_for(str(folder), model={"document": args.model, "query": query_spec})
        with Index.open(settings, create=True) as index:
            index.add_documents(docs, progress=True)  # unchanged documents are skipped
            ids = list(index.store.ids())
            langs = np.asarray([r.lang for r in index.store.get(ids)])
            return folder, ids, langs, index.store.vectors(ids)

    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    sample = [questions[i].text for i in rng.choice(len(questions), args.latency_queries, replace=False)]
    for spec in args.query_encoders:
        torch.set_num_threads(2)
        base, _, quantize = spec.partition("+")  # "NAME+int8": the same encoder with int8 weights
        folder, ids, langs_of, doc_vectors = pool(base)  # exact scores over the stored vectors
        with Index.open(settings_for(str(folder), model={"query": base,
                                                          "query_quantize": quantize or "none"})) as index:
            enc = index.encoder
            t0 = time.perf_counter()
            qv = enc.encode_queries([q.text for q in questions], progress=True)
            batch_seconds = time.perf_counter() - t0
            # one query at a time on one thread: what a user waiting for an answer feels
            torch.set_num_threads(1)
            for text in sample[:20]:
                enc.encode_queries([text])
            lat = []
            for text in sample:
                t0 = time.perf_counter()
                enc.encode_queries([text])
                lat.append(time.perf_counter() - t0)
            qinfo = enc.query_info
        scores = qv @ doc_vectors.T
        xy_map = exact_map_at_k(scores, ids, [set(data.relevant[q.qid].values()) for q in questions], 20)
        rr = []
        for q, row in zip(questions, scores):
            mono_idx = np.flatnonzero(langs_of == q.lang)
            mono_top = mono_idx[np.argsort(-row[mono_idx])[:10]]
            rr.append(reciprocal_rank_at_k([ids[i] for i in mono_top], data.relevant[q.qid][q.lang], 10))
        meta_file = qinfo.path / "student.json"
        meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
        size = folder_bytes(qinfo.path) if meta else (qinfo.path / "model.safetensors").stat().st_size
        rows.append({
            "query_encoder": spec, "layers": len(meta.get("layers", [])) or None,
            "teacher_layers": meta.get("layers"), "xy_map20": xy_map,
            "mono_mrr10": float(np.mean(rr)), "latency_p50_ms": 1000 * percentile(lat, 50),
            "latency_p95_ms": 1000 * percentile(lat, 95), "batched_queries_per_s": len(questions) / batch_seconds,
            "dim": int(doc_vectors.shape[1]), "artifact_bytes": size, "distill_seconds": meta.get("training", {}).get("seconds"),
            "distill_steps": meta.get("training", {}).get("steps"),
            "distill_command": meta.get("training", {}).get("command"),
        })
        print(f"{spec}: mAP@20 {rows[-1]['xy_map20']:.3f}, MRR@10 {rows[-1]['mono_mrr10']:.3f}, "
              f"p50 {rows[-1]['latency_p50_ms']:.1f} ms", file=sys.stderr, flush=True)
    teacher = rows[0]
    for r in rows:
        r["xy_retention"] = r["xy_map20"] / teacher["xy_map20"]
        r["mono_retention"] = r["mono_mrr10"] / teacher["mono_mrr10"]
        r["speedup_p50"] = teacher["latency_p50_ms"] / r["latency_p50_ms"]
    return {"benchmark": "students", "machine": info, "langs": data.langs, "questions": len(questions),
            "latency_queries": len(sample), "rows": rows}


def render(r: dict[str, Any]) -> str:
    headers = ["query encoder", "teacher layers", "dim", "X-Y mAP@20", "retention", "mono MRR@10", "retention",
               "p50 ms", "p95 ms", "speed-up", "batched q/s", "size MB", "distill min"]
    rows = [[x["query_encoder"], ",".join(map(str, x["teacher_layers"])) if x["teacher_layers"] else "all 12",
             str(x["dim"]), fmt(x["xy_map20"]), pct(x["xy_retention"]), fmt(x["mono_mrr10"]), pct(x["mono_retention"]),
             f"{x['latency_p50_ms']:.1f}", f"{x['latency_p95_ms']:.1f}", f"{x['speedup_p50']:.1f}x",
             f"{x['batched_queries_per_s']:.0f}", f"{x['artifact_bytes'] / 1e6:.1f}",
             f"{x['distill_seconds'] / 60:.1f}" if x["distill_seconds"] else "-"] for x in r["rows"]]
    out = [f"Pool: {', '.join(r['langs'])}; {r['questions']:,} questions; exact search over the teacher's "
           f"document vectors (a lower-dimension student: projected ones; 4 bytes per dimension "
           f"per vector). Latency: {r['latency_queries']} questions, one at a time, 1 thread, "
           "tokenisation included.", "", markdown_table(headers, rows)]
    cmds = {x["distill_command"] for x in r["rows"] if x["distill_command"]}
    if cmds:
        out += ["", "Students made by:", ""] + [f"- `{c}`" for c in sorted(cmds)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, evaluate, render, argv)


if __name__ == "__main__":
    sys.exit(main())
