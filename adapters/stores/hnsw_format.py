"""A structural check of hnswlib's index file, done in Python before hnswlib reads it.

hnswlib trusts its file: a damaged one can crash the process, a file saved for another
dimension loads as garbage, and ``save_index`` does not notice a failed write (a full disk
leaves a short file and no error). Walking the layout catches all three: the header must
describe this dimension, and the element records must add up to the file's exact size.

Layout (hnswlib 0.8 ``saveIndex``): a 96-byte header, ``count`` level-0 records of
``size_data_per_element`` bytes each, then per element a ``uint32`` byte length followed by
that many bytes of upper-level links.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

_HEADER = struct.Struct("<QQQQQQiIQQQdQ")
_U32 = struct.Struct("<I")


def check_graph_file(path: Path, dim: int) -> str | None:
    """What is wrong with the graph file at ``path`` for vectors of ``dim`` floats; None if nothing."""
    size = path.stat().st_size
    if size < _HEADER.size:
        return f"{path.name} is truncated ({size} bytes)"
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        (offset_level0, max_elements, count, per_element, label_offset, offset_data,
         max_level, _entry, max_m, max_m0, m, _mult, _ef) = _HEADER.unpack_from(mm, 0)
        links0 = max_m0 * 4 + 4
        if (offset_level0 != 0 or count > max_elements or offset_data != links0
                or label_offset != links0 + 4 * dim or per_element != label_offset + 8
                or max_m0 != 2 * m or max_m != m or max_level < (-1 if count == 0 else 0)):
            # an empty graph (every vector deleted, then compacted) is saved with level -1
            return f"{path.name} has a header that does not describe a {dim}-d hnswlib index"
        pos = _HEADER.size + count * per_element
        link_bytes = max_m * 4 + 4
        for _ in range(count):
            if pos + 4 > size:
                return f"{path.name} is truncated"
            (n,) = _U32.unpack_from(mm, pos)
            if n % link_bytes or n > link_bytes * (max_level + 1):
                return f"{path.name} has a damaged link list at byte {pos}"
            pos += 4 + n
        if pos != size:
            return f"{path.name} has {size} bytes, its layout says {pos}"
    return None
