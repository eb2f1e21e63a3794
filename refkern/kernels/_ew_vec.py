"""The vectorisable first pass of the elementwise functions (:mod:`refkern.kernels.elementwise`, step 0): for results
of at most 24 bits, exp, exp2, sigmoid, silu, tanh, log, log2, erf, gelu, sin, cos, sqrt, reciprocal, rsqrt and pow
on the arguments where their float64 evaluation needs no branch, no libm call and no scaling outside float64's
normal range, so that LLVM vectorises the loop; the rounding decided by the two ends of the bound (:func:`_decide`).
An element outside that range, or whose bound straddles a rounding boundary, is marked in ``und`` and goes through
the float64 tier (:mod:`refkern.kernels._ew_f64`) and on.

The evaluations and their bounds are the float64 tier's (each derivation there, cited at each kernel); only the
ranges are narrower. log and log2 have their own table-driven evaluation (:func:`_log_core`), which needs no libm
call: the float64 tier's checks libm's log through exp, 30 ns per element. Measured (1e6 float32 elements, one
thread): exp's float64 tier 9-12 ns per element, this pass about 5 ns; log 30 -> 8 ns."""

import functools
import math
from fractions import Fraction

import numpy as np
from numba import prange, types
from numba.extending import overload

from refkern._jit import jit
from refkern.accumulate._bits import bits, from_bits, pow2
from refkern.accumulate.formats import round_to
from refkern.kernels import _ew_exact as xe
from refkern.kernels._ew_dd import _FH, K_LN2
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


#: elements per task of erf's parallel pass: each task runs a plain loop (a separately compiled function), which
#: LLVM vectorised where the same loop as a prange body stayed scalar (34 -> 9 ms of CPU on 1e6 float32 elements,
#: one thread); the other passes went the other way (sigmoid 2.3 -> 31 ms, exp 1.9 -> 5.4) and stay prange loops
_CHUNK = 8192


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
def _log_core(x):
    """(b, e, ok): ``|log x - b| <= e`` for x a positive normal float64 of at most 24 significant bits (ok False
    elsewhere; the value then meaningless).

    ``x = S 2**j``, S in [1, 2) from the bits, halved (j + 1) where S >= 1.5: S in [0.75, 1.5), 24 bits at most.
    ``k = rint(128 (S - 1))`` in [-32, 64], ``|S - c_k| <= 1/256``; ``r = S INVC_k - 1`` is exact (the product has
    at most 24 + 29 bits, and lies within a factor 2 of 1: Sterbenz) and ``|r| <= (1/256) / 0.75 + 2**-27 <
    0.0053``. ``log x = j ln2 + (-log INVC_k) + log1p(r)``; log1p(r) by ``p = r h_1``, ``h_k = c_k + r h_(k+1)``,
    ``c_k = (-1)**(k+1) / k`` for k = 8..1: each partial h_k lies within a factor 1.006 of c_k (``|r h_(k+1)| <=
    0.0053 |c_(k+1)| 1.006``), so each step adds at most 3u (c_k's rounding, the product's and the sum's) of it and
    passes on at most 0.006 of the error before: h_1 within 3.02u, p within 4.03u of ``r h_1``, charged 4.1u; the
    truncation ``|r|**9 / 9 / (1 - |r|) < 2**-64 |r|`` (|p| >= 0.997 |r|: charged 2**-63 |p|). The sum: ``A =
    j LN2_HI + LT_HI`` (the product exact: |j| < 2**11, LN2_HI 40 bits; the sum one rounding), ``B = LT_LO + j
    LN2_LO`` (two roundings, u of each), ``C = p + B``, ``b = A + C`` (u of each); the constants' own errors,
    2**-100 and ``|j| 2**-93``. At k = 0 the table's value is 0 and r = S - 1: no cancellation near x = 1."""
    ok = (2.0**-1022 <= x) & (x < np.inf)
    xc = x if ok else 1.0
    bx = bits(xc)
    j = ((bx >> 52) & 2047) - 1023
    S = from_bits((bx & ((np.int64(1) << 52) - 1)) | (np.int64(1023) << 52))
    big = S >= 1.5
    S = S * 0.5 if big else S
    j = j + 1 if big else j
    k = np.int64(np.rint((S - 1.0) * 128.0))
    r = S * INVC[k + 32] - 1.0
    h = -0.125
    h = 1.0 / 7.0 + r * h
    h = -1.0 / 6.0 + r * h
    h = 0.2 + r * h
    h = -0.25 + r * h
    h = 1.0 / 3.0 + r * h
    h = -0.5 + r * h
    h = 1.0 + r * h
    p = r * h
    fj = float(j)
    A = fj * LN2_HI + LT_HI[k + 32]
    B = LT_LO[k + 32] + fj * LN2_LO
    C = p + B
    b = A + C
    e = (U * (abs(A) + abs(B) + abs(fj * LN2_LO) + abs(C) + abs(b)) + (4.1 * U + 2.0**-63) * abs(p)
         + abs(fj) * 2.0**-93 + 2.0**-100) * 1.01  # fmt: skip
    return b, e, ok


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


