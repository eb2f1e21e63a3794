"""Double-word cores of the elementwise functions, each with a rigorous bound: the fast path of Ziv's
strategy (:mod:`refkern.kernels.elementwise` decides the rounding from the bound with
:func:`~refkern.kernels._transcendental.decide_scaled`, :mod:`refkern.kernels._ew_exact` settles the rest).

A core returns ``(qh, ql, e, k)``: the real value lies in ``[qh + ql - e, qh + ql + e] * 2**k``. The
scale ``2**k`` is carried apart so that every double-word operand stays near 1 (inside
``[2**-900, 2**900]`` where the bounds of :mod:`refkern.accumulate.dd` hold: EPS = 2**-100 per
operation), however large or small the result. Constants (pi/2, ln 2, 2/sqrt(pi), 1/sqrt(2),
sqrt(2/pi), 0.044715, 1/k!) are built at import from the integer intervals of
:mod:`refkern.kernels._ew_exact`, each within ``2**-104`` relative (interval width below 2**-200, the
low word's rounding at most 2**-107 relative).

* **exp**: :func:`~refkern.kernels._transcendental.exp_dd`, relative error EXP_DD_REL = 2 EPS. Its
  module docstring states it for ``-2000 <= x <= 1``; the same argument holds up to ``x <= 1100``:
  ``n = rint(64 x / ln 2) < 2**17``, so ``n C1`` (C1 has 35 bits) is exact, and ``x - n C1`` lies on
  the grid ``2**-42`` (x < 2048, C1's last bit 2**-41) below 2**-7: exact.
* **log** of a positive double-word ``a 2**ka``, a in [1, 2): ``ka ln 2 + log_dd(1, a - 1)``; for
  ``a 2**ka`` in [31/32, 1) the series of ``log1p(T)``, ``T = a/2 - 1`` (:func:`log1p_small`), so that
  no cancellation between ``ka ln 2`` and the log exceeds a factor 22 (``|log x| >= |log(31/32)|``).
* **log1p_small(T)**, ``|T| <= 1/32`` of either sign: log_dd's series (its analysis: relative error
  4 EPS + 2**-125); for negative T every Horner partial sum is a sum of terms of one sign.
* **erf series** (A&S 7.1.6) ``erf z = 2/sqrt(pi) e**(-z**2) z sum_n (2 z**2)**n / (2n+1)!!``: Horner
  in double-word (three operations a step, each partial sum a sum of positive terms: relative error
  at most 3 EPS per step, ``3 (N + 1) EPS`` in all), stopped where the term is below 2**-112 of the
  first and the ratio below 1/2 (tail below 2**-110 relative).
* **erfc continued fraction** (A&S 7.1.14) ``erfc z = e**(-z**2)/sqrt(pi) / (z + (1/2)/(z + 1/(z +
  (3/2)/(z + ...))))`` for z >= 3: the depth-N value is a monotone function of the tail ``T`` in
  ``[0, (N+1)/2 / z]``, so the two ends bracket erfc (N doubled until the bracket is below 2**-96
  relative); each backward step is a contraction (relative error at most 2 EPS a step, ``2 N EPS``).
* **sin, cos**: Payne-Hanek reduction of ``|x| = M 2**E`` (M < 2**53) by ``2/pi`` in 24-bit digits
  (64 of them, from the integer interval of pi), products of 24-bit digits in int64, kept from the
  units limb down to 8 fraction limbs: the dropped products and digits weigh below 2**-164 in
  ``x 2/pi``, whose residue ``f`` in [-1/2, 1/2] is exact in 192 bits, summed to a double-word
  (relative 2**-101). ``r = f pi/2``, then Taylor series in ``r**2`` (15 terms, truncation below
  2**-105 for ``|r| <= pi/4``; alternating with ratio below 0.1: relative error 4 EPS). An error
  ``dr`` in r moves sin r and cos r by at most ``|dr|``.
"""

import math
from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_div, dd_div_fp, dd_mul
from refkern.accumulate.eft import fast_two_sum, two_product, two_sum
from refkern.kernels import _ew_exact as xe
from refkern.kernels._transcendental import _G_HI, _G_LO, EXP_DD_REL, exp_dd, log_dd

__all__ = ["CONST_REL", "exp_core", "log_core", "log1p_small", "erf_core", "erfc_core", "sin_cos_core",
           "K_PIO2", "K_LN2", "K_2SQPI", "K_RSQRT2", "K_SQRT2PI", "K_KAPPA"]  # fmt: skip

