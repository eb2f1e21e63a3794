"""Units in the last place.

``ulp(x, fmt)`` is the spacing of ``fmt`` at ``x``: ``2**(max(e, emin) - prec + 1)`` with
``e = floor(log2|x|)``, so subnormals share the spacing ``2**(emin - prec + 1)``. The error
of an approximation in ulps is measured against the *exact* (correctly rounded) value:
``(approx - exact) / ulp(exact)``. Both are values of one binary format, so the
difference is exact in float64 for every format narrower than float64 (and for float64
operands within a factor of two of each other, by Sterbenz's lemma).
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import Format
from refkern.analysis.passes import chunks, floor_log2, scale_down
from refkern.engines.filter import threads_for

__all__ = ["ulp", "ulp_error", "ulp_errors", "max_ulp_error"]


def ulp(x: float, fmt: Format) -> float:
    """The spacing of ``fmt`` at ``x`` (at 0: the smallest subnormal)."""
    if not math.isfinite(x):
        return math.nan
    e = math.frexp(x)[1] - 1 if x != 0 else fmt.emin
    return math.ldexp(1.0, max(e, fmt.emin) - fmt.prec + 1)


def ulp_error(approx: float, exact: float, fmt: Format) -> float:
    """Signed error of ``approx`` in ulps of ``fmt`` at ``exact`` (0 when both are the same
    infinity or both NaN; inf when only one of them is finite)."""
    approx, exact = float(approx), float(exact)
    if math.isnan(approx) or math.isnan(exact):
        return 0.0 if math.isnan(approx) and math.isnan(exact) else math.inf
    if math.isinf(approx) or math.isinf(exact):
        return 0.0 if approx == exact else math.copysign(math.inf, approx - exact)
    return (approx - exact) / ulp(exact, fmt)


@jit
def _ulp_one(x, y, ybits, prec, emin):
    """|x - y| in ulps of the format (prec, emin) at y (float64 bits ``ybits``): 0 for equal specials,
    inf for one special. At 0 (and a float64 subnormal) the ulp is the smallest subnormal's."""
    if x == y or (x != x and y != y):
        return 0.0
    if x != x or y != y or x - x != 0.0 or y - y != 0.0:
        return np.inf  # one special and not the other, or two different ones
    e = floor_log2(ybits) if y != 0.0 else emin
    return scale_down(abs(x - y), max(e, emin) - prec + 1)


@jit(parallel=True)
def _ulp_errors(a, r, prec, emin, out):
    rb = r.view(np.int64)
    for i in prange(a.size):
        out[i] = _ulp_one(a[i], r[i], rb[i], prec, emin)


@jit(parallel=True)
def _ulp_max(a, r, prec, emin, nch):
    """The largest :func:`_ulp_one`, per chunk of :func:`~refkern.analysis.passes.chunks` then merged."""
    n = a.size
    rb = r.view(np.int64)
    part = np.zeros(nch)
    for c in prange(nch):
        m = 0.0
        for i in range(c * n // nch, (c + 1) * n // nch):
            v = _ulp_one(a[i], r[i], rb[i], prec, emin)
            if v > m:
                m = v
        part[c] = m
    return part.max()


def _flat(v):
    return np.ascontiguousarray(v, np.float64).reshape(-1)


def ulp_errors(actual, ref, fmt: Format) -> np.ndarray:
    """|actual - ref| in ulps of ``fmt`` at the correctly rounded ``ref``, elementwise (0 for equal
    specials, inf where only one is finite or the two differ)."""
    a, r = _flat(actual), _flat(ref)
    out = np.empty(a.size)
    with threads_for(a.size):  # a few ns per element: one thread below PARALLEL_TERMS elements (an audit's 43
        # calls of at most 0.8M elements: 0.30 s on two threads, each launch waiting for both under load)
        _ulp_errors(a, r, fmt.prec, fmt.emin, out)
    return out.reshape(np.shape(ref))


def max_ulp_error(actual, ref, fmt: Format) -> float:
    """The largest of :func:`ulp_errors`, without the array (0 for no elements)."""
    a, r = _flat(actual), _flat(ref)
    if not a.size:
        return 0.0
    with threads_for(a.size):  # as ulp_errors (chunks() then counts the threads inside: the same maximum)
        return float(_ulp_max(a, r, fmt.prec, fmt.emin, chunks(a.size)))
