"""`vecplug train`: config, validation, the loop (bi- and cross-encoders), resume, outputs that
the rest of vecplug takes as they are."""
from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from conftest import SHARED, TINY_TEXT
from vecplug.errors import ConfigError

if TYPE_CHECKING:
    import torch

WORDS = sorted({w for line in TINY_TEXT[:10] for w in line.split()})


def write_pairs(path: Path, n: int = 48, seed: int = 0, labelled: bool = False) -> Path:
    """Synthetic pairs: an anchor of three words and a positive that reorders them (plus a
    language tag, so batch composition has something to go by)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            words = rng.sample(WORDS, 3)
            other = list(reversed(words))
            if labelled:
                row = {"text1": " ".join(words), "text2": " ".join(other if i % 2 == 0 else rng.sample(WORDS, 3)),
                       "label": 1 if i % 2 == 0 else 0}
            else:
                row = {"anchor": " ".join(words), "positive": " ".join(other),
                       "anchor_lang": "en", "positive_lang": ["de", "es"][i % 2]}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_marked_triplets(path: Path, n: int = 48, seed: int = 0) -> Path:
    """Triplets a tiny random cross-encoder can learn in a few steps: the positive carries a
    marker word, the negative does not (matching words across the pair takes far longer)."""
    rng = random.Random(seed)
    plain = [w for w in WORDS if w != "water"]
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            words = rng.sample(plain, 3)
            fh.write(json.dumps({"anchor": " ".join(words), "positive": " ".join(words[::-1] + ["water"]),
                                 "negative": " ".join(rng.sample(plain, 3))}, ensure_ascii=False) + "\n")
    return path


def write_config(path: Path, **values: object) -> Path:
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def base_config(tmp_path: Path, model: Path, data: Path, **extra: object) -> dict:
    config = {"model": str(model), "output": str(tmp_path / "out"), "epochs": 2, "batch_size": 8,
              "learning_rate": 5e-3, "warmup": 0.0, "max_length": 32, "checkpoint_every": 2,
              "tasks": [{"name": "pairs", "data": str(data), "format": "pairs", "loss": "ranking",
                         "composition": "xy"}],
              "eval": {"held_out": 0.1}}
    config.update(extra)
    return config


# -- config -----------------------------------------------------------------------------

def test_config_rejects_unknown_keys_at_every_level(tmp_path: Path) -> None:
    from vecplug.config import load_train_config

    ok = {"model": "m", "output": "o", "tasks": [{"data": "d", "loss": "ranking", "mine": {"method": "bm25"}}]}
    config = load_train_config(write_config(tmp_path / "a.yaml", **ok))
    assert config.tasks[0].mine.method == "bm25" and config.tasks[0].options == {}
    for bad, word in ((dict(ok, epoch=2), "epoch"),
                      (dict(ok, tasks=[{"data": "d", "los": "x"}]), "los"),
                      (dict(ok, tasks=[{"data": "d", "mine": {"methd": "x"}}]), "methd"),
                      (dict(ok, eval={"heldout": 0.1}), "heldout")):
        with pytest.raises(ConfigError, match=word):
            load_train_config(write_config(tmp_path / "b.yaml", **bad))
    with pytest.raises(ConfigError, match="expected a list"):
        load_train_config(write_config(tmp_path / "c.yaml", **dict(ok, tasks="x")))


def test_config_is_safe_yaml_and_flags_override(tmp_path: Path) -> None:
    from vecplug.config import load_train_config

    evil = tmp_path / "evil.yaml"
    evil.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_train_config(evil)
    path = write_config(tmp_path / "a.yaml", model="m", output="o", epochs=3, tasks=[{"data": "d"}])
    config = load_train_config(path, {"epochs": 1, "seed": None, "output": "elsewhere"})
    assert (config.epochs, config.seed, config.output) == (1, 0, "elsewhere")


@pytest.mark.parametrize("change, message", [
    ({"kind": "cross-encoder", "eval": {"xquad_r": "x"}}, "a cross-encoder run does not use it"),
    ({"kind": "poly-encoder"}, "kind"),
    ({"schedule": "roundrobin"}, "schedule"),
    ({"batch_size": 1}, "batch_size"),
    ({"output": ""}, "output"),
    ({"tasks": []}, "at least one task"),
    ({"tasks": [{"data": "x", "loss": "listwise"}]}, "cross-encoders"),
    ({"tasks": [{"data": "x", "loss": "cosine_bce", "format": "pairs"}]}, "labelled"),
    ({"tasks": [{"data": "x", "loss": "ranking", "composition": "zigzag"}]}, "composition"),
    ({"tasks": [{"data": "x", "loss": "ranking", "options": {"scael": 20}}]}, "scael"),
    ({"tasks": [{"data": "x", "name": "a"}, {"data": "y", "name": "a"}]}, "distinct"),
    # values that passed and then ran wrong (a step dropped, NaN, torch's error after the load)
    ({"max_steps": -1}, "max_steps must be at least 1"),
    ({"max_grad_norm": float("nan")}, "max_grad_norm must be a positive number"),
    ({"learning_rate": float("inf")}, "learning_rate must be a positive number"),
    ({"weight_decay": -1}, "weight_decay must be 0 or more"),
    ({"eval": {"every": -1}}, "eval.every"),
    ({"eval": {"xquad_limit": -1}}, "eval.xquad_limit"),
    ({"layers": 0}, "layers must be at least 1"),
    ({"tasks": [{"data": "x", "langs": ["deu"]}]}, "langs picks Tatoeba languages"),
    ({"tasks": [{"data": "x", "mine": {"skip_top": -1}}]}, r"task 1 \(x\): mine.skip_top"),
    # max_similarity: NaN and negatives were taken, and with bm25 it was silently ignored
    ({"tasks": [{"data": "x", "mine": {"method": "model", "max_similarity": float("nan")}}]},
     r"mine.max_similarity must be in \(0, 1\].*got nan"),
    ({"tasks": [{"data": "x", "mine": {"method": "model", "max_similarity": -5}}]}, "max_similarity must be in"),
    ({"tasks": [{"data": "x", "mine": {"method": "model", "max_similarity": 1.5}}]}, "max_similarity must be in"),
    ({"tasks": [{"data": "x", "mine": {"method": "bm25", "max_similarity": 0.95}}]},
     "mine.max_similarity is for method: model, not bm25"),
    # a field-head run refuses what it would ignore
    ({"kind": "field-head", "max_steps": 1, "warmup": 0.5, "eval": {"every": 2},
      "tasks": [{"data": "x", "format": "fields", "loss": "triplet", "mine": {"method": "bm25"}}]},
     "does not use max_steps, warmup, eval.every, tasks\\[0\\].loss, tasks\\[0\\].mine"),
    # field-head options of the wrong type: a TypeError mid-run, or true taken as a scale of 1.0
    *[({"kind": "field-head", "tasks": [{"data": "x", "format": "fields", "options": options}]}, message)
      for options, message in (({"scale": "abc"}, "option scale must be a positive number, got 'abc'"),
                               ({"scale": True}, "option scale must be a positive number, got True"),
                               ({"loss_scale": float("nan")}, "option loss_scale must be a positive number"),
                               ({"loss_scale": 0}, "option loss_scale must be a positive number"),
                               ({"fields": 5}, "option fields must be a field name.*got 5"),
                               ({"fields": ["title", 3]}, "option fields must be"),
                               ({"fields": []}, "option fields must be"),
                               ({"fields": None}, "option fields must be"))],
])
def test_validate_refuses_configs_that_cannot_run(tmp_path: Path, change: dict, message: str) -> None:
    from vecplug.config import load_train_config
    from vecplug.indexer.train import validate

    values = {"model": "m", "output": "o", "tasks": [{"data": "x"}]} | change
    with pytest.raises(ConfigError, match=message):  # when loaded (a blank string) or checked
        validate(load_train_config(write_config(tmp_path / "c.yaml", **values)))


def test_field_head_options_of_the_right_types_pass(tmp_path: Path) -> None:
    from vecplug.config import load_train_config
    from vecplug.indexer.train import validate

    for options in ({"scale": 10, "loss_scale": 2.5, "fields": "title,text"}, {"fields": ["title", "text"]}):
        values = {"model": "m", "output": "o", "kind": "field-head",
                  "tasks": [{"data": "x", "format": "fields", "options": options}]}
        validate(load_train_config(write_config(tmp_path / "c.yaml", **values)))


def test_language_codes_of_a_train_config_are_read_as_settings_read_them(tmp_path: Path) -> None:
    """YAML reads an unquoted ``no`` (Norwegian) as false: ``langs: [de, no]`` failed with "no
    Tatoeba files for False". Tatoeba's langs and eval.xquad_langs now take codes as the
    settings do; a Tatoeba file's own three-letter code is kept (``cmn`` is that file only)."""
    from vecplug.config import load_train_config
    from vecplug.indexer.train import load_tasks

    folder = tmp_path / "tatoeba"
    folder.mkdir()
    for code, line in (("deu", "Hallo"), ("nob", "Hei"), ("fra", "Salut")):
        (folder / f"tatoeba.{code}-eng.{code}").write_text(f"{line}\n{line} igjen\n", encoding="utf-8")
        (folder / f"tatoeba.{code}-eng.eng").write_text("Hello\nHello again\n", encoding="utf-8")
    path = tmp_path / "c.yaml"
    path.write_text(f"model: m\noutput: o\n"
                    f"tasks: [{{data: {folder}, format: tatoeba, langs: [de, no, ' FRA', cmn, pt-BR]}}]\n"
                    "eval: {held_out: 0.0, xquad_langs: [DE, no, zh-CN]}\n")
    config = load_train_config(path)
    assert config.tasks[0].langs == ("de", "no", "fra", "cmn", "pt")
    assert config.eval.xquad_langs == ("de", "no", "zh")
    path.write_text(f"model: m\noutput: o\ntasks: [{{data: {folder}, format: tatoeba, langs: [de, no]}}]\n"
                    "eval: {held_out: 0.0}\n")
    (task,) = load_tasks(load_train_config(path), [], log=lambda m: None)
    assert {e.positive_lang for e in task.train} == {"de", "no"} and len(task.train) == 4
    path.write_text("model: m\noutput: o\ntasks: [{data: x, format: tatoeba, langs: [English]}]\n")
    with pytest.raises(ConfigError, match="tasks\\[0\\].langs: 'English' is not a language code"):
        load_train_config(path)