CONST_REL = 2.0**-104  #: relative error of each double-word constant (module docstring)


def _dd_const(iv) -> tuple:
    q = (Fraction(iv[0]) + Fraction(iv[1])) / 2 * Fraction(2) ** iv[2] if iv[2] >= 0 else (
        Fraction(iv[0] + iv[1], 2 << -iv[2]))  # fmt: skip
    hi = float(q)
    return hi, float(q - Fraction(hi))


def _pio2_digits(n: int) -> np.ndarray:
    """The first n base-2**24 digits of 2/pi (2/pi = sum_i c_i 2**(-24 (i + 1)))."""
    W = 24 * n + 64
    lo, hi, sh = xe.pi_interval(W + 8)  # pi in [lo, hi] 2**sh
    a = (1 << (24 * n + 1 - sh)) // hi  # floor of 2/pi 2**(24 n) at either end
    b = (1 << (24 * n + 1 - sh)) // lo
    if a != b:
        raise RuntimeError("elementwise: 2/pi's digits not determined (raise W)")
    return np.array([(a >> (24 * (n - 1 - i))) & 0xFFFFFF for i in range(n)], np.int64)


_W = 240
K_PIO2 = _dd_const(xe.const("pi/2", _W))
K_LN2 = _dd_const(xe.const("ln2", _W))
K_2SQPI = _dd_const(xe.const("2/sqrt(pi)", _W))
K_RSQRT2 = _dd_const(xe.const("1/sqrt(2)", _W))
K_SQRT2PI = _dd_const(xe.const("sqrt(2/pi)", _W))
K_KAPPA = (float(Fraction(44715, 10**6)), float(Fraction(44715, 10**6) - Fraction(float(Fraction(44715, 10**6)))))
K_RSQPI = _dd_const(xe.div(xe.point(1.0), xe.sqrt(xe.pi_interval(_W), _W), _W))
_TWO_OVER_PI = _pio2_digits(64)
_NF = 8  # fraction limbs of the reduction
_FACT = np.array([(float(Fraction(1, math.factorial(k))),
                   float(Fraction(1, math.factorial(k)) - Fraction(float(Fraction(1, math.factorial(k))))))
                  for k in range(32)])  # fmt: skip
_PIO2H, _PIO2L = K_PIO2
_LN2H, _LN2L = K_LN2
_FH, _FL = np.ascontiguousarray(_FACT[:, 0]), np.ascontiguousarray(_FACT[:, 1])


@jit
def exp_core(xh, xl, ex):
    """e**(xh + xl + t), |t| <= ex <= 2**-40, for -2000 <= xh <= 1100: (vh, vl, rel, m) with the value
    within ``rel (vh + vl) 2**m`` of ``(vh + vl) 2**m``."""
    vh, vl, m = exp_dd(xh, xl)
    return vh, vl, (EXP_DD_REL + 1.01 * ex) * 1.0001, m


@jit
def log1p_small(th, tl):
    """log(1 + T), T = th + tl, |T| <= 1/32: (lh, ll, e_abs) (module docstring)."""
    if abs(th) < 2.0**-300:
        return th, tl, th * th
    hh, hl = _G_HI[24], _G_LO[24]
    for k in range(23, 0, -1):
        hh, hl = dd_mul(th, tl, hh, hl)
        hh, hl = dd_add(_G_HI[k], _G_LO[k], hh, hl)
    lh, ll = dd_mul(th, tl, hh, hl)
    return lh, ll, (4.0 * EPS + 2.0**-125) * abs(lh) * 1.0001


@jit
def log_core(ah, al, ka, rel):
    """log(a 2**ka (1 + t)), a = ah + al > 0, |t| <= rel <= 2**-40: (lh, ll, e_abs) (module docstring)."""
    if ah < 1.0:
        ah, al, ka = 2.0 * ah, 2.0 * al, ka - 1
    elif ah >= 2.0:
        ah, al, ka = 0.5 * ah, 0.5 * al, ka + 1
    e_t = rel * (ah + abs(al)) * 1.0001  # the argument's own error, as an error of T
    e_log = e_t * 1.04  # |d log| <= |dT| / (1 + T), 1 + T >= 31/32
    if ka == 0 and (ah > 1.0 or al >= 0.0):
        th, tl = two_sum(ah - 1.0, al)
        if th <= 0.03125:
            lh, ll, e = log1p_small(th, tl)
            return lh, ll, e + e_log
        lh, ll, e = log_dd(1.0, th, tl, e_t)
        return lh, ll, e
    if ka == 0:  # a = 1 - tiny
        lh, ll, e = log1p_small(al, 0.0)
        return lh, ll, e + e_log
    if ka == -1 and ah >= 1.9375:
        th, tl = two_sum(0.5 * ah - 1.0, 0.5 * al)  # 0.5 ah - 1 exact (Sterbenz)
        lh, ll, e = log1p_small(th, tl)
        return lh, ll, e + e_log
    mh, ml, e = log_dd(1.0, ah - 1.0, al, e_t)
    k = float(ka)
    kh, kl = two_product(k, _LN2H)
    kl2 = kl + k * _LN2L
    kh, kl = fast_two_sum(kh, kl2)
    e_k = abs(k) * (CONST_REL * 0.7 + 2.0**-106) + 2.0**-52 * abs(kl2)
    lh, ll = dd_add(kh, kl, mh, ml)
    return lh, ll, (e + e_k + EPS * abs(lh)) * 1.0001


