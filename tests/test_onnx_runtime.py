"""``model.runtime: onnx``: the layers exported to ONNX Runtime, cached, fp32 and int8."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vecplug.errors import ConfigError, MissingDependencyError, ModelError
from vecplug.indexer.encoder import Encoder
from vecplug.indexer import onnx_runtime

# compared with torch's float32 vectors, whatever this CPU's ``model.precision: auto`` is
pytestmark = pytest.mark.usefixtures("float32_torch")

TEXTS = ["the quick brown fox", "wasser kocht bei hundert grad", "水在一百度沸腾",
         "el agua hierve a cien grados y el zorro salta sobre el perro perezoso"]


def _graphs(home: Path) -> list[Path]:
    return sorted((home / "onnx").glob("*.onnx"))


def test_fp32_graph_gives_torch_vectors_and_is_cached(tiny_model: Path, fresh_machine: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    torch_enc = Encoder.from_specs(str(tiny_model))
    onnx_enc = Encoder.from_specs(str(tiny_model), runtime="onnx")
    # batched with padding (documents) and one at a time (queries): the same vectors
    np.testing.assert_allclose(onnx_enc.encode_documents(TEXTS), torch_enc.encode_documents(TEXTS), atol=1e-5)
    single = np.vstack([onnx_enc.encode_queries([t]) for t in TEXTS])
    np.testing.assert_allclose(single, torch_enc.encode_queries(TEXTS), atol=1e-5)
    assert onnx_enc.query is onnx_enc.document  # one model, one quantisation: one session
    # torch keeps only the embeddings: the layers live in the session
    model = onnx_enc.document.model
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in model.embeddings.parameters())
    graphs = _graphs(fresh_machine)
    assert len(graphs) == 1 and "-fp32-" in graphs[0].name
    assert not [p for p in (fresh_machine / "onnx").iterdir() if p.name.startswith(".")]  # no leftovers
    describe = onnx_enc.describe()
    assert describe["runtime"] == "onnx" and describe["query_quantize"] is None

    # a second process opens the cached graph: no export
    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_runtime, "build_graph", no_export)
    again = Encoder.from_specs(str(tiny_model), runtime="onnx")
    np.testing.assert_allclose(again.encode_documents(TEXTS), torch_enc.encode_documents(TEXTS), atol=1e-5)


def test_residual_layer_norms_stay_unfused(tiny_model: Path, fresh_machine: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's SkipLayerNormalization kernel is slower than the add and layer norm it replaces
    (``onnx_runtime.UNFUSED``): neither the cached graph nor the session fuses them."""
    import onnxruntime as ort

    Encoder.from_specs(str(tiny_model), runtime="onnx").encode_queries(TEXTS)
    (path,) = _graphs(fresh_machine)
    ops = _ops(path)[1]
    assert "Attention" in ops and "LayerNormalization" in ops and "SkipLayerNormalization" not in ops

    # a session fuses an add and layer norm of known shapes by itself (ours has dynamic ones,
    # which this ORT leaves alone; a later one might not): UNFUSED keeps them apart
    from onnx import TensorProto, helper, numpy_helper

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 8]) for n in "xy")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"])],
        "add_norm", [x], [y], [numpy_helper.from_array(np.ones(8, np.float32), "g"),
                               numpy_helper.from_array(np.zeros(8, np.float32), "b")])
    small = fresh_machine / "add_norm.onnx"
    small.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())

    def optimized(disabled: list[str]) -> list[str]:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(fresh_machine / "optimized.onnx")
        ort.InferenceSession(str(small), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        return _ops(fresh_machine / "optimized.onnx")[1]

    assert "SkipLayerNormalization" in optimized([])
    assert "SkipLayerNormalization" not in optimized(onnx_runtime.UNFUSED)
    seen: list[Any] = []
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    onnx_runtime.OnnxLayers(path, threads=1)
    assert seen[-1]["disabled_optimizers"] == onnx_runtime.UNFUSED


def _ops(path: Path) -> tuple[Any, list[str]]:
    import onnx

    graph = onnx.load(str(path)).graph
    return graph, [n.op_type for n in graph.node]


def test_int8_recipes_for_student_queries_and_for_documents(tiny_model: Path, tiny_student: Path,
                                                           fresh_machine: Path) -> None:
    fp32 = Encoder.from_specs(str(tiny_model), str(tiny_student), runtime="onnx", query_quantize="none")
    int8 = Encoder.from_specs(str(tiny_model), str(tiny_student), runtime="onnx", query_quantize="int8")
    a, b = fp32.encode_queries(TEXTS), int8.encode_queries(TEXTS)
    assert not np.allclose(a, b, atol=1e-6)  # it really runs other weights
    assert (a * b).sum(1).min() > 0.95  # and stays close to the fp32 vectors
    np.testing.assert_allclose(int8.encode_documents(TEXTS), fp32.encode_documents(TEXTS), atol=1e-6)
    # the student's queries: every weight in int8 after smoothing the down-projection
    graph, ops = _ops(next(p for p in _graphs(fresh_machine) if "-int8-query-" in p.name))
    layers = 1  # the student's
    # the attention output, the FFN up- and down-projections in int8, per output channel ...
    assert ops.count("MatMulInteger") == 3 * layers
    # ... and the fused attention's Q, K, V projection (fused by ORT's optimizer)
    assert ops.count("QAttention") == layers and "Attention" not in ops
    # no float weight MatMul is left, and each down-projection's input is smoothed first
    weights = {i.name for i in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "MatMul" and weights.intersection(n.input)]
    assert sum(n.op_type == "Mul" and n.name.endswith(".smooth") for n in graph.node) == layers

    # documents, and a document encoder's own queries, take the documents' recipe: the
    # attention's Q, K, V in int8 too, after smoothing their input; the narrowing FFN
    # down-projections (in > out) stay float32
    teacher = Encoder.from_specs(str(tiny_model), runtime="onnx", query_quantize="int8", document_quantize="int8")
    d8 = teacher.encode_documents(TEXTS)
    teacher.encode_queries(TEXTS)
    assert (d8 * fp32.encode_documents(TEXTS)).sum(1).min() > 0.95
    int8_graphs = [p for p in _graphs(fresh_machine) if "-int8-" in p.name and "-int8-query-" not in p.name]
    assert len(int8_graphs) == 1  # one graph for both sides
    graph, ops = _ops(int8_graphs[0])
    layers = 2  # the tiny model's
    assert ops.count("MatMulInteger") == 2 * layers and ops.count("QAttention") == layers
    assert "Attention" not in ops
    attention = [n for n in graph.node if n.op_type == "QAttention"]
    assert attention and all(".smoothed_input" in n.input[0] for n in attention)  # (then quantised)
    assert sum(n.op_type == "Mul" and n.name.endswith(".smooth") for n in graph.node) == layers
    dims = {i.name: tuple(i.dims) for i in graph.initializer}
    float_matmuls = [dims[i] for n in graph.node if n.op_type == "MatMul" for i in n.input if i in dims]
    assert len(float_matmuls) == layers and all(d[0] > d[1] for d in float_matmuls)


def test_smoothing_keeps_the_float_function(tiny_model: Path, tmp_path: Path) -> None:
    """SmoothQuant's rescaling moves range from activations into weights: in float32 the graph
    computes the same vectors, and the smoothed layers' inputs have a flatter channel range."""
    enc = Encoder.from_specs(str(tiny_model), query_quantize="none")
    feeds = list(enc.query.calibration_feeds())
    assert feeds and all(e.shape[:2] == m.shape for e, m in feeds)
    raw = tmp_path / "fp32.onnx"
    onnx_runtime.export_fused(enc.query.model, raw)
    before = onnx_runtime.OnnxLayers(raw)
    widths = {("narrowing",): [64, 64], onnx_runtime.SMOOTHABLE: [32, 64, 32, 64]}  # graph order
    for kinds, width in widths.items():
        smoothed = tmp_path / f"smoothed-{len(kinds)}.onnx"
        peaks = onnx_runtime.activation_peaks(raw, feeds, kinds)
        assert [len(p) for p in peaks] == width and all((p > 0).all() for p in peaks)
        onnx_runtime.smooth_inputs(raw, smoothed, peaks, alpha=0.75, kinds=kinds)
        after = onnx_runtime.OnnxLayers(smoothed)
        for embeds, mask in feeds:
            np.testing.assert_allclose(after(embeds, mask), before(embeds, mask), rtol=1e-4, atol=1e-5)
        spread = [p.max() / np.median(p) for p in peaks]
        spread_after = [p.max() / np.median(p) for p in onnx_runtime.activation_peaks(smoothed, feeds, kinds)]
        assert all(b < a for a, b in zip(spread, spread_after))
    with pytest.raises(ValueError, match="1 calibration peaks for 2 layers"):
        onnx_runtime.smooth_inputs(raw, tmp_path / "x.onnx", peaks[:1])
    with pytest.raises(ValueError, match="cannot smooth"):
        onnx_runtime.activation_peaks(raw, feeds, ["layernorm"])


def test_xlm_roberta_graph_gives_torch_vectors(tiny_model: Path, tmp_path: Path) -> None:
    """XLM-R (the architecture of multilingual-e5-base/large and most multilingual hub
    encoders) numbers positions from its padding index: fed ``inputs_embeds``, it numbers them
    from the start instead, which must give the same vectors for right-padded batches."""
    import json
    import shutil

    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    folder = tmp_path / "tiny-xlmr"
    shutil.copytree(tiny_model, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    torch.manual_seed(0)
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]  # the tokenizer's
    config = XLMRobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=130, pad_token_id=0,
                              type_vocab_size=1)
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    torch_enc = Encoder.from_specs(str(folder))
    onnx_enc = Encoder.from_specs(str(folder), runtime="onnx")
    assert type(onnx_enc.document.model).__name__ == "XLMRobertaModel"
    expected = torch_enc.encode_documents(TEXTS)
    np.testing.assert_allclose(onnx_enc.encode_documents(TEXTS), expected, atol=1e-5)
    single = np.vstack([onnx_enc.encode_queries([t]) for t in TEXTS])
    np.testing.assert_allclose(single, torch_enc.encode_queries(TEXTS), atol=1e-5)