# -- the loop on a tiny model -------------------------------------------------------------

def _weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def _assert_same_weights(one: Path, two: Path) -> None:
    a, b = _weights(one), _weights(two)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)


def test_bi_encoder_trains_writes_a_model_vecplug_uses_and_records_it(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import resolve_model
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl")
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=4))
    report = run_training(config, progress=False)
    out = tmp_path / "out"
    assert report.folder == out and report.steps > 0
    first, last = np.mean(report.losses[:3]), np.mean(report.losses[-3:])
    assert last < first, report.losses
    before, after = report.evaluations[0]["held_out"]["pairs"], report.evaluations[-1]["held_out"]["pairs"]
    assert {"accuracy@1", "mrr@10", "alignment", "uniformity"} <= set(after)
    assert after["uniformity"] < before["uniformity"]  # the collapsed untrained space spreads out
    meta = json.loads((out / "vecplug.json").read_text())
    assert meta["parent"]["model"] == str(tiny_model)
    assert meta["training"]["tasks"]["pairs"]["sha256"] and meta["training"]["config"]["epochs"] == 4
    assert not list(out.glob("*.bin")) and not (tmp_path / "out.train-work").exists()
    # the result is a model folder vecplug encodes with, different from its parent
    info = resolve_model(str(out))
    assert info.checksum == meta["weights_sha256"] != resolve_model(str(tiny_model)).checksum
    vecs = TextEncoder(info).encode(["wasser kocht"], max_length=16)
    assert vecs.shape == (1, 32) and np.isclose(np.linalg.norm(vecs), 1.0)
    # the word table was frozen (the default), the layers were not
    w_new, w_old = _weights(out), _weights(tiny_model)
    key = next(k for k in w_new if k.endswith("word_embeddings.weight"))
    assert np.array_equal(w_new[key], w_old[key])
    layer = next(k for k in w_new if "layer.0" in k and k.endswith("query.weight"))
    assert not np.allclose(w_new[layer], w_old[layer])
    # the same command again finds the result and does nothing
    again = run_training(config, progress=False)
    assert again.steps == report.steps and again.seconds == 0.0
    # so does an output of the same run recorded by the fingerprint of earlier versions
    from vecplug.config import load_train_config
    from vecplug.indexer.train import _fingerprint, load_tasks

    loaded = load_train_config(config)
    meta = json.loads((out / "vecplug.json").read_text())
    meta["training"]["fingerprint"] = _fingerprint(loaded, resolve_model(str(tiny_model)).checksum,
                                                   load_tasks(loaded, [], lambda m: None), version=1)
    (out / "vecplug.json").write_text(json.dumps(meta))
    assert run_training(config, progress=False).seconds == 0.0


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl")
    one = write_config(tmp_path / "one.yaml", **base_config(tmp_path, tiny_model, data,
                                                             output=str(tmp_path / "one")))
    two = write_config(tmp_path / "two.yaml", **base_config(tmp_path, tiny_model, data,
                                                             output=str(tmp_path / "two")))
    straight = run_training(one, progress=False)
    assert run_training(two, progress=False, stop_after=3) is None
    assert (tmp_path / "two.train-work" / "state.json").is_file() and not (tmp_path / "two").exists()
    assert run_training(two, progress=False, stop_after=2) is None
    resumed = run_training(two, progress=False)
    assert resumed.resumed_at == 5 and resumed.losses == straight.losses
    _assert_same_weights(tmp_path / "one", tmp_path / "two")


