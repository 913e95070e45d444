"""Exact search of a batch of queries at once: what a scan does with matrix units.

Issue 6 asks for recall@10 >= 0.99 "under 1 ms per query" at a million 384-d vectors in
under 2 GB. One query at a time, no graph measured gets there (``ann_scale.py``: 0.955 at
0.92 ms). This measures the other reading of "per query": a batch of queries answered
together, by an exact scan, costs its time divided by the queries. On a CPU with matrix
units (Intel AMX), a bfloat16 matrix product of 1,000 queries by a million vectors is a
few hundred milliseconds; the rest is finding each query's best columns in the product
without reading all of it twice.

The scan (:func:`scan`), for vectors kept as two bfloat16 halves ``hi + lo`` (``hi`` the
vector rounded to bfloat16, ``lo`` what it left: 1,465 MiB for a million 384-d vectors,
exactly float32's size, so nothing is kept twice):

1. each query's floor starts just below the ``k``-th best score among the first columns;
2. per step of columns, ``queries @ hi.T`` in bfloat16, less a shift just under each query's
   floor, subtracted inside the product before its rounding to bfloat16: the scores that
   matter are then within ~0.01 of zero, where bfloat16 is fine-grained (6e-5 apart there
   instead of 0.004 near a cosine of 0.9), and the floor is a small positive number, so a row's
   entries compare as int16 (which orders bfloat16 numbers above zero as the numbers do):
   one int16 maximum per query and step says whether the step holds anything above it;
3. for the queries it does, every column above the floor is a candidate, and the floor rises
   to just under the new ``k``-th best;
4. the candidates above the final floors are rescored exactly (``q . (hi + lo)`` in float32:
   within ~1e-6 of the float32 score) and each query's best ``k`` returned.

The floor is the ``k``-th best approximate score less a slack: twice the error of an
approximate score (the inputs' rounding to bfloat16, allowed ``INPUT_ERROR``, of which
``--check`` measures the largest over many pairs, and the product's rounding,
``PRODUCT_ERROR``). A true top-``k`` document is missed only if its approximate score is
off by more than the slack; the recall column counts every miss.

``--float32`` runs the same scan in float32 (one copy, no slack) for comparison: what the
matrix units buy. Recall is against ``ann_scale.py``'s exact top 10 (strict: the ids).

This is a measurement, not a vecplug store: vecplug's stores answer one query at a time
through a graph (see the README's "Index build and search at scale").

Usage::

    python benchmarks/exact_batch.py --work /tmp/benchwork/ann [--batches 1 10 100 1000]
        [--threads 1 2] [--float32] [--json out.json]

(``--work``: the folder ``ann_scale.py --work`` wrote, as ``ann_crowding.py`` reads it.)
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
from ann_scale import K, RowReader, _rss_now, _rss_peak  # noqa: E402
from bench_common import header_markdown, machine_info, markdown_table, run_main  # noqa: E402

#: columns a step of the scan multiplies (at least): 1,000 queries x 4,096 columns of bfloat16
#: scores is 8 MB, and the product ran fastest per column at 4,096 here (1,024-16,384 tried)
CHUNK = 4096
#: scores a step computes when the batch is smaller (a step's fixed cost, ~0.4 ms, is spread
#: over more columns): one query reads a million columns in one step
STEP_SCORES = 4_096_000
#: the most a score computed from bfloat16-rounded inputs (each entry within 2^-9 of its
#: float32 value, relatively) may differ from the float32 score, unless ``--check`` measures it
#: (then: CHECK_ROOM x the largest difference over every query and the rows it reads)
INPUT_ERROR = 1e-3
CHECK_ROOM = 1.25
#: the shifted product's rounding to bfloat16: half a unit in the last place of a score 0.01
#: above the shift (3.05e-5; the k-th best is ~0.006 above it; 3.09e-5 measured there on
#: random vectors). A floor raised by a much better step can be set a little higher (2^-9 of its
#: distance to the shift): the input allowance has room for it
PRODUCT_ERROR = 3e-5
BASE_CHUNK = 20_000
#: candidates rescored at a time (their rows are gathered in float32)
RESCORE = 32_768


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True, help="ann_scale.py's work folder")
    p.add_argument("--size", type=int, help="only the data set of this many base vectors")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100, 1000],
                   help="queries answered together")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads")
    p.add_argument("--float32", action="store_true", help="also scan a float32 copy (no bfloat16)")
    p.add_argument("--check", type=int, default=20_000, metavar="ROWS",
                   help="measure the bfloat16 inputs' score error on this many base rows (0: skip)")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def split(rows: np.ndarray) -> tuple[Any, Any]:
    """(hi, lo): bfloat16 halves whose sum is ``rows`` within ~2^-17 relatively."""
    import torch

    x = torch.from_numpy(rows)
    hi = x.to(torch.bfloat16)
    return hi, (x - hi.float()).to(torch.bfloat16)


def load(base: Path, halves: bool) -> tuple[Any, Any | None]:
    """The base vectors as (hi, lo) bfloat16 halves, or (float32, None), read in chunks."""
    import torch

    reader = RowReader(base)
    try:
        n, d = reader.shape
        if not halves:
            out = torch.empty((n, d), dtype=torch.float32)
            for a, rows in reader.chunks(BASE_CHUNK):
                out[a:a + len(rows)] = torch.from_numpy(rows)
            return out, None
        hi = torch.empty((n, d), dtype=torch.bfloat16)
        lo = torch.empty((n, d), dtype=torch.bfloat16)
        for a, rows in reader.chunks(BASE_CHUNK):
            hi[a:a + len(rows)], lo[a:a + len(rows)] = split(rows)
        return hi, lo
    finally:
        reader.close()


def _ulp(x: Any) -> Any:
    """A bfloat16 unit in the last place at ``|x|``: 2^(exponent - 7)."""
    import torch

    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)


def _padded(rows: Any, values: Any, groups: int, fill: float, width: int = 1) -> tuple[Any, Any]:
    """``values`` grouped by ``rows`` (sorted, in ``range(groups)``) as the rows of a table at
    least ``width`` wide, padded with ``fill``: (table, each value's column in it)."""
    import torch

    counts = torch.bincount(rows, minlength=groups)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(rows)) - starts[rows]
    table = torch.full((groups, max(width, int(counts.max()) if len(rows) else 0)), fill, dtype=values.dtype)
    table[rows, slot] = values
    return table, slot


