import codecs
import gzip
import json
import re
import zlib
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


def test_a_markdown_title_and_each_passage_fit_what_the_encoder_keeps(tmp_path: Path) -> None:
    """The title is embedded before every passage: counted outside the passage budget, a long
    one pushed each passage's end past the encoder's limit (up to 24% of a file's text never
    embedded with me5-small). Passages now leave it room; a title over a quarter of the room
    is cut in the embedded text and kept whole as payload."""
    body = " ".join(f"w{i}" for i in range(300))
    for n_title in (5, 30):
        title = " ".join(f"t{i}" for i in range(n_title))
        (tmp_path / "doc.md").write_text(f"# {title}\n\n{body}\n")
        docs, problems = read(tmp_path, chunk_tokens=30, chunk_overlap=5, room=40)
        assert not problems and all(d.payload["title"] == title for d in docs)
        assert all(len(d.text.split()) <= 40 for d in docs)  # title, passage: all kept
        lead = " ".join(title.split()[:10])  # at most a quarter of the room
        assert all(d.text.startswith(lead + "\n") for d in docs[1:])
        covered = {w for d in docs for w in d.text.split()}
        assert {w for w in body.split()} <= covered
    # no room given (no encoder limit): passages of chunk_tokens, the whole title before each
    docs, _ = read(tmp_path, chunk_tokens=30, chunk_overlap=5)
    assert docs[1].text.startswith(title + "\n") and len(docs[1].text.split()) > 40


def test_markdown_front_matter_is_not_embedded(tmp_path: Path) -> None:
    """A Hugo/Jekyll page's YAML front matter was embedded with its first passage (snippet and
    vector) and read by the language detector: a German page came out English."""
    (tmp_path / "de.md").write_text("---\ntitle: Zugspitze\nlayout: post\ntags: [a, b]\n---\n"
                                    "Die Zugspitze ist 2.962 Meter hoch.\n")
    (tmp_path / "rules.md").write_text("---\nNot YAML, a rule above and below\n---\nText.\n")
    (tmp_path / "only.md").write_text("---\ntitle: Empty\n---\n")
    docs, problems = read(tmp_path)
    by = {d.source: d for d in docs}
    assert by["de.md"].text == "Zugspitze\nDie Zugspitze ist 2.962 Meter hoch." and by["de.md"].payload == {
        "title": "Zugspitze"}
    assert by["rules.md"].text.startswith("---\nNot YAML")  # two rules around text: kept
    assert "only.md" not in by and [(p.path, p.reason) for p in problems] == [
        ("only.md", "holds only its front matter (no text)")]


def test_chunking_prefers_sentence_ends() -> None:
    text = " ".join(["Ein Satz hier."] * 40)
    parts = chunk(text, words, size=20, overlap=0)
    assert all(p.endswith(".") for p in parts)


def test_markdown_titles() -> None:
    """A Markdown title is the front matter's title, else the first level-1 heading outside
    code blocks: a "# comment" in a fenced shell block (or in front matter) titled every passage."""
    from vecplug.indexer.corpus import markdown_title

    assert markdown_title("## Install\n\n```bash\n# install the dependencies\n```\n") is None
    assert markdown_title("````\n# a\n```\n# b\n````\n# Real title ##\n") == "Real title"
    assert markdown_title("~~~~\n# a\n~~~\n# still code\n~~~~\n# C#\n") == "C#"
    assert markdown_title("---\n# generated, do not edit\n---\n# Doc\n") == "Doc"
    assert markdown_title("---\r\nlayout: post\r\ntitle: 'My Page'\r\n---\r\n# Other\r\n") == "My Page"
    assert markdown_title("---\nnot closed\n# Heading\n") == "Heading"  # a rule, not front matter
    assert markdown_title("text\n#no space\n#  Spaced  \n") == "Spaced"
    assert markdown_title("```foo```\n# Title\n") == "Title"  # inline code, not a fence
    assert markdown_title("---\ntitle: >\n  Folded\n---\n# Heading\n") == "Heading"  # not ">"
    # text between two rules that is not YAML is the document's (it is embedded): no "title:"
    # line in it is a title, and its heading is
    assert markdown_title("---\nIntro text\ntitle: Foo\n---\n# Bar\n") == "Bar"
    assert markdown_title("---\nIntro text\n# Inside\n---\n# Bar\n") == "Inside"
    assert markdown_title("---\ntitle: ''\ntitle: Second\n---\n") == "Second"
    # quoted YAML scalars lose their escapes as YAML reads them
    assert markdown_title("---\ntitle: 'It''s quoted'\n---\n") == "It's quoted"
    assert markdown_title('---\ntitle: "Say \\"hi\\""\n---\n') == 'Say "hi"'
    assert markdown_title("---\ntitle: plain 'words'\n---\n") == "plain 'words'"  # plain: as it is


