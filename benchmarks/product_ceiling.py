"""What an exact scan of a million vectors can cost at the least here: the matrix product alone.

Issue 6 asks for recall@10 >= 0.99 "under 1 ms per query" at a million 384-d vectors. Read as
throughput, an exact scan answers a batch of queries with one matrix product
(``exact_batch.py``), and no scan can cost less than that product: this script measures it, with
nothing else (no floors, no candidates, no rescoring), for each kind of product this CPU and
torch offer:

- ``float32``: ``queries @ rows.T``;
- ``bfloat16``: the same with both sides bfloat16 (native on Intel AMX and AVX-512 BF16, what
  the flat store's scan runs; emulated, and slow, elsewhere);
- ``int8``: ``torch._int_mm`` of int8 queries by int8 rows (int32 sums; AVX-512 VNNI or AMX
  int8 through oneDNN). No vecplug scan runs int8: the question is whether one could be under
  1 ms here (it would need a slack for the rounding of both sides to 8 bits, ~50x bfloat16's).

The rows are a million (``--rows``) random ``--dim``-d rows of the kind's type, in memory as a
scan keeps them (float32 1.5 GB, bfloat16 768 MB, int8 384 MB at 384-d: the values do not change
a product's speed), multiplied ``--chunk`` columns a step (the output of a step stays in cache:
1,000 x 2,048 int32 is 8 MB) by a batch of ``--batches`` queries; each (kind, threads, batch,
chunk) timed ``--repeats`` times in turn with the others, so that the machine's drift spreads
over all of them; the median reported, as milliseconds per query (a pass over every row divided
by the batch) and GOP/s (two operations a multiply-add).

Usage::

    python benchmarks/product_ceiling.py [--rows 1000000] [--dim 384] [--batches 100 1000]
        [--chunks 1024 2048 4096] [--threads 1 2] [--repeats 5] [--kinds float32 bfloat16 int8]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import header_markdown, keeps_torch_threads, machine_info, markdown_table, run_main  # noqa: E402

KINDS = ("float32", "bfloat16", "int8")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="rows a pass multiplies")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batches", type=int, nargs="+", default=[100, 1000], help="queries multiplied together")
    p.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096], help="columns a step")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads")
    p.add_argument("--repeats", type=int, default=5, help="passes timed per setting (the median kept)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def operands(kind: str, rows: int, dim: int, batch: int, seed: int = 0) -> tuple[Any, Any]:
    """(queries ``(batch, dim)``, rows ``(rows, dim)``) of ``kind``, random."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if kind == "int8":
        return (torch.randint(-127, 128, (batch, dim), dtype=torch.int8, generator=g),
                torch.randint(-127, 128, (rows, dim), dtype=torch.int8, generator=g))
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    q = torch.randn(batch, dim, generator=g).to(dtype)
    x = torch.empty((rows, dim), dtype=dtype)
    for a in range(0, rows, 65_536):  # (no float32 copy of it all for bfloat16)
        x[a:a + 65_536] = torch.randn(min(65_536, rows - a), dim, generator=g).to(dtype)
    return q, x


def product(kind: str) -> Callable[[Any, Any], Any]:
    """One step's product of ``kind``: queries by a block of rows, transposed."""
    import torch

    if kind == "int8":
        return lambda q, block: torch._int_mm(q, block.T)
    return lambda q, block: q @ block.T


def one_pass(step: Callable[[Any, Any], Any], q: Any, x: Any, chunk: int) -> float:
    """Seconds for one pass of ``step`` over every row of ``x``, ``chunk`` rows a step."""
    t0 = time.perf_counter()
    for a in range(0, len(x), chunk):
        step(q, x[a:a + chunk])
    return time.perf_counter() - t0


def available(kind: str, dim: int) -> str | None:
    """Why this torch cannot run ``kind`` here (None: it can; an emulated kind runs, and its
    figure says what it costs)."""
    try:
        q, x = operands(kind, 64, dim, 32)
        product(kind)(q, x)
    except RuntimeError as e:  # e.g. no _int_mm in this build
        return str(e).splitlines()[0]
    return None


def cpu_flags() -> list[str]:
    """The CPU's flags that decide which products run natively (Linux's /proc/cpuinfo)."""
    wanted = ("avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in wanted if f in flags]


@keeps_torch_threads
def run(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    import torch

    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for kind in args.kinds:
        why = available(kind, args.dim)
        if why is not None:
            skipped[kind] = why
            continue
        step = product(kind)
        for batch in args.batches:
            q, x = operands(kind, args.rows, args.dim, batch)
            settings = [(threads, chunk) for threads in args.threads for chunk in args.chunks]
            times: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
            for threads, chunk in settings:  # warm-up: each setting's kernels and pages once
                torch.set_num_threads(threads)
                one_pass(step, q, x[:chunk * 8], chunk)
            for _ in range(args.repeats):
                for threads, chunk in settings:  # in turn: drift spreads over every setting
                    torch.set_num_threads(threads)
                    times[(threads, chunk)].append(one_pass(step, q, x, chunk))
            for (threads, chunk), t in times.items():
                seconds = statistics.median(t)
                runs.append({"kind": kind, "threads": threads, "batch": batch, "chunk": chunk,
                             "pass_s": seconds, "passes_s": t,
                             "per_query_ms": seconds / batch * 1e3,
                             "gops": 2 * batch * args.rows * args.dim / seconds / 1e9})
            del q, x
            gc.collect()
    return {"benchmark": "product_ceiling", "machine": machine_info(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_flags": cpu_flags(),
            "rows": args.rows, "dim": args.dim,
            "repeats": args.repeats, "runs": runs, "skipped": skipped}


def best(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each (kind, threads, batch)'s fastest chunk."""
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for x in r["runs"]:
        key = (x["kind"], x["threads"], x["batch"])
        if key not in out or x["pass_s"] < out[key]["pass_s"]:
            out[key] = x
    return list(out.values())


def render(r: dict[str, Any]) -> str:
    out = [header_markdown("The matrix product alone: the least an exact scan can cost", r["machine"]), "",
           f"torch's CPU capability: {r['cpu_capability']}; the CPU's flags for products: "
           f"{', '.join(r['cpu_flags']) or 'none of avx512f, VNNI, BF16, AMX'}. "
           f"{r['rows']:,} rows of {r['dim']}-d against a batch "
           f"of queries, a step of columns at a time; the median of {r['repeats']} passes, timed in turn "
           "with the other settings. Milliseconds per query: one pass over every row divided by the batch.", "",
           "**Each kind at its fastest step**", "",
           markdown_table(["kind", "threads", "batch", "best step (columns)", "ms per query", "GOP/s"],
                          [[x["kind"], str(x["threads"]), f"{x['batch']:,}", f"{x['chunk']:,}",
                            f"{x['per_query_ms']:.3f}", f"{x['gops']:.0f}"] for x in best(r)], "lrrrrr"), "",
           "**Every step size**", "",
           markdown_table(["kind", "threads", "batch", "step (columns)", "ms per query", "GOP/s", "passes (s)"],
                          [[x["kind"], str(x["threads"]), f"{x['batch']:,}", f"{x['chunk']:,}",
                            f"{x['per_query_ms']:.3f}", f"{x['gops']:.0f}",
                            " ".join(f"{t:.3f}" for t in x["passes_s"])] for x in r["runs"]], "lrrrrrl")]
    for kind, why in r["skipped"].items():
        out += ["", f"{kind}: not run ({why})"]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
