"""XQuAD-R (LAReQA) loader shared by the benchmarks.

Each ``<lang>.json`` is SQuAD-format JSON whose paragraphs carry ``sentences`` and
``sentence_breaks`` (one ``[start, end)`` character span of ``context`` per sentence). The
``sentences`` list alone does not say which sentence holds an answer: the breaks do, through
``answer_start``. The files are parallel (same paragraphs, same question ids, in the same
order), but the translations are split into a different number of sentences for many
paragraphs, so a question's relevant sentence is located in every language from that
language's own ``answer_start``, never by copying the English sentence index.

Evaluation data only: nothing here (or anywhere in ``benchmarks/``) trains on it.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: ``../shared/data/xquad-r`` next to the repository, wherever the command is run from.
DEFAULT_DATA_DIR: Path = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "xquad-r").resolve()


@dataclass(frozen=True)
class Sentence:
    """One retrieval candidate: sentence ``index`` of paragraph ``para`` in ``lang``."""

    lang: str
    para: int
    index: int
    text: str

    @property
    def doc_id(self) -> str:
        return doc_id(self.lang, self.para, self.index)


@dataclass(frozen=True)
class Question:
    """One question; ``answer_sentence`` indexes its own language's paragraph sentences."""

    qid: str
    lang: str
    para: int
    text: str
    answer_sentence: int


@dataclass
class LanguageData:
    """Everything read from one language file."""

    lang: str
    contexts: list[str]
    sentences: list[Sentence]
    questions: list[Question]
    #: sentence count of each paragraph, by global paragraph index
    sentence_counts: list[int]
    #: question ids of each paragraph, in file order
    qids: list[list[str]]


@dataclass
class XQuADR:
    """The loaded languages, checked to be parallel, with per-language relevance."""

    langs: list[str]
    by_lang: dict[str, LanguageData]
    #: qid -> {lang: doc id of the sentence holding that language's answer}
    relevant: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def paragraphs(self) -> int:
        return len(self.by_lang[self.langs[0]].contexts)

    def sentences(self, langs: Iterable[str] | None = None) -> list[Sentence]:
        """Candidates of ``langs`` (default: every loaded language), language by language."""
        return [s for lang in (langs or self.langs) for s in self.by_lang[lang].sentences]

    def questions(self, langs: Iterable[str] | None = None) -> list[Question]:
        return [q for lang in (langs or self.langs) for q in self.by_lang[lang].questions]

    def sentence_count_mismatches(self, reference: str | None = None) -> dict[str, int]:
        """Per language: paragraphs split into a different number of sentences than ``reference``."""
        ref = self.by_lang[reference or self._reference()].sentence_counts
        return {lang: sum(a != b for a, b in zip(self.by_lang[lang].sentence_counts, ref))
                for lang in self.langs}

    def answer_index_differences(self, reference: str | None = None) -> dict[str, int]:
        """Per language: questions whose answer sentence index differs from ``reference``'s."""
        ref = {q.qid: q.answer_sentence for q in self.by_lang[reference or self._reference()].questions}
        return {lang: sum(q.answer_sentence != ref[q.qid] for q in self.by_lang[lang].questions)
                for lang in self.langs}

    def _reference(self) -> str:
        return "en" if "en" in self.langs else self.langs[0]


def doc_id(lang: str, para: int, index: int) -> str:
    """The id a candidate sentence gets in the benchmark index."""
    return f"{lang}:{para}:{index}"


def available_langs(data_dir: Path = DEFAULT_DATA_DIR) -> list[str]:
    """Languages with a ``<lang>.json`` file in ``data_dir``, sorted."""
    return sorted(p.stem for p in Path(data_dir).glob("*.json"))


def parse_langs(values: Sequence[str] | None, data_dir: Path) -> list[str]:
    """``--langs ar de`` or ``--langs ar,de``; default every language in ``data_dir``."""
    if not values:
        return available_langs(data_dir)
    langs = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return list(dict.fromkeys(langs))


def answer_sentence(breaks: Sequence[Sequence[int]], answer_start: int) -> int | None:
    """Index of the sentence whose ``[start, end)`` break span holds ``answer_start``."""
    for i, (start, end) in enumerate(breaks):
        if start <= answer_start < end:
            return i
    return None


def load_language(path: Path, lang: str) -> LanguageData:
    """Read one XQuAD-R file; raises ``ValueError`` on anything that breaks the task's rules."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    contexts: list[str] = []
    sentences: list[Sentence] = []
    questions: list[Question] = []
    counts: list[int] = []
    qids: list[list[str]] = []
    seen: set[str] = set()
    para = 0
    for article in raw["data"]:
        for p in article["paragraphs"]:
            context, sents, breaks = p["context"], p["sentences"], p["sentence_breaks"]
            if len(sents) != len(breaks):
                raise ValueError(f"{path}: paragraph {para} has {len(sents)} sentences "
                                 f"but {len(breaks)} sentence breaks")
            for i, (text, (start, end)) in enumerate(zip(sents, breaks)):
                if context[start:end] != text:
                    raise ValueError(f"{path}: paragraph {para} sentence {i} differs from its break span")
                sentences.append(Sentence(lang, para, i, text))
            for qa in p["qas"]:
                if qa["id"] in seen:
                    raise ValueError(f"{path}: question id {qa['id']} appears twice")
                seen.add(qa["id"])
                start = int(qa["answers"][0]["answer_start"])
                where = answer_sentence(breaks, start)
                if where is None:
                    raise ValueError(f"{path}: question {qa['id']}: answer_start {start} "
                                     f"lies in no sentence break span")
                questions.append(Question(qa["id"], lang, para, qa["question"], where))
            contexts.append(context)
            counts.append(len(sents))
            qids.append([qa["id"] for qa in p["qas"]])
            para += 1
    return LanguageData(lang, contexts, sentences, questions, counts, qids)


def load_xquad_r(data_dir: Path = DEFAULT_DATA_DIR, langs: Sequence[str] | None = None) -> XQuADR:
    """Load ``langs`` (default: all files in ``data_dir``) and check that they are parallel."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"XQuAD-R folder not found: {data_dir}")
    langs = list(langs or available_langs(data_dir))
    if not langs:
        raise FileNotFoundError(f"no <lang>.json files in {data_dir}")
    missing = [lang for lang in langs if not (data_dir / f"{lang}.json").is_file()]
    if missing:
        raise FileNotFoundError(f"no XQuAD-R file for {', '.join(missing)} in {data_dir} "
                                f"(available: {', '.join(available_langs(data_dir))})")
    by_lang = {lang: load_language(data_dir / f"{lang}.json", lang) for lang in langs}
    first = by_lang[langs[0]]
    for lang in langs[1:]:
        other = by_lang[lang]
        if len(other.contexts) != len(first.contexts):
            raise ValueError(f"not parallel: {lang} has {len(other.contexts)} paragraphs, "
                             f"{langs[0]} has {len(first.contexts)}")
        if other.qids != first.qids:
            raise ValueError(f"not parallel: the question ids of {lang} differ from {langs[0]}'s")
    relevant: dict[str, dict[str, str]] = {}
    for lang in langs:
        for q in by_lang[lang].questions:
            relevant.setdefault(q.qid, {})[lang] = doc_id(lang, q.para, q.answer_sentence)
    return XQuADR(langs, by_lang, relevant)
