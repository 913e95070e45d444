"""Scoring retrievers on an evaluation dataset (``vecplug eval``).

One index of the dataset's documents is built with the document encoder (or reused), then
each *run* searches every query in one batch and is scored:

* a :class:`Run` is a query encoder (None: the index's default student), a mode (``xy``:
  every language pooled; ``mono``: the query's language only; ``prefer``: pooled, the query's
  language ranked up), a reranker (None: none) and the language-bias correction (None: the
  index's setting; each result records the setting the search used, ``debias_effective``);
* queries whose language the dataset does not give get the one a search would give them
  (``search.lang``, else detected), once, before ``limit`` keeps the first N of each language;
* pooled modes (``xy``, ``prefer``) are scored with the dataset's ``qrels`` (for XQuAD-R the
  answer sentence in every language, LAReQA's X-Y); ``mono`` with ``mono_qrels`` when the
  dataset has them, else ``qrels`` restricted to documents in the query's language;
* per run: mAP@20 (LAReQA's AP), nDCG@10, MRR@10, recall@20, P@1, overall, per query
  language and (pooled) per document language; the language-bias measures; a question
  language x document language matrix (share of queries whose relevant document of that
  language is in the top 20); and time per query from the results' ``seconds``.

:class:`EvalReport` renders the Markdown report, the JSON with every number and one SVG
heatmap of the language-pair matrix per pooled run.

The searching is done through two methods of :class:`vecplug.api.Index`, ``search_batch``
and ``score_ids`` (:class:`SearchIndex`), so :func:`score_runs` can be tested with any
object that has them. Evaluation data is only ever searched, never trained on.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from xml.sax.saxutils import escape

from vecplug import metrics
from vecplug.config import DEFAULT_COLLECTION, CorpusSettings, IndexSettings, Settings
from vecplug.errors import ConfigError, VecplugError
from vecplug.indexer.datasets import EvalDataset, EvalQuery
from vecplug.report import fmt, header_markdown, markdown_table, pct
from vecplug.types import Problem

MODES = ("xy", "mono", "prefer")
#: modes whose pool holds every language: scored with the pooled qrels, and with bias measures
POOLED = ("xy", "prefer")
DEFAULT_MODES = ("xy", "mono")
MODE_TITLES = {
    "xy": "X-Y: every language pooled",
    "mono": "X-X-mono: the query's language only",
    "prefer": "prefer: every language pooled, the query's ranked up",
}
#: results asked for per query (the deepest cut-off below)
DEPTH = 20
#: (key, label) of the per-query metrics, in report order
METRICS: tuple[tuple[str, str], ...] = (
    ("map@20", "mAP@20"), ("ndcg@10", "nDCG@10"), ("mrr@10", "MRR@10"),
    ("recall@20", "recall@20"), ("p@1", "P@1"))
#: the metric of the per-language tables, by mode
HEADLINE = {"xy": "map@20", "prefer": "map@20", "mono": "mrr@10"}
#: top-k whose same-language share measures language bias
BIAS_K = 10
#: cut-off of the per-document-language recall and the language-pair matrix
PAIR_K = 20

#: LAReQA's published figures (../shared/docs/anchors.md): a different setting, for orientation.
LAREQA_REFERENCE: dict[str, Any] = {
    "source": "LAReQA (Roy et al. 2020, arXiv 2004.05484), ../shared/docs/anchors.md",
    "setting": ("mBERT dual encoders fine-tuned on SQuAD and its translations, XQuAD-R with 11 "
                "languages pooled; every figure is the pooled X-Y mAP@20 of a model trained in the "
                "named setup ('X-X-mono' names a training setup, not a same-language pool)"),
    "metric": "map@20",
    "figures": {"trained X-Y": 0.66, "trained X-X-mono": 0.52},
}


class SearchIndex(Protocol):
    """What :func:`score_runs` needs of an index (:class:`vecplug.api.Index` has it)."""

    def search_batch(self, queries: Sequence[str], k: int, *, mode: str,
                     langs: Sequence[str | None] | None = None,
                     target_langs: Sequence[str] | None = None, rerank: str | None = None,
                     rerank_depth: int | None = None, debias: bool | None = None,
                     consensus: bool | None = None, rerank_gate: float | None = None,
                     progress: bool = False) -> list[Any]: ...

    def score_ids(self, vector: Any, ids: Sequence[str], query_lang: str | None,
                  debias: bool | None = None) -> Any: ...

    def close(self) -> None: ...


# -- runs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One retriever configuration to score.

    ``query_encoder`` None: the index's default; ``rerank`` None: no second stage;
    ``rerank_gate`` None: the reranker sees every query, else only those whose first-stage
    margin is below it (``search.rerank_gate``); ``debias`` None: the index's setting;
    ``consensus`` (translation consensus) None: ``search.consensus``.
    ``label`` names the run in the report (unique per mode).
    """

    label: str
    query_encoder: str | None = None
    mode: str = "xy"
    rerank: str | None = None
    debias: bool | None = None
    consensus: bool | None = None
    rerank_gate: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode '{self.mode}'; modes: {', '.join(MODES)}")
        if self.rerank_gate is not None and not self.rerank:
            raise ConfigError(f"run '{self.label}' gates a reranker (rerank_gate) but has none")

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "query_encoder": self.query_encoder, "mode": self.mode,
                "rerank": self.rerank, "rerank_gate": self.rerank_gate, "debias": self.debias,
                "consensus": self.consensus}


