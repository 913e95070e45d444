"""Retrieval modes (the LAReQA settings).

* ``xy``: one language-agnostic pool; the best answers in any language.
* ``mono``: only documents in the query's language (X-X-mono), by a payload filter.
"""
from __future__ import annotations

from collections.abc import Sequence

from vecplug.errors import ConfigError

MODES = {
    "xy": "cross-lingual: search every language",
    "mono": "same language: only documents in the query's language",
}


def target_languages(mode: str, query_lang: str | None) -> Sequence[str] | None:
    """Languages a query may be answered in under ``mode`` (None: all)."""
    if mode == "xy":
        return None
    if mode == "mono":
        if not query_lang or query_lang == "und":
            raise ConfigError("mono mode needs the query's language and it could not be detected; "
                              "give it with --lang")
        return [query_lang]
    raise ConfigError(f"unknown mode '{mode}'; modes: {', '.join(MODES)}")
