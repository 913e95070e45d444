"""Write ``indexer/calibration.txt``: the sentences the ONNX int8 recipe calibrates on.

From the LASER Tatoeba test set (``../shared/data/tatoeba``, 112 languages paired with English;
Tatoeba sentences are CC BY 2.0 FR, https://tatoeba.org/eng/terms_of_use): the first four
lines of each language's file and the fifth of its English twin, skipping lines with a word of
``SKIP``. Not XQuAD-R, on which the recipe is scored.

    .venv/bin/python benchmarks/make_calibration.py
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = ("fok",)  # kept out of a file every install ships
HEADER = """\
# Calibration sentences for vecplug's ONNX int8 recipe (indexer/onnx_runtime.py), written by
# benchmarks/make_calibration.py. From the Tatoeba corpus (https://tatoeba.org, CC BY 2.0 FR,
# https://tatoeba.org/eng/terms_of_use) as selected for the LASER test set (Artetxe & Schwenk
# 2019): the first lines of each of its 112 languages, and English.
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tatoeba", type=Path, default=ROOT.parent / "shared" / "data" / "tatoeba")
    ap.add_argument("--out", type=Path, default=ROOT / "indexer" / "calibration.txt")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from vecplug.indexer.train_data import tatoeba_files

    def lines(path: Path) -> list[str]:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and not any(word in line.lower().split() for word in SKIP)]

    out, english = [], []
    for _, other, eng in tatoeba_files(args.tatoeba):
        out += lines(other)[:4]
        english += lines(eng)[4:5]
    args.out.write_text(HEADER + "\n".join(out + english) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(out) + len(english)} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
