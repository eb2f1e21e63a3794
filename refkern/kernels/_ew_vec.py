"""The vectorisable first pass of the elementwise functions (:mod:`refkern.kernels.elementwise`, step 0): for results
of at most 24 bits, exp, exp2, expm1, sigmoid, silu, tanh, log, log2, log1p, sin, cos, sqrt, reciprocal, rsqrt, pow
and gelu's tanh form (erf and gelu: :mod:`refkern.kernels._ew_vec_erf`) on the arguments where their float64
evaluation needs no branch, no libm call and no scaling outside float64's normal range, so that LLVM vectorises the
loop; the rounding decided by the two ends of the bound (:func:`_decide`). An element outside that range, or whose
bound straddles a rounding boundary, is marked in ``und`` and goes through the float64 tier
(:mod:`refkern.kernels._ew_f64`) and on.

The evaluations and their bounds are the float64 tier's (each derivation there, cited at each kernel); only the
ranges are narrower. log and log2 have their own table-driven evaluation (:func:`_log_core`), which needs no libm
call: the float64 tier's checks libm's log through exp, 30 ns per element. Measured (1e6 float32 elements, one
thread, process CPU time): exp's float64 tier 9-12 ns per element, this pass 2 ns; log 30 -> 3.6 ns; sigmoid 15 ->
2.3 ns; sin 20 -> 2.4 ns."""

import math
from fractions import Fraction

import numpy as np
from numba import prange, types
from numba.extending import overload

from refkern._jit import jit
from refkern.accumulate._bits import bits, fma, from_bits, pow2
from refkern.accumulate.formats import round_to
from refkern.kernels import _ew_exact as xe
from refkern.kernels._ew_dd import _FH, K_KAPPA, K_LN2, K_SQRT2PI
from refkern.kernels._ew_f64 import _2OPI, _P1, _P2, _P3, _PTAIL
from refkern.kernels._transcendental import U, exp_fast

__all__ = ["VEC"]


def _round(v, fmt):
    """v rounded to nearest even to the format ``fmt``: None for float32 (the hardware's conversion, IEEE 754's
    rounding to nearest: round_to's result), else its (prec, emin, emax) for round_to. Chosen by type when a kernel
    compiles (:func:`_round_impl`), so that a float32 kernel holds no round_to: its branches stopped LLVM
    vectorising the loops (gelu's 19 -> 40 ms on 1e6 elements)."""
    raise NotImplementedError("jitted only")


@overload(_round, inline="always")
def _round_impl(v, fmt):
    if isinstance(fmt, types.NoneType):

        def f32(v, fmt):
            return np.float64(np.float32(v))

        return f32

    def other(v, fmt):
        return round_to(v, fmt[0], fmt[1], fmt[2])

    return other




@jit(inline="always")
def _decide(y, e, fmt):  # (no short-circuit ``and`` in these kernels: its branches stop vectorising)
    """(RN(r), True) when every real r within e of the float64 y rounds alike to the format, else (RN(y - f),
    False): :func:`~refkern.kernels._transcendental.bracket_around`'s enclosure ``f = (e + 2u|y|)(1 + 2u) +
    2**-1073`` of ``[y - e, y + e]``, its ends rounded by :func:`_round`."""
    f = (e + 2.0 * U * abs(y)) * (1.0 + 2.0 * U) + 2.0**-1073
    a = _round(y - f, fmt)
    b = _round(y + f, fmt)
    return a, (a == b) & (np.signbit(a) == np.signbit(b))


