"""The vectorisable first pass of the elementwise functions (:mod:`refkern.kernels.elementwise`, step 0): for results
of at most 24 bits, exp, exp2, sigmoid, silu and tanh on the arguments where their float64 evaluation needs no
branch, no libm call and no scaling outside float64's normal range, so that LLVM vectorises the loop; the rounding
decided by the two ends of the bound (:func:`_decide`). An element outside that range, or whose bound straddles a
rounding boundary, is marked in ``und`` and goes through the float64 tier (:mod:`refkern.kernels._ew_f64`) and on.

The evaluations and their bounds are the float64 tier's (each derivation there, cited at each kernel); only the
ranges are narrower. Measured (1e6 float32 elements, one thread): exp's float64 tier 9-12 ns per element, this pass
about 4.7 ns."""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import pow2
from refkern.accumulate.formats import round_to
from refkern.kernels._ew_dd import K_LN2
from refkern.kernels._transcendental import U, exp_fast

__all__ = ["VEC"]


@jit(inline="always")
def _decide(y, e, prec, emin, emax):
    """(RN(r), True) when every real r within e of the float64 y rounds alike to the format, else (RN(y - f),
    False): :func:`~refkern.kernels._transcendental.bracket_around`'s enclosure ``f = (e + 2u|y|)(1 + 2u) +
    2**-1073`` of ``[y - e, y + e]``, its ends rounded by the float32 conversion for float32 (IEEE 754's rounding
    to nearest: round_to's result) and by round_to otherwise."""
    f = (e + 2.0 * U * abs(y)) * (1.0 + 2.0 * U) + 2.0**-1073
    if prec == 24 and emin == -126 and emax == 127:
        a = np.float64(np.float32(y - f))
        b = np.float64(np.float32(y + f))
    else:
        a = round_to(y - f, prec, emin, emax)
        b = round_to(y + f, prec, emin, emax)
    return a, a == b and np.signbit(a) == np.signbit(b)


@jit(parallel=True)
def _v_exp(x, prec, emin, emax, out, und):
    """e**x for -104 <= x <= 89: exp_fast's ``v 2**m`` within 2.02u (f_exp), ``-151 <= m <= 129``, so ``2**m`` is
    exact and ``y = v 2**m`` a normal float64 (no rounding). Beyond: e**x rounds to zero or overflows in float32,
    the float64 tier decides it."""
    for i in prange(x.size):
        xi = x[i]
        ok = -104.0 <= xi <= 89.0
        v, m = exp_fast(xi if ok else 0.0)
        y = v * pow2(m)
        r, dec = _decide(y, 2.02 * U * y, prec, emin, emax)
        out[i] = r
        und[i] = not (ok and dec)


@jit(parallel=True)
def _v_exp2(x, prec, emin, emax, out, und):
    """2**x for -151 <= x <= 129: f_exp2's ``v 2**(m + n)`` within ``(2.73 u 1.01 + 2**-1073) v``, ``2**(m + n)``
    exact and the product normal (as in :func:`_v_exp`). An integer x gives a power of two exactly (the bound
    decides it unless it is a tie of the subnormal range: the float64 tier's)."""
    for i in prange(x.size):
        xi = x[i]
        ok = -151.0 <= xi <= 129.0
        xc = xi if ok else 0.0
        n = np.rint(xc)
        v, m = exp_fast((xc - n) * K_LN2[0])
        y = v * pow2(m + np.int64(n))
        r, dec = _decide(y, (2.73 * U * 1.01 + 2.0**-1073) * y, prec, emin, emax)
        out[i] = r
        und[i] = not (ok and dec)


@jit(parallel=True)
def _v_sigmoid(x, times_x, prec, emin, emax, out, und):
    """sigmoid(x) (times x where ``times_x``) for ``0 < |x| <= 100``: ``E = e**-|x| = v 2**m`` (m >= -146: E is
    exact and normal), ``q = 1 / (1 + E)`` (x > 0) or ``E / (1 + E)`` (x < 0), the operations of the float64 tier's
    ``_f_sigmoid`` (the scaling by an exact power of two commutes with the rounding of a normal quotient): within
    4.04u or 6.06u relative, charged 6.06u both; the product by x one u more (1.01u, as f_sigmoid charges: the
    product is normal, |x| >= 2**-149 and q >= e**-100)."""
    for i in prange(x.size):
        xi = x[i]
        ok = 0.0 < abs(xi) <= 100.0
        xc = xi if ok else 1.0
        v, m = exp_fast(-abs(xc))
        E = v * pow2(m)
        q = (1.0 if xc > 0.0 else E) / (1.0 + E)
        rel = 6.06 * U + 2.0**-1073
        if times_x:
            q = q * xc
            rel = rel + 1.01 * U
        r, dec = _decide(q, rel * abs(q), prec, emin, emax)
        out[i] = r
        und[i] = not (ok and dec)


@jit(parallel=True)
def _v_tanh(x, prec, emin, emax, out, und):
    """tanh x for ``1/16 <= |x| <= 40``: f_tanh's ``(1 - E) / (1 + E)``, ``E = e**(-2|x|)`` (v 2**m, m >= -116:
    exact and normal), within ``(2.02 u 2E / ((1 - E)(1 + E)) + 3u) 1.01`` relative; the sign of x after."""
    for i in prange(x.size):
        xi = x[i]
        ax = abs(xi)
        ok = 0.0625 <= ax <= 40.0
        axc = ax if ok else 1.0
        v, m = exp_fast(-2.0 * axc)
        E = v * pow2(m)
        q = (1.0 - E) / (1.0 + E)
        rel = (2.02 * U * 2.0 * E / ((1.0 - E) * (1.0 + E)) + 3.0 * U) * 1.01
        r, dec = _decide(q, rel * q, prec, emin, emax)
        out[i] = r if xi > 0.0 else -r
        und[i] = not (ok and dec)


def _sigmoid(x, *args):
    _v_sigmoid(x, False, *args)


def _silu(x, *args):
    _v_sigmoid(x, True, *args)


#: fn -> its first pass ``(x, prec, emin, emax, out, und)`` (a float64 x, results of at most 24 bits)
VEC = {"exp": _v_exp, "exp2": _v_exp2, "sigmoid": _sigmoid, "silu": _silu, "tanh": _v_tanh}
