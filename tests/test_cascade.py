"""Students sharing their first layers with the teacher: the teacher reranker goes on from the
student's state instead of encoding the query again (``indexer.cascade``)."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import vecplug
from conftest import TINY_TEXT
from vecplug.errors import ConfigError, ModelMismatchError
from vecplug.indexer.distill import DistillConfig, distill

QUERIES = ["water boils at one hundred degrees", "the quick brown fox", "der faule hund schläft"]


def _config(teacher: Path, texts: Path, **kw: Any) -> DistillConfig:
    base: dict[str, Any] = dict(teacher=str(teacher), layers=2, shared_layers=1, texts=(str(texts),),
                                epochs=4, batch_size=8, learning_rate=1e-3, checkpoint_every=50, seed=0)
    base.update(kw)
    return DistillConfig(**base)


@pytest.fixture
def texts_file(tmp_path: Path) -> Path:
    f = tmp_path / "queries.txt"
    f.write_text("\n".join(TINY_TEXT * 4) + "\n")
    return f


@pytest.fixture
def shared_student(tiny_model: Path, texts_file: Path, tmp_path: Path) -> Path:
    """A 2-layer student of the 2-layer tiny model: its layer 0 is the teacher's, frozen."""
    out = tmp_path / "shared-student"
    assert distill(_config(tiny_model, texts_file), out, progress=False, command="test") is not None
    return out


def _encoder(tiny_model: Path, student: Path, **kw: Any) -> Any:
    from vecplug.indexer.encoder import Encoder

    return Encoder.from_specs(str(tiny_model), str(student), query_quantize="none", precision="float32",
                              query_prefix="query: ", **kw)


