"""Second-stage rerankers: one contract (:class:`Reranker`), several implementations, one registry.

A reranker is named by a spec ``NAME`` or ``NAME:ARG``: ``teacher``, ``fields``,
``cross-encoder:/path/to/model``. Built-in names are in :data:`BUILTIN_RERANKERS`; third
parties add theirs through the ``vecplug.rerankers`` entry-point group
(``name = "package.module:Class"``). The implementations are imported only when asked for,
so importing this package costs neither torch nor transformers.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

from vecplug.adapters.plugins import load, registered
from vecplug.adapters.rerank.base import Query, Reranker, RerankContext
from vecplug.adapters.stores.base import StoreHit
from vecplug.errors import ConfigError, UnknownBackendError

BUILTIN_RERANKERS: dict[str, str] = {
    "teacher": "vecplug.adapters.rerank.teacher:TeacherReranker",
    "cross-encoder": "vecplug.adapters.rerank.cross_encoder:CrossEncoderReranker",
    "fields": "vecplug.adapters.rerank.fields:FieldAttentionReranker",
}
ENTRY_POINT_GROUP = "vecplug.rerankers"
#: the constructor argument that the ``ARG`` of ``NAME:ARG`` fills, unless a class names
#: another one in its ``spec_argument`` attribute
DEFAULT_SPEC_ARGUMENT = "model"

__all__ = ["BUILTIN_RERANKERS", "ENTRY_POINT_GROUP", "Query", "RerankContext", "Reranker",
           "available_rerankers", "get_reranker", "order_by_scores", "parse_spec"]


def available_rerankers() -> dict[str, str]:
    """Every known reranker name with its ``module:Class`` target."""
    return registered(BUILTIN_RERANKERS, ENTRY_POINT_GROUP)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"NAME"`` -> ``(NAME, None)``; ``"NAME:ARG"`` -> ``(NAME, ARG)``.

    Only the first colon separates, so an ARG may itself hold colons (a URL, a Windows path).
    """
    name, sep, arg = spec.strip().partition(":")
    return name.strip(), (arg.strip() or None) if sep else None


def get_reranker(spec: str, **options: Any) -> Reranker:
    """Build the reranker named by ``spec`` (``NAME`` or ``NAME:ARG``) with ``options``.

    The ARG goes to the class's ``spec_argument`` (``model`` by default; the field reranker
    takes its trained head there). Raises :class:`~vecplug.errors.UnknownBackendError` for an
    unknown name and :class:`~vecplug.errors.ConfigError` for arguments the class does not
    take or a required one (such as a cross-encoder's model) that is missing.
    """
    name, arg = parse_spec(spec)
    known = available_rerankers()
    if name not in known:
        raise UnknownBackendError(
            f"unknown reranker '{name}'; known rerankers: {', '.join(sorted(known))}")
    cls = load("reranker", name, known[name])  # any class with the contract's rerank()
    target = getattr(cls, "spec_argument", DEFAULT_SPEC_ARGUMENT)
    if arg is not None:
        if target in options and options[target] != arg:
            raise ConfigError(f"reranker spec '{spec}' gives {target}={arg!r} and the options "
                              f"give {target}={options[target]!r}; give it once")
        options = {**options, target: arg}
    # Check the arguments against the signature before calling, so that a wrong spec is a
    # ConfigError that says what to write, while a TypeError raised inside a constructor
    # stays the bug it is.
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        params = inspect.signature(cls).parameters
        missing = [p for p, v in params.items()
                   if v.default is inspect.Parameter.empty and p not in options
                   and v.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        if target in missing:
            raise ConfigError(
                f"the '{name}' reranker needs a {target}: write '{name}:{target.upper()}' "
                f"(e.g. '{name}:/path/to/{target}'" +
                (", a local Hugging Face folder or a hub id 'org/name'" if target == "model" else "") +
                ")") from None
        if arg is not None and target not in params:
            raise ConfigError(f"the '{name}' reranker takes no argument (got '{spec}')") from None
        accepted = ", ".join(p for p in params if p != "self") or "none"
        raise ConfigError(f"bad options for the '{name}' reranker ({exc}); it accepts: {accepted}") from None
    return cls(**options)


def order_by_scores(candidates: Sequence[StoreHit], scores: Sequence[float]) -> list[StoreHit]:
    """``candidates`` carrying their new ``scores``, best first.

    Ties keep the first-stage order (the sort is stable) and a non-finite score sorts last,
    so that one broken pair cannot push garbage to the top.
    """
    if len(scores) != len(candidates):
        raise ValueError(f"{len(scores)} scores for {len(candidates)} candidates")
    rescored = [StoreHit(h.record, float(s), h.vector) for h, s in zip(candidates, scores)]
    order = sorted(range(len(rescored)),
                   key=lambda i: -rescored[i].score if math.isfinite(rescored[i].score) else math.inf)
    return [rescored[i] for i in order]
