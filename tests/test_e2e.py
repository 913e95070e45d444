"""The demo, as a test: the real multilingual model on the shipped example corpus."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from vecplug.cli import cli
from vecplug.indexer.encoder import teacher_quantize_for
from vecplug.indexer.precision import resolve_precision

# query -> the only document that holds its answer, in another language
CROSS_LINGUAL = {
    "At what temperature does water boil on top of Everest?": "articles/kochen-in-der-hoehe.md",
    "Wie viele buddhistische Tempel gibt es in Kyoto?": "articles/kyoto.md",
    "¿Cuántos kilómetros mide el ferrocarril Transiberiano de Moscú a Vladivostok?": "articles/transsib.md",
    "Из какого региона Испании родом паэлья?": "articles/paella.md",
    "フランスの伝統的なバゲットの材料は何ですか？": "notes/baguette.txt",
}


@pytest.mark.slow
def test_demo_corpus_cross_lingual(built_me5: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["index", str(EXAMPLES), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "0 problems" in result.output
    info = json.loads(runner.invoke(cli, ["info", "--json"]).output)
    assert info["manifest"]["document_encoder"] == "me5-small"
    assert {"en", "de", "es", "fr", "ru", "zh", "ja", "ar"} <= set(info["languages"])
    for query, answer in CROSS_LINGUAL.items():
        out = json.loads(runner.invoke(cli, ["search", query, "-k", "3", "--json"]).output)
        sources = [h["source"] for h in out["hits"]]
        assert answer in sources, (query, sources)
        answer_lang = next(h["lang"] for h in out["hits"] if h["source"] == answer)
        assert answer_lang != out["lang"]  # found across languages
    mono = json.loads(runner.invoke(cli, ["search", "Wie viele buddhistische Tempel gibt es in Kyoto?",
                                          "--mode", "mono", "--json"]).output)
    assert mono["lang"] == "de" and {h["lang"] for h in mono["hits"]} == {"de"}
    # the teacher reranks the student's candidates: its int8 query weights (teacher:int8) keep
    # the float teacher's answers and nearly its scores, gated or not
    for query, answer in CROSS_LINGUAL.items():
        ranked = {}
        for spec in ("teacher", "teacher:int8"):
            out = runner.invoke(cli, ["search", query, "-k", "3", "--json", "--rerank", spec])
            assert out.exit_code == 0, out.output
            ranked[spec] = json.loads(out.output)
            assert ranked[spec]["hits"][0]["source"] == answer, (spec, query, ranked[spec]["hits"])
        float_scores = {h["id"]: h["score"] for h in ranked["teacher"]["hits"]}
        for hit in ranked["teacher:int8"]["hits"]:
            if hit["id"] in float_scores:
                assert abs(hit["score"] - float_scores[hit["id"]]) < 0.02, (query, hit)
        assert {h["score"] for h in ranked["teacher:int8"]["hits"]} != set(float_scores.values())
        gated = json.loads(runner.invoke(cli, ["search", query, "-k", "3", "--json", "--rerank", "teacher:int8",
                                               "--rerank-gate", "0.08"]).output)
        assert gated["hits"][0]["source"] == answer
        # teacher:auto is one of the two, by this machine's precision (int8 where it is float32)
        auto = json.loads(runner.invoke(cli, ["search", query, "-k", "3", "--json", "--rerank", "teacher:auto"]).output)
        chosen = "teacher:int8" if teacher_quantize_for("auto", resolve_precision(None), "torch") else "teacher"
        assert [(h["id"], h["score"]) for h in auto["hits"]] == [(h["id"], h["score"]) for h in ranked[chosen]["hits"]]
