import codecs
import json
import re
from pathlib import Path

from vecplug.indexer.corpus import CorpusOptions, CorpusReader, chunk


def words(text: str) -> list[tuple[int, int]]:
    """Whitespace tokenizer as character spans: stands in for a model tokenizer."""
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def read(root: Path, **opts) -> tuple[list, list]:
    reader = CorpusReader(root, words, CorpusOptions(**opts))
    docs = list(reader.documents())
    return docs, reader.problems


def test_chunking_covers_text_with_overlap() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    parts = chunk(text, words, size=30, overlap=10)
    assert all(len(p.split()) <= 30 for p in parts)
    assert parts[0].split()[0] == "w0" and parts[-1].split()[-1] == "w99"
    # consecutive passages share the overlap
    assert set(parts[0].split()) & set(parts[1].split())
    covered = {w for p in parts for w in p.split()}
    assert covered == set(text.split())


def test_chunking_prefers_sentence_ends() -> None:
    text = " ".join(["Ein Satz hier."] * 40)
    parts = chunk(text, words, size=20, overlap=0)
    assert all(p.endswith(".") for p in parts)


def test_formats_fields_and_ids(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title A\n\nSome body text here.\n")
    (tmp_path / "b.txt").write_text("plain text file\n")
    (tmp_path / "r.jsonl").write_text(
        json.dumps({"id": "x1", "title": "T", "text": "body", "url": "http://u", "lang": "DE", "tag": 3}) + "\n"
        + json.dumps({"description": "only a description"}) + "\n")
    (tmp_path / "p.csv").write_text('id,title,description,url\nc1,"Paris","Capital, of France",http://p\n')
    (tmp_path / "ignored.pdf").write_bytes(b"%PDF")
    docs, problems = read(tmp_path)
    assert problems == []
    by_id = {d.id: d for d in docs}
    assert set(by_id) == {"a.md#0", "b.txt#0", "r.jsonl#x1", "r.jsonl#L2", "p.csv#c1"}
    assert by_id["a.md#0"].payload == {"title": "Title A"}
    rec = by_id["r.jsonl#x1"]
    assert rec.text == "T\nbody" and rec.lang == "de"
    assert rec.payload == {"id": "x1", "title": "T", "url": "http://u", "tag": 3}
    assert by_id["p.csv#c1"].text == "Paris\nCapital, of France"
    assert by_id["p.csv#c1"].payload["url"] == "http://p"
    # ids are stable across runs
    assert [d.id for d in read(tmp_path)[0]] == [d.id for d in docs]


def test_bad_input_is_reported_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("fine text")
    (tmp_path / "latin1.txt").write_bytes("line one\ncaf\xe9".encode("latin-1"))
    (tmp_path / "empty.md").write_text("  \n")
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01\x02abc")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok one"}\n{"text": broken\n[1, 2]\n{"text": NaN}\n{"title": null}\n{"text": "ok two"}\n')
    (tmp_path / "bad.csv").write_text('id,text\n1,fine\n2,too,many\n3,"also fine"\n')
    outside = tmp_path.parent / "outside.txt"
    outside.write_text("secret")
    (tmp_path / "link.txt").symlink_to(outside)
    docs, problems = read(tmp_path)
    texts = sorted(d.text for d in docs)
    assert texts == ["also fine", "fine", "fine text", "ok one", "ok two"]
    where = {(p.path, p.line) for p in problems}
    assert ("latin1.txt", 2) in where
    assert ("empty.md", None) in where
    assert ("binary.txt", None) in where
    assert {("bad.jsonl", 2), ("bad.jsonl", 3), ("bad.jsonl", 4), ("bad.jsonl", 5)} <= where
    assert ("bad.csv", 3) in where
    assert ("link.txt", None) in where
    assert all("secret" not in d.text for d in docs)


def test_encodings_and_newlines(tmp_path: Path) -> None:
    (tmp_path / "bom8.txt").write_bytes(codecs.BOM_UTF8 + "Grüße\r\naus Köln".encode())
    (tmp_path / "bom16.txt").write_bytes("Привет мир".encode("utf-16"))
    docs, problems = read(tmp_path)
    assert problems == []
    assert sorted(d.text for d in docs) == ["Grüße\naus Köln", "Привет мир"]


def test_hidden_folders_skipped_and_file_limit(tmp_path: Path) -> None:
    (tmp_path / ".vecplug").mkdir()
    (tmp_path / ".vecplug" / "x.txt").write_text("index internals")
    (tmp_path / "big.txt").write_text("x" * 2000)
    docs, problems = read(tmp_path, max_file_bytes=1000)
    assert docs == []
    assert [p.path for p in problems] == ["big.txt"]
