r"""Training data for fine-tuning the encoders and rerankers: files read into one shape.

An :class:`Example` is an anchor (a query, or the first text of a pair) with its positives,
optional negatives, an optional label, languages and a group. :func:`load_examples` reads four
formats from JSONL, CSV or TSV (chosen by the suffix: ``.jsonl``, ``.csv``, ``.tsv``);
:func:`load_tatoeba` turns Tatoeba translation pairs into Examples; :func:`split_held_out`
keeps part of them aside for validation without leaking an anchor into both sides.

Field names per format (the first name present in a record is used; ``fields`` maps our name
on the left to the file's own column name, which is then the only one looked for):

===========  =========================================================================
format       fields (aliases)
===========  =========================================================================
pairs        ``anchor`` (query, text1, sentence1), ``positive`` (text2, sentence2, answer)
triplets     the pairs fields + ``negative`` (a text, or in JSONL a list of texts)
labelled     ``text1`` (anchor, sentence1), ``text2`` (positive, sentence2),
             ``label`` (score): a number, binary 0/1 or an ordinal grade
query        ``query`` (anchor), ``positives`` (positive): a list of texts or one text,
             ``negatives`` (negative, optional): a list of texts or one text
every one    optional: ``lang`` (the language of the whole example: anchor and positive),
             ``anchor_lang`` and ``positive_lang`` (override ``lang``), ``group``
             (e.g. a subforum or tag; a string or an integer)
===========  =========================================================================

Reading rules. JSONL is strict JSON (``NaN``, ``Infinity``, duplicate keys are errors). CSV
and TSV need a header row; a UTF-8 BOM is tolerated; TSV is the csv module's tab dialect
(quoted fields allowed); in a CSV cell, ``positives``/``negatives`` holding a JSON array of
strings is read as that list, any other text as one text. Texts are stripped; an empty cell
is a missing field. A label may be a number or (CSV, and tolerated in JSONL) a numeric
string; booleans are refused (write 1 or 0).

Each bad line (undecodable, malformed JSON, a required field missing or empty, a text that is
not a string, a label that is not a finite number...) becomes a
:class:`~vecplug.types.Problem` naming the path and line, and is skipped; after
:data:`MAX_PROBLEMS` problems in one file the rest are only counted. A file with no usable
example, a header that lacks a required column, an unknown format or suffix raise
:class:`~vecplug.errors.ConfigError` naming the file.
"""
from __future__ import annotations

import csv
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vecplug.errors import ConfigError
from vecplug.indexer.corpus import CsvFileLines, CsvUnclosed, _csv_field_limit, parse_json
from vecplug.indexer.datasets import _lines
from vecplug.types import Problem

FORMATS = ("pairs", "triplets", "labelled", "query")
SUFFIXES = (".jsonl", ".csv", ".tsv")
#: problems listed per file; past this they are only counted (a file of a million bad lines
#: must not become a million Problem objects)
MAX_PROBLEMS = 1000
#: the csv module's default field limit (128 KiB) refuses long passages; 16 MiB does not,
#: and still bounds what one malformed quote can swallow
CSV_FIELD_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True)
class Example:
    """One training example.

    For "labelled" examples ``positives`` holds the one other text of the pair, relevant or
    not: ``label`` says which (binary 0/1 or an ordinal grade). Training takes
    ``positives[0]`` as the positive; any others are also relevant to the anchor (see
    :func:`one_row_per_positive`), so they are never its negatives.
    """

    anchor: str                       # query / first text
    positives: tuple[str, ...] = ()   # relevant texts (for "labelled": the one other text)
    negatives: tuple[str, ...] = ()   # irrelevant / hard negatives
    label: float | None = None        # labelled pairs: binary 0/1 or an ordinal grade
    anchor_lang: str | None = None
    positive_lang: str | None = None  # language of positives[0]
    group: str | None = None          # e.g. subforum or tag: batches may be drawn from one group
    where: str = ""                   # "path:line" for messages


def normalise(text: str) -> str:
    """The form texts are compared in (duplicates, known positives): whitespace runs collapsed
    to one space, case folded."""
    return " ".join(text.split()).casefold()


# -- field names -----------------------------------------------------------------------------

_ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "pairs": {"anchor": ("anchor", "query", "text1", "sentence1"),
              "positive": ("positive", "text2", "sentence2", "answer")},
    "triplets": {"anchor": ("anchor", "query", "text1", "sentence1"),
                 "positive": ("positive", "text2", "sentence2", "answer"),
                 "negative": ("negative",)},
    "labelled": {"text1": ("text1", "anchor", "sentence1"),
                 "text2": ("text2", "positive", "sentence2"),
                 "label": ("label", "score")},
    "query": {"query": ("query", "anchor"),
              "positives": ("positives", "positive"),
              "negatives": ("negatives", "negative")},
}
_REQUIRED = {"pairs": ("anchor", "positive"), "triplets": ("anchor", "positive", "negative"),
             "labelled": ("text1", "text2", "label"), "query": ("query", "positives")}