def test_query_data_with_uneven_negatives_trains_and_resumes_to_the_same_weights(tmp_path: Path,
                                                                                tiny_model: Path) -> None:
    """Queries with one to three positives and zero to two negatives (own and mined): every
    positive is a row, every negative a column (padded where a row has fewer), and a resumed
    run still ends where an uninterrupted one does."""
    from vecplug.training import run_training

    rng = random.Random(3)
    data = tmp_path / "queries.jsonl"
    with open(data, "w", encoding="utf-8") as fh:
        for i in range(30):
            words = rng.sample(WORDS, 3)
            positives = [" ".join(words[::-1])] + [" ".join(rng.sample(words, 3)) + f" {k}" for k in range(i % 3)]
            row = {"query": " ".join(words), "positives": positives}
            if i % 2:
                row["negatives"] = [" ".join(rng.sample(WORDS, 3))]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    values = base_config(tmp_path, tiny_model, data, epochs=1)
    values["tasks"][0] |= {"format": "query", "mine": {"method": "bm25", "per_example": 1}}
    one = write_config(tmp_path / "one.yaml", **(values | {"output": str(tmp_path / "one")}))
    two = write_config(tmp_path / "two.yaml", **(values | {"output": str(tmp_path / "two")}))
    straight = run_training(one, progress=False)
    meta = json.loads((tmp_path / "one" / "vecplug.json").read_text())["training"]["tasks"]["pairs"]
    assert meta["examples"] + meta["held_out"] == 30 + (0 + 1 + 2) * 10  # one row per positive
    assert all(np.isfinite(straight.losses))
    assert run_training(two, progress=False, stop_after=2) is None
    resumed = run_training(two, progress=False)
    assert resumed.resumed_at == 2 and resumed.losses == straight.losses
    _assert_same_weights(tmp_path / "one", tmp_path / "two")


def test_a_run_is_one_run_however_its_paths_are_written(tmp_path: Path, tiny_model: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model and the data are recognised by their checksum and contents: the same run with
    its paths written relative (another spelling of the same files) finds its result, and an
    interrupted one resumes, where it was 'something else' and started over."""
    import shutil

    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl")
    absolute = write_config(tmp_path / "abs.yaml", **base_config(tmp_path, tiny_model, data))
    done = run_training(absolute, progress=False)
    shutil.copytree(tiny_model, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    relative = write_config(tmp_path / "rel.yaml", **base_config(tmp_path, Path("model"), Path("pairs.jsonl")))
    again = run_training(relative, progress=False)
    assert again.steps == done.steps and again.losses == []  # found, not trained again
    resumable = write_config(tmp_path / "res.yaml", **base_config(tmp_path, tiny_model, data,
                                                                 output=str(tmp_path / "res")))
    assert run_training(resumable, progress=False, stop_after=3) is None
    moved = write_config(tmp_path / "moved.yaml", **base_config(tmp_path, Path("model"), Path("pairs.jsonl"),
                                                                output=str(tmp_path / "res")))
    assert run_training(moved, progress=False).resumed_at == 3
    # what it trains on still counts
    other = write_pairs(tmp_path / "other.jsonl", seed=5)
    changed = write_config(tmp_path / "changed.yaml", **base_config(tmp_path, tiny_model, other))
    with pytest.raises(ConfigError, match="holds something else"):
        run_training(changed, progress=False)


def test_output_holding_something_else_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data))
    with pytest.raises(ConfigError, match="exists"):
        run_training(config, progress=False)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_the_trained_model_is_readable_by_everyone(tmp_path: Path, tiny_model: Path) -> None:
    """transformers writes the weights to a private temporary file (0600) and renames it: the
    trained model was unreadable by the other users and services that built models and
    students serve (0644 in a 0755 folder)."""
    import os
    import stat

    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl", n=24)
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=1, max_steps=1))
    old = os.umask(0o022)
    try:
        out = run_training(config, progress=False).folder
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_a_second_run_of_the_same_output_is_refused_while_one_runs(tmp_path: Path, tiny_model: Path) -> None:
    """Two runs of one config at once shared the work folder, deleted each other's checkpoint
    files, and the second to finish died with a FileNotFoundError traceback. The work folder
    is held for a run: another is refused at once, and the first's files are left alone."""
    from vecplug.errors import IndexLockedError
    from vecplug.fsutil import WriterLock
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl", n=24)
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=1, max_steps=2))
    work = tmp_path / "out.train-work"
    work.mkdir()
    (work / "state.json").write_text("{}")
    held = WriterLock(work)  # the first run, at work
    held.acquire()
    try:
        with pytest.raises(IndexLockedError, match=f"another run is writing {work}"):
            run_training(config, progress=False)
        assert (work / "state.json").is_file() and not (tmp_path / "out").exists()
    finally:
        held.release()
    report = run_training(config, progress=False)  # once it is done, the output is free
    assert report.steps == 2 and not work.exists()
    with pytest.raises(ConfigError, match="stop_after"):  # refused runs leave no work folder
        run_training(write_config(tmp_path / "u.yaml", **base_config(tmp_path, tiny_model, data,
                                                                     output=str(tmp_path / "other"))),
                     progress=False, stop_after=0)
    assert not (tmp_path / "other.train-work").exists()


def test_a_large_seed_trains_and_seeds_that_worked_are_unchanged(tmp_path: Path, tiny_model: Path) -> None:
    """The per-step seed (seed * 1,000,003 + step) overflowed torch.manual_seed for a seed of
    10**14, a RuntimeError after the model had loaded; it now wraps past torch's range only."""
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl", n=24)
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=1, max_steps=2))
    report = run_training(config, {"seed": 10**14}, progress=False)
    assert report.steps == 2 and all(np.isfinite(report.losses))
    from vecplug.indexer.checkpoint import torch_seed

    for value in (0, 7 * 1_000_003 + 5, -(1 << 63), (1 << 64) - 1):
        assert torch_seed(value) == value  # what worked is seeded as before
    assert torch_seed(10**14 * 1_000_003) == (10**14 * 1_000_003) % (1 << 64)

    # numpy's generators (BM25 mining's tie-break, distill's order, a field head's split) take
    # [0, 2**64): a negative seed, which torch and the config take, failed after the model loaded
    values = base_config(tmp_path, tiny_model, data, epochs=1, max_steps=2, output=str(tmp_path / "neg"))
    values["tasks"][0]["mine"] = {"method": "bm25"}
    report = run_training(write_config(tmp_path / "neg.yaml", **values), {"seed": -1}, progress=False)
    assert report.steps == 2


