"""Torch's int8 recipe for documents: ONNX Runtime's documents' recipes, run by torch.

``--int8-documents`` (``model.document_quantize: int8``) names a recipe by version
(:data:`vecplug.indexer.onnx_runtime.DOCUMENT_INT8_RECIPES`); its settings, in
:data:`~vecplug.indexer.onnx_runtime.INT8_RECIPES`, say which weight matrices are int8 and
which inputs are smoothed. Version 2 (``int8``): every linear layer int8 but the FFN
down-projections, whose inputs after the GELU hold a few channels far larger than the rest;
the attention's Q, K and V smoothed first (SmoothQuant, as :mod:`vecplug.indexer.torch_int8`
does for a student's queries, one set of factors for the three: they read one tensor).
Version 1 (``int8-v1``): Q, K and V float too, nothing smoothed.

What torch adds to ONNX Runtime's graph:

- On a CPU with AMX (int8 tiles), the weights are packed for oneDNN's kernels, which use them;
  torch's default x86 kernels (FBGEMM) do not (``benchmarks/int8_documents.py --int8-engines
  fbgemm onednn``, README "Speed"). Only the documents' encoder takes oneDNN: queries, one
  short text at a time, keep FBGEMM, where their recipes were measured.
- The layers left float compute in the encoder's precision: bfloat16 where AMX is
  (``model.precision: auto``), so the down-projections, attention, GELU and layer norms run
  there too, not in float32 beside int8 matrix products.

Q, K and V are found as the linear layers that read one tensor in a forward pass (any
architecture whose attention projects its input three times; one with a fused QKV layer keeps
it int8 unsmoothed).
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from vecplug.indexer.torch_int8 import (
    ALPHA, _replace, _smoothed, activation_peaks, cached_peaks, narrowing)

#: the peaks' cache file's name: another recipe's (a student's ``int8-peaks-*``) never matches
PEAKS_PREFIX = "int8-documents-peaks"


def document_engine(compiled: bool = False) -> str | None:
    """torch's quantised engine for documents: ``onednn`` on a CPU with AMX int8 tiles (where
    it measured faster on document batches) or for a model to be compiled (``model.compile``:
    oneDNN's int8 product compiles into the graph, torch's dynamic layer breaks it into pieces
    that each recompile), else None (torch's default)."""
    import torch

    from vecplug.indexer.precision import amx_int8

    wanted = compiled or amx_int8()
    return "onednn" if wanted and "onednn" in torch.backends.quantized.supported_engines else None


@contextlib.contextmanager
def quantized_engine(name: str | None) -> Iterator[None]:
    """torch's quantised engine set to ``name`` (None: unchanged) while weights are packed.

    Packed weights keep their engine's kernels when the setting changes back (they are
    dispatched by their own type), so one process runs a student's queries on FBGEMM and its
    documents on oneDNN. The setting is process-wide: callers hold the model-loading lock."""
    import torch

    before = torch.backends.quantized.engine
    if name is not None:
        torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def shared_inputs(model: Any, ids: np.ndarray, mask: np.ndarray) -> list[list[str]]:
    """Names of the linear layers that read one tensor (each attention's Q, K and V), grouped,
    from one forward pass on ``(ids, mask)``."""
    import torch

    readers: dict[int, list[str]] = {}
    alive: list[Any] = []  # the tensors seen, kept so that no id is reused during the pass

    def hook(name: str) -> Callable[..., None]:
        def record(_module: Any, inputs: tuple[Any, ...]) -> None:
            alive.append(inputs[0])
            readers.setdefault(id(inputs[0]), []).append(name)
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)]
    try:
        with torch.inference_mode():
            model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    finally:
        for handle in handles:
            handle.remove()
    return [names for names in readers.values() if len(names) > 1]


