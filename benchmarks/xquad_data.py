"""XQuAD-R (LAReQA) loader shared by the benchmarks: re-exported from the package.

The loader lives in :mod:`vecplug.indexer.datasets` (``vecplug eval`` uses it too); it takes a
path. This module keeps the benchmarks' default, ``../shared/data/xquad-r`` next to the
repository, and the names the benchmarks import.

Evaluation data only: nothing here (or anywhere in ``benchmarks/``) trains on it.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vecplug.indexer import datasets as _datasets
from vecplug.indexer.datasets import (  # noqa: F401  (re-exported for the benchmarks)
    LanguageData, Question, Sentence, XQuADR, answer_sentence, doc_id, load_language)

#: ``../shared/data/xquad-r`` next to the repository, wherever the command is run from.
DEFAULT_DATA_DIR: Path = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "xquad-r").resolve()


def available_langs(data_dir: Path = DEFAULT_DATA_DIR) -> list[str]:
    """Languages with a ``<lang>.json`` file in ``data_dir``, sorted."""
    return _datasets.available_langs(data_dir)


def parse_langs(values: Sequence[str] | None, data_dir: Path = DEFAULT_DATA_DIR) -> list[str]:
    """``--langs ar de`` or ``--langs ar,de``; default every language in ``data_dir``."""
    return _datasets.parse_langs(values, data_dir)


def load_xquad_r(data_dir: Path = DEFAULT_DATA_DIR, langs: Sequence[str] | None = None) -> XQuADR:
    """Load ``langs`` (default: all files in ``data_dir``) and check that they are parallel."""
    return _datasets.load_xquad_r(data_dir, langs)
