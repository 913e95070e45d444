"""A cross-encoder reranker: a transformer reads the query and a candidate together.

Any Hugging Face sequence-classification model trained as a relevance cross-encoder works
(``AutoModelForSequenceClassification`` + ``AutoTokenizer``, never ``trust_remote_code``).
The model is a local folder or a hub id, resolved like the encoders' models (a hub id needs
the network the first time; offline it fails with a clear message).

Score of a (query, document) pair:

* ``num_labels == 1``: the single logit (the usual MS MARCO-style cross-encoder);
* ``num_labels == 2``: ``logit[1] - logit[0]``, the log-odds of "relevant" (label 1) against
  "not relevant" (label 0), which orders pairs as the softmax probability of label 1 does;
* more labels have no agreed meaning for relevance and are refused.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from vecplug.adapters.rerank import order_by_scores
from vecplug.adapters.rerank.base import Query, Reranker, RerankContext
from vecplug.adapters.stores.base import StoreHit
from vecplug.errors import ConfigError, ModelError
from vecplug.indexer.models import loading, quiet_transformers
from vecplug.indexer.precision import resolve_precision, to_bfloat16


class CrossEncoderReranker(Reranker):
    """Rescores each (query, candidate text) pair with a cross-encoder.

    ``model``: a local Hugging Face folder or a hub id (``org/name[@revision]``);
    ``max_length``: tokens per pair, the document side is cut first; ``batch_size``: pairs per
    forward pass; ``threads``: torch CPU threads (None: torch's default); ``precision``:
    ``model.precision``'s values (``auto``: bfloat16 on a CPU with AMX, where a batch of pairs
    runs several times faster; ``vecplug.indexer.precision``), scores returned as float32.

    The model folder is checked when the reranker is made (a missing folder fails at once);
    the weights load on first use or :meth:`warm_up`.
    """

    name: ClassVar[str] = "cross-encoder"

    def __init__(self, model: str, max_length: int = 256, batch_size: int = 32,
                 threads: int | None = None, precision: str | None = "auto") -> None:
        if max_length < 8:
            raise ConfigError(f"cross-encoder max_length must be at least 8 tokens, got {max_length}")
        if batch_size < 1:
            raise ConfigError(f"cross-encoder batch_size must be positive, got {batch_size}")
        self.spec = str(model)
        self.max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.threads = threads
        self.precision = resolve_precision(precision)
        self.path, self.checksum = _resolve(self.spec)
        self.model: Any = None
        self.tokenizer: Any = None
        self.num_labels: int | None = None
        self._limit = self.max_length
        self._pair_specials = 0
        # a fast tokenizer keeps its truncation as state of its Rust object, set by each call:
        # two threads' calls interleaved ran with each other's ("Second sequence not provided")
        self._tokenizing = threading.Lock()

    # -- loading -------------------------------------------------------------

    @loading  # once, whichever threads ask at once (see LOAD_LOCK)
    def load(self) -> None:
        """Load tokenizer and weights (once); refuse a model that is not a usable cross-encoder."""
        if self.model is not None:
            return
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from vecplug.indexer.encoder import position_limit

        if self.threads:
            torch.set_num_threads(self.threads)
        # the load report and progress bars are noise here: what matters is checked below
        try:
            with quiet_transformers():
                tokenizer = AutoTokenizer.from_pretrained(str(self.path), trust_remote_code=False)
                model, info = AutoModelForSequenceClassification.from_pretrained(
                    str(self.path), trust_remote_code=False, output_loading_info=True)
        except (OSError, ValueError) as exc:
            raise ModelError(f"could not load the cross-encoder {self.spec}: {exc}") from exc
        # A folder without a trained head (an embedding model, say) still loads, with a
        # randomly initialised classifier: its scores would be noise, so refuse it.
        missing = sorted(k for k in info.get("missing_keys", ()) if not k.endswith("position_ids"))
        if missing:
            raise ModelError(
                f"{self.spec} is not a trained cross-encoder: its folder lacks the weights "
                f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
        num_labels = int(model.config.num_labels)
        if num_labels not in (1, 2):
            raise ModelError(f"cross-encoder {self.spec} has {num_labels} labels; a relevance "
                             "score is defined for 1 (the logit) or 2 (logit[1] - logit[0])")
        model = model.float().eval()  # an fp16 checkpoint: 2x slower on a CPU
        if self.precision == "bfloat16":
            to_bfloat16(model)
        limits = [self.max_length, position_limit(model.config.to_dict())]
        if 0 < int(getattr(tokenizer, "model_max_length", 0) or 0) < 1_000_000:  # unset: a huge int
            limits.append(int(tokenizer.model_max_length))
        self._limit = min(limits)
        self._pair_specials = int(tokenizer.num_special_tokens_to_add(pair=True))
        self.tokenizer, self.model, self.num_labels = tokenizer, model, num_labels

    def warm_up(self, context: RerankContext) -> None:
        self.load()

    # -- scoring -------------------------------------------------------------

    def _tokenize(self, query: str, docs: Sequence[str]) -> list[dict[str, list[int]]]:
        """Each (query, doc) pair as token ids, at most ``max_length`` tokens.

        The document side is cut ("only_second"); when the query alone leaves no room for a
        document token, both sides are cut ("longest_first"), since "only_second" would fail.
        """
        from vecplug.indexer.encoder import pair_truncation

        tok = self.tokenizer
        with self._tokenizing:
            q_len = len(tok(query, add_special_tokens=False)["input_ids"])
            strategy = pair_truncation(q_len, self._pair_specials, self._limit)
            enc = tok([query] * len(docs), list(docs), truncation=strategy, max_length=self._limit,
                      padding=False)
        keys = [k for k in ("input_ids", "token_type_ids") if k in enc]  # the mask is rebuilt when padding
        return [{k: enc[k][i] for k in keys} for i in range(len(docs))]

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Relevance scores (float32) of ``(query, document)`` pairs; higher is more relevant."""
        import torch

        from vecplug.indexer.encoder import pad_pairs

        self.load()
        scores = np.zeros(len(pairs), dtype=np.float32)
        if not pairs:
            return scores
        # Tokenise per query: the truncation strategy depends on the query's length.
        by_query: dict[str, list[int]] = {}
        for i, (q, _) in enumerate(pairs):
            by_query.setdefault(q, []).append(i)
        encoded: list[dict[str, list[int]] | None] = [None] * len(pairs)
        for q, rows in by_query.items():
            for i, e in zip(rows, self._tokenize(q, [pairs[i][1] for i in rows])):
                encoded[i] = e
        items = cast("list[dict[str, list[int]]]", encoded)  # every pair was filled in above
        # Sorted by length, each batch pads to a near-equal length: less wasted compute.
        order = sorted(range(len(items)), key=lambda i: len(items[i]["input_ids"]), reverse=True)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                logits = self.model(**pad_pairs([items[i] for i in batch], pad_id)).logits.float()
                s = logits[:, 0] if self.num_labels == 1 else logits[:, 1] - logits[:, 0]
                scores[batch] = s.numpy()
        return scores

    def rerank(self, queries: Sequence[Query], candidates: Sequence[Sequence[StoreHit]],
               context: RerankContext) -> list[list[StoreHit]]:
        if len(queries) != len(candidates):
            raise ValueError(f"{len(queries)} queries but {len(candidates)} candidate lists")
        # every pair of every query in one pass, so batches fill across queries
        pairs = [(q.text, h.record.text) for q, cands in zip(queries, candidates) for h in cands]
        scores = self.score_pairs(pairs)
        out, start = [], 0
        for cands in candidates:
            out.append(order_by_scores(cands, scores[start:start + len(cands)]))
            start += len(cands)
        return out

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.spec, "path": str(self.path),
                "checksum": self.checksum, "max_length": self.max_length,
                "num_labels": self.num_labels, "precision": self.precision}


