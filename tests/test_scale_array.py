"""Dask arrays in, Dask arrays out: every chunking, split_every and scheduler gives, bit for bit,
what the same refkern function gives on the computed numpy arrays."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
ml_dtypes = pytest.importorskip("ml_dtypes")

from strategies import FORMAT_NAMES, values  # noqa: E402

import refkern as rk  # noqa: E402

SCHEDULERS = ("sync", "threads", "distributed")


def _np_dtype(fmt):
    return ml_dtypes.bfloat16 if fmt == "bfloat16" else np.dtype(fmt)


def _bits(a):
    a = np.asarray(a)
    return a.reshape(-1).view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_same(got, want, what):
    """Bit-identical arrays of one dtype and shape (any NaN equals any NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(nan, np.isnan(got.astype(np.float64))), (what, got, want)
    assert np.array_equal(_bits(got)[~nan.reshape(-1)], _bits(want)[~nan.reshape(-1)]), (what, got, want)


_TINY = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 2.0**-1074}  # least subnormal


def _chunks(draw, n):
    """Chunk sizes summing to n, empty chunks included."""
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    edges = [0, *cuts, n]
    return tuple(b - a for a, b in zip(edges, edges[1:])) or (0,)


@st.composite
def chunked(draw, ndim_max=2, specials=True):
    """(numpy array, its chunks, format): values of every binade, subnormals, signed zeros,
    inf/NaN, and a large pair +B / -B placed in different chunks (cancellation across chunks)."""
    fmt = draw(st.sampled_from(FORMAT_NAMES))
    ndim = draw(st.integers(1, ndim_max))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    n = math.prod(shape)
    xs = draw(st.lists(values(fmt, specials=draw(st.booleans()) and specials), min_size=n, max_size=n))
    x = np.asarray(xs, np.float64)
    if n >= 2 and draw(st.booleans()):  # cancellation: +B and -B far apart in the flat order
        big = draw(values(fmt).filter(lambda v: v != 0))
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if i != j:
            x[i], x[j] = big, -big
    if n and draw(st.booleans()):
        x[draw(st.integers(0, n - 1))] = -0.0
    if n and draw(st.booleans()):  # subnormals (a uniform bit pattern is rarely one in float32/float64)
        for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
            x[i] = draw(st.integers(-(2**10), 2**10)) * _TINY[fmt]
    arr = x.astype(_np_dtype(fmt)).reshape(shape)
    chunks = tuple(_chunks(draw, s) for s in shape)
    return arr, chunks, fmt


def _compute(scheduler, client, *xs):
    if scheduler == "distributed":
        return client.compute(list(xs), sync=True)
    return dask.compute(*xs, scheduler=scheduler)


def _check_reductions(scheduler, client, data, arr, chunks, fmt):
    d = da.from_array(arr, chunks=chunks)
    ndim = arr.ndim
    dim = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1), st.just(tuple(range(ndim)))), label="dim")
    keepdim = data.draw(st.booleans(), label="keepdim")
    corr = data.draw(st.sampled_from([0, 1, 2, 0.5]), label="correction")
    axis = data.draw(st.integers(-ndim, ndim - 1), label="cumsum dim")
    split_every = data.draw(st.integers(2, 5), label="split_every")
    cast = data.draw(st.sampled_from([None, "float32", "float16"]), label="dtype")
    with dask.config.set(split_every=split_every):  # read when the graph is built
        lazy = {
            "sum": rk.sum(d, dim, keepdim),
            "sum dtype": rk.sum(d, dim, keepdim, dtype=cast),
            "mean": rk.mean(d, dim, keepdim),
            "var": rk.var(d, dim, correction=corr, keepdim=keepdim),
            "std": rk.std(d, dim, correction=corr, keepdim=keepdim),
            "cumsum": rk.cumsum(d, axis),
            "cumsum dtype": rk.cumsum(d, axis, dtype=cast),
        }
    for v in lazy.values():
        assert isinstance(v, da.Array)
    got = dict(zip(lazy, _compute(scheduler, client, *lazy.values())))
    want = {
        "sum": rk.sum(arr, dim, keepdim),
        "sum dtype": rk.sum(arr, dim, keepdim, dtype=cast),
        "mean": rk.mean(arr, dim, keepdim),
        "var": rk.var(arr, dim, correction=corr, keepdim=keepdim),
        "std": rk.std(arr, dim, correction=corr, keepdim=keepdim),
        "cumsum": rk.cumsum(arr, axis),
        "cumsum dtype": rk.cumsum(arr, axis, dtype=cast),
    }
    for k in lazy:
        assert_same(got[k], want[k], f"{k} {fmt} dim={dim} chunks={chunks}")


