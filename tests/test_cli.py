"""The command line end to end with a tiny real transformer (the real model: test_e2e.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from vecplug.cli import cli


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "en.txt").write_text("the quick brown fox jumps over the lazy dog")
    (root / "de.md").write_text("# Fuchs\n\nder schnelle braune fuchs springt über den faulen hund")
    (root / "records.jsonl").write_text(
        json.dumps({"id": "r1", "title": "agua", "text": "el agua hierve a cien grados", "lang": "es"}) + "\n"
        + "{not json}\n"
        + json.dumps({"id": "r2", "text": "вода кипит при ста градусах", "url": "http://x"}) + "\n")
    (root / "broken.txt").write_bytes(b"caf\xe9 not utf8 \x81")
    return root


def run(*args: str, ok: bool = True, input: str | None = None) -> str:
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code != 0, result.output
    return result.output


def test_index_search_info(corpus: Path, tiny_model: Path) -> None:
    out = run("index", str(corpus), "--model", str(tiny_model), "-q")
    assert "indexed 4 documents from 4 files" in out
    assert "skipped broken.txt:1: not valid UTF-8" in out and "records.jsonl:2: malformed JSON" in out
    assert (Path(".vecplug") / "manifest.json").is_file()

    # the embedded text of a record is its fields appended: title, then text
    hits = json.loads(run("search", "agua\nel agua hierve a cien grados", "--json", "-k", "2"))
    assert hits["mode"] == "xy" and len(hits["hits"]) == 2
    top = hits["hits"][0]
    assert top["id"] == "records.jsonl#r1" and top["lang"] == "es" and top["rank"] == 1
    assert top["score"] == pytest.approx(1.0, abs=1e-4)  # same text, no prefixes: same vector
    assert top["payload"] == {"id": "r1", "title": "agua"}

    mono = json.loads(run("search", "the quick brown fox", "--mode", "mono", "--lang", "de", "--json"))
    assert mono["lang"] == "de" and {h["lang"] for h in mono["hits"]} == {"de"}

    human = run("search", "the quick brown fox jumps over the lazy dog", "-k", "1")
    assert "1. 1.000 [en] en.txt" in human
    wide = run("search", "the quick brown fox jumps over the lazy dog", "-k", "1", "--ef", "500")
    assert "1. 1.000 [en] en.txt" in wide
    assert "--ef" in run("search", "fox", "--ef", "0", ok=False)

    info = run("info")
    assert "documents:  4" in info and str(tiny_model) in info
    assert "store:      M 16, ef_construction 200, ef_search 128" in info
    assert f"source:     {corpus.resolve()}; passages of 126 tokens (31 overlapping)" in info  # the tiny model keeps 128
    manifest = json.loads(run("info", "--json"))["manifest"]
    for key in ("document_encoder", "document_encoder_checksum", "query_encoder", "dim", "normalize",
                "query_prefix", "document_prefix", "query_max_length", "document_max_length",
                "store", "vecplug_version"):
        assert key in manifest
    assert manifest["store"]["name"] == "hnswlib"


def test_search_reads_queries_from_stdin_one_a_line(corpus: Path, tiny_model: Path) -> None:
    """``search -``: every line of standard input a query, answered in order by one process as
    a search of it alone would be; a line that cannot be searched is named and skipped, and
    the lines after it are still answered."""
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    queries = ["the quick brown fox", "el agua hierve", "вода кипит"]
    alone = [json.loads(run("search", q, "--json", "-k", "2")) for q in queries]
    lines = ("\ufeff" + queries[0] + "\r\n\n").encode() + b"bad \xff byte\n" + queries[1].encode() \
        + b"\n\xe2\x80\x8f\n" + queries[2].encode()  # (the last line without its newline)
    result = CliRunner().invoke(cli, ["search", "-", "--json", "-k", "2"], input=lines, catch_exceptions=False)
    assert result.exit_code == 1
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["query"] for a in answers] == queries
    assert [a["line"] for a in answers] == [1, 4, 6]  # (line 2 blank, lines 3 and 5 skipped)
    for got, want in zip(answers, alone):
        assert [(h["id"], h["rank"]) for h in got["hits"]] == [(h["id"], h["rank"]) for h in want["hits"]]
        assert [h["score"] for h in got["hits"]] == pytest.approx([h["score"] for h in want["hits"]], abs=1e-5)
    assert "stdin line 3: the query holds a NUL or an undecodable byte" in result.stderr
    assert "stdin line 5: the query is empty; skipped" in result.stderr
    assert "2 of 5 queries skipped (stdin lines 3, 5: above)" in result.stderr

    human = CliRunner().invoke(cli, ["search", "-", "-k", "1"], input="\n".join(queries) + "\n")
    assert human.exit_code == 0, human.output
    blocks = human.stdout.split("\n\n")
    assert len(blocks) == 3 and [b.splitlines()[0].split("'")[1] for b in blocks] == queries
    assert "1. 1.000 [en] en.txt" in run("search", "-", "-k", "1", input=
                                           "the quick brown fox jumps over the lazy dog\n")
    assert run("search", "-", input="") == ""  # no queries: nothing to say

    # an error that is no line's own (here a reranker that cannot load) stops the run once,
    # as it stops a single query, instead of skipping every line with it
    broken = CliRunner().invoke(cli, ["search", "-", "--rerank", "cross-encoder:/nonexistent/reranker"],
                                input="\n".join(queries) + "\n")
    assert broken.exit_code == 1 and broken.stdout == ""
    assert broken.stderr.count("/nonexistent/reranker") == 1 and "skipped" not in broken.stderr
    # a mono query of no detectable language is that line's: skipped, the others answered
    mono = CliRunner().invoke(cli, ["search", "-", "--mode", "mono", "--json", "-k", "1"],
                              input=queries[0] + "\n12345 67890\n" + queries[1] + "\n")
    assert mono.exit_code == 1
    assert [json.loads(line)["line"] for line in mono.stdout.splitlines()] == [1, 3]
    assert "stdin line 2: mono mode needs the query's language" in mono.stderr


def test_rerun_changes_nothing_and_edits_are_picked_up(corpus: Path, tiny_model: Path) -> None:
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    out = run("index", str(corpus), "-q")  # the index's own model is reused
    assert "indexed 0 documents" in out and "4 unchanged" in out and "index holds 4" in out
    (corpus / "en.txt").write_text("a completely new text about water")
    out = run("index", str(corpus), "-q")
    assert "indexed 1 documents" in out and "index holds 4" in out
    hit = json.loads(run("search", "a completely new text about water", "--json", "-k", "1"))["hits"][0]
    assert hit["id"] == "en.txt#0" and hit["score"] == pytest.approx(1.0, abs=1e-4)


def test_mismatched_model_is_refused(corpus: Path, tiny_model: Path, other_tiny_model: Path) -> None:
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    out = run("search", "fox", "--model", str(other_tiny_model), ok=False)
    assert "document encoder mismatch" in out
    assert str(tiny_model) in out and str(other_tiny_model) in out
    out = run("index", str(corpus), "--model", str(other_tiny_model), ok=False)
    assert "mismatch" in out


def test_another_dimension_s_model_is_refused_naming_both(corpus: Path, tiny_model: Path,
                                                          tiny_student: Path, tmp_path: Path) -> None:
    """An index whose queries go through a student: another document encoder (here of another
    dimension) is refused as a document encoder mismatch naming both, not as the student's
    dimension disagreeing with it."""
    from conftest import build_tiny_model

    wide = build_tiny_model(tmp_path / "tiny-wide", hidden=48)
    run("index", str(corpus), "--model", str(tiny_model), "--query-encoder", str(tiny_student), "-q")
    for args in (("search", "fox"), ("index", str(corpus))):
        out = run(*args, "--model", str(wide), ok=False)
        assert "document encoder mismatch" in out and str(tiny_model) in out and str(wide) in out, out


def test_config_file_and_env(corpus: Path, tiny_model: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "vecplug.yaml"
    cfg.write_text(f"index: {{path: {tmp_path / 'myindex'}}}\nmodel: {{document: {tiny_model}}}\nsearch: {{k: 1}}\n")
    run("index", str(corpus), "--config", str(cfg), "-q")
    assert (tmp_path / "myindex" / "manifest.json").is_file()
    monkeypatch.setenv("VECPLUG_CONFIG", str(cfg))
    assert len(json.loads(run("search", "fox", "--json"))["hits"]) == 1
    monkeypatch.setenv("VECPLUG_SEARCH_K", "3")
    assert len(json.loads(run("search", "fox", "--json"))["hits"]) == 3
    assert len(json.loads(run("search", "fox", "--json", "-k", "2"))["hits"]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: {colour: blue}\n")
    assert "unknown key(s) colour" in run("search", "fox", "--config", str(bad), ok=False)


def test_the_index_keeps_its_hnsw_parameters(corpus: Path, tiny_model: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An index made with a wider ef_search (or another M) searches with it later, when no
    setting says otherwise: the defaults do not override what the manifest records."""
    import vecplug

    monkeypatch.setenv("VECPLUG_INDEX_HNSW_EF_SEARCH", "512")
    monkeypatch.setenv("VECPLUG_INDEX_HNSW_M", "8")
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    monkeypatch.delenv("VECPLUG_INDEX_HNSW_EF_SEARCH")
    monkeypatch.delenv("VECPLUG_INDEX_HNSW_M")
    assert "store:      M 8, ef_construction 200, ef_search 512" in run("info")
    with vecplug.open_index() as index:  # as a plain vecplug search opens it
        assert (index.store._options["ef_search"], index.store._options["M"]) == (512, 8)
    monkeypatch.setenv("VECPLUG_INDEX_HNSW_EF_SEARCH", "64")  # a value set still wins
    with vecplug.open_index() as index:
        assert index.store._options["ef_search"] == 64 and index.manifest["store"]["ef_search"] == 512
    assert "1. 1.000 [en] en.txt" in run("search", "the quick brown fox jumps over the lazy dog", "-k", "1")


