"""Error-free transformations of binary64 arithmetic (round-to-nearest-even).

Each returns the rounded result and its exact error, so that ``s + e`` (or ``p + e``) equals
the exact result with no loss:

* :func:`two_sum` (Knuth): ``s + e == a + b`` for all finite ``a, b`` whose sum does not
  overflow; 6 flops, no branch, no ordering condition.
* :func:`fast_two_sum` (Dekker): the same in 3 flops, valid when ``exponent(a) >= exponent(b)``
  (for instance ``|a| >= |b|``) or ``a == 0``.
* :func:`two_product`: ``p + e == a * b`` through a true FMA, valid when ``a * b`` does not
  overflow and ``e_a + e_b >= -970`` (the error of the product is then a multiple of 2**-1074,
  representable; Boldo and Muller 2011).
* :func:`two_product_dekker`: the same without FMA (Veltkamp split, Dekker product), with the
  split guarded against overflow: operands above 2**996 are split by truncation, because
  ``(2**27 + 1) * a`` would overflow.
* :func:`two_product_scaled`: ``(p + e) * 2**k == a * b`` for *every* pair of finite binary64,
  including products that overflow or underflow binary64: the significands in [0.5, 1) are
  multiplied and the exponent ``k`` is returned as an integer. This is what guards the exact
  accumulator against losing the error term near underflow.

References: Dekker (1971), Knuth TAOCP vol. 2, Ogita, Rump and Oishi (2005)
doi:10.1137/030601818, Muller et al., *Handbook of Floating-Point Arithmetic* ch. 4.
"""

import math

from refkern._jit import jit
from refkern.accumulate._bits import bits, fma, from_bits

__all__ = [
    "two_sum",
    "fast_two_sum",
    "two_product",
    "two_product_dekker",
    "two_product_scaled",
    "split",
]

_SPLITTER = 134217729.0  # 2**27 + 1: splits a binary64 into two 26-bit halves
_SPLIT_MAX = 2.0**996  # above this (2**27 + 1) * a may overflow
_CLEAR_LOW27 = ~((1 << 27) - 1)  # int64 mask keeping sign, exponent and the top 25 stored bits


@jit(inline="always")
def two_sum(a, b):
    """s = fl(a + b), e = (a + b) - s exactly (Knuth)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@jit(inline="always")
def fast_two_sum(a, b):
    """s = fl(a + b), e = (a + b) - s exactly, provided exponent(a) >= exponent(b) (Dekker)."""
    s = a + b
    e = b - (s - a)
    return s, e


@jit(inline="always")
def two_product(a, b):
    """p = fl(a * b), e = a * b - p exactly via FMA (no overflow; e_a + e_b >= -970)."""
    p = a * b
    return p, fma(a, b, -p)


@jit
def split(a):
    """Veltkamp split: a == hi + lo, hi and lo of at most 26 significant bits each.

    Guarded for |a| > 2**996, where (2**27 + 1) * a overflows and rounding a to 26 bits can
    itself reach 2**1024: there the split truncates instead (hi is a with its 27 low significand
    bits cleared, so |hi| <= |a|), and lo has up to 27 bits. Dekker's product stays exact with
    such a factor: the other one is below 2**28 (or the product overflows anyway) and is split
    by rounding into 26-bit halves, so every partial product still fits in 53 bits.
    """
    if abs(a) > _SPLIT_MAX:
        hi = from_bits(bits(a) & _CLEAR_LOW27)
        return hi, a - hi
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


@jit
def two_product_dekker(a, b):
    """p = fl(a * b), e = a * b - p exactly without FMA (Dekker), split guarded against overflow.

    Exact under the same conditions as :func:`two_product`.
    """
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@jit
def two_product_scaled(a, b):
    """(p, e, k) with (p + e) * 2**k == a * b exactly, for all finite a, b.

    a = ma * 2**ea and b = mb * 2**eb with ma, mb in [0.5, 1) (frexp), so ma * mb lies in
    [0.25, 1) and its FMA error term is far from underflow; k = ea + eb carries the exponent,
    which may lie far outside binary64's range (down to -2148, up to 2048).
    """
    if a == 0.0 or b == 0.0:
        return a * b, 0.0, 0
    ma, ea = math.frexp(a)
    mb, eb = math.frexp(b)
    p = ma * mb
    return p, fma(ma, mb, -p), ea + eb
