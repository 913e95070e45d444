"""How crowded the exact top 10 of ``ann_scale.py``'s data is: the ceiling it puts on recall.

An approximate search misses a true neighbour most easily where many documents score almost
as high as it: the 10th neighbour and the 30th can differ in the third decimal, and a graph
walk that orders them by a hair (or never visits one of them) loses a point of strict
recall@10. For each data set in ``ann_scale.py``'s work folder (its ``stats-*.json`` with
the base vectors, queries and exact scores next to it), this counts, per query, the base
documents whose score is within ``d`` of the exact 10th neighbour's (the 10 themselves
included, so 10 means nothing else is near), for a few ``d``, and prints their median, 90th
percentile and the share of queries with at least 20.

Usage::

    python benchmarks/ann_crowding.py --work /tmp/benchwork/ann [--json out.json]

(``--work`` is the folder ``ann_scale.py --work`` wrote; ``BENCH=ann_debian
benchmarks/run_all.sh`` keeps it in ``/tmp/benchwork/ann`` unless told otherwise.)
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann_scale import K, RowReader  # noqa: E402
from bench_common import header_markdown, machine_info, markdown_table, run_main  # noqa: E402

DELTAS = (0.001, 0.005, 0.01, 0.02)
CHUNK = 100_000


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True, help="ann_scale.py's work folder")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def crowding(base: Path, queries: np.ndarray, tenth: np.ndarray,
             deltas: Sequence[float] = DELTAS) -> dict[float, np.ndarray]:
    """Per query and ``d`` in ``deltas``: how many rows of ``base`` (a float32 ``.npy``) score
    at least ``tenth - d`` against it (``tenth``: its exact 10th neighbour's score)."""
    counts = {d: np.zeros(len(queries), dtype=np.int64) for d in deltas}
    reader = RowReader(base)
    try:
        for _, rows in reader.chunks(CHUNK):
            scores = queries @ rows.T
            for d in deltas:
                counts[d] += (scores >= (tenth - d)[:, None]).sum(1)
    finally:
        reader.close()
    return counts


def run(args: argparse.Namespace) -> dict[str, Any]:
    sets = []
    for stats_path in sorted(args.work.glob("stats-*.json")):
        key = stats_path.stem.removeprefix("stats-")
        paths = {name: args.work / f"{name}-{key}.npy" for name in ("base", "queries", "gt_scores")}
        if not all(p.is_file() for p in paths.values()):
            continue
        stats = json.loads(stats_path.read_text())
        queries = np.load(paths["queries"], allow_pickle=False)
        tenth = np.load(paths["gt_scores"], allow_pickle=False)[:, K - 1]
        counts = crowding(paths["base"], queries, tenth)
        vectors = stats["params"].get("vectors")
        sets.append({"key": key, "n": stats["params"]["n"], "queries": len(queries),
                     "data": Path(vectors[0]).name if vectors else "synthetic (clustered)",
                     "tenth_cos": [float(np.percentile(tenth, q)) for q in (10, 50, 90)],
                     "within": {str(d): {"median": float(np.median(c)), "p90": float(np.percentile(c, 90)),
                                         "share_20": float(np.mean(c >= 20))} for d, c in counts.items()}})
    if not sets:
        raise SystemExit(f"error: no ann_scale.py data in {args.work} (stats-*.json with base, queries, gt_scores)")
    return {"benchmark": "ann_crowding", "machine": machine_info(), "work": str(args.work), "sets": sets}


def render(r: dict[str, Any]) -> str:
    out = [header_markdown("How crowded the exact top 10 is", r["machine"]), ""]
    for s in r["sets"]:
        rows = [[f"{float(d):g}", f"{w['median']:.0f}", f"{w['p90']:.0f}", f"{w['share_20']:.1%}"]
                for d, w in s["within"].items()]
        out += [f"{s['data']}: {s['n']:,} base vectors, {s['queries']:,} queries (`{s['key']}`); the exact 10th "
                f"neighbour's cosine p10/p50/p90 " + " / ".join(f"{c:.3f}" for c in s["tenth_cos"]), "",
                markdown_table(["within d of the 10th's score", "documents, median", "p90",
                                "queries with >= 20"], rows, "lrrr"), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