def test_csv_header_names_are_the_fields(tmp_path: Path) -> None:
    """Spreadsheet headers (" text", "Title", "URL") name the fields: the text went to the payload,
    unembedded and unreported. A column that only differs by case from another keeps its name."""
    (tmp_path / "a.csv").write_text("id,title, text\n1,Everest,The highest mountain\n")
    (tmp_path / "b.csv").write_text("id,Title,Text,URL,Notes\n2,K2,Second highest,http://k,n\n")
    (tmp_path / "c.csv").write_text("id,title,Title\n3,lower,Upper\n")
    (tmp_path / "d.csv").write_text("id,text ,text\n4,a,b\n")
    (tmp_path / "e.csv").write_text("id,TEXT,Text\n5,a,b\n")
    (tmp_path / "f.jsonl").write_text('{"id": "6", "Title": "Everest", "Text": "the highest"}\n'
                                      '{"ID": 1.5, "text": "an export\'s ID is no record id"}\n'
                                      '{"ID": 1.5, "text": "so a repeated one loses nothing"}\n')
    docs, problems = read(tmp_path)
    by_id = {d.id: d for d in docs}
    assert by_id["a.csv#1"].text == "Everest\nThe highest mountain"
    assert by_id["b.csv#2"].text == "K2\nSecond highest"
    assert by_id["b.csv#2"].payload == {"id": "2", "title": "K2", "url": "http://k", "Notes": "n"}
    assert by_id["c.csv#3"].text == "lower" and by_id["c.csv#3"].payload["Title"] == "Upper"
    assert [(p.path, p.reason) for p in problems] == [
        ("d.csv", "column 'text' appears twice in the header: file skipped"),
        ("e.csv", "columns 'TEXT' and 'Text' name the same field 'text' in the header: file skipped")]
    assert by_id["f.jsonl#6"].text == "Everest\nthe highest"  # exports' keys too
    assert by_id["f.jsonl#L2"].payload["ID"] == 1.5 and "f.jsonl#L3" in by_id


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


def test_a_nul_near_the_start_of_a_record_file_costs_only_its_line(tmp_path: Path) -> None:
    # the 8192-character binary sniff used to skip these whole files, every good record lost
    good = [json.dumps({"id": f"r{i}", "text": f"record {i}"}) for i in range(1, 201)]
    six = good[:6]
    six[1] = '{"id": "r2", "text": "stray \x00 NUL"}'
    (tmp_path / "six.jsonl").write_text("\n".join(six) + "\n")
    many = list(good)
    many[1] = six[1]
    (tmp_path / "many.jsonl").write_text("\n".join(many) + "\n")
    (tmp_path / "t.csv").write_text("id,text\n1,one\n2,stray \x00 NUL\n3,three\n")
    docs, problems = read(tmp_path)
    assert [(p.path, p.line, p.reason) for p in problems] == [
        ("many.jsonl", 2, "NUL character"), ("six.jsonl", 2, "NUL character"),
        ("t.csv", 3, "NUL character")]
    ids = {d.id for d in docs}
    assert len([i for i in ids if i.startswith("six.jsonl#")]) == 5
    assert len([i for i in ids if i.startswith("many.jsonl#")]) == 199
    assert "many.jsonl#r200" in ids and "six.jsonl#r2" not in ids
    assert {"t.csv#1", "t.csv#3"} <= ids


