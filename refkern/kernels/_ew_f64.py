"""The float64 tier of the elementwise functions (:mod:`refkern.kernels.elementwise`, step 1): for results of at
most 24 bits, exp, log, tanh, sigmoid, silu, erf, sin and cos evaluated in float64 with a rigorous bound (each
function's derivation in its docstring or the comment below), the rounding decided by
:func:`~refkern.kernels._transcendental.decide_scaled`; ``(nan, False)`` sends the element on to the double-word
path (:mod:`refkern.kernels._ew_scalar`)."""

import math

import numpy as np

from refkern._jit import jit
from refkern.accumulate.eft import two_product
from refkern.kernels._ew_dd import _FH, K_2SQPI, K_LN2, _reduce
from refkern.kernels._ew_scalar import _INF, _NAN, _U, _scaled
from refkern.kernels._transcendental import decide_scaled, exp_fast, log_fast

__all__ = ["f_exp", "f_sigmoid", "f_tanh", "f_log", "f_erf", "f_sin_cos"]

# ---------------------------------------------------------------- the float64 tier (results of <= 24 bits)
# exp_fast (refkern.kernels._transcendental) gives e**x = v 2**m within 2u relative for -2000 <= x <= 1, and
# up to x <= 1100 by the argument _ew_dd states for exp_dd (n < 2**17: n C1 and x - n C1 exact; the rounding
# of n C2 (|n C2| <= 2**-25) and the missing n C3 stay below 2**-77, inside its 2**-70 allowance).
# With one rounding per further operation (u each; the underflow of v 2**m costs at most 2**-1074 against
# 1 + E >= 1): exp within 2u; sigmoid(x >= 0) = 1 / (1 + E), E = e**-x, within 2u E/(1+E) + 2u <= 4u;
# sigmoid(x < 0) = v / (1 + E) (scale 2**m), E = e**x, within 2u + 2u + 2u = 6u; silu one product more,
# 7u. Charged with a factor 1.01 and 2**-1073 relative; decide_scaled settles all but about 2**-25 of
# float32 elements, the rest take the double-word path.


@jit
def f_exp(x, prec, emin, emax):
    if not (-2000.0 <= x <= 1100.0):
        return math.nan, False
    v, m = exp_fast(x)
    return decide_scaled(v, 0.0, 2.02 * _U * v, m, prec, emin, emax)


@jit(inline="always")
def _f_sigmoid(x):
    """(q, rel, k): sigmoid(x) within rel q 2**k of q 2**k, for |x| <= 2000 (comment above)."""
    if x >= 0.0:
        v, m = exp_fast(-x)
        return 1.0 / (1.0 + math.ldexp(v, m)), 4.04 * _U + 2.0**-1073, 0
    v, m = exp_fast(x)
    return v / (1.0 + math.ldexp(v, m)), 6.06 * _U + 2.0**-1073, m


@jit
def f_sigmoid(x, times_x, prec, emin, emax):
    """sigmoid(x) (or x sigmoid(x)) decided in float64, else (nan, False)."""
    if not (abs(x) <= 2000.0) or x == 0.0:
        return math.nan, False
    q, rel, k = _f_sigmoid(x)
    if times_x:
        xs, j = _scaled(x)
        q, rel, k = q * xs, rel + 1.01 * _U, k + j
    return decide_scaled(q, 0.0, rel * abs(q), k, prec, emin, emax)


@jit
def f_tanh(x, prec, emin, emax):
    """tanh|x| = (1 - E) / (1 + E), E = e**(-2|x|) within 2u (exp_fast), for 1/16 <= |x| <= 40: the
    relative error is at most ``2u 2E / ((1 - E)(1 + E)) + 3u`` (the sensitivity of the quotient to E, then
    1 - E, 1 + E and the division, one rounding each), charged with a factor 1.01."""
    ax = abs(x)
    if not (0.0625 <= ax <= 40.0):
        return math.nan, False
    v, m = exp_fast(-2.0 * ax)
    E = math.ldexp(v, m)
    q = (1.0 - E) / (1.0 + E)
    rel = (2.02 * _U * 2.0 * E / ((1.0 - E) * (1.0 + E)) + 3.0 * _U) * 1.01
    r, ok = decide_scaled(q, 0.0, rel * q, 0, prec, emin, emax)
    return (r if x > 0.0 else -r), ok


@jit
def f_log(x, prec, emin, emax):
    """log x = log(S) - k ln 2, x = S 2**-k with S in [1, 2): log(S) by log_fast (libm's log checked through
    exp_fast: a rigorous bound), k ln 2 as ``two_product(k, ln2_hi) + k ln2_lo`` (ln 2 within 2**-104
    relative; the product's rounding and the sum's, u of each), two additions (u each of their results)."""
    if not (0.0 < x < math.inf):
        return math.nan, False
    S, j = _scaled(x)
    L, eL = log_fast(1.0, S - 1.0, 0.0)  # S - 1 exact
    k = float(j)
    kh, kl = two_product(k, K_LN2[0])
    kl += k * K_LN2[1]
    a = L + kh
    b = a + kl
    e = eL + abs(k) * 2.0**-103 + _U * (abs(k * K_LN2[1]) + abs(kl) + abs(a) + abs(b)) * 1.01
    return decide_scaled(b, 0.0, e, 0, prec, emin, emax)