def encoder_names(query_encoders: Iterable[str | None]) -> dict[str | None, str]:
    """A short name for each query encoder: None is the default one, a folder is named by the
    shortest trailing part of its path that tells it apart from the others (``runA/student``
    and ``runB/student``, where both are ``student``), anything else (a built-in name, a hub
    id) as given."""
    specs = list(dict.fromkeys(query_encoders))
    folders = {q: Path(q).resolve().parts for q in specs if q is not None and Path(q).exists()}
    names: dict[str | None, str] = {q: "default query encoder" if q is None else q
                                    for q in specs if q not in folders}
    for q, parts in folders.items():
        others = [o for other, o in folders.items() if other != q]
        for n in range(1, len(parts) + 1):
            name = str(Path(*parts[-n:]))
            if name not in names.values() and all(o[-n:] != parts[-n:] for o in others):
                break
        else:
            name = q  # two spellings of one folder: nothing tells them apart but the spelling
        names[q] = name
    return names


def run_label(query_encoder: str | None, rerank: str | None, debias: bool | None,
              names: Mapping[str | None, str] | None = None, consensus: bool | None = None,
              rerank_gate: float | None = None) -> str:
    """A short name: the query encoder (``names[query_encoder]``, else a folder by its name),
    then rerank (with its gate), debias and consensus if set."""
    if names is None or query_encoder not in names:
        names = encoder_names([query_encoder])
    parts = [names[query_encoder]]
    if rerank:
        parts.append(f"rerank {rerank}" + (f" below margin {rerank_gate:g}" if rerank_gate is not None else ""))
    if debias is not None:
        parts.append("debias" if debias else "no debias")
    if consensus is not None:
        parts.append("consensus" if consensus else "no consensus")
    return " + ".join(parts)


def make_runs(query_encoders: Sequence[str | None] = (None,), modes: Sequence[str] = DEFAULT_MODES,
              reranks: Sequence[str | None] = (None,),
              debias: Sequence[bool | None] = (None,),
              consensus: Sequence[bool | None] = (None,),
              gates: Sequence[float | None] = (None,)) -> list[Run]:
    """Every combination of the given query encoders, modes, rerankers, debias and consensus
    settings, mode by mode (so each mode's table lists its runs side by side); ``mono`` runs
    ignore ``debias`` and ``consensus`` (neither changes a one-language ranking); each
    reranked run is made once per rerank gate in ``gates`` (None: ungated)."""
    def unique(values: Sequence[Any]) -> list[Any]:
        return list(dict.fromkeys(values)) or [None]

    runs = []
    names = encoder_names(unique(query_encoders))
    for mode in unique(modes) if modes else list(DEFAULT_MODES):
        for q in unique(query_encoders):
            for r in unique([None if r in (None, "", "none") else r for r in reranks]):
                # the correction never changes a mono ranking (one language, one mean): one run
                for d in (unique(debias) if mode != "mono" else [None]):
                    for c in (unique(consensus) if mode != "mono" else [None]):
                        for g in (unique(gates) if r else [None]):
                            runs.append(Run(run_label(q, r, d, names, c, g), q, mode, r, d, c, g))
    return runs


# -- scoring ----------------------------------------------------------------------------------

@dataclass
class RunResult:
    """The scores of one run: the aggregates (``summary``) and every query's numbers."""

    run: Run
    summary: dict[str, Any]
    queries: list[dict[str, Any]]
    #: the encoders the index searched with (``describe()``), when known
    encoder: dict[str, Any] | None = None
    #: the language-bias correction the searches used: ``run.debias``, else the index's setting
    #: (None when the index cannot say); mono searches never apply it
    debias: bool | None = None
    #: where ``debias`` came from when the run did not choose: the user's ``search.debias``
    #: setting or the index's own
    debias_from: str = "the index's setting"
    #: the reranker the run searched with (its ``describe()``), when it had one and the index says
    reranker: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        # "debias" stays what the run asked for (None: the index's setting), beside what that meant
        return {"run": {**self.run.to_dict(), "debias_effective": self.debias}, "encoder": self.encoder,
                "reranker": self.reranker, "summary": self.summary, "queries": self.queries}


def mode_qrels(dataset: EvalDataset, mode: str, query: EvalQuery, query_lang: str | None,
               doc_langs: Mapping[str, str | None]) -> dict[str, int]:
    """The relevance a query is scored with in ``mode`` (see the module docstring)."""
    qrels = dataset.qrels.get(query.id, {})
    if mode in POOLED:
        return dict(qrels)
    if dataset.mono_qrels is not None:
        return dict(dataset.mono_qrels.get(query.id, {}))
    return {d: g for d, g in qrels.items() if doc_langs.get(d) == query_lang}


def score_query(ranked: Sequence[str], hit_langs: Sequence[str | None], relevance: Mapping[str, int],
                query_lang: str | None, doc_langs: Mapping[str, str | None], pooled: bool) -> dict[str, Any]:
    """One query's metrics; pooled modes add the language-bias shares and, per document
    language, the recall@20 of the relevant documents in that language."""
    row: dict[str, Any] = {
        "map@20": metrics.average_precision_at_k(ranked, relevance, 20),
        "ndcg@10": metrics.ndcg_at_k(ranked, relevance, 10),
        "mrr@10": metrics.reciprocal_rank_at_k(ranked, relevance, 10),
        "recall@20": metrics.recall_at_k(ranked, relevance, 20),
        "p@1": metrics.precision_at_1(ranked, relevance),
    }
    if pooled:
        relevant = metrics.relevant_ids(relevance)
        row["same_lang@10"] = metrics.same_language_share(hit_langs, query_lang, BIAS_K)
        row["expected_same_lang"] = metrics.expected_same_language_share(
            [doc_langs.get(d) for d in sorted(relevant)], query_lang)
        by_lang: dict[str, set[str]] = defaultdict(set)
        for d in relevant:
            by_lang[doc_langs.get(d) or "und"].add(d)
        row["found@20"] = {lang: metrics.recall_at_k(ranked, ids, PAIR_K) for lang, ids in sorted(by_lang.items())}
    return row


