"""exp and log with rigorous error bounds, in float64 and in double-word, and the decision of a
rounding from a bound (the fast paths of Ziv's strategy for softmax, log_softmax and attention).

``u = 2**-53``; ``EPS = 2**-100`` is the relative error charged per double-word operation
(:mod:`refkern.accumulate.dd`: the Joldes-Muller-Popescu bounds are at most 9.8 u^2 < EPS).
Every constant below (ln 2 / 64 in three parts, 2**(j/64) and 1/k! as double-words) is built at
import from Python-integer series (:mod:`refkern.kernels._exact_real`), never from libm.

**exp_fast(x)**, ``-2000 <= x <= 1``: returns (v, m) with ``e**x = v 2**m (1 + t)``,
``|t| <= EXP_FAST_REL = 2u``. Reduction ``n = rint(x * 64/ln2)`` (|n| < 2**18),
``j = n mod 64``, ``m = floor(n / 64)``; ``C1`` is ln2/64 rounded to 35 bits, so ``n C1`` is
exact and ``x - n C1`` is exact too (both lie on the grid ``min(ulp(x), 2**-41)`` -- |x| >= 2**-8
when n != 0 -- and the difference is below 2**-7: 53 bits suffice). ``r = (x - n C1) - n C2``
is within ``u |r| + 2**-70`` of ``x - n ln2/64`` (the missing ``n C3`` is below 2**-77) and
``|r| <= 0.0055``. ``q = r (1 + r (1/2 + ... + r / 6!))`` (Horner, float64) is within
``3.2 u |q|`` of its polynomial, which is within ``|r|**7 / 7! < 2**-65`` of ``e**r - 1``; then
``v = T_hi + fma(T_hi, q, T_lo)`` with ``T = 2**(j/64)`` a double-word (relative error 2**-106).
Relative to ``v >= 0.99``: final rounding u, fma rounding 0.012u, q's error 0.036u, r's error
0.006u, truncation 0.0003u: below 1.06u, charged as 2u.

**exp_dd(xh, xl)**, the same reduction in double-word: ``r = (xh - n C1) - n C2 + xl - n C3``
from exact two-sums and one double-word addition (error <= 2 EPS |r| + 2**-129); for
``|r| < 2**-200``, ``e**r - 1 = r`` within ``r**2``; otherwise ``q = r h_1`` with
``h_k = 1/k! + r h_{k+1}`` (k = 10..1, h_11 = 1/11!) in double-word (error of q about
2.02 EPS |q| <= 0.012 EPS; truncation ``|r|**12 / 12! < 2**-119``), and
``v = T + T q`` (two operations: EPS each, the product's relative to |T q| <= 0.012).
Total below 1.05 EPS + 2**-106: charged as ``EXP_DD_REL = 2 EPS``. Operands stay within
[2**-330, 4], where the double-word bounds hold.

**log**: see :func:`log_fast` and :func:`log_dd` (a series for log1p of small arguments, else
libm's log checked a posteriori through the bounded exp: ``|log S - L0| = |log(S e**-L0)|``).

**decide_scaled(qh, ql, e, k, fmt)** rounds ``(qh + ql + t) 2**k``, ``|t| <= e``, to the format
when every such value rounds alike: scaled so that the format's quantum is 1, the value is
``N + f`` with ``N`` an integer and ``|f| + e_s < 1/2``; at the bottom of a binade
(``N = 2**(prec-1)`` above the subnormal range) the grid below is twice as fine, so the value
must also exceed ``N - 1/4``. Rounds to zero (sign kept) below half the smallest subnormal and
to +-inf beyond the largest finite value, as IEEE 754 does.

**decide_near(q, e, k, fmt)** decides the same thing for a single float64 ``q`` first by :func:`bracket_around`
on ``fl(q 2**k)`` (two roundings of the enclosure's ends; a float32 format by the hardware's conversion), which
costs a few ns where decide_scaled's frexp and ldexp calls cost tens; what it leaves (about twice decide_scaled's
share, 2**-26 of float32 elements) goes to decide_scaled. :func:`ldexp` and :func:`frexp1` are libm's ldexp and a
scaled frexp built from the bits (the same values) where the exponents allow, libm's call otherwise.
"""