def group_peaks(model: Any, groups: list[list[str]],
                batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per input channel, the largest |value| reaching each group (keyed by its first layer's
    name) over ``batches`` of (input ids, mask), real tokens only."""
    return activation_peaks(model, batches, [group[0] for group in groups])


def recipe_peaks(info: Any, model: Any, recipe: str, prefixes: tuple[str, ...], groups: list[list[str]],
                 calibrate: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The groups' peaks where ``recipe`` smooths them (cached by
    :func:`~vecplug.indexer.torch_int8.cached_peaks`, else ``calibrate()``); none for a recipe
    that smooths nothing (version 1), which then calibrates nothing."""
    from vecplug.indexer.onnx_runtime import INT8_RECIPES

    if "attention" not in INT8_RECIPES[recipe]["smooth"]:
        return {}
    return cached_peaks(info, model, recipe, prefixes, [g[0] for g in groups], calibrate, PEAKS_PREFIX)


def int8_documents(model: Any, recipe: str, groups: list[list[str]], peaks: dict[str, np.ndarray],
                   precision: str = "float32", engine: str | None = None, alpha: float = ALPHA) -> Any:
    """``model`` (changed in place) in the documents' int8 ``recipe`` (``int8`` or ``int8-v1``):
    weights per output channel, activations per tensor on 8 bits, packed for ``engine``; the
    float layers in ``precision``. ``groups``: :func:`shared_inputs`; ``peaks``: :func:`group_peaks`."""
    import torch

    from vecplug.indexer.onnx_runtime import INT8_RECIPES, smoothing_factors
    from vecplug.indexer.precision import to_bfloat16
    from vecplug.indexer.torch_int8 import _full_range

    settings = INT8_RECIPES[recipe]
    skip = set() if settings["narrowing"] else set(narrowing(model))
    groups = [group for group in groups if not skip & set(group)]  # a float layer is not fused in
    grouped = {name for group in groups for name in group}
    if not settings["attention"]:
        skip |= grouped
    fused = []
    if settings["attention"]:
        for group in groups:
            linears = [model.get_submodule(name) for name in group]
            inverse = None
            if "attention" in settings["smooth"]:
                # one factor per input channel for the whole group: its layers read one tensor
                weight_peak = torch.stack([m.weight.data.abs().amax(dim=0) for m in linears]).amax(dim=0)
                s = torch.from_numpy(smoothing_factors(peaks[group[0]], weight_peak.numpy(), alpha))
                for linear in linears:
                    linear.weight.data = linear.weight.data * s[None, :]
                inverse = 1.0 / s
            fused.append((group, _concatenated(linears), inverse))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's eager quantisation is marked deprecated (torch_int8)
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        spec = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and name not in skip and name not in grouped}
        with quantized_engine(engine):
            model = quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
            # per output channel, so each row's scale is what it was in its own layer: the
            # same vectors as three int8 layers, with one quantisation of the input, not three
            fused = [(group, quantize_dynamic(torch.nn.Sequential(linear), {"0": per_channel_dynamic_qconfig},
                                              dtype=torch.qint8)[0], inverse)
                     for group, linear, inverse in fused]
    # oneDNN's weights run in its own int8 product, FBGEMM's in torch's dynamic layer
    int8_layer = _onednn if engine == "onednn" else _full_range
    for name, m in list(model.named_modules()):
        if isinstance(m, DynamicLinear):
            _replace(model, name, int8_layer(m))
    for group, dynamic, inverse in fused:
        product = int8_layer(dynamic) if inverse is None else _smoothed(inverse, int8_layer(dynamic))
        shared = _Shared(product, [model.get_submodule(name).out_features for name in group])
        for i, name in enumerate(group):
            _replace(model, name, _member(shared, i))
    if precision == "bfloat16":
        to_bfloat16(model)
    return model