@jit
def f_sin_cos(x, want_cos, prec, emin, emax):
    """sin x or cos x for 2**-450 <= |x| finite: r from the exact reduction (_ew_dd._reduce, its high word:
    the low word is below u |r|), then Taylor in float64, 11 terms (truncation below 2**-72 of the
    value for |r| <= pi/4), by Horner in s = r**2: Higham's bound gamma_22 sum |c_k| s**k, with sum |c_k|
    s**k / |p(s)| at most sinh(r) / sin(r) <= 1.23 (sin) and cosh(r) / cos(r) <= 1.88 (cos), the rounded
    coefficients and s one u more each, the product by r one u: at most 28u (sin) and 41u (cos) relative,
    charged 64u; plus the reduction's error and the dropped low word (|d sin|, |d cos| <= |dr|)."""
    ax = abs(x)
    if not (2.0**-450 <= ax < math.inf):
        return math.nan, False
    if ax <= 0.78:
        n, rh, rl, er = 0, ax, 0.0, 0.0
    else:
        n, rh, rl, er = _reduce(ax)
    sq = rh * rh
    ps = _FH[21]
    pc = _FH[20]
    for k in range(9, -1, -1):
        ps = _FH[2 * k + 1] - sq * ps
        pc = _FH[2 * k] - sq * pc
    sn = rh * ps
    cs = pc
    dr = er + abs(rl)
    e_s = 64.0 * _U * abs(sn) + dr
    e_c = 64.0 * _U * abs(cs) + dr
    sg = -1.0 if (x < 0.0 and not want_cos) else 1.0
    q = n if not want_cos else (n + 1) & 3  # cos x = sin(x + pi/2)
    if q == 0:
        v, e = sn, e_s
    elif q == 1:
        v, e = cs, e_c
    elif q == 2:
        v, e = -sn, e_s
    else:
        v, e = -cs, e_c
    r, ok = decide_scaled(sg * v, 0.0, e, 0, prec, emin, emax)
    return r, ok


# 1 / (2k + 1) for k = 0..255, each rounded once (u relative): f_erf's series
_INV_ODD = 1.0 / (2.0 * np.arange(256) + 1.0)


@jit
def f_erf(x, prec, emin, emax):
    """erf x for results of at most 24 bits (x a value of such a format), decided in float64, else (nan, False).

    For 2**-400 <= |x| = z < 4.5: ``erf z = 2/sqrt(pi) e**(-z**2) S``, ``S = sum_k t_k``, ``t_0 = z``,
    ``t_k = t_(k-1) c / (2k + 1)``, ``c = 2 z**2`` (Abramowitz and Stegun 7.1.6; every term positive). z**2 and
    c are exact (z has at most 24 bits: its square 48). Each computed term is two products by rounded numbers
    (c exact, 1/(2k + 1) within u) away from the last, so within gamma_(3k) of its own exact value; the
    sequential sum of n + 1 positive terms adds gamma_n: S_n within ``(gamma_(3n) + gamma_n)(1 + gamma_n)
    <= 4.04 n u`` (n <= 255) relative. The loop stops where the next ratio ``r = c / (2n + 3) <= 1/2`` and the
    computed ``t_n <= 2**-60 S_n``: the tail ``sum_(k > n) t_k <= t_n (r + r**2 + ...) <= t_n`` is below
    ``2**-59 S``. Then e**(-z**2) within 2.02u (exp_fast), 2/sqrt(pi) within u (its double-word's high
    word), two products u each: the value within ``(4.04 n + 6) u + 2**-59`` relative, charged with a factor
    1.01. For z >= 4.5: ``0 < erfc z < e**(-z**2) / (z sqrt(pi)) < 2.02e-10 < 2**-32`` (A&S 7.1.13), so erf z
    is 1 within 2**-32. Below 2**-400 and beyond the series' 255 terms: (nan, False)."""
    ax = abs(x)
    if not (2.0**-400 <= ax < _INF):
        return _NAN, False
    sg = 1.0 if x > 0.0 else -1.0
    if ax >= 4.5:
        r, ok = decide_scaled(1.0, 0.0, 2.0**-32, 0, prec, emin, emax)
        return sg * r, ok
    z2 = ax * ax
    c = 2.0 * z2
    t = ax
    S = ax
    n = 0
    while True:
        n += 1
        if n > 255:
            return _NAN, False
        t = (t * c) * _INV_ODD[n]
        S += t
        if c <= 0.5 * (2 * n + 3) and t <= 2.0**-60 * S:
            break
    v, m = exp_fast(-z2)
    q = (K_2SQPI[0] * v) * S
    rel = ((4.04 * n + 6.0) * _U + 2.0**-59) * 1.01
    r, ok = decide_scaled(q, 0.0, rel * q, m, prec, emin, emax)
    return sg * r, ok