def _score_gap(index: SearchIndex, result: Any, relevance: Mapping[str, int], query_lang: str | None,
               doc_langs: Mapping[str, str | None], debias: bool | None) -> float | None:
    """First-stage score of the relevant same-language document(s) minus that of the relevant
    other-language ones, for one query (None when it has not both)."""
    vector = getattr(result, "vector", None)
    relevant = sorted(metrics.relevant_ids(relevance))
    same = [d for d in relevant if doc_langs.get(d) == query_lang]
    other = [d for d in relevant if doc_langs.get(d) != query_lang]
    if vector is None or not same or not other:
        return None
    scores = [float(s) for s in index.score_ids(vector, same + other, query_lang, debias=debias)]
    return metrics.relevant_score_gap(scores[:len(same)], scores[len(same):])


def aggregate(rows: Sequence[Mapping[str, Any]], pooled: bool) -> dict[str, Any]:
    """Means of the per-query rows: overall, per query language and, pooled, per document
    language, per language pair and the bias measures."""
    def means(subset: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"queries": len(subset)}
        for key, _ in METRICS:
            out[key] = metrics.mean([r[key] for r in subset])
        return out

    by_lang: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_lang[r["lang"]].append(r)
    summary: dict[str, Any] = {"overall": means(rows),
                               "by_query_lang": {lang: means(v) for lang, v in sorted(by_lang.items())}}
    seconds = [r["seconds"] for r in rows]
    summary["timing"] = {"seconds": float(sum(seconds)),
                         "ms_per_query": 1000 * metrics.mean(seconds) if seconds else None}
    reranked = [float(r["reranked"]) for r in rows if r.get("reranked") is not None]
    # the share of queries the reranker rescored (1.0 ungated; None: no reranker)
    summary["reranked"] = metrics.mean(reranked) if reranked else None
    if not pooled:
        return summary
    found: dict[str, list[float]] = defaultdict(list)
    pairs: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for dlang, value in r["found@20"].items():
            found[dlang].append(value)
            pairs[r["lang"]][dlang].append(value)
    summary["by_doc_lang"] = {lang: {"recall@20": metrics.mean(v), "queries": len(v)}
                              for lang, v in sorted(found.items())}
    summary["pairs"] = {q: {d: metrics.mean(v) for d, v in sorted(cols.items())}
                        for q, cols in sorted(pairs.items())}
    share = metrics.mean([r["same_lang@10"] for r in rows])
    expected = metrics.mean([r["expected_same_lang"] for r in rows])
    gaps = [r["score_gap"] for r in rows if r.get("score_gap") is not None]
    summary["bias"] = {
        "same_lang@10": share, "expected_same_lang": expected,
        "excess": share - expected if share is not None and expected is not None else None,
        "score_gap": metrics.mean(gaps), "score_gap_queries": len(gaps),
        "by_query_lang": {lang: {"same_lang@10": metrics.mean([r["same_lang@10"] for r in v]),
                                 "expected_same_lang": metrics.mean([r["expected_same_lang"] for r in v]),
                                 "score_gap": metrics.mean([r.get("score_gap") for r in v])}
                          for lang, v in sorted(by_lang.items())},
    }
    return summary


