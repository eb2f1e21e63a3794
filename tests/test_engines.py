"""The BLAS engine (Ozaki slices on torch): bit-identical to the Numba engine and to the
mpmath truth on adversarial inputs, on every path (tiles, fallback rows and columns, the
torch and the Numba rounding, signed zeros), and wrong when the slice bound is."""

import zlib
from fractions import Fraction

import numpy as np
import pytest
from strategies import same

import refkern as rk
from refkern import engines, truth

torch = pytest.importorskip("torch")
from refkern.accumulate.formats import FLOAT16, FLOAT32, FLOAT64  # noqa: E402
from refkern.engines import blas, ozaki  # noqa: E402

DTYPES = ["float16", "bfloat16", "float32", "float64"]
KINDS = ["normal", "spread", "cancel", "subnormal", "special", "zeros"]


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _data(rng, shape, dtype, kind):
    """Adversarial inputs as a torch tensor of ``dtype``:
    spread: magnitudes 2**-60..2**60 (rows that need many slices, or fall back);
    cancel: every other entry the exact negative of its neighbour, plus a few ulps;
    subnormal: the format's subnormals mixed with normals; special: inf, -inf, NaN sprinkled;
    zeros: +0 and -0 with a few nonzeros (signed-zero results)."""
    x = rng.standard_normal(shape)
    fin = torch.finfo(getattr(torch, dtype))
    if kind == "spread":
        lim = 60 if dtype in ("float32", "float64", "bfloat16") else 12
        x = x * 2.0 ** rng.integers(-lim, lim + 1, shape)
    elif kind == "cancel":
        flat = x.reshape(-1)
        flat[1::2] = -flat[0 : len(flat[1::2]) * 2 : 2]
        flat[::7] *= 1 + 2.0**-20
    elif kind == "subnormal":
        tiny = fin.smallest_normal
        x = np.where(rng.random(shape) < 0.5, x * tiny * 2.0 ** -rng.integers(0, 10, shape), x)
    elif kind == "special" and x.size:
        x = x.copy()
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=max(1, flat.size // 40), replace=False)
        flat[idx] = rng.choice([np.inf, -np.inf, np.nan], size=idx.size)
    elif kind == "zeros":
        x = np.where(rng.random(shape) < 0.9, np.where(rng.random(shape) < 0.5, -0.0, 0.0), x)
    t = torch.from_numpy(np.asarray(x, np.float64)).to(getattr(torch, dtype))
    return t


def _all_same(got, want, what=""):
    g = np.asarray(torch.as_tensor(got).double()).reshape(-1)
    w = np.asarray(torch.as_tensor(want).double()).reshape(-1)
    assert g.shape == w.shape, f"{what}: shapes {g.shape} and {w.shape}"
    bad = [i for i in range(g.size) if not same(g[i], w[i])]
    assert not bad, f"{what}: {len(bad)} of {g.size} elements differ, first at {bad[0]}: {g[bad[0]]!r} vs {w[bad[0]]!r}"


# ---------------------------------------------------------------------------- the slice bound


@pytest.mark.parametrize("k", [1, 2, 3, 576, 1023, 1024, 1025, 4095, 2**20])
def test_slice_width_is_the_largest_exact_one(k):
    w = ozaki.slice_width(k)
    assert k * 2 ** (2 * w) <= 2**53 < k * 2 ** (2 * w + 2)


def test_slice_widths_named_in_the_docs():
    assert [ozaki.slice_width(k) for k in (1, 512, 1024, 2**20)] == [26, 22, 21, 16]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_slices_reassemble_exactly(dtype):
    rng = _rng("slices", dtype)
    x = _data(rng, (6, 50), dtype, "spread").double()
    fmt = FLOAT32 if dtype == "float32" else FLOAT64
    E, low, fin = ozaki.row_stats(x, fmt.prec, fmt.emin - fmt.prec + 1)
    w = ozaki.slice_width(50)
    need = ozaki.slices_needed(E, low, w)
    s = int(need.max())
    sl = ozaki.make_slices(x, E, s, w, torch.ones(6, dtype=torch.bool))
    assert bool((sl == torch.round(sl)).all()) and float(sl.abs().max()) <= 2.0**w
    for i in range(6):  # exact reassembly, in rationals
        for kk in range(50):
            exact = sum(Fraction(float(sl[t, i, kk])) * Fraction(2) ** (int(E[i]) + 1 - (t + 1) * w) for t in range(s))
            assert exact == Fraction(float(x[i, kk])), (i, kk)


# ---------------------------------------------------------------------------- engines agree


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_matmul_blas_equals_numba_and_truth(dtype, kind):
    rng = _rng("mm", dtype, kind)
    a, b = _data(rng, (9, 40), dtype, kind), _data(rng, (40, 7), dtype, kind)
    got = rk.matmul(a, b, engine="blas")
    assert got.dtype == a.dtype and got.shape == (9, 7)
    _all_same(got, rk.matmul(a, b, engine="numba"), "blas vs numba")
    _all_same(got, truth.matmul(a, b), "blas vs truth")


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("kind", ["normal", "spread", "cancel", "special", "zeros"])
def test_linear_with_bias(dtype, kind):
    rng = _rng("lin", dtype, kind)
    x, w = _data(rng, (2, 5, 33), dtype, kind), _data(rng, (6, 33), dtype, kind)
    b = _data(rng, (6,), dtype, kind if kind != "special" else "normal")
    got = rk.linear(x, w, b, engine="blas")
    _all_same(got, rk.linear(x, w, b, engine="numba"), "blas vs numba")
    _all_same(got, truth.linear(x, w, b), "blas vs truth")


def test_bias_far_from_the_products():
    """The bias is a term of the exact sum even 2**80 away from the products."""
    x = torch.tensor([[1.0, 2.0**-30, 3.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0, -1.0], [2.0**-40, 1.0, 0.0]], dtype=torch.float64)
    for bias in ([2.0**80, -(2.0**-60)], [-0.0, 2.0**-1074], [2.0, -(2.0**-30)]):
        b = torch.tensor(bias, dtype=torch.float64)
        got = rk.linear(x, w, b, engine="blas")
        _all_same(got, truth.linear(x, w, b), f"bias {bias}")


def test_batched_matmul():
    rng = _rng("batch")
    a, b = _data(rng, (2, 1, 5, 30), "float32", "spread"), _data(rng, (3, 30, 4), "float32", "cancel")
    got = rk.matmul(a, b, engine="blas")
    assert got.shape == (2, 3, 5, 4)
    _all_same(got, rk.matmul(a, b, engine="numba"))


def test_numpy_inputs_and_vectors():
    rng = _rng("np")
    a, b = rng.standard_normal(20).astype(np.float32), rng.standard_normal((20, 3)).astype(np.float32)
    got = rk.matmul(a, b, engine="blas")
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    _all_same(torch.from_numpy(got), torch.from_numpy(rk.matmul(a, b, engine="numba")))
    _all_same(torch.from_numpy(np.asarray(rk.matmul(a, a, engine="blas"))[None]), truth.dot(a, a))


def test_signed_zeros():
    """0 * -x is -0; a sum of only -0 terms is -0; any +0 term or a nonzero cancellation gives +0."""
    a = torch.tensor([[-0.0, 0.0], [1.0, -1.0], [-0.0, -0.0], [0.0, 0.0]])
    b = torch.tensor([[1.0, -1.0, 1.0], [1.0, 1.0, -0.0]])
    got = rk.matmul(a, b, engine="blas")
    _all_same(got, rk.matmul(a, b, engine="numba"))
    _all_same(got, truth.matmul(a, b))
    assert got[1, 0] == 0 and not torch.signbit(got[1, 0])  # 1 - 1: +0
    assert torch.signbit(got[2, 0]) and not torch.signbit(got[0, 0])  # -0 + -0: -0; -0 + +0: +0
    assert not torch.signbit(got[3, 2])  # +0 + -0: +0


@pytest.mark.parametrize("k", [0, 1, 2])
def test_tiny_reductions(k):
    a, b = torch.ones(3, k), -torch.ones(k, 2)
    _all_same(rk.matmul(a, b, engine="blas"), rk.matmul(a, b, engine="numba"))


def test_k_2_to_the_20_along_one_row():
    """1 x 2**20 by 2**20 x 1: the narrowest slices (w = 16), wide spread and cancellation."""
    k = 2**20
    rng = _rng("bigk")
    x = rng.standard_normal(k) * 2.0 ** rng.integers(-20, 21, k)
    y = rng.standard_normal(k)
    x[1::2] = -x[0::2] * (1 + 2.0**-22)  # near-exact cancellation of neighbouring products
    y[1::2] = y[0::2]
    a = torch.from_numpy(x.astype(np.float32))[None]
    b = torch.from_numpy(y.astype(np.float32))[:, None]
    got = rk.matmul(a, b, engine="blas")
    _all_same(got, rk.matmul(a, b, engine="numba"), "blas vs numba")
    # independent exact value: the products of float32 are exact in float64; sum them as integers
    p = a[0].double().numpy() * b[:, 0].double().numpy()
    m, e = np.frexp(p)
    mi = (m * 2.0**53).astype(np.int64)
    emin = int(e.min()) - 53
    total = sum(int(v) << int(s) for v, s in zip(mi.tolist(), (e - 53 - emin).tolist()))
    want = truth.round_exact(total < 0, abs(total), emin, FLOAT32)
    assert same(float(got[0, 0]), want)


# ---------------------------------------------------------------------------- every path of gemm


def _gemm(a, bt, bias=None, fmt=FLOAT64, **kw):
    formats = (fmt, fmt, fmt)

    def fallback(rows, cols):
        x = a[torch.as_tensor(rows)].double()
        w = bt[torch.as_tensor(cols)].double()
        bb = None if bias is None else bias[torch.as_tensor(cols)]
        return rk.linear(x, w, bb, engine="numba").numpy()

    return blas.gemm(a, bt, bias, fmt, formats, fallback, **kw)


@pytest.mark.parametrize("combine", ["numba", "torch"])
@pytest.mark.parametrize("memory", [None, 1 << 15])
@pytest.mark.parametrize("max_slices", [None, 2])
@pytest.mark.parametrize("karatsuba", [None, False, True])
def test_gemm_paths(combine, memory, max_slices, karatsuba):
    """Tiles over M, N and K (a 32 KiB budget), rows and columns sent to the fallback
    (max_slices=2 with a wide spread), both product schemes, and both roundings: all
    bit-identical."""
    rng = _rng("paths", combine, memory, max_slices, karatsuba)
    a = _data(rng, (37, 300), "float64", "spread").double()
    bt = _data(rng, (29, 300), "float64", "cancel").double()
    a[3, 7] = np.inf
    bt[5, 1] = np.nan
    bias = _data(rng, (29,), "float64", "normal").double()
    got = _gemm(a, bt, bias, memory=memory, max_slices=max_slices, combine=combine, karatsuba=karatsuba)
    want = rk.linear(a, bt, bias, engine="numba")
    _all_same(got, want)


def test_tiles_respect_the_budget():
    for m, n, k in [(1000, 1000, 1000), (1, 1, 2**20), (25088, 64, 577)]:
        for budget in (1 << 20, 1 << 26):
            tm, tn, tk = blas._tiles(m, n, k, 2, 2, budget, "numba", 3)
            assert blas.peak_bytes(tm, tn, tk, 2, 2, 3) <= budget or (tm <= 16 and tn <= 16 and tk <= 256)


@pytest.mark.parametrize("fmt", [FLOAT16, FLOAT32, FLOAT64], ids=lambda f: f.name)
def test_torch_and_numba_rounding_agree(fmt):
    """round_digits (torch, any device) and round_planes (Numba, CPU) on random digit planes,
    near overflow, in the subnormal range and at ties."""
    from refkern.engines._combine import round_planes

    rng = _rng("round", fmt.name)
    w = 21
    g = torch.from_numpy(rng.integers(-(2**55), 2**55, (3, 40, 50)))
    g[:, :5] = torch.from_numpy(rng.integers(-3, 4, (3, 5, 50)))  # ties and tiny values
    g[1:, 5:10] = 0
    ea = torch.from_numpy(rng.integers(fmt.emin - 80, fmt.emax + 10, 40))
    eb = torch.from_numpy(rng.integers(-20, 20, 50))
    c = 2 - 2 * w
    v1, z1 = ozaki.round_digits(g, ea[:, None] + eb[None, :] + c, w, *fmt.params)
    v2 = torch.empty(40, 50, dtype=torch.float64)
    z2 = torch.empty(40, 50, dtype=torch.bool)
    round_planes(g.numpy(), ea.numpy(), eb.numpy(), c, w, *fmt.params, v2.numpy(), z2.numpy())
    _all_same(v1, v2)
    assert torch.equal(z1, z2)
    for i, j in [(0, 0), (3, 4), (7, 9), (20, 30), (39, 49)]:  # against Python integers
        total = sum(int(g[k, i, j]) << (2000 + int(ea[i] + eb[j]) + c - k * w) for k in range(3))
        want = truth.round_exact(total < 0, abs(total), -2000, fmt)
        if total < 0 and want == 0:
            want = -0.0
        assert same(float(v1[i, j]), want), (i, j)


def _planes_match_exact_products(a, bt, karatsuba=False):
    """Slice A and Bt at the engine's width, run the slice GEMMs as the engine does, and check
    that the digit planes add up exactly (in rationals) to every exact dot product."""
    k = a.shape[1]
    w = ozaki.slice_width(k, karatsuba)
    Ea, la, _ = ozaki.row_stats(a, 53, -1074)
    Eb, lb, _ = ozaki.row_stats(bt, 53, -1074)
    sa, sb = int(ozaki.slices_needed(Ea, la, w).max()), int(ozaki.slices_needed(Eb, lb, w).max())
    if karatsuba:
        sa = sb = max(sa, sb)
    s_a = ozaki.make_slices(a, Ea, sa, w, torch.ones(a.shape[0], dtype=torch.bool))
    s_b = ozaki.make_slices(bt, Eb, sb, w, torch.ones(bt.shape[0], dtype=torch.bool))
    planes = torch.zeros((sa + sb - 1, a.shape[0], bt.shape[0]), dtype=torch.int64)
    ozaki.products(
        s_a, s_b, [], [], planes, lambda d, x, sign: planes[d].add_(x.to(torch.int64), alpha=sign), karatsuba
    )
    ra = [[Fraction(v) for v in row] for row in a.tolist()]
    rb = [[Fraction(v) for v in row] for row in bt.tolist()]
    for i in range(a.shape[0]):
        for j in range(bt.shape[0]):
            e0 = int(Ea[i]) + int(Eb[j]) + 2 - 2 * w
            got = sum(Fraction(int(planes[d, i, j])) * Fraction(2) ** (e0 - d * w) for d in range(sa + sb - 1))
            if got != sum(x * y for x, y in zip(ra[i], rb[j])):
                return False
    return True


@pytest.mark.parametrize("karatsuba", [False, True])
def test_slice_products_add_up_exactly(karatsuba):
    rng = _rng("planes", karatsuba)
    a = _data(rng, (4, 700), "float64", "spread").double()
    bt = _data(rng, (3, 700), "float64", "cancel").double()
    assert _planes_match_exact_products(a, bt, karatsuba)


def _near_top(rng, shape, w, two):
    """Values whose slices at width w are (c0, c1) with c0 + c1 near 1.5 * 2**w and odd
    (``two``), or a single odd slice c0 near 2**w."""
    c0 = 2**w - 2 * rng.integers(1, 2**9, shape)  # even, just below 2**w
    if not two:
        return torch.from_numpy((c0 + 1) * 2.0**-w)
    c1 = 2 ** (w - 1) - 2 * rng.integers(1, 2**9, shape) - 1  # odd, just below 2**(w-1)
    return torch.from_numpy((c0 * 2.0**w + c1) * 2.0 ** (-2 * w))


@pytest.mark.parametrize("karatsuba", [False, True])
def test_wrong_slice_bound_is_caught(monkeypatch, karatsuba):
    """One bit wider than the bound and a slice GEMM must round.

    K = 4095 terms. Plain: odd one-slice integers near 2**21 at width 21 (the bound allows
    20): the first plane sums 4095 odd products near 2**42, an odd integer near 2**54. With
    Karatsuba: two slices c0 + c1 near 1.5 * 2**20 (odd) at width 20 (the bound allows 19):
    the product of the slice sums is an odd integer near 2**53.2. No float64 holds either, so
    whatever order the BLAS adds in, a plane is wrong and the planes no longer add up to the
    exact dot products; at the right width they do."""
    rng = _rng("wrong", karatsuba)
    w_bad = 20 if karatsuba else 21
    a, bt = (_near_top(rng, (3, 4095), w_bad, karatsuba) for _ in range(2))
    assert ozaki.slice_width(4095, karatsuba) == w_bad - 1
    assert _planes_match_exact_products(a, bt, karatsuba)
    right = ozaki.slice_width
    monkeypatch.setattr(ozaki, "slice_width", lambda k, kara=False: right(k, kara) + 1)
    assert not _planes_match_exact_products(a, bt, karatsuba), "a slice width one bit too wide went unnoticed"


def test_sparse_tails():
    """Rows with one tiny element need one more slice: the plan keeps the dense count and
    multiplies that element's tail slice as a sparse matrix."""
    rng = _rng("tails")
    a = torch.from_numpy(rng.standard_normal((40, 200)))
    a[torch.arange(0, 40, 3), 5] *= 2.0**-40
    bt = torch.from_numpy(rng.standard_normal((30, 200)))
    bt[7, 3] *= 2.0**-45
    seen = []
    real = ozaki.products

    def spy(sa, sb, ta, tb, *args):
        seen.append((sa.shape[0], sb.shape[0], len(ta), len(tb)))
        return real(sa, sb, ta, tb, *args)

    ozaki.products = spy
    try:
        got = _gemm(a, bt)
    finally:
        ozaki.products = real
    assert seen and seen[0][2] > 0 and seen[0][3] > 0, seen
    _all_same(got, rk.linear(a, bt, engine="numba"))


# ---------------------------------------------------------------------------- convolutions

CONVS = [
    dict(padding=1),
    dict(stride=2, padding=(1, 2), dilation=(2, 1)),
    dict(padding=1, groups=2),
    dict(padding="same", padding_mode="reflect"),
]


@pytest.mark.parametrize("kw", CONVS, ids=str)
@pytest.mark.parametrize("dtype,kind", [("float32", "spread"), ("float64", "cancel"), ("float16", "special")])
def test_conv2d_blas(kw, dtype, kind):
    rng = _rng("conv", str(kw), dtype, kind)
    x = _data(rng, (2, 4, 7, 9), dtype, kind)
    w = _data(rng, (6, 4 // kw.get("groups", 1), 3, 3), dtype, "normal")
    b = _data(rng, (6,), dtype, "normal")
    got = rk.conv2d(x, w, b, engine="blas", **kw)
    _all_same(got, rk.conv2d(x, w, b, engine="numba", **kw), "blas vs numba")
    _all_same(got, truth.conv2d(x, w, b, **kw), "blas vs truth")


def test_conv_in_chunks_of_images(monkeypatch):
    """A small budget: im2col one image at a time, GEMM tiles inside."""
    monkeypatch.setattr(blas, "MEMORY", 1 << 16)
    rng = _rng("chunks")
    x, w = _data(rng, (3, 3, 10, 10), "float32", "spread"), _data(rng, (5, 3, 3, 3), "float32", "normal")
    assert blas.conv_chunk(3, 64, 27, 1 << 16) == 1
    _all_same(rk.conv2d(x, w, padding=1, engine="blas"), rk.conv2d(x, w, padding=1, engine="numba"))


def test_conv1d_blas():
    rng = _rng("c1")
    x, w = _data(rng, (2, 3, 30), "bfloat16", "cancel"), _data(rng, (4, 3, 5), "bfloat16", "normal")
    _all_same(rk.conv1d(x, w, padding=2, engine="blas"), truth.conv1d(x, w, padding=2))


# ---------------------------------------------------------------------------- choice and errors


def test_auto_rule():
    cuda = torch.device("cuda", 0)
    assert engines.choose("auto", "exact", 1024, 1024, 1024, cuda) == "blas"
    assert engines.choose("auto", "exact", 1024, 1024, 1024) == "numba"  # the CPU: Numba measured faster
    assert engines.choose("auto", "exact", 8, 8, 8, cuda) == "numba"
    assert engines.choose("auto", "exact", 25088, 1, 9, cuda) == "numba"  # depthwise: N = 1
    assert engines.choose("auto", "naive", 1024, 1024, 1024, cuda) == "numba"
    assert engines.choose("blas", "exact", 8, 8, 8) == "blas"
    assert engines.choose("numba", "exact", 1024, 1024, 1024, cuda) == "numba"


def test_errors():
    a = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"^matmul: unknown engine='cuBLAS'; choose one of 'auto'"):
        rk.matmul(a, a, engine="cuBLAS")
    with pytest.raises(ValueError, match=r"^linear: engine='blas' computes accumulate='exact' only"):
        rk.linear(a, a, accumulate="naive", engine="blas")
    with pytest.raises(ValueError, match=r"^conv2d: unknown engine="):
        rk.conv2d(torch.ones(1, 1, 3, 3), torch.ones(1, 1, 1, 1), engine="gpu")


def test_status():
    st = engines.status()
    assert st["numba"]["usable"] and st["numba"]["devices"] == ["cpu"]
    assert st["blas"]["usable"] and st["blas"]["devices"][0] == "cpu"
    assert ("cuda:0" in st["blas"]["devices"]) == torch.cuda.is_available()


def test_non_exact_methods_still_work_with_auto():
    a = torch.randn(40, 40)
    assert torch.equal(rk.matmul(a, a, accumulate="naive"), rk.matmul(a, a, accumulate="naive", engine="numba"))


# ---------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["normal", "spread", "special"])
def test_cuda_matches_cpu(dtype, kind):
    rng = _rng("cuda", dtype, kind)
    a, b = _data(rng, (64, 300), dtype, kind), _data(rng, (300, 48), dtype, kind)
    bias = _data(rng, (48,), dtype, "normal")
    got = rk.linear(a.cuda(), b.T.contiguous().cuda(), bias.cuda(), engine="blas")
    _all_same(got, rk.linear(a, b.T.contiguous(), bias, engine="numba"))
    x, w = _data(rng, (2, 8, 12, 12), dtype, kind), _data(rng, (16, 8, 3, 3), dtype, "normal")
    _all_same(rk.conv2d(x.cuda(), w.cuda(), padding=1, engine="blas"), rk.conv2d(x, w, padding=1, engine="numba"))
