"""Exact search of a batch of queries at once: what a scan does with matrix units.

Issue 6 asks for recall@10 >= 0.99 "under 1 ms per query" at a million 384-d vectors in
under 2 GB. One query at a time, no graph measured gets there (``ann_scale.py``: 0.955 at
0.92 ms). This measures the other reading of "per query": a batch of queries answered
together, by an exact scan, costs its time divided by the queries. On a CPU that multiplies
bfloat16 natively (Intel AMX; AVX-512 BF16 on AMD Zen 4), a bfloat16 matrix product of 1,000
queries by a million vectors takes a few hundred milliseconds; the rest is finding each
query's best columns in the product without reading all of it twice: vecplug's scan,
``adapters/stores/scan.py`` (its docstring), which the flat store's ``search_batch`` serves.

Four kinds, each measured in its own turn, every one against ``ann_scale.py``'s exact top 10
(strict recall: the ids):

- ``bfloat16 hi + lo``: the vectors kept as two bfloat16 halves ``hi + lo`` (``hi`` the vector
  rounded to bfloat16, ``lo`` what it left: float32's size), the scan's floors lowered by
  twice a slack measured on the data: the inputs' rounding error (``INPUT_ERROR``, or
  ``CHECK_ROOM`` times the largest ``--check`` measures over many pairs) plus the product's
  accumulation (``PRODUCT_ERROR``). Not a bound: the recall column counts every miss.
- ``float32`` (``--float32``): the same scan in float32 (one copy): what the matrix units buy.
- ``flat store`` (``--store``): vecplug's flat store built from the vectors in a folder under
  ``--work`` (removed after), opened as a reader and asked ``search_batch``: float32 vectors
  converted to bfloat16 a step at a time where the CPU multiplies it natively, the slack the
  bound of ``scan.error_bound`` (no measurement), the records of the hits read from SQLite;
  what a user of the store gets.
- ``flat store, corrected`` (``--corrected``): the same store built with a language per record
  (``ann_scale.py``'s six: record i's ``LANGS[i % 6]``, query q's ``LANGS[q % 6]``) and searched
  with the language-bias correction as ``Index.search_batch`` searches a pooled ``xy`` batch
  (``bias.centred_search_batch``: each language's best by centred cosine for a group of
  queries, by one scan of its rows, then each query's best of those), the language means those of
  the base; recall against the exact top 10 by centred cosine (computed here).

Usage::

    python benchmarks/exact_batch.py --work /tmp/benchwork/ann [--batches 1 10 100 1000]
        [--threads 1 2] [--float32] [--store] [--corrected] [--no-halves] [--size N] [--data NAME]
        [--json out.json]

(``--work``: the folder ``ann_scale.py --work`` wrote, as ``ann_crowding.py`` reads it.)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann_scale import K, LANGS, RowReader, _merge_top, _rss_now, _rss_peak  # noqa: E402
from bench_common import header_markdown, machine_info, markdown_table, run_main  # noqa: E402

#: the most a score computed from bfloat16-rounded inputs (each entry within 2^-8 of its
#: float32 value, relatively) may differ from the float32 score, unless ``--check`` measures it
#: (then: CHECK_ROOM x the largest difference over every query and the rows it reads)
INPUT_ERROR = 1e-3
CHECK_ROOM = 1.25
#: the product's accumulation in float32 (Higham's gamma_384 of unit vectors: 2.3e-5); the
#: rounding of the shifted product to bfloat16 the scan allows for itself
PRODUCT_ERROR = 3e-5
BASE_CHUNK = 20_000
#: records upserted into the flat store at a time (``--store``)
STORE_BATCH = 20_000


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True, help="ann_scale.py's work folder")
    p.add_argument("--size", type=int, help="only the data set of this many base vectors")
    p.add_argument("--data", help="only the data set of these vectors: the file's name given to "
                                  "ann_scale.py --vectors, or 'synthetic' (its clustered vectors)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100, 1000],
                   help="queries answered together")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads")
    p.add_argument("--float32", action="store_true", help="also scan a float32 copy (no bfloat16)")
    p.add_argument("--store", action="store_true", help="also through vecplug's flat store (search_batch)")
    p.add_argument("--corrected", action="store_true",
                   help="also the flat store with six languages, searched with the language-bias correction")
    p.add_argument("--no-halves", action="store_true",
                   help="skip the bfloat16 halves (e.g. --store --no-halves: the store alone, its memory "
                        "that of a fresh process)")
    p.add_argument("--check", type=int, default=20_000, metavar="ROWS",
                   help="measure the bfloat16 inputs' score error on this many base rows (0: skip)")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def split(rows: np.ndarray) -> tuple[Any, Any]:
    """(hi, lo): bfloat16 halves whose sum is ``rows`` within ~2^-16 relatively (``scan.split``)."""
    from vecplug.adapters.stores import scan as flat_scan

    return flat_scan.split(rows)


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


def scan(queries: Any, hi: Any, lo: Any | None, k: int, chunk: int | None = None,
         input_error: float = INPUT_ERROR) -> tuple[Any, Any, dict[str, float]]:
    """Exact top ``k`` (ids, float32 scores) of every row of ``queries`` among the rows of ``hi``
    (+ ``lo``: bfloat16 halves; ``lo`` None: ``hi`` is float32), by vecplug's scan
    (``stores/scan.py``) with the slack this script allows: ``input_error`` (measured by
    ``--check``) plus the product's rounding, instead of the store's bound."""
    from vecplug.adapters.stores import scan as flat_scan

    if lo is None:  # ann_scale.py's vectors are unit ones
        slack = flat_scan.accumulation_bound(queries, 1.0)
    else:
        slack = input_error + PRODUCT_ERROR
    return flat_scan.scan(queries, hi, k, lo=lo, slack=slack, chunk=chunk)


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


Search = Callable[[np.ndarray, int], tuple[np.ndarray, "dict[str, float] | None"]]


def measure(queries: np.ndarray, truth: np.ndarray, search: Search, batch: int) -> dict[str, Any]:
    """Every query answered in batches of ``batch`` by ``search`` (a batch of queries and the
    number of its first -> their top ``K`` ids, and the scan's counts if known), after one
    warm-up batch: time per query, batch latency p50/p95, strict recall@10."""
    search(queries[:batch], 0)
    found = np.zeros((len(queries), K), dtype=np.int64)
    times, cands, reads = [], [], []
    for a in range(0, len(queries), batch):
        t0 = time.perf_counter()
        ids, stats = search(queries[a:a + batch], a)
        times.append(time.perf_counter() - t0)
        found[a:a + batch] = ids
        if stats is not None:
            cands.append(stats["candidates"])
            reads.append(stats["read_share"])
    recall = float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth)]))
    return {"batch": batch, "batches": len(times), "per_query_ms": 1e3 * sum(times) / len(queries),
            "batch_p50_ms": 1e3 * float(np.percentile(times, 50)),
            "batch_p95_ms": 1e3 * float(np.percentile(times, 95)), "recall": recall,
            "candidates": float(np.mean(cands)) if cands else None,
            "read_share": float(np.mean(reads)) if reads else None}


def scanned(hi: Any, lo: Any | None, allowed: float) -> Search:
    """:func:`measure`'s search by :func:`scan` over ``hi`` (+ ``lo``)."""
    import torch

    def search(queries: np.ndarray, first: int) -> tuple[np.ndarray, dict[str, float]]:
        ids, _, stats = scan(torch.from_numpy(queries), hi, lo, K, input_error=allowed)
        return ids.numpy(), stats
    return search


def opened(kind_name: str, base: Path, folder: Path, allowed: float,
           means: Any = None) -> tuple[Search, Callable[[], dict[str, Any]]]:
    """A kind's search (its vectors loaded, or the flat store built in ``folder`` opened as a
    reader; ``means``: searched with the correction) and what ends it, returning what to
    record of it (the store's folder removed)."""
    if not kind_name.startswith("flat store"):
        hi, lo = load(base, kind_name != "float32")
        return scanned(hi, lo, allowed), dict
    from vecplug.adapters.stores import get_store_class
    from vecplug.adapters.stores import scan as flat_scan

    store = get_store_class("flat").open(str(folder), {})

    def close() -> dict[str, Any]:
        info = {"precision": store.parameters["precision"], "bf16_min_queries": flat_scan.BF16_MIN_QUERIES}
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
        return info
    return (stored(store) if means is None else corrected(store, means)), close


def _langs(first: int, count: int) -> list[str]:
    """The languages of records (or queries) ``first`` to ``first + count``: ``ann_scale.py``'s."""
    return [LANGS[(first + i) % len(LANGS)] for i in range(count)]


def build_flat(base: Path, folder: Path, langs: bool = False) -> float:
    """A flat store of the base vectors in ``folder`` (ids: their rows; ``langs``: each record in
    its language of :func:`_langs`), committed once: seconds."""
    from vecplug.adapters.stores import Record, get_store_class

    t0 = time.perf_counter()
    reader = RowReader(base)
    try:
        store = get_store_class("flat").create(str(folder), reader.shape[1], {"dim": reader.shape[1]}, {})
        try:
            for a, rows in reader.chunks(STORE_BATCH):
                lang_of = _langs(a, len(rows)) if langs else [None] * len(rows)
                store.upsert([Record(str(a + i), "", "base", a + i, lang_of[i]) for i in range(len(rows))], rows)
            store.commit()
        finally:
            store.close()
    finally:
        reader.close()
    return time.perf_counter() - t0


def stored(store: Any) -> Search:
    """:func:`measure`'s search by the flat store's ``search_batch`` (records read included)."""
    def search(queries: np.ndarray, first: int) -> tuple[np.ndarray, None]:
        return _ids(store.search_batch(queries, K)), None
    return search


def corrected(store: Any, means: Any) -> Search:
    """:func:`measure`'s search by ``bias.centred_search_batch`` over every language, each
    query in its language of :func:`_langs`."""
    from vecplug.adapters.bias import centred_search_batch

    def search(queries: np.ndarray, first: int) -> tuple[np.ndarray, None]:
        hits = centred_search_batch(store, means, queries, _langs(first, len(queries)), K, list(LANGS))
        if hits is None:
            raise SystemExit("error: the flat store answered a corrected batch query by query")
        return _ids(hits), None
    return search


def _ids(hits: Sequence[Sequence[Any]]) -> np.ndarray:
    """Each query's hits' record ids (the base rows), -1 where fewer than ``K``."""
    out = np.full((len(hits), K), -1, dtype=np.int64)
    for row, found in zip(out, hits):
        row[:len(found)] = [int(h.record.id) for h in found[:K]]
    return out


def language_means(base: Path) -> Any:
    """The base vectors' language means (each row in its language of :func:`_langs`), as an
    index keeps them for the correction."""
    from vecplug.adapters.bias import LanguageStats

    reader = RowReader(base)
    try:
        stats = LanguageStats(reader.shape[1])
        for a, rows in reader.chunks(BASE_CHUNK):
            stats.add(_langs(a, len(rows)), rows)
    finally:
        reader.close()
    return stats.means()


def centred_truth(base: Path, queries: np.ndarray, means: Any) -> np.ndarray:
    """The exact top ``K`` base rows of every query by centred cosine (query and rows each
    centred by its language's mean, re-normalised), in float64 products."""
    Q = means.centre(queries, _langs(0, len(queries))).astype(np.float64)
    best_s = np.full((len(Q), K), -np.inf)
    best_i = np.full((len(Q), K), -1, dtype=np.int64)
    reader = RowReader(base)
    try:
        for a, rows in reader.chunks(BASE_CHUNK):
            S = Q @ means.centre(rows, _langs(a, len(rows))).astype(np.float64).T
            best_s, best_i = _merge_top(best_s, best_i, S, np.arange(a, a + len(rows)))
    finally:
        reader.close()
    return best_i


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

    from vecplug.adapters.stores import scan as flat_scan

    sets = []
    for stats_path in sorted(args.work.glob("stats-*.json")):
        key = stats_path.stem.removeprefix("stats-")
        paths = {name: args.work / f"{name}-{key}.npy" for name in ("base", "queries", "gt")}
        stats = json.loads(stats_path.read_text())
        n = stats["params"]["n"]
        vectors = stats["params"].get("vectors")
        name = Path(vectors[0]).name if vectors else "synthetic"
        if (not all(p.is_file() for p in paths.values()) or (args.size and n != args.size)
                or (args.data and name != args.data)):
            continue
        queries = np.load(paths["queries"], allow_pickle=False)
        truth = np.load(paths["gt"], allow_pickle=False)[:, :K]
        entry: dict[str, Any] = {"key": key, "n": n, "queries": len(queries),
                                 "data": name if vectors else "synthetic (clustered)",
                                 "input_error": input_error(paths["base"], queries, args.check) if args.check else None,
                                 "kinds": []}
        allowed = INPUT_ERROR if entry["input_error"] is None else CHECK_ROOM * entry["input_error"]
        entry["input_error_allowed"] = allowed
        kinds = ([] if args.no_halves else ["bfloat16 hi + lo"]) + (["float32"] if args.float32 else []) \
            + (["flat store"] if args.store else []) + (["flat store, corrected"] if args.corrected else [])
        for kind_name in kinds:
            gc.collect()
            _trim()
            kind: dict[str, Any] = {"kind": kind_name, "runs": []}
            folder = args.work / f"flat-store-{key}"
            means, kind_truth = None, truth
            if kind_name == "flat store, corrected":
                means = language_means(paths["base"])
                kind_truth = centred_truth(paths["base"], queries, means)
            if kind_name.startswith("flat store"):
                shutil.rmtree(folder, ignore_errors=True)
                kind["build_rss_before"] = _rss_now()
                _reset_peak()
                kind["build_s"] = build_flat(paths["base"], folder, langs=means is not None)
                kind["build_rss_peak"] = _rss_peak()
                gc.collect()
                _trim()
            before = _rss_now()
            t0 = time.perf_counter()
            search, close = opened(kind_name, paths["base"], folder, allowed, means)
            kind["load_s"] = time.perf_counter() - t0
            _trim()
            _reset_peak()
            kind.update(rss_added=_rss_now() - before, rss=_rss_now())
            for threads in args.threads:
                torch.set_num_threads(threads)
                for batch in args.batches:
                    kind["runs"].append({"threads": threads, **measure(queries, kind_truth, search, batch)})
            kind["rss_peak"] = _rss_peak()
            kind.update(close())
            entry["kinds"].append(kind)
            del search, close
        sets.append(entry)
    if not sets:
        raise SystemExit(f"error: no ann_scale.py data in {args.work} (stats-*.json with base, queries, gt)")
    return {"benchmark": "exact_batch", "machine": machine_info(), "work": str(args.work),
            "chunk": flat_scan.CHUNK, "step_scores": flat_scan.STEP_SCORES, "sets": sets}


def render(r: dict[str, Any]) -> str:
    mb = 1024 * 1024
    out = [header_markdown("Exact search of a batch of queries at once", r["machine"]), "",
           f"The scan of `adapters/stores/scan.py` (kinds: `benchmarks/exact_batch.py`'s docstring): steps of "
           f"{r['step_scores']:,} scores (at least {r['chunk']:,} columns); every query of "
           "`ann_scale.py`'s data answered in batches of the size shown after one warm-up batch; "
           "recall@10 strict, against the exact top 10.", ""]
    for s in r["sets"]:
        err = s.get("input_error")
        out += [f"{s['data']}: {s['n']:,} base vectors, {s['queries']:,} queries (`{s['key']}`); "
                + ("" if err is None else f"largest score error of bfloat16 inputs measured {err:.2e}, ")
                + f"allowed {s['input_error_allowed']:.2e}", ""]
        for kind in s["kinds"]:
            # (the first runs' JSON has no bf16_min_queries: 64 then)
            # (runs before the build's peak was kept have no build_rss_peak)
            build_peak = (f" (the process: {kind['build_rss_before'] / mb:,.0f} MB before, peak "
                          f"{kind['build_rss_peak'] / mb:,.0f} MB while building)" if "build_rss_peak" in kind else "")
            built = (f"built in {kind['build_s']:.0f} s{build_peak}, its precision {kind['precision']} (batches of "
                     f"fewer than {kind.get('bf16_min_queries', 64)} queries multiplied in float32), "
                     if "build_s" in kind else "")
            out += [f"**{kind['kind']}**: {built}loaded in {kind['load_s']:.1f} s, {kind['rss_added'] / mb:,.0f} MB "
                    f"(the process: {kind['rss'] / mb:,.0f} MB after loading, peak {kind['rss_peak'] / mb:,.0f} MB while searching)"
                    + ("; recall against the exact top 10 by centred cosine (each vector less its language's mean, "
                       "re-normalised)" if kind["kind"] == "flat store, corrected" else ""), "",
                    markdown_table(["threads", "batch", "ms per query", "batch p50 ms", "batch p95 ms", "recall@10",
                                    "candidates per query", "chunks read further"],
                                   [[str(x["threads"]), f"{x['batch']:,}", f"{x['per_query_ms']:.3f}",
                                     f"{x['batch_p50_ms']:.1f}", f"{x['batch_p95_ms']:.1f}", f"{x['recall']:.4f}",
                                     "-" if x["candidates"] is None else f"{x['candidates']:.1f}",
                                     "-" if x["read_share"] is None else f"{x['read_share']:.2%}"] for x in kind["runs"]],
                                   "rrrrrrrr"), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