import math
from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate._bits import bits, fma, from_bits, pow2
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_mul
from refkern.accumulate.eft import two_product, two_sum
from refkern.accumulate.formats import round_to
from refkern.kernels import _exact_real as xr

__all__ = ["EPS", "EXP_FAST_REL", "EXP_DD_REL", "U", "exp_fast", "exp_dd", "log_fast", "log_dd", "decide_scaled",
           "decide_near", "bracket", "bracket_around", "ldexp", "frexp1", "X_MIN"]  # fmt: skip

U = 2.0**-53
EXP_FAST_REL = 2.0 * U
EXP_DD_REL = 2.0 * EPS
X_MIN = -2000.0  #: smallest argument of exp_fast / exp_dd (callers treat smaller ones as negligible)


def _dd_of(q: Fraction) -> tuple[float, float]:
    """A rational as a double-word: hi = RN(q), lo = RN(q - hi) (Fraction -> float rounds correctly)."""
    hi = float(q)
    return hi, float(q - Fraction(hi))


def _constants():
    w = 230
    lo, _ = xr.ln2_fixed(w)
    l64 = Fraction(lo, 1 << (w + 6))  # ln2 / 64 within 2**-230
    c1 = round(l64 * 2**41) / 2.0**41  # 35 significant bits: ln2/64 lies in [2**-7, 2**-6)
    c2 = float(l64 - Fraction(c1))
    c3 = float(l64 - Fraction(c1) - Fraction(c2))
    t_hi, t_lo = np.empty(64), np.empty(64)
    bits = 130
    for j in range(64):
        v = 1 << (j + 64 * bits)
        for _ in range(6):  # floor(2**(j/64) 2**bits) by nested integer square roots
            v = math.isqrt(v)
        t_hi[j], t_lo[j] = _dd_of(Fraction(v, 1 << bits))  # within 2**-130 of 2**(j/64), then rounded
    f_hi, f_lo = np.empty(12), np.empty(12)
    for k in range(12):
        f_hi[k], f_lo[k] = _dd_of(Fraction(1, math.factorial(k)))
    g_hi, g_lo = np.zeros(26), np.zeros(26)  # (-1)**(k+1) / k for the log1p series
    for k in range(1, 26):
        g_hi[k], g_lo[k] = _dd_of(Fraction((-1) ** (k + 1), k))
    inv = float(1 / (l64))  # 64 / ln2, any nearby value works (it only picks n)
    return c1, c2, c3, inv, t_hi, t_lo, f_hi, f_lo, g_hi, g_lo


_C1, _C2, _C3, _INV64, _T_HI, _T_LO, _F_HI, _F_LO, _G_HI, _G_LO = _constants()
_F3, _F4, _F5, _F6 = 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0


@jit(inline="always")
def exp_fast(x):
    """e**x = v * 2**m within relative EXP_FAST_REL (module docstring), for X_MIN <= x <= 1."""
    n = np.rint(x * _INV64)
    t = x - n * _C1  # exact
    r = t - n * _C2
    ni = np.int64(n)
    j = ni & 63
    m = ni >> 6  # floor(n / 64)
    q = r * (1.0 + r * (0.5 + r * (_F3 + r * (_F4 + r * (_F5 + r * _F6)))))
    th = _T_HI[j]
    return th + fma(th, q, _T_LO[j]), m


