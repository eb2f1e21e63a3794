"""The vectorised first pass (refkern.kernels._ew_vec) and pow(x, 2)'s exact square against the mpmath truth,
element by element: dense sweeps across the edges of each pass's range (where it hands over to the float64 tier),
random values of each format inside it, and the elements it decides counted (a pass that decided nothing would
test nothing)."""

from fractions import Fraction

import numpy as np
import pytest

import refkern
import refkern.truth as truth
from refkern.accumulate.formats import FORMATS
from refkern.kernels import _ew_vec, _ew_vec_erf
from refkern.kernels.elementwise import VEC
from tests.strategies import same, to_array

# (op, the pass's range edges, a scale for random arguments)
EDGES = {
    "exp": ([-104.0, 89.0, 88.72283935546875, -103.97207641601562, -87.33654022216797, 0.0], 40.0),
    "exp2": ([-151.0, 129.0, 128.0, -149.0, -150.0, -126.0, 0.0], 60.0),
    "sigmoid": ([100.0, -100.0, 0.0, 16.6355, -87.3, -103.3], 20.0),
    "silu": ([100.0, -100.0, 0.0, 16.6355, -87.3, -103.3], 20.0),
    "tanh": ([0.0625, -0.0625, 40.0, -40.0, 9.0, 0.0], 5.0),
    "log": ([1.0, 0.75, 1.5, 2.0, 0.5, 1.0 + 1 / 256, 1.0 - 1 / 256, 2.0**-126, 2.0**-149, 3.0e38, 0.0], 1e3),
    "log2": ([1.0, 0.75, 1.5, 2.0, 0.5, 1.0 + 1 / 256, 2.0**-126, 2.0**-149, 2.0**100, 3.0e38, 0.0], 1e3),
    "erf": ([4.5, -4.5, 0.0, 1 / 256, -1 / 256, 3 / 256, 4.49609375, 2.0**-40, 2.0**-149, 1.0, 0.5], 2.0),
    "gelu": ([-3.0, 6.37, 6.36, -14.5, -14.0, -10.0, 0.0, 2.0**-40, -(2.0**-149), -5.0, 1.0], 4.0),
    "sqrt": ([0.0, -0.0, 2.0**-149, 4.0, 2.0, -1.0, 3.0e38], 1e3),
    "reciprocal": ([0.0, -0.0, 2.0**-149, 3.0, 2.0**127, 1.7e38, -3.0], 1e3),
    "rsqrt": ([0.0, 2.0**-149, 4.0, 2.0, -1.0, 3.0e38, 2.0**-126], 1e3),
    "log1p": ([-1.0, -0.5, -0.75, 2.0**-8, -(2.0**-8), 2.0**21, 2.0**21 - 1, 1e-30, 0.0, -0.999, 3.0e38, -2.0], 3.0),
    "expm1": ([0.35, -0.35, 0.3500001, -104.0, 89.0, 88.72283935546875, -87.3, 2.0**-149, 0.0, 1e-8], 20.0),
    "gelu_tanh": ([10.5, -10.5, 9.0, 2.0**20, 2.0**-149, 0.0, -3.0, -8.0], 4.0),
    "softplus": ([20.0, 20.000002, 100.0, -100.0, 0.0, 5.5, -5.5, 2.0**-149, 19.99, 0.0039, -88.0], 20.0),
    "sin": ([0.78, 0.7853982, 1.5707964, 3.1415927, 2.0**20, -(2.0**20), 1e5, 0.0, 2.0**-149, 4.712389, 10.995575,
             -6.2831855, 102943.71], 1e4),
    "cos": ([0.78, 0.7853982, 1.5707964, 3.1415927, 2.0**20, -(2.0**20), 1e5, 0.0, 2.0**-149, 4.712389, 10.995575,
             -6.2831855, 102943.71], 1e4),
}


def _f64(a):
    """A numpy array or a tensor (bfloat16 comes as one) as float64 numpy values."""
    return np.asarray(a.double() if hasattr(a, "double") else a, np.float64).reshape(-1)


def _values(op, fmt):
    edges, scale = EDGES[op]
    f32 = np.float32
    near = [np.nextafter(f32(e), f32(d * np.inf)) for e in edges for d in (-1, 1)]
    sweep = [np.float32(e) + np.float32(k) * np.float32(2.0**-12) for e in edges for k in range(-40, 41)]
    rng = np.random.default_rng(len(op))
    rand = rng.standard_normal(4000) * scale
    bits = rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[np.isfinite(bits)]
    xs = np.concatenate([np.array(edges + near + sweep, np.float32), rand.astype(np.float32), bits]).astype(np.float64)
    return [float(v) for v in _f64(to_array(list(xs), fmt))]


def test_log_table_by_hand():
    """The table's entry at 1 is exact (1 and 0: no cancellation near x = 1); every entry's -log(INVC) within
    2**-100 (mpmath at 300 bits); |r| <= 0.0053 at the ends of every cell, ``S = c_k +- 1/256`` (exact rationals)."""
    mp = pytest.importorskip("mpmath")
    assert _ew_vec.INVC[32] == 1.0 and _ew_vec.LT_HI[32] == 0.0 and _ew_vec.LT_LO[32] == 0.0
    assert _ew_vec.INVC[0] == 178956971 / 2**27  # 4/3 to 28 bits (k = -32, c = 0.75): 4/3 2**27 = 178956970.67
    with mp.workprec(300):
        for i in range(97):
            want = -mp.log(mp.mpf(_ew_vec.INVC[i]))
            assert abs(want - mp.mpf(_ew_vec.LT_HI[i]) - mp.mpf(_ew_vec.LT_LO[i])) <= mp.mpf(2) ** -100
            c = 1 + Fraction(i - 32, 128)
            for s in (c - Fraction(1, 256), c + Fraction(1, 256)):
                assert abs(s * Fraction(_ew_vec.INVC[i]) - 1) < Fraction(53, 10000)
        assert abs(mp.log(2) - mp.mpf(_ew_vec.LN2_HI) - mp.mpf(_ew_vec.LN2_LO)) <= mp.mpf(2) ** -93


