"""softmax and log_softmax: bit-identical to the mpmath truth (hypothesis rows over every format,
pinned hard rows), each path of Ziv's strategy forced and checked, the bounded exp/log and the
rounding decision against mpmath and exact rationals, and torch's semantics (dims, dtype=,
specials, empty and 0-d inputs) within its own float64 error."""

import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import PARAMS, round_fraction, same, values

import refkern as rk
from refkern import truth
from refkern.accumulate.formats import FORMATS, round_array
from refkern.kernels import _exact_real as xr
from refkern.kernels.softmax import exact_row, softmax_rows

torch = pytest.importorskip("torch")

FMTS = ("float16", "bfloat16", "float32", "float64")
INF = math.inf


def _tensor(rows, fmt):
    return torch.tensor(np.asarray(rows, np.float64)).to(getattr(torch, fmt))


def _assert_same(got, want, what=""):
    g = got.double().reshape(-1).tolist()
    w = want.double().reshape(-1).tolist()
    bad = [(i, a, b) for i, (a, b) in enumerate(zip(g, w)) if not same(a, b)]
    assert not bad, f"{what}: {len(bad)} elements differ from the truth, first (index, got, truth): {bad[:3]}"


# ---------------------------------------------------------------- bit-identical to the truth

HARD_ROWS = [
    ("float32", [0.0, 1e4, -1e4]),  # large logits: one entry takes everything
    ("float32", [1e4, 1e4]),  # tie at a large value: exactly 1/2
    ("float32", [3.0, 3.0, 3.0]),  # ties: 1/3
    ("float32", [0.0, -100.0]),  # a subnormal float32 result (e**-100 = 3.7e-44)
    ("float32", [-INF, 0.0, 1.0]),  # -inf entries give exactly 0 / -inf
    ("float32", [-INF, -INF]),  # only -inf: NaN, as torch
    ("float32", [INF, 0.0]),  # +inf: NaN, as torch
    ("float32", [math.nan, 0.0]),
    ("float16", [0.0, -12.0, 5.0]),  # float16 subnormal results
    ("float16", [60000.0, -60000.0, 0.0]),
    ("bfloat16", [1.0, 1.0, 1.0, 1.0, 1.0]),  # 1/5 in bfloat16
    ("bfloat16", [3.0e38, -3.0e38]),
    ("float64", [0.0, 700.0]),
    ("float64", [0.0, -745.0]),  # float64 subnormal 2**-1074 from e**-745
    ("float64", [0.0, -744.44007192138126]),  # near the subnormal midpoint 2**-1075
    ("float64", [0.0, -800.0]),  # softmax 0, log_softmax -0.0
    ("float64", [1e300, -1e300]),
    ("float64", [1e308, -1e308]),  # log_softmax -inf (below the range), as torch
    ("float64", [0.5, 0.5]),  # exactly 1/2
    ("float64", [5e-324, 0.0, -5e-324]),  # differences of subnormals
    ("float64", [1.0, 1.0 + 2.0**-52, 1.0 - 2.0**-53]),  # near-ties
]


@pytest.mark.parametrize("fmt,row", HARD_ROWS, ids=[f"{f}-{r}" for f, r in HARD_ROWS])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_hard_rows_match_truth(op, fmt, row):
    x = _tensor([row], fmt)
    _assert_same(getattr(rk, op)(x, -1), getattr(truth, op)(x, -1), f"{op} {fmt} {row}")


def _rows(fmt):
    entry = st.one_of(values(fmt), st.sampled_from([-INF, 0.0, 1.0]), st.floats(-30, 30).map(lambda v: round(v, 1)))
    row = st.lists(entry, min_size=1, max_size=6)
    return st.lists(row, min_size=1, max_size=3).map(lambda rs: [r + r[:1] * (6 - len(r)) for r in rs])


@given(st.data())
@example(data=None)
def test_rows_match_truth(data):
    if data is None:  # the pinned rows of every format together
        cases = [(f, [[0.0, -1.0, -1.0]]) for f in FMTS]
    else:
        fmt = data.draw(st.sampled_from(FMTS))
        cases = [(fmt, data.draw(_rows(fmt)))]
    for fmt, rows in cases:
        x = _tensor(rows, fmt)
        for op in ("softmax", "log_softmax"):
            _assert_same(getattr(rk, op)(x, -1), getattr(truth, op)(x, -1), f"{op} {fmt} {rows}")


