"""Named implementations (stores, rerankers, integrations): the built-in ones and those third
parties register in an entry-point group (``name = "package.module:Class"``), loaded only
when asked for."""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from vecplug.errors import UnknownBackendError, VecplugError


def registered(builtin: Mapping[str, str], group: str) -> dict[str, str]:
    """Every known name with its ``module:attribute`` target: the built-in ones first (a plugin
    cannot take a built-in name), then the entry points of ``group``."""
    found = dict(builtin)
    for ep in entry_points(group=group):
        found.setdefault(ep.name, ep.value)
    return found


def load(kind: str, name: str, target: str, base: type | None = None) -> Any:
    """The class ``target`` names; with ``base``, a concrete subclass of it. A plugin that
    cannot be imported (missing, or raising at import), names nothing there, or names something
    else is an :class:`~vecplug.errors.UnknownBackendError` naming it: a broken install of a
    third party's package, which a traceback from deep inside would not tell."""
    module_name, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except VecplugError:
        raise  # already says what is wrong (a missing dependency with its install hint)
    except Exception as exc:  # noqa: BLE001 - whatever a plugin's import raises
        raise UnknownBackendError(f"{kind} '{name}' ({target}) cannot be loaded: "
                                  f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, type) or (base is not None and not issubclass(obj, base)):
        raise UnknownBackendError(f"{kind} '{name}' ({target}) is not a {base.__name__ + ' ' if base else ''}class")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise UnknownBackendError(f"{kind} '{name}' ({target}) does not implement {missing}")
    return obj
