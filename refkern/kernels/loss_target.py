"""The gradient of binary_cross_entropy with respect to its target (a probability torch differentiates too):

    d/dy [-w (y log p + (1 - y) log(1 - p))] = -w (log p - log(1 - p)) = -w logit(p),

times grad_output ``g`` (over n for a mean), each element that real number rounded once to the result's format.
torch's autograd computes ``-logit(p) g w (/ n)`` (``binary_cross_entropy_target_backward``) without the clamp of
the forward's logs at -100, and so does this gradient: it is the derivative of the loss where the clamp is
inactive, and where p = 0 or 1 the IEEE value of that formula (an infinity, or NaN for g = 0).

Fast path (:func:`_logit_bounded`, jitted): ``log p`` and ``log(1 - p)`` by the loss kernels' rigorous
:func:`~refkern.kernels.loss_binary._log_bounded`, their difference and the products in float64 with a bound,
bracketed to the result's format (:func:`~refkern.kernels.loss._bracketed`). The rest (float64 results, and
elements the bracket leaves undecided): integer intervals of both logs (:mod:`refkern.kernels._exact_real`) at
doubling precision, times the exact rational ``-g w / n``, until both ends round alike. For rational
``p != 1/2`` in (0, 1), ``p / (1 - p)`` is a rational other than 1, whose log is irrational (Lindemann), so the
value is never a rounding boundary and the loop ends; p = 1/2 (a logit of exactly 0), g = 0 and w = 0 give a
zero, signed as torch's formula signs it (its IEEE value)."""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._transcendental import U
from refkern.kernels.loss import _bracketed
from refkern.kernels.loss_binary import _log_bounded

__all__ = ["bce_target_grad", "bce_target_ieee"]

_MAX_BITS = 1 << 15


@jit(parallel=True)
def _logit_bounded(P, L, E):
    """L[i] and E[i] with |logit(P[i]) - L[i]| <= E[i], for 0 < P[i] < 1 (else untouched). ``1 - p`` in float64
    is within u of itself (relative): its log is then within -log(1 - u) <= 1.0000001 u of log(1 - p),
    hence ``1.01 U`` (U = 2**-53); the difference of the two logs is one more rounding, u |L|."""
    for i in prange(P.size):
        p = P[i]
        if p > 0.0 and p < 1.0:
            l1, e1 = _log_bounded(p)
            l2, e2 = _log_bounded(1.0 - p)
            d = l1 - l2
            L[i] = d
            E[i] = e1 + e2 + 1.01 * U + U * abs(d)


def bce_target_ieee(p, y, w, G, n):
    """torch's formula ``-logit(p) g w / n`` evaluated in float64 (the IEEE value where the result is not a
    nonzero finite real: p = 0 or 1, p = 1/2, a zero or non-finite g or w, NaN)."""
    with np.errstate(all="ignore"):
        return -(np.log(p) - np.log1p(-p)) * G * w / n


def _logit_interval(p: Fraction, W: int):
    """(lo, hi) Fractions enclosing log p - log(1 - p), 0 < p < 1, each log within a few units of 2**-W."""
    n1, e1 = xr.dyadic(p)
    n2, e2 = xr.dyadic(1 - p)
    a_lo, a_hi, _ = xr.log_interval(n1, n1, e1, W)
    b_lo, b_hi, _ = xr.log_interval(n2, n2, e2, W)
    return Fraction(a_lo - b_hi, 1 << W), Fraction(a_hi - b_lo, 1 << W)


def _exact_one(p, g, w, n, fmt) -> float:
    """``-g w logit(p) / n`` rounded once (0 < p < 1, p != 1/2, g w finite and nonzero): Ziv's loop."""
    c = -Fraction(float(g)) * Fraction(float(w)) / n
    P = Fraction(float(p))
    W = 96
    while W <= _MAX_BITS:
        lo, hi = _logit_interval(P, W)
        a, b = sorted((c * lo, c * hi))
        ra, rb = round_fraction(a, fmt), round_fraction(b, fmt)
        if ra == rb and math.copysign(1.0, ra) == math.copysign(1.0, rb):
            return ra
        W *= 2
    raise RuntimeError(f"binary_cross_entropy: the target's gradient did not converge within {_MAX_BITS} bits.")


def bce_target_grad(p, y, w, G, fmt, red) -> np.ndarray:
    """The gradient of binary_cross_entropy's target, ``-g w logit(p)`` (over n for a mean), float64 values of
    the input's shape, each the real number rounded once to ``fmt`` (module docstring)."""
    n = max(p.size, 1) if red == "mean" else 1
    shape = p.shape
    P, Gf, Wf = (np.ascontiguousarray(np.broadcast_to(v, shape), np.float64).reshape(-1) for v in (p, G, w))
    out = bce_target_ieee(P, None, Wf, Gf, n)
    c = -Gf * Wf  # exact where g and w have at most 26 bits (float32 and narrower); else within u
    live = (P > 0) & (P < 1) & (P != 0.5) & np.isfinite(c) & (c != 0)
    if not live.any():
        return out.reshape(shape)
    L, E = np.zeros(P.size), np.full(P.size, np.inf)
    _logit_bounded(np.where(live, P, 0.0), L, E)
    with np.errstate(all="ignore"):
        v = c * L / n  # two roundings, and c's own: 3 u |v| (times 1.01)
        Ev = (np.abs(c) * E / n + 3.03 * U * np.abs(v)) * 1.01 + 2.0**-1070
    todo = live.copy()
    if fmt.prec < 53:
        r, ok = _bracketed(v, Ev, fmt)
        done = live & ok
        out[done] = r[done]
        todo &= ~ok
    for i in np.flatnonzero(todo):
        out[i] = _exact_one(P[i], Gf[i], Wf[i], n, fmt)
    return out.reshape(shape)
