"""The indexer and the prober that tests/test_faults.py runs in child processes (to kill them,
limit their file sizes, or survive their crashes). Uses the fake encoder of conftest.

    python _fault_worker.py sync  STORE CORPUS INDEX [--fsize BYTES] [--nobody]
    python _fault_worker.py hold  STORE INDEX            # open for writing, wait to be killed
    python _fault_worker.py probe STORE QUERIES CASE...  # open each index, print what it answers
    python _fault_worker.py read  STORE INDEX SECONDS    # search in a loop while a writer works

Exit status 3: vecplug refused with one of its own errors (printed on stderr).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import FakeEncoder  # noqa: E402

DIM = 16


def offsets(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def detect(text: str) -> str:
    return ("de", "en", "fr")[len(text) % 3]


class SlowEncoder(FakeEncoder):
    """Takes a little time per batch, so that kills land all over a run."""

    def encode_documents(self, texts: list[str], progress: bool | None = None) -> Any:
        time.sleep(0.004)
        return super().encode_documents(texts, progress)


def sync(store_name: str, corpus: Path, index: Path, encoder: Any = None, commit_every: int = 5) -> Any:
    """Bring the index at ``index`` up to date with the folder ``corpus`` (as ``vecplug index`` does)."""
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores import Record, get_store_class
    from vecplug.indexer import pipeline
    from vecplug.indexer.corpus import CorpusOptions, CorpusReader

    cls = get_store_class(store_name)
    if cls.exists(str(index), {}):
        store = cls.open(str(index), {}, writable=True)
    else:
        store = cls.create(str(index), DIM, {"document_encoder": "fake"}, {})
    try:
        stats = LanguageStats.from_manifest(store.manifest) or LanguageStats(DIM)
        reader = CorpusReader(corpus, offsets, CorpusOptions(chunk_tokens=12, chunk_overlap=2))
        return pipeline.run(reader.documents(), encoder or FakeEncoder(DIM), store,
                            Record.from_document, detect, batch_size=5, commit_every=commit_every,
                            progress=False, stats=stats, prune=True)
    finally:
        store.close()


def state(store_name: str, index: Path) -> dict[str, Any]:
    """Everything an index holds: {id: (text, lang, source, vector)}, the manifest and the count."""
    import numpy as np

    from vecplug.adapters.stores import get_store_class

    store = get_store_class(store_name).open(str(index), {})
    try:
        ids = list(store.ids())
        records = store.get(ids)
        vectors = store.vectors(ids) if ids else np.zeros((0, DIM), np.float32)
        docs = {r.id: (r.text, r.lang, r.source, v) for r, v in zip(records, vectors)}
        return {"docs": docs, "ids": ids, "count": store.count(), "manifest": store.manifest}
    finally:
        store.close()


def probe(store_name: str, queries: list[list[float]], index: Path) -> dict[str, Any]:
    """What an index answers: every record, the count, and the top 5 for each query."""
    import numpy as np

    from vecplug.adapters.stores import get_store_class

    store = get_store_class(store_name).open(str(index), {})
    try:
        ids = sorted(store.ids())
        out: dict[str, Any] = {"count": store.count(), "ids": ids,
                               "records": [[r.id, r.text, r.lang, r.source, r.payload] for r in store.get(ids)],
                               "vectors": np.round(store.vectors(ids), 5).tolist() if ids else []}
        out["hits"] = [[[h.record.id, round(h.score, 4)] for h in store.search(np.asarray(q, np.float32), 5)]
                       for q in queries]
        return out
    finally:
        store.close()


def main(argv: list[str]) -> int:
    from vecplug.errors import CorruptIndexError, VecplugError

    cmd = argv[0]
    if cmd == "sync":
        store_name, corpus, index = argv[1], Path(argv[2]), Path(argv[3])
        if "--fsize" in argv:  # a full disk, as near as a test can get without root
            import resource
            import signal

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            limit = int(argv[argv.index("--fsize") + 1])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        # everything loaded before "ready": the parent times its kills from there (and, as
        # nobody, the files may no longer be readable)
        import hnswlib  # noqa: F401

        import vecplug.adapters.bias  # noqa: F401
        import vecplug.adapters.stores.hnsw  # noqa: F401
        import vecplug.adapters.stores.qdrant  # noqa: F401
        import vecplug.indexer.corpus  # noqa: F401
        import vecplug.indexer.pipeline  # noqa: F401
        if store_name == "qdrant":
            import qdrant_edge  # noqa: F401
        if "--nobody" in argv:  # as root, permissions do not bind: act as the user nobody
            os.setegid(65534)
            os.seteuid(65534)
        print("ready", flush=True)
        try:
            report = sync(store_name, corpus, index, encoder=SlowEncoder(DIM))
        except VecplugError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 3
        print(json.dumps({"documents": report.documents, "removed": report.removed}), flush=True)
        return 0
    if cmd == "hold":
        from vecplug.adapters.stores import get_store_class

        store = get_store_class(argv[1]).open(argv[2], {}, writable=True)
        print("ready", flush=True)
        time.sleep(600)
        store.close()
        return 0
    if cmd == "probe":
        store_name, queries = argv[1], json.loads(Path(argv[2]).read_text())
        for case in argv[3:]:
            print(f"case {case}", flush=True)
            try:
                print(json.dumps({"ok": probe(store_name, queries, Path(case))}), flush=True)
            except CorruptIndexError as exc:
                print(json.dumps({"corrupt": str(exc)}), flush=True)
            except Exception as exc:  # noqa: BLE001 - the test reports what it was
                print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 0
    if cmd == "read":
        import numpy as np

        from vecplug.adapters.stores import get_store_class

        store = get_store_class(argv[1]).open(argv[2], {})
        stop = time.monotonic() + float(argv[3])
        ok, errors, counts = 0, [], set()
        print("ready", flush=True)
        q = np.ones(DIM, np.float32) / np.sqrt(DIM)
        while time.monotonic() < stop:
            try:
                hits = store.search(q, 5)
                assert hits and len({h.record.id for h in hits}) == len(hits)
                counts.add(store.count())
                ok += 1
                # the writer may remove a hit in between: a lookup then misses, never fails otherwise
                store.get([h.record.id for h in hits])
                store.vectors([h.record.id for h in hits])
            except KeyError:
                pass
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(exc).__name__}: {exc}")
        store.close()
        print(json.dumps({"ok": ok, "errors": errors[:5], "n_errors": len(errors),
                          "counts": sorted(counts)}), flush=True)
        return 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