def test_multi_task_labelled_triplet_and_mined_negatives(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.training import run_training

    pairs = write_pairs(tmp_path / "pairs.jsonl")
    labelled = write_pairs(tmp_path / "labelled.jsonl", n=32, seed=1, labelled=True)
    values = base_config(tmp_path, tiny_model, pairs, epochs=1, schedule="random")
    values["tasks"] = [
        {"name": "triplets", "data": str(pairs), "loss": "triplet", "composition": "mono",
         "options": {"strategy": "semi_hard", "margin": 0.3}, "mine": {"method": "bm25", "per_example": 1}},
        {"name": "nli", "data": str(labelled), "format": "labelled", "loss": "cosine_bce"},
    ]
    report = run_training(write_config(tmp_path / "t.yaml", **values), progress=False)
    meta = json.loads((report.folder / "vecplug.json").read_text())
    tasks = meta["training"]["tasks"]
    assert set(tasks) == {"triplets", "nli"} and tasks["triplets"]["mining"]["method"] == "bm25"
    assert "score_gap" in report.evaluations[-1]["held_out"]["nli"]
    assert all(np.isfinite(report.losses))


def test_model_mining_embeds_anchors_with_the_anchor_prefix(tmp_path: Path, tiny_model: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Mining with the model embedded the anchors (queries) with the document prefix, so
    their neighbours were ranked in another space than training and evaluation use."""
    from vecplug.indexer import train_models
    from vecplug.training import run_training

    prefixes = {"query": "query: ", "document": "passage: "}
    monkeypatch.setattr(train_models.TrainableModel, "prefix", lambda self, which: prefixes.get(which, which))
    seen: list[tuple[str, list[str]]] = []
    embed_all = train_models.TrainableModel.embed_all

    def spy(self: object, texts: list[str], prefix: str, batch: int = 64) -> np.ndarray:
        seen.append((prefix, list(texts)))
        return embed_all(self, texts, prefix, batch)

    monkeypatch.setattr(train_models.TrainableModel, "embed_all", spy)
    data = write_pairs(tmp_path / "pairs.jsonl", n=24)
    values = base_config(tmp_path, tiny_model, data, epochs=1, max_steps=1, eval={"held_out": 0.0})
    values["tasks"][0]["mine"] = {"method": "model", "max_similarity": 0.99}
    run_training(write_config(tmp_path / "t.yaml", **values), progress=False)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    anchors, positives = [r["anchor"] for r in rows], [r["positive"] for r in rows]
    mined = seen[:3]  # the pool, then a block of anchors and of their positives
    assert [prefix for prefix, _ in mined] == ["passage: ", "query: ", "passage: "]
    assert sorted(mined[1][1]) == sorted(anchors) and sorted(mined[2][1]) == sorted(positives)


def test_bad_lines_are_reported_and_skipped(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl", n=24)
    with open(data, "a", encoding="utf-8") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"anchor": "only an anchor"}) + "\n")
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=1))
    logged: list[str] = []
    report = run_training(config, progress=False, log=logged.append)
    assert len(report.problems) == 2
    assert {p.line for p in report.problems} == {25, 26}
    assert any(f"{data}:25" in m for m in logged)


def test_cross_encoder_trains_and_reranks(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker
    from vecplug.training import run_training

    data = write_marked_triplets(tmp_path / "triplets.jsonl")
    for loss in ("listwise", "ranknet", "pointwise_bce"):
        values = base_config(tmp_path, tiny_model, data, kind="cross-encoder", epochs=6, layers=1,
                             learning_rate=3e-3, output=str(tmp_path / f"ce-{loss}"))
        values["tasks"][0] |= {"loss": loss, "format": "triplets", "list_size": 2}
        report = run_training(write_config(tmp_path / f"{loss}.yaml", **values), progress=False)
        assert np.mean(report.losses[-3:]) < 0.8 * np.mean(report.losses[:3]), (loss, report.losses)
        assert "mrr@10" in report.evaluations[-1]["held_out"]["pairs"]
        meta = json.loads((report.folder / "vecplug.json").read_text())
        assert meta["kind"] == "vecplug cross-encoder" and meta["layers"] == [1]
        reranker = CrossEncoderReranker(str(report.folder), max_length=32)
        scores = reranker.score_pairs([("wasser kocht", "water boils"), ("wasser kocht", "lazy dog")])
        assert scores.shape == (2,) and np.isfinite(scores).all()


def test_cross_encoder_training_cuts_pairs_as_the_reranker_does(tmp_path: Path, tiny_model: Path) -> None:
    """Training cut both sides of a long pair (longest_first), the reranker the document side
    (only_second, or both when the query alone fills the pair): a model was trained on shorter
    queries than it was then shown. The same folder scores the same in both."""
    from vecplug.adapters.rerank.cross_encoder import CrossEncoderReranker
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.train_models import TrainableModel

    model = TrainableModel(resolve_model(str(tiny_model)), "cross-encoder", 16)
    folder = tmp_path / "ce"
    model.model.save_pretrained(str(folder))
    model.tokenizer.save_pretrained(str(folder))
    long_query, long_doc = " ".join(["water boils"] * 6), " ".join(["the quick brown fox"] * 5)
    pairs = [(long_query, long_doc),                    # 12 query tokens: the document is cut
             ("wasser kocht", long_doc),                # a short query, in the same batch
             (" ".join(["water boils"] * 20), long_doc),  # the query alone is too long: both cut
             ("wasser kocht", "lazy dog")]              # nothing to cut
    # float32 as training computes, whatever this CPU's ``model.precision: auto`` is
    reranker = CrossEncoderReranker(str(folder), max_length=16, precision="float32")
    reranker.load()
    shown = [reranker._tokenize(q, [d])[0] for q, d in pairs]
    seen: list[dict] = []
    forward = model.model.forward
    model.model.forward = lambda **inputs: seen.append(inputs) or forward(**inputs)
    scores = model.score_all(pairs)
    (inputs,) = seen
    for row, expected in enumerate(shown):
        n = int(inputs["attention_mask"][row].sum())
        assert inputs["input_ids"][row, :n].tolist() == expected["input_ids"], pairs[row][0]
        if "token_type_ids" in expected:  # a tokenizer that gives them (not the tiny one's)
            assert inputs["token_type_ids"][row, :n].tolist() == expected["token_type_ids"]
        else:
            assert "token_type_ids" not in inputs
    assert [len(e["input_ids"]) for e in shown][:3] == [16, 16, 16]
    np.testing.assert_allclose(scores, reranker.score_pairs(pairs), rtol=1e-4, atol=1e-6)


def test_a_trained_cross_encoder_is_refused_as_an_encoder_of_texts(tmp_path: Path, tiny_model: Path) -> None:
    """A cross-encoder folder loaded as a document or query encoder without its head and
    gave vectors nothing was trained for, silently (the reranker refuses the reverse)."""
    from vecplug.cli import cli
    from vecplug.errors import ModelError
    from vecplug.indexer.distill import DistillConfig, distill
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.train_models import TrainableModel

    model = TrainableModel(resolve_model(str(tiny_model)), "cross-encoder", 32)
    folder = tmp_path / "ce"
    model.model.save_pretrained(str(folder))
    model.tokenizer.save_pretrained(str(folder))
    (folder / "vecplug.json").write_text(json.dumps({"kind": "vecplug cross-encoder"}))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("water boils at one hundred degrees")
    index = tmp_path / "index"
    result = CliRunner().invoke(cli, ["index", str(corpus), "--index", str(index), "--model", str(folder), "-q"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "is a cross-encoder" in result.output and f"--rerank cross-encoder:{folder}" in result.output
    assert not index.exists()
    with pytest.raises(ModelError, match="not a query encoder"):
        Encoder.from_specs(str(tiny_model), str(folder))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TINY_TEXT) + "\n")
    with pytest.raises(ModelError, match="not a teacher encoder"):
        distill(DistillConfig(teacher=str(folder), layers=1, texts=(str(texts),)), tmp_path / "s", progress=False)
    # nor the base of a bi-encoder's training (its head was dropped, the output called an encoder)
    with pytest.raises(ModelError, match="not a base encoder"):
        TrainableModel(resolve_model(str(folder)), "bi-encoder", 32)
    assert TrainableModel(resolve_model(str(folder)), "cross-encoder", 32).kind == "cross-encoder"


def test_training_cuts_texts_where_serving_does_and_names_a_head_it_cannot_take(
        tmp_path: Path, tiny_model: Path) -> None:
    """A tokenizer that keeps fewer tokens than the positions (a sentence-transformers base: 128
    beside 512) trained on longer texts than the encoder and the reranker ever read; a
    cross-encoder with two labels was a RuntimeError traceback."""
    import shutil

    from transformers import AutoModelForSequenceClassification

    from vecplug.errors import ModelError
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.train_models import TrainableModel

    short = tmp_path / "short"
    shutil.copytree(tiny_model, short)
    tok = json.loads((short / "tokenizer_config.json").read_text())
    (short / "tokenizer_config.json").write_text(json.dumps({**tok, "model_max_length": 16}))
    assert TrainableModel(resolve_model(str(short)), "bi-encoder", 32).max_length == 16
    two = tmp_path / "two-labels"
    AutoModelForSequenceClassification.from_pretrained(str(tiny_model), num_labels=2).save_pretrained(str(two))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, two / name)
    with pytest.raises(ModelError, match="another number of labels than 1"):
        TrainableModel(resolve_model(str(two)), "cross-encoder", 32)


def test_distill_from_a_trained_model_gives_its_student(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.indexer.distill import DistillConfig, distill
    from vecplug.indexer.models import resolve_model
    from vecplug.training import run_training

    data = write_pairs(tmp_path / "pairs.jsonl")
    trained = run_training(write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=1)),
                           progress=False).folder
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TINY_TEXT) + "\n")
    student = tmp_path / "student"
    distill(DistillConfig(teacher=str(trained), layers=1, epochs=1, batch_size=4, texts=(str(texts),)),
            student, progress=False)
    info = resolve_model(str(student))
    assert info.teacher is not None and info.teacher.path == trained.resolve()
    assert info.teacher.checksum == json.loads((trained / "vecplug.json").read_text())["weights_sha256"]


def test_cli_train(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.cli import cli

    data = write_pairs(tmp_path / "pairs.jsonl", n=24)
    config = write_config(tmp_path / "t.yaml", **base_config(tmp_path, tiny_model, data, epochs=1))
    result = CliRunner().invoke(cli, ["train", str(config), "-q", "--output", str(tmp_path / "cli-out")])
    assert result.exit_code == 0, result.output
    assert "model:" in result.output and "held_out: before" in result.output
    assert (tmp_path / "cli-out" / "vecplug.json").is_file()
    bad = write_config(tmp_path / "bad.yaml", **base_config(tmp_path, tiny_model, data, schedule="x"))
    result = CliRunner().invoke(cli, ["train", str(bad), "-q"])
    assert result.exit_code != 0 and "schedule" in result.output and "Traceback" not in result.output


def test_field_head_kind_trains_a_head_the_reranker_loads(tmp_path: Path, tiny_model: Path) -> None:
    from vecplug.adapters.rerank.fields import FieldAttentionReranker
    from vecplug.training import run_training

    rng = random.Random(0)
    data = tmp_path / "fields.jsonl"
    with open(data, "w", encoding="utf-8") as fh:
        for _ in range(30):
            words = rng.sample(WORDS, 3)
            fh.write(json.dumps({"query": " ".join(words), "document": {
                "title": " ".join(words[::-1]), "text": " ".join(rng.sample(WORDS, 5))}}) + "\n")
        fh.write("{broken\n")
    values = {"model": str(tiny_model), "kind": "field-head", "output": str(tmp_path / "head.safetensors"),
              "epochs": 2, "batch_size": 8, "learning_rate": 1e-2,
              "tasks": [{"data": str(data), "format": "fields", "options": {"scale": 10.0}}],
              "eval": {"held_out": 0.2}}
    report = run_training(write_config(tmp_path / "t.yaml", **values), progress=False)
    assert report.steps > 0 and [p.line for p in report.problems] == [31]
    assert report.evaluations[0]["held_out"]["mrr"] is not None
    reranker = FieldAttentionReranker(head=str(tmp_path / "head.safetensors"))
    assert reranker.weight.shape == (32, 32)
    values["tasks"][0]["options"] = {"temperature": 1}
    with pytest.raises(ConfigError, match="temperature"):
        run_training(write_config(tmp_path / "u.yaml", **values), progress=False)
    with pytest.raises(ConfigError, match="cannot be stopped and resumed"):
        run_training(write_config(tmp_path / "u.yaml", **values), progress=False, stop_after=1)


# -- the real model ---------------------------------------------------------------------------

@pytest.mark.slow
def test_real_model_few_steps_on_tatoeba_with_xquad_r(tmp_path: Path, built_me5: Path) -> None:
    """me5-small, a few steps of the worked example's recipe on Tatoeba, XQuAD-R scored."""
    tatoeba, xquad = SHARED / "data" / "tatoeba", SHARED / "data" / "xquad-r"
    if not tatoeba.is_dir() or not xquad.is_dir():
        pytest.skip("../shared/data is absent")
    from vecplug.indexer.encoder import Encoder
    from vecplug.training import run_training

    values = {"model": "me5-small", "output": str(tmp_path / "ft"), "epochs": 1, "max_steps": 3,
              "batch_size": 16, "max_length": 32, "learning_rate": 2e-5,
              "tasks": [{"data": str(tatoeba), "format": "tatoeba", "loss": "ranking", "composition": "xy",
                         "max_examples": 200, "options": {"symmetric": True}}],
              "eval": {"held_out": 0.1, "xquad_r": str(xquad), "xquad_langs": ["en", "de"], "xquad_limit": 10}}
    report = run_training(write_config(tmp_path / "t.yaml", **values), progress=False)
    assert report.steps == 3
    first, last = report.evaluations[0], report.evaluations[-1]
    for ev in (first, last):
        assert 0 < ev["xquad_r"]["map@20"] <= 1 and ev["xquad_r"]["questions"] == 20
    encoder = Encoder.from_specs(str(report.folder))
    q = encoder.encode_queries(["Wie viele Einwohner hat Berlin?"])
    d = encoder.encode_documents(["Berlin hat etwa 3,7 Millionen Einwohner.", "Der Hund schläft."])
    assert q.shape == (1, 384) and (d @ q[0])[0] > (d @ q[0])[1]


def test_labels_a_loss_cannot_take_are_reported_with_their_line(tmp_path: Path) -> None:
    """cosine_bce takes 0/1, smooth_ordinal whole grades up to its number of thresholds: other
    labels are skipped with path and line when the data loads, before any model does."""
    from vecplug.config import load_train_config
    from vecplug.indexer.train import load_tasks
    from vecplug.types import Problem

    rows = [(1, "a"), (0, "b"), (3, "c"), (1.5, "d"), (2, "e"), (1, "f"), (0, "g")]
    data = tmp_path / "graded.jsonl"
    data.write_text("".join(json.dumps({"text1": f"{w} one", "text2": f"{w} two", "label": g}) + "\n"
                            for g, w in rows))
    tasks = [{"name": "bce", "data": str(data), "format": "labelled", "loss": "cosine_bce"},
             {"name": "ordinal", "data": str(data), "format": "labelled", "loss": "smooth_ordinal",
              "options": {"thresholds": [0.3, 0.6]}}]
    config = load_train_config(write_config(tmp_path / "t.yaml", model="unused", output=str(tmp_path / "o"),
                                            tasks=tasks, eval={"held_out": 0.0}))
    problems: list[Problem] = []
    loaded = load_tasks(config, problems, log=lambda m: None)
    assert [len(t.train) for t in loaded] == [4, 5]
    assert [(p.line, p.reason) for p in problems] == [
        (3, "label 3: cosine_bce takes labels 0 or 1: skipped"),
        (4, "label 1.5: cosine_bce takes labels 0 or 1: skipped"),
        (5, "label 2: cosine_bce takes labels 0 or 1: skipped"),
        (3, "label 3: smooth_ordinal takes whole grades 0..2 with 2 thresholds: skipped"),
        (4, "label 1.5: smooth_ordinal takes whole grades 0..2 with 2 thresholds: skipped")]
    assert all(p.path == str(data) for p in problems)


# -- one step's tensors, held-out measures: a fake model with chosen vectors ----------------

class FakeModel:
    """A model whose vectors are given per text (unit-normalised), recording what it embeds;
    cross-encoder scores are the dot products of those vectors."""

    def __init__(self, vectors: dict[str, list[float]], kind: str = "bi-encoder") -> None:
        self.vectors = {t: np.asarray(v, dtype=np.float32) / np.linalg.norm(v) for t, v in vectors.items()}
        self.kind = kind
        self.seen: list[str] = []

    def prefix(self, which: str) -> str:
        return ""

    def embed(self, texts: list[str], prefix: str) -> "torch.Tensor":
        import torch

        self.seen += texts
        return torch.from_numpy(np.stack([self.vectors[t] for t in texts]))

    def embed_all(self, texts: list[str], prefix: str) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])

    def score_all(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        return np.array([self.vectors[q] @ self.vectors[d] for q, d in pairs], dtype=np.float32)


def ranking_by_hand(model: FakeModel, batch: list, scale: float, masked: set[tuple[int, str]] = frozenset(),
                    same: set[tuple[int, int]] = frozenset()) -> float:
    """Mean over rows of -log softmax at the row's own positive, the columns being every row's
    positive (but ``same`` (row, row) pairs) and every row's negatives (but ``masked``
    (row, text) pairs), from the definition."""
    v = model.vectors
    total = 0.0
    for i, e in enumerate(batch):
        cols = [scale * float(v[e.anchor] @ v[o.positives[0]]) for j, o in enumerate(batch) if (i, j) not in same]
        cols += [scale * float(v[e.anchor] @ v[n]) for o in batch for n in o.negatives if (i, n) not in masked]
        own = scale * float(v[e.anchor] @ v[e.positives[0]])
        total += -own + math.log(sum(math.exp(c) for c in cols))
    return total / len(batch)


def _vectors(texts: list[str], dim: int = 4, seed: int = 0) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(dim).tolist() for t in texts}


