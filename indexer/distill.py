"""Distil a query student from a document encoder (the Microsoft "Unbiased Sentence Encoder"
recipe: a few-layer student trained with an L2 loss to reproduce the teacher's query vectors).

Training text is short and query-like, in many languages: Tatoeba's sentence pairs give
S(x) ~ T(x) for every sentence and S(translation) ~ T(English source) (Reimers & Gurevych
2020, multilingual knowledge distillation); a user's own texts add S(x) ~ T(x).

The loss is the squared distance between unit vectors, plus the same after removing the
teacher's mean vector: the teacher's vectors are anisotropic (two unrelated queries have
cosine ~0.73), and a plain MSE lets the student learn the shared direction and collapse.
Optionally (``contrastive_weight``) an in-batch ranking term asks each student vector to
score its own teacher vector above the other teacher vectors of the batch.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.errors import ConfigError, ModelError, ModelMismatchError, VecplugError
from vecplug.types import Problem

WORK = ".distill-work"
#: what student.json's ``kind`` says
STUDENT_KIND = "vecplug query student"
#: training texts whose activations rank the feed-forward neurons (``ffn_width``)
PRUNE_TEXTS = 1024
#: config fields added after runs were checkpointed, with their defaults: they count in a run's
#: fingerprint only when set, so a run checkpointed before they existed resumes
LATER_FIELDS: dict[str, Any] = {"ffn_width": None, "init": None, "shared_layers": 0}


@dataclass(frozen=True)
class DistillConfig:
    teacher: str = "me5-small"
    layers: int = 3
    #: "spread" (evenly spaced teacher layers, keeping the last) or "first"
    layer_choice: str = "spread"
    epochs: int = 2
    batch_size: int = 64
    learning_rate: float = 2e-4
    warmup: float = 0.05
    max_length: int = 64
    centered_weight: float = 1.0
    #: weight of an in-batch ranking term: each student vector must score its own teacher
    #: vector above the batch's others (InfoNCE, scale 20); it trains what retrieval uses
    contrastive_weight: float = 0.0
    contrastive_scale: float = 20.0
    seed: int = 0
    #: at most this many training texts (sampled evenly over the sources)
    max_texts: int = 40000
    checkpoint_every: int = 200
    tatoeba: str | None = None
    texts: tuple[str, ...] = ()
    #: register the student as the default query encoder of its teacher
    default_for: str | None = None
    #: a lower dimension (e.g. 128): documents are projected by PCA of the teacher's vectors,
    #: and the student learns a head into that space
    dim: int | None = None
    #: keep this many feed-forward neurons per layer (the teacher's are pruned to those that
    #: contribute most on the training texts before training): fewer FLOPs per query
    ffn_width: int | None = None
    #: start from this student of the same teacher (name or folder) instead of the teacher's
    #: layers: train it on, or (with ``ffn_width``) narrow a trained student and train it on;
    #: ``layers`` must be its layer count
    init: str | None = None
    #: the student's first N layers (and its embeddings) are the teacher's own, frozen: the
    #: teacher reranker then goes on from the student's layer N instead of encoding the query
    #: again, and such a student holds only its other layers
    shared_layers: int = 0

    def __post_init__(self) -> None:
        # refused before any work: a batch of 0 divided by zero after the teacher's targets were
        # encoded, 0 epochs saved an untrained student as a success, dim 0 meant "no --dim"
        for name in ("layers", "epochs", "batch_size", "max_length", "max_texts", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("dim", "ffn_width"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ConfigError(f"learning_rate must be a positive number, not {self.learning_rate}")
        for name in ("warmup", "centered_weight", "contrastive_weight", "contrastive_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, not {value}")
        if self.warmup >= 1:
            raise ConfigError(f"warmup is a fraction of the steps (below 1), not {self.warmup}")
        if not 0 <= self.shared_layers < self.layers:
            raise ConfigError(f"shared_layers must be between 0 and layers - 1 ({self.layers - 1}), "
                              f"not {self.shared_layers}")
        if self.shared_layers and (self.ffn_width is not None or self.init is not None):
            # pruning would change the shared layers; a student to start from has its own
            raise ConfigError("shared_layers cannot be combined with ffn_width or init")


@dataclass
class DistillReport:
    folder: Path
    steps: int
    seconds: float
    final_loss: float
    texts: int
    artifact_bytes: int
    losses: list[float] = field(default_factory=list)


def default_student_folder(teacher: str, layers: int, dim: int | None = None,
                           ffn_width: int | None = None, shared_layers: int = 0) -> Path:
    """Where ``vecplug distill`` writes a student without ``--out``:
    ``$VECPLUG_HOME/models/TEACHER-student-kN[-sS][-dD][-wW]``, which ``models list`` shows and
    ``--query-encoder`` takes by name. A name the package already ships (its default student)
    gets ``-local``: by name, the shipped student would be found instead of the new one."""
    from vecplug.indexer.models import BUILTIN_MODELS, BUILTIN_STUDENTS, models_dir

    base = Path(teacher).name if Path(teacher).exists() else teacher.replace("/", "--")
    name = (f"{base}-student-k{layers}{f'-s{shared_layers}' if shared_layers else ''}"
            f"{f'-d{dim}' if dim else ''}{f'-w{ffn_width}' if ffn_width else ''}")
    if name in BUILTIN_STUDENTS or name in BUILTIN_MODELS:
        name += "-local"
    return models_dir() / name


# -- training data ---------------------------------------------------------------------

def tatoeba_pairs(folder: Path, problems: list[Problem] | None = None) -> list[tuple[str, str, str]]:
    """(language, sentence, English source) for every line-aligned Tatoeba pair: the pairs
    ``vecplug train`` reads (:func:`~vecplug.indexer.train_data.tatoeba_lines`). Undecodable
    lines and files of different lengths are appended to ``problems`` (path and line) when
    it is given, and skipped."""
    from vecplug.indexer.train_data import tatoeba_files, tatoeba_lines

    return [(lang, x, e) for lang, other, eng in tatoeba_files(folder)
            for _, x, e in tatoeba_lines(other, eng, problems)]


def user_texts(spec: str, problems: list[Problem] | None = None) -> list[str]:
    """A file (one text per line) or a corpus folder (its passages, cut into sentences); a
    ``.jsonl``, ``.csv`` or ``.md`` file is read as a corpus file (records need a title,
    description or text field). What the corpus reader skips is appended to ``problems``
    (when given) by path and line."""
    path = Path(spec)
    if path.is_file() and path.suffix.lower() not in (".jsonl", ".csv", ".md"):
        return [t.strip() for t in path.read_text(encoding="utf-8", errors="replace").splitlines() if t.strip()]
    import re

    from vecplug.indexer.corpus import CorpusReader

    reader = CorpusReader(path, lambda text: [(m.start(), m.end()) for m in re.finditer(r"\S+", text)])
    out = []
    for doc in reader.documents():
        out += [s.strip() for s in re.split(r"(?<=[.!?。！？؟])\s+|\n+", doc.text) if 3 <= len(s.strip()) <= 300]
    if problems is not None:
        # the reader names files relative to what it walks: the folder, or a file's folder
        base = path if path.is_dir() else path.parent
        problems += [Problem(str(base / p.path), p.reason, p.line) for p in reader.problems]
    return out


def build_examples(config: DistillConfig,
                   problems: list[Problem] | None = None) -> tuple[list[str], list[str], dict[str, Any]]:
    """Student inputs and teacher target texts, aligned; plus a record of the data used.
    Bad Tatoeba lines and the records the corpus reader skips in ``texts`` are appended to
    ``problems`` (when given) and skipped; a ``texts`` source that gives no text is an error."""
    rng = random.Random(config.seed)
    examples: list[tuple[str, str]] = []
    record: dict[str, Any] = {}
    if config.tatoeba:
        pairs = tatoeba_pairs(Path(config.tatoeba), problems)
        rng.shuffle(pairs)
        # each pair gives up to three examples; keep the texts under max_texts
        pairs = pairs[: max(1, config.max_texts // 2)]
        for _, x, e in pairs:
            examples += [(x, x), (e, e), (x, e)]
        record["tatoeba"] = {"folder": str(config.tatoeba), "pairs": len(pairs),
                             "languages": len({p[0] for p in pairs})}
    for spec in config.texts:
        found: list[Problem] = []
        texts = user_texts(spec, found)
        if problems is not None:
            problems += found
        if not texts:
            # a queries.csv or .jsonl without title/description/text fields was read as an
            # empty corpus, and the run went on without it, saying nothing
            first = f"; first problem: {found[0]}" if found else ""
            raise VecplugError(f"--texts {spec} gave no training text{first}. A .csv, .jsonl or .md file is "
                               "read as a corpus (records with a title, description or text field); give "
                               "queries one per line in a text file (e.g. .txt)")
        rng.shuffle(texts)
        texts = texts[: config.max_texts]
        examples += [(t, t) for t in texts]
        record.setdefault("texts", []).append({"source": spec, "texts": len(texts)})
    if not examples:
        raise VecplugError("no training text: give --tatoeba DIR and/or --texts FILE_OR_FOLDER")
    return [a for a, _ in examples], [b for _, b in examples], record


def check_output(out: Path, teacher: Any) -> None:
    """Refuse ``out`` when writing the student there would destroy something: the student
    replaces the whole folder. Only a student of this same teacher (an earlier run's, the
    ``--init`` student trained on in place, or one of an earlier build of the teacher's folder,
    which no longer loads) may be replaced; never the teacher's own folder nor a folder inside
    it. ``teacher``: the resolved teacher (ModelInfo)."""
    from vecplug.indexer.student import is_student_folder, read_student_meta

    target, home = out.expanduser().resolve(), Path(teacher.path).resolve()
    if target == home or home in target.parents:
        raise ConfigError(f"--out {out} is the teacher's folder {home} or inside it: the student would "
                          "replace the teacher; choose another folder")
    if not out.exists():
        return
    if out.is_dir() and is_student_folder(out):
        try:
            meta = read_student_meta(out)
        except ModelError:
            meta = {}
        named = str(meta.get("teacher", ""))
        same_teacher = meta.get("teacher_checksum") == teacher.checksum or named == teacher.spec or (
            bool(named) and Path(named).expanduser().resolve() == home)  # that teacher rebuilt since
        if meta.get("kind") == STUDENT_KIND and same_teacher:
            return
    raise ConfigError(f"{out} exists and holds something else (not a student of {teacher.spec}); "
                      "remove it or choose another --out")


# -- the loop --------------------------------------------------------------------------

def _fingerprint(config: DistillConfig, inputs: list[str], targets: list[str], teacher_sum: str,
                 legacy: bool = False) -> str:
    """What a checkpoint is recognised by: the settings, the teacher by its checksum and the
    texts by their contents, not by how the teacher's and the texts' paths are written (a run
    resumed as ``--teacher ./m`` after ``--teacher /abs/m`` is the same run). ``legacy``: the
    formula before 2026-11-30, which hashed those paths as written (its checkpoints resume)."""
    h = hashlib.sha256()
    paths = () if legacy else ("teacher", "tatoeba", "texts")
    h.update(json.dumps({k: v for k, v in asdict(config).items()
                         if k != "checkpoint_every" and k not in paths
                         and not (k in LATER_FIELDS and v == LATER_FIELDS[k])},
                        sort_keys=True).encode())
    h.update(teacher_sum.encode())
    for a, b in zip(inputs, targets):
        h.update(a.encode() + b"\x00" + b.encode() + b"\x01")
    return h.hexdigest()[:16]


def _init_student(config: DistillConfig, teacher: Any) -> tuple[Any, list[int]]:
    """The student ``config.init`` names, loaded for training (sharing the teacher's frozen
    table), and the teacher layers it was made from; refused unless it is a student of this
    teacher with ``config.layers`` layers."""
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import load_student, read_student_meta

    info = resolve_model(config.init)
    if info.teacher is None or info.teacher.checksum != teacher.info.checksum:
        raise ModelMismatchError(f"--init {config.init} is not a student of {config.teacher} "
                                 f"({teacher.info.checksum[:12]})")
    meta = read_student_meta(info.path)
    if meta.get("projection_dim"):
        raise VecplugError(f"--init {config.init} is a lower-dimension student; start from a full one")
    layers = [int(i) for i in meta["layers"]]
    if len(layers) != config.layers:
        raise VecplugError(f"--init {config.init} has {len(layers)} layers; give -k {len(layers)}")
    student = load_student(info.path, teacher.info.path, teacher.info.checksum,
                           embeddings=teacher.model.get_input_embeddings().weight)
    return student, layers


def distill(config: DistillConfig, out: Path, progress: bool = True, command: str | None = None,
            log: Callable[[str], None] = lambda s: None, stop_after: int | None = None) -> DistillReport | None:
    """Train a student of ``config.teacher`` and write it to ``out``.

    Resumes from the checkpoint beside ``out`` when one from the same configuration and data
    exists. ``stop_after`` ends this run after that many steps (checkpointed) and returns None:
    a time box, and how the tests interrupt a run. Another run writing the same ``out`` is
    refused (IndexLockedError) before any work.
    """
    from vecplug.indexer import checkpoint
    from vecplug.indexer.encoder import refuse_cross_encoder
    from vecplug.indexer.models import resolve_model

    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"stop_after must be at least 1, got {stop_after}")
    started = time.perf_counter()
    teacher_info = resolve_model(config.teacher)
    if teacher_info.teacher is not None:  # before hours of training: its student could not load
        raise ModelError(f"{config.teacher} is a query student of {teacher_info.teacher.spec} (it has no "
                         f"vocabulary table of its own): distil from {teacher_info.teacher.spec}")
    refuse_cross_encoder(teacher_info, "teacher")
    check_output(out, teacher_info)  # before any work: the student replaces the whole folder
    work = out.parent / f"{out.name}{WORK}"
    held = checkpoint.lock(work)
    try:
        return _distill(config, out, teacher_info, work, started, progress=progress, command=command,
                        log=log, stop_after=stop_after)
    finally:
        checkpoint.unlock(work, held)


def _distill(config: DistillConfig, out: Path, teacher_info: Any, work: Path, started: float, *,
             progress: bool, command: str | None, log: Callable[[str], None],
             stop_after: int | None) -> DistillReport | None:
    """:func:`distill` from the resolved teacher, its work folder held."""
    import torch
    from tqdm.auto import tqdm

    from vecplug.indexer import checkpoint
    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import vecplug_home
    from vecplug.indexer.student import (check_frozen, freeze_shared, make_head, make_student, pca, pick_layers,
                                         prune_ffn, save_student)
    from vecplug.indexer.train_data import log_problems

    torch.manual_seed(checkpoint.torch_seed(config.seed))
    teacher = TextEncoder(teacher_info)
    full = int(getattr(teacher.model.config, "intermediate_size", 0))
    if config.ffn_width is not None and not 1 <= config.ffn_width <= full:  # before any work
        raise VecplugError(f"--ffn-width must be between 1 and the teacher's {full}, not {config.ffn_width}")
    problems: list[Problem] = []
    try:
        inputs, targets, data_record = build_examples(config, problems)
    finally:  # a source that gave no text: its skipped lines say why
        log_problems(problems, "the training data", log)
    if problems:
        data_record["problems"] = len(problems)
    key = _fingerprint(config, inputs, targets, teacher.info.checksum)
    prefix = teacher.info.query_prefix

    # teacher targets: encoded once per teacher and text set, cached (plain .npy, no pickle);
    # students of different sizes reuse them
    uniq = sorted(set(targets))
    h = hashlib.sha256(f"{teacher.info.checksum}|{prefix}|{config.max_length}".encode())
    for t in uniq:
        h.update(t.encode() + b"\x00")
    cache = vecplug_home() / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    target_file = cache / f"teacher-targets-{h.hexdigest()[:16]}.npy"
    if target_file.is_file():
        table = np.load(target_file, allow_pickle=False)
    else:
        log(f"encoding {len(uniq)} target texts with the teacher")
        table = teacher.encode(uniq, prefix, config.max_length, progress=progress, desc="teacher")
        tmp_file = target_file.with_suffix(".tmp.npy")
        np.save(tmp_file, table, allow_pickle=False)
        tmp_file.replace(target_file)
    index_of = {t: i for i, t in enumerate(uniq)}
    target_ids = np.asarray([index_of[t] for t in targets], dtype=np.int64)
    target_table = torch.from_numpy(table)
    mean = target_table.mean(0)

    if config.init:
        student, layers = _init_student(config, teacher)
    else:
        layers = pick_layers(teacher.model.config.num_hidden_layers, config.layers, config.layer_choice,
                             config.shared_layers)
        student = make_student(teacher.model, layers)
        if config.shared_layers:
            freeze_shared(student, config.shared_layers)
    student.eval()  # no dropout: this is regression onto fixed targets
    input_ids = teacher.tokenize(inputs, prefix, config.max_length)
    if config.ffn_width:
        sample = input_ids[::max(1, len(input_ids) // PRUNE_TEXTS)][:PRUNE_TEXTS]  # spread over the sources
        prune_ffn(student, config.ffn_width,
                  ({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
                   for _, ids, mask in teacher._batches(sample)))
    modules = torch.nn.ModuleDict({"student": student})
    projection = None
    if config.dim:
        if not 1 <= config.dim < target_table.shape[1]:
            raise VecplugError(f"--dim must be between 1 and {target_table.shape[1] - 1}")
        # documents will be mapped by this PCA; the student learns its own head into the space
        pca_mean, components = pca(target_table, config.dim)
        modules["head"] = make_head(pca_mean, components)
        target_table = torch.nn.functional.normalize((target_table - pca_mean) @ components, dim=-1)
        projection = (pca_mean, components)
    params = [p for p in modules.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(inputs) / config.batch_size)
    total = steps_per_epoch * config.epochs

    step, losses = 0, []
    named = {n: p for n, p in modules.named_parameters() if p.requires_grad}
    state = checkpoint.load(work, key, named, optimizer, log,
                            earlier=lambda: (_fingerprint(config, inputs, targets, teacher.info.checksum,
                                                          legacy=True),))
    if state is not None:
        step, losses = int(state["step"]), list(state["losses"])
        log(f"resuming at step {step} of {total}")

    def save_checkpoint() -> None:
        checkpoint.save(work, named, optimizer, {"key": key, "step": step, "losses": losses})

    pad = teacher.pad_id
    first_step = step
    bar = tqdm(total=total, initial=step, desc=f"distilling {len(layers)} layers", disable=not progress)
    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        order = np.random.default_rng(checkpoint.numpy_seed(config.seed + epoch)).permutation(len(inputs))
        batch = order[within * config.batch_size:(within + 1) * config.batch_size]
        longest = max(len(input_ids[i]) for i in batch)
        ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for r, i in enumerate(batch):
            ids[r, :len(input_ids[i])] = torch.tensor(input_ids[i])
            mask[r, :len(input_ids[i])] = 1
        hidden = student(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).float()
        pooled = (hidden * m).sum(1) / m.sum(1)
        if projection is not None:
            pooled = modules["head"](pooled)
        s = torch.nn.functional.normalize(pooled, dim=-1)
        t = target_table[torch.from_numpy(target_ids[batch])]
        loss = ((s - t) ** 2).sum(-1).mean()
        if config.contrastive_weight:
            tid = torch.from_numpy(target_ids[batch])
            logits = config.contrastive_scale * (s @ t.T)
            # the same target twice in a batch (x -> e and e -> e) is not a negative
            same = (tid[:, None] == tid[None, :]) & ~torch.eye(len(batch), dtype=torch.bool)
            logits = logits.masked_fill(same, float("-inf"))
            loss = loss + config.contrastive_weight * torch.nn.functional.cross_entropy(
                logits, torch.arange(len(batch)))
        if config.centered_weight and projection is None:  # a PCA space is centred already
            sc = torch.nn.functional.normalize(s - mean, dim=-1)
            tc = torch.nn.functional.normalize(t - mean, dim=-1)
            loss = loss + config.centered_weight * ((sc - tc) ** 2).sum(-1).mean()
        for g in optimizer.param_groups:
            g["lr"] = checkpoint.learning_rate(step, total, config.learning_rate, config.warmup)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(round(loss.item(), 6))
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if stop_after is not None and step - first_step >= stop_after and step < total:
            save_checkpoint()
            bar.close()
            return None
        if step % config.checkpoint_every == 0 and step < total:
            save_checkpoint()
    bar.close()

    seconds = time.perf_counter() - started
    meta = {
        "kind": STUDENT_KIND,
        "teacher": teacher.info.spec,  # a folder as an absolute path: found from any directory
        "teacher_checksum": teacher.info.checksum,
        "layers": layers,
        "shared_layers": config.shared_layers,
        "ffn_width": config.ffn_width,
        "init": config.init,
        "query_prefix": teacher.info.query_prefix,
        "document_prefix": teacher.info.document_prefix,
        "default_for": config.default_for,
        "training": {
            "command": command or " ".join(sys.argv),
            "config": asdict(config),
            "data": data_record,
            "examples": len(inputs),
            "steps": step,
            "final_loss": float(np.mean(losses[-50:])) if losses else None,
            "seconds": round(seconds, 1),
        },
    }
    if config.shared_layers:
        check_frozen(student, teacher.model, config.shared_layers)
    save_student(student, out, meta,
                 (projection[0], projection[1], modules["head"]) if projection is not None else None)
    shutil.rmtree(work, ignore_errors=True)
    size = sum(f.stat().st_size for f in out.iterdir())
    return DistillReport(out, step, seconds, meta["training"]["final_loss"] or 0.0, len(inputs), size, losses)