def test_search_arguments_are_checked_as_the_settings_are(corpus: Path, tiny_model: Path) -> None:
    """Index.search and search_batch refuse ef and rerank_depth below 1, as the settings do:
    ef=0 is not "unset" (the default breadth), rerank_depth=0 not "no rerank depth"."""
    import vecplug

    run("index", str(corpus), "--model", str(tiny_model), "-q")
    with vecplug.open_index() as index:
        for kwargs in ({"ef": 0}, {"ef": -5}, {"rerank_depth": 0}, {"rerank_depth": -1, "rerank": "teacher"}):
            name = next(iter(kwargs))
            with pytest.raises(vecplug.ConfigError, match=f"{name} must be at least 1, not {kwargs[name]}"):
                index.search("fox", k=2, **kwargs)
            with pytest.raises(vecplug.ConfigError, match=f"{name} must be at least 1"):
                index.search_batch(["fox", "agua"], k=2, **kwargs)
        assert [h.rank for h in index.search("fox", k=2, ef=1, rerank_depth=1)] == [1, 2]  # k over ef: fine
        with pytest.raises(vecplug.ConfigError, match="ef must be an integer, not float"):
            index.search("fox", k=2, ef=10.5)  # (as k and rerank_depth are)
    assert "rerank_depth must be at least 1" in run("search", "fox", "--rerank-depth", "0", ok=False)