def test_every_row_keeps_all_its_hard_negatives(tmp_path: Path) -> None:
    """A row without negatives (or with fewer) no longer cuts the others' to its count: the
    missing ones are padding the loss masks."""
    from vecplug.indexer.train_config import TaskConfig
    from vecplug.indexer.train_data import Example
    from vecplug.indexer.train_step import loss_of

    batch = [Example("a0", ("p0",), ("n0", "m0")), Example("a1", ("p1",)), Example("a2", ("p2",), ("n2",))]
    model = FakeModel(_vectors(["a0", "a1", "a2", "p0", "p1", "p2", "n0", "m0", "n2"]))
    for loss, options in (("ranking", {"scale": 5.0}), ("simcse", {"temperature": 0.2})):
        model.seen = []
        got = loss_of(model, TaskConfig(loss=loss, options=options), batch).item()
        assert {"n0", "m0", "n2"} <= set(model.seen), loss
        assert got == pytest.approx(ranking_by_hand(model, batch, 5.0), abs=1e-4), loss
    # triplet: row 0 has two own negatives, row 2 one, row 1 only the batch's positives
    task = TaskConfig(loss="triplet", options={"strategy": "hard", "margin": 2.0})
    v = model.vectors
    dist = lambda x, y: 1.0 - float(v[x] @ v[y])  # noqa: E731
    per_row = [dist(e.anchor, e.positives[0]) + 2.0 - min(
        [dist(e.anchor, o.positives[0]) for o in batch if o is not e] + [dist(e.anchor, n) for n in e.negatives])
        for e in batch]
    assert loss_of(model, task, batch).item() == pytest.approx(np.mean(per_row), abs=1e-5)


