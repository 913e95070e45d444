r"""Reading a folder of documents: .txt/.md files (split into passages), .jsonl/.csv records.

Every problem (undecodable file, malformed line, empty or binary file...) becomes a
:class:`~vecplug.types.Problem` naming the path (relative to the folder) and the line when
there is one, and the rest is read on. Nothing here writes anywhere, and memory stays bounded:
no file larger than ``max_file_bytes`` is read into memory, long texts are tokenized in
blocks, and at most ``max_problems_per_file`` problems are listed for one file.

Hostile input: each case has one outcome ("reported" = skipped, with a Problem).

=============================================  ==============================================
case                                           outcome
=============================================  ==============================================
hidden file or folder (name starts with .)     ignored, not reported (indexes, VCS data)
other suffix than .txt .md .jsonl .csv         ignored, not reported
symlinked folder (also a loop ``a/l -> ..``)   not followed, reported; a target inside the
                                               folder is read at its own place
symlink to a file inside the folder            read, under the link's name
symlink out of the folder, broken, or a loop   reported
FIFO, socket, device with a document suffix    reported, never opened for blocking reads
name not UTF-8, or with control characters     reported (name shown escaped), folder or file
  or bidi overrides                            skipped
folder that cannot be listed, unreadable file  reported
very deep folder tree                          read (the walk does not recurse)
file over ``max_file_bytes``                   reported; at most ``max_file_bytes + 1`` bytes
                                               are ever read, also from a file that grows
empty, whitespace-only or BOM-only file        reported
UTF-8 BOM; UTF-16/32 LE/BE with BOM            decoded (BOM removed)
UTF-16/32 with BOM but undecodable             reported with the line
.txt .md: NUL in the first 8192 characters     reported ("binary file")
  (binary, UTF-16 without BOM)
.jsonl .csv: NUL in the first 8192             reported ("binary file"): binary data
  characters, >= 10% of them NUL or
  undecodable, on over half of their lines
invalid UTF-8 / a later NUL in .txt .md        file reported with the line of the first one
invalid UTF-8 / another NUL in .jsonl .csv     that line (record) reported, the rest read
CRLF, lone CR                                  decoded as a line break (lines are counted so)
U+2028, U+0085, form feed...                   kept as characters, not line breaks
huge single-line text (under the limit)        chunked; tokenized in blocks of ~64K chars
Markdown heading over 200 characters           not used as title (still indexed as text)
Markdown YAML front matter                     not embedded (its ``title:`` is the title); a
                                               file of front matter only is reported
Markdown title over a quarter of what the      cut in the embedded text (whole as payload);
  encoder keeps (``room``)                     passages leave room for it
JSONL/CSV: one enormous line under the limit   read as one record (records are not chunked),
                                               or reported like any other line
JSONL: malformed line, not an object           line reported
JSONL: NaN, Infinity, 1e999 (overflows)        line reported
JSONL: integer over 4300 digits                line reported (Python's int limit)
JSONL: integer beyond signed 64 bits           line reported (Qdrant would keep a float)
JSONL: nested over 64 levels                   line reported (MAX_PAYLOAD_DEPTH; Qdrant's
                                               engine fails past ~125; ~1000: the parser)
JSONL: duplicate key in any object             line reported, naming the key ("last wins"
                                               would silently lose data)
JSONL: ``\u0000`` or lone surrogate escape     line reported (cannot be stored as UTF-8)
CSV: duplicate column name in the header       file reported at the header line
CSV: field over ``csv_field_limit``            record reported with its first line; read on
                                               at the line after that first line
CSV: bad quoting (``"a"b``)                    record reported; read on at the line after
                                               its first line
CSV: unclosed quote (runs to the end of the    record reported at its first line; read on at
  file, or into a bad quote further on)        the line after it (later records are kept)
CSV: quoted field over several lines           read as one record; later line numbers right
CSV: more cells than the header                row reported (fewer cells: missing fields)
record without any embedded field              reported
record id ``../x``, ``/etc/passwd``, ``C:\x``   kept as given: an id is a label inside the
                                               index (``path#id``), never a path
record id: control character, NUL, bidi        record reported
  override, over 512 characters, or not a
  string/integer (float, bool, list, object)
record id empty or missing                     ``L<line>``
same id twice                                  the pipeline keeps the first, reports the next
more than ``max_problems_per_file`` problems   the first are listed, then one count
=============================================  ==============================================
"""
from __future__ import annotations

import codecs
import csv
import functools
import json
import math
import os
import re
import stat
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

from vecplug.types import Document, Problem, unstorable