@functools.lru_cache(maxsize=1)
def erf_table():
    """(A0H, A0L, A): erf's Taylor coefficients at ``z0 = j/128``, j = 0..580 (z0 up to 4.53), built on first use
    (0.4 s of exact arithmetic: not at import). ``A0H + A0L`` is erf(z0) within 2**-100 (the exact path's interval,
    its midpoint rounded twice; 0 at j = 0); ``A[j, n]``, n = 1..7, is ``a_n = erf^(n)(z0) / n! = 2/sqrt(pi)
    (-1)**(n-1) H_(n-1)(z0) e**(-z0**2) / n!`` (Hermite's H by its recurrence, exact at the rational z0; the two
    constants' intervals 2**-120 wide) rounded once: within 1.0001u."""
    W = 130
    k2 = xe.const("2/sqrt(pi)", W)
    k2 = Fraction(k2[0] + k2[1], 2) * Fraction(2) ** k2[2]
    a0h, a0l, A = np.zeros(581), np.zeros(581), np.zeros((581, 8))
    for j in range(581):
        z = Fraction(j, 128)
        if j:
            lo, hi, sh = xe.erf(xe.point(float(z)), W)
            mid = Fraction(lo + hi, 2) * Fraction(2) ** sh
            a0h[j] = float(mid)
            a0l[j] = float(mid - Fraction(a0h[j]))
        lo, hi, sh = xe.exp(xe.point(-float(z * z)), W)  # z**2 = j**2 / 2**14: exact in float64
        ez = Fraction(lo + hi, 2) * Fraction(2) ** sh
        H = [Fraction(1), 2 * z]
        for n in range(1, 6):
            H.append(2 * z * H[n] - 2 * n * H[n - 1])
        for n in range(1, 8):
            A[j, n] = float(k2 * (-1) ** (n - 1) * H[n - 1] * ez / math.factorial(n))
    return a0h, a0l, A


