"""Model folders on disk: how a student folder is replaced."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest


def test_saving_over_a_student_keeps_the_old_one_until_the_new_one_is_in(
        tiny_student: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save_student removed the old folder, then renamed the new one in: interrupted between
    the two, both were lost. Now the old one is renamed aside first and put back."""
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import STUDENT_META, STUDENT_WEIGHTS, make_student, save_student

    old = (tiny_student / STUDENT_WEIGHTS).read_bytes()
    meta = {k: v for k, v in json.loads((tiny_student / STUDENT_META).read_text()).items()
            if k != "weights_sha256"}
    new = make_student(Encoder.from_specs(str(tiny_model)).document.model, [0])
    rename = Path.rename

    def interrupted(self: Path, target: Any) -> Path:
        if self.name.startswith(".tmp-"):  # the new folder's way in
            raise KeyboardInterrupt
        return rename(self, target)

    with monkeypatch.context() as m:
        m.setattr(Path, "rename", interrupted)
        with pytest.raises(KeyboardInterrupt):
            save_student(new, tiny_student, meta)
    assert (tiny_student / STUDENT_WEIGHTS).read_bytes() == old
    assert resolve_model(str(tiny_student)).teacher is not None
    assert sorted(p.name for p in tiny_student.parent.iterdir() if p.name.startswith(".")) == []

    save_student(new, tiny_student, meta | {"layers": [0]})
    assert (tiny_student / STUDENT_WEIGHTS).read_bytes() != old
    assert json.loads((tiny_student / STUDENT_META).read_text())["layers"] == [0]
    assert sorted(p.name for p in tiny_student.parent.iterdir() if p.name.startswith(".")) == []


