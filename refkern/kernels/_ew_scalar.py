"""One element of each elementwise function: special values as IEEE 754 and torch say, the cases whose
rounding is known outright (each with its reason), and otherwise a double-word value with a rigorous
bound from :mod:`refkern.kernels._ew_dd`.

Each ``v_<op>(x, ...)`` returns ``(qh, ql, e, k, ok)``: the real value lies within ``e 2**k`` of
``(qh + ql) 2**k``; ``e == 0`` with ``qh`` zero, infinite or NaN is that special result itself (a zero
keeps its sign); ``ok`` False sends the element to the exact path. Magnitude arguments used below:

* a tiny argument whose result is ``x (1 + d)`` with ``|d| < 2**-100`` rounds to x itself (x lies in
  the format, the same as the result's): the nearest other value is ``2**-prec`` away relatively (below
  a power of two, ``2**-(prec+1)``); so expm1, log1p, tanh, sin for ``|x| < 2**-60`` give x.
* far tails: ``e**-2000 < 2**-2885`` (below every format's half smallest subnormal even divided by
  torch's smallest useful beta), ``1 - tanh 40 < 2**-114``, ``erfc 10 < 2**-148``,
  ``erfc(40 / sqrt 2) / 2 < e**-800``: each then decided from a bound, not assumed (and within 2**-95
  of the value, as the yardstick needs).
"""

import math

import numpy as np

from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_div, dd_div_fp, dd_mul, dd_mul_fp, dd_sqrt
from refkern.accumulate.eft import two_product
from refkern.kernels._ew_dd import (
    CONST_REL,
    K_2SQPI,
    K_KAPPA,
    K_LN2,
    K_RSQRT2,
    K_SQRT2PI,
    erf_core,
    erfc_core,
    exp_core,  # fmt: skip
    log1p_small,
    log_core,
    sin_cos_core,
)
from refkern.kernels._transcendental import _F_HI, _F_LO, frexp1

_NAN = math.nan
_INF = math.inf
_RSQ2PI = 0.3989422804014327  # 1/sqrt(2 pi) within 2**-54
_SQ2PI = 0.7978845608028654  # sqrt(2/pi) within 2**-53
_U = 2.0**-53


@jit(inline="always")
def _special(v):
    return v, 0.0, 0.0, 0, True


@jit(inline="always")
def _scaled(x):
    """x = xs 2**j with xs in [1, 2) (x finite, nonzero): :func:`~refkern.kernels._transcendental.frexp1`."""
    return frexp1(x)


@jit
def v_exp(x):
    if x != x:
        return _special(_NAN)
    if x > 1100.0:
        return _special(_INF)
    if x < -2000.0:
        return _special(0.0)
    vh, vl, rel, m = exp_core(x, 0.0, 0.0)
    return vh, vl, rel * vh, m, True


@jit
def v_exp2(x):
    if x != x:
        return _special(_NAN)
    if x >= 1100.0:
        return _special(_INF)
    if x <= -1200.0:
        return _special(0.0)  # 2**-1200 < 2**-1076
    n = math.floor(x + 0.5)
    f = x - n  # exact
    if f == 0.0:
        return 1.0, 0.0, 0.0, int(n), True
    ph, pl = two_product(f, K_LN2[0])
    pl += f * K_LN2[1]
    vh, vl, rel, m = exp_core(ph, pl, abs(f) * 2.0**-103)
    return vh, vl, rel * vh, m + int(n), True


@jit
def _expm1_small(x):
    """e**x - 1 for |x| <= 0.0055: exp_dd's polynomial (relative error 2.02 EPS, module docstring there)."""
    hh, hl = _F_HI[11], _F_LO[11]
    for k in range(10, 0, -1):
        hh, hl = dd_mul_fp(hh, hl, x)
        hh, hl = dd_add(_F_HI[k], _F_LO[k], hh, hl)
    qh, ql = dd_mul_fp(hh, hl, x)
    return qh, ql, 3.0 * EPS * abs(qh)


