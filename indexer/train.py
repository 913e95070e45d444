"""``vecplug train``: multi-task fine-tuning of a document encoder or a cross-encoder.

The methods of the seed papers: each task is a dataset with a loss (in-batch ranking, triplet
with batch-all / hard / semi-hard negatives, cross-entropy on the cosine, smooth ordinal loss,
supervised SimCSE; pointwise / RankNet / listwise for cross-encoders); tasks are interleaved by
a schedule (sequential, random, proportional to their sizes: the Microsoft paper's best);
batches are composed by language (X-Y, X-X-mono) or group (LAReQA; Reimers & Gurevych).

The run is seeded and resumable: a checkpoint every ``checkpoint_every`` steps in
``<output>.train-work/`` is picked up by the same command with the same config and data.
The result is a Hugging Face model folder (``model.safetensors``, tokenizer, ``config.json``)
plus ``vecplug.json`` recording its parent, prefixes, data, config and evaluations, so that
``vecplug index --model``, ``vecplug distill --teacher`` and the cross-encoder reranker take it
as it is. It is written to a temporary folder and renamed into place: never half-written.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vecplug.errors import ConfigError
from vecplug.indexer.train_config import (FIELD_HEAD_OPTIONS, KINDS, MINING, TASK_FORMATS, EvalConfig, TaskConfig,
                                          TrainConfig)
from vecplug.types import Problem

WORK = ".train-work"
Evaluator = Callable[[Any], Mapping[str, float]]


@dataclass
class TaskData:
    name: str
    config: TaskConfig
    train: list[Any]
    held_out: list[Any]
    record: dict[str, Any]


@dataclass
class TrainReport:
    folder: Path
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    resumed_at: int = 0


# -- checking the config ---------------------------------------------------------------

def validate(config: TrainConfig) -> None:
    """Refuse a config that cannot run, before any model is loaded."""
    from vecplug.indexer.batching import COMPOSITIONS, SCHEDULES
    from vecplug.indexer.losses import check_options, get_loss

    def bad(message: str) -> ConfigError:
        return ConfigError(f"train config: {message}")

    if config.kind not in KINDS:
        raise bad(f"kind '{config.kind}' is not one of {', '.join(KINDS)}")
    if not config.output:
        raise bad("output (the folder to write the trained model to) is required")
    if not config.tasks:
        raise bad("at least one task is required")
    if config.schedule not in SCHEDULES:
        raise bad(f"schedule '{config.schedule}' is not one of {', '.join(SCHEDULES)}")
    for name, value in (("epochs", config.epochs), ("batch_size", config.batch_size),
                        ("max_length", config.max_length), ("checkpoint_every", config.checkpoint_every)):
        if value < 1:
            raise bad(f"{name} must be at least 1, got {value}")
    if config.batch_size < 2:
        raise bad("batch_size must be at least 2 (in-batch negatives)")
    # NaN passes every comparison's negation: finite first
    for name, value in (("learning_rate", config.learning_rate), ("max_grad_norm", config.max_grad_norm)):
        if not (math.isfinite(value) and value > 0):
            raise bad(f"{name} must be a positive number, got {value}")
    if not (math.isfinite(config.weight_decay) and config.weight_decay >= 0):
        raise bad(f"weight_decay must be 0 or more, got {config.weight_decay}")
    if not 0 <= config.warmup < 1:
        raise bad(f"warmup must be in [0, 1), got {config.warmup}")
    for name, value in (("max_steps", config.max_steps), ("layers", config.layers),
                        ("eval.xquad_limit", config.eval.xquad_limit)):
        if value is not None and value < 1:
            raise bad(f"{name} must be at least 1 (or unset), got {value}")
    if config.eval.every < 0:
        raise bad(f"eval.every must be 0 (only before and after) or more, got {config.eval.every}")
    if not 0 <= config.eval.held_out < 0.5:
        raise bad(f"eval.held_out must be in [0, 0.5), got {config.eval.held_out}")
    if config.kind == "field-head":
        _validate_field_head(config)
        return
    if config.kind == "cross-encoder" and config.eval.xquad_r:
        # XQuAD-R scores an encoder's vectors; a cross-encoder has none (it was loaded, and
        # ignored without a word)
        raise bad("eval.xquad_r scores a bi-encoder's retrieval; a cross-encoder run does not use it: "
                  "remove it (score the trained reranker with vecplug eval --rerank cross-encoder:OUTPUT)")
    names = set()
    for i, task in enumerate(config.tasks):
        where = f"task {i + 1} ({task.name or task.data})"
        if not task.data:
            raise bad(f"{where}: data (a file or folder) is required")
        if task.format not in TASK_FORMATS or task.format == "fields":
            raise bad(f"{where}: format '{task.format}' is not one of {', '.join(TASK_FORMATS)}")
        spec = get_loss(task.loss)
        if spec.model != ("cross" if config.kind == "cross-encoder" else "bi"):
            raise bad(f"{where}: the loss '{task.loss}' is for {spec.model}-encoders, "
                      f"this config trains a {config.kind}")
        check_options(task.loss, dict(task.options))
        labelled = task.loss in ("cosine_bce", "smooth_ordinal")
        if labelled != (task.format == "labelled") and task.loss != "pointwise_bce":
            raise bad(f"{where}: the loss '{task.loss}' needs "
                      f"{'labelled pairs (format: labelled)' if labelled else 'pairs, triplets, query or tatoeba data'}")
        if task.composition not in COMPOSITIONS:
            raise bad(f"{where}: composition '{task.composition}' is not one of {', '.join(COMPOSITIONS)}")
        if not 0 <= task.easy_share <= 1:
            raise bad(f"{where}: easy_share must be in [0, 1]")
        if task.mine is not None:
            if task.mine.method not in MINING:
                raise bad(f"{where}: mine.method '{task.mine.method}' is not one of {', '.join(MINING)}")
            if task.mine.per_example < 1:
                raise bad(f"{where}: mine.per_example must be at least 1")
            if task.mine.skip_top < 0:
                raise bad(f"{where}: mine.skip_top must be 0 or more")
            similarity = task.mine.max_similarity
            if similarity is not None:
                if task.mine.method != "model":  # bm25 scores are no cosines: it was ignored
                    raise bad(f"{where}: mine.max_similarity is for method: model, not {task.mine.method}")
                if not (math.isfinite(similarity) and 0 < similarity <= 1):  # NaN fails every comparison
                    raise bad(f"{where}: mine.max_similarity must be in (0, 1] (a share of the positive's "
                              f"cosine), got {similarity}")
        if task.langs and task.format != "tatoeba":
            raise bad(f"{where}: langs picks Tatoeba languages; this task's format is {task.format}")
        if task.list_size < 2:
            raise bad(f"{where}: list_size must be at least 2")
        name = task_name(task, i)
        if name in names:
            raise bad(f"two tasks are named '{name}'; give them distinct names")
        names.add(name)


#: what a field-head run takes (the rest of a config is for bi- and cross-encoders): set to
#: anything but its default, another setting would be silently ignored, so it is refused
FIELD_HEAD_SETTINGS = ("model", "kind", "output", "tasks", "epochs", "batch_size", "learning_rate",
                       "weight_decay", "seed", "eval")
FIELD_HEAD_TASK_SETTINGS = ("data", "format", "options", "name")


def _validate_field_head(config: TrainConfig) -> None:
    if len(config.tasks) != 1 or config.tasks[0].format != "fields":
        raise ConfigError("train config: a field-head run takes one task with format: fields "
                          "(queries with documents split into fields)")
    options = config.tasks[0].options
    unknown = sorted(set(options) - set(FIELD_HEAD_OPTIONS))
    if unknown:
        raise ConfigError(f"train config: unknown field-head option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(FIELD_HEAD_OPTIONS)}")
    # options are free-form YAML: "abc" failed in the middle of the run with a TypeError, and
    # a bool passed as a number (true was a scale of 1.0)
    for name in ("scale", "loss_scale"):
        value = options.get(name)
        if name in options and (isinstance(value, bool) or not isinstance(value, (int, float))
                                or not (math.isfinite(value) and value > 0)):
            raise ConfigError(f"train config: field-head option {name} must be a positive number, got {value!r}")
    fields = options.get("fields")
    names = fields.split(",") if isinstance(fields, str) else fields
    if "fields" in options and not (isinstance(names, (list, tuple)) and all(isinstance(f, str) for f in names)
                                    and any(f.strip() for f in names)):
        raise ConfigError("train config: field-head option fields must be a field name, names separated "
                          f"by commas or a list of names (e.g. [title, text]), got {fields!r}")
    unused = [f.name for f in dataclasses.fields(config)
              if f.name not in FIELD_HEAD_SETTINGS and getattr(config, f.name) != getattr(TrainConfig(), f.name)]
    unused += [f"eval.{f.name}" for f in dataclasses.fields(config.eval)
               if f.name != "held_out" and getattr(config.eval, f.name) != getattr(EvalConfig(), f.name)]
    unused += [f"tasks[0].{f.name}" for f in dataclasses.fields(config.tasks[0])
               if f.name not in FIELD_HEAD_TASK_SETTINGS
               and getattr(config.tasks[0], f.name) != getattr(TaskConfig(), f.name)]
    if unused:
        raise ConfigError(f"train config: a field-head run does not use {', '.join(unused)}: remove "
                          f"{'it' if len(unused) == 1 else 'them'} (it takes: model, output, epochs, batch_size, "
                          "learning_rate, weight_decay, seed, eval.held_out and one task: data, format: fields, "
                          "options)")


def task_name(task: TaskConfig, i: int) -> str:
    return task.name or f"{Path(task.data).stem or 'task'}-{i + 1}"


# -- data ------------------------------------------------------------------------------

def _data_record(task: TaskConfig) -> dict[str, Any]:
    from vecplug.fsutil import file_sha256

    path = Path(task.data).expanduser()
    record: dict[str, Any] = {"data": str(task.data), "format": task.format, "loss": task.loss}
    if path.is_file():
        record["sha256"] = file_sha256(path)
    elif path.is_dir():  # a Tatoeba folder: one digest over its files' names and digests
        files = sorted(p for p in path.iterdir() if p.is_file())
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}\0{file_sha256(f)}\n".encode())
        record |= {"files": len(files), "sha256": h.hexdigest()}
    return record


def _labels_the_loss_takes(examples: list[Any], task: Any, problems: list[Problem]) -> list[Any]:
    """The examples whose label the task's loss can take; the others reported by path and
    line and skipped, before the model loads (not an error in the middle of training)."""
    from vecplug.indexer.losses import label_rule

    rule = label_rule(task.loss, task.options)
    if rule is None:
        return examples
    ok, takes = rule
    kept = []
    for ex in examples:
        if ex.label is None or ok(ex.label):
            kept.append(ex)
            continue
        path, _, line = ex.where.rpartition(":")
        problems.append(Problem(path, f"label {ex.label:g}: {task.loss} takes {takes}: skipped",
                                int(line) if line.isdigit() else None))
    return kept


def load_tasks(config: TrainConfig, problems: list[Problem], log: Callable[[str], None],
               embed: Callable[[Sequence[str], str], Any] | None = None) -> list[TaskData]:
    """Every task's examples, split into training and held-out, with mined negatives.
    ``embed(texts, prefix)``: the base model's unit vectors, ``prefix`` a task's
    ``anchor_prefix`` or ``other_prefix`` (``query``, ``document`` or the prefix itself)."""
    from vecplug.indexer import mining, train_data

    tasks = []
    for i, task in enumerate(config.tasks):
        name = task_name(task, i)
        path = Path(task.data).expanduser()
        if not path.exists():
            raise ConfigError(f"task '{name}': {path} does not exist")
        found: list[Problem] = []
        if task.format == "tatoeba":
            examples = train_data.load_tatoeba(path, max_pairs=task.max_examples, seed=config.seed,
                                               langs=list(task.langs) or None, problems=found)
        else:
            examples = train_data.load_examples(path, task.format, problems=found, fields=dict(task.fields) or None,
                                                max_examples=task.max_examples, seed=config.seed)
            examples = _labels_the_loss_takes(examples, task, found)
        problems += found
        train_data.log_problems(found, path, log)
        # a query with several positives trains on each of them, not on its first only
        examples = train_data.one_row_per_positive(examples)
        train, held = train_data.split_held_out(examples, config.eval.held_out, config.seed)
        record = _data_record(task) | {"examples": len(train), "held_out": len(held)}
        if task.mine is not None:
            if task.mine.method == "bm25":
                result = mining.mine_bm25(train, per_example=task.mine.per_example,
                                          skip_top=task.mine.skip_top, seed=config.seed)
            else:
                if embed is None:
                    raise ConfigError(f"task '{name}': mining with the model needs a bi-encoder")
                # each side with its prefix, as training embeds them: anchors (queries) with
                # the anchor prefix, the pool and positives with the other
                result = mining.mine_with_model(
                    train, lambda texts, which=task.other_prefix: embed(texts, which),
                    embed_anchors=lambda texts, which=task.anchor_prefix: embed(texts, which),
                    per_example=task.mine.per_example, skip_top=task.mine.skip_top,
                    max_similarity=task.mine.max_similarity)
            train = list(result.examples)
            record["mining"] = {"method": task.mine.method, "short": result.short,
                                "rejected_positives": result.rejected_positives}
            log(f"task '{name}': mined {task.mine.method} negatives "
                f"({result.short} examples got fewer than {task.mine.per_example})")
        if len(train) < 2:
            raise ConfigError(f"task '{name}': {len(train)} training example(s) in {path}; need at least 2")
        log(f"task '{name}': {len(train)} training examples, {len(held)} held out")
        tasks.append(TaskData(name, task, train, held, record))
    return tasks


def plan_steps(config: TrainConfig, tasks: list[TaskData], log: Callable[[str], None]) -> list[tuple[int, str, list[int]]]:
    """(epoch, task, example indices) for every step of the run, deterministic given the seed."""
    from vecplug.indexer.batching import compose_batches, schedule

    steps: list[tuple[int, str, list[int]]] = []
    by_name = {t.name: t for t in tasks}
    for epoch in range(config.epochs):
        batches = {}
        for t in tasks:
            c = t.config
            batches[t.name] = compose_batches(t.train, config.batch_size, composition=c.composition,
                                              easy_share=c.easy_share, by_group=c.by_group,
                                              seed=config.seed, epoch=epoch,
                                              warn=log if epoch == 0 else (lambda m: None))
        single: dict[str, int] = {}
        for name, number in schedule({n: len(b) for n, b in batches.items()}, config.schedule,
                                     seed=config.seed, epoch=epoch):
            batch = batches[name][number]
            if len(batch) >= 2 or by_name[name].config.loss in ("cosine_bce", "smooth_ordinal", "pointwise_bce"):
                steps.append((epoch, name, list(batch)))
            else:  # one row has no in-batch negative to learn from
                single[name] = single.get(name, 0) + 1
        if epoch == 0:
            for name, n in single.items():
                log(f"task '{name}': {n} batch{'es' * (n != 1)} of a single example (a language, group or "
                    "anchor with one example) skipped each epoch: its loss needs other rows")
        if config.max_steps is not None and len(steps) >= config.max_steps:
            break
    return steps[:config.max_steps] if config.max_steps is not None else steps


def _fingerprint(config: TrainConfig, base_checksum: str, tasks: list[TaskData], *, version: int = 3) -> str:
    """What a checkpoint and a finished output are recognised by: the config (but where it is
    written and how often it checkpoints), the base model and the data: the model by its
    checksum and the tasks' data by their contents, not by how their paths are written
    (``./tiny`` and ``/abs/tiny`` are one run). Older formulas, still recognised as finished
    runs: ``version`` 2 (before 2026-11-30) hashed those paths as written, 1 (before
    2026-11-24) the texts and labels only."""
    h = hashlib.sha256()
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("checkpoint_every", "output")}
    if version >= 3:
        settings.pop("model", None)
        settings["tasks"] = [{k: v for k, v in task.items() if k != "data"} for task in settings.get("tasks", [])]
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    h.update(base_checksum.encode())
    if version == 1:
        for t in tasks:
            for e in t.train:
                h.update(json.dumps([e.anchor, e.positives, e.negatives, e.label], ensure_ascii=False).encode())
        return h.hexdigest()[:16]
    # every field that shapes the batches or the measures (languages: mono batches; group;
    # the held-out examples), not where an example was read
    for t in tasks:
        for part in (t.train, t.held_out):
            h.update(str(len(part)).encode())
            for e in part:
                values = ([getattr(e, f.name) for f in dataclasses.fields(e) if f.name != "where"]
                          if dataclasses.is_dataclass(e) else repr(e))
                h.update(json.dumps(values, ensure_ascii=False, default=str).encode())
    return h.hexdigest()[:16]


# -- the run ---------------------------------------------------------------------------

def train(config: TrainConfig, *, progress: bool = True, log: Callable[[str], None] = lambda s: None,
          command: str | None = None, evaluators: Mapping[str, Evaluator] | None = None,
          stop_after: int | None = None) -> TrainReport | None:
    """Train as ``config`` says and write the model to ``config.output``.

    ``evaluators`` (bi-encoders): name -> function of an encoder view (``encode_queries``,
    ``encode_documents``) returning metrics; run before training, every ``eval.every`` steps and
    at the end, beside the held-out measures. ``stop_after``: end this run after that many
    steps (checkpointed) and return None: a time box, and how tests interrupt a run.
    Another run writing the same output is refused (IndexLockedError) before any work.
    """
    from vecplug.indexer import checkpoint

    validate(config)
    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"stop_after must be at least 1, got {stop_after}")
    out = Path(config.output).expanduser()
    work = out.parent / f"{out.name}{WORK}"
    held = checkpoint.lock(work)
    try:
        return _train(config, progress=progress, log=log, command=command, evaluators=evaluators,
                      stop_after=stop_after)
    finally:
        checkpoint.unlock(work, held)


def _train(config: TrainConfig, *, progress: bool, log: Callable[[str], None], command: str | None,
           evaluators: Mapping[str, Evaluator] | None, stop_after: int | None) -> TrainReport | None:
    """:func:`train`, its work folder held."""
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from vecplug.indexer import checkpoint
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.train_eval import evaluate_held_out
    from vecplug.indexer.train_models import EncoderView, TrainableModel
    from vecplug.indexer.train_step import loss_of

    started = time.perf_counter()
    out = Path(config.output).expanduser()
    info = resolve_model(config.model)
    torch.manual_seed(checkpoint.torch_seed(config.seed))
    model = TrainableModel(info, config.kind, config.max_length, config.layers,
                           config.freeze_word_embeddings)
    problems: list[Problem] = []
    embed = None
    if config.kind == "bi-encoder":
        embed = lambda texts, which: model.embed_all(list(texts), model.prefix(which))  # noqa: E731
    tasks = load_tasks(config, problems, log, embed)
    key = _fingerprint(config, info.checksum, tasks)
    if out.exists():
        meta = _read_json(out / "vecplug.json")
        done = meta.get("training", {}).get("fingerprint")
        if done is not None and done in (key, *(_fingerprint(config, info.checksum, tasks, version=v)
                                                 for v in (2, 1))):
            log(f"{out} already holds this training run's result")
            return TrainReport(out, int(meta["training"]["steps"]), 0.0,
                               evaluations=list(meta["training"].get("evaluations", [])))
        raise ConfigError(f"{out} exists and holds something else; remove it or choose another output")
    plan = plan_steps(config, tasks, log)
    if not plan:
        raise ConfigError("the tasks give no training batch")
    by_name = {t.name: t for t in tasks}
    total = len(plan)
    params = {n: p for n, p in model.model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(list(params.values()), lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    work = out.parent / f"{out.name}{WORK}"
    step, losses, evaluations = 0, [], []
    state = checkpoint.load(work, key, params, optimizer, log,
                            earlier=lambda: (_fingerprint(config, info.checksum, tasks, version=2),))
    if state is not None:
        step, losses, evaluations = int(state["step"]), list(state["losses"]), list(state["evaluations"])
        log(f"resuming at step {step} of {total}")
    resumed_at = step

    def run_evaluation(at: int) -> None:
        result: dict[str, Any] = {"step": at, "held_out": evaluate_held_out(model, tasks)}
        if config.kind == "bi-encoder":
            for name, fn in (evaluators or {}).items():
                result[name] = dict(fn(EncoderView(model)))
        evaluations.append(result)
        log(f"evaluation at step {at}: {json.dumps(result, ensure_ascii=False)}")

    if step == 0:
        run_evaluation(0)
    model.model.train()
    first = step
    bar = tqdm(total=total, initial=step, desc=f"training {config.kind}", disable=not progress)
    while step < total:
        epoch, name, batch = plan[step]
        task = by_name[name]
        torch.manual_seed(checkpoint.torch_seed(config.seed * 1_000_003 + step))  # dropout: the same after a resume
        loss = loss_of(model, task.config, [task.train[i] for i in batch])
        for g in optimizer.param_groups:
            g["lr"] = checkpoint.learning_rate(step, total, config.learning_rate, config.warmup)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), config.max_grad_norm)
        optimizer.step()
        value = float(loss.item())
        if not math.isfinite(value):
            raise ConfigError(f"the loss of task '{name}' became {value} at step {step}; "
                              "lower the learning rate or check the data")
        losses.append(round(value, 6))
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", task=name)
        if config.eval.every and step % config.eval.every == 0 and step < total:
            run_evaluation(step)
            model.model.train()
        if step < total and (step % config.checkpoint_every == 0
                             or (stop_after is not None and step - first >= stop_after)):
            checkpoint.save(work, params, optimizer, {"key": key, "step": step, "losses": losses,
                                                       "evaluations": evaluations})
            if stop_after is not None and step - first >= stop_after:
                bar.close()
                return None
    bar.close()
    run_evaluation(step)
    seconds = time.perf_counter() - started
    record = {
        "command": command or " ".join(sys.argv),
        "config": dataclasses.asdict(config),
        "fingerprint": key,
        "tasks": {t.name: t.record for t in tasks},
        "problems": len(problems),
        "steps": step,
        "final_loss": float(np.mean(losses[-50:])) if losses else None,
        "seconds": round(seconds, 1),
        "resumed_at": resumed_at or None,
        "evaluations": evaluations,
        "losses_every_10": losses[::10],
    }
    _write_model(model, out, config, record)
    shutil.rmtree(work, ignore_errors=True)
    return TrainReport(out, step, seconds, losses, evaluations, problems, resumed_at)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_model(model: Any, out: Path, config: TrainConfig, record: dict[str, Any]) -> None:
    """Save as a Hugging Face folder plus ``vecplug.json``; a temporary folder renamed at the end."""
    from vecplug.fsutil import fsync_path, make_readable
    from vecplug.indexer.checksums import weights_sha256
    from vecplug.indexer.models import quiet_transformers

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with quiet_transformers():  # no "Writing model shards" bar in the command's output
        model.model.save_pretrained(str(tmp), safe_serialization=True)
    model.tokenizer.save_pretrained(str(tmp))
    for leftover in tmp.glob("*.bin"):  # safetensors only: no pickle in our folders
        leftover.unlink()
    weights = sorted(tmp.glob("*.safetensors"))
    info = model.info
    meta: dict[str, Any] = {
        "name": out.name,
        "kind": "vecplug cross-encoder" if config.kind == "cross-encoder" else "vecplug fine-tuned encoder",
        "parent": {"model": config.model, "checksum": info.checksum,
                   "parent": _read_json(Path(info.path) / "vecplug.json").get("parent")},
        "layers": model.layers,
        "training": record,
    }
    if len(weights) == 1:
        meta["weights_sha256"] = weights_sha256(weights[0])
    if config.kind == "bi-encoder":
        meta |= {"query_prefix": info.query_prefix, "document_prefix": info.document_prefix,
                 "pooling": "mean", "normalize": True}
    (tmp / "vecplug.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    make_readable(tmp)  # save_pretrained leaves the weights 0600
    for f in tmp.iterdir():
        fsync_path(f)
    os.replace(tmp, out)
    fsync_path(out.parent)
