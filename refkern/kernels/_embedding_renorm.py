"""embedding's ``max_norm``: the rows the lookup reads, renormalised as torch's ``embedding_renorm_`` does
(before the lookup, in place in torch; refkern returns the looked-up values and leaves ``weight`` as given).

For each row ``w`` an index reaches, with ``N = ||w||_p`` (``p = norm_type``): if ``N > max_norm`` the row
becomes ``w * max_norm / (N + 1e-7)`` (1e-7 the float64 constant torch adds), else it stays. Each element is
that real number rounded once to weight's dtype.

Exact on integers: ``p = 1`` and ``p = inf`` give a rational N; ``p = 2`` brackets ``N = sqrt(S)`` (S the exact
sum of squares) by integer square roots at W fractional bits; any other ``p > 0`` brackets ``|w_j|**p =
e**(p log|w_j|)`` and ``S**(1/p)`` by :mod:`refkern.kernels._exact_real`'s intervals. The comparison with
max_norm and each element's rounding are decided by those intervals, W doubling from 64 until both ends agree
(a row whose N equals max_norm exactly is found first: p = 1, inf exactly, p = 2 by ``S == max_norm**2``).
"""

import math
from fractions import Fraction

import numpy as np

from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr

__all__ = ["renormed_rows", "check_norm_type"]

_EPS = Fraction(1e-7)
_W_MAX = 1 << 14


def check_norm_type(norm_type, op) -> float:
    p = float(norm_type) if isinstance(norm_type, (int, float, np.integer, np.floating)) and \
        not isinstance(norm_type, bool) else None  # fmt: skip
    if p is None or not p > 0:
        raise ValueError(f"{op}: norm_type must be a positive number (or inf); got norm_type={norm_type!r}.")
    return p


def _frac_interval(lo, hi, W):
    return Fraction(lo, 1 << W), Fraction(hi, 1 << W)


def _norm_interval(row, p, W):
    """(lo, hi) Fractions enclosing ||row||_p; lo == hi where it is exact."""
    a = [abs(Fraction(float(v))) for v in row]
    if p == math.inf:
        m = max(a, default=Fraction(0))
        return m, m
    if p == 1.0:
        s = sum(a, Fraction(0))
        return s, s
    if p == 2.0:
        S = sum((v * v for v in a), Fraction(0))
        num, den = S.numerator, S.denominator  # sqrt(num / den) = sqrt(num den) / den
        r = math.isqrt(num * den << (2 * W))
        lo = Fraction(r, den << W)
        return (lo, lo) if r * r == num * den << (2 * W) else (lo, Fraction(r + 1, den << W))
    # |v|**p = e**(p log|v|), then S**(1/p) = e**(log S / p): monotone, so intervals map to intervals
    pn, pe = xr.dyadic(p)
    S_lo = S_hi = Fraction(0)
    for v in a:
        if v == 0:
            continue
        n, e = xr.dyadic(v)
        l_lo, l_hi, _ = xr.log_interval(n, n, e, W)  # log v in [l_lo, l_hi] 2**-W
        ends = []
        for L in (l_lo, l_hi):
            q = Fraction(L * pn, 1 << W) * Fraction(2) ** pe  # p log v, exactly
            qn, qe = xr.dyadic(Fraction(math.floor(q * (1 << W)), 1 << W) if L == l_lo else
                               Fraction(math.ceil(q * (1 << W)), 1 << W))  # fmt: skip
            lo_, hi_, k = xr.exp_interval(qn, qe, W)
            ends.append((Fraction(lo_) * Fraction(2) ** k, Fraction(hi_) * Fraction(2) ** k))
        S_lo += ends[0][0]
        S_hi += ends[1][1]
    if S_hi == 0:
        return Fraction(0), Fraction(0)
    out = []
    for S, up in ((S_lo, False), (S_hi, True)):
        n, e = xr.dyadic(Fraction(math.ceil(S * (1 << W)) if up else math.floor(S * (1 << W)), 1 << W))
        if n <= 0:
            out.append(Fraction(0))
            continue
        l_lo, l_hi, _ = xr.log_interval(n, n, e, W)
        L = Fraction(l_hi if up else l_lo, 1 << W) / Fraction(p)
        Ln, Le = xr.dyadic(Fraction(math.ceil(L * (1 << W)) if up else math.floor(L * (1 << W)), 1 << W))
        lo_, hi_, k = xr.exp_interval(Ln, Le, W)
        out.append(Fraction(hi_ if up else lo_) * Fraction(2) ** k)
    return out[0], out[1]


def renormed_rows(W, rows, max_norm, p, fmt) -> dict:
    """{row index: its values renormalised and rounded to fmt (float64 array)} for the rows whose norm exceeds
    max_norm; the other rows are unchanged (not in the dict)."""
    m = Fraction(float(max_norm))
    out = {}
    for r in rows:
        row = W[r]
        if not np.isfinite(row).all():  # torch's norm is NaN (the row stays) or inf: inf > max_norm, scale 0
            if not np.isnan(row).any():
                out[r] = row * 0.0  # (an infinite entry times 0: NaN, as torch's in-place product)
            continue
        w = 64
        while True:
            lo, hi = _norm_interval(row, p, w)
            if lo > m or hi <= m:
                break
            if lo == hi == m:
                break
            w *= 2
            if w > _W_MAX:
                raise RuntimeError("embedding: the exact path of max_norm did not converge (a norm equal to max_norm "
                                   "that is not rational); refkern cannot decide it.")  # fmt: skip
        if not lo > m:
            continue
        vals = np.empty(row.size)
        for j, v in enumerate(row):
            fv = Fraction(float(v))
            w2 = w
            while True:
                lo, hi = _norm_interval(row, p, w2)
                a, b = fv * m / (hi + _EPS), fv * m / (lo + _EPS)
                ra, rb = round_fraction(min(a, b), fmt), round_fraction(max(a, b), fmt)
                if ra == rb and math.copysign(1.0, ra) == math.copysign(1.0, rb):
                    vals[j] = ra
                    break
                w2 *= 2
                if w2 > _W_MAX:
                    raise RuntimeError("embedding: the exact path of max_norm did not converge.")
        out[r] = vals
    return out
