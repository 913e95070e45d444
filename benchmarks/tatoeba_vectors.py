"""Real passage vectors for the ANN benchmark: every distinct Tatoeba sentence (or the passages
of a JSONL corpus), encoded as documents.

The sentences are both sides of every pair in ``../shared/data/tatoeba`` (112 languages and
their English sources), stripped, deduplicated and sorted, so the output depends only on the
data and the model. They are encoded as ``vecplug index`` encodes documents (the document
encoder, its ``passage: `` prefix and length limit) and written as one float32 ``.npy`` of
unit rows, plus ``<out>.txt`` with the sentences in the same order. Work is saved in parts of
:data:`PART` sentences in ``<out>.parts/``: an interrupted run resumes from the last part, and
a finished one (``<out>.txt`` holding the same texts) is not redone.

    .venv/bin/python benchmarks/tatoeba_vectors.py --out /tmp/benchwork/tatoeba-me5-small.npy
    .venv/bin/python benchmarks/ann_scale.py --vectors /tmp/benchwork/tatoeba-me5-small.npy ...

With ``--corpus FILE.jsonl`` the texts are that file's ``text`` fields in its order instead
(``benchmarks/debian_corpus.py`` writes a million Debian sentences in 32 languages).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vecplug.fsutil import atomic_write_bytes

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "tatoeba"
PART = 8192


def sentences(folder: Path) -> list[str]:
    """The distinct non-empty sentences of a Tatoeba folder (both sides), sorted."""
    from vecplug.indexer.train_data import tatoeba_files

    found: set[str] = set()
    for _lang, other, eng in tatoeba_files(folder):
        for path in (other, eng):
            found.update(s for s in (line.strip() for line in
                                     path.read_text(encoding="utf-8").splitlines()) if s)
    return sorted(found)


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")  # np.save adds .npy to other names
    np.save(tmp, array)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tatoeba folder (default: %(default)s)")
    p.add_argument("--corpus", type=Path, help="a JSONL corpus whose \"text\" fields to encode, in order")
    p.add_argument("--model", default="me5-small", help="document encoder (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="the .npy to write")
    p.add_argument("--limit", type=int, help="only the first N sentences (a quick check)")
    args = p.parse_args(argv)

    import vecplug

    if args.corpus is not None:
        with args.corpus.open(encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f][:args.limit]
    else:
        texts = sentences(args.data)[:args.limit]
    txt = args.out.with_name(args.out.name + ".txt")
    wanted = "".join(t.replace("\n", " ") + "\n" for t in texts)
    if args.out.is_file() and txt.is_file() and txt.read_text(encoding="utf-8") == wanted:
        # written whole by an earlier run for the same texts (the texts file last): nothing to do
        print(f"{args.out}: already encoded ({len(texts):,} texts)", file=sys.stderr)
        return 0
    parts = args.out.with_name(args.out.name + ".parts")
    parts.mkdir(parents=True, exist_ok=True)
    encoder = vecplug.DocumentEncoder(args.model)
    t0, done = time.perf_counter(), 0
    for i, a in enumerate(range(0, len(texts), PART)):
        part = parts / f"{i:05d}.npy"
        if part.is_file():  # finished by an earlier run
            continue
        _save(part, encoder.encode(texts[a:a + PART]).astype(np.float32))
        done += min(PART, len(texts) - a)
        rate = done / (time.perf_counter() - t0)
        print(f"{min(a + PART, len(texts)):,}/{len(texts):,} sentences ({rate:.0f}/s)", file=sys.stderr, flush=True)
    vectors = np.concatenate([np.load(parts / f"{i:05d}.npy", allow_pickle=False)
                              for i in range((len(texts) + PART - 1) // PART)])
    assert len(vectors) == len(texts)
    txt.unlink(missing_ok=True)  # the texts file is written last: it says the .npy is whole
    _save(args.out, vectors)
    atomic_write_bytes(txt, wanted.encode("utf-8"))
    shutil.rmtree(parts)
    print(f"{args.out}: {vectors.shape[0]:,} x {vectors.shape[1]} ({args.model})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
