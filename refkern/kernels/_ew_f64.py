"""The float64 tier of the elementwise functions (:mod:`refkern.kernels.elementwise`, step 1): for results of at most
24 bits, exp, exp2, expm1, log, log2, log1p, rsqrt, tanh, sigmoid, softplus, silu, erf, gelu (both forms), sin, cos
and pow (0 < x) evaluated in float64 with a rigorous bound (each function's derivation in its docstring or the
comment below), the rounding decided by :func:`~refkern.kernels._transcendental.decide_near`; ``(nan, False)``
sends the element on to the double-word path (:mod:`refkern.kernels._ew_scalar`)."""

import math
from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate.eft import two_product
from refkern.accumulate.formats import round_to
from refkern.kernels import _ew_exact as xe
from refkern.kernels._ew_dd import _FH, K_2SQPI, K_KAPPA, K_LN2, K_SQRT2PI, _reduce
from refkern.kernels._ew_scalar import _INF, _NAN, _RSQ2PI, _U, _scaled
from refkern.kernels._transcendental import decide_near, exp_fast, ldexp, log_fast

__all__ = ["f_exp", "f_exp2", "f_sigmoid", "f_tanh", "f_log", "f_log2", "f_expm1", "f_log1p", "f_softplus", "f_pow",
           "f_rsqrt", "f_erf", "f_gelu", "f_gelu_tanh", "f_sin_cos"]

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
    return decide_near(v, 2.02 * _U * v, m, prec, emin, emax)


@jit(inline="always")
def _f_sigmoid(x):
    """(q, rel, k): sigmoid(x) within rel q 2**k of q 2**k, for |x| <= 2000 (comment above)."""
    if x >= 0.0:
        v, m = exp_fast(-x)
        return 1.0 / (1.0 + ldexp(v, m)), 4.04 * _U + 2.0**-1073, 0
    v, m = exp_fast(x)
    return v / (1.0 + ldexp(v, m)), 6.06 * _U + 2.0**-1073, m


@jit
def f_sigmoid(x, times_x, prec, emin, emax):
    """sigmoid(x) (or x sigmoid(x)) decided in float64, else (nan, False)."""
    if not (abs(x) <= 2000.0) or x == 0.0:
        return math.nan, False
    q, rel, k = _f_sigmoid(x)
    if times_x:
        xs, j = _scaled(x)
        q, rel, k = q * xs, rel + 1.01 * _U, k + j
    return decide_near(q, rel * abs(q), k, prec, emin, emax)


@jit
def f_tanh(x, prec, emin, emax):
    """tanh|x| = (1 - E) / (1 + E), E = e**(-2|x|) within 2u (exp_fast), for 1/16 <= |x| <= 40: the
    relative error is at most ``2u 2E / ((1 - E)(1 + E)) + 3u`` (the sensitivity of the quotient to E, then
    1 - E, 1 + E and the division, one rounding each), charged with a factor 1.01."""
    ax = abs(x)
    if not (0.0625 <= ax <= 40.0):
        return math.nan, False
    v, m = exp_fast(-2.0 * ax)
    E = ldexp(v, m)
    q = (1.0 - E) / (1.0 + E)
    rel = (2.02 * _U * 2.0 * E / ((1.0 - E) * (1.0 + E)) + 3.0 * _U) * 1.01
    r, ok = decide_near(q, rel * q, 0, prec, emin, emax)
    return (r if x > 0.0 else -r), ok


@jit
def f_log(x, prec, emin, emax):
    """log x = log(S) - k ln 2, x = S 2**-k with S in [1, 2): log(S) by log_fast (libm's log checked through
    exp_fast: a rigorous bound), k ln 2 as ``two_product(k, ln2_hi) + k ln2_lo`` (ln 2 within 2**-104
    relative; the product's rounding and the sum's, u of each), two additions (u each of their results)."""
    if not (0.0 < x < math.inf):
        return math.nan, False
    b, e = _log_val(x)
    return decide_near(b, e, 0, prec, emin, emax)


@jit(inline="always")
def _log_val(x):
    """(b, e): log x within e of b, for 0 < x finite (:func:`f_log`'s derivation)."""
    S, j = _scaled(x)
    L, eL = log_fast(1.0, S - 1.0, 0.0)  # S - 1 exact
    k = float(j)
    kh, kl = two_product(k, K_LN2[0])
    kl += k * K_LN2[1]
    a = L + kh
    b = a + kl
    return b, eL + abs(k) * 2.0**-103 + _U * (abs(k * K_LN2[1]) + abs(kl) + abs(a) + abs(b)) * 1.01


