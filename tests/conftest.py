"""Shared fixtures. Every test sees a fresh machine: caches point at temporary folders."""
from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
XQUAD = SHARED / "data" / "xquad-r"
EXAMPLES = REPO / "examples" / "corpus"


@pytest.fixture
def bench(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The benchmark script that the test module names in ``BENCHMARK`` (``benchmarks/<name>.py``),
    imported with ``benchmarks/`` on the path, as the scripts import their siblings."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module(request.module.BENCHMARK)


def run_on_xquad(bench: ModuleType, out: Path, *args: str) -> dict[str, Any]:
    """``bench.main`` on 60 XQuAD-R sentences and questions (skipped without the data), with
    ``args``: the JSON it saved at ``out``, its counts checked."""
    if not XQUAD.is_dir():
        pytest.skip("XQuAD-R data not available")
    assert bench.main(["--data", str(XQUAD), "--limit", "60", *args, "--json", str(out)]) == 0
    r = json.loads(out.read_text(encoding="utf-8"))
    assert r["sentences"] == 60 and r["questions"] == 60
    return r


def quality_rows(r: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """A documents-by-queries benchmark's quality rows by (documents, queries), two document
    sets by two query sets, each score a share."""
    rows = {(x["documents"], x["queries"]): x for x in r["quality"]}
    assert len(rows) == 6
    for x in rows.values():
        assert 0 < x["xy_map20"] <= 1 and 0 < x["mono_mrr10"] <= 1
    return rows


@pytest.fixture(autouse=True)
def fresh_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No state from earlier runs: private VECPLUG_HOME and Hugging Face caches, offline,
    no VECPLUG_* settings from the environment, and a private working directory."""
    for key in list(os.environ):
        if key.startswith("VECPLUG_"):
            monkeypatch.delenv(key)
    home = tmp_path / "vecplug-home"
    monkeypatch.setenv("VECPLUG_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # Inductor's cache follows VECPLUG_HOME unless set (indexer.compiled sets it for the
    # process): set and removed here so that the test's value is undone afterwards
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "-")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


# -- a tiny real transformer, built once per session ------------------------------

TINY_TEXT = [
    "the quick brown fox jumps over the lazy dog", "water boils at one hundred degrees",
    "der schnelle braune fuchs springt über den faulen hund", "wasser kocht bei hundert grad",
    "el rápido zorro marrón salta sobre el perro perezoso", "el agua hierve a cien grados",
    "быстрая коричневая лиса прыгает через ленивую собаку", "вода кипит при ста градусах",
    "敏捷的棕色狐狸跳过了懒狗", "水在一百度沸腾", "query: passage: title text description",
]


def build_tiny_model(folder: Path, seed: int = 0, hidden: int = 32) -> Path:
    """A 2-layer BERT with a WordPiece vocabulary trained on a few multilingual lines."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(TINY_TEXT * 3, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                 ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]", "model_max_length": 128}))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=128)
    BertModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def other_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same shape as ``tiny_model``, other weights: a mismatched encoder."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bert-other", seed=1)


@pytest.fixture
def tiny_student(tiny_model: Path, tmp_path: Path) -> Path:
    """A 1-layer student of the tiny model (untrained: the tests compare runtimes)."""
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import make_student, save_student

    teacher = Encoder.from_specs(str(tiny_model))
    folder = tmp_path / "student"
    save_student(make_student(teacher.document.model, [1]), folder,
                 {"kind": "vecplug query student", "teacher": str(tiny_model),
                  "teacher_checksum": resolve_model(str(tiny_model)).checksum, "layers": [1]})
    return folder


# -- a deterministic fake encoder for pipeline and store tests -----------------------

class FakeEncoder:
    """Hashes words into a vector: same text, same vector; shared words, nearby vectors."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self.calls = 0

    def _embed(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            h = hashlib.sha256(word.encode()).digest()
            v += np.frombuffer(h[: self.dim * 1], dtype=np.uint8)[: self.dim].astype(np.float32) - 127.5
        n = np.linalg.norm(v)
        return v / n if n else v

    def encode_documents(self, texts: list[str], progress: bool | None = None) -> np.ndarray:
        self.calls += 1
        return np.stack([self._embed(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    encode_queries = encode_documents

    def describe(self) -> dict[str, Any]:
        return {"document_encoder": "fake", "document_encoder_checksum": "0", "dim": self.dim}


@pytest.fixture
def fake_encoder() -> FakeEncoder:
    return FakeEncoder()


def unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def crowded_vectors(n: int, dim: int, seed: int, sign: float = 1.0,
                    queries: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around one direction (cosines ~0.9 between them: a query's 10th and 11th
    neighbours differ by less than bfloat16 can tell) and queries like them (``sign`` -1:
    pointing away, every score negative): what tests of exact scans in bfloat16 need."""
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(dim)
    mean /= np.linalg.norm(mean)
    base = mean + 0.35 * rng.standard_normal((n, dim)) / np.sqrt(dim)
    qs = sign * (mean + 0.35 * rng.standard_normal((queries, dim)) / np.sqrt(dim))
    unit = [(x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32) for x in (base, qs)]
    return unit[0], unit[1]


def exact_top_k(base: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of each query's ``k`` best rows of ``base``, computed in float64."""
    scores = queries.astype(np.float64) @ base.astype(np.float64).T
    ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(scores, ids, 1)


# -- the real default model, built from scratch once per session -----------------------

@pytest.fixture(scope="session")
def me5_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A VECPLUG_HOME in which me5-small was built from scratch during this session."""
    return tmp_path_factory.mktemp("me5-home")


@pytest.fixture
def built_me5(me5_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VECPLUG_HOME", str(me5_home))
    from vecplug.indexer.models import build_builtin

    return build_builtin("me5-small")


def server_options() -> dict[str, Any]:
    """Options of a Qdrant store on the server code path, against qdrant-client's in-process
    server stand-in (a fresh one each call)."""
    qdrant_client = pytest.importorskip("qdrant_client")
    return {"client": qdrant_client.QdrantClient(location=":memory:"), "collection": "battery"}


@pytest.fixture(params=["hnswlib", "hnswlib-centred", "flat", "qdrant-embedded", "qdrant-server"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[type, str, dict[str, Any]]:
    """Each store as (class, location, options): the battery every store passes (hnswlib also
    with its graph of language-centred vectors, whose answers must be the same)."""
    from vecplug.adapters.stores import get_store_class

    if request.param == "flat":
        return get_store_class("flat"), str(tmp_path / "idx"), {}
    if request.param.startswith("hnswlib"):
        return get_store_class("hnswlib"), str(tmp_path / "idx"), {"centred": True} if request.param.endswith("centred") else {}
    pytest.importorskip("qdrant_edge" if request.param == "qdrant-embedded" else "qdrant_client")
    if request.param == "qdrant-embedded":
        return get_store_class("qdrant"), str(tmp_path / "idx"), {}
    return get_store_class("qdrant"), "http://localhost:6333", server_options()


@pytest.fixture
def float32_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.precision: auto`` as on a CPU without AMX: float32. For tests that compare
    another runtime or quantisation with torch's float32 vectors; on a CPU with AMX, auto would
    make the reference bfloat16 (``indexer.precision``, tested in test_precision.py)."""
    from vecplug.indexer import precision

    monkeypatch.setattr(precision, "amx_bf16", lambda: False)
