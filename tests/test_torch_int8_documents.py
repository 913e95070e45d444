"""torch's int8 documents (indexer.torch_int8_documents): the recipe's parts, the encoder, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vecplug.indexer import torch_int8_documents as tid
from vecplug.indexer.encoder import Encoder

TEXTS = ["water boils at one hundred degrees", "el agua hierve a cien grados",
         "der fuchs springt über den zaun", "the fox jumps over the fence",
         "вода кипит при ста градусах", "a quiet evening by the lake"]


def _linears(seed: int = 0, n: int = 3, width: int = 16) -> list:
    import torch

    torch.manual_seed(seed)
    return [torch.nn.Linear(width, width) for _ in range(n)]


def test_the_attention_s_q_k_and_v_are_found_as_the_layers_reading_one_tensor(tiny_model: Path) -> None:
    enc = Encoder.from_specs(str(tiny_model))
    te = enc.document
    ids, mask = next(te._batches(te.tokenize(TEXTS[:2], "", 32)))[1:]
    groups = tid.shared_inputs(te.model, ids, mask)
    assert len(groups) == te.model.config.num_hidden_layers
    for group in groups:
        assert [name.rsplit(".", 1)[1] for name in group] == ["query", "key", "value"]


def test_a_group_s_one_product_gives_each_layer_its_own_output() -> None:
    """One product over the concatenated weights, handed out by input identity; another
    tensor between two members of a group (another thread's batch) is computed afresh."""
    import torch

    linears = _linears()
    shared = tid._Shared(tid._concatenated(linears), [16, 16, 16])
    members = [tid._member(shared, i) for i in range(3)]
    x, y = torch.randn(4, 5, 16), torch.randn(2, 3, 16)
    with torch.inference_mode():
        first = members[0](x)
        other = members[0](y)  # another input before x's group is done
        rest = [members[1](x), members[2](x)]
        for got, want in zip([first, *rest], [m(x) for m in linears]):
            torch.testing.assert_close(got, want)
        torch.testing.assert_close(other, linears[0](y))
        assert shared.last is None  # the last layer took its part: nothing held between passes
        torch.testing.assert_close(members[2](y), linears[2](y))
        assert shared.last is None


def test_one_int8_product_equals_three_int8_layers() -> None:
    """Per output channel weights and one activation scale per tensor: the fused Q, K, V
    product is the three layers' int8 products, not an approximation of them."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from vecplug.indexer.torch_int8 import _full_range

    linears = _linears(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        separate = [_full_range(quantize_dynamic(torch.nn.Sequential(m), {"0": per_channel_dynamic_qconfig},
                                                 dtype=torch.qint8)[0]) for m in linears]
        fused = _full_range(quantize_dynamic(torch.nn.Sequential(tid._concatenated(linears)),
                                             {"0": per_channel_dynamic_qconfig}, dtype=torch.qint8)[0])
    x = torch.randn(3, 7, 16)
    with torch.inference_mode():
        for got, want in zip(fused(x).split([16, 16, 16], dim=-1), [m(x) for m in separate]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _onednn_or_skip() -> None:
    import torch

    if "onednn" not in torch.backends.quantized.supported_engines:
        pytest.skip("torch built without oneDNN's quantised engine")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_onednn_s_own_product_is_torch_s_dynamic_layer(dtype: str) -> None:
    """The same quantisation of the input (per tensor, 8 bits, asymmetric, holding 0) and the
    same weights: oneDNN's product gives torch's dynamic layer's output, in the input's dtype,
    for any leading shape; an all-zero input (a range of 0) gives the bias."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from vecplug.indexer.torch_int8 import _full_range
    from vecplug.indexer.torch_int8_documents import quantized_engine

    _onednn_or_skip()
    (linear,) = _linears(seed=2, n=1, width=24)
    with warnings.catch_warnings(), quantized_engine("onednn"):
        warnings.simplefilter("ignore")
        dynamic = quantize_dynamic(torch.nn.Sequential(linear), {"0": per_channel_dynamic_qconfig},
                                   dtype=torch.qint8)[0]
    torch_layer, onednn_layer = _full_range(dynamic), tid._onednn(dynamic)
    kind = getattr(torch, dtype)
    x = (torch.randn(3, 5, 24) * 4 + 1).to(kind)
    with torch.inference_mode():
        got, want = onednn_layer(x), torch_layer(x)
        assert got.dtype == kind and got.shape == (3, 5, 24)
        tolerance = 1e-4 if dtype == "float32" else 2e-2  # bfloat16: the output's rounding
        torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
        assert (got.float() - linear(x.float())).abs().max() > 0  # it is int8, not the float layer
        zeros = onednn_layer(torch.zeros(2, 24, dtype=kind))
        torch.testing.assert_close(zeros.float(), linear.bias.detach().expand(2, 24).to(kind).float(),
                                   atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("recipe", ["int8", "int8-v1"])
@pytest.mark.parametrize("engine", [None, "onednn"])
def test_the_recipe_keeps_the_vectors_and_quantises_what_it_says(tiny_model: Path, fresh_machine: Path,
                                                                  recipe: str, engine: str | None) -> None:
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from vecplug.indexer.torch_int8 import narrowing

    reference = Encoder.from_specs(str(tiny_model), precision="float32").encode_documents(TEXTS)
    te = Encoder.from_specs(str(tiny_model), precision="float32").document
    ids, mask = next(te._batches(te.tokenize(TEXTS, "", 32)))[1:]
    groups = tid.shared_inputs(te.model, ids, mask)
    down = narrowing(te.model)
    peaks = tid.group_peaks(te.model, groups, [(ids, mask)])
    if engine == "onednn":
        _onednn_or_skip()
    before = torch.backends.quantized.engine
    tid.int8_documents(te.model, recipe, groups, peaks, "float32", engine)
    assert torch.backends.quantized.engine == before  # the process-wide setting is given back
    int8 = {name for name, m in te.model.named_modules()
            if isinstance(m, DynamicLinear) or type(m).__name__ == "OneDnnInt8"}
    # oneDNN's weights run in its own product (tid._onednn), none in torch's dynamic layer
    assert any(isinstance(m, DynamicLinear) for m in te.model.modules()) == (engine is None)
    assert not any(name.startswith(d) for d in down for name in int8)  # down-projections float
    assert all(isinstance(te.model.get_submodule(d), torch.nn.Linear) for d in down)
    fused = [n for n, m in te.model.named_modules() if hasattr(m, "shared")]  # Q, K, V members
    assert (len(fused) == 3 * len(groups)) == (recipe == "int8")  # v1: Q, K, V stay float Linear
    got = te.encode(TEXTS, "", 64)
    cos = np.sum(got * reference, axis=1)
    assert cos.min() > 0.98, cos


def test_bfloat16_float_layers(tiny_model: Path, fresh_machine: Path) -> None:
    """The layers left float compute in the encoder's precision, the vectors stay float32."""
    import torch

    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.torch_int8 import narrowing

    reference = Encoder.from_specs(str(tiny_model), precision="float32").encode_documents(TEXTS)
    te = TextEncoder(resolve_model(str(tiny_model)), quantize="int8", documents=True, precision="bfloat16")
    assert te.precision == "bfloat16"
    assert all(te.model.get_submodule(d).weight.dtype == torch.bfloat16 for d in narrowing(te.model))
    got = te.encode(TEXTS, "", 64)
    assert got.dtype == np.float32 and np.sum(got * reference, axis=1).min() > 0.97


def test_the_engine_is_onednn_only_with_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from vecplug.indexer import precision

    expected = "onednn" if "onednn" in torch.backends.quantized.supported_engines else None
    monkeypatch.setattr(precision, "amx_int8", lambda: False)
    assert tid.document_engine() is None
    assert tid.document_engine(compiled=True) == expected  # the int8 product that compiles
    monkeypatch.setattr(precision, "amx_int8", lambda: True)
    assert tid.document_engine() == expected


def test_the_encoder_calibrates_once_and_records_the_recipe(tiny_model: Path, fresh_machine: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.indexer.onnx_runtime import DOCUMENT_INT8_VERSION

    enc = Encoder.from_specs(str(tiny_model), document_quantize="int8")
    assert enc.runtime == "torch"
    first = enc.encode_documents(TEXTS)
    described = enc.describe()
    assert described["document_quantize"] == "int8" and described["document_int8_version"] == DOCUMENT_INT8_VERSION
    cached = list((fresh_machine / "cache").glob(f"{tid.PEAKS_PREFIX}-*.safetensors"))
    assert len(cached) == 1

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("calibrated again")

    monkeypatch.setattr(tid, "group_peaks", refuse)
    again = Encoder.from_specs(str(tiny_model), document_quantize="int8").encode_documents(TEXTS)
    np.testing.assert_allclose(again, first, atol=1e-6)


def test_the_cli_indexes_int8_documents_with_torch(tiny_model: Path, tmp_path: Path, fresh_machine: Path) -> None:
    from click.testing import CliRunner

    from vecplug.cli import cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(TEXTS):
        (corpus / f"{i}.txt").write_text(text + "\n", encoding="utf-8")
    runner = CliRunner()
    common = ["--index", str(tmp_path / "idx"), "--model", str(tiny_model)]
    result = runner.invoke(cli, ["index", str(corpus), "-q", "--int8-documents", *common])
    assert result.exit_code == 0, result.output
    info = json.loads(runner.invoke(cli, ["info", "--json", *common[:2]]).output)
    assert info["documents"] == len(TEXTS)
    assert info["manifest"]["document_quantize"] == "int8" and info["manifest"]["runtime"] == "torch"
    verified = runner.invoke(cli, ["verify", *common])  # re-encoded in other batches: still sound
    assert verified.exit_code == 0 and "(int8): lowest cosine" in verified.output, verified.output
