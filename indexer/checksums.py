"""Checksums of model files.

A model's identity is the content of its tensors, not the bytes of the file that holds them:
two builds of me5-small on different machines (or with another safetensors version that
lays out the header differently) must agree, or a shipped student would refuse its teacher.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import struct
from pathlib import Path

from vecplug.errors import CorruptIndexError
from vecplug.fsutil import file_sha256

__all__ = ["file_sha256", "weights_sha256"]


def weights_sha256(path: Path) -> str:
    """SHA-256 over a safetensors file's tensors: name, dtype, shape and raw bytes, in name
    order (the header's metadata and layout do not count). Other files: their bytes."""
    if path.suffix != ".safetensors":
        return file_sha256(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        try:
            (n,) = struct.unpack("<Q", mm[:8])
            header = json.loads(mm[8:8 + n])
        except (struct.error, ValueError) as exc:
            raise CorruptIndexError(f"{path} is not a safetensors file: {exc}") from exc
        base = 8 + n
        h = hashlib.sha256()
        for name in sorted(k for k in header if k != "__metadata__"):
            info = header[name]
            start, end = info["data_offsets"]
            h.update(json.dumps([name, info["dtype"], info["shape"]]).encode())
            h.update(mm[base + start:base + end])
        return h.hexdigest()
