"""Exact real arithmetic on Python integers: rigorous intervals for ln 2, exp and log, and
the one rounding of an interval to a format (the exact path of Ziv's strategy).

Nothing here uses floating point, mpmath or refkern's jitted numerics: every quantity is an
integer interval ``[lo, hi] * 2**sh`` that provably contains the real value, built from
series whose every truncated term is accounted for. The precision is a parameter; the caller
raises it until both ends of its result round alike (:func:`round_interval`). Results that
are exactly representable or exact midpoints never come out of such a loop: the callers find
them first (they are rational, and then computed as fractions).

Error accounting, in units of the last fixed-point place ``2**-w``:

* ``ln 2 = sum_j 2 / ((2j + 1) 3**(2j + 1))`` (= 2 atanh(1/3)): each term is taken as
  ``floor(2**(w+1) / (3**(2j+1) (2j+1)))`` (a floor of the exact value: error < 1); the
  loop stops when ``floor(2**(w+1) / 3**(2j+1)) == 0``, where the exact tail is < 9/8. So
  ``ln 2 * 2**w`` lies in ``[s, s + J + 2]`` after J terms.
* ``exp(r)``, ``|r| <= 1/2``, ``r = R / 2**w``: terms ``t_k = trunc(trunc(t_{k-1} R / 2**w) / k)``
  differ from the exact ``T_k = r**k / k! * 2**w`` by ``e_k <= e_{k-1} |r| / k + 1/k + 1 <= 3``;
  the loop stops at the first ``t_k == 0``, where ``|T_k| <= 3`` and the tail (each term at
  most half the previous) is <= 6. So the sum is within ``3 K + 6`` of ``exp(r) 2**w``.
* ``exp(d) = 2**k exp(d - k ln 2)`` with ``k = round(d / ln 2)``: ``d - k ln 2`` is bracketed
  from the ln 2 interval (d itself is exact), and exp is increasing, so the series at the two
  ends bound the value.
* ``log(x) = (b + sh) ln 2 + 2 atanh(t)``, ``x = A 2**sh``, ``b = bitlen(A) - 1``,
  ``t = (A - 2**b) / (A + 2**b)`` in ``[0, 1/3)``: ``atanh(t) = sum t**(2j+1) / (2j+1)``
  with floors (powers ``p_{j+1} = floor(p_j num**2 / den**2)`` lose < 1.2 each, each term
  < 2.2 more; tail < 2), so ``atanh(t) 2**w`` lies in ``[s, s + 3 J + 2]``; log is
  increasing, so the lower end comes from the lower input and the upper from the upper.
"""

import math
from functools import lru_cache

__all__ = ["ln2_fixed", "exp_fixed", "exp_interval", "log_interval", "round_dyadic", "round_interval",
           "dyadic", "add_intervals", "approx"]  # fmt: skip

_LN2_APPROX = 0.6931471805599453


@lru_cache(maxsize=64)
def ln2_fixed(w: int) -> tuple[int, int]:
    """(lo, hi) with lo <= ln(2) * 2**w <= hi (module docstring)."""
    s = 0
    p = (1 << (w + 1)) // 3  # floor(2**(w+1) / 3**(2j+1))
    j = 0
    while p:
        s += p // (2 * j + 1)
        p //= 9
        j += 1
    return s, s + j + 2


def _tdiv(a: int, b: int) -> int:
    """a / b truncated toward zero (b > 0)."""
    q = abs(a) // b
    return q if a >= 0 else -q


def exp_fixed(R: int, w: int) -> tuple[int, int]:
    """(s, err): ``|exp(R / 2**w) * 2**w - s| <= err`` for ``|R| <= 2**(w-1)`` (module docstring)."""
    one = 1 << w
    s = one
    t = one
    k = 0
    while t:
        k += 1
        t = _tdiv(_tdiv(t * R, one), k)
        s += t
    return s, 3 * k + 6


def dyadic(x) -> tuple[int, int]:
    """A finite float or a Fraction with a power-of-two denominator as (n, e): x == n * 2**e."""
    n, d = x.as_integer_ratio() if isinstance(x, float) else (x.numerator, x.denominator)
    e = d.bit_length() - 1
    if d != 1 << e:
        raise ValueError(f"dyadic: {x!r} has a denominator that is not a power of two")
    return n, -e


def approx(n: int, e: int) -> float:
    """``n * 2**e`` as a nearby float (not correctly rounded; 0.0 far below the float range, +-inf
    far above): for choosing precisions and reductions, never for a result."""
    b = n.bit_length()
    if b > 60:
        n, e = n >> (b - 60), e + b - 60
    if e + 60 < -1200:
        return 0.0
    if e > 1100:
        return math.copysign(math.inf, n)
    return math.ldexp(n, e)


