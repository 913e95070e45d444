"""Exact top ``k`` of many queries at once: one scan of the vectors for the whole batch.

A batch of queries multiplied by every stored vector is one matrix product, which a CPU's
matrix units (Intel AMX; AVX-512 BF16 on AMD Zen 4) run several times faster in bfloat16 than
in float32. What is left is finding each query's best columns in the product without reading
all of it twice. :func:`scan`:

1. each query's floor starts just below the ``k``-th best score among the first columns;
2. per step of columns, ``queries @ rows.T`` in bfloat16, less a shift just under each query's
   floor, subtracted inside the product before its rounding to bfloat16 (``addmm``): the scores
   that matter are then near zero, where bfloat16 is fine-grained (6e-5 apart instead of 0.004
   near a cosine of 0.9), and the floor is a small positive number, so a row's entries compare
   as int16 (which orders bfloat16 numbers above zero as the numbers do): one int16 maximum per
   query and step says whether the step holds anything above the floor;
3. for the queries whose step does, every column above the floor is a candidate, and the floor
   rises to just under the new ``k``-th best;
4. the candidates above the final floors are rescored exactly in float32 and each query's best
   ``k`` returned.

The floor is the ``k``-th best approximate score less a slack: twice the most an approximate
score can differ from the float32 one (the ``k``-th best is approximate too). A true top-``k``
row is never missed when the slack bounds that error; :func:`error_bound` gives a bound that
holds for every row of an index (no statistics: the rounding of each stored vector is known).
In float32 the scan is exact as it goes (the slack covers only the product's order of sums).
"""
from __future__ import annotations

import functools
from typing import Any

#: columns a step multiplies (at least): 1,000 queries x 4,096 columns of bfloat16 scores is 8
#: MB, and the product ran fastest per column at 4,096 on the Sapphire Rapids machine of
#: benchmarks/results/exact_batch_debian.md (1,024-16,384 tried)
CHUNK = 4096
#: scores a step computes when the batch is smaller (a step's fixed cost, ~0.4 ms, is spread over
#: more columns): one query reads a million columns in one step
STEP_SCORES = 4_096_000
#: the most float32 rows a step converts to bfloat16 (each step's copy: 12 MB of 384-d rows):
#: a batch of one would otherwise convert the whole index at once
CONVERT_ROWS = 16_384
#: the fewest queries a scan of float32 rows converts to bfloat16 for: below, the product is
#: bound by reading the rows, and converting them costs more than multiplying them in float32
#: (``benchmarks/exact_batch.py --store`` at commit b460df9, which converted for every batch,
#: a million rows on a Zen 4 machine, one thread: 10 queries 77 ms a query against 32 in float32,
#: 100 queries 7.3 against 12.1, one query 0.97 s against 0.15)
BF16_MIN_QUERIES = 64
#: candidates rescored at a time: a step gathers their rows and their queries in float32 and
#: multiplies them, three arrays of 6 MB at 384-d (32,768 a step made 150 MB of a batch's peak
#: memory at a million vectors, for no measurable speed)
RESCORE = 4096
#: bfloat16's unit roundoff (8 significant bits): a rounded number is within 2^-8 of the number,
#: relatively
BF16_U = 2.0 ** -8
#: float32's
F32_U = 2.0 ** -24


def split(rows: Any) -> tuple[Any, Any]:
    """(hi, lo): bfloat16 halves of float32 ``rows`` whose sum is ``rows`` within ~2^-16
    relatively (``hi`` the rows rounded to bfloat16, ``lo`` what that left, rounded)."""
    import torch

    x = torch.as_tensor(rows)
    hi = x.to(torch.bfloat16)
    return hi, (x - hi.float()).to(torch.bfloat16)


def error_bound(queries: Any, row_norm: float, residual_norm: float) -> Any:
    """For each query, the most ``bfloat16(q) . bfloat16(x)`` accumulated in float32 can differ
    from ``q . x`` for any stored ``x`` with ``|x| <= row_norm`` and ``|x - bfloat16(x)| <=
    residual_norm``: ``q.x - q~.x~ = q.(x - x~) + (q - q~).x~``, each term bounded by
    Cauchy-Schwarz with the norms of what the rounding left (known exactly: no statistics), plus
    float32's accumulation of ``dim`` products (Higham's gamma_dim)."""
    import torch

    q = queries.float()
    q_norm = q.norm(dim=1)
    q_residual = (q - q.to(torch.bfloat16).float()).norm(dim=1)
    hi_norm = row_norm * (1 + BF16_U)
    accumulation = 1.01 * q.shape[1] * F32_U * (q_norm * (1 + BF16_U)) * hi_norm
    return q_norm * residual_norm + q_residual * hi_norm + accumulation


