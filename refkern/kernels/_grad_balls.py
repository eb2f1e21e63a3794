"""Ball arithmetic on float64 arrays for the elementwise gradients (:mod:`refkern.kernels.elementwise_grad`,
:mod:`refkern.kernels.math_grad`): a quantity is a pair (value, radius) of arrays, the exact real within
radius of the value. Each float64 operation is charged ``2**-52 |result| + 2**-1074`` (one rounding, underflow
included); a function value from :func:`refkern.kernels.elementwise.values` (within ``2**-95`` relative) is
charged ``2**-90`` relative plus ``2**-1074``, and at an inexact argument its derivative times the radius; the
radii's own roundings are covered by widening the final radius by ``1 + 2**-40``. :func:`decide` rounds
``g f'(x)`` where both ends of its ball round alike."""

import numpy as np

from refkern.accumulate.formats import FLOAT64, round_array
from refkern.kernels import elementwise as ew

__all__ = ["blank", "decide"]

_U, _TINY, _WIDE = 2.0**-52, 2.0**-1074, 1.0 + 2.0**-40


def _r(v):
    return _U * np.abs(v) + _TINY


def _add(a, b):
    v = a[0] + b[0]
    return v, a[1] + b[1] + _r(v)


def _mul(a, b):
    v = a[0] * b[0]
    return v, np.abs(a[0]) * b[1] + np.abs(b[0]) * a[1] + a[1] * b[1] + _r(v)


def _div(a, b):
    """a / b for a ball b away from zero (an inexact b: ``|a/b - a0/b0| <= (a1 + |v| b1) / (|b0| - b1)``);
    an infinite radius where b's ball reaches zero."""
    v = a[0] / b[0]
    den = np.abs(b[0]) - b[1]
    rad = np.where(den > 0, (a[1] + np.abs(v) * b[1]) / np.where(den > 0, den, 1.0), np.inf)
    return v, rad + _r(v)


def _const(c):
    return np.float64(c), np.float64(_U * abs(c))  # a constant rounded to float64


def _fn(fn, arg):
    """fn at the ball ``arg`` (fn increasing or decreasing, with the derivative bounds of the docstring)."""
    hi, lo = ew.values(fn, arg[0], FLOAT64)
    v = np.where(np.isnan(hi), np.nan, hi)  # NaN: the exact path decides these elements
    rad = np.abs(lo) + 2.0**-90 * np.abs(v) + _TINY
    return v, rad + np.abs(v) * np.expm1(arg[1]) * _WIDE  # s(t + d) <= s(t) e**|d|; e**(y + d) likewise


def blank(g, x):
    """(value, radius, rounded, decided, finite): the arrays :func:`values` fills, and where g and x are finite."""
    n = x.size
    return np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n, np.bool_), np.isfinite(x) & np.isfinite(g)


def decide(rest, g, ball, fmt, v, rad, out, done):
    """Step 2's decision at the elements ``rest``: the ball of ``g f'(x)`` from g and the ball (value, radius)
    of f'(x) there, its radius widened for its own roundings; where both ends round alike in fmt, the
    rounding (into v, rad, out and done, in place)."""
    prec, emin, emax = fmt.params
    vv, rr = _mul((g[rest], 0.0), ball)
    rr = rr * _WIDE
    lo = round_array(vv - rr, prec, emin, emax)
    hi = round_array(vv + rr, prec, emin, emax)
    ok = (lo == hi) & (np.signbit(lo) == np.signbit(hi)) & np.isfinite(vv) & np.isfinite(rr)
    v[rest], rad[rest] = vv, np.where(np.isfinite(rr), rr, np.inf)
    out[rest[ok]] = lo[ok]
    done[rest[ok]] = True