def _floor_scaled(n: int, e: int, w: int) -> int:
    """floor(n * 2**(e + w))."""
    s = e + w
    return n << s if s >= 0 else n >> -s


def _ceil_scaled(n: int, e: int, w: int) -> int:
    return -_floor_scaled(-n, e, w)


def exp_interval(n: int, e: int, w: int) -> tuple[int, int, int]:
    """(lo, hi, sh) with ``lo * 2**sh <= exp(n * 2**e) <= hi * 2**sh``, ``lo > 0``, relative width
    about ``(|k| + 3 w) 2**-w`` (k ~ d / ln 2). Requires ``|n * 2**e| < 2**24``."""
    if n == 0:
        return 1, 1, 0
    d_approx = approx(n, e)
    if not abs(d_approx) < 2.0**24:
        raise ValueError("exp_interval: |d| must be below 2**24")
    k = round(d_approx / _LN2_APPROX)
    W = w + 8 + abs(k).bit_length()
    l_lo, l_hi = ln2_fixed(W)
    d_lo, d_hi = _floor_scaled(n, e, W), _ceil_scaled(n, e, W)
    kl = (k * l_lo, k * l_hi)
    r_lo, r_hi = d_lo - max(kl), d_hi - min(kl)  # d - k ln2, |.| <= ln2 / 2 + tiny < 1/2
    s_lo, e_lo = exp_fixed(r_lo, W)
    s_hi, e_hi = exp_fixed(r_hi, W)
    return s_lo - e_lo, s_hi + e_hi, k - W


def _atanh_fixed(num: int, den: int, w: int) -> tuple[int, int]:
    """(lo, hi) with lo <= atanh(num / den) * 2**w <= hi, for 0 <= num / den < 1/3."""
    p = (num << w) // den
    n2, d2 = num * num, den * den
    s = 0
    j = 0
    while p:
        s += p // (2 * j + 1)
        p = p * n2 // d2
        j += 1
    return s, s + 3 * j + 2


def _log_int(A: int, sh: int, w: int) -> tuple[int, int]:
    """(lo, hi) with lo <= log(A * 2**sh) * 2**w <= hi, A > 0."""
    b = A.bit_length() - 1
    a_lo, a_hi = _atanh_fixed(A - (1 << b), A + (1 << b), w)
    c = b + sh
    g = abs(c).bit_length() + 2  # guard bits: c times ln 2's error stays below one unit
    l_lo, l_hi = ln2_fixed(w + g)
    kl = (c * l_lo, c * l_hi)
    return (min(kl) >> g) + 2 * a_lo, -(-max(kl) >> g) + 2 * a_hi


def log_interval(lo: int, hi: int, sh: int, w: int) -> tuple[int, int, int]:
    """(Llo, Lhi, -w) with ``Llo 2**-w <= log(x) <= Lhi 2**-w`` for every x in ``[lo, hi] 2**sh``, lo > 0."""
    return _log_int(lo, sh, w)[0], _log_int(hi, sh, w)[1], -w


def add_intervals(terms, sh: int) -> tuple[int, int]:
    """Sum of intervals ``(lo, hi, s)`` on the common scale ``2**sh`` (lower ends floored, upper
    ends ceiled): (LO, HI) with the exact sum inside ``[LO, HI] * 2**sh``."""
    LO = HI = 0
    for lo, hi, s in terms:
        LO += _floor_scaled(lo, s, -sh)
        HI += _ceil_scaled(hi, s, -sh)
    return LO, HI


def round_dyadic(n: int, e: int, prec: int, emin: int, emax: int) -> float:
    """``n * 2**e`` rounded once to nearest even in the format (prec, emin, emax): subnormal grid,
    +-inf when the value rounded with an unbounded exponent reaches ``2**(emax + 1)``, -0.0 for a
    negative value that rounds to zero, +0.0 for zero."""
    if n == 0:
        return 0.0
    neg = n < 0
    man = -n if neg else n
    top = e + man.bit_length() - 1
    lsb = max(top - prec + 1, emin - prec + 1)
    shift = lsb - e
    if shift <= 0:
        m = man << -shift
    else:
        m = man >> shift
        rest = man - (m << shift)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and m & 1):
            m += 1
    if m == 0:
        return -0.0 if neg else 0.0
    if m.bit_length() - 1 + lsb > emax:
        return -math.inf if neg else math.inf
    v = math.ldexp(m, lsb)
    return -v if neg else v


def round_interval(lo: int, hi: int, sh: int, prec: int, emin: int, emax: int):
    """The rounding of every real in ``[lo, hi] * 2**sh`` when they all round alike (zeros of
    both signs are told apart), else None."""
    a = round_dyadic(lo, sh, prec, emin, emax)
    b = round_dyadic(hi, sh, prec, emin, emax)
    if a == b and math.copysign(1.0, a) == math.copysign(1.0, b):
        return a
    return None