def score_runs(dataset: EvalDataset, runs: Sequence[Run],
               open_index: Callable[[str | None], SearchIndex], *,
               doc_langs: Mapping[str, str | None] | None = None, k: int = DEPTH,
               rerank_depth: int | None = None, progress: bool = False,
               log: Callable[[str], None] | None = None) -> list[RunResult]:
    """Search every query of ``dataset`` once per run and score the results.

    ``open_index(query_encoder)`` opens the index for a query encoder (None: its default); it
    is opened once per distinct query encoder and closed after that encoder's runs.
    ``doc_langs`` maps document ids to their language (default: the dataset's documents').
    Results come back in the order of ``runs``.
    """
    _check_runs(runs)
    if doc_langs is None:
        doc_langs = {d.id: d.lang for d in dataset.documents}
    queries = dataset.queries
    if not queries:
        raise no_queries_error(dataset)
    texts = [q.text for q in queries]
    given = [q.lang for q in queries]
    # as BEIR's evaluation does: a document whose id is the query's own is not an answer (ArguAna
    # and Quora hold their queries in the corpus); one more is searched for, so that k remain
    drop_self = dataset.info.get("format") == "beir"
    results: dict[int, RunResult] = {}
    by_encoder: dict[str | None, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        by_encoder[run.query_encoder].append(i)
    for query_encoder, indices in by_encoder.items():
        index = open_index(query_encoder)
        try:
            encoder = _describe(index)
            for i in indices:
                run = runs[i]
                if log:
                    log(f"{run.mode}: {run.label} ({len(queries)} queries)")
                # "none" (not None) so that a reranker named in the settings does not sneak in
                # consensus only when the run sets it: a SearchIndex of before it needs no new argument
                chosen: dict[str, Any] = {} if run.consensus is None else {"consensus": run.consensus}
                if run.rerank_gate is not None:  # likewise
                    chosen["rerank_gate"] = run.rerank_gate
                found = index.search_batch(texts, k + int(drop_self), mode=run.mode, langs=given, target_langs=(),
                                           rerank=run.rerank or "none", rerank_depth=rerank_depth,
                                           debias=run.debias, progress=progress, **chosen)
                if len(found) != len(queries):
                    raise VecplugError(f"search_batch returned {len(found)} results for {len(queries)} queries")
                pooled = run.mode in POOLED
                rows = []
                skipped = 0
                for q, result in zip(queries, found):
                    qlang = q.lang or getattr(result, "lang", None) or "und"
                    relevance = mode_qrels(dataset, run.mode, q, qlang, doc_langs)
                    if not metrics.relevant_ids(relevance):
                        skipped += 1  # nothing to find in this mode (e.g. mono, no same-language answer)
                        continue
                    hits = [h for h in result.hits if not (drop_self and h.id == q.id)][:k]
                    row = {"id": q.id, "lang": qlang, "search_lang": getattr(result, "lang", None),
                           "seconds": float(result.seconds), "reranked": getattr(result, "reranked", None),
                           **score_query([h.id for h in hits], [h.lang for h in hits], relevance, qlang,
                                         doc_langs, pooled)}
                    if pooled:
                        row["score_gap"] = _score_gap(index, result, relevance, qlang, doc_langs, run.debias)
                    rows.append(row)
                summary = aggregate(rows, pooled)
                summary["skipped_queries"] = skipped
                results[i] = RunResult(run, summary, rows, encoder, _effective_debias(index, run.debias),
                                       _debias_source(index), _describe_reranker(index, run.rerank))
        finally:
            index.close()
    return [results[i] for i in range(len(runs))]


def no_queries_error(dataset: EvalDataset) -> VecplugError:
    """The error for a dataset left without queries, with the skipped input that is often why
    (e.g. every judgement names a document the corpus lacks)."""
    message = f"{dataset.name}: no queries to evaluate"
    problems = dataset.problems
    if problems:
        shown = "; ".join(str(p) for p in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        message += (f" ({len(problems)} bad input line{'s' * (len(problems) != 1)} skipped: "
                    f"{shown}{more})")
    return VecplugError(message)


def _effective_debias(index: Any, debias: bool | None) -> bool | None:
    """The correction setting a search given ``debias`` uses: ``debias``, else the index's own
    (:meth:`vecplug.api.Index.debias_for`: ``search.debias``, else the index's manifest); None when
    the index cannot say (stand-ins in tests)."""
    if debias is not None:
        return debias
    resolve = getattr(index, "debias_for", None)
    return bool(resolve(None)) if callable(resolve) else None


def _debias_source(index: Any) -> str:
    """What decides the correction of a run that does not: the user's ``search.debias``
    (settings, environment) when set, else the index's own setting."""
    search = getattr(getattr(index, "settings", None), "search", None)
    return "search.debias" if getattr(search, "debias", None) is not None else "the index's setting"


def _check_runs(runs: Sequence[Run]) -> None:
    if not runs:
        raise ConfigError("no runs to evaluate")
    seen: set[tuple[str, str]] = set()
    for run in runs:
        if (run.mode, run.label) in seen:
            raise ConfigError(f"two runs in mode {run.mode} are both labelled '{run.label}'")
        seen.add((run.mode, run.label))


def _describe(index: Any) -> dict[str, Any] | None:
    """The index's encoder description, if it has one (stand-ins in tests need not)."""
    encoder = getattr(index, "encoder", None)
    describe = getattr(encoder, "describe", None)
    return describe() if callable(describe) else None


def _describe_reranker(index: Any, spec: str | None) -> dict[str, Any] | None:
    """The run's reranker as the index describes it (after its searches: ``teacher:auto``
    resolved), if it has one and the index can say (stand-ins in tests need not)."""
    describe = getattr(index, "describe_reranker", None)  # None for no reranker ("none" included)
    return describe(spec) if callable(describe) else None


# -- the whole evaluation -----------------------------------------------------------------------

@dataclass
class EvalReport:
    """Everything one evaluation measured; :meth:`markdown`, :meth:`to_dict` and
    :meth:`heatmaps` render it, :meth:`write` saves all three."""

    machine: dict[str, Any]
    dataset: dict[str, Any]
    index: dict[str, Any]
    settings: dict[str, Any]
    results: list[RunResult]
    references: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, per_query: bool = True) -> dict[str, Any]:
        """Every number, JSON-ready (without each query's own with ``per_query=False``)."""
        runs = [r.to_dict() for r in self.results]
        if not per_query:
            runs = [{k: v for k, v in r.items() if k != "queries"} for r in runs]
        return {"machine": self.machine, "dataset": self.dataset, "index": self.index,
                "settings": self.settings, "references": self.references, "runs": runs}

    def markdown(self) -> str:
        return render_markdown(self)

    def heatmaps(self) -> dict[str, str]:
        """``{file name: SVG}``: the language-pair matrix of each pooled run."""
        langs = self.dataset.get("languages") or None
        out: dict[str, str] = {}
        names = heatmap_names(self.results)
        for i, r in enumerate(self.results):
            if i not in names:
                continue
            name = names[i]
            rows = _ordered(r.summary["pairs"].keys(), langs)
            cols = _ordered({d for v in r.summary["pairs"].values() for d in v}, langs)
            out[name] = heatmap_svg(
                r.summary["pairs"], rows, cols,
                f"{self.dataset['name']}, {r.run.mode}: {r.run.label}",
                subtitle=f"share of queries whose relevant document in that language is in the top {PAIR_K}")
        return out

    def write(self, out_dir: str | Path, per_query: bool = True) -> list[Path]:
        """Write ``report.md``, ``report.json`` and ``heatmap-*.svg`` into ``out_dir`` (made if
        missing); :class:`OutputError` when they cannot be written."""
        from vecplug.fsutil import atomic_write_bytes

        folder = output_folder(out_dir)
        files = {"report.md": self.markdown() + "\n",
                 "report.json": json.dumps(self.to_dict(per_query), indent=2, ensure_ascii=False) + "\n",
                 **self.heatmaps()}
        written = []
        for name, text in files.items():
            try:
                atomic_write_bytes(folder / name, text.encode("utf-8"))
            except OSError as exc:
                raise OutputError(f"cannot write the report file {folder / name}: {exc.strerror or exc}") from exc
            written.append(folder / name)
        return written


class OutputError(VecplugError):
    """The report cannot be written where asked (a file in the way, no permission, a full disk)."""


def output_folder(out_dir: str | Path) -> Path:
    """``out_dir``, made if missing and checked writable, or :class:`OutputError`. Called before
    an evaluation too, so that a bad ``--out`` fails at once rather than after hours of it."""
    folder = Path(out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a file can be made in it (gone when closed)
            pass
    except OSError as exc:
        raise OutputError(f"cannot write the report into {folder}: {exc.strerror or exc}"
                          + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(folder) else "")
                          ) from exc
    return folder


def dataset_summary(dataset: EvalDataset) -> dict[str, Any]:
    """Counts and provenance of a dataset, for the report."""
    docs = dataset.document_languages()
    queries = dataset.query_languages()
    judged = sum(len(metrics.relevant_ids(v)) for v in dataset.qrels.values())
    langs = dataset.info.get("langs") or sorted({k for k in docs if k} | {k for k in queries if k})
    return {
        "name": dataset.name, **{k: v for k, v in dataset.info.items() if k != "langs"},
        "languages": list(langs),
        "documents": len(dataset.documents),
        "documents_by_lang": _by_lang(docs),
        "queries": len(dataset.queries),
        "queries_by_lang": _by_lang(queries),
        #: queries whose language was detected (the dataset did not give it)
        "queries_detected": sum(q.detected for q in dataset.queries),
        "relevant_pairs": judged,
        "mono_qrels": dataset.mono_qrels is not None,
        "problems": [str(p) for p in dataset.problems],
    }


def _by_lang(counts: Mapping[str | None, int]) -> dict[str, int]:
    """Counts by language, sorted; items without a given language (detected at search or
    indexing time) under ``detected``."""
    return dict(sorted((lang or "detected", n) for lang, n in counts.items()))


def evaluate(dataset: EvalDataset, runs: Sequence[Run], *, index_dir: str | Path | None = None,
             model: str | None = None, k: int = DEPTH, rerank_depth: int | None = None,
             references: Sequence[Mapping[str, Any]] | None = None, progress: bool = False,
             command: str | None = None, log: Callable[[str], None] | None = None,
             limit: int | None = None) -> EvalReport:
    """Index ``dataset``'s documents with the document encoder ``model`` and score ``runs``.

    Queries without a language get the one a search would give them (``search.lang``, else
    detected), once for every run; ``limit`` then keeps the first ``limit`` queries of each
    language (every document stays in the pool).

    ``index_dir``: an index folder to build into and keep, or to reuse when it already holds the
    dataset's documents (unchanged documents are not encoded again); one that holds other
    documents is refused. Default: a temporary folder, removed at the end. ``references``:
    published figures to print beside the results, clearly as another setting (default: LAReQA's
    for XQuAD-R, none otherwise). ``command`` is recorded in the report header (default: this
    process's command line).

    Settings (:func:`index_settings`): the user's model and search settings apply (YAML,
    ``$VECPLUG_CONFIG``, ``VECPLUG_*``), ``model`` on top; the corpus settings never (the
    documents keep the dataset's languages); a temporary index takes the index settings from
    the defaults too (no ``index.url`` sends the dataset to a server), an ``index_dir`` the user's.
    """
    from vecplug.api import Index, settings_for
    from vecplug.report import machine_info

    _check_runs(runs)
    if not dataset.queries:
        raise no_queries_error(dataset)  # before the corpus is encoded for nothing
    # before limiting: the first N of each language needs every query's language (the search
    # settings do not depend on the index folder)
    dataset = dataset.with_query_langs(_query_lang_detector(settings_for(None).search.lang))
    dataset = dataset.limited(limit)
    info = machine_info(command)
    if references is None:
        references = [LAREQA_REFERENCE] if dataset.info.get("format") == "xquad-r" else []
    tmp = None
    if index_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="vecplug-eval-")
        path = Path(tmp.name) / "index"
    else:
        path = Path(index_dir)
    try:
        private = tmp is not None
        index_info, doc_langs, refused, problems = _build_index(
            dataset, index_settings(str(path), private, document=model), progress, log)
        index_info["path"] = None if private else str(path)
        # documents the index refused (a payload no store can hold...) cannot be found: their
        # judgements go, reported with the index's reasons, instead of counting as misses
        dataset = dataset.without_documents(refused, problems)

        def open_for(query_encoder: str | None) -> SearchIndex:
            return Index.open(index_settings(str(path), private, document=model, query=query_encoder))

        results = score_runs(dataset, runs, open_for, doc_langs=doc_langs, k=k,
                             rerank_depth=rerank_depth, progress=progress, log=log)
    finally:
        if tmp is not None:
            tmp.cleanup()
    settings = {"k": k, "rerank_depth": rerank_depth, "bias_k": BIAS_K, "pair_k": PAIR_K,
                "metrics": [key for key, _ in METRICS],
                "map_definition": "LAReQA AP@k: sum of precision at each relevant rank <= k, over min(R, k)",
                "ndcg_gains": "linear (the grade), log2(rank + 1) discount",
                "runs": [r.to_dict() for r in runs]}
    return EvalReport(info, dataset_summary(dataset), index_info, settings, results,
                      [dict(r) for r in references])


