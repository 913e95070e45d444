"""model.compile (indexer.compiled): documents' batches through torch.compile, the same vectors."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vecplug.indexer.encoder import Encoder
from vecplug.indexer.traced import SMALL_FORWARD_TOKENS

#: enough text that a batch holds more than SMALL_FORWARD_TOKENS tokens, of mixed lengths
TEXTS = [f"document {i}: " + " ".join(["water boils at one hundred degrees", "der fuchs springt",
                                         "el agua hierve a cien grados y más"][: 1 + i % 3]) * (1 + i % 4)
         for i in range(48)]


def _assert_large(te: Any) -> None:
    """TEXTS make batches that take the compiled path (and smaller ones that do not)."""
    sizes = [batch[1].size for batch in te._batches(te.tokenize(TEXTS, "", 64))]
    assert max(sizes) > SMALL_FORWARD_TOKENS, sizes


@pytest.mark.slow  # Inductor compiles the tiny model's graph with gcc: ~30 s
def test_compiled_documents_give_the_eager_vectors(tiny_model: Path, fresh_machine: Path) -> None:
    eager = Encoder.from_specs(str(tiny_model), precision="float32").encode_documents(TEXTS)
    enc = Encoder.from_specs(str(tiny_model), precision="float32", compile=True)
    _assert_large(enc.document)
    got = enc.encode_documents(TEXTS)
    assert enc.document.compiled is not None and enc.document.compiled.compiled is not None  # not fallen back
    np.testing.assert_allclose(got, eager, atol=1e-4)
    # compiled where VECPLUG_HOME is (a fresh machine's cache, not an earlier run's)
    assert any((fresh_machine / "cache" / "inductor").iterdir())
    # another batch shape (fewer, shorter texts) reuses or extends the graph: still the same
    short = TEXTS[::2]
    np.testing.assert_allclose(enc.encode_documents(short),
                               Encoder.from_specs(str(tiny_model), precision="float32").encode_documents(short),
                               atol=1e-4)


class _Recorder:
    """Stands in for torch.compile's result: records its calls, then fails as a missing
    compiler would."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, **_: Any) -> Any:
        self.calls += 1
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")


def test_only_large_batches_are_compiled_and_a_failure_falls_back_to_eager(
        tiny_model: Path, fresh_machine: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import torch

    recorder = _Recorder()
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: recorder)
    enc = Encoder.from_specs(str(tiny_model), precision="float32", compile=True)
    eager = Encoder.from_specs(str(tiny_model), precision="float32")
    te = enc.document
    # a query (a small forward pass) never reaches the compiled graph
    np.testing.assert_allclose(enc.encode_queries(["water"]), eager.encode_queries(["water"]), atol=1e-6)
    assert recorder.calls == 0
    with caplog.at_level(logging.WARNING, logger="vecplug.indexer.compiled"):
        got = enc.encode_documents(TEXTS)
        enc.encode_documents(TEXTS)
    assert recorder.calls == 1 and te.compiled.compiled is None  # tried once, then eager
    assert [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()] == [
        "torch.compile failed on BertModel (RuntimeError: InvalidCxxCompiler: No working C++ compiler "
        "found); the model runs eagerly"]
    np.testing.assert_allclose(got, eager.encode_documents(TEXTS), atol=1e-6)


def test_large_batches_stay_compiled_once_queries_have_traced_the_model(
        tiny_model: Path, fresh_machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that encodes both sides (no student): a few queries trace it, and its large
    batches still go through the compiled forward (the traced graph took them all)."""
    from vecplug.indexer import compiled

    calls: list[int] = []

    class Counting:
        def __init__(self, model: Any) -> None:
            self.model = model

        def __call__(self, ids: Any, mask: Any) -> Any:
            calls.append(int(ids.numel()))
            return self.model(input_ids=ids, attention_mask=mask).last_hidden_state

    monkeypatch.setattr(compiled, "CompiledForward", Counting)
    enc = Encoder.from_specs(str(tiny_model), precision="float32", compile=True)
    _assert_large(enc.document)
    for _ in range(4):
        enc.encode_queries(["water boils"])
    assert enc.document.graph is not None and not calls  # traced; queries never compiled
    got = enc.encode_documents(TEXTS)
    assert calls and all(n > SMALL_FORWARD_TOKENS for n in calls)
    eager = Encoder.from_specs(str(tiny_model), precision="float32").encode_documents(TEXTS)
    np.testing.assert_allclose(got, eager, atol=1e-5)


def test_the_setting_reaches_the_document_encoder_only(tiny_model: Path, fresh_machine: Path,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from click.testing import CliRunner

    from vecplug.api import Index
    from vecplug.cli import cli
    from vecplug.config import load_settings

    made: list[str] = []

    def compile_(model: Any, **kwargs: Any) -> _Recorder:
        made.append(type(model).__name__)
        return _Recorder()

    monkeypatch.setattr(torch, "compile", compile_)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("water boils at one hundred degrees\n", encoding="utf-8")
    common = ["--index", str(tmp_path / "idx"), "--model", str(tiny_model)]
    result = CliRunner().invoke(cli, ["index", str(corpus), "-q", "--compile", *common])
    assert result.exit_code == 0, result.output
    assert made == ["BertModel"]  # the flag reached the document encoder (one short text: never run)
    monkeypatch.setenv("VECPLUG_MODEL_COMPILE", "true")
    with Index.open(load_settings(None, {"index": {"path": str(tmp_path / "idx")}})) as index:
        assert index.encoder.compile is True
        assert index.encoder.document.compiled is not None
        assert index.encoder.query.compiled is None or index.encoder.query is index.encoder.document
    monkeypatch.delenv("VECPLUG_MODEL_COMPILE")
    with Index.open(load_settings(None, {"index": {"path": str(tmp_path / "idx")}})) as index:
        assert index.encoder.compile is False and index.encoder.document.compiled is None


def test_inductor_s_cache_is_vecplug_s_unless_the_user_set_one(fresh_machine: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from vecplug.indexer.compiled import inductor_cache

    ours = str(fresh_machine / "cache" / "inductor")
    assert inductor_cache() == ours  # unset: VECPLUG_HOME's
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    cache_dir()  # torch asked first (some imports do) and wrote its /tmp default in
    assert inductor_cache() == ours
    mine = str(tmp_path / "my-inductor-cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", mine)
    assert inductor_cache() == mine


def test_freezing_is_on_during_compiled_calls_and_given_back_across_threads() -> None:
    """Calls from two threads that overlap each compile with freezing, and leave Inductor's
    setting as it was (torch keeps it per thread: a patch in one thread is not another's)."""
    import threading

    import torch._inductor.config as inductor_config

    from vecplug.indexer.compiled import _freezing

    before = inductor_config.freezing
    entered, release = threading.Barrier(2), threading.Event()
    seen: list[bool] = []

    def call() -> None:
        with _freezing():
            entered.wait(timeout=5)
            seen.append(inductor_config.freezing)
            release.wait(timeout=5)

    first = threading.Thread(target=call)
    first.start()
    second = threading.Thread(target=call)
    second.start()
    release.set()
    first.join()
    second.join()
    assert seen == [True, True] and inductor_config.freezing == before
