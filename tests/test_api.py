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
