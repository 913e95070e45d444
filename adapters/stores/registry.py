"""Store names -> implementing classes. Third parties add theirs via the
``vecplug.stores`` entry-point group (``name = "package.module:Class"``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from vecplug.adapters.plugins import load, registered
from vecplug.errors import UnknownBackendError

if TYPE_CHECKING:
    from vecplug.adapters.stores.base import VectorStore

BUILTIN_STORES: dict[str, str] = {
    "hnswlib": "vecplug.adapters.stores.hnsw:HnswStore",
    "flat": "vecplug.adapters.stores.flat:FlatStore",
    "qdrant": "vecplug.adapters.stores.qdrant:QdrantStore",
}
ENTRY_POINT_GROUP = "vecplug.stores"


def available_stores() -> dict[str, str]:
    """Every known store name with its ``module:Class`` target."""
    return registered(BUILTIN_STORES, ENTRY_POINT_GROUP)


def get_store_class(name: str) -> type["VectorStore"]:
    """Import and return the store class registered as ``name``."""
    from vecplug.adapters.stores.base import VectorStore

    stores = available_stores()
    if name not in stores:
        raise UnknownBackendError(
            f"unknown store '{name}'; known stores: {', '.join(sorted(stores))}")
    return load("store", name, stores[name], VectorStore)
