"""Double-word ("double-double") arithmetic with a stated relative error per operation.

A double-word number is an unevaluated sum ``xh + xl`` of two float64 with
``xh = fl(xh + xl)`` (so ``|xl| <= ulp(xh) / 2``): 106 bits of significand. The algorithms
are those of Joldes, Muller and Popescu, "Tight and rigorous error bounds for basic building
blocks of double-word arithmetic", ACM TOMS 44(2), 2017 (doi:10.1145/3121432), whose proven
relative error bounds, with ``u = 2**-53``, are:

=====================  ==========================  ================
operation              algorithm (JMP 2017)        bound
=====================  ==========================  ================
dw + fp                DWPlusFP (Alg. 4)           2 u^2
dw + dw                AccurateDWPlusDW (Alg. 6)   3 u^2 + 13 u^3
dw * fp                DWTimesFP3 (Alg. 9)         2 u^2
dw * dw                DWTimesDW3 (Alg. 12)        5 u^2
dw / fp                DWDivFP3 (Alg. 15)          3 u^2
dw / dw                DWDivDW3 (Alg. 18)          9.8 u^2
=====================  ==========================  ================

and for the square root (Lefèvre and Muller, "Formally verified double-word square root",
2022 / the classical Karp-Markstein step ``s + (x - s^2) / (2 s)``) 25/8 u^2 + O(u^3).

Every bound holds when no intermediate overflows and no product or quotient underflows
(FMA error terms are then exact). Callers charge :data:`EPS` = 2**-100 = 64 u^2 per
operation, which covers the largest bound above (9.8 u^2) with a factor 6.5 to spare, and
keep every operand's magnitude inside ``[2**-900, 2**900]`` (or exactly zero): below that the
error terms could underflow, which the charge does not cover.
"""

import math

from refkern._jit import jit
from refkern.accumulate._bits import fma
from refkern.accumulate.eft import fast_two_sum, two_product, two_sum

__all__ = ["EPS", "SAFE_LO", "SAFE_HI", "dd_add_fp", "dd_add", "dd_mul_fp", "dd_mul", "dd_div_fp", "dd_div",
           "dd_sqrt", "safe"]  # fmt: skip

EPS = 2.0**-100  #: relative error charged per double-word operation (>= 9.8 u^2, see the module docstring)
SAFE_LO = 2.0**-900  #: smallest nonzero magnitude for which the bounds hold
SAFE_HI = 2.0**900  #: largest magnitude for which the bounds hold


@jit(inline="always")
def safe(x):
    """Whether the float64 ``x`` is zero or of a magnitude the bounds cover."""
    a = abs(x)
    return a == 0.0 or (SAFE_LO <= a <= SAFE_HI)


@jit(inline="always")
def dd_add_fp(xh, xl, y):
    """(xh + xl) + y (DWPlusFP, relative error <= 2 u^2)."""
    sh, sl = two_sum(xh, y)
    v = xl + sl
    return fast_two_sum(sh, v)


@jit(inline="always")
def dd_add(xh, xl, yh, yl):
    """(xh + xl) + (yh + yl) (AccurateDWPlusDW, relative error <= 3 u^2 + 13 u^3, cancellation included)."""
    sh, sl = two_sum(xh, yh)
    th, tl = two_sum(xl, yl)
    c = sl + th
    vh, vl = fast_two_sum(sh, c)
    w = tl + vl
    return fast_two_sum(vh, w)


@jit(inline="always")
def dd_mul_fp(xh, xl, y):
    """(xh + xl) * y (DWTimesFP3, relative error <= 2 u^2)."""
    ch, cl1 = two_product(xh, y)
    cl3 = fma(xl, y, cl1)
    return fast_two_sum(ch, cl3)


@jit(inline="always")
def dd_mul(xh, xl, yh, yl):
    """(xh + xl) * (yh + yl) (DWTimesDW3, relative error <= 5 u^2)."""
    ch, cl1 = two_product(xh, yh)
    tl0 = xl * yl
    tl1 = fma(xh, yl, tl0)
    cl2 = fma(xl, yh, tl1)
    cl3 = cl1 + cl2
    return fast_two_sum(ch, cl3)


@jit(inline="always")
def dd_div_fp(xh, xl, y):
    """(xh + xl) / y (DWDivFP3, relative error <= 3 u^2)."""
    th = xh / y
    ph, pl = two_product(th, y)
    dh = xh - ph
    dt = dh - pl
    d = dt + xl
    tl = d / y
    return fast_two_sum(th, tl)


@jit(inline="always")
def dd_div(xh, xl, yh, yl):
    """(xh + xl) / (yh + yl) (DWDivDW3, relative error <= 9.8 u^2)."""
    th = 1.0 / yh
    rh = fma(-yh, th, 1.0)
    rl = -yl * th
    eh, el = fast_two_sum(rh, rl)
    dh, dl = dd_mul_fp(eh, el, th)
    mh, ml = dd_add_fp(dh, dl, th)  # 1 / (yh + yl)
    return dd_mul(xh, xl, mh, ml)


@jit(inline="always")
def dd_sqrt(xh, xl):
    """sqrt(xh + xl) for xh > 0: s = sqrt(xh), then one Newton step on the exact residual
    ``xh - s^2`` (FMA) plus xl (relative error <= 25/8 u^2 + O(u^3))."""
    s = math.sqrt(xh)
    r = fma(-s, s, xh) + xl
    return fast_two_sum(s, r / (2.0 * s))
