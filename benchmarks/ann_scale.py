"""Index build and search at scale: vecplug's stores (hnswlib, embedded Qdrant) and raw hnswlib.

For each size (default 100k and 1M vectors of 384 dimensions) and backend, in fresh
subprocesses (so that a peak RSS is that configuration's alone):

* build: vectors are upserted through the store in batches (``--batch``, 10k) with records
  like an indexing run's (id, short text ``"doc 123"``, a language cycling over 6 codes), and
  committed every ``--commit-every`` vectors (10k; ``0``: once at the end) and at the end, as
  ``vecplug index`` does (every 4096 documents, spaced out once commits get slow). Reported: wall time (create +
  upserts + commits + close; reading the vectors from the data file is not counted),
  vectors/s, the time spent in commits (each one's in the JSON), the process's peak RSS, and
  the index folder's bytes per vector (allocated blocks: Qdrant preallocates sparse files;
  apparent sizes are in the JSON);
* serve: a fresh process opens the index read-only and searches, one query at a time (top-10,
  no filter), ``--queries`` held-out queries after a warm-up of 50: p50/p95 latency and
  recall@10 against exact inner-product search (strict, and with ties as ann-benchmarks
  counts them: a result within 1e-3 of the exact 10th score is not a miss; the parent scores
  the returned labels exactly), and the process's peak RSS: the serving
  footprint that the "under 2 GB" target is about. For Qdrant it counts the pages of its
  memory-mapped files that the searches touched (the kernel may reclaim them); hnswlib's graph
  is anonymous memory. Also a language-filtered search (``langs=[the query's language]``, 1
  document in 6) at the store's defaults, against exact filtered search, in a process of its
  own (the store's filter caches would otherwise count in the serving footprint); for Qdrant
  also with the store's option ``acorn`` off (Qdrant's plain filtered walk). The
  synthetic data's languages are a label cycling over the records, not a direction in the
  space as real languages are.

Peak RSS is ``VmHWM`` of the worker's own address space, not ``ru_maxrss``: Linux carries
``ru_maxrss`` over fork and exec, so every worker would report at least its parent's size.

Backends:

* ``hnswlib``: :class:`vecplug.adapters.stores.hnsw.HnswStore` (hnswlib graph + SQLite records).
  The ef sweep opens the store once and passes each ef per query (``search(..., ef=)``, as
  ``vecplug search --ef`` does): each row is what a user with that ef gets, record lookups
  included;
* ``qdrant``: the embedded :class:`vecplug.adapters.stores.qdrant.QdrantStore` (Qdrant Edge).
  Its commit flushes and runs the engine's ``optimize()`` (HNSW build; the JSON records how
  many vectors are in HNSW after the last commit), so the index searched is the one a vecplug
  user gets after ``commit()``. The row ``default`` is ``store.search`` as is (no
  ``hnsw_ef``: the engine's default, whose recall falls between ef=64 and ef=128, as Qdrant's
  ef_construct = 100 would); the ef rows are ``store.search(..., ef=)`` (the engine's
  ``hnsw_ef``);
* ``raw-hnswlib``: ``hnswlib.Index`` directly with the same M / ef_construction, sized for all
  vectors up front, saved with ``save_index``, ``set_ef`` per ef in one process: the reference
  that shows the store's overhead (SQLite records and their checksums, graph growth by
  resizing, commits that write and hash the whole graph, SQL per search).

Data: clustered synthetic unit vectors shaped like me5-small passage embeddings; ANN recall on
uniform random vectors means nothing (no structure, every neighbour nearly as far). Each
vector is ``normalise(m + sqrt(1-w) * c_j + sqrt(w) * e)``: ``m`` a shared mean direction of
norm 0.88, ``c_j`` one of ``n / 20`` cluster centres and ``e`` per-point noise, both Gaussian
with the same covariance (a random rotation of a power-law spectrum, eigenvalue i
proportional to 1/i, trace ``1 - 0.88^2``), and ``w = 0.53``. So random pairs have cosine
~0.78 (e5 is anisotropic) and a point's nearest neighbour ~0.92. Chosen by measurement against
37,390 me5-small passage vectors (a distillation cache; 1,000 of them held out as queries;
hnswlib M=16, ef_construction=200): the real vectors have nearest-neighbour cosine p10/p50/p90
0.90/0.93/0.96, 10th neighbour 0.87/0.90/0.93, random pairs 0.75/0.79/0.84, and hnswlib
recall@10 at ef 10/16/32/64 of 0.81/0.88/0.95/0.98. This model at that size: nearest
neighbour 0.91/0.92/0.93, 10th 0.88/0.89/0.90, random pairs 0.71/0.78/0.83 (the real data's
spread of similarities is wider); recall with w = 0.52: 0.83/0.89/0.95/0.98, with w = 0.54:
0.78-0.80/0.86-0.87/0.94/0.98 (two seeds): w = 0.53 sits between, like the real data
(w = 0.6: 0.68/0.77/0.88/0.95; uniform or isotropic data is far easier or far harder).
Difficulty grows with n: at 100k (w = 0.52) recall@10 at ef=64 is 0.96.

With ``--centres FILE.npy`` (real embeddings, e.g. me5-small vectors) the centres are
``n / 20`` of those (all of them if the file has fewer): ``m`` is their mean,
``c_j`` a vector minus the mean, and the noise follows their covariance (at 20k, from me5
vectors: neighbours like the synthetic data's, recall somewhat higher). Queries are held-out
points of the same distribution (same centres, other draws), never in the index. With
``--vectors FILE.npy`` no model is involved: the base vectors and the queries are disjoint
seeded random rows of the file, normalised (``benchmarks/tatoeba_vectors.py`` writes ~158k
me5-small vectors of Tatoeba sentences, and with ``--corpus`` those of a JSONL corpus, such as
the million sentences of Debian's documentation in 32 languages that
``benchmarks/debian_corpus.py`` builds); the "languages" of the filtered searches are still
every sixth row, not the sentences' own. Everything is seeded; vectors are generated in chunks
straight into a ``.npy`` file in the work folder (1M x 384 float32 is 1.5 GB; never two copies
in memory), and the workers read it in chunks
with plain file reads (a memory map would count its pages in their RSS). Ground truth: exact
top-10 by inner product (and per language, for the filtered searches) in chunks with numpy;
data and ground truth are cached in the work folder under a key of their parameters.

``--sweep``: raw hnswlib at the smallest size for M in {12, 16, 24, 32} x ef_construction in
{100, 200}, with the same ef sweep: which settings reach ``--target-recall`` (0.99) at what
latency, memory and build time (the store's defaults, M=16, ef_construction=200,
ef_search=128 since this benchmark, come out of this).

Run time, from runs on the 2-core machine while other jobs ran (a quiet machine is faster):

* data and exact top-10: 4 s at 100k, about 1 min at 1M;
* hnswlib store at 100k: build 65 s (1,540 vectors/s; 5 s of it in 10 commits), serve (one
  process for the sweep, one for the filtered searches) ~30 s. At 1M (extrapolated): graph insertion
  slows with size (log n, and the graph no longer fits in cache): ~15-20 min of upserts; the
  100 commits each write and hash the whole graph (up to 1.7 GB; ~85 GB written in all):
  ~5-10 min; serve ~2 min: about 25-30 min (measured: ``--commit-every 100000``, the
  cadence ``vecplug index`` reaches once commits take seconds, about 20 min);
* raw hnswlib: a little less than the store's upserts: ~1 min at 100k, ~15-20 min at 1M;
* embedded Qdrant: each commit's ``optimize()`` takes longer as the index grows (10k commits:
  6, 9, 11, 12 s at 10k-40k; 25k commits: 21, 27, 37, 37 s at 25k-100k; one 100k commit: 139
  s): ~2.5-4 min at 100k. At 1M, 100 commits of growing cost: several hours (extrapolated, not
  run), hence ``--qdrant-sizes`` (e.g. ``--qdrant-sizes 100000``) and ``--commit-every 0``;
* ``--sweep``: 8 builds and serves at 100k, ~10-12 min.

With ``--json FILE``, what was measured so far is kept in ``FILE.partial`` while the run goes
(a long run that dies keeps its finished configurations). A full run
``--sizes 100000 1000000 --qdrant-sizes 100000``: about 50-60 min (+10 min with
``--sweep``), peak memory ~2.5 GB (the 1M hnswlib builds), disk ~7 GB in the work folder.

Usage::

    python benchmarks/ann_scale.py --sizes 100000 1000000 --qdrant-sizes 100000 --sweep \\
        --json benchmarks/results/ann_scale.json > benchmarks/results/ann_scale.md
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # no-op when run as a script

from bench_common import (  # noqa: E402
    fmt, header_markdown, machine_info, markdown_table, percentile, run_main, save_json)
from vecplug.adapters.stores.base import EXACT_FILTER_LIMIT  # noqa: E402

BACKENDS = ("hnswlib", "qdrant", "raw-hnswlib")
LANGS = ("en", "de", "es", "ru", "zh", "ar")  # record i has LANGS[i % 6]; query q filters on LANGS[q % 6]
K = 10
WARMUP = 50
#: ann-benchmarks' "recall" (its knn metric): a result counts when its distance is at most the
#: exact k-th one plus 1e-3, so that near-ties at the k-th place are not misses
TIE_EPS = 1e-3
GT_CHUNK = 20_000  # base rows per ground-truth step: 1000 queries x 20k scores = 80 MB
GEN_CHUNK = 50_000
DATA_VERSION = 3  # bump when the generator changes: the cache key includes it
# the data model (module docstring), fitted to me5-small passage vectors
MEAN_WEIGHT = 0.88
DECAY = 1.0
NOISE = 0.53
PER_CENTRE = 20


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="index sizes (vectors)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    for flag, backend in (("--hnswlib-sizes", "hnswlib"), ("--qdrant-sizes", "qdrant"), ("--raw-sizes", "raw-hnswlib")):
        p.add_argument(flag, type=int, nargs="+", dest=f"{backend.replace('-', '_')}_sizes", metavar="N",
                       help=f"sizes for {backend} only (default: --sizes)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=1000, help="held-out queries (recall and latency)")
    p.add_argument("--filtered-queries", type=int, default=200,
                   help="of those, how many also search with a language filter (0: none)")
    p.add_argument("--ef", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512], help="search-time ef sweep")
    p.add_argument("--M", type=int, default=None, help="hnswlib M (default: the store's)")
    p.add_argument("--ef-construction", type=int, default=None, help="hnswlib ef_construction (default: the store's)")
    p.add_argument("--batch", type=int, default=10_000, help="vectors per upsert")
    p.add_argument("--commit-every", type=int, default=10_000, help="commit after this many vectors (0: once at the end)")
    p.add_argument("--threads", type=int, default=2, help="CPUs each worker may use (sched_setaffinity)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--centres", type=Path, help="real embeddings (.npy, n x dim) to use as cluster centres")
    data.add_argument("--vectors", type=Path, help="real embeddings (.npy, n x dim) to index as they are: "
                      "queries and base vectors are disjoint random rows (benchmarks/tatoeba_vectors.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, help="work folder (data and ground truth cached here); "
                                             "default: a new folder under /tmp, removed at the end")
    p.add_argument("--keep", action="store_true", help="keep the indexes (and a default work folder)")
    p.add_argument("--data-only", action="store_true",
                   help="only make (or find) the data and exact neighbours in --work, for ann_crowding.py")
    p.add_argument("--sweep", action="store_true", help="also sweep M x ef_construction (raw hnswlib, smallest size)")
    p.add_argument("--sweep-M", type=int, nargs="+", default=[12, 16, 24, 32])
    p.add_argument("--sweep-ef-construction", type=int, nargs="+", default=[100, 200])
    p.add_argument("--target-recall", type=float, default=0.99)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from vecplug.types import HNSW_DEFAULTS
    args.M = args.M or int(HNSW_DEFAULTS["M"])
    args.ef_construction = args.ef_construction or int(HNSW_DEFAULTS["ef_construction"])
    args.default_ef = int(HNSW_DEFAULTS["ef_search"])
    if args.default_ef not in args.ef:
        args.ef = sorted({*args.ef, args.default_ef})
    return args


# -- data ----------------------------------------------------------------------------------------


def _key(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def _npy_offset(path: Path) -> tuple[int, tuple[int, ...]]:
    """Byte offset of the data in an ``.npy`` file, and its shape."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        if fortran or dtype != np.float32:
            raise ValueError(f"{path}: expected a C-order float32 array")
        return f.tell(), tuple(shape)


