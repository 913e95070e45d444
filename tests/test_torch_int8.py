"""Torch's int8 recipe for a student's queries: smoothing keeps the function, every linear layer
int8 on full-range activations, calibration cached, and the traced graph still applies."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vecplug.indexer import torch_int8
from vecplug.indexer.encoder import Encoder

# compared with torch's float32 vectors, whatever this CPU's ``model.precision: auto`` is
pytestmark = pytest.mark.usefixtures("float32_torch")

TEXTS = ["the quick brown fox jumps over the lazy dog", "wasser kocht bei hundert grad",
         "el agua hierve a cien grados", "быстрая коричневая лиса", "水在一百度沸腾"]


def _batches(enc: Encoder) -> list[tuple[np.ndarray, np.ndarray]]:
    q = enc.query
    return [b[1:] for b in q._batches(q.tokenize(TEXTS, enc.query_prefix, 64))]


def test_smoothing_keeps_the_function(tiny_model: Path) -> None:
    import torch

    enc = Encoder.from_specs(str(tiny_model), query_quantize="none")
    model, batches = enc.query.model, _batches(enc)
    peaks = torch_int8.activation_peaks(model, batches)
    assert set(peaks) == set(torch_int8.narrowing(model)) and len(peaks) == 2  # one per layer
    ids, mask = (torch.from_numpy(a) for a in batches[0])
    with torch.inference_mode():
        before = model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = [model.get_submodule(n).weight.clone() for n in peaks]
        torch_int8.smooth(model, peaks)
        after = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not all(torch.equal(w, model.get_submodule(n + ".linear").weight) for w, n in zip(weights, peaks))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_a_student_s_int8_queries_take_the_recipe_and_cache_its_calibration(
        tiny_model: Path, tiny_student: Path, fresh_machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    fp32 = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none")
    int8 = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="int8")
    model = int8.query.model
    assert not [m for m in model.modules() if type(m) is torch.nn.Linear]  # every layer int8
    assert len([m for m in model.modules() if hasattr(m, "dynamic")]) == len(
        [m for m in fp32.query.model.modules() if type(m) is torch.nn.Linear])
    assert len([m for m in model.modules() if hasattr(m, "inverse")]) == 1  # the student's one FFN
    a, b = fp32.encode_queries(TEXTS), int8.encode_queries(TEXTS)
    assert not np.allclose(a, b, atol=1e-6) and (a * b).sum(1).min() > 0.95
    cached = list((fresh_machine / "cache").glob("int8-peaks-*.safetensors"))
    assert len(cached) == 1 and int8.query.info.checksum in cached[0].name

    def no_calibration(*args: object) -> None:
        raise AssertionError("calibrated again")

    monkeypatch.setattr(torch_int8, "activation_peaks", no_calibration)
    again = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="int8")
    np.testing.assert_array_equal(again.encode_queries(TEXTS), b)  # the cached peaks: the same model
    # a graph traced of the recipe's modules gives their vectors
    for text in TEXTS[:3]:
        again.encode_queries([text])
    assert again.query.graph is not None
    np.testing.assert_allclose(again.encode_queries(TEXTS), b, atol=1e-6)


def test_a_stale_or_broken_calibration_cache_is_made_again(tiny_model: Path, tiny_student: Path,
                                                           fresh_machine: Path) -> None:
    Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="int8").query
    (path,) = (fresh_machine / "cache").glob("int8-peaks-*.safetensors")
    good = torch_int8.load_peaks(path)
    assert good is not None
    from safetensors.numpy import save

    stale = save(good, metadata={"format": torch_int8.PEAKS_FORMAT,  # another version's peaks
                                 "version": str(torch_int8.PEAKS_VERSION + 1)})
    for content in (b"not a safetensors file", stale):
        path.write_bytes(content)
        assert torch_int8.load_peaks(path) is None
        Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="int8").query
        again = torch_int8.load_peaks(path)
        assert again is not None and all(np.array_equal(again[k], good[k]) for k in good)


def test_a_document_encoder_s_own_int8_queries_take_the_teacher_recipe(tiny_model: Path, fresh_machine: Path) -> None:
    """A document encoder's own queries (under torch): the students' recipe but for the first
    layer's FFN down-projection, which stays float32 (smoothed, so the same function); on
    FBGEMM's kernels in float32 whatever the machine; the query recipe's cached peaks."""
    import torch

    enc = Encoder.from_specs(str(tiny_model), query_quantize="int8", precision="bfloat16")
    model = enc.query.model
    down = torch_int8.narrowing(Encoder.from_specs(str(tiny_model), query_quantize="none").query.model)
    floats = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    assert floats == [down[0] + ".linear"] and model.get_submodule(down[0] + ".linear").weight.dtype == torch.float32
    assert hasattr(model.get_submodule(down[0]), "inverse")  # smoothed as the others are
    assert len([m for m in model.modules() if hasattr(m, "dynamic")]) == 6 * model.config.num_hidden_layers - 1
    cache = fresh_machine / "cache"
    assert list(cache.glob("int8-peaks-*")) and not list(cache.glob("int8-documents-peaks-*"))
    fp32 = Encoder.from_specs(str(tiny_model), query_quantize="none", precision="float32")
    assert (enc.encode_queries(TEXTS) * fp32.encode_queries(TEXTS)).sum(1).min() > 0.98
    # int8_query keeps the layers it is told to in float32, by number
    again = torch_int8.int8_query(Encoder.from_specs(str(tiny_model), query_quantize="none").query.model,
                                  torch_int8.load_peaks(next(cache.glob("int8-peaks-*"))), float_layers=(1,))
    assert [name for name, m in again.named_modules() if type(m) is torch.nn.Linear] == [down[1] + ".linear"]


def test_the_documents_recipe_on_a_document_encoder_s_queries(tiny_model: Path, fresh_machine: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``TEACHER_QUERY_RECIPE = "int8"`` (``benchmarks/teacher_query_recipe.py``: what a
    document encoder's own queries took until 2026-11-29): the documents' recipe, as under ONNX
    Runtime: down-projections float32, Q, K, V one smoothed int8 product, on FBGEMM's kernels
    (single queries) in float32, whatever the machine."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from vecplug.indexer import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "TEACHER_QUERY_RECIPE", "int8")
    enc = Encoder.from_specs(str(tiny_model), query_quantize="int8", precision="bfloat16")
    model = enc.query.model
    floats = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert floats and all(m.in_features > m.out_features and m.weight.dtype == torch.float32 for m in floats)
    assert len([m for m in model.modules() if hasattr(m, "shared")]) == 3 * model.config.num_hidden_layers
    assert any(isinstance(m, DynamicLinear) for m in model.modules())  # FBGEMM's layer, not oneDNN's
    assert not [m for m in model.modules() if type(m).__name__ == "OneDnnInt8"]
    cache = fresh_machine / "cache"
    assert list(cache.glob("int8-documents-peaks-*")) and not list(cache.glob("int8-peaks-*"))
    fp32 = Encoder.from_specs(str(tiny_model), query_quantize="none", precision="float32")
    assert (enc.encode_queries(TEXTS) * fp32.encode_queries(TEXTS)).sum(1).min() > 0.98


def test_a_model_folder_s_own_peaks_come_first(tiny_model: Path, tiny_student: Path, fresh_machine: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped student carries its peaks: no calibration, nothing written to the cache."""
    reference = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none")
    torch_int8.save_peaks(tiny_student / torch_int8.PEAKS_FILE, reference.query.calibration_peaks())

    def no_calibration(*args: object) -> None:
        raise AssertionError("calibrated")

    monkeypatch.setattr(torch_int8, "activation_peaks", no_calibration)
    int8 = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="int8")
    assert (int8.encode_queries(TEXTS) * reference.encode_queries(TEXTS)).sum(1).min() > 0.95
    assert not (fresh_machine / "cache").exists() or not list((fresh_machine / "cache").glob("int8-peaks-*"))