def test_a_hard_negative_that_is_a_row_s_positive_is_not_its_negative(tmp_path: Path) -> None:
    """BM25 mines other rows' positives: row 0's negative is row 1's positive (in another case
    and spacing), a column every row scores against. It stays a negative for rows 0 and 2, and
    is none for row 1."""
    from vecplug.indexer.train_config import TaskConfig
    from vecplug.indexer.train_data import Example
    from vecplug.indexer.train_step import candidate_lists, loss_of

    batch = [Example("a0", ("p0",), ("P1  x",)), Example("a1", ("p1 X",)), Example("a2", ("p2",))]
    vectors = _vectors(["a0", "a1", "a2", "p0", "p1 X", "p2"], seed=1)
    model = FakeModel(vectors | {"P1  x": vectors["p1 X"]})
    got = loss_of(model, TaskConfig(loss="ranking", options={"scale": 5.0}), batch).item()
    assert got == pytest.approx(ranking_by_hand(model, batch, 5.0, masked={(1, "P1  x")}), abs=1e-4)
    assert got < ranking_by_hand(model, batch, 5.0) - 0.01
    # cross-encoder lists: a row's own negative that is a positive of its question is dropped
    same_question = [Example("q", ("p0",), ("p1", "n0")), Example("q", ("p1",))]
    lists, labels = candidate_lists(same_question, 8)
    assert lists == [["p0", "n0"], ["p1"]] and labels == [[1.0, 0.0], [1.0]]
    # other rows' positives from the next row on: each row's is a negative as often as any
    rows = [Example(f"q{i}", (f"d{i}",)) for i in range(5)]
    assert candidate_lists(rows, 2)[0] == [["d0", "d1"], ["d1", "d2"], ["d2", "d3"], ["d3", "d4"], ["d4", "d0"]]


