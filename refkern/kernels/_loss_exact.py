"""The exact path of the losses (:mod:`refkern.kernels.loss`): rationals and integer intervals.

A row of cross_entropy is ``A_r L_r + B_r`` with ``A_r = sum_c a_rc`` and ``B_r = sum_c a_rc (M_r -
x_rc)`` exact rationals (every coefficient is a product of floats, ``1 - eps`` and ``eps / C``) and ``L_r =
log sum_c e**(x_rc - M_r)`` enclosed in ``[lo, hi] 2**-W`` by :mod:`refkern.kernels._exact_real`
(each exp by its series, the sum, the log; a term below ``2**-(W + 8)`` counted as ``[0, 2**-W]``). A
result's interval is rounded at both ends by :func:`~refkern.accumulate.ziv.round_fraction`; W doubles
from 96 until they agree. No floating point enters: the float inputs are read as exact integer ratios.
"""

import math
from fractions import Fraction

import numpy as np

from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr

__all__ = ["rows_exact", "reduced_exact", "nll_exact", "exact_sum", "exact_dot"]

_W0 = 96
_W_MAX = 1 << 15


def _ratio(v: float):
    """(n, k): v == n / 2**k (a finite float)."""
    n, d = float(v).as_integer_ratio()
    return n, d.bit_length() - 1


def exact_sum(values) -> Fraction:
    """The exact sum of finite floats, on integers (a common power-of-two denominator)."""
    parts = [_ratio(v) for v in values]
    if not parts:
        return Fraction(0)
    k = max(p[1] for p in parts)
    return Fraction(sum(n << (k - e) for n, e in parts), 1 << k)


def exact_dot(a, b) -> Fraction:
    """The exact sum of ``a_i b_i`` for finite floats."""
    parts = [(na * nb, ea + eb) for (na, ea), (nb, eb) in zip(map(_ratio, a), map(_ratio, b))]
    if not parts:
        return Fraction(0)
    k = max(p[1] for p in parts)
    return Fraction(sum(n << (k - e) for n, e in parts), 1 << k)


def _row_ab(c, r, M):
    """(A_r, B_r) of row r as exact rationals (module docstring); (0, 0) for an ignored row."""
    eps = Fraction(c.label_smoothing)
    C = c.C
    x = c.X[r]
    m = Fraction(float(M))
    w = np.ones(C) if c.weight is None else c.weight
    if c.probs is not None:  # a_c = w_c (P_c (1 - eps) + eps / C)
        wp = exact_dot(w, c.probs[r])
        wpx = sum((Fraction(float(wc)) * Fraction(float(pc)) * Fraction(float(xc)) for wc, pc, xc in
                   zip(w, c.probs[r], x) if pc != 0 and wc != 0), Fraction(0))  # fmt: skip
        ws, wx = exact_sum(w), exact_dot(w, x)
        A = (1 - eps) * wp + eps / C * ws
        B = (1 - eps) * (m * wp - wpx) + eps / C * (m * ws - wx)
        return A, B
    t = int(c.target[r])
    if t == c.ignore_index:
        return Fraction(0), Fraction(0)
    p = (1 - eps) * Fraction(float(w[t]))
    A, B = p, p * (m - Fraction(float(x[t])))
    if eps:
        ws, wx = exact_sum(w), exact_dot(w, x)
        A += eps / C * ws
        B += eps / C * (m * ws - wx)
    return A, B


class _Lse:
    """L_r = log sum_c e**(x_rc - M_r) of one row as integer intervals at any precision."""

    def __init__(self, x, M):
        m = Fraction(float(M))
        d = [xr.dyadic(Fraction(float(v)) - m) for v in x if v != -math.inf]
        self.c0 = sum(1 for n, _ in d if n == 0)
        self.others = [nd for nd in d if nd[0] != 0]
        self.exact = self.c0 == 1 and not self.others  # one finite logit: L = log 1 = 0

    def interval(self, W):
        """(lo, hi): lo 2**-W <= L <= hi 2**-W."""
        if self.exact:
            return 0, 0
        terms = [(0, 1, -W) if xr.approx(n, e) < -(W + 8) * 0.6931 else xr.exp_interval(n, e, W)
                 for n, e in self.others]  # fmt: skip
        t_lo, t_hi = xr.add_intervals(terms, -W)
        lo, hi, _ = xr.log_interval((self.c0 << W) + t_lo, (self.c0 << W) + t_hi, -W, W)
        return lo, hi