@jit(parallel=True)
def _v_exp(x, fmt, out, und):
    """e**x for -104 <= x <= 89: exp_fast's ``v 2**m`` within 2.02u (f_exp), ``-151 <= m <= 129``, so ``2**m`` is
    exact and ``y = v 2**m`` a normal float64 (no rounding). Beyond: e**x rounds to zero or overflows in float32,
    the float64 tier decides it."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ok = (-104.0 <= xi) & (xi <= 89.0)
        v, m = exp_fast(xi if ok else 0.0)
        y = v * pow2(m)
        r, dec = _decide(y, 2.02 * U * y, fmt)
        out[i] = r
        und[i] = not (ok & dec)


@jit(parallel=True)
def _v_exp2(x, fmt, out, und):
    """2**x for -151 <= x <= 129: f_exp2's ``v 2**(m + n)`` within ``(2.73 u 1.01 + 2**-1073) v``, ``2**(m + n)``
    exact and the product normal (as in :func:`_v_exp`). An integer x gives a power of two exactly (the bound
    decides it unless it is a tie of the subnormal range: the float64 tier's)."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ok = (-151.0 <= xi) & (xi <= 129.0)
        xc = xi if ok else 0.0
        n = np.rint(xc)
        v, m = exp_fast((xc - n) * K_LN2[0])
        y = v * pow2(m + np.int64(n))
        r, dec = _decide(y, (2.73 * U * 1.01 + 2.0**-1073) * y, fmt)
        out[i] = r
        und[i] = not (ok & dec)


@jit(parallel=True)
def _v_sigmoid(x, times_x, fmt, out, und):
    """sigmoid(x) (times x where ``times_x``) for ``0 < |x| <= 100``: ``E = e**-|x| = v 2**m`` (m >= -146: E is
    exact and normal), ``q = 1 / (1 + E)`` (x > 0) or ``E / (1 + E)`` (x < 0), the operations of the float64 tier's
    ``_f_sigmoid`` (the scaling by an exact power of two commutes with the rounding of a normal quotient): within
    4.04u or 6.06u relative, charged 6.06u both; the product by x one u more (1.01u, as f_sigmoid charges: the
    product is normal, |x| >= 2**-149 and q >= e**-100)."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ok = (0.0 < abs(xi)) & (abs(xi) <= 100.0)
        xc = xi if ok else 1.0
        v, m = exp_fast(-abs(xc))
        E = v * pow2(m)
        q = (1.0 if xc > 0.0 else E) / (1.0 + E)
        rel = 6.06 * U + 2.0**-1073
        if times_x:
            q = q * xc
            rel = rel + 1.01 * U
        r, dec = _decide(q, rel * abs(q), fmt)
        out[i] = r
        und[i] = not (ok & dec)


@jit(parallel=True)
def _v_tanh(x, fmt, out, und):
    """tanh x for ``1/16 <= |x| <= 40``: f_tanh's ``(1 - E) / (1 + E)``, ``E = e**(-2|x|)`` (v 2**m, m >= -116:
    exact and normal), within ``(2.02 u 2E / ((1 - E)(1 + E)) + 3u) 1.01`` relative; the sign of x after."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ax = abs(xi)
        ok = (0.0625 <= ax) & (ax <= 40.0)
        axc = ax if ok else 1.0
        v, m = exp_fast(-2.0 * axc)
        E = v * pow2(m)
        q = (1.0 - E) / (1.0 + E)
        rel = (2.02 * U * 2.0 * E / ((1.0 - E) * (1.0 + E)) + 3.0 * U) * 1.01
        r, dec = _decide(q, rel * q, fmt)
        out[i] = r if xi > 0.0 else -r
        und[i] = not (ok & dec)


def _log_table():
    """For k = -32..64, ``c_k = 1 + k/128``: ``INVC[k + 32]`` = 1/c_k rounded to 28 significant bits (1 exactly at
    k = 0), and ``-log(INVC)`` as a double-word ``LT_HI + LT_LO`` within 2**-100 (the exact path's integer interval
    of the logarithm, 2**-118 wide, its midpoint rounded twice). And ln 2 as ``LN2_HI`` (40 bits) + ``LN2_LO``
    (within 2**-93 of the rest)."""
    invc, hi, lo = np.empty(97), np.empty(97), np.empty(97)
    for k in range(-32, 65):
        q = 1 / (1 + Fraction(k, 128))
        e = q.numerator.bit_length() - q.denominator.bit_length()  # 2**(e - 1) < q < 2**(e + 1)
        v = Fraction(round(q * 2 ** (28 - e)), 2 ** (28 - e))  # at most 29 bits, within 2**-27 of q
        a, b, sh = xe.log(xe.point(float(v)), 124)
        assert (b - a) * Fraction(2) ** sh <= Fraction(1, 2**118)
        mid = -Fraction(a + b, 2) * Fraction(2) ** sh if k else Fraction(0)  # log 1 = 0 exactly
        invc[k + 32], hi[k + 32] = float(v), float(mid)
        lo[k + 32] = float(mid - Fraction(hi[k + 32]))
    a, b, sh = xe.const("ln2", 200)
    ln2 = Fraction(a, 2**-sh)
    l_hi = Fraction(round(ln2 * 2**40), 2**40)
    return invc, hi, lo, float(l_hi), float(ln2 - l_hi)


