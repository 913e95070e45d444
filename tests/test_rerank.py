"""Second-stage rerankers: cross-encoder, teacher, field attention, and their registry.

Everything runs on tiny models built here (no network, no real model): the cross-encoder is
a one-layer BERT trained for a few seconds on a toy relevance task, the teacher is the
session's tiny BERT with a real hnswlib index.
"""
from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vecplug.adapters.rerank import (
    BUILTIN_RERANKERS,
    Query,
    RerankContext,
    Reranker,
    available_rerankers,
    get_reranker,
    order_by_scores,
)
from vecplug.adapters.stores import Record, StoreHit, get_store_class
from vecplug.errors import ConfigError, ModelError, ModelMismatchError, UnknownBackendError

# scores compared with float32 logits and vectors, whatever this CPU's ``model.precision: auto``
# is (bfloat16 with AMX); the bfloat16 cross-encoder has its own test
pytestmark = pytest.mark.usefixtures("float32_torch")

# -- a toy cross-encoder ---------------------------------------------------------------

# Two topics in four languages, words of the tiny tokenizer's training text. A document is
# relevant to a query when its words are of the query's topic: the model must read the
# query and the document together to tell (neither alone says anything).
TOPICS = [
    ["fox", "dog", "quick", "brown", "lazy", "jumps", "hund", "fuchs", "zorro", "perro"],
    ["water", "boils", "degrees", "hundred", "wasser", "kocht", "grad", "agua", "hierve", "grados"],
]


def _query(rng: np.random.Generator, topic: int) -> list[str]:
    return list(rng.choice(TOPICS[topic], 2, replace=False))


def _doc(rng: np.random.Generator, topic: int, avoid: Sequence[str] = ()) -> str:
    words = [w for w in TOPICS[topic] if w not in avoid]
    return " ".join(rng.choice(words, int(rng.integers(2, 5)), replace=False))


def _pairs(rng: np.random.Generator, n: int) -> tuple[list[str], list[str], list[float]]:
    qs, ds, ys = [], [], []
    for _ in range(n):
        t = int(rng.integers(2))
        q = _query(rng, t)
        relevant = rng.random() < 0.5
        qs.append(" ".join(q))
        ds.append(_doc(rng, t, q) if relevant else _doc(rng, 1 - t))
        ys.append(1.0 if relevant else 0.0)
    return qs, ds, ys


def _pair_tokenizer(tiny_model: Path, folder: Path) -> Any:
    """The tiny model's tokenizer, taught pairs: ``[CLS] A [SEP] B [SEP]``, B with type 1."""
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = json.loads((tiny_model / "tokenizer.json").read_text())
    tok["post_processor"]["pair"] = [
        {"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
        {"SpecialToken": {"id": "[SEP]", "type_id": 1}}]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(str(folder))


def build_cross_encoder(tiny_model: Path, folder: Path, num_labels: int = 1, seed: int = 0,
                        train: bool = False) -> Path:
    """A one-layer BertForSequenceClassification with the tiny tokenizer, trained on the toy
    task if ``train`` (until it has learnt it, a few seconds)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tok = _pair_tokenizer(tiny_model, folder)
    # the tiny tokenizer's ids differ from build to build (its trainer breaks ties in hash
    # order), so one seed cannot be relied on: a run that has not learnt after 300 steps
    # starts over with the next seed (with a wide init and a warm-up, ~1 in 30 needs it)
    for attempt in range(3 if train else 1):
        torch.manual_seed(seed + attempt)
        config = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=128, num_labels=num_labels,
                            initializer_range=0.1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = BertForSequenceClassification(config)
        if not train:
            break
        accuracy = _train(model, tok, seed + attempt)
        if accuracy >= 0.98:
            break
    else:
        pytest.fail(f"the toy cross-encoder did not learn its task (accuracy {accuracy}): a setup "
                    "failure, not a reranker one")
    model.save_pretrained(str(folder))
    return folder


def _train(model: Any, tok: Any, seed: int, max_steps: int = 300) -> float:
    """Binary cross-entropy on toy pairs; the held-out accuracy it reached."""
    import torch

    rng = np.random.default_rng(seed)
    val_q, val_d, val_y = _pairs(np.random.default_rng(seed + 1000), 200)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    accuracy = 0.0
    for step in range(1, max_steps + 1):
        model.train()
        qs, ds, ys = _pairs(rng, 32)
        logits = model(**tok(qs, ds, padding=True, return_tensors="pt")).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(ys))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 and step >= 150:
            model.eval()
            with torch.no_grad():
                s = model(**tok(val_q, val_d, padding=True, return_tensors="pt")).logits[:, 0].numpy()
            accuracy = float(((s > 0) == (np.array(val_y) > 0)).mean())
            if accuracy >= 0.98:
                break
    model.eval()
    return accuracy


@pytest.fixture(scope="module")
def trained_ce(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tiny_model, tmp_path_factory.mktemp("ce") / "trained", train=True)


def hits(texts: Sequence[str], scores: Sequence[float] | None = None,
         payloads: Sequence[dict[str, Any]] | None = None,
         langs: Sequence[str] | None = None) -> list[StoreHit]:
    scores = scores if scores is not None else [1.0 - 0.1 * i for i in range(len(texts))]
    payloads = payloads or [{} for _ in texts]
    langs = langs or ["en"] * len(texts)
    return [StoreHit(Record(f"d{i}", t, "src", i, lang, dict(p)), s)
            for i, (t, s, p, lang) in enumerate(zip(texts, scores, payloads, langs))]


def no_context() -> RerankContext:
    """The cross-encoder reads only the candidates' texts."""
    def refuse(*args: Any) -> np.ndarray:
        raise AssertionError("the cross-encoder must not need first-stage scores")

    return RerankContext(encoder=None, store=None, score_vectors=refuse)


def test_cross_encoder_puts_relevant_first(trained_ce: Path) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    reranker = CrossEncoderReranker(str(trained_ce), batch_size=7)  # batches cut across queries
    rng = np.random.default_rng(4242)  # held out: the training used other seeds
    queries, candidates, relevant = [], [], []
    for i in range(24):
        t = i % 2
        q = _query(rng, t)
        docs = [_doc(rng, 1 - t) for _ in range(3)] + [_doc(rng, t, q)]  # relevant one last
        queries.append(Query(" ".join(q), "en", np.zeros(4, np.float32)))
        candidates.append(hits(docs))
        relevant.append(docs[-1])
    out = reranker.rerank(queries, candidates, no_context())
    assert len(out) == len(queries)
    # each score is the model's logit for that very pair (padding and batching leave no trace)
    pairs = [(q.text, h.record.text) for q, c in zip(queries, candidates) for h in c]
    direct = dict(zip(pairs, _direct_logits(trained_ce, pairs)[:, 0]))
    for q, got in zip(queries, out):
        np.testing.assert_allclose([h.score for h in got], [direct[q.text, h.record.text] for h in got],
                                   atol=1e-4)
    for got, cands, rel in zip(out, candidates, relevant):
        assert sorted(h.record.id for h in got) == sorted(h.record.id for h in cands)
        assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
        assert got[0].record.text == rel
    desc = reranker.describe()
    assert desc["name"] == "cross-encoder" and desc["max_length"] == 256
    assert desc["path"] == str(trained_ce.resolve()) and len(desc["checksum"]) == 64
    # scores do not depend on batching or on which other queries share the call
    alone = CrossEncoderReranker(str(trained_ce), batch_size=1).rerank(queries[:1], candidates[:1],
                                                                       no_context())[0]
    assert [h.record.id for h in alone] == [h.record.id for h in out[0]]
    np.testing.assert_allclose([h.score for h in alone], [h.score for h in out[0]], atol=1e-4)


def test_cross_encoder_in_bfloat16_keeps_the_ranking(trained_ce: Path) -> None:
    """``precision="bfloat16"``: the scores of the float32 model to bfloat16's precision, the
    same order where float32's scores are not within that precision of each other."""
    import torch

    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    rng = np.random.default_rng(7)
    pairs = []
    for i in range(40):
        q = _query(rng, i % 2)
        pairs += [(" ".join(q), _doc(rng, i % 2, q)), (" ".join(q), _doc(rng, 1 - i % 2))]
    fp32 = CrossEncoderReranker(str(trained_ce), precision="float32")
    bf16 = CrossEncoderReranker(str(trained_ce), precision="bfloat16")
    a, b = fp32.score_pairs(pairs), bf16.score_pairs(pairs)
    assert b.dtype == np.float32
    assert np.abs(a - b).max() < 0.05 * max(1.0, float(np.abs(a).max()))
    assert not np.array_equal(a, b)  # it did compute in bfloat16
    assert ((a[0::2] > a[1::2]) == (b[0::2] > b[1::2])).mean() >= 0.95
    assert bf16.describe()["precision"] == "bfloat16" and fp32.describe()["precision"] == "float32"
    assert bf16.model.classifier.weight.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="unknown precision"):
        CrossEncoderReranker(str(trained_ce), precision="half")