_OPTIONAL = {"lang": ("lang",), "anchor_lang": ("anchor_lang",),
             "positive_lang": ("positive_lang",), "group": ("group",)}
# fields that may hold a list of texts
_LISTS = {"negative", "positives", "negatives"}
# NUL and lone surrogates (undecodable bytes arrive as surrogate escapes): tokenizers choke
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def _field_names(format: str, fields: Mapping[str, str] | None) -> dict[str, tuple[str, ...]]:
    names = {**_ALIASES[format], **_OPTIONAL}
    for ours, theirs in (fields or {}).items():
        if ours not in names:
            raise ConfigError(f"unknown field {ours!r} for the {format} format; "
                              f"known: {', '.join(names)}")
        if not isinstance(theirs, str) or not theirs:
            raise ConfigError(f"field {ours!r} must map to a column name, not {theirs!r}")
        names[ours] = (theirs,)
    return names


class _Bad(ValueError):
    """A record that cannot be used; the message is the Problem's reason."""


def _pick(record: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = record.get(name)
        if value is not None:
            return value
    return None


def _text(value: Any, name: str, *, required: bool = True) -> str | None:
    if value is None:
        if required:
            raise _Bad(f"field {name!r} is missing")
        return None
    if not isinstance(value, str):
        raise _Bad(f"field {name!r} must be a string, not {type(value).__name__}")
    if _BAD_TEXT.search(value):
        raise _Bad(f"field {name!r} holds a NUL character or invalid UTF-8")
    text = value.strip()
    if not text and required:
        raise _Bad(f"field {name!r} is empty")
    return text or None


def _texts(value: Any, name: str, *, required: bool, csv_cell: bool) -> tuple[str, ...]:
    if csv_cell and isinstance(value, str) and value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(v, str) for v in parsed):
            value = parsed
    if isinstance(value, list):
        out = []
        for item in value:
            if not isinstance(item, str):
                raise _Bad(f"field {name!r} must hold strings, not {type(item).__name__}")
            text = _text(item, name, required=False)
            if text:
                out.append(text)
        if not out and required:
            raise _Bad(f"field {name!r} holds no text")
        return tuple(out)
    text = _text(value, name, required=required)
    return (text,) if text else ()


def _label(value: Any, name: str) -> float:
    if value is None:
        raise _Bad(f"field {name!r} is missing")
    if isinstance(value, bool):
        raise _Bad(f"field {name!r} is a boolean: write 1 or 0")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise _Bad(f"field {name!r} is not a number: {value[:40]!r}") from None
    else:
        raise _Bad(f"field {name!r} must be a number, not {type(value).__name__}")
    if not math.isfinite(number):
        raise _Bad(f"field {name!r} is not a finite number")
    return number


def _lang(value: Any, name: str) -> str | None:
    """A language code as the index keeps them ("pt-BR" -> "pt", so both are one language
    when batches are composed by language)."""
    from vecplug.types import lang_code

    try:
        return lang_code(_text(value, name, required=False))
    except ValueError as exc:
        raise _Bad(f"field {name!r}: {exc}") from None