def test_errors_are_clear() -> None:
    out = run("search", "anything", "--index", "nowhere", ok=False)
    assert "no vecplug index at nowhere" in out
    assert "Traceback" not in out
    out = run("index", ".", "--store", "elasticsearch", ok=False)
    assert "unknown store 'elasticsearch'" in out


def test_qdrant_embedded_store(corpus: Path, tiny_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("qdrant_edge")
    index = str(tmp_path / "q")
    run("index", str(corpus), "--model", str(tiny_model), "--store", "qdrant", "--index", index, "-q")
    out = json.loads(run("search", "el agua hierve a cien grados", "--store", "qdrant", "--index", index, "--json"))
    assert out["hits"][0]["id"] == "records.jsonl#r1"
    info = json.loads(run("info", "--store", "qdrant", "--index", index, "--json"))
    assert info["documents"] == 4 and info["languages"]["es"] == 1


def test_models_list() -> None:
    out = run("models", "list")
    assert "me5-small" in out and "not built" in out  # a fresh machine has nothing built


def test_help_is_fast_and_light() -> None:
    import subprocess
    import sys

    code = ("import sys, vecplug.cli; "
            "heavy = [m for m in ('torch', 'transformers', 'hnswlib', 'qdrant_client') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_search_modes_debias_and_rerank(corpus: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run("index", str(corpus), "--model", str(tiny_model), "--no-debias", "--index", "plain", "-q")
    assert "language-bias correction: off by default" in run("info", "--index", "plain")
    # info reads the manifest and encodes nothing: an encoder option is refused, not ignored
    assert "No such option '--model'" in run("info", "--index", "plain", "--model", str(tiny_model), ok=False)
    run("index", str(corpus), "--model", str(tiny_model), "-q")  # on unless asked otherwise
    assert "language-bias correction: on by default" in run("info")
    q = "the quick brown fox jumps over the lazy dog"
    # the query, said to be German, is centred by the German mean; the English copy by the English one
    on = json.loads(run("search", q, "--json", "--lang", "de"))
    off = json.loads(run("search", q, "--json", "--lang", "de", "--no-debias"))
    assert off["hits"][0]["id"] == "en.txt#0" and off["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    assert [h["score"] for h in on["hits"]] != pytest.approx([h["score"] for h in off["hits"]], abs=1e-3)
    only = json.loads(run("search", q, "--json", "--langs", "es,ru"))
    assert {h["lang"] for h in only["hits"]} <= {"es", "ru"} and only["hits"]
    teacher = json.loads(run("search", q, "--json", "--rerank", "teacher", "--rerank-depth", "3", "-k", "2"))
    assert len(teacher["hits"]) == 2 and teacher["hits"][0]["id"] == "en.txt#0"
    plain = json.loads(run("search", q, "--json", "--lang", "de", "-k", "4"))
    assert plain["hits"][0]["id"] == "en.txt#0"
    monkeypatch.setenv("VECPLUG_SEARCH_PREFER_BOOST", "10")  # the query's language always first
    prefer = json.loads(run("search", q, "--json", "--mode", "prefer", "--lang", "de", "-k", "4"))
    assert prefer["mode"] == "prefer" and prefer["hits"][0]["lang"] == "de"
    assert prefer["hits"][0]["score"] == pytest.approx(
        10 + next(h["score"] for h in plain["hits"] if h["lang"] == "de"), abs=1e-4)
    assert "unknown reranker" in run("search", q, "--rerank", "nope", ok=False).lower()
    assert "int8" in run("search", "--help") and "--fp32" in run("search", "--help")


def test_verify_finds_damage(corpus: Path, tiny_model: Path) -> None:
    """vecplug verify passes a sound index and names what is wrong in a damaged one, including
    damage the fast open does not look for (a file whose size and time were put back)."""
    import os
    import sqlite3

    run("index", str(corpus), "--model", str(tiny_model), "-q")
    out = run("verify", "--sample", "3")
    assert "no problems found" in out and "re-encoded 3 documents" in out
    index = Path(".vecplug")
    # a record changed behind vecplug's back, with the file's time put back
    db = index / "records.sqlite"
    st = db.stat()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE records SET text = 'tampered' WHERE id = 'en.txt#0'")
    os.utime(db, ns=(st.st_atime_ns, st.st_mtime_ns))
    out = run("verify", "--no-encode", ok=False)
    assert "record 'en.txt#0' fails its checksum" in out
    # a damaged graph: vecplug's own error, never a crash
    graph = next(index.glob("vectors-*.hnsw"))
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    out = run("verify", "--no-encode", ok=False)
    assert "cannot open" in out and "damaged" in out


def test_verify_sample_of_zero_skips_reencoding_and_a_negative_one_is_refused(corpus: Path, tiny_model: Path) -> None:
    """``--sample 0`` crashed on the lowest cosine of no documents; a negative sample in numpy."""
    from vecplug.config import load_settings
    from vecplug.errors import ConfigError
    from vecplug.verify import verify_index

    run("index", str(corpus), "--model", str(tiny_model), "-q")
    out = run("verify", "--sample", "0")
    assert "no problems found" in out and "re-encoding: skipped" in out and "re-encoded" not in out
    assert "Invalid value for '--sample'" in run("verify", "--sample", "-1", ok=False)
    with pytest.raises(ConfigError, match="0 or more, not -1"):
        verify_index(load_settings(), sample=-1)


def test_verify_names_the_first_five_bad_vectors_then_counts() -> None:
    """The count went up by a whole batch before the names were listed: six bad vectors in one
    batch named none of them."""
    from types import SimpleNamespace

    import numpy as np

    from vecplug.types import Document
    from vecplug.verify import VerifyReport, _vector_check

    ids = [f"d{i}" for i in range(8)]
    vectors = np.eye(8, 4, dtype=np.float32) * 2  # not unit length...
    vectors[6:] = [0.5, 0.5, 0.5, 0.5]  # ...but the last two
    store = SimpleNamespace(dim=4, manifest={},
                            get=lambda part: [Document(i, "text", "src", 0, "en") for i in part],
                            vectors=lambda part: vectors[[ids.index(i) for i in part]])
    report = VerifyReport("idx")
    _vector_check(SimpleNamespace(store=store), ids, report)
    assert report.problems == [f"document d{i}: vector is not finite or not of unit length" for i in range(5)] + [
        "... 6 such documents in all"]


def test_language_codes_from_flags_are_normalised(corpus: Path, tiny_model: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    q = "the quick brown fox jumps over the lazy dog"
    only = json.loads(run("search", q, "--json", "--langs", " ES , RU,"))
    assert only["hits"] and {h["lang"] for h in only["hits"]} <= {"es", "ru"}
    out = run("search", q, "--langs", "xx,es")  # a code the index does not hold: said so
    assert "note: the index has no documents in xx; it has de, en, es, ru" in out
    mono = json.loads(run("search", q, "--json", "--mode", "mono", "--lang", " DE "))
    assert mono["lang"] == "de" and [h["lang"] for h in mono["hits"]] == ["de"]
    out = run("search", q * 5, "--mode", "mono", "--lang", "fi")  # no Finnish documents
    assert "note: no documents in the query's language (fi)" in out
    assert f"{q[:30]}" in out and "..." in out and q * 2 not in out  # a long query shown cut
    # eval's --langs name XQuAD-R files (<lang>.json): the same codes
    from vecplug.indexer import datasets

    seen: dict[str, object] = {}

    def load_dataset(spec: str, *, langs: list[str] | None = None, split: str | None = None) -> None:
        seen["langs"] = langs
        raise datasets.DatasetError("stop here")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert "stop here" in run("eval", "xquad-r:x", "--langs", " DE , en,,", ok=False)
    assert seen["langs"] == ["de", "en"]


def test_unknown_env_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VECPLUG_SEARCH_BOGUS", "1")
    out = run("search", "fox", ok=False)
    assert "VECPLUG_SEARCH_BOGUS" in out and "rerank_depth" in out and "Traceback" not in out


def test_unreachable_qdrant_server_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import threading
    import warnings

    pytest.importorskip("qdrant_client")
    monkeypatch.setattr("vecplug.adapters.stores.qdrant.time.sleep", lambda seconds: None)  # no backoff
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    before = set(threading.enumerate())
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        out = run("search", "fox", "--url", url, "--index", "ignored", ok=False)
        for thread in set(threading.enumerate()) - before:  # the client checks versions in a thread
            thread.join(timeout=10)
    assert f"qdrant unreachable at {url}" in out and "after 3 tries" in out
    assert [str(w.message) for w in shown] == []  # the error alone, no client warning with it


def test_plain_model_as_query_encoder_is_refused(corpus: Path, tiny_model: Path,
                                                 other_tiny_model: Path) -> None:
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    out = run("search", "fox", "--query-encoder", str(other_tiny_model), ok=False)
    # not a student at all: its own checksum is no teacher's
    assert "not a student" in out and "distilled from a teacher" not in out
    assert str(other_tiny_model) in out and str(tiny_model) in out


def test_a_rerun_cuts_and_reads_as_the_index_was_built(tmp_path: Path, tiny_model: Path) -> None:
    """Passage size, overlap and embedded fields default to the index's: a plain re-run after
    `--chunk-tokens 20` cut every file again at 200 tokens, re-encoding the whole corpus."""
    root = tmp_path / "c"
    root.mkdir()
    (root / "long.txt").write_text(" ".join(f"word{i} water fox" for i in range(60)))
    first = run("index", str(root), "--model", str(tiny_model), "--chunk-tokens", "20", "--lang", "en", "-q")
    passages = int(first.split("indexed ")[1].split()[0])
    assert passages > 5
    again = run("index", str(root), "--lang", "en", "-q")
    assert f"indexed 0 documents from 1 files ({passages} unchanged, 0 removed" in again
    assert "passages of 20 tokens" in run("info")
    with pytest.raises(Exception, match="corpus.embed_fields names no field"):
        from vecplug.config import load_settings

        load_settings(overrides={"corpus": {"embed_fields": []}}, environ={})


def test_passages_longer_than_the_encoder_keeps_are_refused(tmp_path: Path, tiny_model: Path) -> None:
    """`--chunk-tokens 500` with documents cut at 256 tokens embedded half of every passage,
    silently; the default passage length is cut to what the encoder keeps (the tiny model:
    128 tokens, 126 without its special tokens)."""
    root = tmp_path / "c"
    root.mkdir()
    (root / "long.txt").write_text(" ".join(f"word{i} water fox" for i in range(100)))
    out = run("index", str(root), "--model", str(tiny_model), "--chunk-tokens", "200", "--lang", "en", "-q",
              ok=False)
    assert "corpus.chunk_tokens (200 tokens) is more than the document encoder keeps of a passage: 126 tokens" in out
    assert "--chunk-tokens 126 or less" in out
    out = run("index", str(root), "--model", str(tiny_model), "--lang", "en", "-q")
    assert "passages of 126 tokens" in run("info")
    assert "note:" not in out  # passages that fit exactly are not counted as cut

    # an index built before passages were fitted (its manifest says 200) is updated as it is:
    # another length would cut and encode every passage again; the passages cut are counted
    from vecplug.api import Index
    from vecplug.config import load_settings

    with Index.open(load_settings(overrides={"index": {"path": ".vecplug"}}), writable=True) as index:
        index.store.commit({"corpus": {**index.manifest["corpus"], "chunk_tokens": 200}})
    (root / "more.txt").write_text(" ".join(f"term{i} river stone" for i in range(100)))
    out = run("index", str(root), "--lang", "en", "-q")
    assert re.search(r"note: \d+ documents are longer than the document encoder keeps \(128 tokens\)", out)
    assert "this index's passages of 200 tokens do not fit either (up to 126 do): build it again with " \
           "--chunk-tokens 126" in out
    # the same length given again (a setting left from the first build) is the index's own
    assert "indexed 0 documents" in run("index", str(root), "--chunk-tokens", "200", "--lang", "en", "-q")


def test_a_record_kept_with_its_language_detected_is_not_called_skipped(tmp_path: Path, tiny_model: Path) -> None:
    """A record whose Lang is a language name is indexed with its language detected: the CLI
    said "skipped" for it."""
    root = tmp_path / "c"
    root.mkdir()
    (root / "x.csv").write_text("Title,Text,Lang\nHello,water boils at one hundred degrees,english\n")
    out = run("index", str(root), "--model", str(tiny_model), "-q")
    assert "note x.csv:2: document 'x.csv#L2': field lang: 'english' is not a language code" in out
    assert "skipped" not in out and "indexed 1 documents" in out


def test_records_longer_than_the_encoder_keeps_are_counted(tmp_path: Path, tiny_model: Path) -> None:
    """A JSONL record is one document, not cut into passages: one longer than the encoder keeps
    was embedded by its beginning only, without a word."""
    root = tmp_path / "c"
    root.mkdir()
    long = " ".join(["water boils at one hundred degrees"] * 40)
    (root / "r.jsonl").write_text(json.dumps({"id": "long", "text": long}) + "\n"
                                  + json.dumps({"id": "short", "text": "water"}) + "\n")
    out = run("index", str(root), "--model", str(tiny_model), "--lang", "en", "-q")
    assert ("note: 1 document is longer than the document encoder keeps (128 tokens): only the beginning is "
            "embedded") in out and "this index's passages" not in out
    # an index that recorded more than its model takes (before lengths were checked) names
    # the length its texts are cut at, not the recorded one
    import vecplug

    with vecplug.open_index(".vecplug", writable=True) as index:
        index.store.commit({"document_max_length": 256})
    (root / "r.jsonl").write_text(json.dumps({"id": "long2", "text": long}) + "\n")
    out = run("index", str(root), "--lang", "en", "-q")
    assert "note: 1 document is longer than the document encoder keeps (128 tokens)" in out


def test_settings_of_a_new_index_are_not_ignored_silently(corpus: Path, tiny_model: Path, tiny_student: Path) -> None:
    """--no-debias and --query-encoder set a new index's defaults; given to an existing index
    they were ignored without a word."""
    run("index", str(corpus), "--model", str(tiny_model), "-q")
    result = CliRunner().invoke(cli, ["index", str(corpus), "--no-debias", "--query-encoder", str(tiny_student),
                                      "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "note: --no-debias sets a new index's default; this one searches with the correction on" in result.output
    assert "note: --query-encoder sets a new index's query encoder; this one searches with" in result.output
    fresh = CliRunner().invoke(cli, ["index", str(corpus), "--index", "other", "--model", str(tiny_model),
                                     "--no-debias", "-q"], catch_exceptions=False)
    assert fresh.exit_code == 0 and "note:" not in fresh.output
    # a graph of centred vectors is made at creation only, and said so otherwise
    result = CliRunner().invoke(cli, ["index", str(corpus), "--centred-graph", "-q"], catch_exceptions=False)
    assert "note: --centred-graph shapes a new hnswlib index's graph" in result.output
    centred = CliRunner().invoke(cli, ["index", str(corpus), "--index", "third", "--model", str(tiny_model),
                                       "--centred-graph", "-q"], catch_exceptions=False)
    assert centred.exit_code == 0 and "note:" not in centred.output
    assert "centred True" in run("info", "--index", "third")
    import vecplug

    with vecplug.open_index("third") as index:
        assert index.store.centred and len(index.search("water", k=3).hits) == 3


def test_verify_names_records_without_vectors(corpus: Path, tiny_model: Path) -> None:
    """A record with no vector in the graph (a write torn half-way by an earlier version) made
    verify raise a traceback ("Label not found") instead of reporting it."""
    from vecplug.adapters.stores.hnsw import HnswStore

    run("index", str(corpus), "--model", str(tiny_model), "-q")
    store = HnswStore.open(".vecplug", {}, writable=True)
    try:
        store._sql("INSERT INTO records(label, id, text, source, position, lang, payload, crc) "
                   "VALUES (999, 'ghost', 'a ghost', 'api', 9, 'en', '{}', NULL)")
        store._dirty = True
        store.commit()
    finally:
        store.close()
    out = run("verify", "--sample", "10", ok=False)
    assert "document ghost: its record has no vector in the index" in out


def test_a_title_on_several_lines_is_shown_on_its_hit_s_line(tmp_path: Path, tiny_model: Path) -> None:
    """Each hit is one line and its snippet: a title's line breaks are shown as spaces (a block
    a hit is what readers of the output, such as ``make demo``, count on)."""
    root = tmp_path / "titled"
    root.mkdir()
    (root / "a.jsonl").write_text(json.dumps({"id": "t1", "title": "two\nlines\r\n title",
                                              "text": "the quick brown fox", "lang": "en"}) + "\n")
    run("index", str(root), "--model", str(tiny_model), "-q")
    out = run("search", "the quick brown fox", "-k", "1").splitlines()
    assert len(out) == 3 and out[1].endswith("a.jsonl — two lines title")
    assert ", 1 result in " in out[0]  # (not "1 results")


def test_an_index_whose_model_is_gone_says_so(corpus: Path, tiny_model: Path, tmp_path: Path) -> None:
    """The document encoder's folder moved after indexing: ``verify`` still runs and reports its
    other checks, and names the re-encoding as what failed; ``search`` says the missing model is
    the index's own."""
    import shutil

    model = tmp_path / "moved-later"
    shutil.copytree(tiny_model, model)
    run("index", str(corpus), "--model", str(model), "-q")
    shutil.rmtree(model)
    out = run("verify", ok=False)
    assert "files: the hnswlib store's full check" in out and "ids and counts: 4 documents" in out
    assert f"re-encoding: model '{model}'" in out and "--no-encode runs the other checks alone" in out
    assert "no problems found" in run("verify", "--no-encode")
    err = run("search", "fox", ok=False)
    assert f"was built with {model}: put the model back there" in err


def test_index_switches_turn_settings_off_as_well_as_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag beats the environment in both directions: --no-compile, --fp32-documents and
    --plain-graph turn off what VECPLUG_* turned on (the switches had no "off" form)."""
    import vecplug
    from vecplug.api import Index

    seen: list[Any] = []

    def capture(settings: Any, **kwargs: Any) -> Any:
        seen.append(settings)
        raise vecplug.VecplugError("stop here")

    monkeypatch.setattr(Index, "open", classmethod(lambda cls, settings, **kw: capture(settings)))
    monkeypatch.setenv("VECPLUG_MODEL_COMPILE", "true")
    monkeypatch.setenv("VECPLUG_MODEL_DOCUMENT_QUANTIZE", "int8")
    monkeypatch.setenv("VECPLUG_INDEX_HNSW_CENTRED", "true")
    run("index", str(tmp_path), ok=False)
    run("index", str(tmp_path), "--no-compile", "--fp32-documents", "--plain-graph", ok=False)
    run("index", str(tmp_path), "--compile", "--int8-documents", "--centred-graph", ok=False)
    got = [(s.model.compile, s.model.document_quantize, s.index.hnsw_centred) for s in seen]
    # ("none" reads as unset: float32 for a new index, an existing one's own otherwise)
    assert got == [(True, "int8", True), (False, None, False), (True, "int8", True)]


def test_a_query_student_given_as_the_document_model_is_named_so(corpus: Path, tiny_student: Path,
                                                                tiny_model: Path) -> None:
    """``index --model STUDENT``: refused with what the folder is and what to give instead (the
    message spoke of a query encoder the user never gave)."""
    out = run("index", str(corpus), "--model", str(tiny_student), ok=False)
    assert f"{tiny_student} is a query student" in out
    assert "give its teacher as the document encoder (--model) and it as the query encoder" in out
    run("index", str(corpus), "--model", str(tiny_model), "--query-encoder", str(tiny_student), "-q")