@jit(parallel=True)
def _v_erf(x, a0h, a0l, A, fmt, out, und):
    """erf x for ``0 < |x| = z``: 1 within 2**-32 for z >= 4.5 (f_erf's bound); below, Taylor's polynomial of degree 7
    at the nearest ``z0 = j/128`` (:func:`erf_table`), ``h = z - z0`` exact (both on z's grid, |h| <= 2**-8).

    Remainder: Cramer's inequality ``|H_n(z)| <= 1.0865 sqrt(2**n n!) e**(z**2/2)`` (A&S 22.14.17) gives
    ``|erf^(n+1)| <= 2/sqrt(pi) 1.0865 sqrt(2**n n!) e**(-z**2/2)``, so the Lagrange remainder after h**7 is at most
    ``0.02442 |h|**8 <= 2**-61 |h|``, and ``P~ = sum_(n>=1) |a_n| |h|**(n-1) <= 1.1284 + 0.0034 + 9e-6 < 1.133``.
    ``p = a_1 + h (a_2 + ... h a_7)`` by Horner: within ``(gamma_12 + 1.0001u) P~ < 14.8u`` (Higham 5.1 and the
    coefficients' rounding); ``t = h p`` within ``14.8u |h| + u |t|``; ``s = A0L + t``, ``y = A0H + s`` one rounding
    each; the table's 2**-100 (none at j = 0, where erf(0) = 0). Charged ``(17.1u |h| + 2**-61 |h| + u (|t| + |s| +
    |y|) + 2**-100) 1.01``; the sign of x after. x = 0, non-finite x: the float64 tier's."""
    for c in prange((x.size + _CHUNK - 1) // _CHUNK):
        _b_erf(x, c * _CHUNK, min(x.size, (c + 1) * _CHUNK), a0h, a0l, A, fmt, out, und)


@jit
def _b_erf(x, lo, hi, a0h, a0l, A, fmt, out, und):
    for i in range(lo, hi):
        xi = np.float64(x[i])
        z = abs(xi)
        ok = (0.0 < z) & (z < np.inf)
        big = z >= 4.5
        zc = z if (ok & (not big)) else 0.0
        j = np.int64(np.rint(zc * 128.0))
        h = zc - j * 0.0078125
        p = A[j, 7]
        p = A[j, 6] + h * p
        p = A[j, 5] + h * p
        p = A[j, 4] + h * p
        p = A[j, 3] + h * p
        p = A[j, 2] + h * p
        p = A[j, 1] + h * p
        t = h * p
        s = a0l[j] + t
        y = a0h[j] + s
        e = ((17.1 * U + 2.0**-61) * abs(h) + U * (abs(t) + abs(s) + abs(y)) + 2.0**-100 * min(j, 1)) * 1.01
        y = 1.0 if big else y
        e = 2.0**-32 if big else e
        r, dec = _decide(y, e, fmt)
        out[i] = r if xi > 0.0 else -r
        und[i] = not (ok & dec)


def _erf(x, params, *args):
    _v_erf(x, *erf_table(), *args)


@functools.lru_cache(maxsize=1)
def erfcx_table():
    """F[j - 64, n] = ``f^(n)(z0) / n!``, n = 0..10, of ``f = erfcx = e**(z**2) erfc z`` at ``z0 = j/32``, j = 64..332
    (z0 from 2 to 10.375), built on first use (0.8 s). f(z0) from the exact path's erfc (2**-200 relative) times
    e**(z0**2); then ``f' = 2 z f - 2/sqrt(pi)``, ``f^(n+1) = 2 z f^(n) + 2 n f^(n-1)`` exactly on rationals. The
    recurrence cancels (about 5 bits a step at z0 = 10), so each coefficient is computed from the four corners of
    the two inputs' intervals (it is linear in f(z0) and in 2/sqrt(pi): the corners bound it) and their spread
    asserted below 2**-70 relative before the one rounding to float64 (within 1.0001u)."""
    W = 200
    c = xe.const("2/sqrt(pi)", W)
    cs = [Fraction(c[0], 1) * Fraction(2) ** c[2], Fraction(c[1], 1) * Fraction(2) ** c[2]]
    F = np.zeros((269, 11))
    for j in range(64, 333):
        z = Fraction(j, 32)
        lo, hi, sh = xe.erf(xe.point(float(z)), W, complement=True)
        elo, ehi, esh = xe.exp(xe.point(float(z * z)), W)  # z**2 = j**2 / 2**10: exact in float64
        fs = [lo * elo * Fraction(2) ** (sh + esh), hi * ehi * Fraction(2) ** (sh + esh)]
        ends = []
        for f0 in fs:
            for k in cs:
                d = [f0, 2 * z * f0 - k]
                for n in range(1, 10):
                    d.append(2 * z * d[n] + 2 * n * d[n - 1])
                ends.append([d[n] / math.factorial(n) for n in range(11)])
        for n in range(11):
            a, b = min(e[n] for e in ends), max(e[n] for e in ends)
            assert b - a <= Fraction(1, 2**70) * abs(a), (j, n)
            F[j - 64, n] = float((a + b) / 2)
    return F


_RSQ2 = 0.7071067811865476  # 1 / sqrt(2) within u


@jit(parallel=True)
def _v_gelu(x, a0h, a0l, A, fmt, out, und):
    """gelu x = x/2 (1 + erf(x / sqrt 2)) for -3 <= x < 6.37, x != 0; the tail x < -3 in :func:`_v_gelu_tail`.

    ``z = fl(fl(1/sqrt 2) x)`` within ``2.01u |z|`` of x / sqrt 2 (two roundings), which moves erf by at most
    ``2/sqrt(pi)`` times that; ``E = erf(z)`` by :func:`_v_erf`'s polynomial within its ``e_E`` (sign of x);
    ``D = fl(1 + E)`` one rounding (u |D|); ``q = fl((x/2) D)`` one more (x/2 exact): within ``(|x/2| (e_E +
    2.27u |z| + u |D|) + u |q|) 1.01``. For x >= 6.37, ``x / sqrt 2 >= 4.5043``: ``1 - erf < 2**-32`` (f_erf's
    bound), so q = x within ``|x/2| 2**-32``. D >= 2 Phi(-3) = 0.0027 here: the cancellation in 1 + E costs at most
    a factor 370 of u, far inside the bound's reach."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ok = (-3.0 <= xi) & (xi < np.inf) & (xi != 0.0)
        big = xi >= 6.37
        xc = xi if (ok & (not big)) else 0.0
        z = _RSQ2 * xc
        az = abs(z)
        j = np.int64(np.rint(az * 128.0))
        h = az - j * 0.0078125
        p = A[j, 7]
        p = A[j, 6] + h * p
        p = A[j, 5] + h * p
        p = A[j, 4] + h * p
        p = A[j, 3] + h * p
        p = A[j, 2] + h * p
        p = A[j, 1] + h * p
        t = h * p
        s = a0l[j] + t
        y = a0h[j] + s
        eE = ((17.1 * U + 2.0**-61) * abs(h) + U * (abs(t) + abs(s) + abs(y)) + 2.0**-100 * min(j, 1)) * 1.01
        D = 1.0 + (y if z >= 0.0 else -y)
        h2 = 0.5 * xc
        q = h2 * D
        e = (abs(h2) * (eE + 2.27 * U * az + U * abs(D)) + U * abs(q)) * 1.01
        q = xi if big else q
        e = abs(0.5 * xi) * 2.0**-32 if big else e
        r, dec = _decide(q, e, fmt)
        out[i] = r
        und[i] = not ((ok | big) & dec)


@jit(parallel=True)
def _v_gelu_tail(x, F, fmt, out, und):
    """gelu x for -14.5 <= x < -3 (y = -x): ``-y/2 erfc(y / sqrt 2) = -(y/2) f(z) e**(-y**2/2)``, f = erfcx.

    ``e**(-y**2/2) = v 2**m`` by exp_fast (y**2/2 exact: within 2.02u; m >= -153, 2**m exact, the result normal).
    ``z = fl(fl(1/sqrt 2) y)`` within 2.01u |z|; ``|f'| / f <= sqrt(z**2 + 2) - z <= 1/z`` (from ``2/(sqrt(pi) (z +
    sqrt(z**2 + 2))) < f(z)``, A&S 7.1.13), so z's error moves f by at most 2.03u relative. f(z) by Taylor's
    polynomial of degree 10 at the nearest ``z0 = j/32`` (:func:`erfcx_table`, |h| <= 2**-6): ``f^(n)(z) = 2/sqrt(pi)
    int (-2t)**n e**(-t**2 - 2zt) dt`` decreases in z, and ``|f^(n)(z)| <= 2/sqrt(pi) n! / (2 z**(n+1))``, so the
    remainder is at most ``|h|**11 / (sqrt(pi) z_min**12) < 2**-78`` (z_min >= 2.1) against ``f >= 0.054``, charged
    2**-70 relative; Horner's error ``(gamma_20 + 1.0001u) sum |a_n| |h|**n``, the sum within 1.017 of f (the ratio
    of successive terms below ``|h| / z_min < 0.0075``, f >= a_0 / 1.1): 21.4u. Two products, u each. Total ``(28.5u +
    2**-70)``, charged ``(29u + 2**-70) 1.01`` relative."""
    for i in prange(x.size):
        xi = np.float64(x[i])
        ok = (-14.5 <= xi) & (xi < -3.0)
        y = -xi if ok else 4.0
        z = _RSQ2 * y
        j = np.int64(np.rint(z * 32.0))
        h = z - j * 0.03125
        k = j - 64
        p = F[k, 10]
        for n in range(9, -1, -1):
            p = F[k, n] + h * p
        v, m = exp_fast(-0.5 * (y * y))
        q = -(((0.5 * y) * p) * v) * pow2(m)
        r, dec = _decide(q, (29.0 * U + 2.0**-70) * 1.01 * abs(q), fmt)
        out[i] = r
        und[i] = not (ok & dec)


def _gelu(x, params, fmt, out, und):
    _v_gelu(x, *erf_table(), fmt, out, und)
    idx = np.flatnonzero(und & (x < -3.0) & (x >= -14.5))
    if idx.size:
        o2, u2 = np.empty(idx.size, out.dtype), np.zeros(idx.size, np.bool_)
        _v_gelu_tail(x[idx], erfcx_table(), fmt, o2, u2)
        out[idx], und[idx] = o2, u2


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
    + 1.01 ew) 1.01 v``. Exact results are decided, midpoints never (the exact path's)."""
    for i in prange(x.size):
        b, e, ok = _log_core(np.float64(x[i]))
        w = y * b
        ew = abs(y) * e + U * abs(w)
        ok = ok & (-104.0 <= w) & (w <= 89.0) & (ew <= 2.0**-30)
        v, m = exp_fast(w if ok else 0.0)
        q = v * pow2(m)
        r, dec = _decide(q, (2.02 * U + 1.01 * ew) * 1.01 * q, fmt)
        out[i] = r
        und[i] = not (ok & dec)


def _pow(x, params, *args):
    y = params[0]
    if y == 2.0:
        _v_root(x, 2, *args)
    elif y == -0.5:
        _v_root(x, 3, *args)
    elif abs(y) < np.inf:
        _v_pow(x, y, *args)
    else:
        args[-1][:] = True  # an infinite exponent: the float64 tier's and the exact path's special values


def kernel_format(fmt):
    """The ``fmt`` argument of the passes: None for float32, else the format's (prec, emin, emax)."""
    return None if tuple(fmt.params) == (24, -126, 127) else tuple(int(v) for v in fmt.params)


#: fn -> its first pass ``(x, params, fmt, out, und)`` (fmt: :func:`kernel_format`): x the float32 values of the
#: input (every format of at most 24 bits is one), out float32 (it holds every result of such a format exactly),
#: und bool
VEC = {"exp": _exp, "exp2": _exp2, "sigmoid": _sigmoid, "silu": _silu, "tanh": _tanh, "log": _log, "log2": _log2,
       "erf": _erf, "gelu": _gelu, "sqrt": _sqrt, "reciprocal": _reciprocal, "rsqrt": _rsqrt, "pow": _pow,
       "sin": _sin, "cos": _cos}  # fmt: skip