def accumulation_bound(queries: Any, row_norm: float) -> Any:
    """For each query, the most a float32 product with a stored row of norm at most
    ``row_norm`` can differ from the rescoring's (float32 sums in another order): Higham's
    gamma_dim of the two norms, twice over."""
    return 2.02 * queries.shape[1] * F32_U * queries.float().norm(dim=1) * row_norm


@functools.lru_cache(maxsize=8)
def bias_inside_product(single: bool, dim: int) -> bool:
    """Whether this torch adds ``addmm``'s bias to a bfloat16 product before rounding it to
    bfloat16 (oneDNN's kernels do: the scan's fine-grained floors rely on it), for one query
    (``single``) or many against ``dim``-wide rows. A kernel that rounds first makes the
    near-floor scores as coarse as the scores: the scan then runs in float32. Checked once per
    process and shape class, on numbers where the two orders differ: ``1 + 2^-7 + 2^-12 - 1``
    is exact in bfloat16 only when the product is not rounded before the shift."""
    import torch

    if dim < 2:
        return False
    q = torch.zeros(1 if single else 64, dim, dtype=torch.bfloat16)
    q[:, :2] = 1.0
    x = torch.zeros(CHUNK, dim, dtype=torch.bfloat16)
    x[:, 0] = 1.0 + 2.0 ** -7
    x[:, 1] = 2.0 ** -12
    shift = torch.ones(len(q), 1, dtype=torch.bfloat16)
    return bool((torch.addmm(-shift, q, x.T).float() == 2.0 ** -7 + 2.0 ** -12).all())


def _ulp(x: Any) -> Any:
    """A bfloat16 unit in the last place at ``|x|``: 2^(exponent - 7)."""
    import torch

    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)


def padded(rows: Any, values: Any, groups: int, fill: float, width: int = 1) -> tuple[Any, Any]:
    """``values`` grouped by ``rows`` (sorted, in ``range(groups)``) as the rows of a table at
    least ``width`` wide, padded with ``fill``: (table, each value's column in it)."""
    import torch

    counts = torch.bincount(rows, minlength=groups)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(rows)) - starts[rows]
    table = torch.full((groups, max(width, int(counts.max()) if len(rows) else 0)), fill, dtype=values.dtype)
    table[rows, slot] = values
    return table, slot


