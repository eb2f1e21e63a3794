"""refkern.truth's reductions, normalizations and poolings (refkern/truth/reductions.py, norms.py, pools.py).

Three independent checks:

* a certificate of correct rounding, computed here with ``fractions.Fraction`` from the op's
  definition: the result ``y`` is correctly rounded iff the exact value ``X`` lies between the
  midpoints around ``y`` (on a midpoint only if ``y`` is even). For ``X = s * sqrt(Q) + B`` the
  comparisons with a midpoint are decided by squaring, so the certificate is exact too;
* hand-computed values (ties, cancellation, near-midpoints, huge exponents);
* torch in float64 on small random inputs, for every op and argument combination.

Low-precision results against torch: torch's float64 result is rounded once to the format here
(``round_fraction``, not torch's cast, which for bfloat16 goes through float32), and an element
may differ only where that float64 value lies within a few float64 ulps of a midpoint of the
format (torch's own float64 error can fall on either side); every such element is then checked
by the exact certificate instead.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from strategies import FORMAT_NAMES, PARAMS, round_fraction, same, to_array, values

from refkern import truth

torch = pytest.importorskip("torch")
F = torch.nn.functional

TDTYPE = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


# --- the exact oracle and the certificate (independent of refkern) ----------------------------------------------------


def fr(v) -> Fraction:
    return Fraction(float(v))


def fsum(xs) -> Fraction:
    return sum((fr(v) for v in xs), Fraction(0))


def cmp_rational(x: Fraction):
    return lambda m: (x > m) - (x < m)


def cmp_sqrt(s: int, q: Fraction, b: Fraction):
    """sign(s * sqrt(q) + b - m), exactly."""

    def cmp(m):
        d = m - b
        if s > 0:
            return 1 if d < 0 else (q > d * d) - (q < d * d)
        return -1 if d > 0 else (q < d * d) - (q > d * d)

    return cmp


def assert_rounded(y: float, cmp, fmt: str, what=""):
    """``y`` is the correctly rounded (nearest, ties to even) value of the real ``X`` with ``cmp(m) = sign(X - m)``."""
    prec, emin, emax = PARAMS[fmt]
    big = Fraction(2) ** (emax + 1)
    threshold = big - Fraction(2) ** (emax - prec)  # the largest finite number plus half its ulp
    y = float(y)
    assert not math.isnan(y), f"{what}: NaN for a finite real value"
    if math.isinf(y):
        sign = 1 if y > 0 else -1
        assert sign * cmp(sign * threshold) >= 0, f"{what}: inf, but |X| is below the overflow threshold"
        return
    q_min = Fraction(2) ** (emin - prec + 1)
    if y == 0:
        if math.copysign(1.0, y) > 0:
            assert cmp(Fraction(0)) >= 0 and cmp(q_min / 2) <= 0, f"{what}: +0 for X outside [0, min/2]"
        else:
            assert cmp(Fraction(0)) <= 0 and cmp(-q_min / 2) >= 0, f"{what}: -0 for X outside [-min/2, 0]"
        return
    yy = Fraction(y)
    e = math.frexp(abs(y))[1] - 1  # 2**e <= |y| < 2**(e + 1)
    quantum = Fraction(2) ** (max(e, emin) - prec + 1)
    toward_zero = quantum / 2 if abs(yy) == Fraction(2) ** e and e > emin else quantum
    sign = 1 if y > 0 else -1
    inner, outer = yy - sign * toward_zero / 2, yy + sign * quantum / 2
    even = (abs(yy) / quantum) % 2 == 0
    c_in, c_out = sign * cmp(inner), sign * cmp(outer)
    ok = (c_in >= 0 and c_out <= 0) if even else (c_in > 0 and c_out < 0)
    assert ok, f"{what}: {y!r} is not the correctly rounded {fmt} value (sides {c_in}, {c_out}, even={even})"


def exact_stats(xs):
    n = len(xs)
    mu = fsum(xs) / n
    return mu, sum(((fr(v) - mu) ** 2 for v in xs), Fraction(0))


def check_normalized(y, a: Fraction, c: Fraction, w, b, fmt, what):
    """Certificate of y = a / sqrt(c) * w + b (all finite, c > 0)."""
    prod = a * (fr(w) if w is not None else 1)
    bias = fr(b) if b is not None else Fraction(0)
    if prod == 0:
        assert same(y, round_fraction(bias, fmt)) or (bias == 0 and float(y) == 0), what
        return
    assert_rounded(y, cmp_sqrt(1 if prod > 0 else -1, prod * prod / c, bias), fmt, what)


def near_tie(v64: float, fmt: str, ulps: int = 8) -> bool:
    """Is the float64 ``v64`` within ``ulps`` float64 ulps of a rounding boundary of ``fmt``?"""
    if not math.isfinite(v64):
        return False
    lo, hi = float(np.nextafter(v64, -np.inf)), float(np.nextafter(v64, np.inf))
    step = max(hi - v64, v64 - lo) * ulps
    return round_fraction(fr(v64 - step), fmt) != round_fraction(fr(v64 + step), fmt)


def as_np(v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.double().numpy()
    return np.asarray(v, dtype=np.float64)


def bits_equal(got, want) -> bool:
    """Same values bit for bit (NaN equals NaN, -0 differs from +0) and same shape."""
    g, w = as_np(got), as_np(want)
    if g.shape != w.shape:
        return False
    return all(same(a, b) for a, b in zip(g.reshape(-1).tolist(), w.reshape(-1).tolist()))


def rng(seed):
    return np.random.default_rng(seed)


# --- rounding primitives ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(num=st.integers(-(2**80), 2**80), den_exp=st.integers(0, 1200), odd=st.integers(1, 2**20))
@settings(max_examples=150)
def test_round_fraction_matches_an_independent_rounding(fmt, num, den_exp, odd):
    from refkern.accumulate.formats import FORMATS

    for q in (Fraction(num, 2**den_exp), Fraction(num, odd), Fraction(num) * 2 ** (den_exp // 2)):
        assert same(truth.round_fraction(q, FORMATS[fmt]), round_fraction(q, fmt)), q


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_round_sqrt_form_decides_exact_midpoints(fmt):
    from refkern.accumulate.formats import FORMATS

    prec = PARAMS[fmt][0]
    f = FORMATS[fmt]
    half = Fraction(1, 2**prec)  # half an ulp of 1
    for k, want in ((1, 1.0), (3, 1.0 + 2.0 ** (2 - prec))):  # 1 + k/2 ulp: ties to the even neighbour
        m = 1 + k * half
        assert same(truth.round_sqrt_form(1, m * m, Fraction(0), f), want)  # sqrt(m**2) == m exactly
        assert same(truth.round_sqrt_form(-1, m * m, Fraction(0), f), -want)
        assert same(truth.round_sqrt_form(1, Fraction(1), m - 1, f), want)  # 1 + (m - 1): the bias makes it
        # sqrt(q) = m - 2**-400 needs 400 bits: the first enclosures straddle m, the exact test decides
        far = Fraction(1, 2**400)
        assert same(truth.round_sqrt_form(1, (m - far) ** 2, far, f), want)
        assert same(truth.round_sqrt_form(-1, (m + far) ** 2, 2 * m + far, f), want)
    # the overflow threshold max + ulp/2 is a tie that goes to inf (max's significand is odd)
    prec, emin, emax = PARAMS[fmt]
    thr = Fraction(2) ** (emax + 1) - Fraction(2) ** (emax - prec)
    assert truth.round_sqrt_form(1, thr * thr, Fraction(0), f) == math.inf
    below = truth.round_sqrt_form(1, thr * thr - 1, Fraction(0), f)
    assert below == float(Fraction(2) ** (emax + 1) - Fraction(2) ** (emax - prec + 1))
    # half the smallest subnormal is a tie to +0; a little more rounds up
    tiny = Fraction(2) ** (emin - prec)
    assert same(truth.round_sqrt_form(1, tiny * tiny, Fraction(0), f), 0.0)
    assert same(truth.round_sqrt_form(-1, tiny * tiny, Fraction(0), f), -0.0)
    assert truth.round_sqrt_form(1, tiny * tiny * Fraction(101, 100), Fraction(0), f) == float(2 * tiny)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_round_sqrt_form_is_certified(fmt, data):
    from refkern.accumulate.formats import FORMATS

    q = data.draw(st.fractions(min_value=Fraction(1, 2**60), max_value=2**60).filter(lambda v: v > 0))
    b = fr(data.draw(values(fmt)))
    s = data.draw(st.sampled_from([1, -1]))
    if s * s == 1 and (-b > 0) == (s > 0) and b * b == q:
        return  # y == 0 exactly: not this function's input
    y = truth.round_sqrt_form(s, q, b, FORMATS[fmt])
    assert_rounded(y, cmp_sqrt(s, q, b), fmt, f"{s}*sqrt({q}) + {b}")


# --- hand-computed values ---------------------------------------------------------------------------------------------


def test_mean_ties_to_even():
    assert same(truth.mean(np.array([1.0, 1.0 + 2.0**-52])), 1.0)  # 1 + 2**-53 is a tie: even is 1.0
    assert same(truth.mean(np.array([1.0 + 2.0**-52, 1.0 + 2.0**-51])), 1.0 + 2.0**-51)  # 1 + 1.5 * 2**-52
    assert same(truth.mean(np.array([1.0, 1.0 + 2.0**-52, 1.0 + 2.0**-52])), 1.0 + 2.0**-52)  # 1 + 2/3 ulp


def test_variance_with_catastrophic_cancellation():
    # 1e8 + 1 is not a float32 (the spacing there is 8): 1e7 + k is, and so is 1e8 + 8k
    x = np.array([1e7 + 1, 1e7 + 2, 1e7 + 3], np.float32)
    assert same(truth.var(x), 1.0) and same(truth.std(x), 1.0)
    assert same(truth.var(np.array([1e8 + 8, 1e8 + 16, 1e8 + 24], np.float32)), 64.0)
    assert same(truth.var(np.array([1e8 + 1, 1e8 + 2, 1e8 + 3], np.float32)), 0.0)  # all three are 1e8
    big = 2.0**60
    y = np.array([big + 2048, big + 4096, big + 6144])  # float64 spacing at 2**60 is 256
    assert same(truth.var(y), 2048.0**2) and same(truth.var(y, correction=0), 2048.0**2 * 2 / 3)


def test_mean_of_values_near_the_float64_maximum_is_finite():
    x = np.array([1.6e308, 1.7e308, 1.75e308, 1.6e308])
    want = round_fraction(fsum(x) / 4, "float64")
    assert math.isfinite(want) and same(truth.mean(x), want)
    assert same(truth.sum(x), math.inf)  # the sum itself overflows
    assert same(truth.var(np.array([1.7e308, -1.7e308])), math.inf)  # M2 / 1 = 5.78e616: beyond the range
    s = truth.std(np.array([1.7e308, -1.7e308]))  # sqrt(2) * 1.7e308 > max: inf
    assert s == math.inf
    s2 = truth.std(np.array([1.2e308, -1.2e308]))  # sqrt(2) * 1.2e308 = 1.697e308: finite
    assert_rounded(s2, cmp_sqrt(1, 2 * fr(1.2e308) ** 2, Fraction(0)), "float64", "std near max")


def _pell_pair(p: int, dtype):
    """Two floats whose difference is the integer p (more bits than the format holds)."""
    hi = float(torch.tensor(float(p), dtype=dtype).item())
    return torch.tensor([-(p - int(hi)), hi], dtype=dtype)


@pytest.mark.parametrize(
    "dtype, p, q, k",
    [
        (torch.float64, 19339605740014041, 13675166364238207, -17),
        (torch.float32, 28107957, 19875327, -9),
    ],
)
def test_std_near_a_midpoint(dtype, p, q, k):
    """std of two values differing by p (correction 1) is p / sqrt(2) = sqrt(q**2 + k/2) with p**2 - 2 q**2 = k:
    within |k| / (4q) of the odd integer q, a midpoint of the format (q has one bit too many). The real
    value lies below q, so the answer is q - 1, whose significand is odd: a tie rule would give q + 1."""
    assert p * p - 2 * q * q == k and q % 2 == 1
    fmt = {torch.float64: "float64", torch.float32: "float32"}[dtype]
    assert q.bit_length() == PARAMS[fmt][0] + 1
    x = _pell_pair(p, dtype)
    assert int(x[1].item()) - int(x[0].item()) == p
    got = truth.std(x)
    assert got.dtype == dtype and same(got.item(), float(q - 1))
    assert_rounded(got.item(), cmp_sqrt(1, Fraction(p * p, 2), Fraction(0)), fmt, "std near a midpoint")


def test_exact_midpoint_through_a_wider_bias():
    """float32 input, float64 bias: y = 1 + 2**-24 exactly, a float32 midpoint: ties to even, 1.0."""
    x = np.array([[-1.0, 1.0]], np.float32)  # mean 0, var 1: y = x
    b = np.array([2.0**-24, 3 * 2.0**-24])  # 1 + 3 * 2**-24 ties up to 1 + 2**-22
    y = truth.layer_norm(x, (2,), np.array([-1.0, 1.0]), b, eps=0.0)
    assert bits_equal(y, np.array([[1.0, 1.0 + 2.0**-22]], np.float32)) and y.dtype == np.float32
    y = truth.rms_norm(np.array([[3.0, 4.0]], np.float32), (2,), eps=0.0)  # 3 / sqrt(12.5), 4 / sqrt(12.5)
    for j, v in enumerate((3, 4)):
        assert_rounded(y[0, j], cmp_sqrt(1, Fraction(v * v) / Fraction(25, 2), Fraction(0)), "float32", "rms_norm")


def test_layer_norm_of_huge_float32_rows_is_scale_free():
    """Rows near 1e25 in float32: x**2 overflows float32, but the real values are scale-free with eps = 0."""
    r = rng(1)
    x = (1e25 * (1 + r.standard_normal((3, 8)) * 1e-3)).astype(np.float32)
    w, b = r.standard_normal(8).astype(np.float32), r.standard_normal(8).astype(np.float32)
    scaled = (x.astype(np.float64) * 2.0**-83).astype(np.float32)  # exact: a power of two
    got = truth.layer_norm(x, 8, w, b, eps=0.0)
    assert np.isfinite(got).all()
    assert bits_equal(got, truth.layer_norm(scaled, 8, w, b, eps=0.0))
    assert bits_equal(
        truth.group_norm(x.reshape(1, 3, 8), 3, eps=0.0), truth.group_norm(scaled.reshape(1, 3, 8), 3, eps=0.0)
    )
    want = F.layer_norm(
        torch.tensor(x, dtype=torch.float64), (8,), torch.tensor(w).double(), torch.tensor(b).double(), eps=0.0
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-7, atol=1e-6)


def test_sum_keeps_every_term():
    x = np.array([[2.0**1000, 1.0, -(2.0**1000)], [2.0**-1074, 2.0**-1074, 0.0]])
    assert bits_equal(truth.sum(x, 1), np.array([1.0, 2.0**-1073]))
    assert same(truth.sum(x[0]), 1.0) and same(truth.sum(x[0], precision=53), 0.0)  # 53 bits drop the 1
    assert bits_equal(truth.cumsum(x[0], 0), np.array([2.0**1000, 2.0**1000, 1.0]))


def test_sum_dtype_rounds_the_exact_sum_once():
    """torch converts to a narrower dtype before summing; the truth rounds the exact sum once."""
    x = torch.tensor([1.0, 2.0**-25, 2.0**-25, 2.0**-25], dtype=torch.float64)
    got = truth.sum(x, dtype=torch.float32)
    assert got.dtype == torch.float32 and same(got.item(), 1.0 + 2.0**-23)  # 1 + 3 * 2**-25 rounds up
    assert x.sum(dtype=torch.float32).item() == 1.0  # torch: each 2**-25 is lost against 1
    assert same(truth.mean(x, dtype="float32").item(), round_fraction(fsum(x.tolist()) / 4, "float32"))
    h = torch.tensor([2048.0, 1.0, 1.0], dtype=torch.float16)
    assert same(truth.sum(h, dtype=torch.float32).item(), 2050.0) and same(truth.sum(h).item(), 2050.0)
    assert same(truth.cumsum(h, 0, dtype=torch.float64)[1].item(), 2049.0)


# --- certificates on any bits -----------------------------------------------------------------------------------------


def _finite_row(fmt, min_size=1, max_size=6):
    return st.lists(values(fmt), min_size=min_size, max_size=max_size)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_reductions_are_certified_on_any_bits(fmt, data):
    xs = data.draw(_finite_row(fmt, 1, 12))
    x = to_array(xs, fmt)
    n = len(xs)
    total = fsum(xs)
    assert same(truth.sum(x), round_fraction(total, fmt) if total != 0 else truth.sum(x))
    assert same(truth.mean(x), round_fraction(total / n, fmt)) or total == 0
    corr = data.draw(st.sampled_from([0, 1, 0.5, 2]))
    mu, m2 = exact_stats(xs)
    d = max(Fraction(0), n - Fraction(corr))
    v, s = truth.var(x, correction=corr), truth.std(x, correction=corr)
    if d == 0:
        want = math.inf if m2 > 0 else math.nan
        assert same(v, want) and same(s, want)
        return
    assert same(v, round_fraction(m2 / d, fmt))
    if m2 == 0:
        assert same(s, 0.0)
    else:
        assert_rounded(s, cmp_sqrt(1, m2 / d, Fraction(0)), fmt, f"std of {xs}")


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
@example(data=None)
def test_layer_norm_is_certified_on_any_bits(fmt, data):
    if data is None:  # a constant row with a tiny eps, and a row near the top of the range
        rows = [[3.0, 3.0, 3.0], [1.0, -1.0, 1.0]]
        w = b = None
        eps = 2.0**-1074
    else:
        k = data.draw(st.integers(2, 5))
        rows = [data.draw(_finite_row(fmt, k, k)) for _ in range(2)]
        w = data.draw(st.one_of(st.none(), _finite_row(fmt, k, k)))
        b = data.draw(st.one_of(st.none(), _finite_row(fmt, k, k)))
        eps = data.draw(st.sampled_from([1e-5, 0.0, 2.0**-1074, 1.0, 1e300]))
    k = len(rows[0])
    x = to_array([v for r in rows for v in r], fmt).reshape(2, k)
    y = truth.layer_norm(x, (k,), None if w is None else to_array(w, fmt), None if b is None else to_array(b, fmt), eps)
    ys = as_np(y)
    for i, row in enumerate(rows):
        mu, m2 = exact_stats(row)
        c = m2 / k + fr(eps)
        for j, v in enumerate(row):
            a = fr(v) - mu
            if c == 0:
                assert math.isnan(ys[i, j])  # 0 / 0 (a constant row with eps = 0)
                continue
            check_normalized(
                ys[i, j], a, c, None if w is None else w[j], None if b is None else b[j], fmt, f"row {row}"
            )


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@given(data=st.data())
def test_rms_and_batch_norm_are_certified_on_any_bits(fmt, data):
    k = data.draw(st.integers(2, 4))
    row = data.draw(_finite_row(fmt, k, k))
    w = data.draw(_finite_row(fmt, k, k))
    x = to_array(row, fmt).reshape(1, k)
    y = as_np(truth.rms_norm(x, k, to_array(w, fmt)))[0]
    eps = Fraction(2) ** (1 - max(PARAMS[fmt][0], 24))  # torch's opmath epsilon: float32's for half inputs
    c = sum((fr(v) ** 2 for v in row), Fraction(0)) / k + eps
    for j, v in enumerate(row):
        check_normalized(y[j], fr(v), c, w[j], None, fmt, f"rms_norm {row}")
    # batch_norm, training: the k values are one channel of a (k, 1) input
    rm, rv = to_array([0.5], fmt), to_array([2.0], fmt)
    out, new_rm, new_rv = truth.batch_norm(x.reshape(k, 1), rm, rv, training=True, eps=0.25, return_running_stats=True)
    mu, m2 = exact_stats(row)
    for j, v in enumerate(row):
        check_normalized(as_np(out)[j, 0], fr(v) - mu, m2 / k + Fraction(1, 4), None, None, fmt, f"batch_norm {row}")
    m = fr(0.1)
    assert same(as_np(new_rm)[0], round_fraction((1 - m) * Fraction(1, 2) + m * mu, fmt))
    assert same(as_np(new_rv)[0], round_fraction((1 - m) * 2 + m * m2 / (k - 1), fmt))


# --- torch float64 on random inputs, every argument combination -------------------------------------------------------


def _close(got, want, rtol=1e-13, atol=1e-13):
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(as_np(got), as_np(want), rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("op", ["sum", "mean", "var", "std"])
@pytest.mark.parametrize("dim", [None, 0, -1, (0, 2), (-1, 1), [], (2, 0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_match_torch(op, dim, keepdim):
    x = torch.tensor(rng(2).standard_normal((3, 4, 5)))
    ours, theirs = getattr(truth, op), getattr(torch, op)
    if op in ("var", "std"):
        for corr in (0, 1, 2.5):
            _close(ours(x, dim, correction=corr, keepdim=keepdim), theirs(x, dim, correction=corr, keepdim=keepdim))
    elif dim is None:
        _close(ours(x, None, keepdim), theirs(x) if not keepdim else theirs(x, dim=tuple(range(3)), keepdim=True))
    else:
        _close(ours(x, dim, keepdim), theirs(x, dim, keepdim=keepdim))
    assert isinstance(ours(x.numpy(), dim), (np.ndarray, np.floating))


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_cumsum_matches_torch_and_the_exact_prefixes(dim):
    x = torch.tensor(rng(3).standard_normal((4, 6)))
    got = truth.cumsum(x, dim)
    _close(got, torch.cumsum(x, dim))
    moved = np.moveaxis(x.numpy(), dim, -1)
    want = np.array(
        [
            [round_fraction(fsum(r[: i + 1]), "float64") for i in range(len(r))]
            for r in moved.reshape(-1, moved.shape[-1])
        ]
    )
    assert bits_equal(np.moveaxis(as_np(got), dim, -1).reshape(want.shape), want)


def test_zero_dim_and_empty_inputs_match_torch():
    s = torch.tensor(3.5, dtype=torch.float64)
    for dim in (0, -1, None):
        assert bits_equal(truth.sum(s, dim), torch.sum(s) if dim is None else torch.sum(s, dim))
    assert bits_equal(truth.cumsum(s, 0), torch.cumsum(s, 0))
    e = torch.zeros(0, 3, dtype=torch.float64)
    assert bits_equal(truth.sum(e, 0), e.sum(0)) and bits_equal(truth.mean(e, 0), e.mean(0))
    with pytest.warns(UserWarning):
        assert bits_equal(truth.var(e, 0), e.var(0)) and bits_equal(truth.std(e, 0), e.std(0))
    assert bits_equal(truth.sum(e, 1), e.sum(1)) and truth.cumsum(e, 0).shape == (0, 3)


@pytest.mark.parametrize("shape, ns", [((4, 6), (6,)), ((2, 3, 4), (3, 4)), ((2, 3, 4), 4), ((5,), (5,))])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_layer_and_rms_norm_match_torch(shape, ns, affine, eps):
    r = rng(4)
    x = torch.tensor(r.standard_normal(shape) * 3 + 1)
    nshape = (ns,) if isinstance(ns, int) else ns
    w = torch.tensor(r.standard_normal(nshape)) if affine else None
    b = torch.tensor(r.standard_normal(nshape)) if affine else None
    _close(truth.layer_norm(x, ns, w, b, eps), F.layer_norm(x, nshape, w, b, eps))
    _close(truth.rms_norm(x, ns, w, eps), F.rms_norm(x, nshape, w, eps))
    _close(truth.rms_norm(x, ns, w), F.rms_norm(x, nshape, w))  # eps None: finfo(float64).eps


@pytest.mark.parametrize("shape, groups", [((2, 6, 5), 3), ((2, 6), 2), ((1, 4, 3, 2), 1), ((3, 4, 2, 2), 4)])
@pytest.mark.parametrize("affine", [False, True])
def test_group_norm_matches_torch(shape, groups, affine):
    r = rng(5)
    x = torch.tensor(r.standard_normal(shape))
    c = shape[1]
    w = torch.tensor(r.standard_normal(c)) if affine else None
    b = torch.tensor(r.standard_normal(c)) if affine else None
    _close(truth.group_norm(x, groups, w, b, 1e-3), F.group_norm(x, groups, w, b, 1e-3))


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4), (2, 3, 2, 2)])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("stats", [True, False])
def test_batch_norm_matches_torch_and_mutates_nothing(shape, training, affine, stats):
    if not training and not stats:
        return  # eval needs the running stats
    r = rng(6)
    x = torch.tensor(r.standard_normal(shape) * 2 - 1)
    c = shape[1]
    rm = torch.tensor(r.standard_normal(c)) if stats else None
    rv = torch.tensor(r.random(c) + 0.5) if stats else None
    w = torch.tensor(r.standard_normal(c)) if affine else None
    b = torch.tensor(r.standard_normal(c)) if affine else None
    copies = [None if t is None else t.clone() for t in (x, rm, rv, w, b)]
    y, new_rm, new_rv = truth.batch_norm(x, rm, rv, w, b, training, 0.3, 1e-4, return_running_stats=True)
    for t, before in zip((x, rm, rv, w, b), copies):
        assert t is None or torch.equal(t, before)
    rm_t, rv_t = (rm.clone(), rv.clone()) if stats else (None, None)
    want = F.batch_norm(x, rm_t, rv_t, w, b, training, 0.3, 1e-4)
    _close(y, want)
    if stats:
        _close(new_rm, rm_t)
        _close(new_rv, rv_t)
        if not training:
            assert torch.equal(new_rm, rm) and torch.equal(new_rv, rv)
    else:
        assert new_rm is None and new_rv is None
    assert truth.batch_norm(x, rm, rv, w, b, training) is not None


POOL1 = [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=4, stride=3, padding=2, ceil_mode=True),
    dict(kernel_size=2, stride=1, padding=1, ceil_mode=True),
    dict(kernel_size=(5,), stride=(2,), padding=(2,)),
]


@pytest.mark.parametrize("kw", POOL1)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("length", [7, 8])
def test_avg_pool1d_matches_torch(kw, count_include_pad, length):
    x = torch.tensor(rng(7).standard_normal((2, 3, length)))
    _close(
        truth.avg_pool1d(x, count_include_pad=count_include_pad, **kw),
        F.avg_pool1d(x, count_include_pad=count_include_pad, **kw),
    )
    _close(
        truth.avg_pool1d(x[0], count_include_pad=count_include_pad, **kw),
        F.avg_pool1d(x[0], count_include_pad=count_include_pad, **kw),
    )


POOL2 = [
    dict(kernel_size=2),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0)),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 4), stride=(3, 3), padding=(1, 2), ceil_mode=True),
]


@pytest.mark.parametrize("kw", POOL2)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("divisor_override", [None, 5, -3])
def test_avg_pool2d_matches_torch(kw, count_include_pad, divisor_override):
    x = torch.tensor(rng(8).standard_normal((2, 2, 7, 6)))
    args = dict(count_include_pad=count_include_pad, divisor_override=divisor_override, **kw)
    _close(truth.avg_pool2d(x, **args), F.avg_pool2d(x, **args))
    _close(truth.avg_pool2d(x[1], **args), F.avg_pool2d(x[1], **args))


@pytest.mark.parametrize(
    "kw",
    POOL1
    + [
        dict(kernel_size=3, stride=1, padding=1, dilation=2),
        dict(kernel_size=2, stride=2, padding=1, dilation=3, ceil_mode=True),
    ],
)
def test_max_pool1d_matches_torch_bit_for_bit(kw):
    x = torch.tensor(rng(9).standard_normal((2, 3, 9)))
    assert bits_equal(truth.max_pool1d(x, **kw), F.max_pool1d(x, **kw))


@pytest.mark.parametrize("kw", POOL2 + [dict(kernel_size=(2, 3), stride=1, padding=1, dilation=(2, 1), ceil_mode=True)])
def test_max_pool2d_matches_torch_bit_for_bit(kw):
    x = torch.tensor(rng(10).standard_normal((2, 2, 7, 6)))
    assert bits_equal(truth.max_pool2d(x, **kw), F.max_pool2d(x, **kw))
    assert bits_equal(truth.max_pool2d(x[0], **kw), F.max_pool2d(x[0], **kw))


@pytest.mark.parametrize("size", [1, 3, 5, 7, 9])
def test_adaptive_avg_pool_matches_torch(size):
    x = torch.tensor(rng(11).standard_normal((2, 3, 7, 5)))
    _close(truth.adaptive_avg_pool1d(x[0], size), F.adaptive_avg_pool1d(x[0], size))
    _close(truth.adaptive_avg_pool2d(x, size), F.adaptive_avg_pool2d(x, size))
    _close(truth.adaptive_avg_pool2d(x, (size, None)), F.adaptive_avg_pool2d(x, (size, None)))
    _close(truth.adaptive_avg_pool2d(x[1], (None, size)), F.adaptive_avg_pool2d(x[1], (None, size)))
    # the windows are exact: each output is its window's exact mean rounded once
    got = as_np(truth.adaptive_avg_pool1d(x[0], size))
    row = x[0, 0, 0].numpy()
    for i in range(size):
        lo, hi = i * 5 // size, -(-(i + 1) * 5 // size)
        assert same(got[0, 0, i], round_fraction(fsum(row[lo:hi]) / (hi - lo), "float64"))


# --- low precision against torch float64 rounded once ------------------------------------------------------------------


def _lowp_cases(x64):
    r = rng(12)
    w, b = r.standard_normal(8), r.standard_normal(8)
    rm, rv = r.standard_normal(4), r.random(4) + 0.5
    return [
        ("sum", lambda t: torch.sum(t, 1), lambda t: truth.sum(t, 1)),
        ("mean", lambda t: torch.mean(t, 0), lambda t: truth.mean(t, 0)),
        ("var", lambda t: torch.var(t, 1), lambda t: truth.var(t, 1)),
        ("std", lambda t: torch.std(t, 0, correction=0), lambda t: truth.std(t, 0, correction=0)),
        ("cumsum", lambda t: torch.cumsum(t, 1), lambda t: truth.cumsum(t, 1)),
        (
            "layer_norm",
            lambda t: F.layer_norm(t, (8,), torch.tensor(w), torch.tensor(b)),
            lambda t: truth.layer_norm(t, 8, w, b),
        ),
        ("rms_norm", lambda t: F.rms_norm(t, (8,), torch.tensor(w), 1e-6), lambda t: truth.rms_norm(t, 8, w, 1e-6)),
        (
            "group_norm",
            lambda t: F.group_norm(t.reshape(2, 4, 8), 2),
            lambda t: truth.group_norm(t.reshape(2, 4, 8), 2),
        ),
        (
            "batch_norm",
            lambda t: F.batch_norm(t.reshape(2, 4, 8), torch.tensor(rm), torch.tensor(rv)),
            lambda t: truth.batch_norm(t.reshape(2, 4, 8), rm, rv),
        ),
        (
            "avg_pool1d",
            lambda t: F.avg_pool1d(t[None], 3, 2, 1, True, False),
            lambda t: truth.avg_pool1d(t[None], 3, 2, 1, True, False),
        ),
        (
            "avg_pool2d",
            lambda t: F.avg_pool2d(t[None], 3, 2, 1, True, True, 7),
            lambda t: truth.avg_pool2d(t[None], 3, 2, 1, True, True, 7),
        ),
        (
            "adaptive",
            lambda t: F.adaptive_avg_pool2d(t[None], (3, 5)),
            lambda t: truth.adaptive_avg_pool2d(t[None], (3, 5)),
        ),
    ]


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
def test_low_precision_matches_torch_float64_rounded_once(fmt):
    x = torch.tensor(rng(13).standard_normal((8, 8)) * 4).to(TDTYPE[fmt])  # values of the format
    ties = 0
    for name, theirs, ours in _lowp_cases(x):
        got = ours(x)
        assert got.dtype == x.dtype, name
        ref64 = as_np(theirs(x.double()))
        g = as_np(got)
        for v64, y in zip(ref64.reshape(-1).tolist(), g.reshape(-1).tolist()):
            want = round_fraction(fr(v64), fmt) if math.isfinite(v64) else v64
            if not same(y, want) and not (y == 0 and want == 0):
                assert near_tie(v64, fmt), f"{name} in {fmt}: {y!r} but torch float64 {v64!r} rounds to {want!r}"
                ties += 1
    assert ties <= 2  # near-ties are rare; each one is left to the certificate tests


# --- special values, torch semantics ----------------------------------------------------------------------------------

nan, inf = math.nan, math.inf


def t64(*v):
    return torch.tensor(v, dtype=torch.float64)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@pytest.mark.parametrize(
    "values_",
    [(nan, 1.0), (inf, -inf), (inf, 1.0), (-inf, 2.0), (1.0,), (1.0, 1.0), (1.0, 2.0), (inf, inf), ()],
)
def test_reduction_specials_match_torch(values_):
    x = t64(*values_)
    for op in ("sum", "mean"):
        assert bits_equal(getattr(truth, op)(x), getattr(torch, op)(x)), op
    for corr in (0, 1, 2):
        for op in ("var", "std"):
            assert bits_equal(getattr(truth, op)(x, correction=corr), getattr(torch, op)(x, correction=corr)), (
                op,
                corr,
            )
    if values_:
        assert bits_equal(truth.cumsum(x, 0), torch.cumsum(x, 0))
    assert bits_equal(truth.sum(t64()), t64(0.0)[0]) and math.isnan(truth.mean(t64()).item())


def test_normalization_specials_match_torch():
    rows = torch.tensor([[1.0, nan, 3.0], [1.0, inf, 3.0], [2.0, 2.0, 2.0], [-inf, 1.0, 2.0]], dtype=torch.float64)
    assert bits_equal(truth.layer_norm(rows, 3), F.layer_norm(rows, (3,)))  # NaN/inf rows NaN; constant row +0
    assert bits_equal(truth.layer_norm(rows[2:3], 3, eps=0.0), F.layer_norm(rows[2:3], (3,), eps=0.0))  # 0/0: NaN
    assert bits_equal(truth.rms_norm(rows, 3), F.rms_norm(rows, (3,)))  # inf: the finite elements +-0, inf NaN
    assert bits_equal(truth.rms_norm(t64(0.0, 0.0)[None], 2, eps=0.0), F.rms_norm(t64(0.0, 0.0)[None], (2,), eps=0.0))
    w = t64(inf, inf, 0.0)
    x = t64(1.0, 2.0, 2.0)[None]
    assert bits_equal(truth.layer_norm(x, 3, w), F.layer_norm(x, (3,), w))  # inf weight: +-inf, 0 * finite
    g = rows.reshape(1, 4, 3)
    assert bits_equal(truth.group_norm(g, 2), F.group_norm(g, 2)) and bits_equal(
        truth.group_norm(g, 4), F.group_norm(g, 4)
    )
    xb = torch.tensor([[inf, 2.0], [1.0, 2.0]], dtype=torch.float64)
    rm, rv, b = t64(0.0, inf), t64(1.0, 1.0), t64(5.0, 5.0)
    assert bits_equal(truth.batch_norm(xb, rm, rv, bias=b), F.batch_norm(xb, rm, rv, bias=b))  # per element
    assert bits_equal(
        truth.batch_norm(xb, t64(0.0, 0.0), t64(inf, -1.0), bias=b),
        F.batch_norm(xb, t64(0.0, 0.0), t64(inf, -1.0), bias=b),
    )
    assert bits_equal(
        truth.batch_norm(xb, rm, rv, training=True), F.batch_norm(xb, rm.clone(), rv.clone(), training=True)
    )


def test_batch_norm_with_zero_running_var_is_real_valued():
    """running_var + eps == 0: (x - mean) / 0 is +-inf for x != mean and NaN for x == mean. torch folds the
    step into x * inf + (b - mean * inf), which gives NaN where x and mean have one sign."""
    x = t64(1.0, -2.0, 0.0, 3.0).reshape(4, 1)
    got = truth.batch_norm(x, t64(0.0), t64(0.0), eps=0.0)
    assert bits_equal(got, t64(inf, -inf, nan, inf).reshape(4, 1))


def test_pool_specials():
    x = t64(1.0, nan, 2.0, 3.0, inf, -inf, inf, 4.0)[None]
    assert bits_equal(truth.max_pool1d(x, 2), F.max_pool1d(x, 2))
    assert bits_equal(truth.avg_pool1d(x, 2), F.avg_pool1d(x, 2))
    assert bits_equal(truth.adaptive_avg_pool1d(x, 3), F.adaptive_avg_pool1d(x, 3))
    y = t64(5.0)[None]
    assert bits_equal(truth.max_pool1d(y, 2, 1, 1, 2), F.max_pool1d(y, 2, 1, 1, 2))  # a window in the padding: -inf


def test_signed_zeros():
    z = t64(-0.0, -0.0)
    assert same(truth.sum(z).item(), -0.0) and same(truth.mean(z).item(), -0.0)  # torch gives +0 for both
    assert same(truth.sum(t64(-0.0, 0.0)).item(), 0.0) and same(truth.sum(t64()).item(), 0.0)
    assert same(truth.sum(t64(1.0, -1.0)).item(), 0.0) and same(truth.sum(t64(1e-300, -1e-300)).item(), 0.0)
    assert bits_equal(truth.cumsum(t64(-0.0, -0.0, 1.0, -1.0), 0), t64(-0.0, -0.0, 1.0, 0.0))
    assert bits_equal(truth.avg_pool1d(z[None], 2), t64(-0.0)[None])  # the window's terms are all -0
    assert bits_equal(truth.avg_pool1d(z[None], 2, 1, 1), t64(-0.0, -0.0, -0.0)[None])  # padding adds no term
    assert same(truth.mean(torch.tensor([-(2.0**-149)], dtype=torch.float32)).item(), -(2.0**-149))
    assert same(truth.mean(torch.tensor([-(2.0**-149), 0.0], dtype=torch.float32)).item(), -0.0)  # a tie at -min/2
    # max_pool: the first of equal values, as torch
    for v in ((-0.0, 0.0), (0.0, -0.0)):
        assert bits_equal(truth.max_pool1d(t64(*v)[None], 2), F.max_pool1d(t64(*v)[None], 2))
    # normalization: IEEE's zero signs along ((x - mu) / sqrt(var + eps)) * w + b
    row = t64(2.0, 2.0)[None]
    assert bits_equal(truth.layer_norm(row, 2, t64(-1.0, 1.0)), t64(-0.0, 0.0)[None])  # (+0) * -1 = -0, no bias
    assert bits_equal(truth.layer_norm(row, 2, t64(-1.0, -1.0), t64(-0.0, 0.0)), t64(-0.0, 0.0)[None])
    assert bits_equal(truth.layer_norm(t64(-0.0, 0.0)[None], 2), t64(-0.0, 0.0)[None])  # -0 - (+0) = -0
    assert bits_equal(truth.layer_norm(t64(-0.0, -0.0)[None], 2), t64(0.0, 0.0)[None])  # -0 - (-0) = +0
    assert bits_equal(truth.rms_norm(t64(-0.0, 1.0)[None], 2, t64(1.0, -0.0)), t64(-0.0, -0.0)[None])
    assert same(truth.layer_norm(t64(-1.0, 1.0)[None], 2, None, t64(1.0, 0.0), eps=0.0)[0, 0].item(), 0.0)  # -1 + 1


# --- containers, dtypes and errors ------------------------------------------------------------------------------------


def test_containers_and_dtypes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert isinstance(truth.sum(x, 1), np.ndarray) and truth.sum(x, 1).dtype == np.float32
    assert isinstance(truth.sum(x), np.float32) and truth.sum(x) == 15.0  # a 0-d result is a numpy scalar
    assert truth.mean(x, (0, 1), keepdim=True).shape == (1, 1)
    assert truth.var(x.astype(np.float16), 0).dtype == np.float16
    assert truth.sum(x, dtype=np.float64).dtype == np.float64
    t = torch.tensor(x, dtype=torch.bfloat16)
    assert truth.std(t, 1).dtype == torch.bfloat16 and truth.cumsum(t, 0).dtype == torch.bfloat16
    y = truth.layer_norm(x, 3, torch.ones(3))  # any tensor input gives a tensor
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    y = truth.layer_norm(t, 3, torch.ones(3, dtype=torch.float32))  # weight's dtype may differ: input's wins
    assert y.dtype == torch.bfloat16
    _, rm, rv = truth.batch_norm(
        t, np.zeros(3), torch.ones(3, dtype=torch.float16), training=True, return_running_stats=True
    )
    assert rm.dtype == torch.float64 and rv.dtype == torch.float16
    _, rm, rv = truth.batch_norm(x, None, None, training=True, return_running_stats=True)
    assert rm is None and rv is None


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda x: truth.sum(x, (0, -2)), ValueError, r"^truth\.sum: each dim may appear once"),
        (lambda x: truth.mean(x, 2), ValueError, r"^truth\.mean: dim 2 is out of range"),
        (lambda x: truth.var(x, "a"), TypeError, r"^truth\.var: dim must be"),
        (lambda x: truth.std(x, correction="1"), TypeError, r"^truth\.std: correction must be"),
        (lambda x: truth.cumsum(x, (0, 1)), TypeError, r"^truth\.cumsum: dim must be an int"),
        (lambda x: truth.sum(x, dtype="int8"), ValueError, r"^truth\.sum: unknown dtype"),
        (
            lambda x: truth.layer_norm(x, (2,)),
            ValueError,
            r"^truth\.layer_norm: normalized_shape must equal .* input\.shape=\(2, 3\)",
        ),
        (
            lambda x: truth.layer_norm(x, 3, np.ones(2)),
            ValueError,
            r"^truth\.layer_norm: weight must have shape \(3,\)",
        ),
        (lambda x: truth.rms_norm(x, (4, 3)), ValueError, r"^truth\.rms_norm: normalized_shape must equal"),
        (lambda x: truth.group_norm(x, 2), ValueError, r"^truth\.group_norm: the channels must split"),
        (lambda x: truth.group_norm(x[0], 1), ValueError, r"^truth\.group_norm: input must have shape \(N, C, \*\)"),
        (
            lambda x: truth.batch_norm(x[:1], None, None, training=True),
            ValueError,
            r"^truth\.batch_norm: expected more than 1 value per channel when training",
        ),
        (
            lambda x: truth.batch_norm(x, None, None),
            ValueError,
            r"^truth\.batch_norm: running_mean and running_var are required",
        ),
        (
            lambda x: truth.batch_norm(x, np.zeros(2), np.ones(3)),
            ValueError,
            r"^truth\.batch_norm: running_mean must have shape \(3,\)",
        ),
        (lambda x: truth.avg_pool1d(x, 2, padding=2), ValueError, r"^truth\.avg_pool1d: padding must be at most half"),
        (
            lambda x: truth.avg_pool2d(x[None], 1, divisor_override=0),
            ValueError,
            r"^truth\.avg_pool2d: divisor_override must be nonzero",
        ),
        (lambda x: truth.max_pool1d(x, 4), ValueError, r"^truth\.max_pool1d: the output would be empty"),
        (lambda x: truth.max_pool2d(x, 1), ValueError, r"^truth\.max_pool2d: input must have shape \(C, H, W\)"),
        (lambda x: truth.avg_pool1d(x, 0), ValueError, r"^truth\.avg_pool1d: kernel_size must be an int"),
        (
            lambda x: truth.adaptive_avg_pool1d(x, 0),
            ValueError,
            r"^truth\.adaptive_avg_pool1d: output_size must be positive",
        ),
        (
            lambda x: truth.adaptive_avg_pool2d(x[None], (1, 2, 3)),
            ValueError,
            r"^truth\.adaptive_avg_pool2d: output_size must be",
        ),
        (lambda x: truth.mean(x.astype(np.int64)), TypeError, r"^truth\.mean: expected floating-point inputs"),
    ],
)
def test_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call(np.ones((2, 3)))
