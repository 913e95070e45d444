"""Training data files: formats, aliases, bad lines, Tatoeba, held-out split."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from vecplug.errors import ConfigError
from vecplug.indexer.distill import tatoeba_pairs
from vecplug.indexer.train_data import (
    FORMATS,
    Example,
    load_examples,
    load_tatoeba,
    normalise,
    one_row_per_positive,
    split_held_out,
)
from vecplug.types import Problem

TATOEBA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                            for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",",
              bom: bool = False) -> Path:
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8", newline="") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def load(path: Path, fmt: str, **kw) -> tuple[list[Example], list[Problem]]:
    problems: list[Problem] = []
    return load_examples(path, fmt, problems=problems, **kw), problems


# -- each format, JSONL and CSV ---------------------------------------------------------------

def test_formats_listed() -> None:
    assert FORMATS == ("pairs", "triplets", "labelled", "query")


def test_pairs_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"anchor": " How old are you? ", "positive": "Wie alt bist du?", "anchor_lang": "EN",
         "positive_lang": "de", "group": "chat"},
        {"anchor": "b", "positive": "c", "lang": "fr", "group": 7},
    ])
    examples, problems = load(path, "pairs")
    assert problems == []
    assert examples == [
        Example("How old are you?", ("Wie alt bist du?",), (), None, "en", "de", "chat", f"{path}:1"),
        Example("b", ("c",), (), None, "fr", "fr", "7", f"{path}:2"),
    ]


def test_pairs_csv_with_bom_and_aliases(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", ["sentence1", "answer", "lang"],
                     [["q1", "a1", "de"], ["q2, with comma", "line\nbreak", ""]], bom=True)
    examples, problems = load(path, "pairs")
    assert problems == []
    assert [(e.anchor, e.positives, e.anchor_lang, e.where) for e in examples] == [
        ("q1", ("a1",), "de", f"{path}:2"), ("q2, with comma", ("line\nbreak",), None, f"{path}:3")]


def test_pairs_aliases_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"query": "a", "text2": "b"}, {"text1": "c", "sentence2": "d"}])
    examples, _ = load(path, "pairs")
    assert [(e.anchor, e.positives) for e in examples] == [("a", ("b",)), ("c", ("d",))]


def test_triplets_jsonl_and_tsv(tmp_path: Path) -> None:
    jl = write_jsonl(tmp_path / "t.jsonl", [{"anchor": "a", "positive": "p", "negative": "n"},
                                            {"anchor": "a2", "positive": "p2", "negative": ["n1", "n2"]}])
    examples, _ = load(jl, "triplets")
    assert [e.negatives for e in examples] == [("n",), ("n1", "n2")]
    tsv = write_csv(tmp_path / "t.tsv", ["anchor", "positive", "negative"],
                    [["a", "p", "n"], ["x\ty", "p", "n"]], delimiter="\t")
    examples, problems = load(tsv, "triplets")
    assert problems == []
    assert [(e.anchor, e.negatives) for e in examples] == [("a", ("n",)), ("x\ty", ("n",))]


def test_labelled_jsonl_and_csv(tmp_path: Path) -> None:
    jl = write_jsonl(tmp_path / "l.jsonl", [{"text1": "a", "text2": "b", "label": 1},
                                            {"anchor": "c", "positive": "d", "score": 3.5},
                                            {"sentence1": "e", "sentence2": "f", "label": "0"}])
    examples, problems = load(jl, "labelled")
    assert problems == []
    assert [(e.anchor, e.positives, e.label) for e in examples] == [
        ("a", ("b",), 1.0), ("c", ("d",), 3.5), ("e", ("f",), 0.0)]
    path = write_csv(tmp_path / "l.csv", ["text1", "text2", "score"], [["a", "b", " 2 "], ["c", "d", "0.5"]])
    examples, _ = load(path, "labelled")
    assert [e.label for e in examples] == [2.0, 0.5]


def test_query_jsonl_and_csv(tmp_path: Path) -> None:
    jl = write_jsonl(tmp_path / "q.jsonl", [
        {"query": "q", "positives": ["p1", " ", "p2"], "negatives": ["n"]},
        {"query": "q2", "positives": "only"},
    ])
    examples, problems = load(jl, "query")
    assert problems == []
    assert [(e.anchor, e.positives, e.negatives) for e in examples] == [
        ("q", ("p1", "p2"), ("n",)), ("q2", ("only",), ())]
    path = write_csv(tmp_path / "q.csv", ["query", "positives", "negatives"],
                     [["q", '["p1", "p2"]', ""], ["q2", "[not json", "n"]])
    examples, problems = load(path, "query")
    assert problems == []
    assert [(e.positives, e.negatives) for e in examples] == [(("p1", "p2"), ()), (("[not json",), ("n",))]


def test_fields_mapping(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"question": "q", "passage": "p", "anchor": "ignored",
                                              "topic": "t"}])
    examples, _ = load(path, "pairs", fields={"anchor": "question", "positive": "passage", "group": "topic"})
    assert (examples[0].anchor, examples[0].positives, examples[0].group) == ("q", ("p",), "t")
    with pytest.raises(ConfigError, match="unknown field 'nope'"):
        load(path, "pairs", fields={"nope": "x"})


def test_csv_header_without_required_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", ["anchor", "other"], [["a", "b"]])
    with pytest.raises(ConfigError, match=r"p\.csv: no column for 'positive'"):
        load(path, "pairs")


# -- bad lines ----------------------------------------------------------------------------------

def test_bad_jsonl_lines_reported_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join([
        b'{"text1": "ok", "text2": "fine", "label": 1}',        # 1
        b'{"text1": "a", "text2": "b", "label": NaN}',          # 2 NaN
        b'{"text1": "a", "text2": "b"',                         # 3 malformed
        b'{"text1": "a", "label": 1}',                          # 4 missing text2
        b'{"text1": "  ", "text2": "b", "label": 1}',           # 5 empty
        b'{"text1": "a", "text2": "b", "label": "high"}',       # 6 non-numeric
        b'{"text1": 5, "text2": "b", "label": 1}',              # 7 wrong type
        b'{"text1": "a", "text2": "b", "label": 1e999}',        # 8 overflows to inf
        b'[1, 2]',                                              # 9 not an object
        b'',                                                    # 10 blank: not a problem
        b'{"text1": "\xff", "text2": "b", "label": 1}',         # 11 invalid UTF-8
        b'{"text1": "a", "text2": "b", "label": true}',         # 12 boolean
        b'{"text1": "a", "text1": "b", "text2": "c", "label": 1}',  # 13 duplicate key
        b'{"text1": "z", "text2": "y", "label": 0}',            # 14 fine
    ]) + b"\n")
    examples, problems = load(path, "labelled")
    assert [e.anchor for e in examples] == ["ok", "z"]
    assert [p.line for p in problems] == [2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13]
    assert all(p.path == str(path) for p in problems)
    reasons = {p.line: p.reason for p in problems}
    assert "NaN" in reasons[2] and "malformed" in reasons[3]
    assert "'text2' is missing" in reasons[4] and "'text1' is empty" in reasons[5]
    assert "not a number" in reasons[6] and "must be a string, not int" in reasons[7]
    assert "UTF-8" in reasons[11] and "boolean" in reasons[12] and "duplicate key" in reasons[13]


def test_language_fields_are_codes(tmp_path: Path) -> None:
    """Languages compose batches (xx/xy): "pt-BR" and "pt" are one language, and a name is not
    a code (a line naming one is reported, not batched as a language of its own)."""
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"anchor": "a", "positive": "b", "anchor_lang": "pt-BR", "positive_lang": "EN"},
        {"anchor": "c", "positive": "d", "lang": "English"},
        {"anchor": "e", "positive": "f", "anchor_lang": "pt"},
    ]) + "\n")
    examples, problems = load(path, "pairs")
    assert [(e.anchor_lang, e.positive_lang) for e in examples] == [("pt", "en"), ("pt", None)]
    assert [(p.line, p.reason) for p in problems] == [
        (2, "field 'lang': 'English' is not a language code (ISO 639, two or three letters: en, de, pt-BR, yue)")]


def test_bad_csv_rows(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"anchor,positive\n"
                     b"a,b\n"            # 2 ok
                     b"a,\n"             # 3 empty positive
                     b"a,b,c\n"          # 4 too many cells
                     b'"x"y,b\n'         # 5 bad quoting
                     b"\xff\xfe,b\n"     # 6 invalid UTF-8
                     b"c,d\n")           # 7 ok
    examples, problems = load(path, "pairs")
    assert [e.where for e in examples] == [f"{path}:2", f"{path}:7"]
    assert [p.line for p in problems] == [3, 4, 5, 6]
    assert "'positive' is missing" in problems[0].reason and "UTF-8" in problems[3].reason


def test_unclosed_csv_quote_costs_its_record_only(tmp_path: Path) -> None:
    path = tmp_path / "open.csv"
    path.write_bytes(b"anchor,positive\n"
                     b'a,"spans\ntwo lines"\n'  # 2-3 ok: a quoted field over two lines
                     b'b,"never closed\n'        # 4 unclosed: would swallow the rest
                     b"c,d\n"                    # 5 ok
                     b"e,f\n")                   # 6 ok
    examples, problems = load(path, "pairs")
    assert [e.where for e in examples] == [f"{path}:2", f"{path}:5", f"{path}:6"]
    assert [p.line for p in problems] == [4] and "malformed CSV" in problems[0].reason


def test_training_csv_is_streamed_with_the_in_memory_reader_s_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Training CSV is read a line at a time (CsvFileLines), giving what the in-memory reader
    (CsvLines) gives: byte-order mark, CRLF, quoted newlines, undecodable bytes, unclosed and
    reopened quotes, going back after failures."""
    import io

    from vecplug.indexer.corpus import CsvFileLines, CsvLines, CsvUnclosed

    data = ("\ufeffanchor,positive\r\n" 'a,"spans\ntwo lines"\r\n' 'b,"never closed\n' "c,d\n"
            + 'x,"open\n' * 5 + 'y,"a ""quoted"" word"\n' + "e,f").encode() + b"\ng,\xff bad byte\nh,i"

    def lines(source: CsvLines) -> list[tuple[int, str]]:
        out, reader = [], csv.reader(source, strict=True)
        while True:
            start = source.start_record()
            try:
                out.append((start, "|".join(next(reader))))
            except StopIteration:
                return out
            except (csv.Error, CsvUnclosed) as exc:
                out.append((start, f"error {exc}"))
                source.resume_after_failure(exc)

    in_memory = lines(CsvLines(data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")))
    assert lines(CsvFileLines(io.BytesIO(data))) == in_memory
    assert in_memory[0] == (1, "anchor|positive") and in_memory[-1] == (14, "h|i")
    assert [n for n, row in in_memory if row.startswith("error")] == [4, 6, 7, 8, 9, 10]
    # and the training reader does not read the file whole
    path = tmp_path / "big.csv"
    path.write_bytes(data)

    def whole(*args: object) -> bytes:
        raise AssertionError("read whole")

    monkeypatch.setattr(Path, "read_bytes", whole)
    monkeypatch.setattr(Path, "read_text", whole)
    examples, problems = load(path, "pairs")
    assert [e.where.rsplit(":", 1)[1] for e in examples] == ["2", "5", "11", "12", "14"]
    assert [p.line for p in problems] == [4, 6, 7, 8, 9, 10, 13]  # 13: the undecodable byte


def test_labelled_csv_nan_label(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "l.csv", ["text1", "text2", "label"],
                     [["a", "b", "nan"], ["a", "b", "inf"], ["a", "b", "1"]])
    examples, problems = load(path, "labelled")
    assert len(examples) == 1 and [p.line for p in problems] == [2, 3]
    assert all("finite" in p.reason for p in problems)


def test_no_usable_example_raises(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="empty.jsonl: no usable pairs example"):
        load(empty, "pairs")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"anchor": "a"}])
    problems: list[Problem] = []
    with pytest.raises(ConfigError, match="bad.jsonl.*1 lines skipped"):
        load_examples(bad, "pairs", problems=problems)
    assert [p.line for p in problems] == [1]


