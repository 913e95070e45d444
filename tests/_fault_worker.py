"""The indexer and the prober that tests/test_faults.py runs in child processes (to kill them,
limit their file sizes, or survive their crashes). Uses the fake encoder of conftest.

    python _fault_worker.py sync  STORE CORPUS INDEX [--fsize BYTES] [--nobody]
    python _fault_worker.py hold  STORE INDEX            # open for writing, wait to be killed
    python _fault_worker.py probe STORE QUERIES CASE...  # open each index, print what it answers
    python _fault_worker.py read  STORE INDEX SECONDS [DONE]  # search in a loop while a writer
                                                         # works (and until the commit in DONE)
    python _fault_worker.py fill  INDEX BATCH [--unchecked]  # qdrant: commit BATCH documents
                                                         # at a time until the disk is full
    python _fault_worker.py check INDEX BATCH            # qdrant: is it exactly what fill committed?

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
FILL_DIM = 384  # the full-disk test: vectors of a real model's size, so that a disk fills fast


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


def fill_batch(commit: int, batch: int) -> tuple[list[Any], Any]:
    """The records and vectors of commit number ``commit`` of ``fill`` (deterministic)."""
    import numpy as np

    from vecplug.adapters.stores import Record

    vecs = np.random.default_rng(commit).standard_normal((batch, FILL_DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    recs = [Record(f"c{commit}-{i}", f"commit {commit} document {i} " + "x" * 100, "fill", i, "en")
            for i in range(batch)]
    return recs, vecs


def fill(index: Path, batch: int) -> None:
    """Open (or create) an embedded Qdrant index and commit ``batch`` documents at a time, each
    commit numbered in the manifest, until a commit fails."""
    from vecplug.adapters.stores.qdrant import QdrantStore

    if QdrantStore.exists(str(index), {}):
        store = QdrantStore.open(str(index), {}, writable=True)
    else:
        store = QdrantStore.create(str(index), FILL_DIM, {"commits": -1}, {})
    try:
        commit = int(store.manifest["commits"]) + 1
        while True:
            store.upsert(*fill_batch(commit, batch))
            store.commit({"commits": commit})
            print(json.dumps({"commit": commit}), flush=True)
            commit += 1
    finally:
        store.close()


def check(index: Path, batch: int) -> dict[str, Any]:
    """Whether the index holds exactly the documents of fill's commits 0..N, N its manifest's,
    and what ``verify`` finds."""
    import numpy as np

    from vecplug.adapters.stores.qdrant import QdrantStore

    store = QdrantStore.open(str(index), {})
    try:
        last = int(store.manifest["commits"])
        want = [fill_batch(c, batch) for c in range(last + 1)]
        ids = sorted(store.ids())
        why = None
        if ids != sorted(r.id for recs, _ in want for r in recs) or store.count() != len(ids):
            why = f"{len(ids)} documents, {store.count()} counted, {(last + 1) * batch} expected"
        else:
            for recs, vecs in want:
                if store.get([r.id for r in recs]) != recs:
                    why = f"the records of commit {recs[0].id} differ"
                elif not np.allclose(store.vectors([r.id for r in recs]), vecs, atol=1e-5):
                    why = f"the vectors of commit {recs[0].id} differ"
        return {"commits": last, "count": len(ids), "why": why, "problems": store.verify()}
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
        done = Path(argv[4]) if len(argv) > 4 else None  # the writer's last commit, when it is done
        last: list[Any] = [None]  # the commit of the last answer
        ok, errors, counts = 0, [], set()
        seen: dict[str, int] = {}  # (commit, count, top hits) as answered -> times
        print("ready", flush=True)
        q = np.ones(DIM, np.float32) / np.sqrt(DIM)

        def more() -> bool:
            """Until SECONDS have passed and, with DONE, the writer's last commit was seen."""
            if time.monotonic() < stop:
                return True
            if done is None or time.monotonic() > stop + 120:
                return False
            try:
                return last[0] != int(done.read_text())
            except (OSError, ValueError):
                return True  # the writer is not done yet

        while more():
            time.sleep(0.001)  # other processes get the CPU too
            try:
                hits = store.search(q, 5)
                commit = store.manifest.get("commits")
                assert hits and len({h.record.id for h in hits}) == len(hits)
                n = store.count()
                counts.add(n)
                # the count belongs to the commit of the hits unless the reader moved between
                same = store.manifest.get("commits") == commit
                key = json.dumps([commit, n if same else None,
                                  [[h.record.id, round(h.score, 5)] for h in hits]])
                seen[key] = seen.get(key, 0) + 1
                last[0] = commit
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
                          "counts": sorted(counts), "seen": [json.loads(k) for k in seen]}),
              flush=True)
        return 0
    if cmd in ("fill", "check"):
        index, batch = Path(argv[1]), int(argv[2])
        if "--unchecked" in argv:  # the engine meets the full disk itself (it may SIGBUS)
            from vecplug.adapters.stores import qdrant_edge as edge

            edge._commit_need = lambda *args: 0
        try:
            if cmd == "fill":
                fill(index, batch)
            else:
                print(json.dumps(check(index, batch)), flush=True)
        except VecplugError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 3
        return 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
