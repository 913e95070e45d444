"""The flat store (exact search; batches answered by one scan) and its scan (stores/scan.py).

The store battery (test_stores.py, conftest's ``target``) runs over the flat store too; these
are what only it does."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import FakeEncoder, crowded_vectors, exact_top_k, unit_vectors

DIM = 48


def _bounds(Q: Any, X: Any) -> tuple[Any, Any]:
    from vecplug.adapters.stores import scan
    from vecplug.adapters.stores.flat_index import residual_norms

    norm, residual = residual_norms(X.numpy())
    return scan.error_bound(Q, norm, residual), scan.accumulation_bound(Q, norm)


# -- the scan -----------------------------------------------------------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_scan_finds_the_exact_top_k_with_its_bound(sign: float) -> None:
    import torch

    from vecplug.adapters.stores import scan

    base, queries = crowded_vectors(9_000, 64, seed=3, sign=sign)
    ids, scores = exact_top_k(base, queries, 10)
    every = queries.astype(np.float64) @ base.T.astype(np.float64)
    gaps = scores[:, 9] - np.sort(every, axis=1)[:, -11]
    assert np.median(gaps) < 2e-3  # crowded: a bfloat16 product could not order them
    Q, X = torch.from_numpy(queries), torch.from_numpy(base)
    bf16_slack, f32_slack = _bounds(Q, X)
    hi, lo = scan.split(X)
    for rows, kw in [(X, {"bfloat16": True, "slack": bf16_slack}), (X, {"slack": f32_slack}),
                     (hi, {"lo": lo, "slack": bf16_slack})]:
        for chunk in (4096, 1000, None):  # the last step partial; many steps, with raised floors
            found, found_scores, stats = scan.scan(Q, rows, 10, chunk=chunk, **kw)
            assert [set(r) for r in found.numpy()] == [set(r) for r in ids]
            # scored exactly (float32; hi + lo within ~2^-16), best first
            assert np.abs(found_scores.numpy() - scores).max() < 1e-5
            assert (np.diff(found_scores.numpy(), axis=1) <= 0).all()
            assert 10 <= stats["candidates"] < 400 and 0 < stats["read_share"] <= 1


def test_the_scan_of_selected_rows_finds_their_exact_top_k() -> None:
    """``select``: the rows given (in any order), gathered a step at a time; ids are row
    numbers of the whole matrix, and a row not selected is never returned."""
    import torch

    from vecplug.adapters.stores import scan

    base, queries = crowded_vectors(9_000, 64, seed=4)
    select = np.random.default_rng(0).permutation(9_000)[:5_000]
    ids, scores = exact_top_k(base[select], queries, 10)
    Q, X = torch.from_numpy(queries), torch.from_numpy(base)
    bf16_slack, f32_slack = _bounds(Q, X)
    for kw in ({"bfloat16": True, "slack": bf16_slack}, {"slack": f32_slack}):
        for chunk in (1000, None):
            found, found_scores, _ = scan.scan(Q, X, 10, chunk=chunk, select=torch.from_numpy(select), **kw)
            assert [set(r) for r in found.numpy()] == [set(r) for r in select[ids]]
            assert np.abs(found_scores.numpy() - scores).max() < 1e-5
    with pytest.raises(ValueError):
        scan.scan(Q, X, 10, count=5, select=torch.from_numpy(select))


@pytest.mark.parametrize("lower", [0.0, 1.0])
def test_the_scan_with_offset_and_scale_finds_the_exact_top_k(lower: float) -> None:
    """Scores ``(q.x - offset) * scale`` (a language's centred cosines: ``scale`` 1/|x - m|,
    ``offset`` q.m; ``lower`` added to the offset makes every score negative) ranked exactly,
    the rows in order of their scale or in any order, in bfloat16 and float32; ranking by
    ``q.x`` alone would not do (the scales reorder the rows)."""
    import torch

    from vecplug.adapters.stores import scan

    base, queries = crowded_vectors(9_000, 64, seed=5)
    rng = np.random.default_rng(5)
    mean = base[:500].mean(0) + 0.02 * rng.standard_normal(64).astype(np.float32)
    norms = np.linalg.norm(base - mean, axis=1)
    queries = queries - mean
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    every = (queries.astype(np.float64) @ (base - mean).T - lower) / norms
    ids = np.argsort(-every, axis=1, kind="stable")[:, :10]
    scores = np.take_along_axis(every, ids, 1)
    assert (scores < 0).all() if lower else (scores > 0).all()
    plain, _ = exact_top_k(base, queries, 20)
    assert np.mean([len(set(a) & set(b)) for a, b in zip(ids, plain)]) < 8  # reordered
    Q, X = torch.from_numpy(queries), torch.from_numpy(base)
    offset = Q @ torch.from_numpy(mean) + lower
    bf16_slack, f32_slack = _bounds(Q, X)
    for order in (np.argsort(norms), rng.permutation(9_000)):
        scale = torch.from_numpy((1 / norms[order]).astype(np.float32))
        for kw in ({"bfloat16": True, "slack": bf16_slack}, {"slack": f32_slack}):
            for chunk in (1000, None):
                found, found_scores, _ = scan.scan(Q, X, 10, chunk=chunk, select=torch.from_numpy(order),
                                                   offset=offset, scale=scale, **kw)
                assert [set(r) for r in found.numpy()] == [set(r) for r in ids]
                assert np.abs(found_scores.numpy() - scores).max() < 1e-5
    with pytest.raises(ValueError):
        scan.scan(Q, X, 10, offset=offset, scale=scale[:5])


@pytest.mark.parametrize("lower", [0.0, 1.0])
def test_the_scan_with_groups_ranks_each_row_by_its_group_s_offset(lower: float) -> None:
    """Rows of three groups (languages), each scored ``(q.x - offset[q, group]) * scale``
    (centred cosine with its own language's mean) and one group of rows not ranked (-1),
    all in one pass: the exact top 10 over the ranked rows, in bfloat16 and float32; fewer
    ranked rows than k: those only, padded."""
    import torch

    from vecplug.adapters.stores import scan

    base, queries = crowded_vectors(9_000, 64, seed=6)
    rng = np.random.default_rng(6)
    group = np.arange(9_000) % 4 - 1  # -1, 0, 1, 2 in turn
    means = base[:600].mean(0) + 0.05 * rng.standard_normal((3, 64)).astype(np.float32)
    norms = np.linalg.norm(base - means[group.clip(0)], axis=1)
    offsets = queries.astype(np.float64) @ means.T.astype(np.float64) + lower  # (queries, groups)
    every = (queries.astype(np.float64) @ base.T - offsets[:, group.clip(0)]) / norms
    every[:, group < 0] = -np.inf
    ids = np.argsort(-every, axis=1, kind="stable")[:, :10]
    scores = np.take_along_axis(every, ids, 1)
    assert (scores < 0).all() if lower else (scores > 0).all()
    one_mean = (queries.astype(np.float64) @ base.T - offsets[:, :1]) / norms  # group 0's offset for all
    one_mean[:, group < 0] = -np.inf
    assert np.mean([len(set(a) & set(b)) for a, b in
                    zip(ids, np.argsort(-one_mean, axis=1)[:, :10])]) < 9  # the groups' offsets matter
    Q, X = torch.from_numpy(queries), torch.from_numpy(base)
    scale = torch.from_numpy((1 / norms).astype(np.float32))
    offset = torch.from_numpy(offsets.astype(np.float32))
    bf16_slack, f32_slack = _bounds(Q, X)
    for kw in ({"bfloat16": True, "slack": bf16_slack}, {"slack": f32_slack}):
        for chunk in (1000, None):
            found, found_scores, _ = scan.scan(Q, X, 10, chunk=chunk, offset=offset, scale=scale,
                                               group=torch.from_numpy(group), **kw)
            assert [set(r) for r in found.numpy()] == [set(r) for r in ids]
            assert np.abs(found_scores.numpy() - scores).max() < 1e-5
    # three rows ranked of 9,000: those three, best first, then padding
    few = np.full(9_000, -1)
    few[[10, 500, 8_000]] = [0, 2, 1]
    found, found_scores, _ = scan.scan(Q, X, 5, offset=offset, scale=scale, group=torch.from_numpy(few),
                                       slack=f32_slack)
    assert all(set(r[:3]) == {10, 500, 8_000} and list(r[3:]) == [-1, -1] for r in found.numpy())
    assert np.isinf(found_scores.numpy()[:, 3:]).all() and np.isfinite(found_scores.numpy()[:, :3]).all()
    with pytest.raises(ValueError):
        scan.scan(Q, X, 10, offset=offset, group=torch.from_numpy(group[:5]))
    # the ranked rows all in the last step: the steps before have no row to rank, and no
    # query reads them (a floor of -inf, before k ranked rows are seen, admits no row of no group)
    last = np.full(9_000, -1)
    last[8_000:] = group[8_000:]
    want = every.copy()
    want[:, :8_000] = -np.inf
    found, found_scores, stats = scan.scan(Q, X, 10, chunk=1000, offset=offset, scale=scale,
                                           group=torch.from_numpy(last), slack=f32_slack)
    assert [set(r) for r in found.numpy()] == [set(r) for r in np.argsort(-want, axis=1)[:, :10]]
    assert stats["read_share"] <= 1 / 9 + 1e-9


def test_without_its_slack_the_bfloat16_scan_misses() -> None:
    """The data above needs the slack: a scan without one loses true top-10 rows (what makes
    the test above a test of the bound)."""
    import torch

    from vecplug.adapters.stores import scan

    base, queries = crowded_vectors(9_000, 64, seed=3)
    ids, _ = exact_top_k(base, queries, 10)
    found, _, _ = scan.scan(torch.from_numpy(queries), torch.from_numpy(base), 10, bfloat16=True, slack=0.0)
    assert [set(r) for r in found.numpy()] != [set(r) for r in ids]


def test_the_error_bound_bounds_every_pair() -> None:
    """|bfloat16 product - float32 product| <= error_bound for every query and row, on vectors
    with large and small entries; and it is a bound of the right size (within 20x the largest
    error seen), not a blanket one."""
    import torch

    from vecplug.adapters.stores import scan

    rng = np.random.default_rng(1)
    X = rng.standard_normal((5_000, 384)).astype(np.float32) * rng.uniform(0.1, 3, 384).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = torch.from_numpy(X[:200] + 0.3 * rng.standard_normal((200, 384)).astype(np.float32))
    Xt = torch.from_numpy(X)
    bound, _ = _bounds(Q, Xt)
    exact = Q.double() @ Xt.double().T
    rounded = Q.to(torch.bfloat16).float() @ Xt.to(torch.bfloat16).float().T
    err = (rounded.double() - exact).abs().amax(1)
    assert (err <= bound.double()).all()
    assert (bound.double() < 20 * err).all()


def test_the_scan_pads_when_there_are_fewer_rows_than_k_and_reads_only_count() -> None:
    import torch

    from vecplug.adapters.stores import scan

    base = unit_vectors(30, DIM, seed=2)
    Q = torch.from_numpy(unit_vectors(3, DIM, seed=3))
    X = torch.from_numpy(base)
    bf16_slack, _ = _bounds(Q, X)
    ids, scores, _ = scan.scan(Q, X, 10, bfloat16=True, slack=bf16_slack, count=6)
    want, want_scores = exact_top_k(base[:6], Q.numpy(), 6)
    assert (ids[:, 6:] == -1).all() and torch.isinf(scores[:, 6:]).all()
    assert [set(r) for r in ids[:, :6].numpy()] == [set(r) for r in want]
    np.testing.assert_allclose(scores[:, :6].numpy(), want_scores, atol=1e-6)


def test_a_torch_that_rounds_before_the_shift_makes_the_scan_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fine-grained floors need addmm's bias added before the product's rounding; a kernel
    that rounds first is found by the probe, and the scan runs in float32 (still exact)."""
    import torch

    from vecplug.adapters.stores import scan

    assert scan.bias_inside_product(False, 384)  # oneDNN's kernels, as torch ships them
    real = torch.addmm

    def rounding_first(bias: Any, a: Any, b: Any) -> Any:
        return real(bias, a, b) if a.dtype != torch.bfloat16 else (a @ b) + bias

    monkeypatch.setattr(torch, "addmm", rounding_first)
    scan.bias_inside_product.cache_clear()
    try:
        assert not scan.bias_inside_product(False, 384)
        base, queries = crowded_vectors(5_000, 64, seed=4)
        ids, _ = exact_top_k(base, queries, 10)
        Q, X = torch.from_numpy(queries), torch.from_numpy(base)
        found, _, stats = scan.scan(Q, X, 10, bfloat16=True, slack=_bounds(Q, X)[0])
        assert [set(r) for r in found.numpy()] == [set(r) for r in ids]
    finally:
        scan.bias_inside_product.cache_clear()


# -- the flat index and its file -----------------------------------------------------

def test_flat_index_adds_replaces_deletes_and_round_trips(tmp_path: Path) -> None:
    from vecplug.adapters.stores.flat_index import FlatIndex, check_flat_file

    vecs = unit_vectors(50, DIM, seed=5)
    index = FlatIndex(DIM)
    index.init_index(8)
    index.add_items(vecs[:40], np.arange(40))
    index.add_items(vecs[40:], np.arange(100, 110))  # grows past its room
    index.add_items(vecs[:1], [7])  # replaces label 7's vector
    index.mark_deleted(3)
    index.mark_deleted(109)  # the last row
    with pytest.raises(RuntimeError):
        index.mark_deleted(3)
    with pytest.raises(RuntimeError):
        index.get_items([3])
    assert index.get_current_count() == 48
    assert sorted(index.labels.tolist()) == sorted(set(range(40)) - {3} | set(range(100, 109)))
    np.testing.assert_array_equal(index.get_items([7, 39, 108]), np.stack([vecs[0], vecs[39], vecs[48]]))
    labels, dist = index.knn_query(vecs[39], k=2)
    assert labels[0, 0] == 39 and abs(dist[0, 0]) < 1e-6
    path = tmp_path / "v.flat"
    index.save_index(str(path))
    assert check_flat_file(path, DIM) is None
    again = FlatIndex(DIM)
    again.load_index(str(path))
    np.testing.assert_array_equal(again.vectors, index.vectors)
    np.testing.assert_array_equal(again.labels, index.labels)
    assert (again.row_norm, again.residual_norm) == (index.row_norm, index.residual_norm) and index.residual_norm > 0
    np.testing.assert_array_equal(again.get_items([108, 7]), index.get_items([108, 7]))
    # damage is named
    assert "holds 48-d" in check_flat_file(path, 32)
    data = path.read_bytes()
    path.write_bytes(data[:-4])
    assert "header says" in check_flat_file(path, DIM)
    path.write_bytes(b"XXXXXXXX" + data[8:])
    assert "not a vecplug flat" in check_flat_file(path, DIM)


def test_flat_index_grows_in_place_or_by_a_copy_while_a_view_is_held() -> None:
    """Growing keeps every row; with nothing else holding the rows it resizes them in place
    (numpy's allocations, traced: never the old and the new rows at once, as copies held them at
    the build's peak), and while a search's view of them is alive it copies them, with room to
    spare (the view stays valid)."""
    import tracemalloc

    from vecplug.adapters.stores.flat_index import FlatIndex

    dim, n = 384, 4000
    vecs = unit_vectors(2 * n, dim, seed=6)
    index = FlatIndex(dim)
    index.init_index(n)
    index.add_items(vecs[:n], np.arange(n))
    row_bytes = dim * 4 + 8
    tracemalloc.start()
    try:
        index.resize_index(2 * n)  # no view held
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 2.2 * n * row_bytes  # the grown rows; a copy holds 3 n at once
        index.add_items(vecs[n:], np.arange(n, 2 * n))
        view = index.vectors
        tracemalloc.reset_peak()
        index.resize_index(3 * n)  # while `view` reads the rows
        _, peak = tracemalloc.get_traced_memory()
        assert peak > 4.8 * n * row_bytes  # copied: 2 n rows and 3 n (and a quarter more room)
        assert index.get_max_elements() == 3 * n + 3 * n // 4 == len(index._labels)
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(view, vecs)
    np.testing.assert_array_equal(index.vectors, vecs)
    np.testing.assert_array_equal(index.labels, np.arange(2 * n))
    del view
    index.resize_index(2 * n)
    np.testing.assert_array_equal(index.get_items(range(2 * n)), vecs)
    with pytest.raises(RuntimeError):
        index.resize_index(2 * n - 1)


# -- the store ----------------------------------------------------------------------

def _records(n: int, langs: tuple[str, ...] = ("en", "de", "fr")) -> list[Any]:
    from vecplug.adapters.stores import Record

    return [Record(f"d{i}", f"text {i}", "src", i, langs[i % len(langs)], {"i": i}) for i in range(n)]


def test_search_batch_is_the_exact_search_of_each_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact in bfloat16 (a batch large enough) and in float32, with deletes and a replaced
    vector; a small batch is multiplied in float32 whatever the precision."""
    from vecplug.adapters.stores import get_store_class, scan

    in_bf16 = []
    real_scan = scan.scan
    monkeypatch.setattr(scan, "scan", lambda *a, **kw: in_bf16.append(kw["bfloat16"]) or real_scan(*a, **kw))
    base, queries = crowded_vectors(6_000, DIM, seed=7, queries=scan.BF16_MIN_QUERIES + 6)
    store = get_store_class("flat").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        store.upsert(_records(6_000), base)
        store.commit()
        gone = [f"d{i}" for i in range(0, 6_000, 7)]
        store.delete(gone)
        base[1] = queries[0]  # d1 now the first query itself
        store.upsert(_records(2)[1:], base[1:2])
        store.commit()
        live = np.asarray(sorted(set(range(6_000)) - {int(g[1:]) for g in gone}))
        want, want_scores = exact_top_k(base[live], queries, 10)
        for precision in ("bfloat16", "float32"):
            store._options["precision"] = precision
            got = store.search_batch(queries, 10)
            assert [[h.record.id for h in hits] for hits in got] == [[f"d{live[j]}" for j in row] for row in want]
            np.testing.assert_allclose([[h.score for h in hits] for hits in got], want_scores, atol=1e-5)
            assert got[0][0].record.id == "d1" and got[0][0].record.payload == {"i": 1}
            np.testing.assert_array_equal(got[0][0].vector, base[1])
        assert in_bf16 == [True, False]
        store._options["precision"] = "bfloat16"
        store.search_batch(queries[:scan.BF16_MIN_QUERIES - 1], 10)
        assert in_bf16[-1] is False
        # the same as one query at a time, and with languages: only their rows scanned
        one = [store.search(q, 10) for q in queries[:5]]
        assert [[h.record.id for h in hits] for hits in one] == [[h.record.id for h in hits] for hits in got[:5]]
        de = store.search_batch(queries[:5], 4, ["de"])
        assert all(h.record.lang == "de" for hits in de for h in hits)
        assert [[h.record.id for h in hits] for hits in de] == [
            [h.record.id for h in store.search(q, 4, ["de"])] for q in queries[:5]]
        two = live[live % 3 != 0]  # _records' languages: en, de, fr in turn
        want, _ = exact_top_k(base[two], queries, 10)
        got = store.search_batch(queries, 10, ["fr", "de"])  # bfloat16: a batch large enough
        assert [[h.record.id for h in hits] for hits in got] == [[f"d{two[j]}" for j in row] for row in want]
        assert in_bf16[-1] is True
        assert store.search_batch(queries, 10, ["xx"]) == [[] for _ in queries]
        assert [len(hits) for hits in store.search_batch(queries[:2], 10_000)] == [len(live)] * 2
    finally:
        store.close()


def test_the_corrected_search_is_exact_by_centred_cosine(tmp_path: Path) -> None:
    """The language-bias correction on the flat store, a batch and one query at a time, finds
    the exact top 10 by centred cosine (``cos(q - m[lang(q)], d - m[lang(d)])``, brute force),
    on vectors whose language shifts them and where each language's best by plain cosine are
    not its best centred; after a write that moves the means, with other means, and in a reader
    that followed a commit which moved rows, by those."""
    from vecplug.adapters import bias
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores import get_store_class, scan

    langs = ("en", "de", "fr")
    base, queries = crowded_vectors(6_000, DIM, seed=8, queries=scan.BF16_MIN_QUERIES + 6)
    rng = np.random.default_rng(8)
    shifts = 0.3 * rng.standard_normal((3, DIM)).astype(np.float32) / np.sqrt(DIM)
    base = base + shifts[np.arange(6_000) % 3]
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    qlangs = [langs[i % 3] for i in range(len(queries))]
    store = get_store_class("flat").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})

    def exact(means: Any, docs: Any, pool: tuple[str, ...] = langs) -> list[list[str]]:
        """Each query's exact top 10 ids among the documents ``docs`` (numbers) of ``pool``."""
        docs = np.asarray([i for i in docs if langs[i % 3] in pool])
        centred = means.centre(base[docs], [langs[i % 3] for i in docs])
        ids, _ = exact_top_k(centred, means.centre(queries, qlangs), 10)
        return [[f"d{docs[j]}" for j in row] for row in ids]

    def ids(found: Any) -> list[list[str]]:
        return [[h.record.id for h in hits] for hits in found]

    try:
        for a, n in ((0, 4_500), (4_500, 6_000)):  # the second write moves the means
            store.upsert(_records(n)[a:], base[a:n])
            store.commit()
            stats = LanguageStats(DIM)
            stats.add([langs[i % 3] for i in range(n)], base[:n])
            means = stats.means()
            want = exact(means, range(n))
            for precision in ("bfloat16", "float32"):
                store._options["precision"] = precision
                assert ids(bias.centred_search_batch(store, means, queries, qlangs, 10, list(langs))) == want
            one = [bias.centred_search(store, means, q, ql, 10, list(langs)) for q, ql in zip(queries[:8], qlangs)]
            assert ids(one) == want[:8]
            # the batch's hits carry the single searches' scores and the stored vectors; a
            # language asked that has no document adds nothing
            batch = bias.centred_search_batch(store, means, queries[:8], qlangs[:8], 10, [*langs, "es"])
            assert ids(batch) == want[:8]
            np.testing.assert_allclose([[h.score for h in r] for r in batch], [[h.score for h in r] for r in one],
                                       atol=1e-6)
            for hit in (h for r in batch for h in r):
                np.testing.assert_allclose(hit.vector, base[int(hit.record.id[1:])], atol=1e-7)
        # other means, no write: ranked by them, not by the last ones
        other = bias.LanguageMeans({lang: m + 0.2 * unit_vectors(1, DIM, seed=i)[0]
                                    for i, (lang, m) in enumerate(means.by_lang.items())}, means.overall)
        assert ids(bias.centred_search_batch(store, other, queries, qlangs, 10, list(langs))) == exact(other, range(6_000))
        # (a few queries: every language's rows in one pass, its cache keyed by the means too:
        # the scores are centred cosines with these means)
        assert ids(bias.centred_search_batch(store, means, queries[:8], qlangs[:8], 10, list(langs))) == want[:8]
        few = bias.centred_search_batch(store, other, queries[:8], qlangs[:8], 10, list(langs))
        assert ids(few) == exact(other, range(6_000))[:8]
        centred = other.centre(queries[:8], qlangs[:8])
        for q, hits in zip(centred, few):
            docs = [int(h.record.id[1:]) for h in hits]
            want_scores = other.centre(base[docs], [langs[d % 3] for d in docs]) @ q
            np.testing.assert_allclose([h.score for h in hits], want_scores, atol=1e-5)
        # a reader follows a commit that moved rows (a delete: the last row, d5999, a French
        # one, takes the deleted one's place) and left French's mean as it was
        reader = get_store_class("flat").open(str(tmp_path / "idx"), {})
        try:
            for few in (len(queries), 8):  # (8: the one pass over every row)
                assert ids(bias.centred_search_batch(reader, means, queries[:few], qlangs[:few], 10, ["fr"])) == \
                    exact(means, range(6_000), ("fr",))[:few]
            store.delete(["d1"])  # German
            store.commit()
            for few in (len(queries), 8):
                assert ids(bias.centred_search_batch(reader, means, queries[:few], qlangs[:few], 10, ["fr"])) == \
                    exact(means, range(6_000), ("fr",))[:few]
        finally:
            reader.close()
        # what the correction found before: each language's best 20 by plain cosine, rescored
        centred_queries = means.centre(queries, qlangs)
        old = [bias.best_centred(store, means, q, store.candidates_per_language(q, 20, list(langs)), 10)
               for q in centred_queries]
        assert ids(old) != want
    finally:
        store.close()


def test_a_few_queries_read_every_row_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer queries than the bfloat16 scan takes: the corrected search reads every row once
    (one pass, each row by its own language's mean), not each language's rows gathered in
    turn; a full batch scans language by language."""
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores import get_store_class, scan
    from vecplug.adapters.stores.flat import FlatStore

    langs = ["en", "de", "fr"]
    base = unit_vectors(900, DIM, seed=4)
    stats = LanguageStats(DIM)
    stats.add([langs[i % 3] for i in range(900)], base)
    means = {lang: stats.means().of(lang) for lang in langs}
    calls: list[str] = []
    for name in ("_centred_scan", "_centred_one_pass"):
        real = getattr(FlatStore, name)
        monkeypatch.setattr(FlatStore, name, lambda self, *a, _real=real, _name=name, **kw:
                            calls.append(_name) or _real(self, *a, **kw))
    store = get_store_class("flat").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        store.upsert(_records(900), base)
        store.commit()
        for n in (1, scan.BF16_MIN_QUERIES - 1, scan.BF16_MIN_QUERIES):
            calls.clear()
            found = store.centred_search_batch(unit_vectors(n, DIM, seed=5), 5, langs, means)
            assert len(found) == n and all(len(hits) == 5 for hits in found)
            assert calls == (["_centred_one_pass"] if n < scan.BF16_MIN_QUERIES else ["_centred_scan"])
        # languages holding less than half of the rows: theirs gathered, not every row read;
        # at half or more, one pass; none asked: nothing, by either path
        for asked, path in ((["fr"], "_centred_scan"), (["en", "de"], "_centred_one_pass"),
                            (["fr", "fr"], "_centred_scan")):
            calls.clear()
            found = store.centred_search_batch(unit_vectors(2, DIM, seed=6), 5, asked, means)
            assert calls == [path] and all(len(hits) == 5 for hits in found)
            assert all(h.record.lang in asked for hits in found for h in hits)
        for n in (1, scan.BF16_MIN_QUERIES):
            assert store.centred_search_batch(unit_vectors(n, DIM, seed=7), 5, [], means) == [[]] * n
            assert store._centred_one_pass(unit_vectors(n, DIM, seed=7), 5, [], means) == [[]] * n
    finally:
        store.close()


def test_an_empty_flat_store_and_wrong_queries(tmp_path: Path) -> None:
    from vecplug.adapters.stores import get_store_class
    from vecplug.errors import ModelMismatchError

    store = get_store_class("flat").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        means = {lang: np.zeros(DIM, np.float32) for lang in ("en", "de", "fr", "es")}
        assert store.search_batch(unit_vectors(3, DIM), 5) == [[], [], []]
        assert store.centred_search_batch(unit_vectors(3, DIM), 5, ["en"], means) == [[], [], []]
        store.upsert(_records(3), unit_vectors(3, DIM))
        store.commit()
        assert [len(h) for h in store.search_batch(unit_vectors(2, DIM), 5)] == [3, 3]
        assert [len(h) for h in store.centred_search_batch(unit_vectors(2, DIM), 5, ["en", "de", "fr"], means)] == [3, 3]
        assert store.centred_search_batch(unit_vectors(2, DIM), 5, ["es"], means) == [[], []]
        with pytest.raises(ModelMismatchError, match="dimension 16"):
            store.search_batch(unit_vectors(2, 16), 5)
    finally:
        store.close()


def test_a_flat_folder_is_the_flat_store_s_alone(tmp_path: Path) -> None:
    """A marker tells the two stores' folders apart: hnswlib does not take a flat index for its
    own (nor write into its folder), Index.open finds the store a folder was made with, and the
    flat store refuses graph options."""
    from vecplug.api import settings_for
    from vecplug.adapters.stores import get_store_class
    from vecplug.api import Index
    from vecplug.errors import ConfigError, VecplugError

    folder = str(tmp_path / "idx")
    flat, hnsw = get_store_class("flat"), get_store_class("hnswlib")
    with pytest.raises(ConfigError, match="no option M"):
        flat.create(folder, DIM, {"dim": DIM}, {"M": 32})
    store = flat.create(folder, DIM, {"dim": DIM, **FakeEncoder(DIM).describe()}, {})
    store.upsert(_records(4), unit_vectors(4, DIM))
    store.commit()
    store.close()
    assert flat.exists(folder, {}) and not hnsw.exists(folder, {})
    with pytest.raises(VecplugError, match="not a vecplug hnswlib index"):
        hnsw.create(folder, DIM, {"dim": DIM}, {})
    index = Index.open(settings_for(index={"path": folder}))  # store: hnswlib by default
    try:
        assert index.store.name == "flat" and index.store.count() == 4
    finally:
        index.close()
    other = str(tmp_path / "graph")
    hnsw.create(other, DIM, {"dim": DIM}, {}).close()
    assert hnsw.exists(other, {}) and not flat.exists(other, {})
    with pytest.raises(VecplugError, match="not a vecplug flat index"):
        flat.create(other, DIM, {"dim": DIM}, {})


def test_index_search_batch_asks_the_flat_store_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Index.search_batch hands a pooled batch to the store in one call, without the bias
    correction (one scan) and with it (each language scanned once for the queries, only their
    best kept), and its answers are those of Index.search, query by query; consensus goes query by query."""
    from vecplug.api import settings_for
    from vecplug.adapters.bias import LanguageStats
    from vecplug.adapters.stores import flat
    from vecplug.api import Index

    encoder = FakeEncoder(16)
    encoder.query = None  # nothing to load before a search
    texts = [f"word{i % 50} other{i % 7} thing{i % 13}" for i in range(400)]
    records = [r.__class__(r.id, texts[i], r.source, r.position, r.lang, r.payload) for i, r in enumerate(_records(400))]
    store = flat.FlatStore.create(str(tmp_path / "idx"), 16, {**encoder.describe(), "debias": True}, {})
    vectors = encoder.encode_documents(texts)
    store.upsert(records, vectors)
    stats = LanguageStats(16)
    stats.add([r.lang for r in records], vectors)
    store.commit(stats.to_manifest())
    calls: list[tuple[str, int]] = []
    for name in ("search_batch", "centred_search_batch", "centred_candidates_per_language", "candidates_per_language"):
        def spy(self: Any, *a: Any, _name: str = name, _real: Any = getattr(flat.FlatStore, name), **kw: Any) -> Any:
            calls.append((_name, len(np.atleast_2d(a[0]))))
            return _real(self, *a, **kw)
        monkeypatch.setattr(flat.FlatStore, name, spy)
    index = Index(settings_for(index={"path": str(tmp_path / "idx"), "store": "flat"}), store, writable=False)
    index._encoder = encoder
    index._detector = SimpleNamespace(detect=lambda text: "it")  # a language the index lacks
    try:
        queries = ["word3 thing5", "other2 word7", "thing1", "word49 other6 thing12"]
        qlangs = ["en", "de", "fr", None]
        for debias, method in ((False, "search_batch"), (True, "centred_search_batch")):
            calls.clear()
            batch = index.search_batch(queries, 5, langs=qlangs, debias=debias)
            assert calls == [(method, 4)]
            singles = [index.search(q, 5, lang=ql, debias=debias) for q, ql in zip(queries, qlangs)]
            assert [[h.id for h in r] for r in batch] == [[h.id for h in r] for r in singles]
            np.testing.assert_allclose([[h.score for h in r] for r in batch],
                                       [[h.score for h in r] for r in singles], atol=1e-6)
            assert all(len(r) == 5 for r in batch)
        # the corrected batch is the search of every language, not only the query's
        assert len({h.lang for r in batch for h in r}) == 3
        # one query is one query's search (the flat store ranks it by centred cosine too)
        calls.clear()
        index.search_batch(queries[:1], 5, langs=qlangs[:1])
        assert calls == [("centred_search_batch", 1)]
        calls.clear()
        index.search_batch(queries, 5, langs=qlangs, consensus=True)  # query by query
        assert calls == [("centred_candidates_per_language", 1)] * 4
    finally:
        index.close()


def test_cli_indexes_into_a_flat_store_and_searches_it(tmp_path: Path, tiny_model: Path) -> None:
    from click.testing import CliRunner

    from vecplug.cli import cli

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox\n\nslow green turtles walk\n", encoding="utf-8")
    (corpus / "b.txt").write_text("a lazy dog sleeps\n", encoding="utf-8")
    folder = str(tmp_path / "idx")
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    run("index", str(corpus), "--index", folder, "--store", "flat", "--model", str(tiny_model), "--lang", "en", "-q")
    assert (tmp_path / "idx" / ".store-flat").is_file() and not list((tmp_path / "idx").glob("*.hnsw"))
    # the folder's store is found whatever --store says (hnswlib by default)
    assert "a lazy dog sleeps" in run("search", "a lazy dog sleeps", "--index", folder, "-k", "1",
                                      "--model", str(tiny_model), "--lang", "en", "--no-debias")
    assert "(flat)" in run("info", "--index", folder)


def test_verify_finds_records_without_vectors(tmp_path: Path) -> None:
    from vecplug.adapters.stores import get_store_class

    store = get_store_class("flat").create(str(tmp_path / "idx"), DIM, {"dim": DIM}, {})
    try:
        store.upsert(_records(5), unit_vectors(5, DIM))
        store.commit()
        assert store.verify() == []
        store._index.mark_deleted(2)  # a vector lost, its record kept
        assert store.verify() == ["vectors-1.flat: 4 vectors for 5 records (1 of them without one)"]
    finally:
        store.close()
