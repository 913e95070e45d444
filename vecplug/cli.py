"""The ``vecplug`` command: parse, load settings, call the library, print.

Heavy modules (torch, transformers, stores) are imported by the library only when a
command needs them, so ``vecplug --help`` stays fast.
"""
from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from vecplug._version import __version__
from vecplug.errors import QueryError, VecplugError


#: a --rerank-gate given without a reranker (search and eval refuse it alike)
GATE_WITHOUT_RERANKER = "--rerank-gate gates a reranker: give one with --rerank (e.g. --rerank teacher)"


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The one place library errors become CLI errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VecplugError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def _store_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Where the index is: what every command on an index takes."""
    options = [
        click.option("--index", "index_path", metavar="DIR", help="Index folder [default: .vecplug]."),
        click.option("--store", help="Store: hnswlib (default), flat (exact search; batches by one scan) or qdrant."),
        click.option("--url", help="Qdrant server or cluster URL (uses the qdrant store)."),
        click.option("--collection", help="Qdrant collection [default: vecplug]."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="YAML config file (also $VECPLUG_CONFIG)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _index_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The store options and the encoders': for the commands that encode."""
    options = [
        click.option("--model", help="Document encoder: built-in name, folder or hub id "
                                     "[default: the index's, or me5-small]."),
        click.option("--query-encoder", help="Query encoder: the document encoder itself or a student "
                                             "distilled from it [default: the index's]."),
        click.option("--runtime", type=click.Choice(["torch", "onnx"]),
                     help="What runs the encoders: torch (default) or onnx (ONNX Runtime, faster on a "
                          "CPU; pip install 'vecplug[onnx]')."),
        click.option("--precision", type=click.Choice(["auto", "float32", "bfloat16"]),
                     help="What torch computes the encoders in: bfloat16 is several times faster on a "
                          "CPU with AMX and slower elsewhere [default: model.precision, auto: "
                          "bfloat16 where the CPU has AMX]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return _store_options(fn)


def _settings(config_file: str | None, index_path: str | None, store: str | None, url: str | None,
              collection: str | None, model: str | None = None, query_encoder: str | None = None,
              runtime: str | None = None, precision: str | None = None,
              sections: dict[str, dict[str, Any]] | None = None) -> Any:
    from vecplug.config import load_settings

    overrides: dict[str, dict[str, Any]] = {
        "index": {"path": index_path, "store": store, "url": url, "collection": collection},
        "model": {"document": model, "query": query_encoder, "runtime": runtime, "precision": precision},
    }
    for section, values in (sections or {}).items():
        overrides.setdefault(section, {}).update(values)
    return load_settings(config_file, overrides)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vecplug")
def cli() -> None:
    """Multilingual semantic search: index a folder, search it in any language."""


@cli.command("index")
@click.argument("path", type=click.Path(exists=True))
@_index_options
@click.option("--lang", help="Language of every document (skips detection), e.g. de.")
@click.option("--chunk-tokens", type=int, help="Passage size for .txt/.md files, in tokens [default: the index's; 200 for a new one].")
@click.option("--debias/--no-debias", default=None,
              help="A new index searches with the language-bias correction on by default.")
@click.option("--centred-graph/--plain-graph", "centred", default=None,
              help="A new hnswlib index's graph holds vectors centred by language: the language-bias "
                   "correction is one walk (fast on a large index of many languages); a search without "
                   "it goes language by language [default: index.hnsw_centred, else plain].")
@click.option("--int8-documents/--fp32-documents", "int8_documents", default=None,
              help="Encode documents with int8 weights (the documents' recipe, torch or onnx; recorded in the "
                   "index), or not (float32 for a new index; an existing one keeps what it was built with) "
                   "[default: model.document_quantize, else the index's].")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="Compile the document encoder with torch.compile (needs a C++ compiler): "
                   "faster on a large corpus after ~40 s on the first batch [default: model.compile].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_errors
def index_cmd(path: str, lang: str | None, chunk_tokens: int | None, debias: bool | None, centred: bool | None,
              int8_documents: bool | None, compile_: bool | None, quiet: bool, **common: Any) -> None:
    """Index the documents under PATH (.txt, .md, .jsonl, .csv)."""
    from vecplug.api import Index

    settings = _settings(**common, sections={"corpus": {"lang": lang, "chunk_tokens": chunk_tokens},
                                             "index": {"debias": debias, "hnsw_centred": centred},
                                             "model": {"document_quantize": None if int8_documents is None
                                                       else "int8" if int8_documents else "none",
                                                       "compile": compile_}})
    with Index.open(settings, create=True) as index:
        report = index.index_path(path, progress=not quiet)
        total = index.store.count()
        built = index.manifest
        # the length texts were cut at (an index recorded before lengths were checked may say more)
        room, limit = ((index.encoder.document_room(), index.encoder.document_limit()) if report.cut
                       else (None, None))
        # settings of a new index only: on an existing one they would be ignored without a word
        if debias is not None and built.get("debias") != debias:
            click.echo(f"note: --{'' if debias else 'no-'}debias sets a new index's default; this one searches "
                       f"with the correction {'on' if built.get('debias') else 'off'} (give --"
                       f"{'' if debias else 'no-'}debias to search)", err=True)
        if centred and not getattr(index.store, "centred", False):
            click.echo("note: --centred-graph shapes a new hnswlib index's graph; this index's holds the vectors "
                       "as encoded (index into a new folder, with the hnswlib store, to have it centred)", err=True)
        if common.get("query_encoder") and index.encoder.describe()["query_encoder"] != built.get("query_encoder"):
            click.echo(f"note: --query-encoder sets a new index's query encoder; this one searches with "
                       f"{built.get('query_encoder')} (give --query-encoder to search)", err=True)
    for problem in report.problems:
        click.echo(f"{_problem_word(problem)} {problem}", err=True)
    rate = report.documents / report.seconds if report.seconds else 0.0
    langs = ", ".join(f"{k} {v}" for k, v in report.languages.most_common())
    click.echo(f"indexed {report.documents} documents from {report.files} files "
               f"({report.unchanged} unchanged, {report.removed} removed, {len(report.problems)} problems) in "
               f"{report.seconds:.1f} s ({rate:.1f} docs/s, {report.tokens} tokens); "
               f"index holds {total}")
    if langs:
        click.echo(f"languages: {langs}")
    if report.cut:
        cut = report.cut
        passages = (built.get("corpus") or {}).get("chunk_tokens")
        click.echo(f"note: {cut} document{'s are' if cut != 1 else ' is'} longer than the document encoder "
                   f"keeps ({limit} tokens): only the beginning is embedded. Records (.jsonl, .csv) are not "
                   "cut into passages: split long ones, or index them as .txt/.md files"
                   + (f"; this index's passages of {passages} tokens do not fit either (up to {room} do): "
                      f"build it again with --chunk-tokens {room}" if passages and room and passages > room else ""),
                   err=True)


@cli.command("search")
@click.argument("query", metavar="QUERY|-")
@_index_options
@click.option("-k", "k", type=int, help="Number of results [default: 10].")
@click.option("--mode", type=click.Choice(["xy", "mono", "prefer"]),
              help="xy: answers in any language (default); mono: in the query's language; "
                   "prefer: any language, the query's ranked up.")
@click.option("--lang", help="The query's language (skips detection).")
@click.option("--langs", help="Answer only in these languages, e.g. de,fr (xy and prefer).")
@click.option("--debias/--no-debias", default=None,
              help="Remove each language's mean vector before scoring [default: the index's setting].")
@click.option("--rerank", metavar="NAME", help="Second stage: teacher (teacher:int8: its queries in int8; teacher:auto: "
                                                "int8 on a CPU without AMX), fields, cross-encoder:MODEL, none.")
@click.option("--rerank-depth", type=int, help="Candidates the reranker rescores [default: 50].")
@click.option("--rerank-gate", type=float, metavar="MARGIN",
              help="Rerank only if the first stage's best answer in the query's language leads the "
                   "next by less than MARGIN [default: always].")
@click.option("--consensus/--no-consensus", default=None,
              help="Translation consensus (xy, prefer): an answer's copies in other languages count "
                   "for it and follow it [default: off].")
@click.option("--ef", type=click.IntRange(min=1),
              help="HNSW search breadth for this search (higher: more exact, slower) "
                   "[default: the index's hnsw_ef_search].")
@click.option("--int8/--fp32", "int8", default=None,
              help="Query encoder weights: int8 (faster on a CPU) or float32 "
                   "[default: model.query_quantize, auto: int8 for the shipped student on x86].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def search_cmd(query: str, k: int | None, mode: str | None, lang: str | None, langs: str | None,
               debias: bool | None, rerank: str | None, rerank_depth: int | None,
               rerank_gate: float | None, consensus: bool | None, ef: int | None,
               int8: bool | None, as_json: bool,
               **common: Any) -> None:
    """Search the index with QUERY. With QUERY -, every line of standard input is a query,
    answered as it is read by this one process (the models load once); --json then writes one
    JSON object a line, with its line number. A line that cannot be searched is reported with
    its number and skipped (the exit status is then 1)."""
    from vecplug.api import Index

    settings = _settings(**common, sections={
        "search": {"k": k, "mode": mode, "lang": lang, "langs": langs, "debias": debias,
                   "rerank": rerank, "rerank_depth": rerank_depth, "rerank_gate": rerank_gate,
                   "consensus": consensus, "ef": ef},
        "model": {"query_quantize": None if int8 is None else "int8" if int8 else "none"}})
    if rerank_gate is not None and settings.search.rerank in (None, "none"):
        # a gate in the settings waits for a reranker; one given here would be dropped silently
        raise click.UsageError(GATE_WITHOUT_RERANKER)
    with Index.open(settings) as index:
        held = index.store.languages() if settings.search.langs else {}
        missing = [code for code in settings.search.langs if not held.get(code)]
        if missing:  # a filter that matches nothing is most likely a typo: say what there is
            click.echo(f"note: the index has no documents in {', '.join(missing)}; it has "
                       f"{', '.join(sorted(c for c, n in held.items() if n)) or 'none'}", err=True)
        if query != "-":
            _show_result(query, index.search(query), as_json)
            return
        answered, skipped = 0, []
        for number, line in _stdin_lines():
            if not line.strip():
                continue
            try:
                result = index.search(line)
            except QueryError as exc:  # this query's problem: the next lines still count
                # (any other error, a reranker that cannot load, a store that cannot be read,
                # would be every line's: it stops the run, once, as for one query)
                click.echo(f"stdin line {number}: {exc}; skipped", err=True)
                skipped.append(number)
                continue
            if answered and not as_json:
                click.echo()
            _show_result(line, result, as_json, line=number)
            answered += 1
    if skipped:
        raise click.ClickException(
            f"{len(skipped)} of {answered + len(skipped)} queries skipped (stdin line"
            f"{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped[:10]))}"
            f"{', ...' if len(skipped) > 10 else ''}: above)")


def _stdin_lines() -> Iterator[tuple[int, str]]:
    """(line number, text) of standard input, read as it comes: UTF-8, an undecodable byte kept
    as a lone surrogate (the search refuses that line and names it, instead of the whole input
    failing), the line ending and a leading byte-order mark dropped."""
    binary = getattr(sys.stdin, "buffer", None)  # (a text stream without one: already decoded)
    source = iter(binary.readline, b"") if binary is not None else iter(sys.stdin.readline, "")
    for number, raw in enumerate(source, 1):
        text = (raw.decode("utf-8", errors="surrogateescape") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        yield number, text.removeprefix("\ufeff") if number == 1 else text


def _show_result(query: str, result: Any, as_json: bool, line: int | None = None) -> None:
    """One search's answer: a header and a block a hit, or JSON; the answer to stdin's ``line``
    as one JSON line that names it (lines skipped leave no answer: the number aligns them)."""
    if as_json:
        if line is None:
            click.echo(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
        else:
            click.echo(json.dumps({"line": line, **result.to_dict()}, ensure_ascii=False))
        return
    shown = query if len(query) <= 80 else query[:77] + "..."
    click.echo(f"query [{result.lang}] {shown!r}, mode {result.mode}, {len(result)} result{'s' * (len(result) != 1)} "
               f"in {result.seconds * 1000:.0f} ms")
    if result.mode == "mono" and not result.hits:
        click.echo(f"note: no documents in the query's language ({result.lang}); give it with "
                   "--lang if it was misdetected", err=True)
    for hit in result:
        # one line a hit, then its snippet: a title's own line breaks would split the block
        title = " ".join(str(hit.payload.get("title") or "").split())
        snippet = " ".join(hit.text.split())
        snippet = snippet[:160] + ("…" if len(snippet) > 160 else "")
        click.echo(f"{hit.rank:>3}. {hit.score:.3f} [{hit.lang or 'und'}] {hit.source}"
                   + (f" — {title}" if title else ""))
        click.echo(f"     {snippet}")


@cli.command("info")
@_store_options  # info reads the manifest: it encodes nothing
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def info_cmd(as_json: bool, **common: Any) -> None:
    """What an index holds and what it was built with."""
    from vecplug.api import Index

    with Index.open(_settings(**common)) as index:
        info = index.info()
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, indent=2))
        return
    m = info["manifest"]
    click.echo(f"index:      {info['location']} ({m.get('store', {}).get('name', '?')})")
    click.echo(f"documents:  {info['documents']}")
    click.echo("languages:  " + ", ".join(f"{k} {v}" for k, v in info["languages"].items()))
    click.echo(f"documents encoded by: {m.get('document_encoder')} ({m.get('document_encoder_checksum', '')[:12]})")
    click.echo(f"queries encoded by:   {m.get('query_encoder')} ({m.get('query_encoder_checksum', '')[:12]})")
    click.echo(f"dimension {m.get('dim')}, {m.get('pooling')} pooling, normalised {m.get('normalize')}, "
               f"prefixes {m.get('query_prefix')!r} / {m.get('document_prefix')!r}, "
               f"max tokens {m.get('query_max_length')} / {m.get('document_max_length')}")
    # the precision of the run that created the index (runs after it may differ: either
    # precision's vectors rank alike, so it is not checked)
    computed = f", computed in {m['precision']} at creation" if m.get("precision") else ""
    click.echo(f"runtime:    {m.get('runtime') or 'torch'}, document weights "
               f"{m.get('document_quantize') or 'float32'}{computed}")
    click.echo(f"language-bias correction: {'on' if m.get('debias') else 'off'} by default "
               "(--debias/--no-debias per search)")
    store = {k: v for k, v in m.get("store", {}).items() if k not in ("name", "space")}
    if store:
        click.echo("store:      " + ", ".join(f"{k} {v}" for k, v in store.items()))
    corpus = m.get("corpus") or {}
    if m.get("source_root") or corpus:
        click.echo(f"source:     {m.get('source_root') or '-'}; passages of {corpus.get('chunk_tokens', '?')} "
                   f"tokens ({corpus.get('chunk_overlap', '?')} overlapping), fields embedded: "
                   f"{', '.join(corpus.get('embed_fields', [])) or '-'}")
    click.echo(f"built by vecplug {m.get('vecplug_version')}, created {m.get('created')}, "
               f"updated {m.get('updated', '-')}")


@cli.command("verify")
@_index_options
@click.option("--sample", type=click.IntRange(min=0), default=32, show_default=True,
              help="Documents to re-encode and compare with their stored vectors (0: none).")
@click.option("--no-encode", is_flag=True, help="Skip re-encoding (no model needed).")
@_errors
def verify_cmd(sample: int, no_encode: bool, **common: Any) -> None:
    """Check an index in full (files, checksums, counts, vectors) and say what is wrong."""
    from vecplug.verify import verify_index

    report = verify_index(_settings(**common), sample=sample, encode=not no_encode)
    for check in report.checks:
        click.echo(f"checked  {check}")
    for problem in report.problems:
        click.echo(f"PROBLEM  {problem}", err=True)
    if not report.ok:
        raise click.ClickException(f"{report.location}: {len(report.problems)} problems")
    click.echo(f"{report.location}: no problems found")


@cli.command("distill")
@click.option("--teacher", default="me5-small", show_default=True,
              help="Document encoder to distil: built-in name, folder or hub id.")
@click.option("--layers", "-k", type=int, default=3, show_default=True, help="Student layers.")
@click.option("--layer-choice", type=click.Choice(["spread", "first"]), default="spread", show_default=True,
              help="Teacher layers that initialise the student: evenly spread (keeps the last) or the first k.")
@click.option("--tatoeba", type=click.Path(exists=True, file_okay=False),
              help="Folder of Tatoeba pairs (tatoeba.xxx-eng.{xxx,eng}).")
@click.option("--texts", multiple=True, type=click.Path(exists=True),
              help="Your own training text: a file with one query per line, or a corpus folder (a .csv, "
                   ".jsonl or .md file is read as a corpus file). Repeatable.")
@click.option("--epochs", type=int, default=2, show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--lr", "learning_rate", type=float, default=2e-4, show_default=True)
@click.option("--max-texts", type=int, default=40000, show_default=True, help="Cap on training texts per source.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--contrastive", "contrastive_weight", type=float, default=0.0, show_default=True,
              help="Weight of the in-batch ranking term (InfoNCE against the teacher's vectors).")
@click.option("--dim", type=int, help="Lower dimension (e.g. 128): documents are projected by PCA and the "
                                      "student learns a head into that space.")
@click.option("--init", help="Start from this student of the teacher (name or folder) instead of the "
                                     "teacher's layers, e.g. with --ffn-width to narrow a trained student.")
@click.option("--ffn-width", type=int, help="Feed-forward neurons kept per layer (me5-small has 1536), the ones "
                                            "contributing most on the training texts: faster queries.")
@click.option("--shared-layers", type=int, default=0, show_default=True,
              help="The student's first N layers are the teacher's own, frozen: the teacher reranker "
                   "goes on from there instead of encoding the query again.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Student folder: new, or a student of the same teacher (replaced) [default: "
                   "$VECPLUG_HOME/models/TEACHER-student-kN; -local added to a name the package ships].")
@click.option("--stop-after", type=click.IntRange(min=1), help="Stop after N steps (checkpointed; rerun to resume).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@_errors
def distill_cmd(teacher: str, layers: int, layer_choice: str, tatoeba: str | None, texts: tuple[str, ...],
                epochs: int, batch_size: int, learning_rate: float, max_texts: int, seed: int,
                contrastive_weight: float, dim: int | None, init: str | None, ffn_width: int | None,
                shared_layers: int, out: str | None, stop_after: int | None, quiet: bool) -> None:
    """Distil a small query encoder (student) from a document encoder (MSE on query vectors).

    Interrupted runs resume from their checkpoint when run again with the same options.
    """
    from pathlib import Path

    from vecplug.indexer.distill import DistillConfig, default_student_folder, distill

    config = DistillConfig(teacher=teacher, layers=layers, layer_choice=layer_choice, epochs=epochs,
                           batch_size=batch_size, learning_rate=learning_rate, max_texts=max_texts,
                           seed=seed, tatoeba=tatoeba, texts=texts, dim=dim, ffn_width=ffn_width, init=init,
                           contrastive_weight=contrastive_weight, shared_layers=shared_layers)
    folder = Path(out) if out else default_student_folder(teacher, layers, dim, ffn_width, shared_layers)
    report = distill(config, folder, progress=not quiet, command="vecplug " + " ".join(sys.argv[1:]),
                     log=lambda m: click.echo(m, err=True), stop_after=stop_after)
    if report is None:
        click.echo(f"stopped after {stop_after} steps; run the same command again to resume")
        return
    click.echo(f"student: {folder} ({report.artifact_bytes / 1e6:.1f} MB, {report.steps} steps, "
               f"{report.seconds / 60:.1f} min, final loss {report.final_loss:.4f})")
    click.echo(f"search with it: vecplug search QUERY --query-encoder {folder}")


@cli.command("train")
@click.argument("config_file", metavar="CONFIG.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", help="Folder for the trained model (overrides the config's output).")
@click.option("--model", help="Base model (overrides the config's model).")
@click.option("--epochs", type=int, help="Epochs (overrides the config).")
@click.option("--max-steps", type=int, help="Stop after this many steps in all (overrides the config).")
@click.option("--seed", type=int, help="Random seed (overrides the config).")
@click.option("--stop-after", type=click.IntRange(min=1), help="Stop this run after N steps (checkpointed; rerun to resume).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@_errors
def train_cmd(config_file: str, output: str | None, model: str | None, epochs: int | None,
              max_steps: int | None, seed: int | None, stop_after: int | None, quiet: bool) -> None:
    """Fine-tune an encoder or a cross-encoder on the tasks of CONFIG.yaml.

    The result is a Hugging Face model folder that `vecplug index --model`, `vecplug distill
    --teacher` and `--rerank cross-encoder:FOLDER` take as it is. Interrupted runs resume from
    their checkpoint when run again with the same config.
    """
    from vecplug.training import run_training

    overrides = {"output": output, "model": model, "epochs": epochs, "max_steps": max_steps, "seed": seed}
    report = run_training(config_file, overrides, progress=not quiet, log=lambda m: click.echo(m, err=True),
                          command="vecplug " + " ".join(sys.argv[1:]), stop_after=stop_after)
    if report is None:
        click.echo(f"stopped after {stop_after} steps; run the same command again to resume")
        return
    click.echo(f"model: {report.folder} ({report.steps} steps, {report.seconds / 60:.1f} min)")
    if report.evaluations:
        first, last = report.evaluations[0], report.evaluations[-1]
        for name in last:
            if name != "step":
                click.echo(f"{name}: before {json.dumps(first.get(name), ensure_ascii=False)}")
                click.echo(f"{' ' * len(name)}  after  {json.dumps(last[name], ensure_ascii=False)}")


@cli.group("models")
def models_group() -> None:
    """Built-in and cached models."""


@models_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def models_list(as_json: bool) -> None:
    """Models available, and whether they are built on this machine."""
    from vecplug.indexer.models import list_models

    rows = list_models()
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))  # (as search --json keeps text)
        return
    for row in rows:
        state = "built" if row["built"] else "not built (vecplug models build " + row["name"] + ")"
        click.echo(f"{row['name']:<14} {state}")
        click.echo(f"{'':<14} {row['description']}")
        if row["built"]:
            click.echo(f"{'':<14} {row['path']}  sha256 {row['checksum'][:16]}")


@models_group.command("build")
@click.argument("name", default="me5-small")
@click.option("--force", is_flag=True, help="Rebuild even if built.")
@_errors
def models_build(name: str, force: bool) -> None:
    """Build a built-in model (default me5-small) into $VECPLUG_HOME."""
    from vecplug.indexer.models import build_builtin, folder_checksum

    path = build_builtin(name, force=force)
    click.echo(f"{name}: {path} (sha256 {folder_checksum(path)})")


@cli.command("eval")
@click.argument("dataset")
@click.option("--langs", help="XQuAD-R languages to pool, e.g. ar,de [default: every <lang>.json].")
@click.option("--split", help="BEIR qrels split [default: test, or the only one].")
@click.option("--model", help="Document encoder: built-in name, folder or hub id "
                              "[default: the index's, or me5-small].")
@click.option("--query-encoder", "query_encoders", multiple=True,
              help="Query encoder of a run (repeatable) [default: the index's default student].")
@click.option("--mode", "modes", multiple=True, type=click.Choice(["xy", "mono", "prefer"]),
              help="Mode of a run (repeatable) [default: xy and mono].")
@click.option("--rerank", "reranks", multiple=True,
              help="Second stage of a run: teacher, teacher:int8, teacher:auto, fields, cross-encoder:MODEL or none "
                   "(repeatable) "
                   "[default: none].")
@click.option("--rerank-depth", type=click.IntRange(min=1), help="Candidates a reranker rescores.")
@click.option("--rerank-gate", "gates", multiple=True, metavar="MARGIN",
              help="Reranked runs: rerank only queries whose first-stage margin is below MARGIN "
                   "(repeatable: a run per gate; 'always' is the ungated run) [default: always].")
@click.option("--debias", type=click.Choice(["on", "off", "both"]),
              help="Language-bias correction: on, off, or both (a run with and one without) "
                   "[default: the index's setting].")
@click.option("--no-debias", is_flag=True, help="Same as --debias off.")
@click.option("--consensus", type=click.Choice(["on", "off", "both"]),
              help="Translation consensus in pooled modes: on, off, or both (a run with and one "
                   "without) [default: search.consensus, off].")
@click.option("--index", "index_path", metavar="DIR",
              help="Build the index here and keep it; reused when it holds the dataset's documents "
                   "[default: a temporary folder].")
@click.option("--out", type=click.Path(file_okay=False),
              help="Write report.md, report.json and heatmap-*.svg into this folder.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N queries of each language (every document is still "
                   "indexed: the pool stays whole; --index DIR keeps it for the next run).")
@click.option("--per-query/--summary-only", default=True,
              help="Put every query's numbers in report.json, or only the aggregates.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@_errors
def eval_cmd(dataset: str, langs: str | None, split: str | None, model: str | None,
             query_encoders: tuple[str, ...], modes: tuple[str, ...], reranks: tuple[str, ...],
             rerank_depth: int | None, gates: tuple[str, ...], debias: str | None, no_debias: bool,
             consensus: str | None, index_path: str | None,
             out: str | None, limit: int | None, per_query: bool, quiet: bool) -> None:
    """Score retrievers on DATASET and print a Markdown report.

    DATASET is xquad-r:PATH (a folder of <lang>.json), beir:PATH (corpus.jsonl, queries.jsonl,
    qrels/SPLIT.tsv) or a folder of either kind. One run per combination of --query-encoder,
    --mode, --rerank (and --rerank-gate), --debias and --consensus.
    """
    from vecplug.config import normalise_langs
    from vecplug.evaluate import evaluate, make_runs, output_folder
    from vecplug.indexer.datasets import load_dataset

    if no_debias and debias in ("on", "both"):
        # --no-debias is "--debias off": with on (or both) it is a contradiction, not a request
        raise click.UsageError(f"--no-debias (= --debias off) contradicts --debias {debias}: give one "
                               "of them (--debias both: one run with the correction, one without)")
    gate_values = [_gate_value(g) for g in gates] or [None]  # before the dataset is read
    if gates and not [r for r in reranks if r not in ("", "none")]:
        raise click.UsageError(GATE_WITHOUT_RERANKER)
    # as search's --langs (normalised by the settings): " DE, en" names de.json and en.json
    lang_list = list(normalise_langs(langs)) or None
    data = load_dataset(dataset, langs=lang_list, split=split)
    # before evaluating, so that they show also when they leave nothing to evaluate
    for problem in data.problems:
        click.echo(f"{_problem_word(problem)} {problem}", err=True)
    choice = "off" if no_debias else debias
    switch = {None: [None], "on": [True], "off": [False], "both": [False, True]}
    runs = make_runs(query_encoders or [None], modes, reranks or [None], switch[choice], switch[consensus],
                     gate_values)
    log = None if quiet else (lambda message: click.echo(message, err=True))
    if out:
        output_folder(out)  # a folder that cannot be written fails now, not after the evaluation
    # evaluate applies --limit once every query has a language (detected if not given)
    report = evaluate(data, runs, index_dir=index_path, model=model, rerank_depth=rerank_depth,
                      progress=not quiet, log=log, limit=limit)
    # what indexing skipped (documents no store can hold), after the dataset's own problems
    for problem in report.dataset["problems"][len(data.problems):]:
        click.echo(f"{_problem_word(problem)} {problem}", err=True)
    click.echo(report.markdown())
    if out:
        for path in report.write(out, per_query=per_query):
            click.echo(f"wrote {path}", err=True)


def _gate_value(text: str) -> float | None:
    """An eval --rerank-gate: a margin above 0, or ``always`` (no gate)."""
    from vecplug.config import rerank_gate

    if text.strip().lower() == "always":
        return None
    try:
        return rerank_gate(float(text))
    except (ValueError, VecplugError):
        raise click.BadParameter(f"{text!r} is neither a margin above 0 (e.g. 0.03) nor 'always'",
                                 param_hint="'--rerank-gate'") from None


def _problem_word(problem: Any) -> str:
    """How a problem is printed: "skipped", or "note" for input used without the value named."""
    return "note" if getattr(problem, "kept", False) else "skipped"


def main() -> None:
    cli(prog_name="vecplug")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
