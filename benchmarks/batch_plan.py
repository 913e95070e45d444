"""How the encoder cuts a call's texts into batches: padding and speed per call size.

The encoder sorts a call's texts by length and pads each batch to its longest. Before
``vecplug.indexer.length_batches``, batches were filled up to the token budget (at most 128
texts) in sorted order ("fill"); now the cuts minimise padded tokens plus a fixed cost per
forward pass ("plan", for each ``--overheads`` value of that cost). A big call pads little
either way; a small call (an API user's ``add_documents`` of a few hundred texts, an
integration's ``embed_documents``) is where the two differ.

For each call size (``--calls``) the same texts (XQuAD-R sentences, or passages with
``--passages``, sampled and mixed as ``encode_speed.py`` does) are encoded in consecutive
calls of that many; in each of ``--rounds`` rounds every variant runs once, the order rotated,
so the machine's drift falls on all alike. Reported: docs/s (median over rounds), the ratio to
"fill" (median of the per-round ratios), padded tokens over real tokens, forward passes.

    .venv/bin/python benchmarks/batch_plan.py --json benchmarks/results/batch_plan.json
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import header_markdown, machine_info, markdown_table, run_main  # noqa: E402
from encode_speed import PREFIX, build_corpus  # noqa: E402
from xquad_data import DEFAULT_DATA_DIR, parse_langs  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="me5-small", help="document encoder (default: %(default)s)")
    p.add_argument("--precision", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="model.precision (default: %(default)s)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="XQuAD-R folder (default: %(default)s)")
    p.add_argument("--langs", nargs="+", help="languages (default: all files)")
    p.add_argument("--docs", type=int, default=2048, help="texts (default: %(default)s)")
    p.add_argument("--passages", action="store_true", help="join consecutive sentences into longer passages")
    p.add_argument("--passage-tokens", type=int, default=200, help="passage size in tokens (default: %(default)s)")
    p.add_argument("--calls", type=int, nargs="+", default=[32, 256, 2048], help="texts per call")
    p.add_argument("--overheads", type=int, nargs="+", default=[256, 512, 1024],
                   help="the plan's fixed cost of a forward pass, in padded tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="save the results as JSON here")
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


def fill(lengths: Sequence[int], batch_tokens: int, max_rows: int, hidden: int = 384,
         overhead: int = 0) -> list[list[int]]:
    """The encoder's batches before ``length_batches``: sorted, each filled to the budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    out, start = [], 0
    while start < len(order):
        size = max(1, min(max_rows, batch_tokens // max(lengths[order[start]], 1)))
        out.append(order[start:start + size])
        start += size
    return out


def _plan_with(plan: Callable[..., list[list[int]]], overhead: int, lengths: Sequence[int], batch_tokens: int,
               max_rows: int, hidden: int = 384, _encoder_overhead: int = 0) -> list[list[int]]:
    return plan(lengths, batch_tokens, max_rows, hidden, overhead)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vecplug.indexer import length_batches
    from vecplug.indexer.encoder import MAX_BATCH_SIZE, Encoder

    info = machine_info()  # the date and load average at the start
    encoder = Encoder.from_specs(args.model, threads=args.threads, precision=args.precision)
    doc = encoder.document
    texts, _langs, corpus = build_corpus(args, doc.tokenizer)
    lengths = [len(seq) for seq in doc.tokenize(texts, encoder.document_prefix, encoder.document_limit())]
    plans: dict[str, Callable[..., list[list[int]]]] = {"fill": fill}
    for o in args.overheads:  # the encoder passes its own overhead: each variant replaces it
        plans[f"plan-{o}"] = functools.partial(_plan_with, length_batches.plan, o)
    original = length_batches.plan
    encoder.encode_documents(texts[:64])  # warm-up
    timings: dict[tuple[int, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            for call in args.calls:
                names = list(plans)
                for name in names[r % len(names):] + names[:r % len(names)]:
                    length_batches.plan = plans[name]  # what TextEncoder._batches calls
                    t0 = time.perf_counter()
                    for a in range(0, len(texts), call):
                        encoder.encode_documents(texts[a:a + call])
                    timings.setdefault((call, name), []).append(time.perf_counter() - t0)
    finally:
        length_batches.plan = original
    rows = []
    for call in args.calls:
        for name, fn in plans.items():
            padded = forwards = 0
            for a in range(0, len(lengths), call):
                part = lengths[a:a + call]
                batches = fn(part, doc.batch_tokens, MAX_BATCH_SIZE, doc.dim)
                forwards += len(batches)
                padded += sum(len(b) * part[b[0]] for b in batches)
            ts = timings[(call, name)]
            ratios = [f / t for f, t in zip(timings[(call, "fill")], ts)]
            rows.append({"call": call, "plan": name, "docs_per_s": len(texts) / statistics.median(ts),
                         "ratio_to_fill": statistics.median(ratios), "padded_over_real": padded / sum(lengths),
                         "forwards": forwards, "seconds": ts})
    return {**info, "model": args.model,
            "precision": doc.precision, "corpus": {**corpus, "texts": len(texts), "tokens": sum(lengths),
                                                   "prefix": PREFIX},
            "batch_tokens": doc.batch_tokens, "rounds": args.rounds, "rows": rows}


def render(r: dict[str, Any]) -> str:
    c = r["corpus"]
    lines = [header_markdown("Batch plans: padding and speed per call size", r),
             f"{r['model']} documents in {r['precision']}; {c['texts']:,} XQuAD-R {c['kind']} "
             f"({c['tokens']:,} tokens), encoded in consecutive calls of N; budget {r['batch_tokens']:,} padded "
             f"tokens a batch; median of {r['rounds']} interleaved rounds.", ""]
    table = [[f"{row['call']:,}", row["plan"], f"{row['docs_per_s']:.1f}", f"{row['ratio_to_fill']:.3f}",
              f"{row['padded_over_real']:.3f}", f"{row['forwards']:,}"] for row in r["rows"]]
    lines.append(markdown_table(["texts a call", "batches", "docs/s", "x fill", "padded / real tokens",
                                 "forward passes"], table))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(run_main(parse_args, run, render))