@jit
def _erf_sum(zh, zl, t2h, t2l, t2):
    """z sum_n t2**n / (2n+1)!!, t2 = 2 z**2 (double-word t2h + t2l, float64 t2): (sh, sl, rel)."""
    t, n = 1.0, 0
    while not (t < 2.0**-112 and 2.0 * t2 < 2 * n + 3):
        n += 1
        t *= t2 / (2 * n + 1)
    hh, hl = 1.0, 0.0
    for j in range(n, 0, -1):
        ph, pl = dd_mul(t2h, t2l, hh, hl)
        ph, pl = dd_div_fp(ph, pl, float(2 * j + 1))
        hh, hl = dd_add_fp(ph, pl, 1.0)
    sh, sl = dd_mul(zh, zl, hh, hl)
    return sh, sl, (3.0 * (n + 2) * EPS + 2.0**-110) * 1.0001


@jit
def erf_core(zh, zl, z2h, z2l, zrel):
    """erf z for 0 < z <= 6.5, z = zh + zl within relative ``zrel`` (<= 2**-100) and ``z2h + z2l`` its
    square (exact): (qh, ql, e_abs), the value below 1."""
    t2h, t2l = 2.0 * z2h, 2.0 * z2l
    sh, sl, rs = _erf_sum(zh, zl, t2h, t2l, t2h)
    vh, vl, rv, m = exp_core(-z2h, -z2l, 0.0)
    vh, vl = math.ldexp(vh, m), math.ldexp(vl, m)  # e**(-z**2) >= 2**-62: no underflow
    ph, pl = dd_mul(sh, sl, vh, vl)
    qh, ql = dd_mul(ph, pl, K_2SQPI[0], K_2SQPI[1])
    rel = rs + rv + 2.0 * EPS + CONST_REL + zrel * (1.0 + 2.0 * z2h)  # d erf / erf <= (1 + 2 z**2) dz / z
    return qh, ql, rel * abs(qh) * 1.0001


@jit
def _cf(zh, zl, n, tail):
    """The depth-n continued fraction z + (1/2)/(z + (2/2)/(... (z + tail))), backward."""
    dh, dl = dd_add_fp(zh, zl, tail)
    for j in range(n, 0, -1):
        qh, ql = dd_div(0.5 * j, 0.0, dh, dl)
        dh, dl = dd_add(zh, zl, qh, ql)
    return dh, dl


@jit
def erfc_core(zh, zl, z2h, z2l, zrel):
    """erfc z for z > 0 (z, its square as in :func:`erf_core`): (qh, ql, e_abs, k), value (qh + ql) 2**k;
    z < 3: 1 - erf z; else the bracketing continued fraction (module docstring); z**2 <= 2000."""
    if zh < 3.0:
        eh, el, e = erf_core(zh, zl, z2h, z2l, zrel)
        qh, ql = dd_add_fp(-eh, -el, 1.0)
        return qh, ql, e + EPS * abs(qh), 0
    n = 32
    while True:
        ah, al = _cf(zh, zl, n, 0.0)
        bh, bl = _cf(zh, zl, n, 0.5 * (n + 1) / zh)
        wid = abs((ah - bh) + (al - bl))
        if wid <= 2.0**-96 * ah or n >= 4096:
            break
        n *= 2
    vh, vl, rv, m = exp_core(-z2h, -z2l, 0.0)
    ph, pl = dd_mul(vh, vl, K_RSQPI[0], K_RSQPI[1])
    qh, ql = dd_div(ph, pl, ah, al)
    rel = wid / ah + 2.0 * n * EPS + rv + 2.0 * EPS + CONST_REL + zrel * (2.0 + 2.0 * z2h)
    return qh, ql, rel * abs(qh) * 1.0001, m