def test_erf_table_by_hand():
    """erf's coefficients at z0 = 0 are the Maclaurin series', written out: 2/sqrt(pi) (1, 0, -1/3, 0, 1/10, 0,
    -1/42); at z0 = 1, a_1 = 2/sqrt(pi) e**-1 = 0.41510749742059477; A0 at 1 is erf(1) = 0.8427007929497149."""
    a0h, a0l, A = _ew_vec_erf.erf_table()
    c = 1.1283791670955126  # 2 / sqrt(pi)
    want = [c, 0.0, -c / 3, 0.0, c / 10, 0.0, -c / 42]
    assert all(abs(A[0, n + 1] - w) <= 2.0**-52 * abs(w) for n, w in enumerate(want))
    assert abs(A[128, 1] - 0.41510749742059477) <= 2.0**-53
    assert a0h[128] == 0.8427007929497149 and a0h[0] == a0l[0] == 0.0


def test_erfcx_table_by_hand():
    """erfcx(2) = e**4 erfc(2) = 0.2553956763105057 (A&S 7.1); its derivative 2 z f - 2/sqrt(pi) =
    -0.10679646, written out; the second coefficient f''/2 = (2 f + 2 z f') / 2."""
    F = _ew_vec_erf.erfcx_table()
    assert abs(F[0, 0] - 0.2553956763105057) <= 2.0**-52
    f1 = 4 * 0.2553956763105057 - 1.1283791670955126
    assert abs(F[0, 1] - f1) <= 2.0**-50
    assert abs(F[0, 2] - (0.2553956763105057 + 2 * f1)) <= 2.0**-48


def _check(op, xs, fmt, **kw):
    if op == "gelu_tanh":
        op, kw = "gelu", {"approximate": "tanh"}
    x = to_array(xs, fmt)
    got = _f64(getattr(refkern, op)(x, **kw))
    want = _f64(getattr(truth, op)(x, **kw))
    bad = [(xs[i], got[i], want[i]) for i in range(len(xs)) if not same(got[i], want[i])]
    assert not bad, f"{op} {fmt}: (x, reference, truth) {bad[:5]}"


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("op", sorted(EDGES))
def test_first_pass_is_the_truth(op, fmt):
    xs = _values(op, fmt)
    _check(op, xs, fmt)
    # the pass itself decides most elements inside its range (else the float64 tier would answer them all)
    x = np.asarray(xs, np.float32)
    out, und = np.empty(x.size, np.float32), np.zeros(x.size, np.bool_)
    VEC[op](x, (1.0, 20.0) if op == "softplus" else (), _ew_vec.kernel_format(FORMATS[fmt]), out, und)
    assert (~und).sum() >= 0.3 * x.size  # random bit patterns and (log) negative values lie outside its range


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("y", [2.5, -3.0, 1.0 / 3.0, 0.5, -0.5, 7.0, -1.25])
def test_pow_first_pass_is_the_truth(y, fmt):
    """pow's pass (log, product, exp: its exact results, 4**2.5 = 32, decided; midpoints left to the exact path)
    on values of both signs, integers and powers of two included, against the truth."""
    rng = np.random.default_rng(int(abs(y) * 8))
    xs = list(rng.standard_normal(3000) * 10) + [4.0, 2.0, 0.25, 9.0, 16.0, -2.0, 0.0, 1.0, 3.0, 1e-30, 1e30]
    xs = [float(v) for v in _f64(to_array(xs, fmt))]
    _check("pow", xs, fmt, exponent=y)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
def test_square_is_exact_and_rounded_once(fmt):
    """pow(x, 2) as ``round(x * x)``: the ties of each format written out by hand (a square that is a midpoint:
    4097**2 = 2**24 + 8193 -> 2**24 + 8192 in float32, 17**2 = 289 -> 288 in bfloat16, 47**2 = 2209 -> 2208 in
    float16: the even neighbour), overflow and
    underflow, and random values of each format against the truth."""
    hand = {"float32": [(4097.0, 16785408.0), (2.0**64, np.inf), (2.0**64 - 2.0**40, 3.4028232635611926e38), (2.0**-75, 0.0), (2.0**-74, 2.0**-148)],
            "bfloat16": [(17.0, 288.0), (2.0**64, np.inf), (2.0**-75, 0.0)],
            "float16": [(47.0, 2208.0), (257.0, np.inf), (2.0**-13, 0.0), (2.0**-12, 2.0**-24), (3.0, 9.0)]}[fmt]  # fmt: skip
    for x, want in hand:
        got = float(_f64(refkern.pow(to_array([x], fmt), 2.0))[0])
        assert got == want, (fmt, x, got, want)
    rng = np.random.default_rng(5)
    xs = [float(v) for v in _f64(to_array(list(rng.standard_normal(3000) * 1e3), fmt))]
    raw = rng.integers(0, 2**32, 500).astype(np.uint32).view(np.float32).astype(np.float64)
    xs += [float(v) for v in _f64(to_array(list(raw), fmt))]
    _check("pow", xs, fmt, exponent=2.0)
