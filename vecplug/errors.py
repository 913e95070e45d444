"""Errors raised by vecplug. This module imports nothing of ours: every layer may use it."""
from __future__ import annotations


class VecplugError(Exception):
    """Root of every error vecplug raises on purpose."""


class ConfigError(VecplugError):
    """A configuration file, flag or environment variable is invalid."""


class UnknownBackendError(VecplugError):
    """A store, model or plugin name is not registered."""


class MissingDependencyError(VecplugError):
    """An optional package is not installed; the message says how to install it."""

    def __init__(self, package: str, extra: str | None = None, purpose: str = "") -> None:
        hint = f"pip install 'vecplug[{extra}]'" if extra else f"pip install {package}"
        what = f" (needed for {purpose})" if purpose else ""
        super().__init__(f"the package '{package}' is not installed{what}; install it with: {hint}")
        self.package = package
        self.extra = extra


class IndexNotFoundError(VecplugError):
    """No vecplug index exists at the given location."""


class ModelMismatchError(VecplugError):
    """A model or setting does not match the one the index was built with."""


class CorruptIndexError(VecplugError):
    """An index's files are damaged or inconsistent."""


class StorageError(VecplugError):
    """An index cannot be written or read: a full disk, a read-only or missing folder.
    The last commit is left as it was."""


class IndexLockedError(StorageError):
    """Another process is writing to the index (or, for ``train`` and ``distill``, to the
    same output)."""


class QueryError(VecplugError):
    """One query cannot be searched: it is not text, empty, holds an undecodable byte, has no
    language for ``mono`` to keep to, or its encoder gave no usable vector. The other queries
    of a batch or a stream are not at fault (``vecplug search -`` skips the line and goes on;
    every other error stops it)."""


class ModelError(VecplugError):
    """A model cannot be resolved, built or loaded."""
