"""Safety properties of the reliability issue, each tested so that it can fail.

5. Mismatches are refused: a document/query encoder, dimension, space, normalisation, pooling
   or prefix that differs from the index's manifest raises ModelMismatchError naming both sides.
8. Finite vectors: a document whose vector is NaN, inf or zero is reported and left out; a
   query whose vector is is refused.
9. Safe by default: our files are JSON, SQLite, hnswlib graphs or safetensors, never pickle;
   the source calls no unsafe loader; a config file cannot run code; remote model code never
   runs; a crafted Qdrant folder without vecplug's manifest is refused before any engine file
   is read.
"""
from __future__ import annotations

import ast
import dataclasses
import fnmatch
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import vecplug
from vecplug.api import Index, settings_for
from vecplug.errors import ConfigError, IndexNotFoundError, ModelMismatchError, VecplugError
from vecplug.types import Document

from conftest import REPO, FakeEncoder

PICKLE_HEADERS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")

DOCS = [
    Document(id="en", text="water boils at one hundred degrees", source="en.txt", lang="en"),
    Document(id="de", text="wasser kocht bei hundert grad", source="de.txt", lang="de"),
    Document(id="es", text="el agua hierve a cien grados", source="es.txt", lang="es"),
    Document(id="fox", text="the quick brown fox jumps over the lazy dog", source="fox.txt", lang="en"),
]


# -- helpers ---------------------------------------------------------------------------

def build_index(path: Path, model: Path, docs: Sequence[Document] = DOCS) -> Path:
    """An hnswlib index at ``path`` built with ``model`` (no documents if ``docs`` is empty)."""
    settings = settings_for(str(path), model={"document": str(model)})
    with Index.open(settings, create=True) as index:
        if docs:
            index.add_documents(docs)
    return path


def open_with(path: Path, writable: bool = False, **model: Any) -> Index:
    """Open the index at ``path`` with model settings that may differ from its manifest."""
    return vecplug.open_index(settings=settings_for(str(path), model=model), writable=writable)


def edit_manifest(path: Path, update: dict[str, Any]) -> None:
    """Change the committed manifest the way a writer does (a store commit), not by hand."""
    from vecplug.adapters.stores.hnsw import HnswStore

    with HnswStore.open(str(path), {}, writable=True) as store:
        store.commit(update)


def make_student(teacher: Path, folder: Path) -> Path:
    """An untrained one-layer query student of ``teacher``, saved as distillation saves one."""
    from transformers import AutoModel

    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import make_student as _make, save_student

    info = resolve_model(str(teacher))
    model = AutoModel.from_pretrained(str(teacher), add_pooling_layer=False)
    meta = {"kind": "vecplug query student", "teacher": str(teacher), "teacher_checksum": info.checksum,
            "layers": [1], "query_prefix": info.query_prefix, "document_prefix": info.document_prefix}
    save_student(_make(model, [1]), folder, meta)
    return folder


@pytest.fixture
def index_path(tmp_path: Path, tiny_model: Path) -> Path:
    return build_index(tmp_path / "idx", tiny_model)


@pytest.fixture
def empty_index_path(tmp_path: Path, tiny_model: Path) -> Path:
    # no graph file: a manifest edited to another dimension still opens (hnswlib files
    # record no dimension, so a populated one would fail to load before the check runs)
    return build_index(tmp_path / "empty", tiny_model, docs=[])


# == 5. mismatches are refused, naming both sides ======================================

def test_other_document_encoder_is_refused(index_path: Path, tiny_model: Path,
                                           other_tiny_model: Path) -> None:
    from vecplug.indexer.models import folder_checksum

    with open_with(index_path, document=str(other_tiny_model)) as index:
        with pytest.raises(ModelMismatchError, match="document encoder mismatch") as err:
            index.encoder
    message = str(err.value)
    for side in (tiny_model, other_tiny_model):
        assert str(side.resolve()) in message and folder_checksum(side) in message


def test_other_document_encoder_cannot_write(index_path: Path, other_tiny_model: Path) -> None:
    """Writing with another encoder would mix two vector spaces in one index."""
    with open_with(index_path, writable=True, document=str(other_tiny_model)) as index:
        with pytest.raises(ModelMismatchError):
            index.add_documents([Document(id="new", text="new text", source="n.txt", lang="en")])
    with open_with(index_path) as index:
        assert index.store.count() == len(DOCS)


