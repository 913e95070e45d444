"""The transformer's layers through ONNX Runtime (``model.runtime: onnx``), fp32 or int8.

On this machine's CPU, ONNX Runtime runs the shipped query student about twice as fast as torch
at identical vectors, and its int8 kernels faster again (figures in the README,
``benchmarks/query_latency.py``). The graph is exported from the loaded torch model on first
use and cached under ``$VECPLUG_HOME/onnx``, keyed by the model's checksum, the quantisation,
the recipe and the ONNX Runtime version, so a later process only opens the file.

What goes into the graph: the layers, from the token embeddings to the mean-pooled vector. The
vocabulary table stays outside, in torch (one lookup per batch): it is most of a multilingual
model's size, and outside the graph a teacher and its student keep sharing one copy of it.
Normalisation and a student's projection stay outside too, so both runtimes share that code.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.errors import ConfigError, MissingDependencyError, ModelError

#: Bump when the export, the fusion or the quantisation below changes: cached graphs of an
#: older recipe are then rebuilt instead of reused.
RECIPE = 1
OPSET = 17


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or an error that says how to install it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", extra="onnx",
                                     purpose="model.runtime: onnx") from exc
    return onnxruntime


def cache_path(cache: Path, checksum: str, quantize: str | None) -> Path:
    """Where the graph for a model (by its weights' checksum) and a quantisation is cached."""
    ort = require_onnxruntime()
    key = f"{checksum}|{quantize or 'fp32'}|recipe{RECIPE}|opset{OPSET}|ort{ort.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache / f"{checksum[:12]}-{quantize or 'fp32'}-{digest}.onnx"


def build_graph(model: Any, path: Path, quantize: str | None) -> Path:
    """Export ``model`` (a Hugging Face encoder, eval mode), fuse it and optionally quantise it
    into ``path``, atomically: the file appears complete or not at all."""
    ort = require_onnxruntime()
    if importlib.util.find_spec("onnx") is None:  # the exporter, the optimizer and the quantiser need it
        raise MissingDependencyError("onnx", extra="onnx", purpose="model.runtime: onnx")
    if quantize not in (None, "int8"):
        raise ConfigError(f"unknown quantisation '{quantize}'; known: int8")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
        final = fused = Path(tmp) / "fused.onnx"
        export_fused(model, fused)
        if quantize == "int8":
            final = Path(tmp) / "int8.onnx"
            quantize_int8(fused, final)
        # a session must open it before it takes the cache's name
        ort.InferenceSession(str(final), providers=["CPUExecutionProvider"])
        os.replace(final, path)
    return path


def export_fused(model: Any, path: Path) -> None:
    """Export ``model``'s layers (embeddings in, mean-pooled vector out) and fuse them into
    ``path`` (fp32)."""
    raw = path.with_name(path.stem + ".raw.onnx")
    try:
        _export(model, raw)
        _fuse(raw, path, model.config)
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


def _fuse(src: Path, dst: Path, config: Any) -> None:
    """ORT's transformer optimizer: LayerNorm, GELU and (where it matches) attention fused."""
    from onnxruntime.transformers.optimizer import optimize_model

    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    with _quiet("onnxruntime.transformers"):  # fusion statistics at INFO/WARNING
        optimized = optimize_model(str(src), model_type="bert", num_heads=heads, hidden_size=hidden,
                                   opt_level=1)  # level 1: portable graph (no machine-specific layout)
    optimized.save_model_to_file(str(dst))


def quantize_int8(src: Path, dst: Path, *, attention: bool = False, narrowing: bool = False,
                  reduce_range: bool = True) -> None:
    """Dynamic int8 quantisation of the weight MatMuls, one scale per output channel.

    The defaults are vecplug's recipe. As in torch's (``encoder._int8``), the layers that narrow
    the width (the FFN down-projections; ``narrowing=True`` quantises them too) stay float32:
    their post-GELU inputs have a few large values that one per-batch activation scale
    represents badly. So do the fused attention's Q, K and V projections (``attention=True``:
    QAttention). ``reduce_range`` (7-bit weights) avoids the saturation of AVX2's u8 x s8
    multiply-add. What each costs in quality: ``benchmarks/onnx_probe.py``.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src)).graph
    weights = {i.name: tuple(i.dims) for i in graph.initializer}
    exclude = []
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        shapes = [weights[i] for i in node.input if i in weights]
        if not shapes:  # activation x activation: attention scores and context
            exclude.append(node.name)
        elif not narrowing and len(shapes[0]) == 2 and shapes[0][0] > shapes[0][1]:  # (in, out), in > out
            exclude.append(node.name)
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
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def __call__(self, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(["pooled"], {"inputs_embeds": embeds, "attention_mask": mask})[0]


def load_layers(model: Any, checksum: str, quantize: str | None, cache: Path,
                threads: int | None = None) -> OnnxLayers:
    """The model's layers as an ORT session, exported (and quantised) on first use."""
    path = cache_path(cache, checksum, quantize)
    if not path.is_file():
        build_graph(model, path, quantize)
    return OnnxLayers(path, threads)