_LOG2E = 1.4426950408889634  # 1 / ln 2 within u


@jit
def f_log2(x, prec, emin, emax):
    """log2 x = log(x) / ln 2: log x within e of b (:func:`f_log`), times 1/ln 2 (within u, one product: u): within
    ``(e / ln 2 + 2 u |q|) 1.01``. Powers of two give an integer, which the bound decides (no midpoint is near)."""
    if not (0.0 < x < math.inf):
        return math.nan, False
    b, e = _log_val(x)
    q = b * _LOG2E
    return decide_near(q, (e * _LOG2E + 2.0 * _U * abs(q)) * 1.01, 0, prec, emin, emax)


@jit
def f_exp2(x, prec, emin, emax):
    """2**x = 2**n e**(f ln 2), n = rint(x), f = x - n exact (|x| <= 1100: x has at most 24 bits, f in [-1/2,
    1/2]); y = fl(f ln 2) within 2u |y| <= 0.7u (ln 2 and the product), which moves e**y by at most 0.71u
    relative; exp_fast 2.02u (scale m): within ``2.73 u`` of q 2**(m + n), charged 1.01 and 2**-1073."""
    if not (-1100.0 <= x <= 1100.0):
        return math.nan, False
    n = np.rint(x)
    f = x - n
    if f == 0.0:  # 2**n exactly: decide_scaled rounds it (subnormal or overflow included)
        return decide_near(1.0, 0.0, int(n), prec, emin, emax)
    v, m = exp_fast(f * K_LN2[0])
    return decide_near(v, (2.73 * _U * 1.01 + 2.0**-1073) * v, m + int(n), prec, emin, emax)


def _pio2_parts():
    """pi/2 as P1 + P2 + P3 (P1, P2 of at most 33 significant bits, P3 a float64) and a bound of the rest, from
    the exact integer interval of pi/2 (:func:`~refkern.kernels._ew_exact.const`)."""
    lo, hi, sh = xe.const("pi/2", 200)
    ends = [Fraction(lo, 2**-sh), Fraction(hi, 2**-sh)]
    P1 = Fraction(math.floor(ends[0] * 2**32), 2**32)
    P2 = Fraction(math.floor((ends[0] - P1) * 2**65), 2**65)
    P3 = float(ends[0] - P1 - P2)
    tail = max(abs(e - P1 - P2 - Fraction(P3)) for e in ends)
    return float(P1), float(P2), P3, float(tail) * 1.01 + 2.0**-1000


_P1, _P2, _P3, _PTAIL = _pio2_parts()
_2OPI = 0.6366197723675814  # 2 / pi, rounded: n = rint(x 2/pi) need only be near, the bound takes r as it is


@jit
def _cody_waite(ax):
    """(n, r, e): ``ax = n pi/2 + r'`` with ``|r' - r| <= e``, for 0.78 < ax < 2**20 (Cody and Waite): n = rint(ax
    2/pi) < 2**20, so n P1 and n P2 are exact (20 + 33 bits), ``ax - n P1`` is exact (Sterbenz: the two within a
    factor 2), then ``t - n P2`` and ``- fl(n P3)`` one rounding each, and pi/2's rest beyond P3 times n:
    ``e = 1.01 u (|t2| + |n P3| + |r|) + n tail``. n = -1 where |r| > 0.7854 (f_sin_cos's Taylor bound is for
    |r| <= pi/4 and holds to there), then the exact reduction decides."""
    n = np.rint(ax * _2OPI)
    t1 = ax - n * _P1
    t2 = t1 - n * _P2
    p3 = n * _P3
    r = t2 - p3
    if abs(r) > 0.7854:
        return -1, 0.0, 0.0
    return int(n) & 3, r, 1.01 * _U * (abs(t2) + abs(p3) + abs(r)) + n * _PTAIL


