"""indexer/ and adapters/ install inside the vecplug package, never at the top level."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.slow
def test_wheel_has_only_the_vecplug_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("vecplug-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"vecplug", next(t for t in tops if t.endswith(".dist-info"))}
    for module in ("vecplug/indexer/encoder.py", "vecplug/indexer/me5.py",
                   "vecplug/adapters/stores/hnsw.py", "vecplug/adapters/stores/qdrant.py",
                   "vecplug/cli.py", "vecplug/py.typed"):
        assert module in names
    # the shipped default student is package data
    assert any(n.startswith("vecplug/students/") and n.endswith("/student.safetensors") for n in names)
    assert any(n.startswith("vecplug/students/") and n.endswith("/int8-peaks.safetensors") for n in names)  # its torch int8
    assert "vecplug/indexer/calibration.txt" in names  # the ONNX int8 recipe calibrates on it
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "vecplug = vecplug.cli:main" in entry
    from vecplug.adapters.stores.registry import BUILTIN_STORES

    for name in BUILTIN_STORES:  # every built-in store is an entry point too, as a plugin's would be
        assert f"\n{name} = " in entry, name


def test_installed_layout(tmp_path: Path) -> None:
    """Installed (editable here), vecplug.indexer/adapters map to the repo folders, and no
    top-level `adapters` or `indexer` module becomes importable."""
    code = ("import importlib.util as u, vecplug.indexer as i, vecplug.adapters as a; "
            "print(i.__file__); print(a.__file__); "
            "print(u.find_spec('adapters') is None and u.find_spec('indexer') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert Path(out[0]).parent == REPO / "indexer"
    assert Path(out[1]).parent == REPO / "adapters"
    assert out[2] == "True"


def test_python_dash_m() -> None:
    out = subprocess.run([sys.executable, "-m", "vecplug", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "vecplug, version" in out.stdout


def test_readme_links_to_its_own_sections_resolve() -> None:
    """Every ``](#anchor)`` of the README names one of its headings, as GitHub makes their
    anchors (lower case, punctuation dropped, spaces to hyphens)."""
    import re

    text = (REPO / "README.md").read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # (a shell comment is no heading)
    headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#{1,6} (.+)$", prose, flags=re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) >= 10 and "figures-modes-bias-correction-consensus-and-reranking-on-xquad-r" in headings
    assert [a for a in links if a not in headings] == []