INVC, LT_HI, LT_LO, LN2_HI, LN2_LO = _log_table()
_LOG2E = 1.4426950408889634  # 1 / ln 2 within u (the float64 tier's)


@jit(inline="always")
def _log1p_poly(r):
    """``p = r h_1``, ``h_k = c_k + r h_(k+1)``, ``c_k = (-1)**(k+1) / k`` for k = 8..1: log1p(r) for |r| <
    0.0053 within ``(4.1u + 2**-63) |p|`` (:func:`_log_core`'s derivation)."""
    h = -0.125
    h = 1.0 / 7.0 + r * h
    h = -1.0 / 6.0 + r * h
    h = 0.2 + r * h
    h = -0.25 + r * h
    h = 1.0 / 3.0 + r * h
    h = -0.5 + r * h
    h = 1.0 + r * h
    return r * h


@jit(inline="always")
def _log_core(x):
    """(b, e, ok): ``|log x - b| <= e`` for x a positive normal float64 (ok False elsewhere; the value then
    meaningless).

    ``x = S 2**j``, S in [1, 2) from the bits, halved (j + 1) where S >= 1.5: S in [0.75, 1.5). ``k = rint(128 (S -
    1))`` in [-32, 64], ``|S - c_k| <= 1/256``; ``r = fma(S, INVC_k, -1)``, one rounding (none where S has at most
    24 bits: the product has at most 24 + 29 bits and lies within a factor 2 of 1), within ``u |r|`` of ``S INVC_k -
    1``, which moves log1p(r) by at most ``1.006 u |r|``, charged ``1.01u |r|``; ``|r| <= (1/256) / 0.75 + 2**-27 +
    u < 0.0053``. ``log x = j ln2 + (-log INVC_k) + log1p(r)``; log1p(r) by :func:`_log1p_poly`: each partial h_k
    lies within a factor 1.006 of c_k (``|r h_(k+1)| <= 0.0053 |c_(k+1)| 1.006``), so each step adds at most 3u (c_k's
    rounding, the product's and the sum's) of it and passes on at most 0.006 of the error before: h_1 within 3.02u,
    p within 4.03u of ``r h_1``, charged 4.1u; the truncation ``|r|**9 / 9 / (1 - |r|) < 2**-64 |r|`` (|p| >= 0.997
    |r|: charged 2**-63 |p|). The sum: ``A = j LN2_HI + LT_HI`` (the product exact: |j| < 2**11, LN2_HI 40 bits; the
    sum one rounding), ``B = LT_LO + j LN2_LO`` (two roundings, u of each), ``C = p + B``, ``b = A + C`` (u of each);
    the constants' own errors, 2**-100 and ``|j| 2**-93``. At k = 0 the table's value is 0 and INVC 1: no
    cancellation near x = 1."""
    ok = (2.0**-1022 <= x) & (x < np.inf)
    xc = x if ok else 1.0
    bx = bits(xc)
    j = ((bx >> 52) & 2047) - 1023
    S = from_bits((bx & ((np.int64(1) << 52) - 1)) | (np.int64(1023) << 52))
    big = S >= 1.5
    S = S * 0.5 if big else S
    j = j + 1 if big else j
    k = np.int64(np.rint((S - 1.0) * 128.0))
    r = fma(S, INVC[k + 32], -1.0)
    p = _log1p_poly(r)
    fj = float(j)
    A = fj * LN2_HI + LT_HI[k + 32]
    B = LT_LO[k + 32] + fj * LN2_LO
    C = p + B
    b = A + C
    e = (U * (abs(A) + abs(B) + abs(fj * LN2_LO) + abs(C) + abs(b)) + (4.1 * U + 2.0**-63) * abs(p)
         + 1.01 * U * abs(r) + abs(fj) * 2.0**-93 + 2.0**-100) * 1.01  # fmt: skip
    return b, e, ok