def test_models_are_listed_with_the_checksum_of_their_weights_as_they_are(tiny_model: Path) -> None:
    """A folder whose weights were replaced after vecplug.json recorded them is listed with the
    weights' checksum (and a warning), not the stale record."""
    import shutil
    import warnings

    from vecplug.indexer.checksums import weights_sha256
    from vecplug.indexer.models import list_models, models_dir

    folder = models_dir() / "mine"
    shutil.copytree(tiny_model, folder)
    (folder / "vecplug.json").write_text(json.dumps({"weights_sha256": "0" * 64, "description": "d"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = {r["name"]: r for r in list_models()}
    assert rows["mine"]["checksum"] == weights_sha256(folder / "model.safetensors")
    assert any("changed since" in str(w.message) for w in caught)
    assert rows["me5-small"]["checksum"] == ""  # not built here


def test_students_in_the_cache_are_listed_and_resolved_by_name(tiny_student: Path) -> None:
    """A student distilled to the default --out ($VECPLUG_HOME/models/NAME) is listed, resolved by
    that name, and listed with the checksum its index manifests record (its layers only)."""
    import shutil

    from vecplug.indexer.models import list_models, models_dir, resolve_model

    folder = models_dir() / "tiny-student-k1"
    shutil.copytree(tiny_student, folder)
    (folder / "int8-peaks.safetensors").write_bytes((tiny_student / "student.safetensors").read_bytes())
    info = resolve_model("tiny-student-k1")
    assert info.path == folder.resolve() and info.teacher is not None
    (models_dir() / "notes").mkdir()  # a stray folder is not a model
    rows = {r["name"]: r for r in list_models()}
    assert rows["tiny-student-k1"]["checksum"] == info.checksum and "notes" not in rows


def test_a_distilled_student_never_takes_a_shipped_student_s_name(tiny_student: Path) -> None:
    """``vecplug distill -k 6`` from me5-small wrote $VECPLUG_HOME/models/me5-small-student-k6,
    the shipped student's name: by that name the shipped one was found, and `models list`
    showed two rows of one name. The default folder gets -local; a folder of that name made
    otherwise is listed as found by its path only."""
    import shutil

    from vecplug.indexer.distill import default_student_folder
    from vecplug.indexer.models import BUILTIN_STUDENTS, list_models, models_dir

    shipped = next(iter(BUILTIN_STUDENTS))
    layers = int(shipped.rsplit("-k", 1)[1])
    assert default_student_folder("me5-small", layers) == models_dir() / f"{shipped}-local"
    assert default_student_folder("me5-small", 2) == models_dir() / "me5-small-student-k2"
    assert default_student_folder("org/model", 3, dim=128).name == "org--model-student-k3-d128"
    assert default_student_folder("me5-small", 7, shared_layers=6).name == "me5-small-student-k7-s6"
    shutil.copytree(tiny_student, models_dir() / shipped)
    rows = [r for r in list_models() if r["name"] == shipped]
    assert len(rows) == 2 and "found by name: give this one's path" in rows[1]["description"]


def test_a_student_of_another_teacher_is_refused_when_named(tiny_student: Path) -> None:
    """A student whose recorded teacher checksum is not its teacher's is refused at once (an
    index made with it recorded it, and failed at every search)."""
    from vecplug.errors import ModelMismatchError
    from vecplug.indexer.models import resolve_model

    meta = json.loads((tiny_student / "student.json").read_text())
    (tiny_student / "student.json").write_text(json.dumps({**meta, "teacher_checksum": "0" * 16}))
    with pytest.raises(ModelMismatchError, match=r"distilled from .*\(0000000000000000\), but the teacher found"):
        resolve_model(str(tiny_student))


def test_an_unwritable_home_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A VECPLUG_HOME that cannot be made was a FileNotFoundError traceback at the first build."""
    from vecplug.errors import ModelError
    from vecplug.indexer.models import build_builtin

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("VECPLUG_HOME", str(blocker / "home"))
    with pytest.raises(ModelError, match="cannot build me5-small into .*set VECPLUG_HOME to a folder you can write"):
        build_builtin("me5-small")


def test_a_stray_folder_in_the_way_of_a_build_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """models/me5-small holding something else made the build fail with "Directory not empty"."""
    from vecplug.errors import ModelError
    from vecplug.indexer import models

    import dataclasses

    quick = dataclasses.replace(models.BUILTIN_MODELS["me5-small"],
                                builder=lambda folder: (folder / "config.json").write_text("{}"))
    monkeypatch.setitem(models.BUILTIN_MODELS, "me5-small", quick)  # no 470 MB to build
    stray = models.models_dir() / "me5-small"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="holds no finished build of me5-small: remove it, or run: vecplug models "
                                         "build me5-small --force"):
        models.build_builtin("me5-small")


def test_a_build_killed_midway_leaves_nothing_for_good_and_a_full_disk_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary folder of a build whose process is gone (killed: ~450 MB each) goes at the
    next build, a live one's stays; a builder's error that is no OSError (safetensors on a full
    disk) is a ModelError saying so, with nothing kept."""
    import dataclasses
    import subprocess
    import sys

    from vecplug.errors import ModelError
    from vecplug.indexer import models

    home = models.models_dir()
    home.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for name in (f".tmp-me5-small-{gone}-abc", f".old-me5-small-{gone}-123", f".tmp-me5-small-{os.getppid()}-live"):
        (home / name).mkdir()
        (home / name / "model.safetensors").write_bytes(b"x")

    def full_disk(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setitem(models.BUILTIN_MODELS, "me5-small",
                        dataclasses.replace(models.BUILTIN_MODELS["me5-small"], builder=full_disk))
    with pytest.raises(ModelError, match=r"cannot build me5-small into .*No space left on device .*nothing was "
                                         r"kept \(is the disk full\?\)"):
        models.build_builtin("me5-small")
    assert sorted(p.name for p in home.iterdir()) == [f".tmp-me5-small-{os.getppid()}-live"]


def test_a_cache_folder_with_a_vecplug_json_of_another_shape_is_listed(tiny_model: Path) -> None:
    """A vecplug.json that is JSON but no object (a list) crashed `models list` with a
    traceback; it reads as saying nothing. Names keep their letters in --json."""
    import shutil

    from click.testing import CliRunner

    from vecplug.cli import cli
    from vecplug.indexer.models import models_dir

    folder = models_dir() / "mïn"
    shutil.copytree(tiny_model, folder)
    (folder / "vecplug.json").write_text('["x"]')
    result = CliRunner().invoke(cli, ["models", "list", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert any(row["name"] == "mïn" for row in json.loads(result.output)) and "mïn" in result.output
