"""How crowded the exact top 10 of ``ann_scale.py``'s data is: the ceiling it puts on recall.

An approximate search misses a true neighbour most easily where many documents score almost
as high as it: the 10th neighbour and the 30th can differ in the third decimal, and a graph
walk that orders them by a hair (or never visits one of them) loses a point of strict
recall@10. For each data set in ``ann_scale.py``'s work folder (its ``stats-*.json`` with
the base vectors, queries and exact scores next to it), this counts, per query, the base
documents whose score is within ``d`` of the exact 10th neighbour's (the 10 themselves
included, so 10 means nothing else is near), for a few ``d``, and prints their median, 90th
percentile and the share of queries with at least 20.

With ``--partitions N`` it also asks whether the data would suit a partitioned index (IVF:
cluster the vectors, then scan exactly the lists whose centres are nearest the query, as
faiss's IVF indexes do) instead of a graph: spherical k-means (``--iterations`` rounds on a
sample of ``64 N`` evenly spaced rows, seeded) cuts the base into N lists, and for each number
of lists probed it reports the mean share of the exact top 10 inside the probed lists (the
recall@10 of an exact scan of them: an upper bound for any IVF index with these lists) and the
vectors that scan reads.

Usage::

    python benchmarks/ann_crowding.py --work /tmp/benchwork/ann [--partitions 1024] [--json out.json]

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
#: lists probed, as a share of the lists (``--partitions``)
PROBE_SHARES = (1 / 256, 1 / 128, 1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True, help="ann_scale.py's work folder")
    p.add_argument("--partitions", type=int, default=0, metavar="N",
                   help="also cut each base into N k-means lists and measure an exact scan of the nearest ones")
    p.add_argument("--iterations", type=int, default=12, help="k-means rounds (--partitions)")
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


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def partitions(base: Path, queries: np.ndarray, truth: np.ndarray, lists: int, iterations: int = 12,
               seed: int = 0) -> dict[str, Any]:
    """Spherical k-means of ``base`` into ``lists`` lists; per number of lists probed (the
    nearest centres to each query): the mean share of each query's exact neighbours
    (``truth``, row ids) inside them, and the mean number of vectors they hold."""
    reader = RowReader(base)
    try:
        n = reader.shape[0]
        lists = max(1, min(lists, n))
        step = max(1, n // (64 * lists))
        sample = np.concatenate([rows[(-a) % step::step] for a, rows in reader.chunks(CHUNK)])
        rng = np.random.default_rng(seed)
        centres = sample[rng.choice(len(sample), lists, replace=False)].copy()
        for _ in range(iterations):
            nearest = (sample @ centres.T).argmax(1)
            sums = np.zeros_like(centres)
            np.add.at(sums, nearest, sample)
            held = np.bincount(nearest, minlength=lists) > 0
            centres[held] = _unit(sums[held])  # an empty list keeps its centre
        assign = np.concatenate([(rows @ centres.T).argmax(1) for _, rows in reader.chunks(CHUNK)])
    finally:
        reader.close()
    sizes = np.bincount(assign, minlength=lists)
    order = np.argsort(-(queries @ centres.T), axis=1)
    truth_lists = assign[truth]
    probes = sorted({max(1, round(lists * share)) for share in PROBE_SHARES})
    rows = []
    for probe in probes:
        probed = order[:, :probe]
        found = [np.isin(truth_lists[i], probed[i]).mean() for i in range(len(queries))]
        rows.append({"probe": probe, "share": probe / lists, "recall": float(np.mean(found)),
                     "scanned": float(np.mean(sizes[probed].sum(1)))})
    return {"lists": lists, "iterations": iterations, "sample": len(sample),
            "list_size": [float(np.percentile(sizes, q)) for q in (10, 50, 90)] + [int(sizes.max())],
            "probes": rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sets = []
    for stats_path in sorted(args.work.glob("stats-*.json")):
        key = stats_path.stem.removeprefix("stats-")
        paths = {name: args.work / f"{name}-{key}.npy" for name in ("base", "queries", "gt", "gt_scores")}
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
        if args.partitions:
            truth = np.load(paths["gt"], allow_pickle=False)[:, :K]
            sets[-1]["partitions"] = partitions(paths["base"], queries, truth, args.partitions, args.iterations)
    if not sets:
        raise SystemExit(f"error: no ann_scale.py data in {args.work} (stats-*.json with base, queries, gt, gt_scores)")
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
        part = s.get("partitions")
        if part:
            size = part["list_size"]
            out += [f"Partitioned into {part['lists']:,} lists (spherical k-means, {part['iterations']} rounds on "
                    f"{part['sample']:,} rows; list size p10/p50/p90/max {size[0]:.0f} / {size[1]:.0f} / "
                    f"{size[2]:.0f} / {size[3]:,}): the exact top 10 inside the lists nearest the query", "",
                    markdown_table(["lists probed", "share of the lists", "vectors scanned, mean",
                                    "recall@10 of an exact scan"],
                                   [[f"{r['probe']:,}", f"{r['share']:.2%}", f"{r['scanned']:,.0f}",
                                     f"{r['recall']:.4f}"] for r in part["probes"]], "rrrr"), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