def _direct_logits(folder: Path, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """Each pair alone (no padding), straight through transformers."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return np.stack([model(**tok(q, d, return_tensors="pt")).logits[0].numpy() for q, d in pairs])


def test_cross_encoder_two_labels_score_is_log_odds(tiny_model: Path, tmp_path: Path) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    folder = build_cross_encoder(tiny_model, tmp_path / "ce2", num_labels=2, seed=3)
    # lengths grow with the index, so the reranker's longest-first batches reverse the order
    docs = ["water", "el perro", "wasser kocht bei hundert grad",
            "the quick brown fox jumps over the lazy dog",
            "agua hierve a cien grados y el zorro marrón salta sobre el perro perezoso"]
    pairs = [("fox dog", d) for d in docs]
    logits = _direct_logits(folder, pairs)
    expected = logits[:, 1] - logits[:, 0]
    reranker = CrossEncoderReranker(str(folder), batch_size=2)
    np.testing.assert_allclose(reranker.score_pairs(pairs), expected, atol=1e-4)
    assert reranker.num_labels == 2
    got = reranker.rerank([Query("fox dog", None, np.zeros(4, np.float32))], [hits(docs)], no_context())[0]
    assert [h.record.text for h in got] == [docs[i] for i in np.argsort(-expected, kind="stable")]


def test_cross_encoder_refuses_other_label_counts(tiny_model: Path, tmp_path: Path) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    folder = build_cross_encoder(tiny_model, tmp_path / "ce3", num_labels=3)
    reranker = CrossEncoderReranker(str(folder))
    with pytest.raises(ModelError, match="3 labels"):
        reranker.warm_up(no_context())


def test_cross_encoder_model_errors(tiny_model: Path, tmp_path: Path) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    with pytest.raises(ModelError, match="does not exist"):
        CrossEncoderReranker(str(tmp_path / "no" / "such-model"))
    with pytest.raises(ModelError, match="not a cross-encoder"):
        CrossEncoderReranker(str(tiny_model))  # an embedding model: BertModel
    with pytest.raises(ModelError, match="embedding models"):
        CrossEncoderReranker("me5-small")  # and nothing gets built
    # a folder that names no architecture is judged by its weights: no trained head
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model, bare)
    config = json.loads((bare / "config.json").read_text())
    config.pop("architectures", None)
    (bare / "config.json").write_text(json.dumps(config))
    reranker = CrossEncoderReranker(str(bare))
    with pytest.raises(ModelError, match="not a trained cross-encoder.*classifier"):
        reranker.warm_up(no_context())
    with pytest.raises(ModelError, match="could not get model .some-org"):  # offline (conftest)
        CrossEncoderReranker("some-org/some-cross-encoder")


def test_cross_encoder_scores_from_threads_as_alone(trained_ce: Path) -> None:
    """One reranker shared by threads (an Index is): each call's pairs cut as its own length
    asks (the tokenizer's truncation is state of its Rust object, set by each call: threads'
    calls interleaved ran with each other's and failed)."""
    from concurrent.futures import ThreadPoolExecutor

    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    import random

    reranker = CrossEncoderReranker(str(trained_ce), max_length=24, batch_size=8, precision="float32")
    rng = random.Random(0)
    words = "the quick brown fox jumps over lazy dog water boils at one hundred degrees".split()
    # queries of 2 words and of 30 (cut on both sides, "longest_first"), documents of 5 to 60
    queries = [" ".join(rng.choice(words) for _ in range(rng.choice([2, 30]))) for _ in range(20)]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(10)]
    calls = [[(queries[rng.randrange(20)], d) for d in docs] for _ in range(320)]
    alone = [reranker.score_pairs(pairs) for pairs in calls]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(reranker.score_pairs, calls))
    for scores, want in zip(together, alone):
        np.testing.assert_allclose(scores, want, atol=1e-6)


def test_cross_encoder_truncates_long_inputs(trained_ce: Path) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker

    reranker = CrossEncoderReranker(str(trained_ce), max_length=16)
    reranker.load()
    seen: list[Any] = []
    reranker.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].clone()), with_kwargs=True)
    long_doc = " ".join(["water boils at one hundred degrees"] * 200)  # ~1200 tokens: past 128 positions
    long_query = " ".join(["the quick brown fox"] * 50)  # the query alone exceeds max_length
    mid_query = "the quick brown fox jumps over the lazy"  # fits, but leaves little room
    mid_doc = "water boils at one hundred degrees wasser kocht"
    pairs = [("fox dog", long_doc), (long_query, "water"), (long_query, long_doc), ("fox dog", "perro"),
             (mid_query, mid_doc)]
    scores = reranker.score_pairs(pairs)
    assert np.isfinite(scores).all()
    assert all(batch.shape[1] <= 16 for batch in seen)
    rows = [row[row != reranker.tokenizer.pad_token_id].tolist() for batch in seen for row in batch]
    tok = reranker.tokenizer
    # while the query fits, only the document side is cut; a query that does not fit is cut too
    for q, d in pairs:
        strategy = "longest_first" if q is long_query else "only_second"
        assert tok(q, d, truncation=strategy, max_length=16)["input_ids"] in rows
    assert (tok(mid_query, mid_doc, truncation="only_second", max_length=16)["input_ids"] !=
            tok(mid_query, mid_doc, truncation="longest_first", max_length=16)["input_ids"])


