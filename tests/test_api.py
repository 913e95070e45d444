"""The Python API, as the README shows it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import vecplug
from vecplug import Document


def test_readme_flow(tmp_path: Path, tiny_model: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("water boils at one hundred degrees")
    (docs / "b.txt").write_text("der schnelle braune fuchs")
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=settings) as index:
        assert index.report.documents == 2 and index.report.problems == []
    index = vecplug.open_index(str(tmp_path / "idx"))
    try:
        result = index.search("water boils at one hundred degrees", k=5, mode="xy")
        assert result[0].source == "a.txt" and result[0].rank == 1 and len(result) == 2
        assert index.info()["documents"] == 2
        with pytest.raises(vecplug.VecplugError, match="read-only"):
            index.add_documents([Document(id="x", text="y", source="z")])
    finally:
        index.close()
    with vecplug.open_index(str(tmp_path / "idx"), writable=True) as index:
        report = index.add_documents([Document(id="faq#1", text="el agua hierve", source="faq", lang="es")])
        assert report.documents == 1 and report.languages == {"es": 1}
        hits = index.search("el agua hierve", k=1, mode="mono", lang="es")
        assert [h.id for h in hits] == ["faq#1"]
        with pytest.raises(vecplug.VecplugError, match="empty"):
            index.search("   ")


def test_open_missing_index(tmp_path: Path) -> None:
    with pytest.raises(vecplug.IndexNotFoundError):
        vecplug.open_index("nowhere")
    (tmp_path / "a-file").write_text("not an index")  # a file where the folder would be
    for store in ("hnswlib", "qdrant"):
        with pytest.raises(vecplug.IndexNotFoundError):
            vecplug.open_index(settings=vecplug.load_settings(
                overrides={"index": {"path": str(tmp_path / "a-file"), "store": store}}))


def test_reindexing_a_folder_follows_its_changes(tmp_path: Path, tiny_model: Path) -> None:
    """vecplug index on the same folder again: new and edited files encoded, unchanged ones
    skipped, deleted ones removed, an unreadable one keeps its last good version; a run with
    no change writes nothing. Another folder given to the index is added under its absolute
    path and kept up to date by its own runs; neither folder's runs touch the other's
    documents or those added through the API."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in {"a.txt": "water boils at one hundred degrees", "b.txt": "der schnelle braune fuchs",
                       "c.txt": "el agua hierve", "d.txt": "вода кипит"}.items():
        (docs / name).write_text(text)
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})

    def run(folder: Path) -> tuple[vecplug.IndexReport, set[str], dict]:
        with vecplug.create_index(folder, settings=settings) as index:
            return index.report, {r.id for r in index.store.get(list(index.store.ids()))}, index.manifest

    report, ids, _ = run(docs)
    assert report.documents == 4 and ids == {"a.txt#0", "b.txt#0", "c.txt#0", "d.txt#0"}
    (docs / "a.txt").write_text("water boils at ninety degrees on a mountain")
    (docs / "b.txt").unlink()
    (docs / "d.txt").write_bytes(b"\xff\xfe\xfa not text any more \xff")
    (docs / "e.txt").write_text("敏捷的棕色狐狸")
    report, ids, manifest = run(docs)
    assert (report.documents, report.unchanged, report.removed) == (2, 1, 1)
    assert ids == {"a.txt#0", "c.txt#0", "d.txt#0", "e.txt#0"}  # d.txt: its last good version
    assert [p.path for p in report.problems] == ["d.txt"]
    with vecplug.open_index(str(tmp_path / "idx")) as index:
        assert index.store.get(["a.txt#0"])[0].text.endswith("mountain")
    report, _, again = run(docs)
    assert (report.documents, report.removed) == (0, 0) and again == manifest  # nothing written
    other = tmp_path / "other"
    other.mkdir()
    (other / "z.txt").write_text("wasser kocht bei hundert grad")
    (other / "a.txt").write_text("a file of the same name in another folder")
    report, ids, _ = run(other)
    space = str(other.resolve())
    assert report.removed == 0 and report.documents == 2
    assert ids == {"a.txt#0", "c.txt#0", "d.txt#0", "e.txt#0", f"{space}/a.txt#0", f"{space}/z.txt#0"}
    with vecplug.open_index(str(tmp_path / "idx"), settings=settings, writable=True) as index:
        assert index.store.get(["a.txt#0"])[0].text.endswith("mountain")  # not replaced
        assert index.store.get([f"{space}/z.txt#0"])[0].source == f"{space}/z.txt"
        index.add_documents([vecplug.Document("faq#1", "the kettle switches itself off", "faq")])
        index.add_documents([vecplug.Document("note#1", "a note", "notes/n.txt")])
    (docs / "c.txt").unlink()
    report, ids, _ = run(docs)  # the first folder again: only its own documents can go
    assert report.removed == 2 and ids == {"a.txt#0", "d.txt#0", "e.txt#0", "faq#1",
                                          f"{space}/a.txt#0", f"{space}/z.txt#0"}
    (other / "z.txt").unlink()
    report, ids, _ = run(other)  # the other folder again: its own deleted file goes
    assert report.removed == 1 and ids == {"a.txt#0", "d.txt#0", "e.txt#0", "faq#1", f"{space}/a.txt#0"}
    # single files of a third folder: each run owns its file only, not its folder's others
    third = tmp_path / "third"
    (third / "sub").mkdir(parents=True)
    (third / "sub" / "s.txt").write_text("ein Satz im Unterordner")
    (third / "n1.txt").write_text("the first note")
    (third / "n2.txt").write_text("the second note")
    for part in (third / "sub", third / "n1.txt", third / "n2.txt"):
        report, ids, _ = run(part)
        assert report.removed == 0 and report.documents == 1
    t = str(third.resolve())
    assert {f"{t}/sub/s.txt#0", f"{t}/n1.txt#0", f"{t}/n2.txt#0"} <= ids