class RowReader:
    """Rows of a float32 ``.npy`` file by plain reads: no memory map, so a worker's RSS holds
    only the chunk it reads, not the pages of the whole file."""

    def __init__(self, path: Path) -> None:
        self.offset, self.shape = _npy_offset(path)
        self.f = open(path, "rb")

    def read(self, a: int, b: int) -> np.ndarray:
        d = self.shape[1]
        self.f.seek(self.offset + a * d * 4)
        return np.fromfile(self.f, dtype=np.float32, count=(b - a) * d).reshape(b - a, d)

    def chunks(self, size: int) -> Iterator[tuple[int, np.ndarray]]:
        for a in range(0, self.shape[0], size):
            yield a, self.read(a, min(self.shape[0], a + size))

    def close(self) -> None:
        self.f.close()


class DataModel:
    """The mixture that the vectors are drawn from (module docstring): mean ``m``, centre
    residuals ``C`` (one row per centre) and the noise's square-root covariance ``L`` (rows:
    ``z @ L`` for ``z`` standard normal has the residuals' covariance)."""

    def __init__(self, n: int, dim: int, seed: int, centres: Path | None) -> None:
        rng = np.random.default_rng([seed, 0])
        if centres is None:
            mu = rng.standard_normal(dim)
            mu /= np.linalg.norm(mu)
            basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
            s = np.arange(1, dim + 1, dtype=np.float64) ** -DECAY
            s /= s.sum()
            beta = np.sqrt(1.0 - MEAN_WEIGHT ** 2)
            self.L = (beta * (basis * np.sqrt(s)).T).astype(np.float32)
            self.m = (MEAN_WEIGHT * mu).astype(np.float32)
            n_centres = max(1, round(n / PER_CENTRE))
            self.C = np.zeros((n_centres, dim), dtype=np.float32)
            for a in range(0, n_centres, GEN_CHUNK):  # the same draws whatever the chunking
                rows = min(n_centres, a + GEN_CHUNK) - a
                z = np.random.default_rng([seed, 3, a]).standard_normal((rows, dim), dtype=np.float32)
                self.C[a:a + rows] = z @ self.L
        else:
            R = np.array(np.load(centres, mmap_mode="r", allow_pickle=False), dtype=np.float64)  # a copy
            if R.ndim != 2 or R.shape[1] != dim:
                raise ValueError(f"{centres}: expected an (n, {dim}) array, got {R.shape}")
            R /= np.maximum(np.linalg.norm(R, axis=1, keepdims=True), 1e-12)
            mean = R.mean(axis=0)
            evals, evecs = np.linalg.eigh(np.cov((R - mean).T))
            self.L = (evecs * np.sqrt(np.clip(evals, 0, None))).T.astype(np.float32)
            self.m = mean.astype(np.float32)
            # as many centres as the synthetic model has (n / 20), while the file has enough
            pick = np.sort(rng.permutation(len(R))[:max(1, round(n / PER_CENTRE))])
            self.C = (R[pick] - mean).astype(np.float32)
        self.dim = dim

    def sample(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """``rows`` unit vectors of the mixture."""
        j = rng.integers(0, len(self.C), rows)
        z = rng.standard_normal((rows, self.dim), dtype=np.float32)
        x = self.m + np.sqrt(1 - NOISE, dtype=np.float32) * self.C[j] + np.sqrt(NOISE, dtype=np.float32) * (z @ self.L)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x.astype(np.float32)


def data_params(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """What the data of one size depends on (its cache key)."""
    def identity(path: Path | None) -> list[Any] | None:
        if path is None:
            return None
        st = path.stat()
        return [str(path.resolve()), st.st_size, st.st_mtime_ns]

    params = {"version": DATA_VERSION, "n": n, "dim": args.dim, "queries": args.queries, "seed": args.seed}
    if args.vectors is not None:
        return {**params, "vectors": identity(args.vectors)}
    return {**params, "centres": identity(args.centres), "mean_weight": MEAN_WEIGHT, "decay": DECAY,
            "noise": NOISE, "per_centre": PER_CENTRE}


def _real_rows(path: Path, n: int, queries: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``--vectors``: (base, queries) as disjoint seeded random rows of ``path``, unit length."""
    R = np.load(path, mmap_mode="r", allow_pickle=False)
    if R.ndim != 2 or R.shape[1] != dim:
        raise ValueError(f"{path}: expected an (n, {dim}) array, got {R.shape}")
    if n + queries > len(R):
        raise ValueError(f"{path}: {len(R):,} rows, too few for {n:,} base vectors and {queries:,} queries")
    order = np.random.default_rng([seed, 4]).permutation(len(R))
    base, held = (np.asarray(R[np.sort(rows)], dtype=np.float32) for rows in (order[queries:queries + n], order[:queries]))
    for X in (base, held):
        X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    return base, held


def make_data(args: argparse.Namespace, n: int, work: Path) -> dict[str, Any]:
    """The base vectors, queries and ground truth of one size, made (in chunks) or found in
    ``work``; returns their paths and a few statistics."""
    params = data_params(args, n)
    key = _key(params)
    paths = {name: work / f"{name}-{key}.npy" for name in ("base", "queries", "gt", "gt_scores", "gtf")}
    stats_path = work / f"stats-{key}.json"
    if stats_path.is_file() and all(p.is_file() for p in paths.values()):
        stats = json.loads(stats_path.read_text())
        stats["cached"] = True
        return {"paths": {k: str(v) for k, v in paths.items()}, "stats": stats}
    t0 = time.perf_counter()
    tmp = paths["base"].with_name(paths["base"].name + ".tmp")
    if args.vectors is not None:
        base, queries = _real_rows(args.vectors, n, args.queries, args.dim, args.seed)
        with open(tmp, "wb") as f:
            np.save(f, base)
        del base
        n_centres = None
    else:
        model = DataModel(n, args.dim, args.seed, args.centres)
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, args.dim))
        for a in range(0, n, GEN_CHUNK):
            b = min(n, a + GEN_CHUNK)
            out[a:b] = model.sample(b - a, np.random.default_rng([args.seed, 1, a]))
        out.flush()
        del out
        queries = model.sample(args.queries, np.random.default_rng([args.seed, 2]))
        n_centres = len(model.C)
        del model
    os.replace(tmp, paths["base"])
    np.save(paths["queries"], queries)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids, scores, fids, random_cos = ground_truth(paths["base"], queries)
    np.save(paths["gt"], ids)
    np.save(paths["gt_scores"], scores)
    np.save(paths["gtf"], fids)
    gt_s = time.perf_counter() - t0
    stats = {"centres": n_centres, "generate_s": gen_s, "ground_truth_s": gt_s,
             "nn1_cos": [float(np.percentile(scores[:, 0], q)) for q in (10, 50, 90)],
             "nn10_cos": [float(np.percentile(scores[:, K - 1], q)) for q in (10, 50, 90)],
             "random_cos": [float(np.percentile(random_cos, q)) for q in (10, 50, 90)],
             "params": params}
    stats_path.write_text(json.dumps(stats, indent=2))
    stats["cached"] = False
    return {"paths": {k: str(v) for k, v in paths.items()}, "stats": stats}


def _merge_top(best_s: np.ndarray, best_i: np.ndarray, s: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running top-k (k: the width of ``best_s``, K where ann_scale keeps them): the best of
    (best_s, best_i) and the scores ``s`` of columns ``ids``."""
    k = best_s.shape[1]
    kk = min(k, s.shape[1])
    part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
    cat_s = np.hstack([best_s, np.take_along_axis(s, part, 1)])
    cat_i = np.hstack([best_i, ids[part]])
    sel = np.argpartition(-cat_s, k - 1, axis=1)[:, :k]
    return np.take_along_axis(cat_s, sel, 1), np.take_along_axis(cat_i, sel, 1)


def ground_truth(base: Path, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact top-K ids and scores by inner product for every query; the filtered top-K (query q
    among the documents of language ``q % 6``); cosines of random base pairs (a sample)."""
    nq = len(queries)
    best_s = np.full((nq, K), -np.inf, dtype=np.float32)
    best_i = np.full((nq, K), -1, dtype=np.int64)
    by_lang = [np.flatnonzero(np.arange(nq) % len(LANGS) == lang) for lang in range(len(LANGS))]
    fbest = [(np.full((len(q), K), -np.inf, dtype=np.float32), np.full((len(q), K), -1, dtype=np.int64))
             for q in by_lang]
    reader = RowReader(base)
    random_cos = np.zeros(0, dtype=np.float32)
    try:
        for a, X in reader.chunks(GT_CHUNK):
            if a == 0:
                rng = np.random.default_rng(0)
                i, j = rng.integers(0, len(X), (2, 2000))
                keep = i != j
                random_cos = np.einsum("ij,ij->i", X[i[keep]], X[j[keep]])
            S = queries @ X.T
            cols = np.arange(a, a + len(X))
            best_s, best_i = _merge_top(best_s, best_i, S, cols)
            for lang, qs in enumerate(by_lang):
                first = (lang - a) % len(LANGS)  # first row of this chunk in that language
                if not len(qs) or first >= len(X):
                    continue
                sub = S[np.ix_(qs, np.arange(first, len(X), len(LANGS)))]
                fbest[lang] = _merge_top(*fbest[lang], sub, cols[first::len(LANGS)])
    finally:
        reader.close()
    order = np.argsort(-best_s, axis=1)
    fids = np.full((nq, K), -1, dtype=np.int64)
    for qs, (fs, fi) in zip(by_lang, fbest):
        fids[qs] = np.take_along_axis(fi, np.argsort(-fs, axis=1), 1)
    return (np.take_along_axis(best_i, order, 1), np.take_along_axis(best_s, order, 1), fids, random_cos)


# -- workers (each in a fresh process) ---------------------------------------------------------------


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes (0 if absent)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_now() -> int:
    """This process's resident set size now, in bytes."""
    return _status_bytes("VmRSS")


def _rss_peak() -> int:
    """This process's peak resident set size, in bytes: ``VmHWM``, the high-water mark of its
    own address space. Not ``ru_maxrss``: Linux carries that across fork and exec, so a worker
    started by a parent of 230 MB (torch imported) would report at least 230 MB."""
    return _status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def folder_bytes(path: Path) -> dict[str, Any]:
    """Apparent and allocated bytes of everything under ``path``, and allocated bytes per
    top-level entry."""
    apparent = allocated = 0
    parts: dict[str, int] = {}
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
            top = Path(root, name).relative_to(path).parts[0]
            parts[top] = parts.get(top, 0) + st.st_blocks * 512
    return {"apparent": apparent, "allocated": allocated, "parts": parts}


def _records(a: int, b: int) -> list[Any]:
    from vecplug.adapters.stores.base import Record

    return [Record(f"d{i}", f"doc {i}", "ann_scale", i, LANGS[i % len(LANGS)], {}) for i in range(a, b)]


def _label(hit: Any) -> int:
    return int(hit.record.id[1:])


def _build(spec: dict[str, Any]) -> dict[str, Any]:
    """Build one index from the data file; timings exclude reading the vectors."""
    backend, folder = spec["backend"], Path(spec["index"])
    reader = RowReader(Path(spec["data"]))
    n, dim = reader.shape
    batch, every = int(spec["batch"]), int(spec["commit_every"])
    out: dict[str, Any] = {"rss_baseline": _rss_now()}
    upsert_s = commit_s = last_commit_s = 0.0
    commits = 0
    commit_times: list[list[float]] = []  # [vectors in the index, seconds] per commit: how commits grow
    if backend == "raw-hnswlib":
        import hnswlib

        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=n, M=spec["M"], ef_construction=spec["ef_construction"])
        index.set_num_threads(int(spec["threads"]))
        create_s = time.perf_counter() - t0
        for a, X in reader.chunks(batch):
            t0 = time.perf_counter()
            index.add_items(X, np.arange(a, a + len(X)))
            upsert_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        index.save_index(str(folder / "index.hnsw"))
        commit_s = last_commit_s = time.perf_counter() - t0
        commits, close_s = 1, 0.0
    else:
        if backend == "hnswlib":
            from vecplug.adapters.stores.hnsw import HnswStore as Store

            options = {"M": spec["M"], "ef_construction": spec["ef_construction"], "ef_search": spec["default_ef"]}
        else:
            from vecplug.adapters.stores.qdrant import QdrantStore as Store

            options = {}
        t0 = time.perf_counter()
        store = Store.create(str(folder), dim, {"benchmark": "ann_scale"}, options)
        create_s = time.perf_counter() - t0
        since = 0
        for a, X in reader.chunks(batch):
            records = _records(a, a + len(X))
            t0 = time.perf_counter()
            store.upsert(records, X)
            upsert_s += time.perf_counter() - t0
            since += len(X)
            if every and since >= every or a + len(X) == n:
                t0 = time.perf_counter()
                store.commit({})
                last_commit_s = time.perf_counter() - t0
                commit_s += last_commit_s
                commits += 1
                commit_times.append([a + len(X), last_commit_s])
                since = 0
                print(f"  [{backend}] {a + len(X):,}/{n:,} upsert {upsert_s:.1f}s commit {commit_s:.1f}s "
                      f"(last {last_commit_s:.1f}s)", file=sys.stderr, flush=True)
        if backend == "qdrant":
            info = store._b.shard.info()  # noqa: SLF001 - whether HNSW was built is the point
            out.update(segments=int(info.segments_count), indexed_vectors=int(info.indexed_vectors_count))
        t0 = time.perf_counter()
        store.close()
        close_s = time.perf_counter() - t0
    reader.close()
    build_s = create_s + upsert_s + commit_s + close_s
    out.update(n=n, build_s=build_s, upsert_s=upsert_s, commit_s=commit_s, commits=commits,
               last_commit_s=last_commit_s, commit_times=commit_times, close_s=close_s, vectors_per_s=n / build_s,
               build_rss_peak=_rss_peak(), disk=folder_bytes(folder))
    return out


def _timed(search: Any, queries: np.ndarray, gt: np.ndarray) -> dict[str, Any]:
    """Recall@K and latency of ``search(i, query) -> labels`` (``i``: the query's number), one
    query at a time, after a warm-up."""
    for i, q in enumerate(queries[:WARMUP]):
        search(i, q)
    lat, recall, found = [], [], []
    for i, (q, truth) in enumerate(zip(queries, gt)):
        t0 = time.perf_counter()
        labels = search(i, q)
        lat.append(time.perf_counter() - t0)
        recall.append(len(set(labels) & set(truth.tolist())) / K)
        found.append([int(x) for x in labels])
    # the labels go back to the parent, which scores them exactly (recall with ties)
    return {"recall": float(np.mean(recall)), "p50_ms": 1000 * percentile(lat, 50),
            "p95_ms": 1000 * percentile(lat, 95), "mean_ms": 1000 * float(np.mean(lat)), "labels": found}


def recall_with_ties(labels: Sequence[Sequence[int]], base: Path, queries: np.ndarray, kth: np.ndarray) -> float:
    """ann-benchmarks' recall@K: the share of the results whose exact score is within
    :data:`TIE_EPS` of the exact K-th score (``kth``, per query). In a dense region of real
    vectors the K-th and the next neighbours often differ by less, and which of them a search
    returns is a coin toss that strict recall counts as a miss."""
    B = np.load(base, mmap_mode="r", allow_pickle=False)
    hits = 0
    for q, (row, t) in enumerate(zip(labels, kth)):
        if row:
            hits += int(np.sum(np.asarray(B[np.asarray(row)], dtype=np.float32) @ queries[q] >= t - TIE_EPS))
    return hits / (K * len(labels))


def _serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the index read-only in this fresh process and search: ef sweep, then filtered."""
    backend, folder = spec["backend"], spec["index"]
    queries = np.load(spec["queries"], allow_pickle=False)
    gt = np.load(spec["gt"], allow_pickle=False)
    gtf = np.load(spec["gtf"], allow_pickle=False)
    nf = min(int(spec["filtered_queries"]), len(queries))
    out: dict[str, Any] = {"rss_baseline": _rss_now(), "sweep": []}
    open_s = None
    if backend == "raw-hnswlib":
        import hnswlib

        t0 = time.perf_counter()
        index = hnswlib.Index(space="ip", dim=queries.shape[1])
        index.load_index(str(Path(folder) / "index.hnsw"))
        open_s = time.perf_counter() - t0
        out["rss_open"] = _rss_now()
        for ef in spec["efs"]:
            index.set_ef(ef)
            row = _timed(lambda i, q: index.knn_query(q, k=K)[0][0].tolist(), queries, gt)
            out["sweep"].append({"ef": ef, **row})
    else:  # a vecplug store: the ef of each query through its own search(..., ef=)
        from vecplug.adapters.stores import get_store_class

        t0 = time.perf_counter()
        store = get_store_class(backend).open(folder, dict(spec.get("store_options", {})))
        open_s = time.perf_counter() - t0
        out["rss_open"] = _rss_now()
        # hnswlib: the store's ef_search is one of the swept efs; Qdrant: its engine's default
        efs: list[Any] = list(spec["efs"]) if backend == "hnswlib" or not spec["efs"] else ["default", *spec["efs"]]
        try:
            for ef in efs:
                row = _timed(lambda i, q, ef=ef: [_label(h) for h in store.search(
                    q, K, ef=None if ef == "default" else ef)], queries, gt)
                out["sweep"].append({"ef": ef, **row})
            if nf:
                out["filtered"] = {"ef": spec["default_ef"] if backend == "hnswlib" else "default", **_timed(
                    lambda i, q: [_label(h) for h in store.search(q, K, [LANGS[i % len(LANGS)]])],
                    queries[:nf], gtf[:nf])}
        finally:
            store.close()
    out.update(open_s=open_s, serve_rss_peak=_rss_peak())
    return out


def worker(spec_path: str, out_path: str) -> int:
    """``--worker SPEC OUT``: one build or serve step, its result as JSON in ``OUT``."""
    spec = json.loads(Path(spec_path).read_text())
    threads = int(spec["threads"])
    cpus = sorted(os.sched_getaffinity(0))
    if 0 < threads < len(cpus):  # hnswlib and Qdrant size their pools by the machine, not by us
        os.sched_setaffinity(0, cpus[:threads])
    result = _build(spec) if spec["role"] == "build" else _serve(spec)
    Path(out_path).write_text(json.dumps(result))
    return 0


def _spawn(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run one worker in a fresh interpreter; its JSON result."""
    tag = f"{spec['role']}-{os.getpid()}-{time.monotonic_ns()}"
    spec_path, out_path = work / f"{tag}.spec.json", work / f"{tag}.out.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(spec["threads"])
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path), str(out_path)],
                              env=env, stdout=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"{spec['role']} worker for {spec['backend']} failed (exit {proc.returncode}); "
                               "its error is above")
        return json.loads(out_path.read_text())
    finally:
        spec_path.unlink(missing_ok=True)
        out_path.unlink(missing_ok=True)