def _query_lang_detector(search_lang: str | None) -> Callable[[str], str]:
    """How :meth:`vecplug.api.Index.search_batch` names the language of a query given none:
    ``search.lang`` when set, else detected (the detector loads on first use)."""
    if search_lang:
        return lambda text: search_lang
    detector: Any = None

    def detect(text: str) -> str:
        nonlocal detector
        if detector is None:
            from vecplug.indexer.langid import LanguageDetector

            detector = LanguageDetector()
        return detector.detect(text)

    return detect


def index_settings(path: str, private: bool, **model: str | None) -> Settings:
    """The settings of the index an evaluation builds and searches at ``path``.

    The user's settings (YAML, ``$VECPLUG_CONFIG``, ``VECPLUG_*``) give the encoders' and the
    searches' (``model``: runtime, threads, quantisation, what is evaluated; ``search``), with
    ``model`` (eval's flags; None values ignored) on top. The corpus section is always the
    defaults': the dataset's documents carry their own languages, which ``corpus.lang`` would
    overwrite. A ``private`` (temporary) index takes the index section from the defaults as
    well, ``path`` aside, so that no store setting sends the dataset elsewhere (a Qdrant server
    by ``index.url``); an index folder given to eval (``--index``) keeps the user's store and
    graph settings but is that folder: a server URL (and its collection and key) is dropped."""
    from vecplug.api import settings_for

    user = settings_for(path, model=model)
    if private:
        index = IndexSettings(path=path)
    else:
        index = dataclasses.replace(user.index, path=path, url=None, api_key=None,
                                    collection=DEFAULT_COLLECTION)
    return dataclasses.replace(user, index=index, corpus=CorpusSettings())


