"""benchmarks/query_latency.py: the linear-layer timing that explains the encode time."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest



#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "query_latency"


def test_linear_time_counts_the_models_matrix_multiplies(bench: ModuleType, tiny_model: Path) -> None:
    import torch
    from transformers import AutoModel

    from vecplug.indexer.encoder import _int8

    model = AutoModel.from_pretrained(str(tiny_model), add_pooling_layer=False)
    x = bench.linear_time(model, tokens=7, reps=3)
    # 2 layers x (query, key, value, attention output, intermediate, output); hidden 32, inner 64
    assert x["layers"] == 12 and x["tokens"] == 7
    assert x["mflop"] == pytest.approx(2 * 7 * 2 * (4 * 32 * 32 + 2 * 32 * 64) / 1e6)
    assert x["ms"] > 0 and x["gflops"] == pytest.approx(x["mflop"] / x["ms"])
    assert x["int8"] == 0
    # int8 layers (as ``--int8`` makes them: all but the 2 down-projections) are timed too
    y = bench.linear_time(_int8(model), tokens=7, reps=3)
    assert y["layers"] == 12 and y["int8"] == 10 and y["mflop"] == pytest.approx(x["mflop"])
    # a student's recipe: every layer int8 behind its full-range wrapper, each timed once
    from vecplug.indexer import torch_int8

    recipe = AutoModel.from_pretrained(str(tiny_model), add_pooling_layer=False)
    peaks = {name: np.ones(64, dtype=np.float32) for name in torch_int8.narrowing(recipe)}
    z = bench.linear_time(torch_int8.int8_query(recipe, peaks), tokens=7, reps=3)
    assert z["layers"] == 12 and z["int8"] == 12 and z["mflop"] == pytest.approx(x["mflop"])
    # a model in bfloat16 (model.precision) is fed bfloat16 inputs
    from vecplug.indexer.precision import to_bfloat16

    w = bench.linear_time(to_bfloat16(AutoModel.from_pretrained(str(tiny_model), add_pooling_layer=False)),
                          tokens=7, reps=3)
    assert w["layers"] == 12 and w["int8"] == 0 and w["mflop"] == pytest.approx(x["mflop"])
    assert bench.linear_time(torch.nn.Sequential(torch.nn.ReLU()), tokens=7) is None


def test_the_report_says_how_fast_the_machine_ran(bench: ModuleType) -> None:
    """The machine's matrix-multiply rate, measured before and after the rows, is in the
    report; results written before it was measured still render."""
    from bench_common import measure_matmul_gflops

    speed = measure_matmul_gflops(1, size=128, repeats=2)
    assert speed["best_gflops"] >= speed["median_gflops"] > 0
    result = {"documents": 3, "langs": ["en"], "debias": True, "queries": 1, "rerank_depth": 50,
              "rows": [{"query_encoder": "m", "stage": "encode", "threads": 1, "p50_ms": 1.0,
                        "p95_ms": 2.0, "mean_ms": 1.5}], "linears": {}}
    assert "this machine's speed" not in bench.render(result)
    text = bench.render({**result, "matmul_1_thread": {"before": speed, "after": {**speed, "median_gflops": 99.0}}})
    assert "matrix multiply on one thread" in text and "and 99 after" in text


def test_interleaved_calls_every_function_on_every_text_in_rotated_order(bench: ModuleType) -> None:
    calls: list[tuple[str, str]] = []
    fns = [lambda t, n=n: calls.append((n, t)) for n in "ab"]
    times = bench.interleaved(fns, ["x", "y", "z"])
    assert [len(t) for t in times] == [3, 3]
    assert calls == [("a", "x"), ("b", "x"), ("b", "y"), ("a", "y"), ("a", "z"), ("b", "z")]
    rows = [{"query_encoder": "s", "traced": True}, {"query_encoder": "s", "traced": False},
            {"query_encoder": "t@onnx", "traced": False}]
    assert "traced TorchScript graph (`indexer.traced`, made during the warm-up) for: s;" in bench._traced_line(rows)[0]
    assert bench._traced_line([{"query_encoder": "old"}]) == []  # results from before say nothing


def test_the_general_int8_recipe_is_timed_beside_a_student_s(bench: ModuleType, tiny_model: Path,
                                                            tiny_student: Path) -> None:
    from types import SimpleNamespace

    import torch

    from vecplug.indexer.encoder import Encoder

    enc = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="int8")
    general = bench._general_int8(SimpleNamespace(encoder=enc))
    assert general.graph is not None  # traced in its warm-up, as the student's own is
    text = "wasser kocht bei hundert grad"
    vector = general.encode([text], enc.query_prefix, enc.query_max_length)
    fp32 = Encoder.from_specs(str(tiny_model), str(tiny_student), query_quantize="none")
    assert float((vector * fp32.encode_queries([text])).sum()) > 0.95
    # the general recipe: the down-projection float32, the rest int8, unlike the student's own
    linears = [m for m in general.model.modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 1 and linears[0].in_features > linears[0].out_features
    assert not [m for m in enc.query.model.modules() if type(m) is torch.nn.Linear]


def test_a_gated_rerank_row_says_how_many_it_reranked(bench: ModuleType) -> None:
    """Gated rows mix two kinds of query: the share reranked and the mean are in the table."""
    result = {"documents": 3, "langs": ["en"], "debias": True, "queries": 10, "rerank_depth": 50,
              "rows": [{"query_encoder": "s", "stage": "xy + teacher rerank below margin 0.05", "threads": 1,
                        "p50_ms": 6.0, "p95_ms": 25.0, "mean_ms": 12.5, "reranked": 0.4},
                       {"query_encoder": "s", "stage": "xy, batched", "threads": 2, "queries_per_s": 300.0}],
              "linears": {}}
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in bench.render(result).splitlines()
            if line.startswith("| s ")]
    # queries/s of a one-at-a-time row: 1000 / mean
    assert rows == [["s", "xy + teacher rerank below margin 0.05 (40% reranked)", "1", "6.0", "25.0", "12.5", "80"],
                    ["s", "xy, batched", "2", "-", "-", "-", "300"]]


def test_each_reranker_given_gets_its_own_rows(bench: ModuleType) -> None:
    """``--rerankers teacher teacher:int8``: every reranked stage (ungated and per gate) is timed
    for each spec, labelled by it, and searches with that spec; the share reranked is the
    timed queries' own."""
    from types import SimpleNamespace

    calls: list[tuple[Any, Any]] = []

    def search(text: str, k: int, mode: str, rerank: Any = None, rerank_depth: Any = None,
               rerank_gate: Any = None) -> Any:
        calls.append((rerank, rerank_gate))
        return SimpleNamespace(reranked=rerank is not None and (rerank_gate is None or text == "b"))

    encoder = SimpleNamespace(query_info=SimpleNamespace(teacher=object()), query=SimpleNamespace(graph=None),
                              encode_queries=lambda texts: None)
    index = SimpleNamespace(encoder=encoder, search=search)
    rows = bench._time_stages(index, "s", 1, ["a", "b"], 50, [0.05], ["teacher", "teacher:int8"])
    assert [r["stage"] for r in rows] == [
        "encode", "xy", "mono", "xy + teacher rerank", "xy + teacher rerank below margin 0.05",
        "xy + teacher:int8 rerank", "xy + teacher:int8 rerank below margin 0.05"]
    assert {c for c in calls if c[0]} == {("teacher", None), ("teacher", 0.05),
                                         ("teacher:int8", None), ("teacher:int8", 0.05)}
    assert [r.get("reranked") for r in rows] == [None] * 4 + [0.5, None, 0.5]
    # a teacher as the query encoder is not reranked by itself
    encoder.query_info.teacher = None
    assert [r["stage"] for r in bench._time_stages(index, "t", 1, ["a"], 50, [0.05], ["teacher"])] == \
        ["encode", "xy", "mono"]
