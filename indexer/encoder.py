"""Text encoders: a Hugging Face transformer, mean pooling, L2 normalisation.

:class:`Encoder` has two slots, documents and queries. Documents are encoded once by the
document encoder; queries, while a user waits, by the query encoder, which defaults to the
document encoder and is where a distilled student goes.
"""
from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.indexer import length_batches
from vecplug.indexer.models import LOAD_LOCK, ModelInfo, loading, quiet_transformers, resolve_model
from vecplug.indexer.precision import resolve_precision, to_bfloat16
from vecplug.indexer.traced import SMALL_FORWARD_TOKENS, TRACE_AFTER

# Measured on XQuAD-R with me5-small (benchmarks/lengths.py): 99.9% of questions fit in
# 64 tokens with the prefix, and passages are cut at 256 tokens by the chunker anyway.
DEFAULT_QUERY_MAX_LENGTH = 64
DEFAULT_DOCUMENT_MAX_LENGTH = 256
# Padded tokens per forward pass: large enough to keep the matrix multiplies efficient,
# small enough that attention's (batch x length^2) memory stays modest.
DEFAULT_BATCH_TOKENS = 8192
MAX_BATCH_SIZE = 128


@dataclass(frozen=True)
class EncodeStats:
    texts: int
    tokens: int


class SharedTokenizer:
    """A tokenizer loaded once per process for every encoder that reads its folder, with a lock.

    A multilingual tokenizer is big (me5-small's 250k-piece one holds ~310 MiB in memory, about
    as much as the vocabulary table; benchmarks/model_memory.py), and a student uses its
    teacher's: loading it once saves that much wherever both encode. The lock: a fast tokenizer
    keeps its truncation length as state of the Rust object, set by each call, so two calls
    with different limits (a query's 64 tokens, a document's 256, the chunker's none) must not
    interleave across threads.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        #: a fast tokenizer's Rust backend (None for a slow, Python one): :meth:`ids` calls it
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.tokenizer(*args, **kwargs)

    def ids(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        """Token ids of ``texts`` (special tokens added, cut at ``max_length``), unpadded.

        A fast tokenizer's Rust backend is called directly: what the Hugging Face wrapper adds
        around it (a batch encoding object, its checks) takes longer than the tokenising itself
        for a query, which is encoded while a user waits. The backend gets the settings the
        wrapper would give it (truncation on the tokenizer's side, no padding), so the ids are
        the wrapper's (tested on me5-small's tokenizer)."""
        backend = self.backend
        with self.lock:
            if backend is None:  # a slow (Python) tokenizer
                return self.tokenizer(list(texts), truncation=True, max_length=max_length, padding=False,
                                      return_attention_mask=False, return_token_type_ids=False)["input_ids"]
            backend.enable_truncation(max_length, strategy="longest_first",
                                      direction=getattr(self.tokenizer, "truncation_side", "right"))
            backend.no_padding()
            return [e.ids for e in backend.encode_batch(list(texts))]


_TOKENIZERS: "weakref.WeakValueDictionary[tuple[str, str], SharedTokenizer]" = weakref.WeakValueDictionary()


def shared_tokenizer(folder: Path, checksum: str) -> SharedTokenizer:
    """The process's tokenizer of ``folder`` (the model there has weights ``checksum``: a
    folder rebuilt with other weights gets its tokenizer loaded anew); kept while in use."""
    key = (str(folder.resolve()), checksum)
    # the load lock, not one of its own: a load (holding it) gets its tokenizer here, and two
    # locks taken in both orders could deadlock
    with LOAD_LOCK:
        held = _TOKENIZERS.get(key)
        if held is None:
            from transformers import AutoTokenizer

            with quiet_transformers():
                held = SharedTokenizer(AutoTokenizer.from_pretrained(key[0], trust_remote_code=False))
            _TOKENIZERS[key] = held
        return held


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_list(texts: Iterable[str]) -> list[str]:
    """``texts`` as a list; one string is refused (a str is a sequence of str: each character
    would be embedded as a text of its own)."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: give [text]")
    out = list(texts)
    other = next((i for i, t in enumerate(out) if not isinstance(t, str)), None)
    if other is not None:
        raise TypeError(f"texts[{other}] is {type(out[other]).__name__}, not a string")
    # the tokenizer fails on a lone surrogate (an undecodable byte) with an opaque TypeError
    bad = next((i for i, t in enumerate(out) if _SURROGATE.search(t)), None)
    if bad is not None:
        raise ValueError(f"texts[{bad}] holds an undecodable byte (a lone surrogate): not UTF-8?")
    return out


