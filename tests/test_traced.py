"""The torch runtime's traced graph: made once an encoder is long-lived, the same vectors as
the eager model, and never kept where it would not be."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vecplug.indexer import traced
from vecplug.indexer.encoder import Encoder

QUERIES = ["the quick brown fox", "wasser kocht bei hundert grad und mehr", "水在一百度沸腾"]


def test_an_encoder_traces_its_model_after_a_few_calls_and_gives_the_same_vectors(tiny_model: Path) -> None:
    enc = Encoder.from_specs(str(tiny_model))
    q = enc.query
    eager = [enc.encode_queries([t]) for t in QUERIES]  # one forward each
    assert q.small_forwards == 3 == traced.TRACE_AFTER and q.graph is not None  # the third one traced
    graph = q.graph
    # the graph serves later calls, of any batch size and length, padding included
    batch = QUERIES + ["a", "one two three four five six seven eight nine ten eleven twelve"]
    got = enc.encode_queries(batch)
    q.graph = None
    want = enc.encode_queries(batch)
    assert np.abs(got - want).max() < 1e-5
    q.graph = graph
    assert np.abs(np.vstack([enc.encode_queries([t]) for t in QUERIES]) - np.vstack(eager)).max() < 1e-5


def test_one_call_never_traces(tiny_model: Path) -> None:
    """A one-shot ``vecplug search`` encodes its query once: it must not pay for tracing."""
    enc = Encoder.from_specs(str(tiny_model))
    enc.encode_queries(QUERIES)
    assert enc.query.small_forwards == 1 and enc.query.graph is None


def _branchy() -> object:
    """A model whose Python branches on its input's values: a trace freezes the branch taken."""
    import torch

    class Model(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
            hidden = input_ids.unsqueeze(-1).float().expand(-1, -1, 4)
            if int(attention_mask.sum()) > 8:  # a value, not a shape: frozen by the trace
                hidden = hidden * 2
            return SimpleNamespace(last_hidden_state=hidden)

    return Model()


def test_the_trace_setting_keeps_an_index_s_encoder_eager(tiny_model: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import vecplug

    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    with vecplug.create_index(None, settings=settings) as index:
        index.add_documents([vecplug.Document("a", "water boils at one hundred degrees", "api")])
    for value, expected in (("0", False), ("1", True)):
        monkeypatch.setenv("VECPLUG_MODEL_TRACE", value)
        with vecplug.open_index(str(tmp_path / "idx")) as index:
            for text in QUERIES:
                index.search(text, 1)
            assert (index.encoder.query.graph is not None) is expected, value


def test_batches_of_documents_do_not_count(tiny_model: Path) -> None:
    """Big batches gain nothing from a graph: an indexing run does not trace for them."""
    enc = Encoder.from_specs(str(tiny_model), batch_tokens=100_000)
    texts = [" ".join(QUERIES * 3)] * (traced.SMALL_FORWARD_TOKENS // 20)  # one big batch a call
    for _ in range(traced.TRACE_AFTER + 1):
        enc.encode_documents(texts)
    assert enc.document.small_forwards == 0 and enc.document.graph is None


def test_a_graph_that_differs_from_the_eager_model_is_not_kept() -> None:
    small = (np.array([[5, 6, 0]]), np.array([[1, 1, 0]]))
    large = (np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]), np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]))
    assert traced.trace(_branchy(), small, small) is not None  # where the branch agrees
    assert traced.trace(_branchy(), small, large) is None


def test_a_model_that_cannot_be_traced_stays_eager(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("not traceable")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    enc = Encoder.from_specs(str(tiny_model))
    vectors = [enc.encode_queries([t]) for t in QUERIES * 2]
    assert enc.query.small_forwards == 6 and enc.query.graph is None
    assert np.allclose(vectors[0], vectors[3])


@pytest.mark.slow
def test_the_shipped_student_and_the_teacher_traced_give_their_eager_vectors(built_me5: Path) -> None:
    """The real models, int8 student (the default) and fp32 teacher: once traced, every query
    vector is the eager model's."""
    from vecplug.indexer.models import DEFAULT_STUDENTS

    from test_me5 import SENTENCES

    enc = Encoder.from_specs("me5-small", DEFAULT_STUDENTS["me5-small"])
    teacher = Encoder.from_specs("me5-small")
    for e in (enc, teacher):
        for text in SENTENCES[:traced.TRACE_AFTER]:
            e.encode_queries([text])
        assert e.query.graph is not None, e.query.info.spec
        one = np.vstack([e.encode_queries([t]) for t in SENTENCES])  # by the graph
        batch = e.encode_queries(SENTENCES)  # padded
        e.query.graph = None  # the eager model again
        assert np.abs(one - np.vstack([e.encode_queries([t]) for t in SENTENCES])).max() < 1e-5
        assert np.abs(batch - e.encode_queries(SENTENCES)).max() < 1e-5
    assert enc.query_quantize == "int8"


def test_tracing_says_nothing(tiny_model: Path, capfd: pytest.CaptureFixture[str],
                              caplog: pytest.LogCaptureFixture) -> None:
    """The trace walks the model's attributes, and transformers' loss property logged
    "loss_type=None ... ForCausalLMLoss" on the third query of every process."""
    enc = Encoder.from_specs(str(tiny_model))
    capfd.readouterr()
    caplog.clear()
    for _ in range(traced.TRACE_AFTER + 1):
        enc.encode_queries(["water boils"])
    assert enc.query.graph is not None
    assert "loss_type" not in capfd.readouterr().err  # transformers' own handler (pytest -s)
    assert not [r for r in caplog.records if "loss_type" in r.getMessage()]