def _build_index(dataset: EvalDataset, settings: Settings, progress: bool,
                 log: Callable[[str], None] | None
                 ) -> tuple[dict[str, Any], dict[str, str | None], set[str], list[Problem]]:
    """Create or update the index ``settings`` point at so that it holds exactly the dataset's
    documents; returns what was done, every document's language as stored, the ids of the
    documents the index does not hold (refused) and the problems the indexing reported."""
    from vecplug.api import Index

    path = settings.index.path
    wanted = {d.id for d in dataset.documents}
    with Index.open(settings, create=True) as index:
        existing = set(index.store.ids())
        extra = existing - wanted
        if extra:
            example = ", ".join(sorted(extra)[:3])
            raise VecplugError(f"the index at {path} holds {len(extra)} documents that are not in "
                               f"{dataset.name} (e.g. {example}): give an empty or new --index folder")
        if log:
            log(f"indexing {len(dataset.documents)} documents into {path}"
                + (f" ({len(existing)} already there)" if existing else ""))
        report = index.add_documents(dataset.documents, progress=progress)
        # the language a document was stored with is the one mono filters by; read back those
        # the dataset did not give (detected while indexing)
        doc_langs: dict[str, str | None] = {d.id: d.lang for d in dataset.documents if d.lang}
        unknown = [d.id for d in dataset.documents if not d.lang]
        for start in range(0, len(unknown), 1000):
            for record in index.store.get(unknown[start:start + 1000]):
                doc_langs[record.id] = record.lang
        refused = wanted - set(index.store.ids())
        count = index.store.count()
        encoder = index.encoder.describe()
        centred = bool(getattr(index.store, "centred", False))
    return ({"reused": bool(existing) and report.documents == 0, "documents": count,
             "report": report.to_dict(), "encoder": encoder, "centred_graph": centred},
            doc_langs, refused, list(report.problems))


# -- the Markdown report ----------------------------------------------------------------------

def _ordered(values: Iterable[str], preferred: Sequence[str] | None) -> list[str]:
    """``values`` in the dataset's language order, others after, sorted."""
    values = set(values)
    first = [v for v in (preferred or []) if v in values]
    return first + sorted(values - set(first))


