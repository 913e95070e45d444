"""model.precision: bfloat16 where the CPU has AMX, float32 elsewhere, never bound to an index."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vecplug.errors import ConfigError
from vecplug.indexer import precision
from vecplug.indexer.precision import _cpu_flag, amx_bf16, amx_int8, bf16_matmul, resolve_precision


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """The AMX answer as a test sets it (the real CPU's is whatever this machine is)."""
    state = {"amx": True}
    monkeypatch.setattr(precision, "amx_bf16", lambda: state["amx"])
    return state


def test_auto_is_bfloat16_only_with_amx_and_only_for_torch(cpu: dict[str, bool]) -> None:
    assert resolve_precision("auto") == resolve_precision(None) == "bfloat16"
    assert resolve_precision("auto", "onnx") == "float32"
    assert resolve_precision("bfloat16", "onnx") == "float32"  # ONNX Runtime runs its own graphs
    cpu["amx"] = False
    assert resolve_precision("auto") == "float32"
    assert resolve_precision("bfloat16") == "bfloat16"  # asked for by name: given, if slower
    assert resolve_precision("float32") == "float32"
    with pytest.raises(ConfigError, match="unknown precision 'fp16'"):
        resolve_precision("fp16")


def test_onednn_limited_below_amx_means_no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert amx_bf16() is False and amx_int8() is False
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # and no bfloat16 products at all
    assert bf16_matmul() is False


def test_amx_is_read_from_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The flag line decides (a fake /proc/cpuinfo; x86 assumed); bfloat16 products are native
    with AMX or AVX-512 BF16."""
    import builtins

    real_open = builtins.open
    answers = {}
    for flags in ("fpu avx2 fma", "fpu avx512f avx512_bf16", "fpu avx512f amx_bf16 amx_tile",
                  "fpu amx_bf16 amx_tile amx_int8"):
        fake = tmp_path / "cpuinfo"
        fake.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(
            fake if path == "/proc/cpuinfo" else path, *a, **k))
        monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        _cpu_flag.cache_clear()
        answers[flags] = (amx_bf16(), amx_int8(), bf16_matmul())
    _cpu_flag.cache_clear()
    assert list(answers.values()) == [(False, False, False), (False, False, True), (True, False, True),
                                      (True, True, True)]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


TEXTS = ["the quick brown fox", "wasser kocht bei hundert grad", "水在一百度沸腾",
         "el agua hierve a cien grados y el rápido zorro marrón salta sobre el perro perezoso"]


def test_bfloat16_vectors_are_float32_and_close_and_the_table_stays_float32(tiny_model: Path) -> None:
    import torch

    from vecplug.indexer.encoder import Encoder

    fp32 = Encoder.from_specs(str(tiny_model), precision="float32")
    bf16 = Encoder.from_specs(str(tiny_model), precision="bfloat16")
    a, b = fp32.encode_documents(TEXTS), bf16.encode_documents(TEXTS)
    assert b.dtype == np.float32 and np.allclose(np.linalg.norm(b, axis=1), 1, atol=1e-5)
    assert _cosines(a, b).min() > 0.999
    assert not np.array_equal(a, b)  # it did compute in bfloat16
    model = bf16.document.model
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert {p.dtype for n, p in model.named_parameters() if "word_embeddings" not in n} == {torch.bfloat16}
    assert bf16.describe()["precision"] == "bfloat16"
    assert fp32.describe()["precision"] == "float32"


def test_a_student_and_its_teacher_share_one_float32_table_in_bfloat16(tiny_model: Path,
                                                                        tiny_student: Path) -> None:
    import torch

    from vecplug.indexer.encoder import Encoder

    enc = Encoder.from_specs(str(tiny_model), str(tiny_student), precision="bfloat16", query_quantize="none")
    enc.encode_documents(TEXTS)
    queries = enc.encode_queries(TEXTS)
    doc_table = enc.document.model.get_input_embeddings().weight
    query_table = enc.query.model.get_input_embeddings().weight
    assert doc_table.dtype == torch.float32 and doc_table.data_ptr() == query_table.data_ptr()
    reference = Encoder.from_specs(str(tiny_model), str(tiny_student), precision="float32",
                                   query_quantize="none").encode_queries(TEXTS)
    assert _cosines(queries, reference).min() > 0.999


def test_int8_queries_keep_their_float_parts_in_float32(tiny_model: Path, tiny_student: Path) -> None:
    from vecplug.indexer.encoder import Encoder

    enc = Encoder.from_specs(str(tiny_model), str(tiny_student), precision="bfloat16", query_quantize="int8")
    assert enc.query.precision == "float32" and enc.document.precision == "bfloat16"
    assert enc.encode_queries(TEXTS).dtype == np.float32


def test_a_bfloat16_model_traces_to_its_own_vectors(tiny_model: Path) -> None:
    from vecplug.indexer.encoder import Encoder

    enc = Encoder.from_specs(str(tiny_model), precision="bfloat16")
    eager = [enc.encode_queries([t]) for t in TEXTS[:3]]  # the third small pass traces
    assert enc.query.graph is not None
    traced = enc.encode_queries(TEXTS[:3])
    assert np.abs(np.concatenate(eager) - traced).max() < 1e-5


def test_setting_env_and_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vecplug.config import load_settings

    assert load_settings(environ={}).model.precision == "auto"
    assert load_settings(environ={"VECPLUG_MODEL_PRECISION": "float32"}).model.precision == "float32"
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  precision: bfloat16\n")
    assert load_settings(config, environ={}).model.precision == "bfloat16"
    assert load_settings(config, {"model": {"precision": "float32"}}, environ={}).model.precision == "float32"
    with pytest.raises(ConfigError, match="model.precision must be one of auto, float32, bfloat16, not 'half'"):
        load_settings(environ={"VECPLUG_MODEL_PRECISION": "half"})


def test_an_index_takes_documents_of_either_precision(tiny_model: Path, tmp_path: Path) -> None:
    """Built in bfloat16 (recorded, for information), appended to and searched in float32."""
    from click.testing import CliRunner

    from vecplug.cli import cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n", encoding="utf-8")
    index = tmp_path / "idx"
    common = ["--index", str(index), "--model", str(tiny_model), "--query-encoder", str(tiny_model)]
    runner = CliRunner()
    result = runner.invoke(cli, ["index", str(corpus), *common, "--precision", "bfloat16", "--quiet"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((index / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["precision"] == "bfloat16"
    (corpus / "b.txt").write_text("wasser kocht bei hundert grad\n", encoding="utf-8")
    result = runner.invoke(cli, ["index", str(corpus), *common, "--precision", "float32", "--quiet"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["search", "water boils", *common, "--precision", "float32", "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["hits"]) == 2
