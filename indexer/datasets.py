"""Evaluation datasets: XQuAD-R (LAReQA) and BEIR-format folders, read into one shape.

:class:`EvalDataset` is what ``vecplug eval`` scores retrievers on: the documents to index
(:class:`vecplug.types.Document`), the queries, and graded relevance judgements (``qrels``,
``{query id: {document id: grade}}``, grade > 0 relevant).

**XQuAD-R.** Each ``<lang>.json`` is SQuAD-format JSON whose paragraphs carry ``sentences``
and ``sentence_breaks`` (one ``[start, end)`` character span of ``context`` per sentence).
The ``sentences`` list alone does not say which sentence holds an answer: the breaks do,
through ``answer_start``. The files are parallel (same paragraphs, same question ids, in the
same order), but the translations are split into a different number of sentences for many
paragraphs, so a question's relevant sentence is located in every language from that
language's own ``answer_start``, never by copying the English sentence index. Candidates are
every sentence of every loaded language (ids ``lang:para:index``); a question's pooled
relevance (X-Y) is its answer sentence in every loaded language, its same-language relevance
(X-X-mono) the one in its own language.

**BEIR.** A folder with ``corpus.jsonl`` (``_id``, ``title``, ``text``, optional ``lang``; other
fields are kept as payload), ``queries.jsonl`` (``_id``, ``text``, optional ``lang``) and
``qrels/<split>.tsv`` (header ``query-id corpus-id score``; score 0 means not relevant; a pair
judged twice keeps its first grade). A bad line is reported as a :class:`~vecplug.types.Problem`
(path and line) and skipped.

Evaluation data only: nothing in vecplug trains on it.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vecplug.errors import VecplugError
from vecplug.types import Document, Problem


class DatasetError(VecplugError, ValueError):
    """A dataset breaks its format's rules (a ``ValueError`` too, as the benchmarks expect)."""


class DatasetNotFoundError(VecplugError, FileNotFoundError):
    """A dataset folder or one of its files is missing."""


# -- the common representation ------------------------------------------------------------

@dataclass(frozen=True)
class EvalQuery:
    """One query to evaluate; ``lang`` None means "detect it" (``detected``: it was, not given)."""

    id: str
    text: str
    lang: str | None = None
    detected: bool = False