@jit(parallel=True)
def _v_log1p(x, fmt, out, und):
    """log(1 + x) for -1 < x < 2**21, x != 0: for |x| <= 2**-8, :func:`_log1p_poly` at r = x (within ``(4.1u +
    2**-63) |p|``, charged 1.01 more); otherwise :func:`_log_core` of ``1 + x``, which is exact: x has at most 24
    bits, the last at 2**-31 or above, and ``1 + x < 2**22`` (or ``x <= -1/2``: Sterbenz). x < -1: NaN."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        small = abs(xi) <= 2.0**-8
        ok = (-1.0 < xi) & (xi < 2.0**21) & (xi != 0.0)
        p = _log1p_poly(xi if small else 0.0)
        b, e, okl = _log_core(1.0 + xi if (ok & (not small)) else 2.0)
        y = p if small else b
        e = (4.1 * U + 2.0**-63) * 1.01 * abs(p) if small else e
        r, dec = _decide(y, e, fmt)
        nan = xi < -1.0  # outside the domain: NaN (IEEE 754's log1p, torch's)
        out[i] = np.nan if nan else r
        und[i] = not ((ok & dec) | nan)


@jit(inline="always")
def softplus_bound(z):
    """(q, e) for |z| <= 100: q = softplus(z) = max(z, 0) + log1p(e**-|z|) in float64 within e, as
    :func:`_v_softplus`'s docstring derives (_log_core's argument 1 + t, t <= 1, is always in its range)."""
    v, m = exp_fast(-abs(z))
    t = v * pow2(m)
    small = t <= 2.0**-8
    p = _log1p_poly(t if small else 0.0)
    b, e, _ = _log_core(1.0 if small else 1.0 + t)
    L = p if small else b
    eL = ((4.1 * U + 2.0**-63) * abs(p) if small else e + U) + 2.02 * U * t
    q = z + L if z > 0.0 else L
    return q, (eL + (U * abs(q) if z > 0.0 else 0.0)) * 1.01


@jit(parallel=True)
def _v_softplus(x, threshold, fmt, out, und):
    """torch's softplus at beta = 1 for |x| <= 100: x where ``x > threshold``; else ``log1p(t)`` (x <= 0) or ``x +
    log1p(t)`` (x > 0), ``t = e**-|x| = v 2**m`` (exp_fast: within 2.02u t; exact and normal), as f_softplus. log1p(t)
    for t <= 2**-8 by :func:`_log1p_poly` (``(4.1u + 2**-63) |p|``), else by :func:`_log_core` of ``s = fl(1 + t)``
    (its e, plus ``|log s - log(1 + t)| <= u``: the sum's rounding, ``u s``, over s >= 1); t's own error moves log1p
    by at most 2.02u t (log1p' <= 1). The sum with x one rounding more (u |q|). All charged 1.01."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ok = abs(xi) <= 100.0
        q, e = softplus_bound(xi if ok else 0.0)
        r, dec = _decide(q, e, fmt)
        above = xi > threshold
        out[i] = xi if above else r
        und[i] = not ((ok & dec) | above)


def _softplus(x, params, fmt, out, und):
    if params[0] == 1.0:
        _v_softplus(x, params[1], fmt, out, und)
    else:
        und[:] = True  # another beta: the double-word path's


#: 1 / (k + 1)! for k = 0..13, each rounded once: f_expm1's polynomial
_INV_FACT1 = np.array([1.0 / math.factorial(k + 1) for k in range(14)])


@jit(parallel=True)
def _v_expm1(x, fmt, out, und):
    """e**x - 1 for ``2**-400 <= |x|``, -104 <= x <= 89: f_expm1's two evaluations, both computed, the one for |x|
    chosen: ``x P(x)`` (|x| <= 0.35, within ``(43u + 2**-60) 1.01 |q|``) or ``E - 1``, ``E = v 2**m`` exact and
    normal (exp_fast, 2.02u), within ``(2.02u E + u |q| + 2**-1073) 1.01`` (f_expm1's bound for x < -0.35; for x >
    0.35 its ``(v - 2**-m) 2**m`` is this same rounding, scaled by an exact power of two)."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ax = abs(xi)
        ok = (2.0**-400 <= ax) & (-104.0 <= xi) & (xi <= 89.0)
        small = ax <= 0.35
        xs = xi if small else 0.0
        P = _INV_FACT1[13]
        for k in range(12, -1, -1):
            P = _INV_FACT1[k] + xs * P
        q1 = xs * P
        v, m = exp_fast(xi if ok else 0.0)
        E = v * pow2(m)
        q2 = E - 1.0
        q = q1 if small else q2
        e = (43.0 * U + 2.0**-60) * 1.01 * abs(q1) if small else (2.02 * U * E + U * abs(q2) + 2.0**-1073) * 1.01
        r, dec = _decide(q, e, fmt)
        out[i] = r
        und[i] = not (ok & dec)


@jit(parallel=True)
def _v_gelu_tanh(x, fmt, out, und):
    """gelu's tanh form ``x sigmoid(w)``, ``w = 2 sqrt(2/pi) x (1 + kappa x**2)``, for ``2**-400 <= |x| <= 2**20``
    and ``|w| <= 100``: f_gelu_tanh's evaluation (w within ``6.06u |w|``, which moves sigmoid by ``6.12u |w|``
    relative) with :func:`_v_sigmoid`'s sigmoid (6.06u, E exact and normal) and the product by x (1.01u)."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ax = abs(xi)
        w = (2.0 * K_SQRT2PI[0]) * (xi * (1.0 + K_KAPPA[0] * (xi * xi)))
        ok = (2.0**-400 <= ax) & (ax <= 2.0**20) & (abs(w) <= 100.0)
        wc = w if ok else 1.0
        v, m = exp_fast(-abs(wc))
        E = v * pow2(m)
        q = (1.0 if wc > 0.0 else E) / (1.0 + E) * xi
        r, dec = _decide(q, (6.06 * U + 2.0**-1073 + 1.01 * U + 6.12 * U * abs(wc)) * abs(q), fmt)
        out[i] = r
        und[i] = not (ok & dec)


@jit(parallel=True)
def _v_log(x, base2, fmt, out, und):
    """log x (log2 x where ``base2``: ``b / ln 2``, times _LOG2E within u, one product: ``(e / ln 2 + 2u |q|)
    1.01``, as f_log2) for positive normal x, from :func:`_log_core`."""
    for i in prange(x.size):
        b, e, ok = _log_core(np.float64(x[i]))
        if base2:
            b = b * _LOG2E
            e = (e * _LOG2E + 2.0 * U * abs(b)) * 1.01
        r, dec = _decide(b, e, fmt)
        out[i] = r
        und[i] = not (ok & dec)


def _log(x, params, *args):
    _v_log(x, False, *args)


def _log2(x, params, *args):
    _v_log(x, True, *args)


@jit(parallel=True)
def _v_sin_cos(x, want_cos, fmt, out, und):
    """sin x or cos x for ``2**-450 <= |x| < 2**20``: f_sin_cos's evaluation without its branches: Cody and Waite's
    reduction (:func:`~refkern.kernels._ew_f64._cody_waite`'s steps and bound: for |x| <= 0.78, n = 0 and every
    step is exact, the bound only larger than f_sin_cos's 0), ``|r| <= 0.7854`` required, both Taylor polynomials
    (11 terms by Horner in r**2, within 64u relative), the quadrant's chosen; plus the reduction's error."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ax = abs(xi)
        ok = (2.0**-450 <= ax) & (ax < 2.0**20)
        axc = ax if ok else 0.5
        n = np.rint(axc * _2OPI)
        t1 = axc - n * _P1
        t2 = t1 - n * _P2
        p3 = n * _P3
        r = t2 - p3
        ok = ok & (abs(r) <= 0.7854)
        er = 1.01 * U * (abs(t2) + abs(p3) + abs(r)) + n * _PTAIL
        sq = r * r
        ps = _FH[21]
        pc = _FH[20]
        for k in range(9, -1, -1):
            ps = _FH[2 * k + 1] - sq * ps
            pc = _FH[2 * k] - sq * pc
        sn = r * ps
        q = (np.int64(n) + (1 if want_cos else 0)) & 3  # cos x = sin(x + pi/2)
        v = sn if (q & 1) == 0 else pc
        v = -v if q >= 2 else v
        v = -v if (xi < 0.0) & (not want_cos) else v
        r2, dec = _decide(v, 64.0 * U * abs(v) + er, fmt)
        out[i] = r2
        und[i] = not (ok & dec)


def _log1p(x, params, *args):
    _v_log1p(x, *args)


def _expm1(x, params, *args):
    _v_expm1(x, *args)


def _gelu_tanh(x, params, *args):
    _v_gelu_tanh(x, *args)


def _sin(x, params, *args):
    _v_sin_cos(x, False, *args)


def _cos(x, params, *args):
    _v_sin_cos(x, True, *args)


def _sigmoid(x, params, *args):
    _v_sigmoid(x, False, *args)


def _silu(x, params, *args):
    _v_sigmoid(x, True, *args)


@jit(parallel=True)
def _v_root(x, kind, fmt, out, und):
    """kind 0: sqrt x, 1: 1/x, each correctly rounded in float64 and rounded once more to the format: innocuous
    for ``p <= 24`` (``53 >= 2p + 2``, :mod:`refkern.kernels.elementwise`'s docstring), every element decided
    (specials as float64's). kind 2: x * x, exact in float64 for x of at most 24 bits in float32's range (f_pow's
    y = 2), rounded once: decided unless the bracket meets a tie (the float64 tier's). kind 3: 1/sqrt(x) for 0 < x
    finite, f_rsqrt's ``fl(1 / fl(sqrt x))`` within ``2.01u 1.01`` relative."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        if kind == 0 or kind == 1:
            v = np.sqrt(xi) if kind == 0 else 1.0 / xi
            out[i] = _round(v, fmt)
            und[i] = False
        elif kind == 2:
            v = xi * xi
            r, dec = _decide(v, 0.0, fmt)
            out[i] = r
            und[i] = not (dec & (abs(xi) < np.inf))
        else:
            ok = (0.0 < xi) & (xi < np.inf)
            v = 1.0 / np.sqrt(xi if ok else 1.0)
            r, dec = _decide(v, 2.01 * 1.01 * U * v, fmt)
            out[i] = r
            und[i] = not (ok & dec)


def _exp(x, params, *args):
    _v_exp(x, *args)


def _exp2(x, params, *args):
    _v_exp2(x, *args)


def _tanh(x, params, *args):
    _v_tanh(x, *args)


def _sqrt(x, params, *args):
    _v_root(x, 0, *args)


def _reciprocal(x, params, *args):
    _v_root(x, 1, *args)


def _rsqrt(x, params, *args):
    _v_root(x, 3, *args)


@jit(parallel=True)
def _v_pow(x, y, fmt, out, und):
    """x**y for 0 < x finite, y finite: f_pow's ``e**(y log x)`` with :func:`_log_core`'s log (b within e): ``w =
    fl(y b)`` within ``ew = |y| e + u |w|``, which moves e**w by at most 1.01 ew relative (ew <= 2**-30); exp_fast
    2.02u; for -104 <= w <= 89 the scale 2**m is exact and the product normal (as :func:`_v_exp`). Within ``(2.02u
    + 1.01 ew) 1.01 v``. Exact results are decided, midpoints never (the exact path's). y: one exponent for every
    element (size 1) or each element's (a tensor exponent); an infinite or NaN y is left undecided (ew is not
    finite)."""
    for i in prange(x.size):
        yi = y[0]
        if y.size == x.size and y.size > 1:
            yi = y[i]
        b, e, ok = _log_core(np.float64(x[i]))
        w = yi * b
        ew = abs(yi) * e + U * abs(w)
        ok = ok & (-104.0 <= w) & (w <= 89.0) & (ew <= 2.0**-30)
        v, m = exp_fast(w if ok else 0.0)
        q = v * pow2(m)
        r, dec = _decide(q, (2.02 * U + 1.01 * ew) * 1.01 * q, fmt)
        out[i] = r
        und[i] = not (ok & dec)


def _pow(x, params, *args):
    y = params[0]
    if np.ndim(y):  # a tensor exponent: each element's
        _v_pow(x, np.ascontiguousarray(y, np.float64).reshape(-1), *args)
    elif y == 2.0:
        _v_root(x, 2, *args)
    elif y == -0.5:
        _v_root(x, 3, *args)
    elif abs(y) < np.inf:
        _v_pow(x, np.array([y], np.float64), *args)
    else:
        args[-1][:] = True  # an infinite exponent: the float64 tier's and the exact path's special values


def kernel_format(fmt):
    """The ``fmt`` argument of the passes: None for float32, else the format's (prec, emin, emax)."""
    return None if tuple(fmt.params) == (24, -126, 127) else tuple(int(v) for v in fmt.params)


#: fn -> its first pass ``(x, params, fmt, out, und)`` (fmt: :func:`kernel_format`): x the float32 values of the
#: input (every format of at most 24 bits is one), out float32 (it holds every result of such a format exactly),
#: und bool
VEC = {"exp": _exp, "exp2": _exp2, "sigmoid": _sigmoid, "silu": _silu, "tanh": _tanh, "log": _log, "log2": _log2,
       "sqrt": _sqrt, "reciprocal": _reciprocal, "rsqrt": _rsqrt, "pow": _pow,
       "sin": _sin, "cos": _cos, "log1p": _log1p, "expm1": _expm1, "gelu_tanh": _gelu_tanh,
       "softplus": _softplus}  # fmt: skip
