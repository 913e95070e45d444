"""benchmarks/model_memory.py: each setting in its own process, its memory split and reported."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest



#: the script under test, imported by conftest's ``bench`` fixture
BENCHMARK = "model_memory"


@pytest.mark.slow  # ten Python processes that import torch
def test_every_setting_runs_in_its_own_process(bench: ModuleType, tiny_model: Path, tiny_student: Path,
                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    student = tiny_student
    out = tmp_path / "memory.json"
    assert bench.main(["--model", str(tiny_model), "--student", str(student), "--runtimes", "torch", "onnx",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    # the baseline once; three model settings under torch, and under onnx each cached and at first use
    assert [(r["setting"], r["runtime"], r["first_use"]) for r in rows] == [
        ("baseline", "torch", False), ("tokenizer", "torch", False), ("teacher", "torch", False), ("student", "torch", False),
        ("student + teacher", "torch", False),
        ("teacher", "onnx", True), ("teacher", "onnx", False), ("student", "onnx", True),
        ("student", "onnx", False), ("student + teacher", "onnx", True), ("student + teacher", "onnx", False)]
    for r in rows:
        assert r["peak_mib"] >= r["rss_mib"] - 1 > 0
        assert r["anon_mib"] + r["file_mib"] <= r["rss_mib"] + 1  # the split adds up (plus shmem)
    # a fresh process each: loading a model costs more than the bare imports
    assert rows[2]["rss_mib"] > rows[0]["rss_mib"]
    report = capsys.readouterr().out
    assert "| student + teacher |" in report and "first use (exports them)" in report
