from pathlib import Path

import pytest

from vecplug.config import SearchSettings, Settings, load_settings
from vecplug.errors import ConfigError


def test_defaults() -> None:
    s = load_settings(environ={})
    assert s == Settings()
    assert s.index.store == "hnswlib" and s.search.mode == "xy"


def test_precedence_flag_over_env_over_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("search: {k: 3, mode: mono}\nindex: {store: qdrant, path: from-yaml}\n")
    env = {"VECPLUG_SEARCH_K": "7", "VECPLUG_CONFIG": str(cfg)}
    s = load_settings(overrides={"search": {"k": 9, "lang": None}}, environ=env)
    assert s.search.k == 9            # flag wins
    assert s.search.mode == "mono"    # yaml, nothing above it
    assert s.index.path == "from-yaml"
    assert load_settings(environ=env).search.k == 7  # env over yaml


def test_a_store_named_above_a_server_url_wins(tmp_path: Path) -> None:
    """A URL (a Qdrant server) from YAML or the environment gives way to a higher layer that
    names hnswlib (``--store hnswlib``); a URL in the same or a higher layer stays."""
    from vecplug.api import _store_target

    cfg = tmp_path / "c.yaml"
    cfg.write_text("index: {url: 'http://127.0.0.1:9'}\n")
    flag = {"index": {"store": "hnswlib", "path": "idx"}}
    for env in ({"VECPLUG_CONFIG": str(cfg)}, {"VECPLUG_INDEX_URL": "http://127.0.0.1:9"}):
        assert _store_target(load_settings(environ=env))[1] == "http://127.0.0.1:9"
        s = load_settings(overrides=flag, environ=env)
        assert s.index.url is None and _store_target(s)[0].name == "hnswlib" and _store_target(s)[1] == "idx"
    s = load_settings(overrides={"index": {"store": "qdrant"}}, environ={"VECPLUG_INDEX_URL": "http://h:1"})
    assert _store_target(s)[1] == "http://h:1"  # qdrant at that server
    s = load_settings(overrides={"index": {"url": "http://h:1"}}, environ={"VECPLUG_INDEX_STORE": "hnswlib"})
    assert _store_target(s)[1] == "http://h:1"  # the URL is the higher layer
    for store in ("hnswlib", "flat"):
        # a URL above a folder's store named below: the server, whichever folder store it was
        cfg.write_text(f"index: {{store: {store}}}\n")
        for env in ({"VECPLUG_CONFIG": str(cfg)}, {"VECPLUG_INDEX_STORE": store}):
            s = load_settings(overrides={"index": {"url": "http://h:1"}}, environ=env)
            assert _store_target(s)[0].name == "qdrant" and _store_target(s)[1] == "http://h:1"
        # both in one layer: the server (for flat too: its URL was dropped, and the folder written)
        for s in (load_settings(overrides={"index": {"url": "http://h:1", "store": store}}, environ={}),
                  load_settings(environ={"VECPLUG_INDEX_URL": "http://h:1", "VECPLUG_INDEX_STORE": store})):
            assert _store_target(s)[0].name == "qdrant" and _store_target(s)[1] == "http://h:1"
    # a folder named above a URL (--index DIR, open_index(path)) is that folder
    cfg.write_text("index: {url: 'http://127.0.0.1:9'}\n")
    for env in ({"VECPLUG_CONFIG": str(cfg)}, {"VECPLUG_INDEX_URL": "http://127.0.0.1:9"}):
        s = load_settings(overrides={"index": {"path": "mine"}}, environ=env)
        assert s.index.url is None and _store_target(s)[0].name == "hnswlib" and _store_target(s)[1] == "mine"
    s = load_settings(cfg, environ={"VECPLUG_INDEX_PATH": "mine"})
    assert s.index.url is None and _store_target(s)[1] == "mine"
    s = load_settings(overrides={"index": {"path": "mine", "url": "http://h:1"}}, environ={})
    assert _store_target(s)[1] == "http://h:1"  # both in one layer: the server