def test_unknown_format_suffix_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="valid: pairs, triplets, labelled, query"):
        load(tmp_path / "x.jsonl", "nope")
    with pytest.raises(ConfigError, match="suffix"):
        load(tmp_path / "x.txt", "pairs")
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "x.jsonl", "pairs")


def test_max_examples_seeded_sample(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"anchor": f"a{i}", "positive": f"p{i}"} for i in range(50)])
    a, _ = load(path, "pairs", max_examples=10, seed=1)
    b, _ = load(path, "pairs", max_examples=10, seed=1)
    c, _ = load(path, "pairs", max_examples=10, seed=2)
    assert a == b and len(a) == 10 and a != c
    lines = [int(e.where.rsplit(":", 1)[1]) for e in a]
    assert lines == sorted(lines)  # file order kept
    assert len(load(path, "pairs", max_examples=None)[0]) == 50


# -- Tatoeba ------------------------------------------------------------------------------------

def tatoeba_fixture(folder: Path) -> Path:
    folder.mkdir()
    files = {
        "tatoeba.deu-eng.deu": ["Hallo.", "", "Danke.", "Ja."],
        "tatoeba.deu-eng.eng": ["Hello.", "Empty.", "Thanks.", "Yes."],
        "tatoeba.fra-eng.fra": ["Bonjour.", "Merci.", "Oui.", "Non.", "Peut-être.", "Salut.",
                                "Chat.", "Chien."],
        "tatoeba.fra-eng.eng": ["Hello.", "Thanks.", "Yes.", "No.", "Maybe.", "Hi.", "Cat.", "Dog."],
        "tatoeba.jpn-eng.jpn": ["猫です。"],  # no .eng twin: ignored
    }
    for name, lines in files.items():
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_tatoeba_fixture(tmp_path: Path) -> None:
    folder = tatoeba_fixture(tmp_path / "tatoeba")
    examples = load_tatoeba(folder)
    assert len(examples) == 3 + 8
    first = examples[0]
    # languages as the detector and user data write them: Tatoeba's deu and a user's de are one
    assert first == Example("Hello.", ("Hallo.",), (), None, "en", "de", None,
                            f"{folder / 'tatoeba.deu-eng.deu'}:1")
    assert examples[1].where.endswith("tatoeba.deu-eng.deu:3") and examples[1].anchor == "Thanks."
    # the same pairs as distill.tatoeba_pairs
    codes = {"deu": "de", "fra": "fr"}
    assert sorted((e.positive_lang, e.positives[0], e.anchor) for e in examples) == sorted(
        (codes[lang], x, e) for lang, x, e in tatoeba_pairs(folder))
    assert {e.positive_lang for e in load_tatoeba(folder, langs=["fra"])} == {"fr"}
    assert load_tatoeba(folder, langs=["fr"]) == load_tatoeba(folder, langs=["fra"])  # either code
    with pytest.raises(ConfigError, match="no Tatoeba files for xxx"):
        load_tatoeba(folder, langs=["xxx"])


