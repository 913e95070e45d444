"""The float precision a torch encoder computes in: float32, or bfloat16 on CPUs made for it.

On a CPU with AMX (Intel's matrix units, Xeon of the Sapphire Rapids generation and later)
a bfloat16 matrix multiply runs several times faster than a float32 one, and me5-small's
vectors in bfloat16 agree with float32's to a cosine of 0.99998 on average (README "Speed",
``benchmarks/precision_probe.py``: 3.4x the documents' throughput, 99.9-100.3% of float32's
XQuAD-R figures). Without AMX the same kernels are emulated: 0.78x float32 with AVX-512 BF16
(AMD Zen 4, Cooper Lake), 0.31x with AVX-512 alone, 0.12x with AVX2 (measured by limiting
oneDNN's instruction set on the AMX machine). So ``auto`` takes bfloat16 only where
AMX is, and the choice is not bound to an index: vectors of either precision rank alike.

Only a model's float layers change: the vocabulary table (the embedding lookup, shared
between a teacher and its student) stays float32, and its output is cast as it leaves.
"""
from __future__ import annotations

import functools
import os
import platform
from typing import Any

#: ``model.precision`` values: ``auto`` resolves to one of the other two
PRECISIONS = ("auto", "float32", "bfloat16")


def amx_bf16() -> bool:
    """Whether this CPU has AMX bfloat16 units that torch (oneDNN) may use.

    Read from Linux's CPU flags; other systems answer False (bfloat16 is then chosen by hand).
    ``ONEDNN_MAX_CPU_ISA`` set below AMX (oneDNN's own switch, e.g. ``AVX512_CORE``) means oneDNN
    will not use it, so neither does ``auto``."""
    return _amx_flag("amx_bf16")


def amx_int8() -> bool:
    """Whether this CPU has AMX int8 units that oneDNN may use (as :func:`amx_bf16`): where
    torch's int8 documents take oneDNN's kernels (``indexer.torch_int8_documents``)."""
    return _amx_flag("amx_int8")


def bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AMX, or AVX-512 BF16 as on AMD
    Zen 4): where the flat store's batch scan multiplies in bfloat16 (the bare scan of 1,000 queries
    1.9x float32's speed on a Zen 4 machine, 3.7x with AMX: benchmarks/results/
    exact_batch_synthetic.md, exact_batch_debian.md), as :func:`amx_bf16` reads it
    (``ONEDNN_MAX_CPU_ISA`` below both, e.g. ``AVX2``, means no)."""
    return _amx_flag("amx_bf16") or (_onednn_allows("BF16", "AMX") and _cpu_flag("avx512_bf16"))


def _amx_flag(flag: str) -> bool:
    return _onednn_allows("AMX") and _cpu_flag(flag)


def _onednn_allows(*names: str) -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` (oneDNN's own cap, e.g. ``AVX512_CORE_BF16``) leaves it
    the instructions whose ISA names hold one of ``names`` (unset, ``ALL``, ``DEFAULT``: all)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return not isa or isa in ("ALL", "DEFAULT") or any(name in isa for name in names)


@functools.lru_cache(maxsize=None)
def _cpu_flag(flag: str) -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return flag in line.split()
    except OSError:
        pass
    return False


def resolve_precision(setting: str | None, runtime: str = "torch") -> str:
    """``float32`` or ``bfloat16`` for ``model.precision`` (None: ``auto``). ONNX Runtime runs
    its own graphs (float32 or int8), so there the answer is float32 whatever the setting."""
    if setting not in (None, *PRECISIONS):
        from vecplug.errors import ConfigError

        raise ConfigError(f"unknown precision '{setting}'; known: {', '.join(PRECISIONS)}")
    if runtime != "torch":
        return "float32"
    if setting in (None, "auto"):
        return "bfloat16" if amx_bf16() else "float32"
    return setting


def to_bfloat16(model: Any) -> Any:
    """``model`` with its float weights and buffers in bfloat16, in place, except the input
    embedding table, which stays as it is (float32, possibly shared with another model: its
    Parameter object is never converted) and whose lookups are cast to bfloat16."""
    import torch

    table = model.get_input_embeddings()
    kept = {id(p) for p in table.parameters()}
    for module in model.modules():
        if module is table:
            continue
        for p in module.parameters(recurse=False):
            if p.is_floating_point() and id(p) not in kept:
                p.data = p.data.to(torch.bfloat16)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_floating_point():
                module.register_buffer(name, b.to(torch.bfloat16),
                                       persistent=name not in module._non_persistent_buffers_set)
    # a hook on this model's own lookup module (a teacher and its student share the weight,
    # never the module): the embeddings' sum and layer norm then run in bfloat16 like the rest
    table.register_forward_hook(lambda _module, _inputs, out: out.to(torch.bfloat16))
    return model
