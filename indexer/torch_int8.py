"""Torch's int8 recipe for a student's queries: every linear layer int8, full-range activations.

torch's dynamic int8 (``quantize_dynamic``) leaves two costs on a query of ~20 tokens:

- The FFN down-projections: a third of the FLOPs. The general recipe (``encoder._int8``) keeps
  them float32, because their inputs, after the GELU, have a few channels far larger than the
  rest, and one scale per activation tensor rounds the others away. On these thin matrices a
  float32 layer costs several times an int8 one.
- Activations: torch's x86 kernels round them to 7 bits (``reduce_range``), which leaves room
  against a saturating 16-bit sum of AVX2's int8 multiply; the other bit is precision.

This recipe smooths the down-projections' inputs first, as ONNX Runtime's ``int8-query`` does
(SmoothQuant, Xiao et al. 2023, :func:`vecplug.indexer.onnx_runtime.smooth_inputs`). Each input
channel is divided by a factor that the weight's column takes on, so the float32 function is
unchanged. The factors come from the activations' peaks on the shipped calibration sentences:
shipped with the student (:data:`PEAKS_FILE`), or computed once per model and cached (safetensors: data, never a pickle).
Then every linear layer is int8, with activations on the full 8 bits. In the README's query
latency run the shipped student's traced int8 encode took 34% less time than with the general
recipe, and on XQuAD-R it kept the same share of fp32's X-Y mAP@20 (README "Student figures").
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vecplug.fsutil import atomic_write_bytes
from vecplug.indexer.onnx_runtime import SMOOTH_ALPHA, smoothing_factors

#: SmoothQuant's migration strength: ONNX Runtime's query recipe's
ALPHA = SMOOTH_ALPHA
#: tokens a calibration sentence is cut at: a query's default limit
CALIBRATION_MAX_LENGTH = 64
#: bump when the peaks' definition changes: cached peaks of another version are recomputed
PEAKS_VERSION = 1
PEAKS_FORMAT = "vecplug int8 peaks"
#: a model folder's own peaks (benchmarks/ship_student.py writes them for a shipped student),
#: used before the cache
PEAKS_FILE = "int8-peaks.safetensors"


def narrowing(model: Any) -> list[str]:
    """Names of the FFN down-projections: the linear layers from another width back to the
    model's hidden size (a student pruned below the hidden size, ``--ffn-width 256``, has its
    up-projections narrowing instead: the width alone would pick those)."""
    import torch

    hidden = int(getattr(model.config, "hidden_size", 0) or 0)
    return [name for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)
            and (m.out_features == hidden and m.in_features != hidden if hidden
                 else m.in_features > m.out_features)]


def activation_peaks(model: Any, batches: Any, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Per input channel, the largest |value| reaching each of the layers ``names`` (default:
    :func:`narrowing`'s) over ``batches`` of (input ids, mask) arrays, real tokens only."""
    import torch

    names = narrowing(model) if names is None else names
    peaks: dict[str, torch.Tensor] = {}
    real: list[torch.Tensor] = []

    def hook(name: str) -> Any:
        def record(module: Any, inputs: tuple[Any, ...], output: Any) -> None:
            peak = (inputs[0].abs() * real[0]).amax(dim=(0, 1))
            peaks[name] = peak if name not in peaks else torch.maximum(peaks[name], peak)
        return record

    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    try:
        with torch.inference_mode():
            for ids, mask in batches:
                real[:] = [torch.from_numpy(mask).unsqueeze(-1).float()]
                model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    finally:
        for handle in handles:
            handle.remove()
    if len(peaks) != len(names):
        raise ValueError("no calibration inputs")
    return {name: peaks[name].numpy() for name in names}


def load_peaks(path: Path) -> dict[str, np.ndarray] | None:
    """Saved peaks, or None (absent, unreadable or of another version)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != PEAKS_FORMAT or meta.get("version") != str(PEAKS_VERSION):
                return None
            return {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, ValueError, SafetensorError):
        return None


def save_peaks(path: Path, peaks: dict[str, np.ndarray]) -> None:
    """``peaks`` as a safetensors file (written whole or not at all)."""
    from safetensors.numpy import save

    path.parent.mkdir(parents=True, exist_ok=True)
    data = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in peaks.items()}
    atomic_write_bytes(path, save(data, metadata={"format": PEAKS_FORMAT, "version": str(PEAKS_VERSION)}))


def model_peaks(info: Any, model: Any, calibrate: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The smoothing peaks for ``model`` (described by ``info``, a ``ModelInfo``): from its
    folder (a shipped student carries them, :data:`PEAKS_FILE`), else :func:`cached_peaks` of
    the ``int8-query`` recipe (``calibrate()``: ~5 s for the shipped student)."""
    names = narrowing(model)
    peaks = load_peaks(info.path / PEAKS_FILE)
    if peaks is not None and set(peaks) == set(names):
        return peaks
    return cached_peaks(info, model, "int8-query", (info.query_prefix,), names, calibrate)