def _check_products(scheduler, client, data, fmt):
    K = data.draw(st.integers(0, 12), label="K")
    M, N = data.draw(st.integers(1, 4), label="M"), data.draw(st.integers(1, 4), label="N")
    draw_vals = st.lists(values(fmt, specials=data.draw(st.booleans())), min_size=K * (M + N) + 2 * K,
                         max_size=K * (M + N) + 2 * K)  # fmt: skip
    xs = np.asarray(data.draw(draw_vals, label="values"), np.float64)
    if K >= 2:  # cancellation across chunks of K
        xs[0], xs[K - 1] = 2.0**10, -(2.0**10)
        xs[K], xs[2 * K - 1] = 1.0, 1.0
    arrs = xs.astype(_np_dtype(fmt))
    x, y = arrs[:K], arrs[K : 2 * K]
    a, b = arrs[2 * K : 2 * K + M * K].reshape(M, K), arrs[2 * K + M * K :].reshape(K, N)
    ck = _chunks(data.draw, K)
    dx = da.from_array(x, chunks=(ck,))
    dy = da.from_array(y, chunks=(_chunks(data.draw, K),))
    dA = da.from_array(a, chunks=(_chunks(data.draw, M), ck))
    dB = da.from_array(b, chunks=(ck, _chunks(data.draw, N)))
    with dask.config.set(split_every=data.draw(st.integers(2, 4), label="split_every")):  # read when built
        lazy = [rk.dot(dx, dy), rk.matmul(dA, dB), rk.matmul(dA, dy), rk.matmul(dx, dB)]
    got = _compute(scheduler, client, *lazy)
    want = [rk.dot(x, y), rk.matmul(a, b), rk.matmul(a, y), rk.matmul(x, b)]
    for g, w, what in zip(got, want, ("dot", "matmul", "matmul 2-D @ 1-D", "matmul 1-D @ 2-D")):
        assert_same(g, w, f"{what} {fmt} K={K} chunks={ck}")


_EXAMPLES = {"sync": 60, "threads": 30, "distributed": 20}


def _given(scheduler):
    return settings(max_examples=_EXAMPLES[scheduler], deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])  # fmt: skip


@pytest.fixture(params=SCHEDULERS)
def scheduler(request):
    """(name, client or None): the synchronous, threaded and two-worker distributed schedulers."""
    return request.param, (request.getfixturevalue("client") if request.param == "distributed" else None)


def test_reductions_bit_for_bit(scheduler):
    name, client = scheduler

    @_given(name)
    @given(case=chunked(), data=st.data())
    def run(case, data):
        _check_reductions(name, client, data, *case)

    run()


def test_dot_matmul_bit_for_bit(scheduler):
    name, client = scheduler

    @_given(name)
    @given(fmt=st.sampled_from(FORMAT_NAMES), data=st.data())
    def run(fmt, data):
        _check_products(name, client, data, fmt)

    run()


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_pinned_hard_cases(scheduler, fmt):
    """Every case of issue 28 at once, in each format and scheduler: subnormals, both zeros, inf and
    NaN, +B and -B in different chunks (cancellation across chunks), empty and one-element chunks,
    split_every 2, every op."""
    name, client = scheduler
    tiny = _TINY[fmt]
    big = {"float16": 6e4, "bfloat16": 3e38, "float32": 3e38, "float64": 1e308}[fmt]
    finite = np.array([big, 3 * tiny, -0.0, 1.5, -tiny, 0.0, 2.5, -big, 7 * tiny, -0.0, 0.25, 1.0], np.float64)
    special = finite.copy()
    special[[4, 10]] = np.inf, np.nan
    zeros = np.array([-0.0, -0.0, -0.0, -0.0], np.float64)
    for x, chunks in ((finite, (0, 1, 1, 3, 0, 7)), (special, (5, 0, 1, 6)), (zeros, (1, 0, 3))):
        arr = x.astype(_np_dtype(fmt))
        d = da.from_array(arr, chunks=(chunks,))
        m = da.from_array(arr.reshape(3, -1) if arr.size % 3 == 0 else arr.reshape(2, -1), chunks=1)
        with dask.config.set(split_every=2):  # read when the graph is built
            lazy = {"sum": rk.sum(d), "mean": rk.mean(d), "var": rk.var(d), "std": rk.std(d, correction=0),
                    "cumsum": rk.cumsum(d, 0), "dot": rk.dot(d, d[::-1]), "matmul": rk.matmul(m, m.T),
                    "sum rows": rk.sum(m, 1)}  # fmt: skip
        got = dict(zip(lazy, _compute(name, client, *lazy.values())))
        mm = np.asarray(m.compute())
        want = {"sum": rk.sum(arr), "mean": rk.mean(arr), "var": rk.var(arr), "std": rk.std(arr, correction=0),
                "cumsum": rk.cumsum(arr, 0), "dot": rk.dot(arr, arr[::-1].copy()), "matmul": rk.matmul(mm, mm.T.copy()),
                "sum rows": rk.sum(mm, 1)}  # fmt: skip
        for k in lazy:
            assert_same(got[k], want[k], f"{k} {fmt} chunks={chunks}")


