"""Query latency end to end: what a user waiting for an answer feels.

Over one pooled XQuAD-R index (the six languages, 7,308 sentences the document encoder
encoded; built in ``--index`` on first use), for each query encoder given (the teacher, the
shipped student, ``NAME+int8`` for int8 weights, ``NAME+bf16`` in bfloat16 (``model.precision``,
the teacher reranker's encode too; ``NAME+int8+bf16``: int8 queries, a bfloat16 teacher reranker;
other rows are pinned to float32), ``NAME@onnx`` or ``NAME+int8@onnx`` through ONNX
Runtime, ``model.runtime: onnx``), in-process through ``Index.search`` (the
call ``vecplug search`` makes once its models are loaded):

* ``encode``: the query vector only (tokenisation included);
* ``xy``: language detection + encoding + the pooled search (with the index's language-bias
  correction, on by default), top 10;
* ``mono``: the same in the query's language only;
* ``xy + teacher rerank``: the student's top 50 re-scored with the teacher's query vector
  (the Microsoft paper's multi-stage ranking; skipped for the teacher itself);
* ``xy + teacher rerank below margin G`` (``--rerank-gates G ...``): the same, the teacher
  consulted only when the student's best answer in the query's language leads the next by
  less than G (``search.rerank_gate``); the share of queries it reranked is reported, and the
  mean matters more than the p50 here (two kinds of queries);
* with ``--rerankers teacher teacher:int8``, these rows for each reranker given (``teacher:int8``:
  the teacher's queries in int8, ``adapters/rerank/teacher.py``), labelled by its spec.

One query at a time on one thread (``torch.set_num_threads(1)``, ``model.threads: 1``): p50 and p95 over
``--queries`` questions of every language, after a warm-up; then ``xy`` again on ``--threads``
threads, as an application that leaves torch's default gets. Then throughput: ``search_batch``
over ``--batch`` questions on ``--threads`` threads (queries encoded in batches), queries/s.

Evaluation only: nothing is trained on XQuAD-R.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    header_markdown, interleaved, machine_info, markdown_table, measure_matmul_gflops, percentile, run_main)
from xquad_data import DEFAULT_DATA_DIR, load_xquad_r, parse_langs  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("query_encoders", nargs="*", default=["me5-small", "me5-small-student-k6"],
                   help="query encoders: the teacher, students; NAME in float32, NAME+int8 with int8 weights, "
                        "NAME+bf16 in bfloat16 (with the teacher reranker's encode; NAME+int8+bf16: "
                        "int8 queries, the teacher reranker in bfloat16), "
                        "NAME@onnx or NAME+int8@onnx through ONNX Runtime "
                        "[default: me5-small me5-small-student-k6]")
    p.add_argument("--model", default="me5-small", help="document encoder (the teacher)")
    p.add_argument("--index", type=Path, required=True, help="pooled XQuAD-R index folder (built if absent)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--langs", nargs="+")
    p.add_argument("--queries", type=int, default=300, help="questions timed one at a time")
    p.add_argument("--batch", type=int, default=1000, help="questions in the throughput run")
    p.add_argument("--threads", type=int, default=2, help="threads of the second xy run and the throughput run")
    p.add_argument("--rerank-depth", type=int, default=50)
    p.add_argument("--rerank-gates", type=float, nargs="*", default=[], metavar="G",
                   help="also time the teacher rerank gated at these first-stage margins")
    p.add_argument("--rerankers", nargs="+", default=["teacher"], metavar="SPEC",
                   help="teacher rerankers timed: teacher, teacher:int8, teacher:auto [default: teacher]")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


def timed(fn: Callable[[str], Any], texts: Sequence[str], warm: int = 20) -> list[float]:
    """Seconds per call of ``fn`` on each text, after ``warm`` untimed calls."""
    for text in texts[:warm]:
        fn(text)
    out = []
    for text in texts:
        t0 = time.perf_counter()
        fn(text)
        out.append(time.perf_counter() - t0)
    return out


def linear_time(model: Any, tokens: int, reps: int = 100) -> dict[str, Any] | None:
    """The model's linear layers alone, run in order on one query of ``tokens`` tokens on the
    current threads: how much of an encode is matrix multiplies, and at what rate. A query
    makes thin matrices (``tokens`` rows), which run far below encode_speed.py's ceiling for
    wide ones. int8 layers (``--int8``: torch's dynamically quantised ``Linear``) count too, at
    the FLOPs of their float32 twins; ``int8`` says how many there are. None without any."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    # a student's int8 recipe wraps each int8 layer to quantise its activations on 8 bits
    # (indexer.torch_int8): the wrapper is what runs, its inner layer says the shape
    wrapped = {id(m.dynamic) for m in model.modules() if isinstance(getattr(m, "dynamic", None), Int8Linear)}
    linears = [(m, getattr(m, "dynamic", m)) for m in model.modules()
               if id(m) not in wrapped and type(getattr(m, "dynamic", m)) in (torch.nn.Linear, Int8Linear)]
    if not linears:
        return None
    # in the layers' own float type (bfloat16 under model.precision: bfloat16; int8 layers take float32)
    dtype = next((s.weight.dtype for _, s in linears if type(s) is torch.nn.Linear), torch.float32)
    inputs = {shape.in_features: torch.randn(1, tokens, shape.in_features, dtype=dtype) for _, shape in linears}
    flops = sum(2 * tokens * shape.in_features * shape.out_features for _, shape in linears)

    def passes(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            for m, shape in linears:
                m(inputs[shape.in_features])
        return (time.perf_counter() - t0) / n

    with torch.inference_mode():
        passes(max(1, reps // 10))  # warm-up: one pass left this line noisy (2x between runs)
        # the median of five blocks: a burst of another process's work spoils one block, not all
        seconds = float(np.median([passes(max(1, reps // 5)) for _ in range(5)]))
    return {"tokens": tokens, "layers": len(linears), "int8": sum(type(s) is Int8Linear for _, s in linears),
            "mflop": flops / 1e6, "ms": 1000 * seconds, "gflops": flops / seconds / 1e9}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vecplug.api import Index, settings_for
    from vecplug.types import Document

    info = machine_info()
    print(header_markdown("Query latency, end to end", info), flush=True)
    # this machine's speed moves by up to 2x within minutes: the rate of a plain matrix multiply
    # on the one-at-a-time rows' thread, before and after, says how fast it ran meanwhile
    speed = {"before": measure_matmul_gflops(1)}
    data = load_xquad_r(args.data, args.langs)
    questions = [q.text for lang in data.langs for q in data.by_lang[lang].questions]
    rng = np.random.default_rng(0)
    sample = [questions[i] for i in rng.choice(len(questions), args.queries, replace=False)]
    batch = [questions[i] for i in rng.choice(len(questions), min(args.batch, len(questions)), replace=False)]

    settings = settings_for(str(args.index), model={"document": args.model})
    with Index.open(settings, create=True) as index:  # unchanged documents are skipped
        index.add_documents([Document(s.doc_id, s.text, f"xquad-r/{s.lang}", s.index, s.lang)
                             for s in data.sentences()], progress=True)
        documents, debias = index.store.count(), bool(index.manifest.get("debias"))

    rows: list[dict[str, Any]] = []
    linears: dict[str, Any] = {}
    for spec in args.query_encoders:
        name_quant, _, runtime = spec.partition("@")
        base, *tags = name_quant.split("+")
        unknown = set(tags) - {"int8", "bf16"}
        if unknown:
            raise SystemExit(f"error: {spec}: unknown suffix {', '.join(sorted(unknown))} (known: +int8, +bf16)")
        # precision pinned: ``auto`` would run the float32 rows in bfloat16 on a CPU with AMX
        model = {"query": base, "query_quantize": "int8" if "int8" in tags else "none",
                 "runtime": runtime or "torch", "precision": "bfloat16" if "bf16" in tags else "float32"}
        # one thread for the one-at-a-time rows, then all of the run's threads (what an
        # application that leaves the default gets) for xy again and the batched run; ONNX
        # Runtime fixes its threads when a session opens, hence one opening per setting
        for threads in (1, args.threads):
            with Index.open(settings_for(str(args.index), model={**model, "threads": threads})) as index:
                rows += _time_stages(index, spec, threads, sample, args.rerank_depth, args.rerank_gates,
                                     args.rerankers)
                if threads == 1:
                    query = index.encoder.query
                    tokens = int(np.median([len(t) for t in query.tokenize(
                        sample, index.encoder.query_prefix, index.encoder.query_max_length)]))
                    linears[spec] = linear_time(query.model, tokens) if query.onnx is None else None
                    continue
                index.search_batch(batch[:32], 10, mode="xy")
                t0 = time.perf_counter()
                index.search_batch(batch, 10, mode="xy")
                seconds = time.perf_counter() - t0
                rows.append({"query_encoder": spec, "stage": "xy, batched", "threads": threads,
                             "queries_per_s": len(batch) / seconds, "batch": len(batch)})
    speed["after"] = measure_matmul_gflops(1)
    return {"benchmark": "query_latency", "machine": info, "langs": data.langs, "documents": documents,
            "debias": debias, "queries": len(sample), "rerank_depth": args.rerank_depth, "rows": rows,
            "linears": linears, "matmul_1_thread": speed}


def _time_stages(index: Any, spec: str, threads: int, sample: Sequence[str],
                 rerank_depth: int, gates: Sequence[float] = (),
                 rerankers: Sequence[str] = ("teacher",)) -> list[dict[str, Any]]:
    """Latency rows of each stage, one query at a time (only ``xy`` when ``threads`` > 1)."""
    import torch

    reranked: dict[str, list[bool]] = {}

    def gated(rerank: str, gate: float, name: str) -> Callable[[str], Any]:
        def fn(text: str) -> Any:
            result = index.search(text, 10, mode="xy", rerank=rerank, rerank_depth=rerank_depth,
                                  rerank_gate=gate)
            reranked.setdefault(name, []).append(bool(result.reranked))
            return result
        return fn

    stages: list[tuple[str, Callable[[str], Any]]] = [
        ("encode", lambda t: index.encoder.encode_queries([t])),
        ("xy", lambda t: index.search(t, 10, mode="xy")),
        ("mono", lambda t: index.search(t, 10, mode="mono")),
    ]
    for rerank in rerankers if index.encoder.query_info.teacher is not None else ():
        # a student: the teacher reranks it
        stages.append((f"xy + {rerank} rerank", lambda t, rerank=rerank: index.search(
            t, 10, mode="xy", rerank=rerank, rerank_depth=rerank_depth)))
        stages += [(name, gated(rerank, g, name)) for g in gates
                   for name in [f"xy + {rerank} rerank below margin {g:g}"]]
    rows = []
    for name, fn in stages:
        if threads > 1 and name != "xy":
            continue
        torch.set_num_threads(threads)
        fn(sample[0])  # models (the reranker's teacher too) load outside the clock
        lat = timed(fn, sample)
        rows.append(_row(spec, name, threads, lat, traced=index.encoder.query.graph is not None))
        if name in reranked:  # the timed queries' share (the warm-up's are not counted)
            rows[-1]["reranked"] = float(np.mean(reranked[name][-len(sample):]))
    query = index.encoder.query
    if threads == 1 and query.graph is not None:
        # the torch runtime's traced graph against the eager model, query by query
        graph = query.graph

        def eager(text: str) -> Any:
            query.graph = None
            try:
                return index.encoder.encode_queries([text])
            finally:
                query.graph = graph

        fns = {"traced graph": lambda t: index.encoder.encode_queries([t]), "eager": eager}
        if query.quantize == "int8" and index.encoder.query_info.teacher is not None:
            # a student's int8 recipe (indexer.torch_int8) against the general one, traced too
            general, enc = _general_int8(index), index.encoder
            fns["traced graph, general int8 recipe"] = lambda t: general.encode(
                [t], enc.query_prefix, enc.query_max_length, progress=False)
        times = interleaved(list(fns.values()), sample)
        rows += [_row(spec, f"encode, interleaved: {name}", threads, lat, traced=name != "eager")
                 for name, lat in zip(fns, times)]
    return rows


def _general_int8(index: Any) -> Any:
    """The index's student with torch's general int8 recipe (the FFN down-projections float32,
    activations on 7 bits), its graph traced in a warm-up: a ``TextEncoder``."""
    from vecplug.indexer.encoder import TextEncoder

    enc = index.encoder
    shared = enc.query.model.get_input_embeddings().weight.detach()
    general = TextEncoder(enc.query_info, enc.batch_tokens, enc.threads, shared, post=enc.query.post,
                          quantize="int8", runtime="torch", int8_recipe="int8-general")
    for _ in range(general.trace_after or 0):
        general.encode(["warm-up query"], enc.query_prefix, enc.query_max_length, progress=False)
    return general


def _row(spec: str, stage: str, threads: int, lat: Sequence[float], traced: bool) -> dict[str, Any]:
    row = {"query_encoder": spec, "stage": stage, "threads": threads, "p50_ms": 1000 * percentile(lat, 50),
           "p95_ms": 1000 * percentile(lat, 95), "mean_ms": 1000 * float(np.mean(lat)), "traced": traced}
    print(f"{spec} {stage} ({threads} threads): p50 {row['p50_ms']:.1f} ms", file=sys.stderr, flush=True)
    return row


def render(r: dict[str, Any]) -> str:
    headers = ["query encoder", "what is timed", "threads", "p50 ms", "p95 ms", "mean ms", "queries/s"]
    rows = [[x["query_encoder"], x["stage"] + (f" ({x['reranked']:.0%} reranked)" if "reranked" in x else ""),
             str(x["threads"]),
             f"{x['p50_ms']:.1f}" if "p50_ms" in x else "-", f"{x['p95_ms']:.1f}" if "p95_ms" in x else "-",
             f"{x['mean_ms']:.1f}" if "mean_ms" in x else "-",
             f"{x['queries_per_s']:.0f}" if "queries_per_s" in x else f"{1000 / x['mean_ms']:.0f}"]
            for x in r["rows"]]
    return "\n".join([
        f"Pooled XQuAD-R index of {r['documents']:,} sentences ({', '.join(r['langs'])}), hnswlib, "
        f"language-bias correction {'on' if r['debias'] else 'off'}; top 10. One query at a time: "
        f"{r['queries']} questions of every language, in-process `Index.search` (language detection, "
        f"encoding, search, records; the teacher rerank re-scores the top {r['rerank_depth']}). "
        "queries/s of a one-at-a-time row is 1 / mean latency; 'batched' is `search_batch`.",
        "", markdown_table(headers, rows, "llrrrrr"), "", *_speed_line(r.get("matmul_1_thread")),
        *_traced_line(r["rows"]),
        *[f"- {spec}: its {x['layers']} linear layers{_int8_share(x)} alone, on one query of {x['tokens']} tokens (the "
          f"median) on one thread: {x['ms']:.1f} ms for {x['mflop']:.0f} MFLOP, {x['gflops']:.0f} GFLOP/s"
          for spec, x in r.get("linears", {}).items() if x]])


def _speed_line(speed: dict[str, Any] | None) -> list[str]:
    """The machine's speed during the run (results written before it was measured lack it)."""
    if not speed:
        return []
    b, a = speed["before"], speed["after"]
    return [f"- this machine's speed: fp32 {b['size']}x{b['size']} matrix multiply on one thread, median "
            f"{b['median_gflops']:.0f} GFLOP/s before the runs and {a['median_gflops']:.0f} after "
            f"(best {b['best_gflops']:.0f} / {a['best_gflops']:.0f})"]


def _traced_line(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Which encoders ran their query model as a traced graph (results from before lack it)."""
    specs = list(dict.fromkeys(x["query_encoder"] for x in rows if x.get("traced")))
    if not any("traced" in x for x in rows):
        return []
    return [f"- the query model ran as a traced TorchScript graph (`indexer.traced`, made during the "
            f"warm-up) for: {', '.join(specs) or 'none'}; the 'interleaved' rows time it against the "
            "eager model, query by query"]


def _int8_share(x: dict[str, Any]) -> str:
    n = x.get("int8", 0)  # results written before int8 layers were timed lack the key
    return f" ({n} of them int8)" if n else ""


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
