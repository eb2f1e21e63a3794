"""The filtering engine (issue 27): bit-identical to the Numba engine and to refkern.truth on
adversarial inputs, on every path (norm bound, |A||B| bound, element-wise and whole-block exact
paths), its constants pinned by hand, and wrong when its bound is."""

import numpy as np
import pytest
from strategies import same
from test_engines import _all_same, _data, _rng

import refkern as rk
from refkern import engines, truth
from refkern.engines import filter as filt
from refkern.engines import filter_conv

torch = pytest.importorskip("torch")

NARROW = ["float16", "bfloat16", "float32"]
KINDS = ["normal", "spread", "cancel", "subnormal", "special", "zeros"]


def _tensor(x, dtype):
    return torch.from_numpy(np.array(x, np.float64)).to(getattr(torch, dtype))


# ------------------------------------------------------------------------------- the constants


def test_constants_by_hand():
    assert filt.SLACK == pytest.approx(1.015625, abs=0)
    assert filt.M_MIN == pytest.approx(2.0**-960, abs=0)
    assert filt.M_MAX == pytest.approx(2.0**1000, abs=0)
    assert filt.K_MAX == 1099511627776
    assert filt.ABS_GEMM_COST == pytest.approx(0.1, abs=0)
    assert filt.ABS_SAMPLE == 32
    assert filt.TILE_EXACT_MIN == pytest.approx(0.35, abs=0)
    assert engines.FILTER_MIN_WORK == 32768


@pytest.mark.parametrize(
    ("k", "m", "want"),
    [
        (1, 1.0, 2 * 1.015625 * 2.0**-53),  # 2.255140518769849e-16
        (1023, 1.0, 1.1546319456101628e-13),
        (2**20, 3.0, 3.5470327196251983e-10),  # (2**20 + 1) 65 2**-6 2**-53 3
    ],
)
def test_bound_by_hand(k, m, want):
    assert filt.bound(k, m) == pytest.approx(want, abs=0)
    assert filt.bound(k, m) == (k + 1) * 1.015625 * 2.0**-53 * m


def test_the_slack_is_needed_and_enough():
    """decide_one's step 3: c (K + 1) (1 - 2u) - 1.002 - 2u >= 1.005 K (1 + u) + 2**-9 K + 2**-62
    holds for c = 1 + 2**-6 at every K up to K_MAX, and fails for c = 1 (the bound's own rounding
    needs the slack)."""
    u = 2.0**-53
    for k in (1, 2, 1000, 2**20, 2**39):
        lhs = filt.SLACK * (k + 1) * (1 - 2 * u) - 1.002 - 2 * u
        assert lhs >= 1.005 * k * (1 + u) + 2.0**-9 * k + 2.0**-62
    assert not 1.0 * (2**20 + 1) * (1 - 2 * u) - 1.002 >= 1.005 * 2**20 + 2.0**-9 * 2**20


# ---------------------------------------------------------------------- the bound is a real one


def _worst_case(k):
    """(S, s, T): an exact sum S = 1 + 2**-24 + 2**-40 of K + 1 positive terms (T = S), just above
    the float32 midpoint between 1 and 1 + 2**-23, and a float64 value s as far below S as the model
    allows (|s - S| = 0.99 gamma_K T): what some order of additions may return."""
    S = 1 + 2.0**-24 + 2.0**-40
    gamma = k * 2.0**-53 / (1 - k * 2.0**-53)
    return S, S - 0.99 * gamma * S, S


@pytest.mark.parametrize("k", [2**12, 2**16, 2**20])
def test_an_admissible_error_is_never_decided_wrong(k):
    S, s, T = _worst_case(k)
    r = filt.decide_one(s, T, k, 24, -126, 127)
    assert r != r or r == np.float32(S), "a decided element must be the correctly rounded one"


@pytest.mark.parametrize("k", [2**16, 2**18, 2**20])
def test_a_halved_bound_decides_wrong(k):
    """With half the bound (m / 2), the same admissible s is decided, and wrongly: the bound is tight
    enough that halving it breaks the engine (so a test fails if SLACK or bound() is halved)."""
    S, s, T = _worst_case(k)
    r = filt.decide_one(s, T / 2, k, 24, -126, 127)
    assert r == 1.0 and np.float32(S) == np.float32(1 + 2.0**-23)


@pytest.mark.parametrize("k", [2**20])
def test_halved_bound_end_to_end(monkeypatch, k):
    """A 'BLAS' that errs by 0.99 gamma_K T (allowed by the model): the engine stays exact; with the
    norms halved (half the bound) it returns a wrong float32 result."""
    S, s, T = _worst_case(k)
    a = np.zeros((1, k), np.float32)
    a[0, 0] = 1
    a[0, 1] = 2.0**-24
    a[0, 2] = 2.0**-40
    b = np.zeros((k, 1), np.float32)
    b[:3, 0] = 1
    a[0, 3] = -0.0  # marks the value GEMM (|A| has no -0)
    # T = S, and the norm product ||a|| ||b|| = sqrt(1 + ...) sqrt(3) > T: use the tight bound path
    real_mm = filt._device_gemm(None)

    def bad_mm(device):
        def mm(x, bt, out=None):
            r = real_mm(x, bt, out)
            if np.signbit(x).any():  # the value GEMM (not |A||B|): err as far as the model allows
                r[...] = np.where(r > 0.5, s, r)
            return r

        return mm

    monkeypatch.setattr(filt, "_device_gemm", bad_mm)
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import matmul_operands

    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(p)
    v, mag = filt.gemm(p, A3, Bt3, ia, ib, None, shape, want_mag=True)
    assert np.float32(v[0, 0]) == np.float32(S)
    monkeypatch.setattr(filt, "_norms", lambda X: np.sqrt(np.einsum("...k,...k->...", X, X)) / 2)
    v = filt.gemm(p, A3, Bt3, ia, ib, None, shape)[0]  # the norm path, halved: T / 2 < m
    assert np.float32(v[0, 0]) != np.float32(S)


# ---------------------------------------------------------------- bit-identical to truth, numba


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("kind", KINDS)
def test_matmul_filter_equals_numba_and_truth(dtype, kind):
    rng = _rng("filter-mm", dtype, kind)
    a, b = _data(rng, (9, 40), dtype, kind), _data(rng, (40, 7), dtype, kind)
    got = rk.matmul(a, b, engine="filter")
    assert got.dtype == a.dtype and got.shape == (9, 7)
    _all_same(got, rk.matmul(a, b, engine="numba"), "filter vs numba")
    _all_same(got, truth.matmul(a, b), "filter vs truth")


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("kind", ["normal", "spread", "cancel", "special", "zeros"])
def test_linear_with_bias(dtype, kind):
    rng = _rng("filter-lin", dtype, kind)
    x, w = _data(rng, (2, 5, 33), dtype, kind), _data(rng, (6, 33), dtype, kind)
    b = _data(rng, (6,), dtype, kind if kind != "special" else "normal")
    got = rk.linear(x, w, b, engine="filter")
    _all_same(got, rk.linear(x, w, b, engine="numba"), "filter vs numba")
    _all_same(got, truth.linear(x, w, b), "filter vs truth")


