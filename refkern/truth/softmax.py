"""Ground truth of softmax, log_softmax and scaled_dot_product_attention: mpmath intervals, rounded once.

Each value is enclosed by mpmath's interval arithmetic (``mpmath.iv``: outward-rounded
operations, exp and log) at a working precision that doubles, from 64 bits, until both ends of
the interval round to the same value of the result format; the rounding is done on Python
integers (:func:`refkern.truth.products.round_exact`). Nothing is shared with the fast path's
numerics: logits and differences are exact ``Fraction`` objects, converted to intervals.

Cases the loop could never decide are found first, exactly. Softmax of equal logits is
``1/c``, a log_softmax with one finite entry is 0, and an attention output is rational when
every group of equal logits has the same mean of the value column (then it is that mean); by
Lindemann-Weierstrass every other value is irrational, so no interval around it shrinks onto a
midpoint forever. Rational values are rounded by the same loop on ``num / den`` (an exact
dyadic gives a point interval).
"""

import math
from fractions import Fraction

import mpmath
import numpy as np

from refkern._arrays import format_of, operand
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format
from refkern.truth.products import round_exact

__all__ = ["softmax", "log_softmax"]

iv = mpmath.iv


def _round_float(x: float, fmt: Format) -> float:
    """A float rounded once to fmt, on integers."""
    if x != x or x in (math.inf, -math.inf) or x == 0:
        return x
    n, d = abs(x).as_integer_ratio()
    return round_exact(x < 0, n, -(d.bit_length() - 1), fmt)


def _convert(values: np.ndarray, src: Format, fmt: Format) -> np.ndarray:
    """torch's ``input.to(dtype)``: float64 to float16/bfloat16 through float32."""
    if fmt.prec >= src.prec:
        return values
    steps = [FLOAT32, fmt] if src is FLOAT64 and fmt.prec < FLOAT32.prec else [fmt]
    flat = [float(v) for v in values.reshape(-1)]
    for f in steps:
        flat = [_round_float(v, f) for v in flat]
    return np.array(flat, np.float64).reshape(values.shape)


def _ivq(q: Fraction):
    """An exact rational as an interval at the current precision (a point when it fits)."""
    return iv.mpf(q.numerator) / iv.mpf(q.denominator)


def _round_ends(x, fmt: Format):
    """The rounding of every real in the interval x when all round alike (signed zeros apart), else None."""
    ends = []
    for t in x._mpi_:
        sign, man, exp, _ = t
        if man == 0 and exp != 0:  # +-inf or nan
            return None
        top = int(exp) + int(man).bit_length() - 1 if man else 0
        if man == 0:
            ends.append(0.0)
        elif top < fmt.emin - fmt.prec - 1:  # below half the smallest subnormal
            ends.append(-0.0 if sign else 0.0)
        elif top > fmt.emax + 1:  # beyond every finite value
            ends.append(-math.inf if sign else math.inf)
        else:
            ends.append(round_exact(bool(sign), int(man), int(exp), fmt))
    a, b = ends
    if a == b and math.copysign(1.0, a) == math.copysign(1.0, b):
        return a
    return None


def _decide(fmt: Format, make, start: int = 64) -> float:
    """Ziv's loop: ``make()`` builds an interval at the current iv precision."""
    prec = start
    saved = iv.prec
    while True:
        try:
            iv.prec = prec
            v = _round_ends(make(), fmt)
        finally:
            iv.prec = saved
        if v is not None:
            return v
        prec *= 2
        if prec > 1 << 20:
            raise RuntimeError("truth: the interval loop did not converge")


def _softmax_row(vals: list, fmt: Format, log: bool, start: int) -> list:
    n = len(vals)
    if any(v != v or v == math.inf for v in vals) or all(v == -math.inf for v in vals):
        return [math.nan] * n
    M = max(v for v in vals if v != -math.inf)
    d = [Fraction(v) - Fraction(M) if v != -math.inf else None for v in vals]
    fin = [q for q in d if q is not None]
    out = []
    for i in range(n):
        if d[i] is None:
            out.append(-math.inf if log else 0.0)
            continue
        if log and len(fin) == 1:
            out.append(0.0)  # log(1) = 0: the only finite entry
            continue
        c = len(fin)
        if not log and all(q == 0 for q in fin):
            out.append(_decide(fmt, lambda c=c: iv.mpf(1) / c, start))  # 1/c, exact when c is 2**k
            continue

        def make(i=i):
            T = iv.mpf(0)  # the terms below the max
            for q in fin:
                if q != 0:
                    T += iv.exp(_ivq(q))
            c0 = sum(1 for q in fin if q == 0)
            if log:
                if c0 == 1 and T.b < iv.mpf(2) ** -iv.prec:  # log(1 + T) in [T / (1 + T), T], tight for tiny T
                    lo = iv.mpf(T.a)
                    L = iv.mpf([(lo / (1 + lo)).a, T.b])
                else:
                    L = iv.log(c0 + T)
                return _ivq(d[i]) - L
            return (iv.exp(_ivq(d[i])) if d[i] != 0 else iv.mpf(1)) / (c0 + T)

        out.append(_decide(fmt, make, start))
    return out


def _softmax(op, input, dim, dtype, log, precision):  # noqa: A002
    o = operand(input, "input", op)
    fmt = o.fmt if dtype is None else format_of(dtype, "dtype", op)
    v = _convert(np.asarray(o.values, np.float64), o.fmt, fmt)
    nd = v.ndim
    span = max(nd, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -span <= dim < span:
        raise IndexError(f"{op}: dim={dim!r} is out of range for a {nd}-d input.")
    axis = int(dim) % span
    moved = np.moveaxis(v.reshape(1) if nd == 0 else v, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, moved.shape[-1])
    out = np.array([_softmax_row(r.tolist(), fmt, log, precision) for r in rows], np.float64).reshape(moved.shape)
    out = np.moveaxis(out, -1, axis)
    if nd == 0:
        out = out.reshape(())
    from refkern.kernels._common import deliver

    return deliver(np.ascontiguousarray(out), fmt, o.torch)


def softmax(input, dim: int, dtype=None, *, precision: int = 64):  # noqa: A002
    """Ground truth of :func:`refkern.softmax`: intervals from ``precision`` bits, doubled until decided."""
    return _softmax("truth.softmax", input, dim, dtype, False, precision)


def log_softmax(input, dim: int, dtype=None, *, precision: int = 64):  # noqa: A002
    """Ground truth of :func:`refkern.log_softmax`."""
    return _softmax("truth.log_softmax", input, dim, dtype, True, precision)