def scan(queries: Any, hi: Any, lo: Any | None, k: int, chunk: int | None = None,
         input_error: float = INPUT_ERROR) -> tuple[Any, Any, dict[str, float]]:
    """Exact top ``k`` (ids, float32 scores) of every row of ``queries`` (float32, unit) among
    the rows of ``hi`` (+ ``lo``: bfloat16 halves; ``lo`` None: ``hi`` is float32 and the scan
    exact as it goes); module docstring. ``input_error``: the most a score of bfloat16-rounded
    inputs may differ from the float32 score. Also returns counts: candidates per query, share of
    (query, chunk) pairs read further."""
    import torch

    approximate = lo is not None
    # how far below the k-th best approximate score a true top-k document can score: twice
    # (the k-th best is approximate too) an approximate score's error; none in float32
    slack = 2 * (input_error + PRODUCT_ERROR) if approximate else 0.0
    B, n = len(queries), len(hi)
    # fewer queries, longer steps: the same scores a step, fewer steps (each has a fixed cost)
    chunk = chunk or max(CHUNK, STEP_SCORES // B)
    q = queries.to(hi.dtype)
    best = torch.full((B, k), -torch.inf)
    # a floor from the start: the k-th best of the first CHUNK columns (a lower bound of the
    # final one); otherwise the first step would admit all its columns as candidates (1,000
    # queries x 4,096: ~200 MB of them)
    first = (q @ hi[:CHUNK].T).float()
    start = torch.full((B,), -torch.inf)
    if first.shape[1] >= k:
        start = first.topk(k, dim=1).values[:, -1]
        start = start - slack
    del first
    rows_found, cols_found, values_found = [], [], []
    read = 0
    for a in range(0, n, chunk):
        floor = torch.maximum(best[:, -1] - slack, start)
        if approximate and bool(torch.isfinite(floor).all()):
            # the product less a shift just below each query's floor (added inside the product,
            # before its rounding to bfloat16): the scores that matter are then near zero, where
            # bfloat16 is fine-grained, and the floor is a small positive number, so the rows
            # compare as int16 (which orders bfloat16 numbers above zero as the numbers do)
            shift = (floor - _ulp(floor)).to(torch.bfloat16)
            S = torch.addmm(-shift[:, None], q, hi[a:a + chunk].T)
            gap = floor - shift.float()
            limit = (gap - _ulp(gap)).clamp_min(0).to(torch.bfloat16)
            hit = (S.view(torch.int16).amax(1) >= limit.view(torch.int16)).nonzero().squeeze(1)
        else:
            shift = None
            S = q @ hi[a:a + chunk].T
            limit = floor.to(S.dtype)
            hit = (S.amax(1) >= limit).nonzero().squeeze(1)
        if not len(hit):
            continue
        read += len(hit)
        sub = S.index_select(0, hit)  # (much faster than S[hit] here)
        if shift is None:
            r, c = (sub >= limit[hit, None]).nonzero(as_tuple=True)
        else:
            r, c = (sub.view(torch.int16) >= limit[hit, None].view(torch.int16)).nonzero(as_tuple=True)
        values = sub[r, c].float() + (0 if shift is None else shift[hit[r]].float())
        # the chunk's candidates join each query's running best k
        table, _ = _padded(r, values, len(hit), -torch.inf)
        best[hit] = torch.cat([best[hit], table], 1).topk(k, dim=1).values
        # what the raised floor no longer admits goes now
        keep = values >= torch.maximum(best[hit, -1] - slack, start[hit])[r]
        rows_found.append(hit[r[keep]])
        cols_found.append(c[keep] + a)
        values_found.append(values[keep])
    rows, cols, values = torch.cat(rows_found), torch.cat(cols_found), torch.cat(values_found)
    # the final thresholds: what an earlier, lower one let in goes
    keep = values >= torch.maximum(best[:, -1] - slack, start)[rows]
    rows, cols = rows[keep], cols[keep]
    order = torch.argsort(rows, stable=True)  # query by query
    rows, cols = rows[order], cols[order]
    exact = torch.cat([(queries[rows[i:i + RESCORE]] * _rows(hi, lo, cols[i:i + RESCORE])).sum(1)
                       for i in range(0, len(rows), RESCORE)])
    table, slot = _padded(rows, exact, B, -torch.inf, width=k)  # (fewer than k documents: -1s)
    ids = torch.full(table.shape, -1, dtype=torch.int64)
    ids[rows, slot] = cols
    top_s, top_j = table.topk(k, dim=1)
    stats = {"candidates": len(rows) / B, "read_share": read / (B * -(-n // chunk))}
    return torch.gather(ids, 1, top_j), top_s, stats


def _rows(hi: Any, lo: Any | None, cols: Any) -> Any:
    """Rows ``cols`` of the base as float32 (``hi + lo``, or ``hi`` itself)."""
    return hi[cols].float() if lo is None else hi[cols].float() + lo[cols].float()


def input_error(base: Path, queries: np.ndarray, rows: int) -> float:
    """The largest |bfloat16-input score - float32 score| over ``queries`` and the first
    ``rows`` base vectors (the product accumulated in float32 both ways)."""
    import torch

    reader = RowReader(base)
    try:
        X = reader.read(0, min(rows, reader.shape[0]))
    finally:
        reader.close()
    Q = torch.from_numpy(queries)
    exact = Q @ torch.from_numpy(X).T
    rounded = Q.to(torch.bfloat16).float() @ torch.from_numpy(X).to(torch.bfloat16).float().T
    return float((exact - rounded).abs().max())


def measure(queries: np.ndarray, truth: np.ndarray, hi: Any, lo: Any | None, batch: int,
            input_error: float) -> dict[str, Any]:
    """Every query answered in batches of ``batch`` (after one warm-up batch): time per query,
    batch latency p50/p95, strict recall@10."""
    import torch

    Q = torch.from_numpy(queries)
    scan(Q[:batch], hi, lo, K, input_error=input_error)
    found = np.zeros((len(Q), K), dtype=np.int64)
    times, cands, reads = [], [], []
    for a in range(0, len(Q), batch):
        t0 = time.perf_counter()
        ids, _, stats = scan(Q[a:a + batch], hi, lo, K, input_error=input_error)
        times.append(time.perf_counter() - t0)
        found[a:a + batch] = ids.numpy()
        cands.append(stats["candidates"])
        reads.append(stats["read_share"])
    recall = float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth)]))
    return {"batch": batch, "batches": len(times), "per_query_ms": 1e3 * sum(times) / len(Q),
            "batch_p50_ms": 1e3 * float(np.percentile(times, 50)),
            "batch_p95_ms": 1e3 * float(np.percentile(times, 95)),
            "recall": recall, "candidates": float(np.mean(cands)), "read_share": float(np.mean(reads))}


