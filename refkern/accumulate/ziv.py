"""Correct rounding of values that are not sums: a fast decision, and an exact fallback (Ziv).

A reference value such as ``(x - mean) / sqrt(var + eps) * w + b`` is real-valued. The fast
path knows it as a double-word ``y = yh + yl`` with a rigorous absolute error bound
``|r - y| <= err`` (:mod:`refkern.accumulate.dd`). :func:`decide` returns ``RN(r)``, the value
rounded to nearest-even in the result format, whenever every real number of
``[y - err, y + err]`` rounds to the same format value, and NaN otherwise. The few undecided
elements (exact ties, values within ``err`` of a midpoint, magnitudes outside the range where
the bounds hold) are rounded by the exact path: rational arithmetic on Python integers
(:func:`round_fraction`, and :func:`round_quotient_sqrt` for ``b + a / sqrt(z)``), which decides
a midpoint by an exact comparison of squares, so it always terminates and never guesses
(Ziv, "Fast evaluation of elementary mathematical functions with correctly rounded last
bit", ACM TOMS 17(3), 1991).
"""

import math
from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import JMAX, JMIN, NCHUNKS, acc_add_float, acc_round

__all__ = ["decide", "acc_copy", "acc_dd", "round_fraction", "round_quotient_sqrt", "acc_fraction"]

_TINY = 2.0**-960  # below this a float64 result's error terms may underflow: left to the exact path
_HUGE = 2.0**1000


@jit(inline="always")
def decide(yh, yl, err, prec, emin, emax):
    """RN(r) in the format (prec, emin, emax) for every real r with |r - (yh + yl)| <= err, or NaN.

    Bracketing. With ``d = 2 err + 8u |yl| + 4u |yh| [prec < 53] + 2**-1070`` (``u = 2**-53``),
    ``lo = fl(yh + fl(yl - d))`` and ``hi = fl(yh + fl(yl + d))`` satisfy ``lo <= r <= hi``:
    each of the two float64 roundings moves a value by at most ``u`` times its magnitude, which
    the ``8u|yl|`` and ``4u|yh|`` terms absorb, and ``2 err - err >= err``. Rounding is monotonic,
    so ``RN(lo) == RN(hi)`` implies ``RN(r)`` is that value. For float64 results the ``4u|yh|``
    term is dropped: ``fl(yh + t)`` is then itself the one rounding to the format of the exact
    ``yh + t``, and ``yh + fl(yl - d) <= r`` already holds. NaN (undecided) when the interval
    holds a midpoint, when ``err`` is not finite, or when ``|yh|`` lies outside
    ``[2**-960, 2**1000]`` (zero included: the sign of an exact zero is the caller's to decide).
    """
    ay = abs(yh)
    if not (ay >= _TINY and ay <= _HUGE):
        return np.nan
    d = 2.0 * err + abs(yl) * 2.0**-50 + 2.0**-1070
    if prec < 53:
        d += ay * 2.0**-51
        a = round_to(yh + (yl - d), prec, emin, emax)
        b = round_to(yh + (yl + d), prec, emin, emax)
    else:
        a = yh + (yl - d)
        b = yh + (yl + d)
    return a if a == b else np.nan


@jit(inline="always")
def acc_copy(dst, src):
    """dst = src for the chunks ``src`` uses and its bookkeeping slots (dst's other chunks zeroed)."""
    for j in range(NCHUNKS):
        dst[j] = 0
    for j in range(src[JMIN], src[JMAX] + 1):
        dst[j] = src[j]
    for j in range(NCHUNKS, src.size):
        dst[j] = src[j]


@jit
def acc_dd(acc, tmp):
    """The exact value S of ``acc`` as a double-word (hi, lo), ``acc`` left unchanged.

    hi = RN(S) and lo = RN(S - hi), so |S - hi - lo| <= ulp(lo) / 2 <= 2**-106 |hi| (plus
    2**-1075 where lo is subnormal). Specials and sums beyond float64's range come back as hi
    (NaN, +-inf) with lo = 0; the caller tells an overflow from an infinite term.
    """
    acc_copy(tmp, acc)
    hi = acc_round(tmp, 53, -1022, 1023)
    if hi - hi != 0.0 or hi == 0.0:
        return hi, 0.0
    acc_copy(tmp, acc)
    acc_add_float(tmp, -hi)
    lo = acc_round(tmp, 53, -1022, 1023)
    return hi, lo


