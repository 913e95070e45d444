"""Settings: frozen dataclasses, loaded with precedence flag > ``VECPLUG_*`` env > YAML > defaults.

The YAML file mirrors the sections below (unknown keys are rejected)::

    index:  {path: .vecplug, store: hnswlib, url: null, collection: vecplug,
             hnsw_m: null, hnsw_ef_construction: null, hnsw_ef_search: null, hnsw_centred: null}
    model:  {document: null, query_max_length: null, document_max_length: null}
    corpus: {chunk_tokens: null, chunk_overlap: null, embed_fields: null, lang: null}
    search: {k: 10, mode: xy, debias: null, rerank: null, rerank_depth: 50, rerank_gate: null}

Each key can also be set from the environment as ``VECPLUG_<SECTION>_<KEY>``, e.g.
``VECPLUG_INDEX_STORE=qdrant`` or ``VECPLUG_SEARCH_K=5`` (a ``VECPLUG_<SECTION>_`` variable that
names no key is rejected, as an unknown YAML key is); ``VECPLUG_CONFIG`` names a file.
Language codes (``corpus.lang``, ``search.lang``, ``search.langs``) are stripped and lower-cased.
A null model or corpus setting means "as the index was built" (its manifest); a new index
takes me5-small, 64/256-token limits, 200-token passages with 32 of overlap and the fields
title, description, text.
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from vecplug.errors import ConfigError
from vecplug.indexer.precision import PRECISIONS
from vecplug.types import lang_code

MODES = ("xy", "mono", "prefer")
#: the largest count or length a setting takes (torch threads and Qdrant limits are C ints)
MAX_COUNT = 2**31 - 1
#: the collection of an index on a Qdrant server unless one is named
DEFAULT_COLLECTION = "vecplug"
QUANTIZE = ("auto", "none", "int8")
RUNTIMES = ("torch", "onnx")
#: field metadata of a language code setting, normalised as :func:`normalise_langs` does
LANG_CODES: Mapping[str, Any] = {"lang_codes": True}
#: field metadata of language codes that also name files (Tatoeba's ``deu``, ``cmn``): read as
#: LANG_CODES are, but a three-letter code is kept as written (``file_codes``)
FILE_LANG_CODES: Mapping[str, Any] = {"lang_codes": "file"}
#: field metadata of a setting where "" is a value (no prefix), not "unset"
BLANK_IS_VALUE: Mapping[str, Any] = {"blank_is_value": True}


def normalise_langs(value: str | Iterable[Any] | None, *, file_codes: bool = False) -> tuple[str, ...]:
    """Language codes as the detector writes them (``"de"``): stripped, lower-cased, region
    subtags dropped (:func:`~vecplug.types.lang_code`), empty entries and repeats dropped; a
    string is split at commas (``" de , FR,de-AT"`` -> ``("de", "fr")``). ``file_codes``: the
    same, but a three-letter code is kept as written (``"DEU"`` -> ``"deu"``, not ``"de"``): it
    may name a file (Tatoeba's ``cmn``, of the three Chinese ones)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    try:
        codes = [_file_code(str(v)) if file_codes else lang_code(str(v)) for v in items]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # a repeat would pool (and score) a language twice
    return tuple(dict.fromkeys(code for code in codes if code))


def _file_code(value: str) -> str | None:
    """A language code checked as :func:`~vecplug.types.lang_code` checks it, stripped,
    lower-cased, its region subtag dropped, but not mapped to the detector's two letters."""
    lang_code(value)  # ValueError for what is no code
    return value.strip().replace("_", "-").split("-")[0].lower() or None


@dataclass(frozen=True)
class IndexSettings:
    #: index folder (hnswlib, embedded Qdrant); ignored for a Qdrant server given by ``url``
    path: str = ".vecplug"
    #: store name from the registry: hnswlib (default), flat (exact search), qdrant, or a plugin's
    store: str = "hnswlib"
    #: Qdrant server or cluster URL (implies store qdrant)
    url: str | None = None
    collection: str = DEFAULT_COLLECTION
    api_key: str | None = None
    #: embedded Qdrant: a reader (search) always reads a private copy of the last commit, so a
    #: long-lived one (a search service) never keeps a writer out; off, a reader that finds the
    #: index free opens it in place (no copy: right for one-off searches) and holds it as a
    #: writer would until it closes
    reader_copy: bool = False
    #: hnswlib graph parameters; None: the index's own (recorded in its manifest when it was
    #: created), else :data:`~vecplug.types.HNSW_DEFAULTS` for a new index. A value set here
    #: wins over the recorded one (``hnsw_m`` and ``hnsw_ef_construction`` shape only a graph
    #: not built yet; ``hnsw_ef_search`` is the search breadth of this process)
    hnsw_m: int | None = None
    hnsw_ef_construction: int | None = None
    hnsw_ef_search: int | None = None
    #: a new hnswlib index's graph holds each document centred by its language's mean
    #: (``adapters/stores/centring.py``): the language-bias correction is then one graph walk
    #: instead of a search per language (200,000 to a million documents in 32 languages: 14-27x
    #: faster, README "What the correction costs on a large index"), and a
    #: search without it (``--no-debias``, ``mono``) is the one that goes language by language.
    #: Shapes only a graph not built yet (recorded in the manifest); None: off
    hnsw_centred: bool | None = None
    #: language-bias correction on by default for searches of this index (recorded in its
    #: manifest when the index is created; ``search.debias`` overrides it per search). On:
    #: it nearly doubles pooled X-Y quality on XQuAD-R and leaves same-language ranking as is
    debias: bool = True


@dataclass(frozen=True)
class ModelSettings:
    #: document encoder: built-in name, model folder or hub id; None = the index's own
    #: (or me5-small for a new index)
    document: str | None = None
    #: query encoder; None = the document encoder
    query: str | None = None
    #: tokens kept of a query / a document; None: what the index was built with (its
    #: manifest), else 64 / 256. An index refuses documents cut at another length (their
    #: vectors would not match those it holds)
    query_max_length: int | None = None
    document_max_length: int | None = None
    #: prefixes put before each query and document (None: the index's, else the model's, such as
    #: E5's "query: "); an empty string is a value here: no prefix
    query_prefix: str | None = field(default=None, metadata=BLANK_IS_VALUE)
    document_prefix: str | None = field(default=None, metadata=BLANK_IS_VALUE)
    batch_tokens: int = 8192
    threads: int | None = None
    #: the query encoder's weights: ``int8`` (torch dynamic quantisation of its linear layers:
    #: faster on a CPU; a student's recipe, ``indexer.torch_int8``, uses the peaks shipped
    #: with it, or calibrates once in ~5 s, cached), ``none`` (float32), or ``auto``: int8 for
    #: a student whose metadata says its quality was measured in int8 (the shipped default
    #: is), on an x86 CPU; else float32. The figures are in the README.
    query_quantize: str | None = "auto"
    #: the document encoder's weights: ``none`` (float32) or ``int8`` (the documents' recipe,
    #: under torch or ONNX Runtime: 99.1-99.8% of float32's XQuAD-R figures; torch runs its
    #: float layers in ``precision``, ``indexer.torch_int8_documents``); None: the index's
    #: (recorded in its manifest), else none
    document_quantize: str | None = None
    #: what runs the transformer: ``torch``, or ``onnx`` (ONNX Runtime, ``pip install
    #: 'vecplug[onnx]'``): the same float32 vectors, faster on a CPU, and its own int8 recipe;
    #: the graph is exported on first use into ``$VECPLUG_HOME/onnx``. None: the index's
    #: (recorded in its manifest), else torch
    runtime: str | None = None
    #: torch runtime: once an encoder has run 3 small forward passes (queries in a long-lived
    #: process) it traces its model into a TorchScript graph, kept only if it gives the eager
    #: model's output (the same vectors, less overhead: README "Speed"); false keeps it eager
    trace: bool = True
    #: torch runtime: the document encoder's batches run through ``torch.compile`` (Inductor;
    #: needs a C++ compiler): faster indexing of a large corpus after ~40 s of compilation on
    #: the first batch (cached in ``$VECPLUG_HOME/cache/inductor``); the same vectors. Queries
    #: never are. README "Speed"; ``indexer.compiled``
    compile: bool = False
    #: what torch computes an unquantised model in: ``float32``, ``bfloat16`` (several times
    #: faster on a CPU with AMX, emulated and slower elsewhere; vectors within a cosine of
    #: ~0.99998 of float32's), or ``auto``: bfloat16 where the CPU has AMX, else float32. Not
    #: bound to an index (either precision's vectors rank alike); ONNX Runtime ignores it
    precision: str = "auto"


#: how a new index cuts and reads its documents (an existing index: as its manifest records)
CORPUS_DEFAULTS: Mapping[str, Any] = {"chunk_tokens": 200, "chunk_overlap": 32,
                                      "embed_fields": ("title", "description", "text")}


@dataclass(frozen=True)
class CorpusSettings:
    #: passage length and overlap in tokens, and the record fields embedded; None: as the index
    #: was built (a later run that cut or read otherwise would encode every document again),
    #: for a new index :data:`CORPUS_DEFAULTS`
    chunk_tokens: int | None = None
    chunk_overlap: int | None = None
    embed_fields: tuple[str, ...] | None = None
    #: language of every document (skips detection), e.g. "de"
    lang: str | None = field(default=None, metadata=LANG_CODES)
    max_file_mb: int = 64


@dataclass(frozen=True)
class SearchSettings:
    k: int = 10
    mode: str = "xy"
    #: the query's language (skips detection)
    lang: str | None = field(default=None, metadata=LANG_CODES)
    #: answer only in these languages (xy and prefer modes); empty = every language
    langs: tuple[str, ...] = field(default=(), metadata=LANG_CODES)
    #: prefer mode: added to the score of documents in the query's language
    prefer_boost: float = 0.05
    #: remove each language's mean vector before scoring (None: the index's setting)
    debias: bool | None = None
    #: second stage: teacher (teacher:int8: the teacher's queries in int8; teacher:auto: int8
    #: on a CPU without AMX), fields, cross-encoder:MODEL, or a plugin's name (None: off)
    rerank: str | None = None
    #: first-stage candidates the reranker rescores
    rerank_depth: int = 50
    #: rerank only the queries whose first-stage margin (best minus second-best score in the
    #: query's language) is below this; None: every query (:mod:`vecplug.adapters.rerank.gate`)
    rerank_gate: float | None = None
    #: token limit of a cross-encoder's (query, document) pair
    rerank_max_length: int = 256
    #: HNSW search breadth for these searches (None: the index's ``hnsw_ef_search``); higher
    #: finds more of the exact neighbours and costs more (figures in the README)
    ef: int | None = None
    #: translation consensus (pooled modes): an answer's copies in other languages count as
    #: evidence for it and rank right behind it (:mod:`vecplug.adapters.consensus`)
    consensus: bool = False
    #: centred cosine from which two documents in different languages count as the same text
    #: (me5-small on XQuAD-R: translation pairs 0.61 at the median, 0.79 at the 90th
    #: percentile; random pairs of two languages 0.25 at the 99th: benchmarks/consensus_probe.py)
    consensus_threshold: float = 0.4
    #: candidates of each language consensus regroups (with a reranker: the reranker's list)
    consensus_depth: int = 40


@dataclass(frozen=True)
class Settings:
    index: IndexSettings = field(default_factory=IndexSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    corpus: CorpusSettings = field(default_factory=CorpusSettings)
    search: SearchSettings = field(default_factory=SearchSettings)

    def validate(self) -> "Settings":
        for section in SECTIONS:
            for f in dataclasses.fields(getattr(self, section)):
                value = getattr(getattr(self, section), f.name)
                # a C int downstream (torch threads, Qdrant's limit): an OverflowError traceback
                if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_COUNT:
                    raise ConfigError(f"{section}.{f.name} must be at most {MAX_COUNT}, not {value}")
        if self.search.mode not in MODES:
            raise ConfigError(f"search.mode must be one of {', '.join(MODES)}, not '{self.search.mode}'")
        for name, value in (("search.k", self.search.k), ("corpus.chunk_tokens", self.corpus.chunk_tokens),
                            ("model.query_max_length", self.model.query_max_length),
                            ("model.document_max_length", self.model.document_max_length),
                            ("model.batch_tokens", self.model.batch_tokens),
                            ("search.rerank_depth", self.search.rerank_depth),
                            ("search.rerank_max_length", self.search.rerank_max_length),
                            ("search.consensus_depth", self.search.consensus_depth),
                            ("index.hnsw_ef_construction", self.index.hnsw_ef_construction),
                            ("index.hnsw_ef_search", self.index.hnsw_ef_search),
                            ("model.threads", self.model.threads),
                            ("corpus.max_file_mb", self.corpus.max_file_mb)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1, not {value}")

        # hnswlib takes M < 2 without a word, then fails at the first insert (M 0 kills the process)
        if self.index.hnsw_m is not None and self.index.hnsw_m < 2:
            raise ConfigError(f"index.hnsw_m must be at least 2, not {self.index.hnsw_m}")
        if self.search.ef is not None and self.search.ef < 1:
            raise ConfigError(f"search.ef must be at least 1, not {self.search.ef}")
        if self.model.query_quantize not in (None, *QUANTIZE):  # None: as "none"
            raise ConfigError(f"model.query_quantize must be one of {', '.join(QUANTIZE)} or null, "
                              f"not '{self.model.query_quantize}'")
        if self.model.document_quantize not in (None, "none", "int8"):
            raise ConfigError(f"model.document_quantize must be none or int8, "
                              f"not '{self.model.document_quantize}'")
        if self.model.precision not in PRECISIONS:
            raise ConfigError(f"model.precision must be one of {', '.join(PRECISIONS)}, "
                              f"not '{self.model.precision}'")
        if self.model.runtime not in (None, *RUNTIMES):
            raise ConfigError(f"model.runtime must be one of {', '.join(RUNTIMES)}, not '{self.model.runtime}'")
        if self.index.url is not None and not self.index.url.lower().startswith(("http://", "https://")):
            # without a scheme it was taken for a folder: "no vecplug index at localhost:6333"
            raise ConfigError(f"index.url must start with http:// or https://, not {self.index.url!r} "
                              "(e.g. http://localhost:6333)")
        # NaN would leave the scores unsortable; inf would tie every same-language answer
        if not math.isfinite(self.search.prefer_boost):
            raise ConfigError(f"search.prefer_boost must be a finite number, not {self.search.prefer_boost}")
        rerank_gate(self.search.rerank_gate, "search.rerank_gate")
        if not -1.0 <= self.search.consensus_threshold <= 1.0:  # a cosine (NaN fails too)
            raise ConfigError("search.consensus_threshold is a cosine, between -1 and 1, not "
                              f"{self.search.consensus_threshold}")
        if self.corpus.chunk_overlap is not None and self.corpus.chunk_overlap < 0:
            raise ConfigError(f"corpus.chunk_overlap must be >= 0, not {self.corpus.chunk_overlap}")
        if (self.corpus.chunk_overlap is not None and self.corpus.chunk_tokens is not None
                and self.corpus.chunk_overlap > self.corpus.chunk_tokens // 2):
            raise ConfigError(f"corpus.chunk_overlap ({self.corpus.chunk_overlap}) must be at most half of "
                              f"corpus.chunk_tokens ({self.corpus.chunk_tokens})")
        if self.corpus.embed_fields is not None and not [f for f in self.corpus.embed_fields if f.strip()]:
            # every record would lack them: a run would report each and prune the whole index
            raise ConfigError("corpus.embed_fields names no field; give at least one (e.g. text)")
        return self


def rerank_gate(value: Any, name: str = "rerank_gate") -> float | None:
    """A rerank gate (``search.rerank_gate``, or a search's ``rerank_gate``) checked: None
    (every query is reranked) or a finite score margin above 0; else a ConfigError naming it."""
    if value is None:
        return None
    # NaN fails the comparison too; a bool is no margin
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} is a score margin above 0 (e.g. 0.03), or null for every query; not {value!r}")
    return float(value)


SECTIONS: dict[str, type] = {
    "index": IndexSettings, "model": ModelSettings, "corpus": CorpusSettings, "search": SearchSettings,
}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert ``value`` (from YAML or an env string) to the field type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _apply(tp(), value, where)
    if origin is tuple and args and dataclasses.is_dataclass(args[0]):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        for i, v in enumerate(value):
            if not isinstance(v, str):  # str() made null "None" and [a] "['a']"
                raise ConfigError(f"{where}[{i}]: expected a string, got {_not_text(v)}")
        return tuple(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp in (int, float):
        what = "an integer" if tp is int else "a number"
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected {what}, got {value!r}")
        if tp is int and isinstance(value, float) and not value.is_integer():
            # int() would cut 2.9 to 2 (and fail on inf): a YAML float is an integer only if whole
            raise ConfigError(f"{where}: expected {what}, got {value!r}")
        try:
            return tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {what}, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list, bool, int, float)):
            raise ConfigError(f"{where}: expected a string, got {_not_text(value)}")
        if value is None or not str(value).strip():
            # str(None) made an index folder named "None"; "" one in the current folder
            raise ConfigError(f"{where}: expected a string, got {'null' if value is None else repr(value)} "
                              "(leave the key out for its default)")
        return str(value)
    return value


def _not_text(value: Any) -> str:
    """How a value that should have been text reads, with the reason when YAML made it so."""
    if isinstance(value, (bool, int, float)):
        # str() turned a YAML boolean or number into text no one wrote: "False" for "no" or
        # "off", "83" for "0123", "31" for "0x1F"
        return (f"the {type(value).__name__} {value!r} (YAML reads unquoted yes/no/on/off and "
                "numbers such as 0123 or 0x1F so): quote it")
    return "null" if value is None else repr(value)


def _lang_codes(value: Any, where: str, file_codes: bool = False) -> Any:
    """A language code setting normalised: a tuple as :func:`normalise_langs`, one code the
    same way (blank: None)."""
    try:
        if isinstance(value, tuple):
            return normalise_langs(value, file_codes=file_codes)
        codes = normalise_langs(None if value is None else [value], file_codes=file_codes)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return codes[0] if codes else None


def _norwegian(value: Any) -> Any:
    """YAML 1.1 reads an unquoted ``no`` (Norwegian) as false; no other language code reads as
    a boolean."""
    if isinstance(value, list):
        return [_norwegian(v) for v in value]
    return "no" if value is False else value


def _check_keys(values: Mapping[Any, Any], where: str) -> None:
    """Every key a string: YAML 1.1 reads an unquoted ``on``, ``off``, ``yes``, ``no``, ``true``
    or ``false`` as a boolean and ``1`` as an integer, which name no setting (and would not
    sort beside the other keys in the error)."""
    for key in values:
        if isinstance(key, bool):
            written = "on, yes or true" if key else "off, no or false"
            raise ConfigError(f"{where}: a key written {written} without quotes reads as the boolean {key} "
                              f"in YAML, not as a name: quote it, e.g. '{written.split(',')[0]}'")
        if not isinstance(key, str):
            raise ConfigError(f"{where}: YAML reads the key {key!r} as {type(key).__name__}, not as a name: "
                              f"quote it, e.g. '{key}'")


def _apply(base: Any, values: Mapping[str, Any], where: str) -> Any:
    _check_keys(values, where)
    hints = typing.get_type_hints(type(base))
    fields = {f.name: f for f in dataclasses.fields(base)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    changes = {}
    for k, v in values.items():
        if fields[k].metadata.get("blank_is_value") and isinstance(v, str) and not v:
            changes[k] = ""  # an empty prefix, where "" elsewhere means the default
        elif fields[k].metadata.get("lang_codes"):
            # every source (flag, env, YAML) gives codes the way the index stores them: " FR" -> "fr"
            changes[k] = _lang_codes(_coerce(_norwegian(v), hints[k], f"{where}.{k}"), f"{where}.{k}",
                                     file_codes=fields[k].metadata["lang_codes"] == "file")
        else:
            changes[k] = _coerce(v, hints[k], f"{where}.{k}")
    return dataclasses.replace(base, **changes)


def _unique_keys(node: Any, path: str | Path) -> None:
    """Refuse a mapping that gives a key twice (YAML would keep the last silently: a second
    ``search:`` section dropped the first's settings)."""
    import yaml

    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        raise ConfigError(f"{path}:{key.start_mark.line + 1}: '{key.value}' is given "
                                          "twice in the same mapping; give it once")
                    seen.add((key.tag, key.value))
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def read_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # (e.g. saved as UTF-16)
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x}); "
                          "save the config as UTF-8") from None
    try:
        _unique_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        data = yaml.safe_load(text)  # never yaml.load: a config must not run code
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def env_values(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The ``VECPLUG_<SECTION>_<KEY>`` variables by section. One that starts like a section's
    but names none of its keys is an error (a typo would otherwise be ignored); other
    ``VECPLUG_*`` variables (``VECPLUG_HOME``, ``VECPLUG_CONFIG``) are not settings."""
    out: dict[str, dict[str, str]] = {}
    for section, cls in SECTIONS.items():
        prefix = f"VECPLUG_{section.upper()}_"
        keys = {f"{prefix}{f.name.upper()}": f.name for f in dataclasses.fields(cls)}
        for name in sorted(n for n in environ if n.startswith(prefix)):
            if name not in keys:
                raise ConfigError(f"environment: {name} names no {section} setting; the {section} keys are "
                                  f"{', '.join(sorted(keys.values()))} (as {prefix}<KEY>)")
            out.setdefault(section, {})[keys[name]] = environ[name]
    return out


def load_settings(config_file: str | Path | None = None,
                  overrides: Mapping[str, Mapping[str, Any]] | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Defaults, then the YAML file (``config_file`` or ``$VECPLUG_CONFIG``), then
    ``VECPLUG_*`` variables, then ``overrides`` (flags; ``None`` values are ignored)."""
    environ = os.environ if environ is None else environ
    settings = Settings()
    config_file = config_file or environ.get("VECPLUG_CONFIG")
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if config_file:
        layers.append((str(config_file), read_yaml(config_file)))
    layers.append(("environment", env_values(environ)))
    layers.append(("options", {s: {k: v for k, v in vals.items() if v is not None}
                               for s, vals in (overrides or {}).items()}))
    for where, data in layers:
        _check_keys(data, where)
        unknown = sorted(set(data) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"{where}: unknown section(s) {', '.join(unknown)}; "
                              f"known: {', '.join(SECTIONS)}")
        for section, values in data.items():
            if values is None:
                continue
            if not isinstance(values, Mapping):
                raise ConfigError(f"{where}: section '{section}' must be a mapping")
            if section == "index" and "url" not in values and (
                    str(values.get("store", "")).strip() in ("hnswlib", "flat") or values.get("path") is not None):
                # a URL means a Qdrant server: a layer above that names a folder's store, or a
                # folder (--index DIR over VECPLUG_INDEX_URL), overrides it (in one layer, the URL wins)
                values = {**values, "url": None}
            current = getattr(settings, section)
            settings = dataclasses.replace(settings, **{section: _apply(current, values, f"{where}: {section}")})
    return settings.validate()


def load_train_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Any:
    """A :class:`~vecplug.indexer.train_config.TrainConfig` from YAML (unknown keys rejected at
    every level), then ``overrides`` (flags; ``None`` values ignored)."""
    from vecplug.indexer.train_config import TrainConfig

    config = _apply(TrainConfig(), read_yaml(path), str(path))
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return _apply(config, given, "options") if given else config
