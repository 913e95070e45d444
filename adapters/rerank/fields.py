"""Field attention: a document with several fields, weighted by what the query asks.

The first stage embeds a record's fields appended into one text (title, description and
body), which dilutes a field that matches the query with the ones that do not. This
reranker embeds each field on its own and lets the query choose among them:

    a_i = scale * q . W . f_i         (q: the query's first-stage vector, f_i: field i's)
    w   = softmax(a)                  (over the candidate's non-empty fields)
    d   = normalize(sum_i w_i f_i)
    score = q . d

``W`` is the identity unless a trained head is given (a safetensors file holding a square
matrix ``"W"``; its norm also plays the part of ``scale``, so a trained head may keep the
default scale). :func:`field_attention` is the whole of the math, pure, for tests and for
training a head. With the index's language-bias correction on, the query and the field
vectors are centred by their languages' means first, as the first stage scores them; a
trained head's weights ``w`` still come from the raw vectors, the ones it was trained on.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from vecplug.adapters.rerank import order_by_scores
from vecplug.adapters.rerank.base import Query, Reranker, RerankContext
from vecplug.adapters.stores.base import Record, StoreHit
from vecplug.errors import ConfigError, ModelError, ModelMismatchError
from vecplug.indexer.corpus import document_body

DEFAULT_FIELDS = ("title", "description", "text")
#: field vectors kept per reranker; at 384 float32 dimensions 20,000 vectors take ~30 MB
DEFAULT_CACHE_SIZE = 20_000


class FieldScore(NamedTuple):
    """:func:`field_attention`'s result for one candidate."""

    #: softmax weight of each field, summing to 1
    weights: np.ndarray
    #: the weighted, normalised document vector
    vector: np.ndarray
    #: ``q . vector``
    score: float


def field_attention(query: np.ndarray, fields: np.ndarray, scale: float = 20.0,
                    weight: np.ndarray | None = None,
                    attend: tuple[np.ndarray, np.ndarray] | None = None) -> FieldScore:
    """Attention of ``query`` (d,) over a candidate's ``fields`` (n, d), n >= 1.

    ``weight`` is ``W`` (d, d); None means the identity. ``attend``: the query and fields
    the weights are computed from, when they are other vectors than the ones scored (the
    raw vectors a head was trained on, where the score is in the corrected geometry); by
    default ``query`` and ``fields``. Computed in float64 so that the result is the same
    whatever order the fields come in, up to rounding.
    """
    q = np.asarray(query, dtype=np.float64).reshape(-1)
    f = np.asarray(fields, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] == 0 or f.shape[1] != q.shape[0]:
        raise ValueError(f"fields must be (n >= 1, {q.shape[0]}), got {f.shape}")
    aq, af = (q, f) if attend is None else (np.asarray(attend[0], dtype=np.float64).reshape(-1),
                                            np.asarray(attend[1], dtype=np.float64))
    if af.shape != f.shape or aq.shape != q.shape:
        raise ValueError(f"attend must be shaped as the query {q.shape} and fields {f.shape}")
    qw = aq if weight is None else aq @ np.asarray(weight, dtype=np.float64)  # q^T W, so a_i = q^T W f_i
    logits = scale * (af @ qw)
    logits -= logits.max()  # softmax is shift-invariant; this keeps exp() from overflowing
    w = np.exp(logits)
    w /= w.sum()
    doc = w @ f
    norm = np.linalg.norm(doc)
    if norm > 0:  # fields cancelling exactly leave a zero vector: score 0, not NaN
        doc = doc / norm
    return FieldScore(w, doc, float(q @ doc))