def _looks_like_path(spec: str) -> bool:
    """A spec that can only mean a folder (not a hub id ``org/name``)."""
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec


def _resolve(spec: str) -> tuple[Path, str | None]:
    """The model folder and its weights checksum, with errors that say what is wrong."""
    from vecplug.indexer.models import BUILTIN_MODELS, BUILTIN_STUDENTS, resolve_model

    if spec in BUILTIN_MODELS or spec in BUILTIN_STUDENTS:
        # resolving would build or load an embedding model, which has no relevance head
        raise ModelError(f"'{spec}' is one of vecplug's embedding models, not a cross-encoder; "
                         "give a cross-encoder's folder or hub id")
    path = Path(spec).expanduser()
    if not path.exists() and _looks_like_path(spec):
        raise ModelError(f"cross-encoder model folder {spec} does not exist")
    if path.exists() and not path.is_dir():
        raise ModelError(f"cross-encoder model {spec} is a file; give the model's folder")
    info = resolve_model(spec)  # folders and hub ids; offline hub ids fail with a clear message
    if info.teacher is not None:
        raise ModelError(f"{spec} is a query student, not a cross-encoder")
    try:
        config = json.loads((info.path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {info.path}/config.json: {exc}") from exc
    archs = config.get("architectures") or []
    # checked here, before any weights load, so that a wrong folder fails when it is named;
    # a folder that names no architecture is judged by its weights on load
    if archs and not any(str(a).endswith("ForSequenceClassification") for a in archs):
        raise ModelError(f"{spec} is a {', '.join(archs)}, not a cross-encoder "
                         "(a *ForSequenceClassification model)")
    return info.path, info.checksum