@pytest.mark.slow
def test_the_shipped_student_s_peaks_are_its_calibration(built_me5: Path) -> None:
    """vecplug/students/*/int8-peaks.safetensors is what the code computes for that student now
    (benchmarks/ship_student.py --peaks-only rewrites it)."""
    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import DEFAULT_STUDENTS, resolve_model

    info = resolve_model(DEFAULT_STUDENTS["me5-small"])
    shipped = torch_int8.load_peaks(info.path / torch_int8.PEAKS_FILE)
    assert shipped is not None, "the shipped student has no int8 peaks"
    fresh = TextEncoder(info).calibration_peaks()
    assert sorted(shipped) == sorted(fresh)
    assert all(np.allclose(shipped[k], fresh[k], rtol=1e-5, atol=1e-6) for k in fresh)


def test_the_ffn_down_projections_are_found_below_the_hidden_size_too(tiny_model: Path, tmp_path: Path) -> None:
    """A student pruned below the hidden size (``--ffn-width 16`` of 32) has its up-projections
    narrowing the width: picked by width alone, the int8 recipes smoothed and kept in float the
    wrong layers. Both runtimes find the down-projections (``output.dense``) by the hidden size."""
    import onnx
    import torch

    from vecplug.indexer import onnx_runtime
    from vecplug.indexer.student import prune_ffn

    enc = Encoder.from_specs(str(tiny_model), query_quantize="none")
    model = enc.query.model
    wide = torch_int8.narrowing(model)
    prune_ffn(model, 16, [{"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
                          for ids, mask in _batches(enc)])
    assert model.config.intermediate_size == 16
    assert torch_int8.narrowing(model) == wide == [f"encoder.layer.{i}.output.dense" for i in range(2)]

    path = tmp_path / "narrow.onnx"
    onnx_runtime.export_fused(model, path)
    graph = onnx.load(str(path)).graph
    dims = {i.name: tuple(i.dims) for i in graph.initializer}
    assert [dims[n.input[1]] for n in onnx_runtime._narrowing(graph)] == [(16, 32), (16, 32)]
