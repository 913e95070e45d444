"""vecplug: multilingual semantic search on a laptop, growing onto a cluster.

The public API is loaded lazily so that ``import vecplug`` (and ``vecplug --help``) stay
fast: torch, transformers, hnswlib and qdrant are imported only when first needed.
"""
from __future__ import annotations

from typing import Any

from vecplug._version import __version__
from vecplug.errors import (
    ConfigError,
    CorruptIndexError,
    IndexLockedError,
    IndexNotFoundError,
    MissingDependencyError,
    ModelError,
    ModelMismatchError,
    QueryError,
    StorageError,
    UnknownBackendError,
    VecplugError,
)
from vecplug.types import Document, Hit, Problem

_LAZY = {
    "Index": "vecplug.api",
    "open_index": "vecplug.api",
    "create_index": "vecplug.api",
    "IndexReport": "vecplug.api",
    "Settings": "vecplug.config",
    "load_settings": "vecplug.config",
    "Encoder": "vecplug.indexer.encoder",
    "QueryEncoder": "vecplug.embedders",
    "DocumentEncoder": "vecplug.embedders",
    "load_encoder": "vecplug.embedders",
}

__all__ = [
    "__version__", "ConfigError", "CorruptIndexError", "IndexLockedError", "IndexNotFoundError",
    "MissingDependencyError", "ModelError", "ModelMismatchError", "QueryError", "StorageError",
    "UnknownBackendError",
    "VecplugError", "Document", "Hit", "Problem", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vecplug' has no attribute {name!r}")