@jit
def f_sin_cos(x, want_cos, prec, emin, emax):
    """sin x or cos x for 2**-450 <= |x| finite: r from Cody and Waite's reduction below 2**20
    (:func:`_cody_waite`), else the exact one (_ew_dd._reduce, its high word: the low word is below u |r|), then
    Taylor in float64, 11 terms (truncation below 2**-72 of the
    value for |r| <= pi/4), by Horner in s = r**2: Higham's bound gamma_22 sum |c_k| s**k, with sum |c_k|
    s**k / |p(s)| at most sinh(r) / sin(r) <= 1.23 (sin) and cosh(r) / cos(r) <= 1.88 (cos), the rounded
    coefficients and s one u more each, the product by r one u: at most 28u (sin) and 41u (cos) relative,
    charged 64u; plus the reduction's error and the dropped low word (|d sin|, |d cos| <= |dr|)."""
    ax = abs(x)
    if not (2.0**-450 <= ax < math.inf):
        return math.nan, False
    if ax <= 0.78:
        n, rh, rl, er = 0, ax, 0.0, 0.0
    elif ax < 2.0**20:
        n, rh, er = _cody_waite(ax)
        rl = 0.0
        if n < 0:
            n, rh, rl, er = _reduce(ax)
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
    r, ok = decide_near(sg * v, e, 0, prec, emin, emax)
    return r, ok


# 1 / (2k + 1) for k = 0..255, each rounded once (u relative): the series of f_erf and f_gelu
_INV_ODD = 1.0 / (2.0 * np.arange(256) + 1.0)


@jit(inline="always")
def _odd_series(c):
    """(P, n): ``P = sum_(k <= n) tau_k``, ``tau_0 = 1``, ``tau_k = tau_(k-1) c / (2k + 1)`` for an exact c >= 0
    (A&S 7.1.6: ``erf z = 2/sqrt(pi) e**(-z**2) z P`` at ``c = 2 z**2``; every term positive), within
    ``4.04 n u + 2**-59`` relative of the whole series; n = 0 where 255 terms do not reach it.

    Each computed term is two products by rounded numbers (c exact, 1/(2k + 1) within u) away from the last,
    so within gamma_(3k) of its own exact value; the sequential sum of n + 1 positive terms adds gamma_n: within
    ``(gamma_(3n) + gamma_n)(1 + gamma_n) <= 4.04 n u`` (n <= 255). The loop stops where the next ratio ``r =
    c / (2n + 3) <= 1/2`` and the computed ``tau_n <= 2**-60 P``: the tail ``sum_(k > n) tau_k <= tau_n (r + r**2
    + ...) <= tau_n`` is below ``2**-59`` of the sum."""
    t = 1.0
    P = 1.0
    n = 0
    while True:
        n += 1
        if n > 255:
            return P, 0
        t = (t * c) * _INV_ODD[n]
        P += t
        if c <= 0.5 * (2 * n + 3) and t <= 2.0**-60 * P:
            return P, n


@jit
def f_erf(x, prec, emin, emax):
    """erf x for results of at most 24 bits (x a value of such a format), decided in float64, else (nan, False).

    For 2**-400 <= |x| = z < 4.5: ``erf z = 2/sqrt(pi) e**(-z**2) z P`` (:func:`_odd_series` at ``c = 2 z**2``;
    z**2 and c exact: z has at most 24 bits, its square 48): P within ``4.04 n u + 2**-59``, e**(-z**2) within
    2.02u (exp_fast), 2/sqrt(pi) within u (its double-word's high word), three products u each: the value
    within ``(4.04 n + 6.02) u + 2**-59`` relative, charged with a factor 1.01. For z >= 4.5: ``0 < erfc z <
    e**(-z**2) / (z sqrt(pi)) < 2.02e-10 < 2**-32`` (A&S 7.1.13), so erf z is 1 within 2**-32. Below 2**-400
    and beyond the series' 255 terms: (nan, False)."""
    ax = abs(x)
    if not (2.0**-400 <= ax < _INF):
        return _NAN, False
    sg = 1.0 if x > 0.0 else -1.0
    if ax >= 4.5:
        r, ok = decide_near(1.0, 2.0**-32, 0, prec, emin, emax)
        return sg * r, ok
    z2 = ax * ax
    P, n = _odd_series(2.0 * z2)
    if n == 0:
        return _NAN, False
    v, m = exp_fast(-z2)
    q = ((K_2SQPI[0] * v) * ax) * P
    rel = ((4.04 * n + 6.02) * _U + 2.0**-59) * 1.01
    r, ok = decide_near(q, rel * q, m, prec, emin, emax)
    return sg * r, ok