def acc_fraction(acc) -> Fraction:
    """The exact finite value of an accumulator as a Fraction (for the exact path)."""
    from refkern.accumulate.superacc import LOW

    acc = np.asarray(acc)
    total = 0
    lo, hi = int(acc[JMIN]), int(acc[JMAX])
    for j in range(lo, hi + 1):
        total += int(acc[j]) << (32 * (j - lo))
    return Fraction(total) * Fraction(2) ** (LOW + 32 * lo) if hi >= 0 else Fraction(0)


def round_fraction(q: Fraction, fmt) -> float:
    """``q`` rounded once, to nearest even, to ``fmt`` (a Format): subnormal grid, overflow to
    +-inf when the value rounded with an unbounded exponent reaches ``2**(emax + 1)``, -0.0 for a
    negative value that rounds to zero, +0.0 for zero."""
    if q == 0:
        return 0.0
    neg = q < 0
    num, den = abs(q.numerator), q.denominator
    e = num.bit_length() - den.bit_length()  # 2**e <= |q| < 2**(e + 2)
    if num < den << e if e >= 0 else (num << -e) < den:
        e -= 1
    elif (num >= den << (e + 1)) if e + 1 >= 0 else ((num << -(e + 1)) >= den):
        e += 1
    lsb = max(e - fmt.prec + 1, fmt.emin - fmt.prec + 1)
    n2, d2 = (num, den << lsb) if lsb >= 0 else (num << -lsb, den)
    m, rest = divmod(n2, d2)
    if 2 * rest > d2 or (2 * rest == d2 and m & 1):
        m += 1
    if m == 0:
        return -0.0 if neg else 0.0
    if m.bit_length() - 1 + lsb > fmt.emax:
        return -math.inf if neg else math.inf
    v = math.ldexp(m, lsb)
    return -v if neg else v


def _above(a: Fraction, z: Fraction, t: Fraction) -> int:
    """sign(a / sqrt(z) - t) for z > 0, exactly (squares compared; no square root taken)."""
    if a == 0:
        return (t < 0) - (t > 0)
    if a > 0 >= t:
        return 1
    if a < 0 <= t:
        return -1
    c = (a * a > t * t * z) - (a * a < t * t * z)  # compares |a| / sqrt(z) with |t|
    return c if a > 0 else -c


def round_quotient_sqrt(b: Fraction, a: Fraction, z: Fraction, fmt) -> float:
    """``b + a / sqrt(z)`` (z > 0, rationals) rounded once, to nearest even, to ``fmt``.

    ``sqrt(z)`` is bracketed with an integer square root, ``isqrt(zn zd 4**k) / (zd 2**k)``
    and the next integer above it, so the value lies in a known rational interval; when both
    ends round alike that is the answer. Otherwise the interval holds one midpoint ``m`` of two
    adjacent format values (it is far narrower than a unit in the last place), and the side of
    ``m`` the value lies on is decided exactly by :func:`_above`; a value exactly at ``m``
    rounds as ``m`` itself does (ties to even). k grows only if the interval was too wide.
    """
    if a == 0:
        return round_fraction(b, fmt)
    zn, zd = z.numerator, z.denominator
    k = 2 * (fmt.prec + 40) + max(0, zd.bit_length() - zn.bit_length())
    while True:
        s = math.isqrt(zn * zd << (2 * k))
        lo_root, hi_root = Fraction(s, zd << k), Fraction(s + 1, zd << k)  # lo_root <= sqrt(z) < hi_root
        ends = sorted((b + a / hi_root, b + a / lo_root))
        r0, r1 = round_fraction(ends[0], fmt), round_fraction(ends[1], fmt)
        if r0 == r1:
            return r0
        if math.isfinite(r0) or math.isfinite(r1):
            top = Fraction(2) ** (fmt.emax + 1)
            f0 = Fraction(r0) if math.isfinite(r0) else -top
            f1 = Fraction(r1) if math.isfinite(r1) else top
            m = (f0 + f1) / 2
            if round_fraction(ends[0], fmt) == r0 and ends[0] <= m <= ends[1] and _adjacent(f0, f1, fmt):
                side = _above(a, z, m - b)
                if side > 0:
                    return r1
                if side < 0:
                    return r0
                return round_fraction(m, fmt)
        k *= 2


def _adjacent(f0: Fraction, f1: Fraction, fmt) -> bool:
    """Whether no value of ``fmt`` lies strictly between the format values f0 < f1."""
    m = (f0 + f1) / 2
    r = round_fraction(m, fmt)
    return r in (float(f0) if abs(f0) < Fraction(2) ** (fmt.emax + 1) else math.copysign(math.inf, f0),
                 float(f1) if abs(f1) < Fraction(2) ** (fmt.emax + 1) else math.copysign(math.inf, f1))  # fmt: skip