@jit
def v_expm1(x):
    if x != x or x == _INF:
        return _special(x)
    if x == -_INF:
        return _special(-1.0)
    if abs(x) < 2.0**-60:
        return _special(x) if x == 0.0 else (x, 0.0, 0.0, 0, True)
    if x > 1100.0:
        return _special(_INF)
    if x < -2000.0:
        return -1.0, 0.0, 2.0**-1074, 0, True
    if abs(x) <= 0.0055:
        qh, ql, e = _expm1_small(x)
        return qh, ql, e, 0, True
    vh, vl, rel, m = exp_core(x, 0.0, 0.0)
    if x > 0.0:  # (v - 2**-m) 2**m; 2**-m may underflow (at most 2**-1074 lost)
        dh, dl = dd_add_fp(vh, vl, -math.ldexp(1.0, -m))
        return dh, dl, rel * vh + EPS * abs(dh) + 2.0**-1074, m, True
    dh, dl = dd_add_fp(math.ldexp(vh, m), math.ldexp(vl, m), -1.0)
    return dh, dl, rel * math.ldexp(vh, m) + EPS * abs(dh) + 2.0**-1073, 0, True


@jit
def _log_pos(x):
    a, j = _scaled(x)
    return log_core(a, 0.0, j, 0.0)


@jit
def v_log(x):
    if x != x or x < 0.0:
        return _special(_NAN)
    if x == 0.0:
        return _special(-_INF)
    if x == _INF:
        return _special(_INF)
    lh, ll, e = _log_pos(x)
    return lh, ll, e, 0, True


@jit
def v_log2(x):
    if x != x or x < 0.0:
        return _special(_NAN)
    if x == 0.0:
        return _special(-_INF)
    if x == _INF:
        return _special(_INF)
    a, j = _scaled(x)
    if a == 1.0:  # a power of two: log2 is the integer j
        return (float(j), 0.0, 0.0, 0, True) if j != 0 else _special(0.0)
    lh, ll, e = log_core(a, 0.0, j, 0.0)
    qh, ql = dd_div(lh, ll, K_LN2[0], K_LN2[1])
    return qh, ql, (e / 0.69 + (EPS + CONST_REL) * abs(qh)) * 1.0001, 0, True


@jit
def _log1p_of(th, tl, e_t):
    """log(1 + T) for a double-word T > -1 known within e_t: (lh, ll, e_abs), scale 0."""
    if abs(th) <= 0.03125:
        lh, ll, e = log1p_small(th, tl)
        return lh, ll, e + 1.04 * e_t
    sh, sl = dd_add_fp(th, tl, 1.0)
    a, j = _scaled(sh)
    return log_core(a, math.ldexp(sl, -j), j, 1.0001 * e_t / sh)


@jit
def v_log1p(x):
    if x != x or x < -1.0:
        return _special(_NAN)
    if x == -1.0:
        return _special(-_INF)
    if x == _INF:
        return _special(_INF)
    if abs(x) < 2.0**-60:
        return _special(x) if x == 0.0 else (x, 0.0, 0.0, 0, True)
    lh, ll, e = _log1p_of(x, 0.0, 0.0)
    return lh, ll, e, 0, True