def load_head(path: str | Path) -> np.ndarray:
    """The square matrix ``"W"`` of a trained head (safetensors; never a pickle)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelError(f"field-attention head {p} does not exist")
    try:
        tensors = load_file(str(p))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelError(f"{p} is not a readable safetensors file: {exc}") from exc
    if "W" not in tensors:
        raise ModelError(f"{p} holds no tensor 'W' (found: {', '.join(sorted(tensors)) or 'none'})")
    w = np.asarray(tensors["W"], dtype=np.float32)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ModelError(f"{p}: 'W' must be a square matrix, got shape {tuple(w.shape)}")
    if not np.isfinite(w).all():
        raise ModelError(f"{p}: 'W' holds non-finite values")
    return w


class FieldAttentionReranker(Reranker):
    """Rescores candidates by attention of the query over their fields.

    ``fields``: the fields to read, in order; ``"text"`` is the record's body, any other name
    a payload key (title, description, url...); absent or empty fields are skipped, and a
    candidate with none of them is scored on its text alone. ``scale``: the attention's
    inverse temperature (cosines are small, so a large scale is needed for the weights to
    differ). ``head``: a safetensors file with a trained ``W``; the fields and scale it was
    trained with are used unless given, and a head trained over another document encoder is
    refused. Defaults: title, description, text; scale 20. ``cache_size``: field vectors
    kept between calls (least recently used dropped first), so a document that comes back
    for another query is not embedded again.

    The body is the record's text without what the index joined to it from its other fields
    (:func:`~vecplug.indexer.corpus.document_body`): a JSONL/CSV record's text field alone, not
    its title and description before it (the index's ``embed_fields``, from its manifest); a
    Markdown passage without the title before it. A head is trained on fields apart, and the
    joined text counted the title and description twice. Where that cannot be told (no store,
    a document stored otherwise), ``"text"`` is the whole text.
    """

    name: ClassVar[str] = "fields"
    #: ``fields:PATH`` names a trained head
    spec_argument: ClassVar[str] = "head"

    def __init__(self, fields: Sequence[str] | None = None, scale: float | None = None,
                 head: str | None = None, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.head = str(Path(head).expanduser()) if head else None
        self.weight = load_head(self.head) if self.head else None
        self.head_checksum: str | None = None
        #: the document encoder's checksum the head was trained over (None: not recorded)
        self.head_encoder: str | None = None
        if self.head:
            from vecplug.indexer.checksums import weights_sha256

            self.head_checksum = weights_sha256(Path(self.head))
            trained = _head_settings(self.head)
            fields = fields if fields is not None else trained.get("fields")
            scale = scale if scale is not None else trained.get("scale")
            self.head_encoder = trained.get("document_encoder_checksum")
        fields = DEFAULT_FIELDS if fields is None else fields
        if isinstance(fields, str):
            fields = [f.strip() for f in fields.split(",")]  # "title,text" from a flag or env
        self.fields = tuple(f for f in fields if f)
        if not self.fields:
            raise ConfigError("the field reranker needs at least one field")
        scale = 20.0 if scale is None else scale
        if not np.isfinite(scale) or scale <= 0:
            # (0: uniform attention whatever the query; below: the least related field weighs most)
            raise ConfigError(f"field reranker scale must be a finite number above 0, got {scale}")
        self.scale = float(scale)
        if int(cache_size) < 0:
            raise ConfigError(f"field reranker cache_size must be 0 or more, got {cache_size}")
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_owner: Any = None
        # a shared Index reranks from several threads: the LRU's check-then-move must not
        # interleave with another thread's eviction (KeyError)
        self._cache_lock = threading.Lock()

    def warm_up(self, context: RerankContext) -> None:
        context.encoder.document  # loads the document encoder (a lazy property)

    def field_texts(self, record: Record, embed_fields: Sequence[str] | None = None) -> list[str]:
        """The candidate's present, non-empty fields as texts, in ``fields`` order; its text
        when it has none. ``embed_fields``: the fields the index joined into a record's text
        (None: unknown, a record's ``"text"`` is then its whole text)."""
        texts = []
        for name in self.fields:
            value = _body(record, embed_fields) if name == "text" else record.payload.get(name)
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                continue  # lists, mappings, flags: nothing to read
            value = str(value).strip()
            if value:
                texts.append(value)
        return texts or [record.text]

    def _embed(self, texts: Sequence[str], encoder: Any) -> dict[str, np.ndarray]:
        """Vectors of distinct ``texts``, from the cache or from one encoder call."""
        found: dict[str, np.ndarray] = {}
        missing: list[str] = []
        with self._cache_lock:
            owner = self._cache_owner() if self._cache_owner is not None else None
            if owner is not encoder:
                # vectors of another encoder (another index) live in another space
                self._cache.clear()
                try:
                    self._cache_owner = weakref.ref(encoder)
                except TypeError:  # an object without weak references: keep it alive instead
                    self._cache_owner = lambda e=encoder: e
            for t in dict.fromkeys(texts):
                v = self._cache.get(t)
                if v is not None:
                    self._cache.move_to_end(t)
                    found[t] = v
                else:
                    missing.append(t)
        if missing:
            # documents take the passage prefix and the document maximum length, as indexed
            # (encoded outside the lock: other threads' cache hits need not wait for it)
            vecs = np.asarray(encoder.encode_documents(missing, progress=False), dtype=np.float32)
            with self._cache_lock:
                for t, v in zip(missing, vecs):
                    found[t] = v
                    if self._cache_owner is not None and self._cache_owner() is encoder:
                        self._cache[t] = v
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return found

    def rerank(self, queries: Sequence[Query], candidates: Sequence[Sequence[StoreHit]],
               context: RerankContext) -> list[list[StoreHit]]:
        if len(queries) != len(candidates):
            raise ValueError(f"{len(queries)} queries but {len(candidates)} candidate lists")
        self._check_encoder(context.encoder)
        embed_fields = _embed_fields(context.store) if "text" in self.fields else None
        per_hit = [[self.field_texts(h.record, embed_fields) for h in cands] for cands in candidates]
        # a candidate read through its whole text alone (one field) has that vector stored: it
        # was encoded the same way, and encoding it again cost ~240 ms a query for nothing (a
        # body without the fields joined to it is another text: encoded)
        pairs = [(h, texts) for cands, hits in zip(candidates, per_hit) for h, texts in zip(cands, hits)]
        stored = self._stored([h for h, texts in pairs if texts == [h.record.text]], context)
        # one encoder call for every other field text of every query not already cached
        vectors = self._embed([t for h, texts in pairs if h.record.id not in stored for t in texts], context.encoder)
        out = []
        for q, cands, hits in zip(queries, candidates, per_hit):
            qv = np.asarray(q.vector, dtype=np.float32).reshape(-1)
            if self.weight is not None and self.weight.shape[0] != qv.shape[0]:
                raise ModelMismatchError(f"field head {self.head} is {self.weight.shape[0]}-dimensional, "
                                         f"the index's vectors are {qv.shape[0]}-dimensional")
            means = context.means
            centred_q = means.centre_query(qv, q.lang) if means is not None else None
            scores = []
            for hit, texts in zip(cands, hits):
                fields = (stored[hit.record.id][None, :] if hit.record.id in stored
                          else np.stack([vectors[t] for t in texts]))
                if means is None:
                    scores.append(field_attention(qv, fields, self.scale, self.weight).score)
                    continue
                # scored in the corrected geometry, as the first stage scored them. A trained
                # head weighs the raw vectors it learned on (its data has no languages: the
                # centred logits differ by a term of the query language's mean it never saw)
                centred = means.centre(fields, [hit.record.lang] * len(texts))
                attend = (qv, fields) if self.weight is not None else None
                scores.append(field_attention(centred_q, centred, self.scale, self.weight, attend).score)
            out.append(order_by_scores(cands, scores))
        return out

    @staticmethod
    def _stored(hits: Sequence[StoreHit], context: RerankContext) -> dict[str, np.ndarray]:
        """The stored vectors of ``hits`` (the first stage's when it kept them), by id."""
        out = {h.record.id: np.asarray(h.vector, dtype=np.float32) for h in hits if h.vector is not None}
        rest = [h.record.id for h in hits if h.vector is None]
        if rest and context.store is not None:
            out.update({k: np.asarray(v, dtype=np.float32) for k, v in context.store.vectors_found(rest).items()})
        return out

    def _check_encoder(self, encoder: Any) -> None:
        """A head trained over another document encoder reads vectors of another space."""
        if self.head_encoder is None or not hasattr(encoder, "describe"):
            return
        described = encoder.describe()
        found = described.get("document_encoder_checksum")
        if found is not None and found != self.head_encoder:
            raise ModelMismatchError(
                f"field head {self.head} was trained over the document encoder {self.head_encoder}, "
                f"the index's is {described.get('document_encoder')} ({found})")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "fields": list(self.fields), "scale": self.scale,
                "head": self.head, "checksum": self.head_checksum}


def _body(record: Record, embed_fields: Sequence[str] | None) -> str:
    """A record's ``"text"`` field: its body, else its whole text."""
    body = document_body(record.text, record.source, record.payload, embed_fields)
    return record.text if body is None else body


def _embed_fields(store: Any) -> tuple[str, ...] | None:
    """The fields the index joined into its records' texts, as its manifest records them; None
    without a store that says. They are the last run's: a record an earlier run read with other
    fields is seldom a join of these (it is then read whole), and when it is one (these fields
    were among the old ones), only these are taken out of it."""
    read = getattr(store, "manifest_value", None)
    corpus = read("corpus") if callable(read) else None
    fields = corpus.get("embed_fields") if isinstance(corpus, dict) else None
    if isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields):
        return tuple(fields)
    return None


def _head_settings(path: str) -> dict[str, Any]:
    """What a head file records of its training (``vecplug train``, kind field-head): fields,
    scale, document encoder checksum; empty for a head written by something else."""
    from vecplug.indexer.field_head import read_head_metadata

    try:
        meta = read_head_metadata(path)
    except Exception:  # noqa: BLE001  (load_head has read the tensor: metadata is optional)
        return {}
    out: dict[str, Any] = {}
    config, encoder, fields = meta.get("config"), meta.get("encoder"), meta.get("fields")
    if isinstance(config, dict) and isinstance(config.get("scale"), (int, float)):
        out["scale"] = float(config["scale"])
    if isinstance(fields, list) and fields and all(isinstance(f, str) for f in fields):
        out["fields"] = tuple(fields)
    if isinstance(encoder, dict) and isinstance(encoder.get("document_encoder_checksum"), str):
        out["document_encoder_checksum"] = encoder["document_encoder_checksum"]
    return out