def test_rows_are_linked_on_every_positive_and_normalised_texts() -> None:
    from vecplug.indexer.train_data import Example
    from vecplug.indexer.train_step import same_question_ids

    # q1 -> [p1, p2] and q2 -> [p2]: p2 is not a negative of q1
    assert same_question_ids([Example("q1", ("p1", "p2")), Example("q2", ("p2",))]).tolist() == [0, 0]
    # compared as the batches are composed (train_data.normalise: spaces collapsed, casefold)
    ids = same_question_ids([Example("Hello  World", ("a",)), Example("hello world", ("b",)),
                             Example("x", ("Straße",)), Example("y", ("STRASSE",)), Example("z", ("c",))])
    assert ids.tolist() == [0, 0, 2, 2, 4]


def test_simcse_masks_repeated_rows() -> None:
    from vecplug.indexer.train_config import TaskConfig
    from vecplug.indexer.train_data import Example
    from vecplug.indexer.train_step import loss_of

    batch = [Example("premise", ("entailed",)), Example("premise", ("entailed",)), Example("other", ("else",))]
    model = FakeModel(_vectors(["premise", "entailed", "other", "else"], seed=2))
    got = loss_of(model, TaskConfig(loss="simcse", options={"temperature": 0.5}), batch).item()
    assert got == pytest.approx(ranking_by_hand(model, batch, 2.0, same={(0, 1), (1, 0)}), abs=1e-5)


def test_a_query_with_several_positives_trains_on_each(tmp_path: Path) -> None:
    from vecplug.config import load_train_config
    from vecplug.indexer.train import load_tasks

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"query": "what is a cat", "positives": ["cats are felines", "a cat is a pet",
                                                                      "cat: an animal"]}) + "\n"
                    + json.dumps({"query": "what is a dog", "positives": ["dogs are canines"]}) + "\n")
    config = load_train_config(write_config(
        tmp_path / "t.yaml", model="unused", output=str(tmp_path / "o"), eval={"held_out": 0.0},
        tasks=[{"data": str(data), "format": "query", "loss": "ranking"}]))
    (task,) = load_tasks(config, [], log=lambda m: None)
    assert [(e.anchor, e.positives[0]) for e in task.train] == [
        ("what is a cat", "cats are felines"), ("what is a cat", "a cat is a pet"), ("what is a cat", "cat: an animal"),
        ("what is a dog", "dogs are canines")]
    # the others stay with each row: never its negatives
    assert set(task.train[1].positives) == {"cats are felines", "a cat is a pet", "cat: an animal"}


def test_labels_pointwise_bce_cannot_take_are_reported_with_their_line(tmp_path: Path) -> None:
    """Graded labels are no probabilities: reported and skipped when the data loads, not a
    LossInputError without file or line at the first step (and again on every resume)."""
    from vecplug.config import load_train_config
    from vecplug.indexer.train import load_tasks
    from vecplug.types import Problem

    data = tmp_path / "graded.jsonl"
    data.write_text("".join(json.dumps({"text1": f"q{i}", "text2": f"d{i}", "label": g}) + "\n"
                            for i, g in enumerate([0, 0.5, 2, 1, 3, 0.25])))
    config = load_train_config(write_config(
        tmp_path / "t.yaml", model="unused", kind="cross-encoder", output=str(tmp_path / "o"),
        eval={"held_out": 0.0}, tasks=[{"data": str(data), "format": "labelled", "loss": "pointwise_bce"}]))
    problems: list[Problem] = []
    (task,) = load_tasks(config, problems, log=lambda m: None)
    assert [e.label for e in task.train] == [0, 0.5, 1, 0.25]
    assert [(p.path, p.line, p.reason) for p in problems] == [
        (str(data), 3, "label 2: pointwise_bce takes labels in [0, 1]: skipped"),
        (str(data), 5, "label 3: pointwise_bce takes labels in [0, 1]: skipped")]


def test_bad_tatoeba_lines_are_reported_by_train(tmp_path: Path) -> None:
    from vecplug.config import load_train_config
    from vecplug.indexer.train import load_tasks
    from vecplug.types import Problem

    folder = tmp_path / "tatoeba"
    folder.mkdir()
    (folder / "tatoeba.deu-eng.deu").write_bytes(b"Hallo\n\xffkaputt\nDanke\nGut\n")
    (folder / "tatoeba.deu-eng.eng").write_text("Hello\nbroken\nThanks\nGood\nextra\n")
    config = load_train_config(write_config(
        tmp_path / "t.yaml", model="unused", output=str(tmp_path / "o"), eval={"held_out": 0.0},
        tasks=[{"data": str(folder), "format": "tatoeba", "loss": "ranking"}]))
    problems: list[Problem] = []
    logged: list[str] = []
    (task,) = load_tasks(config, problems, log=logged.append)
    assert [e.anchor for e in task.train] == ["Hello", "Thanks", "Good"]
    deu = str(folder / "tatoeba.deu-eng.deu")
    assert [(p.path, p.line) for p in problems] == [(deu, 2), (deu, None)]
    assert "4 lines" in problems[1].reason and any(f"{deu}:2: not valid UTF-8" in m for m in logged)