# -- the teacher --------------------------------------------------------------------------

def _indexed(encoder: Any, records: Sequence[Record], folder: Path) -> Any:
    """An hnswlib store of ``records`` as ``encoder`` encodes documents, committed."""
    store = get_store_class("hnswlib").create(str(folder), encoder.dim,
                                              {"document_encoder": "tiny", "dim": encoder.dim}, {})
    store.upsert(list(records), encoder.encode_documents([r.text for r in records]))
    store.commit()
    return store


def test_teacher_rescores_with_the_document_encoder(tiny_model: Path, other_tiny_model: Path,
                                                    tmp_path: Path) -> None:
    from vecplug.adapters.rerank.teacher import TeacherReranker
    from vecplug.indexer.encoder import Encoder

    # the student (query side) is another model: the teacher must use the document side, the
    # query prefix and the query length (6 tokens cuts these queries)
    encoder = Encoder.from_specs(str(tiny_model), str(other_tiny_model), query_prefix="query: ",
                                 document_prefix="passage: ", query_max_length=6)
    texts = ["the quick brown fox jumps over the lazy dog", "water boils at one hundred degrees",
             "der schnelle braune fuchs springt über den faulen hund", "wasser kocht bei hundert grad",
             "el agua hierve a cien grados", "水在一百度沸腾"]
    records = [Record(f"doc{i}", t, "src", i, None, {}) for i, t in enumerate(texts)]
    store = _indexed(encoder, records, tmp_path / "idx")
    try:
        def exact(qv: np.ndarray, cands: Sequence[StoreHit], lang: str | None) -> np.ndarray:
            return store.vectors([h.record.id for h in cands]) @ qv

        context = RerankContext(encoder, store, exact)
        queries = ["water boiling at one hundred degrees, how hot?", "a quick brown fox and a lazy dog"]
        student = encoder.encode_queries(queries)
        first = [store.search(v, len(texts)) for v in student]
        first[1] = first[1][::-1]  # any first-stage order: the teacher's is what counts
        reranker = TeacherReranker()
        reranker.warm_up(context)
        out = reranker.rerank([Query(q, None, v) for q, v in zip(queries, student)], first, context)

        teacher = encoder.document.encode(queries, "query: ", 6)
        for q_vec, got in zip(teacher, out):
            stored = store.vectors([h.record.id for h in got])
            cosine = stored @ q_vec / np.linalg.norm(stored, axis=1) / np.linalg.norm(q_vec)
            np.testing.assert_allclose([h.score for h in got], cosine, atol=1e-5)
            assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
            assert sorted(h.record.id for h in got) == sorted(r.id for r in records)
        # the check can fail: the student's vectors, or the teacher without the query prefix
        # or length, give other scores
        wrong = [encoder.document.encode(queries, "", 6), encoder.document.encode(queries, "query: ", 64),
                 student]
        for other in wrong:
            diff = max(np.abs(store.vectors([h.record.id for h in got]) @ other[i] -
                              np.array([h.score for h in got])).max() for i, got in enumerate(out))
            assert diff > 1e-3
        assert reranker.describe()["name"] == "teacher"
        assert reranker.rerank([Query("x", None, student[0])], [[]], context) == [[]]
    finally:
        store.close()


def test_teacher_int8_rescores_with_the_teachers_int8_query_weights(tiny_model: Path, tiny_student: Path,
                                                                   tmp_path: Path) -> None:
    """``teacher:int8``: the teacher's queries in int8 (its own copy, loaded on first use, with
    the student's vocabulary table), scored as the float teacher's are, not equal to them."""
    import torch

    from vecplug.indexer.encoder import Encoder

    encoder = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none",
                                 query_prefix="query: ", document_prefix="passage: ")
    texts = ["the quick brown fox jumps over the lazy dog", "water boils at one hundred degrees",
             "der schnelle braune fuchs springt über den faulen hund", "el agua hierve a cien grados"]
    records = [Record(f"doc{i}", t, "src", i, None, {}) for i, t in enumerate(texts)]
    store = _indexed(encoder, records, tmp_path / "idx")
    try:
        context = RerankContext(encoder, store, lambda qv, cands, lang:
                                store.vectors([h.record.id for h in cands]) @ qv)
        queries = ["water boiling at one hundred degrees", "a quick brown fox and a lazy dog"]
        student = encoder.encode_queries(queries)
        first = [store.search(v, len(texts)) for v in student]
        reranker = get_reranker("teacher:int8")
        assert reranker.describe() == {"name": "teacher", "model": "the index's document encoder",
                                       "quantize": "int8"}
        reranker.warm_up(context)
        teacher8 = encoder.teacher_queries("int8")
        assert teacher8 is not encoder.document and teacher8 is encoder.teacher_queries("int8")
        assert any(callable(getattr(m, "weight", None)) for m in teacher8.model.modules())  # int8 layers
        # under torch every linear layer int8 but the first layer's FFN down-projection (the
        # documents' recipe keeps every down-projection in float32)
        assert [name for name, m in teacher8.model.named_modules() if type(m) is torch.nn.Linear] == \
            ["encoder.layer.0.output.dense.linear"]
        assert all(type(m) is torch.nn.Linear for m in encoder.document.model.modules() if hasattr(m, "in_features"))
        # one vocabulary table for the student, the int8 teacher and the documents' teacher
        ptr = {side.model.get_input_embeddings().weight.data_ptr()
               for side in (encoder.query, teacher8, encoder.document)}
        assert len(ptr) == 1

        out = reranker.rerank([Query(q, None, v) for q, v in zip(queries, student)], first, context)
        int8 = teacher8.encode(queries, "query: ", encoder.query_max_length)
        fp32 = encoder.document.encode(queries, "query: ", encoder.query_max_length)
        for i, got in enumerate(out):
            stored = store.vectors([h.record.id for h in got])
            # (the tiny model's int8 vectors differ from its float ones by ~1e-5)
            np.testing.assert_allclose([h.score for h in got], stored @ int8[i], rtol=0, atol=1e-7)
            assert np.abs(stored @ fp32[i] - np.array([h.score for h in got])).max() > 1e-6
        assert (int8 * fp32).sum(1).min() > 0.95  # int8 stays close to the float teacher
        assert encoder.teacher_queries(None) is encoder.teacher_queries("none") is encoder.document
    finally:
        store.close()
    # loaded first, the int8 teacher's table is the one the student and the documents take
    first = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none")
    tables = [side.model.get_input_embeddings().weight.data_ptr()
              for side in (first.teacher_queries("int8"), first.query, first.document)]
    assert len(set(tables)) == 1
    # the teacher as its own query encoder, already in int8: that model, not a second one
    alone = Encoder.from_specs(str(tiny_model), query_quantize="int8")
    assert alone.teacher_queries("int8") is alone.query
    # ... in the same recipe (TEACHER_QUERY_RECIPE)
    assert [name for name, m in alone.query.model.named_modules() if type(m) is torch.nn.Linear] == \
        ["encoder.layer.0.output.dense.linear"]
    with pytest.raises(ConfigError, match="teacher reranker: unknown quantisation 'fp16'"):
        get_reranker("teacher:fp16")
    with pytest.raises(ConfigError, match="unknown quantisation 'int4'"):
        alone.teacher_queries("int4")