def _group(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _text(value, "group", required=False)


def _example(record: Mapping[str, Any], format: str, names: Mapping[str, tuple[str, ...]],
             where: str, csv_cell: bool) -> Example:
    """One record as an Example; raises :class:`_Bad` with the reason it cannot be used."""
    def get(name: str) -> Any:
        return _pick(record, names[name])

    if format == "labelled":
        anchor = _text(get("text1"), "text1")
        positives: tuple[str, ...] = (_text(get("text2"), "text2"),)  # type: ignore[assignment]
        negatives: tuple[str, ...] = ()
        label: float | None = _label(get("label"), "label")
    elif format == "query":
        anchor = _text(get("query"), "query")
        positives = _texts(get("positives"), "positives", required=True, csv_cell=csv_cell)
        negatives = _texts(get("negatives"), "negatives", required=False, csv_cell=csv_cell)
        label = None
    else:
        anchor = _text(get("anchor"), "anchor")
        positives = (_text(get("positive"), "positive"),)  # type: ignore[assignment]
        negatives = (_texts(get("negative"), "negative", required=True, csv_cell=csv_cell)
                     if format == "triplets" else ())
        label = None
    lang = _lang(get("lang"), "lang")
    anchor_lang = _lang(get("anchor_lang"), "anchor_lang") or lang
    positive_lang = _lang(get("positive_lang"), "positive_lang") or lang
    return Example(anchor=anchor or "", positives=positives, negatives=negatives, label=label,
                   anchor_lang=anchor_lang, positive_lang=positive_lang,
                   group=_group(get("group")), where=where)


def log_problems(problems: Sequence[Problem], where: str | Path, log: Any, first: int = 20) -> None:
    """Tell ``log`` the first ``first`` of ``problems`` (the lines skipped in ``where``) and how
    many more there are: a run's log names them, its report counts them all."""
    for p in problems[:first]:
        log(f"skipped {p}")
    if len(problems) > first:
        log(f"... and {len(problems) - first} more problems in {where}")


# -- reading files ---------------------------------------------------------------------------

class Reporter:
    """Appends a file's problems to the caller's list, up to :data:`MAX_PROBLEMS`."""

    def __init__(self, path: Path, problems: list[Problem]) -> None:
        self.path, self.problems, self.count, self.first = path, problems, 0, None

    def __call__(self, reason: str, line: int | None) -> None:
        self.count += 1
        problem = Problem(str(self.path), reason, line)
        self.first = self.first or problem
        if self.count <= MAX_PROBLEMS:
            self.problems.append(problem)

    def close(self) -> None:
        hidden = self.count - MAX_PROBLEMS
        if hidden > 0:
            self.problems.append(Problem(str(self.path), f"{hidden} more problems in this file not listed"))


def _jsonl_records(path: Path, report: Reporter) -> Iterator[tuple[int, dict[str, Any]]]:
    line_problems: list[Problem] = []
    for lineno, line in _lines(path, line_problems):
        for p in line_problems:  # undecodable lines, reported by the reader
            report(p.reason, p.line)
        line_problems.clear()
        try:
            obj = parse_json(line)
        except ValueError as exc:
            report(f"malformed JSON: {str(exc)[:200]}", lineno)
            continue
        except RecursionError:
            report("malformed JSON: nested too deeply", lineno)
            continue
        if not isinstance(obj, dict):
            report("a JSONL line must be an object", lineno)
            continue
        yield lineno, obj
    for p in line_problems:
        report(p.reason, p.line)


def csv_records(path: Path, report: Reporter, names: Mapping[str, tuple[str, ...]],
                required: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, record)`` of a CSV/TSV file with a header: ``names`` maps each record key to
    the column names it may have, ``required`` keys must have a column. A bad row (an
    unclosed quote, too many cells, undecodable text) is reported by its line and costs that
    row only."""
    with path.open("rb") as file:
        yield from _csv_rows(path, CsvFileLines(file), report, names, required)


def _csv_rows(path: Path, source: CsvFileLines, report: Reporter, names: Mapping[str, tuple[str, ...]],
              required: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    # lines split at \n only; an undecodable line is kept with surrogate escapes so the line
    # count stays right, and the record holding it is reported (_BAD_TEXT). CsvFileLines
    # streams the file and lets an unclosed quote cost its record, not the rest of the file
    reader = csv.reader(source, dialect=dialect, strict=True)
    header: list[str] | None = None
    while True:
        lineno = source.start_record()  # where the next record starts
        try:
            with _csv_field_limit(CSV_FIELD_LIMIT):
                row = next(reader)
        except StopIteration:
            break
        except (csv.Error, CsvUnclosed) as exc:
            if header is None:
                raise ConfigError(f"{path}: malformed header: {exc}") from None
            report(f"malformed CSV: {exc}", lineno)
            source.resume_after_failure(exc)
            continue
        if not row or not any(cell.strip() for cell in row):
            continue  # blank line
        if header is None:
            header = [cell.strip() for cell in row]
            if any(_BAD_TEXT.search(c) for c in header):
                raise ConfigError(f"{path}: the header is not valid UTF-8")
            twice = next((c for i, c in enumerate(header) if c in header[:i]), None)
            if twice is not None:
                raise ConfigError(f"{path}: column {twice!r} appears twice in the header")
            for name in required:
                if not any(n in header for n in names[name]):
                    raise ConfigError(f"{path}: no column for {name!r} (looked for "
                                      f"{', '.join(names[name])}); the header has: {', '.join(header)}")
            continue
        if len(row) > len(header):
            report(f"row has {len(row)} cells, the header {len(header)}", lineno)
            continue
        yield lineno, {k: v for k, v in zip(header, row) if v.strip()}


def load_examples(path: str | Path, format: str, *, problems: list[Problem],
                  fields: Mapping[str, str] | None = None, max_examples: int | None = None,
                  seed: int = 0) -> list[Example]:
    """Read a JSONL, CSV or TSV file of ``format`` examples (see the module docstring).

    Bad lines are appended to ``problems`` and skipped. ``max_examples`` keeps a random
    sample of that many (drawn with ``seed``, file order kept); None or 0 keeps all.
    Raises :class:`ConfigError` for an unknown format or suffix, a missing file, a header
    without a required column, or a file without any usable example.
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown training data format {format!r}; valid: {', '.join(FORMATS)}")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{path}: unknown training data suffix {suffix or '(none)'!r}; "
                          f"valid: {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise ConfigError(f"training data file not found: {path}")
    if max_examples is not None and max_examples < 0:
        raise ConfigError(f"max_examples must be positive, not {max_examples}")
    names = _field_names(format, fields)
    report = Reporter(path, problems)
    records = (_jsonl_records(path, report) if suffix == ".jsonl"
               else csv_records(path, report, names, _REQUIRED[format]))
    examples: list[Example] = []
    for lineno, record in records:
        try:
            examples.append(_example(record, format, names, f"{path}:{lineno}", suffix != ".jsonl"))
        except _Bad as exc:
            report(str(exc), lineno)
    report.close()
    if not examples:
        first = f"; first: {report.first}" if report.first else ""
        raise ConfigError(f"{path}: no usable {format} example ({report.count} lines skipped{first})")
    if max_examples and max_examples < len(examples):
        keep = sorted(random.Random(seed).sample(range(len(examples)), max_examples))
        examples = [examples[i] for i in keep]
    return examples


# -- Tatoeba ---------------------------------------------------------------------------------

def tatoeba_files(folder: Path) -> list[tuple[str, Path, Path]]:
    """(language, its file, the English file) of a Tatoeba folder: tatoeba.xxx-eng.xxx with
    its line-aligned .eng twin."""
    out = []
    for other in sorted(folder.glob("tatoeba.*-eng.*")):
        lang = other.name.split(".")[1].split("-")[0]
        if other.suffix == ".eng" or lang == "eng":
            continue
        eng = other.with_suffix(".eng")
        if eng.is_file():
            out.append((lang, other, eng))
    return out


def _tatoeba_lang(name: str) -> str:
    """The language code of a Tatoeba file's language (``deu`` -> ``de``); a name that is no
    code stays as it is (it names a file, not a document language)."""
    from vecplug.types import lang_code

    try:
        return lang_code(name) or name
    except ValueError:
        return name


def _file_lines(path: Path, problems: list[Problem] | None) -> list[str | None]:
    # every line, numbered by position; an undecodable one is None (and reported)
    out: list[str | None] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                out.append(raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n"))
            except UnicodeDecodeError:
                out.append(None)
                if problems is not None:
                    problems.append(Problem(str(path), "not valid UTF-8", lineno))
    return out


def tatoeba_lines(other: Path, eng: Path, problems: list[Problem] | None = None) -> list[tuple[int, str, str]]:
    """``(line, sentence, English source)`` of one line-aligned Tatoeba file pair, lines
    paired by position (split at ``\\n`` only: a U+2028 inside a sentence does not shift the
    pairs after it; a BOM is dropped), pairs with an empty or undecodable side skipped.
    Undecodable lines and files of different lengths are reported in ``problems`` when it is
    given. The one reader of Tatoeba files, for training and distillation alike."""
    xs, es = _file_lines(other, problems), _file_lines(eng, problems)
    if len(xs) != len(es) and problems is not None:
        problems.append(Problem(str(other), f"{len(xs)} lines but {eng.name} has {len(es)}: "
                                            f"lines past the shorter file are not paired"))
    out = []
    for lineno, (x, e) in enumerate(zip(xs, es), 1):
        x, e = (x or "").strip(), (e or "").strip()
        if x and e:
            out.append((lineno, x, e))
    return out


def load_tatoeba(folder: str | Path, *, max_pairs: int | None = None, seed: int = 0,
                 langs: Sequence[str] | None = None,
                 problems: list[Problem] | None = None) -> list[Example]:
    """Tatoeba translation pairs as Examples: anchor the English sentence, positive its
    translation, ``where`` the translation file and line. Their languages are codes as the
    language detector and the rest of the data give them (:func:`~vecplug.types.lang_code`:
    ``eng`` -> ``en``, ``deu`` -> ``de``, ``cmn``/``yue``/``wuu`` -> ``zh``), so that Tatoeba
    and a user's data of one language are one language when batches are composed by language.

    The files and pairs are those of :func:`vecplug.indexer.distill.tatoeba_pairs` (both read
    by :func:`tatoeba_lines`). ``langs`` picks languages, by the files' 3-letter codes or by
    those codes (``de`` picks ``deu``; unknown ones raise :class:`ConfigError`). ``max_pairs``
    keeps a seeded sample spread over the files in proportion to their pair counts (file order
    kept). Files of different lengths and undecodable lines are reported in ``problems`` when
    it is given.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"Tatoeba folder not found: {folder}")
    files = tatoeba_files(folder)
    if langs:
        known = {lang for lang, _, _ in files} | {_tatoeba_lang(lang) for lang, _, _ in files}
        unknown = [lang for lang in langs if lang not in known]
        if unknown:
            raise ConfigError(f"no Tatoeba files for {', '.join(unknown)} in {folder} "
                              f"(available: {', '.join(sorted(known)) or 'none'})")
        files = [f for f in files if f[0] in set(langs) or _tatoeba_lang(f[0]) in set(langs)]
    english = _tatoeba_lang("eng")
    by_lang: dict[str, list[Example]] = {}  # by file: the sample's quotas are per file
    for lang, other, eng in files:
        code = _tatoeba_lang(lang)
        by_lang.setdefault(lang, []).extend(
            Example(anchor=e, positives=(x,), anchor_lang=english, positive_lang=code, where=f"{other}:{lineno}")
            for lineno, x, e in tatoeba_lines(other, eng, problems))
    total = sum(len(v) for v in by_lang.values())
    if not total:
        raise ConfigError(f"no Tatoeba pairs in {folder} (files tatoeba.xxx-eng.xxx and .eng)")
    if max_pairs is None or max_pairs >= total:
        return [ex for v in by_lang.values() for ex in v]
    if max_pairs < 1:
        raise ConfigError(f"max_pairs must be positive, not {max_pairs}")
    # proportional quotas, the remainder to the largest fractional parts (sum = max_pairs)
    exact = {lang: max_pairs * len(v) / total for lang, v in by_lang.items()}
    quota = {lang: int(x) for lang, x in exact.items()}
    rest = max_pairs - sum(quota.values())
    for lang in sorted(exact, key=lambda k: (quota[k] - exact[k], k))[:rest]:
        quota[lang] += 1
    rng = random.Random(seed)
    out: list[Example] = []
    for lang, v in by_lang.items():
        out += [v[i] for i in sorted(rng.sample(range(len(v)), quota[lang]))]
    return out


# -- one row per positive --------------------------------------------------------------------

def one_row_per_positive(examples: Sequence[Example]) -> list[Example]:
    """Each example with several positives (the ``query`` format) as one example per
    positive, in order: that positive first, then the query's other positives (still
    relevant: never its negatives; losses and evaluation train and rank only
    ``positives[0]``). Examples with one positive, or a label, are kept as they are.

    Every positive is trained on, each once an epoch, as sentence-transformers does with
    (query, positive) pairs; the rows share the anchor, so batches keep them apart and the
    losses never take one's positive for a negative of another.
    """
    out: list[Example] = []
    for ex in examples:
        if ex.label is not None or len(ex.positives) < 2:
            out.append(ex)
            continue
        for k, p in enumerate(ex.positives):
            out.append(replace(ex, positives=(p,) + ex.positives[:k] + ex.positives[k + 1:]))
    return out


# -- held-out split --------------------------------------------------------------------------

def split_held_out(examples: Sequence[Example], fraction: float,
                   seed: int = 0) -> tuple[list[Example], list[Example]]:
    """``(train, held_out)``: about ``fraction`` of the examples held out, deterministically.

    Examples whose anchors are the same text (after :func:`normalise`) stay on the same side,
    so no held-out query was seen in training. Whole anchors are drawn in a seeded order until
    the held-out side reaches ``round(fraction * len(examples))`` (at least one anchor when
    ``fraction`` > 0 and there are two anchors or more); both sides keep the input order.
    """
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"the held-out fraction must be in [0, 1), not {fraction}")
    by_anchor: dict[str, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        by_anchor[normalise(ex.anchor)].append(i)
    keys = list(by_anchor)
    if fraction == 0.0 or len(keys) < 2:
        return list(examples), []
    random.Random(f"held-out:{seed}").shuffle(keys)
    target = max(1, round(fraction * len(examples)))
    held: set[int] = set()
    for key in keys[:-1]:  # the last anchor always stays in training
        if len(held) >= target:
            break
        held.update(by_anchor[key])
    return ([ex for i, ex in enumerate(examples) if i not in held],
            [ex for i, ex in enumerate(examples) if i in held])
