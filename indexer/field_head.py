"""Training the field-attention reranker's head ``W`` from queries and documents split into fields.

The field reranker (``fields`` in the rerank adapters) scores a candidate with several fields by

    a_i = scale * q^T W f_i,   w = softmax(a) over the non-empty fields,
    d = normalize(sum_i w_i f_i),   score = q . d

with ``W`` the identity until a trained head is given. :func:`train_field_head` learns ``W``
(only ``W``: the encoder is frozen) from examples (a query and the fields of its relevant
document, optionally irrelevant documents), with an in-batch ranking loss over exactly those
scores; :func:`save_head` writes it where ``FieldAttentionReranker(head=PATH)`` reads it.

What is embedded is what the reranker embeds at search time: each field's text on its own,
stripped, with the document prefix (``encode_documents``), no field name prepended; queries
through ``encode_queries``. Training starts from the identity, so step 0 *is* the untrained
reranker, and every epoch reports the held-out MRR of both heads: a head that does not beat
the identity on held-out queries is not worth shipping.

This module does not import the adapters (the indexer layer sits below them); the math of
:func:`attention_scores` is tested against the reranker's own ``field_attention``.
"""
from __future__ import annotations

import inspect
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.errors import ConfigError, ModelError, ModelMismatchError
from vecplug.indexer.checkpoint import numpy_seed, torch_seed
from vecplug.types import Problem

DEFAULT_FIELDS = ("title", "description", "text")
#: what a head file's ``format`` metadata says
HEAD_FORMAT = "vecplug-field-head/1"
# text that cannot be embedded or stored: NUL, lone surrogates (JSON "\ud800" escapes) and the
# surrogate escapes that stand for undecodable bytes of a CSV file
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
# evaluation materialises (queries, documents, dim) float32 blocks: at most this many values
_EVAL_BLOCK = 1 << 22

Fields = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class FieldExample:
    """One training example: a query and the fields of its relevant document.

    ``fields``: ``(field name, text)`` pairs, non-empty texts only, in the reranker's field
    order; ``negatives``: irrelevant documents of the same shape; ``where``: ``path:line`` it
    was read from, for messages.
    """

    query: str
    fields: Fields
    negatives: tuple[Fields, ...] = ()
    where: str = ""


# -- reading examples ---------------------------------------------------------------------------

