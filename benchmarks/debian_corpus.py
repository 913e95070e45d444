"""A real multilingual corpus of over a million passages, built from Debian's archive.

The ANN benchmark's target is stated at 1M vectors, and ANN recall depends on how the vectors
are spread: clustered synthetic data is only a stand-in, and Tatoeba has ~158k sentences.
Debian's package registry answers offline, and it holds a large body of real text in many
languages: package descriptions translated into ~30 languages (``dists/<release>/main/i18n``)
and the manual pages of the ``manpages-*`` packages (~25 languages). This script downloads
them (cached in ``--work``; plain HTTP, no apt or root needed), turns them into sentences and
writes them as a vecplug JSONL corpus (``{"id", "text", "lang", "source"}``), which
``vecplug index`` reads and ``benchmarks/tatoeba_vectors.py --corpus`` encodes.

Passages are sentences (split at ``.!?`` and their CJK forms) of the descriptions' paragraphs
and the manual pages' paragraphs (roff macros and escapes stripped), 20-400 characters (CJK:
10-400), deduplicated. With ``--limit N`` a seeded random N of them, in the file's order:
which sentences are kept depends only on the data and the seed. The data is the release's as
the mirror serves it that day: a point release updates some packages and translations, so a
run months later may keep a slightly different set (the README's run: bookworm, 2026-11-28,
1,242,298 distinct sentences).

    .venv/bin/python benchmarks/debian_corpus.py --work /tmp/benchwork/debian --limit 1001000 \\
        --out /tmp/benchwork/debian-1m.jsonl
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import io
import json
import lzma
import os
import random
import re
import sys
import tarfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

# Debian's locale names (pt_BR, zh_TW, nb) to the codes vecplug's language detection writes
from vecplug.fsutil import atomic_write_bytes
from vecplug.types import lang_code

MIRROR = "http://deb.debian.org/debian"
RELEASE = "bookworm"
#: i18n description files that exist for bookworm with more than a handful of entries
DESCRIPTION_LANGS = ("ca", "cs", "da", "de", "el", "en", "eo", "es", "eu", "fi", "fr", "hr", "hu", "id",
                     "it", "ja", "km", "ko", "nl", "pl", "pt", "pt_BR", "ro", "ru", "sk", "sr", "sv", "tr",
                     "uk", "vi", "zh_CN", "zh_TW")
#: manual pages: English and the translations of manpages-l10n, manpages-ja and manpages-zh
MAN_PACKAGES = ("manpages", "manpages-dev") + tuple(
    f"manpages-{lang}{dev}" for lang in ("cs", "da", "de", "el", "es", "fi", "fr", "hu", "id", "it", "mk", "nb",
                                         "nl", "pl", "pt-br", "ro", "ru", "sr", "sv", "uk", "vi")
    for dev in ("", "-dev")) + ("manpages-ja", "manpages-ja-dev", "manpages-tr", "manpages-zh")
MIN_CHARS, MIN_CJK_CHARS, MAX_CHARS = 20, 10, 400


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="download cache")
    p.add_argument("--out", type=Path, required=True, help="the JSONL corpus to write")
    p.add_argument("--limit", type=int, help="a seeded random N of the sentences (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mirror", default=MIRROR, help="Debian mirror (default: %(default)s)")
    p.add_argument("--release", default=RELEASE, help="Debian release (default: %(default)s)")
    return p.parse_args(argv)


def fetch(url: str, path: Path) -> Path | None:
    """``url`` saved at ``path`` once (None: the mirror does not have it)."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
    except urllib.error.URLError as e:  # HTTPError is one; a file:// mirror raises the other kind
        if getattr(e, "code", None) == 404 or isinstance(getattr(e, "reason", None), FileNotFoundError):
            return None
        raise
    atomic_write_bytes(path, data)
    return path


# --- package descriptions --------------------------------------------------------------------

def description_file(args: argparse.Namespace, lang: str) -> Path | None:
    base = f"{args.mirror}/dists/{args.release}/main/i18n/Translation-{lang}"
    for ext in (".xz", ".bz2"):  # English is published as .xz only, most others as .bz2 only
        got = fetch(base + ext, args.work / "i18n" / f"Translation-{lang}{ext}")
        if got is not None:
            return got
    return None


def descriptions(path: Path) -> Iterator[str]:
    """The paragraphs of every description of a Translation file (short description first)."""
    opener = lzma.open if path.suffix == ".xz" else bz2.open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        para: list[str] = []
        for line in f:
            if line.startswith("Description-") and not line.startswith("Description-md5"):
                if para:
                    yield " ".join(para)
                yield line.split(":", 1)[1].strip()
                para = []
            elif line.startswith(" "):
                if line.strip() == ".":
                    if para:
                        yield " ".join(para)
                    para = []
                else:
                    para.append(line.strip())
            elif para:
                yield " ".join(para)
                para = []
        if para:
            yield " ".join(para)


# --- manual pages ----------------------------------------------------------------------------

