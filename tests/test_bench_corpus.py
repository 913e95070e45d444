"""benchmarks/debian_corpus.py: its parsers, and a whole run against a tiny file:// mirror."""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from conftest import REPO


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import debian_corpus

    return debian_corpus


TRANSLATION = """Package: grep
Description-md5: 0123456789abcdef0123456789abcdef
Description-de: Sucht Zeichenketten in Dateien
 Grep durchsucht Dateien nach Zeilen, die auf ein Muster passen. Es ist schnell.
 .
 Dieses Paket enthält die Programme grep, egrep und fgrep.

Package: sed
Description-md5: fedcba9876543210fedcba9876543210
Description-de: Der GNU-Stromeditor
"""

MAN_PAGE = r""".\" a comment that is not text
.TH GREP 1
.SH NAME
grep \- print lines that match patterns
.SH DESCRIPTION
.B grep
searches for \fIPATTERNS\fP in each \fBFILE\fR.
A FILE of \(lq\-\(rq stands for standard input.
.PP
.nf
if (x) { y(); }
.fi
.TP
.B \-i
Ignore case distinctions in patterns and input data, so that characters that differ only in case match each other.
"""


def test_descriptions_are_paragraphs_without_checksums(corpus: ModuleType, tmp_path: Path) -> None:
    for suffix, pack in ((".bz2", bz2.compress), (".xz", lzma.compress)):
        path = tmp_path / f"Translation-de{suffix}"
        path.write_bytes(pack(TRANSLATION.encode()))
        assert list(corpus.descriptions(path)) == [
            "Sucht Zeichenketten in Dateien",
            "Grep durchsucht Dateien nach Zeilen, die auf ein Muster passen. Es ist schnell.",
            "Dieses Paket enthält die Programme grep, egrep und fgrep.",
            "Der GNU-Stromeditor"]


def test_man_paragraphs_drop_macros_and_escapes(corpus: ModuleType) -> None:
    paras = list(corpus.man_paragraphs(MAN_PAGE))
    assert "grep - print lines that match patterns" in paras
    assert "grep searches for PATTERNS in each FILE. A FILE of “-” stands for standard input." in paras
    assert not any("comment" in p or "\\" in p or p.startswith(".") for p in paras)
    sentences = [s for p in paras for s in corpus.sentences(p)]
    assert "A FILE of “-” stands for standard input." in sentences
    assert not any("y();" in s for s in sentences)  # code: too few letters


def test_sentences_split_and_filter(corpus: ModuleType) -> None:
    assert list(corpus.sentences("Erster Satz ist hier. Zweiter Satz ist auch da! Kurz.")) == [
        "Erster Satz ist hier.", "Zweiter Satz ist auch da!"]
    assert list(corpus.sentences("これはテストの文です。次の文もテストです。")) == [
        "これはテストの文です。", "次の文もテストです。"]
    assert list(corpus.sentences("x" * 401)) == []
    assert list(corpus.sentences("1024 2048 4096 8192 -- 0x1F 0x2A")) == []  # numbers, not words


def _deb(files: dict[str, bytes]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    out = b"!<arch>\n"
    for name, body in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", data.getvalue())):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += str(len(body)).encode().ljust(10) + b"`\n" + body + (b"\n" if len(body) % 2 else b"")
    return out


def test_a_whole_run_against_a_file_mirror(corpus: ModuleType, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    i18n = mirror / "dists" / "bookworm" / "main" / "i18n"
    i18n.mkdir(parents=True)
    (i18n / "Translation-de.bz2").write_bytes(bz2.compress(TRANSLATION.encode()))
    (i18n / "Translation-en.xz").write_bytes(lzma.compress(
        b"Package: grep\nDescription-en: GNU grep, egrep and fgrep\n Searches files for lines that match.\n"))
    deb = _deb({"./usr/share/man/man1/grep.1.gz": gzip.compress(MAN_PAGE.encode()),
                "./usr/share/man/fr/man1/ls.1.gz": gzip.compress(
                    b".TH LS 1\n.SH NOM\nAfficher le contenu des r\xc3\xa9pertoires tri\xc3\xa9s.\n"),
                "./usr/share/doc/manpages/copyright": b"not a page"})
    (mirror / "pool").mkdir()
    (mirror / "pool" / "manpages_1_all.deb").write_bytes(deb)
    binary = mirror / "dists" / "bookworm" / "main" / "binary-all"
    binary.mkdir(parents=True)
    (binary / "Packages.xz").write_bytes(lzma.compress(
        b"Package: manpages\nVersion: 1\nFilename: pool/manpages_1_all.deb\n\n"))
    out = tmp_path / "corpus.jsonl"
    argv = ["--work", str(tmp_path / "work"), "--out", str(out), "--mirror", mirror.as_uri()]
    assert corpus.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    by_text = {r["text"]: r for r in rows}
    assert by_text["Dieses Paket enthält die Programme grep, egrep und fgrep."]["lang"] == "de"
    assert by_text["Searches files for lines that match."]["source"] == "debian-descriptions-en"
    assert by_text["Afficher le contenu des répertoires triés."] == {
        **by_text["Afficher le contenu des répertoires triés."], "lang": "fr", "source": "manpages"}
    assert len({r["id"] for r in rows}) == len(rows) == len(by_text)
    # --limit: a seeded subset of the same rows, in the same order; too many is refused
    again = tmp_path / "two.jsonl"
    assert corpus.main(argv[:2] + ["--out", str(again), "--limit", "2"] + argv[4:]) == 0
    picked = [json.loads(line)["text"] for line in again.read_text(encoding="utf-8").splitlines()]
    assert len(picked) == 2 and picked == [t for t in by_text if t in picked]
    with pytest.raises(SystemExit, match="fewer than --limit"):
        corpus.main(argv + ["--limit", str(len(rows) + 1)])