@pytest.mark.parametrize("key, value, what", [("query_prefix", "query: ", "query prefix"),
                                              ("document_prefix", "passage: ", "document prefix")])
def test_other_prefix_is_refused(index_path: Path, key: str, value: str, what: str) -> None:
    with open_with(index_path, **{key: value}) as index:
        with pytest.raises(ModelMismatchError, match=f"{what} mismatch") as err:
            index.encoder
    # the tiny model has no prefix: the index was built with ''
    assert f"built with {''!r}" in str(err.value) and f"uses {value!r}" in str(err.value)


def test_query_encoder_of_another_teacher_is_refused(index_path: Path, tiny_model: Path,
                                                     other_tiny_model: Path, tmp_path: Path) -> None:
    from vecplug.indexer.models import folder_checksum

    stranger = make_student(other_tiny_model, tmp_path / "student-of-other")
    with open_with(index_path, query=str(stranger)) as index:
        with pytest.raises(ModelMismatchError, match="distilled from") as err:
            index.encoder
    message = str(err.value)
    assert str(stranger) in message and folder_checksum(other_tiny_model) in message  # its teacher
    assert str(tiny_model.resolve()) in message and folder_checksum(tiny_model) in message  # the index's
    # control: a student of the index's own document encoder is accepted
    own = make_student(tiny_model, tmp_path / "student-of-tiny")
    with open_with(index_path, query=str(own)) as index:
        assert index.encoder.describe()["query_encoder"] == str(own)


def test_query_encoder_of_another_dimension_is_refused(index_path: Path, tiny_model: Path,
                                                       tmp_path: Path) -> None:
    from conftest import build_tiny_model

    narrow = build_tiny_model(tmp_path / "tiny-bert-16", hidden=16)
    with open_with(index_path, query=str(narrow)) as index:
        with pytest.raises(ModelMismatchError, match="dimension") as err:
            index.encoder
    message = str(err.value)
    assert str(narrow.resolve()) in message and "dimension 16" in message
    assert str(tiny_model.resolve()) in message and "has 32" in message


@pytest.mark.parametrize("update, what, built, current", [
    ({"dim": 48}, "dimension", "48", "32"),
    ({"normalize": False}, "normalisation", "False", "True"),
    ({"pooling": "cls"}, "pooling", "'cls'", "'mean'"),
])
def test_manifest_mismatch_is_refused(empty_index_path: Path, update: dict[str, Any], what: str,
                                      built: str, current: str) -> None:
    edit_manifest(empty_index_path, update)
    with open_with(empty_index_path) as index:
        with pytest.raises(ModelMismatchError, match=f"{what} mismatch") as err:
            index.encoder
    assert f"built with {built}" in str(err.value) and f"uses {current}" in str(err.value)


def test_other_space_is_refused(index_path: Path) -> None:
    """vecplug scores unit vectors by inner product (cosine); an index whose manifest says its
    store uses another space (l2, ip on unnormalised vectors, ...) must not be searched as if."""
    with open_with(index_path) as index:
        store = index.manifest["store"]
    assert store["space"] == "cosine"
    edit_manifest(index_path, {"store": {**store, "space": "l2"}})
    with open_with(index_path) as index:
        with pytest.raises(ModelMismatchError, match="space mismatch") as err:
            index.search("water", lang="en")
    assert "'l2'" in str(err.value) and "'cosine'" in str(err.value)


def test_matching_index_opens(index_path: Path, tiny_model: Path) -> None:
    """Control for the tests above: the same settings are accepted and search works."""
    with open_with(index_path, document=str(tiny_model)) as index:
        assert index.search("water boils at one hundred degrees", k=1, lang="en")[0].id == "en"


# == 8. finite vectors ===================================================================

BAD_VALUES = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "zero": 0.0}