@jit
def v_rsqrt(x):
    if x != x or x < 0.0:
        return _special(_NAN)
    if x == 0.0:
        return _special(math.copysign(_INF, x))
    if x == _INF:
        return _special(0.0)
    a, j = _scaled(x)
    if j % 2:
        a, j = 2.0 * a, j - 1  # x = a 4**(j/2), a in [1, 4)
    if a == 1.0:
        return 1.0, 0.0, 0.0, -(j // 2), True  # a power of four
    sh, sl = dd_sqrt(a, 0.0)
    qh, ql = dd_div(1.0, 0.0, sh, sl)
    return qh, ql, 2.01 * EPS * qh, -(j // 2), True


@jit
def _sigmoid_dd(yh, yl, ey):
    """1 / (1 + e**-y) for a double-word y known within ey (<= 2**-60): (qh, ql, e, k) (|y| <= 2000)."""
    if yh >= 0.0:
        vh, vl, rel, m = exp_core(-yh, -yl, ey)
        eh, el = math.ldexp(vh, m), math.ldexp(vl, m)  # e**-y <= 1; underflow loses at most 2**-1074
        dh, dl = dd_add_fp(eh, el, 1.0)
        qh, ql = dd_div(1.0, 0.0, dh, dl)
        return qh, ql, (rel * eh + 2.0 * EPS + 2.0**-1073) * qh * 1.0001, 0
    vh, vl, rel, m = exp_core(yh, yl, ey)
    eh, el = math.ldexp(vh, m), math.ldexp(vl, m)
    dh, dl = dd_add_fp(eh, el, 1.0)
    qh, ql = dd_div(vh, vl, dh, dl)
    return qh, ql, (2.0 * rel + 2.0 * EPS + 2.0**-1073) * qh * 1.0001, m


@jit
def v_sigmoid(x):
    if x != x:
        return _special(_NAN)
    if x > 2000.0:
        return 1.0, 0.0, 2.0**-1074, 0, True
    if x < -2000.0:
        return _special(0.0)
    qh, ql, e, k = _sigmoid_dd(x, 0.0, 0.0)
    return qh, ql, e, k, True


@jit
def _times_x(qh, ql, e, k, x):
    """x times the scaled value (qh + ql +- e) 2**k."""
    xs, j = _scaled(x)
    ph, pl = dd_mul_fp(qh, ql, xs)
    return ph, pl, (e * abs(xs) + EPS * abs(ph)) * 1.0001, k + j, True


@jit
def v_silu(x):
    if x != x or x == -_INF:
        return _special(_NAN)  # torch: x / (1 + e**-x) is -inf / inf
    if x == 0.0 or x == _INF:
        return _special(x)
    if x > 2000.0:
        return _times_x(1.0, 0.0, 2.0**-1074, 0, x)
    if x < -2000.0:
        return _special(-0.0)
    qh, ql, e, k = _sigmoid_dd(x, 0.0, 0.0)
    return _times_x(qh, ql, e, k, x)


@jit
def v_tanh(x):
    if x != x:
        return _special(_NAN)
    if x == 0.0 or abs(x) < 2.0**-60:
        return _special(x) if x == 0.0 else (x, 0.0, 0.0, 0, True)
    s = 1.0 if x > 0.0 else -1.0
    if abs(x) >= 40.0:
        return s, 0.0, 2.0**-114, 0, True  # 1 - tanh 40 = 2 / (e**80 + 1) < 2**-114
    y = 2.0 * abs(x)  # tanh|x| = t / (t + 2), t = e**(2|x|) - 1
    th, tl, e, k, ok = v_expm1(y)
    th, tl, e = math.ldexp(th, k), math.ldexp(tl, k), math.ldexp(e, k)
    dh, dl = dd_add_fp(th, tl, 2.0)
    qh, ql = dd_div(th, tl, dh, dl)
    return s * qh, s * ql, (e / th + 2.0 * EPS) * qh * 1.0001, 0, True


@jit
def v_erf(x):
    if x != x:
        return _special(_NAN)
    s = 1.0 if x > 0.0 else -1.0
    ax = abs(x)
    if x == 0.0:
        return _special(x)
    if ax >= 10.0:
        return s, 0.0, 2.0**-140, 0, True  # erfc 10 < 2**-148
    if ax >= 6.5:  # 1 - erfc x, erfc from the continued fraction
        z2h, z2l = two_product(ax, ax)
        qh, ql, e, k = erfc_core(ax, 0.0, z2h, z2l, 0.0)
        dh, dl = dd_add_fp(-math.ldexp(qh, k), -math.ldexp(ql, k), 1.0)
        return s * dh, s * dl, math.ldexp(e, k) + EPS + 2.0**-1074, 0, True
    if ax < 2.0**-400:  # 2/sqrt(pi) x (1 - x**2/3 ...)
        xs, j = _scaled(ax)
        qh, ql = dd_mul_fp(K_2SQPI[0], K_2SQPI[1], xs)
        return s * qh, s * ql, (CONST_REL + EPS + 2.0**-790) * qh, j, True
    z2h, z2l = two_product(ax, ax)
    qh, ql, e = erf_core(ax, 0.0, z2h, z2l, 0.0)
    return s * qh, s * ql, e, 0, True


@jit
def v_gelu(x):
    """x Phi(x) = x/2 (1 + erf(x / sqrt 2)) = x/2 erfc(-x / sqrt 2)."""
    if x != x or x == -_INF:
        return _special(_NAN)  # torch: -inf * 0
    if x == 0.0 or x == _INF:
        return _special(x)
    ax = abs(x)
    if ax < 2.0**-400:  # Phi(x) = 1/2 + x / sqrt(2 pi) (1 + O(x**2))
        return _times_x(0.5, x * _RSQ2PI, abs(x) * 2.0**-53, 0, x)
    if x >= 40.0:
        return _times_x(1.0, 0.0, 2.0**-1000, 0, x)  # erfc(40 / sqrt 2) / 2 < e**-800
    if x <= -63.0:
        return _special(-0.0)  # |x| Phi(x) < e**-1984
    zh, zl = dd_mul_fp(K_RSQRT2[0], K_RSQRT2[1], ax)
    z2h, z2l = two_product(ax, ax)
    z2h, z2l = 0.5 * z2h, 0.5 * z2l  # z**2 = x**2 / 2 exactly
    zrel = CONST_REL + EPS
    if x >= 9.0:  # Phi = 1 - erfc(z) / 2, erfc from the continued fraction (z >= 6.36)
        qh, ql, e, k = erfc_core(zh, zl, z2h, z2l, zrel)
        ph, pl = dd_add_fp(-0.5 * math.ldexp(qh, k), -0.5 * math.ldexp(ql, k), 1.0)
        return _times_x(ph, pl, 0.5 * math.ldexp(e, k) + EPS + 2.0**-1074, 0, x)
    if x > 0.0:
        eh, el, e = erf_core(zh, zl, z2h, z2l, zrel)
        ph, pl = dd_add_fp(eh, el, 1.0)
        return _times_x(0.5 * ph, 0.5 * pl, 0.5 * (e + EPS * ph), 0, x)
    qh, ql, e, k = erfc_core(zh, zl, z2h, z2l, zrel)
    return _times_x(0.5 * qh, 0.5 * ql, 0.5 * e, k, x)


@jit
def v_gelu_tanh(x):
    """x sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x**3): 0.5 x (1 + tanh u) without cancellation."""
    if x != x or x == -_INF:
        return _special(_NAN)
    if x == 0.0 or x == _INF:
        return _special(x)
    ax = abs(x)
    if ax < 2.0**-400:  # sigmoid(2u) = 1/2 + u/2 + O(u**3)
        return _times_x(0.5, 0.5 * _SQ2PI * x, abs(x) * 2.0**-53, 0, x)
    if ax > 2.0**20:  # |2u| > 2**57
        return _times_x(1.0, 0.0, 2.0**-1074, 0, x) if x > 0.0 else _special(-0.0)
    wh, wl = two_product(x, x)
    ah, al = dd_mul(K_KAPPA[0], K_KAPPA[1], wh, wl)
    ah, al = dd_add_fp(ah, al, 1.0)
    uh, ul = dd_mul(K_SQRT2PI[0], K_SQRT2PI[1], ah, al)
    uh, ul = dd_mul_fp(uh, ul, 2.0 * x)
    if uh > 2000.0:
        return _times_x(1.0, 0.0, 2.0**-1074, 0, x)
    if uh < -2000.0:
        return _special(-0.0)
    qh, ql, e, k = _sigmoid_dd(uh, ul, abs(uh) * (2.0 * CONST_REL + 4.0 * EPS))
    return _times_x(qh, ql, e, k, x)


@jit
def v_softplus(x, beta, threshold):
    """torch's softplus: x where beta x > threshold, else log(1 + e**(beta x)) / beta."""
    if x != x:
        return _special(_NAN)
    ph, pl = two_product(x, beta)
    if ph != ph:  # inf * 0
        return _special(_NAN)
    if ph > threshold or (ph == threshold and pl > 0.0):
        return _special(x) if (x == 0.0 or abs(x) == _INF) else (x, 0.0, 0.0, 0, True)
    if beta == 0.0:
        return _special(_INF)  # log 2 / 0
    if ph == -_INF:
        return _special(0.0 if beta > 0.0 else -0.0)
    if ph < -2000.0:
        if abs(beta) < 2.0**-700:
            return 0.0, 0.0, 0.0, 0, False  # e**y / beta may still be representable: the exact path
        return _special(0.0 if beta > 0.0 else -0.0)
    if ph <= 0.0:
        vh, vl, rel, m = exp_core(ph, pl, 0.0)
        if ph < -40.0:  # log1p(E) = E (1 - E/2 + E**2/3 ...), E < 2**-57
            E = math.ldexp(vh, m)
            qh, ql = dd_mul(vh, vl, 1.0, -0.5 * E)
            qh, ql = dd_div_fp(qh, ql, beta)
            return qh, ql, (rel + 2.0 * EPS + 2.0**-113) * abs(qh) * 1.0001, m, True
        eh, el = math.ldexp(vh, m), math.ldexp(vl, m)
        lh, ll, e = _log1p_of(eh, el, rel * eh)
    else:  # y + log1p(e**-y)
        if ph > 2000.0:
            lh, ll, e = ph, pl, 2.0**-1074
        else:
            vh, vl, rel, m = exp_core(-ph, -pl, 0.0)
            eh, el = math.ldexp(vh, m), math.ldexp(vl, m)
            lh, ll, e = _log1p_of(eh, el, rel * eh)
            lh, ll = dd_add(ph, pl, lh, ll)
            e += EPS * abs(lh)
    qh, ql = dd_div_fp(lh, ll, beta)
    return qh, ql, (e / abs(beta) + EPS * abs(qh)) * 1.0001, 0, True


@jit
def v_sin_cos(x, want_cos):
    if x != x or abs(x) == _INF:
        return _special(_NAN)
    if x == 0.0:
        return _special(1.0 if want_cos else x)
    if abs(x) < 2.0**-450:
        return (1.0, 0.0, 2.0**-900, 0, True) if want_cos else (x, 0.0, 0.0, 0, True)
    qh, ql, e = sin_cos_core(x, want_cos)
    return qh, ql, e, 0, True


@jit(inline="always")
def _is_int(y):
    """y an integer: every float64 of magnitude 2**52 or more is one (numba's math.floor returns an int64,
    which wraps beyond 2**63: pow(-1e-19, 3e28) was NaN, not +0)."""
    return abs(y) >= 2.0**52 or math.floor(y) == y


@jit(inline="always")
def _is_odd(y):
    return _is_int(y) and abs(y) < 2.0**53 and y - 2.0 * math.floor(0.5 * y) != 0.0  # exact below 2**53


@jit
def v_pow(x, y):
    """x ** y, y a float: C99/IEEE 754 pow's special values (as torch's), torch's y = 1/2 as sqrt and
    y = -1/2 as rsqrt (pow(-0, 0.5) = -0, pow(-inf, 0.5) = nan)."""
    if y == 0.0 or x == 1.0:
        return _special(1.0)
    if x != x or y != y:
        return _special(_NAN)
    if y == 0.5:  # sqrt: correctly rounded in float64, and rounding it again is innocuous (53 >= 2 p + 2)
        return np.sqrt(x), 0.0, 0.0, 0, True
    if y == -0.5:  # rsqrt, special values included (torch's)
        return v_rsqrt(x)
    odd = _is_odd(y)
    if x == 0.0:
        if y < 0.0:
            return _special(math.copysign(_INF, x) if odd else _INF)
        return _special(x if odd else 0.0)
    if abs(y) == _INF:
        if x == -1.0:
            return _special(1.0)
        big = abs(x) > 1.0
        return _special(_INF if big == (y > 0.0) else 0.0)
    if abs(x) == _INF:
        if x > 0.0:
            return _special(_INF if y > 0.0 else 0.0)
        if y > 0.0:
            return _special(-_INF if odd else _INF)
        return _special(-0.0 if odd else 0.0)
    if x < 0.0 and not _is_int(y):
        return _special(_NAN)
    if y == 2.0 and 2.0**-500 < abs(x) < 2.0**500:  # x * x exactly, as a double word (torch's x * x)
        ph, pl = two_product(x, x)
        return ph, pl, 0.0, 0, True
    s = -1.0 if (x < 0.0 and odd) else 1.0
    return _pos_pow(abs(x), y, s)


@jit
def _pos_pow(ax, y, s):
    """s |x|**y = s e**(y log|x|), |x| > 0 finite, y finite."""
    lh, ll, e = _log_pos(ax)
    ph, pl = dd_mul_fp(lh, ll, y)
    ea = (e * abs(y) + EPS * abs(ph)) * 1.0001
    if ph - ea > 1100.0:
        return _special(s * _INF)
    if ph + ea < -2000.0:
        return _special(s * 0.0)
    if ea > 2.0**-60 or ph > 1100.0 or ph < -2000.0:
        return 0.0, 0.0, 0.0, 0, False
    vh, vl, rel, m = exp_core(ph, pl, ea)
    return s * vh, s * vl, rel * vh, m, True