def _trim() -> None:
    """Give the C heap's free memory back to the system (glibc keeps the loading's freed
    temporaries otherwise, ~280 MB here), so that the RSS is what the scan holds."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the RSS may include freed memory


def _reset_peak() -> None:
    """Start the process's peak RSS (VmHWM) again from now (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def run(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    import torch

    sets = []
    for stats_path in sorted(args.work.glob("stats-*.json")):
        key = stats_path.stem.removeprefix("stats-")
        paths = {name: args.work / f"{name}-{key}.npy" for name in ("base", "queries", "gt")}
        stats = json.loads(stats_path.read_text())
        n = stats["params"]["n"]
        if not all(p.is_file() for p in paths.values()) or (args.size and n != args.size):
            continue
        queries = np.load(paths["queries"], allow_pickle=False)
        truth = np.load(paths["gt"], allow_pickle=False)[:, :K]
        vectors = stats["params"].get("vectors")
        entry: dict[str, Any] = {"key": key, "n": n, "queries": len(queries),
                                 "data": Path(vectors[0]).name if vectors else "synthetic (clustered)",
                                 "input_error": input_error(paths["base"], queries, args.check) if args.check else None,
                                 "kinds": []}
        allowed = INPUT_ERROR if entry["input_error"] is None else CHECK_ROOM * entry["input_error"]
        entry["input_error_allowed"] = allowed
        for halves in [True] + ([False] if args.float32 else []):
            gc.collect()
            _trim()
            before = _rss_now()
            t0 = time.perf_counter()
            hi, lo = load(paths["base"], halves)
            load_s = time.perf_counter() - t0
            _trim()
            _reset_peak()
            kind: dict[str, Any] = {"kind": "bfloat16 hi + lo" if halves else "float32", "load_s": load_s,
                                    "rss_added": _rss_now() - before, "rss": _rss_now(), "runs": []}
            for threads in args.threads:
                torch.set_num_threads(threads)
                for batch in args.batches:
                    kind["runs"].append({"threads": threads, **measure(queries, truth, hi, lo, batch, allowed)})
            kind["rss_peak"] = _rss_peak()
            entry["kinds"].append(kind)
            del hi, lo
        sets.append(entry)
    if not sets:
        raise SystemExit(f"error: no ann_scale.py data in {args.work} (stats-*.json with base, queries, gt)")
    return {"benchmark": "exact_batch", "machine": machine_info(), "work": str(args.work),
            "chunk": CHUNK, "step_scores": STEP_SCORES, "sets": sets}