def _midpoint_rows(dtype):
    """Rows (A, b = ones) whose exact sums sit on or next to rounding boundaries of ``dtype``: a
    midpoint exactly (a tie, both parities), a midpoint +- 2**-60 reached through cancellation of
    2**40 (the float64 GEMM loses the small terms), a binade edge, subnormal results (half the
    smallest subnormal: a tie to 0; and just above it), and overflow (the midpoint between the
    largest finite number and the overflow threshold, and just below it)."""
    fin = torch.finfo(getattr(torch, dtype))
    p = {"float32": 24, "bfloat16": 8, "float16": 11}[dtype]
    h = 2.0**-p  # half an ulp of 1
    big = 2.0**40 if dtype != "float16" else 2.0**14
    tiny = 2.0**-60 if dtype != "float16" else 2.0**-20
    sub = fin.smallest_normal * 2.0 ** -(p - 1)  # the smallest subnormal
    mx = fin.max
    emax = int(np.log2(mx))
    rows = [
        [1, h],  # tie: to even (1)
        [1 + 2 * h, h],  # tie: to even (1 + 4h)
        [big, 1, h, tiny, -big],  # midpoint + tiny, through cancellation: up
        [big, 1, h, -tiny, -big],  # midpoint - tiny: down
        [2, -h / 2],  # just below a binade edge
        [sub / 2],  # half the smallest subnormal (a product): a tie to +0
        [sub / 2, sub / 4],  # above it: the smallest subnormal
        [-sub / 2, -sub / 4],
        [mx, 2.0 ** (emax - p)],  # the midpoint between max and the overflow threshold: to even, inf
        [mx, 2.0 ** (emax - p) - 2.0 ** (emax - 2 * p)],  # just below it: max
    ]
    k = max(len(r) for r in rows)
    A = np.zeros((len(rows), k))
    for i, r in enumerate(rows):
        A[i, : len(r)] = r
    return A


@pytest.mark.parametrize("dtype", NARROW)
def test_rounding_boundaries(dtype):
    """Sums on and next to the boundaries; each term t = x y with x and y exact in ``dtype`` (the
    exponent split in halves)."""
    A = _midpoint_rows(dtype)
    # each term t as the product of two format values: split the exponent (both halves exact)
    e = np.where(A != 0, np.floor(np.log2(np.abs(np.where(A != 0, A, 1)))), 0)
    half = np.floor(e / 2)
    x, y = A / 2.0**half, np.broadcast_to(2.0**half, A.shape)
    xt, yt = _tensor(x, dtype), _tensor(y, dtype)
    assert torch.equal(xt.double() * yt.double(), torch.from_numpy(A)), "the terms must be exact products"
    # row i of the result: sum_k x[i, k] y[i, k]: a batched matmul of (R, 1, K) by (R, K, 1)
    a, b = xt[:, None, :], yt[:, :, None]
    got = rk.matmul(a, b, engine="filter")
    _all_same(got, rk.matmul(a, b, engine="numba"), "filter vs numba")
    _all_same(got, truth.matmul(a, b), "filter vs truth")


@pytest.mark.parametrize("dtype", NARROW)
def test_overflowing_and_signed_zero_results(dtype):
    fin = torch.finfo(getattr(torch, dtype))
    big = float(fin.max) / 2
    a = _tensor([[big, big, big], [-0.0, 0.0, -0.0], [1.0, -1.0, 0.0], [-big, -big, -big]], dtype)
    b = _tensor([[1.0, 0.0], [1.0, -0.0], [1.0, 1.0]], dtype)
    got = rk.matmul(a, b, engine="filter")
    _all_same(got, truth.matmul(a, b))
    _all_same(got, rk.matmul(a, b, engine="numba"))
    assert torch.isinf(got[0, 0]) and torch.signbit(got[1, 1])  # -0 * 0 + 0 * -0 + -0 * 1: every term -0


def test_k_2_to_the_20():
    """1 x 2**20 by 2**20 x 1 with wide spread and near-exact cancellation: against the integer sum."""
    from refkern.accumulate.formats import FLOAT32

    k = 2**20
    rng = _rng("filter-bigk")
    x = rng.standard_normal(k) * 2.0 ** rng.integers(-20, 21, k)
    y = rng.standard_normal(k)
    x[1::2] = -x[0::2] * (1 + 2.0**-22)
    y[1::2] = y[0::2]
    a = torch.from_numpy(x.astype(np.float32))[None]
    b = torch.from_numpy(y.astype(np.float32))[:, None]
    got = rk.matmul(a, b, engine="filter")
    _all_same(got, rk.matmul(a, b, engine="numba"), "filter vs numba")
    p = a[0].double().numpy() * b[:, 0].double().numpy()
    m, e = np.frexp(p)
    mi = (m * 2.0**53).astype(np.int64)
    emin = int(e.min()) - 53
    total = sum(int(v) << int(s) for v, s in zip(mi.tolist(), (e - 53 - emin).tolist()))
    assert same(float(got[0, 0]), truth.round_exact(total < 0, abs(total), emin, FLOAT32))


def test_k_2_to_the_20_decided_by_the_bound():
    """K = 2**20 of well-conditioned terms: the bound decides (no exact path), and rightly."""
    k = 2**20
    rng = _rng("filter-bigk-pos")
    a = torch.from_numpy(np.abs(rng.standard_normal((2, k))).astype(np.float32))
    b = torch.from_numpy(np.abs(rng.standard_normal((k, 3))).astype(np.float32))
    _all_same(rk.matmul(a, b, engine="filter"), rk.matmul(a, b, engine="numba"))


# ------------------------------------------------------------------------------ every path


@pytest.mark.parametrize("abs_min", [0.0, 0.1, 2.0])
@pytest.mark.parametrize("tile_min", [0.0, 0.35, 2.0])
@pytest.mark.parametrize("bias", [False, True])
def test_every_path(monkeypatch, abs_min, tile_min, bias):
    """The |A||B| GEMM always / by the rule / never, the whole block by the Numba kernel always / by
    the rule / never, with blocks of 8 rows, inf and NaN rows: all bit-identical to numba."""
    monkeypatch.setattr(filt, "ABS_GEMM_COST", abs_min)
    monkeypatch.setattr(filt, "TILE_EXACT_MIN", tile_min)
    monkeypatch.setattr(filt, "ROW_BLOCK", 8)
    rng = _rng("filter-paths", abs_min, tile_min, bias)
    x = _data(rng, (37, 60), "float32", "cancel")
    w = _data(rng, (29, 60), "float32", "spread")
    x[3, 7] = np.inf
    w[5, 1] = np.nan
    x[10:14] = -0.0
    b = _data(rng, (29,), "float32", "zeros") if bias else None
    _all_same(rk.linear(x, w, b, engine="filter"), rk.linear(x, w, b, engine="numba"))


def test_tight_bound_where_the_norms_are_loose():
    """Large entries of a meet small ones of b: ||a|| ||b|| is 2**20 times sum |a b|, the norm bound
    decides nothing, the sampled sum |terms| predicts that the |A||B| GEMM decides nearly all: it
    runs, and the rest is exact."""
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import matmul_operands, run_numba

    rng = _rng("filter-loose")
    a = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((128, 48)).astype(np.float32)
    a[:, :64] *= 2.0**20
    b[:64] *= 2.0**-20
    b[64:] *= 2.0**20  # a's small half meets b's large half: the products stay of one size
    a[:, 64:] *= 2.0**-20
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(p)
    st = {}
    got = filt.gemm(p, A3, Bt3, ia, ib, None, shape, stats=st)[0]
    assert st["undecided_first"] == st["elements"] and st["abs_gemm_rows"] == 64
    assert st.get("exact_elements", 0) < 0.01 * st["elements"]
    _all_same(torch.from_numpy(got), torch.from_numpy(run_numba(p, A3, Bt3, ia, ib, None, shape)[0]))


