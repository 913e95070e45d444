"""Token lengths of XQuAD-R texts under the model's tokenizer, to justify the default max lengths.

Questions are tokenized as the query encoder sees them (``query: `` + text), sentences and
whole paragraphs as the document encoder sees them (``passage: `` + text), special tokens
included: that is the length ``max_length`` truncates (``TextEncoder.tokenize``). Reported per
language and overall: percentiles 50/90/99/99.9 and the maximum (each percentile is an
observed length: the smallest with at least that share of texts at or below it), and the
share of texts that fit in 32/64/128/256 tokens. Defaults under test: query 64, document 256.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # no-op when run as a script

from bench_common import (  # noqa: E402
    header_markdown, machine_info, markdown_table, pct, percentile, run_main)
from xquad_data import DEFAULT_DATA_DIR, load_xquad_r, parse_langs  # noqa: E402

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
LIMITS = (32, 64, 128, 256)
#: kind -> (prefix slot, default max length it is cut at)
KINDS = {"questions": ("query", 64), "sentences": ("document", 256), "paragraphs": ("document", 256)}


def distribution(lengths: Sequence[int], limits: Sequence[int] = LIMITS) -> dict[str, Any]:
    """Percentiles, maximum and the share within each limit."""
    arr = np.asarray(lengths, dtype=np.int64)
    return {"count": int(arr.size), "mean": float(arr.mean()),
            "percentiles": {str(p): percentile(arr, p) for p in PERCENTILES},
            "max": int(arr.max()),
            "fits": {str(n): float((arr <= n).mean()) for n in limits}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                   help="XQuAD-R folder (default: %(default)s)")
    p.add_argument("--langs", nargs="+", help="languages, e.g. 'en de' or 'en,de' (default: all files)")
    p.add_argument("--model", default="me5-small", help="model whose tokenizer to use (default: %(default)s)")
    p.add_argument("--json", type=Path, help="save the results as JSON here")
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    import transformers
    from transformers import AutoTokenizer

    from vecplug.indexer.models import resolve_model

    info = machine_info()
    print(header_markdown("Token lengths of XQuAD-R", info), flush=True)
    try:
        data = load_xquad_r(args.data, args.langs)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None

    model = resolve_model(args.model)
    transformers.logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(str(model.path))
    prefixes = {"query": model.query_prefix, "document": model.document_prefix}

    def lengths(texts: list[str], prefix: str) -> list[int]:
        # no truncation: the point is to see what a cut would lose
        return [len(ids) for ids in tokenizer([prefix + t for t in texts], add_special_tokens=True,
                                               truncation=False)["input_ids"]]

    results: dict[str, Any] = {}
    for kind, (slot, default_max) in KINDS.items():
        per_lang: dict[str, list[int]] = {}
        for lang in data.langs:
            ld = data.by_lang[lang]
            texts = {"questions": [q.text for q in ld.questions],
                     "sentences": [s.text for s in ld.sentences],
                     "paragraphs": ld.contexts}[kind]
            per_lang[lang] = lengths(texts, prefixes[slot])
        everything = [n for v in per_lang.values() for n in v]
        results[kind] = {"prefix": prefixes[slot], "default_max_length": default_max,
                         "by_lang": {lang: distribution(v) for lang, v in per_lang.items()},
                         "overall": distribution(everything),
                         "over_default": sum(n > default_max for n in everything)}
    return {"benchmark": "lengths", "machine": info,
            "settings": {"data": str(args.data), "langs": data.langs, "model": args.model,
                         "tokenizer": str(model.path), "special_tokens_included": True},
            "results": results}


def render(r: dict[str, Any]) -> str:
    langs = r["settings"]["langs"]
    out = [f"- tokenizer of {r['settings']['model']} ({r['settings']['tokenizer']}); lengths include the "
           "prefix and the special tokens <s> </s>; percentiles are observed lengths (inverted CDF)"]
    for kind, res in r["results"].items():
        rows = []
        for name in [*langs, "**all**"]:
            d = res["overall"] if name == "**all**" else res["by_lang"][name]
            rows.append([name, f"{d['count']:,}", f"{d['mean']:.1f}",
                         *(f"{d['percentiles'][str(p)]:.0f}" for p in PERCENTILES), d["max"],
                         *(pct(d["fits"][str(n)]) for n in LIMITS)])
        out += ["", f"### {kind.capitalize()} (prefix {res['prefix']!r}; default cut "
                    f"{res['default_max_length']}: {res['over_default']} of "
                    f"{res['overall']['count']:,} longer)", "",
                markdown_table(["lang", "texts", "mean", *(f"p{p:g}" for p in PERCENTILES), "max",
                                *(f"<= {n}" for n in LIMITS)], rows)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