def test_a_folder_that_cannot_be_listed_keeps_its_documents(tmp_path: Path, tiny_model: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A subfolder (or the folder itself) that cannot be listed on a later run is reported, and
    the documents indexed from it stay: they may well still be there. Before, only unreadable
    files were kept, and a locked subfolder's documents were pruned as deleted."""
    import os

    from vecplug.indexer import corpus

    def make(folder: Path) -> None:  # texts of their own: the same ones would be a moved folder
        (folder / "sub" / "deeper").mkdir(parents=True)
        (folder / "top.txt").write_text(f"water boils at one hundred degrees in {folder.name}")
        (folder / "sub" / "s.txt").write_text(f"der schnelle braune fuchs {folder.name}")
        (folder / "sub" / "deeper" / "d.txt").write_text(f"el agua hierve {folder.name}")
        (folder / "subway.txt").write_text("a name that starts like the locked folder")

    docs, other = tmp_path / "docs", tmp_path / "other"
    make(docs)
    make(other)
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})

    def run(folder: Path) -> tuple[vecplug.IndexReport, set[str]]:
        with vecplug.create_index(folder, settings=settings) as index:
            return index.report, set(index.store.ids())

    run(docs)
    _, before = run(other)
    assert len(before) == 8
    real_scandir = os.scandir
    locked: set[Path] = set()

    def scandir(path):  # as root, chmod 000 would not stop us: refuse like the kernel would
        if Path(path) in locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(corpus.os, "scandir", scandir)
    for folder in (docs, other):
        (folder / "subway.txt").unlink()  # a deleted file still goes
        locked.add((folder / "sub").resolve())
        report, ids = run(folder)
        assert report.removed == 1 and [(p.path, p.reason) for p in report.problems] == [
            ("sub", "cannot list folder: Permission denied")]
        before.discard("subway.txt#0" if folder == docs else f"{other.resolve()}/subway.txt#0")
        assert ids == before
    for folder in (docs, other):
        locked.add(folder.resolve())
        report, ids = run(folder)
        assert report.removed == 0 and ids == before