def cached_peaks(info: Any, model: Any, recipe: str, prefixes: Sequence[str], names: Sequence[str],
                 calibrate: Callable[[], dict[str, np.ndarray]], prefix: str = "int8-peaks") -> dict[str, np.ndarray]:
    """Peaks of the layers ``names`` from the cache, else ``calibrate()``, then cached (a
    ``prefix``-named file in ``$VECPLUG_HOME/cache``). Keyed as ONNX Runtime's graph of
    ``recipe`` is: the weights' checksum, the config, the ``prefixes`` and the tokenizer the
    calibration texts are encoded with (a copy under another name may take another prefix)."""
    from vecplug.indexer.models import vecplug_home
    from vecplug.indexer.onnx_runtime import shape_key

    shape = shape_key(model, recipe, tuple(prefixes), info.tokenizer_path)
    path = vecplug_home() / "cache" / f"{prefix}-{info.checksum}-{shape}.safetensors"
    peaks = load_peaks(path)
    if peaks is None or set(peaks) != set(names):
        peaks = calibrate()
        save_peaks(path, peaks)
    return peaks


def int8_query(model: Any, peaks: dict[str, np.ndarray], alpha: float = ALPHA,
               float_layers: Sequence[int] = ()) -> Any:
    """``model`` (changed in place) with its down-projections smoothed by ``peaks`` and every
    linear layer int8 (weights per output channel, activations per tensor on 8 bits), but the
    down-projections of the layers numbered ``float_layers``, which stay float32 (the i-th of
    :func:`narrowing`'s, in the model's order: layer i's)."""
    import torch

    floats = set(float_layers)
    kept = {name for i, name in enumerate(narrowing(model)) if i in floats}
    smooth(model, peaks, alpha)
    with warnings.catch_warnings():
        # torch marks its eager-mode quantisation as deprecated in favour of torchao, which
        # this machine does not have; it still works and is measured in the README
        warnings.simplefilter("ignore")
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        # (smoothing wrapped each down-projection: its linear is now "<name>.linear")
        spec = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and name.removesuffix(".linear") not in kept}
        model = quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
    for name, m in list(model.named_modules()):
        if isinstance(m, DynamicLinear):
            _replace(model, name, _full_range(m))
    return model


def smooth(model: Any, peaks: dict[str, np.ndarray], alpha: float = ALPHA) -> None:
    """SmoothQuant on :func:`narrowing`'s layers, in place: input channel j divided by
    s_j = peak_j^alpha / max|W[:, j]|^(1 - alpha) and the weight's column j multiplied by it, as
    :func:`vecplug.indexer.onnx_runtime.smooth_inputs` does in ONNX. The float32 function is the
    same; the activations' range moves partly into the weights, quantised per output channel."""
    import torch

    for name in narrowing(model):
        linear = model.get_submodule(name)
        w = linear.weight.data  # Linear weights: (out, in)
        s = torch.from_numpy(smoothing_factors(peaks[name], w.abs().amax(dim=0).numpy(), alpha)).to(w.dtype)
        linear.weight.data = w * s[None, :]
        _replace(model, name, _smoothed(1.0 / s, linear))


def _replace(model: Any, name: str, module: Any) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _smoothed(inverse: Any, linear: Any) -> Any:
    """``linear`` on its input divided per channel by the smoothing factors."""
    import torch

    class Smoothed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("inverse", inverse)
            self.linear = linear

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x * self.inverse)

    return Smoothed()


def _full_range(dynamic: Any) -> Any:
    """A dynamic int8 linear layer whose activations are quantised on 8 bits, not torch's 7.
    Its input is made float32 (the kernels take nothing else; a bfloat16 model's activations
    are cast) and its output given back in the input's type."""
    import torch

    class FullRange(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dynamic = dynamic

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            packed = self.dynamic._packed_params._packed_params
            # the cast only where needed: a float32 model's traced graph records no extra step
            x32 = x if x.dtype == torch.float32 else x.float()
            return torch.ops.quantized.linear_dynamic(x32, packed, reduce_range=False).to(x.dtype)

    return FullRange()
