"""Shared plain data types. Imports nothing of ours, so every layer can use it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
