"""Model memory: peak and resident memory of a process that loads vecplug's encoders (issue 6).

Each setting runs in a fresh Python process, which loads the encoders the way ``vecplug``
does (``Encoder.from_specs``), encodes one query and, where the setting uses it, one batch of
documents, then reports its peak RSS (``getrusage``) and its RSS at the end (``/proc``):

* ``baseline``: Python with torch and transformers imported, no model;
* ``tokenizer``: the baseline and the document encoder's tokenizer, nothing else;
* ``teacher``: me5-small for queries and documents (what ``vecplug index`` holds);
* ``student``: the shipped student for a query, the way ``vecplug search`` runs (with its
  teacher's vocabulary table and tokenizer; not the teacher's layers);
* ``student + teacher``: both, as in a search with the teacher reranker or a process that
  indexes and searches; the two share one vocabulary table and one tokenizer.

Each under torch and under ONNX Runtime (``model.runtime: onnx``, graphs cached beforehand by an
untimed run; the row ``first use`` is a process that also exports and quantises them, in a
scratch cache). me5-small's vocabulary table alone is 250,037 x 384 float32 = 366 MiB.

    .venv/bin/python benchmarks/model_memory.py --json benchmarks/results/model_memory.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import header_markdown, machine_info, markdown_table, run_main  # noqa: E402

QUERY = "Wie hoch ist der Mount Everest?"
DOCUMENTS = ["Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
             "El Everest es la montaña más alta de la Tierra sobre el nivel del mar."] * 8
#: setting -> (loads a model, queries by the student, encodes documents too)
SETTINGS = {
    "baseline": (False, False, False),
    "tokenizer": (False, False, False),
    "teacher": (True, False, True),
    "student": (True, True, False),
    "student + teacher": (True, True, True),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="me5-small", help="document encoder (the teacher)")
    p.add_argument("--student", default="me5-small-student-k6", help="query encoder (a student)")
    p.add_argument("--runtimes", nargs="+", default=["torch", "onnx"])
    p.add_argument("--json", type=Path)
    p.add_argument("--child", nargs=2, metavar=("SETTING", "RUNTIME"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _rss_mib() -> dict[str, float]:
    """Peak and current resident memory of this process in MiB; the current split into
    anonymous memory (the process's own) and file pages (memory-mapped files such as
    safetensors weights: shared with the page cache, reclaimable)."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    kib = {key: int(status[key].split()[0]) for key in ("VmRSS", "RssAnon", "RssFile")}
    return {"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
            "rss_mib": kib["VmRSS"] / 1024, "anon_mib": kib["RssAnon"] / 1024,
            "file_mib": kib["RssFile"] / 1024}


def child(args: argparse.Namespace) -> None:
    """Load and use the setting's encoders, then print the memory figures as JSON."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from vecplug.indexer.encoder import Encoder

    setting, runtime = args.child
    loads, student, documents_too = SETTINGS[setting]
    if setting == "tokenizer":
        from vecplug.indexer.encoder import shared_tokenizer
        from vecplug.indexer.models import resolve_model

        info = resolve_model(args.model)
        held = shared_tokenizer(info.tokenizer_path, info.checksum)
        held([QUERY], truncation=True, max_length=64)
    if loads:
        enc = Encoder.from_specs(args.model, args.student if student else None, runtime=runtime)
        enc.encode_queries([QUERY], progress=False)
        if documents_too:
            enc.encode_documents(DOCUMENTS, progress=False)
    print(json.dumps(_rss_mib()))


def measure(args: argparse.Namespace, setting: str, runtime: str,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", setting, runtime, "--model", args.model,
                          "--student", args.student], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vecplug.indexer.models import vecplug_home

    info = machine_info()
    rows = []
    for runtime in args.runtimes:
        for setting in SETTINGS:
            if setting in ("baseline", "tokenizer") and runtime != args.runtimes[0]:
                continue
            if runtime == "onnx" and SETTINGS[setting][0]:
                with tempfile.TemporaryDirectory() as scratch:
                    # first use: export and quantise into a scratch cache (the models are shared)
                    (Path(scratch) / "models").symlink_to(vecplug_home() / "models")
                    first = measure(args, setting, runtime, {**os.environ, "VECPLUG_HOME": scratch})
                measure(args, setting, runtime)  # the real cache holds the graphs from here on
                rows.append({"setting": setting, "runtime": runtime, "first_use": True, **first})
            rows.append({"setting": setting, "runtime": runtime, "first_use": False,
                         **measure(args, setting, runtime)})
    return {"machine": info, "model": args.model, "student": args.student, "rows": rows}


def render(results: dict[str, Any]) -> str:
    table = [(r["setting"], r["runtime"] if SETTINGS[r["setting"]][0] else "-",
              "first use (exports them)" if r["first_use"] else "cached" if r["runtime"] == "onnx" else "-",
              f"{r['peak_mib']:,.0f}", f"{r['rss_mib']:,.0f}", f"{r['anon_mib']:,.0f}", f"{r['file_mib']:,.0f}")
             for r in results["rows"]]
    return "\n".join([
        header_markdown("Model memory: peak and resident memory of a process", results["machine"]),
        "",
        f"Document encoder {results['model']}, student {results['student']}. One fresh process per "
        "row: load the encoders, encode one query (and 16 documents where the teacher is in use). "
        "MiB; the RSS at the end split into anonymous memory (the process's own) and file pages "
        "(memory-mapped weights, shared with the page cache and reclaimable).",
        "",
        markdown_table(["setting", "runtime", "ONNX graphs", "peak RSS", "RSS at the end", "anonymous",
                        "file pages"], table),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