# -- the run ------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, backend: str, data: dict[str, Any], work: Path, M: int, efc: int,
            label: str) -> dict[str, Any]:
    """Build, then serve, one (backend, size, M, ef_construction); the index is removed after
    unless ``--keep``."""
    paths = data["paths"]
    folder = work / f"index-{label}"
    if folder.exists():
        shutil.rmtree(folder)
    base = {"backend": backend, "index": str(folder), "threads": args.threads, "M": M, "ef_construction": efc,
            "default_ef": args.default_ef}
    n = data["stats"]["params"]["n"]
    print(f"[{label}] building {n:,} vectors ...", file=sys.stderr, flush=True)
    build = _spawn({**base, "role": "build", "data": paths["base"], "batch": args.batch,
                    "commit_every": args.commit_every}, work)
    print(f"[{label}] built in {build['build_s']:.1f}s; searching ...", file=sys.stderr, flush=True)
    serve_spec = {**base, "role": "serve", "queries": paths["queries"], "gt": paths["gt"], "gtf": paths["gtf"],
                  "efs": args.ef, "filtered_queries": 0}
    serve = _spawn(serve_spec, work)
    if backend != "raw-hnswlib" and args.filtered_queries:
        # in a process of its own: the store's filter caches do not count in the plain serve RSS
        part = _spawn({**serve_spec, "efs": [], "filtered_queries": args.filtered_queries}, work)
        serve["filtered"] = {**part["filtered"], "serve_rss_peak": part["serve_rss_peak"]}
        if backend == "qdrant":  # and Qdrant's plain filtered walk, which the store replaces
            part = _spawn({**serve_spec, "efs": [], "filtered_queries": args.filtered_queries,
                           "store_options": {"acorn": False}}, work)
            serve["filtered_plain"] = {**part["filtered"], "serve_rss_peak": part["serve_rss_peak"]}
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    queries = np.load(paths["queries"], allow_pickle=False)
    kth = np.load(paths["gt_scores"], allow_pickle=False)[:, K - 1]
    for row in serve["sweep"]:
        row["recall_ties"] = recall_with_ties(row.pop("labels"), Path(paths["base"]), queries, kth)
        print(f"[{label}] ef={row['ef']}: recall@10 {row['recall']:.4f} (with ties {row['recall_ties']:.4f}), "
              f"p50 {row['p50_ms']:.3f} ms", file=sys.stderr, flush=True)
    for key in ("filtered", "filtered_plain"):
        serve.get(key, {}).pop("labels", None)  # no exact scores of the filtered top 10 to compare with
    return {"backend": backend, "n": n, "dim": args.dim, "M": M, "ef_construction": efc, "build": build, "serve": serve}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every (size, backend) measurement, the optional M x ef_construction sweep."""
    info = machine_info()
    print(header_markdown("ANN index build and search at scale", info), flush=True)
    made = args.work is None
    work = Path(tempfile.mkdtemp(prefix="vecplug-ann-", dir="/tmp")) if made else args.work
    work.mkdir(parents=True, exist_ok=True)
    sizes_of = {b: getattr(args, f"{b.replace('-', '_')}_sizes") or args.sizes for b in args.backends}
    all_sizes = sorted({n for b in args.backends for n in sizes_of[b]} | ({min(args.sizes)} if args.sweep else set()))
    rows, sweep, data_stats = [], [], {}
    # a long run keeps what it measured so far beside --json (removed once the run completes)
    partial = args.json.with_name(args.json.name + ".partial") if args.json else None
    try:
        for n in all_sizes:
            print(f"data: {n:,} x {args.dim} ...", file=sys.stderr, flush=True)
            data = make_data(args, n, work)
            data_stats[str(n)] = data["stats"]
            if args.data_only:
                continue
            for backend in args.backends:
                if n in sizes_of[backend]:
                    rows.append(measure(args, backend, data, work, args.M, args.ef_construction, f"{backend}-{n}"))
                    save_json(partial, {"rows": rows, "sweep": sweep, "data": data_stats})
            if args.sweep and n == min(args.sizes):
                for M in args.sweep_M:
                    for efc in args.sweep_ef_construction:
                        sweep.append(measure(args, "raw-hnswlib", data, work, M, efc, f"sweep-M{M}-efc{efc}-{n}"))
                        save_json(partial, {"rows": rows, "sweep": sweep, "data": data_stats})
    finally:
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if partial is not None:  # the whole result replaces it (run_main writes --json)
        partial.unlink(missing_ok=True)
    return {"benchmark": "ann_scale", "machine": info, "work": str(work),
            "params": {"dim": args.dim, "queries": args.queries, "filtered_queries": args.filtered_queries,
                       "efs": args.ef, "default_ef": args.default_ef, "M": args.M,
                       "ef_construction": args.ef_construction, "batch": args.batch,
                       "commit_every": args.commit_every, "threads": args.threads, "seed": args.seed,
                       "centres": str(args.centres) if args.centres else None,
                       "vectors": str(args.vectors) if args.vectors else None, "sizes": sizes_of,
                       "target_recall": args.target_recall},
            "data": data_stats, "rows": rows, "sweep": sweep, "growth": growth(rows, args.default_ef),
            "target": target(rows, args.target_recall)}


# -- summaries and rendering ---------------------------------------------------------------------------


def _at(row: dict[str, Any], ef: Any) -> dict[str, Any] | None:
    return next((s for s in row["serve"]["sweep"] if s["ef"] == ef), None)


def _reference_ef(row: dict[str, Any], default_ef: int) -> Any:
    """The ef a user gets without asking: the store's default (Qdrant: the engine's)."""
    return "default" if row["backend"] == "qdrant" else default_ef


def growth(rows: list[dict[str, Any]], default_ef: int) -> list[dict[str, Any]]:
    """Per backend, smallest vs largest size: how each cost grew."""
    out = []
    for backend in BACKENDS:
        mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["n"])
        if len(mine) < 2:
            continue
        a, b = mine[0], mine[-1]
        ef = _reference_ef(a, default_ef)
        sa, sb = _at(a, ef), _at(b, ef)
        out.append({
            "backend": backend, "from": a["n"], "to": b["n"], "size_ratio": b["n"] / a["n"], "ef": ef,
            "build_s_ratio": b["build"]["build_s"] / a["build"]["build_s"],
            "vectors_per_s": [a["build"]["vectors_per_s"], b["build"]["vectors_per_s"]],
            "serve_rss_ratio": b["serve"]["serve_rss_peak"] / a["serve"]["serve_rss_peak"],
            "disk_per_vector": [a["build"]["disk"]["allocated"] / a["n"], b["build"]["disk"]["allocated"] / b["n"]],
            "p50_ms": [sa and sa["p50_ms"], sb and sb["p50_ms"]],
            "recall": [sa and sa["recall"], sb and sb["recall"]],
        })
    return out


def target(rows: list[dict[str, Any]], recall: float) -> list[dict[str, Any]]:
    """Per (backend, size) and recall measure (strict; with ties, ann-benchmarks'): the fastest
    setting (by p50) reaching ``recall``."""
    out = []
    for r in rows:
        for measure in ("recall", "recall_ties"):
            ok = [s for s in r["serve"]["sweep"] if s.get(measure) is not None and s[measure] >= recall]
            best = min(ok, key=lambda s: s["p50_ms"]) if ok else None
            out.append({"backend": r["backend"], "n": r["n"], "measure": measure, "ef": best and best["ef"],
                        "recall": best and best[measure], "p50_ms": best and best["p50_ms"],
                        "serve_rss": r["serve"]["serve_rss_peak"]})
    return out


def _mb(x: float) -> str:
    return f"{x / 2 ** 20:,.0f}"


def render(r: dict[str, Any]) -> str:
    p = r["params"]
    real = p.get("vectors")  # results written before --vectors existed lack the key
    out = ["", f"Vectors: {p['dim']}-d unit float32, "
           + (f"real embeddings from {real} (base and queries: disjoint random rows)" if real else
              "clustered synthetic shaped like me5-small passage vectors"
              + (f" (centres from {p['centres']})" if p["centres"] else ""))
           + f"; {p['queries']} held-out queries, top-{K}, one query at a time, after {WARMUP} warm-up queries; "
           f"recall@{K} against exact inner-product search (with ties: a result whose exact score is within "
           f"{TIE_EPS:g} of the exact {K}th counts, as ann-benchmarks' recall does). Upserts of {p['batch']:,}, "
           + (f"a commit every {p['commit_every']:,} vectors and at the end" if p["commit_every"]
              else "one commit at the end")
           + f"; each build and each serve step in a fresh process on {p['threads']} CPU(s); hnswlib "
           f"M={p['M']}, ef_construction={p['ef_construction']} (store default ef_search {p['default_ef']}). "
           "RSS: peak of the process (MB = MiB); serve = a fresh process that opens the index and "
           "runs the unfiltered searches below; disk: allocated bytes of the index folder per vector.", ""]
    headers = ["size", "centres", "NN1 cos p10/p50/p90", "NN10 cos p50", "random pair cos p50", "data s", "exact top-10 s"]
    drows = [[f"{int(n):,}", "-" if s["centres"] is None else f"{s['centres']:,}", "/".join(f"{x:.3f}" for x in s["nn1_cos"]), fmt(s["nn10_cos"][1]),
              fmt(s["random_cos"][1]), f"{s['generate_s']:.1f}", f"{s['ground_truth_s']:.1f}"]
             for n, s in r["data"].items()]
    out += ["### Data", "", markdown_table(headers, drows), ""]
    headers = ["size", "build s", "of which commits", "vectors/s", "build RSS MB", "serve RSS MB", "open s",
               "disk B/vector", "ef", f"recall@{K}", f"with ties (ε {TIE_EPS:g})", "p50 ms", "p95 ms"]
    for backend in BACKENDS:
        mine = [x for x in r["rows"] if x["backend"] == backend]
        if not mine:
            continue
        table = []
        for x in mine:
            b, s = x["build"], x["serve"]
            head = [f"{x['n']:,}", f"{b['build_s']:.1f}", f"{b['commit_s']:.1f} ({b['commits']})",
                    f"{b['vectors_per_s']:,.0f}", _mb(b["build_rss_peak"]), _mb(s["serve_rss_peak"]),
                    fmt(s["open_s"], 2), f"{b['disk']['allocated'] / x['n']:,.0f}"]
            for i, row in enumerate(s["sweep"]):
                ef = str(row["ef"]) + (" (default)" if row["ef"] == p["default_ef"] and backend == "hnswlib" else "")
                table.append((head if i == 0 else [""] * len(head))
                             + [ef, fmt(row["recall"], 4), fmt(row.get("recall_ties"), 4), fmt(row["p50_ms"]),
                                fmt(row["p95_ms"])])
        title = {"hnswlib": "vecplug hnswlib store (HnswStore; ef per query)",
                 "qdrant": "vecplug embedded Qdrant store (QdrantStore; default = store.search, "
                           "ef = engine hnsw_ef)",
                 "raw-hnswlib": "raw hnswlib (hnswlib.Index, sized up front, save_index; reference)"}[backend]
        out += [f"### {title}", "", markdown_table(headers, table, align="r" * 8 + "lrrrr"), ""]
        extra = [f"{x['n']:,}: {x['build']['segments']} segment(s), {x['build']['indexed_vectors']:,} vectors in HNSW "
                 f"after commit" for x in mine if "segments" in x["build"]]
        if extra:
            out += ["Qdrant after the last commit: " + "; ".join(extra) + ".", ""]
    filtered = [x for x in r["rows"] if "filtered" in x["serve"]]
    if filtered:
        rows = [[x["backend"], f"{x['n']:,}", path, str(f["ef"]), fmt(f["recall"], 4), fmt(f["p50_ms"]),
                 fmt(f["p95_ms"]), _mb(f["serve_rss_peak"])] for x in filtered
                for key, path in (("filtered", "store default"), ("filtered_plain", "ACORN off"))
                if key in x["serve"] for f in [x["serve"][key]]]
        out += [f"### Language-filtered search (1 language of {len(LANGS)}; {min(p['filtered_queries'], p['queries'])} "
                "queries; "
                "a fresh process each; a filter matching more than "
                f"{EXACT_FILTER_LIMIT:,} vectors is a filtered graph walk, fewer an exact search; Qdrant's "
                "walk uses ACORN unless the store's option `acorn` is off)", "",
                markdown_table(["store", "size", "search", "ef", f"recall@{K}", "p50 ms", "p95 ms", "RSS MB"], rows), ""]
    if r["sweep"]:
        efs = p["efs"]
        rows = []
        for x in r["sweep"]:
            b, s = x["build"], x["serve"]
            cells = [f"{fmt(_at(x, ef)['recall'], 4)} / {fmt(_at(x, ef)['p50_ms'])}" for ef in efs]
            rows.append([str(x["M"]), str(x["ef_construction"]), f"{b['build_s']:.1f}", _mb(s["serve_rss_peak"]),
                         f"{b['disk']['allocated'] / x['n']:,.0f}", *cells])
        n = r["sweep"][0]["n"]
        out += [f"### hnswlib parameters (raw hnswlib, {n:,} vectors): recall@{K} / p50 ms per search-time ef", "",
                markdown_table(["M", "ef_construction", "build s", "serve RSS MB", "disk B/vector",
                                *[f"ef={ef}" for ef in efs]], rows), ""]
        best = [(s["p50_ms"], x["M"], x["ef_construction"], s["ef"], s["recall"])
                for x in r["sweep"] for s in x["serve"]["sweep"] if s["recall"] >= p["target_recall"]]
        if best:
            t = min(best)
            out += [f"Fastest setting with recall@{K} >= {p['target_recall']}: M={t[1]}, ef_construction={t[2]}, "
                    f"ef={t[3]} (recall {t[4]:.4f}, p50 {t[0]:.3f} ms).", ""]
        else:
            out += [f"No setting reached recall@{K} >= {p['target_recall']}.", ""]
    if r["growth"]:
        out += ["### How cost grows", ""]
        for g in r["growth"]:
            rec = g["recall"]
            lat = g["p50_ms"]
            out.append(
                f"- {g['backend']}, {g['from']:,} -> {g['to']:,} vectors (x{g['size_ratio']:.0f}): build time "
                f"x{g['build_s_ratio']:.1f} ({g['vectors_per_s'][0]:,.0f} -> {g['vectors_per_s'][1]:,.0f} vectors/s), "
                f"serve RSS x{g['serve_rss_ratio']:.1f}, disk {g['disk_per_vector'][0]:,.0f} -> "
                f"{g['disk_per_vector'][1]:,.0f} B/vector; at ef={g['ef']}: p50 {fmt(lat[0])} -> {fmt(lat[1])} ms, "
                f"recall@{K} {fmt(rec[0], 4)} -> {fmt(rec[1], 4)}.")
        out.append("")
    if r["target"]:
        out += [f"### Target: recall@{K} >= {p['target_recall']} under 1 ms per query, serving in under 2 GB", ""]
        for t in r["target"]:
            name = f"recall@{K}" if t.get("measure", "recall") == "recall" else f"recall@{K} with ties"
            if t["ef"] is None:
                out.append(f"- {t['backend']} at {t['n']:,}: no ef measured reaches {name} {p['target_recall']}.")
                continue
            met = t["p50_ms"] < 1.0 and t["serve_rss"] < 2 * 2 ** 30
            out.append(f"- {t['backend']} at {t['n']:,}: ef={t['ef']} gives {name} {t['recall']:.4f} at p50 "
                       f"{t['p50_ms']:.3f} ms, serve RSS {_mb(t['serve_rss'])} MB: "
                       + ("met" if met else "not met") + ".")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker(argv[1], argv[2])
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