@pytest.mark.parametrize(("precision", "runtime", "machine", "expected"), [
    ("float32", "torch", "x86_64", "int8"),  # a CPU without AMX: int8 pays there
    ("bfloat16", "torch", "x86_64", None),  # AMX: int8 gained nothing
    ("float32", "onnx", "x86_64", None),  # not measured under ONNX Runtime
    ("float32", "torch", "aarch64", None),  # torch's int8 kernels elsewhere are another implementation
])
def test_teacher_auto_is_int8_where_the_teacher_runs_in_float32_on_x86(
        precision: str, runtime: str, machine: str, expected: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from vecplug.indexer.encoder import teacher_quantize_for

    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert teacher_quantize_for("auto", precision, runtime) == expected
    # the explicit settings are what they say, wherever they run
    assert teacher_quantize_for("int8", precision, runtime) == "int8"
    assert teacher_quantize_for("none", precision, runtime) is None
    assert teacher_quantize_for(None, precision, runtime) is None
    with pytest.raises(ConfigError, match="unknown quantisation 'int4'.*none, int8, auto"):
        teacher_quantize_for("int4", precision, runtime)


@pytest.mark.parametrize(("precision", "int8"), [("float32", True), ("bfloat16", False)])
def test_teacher_auto_reranks_with_the_teacher_it_resolves_to(precision: str, int8: bool, tiny_model: Path,
                                                             tiny_student: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``teacher:auto`` on an x86 CPU: the int8 teacher when the encoder runs in float32, the
    document encoder as loaded in bfloat16; its scores are that teacher's, and ``describe``
    says which it ran."""
    import platform

    from vecplug.indexer.encoder import Encoder

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    encoder = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none", precision=precision,
                                 query_prefix="query: ", document_prefix="passage: ")
    texts = ["the quick brown fox jumps over the lazy dog", "water boils at one hundred degrees",
             "el agua hierve a cien grados"]
    store = _indexed(encoder, [Record(f"doc{i}", t, "src", i, None, {}) for i, t in enumerate(texts)],
                     tmp_path / "idx")
    try:
        context = RerankContext(encoder, store, lambda qv, cands, lang:
                                store.vectors([h.record.id for h in cands]) @ qv)
        reranker = get_reranker("teacher:auto")
        assert reranker.describe()["quantize"] == "auto" and "resolved" not in reranker.describe()
        reranker.warm_up(context)
        assert (encoder._teacher_int8 is not None) is int8
        assert reranker.describe()["resolved"] == ("int8" if int8 else "none")
        query = "water boiling at one hundred degrees"
        student = encoder.encode_queries([query])
        got = reranker.rerank([Query(query, None, student[0])], [store.search(student[0], len(texts))], context)[0]
        teacher = encoder.teacher_queries("int8" if int8 else None)
        expected = store.vectors([h.record.id for h in got]) @ teacher.encode([query], "query: ",
                                                                             encoder.query_max_length)[0]
        np.testing.assert_allclose([h.score for h in got], expected, rtol=0, atol=1e-6)
        assert encoder.teacher_queries("auto") is teacher
    finally:
        store.close()


def test_teacher_drops_candidates_removed_while_it_reranks(tmp_path: Path) -> None:
    """A writer commits a delete while a reader's search reranks: the removed candidates are
    dropped (their vectors are gone), the others reranked; never a KeyError."""
    from conftest import FakeEncoder
    from vecplug.adapters.rerank.teacher import TeacherReranker
    from vecplug.api import Index
    from vecplug.config import load_settings

    encoder = FakeEncoder(16)
    texts = [f"hund katze {i}" for i in range(5)]
    records = [Record(f"d{i}", t, "s", 0, "de" if i % 2 else "en") for i, t in enumerate(texts)]
    vectors = encoder.encode_documents(texts)
    cls = get_store_class("hnswlib")
    writer = cls.create(str(tmp_path / "idx"), 16, {"dim": 16}, {})
    writer.upsert(records, vectors)
    writer.commit()
    reader = Index(load_settings(), cls.open(str(tmp_path / "idx"), {}), writable=False)

    class Teacher:  # the teacher's encoder: the writer commits while it runs
        def encode(self, texts: list[str], prefix: str, max_length: int, progress: bool = False) -> np.ndarray:
            writer.delete(["d1", "d2"])
            writer.commit()
            return encoder.encode_documents(texts)

    teacher = Teacher()
    encoder.teacher_queries = lambda quantize: teacher  # as Encoder.teacher_queries gives it
    encoder.teacher_vectors = lambda texts, quantize: teacher.encode(texts, "", 64)  # Encoder.teacher_vectors
    encoder.query_prefix, encoder.query_max_length = "", 64
    encoder.query = None  # loaded by the search before its clock starts: nothing to load
    reader._encoder, reader._detector = encoder, object()  # the query's language is given
    try:
        got = reader.search("hund katze", k=5, lang="de", rerank=TeacherReranker())
        assert sorted(h.id for h in got) == ["d0", "d3", "d4"]
        assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
    finally:
        reader.close()
        writer.close()


# -- field attention ----------------------------------------------------------------------

def test_field_attention_by_hand() -> None:
    from vecplug.adapters.rerank.fields import field_attention

    q = np.array([1.0, 0.0])
    fields = np.array([[1.0, 0.0], [0.0, 1.0]])  # a title on the query's direction, a body across it
    # scale 1, W = I: a = (1, 0); w = (e, 1) / (e + 1); d = w / |w|; score = w_1 / |w|
    w1, w2 = math.e / (math.e + 1), 1 / (math.e + 1)
    got = field_attention(q, fields, scale=1.0)
    np.testing.assert_allclose(got.weights, [w1, w2], atol=1e-12)
    np.testing.assert_allclose(got.weights, [0.7310586, 0.2689414], atol=1e-7)
    np.testing.assert_allclose(got.vector, np.array([w1, w2]) / math.hypot(w1, w2), atol=1e-12)
    assert got.score == pytest.approx(w1 / math.hypot(w1, w2), abs=1e-12)
    assert got.score == pytest.approx(0.9385, abs=1e-4)
    # W = I is the default, and a W swapping the axes makes the body the one that matches
    same = field_attention(q, fields, scale=1.0, weight=np.eye(2))
    np.testing.assert_allclose(same.weights, got.weights, atol=1e-12)
    swapped = field_attention(q, fields, scale=1.0, weight=np.array([[0.0, 1.0], [1.0, 0.0]]))
    np.testing.assert_allclose(swapped.weights, [w2, w1], atol=1e-12)
    assert swapped.score == pytest.approx(w2 / math.hypot(w1, w2), abs=1e-12)
    # orientation: a = q^T W f, so q = e1 reads W's first row (0, 2): a = (0, 2)
    one_way = field_attention(q, fields, scale=1.0, weight=np.array([[0.0, 2.0], [0.0, 0.0]]))
    np.testing.assert_allclose(one_way.weights, np.array([1.0, math.exp(2)]) / (1 + math.exp(2)), atol=1e-12)
    # a large scale attends to the best field only; one field is that field
    assert field_attention(q, fields, scale=200.0).score == pytest.approx(1.0, abs=1e-9)
    assert field_attention(q, fields[1:], scale=20.0).score == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        field_attention(q, np.zeros((0, 2)))


class DictEncoder:
    """Field text -> a fixed vector; records what it was asked to encode."""

    def __init__(self, table: dict[str, Sequence[float]]) -> None:
        self.table = {k: np.asarray(v, np.float32) / np.linalg.norm(v) for k, v in table.items()}
        self.asked: list[str] = []
        self.calls = 0

    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        self.calls += 1
        self.asked.extend(texts)
        return np.stack([self.table[t] for t in texts])


TABLE = {"Fox facts": [1, 0], "all about water": [0, 1], "Dogs": [0.6, 0.8], "dogs and foxes": [0.6, 0.8],
         "a body about foxes": [0.9, 0.1], "Teaser": [0.2, 0.9]}


def _field_hits() -> list[StoreHit]:
    return hits(["all about water", "dogs and foxes", "a body about foxes"],
                payloads=[{"title": "Fox facts"}, {"title": "Dogs", "description": ""},
                          {"description": "Teaser", "url": ["not", "text"], "n": True}])


def test_field_reranker_scores_and_order() -> None:
    from vecplug.adapters.rerank.fields import FieldAttentionReranker, field_attention

    enc = DictEncoder(TABLE)
    context = RerankContext(enc, None, lambda *a: np.zeros(0))
    q = np.array([1.0, 0.0], np.float32)
    reranker = FieldAttentionReranker()
    got = reranker.rerank([Query("fox", "en", q)], [_field_hits()], context)[0]
    t = enc.table
    expected = {"d0": field_attention(q, np.stack([t["Fox facts"], t["all about water"]]), 20.0).score,
                "d1": field_attention(q, np.stack([t["Dogs"], t["dogs and foxes"]]), 20.0).score,
                "d2": field_attention(q, np.stack([t["Teaser"], t["a body about foxes"]]), 20.0).score}
    assert {h.record.id: h.score for h in got} == pytest.approx(expected, abs=1e-6)
    assert [h.record.id for h in got] == sorted(expected, key=lambda k: -expected[k])
    assert got[0].record.id == "d0"  # its title matches: the attention finds it despite the body
    assert reranker.describe() == {"name": "fields", "fields": ["title", "description", "text"],
                                   "scale": 20.0, "head": None, "checksum": None}


def test_field_reranker_refuses_settings_that_cannot_rank() -> None:
    """A negative cache (every rerank failed emptying it) and a scale of 0 or below (attention
    uniform, or on the least related field) are refused when the reranker is made."""
    from vecplug.adapters.rerank import get_reranker
    from vecplug.errors import ConfigError

    for options, message in (({"cache_size": -1}, "cache_size must be 0 or more"),
                             ({"scale": 0.0}, "scale must be a finite number above 0"),
                             ({"scale": -5.0}, "scale must be a finite number above 0"),
                             ({"scale": float("nan")}, "scale must be a finite number above 0")):
        with pytest.raises(ConfigError, match=message):
            get_reranker("fields", **options)
    assert get_reranker("fields", cache_size=0).cache_size == 0


def test_field_reranker_loads_a_trained_head(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    from vecplug.adapters.rerank.fields import FieldAttentionReranker

    head = tmp_path / "head.safetensors"
    save_file({"W": np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)}, str(head))
    context = RerankContext(DictEncoder(TABLE), None, lambda *a: np.zeros(0))
    q = Query("fox", "en", np.array([1.0, 0.0], np.float32))
    cands = _field_hits()[:2]
    plain = FieldAttentionReranker().rerank([q], [cands], context)[0]
    trained = get_reranker(f"fields:{head}").rerank([q], [cands], context)[0]
    assert [h.record.id for h in plain] == ["d0", "d1"]  # d0's title matches the query
    assert [h.record.id for h in trained] == ["d1", "d0"]  # the head attends to the crossing field
    assert trained[1].score == pytest.approx(0.0, abs=1e-6)  # d0 is read through its water body
    reranker = FieldAttentionReranker(head=str(head))
    assert len(reranker.describe()["checksum"]) == 64
    with pytest.raises(ModelMismatchError, match="2-dimensional"):
        reranker.rerank([Query("x", None, np.ones(3, np.float32) / 3 ** 0.5)], [cands], context)
    bad = tmp_path / "bad.safetensors"
    save_file({"W": np.ones((2, 3), np.float32)}, str(bad))
    with pytest.raises(ModelError, match="square"):
        FieldAttentionReranker(head=str(bad))
    save_file({"V": np.eye(2, dtype=np.float32)}, str(bad))
    with pytest.raises(ModelError, match="no tensor 'W'"):
        FieldAttentionReranker(head=str(bad))
    with pytest.raises(ModelError, match="does not exist"):
        FieldAttentionReranker(head=str(tmp_path / "missing.safetensors"))
    pickle = tmp_path / "head.pt"
    pickle.write_bytes(b"\x80\x04not safetensors")
    with pytest.raises(ModelError, match="safetensors"):
        FieldAttentionReranker(head=str(pickle))


def test_field_reranker_scores_in_the_corrected_geometry() -> None:
    """With the language-bias correction on (the default), the query and the field vectors are
    centred by their languages' means, as the first stage scored them: raw cosines ranked a
    document of the query's language first only for sharing its language."""
    from vecplug.adapters.bias import LanguageMeans
    from vecplug.adapters.rerank.fields import FieldAttentionReranker, field_attention

    # dimensions: topic a, topic b, language (en +, de -)
    enc = DictEncoder({"en body": [0.2, 0.5, 1.0], "de body": [0.9, 0.1, -1.0]})
    cands = hits(["en body", "de body"], langs=["en", "de"])
    means = LanguageMeans({"en": np.array([0, 0, 1], np.float32), "de": np.array([0, 0, -1], np.float32)},
                          np.zeros(3, np.float32))
    q = Query("topic a", "en", (np.array([1.0, 0.0, 1.0]) / 2 ** 0.5).astype(np.float32))
    reranker = FieldAttentionReranker()
    raw = reranker.rerank([q], [cands], RerankContext(enc, None, lambda *a: np.zeros(0)))[0]
    assert [h.record.id for h in raw] == ["d0", "d1"]  # the shared language wins
    got = reranker.rerank([q], [cands], RerankContext(enc, None, lambda *a: np.zeros(0), means))[0]
    assert [h.record.id for h in got] == ["d1", "d0"]  # the topic wins
    want = field_attention(means.centre_query(q.vector, "en"), means.centre(enc.table["de body"][None], ["de"]))
    assert got[0].score == pytest.approx(want.score, abs=1e-6)


def test_a_trained_heads_weights_come_from_the_vectors_it_was_trained_on(tmp_path: Path) -> None:
    """With the correction on, the score is in the corrected geometry, but a trained head's
    weights come from the raw vectors: it learned them on raw vectors (its data has no
    languages), and centring moves its logits by a term of the query language's mean. The
    untrained attention has no such geometry and weighs the centred vectors."""
    from vecplug.adapters.bias import LanguageMeans
    from vecplug.adapters.rerank.fields import FieldAttentionReranker, field_attention
    from vecplug.indexer.field_head import save_head

    # dimensions: topic a, topic b, language (en +, de -); raw and centred, the query's
    # attention picks other fields
    enc = DictEncoder({"Titel": [0.6, 0.0, -0.8], "Text": [0.8, 0.0, 0.6]})
    cands = hits(["Titel\nText"], payloads=[{"title": "Titel", "description": "Text"}], langs=["de"])
    means = LanguageMeans({"en": np.array([0, 0, 1], np.float32), "de": np.array([0, 0, -1], np.float32)},
                          np.zeros(3, np.float32))
    q = Query("topic a", "en", (np.array([1.0, 0.0, 1.0]) / 2 ** 0.5).astype(np.float32))
    context = RerankContext(enc, None, lambda *a: np.zeros(0), means)
    raw = np.stack([enc.table["Titel"], enc.table["Text"]])
    centred, centred_q = means.centre(raw, ["de", "de"]), means.centre_query(q.vector, "en")

    head = tmp_path / "head.safetensors"
    save_head(head, np.eye(3, dtype=np.float32), {"config": {"scale": 5.0}, "fields": ["title", "description"]})
    trained = FieldAttentionReranker(head=str(head)).rerank([q], [cands], context)[0]
    want = field_attention(centred_q, centred, 5.0, np.eye(3), attend=(q.vector, raw))
    assert want.weights[1] > 0.9  # the raw vectors' choice
    assert trained[0].score == pytest.approx(want.score, abs=1e-6)

    untrained = FieldAttentionReranker(fields=["title", "description"], scale=5.0).rerank([q], [cands], context)[0]
    own = field_attention(centred_q, centred, 5.0)
    assert own.weights[0] > 0.9 and untrained[0].score == pytest.approx(own.score, abs=1e-6)


def test_field_reranker_takes_a_heads_training_settings(tmp_path: Path) -> None:
    """A head records the fields and scale it was trained with, and its document encoder: the
    reranker ran with scale 20 and the default fields whatever the head was trained with, and
    took a head of another encoder of the same dimension."""
    from vecplug.adapters.rerank.fields import FieldAttentionReranker
    from vecplug.indexer.field_head import save_head

    head = tmp_path / "head.safetensors"
    save_head(head, np.eye(2, dtype=np.float32), {"config": {"scale": 5.0}, "fields": ["title", "text"],
                                                  "encoder": {"document_encoder_checksum": "abc"}})
    reranker = get_reranker(f"fields:{head}")
    assert (reranker.fields, reranker.scale) == (("title", "text"), 5.0)
    assert FieldAttentionReranker(head=str(head), scale=8.0, fields="text").scale == 8.0  # given: kept

    class Described(DictEncoder):
        def describe(self) -> dict[str, Any]:
            return {"document_encoder": "other-model", "document_encoder_checksum": "def"}

    q = Query("fox", "en", np.array([1.0, 0.0], np.float32))
    with pytest.raises(ModelMismatchError, match=r"trained over the document encoder abc, .*other-model \(def\)"):
        reranker.rerank([q], [_field_hits()], RerankContext(Described(TABLE), None, lambda *a: np.zeros(0)))


def test_field_reranker_encodes_each_field_text_once() -> None:
    from vecplug.adapters.rerank.fields import FieldAttentionReranker

    enc = DictEncoder(TABLE)
    context = RerankContext(enc, None, lambda *a: np.zeros(0))
    reranker = FieldAttentionReranker()
    q = Query("fox", "en", np.array([1.0, 0.0], np.float32))
    twice = _field_hits() + _field_hits()[:1]  # a candidate repeated within one call
    reranker.rerank([q, q], [twice, _field_hits()[1:]], context)
    assert enc.calls == 1 and sorted(enc.asked) == sorted(set(enc.asked))
    assert len(enc.asked) == 6
    again = reranker.rerank([q], [_field_hits()], context)[0]
    assert enc.calls == 1  # all from the cache
    assert len(again) == 3
    # another encoder (another index) does not see this one's vectors
    other = DictEncoder(TABLE)
    reranker.rerank([q], [_field_hits()[:1]], RerankContext(other, None, lambda *a: np.zeros(0)))
    assert sorted(other.asked) == ["Fox facts", "all about water"]
    # a small cache drops the least recently used texts
    small = FieldAttentionReranker(cache_size=2)
    enc2 = DictEncoder(TABLE)
    ctx2 = RerankContext(enc2, None, lambda *a: np.zeros(0))
    small.rerank([q], [_field_hits()[:1]], ctx2)  # 2 texts cached
    small.rerank([q], [_field_hits()[1:2]], ctx2)  # 2 others, the first two dropped
    small.rerank([q], [_field_hits()[:1]], ctx2)
    assert enc2.asked.count("Fox facts") == 2


def test_field_reranker_falls_back_to_text() -> None:
    from vecplug.adapters.rerank.fields import FieldAttentionReranker

    enc = DictEncoder(TABLE)
    context = RerankContext(enc, None, lambda *a: np.zeros(0))
    reranker = FieldAttentionReranker(fields=("title", "description"))
    q = np.array([1.0, 0.0], np.float32)
    cands = hits(["a body about foxes", "all about water"], payloads=[{}, {"title": "  ", "url": "x"}])
    got = reranker.rerank([Query("fox", "en", q)], [cands], context)[0]
    assert sorted(enc.asked) == ["a body about foxes", "all about water"]
    assert got[0].record.id == "d0"
    assert got[0].score == pytest.approx(float(enc.table["a body about foxes"] @ q), abs=1e-6)
    assert got[1].score == pytest.approx(0.0, abs=1e-6)
    assert FieldAttentionReranker(fields="title, text").fields == ("title", "text")
    with pytest.raises(ConfigError):
        FieldAttentionReranker(fields=())


def test_field_reranker_with_a_real_encoder(tiny_model: Path) -> None:
    """The real Encoder's encode_documents (passage prefix) fits the reranker."""
    from vecplug.adapters.rerank.fields import FieldAttentionReranker
    from vecplug.indexer.encoder import Encoder

    encoder = Encoder.from_specs(str(tiny_model), document_prefix="passage: ")
    cands = hits(["water boils at one hundred degrees", "the quick brown fox"],
                 payloads=[{"title": "wasser kocht"}, {"title": "der schnelle braune fuchs"}])
    q = encoder.encode_queries(["fox"])[0]
    got = FieldAttentionReranker().rerank([Query("fox", None, q)], [cands],
                                          RerankContext(encoder, None, lambda *a: np.zeros(0)))[0]
    fox = encoder.document.encode(["der schnelle braune fuchs", "the quick brown fox"], "passage: ", 256)
    from vecplug.adapters.rerank.fields import field_attention

    score = next(h.score for h in got if h.record.id == "d1")
    assert score == pytest.approx(field_attention(q, fox, 20.0).score, abs=1e-5)


# -- registry -----------------------------------------------------------------------------

def test_registry(trained_ce: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker
    from vecplug.adapters.rerank.fields import FieldAttentionReranker
    from vecplug.adapters.rerank.teacher import TeacherReranker

    assert set(BUILTIN_RERANKERS) == {"teacher", "cross-encoder", "fields"}
    assert set(BUILTIN_RERANKERS) <= set(available_rerankers())
    assert isinstance(get_reranker("teacher"), TeacherReranker)
    assert isinstance(get_reranker("fields", scale=5.0), FieldAttentionReranker)
    ce = get_reranker(f"cross-encoder:{trained_ce}", max_length=64)
    assert isinstance(ce, CrossEncoderReranker) and isinstance(ce, Reranker)
    assert ce.path == trained_ce.resolve() and ce.max_length == 64
    assert get_reranker("cross-encoder", model=str(trained_ce)).path == trained_ce.resolve()
    with pytest.raises(UnknownBackendError, match="unknown reranker 'nope'.*cross-encoder, fields, teacher"):
        get_reranker("nope")
    with pytest.raises(ConfigError, match="cross-encoder:MODEL"):
        get_reranker("cross-encoder")
    with pytest.raises(ModelError, match="does not exist"):
        get_reranker(f"cross-encoder:{tmp_path / 'missing'}")
    with pytest.raises(ConfigError, match="teacher reranker: unknown quantisation 'something'"):
        get_reranker("teacher:something")
    assert get_reranker("teacher:int8").quantize == "int8" and get_reranker("teacher:none").quantize is None
    with pytest.raises(ConfigError, match="accepts: fields, scale, head, cache_size"):
        get_reranker("fields", depth=3)

    class Mine(Reranker):
        name = "mine"

        def __init__(self, model: str = "default") -> None:
            self.model = model

        def rerank(self, queries: Any, candidates: Any, context: Any) -> list[list[StoreHit]]:
            return [list(c) for c in candidates]

    import vecplug.adapters.plugins as plugins
    import vecplug.adapters.rerank as registry

    monkeypatch.setattr(plugins, "entry_points", lambda group: [
        EntryPoint("mine", f"{__name__}:_THIRD_PARTY", group)] if group == registry.ENTRY_POINT_GROUP else [])
    globals()["_THIRD_PARTY"] = Mine
    try:
        assert available_rerankers()["mine"] == f"{__name__}:_THIRD_PARTY"
        assert get_reranker("mine:xyz").model == "xyz"
        Mine.spec_argument = "head"  # an argument its constructor does not take
        with pytest.raises(ConfigError, match="the 'mine' reranker takes no argument"):
            get_reranker("mine:xyz")
    finally:
        globals().pop("_THIRD_PARTY")


def test_order_by_scores_is_stable_and_puts_nan_last() -> None:
    cands = hits(["a", "b", "c", "d"])
    got = order_by_scores(cands, [0.5, float("nan"), 0.5, 0.9])
    assert [h.record.id for h in got] == ["d3", "d0", "d2", "d1"]
    assert got[0].score == pytest.approx(0.9)
    with pytest.raises(ValueError):
        order_by_scores(cands, [1.0])


def test_a_broken_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry point naming a module that is not installed was a ModuleNotFoundError traceback;
    one whose module raises at import, or naming a function, a class of another kind or an
    abstract one, was a traceback from inside (AttributeError: ... has no attribute 'exists')."""
    import vecplug.adapters.plugins as plugins
    import vecplug.adapters.rerank as rerankers
    import vecplug.adapters.stores.registry as stores
    from vecplug.adapters.stores.base import VectorStore

    def plugged(in_group: str, target: str) -> None:
        monkeypatch.setattr(plugins, "entry_points",
                            lambda group: [EntryPoint("broken", target, group)] if group == in_group else [])

    plugged(rerankers.ENTRY_POINT_GROUP, "nowhere_pkg.missing:Reranker")
    with pytest.raises(UnknownBackendError, match=r"reranker 'broken' \(nowhere_pkg.missing:Reranker\) cannot be "
                                                  "loaded: ModuleNotFoundError: No module named 'nowhere_pkg'"):
        get_reranker("broken")
    plugged(stores.ENTRY_POINT_GROUP, f"{__name__}:NoSuchStore")
    with pytest.raises(UnknownBackendError, match=r"store 'broken' .* cannot be loaded"):
        get_store_class("broken")
    plugged(stores.ENTRY_POINT_GROUP, "json:loads")
    with pytest.raises(UnknownBackendError, match=r"store 'broken' \(json:loads\) is not a VectorStore class"):
        get_store_class("broken")
    globals()["_HALF_A_STORE"] = type("HalfAStore", (VectorStore,), {"name": "half"})
    plugged(stores.ENTRY_POINT_GROUP, f"{__name__}:_HALF_A_STORE")
    try:
        with pytest.raises(UnknownBackendError, match=r"store 'broken' .* does not implement .*create"):
            get_store_class("broken")
    finally:
        globals().pop("_HALF_A_STORE")
    plugged(rerankers.ENTRY_POINT_GROUP, "json:loads")
    with pytest.raises(UnknownBackendError, match=r"reranker 'broken' \(json:loads\) is not a class"):
        get_reranker("broken")
    # a module that raises at import (a plugin's own bug, or its dependency's)
    import sys
    import types

    plugged(stores.ENTRY_POINT_GROUP, "vecplug_plugin_that_raises:Store")

    class Raising(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("the plugin's setup failed")

    monkeypatch.setitem(sys.modules, "vecplug_plugin_that_raises", Raising("vecplug_plugin_that_raises"))
    with pytest.raises(UnknownBackendError, match="cannot be loaded: RuntimeError: the plugin's setup failed"):
        get_store_class("broken")


def test_field_reranker_reads_a_one_field_candidate_from_the_store() -> None:
    """A candidate read through its text alone has that vector stored: it was encoded again for
    every query (~240 ms a query on XQuAD-R, for the same scores)."""
    from vecplug.adapters.rerank.fields import FieldAttentionReranker

    class Store:
        def __init__(self, table: dict[str, np.ndarray]) -> None:
            self.table = table

        def vectors_found(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
            return {i: self.table[i] for i in ids if i in self.table}

    enc = DictEncoder(TABLE)
    cands = hits(["a body about foxes", "all about water"], payloads=[{}, {"title": "Fox facts"}])
    store = Store({"d0": enc.table["a body about foxes"]})
    q = Query("fox", "en", np.array([1.0, 0.0], np.float32))
    got = FieldAttentionReranker().rerank([q], [cands], RerankContext(enc, store, lambda *a: np.zeros(0)))[0]
    assert sorted(enc.asked) == ["Fox facts", "all about water"]  # not the one-field candidate
    assert {h.record.id: h.score for h in got}["d0"] == pytest.approx(float(enc.table["a body about foxes"] @ q.vector))


class ManifestStore:
    """A store's manifest and stored vectors, as the field reranker reads them."""

    def __init__(self, embed_fields: Sequence[str] | None, table: dict[str, np.ndarray]) -> None:
        self.corpus = {"chunk_tokens": 200, "embed_fields": list(embed_fields)} if embed_fields is not None else None
        self.table = table

    def manifest_value(self, key: str, default: Any = None) -> Any:
        return self.corpus if key == "corpus" and self.corpus is not None else default

    def vectors_found(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {i: self.table[i] for i in ids if i in self.table}


def test_field_reranker_reads_a_records_body_apart_from_its_title() -> None:
    """A JSONL/CSV record's text is its title, description and text joined (the first stage's
    view), a Markdown passage's its title and the passage: read as the ``text`` field, the title
    counted twice, and a trained head (which learned each field apart) read other inputs than
    it learned. The body is read alone, as the index's manifest says the fields were joined."""
    from vecplug.adapters.rerank.fields import FieldAttentionReranker, field_attention

    enc = DictEncoder({**TABLE, "Fox facts\nall about water": [0.7, 0.7], "Fox facts\na body about foxes": [1, 0.1]})
    cands = [StoreHit(Record("r.jsonl#1", "Fox facts\nall about water", "r.jsonl", 1, "en",
                             {"id": 1, "title": "Fox facts"}), 0.9),
             StoreHit(Record("r.jsonl#2", "Dogs", "r.jsonl", 2, "en", {"id": 2, "title": "Dogs"}), 0.8),
             StoreHit(Record("a.md#0", "Fox facts\na body about foxes", "a.md", 0, "en", {"title": "Fox facts"}), 0.7)]
    store = ManifestStore(["title", "description", "text"], {"r.jsonl#2": enc.table["Dogs"]})
    q = Query("fox", "en", np.array([1.0, 0.0], np.float32))
    reranker = FieldAttentionReranker()
    got = reranker.rerank([q], [cands], RerankContext(enc, store, lambda *a: np.zeros(0)))[0]
    # the title-only record is its title alone: its stored vector, nothing encoded for it
    assert sorted(enc.asked) == ["Fox facts", "a body about foxes", "all about water"]
    t = enc.table
    want = {"r.jsonl#1": field_attention(q.vector, np.stack([t["Fox facts"], t["all about water"]])).score,
            "r.jsonl#2": float(t["Dogs"] @ q.vector),
            "a.md#0": field_attention(q.vector, np.stack([t["Fox facts"], t["a body about foxes"]])).score}
    assert {h.record.id: h.score for h in got} == pytest.approx(want, abs=1e-6)
    assert reranker.field_texts(cands[0].record, ["title", "text"]) == ["Fox facts", "all about water"]
    assert reranker.field_texts(cands[1].record, ["title", "text"]) == ["Dogs"]
    # a manifest that does not say how records were joined (or other fields): the whole text,
    # as before; a Markdown passage needs no manifest
    for other in (ManifestStore(None, {}), None, ManifestStore(["description", "text"], {})):
        enc.asked.clear()
        FieldAttentionReranker().rerank([q], [cands], RerankContext(enc, other, lambda *a: np.zeros(0)))
        assert sorted(enc.asked) == ["Dogs", "Fox facts", "Fox facts\nall about water", "a body about foxes"]


def test_field_reranker_reads_the_bodies_of_an_index(tiny_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the fields an index joined are read from its manifest, its own or set."""
    import vecplug
    from vecplug.adapters.rerank.fields import FieldAttentionReranker

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "r.jsonl").write_text(json.dumps({"id": "w", "title": "wasser kocht", "description": "hundert grad",
                                              "text": "water boils at one hundred degrees"}) + "\n")
    (docs / "f.md").write_text("---\ntitle: der schnelle braune fuchs\n---\nthe quick brown fox jumps\n")
    asked: list[str] = []
    embed = FieldAttentionReranker._embed

    def spy(self: FieldAttentionReranker, texts: Sequence[str], encoder: Any) -> dict[str, np.ndarray]:
        asked.extend(texts)
        return embed(self, texts, encoder)

    monkeypatch.setattr(FieldAttentionReranker, "_embed", spy)
    for fields, joined in (([], "wasser kocht\nhundert grad\n"), (["text", "title"], "")):
        settings = vecplug.load_settings(overrides={
            "index": {"path": str(tmp_path / f"idx{len(fields)}")}, "model": {"document": str(tiny_model)},
            "corpus": {"embed_fields": fields or None}})
        with vecplug.create_index(docs, settings=settings) as index:
            asked.clear()
            hits = index.search("boiling water", rerank="fields", lang="en").hits
            assert {h.id for h in hits} == {"r.jsonl#w", "f.md#0"}
            assert next(h.text for h in hits if h.id == "r.jsonl#w").startswith(joined + "water boils")
            # each field apart (the description too, kept as payload when it is not embedded)
            assert set(asked) == {"wasser kocht", "hundert grad", "water boils at one hundred degrees",
                                  "der schnelle braune fuchs", "the quick brown fox jumps"}