def _span(A, B, lse, W):
    """(lo, hi) Fractions enclosing A L + B."""
    if A == 0 or lse.exact:
        v = B
        return v, v
    lo, hi = lse.interval(W)
    a, b = A * Fraction(lo, 1 << W), A * Fraction(hi, 1 << W)
    return B + min(a, b), B + max(a, b)


def _decide(lo, hi, fmt):
    a, b = round_fraction(lo, fmt), round_fraction(hi, fmt)
    if a == b and math.copysign(1.0, a) == math.copysign(1.0, b):
        return a
    return None


def _refused(op):
    return RuntimeError(f"{op}: the exact path did not converge within {_W_MAX} bits: the result is a rounding "
                        "midpoint or a cancellation of log terms (class weights of both signs); refkern cannot "
                        "decide it.")  # fmt: skip


def rows_exact(c, todo, M, fmt) -> np.ndarray:
    """The correctly rounded values of rows ``todo`` (reduction "none")."""
    out = np.empty(len(todo))
    for i, r in enumerate(todo):
        A, B = _row_ab(c, r, M[r])
        lse = _Lse(c.X[r], M[r])
        W = _W0
        while True:
            v = _decide(*_span(A, B, lse, W), fmt)
            if v is not None:
                out[i] = v
                break
            W *= 2
            if W > _W_MAX:
                raise _refused(c.op)
    return out


def _divide(lo, hi, D):
    if D > 0:
        return lo / D, hi / D
    return hi / D, lo / D


def reduced_exact(c, M, fmt) -> float:
    """The correctly rounded sum or mean of every row (no special row)."""
    rows = np.flatnonzero(c.valid)
    ab = [_row_ab(c, r, M[r]) for r in rows]
    lses = [_Lse(c.X[r], M[r]) for r in rows]
    D = None
    if c.reduction == "mean":
        if c.target is None:
            D = Fraction(c.raw.shape[0])
        else:
            w = np.ones(c.C) if c.weight is None else c.weight
            D = exact_sum(w[c.target[rows]])
    W = _W0
    while True:
        lo = hi = Fraction(0)
        for (A, B), lse in zip(ab, lses):
            a, b = _span(A, B, lse, W)
            lo, hi = lo + a, hi + b
        if D == 0:  # num / 0: NaN for a zero numerator, else an infinity of its sign
            if lo == hi == 0:
                return math.nan
            if lo > 0 or hi < 0:
                return math.copysign(math.inf, lo if lo != 0 else hi)
        else:
            v = _decide(*(_divide(lo, hi, D) if D is not None else (lo, hi)), fmt)
            if v is not None:
                return v
        W *= 2
        if W > _W_MAX:
            raise _refused(c.op)


def _dot_fraction(a, b) -> Fraction:
    """The exact ``sum a_i b_i`` of finite floats: peeled into float64 pieces, each the correctly rounded rest
    (:func:`refkern.accumulate.exact.exact_dot`, jitted) until the rest is 0; the Python integers where a piece
    would overflow."""
    from refkern.accumulate.exact import exact_dot as dot
    from refkern.accumulate.formats import FLOAT64

    A, B = np.ascontiguousarray(a, np.float64), np.ascontiguousarray(b, np.float64)
    pieces = []
    for _ in range(64):
        r = float(dot(A, B, FLOAT64))
        if r == 0.0:
            return sum((Fraction(p) for p in pieces), Fraction(0))
        if not math.isfinite(r):
            break
        pieces.append(r)
        A, B = np.append(A, r), np.append(B, -1.0)
    return exact_dot(a, b)


def nll_exact(c, wt, xt) -> float:
    """nll_loss's sum or mean of ``-w_t x_t`` over the counted rows, exact, rounded once."""
    num = -_dot_fraction(wt, xt)
    if c.reduction == "sum":
        return round_fraction(num, c.fmt)
    D = Fraction(int(wt.size)) if c.weight is None else _dot_fraction(wt, np.ones(wt.size))
    if D == 0:
        return math.nan if num == 0 else math.copysign(math.inf, num)
    return round_fraction(num / D, c.fmt)