def _onednn(dynamic: Any) -> Any:
    """``dynamic`` (an int8 layer packed for oneDNN) run by oneDNN's own int8 product.

    The input is quantised as torch's dynamic layers do it with ``reduce_range=False`` (per
    tensor, asymmetric, on 8 bits, its range widened to hold 0): the same recipe (vectors
    within a cosine of ~0.999 of each other, as close to float32's as before: tested); what
    changes is the traffic around the product. torch's dynamic layer takes and gives
    float32 only: a bfloat16 model's activations were cast to float32 and its output back,
    two passes over memory per layer. Here the kernel writes its output in the input's dtype,
    and the range and the quantisation are plain tensor operations, which ``torch.compile``
    (``indexer.compiled``) fuses with the operations around them; eager, ``aminmax`` and
    ``quantize_per_tensor`` take a pass each."""
    import torch

    qweight, bias = dynamic._packed_params._weight_bias()
    scales = qweight.q_per_channel_scales().float().contiguous()
    int8 = qweight.int_repr().contiguous()
    out_features, in_features = int8.shape

    class OneDnnInt8(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # plain attributes, not buffers: a bfloat16 conversion of the model leaves the
            # scales and the bias in float32, as the kernel takes them
            self.packed = torch.ops.onednn.qlinear_prepack(int8, None)
            self.scales, self.bias = scales, None if bias is None else bias.detach().float()
            self.zeros = torch.zeros(out_features, dtype=torch.int64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            rows = x.reshape(-1, in_features).float()
            low, high = torch.aminmax(rows)
            low, high = low.clamp(max=0), high.clamp(min=0)
            scale = ((high - low) / 255).clamp(min=torch.finfo(torch.float32).tiny)
            zero = torch.round(-low / scale).to(torch.int64)
            if torch.compiler.is_compiling():
                q = torch.clamp(torch.round(rows / scale) + zero, 0, 255).to(torch.uint8)
            else:
                q = torch.quantize_per_tensor(rows, scale, zero, torch.quint8).int_repr()
            y = torch.ops.onednn.qlinear_pointwise.tensor(
                q, scale, zero, self.packed, self.scales, self.zeros, self.bias,
                1.0, 0, x.dtype, "none", [], "")
            return y.reshape(*x.shape[:-1], out_features)

    return OneDnnInt8()


def _concatenated(linears: list[Any]) -> Any:
    """One linear layer computing ``linears``' outputs side by side (they read one input)."""
    import torch

    first = linears[0]
    out = torch.nn.Linear(first.in_features, sum(m.out_features for m in linears),
                          bias=all(m.bias is not None for m in linears))
    out.weight.data = torch.cat([m.weight.data for m in linears])
    if out.bias is not None:
        out.bias.data = torch.cat([m.bias.data for m in linears])
    elif any(m.bias is not None for m in linears):
        out.bias = torch.nn.Parameter(torch.cat([m.bias.data if m.bias is not None else
                                                 torch.zeros(m.out_features) for m in linears]))
    return out


class _Shared:
    """A group's one product, computed by whichever member is called first on an input and
    handed to the others as they are called on the same tensor (by identity). A member called
    on another tensor (another thread's batch, between two of this one's) computes afresh, so
    the answer is always the input's own. The product is dropped when the group's last layer
    (in the model's calling order, as :func:`shared_inputs` lists it) takes its part, so no
    activations are held between forward passes."""

    def __init__(self, product: Any, widths: list[int]) -> None:
        self.product, self.widths = product, widths
        self.last: tuple[Any, list[Any]] | None = None

    def output(self, x: Any, member: int) -> Any:
        last = self.last  # one read: another thread may replace it meanwhile
        if last is None or last[0] is not x:
            last = (x, list(self.product(x).split(self.widths, dim=-1)))
            self.last = last
        if member == len(self.widths) - 1 and self.last is last:
            self.last = None
        return last[1][member]


def _member(shared: _Shared, index: int) -> Any:
    """Layer ``index`` of a group that reads one tensor (Q, K or V): its slice of the group's
    product. The first member holds the product as its submodule, so the model's modules
    (bfloat16's conversion, ``state_dict``) include it once."""
    import torch

    class Member(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared, self.index = shared, index
            if index == 0:
                self.product = shared.product

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.shared.output(x, self.index)

    return Member()