@jit
def f_gelu(x, prec, emin, emax):
    """gelu x = x/2 (1 + erf(x / sqrt 2)) for results of at most 24 bits, decided in float64, else (nan, False).

    ``erf(x / sqrt 2) = E = sqrt(2/pi) e**(-x**2 / 2) x P`` (:func:`_odd_series` at ``c = x**2``, exact, as is
    x**2 / 2: x / sqrt 2 is never formed): E within ``relE = (4.04 n + 6.02) u + 2**-59`` relative (the series,
    exp_fast's 2.02u, the constant's u, three products), charged with 1.01. ``D = fl(1 + E)`` then differs from
    the exact ``1 + erf`` by at most ``e1 = 1.01 relE |E| + u |D|``, which is large beside D where x < 0 makes
    ``1 + E`` cancel (the bound says so, and decide_scaled then leaves the element to the double-word path);
    the result ``q = fl((x/2) D)`` (x/2 exact) within ``(|x/2| e1 + u |q|) 1.01``. For x >= 6.4: ``1 - erf(x /
    sqrt 2) < 2**-32`` (f_erf's bound at 4.5 < 6.4 / sqrt 2), so D = 2 within 2**-32. Below 2**-400 in
    magnitude, non-finite, x <= -60 or beyond 255 terms: (nan, False); x < -3: :func:`_gelu_tail`."""
    ax = abs(x)
    if not (2.0**-400 <= ax < _INF) or x <= -60.0:
        return _NAN, False
    if x < -3.0:
        return _gelu_tail(ax, prec, emin, emax)
    h = 0.5 * x
    if x >= 6.4:
        D, e1 = 2.0, 2.0**-32
    else:
        c = x * x
        P, n = _odd_series(c)
        if n == 0:
            return _NAN, False
        v, m = exp_fast(-0.5 * c)
        E = ldexp(((K_SQRT2PI[0] * v) * x) * P, m)
        D = 1.0 + E
        e1 = 1.01 * ((4.04 * n + 6.02) * _U + 2.0**-59) * abs(E) + _U * D
    q = h * D
    return decide_near(q, (abs(h) * e1 + _U * abs(q)) * 1.01, 0, prec, emin, emax)


@jit(inline="always")
def _g_cf(y, step, n, tail):
    """The depth-n continued fraction ``y + s/(y + 2s/(... (y + n s/(y + tail))))`` (s = step), backward."""
    d = y + tail
    for j in range(n, 0, -1):
        d = y + (j * step) / d
    return d


@jit
def _laplace(y, step):
    """(G, rel, ok): Laplace's continued fraction of erfc (A&S 7.1.14), ``G = y + s/(y + 2s/(y + 3s/(...)))``, for
    y >= 2 and s = 1/2 (erfc y = e**(-y**2) / (sqrt(pi) G)) or s = 1 (erfc(y / sqrt 2) = sqrt(2/pi) e**(-y**2/2) /
    G: every level of the first at z = y / sqrt 2 multiplied by sqrt 2, ``d'_j = sqrt 2 d_j = y + j / d'_(j+1)``, so
    that y is exact and y / sqrt 2 never formed); G within rel of the computed G. The tail after depth n,
    ``(n + 1) s / d_(n+1)``, lies in ``(0, (n + 1) s / y)`` and the fraction is monotone in it: the evaluations
    with tails 0 and (n + 1) s / y bracket G. Each is computed as ``d_j = fl(y + fl(j s / d_(j+1)))`` (j s
    exact): relative error at most ``2u + theta eps_(j+1)``, ``theta = (j s / d_(j+1)) / d_j < 1``, so within
    ``(2 n + 3) u`` (the tail's division and sum included). n doubles from 16 until the bracket is below 2**-45
    of G (at most 256; else ok is False); rel is half the bracket plus ``(2 n + 3) u``, relative."""
    n = 16
    while True:
        a = _g_cf(y, step, n, 0.0)
        b = _g_cf(y, step, n, (n + 1) * step / y)
        lo, hi = min(a, b), max(a, b)
        if hi - lo <= 2.0**-45 * lo:
            break
        n *= 2
        if n > 256:
            return 1.0, 0.0, False
    G = 0.5 * (lo + hi)
    return G, 0.5 * (hi - lo) / G + (2 * n + 3) * _U, True


@jit
def _gelu_tail(y, prec, emin, emax):
    """gelu(-y) for 3 < y < 60: ``-y/2 erfc(y / sqrt 2) = -y e**(-y**2 / 2) / (sqrt(2 pi) G(y))`` (:func:`_laplace`
    with s = 1). e**(-y**2/2) within 2.02u (exp_fast; y**2 exact), 1/sqrt(2 pi) within 2**-54, two products and a
    division u each: within ``(rel_G + 5.1 u) |q|``, charged with 1.01."""
    G, rel, ok = _laplace(y, 1.0)
    if not ok:
        return _NAN, False
    v, m = exp_fast(-0.5 * (y * y))
    q = -((_RSQ2PI * y) * v) / G
    return decide_near(q, (rel + 5.1 * _U) * abs(q) * 1.01, m, prec, emin, emax)


