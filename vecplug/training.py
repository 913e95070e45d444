"""``vecplug train`` from Python: read a config, add the XQuAD-R evaluator, run the trainer.

The XQuAD-R score during training is exact search over the pooled candidates (no index):
X-Y mAP@20 and the language-bias measures of :mod:`vecplug.metrics` (share of same-language
results in the top 10 beside the share a language-blind ranker would give). It is the
evaluation set: never trained on.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vecplug import metrics


def xquad_r_evaluator(folder: str, langs: tuple[str, ...] = (), limit: int | None = None) -> Callable[[Any], dict[str, float]]:
    """A function of an encoder (``encode_queries`` / ``encode_documents``) that scores it on
    XQuAD-R, pooled over ``langs`` (default: every language in ``folder``)."""
    from vecplug.indexer.datasets import load_xquad_r_dataset

    data = load_xquad_r_dataset(folder, list(langs) or None).limited(limit)
    doc_ids = [d.id for d in data.documents]
    doc_langs = [d.lang for d in data.documents]
    lang_of = dict(zip(doc_ids, doc_langs))

    def score(encoder: Any) -> dict[str, float]:
        docs = encoder.encode_documents([d.text for d in data.documents])
        queries = encoder.encode_queries([q.text for q in data.queries])
        ap, share, expected = [], [], []
        for qi, q in enumerate(data.queries):
            s = docs @ queries[qi]
            top = np.argpartition(-s, 20)[:20]
            top = top[np.argsort(-s[top])]
            ranked = [doc_ids[i] for i in top]
            relevant = data.qrels.get(q.id, {})
            ap.append(metrics.average_precision_at_k(ranked, relevant, 20))
            share.append(metrics.same_language_share([doc_langs[i] for i in top], q.lang, 10))
            expected.append(metrics.expected_same_language_share(
                [lang_of[d] for d, g in relevant.items() if g > 0 and d in lang_of], q.lang))
        return {"map@20": float(np.mean(ap)), "same_language_top10": float(np.mean(share)),
                "same_language_expected": float(np.mean(expected)), "questions": len(data.queries)}

    return score


def run_training(config_file: str | Path, overrides: Mapping[str, Any] | None = None, *,
                 progress: bool = True, log: Callable[[str], None] = lambda s: None,
                 command: str | None = None, stop_after: int | None = None) -> Any:
    """Train as the YAML ``config_file`` says (``overrides``: flag values, None ignored);
    returns the trainer's :class:`~vecplug.indexer.train.TrainReport` (None when stopped early)."""
    from vecplug.config import load_train_config
    from vecplug.indexer.train import train

    config = load_train_config(config_file, overrides)
    if config.kind == "field-head":
        if stop_after is not None:
            from vecplug.errors import ConfigError

            # a head trains in seconds to minutes and keeps no checkpoint to resume from
            raise ConfigError("a field-head run cannot be stopped and resumed (--stop-after): it runs whole")
        return train_field_head(config, progress=progress, log=log)
    evaluators = {}
    if config.eval.xquad_r:
        evaluators["xquad_r"] = xquad_r_evaluator(config.eval.xquad_r, config.eval.xquad_langs,
                                                  config.eval.xquad_limit)
    return train(config, progress=progress, log=log, command=command, evaluators=evaluators,
                 stop_after=stop_after)


def train_field_head(config: Any, *, progress: bool = True, log: Callable[[str], None] = lambda s: None) -> Any:
    """``kind: field-head``: learn the field-attention reranker's ``W`` over the frozen document
    encoder ``config.model`` from queries with documents split into fields; the head is written
    to ``config.output`` (use it as ``--rerank fields:PATH``)."""
    from vecplug.errors import ConfigError
    from vecplug.indexer import field_head
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.train import validate
    from vecplug.indexer.train_data import log_problems
    from vecplug.types import Problem

    validate(config)
    task = config.tasks[0]
    options = dict(task.options)
    fields = options.pop("fields", None) or field_head.DEFAULT_FIELDS
    problems: list[Problem] = []
    examples = field_head.load_field_examples(task.data, fields=fields, problems=problems)
    log_problems(problems, task.data, log)
    out = Path(config.output).expanduser()
    if out.exists():
        raise ConfigError(f"{out} exists; remove it or choose another output")
    report = field_head.train_field_head(
        examples, Encoder.from_specs(config.model), epochs=config.epochs, batch_size=config.batch_size,
        learning_rate=config.learning_rate, weight_decay=config.weight_decay, seed=config.seed,
        held_out=config.eval.held_out, progress=progress, log=log, **options)
    # the fields read, in order: the reranker reads the same ones from the head
    fields = list(field_head.field_names(fields))
    field_head.save_head(out, report.W, {**report.metadata(task.data), "fields": fields})
    from vecplug.indexer.train import TrainReport

    evaluations = [{"step": 0, "held_out": {"mrr": report.mrr_before}},
                   {"step": len(report.losses), "held_out": {"mrr": report.mrr_after}}]
    return TrainReport(out, len(report.losses), report.seconds, list(report.losses), evaluations, problems)
