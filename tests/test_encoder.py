import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vecplug.errors import ConfigError, ModelError
from vecplug.indexer.encoder import Encoder, TextEncoder
from vecplug.indexer.models import resolve_model

TEXTS = ["water boils at one hundred degrees", "wasser kocht", "el agua", "вода кипит при ста градусах",
         "水在一百度沸腾", "the quick brown fox jumps over the lazy dog " * 5, "x"]


def test_vectors_are_unit_and_independent_of_batching(tiny_model: Path) -> None:
    info = resolve_model(str(tiny_model))
    big = TextEncoder(info, batch_tokens=10_000)
    small = TextEncoder(info, batch_tokens=8)  # one text per batch
    a = big.encode(TEXTS, max_length=64)
    b = small.encode(TEXTS, max_length=64)
    assert a.shape == (len(TEXTS), 32) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a, b, atol=1e-5)  # padding and order never leak into vectors
    single = np.stack([big.encode([t], max_length=64)[0] for t in TEXTS])
    np.testing.assert_allclose(a, single, atol=1e-5)


def test_prefixes_and_lengths(tiny_model: Path) -> None:
    enc = Encoder.from_specs(str(tiny_model), query_prefix="query: ", document_prefix="passage: ",
                             query_max_length=4, document_max_length=64)
    assert enc.query_prefix == "query: "
    ids = enc.query.tokenize(["water boils at one hundred degrees"], enc.query_prefix, 4)[0]
    assert len(ids) == 4
    q = enc.encode_queries(["water boils"])
    d = enc.encode_documents(["water boils"])
    assert not np.allclose(q, d)  # different prefixes give different vectors
    plain = Encoder.from_specs(str(tiny_model))
    assert (plain.query_prefix, plain.document_prefix) == ("", "")  # not an E5 model
    np.testing.assert_allclose(plain.encode_queries(["water boils"]),
                               plain.encode_documents(["water boils"]), atol=1e-6)
    desc = enc.describe()
    assert desc["dim"] == 32 and desc["document_encoder_checksum"] == resolve_model(str(tiny_model)).checksum
    assert enc.encode_documents([]).shape == (0, 32)


def test_query_slot_is_separate(tiny_model: Path, other_tiny_model: Path) -> None:
    enc = Encoder.from_specs(str(tiny_model), str(other_tiny_model))
    assert enc.query is not enc.document
    assert enc.describe()["query_encoder"] != enc.describe()["document_encoder"]
    assert not np.allclose(enc.encode_queries(["wasser"]), enc.encode_documents(["wasser"]))


