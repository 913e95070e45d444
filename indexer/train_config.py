"""What ``vecplug train`` is asked to do: frozen dataclasses, read from YAML by ``vecplug.config``.

A config names a base model, the kind of model to train, and a list of tasks; each task is a
dataset and a loss::

    model: me5-small                  # built-in name, model folder or hub id
    kind: bi-encoder                  # or cross-encoder (a sequence-classification head on the
                                      # base), or field-head (the field-attention reranker's W,
                                      # over the frozen encoder ``model``; output: a .safetensors)
    output: models/me5-small-tatoeba
    epochs: 1
    batch_size: 64
    learning_rate: 2.0e-5
    schedule: proportional            # sequential | random | proportional (across tasks)
    tasks:
      - name: translations
        data: ../shared/data/tatoeba  # a JSONL/CSV file, or a Tatoeba folder (format: tatoeba)
        format: tatoeba               # pairs | triplets | labelled | query | tatoeba
        loss: ranking                 # see vecplug.indexer.losses.LOSSES
        options: {scale: 20, symmetric: true}
        composition: xy               # xy | mono | xx | random (batch composition)
        max_examples: 20000
    eval:
      held_out: 0.02                  # share of each task's examples kept out of training
      every: 100                      # steps between evaluations (0: only at the end)
      xquad_r: ../shared/data/xquad-r # optional: score XQuAD-R (never trained on) too
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("bi-encoder", "cross-encoder", "field-head")
TASK_FORMATS = ("pairs", "triplets", "labelled", "query", "tatoeba", "fields")
#: options of a field-head task (kind: field-head)
FIELD_HEAD_OPTIONS = ("scale", "loss_scale", "fields")
MINING = ("bm25", "model")


@dataclass(frozen=True)
class MiningConfig:
    """Hard negatives added to a task's examples before training."""

    #: bm25 (lexical, from the training texts) or model (the base model's embeddings)
    method: str = "bm25"
    per_example: int = 1
    #: skip the first N candidates (the very top is often an unlabelled positive)
    skip_top: int = 0
    #: model mining: drop candidates scoring above this factor times the positive's cosine
    max_similarity: float | None = None


@dataclass(frozen=True)
class TaskConfig:
    """One dataset and its loss."""

    data: str = ""
    loss: str = "ranking"
    name: str = ""
    format: str = "pairs"
    options: dict[str, Any] = field(default_factory=dict)
    #: our field name -> the file's column name (e.g. {anchor: question, positive: answer})
    fields: dict[str, Any] = field(default_factory=dict)
    composition: str = "random"
    #: share of plain random (easy) batches among the composed (hard) ones, e.g. 0.1
    easy_share: float = 0.0
    #: draw each batch from one ``group`` value of the data (subforum, tag)
    by_group: bool = False
    max_examples: int | None = None
    #: Tatoeba only: these languages (3-letter codes as in the file names, or their usual
    #: codes: ``de`` for ``deu``); read as vecplug.config's FILE_LANG_CODES (YAML's unquoted
    #: ``no`` is Norwegian, not false; ``DE`` is ``de``)
    langs: tuple[str, ...] = field(default=(), metadata={"lang_codes": "file"})
    mine: MiningConfig | None = None
    #: prefixes of the two sides: "query", "document" or a literal string
    anchor_prefix: str = "query"
    other_prefix: str = "document"
    #: cross-encoders: candidates per query for ranknet/listwise (own + in-batch negatives)
    list_size: int = 8


@dataclass(frozen=True)
class EvalConfig:
    held_out: float = 0.02
    #: steps between evaluations; 0 evaluates only before and after training
    every: int = 0
    #: an XQuAD-R folder to score (pooled mAP@20, X-Y) before and after; never trained on
    xquad_r: str | None = None
    #: read as vecplug.config's LANG_CODES (``no`` unquoted, ``DE``, ``zh-CN``)
    xquad_langs: tuple[str, ...] = field(default=(), metadata={"lang_codes": True})
    #: at most this many questions per language in the XQuAD-R score (None: all)
    xquad_limit: int | None = None


@dataclass(frozen=True)
class TrainConfig:
    model: str = "me5-small"
    kind: str = "bi-encoder"
    output: str = ""
    tasks: tuple[TaskConfig, ...] = ()
    epochs: int = 1
    #: stop after this many steps in all (None: the epochs decide)
    max_steps: int | None = None
    batch_size: int = 32
    learning_rate: float = 2e-5
    #: share of the steps with a linear warm-up; then linear decay to zero
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    schedule: str = "proportional"
    max_length: int = 128
    seed: int = 0
    checkpoint_every: int = 100
    #: keep the word-embedding table as it is: it is most of a multilingual model (250k x 384
    #: for me5-small), tokens absent from the data gain nothing from training it, and updating
    #: it costs about as much as the rest of a CPU step
    freeze_word_embeddings: bool = True
    #: cross-encoders: keep only these many of the base model's layers (evenly spread; None: all)
    layers: int | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
