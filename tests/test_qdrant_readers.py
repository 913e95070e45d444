"""The embedded Qdrant store beside a writer and on a full disk, in one process with small
indexes: readers' private copies (proven by digests, followed to new commits, removed when
their owner dies), the copy and turn locks, the file record on file systems whose stats do not
follow mapped writes, the free-space checks and the engine's errors for a full disk. The same
properties across processes, with kills and a real full disk: tests/test_faults.py.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")

from vecplug.adapters.stores import qdrant_edge, qdrant_files  # noqa: E402
from vecplug.adapters.stores.base import Record  # noqa: E402
from vecplug.adapters.stores.qdrant import QdrantStore  # noqa: E402
from vecplug.adapters.stores.qdrant_files import (  # noqa: E402
    MiB, FsTraits, _copy_file, _digest, _engine, _fs_traits, _fs_type, _record_files, _Snapshot)
from vecplug.errors import (CorruptIndexError, IndexLockedError, StorageError,  # noqa: E402
                            VecplugError)

DIM = 8
REPO = Path(__file__).resolve().parent.parent


def _docs(n: int, start: int = 0) -> tuple[list[Record], np.ndarray]:
    vecs = np.random.default_rng(start).normal(size=(n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return [Record(f"doc-{i}", f"text {i}", "src", i, "en") for i in range(start, start + n)], vecs


def _writer(loc: Path, n: int = 10) -> QdrantStore:
    """A writer that committed ``n`` documents (commit 1) and keeps the shard open."""
    store = QdrantStore.create(str(loc), DIM, {"commits": 0}, {})
    store.upsert(*_docs(n))
    store.commit({"commits": 1})
    return store


def _follow(reader: QdrantStore, commit: int, timeout: float = 20) -> None:
    """Read until the reader serves ``commit`` (it copies new commits in the background)."""
    deadline = time.monotonic() + timeout
    while reader.manifest["commits"] != commit:
        assert time.monotonic() < deadline, f"still at commit {reader.manifest['commits']}"
        reader.count()
        time.sleep(0.01)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _copies(base: Path) -> list[str]:
    """What readers given ``snapshot_dir: base`` keep there: in the folder vecplug makes in it."""
    return _names(base / qdrant_edge.COPIES)


def test_a_reader_beside_a_writer_reads_a_checked_copy_and_follows_it(tmp_path: Path) -> None:
    loc, base = tmp_path / "idx", tmp_path / "copies"
    writer = _writer(loc)
    reader = QdrantStore.open(str(loc), {"snapshot_dir": str(base)})  # the writer has the shard
    try:
        assert reader.count() == 10 and reader.manifest["commits"] == 1
        assert len([n for n in _copies(base) if not n.endswith(".lock")]) == 1
        writer.upsert(*_docs(5, start=10))
        writer.delete(["doc-0"])
        assert reader.count() == 10  # staged writes are not a commit
        writer.commit({"commits": 2})
        _follow(reader, 2)
        recs, vecs = _docs(5, start=10)
        assert reader.count() == 14 and reader.get(["doc-0", "doc-12"]) == [recs[2]]
        np.testing.assert_allclose(reader.vectors(["doc-12"])[0], vecs[2], atol=1e-6)
        hit = reader.search(vecs[2], 1)[0]
        assert hit.record == recs[2] and hit.score == pytest.approx(1.0, abs=1e-5)
        assert sorted(reader.ids()) == sorted(f"doc-{i}" for i in range(1, 15))
        assert len(_copies(base)) == 2  # the new copy and its lock file: the old one is gone
        assert reader.verify() == []
        with pytest.raises(VecplugError, match="read-only"):
            reader.upsert(*_docs(1, start=50))
    finally:
        reader.close()
    assert _copies(base) == []
    writer.close()


def test_a_reader_dropped_without_close_leaves_no_copy(tmp_path: Path) -> None:
    """``open_index(p).search(q)`` never closes: each such reader kept its copy and its lock
    until the process ended (40 searches, 40 copies, 40 more open files)."""
    import gc

    loc, base = tmp_path / "idx", tmp_path / "copies"
    writer = _writer(loc)
    for _ in range(3):
        assert QdrantStore.open(str(loc), {"snapshot_dir": str(base)}).count() == 10  # dropped
    gc.collect()
    assert _copies(base) == []
    writer.close()


_KILLED_WRITER = """
import os, signal, sys
import numpy as np
from vecplug.adapters.stores.base import Record
from vecplug.adapters.stores.qdrant import QdrantStore
store = QdrantStore.open(sys.argv[1], {}, writable=True)
vecs = np.eye(8, dtype=np.float32)[:2]
store.upsert([Record(f"doc-{i}", "t", "src", i, "en") for i in (10, 11)], vecs)
store.commit({"commits": 2})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_with_the_snapshot_option_a_reader_never_keeps_a_writer_out(tmp_path: Path) -> None:
    """Alone, a reader opens the shard in place and a writer that comes later is refused; with
    ``snapshot: true`` it reads a copy, and the writer gets the shard (a pending settle is done
    in place first)."""
    from vecplug.errors import IndexLockedError

    loc, base = tmp_path / "idx", tmp_path / "copies"
    _writer(loc).close()
    alone = QdrantStore.open(str(loc), {})
    with pytest.raises(IndexLockedError, match="open elsewhere"):
        QdrantStore.open(str(loc), {}, writable=True)
    alone.close()
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(loc)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert killed.returncode == -9, killed.stderr  # its commit is in, its record unsettled
    assert json.loads((loc / "manifest.json").read_text())["settled"] is False
    options = {"snapshot_dir": str(base), "snapshot": True}
    reader = QdrantStore.open(str(loc), options)
    assert reader.count() == 12 and reader._b.snap is not None  # type: ignore[union-attr]
    writer2 = QdrantStore.open(str(loc), {}, writable=True)
    writer2.upsert(*_docs(3, start=20))
    writer2.commit({"commits": 3})
    _follow(reader, 3)
    assert reader.count() == 15
    reader.close()
    writer2.close()


