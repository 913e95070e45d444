"""Shared plain data types. Imports nothing of ours, so every layer can use it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: hnswlib graph defaults, shared by the store and the configuration. ef_search was chosen by
#: benchmarks/ann_scale.py (README "Speed"): at 100k clustered 384-d vectors, ef 128 finds 98%
#: of the true top 10 (ef 64: 95%) for ~0.4 ms more, next to 15-40 ms of query encoding
HNSW_DEFAULTS: dict[str, int] = {"M": 16, "ef_construction": 200, "ef_search": 128}


def lang_code(code: str | None) -> str | None:
    """A language code as the language detector writes it: ``" pt-BR"`` -> ``"pt"``,
    ``"ru_RU"`` -> ``"ru"``, blank -> None. Documents are tagged and filtered by these codes,
    so a region or script subtag, a capital or a space would match nothing."""
    if code is None:
        return None
    primary = str(code).strip().replace("_", "-").split("-")[0].lower()
    return primary or None


@dataclass(frozen=True)
class Document:
    """One unit of retrieval: a passage of a file or a record of a JSONL/CSV file.

    ``id`` is stable across runs (source path + position), ``text`` is what gets embedded
    (all fields appended), ``payload`` keeps the original fields for display and filtering.
    """

    id: str
    text: str
    source: str
    position: int = 0
    lang: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """One search result."""

    id: str
    score: float
    text: str
    lang: str | None
    source: str
    payload: dict[str, Any]
    rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "id": self.id,
            "score": self.score,
            "lang": self.lang,
            "source": self.source,
            "text": self.text,
            "payload": self.payload,
        }


@dataclass(frozen=True)
class Problem:
    """A piece of input that was skipped, with where it was and why."""

    path: str
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.reason}"