def test_yaml_that_is_not_what_it_seems_is_refused(tmp_path: Path) -> None:
    """Text that YAML reads as a boolean or a number where a setting is text, a key given
    twice, a file that is not UTF-8: each refused with where it is, not taken silently."""
    cfg = tmp_path / "c.yaml"
    for text, error in (
            ("index: {collection: 0123}\n", r"index.collection: expected a string, got the int 83 .*quote it"),
            ("index: {url: 'http://h:1', api_key: 0x1F}\n", r"index.api_key: expected a string, got the int 31"),
            ("search: {rerank: off}\n", r"search.rerank: expected a string, got the bool False"),
            ("model: {query_prefix: no}\n", r"model.query_prefix: expected a string, got the bool False"),
            ("corpus: {embed_fields: [title, null]}\n", r"corpus.embed_fields\[1\]: expected a string, got null"),
            ("corpus: {embed_fields: [[a]]}\n", r"corpus.embed_fields\[0\]: expected a string, got \['a'\]"),
            ("search: {k: 1}\nindex: {path: idx}\nsearch: {mode: xy}\n", r"c.yaml:3: 'search' is given twice"),
            ("search: {k: 1, k: 2}\n", r"c.yaml:1: 'k' is given twice")):
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=error):
            load_settings(cfg, environ={})
    cfg.write_text("search: {k: 3, langs: [de, 'no'], lang: no}\ncorpus: {embed_fields: [title, text]}\n")
    s = load_settings(cfg, environ={})  # what is text stays so (and Norwegian is still Norwegian)
    assert s.search.k == 3 and s.search.langs == ("de", "no") and s.search.lang == "no"
    assert s.corpus.embed_fields == ("title", "text")
    cfg.write_bytes(b"search: {k: 3}\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: not UTF-8 text \(byte 0xff\); save the config as UTF-8"):
        load_settings(cfg, environ={})


def test_unknown_keys_rejected(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("search: {kk: 3}\n")
    with pytest.raises(ConfigError, match="unknown key.*kk"):
        load_settings(cfg, environ={})
    cfg.write_text("serch: {k: 3}\n")
    with pytest.raises(ConfigError, match="unknown section.*serch"):
        load_settings(cfg, environ={})


def test_bad_values_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="integer"):
        load_settings(environ={"VECPLUG_SEARCH_K": "many"})
    with pytest.raises(ConfigError, match="mode"):
        load_settings(overrides={"search": {"mode": "sideways"}}, environ={})
    with pytest.raises(ConfigError, match="chunk_overlap"):
        load_settings(overrides={"corpus": {"chunk_tokens": 10, "chunk_overlap": 10}}, environ={})