def test_a_spoiled_copy_is_taken_again_and_a_hopeless_one_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copied file that differs from its record (a commit changed it meanwhile) makes the
    reader copy again; if that goes on for ``snapshot_wait`` seconds, IndexLockedError."""
    loc, base = tmp_path / "idx", tmp_path / "copies"
    writer = _writer(loc)
    calls: list[str] = []

    def spoiled_twice(src: str, dst: str) -> str:
        calls.append(src)
        return "0" * 64 if len(calls) <= 2 else _copy_file(src, dst)

    monkeypatch.setattr(qdrant_files, "_copy_file", spoiled_twice)
    reader = QdrantStore.open(str(loc), {"snapshot_dir": str(base)})
    assert reader.count() == 10
    reader.close()
    files = len(writer._b.files)  # type: ignore[union-attr]
    assert len(calls) == 2 + files  # two spoiled attempts, one whole copy
    monkeypatch.setattr(qdrant_files, "_copy_file", lambda src, dst: "0" * 64)
    t0 = time.monotonic()
    with pytest.raises(IndexLockedError, match="no consistent copy .* kept differing"):
        QdrantStore.open(str(loc), {"snapshot_dir": str(base), "snapshot_wait": 0.3})
    assert time.monotonic() - t0 < 5
    assert _copies(base) == []  # the failed copies were removed
    writer.close()


def test_the_writer_lets_a_copy_under_way_finish_within_bounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy.lock`` held shared (a reader copying) holds a commit's changes back until it is
    released, and for :data:`COPY_WAIT` seconds at most."""
    loc = tmp_path / "idx"
    writer = _writer(loc)
    writer.upsert(*_docs(3, start=20))
    fd = os.open(loc / qdrant_edge.COPY_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (writer.commit({"commits": 2}), done.set()))
    thread.start()
    try:
        assert not done.wait(0.5)  # waiting for the copy
        assert (loc / "pending.redo").exists()  # committed, not yet applied
    finally:
        os.close(fd)  # the copy is done
    assert done.wait(10)
    thread.join()
    assert writer.count() == 13
    # a copy that never ends: the writer goes on after COPY_WAIT (the copy would be spoiled,
    # and its digests would say so)
    monkeypatch.setattr(qdrant_edge, "COPY_WAIT", 0.2)
    fd = os.open(loc / qdrant_edge.COPY_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        writer.upsert(*_docs(2, start=30))
        t0 = time.monotonic()
        writer.commit({"commits": 3})
        assert 0.2 <= time.monotonic() - t0 < 5
    finally:
        os.close(fd)
    writer.close()
    reader = QdrantStore.open(str(loc), {})
    assert reader.count() == 15 and reader.manifest["commits"] == 3
    reader.close()


def test_the_copies_of_dead_readers_are_removed(tmp_path: Path) -> None:
    base = tmp_path / "copies"
    base.mkdir(mode=0o700)
    dead, orphan, alive = (f"vecplug-copy-{pid}-{'ab' * 6}" for pid in (111, 222, 333))
    (base / dead).mkdir()  # its owner died: its lock file is there, unlocked
    (base / dead / "shard").mkdir()
    (base / f"{dead}.lock").touch()
    (base / orphan).mkdir()  # its owner died while removing it: no lock file
    (base / alive).mkdir()
    (base / f"{alive}.lock").touch()
    # not ours: a file, a folder alone, a folder with an unlocked lock file beside it, and
    # names that look like a copy's but are not quite one
    (base / "stray.txt").write_text("not ours to remove")
    (base / "photos").mkdir()
    (base / "photos" / "cat.jpg").write_text("precious")
    (base / "build").mkdir()
    (base / "build.lock").touch()
    near = ["111-abababababab", "vecplug-copy-1-ABABABABABAB", "vecplug-copy-1-ab",
            "x-vecplug-copy-1-abababababab"]
    for name in near:
        (base / name).mkdir()
        (base / f"{name}.lock").touch()
    users = sorted(["stray.txt", "photos", "build", "build.lock", *near, *(f"{n}.lock" for n in near)])
    fd = os.open(base / f"{alive}.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its owner is alive
    try:
        snap = _Snapshot(str(base))
        mine = os.path.basename(snap.dir)
        assert _names(base) == sorted([alive, f"{alive}.lock", mine, f"{mine}.lock", *users])
        snap.close()
        assert _names(base) == sorted([alive, f"{alive}.lock", *users])
    finally:
        os.close(fd)
    _Snapshot(str(base)).close()  # now its owner is gone too
    assert _names(base) == users
    assert (base / "photos" / "cat.jpg").read_text() == "precious"


def test_readers_copies_go_to_a_folder_of_their_own_in_snapshot_dir(tmp_path: Path) -> None:
    """``snapshot_dir`` may be any folder of the user's: readers' copies go to
    ``vecplug-copies/`` in it, and nothing else there is touched (a cleanup once removed every
    folder it did not know, and a ``build/`` beside an unlocked ``build.lock``)."""
    loc, big = tmp_path / "idx", tmp_path / "bigdisk"
    (big / "photos").mkdir(parents=True)
    (big / "photos" / "cat.jpg").write_text("precious")
    (big / "build").mkdir()
    (big / "build.lock").touch()
    _writer(loc).close()
    for _ in range(2):  # the second cleans after the first
        reader = QdrantStore.open(str(loc), {"snapshot_dir": str(big), "snapshot": True})
        assert reader.count() == 10 and reader._b.snap is not None  # type: ignore[union-attr]
        assert len(_copies(big)) == 2  # its copy and lock file
        reader.close()
    assert _names(big) == ["build", "build.lock", "photos", qdrant_edge.COPIES]
    assert (big / "photos" / "cat.jpg").read_text() == "precious" and _copies(big) == []


def test_a_reader_that_cannot_open_in_place_reads_a_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk (the engine writes as it opens) keeps a writer out with a StorageError and
    sends a reader to a copy elsewhere; with a commit to finish, both get the error."""
    loc, base = tmp_path / "idx", tmp_path / "copies"
    _writer(loc).close()

    def full(self: Any, recover: bool) -> None:
        raise StorageError(f"no space left for the shard in {self.where} (0.0 MiB free)")

    monkeypatch.setattr(qdrant_edge._Edge, "_load_in_place", full)
    with pytest.raises(StorageError, match="no space left"):
        QdrantStore.open(str(loc), {"snapshot_dir": str(base)}, writable=True)
    reader = QdrantStore.open(str(loc), {"snapshot_dir": str(base)})
    assert reader.count() == 10 and reader._b.snap is not None  # type: ignore[union-attr]
    monkeypatch.undo()
    writer = QdrantStore.open(str(loc), {}, writable=True)  # room again: a writer commits
    writer.upsert(*_docs(3, start=10))
    writer.commit({"commits": 2})
    _follow(reader, 2)  # and the reader on its copy follows
    assert reader.count() == 13
    reader.close()
    writer.close()
    monkeypatch.setattr(qdrant_edge._Edge, "_load_in_place", full)
    (loc / "pending.redo").write_bytes(b"a commit to finish")
    with pytest.raises(StorageError, match="no space left"):
        QdrantStore.open(str(loc), {"snapshot_dir": str(base)})


def test_a_commit_that_would_not_fit_is_refused_before_it_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loc = tmp_path / "idx"
    writer = _writer(loc)
    writer.upsert(*_docs(5, start=10))
    monkeypatch.setattr(qdrant_files, "_free", lambda folder: 10 * MiB)
    with pytest.raises(StorageError, match=r"not enough free space to commit in .*: 10\.0 MiB "
                                           r"free, about 4[89]\.\d MiB needed.*last commit is intact"):
        writer.commit({"commits": 2})
    assert not (loc / "pending.redo").exists()
    monkeypatch.undo()
    writer.close()
    reader = QdrantStore.open(str(loc), {})
    assert reader.manifest["commits"] == 1 and sorted(reader.ids()) == [f"doc-{i}" for i in range(10)]
    assert reader.verify() == []
    reader.close()


def test_an_optimisation_refused_for_space_is_skipped(tmp_path: Path) -> None:
    """The engine checks the space an optimisation needs before it starts; a refusal leaves
    the commit standing, unoptimised, with a warning."""
    loc = tmp_path / "idx"
    writer = _writer(loc)
    shard = writer._b.shard  # type: ignore[union-attr]

    class Full:
        def optimize(self) -> bool:
            raise Exception("Service runtime error: Not enough space available for "
                            "optimization, needed: 82.43 MiB, available: 38.76 MiB")

        def __getattr__(self, name: str) -> Any:
            return getattr(shard, name)

    writer._b.shard = Full()  # type: ignore[union-attr]
    writer.upsert(*_docs(5, start=10))
    with pytest.warns(RuntimeWarning, match="not optimised: .*Not enough space"):
        writer.commit({"commits": 2})
    writer._b.shard = shard  # type: ignore[union-attr]
    writer.close()
    reader = QdrantStore.open(str(loc), {})
    assert reader.manifest["commits"] == 2 and reader.count() == 15 and reader.verify() == []
    reader.close()


def test_the_engine_words_for_a_full_disk_become_storage_errors() -> None:
    for text in ("Service runtime error: failed to write to file `x`: No space left on device "
                 "(os error 28)", "Disk quota exceeded (os error 122)"):
        with pytest.raises(StorageError, match="no space left for the shard in folder f"):
            with _engine("folder f"):
                raise Exception(text)
    with pytest.raises(StorageError):
        with _engine("folder f"):
            raise OSError(28, "No space left on device")
    with pytest.raises(ValueError):  # anything else is not ours to rename
        with _engine("folder f"):
            raise ValueError("bad request")


def test_copies_keep_holes_and_prove_themselves(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    with open(src, "wb") as f:
        f.seek(1 << 20)  # a hole
        f.write(b"data" * 1000)
        f.write(bytes(1 << 17))  # zeros written out
        f.write(b"end")
    digest = _copy_file(str(src), str(dst))
    assert digest == _digest(str(src)) == _digest(str(dst))
    assert dst.read_bytes() == src.read_bytes()
    assert os.stat(dst).st_blocks * 512 < 256 * 1024  # the hole and the zeros are holes
    with pytest.raises(FileExistsError):  # never over a file
        _copy_file(str(src), str(dst))


def test_a_record_reuses_a_digest_only_when_stats_can_vouch_for_it(tmp_path: Path) -> None:
    """Where mapped writes do not move mtime (tmpfs), or when a file was changed just before it
    was hashed (a coarse clock tick), unchanged stats do not stand for unchanged content."""
    root = tmp_path / "shard"
    root.mkdir()
    old, young = root / "old.dat", root / "young.dat"
    old.write_bytes(b"a" * 100)
    young.write_bytes(b"b" * 100)
    os.utime(old, ns=(time.time_ns() - 10**10,) * 2)  # modified 10 s ago
    os.utime(young, ns=(time.time_ns() + 10**9,) * 2)  # as if modified while being hashed
    first = _record_files(str(root), None, trusted=True)
    assert "racy" not in first["old.dat"] and first["young.dat"]["racy"] is True

    def rewrite(path: Path, data: bytes) -> None:  # new content, same size, mtime and inode
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    rewrite(old, b"c" * 100)
    rewrite(young, b"d" * 100)
    trusted = _record_files(str(root), first, trusted=True)
    assert trusted["old.dat"]["digest"] == first["old.dat"]["digest"]  # the documented limit
    assert trusted["young.dat"]["digest"] == _digest(str(young))  # racy: hashed again
    untrusted = _record_files(str(root), first, trusted=False)
    assert {rel: f["digest"] for rel, f in untrusted.items()} == {
        "old.dat": _digest(str(old)), "young.dat": _digest(str(young))}


def test_a_record_waits_for_a_log_segment_the_engine_is_creating(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An open shard's engine creates its next write-ahead-log segment in a background thread,
    as wal/tmp-open-N renamed to open-N (a CI run's record listed the first name and found
    neither): a record waits for the rename, and lists again when a file goes between its
    listing and its hashing."""
    from vecplug.adapters.stores import qdrant_files

    root = tmp_path / "shard"
    (root / "wal").mkdir(parents=True)
    (root / "wal" / "open-1").write_bytes(b"1" * 64)
    creating = root / "wal" / "tmp-open-2"
    creating.write_bytes(b"2" * 64)
    renamer = threading.Timer(0.1, os.rename, (creating, root / "wal" / "open-2"))
    renamer.start()
    try:
        record = _record_files(str(root), None, trusted=True)
    finally:
        renamer.join()
    assert sorted(record) == ["wal/open-1", "wal/open-2"]

    gone = root / "wal" / "open-3"
    gone.write_bytes(b"3" * 64)
    digest = qdrant_files._digest

    def vanish_once(path: str) -> str:  # the file goes after the listing, once
        if path.endswith("open-3") and gone.exists():
            gone.unlink()
            raise FileNotFoundError(path)
        return digest(path)

    monkeypatch.setattr(qdrant_files, "_digest", vanish_once)
    assert sorted(_record_files(str(root), None, trusted=False)) == ["wal/open-1", "wal/open-2"]
    monkeypatch.setattr(qdrant_files, "WAL_WAIT_SECONDS", 0.0)  # past the wait: as before
    creating.write_bytes(b"2" * 64)
    assert "wal/tmp-open-2" in _record_files(str(root), None, trusted=False)


def test_file_system_traits() -> None:
    assert _fs_type("/proc/self") == "proc"
    if _fs_type("/dev/shm") != "tmpfs" or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable tmpfs at /dev/shm")
    # measured: tmpfs neither moves mtime on mapped writes nor leaves holes read through a map
    assert _fs_traits("/dev/shm", ".vecplug-test-probe-") == FsTraits(False, True)


def test_a_malformed_file_record_is_refused(tmp_path: Path) -> None:
    """A reader copies what the record names: a path out of the shard is never followed."""
    from vecplug.fsutil import json_checksum

    loc = tmp_path / "idx"
    _writer(loc).close()
    meta = json.loads((loc / "manifest.json").read_text())
    meta["files"]["../../outside"] = {"size": 1, "digest": "0" * 64}
    meta["checksum"] = json_checksum(meta)
    (loc / "manifest.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptIndexError, match="malformed file record"):
        QdrantStore.open(str(loc), {})