@dataclass
class EvalDataset:
    """Documents, queries and relevance judgements of one evaluation.

    ``qrels`` is the relevance every mode but ``mono`` is scored with (for XQuAD-R: the answer
    sentence in every pooled language). ``mono_qrels`` is the same-language relevance when the
    dataset defines it (XQuAD-R); when it is None, ``mono`` is scored with ``qrels`` restricted
    to documents in the query's language.
    """

    name: str
    documents: list[Document]
    queries: list[EvalQuery]
    qrels: dict[str, dict[str, int]]
    mono_qrels: dict[str, dict[str, int]] | None = None
    #: skipped input (bad lines, judgements of unknown ids...), by path and line
    problems: list[Problem] = field(default_factory=list)
    #: where it came from and how it was read (format, path, split, languages...)
    info: dict[str, Any] = field(default_factory=dict)

    def document_languages(self) -> Counter:
        """Documents per language (``None`` for documents whose language is not given)."""
        return Counter(d.lang for d in self.documents)

    def query_languages(self) -> Counter:
        """Queries per language (``None`` for queries whose language is not given)."""
        return Counter(q.lang for q in self.queries)

    def with_query_langs(self, detect: Callable[[str], str]) -> "EvalDataset":
        """A copy whose queries of unknown language carry ``detect(text)`` (marked ``detected``);
        ``self`` when every query has a language."""
        if all(q.lang for q in self.queries):
            return self
        queries = [q if q.lang else EvalQuery(q.id, q.text, detect(q.text), detected=True)
                   for q in self.queries]
        return EvalDataset(self.name, self.documents, queries, self.qrels, self.mono_qrels,
                           list(self.problems), dict(self.info))

    def without_documents(self, ids: Iterable[str], problems: Sequence[Problem] = ()) -> "EvalDataset":
        """A copy without the documents ``ids`` (documents the index refused) and without the
        judgements that name them, each reported: a relevant document nothing could retrieve
        would otherwise count against every retriever. ``problems`` (the index's own reports)
        are kept with the dataset's; queries left with nothing relevant in a mode are skipped
        in that mode, as any such query is."""
        gone = set(ids)
        if not gone and not problems:
            return self
        found: list[Problem] = [*self.problems, *problems]
        by_id = {d.id: d for d in self.documents}
        named = {d for grades in (*self.qrels.values(), *(self.mono_qrels or {}).values()) for d in grades}
        for did in sorted(gone & named):
            doc = by_id.get(did)
            found.append(Problem(doc.source if doc else self.name,
                                 f"document {did} is not in the index: its relevance judgements are dropped",
                                 doc.position if doc and isinstance(doc.position, int) else None))

        def drop(qrels: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
            return {q: {d: g for d, g in grades.items() if d not in gone} for q, grades in qrels.items()}

        mono = drop(self.mono_qrels) if self.mono_qrels is not None else None
        return EvalDataset(self.name, [d for d in self.documents if d.id not in gone], self.queries,
                           drop(self.qrels), mono, found, dict(self.info))

    def limited(self, n: int | None) -> "EvalDataset":
        """The first ``n`` queries of each query language (all documents kept: the pool, and so
        the task's difficulty, does not change); ``None`` or 0 keeps everything.

        Raises :class:`DatasetError` when a query's language is unknown: lumped together, such
        queries would be cut to ``n`` in all (give them languages with :meth:`with_query_langs`).
        """
        if not n:
            return self
        unknown = sum(not q.lang for q in self.queries)
        if unknown:
            raise DatasetError(f"{self.name}: {unknown} queries have no language: detect them before "
                               "keeping the first queries of each language")
        seen: Counter = Counter()
        kept: list[EvalQuery] = []
        for q in self.queries:
            if seen[q.lang] < n:
                seen[q.lang] += 1
                kept.append(q)
        ids = {q.id for q in kept}
        mono = {k: v for k, v in self.mono_qrels.items() if k in ids} if self.mono_qrels is not None else None
        return EvalDataset(self.name, self.documents, kept,
                           {k: v for k, v in self.qrels.items() if k in ids}, mono,
                           list(self.problems), {**self.info, "limit_per_language": n})


# -- XQuAD-R --------------------------------------------------------------------------------

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

    def to_eval_dataset(self, name: str = "xquad-r") -> EvalDataset:
        """The pooled retrieval task: every sentence is a document (id ``lang:para:index``),
        every question a query (id ``lang:qid``: question ids are shared across languages).
        Languages as the index stores codes (a file ``EN.json`` or ``pt-BR.json`` holds "en",
        "pt"), so that what the scores compare (a hit's language, a query's) is spelt alike."""
        from vecplug.types import lang_code

        def code(lang: str) -> str:
            try:
                return lang_code(lang) or lang
            except ValueError as exc:
                raise DatasetError(f"XQuAD-R file {lang}.json: its name is not a language code ({exc})") from None

        codes = {lang: code(lang) for lang in self.langs}
        same = [f for f in self.langs if list(codes.values()).count(codes[f]) > 1]
        if same:  # (en.json and en_GB.json: one language twice, which the scores could not tell apart)
            raise DatasetError(f"XQuAD-R files {', '.join(f + '.json' for f in same)} hold one language, "
                               f"{codes[same[0]]}: give one of them (--langs)")
        documents = [Document(id=s.doc_id, text=s.text, source=f"xquad-r/{s.lang}", position=s.index,
                              lang=codes[s.lang]) for s in self.sentences()]
        queries: list[EvalQuery] = []
        qrels: dict[str, dict[str, int]] = {}
        mono: dict[str, dict[str, int]] = {}
        for q in self.questions():
            key = f"{q.lang}:{q.qid}"
            queries.append(EvalQuery(key, q.text, codes[q.lang]))
            qrels[key] = {rid: 1 for rid in self.relevant[q.qid].values()}
            mono[key] = {self.relevant[q.qid][q.lang]: 1}
        return EvalDataset(name, documents, queries, qrels, mono,
                           info={"format": "xquad-r", "langs": list(self.langs),
                                 "paragraphs": self.paragraphs})


def doc_id(lang: str, para: int, index: int) -> str:
    """The id a candidate sentence gets in the index."""
    return f"{lang}:{para}:{index}"


def available_langs(data_dir: str | Path) -> list[str]:
    """Languages with a ``<lang>.json`` file in ``data_dir``, sorted."""
    return sorted(p.stem for p in Path(data_dir).glob("*.json"))


def parse_langs(values: Sequence[str] | None, data_dir: str | Path) -> list[str]:
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


def load_language(path: str | Path, lang: str) -> LanguageData:
    """Read one XQuAD-R file; raises :class:`DatasetError` (a ``ValueError``) on anything that
    breaks the task's rules."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not valid UTF-8 JSON: {exc}") from None
    contexts: list[str] = []
    sentences: list[Sentence] = []
    questions: list[Question] = []
    counts: list[int] = []
    qids: list[list[str]] = []
    seen: set[str] = set()
    para = 0
    try:
        for article in raw["data"]:
            for p in article["paragraphs"]:
                context, sents, breaks = p["context"], p["sentences"], p["sentence_breaks"]
                if len(sents) != len(breaks):
                    raise DatasetError(f"{path}: paragraph {para} has {len(sents)} sentences "
                                       f"but {len(breaks)} sentence breaks")
                for i, (text, (start, end)) in enumerate(zip(sents, breaks)):
                    if context[start:end] != text:
                        raise DatasetError(f"{path}: paragraph {para} sentence {i} differs from its break span")
                    sentences.append(Sentence(lang, para, i, text))
                for qa in p["qas"]:
                    if qa["id"] in seen:
                        raise DatasetError(f"{path}: question id {qa['id']} appears twice")
                    seen.add(qa["id"])
                    start = int(qa["answers"][0]["answer_start"])
                    where = answer_sentence(breaks, start)
                    if where is None:
                        raise DatasetError(f"{path}: question {qa['id']}: answer_start {start} "
                                           f"lies in no sentence break span")
                    questions.append(Question(qa["id"], lang, para, qa["question"], where))
                contexts.append(context)
                counts.append(len(sents))
                qids.append([qa["id"] for qa in p["qas"]])
                para += 1
    except DatasetError:
        raise  # a ValueError too, but already says what is wrong
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        # a field missing or of the wrong type or shape (an answer_start "abc", a break of three
        # numbers): not the SQuAD/XQuAD-R shape
        raise DatasetError(f"{path}: not XQuAD-R (SQuAD JSON with sentences and sentence_breaks): "
                           f"paragraph {para}: {type(exc).__name__} {exc}") from None
    return LanguageData(lang, contexts, sentences, questions, counts, qids)


def load_xquad_r(data_dir: str | Path, langs: Sequence[str] | None = None) -> XQuADR:
    """Load ``langs`` (default: all files in ``data_dir``) and check that they are parallel.

    Raises :class:`DatasetNotFoundError` (a ``FileNotFoundError``) for a missing folder or
    file and :class:`DatasetError` (a ``ValueError``) for files that break the rules.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DatasetNotFoundError(f"XQuAD-R folder not found: {data_dir}")
    # a language given twice would pool its sentences and questions twice
    langs = list(dict.fromkeys(langs or available_langs(data_dir)))
    if not langs:
        raise DatasetNotFoundError(f"no <lang>.json files in {data_dir}")
    missing = [lang for lang in langs if not (data_dir / f"{lang}.json").is_file()]
    if missing:
        raise DatasetNotFoundError(f"no XQuAD-R file for {', '.join(missing)} in {data_dir} "
                                   f"(available: {', '.join(available_langs(data_dir))})")
    by_lang = {lang: load_language(data_dir / f"{lang}.json", lang) for lang in langs}
    first = by_lang[langs[0]]
    for lang in langs[1:]:
        other = by_lang[lang]
        if len(other.contexts) != len(first.contexts):
            raise DatasetError(f"not parallel: {lang} has {len(other.contexts)} paragraphs, "
                               f"{langs[0]} has {len(first.contexts)}")
        if other.qids != first.qids:
            raise DatasetError(f"not parallel: the question ids of {lang} differ from {langs[0]}'s")
    relevant: dict[str, dict[str, str]] = {}
    for lang in langs:
        for q in by_lang[lang].questions:
            relevant.setdefault(q.qid, {})[lang] = doc_id(lang, q.para, q.answer_sentence)
    return XQuADR(langs, by_lang, relevant)


def load_xquad_r_dataset(data_dir: str | Path, langs: Sequence[str] | None = None) -> EvalDataset:
    """XQuAD-R as an :class:`EvalDataset` (see :meth:`XQuADR.to_eval_dataset`)."""
    dataset = load_xquad_r(data_dir, langs).to_eval_dataset()
    dataset.info["path"] = str(data_dir)
    return dataset


# -- BEIR -----------------------------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _lines(path: Path, problems: list[Problem]) -> Iterator[tuple[int, str]]:
    """Non-empty lines of a UTF-8 file with their numbers, streamed (a BEIR corpus can be
    gigabytes); an undecodable line is a problem, not the end of the file."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problems.append(Problem(str(path), f"not valid UTF-8 at byte {exc.start} of the line", lineno))
                continue
            if line.strip():
                yield lineno, line.rstrip("\r\n")


def jsonl_objects(path: Path, problems: list[Problem]) -> Iterator[tuple[int, dict[str, Any]]]:
    """JSON objects of a JSONL file; malformed lines (``NaN`` included) become problems."""
    for lineno, line in _lines(path, problems):
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except ValueError as exc:
            problems.append(Problem(str(path), f"malformed JSON: {exc}", lineno))
            continue
        except RecursionError:  # a line of 100,000 "[": json recurses once a level
            problems.append(Problem(str(path), "malformed JSON: nested too deeply", lineno))
            continue
        if not isinstance(obj, dict):
            problems.append(Problem(str(path), "a JSONL line must be an object", lineno))
            continue
        yield lineno, obj


def _text(value: Any) -> str:
    return str(value).strip() if value is not None else ""


def _lang(value: Any, problems: list[Problem], path: Path, lineno: int) -> str | None:
    """A record's language as the index stores codes ("pt-BR" -> "pt"); one that is not a
    language code is reported and left out, to be detected."""
    from vecplug.types import lang_code

    try:
        return lang_code(_text(value))
    except ValueError as exc:
        problems.append(Problem(str(path), f"field lang: {exc}: detected instead", lineno, kept=True))
        return None


def beir_splits(folder: str | Path) -> list[str]:
    """The qrels splits of a BEIR folder (``qrels/<split>.tsv``), sorted."""
    return sorted(p.stem for p in (Path(folder) / "qrels").glob("*.tsv"))


def is_beir(folder: str | Path) -> bool:
    """Whether ``folder`` looks like a BEIR dataset (corpus, queries and a qrels folder)."""
    folder = Path(folder)
    return (folder / "corpus.jsonl").is_file() and (folder / "queries.jsonl").is_file()


def load_beir(folder: str | Path, split: str | None = None, *, name: str | None = None) -> EvalDataset:
    """Read a BEIR-format folder (see the module docstring).

    ``split`` names ``qrels/<split>.tsv``; by default ``test``, else the folder's only split.
    Titles are prepended to the text that is embedded (``title\\ntext``, as the corpus reader
    appends its embed fields) and kept as payload, with every other field. Only queries with at
    least one relevant document (grade > 0) in the split are evaluated; those judged with none
    are counted in ``info["queries_without_relevant"]`` (BEIR's own tools score them 0).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetNotFoundError(f"BEIR folder not found: {folder}")
    for required in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / required).is_file():
            raise DatasetNotFoundError(f"{folder} is not a BEIR folder: {required} is missing")
    splits = beir_splits(folder)
    if split is None:
        if "test" in splits:
            split = "test"
        elif len(splits) == 1:
            split = splits[0]
        else:
            raise DatasetNotFoundError(
                f"{folder}: no qrels/test.tsv; choose a split among: {', '.join(splits) or '(none)'}")
    if split not in splits:
        raise DatasetNotFoundError(f"{folder}: no qrels/{split}.tsv (splits: {', '.join(splits) or 'none'})")

    problems: list[Problem] = []
    corpus_path = folder / "corpus.jsonl"
    documents: list[Document] = []
    doc_ids: set[str] = set()
    for lineno, obj in jsonl_objects(corpus_path, problems):
        did = _text(obj.get("_id"))
        if not did:
            problems.append(Problem(str(corpus_path), "record has no _id", lineno))
            continue
        if did in doc_ids:
            problems.append(Problem(str(corpus_path), f"document id {did} appears again: skipped", lineno))
            continue
        nested = [k for k in ("title", "text") if isinstance(obj.get(k), (list, dict))]
        if nested:  # str() would embed "['a', 'b']"
            problems.append(Problem(str(corpus_path), f"document {did}: {nested[0]} is not a string", lineno))
            continue
        title, text = _text(obj.get("title")), _text(obj.get("text"))
        if not title and not text:
            problems.append(Problem(str(corpus_path), f"document {did} has neither title nor text", lineno))
            continue
        doc_ids.add(did)
        payload = {"id": did, **{k: v for k, v in obj.items() if k not in ("_id", "text", "lang")}}
        embed = "\n".join(p for p in (title, text) if p)
        documents.append(Document(id=did, text=embed, source="corpus.jsonl", position=lineno,
                                  lang=_lang(obj.get("lang"), problems, corpus_path, lineno), payload=payload))

    queries_path = folder / "queries.jsonl"
    all_queries: dict[str, EvalQuery] = {}
    for lineno, obj in jsonl_objects(queries_path, problems):
        if isinstance(obj.get("text"), (list, dict)):
            problems.append(Problem(str(queries_path), "query text is not a string", lineno))
            continue
        qid, text = _text(obj.get("_id")), _text(obj.get("text"))
        if not qid or not text:
            problems.append(Problem(str(queries_path), "query needs _id and text", lineno))
            continue
        if qid in all_queries:
            problems.append(Problem(str(queries_path), f"query id {qid} appears again: skipped", lineno))
            continue
        all_queries[qid] = EvalQuery(qid, text, _lang(obj.get("lang"), problems, queries_path, lineno))

    qrels_path = folder / "qrels" / f"{split}.tsv"
    qrels: dict[str, dict[str, int]] = {}
    judged = 0
    seen: set[tuple[str, str]] = set()
    first = True
    for lineno, line in _lines(qrels_path, problems):
        cells = line.split("\t")
        if len(cells) != 3:
            cells = line.split()  # some copies use spaces
        header, first = first and len(cells) == 3, False
        if len(cells) != 3:
            problems.append(Problem(str(qrels_path), f"expected 3 columns (query-id corpus-id score), "
                                                     f"found {len(cells)}", lineno))
            continue
        qid, did, score = (c.strip() for c in cells)
        try:
            grade = int(score)
        except ValueError:
            # a header names its columns (query-id corpus-id score, or another spelling); a first
            # line naming a known query is a judgement with a bad score, reported as any other
            if header and qid not in all_queries:
                continue
            problems.append(Problem(str(qrels_path), f"score {score!r} is not an integer", lineno))
            continue
        if qid not in all_queries:
            problems.append(Problem(str(qrels_path), f"query {qid} is not in queries.jsonl", lineno))
            continue
        if did not in doc_ids:
            problems.append(Problem(str(qrels_path), f"document {did} is not in corpus.jsonl", lineno))
            continue
        if (qid, did) in seen:  # the first judgement holds, whatever the grades
            problems.append(Problem(str(qrels_path), f"query {qid} and document {did} are judged again: "
                                                     "skipped", lineno))
            continue
        seen.add((qid, did))
        judged += 1
        if grade > 0:  # 0 (or below) means judged not relevant
            qrels.setdefault(qid, {})[did] = grade

    queries = [q for q in all_queries.values() if q.id in qrels]
    # judged, but nothing relevant: BEIR's tools would score them 0; they are left out and counted
    without = len({q for q, _ in seen} - set(qrels))
    return EvalDataset(name or folder.name, documents, queries, qrels, None, problems,
                       info={"format": "beir", "path": str(folder), "split": split,
                             "judgements": judged, "queries_without_relevant": without})


# -- one spec for both -----------------------------------------------------------------------

FORMATS = ("xquad-r", "beir")


def load_dataset(spec: str, *, langs: Sequence[str] | None = None,
                 split: str | None = None) -> EvalDataset:
    """``xquad-r:PATH``, ``beir:PATH``, or a folder whose files say which it is.

    ``langs`` picks XQuAD-R languages (default: every file); ``split`` a BEIR qrels split.
    """
    fmt, _, path = spec.partition(":")
    if fmt not in FORMATS or not path:
        fmt, path = "", spec
    folder = Path(path)
    if not fmt:
        if not folder.is_dir():
            raise DatasetNotFoundError(f"dataset folder not found: {folder} (give xquad-r:PATH or beir:PATH)")
        if is_beir(folder):
            fmt = "beir"
        elif available_langs(folder):
            fmt = "xquad-r"
        else:
            raise DatasetError(f"{folder}: neither a BEIR folder (corpus.jsonl, queries.jsonl, qrels/) "
                               "nor XQuAD-R (<lang>.json files)")
    if fmt == "beir":
        if langs:
            raise DatasetError("--langs picks XQuAD-R languages; a BEIR dataset is evaluated whole")
        return load_beir(folder, split)
    if split:
        raise DatasetError("a split applies to BEIR datasets only")
    return load_xquad_r_dataset(folder, langs)