def test_yaml_cannot_run_code(tmp_path: Path) -> None:
    cfg = tmp_path / "evil.yaml"
    cfg.write_text("search: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_settings(cfg, environ={})


def test_lists_from_env() -> None:
    s = load_settings(environ={"VECPLUG_CORPUS_EMBED_FIELDS": "title, text"})
    assert s.corpus.embed_fields == ("title", "text")


def test_search_settings_for_modes_and_reranking() -> None:
    env = {"VECPLUG_SEARCH_PREFER_BOOST": "0.1", "VECPLUG_SEARCH_LANGS": "de, fr",
           "VECPLUG_SEARCH_DEBIAS": "on", "VECPLUG_SEARCH_RERANK": "teacher"}
    s = load_settings(environ=env, overrides={"search": {"mode": "prefer", "rerank_depth": 20}})
    assert (s.search.prefer_boost, s.search.langs, s.search.debias) == (0.1, ("de", "fr"), True)
    assert (s.search.mode, s.search.rerank, s.search.rerank_depth) == ("prefer", "teacher", 20)
    with pytest.raises(ConfigError, match="expected a number"):
        load_settings(environ={"VECPLUG_SEARCH_PREFER_BOOST": "much"})
    with pytest.raises(ConfigError, match="query_quantize"):
        load_settings(environ={"VECPLUG_MODEL_QUERY_QUANTIZE": "int4"})
    assert load_settings(environ={}).model.query_quantize == "auto"
    # "none" and null both mean float32 (the encoder reads either so)
    assert load_settings(environ={"VECPLUG_MODEL_QUERY_QUANTIZE": "none"}).model.query_quantize in (None, "none")
    with pytest.raises(ConfigError, match="rerank_depth"):
        load_settings(overrides={"search": {"rerank_depth": 0}})
    for boost in ("nan", "inf"):  # NaN scores cannot be sorted; inf ties every same-language answer
        with pytest.raises(ConfigError, match="search.prefer_boost must be a finite number"):
            load_settings(environ={"VECPLUG_SEARCH_PREFER_BOOST": boost})


def test_language_codes_are_normalised(tmp_path: Path) -> None:
    from vecplug.config import normalise_langs

    # documents are tagged as the detector writes codes ("de"): " FR" would match none of them
    env = {"VECPLUG_SEARCH_LANGS": " de , FR,,", "VECPLUG_SEARCH_LANG": " EN "}
    s = load_settings(environ=env)
    assert s.search.langs == ("de", "fr") and s.search.lang == "en"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("search: {langs: [' ES', '', Ru]}\ncorpus: {lang: ' DE'}\n")
    s = load_settings(cfg, environ={})
    assert s.search.langs == ("es", "ru") and s.corpus.lang == "de"
    s = load_settings(overrides={"search": {"langs": " de , FR", "lang": "  "}}, environ={})
    assert s.search.langs == ("de", "fr") and s.search.lang is None
    assert normalise_langs([" De", "", "fr "]) == ("de", "fr") and normalise_langs(None) == ()
    assert normalise_langs("en,EN,de-AT,de") == ("en", "de")  # a repeat would pool a language twice
    cfg.write_text("search: {langs: [no, da], lang: no}\n")  # YAML 1.1: an unquoted no is false
    s = load_settings(cfg, environ={})
    assert s.search.langs == ("no", "da") and s.search.lang == "no"
    # three-letter codes of languages the detector names by two letters ("eng" matched nothing)
    assert normalise_langs("eng,DEU,cmn,zh-Hant,fil,haw") == ("en", "de", "zh", "tl", "haw")
    assert normalise_langs("nb-NO,iw,in,mo") == ("no", "he", "id", "ro")  # as the detector writes them
    # a name is not a code: stored as "english", it would match no detected language
    with pytest.raises(ConfigError, match="'English' is not a language code"):
        normalise_langs("de,English")
    with pytest.raises(ConfigError, match=r"environment: search.lang: 'German' is not a language code"):
        load_settings(environ={"VECPLUG_SEARCH_LANG": "German"})
    cfg.write_text("corpus: {lang: x-klingon}\n")
    with pytest.raises(ConfigError, match=r"corpus.lang.*'x-klingon' is not a language code"):
        load_settings(cfg, environ={})
    # a tag without its language ("-en", "-") is no code either (it read as none: detected)
    from vecplug.types import lang_code

    for tag in ("-en", "-", "_"):
        with pytest.raises(ValueError, match=f"'{tag}' is not a language code"):
            lang_code(tag)
    assert lang_code(" ") is None and lang_code("") is None and lang_code("en-") == "en"
    # an overlap over half a passage: refused (passages were cut with half of it, unsaid)
    with pytest.raises(ConfigError, match=r"corpus.chunk_overlap \(60\) must be at most half of corpus.chunk_tokens \(100\)"):
        load_settings(overrides={"corpus": {"chunk_tokens": 100, "chunk_overlap": 60}}, environ={})
    assert load_settings(overrides={"corpus": {"chunk_tokens": 100, "chunk_overlap": 50}}, environ={})


def test_unknown_env_variable_of_a_section_rejected() -> None:
    with pytest.raises(ConfigError, match="VECPLUG_SEARCH_BOGUS") as err:
        load_settings(environ={"VECPLUG_SEARCH_BOGUS": "1"})
    assert "rerank_depth" in str(err.value) and "chunk_tokens" not in str(err.value)  # its section's keys
    with pytest.raises(ConfigError, match="VECPLUG_INDEX_"):
        load_settings(environ={"VECPLUG_INDEX_": "x"})
    # other variables are not settings: vecplug's own (VECPLUG_HOME, VECPLUG_CONFIG) and the
    # benchmarks' VECPLUG (the command to run) keep working
    env = {"VECPLUG_HOME": "/tmp/h", "VECPLUG_CONFIG": "", "VECPLUG": "/bin/vecplug", "VECPLUG_SEARCH_K": "2"}
    assert load_settings(environ=env) == Settings(search=SearchSettings(k=2))


def test_limits_of_the_index_model_and_corpus_settings() -> None:
    # hnswlib takes M 0 and then kills the process at the first insert (M 1: an error there)
    for value in ("0", "1", "-1"):
        with pytest.raises(ConfigError, match="index.hnsw_m must be at least 2"):
            load_settings(environ={"VECPLUG_INDEX_HNSW_M": value})
    for name in ("INDEX_HNSW_EF_CONSTRUCTION", "INDEX_HNSW_EF_SEARCH", "MODEL_THREADS", "CORPUS_MAX_FILE_MB"):
        key = name.lower().replace("_", ".", 1)
        with pytest.raises(ConfigError, match=f"{key} must be at least 1, not 0"):
            load_settings(environ={f"VECPLUG_{name}": "0"})
    s = load_settings(environ={"VECPLUG_INDEX_HNSW_M": "2", "VECPLUG_MODEL_THREADS": "1"})
    assert (s.index.hnsw_m, s.model.threads) == (2, 1)
    # unset: the index's recorded graph parameters, not the defaults over them
    assert (s.index.hnsw_ef_construction, s.index.hnsw_ef_search) == (None, None)


def test_yaml_keys_that_are_not_names(tmp_path: Path) -> None:
    """YAML 1.1 reads unquoted on/off/yes/no as booleans and numbers as numbers: an error that
    says so, not a traceback from sorting them beside the other keys."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("search: {k: 5, on: 1, off: 2}\n")
    with pytest.raises(ConfigError, match="search: a key written on, yes or true .* quote it"):
        load_settings(cfg, environ={})
    cfg.write_text("search: {k: 5, no: 1, mode: xy, foo: 2}\n")
    with pytest.raises(ConfigError, match="off, no or false .* quote it"):
        load_settings(cfg, environ={})
    cfg.write_text("1: {k: 5}\nsearch: {k: 2}\n")
    with pytest.raises(ConfigError, match="YAML reads the key 1 as int.*quote it"):
        load_settings(cfg, environ={})


def test_a_fraction_is_no_integer(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("search: {k: 2.9}\n")
    with pytest.raises(ConfigError, match="search.k: expected an integer, got 2.9"):  # not cut to 2
        load_settings(cfg, environ={})
    cfg.write_text("search: {k: .inf}\n")
    with pytest.raises(ConfigError, match="search.k: expected an integer"):
        load_settings(cfg, environ={})
    cfg.write_text("search: {k: 2.0, prefer_boost: 1}\n")  # a whole number is one
    s = load_settings(cfg, environ={})
    assert s.search.k == 2 and isinstance(s.search.k, int) and s.search.prefer_boost == 1.0


def test_null_blank_and_huge_values_are_refused(tmp_path: Path) -> None:
    """`index: {path: null}` made an index folder named "None", an empty VECPLUG_INDEX_PATH one
    in the current folder; counts past a C int were OverflowError tracebacks downstream."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("index: {path: null}\n")
    with pytest.raises(ConfigError, match="index.path: expected a string, got null"):
        load_settings(cfg, environ={})
    with pytest.raises(ConfigError, match="index.path: expected a string, got ' '"):
        load_settings(environ={"VECPLUG_INDEX_PATH": " "})
    cfg.write_text("index: {collection: ~}\n")  # YAML's null
    with pytest.raises(ConfigError, match="index.collection: expected a string, got null"):
        load_settings(cfg, environ={})
    with pytest.raises(ConfigError, match="model.threads must be at most 2147483647"):
        load_settings(environ={"VECPLUG_MODEL_THREADS": str(10**30)})
    with pytest.raises(ConfigError, match="search.k must be at most 2147483647"):
        load_settings(overrides={"search": {"k": 2**64}}, environ={})
    # no scheme: taken for an index folder ("no vecplug index at localhost:6333")
    with pytest.raises(ConfigError, match="index.url must start with http:// or https://"):
        load_settings(environ={"VECPLUG_INDEX_URL": "localhost:6333"})
    assert load_settings(environ={"VECPLUG_INDEX_URL": "HTTP://localhost:6333"}).index.url  # any case
    from vecplug.adapters.stores.qdrant import _is_server

    assert _is_server("HTTP://localhost:6333", {})  # and a server, not a folder named "HTTP:"


def test_an_empty_prefix_is_a_value(tmp_path: Path) -> None:
    """A blank setting means its default everywhere, except the prefixes: there "" is no prefix
    (a model named like E5 but trained without them could not be given none)."""
    assert load_settings(environ={"VECPLUG_MODEL_QUERY_PREFIX": ""}).model.query_prefix == ""
    cfg = tmp_path / "c.yaml"
    cfg.write_text('model: {document_prefix: "", query_prefix: null}\n')
    s = load_settings(cfg, environ={})
    assert (s.model.document_prefix, s.model.query_prefix) == ("", None)
    assert load_settings(environ={"VECPLUG_MODEL_THREADS": ""}).model.threads is None
