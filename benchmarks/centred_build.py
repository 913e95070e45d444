"""What a graph of language-centred vectors costs to build, against a plain graph.

An hnswlib index built with ``index.hnsw_centred`` (``adapters/stores/centring.py``) centres
each document by its language's anchor before it enters the graph, and moves a language's
documents in the graph each time that language's anchor is set again (its count grown 4
times, until 1,024 documents vouch for it). ``modes_scale.py --centred`` measures its
searches; this measures its build: the same documents (``modes_scale.py``'s rows of
``--vectors`` with the languages of ``--corpus``, in the same order, through the same
``modes_scale.build``: upserts of 10,000 and one commit), into a plain store and a centred
one, the two taking turns (``--rounds``; the first kind alternates from round to round, as
this machine's speed drifts over a run), each in a fresh folder removed afterwards.

Usage::

    python benchmarks/centred_build.py --vectors /tmp/benchwork/debian-1m-me5-small.npy \\
        --corpus /tmp/benchwork/debian-1m.jsonl --sizes 200000 1000000 [--rounds 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann_scale import folder_bytes  # noqa: E402
from bench_common import header_markdown, machine_info, markdown_table, run_main  # noqa: E402
from modes_scale import build, data_arguments, read_langs, split  # noqa: E402

KINDS = ("plain", "centred")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_arguments(p)  # modes_scale.py's rows: its queries held out, not built
    p.add_argument("--rounds", type=int, default=1, help="builds of each kind per size, taking turns")
    p.add_argument("--work", type=Path, help="where the indexes are built (default: a temporary folder)")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine_info()
    V = np.load(args.vectors, mmap_mode="r", allow_pickle=False)
    langs = read_langs(args.corpus, len(V))
    work = Path(tempfile.mkdtemp(prefix="vecplug-centred-build-", dir=args.work))
    results = []
    try:
        for n in args.sizes:
            rows, _ = split(len(V), n, args.queries, args.seed)
            builds: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
            for turn in range(args.rounds):
                for kind in (KINDS if turn % 2 == 0 else KINDS[::-1]):
                    folder = work / f"{kind}-{n}"
                    print(f"building {n:,} {kind} (round {turn + 1}) ...", file=sys.stderr, flush=True)
                    seconds = build(folder, V, langs, rows, "hnswlib", {"centred": kind == "centred"})
                    builds[kind].append({"build_s": seconds, "disk": folder_bytes(folder)["allocated"]})
                    shutil.rmtree(folder)
            results.append({"n": n, "languages": len({langs[i] for i in rows}), "builds": builds})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"benchmark": "centred_build", "machine": info, "vectors": str(args.vectors),
            "corpus": str(args.corpus), "rounds": args.rounds, "results": results}


def render(r: dict[str, Any]) -> str:
    rows = []
    for res in r["results"]:
        plain = float(np.median([b["build_s"] for b in res["builds"]["plain"]]))
        for kind in KINDS:
            runs = res["builds"][kind]
            seconds = float(np.median([b["build_s"] for b in runs]))
            rows.append([f"{res['n']:,}", str(res["languages"]), kind,
                         " / ".join(f"{b['build_s']:.1f}" for b in runs), f"{res['n'] / seconds:,.0f}",
                         f"{seconds / plain:.2f}x", f"{runs[0]['disk'] / res['n']:,.0f}"])
    return "\n".join([
        header_markdown("Building a graph of language-centred vectors", r["machine"]), "",
        f"Vectors {r['vectors']} with the languages of {r['corpus']} (`modes_scale.py`'s rows, in order); "
        f"the hnswlib store with its defaults, plain and centred (`index.hnsw_centred`) taking turns, "
        f"{r['rounds']} build(s) of each; upserts of 10,000, one commit.", "",
        markdown_table(["documents", "languages", "graph", "build s (each)", "documents/s (median)",
                        "against plain", "disk B/document"], rows, "rrlrrrr"), ""])


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
