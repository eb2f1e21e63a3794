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

__all__ = ["softmax", "log_softmax", "scaled_dot_product_attention"]

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


def _logit(q: list, k: list, m: float, s: float):
    """One logit ``s (q . k) + m`` by the definition: a Fraction, or the float NaN / +-inf that IEEE
    arithmetic on the exact dot product gives (E = 0: the mask alone)."""
    if not q:
        return Fraction(m) if math.isfinite(m) else m
    specials = set()
    tot = Fraction(0)
    for a, b in zip(q, k):
        if math.isfinite(a) and math.isfinite(b):
            tot += Fraction(a) * Fraction(b)
        elif a != a or b != b or a == 0 or b == 0:
            specials.add("nan")
        else:
            specials.add(1 if (a > 0) == (b > 0) else -1)
    if "nan" in specials or specials == {1, -1}:
        return math.nan
    if specials:
        x = s * math.inf * specials.pop()
    elif not math.isfinite(s):
        x = s if tot > 0 else (-s if tot < 0 else s * 0.0)
    elif math.isfinite(m):
        return Fraction(s) * tot + Fraction(m)
    else:
        x = 0.0  # a finite real plus an infinite mask value
    return x + m


def _attention_row(q, K, V, mrow, s, fmt: Format, start: int) -> list:
    S, Ev = V.shape
    z = [_logit(q, K[j].tolist(), float(mrow[j]), s) for j in range(S)]
    if any(isinstance(t, float) and (t != t or t == math.inf) for t in z):
        return [math.nan] * Ev
    fin = [j for j in range(S) if isinstance(z[j], Fraction)]
    cols = V.T.tolist()
    if not fin:  # fully masked: sum_j 0 * v_jc
        return [math.nan if any(not math.isfinite(v) for v in col) else 0.0 for col in cols]
    M = max(z[j] for j in fin)
    d = {j: z[j] - M for j in fin}
    out = []
    for col in cols:
        if any(v != v for v in col) or any(math.isinf(col[j]) for j in range(S) if j not in d):
            out.append(math.nan)
            continue
        infs = {col[j] for j in fin if math.isinf(col[j])}
        if infs:
            out.append(math.nan if len(infs) == 2 else infs.pop())
            continue
        groups = {}
        for j in fin:
            groups.setdefault(d[j], []).append(Fraction(col[j]))
        means = {sum(g, Fraction(0)) / len(g) for g in groups.values()}
        if len(means) == 1:
            r = means.pop()
            out.append(_decide(fmt, lambda r=r: _ivq(r), start))
            continue

        def make(col=col):
            N = iv.mpf(0)
            D = iv.mpf(0)
            for j in fin:
                p = iv.exp(_ivq(d[j])) if d[j] != 0 else iv.mpf(1)
                D += p
                if col[j] != 0:
                    N += p * iv.mpf(col[j])
            return N / D

        out.append(_decide(fmt, make, start))
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, precision: int = 64):  # fmt: skip
    """Ground truth of :func:`refkern.scaled_dot_product_attention`: exact logits (Fractions), then
    mpmath intervals from ``precision`` bits, doubled until each element is decided. The layout
    (broadcasting, GQA, the mask's shape) comes from the kernel's validation; the numbers do not."""
    from refkern.kernels._common import deliver
    from refkern.kernels.attention import attention_operands

    a = attention_operands(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                           op="truth.scaled_dot_product_attention")  # fmt: skip
    B = a.iq.size
    L, S, Ev = a.Q.shape[1], a.K.shape[1], a.V.shape[2]
    out = np.zeros((B, L, Ev))
    for b in range(B):
        for i in range(L):
            if S == 0:
                continue
            if a.causal:
                mrow = [(-math.inf if j > i else 0.0) for j in range(S)]
            elif a.has_mask:
                m = a.mask[a.im[b], i if a.mask.shape[1] > 1 else 0]
                mrow = [float(m[j if m.size > 1 else 0]) for j in range(S)]
            else:
                mrow = [0.0] * S
            out[b, i] = _attention_row(a.Q[a.iq[b], i].tolist(), a.K[a.ik[b]], a.V[a.iv[b]], mrow, a.scale, a.fmt,
                                       precision)  # fmt: skip
    return deliver(out.reshape(a.out_shape), a.fmt, a.tensor)
