"""The transformer's layers through ONNX Runtime (``model.runtime: onnx``), fp32 or int8.

On this machine's CPU, ONNX Runtime runs the shipped query student about twice as fast as torch
at identical vectors, and its int8 kernels faster again (figures in the README,
``benchmarks/query_latency.py``). The graph is exported from the loaded torch model on first
use and cached under ``$VECPLUG_HOME/onnx``, keyed by the model's checksum, its config (and a
calibrated recipe's prefixes and tokenizer: :func:`shape_key`), the quantisation, the recipe and the ONNX
Runtime version, so a later process only opens the file.

What goes into the graph: the layers, from the token embeddings to the mean-pooled vector. The
vocabulary table stays outside, in torch (one lookup per batch): it is most of a multilingual
model's size, and outside the graph a teacher and its student keep sharing one copy of it.
Normalisation and a student's projection stay outside too, so both runtimes share that code.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.errors import ConfigError, MissingDependencyError, ModelError
from vecplug.fsutil import fsync_path
from vecplug.indexer.models import LOAD_LOCK

log = logging.getLogger(__name__)

#: Bump when the export, the fusion or the quantisation below changes: cached graphs of an
#: older recipe are then rebuilt instead of reused. 3: ``int8-query`` for students' queries.
#: 4: residual additions and layer norms left unfused (:data:`UNFUSED`). 5: the documents'
#: ``int8`` recipe of version 2 (:data:`DOCUMENT_INT8_VERSION`). 6: the key covers the config
#: and the calibration's prefixes (:func:`shape_key`); older entries may hold another config's graph.
#: 7: the FFN down-projections found by the hidden size (:func:`_narrowing`: a student pruned
#: below it had its up-projections smoothed and kept in float32).
RECIPE = 7
#: ORT fusions vecplug leaves out, in the graph and in the session. ORT's CPU kernel for
#: SkipLayerNormalization (residual add + layer norm in one op) is several times slower here
#: than the add and the layer norm it replaces (onnxruntime 1.32, AVX2); unfused, the same
#: function runs faster (benchmarks/onnx_probe.py: the rows "residual norms fused").
UNFUSED = ["SkipLayerNormFusion"]
OPSET = 17
#: What :func:`smooth_inputs` can smooth: the FFN down-projections' inputs (``narrowing``) and
#: the fused attention's Q, K, V projection's input (``attention``).
SMOOTHABLE = ("attention", "narrowing")
#: The int8 recipes, by the graph's quantisation name: the nodes whose inputs are smoothed
#: first (:func:`smooth_inputs`), then :func:`quantize_int8`'s switches. Quality on XQuAD-R,
#: X-Y mAP@20 against float32: benchmarks/onnx_probe.py (``--documents`` for documents).
INT8_RECIPES: dict[str, dict[str, Any]] = {
    # an encoder that encodes documents: the FFN down-projections stay float32; the attention's
    # Q, K, V are int8 after smoothing their input. me5-small's passages: X-Y mAP@20 0.319 plain,
    # 0.571 with the correction, against 0.322 / 0.572 in fp32 (unsmoothed Q, K, V: 0.318 / 0.569)
    "int8": {"smooth": ("attention",), "attention": True, "narrowing": False},
    # the documents' recipe of version 1: Q, K, V float32 too, nothing smoothed (0.320 / 0.571)
    "int8-v1": {"smooth": (), "attention": False, "narrowing": False},
    # a student's queries (``TextEncoder(int8_recipe="int8-query")``): every weight, the
    # down-projections smoothed; the shipped student keeps 100% plain, 99.8% corrected
    "int8-query": {"smooth": ("narrowing",), "attention": True, "narrowing": True},
}
#: The documents' int8 recipe's version, recorded in an index's manifest, and the recipe of
#: each version: an index keeps encoding its new documents with the recipe of its version, so
#: one index never mixes two encoders' vectors; a version this vecplug does not know (from a
#: later one) refuses new documents. Bump it, keeping the old entry, when the ``int8`` recipe's
#: settings change (which weights are int8, smoothing); not for numerical differences between
#: builds of the same settings (a fusion, an ORT version), like float32 across torch versions.
DOCUMENT_INT8_VERSION = 2
DOCUMENT_INT8_RECIPES: dict[int, str] = {1: "int8-v1", 2: "int8"}
#: SmoothQuant's migration strength (chosen on XQuAD-R with benchmarks/onnx_probe.py: the
#: share of an input channel's range moved into the weights)
SMOOTH_ALPHA = 0.75
#: (embeddings, mask) batches, the graph's inputs: what the int8 recipe calibrates on
Feeds = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
#: config entries that do not shape the graph but differ between loads of one folder or between
#: transformers versions (besides the private ``_``-named ones, e.g. ``_name_or_path``: the
#: folder's path): the library's version and the dtype's two names (``torch_dtype``, now ``dtype``)
VOLATILE_CONFIG = frozenset({"transformers_version", "torch_dtype", "dtype"})


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or an error that says how to install it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", extra="onnx",
                                     purpose="model.runtime: onnx") from exc
    return onnxruntime


def cache_path(cache: Path, checksum: str, quantize: str | None, shape: str = "") -> Path:
    """Where the graph for a model (by its weights' checksum and its :func:`shape_key`
    ``shape``) and a quantisation is cached."""
    ort = require_onnxruntime()
    key = f"{checksum}|{shape}|{quantize or 'fp32'}|recipe{RECIPE}|opset{OPSET}|ort{ort.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache / f"{checksum[:12]}-{quantize or 'fp32'}-{digest}.onnx"


def shape_key(model: Any, quantize: str | None, prefixes: Sequence[str] = (),
              tokenizer: Path | None = None) -> str:
    """A short hash of what shapes the graph besides the weights' checksum: ``model``'s config
    (the same weights with another number of heads, activation or layer norm epsilon export
    another function) and, for a recipe that smooths, what its calibration texts are encoded
    with: the ``prefixes`` (a folder without ``vecplug.json`` takes them from its name) and the
    files of the ``tokenizer`` folder."""
    config = _stable_config(model.config.to_dict())
    smoothed = bool(INT8_RECIPES.get(quantize or "", {}).get("smooth"))
    calibration = None
    if smoothed:
        from vecplug.indexer.models import tokenizer_checksum

        calibration = [list(prefixes), tokenizer_checksum(tokenizer) if tokenizer is not None else ""]
    body = {"config": config, "calibration": calibration}
    # default=str: a config may hold values JSON has no type for (a torch dtype)
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _stable_config(value: Any) -> Any:
    """``value`` (a config's ``to_dict()``) without :data:`VOLATILE_CONFIG` and private entries,
    also in nested configs: the same for every load of one folder."""
    if isinstance(value, dict):
        return {k: _stable_config(v) for k, v in value.items()
                if not str(k).startswith("_") and k not in VOLATILE_CONFIG}
    if isinstance(value, (list, tuple)):
        return [_stable_config(v) for v in value]
    return value


def calibration_texts() -> list[str]:
    """The shipped calibration sentences (``calibration.txt``: Tatoeba, 112 languages)."""
    lines = Path(__file__).with_name("calibration.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


#: an export's temporary folder, named by its process: ``.export-<pid>-<random>``
EXPORT_FOLDER = re.compile(r"\.export-([0-9]+)-.+")
#: an export's folder as named before exports carried their process (``tempfile``'s 8 characters)
OLD_EXPORT_FOLDER = re.compile(r"\.export-[a-z0-9_]{8}")
#: an old-style folder untouched this long is a killed export's: none takes an hour
OLD_EXPORT_AGE = 24 * 3600.0


def remove_dead_exports(folder: Path) -> None:
    """Remove the temporary folders of exports whose process is gone, and those named before
    exports carried their process once they are a day old."""
    import shutil
    import time

    from vecplug.fsutil import remove_dead_leftovers

    remove_dead_leftovers(folder, EXPORT_FOLDER)
    for old in folder.glob(".export-*"):
        try:
            if (OLD_EXPORT_FOLDER.fullmatch(old.name) and old.is_dir() and not old.is_symlink()
                    and time.time() - old.stat().st_mtime > OLD_EXPORT_AGE):
                shutil.rmtree(old)
        except OSError:
            pass  # another cleaner's, or not ours to remove: it stays


def build_graph(model: Any, path: Path, quantize: str | None, calibration: Feeds | None = None) -> Path:
    """Export ``model`` (a Hugging Face encoder, eval mode), fuse it and optionally quantise it
    into ``path``, atomically: the file appears complete or not at all. ``quantize``: None or
    a name of :data:`INT8_RECIPES`; a smoothed recipe needs ``calibration``, the graph's inputs
    for some texts (see :func:`smooth_narrowing`)."""
    ort = require_onnxruntime()
    if importlib.util.find_spec("onnx") is None:  # the exporter, the optimizer and the quantiser need it
        raise MissingDependencyError("onnx", extra="onnx", purpose="model.runtime: onnx")
    if quantize is not None and quantize not in INT8_RECIPES:
        raise ConfigError(f"unknown quantisation '{quantize}'; known: int8")
    recipe = INT8_RECIPES.get(quantize or "")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_exports(path.parent)
    # named by this process: a killed export (they peak at 1.3-1.8 GB: OOM kills happen here)
    # left its folder of partial graphs, up to hundreds of MB, for good
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".export-{os.getpid()}-") as tmp:
        final = fused = Path(tmp) / "fused.onnx"
        export_fused(model, fused)
        if recipe:
            final = Path(tmp) / "int8.onnx"
            quantize_recipe(fused, final, recipe, calibration)
        # a session must open it before it takes the cache's name
        ort.InferenceSession(str(final), providers=["CPUExecutionProvider"])
        # on disk before the rename: else a crash can leave an empty file under the final name
        fsync_path(final)
        os.replace(final, path)
    fsync_path(path.parent)  # the rename itself
    return path


def quantize_recipe(fp32: Path, dst: Path, recipe: dict[str, Any], calibration: Feeds | None,
                    alpha: float = SMOOTH_ALPHA) -> None:
    """The float32 graph at ``fp32`` in int8 by ``recipe`` (one of :data:`INT8_RECIPES`), the
    smoothing at ``alpha`` calibrated on ``calibration``'s inputs (needed if it smooths). The
    smoothed float32 graph is written beside ``dst``."""
    source = fp32
    if recipe["smooth"]:
        if calibration is None:
            raise ValueError("a smoothed recipe needs calibration inputs")
        source = dst.with_name(dst.stem + ".smoothed.onnx")
        smooth_inputs(fp32, source, activation_peaks(fp32, calibration(), recipe["smooth"]), alpha,
                      recipe["smooth"])
    quantize_int8(source, dst, attention=recipe["attention"], narrowing=recipe["narrowing"])


def export_fused(model: Any, path: Path, residual_norms: bool = False) -> None:
    """Export ``model``'s layers (embeddings in, mean-pooled vector out) and fuse them into
    ``path`` (fp32). ``residual_norms``: fuse what vecplug leaves apart (:data:`UNFUSED`),
    to measure it."""
    raw = path.with_name(path.stem + ".raw.onnx")
    try:
        _export(model, raw)
        _fuse(raw, path, model.config, residual_norms)
    finally:
        raw.unlink(missing_ok=True)


@contextmanager
def _quiet(logger: str | None) -> Iterator[None]:
    """Only errors from ``logger`` (None: the root logger) inside the block."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _pooled_module(model: Any) -> Any:
    """``model`` wrapped as (token embeddings, mask) -> mean-pooled last hidden state."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, inputs_embeds: Any, attention_mask: Any) -> Any:
            h = self.m(inputs_embeds=inputs_embeds, attention_mask=attention_mask).last_hidden_state
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * w).sum(1) / w.sum(1).clamp(min=1)

    return Pooled().eval()


def _export(model: Any, path: Path) -> None:
    import warnings

    import torch

    hidden = int(model.config.hidden_size)
    embeds = torch.randn(2, 12, hidden)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # a padded row, so the mask's broadcasting is traced as it runs
    previous = getattr(model.config, "_attn_implementation", None)
    _set_attention(model, "eager")  # explicit softmax(QK)V ops: what ORT's optimizer can fuse
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            # the TorchScript exporter's tracer warnings (shape asserts turned constant) are
            # expected for a transformer; the graph is checked by a session below
            warnings.simplefilter("ignore")
            torch.onnx.export(_pooled_module(model), (embeds, mask), str(path),
                              input_names=["inputs_embeds", "attention_mask"], output_names=["pooled"],
                              dynamic_axes={"inputs_embeds": {0: "batch", 1: "length"},
                                            "attention_mask": {0: "batch", 1: "length"},
                                            "pooled": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
    except Exception as exc:  # the exporter raises many kinds; the user needs the model's name
        raise ModelError(f"cannot export {type(model).__name__} to ONNX: {exc}") from exc
    finally:
        if previous is not None:
            _set_attention(model, previous)


def _set_attention(model: Any, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        try:
            setter(name)
            return
        except (ValueError, ImportError):
            pass
    model.config._attn_implementation = name


def _fuse(src: Path, dst: Path, config: Any, residual_norms: bool = False) -> None:
    """ORT's transformer optimizer: LayerNorm, GELU and (where it matches) attention fused, the
    residual additions not (:data:`UNFUSED`) unless ``residual_norms``."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    options = FusionOptions("bert")
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = residual_norms
    with _quiet("onnxruntime.transformers"):  # fusion statistics at INFO/WARNING
        optimized = optimize_model(str(src), model_type="bert", num_heads=heads, hidden_size=hidden,
                                   optimization_options=options,
                                   opt_level=1)  # level 1: portable graph (no machine-specific layout)
    optimized.save_model_to_file(str(dst))


def _narrowing(graph: Any) -> list[Any]:
    """The weight MatMuls back to the hidden size (the token embeddings' width) from another:
    the FFN down-projections (as :func:`~vecplug.indexer.torch_int8.narrowing`: below the
    hidden size, the up-projections would narrow the width)."""
    dims = {i.name: tuple(i.dims) for i in graph.initializer}
    shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]
    hidden = next((s[2] for s in shapes if len(s) == 3 and s[2] > 0), 0)  # (batch, tokens, hidden)
    return [n for n in graph.node if n.op_type == "MatMul" and len(dims.get(n.input[1], ())) == 2
            and (dims[n.input[1]][1] == hidden != dims[n.input[1]][0] if hidden
                 else dims[n.input[1]][0] > dims[n.input[1]][1])]


