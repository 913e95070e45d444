"""The first stage of each retrieval mode on a large index of many real languages.

``ann_scale.py`` times the store's own search. A ``vecplug search`` runs a mode on top of it
(``adapters/modes.py``): ``xy`` is one graph walk, ``mono`` one walk filtered to the query's
language (an exact scan when the language has at most the store's scan limit of documents:
``EXACT_FILTER_LIMIT``, which hnswlib raises in a large index, ``hnsw.scan_limit``), and
``xy`` with the language-bias correction (the default: ``index.debias``) asks the store for the
best candidates of *every* language of the index separately and rescores them with centred
vectors (``adapters/bias.py``). Its cost therefore grows with the number of languages and with
how the documents spread over them, which a six-language development set does not show.

This builds a store (``--store``: hnswlib or embedded Qdrant, with their defaults) from real
embeddings with their documents' real languages (rows of ``--vectors`` aligned with the lines of
``--corpus``, a JSONL with a ``lang`` field, as ``debian_corpus.py`` and ``tatoeba_vectors.py``
make them), the language sums in its manifest as indexing keeps them, and times
``modes.first_stage`` one query at a time (held-out rows, each with its own document's language,
after a warm-up) for ``xy``, ``xy`` + correction, ``mono``, ``prefer`` + correction and ``xy`` +
translation consensus, top 10. It also scores the corrected ``xy`` against an exact centred
ranking of every document (brute force), the list the correction defines, and ``xy`` + consensus
against consensus over each language's exact top 40 (the lists it regroups, found by brute
force), and times what the corrected search asks the store for each language (its candidates for
the centred query, as ``adapters/bias.py`` asks them), the dearest first. With ``--walk-shifts``
it times the corrected ``xy`` again with each value of ``bias.WALK_SHIFT`` (how far a language's
filtered walk is moved into that language's region; 0: not at all, the walks of before the
shift), each with its recall. With ``--consensus-shifts`` it times ``xy`` + consensus with such
walk hints too (towards the query plus S x each language's mean), which the library does not
give it (``adapters/consensus.py``), each with its recall of the exact consensus. With
``--scan-limits`` (hnswlib) it times the corrected ``xy`` with each limit of documents up to
which a language is scanned exactly instead of walked (``hnsw.scan_limit``), one store handle
per limit, the handles taking turns query by query (this machine's speed drifts over a run by as
much as the differences measured), with the memory its language filters take (a scanned
language's is a copy of its vectors). With ``--centred`` the hnswlib store is built with its graph
of language-centred vectors (``index.hnsw_centred``, ``adapters/stores/centring.py``): the corrected
``xy`` is then one walk, and ``xy`` and ``mono`` without the correction go language by language;
``--corrected-efs`` times the corrected ``xy`` with other search breadths. ``xy`` and ``mono`` are
scored too, against exact plain cosine over every document and over the query's language's.

Usage::

    python benchmarks/modes_scale.py --vectors /tmp/benchwork/debian-1m-me5-small.npy \\
        --corpus /tmp/benchwork/debian-1m.jsonl --sizes 200000 1000000 [--store qdrant] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann_scale import K, _merge_top  # noqa: E402
from bench_common import header_markdown, machine_info, markdown_table, percentile, run_main  # noqa: E402

WARMUP = 20
#: (label, mode, with the language-bias correction)
MODES = (("xy", "xy", False), ("xy + correction", "xy", True), ("mono", "mono", False),
         ("prefer + correction", "prefer", True))
#: translation consensus as a search makes it (``search.consensus_threshold`` / ``_depth``
#: defaults), timed without the correction: it too asks the store for every language (without
#: walk hints: ``adapters/consensus.py``)
CONSENSUS = (0.4, 40)
BATCH = 10_000
#: stores this builds (the registry's built-in names)
STORES = ("hnswlib", "qdrant")


def data_arguments(p: argparse.ArgumentParser) -> None:
    """The options that pick the documents and queries (:func:`split`): this script's, and
    ``centred_build.py``'s, which builds from the same rows."""
    p.add_argument("--vectors", type=Path, required=True, help="embeddings (.npy, n x dim), row i = line i of --corpus")
    p.add_argument("--corpus", type=Path, required=True, help="JSONL with a 'lang' field per line")
    p.add_argument("--sizes", type=int, nargs="+", default=[200_000], help="index sizes (documents)")
    p.add_argument("--queries", type=int, default=300, help="held-out rows searched (their own language)")
    p.add_argument("--seed", type=int, default=0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_arguments(p)
    p.add_argument("--store", choices=STORES, default="hnswlib", help="the store built and searched")
    p.add_argument("--centred", action="store_true",
                   help="hnswlib: its graph of language-centred vectors (index.hnsw_centred: adapters/stores/centring.py)")
    p.add_argument("--work", type=Path, help="where the indexes are built (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the indexes (reused by a later run with --work)")
    p.add_argument("--languages-shown", type=int, default=8, help="rows of the per-language table")
    p.add_argument("--walk-shifts", type=float, nargs="*", default=[], metavar="S",
                   help="also time the corrected xy with adapters.bias.WALK_SHIFT set to each S")
    p.add_argument("--scan-limits", type=int, nargs="*", default=[], metavar="N",
                   help="hnswlib: also time the corrected xy with each exact-scan limit N, interleaved query by query")
    p.add_argument("--consensus-shifts", type=float, nargs="*", default=[], metavar="S",
                   help="also time xy + consensus with walk hints towards the query + S x each language's mean")
    p.add_argument("--corrected-efs", type=int, nargs="*", default=[], metavar="EF",
                   help="also time the corrected xy with each search breadth EF (a centred graph's one walk, "
                        "or each language's filtered walk)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.scan_limits and args.store != "hnswlib":
        p.error("--scan-limits is the hnswlib store's (Qdrant's limit is its full_scan_threshold)")
    if args.centred and args.store != "hnswlib":
        p.error("--centred is the hnswlib store's")
    if args.centred and args.scan_limits:
        p.error("--scan-limits times the corrected search language by language: a centred graph walks once")
    return args


def read_langs(corpus: Path, rows: int) -> list[str]:
    """The ``lang`` of the first ``rows`` lines of ``corpus`` (``und`` when missing)."""
    langs = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            if len(langs) == rows:
                break
            langs.append(json.loads(line).get("lang") or "und")
    if len(langs) < rows:
        raise SystemExit(f"{corpus}: {len(langs):,} lines for {rows:,} vectors")
    return langs


def split(total: int, n: int, queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(base rows, query rows): disjoint seeded random rows, each sorted."""
    if n + queries > total:
        raise SystemExit(f"{total:,} rows, too few for {n:,} documents and {queries:,} queries")
    order = np.random.default_rng([seed, 7]).permutation(total)
    return np.sort(order[queries:queries + n]), np.sort(order[:queries])


def build(folder: Path, V: np.ndarray, langs: Sequence[str], rows: np.ndarray, kind: str = "hnswlib",
          options: dict[str, Any] | None = None) -> float:
    """A store of ``rows`` (in their order, labelled so) with the language sums indexing keeps,
    committed once; seconds taken."""
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores.base import Record
    from vecplug.adapters.stores.registry import get_store_class

    t0 = time.perf_counter()
    dim = V.shape[1]
    store = get_store_class(kind).create(str(folder), dim, {"dim": dim}, options or {})
    stats = LanguageStats(dim)
    try:
        for a in range(0, len(rows), BATCH):
            part = rows[a:a + BATCH]
            X = unit(np.asarray(V[part], dtype=np.float32))
            store.upsert([Record(f"d{i}", "", "modes_scale", 0, langs[i], {}) for i in part], X)
            stats.add([langs[i] for i in part], X)
        store.commit({"dim": dim, **stats.to_manifest()})
    finally:
        store.close()
    return time.perf_counter() - t0


def unit(X: np.ndarray) -> np.ndarray:
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def exact_centred(V: np.ndarray, langs: Sequence[str], rows: np.ndarray, means: Any, Q: np.ndarray,
                  qlangs: Sequence[str]) -> list[set[str]]:
    """Each query's exact top ``K`` by centred cosine over every document (brute force)."""
    qc = np.stack([means.centre_query(q, ql) for q, ql in zip(Q, qlangs)])
    best_s = np.full((len(Q), K), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(Q), K), dtype=np.int64)
    for a in range(0, len(rows), 50_000):
        part = rows[a:a + 50_000]
        C = means.centre(unit(np.asarray(V[part], dtype=np.float32)), [langs[i] for i in part])
        best_s, best_i = _merge_top(best_s, best_i, qc @ C.T, part)
    return [{f"d{i}" for i in row} for row in best_i]


def exact_plain(V: np.ndarray, langs: Sequence[str], rows: np.ndarray, Q: np.ndarray,
                qlangs: Sequence[str]) -> tuple[list[set[str]], list[set[str]]]:
    """Each query's exact top ``K`` by plain cosine over every document, and over its own
    language's (``xy`` and ``mono`` without the correction; brute force)."""
    lang_rows = np.asarray([langs[i] for i in rows])
    own = np.asarray(qlangs)
    best = [(np.full((len(Q), K), -np.inf, dtype=np.float32), np.zeros((len(Q), K), dtype=np.int64)) for _ in range(2)]
    for a in range(0, len(rows), 50_000):
        part = rows[a:a + 50_000]
        S = Q @ unit(np.asarray(V[part], dtype=np.float32)).T
        best[0] = _merge_top(*best[0], S, part)
        best[1] = _merge_top(*best[1], np.where(own[:, None] == lang_rows[None, a:a + 50_000], S, -np.inf), part)
    return tuple([{f"d{i}" for i, s in zip(r, sc) if np.isfinite(s)} for r, sc in zip(b[1], b[0])]
                 for b in best)  # type: ignore[return-value]


def exact_consensus(V: np.ndarray, langs: Sequence[str], rows: np.ndarray, means: Any, Q: np.ndarray,
                    threshold: float, depth: int) -> list[set[str]]:
    """Each query's top ``K`` by translation consensus over each language's exact top ``depth``
    by plain cosine: what ``Consensus.search`` regroups, found by brute force."""
    from vecplug.adapters.consensus import consensus_scores

    lang_rows = np.asarray([langs[i] for i in rows])
    codes = sorted(set(lang_rows.tolist()))
    best = {c: (np.full((len(Q), depth), -np.inf, dtype=np.float32), np.full((len(Q), depth), -1, dtype=np.int64))
            for c in codes}
    for a in range(0, len(rows), 50_000):
        part, part_langs = rows[a:a + 50_000], lang_rows[a:a + 50_000]
        S = Q @ unit(np.asarray(V[part], dtype=np.float32)).T
        for c in codes:
            cols = np.flatnonzero(part_langs == c)
            if len(cols):
                best[c] = _merge_top(*best[c], S[:, cols], part[cols])
    out = []
    for qi in range(len(Q)):
        found = [(best[c][0][qi], best[c][1][qi]) for c in codes]
        ids = np.concatenate([i[i >= 0] for _, i in found])
        scores = np.concatenate([s[i >= 0] for s, i in found])
        id_langs = [langs[i] for i in ids]
        centred = means.centre(unit(np.asarray(V[ids], dtype=np.float32)), id_langs)
        new = consensus_scores(scores, centred, id_langs, threshold)
        out.append({f"d{ids[i]}" for i in np.argsort(-new, kind="stable")[:K]})
    return out


def timed(store: Any, Q: np.ndarray, qlangs: Sequence[str], mode: str, means: Any,
          consensus: Any = None, ef: int | None = None) -> tuple[dict[str, float], list[set[str]]]:
    """Latency of ``modes.first_stage`` one query at a time (after a warm-up), and what each found."""
    from vecplug.adapters import modes

    return latency(lambda q, ql: modes.first_stage(store, q, ql, mode, K, None, means, ef, consensus), Q, qlangs)


def scan_limits(folder: Path, V: np.ndarray, langs: Sequence[str], rows: np.ndarray, qrows: np.ndarray,
                limits: Sequence[int]) -> list[dict[str, Any]]:
    """The corrected ``xy`` with each exact-scan limit: one read-only hnswlib handle per limit
    (a handle decides scan or walk once per language, when it first asks), warmed up, then
    taking turns query by query; each with its recall and its filter cache's bytes."""
    from vecplug.adapters import bias, modes
    from vecplug.adapters.stores import hnsw

    Q = unit(np.asarray(V[qrows], dtype=np.float32))
    qlangs = [langs[i] for i in qrows]
    stores, kept = [], hnsw.scan_limit
    try:
        for limit in limits:
            hnsw.scan_limit = lambda total, limit=limit: limit  # type: ignore[assignment]
            try:
                stores.append(hnsw.HnswStore.open(str(folder), {}))
                means = bias.LanguageStats.from_manifest(stores[-1].manifest).means()
                for q, ql in zip(Q[:WARMUP], qlangs):
                    modes.first_stage(stores[-1], q, ql, "xy", K, None, means)
            finally:
                hnsw.scan_limit = kept
        lat: list[list[float]] = [[] for _ in limits]
        got: list[list[set[str]]] = [[] for _ in limits]
        for j, (q, ql) in enumerate(zip(Q, qlangs)):
            turn = list(range(len(limits)))
            for i in turn[j % len(turn):] + turn[:j % len(turn)]:  # each handle first in turn
                t0 = time.perf_counter()
                hits = modes.first_stage(stores[i], q, ql, "xy", K, None, means)
                lat[i].append(time.perf_counter() - t0)
                got[i].append({h.record.id for h in hits})
        truth = exact_centred(V, langs, rows, means, Q, qlangs)
        return [{"limit": limit, "p50_ms": 1000 * percentile(lat[i], 50), "p95_ms": 1000 * percentile(lat[i], 95),
                 "mean_ms": 1000 * float(np.mean(lat[i])), "recall": recall(got[i], truth),
                 "walked": sum(1 for n in stores[i].languages().values() if n > limit),
                 "cache_mb": sum(map(hnsw._filter_bytes, stores[i]._filter_cache.values())) / 1e6}
                for i, limit in enumerate(limits)]
    finally:
        for store in stores:
            store.close()


class _Hinting:
    """A store whose ``candidates_per_language`` walks each language towards the query plus
    ``shift`` x that language's mean, whatever its caller asks: ``Consensus.search`` through it
    is consensus as it would be with walk hints (the library gives it none)."""

    def __init__(self, store: Any, means: Any, shift: float) -> None:
        self.store, self.means, self.shift = store, means, shift

    def candidates_per_language(self, vector: np.ndarray, k: int, langs: Sequence[str], *,
                                ef: int | None = None) -> list[Any]:
        from vecplug.adapters.stores.base import candidates_per_language

        hints = {lang: vector + self.shift * self.means.of(lang) for lang in langs}
        return candidates_per_language(self.store, vector, k, langs, ef, hints)

    def __getattr__(self, name: str) -> Any:  # everything else: the store's own
        return getattr(self.store, name)


def hinted_consensus(store: Any, group: Any, shift: float) -> Any:
    """``xy`` + consensus (``group.search``) with walk hints: see :class:`_Hinting`."""
    hinting = _Hinting(store, group.means, shift)
    return lambda q, ql: group.search(hinting, q, K, None)


def latency(search: Any, Q: np.ndarray, qlangs: Sequence[str]) -> tuple[dict[str, float], list[set[str]]]:
    """Latency of ``search(query, language)`` one query at a time (after a warm-up), and what each found."""
    for q, ql in zip(Q[:WARMUP], qlangs):
        search(q, ql)
    lat, got = [], []
    for q, ql in zip(Q, qlangs):
        t0 = time.perf_counter()
        hits = search(q, ql)
        lat.append(time.perf_counter() - t0)
        got.append({h.record.id for h in hits})
    return ({"p50_ms": 1000 * percentile(lat, 50), "p95_ms": 1000 * percentile(lat, 95),
             "mean_ms": 1000 * float(np.mean(lat))}, got)


def recall(found: Sequence[set[str]], truth: Sequence[set[str]]) -> float:
    return float(np.mean([len(g & t) / K for g, t in zip(found, truth)]))


def measure(folder: Path, V: np.ndarray, langs: Sequence[str], rows: np.ndarray, qrows: np.ndarray,
            shifts: Sequence[float] = (), kind: str = "hnswlib",
            consensus_shifts: Sequence[float] = (), languages_timed: bool = True,
            corrected_efs: Sequence[int] = ()) -> dict[str, Any]:
    """Open the store read-only (as a search does) and time each mode's first stage."""
    from vecplug.adapters import bias
    from vecplug.adapters.consensus import Consensus
    from vecplug.adapters.stores.registry import get_store_class

    store = get_store_class(kind).open(str(folder), {})
    try:
        means = bias.LanguageStats.from_manifest(store.manifest).means()
        Q = unit(np.asarray(V[qrows], dtype=np.float32))
        qlangs = [langs[i] for i in qrows]
        out: dict[str, Any] = {"languages": store.languages(), "walk_shift": bias.WALK_SHIFT, "modes": []}
        found: dict[str, list[set[str]]] = {}
        for label, mode, corrected in MODES:
            row, found[label] = timed(store, Q, qlangs, mode, means if corrected else None)
            out["modes"].append({"mode": label, **row})
            print(f"  {label}: p50 {row['p50_ms']:.2f} ms", file=sys.stderr, flush=True)
        group = Consensus(means, *CONSENSUS)
        row, found["xy + consensus"] = timed(store, Q, qlangs, "xy", None, group)
        out["modes"].append({"mode": "xy + consensus", **row})
        truth = exact_centred(V, langs, rows, means, Q, qlangs)
        out["corrected_recall"] = recall(found["xy + correction"], truth)
        plain, own = exact_plain(V, langs, rows, Q, qlangs)
        out["plain_recall"], out["mono_recall"] = recall(found["xy"], plain), recall(found["mono"], own)
        consensus_truth = exact_consensus(V, langs, rows, means, Q, *CONSENSUS)
        out["consensus_recall"] = recall(found["xy + consensus"], consensus_truth)
        out["consensus_shifts"] = []
        for shift in consensus_shifts:
            row, got = latency(hinted_consensus(store, group, shift), Q, qlangs)
            out["consensus_shifts"].append({"shift": shift, **row, "recall": recall(got, consensus_truth)})
            print(f"  xy + consensus, walk hints {shift:g}: p50 {row['p50_ms']:.2f} ms", file=sys.stderr, flush=True)
        out["corrected_efs"] = []
        for ef in corrected_efs:
            row, got = timed(store, Q, qlangs, "xy", means, ef=ef)
            out["corrected_efs"].append({"ef": ef, **row, "recall": recall(got, truth)})
            print(f"  xy + correction, ef {ef}: p50 {row['p50_ms']:.2f} ms", file=sys.stderr, flush=True)
        if languages_timed:  # what a corrected search asks of each language (not of a centred graph)
            out["per_language"] = per_language(store, means, Q, qlangs)
        out["shifts"] = []
        kept = bias.WALK_SHIFT
        try:
            for shift in shifts:
                bias.WALK_SHIFT = shift
                row, got = timed(store, Q, qlangs, "xy", means)
                out["shifts"].append({"shift": shift, **row, "recall": recall(got, truth)})
                print(f"  xy + correction, walk shift {shift:g}: p50 {row['p50_ms']:.2f} ms", file=sys.stderr, flush=True)
        finally:
            bias.WALK_SHIFT = kept
    finally:
        store.close()
    return out


def per_language(store: Any, means: Any, Q: np.ndarray, qlangs: Sequence[str]) -> dict[str, float]:
    """Mean ms of each language's part of a corrected search: the store's candidates for the
    centred query in that language alone, as many as the correction fetches (warm: the
    searches above filled the store's per-language caches)."""
    from vecplug.adapters.bias import OVERFETCH, walk_vectors

    spent: dict[str, float] = {}
    for q, ql in zip(Q, qlangs):
        centred = means.centre_query(q, ql)
        for lang in means.by_lang:
            hint = walk_vectors(means, centred, [lang])
            t0 = time.perf_counter()
            store.candidates_per_language(centred, K * OVERFETCH, [lang], walk_vectors=hint)
            spent[lang] = spent.get(lang, 0.0) + time.perf_counter() - t0
    return {lang: 1000 * t / len(Q) for lang, t in sorted(spent.items(), key=lambda x: -x[1])}


def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine_info()
    V = np.load(args.vectors, mmap_mode="r", allow_pickle=False)
    langs = read_langs(args.corpus, len(V))
    made = args.work is None
    work = Path(tempfile.mkdtemp(prefix="vecplug-modes-", dir="/tmp")) if made else args.work
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for n in args.sizes:
            rows, qrows = split(len(V), n, args.queries, args.seed)
            # hnswlib's folders keep their names of before --store: kept ones are found again
            kind = f"{args.store}-centred" if args.centred else args.store
            folder = work / (f"modes-{n}-{args.seed}" if kind == "hnswlib" else f"modes-{kind}-{n}-{args.seed}")
            build_s = None
            if not (folder / "manifest.json").is_file():
                shutil.rmtree(folder, ignore_errors=True)
                print(f"building {n:,} ...", file=sys.stderr, flush=True)
                build_s = build(folder, V, langs, rows, args.store, {"centred": True} if args.centred else None)
            print(f"searching {n:,} ...", file=sys.stderr, flush=True)
            results.append({"n": n, "build_s": build_s, "scan_limit": scan_limit(args.store, n), **measure(
                folder, V, langs, rows, qrows, args.walk_shifts, args.store, args.consensus_shifts, not args.centred,
                args.corrected_efs)})
            if args.scan_limits:
                print(f"  scan limits {args.scan_limits} ...", file=sys.stderr, flush=True)
                results[-1]["scan_limits"] = scan_limits(folder, V, langs, rows, qrows, args.scan_limits)
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    from vecplug.adapters.bias import CENTRED_OVERFETCH
    from vecplug.adapters.stores.base import EXACT_FILTER_LIMIT

    return {"benchmark": "modes_scale", "store": args.store, "centred": args.centred,
            "centred_overfetch": CENTRED_OVERFETCH, "machine": info, "vectors": str(args.vectors), "corpus": str(args.corpus),
            "queries": args.queries, "seed": args.seed, "k": K, "exact_filter_limit": EXACT_FILTER_LIMIT,
            "languages_shown": args.languages_shown,
            "threads": os.environ.get("OMP_NUM_THREADS"), "results": results}


STORE_NAMES = {"hnswlib": "an hnswlib store", "qdrant": "an embedded Qdrant store"}


def scan_limit(kind: str, n: int) -> int:
    """The most documents of a language the store scans exactly in an index of ``n``: hnswlib's
    grows with the index (``hnsw.scan_limit``), Qdrant's is its full_scan_threshold."""
    from vecplug.adapters.stores.base import EXACT_FILTER_LIMIT
    from vecplug.adapters.stores.hnsw import scan_limit as hnsw_limit

    return hnsw_limit(n) if kind == "hnswlib" else EXACT_FILTER_LIMIT


def render(r: dict[str, Any]) -> str:
    def limit(res: dict[str, Any]) -> int:  # results of before the scan limit grew: the fixed one
        return int(res.get("scan_limit", r["exact_filter_limit"]))

    title = "Retrieval modes' first stage on a large index of many languages"
    if r.get("store", "hnswlib") != "hnswlib":
        title += f" ({STORE_NAMES[r['store']].removeprefix('an ')})"
    if r.get("centred"):
        title += " (hnswlib, its graph of language-centred vectors)"
    how = ("is one walk of the graph of language-centred vectors (`adapters/stores/centring.py`) for "
           f"{r.get('centred_overfetch', 4)} x 10 candidates, rescored exactly; `xy` and `mono` then go language by "
           "language (an exact scan for a language of at most the scan limit's documents, else a filtered walk "
           "rescored)" if r.get("centred") else
           "searches each language of the index on its own (an exact scan for a language of at most the scan limit's "
           "documents, else a filtered graph walk) and rescores centred vectors")
    # results of before xy and mono were scored have no such column
    plain_scored = all("mono_recall" in res for res in r["results"])
    lines = [header_markdown(title, r["machine"]), "",
             f"Vectors {r['vectors']} with the languages of {r['corpus']}; {r['queries']} held-out rows searched "
             f"one at a time in their own document's language, top {r['k']}, after {WARMUP} warm-up queries; "
             f"{STORE_NAMES[r.get('store', 'hnswlib')]} with its defaults, opened read-only. `xy + correction` "
             f"{how}; its recall is against an exact centred ranking of every document. "
             + ("`xy` and `mono` recall: against exact plain cosine over every document / the query's language's. "
                if plain_scored else "")
             + f"`xy + consensus` (without the correction) regroups each language's best {CONSENSUS[1]}; its recall "
             f"is against consensus over each language's exact best {CONSENSUS[1]}.", ""]
    rows = []
    for res in r["results"]:
        by = Counter(res["languages"])
        walked = sum(1 for c in by.values() if c > limit(res))
        top = ", ".join(f"{lang} {c:,}" for lang, c in by.most_common(3))
        row = [f"{res['n']:,}", f"{limit(res):,}", f"{len(by)} ({walked} walked)", top]
        row += [f"{m['p50_ms']:.2f} / {m['p95_ms']:.2f}" for m in res["modes"]]
        row.append(f"{res['corrected_recall']:.4f}")
        row.append(f"{res['consensus_recall']:.4f}" if "consensus_recall" in res else "")
        if plain_scored:
            row.append(" / ".join(f"{res[key]:.4f}" for key in ("plain_recall", "mono_recall")))
        rows.append(row)
    head = ["documents", "scan limit", "languages (> limit)", "largest"] + [f"{m['mode']} p50 / p95 ms"
                                                             for m in r["results"][0]["modes"]]
    head += ["xy + correction recall@10", "xy + consensus recall@10"] + (["xy / mono recall@10"] if plain_scored else [])
    lines.append(markdown_table(head, rows))
    if not r.get("centred"):
        lines += ["", f"(Per-language walks moved by `WALK_SHIFT` = {r['results'][0].get('walk_shift', 0):g} "
                  "times their language's mean: `adapters/bias.py`.)"]
    lines += _sweep(r, "shifts", "The corrected `xy` with other walk shifts (0: the walks of before the shift):",
                    "walk shift", lambda s: f"{s['shift']:g}")
    limited = [(res["n"], s) for res in r["results"] for s in res.get("scan_limits", [])]
    if limited:
        lines += ["", "The corrected `xy` with other exact-scan limits (a language of more documents is walked), "
                  "one store handle each, taking turns query by query; the memory its language filters take "
                  "(a scanned language's: a copy of its vectors):", ""]
        lines.append(markdown_table(["documents", "scan limit", "walked", "p50 / p95 ms", "mean ms", "recall@10",
                                     "filters MB"],
                                    [[f"{n:,}", f"{s['limit']:,}", str(s["walked"]),
                                      f"{s['p50_ms']:.2f} / {s['p95_ms']:.2f}", f"{s['mean_ms']:.2f}",
                                      f"{s['recall']:.4f}", f"{s['cache_mb']:.0f}"] for n, s in limited]))
    lines += _sweep(r, "corrected_efs", "The corrected `xy` with other search breadths (ef, given to each search; "
                    "without one, the store's: 128, and twice that for a centred graph's one walk):",
                    "ef", lambda s: str(s["ef"]))
    lines += _sweep(r, "consensus_shifts", "`xy` + consensus with walk hints (towards the query plus the shift x "
                    "each language's mean; the library walks without: `adapters/consensus.py`), recall of the exact "
                    "consensus:", "hint shift", lambda s: f"{s['shift']:g}")
    for res in r["results"]:
        if "per_language" not in res:
            continue
        total = sum(res["per_language"].values())
        lines += ["", f"The corrected search's per-language parts at {res['n']:,} documents ({total:.1f} ms a query "
                  "in all, the dearest first):", ""]
        shown = list(res["per_language"].items())[:r.get("languages_shown", 8)]
        lines.append(markdown_table(
            ["language", "documents", "share", "how", "ms a query"],
            [[lang, f"{res['languages'].get(lang, 0):,}", f"{res['languages'].get(lang, 0) / res['n']:.1%}",
              "filtered walk" if res["languages"].get(lang, 0) > limit(res) else "exact scan", f"{ms:.2f}"]
             for lang, ms in shown]))
    return "\n".join(lines)


def _sweep(r: dict[str, Any], key: str, intro: str, column: str, value: Callable[[dict[str, Any]], str]) -> list[str]:
    """A table of one setting swept (each result's ``key`` list: its value, latency and recall),
    after ``intro``; nothing when no result swept it."""
    rows = [[f"{res['n']:,}", value(s), f"{s['p50_ms']:.2f} / {s['p95_ms']:.2f}", f"{s['mean_ms']:.2f}",
             f"{s['recall']:.4f}"] for res in r["results"] for s in res.get(key, [])]
    if not rows:
        return []
    return ["", intro, "", markdown_table(["documents", column, "p50 / p95 ms", "mean ms", "recall@10"], rows)]


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