@jit
def f_gelu_tanh(x, prec, emin, emax):
    """gelu's tanh form ``x/2 (1 + tanh u) = x sigmoid(w)``, ``w = 2 u = 2 sqrt(2/pi) x (1 + kappa x**2)``, for
    results of at most 24 bits, decided in float64, else (nan, False).

    x**2 is exact (24 bits), ``t = fl(kappa x**2)`` within 2u (kappa = 0.044715 and the product, u each),
    ``fl(1 + t)`` within 3u (t >= 0: ``2u t + u (1 + t)``), the product by x 4u, by ``2 sqrt(2/pi)`` (the
    constant within u, doubled exactly) 6u: w within ``6.06 u |w|``. sigmoid's relative sensitivity is
    ``1 - sigmoid <= 1``, so that costs at most ``6.06 u |w| e**|dw|``, charged ``6.12 u |w|`` (|w| <= 700:
    ``|dw| < 2**-40``); sigmoid(w) itself within f_sigmoid's 4.04u (w >= 0) or 6.06u (:func:`_f_sigmoid`), the
    product by x one u more. Where ``fl(w) > 700``: ``1 - sigmoid(w) < e**-699``, the result is x within
    ``2**-1000 |x|`` (x > 400 there: no subnormal). ``fl(w) < -700``, |x| below 2**-400 or above 2**20, zero
    and non-finite x: (nan, False)."""
    ax = abs(x)
    if not (2.0**-400 <= ax <= 2.0**20):
        return _NAN, False
    w = (2.0 * K_SQRT2PI[0]) * (x * (1.0 + K_KAPPA[0] * (x * x)))
    if w > 700.0:
        return decide_near(x, 2.0**-1000 * ax, 0, prec, emin, emax)
    if w < -700.0:
        return _NAN, False
    q, rel, k = _f_sigmoid(w)
    xs, j = _scaled(x)
    q = q * xs
    rel = rel + 1.01 * _U + 6.12 * _U * abs(w)
    return decide_near(q, rel * abs(q), k + j, prec, emin, emax)


#: 1 / (k + 1)! for k = 0..13, each rounded once (u relative): f_expm1's polynomial
_INV_FACT1 = np.array([1.0 / math.factorial(k + 1) for k in range(14)])


@jit
def f_expm1(x, prec, emin, emax):
    """e**x - 1 for results of at most 24 bits, decided in float64, else (nan, False).

    For 2**-400 <= |x| <= 0.35: ``x P(x)``, ``P = sum_(k <= 13) x**k / (k + 1)!`` by Horner; the truncation is
    below ``0.35**14 / 15! < 2**-60`` of P; Horner's error (Higham, Accuracy and Stability, 5.1) is at most
    ``gamma_28 sum |c_k| |x|**k`` and the rounded coefficients add ``u`` of that sum, which is at most
    ``(e**0.35 - 1) / 0.35 < 1.19`` while ``P >= (1 - e**-0.35) / 0.35 > 0.84``: within ``(28.2 * 1.19 / 0.84
    + 1.42) u < 41.4 u``, the product by x one u more: charged ``43 u + 2**-60``, times 1.01. For 0.35 < |x|,
    -2000 <= x <= 1100: ``E - 1``, E = e**x within 2.02u (exp_fast), the difference one rounding: within
    ``2.02 u E + u |q|`` (``E / |E - 1| <= 3.4``: no cancellation to speak of)."""
    ax = abs(x)
    if not (2.0**-400 <= ax) or not (-2000.0 <= x <= 1100.0):
        return _NAN, False
    if ax <= 0.35:
        P = _INV_FACT1[13]
        for k in range(12, -1, -1):
            P = _INV_FACT1[k] + x * P
        q = x * P
        return decide_near(q, (43.0 * _U + 2.0**-60) * 1.01 * abs(q), 0, prec, emin, emax)
    v, m = exp_fast(x)
    if x > 0.0:  # (v - 2**-m) 2**m: 2**-m exact (m >= 0 here)
        q = v - ldexp(1.0, -m)
        return decide_near(q, (2.02 * _U * v + _U * abs(q)) * 1.01, m, prec, emin, emax)
    E = ldexp(v, m)  # may lose bits below 2**-1074: at most 2**-1074 against |q| > 0.29
    q = E - 1.0
    return decide_near(q, (2.02 * _U * E + _U * abs(q) + 2.0**-1073) * 1.01, 0, prec, emin, emax)


