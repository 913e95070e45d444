"""The Python API, as the README shows it."""
from __future__ import annotations

from pathlib import Path

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


def test_open_missing_index() -> None:
    with pytest.raises(vecplug.IndexNotFoundError):
        vecplug.open_index("nowhere")


def test_reindexing_a_folder_follows_its_changes(tmp_path: Path, tiny_model: Path) -> None:
    """vecplug index on the same folder again: new and edited files encoded, unchanged ones
    skipped, deleted ones removed, an unreadable one keeps its last good version; a run with
    no change writes nothing; another folder given to the index adds without removing."""
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
    report, ids, _ = run(other)
    assert report.removed == 0 and "z.txt#0" in ids and "a.txt#0" in ids