def test_a_moved_folder_is_still_the_index_s_own(tmp_path: Path, tiny_model: Path) -> None:
    """The first folder renamed (or mounted elsewhere): its documents are recognised by their
    relative ids and texts, not encoded again under the new path beside the old ones."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(5):
        (docs / f"n{i}.txt").write_text(f"note number {i} about water and mountains")
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=settings):
        pass
    moved = docs.rename(tmp_path / "moved")
    (moved / "n0.txt").unlink()
    with vecplug.create_index(moved, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (0, 4, 1)
        assert sorted(index.store.ids()) == [f"n{i}.txt#0" for i in range(1, 5)]
        assert index.manifest["source_root"] == str(moved.resolve())
    # moved again, with new files sorting first: those say nothing of the move (they were
    # counted against it, and the whole corpus indexed again beside itself)
    again = moved.rename(tmp_path / "again")
    (again / "aaa.jsonl").write_text("".join(json.dumps({"text": f"a new record {i}"}) + "\n" for i in range(40)))
    with vecplug.create_index(again, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (40, 4, 0)
        assert sorted(index.store.ids()) == sorted([f"aaa.jsonl#L{i}" for i in range(1, 41)] + [
            f"n{i}.txt#0" for i in range(1, 5)])


def _settings_at(index: Path, model: Path) -> vecplug.Settings:
    return vecplug.load_settings(overrides={"index": {"path": str(index)}, "model": {"document": str(model)}})


def _files(folder: Path, texts: dict[str, str]) -> Path:
    for name, text in texts.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_a_folder_around_the_first_becomes_the_first(tmp_path: Path, tiny_model: Path) -> None:
    """A subfolder (or one file) indexed first, then its parent: the documents already held are
    renamed as the parent names them (their vectors kept), not indexed again beside themselves
    under absolute ids; a file deleted later goes (the old copy stayed for good)."""
    root = _files(tmp_path / "c", {"sub/a.txt": "the quick brown fox jumps", "top.txt": "a note at the top",
                                   "sub/b.txt": "water boils at one hundred degrees",
                                   "other/o.txt": "another folder inside the parent"})
    other = root / "other"
    settings = _settings_at(tmp_path / "idx", tiny_model)
    with vecplug.create_index(root / "sub", settings=settings):
        pass
    with vecplug.create_index(other, settings=settings) as index:  # another folder: absolute ids
        assert sorted(index.store.ids()) == sorted(["a.txt#0", "b.txt#0", f"{other.resolve()}/o.txt#0"])
    with vecplug.create_index(root, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (1, 3, 0)
        assert sorted(index.store.ids()) == ["other/o.txt#0", "sub/a.txt#0", "sub/b.txt#0", "top.txt#0"]
        assert index.store.get(["sub/a.txt#0"])[0].source == "sub/a.txt"
        assert index.manifest["source_root"] == str(root.resolve())
    (root / "sub" / "a.txt").unlink()
    with vecplug.create_index(root, settings=settings) as index:
        assert index.report.removed == 1
        assert sorted(index.store.ids()) == ["other/o.txt#0", "sub/b.txt#0", "top.txt#0"]
    # a first folder under a hidden one: the reader skips it, so it stays another folder (its
    # documents renamed would have been pruned as gone, and indexed again by the next run)
    hidden = _files(tmp_path / "h", {".notes/n.txt": "a hidden note", "pub.txt": "a public note"})
    three = _settings_at(tmp_path / "idx3", tiny_model)
    with vecplug.create_index(hidden / ".notes", settings=three):
        pass
    with vecplug.create_index(hidden, settings=three) as index:
        assert index.report.removed == 0
        assert sorted(index.store.ids()) == sorted(["n.txt#0", f"{hidden.resolve()}/pub.txt#0"])
    # a run that fails after the renames leaves them under the folder that names them
    failing = _settings_at(tmp_path / "idx4", tiny_model)
    with vecplug.create_index(root / "sub", settings=failing):
        pass
    with vecplug.open_index(settings=failing, writable=True) as index:
        with pytest.raises(vecplug.ConfigError, match="the documents' language"):
            index.index_path(root, lang="English")
        assert sorted(index.store.ids()) == ["b.txt#0"]  # nothing renamed for a refused run
        encode = index.encoder.encode_documents

        def broken(texts: list[str], progress: bool | None = None) -> Any:
            raise RuntimeError("the encoder fails")

        index.encoder.encode_documents = broken  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            index.index_path(root)
        index.encoder.encode_documents = encode  # type: ignore[method-assign]
    with vecplug.open_index(settings=failing) as index:
        assert index.manifest["source_root"] == str(root.resolve())
        assert "sub/b.txt#0" in set(index.store.ids())
    with vecplug.create_index(root, settings=failing) as index:
        assert (index.report.removed, index.report.unchanged) == (0, 1)
    # a single file first, then its folder
    single = _files(tmp_path / "single", {"n.txt": "a single note", "m.txt": "its neighbour"})
    one = _settings_at(tmp_path / "idx1", tiny_model)
    with vecplug.create_index(single / "n.txt", settings=one):
        pass
    with vecplug.create_index(single, settings=one) as index:
        assert (index.report.documents, index.report.unchanged) == (1, 1)
        assert sorted(index.store.ids()) == ["m.txt#0", "n.txt#0"]


def test_an_index_that_did_not_record_its_first_source(tmp_path: Path, tiny_model: Path) -> None:
    """Indexes of early vecplug versions record no first folder (source_root) or not whether
    it was a file (source_kind). Their folder indexed again was taken for another one: every
    document was encoded again under an absolute id beside its old copy, kept for good; a
    first file's folder renamed the documents under the file's path."""
    docs = _files(tmp_path / "docs", {"a.txt": "the quick brown fox jumps", "sub/b.txt": "water boils",
                                      "r.jsonl": '{"id": "x", "text": "a record"}\n'})
    settings = _settings_at(tmp_path / "idx", tiny_model)
    with vecplug.create_index(docs, settings=settings):
        pass
    def as_early_versions_left_it(keys: tuple[str, ...]) -> None:
        with vecplug.open_index(settings=settings, writable=True) as index:
            for key in keys:
                index.store._meta["manifest"].pop(key)  # not recorded (a commit keeps the others)
            index.store.commit({})

    as_early_versions_left_it(("source_root", "source_kind"))
    (docs / "a.txt").write_text("the quick brown fox jumps over the lazy dog")  # changed since
    with vecplug.create_index(docs, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (1, 2, 0)
        assert sorted(index.store.ids()) == ["a.txt#0", "r.jsonl#x", "sub/b.txt#0"]
        assert index.manifest["source_root"] == str(docs.resolve())
    # a first file, its kind not recorded: its folder makes its documents the folder's
    one = _settings_at(tmp_path / "idx1", tiny_model)
    with vecplug.create_index(docs / "r.jsonl", settings=one):
        pass
    settings, kept = one, settings
    as_early_versions_left_it(("source_kind",))
    settings = kept
    with vecplug.create_index(docs, settings=one) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (2, 1, 0)
        assert sorted(index.store.ids()) == ["a.txt#0", "r.jsonl#x", "sub/b.txt#0"]
    # another folder sharing a file name (other texts) stays another folder: taken for the
    # first, it would have pruned the first folder's documents
    as_early_versions_left_it(("source_root", "source_kind"))
    other = _files(tmp_path / "other", {"a.txt": "a note of another folder"})
    with vecplug.create_index(other, settings=settings) as index:
        assert index.report.removed == 0
        assert sorted(index.store.ids()) == sorted(["a.txt#0", "r.jsonl#x", "sub/b.txt#0",
                                                    f"{other.resolve()}/a.txt#0"])


def test_documents_given_through_the_api_before_the_first_folder(tmp_path: Path, tiny_model: Path) -> None:
    """Documents added through the API first, then a folder: the folder is the index's first
    (named by paths inside it, recognised when moved). It was taken for another folder: ids
    by absolute path, and a moved folder indexed again beside its old copy."""
    docs = _files(tmp_path / "docs", {"a.txt": "the quick brown fox jumps", "b.txt": "water boils"})
    settings = _settings_at(tmp_path / "idx", tiny_model)
    with vecplug.create_index(settings=settings) as index:
        index.add_documents([vecplug.Document("faq#1", "a question and its answer", "faq", 1, "en")])
    with vecplug.create_index(docs, settings=settings) as index:
        assert sorted(index.store.ids()) == ["a.txt#0", "b.txt#0", "faq#1"]
    moved = docs.rename(tmp_path / "moved")
    with vecplug.create_index(moved, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (0, 2, 0)
        assert sorted(index.store.ids()) == ["a.txt#0", "b.txt#0", "faq#1"]


def test_a_part_or_a_copy_of_the_first_folder_never_prunes_the_rest(tmp_path: Path, tiny_model: Path) -> None:
    """One file or subfolder of the first folder given alone updates its own documents there
    (not a second copy under its absolute path); a copy of the folder beside it is another
    folder, not the first one moved: before, both were taken for a move and pruned the rest."""
    import shutil

    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    for name in ("a.md", "b.txt", "sub/c.txt", "sub/d.txt"):
        (docs / name).write_text(f"a note called {name} about rivers and mountains")
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=settings):
        pass
    everything = ["a.md#0", "b.txt#0", "sub/c.txt#0", "sub/d.txt#0"]
    (docs / "a.md").write_text("a note rewritten about the sea")
    with vecplug.create_index(docs / "a.md", settings=settings) as index:
        assert (index.report.documents, index.report.removed) == (1, 0)
        assert sorted(index.store.ids()) == everything
        assert index.store.get(["a.md#0"])[0].text.endswith("about the sea")
        assert index.manifest["source_root"] == str(docs.resolve())
    (docs / "sub" / "d.txt").unlink()
    with vecplug.create_index(docs / "sub", settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (0, 1, 1)
        assert sorted(index.store.ids()) == everything[:3]
    copy = Path(shutil.copytree(docs, tmp_path / "copy"))
    (copy / "b.txt").unlink()
    with vecplug.create_index(copy, settings=settings) as index:
        assert index.report.removed == 0
        assert sorted(index.store.ids()) == sorted(everything[:3] + [f"{copy.resolve()}/{i}"
                                                                     for i in ("a.md#0", "sub/c.txt#0")])
        assert index.manifest["source_root"] == str(docs.resolve())


def test_a_folder_whose_path_is_not_utf8_is_refused_before_an_index_is_made(tmp_path: Path,
                                                                             tiny_model: Path) -> None:
    """Its path names it in the manifest (and another folder's document ids): a clear error up
    front, not a UnicodeEncodeError at the commit."""
    import os

    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9"))
    folder.mkdir()
    (folder / "a.txt").write_text("water boils at one hundred degrees")
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with pytest.raises(vecplug.VecplugError, match=r"caf\\xe9: the path holds bytes that are not UTF-8"):
        vecplug.create_index(folder, settings=settings)
    assert not (tmp_path / "idx").exists()


def test_a_folder_holds_the_store_it_was_made_with(tmp_path: Path, tiny_model: Path) -> None:
    """An embedded Qdrant index opens as such without --store (searching, adding), instead of
    'no index' or a new hnswlib index written over it; a folder of someone else's files is
    never made into an index; a missing corpus makes no empty index."""
    pytest.importorskip("qdrant_edge")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("water boils at one hundred degrees")
    idx = str(tmp_path / "qidx")
    model = {"document": str(tiny_model)}
    qdrant = vecplug.load_settings(overrides={"index": {"path": idx, "store": "qdrant"}, "model": model})
    with vecplug.create_index(docs, settings=qdrant):
        pass
    plain = vecplug.load_settings(overrides={"index": {"path": idx}, "model": model})  # store: hnswlib
    (docs / "b.txt").write_text("der schnelle braune fuchs")
    with vecplug.create_index(docs, settings=plain) as index:
        assert index.store.name == "qdrant" and index.report.documents == 1
    with vecplug.open_index(settings=plain) as index:
        assert index.store.name == "qdrant" and index.store.count() == 2
        assert sorted(h.source for h in index.search("water boils", k=5)) == ["a.txt", "b.txt"]
    # someone's own folder: refused, left as it was
    own = tmp_path / "project"
    own.mkdir()
    (own / "manifest.json").write_text('{"name": "my project"}')
    settings = vecplug.load_settings(overrides={"index": {"path": str(own)}, "model": model})
    with pytest.raises(vecplug.VecplugError, match="not empty and not a vecplug hnswlib index"):
        vecplug.create_index(docs, settings=settings)
    assert sorted(p.name for p in own.iterdir()) == ["manifest.json"]
    assert (own / "manifest.json").read_text() == '{"name": "my project"}'
    # found before any model is looked for, let alone built and loaded (either store)
    for store in ("hnswlib", "qdrant"):
        settings = vecplug.load_settings(overrides={"index": {"path": str(own), "store": store},
                                                    "model": {"document": str(tmp_path / "no-such-model")}})
        with pytest.raises(vecplug.VecplugError, match=f"not empty and not a vecplug {store[:6]}"):
            vecplug.create_index(docs, settings=settings)
    # a corpus that is not there: an error before any index is made
    with pytest.raises(vecplug.VecplugError, match="does not exist"):
        vecplug.create_index(tmp_path / "missing", path=str(tmp_path / "x3"))
    assert not (tmp_path / "x3").exists()


def test_the_document_length_limit_is_the_index_s(tmp_path: Path, tiny_model: Path) -> None:
    """Documents are cut at the length the index was built with unless told otherwise, and a
    run that would cut them at another length is refused, naming both."""
    docs = tmp_path / "docs"
    docs.mkdir()
    long = " ".join(["water boils at one hundred degrees"] * 20)
    (docs / "a.txt").write_text(long)

    def settings(**model: object) -> vecplug.Settings:
        return vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model), **model}})

    with vecplug.create_index(docs, settings=settings(document_max_length=16)) as index:
        assert index.manifest["document_max_length"] == 16
    (docs / "b.txt").write_text(long + " and more")
    with vecplug.create_index(docs, settings=settings()) as index:  # no setting: the index's 16
        assert index.encoder.document_max_length == 16
        fresh = index.encoder.encode_documents([long + " and more"])
        assert float(fresh[0] @ index.store.vectors(["b.txt#0"])[0]) > 0.9999
    with pytest.raises(vecplug.ModelMismatchError, match=r"document length limit \(tokens\) mismatch.*16.*32"):
        vecplug.create_index(docs, settings=settings(document_max_length=32))
    with vecplug.open_index(settings=settings()) as index:  # language codes as the index has them
        hits = index.search("water", k=5, langs=[" EN ", ""]).hits
        assert len(hits) == 5 and hits == index.search("water", k=5, langs=["en"]).hits
        # passages as long as documents are cut (16 tokens, 14 without <s> and </s>): none is
        # cut short, so every word of the files is embedded
        assert index.manifest["corpus"]["chunk_tokens"] == 14



def test_reader_copy_reaches_the_qdrant_store(tmp_path: Path, tiny_model: Path) -> None:
    """index.reader_copy (a search service's setting): its reader reads a copy, and a writer
    that comes later gets the index; without it the writer's error says what to do."""
    pytest.importorskip("qdrant_edge")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("water boils at one hundred degrees")
    base = {"index": {"path": str(tmp_path / "q"), "store": "qdrant"}, "model": {"document": str(tiny_model)}}
    with vecplug.create_index(docs, settings=vecplug.load_settings(overrides=base)):
        pass
    (docs / "b.txt").write_text("der schnelle braune fuchs")
    service = vecplug.load_settings(overrides=base, environ={"VECPLUG_INDEX_READER_COPY": "1"})
    with vecplug.open_index(settings=service) as reader:
        assert reader.store.count() == 1
        with vecplug.create_index(docs, settings=vecplug.load_settings(overrides=base)) as writer:
            assert writer.report.documents == 1
    with vecplug.open_index(settings=vecplug.load_settings(overrides=base)) as reader:  # in place
        with pytest.raises(vecplug.IndexLockedError, match="index.reader_copy: true"):
            vecplug.create_index(docs, settings=vecplug.load_settings(overrides=base))


def test_documents_through_the_api_are_checked_and_can_be_deleted(tmp_path: Path, tiny_model: Path) -> None:
    """add_documents: language codes as the detector writes them, unstorable documents
    reported and skipped; delete_documents keeps the bias statistics in step (verify agrees);
    search_batch refuses what search refuses, and a languages list that does not fit."""
    from vecplug.verify import verify_index

    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    docs = [Document("es1", "el agua hierve a cien grados", "api", lang="ES "),
            Document("pt1", "a água ferve a cem graus", "api", lang="pt-BR"),
            Document("de1", "Wasser kocht bei hundert Grad", "api", lang="de"),
            Document("", "no id", "api"), Document("blank", "   ", "api"),
            Document("nan", "a payload that JSON cannot carry", "api", payload={"x": float("nan")}),
            Document("bad\u202eid", "an id that reads backwards", "api"),
            Document("en1", "water boils at one hundred degrees", "api", position=7, lang="English")]
    with vecplug.create_index(settings=settings) as index:
        report = index.add_documents(docs)
        assert report.documents == 4
        assert [p.reason.split(":")[0] for p in report.problems] == [
            "document ''", "document 'blank'", "document 'nan'", "document 'bad\\u202eid'",  # shown escaped
            "document 'en1'"]
        # a language name is reported and the document kept, its language detected
        assert report.problems[-1].line == 7 and "'English' is not a language code" in report.problems[-1].reason
        assert {r.id: r.lang for r in index.store.get(["es1", "pt1", "de1", "en1"])} == {
            "es1": "es", "pt1": "pt", "de1": "de", "en1": "en"}
        with pytest.raises(vecplug.ConfigError, match="query 1's language: 'Spanish' is not a language code"):
            index.search_batch(["agua", "agua"], langs=["es", "Spanish"])
        with pytest.raises(vecplug.ConfigError, match="'Spanish' is not a language code"):
            index.search("agua", langs=["Spanish"])
        assert [h.id for h in index.search("agua", mode="mono", lang="ES")] == ["es1"]
        assert [h.id for h in index.search("agua", langs=["PT_br"])] == ["pt1"]
        with pytest.raises(vecplug.VecplugError, match="k must be between 1 and 2147483647, not 0"):
            index.search("agua", k=0)
        with pytest.raises(vecplug.VecplugError, match="k must be between 1 and 2147483647"):
            index.search("agua", k=2**64)  # Qdrant: an OverflowError traceback
        with pytest.raises(vecplug.VecplugError, match="k must be an integer, not str"):
            index.search("agua", k="5")  # type: ignore[arg-type]
        assert len(index.search("agua", k=np.int64(2))) == 2  # a numpy integer is an integer
        with pytest.raises(vecplug.ConfigError, match="rerank_depth must be an integer, not float"):
            index.search("agua", rerank="teacher", rerank_depth=4.0)  # type: ignore[arg-type]
        with pytest.raises(vecplug.VecplugError, match="one per query"):
            index.search_batch(["agua", "wasser"], langs=["es"])
        with pytest.raises(vecplug.VecplugError, match="a list of queries"):
            index.search_batch(["agua"], langs="es")
        with pytest.raises(vecplug.VecplugError, match="query 1 is empty"):
            index.search_batch(["agua", "  "])
        with pytest.raises(vecplug.VecplugError, match="query 1 must be a string, not NoneType"):
            index.search_batch(["agua", None])  # type: ignore[list-item]
        with pytest.raises(vecplug.VecplugError, match="the query must be a string, not NoneType"):
            index.search(None)  # type: ignore[arg-type]
        with pytest.raises(vecplug.VecplugError, match="empty"):
            index.search("\u200f\u200e \u200b")  # only bidi marks and a zero-width space
        # an undecodable byte of a shell argument: fastText and the tokenizer raised TypeError
        with pytest.raises(vecplug.VecplugError, match="the query holds a NUL or an undecodable byte"):
            index.search("water \udcff")
        with pytest.raises(vecplug.VecplugError, match="query 1 holds a NUL or an undecodable byte"):
            index.search_batch(["water", "water \udcff"], langs=["en", "en"])
        with pytest.raises(ValueError, match=r"texts\[1\] holds an undecodable byte"):
            index.encoder.encode_queries(["water", "water \udcff"])
        with pytest.raises(vecplug.VecplugError, match="a list of ids"):
            index.delete_documents("es1")
        with pytest.raises(vecplug.VecplugError, match="a list of ids, not NoneType"):
            index.delete_documents(None)  # type: ignore[arg-type]
        with pytest.raises(vecplug.VecplugError, match=r"ids\[1\] is int, not a string"):
            index.delete_documents(["es1", 3])  # type: ignore[list-item]
        with pytest.raises(vecplug.VecplugError, match=r"documents\[0\] is str, not a vecplug.Document"):
            index.add_documents(["water boils"])  # type: ignore[list-item]
        with pytest.raises(vecplug.VecplugError, match="a list of vecplug.Document, not Document"):
            index.add_documents(docs[0])  # type: ignore[arg-type]
        assert index.delete_documents(["es1", "nowhere", "es1"]) == 1
        assert index.store.count() == 3 and index.language_stats.counts.get("es", 0) == 0
    report = verify_index(settings)
    assert report.ok, report.problems


def test_the_passages_of_a_text_file_share_its_language() -> None:
    """One detection per .txt/.md file, from its start; records and documents that give their
    language keep theirs."""
    from vecplug.indexer.langid import one_language_per_file
    from vecplug.indexer.langid import SAMPLE_CHARS

    seen: list[str] = []

    def detect(text: str) -> str:
        seen.append(text)
        return {"a": "de", "b": "fr"}[text[0]]

    docs = [Document(f"a.md#{i}", "a" + "x" * 3000, "a.md", i) for i in range(3)]
    docs += [Document("r.jsonl#1", "a record", "r.jsonl", 1), Document("b.txt#0", "b short", "b.txt"),
             Document("c.txt#0", "given", "c.txt", lang="es")]
    out = list(one_language_per_file(docs, detect))
    assert [(d.id, d.lang) for d in out] == [("a.md#0", "de"), ("a.md#1", "de"), ("a.md#2", "de"),
                                            ("r.jsonl#1", None), ("b.txt#0", "fr"), ("c.txt#0", "es")]
    assert [len(t) for t in seen] == [SAMPLE_CHARS, len("b short")]


def test_an_index_recording_a_limit_past_its_model_still_opens(tmp_path: Path, tiny_model: Path) -> None:
    """Before limits were checked, an index recorded the asked 256 for a model that takes 128
    (its texts were cut at 128): it opens, searches and takes documents as before."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("water boils at one hundred degrees")
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=settings) as index:
        assert index.manifest["document_max_length"] == 128  # the tiny model's maximum
        index.store.commit({"document_max_length": 256, "query_max_length": 256})  # as recorded then
    (docs / "b.txt").write_text("der schnelle braune fuchs")
    with vecplug.create_index(docs, settings=settings) as index:
        assert index.report.documents == 1 and index.encoder.document_max_length == 128
        assert len(index.search("water", k=5)) == 2
    with pytest.raises(vecplug.ModelMismatchError, match="document length limit"):
        vecplug.create_index(docs, settings=vecplug.load_settings(overrides={
            "index": {"path": str(tmp_path / "idx")}, "model": {"document": str(tiny_model),
                                                                 "document_max_length": 64}}))


@pytest.mark.parametrize("kind", ["hnswlib", "qdrant-embedded", "qdrant-server"])
def test_a_long_lived_reader_follows_the_writer_s_languages(tmp_path: Path, kind: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that searched once (its bias correction's means read) still finds the
    documents of a language that a writer commits afterwards: the means follow the commits
    (a search service, QdrantSearcher, an embedded Qdrant reader's copy)."""
    import time

    from conftest import FakeEncoder
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores import Record, get_store_class, qdrant
    from vecplug.api import Index

    monkeypatch.setattr(qdrant, "SERVER_FOLLOW", 0.0)  # a server reader looks at every search
    encoder = FakeEncoder(16)
    encoder.query = None  # nothing to load before a search
    location, options = str(tmp_path / "idx"), {}
    if kind != "hnswlib":
        pytest.importorskip("qdrant_edge" if kind == "qdrant-embedded" else "qdrant_client")
    if kind == "qdrant-server":
        from qdrant_client import QdrantClient

        location, options = "client://", {"client": QdrantClient(":memory:"), "collection": "docs"}
    writer = get_store_class("qdrant" if kind.startswith("qdrant") else "hnswlib").create(
        location, 16, {**encoder.describe(), "debias": True}, options)
    stats = LanguageStats(16)

    def add(records: list[Record]) -> None:
        vectors = encoder.encode_documents([r.text for r in records])
        writer.upsert(records, vectors)
        stats.add([r.lang for r in records], vectors)
        writer.commit(stats.to_manifest())

    add([Record(f"de{i}", f"hund katze {i}", "s", i, "de") for i in range(5)])
    if kind == "qdrant-server":
        from vecplug.adapters.integrations.qdrant import QdrantSearcher

        reader = QdrantSearcher(options["client"], "docs").index
    else:
        read_options = {"snapshot_dir": str(tmp_path / "copies")} if kind == "qdrant-embedded" else {}
        reader = Index(vecplug.load_settings(), writer.open(location, read_options), writable=False)
    reader._encoder, reader._detector = encoder, object()  # the query's language is given
    try:
        assert reader.search("apple banana", k=3, lang="en")[0].lang == "de"
        add([Record("fr0", "apple banana", "s", 0, "fr")])
        deadline = time.monotonic() + 30  # an embedded Qdrant reader copies the commit in the background
        while reader.store.count() < 6:
            assert time.monotonic() < deadline, "the reader's store did not follow the writer"
            time.sleep(0.02)
        assert [h.id for h in reader.search("apple banana", k=3, lang="en", debias=False)][0] == "fr0"
        assert [h.id for h in reader.search("apple banana", k=3, lang="en")][0] == "fr0"
    finally:
        reader.close()
        writer.close()


def test_a_record_that_moved_to_another_line_keeps_its_vector_and_takes_its_new_line(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines removed above JSONL records: a second run stores their new line numbers, as a
    clean build would, without encoding them again."""
    docs = tmp_path / "docs"
    docs.mkdir()
    lines = [{"id": f"r{i}", "text": f"record number {i} about water"} for i in range(3)]
    (docs / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=settings) as index:
        before = {r.id: r for r in index.store.get(list(index.store.ids()))}
        vectors = index.store.vectors(sorted(before))
    (docs / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[1:]))
    from vecplug.indexer.encoder import Encoder

    encoded: list[str] = []
    real = Encoder.encode_documents
    monkeypatch.setattr(Encoder, "encode_documents",
                        lambda self, texts, **kw: encoded.extend(texts) or real(self, texts, **kw))
    with vecplug.create_index(docs, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (0, 2, 1)
    assert encoded == []
    with vecplug.open_index(str(tmp_path / "idx")) as index:
        after = {r.id: r for r in index.store.get(list(index.store.ids()))}
        assert {i: r.position for i, r in after.items()} == {"a.jsonl#r1": 1, "a.jsonl#r2": 2}
        assert {i: before[i].position for i in after} == {"a.jsonl#r1": 2, "a.jsonl#r2": 3}
        np.testing.assert_array_equal(index.store.vectors(sorted(after)), vectors[1:])


def test_records_without_an_id_keep_their_vectors_when_lines_above_them_change(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSONL record without an id is named by its line: a line added above it made it a new
    document, encoded again (every record below a line added at the top of a file). It takes
    its new line with the vector it had, as a clean build would name it; lines removed above
    it alike, and the old lines left over are removed."""
    docs = tmp_path / "docs"
    docs.mkdir()
    lines = [json.dumps({"text": f"record number {i} about water"}) + "\n" for i in range(3)]
    (docs / "a.jsonl").write_text("".join(lines))
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=settings) as index:
        vectors = index.store.vectors([f"a.jsonl#L{i}" for i in (1, 2, 3)])
    from vecplug.indexer.encoder import Encoder

    encoded: list[str] = []
    real = Encoder.encode_documents
    monkeypatch.setattr(Encoder, "encode_documents",
                        lambda self, texts, **kw: encoded.extend(texts) or real(self, texts, **kw))
    (docs / "a.jsonl").write_text(json.dumps({"text": "a line added at the top"}) + "\n" + "".join(lines))
    with vecplug.create_index(docs, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (1, 3, 0)
        assert encoded == ["a line added at the top"]
        after = {r.id: (r.text, r.position) for r in index.store.get(list(index.store.ids()))}
        assert after == {"a.jsonl#L1": ("a line added at the top", 1),
                         **{f"a.jsonl#L{i + 2}": (f"record number {i} about water", i + 2) for i in range(3)}}
        np.testing.assert_array_equal(index.store.vectors([f"a.jsonl#L{i}" for i in (2, 3, 4)]), vectors)
    encoded.clear()
    (docs / "a.jsonl").write_text("".join(lines[1:]))
    with vecplug.create_index(docs, settings=settings) as index:
        assert (index.report.documents, index.report.unchanged, index.report.removed) == (0, 2, 2)
        assert encoded == []
        assert sorted(index.store.ids()) == ["a.jsonl#L1", "a.jsonl#L2"]
        np.testing.assert_array_equal(index.store.vectors(["a.jsonl#L1", "a.jsonl#L2"]), vectors[1:])


def test_a_document_of_undetermined_language_is_unchanged_on_a_second_run(tmp_path: Path, tiny_model: Path) -> None:
    """Stores read an undetermined language back as None where the document says "und":
    the same document again is still unchanged, not encoded again on every run."""
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    docs = [Document("x#0", "1234 5678", "x.txt", 0, "und"), Document("y#0", "water boils", "y.txt", 0, "en")]
    with vecplug.create_index(settings=settings) as index:
        assert index.add_documents(docs).documents == 2
        again = index.add_documents(docs)
        assert (again.documents, again.unchanged) == (0, 2)


def test_where_the_index_goes(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """path= beside settings= was dropped (the index went to ./.vecplug); "~/idx" from YAML or
    the environment made a folder named "~"; a collection named for a folder index was ignored
    (two corpora given two collections merged into one index)."""
    settings = vecplug.load_settings(overrides={"model": {"document": str(tiny_model)}}, environ={})
    docs = [Document("a", "water boils", "api", lang="en")]
    with vecplug.create_index(path=str(tmp_path / "given"), settings=settings) as index:
        index.add_documents(docs)
    assert (tmp_path / "given" / "manifest.json").is_file() and not Path(".vecplug").exists()
    with vecplug.open_index(str(tmp_path / "given"), settings=settings) as index:
        assert index.store.count() == 1
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = vecplug.load_settings(overrides={"index": {"path": "~/idx"}, "model": {"document": str(tiny_model)}},
                                 environ={})
    with vecplug.create_index(settings=home) as index:
        index.add_documents(docs)
    assert (tmp_path / "home" / "idx" / "manifest.json").is_file() and not Path("~").exists()
    for store in ("hnswlib", "qdrant"):
        named = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / store), "store": store,
                                                           "collection": "books"},
                                                 "model": {"document": str(tiny_model)}}, environ={})
        with pytest.raises(vecplug.ConfigError, match="names a collection on a Qdrant server"):
            vecplug.create_index(settings=named)