TEXT_SUFFIXES = (".txt", ".md")
RECORD_SUFFIXES = (".jsonl", ".csv")
SUFFIXES = TEXT_SUFFIXES + RECORD_SUFFIXES
#: record fields with a meaning; other fields are kept as payload
KNOWN_FIELDS = ("id", "text", "title", "description", "url", "lang")
DEFAULT_EMBED_FIELDS = ("title", "description", "text")
#: a NUL among the first characters means binary data (as git and grep decide); in a
#: .jsonl/.csv file only when that prefix is also bad throughout (see :func:`looks_binary`)
BINARY_SNIFF_CHARS = 8192
#: share of NUL or undecodable characters from which a record file's prefix is binary data
BINARY_BAD_SHARE = 0.1
#: texts are tokenized in blocks of about this many characters: a tokenizer's output for a
#: whole big file (tens of bytes per token) would dwarf the file itself
BLOCK_CHARS = 1 << 16
MAX_ID_CHARS = 512
MAX_TITLE_CHARS = 200

# (start, end) character offsets of each token of a text
Offsets = Callable[[str], Sequence[tuple[int, int]]]

# O_NOFOLLOW: a file swapped for a symlink after the walk is not read through it;
# O_NONBLOCK: a FIFO that slipped through is not waited on (no effect on regular files)
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_BINARY", 0))
# characters a label (file name, record id) must not hold: C0/C1 controls (NUL, newlines,
# escapes that forge report lines or terminal output), line/paragraph separators, bidi
# embeddings/overrides/isolates (they make a name read as another), and lone surrogates
# (invalid UTF-8 in a name: not storable). A fixed list, so the rule does not change with
# the Unicode version of the Python running it.
_UNSAFE_LABEL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# what makes text unusable: NUL, and lone surrogates (undecodable bytes, or \ud800 escapes)
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_NON_SPACE = re.compile(r"\S")


def _visible(text: str) -> bool:
    """Whether ``text`` holds a character to read: not white space, nor a control or format
    character (a zero-width space, a byte-order mark, \\x01) alone."""
    return any(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in text)


def _starts_with_title(passage: str, title: str) -> bool:
    """Whether a passage begins with its document's title (as a heading or its first words),
    so that it is not embedded twice; "Setup is easy" begins with the title "Setup", "Settings"
    does not begin with "Set"."""
    text = passage.lstrip("# ")
    return text.startswith(title) and (len(text) == len(title) or not text[len(title)].isalnum())
# linear: [ \t]+ can only give back blanks, which \S refuses (the former ``(.+?)\s*#*\s*$``
# took minutes on a heading line with a few thousand spaces)
_HEADING = re.compile(r"#[ \t]+(\S.*)")
# a fenced code block's first line (CommonMark: up to 3 spaces, then ``` or ~~~); a "# ..."
# line inside one is a shell or Python comment, not a heading
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
# a front matter's title (Jekyll, Hugo, MkDocs): ``title: "..."``
_FRONT_TITLE = re.compile(r"title:[ \t]*(\S.*)")


@dataclass
class CorpusOptions:
    chunk_tokens: int = 200
    chunk_overlap: int = 32
    #: tokens of a document's text the document encoder keeps (None: no limit): a Markdown
    #: title prepended to each passage takes its share, so its passages are shorter
    room: int | None = None
    embed_fields: tuple[str, ...] = DEFAULT_EMBED_FIELDS
    max_file_bytes: int = 64 * 1024 * 1024
    csv_field_limit: int = 16 * 1024 * 1024
    max_problems_per_file: int = 100


class NotRegularFile(OSError):
    """A FIFO, socket or device where a document was expected."""


class FileTooBig(Exception):
    def __init__(self, size: int, grew: bool = False) -> None:
        super().__init__(size)
        self.size, self.grew = size, grew