def test_no_tight_gemm_where_terms_cancel():
    """Condition numbers near 1 / (K u): the sample predicts the |A||B| GEMM decides nothing; it does
    not run (the engine costs the exact path plus one GEMM)."""
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import matmul_operands

    rng = _rng("filter-cancel-rule")
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.standard_normal((64, 32)).astype(np.float32)
    a = np.concatenate([x, -(x * np.float32(1 + 2.0**-22))], axis=1)
    b = np.concatenate([y, y], axis=0)
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(p)
    st = {}
    filt.gemm(p, A3, Bt3, ia, ib, None, shape, stats=st)
    assert st["undecided_first"] > 0.9 * st["elements"] and "abs_gemm_rows" not in st


def test_parallel_exact_path(monkeypatch):
    monkeypatch.setattr(filt, "PARALLEL_TERMS", 1)
    rng = _rng("filter-par")
    a, b = _data(rng, (20, 50), "bfloat16", "cancel"), _data(rng, (50, 10), "bfloat16", "cancel")
    _all_same(rk.matmul(a, b, engine="filter"), rk.matmul(a, b, engine="numba"))


def test_batched_and_broadcast_matmul():
    rng = _rng("filter-batch")
    a, b = _data(rng, (2, 1, 5, 30), "float32", "spread"), _data(rng, (3, 30, 4), "float32", "cancel")
    got = rk.matmul(a, b, engine="filter")
    assert got.shape == (2, 3, 5, 4)
    _all_same(got, rk.matmul(a, b, engine="numba"))
    v = _data(rng, (30,), "float16", "normal")
    _all_same(rk.matmul(v, v, engine="filter"), rk.matmul(v, v, engine="numba"))


@pytest.mark.parametrize("k", [0, 1, 2])
def test_tiny_reductions(k):
    a, b = torch.ones(3, k), -torch.ones(k, 2)
    _all_same(rk.matmul(a, b, engine="filter"), rk.matmul(a, b, engine="numba"))


CONVS = [
    ((2, 6, 9, 11), (8, 6, 3, 3), dict(padding=1)),
    ((2, 6, 9, 11), (8, 3, 3, 2), dict(stride=2, groups=2, dilation=(1, 2))),
    ((2, 4, 10, 10), (4, 1, 3, 3), dict(groups=4, padding="same", padding_mode="reflect")),
]


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("kind", ["normal", "cancel", "special", "zeros"])
def test_conv2d_filter(monkeypatch, case, dtype, kind):
    """Both stride-1 paths (im2col below SHIFT_MIN, the shifted taps with it 0) against the Numba kernel."""
    xs, ws, kw = CONVS[case]
    rng = _rng("filter-conv", case, dtype, kind)
    x, w, b = _data(rng, xs, dtype, kind), _data(rng, ws, dtype, "normal"), _data(rng, ws[:1], dtype, "zeros")
    got = rk.conv2d(x, w, b, engine="filter", **kw)
    _all_same(got, rk.conv2d(x, w, b, engine="numba", **kw), "filter vs numba")
    monkeypatch.setattr(filter_conv, "SHIFT_MIN", 0)
    _all_same(rk.conv2d(x, w, b, engine="filter", **kw), got, "shifted taps vs im2col")
    if case == 0 and kind in ("cancel", "special"):
        _all_same(got, truth.conv2d(x, w, b, **kw), "filter vs truth")


def test_conv1d_conv3d_and_chunks(monkeypatch):
    rng = _rng("filter-conv13")
    x, w = _data(rng, (3, 4, 20), "float32", "cancel"), _data(rng, (6, 4, 3), "float32", "normal")
    _all_same(rk.conv1d(x, w, padding=2, engine="filter"), rk.conv1d(x, w, padding=2, engine="numba"))
    x, w = _data(rng, (2, 3, 5, 6, 7), "bfloat16", "spread"), _data(rng, (4, 3, 2, 3, 3), "bfloat16", "normal")
    monkeypatch.setattr(filter_conv, "MEMORY", 1)  # one image per im2col chunk
    kw = dict(stride=(1, 2, 1), padding=1)
    _all_same(rk.conv3d(x, w, engine="filter", **kw), rk.conv3d(x, w, engine="numba", **kw))


@pytest.mark.parametrize("abs_min", [0.0, 2.0])
@pytest.mark.parametrize("tile_min", [0.0, 2.0])
@pytest.mark.parametrize("stride,shift_min", [(1, 0), (1, 1 << 60), (2, 0)])
def test_conv_every_path(monkeypatch, abs_min, tile_min, stride, shift_min):
    """The shifted-tap convolution (stride 1, forced by SHIFT_MIN = 0) and im2col (stride 1 below
    SHIFT_MIN, stride 2) through the |A||B| bound and the whole-block Numba path, forced, with a
    per-channel bias and dilation."""
    monkeypatch.setattr(filter_conv, "SHIFT_MIN", shift_min)
    monkeypatch.setattr(filt, "ABS_GEMM_COST", abs_min)
    monkeypatch.setattr(filt, "TILE_EXACT_MIN", tile_min)
    monkeypatch.setattr(filt, "ROW_BLOCK", 3)
    rng = _rng("filter-conv-paths", abs_min, tile_min, stride, shift_min)
    x, w = _data(rng, (2, 6, 9, 11), "float32", "cancel"), _data(rng, (8, 3, 3, 2), "float32", "spread")
    b = _data(rng, (8,), "float32", "zeros")
    kw = dict(stride=stride, groups=2, dilation=(2, 1), padding=(1, 2))
    _all_same(rk.conv2d(x, w, b, engine="filter", **kw), rk.conv2d(x, w, b, engine="numba", **kw))