def scan(queries: Any, rows: Any, k: int, *, lo: Any | None = None, bfloat16: bool = False,
         slack: Any = 0.0, chunk: int | None = None, count: int | None = None,
         select: Any | None = None, offset: Any | None = None,
         scale: Any | None = None, group: Any | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Exact top ``k`` of every row of ``queries`` (a float32 tensor) among the first ``count``
    (default: all) of ``rows``, or among the rows ``select`` (an int64 tensor of row numbers:
    gathered a step at a time, no copy of them all): (ids ``(B, k)``: row numbers of ``rows``,
    float32 scores best first, counts). Ids ``-1`` / ``-inf`` pad a query's answer when there
    are fewer than ``k`` rows.

    ``rows`` float32: scanned in float32, or with ``bfloat16`` converted a step at a time and
    multiplied in bfloat16 (candidates are rescored from the float32 rows). ``rows`` bfloat16:
    ``hi`` of :func:`split`, with ``lo`` for the rescoring. ``slack`` (a number or one per query):
    the most an approximate product may be off: :func:`error_bound` for bfloat16,
    :func:`accumulation_bound` for float32 (module docstring). Counts:
    candidates per query, the share of (query, step) pairs read further.

    With ``offset`` (one per query) and ``scale`` (one positive number per row scanned, in the
    order scanned: ``select``'s, or the rows'), the score ranked is ``(q . x - offset) * scale``
    instead of ``q . x`` (the language-bias correction's centred cosine of a language's rows:
    ``q.(x - m) / |x - m|``). A step's floor is then taken at the step's loosest scale, so the
    scan is exact still, and reads little more when the rows come in order of their scale.
    With ``group`` too (one int per row scanned, in the order scanned), ``offset`` has a column
    per group (``(B, groups)``) and a row's score takes its group's: ``(q . x - offset[q,
    group]) * scale``; a row of group -1 is not ranked. (Several languages' rows scanned in one
    pass, each by centred cosine with its own mean: the floors are then taken at a query's
    lowest offset, still exact.)"""
    import torch

    approximate = rows.dtype == torch.bfloat16 or bfloat16
    if approximate and not bias_inside_product(len(queries) == 1, queries.shape[1]):
        if rows.dtype == torch.bfloat16:
            raise RuntimeError("this torch rounds a bfloat16 product before adding addmm's bias: "
                               "scan float32 rows instead")
        approximate = False
    if select is not None and count is not None:
        raise ValueError("scan reads the first count rows or the rows selected, not both")
    if select is not None:
        n = len(select)
    else:
        n = len(rows) if count is None else count
    B = len(queries)
    if k <= 0 or B == 0:
        return (torch.empty((B, 0), dtype=torch.int64), torch.empty((B, 0)), {"candidates": 0.0, "read_share": 0.0})
    # the most an approximate product (before its rounding to bfloat16) is off
    error = torch.as_tensor(slack, dtype=torch.float32).expand(B)
    group = None if group is None else torch.as_tensor(group, dtype=torch.int64)
    shifts = None  # with groups: each query's offset per group
    if group is None:
        shift_by = torch.zeros(B) if offset is None else torch.as_tensor(offset, dtype=torch.float32).reshape(B)
    else:
        if offset is None or len(group) != n:
            raise ValueError(f"scan got {len(group)} groups for {n} rows" if offset is not None
                             else "scan's groups need an offset per query and group")
        shifts = torch.as_tensor(offset, dtype=torch.float32).reshape(B, -1)
        # a floor holds for every group at the lowest of a query's offsets (a product must
        # reach shift + limit / scale to score the limit: the lowest shift asks the least)
        shift_by = shifts.min(dim=1).values
        # a row of no group (-1) reads group 0's offset, and is dropped by ``bounds``
        ranked, group = group >= 0, group.clamp_min(0)
    scale = None if scale is None else torch.as_tensor(scale, dtype=torch.float32)
    if scale is not None and len(scale) != n:
        raise ValueError(f"scan got {len(scale)} scales for {n} rows")
    # fewer queries, longer steps: the same scores a step, fewer steps (each has a fixed cost)
    chunk = chunk or max(CHUNK, STEP_SCORES // B)
    if (approximate and rows.dtype != torch.bfloat16) or select is not None:
        chunk = min(chunk, CONVERT_ROWS)  # (a step's copy: converted or gathered rows)
    q = queries.to(torch.bfloat16) if approximate else queries.float()

    # selected rows are gathered into one buffer, step after step: a new array a step left
    # freed memory that the C heap kept, which a batch's peak counted (the flat store's
    # ``_centring`` has the figures)
    gathered = None

    def block(a: int) -> Any:
        """Rows ``a`` to ``a + chunk`` (of ``select``) as multiplied; valid until the next call."""
        nonlocal gathered
        if select is None:
            part = rows[a:min(a + chunk, n)]
        else:
            wanted = select[a:min(a + chunk, n)]
            if gathered is None:
                gathered = torch.empty((min(chunk, n), rows.shape[1]), dtype=rows.dtype)
            part = torch.index_select(rows, 0, wanted, out=gathered[:len(wanted)])
        return part.to(torch.bfloat16) if approximate else part.float()

    def bounds(products: Any, margin: Any, at: Any, cols: Any) -> tuple[Any, Any]:
        """Lower and upper bounds of the scores of queries ``at`` and columns ``cols`` (row
        numbers in the order scanned) whose products came out as ``products``, ``margin`` the
        most their rounding to bfloat16 moved them."""
        shift = shift_by[at] if shifts is None else shifts[at, group[cols]]
        low = products - margin - error[at] - shift
        high = products + margin + error[at] - shift
        if scale is not None:
            low, high = low * scale[cols], high * scale[cols]
        if shifts is not None:  # rows of no group: below every floor
            out = ~ranked[cols]
            low, high = low.masked_fill(out, -torch.inf), high.masked_fill(out, -torch.inf)
        return low, high

    # each query's best k lower bounds of scores so far: the k-th is a lower bound of its k-th
    # best score, and a row whose upper bound falls below it is no candidate
    best = torch.full((B, k), -torch.inf)
    # a floor from the start: the k-th best of the first columns (a lower bound of the final
    # one); otherwise the first step would admit all its columns as candidates (1,000 queries x
    # 4,096: ~200 MB of them)
    start = torch.full((B,), -torch.inf)
    if n >= k:
        first = (q @ block(0)[:CHUNK].T).float()
        if first.shape[1] >= k:
            # a bfloat16 product's rounding (2^-8 relatively) taken off: a lower bound still
            width = first.shape[1]
            low, _ = bounds(first, 2 * BF16_U * first.abs() if approximate else 0.0,
                            torch.arange(B)[:, None], torch.arange(width)[None, :])
            start = low.topk(k, dim=1).values[:, -1]
            del low
        del first
    rows_found, cols_found, values_found = [], [], []
    read = 0
    for a in range(0, n, chunk):
        X = block(a)
        limit_score = torch.maximum(best[:, -1], start)
        # the same floor as a product: a column can hold a score above it only if its product
        # is at least ``floor`` (at the step's loosest scale: its largest for a positive floor)
        if scale is None:
            floor = shift_by - error + limit_score
        else:
            part = scale[a:a + len(X)]
            reach = limit_score / torch.where(limit_score >= 0, part.max(), part.min())
            # 0 / 0: a limit of 0 and a step whose rows all have scale 0 (rows at their mean,
            # ``centring.MIN_DISTANCE``), each scoring 0: every one of them can tie the limit
            floor = shift_by - error + torch.nan_to_num(reach, nan=-torch.inf)
        if approximate and bool(torch.isfinite(floor).all()):
            # the product less a shift just below each query's floor, added inside the product
            # (before its rounding to bfloat16): the scores that matter are then near zero,
            # where bfloat16 is fine-grained, and the floor is a small positive number, so the
            # rows compare as int16 (which orders bfloat16 numbers above zero as the numbers do;
            # rounding is monotonic, so a score at or above the limit stays there)
            shift = (floor - _ulp(floor)).to(torch.bfloat16)
            S = torch.addmm(-shift[:, None], q, X.T)
            gap = floor - shift.float()
            limit = (gap - _ulp(gap)).clamp_min(0).to(torch.bfloat16)
        else:
            shift = None
            S = q @ X.T
            limit = floor.to(S.dtype)
            if shifts is not None:  # (a floor of -inf must not admit the rows masked out below)
                limit = limit.clamp_min(torch.finfo(S.dtype).min)
        if shifts is not None:
            out = ~ranked[a:a + len(X)]
            if bool(out.any()):
                # rows of no group are never candidates, whatever the floor: until a query has
                # seen k ranked rows its floor is -inf, which would admit every row of a step
                # (a language asked whose rows come late in the index: B x chunk candidates)
                S.masked_fill_(out[None, :], -torch.inf)
        if shift is None:
            hit = (S.amax(1) >= limit).nonzero().squeeze(1)
        else:
            hit = (S.view(torch.int16).amax(1) >= limit.view(torch.int16)).nonzero().squeeze(1)
        if not len(hit):
            continue
        read += len(hit)
        sub = S.index_select(0, hit)  # (much faster than S[hit] here)
        if shift is None:
            r, c = (sub >= limit[hit, None]).nonzero(as_tuple=True)
            values = sub[r, c].float()
            # (a bfloat16 product here is one before any floor: rounded as a whole)
            margin: Any = 2 * BF16_U * values.abs() if approximate else 0.0
        else:
            r, c = (sub.view(torch.int16) >= limit[hit, None].view(torch.int16)).nonzero(as_tuple=True)
            shifted = sub[r, c].float()
            values = shifted + shift[hit[r]].float()
            # the product rounded to bfloat16 after the shift: within 2^-8 of it, relatively
            margin = 2 * BF16_U * shifted.abs()
        low, high = bounds(values, margin, hit[r], c + a)
        # the step's candidates join each query's running best k lower bounds
        table, _ = padded(r, low, len(hit), -torch.inf)
        best[hit] = torch.cat([best[hit], table], 1).topk(k, dim=1).values
        # what the raised floor no longer admits goes now
        keep = high >= torch.maximum(best[hit, -1], start[hit])[r]
        rows_found.append(hit[r[keep]])
        cols_found.append(c[keep] + a)
        values_found.append(high[keep])
    if not rows_found:
        return (torch.full((B, k), -1, dtype=torch.int64), torch.full((B, k), -torch.inf),
                {"candidates": 0.0, "read_share": 0.0})
    found, cols, values = torch.cat(rows_found), torch.cat(cols_found), torch.cat(values_found)
    # the final thresholds: what an earlier, lower one let in goes
    keep = values >= torch.maximum(best[:, -1], start)[found]
    found, cols = found[keep], cols[keep]
    order = torch.argsort(found, stable=True)  # query by query
    found, cols = found[order], cols[order]
    scales = None if scale is None else scale[cols]
    offsets = shift_by[found] if shifts is None else shifts[found, group[cols]]
    if select is not None:
        cols = select[cols]
    exact = torch.cat([(queries[found[i:i + RESCORE]].float() * _rows(rows, lo, cols[i:i + RESCORE])).sum(1)
                       for i in range(0, len(found), RESCORE)]) if len(found) else torch.empty(0)
    exact = exact - offsets
    if scales is not None:
        exact = exact * scales
    table, slot = padded(found, exact, B, -torch.inf, width=k)
    ids = torch.full(table.shape, -1, dtype=torch.int64)
    ids[found, slot] = cols
    top_s, top_j = table.topk(k, dim=1)
    stats = {"candidates": len(found) / B, "read_share": read / (B * -(-n // chunk))}
    return torch.gather(ids, 1, top_j), top_s, stats


def _rows(rows: Any, lo: Any | None, cols: Any) -> Any:
    """Rows ``cols`` as float32 (``hi + lo`` of bfloat16 halves, or the rows themselves)."""
    return rows[cols].float() if lo is None else rows[cols].float() + lo[cols].float()