def test_views_run_the_models_own_layers(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModel

    from vecplug.indexer.cascade import layer_view, split_forward, upper_forward

    model = AutoModel.from_pretrained(str(tiny_model)).eval()
    ids = torch.tensor([[2, 40, 41, 42, 3], [2, 50, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.inference_mode():
        states = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        last, state = split_forward(model, 1)(ids, mask)
        again = upper_forward(model, 1)(state, mask)
    real = mask.unsqueeze(-1).bool()
    for got, want in ((last, states[-1]), (state, states[1]), (again, states[-1])):
        assert float(((got - want).abs() * real).max()) < 1e-6
    # a view holds the model's own modules, not copies
    view = layer_view(model, 1)
    assert view.encoder.layer[0] is model.encoder.layer[1] and len(model.encoder.layer) == 2
    assert view.embeddings is not model.embeddings  # above layer 0, no position embeddings again


def test_a_shared_student_keeps_the_teachers_layers(tiny_model: Path, shared_student: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from vecplug.indexer.encoder import Encoder

    meta = json.loads((shared_student / "student.json").read_text())
    assert meta["layers"] == [0, 1] and meta["shared_layers"] == 1
    # its folder holds only its own layer: the shared ones are the teacher's
    assert sorted({k.split(".")[0] + "." + k.split(".")[2] if k.startswith("encoder.") else k
                   for k in load_file(str(shared_student / "student.safetensors"))}) == ["encoder.1"]
    enc = Encoder.from_specs(str(tiny_model), str(shared_student), query_quantize="none", precision="float32")
    student, teacher = enc.query.model.state_dict(), enc.document.model.state_dict()
    shared = [k for k in student if k.startswith("embeddings.") or k.startswith("encoder.layer.0.")]
    trained = [k for k in student if k.startswith("encoder.layer.1.") and k.endswith("weight")]
    assert len(shared) > 5 and trained
    assert all(torch.equal(student[k], teacher[k]) for k in shared)  # frozen in training, loaded
    assert any(not torch.equal(student[k], teacher[k]) for k in trained)  # trained


def test_a_student_whose_shared_layers_are_not_the_teachers_is_refused(tiny_model: Path, texts_file: Path,
                                                                       tmp_path: Path) -> None:
    from vecplug.indexer.checksums import weights_sha256
    from vecplug.indexer.encoder import Encoder

    # a plain student trains every layer: claiming its first as the teacher's is refused
    out = tmp_path / "plain"
    assert distill(_config(tiny_model, texts_file, shared_layers=0, layer_choice="first"), out,
                   progress=False) is not None
    meta = json.loads((out / "student.json").read_text())
    (out / "student.json").write_text(json.dumps({**meta, "shared_layers": 1}))
    assert weights_sha256(out / "student.safetensors") == meta["weights_sha256"]
    with pytest.raises(ModelMismatchError,
                       match=r"first 1 layers are its teacher's .*, but its \S+ is not the teacher's"):
        Encoder.from_specs(str(tiny_model), str(out)).encode_queries(["x"])
    # without the claim it loads
    (out / "student.json").write_text(json.dumps(meta))
    assert Encoder.from_specs(str(tiny_model), str(out)).encode_queries(["x"]).shape == (1, 32)


def test_the_setting_is_checked(tiny_model: Path, texts_file: Path) -> None:
    with pytest.raises(ConfigError, match="shared_layers must be between 0 and layers - 1"):
        _config(tiny_model, texts_file, shared_layers=2)
    with pytest.raises(ConfigError, match="cannot be combined with ffn_width or init"):
        _config(tiny_model, texts_file, ffn_width=8)


def test_the_teacher_goes_on_from_the_students_states(tiny_model: Path, shared_student: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.indexer.encoder import TextEncoder

    enc = _encoder(tiny_model, shared_student, query_max_length=8)
    whole: list[str] = []
    encode = TextEncoder.encode

    def spy(self: TextEncoder, texts: Any, *args: Any, **kw: Any) -> np.ndarray:
        if self is enc.document:
            whole.extend(texts)
        return encode(self, texts, *args, **kw)

    monkeypatch.setattr(TextEncoder, "encode", spy)
    others = ["snow falls on old books"]
    want = enc.document.encode(QUERIES + others, "query: ", 8)  # prefix and length: the query side's
    whole.clear()
    enc.encode_queries(QUERIES)
    got = enc.teacher_vectors(QUERIES + others)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert whole == others  # only the text the student did not encode was encoded whole
    # one query at a time, past the point where the upper layers get traced
    for _ in range(4):
        for i, q in enumerate(QUERIES):
            enc.encode_queries([q])
            np.testing.assert_allclose(enc.teacher_vectors([q]), want[i:i + 1], atol=1e-5)
    assert whole == others
    assert enc.document._uppers[1].graph is not None and enc.query.graph is not None
    # a thread's states are its own: another thread's query is encoded whole
    out: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: out.append(enc.teacher_vectors([QUERIES[0]])))
    thread.start()
    thread.join()
    np.testing.assert_allclose(out[0], want[:1], atol=1e-5)
    assert whole == others + [QUERIES[0]]
    # the next encode replaces the states kept
    enc.encode_queries([QUERIES[1]])
    enc.teacher_vectors([QUERIES[0]])
    assert whole == others + [QUERIES[0]] * 2


def test_a_plain_student_keeps_nothing(tiny_model: Path, tiny_student: Path) -> None:
    enc = _encoder(tiny_model, tiny_student)
    enc.encode_queries(QUERIES)
    assert enc.query.kept is None and enc.query.split is None
    np.testing.assert_allclose(enc.teacher_vectors(QUERIES), enc.document.encode(QUERIES, "query: ", 64),
                               atol=1e-6)


def test_search_reranked_from_the_students_states(tmp_path: Path, tiny_model: Path, shared_student: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.indexer.cascade import KeptStates
    from vecplug.indexer.encoder import TextEncoder

    settings = vecplug.load_settings(overrides={
        "index": {"path": str(tmp_path / "idx"), "debias": False},
        "model": {"document": str(tiny_model), "query": str(shared_student), "query_quantize": "none",
                  "precision": "float32"}})
    continued: list[int] = []
    go_on = TextEncoder.continue_from
    monkeypatch.setattr(TextEncoder, "continue_from",
                        lambda self, states, start: continued.append(len(states)) or go_on(self, states, start))
    with vecplug.create_index(settings=settings) as index:
        words = ["water boils", "the quick fox", "a lazy dog", "snow falls", "green apples", "old books"]
        index.add_documents([vecplug.Document(f"d{i}", w, "s", i, "en") for i, w in enumerate(words)])
        got = index.search_batch(QUERIES, k=4, langs=["en"] * 3, rerank="teacher", rerank_depth=6)
        assert continued == [3]
        monkeypatch.setattr(KeptStates, "get", lambda self, ids: None)  # the teacher encodes them whole
        want = index.search_batch(QUERIES, k=4, langs=["en"] * 3, rerank="teacher", rerank_depth=6)
        assert continued == [3]
    assert all(r.reranked for r in got)
    for a, b in zip(got, want):
        assert [h.id for h in a.hits] == [h.id for h in b.hits]
        assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits], abs=1e-5)


@pytest.mark.parametrize("quantize, precision", [("int8", "float32"), (None, "bfloat16")])
def test_the_teacher_goes_on_in_its_own_precision(quantize: str | None, precision: str, tiny_model: Path,
                                                  shared_student: Path) -> None:
    """int8: the student's int8 layers give the state, the teacher's int8 query weights go on
    (``teacher:int8``); bfloat16: both in bfloat16. Not the same arithmetic as the teacher's
    own pass (int8: other quantisation of the shared layers), so close, not equal."""
    import torch

    from vecplug.indexer.encoder import Encoder

    enc = Encoder.from_specs(str(tiny_model), str(shared_student), query_prefix="query: ",
                             query_quantize="int8" if quantize else "none", precision=precision)
    teacher = enc.teacher_queries(quantize)
    want = teacher.encode(QUERIES, "query: ", 64)
    enc.encode_queries(QUERIES)
    got = enc.teacher_vectors(QUERIES, quantize)
    assert (got * want).sum(1).min() > 0.999
    upper = teacher._uppers[1]  # went on from the states, in the teacher's dtype
    assert upper.dtype == (torch.bfloat16 if precision == "bfloat16" else torch.float32)


def test_cli_distills_a_shared_student(tiny_model: Path, texts_file: Path) -> None:
    from click.testing import CliRunner

    from vecplug.cli import cli
    from vecplug.indexer.models import models_dir

    res = CliRunner().invoke(cli, ["distill", "--teacher", str(tiny_model), "-k", "2", "--shared-layers", "1",
                                   "--texts", str(texts_file), "--epochs", "1", "-q"])
    assert res.exit_code == 0, res.output
    out = models_dir() / f"{tiny_model.name}-student-k2-s1"
    assert str(out) in res.output
    meta = json.loads((out / "student.json").read_text())
    assert meta["shared_layers"] == 1 and meta["training"]["config"]["shared_layers"] == 1
    res = CliRunner().invoke(cli, ["distill", "--teacher", str(tiny_model), "-k", "2", "--shared-layers", "2",
                                   "--texts", str(texts_file), "-q"])
    assert res.exit_code != 0 and "shared_layers must be between 0 and layers - 1 (1)" in res.output


@pytest.mark.slow
def test_views_of_the_real_model(built_me5: Path) -> None:
    """me5-small (XLM-R: position ids from the padding, its own attention masks): the split
    forward pass and the upper layers give its own states, also traced, int8 too."""
    import torch

    from vecplug.indexer.cascade import Upper, split_forward
    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import resolve_model

    for quantize in (None, "int8"):
        enc = TextEncoder(resolve_model("me5-small"), quantize=quantize)
        ids = enc.tokenize(["query: Wie hoch ist der Everest?", "query: 珠穆朗玛峰有多高"], "", 64)
        _, x, m = next(enc._batches(ids))
        x_t, m_t = torch.from_numpy(x), torch.from_numpy(m)
        real = m_t.unsqueeze(-1).bool()
        with torch.inference_mode():
            full = enc.model(input_ids=x_t, attention_mask=m_t).last_hidden_state
            last, state = split_forward(enc.model, 6)(x_t, m_t)
            upper = Upper(enc.model, 6)
            for _ in range(3):
                upper.count_small(3, threading.Lock())
            assert upper.graph is not None  # traced on the third small pass
            again = upper(state, m_t)
        for got in (last, again):
            assert float(((got - full).abs() * real).max()) < 1e-4
