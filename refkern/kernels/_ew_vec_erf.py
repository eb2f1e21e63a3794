"""The vectorised first pass (:mod:`refkern.kernels._ew_vec`) of erf and gelu (erf form): Taylor polynomials at
the points of a grid, their coefficients built exactly on first use (erf's at ``j/128`` from Hermite's recurrence,
erfcx's at ``j/32`` for gelu's tail), each bound derived in the kernel's docstring; the rounding decided by
:func:`~refkern.kernels._ew_vec._decide`."""

import functools
import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import pow2
from refkern.kernels import _ew_exact as xe
from refkern.kernels._ew_vec import _decide
from refkern.kernels._transcendental import U, exp_fast

__all__ = ["VEC", "erf_table", "erfcx_table"]

#: elements per task of erf's parallel pass: each task runs a plain loop (a separately compiled function), which
#: LLVM vectorised where the same loop as a prange body stayed scalar (34 -> 9 ms of CPU on 1e6 float32 elements,
#: one thread); the other passes went the other way (sigmoid 2.3 -> 31 ms, exp 1.9 -> 5.4) and stay prange loops
_CHUNK = 8192


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


@jit(inline="always")
def _erf_poly(z, a0h, a0l, A):
    """(y, e): erf z for ``0 <= z < 4.53`` by Taylor's polynomial of degree 7 at the nearest ``z0 = j/128``
    (:func:`erf_table`), ``h = z - z0`` exact (both on z's grid, |h| <= 2**-8), and its bound e (derived in
    :func:`_v_erf`'s docstring); shared by erf's and gelu's passes."""
    j = np.int64(np.rint(z * 128.0))
    h = z - j * 0.0078125
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
    return y, ((17.1 * U + 2.0**-61) * abs(h) + U * (abs(t) + abs(s) + abs(y)) + 2.0**-100 * min(j, 1)) * 1.01


@jit
def _b_erf(x, lo, hi, a0h, a0l, A, fmt, out, und):
    for i in range(lo, hi):
        xi = np.float64(x[i])
        z = abs(xi)
        ok = (0.0 < z) & (z < np.inf)
        big = z >= 4.5
        y, e = _erf_poly(z if (ok & (not big)) else 0.0, a0h, a0l, A)
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
        y, eE = _erf_poly(az, a0h, a0l, A)
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


#: fn -> its first pass, as :data:`refkern.kernels._ew_vec.VEC`
VEC = {"erf": _erf, "gelu": _gelu}