class TextEncoder:
    """One transformer with its tokenizer; ``encode`` returns unit vectors (float32).

    ``quantize``: None or ``int8``; ``runtime``: ``torch`` or ``onnx``. ``int8_recipe``: which
    of ``onnx_runtime.INT8_RECIPES`` int8 means, under either runtime (``int8-query`` only for
    an encoder of queries where that recipe was measured: a student); under torch also
    ``int8-teacher-query`` (:data:`TEACHER_INT8`, a document encoder's queries) and
    ``int8-general``, torch's general recipe (:func:`_int8`, kept for the benchmarks that
    compare with it). ``precision``: ``float32``
    or ``bfloat16`` (``indexer.precision``), for a model run unquantised by torch, and for the
    float layers of torch's int8 documents; the vectors returned are float32 either way.
    ``documents``: this encoder embeds documents (in large batches): torch's int8 documents'
    recipe (``indexer.torch_int8_documents``) then packs its weights for the kernels that
    measured faster on document batches (oneDNN with AMX) and computes its float layers in
    ``precision``; for queries it keeps FBGEMM and float32.
    ``compile``: torch runtime, its large batches run through ``torch.compile``
    (``indexer.compiled``); small forward passes (queries) stay eager or traced.
    """

    @loading  # one load at a time in a process (transformers' lazy imports, ONNX export)
    def __init__(self, info: ModelInfo, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                 threads: int | None = None, shared_embeddings: Any = None,
                 post: Any = None, quantize: str | None = None, runtime: str = "torch",
                 int8_recipe: str = "int8", trace: bool = True, precision: str = "float32",
                 documents: bool = False, compile: bool = False) -> None:
        import torch
        from transformers import AutoModel

        self.info = info
        self.batch_tokens = batch_tokens
        #: applied to mean-pooled vectors before normalisation (a projection to fewer dimensions)
        self.post = post
        if threads:
            torch.set_num_threads(threads)
        owner = info.teacher if info.teacher is not None else info  # students use their teacher's
        self._shared = shared_tokenizer(info.tokenizer_path, owner.checksum)
        #: the Hugging Face tokenizer (shared: call it through :meth:`tokenize` or :meth:`offsets`)
        self.tokenizer = self._shared.tokenizer
        with quiet_transformers():  # "pooler weights missing" is expected
            if info.teacher is not None:
                from vecplug.indexer.student import load_student

                self.model = load_student(info.path, info.teacher.path, info.teacher.checksum,
                                          shared_embeddings)
            else:
                try:
                    self.model = AutoModel.from_pretrained(
                        str(info.path), trust_remote_code=False, add_pooling_layer=False)
                except TypeError:  # architectures without a pooler do not take the flag
                    self.model = AutoModel.from_pretrained(str(info.path), trust_remote_code=False)
        # transformers keeps a checkpoint's stored dtype: fp16 runs 2x slower on a CPU than
        # fp32, and ONNX export and int8 quantisation fail on it
        self.model = self.model.float().eval()
        self.dim = int(self.model.config.hidden_size)
        #: the most tokens a text is cut at whatever length a caller asks for (the Encoder
        #: refuses settings above it; internal callers, e.g. calibration, are capped)
        self.model_max_length = max_tokens(info)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.quantize, self.runtime = quantize, runtime
        #: what the model computes in (an int8 or ONNX Runtime model: float32 where it is float,
        #: but torch's int8 documents, whose float layers take ``precision``)
        self.precision = precision if runtime == "torch" and (quantize is None or documents) else "float32"
        #: the layers in ONNX Runtime (runtime "onnx"); the torch model then only looks up the
        #: token embeddings, from the vocabulary table it may share with a teacher or student
        self.onnx: Any = None
        if quantize not in (None, "int8"):
            from vecplug.errors import ConfigError

            raise ConfigError(f"unknown quantisation '{quantize}'; known: int8")
        if runtime == "onnx":
            from vecplug.indexer.models import vecplug_home
            from vecplug.indexer.onnx_runtime import load_layers

            graph = int8_recipe if quantize == "int8" else quantize
            self.onnx = load_layers(self.model, info.checksum, graph, vecplug_home() / "onnx", threads,
                                    calibration=self.calibration_feeds,
                                    prefixes=(info.query_prefix, info.document_prefix),
                                    tokenizer=info.tokenizer_path)
            _drop_layers(self.model)
        elif runtime != "torch":
            from vecplug.errors import ConfigError

            raise ConfigError(f"unknown runtime '{runtime}'; known: torch, onnx")
        elif quantize == "int8" and int8_recipe in ("int8-query", TEACHER_INT8):
            self.model = self._int8_query((0,) if int8_recipe == TEACHER_INT8 else ())
        elif quantize == "int8" and int8_recipe == "int8-general":
            self.model = _int8(self.model)
        elif quantize == "int8":
            from vecplug.indexer.torch_int8_documents import document_engine

            # a document encoder's own queries (one short text at a time) keep FBGEMM, where
            # single queries measured faster than on oneDNN
            self.model = self._int8_documents(int8_recipe, document_engine(compile) if documents else None)
        elif self.precision == "bfloat16":
            to_bfloat16(self.model)
        self.out_dim = int(getattr(post, "out_dim", self.dim))
        self.tokens_seen = 0
        #: torch runtime: the small forward passes run so far (latency-bound ones, queries),
        #: and the model's traced graph once made (``indexer.traced``: the same vectors without
        #: torch's per-operation overhead)
        self.small_forwards, self.graph = 0, None
        self._count_lock = threading.Lock()
        self.trace_after: int | None = TRACE_AFTER if runtime == "torch" and trace else None
        #: torch runtime with ``compile``: the forward pass of large batches, compiled on first use
        self.compiled: Any = None
        if compile and runtime == "torch":
            from vecplug.indexer.compiled import CompiledForward

            self.compiled = CompiledForward(self.model)
        #: a student sharing its first layers with its teacher (``indexer.cascade``), under
        #: torch: its forward pass is split there, and each ``encode`` call keeps the states for
        #: the teacher reranker to go on from (an ONNX graph gives only the last state)
        self.shared_layers = info.shared_layers if runtime == "torch" else 0
        self.split: Any = None
        self.kept: Any = None
        if self.shared_layers:
            from vecplug.indexer.cascade import KeptStates, split_forward

            self.split, self.kept = split_forward(self.model, self.shared_layers), KeptStates()
        #: this model's upper layers by the layer they start at, for states a student kept
        #: (:meth:`continue_from`)
        self._uppers: dict[int, Any] = {}

    def tokenize(self, texts: Sequence[str], prefix: str, max_length: int) -> list[list[int]]:
        return self._shared.ids([prefix + t for t in texts], min(max_length, self.model_max_length))

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character spans of ``text``'s tokens (no special tokens, no truncation): the chunker's.

        ``verbose=False``: a whole file's block is longer than the model takes by design (only
        the spans are used, never fed to the model), so transformers' "sequence length is longer
        than the specified maximum" warning would be a false alarm on every long file."""
        return self._shared(text, add_special_tokens=False, return_offsets_mapping=True,
                            verbose=False)["offset_mapping"]

    def encode(self, texts: Sequence[str], prefix: str = "", max_length: int = 512,
               progress: bool | None = None, desc: str = "encoding",
               on_cut: Callable[[int], None] | None = None) -> np.ndarray:
        """Embed ``texts`` (prefix prepended) into an (n, dim) float32 array of unit vectors.
        ``on_cut`` is told how many of them are longer than the length limit (their ends are
        not embedded)."""
        import torch
        from tqdm.auto import tqdm

        out = np.zeros((len(texts), self.out_dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokenize(texts, prefix, max_length)
        if on_cut is not None:
            limit = min(max_length, self.model_max_length)
            # one token more tells a text cut from one that fits exactly (as passages do)
            full = [prefix + texts[i] for i, seq in enumerate(ids) if len(seq) >= limit]
            on_cut(sum(len(seq) > limit for seq in self._shared.ids(full, limit + 1)) if full else 0)
        if self.kept is not None:
            self.kept.begin()
        show = progress if progress is not None else len(texts) >= 512
        # no bar object at all when hidden: even a disabled one costs a query ~0.2 ms
        bar = tqdm(total=len(texts), desc=desc, unit="text", leave=False) if show else None
        with torch.inference_mode():
            for batch, input_ids, mask in self._batches(ids):
                pooled = self._pooled(input_ids, mask)
                if self.post is not None:
                    pooled = self.post(pooled)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[batch] = pooled.float().numpy()
                self.tokens_seen += int(mask.sum())
                if bar is not None:
                    bar.update(len(batch))
        if bar is not None:
            bar.close()
        return out

    def _batches(self, ids: list[list[int]]) -> Iterator[tuple[list[int], np.ndarray, np.ndarray]]:
        """(positions in ``ids``, padded input ids, mask) batches, int64 arrays: sorted by
        length and cut where padding costs least (``indexer.length_batches``), capped by
        padded tokens."""
        overhead = length_batches.FORWARD_OVERHEAD[self.precision]
        for batch in length_batches.plan([len(seq) for seq in ids], self.batch_tokens, MAX_BATCH_SIZE,
                                         self.dim, overhead):
            longest = len(ids[batch[0]])
            input_ids = np.full((len(batch), longest), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(batch), longest), dtype=np.int64)
            for row, i in enumerate(batch):
                seq = ids[i]
                input_ids[row, :len(seq)] = seq
                mask[row, :len(seq)] = 1
            yield batch, input_ids, mask

    def calibration_feeds(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The ONNX graph's inputs (token embeddings, mask) for the shipped calibration texts,
        with the model's query prefix and with its document prefix: what the smoothed int8
        recipe measures activation ranges on."""
        import torch

        from vecplug.indexer.onnx_runtime import calibration_texts

        texts = calibration_texts()
        for prefix in dict.fromkeys((self.info.query_prefix, self.info.document_prefix)):
            with torch.inference_mode():
                for _, input_ids, mask in self._batches(self.tokenize(texts, prefix, DEFAULT_DOCUMENT_MAX_LENGTH)):
                    yield self._embeddings(input_ids), mask

    def _embeddings(self, input_ids: np.ndarray) -> np.ndarray:
        """The token embeddings: the ONNX graph's input (the table stays in torch, shared)."""
        import torch

        return self.model.get_input_embeddings()(torch.from_numpy(input_ids)).numpy()

    def _pooled(self, input_ids: np.ndarray, mask: np.ndarray) -> Any:
        """Mean of the last hidden states over the real tokens (a tensor)."""
        import torch

        if self.onnx is not None:
            return torch.from_numpy(self.onnx(self._embeddings(input_ids), mask))
        if input_ids.size <= SMALL_FORWARD_TOKENS:
            with self._count_lock:  # threads encoding at once: counted once each, traced once
                self.small_forwards += 1
                due = self.small_forwards == self.trace_after
            if due:
                with LOAD_LOCK:  # tracing silences warnings process-wide (warnings.catch_warnings)
                    self._trace()
        ids, mask_t = torch.from_numpy(input_ids), torch.from_numpy(mask)
        if self.split is not None:
            hidden, state = (self.graph if self.graph is not None else self.split)(ids, mask_t)
            self.kept.add(input_ids, mask, state)
        elif self.compiled is not None and input_ids.size > SMALL_FORWARD_TOKENS:
            # (before the graph: once queries have traced it, it would take the large batches
            # that compile is for)
            hidden = self.compiled(ids, mask_t)
        elif self.graph is not None:
            hidden = self.graph(ids, mask_t)
        else:
            hidden = self.model(input_ids=ids, attention_mask=mask_t).last_hidden_state
        return _mean(hidden, mask_t)

    def continue_from(self, states: Sequence[Any], start: int) -> np.ndarray:
        """Unit vectors (n, out_dim) of texts whose hidden states after layer ``start`` are
        ``states`` (one (tokens, hidden) tensor each, as a student sharing ``start`` layers with
        this model kept them): this model's layers from ``start`` on, then its pooling and
        projection, as :meth:`encode` would give for those texts (``indexer.cascade``)."""
        import torch

        from vecplug.indexer.cascade import Upper

        if self.onnx is not None:  # an ONNX graph runs every layer: callers encode instead
            raise ValueError("continue_from needs the torch runtime")
        out = np.zeros((len(states), self.out_dim), dtype=np.float32)
        if start not in self._uppers:
            with LOAD_LOCK:
                if start not in self._uppers:
                    self._uppers[start] = Upper(self.model, start)
        upper = self._uppers[start]
        with torch.inference_mode():
            # the token planner's batches by length (placeholder ids: only the lengths count)
            for batch, _, mask in self._batches([[0] * len(s) for s in states]):
                hidden = torch.zeros((len(batch), mask.shape[1], self.dim), dtype=upper.dtype)
                for row, i in enumerate(batch):
                    hidden[row, :len(states[i])] = states[i]
                mask_t = torch.from_numpy(mask)
                if mask.size <= SMALL_FORWARD_TOKENS and self.trace_after is not None:
                    upper.count_small(self.trace_after, self._count_lock)
                pooled = _mean(upper(hidden, mask_t), mask_t)
                if self.post is not None:
                    pooled = self.post(pooled)
                out[batch] = torch.nn.functional.normalize(pooled, dim=-1).float().numpy()
        return out

    def _int8_query(self, float_layers: Sequence[int] = ()) -> Any:
        """The model in torch's int8 recipe for a student's queries (``indexer.torch_int8``),
        smoothed by the model's peaks (its folder's, cached or calibrated: ``model_peaks``),
        the FFN down-projections of ``float_layers`` in float32."""
        from vecplug.indexer.torch_int8 import int8_query, model_peaks

        return int8_query(self.model, model_peaks(self.info, self.model, self.calibration_peaks),
                          float_layers=float_layers)

    def _int8_documents(self, recipe: str, engine: str | None) -> Any:
        """The model in the documents' int8 ``recipe`` run by torch
        (``indexer.torch_int8_documents``): its weights packed for ``engine``, the float layers in
        :attr:`precision`; the smoothing peaks cached or calibrated on the shipped sentences
        with the query and the document prefix (as ONNX Runtime's graph of the recipe)."""
        from vecplug.indexer.onnx_runtime import calibration_texts
        from vecplug.indexer.torch_int8_documents import group_peaks, int8_documents, recipe_peaks, shared_inputs

        texts = calibration_texts()
        prefixes = tuple(dict.fromkeys((self.info.query_prefix, self.info.document_prefix)))
        groups = shared_inputs(self.model, *next(self._batches(self.tokenize(texts[:2], "", 32)))[1:])

        def calibrate() -> dict[str, np.ndarray]:
            return group_peaks(self.model, groups, (batch[1:] for prefix in prefixes for batch in self._batches(
                self.tokenize(texts, prefix, DEFAULT_DOCUMENT_MAX_LENGTH))))

        peaks = recipe_peaks(self.info, self.model, recipe, prefixes, groups, calibrate)
        return int8_documents(self.model, recipe, groups, peaks, self.precision, engine)

    def calibration_peaks(self) -> dict[str, np.ndarray]:
        """The float32 model's activation peaks at its FFN down-projections over the shipped
        calibration sentences as queries (a student encodes nothing else): what torch's int8
        recipe for a student smooths with."""
        from vecplug.indexer.onnx_runtime import calibration_texts
        from vecplug.indexer.torch_int8 import CALIBRATION_MAX_LENGTH, activation_peaks

        return activation_peaks(self.model, (batch[1:] for batch in self._batches(
            self.tokenize(calibration_texts(), self.info.query_prefix, CALIBRATION_MAX_LENGTH))))

    def _trace(self) -> None:
        """Trace the model on a small padded batch and check the graph on another (not on the
        batch being encoded, which may be large: tracing runs a forward pass)."""
        from vecplug.indexer.traced import TRACE_TEXTS, trace

        example, check = (next(self._batches(self.tokenize(texts, "", 32)))[1:] for texts in TRACE_TEXTS)
        self.graph = trace(self.model, example, check, forward=self.split)

    def describe(self) -> dict[str, Any]:
        return {"model": self.info.spec, "checksum": self.info.checksum, "dim": self.dim,
                "quantize": self.quantize, "runtime": self.runtime}


def _mean(hidden: Any, mask: Any) -> Any:
    """Mean of the hidden states over the real tokens, in float32 (bfloat16's 8-bit mantissa
    would round a sum of 256 tokens)."""
    hidden = hidden.float()
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def _drop_layers(model: Any) -> None:
    """Free a model's modules other than its embeddings (once its layers run in ONNX Runtime,
    torch only looks up token embeddings): 42 MB of the student, 85 MB of the teacher."""
    import torch

    table = model.get_input_embeddings()
    for name, child in list(model.named_children()):
        if child is not None and not any(m is table for m in child.modules()):
            setattr(model, name, torch.nn.Identity())


def _int8(model: Any) -> Any:
    """The model with int8 weights in its linear layers (dynamic quantisation: activations are
    quantised per batch), except those that narrow the width. Embeddings (the shared vocabulary
    table) stay as they are. This is torch's general recipe (``int8_recipe="int8-general"``),
    which a document encoder's own queries (``--int8``) took until they were given the
    documents' recipe (it kept 96.4% of float32's X-Y mAP@20 without the language-bias
    correction, README "Speed"); kept for the benchmarks that compare with it. A student's
    queries take ``indexer.torch_int8``'s.

    Weights are quantised per output channel: one scale per row keeps rows of small weights
    from being rounded away by the largest row. Layers with more inputs than outputs (the
    feed-forward block's down-projection, a projection head) stay float32: their inputs, after
    the GELU, hold a few large values that one per-batch activation scale cannot represent
    with the rest. On XQuAD-R (README "Student figures") the shipped student in int8 kept 84%
    of its float32 X-Y mAP@20 with torch's default (per-tensor, every layer), 88% per channel,
    and 98% per channel with the down-projections in float32.
    """
    import warnings

    import torch

    with warnings.catch_warnings():
        # torch marks its eager-mode quantisation as deprecated in favour of torchao, which
        # this machine does not have; it still works and is measured in the README
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        spec = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and m.in_features <= m.out_features}
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)


