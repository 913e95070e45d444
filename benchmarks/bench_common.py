"""Helpers shared by the benchmark scripts: machine header, Markdown tables, JSON output."""
from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# the machine header, tables and number formats live in the package (``vecplug eval`` writes
# the same header); re-exported here so every benchmark keeps importing them from bench_common
from vecplug.report import (  # noqa: F401
    command_line, cpu_model, fmt, header_markdown, machine_info, markdown_table, pct, percentile)


def save_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented UTF-8 JSON (creating folders) when ``path`` is given;
    through a temporary file, so an interrupted run never leaves half a file."""
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def run_main(parse_args: Callable[[Sequence[str] | None], Any], run: Callable[[Any], dict[str, Any]],
             render: Callable[[dict[str, Any]], str], argv: Sequence[str] | None = None) -> int:
    """The shared ``main`` of every benchmark: parse, run, print the tables, save the JSON."""
    args = parse_args(argv)
    results = run(args)
    print(render(results))
    save_json(args.json, results)
    return 0


def exact_map_at_k(scores: Any, doc_ids: Sequence[str], relevant: Sequence[set[str]], k: int = 20) -> float:
    """mAP@k of exact search: ``scores`` (queries x documents) ranked per row, the top ``k``
    documents' ids (``doc_ids``, by column) scored against each query's ``relevant`` ids."""
    import numpy as np

    from vecplug.metrics import average_precision_at_k

    ids = np.asarray(doc_ids)
    top = np.argpartition(-scores, k, axis=1)[:, :k] if scores.shape[1] > k else np.argsort(-scores, axis=1)
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)
    return float(np.mean([average_precision_at_k(list(ids[t]), rel, k) for t, rel in zip(top, relevant)]))


def keeps_torch_threads(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` giving torch's thread count back as it found it: a benchmark sets it for its
    timings, and a caller in the same process (a test) would run on with that."""
    import functools

    @functools.wraps(fn)
    def kept(*args: Any, **kwargs: Any) -> Any:
        import torch

        threads = torch.get_num_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return kept


def measure_matmul_gflops(threads: int, size: int = 2048, repeats: int = 8) -> dict[str, float]:
    """fp32 ``size`` x ``size`` matrix multiply on ``threads`` threads: best and median GFLOP/s."""
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(size, size, generator=gen)
    b = torch.rand(size, size, generator=gen)
    torch.mm(a, b)  # warm-up: thread pool, caches
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        rates.append(2.0 * size ** 3 / (time.perf_counter() - t0) / 1e9)
    return {"size": size, "repeats": repeats, "best_gflops": max(rates),
            "median_gflops": statistics.median(rates)}


def interleaved(fns: Sequence[Callable[[str], Any]], texts: Sequence[str]) -> list[list[float]]:
    """Seconds per call of each of ``fns`` on each text, the functions called in turn on every
    text (the order rotated), so that the machine's drift falls on all of them alike."""
    out: list[list[float]] = [[] for _ in fns]
    for i, text in enumerate(texts):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            t0 = time.perf_counter()
            fns[k](text)
            out[k].append(time.perf_counter() - t0)
    return out


def documents_interleaved(encoders: dict[str, Any], texts: Sequence[str], chunks: int
                          ) -> tuple[dict[str, Any], dict[str, float], dict[str, int]]:
    """Every text encoded as a document by each of ``encoders`` (``Encoder``s by name), in
    ``chunks`` chunks with the encoders in turn chunk by chunk, the order rotated each chunk
    (the machine's drift falls on all), after an untimed warm-up on a few texts: per name the
    (n, dim) vectors, the seconds and the tokens encoded."""
    import numpy as np

    names = list(encoders)
    vectors = {k: np.zeros((len(texts), e.dim), np.float32) for k, e in encoders.items()}
    seconds, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    for e in encoders.values():  # first batches allocate and plan (and an int8 model calibrates)
        e.encode_documents(list(texts[:32]), progress=False)
    for i, chunk in enumerate(np.array_split(np.arange(len(texts)), chunks)):
        for k in names[i % len(names):] + names[:i % len(names)]:
            before = encoders[k].document.tokens_seen
            t0 = time.perf_counter()
            vectors[k][chunk] = encoders[k].encode_documents([texts[j] for j in chunk], progress=False)
            seconds[k] += time.perf_counter() - t0
            tokens[k] += encoders[k].document.tokens_seen - before
    return vectors, seconds, tokens


def x_y_map(queries: Any, docs: Any, means: Any, centred_docs: Any, query_langs: Sequence[str],
            doc_ids: Any, relevant: Sequence[set[str]]) -> list[float]:
    """X-Y mAP@20 over the pooled documents (exact search), plain and with the language-bias
    correction (``means``: the documents' language means; ``centred_docs``: the documents
    centred with them)."""
    return [exact_map_at_k(q_vecs @ d_vecs.T, doc_ids, relevant, 20)
            for q_vecs, d_vecs in ((queries, docs), (means.centre(queries, query_langs), centred_docs))]
