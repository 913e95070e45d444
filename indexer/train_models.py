"""The models ``vecplug train`` trains: a bi-encoder (mean pooling, as vecplug encodes) or a
cross-encoder (a sequence-classification head with one logit), with their tokenisation.

Kept apart from the loop in :mod:`vecplug.indexer.train` so that held-out evaluation and the
loop share one definition of "what the model says about these texts".
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vecplug.errors import ModelError
from vecplug.indexer.models import ModelInfo, quiet_transformers


def _quiet_load(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        with quiet_transformers():  # "some weights newly initialised" is expected: a new head
            return fn(*args, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not load {args[0]}: {exc}") from exc
    except RuntimeError as exc:  # transformers' "size mismatch" of a head with other labels
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not load {args[0]} for this training: {first} (a cross-encoder with "
                         "another number of labels than 1: start from its base model)") from exc


def keep_layers(model: Any, k: int) -> list[int]:
    """Cut a BERT/XLM-R style model to ``k`` evenly spread layers (first and last kept)."""
    from vecplug.indexer.student import pick_layers

    base = getattr(model, model.base_model_prefix, model)
    try:
        layers = base.encoder.layer
    except AttributeError:
        raise ModelError(f"cannot cut the layers of a {type(model).__name__}") from None
    chosen = pick_layers(len(layers), k, "spread")
    base.encoder.layer = torch.nn.ModuleList([layers[i] for i in chosen])
    model.config.num_hidden_layers = len(chosen)
    return chosen


class TrainableModel:
    """A tokenizer and a transformer in training; ``kind`` says how texts become scores."""

    def __init__(self, info: ModelInfo, kind: str, max_length: int, layers: int | None = None,
                 freeze_word_embeddings: bool = True) -> None:
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        if info.teacher is not None:
            raise ModelError(f"{info.spec} is a query student (it shares its teacher's vocabulary "
                             "table); train its teacher, then distil a new student from the result")
        if kind != "cross-encoder":
            from vecplug.indexer.encoder import refuse_cross_encoder

            refuse_cross_encoder(info, "base")  # its head would be dropped without a word
        self.info = info
        self.kind = kind
        self.tokenizer = _quiet_load(AutoTokenizer.from_pretrained, str(info.tokenizer_path),
                                     trust_remote_code=False)
        if kind == "cross-encoder":
            self.model = _quiet_load(AutoModelForSequenceClassification.from_pretrained, str(info.path),
                                     num_labels=1, trust_remote_code=False)
        else:
            try:
                self.model = _quiet_load(AutoModel.from_pretrained, str(info.path),
                                         trust_remote_code=False, add_pooling_layer=False)
            except TypeError:  # architectures without a pooler do not take the flag
                self.model = _quiet_load(AutoModel.from_pretrained, str(info.path), trust_remote_code=False)
        self.model = self.model.float()  # an fp16 checkpoint: CPU training runs in float32
        self.layers = keep_layers(self.model, layers) if layers else None
        if freeze_word_embeddings:
            self.model.get_input_embeddings().weight.requires_grad_(False)
        from vecplug.indexer.encoder import max_tokens

        # the positions and the tokenizer's own limit, as the encoder and the reranker that will
        # serve the model cut texts (a tokenizer saying 128 beside 512 positions trained on more)
        self.max_length = min(max_length, max_tokens(info))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def prefix(self, which: str) -> str:
        """``query`` / ``document`` -> the model's prefix; anything else is the prefix itself."""
        if which == "query":
            return self.info.query_prefix
        if which == "document":
            return self.info.document_prefix
        return which

    def embed(self, texts: Sequence[str], prefix: str) -> torch.Tensor:
        """Unit vectors (n, dim) of ``texts``, mean-pooled as :class:`TextEncoder` does."""
        enc = self.tokenizer([prefix + t for t in texts], truncation=True, max_length=self.max_length,
                             padding=True, return_tensors="pt", return_token_type_ids=False)
        hidden = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def score(self, queries: Sequence[str], docs: Sequence[str]) -> torch.Tensor:
        """Cross-encoder logits (n,) of (query, doc) pairs; the document side is cut first,
        as :class:`~vecplug.adapters.rerank.cross_encoder.CrossEncoderReranker` cuts it
        (:func:`~vecplug.indexer.encoder.pair_truncation`, chosen per pair by its query's
        length): training cut both sides, and so learned on queries the reranker reads whole."""
        from vecplug.indexer.encoder import pad_pairs, pair_truncation

        queries, docs = list(queries), list(docs)
        specials = int(self.tokenizer.num_special_tokens_to_add(pair=True))
        lengths = [len(ids) for ids in self.tokenizer(queries, add_special_tokens=False)["input_ids"]]
        by_rule: dict[str, list[int]] = {}
        for i, n in enumerate(lengths):
            by_rule.setdefault(pair_truncation(n, specials, self.max_length), []).append(i)
        rows: list[dict[str, list[int]]] = [{} for _ in queries]
        for rule, idx in by_rule.items():
            enc = self.tokenizer([queries[i] for i in idx], [docs[i] for i in idx], truncation=rule,
                                 max_length=self.max_length)
            for j, i in enumerate(idx):
                rows[i] = {k: enc[k][j] for k in ("input_ids", "token_type_ids") if k in enc}
        # padded here, as the reranker pads: the groups were cut apart
        return self.model(**pad_pairs(rows, self.pad_id)).logits[:, 0]

    @torch.inference_mode()
    def embed_all(self, texts: Sequence[str], prefix: str, batch: int = 64) -> np.ndarray:
        """:meth:`embed` in eval mode, batched, sorted by length; numpy float32."""
        was = self.model.training
        self.model.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), int(self.model.config.hidden_size)), dtype=np.float32)
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            out[idx] = self.embed([texts[i] for i in idx], prefix).float().numpy()
        self.model.train(was)
        return out

    @torch.inference_mode()
    def score_all(self, pairs: Sequence[tuple[str, str]], batch: int = 64) -> np.ndarray:
        was = self.model.training
        self.model.eval()
        out = np.zeros(len(pairs), dtype=np.float32)
        for s in range(0, len(pairs), batch):
            chunk = pairs[s:s + batch]
            out[s:s + len(chunk)] = self.score([q for q, _ in chunk], [d for _, d in chunk]).float().numpy()
        self.model.train(was)
        return out


class EncoderView:
    """The model under training seen as a vecplug encoder (``encode_queries`` /
    ``encode_documents``), for evaluators such as the XQuAD-R score."""

    def __init__(self, model: TrainableModel) -> None:
        self.model = model

    def encode_queries(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        return self.model.embed_all(texts, self.model.prefix("query"))

    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        return self.model.embed_all(texts, self.model.prefix("document"))