def _quantize_for(setting: str | None, info: ModelInfo) -> str | None:
    """The query side's quantisation for ``model.query_quantize`` (None: float32). ``auto``
    takes the model's measured one, on x86 only: that is where it was measured, and torch's
    int8 kernels on other CPUs (qnnpack on ARM) are another implementation."""
    if setting in (None, "none"):
        return None
    if setting != "auto":
        return setting
    if info.query_quantize is None:
        return None
    return info.query_quantize if _x86() else None


def _x86() -> bool:
    """Whether this CPU is x86, where torch's int8 kernels (FBGEMM) were measured."""
    import platform

    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


#: torch's int8 recipe for a document encoder's queries: the students' query recipe (every
#: linear int8, the FFN down-projections smoothed: ``indexer.torch_int8``) with the first
#: layer's down-projection kept in float32. Without that exception the teacher's queries kept
#: 98.97% of its float X-Y mAP@20 on XQuAD-R without the language-bias correction (0.3143 against
#: 0.3175), under the 99% an int8 switch must keep; with it 99.2% (0.3149), 99.4% with the
#: correction. The exception was chosen on XQuAD-R (the first layer against the last: 0.3143).
TEACHER_INT8 = "int8-teacher-query"
#: the int8 recipe of the teacher's queries under torch: its own (``model.query_quantize:
#: int8``) and the teacher reranker's (``teacher:int8``), one model for both. A query's teacher
#: pass 6.5 ms against the documents' recipe's 10.9 (which keeps every down-projection float32)
#: on a CPU without AMX, the reranking at 99.5% of the float teacher's (README "The rerank
#: gate"). Under ONNX Runtime both keep the documents' recipe (no other was measured there).
#: ``benchmarks/teacher_query_recipe.py`` sets it to weigh the others (``int8``: the
#: documents' recipe; ``int8-query``: the students').
TEACHER_QUERY_RECIPE = TEACHER_INT8


