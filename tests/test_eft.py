"""Error-free transformations: s + e (or p + e, or (p + e) 2**k) equals the exact result."""

import math
from fractions import Fraction

from hypothesis import assume, example, given
from hypothesis import strategies as st

from refkern.accumulate.eft import fast_two_sum, split, two_product, two_product_dekker, two_product_scaled, two_sum

finite = st.floats(allow_nan=False, allow_infinity=False)
moderate = st.floats(min_value=-(2.0**500), max_value=2.0**500, allow_nan=False).filter(
    lambda v: v == 0 or abs(v) > 2.0**-480
)


def F(v):
    return Fraction(v)


@given(finite, finite)
@example(1e16, 1.0)
@example(1.0, -(1.0 - 2.0**-53))
def test_two_sum(a, b):
    assume(math.isfinite(a + b))
    s, e = two_sum(a, b)
    assert s == a + b
    assert F(s) + F(e) == F(a) + F(b)


@given(finite, finite)
@example(2.0**60, 3.0)
def test_fast_two_sum(a, b):
    if abs(a) < abs(b):
        a, b = b, a
    assume(math.isfinite(a + b))
    s, e = fast_two_sum(a, b)
    assert F(s) + F(e) == F(a) + F(b)


@given(moderate, moderate)
@example(1.0 + 2.0**-30, 1.0 + 2.0**-30)
def test_two_product_fma(a, b):
    p, e = two_product(a, b)
    assert p == a * b
    assert F(p) + F(e) == F(a) * F(b)


@given(moderate, moderate)
def test_two_product_dekker_agrees_with_fma(a, b):
    assert two_product_dekker(a, b) == two_product(a, b)


@given(st.floats(min_value=2.0**996, max_value=1.7e308) | st.floats(max_value=-(2.0**996), min_value=-1.7e308))
@example(1.7976931348623157e308)
def test_split_is_guarded_against_overflow(a):
    hi, lo = split(a)
    assert math.isfinite(hi) and math.isfinite(lo)
    assert F(hi) + F(lo) == F(a)
    assert abs(hi) <= abs(a)
    for h, width in ((hi, 26), (lo, 27)):  # significand bits of each half
        if h:
            assert (Fraction(h) / Fraction(2) ** (math.frexp(h)[1] - width)).denominator == 1


@given(
    st.floats(min_value=2.0**996, max_value=1.7976931348623157e308),
    st.floats(min_value=2.0**-60, max_value=0.9999999999999999),
    st.booleans(),
)
@example(1.7976931348623157e308, 0.9999999999999999, False)
@example(1.7976931348623157e308, 3 * 2.0**-30, True)
def test_two_product_dekker_exact_for_huge_operands(a, b, negative):
    b = -b if negative else b  # |b| < 1: the product stays finite
    p, e = two_product_dekker(a, b)
    assert F(p) + F(e) == F(a) * F(b)
    p2, e2 = two_product_dekker(b, a)
    assert F(p2) + F(e2) == F(a) * F(b)


@given(finite, finite)
@example(1e300, 1e300)  # the product overflows binary64
@example(5e-324, 5e-324)  # the product underflows to 2**-2148
@example(2.0**-537, 3.0 * 2.0**-537)  # FMA's error term would be subnormal and inexact
def test_two_product_scaled_is_exact_everywhere(a, b):
    p, e, k = two_product_scaled(a, b)
    assert (F(p) + F(e)) * Fraction(2) ** k == F(a) * F(b)


def test_fma_is_fused():
    """A true FMA: (1 + 2**-30)**2 - fl((1 + 2**-30)**2) is 2**-60, not 0."""
    x = 1.0 + 2.0**-30
    assert two_product(x, x)[1] == 2.0**-60