def field_names(fields: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(fields, str):
        fields = fields.split(",")  # "title,text" from a flag, as the reranker accepts
    names = tuple(dict.fromkeys(f.strip() for f in fields if f and f.strip()))
    if not names:
        raise ConfigError("field-head training needs at least one field name")
    return names


def _field_value(value: Any) -> str | None:
    """A field's text as the reranker reads it (str, int or float; not flags, lists or
    mappings), stripped; None when there is nothing to read."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the number {value} is not finite")
    text = str(value).strip()
    if _BAD_TEXT.search(text):
        raise ValueError("text holds a NUL, a lone surrogate or bytes that are not UTF-8")
    return text or None


def _document(obj: Any, names: tuple[str, ...]) -> Fields:
    """The present, non-empty ``names`` of a document object; ValueError when it has none."""
    if not isinstance(obj, dict):
        raise ValueError(f"a document must be an object of field -> text, got {type(obj).__name__}")
    out = []
    for name in names:
        text = _field_value(obj.get(name))
        if text is not None:
            out.append((name, text))
    if not out:
        raise ValueError(f"the document has none of the fields {', '.join(names)}")
    return tuple(out)


def _query(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("'query' must be a non-empty string")
    if _BAD_TEXT.search(value):
        raise ValueError("the query holds a NUL, a lone surrogate or bytes that are not UTF-8")
    return value.strip()


def _read_jsonl(path: Path, names: tuple[str, ...], problems: list[Problem]) -> list[FieldExample]:
    from vecplug.indexer.datasets import jsonl_objects  # strict JSON lines: NaN, bad UTF-8 reported

    out: list[FieldExample] = []
    for lineno, obj in jsonl_objects(path, problems):
        try:
            query = _query(obj.get("query"))
            doc = _document(obj.get("document"), names)
        except ValueError as exc:
            problems.append(Problem(str(path), str(exc), lineno))
            continue
        raw_negatives = obj.get("negatives", [])
        if raw_negatives is None:
            raw_negatives = []
        if not isinstance(raw_negatives, list):
            problems.append(Problem(str(path), "'negatives' must be a list of documents", lineno))
            continue
        negatives = []
        for i, neg in enumerate(raw_negatives, 1):
            try:
                negatives.append(_document(neg, names))
            except ValueError as exc:
                # the example is still good: only this negative is left out, and said so
                problems.append(Problem(str(path), f"negative {i} skipped: {exc}", lineno))
        out.append(FieldExample(query, doc, tuple(negatives), f"{path}:{lineno}"))
    return out


def _read_csv(path: Path, names: tuple[str, ...], problems: list[Problem]) -> list[FieldExample]:
    # the training data's strict reader: a record that fails (an unclosed quote) costs that
    # record, reported by its line, and reading goes on at the next line; a plain csv.reader
    # took every later row into the open quote and said so once
    from vecplug.indexer.train_data import Reporter, csv_records

    report = Reporter(path, problems)
    columns = {"query": ("query",), "document": names}
    out: list[FieldExample] = []
    for lineno, record in csv_records(path, report, columns, ("query", "document")):
        try:
            query = _query(record.get("query"))
            doc = _document(record, names)
        except ValueError as exc:
            report(str(exc), lineno)
            continue
        out.append(FieldExample(query, doc, (), f"{path}:{lineno}"))
    report.close()
    return out


def load_field_examples(path: str | Path, *, fields: Sequence[str] = DEFAULT_FIELDS,
                        problems: list[Problem]) -> list[FieldExample]:
    """Read training examples from a JSONL or CSV file.

    JSONL: one object a line, ``{"query": ..., "document": {field: text, ...}, "negatives":
    [{field: text, ...}, ...]}`` (``negatives`` optional). CSV: a header with ``query`` and one
    column per field name, one relevant document a row. Only the ``fields`` named are read, in
    that order (the reranker's order), and empty ones are left out, as the reranker does.

    A bad line (malformed or non-strict JSON such as ``NaN``, no query, a document with none of
    the fields, invalid UTF-8...) is appended to ``problems`` with its line and skipped; a bad
    negative is reported and left out of its example. Raises :class:`ConfigError` when the file
    is missing, of another format, or yields no usable example.
    """
    p = Path(path).expanduser()
    names = field_names(fields)
    if not p.is_file():
        raise ConfigError(f"field examples file {p} does not exist")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        examples = _read_jsonl(p, names, problems)
    elif suffix == ".csv":
        examples = _read_csv(p, names, problems)
    else:
        raise ConfigError(f"{p}: field examples are read from .jsonl or .csv files")
    if not examples:
        raise ConfigError(f"{p} holds no usable field example (a query and a document with one of "
                          f"the fields {', '.join(names)})")
    return examples


# -- the math -----------------------------------------------------------------------------------

def attention_scores(q: Any, F: Any, mask: Any, W: Any, scale: float) -> Any:
    """Field-attention scores of every query against every document, in torch.

    ``q`` (B, d) query vectors, ``F`` (N, m, d) field vectors of N documents with up to m
    fields, ``mask`` (N, m) bool (True: the field is present), ``W`` (d, d). Returns (B, N):
    ``q_b . normalize(sum_i w_i F_ni)`` with ``w = softmax_i(scale * q_b^T W F_ni)`` over the
    present fields, the reranker's math. A weighted sum that is exactly zero (fields
    cancelling, or a document without fields) scores 0, and leaves no NaN in the gradient.
    """
    import torch

    mask = mask.to(torch.bool)
    logits = scale * torch.einsum("bd,nmd->bnm", q @ W, F)  # q^T W f
    # a finite minimum rather than -inf: a document with no field gives uniform weights that
    # the mask then zeroes, instead of a NaN softmax
    logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, dim=-1) * mask
    doc = torch.einsum("bnm,nmd->bnd", weights, F)
    sq = (doc * doc).sum(-1)
    present = sq > 0
    norm = torch.sqrt(torch.where(present, sq, torch.ones_like(sq)))  # where, not clamp: exact
    dot = torch.einsum("bd,bnd->bn", q, doc)
    return torch.where(present, dot / norm, torch.zeros_like(dot))


# -- training -----------------------------------------------------------------------------------

@dataclass
class FieldHeadReport:
    """What :func:`train_field_head` learned and how well it ranks held-out queries."""

    #: the trained head, (d, d) float32
    W: np.ndarray
    #: training loss of every step
    losses: list[float]
    #: per epoch: ``epoch``, ``loss`` (mean of its steps), ``mrr_identity`` and ``mrr_trained``
    #: (held-out MRR of the untrained and the trained head; None without a held-out split)
    epochs: list[dict[str, Any]]
    #: held-out MRR of the identity head (the untrained reranker) and of the trained head
    mrr_before: float | None
    mrr_after: float | None
    #: mean training loss over the training set with the identity head and with the trained one
    loss_before: float
    loss_after: float
    #: examples read, used for training and held out; distinct queries, documents, field texts
    counts: dict[str, int]
    #: the settings of the run (scale, loss_scale, epochs, batch size...)
    config: dict[str, Any]
    #: the encoder's ``describe()`` when it has one (its checksums), else None
    encoder: dict[str, Any] | None = None
    seconds: float = 0.0
    #: the held-out query texts (the MRR is over these, each against every held-out document)
    held_out_queries: list[str] = field(default_factory=list)

    @property
    def improved(self) -> bool | None:
        """Whether the trained head ranks held-out queries better than the identity."""
        if self.mrr_before is None or self.mrr_after is None:
            return None
        return self.mrr_after > self.mrr_before

    def metadata(self, data: str | Path | None = None) -> dict[str, Any]:
        """The metadata :func:`save_head` records: data file, settings, counts, before/after
        MRR and the encoder's checksums."""
        enc = self.encoder or {}
        return {"data": str(data) if data is not None else None, "config": self.config,
                "counts": self.counts, "mrr_before": self.mrr_before, "mrr_after": self.mrr_after,
                "loss_before": self.loss_before, "loss_after": self.loss_after,
                "encoder": {k: enc.get(k) for k in ("document_encoder", "document_encoder_checksum",
                                                     "query_encoder", "query_encoder_checksum",
                                                     "dim", "document_prefix", "query_prefix")
                            if k in enc} or None}


def _encode(fn: Callable[..., Any], texts: list[str], progress: bool) -> np.ndarray:
    """``fn(texts)``, with ``progress=`` when it takes it (vecplug's Encoder does)."""
    try:
        params = inspect.signature(fn).parameters.values()
        takes = any(p.name == "progress" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    except (TypeError, ValueError):  # a builtin without a signature
        takes = False
    out = fn(texts, progress=progress) if takes else fn(texts)
    return np.asarray(out, dtype=np.float32)


def _check_vectors(name: str, vecs: np.ndarray, n: int) -> None:
    if vecs.ndim != 2 or vecs.shape[0] != n:
        raise ModelError(f"the encoder returned {name} vectors of shape {vecs.shape} for {n} texts")
    if not np.isfinite(vecs).all():
        raise ModelError(f"the encoder returned non-finite {name} vectors")


def _check_settings(scale: float, loss_scale: float, epochs: int, batch_size: int,
                    learning_rate: float, weight_decay: float, held_out: float) -> None:
    if not (math.isfinite(scale) and scale > 0 and math.isfinite(loss_scale) and loss_scale > 0):
        raise ConfigError(f"scale and loss_scale must be positive and finite, got {scale}, {loss_scale}")
    if epochs < 0 or batch_size < 1:
        raise ConfigError(f"epochs must be >= 0 and batch_size >= 1, got {epochs}, {batch_size}")
    if not (math.isfinite(learning_rate) and learning_rate > 0):
        raise ConfigError(f"learning_rate must be positive, got {learning_rate}")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")
    if not (0.0 <= held_out < 1.0):
        raise ConfigError(f"held_out is a fraction of the queries in [0, 1), got {held_out}")


def train_field_head(examples: Iterable[FieldExample], encoder: Any, *, scale: float = 20.0,
                     loss_scale: float = 20.0, epochs: int = 3, batch_size: int = 32,
                     learning_rate: float = 1e-3, weight_decay: float = 0.0, seed: int = 0,
                     held_out: float = 0.1, progress: bool = True,
                     log: Callable[[str], None] = print) -> FieldHeadReport:
    """Learn the field reranker's ``W`` from ``examples``; the encoder stays frozen.

    Every query is embedded once with ``encoder.encode_queries`` and every distinct field text
    once with ``encoder.encode_documents``. ``W`` starts at the identity and is trained with
    AdamW (``weight_decay`` pulls it back to the identity, the untrained head, not to zero) on
    an in-batch ranking loss: for each query, cross-entropy over ``loss_scale`` times the
    attention scores (computed with the attention ``scale``, which must be the reranker's) of
    the batch's documents, its relevant document the target, the batch's other documents and
    every negative the alternatives; other documents relevant to the same query text are left
    out of its alternatives. ``held_out`` of the distinct queries (seeded, at least one when it
    is > 0 and there are two queries) are kept out of training; each of them ranks its relevant
    document among every held-out document, and the MRR of the identity and of the trained
    head are logged per epoch. Deterministic for a given ``seed``.
    """
    import torch
    from tqdm.auto import tqdm

    started = time.perf_counter()
    _check_settings(scale, loss_scale, epochs, batch_size, learning_rate, weight_decay, held_out)
    examples = list(examples)
    if not examples:
        raise ConfigError("no field examples to train on")
    for ex in examples:
        if not ex.query or not ex.fields or not all(t for _, t in ex.fields):
            raise ConfigError(f"example {ex.where or ex.query!r} needs a query and non-empty fields")

    # distinct queries, documents (by their fields) and field texts
    query_texts = list(dict.fromkeys(ex.query for ex in examples))
    query_ids = {q: i for i, q in enumerate(query_texts)}
    doc_ids: dict[Fields, int] = {}
    for ex in examples:
        for doc in (ex.fields, *ex.negatives):
            doc_ids.setdefault(doc, len(doc_ids))
    texts = list(dict.fromkeys(t for doc in doc_ids for _, t in doc))
    text_ids = {t: i for i, t in enumerate(texts)}
    width = max(len(doc) for doc in doc_ids)
    # field text ids of every document, -1 where it has fewer fields than the widest
    doc_fields = np.full((len(doc_ids), width), -1, dtype=np.int64)
    for doc, di in doc_ids.items():
        doc_fields[di, :len(doc)] = [text_ids[t] for _, t in doc]
    relevant: dict[int, set[int]] = {}
    for ex in examples:
        relevant.setdefault(query_ids[ex.query], set()).add(doc_ids[ex.fields])

    log(f"embedding {len(query_ids)} queries and {len(texts)} field texts "
        f"of {len(doc_ids)} documents")
    qv = _encode(encoder.encode_queries, query_texts, progress)
    fv = _encode(encoder.encode_documents, texts, progress)
    _check_vectors("query", qv, len(query_ids))
    _check_vectors("field", fv, len(texts))
    if qv.shape[1] != fv.shape[1]:
        raise ModelMismatchError(f"query vectors are {qv.shape[1]}-dimensional, "
                                 f"field vectors {fv.shape[1]}-dimensional")
    dim = qv.shape[1]
    q_table = torch.from_numpy(qv)
    f_table = torch.from_numpy(fv)
    fields_of = torch.from_numpy(doc_fields)

    # held-out split by query text: a query is either trained on or evaluated, never both
    n_queries = len(query_ids)
    n_held = int(round(held_out * n_queries))
    if held_out > 0 and n_queries >= 2:
        n_held = min(max(n_held, 1), n_queries - 1)
    else:
        n_held = 0
    held = set(np.random.default_rng(numpy_seed(seed)).permutation(n_queries)[:n_held].tolist())
    items = [(query_ids[ex.query], doc_ids[ex.fields], tuple(doc_ids[n] for n in ex.negatives))
             for ex in examples]
    train = [it for it in items if it[0] not in held]
    held_queries = sorted(held)
    held_docs = list(dict.fromkeys(d for q, pos, negs in items if q in held for d in (pos, *negs)))

    def gather(docs: Sequence[int]) -> tuple[Any, Any]:
        idx = fields_of[torch.as_tensor(list(docs), dtype=torch.long)]
        mask = idx >= 0
        return f_table[idx.clamp(min=0)], mask

    def batch_loss(W: Any, batch: Sequence[tuple[int, int, tuple[int, ...]]]) -> Any:
        cands = list(dict.fromkeys(d for _, pos, negs in batch for d in (pos, *negs)))
        where = {d: i for i, d in enumerate(cands)}
        F, mask = gather(cands)
        qs = q_table[torch.as_tensor([q for q, _, _ in batch], dtype=torch.long)]
        logits = loss_scale * attention_scores(qs, F, mask, W, scale)
        # another document relevant to the same query is not an alternative to rank below
        skip = torch.zeros_like(logits, dtype=torch.bool)
        for b, (q, pos, _) in enumerate(batch):
            for d in relevant[q]:
                if d != pos and d in where:
                    skip[b, where[d]] = True
        target = torch.as_tensor([where[pos] for _, pos, _ in batch], dtype=torch.long)
        return torch.nn.functional.cross_entropy(logits.masked_fill(skip, float("-inf")), target)

    def batches(order: Sequence[int]) -> list[list[tuple[int, int, tuple[int, ...]]]]:
        return [[train[i] for i in order[s:s + batch_size]] for s in range(0, len(order), batch_size)]

    def train_loss(W: Any) -> float:
        if not train:
            return float("nan")
        with torch.no_grad():
            parts = [(batch_loss(W, b).item(), len(b)) for b in batches(range(len(train)))]
        return sum(v * n for v, n in parts) / len(train)

    def mrr(W: Any) -> float | None:
        if not held_queries:
            return None
        F, mask = gather(held_docs)
        in_pool = {d: i for i, d in enumerate(held_docs)}
        rows = max(1, _EVAL_BLOCK // max(1, len(held_docs) * dim))
        total = 0.0
        with torch.no_grad():
            for s in range(0, len(held_queries), rows):
                chunk = held_queries[s:s + rows]
                scores = attention_scores(q_table[torch.as_tensor(chunk, dtype=torch.long)],
                                          F, mask, W, scale).numpy()
                for row, q in zip(scores, chunk):
                    rel = [in_pool[d] for d in relevant[q] if d in in_pool]
                    is_rel = np.zeros(len(held_docs), dtype=bool)
                    is_rel[rel] = True
                    # rank of the best relevant document; ties with it count in its favour
                    best = row[is_rel].max()
                    total += 1.0 / (1 + int((row[~is_rel] > best).sum()))
        return total / len(held_queries)

    config = {"scale": float(scale), "loss_scale": float(loss_scale), "epochs": int(epochs),
              "batch_size": int(batch_size), "learning_rate": float(learning_rate),
              "weight_decay": float(weight_decay), "seed": int(seed), "held_out": float(held_out),
              "dim": int(dim)}
    counts = {"examples": len(examples), "train_examples": len(train),
              "held_out_examples": len(items) - len(train), "queries": n_queries,
              "held_out_queries": len(held_queries), "documents": len(doc_ids),
              "held_out_documents": len(held_docs), "field_texts": len(texts),
              "negatives": sum(len(ex.negatives) for ex in examples)}
    if not train:
        raise ConfigError("every example is held out: nothing left to train on")

    identity = torch.eye(dim, dtype=torch.float32)
    # W = I + delta: training starts at the untrained reranker, and weight decay on delta
    # pulls towards it
    delta = torch.zeros((dim, dim), dtype=torch.float32, requires_grad=True)
    optimizer = torch.optim.AdamW([delta], lr=learning_rate, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(torch_seed(seed))

    mrr_identity = mrr(identity)
    loss_before = train_loss(identity)
    log(f"{len(train)} training examples, {len(held_queries)} held-out queries over "
        f"{len(held_docs)} documents; untrained head: loss {loss_before:.4f}"
        + (f", held-out MRR {mrr_identity:.4f}" if mrr_identity is not None else ""))
    losses: list[float] = []
    epoch_log: list[dict[str, Any]] = []
    steps_per_epoch = math.ceil(len(train) / batch_size)
    bar = tqdm(total=epochs * steps_per_epoch, desc="training the field head", disable=not progress)
    try:
        for epoch in range(1, epochs + 1):
            order = torch.randperm(len(train), generator=generator).tolist()
            first = len(losses)
            for batch in batches(order):
                loss = batch_loss(identity + delta, batch)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.item()))
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
            trained = mrr((identity + delta).detach())
            entry = {"epoch": epoch, "loss": float(np.mean(losses[first:])),
                     "mrr_identity": mrr_identity, "mrr_trained": trained}
            epoch_log.append(entry)
            log(f"epoch {epoch}/{epochs}: loss {entry['loss']:.4f}"
                + (f", held-out MRR {trained:.4f} (untrained head {mrr_identity:.4f})"
                   if trained is not None else ""))
    finally:
        bar.close()

    W = (identity + delta).detach()
    if not torch.isfinite(W).all():
        raise ModelError("training diverged: the head holds non-finite values (lower the learning rate)")
    describe = getattr(encoder, "describe", None)
    report = FieldHeadReport(
        W=W.numpy().astype(np.float32), losses=losses, epochs=epoch_log, mrr_before=mrr_identity,
        mrr_after=epoch_log[-1]["mrr_trained"] if epoch_log else mrr_identity,
        loss_before=loss_before, loss_after=train_loss(W), counts=counts, config=config,
        encoder=describe() if callable(describe) else None,
        seconds=round(time.perf_counter() - started, 3),
        held_out_queries=[query_texts[q] for q in held_queries])
    if report.improved is False:
        log("the trained head does not rank held-out queries better than the untrained one")
    return report


# -- saving -------------------------------------------------------------------------------------

def save_head(path: str | Path, W: np.ndarray, meta: dict[str, Any]) -> None:
    """Write ``W`` as the tensor ``"W"`` (float32) of a safetensors file, atomically.

    ``meta`` (data file, settings, counts, before/after MRR, encoder checksums: see
    :meth:`FieldHeadReport.metadata`) is stored as the file's string metadata, each value
    JSON-encoded, with ``format`` added. The file is what ``FieldAttentionReranker(head=PATH)``
    and ``load_head`` read.
    """
    from safetensors.numpy import save

    from vecplug.errors import StorageError
    from vecplug.fsutil import atomic_write_bytes

    w = np.ascontiguousarray(np.asarray(W, dtype=np.float32))
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"a field head is a square matrix, got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("a field head must hold finite values")
    metadata = {"format": json.dumps(HEAD_FORMAT)}
    for key, value in meta.items():
        # default=str: a Path or a numpy number in the metadata is recorded, not a crash
        metadata[str(key)] = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    data = save({"W": w}, metadata=metadata)
    p = Path(path).expanduser()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p, data)
    except OSError as exc:
        # the temporary file is removed and an earlier head at ``path`` is left as it was
        raise StorageError(f"cannot write the field head {p}: {exc.strerror or exc}") from exc


def read_head_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata :func:`save_head` recorded in a head file, decoded."""
    from safetensors import safe_open

    with safe_open(str(Path(path).expanduser()), framework="numpy") as fh:
        raw = fh.metadata() or {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            out[key] = json.loads(value)
        except ValueError:  # written by something else: kept as the string it is
            out[key] = value
    return out