def test_a_student_shares_its_teachers_table_under_onnx(tiny_model: Path, tiny_student: Path) -> None:
    """The table stays in torch, outside the graph: teacher and student keep one copy."""
    both = Encoder.from_specs(str(tiny_model), str(tiny_student), runtime="onnx", query_quantize="none")
    plain = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none")
    np.testing.assert_allclose(both.encode_queries(TEXTS), plain.encode_queries(TEXTS), atol=1e-5)
    np.testing.assert_allclose(both.encode_documents(TEXTS), plain.encode_documents(TEXTS), atol=1e-5)
    assert both.query.model.get_input_embeddings().weight.data_ptr() == \
        both.document.model.get_input_embeddings().weight.data_ptr()


def test_the_teacher_reranker_in_int8_runs_its_int8_graph(tiny_model: Path, tiny_student: Path,
                                                          fresh_machine: Path) -> None:
    """``teacher:int8`` under ONNX Runtime: the teacher's int8 graph (the documents' recipe, as
    its own int8 queries take), beside the student, on the student's table."""
    enc = Encoder.from_specs(str(tiny_model), str(tiny_student), runtime="onnx", query_quantize="none")
    enc.encode_queries(TEXTS)
    teacher = enc.teacher_queries("int8")
    assert teacher.onnx is not None and teacher.quantize == "int8" and teacher is not enc.document
    int8 = teacher.encode(TEXTS, enc.query_prefix, enc.query_max_length)
    fp32 = enc.document.encode(TEXTS, enc.query_prefix, enc.query_max_length)
    assert not np.allclose(int8, fp32, atol=1e-6) and (int8 * fp32).sum(1).min() > 0.95
    assert teacher.model.get_input_embeddings().weight.data_ptr() == \
        enc.query.model.get_input_embeddings().weight.data_ptr()
    assert any("int8" in g.name for g in _graphs(fresh_machine))


