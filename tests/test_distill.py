"""Query students: construction, sharing the teacher's table, training, resuming, refusing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_TEXT
from vecplug.errors import ModelMismatchError
from vecplug.indexer.distill import DistillConfig, distill
from vecplug.indexer.student import SHARED_KEY, make_student, pick_layers


def test_pick_layers() -> None:
    assert pick_layers(12, 3) == [0, 6, 11]
    assert pick_layers(12, 2) == [0, 11]
    assert pick_layers(12, 4) == [0, 4, 7, 11]
    assert pick_layers(12, 6) == [0, 2, 4, 7, 9, 11]
    assert pick_layers(12, 3, "first") == [0, 1, 2]
    assert pick_layers(2, 1) == [1]
    # shared layers come first, the others spread (or first) above them
    assert pick_layers(12, 7, "spread", 6) == [0, 1, 2, 3, 4, 5, 11]
    assert pick_layers(12, 8, "spread", 6) == [0, 1, 2, 3, 4, 5, 6, 11]
    assert pick_layers(12, 7, "first", 6) == [0, 1, 2, 3, 4, 5, 6]
    assert pick_layers(2, 2, "spread", 1) == [0, 1]


def test_bad_tatoeba_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    from vecplug.indexer.distill import build_examples
    from vecplug.types import Problem

    folder = tmp_path / "tatoeba"
    folder.mkdir()
    (folder / "tatoeba.deu-eng.deu").write_bytes(b"Hallo\n\xffkaputt\n" + "Danke\u2028sehr\n".encode())
    (folder / "tatoeba.deu-eng.eng").write_text("Hello\nbroken\nThanks a lot\n", encoding="utf-8")
    problems: list[Problem] = []
    inputs, targets, record = build_examples(DistillConfig(tatoeba=str(folder)), problems)
    assert problems == [Problem(str(folder / "tatoeba.deu-eng.deu"), "not valid UTF-8", 2)]
    assert record["tatoeba"]["pairs"] == 2
    # each pair gives (x, x), (e, e), (x, e): the U+2028 sentence stays with its own source
    assert ("Danke\u2028sehr", "Thanks a lot") in list(zip(inputs, targets))
    assert "broken" not in targets


def test_student_shares_the_frozen_table(tiny_model: Path) -> None:
    from transformers import AutoModel

    teacher = AutoModel.from_pretrained(str(tiny_model))
    student = make_student(teacher, [1])
    assert student.config.num_hidden_layers == 1
    table = student.get_input_embeddings().weight
    assert table.data_ptr() == teacher.get_input_embeddings().weight.data_ptr()
    assert not table.requires_grad
    # the kept layer is a copy of the teacher's second layer
    a = student.encoder.layer[0].attention.self.query.weight
    b = teacher.encoder.layer[1].attention.self.query.weight
    assert a.data_ptr() != b.data_ptr() and bool((a == b).all())


@pytest.fixture
def texts_file(tmp_path: Path) -> Path:
    f = tmp_path / "queries.txt"
    f.write_text("\n".join(TINY_TEXT * 4) + "\n")
    return f


def config(teacher: Path, texts: Path, **kw: object) -> DistillConfig:
    base = dict(teacher=str(teacher), layers=1, texts=(str(texts),), epochs=6, batch_size=8,
                learning_rate=1e-3, checkpoint_every=3, seed=0)
    base.update(kw)
    return DistillConfig(**base)  # type: ignore[arg-type]


def test_distill_learns_and_writes_a_small_artifact(tiny_model: Path, texts_file: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    out = tmp_path / "student"
    report = distill(config(tiny_model, texts_file), out, progress=False, command="test")
    assert report is not None and report.steps == 6 * 6
    assert np.mean(report.losses[-6:]) < 0.5 * np.mean(report.losses[:6])
    with safe_open(str(out / "student.safetensors"), framework="pt") as fh:
        assert SHARED_KEY not in fh.keys()
    teacher_bytes = (tiny_model / "model.safetensors").stat().st_size
    assert (out / "student.safetensors").stat().st_size < 0.6 * teacher_bytes
    meta = json.loads((out / "student.json").read_text())
    assert meta["layers"] == [1] and meta["training"]["command"] == "test"
    assert meta["training"]["data"]["texts"][0]["texts"] == len(TINY_TEXT) * 4
    assert not (tmp_path / "student.distill-work").exists()  # checkpoints cleaned up

    # the student encodes queries into the teacher's space, better than an untrained one
    from vecplug.indexer.encoder import Encoder

    enc = Encoder.from_specs(str(tiny_model), str(out))
    teacher_q = enc.document.encode(TINY_TEXT, "", 64)
    student_q = enc.encode_queries(TINY_TEXT)
    assert float((teacher_q * student_q).sum(1).mean()) > 0.9
    assert enc.query.model.get_input_embeddings().weight.data_ptr() == \
        enc.document.model.get_input_embeddings().weight.data_ptr()  # one table in memory
    assert enc.query.tokenizer is enc.document.tokenizer  # and one tokenizer


def test_a_teacher_given_by_a_relative_path_is_found_from_anywhere(tiny_model: Path, texts_file: Path,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """student.json names its teacher as resolved (a folder by its absolute path), not as typed:
    './tiny-bert' only worked from the directory distill ran in."""
    from vecplug.indexer.models import resolve_model

    monkeypatch.chdir(tiny_model.parent)
    out = tmp_path / "student"
    distill(config(Path("./" + tiny_model.name), texts_file, epochs=1), out, progress=False)
    assert json.loads((out / "student.json").read_text())["teacher"] == str(tiny_model.resolve())
    monkeypatch.chdir(tmp_path)
    info = resolve_model(str(out))
    assert info.teacher is not None and info.teacher.path == tiny_model.resolve()


def test_resume_equals_one_run(tiny_model: Path, texts_file: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cfg = config(tiny_model, texts_file, epochs=2)
    distill(cfg, tmp_path / "once", progress=False)
    assert distill(cfg, tmp_path / "twice", progress=False, stop_after=5) is None
    assert (tmp_path / "twice.distill-work" / "state.json").is_file()
    assert distill(cfg, tmp_path / "twice", progress=False, stop_after=4) is None
    report = distill(cfg, tmp_path / "twice", progress=False)
    assert report is not None and report.steps == 12
    a = load_file(str(tmp_path / "once" / "student.safetensors"))
    b = load_file(str(tmp_path / "twice" / "student.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), atol=1e-6, err_msg=k)


def test_a_student_never_builds_a_table_of_its_own(tiny_model: Path, tiny_student: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The student's config names the teacher's vocabulary; a table that size, randomly
    initialised and then dropped, was its load's peak memory. It is built with the fewest rows
    and takes the teacher's table, with its real size on the module and the config."""
    from transformers import AutoModel

    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import load_student

    built: list[int] = []
    real = AutoModel.from_config
    monkeypatch.setattr(AutoModel, "from_config",
                        lambda config, **kw: built.append(config.vocab_size) or real(config, **kw))
    teacher = resolve_model(str(tiny_model))
    model = load_student(tiny_student, teacher.path, teacher.checksum)
    table = model.get_input_embeddings()
    rows = int(table.weight.shape[0])
    assert built and max(built) == table.padding_idx + 1 < rows
    assert table.num_embeddings == model.config.vocab_size == rows