def render(r: dict[str, Any]) -> str:
    mb = 1024 * 1024
    out = [header_markdown("Exact search of a batch of queries at once", r["machine"]), "",
           f"The scan of `benchmarks/exact_batch.py` (its docstring): steps of {r['step_scores']:,} scores "
           f"(at least {r['chunk']:,} columns); every query of "
           "`ann_scale.py`'s data answered in batches of the size shown after one warm-up batch; "
           "recall@10 strict, against the exact top 10. Not a vecplug store.", ""]
    for s in r["sets"]:
        err = s.get("input_error")
        out += [f"{s['data']}: {s['n']:,} base vectors, {s['queries']:,} queries (`{s['key']}`); "
                + ("" if err is None else f"largest score error of bfloat16 inputs measured {err:.2e}, ")
                + f"allowed {s['input_error_allowed']:.2e}", ""]
        for kind in s["kinds"]:
            out += [f"**{kind['kind']}**: loaded in {kind['load_s']:.1f} s, {kind['rss_added'] / mb:,.0f} MB "
                    f"(the process: {kind['rss'] / mb:,.0f} MB after loading, peak {kind['rss_peak'] / mb:,.0f} MB while searching)", "",
                    markdown_table(["threads", "batch", "ms per query", "batch p50 ms", "batch p95 ms", "recall@10",
                                    "candidates per query", "chunks read further"],
                                   [[str(x["threads"]), f"{x['batch']:,}", f"{x['per_query_ms']:.3f}",
                                     f"{x['batch_p50_ms']:.1f}", f"{x['batch_p95_ms']:.1f}", f"{x['recall']:.4f}",
                                     f"{x['candidates']:.1f}", f"{x['read_share']:.2%}"] for x in kind["runs"]],
                                   "rrrrrrrr"), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