@given(st.sampled_from(FMTS), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_random_logits_match_truth(fmt, n, seed):
    """Ordinary logits at three scales, with ties and -inf sprinkled in."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, n)) * np.array([[1.0], [30.0], [300.0]])
    if n > 1:
        x[0, 1] = x[0, 0]
        x[2, -1] = -np.inf
    t = _tensor(x, fmt)
    for op in ("softmax", "log_softmax"):
        _assert_same(getattr(rk, op)(t, 1), getattr(truth, op)(t, 1), f"{op} {fmt}")


# ---------------------------------------------------------------- the three paths


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("log", [False, True])
def test_forced_paths_agree(fmt, log):
    """The float64 pass, the double-word pass and the exact integer path give the same bits."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((6, 9)) * np.array([1, 1, 10, 100, 1000, 1e4])[:, None]
    X[1, :4] = X[1, 0]  # ties
    X[2, 3] = -np.inf
    X[3, :] = 2.5  # all equal: 1/9 and -log 9
    X = round_array(X, *PARAMS[fmt])
    F = FORMATS[fmt]
    auto, c_auto = softmax_rows(X, F, log)
    dd, c_dd = softmax_rows(X, F, log, force="dd")
    ex, c_ex = softmax_rows(X, F, log, force="exact")
    assert c_dd.dd_rows == 6 and c_ex.exact_elements == X.size
    for a, b, what in ((auto, dd, "dd"), (auto, ex, "exact")):
        diff = [(i, u, v) for i, (u, v) in enumerate(zip(a.ravel(), b.ravel())) if not same(u, v)]
        assert not diff, f"{what} path differs: {diff[:3]}"
    t = _tensor(X, fmt)
    _assert_same(torch.from_numpy(ex), truth.log_softmax(t, -1) if log else truth.softmax(t, -1), "truth")


def test_exact_path_rationals_and_tiny_sums():
    """The exact path finds 1/c and 0 exactly, and the sign of a log_softmax whose sum is 1 + e**-50000."""
    F = FORMATS["float64"]
    assert exact_row(np.array([2.0, 2.0, 2.0]), [0, 1, 2], F, False) == {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}
    assert exact_row(np.array([2.0, -INF]), [0, 1], F, True) == {0: 0.0, 1: -INF}
    r = exact_row(np.array([0.0, -50000.0]), [0, 1], F, True)
    assert same(r[0], -0.0) and r[1] == -50000.0
    r = exact_row(np.array([0.0, -745.0]), [0, 1], F, False)
    assert r == {0: 1.0, 1: 5e-324}


def test_fallback_rate_is_small():
    """On ordinary float32 data the float64 pass decides nearly every row (the rate is printed)."""
    rng = np.random.default_rng(3)
    X = round_array(rng.standard_normal((64, 1024)) * 3, *PARAMS["float32"])
    _, c = softmax_rows(X, FORMATS["float32"], False)
    _, c2 = softmax_rows(X, FORMATS["float64"], False)
    print(f"float32: {c.dd_rows}/{c.rows} rows to the double-word pass, {c.exact_elements} exact elements; "
          f"float64: {c2.exact_elements}/{c2.elements} exact elements")  # fmt: skip
    assert c.dd_rows <= 4 and c.exact_elements == 0 and c2.exact_elements == 0


# ---------------------------------------------------------------- the numerics, against mpmath


def test_exp_log_bounds_against_mpmath():
    from numba import njit

    from refkern.kernels import _transcendental as tr

    ef = njit(lambda x: tr.exp_fast(x))
    ed = njit(lambda h, lo: tr.exp_dd(h, lo))
    lf = njit(lambda c, t, e: tr.log_fast(c, t, e))
    ld = njit(lambda c, h, lo, e: tr.log_dd(c, h, lo, e))
    rnd = random.Random(5)
    with mpmath.workprec(300):
        for _ in range(1500):
            x = rnd.choice([rnd.uniform(-2000, 1), rnd.uniform(-0.01, 0), -(2.0 ** rnd.uniform(-1074, 10))])
            v, m = ef(x)
            t = mpmath.exp(x)
            assert abs(mpmath.ldexp(v, int(m)) / t - 1) <= tr.EXP_FAST_REL, x
            xl = rnd.uniform(-0.5, 0.5) * math.ulp(x)
            h, lo, m = ed(x, xl)
            t = mpmath.exp(mpmath.mpf(x) + xl)
            assert abs(mpmath.ldexp(mpmath.mpf(h) + lo, int(m)) / t - 1) <= tr.EXP_DD_REL, (x, xl)
    with mpmath.workprec(1200):  # 1 + t exactly, t >= 2**-300
        for _ in range(800):
            c0 = float(rnd.choice([1, 1, 2, 7]))
            t = rnd.choice([rnd.uniform(0, 0.04), 2.0 ** rnd.uniform(-300, 8)])
            L, e = lf(c0, t, 0.0)
            assert abs(L - mpmath.log(c0 + mpmath.mpf(t))) <= e
            tl = rnd.uniform(-0.5, 0.5) * math.ulp(t)
            h, lo, e = ld(c0, t, tl, 0.0)
            assert abs(mpmath.mpf(h) + lo - mpmath.log(c0 + mpmath.mpf(t) + tl)) <= e


def test_decide_scaled_against_exact_rounding():
    """Every decision equals the exact rounding of both ends of the interval; midpoints stay undecided."""
    from numba import njit

    from refkern.kernels._transcendental import decide_scaled

    ds = njit(lambda qh, ql, e, k, p, a, b: decide_scaled(qh, ql, e, k, p, a, b))
    rnd = random.Random(11)
    decided = 0
    for _ in range(20000):
        fmt = rnd.choice(FMTS)
        prec, emin, emax = PARAMS[fmt]
        qh = rnd.uniform(0.5, 2.0) * rnd.choice([1, -1])
        if rnd.random() < 0.4:  # a grid point or a midpoint of the format
            qh = float(Fraction(round(qh * 2**prec), 2**prec) + Fraction(rnd.choice([0, 1]), 2 ** (prec + 1)))
        ql = rnd.uniform(-0.5, 0.5) * math.ulp(qh) * rnd.choice([0.0, 1.0, 1e-6])
        k = rnd.randint(emin - prec - 4, emax + 2)
        e = rnd.choice([0.0, 2.0**-90, 2.0**-60, 2.0**-30]) * abs(qh)
        v, ok = ds(qh, ql, e, k, prec, emin, emax)
        if ok:
            decided += 1
            for t in (-e, 0.0, e):
                want = round_fraction((Fraction(qh) + Fraction(ql) + Fraction(t)) * Fraction(2) ** k, fmt)
                assert same(v, want), (qh, ql, e, k, fmt, v, want)
    assert decided > 15000


def test_exact_real_intervals_contain_mpmath():
    rnd = random.Random(2)
    lo, hi = xr.ln2_fixed(300)
    with mpmath.workprec(400):
        assert lo <= mpmath.ln2 * 2**300 <= hi and hi - lo < 100
        for _ in range(200):
            x = rnd.choice([rnd.uniform(-900, 0), -(2.0 ** rnd.uniform(-1074, 20))])
            a, b, sh = xr.exp_interval(*xr.dyadic(x), 120)
            assert a * mpmath.ldexp(1, sh) <= mpmath.exp(x) <= b * mpmath.ldexp(1, sh)
            assert b - a < a * 2.0**-100
            A = rnd.randint(1, 2**90)
            s = rnd.randint(-200, 50)
            l1, l2, w = xr.log_interval(A, A + 1, s, 150)
            assert l1 * mpmath.ldexp(1, w) <= mpmath.log(A * mpmath.ldexp(1, s))
            assert mpmath.log((A + 1) * mpmath.ldexp(1, s)) <= l2 * mpmath.ldexp(1, w)


# ---------------------------------------------------------------- torch's semantics

CASES = [((5,), 0), ((5,), -1), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 1, 4), 1),
         ((4, 7, 2), 0)]  # fmt: skip