@jit(inline="always")
def exp_dd(xh, xl):
    """e**(xh + xl) = (vh + vl) * 2**m within relative EXP_DD_REL (module docstring), for a
    double-word X_MIN <= xh + xl <= 1."""
    n = np.rint(xh * _INV64)
    if n == 0.0:
        rh, rl = xh, xl
    else:
        t = xh - n * _C1  # exact
        ph, pl = two_product(n, _C2)  # exact: n < 2**18, |n C2| > 2**-120
        ah, al = two_sum(t, -ph)
        bh, bl = two_sum(xl, -pl)
        rh, rl = dd_add(ah, al, bh, bl)
        rh, rl = dd_add_fp(rh, rl, -n * _C3)
    ni = np.int64(n)
    j = ni & 63
    m = ni >> 6
    if abs(rh) < 2.0**-200:
        qh, ql = rh, rl  # e**r - 1 = r within r**2 < 2**-400
    else:
        hh, hl = _F_HI[11], _F_LO[11]
        for k in range(10, 0, -1):
            hh, hl = dd_mul(rh, rl, hh, hl)
            hh, hl = dd_add(_F_HI[k], _F_LO[k], hh, hl)
        qh, ql = dd_mul(rh, rl, hh, hl)
    th, tl = _T_HI[j], _T_LO[j]
    ah, al = dd_mul(th, tl, qh, ql)
    vh, vl = dd_add(th, tl, ah, al)
    return vh, vl, m


@jit(inline="always")
def log_fast(c0, t, e_t):
    """(L, e_L): ``|log(c0 + T) - L| <= e_L`` for every real T with ``|T - t| <= e_t``, where
    c0 >= 1 (an integer count) and 0 <= t (float64).

    For c0 == 1 and t <= 1/32: ``log1p(t) = t - t**2/2 + ... - t**12/12`` by Horner in float64
    (relative error <= 4u: each of the 12 steps adds at most u of a partial value within a
    factor 1.04 of its final value; truncation ``t**13/13 <= 2**-65 t``), plus ``e_t`` (the
    derivative of log1p is <= 1). Otherwise ``L0 = log(S)`` (libm; S = fl(c0 + t), within
    ``u S + e_t``), checked by ``w = S exp_fast(-L0) - 1``: the exact w is within
    ``3.1 u (1 + |w|)`` of the computed one, and ``|log S - L0| = |log(1 + w)| <= |w| / (1 - |w|)``.
    """
    if c0 == 1.0 and t <= 0.03125:
        h = -1.0 / 12.0
        for k in range(11, 0, -1):
            h = _G_HI[k] + t * h
        L = t * h
        return L, 4.0 * U * L + 2.0**-65 * t + e_t * 1.0001
    S = c0 + t
    L0 = math.log(S)
    v, m = exp_fast(-L0)
    w = S * ldexp(v, m) - 1.0
    aw = abs(w) + 3.1 * U * (1.0 + abs(w))
    rel_s = (U * S + e_t) / S  # |log(c0 + T) - log(S)| <= rel_s / (1 - rel_s)
    return L0, (aw / (1.0 - aw) + rel_s / (1.0 - rel_s)) * 1.0001


@jit(inline="always")
def log_dd(c0, th, tl, e_t):
    """(Lh, Ll, e_L): ``|log(c0 + T) - (Lh + Ll)| <= e_L`` for every T with ``|T - (th + tl)| <= e_t``,
    c0 >= 1 an integer count, th + tl >= 0 a double-word.

    c0 == 1 and T <= 1/32: ``log1p(T) = sum_{k <= 24} (-1)**(k+1) T**k / k`` by Horner in
    double-word (truncation ``T**25 / 25 < 2**-125 T``; each step two operations, the errors of
    the inner ones shrunk by T <= 1/32: relative error <= 2.3 EPS, charged 4 EPS) plus ``e_t``.
    Otherwise ``S = c0 + T`` (one operation), ``L0 = log(Sh)`` (libm), ``w = S e**-L0 - 1``
    (exp_dd, a product, a subtraction: within ``(EXP_DD_REL + 2 EPS) |S e**-L0| (1.01) + EPS |w|``),
    ``L = L0 + w - w**2/2 + w**3/3`` (|w| <= 2**-10 required, else e_L = inf: Taylor remainder
    ``w**4 / (4 (1 - |w|)**4)``, the float64 square and cube err by ``2**-50 w**2``), one addition
    (EPS |L|); plus ``|log S - log(c0 + T)| <= rel / (1 - rel)``, ``rel = (EPS S + e_t) / S``.
    """
    if c0 == 1.0 and th <= 0.03125:
        if th < 2.0**-300:
            return th, tl, th * th + e_t * 1.0001  # log1p(T) = T - T**2/2 + ...
        hh, hl = _G_HI[24], _G_LO[24]
        for k in range(23, 0, -1):
            hh, hl = dd_mul(th, tl, hh, hl)
            hh, hl = dd_add(_G_HI[k], _G_LO[k], hh, hl)
        lh, ll = dd_mul(th, tl, hh, hl)
        return lh, ll, (4.0 * EPS + 2.0**-125) * abs(lh) * 1.0001 + e_t * 1.0001
    sh, sl = dd_add_fp(th, tl, c0)
    L0 = math.log(sh)
    eh, el, m = exp_dd(-L0, 0.0)
    ph, pl = dd_mul(sh, sl, eh, el)
    ph, pl = ldexp(ph, m), ldexp(pl, m)
    wh, wl = dd_add_fp(ph, pl, -1.0)
    aw = abs(wh) + abs(wl)
    if not aw <= 2.0**-10:
        return L0, 0.0, np.inf
    ch, cl = dd_add_fp(wh, wl, wh * wh * (wh / 3.0 - 0.5))
    lh, ll = dd_add_fp(ch, cl, L0)
    e_w = (EXP_DD_REL + 2.0 * EPS) * abs(ph) * 1.01 + EPS * aw
    e_series = aw**4 / (4.0 * (1.0 - aw) ** 4) + 2.0**-50 * aw * aw + 2.0 * EPS * aw
    rel = (EPS * sh + e_t) / sh
    return lh, ll, (e_w * (1.0 + 2.0 * aw) + e_series + EPS * abs(lh) + rel / (1.0 - rel)) * 1.0001