def package_files(args: argparse.Namespace) -> dict[str, str]:
    """Package name -> pool path, from the release's ``binary-all`` index (man pages are
    architecture-independent)."""
    index = fetch(f"{args.mirror}/dists/{args.release}/main/binary-all/Packages.xz",
                  args.work / "Packages-all.xz")
    assert index is not None, "the mirror has no binary-all index"
    out, name = {}, None
    with lzma.open(index, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("Package: "):
                name = line[9:].strip()
            elif line.startswith("Filename: ") and name is not None:
                out[name] = line[10:].strip()
    return out


def deb_members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, content) of the regular files in a .deb's data archive (an ``ar`` archive)."""
    raw = path.read_bytes()
    assert raw[:8] == b"!<arch>\n", f"{path}: not a .deb"
    at = 8
    while at < len(raw):
        header = raw[at:at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = raw[at + 60:at + 60 + size]
        at += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                for m in tar:
                    if m.isfile():
                        data = tar.extractfile(m)
                        assert data is not None
                        yield m.name, data.read()


#: macros whose arguments are running text; other macros are paragraph breaks or layout
TEXT_MACROS = {"B", "I", "BR", "IR", "BI", "RB", "RI", "IB", "SM", "SB", "Nm", "Ar", "Fl", "Cm", "Xr", "Pa",
               "Em", "Sy", "Dq", "Ql", "Va", "Ev", "Fn", "Li", "Op", "Ic"}
_SPECIAL = {"\\(em": "—", "\\(en": "–", "\\(aq": "'", "\\(dq": '"', "\\(lq": "“", "\\(rq": "”",
            "\\(bu": "•", "\\(co": "©", "\\(oq": "‘", "\\(cq": "’", "\\(Fo": "«", "\\(Fc": "»",
            "\\[em]": "—", "\\[aq]": "'", "\\-": "-", "\\e": "\\", "\\ ": " ", "\\~": " "}
_ESCAPES = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d+|\\\*(\[[^\]]*\]|\(..|.)|\\n(\[[^\]]*\]|\(..|.)"
                      r"|\\[&c%:|^/,!]|\\\(..|\\\[[^\]]*\]")


def _plain(s: str) -> str:
    for k, v in _SPECIAL.items():
        s = s.replace(k, v)
    return _ESCAPES.sub("", s).replace("\\", "")


def man_paragraphs(text: str) -> Iterator[str]:
    """The running-text paragraphs of a roff manual page, macros and escapes removed."""
    para: list[str] = []
    for line in text.splitlines():
        if line.startswith(('.\\"', "'\\\"", "\\\"")):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if parts and parts[0] in TEXT_MACROS:
                if len(parts) > 1:
                    para.append(_plain(parts[1].replace('"', "")))
                continue
        elif line.strip():
            para.append(_plain(line.strip()))
            continue
        if para:  # a layout macro or a blank line ends the paragraph
            yield " ".join(para)
        para = []
    if para:
        yield " ".join(para)


def man_pages(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    """(language, package, text) of every manual page of :data:`MAN_PACKAGES`."""
    pool = package_files(args)
    for package in MAN_PACKAGES:
        if package not in pool:
            print(f"{package}: not in {args.release}, skipped", file=sys.stderr)
            continue
        deb = fetch(f"{args.mirror}/{pool[package]}", args.work / "debs" / Path(pool[package]).name)
        assert deb is not None, pool[package]
        for name, data in deb_members(deb):
            parts = Path(name).parts
            if "man" not in parts or not name.endswith(".gz"):
                continue
            sub = parts[parts.index("man") + 1]
            lang = "en" if sub.startswith("man") else sub
            try:
                yield lang_code(lang), package, gzip.decompress(data).decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # a few pages are in legacy encodings: not worth guessing


# --- sentences -------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[^\s])|(?<=[。！？])")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


def sentences(paragraph: str) -> Iterator[str]:
    """The sentences of a paragraph worth indexing: long enough to mean something (CJK
    scripts say more per character), short enough to be a sentence and not a table."""
    for s in _SENTENCE_END.split(" ".join(paragraph.split())):
        s = s.strip()
        if len(s) > MAX_CHARS or len(s) < (MIN_CJK_CHARS if _CJK.search(s) else MIN_CHARS):
            continue
        if sum(c.isalpha() for c in s) < len(s) / 2:  # code, options tables, numbers
            continue
        yield s


def collect(args: argparse.Namespace) -> dict[str, tuple[str, str]]:
    """Every distinct sentence -> (language, source), descriptions first."""
    found: dict[str, tuple[str, str]] = {}
    for lang in DESCRIPTION_LANGS:
        path = description_file(args, lang)
        if path is None:
            print(f"Translation-{lang}: not on the mirror, skipped", file=sys.stderr)
            continue
        for para in descriptions(path):
            for s in sentences(para):
                found.setdefault(s, (lang_code(lang), f"debian-descriptions-{lang}"))
    for lang, package, page in man_pages(args):
        for para in man_paragraphs(page):
            for s in sentences(para):
                found.setdefault(s, (lang, package))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    found = collect(args)
    texts = sorted(found)
    if args.limit is not None:
        if args.limit > len(texts):
            raise SystemExit(f"only {len(texts):,} sentences, fewer than --limit {args.limit:,}")
        keep = set(random.Random(args.seed).sample(range(len(texts)), args.limit))
        texts = [t for i, t in enumerate(texts) if i in keep]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            lang, source = found[t]
            f.write(json.dumps({"id": f"d{i}", "text": t, "lang": lang, "source": source}, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    langs = Counter(found[t][0] for t in texts)
    print(f"{args.out}: {len(texts):,} sentences of {len(found):,}; languages: "
          + ", ".join(f"{k} {v:,}" for k, v in langs.most_common()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
