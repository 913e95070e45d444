"""The header every report carries: its command names the settings that change a measurement."""
from __future__ import annotations

import sys

import pytest

from vecplug.report import command_line


def test_the_command_shows_oneDNN_s_instruction_set_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "orig_argv", ["python", "bench.py", "--label", "a b"])
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert command_line() == "python bench.py --label 'a b'"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    assert command_line() == "ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI python bench.py --label 'a b'"
