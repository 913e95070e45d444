"""Hostile input (reliability property 7): a fixture corpus where every nasty case has one
documented outcome (see the table in ``vecplug.indexer.corpus``): decoded, or skipped and
reported by path (and line); memory stays bounded and the good files beside them are read.
"""
from __future__ import annotations

import codecs
import csv
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from vecplug.indexer import corpus
from vecplug.indexer.corpus import CorpusOptions, CorpusReader, read_at_most
from vecplug.types import Document, Problem

LIMIT = 200_000  # max_file_bytes of the fixture: small, so "huge" files stay small
# FIFOs, symlinks, undecodable file names and SIGALRM
pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file system features")


def words(text: str) -> list[tuple[int, int]]:
    """Whitespace tokenizer as character spans: stands in for a model tokenizer."""
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def read(root: Path, **opts) -> tuple[list[Document], list[Problem]]:
    reader = CorpusReader(root, words, CorpusOptions(**opts))
    docs = list(reader.documents())
    return docs, reader.problems


class Hung(Exception):
    """Not TimeoutError: that is an OSError, which the reader reports as "cannot read"."""


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A FIFO opened for reading, or a regex gone quadratic, would hang: fail instead."""
    def stuck(*_: object) -> None:
        raise Hung("the corpus reader hung")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def jsonl(*objs: object) -> str:
    return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs)


def nest(levels: int) -> object:
    """A value ``levels`` containers deep (lists around a string)."""
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


def make_fixture(base: Path) -> Path:
    """The hostile corpus, in ``base/corpus``; ``base/outside`` holds what must never be read."""
    root, outside = base / "corpus", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret")

    # -- good files, which must all be read beside the hostile ones --
    (root / "good.txt").write_text("Good text one.\n")
    (root / "good.jsonl").write_text(jsonl({"id": "g1", "text": "good record one"},
                                           {"id": "g2", "title": "Two", "text": "good record two"}))
    (root / "sub").mkdir()
    (root / "sub" / "good.md").write_text("# Sub title\n\nSub body.\n")

    # -- encodings and line breaks --
    (root / "invalid_utf8.txt").write_bytes(b"ok line\nbad \xff byte\n")
    (root / "bom8.txt").write_bytes(codecs.BOM_UTF8 + "Grüße\r\naus Köln".encode())
    (root / "bom16le.txt").write_bytes(codecs.BOM_UTF16_LE + "utf16 le ✓".encode("utf-16-le"))
    (root / "bom16be.txt").write_bytes(codecs.BOM_UTF16_BE + "utf16 be ✓".encode("utf-16-be"))
    (root / "bom32.txt").write_bytes("utf32 ✓".encode("utf-32"))
    (root / "utf16_nobom.txt").write_bytes("no bom here".encode("utf-16-le"))
    (root / "utf16_bad.txt").write_bytes(codecs.BOM_UTF16_LE + "ab\ncd".encode("utf-16-le") + b"\x00")
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\rthree\n")
    (root / "separators.txt").write_text("form\x0cfeed and line\u2028separator")

    # -- empty, binary, NUL --
    (root / "empty.txt").write_bytes(b"")
    (root / "blank.md").write_text("  \n\t\n")
    (root / "bomonly.txt").write_bytes(codecs.BOM_UTF8)
    (root / "binary.md").write_bytes(bytes(range(256)) * 4)
    (root / "late_nul.txt").write_bytes(b"a " * 5000 + b"\nline two \x00 here\n")

    # -- size: the limit is inclusive; beyond it nothing is read --
    (root / "at_limit.txt").write_text(" ".join(f"w{i}" for i in range(LIMIT))[:LIMIT - 1] + "x")
    (root / "over_limit.txt").write_bytes(b"y" * (LIMIT + 1))
    # a Markdown heading with thousands of blanks: the former title regex took minutes
    (root / "slow_title.md").write_text("# a" + " " * 5000 + "b\n\nBody after the heading.\n")

    # -- JSONL: one record per line, each bad line reported with its number --
    records = [
        {"id": "r1", "text": "first good " + "pad " * 2500},  # 1: pushes NULs past the sniff
        '{"id": "r2", "text": broken',                            # 2: malformed
        '{"id": "r3", "text": NaN}',                              # 3
        '{"id": "r4", "text": "x", "text": "y"}',                 # 4: duplicate key
        '{"id": "r5", "text": "ok", "meta": {"a": 1, "a": 2}}',   # 5: duplicate, nested
        '{"id": "r6", "text": "big", "n": 1e999}',                # 6: overflows to inf
        '{"id": "r7", "text": "neg", "n": -Infinity}',            # 7
        {"id": "../../etc/passwd", "text": "dotdot id"},          # 8: a label, kept
        {"id": "/abs/path", "text": "absolute id"},               # 9
        {"id": "C:\\win\\path", "text": "windows id"},            # 10
        {"id": "tab\tid", "text": "control char id"},             # 11
        {"id": "new\nline", "text": "newline id"},                # 12
        {"id": "rtl\u202etxt.exe", "text": "bidi id"},            # 13
        {"id": 3.5, "text": "float id"},                          # 14
        {"id": True, "text": "bool id"},                          # 15
        {"id": 42, "text": "int id"},                             # 16
        {"id": "x" * 600, "text": "long id"},                     # 17
        '{"text": "lone \\ud800 surrogate"}',                     # 18: escaped
        '{"text": "escaped \\u0000 nul"}',                        # 19
        b'{"text": "raw \x00 nul"}',                              # 20
        b'{"text": "caf\xe9 latin-1"}',                           # 21
        "[" * 5000 + "]" * 5000,                                  # 22: too deep
        '{"text": "digits", "n": ' + "1" * 5000 + "}",            # 23
        {"text": "sep\u2028in\x85side"},                          # 24: not line breaks
        "",                                                       # 25: blank, ignored
        '[1, 2]',                                                 # 26
        '{"title": null}',                                        # 27
        {"id": "r28", "text": "last good"},                       # 28
        {"id": "r29", "text": "too deep", "m": nest(64)},         # 29: 65 levels, the record's
        {"id": "r30", "text": "deep enough", "m": nest(63)},      # 30: 64 levels: kept
        '{"id": "r31", "text": "u64", "n": 9223372036854775808}', # 31: past signed 64 bits
        {"id": "r32", "text": "i64", "n": -2**63, "m": 2**63 - 1},  # 32: kept
    ]
    def raw(r: object) -> bytes:  # bytes and str lines as written; objects as JSON
        if isinstance(r, bytes):
            return r
        return (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)).encode()

    (root / "records.jsonl").write_bytes(b"".join(raw(r) + b"\n" for r in records))
    (root / "huge_line.jsonl").write_text(jsonl({"id": "h", "text": "long " * 25_000})
                                          + '{"text": "' + "z" * 50_000 + "\n")

    # -- CSV --
    (root / "table.csv").write_bytes(
        b"id,title,text\n"                                       # 1
        b"c1,Good,first good row\n"                              # 2
        b"c2,Big," + b"f" * 3000 + b"\n"                         # 3: over csv_field_limit
        b'c3,Quoted,"bad"quote\n'                                # 4: strict quoting
        b"c4,Cells,a,b\n"                                        # 5: a cell too many
        b'c5,Multi,"line one\nline two"\n'                       # 6-7
        b"c6,Bytes,caf\xe9\n"                                    # 8
        b"c7,Sep,sep\xe2\x80\xa8here\n"                          # 9: U+2028 in a field
        b"../c8,Path,dotdot csv id\n"                            # 10
        b"c9,Last,last good row\n"                               # 11
        b'c10,Open,"unclosed quote\n'                            # 12: to the end
        b"c11,After,read on after the unclosed quote\n")         # 13
    (root / "dup_header.csv").write_text("id,text,text\n1,a,b\n")

    # -- symlinks --
    (root / "a").mkdir()
    (root / "a" / "inside.txt").write_text("inside text")
    os.symlink("..", root / "a" / "loop")                         # a loop
    os.symlink("a", root / "linked_dir")                          # a folder inside
    os.symlink(outside, root / "outdir")                          # a folder outside
    os.symlink(outside / "secret.txt", root / "out.txt")          # a file outside
    os.symlink("nowhere.txt", root / "broken.txt")
    os.symlink("self.txt", root / "self.txt")
    os.symlink("pong.txt", root / "ping.txt")
    os.symlink("ping.txt", root / "pong.txt")
    os.symlink("good.txt", root / "alias.txt")                    # a file inside: read

    # -- special files and names --
    os.mkfifo(root / "pipe.txt")
    fd = os.open(os.fsencode(root) + b"/bad\xffname.txt", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"bad name")
    os.close(fd)
    (root / "new\nline.txt").write_text("forged report line")
    os.mkdir(os.fsencode(root) + b"/dir\xfe")
    (Path(os.fsdecode(os.fsencode(root) + b"/dir\xfe")) / "x.txt").write_text("in a bad folder")

    # -- ignored without a report --
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.txt").write_text("index internals")
    (root / ".dot.txt").write_text("hidden file")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00")
    return root


# (path, line) -> what the reason says, for every problem the fixture must give; nothing else
EXPECTED_PROBLEMS = {
    ("invalid_utf8.txt", 2): "not valid UTF-8",
    ("utf16_nobom.txt", None): "binary",
    ("utf16_bad.txt", 2): "not valid UTF-16",
    ("empty.txt", None): "empty",
    ("blank.md", None): "empty",
    ("bomonly.txt", None): "empty",
    ("binary.md", None): "binary",
    ("late_nul.txt", 2): "NUL",
    ("over_limit.txt", None): f"file of {LIMIT + 1} bytes exceeds the limit of {LIMIT}",
    ("records.jsonl", 2): "malformed JSON",
    ("records.jsonl", 3): "NaN is not valid JSON",
    ("records.jsonl", 4): "duplicate key 'text'",
    ("records.jsonl", 5): "duplicate key 'a'",
    ("records.jsonl", 6): "out of range",
    ("records.jsonl", 7): "-Infinity is not valid JSON",
    ("records.jsonl", 11): "U+0009",
    ("records.jsonl", 12): "U+000A",
    ("records.jsonl", 13): "U+202E",
    ("records.jsonl", 14): "not float",
    ("records.jsonl", 15): "not bool",
    ("records.jsonl", 17): "longer than 512",
    ("records.jsonl", 18): "lone surrogate",
    ("records.jsonl", 19): "\\u0000",
    ("records.jsonl", 20): "NUL character",
    ("records.jsonl", 21): "not valid UTF-8",
    ("records.jsonl", 22): "nested too deeply",
    ("records.jsonl", 23): "digits",
    ("records.jsonl", 26): "must be an object",
    ("records.jsonl", 27): "none of the fields",
    ("records.jsonl", 29): "nests deeper than 64 levels",
    ("records.jsonl", 31): "outside signed 64 bits",
    ("huge_line.jsonl", 2): "malformed JSON",
    ("table.csv", 3): "field larger than field limit (1000)",
    ("table.csv", 4): "malformed CSV",
    ("table.csv", 5): "more cells than the header",
    ("table.csv", 8): "not valid UTF-8",
    ("table.csv", 12): "unexpected end of data",
    ("dup_header.csv", 1): "column 'text' appears twice",
    ("a/loop", None): "symlinked folder: not followed",
    ("linked_dir", None): "symlinked folder: not followed",
    ("outdir", None): "symlinked folder: not followed",
    ("out.txt", None): "symlink out of the folder",
    ("broken.txt", None): "symlink out of the folder, broken",
    ("self.txt", None): "in a loop",
    ("ping.txt", None): "in a loop",
    ("pong.txt", None): "in a loop",
    ("pipe.txt", None): "not a regular file",
    ("bad\\xffname.txt", None): "not valid UTF-8 or holds control characters",
    ("new\\nline.txt", None): "not valid UTF-8 or holds control characters",
    ("dir\\xfe", None): "not valid UTF-8 or holds control characters",
}

EXPECTED_IDS = {
    "good.txt#0", "alias.txt#0", "good.jsonl#g1", "good.jsonl#g2", "sub/good.md#0", "a/inside.txt#0",
    "bom8.txt#0", "bom16le.txt#0", "bom16be.txt#0", "bom32.txt#0", "crlf.txt#0", "separators.txt#0",
    "slow_title.md#0",
    "records.jsonl#r1", "records.jsonl#../../etc/passwd", "records.jsonl#/abs/path",
    "records.jsonl#C:\\win\\path", "records.jsonl#42", "records.jsonl#L24", "records.jsonl#r28",
    "records.jsonl#r30", "records.jsonl#r32",
    "huge_line.jsonl#h",
    "table.csv#c1", "table.csv#c5", "table.csv#c7", "table.csv#../c8", "table.csv#c9",
    "table.csv#c11",
}


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, list[Document], list[Problem]]:
    root = make_fixture(tmp_path)
    docs, problems = read(root, max_file_bytes=LIMIT, csv_field_limit=1000, chunk_tokens=50,
                          chunk_overlap=5)
    return root, docs, problems


def test_every_hostile_case_has_its_one_outcome(hostile) -> None:
    _, docs, problems = hostile
    found = {(p.path, p.line): p.reason for p in problems}
    assert len(found) == len(problems), "one problem per case"
    assert set(found) == set(EXPECTED_PROBLEMS)
    for where, says in EXPECTED_PROBLEMS.items():
        assert says in found[where], (where, found[where])

    ids = {d.id for d in docs}
    passages = {d.id for d in docs if d.source == "at_limit.txt"}
    assert ids - passages == EXPECTED_IDS
    assert len(docs) == len(ids), "no document twice"


def test_the_good_files_are_read_whole(hostile) -> None:
    _, docs, _ = hostile
    by_id = {d.id: d for d in docs}
    assert by_id["good.txt#0"].text == "Good text one."
    assert [by_id[f"good.jsonl#g{i}"].text for i in (1, 2)] == ["good record one", "Two\ngood record two"]
    assert by_id["sub/good.md#0"].text == "# Sub title\n\nSub body."
    assert by_id["a/inside.txt#0"].text == "inside text"  # read once, not through the links
    assert by_id["alias.txt#0"].text == "Good text one."  # a symlink to a file inside


def test_decoded_cases(hostile) -> None:
    _, docs, _ = hostile
    text = {d.id: d.text for d in docs}
    assert text["bom8.txt#0"] == "Grüße\naus Köln"
    assert text["bom16le.txt#0"] == "utf16 le ✓"
    assert text["bom16be.txt#0"] == "utf16 be ✓"
    assert text["bom32.txt#0"] == "utf32 ✓"
    assert text["crlf.txt#0"] == "one\ntwo\nthree"  # CRLF and a lone CR are line breaks
    assert text["separators.txt#0"] == "form\x0cfeed and line\u2028separator"  # kept as is
    # U+2028 and U+0085 inside JSON strings and CSV fields do not split lines: numbering holds
    assert text["records.jsonl#L24"] == "sep\u2028in\x85side"
    assert {d.id: d.position for d in docs}["records.jsonl#r28"] == 28
    assert text["table.csv#c7"] == "Sep\nsep\u2028here"
    assert text["table.csv#c5"] == "Multi\nline one\nline two"
    # a heading too long for a title is left in the text, not glued to every passage
    slow = next(d for d in docs if d.source == "slow_title.md")
    assert slow.payload == {} and slow.text.endswith("Body after the heading.")


def test_ids_are_labels_never_paths(hostile) -> None:
    root, docs, _ = hostile
    by_id = {d.id: d for d in docs}
    for rid in ("../../etc/passwd", "/abs/path", "C:\\win\\path"):
        doc = by_id[f"records.jsonl#{rid}"]
        assert doc.source == "records.jsonl" and doc.payload["id"] == rid
    assert by_id["table.csv#../c8"].source == "table.csv"
    # the reader writes nothing, anywhere: the trees it was given are as they were
    before = sorted(os.fsencode(p) for p in root.parent.rglob("*"))
    read(root, max_file_bytes=LIMIT, csv_field_limit=1000)
    assert sorted(os.fsencode(p) for p in root.parent.rglob("*")) == before


def test_nothing_outside_the_folder_is_read(hostile) -> None:
    _, docs, _ = hostile
    assert all("outside secret" not in d.text for d in docs)
    assert all(not d.source.startswith(("..", "/")) for d in docs)


def test_reports_and_labels_are_printable_text(hostile) -> None:
    _, docs, problems = hostile
    for p in problems:
        assert p.path.isprintable() and "\n" not in str(p)
        str(p).encode("utf-8")  # no lone surrogate: a report can always be printed
    for d in docs:
        for label in (d.id, d.source, d.text):
            label.encode("utf-8")  # storable: the stores encode to UTF-8


def test_a_file_at_the_limit_is_read_and_chunked(tmp_path: Path) -> None:
    """One long line just under (at) the limit: read, cut into passages, all words kept,
    the tokenizer never asked for more than a block."""
    line = " ".join(f"w{i}" for i in range(40_000))[:LIMIT]
    (tmp_path / "long.txt").write_text(line)
    asked = []

    def spy(text: str) -> list[tuple[int, int]]:
        asked.append(len(text))
        return words(text)

    reader = CorpusReader(tmp_path, spy, CorpusOptions(max_file_bytes=LIMIT, chunk_tokens=100,
                                                       chunk_overlap=10))
    docs = list(reader.documents())
    assert reader.problems == []
    assert len(docs) > 300 and all(len(d.text.split()) <= 100 for d in docs)
    assert {w for d in docs for w in d.text.split()} == set(line.split())
    assert max(asked) <= corpus.BLOCK_CHARS < len(line)

    (tmp_path / "long.txt").write_text(line + "!")
    docs, problems = read(tmp_path, max_file_bytes=LIMIT)
    assert docs == [] and [(p.path, p.line) for p in problems] == [("long.txt", None)]


def test_reading_stops_one_byte_past_the_limit() -> None:
    """A file that grows (or a size that lies): never more than limit + 1 bytes are read."""
    r, w = os.pipe()
    try:
        os.write(w, b"g" * 5000)
        got = read_at_most(r, 1000)
        assert len(got) == 1001
        assert len(os.read(r, 10_000)) == 5000 - 1001  # the rest was left unread
    finally:
        os.close(r)
        os.close(w)


def test_a_file_that_grows_while_read_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "grows.txt").write_text("g " * 1000)
    real_fstat = os.fstat

    class Small:  # what fstat said before the file grew
        def __init__(self, fd: int) -> None:
            self._real = real_fstat(fd)
            self.st_size = 10

        def __getattr__(self, name: str) -> object:
            return getattr(self._real, name)

    monkeypatch.setattr(corpus.os, "fstat", Small)
    docs, problems = read(tmp_path, max_file_bytes=100)
    assert docs == []
    assert [(p.path, p.reason) for p in problems] == [("grows.txt", "file grew past 100 bytes while read")]


def test_csv_field_limit_is_not_left_changed(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("id,text\n1,one\n2,two\n")
    before = csv.field_size_limit()
    reader = CorpusReader(tmp_path, words, CorpusOptions(csv_field_limit=10))
    docs = reader.documents()
    next(docs)
    assert csv.field_size_limit() == before  # also between two records
    assert [d.id for d in docs] == ["t.csv#2"]
    assert csv.field_size_limit() == before



def test_an_unclosed_quote_over_the_field_limit_loses_only_its_record(tmp_path: Path) -> None:
    # the open field hits the size limit long before the end: read on after its first line
    good = "".join(f"g{i},good row {i}\n" for i in range(300))
    (tmp_path / "t.csv").write_text('id,text\nx,"unclosed\n' + good)
    docs, problems = read(tmp_path, csv_field_limit=1000)
    assert [(p.line, p.reason) for p in problems] == [
        (2, "malformed CSV: field larger than field limit (1000)")]
    assert [d.id for d in docs] == [f"t.csv#g{i}" for i in range(300)]


def test_csv_quotes_opening_on_every_line_are_read_in_linear_time(tmp_path: Path) -> None:
    # each line opens a quote, also from inside one (x"," closes it and "y opens the next):
    # going back to the next line after each would read the rest again every time
    n = 40_000
    (tmp_path / "open.csv").write_text("id,text\n" + 'n,x","y\n' * n)
    # the same, running into a bad quote (a"b: bad inside a quote only), then into a field
    # over the limit: going back after that is budgeted, then read on after the long line
    (tmp_path / "bad.csv").write_text("id,text\n" + 'n,x","y\n' * n + 'last,a"b\nok,read\n')
    (tmp_path / "limit.csv").write_text("id,text\n" + 'n,x","y\n' * n + "z" * 2000 + "\nok,read\n")
    docs, problems = read(tmp_path, csv_field_limit=1000, max_problems_per_file=3)
    assert [(p.path, p.line) for p in problems] == [
        ("bad.csv", 2), ("bad.csv", 3), ("bad.csv", 4), ("bad.csv", None),
        ("limit.csv", 2), ("limit.csv", 3),
        ("open.csv", 2), ("open.csv", 3), ("open.csv", 4), ("open.csv", None)]
    assert all("',' expected after '\"'" in p.reason for p in problems[:3])
    assert all("field limit" in p.reason for p in problems[4:6])
    assert all("unexpected end of data" in p.reason for p in problems[6:9])
    assert problems[3].reason == problems[-1].reason == f"{n - 3} more problems in this file not listed"
    assert [d.id for d in docs] == ["bad.csv#last", "bad.csv#ok", "limit.csv#ok"]


def test_problems_per_file_are_capped(tmp_path: Path) -> None:
    (tmp_path / "junk.jsonl").write_text("not json\n" * 250 + '{"text": "survivor"}\n')
    docs, problems = read(tmp_path, max_problems_per_file=10)
    assert [d.text for d in docs] == ["survivor"]
    assert [p.line for p in problems] == list(range(1, 11)) + [None]
    assert problems[-1].reason == "240 more problems in this file not listed"


def test_a_very_deep_tree_is_walked(tmp_path: Path) -> None:
    folders = [tmp_path / "d"]
    for _ in range(1099):  # os.walk recursed, and raised RecursionError here
        folders.append(folders[-1] / "d")
    try:
        for folder in folders:
            folder.mkdir()  # one by one: mkdir(parents=True) recurses too
        (folders[-1] / "bottom.txt").write_text("at the bottom")
        docs, problems = read(tmp_path)
        assert problems == [] and [d.text for d in docs] == ["at the bottom"]
    finally:
        # bottom up, here: pytest's own clean-up (shutil.rmtree) recurses and would fail
        (folders[-1] / "bottom.txt").unlink(missing_ok=True)
        for folder in reversed(folders):
            if folder.exists():
                folder.rmdir()


def test_unreadable_files_and_folders_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "x.txt").write_text("cannot see")
    (tmp_path / "secret.txt").write_text("cannot read")
    (tmp_path / "ok.txt").write_text("fine")
    real_scandir, real_open = os.scandir, os.open

    def scandir(path):  # as root, chmod 000 would not stop us: refuse like the kernel would
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    def open_(path, flags, *args):
        if Path(path).name == "secret.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(corpus.os, "scandir", scandir)
    monkeypatch.setattr(corpus.os, "open", open_)
    docs, problems = read(tmp_path)
    assert [d.text for d in docs] == ["fine"]
    assert {(p.path, p.reason) for p in problems} == {
        ("locked", "cannot list folder: Permission denied"),
        ("secret.txt", "cannot read: Permission denied")}


def test_walk_order_is_sorted_and_stable(hostile) -> None:
    root, docs, problems = hostile
    again, again_problems = read(root, max_file_bytes=LIMIT, csv_field_limit=1000, chunk_tokens=50,
                                 chunk_overlap=5)
    assert [d.id for d in again] == [d.id for d in docs]
    assert again_problems == problems
    sources = list(dict.fromkeys(d.source for d in docs))
    top = [s for s in sources if "/" not in s]
    assert top == sorted(top)


def test_documents_no_store_can_keep_are_reported_and_the_index_stays_sound(tmp_path: Path) -> None:
    """A JSONL field nested 126 deep (the JSON parser takes ~1000; embedded Qdrant's engine
    failed on it after the commit point, and the index never opened again), an integer beyond
    64 bits, and API documents with the same: each reported by path and line and skipped, the
    rest indexed, and the index opens."""
    pytest.importorskip("qdrant_edge")
    from conftest import FakeEncoder
    from vecplug.adapters.stores import Record
    from vecplug.adapters.stores.qdrant import QdrantStore
    from vecplug.indexer import pipeline

    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.txt").write_text("river mountain city bread train music")
    (root / "r.jsonl").write_text(jsonl({"id": "r1", "text": "winter garden", "meta": nest(126)},
                                        {"id": "r2", "text": "ocean", "n": 12345678901234567890123},
                                        {"id": "r3", "text": "summer field"}))
    given = [Document("api#0", "api text", "api.txt", 7, None, {"m": nest(100)}),
             Document("api#1", "api text two", "api.txt", 8, None, {"n": -2**64}),
             Document("api#2", "api text three", "api.txt", 9, None, {"n": 2**63 - 1})]
    reader = CorpusReader(root, words, CorpusOptions())
    index = str(tmp_path / "index")
    store = QdrantStore.create(index, 16, {}, {})
    try:
        report = pipeline.run([*reader.documents(), *given], FakeEncoder(16), store,
                              Record.from_document, None, progress=False)
    finally:
        store.close()
    problems = {(p.path, p.line): p.reason for p in [*reader.problems, *report.problems]}
    assert set(problems) == {("r.jsonl", 1), ("r.jsonl", 2), ("api.txt", 7), ("api.txt", 8)}
    assert "nests deeper than 64" in problems["r.jsonl", 1] and "64 bits" in problems["r.jsonl", 2]
    assert "nests deeper than 64" in problems["api.txt", 7] and "64 bits" in problems["api.txt", 8]
    store = QdrantStore.open(index, {})
    try:
        assert sorted(store.ids()) == ["a.txt#0", "api#2", "r.jsonl#r3"]
    finally:
        store.close()
