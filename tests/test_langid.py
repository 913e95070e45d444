from __future__ import annotations

import json

import pytest

from conftest import XQUAD
from vecplug.indexer.langid import LanguageDetector

SAMPLES = {
    "en": "Where is the nearest train station?",
    "de": "Wo ist der nächste Bahnhof?",
    "es": "¿Dónde está la estación de tren más cercana?",
    "fr": "Où est la gare la plus proche ?",
    "ru": "Где ближайший железнодорожный вокзал?",
    "zh": "最近的火车站在哪里",
    "ja": "一番近い駅はどこですか",
    "ar": "أين أقرب محطة قطار؟",
}


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector()


def test_detects_common_languages(detector: LanguageDetector) -> None:
    assert {lang: detector.detect(text) for lang, text in SAMPLES.items()} == {l: l for l in SAMPLES}
    assert detector.detect("   ") == "und"
    # nothing to read a language from: fastText guessed "en" (score 0.12)
    assert [detector.detect(t) for t in ("12345", "\U0001f600", "3, 1")] == ["und"] * 3
    # Chinese that fastText calls German, and English naming a company in Han characters
    assert detector.detect("Energiprojekt AB公司位于何处?") == "zh"
    assert detector.detect("Alibaba Group (阿里巴巴集团) reported record revenue") == "en"
    # Chinese queries naming products (fastText: hsb, af, ja, en)
    for query in ("MacBook Air 测评", "iPad Pro 评测", "Apple Watch 表带", "Lenovo ThinkPad 键盘", "Canon EOS R5 评测"):
        assert detector.detect(query) == "zh", query
    assert detector.detect("Die Firma 华为 baut Telefone") == "de"
    for query in ("vpn 推荐", "win10 激活", "ipad 评测", "docker 安装", "macbook air m2 贴膜"):  # lower-case names
        assert detector.detect(query) == "zh", query
    # other languages' queries about a Chinese word stay theirs
    for query, lang in (("Bedeutung von 谢谢", "de"), ("история 饺子", "ru"), ("storia di 太极", "it")):
        assert detector.detect(query) == lang, query


@pytest.mark.slow
def test_accuracy_on_xquad_r_questions(detector: LanguageDetector) -> None:
    if not XQUAD.is_dir():
        pytest.skip(f"XQuAD-R not found at {XQUAD}")
    for path in sorted(XQUAD.glob("*.json")):
        lang = path.stem
        data = json.loads(path.read_text())
        questions = [qa["question"] for art in data["data"] for p in art["paragraphs"] for qa in p["qas"]]
        right = sum(detector.detect(q) == lang for q in questions)
        assert right / len(questions) >= 0.9, (lang, right / len(questions))