def render_markdown(report: EvalReport) -> str:
    """The report: header, one table per mode with the runs side by side, per-language tables,
    the bias measures, the language pairs and the reference figures."""
    d, ix, st = report.dataset, report.index, report.settings
    langs = d.get("languages") or []
    out: list[str] = [header_markdown(f"vecplug eval: {d['name']}", report.machine), ""]

    def counts(by_lang: Mapping[str, int]) -> str:
        return ", ".join(f"{k} {v:,}" for k, v in by_lang.items())

    where = f"{d.get('format', '?')} {d.get('path', '')}".strip()
    if d.get("split"):
        where += f", split {d['split']}"
    detected = d.get("queries_detected")
    out.append(f"- dataset: {where}: {d['documents']:,} documents ({counts(d['documents_by_lang'])}); "
               f"{d['queries']:,} queries ({counts(d['queries_by_lang'])}"
               + (f"; the language of {detected:,} detected" if detected else "") + ")"
               + (f", the first {d['limit_per_language']} per language" if d.get("limit_per_language") else "")
               + f"; {d['relevant_pairs']:,} relevant (query, document) pairs"
               + (f"; {d['queries_without_relevant']:,} queries judged with no relevant document "
                  "left out" if d.get("queries_without_relevant") else ""))
    if d["problems"]:
        out.append(f"- {len(d['problems'])} bad input lines skipped (listed in report.json), e.g. "
                   f"`{d['problems'][0]}`")
    enc = ix.get("encoder") or {}
    rep = ix.get("report") or {}
    built = ("reused (no document re-encoded)" if ix.get("reused") else
             f"{rep.get('documents', 0):,} documents encoded in {rep.get('seconds', 0.0):.1f} s")
    out.append(f"- index: {ix.get('path') or 'temporary folder'}, {ix.get('documents', 0):,} documents, {built}; "
               f"document encoder {enc.get('document_encoder', '?')} "
               f"({str(enc.get('document_encoder_checksum', ''))[:12]}"
               + (f", computed in {enc['precision']}" if enc.get("precision") else "") + ")"
               + ("; its graph holds language-centred vectors (index.hnsw_centred)" if ix.get("centred_graph") else ""))
    seen: dict[str | None, str] = {}
    names = encoder_names(r.run.query_encoder for r in report.results)  # as make_runs names them
    for r in report.results:
        if r.run.query_encoder not in seen and r.encoder:
            seen[r.run.query_encoder] = (f"{names[r.run.query_encoder]} = "
                                         f"{r.encoder.get('query_encoder', '?')} "
                                         f"({str(r.encoder.get('query_encoder_checksum', ''))[:12]}"
                                         + (f", {r.encoder['query_quantize']} weights"
                                            if r.encoder.get("query_quantize") else
                                            f", {r.encoder['precision']}" if r.encoder.get("precision") else "")
                                         + ")")
    if seen:
        out.append("- query encoders: " + "; ".join(seen.values()))
    out.append(f"- each run searches all queries in one batch, top {st['k']}"
               + (f", rerank depth {st['rerank_depth']}" if st.get("rerank_depth") else "")
               + "; mAP@20 is LAReQA's (precision at each relevant rank <= 20, over min(#relevant, 20)), "
                 "nDCG@10 with linear graded gains; ms per query = encode + search + rerank, the batch "
                 "time shared out")

    results_by_mode: dict[str, list[RunResult]] = defaultdict(list)
    for r in report.results:
        results_by_mode[r.run.mode].append(r)

    for mode in (m for m in MODES if m in results_by_mode):
        group = results_by_mode[mode]
        labels = [r.run.label for r in group]
        relevance = ("the dataset's relevance, every language" if mode in POOLED else
                     "same-language relevance" + ("" if d.get("mono_qrels") else
                                                  " (the judgements restricted to the query's language)"))
        out += ["", f"### {MODE_TITLES[mode]}", "", f"Scored with {relevance}.", ""]
        rows = [["language-bias correction", *(debias_text(r) for r in group)]]
        if mode in POOLED and any(r.run.consensus is not None for r in group):
            rows.append(["translation consensus", *({True: "on", False: "off", None: "search.consensus"}
                                                     [r.run.consensus] for r in group)])
        rows += [[label, *(fmt(r.summary["overall"][key]) for r in group)] for key, label in METRICS]
        if mode in POOLED:
            rows.append([f"same-language share of top {BIAS_K}",
                         *(pct(r.summary["bias"]["same_lang@10"]) for r in group)])
        if any(r.run.rerank_gate is not None for r in group):
            rows.append(["queries reranked", *("-" if r.summary.get("reranked") is None else
                                               pct(r.summary["reranked"]) for r in group)])
        rows.append(["ms per query", *(fmt(r.summary["timing"]["ms_per_query"], 1) for r in group)])
        rows.append(["queries", *(f"{r.summary['overall']['queries']:,}" for r in group)])
        if any(r.summary.get("skipped_queries") for r in group):
            rows.append(["queries without a relevant document here",
                         *(str(r.summary.get("skipped_queries", 0)) for r in group)])
        out.append(markdown_table(["metric", *labels], rows))

    out += ["", "### By query language"]
    for mode in (m for m in MODES if m in results_by_mode):
        group = results_by_mode[mode]
        key = HEADLINE[mode]
        name = dict(METRICS)[key]
        qlangs = _ordered({lang for r in group for lang in r.summary["by_query_lang"]}, langs)
        rows = [[lang, *(fmt((r.summary["by_query_lang"].get(lang) or {}).get(key)) for r in group)]
                for lang in qlangs]
        rows.append(["**all**", *(fmt(r.summary["overall"][key]) for r in group)])
        out += ["", f"{MODE_TITLES[mode]}, {name}:", "",
                markdown_table(["query lang", *(r.run.label for r in group)], rows)]

    pooled = [r for r in report.results if r.run.mode in POOLED]
    if pooled:
        out += ["", f"### By document language (pooled modes): recall@{PAIR_K} of the relevant documents "
                    "in each language", ""]
        dlangs = _ordered({lang for r in pooled for lang in r.summary["by_doc_lang"]}, langs)
        out.append(markdown_table(
            ["document lang", *(f"{r.run.mode}: {r.run.label}" for r in pooled)],
            [[lang, *(fmt((r.summary["by_doc_lang"].get(lang) or {}).get("recall@20")) for r in pooled)]
             for lang in dlangs]))

        out += ["", "### Language bias (pooled modes)", "",
                f"Same-language share of the top {BIAS_K} beside the expected share (the share of a "
                "query's relevant documents in its own language: what a ranking blind to language "
                "would give); the score gap is the first-stage score of the relevant same-language "
                "document minus the mean of the relevant other-language ones (0 = no preference).", ""]
        out.append(markdown_table(
            ["run", "mode", "correction", f"same-language share of top {BIAS_K}", "expected share", "excess",
             "score gap (same - other)", "queries with a gap"],
            [[r.run.label, r.run.mode, debias_text(r), pct(r.summary["bias"]["same_lang@10"]),
              pct(r.summary["bias"]["expected_same_lang"]), pct(r.summary["bias"]["excess"]),
              fmt(r.summary["bias"]["score_gap"]), f"{r.summary['bias']['score_gap_queries']:,}"]
             for r in pooled], "lllrrrrr"))

        out += ["", f"### Language pairs: share of queries (rows: query language) whose relevant document "
                    f"in each document language (columns) is in the top {PAIR_K}"]
        names = heatmap_names(report.results)
        for i, r in enumerate(report.results):
            if i not in names:
                continue
            pairs = r.summary["pairs"]
            rows_l = _ordered(pairs.keys(), langs)
            cols_l = _ordered({c for v in pairs.values() for c in v}, langs)
            out += ["", f"{r.run.mode}: {r.run.label} (`{names[i]}`)", "",
                    markdown_table(["query \\ document", *cols_l],
                                   [[q, *(pct(pairs[q].get(c), 0) for c in cols_l)] for q in rows_l])]

    if report.references:
        out += ["", "### Reference figures (a different setting: not directly comparable)", ""]
        for ref in report.references:
            metric = dict(METRICS).get(ref.get("metric", ""), ref.get("metric", ""))
            out.append(markdown_table(["reference", metric],
                                      [[name, fmt(value, 2)] for name, value in ref["figures"].items()]))
            out += ["", f"{ref.get('setting', '')}. Source: {ref.get('source', '')}.", ""]
        if d.get("format") == "xquad-r":
            out.append(f"This run pools {len(langs)} language{'s' * (len(langs) != 1)} (fewer distractors "
                       "and fewer relevant sentences per question than LAReQA's 11) and uses other models, "
                       "trained otherwise.")
    return "\n".join(out).rstrip()


