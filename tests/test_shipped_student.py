"""The default query student that ships inside the package, against a freshly built teacher."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vecplug.indexer.models import BUILTIN_STUDENTS, DEFAULT_STUDENTS


def test_a_default_student_ships_for_me5_small() -> None:
    assert "me5-small" in DEFAULT_STUDENTS
    folder = BUILTIN_STUDENTS[DEFAULT_STUDENTS["me5-small"]]
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "student.json", "student.safetensors"} <= files
    assert "model.safetensors" not in files and "tokenizer.json" not in files  # shares its teacher's
    assert sum(p.stat().st_size for p in folder.iterdir()) < 50e6
    meta = json.loads((folder / "student.json").read_text())
    assert meta["teacher"] == "me5-small" and meta["default_for"] == "me5-small"
    assert meta["query_quantize"] == "int8"  # measured in int8 (README "Student figures"): auto runs it so
    assert "tatoeba" in meta["training"]["data"] and meta["training"]["command"].startswith("vecplug distill")


@pytest.mark.slow
def test_shipped_student_loads_on_a_fresh_teacher_and_tracks_it(built_me5: Path) -> None:
    from vecplug.indexer.encoder import Encoder

    from test_me5 import SENTENCES

    name = DEFAULT_STUDENTS["me5-small"]
    encoder = Encoder.from_specs("me5-small", name)  # refuses a teacher with another checksum
    assert encoder.query_info.teacher is not None
    assert encoder.query_info.teacher.checksum == encoder.document_info.checksum
    student = encoder.encode_queries(SENTENCES)
    teacher = encoder.document.encode(SENTENCES, "query: ", 64)
    # trained with an in-batch ranking term as well as the L2 loss, the student is close to
    # its teacher (cosine 0.86 here) and, above all, ranks like it: each sentence's student
    # vector is nearest to that sentence's teacher vector
    assert float((student * teacher).sum(1).mean()) > 0.8
    assert (np.argmax(student @ teacher.T, axis=1) == np.arange(len(SENTENCES))).all()
    # the one vocabulary table is shared in memory
    assert encoder.query.model.get_input_embeddings().weight.data_ptr() == \
        encoder.document.model.get_input_embeddings().weight.data_ptr()
    # and it ranks: a translation above an unrelated sentence
    q = encoder.encode_queries(["How tall is Mount Everest?"])[0]
    d = encoder.encode_documents(["Der Mount Everest ist 8.849 Meter hoch.",
                                  "Paella ist ein Reisgericht aus Valencia."])
    assert d[0] @ q > d[1] @ q + 0.05
    assert np.isfinite(student).all()