def test_student_of_another_teacher_is_refused(tiny_model: Path, other_tiny_model: Path,
                                               texts_file: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from vecplug.cli import cli

    student = tmp_path / "student-of-other"
    distill(config(other_tiny_model, texts_file, epochs=1), student, progress=False)
    own = tmp_path / "student-of-tiny"
    distill(config(tiny_model, texts_file, epochs=1), own, progress=False)
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("water boils at one hundred degrees")
    runner = CliRunner()
    out = runner.invoke(cli, ["index", str(corpus), "--model", str(tiny_model), "-q"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(cli, ["search", "water", "--query-encoder", str(student)])
    assert out.exit_code != 0 and "distilled from" in out.output
    assert str(student) in out.output and str(tiny_model) in out.output
    out = runner.invoke(cli, ["search", "water", "--query-encoder", str(own), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["hits"][0]["source"] == "a.txt"
    # loading the student against a teacher with another checksum is refused too
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import load_student

    other = resolve_model(str(other_tiny_model))
    with pytest.raises(ModelMismatchError, match="distilled from"):
        load_student(own, other.path, other.checksum)


def test_lower_dimension_student(tiny_model: Path, texts_file: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from vecplug.cli import cli
    from vecplug.indexer.encoder import Encoder

    out = tmp_path / "student-d8"
    report = distill(config(tiny_model, texts_file, dim=8), out, progress=False)
    assert report is not None and (out / "projection.safetensors").is_file()
    meta = json.loads((out / "student.json").read_text())
    assert meta["projection_dim"] == 8

    enc = Encoder.from_specs(str(tiny_model), str(out))
    assert enc.dim == 8 and enc.describe()["projection"]["dim"] == 8
    docs, queries = enc.encode_documents(TINY_TEXT), enc.encode_queries(TINY_TEXT)
    assert docs.shape == queries.shape == (len(TINY_TEXT), 8)
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert float((docs * queries).sum(1).mean()) > 0.8  # the student learned the projected space

    corpus = tmp_path / "c"
    corpus.mkdir()
    for i, text in enumerate(TINY_TEXT[:4]):
        (corpus / f"{i}.txt").write_text(text)
    runner = CliRunner()
    res = runner.invoke(cli, ["index", str(corpus), "--model", str(tiny_model), "--query-encoder", str(out), "-q"])
    assert res.exit_code == 0, res.output
    info = json.loads(runner.invoke(cli, ["info", "--json"]).output)
    assert info["manifest"]["dim"] == 8 and info["manifest"]["projection"]["dim"] == 8
    hits = json.loads(runner.invoke(cli, ["search", TINY_TEXT[2], "--json", "-k", "1"]).output)["hits"]
    assert hits[0]["source"] == "2.txt"
    res = runner.invoke(cli, ["search", "water", "--query-encoder", str(tiny_model)])
    assert res.exit_code != 0 and "projection mismatch" in res.output


def test_pruned_feed_forward_keeps_the_neurons_that_count(tiny_model: Path) -> None:
    """Neurons whose output weights are zero add nothing: pruning to the others leaves the
    model's output exactly as it was, and the config says the new width."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from vecplug.indexer.student import prune_ffn

    model = AutoModel.from_pretrained(str(tiny_model)).eval()
    full = model.config.intermediate_size
    dead = torch.arange(full) % 2 == 1  # every other neuron silenced
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.output.dense.weight[:, dead] = 0.0
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    batch = dict(tok(TINY_TEXT, padding=True, return_tensors="pt"))
    with torch.inference_mode():
        before = model(**batch).last_hidden_state
    prune_ffn(model, full // 2, [batch])
    assert model.config.intermediate_size == full // 2
    for layer in model.encoder.layer:
        assert layer.intermediate.dense.weight.shape == (full // 2, model.config.hidden_size)
        assert bool((layer.output.dense.weight != 0).all())  # only live neurons were kept
    with torch.inference_mode():
        after = model(**batch).last_hidden_state
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception, match="ffn-width must be between 1 and"):
        prune_ffn(model, full, [batch])


def test_narrow_student_distils_and_loads(tiny_model: Path, texts_file: Path) -> None:
    """``vecplug distill --ffn-width``: the student's config and record say the width, and it
    loads and encodes as any student does."""
    from click.testing import CliRunner

    from vecplug.cli import cli
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.models import models_dir

    res = CliRunner().invoke(cli, ["distill", "--teacher", str(tiny_model), "-k", "1", "--texts", str(texts_file),
                                   "--epochs", "6", "--batch-size", "8", "--lr", "1e-3", "--ffn-width", "8", "-q"])
    assert res.exit_code == 0, res.output
    out = models_dir() / f"{tiny_model.name}-student-k1-w8"
    assert str(out) in res.output
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 8
    assert json.loads((out / "student.json").read_text())["ffn_width"] == 8
    enc = Encoder.from_specs(str(tiny_model), str(out))
    docs, queries = enc.encode_documents(TINY_TEXT), enc.encode_queries(TINY_TEXT)
    assert float((docs * queries).sum(1).mean()) > 0.8  # it learned the teacher's space
    res = CliRunner().invoke(cli, ["distill", "--teacher", str(tiny_model), "-k", "1", "--texts", str(texts_file),
                                   "--ffn-width", "100000", "-q"])
    assert res.exit_code != 0 and "--ffn-width must be between 1 and the teacher's" in res.output
    assert not list(models_dir().glob("*-work"))  # refused before any work


def test_checkpoints_of_earlier_versions_still_match() -> None:
    """A field added to the config later changes a run's fingerprint only when it is set, so a
    run checkpointed by an earlier vecplug resumes (the fingerprint of a default config is the
    one computed before ``ffn_width`` and ``init`` existed)."""
    import hashlib
    from dataclasses import asdict

    from vecplug.indexer.distill import _fingerprint

    before = hashlib.sha256()
    fields = {k: v for k, v in asdict(DistillConfig()).items()
              if k not in ("checkpoint_every", "ffn_width", "init", "shared_layers")}
    before.update(json.dumps(fields, sort_keys=True).encode())
    before.update(b"sum")
    before.update(b"a\x00b\x01")
    assert _fingerprint(DistillConfig(), ["a"], ["b"], "sum", legacy=True) == before.hexdigest()[:16]
    assert _fingerprint(DistillConfig(ffn_width=8), ["a"], ["b"], "sum", legacy=True) != before.hexdigest()[:16]
    # (the formula since, without the paths as written, is another: run() accepts both)
    assert _fingerprint(DistillConfig(), ["a"], ["b"], "sum") != before.hexdigest()[:16]


def test_a_trained_student_narrowed_and_trained_on(tiny_model: Path, other_tiny_model: Path,
                                                   texts_file: Path, tmp_path: Path) -> None:
    """``--init``: a student starts from another student of the same teacher (its layers, its
    trained weights), here narrowed first; other teachers' students and a wrong -k are refused."""
    import torch
    from safetensors.torch import load_file

    first = tmp_path / "first"
    assert distill(config(tiny_model, texts_file), first, progress=False) is not None
    out = tmp_path / "narrow"
    report = distill(config(tiny_model, texts_file, init=str(first), ffn_width=8, epochs=1), out, progress=False)
    assert report is not None
    meta = json.loads((out / "student.json").read_text())
    assert meta["init"] == str(first) and meta["ffn_width"] == 8
    assert meta["layers"] == json.loads((first / "student.json").read_text())["layers"]
    # it started from the trained student: after one more epoch its weights are nearer those
    # than the teacher's
    trained, narrowed = load_file(str(first / "student.safetensors")), load_file(str(out / "student.safetensors"))
    key = "encoder.layer.0.attention.self.query.weight"
    assert torch.dist(narrowed[key], trained[key]) < torch.dist(narrowed[key], _teacher_weight(tiny_model, meta, key))
    with pytest.raises(ModelMismatchError, match="is not a student of"):
        distill(config(other_tiny_model, texts_file, init=str(first)), tmp_path / "x", progress=False)
    with pytest.raises(Exception, match="has 1 layers; give -k 1"):
        distill(config(tiny_model, texts_file, init=str(first), layers=2), tmp_path / "y", progress=False)


def _teacher_weight(teacher: Path, meta: dict, key: str) -> "object":
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(teacher))
    src = key.replace("encoder.layer.0.", f"encoder.layer.{meta['layers'][0]}.")
    return model.state_dict()[src]


def test_distill_settings_are_checked_before_any_work(tiny_student: Path, tmp_path: Path) -> None:
    """A batch of 0 divided by zero after the teacher's targets were encoded, 0 epochs saved an
    untrained student as a success, --dim 0 was taken for "no --dim"; a student as teacher
    trained to the end and wrote a student nothing could load."""
    from vecplug.errors import ConfigError, ModelError

    for bad in ({"batch_size": 0}, {"epochs": 0}, {"learning_rate": -1.0}, {"dim": 0},
                {"max_texts": 0}, {"layers": 0}, {"learning_rate": float("nan")}, {"warmup": 1.0}):
        with pytest.raises(ConfigError):
            DistillConfig(**bad)  # type: ignore[arg-type]
    texts = tmp_path / "t.txt"
    texts.write_text("water\nfire\n")
    with pytest.raises(ModelError, match="is a query student of .*: distil from"):
        distill(DistillConfig(teacher=str(tiny_student), layers=1, texts=(str(texts),)), tmp_path / "s2",
                progress=False)
    assert not (tmp_path / "s2").exists()


def test_out_is_never_a_folder_the_student_would_destroy(tiny_model: Path, other_tiny_model: Path,
                                                        tiny_student: Path, texts_file: Path,
                                                        tmp_path: Path) -> None:
    """The student replaces the whole --out folder: a user's folder, the teacher itself (then
    unloadable, and its index unsearchable) and another teacher's student were replaced
    silently. Refused before any work; a student of the same teacher is still replaced."""
    import shutil

    from click.testing import CliRunner

    from vecplug.cli import cli
    from vecplug.errors import ConfigError

    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model, teacher)
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    other_student = tmp_path / "other-student"
    shutil.copytree(tiny_student, other_student)  # a student of tiny_model, not of other_tiny_model
    for out, message in ((mine, "exists and holds something else"), (teacher, "the teacher's folder"),
                         (teacher / "student", "the teacher's folder")):
        with pytest.raises(ConfigError, match=message):
            distill(config(teacher, texts_file, epochs=1), out, progress=False)
        assert not Path(f"{out}.distill-work").exists()  # refused before any work
    with pytest.raises(ConfigError, match="not a student of"):
        distill(config(other_tiny_model, texts_file, epochs=1), other_student, progress=False)
    assert (mine / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in teacher.iterdir()) == sorted(p.name for p in tiny_model.iterdir())
    result = CliRunner().invoke(cli, ["distill", "--teacher", str(teacher), "-k", "1", "--epochs", "1",
                                      "--texts", str(texts_file), "--out", str(mine), "-q"])
    assert result.exit_code != 0 and "exists and holds something else" in result.output
    assert "Traceback" not in result.output and (mine / "notes.txt").is_file()
    # a student of this teacher (an earlier run's) is replaced by the new one
    assert distill(config(tiny_model, texts_file, epochs=1), other_student, progress=False) is not None
    assert json.loads((other_student / "student.json").read_text())["training"]["steps"] == 6
    # ... and one of an earlier build of the teacher's folder (it no longer loads: distilled again)
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(other_tiny_model, rebuilt)
    old = tmp_path / "old-student"
    distill(config(rebuilt, texts_file, epochs=1), old, progress=False)
    shutil.rmtree(rebuilt)
    shutil.copytree(tiny_model, rebuilt)  # the same folder, other weights
    assert distill(config(rebuilt, texts_file, epochs=1), old, progress=False) is not None


def test_texts_read_as_a_corpus_report_what_they_skip(tiny_model: Path, tmp_path: Path) -> None:
    """``--texts`` .csv/.jsonl files are read as corpus files (title/description/text): a
    queries.csv gave no text at all, and its skipped rows were thrown away unsaid. Each
    skipped record is reported by path and line; a source that gives no text is an error."""
    from vecplug.errors import VecplugError
    from vecplug.indexer.distill import build_examples
    from vecplug.types import Problem

    queries = tmp_path / "queries.csv"
    queries.write_text("query\nwie hoch ist der everest\nwhere is kyoto\n", encoding="utf-8")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"text": "where is kyoto"}) + "\n" + json.dumps({"query": "no text"}) + "\n",
                     encoding="utf-8")
    problems: list[Problem] = []
    inputs, _, record = build_examples(DistillConfig(texts=(str(mixed),)), problems)
    assert inputs == ["where is kyoto"] and record["texts"][0]["texts"] == 1
    assert [(p.path, p.line) for p in problems] == [(str(mixed), 2)]
    logged: list[str] = []
    with pytest.raises(VecplugError, match=f"--texts {queries} gave no training text; first problem: "
                                           f"{queries}:2: record has none of the fields"):
        distill(DistillConfig(teacher=str(tiny_model), layers=1, texts=(str(mixed), str(queries))),
                tmp_path / "student", progress=False, log=logged.append)
    assert f"skipped {mixed}:2: record has none of the fields title, description, text" in logged
    assert any(m.startswith(f"skipped {queries}:3: ") for m in logged)
    assert not (tmp_path / "student.distill-work").exists()


def test_a_second_distill_of_the_same_out_is_refused_while_one_runs(tiny_model: Path, texts_file: Path,
                                                                   tmp_path: Path) -> None:
    """Two runs writing one student shared (and deleted) each other's checkpoints; the work
    folder is now held for a run, and another run is refused before any work."""
    from vecplug.errors import IndexLockedError
    from vecplug.fsutil import WriterLock
    from vecplug.indexer import checkpoint

    out = tmp_path / "student"
    work = tmp_path / "student.distill-work"
    work.mkdir()
    held = WriterLock(work)  # the first run
    held.acquire()
    try:
        with pytest.raises(IndexLockedError, match=f"another run is writing {work}"):
            distill(config(tiny_model, texts_file, epochs=1), out, progress=False)
        assert work.is_dir() and not out.exists()
    finally:
        held.release()
    assert distill(config(tiny_model, texts_file, epochs=1), out, progress=False) is not None
    assert not work.exists()
    # a run refused after taking the folder (here: --ffn-width too wide) leaves none behind
    with pytest.raises(Exception, match="--ffn-width must be between"):
        distill(config(tiny_model, texts_file, epochs=1, ffn_width=10**6), tmp_path / "wide", progress=False)
    assert not (tmp_path / "wide.distill-work").exists()
    held = checkpoint.lock(work)
    checkpoint.unlock(work, held)
    assert not work.exists()  # held by nothing but its lock: removed on release


def test_seeds_torch_and_the_config_take_are_taken(tiny_model: Path, texts_file: Path, tmp_path: Path) -> None:
    """A negative seed (numpy's order of the texts) and one of 2**64 (torch.manual_seed) failed
    after the teacher had encoded its targets."""
    for seed in (-1, 1 << 64):
        report = distill(config(tiny_model, texts_file, epochs=1, seed=seed), tmp_path / f"s{seed}", progress=False)
        assert report is not None and report.steps > 0


def test_a_distill_checkpoint_is_recognised_however_its_paths_are_written() -> None:
    """The teacher by its checksum and the texts by their contents: a run resumed with its
    paths written otherwise is the same run; other texts or settings are not."""
    from vecplug.indexer.distill import DistillConfig, _fingerprint

    base = DistillConfig(teacher="/abs/models/m", texts=("/abs/q.txt",), layers=2)
    key = _fingerprint(base, ["a", "b"], ["a", "b"], "sum")
    same = DistillConfig(teacher="./models/m", texts=("q.txt",), layers=2)
    assert _fingerprint(same, ["a", "b"], ["a", "b"], "sum") == key
    assert _fingerprint(base, ["a", "c"], ["a", "c"], "sum") != key  # other texts
    assert _fingerprint(base, ["a", "b"], ["a", "b"], "other") != key  # another teacher
    assert _fingerprint(DistillConfig(teacher="./models/m", texts=("q.txt",), layers=3),
                        ["a", "b"], ["a", "b"], "sum") != key  # other settings
