"""Training the field-attention reranker's head: the torch math against the reranker's own,
the example reader, training on a synthetic task the identity head gets wrong, and the saved
head in the reranker. No transformer: the encoders are numpy tables built here."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vecplug.adapters.rerank import Query, RerankContext
from vecplug.adapters.rerank.fields import FieldAttentionReranker, field_attention, load_head
from vecplug.adapters.stores import Record, StoreHit
from vecplug.errors import ConfigError
from vecplug.indexer.field_head import (
    FieldExample,
    attention_scores,
    load_field_examples,
    read_head_metadata,
    save_head,
    train_field_head,
)
from vecplug.types import Problem

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    # the machine's cores are busy elsewhere; these tensors are tiny anyway
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- the math ------------------------------------------------------------------------------------

def _unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _reference(q: np.ndarray, F: np.ndarray, mask: np.ndarray, W: np.ndarray | None,
               scale: float) -> np.ndarray:
    return np.array([[field_attention(qb, F[n][mask[n]], scale, W).score for n in range(len(F))]
                     for qb in q])


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("scale", [20.0, 2.5])
def test_attention_scores_equal_the_rerankers_math(m: int, scale: float) -> None:
    rng = np.random.default_rng(m * 10 + int(scale))
    d, B, N = 6, 5, 9
    q, F = _unit(rng, B, d), _unit(rng, N, m, d)
    mask = rng.random((N, m)) < 0.6
    mask[np.arange(N), rng.integers(0, m, N)] = True  # every candidate has a field
    F[~mask] = 7.0  # padding must not count, whatever it holds
    for W in (None, np.eye(d) + 0.5 * rng.normal(size=(d, d))):
        want = _reference(q, F, mask, W, scale)
        Wt = torch.eye(d) if W is None else torch.from_numpy(W.astype(np.float32))
        got = attention_scores(torch.from_numpy(q.astype(np.float32)), torch.from_numpy(F.astype(np.float32)),
                               torch.from_numpy(mask), Wt, scale).numpy()
        assert got.shape == (B, N)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        # in float64 it is the same computation, to rounding
        got64 = attention_scores(torch.from_numpy(q), torch.from_numpy(F), torch.from_numpy(mask),
                                 torch.eye(d, dtype=torch.float64) if W is None else torch.from_numpy(W),
                                 scale).numpy()
        np.testing.assert_allclose(got64, want, atol=1e-12, rtol=0)
    if m == 3:
        assert (~mask).any()  # the masked case was exercised


def test_attention_scores_by_hand_and_zero_sums() -> None:
    # q = e0, fields e0 and e1, scale 1: weights e/(e+1), 1/(e+1); score e/sqrt(e^2+1)
    q = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    F = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
                      # e1 and -e1 get equal weights (q is orthogonal to both): they cancel
                      [[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]],
                      # a document without a present field
                      [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, True], [False, False]])
    W = torch.eye(3, dtype=torch.float64, requires_grad=True)
    s = attention_scores(q, F, mask, W, 1.0)
    assert s[0, 0].item() == pytest.approx(math.e / math.sqrt(math.e ** 2 + 1), abs=1e-12)
    assert s[0, 1].item() == 0.0 and s[0, 2].item() == 0.0
    assert field_attention(q[0].numpy(), F[1].numpy(), 1.0).score == 0.0  # the reference agrees
    s.sum().backward()
    assert torch.isfinite(W.grad).all()  # no NaN from the zero vectors


# -- reading examples --------------------------------------------------------------------------

def test_load_jsonl_examples(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    lines = [
        {"query": " fox facts ", "document": {"title": "Foxes", "description": "", "text": "All about foxes",
                                              "url": "http://x"},
         "negatives": [{"title": "Water"}, {"url": "only a url"}, "not an object"]},
        "{not json",
        '{"query": "q", "document": {"title": NaN}}',
        {"document": {"title": "no query"}},
        {"query": "q", "document": ["not", "an", "object"]},
        {"query": "q", "document": {"url": "none of the fields"}},
        {"query": "numbers", "document": {"title": 42, "description": True, "text": ["x"]}},
        {"query": "q", "document": {"title": "t"}, "negatives": {"title": "not a list"}},
        "[1, 2]",
    ]
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
                    + "\n\n", encoding="utf-8")
    problems: list[Problem] = []
    examples = load_field_examples(path, problems=problems)
    assert examples == [
        FieldExample("fox facts", (("title", "Foxes"), ("text", "All about foxes")),
                     ((("title", "Water"),),), f"{path}:1"),
        FieldExample("numbers", (("title", "42"),), (), f"{path}:7"),
    ]
    by_line = {(p.line, p.reason.split(":")[0]) for p in problems}
    assert {line for line, _ in by_line} == {1, 2, 3, 4, 5, 6, 8, 9}
    assert all(p.path == str(path) for p in problems)
    assert [p.line for p in problems if p.reason.startswith("negative")] == [1, 1]  # 2 and 3 left out
    assert any(p.line == 3 and "NaN" in p.reason for p in problems)
    # other fields, in the order given
    only = load_field_examples(path, fields=("text", "title"), problems=[])
    assert only[0].fields == (("text", "All about foxes"), ("title", "Foxes"))


def test_a_deeply_nested_jsonl_line_is_reported_not_a_traceback(tmp_path: Path) -> None:
    """json recurses once a nesting level: a line of 100,000 "[" raised RecursionError out of
    the reader (shared with BEIR files), where train_data's reader reports the line."""
    path = tmp_path / "train.jsonl"
    good = [json.dumps({"query": f"q{i}", "document": {"title": f"t{i}"}}) for i in range(3)]
    path.write_text("\n".join([good[0], "[" * 100000 + "]" * 100000, *good[1:]]) + "\n", encoding="utf-8")
    problems: list[Problem] = []
    examples = load_field_examples(path, problems=problems)
    assert [e.query for e in examples] == ["q0", "q1", "q2"]
    assert [(p.line, p.reason) for p in problems] == [(2, "malformed JSON: nested too deeply")]