def test_tatoeba_and_user_data_of_one_language_batch_together(tmp_path: Path) -> None:
    """Tatoeba's deu-eng pairs and a user's de/en pairs are one language pair: mono batches
    mixed them with nothing while Tatoeba's were (eng, deu) and the user's (en, de)."""
    from vecplug.indexer.batching import compose_batches

    folder = tatoeba_fixture(tmp_path / "tatoeba")
    tatoeba = load_tatoeba(folder, langs=["de"])
    mine = [Example(f"q{i}", (f"p{i}",), anchor_lang="en", positive_lang="de") for i in range(3)]
    batches = compose_batches(tatoeba + mine, 8, composition="mono", seed=0)
    assert len(batches) == 1 and len(batches[0]) == len(tatoeba) + 3


def test_tatoeba_sample_proportional_and_seeded(tmp_path: Path) -> None:
    folder = tatoeba_fixture(tmp_path / "tatoeba")
    a = load_tatoeba(folder, max_pairs=4, seed=3)
    assert a == load_tatoeba(folder, max_pairs=4, seed=3)
    # 3 and 8 pairs: quotas 4*3/11 = 1.09 -> 1 and 4*8/11 = 2.9 -> 3
    assert [e.positive_lang for e in a].count("de") == 1 and len(a) == 4
    assert {load_tatoeba(folder, max_pairs=4, seed=s)[1].positives for s in range(6)} != {a[1].positives}


