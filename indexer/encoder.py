"""Text encoders: a Hugging Face transformer, mean pooling, L2 normalisation.

:class:`Encoder` has two slots, documents and queries. Documents are encoded once by the
document encoder; queries, while a user waits, by the query encoder, which defaults to the
document encoder and is where a distilled student goes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vecplug.indexer.models import ModelInfo, resolve_model

# Measured on XQuAD-R with me5-small (benchmarks/lengths.py): 99.9% of questions fit in
# 64 tokens with the prefix, and passages are cut at 256 tokens by the chunker anyway.
DEFAULT_QUERY_MAX_LENGTH = 64
DEFAULT_DOCUMENT_MAX_LENGTH = 256
# Padded tokens per forward pass: large enough to keep the matrix multiplies efficient,
# small enough that attention's (batch x length^2) memory stays modest.
DEFAULT_BATCH_TOKENS = 8192
MAX_BATCH_SIZE = 128


@dataclass(frozen=True)
class EncodeStats:
    texts: int
    tokens: int


class TextEncoder:
    """One transformer with its tokenizer; ``encode`` returns unit vectors (float32)."""

    def __init__(self, info: ModelInfo, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                 threads: int | None = None) -> None:
        import torch
        import transformers
        from transformers import AutoModel, AutoTokenizer

        self.info = info
        self.batch_tokens = batch_tokens
        if threads:
            torch.set_num_threads(threads)
        verbosity = transformers.logging.get_verbosity()
        bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()  # "pooler weights missing" is expected
        transformers.utils.logging.disable_progress_bar()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(info.path), trust_remote_code=False)
            try:
                self.model = AutoModel.from_pretrained(
                    str(info.path), trust_remote_code=False, add_pooling_layer=False)
            except TypeError:  # architectures without a pooler do not take the flag
                self.model = AutoModel.from_pretrained(str(info.path), trust_remote_code=False)
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bars:
                transformers.utils.logging.enable_progress_bar()
        self.model.eval()
        self.dim = int(self.model.config.hidden_size)
        self.model_max_length = int(getattr(self.model.config, "max_position_embeddings", 512))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.tokens_seen = 0

    def tokenize(self, texts: Sequence[str], prefix: str, max_length: int) -> list[list[int]]:
        limit = min(max_length, self.model_max_length)
        enc = self.tokenizer([prefix + t for t in texts], truncation=True, max_length=limit,
                             padding=False, return_attention_mask=False,
                             return_token_type_ids=False)
        return enc["input_ids"]

    def encode(self, texts: Sequence[str], prefix: str = "", max_length: int = 512,
               progress: bool | None = None, desc: str = "encoding") -> np.ndarray:
        """Embed ``texts`` (prefix prepended) into an (n, dim) float32 array of unit vectors."""
        import torch
        from tqdm.auto import tqdm

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokenize(texts, prefix, max_length)
        # Sort by length so each batch pads little; cap batches by padded tokens.
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        show = progress if progress is not None else len(texts) >= 512
        bar = tqdm(total=len(texts), desc=desc, unit="text", disable=not show, leave=False)
        start = 0
        with torch.inference_mode():
            while start < len(order):
                longest = len(ids[order[start]])
                size = max(1, min(MAX_BATCH_SIZE, self.batch_tokens // max(longest, 1)))
                batch = order[start:start + size]
                input_ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(batch), longest), dtype=torch.long)
                for row, i in enumerate(batch):
                    seq = ids[i]
                    input_ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
                    mask[row, :len(seq)] = 1
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[batch] = pooled.float().numpy()
                self.tokens_seen += int(mask.sum())
                bar.update(len(batch))
                start += size
        bar.close()
        return out

    def describe(self) -> dict[str, Any]:
        return {"model": self.info.spec, "checksum": self.info.checksum, "dim": self.dim}


class Encoder:
    """Documents and queries into one vector space.

    ``document`` encodes what gets indexed; ``query`` (default: the same model) encodes
    queries. Prefixes come from the model (``query: ``/``passage: `` for E5) unless given.
    """

    def __init__(self, document: TextEncoder, query: TextEncoder | None = None, *,
                 query_max_length: int = DEFAULT_QUERY_MAX_LENGTH,
                 document_max_length: int = DEFAULT_DOCUMENT_MAX_LENGTH,
                 query_prefix: str | None = None, document_prefix: str | None = None) -> None:
        self.document = document
        self.query = query or document
        if self.query.dim != self.document.dim:
            from vecplug.errors import ModelMismatchError

            raise ModelMismatchError(
                f"query encoder {self.query.info.spec} has dimension {self.query.dim}, "
                f"document encoder {self.document.info.spec} has {self.document.dim}")
        self.query_max_length = query_max_length
        self.document_max_length = document_max_length
        self.query_prefix = self.query.info.query_prefix if query_prefix is None else query_prefix
        self.document_prefix = (self.document.info.document_prefix
                                if document_prefix is None else document_prefix)

    @classmethod
    def from_specs(cls, document: str, query: str | None = None, *,
                   batch_tokens: int = DEFAULT_BATCH_TOKENS, threads: int | None = None,
                   **kwargs: Any) -> "Encoder":
        """Resolve (and if needed build) the models named by the specs and load them."""
        doc = TextEncoder(resolve_model(document), batch_tokens, threads)
        qry = TextEncoder(resolve_model(query), batch_tokens, threads) if query and query != document else None
        return cls(doc, qry, **kwargs)

    @property
    def dim(self) -> int:
        return self.document.dim

    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        return self.document.encode(texts, self.document_prefix, self.document_max_length,
                                    progress, desc="documents")

    def encode_queries(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        return self.query.encode(texts, self.query_prefix, self.query_max_length,
                                 progress, desc="queries")

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the document tokenizer, without specials or prefix."""
        return len(self.document.tokenizer(text, add_special_tokens=False)["input_ids"])

    def describe(self) -> dict[str, Any]:
        """What a manifest records to refuse a mismatched encoder later."""
        return {
            "document_encoder": self.document.info.spec,
            "document_encoder_checksum": self.document.info.checksum,
            "query_encoder": self.query.info.spec,
            "query_encoder_checksum": self.query.info.checksum,
            "dim": self.dim,
            "pooling": "mean",
            "normalize": True,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
            "query_max_length": self.query_max_length,
            "document_max_length": self.document_max_length,
        }