def test_load_csv_examples(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_bytes(
        b"\xef\xbb\xbfquery,title,text,url\n"
        b"fox facts,Foxes,All about foxes,http://x\n"           # line 2
        b'"two, lines",,"a body\nover two lines",\n'             # lines 3-4: no title
        b",No query,text,\n"                                    # line 5
        b"too,many,cells,here,and more\n"                       # line 6
        b"bad bytes,\xff\xfe,text,\n"                          # line 7
        b"\n"
        b"no fields,, ,http://only\n"                           # line 9
        b"last,Last,,\n")                                       # line 10
    problems: list[Problem] = []
    examples = load_field_examples(path, problems=problems)
    assert examples == [
        FieldExample("fox facts", (("title", "Foxes"), ("text", "All about foxes")), (), f"{path}:2"),
        FieldExample("two, lines", (("text", "a body\nover two lines"),), (), f"{path}:3"),
        FieldExample("last", (("title", "Last"),), (), f"{path}:10"),
    ]
    assert [p.line for p in problems] == [5, 6, 7, 9]
    assert "UTF-8" in problems[2].reason and "5 cells, the header 4" in problems[1].reason


def test_an_unclosed_quote_in_a_csv_costs_its_own_row_only(tmp_path: Path) -> None:
    """A plain csv.reader over the whole text read every row after an unclosed quote into that
    quote's field: 1 example of 11 good rows, one misleading problem. The training data's
    strict reader reports the broken record by its line and reads on at the next line."""
    path = tmp_path / "train.csv"
    rows = ["query,title,text", "q1,t1,x1", '"q2 unclosed,t2,x2'] + [f"q{i},t{i},x{i}" for i in range(3, 13)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    problems: list[Problem] = []
    examples = load_field_examples(path, problems=problems)
    assert [e.query for e in examples] == ["q1"] + [f"q{i}" for i in range(3, 13)]
    assert [(p.path, p.line) for p in problems] == [(str(path), 3)]
    assert "malformed CSV" in problems[0].reason


def test_load_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q"}\nnot json\n', encoding="utf-8")
    problems: list[Problem] = []
    with pytest.raises(ConfigError, match="bad.jsonl holds no usable"):
        load_field_examples(bad, problems=problems)
    assert [p.line for p in problems] == [1, 2]
    empty = tmp_path / "empty.csv"
    empty.write_text("query,title\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="empty.csv"):
        load_field_examples(empty, problems=[])
    header = tmp_path / "header.csv"
    header.write_text("question,title\nq,t\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no column for 'query'"):
        load_field_examples(header, problems=[])
    with pytest.raises(ConfigError, match="does not exist"):
        load_field_examples(tmp_path / "missing.jsonl", problems=[])
    other = tmp_path / "data.txt"
    other.write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match=".jsonl or .csv"):
        load_field_examples(other, problems=[])


# -- training --------------------------------------------------------------------------------

class TableEncoder:
    """Texts to fixed unit vectors; records what it was asked to embed."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = {k: (v / np.linalg.norm(v)).astype(np.float32) for k, v in table.items()}
        self.queries: list[str] = []
        self.documents: list[str] = []

    def encode_queries(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        self.queries.extend(texts)
        return np.stack([self.table[t] for t in texts])

    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        self.documents.extend(texts)
        return np.stack([self.table[t] for t in texts])

    def describe(self) -> dict[str, Any]:
        return {"document_encoder": "table", "document_encoder_checksum": "abc123",
                "query_encoder": "table", "query_encoder_checksum": "abc123", "dim": 8}


def _title_task(n: int, seed: int = 0) -> tuple[TableEncoder, list[FieldExample]]:
    """Queries that match their document's title, while every body looks like every query.

    d = 8: titles are random in dims 0-5; every body is the shared direction g = e6 plus a
    little e7; a query is 0.5 title + 0.8 g. The identity head attends to the bodies (their
    cosine with any query is ~0.85, the title's 0.53), so every candidate reads as its body
    and the ranking is near chance; a head with q^T W g < 0 (W = I - 2 g g^T, a reflection,
    does it) attends to the titles and ranks the relevant document first.
    """
    rng = np.random.default_rng(seed)
    g = np.eye(8)[6]
    table: dict[str, np.ndarray] = {}
    for k in range(n):
        t = np.zeros(8)
        t[:6] = rng.normal(size=6)
        t /= np.linalg.norm(t)
        table[f"title {k}"] = t
        table[f"body {k}"] = g + 0.5 * rng.normal() * np.eye(8)[7]
        table[f"query {k}"] = 0.5 * t + 0.8 * g
    examples = [FieldExample(f"query {k}", (("title", f"title {k}"), ("text", f"body {k}")))
                for k in range(n)]
    return TableEncoder(table), examples


def _mrr(encoder: TableEncoder, queries: list[str], W: np.ndarray | None) -> float:
    """Held-out MRR recomputed with the reranker's numpy math: each query's document ranked
    among every held-out query's document."""
    ks = [int(q.split()[1]) for q in queries]
    t = encoder.table
    total = 0.0
    for k in ks:
        q = t[f"query {k}"]
        scores = {j: field_attention(q, np.stack([t[f"title {j}"], t[f"body {j}"]]), 20.0, W).score for j in ks}
        total += 1.0 / (1 + sum(s > scores[k] for j, s in scores.items() if j != k))
    return total / len(ks)


def test_training_learns_what_the_identity_head_misses(tmp_path: Path) -> None:
    encoder, examples = _title_task(160)
    logged: list[str] = []
    report = train_field_head(examples, encoder, epochs=5, batch_size=16, learning_rate=1e-2,
                              held_out=0.25, progress=False, log=logged.append)
    # each query and each field text embedded once, as the reranker embeds it: the bare text
    assert sorted(encoder.queries) == sorted(f"query {k}" for k in range(160))
    assert sorted(encoder.documents) == sorted([f"title {k}" for k in range(160)]
                                               + [f"body {k}" for k in range(160)])
    assert report.counts["held_out_queries"] == 40 and report.counts["train_examples"] == 120
    assert len(report.held_out_queries) == 40 and report.counts["field_texts"] == 320
    assert report.loss_after < report.loss_before - 0.5
    assert np.mean(report.losses[-8:]) < np.mean(report.losses[:8])
    assert report.mrr_before < 0.3 and report.mrr_after > report.mrr_before + 0.4
    assert report.improved
    assert [e["epoch"] for e in report.epochs] == [1, 2, 3, 4, 5]
    assert all(e["mrr_identity"] == report.mrr_before for e in report.epochs)
    assert report.epochs[-1]["mrr_trained"] == report.mrr_after
    # the figures are those of the reranker's own math on the held-out queries
    assert report.mrr_before == pytest.approx(_mrr(encoder, report.held_out_queries, None), abs=1e-9)
    assert report.mrr_after == pytest.approx(_mrr(encoder, report.held_out_queries, report.W), abs=1e-9)
    assert any("untrained head" in line for line in logged)
    assert report.W.dtype == np.float32 and report.W.shape == (8, 8)

    # saved, it loads as the reranker's head and reranks held-out queries better
    head = tmp_path / "heads" / "head.safetensors"
    save_head(head, report.W, report.metadata(data="train.jsonl"))
    assert not [p for p in head.parent.iterdir() if p != head]  # no temporary file left
    np.testing.assert_array_equal(load_head(head), report.W)
    reranker = FieldAttentionReranker(head=str(head))
    np.testing.assert_array_equal(reranker.weight, report.W)
    meta = read_head_metadata(head)
    assert meta["format"] == "vecplug-field-head/1" and meta["data"] == "train.jsonl"
    assert meta["mrr_before"] == report.mrr_before and meta["mrr_after"] == report.mrr_after
    assert meta["encoder"]["document_encoder_checksum"] == "abc123"
    assert meta["counts"]["examples"] == 160 and meta["config"]["scale"] == 20.0

    context = RerankContext(encoder, None, lambda *a: np.zeros(0))
    ks = [int(q.split()[1]) for q in report.held_out_queries]
    cands = [StoreHit(Record(f"d{k}", f"body {k}", "s.jsonl", k, None, {"title": f"title {k}"}), 0.0)
             for k in ks]
    queries = [Query(f"query {k}", None, encoder.table[f"query {k}"]) for k in ks]
    top_plain = [r[0].record.id for r in FieldAttentionReranker().rerank(queries, [cands] * len(ks), context)]
    ranked = reranker.rerank(queries, [cands] * len(ks), context)
    top_trained = [r[0].record.id for r in ranked]
    hits_plain = sum(top == f"d{k}" for top, k in zip(top_plain, ks))
    hits_trained = sum(top == f"d{k}" for top, k in zip(top_trained, ks))
    assert hits_trained > hits_plain + 10
    # and its scores are the trained torch math's
    want = attention_scores(torch.from_numpy(np.stack([q.vector for q in queries])),
                            torch.from_numpy(np.stack([np.stack([encoder.table[f"title {k}"],
                                                                 encoder.table[f"body {k}"]]) for k in ks])),
                            torch.ones(len(ks), 2, dtype=torch.bool), torch.from_numpy(report.W), 20.0).numpy()
    got = {(b, h.record.id): h.score for b, hits in enumerate(ranked) for h in hits}
    assert all(got[b, f"d{k}"] == pytest.approx(float(want[b, n]), abs=1e-5)
               for b in range(len(ks)) for n, k in enumerate(ks))


def test_training_is_seeded_and_checks_its_settings() -> None:
    encoder, examples = _title_task(24)
    # a negative, and a query with two relevant documents: neither may break the loss
    examples[0] = FieldExample("query 0", examples[0].fields, ((("title", "title 5"),),))
    examples.append(FieldExample("query 1", (("title", "title 2"),)))
    kwargs: dict[str, Any] = {"epochs": 2, "batch_size": 8, "learning_rate": 1e-2, "progress": False,
                              "log": lambda s: None}
    a = train_field_head(examples, encoder, seed=3, **kwargs)
    b = train_field_head(examples, encoder, seed=3, **kwargs)
    c = train_field_head(examples, encoder, seed=4, **kwargs)
    np.testing.assert_array_equal(a.W, b.W)
    assert a.losses == b.losses and all(math.isfinite(x) for x in a.losses)
    assert not np.array_equal(a.W, c.W)
    assert a.counts["negatives"] == 1 and a.counts["documents"] == 26
    none = train_field_head(examples, encoder, held_out=0.0, **kwargs)
    assert none.mrr_before is None and none.mrr_after is None and none.counts["held_out_queries"] == 0
    # no epoch: the identity, which is the untrained reranker; one batch holds every example
    zero = train_field_head(examples, encoder, epochs=0, batch_size=100, held_out=0.0, progress=False,
                            log=lambda s: None)
    np.testing.assert_array_equal(zero.W, np.eye(8, dtype=np.float32))
    assert zero.loss_after == pytest.approx(zero.loss_before)
    # the loss by hand: cross-entropy of 20 x score over every document, the relevant one the
    # target, the other document relevant to the same query left out
    t = encoder.table
    docs = list(dict.fromkeys(d for ex in examples for d in (ex.fields, *ex.negatives)))
    relevant: dict[str, set] = {}
    for ex in examples:
        relevant.setdefault(ex.query, set()).add(ex.fields)
    total = 0.0
    for ex in examples:
        q = t[ex.query]
        logits = {d: 20.0 * field_attention(q, np.stack([t[x] for _, x in d]), 20.0).score for d in docs
                  if d == ex.fields or d not in relevant[ex.query]}
        total += math.log(sum(math.exp(v) for v in logits.values())) - logits[ex.fields]
    assert len(docs) == 26 and zero.loss_before == pytest.approx(total / len(examples), abs=1e-4)
    for bad in ({"held_out": 1.0}, {"scale": 0.0}, {"batch_size": 0}, {"learning_rate": -1.0}):
        with pytest.raises(ConfigError):
            train_field_head(examples, encoder, **{**kwargs, **bad})
    with pytest.raises(ConfigError):
        train_field_head([], encoder, **kwargs)


def test_save_head_refuses_what_load_head_would(tmp_path: Path) -> None:
    tmp_path = tmp_path / "heads"
    with pytest.raises(ValueError, match="square"):
        save_head(tmp_path / "h.safetensors", np.ones((2, 3)), {})
    with pytest.raises(ValueError, match="finite"):
        save_head(tmp_path / "h.safetensors", np.full((2, 2), np.nan), {})
    assert not tmp_path.exists()
    # an existing head is replaced whole
    path = tmp_path / "h.safetensors"
    save_head(path, np.eye(3), {"run": 1})
    save_head(path, 2 * np.eye(2), {"run": 2, "where": tmp_path})
    np.testing.assert_array_equal(load_head(path), 2 * np.eye(2, dtype=np.float32))
    assert read_head_metadata(path)["run"] == 2 and read_head_metadata(path)["where"] == str(tmp_path)