class BadVectors(FakeEncoder):
    """FakeEncoder, except that chosen texts get a NaN, inf or all-zero vector."""

    def __init__(self, bad: dict[str, str], dim: int = 16) -> None:
        super().__init__(dim)
        self.bad = bad

    def encode_documents(self, texts: list[str], progress: bool | None = None) -> np.ndarray:
        out = super().encode_documents(texts, progress)
        for row, text in enumerate(texts):
            if text in self.bad:
                kind = self.bad[text]
                if kind == "zero":
                    out[row] = 0.0
                elif kind == "one-nan":  # a single bad component is as bad as all
                    out[row, 3] = np.nan
                else:
                    out[row] = BAD_VALUES[kind]
        return out


def test_non_finite_and_zero_documents_are_reported_and_left_out(tmp_path: Path) -> None:
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores import Record
    from vecplug.adapters.stores.hnsw import HnswStore
    from vecplug.indexer import pipeline

    good = [Document(id=f"good{i}", text=f"good text number {i}", source="g.txt", position=i,
                     lang="en" if i % 2 else "de") for i in range(6)]
    kinds = ["nan", "inf", "-inf", "zero", "one-nan"]
    bad = [Document(id=f"bad-{k}", text=f"bad text {k}", source="b.txt", position=i, lang="en")
           for i, k in enumerate(kinds)]
    docs = [d for pair in zip(good, bad) for d in pair] + good[len(bad):]  # bad ones spread over batches
    encoder = BadVectors({d.text: k for d, k in zip(bad, kinds)})
    stats = LanguageStats(encoder.dim)
    store = HnswStore.create(str(tmp_path / "idx"), encoder.dim, {"document_encoder": "fake"}, {})
    try:
        report = pipeline.run(docs, encoder, store, Record.from_document, detect=None, batch_size=3,
                              progress=False, stats=stats)
    finally:
        store.close()
    assert report.documents == len(good)
    reported = {p.reason.split()[1] for p in report.problems}
    assert reported == {d.id for d in bad}
    assert all("non-finite or zero" in p.reason and p.path == "b.txt" for p in report.problems)
    with HnswStore.open(str(tmp_path / "idx"), {}) as store:
        assert sorted(store.ids()) == sorted(d.id for d in good)
        assert store.get([d.id for d in bad]) == []
        vectors = store.vectors([d.id for d in good])
        assert np.isfinite(vectors).all()
        # the language means (used to remove language bias) saw only the good vectors
        kept = LanguageStats.from_manifest(store.manifest)
        assert kept is not None and sum(kept.counts.values()) == len(good)
        for lang in kept.sums:
            mine = [i for i, d in enumerate(good) if d.lang == lang]
            np.testing.assert_allclose(kept.sums[lang], vectors[mine].sum(0), atol=1e-5)