@jit
def _reduce(ax):
    """|x| = (n + f) pi/2: (n mod 4, rh, rl, e_abs) with r = f pi/2 in [-pi/4, pi/4] (module docstring);
    ax >= 0.5 finite."""
    m, ex = math.frexp(ax)
    M = np.int64(math.ldexp(m, 53))
    E = ex - 53
    q = E // 24
    r0 = E - 24 * q
    mask = np.int64(0xFFFFFF)
    low, high = M & mask, M >> 24
    a = low << r0
    b = high << r0
    D = (a & mask, (a >> 24) + (b & mask), (b >> 24) & mask, b >> 48)
    acc = np.zeros(_NF + 1, np.int64)  # acc[L + NF]: weight 2**(24 L), L = -NF .. 0
    for j in range(4):
        for i in range(max(0, j + q - 1), j + q + _NF):
            L = j + q - i - 1
            if i < 64 and -_NF <= L <= 0:
                acc[L + _NF] += D[j] * _TWO_OVER_PI[i]
    for s in range(_NF):  # carries upward
        acc[s + 1] += acc[s] >> 24
        acc[s] &= mask
    n = acc[_NF] & 3
    neg = acc[_NF - 1] >= (1 << 23)  # f >= 1/2: take f - 1
    if neg:
        n = (n + 1) & 3
        c = np.int64(1)
        for s in range(_NF):
            v = (mask - acc[s]) + c
            c = v >> 24
            acc[s] = v & mask
    fh, fl = 0.0, 0.0
    for s in range(_NF):
        fh, fl = dd_add_fp(fh, fl, math.ldexp(float(acc[s]), 24 * (s - _NF)))
    if neg:
        fh, fl = -fh, -fl
    rh, rl = dd_mul(fh, fl, _PIO2H, _PIO2L)
    return n, rh, rl, 2.0**-163 + (EPS + 2.0**-101 + CONST_REL) * abs(rh) * 1.0001


@jit
def _sin_cos_series(rh, rl):
    """(sin r, cos r) as double-words for |r| <= 0.8 (module docstring), 15 terms each."""
    sh, sl = dd_mul(rh, rl, rh, rl)
    ph, pl = _FH[31], _FL[31]  # sin r / r = sum (-1)**k s**k / (2k+1)!
    ch, cl = _FH[30], _FL[30]  # cos r = sum (-1)**k s**k / (2k)!
    for k in range(14, -1, -1):
        ph, pl = dd_mul(sh, sl, ph, pl)
        ph, pl = dd_add(_FH[2 * k + 1], _FL[2 * k + 1], -ph, -pl)
        ch, cl = dd_mul(sh, sl, ch, cl)
        ch, cl = dd_add(_FH[2 * k], _FL[2 * k], -ch, -cl)
    ph, pl = dd_mul(rh, rl, ph, pl)
    return ph, pl, ch, cl


@jit
def sin_cos_core(x, want_cos):
    """sin x or cos x for a finite float64 x with |x| >= 2**-450: (qh, ql, e_abs)."""
    ax = abs(x)
    if ax <= 0.78:
        n, rh, rl, er = 0, ax, 0.0, 0.0
    else:
        n, rh, rl, er = _reduce(ax)
    if abs(rh) < 2.0**-450:  # sin r = r (1 - r**2/6 ...), cos r = 1 - r**2/2 ...: within r**2 of r and of 1
        sh, sl, ch, cl = rh, rl, 1.0, 0.0
        et = rh * rh
    else:
        sh, sl, ch, cl = _sin_cos_series(rh, rl)
        et = 0.0
    e_s = er + et + (4.0 * EPS + 2.0**-105) * abs(sh) * 1.0001
    e_c = er + et + (4.0 * EPS + 2.0**-105) * 1.0001
    if want_cos:  # cos x = [cos r, -sin r, -cos r, sin r][n]
        if n == 0:
            return ch, cl, e_c
        if n == 1:
            return -sh, -sl, e_s
        if n == 2:
            return -ch, -cl, e_c
        return sh, sl, e_s
    sg = -1.0 if x < 0.0 else 1.0  # sin x = [sin r, cos r, -sin r, -cos r][n], odd in x
    if n == 0:
        return sg * sh, sg * sl, e_s
    if n == 1:
        return sg * ch, sg * cl, e_c
    if n == 2:
        return -sg * sh, -sg * sl, e_s
    return -sg * ch, -sg * cl, e_c
