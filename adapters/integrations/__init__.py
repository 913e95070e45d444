"""Integrations with the stacks users already run (LangChain, LlamaIndex, qdrant-client).

Each lives in its own module that imports its framework when imported; they are listed in
the ``vecplug.integrations`` entry-point group and loaded with :func:`load_integration`.
"""
from __future__ import annotations

import importlib
from typing import Any

from vecplug.adapters.plugins import load, registered
from vecplug.errors import MissingDependencyError, UnknownBackendError

BUILTIN_INTEGRATIONS: dict[str, str] = {
    "langchain": "vecplug.adapters.integrations.langchain:VecplugEmbeddings",
    "llamaindex": "vecplug.adapters.integrations.llamaindex:VecplugEmbedding",
    "qdrant": "vecplug.adapters.integrations.qdrant:QdrantSearcher",
}
ENTRY_POINT_GROUP = "vecplug.integrations"
# the package each integration needs, and the extra that installs it
REQUIRES = {"langchain": ("langchain_core", "langchain-core", "langchain"),
            "llamaindex": ("llama_index.core", "llama-index-core", "llamaindex"),
            "qdrant": ("qdrant_client", "qdrant-client", "qdrant")}


def available_integrations() -> dict[str, str]:
    return registered(BUILTIN_INTEGRATIONS, ENTRY_POINT_GROUP)


def require(name: str) -> None:
    """Raise a clear install hint when the framework of integration ``name`` is missing."""
    module, package, extra = REQUIRES[name]
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(package, extra=extra, purpose=f"the {name} integration") from None


def load_integration(name: str) -> Any:
    """The class registered as ``name``."""
    known = available_integrations()
    if name not in known:
        raise UnknownBackendError(f"unknown integration '{name}'; known: {', '.join(sorted(known))}")
    if name in REQUIRES:
        require(name)
    return load("integration", name, known[name])