@pytest.mark.parametrize("kind", sorted(BAD_VALUES))
def test_query_with_non_finite_or_zero_vector_is_refused(index_path: Path, kind: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with open_with(index_path) as index:
        encoder = index.encoder
        real = encoder.encode_queries

        def encode_queries(texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
            out = real(texts, progress=progress)
            out[[i for i, t in enumerate(texts) if t.startswith("poisoned")]] = BAD_VALUES[kind]
            return out

        monkeypatch.setattr(encoder, "encode_queries", encode_queries)
        assert index.search("water", k=1, lang="en").hits  # control: a normal query still works
        with pytest.raises(VecplugError, match="non-finite or zero") as err:
            index.search("poisoned query", lang="en")
        assert "poisoned query" in str(err.value)
        with pytest.raises(VecplugError, match="non-finite or zero") as err:
            index.search_batch(["water", "poisoned second"], langs=["en", "en"])
        assert "poisoned second" in str(err.value)


# == 9. safe by default ==================================================================

SOURCE_DIRS = ("vecplug", "indexer", "adapters")
#: modules that deserialise by running code (pickle and its relatives)
UNSAFE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def unsafe_uses(source: str) -> list[str]:
    """Unsafe deserialisation or remote-code switches in Python ``source``.

    Works on the syntax tree, not the text: docstrings and comments may explain why pickle
    is avoided (adapters/stores/qdrant.py does), code may not use it.
    """
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in UNSAFE_MODULES:
                found.append(f"{line}: from {node.module} import")
        elif isinstance(node, ast.Name) and node.id in UNSAFE_MODULES:
            found.append(f"{line}: name {node.id}")
        elif isinstance(node, ast.Constant) and node.value in UNSAFE_MODULES:
            found.append(f"{line}: string {node.value!r} (importlib?)")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            kw = {k.arg: k.value for k in node.keywords}
            if name.split(".")[-1] == "load" and "torch" in name and not _is_const(kw.get("weights_only"), True):
                found.append(f"{line}: {name}( without weights_only=True")
            if name.startswith("yaml.") and name.split(".")[-1] in UNSAFE_YAML:
                found.append(f"{line}: {name}(")
            for key in ("trust_remote_code", "allow_pickle"):
                if key in kw and not _is_const(kw[key], False):
                    found.append(f"{line}: {name}({key}={ast.unparse(kw[key])})")
            if "weights_only" in kw and not _is_const(kw["weights_only"], True):
                found.append(f"{line}: {name}(weights_only={ast.unparse(kw['weights_only'])})")
    return found


def source_files() -> Iterator[Path]:
    for top in SOURCE_DIRS:
        yield from sorted((REPO / top).rglob("*.py"))


@pytest.mark.parametrize("snippet", [
    "import pickle", "import pickle as p", "from pickle import loads", "import dill",
    "import joblib", "x = __import__('pickle')", "torch.load(f)", "torch.load(f, weights_only=False)",
    "yaml.load(text)", "yaml.load(text, Loader=yaml.FullLoader)", "yaml.unsafe_load(text)",
    "AutoModel.from_pretrained(p, trust_remote_code=True)",
    "AutoModel.from_pretrained(p, trust_remote_code=flag)", "np.load(f, allow_pickle=True)",
    "torch.serialization.load(f)", "x.from_pretrained(p, weights_only=False)",
])
def test_the_scanner_catches_unsafe_code(snippet: str) -> None:
    """The source scan below is only worth something if it can fail."""
    assert unsafe_uses(snippet)


@pytest.mark.parametrize("snippet", [
    '"""we never use pickle here"""', "# pickle would be unsafe", "torch.load(f, weights_only=True)",
    "yaml.safe_load(text)", "AutoModel.from_pretrained(p, trust_remote_code=False)",
    "np.load(f, allow_pickle=False)", "json.load(f)",
])
def test_the_scanner_passes_safe_code(snippet: str) -> None:
    assert unsafe_uses(snippet) == []


def test_source_uses_no_unsafe_loader() -> None:
    files = list(source_files())
    assert len(files) > 20  # the scan really covers the package
    found = [f"{path.relative_to(REPO)}:{hit}" for path in files
             for hit in unsafe_uses(path.read_text(encoding="utf-8"))]
    assert found == []


def test_every_model_load_disables_remote_code() -> None:
    """Each ``from_pretrained`` passes ``trust_remote_code=False`` or leaves the default (False),
    and none forwards ``**kwargs`` through which it could be switched on."""
    calls = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _dotted(node.func).endswith(("from_pretrained", "from_config")):
                calls.append((path, node))
    assert calls  # the models are loaded somewhere
    for path, call in calls:
        where = f"{path.relative_to(REPO)}:{call.lineno}"
        assert all(k.arg is not None for k in call.keywords), f"{where} forwards **kwargs"
        kw = {k.arg: k.value for k in call.keywords}
        assert "trust_remote_code" not in kw or _is_const(kw["trust_remote_code"], False), where


def test_no_setting_enables_remote_code(tmp_path: Path) -> None:
    """No option switches remote code on; if one is ever added, it must demand a pinned revision."""
    from vecplug.config import SECTIONS

    switches = [(section, f.name) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
                if "remote" in f.name or f.name.startswith("trust")]
    for section, name in switches:
        with pytest.raises(ConfigError, match="revision"):
            vecplug.load_settings(overrides={section: {name: True}}, environ={})
    cfg = tmp_path / "remote.yaml"
    cfg.write_text("model: {document: org/name, trust_remote_code: true}\n")
    if not switches:
        with pytest.raises(ConfigError, match="trust_remote_code"):
            vecplug.load_settings(cfg, environ={})


def test_remote_code_in_a_model_folder_never_runs(tiny_model: Path, tmp_path: Path) -> None:
    """A model folder whose config asks for its own Python classes (``auto_map``) is loaded
    with the library's classes or refused; its code is never imported."""
    from vecplug.indexer.encoder import Encoder

    folder = tmp_path / "remote-code-model"
    shutil.copytree(tiny_model, folder)
    marker = tmp_path / "remote-code-ran"
    evil = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (folder / "evil_modeling.py").write_text(evil + "from transformers import BertModel as EvilModel\n")
    (folder / "evil_tokenizer.py").write_text(
        evil + "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "evil_modeling.EvilModel", "AutoConfig": "evil_modeling.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": [None, "evil_tokenizer.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    try:
        vectors = Encoder.from_specs(str(folder)).encode_queries(["water boils"])
        assert np.isfinite(vectors).all()
    except (ValueError, OSError, VecplugError):
        pass  # refusing the folder is safe too
    assert not marker.exists()


def test_hub_downloads_fetch_no_pickle_or_code(tiny_model: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub model is downloaded with an allow-list; nothing on it may be a pickle or Python."""
    import huggingface_hub

    from vecplug.indexer.models import resolve_model

    asked: dict[str, Any] = {}
    snapshot = tmp_path / "snapshot"
    shutil.copytree(tiny_model, snapshot)

    def fake_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        asked.update(kwargs, repo_id=repo_id)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    resolve_model("org/model@0123abc")
    assert asked["repo_id"] == "org/model" and asked["revision"] == "0123abc"
    patterns = asked["allow_patterns"]

    def fetched(name: str) -> bool:
        return any(fnmatch.fnmatch(name, p) for p in patterns)

    for name in ("pytorch_model.bin", "training_args.bin", "model.pkl", "tokenizer.pkl", "optimizer.pt",
                 "model.ckpt", "tokenizer.pickle", "tokenizer.py", "modeling_custom.py",
                 "tokenization_custom.py", "rng_state.pth"):
        assert not fetched(name), name
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "sentencepiece.bpe.model", "special_tokens_map.json"):
        assert fetched(name), name


# -- a config file cannot run code -----------------------------------------------------

@pytest.mark.parametrize("payload", [
    "search: !!python/object/apply:os.system [\"touch {marker}\"]\n",
    "!!python/object/apply:os.system [\"touch {marker}\"]\n",
    "search: {{k: !!python/object/apply:os.system [\"touch {marker}\"]}}\n",
    "model: !!python/object/new:subprocess.Popen [[\"touch\", \"{marker}\"]]\n",
    "search: !!python/name:os.system\n",
])
def test_config_yaml_cannot_run_code(payload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "pwned"
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(payload.format(marker=marker))
    with pytest.raises(ConfigError, match=str(cfg)):
        vecplug.load_settings(cfg, environ={})
    monkeypatch.setenv("VECPLUG_CONFIG", str(cfg))  # the other way a config file is named
    with pytest.raises(ConfigError):
        vecplug.load_settings()
    with pytest.raises(ConfigError):
        vecplug.open_index()  # settings are read before anything is opened
    assert not marker.exists()


def test_config_yaml_cannot_run_code_from_the_command_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from vecplug.cli import cli

    marker = tmp_path / "pwned"
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(f"search: !!python/object/apply:os.system [\"touch {marker}\"]\n")
    result = CliRunner().invoke(cli, ["search", "water", "--config", str(cfg)])
    assert result.exit_code != 0 and "invalid YAML" in result.output
    assert not marker.exists()


# -- a crafted Qdrant folder is refused before any engine file is read ---------------------

class _Poisoned:
    """Unpickling this creates a folder: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.makedirs, (str(self.marker),))


def _junk_shard(folder: Path) -> None:
    shard = folder / "shard"
    (shard / "segments" / "0").mkdir(parents=True)
    (shard / "wal").mkdir()
    (shard / "shard_config.json").write_text("{not json")
    (shard / "segments" / "0" / "segment.json").write_bytes(os.urandom(256))
    (shard / "wal" / "open-1").write_bytes(b"\x80\x04junk" + os.urandom(64))


def _local_mode_folder(folder: Path, marker: Path) -> None:
    """What ``QdrantClient(path=...)`` leaves: meta.json and pickled points in SQLite."""
    import pickle

    (folder / "collection" / "x").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"collections": {"x": {"vectors": {"size": 4}}},
                                                  "aliases": {}}))
    db = sqlite3.connect(folder / "collection" / "x" / "storage.sqlite")
    db.execute("CREATE TABLE points (id TEXT PRIMARY KEY, point BLOB)")
    db.execute("INSERT INTO points VALUES (?, ?)", ("1", pickle.dumps(_Poisoned(marker))))
    db.commit()
    db.close()


