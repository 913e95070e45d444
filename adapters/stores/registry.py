"""Store names -> implementing classes. Third parties add theirs via the
``vecplug.stores`` entry-point group (``name = "package.module:Class"``)."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from vecplug.errors import UnknownBackendError

if TYPE_CHECKING:
    from vecplug.adapters.stores.base import VectorStore

BUILTIN_STORES: dict[str, str] = {
    "hnswlib": "vecplug.adapters.stores.hnsw:HnswStore",
    "qdrant": "vecplug.adapters.stores.qdrant:QdrantStore",
}
ENTRY_POINT_GROUP = "vecplug.stores"


def available_stores() -> dict[str, str]:
    """Every known store name with its ``module:Class`` target."""
    found = dict(BUILTIN_STORES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def get_store_class(name: str) -> type["VectorStore"]:
    """Import and return the store class registered as ``name``."""
    stores = available_stores()
    if name not in stores:
        raise UnknownBackendError(
            f"unknown store '{name}'; known stores: {', '.join(sorted(stores))}")
    module_name, _, attr = stores[name].partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        # a plugin's entry point naming a module or class that is not there (a broken install)
        raise UnknownBackendError(f"store '{name}' ({stores[name]}) cannot be loaded: {exc}") from exc