CONVTS = [
    (2, (2, 6, 5, 7), (6, 4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    (2, (2, 6, 5, 7), (6, 2, 2, 3), dict(stride=(2, 1), groups=3, dilation=(1, 2))),
    (2, (1, 4, 6, 6), (4, 3, 3, 3), dict(padding=2)),
    (1, (2, 4, 9), (4, 3, 4), dict(stride=3, padding=1)),
    (3, (1, 3, 3, 4, 4), (3, 2, 2, 3, 3), dict(stride=(2, 1, 2), padding=(0, 1, 1))),
    (2, (3, 5, 5), (3, 4, 3, 3), dict(stride=2)),
]


@pytest.mark.parametrize("case", range(len(CONVTS)))
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("kind", ["normal", "cancel", "special", "zeros"])
def test_conv_transpose_filter(case, dtype, kind):
    """The zero-inserted convolution: values, inf/NaN inputs (0 * inf) and signed zero results
    (an all -0 input: the zeros inserted must not turn -0 into +0) as the Numba kernel gives them."""
    nd, xs, ws, kw = CONVTS[case]
    rng = _rng("filter-convt", case, dtype, kind)
    x, w = _data(rng, xs, dtype, kind), _data(rng, ws, dtype, "normal")
    b = _data(rng, (ws[1] * kw.get("groups", 1),), dtype, "zeros")
    f = getattr(rk, f"conv_transpose{nd}d")
    for bias in (None, b):
        _all_same(f(x, w, bias, engine="filter", **kw), f(x, w, bias, engine="numba", **kw), "filter vs numba")
    xz = torch.zeros_like(x).neg()
    _all_same(f(xz, w, engine="filter", **kw), f(xz, w, engine="numba", **kw), "-0 input")
    if case == 0 and kind == "cancel":
        _all_same(f(x, w, b, engine="filter", **kw), truth.conv_transpose2d(x, w, b, **kw), "filter vs truth")


def test_conv_chunk():
    assert filter_conv.conv_chunk(8, 3136, 576, 1 << 28) == 8
    assert filter_conv.conv_chunk(64, 3136, 576, 1 << 28) == 18  # 2**28 // (8 * 3136 * 576)
    assert filter_conv.conv_chunk(8, 3136, 576, 1) == 1


def test_magnitudes_for_the_verdict(monkeypatch):
    """run_gemm / run_conv with want_mag (the verdict's path): the filter's magnitudes are sum|terms|
    within gamma_K of the Numba kernel's, its values identical."""
    from refkern.kernels import conv, gemm
    from refkern.kernels._common import plan

    rng = _rng("filter-mag")
    a, b = _data(rng, (40, 70), "float32", "cancel"), _data(rng, (70, 30), "float32", "normal")
    p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    ops = gemm.matmul_operands(p)
    v1, m1 = filt.gemm(p, *ops[:4], None, ops[4], want_mag=True)
    v2, m2 = gemm.run_numba(p, *ops[:4], None, ops[4], want_mag=True)
    _all_same(torch.from_numpy(v1), torch.from_numpy(v2))
    assert np.all(np.abs(m1 - m2) <= 2 * 71 * 2.0**-53 * m2)
    x, w, bb = _data(rng, (2, 6, 9, 9), "float16", "normal"), _data(rng, (8, 6, 3, 3), "float16", "normal"), None
    p = plan("conv2d", {"x": x, "weight": w, "bias": bb}, ("x", "weight"), "exact", None)
    c = conv.conv_operands(p, 2, 1, 1, 1, 1, "zeros")
    v2, m2 = conv.run_conv_numba(p, c, want_mag=True)
    for shift_min in (1 << 60, 0):  # im2col, then the shifted taps (one batched |A||B| product per tap)
        monkeypatch.setattr(filter_conv, "SHIFT_MIN", shift_min)
        v1, m1 = filter_conv.conv(p, c, want_mag=True)
        _all_same(torch.from_numpy(v1), torch.from_numpy(v2))
        assert np.all(np.abs(m1 - m2) <= 2 * 55 * 2.0**-53 * m2)


# --------------------------------------------------------------------------- choice, errors


def test_auto_picks_the_filter_for_narrow_exact_gemms():
    assert engines.choose("auto", "exact", 64, 64, 64, None, filterable=True) == "filter"
    assert engines.choose("auto", "exact", 8, 8, 8, None, filterable=True) == "numba"  # below FILTER_MIN_WORK
    assert engines.choose("auto", "exact", 64, 64, 64, None, filterable=False) == "numba"  # float64
    assert engines.choose("auto", "other", 64, 64, 64, None, filterable=True) == "numba"
    assert engines.choose("filter", "exact", 2, 2, 2, None, filterable=False) == "numba"  # named, float64


def test_float64_inputs_keep_an_exact_path():
    rng = _rng("filter-f64")
    a, b = _data(rng, (9, 40), "float64", "cancel"), _data(rng, (40, 7), "float64", "cancel")
    _all_same(rk.matmul(a, b, engine="filter"), truth.matmul(a, b))


def test_errors():
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"^matmul: engine='filter' computes accumulate='exact' only"):
        rk.matmul(a, a, engine="filter", accumulate="naive")
    with pytest.raises(ValueError, match=r"^matmul: unknown engine='fast'; choose one of 'auto', 'blas', 'filter'"):
        rk.matmul(a, a, engine="fast")


# ------------------------------------------------------------------------------ self-test


def test_self_test_passes_here():
    ok, detail = filt.self_test()
    assert ok, detail


def test_self_test_catches_a_float32_blas(monkeypatch):
    def f32(device):
        def mm(a, bt, out=None):
            r = np.matmul(a.astype(np.float32), np.swapaxes(bt, -1, -2).astype(np.float32)).astype(np.float64)
            if out is not None:
                out[...] = r
                return out
            return r

        return mm

    monkeypatch.setattr(filt, "_device_gemm", f32)
    ok, detail = filt.self_test()
    assert not ok and "reduced precision" in detail


def test_status_reports_the_filter():
    st = engines.status()["filter"]
    assert st["usable"] and "self-test passed" in st["detail"]


def test_doctor_reports_the_filter_and_its_self_test(capsys):
    from refkern.cli import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "engine filter    usable on cpu; numpy " in out and "self-test passed: float64 GEMM: exact" in out


# ----------------------------------------------- the decision as torch ops (filter_device), on CPU tensors


def _operands(a, b, bias=None):
    """(p, A3, Bt3, ia, ib, bias64, shape) of matmul(a, b) or, with a bias, linear(a, b^T, bias)."""
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import linear_operands, matmul_operands

    if bias is None:
        p = plan("matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
        A3, Bt3, ia, ib, shape = matmul_operands(p)
        return p, A3, Bt3, ia, ib, None, shape
    w = b.T.contiguous()
    p = plan("linear", {"x": a, "weight": w, "bias": bias}, ("x", "weight"), "exact", None)
    X, W, b64, shape = linear_operands(p)
    zero = np.zeros(1, np.int64)
    return p, X, W, zero, zero, b64, shape


def _adversarial():
    """(name, a, b, bias) over tests/test_filter.py's adversarial set: every kind and format, the
    rounding-boundary rows (ties, cancellation onto a midpoint, binade edge, subnormal, overflow), signed
    zeros and overflow, a bias, a wide exponent spread."""
    cases = []
    for dtype in NARROW:
        for kind in KINDS:
            rng = _rng("filter-device", dtype, kind)
            cases.append((f"{dtype} {kind}", _data(rng, (9, 40), dtype, kind), _data(rng, (40, 7), dtype, kind), None))
            if kind != "special":
                cases.append((f"{dtype} {kind} bias", _data(rng, (9, 33), dtype, kind), _data(rng, (33, 6), dtype, kind),
                              _data(rng, (6,), dtype, kind)))  # fmt: skip
        A = _midpoint_rows(dtype)
        e = np.where(A != 0, np.floor(np.log2(np.abs(np.where(A != 0, A, 1)))), 0)
        half = np.floor(e / 2)
        x, y = _tensor(A / 2.0**half, dtype), _tensor(np.broadcast_to(2.0**half, A.shape), dtype)
        cases.append((f"{dtype} boundaries", x[:, None, :], y[:, :, None], None))
        big = float(torch.finfo(getattr(torch, dtype)).max) / 2
        a = _tensor([[big, big, big], [-0.0, 0.0, -0.0], [1.0, -1.0, 0.0], [-big, -big, -big]], dtype)
        cases.append((f"{dtype} overflow, signed zeros", a, _tensor([[1.0, 0.0], [1.0, -0.0], [1.0, 1.0]], dtype), None))
    return cases


def _both_decisions(a, b, bias):
    """On the same float64 GEMM values and norms (torch on the CPU): (device R, device undecided, decide_one's
    values, decide_one's undecided mask, the exact result, the format's name), all (T, M, N)."""
    from refkern.engines import filter_device as fd

    p, A3, Bt3, ia, ib, b64, shape = _operands(a, b, bias)
    A, B = torch.from_numpy(A3[ia]), torch.from_numpy(np.ascontiguousarray(Bt3[ib]))
    V, na, nb = fd.value_gemm(A, B), fd.norms(A), fd.norms(B)
    nt, m, n = V.shape
    name = p.out.name
    bt = None if b64 is None else torch.from_numpy(b64.copy())
    R, und = fd.decide_gemm(V.clone(), na, nb, A.shape[2], name, bt)
    Vc = V.numpy().copy()
    und_c, counts = np.empty(Vc.shape, np.uint8), np.empty((nt, m), np.int64)
    bcol = np.zeros(n) if b64 is None else b64
    rng = np.arange(nt)
    filt._decide(Vc, na.numpy(), nb.numpy(), rng, rng, np.zeros(m), bcol, A.shape[2], *p.work.params, und_c, counts)
    exact = (truth.matmul(a, b) if bias is None else truth.linear(a, b.T.contiguous(), bias)).double()
    return R, und, Vc, und_c.astype(bool), exact.numpy().reshape(nt, m, n), name


@pytest.mark.parametrize("case", _adversarial(), ids=lambda c: c[0])
def test_device_decision_is_exact_and_never_bolder_than_decide_one(case):
    """The device decision on CPU tensors: (a) every element it decides is the exact result, bit for
    bit (refkern.truth); (b) it decides no element decide_one leaves undecided on the same values, to
    the same value (it is slightly more conservative: bfloat16 / float16 ends whose float32 value has a
    midpoint's bit pattern, float16's subnormal range; the module docstring)."""
    _, a, b, bias = case
    R, und, Vc, und_c, exact, name = _both_decisions(a, b, bias)
    got = R.double().numpy()
    dec = ~und.numpy()
    assert np.array_equal(got[dec].view(np.int64), exact[dec].view(np.int64)), "a decided element is not exact"
    assert not (dec & und_c).any(), "decided an element decide_one leaves undecided"
    assert np.array_equal(got[dec].view(np.int64), Vc[dec].view(np.int64))
    if name == "float32":  # only the folded constant's 8 steps separate them: the same elements here
        assert (dec == ~und_c).all()


def test_device_decision_decides_most_elements():
    """Gaussian data: the device decides what decide_one decides (so the tests above can fail)."""
    rng = _rng("filter-device-most")
    for dtype in NARROW:
        a, b = _data(rng, (64, 256), dtype, "normal"), _data(rng, (256, 48), dtype, "normal")
        _, und, _, und_c, _, _ = _both_decisions(a, b, None)
        assert (~und_c).sum() > 0.9 * und_c.size
        assert (~und.numpy()).sum() >= 0.99 * (~und_c).sum()


def test_device_scale_by_hand():
    from refkern.engines import filter_device as fd

    c = (1023 + 1) * 1.015625 * 2.0**-53  # K = 1023: 1.1546319456101628e-13, exact
    assert fd.scale(1023) == c + 8 * 2.0**-95  # ulp(c) = 2**-95 (c in [2**-43, 2**-42)): 8 steps
    assert fd.scale(1023) >= c * (1 + 8 * 2.0**-53)
    assert fd.CHUNK == 33554432 and fd.EXACT_TERM_S == pytest.approx(2.5e-9, abs=0)
    assert fd.TIGHT_SHARE == pytest.approx(0.3633802276324186, abs=0)  # 1 - 2 / pi
    # the rule by hand: one 4096-row GEMM of 2.5 ms against 4,000 elements of K = 4096 on 16 threads
    assert not fd.tight_pays(4000, 4096, 4096, 4096, 2.5e-3, 4096, 16)  # 0.36 * 4000 * 0.64 us = 0.93 ms
    assert fd.tight_pays(12000, 4096, 4096, 4096, 2.5e-3, 4096, 16)  # 2.8 ms


def test_double_rounding_trap_for_bfloat16_and_float16():
    """torch rounds float64 to bfloat16 / float16 through float32 (twice): 1 + 2**-8 + 2**-30 gives 1
    in bfloat16, the correct rounding is 1 + 2**-7. The device decision must not decide it so."""

    for dtype, p in (("bfloat16", 8), ("float16", 11)):
        x = 1 + 2.0**-p + 2.0**-30
        assert torch.tensor([x], dtype=torch.float64).to(getattr(torch, dtype)).item() == 1.0  # torch's two roundings
        a = _tensor([[1.0, 2.0**-p, 2.0**-15]], dtype)
        b = _tensor([[1.0], [1.0], [2.0**-15]], dtype)
        R, und, _, _, exact, _ = _both_decisions(a, b, None)
        assert exact[0, 0, 0] == 1 + 2.0 ** (1 - p)
        assert und[0, 0, 0] or R.double()[0, 0, 0] == exact[0, 0, 0]
        st = {}
        got = filt.device_values(*_operands(a, b)[:6], False, torch.device("cpu"), st)[0]
        assert got[0, 0, 0] == 1 + 2.0 ** (1 - p)
        assert st["undecided_first"] == 1 and st["undecided_rounded_once"] == 0  # decided by round_once


@pytest.mark.parametrize("k", [2**16, 2**18, 2**20])
def test_device_halved_bound_decides_wrong(k):
    """_worst_case's admissible s: undecided or right with the bound; decided, and wrongly, with half."""
    from refkern.engines import filter_device as fd

    S, s, T = _worst_case(k)
    V = torch.tensor([[[s]]], dtype=torch.float64)
    one = torch.ones((1, 1), dtype=torch.float64)
    R, und = fd.decide_gemm(V.clone(), one * T, one, k, "float32")
    assert und.item() or R.item() == np.float32(S)
    R, und = fd.decide_gemm(V.clone(), one * T / 2, one, k, "float32")
    assert not und.item() and R.item() == 1.0 != np.float32(S)


def test_device_halved_bound_end_to_end(monkeypatch):
    """A 'BLAS' erring by 0.99 gamma_K T (the model allows it): the device path stays exact; with its
    bound halved (fd.scale / 2) it returns a wrong float32 result."""
    from refkern.engines import filter_device as fd

    k = 2**20
    S, s, T = _worst_case(k)
    a = np.zeros((1, k), np.float32)
    a[0, :3] = 1, 2.0**-24, 2.0**-40
    a[0, 3] = -0.0  # marks the value GEMM (|A| has no -0)
    b = np.zeros((k, 1), np.float32)
    b[:3, 0] = 1
    real = fd.value_gemm

    def bad(A, B):
        r = real(A, B)
        return torch.where(r > 0.5, s, r) if torch.signbit(A).any() else r

    monkeypatch.setattr(fd, "value_gemm", bad)
    args = _operands(a, b)
    v = filt.device_values(*args[:6], False, torch.device("cpu"))[0]
    assert np.float32(v[0, 0, 0]) == np.float32(S)
    half = fd.scale
    monkeypatch.setattr(fd, "scale", lambda kk: half(kk) / 2)
    v = filt.device_values(*args[:6], False, torch.device("cpu"))[0]
    assert np.float32(v[0, 0, 0]) != np.float32(S)


def _device_gemm_equals_truth(a, b, bias=None, want_mag=False, stats=None):
    p, A3, Bt3, ia, ib, b64, shape = _operands(a, b, bias)
    v, mag = filt.device_values(p, A3, Bt3, ia, ib, b64, want_mag, torch.device("cpu"), stats)
    want = truth.matmul(a, b) if bias is None else truth.linear(a, b.T.contiguous(), bias)
    _all_same(torch.from_numpy(v.reshape(shape)).to(want.dtype), want, "device path vs truth")
    return v.reshape(shape), (None if mag is None else mag.reshape(shape))


@pytest.mark.parametrize("case", _adversarial(), ids=lambda c: c[0])
def test_device_path_equals_truth(case):
    """filter.device_values (the path refkern.matmul takes for a CUDA tensor) on CPU tensors, exact path
    included."""
    _device_gemm_equals_truth(*case[1:])


def test_device_paths_tight_chunks_blocks_and_magnitudes(monkeypatch):
    """Every route: the |A| |B| bound over the rows holding undecided elements (forced), chunks of a few
    rows and of several batch elements, filter's whole-block rule for many undecided elements, and the
    magnitudes for the verdict (within gamma_K of numpy's |A| |B|^T + |bias|)."""
    from refkern.engines import filter_device as fd

    rng = _rng("filter-device-paths")
    x = rng.standard_normal((40, 64)).astype(np.float32)
    y = rng.standard_normal((64, 30)).astype(np.float32)
    x[:, :32] *= 2.0**12  # large entries of a meet small ones of b: norms 2**12 * 32 / 51 times sum |a b|
    y[:32] *= 2.0**-12
    a, b = torch.from_numpy(x), torch.from_numpy(y)
    bias = torch.from_numpy(rng.standard_normal(30).astype(np.float32))
    monkeypatch.setattr(fd, "tight_pays", lambda *args: True)
    st = {}
    _device_gemm_equals_truth(a, b, bias, stats=st)
    assert st["abs_gemm_rows"] > 0 and st["undecided_after_tight"] < st["undecided_first"] / 10, st
    x[:, 1::2] = -x[:, ::2]  # cancelling pairs of terms, and one small term: sum 2**-30 y[63]
    y[1::2] = y[::2]
    x[:, 62], x[:, 63] = 0, 2.0**-30  # condition numbers about 2**35: every element undecided
    monkeypatch.setattr(fd, "CHUNK", 50)  # 1 row of 30 per chunk; below, 3 batch elements of 4 x 4 per chunk
    _device_gemm_equals_truth(a, b, bias)
    _device_gemm_equals_truth(torch.from_numpy(x[:24, :4].reshape(6, 4, 4)), torch.from_numpy(y[:4, :4].copy()))
    monkeypatch.setattr(filt, "ROW_BLOCK", 8)  # 0.35 * 8 * 30 = 84 undecided: filter's block rule
    st = {}
    v, mag = _device_gemm_equals_truth(a, b, want_mag=True, stats=st)
    assert st.get("numba_block_elements", 0) > 0, st
    want = np.abs(x).astype(np.float64) @ np.abs(y).astype(np.float64)
    assert np.all(np.abs(mag - want) <= 2 * 65 * 2.0**-53 * want)
    v, mag = _device_gemm_equals_truth(a, b, bias, want_mag=True)
    assert np.all(np.abs(mag - want - np.abs(bias.double().numpy())) <= 2 * 66 * 2.0**-53 * mag)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_round_once_is_one_rounding(dtype):
    """round_once (round to odd to float32, then to nearest) against refkern's round_to on values where
    two roundings go wrong: midpoints of the format plus or minus a float64 ulp and 2**-30, ties, float32
    midpoints, subnormal results, the overflow threshold, zeros, inf and NaN; random values too."""
    from refkern.accumulate.formats import round_array
    from refkern.engines import filter_device as fd

    fin = torch.finfo(getattr(torch, dtype))
    p, emin, emax = {"bfloat16": (8, -126, 127), "float16": (11, -14, 15)}[dtype]
    mids = [1 + 2.0**-p, 1 + 3 * 2.0**-p, 2 - 2.0 ** (-p - 1), float(fin.max) + 2.0 ** (emax - p),
            float(fin.smallest_normal) * (1 + 2.0**-p), float(fin.smallest_normal) * 2.0 ** -p * 1.5,
            float(fin.smallest_normal) * 2.0**-p / 2]  # fmt: skip
    xs = [0.0, -0.0, np.inf, -np.inf, float(fin.max), 1.0 + 2.0**-24 + 2.0**-40]
    for m in mids:
        for d in (0.0, 2.0**-30 * m, -(2.0**-30) * m, np.spacing(m), -np.spacing(m), 2.0**-25 * m):
            xs += [m + d, -(m + d)]
    rng = _rng("round-once", dtype)
    xs += list(rng.standard_normal(2000) * 2.0 ** rng.integers(emin - p - 2, emax + 2, 2000))
    x = np.array(xs)
    got = fd.round_once(torch.from_numpy(x), dtype).double().numpy()
    want = round_array(x, p, emin, emax)
    assert np.array_equal(got.view(np.int64), want.view(np.int64)), x[got.view(np.int64) != want.view(np.int64)][:5]
    assert np.isnan(fd.round_once(torch.tensor([np.nan], dtype=torch.float64), dtype).item())
    t = torch.tensor([1 + 2.0**-p + 2.0**-30], dtype=torch.float64)
    assert t.to(getattr(torch, dtype)).item() == 1.0 and fd.round_once(t, dtype).item() == 1 + 2.0 ** (1 - p)


@pytest.mark.parametrize("dtype", NARROW)
def test_device_run_decides_once_what_looked_like_midpoints(dtype):
    """Gaussian products: the second, one-rounding look at the undecided elements of a bfloat16 or
    float16 result decides those whose float32 end only looked like a midpoint, never one decide_one
    leaves undecided, and the results are exact."""
    from refkern.engines import filter_device as fd

    rng = _rng("filter-device-once", dtype)
    a, b = _data(rng, (256, 256), dtype, "normal"), _data(rng, (256, 256), dtype, "normal")
    zero = np.zeros(1, np.int64)
    d = fd.Device(a[None], b.T[None], zero, zero, None, dtype)
    R, V, _, idx = d.run()
    und = np.zeros(V.shape, bool)
    und[idx[:, 0], idx[:, 1], idx[:, 2]] = True
    Vc = V.numpy().copy()
    und_c, counts = np.empty(Vc.shape, np.uint8), np.empty((1, 256), np.int64)
    z = np.zeros(1, np.int64)
    A64, B64 = d.A, d.B
    filt._decide(Vc, fd.norms(A64).numpy(), fd.norms(B64).numpy(), z, z, np.zeros(256), np.zeros(256), 256,
                 *_operands(a, b)[0].work.params, und_c, counts)  # fmt: skip
    dec = ~und
    assert not (dec & (und_c == 1)).any()
    exact = rk.matmul(a, b, engine="numba").double().numpy()[None]  # (== truth: the tests above; 65k elements)
    assert np.array_equal(R.double().numpy()[dec].view(np.int64), exact[dec].view(np.int64))
    if dtype != "float32":
        assert d.stats["undecided_rounded_once"] <= d.stats["undecided_first"]
        assert d.stats["undecided_rounded_once"] <= (und_c == 1).sum()


@pytest.mark.parametrize("case", _adversarial(), ids=lambda c: c[0])
def test_pairwise_stage_is_exact_where_it_decides(case):
    """filter_device.pairwise (the device's second stage: the undecided elements' products gathered and
    summed pairwise, gamma_L in place of gamma_K) on every element of the adversarial set: what it
    decides is refkern.truth, bit for bit; bias as one more term."""
    from refkern.engines import filter_device as fd

    _, a, b, bias = case
    p, A3, Bt3, ia, ib, b64, shape = _operands(a, b, bias)
    A, B = torch.from_numpy(A3[ia]), torch.from_numpy(np.ascontiguousarray(Bt3[ib]))
    nt, m, n = A.shape[0], A.shape[1], B.shape[1]
    t, i, j = (x.reshape(-1) for x in torch.meshgrid(torch.arange(nt), torch.arange(m), torch.arange(n), indexing="ij"))
    bv = None if b64 is None else torch.from_numpy(b64.copy())[j]
    r, und = fd.pairwise(A, B, t, i, j, bv, p.out.name)
    exact = (truth.matmul(a, b) if bias is None else truth.linear(a, b.T.contiguous(), bias)).double().numpy().reshape(-1)
    dec = ~und.numpy()
    assert np.array_equal(r.double().numpy()[dec].view(np.int64), exact[dec].view(np.int64))


def test_pairwise_stage_decides_what_the_norm_bound_cannot(monkeypatch):
    """K = 4096 Gaussian float32 rows: the pairwise stage decides nearly every element the norm and
    |A||B| bounds left (gamma_12 against gamma_4096), exactly (the Numba engine on those rows)."""
    from refkern.engines import filter_device as fd

    rng = _rng("filter-device-pairwise")
    a = torch.from_numpy(rng.standard_normal((48, 4096)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((4096, 256)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(256).astype(np.float32))
    monkeypatch.setattr(fd.Device, "force_pairwise", True)
    for bb in (None, bias):
        got, st = fd.matmul(a, b, bb)
        assert st["undecided_after_tight"] > 20 and st["undecided_after_pairwise"] <= st["undecided_after_tight"] / 20
        want = rk.matmul(a, b, engine="numba") if bb is None else rk.linear(a, b.T.contiguous(), bb, engine="numba")
        _all_same(got, want, f"pairwise stage, bias {bb is not None}")
    monkeypatch.setattr(fd, "PAIRWISE_PRODUCTS", 1 << 13)  # chunks of 2 elements
    _all_same(fd.matmul(a[:4], b)[0], rk.matmul(a[:4], b, engine="numba"), "pairwise in chunks")
    # by hand: 2,000 elements x 4096 x 2.5 ns / 16 threads = 1.28 ms > 1 ms; 1,500: 0.96 ms
    assert fd.pairwise_pays(2000, 4096, 16) and not fd.pairwise_pays(1500, 4096, 16)


def test_device_bias_per_row_and_empty_shapes():
    """decide_gemm with a bias per row (the convolution's layout) decides as filter's _decide with brow;
    empty GEMMs and K = 0 (every element the bias, or a signed zero) through filter.device_values."""
    from refkern.engines import filter_device as fd

    rng = _rng("filter-device-brow")
    A = torch.from_numpy(rng.standard_normal((2, 20, 64)).astype(np.float32).astype(np.float64))
    B = torch.from_numpy(rng.standard_normal((2, 12, 64)).astype(np.float32).astype(np.float64))
    brow = torch.from_numpy(rng.standard_normal(20).astype(np.float32).astype(np.float64))
    brow[3] = -0.0
    V, na, nb = fd.value_gemm(A, B), fd.norms(A), fd.norms(B)
    R, und = fd.decide_gemm(V.clone(), na, nb, 64, "float32", brow, bias_rows=True)
    Vc = V.numpy().copy()
    und_c, counts = np.empty(Vc.shape, np.uint8), np.empty((2, 20), np.int64)
    t = np.arange(2)
    filt._decide(Vc, na.numpy(), nb.numpy(), t, t, brow.numpy(), np.zeros(12), 64, 24, -126, 127, und_c, counts)
    dec = ~und.numpy()
    assert dec.sum() > 400 and (dec == (und_c == 0)).all()
    assert np.array_equal(R.double().numpy()[dec], Vc[dec])
    for a, b in (((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0))):
        x, y = torch.ones(a), torch.ones(b)
        _device_gemm_equals_truth(x, y)
    x, y, bias = torch.ones(3, 0), torch.ones(0, 2), torch.tensor([1.5, -0.0])
    _device_gemm_equals_truth(x, y, bias)


def test_filter_gemm_takes_the_device_path_for_a_cuda_device(monkeypatch):
    """filter.gemm with a CUDA device goes through filter_device (here run on the CPU in its place), then
    filter's exact path on what it left."""
    from types import SimpleNamespace

    from refkern.engines import filter_device as fd

    calls = []
    real = fd.gemm

    def on_cpu(p, A3, Bt3, ia, ib, bias, want_mag, device, stats=None):
        calls.append(device.type)
        return real(p, A3, Bt3, ia, ib, bias, want_mag, torch.device("cpu"), stats)

    monkeypatch.setattr(fd, "gemm", on_cpu)
    rng = _rng("filter-device-dispatch")
    a, b = _data(rng, (9, 40), "float32", "cancel"), _data(rng, (40, 7), "float32", "special")
    p, A3, Bt3, ia, ib, _, shape = _operands(a, b)
    st = {}
    v = filt.gemm(p, A3, Bt3, ia, ib, None, shape, device=SimpleNamespace(type="cuda"), stats=st)[0]
    assert calls == ["cuda"] and st["exact_elements"] > 0
    _all_same(torch.from_numpy(v).float(), truth.matmul(a, b))


def test_device_matmul_on_cpu_tensors():
    """fd.matmul, the path whose result stays on the device (benchmarks/bench_filter.py --gpu)."""
    from refkern.engines import filter_device as fd

    rng = _rng("filter-device-matmul")
    for dtype in NARROW:
        for kind in ("normal", "cancel", "spread", "special"):
            a, b = _data(rng, (12, 50), dtype, kind), _data(rng, (50, 9), dtype, kind)
            bias = _data(rng, (9,), dtype, "normal")
            got, st = fd.matmul(a, b)
            assert got.dtype == a.dtype and st["elements"] == 108
            _all_same(got, truth.matmul(a, b), f"{dtype} {kind}")
            _all_same(fd.matmul(a, b, bias)[0], truth.linear(a, b.T.contiguous(), bias), f"{dtype} {kind} bias")
    with pytest.raises(ValueError, match=r"^matmul: expects 2-D"):
        fd.matmul(a, b.double())


# ------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("kind", ["normal", "cancel", "special"])
def test_cuda_filter_matches_cpu(dtype, kind):
    rng = _rng("filter-cuda", dtype, kind)
    a, b = _data(rng, (64, 300), dtype, kind), _data(rng, (300, 48), dtype, kind)
    bias = _data(rng, (48,), dtype, "normal")
    got = rk.linear(a.cuda(), b.T.contiguous().cuda(), bias.cuda(), engine="filter")
    _all_same(got, rk.linear(a, b.T.contiguous(), bias, engine="numba"))
    x, w = _data(rng, (2, 8, 12, 12), dtype, kind), _data(rng, (16, 8, 3, 3), dtype, "normal")
    _all_same(rk.conv2d(x.cuda(), w.cuda(), padding=1, engine="filter"), rk.conv2d(x, w, padding=1, engine="numba"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_self_test():
    ok, detail = filt.self_test(torch.device("cuda"))
    assert ok, detail


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", NARROW)
def test_cuda_device_decision_4096(dtype):
    """4096^3 on the device (filter_device.matmul: GEMM and decision there, the undecided elements on the
    CPU): rows 0..31 bit-identical to the Numba engine on the CPU; most elements decided on the device."""
    from refkern.engines import filter_device as fd

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", generator=g).to(getattr(torch, dtype))
    b = torch.randn(4096, 4096, device="cuda", generator=g).to(getattr(torch, dtype))
    got, st = fd.matmul(a, b)
    assert got.device.type == "cuda" and got.dtype == a.dtype
    assert st["undecided_first"] < 0.01 * st["elements"], st
    _all_same(got[:32].cpu(), rk.matmul(a[:32].cpu(), b.cpu(), engine="numba"), f"{dtype} 4096^3 rows 0..31")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", NARROW)
def test_cuda_device_decision_cancellation(dtype):
    """Cancelling pairs of terms and one small term (condition numbers about 2**27: most elements go to
    the exact path), and the rounding-boundary rows, on the device: the same bits as the Numba engine."""
    from refkern.engines import filter_device as fd

    rng = _rng("filter-cuda-cancel", dtype)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    y = rng.standard_normal((512, 192)).astype(np.float32)
    x[:, 1::2] = -x[:, ::2]
    y[1::2] = y[::2]
    x[:, 510], x[:, 511] = 0, 2.0**-20
    a, b = _tensor(x, dtype), _tensor(y, dtype)
    want = rk.matmul(a, b, engine="numba")
    got, st = fd.matmul(a.cuda(), b.cuda())
    _all_same(got.cpu(), want, "filter_device.matmul")
    _all_same(rk.matmul(a.cuda(), b.cuda(), engine="filter"), want, "refkern.matmul on CUDA tensors")
    A = _midpoint_rows(dtype)
    e = np.where(A != 0, np.floor(np.log2(np.abs(np.where(A != 0, A, 1)))), 0)
    half = np.floor(e / 2)
    xt, yt = _tensor(A / 2.0**half, dtype), _tensor(np.broadcast_to(2.0**half, A.shape), dtype)
    a, b = xt[:, None, :], yt[:, :, None]
    _all_same(rk.matmul(a.cuda(), b.cuda(), engine="filter"), truth.matmul(a, b), "boundaries on CUDA")


# --------------------------------------------------------------------------- the verdict's sample


@pytest.mark.parametrize("kind", ["normal", "cancel", "spread", "subnormal", "special", "zeros"])
@pytest.mark.parametrize("work", ["float32", "float16", "bfloat16"])
def test_sample_kernel_filter(kind, work):
    """The verdict's sample kernel decides EXACT elements by the filter's test where it can
    (:func:`refkern.analysis.evaluate._sample_kernel`): bit-identical to the exact path alone (the
    same plan with ``narrow`` False never takes the test), bias and no bias; ties, cancellation onto
    a midpoint, overflow, subnormal and signed-zero results included; both routes taken."""
    import dataclasses

    from refkern.accumulate.formats import BFLOAT16, FLOAT16, FLOAT32
    from refkern.analysis.evaluate import _dot64, sample_run
    from refkern.kernels._common import plan
    from refkern.kernels._element import abs_sum

    fmt = {"float32": FLOAT32, "float16": FLOAT16, "bfloat16": BFLOAT16}[work]
    rng = _rng("filter-sample", kind, work)
    L = _data(rng, (300, 37), "float32", kind).double().numpy()
    R = _data(rng, (300, 37), "float32", "normal").double().numpy()
    L[:40, 1:], R[:40, 1:] = 0.0, 0.0  # one product per row: the result is a float32 product, ties in fp16
    L[40:80, 2:] = 0.0
    L[40:80, 1] = -(L[40:80, 0] * (1 + 2.0**-23)).astype(np.float32)  # cancelling pairs: results far below the terms
    R[40:80, 1] = R[40:80, 0]
    L[80:90] *= 2.0**100  # products beyond float32 / float16: overflow to inf after the rounding
    L[90:100] *= 2.0**-120  # subnormal results
    bias = _data(rng, (300,), "float32", "normal").double().numpy()
    p = plan("matmul", {"a": L[:2, :2].astype(np.float32), "b": R[:2, :2].astype(np.float32)}, ("a", "b"), "exact",
             None)  # fmt: skip
    assert p.narrow
    q = dataclasses.replace(p, work=fmt)
    for hb in (False, True):
        got, gm = sample_run(L, R, bias, hb, q)
        want, wm = sample_run(L, R, bias, hb, dataclasses.replace(q, narrow=False))
        _all_same(torch.from_numpy(got), torch.from_numpy(want), f"filter vs exact path, bias {hb}")
        assert np.array_equal(gm, wm, equal_nan=True)
    decided = [filt.decide_one(_dot64(L[i], R[i], 0.0), abs_sum(L[i], R[i], 0.0), 37, *fmt.params) for i in range(300)]
    n = int(np.sum(np.isfinite(decided) | np.isinf(decided)))
    assert kind == "special" or n > 150, n  # most by the test
    assert work != "float32" or n < 300, n  # in float32 the cancelling rows by the exact path


@pytest.mark.parametrize("dtype", NARROW)
def test_matmul_and_linear_of_cuda_tensors_take_the_device_path(dtype, monkeypatch):
    """refkern.matmul / linear of CUDA tensors go through filter_device.matmul (no copies of the operands to the
    CPU and back): with CPU tensors standing in for CUDA ones (kernels.gemm._cuda), the same bits as the Numba
    engine, and the device path was taken (its result delivered as a CPU tensor of the dtype)."""
    import refkern.engines.filter_device as fd
    from refkern.kernels import gemm as gemm_mod

    rng = _rng("device-glue", dtype)
    a, b = _data(rng, (48, 300), dtype, "normal"), _data(rng, (300, 40), dtype, "cancel")
    bias = _data(rng, (40,), dtype, "normal")
    want_mm = rk.matmul(a, b, engine="numba")
    want_lin = rk.linear(a, b.T.contiguous(), bias, engine="numba")
    taken = []
    real = fd.matmul
    monkeypatch.setattr(gemm_mod, "_cuda", lambda t: isinstance(t, torch.Tensor))
    monkeypatch.setattr(fd, "matmul", lambda *args: taken.append(1) or real(*args))
    _all_same(rk.matmul(a, b), want_mm)
    _all_same(rk.linear(a, b.T.contiguous(), bias, engine="filter"), want_lin)
    assert len(taken) == 2
    assert rk.matmul(a, b, accumulate="naive").dtype == a.dtype and len(taken) == 2  # not exact: the general path