@pytest.mark.parametrize("layout", ["junk-shard", "local-mode", "foreign-manifest"])
def test_crafted_qdrant_folder_is_refused_before_engine_files_are_read(
        layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qdrant_edge = pytest.importorskip("qdrant_edge")
    from vecplug.adapters.stores.qdrant import QdrantStore

    folder, marker = tmp_path / "crafted", tmp_path / "unpickled"
    folder.mkdir()
    if layout == "junk-shard":
        _junk_shard(folder)
    elif layout == "local-mode":
        _local_mode_folder(folder, marker)
    else:  # a manifest.json that is not vecplug's (another tool's, or vecplug's hnswlib one)
        _junk_shard(folder)
        (folder / "manifest.json").write_text(json.dumps({"dim": 4, "store": {"name": "qdrant"}}))
    touched: list[str] = []

    class Spy:
        """Stands in for the engine: any attempt to load a shard is recorded."""

        @staticmethod
        def load(path: str, *args: Any, **kwargs: Any) -> Any:
            touched.append(path)
            raise AssertionError("the engine was asked to read a crafted folder")

    real_connect = sqlite3.connect

    def connect(target: Any, *args: Any, **kwargs: Any) -> Any:
        if str(folder) in str(target):
            touched.append(str(target))
        return real_connect(target, *args, **kwargs)

    monkeypatch.setattr(qdrant_edge, "EdgeShard", Spy)
    monkeypatch.setattr(sqlite3, "connect", connect)
    assert QdrantStore.exists(str(folder), {}) is False
    for writable in (False, True):
        with pytest.raises(IndexNotFoundError):
            QdrantStore.open(str(folder), {}, writable=writable)
    with pytest.raises(IndexNotFoundError):
        vecplug.open_index(settings=settings_for(str(folder), index={"store": "qdrant"}))
    assert touched == [] and not marker.exists()


# -- what the default store writes ---------------------------------------------------------

def _no_pickle(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(8)
    assert not head.startswith(PICKLE_HEADERS), f"{path} starts like a pickle"
    assert not head.startswith(b"PK\x03\x04"), f"{path} is a zip (torch.save's format)"


def test_hnswlib_index_folder_holds_no_pickle(index_path: Path, tiny_model: Path) -> None:
    # a second generation and a deletion: every kind of file a writer leaves behind
    with open_with(index_path, writable=True) as index:
        index.add_documents([Document(id="ru", text="вода кипит при ста градусах", source="ru.txt",
                                      lang="ru")])
        index.store.delete(["fox"])
        index.store.commit()
    files = [p for p in index_path.rglob("*") if p.is_file()]
    names = sorted(p.name for p in files)
    assert "records.sqlite" in names and "manifest.json" in names
    allowed = ("*.json", "*.sqlite", "vectors-*.hnsw", "*.lock")
    assert [n for n in names if not any(fnmatch.fnmatch(n, a) for a in allowed)] == []
    for path in files:
        _no_pickle(path)
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    # inside the database: text and JSON, no binary blobs
    db = sqlite3.connect(f"file:{index_path / 'records.sqlite'}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert set(tables) >= {"records", "meta"}
        for table in tables:
            for row in db.execute(f"SELECT * FROM {table}"):
                assert not any(isinstance(v, bytes) for v in row), (table, row)
        for key, value in db.execute("SELECT key, value FROM meta"):
            json.loads(value)
        for (payload,) in db.execute("SELECT payload FROM records"):
            json.loads(payload)
    finally:
        db.close()


def test_shipped_files_are_json_or_safetensors() -> None:
    """The students shipped inside the package are data, never pickles."""
    root = REPO / "vecplug" / "students"
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert path.suffix in (".json", ".safetensors"), path
        _no_pickle(path)