def _smoothable(graph: Any, kinds: Iterable[str]) -> list[Any]:
    """The nodes of ``kinds`` (:data:`SMOOTHABLE`) in graph order: each has its activation
    input first and its (in, out) weight second."""
    kinds = set(kinds)
    if kinds - set(SMOOTHABLE):
        raise ValueError(f"cannot smooth {sorted(kinds - set(SMOOTHABLE))}; known: {', '.join(SMOOTHABLE)}")
    narrowing = {tuple(n.output) for n in _narrowing(graph)} if "narrowing" in kinds else set()
    weights = {i.name for i in graph.initializer}
    # by outputs, which name a node uniquely (protobuf hands out a new wrapper on each access)
    return [n for n in graph.node if tuple(n.output) in narrowing
            or ("attention" in kinds and n.op_type == "Attention" and n.input[1] in weights)]


def activation_peaks(path: Path, feeds: Iterable[tuple[np.ndarray, np.ndarray]],
                     kinds: Iterable[str] = ("narrowing",)) -> list[np.ndarray]:
    """Per input channel, the largest |value| reaching each node of ``kinds`` (see
    :func:`smooth_inputs`) in the graph at ``path`` over ``feeds`` (real tokens only, not
    padding), in graph order: what :func:`smooth_inputs` needs."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    inputs = [n.input[0] for n in _smoothable(model.graph, kinds)]
    names = list(dict.fromkeys(inputs))
    for name in names:  # expose the nodes' inputs as outputs of the graph
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    peaks: list[np.ndarray] = []
    for embeds, mask in feeds:
        real = mask.astype(bool)
        outs = session.run(names, {"inputs_embeds": embeds, "attention_mask": mask})
        batch = [np.abs(out[real]).max(axis=0) for out in outs]
        peaks = batch if not peaks else [np.maximum(a, b) for a, b in zip(peaks, batch)]
    if not peaks:
        raise ValueError("no calibration inputs")
    by_name = dict(zip(names, peaks))
    return [by_name[name] for name in inputs]


def smoothing_factors(peak: np.ndarray, weight_peak: np.ndarray, alpha: float = SMOOTH_ALPHA) -> np.ndarray:
    """SmoothQuant's s_j = peak_j^alpha / max|W_j|^(1-alpha) per input channel j, from the
    activations' peaks and the weight's largest |value| per input channel (float32)."""
    return (np.maximum(peak, 1e-5) ** alpha / np.maximum(weight_peak, 1e-5) ** (1 - alpha)).astype(np.float32)


def smooth_inputs(src: Path, dst: Path, peaks: list[np.ndarray], alpha: float = SMOOTH_ALPHA,
                  kinds: Iterable[str] = ("narrowing",)) -> None:
    """SmoothQuant (Xiao et al. 2023) for the nodes of ``kinds``: the same function, easier to
    quantise.

    Dynamic int8 quantises a whole activation tensor with one scale, which rounds away the
    channels far smaller than the largest: the FFN down-projections' inputs, after the GELU,
    have a few channels far larger than the rest, and the attention's input (a layer norm's
    output) a milder spread. Each input channel j of a node is divided by
    s_j = peak_j^alpha / max|W_j|^(1-alpha) (a Mul node before it, on that node's input only:
    the same tensor also feeds the residual addition) and the weight's row j multiplied by it:
    the product is unchanged in float, and the activations' range is moved partly into the
    weights, which are quantised per output channel. ``peaks``: :func:`activation_peaks` of
    ``src`` for the same ``kinds``.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    targets = _smoothable(graph, kinds)
    if len(targets) != len(peaks):
        raise ValueError(f"{len(peaks)} calibration peaks for {len(targets)} layers")
    for node, peak in zip(targets, peaks):
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)
        s = smoothing_factors(peak, np.abs(w).max(axis=1), alpha)  # MatMul weights: (in, out)
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(w * s[:, None].astype(np.float32),
                                                                node.input[1]))
        inverse, smoothed = f"{node.name}.smooth_inverse", f"{node.name}.smoothed_input"
        graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inverse))
        graph.node.insert(list(graph.node).index(node),
                          onnx.helper.make_node("Mul", [node.input[0], inverse], [smoothed],
                                                name=f"{node.name}.smooth"))
        node.input[0] = smoothed
    onnx.save(model, str(dst))