def teacher_quantize_for(setting: str | None, precision: str, runtime: str) -> str | None:
    """The teacher reranker's quantisation (``teacher``, ``teacher:none``, ``teacher:int8``,
    ``teacher:auto``) for an encoder whose float models run in ``precision`` under
    ``runtime``. ``auto`` is ``int8`` where the float teacher would run in float32 under torch
    on x86 (a CPU without AMX): there its int8 weights (:data:`TEACHER_QUERY_RECIPE`) take a
    reranked query's teacher pass from 21.6 to 6.5 ms at 99.5% of the float teacher's
    reranking X-Y mAP@20 (README "The rerank gate"); with AMX (bfloat16) int8 in the
    documents' recipe gained nothing (this recipe was not measured there), and under ONNX
    Runtime int8 was not measured, so ``auto`` keeps the document encoder as loaded there."""
    if setting in (None, "none"):
        return None
    if setting == "auto":
        return "int8" if precision == "float32" and runtime == "torch" and _x86() else None
    if setting != "int8":
        from vecplug.errors import ConfigError

        raise ConfigError(f"unknown quantisation '{setting}' for the teacher's queries; known: none, int8, auto")
    return setting


class Encoder:
    """Documents and queries into one vector space.

    ``document`` encodes what gets indexed; ``query`` (default: the same model) encodes
    queries, typically a student distilled from the document encoder. Each side is loaded on
    first use, so a process that only searches never loads the document encoder. Prefixes
    come from the model (``query: ``/``passage: `` for E5) unless given. Length limits (tokens)
    default to 64 / 256, or the model's maximum if it takes fewer; a limit above the model's
    maximum is a :class:`~vecplug.errors.ConfigError`.
    """

    def __init__(self, document: ModelInfo, query: ModelInfo | None = None, *,
                 query_max_length: int | None = None,
                 document_max_length: int | None = None,
                 query_prefix: str | None = None, document_prefix: str | None = None,
                 batch_tokens: int = DEFAULT_BATCH_TOKENS, threads: int | None = None,
                 query_quantize: str | None = "auto", document_quantize: str | None = None,
                 runtime: str = "torch", document_int8_version: int | None = None,
                 recorded_lengths: Mapping[str, int] | None = None, trace: bool = True,
                 precision: str | None = "auto", compile: bool = False) -> None:
        refuse_cross_encoder(document, "document")  # from its JSON, before any index is made
        if query is not None:
            refuse_cross_encoder(query, "query")
        self.document_info = document
        self.query_info = query if query is not None and query.checksum != document.checksum else document
        self.query_quantize = _quantize_for(query_quantize, self.query_info)
        self.document_quantize = None if document_quantize in (None, "none") else document_quantize
        self.runtime = runtime
        #: what unquantised torch models compute in: ``model.precision`` resolved for this CPU
        #: (``auto``: bfloat16 with AMX, else float32; not bound to an index, see ``indexer.precision``)
        self.precision = resolve_precision(precision, runtime)
        #: torch runtime: a long-lived encoder traces its model (``indexer.traced``)
        self.trace = trace
        #: torch runtime: the document encoder's batches run through ``torch.compile``
        #: (``indexer.compiled``; the query side never is)
        self.compile = compile
        #: documents whose text reached document_max_length, over every encode_documents call:
        #: only their beginning is embedded (the integrations warn; an indexing run reports it)
        self.documents_cut = 0
        self._cut_lock = threading.Lock()
        #: which version of the documents' int8 recipe encodes documents (None: the current
        #: one): an index of int8 documents keeps the version it was built with
        self.document_int8_version = document_int8_version
        self._document: TextEncoder | None = None
        self._query: TextEncoder | None = None
        #: the document model in int8 for a reranker's queries (:meth:`teacher_queries`)
        self._teacher_int8: TextEncoder | None = None
        self.batch_tokens, self.threads = batch_tokens, threads
        self.projection = _projection_of(self.query_info)
        self.dim = int(self.projection["components"].shape[1]) if self.projection else _hidden_size(document)
        if _hidden_size(self.query_info) != _hidden_size(document):
            from vecplug.errors import ModelMismatchError

            raise ModelMismatchError(
                f"query encoder {self.query_info.spec} has dimension {_hidden_size(self.query_info)}, "
                f"document encoder {document.spec} has {_hidden_size(document)}")
        # checked here, from the models' JSON files (no weights loaded), so a bad limit stops a
        # run before an index is created with it in its manifest
        # ``recorded_lengths``: an index's manifest, used when no limit is given; one from
        # before limits were checked may exceed the model (its texts were cut at the model's
        # maximum then, as now)
        recorded = recorded_lengths or {}
        self.query_max_length = _length_limit("model.query_max_length", query_max_length,
                                              DEFAULT_QUERY_MAX_LENGTH, self.query_info,
                                              recorded.get("query_max_length"))
        self.document_max_length = _length_limit("model.document_max_length", document_max_length,
                                                 DEFAULT_DOCUMENT_MAX_LENGTH, document,
                                                 recorded.get("document_max_length"))
        self.query_prefix = self.query_info.query_prefix if query_prefix is None else query_prefix
        self.document_prefix = document.document_prefix if document_prefix is None else document_prefix

    @classmethod
    def from_specs(cls, document: str, query: str | None = None, **kwargs: Any) -> "Encoder":
        """Resolve (and if needed build) the models named by the specs."""
        doc = resolve_model(document)
        return cls(doc, resolve_model(query) if query and query != document else None, **kwargs)

    @property
    def document(self) -> TextEncoder:
        """The document side, loaded on first use (once, whichever threads ask at once)."""
        if self._document is None:
            with LOAD_LOCK:
                if self._document is None:
                    # assigned once whole: another thread reads it without the lock
                    self._document = self._load_document()
        return self._document

    @property
    def query(self) -> TextEncoder:
        """The query side, loaded on first use (once, whichever threads ask at once)."""
        if self._query is None:
            with LOAD_LOCK:
                if self._query is None:
                    self._query = self._load_query()
        return self._query

    def teacher_queries(self, quantize: str | None = None) -> TextEncoder:
        """The document encoder as a reranker re-embeds queries with it (the teacher of a
        student): the document side as loaded (``quantize`` None or ``none``), or ``int8``:
        under torch in :data:`TEACHER_QUERY_RECIPE` (FBGEMM kernels, every linear int8 but one),
        under ONNX Runtime in the documents' recipe; the teacher's own int8 queries
        (``model.query_quantize: int8``, the same recipe) when it embeds the queries itself.
        Loaded on first use with the teacher's vocabulary table shared with whichever side holds
        it. Its vectors (and projection, if any) are the document side's: a query re-embedded
        here scores against the stored documents.
        ``auto``: :func:`teacher_quantize_for` chooses (int8 on a CPU without AMX)."""
        if teacher_quantize_for(quantize, self.precision, self.runtime) is None:
            return self.document
        if self.query_info is self.document_info and self.query_quantize == "int8":
            return self.query  # the teacher already embeds the queries, in int8
        if self._teacher_int8 is None:
            with LOAD_LOCK:
                if self._teacher_int8 is None:
                    teacher = TextEncoder(self.document_info, self.batch_tokens, self.threads,
                                          post=_pca_map(self.projection) if self.projection else None,
                                          quantize="int8", runtime=self.runtime,
                                          int8_recipe=self._teacher_recipe(),
                                          trace=self.trace, precision=self.precision)
                    table = self._teacher_table()
                    if table is not None:  # quantisation leaves the table float: one copy for all
                        teacher.model.get_input_embeddings().weight = table
                    self._teacher_int8 = teacher
        return self._teacher_int8

    def teacher_vectors(self, texts: Sequence[str], quantize: str | None = None) -> np.ndarray:
        """Query ``texts`` as :meth:`teacher_queries` embeds them (a reranker's second opinion).

        With a query student that shares its first layers with this teacher
        (``indexer.cascade``), the queries it encoded last in this thread are not encoded again:
        the teacher goes on from the states the student kept, through its own upper layers
        (the same vectors, up to the student computing the shared layers in its own precision
        or quantisation). The others are encoded whole."""
        teacher = self.teacher_queries(quantize)
        out = np.zeros((len(texts), teacher.out_dim), dtype=np.float32)
        shared = self.query_info.shared_layers if self._one_table() and self.query_info.teacher else 0
        kept = self._query.kept if self._query is not None and shared else None
        found: dict[int, Any] = {}
        if kept is not None and teacher.onnx is None:
            ids = teacher.tokenize(texts, self.query_prefix, self.query_max_length)
            found = {i: state for i, seq in enumerate(ids) if (state := kept.get(seq)) is not None}
        if found:
            out[list(found)] = teacher.continue_from(list(found.values()), shared)
        rest = [i for i in range(len(texts)) if i not in found]
        if rest:
            out[rest] = teacher.encode([texts[i] for i in rest], self.query_prefix, self.query_max_length,
                                       progress=False)
        return out

    def _teacher_table(self) -> Any:
        """A loaded copy of the document model's vocabulary table, or None."""
        if self._document is not None:
            return self._document.model.get_input_embeddings().weight
        if self._query is not None and self._one_table():
            return self._query.model.get_input_embeddings().weight
        if self._teacher_int8 is not None:
            return self._teacher_int8.model.get_input_embeddings().weight
        return None

    def _load_document(self) -> TextEncoder:
        if self._same_model() and self._query is not None:
            return self._query
        document = TextEncoder(self.document_info, self.batch_tokens, self.threads,
                               post=_pca_map(self.projection) if self.projection else None,
                               quantize=self.document_quantize, runtime=self.runtime,
                               int8_recipe=self._document_recipe(), trace=self.trace,
                               precision=self.precision, documents=True, compile=self.compile)
        table = self._teacher_table()
        if table is not None:
            # another side came first: the documents take its copy of the table (identical
            # by checksum), and their own is freed
            document.model.get_input_embeddings().weight = table
        return document

    def _load_query(self) -> TextEncoder:
        if self._same_model():
            return self.document
        if self.query_info is self.document_info:  # the document encoder, quantised otherwise
            query = TextEncoder(self.document_info, self.batch_tokens, self.threads,
                                quantize=self.query_quantize, runtime=self.runtime,
                                int8_recipe=self._teacher_recipe(), trace=self.trace, precision=self.precision)
            table = self._teacher_table()
            if table is not None:  # one table for both sides (quantisation leaves it)
                query.model.get_input_embeddings().weight = table
            return query
        # a student built on the loaded teacher's vocabulary table (never a copy of its own)
        table = self._teacher_table() if self._one_table() else None
        shared = table.detach() if table is not None else None
        return TextEncoder(self.query_info, self.batch_tokens, self.threads, shared,
                           post=_head_map(self.projection) if self.projection else None,
                           quantize=self.query_quantize, runtime=self.runtime,
                           int8_recipe="int8-query", trace=self.trace, precision=self.precision)

    def _teacher_recipe(self) -> str:
        """The int8 recipe of the teacher's queries (its own and a reranker's, one model):
        :data:`TEACHER_QUERY_RECIPE` under torch, the documents' under ONNX Runtime (no other
        was measured there)."""
        return TEACHER_QUERY_RECIPE if self.runtime == "torch" else "int8"

    def _one_table(self) -> bool:
        """The two sides look tokens up in identical vocabulary tables: one model (quantised
        alike or not), or a student and the teacher it was distilled from (by checksum)."""
        teacher = self.query_info.teacher
        return self.query_info is self.document_info or (
            teacher is not None and teacher.checksum == self.document_info.checksum)

    def _same_model(self) -> bool:
        """Queries and documents run through one loaded model (same weights, same quantisation)."""
        return self.query_info is self.document_info and self.query_quantize == self.document_quantize

    def document_limit(self) -> int:
        """Tokens a document is cut at: ``document_max_length``, or the model's own maximum
        when that is smaller (an index recorded before lengths were checked against it)."""
        return min(self.document_max_length, max_tokens(self.document_info))

    def document_room(self) -> int:
        """Tokens of a document's own text the document encoder keeps: its maximum length less
        the prefix's tokens and the special tokens (``<s>``, ``</s>``); the most a passage may
        hold. From the tokenizer alone (no weights are loaded)."""
        info = self.document_info
        shared = shared_tokenizer(info.tokenizer_path, (info.teacher or info).checksum)
        prefix = shared(self.document_prefix, add_special_tokens=False)["input_ids"] if self.document_prefix else []
        return self.document_limit() - shared.tokenizer.num_special_tokens_to_add(pair=False) - len(prefix)

    def encode_documents(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        """(n, dim) float32 unit vectors of ``texts`` (a list of strings), as documents.
        :attr:`documents_cut` counts those cut at ``document_max_length``."""
        return self.document.encode(text_list(texts), self.document_prefix, self.document_max_length,
                                    progress, desc="documents", on_cut=self._count_cut)

    def _count_cut(self, n: int) -> None:
        with self._cut_lock:
            self.documents_cut += n

    def encode_queries(self, texts: Sequence[str], progress: bool | None = None) -> np.ndarray:
        """(n, dim) float32 unit vectors of ``texts`` (a list of strings), as queries."""
        return self.query.encode(text_list(texts), self.query_prefix, self.query_max_length,
                                 progress, desc="queries")

    def describe(self) -> dict[str, Any]:
        """What a manifest records to refuse a mismatched encoder later."""
        q = self.query_info
        return {
            "document_encoder": self.document_info.spec,
            "document_encoder_checksum": self.document_info.checksum,
            "query_encoder": q.spec,
            "query_encoder_checksum": q.checksum,
            "query_encoder_teacher_checksum": q.teacher.checksum if q.teacher else q.checksum,
            "dim": self.dim,
            "projection": ({"by": q.spec, "checksum": self.projection["checksum"], "dim": self.dim}
                           if self.projection else None),
            "pooling": "mean",
            "normalize": True,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
            "query_max_length": self.query_max_length,
            "document_max_length": self.document_max_length,
            "query_quantize": self.query_quantize,
            "document_quantize": self.document_quantize,
            "document_int8_version": self._document_int8_version(),
            "runtime": self.runtime,
            # what unquantised torch models, and the float layers of torch's int8 documents,
            # computed in; informative, never checked: either precision's vectors rank alike
            "precision": self.precision,
        }

    def _document_int8_version(self) -> int | None:
        if self.document_quantize != "int8":
            return None
        from vecplug.indexer.onnx_runtime import DOCUMENT_INT8_VERSION

        return self.document_int8_version or DOCUMENT_INT8_VERSION

    def _document_recipe(self) -> str:
        """The ``onnx_runtime.INT8_RECIPES`` entry of the documents' int8 recipe version."""
        from vecplug.indexer.onnx_runtime import DOCUMENT_INT8_RECIPES

        version = self._document_int8_version()
        if version is None:
            return "int8"
        if version not in DOCUMENT_INT8_RECIPES:
            from vecplug.errors import ModelMismatchError

            raise ModelMismatchError(
                f"document int8 recipe mismatch: documents encoded with int8 recipe version {version}, "
                f"which this vecplug does not know (it knows {', '.join(map(str, DOCUMENT_INT8_RECIPES))}); "
                "upgrade vecplug to add documents")
        return DOCUMENT_INT8_RECIPES[version]


def refuse_cross_encoder(info: ModelInfo, role: str) -> None:
    """Refuse a cross-encoder ``vecplug train`` wrote (``vecplug.json`` kind ``vecplug
    cross-encoder``) as the ``role`` ("document", "query", "teacher") encoder: its transformer
    loads without its relevance head and gives vectors nothing was trained for, silently. The
    cross-encoder reranker refuses the reverse mistake (an embedding model) the same way."""
    from vecplug.errors import ModelError
    from vecplug.indexer.models import _read_meta

    meta = _read_meta(info.path)
    if isinstance(meta, dict) and meta.get("kind") == "vecplug cross-encoder":
        raise ModelError(f"{info.spec} is a cross-encoder (it scores (query, document) pairs; it embeds "
                         f"no text), not a {role} encoder: rerank with it, --rerank cross-encoder:{info.spec}")


def _hidden_size(info: ModelInfo) -> int:
    import json

    config = json.loads((info.path / "config.json").read_text())
    size = config.get("hidden_size", config.get("d_model", config.get("dim")))
    if size is None:
        from vecplug.errors import ModelError

        raise ModelError(f"{info.path}/config.json names no hidden size")
    return int(size)


#: architectures whose positions start after the padding id (fairseq's convention): a table of
#: 514 positions takes 512 tokens when the padding id is 1
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text")


def position_limit(config: Mapping[str, Any]) -> int:
    """The most tokens a model's position table takes, from its config (a dict): its size (512
    if none is named), less the padding offset of RoBERTa-style models (XLM-R)."""
    limit = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in _OFFSET_POSITIONS:
        limit -= int(config.get("pad_token_id") or 0) + 1
    return limit


def pair_truncation(query_tokens: int, pair_specials: int, max_length: int) -> str:
    """How a cross-encoder's (query, document) pair is cut to ``max_length`` tokens, given the
    query's length (no special tokens) and the special tokens a pair adds: the document side
    ("only_second"), so that the query is read whole; when the query alone leaves no room for
    a document token, both sides ("longest_first"), since "only_second" would fail. The rule
    of the reranker and of cross-encoder training alike: a model is trained on the pairs it
    will be shown."""
    return "only_second" if query_tokens + pair_specials < max_length else "longest_first"


def pad_pairs(rows: Sequence[Mapping[str, list[int]]], pad_id: int) -> dict[str, Any]:
    """Token-id rows of (query, document) pairs (``input_ids``, maybe ``token_type_ids``) as a
    cross-encoder's input tensors, padded on the right, the attention mask built: for the
    reranker and for cross-encoder training alike."""
    import torch

    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"], dtype=torch.long)
        mask[i, :n] = 1
        if "token_type_ids" in row:
            types[i, :n] = torch.tensor(row["token_type_ids"], dtype=torch.long)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in rows[0]:
        inputs["token_type_ids"] = types
    return inputs


def max_tokens(info: ModelInfo) -> int:
    """The most tokens ``info``'s model takes, from its JSON files (no weights loaded): its
    position table's size (512 if its config.json names none), or its tokenizer's
    ``model_max_length`` if smaller: XLM-R's table holds 514 positions, of which the first two
    are never used (its positions start after the padding id), and its tokenizer says 512."""
    import json

    config = json.loads((info.path / "config.json").read_text())
    limit = position_limit(config)
    tok_config = info.tokenizer_path / "tokenizer_config.json"
    if tok_config.is_file():
        tok_limit = json.loads(tok_config.read_text()).get("model_max_length")
        if isinstance(tok_limit, (int, float)) and 0 < tok_limit < 1_000_000:  # unset: a huge number
            limit = min(limit, int(tok_limit))
    return limit


def _length_limit(setting: str, value: int | None, default: int, info: ModelInfo,
                  recorded: int | None = None) -> int:
    """The token limit ``setting`` asks of ``info``'s model: ``value``, else ``default`` (or the
    model's maximum, if it takes fewer). A value above the maximum is refused, not capped: the
    texts would be cut at the maximum while the index recorded the value as its limit."""
    most = max_tokens(info)
    if value is None:
        return min(default if recorded is None else int(recorded), most)
    if value > most:
        from vecplug.errors import ConfigError

        raise ConfigError(f"{setting} {value} is more than {info.spec} takes ({most} tokens)")
    return value


def _projection_of(info: ModelInfo) -> dict[str, Any] | None:
    """A lower-dimension student's projection (with its checksum), else None."""
    if info.teacher is None:
        return None
    from vecplug.indexer.checksums import weights_sha256
    from vecplug.indexer.student import PROJECTION, load_projection

    tensors = load_projection(info.path)
    if tensors is None:
        return None
    return {**tensors, "checksum": weights_sha256(info.path / PROJECTION)}


class _pca_map:
    """Documents: unit vector -> minus the mean -> the PCA directions (then normalised)."""

    def __init__(self, projection: dict[str, Any]) -> None:
        self.mean, self.components = projection["mean"], projection["components"]
        self.out_dim = int(self.components.shape[1])

    def __call__(self, pooled: Any) -> Any:
        import torch

        return (torch.nn.functional.normalize(pooled, dim=-1) - self.mean) @ self.components


class _head_map(_pca_map):
    """Queries: the student's trained head (initialised from the same PCA)."""

    def __init__(self, projection: dict[str, Any]) -> None:
        self.mean, self.components = projection["mean"], projection["head.weight"]
        self.bias = projection["head.bias"]
        self.out_dim = int(self.components.shape[1])

    def __call__(self, pooled: Any) -> Any:
        return super().__call__(pooled) + self.bias
