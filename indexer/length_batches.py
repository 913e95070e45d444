"""Which texts share a forward pass when encoding: length-sorted batches cut where padding costs least.

A batch is padded to its longest text, so texts of similar length should share one. Sorting by
length and filling each batch up to the token budget (what the encoder did first) still pads a
lot when a call holds few texts: 256 texts make two batches of 128, each spanning half the
call's lengths. Cutting more batches pads less, but every forward pass has a fixed cost too.
:func:`plan` chooses the cuts that minimise a simple cost over the sorted lengths, exactly (a
dynamic programme, linear in the number of texts times the largest batch):

    cost(batch) = rows * longest * (1 + longest / (6 * hidden)) + overhead

``rows * longest`` is the padded tokens, whose linear layers cost the same per token;
``longest / (6 * hidden)`` is attention's share beside them (a layer's linear layers take
``24 * hidden^2`` FLOPs a token with a 4x feed-forward, attention ``4 * length * hidden``);
``overhead`` is a forward pass's fixed cost in padded tokens (:data:`FORWARD_OVERHEAD`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: a forward pass's fixed cost counted in padded tokens, by the precision the model computes
#: in: dispatch of a dozen layers' operations and the efficiency small matrix multiplies lose.
#: The same fixed time is more tokens where a token costs less (bfloat16 on AMX). Measured with
#: me5-small on XQuAD-R sentences by ``benchmarks/batch_plan.py`` (README "Speed", results
#: ``batch_plan*.md``): of 256, 512 and 1,024, float32 ran fastest with 256 at every call size,
#: bfloat16 with 512 or 1,024 (within 3% of each other); float32's 64, 128 and 256 were within
#: 6% of each other (64 ahead on small calls): int8 and ONNX Runtime, cheaper per token, take
#: float32's value too, so it stays at the larger end
FORWARD_OVERHEAD = {"float32": 256, "bfloat16": 512}


def plan(lengths: Sequence[int], batch_tokens: int, max_rows: int, hidden: int = 384,
         overhead: int = FORWARD_OVERHEAD["float32"]) -> list[list[int]]:
    """Positions of ``lengths`` in batches, longest first: each batch at most ``max_rows``
    texts and ``batch_tokens`` padded tokens (a text longer than that is a batch alone), the
    cuts those that minimise the module's cost."""
    n = len(lengths)
    if n <= 1:  # a query: one batch, without the programme's few microseconds of numpy
        return [list(range(n))] if n else []
    order = sorted(range(n), key=lambda i: lengths[i], reverse=True)
    sorted_lengths = np.array([max(1, lengths[i]) for i in order], dtype=np.float64)
    best = np.zeros(n + 1)  # best[j]: least cost of the texts from sorted position j on
    size_at = np.ones(n, dtype=np.int64)
    for j in range(n - 1, -1, -1):
        longest = sorted_lengths[j]  # sorted longest first: the batch's first text is its longest
        cap = int(max(1, min(max_rows, batch_tokens // longest, n - j)))
        per_row = longest * (1.0 + longest / (6.0 * hidden))
        costs = np.arange(1, cap + 1) * per_row + overhead + best[j + 1:j + cap + 1]
        # among equal costs (floating-point equal) the biggest batch: equal lengths fill whole batches
        k = int(np.flatnonzero(costs <= costs.min() * (1 + 1e-9))[-1])
        best[j], size_at[j] = costs[k], k + 1
    batches, j = [], 0
    while j < n:
        batches.append(order[j:j + int(size_at[j])])
        j += int(size_at[j])
    return batches
