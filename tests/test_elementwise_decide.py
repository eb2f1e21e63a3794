"""The float64 tier's decision (refkern.kernels._transcendental.decide_near, ldexp, frexp1) against exact
rationals: a decided element is the rounding of every real its bound allows, written out by hand at the
boundaries (midpoints of float32, the subnormal range, overflow), and the bit-built ldexp/frexp are libm's."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refkern.kernels._transcendental import decide_near, decide_scaled, frexp1, ldexp

F32 = (24, -126, 127)
BF16 = (8, -126, 127)
F16 = (11, -14, 15)


def _rn(r: Fraction, prec, emin, emax) -> float:
    """The rounding to nearest even of the rational r to (prec, emin, emax), from its integers."""
    if r == 0:
        return 0.0
    neg, a = r < 0, abs(r)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e = e if Fraction(2) ** e <= a else e - 1  # 2**e <= a < 2**(e+1)
    q = max(e, emin) - prec + 1
    n = a / Fraction(2) ** q
    k = math.floor(n)
    k = k + 1 if (n - k > Fraction(1, 2) or (n - k == Fraction(1, 2) and k % 2)) else k
    v = math.inf if k * Fraction(2) ** q >= Fraction(2) ** (emax + 1) else float(k * Fraction(2) ** q)
    return -v if neg else v


def _agree(q, e, k, fmt):
    """decide_near's answer is either undecided or the rounding of both ends of [q - e, q + e] 2**k."""
    r, ok = decide_near(q, e, k, *fmt)
    if not ok:
        return None
    ends = [(Fraction(q) + s * Fraction(e)) * Fraction(2) ** k for s in (-1, 1)]
    want = [_rn(v, *fmt) for v in ends]
    assert want[0] == want[1] == r, (q, e, k, r, want)
    return r


def test_float32_midpoints_by_hand():
    mid = 1.0 + 2.0**-24  # halfway between 1 and 1 + 2**-23
    assert decide_near(mid, 0.0, 0, *F32)[1] is False  # an exact midpoint: the exact path's
    # 2**-50 above the midpoint, within 2**-52: the bracket's f = (2**-52 + 2u) (1 + 2u) ~ 2**-51 < 2**-50
    assert _agree(mid + 2.0**-50, 2.0**-52, 0, F32) == 1.0 + 2.0**-23
    assert _agree(mid - 2.0**-50, 2.0**-52, 0, F32) == 1.0
    # within 2**-50 of it the bound straddles the midpoint: neither step decides
    assert decide_near(mid + 2.0**-50, 2.0**-50, 0, *F32)[1] is False
    # the bottom of a binade: 1 - 2**-25 is the midpoint below 1 (the grid below is twice as fine)
    assert decide_near(1.0 - 2.0**-25, 0.0, 0, *F32)[1] is False
    assert _agree(1.0 - 2.0**-25 + 2.0**-48, 2.0**-52, 0, F32) == 1.0


def test_float32_subnormals_and_overflow_by_hand():
    # 2**-150 is halfway between 0 and the smallest subnormal 2**-149: a tie, left to the exact path
    assert decide_near(1.0, 0.0, -150, *F32)[1] is False
    assert decide_near(1.0, 0.0, -149, *F32) == (2.0**-149, True)
    assert _agree(1.0 + 2.0**-20, 2.0**-40, -150, F32) == 2.0**-149
    assert decide_near(1.5, 2.0**-40, -149, *F32)[1] is False  # straddles the midpoint 1.5 * 2**-149
    assert _agree(1.5 + 2.0**-20, 2.0**-40, -149, F32) == 2.0**-148
    # float32's largest finite value and the midpoint above it, which rounds to inf (2**128 is "even")
    top = float(np.finfo(np.float32).max)
    assert _agree(top, 2.0**-80, 0, F32) == top
    assert _agree(1.0 - 2.0**-25 + 2.0**-40, 2.0**-60, 128, F32) == math.inf
    assert _agree(1.0 - 2.0**-25 - 2.0**-40, 2.0**-60, 128, F32) == top
    # k beyond the product's range (decide_scaled alone) and a scale that underflows float64
    assert decide_near(1.0, 2.0**-60, 2000, *F32) == (math.inf, True)
    assert decide_near(1.0, 2.0**-60, -1100, *F32) == (0.0, True)
    assert decide_near(-1.0, 2.0**-60, -1060, *F32)[0] == 0.0 and np.signbit(decide_near(-1.0, 0.0, -1060, *F32)[0])


def test_zeros_and_specials_by_hand():
    assert decide_near(0.0, 0.0, 0, *F32) == (0.0, True)  # decide_scaled's exact zero
    assert decide_near(0.0, 2.0**-60, 0, *F32)[1] is False  # a zero within a bound: the sign is unknown
    for v in (math.nan, math.inf):
        assert decide_near(v, 0.0, 0, *F32)[1] is False
    assert decide_near(1.0, math.inf, 0, *F32)[1] is False


@pytest.mark.parametrize("fmt", [F32, BF16, F16], ids=["float32", "bfloat16", "float16"])
@settings(max_examples=400, deadline=None)
@given(m=st.integers(0, 2**24), k=st.integers(-180, 140), off=st.integers(-(2**12), 2**12),
       ebits=st.integers(20, 80))  # fmt: skip
def test_decided_elements_are_the_rounding_of_the_whole_bound(fmt, m, k, off, ebits):
    """Values a few float64 ulps off a midpoint or a representable number of the format (m odd: a midpoint at
    the format's precision + 1 bits), bounds from 2**-80 to 2**-20 relative: whatever is decided is the rounding
    of both ends; and decide_near decides wherever decide_scaled does (it falls back to it)."""
    prec = fmt[0]
    q = 1.0 + (m % 2 ** (prec + 1)) * 2.0 ** -(prec + 1) + off * 2.0**-52
    e = q * 2.0**-ebits
    r = _agree(q, e, k, fmt)
    rs, oks = decide_scaled(q, 0.0, e, k, *fmt)
    if oks:
        assert r == rs


@settings(max_examples=300, deadline=None)
@given(v=st.floats(-1e300, 1e300), m=st.integers(-1100, 1100))
def test_ldexp_is_libms(v, m):
    try:
        want = math.ldexp(v, m)
    except OverflowError:  # Python's ldexp raises where the C one gives +-inf
        want = math.copysign(math.inf, v)
    got = ldexp(v, m)
    assert got == want and np.signbit(got) == np.signbit(want)


def test_ldexp_rounds_subnormal_results_as_libm():
    for v in (1.0 + 2.0**-52, 1.5, 1.0 + 3 * 2.0**-52, -1.75, 0.75 + 2.0**-53):
        for m in (-1060, -1070, -1074, -1075, -1023):
            assert ldexp(v, m) == math.ldexp(v, m)


@settings(max_examples=300, deadline=None)
@given(x=st.floats())
def test_frexp1_is_twice_frexp(x):
    m, ex = math.frexp(x)
    got = frexp1(x)
    assert got[1] == ex - 1 and (got[0] == 2.0 * m or (math.isnan(m) and math.isnan(got[0])))


def test_frexp1_by_hand():
    assert frexp1(1.0) == (1.0, 0)
    assert frexp1(-3.0) == (-1.5, 1)
    assert frexp1(5e-324) == (1.0, -1074)  # a subnormal, through libm's frexp
    assert frexp1(float(np.finfo(np.float64).max))[1] == 1023