def quantize_int8(src: Path, dst: Path, *, attention: bool = True, narrowing: bool = True,
                  reduce_range: bool = True) -> None:
    """Dynamic int8 quantisation of the weight MatMuls and the fused attention, one scale per
    output channel (the activations: one scale per tensor, computed on each run).

    ``narrowing=False`` keeps the FFN down-projections float32: unless smoothed first
    (:func:`smooth_inputs`), their post-GELU inputs have a few large values that one
    activation scale represents badly (torch's ``encoder._int8`` keeps them float32 too).
    ``attention=False`` keeps the fused attention's Q, K and V projection float32 (else it runs
    as QAttention). ``reduce_range`` (7-bit weights) avoids the saturation of AVX2's u8 x s8
    multiply-add. :data:`INT8_RECIPES` are vecplug's settings; what each costs in quality and
    time: ``benchmarks/onnx_probe.py``.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src)).graph
    weights = {i.name for i in graph.initializer}
    # activation x activation (attention scores and context, when not fused) stay float32
    exclude = [n.name for n in graph.node if n.op_type == "MatMul" and not weights.intersection(n.input)]
    if not narrowing:
        exclude += [n.name for n in _narrowing(graph)]
    with _quiet(None):  # the quantiser logs every node it skips
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=reduce_range,
                         op_types_to_quantize=["MatMul", "Attention"] if attention else ["MatMul"],
                         nodes_to_exclude=exclude, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


class OnnxLayers:
    """A cached graph in an ONNX Runtime session: ``(embeds, mask) -> pooled``, numpy in and out."""

    def __init__(self, path: Path, threads: int | None = None) -> None:
        ort = require_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or 0)  # 0: ORT's default, one per physical core
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = path
        # the session would fuse them again when it loads the graph
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                            disabled_optimizers=UNFUSED)

    def __call__(self, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(["pooled"], {"inputs_embeds": embeds, "attention_mask": mask})[0]


def load_layers(model: Any, checksum: str, quantize: str | None, cache: Path,
                threads: int | None = None, calibration: Feeds | None = None,
                prefixes: Sequence[str] = (), tokenizer: Path | None = None) -> OnnxLayers:
    """The model's layers as an ORT session, exported (and quantised, calibrated on
    ``calibration``'s inputs) on first use; a cached graph ORT cannot open is built again.
    ``prefixes`` and ``tokenizer`` (its folder): what ``calibration`` encodes its texts with
    (part of the cache key)."""
    path = cache_path(cache, checksum, quantize, shape_key(model, quantize, prefixes, tokenizer))
    # one export at a time in a process (torch.onnx.export refuses a second), and a graph
    # another thread is building is waited for, not built twice
    with LOAD_LOCK:
        if path.is_file():
            try:
                return OnnxLayers(path, threads)
            except Exception as exc:  # ORT's errors share no base class below Exception
                # damaged (a crash before its rename was durable, a full disk): replace it, once
                log.warning("cached ONNX graph %s cannot be loaded (%s); building it again", path, exc)
                path.unlink(missing_ok=True)
        build_graph(model, path, quantize, calibration)
    try:
        return OnnxLayers(path, threads)
    except Exception as exc:
        raise ModelError(f"cannot load the ONNX graph built for {type(model).__name__} "
                         f"at {path}: {exc}") from exc