def test_bad_model_specs(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="neither a built-in name"):
        resolve_model("no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_hub_ids_are_fetched_from_the_hub_and_fail_clearly_offline() -> None:
    # HF_HUB_OFFLINE=1 (conftest): the real download path runs and reports its failure
    with pytest.raises(ModelError, match="could not get model 'intfloat/multilingual-e5-small'"):
        resolve_model("intfloat/multilingual-e5-small")


def test_int8_query_encoder(tiny_model: Path) -> None:
    import torch

    fp32 = Encoder.from_specs(str(tiny_model))
    int8 = Encoder.from_specs(str(tiny_model), query_quantize="int8")
    # the int8 query side is its own copy: documents are still encoded in fp32
    assert int8.query is not int8.document
    linears = [(name, type(m) is torch.nn.Linear, m.in_features > m.out_features)
               for name, m in int8.query.model.named_modules() if hasattr(m, "in_features")]
    # int8 except the first layer's feed-forward down-projection (TEACHER_QUERY_RECIPE)
    assert [name for name, fp32, _ in linears if fp32] == ["encoder.layer.0.output.dense.linear"]
    assert [narrows for name, fp32, narrows in linears if fp32] == [True]
    int8_weight = next(m for m in int8.query.model.modules() if hasattr(m, "weight") and callable(m.weight))
    assert int8_weight.weight().qscheme() == torch.per_channel_affine  # one scale per output row
    assert all(type(m) is torch.nn.Linear for m in int8.document.model.modules() if hasattr(m, "in_features"))
    np.testing.assert_allclose(int8.encode_documents(TEXTS), fp32.encode_documents(TEXTS), atol=1e-6)
    a, b = fp32.encode_queries(TEXTS), int8.encode_queries(TEXTS)
    assert not np.allclose(a, b, atol=1e-6)  # it really runs other weights
    assert (a * b).sum(1).min() > 0.95  # and stays close to the fp32 vectors
    assert int8.describe()["query_quantize"] == "int8"
    assert int8.query.tokenizer is int8.document.tokenizer  # one tokenizer per folder and process

    # ... and one vocabulary table: quantisation leaves it as it is (+111 MiB for me5-small
    # while each side kept its own), whichever side is loaded first
    def table(side: TextEncoder) -> int:
        return side.model.get_input_embeddings().weight.data_ptr()

    assert table(int8.query) == table(int8.document)  # the query side was loaded first
    documents_first = Encoder.from_specs(str(tiny_model), query_quantize="int8")
    assert documents_first.document is not documents_first.query
    assert table(documents_first.query) == table(documents_first.document)
    np.testing.assert_allclose(documents_first.encode_queries(TEXTS), b, atol=1e-6)
    with pytest.raises(Exception, match="unknown quantisation"):
        TextEncoder(resolve_model(str(tiny_model)), quantize="int4")


def test_a_half_precision_checkpoint_runs_in_float32(tiny_model: Path, tmp_path: Path, float32_torch: None) -> None:
    """transformers keeps a checkpoint's stored dtype: an fp16 folder encoded in fp16 (2x slower
    on a CPU), and int8 quantisation failed on it ("expected scalar type Float but found Half").
    In float32 (``float32_torch``): on a CPU with AMX, ``precision: auto`` computes in bfloat16,
    whose rounding of the two models' weights differs by more than fp16's (0.0025 in one CI run)."""
    import torch
    from transformers import AutoModel

    half = tmp_path / "half"
    shutil.copytree(tiny_model, half)
    AutoModel.from_pretrained(str(tiny_model)).half().save_pretrained(str(half))
    enc = Encoder.from_specs(str(half), query_quantize="int8")
    assert enc.document.model.dtype == torch.float32
    want = Encoder.from_specs(str(tiny_model)).encode_documents(TEXTS)
    np.testing.assert_allclose(enc.encode_documents(TEXTS), want, atol=2e-3)  # fp16 rounding only
    assert (enc.encode_queries(TEXTS) * want).sum(1).min() > 0.9


def test_roberta_style_positions_start_after_the_padding_id(tiny_model: Path, tmp_path: Path) -> None:
    """An XLM-R-style folder whose tokenizer names no model_max_length: its position table holds
    pad_token_id + 1 fewer tokens (a long text crashed: "index 130 is out of bounds")."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from vecplug.indexer.encoder import position_limit

    assert position_limit({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert position_limit({"model_type": "bert", "max_position_embeddings": 512, "pad_token_id": 0}) == 512
    folder = tmp_path / "xlmr"
    shutil.copytree(tiny_model, folder)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    del tok["model_max_length"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config = XLMRobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=130, pad_token_id=0)
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    enc = Encoder.from_specs(str(folder))
    assert enc.document_max_length == 129
    assert enc.encode_documents(["water " * 400]).shape == (1, 32)


def test_token_ids_are_the_wrappers(tiny_model: Path) -> None:
    """``SharedTokenizer.ids`` calls the Rust backend directly; its ids are the Hugging Face
    wrapper's, cut at each limit on the tokenizer's truncation side, and the wrapper's own
    calls afterwards are unaffected."""
    from transformers import AutoTokenizer

    from vecplug.indexer.encoder import SharedTokenizer

    texts = [t * 3 for t in TEXTS]
    for side in ("right", "left"):
        tok = AutoTokenizer.from_pretrained(str(tiny_model), truncation_side=side)
        shared = SharedTokenizer(tok)
        for limit in (3, 8, 128):
            assert shared.ids(texts, limit) == tok(texts, truncation=True, max_length=limit)["input_ids"]
        cut = shared.ids([texts[0]], 8)[0]
        whole = tok(texts[0])["input_ids"]  # the wrapper's own call afterwards: not cut
        assert len(whole) > 8
        assert cut == (whole[:1] + whole[-7:] if side == "left" else whole[:7] + whole[-1:])


def test_a_shared_tokenizer_keeps_each_callers_limit_across_threads(tiny_model: Path) -> None:
    """Query (short limit) and document (long limit) tokenisation at once from two threads on
    the one shared tokenizer: each gets its own truncation, and the chunker's offsets none."""
    from concurrent.futures import ThreadPoolExecutor

    enc = Encoder.from_specs(str(tiny_model), query_quantize="int8")
    long_text = " ".join(TEXTS * 20)
    full = len(enc.document.offsets(long_text))
    assert full > 100

    def run(kind: str) -> set[int]:
        if kind == "offsets":
            return {len(enc.document.offsets(long_text)) for _ in range(200)}
        side, limit = (enc.query, 8) if kind == "query" else (enc.document, 64)
        return {len(ids) for _ in range(200) for ids in side.tokenize([long_text] * 4, "", limit)}

    with ThreadPoolExecutor(3) as pool:
        query, document, offsets = pool.map(run, ["query", "document", "offsets"])
    assert (query, document, offsets) == ({8}, {64}, {full})


def test_auto_quantisation_follows_the_model(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` (the default) runs int8 only for a model that records it was measured so (as
    the shipped student's student.json does), and only on x86; ``none``/None: float32."""
    import dataclasses
    import platform

    plain = resolve_model(str(tiny_model))
    measured = dataclasses.replace(plain, query_quantize="int8")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert Encoder(measured).query_quantize == "int8"
    assert Encoder(measured, query_quantize="none").query_quantize is None
    assert Encoder(measured, query_quantize=None).query_quantize is None
    assert Encoder(plain).query_quantize is None
    assert Encoder(plain, query_quantize="int8").query_quantize == "int8"
    monkeypatch.setattr(platform, "machine", lambda: "arm64")  # measured on x86 only
    assert Encoder(measured).query_quantize is None
    assert Encoder(measured, query_quantize="int8").query_quantize == "int8"


def test_offsets_of_a_long_text_log_no_length_warning(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The chunker tokenises whole file blocks, far past the model's 128 tokens, only for their
    character spans: transformers' "Token indices sequence length is longer than the specified
    maximum" warning would be a false alarm on every long file (even under ``-q``)."""
    enc = Encoder.from_specs(str(tiny_model))
    tok = enc.document.tokenizer
    long_text = " ".join(TEXTS * 20)
    once = "sequence-length-is-longer-than-the-specified-maximum"  # transformers warns once per tokenizer

    def warnings_of(call: Callable[[], object]) -> list[str]:
        tok.deprecation_warnings.pop(once, None)  # re-armed: another test may have fired it
        caplog.clear()
        # transformers' root logger does not propagate to caplog's handler on the root logger,
        # so the handler goes on it too; with CI=true in the environment it does propagate
        # (transformers' own rule), and one record reaches the handler twice
        root = logging.getLogger("transformers")
        root.addHandler(caplog.handler)
        try:
            with caplog.at_level(logging.WARNING, logger="transformers"):
                call()
        finally:
            root.removeHandler(caplog.handler)
        records = {id(r): r for r in caplog.records}.values()  # each record once
        return [r.getMessage() for r in records if "sequence length is longer" in r.getMessage()]

    spans: list[tuple[int, int]] = []
    assert warnings_of(lambda: spans.extend(enc.document.offsets(long_text))) == []
    assert len(spans) > enc.document.model_max_length
    # the capture works: the same tokenisation straight through the tokenizer does warn
    assert len(warnings_of(lambda: tok(long_text, add_special_tokens=False, return_offsets_mapping=True))) == 1


def _short_model(tiny_model: Path, folder: Path, positions: int, tokenizer_limit: int | None) -> Path:
    """The tiny model with a position table of ``positions`` rows (new random weights) and a
    tokenizer saying ``tokenizer_limit`` tokens (None: saying nothing)."""
    from transformers import BertConfig, BertModel

    shutil.copytree(tiny_model, folder)
    config = BertConfig.from_pretrained(str(folder))
    config.max_position_embeddings = positions
    BertModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    tok_file = folder / "tokenizer_config.json"
    tok_config = json.loads(tok_file.read_text())
    tok_config.pop("model_max_length", None)
    if tokenizer_limit is not None:
        tok_config["model_max_length"] = tokenizer_limit
    tok_file.write_text(json.dumps(tok_config))
    return folder


def test_length_limits_above_the_models_maximum_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    """A limit the model cannot take was cut silently to the model's maximum while the index
    recorded the asked one; now it is a ConfigError naming the setting, the value and the
    maximum, raised when the encoder is made (before any weights load)."""
    short = _short_model(tiny_model, tmp_path / "short", positions=32, tokenizer_limit=None)
    with pytest.raises(ConfigError, match=r"^model\.document_max_length 100000 is more than "
                                          r".*short takes \(32 tokens\)$"):
        Encoder.from_specs(str(short), document_max_length=100000)
    with pytest.raises(ConfigError, match=r"^model\.query_max_length 33 is more than .*short takes \(32 tokens\)$"):
        Encoder.from_specs(str(short), query_max_length=33)
    # the defaults (64 / 256) are cut to what the model takes; the maximum itself is allowed
    enc = Encoder.from_specs(str(short))
    assert (enc.query_max_length, enc.document_max_length) == (32, 32)
    assert (enc.describe()["query_max_length"], enc.describe()["document_max_length"]) == (32, 32)
    full = Encoder.from_specs(str(short), query_max_length=32, document_max_length=32)
    assert full.encode_documents([" ".join(TEXTS * 5)]).shape == (1, 32)  # runs: nothing past the table
    # a tokenizer that says fewer tokens than the position table holds (XLM-R: 512 of 514) is the limit
    xlmr = _short_model(tiny_model, tmp_path / "xlmr", positions=32, tokenizer_limit=30)
    with pytest.raises(ConfigError, match=r"document_max_length 31 .*\(30 tokens\)"):
        Encoder.from_specs(str(xlmr), document_max_length=31)
    assert Encoder.from_specs(str(xlmr)).document_max_length == 30
    # a model that takes more keeps the project's defaults
    plain = Encoder.from_specs(str(tiny_model))  # 128 tokens
    assert (plain.query_max_length, plain.document_max_length) == (64, 128)
    assert Encoder.from_specs(str(tiny_model), query_max_length=64, document_max_length=128).document_max_length == 128


def test_a_too_long_setting_stops_indexing_before_an_index_exists(tiny_model: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``VECPLUG_MODEL_DOCUMENT_MAX_LENGTH=100000 vecplug index docs``: refused, not recorded."""
    import vecplug

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("water boils at one hundred degrees")
    monkeypatch.setenv("VECPLUG_MODEL_DOCUMENT_MAX_LENGTH", "100000")
    settings = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                                "model": {"document": str(tiny_model)}})
    assert settings.model.document_max_length == 100000
    with pytest.raises(ConfigError, match=r"model\.document_max_length 100000 is more than .* \(128 tokens\)"):
        vecplug.create_index(docs, settings=settings)
    assert not (tmp_path / "idx").exists() or not any((tmp_path / "idx").iterdir())
    monkeypatch.delenv("VECPLUG_MODEL_DOCUMENT_MAX_LENGTH")
    ok = vecplug.load_settings(overrides={"index": {"path": str(tmp_path / "idx")},
                                          "model": {"document": str(tiny_model)}})
    with vecplug.create_index(docs, settings=ok) as index:  # the defaults: 64 / the model's 128
        assert (index.manifest["query_max_length"], index.manifest["document_max_length"]) == (64, 128)


def test_a_folders_checksum_is_of_its_weights_not_of_their_record(tiny_model: Path, tmp_path: Path) -> None:
    """New weights in a folder are a new model, whatever its vecplug.json records: the index's
    encoder check and the ONNX and int8 caches all go by this checksum. The new file keeps the
    old size and modification time: the checksum cache must still see it changed."""
    import os

    from safetensors.torch import load_file, save_file

    from vecplug.indexer.checksums import weights_sha256

    folder = tmp_path / "fine-tuned"
    shutil.copytree(tiny_model, folder)
    weights = folder / "model.safetensors"
    recorded = weights_sha256(weights)  # as the me5-small build and train record a one-file folder
    (folder / "vecplug.json").write_text(json.dumps({"weights_sha256": recorded}))
    assert resolve_model(str(folder)).checksum == recorded  # the same definition: identities kept
    st = weights.stat()
    state = load_file(str(weights))
    state = {k: v + 1 for k, v in state.items()}  # same names and shapes: a file of the same size
    save_file(state, str(weights), metadata={"format": "pt"})
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size
    with pytest.warns(RuntimeWarning, match="changed since"):
        info = resolve_model(str(folder))
    assert info.checksum == weights_sha256(weights) != recorded
    # several weight files: their checksums combined, never the record of one of them
    shutil.copyfile(tiny_model / "model.safetensors", folder / "model-2.safetensors")
    with pytest.warns(RuntimeWarning, match="changed since"):
        assert resolve_model(str(folder)).checksum not in (recorded, info.checksum)


def test_a_students_checksum_is_of_its_weights_not_of_their_record(tiny_student: Path) -> None:
    from safetensors.torch import load_file, save_file

    from vecplug.indexer.student import STUDENT_WEIGHTS

    before = resolve_model(str(tiny_student)).checksum
    assert before == json.loads((tiny_student / "student.json").read_text())["weights_sha256"]
    state = load_file(str(tiny_student / STUDENT_WEIGHTS))
    name = sorted(state)[0]
    state[name] = state[name] + 1
    save_file(state, str(tiny_student / STUDENT_WEIGHTS), metadata={"format": "pt"})
    with pytest.warns(RuntimeWarning, match="changed since"):
        assert resolve_model(str(tiny_student)).checksum != before


def test_checksums_cached_by_another_method_are_not_reused(tiny_model: Path, fresh_machine: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier version cached file-byte checksums under ``path|size|mtime``: never taken for
    tensor checksums (and dropped); this method's own entries are reused without hashing."""
    from vecplug.fsutil import file_sha256
    from vecplug.indexer import checksums
    from vecplug.indexer.models import folder_checksum

    weights = tiny_model / "model.safetensors"
    st = weights.stat()
    old_key = f"{weights.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    fresh_machine.mkdir(parents=True, exist_ok=True)
    (fresh_machine / "checksums.json").write_text(json.dumps({old_key: file_sha256(weights)}))
    expected = checksums.weights_sha256(weights)
    assert expected != file_sha256(weights)
    assert folder_checksum(tiny_model) == expected
    assert old_key not in json.loads((fresh_machine / "checksums.json").read_text())
    monkeypatch.setattr(checksums, "weights_sha256", lambda path: pytest.fail(f"{path} hashed again"))
    assert folder_checksum(tiny_model) == expected


def test_default_prefixes_go_by_the_folders_name_not_the_spec(tiny_model: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``vecplug index --model .`` in an E5 folder gets E5's prefixes, as its full path does."""
    from vecplug.indexer import models

    folder = tmp_path / "my-e5-model"
    shutil.copytree(tiny_model, folder)
    monkeypatch.chdir(folder)
    e5 = ("query: ", "passage: ")
    for spec in (".", "./", str(folder)):
        info = resolve_model(spec)
        assert (info.query_prefix, info.document_prefix) == e5, spec
    # a hub model's folder is a snapshot named by commit: the repository's name decides
    monkeypatch.setattr(models, "_download", lambda spec: tiny_model)  # "tiny-bert": no E5 in it
    info = resolve_model("intfloat/multilingual-e5-small@main")
    assert (info.query_prefix, info.document_prefix) == e5
    assert resolve_model("org/tiny-bert").query_prefix == ""
    # a name part, not any "e5" inside a word ("base5", "free5")
    monkeypatch.setattr(models, "_download", lambda spec: tiny_model)
    assert resolve_model("org/roberta-base5").query_prefix == ""
    assert resolve_model("intfloat/e5-base-v2").query_prefix == "query: "
    # E5's instruct models take a task instruction, not "query: ": that is the user's to give
    info = resolve_model("intfloat/multilingual-e5-large-instruct")
    assert (info.query_prefix, info.document_prefix) == ("", "")


def test_a_sentence_transformers_folder_names_its_own_prompts(tiny_model: Path, tmp_path: Path) -> None:
    """Prompts a sentence-transformers folder declares are its prefixes, whatever its name (a
    renamed E5 folder, a model of another family); vecplug.json's, when there, come first."""
    import json

    folder = tmp_path / "renamed"
    shutil.copytree(tiny_model, folder)
    assert resolve_model(str(folder)).query_prefix == ""  # nothing says
    config = folder / "config_sentence_transformers.json"
    for prompts, want in (({"query": "query: ", "passage": "passage: "}, ("query: ", "passage: ")),
                          ({"query": "Represent this: ", "document": ""}, ("Represent this: ", "")),
                          ({"query": "q: "}, ("q: ", "")), ({"classification": "c: "}, ("", "")),
                          ({"query": 3}, ("", ""))):
        config.write_text(json.dumps({"prompts": prompts, "default_prompt_name": None}))
        info = resolve_model(str(folder))
        assert (info.query_prefix, info.document_prefix) == want, prompts
    config.write_text("{not json")
    assert resolve_model(str(folder)).query_prefix == ""
