"""Vector stores: one contract (:class:`VectorStore`), several backends, one registry."""
from vecplug.adapters.stores.base import Record, StoreHit, VectorStore
from vecplug.adapters.stores.registry import available_stores, get_store_class

__all__ = ["Record", "StoreHit", "VectorStore", "available_stores", "get_store_class"]