@jit
def f_log1p(x, prec, emin, emax):
    """log(1 + x) for results of at most 24 bits, decided in float64, else (nan, False): for 2**-60 <= x finite,
    log_fast(1, x) (:func:`~refkern.kernels._transcendental.log_fast`: within its e_L); for -1 < x <= -1/32, 1 + x
    is exact (x has at most 24 bits, its last at 2**-29 or above) and ``log(1 + x) <= log(31/32)``: f_log's value
    and bound of the exact 1 + x. Elsewhere (nan, False)."""
    if 2.0**-60 <= x < _INF:
        L, eL = log_fast(1.0, x, 0.0)
        return decide_near(L, eL * 1.01, 0, prec, emin, emax)
    if -1.0 < x <= -0.03125:
        b, e = _log_val(1.0 + x)
        return decide_near(b, e * 1.01, 0, prec, emin, emax)
    return _NAN, False


@jit
def f_softplus(x, beta, threshold, prec, emin, emax):
    """torch's softplus at beta = 1 for results of at most 24 bits, decided in float64, else (nan, False): x where
    ``x > threshold`` (the exact comparison torch's ``x * 1 > threshold`` makes); else for -700 <= x <= 0,
    ``log1p(t)``, t = e**x within 2.02u (exp_fast) and log_fast(1, t, 2.02u t) within its e_L of it; for x > 0,
    ``x + log1p(e**-x)`` likewise, the sum one rounding more (u of it). Other beta, x < -700, non-finite x:
    (nan, False)."""
    if beta != 1.0 or not (-700.0 <= x < _INF):
        return _NAN, False
    if x > threshold:
        return x, True
    v, m = exp_fast(-abs(x))
    t = ldexp(v, m)
    L, eL = log_fast(1.0, t, 2.02 * _U * t)
    if x <= 0.0:
        return decide_near(L, eL * 1.01, 0, prec, emin, emax)
    q = x + L
    return decide_near(q, (eL + _U * q) * 1.01, 0, prec, emin, emax)


@jit
def f_pow(x, y, prec, emin, emax):
    """x**y for 0 < x finite and a finite number y, results of at most 24 bits, decided in float64, else (nan,
    False): ``e**(y log x)``, log x within e of b (:func:`f_log`'s value and absolute bound), ``w = fl(y b)``
    within ``|y| e + u |w|`` of y log x (an absolute error of the exponent, however b cancels near x = 1), which
    moves e**w by at most 1.01 times that relative (|w| <= 700, the error below 2**-30); exp_fast 2.02u. Exact
    and midpoint results need no care: an exact one is decided (no midpoint within the bound), a midpoint never
    is (the exact path's). y = 2, any finite x: ``x * x`` is exact in float64 (x has at most 24 bits, the square
    48; float32's range squared, ``2**-298`` to ``2**256``, lies in float64's normal range), rounded once by
    round_to (ties to even included). y = -1/2 is :func:`f_rsqrt`."""
    if y == 2.0 and abs(x) < _INF:
        return round_to(x * x, prec, emin, emax), True
    if not (0.0 < x < _INF) or not (abs(y) < _INF):
        return _NAN, False
    if y == -0.5:
        return f_rsqrt(x, prec, emin, emax)
    b, e = _log_val(x)
    w = y * b
    ew = abs(y) * e + _U * abs(w)
    if not (abs(w) <= 700.0) or ew > 2.0**-30:
        return _NAN, False
    v, m = exp_fast(w)
    return decide_near(v, (2.02 * _U + 1.01 * ew) * 1.01 * v, m, prec, emin, emax)


@jit
def f_rsqrt(x, prec, emin, emax):
    """1 / sqrt(x) for 0 < x finite (a value of a format of at most 24 bits), decided in float64, else (nan,
    False): float64's sqrt and division are correctly rounded: the sqrt's rounding moves 1/s by at most u / (1 -
    u) relative, the division's by u more, so ``fl(1 / fl(sqrt x))`` is within ``(1 + u) / (1 - u) - 1 < 2.01
    u`` of it; charged with a factor 1.01."""
    if not (0.0 < x < _INF):
        return _NAN, False
    q = 1.0 / math.sqrt(x)
    return decide_near(q, 2.01 * 1.01 * _U * q, 0, prec, emin, emax)