@jit(inline="always")
def bracket(lo, hi, prec, emin, emax):
    """(RN(r), True) when every real r in [lo, hi] rounds alike to the format (zeros of both signs
    told apart), else (nan, False). lo and hi must already be outward bounds."""
    a = round_to(lo, prec, emin, emax)
    b = round_to(hi, prec, emin, emax)
    if a == b and np.signbit(a) == np.signbit(b):
        return a, True
    return np.nan, False


@jit(inline="always")
def bracket_around(y, e, nonneg, prec, emin, emax):
    """:func:`bracket` on every real within ``e`` of the float64 ``y`` (clipped at 0 when ``nonneg``).

    The ends ``fl(y -+ f)``, ``f = (e + 2u|y|)(1 + 2u) + 2**-1073``, enclose ``[y - e, y + e]``: a
    float64 subtraction moves its exact result by at most ``u`` of it (or 2**-1075 below the normal
    range), which the ``2u|y|``, ``2u`` and ``2**-1073`` terms absorb on either sign of ``y - f``."""
    f = (e + 2.0 * U * abs(y)) * (1.0 + 2.0 * U) + 2.0**-1073
    lo = y - f
    if nonneg and lo < 0.0:
        lo = 0.0
    return bracket(lo, y + f, prec, emin, emax)


@jit(inline="always")
def decide_scaled(qh, ql, e, k, prec, emin, emax):
    """(RN(r), True) when every real ``r = (qh + ql + t) 2**k``, ``|t| <= e``, rounds alike to the
    format (prec, emin, emax), else (nan, False) (module docstring). qh, ql, e finite floats
    with |ql| <= ulp(qh); k an integer with |k| < 2**20."""
    if qh == 0.0:
        if e == 0.0 and ql == 0.0:
            return 0.0, True
        return np.nan, False
    if not e <= 0.25 * abs(qh):
        return np.nan, False
    neg = qh < 0.0
    if neg:
        qh, ql = -qh, -ql
    E = frexp1(qh)[1]  # 2**E <= qh < 2**(E+1)
    top = E + k
    if top + 2 <= emin - prec:  # |r| < 1.3 * 2**(top+1) < 2**(emin-prec): below half the smallest subnormal
        return (-0.0 if neg else 0.0), True
    if top > emax + 1:  # |r| >= 0.7 * 2**top > 2**(emax+1)
        return (-np.inf if neg else np.inf), True
    Q = max(top, emin) - prec + 1  # exponent of the format's quantum at r
    sc = k - Q
    mh = ldexp(qh, sc)  # exact: the result lies in [2**-3, 2**prec)
    ml = ldexp(ql, sc)
    es = ldexp(e, sc) * (1.0 + 2.0**-50) + 2.0**-1060  # the two ldexp may lose 2**-1075 each
    N = np.rint(mh)
    f, fl = two_sum(mh - N, ml)  # mh - N is exact (Sterbenz, or N == 0)
    dist = (abs(f) + abs(fl) + es) * (1.0 + 2.0**-50)
    if not dist < 0.5:
        return np.nan, False
    if N == 2.0 ** (prec - 1) and top > emin and (-f + abs(fl) + es) * (1.0 + 2.0**-50) >= 0.25:
        return np.nan, False  # might lie in the binade below, whose grid is twice as fine
    if N == 0.0:
        return (-0.0 if neg else 0.0), True
    if Q + frexp1(N)[1] > emax:
        return (-np.inf if neg else np.inf), True
    v = ldexp(N, Q)
    return (-v if neg else v), True


