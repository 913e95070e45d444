"""The query-side plugin: vecplug's encoders inside LangChain, LlamaIndex and qdrant-client."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_TEXT
from vecplug.errors import MissingDependencyError

DOCS = ["water boils at one hundred degrees", "der schnelle braune fuchs springt über den faulen hund",
        "вода кипит при ста градусах", "敏捷的棕色狐狸跳过了懒狗"]


@pytest.fixture(scope="module")
def tiny_student(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vecplug.indexer.distill import DistillConfig, distill

    texts = tmp_path_factory.mktemp("distill") / "texts.txt"
    texts.write_text("\n".join(TINY_TEXT * 4))
    out = texts.parent / "student"
    distill(DistillConfig(teacher=str(tiny_model), layers=1, texts=(str(texts),), epochs=3,
                          batch_size=8, learning_rate=1e-3), out, progress=False)
    return out


def test_query_and_document_encoders(tiny_model: Path, tiny_student: Path) -> None:
    import vecplug

    q = vecplug.QueryEncoder(str(tiny_student))
    assert q.describe()["document_encoder"] == str(tiny_model)  # its teacher, found from the student
    d = q.document_encoder()
    assert d.encoder is q.encoder and d.dim == q.dim == 32
    qv, dv = q.encode(["water boils"]), d.encode(["water boils"])
    assert qv.shape == dv.shape == (1, 32)
    assert not np.allclose(qv, dv)  # student vs teacher


def test_langchain(tiny_model: Path, tiny_student: Path) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.vectorstores import InMemoryVectorStore

    from vecplug.adapters.integrations import load_integration

    cls = load_integration("langchain")
    emb = cls(document=str(tiny_model), query=str(tiny_student))
    np.testing.assert_allclose(emb.embed_query("water"), emb.encoder.encode_queries(["water"])[0], atol=1e-6)
    np.testing.assert_allclose(emb.embed_documents(["water"])[0],
                               emb.encoder.encode_documents(["water"])[0], atol=1e-6)
    store = InMemoryVectorStore(emb)
    store.add_texts(DOCS)
    found = store.similarity_search(DOCS[2], k=1)
    assert found[0].page_content == DOCS[2]

    # a chunk longer than the document encoder keeps (a splitter's default 4,000 characters):
    # its end was dropped without a word; the first such batch warns, once per encoder
    import warnings

    long = " ".join(["water boils at one hundred degrees"] * 40)  # over the tiny model's 128 tokens
    with pytest.warns(UserWarning, match=r"1 of 2 texts reach the document encoder's limit \(128 tokens\)"):
        emb.embed_documents([long, "short"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        emb.embed_documents([long])

    # copies share the loaded models (deepcopy failed on their locks); a pickled one, as
    # worker processes get it, loads the same models again (pickling failed too)
    import copy
    import pickle

    from vecplug.embedders import load_encoder

    assert copy.deepcopy(emb).encoder is emb.encoder
    for original in (emb, cls(encoder=load_encoder(str(tiny_model), str(tiny_student)))):
        again = pickle.loads(pickle.dumps(original))
        assert again.encoder is not original.encoder
        assert again.encoder.describe()["query_encoder"] == str(tiny_student)
        np.testing.assert_allclose(again.embed_query("water"), original.embed_query("water"), atol=1e-6)


def test_a_copy_of_langchain_embeddings_pickles_with_its_index(tmp_path: Path, tiny_model: Path,
                                                              tiny_student: Path) -> None:
    """A deep copy keeps what the original was made from: pickled (worker processes), it loads
    the index's models with the index's prefixes, as the original would, not the bare models."""
    pytest.importorskip("langchain_core")
    import copy
    import pickle

    import vecplug
    from vecplug.adapters.integrations import load_integration

    settings = vecplug.load_settings(overrides={
        "index": {"path": str(tmp_path / "idx")},
        "model": {"document": str(tiny_model), "query": str(tiny_student),
                  "document_prefix": "passage: ", "query_prefix": "query: "}})
    with vecplug.create_index(settings=settings) as index:
        index.add_documents([vecplug.Document("d", DOCS[0], "api")])
        stored = index.store.vectors(["d"])[0]
    emb = load_integration("langchain")(index=str(tmp_path / "idx"))
    for made in (emb, copy.deepcopy(emb)):
        again = pickle.loads(pickle.dumps(made))
        np.testing.assert_allclose(again.embed_documents([DOCS[0]])[0], emb.embed_documents([DOCS[0]])[0], atol=1e-6)
        np.testing.assert_allclose(again.embed_query("water"), emb.embed_query("water"), atol=1e-6)
    bare = load_integration("langchain")(document=str(tiny_model), query=str(tiny_student))
    assert np.abs(np.array(bare.embed_documents([DOCS[0]])[0]) - emb.embed_documents([DOCS[0]])[0]).max() > 1e-3
    np.testing.assert_allclose(emb.embed_documents([DOCS[0]])[0], stored, atol=1e-5)  # the index's space


def test_llamaindex(tiny_model: Path, tiny_student: Path) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document, VectorStoreIndex

    from vecplug.adapters.integrations import load_integration

    cls = load_integration("llamaindex")
    emb = cls(document=str(tiny_model), query=str(tiny_student))
    np.testing.assert_allclose(emb.get_query_embedding("water"), emb._encoder.encode_queries(["water"])[0], atol=1e-6)
    np.testing.assert_allclose(emb.get_text_embedding("water"), emb._encoder.encode_documents(["water"])[0], atol=1e-6)
    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=emb)
    nodes = index.as_retriever(similarity_top_k=4).retrieve(DOCS[1])
    assert len(nodes) == 4 and {n.node.get_content() for n in nodes} == set(DOCS)
    # a copy (pydantic's deep model_copy too) shares the loaded models: it failed on their locks
    import copy

    for duplicate in (copy.deepcopy(emb), emb.model_copy(deep=True)):
        assert duplicate._encoder is emb._encoder and duplicate.query == str(tiny_student)


def test_llamaindex_round_trips_and_batches_async(tiny_model: Path, tiny_student: Path) -> None:
    """to_dict/from_dict and pickling (LlamaIndex's worker processes) load the same models (they
    loaded me5-small instead); async batches are one encode call each, not one per text."""
    pytest.importorskip("llama_index.core")
    import asyncio
    import pickle

    from vecplug.adapters.integrations import load_integration
    from vecplug.embedders import load_encoder

    cls = load_integration("llamaindex")
    for emb in (cls(document=tiny_model, query=tiny_student),  # paths as the other integrations take
                cls(encoder=load_encoder(str(tiny_model), str(tiny_student)))):
        assert emb.embed_batch_size == 128
        want = emb.get_query_embedding("water")
        for copy in (cls.from_dict(emb.to_dict()), pickle.loads(pickle.dumps(emb))):
            assert copy._encoder.describe()["query_encoder"] == str(tiny_student)
            np.testing.assert_allclose(copy.get_query_embedding("water"), want, atol=1e-6)
    calls: list[int] = []
    encode = emb._encoder.encode_documents
    emb._encoder.encode_documents = lambda texts: calls.append(len(texts)) or encode(texts)
    texts = [f"text {i}" for i in range(40)]
    got = asyncio.run(emb.aget_text_embedding_batch(texts))
    assert calls == [40] and np.allclose(got, emb.get_text_embedding_batch(texts), atol=1e-6)
    assert np.allclose(asyncio.run(emb.aget_query_embedding("water")), want, atol=1e-6)

    # LlamaIndex gathers every batch at once: the encodes take turns (2 cores, one model)
    import threading
    import time

    running, most = 0, 0
    guard = threading.Lock()

    def counted(texts: list[str]) -> np.ndarray:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with guard:
            running -= 1
        return encode(texts)

    emb._encoder.encode_documents = counted
    emb.embed_batch_size = 8
    got = asyncio.run(emb.aget_text_embedding_batch(texts))
    assert most == 1 and np.allclose(got, emb.get_text_embedding_batch(texts), atol=1e-6)

    # ... but a query asked during an ingestion on the same loop does not queue behind all of
    # its batches (one shared turn made it wait for the whole ingestion)
    # (each batch holds its turn until the query is answered, or 5 s: no race with the clock)
    release = threading.Event()

    async def query_during_ingestion() -> tuple[int, list[float]]:
        ingestion = asyncio.ensure_future(emb.aget_text_embedding_batch(texts))  # 5 batches
        await asyncio.sleep(0.01)  # the batches are queued
        vector = await emb.aget_query_embedding("water")
        batches_started = len(started)
        release.set()
        await ingestion
        return batches_started, vector

    started: list[int] = []

    def held(texts: list[str]) -> np.ndarray:
        started.append(len(texts))
        release.wait(5)
        return encode(texts)

    emb._encoder.encode_documents = held
    started_before, vector = asyncio.run(query_during_ingestion())
    assert started_before <= 1 and np.allclose(vector, want, atol=1e-6)


def test_qdrant_client_path(tiny_model: Path, tiny_student: Path) -> None:
    qdrant_client = pytest.importorskip("qdrant_client")
    from vecplug import Document
    from vecplug.adapters.integrations import load_integration
    from vecplug.adapters.stores.qdrant import QdrantStore
    from vecplug.api import Index
    from vecplug.config import load_settings

    client = qdrant_client.QdrantClient(location=":memory:")  # stands in for the user's server
    settings = load_settings(overrides={"model": {"document": str(tiny_model), "query": str(tiny_student)}})
    writer = Index(settings, None, True)
    writer.store = QdrantStore.create("client://", 32, writer._new_manifest(),
                                      {"client": client, "collection": "docs"})
    writer.add_documents([Document(f"d{i}", t, "docs", i, lang) for i, (t, lang)
                          in enumerate(zip(DOCS, ["en", "de", "ru", "zh"]))])
    writer.close()

    searcher = load_integration("qdrant")(client, "docs")
    assert searcher.encoder.describe()["query_encoder"] == str(tiny_student)  # from the manifest
    result = searcher.search("вода кипит", k=4)
    assert len(result) == 4
    mono = searcher.search("вода кипит", k=4, mode="mono", lang="ru")
    assert [h.id for h in mono] == ["d2"]
    some = searcher.search("water", k=4, langs=["de", "zh"], debias=False, ef=64)
    assert sorted(h.id for h in some) == ["d1", "d3"]
    # translation consensus through the caller's client (Qdrant's per-language candidates)
    grouped = searcher.search("вода кипит", k=4, consensus=True)
    assert sorted(h.id for h in grouped) == sorted(h.id for h in result)
    # user fields sit under "payload" in the points (as the README says), the language at "lang"
    points, _ = client.scroll("docs", with_payload=True, limit=10)
    assert {p.payload["lang"] for p in points} == {"en", "de", "ru", "zh"}
    assert len(searcher.embed_query("water")) == 32
    # the caller's collection, not the settings' index folder (".vecplug") it never opened
    info = searcher.index.info()
    assert info["location"] == "collection 'docs' at :memory:" and info["documents"] == 4
    searcher.close()
    assert client.collection_exists("docs")  # the caller's client is left open


def test_missing_framework_gives_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.adapters.integrations import load_integration

    monkeypatch.setitem(sys.modules, "langchain_core", None)  # import fails
    with pytest.raises(MissingDependencyError, match=r"pip install 'vecplug\[langchain\]'"):
        load_integration("langchain")
