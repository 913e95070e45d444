"""Reading a folder of documents: .txt/.md files (split into passages), .jsonl/.csv records.

Every problem (undecodable file, malformed line, empty or binary file...) becomes a
:class:`~vecplug.types.Problem` naming the path and line, and the rest is read on.
"""
from __future__ import annotations

import codecs
import csv
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vecplug.types import Document, Problem

TEXT_SUFFIXES = (".txt", ".md")
RECORD_SUFFIXES = (".jsonl", ".csv")
SUFFIXES = TEXT_SUFFIXES + RECORD_SUFFIXES
#: record fields with a meaning; other fields are kept as payload
KNOWN_FIELDS = ("id", "text", "title", "description", "url", "lang")
DEFAULT_EMBED_FIELDS = ("title", "description", "text")

# (start, end) character offsets of each token of a text
Offsets = Callable[[str], Sequence[tuple[int, int]]]


@dataclass
class CorpusOptions:
    chunk_tokens: int = 200
    chunk_overlap: int = 32
    embed_fields: tuple[str, ...] = DEFAULT_EMBED_FIELDS
    max_file_bytes: int = 64 * 1024 * 1024
    csv_field_limit: int = 16 * 1024 * 1024


@dataclass
class CorpusReader:
    """Walks ``root`` (never following symlinks out of it) and yields documents.

    ``offsets`` tokenizes text into character spans; it decides passage boundaries so
    that a passage holds ``chunk_tokens`` tokens of the document encoder.
    """

    root: Path
    offsets: Offsets
    options: CorpusOptions = field(default_factory=CorpusOptions)
    problems: list[Problem] = field(default_factory=list)
    files: int = 0

    def files_to_read(self) -> Iterator[Path]:
        root = self.root.resolve()
        if root.is_file():
            yield root
            return
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            # hidden folders hold indexes (.vecplug), VCS data, caches: not documents
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if name.startswith(".") or path.suffix.lower() not in SUFFIXES:
                    continue
                if path.is_symlink():
                    real = path.resolve()
                    if not real.is_relative_to(root) or not real.is_file():
                        self.problems.append(Problem(self.rel(path), "symlink out of the folder (or broken)"))
                        continue
                yield path

    def rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.root.resolve() if self.root.is_dir() else self.root.resolve().parent).as_posix()
        except ValueError:
            return path.as_posix()

    def documents(self) -> Iterator[Document]:
        for path in self.files_to_read():
            self.files += 1
            suffix = path.suffix.lower()
            text = self._read_text(path)
            if text is None:
                continue
            if suffix in TEXT_SUFFIXES:
                yield from self._passages(path, text)
            elif suffix == ".jsonl":
                yield from self._jsonl(path, text)
            else:
                yield from self._csv(path, text)

    # -- files -------------------------------------------------------------

    def _read_text(self, path: Path) -> str | None:
        rel = self.rel(path)
        try:
            size = path.stat().st_size
            if size > self.options.max_file_bytes:
                self.problems.append(Problem(rel, f"file of {size} bytes exceeds the limit of "
                                                  f"{self.options.max_file_bytes}"))
                return None
            raw = path.read_bytes()
        except OSError as exc:
            self.problems.append(Problem(rel, f"cannot read: {exc.strerror or exc}"))
            return None
        text = decode(raw)
        if isinstance(text, Problem):
            self.problems.append(Problem(rel, text.reason, text.line))
            return None
        if not text.strip():
            self.problems.append(Problem(rel, "empty file"))
            return None
        return text

    def _passages(self, path: Path, text: str) -> Iterator[Document]:
        rel = self.rel(path)
        title = None
        if path.suffix.lower() == ".md":
            m = re.search(r"^#\s+(.+?)\s*#*\s*$", text, flags=re.M)
            title = m.group(1) if m else None
        for pos, passage in enumerate(chunk(text, self.offsets, self.options.chunk_tokens,
                                            self.options.chunk_overlap)):
            payload: dict[str, Any] = {"title": title} if title else {}
            embed = f"{title}\n{passage}" if title and not passage.lstrip("# ").startswith(title) else passage
            yield Document(f"{rel}#{pos}", embed, rel, pos, None, payload)

    def _jsonl(self, path: Path, text: str) -> Iterator[Document]:
        rel = self.rel(path)
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_constant=_reject_constant)
            except ValueError as exc:
                self.problems.append(Problem(rel, f"malformed JSON: {exc}", lineno))
                continue
            if not isinstance(obj, dict):
                self.problems.append(Problem(rel, "a JSONL line must be an object", lineno))
                continue
            doc = self._record(rel, lineno, obj)
            if doc is not None:
                yield doc

    def _csv(self, path: Path, text: str) -> Iterator[Document]:
        rel = self.rel(path)
        csv.field_size_limit(self.options.csv_field_limit)
        reader = csv.DictReader(text.splitlines(keepends=True))
        while True:
            line = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                self.problems.append(Problem(rel, f"malformed CSV: {exc}", line))
                continue
            if None in row:  # more cells than header columns
                self.problems.append(Problem(rel, "row has more cells than the header", line))
                continue
            doc = self._record(rel, line, {k: v for k, v in row.items() if v not in (None, "")})
            if doc is not None:
                yield doc

    def _record(self, rel: str, line: int, obj: dict[str, Any]) -> Document | None:
        fields = {k: v for k, v in obj.items() if v is not None}
        parts = [str(fields[f]).strip() for f in self.options.embed_fields
                 if f in fields and str(fields[f]).strip()]
        if not parts:
            wanted = ", ".join(self.options.embed_fields)
            self.problems.append(Problem(rel, f"record has none of the fields {wanted}", line))
            return None
        rid = str(fields.get("id", "")).strip() or f"L{line}"
        lang = str(fields["lang"]).strip().lower() or None if "lang" in fields else None
        payload = {k: v for k, v in fields.items() if k not in ("text", "lang")}
        return Document(f"{rel}#{rid}", "\n".join(parts), rel, line, lang, payload)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode(raw: bytes) -> str | Problem:
    """Bytes -> text: UTF-8 (BOM or not), UTF-16 with a BOM; binary data is refused."""
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    elif raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return _normalise_newlines(raw.decode("utf-16"))
        except UnicodeDecodeError as exc:
            return Problem("", f"not valid UTF-16 at byte {exc.start}")
    if b"\x00" in raw[:8192]:
        return Problem("", "binary file (NUL bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        return Problem("", f"not valid UTF-8 at byte {exc.start}", line)
    return _normalise_newlines(text.replace("\x00", ""))


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def chunk(text: str, offsets: Offsets, size: int, overlap: int) -> list[str]:
    """Split ``text`` into passages of at most ``size`` tokens overlapping by ``overlap``.

    Windows end at a paragraph or sentence end inside their last quarter when there is
    one, so passages rarely stop mid-sentence.
    """
    spans = list(offsets(text))
    if not spans:
        return [text.strip()] if text.strip() else []
    if len(spans) <= size:
        return [text.strip()]
    overlap = max(0, min(overlap, size // 2))
    passages, start = [], 0
    while start < len(spans):
        end = min(start + size, len(spans))
        if end < len(spans):
            end = _sentence_end(text, spans, start + (3 * size) // 4, end)
        passages.append(text[spans[start][0]:spans[end - 1][1]].strip())
        if end >= len(spans):
            break
        start = max(end - overlap, start + 1)
    return [p for p in passages if p]


_SENTENCE_END = re.compile(r"[.!?。！？؟\n]\s*$")


def _sentence_end(text: str, spans: Sequence[tuple[int, int]], lo: int, hi: int) -> int:
    for end in range(hi, lo, -1):
        if _SENTENCE_END.search(text[spans[end - 1][0]:spans[end][0]]):
            return end
    return hi