@jit(inline="always")
def ldexp(v, m):
    """``math.ldexp(v, m)``, the same value: for -1022 <= m <= 1023 the product by the exact ``2**m``
    (:func:`~refkern.accumulate._bits.pow2`), one rounding to nearest as ldexp's own (only where the result is
    subnormal or overflows is there anything to round); libm's ldexp otherwise."""
    if -1022 <= m <= 1023:
        return v * pow2(m)
    return math.ldexp(v, m)


@jit(inline="always")
def frexp1(x):
    """(xs, j): ``x = xs 2**j`` with ``1 <= |xs| < 2``, for x finite and nonzero; ``(2 m, e - 1)`` of libm's
    ``frexp(x) = (m, e)`` for every x: a normal x from its bits (the exponent field replaced by 1023's), zeros,
    subnormals, infinities and NaN through libm's frexp."""
    b = bits(x)
    ef = (b >> 52) & 2047
    if ef == 0 or ef == 2047:
        m, ex = math.frexp(x)
        return 2.0 * m, ex - 1
    return from_bits((b & ~(np.int64(2047) << 52)) | (np.int64(1023) << 52)), ef - 1023


@jit(inline="always")
def decide_near(q, e, k, prec, emin, emax):
    """decide_scaled(q, 0, e, k, ...): (RN(r), True) when every real ``r = (q + t) 2**k``, ``|t| <= e``, rounds
    alike to the format, else (nan, False); q, e floats, k an integer with ``|k| < 2**20``.

    First, for -1022 <= k <= 1023, :func:`bracket_around` of ``y = fl(q 2**k)`` with the bound ``B = fl(fl(es (1 +
    2**-50)) + 2**-1072)``, ``es = fl(e 2**k)``: y and es are within 2**-1075 of ``q 2**k`` and ``e 2**k`` (a
    product by a power of two rounds only below 2**-1022), so r lies within ``es + 2**-1074`` of y, and B is at least
    that (``(es (1 + 2**-50)(1 - u) + 2**-1072)(1 - u) >= es + 2**-1073`` where the sum is normal; a sum below
    2**-1021 of two multiples of 2**-1074 is exact). The ends of the bracket round by the float32 conversion for
    the float32 format (IEEE 754's rounding to nearest, subnormals and overflow included: the same as round_to),
    by round_to otherwise. Where the bracket straddles a boundary, or q, e or y is not finite: decide_scaled."""
    if -1022 <= k <= 1023:
        s = pow2(k)
        y = q * s
        B = (e * s) * (1.0 + 2.0**-50) + 2.0**-1072
        if abs(y) < np.inf and B < np.inf:
            f = (B + 2.0 * U * abs(y)) * (1.0 + 2.0 * U) + 2.0**-1073  # bracket_around's enclosure of [y - B, y + B]
            lo = y - f
            hi = y + f
            if prec == 24 and emin == -126 and emax == 127:
                a = np.float64(np.float32(lo))
                b = np.float64(np.float32(hi))
            else:
                a = round_to(lo, prec, emin, emax)
                b = round_to(hi, prec, emin, emax)
            if a == b and np.signbit(a) == np.signbit(b):
                return a, True
    return decide_scaled(q, 0.0, e, k, prec, emin, emax)