def test_a_failed_export_leaves_nothing_in_the_cache(tiny_model: Path, fresh_machine: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unsupported operator")

    monkeypatch.setattr("torch.onnx.export", broken)
    with pytest.raises(ModelError, match="cannot export BertModel to ONNX: unsupported operator"):
        Encoder.from_specs(str(tiny_model), runtime="onnx").encode_documents(TEXTS)
    assert list((fresh_machine / "onnx").iterdir()) == []


def test_missing_onnxruntime_names_the_extra(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'vecplug\[onnx\]'"):
        Encoder.from_specs(str(tiny_model), runtime="onnx").encode_documents(TEXTS)


def test_unknown_runtime_is_refused(tiny_model: Path) -> None:
    from vecplug.config import load_settings

    with pytest.raises(ConfigError, match="model.runtime must be one of torch, onnx"):
        load_settings(environ={"VECPLUG_MODEL_RUNTIME": "tensorrt"})
    assert load_settings(environ={"VECPLUG_MODEL_RUNTIME": "onnx"}).model.runtime == "onnx"
    with pytest.raises(ConfigError, match="unknown runtime 'tvm'"):
        Encoder.from_specs(str(tiny_model), runtime="tvm").encode_documents(TEXTS)


def test_cli_indexes_and_searches_with_onnx(tiny_model: Path, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from vecplug.cli import cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("water boils at one hundred degrees\n", encoding="utf-8")
    (corpus / "b.txt").write_text("der schnelle braune fuchs springt über den faulen hund\n", encoding="utf-8")
    runner = CliRunner()
    common = ["--index", str(tmp_path / "idx"), "--model", str(tiny_model), "--runtime", "onnx"]
    result = runner.invoke(cli, ["index", str(corpus), "-q", "--lang", "en", *common])
    assert result.exit_code == 0, result.output
    manifest = json.loads(runner.invoke(cli, ["info", "--json", *common[:2]]).output)["manifest"]
    assert manifest["runtime"] == "onnx"
    result = runner.invoke(cli, ["search", "wasser kocht", "--json", "--lang", "de", *common])
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)["hits"]
    assert len(hits) == 2
    # the same index searched by torch gives the same ranking and scores
    torch_run = runner.invoke(cli, ["search", "wasser kocht", "--json", "--lang", "de",
                                    *common[:-1], "torch"])
    assert torch_run.exit_code == 0, torch_run.output
    torch_hits = json.loads(torch_run.output)["hits"]
    assert [h["id"] for h in hits] == [h["id"] for h in torch_hits]
    assert np.allclose([h["score"] for h in hits], [h["score"] for h in torch_hits], atol=1e-4)


@pytest.mark.slow
def test_shipped_student_under_onnx_runtime(built_me5: Path) -> None:
    """The real student: ORT fp32 gives torch's vectors; ORT int8 stays close and ranks alike.
    (Its XQuAD-R quality, 99% of fp32's mAP@20, is measured by benchmarks/eval_onnx.sh.)"""
    from vecplug.indexer.models import DEFAULT_STUDENTS

    from test_me5 import SENTENCES

    name = DEFAULT_STUDENTS["me5-small"]
    reference = Encoder.from_specs("me5-small", name, query_quantize="none")
    fp32 = Encoder.from_specs("me5-small", name, query_quantize="none", runtime="onnx")
    int8 = Encoder.from_specs("me5-small", name, query_quantize="int8", runtime="onnx")
    ref = reference.encode_queries(SENTENCES)
    np.testing.assert_allclose(fp32.encode_queries(SENTENCES), ref, atol=1e-4)
    q8 = int8.encode_queries(SENTENCES)
    assert float((q8 * ref).sum(1).mean()) > 0.99
    docs = reference.encode_documents(SENTENCES)
    scores, scores8 = ref @ docs.T, q8 @ docs.T
    assert np.abs(scores8 - scores).max() < 0.02
    # these sentences translate each other: where fp32's top document leads by a clear margin,
    # int8 ranks it first too (translations a few 1e-4 apart may swap)
    top2 = np.sort(scores, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.01
    assert clear.sum() >= len(SENTENCES) // 2
    assert (np.argmax(scores8, axis=1) == np.argmax(scores, axis=1))[clear].all()


def test_int8_documents_are_recorded_and_kept(tiny_model: Path, tmp_path: Path, fresh_machine: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An index of int8 documents says so (and by which recipe); later runs use it, and refuse
    to mix in fp32 ones or another recipe's."""
    import json

    from vecplug.indexer import onnx_runtime

    from click.testing import CliRunner

    from vecplug.cli import cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("water boils at one hundred degrees\n", encoding="utf-8")
    runner = CliRunner()
    common = ["--index", str(tmp_path / "idx"), "--model", str(tiny_model)]
    result = runner.invoke(cli, ["index", str(corpus), "-q", "--int8-documents", "--runtime", "onnx", *common])
    assert result.exit_code == 0, result.output
    manifest = json.loads(runner.invoke(cli, ["info", "--json", *common[:2]]).output)["manifest"]
    assert manifest["document_quantize"] == "int8" and manifest["runtime"] == "onnx"
    assert manifest["document_int8_version"] == onnx_runtime.DOCUMENT_INT8_VERSION
    assert "runtime:    onnx, document weights int8" in runner.invoke(cli, ["info", *common[:2]]).output
    verified = runner.invoke(cli, ["verify", *common])  # re-encoded in other batches: still sound
    assert verified.exit_code == 0 and "(int8): lowest cosine" in verified.output, verified.output
    # no flags: the index's runtime and quantisation
    (corpus / "b.txt").write_text("wasser kocht bei hundert grad\n", encoding="utf-8")
    result = runner.invoke(cli, ["index", str(corpus), "-q", *common])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["search", "wasser", "--json", *common])
    assert result.exit_code == 0 and len(json.loads(result.output)["hits"]) == 2
    # an older vecplug, which does not know this recipe version: searching goes on, adding is
    # refused, with both named
    version = onnx_runtime.DOCUMENT_INT8_VERSION
    known = {v: r for v, r in onnx_runtime.DOCUMENT_INT8_RECIPES.items() if v < version}
    with monkeypatch.context() as older:
        older.setattr(onnx_runtime, "DOCUMENT_INT8_RECIPES", known)
        assert runner.invoke(cli, ["search", "wasser", *common]).exit_code == 0
        (corpus / "b2.txt").write_text("the fox jumps\n", encoding="utf-8")
        result = runner.invoke(cli, ["index", str(corpus), "-q", *common])
        assert result.exit_code != 0 and "int8 recipe mismatch" in result.output
        assert (f"version {version}, which this vecplug does not know "
                f"(it knows {', '.join(map(str, known))})") in result.output
        (corpus / "b2.txt").unlink()
    # an index of the previous version's int8 documents keeps taking new documents, encoded
    # by that version's recipe (its own cached graph), so that its vectors never mix two
    old = ["--index", str(tmp_path / "old"), "--model", str(tiny_model)]
    with monkeypatch.context() as earlier:
        earlier.setattr(onnx_runtime, "DOCUMENT_INT8_VERSION", version - 1)
        result = runner.invoke(cli, ["index", str(corpus), "-q", "--int8-documents", "--runtime", "onnx", *old])
        assert result.exit_code == 0, result.output
    recipe = onnx_runtime.DOCUMENT_INT8_RECIPES[version - 1]
    assert [p for p in (fresh_machine / "onnx").glob(f"*-{recipe}-*.onnx")]
    (corpus / "b3.txt").write_text("el zorro salta\n", encoding="utf-8")
    built = set((fresh_machine / "onnx").glob("*.onnx"))
    result = runner.invoke(cli, ["index", str(corpus), "-q", *old])
    assert result.exit_code == 0, result.output
    assert set((fresh_machine / "onnx").glob("*.onnx")) == built  # no graph of another recipe
    info = json.loads(runner.invoke(cli, ["info", "--json", *old[:2]]).output)
    assert info["manifest"]["document_int8_version"] == version - 1 and info["documents"] == 3
    (corpus / "b3.txt").unlink()
    # int8 documents into an index of float32 ones: a mismatch, named
    (corpus / "c.txt").write_text("el agua hierve a cien grados\n", encoding="utf-8")
    fp32_index = ["--index", str(tmp_path / "fp32"), "--model", str(tiny_model)]
    assert runner.invoke(cli, ["index", str(corpus), "-q", *fp32_index]).exit_code == 0
    (corpus / "d.txt").write_text("der fuchs springt\n", encoding="utf-8")
    result = runner.invoke(cli, ["index", str(corpus), "-q", "--int8-documents", "--runtime", "onnx",
                                 *fp32_index])
    assert result.exit_code != 0 and ("document quantisation mismatch: the index was built with float32, "
                                      "but this run uses 'int8'") in result.output
    # torch runs the same recipe's version (indexer.torch_int8_documents): documents added to
    # the ONNX Runtime index with torch join it
    (corpus / "e.txt").write_text("der hund bellt\n", encoding="utf-8")
    result = runner.invoke(cli, ["index", str(corpus), "-q", *common, "--runtime", "torch"])
    assert result.exit_code == 0, result.output
    info = json.loads(runner.invoke(cli, ["info", "--json", *common[:2]]).output)
    assert info["documents"] == 5 and info["manifest"]["document_int8_version"] == onnx_runtime.DOCUMENT_INT8_VERSION
    assert runner.invoke(cli, ["search", "hund", *common, "--runtime", "torch"]).exit_code == 0


def test_load_encoder_takes_the_runtime(tiny_model: Path) -> None:
    import vecplug

    encoder = vecplug.load_encoder(str(tiny_model), str(tiny_model), runtime="onnx")
    assert encoder.describe()["runtime"] == "onnx"
    np.testing.assert_allclose(encoder.encode_queries(TEXTS),
                               Encoder.from_specs(str(tiny_model)).encode_queries(TEXTS), atol=1e-5)


def _copy_model(src: Path, folder: Path, **config: Any) -> Path:
    """``src``'s files (the same weights, so the same checksum) with ``config`` entries changed."""
    import json
    import shutil

    shutil.copytree(src, folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


def test_a_graph_is_cached_per_config_not_only_per_weights(tiny_model: Path, tmp_path: Path,
                                                           fresh_machine: Path) -> None:
    """The same weights under another config (activation, heads) are another function: each
    model gets its own graph, and its own vectors, not the first one's cached graph."""
    from vecplug.indexer.models import resolve_model

    other = _copy_model(tiny_model, tmp_path / "tiny-relu", hidden_act="relu", num_attention_heads=4)
    assert resolve_model(str(other)).checksum == resolve_model(str(tiny_model)).checksum
    for folder in (tiny_model, other):
        expected = Encoder.from_specs(str(folder)).encode_documents(TEXTS)
        got = Encoder.from_specs(str(folder), runtime="onnx").encode_documents(TEXTS)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert len(_graphs(fresh_machine)) == 2
    # the key holds what shapes the graph, not where the folder is or which library wrote it
    again = _copy_model(tiny_model, tmp_path / "tiny-copy", transformers_version="0.0.1")
    Encoder.from_specs(str(again), runtime="onnx").encode_documents(TEXTS)
    assert len(_graphs(fresh_machine)) == 2


def test_a_smoothed_int8_graph_is_cached_per_calibration_prefixes(tiny_model: Path, tmp_path: Path,
                                                                  fresh_machine: Path) -> None:
    """A folder named like an E5 model encodes the calibration texts with E5's prefixes: its
    smoothed int8 graph is calibrated on other inputs, so it is another cache entry; the float
    graph does not depend on them and is shared."""
    e5 = _copy_model(tiny_model, tmp_path / "tiny-e5")
    for folder in (tiny_model, e5):
        Encoder.from_specs(str(folder), runtime="onnx", document_quantize="int8").encode_documents(TEXTS)
        Encoder.from_specs(str(folder), runtime="onnx").encode_documents(TEXTS)
    names = [p.name for p in _graphs(fresh_machine)]
    assert sum("-int8-" in n for n in names) == 2 and sum("-fp32-" in n for n in names) == 1


def test_a_smoothed_int8_graph_is_cached_per_tokenizer(tiny_model: Path, tmp_path: Path,
                                                       fresh_machine: Path) -> None:
    """The same weights and config with another tokenizer (here: one that keeps case) see other
    token ids for the calibration texts: another smoothed int8 graph, the same float one."""
    import json

    cased = _copy_model(tiny_model, tmp_path / "tiny-cased")
    tok = json.loads((cased / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "NFKC"}
    (cased / "tokenizer.json").write_text(json.dumps(tok))
    for folder in (tiny_model, cased):
        Encoder.from_specs(str(folder), runtime="onnx", document_quantize="int8").encode_documents(TEXTS)
        Encoder.from_specs(str(folder), runtime="onnx").encode_documents(TEXTS)
    names = [p.name for p in _graphs(fresh_machine)]
    assert sum("-int8-" in n for n in names) == 2 and sum("-fp32-" in n for n in names) == 1


@pytest.mark.parametrize("damage", [b"", b"\x08garbage, not a graph"])
def test_a_damaged_cached_graph_is_built_again(tiny_model: Path, fresh_machine: Path, damage: bytes,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty or garbage file under the cache's name (a crash before the rename was durable)
    is replaced by a new export, not an ORT error on every run."""
    expected = Encoder.from_specs(str(tiny_model)).encode_documents(TEXTS)
    Encoder.from_specs(str(tiny_model), runtime="onnx").encode_documents(TEXTS)
    (path,) = _graphs(fresh_machine)
    path.write_bytes(damage)
    again = Encoder.from_specs(str(tiny_model), runtime="onnx")
    np.testing.assert_allclose(again.encode_documents(TEXTS), expected, atol=1e-5)
    assert _graphs(fresh_machine) == [path] and path.stat().st_size > 1000

    # rebuilt once: a build that gives a graph ORT cannot open either is an error, named
    def still_broken(model: Any, target: Path, *args: object) -> Path:
        target.write_bytes(damage)
        return target

    path.write_bytes(damage)
    monkeypatch.setattr(onnx_runtime, "build_graph", still_broken)
    with pytest.raises(ModelError, match="cannot load the ONNX graph built for BertModel"):
        Encoder.from_specs(str(tiny_model), runtime="onnx").encode_documents(TEXTS)


def test_a_built_graph_is_durable_before_it_takes_the_cache_name(tiny_model: Path, fresh_machine: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph's bytes are fsynced before the rename, and the folder after it: a crash leaves
    the complete file or none, never an empty one under the final name."""
    synced: list[tuple[Path, bool]] = []
    real = onnx_runtime.fsync_path
    cache = fresh_machine / "onnx"

    def record(path: Path) -> None:
        synced.append((Path(path), any(cache.glob("*.onnx"))))
        real(path)

    monkeypatch.setattr(onnx_runtime, "fsync_path", record)
    Encoder.from_specs(str(tiny_model), runtime="onnx").encode_documents(TEXTS)
    (graph,) = _graphs(fresh_machine)
    (built, renamed_yet), (folder, renamed) = synced
    assert built.parent.name.startswith(".export-") and built.suffix == ".onnx" and not renamed_yet
    assert folder == cache and renamed


def test_a_killed_exports_folder_is_removed(tmp_path: Path) -> None:
    """An export killed mid-way (they peak at 1.3-1.8 GB: where OOM kills happen) left its
    folder of partial graphs in the cache for good; a live process's export is left alone."""
    import os
    import subprocess
    import time

    from vecplug.indexer.onnx_runtime import remove_dead_exports

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, alive = tmp_path / f".export-{gone.pid}-abc", tmp_path / f".export-{os.getppid()}-def"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "fused.onnx").write_bytes(b"partial")
    # named before exports carried their process: a day-old one is a killed export's, a
    # fresh one may be a live export of an older vecplug
    old_style, fresh_old_style = tmp_path / ".export-x1y2z3_q", tmp_path / ".export-a1b2c3d4"
    for folder in (old_style, fresh_old_style):
        folder.mkdir()
        (folder / "fused.onnx").write_bytes(b"partial")
    day_ago = time.time() - 2 * 24 * 3600
    os.utime(old_style, (day_ago, day_ago))
    remove_dead_exports(tmp_path)
    assert not dead.exists() and alive.exists()
    assert not old_style.exists() and fresh_old_style.exists()