def test_tatoeba_length_mismatch_reported(tmp_path: Path) -> None:
    folder = tatoeba_fixture(tmp_path / "tatoeba")
    (folder / "tatoeba.deu-eng.eng").write_text("Hello.\nEmpty.\n", encoding="utf-8")
    problems: list[Problem] = []
    examples = load_tatoeba(folder, langs=["deu"], problems=problems)
    assert [e.anchor for e in examples] == ["Hello."]
    assert len(problems) == 1 and "4 lines" in problems[0].reason


def test_tatoeba_odd_lines_read_alike_for_training_and_distillation(tmp_path: Path) -> None:
    """Lines split at \\n only (a U+2028 inside a sentence shifts nothing), a BOM dropped, an
    undecodable line reported with its line and skipped, by both readers."""
    folder = tmp_path / "tatoeba"
    folder.mkdir()
    (folder / "tatoeba.fra-eng.fra").write_bytes("\ufeffBonjour\u2028le monde\nMerci\nAu revoir\n".encode())
    (folder / "tatoeba.fra-eng.eng").write_text("Hello world\nThanks\nGoodbye\n", encoding="utf-8")
    (folder / "tatoeba.deu-eng.deu").write_bytes(b"Hallo\n\xffkaputt\nDanke\n")
    (folder / "tatoeba.deu-eng.eng").write_text("Hello\nbroken\nThanks\n", encoding="utf-8")
    expected = [("deu", "Hallo", "Hello"), ("deu", "Danke", "Thanks"),
                ("fra", "Bonjour\u2028le monde", "Hello world"), ("fra", "Merci", "Thanks"),
                ("fra", "Au revoir", "Goodbye")]
    problems: list[Problem] = []
    examples = load_tatoeba(folder, problems=problems)
    codes = {"deu": "de", "fra": "fr"}
    assert [(e.positive_lang, e.positives[0], e.anchor) for e in examples] == [
        (codes[lang], x, e) for lang, x, e in expected]
    assert examples[1].where == f"{folder / 'tatoeba.deu-eng.deu'}:3"
    bad = [Problem(str(folder / "tatoeba.deu-eng.deu"), "not valid UTF-8", 2)]
    assert problems == bad
    distill_problems: list[Problem] = []
    assert tatoeba_pairs(folder, distill_problems) == expected
    assert distill_problems == bad
    assert tatoeba_pairs(folder) == expected  # problems are optional