def test_binary_data_named_jsonl_or_csv_is_one_problem(tmp_path: Path) -> None:
    payload = "".join(json.dumps({"id": i, "text": f"text number {i * 7919}"}) + "\n" for i in range(3000))
    (tmp_path / "gz.jsonl").write_bytes(gzip.compress(payload.encode(), mtime=0))
    # a PNG: signature, IHDR, then compressed pixels
    pixels = zlib.compress(bytes((i * 31 + i // 7) % 256 for i in range(60_000)))
    (tmp_path / "png.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(13) + pixels)
    (tmp_path / "utf16.jsonl").write_bytes(payload[:20_000].encode("utf-16-le"))  # no BOM
    docs, problems = read(tmp_path)
    assert docs == []
    assert [(p.path, p.line, p.reason) for p in problems] == [
        (name, None, "binary file (NUL bytes)") for name in ("gz.jsonl", "png.csv", "utf16.jsonl")]



def test_binary_needs_both_many_bad_characters_and_most_lines_bad(tmp_path: Path) -> None:
    # one record: a NUL is 1 character in 40, not binary data
    (tmp_path / "one.jsonl").write_text('{"text": "only record, with \x00 a NUL"}\n')
    # a line of 4000 junk bytes among good lines: most characters bad, but one line of 21
    junk = bytes((i * 37) % 256 for i in range(4000)).replace(b"\n", b"").replace(b"\r", b"")
    good = [json.dumps({"text": f"good {i}"}).encode() for i in range(20)]
    (tmp_path / "junk.jsonl").write_bytes(b"\n".join(good[:1] + [junk] + good[1:]) + b"\n")
    docs, problems = read(tmp_path)
    assert [(p.path, p.line) for p in problems] == [("junk.jsonl", 2), ("one.jsonl", 1)]
    assert len(docs) == 20


def test_a_nul_in_a_text_file_still_skips_it(tmp_path: Path) -> None:
    (tmp_path / "early.txt").write_bytes(b"line one\nline \x00 two\nline three\n")
    (tmp_path / "late.md").write_bytes(b"# T\n\n" + b"word " * 2000 + b"\nlate \x00 NUL\n")
    docs, problems = read(tmp_path)
    assert docs == []
    assert [(p.path, p.line, p.reason) for p in problems] == [
        ("early.txt", None, "binary file (NUL bytes)"),
        ("late.md", 4, "NUL character: file skipped")]


def test_an_unclosed_csv_quote_loses_only_its_record(tmp_path: Path) -> None:
    (tmp_path / "badquote.csv").write_text(
        'id,text\nx,"unclosed text\ny,good text\nz,more good text\nw,last good text\n')
    docs, problems = read(tmp_path)
    assert [(p.path, p.line, p.reason) for p in problems] == [
        ("badquote.csv", 2, "malformed CSV: unexpected end of data")]
    assert [(d.id, d.position, d.text) for d in docs] == [
        ("badquote.csv#y", 3, "good text"), ("badquote.csv#z", 4, "more good text"),
        ("badquote.csv#w", 5, "last good text")]


def test_two_unclosed_csv_quotes_each_lose_only_their_record(tmp_path: Path) -> None:
    # the first open quote runs into the second one (a bad quote there): line 3 is still read
    (tmp_path / "t.csv").write_text('id,text\na,"open one\nb,good\nc,"open two\nd,good too\n')
    docs, problems = read(tmp_path)
    assert [(p.line, p.reason) for p in problems] == [
        (2, "malformed CSV: ',' expected after '\"'"), (4, "malformed CSV: unexpected end of data")]
    assert [(d.id, d.position) for d in docs] == [("t.csv#b", 3), ("t.csv#d", 5)]


def test_multiline_quoted_csv_fields_keep_later_line_numbers(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text(
        'id,text\n'                                   # 1
        'a,"first line\nsecond, with comma\n\nfourth ""quoted"""\n'  # 2-5
        'b,plain\n'                                   # 6
        'c,too,many\n'                                # 7
        'd,"two\nlines"\n'                            # 8-9
        'e,"never closed\n'                           # 10
        'f,after\n')                                  # 11
    docs, problems = read(tmp_path)
    assert [(p.line, p.reason) for p in problems] == [
        (7, "row has more cells than the header"), (10, "malformed CSV: unexpected end of data")]
    assert [(d.id, d.position, d.text) for d in docs] == [
        ("m.csv#a", 2, 'first line\nsecond, with comma\n\nfourth "quoted"'),
        ("m.csv#b", 6, "plain"), ("m.csv#d", 8, "two\nlines"), ("m.csv#f", 11, "after")]


def test_overlapping_passages_start_at_a_word() -> None:
    """With a subword tokenizer the overlap would often start inside a word ("scapes"); it
    starts at the next word instead. Text without spaces between words (Chinese) is cut
    anywhere, as before."""
    def pieces(text: str) -> list[tuple[int, int]]:  # each word in pieces of up to 3 characters
        return [(a, min(a + 3, m.end())) for m in re.finditer(r"\S+", text) for a in range(m.start(), m.end(), 3)]

    text = " ".join(f"Landscapes{i:02d}" for i in range(60))
    parts = chunk(text, pieces, size=40, overlap=10)
    assert len(parts) > 3 and all(p.startswith("Landscapes") for p in parts)
    covered = {w for p in parts for w in p.split()}
    assert covered == set(text.split())
    zh = "水在一百度沸腾。" * 40
    chars = [(i, i + 1) for i in range(len(zh))]
    parts = chunk(zh, lambda t: chars, size=30, overlap=10)
    assert len(parts[1]) + len(parts[0]) > 30 + 5  # the overlap is kept


def test_overlapping_passages_never_start_inside_a_devanagari_word() -> None:
    """Combining marks (vowel signs, virama) continue the letter before them: an overlapping
    passage started at a piece beginning with one, or at a letter after one ("ौद्योगिकी" of
    "प्रौद्योगिकी")."""
    def pieces(text: str) -> list[tuple[int, int]]:  # each word in pieces of up to 2 characters
        return [(a, min(a + 2, m.end())) for m in re.finditer(r"\S+", text) for a in range(m.start(), m.end(), 2)]

    words_hi = ["प्रौद्योगिकी", "विज्ञान", "भारत", "हिन्दी", "कंप्यूटर"]
    text = " ".join(words_hi[i % 5] for i in range(120))
    parts = chunk(text, pieces, size=30, overlap=8)
    assert len(parts) > 5
    assert all(p.split()[0] in words_hi for p in parts), [p.split()[0] for p in parts]


def test_passages_end_at_the_sentence_ends_of_other_scripts() -> None:
    """The danda (Hindi, Bengali), the Urdu full stop and the Armenian one end sentences too."""
    for sentence, end in (("यह एक वाक्य है।", "।"), ("یہ ایک جملہ ہے۔", "۔"), ("Սա նախադասություն է։", "։")):
        parts = chunk(" ".join([sentence] * 40), words, size=20, overlap=0)
        assert len(parts) > 3 and all(p.endswith(end) for p in parts), (end, parts[:2])


def test_a_file_of_invisible_characters_is_empty(tmp_path: Path) -> None:
    """Control and format characters alone (\\x01, zero-width spaces, a byte-order mark) are
    nothing to embed: the file is reported empty, not indexed as a passage without a token."""
    (tmp_path / "ctl.txt").write_text("\x01\x02\x03")
    (tmp_path / "zw.txt").write_text("\u200b\u200b\n\u200b\ufeff")
    (tmp_path / "ok.txt").write_text("\u200bwater boils")
    docs, problems = read(tmp_path, chunk_tokens=30, chunk_overlap=5)
    assert [d.source for d in docs] == ["ok.txt"]
    assert sorted((p.path, p.reason) for p in problems) == [("ctl.txt", "empty file"), ("zw.txt", "empty file")]
    assert chunk("\x01\x02", lambda t: [], size=10, overlap=2) == []


def test_a_title_is_left_off_only_a_passage_that_begins_with_it_as_words(tmp_path: Path) -> None:
    """Front matter's title "Go" is embedded before a passage "Google ..." (which only begins
    with its letters), not before one that begins with it."""
    (tmp_path / "a.md").write_text("---\ntitle: Go\n---\nGoogle makes things.\n")
    (tmp_path / "b.md").write_text("---\ntitle: Go\n---\nGo is a language.\n")
    docs, _ = read(tmp_path, chunk_tokens=30, chunk_overlap=5)
    texts = {d.source: d.text for d in docs}
    assert texts["a.md"] == "Go\nGoogle makes things." and texts["b.md"] == "Go is a language."


def test_a_csv_skipped_for_its_header_keeps_its_last_good_records(tmp_path: Path) -> None:
    """A header that cannot be read skips the file as one that cannot be read: it is listed as
    unread, so an index keeps the records it holds from it (before, they were pruned)."""
    headers = {"dup.csv": b"id,title,text,title\n", "quote.csv": b'id,"text\n', "nul.csv": b"id,te\x00xt\n"}
    for name, header in headers.items():
        (tmp_path / name).write_bytes(header + b"1,a title,some text\n")
    reader = CorpusReader(tmp_path, words, CorpusOptions())
    assert list(reader.documents()) == []
    assert reader.unread == set(headers)
    assert all("file skipped" in p.reason or "binary" in p.reason for p in reader.problems)


def test_a_file_of_another_type_given_alone_is_refused_not_read_as_csv(tmp_path: Path) -> None:
    """A folder's other files are passed over; one named alone is said to be of a type vecplug
    does not read (before, anything not .txt, .md or .jsonl was parsed as CSV)."""
    for name in ("app.log", "readme.rst"):
        (tmp_path / name).write_text("text\nfirst line of the file\nsecond line\n")
        reader = CorpusReader(tmp_path / name, words, CorpusOptions())
        assert list(reader.documents()) == []
        assert [(p.path, p.reason) for p in reader.problems] == [
            (name, "not a file type vecplug reads (.txt, .md, .jsonl, .csv)")]
        assert reader.unread == {name}


def test_a_documents_body_is_its_text_without_the_fields_joined_to_it(tmp_path: Path) -> None:
    """The field reranker reads a record's ``text`` field apart from its title and description
    (as a trained head learned them), but the index keeps only the joined text: the body is
    taken back out of it, exactly where the text is that join, and nowhere else."""
    from vecplug.indexer.corpus import DEFAULT_EMBED_FIELDS, document_body

    records = [{"id": "full", "title": " Fox facts ", "description": "Teaser", "text": "all about\nfoxes",
                "url": "http://f"},
               {"id": "no-body", "title": "Only a title", "description": "and a teaser"},
               {"id": "body-only", "text": "just a body"},
               {"id": "number", "title": 2024, "text": "a year is a title too"},
               {"id": "echo", "title": "Echo", "text": "Echo\nthe body repeats the title"}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "p.csv").write_text('id,title,description,text\nc1,Paris,"Capital, of France",A city.\n')
    body = " ".join(f"w{i}" for i in range(60))
    title = " ".join(f"t{i}" for i in range(30))
    (tmp_path / "long.md").write_text(f"---\ntitle: {title}\n---\n{body}\n")
    (tmp_path / "short.md").write_text("# Short title\n\nA first passage under its heading.\n")
    (tmp_path / "plain.txt").write_text("plain text\nof two lines\n")
    docs, problems = read(tmp_path, chunk_tokens=20, chunk_overlap=5, room=32)
    assert not problems
    by_id = {d.id: d for d in docs}

    def body_of(doc_id: str, fields: tuple[str, ...] = DEFAULT_EMBED_FIELDS) -> str | None:
        doc = by_id[doc_id]
        return document_body(doc.text, doc.source, doc.payload, fields)

    assert by_id["r.jsonl#full"].text == "Fox facts\nTeaser\nall about\nfoxes"
    assert body_of("r.jsonl#full") == "all about\nfoxes"
    assert body_of("r.jsonl#no-body") == ""  # only other fields: no body at all
    assert body_of("r.jsonl#body-only") == "just a body"
    assert body_of("r.jsonl#number") == "a year is a title too"
    assert body_of("r.jsonl#echo") == "Echo\nthe body repeats the title"  # the title taken once
    assert body_of("p.csv#c1") == "A city."
    # a Markdown passage after its title, cut to a quarter of the room (8 words) or whole
    passages = [d for d in docs if d.source == "long.md"]
    assert len(passages) > 1 and all(d.payload["title"] == title for d in passages)
    lead = " ".join(title.split()[:8])
    for d in passages:
        got = document_body(d.text, d.source, d.payload, None)
        assert d.text == f"{lead}\n{got}" and got.split()[0].startswith("w")
    # a first passage holding its heading has no title before it: its text is its body
    assert document_body(by_id["short.md#0"].text, "short.md", {"title": "Short title"}, None) is None
    assert by_id["short.md#0"].text.startswith("# Short title")
    assert body_of("plain.txt#0") is None  # nothing joined: the whole text
    # fields in another order, the body between two others
    fields = ("description", "text", "title")
    (tmp_path / "r.jsonl").write_text(json.dumps(records[0]) + "\n")
    (tmp_path / "p.csv").unlink()
    docs, _ = read(tmp_path, embed_fields=fields)
    by_id = {d.id: d for d in docs}
    assert by_id["r.jsonl#full"].text == "Teaser\nall about\nfoxes\nFox facts"
    assert body_of("r.jsonl#full", fields) == "all about\nfoxes"
    # not the join of the fields given (read with others, stored by the API...): whole text
    assert body_of("r.jsonl#full") is None
    assert body_of("r.jsonl#full", ("title", "description")) is None  # no body among them
    assert body_of("r.jsonl#full", ()) is None and body_of("r.jsonl#full", None) is None
    assert document_body("Fox facts\nall about foxes", "notes", {"title": "Fox facts"}, DEFAULT_EMBED_FIELDS) is None
    assert document_body("Fox facts\nall about foxes", "a.md", {"title": ["Fox facts"]}, None) is None


def test_a_list_or_object_field_is_embedded_as_text(tmp_path: Path) -> None:
    """A JSONL title that is a list is embedded as its items, an object as its JSON (both were
    embedded as Python's repr: "['a', 'b']"); the payload keeps the value as it was."""
    (tmp_path / "r.jsonl").write_text(
        json.dumps({"id": "1", "title": ["Kyoto", "temples", None, ["Japan"]], "text": "many temples"}) + "\n"
        + json.dumps({"id": "2", "title": {"de": "Tempel"}, "text": "viele Tempel"}, ensure_ascii=False) + "\n")
    docs, problems = read(tmp_path, chunk_tokens=30, chunk_overlap=5)
    assert not problems
    assert docs[0].text == "Kyoto, temples, Japan\nmany temples" and docs[0].payload["title"][0] == "Kyoto"
    assert docs[1].text == '{"de": "Tempel"}\nviele Tempel'