@dataclass
class CorpusReader:
    """Walks ``root`` and yields documents; see the module docstring for every hostile case.

    Symlinked files are read when they lead to a regular file inside ``root``; symlinked
    folders are never followed (no loops, no way out, no documents twice).
    ``offsets`` tokenizes text into character spans; it decides passage boundaries so
    that a passage holds ``chunk_tokens`` tokens of the document encoder.
    """

    root: Path
    offsets: Offsets
    options: CorpusOptions = field(default_factory=CorpusOptions)
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    #: files (relative paths) that could not be read this time: an index keeps their last
    #: good documents rather than losing them to a passing fault
    unread: set[str] = field(default_factory=set)
    _file_problems: int = field(default=0, init=False, repr=False)

    # -- walking -----------------------------------------------------------

    def files_to_read(self) -> Iterator[Path]:
        for path, _ in self._walk():
            yield path

    def _walk(self) -> Iterator[tuple[Path, Path]]:
        """(path as named in the folder, file to open), in sorted depth-first order.

        An explicit stack, not os.walk: os.walk recurses, and a folder tree ~1000 deep
        raised RecursionError.
        """
        root = Path(os.path.realpath(self.root))
        if root.is_file():
            if root.suffix.lower() not in SUFFIXES:
                # given by name, so said, not passed over as a folder's other files are
                self._skip(root, f"not a file type vecplug reads ({', '.join(SUFFIXES)})")
            elif self._safe_name(root):
                yield root, root
            return
        stack = [root]
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self._skip(folder, f"cannot list folder: {exc.strerror or exc}")
                continue
            subfolders = []
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # hidden folders hold indexes (.vecplug), VCS data, caches
                path = Path(entry.path)
                kind = _kind(entry)
                if kind == "folder":
                    if self._safe_name(path):
                        subfolders.append(path)
                elif kind == "folder link":
                    self._skip(path, "symlinked folder: not followed")
                elif path.suffix.lower() in SUFFIXES and self._safe_name(path):
                    target = self._target(path, root, kind)
                    if target is not None:
                        yield path, target
            stack.extend(reversed(subfolders))

    def _target(self, path: Path, root: Path, kind: str) -> Path | None:
        """The regular file to open for ``path``, or None (reported)."""
        if kind == "file":
            return path
        if kind != "link":
            self._skip(path, "not a regular file (FIFO, socket or device)")
            return None
        # realpath, not Path.resolve: resolve raises RuntimeError on a loop (Python < 3.13)
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(root) or not real.is_file():
            self._skip(path, "symlink out of the folder, broken, in a loop or not to a file")
            return None
        return real

    def _safe_name(self, path: Path) -> bool:
        if _UNSAFE_LABEL.search(path.name):
            self._skip(path, "name is not valid UTF-8 or holds control characters")
            return False
        return True

    def _skip(self, path: Path, reason: str) -> None:
        self.unread.add(self.rel(path))
        self.problems.append(Problem(shown(self.rel(path)), reason))

    def rel(self, path: Path) -> str:
        root = Path(os.path.realpath(self.root))
        base = root if root.is_dir() else root.parent
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            return path.as_posix()

    # -- reading -----------------------------------------------------------

    def documents(self) -> Iterator[Document]:
        for path, target in self._walk():
            self.files += 1
            self._file_problems = 0
            rel = self.rel(path)
            suffix = path.suffix.lower()
            text = self._read_text(target, rel, suffix in RECORD_SUFFIXES)
            if text is not None:
                if suffix in TEXT_SUFFIXES:
                    yield from self._passages(path, rel, text)
                elif suffix == ".jsonl":
                    yield from self._jsonl(rel, text)
                else:
                    yield from self._csv(rel, text)
            hidden = self._file_problems - self.options.max_problems_per_file
            if hidden > 0:
                self.problems.append(Problem(rel, f"{hidden} more problems in this file not listed"))

    def _report(self, rel: str, reason: str, line: int | None = None) -> None:
        # past the cap problems are only counted: a file of a million bad lines must not
        # turn into a million Problem objects
        self._file_problems += 1
        if self._file_problems <= self.options.max_problems_per_file:
            self.problems.append(Problem(rel, reason, line))

    def _read_text(self, target: Path, rel: str, records: bool = False) -> str | None:
        text = self._read_or_report(target, rel, records)
        if text is None:
            self.unread.add(rel)
        elif not _visible(text):  # read fine, and holds no documents (or only invisible characters)
            self._report(rel, "empty file")
            return None
        return text

    def _read_or_report(self, target: Path, rel: str, records: bool = False) -> str | None:
        limit = self.options.max_file_bytes
        try:
            raw = read_file(target, limit)
        except FileTooBig as exc:
            what = (f"file grew past {limit} bytes while read" if exc.grew
                    else f"file of {exc.size} bytes exceeds the limit of {limit}")
            self._report(rel, what)
            return None
        except NotRegularFile:
            self._report(rel, "not a regular file (FIFO, socket or device)")
            return None
        except OSError as exc:
            self._report(rel, f"cannot read: {exc.strerror or exc}")
            return None
        text = decode(raw)
        del raw  # the text is up to 4x the bytes: do not hold both longer than needed
        if isinstance(text, Problem):
            self._report(rel, text.reason, text.line)
            return None
        if looks_binary(text, records):
            self._report(rel, "binary file (NUL bytes)")
            return None
        return text

    def _passages(self, path: Path, rel: str, text: str) -> Iterator[Document]:
        bad = _BAD_TEXT.search(text)
        if bad:
            # a text file is one piece: passages around a hole would misquote it
            line = text.count("\n", 0, bad.start()) + 1
            self.unread.add(rel)
            self._report(rel, f"{_bad_text_reason(bad.group())}: file skipped", line)
            return
        title = None
        if path.suffix.lower() == ".md":
            title = markdown_title(text)
            # YAML front matter (Jekyll, Hugo, MkDocs) is not the document's text: embedded, it
            # filled the first passage and its snippet, and the language detector read it
            text = text[front_matter_end(text):]
            if not _NON_SPACE.search(text):
                self._report(rel, "holds only its front matter (no text)")
                return
        size, lead = self.options.chunk_tokens, title
        if title and self.options.room is not None:
            # the title is embedded before each passage: both must fit in what the encoder
            # keeps, or the passages' ends are never embedded. The title takes at most a
            # quarter of it (a long one is cut in the embedded text, whole in the payload)
            spans = self.offsets(title)[: self.options.room // 4]
            lead = title[: spans[-1][1]] if spans else title
            size = max(1, min(size, self.options.room - len(spans) - 1))  # 1: the line break's join
        for pos, passage in enumerate(chunk(text, self.offsets, size, self.options.chunk_overlap)):
            payload: dict[str, Any] = {"title": title} if title else {}
            embed = f"{lead}\n{passage}" if title and not _starts_with_title(passage, title) else passage
            yield Document(f"{rel}#{pos}", embed, rel, pos, None, payload)

    def _jsonl(self, rel: str, text: str) -> Iterator[Document]:
        for lineno, line in enumerate(lines(text), 1):
            if not _NON_SPACE.search(line):
                continue
            bad = _BAD_TEXT.search(line)
            if bad:
                self._report(rel, _bad_text_reason(bad.group()), lineno)
                continue
            try:
                obj = parse_json(line)
            except ValueError as exc:
                self._report(rel, f"malformed JSON: {_short(str(exc), 200)}", lineno)
                continue
            except RecursionError:
                self._report(rel, "malformed JSON: nested too deeply", lineno)
                continue
            if not isinstance(obj, dict):
                self._report(rel, "a JSONL line must be an object", lineno)
                continue
            bad_value = _bad_value(obj)
            if bad_value:
                self._report(rel, bad_value, lineno)
                continue
            if any(k not in self._known_fields and k.lower() in self._known_fields for k in obj):
                keys = self._field_names(list(obj))  # an export's "Title": only then rebuilt
                if len(set(keys)) == len(keys):  # "Title" and "TITLE": as they are
                    obj = dict(zip(keys, obj.values()))
            doc = self._record(rel, lineno, obj)
            if doc is not None:
                yield doc

    def _csv(self, rel: str, text: str) -> Iterator[Document]:
        # strict: bad quoting and an unclosed quote are errors (reported), not guesses
        source = CsvLines(text)
        reader = csv.reader(source, strict=True)
        header: list[str] | None = None
        while True:
            line = source.start_record()  # where the next record starts
            try:
                with _csv_field_limit(self.options.csv_field_limit):
                    row = next(reader)
            except StopIteration:
                break
            except (csv.Error, CsvUnclosed) as exc:
                if header is None:
                    self.unread.add(rel)  # its last good records stay
                    self._report(rel, f"malformed CSV header: {exc}: file skipped", line)
                    return
                self._report(rel, f"malformed CSV: {exc}", line)
                source.resume_after_failure(exc)
                continue
            if not row:
                continue  # blank line
            bad = next((m for m in map(_BAD_TEXT.search, row) if m), None)
            if bad:
                if header is None:
                    self.unread.add(rel)  # its last good records stay
                    self._report(rel, f"{_bad_text_reason(bad.group())} in the header: file skipped", line)
                    return
                self._report(rel, _bad_text_reason(bad.group()), line)
                continue
            if header is None:
                names = self._field_names([name.strip() for name in row])
                twice = _first_duplicate(names)
                if twice is not None:
                    # a dict keeps the last one: the other column would be lost silently
                    self.unread.add(rel)  # its last good records stay
                    cells = [_short(c.strip()) for c, n in zip(row, names) if n == twice]
                    what = (f"column {cells[0]!r} appears twice" if len(set(cells)) == 1
                            else f"columns {' and '.join(map(repr, cells))} name the same field {_short(twice)!r}")
                    self._report(rel, f"{what} in the header: file skipped", line)
                    return
                header = names
                continue
            if len(row) > len(header):
                self._report(rel, "row has more cells than the header", line)
                continue
            doc = self._record(rel, line, {k: v for k, v in zip(header, row) if v != ""})
            if doc is not None:
                yield doc

    def _field_names(self, names: list[str]) -> list[str]:
        """Record keys as the fields are named: spreadsheets and exports write ``Title`` or
        ``URL``, which matched no field, so the text went to the payload unembedded and
        unreported. A name is lower-cased where that makes it a field no other key names
        (CSV headers are stripped first: ``id, text``). Not ``ID``: an export's ``ID`` is often
        a product's or a user's, repeated or a float, and taken for the record's id it would
        drop records (a repeated id keeps its first record)."""
        known = self._known_fields
        taken = set(names)
        return [name.lower() if name not in known and name.lower() in known - taken else name
                for name in names]

    @functools.cached_property
    def _known_fields(self) -> frozenset[str]:
        """The record fields a key may name in another case (not ``id``: see _field_names)."""
        return frozenset({"lang", "url", *self.options.embed_fields})

    def _record(self, rel: str, line: int, obj: dict[str, Any]) -> Document | None:
        fields = {k: v for k, v in obj.items() if v is not None}
        parts = [p for p in map(_embedded, (fields.get(f) for f in self.options.embed_fields)) if p]
        if not parts:
            wanted = ", ".join(self.options.embed_fields)
            self._report(rel, f"record has none of the fields {wanted}", line)
            return None
        try:
            rid = record_id(fields.get("id"), line)
        except ValueError as exc:
            self._report(rel, str(exc), line)
            return None
        lang = str(fields["lang"]).strip().lower() or None if "lang" in fields else None
        payload = {k: v for k, v in fields.items() if k not in ("text", "lang")}
        return Document(f"{rel}#{rid}", "\n".join(parts), rel, line, lang, payload)


def _embedded(value: Any) -> str:
    """A record field as it is embedded (appended to the record's text); "" when absent. A
    list is its items, comma-separated (``["a", "b"]`` was embedded as Python's ``['a', 'b']``),
    an object its JSON."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(p for p in map(_embedded, value) if p)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value).strip()


def document_body(text: str, source: str, payload: dict[str, Any],
                  embed_fields: Sequence[str] | None) -> str | None:
    """A document's body: its text without what :class:`CorpusReader` joined to it from its
    other fields, "" when it has none; None when nothing was joined to it (a .txt passage) or
    that cannot be told: its whole text is then the best reading of its body.

    A .jsonl/.csv record's text is its ``embed_fields`` (the index's, from its manifest) joined
    by line breaks, ``text`` the body, the others kept in the payload; a Markdown passage's
    text is its title (cut when long) and a line break before the passage, the payload keeping
    the whole title. The body is taken out only where the text is exactly that join of what the
    payload holds: a document stored otherwise (added through the API, read with other fields)
    keeps its whole text.
    """
    suffix = os.path.splitext(source)[1].lower()
    if suffix in RECORD_SUFFIXES:
        return _record_body(text, payload, tuple(embed_fields or ()))
    if suffix == ".md":
        return _passage_body(text, payload.get("title"))
    return None


def _record_body(text: str, payload: dict[str, Any], embed_fields: tuple[str, ...]) -> str | None:
    """:func:`document_body` of a .jsonl/.csv record read with ``embed_fields``."""
    if embed_fields.count("text") != 1 or "lang" in embed_fields:
        return None  # no body among the parts, or a part the payload does not keep
    at = embed_fields.index("text")
    before = [p for p in (_embedded(payload.get(f)) for f in embed_fields[:at]) if p]
    after = [p for p in (_embedded(payload.get(f)) for f in embed_fields[at + 1:]) if p]
    if text == "\n".join(before + after):
        return ""  # the record has only other fields
    head, tail = "".join(p + "\n" for p in before), "".join("\n" + p for p in after)
    if len(text) <= len(head) + len(tail) or not (text.startswith(head) and text.endswith(tail)):
        return None
    body = text[len(head):len(text) - len(tail)]
    return body if body == body.strip() else None  # a part is stripped: this was no join of them


def _passage_body(text: str, title: Any) -> str | None:
    """:func:`document_body` of a Markdown passage whose payload holds ``title``."""
    if not isinstance(title, str):
        return None
    lead, newline, passage = text.partition("\n")
    # the title prepended (whole, or cut at a token) is the text's first line. A passage whose
    # own first line is the title (then not prepended) cannot be told from it, and loses that
    # line too: the title field holds it. A first line "# Title" is the passage's own heading
    if not (newline and lead and title.startswith(lead) and passage.strip()):
        return None
    return passage


def _kind(entry: os.DirEntry[str]) -> str:
    """folder, folder link, file, link (to a file, or broken, or looping) or other."""
    try:
        if entry.is_symlink():
            try:
                return "folder link" if entry.is_dir() else "link"
            except OSError:  # a loop: ELOOP (is_dir only swallows "not found")
                return "link"
        if entry.is_dir(follow_symlinks=False):
            return "folder"
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:
        return "other"


def record_id(value: Any, line: int) -> str:
    """The id of a record: kept as given when it is a safe label, ``L<line>`` when missing.

    The id only labels a document in the index (``path#id``); nothing uses it as a path, so
    ``../x`` or ``/etc/passwd`` are fine. What could mislead a reader of results or reports
    (control characters, bidi overrides), is not text, or is huge raises ValueError.
    """
    if value is None:
        return f"L{line}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"id must be a string or an integer, not {type(value).__name__}")
    rid = str(value).strip()
    if not rid:
        return f"L{line}"
    if len(rid) > MAX_ID_CHARS:
        raise ValueError(f"id longer than {MAX_ID_CHARS} characters")
    bad = _UNSAFE_LABEL.search(rid)
    if bad:
        raise ValueError(f"id holds the control character U+{ord(bad.group()):04X}")
    return rid


# -- files and bytes -------------------------------------------------------


def read_file(path: Path, limit: int) -> bytes | bytearray:
    """The bytes of a regular file of at most ``limit`` bytes, else FileTooBig.

    The size is checked before reading, and reading stops one byte past the limit, so a
    file that grows (or lies about its size) never costs more than ``limit + 1`` bytes.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        if info.st_size > limit:
            raise FileTooBig(info.st_size)
        raw = read_at_most(fd, limit)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise FileTooBig(len(raw), grew=True)
    return raw


def read_at_most(fd: int, limit: int) -> bytearray:
    """Up to ``limit + 1`` bytes from ``fd``: one more than allowed tells "too big"."""
    buf = bytearray()
    while len(buf) <= limit:
        part = os.read(fd, min(1 << 20, limit + 1 - len(buf)))
        if not part:
            break
        buf += part
    return buf


_BOMS = (  # UTF-32 first: its little-endian BOM starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode(raw: bytes | bytearray) -> str | Problem:
    """Bytes -> text with ``\\n`` line breaks: UTF-8 (BOM or not), UTF-16/32 with a BOM.

    Invalid UTF-8 bytes become lone surrogates (``surrogateescape``) rather than an error,
    so that a JSONL or CSV file loses only the lines that hold them; callers report them.
    A UTF-16/32 file that does not decode is a Problem (with its line).
    """
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            try:
                return _normalise_newlines(raw.decode(encoding))
            except UnicodeDecodeError as exc:
                good = raw[:exc.start].decode(encoding, errors="replace")
                return Problem("", f"not valid {encoding.upper()} at byte {exc.start}",
                               _normalise_newlines(good).count("\n") + 1)
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    return _normalise_newlines(raw.decode("utf-8", errors="surrogateescape"))


def looks_binary(text: str, records: bool = False) -> bool:
    """Whether decoded ``text`` is binary data rather than text: a NUL among its first
    BINARY_SNIFF_CHARS characters.

    In a record file (``records``) a NUL also has to come with many bad characters: a
    .jsonl/.csv file is read line by line, so a stray NUL costs only its line (reported),
    and calling the file binary would lose every good record. Binary data (gzip, PNG,
    UTF-16 without BOM) is bad all through: at least BINARY_BAD_SHARE of the prefix is NUL
    or undecodable bytes (random bytes: about half; UTF-16 of ASCII: half NULs), on most of
    its lines. Both, so that neither one long junk line among good ones nor one short
    record with a NUL makes a file binary; and a file without a NUL stays text, as before
    (Latin-1 text: its undecodable lines are reported one by one).
    """
    head = text[:BINARY_SNIFF_CHARS]
    if "\x00" not in head:
        return False
    if not records:
        return True
    bad = sum(1 for _ in _BAD_TEXT.finditer(head))
    if bad < BINARY_BAD_SHARE * len(head):
        return False
    rows = [row for row in head.split("\n") if _NON_SPACE.search(row)]
    return 2 * sum(1 for row in rows if _BAD_TEXT.search(row)) > len(rows)


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def lines(text: str, keepends: bool = False) -> Iterator[str]:
    """The lines of normalised text, split at ``\\n`` only, one at a time.

    Not str.splitlines: it also splits at U+2028, U+0085, form feeds..., which JSON strings
    and CSV fields may hold, and line numbers would no longer be a file's lines.
    """
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end + 1 if keepends else end]
        start = end + 1


def _bad_text_reason(char: str) -> str:
    return "NUL character" if char == "\x00" else "not valid UTF-8"


def shown(text: str) -> str:
    """``text`` safe to print: undecodable bytes as ``\\xff``, controls as escapes."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _UNSAFE_LABEL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _short(text: str, n: int = 80) -> str:
    text = shown(text)
    return text if len(text) <= n else text[:n] + "…"


# -- JSON and CSV ----------------------------------------------------------


class _DuplicateKey(ValueError):
    pass


def parse_json(line: str) -> Any:
    """One JSON value, refusing what loses or invents data: duplicate keys (Python keeps the
    last), NaN/Infinity (not JSON) and numbers that overflow to infinity (``1e999``)."""
    return json.loads(line, object_pairs_hook=_unique_keys, parse_constant=_reject_constant,
                      parse_float=_finite_float)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey(f"duplicate key {_short(_first_duplicate([k for k, _ in pairs]) or '')!r}")
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {_short(text, 40)} is out of range")
    return value


def _first_duplicate(items: Sequence[str]) -> str | None:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def _bad_value(obj: Any) -> str | None:
    """Why a parsed record cannot be stored (a ``\\u0000`` or a lone surrogate escape in a
    key or value; and what no store keeps as it is, :func:`vecplug.types.unstorable`: nesting
    deeper than MAX_PAYLOAD_DEPTH, a NaN or infinity, an integer beyond signed 64 bits), or
    None. Iterative: values nest as deep as the JSON parser allows."""
    why = unstorable(obj)
    if why is not None:
        return why
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            bad = _BAD_TEXT.search(item)
            if bad:
                return ("a string holds \\u0000" if bad.group() == "\x00"
                        else "a string holds a lone surrogate escape (not storable as UTF-8)")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


class CsvUnclosed(Exception):
    """A record is inside a quoted field at a line start where an earlier record was, and
    that one failed: this one meets the same error (its message is the exception's)."""


class CsvLines:
    """The lines of a text for csv.reader, which can go back to the line after a record's
    first one: a quote left open makes the reader take every line after it (to the end of
    the file, or to a quote that then reads as bad quoting), and they are other records.

    Going back must not make reading quadratic (n lines that each open a quote, each read
    to the end). Between records the parser is at a line start outside quotes; inside a
    record, at each further line start it is in a quoted field. From there what follows
    decides alone where it ends: a record inside a quote at a line start that a failed
    record crossed fails the same way, so it is failed at once (:class:`CsvUnclosed`).
    Not so for a field over the size limit (that depends on where the field began): going
    back after those is bounded by a budget of one reading of the text.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.size = len(text)  # positions run to this
        self.pos = 0  # of the next line
        self.line = 0  # lines handed out
        self.record = (0, 1)  # (pos, line) where the current record starts
        self.doomed = (0, 0)  # line starts [a, b) that a failed record crossed in a quote
        self.doomed_by = ""  # the error it failed with
        self.budget = self.size

    def __iter__(self) -> CsvLines:
        return self

    def __next__(self) -> str:
        if self.pos >= self.size:
            raise StopIteration
        if self.pos != self.record[0] and self.doomed[0] <= self.pos < self.doomed[1]:
            raise CsvUnclosed(self.doomed_by)
        piece, end = self._line(self.pos)
        self.pos, self.line = end, self.line + 1
        return piece

    def _line(self, pos: int) -> tuple[str, int]:
        """The line starting at ``pos`` (its newline included) and the position after it."""
        end = self.text.find("\n", pos)
        end = self.size if end < 0 else end + 1
        return self.text[pos:end], end

    def start_record(self) -> int:
        """The line number where the next record starts."""
        self.record = (self.pos, self.line + 1)
        return self.record[1]

    def resume_after_failure(self, exc: Exception) -> None:
        """After a record failed with ``exc``: go on at the line after its first one.

        An open quote swallows the lines after it (up to the end of the file): only the first
        line surely belongs to the broken record. Over the field limit is csv's only error
        that depends on more than the text from here ("field larger than field limit (N)").
        """
        self.resume_after_first_line(
            None if isinstance(exc, CsvUnclosed) or "field limit" in str(exc) else str(exc))

    def resume_after_first_line(self, error: str | None) -> None:
        """After a failed record: go on at the line after its first one. ``error``: why it
        failed, when that follows from the text alone (None: the field size limit, or a
        record cut by :class:`CsvUnclosed`, whose region is known already)."""
        start, line = self.record
        after = self._line(start)[1]
        if self.pos <= after:
            return  # a one-line record: the reader is there already
        if error is not None:
            self.doomed, self.doomed_by = (after, self.pos), error
        elif self.budget < self.pos - after:
            return  # read on where the reader stopped (inside the record, maybe)
        else:
            self.budget -= self.pos - after
        self.pos, self.line = after, line


class CsvFileLines(CsvLines):
    """:class:`CsvLines` over a binary file, read a line at a time (positions are bytes): a
    file need not fit in memory. Lines are split at \\n only and decoded as UTF-8, an
    undecodable byte kept as a surrogate escape (the caller reports the record holding it);
    a byte-order mark at the start is dropped."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__("")
        self.file = file
        self.size = self.budget = file.seek(0, os.SEEK_END)
        self._at = -1  # where the file is, to skip a seek when reading on in order

    def _line(self, pos: int) -> tuple[str, int]:
        if pos != self._at:
            self.file.seek(pos)
        raw = self.file.readline()
        self._at = pos + len(raw)
        piece = raw.decode("utf-8", "surrogateescape")
        return (piece.removeprefix("\ufeff") if pos == 0 else piece), self._at


@contextmanager
def _csv_field_limit(limit: int) -> Iterator[None]:
    # the limit is process-wide: set it only while our reader parses, so other csv users
    # (and other readers with other options) see theirs
    old = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(old)


# -- text ------------------------------------------------------------------


_FRONT_MATTER = re.compile(r"---[ \t]*\r?\n(?:.*?\n)??(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S)


_YAML_KEY = re.compile(r"[\"']?[A-Za-z_][\w .-]*[\"']?[ \t]*:")  # a front matter's first line


def front_matter_end(text: str) -> int:
    """Where a Markdown text's YAML front matter (``---`` on the first line, up to a ``---`` or
    ``...`` line, opening with a ``key:``) ends; 0 when it has none (one never closed is no
    front matter, nor text between two rules)."""
    m = _FRONT_MATTER.match(text)
    if not m:
        return 0
    block = text[text.index("\n") + 1:m.end()]
    first = next((line for line in block.splitlines(keepends=True) if line.strip() and not
                  line.lstrip().startswith("#")), "")
    return m.end() if not first or _YAML_KEY.match(first) or first.rstrip() in ("---", "...") else 0


def markdown_title(text: str) -> str | None:
    """A Markdown text's title: its front matter's ``title:``, else its first ``# heading``
    outside fenced code blocks (where ``# ...`` is a comment), without a closing ``#`` sequence.

    A heading over MAX_TITLE_CHARS is not a title: it is prepended to every passage, and a
    huge one-line "heading" would multiply the memory of a file.
    """
    # the front matter as the passages see it (front_matter_end): text between two rules
    # that is not YAML is the document's, and no "title:" in it is a title
    end = front_matter_end(text)
    for line in _lines_of(text[:end]):
        m = _FRONT_TITLE.fullmatch(line.rstrip())
        if m and not re.fullmatch(r"[>|][-+0-9]*", m.group(1).strip()):
            # (a folded or literal block, "title: >", continues on the next lines: not read)
            front = _yaml_scalar(m.group(1).strip())
            if front:
                return front if len(front) <= MAX_TITLE_CHARS else None
    lines_ = _lines_of(text, end)
    fence = ""
    for line in lines_:
        m = _FENCE.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in line[m.end():]):  # "```foo```": inline code
            mark = m.group(1)
            if not fence:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip().strip(mark[0]):
                fence = ""
            continue
        if fence or not line.startswith("#"):
            continue
        m = _HEADING.match(line)
        if not m:
            continue
        if m.end(1) - m.start(1) > MAX_TITLE_CHARS + 64:
            return None
        title = m.group(1).rstrip()
        bare = title.rstrip("#")
        if bare != title and bare[-1:] in (" ", "\t"):  # "# Title ##"; but "# C#" stays
            title = bare.rstrip()
        return title if 0 < len(title) <= MAX_TITLE_CHARS else None
    return None


def _yaml_scalar(value: str) -> str:
    """A one-line YAML scalar's text: a quoted one unquoted with its escapes undone (``''`` in
    single quotes, ``\\"`` and ``\\\\`` in double quotes), a plain one as it is."""
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'").strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r'\\(["\\])', r"\1", value[1:-1]).strip()
    return value


def _lines_of(text: str, start: int = 0) -> Iterator[str]:
    """The lines of ``text`` from ``start``, one at a time (a title is usually near the top of
    a large file)."""
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end].rstrip("\r")
        start = end + 1


def token_spans(text: str, offsets: Offsets, block: int | None = None) -> Iterator[tuple[int, int]]:
    """``offsets(text)``, asked block by block (cut at a blank in a block's second half,
    else hard) so that a huge one-line file never holds a whole tokenization in memory."""
    block = block or BLOCK_CHARS
    start = 0
    while start < len(text):
        end = min(start + block, len(text))
        if end < len(text):
            cut = max(text.rfind(c, start + block // 2, end) for c in "\n \t\u3000")
            end = cut + 1 if cut > start else end
        for a, b in offsets(text[start:end]):
            yield a + start, b + start
        start = end


def chunk(text: str, offsets: Offsets, size: int, overlap: int,
          block: int | None = None) -> list[str]:
    """Split ``text`` into passages of at most ``size`` tokens overlapping by ``overlap``.

    Windows end at a paragraph or sentence end inside their last quarter when there is
    one, so passages rarely stop mid-sentence. Only ``size + 1`` token spans are held at a
    time (plus one tokenizer block).
    """
    spans = token_spans(text, offsets, block)
    # window[0] starts the next passage; one token past ``size`` tells whether more follow
    window = list(islice(spans, size + 1))
    if not window:  # no token at all (control or invisible characters only): nothing to embed
        return []
    if len(window) <= size:
        return [text.strip()]
    overlap = max(0, min(overlap, size // 2))
    passages = []
    while True:
        more = len(window) > size
        end = _sentence_end(text, window, (3 * size) // 4, size) if more else len(window)
        passages.append(text[window[0][0]:window[end - 1][1]].strip())
        if not more:
            break
        start = max(end - overlap, 1)
        window = window[_word_start(text, window, start, end) if overlap else start:]
        window.extend(islice(spans, size + 1 - len(window)))
    return [p for p in passages if p]


def _word_start(text: str, spans: Sequence[tuple[int, int]], start: int, stop: int) -> int:
    """The first token from ``start`` (before ``stop``) that does not continue a word, so that
    an overlapping passage starts at a word ("Landscapes", not "scapes": subword tokens split
    words); ``start`` itself if there is none. Only scripts that separate words by spaces."""
    for i in range(start, stop):
        pos = spans[i][0]
        if _mark(text[pos]):  # a combining mark (a Devanagari vowel sign) belongs to the letter before it
            continue
        before = text[pos - 1] if pos else ""
        if not pos or not ((_spaced_letter(before) or _mark(before)) and _spaced_letter(text[pos])):
            return i
    return start


def _mark(c: str) -> bool:
    """A combining mark: a vowel sign, virama or accent that continues the letter before it."""
    return unicodedata.category(c).startswith("M")


def _spaced_letter(c: str) -> bool:
    """A letter or digit of a script that puts spaces between words (not CJK, Thai, Lao,
    Myanmar or Khmer: there any two characters may meet at a word boundary)."""
    o = ord(c)
    return c.isalnum() and o < 0x2E80 and not (0x0E00 <= o <= 0x109F or 0x1780 <= o <= 0x17FF)


# (with the danda and double danda of Indic scripts, the Urdu full stop, and Armenian,
# Ethiopic and Myanmar full stops)
_SENTENCE_END = re.compile(r"[.!?。！？؟।॥۔։።။\n]\s*$")


def _sentence_end(text: str, spans: Sequence[tuple[int, int]], lo: int, hi: int) -> int:
    for end in range(hi, lo, -1):
        if _SENTENCE_END.search(text[spans[end - 1][0]:spans[end][0]]):
            return end
    return hi