def test_a_failed_add_keeps_the_statistics_with_the_writes(tmp_path: Path, tiny_model: Path) -> None:
    """A list is checked whole before anything is written; a stream that fails part-way leaves its
    finished batches staged, and the statistics that count them stay with them (they were
    dropped, so the next commit wrote 300 documents with statistics of 44)."""
    from vecplug.indexer.pipeline import BATCH_SIZE
    from vecplug.verify import verify_index

    settings = _settings_at(tmp_path / "idx", tiny_model)
    total, bad = BATCH_SIZE + 44, BATCH_SIZE + 24  # one batch finished before the bad item
    docs = [Document(f"d{i}", f"water text number {i}", "api", i, "en") for i in range(total)]
    with vecplug.create_index(settings=settings) as index:
        with pytest.raises(vecplug.VecplugError, match=rf"documents\[{bad}\] is str"):
            index.add_documents(docs[:bad] + ["oops"] + docs[bad:])  # type: ignore[list-item]
        assert index.store.count() == 0
        with pytest.raises(vecplug.VecplugError, match=rf"documents\[{bad}\] is str"):
            index.add_documents(d for d in docs[:bad] + ["oops"] + docs[bad:])  # type: ignore[misc]
        assert index.store.count() == BATCH_SIZE  # the finished batch committed, with its statistics
        assert index.search("water text", k=3)  # a search between: the means follow the commit
        report = index.add_documents(docs)
        assert index.store.count() == total and index.language_stats.counts == {"en": total}
        assert report.documents + report.unchanged == total
    report = verify_index(settings)
    assert report.ok, report.problems