def test_one_row_per_positive() -> None:
    examples = [Example("q", ("p1", "p2", "p3"), ("n",), anchor_lang="en", where="f:1"),
                Example("q2", ("only",)),
                Example("t1", ("t2",), label=1.0)]
    rows = one_row_per_positive(examples)
    assert [(e.anchor, e.positives, e.negatives) for e in rows] == [
        ("q", ("p1", "p2", "p3"), ("n",)), ("q", ("p2", "p1", "p3"), ("n",)), ("q", ("p3", "p1", "p2"), ("n",)),
        ("q2", ("only",), ()), ("t1", ("t2",), ())]
    assert {(e.anchor_lang, e.where) for e in rows[:3]} == {("en", "f:1")}
    assert one_row_per_positive(rows[3:]) == rows[3:]


@pytest.mark.skipif(not TATOEBA.is_dir(), reason="no Tatoeba data in /work/shared/data")
def test_tatoeba_real_folder() -> None:
    examples = load_tatoeba(TATOEBA, max_pairs=2000, seed=0)
    assert len(examples) == 2000
    langs = {e.positive_lang for e in examples}
    assert len(langs) > 50 and "en" not in langs and "deu" not in langs and "de" in langs
    assert all(e.anchor_lang == "en" and e.anchor and e.positives[0] for e in examples)
    deu = [e for e in load_tatoeba(TATOEBA, langs=["deu"]) if e.where.endswith("deu:1")]
    assert deu[0].anchor == "Mary said she didn't know where Tom was."


# -- held-out split ------------------------------------------------------------------------------

def test_split_held_out_no_leakage_and_deterministic() -> None:
    examples = [Example(f"Anchor {i % 40}" if i % 2 else f"anchor  {i % 40}", (f"p{i}",)) for i in range(200)]
    train, held = split_held_out(examples, 0.2, seed=5)
    assert len(train) + len(held) == 200
    assert abs(len(held) - 40) <= 10  # whole anchors of 5 examples each
    assert not {normalise(e.anchor) for e in train} & {normalise(e.anchor) for e in held}
    assert (train, held) == split_held_out(examples, 0.2, seed=5)
    assert held != split_held_out(examples, 0.2, seed=6)[1]
    assert [examples.index(e) for e in held] == sorted(examples.index(e) for e in held)
    assert split_held_out(examples, 0.0) == (examples, [])
    with pytest.raises(ConfigError):
        split_held_out(examples, 1.0)


def test_split_held_out_small() -> None:
    examples = [Example("a", ("b",)), Example("c", ("d",))]
    train, held = split_held_out(examples, 0.01, seed=0)
    assert len(train) == 1 and len(held) == 1
    assert split_held_out(examples[:1], 0.5) == (examples[:1], [])


def test_log_problems_names_the_first_and_counts_the_rest() -> None:
    from vecplug.indexer.train_data import log_problems

    lines: list[str] = []
    log_problems([Problem("d.jsonl", "bad", i) for i in range(1, 26)], "d.jsonl", lines.append)
    assert len(lines) == 21 and lines[0] == f"skipped {Problem('d.jsonl', 'bad', 1)}"
    assert lines[-1] == "... and 5 more problems in d.jsonl"
    lines.clear()
    log_problems([Problem("d.jsonl", "bad", 1)], "d.jsonl", lines.append)
    assert len(lines) == 1