def debias_text(result: RunResult) -> str:
    """The correction a run's searches used, for the report: on/off, and whether it was the
    run's choice or the index's setting (mono searches never apply it)."""
    state = {True: "on", False: "off", None: "the index's setting"}[result.debias]
    if result.run.debias is None and result.debias is not None:
        state += f" ({result.debias_from})"
    if result.run.mode == "mono":
        state += ", not applied in mono"
    return state


# -- the heatmap --------------------------------------------------------------------------------

def heatmap_name(run: Run) -> str:
    """The SVG file name of a run's language-pair heatmap (letters of any script kept)."""
    slug = re.sub(r"[\W_]+", "-", run.label.lower()).strip("-") or "run"
    return f"heatmap-{run.mode}-{slug}.svg"


def heatmap_names(results: Sequence[RunResult]) -> dict[int, str]:
    """``{position in results: file name}`` of the runs that have a heatmap (pooled, with
    language pairs), unique: two labels of the same slug (``org/model`` and ``org_model``)
    get ``-2``, ``-3``... rather than one file overwriting the other."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    for i, r in enumerate(results):
        if r.run.mode not in POOLED or not r.summary.get("pairs"):
            continue
        name = base = heatmap_name(r.run)
        n = 1
        while name in taken:
            n += 1
            name = f"{base[:-len('.svg')]}-{n}.svg"
        taken.add(name)
        names[i] = name
    return names


def _colour(value: float) -> tuple[str, str]:
    """Fill (white to dark blue as value goes 0 to 1) and a readable text colour."""
    v = min(max(value, 0.0), 1.0)
    low, high = (247, 251, 255), (8, 48, 107)
    rgb = tuple(round(a + (b - a) * v) for a, b in zip(low, high))
    return "#%02x%02x%02x" % rgb, ("#ffffff" if v > 0.5 else "#000000")


def heatmap_svg(matrix: Mapping[str, Mapping[str, float | None]], rows: Sequence[str], cols: Sequence[str],
                title: str, *, subtitle: str = "", row_title: str = "query language",
                col_title: str = "document language", cell: int = 56) -> str:
    """A hand-written SVG heatmap: one cell per (row, column) coloured by its value in [0, 1],
    the value (as a percentage) written in it; missing values are grey with a dash."""
    left, top = 110, 96
    width = left + cell * len(cols) + 20
    height = top + cell * len(rows) + 20
    width = max(width, 7 * max(len(title), len(subtitle)) + 20)  # room for the title
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="10" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    if subtitle:
        parts.append(f'<text x="10" y="40" font-size="11" fill="#444444">{escape(subtitle)}</text>')
    parts.append(f'<text x="{left + cell * len(cols) / 2:.0f}" y="{top - 28}" font-size="12" '
                 f'text-anchor="middle">{escape(col_title)}</text>')
    parts.append(f'<text x="16" y="{top + cell * len(rows) / 2:.0f}" font-size="12" text-anchor="middle" '
                 f'transform="rotate(-90 16 {top + cell * len(rows) / 2:.0f})">{escape(row_title)}</text>')
    for j, c in enumerate(cols):
        parts.append(f'<text x="{left + cell * j + cell / 2:.0f}" y="{top - 8}" font-size="12" '
                     f'text-anchor="middle">{escape(str(c))}</text>')
    for i, r in enumerate(rows):
        y = top + cell * i
        parts.append(f'<text x="{left - 8}" y="{y + cell / 2 + 4:.0f}" font-size="12" '
                     f'text-anchor="end">{escape(str(r))}</text>')
        for j, c in enumerate(cols):
            x = left + cell * j
            value = (matrix.get(r) or {}).get(c)
            if value is None:
                fill, ink, label = "#dddddd", "#555555", "-"
            else:
                (fill, ink), label = _colour(float(value)), f"{100 * float(value):.0f}%"
            parts.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" '
                         f'stroke="#ffffff" stroke-width="1"><title>{escape(f"{r} -> {c}: {label}")}</title></rect>')
            parts.append(f'<text x="{x + cell / 2:.0f}" y="{y + cell / 2 + 4:.0f}" font-size="12" '
                         f'text-anchor="middle" fill="{ink}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