@pytest.mark.parametrize("shape,dim", CASES)
@pytest.mark.parametrize("fmt,dtype", [("float32", None), ("float64", None), ("float16", None), ("bfloat16", None),
                                       ("float32", torch.float64), ("float64", torch.float32),
                                       ("float16", torch.float32), ("float32", torch.float16)])  # fmt: skip
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_agrees_with_torch_float64(op, shape, dim, fmt, dtype):
    """Within torch's float64 error of torch's float64 result (5.6 ulps seen on a softmax row of 5), and one
    unit of a narrower result format; same shape, dtype and kind."""
    g = torch.Generator().manual_seed(hash((shape, dim)) % 2**31)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(getattr(torch, fmt))
    got = getattr(rk, op)(x, dim, dtype=dtype)
    want_dtype = dtype or x.dtype
    assert isinstance(got, torch.Tensor) and got.dtype == want_dtype and got.shape == x.shape
    xin = x.to(want_dtype).double()  # torch converts first
    ref = getattr(torch, op)(xin, dim)
    prec, emin, _ = PARAMS[str(want_dtype).removeprefix("torch.")]
    ulp = torch.tensor([2.0 ** (max(math.frexp(v)[1] - 1, emin) - prec + 1) for v in ref.reshape(-1).tolist()])
    # torch's float64 error (16 ulps; log_softmax subtracts max + log(sum), so 8u of the row's max too), then
    # for a narrower format one rounding
    tol = 16 * 2.0**-53 * ref.abs() + (8 * 2.0**-53 * xin.abs().amax(dim, keepdim=True) if op == "log_softmax" else 0)
    allowed = tol.reshape(-1) + (ulp if prec < 53 else 0)
    assert ((got.double() - ref).abs().reshape(-1) <= allowed).all()
    np_got = getattr(rk, op)(x.double().numpy().astype(np.float64), dim)
    assert isinstance(np_got, np.ndarray) and np_got.dtype == np.float64


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_strided_inputs_as_contiguous(op, fmt):
    """A transposed (non-contiguous) input and a negative dim give the contiguous call's bits, at every dim."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 5, 6, generator=g, dtype=torch.float64) * 4).to(getattr(torch, fmt))
    xt = x.permute(2, 0, 1)
    assert not xt.is_contiguous()
    for dim in (0, 1, 2, -1, -2):
        got, want = getattr(rk, op)(xt, dim), getattr(rk, op)(xt.contiguous(), dim)
        assert got.shape == xt.shape and torch.equal(got, want)


def test_dtype_converts_through_float32_as_torch():
    """float64 -> float16 in torch rounds through float32: 1 + 2**-11 + 2**-40 becomes 1.0 (not 1 + 2**-10)."""
    v = 1 + 2.0**-11 + 2.0**-40
    x = torch.tensor([v, 0.0], dtype=torch.float64)
    want = torch.softmax(x.to(torch.float16).double(), 0).to(torch.float16)
    assert x.to(torch.float16)[0].item() == 1.0
    _assert_same(rk.softmax(x, 0, dtype=torch.float16), truth.softmax(x, 0, dtype=torch.float16))
    assert torch.equal(rk.softmax(x, 0, dtype=torch.float16), want)
    y = torch.tensor([70000.0, 1.0])
    assert torch.isnan(rk.softmax(y, 0, dtype="float16")).all()  # overflows to inf on conversion, then NaN


def test_specials_follow_torch():
    rows = [[0.0, INF, 1.0], [INF, INF], [-INF, -INF], [math.nan, 1.0], [-INF, 0.0], [INF, -INF]]
    for r in rows:
        for dt in (torch.float32, torch.float64):
            x = torch.tensor(r, dtype=dt)
            for op in ("softmax", "log_softmax"):
                got, ref = getattr(rk, op)(x, 0), getattr(torch, op)(x, 0)
                assert torch.equal(torch.isnan(got), torch.isnan(ref)), (op, r)
                assert torch.equal(got[~torch.isnan(got)], ref[~torch.isnan(ref)]), (op, r)
    assert rk.log_softmax(torch.tensor([1e308, -1e308], dtype=torch.float64), 0).tolist() == [0.0, -INF]


def test_empty_and_zero_dim():
    for shape, dim in (((0, 3), 0), ((0, 3), 1), ((2, 0), 1)):
        x = torch.empty(shape)
        assert rk.softmax(x, dim).shape == torch.softmax(x, dim).shape
    s = torch.tensor(2.0)
    assert rk.softmax(s, 0).item() == 1.0 and rk.softmax(s, -1).shape == ()
    assert same(rk.log_softmax(s, 0).item(), 0.0)
    assert rk.softmax(np.float32(3.0), 0) == np.float32(1.0)


def test_errors_name_the_argument():
    with pytest.raises(IndexError, match=r"^softmax: dim=2 is out of range for a 1-d input"):
        rk.softmax(np.ones(3), 2)
    with pytest.raises(IndexError, match=r"^log_softmax: dim=1 is out of range for a 0-d input"):
        rk.log_softmax(np.float64(1.0), 1)
    with pytest.raises(TypeError, match=r"^softmax: dim must be an int; got None"):
        rk.softmax(np.ones(3), None)
    with pytest.raises(TypeError, match=r"^softmax: expected floating-point inputs"):
        rk.softmax(np.ones(3, np.int64), 0)
    with pytest.raises(ValueError, match=r"^softmax: unknown dtype="):
        rk.softmax(np.ones(3), 0, dtype="float8")


def test_truth_independent_checks():
    """The truth itself, against exact rationals where the value is rational or trivially bounded."""
    assert truth.softmax(np.array([1.0, 1.0, 1.0]), 0).tolist() == [1 / 3] * 3
    r = truth.softmax(np.array([0.0, 0.0, 0.0], np.float16), 0)
    assert r.tolist() == [round_fraction(Fraction(1, 3), "float16")] * 3
    assert truth.log_softmax(np.array([5.0, -INF]), 0).tolist() == [0.0, -INF]
    with mpmath.workprec(200):
        want = float(mpmath.mpf(1) / (1 + mpmath.exp(-1)))
    assert abs(truth.softmax(np.array([1.0, 0.0]), 0)[0] - want) <= math.ulp(want) / 2
