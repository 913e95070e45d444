"""The flat store's vectors: one float32 matrix, searched exactly, and its file.

:class:`FlatIndex` offers the part of ``hnswlib.Index`` that the hnswlib store uses (so the
flat store keeps that store's records, commits and checks as they are), with exact answers:
a search scores every vector. Rows are kept dense: a deleted vector's row takes the last
row's vector, so a scan never reads a deleted vector and the file never holds one.

File layout (``vectors-<gen>.flat``, little-endian)::

    8 bytes   b"VPFLAT01"
    uint64    dim
    uint64    count
    float64   the largest norm of a row
    float64   the largest norm of a row less the row rounded to bfloat16 (the scan's bound)
    int64     labels[count]
    float32   vectors[count, dim]

The two norms are the flat store's batch scan's error bound (``scan.error_bound``): kept in
the file, a reader need not read every vector to know them. A delete leaves them as they were
(still bounds); a rewrite of the index from its rows computes them afresh.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.adapters.stores.base import row_dots

MAGIC = b"VPFLAT01"
_HEADER = struct.Struct("<8sQQdd")
#: rows read at a time (norms and bfloat16 residuals of new rows, the file): 25 MB of 384-d ones
_PART = 16_384


def check_flat_file(path: Path, dim: int) -> str | None:
    """What is wrong with the flat vectors file at ``path`` for ``dim``-d vectors; None if nothing."""
    size = path.stat().st_size
    if size < _HEADER.size:
        return f"{path.name} is truncated ({size} bytes)"
    with open(path, "rb") as fh:
        magic, file_dim, count, row_norm, residual = _HEADER.unpack(fh.read(_HEADER.size))
    if magic != MAGIC:
        return f"{path.name} is not a vecplug flat vectors file"
    if file_dim != dim:
        return f"{path.name} holds {file_dim}-d vectors, the index {dim}-d"
    expected = _HEADER.size + count * (8 + 4 * dim)
    if size != expected:
        return f"{path.name} has {size} bytes, its header says {expected}"
    if not (np.isfinite(row_norm) and np.isfinite(residual)) or row_norm < 0 or residual < 0:
        return f"{path.name} has a damaged header"
    return None


def bfloat16_rounded(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), as float32: what torch's
    conversion gives, without importing torch (a writer of the flat store needs none)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def residual_norms(vectors: np.ndarray) -> tuple[float, float]:
    """(largest row norm, largest norm of a row less its bfloat16 rounding) of ``vectors``."""
    norm = residual = 0.0
    for a in range(0, len(vectors), _PART):
        x = np.asarray(vectors[a:a + _PART], dtype=np.float32)
        norm = max(norm, float(np.sqrt(np.einsum("ij,ij->i", x, x).max(initial=0.0))))
        r = x - bfloat16_rounded(x)
        residual = max(residual, float(np.sqrt(np.einsum("ij,ij->i", r, r).max(initial=0.0))))
    return norm, residual


class FlatIndex:
    """Exact inner-product search over a dense float32 matrix, with hnswlib's method names."""

    #: hnswlib's graph parameters, which a flat index has none of
    M = 0
    ef_construction = 0

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._vectors = np.empty((0, dim), dtype=np.float32)
        self._labels = np.empty(0, dtype=np.int64)
        self._count = 0
        # label -> row (-1: none), grown to the largest label; labels are the store's dense counter
        self._row_of = np.empty(0, dtype=np.int64)
        self.row_norm = 0.0
        self.residual_norm = 0.0
        #: bumped by every change of rows: what a cached row selection was made for
        self.version = 0

    # -- capacity -----------------------------------------------------------

    def init_index(self, max_elements: int, M: int = 0, ef_construction: int = 0, **_: Any) -> None:
        self._vectors = np.empty((max_elements, self.dim), dtype=np.float32)
        self._labels = np.empty(max_elements, dtype=np.int64)

    def get_max_elements(self) -> int:
        return len(self._vectors)

    def get_current_count(self) -> int:
        """Live vectors (hnswlib counts deleted ones too; a flat index keeps none)."""
        return self._count

    def resize_index(self, max_elements: int) -> None:
        """Room for ``max_elements`` rows, resized in place (realloc moves the pages: no second
        copy of the vectors); while something else holds a view of the rows, numpy refuses, and
        they are copied with a quarter more room, so that copies stay rare."""
        if max_elements < self._count:
            raise RuntimeError("cannot resize below the number of vectors held")
        if not self._resize("_vectors", (max_elements, self.dim)):
            max_elements = len(self._vectors)
        self._resize("_labels", (max_elements,))

    def _resize(self, name: str, shape: tuple[int, ...]) -> bool:
        """The array attribute ``name`` given ``shape`` (a copy: its rows and a quarter more),
        its live rows kept; whether it was resized in place."""
        array = getattr(self, name)
        # this frame's reference then the only one besides a view's: numpy's refcheck counts them
        setattr(self, name, None)
        try:
            array.resize(shape)
            return True
        except ValueError:
            grown = np.empty((shape[0] + shape[0] // 4, *shape[1:]) if shape[0] > self._count else shape,
                             dtype=array.dtype)
            grown[:self._count] = array[:self._count]
            array = grown
            return False
        finally:
            setattr(self, name, array)

    def set_ef(self, ef: int) -> None:
        """No search breadth: every search is exact."""

    # -- rows ---------------------------------------------------------------

    @property
    def vectors(self) -> np.ndarray:
        """The live vectors, row by row (a view: valid until the next change)."""
        return self._vectors[:self._count]

    @property
    def labels(self) -> np.ndarray:
        """Each row's label (a view, as :attr:`vectors`)."""
        return self._labels[:self._count]

    def rows(self, labels: np.ndarray) -> np.ndarray:
        """The rows of ``labels`` (-1 for a label not held)."""
        labels = np.asarray(labels, dtype=np.int64)
        inside = (labels >= 0) & (labels < len(self._row_of))
        out = np.full(len(labels), -1, dtype=np.int64)
        out[inside] = self._row_of[labels[inside]]
        return out

    def _grow_row_of(self, top: int) -> None:
        if top >= len(self._row_of):
            grown = np.full(max(top + 1, 2 * len(self._row_of), 1024), -1, dtype=np.int64)
            grown[:len(self._row_of)] = self._row_of
            self._row_of = grown

    def add_items(self, vectors: Any, labels: Any = None, **_: Any) -> None:
        """Add rows, or replace the vector of a label already held (as hnswlib does)."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if len(labels) != len(vectors):
            raise RuntimeError(f"{len(vectors)} vectors for {len(labels)} labels")
        if len(labels) and labels.min() < 0:
            raise RuntimeError("labels must not be negative")
        if len(np.unique(labels)) != len(labels):
            # the last vector of a label wins, as in hnswlib's one-by-one adds
            last = {int(lab): i for i, lab in enumerate(labels)}
            keep = np.asarray(sorted(last.values()), dtype=np.int64)
            vectors, labels = vectors[keep], labels[keep]
        if not len(labels):
            return
        self._grow_row_of(int(labels.max()))
        rows = self._row_of[labels]
        new = rows < 0
        need = self._count + int(new.sum())
        if need > len(self._vectors):
            self.resize_index(need)
        fresh = np.arange(self._count, need)
        rows[new] = fresh
        self._vectors[rows] = vectors
        self._labels[fresh] = labels[new]
        self._row_of[labels[new]] = fresh
        self._count = need
        norm, residual = residual_norms(vectors)
        self.row_norm = max(self.row_norm, norm)
        self.residual_norm = max(self.residual_norm, residual)
        self.version += 1

    def mark_deleted(self, label: int) -> None:
        """Remove ``label``'s vector: the last row moves into its place."""
        row = int(self.rows(np.asarray([label]))[0])
        if row < 0:
            raise RuntimeError(f"label {label} not found")
        last = self._count - 1
        if row != last:
            self._vectors[row] = self._vectors[last]
            self._labels[row] = self._labels[last]
            self._row_of[self._labels[row]] = row
        self._row_of[label] = -1
        self._count = last
        self.version += 1

    def unmark_deleted(self, label: int) -> None:
        """A deleted vector is gone (nothing to restore): the store adds it again."""
        raise RuntimeError(f"label {label} is not deleted-and-kept in a flat index")

    def get_items(self, labels: Any, return_type: str = "numpy") -> Any:
        rows = self.rows(np.asarray(list(labels), dtype=np.int64))
        if (rows < 0).any():
            raise RuntimeError(f"label {int(np.asarray(list(labels))[np.argmax(rows < 0)])} not found")
        items = self._vectors[rows]
        return items.tolist() if return_type == "list" else items

    # -- search -------------------------------------------------------------

    def knn_query(self, vector: Any, k: int = 1, filter: Any = None, *,
                  rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best labels and their distances (``1 - inner product``, as hnswlib's "ip"
        space gives), best first, of one query, exactly; fewer when fewer are held. ``rows``:
        only these rows; ``filter``: only labels it accepts (a Python call per row: slow)."""
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if rows is None and filter is not None:
            rows = np.flatnonzero([filter(int(lab)) for lab in self.labels])
        if rows is None:
            scores = row_dots(self.vectors, q)
            labels = self.labels
        else:
            scores = np.concatenate([row_dots(self._vectors[rows[a:a + _PART]], q)
                                     for a in range(0, len(rows), _PART)]) if len(rows) else np.empty(0, np.float32)
            labels = self._labels[rows]
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if 0 < k < len(scores) else np.arange(len(scores))[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return labels[top][None, :], (1.0 - scores[top])[None, :]

    # -- file ---------------------------------------------------------------

    def save_index(self, path: str) -> None:
        with open(path, "wb") as fh:
            fh.write(_HEADER.pack(MAGIC, self.dim, self._count, self.row_norm, self.residual_norm))
            fh.write(np.ascontiguousarray(self.labels).view(np.uint8))
            # in parts: a view of the rows, no copy of the matrix
            for a in range(0, self._count, _PART):
                fh.write(np.ascontiguousarray(self._vectors[a:min(a + _PART, self._count)]).reshape(-1).view(np.uint8))

    def load_index(self, path: str, max_elements: int = 0, **_: Any) -> None:
        """Read a file :func:`check_flat_file` passed: room for exactly its rows (a reader adds
        none; a writer grows on its first add)."""
        with open(path, "rb") as fh:
            _, dim, count, row_norm, residual = _HEADER.unpack(fh.read(_HEADER.size))
            if dim != self.dim:
                raise RuntimeError(f"the file holds {dim}-d vectors, not {self.dim}-d")
            labels = np.empty(count, dtype=np.int64)
            vectors = np.empty((count, dim), dtype=np.float32)
            for array in (labels, vectors):
                view = array.reshape(-1).view(np.uint8)
                if fh.readinto(view) != len(view):
                    raise RuntimeError("the file is truncated")
        self._vectors, self._labels, self._count = vectors, labels, int(count)
        self._row_of = np.empty(0, dtype=np.int64)
        if count:
            if labels.min() < 0 or len(np.unique(labels)) != count:
                raise RuntimeError("the file's labels are damaged")
            self._grow_row_of(int(labels.max()))
            self._row_of[labels] = np.arange(count)
        self.row_norm, self.residual_norm = float(row_norm), float(residual)
        self.version += 1