def test_held_out_ranks_leave_out_the_anchor_s_other_positives() -> None:
    """An English sentence with two held-out translations: the other translation ranking above
    a row's own is no miss (every row can rank first), for the bi- and the cross-encoder."""
    from vecplug.indexer.train import TaskData
    from vecplug.indexer.train_config import TaskConfig
    from vecplug.indexer.train_data import Example
    from vecplug.indexer.train_eval import evaluate_held_out

    held = [Example("Hello.", ("Hallo.",)), Example("Hello.", ("Bonjour.",)),
            Example("Thanks.", ("Danke.",)), Example("Yes.", ("Ja.",))]
    vectors = {"Hello.": [1, 0, 0], "Hallo.": [1, 0, 0], "Bonjour.": [0.9, 0.3, 0.3],
               "Thanks.": [0, 1, 0], "Danke.": [0, 1, 0], "Yes.": [0, 0, 1], "Ja.": [0, 0, 1]}
    task = TaskData("t", TaskConfig(), [], held, {})
    bi = evaluate_held_out(FakeModel(vectors), [task])["t"]
    assert (bi["accuracy@1"], bi["mrr@10"]) == (1.0, 1.0)
    # texts that are no positive of the anchor still count: Hallo. and Bonjour. for "Thanks."
    vectors["Thanks."] = [0.9, 0.1, 0.0]
    bi = evaluate_held_out(FakeModel(vectors), [task])["t"]
    assert (bi["accuracy@1"], bi["mrr@10"]) == (0.75, pytest.approx((1 + 1 + 1 / 3 + 1) / 4))
    vectors["Thanks."] = [0, 1, 0]
    cross = evaluate_held_out(FakeModel(vectors, kind="cross-encoder"), [task])["t"]
    assert (cross["accuracy@1"], cross["mrr@10"]) == (1.0, 1.0)
    # a collapsed model (every vector the same) ranks nothing first: ties count against it
    same = {text: [1.0, 1.0, 1.0] for text in vectors}
    for kind in ("bi-encoder", "cross-encoder"):
        collapsed = evaluate_held_out(FakeModel(same, kind=kind), [task])["t"]
        assert collapsed["accuracy@1"] == 0.0 and collapsed["mrr@10"] < 0.5
    # NaN (a diverged model) ranks last, not first (nor at rank -1: an MRR of inf)
    nan = {text: [float("nan")] * 3 for text in vectors}
    for kind in ("bi-encoder", "cross-encoder"):
        diverged = evaluate_held_out(FakeModel(nan, kind=kind), [task])["t"]
        assert (diverged["accuracy@1"], diverged["mrr@10"]) == (0.0, 0.0)


def test_the_resume_fingerprint_covers_languages_groups_and_held_out() -> None:
    """A run resumed after its data changed only in a language (which shapes mono batches), a
    group or a held-out example mixed the old checkpoint with another plan; where an example
    was read does not count."""
    from vecplug.indexer.train import TaskData, _fingerprint
    from vecplug.indexer.train_config import TaskConfig, TrainConfig
    from vecplug.indexer.train_data import Example

    def key(train: list[Example], held_out: list[Example]) -> str:
        return _fingerprint(TrainConfig(), "sum", [TaskData("t", TaskConfig(), train, held_out, {})])

    a = [Example("q", ("p",), anchor_lang="en", positive_lang="de", where="a.jsonl:1")]
    held = [Example("h", ("x",))]
    base = key(a, held)
    assert key([dataclasses.replace(a[0], where="b.jsonl:7")], held) == base
    for changed in (dataclasses.replace(a[0], positive_lang="fr"), dataclasses.replace(a[0], group="g")):
        assert key([changed], held) != base
    assert key(a, []) != base and key(a, [Example("h", ("y",))]) != base


def test_stop_after_must_be_at_least_one(tmp_path: Path) -> None:
    """stop_after=0 ran one step (and the CLI said "stopped after 0 steps")."""
    from vecplug.cli import cli
    from vecplug.config import load_train_config
    from vecplug.indexer.distill import DistillConfig, distill
    from vecplug.indexer.train import train

    config = load_train_config(write_config(tmp_path / "c.yaml", model="m", output=str(tmp_path / "o"),
                                            tasks=[{"data": "x"}]))
    with pytest.raises(ConfigError, match="stop_after must be at least 1"):
        train(config, stop_after=0, progress=False)
    with pytest.raises(ConfigError, match="stop_after must be at least 1"):
        distill(DistillConfig(teacher="m"), tmp_path / "s", progress=False, stop_after=0)
    result = CliRunner().invoke(cli, ["train", str(tmp_path / "c.yaml"), "--stop-after", "0"])
    assert result.exit_code != 0 and "--stop-after" in result.output


def test_single_example_batches_are_said_not_dropped_silently() -> None:
    """A mono batch of one (the only French pair) has no in-batch negative and is skipped: the
    run says so instead of never training that pair without a word."""
    from vecplug.indexer.train import TaskData, plan_steps
    from vecplug.indexer.train_config import TaskConfig, TrainConfig
    from vecplug.indexer.train_data import Example

    train = [Example(f"a{i}", (f"p{i}",), anchor_lang="en", positive_lang="de") for i in range(4)]
    train.append(Example("a9", ("p9",), anchor_lang="en", positive_lang="fr"))
    task = TaskData("t", TaskConfig(composition="mono"), train, [], {})
    said: list[str] = []
    steps = plan_steps(TrainConfig(batch_size=4, epochs=2), [task], said.append)
    assert sorted(i for _, _, batch in steps for i in batch) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert any("1 batch of a single example" in m for m in said)


def test_a_cross_encoder_s_held_out_labelled_pairs_are_scored() -> None:
    """A cross-encoder trained on labelled pairs held examples out and never scored them (its
    evaluations were empty); it gets the gap of its scores, as a bi-encoder its cosines."""
    from types import SimpleNamespace

    from vecplug.indexer.train_data import Example
    from vecplug.indexer.train_eval import evaluate_held_out

    held = [Example("q1", ("good",), label=1.0), Example("q2", ("bad",), label=0.0),
            Example("q3", ("good too",), label=1.0), Example("q4", ("bad too",), label=0.0)]
    model = SimpleNamespace(kind="cross-encoder",
                            score_all=lambda pairs: np.array([3.0 if "good" in d else -1.0 for _, d in pairs]))
    task = SimpleNamespace(name="nli", held_out=held, config=SimpleNamespace(format="labelled"))
    assert evaluate_held_out(model, [task]) == {"nli": {"examples": 4, "score_gap": 4.0}}