def test_a_document_s_source_and_position_are_checked(tmp_path: Path, tiny_model: Path) -> None:
    """A position of 3.0 or "7", or a source of 5, was committed as SQLite coerced it: its row
    checksum never matched again, and verify and every search reaching it called the index
    damaged; a numpy position or a Path source were tracebacks. A path and a numpy integer are
    taken as what they are; the rest is reported and skipped."""
    from vecplug.verify import verify_index

    settings = _settings_at(tmp_path / "idx", tiny_model)
    odd = [Document("float", "water one", "api", 3.0, "en"), Document("str", "water two", "api", "7", "en"),
           Document("bool", "water three", "api", True, "en"), Document("int-src", "water four", 5, 0, "en"),
           Document("huge", "water five", "api", 2**70, "en"),
           Document("surrogate", "water six", "api\udc80", 0, "en")]
    fine = [Document("np", "water seven", "api", np.int64(4), "en"),
            Document("path", "water eight", tmp_path / "notes.txt", 1, "en")]
    with vecplug.create_index(settings=settings) as index:
        report = index.add_documents(odd + fine)
        assert report.documents == 2 and len(report.problems) == 6
        reasons = [p.reason for p in report.problems]
        assert reasons[0] == "document 'float': its position must be an integer of 64 bits, not 3.0: skipped"
        assert reasons[3] == "document 'int-src': its source must be a string, not int: skipped"
        assert "lone surrogate" in reasons[5]
        assert [h.id for h in index.search("water", k=5).hits] and index.store.get(["path"])[0].source == str(
            tmp_path / "notes.txt")
    assert verify_index(settings).ok