def test_three_dims_and_batched_matmul():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 6, 7)) * np.exp2(rng.integers(-30, 30, (5, 6, 7)))).astype(np.float32)
    d = da.from_array(x, chunks=(2, 4, 3))
    for dim in [(0, 2), 1, (1, 2), None]:
        for f in (rk.sum, rk.mean, rk.var, rk.std):
            assert_same(f(d, dim).compute(), f(x, dim), f"{f.__name__} {dim}")
    assert_same(rk.cumsum(d, 1).compute(), rk.cumsum(x, 1), "cumsum")
    a = rng.standard_normal((3, 1, 4, 9))
    b = rng.standard_normal((2, 9, 5))
    got = rk.matmul(da.from_array(a, chunks=(2, 1, 3, 4)), da.from_array(b, chunks=(1, 5, 2))).compute()
    assert_same(got, rk.matmul(a, b), "batched matmul")


def test_nothing_is_computed_at_call_time():
    def boom(b):
        raise AssertionError("a chunk was computed at call time")

    d = da.ones((8, 6), chunks=(3, 4), dtype=np.float32).map_blocks(boom, dtype=np.float32)
    v = da.ones(6, chunks=2, dtype=np.float32).map_blocks(boom, dtype=np.float32)
    lazy = [rk.sum(d), rk.mean(d, 0), rk.var(d, 1), rk.std(d), rk.cumsum(d, 0), rk.dot(v, v), rk.matmul(d, v)]
    assert all(isinstance(x, da.Array) for x in lazy)
    with pytest.raises(AssertionError, match="computed at call time"):
        lazy[0].compute(scheduler="sync")


def test_one_result_for_every_chunking_where_dask_differs():
    """dask#10527: a float32 sum that dask's own sum changes with the partitioning."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(10_001) * 1e4).astype(np.float32)
    x[::97] = np.float32(3e7)
    x[1::97] = np.float32(-3e7)
    want = rk.sum(x)
    theirs = set()
    for chunks in (37, 100, 1000, 5000, 10_001):
        d = da.from_array(x, chunks=chunks)
        assert_same(rk.sum(d).compute(), want, f"sum chunks={chunks}")
        assert_same(rk.cumsum(d, 0).compute(), rk.cumsum(x, 0), f"cumsum chunks={chunks}")
        theirs.add(float(d.sum().compute()))
    assert len(theirs) > 1  # the case is one where chunking matters to a float sum


def test_errors_name_the_argument():
    d = da.ones(4, chunks=2, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^sum: only accumulate='exact' gives one result"):
        rk.sum(d, accumulate="naive")
    with pytest.raises(TypeError, match=r"^sum: expected floating-point inputs"):
        rk.sum(da.ones(4, chunks=2, dtype=np.int64))
    with pytest.raises(TypeError, match=r"^dot: x and y must have the same dtype"):
        rk.dot(d, da.ones(4, chunks=2, dtype=np.float64))
    with pytest.raises(ValueError, match=r"^matmul: inner dimensions must match"):
        rk.matmul(da.ones((2, 3), chunks=1), da.ones((4, 2), chunks=1))
    with pytest.raises(TypeError, match=r"^cumsum: dim must be an int"):
        rk.cumsum(d, None)
    with pytest.raises(IndexError, match=r"^var: dim=3 is out of range"):
        rk.var(d, 3)


def test_a_numpy_partner_and_compare():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 40)).astype(np.float32)
    b = rng.standard_normal((40, 5)).astype(np.float32)
    got = rk.matmul(da.from_array(a, chunks=(3, 7)), b)
    assert isinstance(got, da.Array)
    assert_same(got.compute(), rk.matmul(a, b), "matmul with a numpy b")
    out = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    rep = rk.compare(da.from_array(out, chunks=2), "matmul", da.from_array(a, chunks=(3, 7)), b)
    assert rep.verdict == rk.compare(out, "matmul", a, b).verdict