def test_payloads_json_cannot_carry_are_reported_and_a_torn_run_stops_the_handle(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A date or a numpy number in a payload failed half-way through hnswlib's writes (rows
    staged without vectors: every later search failed); it is reported and the document
    skipped. A run that stops in the middle of a batch's writes leaves the handle refusing
    further writes rather than committing them half done."""
    import datetime

    from vecplug.verify import verify_index

    settings = _settings_at(tmp_path / "idx", tiny_model)
    docs = [Document(f"d{i}", f"water text number {i}", "api", i, "en") for i in range(10)]
    odd = [Document("date", "a dated note", "api", 10, "en", {"when": datetime.date(2026, 1, 1)}),
           Document("np", "a pandas number", "api", 11, "en", {"n": np.int64(3)})]
    with vecplug.create_index(settings=settings) as index:
        report = index.add_documents(docs[:5] + odd + docs[5:])
        assert report.documents == 10
        assert [p.reason for p in report.problems] == [
            "document 'date': a value is a date, which JSON cannot carry (give strings, numbers, booleans, "
            "lists and mappings): skipped",
            "document 'np': a value is a int64, which JSON cannot carry (give strings, numbers, booleans, "
            "lists and mappings): skipped"]
        upsert = index.store.upsert

        def torn(records: Any, vectors: Any) -> None:
            upsert(records[:1], vectors[:1])
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(index.store, "upsert", torn)
        with pytest.raises(OSError):
            index.add_documents([Document("x", "a new one", "api", 12, "en"), Document("y", "another", "api", 13, "en")])
        with pytest.raises(vecplug.VecplugError, match="stopped in the middle of its writes: open the index again"):
            index.add_documents(docs)
    assert verify_index(settings).ok
    with vecplug.open_index(settings=settings) as index:
        assert index.store.count() == 10


def test_writes_from_threads_through_one_index_take_turns(tmp_path: Path, tiny_model: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads sharing one Index may all write: the writes take turns (each takes the last
    commit's language statistics and commits its own, so two at once dropped each other's
    documents from them), and the statistics committed are those of every document held."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from vecplug.adapters.bias import LanguageStats
    from vecplug.indexer import pipeline

    running, overlaps = [0], []
    real_run, real_remove = pipeline.run, pipeline.remove
    guard = threading.Lock()

    def watched(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with guard:
                running[0] += 1
                overlaps.append(running[0])
            time.sleep(0.02)  # room for another thread to come in, were it let
            try:
                return real(*args, **kwargs)
            finally:
                with guard:
                    running[0] -= 1
        return call

    monkeypatch.setattr(pipeline, "run", watched(real_run))
    monkeypatch.setattr(pipeline, "remove", watched(real_remove))
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    langs = ["en", "de", "es", "ru"]
    texts = ["water boils", "der braune fuchs", "el agua hierve", "вода кипит", "the lazy dog"]
    with vecplug.create_index(settings=settings) as index:
        def write(t: int) -> None:
            for j in range(3):
                index.add_documents([Document(f"t{t}-{j}-{i}", f"{texts[i % 5]} {t} {j} {i}", "api", i,
                                              langs[(i + t) % 4]) for i in range(12)])
                index.delete_documents([f"t{t}-{j}-0"])

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(write, range(3)))
    assert overlaps and max(overlaps) == 1  # one write at a time
    with vecplug.open_index(str(tmp_path / "idx")) as index:
        committed, held = LanguageStats.from_manifest(index.manifest), LanguageStats.fit(index.store)
        assert index.store.count() == 3 * 3 * 11 == sum(committed.counts.values())
        assert dict(committed.counts) == dict(held.counts)
        for lang in held.counts:
            np.testing.assert_allclose(committed.means().of(lang), held.means().of(lang), atol=1e-5)


def test_every_error_class_is_exported() -> None:
    from vecplug import errors

    classes = {name for name, c in vars(errors).items()
               if isinstance(c, type) and issubclass(c, errors.VecplugError)}
    assert "QueryError" in classes and classes <= set(vecplug.__all__)
    assert all(getattr(vecplug, name) is getattr(errors, name) for name in classes)


def test_a_mono_query_of_no_language_finds_nothing_in_a_batch(tmp_path: Path, tiny_model: Path) -> None:
    """In a batch, a ``mono`` query whose language is unknown gets no answers and the others
    theirs; alone, it is refused with what to do (QueryError: ``search -`` skips its line)."""
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(settings=settings) as index:
        index.add_documents([Document("a", "water boils", "api", lang="en"),
                             Document("b", "el agua hierve", "api", lang="es")])
        for rerank in ("none", "teacher"):
            found = index.search_batch(["water boils", "xyz", "el agua"], k=2, mode="mono",
                                       langs=["en", "und", "es"], rerank=rerank)
            assert [[h.id for h in r.hits] for r in found] == [["a"], [], ["b"]]
        with pytest.raises(vecplug.QueryError, match="give it with --lang"):
            index.search("xyz", mode="mono", lang="und")


@pytest.mark.parametrize("store", ["hnswlib", "flat", "qdrant"])
def test_a_language_of_one_text_scores_zero_with_the_correction(tmp_path: Path, tiny_model: Path,
                                                                store: str) -> None:
    """A language whose documents are all one text is its own mean: with the language-bias
    correction its documents have no direction left and score 0 whatever the query, by every
    path (the store's scan gave +-15,000: float rounding divided by a distance of ~1e-8)."""
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx"), "store": store},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(settings=settings) as index:
        index.add_documents([Document("a", "water boils", "api", lang="en"),
                             Document("b", "water boils", "api", lang="en")])
        assert index.debias_for(None)
        for query in ("water", "the quick fox", "wasser"):
            result = index.search(query, lang="en")
            assert sorted(h.id for h in result) == ["a", "b"]
            assert [h.score for h in result] == [0.0, 0.0]  # (or -0.0)
            assert [h.score for h in index.search(query, lang="en", consensus=True)] == [0.0, 0.0]
            assert index.score_ids(result.vector, ["a", "b"], "en").tolist() == [0.0, 0.0]
            found = index.search_batch([query] * 70, mode="xy", langs=["en"] * 70)  # (the batch path)
            assert all([h.score for h in r] == [0.0, 0.0] for r in found)
        # another language beside it: its documents rank by their centred cosines as ever
        index.add_documents([Document("c", "el agua hierve", "api", lang="es"),
                             Document("d", "der hund", "api", lang="es")])
        scores = {h.id: h.score for h in index.search("agua", lang="es")}
        assert scores["a"] == scores["b"] and abs(scores["c"]) > 1e-3 and max(map(abs, scores.values())) <= 1.0


def test_an_overlap_over_half_the_index_s_passages_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    """corpus.chunk_overlap alone, over half the passage length the index was built with:
    refused (passages were cut with half of it, while the manifest and the CLI said more)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("water boils at one hundred degrees. " * 20)
    first = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                             "model": {"document": str(tiny_model)},
                                             "corpus": {"chunk_tokens": 40}})
    with vecplug.create_index(docs, settings=first) as index:
        assert index.manifest["corpus"]["chunk_overlap"] <= 20
    again = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                             "corpus": {"chunk_overlap": 25}})
    with pytest.raises(vecplug.ConfigError, match=r"chunk_overlap \(25\) must be at most half of "
                                                  r"corpus.chunk_tokens \(40\): 20 or less"):
        vecplug.create_index(docs, settings=again)
