"""``refkern.softmax`` and ``refkern.log_softmax``: torch's semantics, correctly rounded.

Along ``dim``, with ``M`` the largest finite input and ``d_j = x_j - M`` (exact real numbers):

    softmax_i = e**d_i / S,   log_softmax_i = d_i - log S,   S = sum_j e**d_j,

real-valued (the max subtraction changes nothing mathematically: it is how the value is
evaluated), rounded once to the result dtype (nearest, ties to even, subnormals, +-0, +-inf).
So an entry whose exp underflows float64 still counts as the positive real it is: a float64
softmax of ``[0, -745]`` gives the subnormal ``2**-1074``, and a log_softmax of ``[0, -800]``
gives ``-0.0`` for the first entry (the real value ``-log(1 + e**-800)`` is negative and rounds
to zero), where torch computes ``+0.0``. Specials, as torch: a row holding NaN or +inf, or
only -inf, is NaN throughout; a -inf entry gives 0 (softmax) or -inf (log_softmax); a
log_softmax entry whose real value is below the format's range is -inf (float64 ``[1e308,
-1e308]`` gives ``[0, -inf]``, as torch). An empty ``dim`` gives an empty result; a 0-d input
takes ``dim`` 0 or -1 (softmax 1, log_softmax 0).

``dtype`` converts the input first and is the result dtype, as torch (``input.to(dtype)``):
a widening is exact; a narrowing rounds to nearest even, float64 to float16/bfloat16 going
through float32 (two roundings, as torch's CPU conversion does: ``1 + 2**-11 + 2**-40`` becomes
``1.0`` in float16, not ``1 + 2**-10``).

Method (Ziv's strategy, :mod:`refkern.kernels._transcendental`): for float16/bfloat16/float32
results a float64 pass (bounded exp and log, the sum with its bound) brackets each element and
rounds both ends with :func:`~refkern.accumulate.formats.round_to`; undecided rows, and every
row of a float64 result, go to a double-word pass (relative error ~2**-99 per element, decided
by :func:`~refkern.kernels._transcendental.decide_scaled`); the elements still undecided (exact
ties such as ``1/2``, values within 2**-99 of a midpoint) are decided by integer interval
arithmetic (:mod:`refkern.kernels._exact_real`), which finds the rational results first (equal
logits: ``1/n``; a single finite entry: ``0``) and raises its precision until the rest are
decided. :func:`softmax_rows` reports how many rows and elements took each path.
"""

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import format_of, operand
from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_div
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import FLOAT32, FLOAT64, Format, round_array
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._common import deliver
from refkern.kernels._transcendental import (
    EXP_DD_REL,
    EXP_FAST_REL,
    X_MIN,
    U,
    bracket_around,
    decide_scaled,
    exp_dd,
    exp_fast,
    log_dd,
    log_fast,
)

__all__ = ["softmax", "log_softmax", "softmax_rows", "PathCounts", "convert_input", "exact_row", "exp_terms"]

_TINY = 2.0**-1074  # per-term slack: an underflowed or dropped term is below this


@jit(inline="always")
def exp_terms(x, M, P, eps):
    """The terms of a row's sum ``S = sum_j e**(x_j - M)`` (M its largest finite entry), each within its bound,
    read by the forward's and the backward's (:mod:`refkern.kernels.softmax_backward`) float64 passes. Returns
    ``c0``, the number of entries equal to M (their ``e**0 = 1`` exact: ``P_j = 1``, ``eps_j = 0``); for the
    others ``d = x_j - M`` is known exactly as ``d + de`` (two-sum) and ``P_j = e**d`` (exp_fast) within
    ``eps_j = EXP_FAST_REL + 1.01 |de|`` relative (the argument's error ``|de| <= u |d|`` moves ``e**d`` by at most
    ``1.01 |de|``) plus ``2**-1075`` (ldexp's underflow); a -inf entry, and ``d < X_MIN`` (``e**d < 2**-2885``,
    inside the callers' slack), give ``P_j = eps_j = 0``. So ``eps_j != 0`` marks exactly the exp terms."""
    c0 = 0.0
    for j in range(x.size):
        v = x[j]
        P[j] = 0.0
        eps[j] = 0.0
        if v == -np.inf:
            continue
        d, de = two_sum(v, -M)
        if d == 0.0:  # x == M: e**0 = 1 exactly
            c0 += 1.0
            P[j] = 1.0
            continue
        if d < X_MIN:  # e**d < 2**-2885: left out, inside the slack
            continue
        a, k = exp_fast(d)
        P[j] = math.ldexp(a, k)
        eps[j] = EXP_FAST_REL + 1.01 * abs(de)
    return c0


@jit(parallel=True)
def _fast_rows(X, log, prec, emin, emax, out, status):
    """Float64 pass for formats narrower than float64: out[r, :] decided, or status[r] = 1.

    Per entry ``d = x - M`` is known exactly as ``d + de`` (two-sum); ``P = e**d`` within
    ``EXP_FAST_REL + 1.01 |de|`` (relative) plus ``2**-1075`` (ldexp underflow, or a dropped
    ``e**d < e**-2000``): :func:`exp_terms`. ``T = sum_{d < 0} P`` (its m exp terms) in float64 errs by
    at most ``(m - 1) u T`` more.
    Then ``y = P / (c0 + T)`` (c0 = entries equal to M) or ``y = d + de - log(c0 + T)``
    (:func:`log_fast`), each with its bound, bracketed and rounded at both ends."""
    n = X.shape[1]
    for r in prange(X.shape[0]):
        x = X[r]
        status[r] = 0
        M = -np.inf
        bad = False
        for j in range(n):
            v = x[j]
            if v != v or v == np.inf:
                bad = True
            elif v > M:
                M = v
        if bad or M == -np.inf:  # NaN, +inf, or only -inf: torch gives NaN throughout
            out[r, :] = np.nan
            continue
        P = np.empty(n)
        eps = np.empty(n)
        c0 = exp_terms(x, M, P, eps)
        T = 0.0
        ET = 0.0
        m = 0
        for j in range(n):
            if eps[j] != 0.0:  # an exp term (eps >= EXP_FAST_REL); summed in float64, in order
                T += P[j]
                ET += eps[j] * P[j]
                m += 1
        ET = (ET + max(m - 1, 0) * U * T) * 1.01 + n * _TINY
        S = c0 + T
        ES = ET + U * S  # |fl(c0 + T) - (c0 + T_exact)|
        inv = 1.0 / S  # within u of 1/S: y = P * inv errs by at most 2u more than P / S
        rel = ES / S
        if log:
            L, eL = log_fast(c0, T, ET)
        else:
            L, eL = 0.0, 0.0
        for j in range(n):
            v = x[j]
            if v == -np.inf:
                out[r, j] = -np.inf if log else 0.0
                continue
            if log:
                d, de = two_sum(v, -M)
                y = d - L
                e = (abs(de) + eL + U * abs(y)) * 1.0001
                val, ok = bracket_around(y, e, False, prec, emin, emax)
            else:
                y = P[j] * inv
                e = (y * (eps[j] + rel + 2.0 * U) * 1.02 + 2.0 * _TINY) * 1.0001
                val, ok = bracket_around(y, e, True, prec, emin, emax)  # the real value is positive
            out[r, j] = val
            if not ok:
                status[r] = 1


@jit(parallel=True)
def _dd_rows(X, rows, log, prec, emin, emax, out, undecided):
    """Double-word pass on the rows listed: out[r, j] decided, or undecided[r, j] (for the exact path).

    ``d = x - M`` exact as a double-word; ``P = e**d = (vh + vl) 2**m`` within EXP_DD_REL;
    ``T = sum P`` (``e**d`` for ``d < -2000`` left out; scaling a term to 2**0 may lose 2**-1075
    per word where it underflows; each double-word addition errs by at most EPS of a partial
    sum <= T: additions stay within their bound under underflow);
    ``S = c0 + T`` (one more EPS). softmax: ``P / S`` (one division, EPS); log_softmax:
    ``d - log S`` (:func:`log_dd`, then one addition, EPS)."""
    n = X.shape[1]
    for ii in prange(rows.size):
        r = rows[ii]
        x = X[r]
        M = -np.inf
        bad = False
        for j in range(n):
            v = x[j]
            undecided[r, j] = False
            if v != v or v == np.inf:
                bad = True
            elif v > M:
                M = v
        if bad or M == -np.inf:
            out[r, :] = np.nan
            continue
        vh = np.zeros(n)
        vl = np.zeros(n)
        mm = np.zeros(n, np.int64)
        kind = np.zeros(n, np.int8)  # 0: -inf entry, 1: d == 0, 2: an exp term, 3: negligible (d < -2000)
        c0 = 0.0
        th, tl = 0.0, 0.0
        cnt = 0
        slack = 0.0
        dropped = 0
        for j in range(n):
            v = x[j]
            if v == -np.inf:
                continue
            dh, dl = two_sum(v, -M)
            if dh == 0.0:
                kind[j] = 1
                c0 += 1.0
                continue
            if not dh >= X_MIN:  # also x - M overflowing to -inf
                kind[j] = 3
                dropped += 1
                continue
            a, b, k = exp_dd(dh, dl)
            kind[j] = 2
            vh[j], vl[j], mm[j] = a, b, k
            th, tl = dd_add(th, tl, math.ldexp(a, k), math.ldexp(b, k))  # each ldexp may lose 2**-1075
            slack += 2.0 * _TINY
            cnt += 1
        ET = (EXP_DD_REL + cnt * EPS) * th * 1.01 + slack + dropped * 2.0**-2800
        if not log:
            sh, sl = dd_add_fp(th, tl, c0)
            rel = (ET + EPS * sh) / sh
            for j in range(n):
                kd = kind[j]
                if kd == 0 or kd == 3:
                    out[r, j] = 0.0  # exactly 0, or below e**-2000: rounds to +0 in every format
                    continue
                if kd == 1:
                    qh, ql = dd_div(1.0, 0.0, sh, sl)
                    e = abs(qh) * (rel * 1.01 + EPS) * 1.01
                    k = 0
                else:
                    qh, ql = dd_div(vh[j], vl[j], sh, sl)
                    e = abs(qh) * (EXP_DD_REL + rel * 1.01 + EPS) * 1.01
                    k = mm[j]
                val, ok = decide_scaled(qh, ql, e, k, prec, emin, emax)
                out[r, j] = val
                undecided[r, j] = not ok
        else:
            lh, ll, eL = log_dd(c0, th, tl, ET)
            for j in range(n):
                if kind[j] == 0:
                    out[r, j] = -np.inf
                    continue
                dh, dl = two_sum(x[j], -M)
                if dh == -np.inf:  # x - M below -2**1024: so is the result
                    out[r, j] = -np.inf
                    continue
                if dh == 0.0 and lh == 0.0:  # y = -log(1 + T), every term of T underflowed (or none)
                    if cnt + dropped == 0:
                        out[r, j] = 0.0  # the only finite entry: log 1 = 0
                    elif cnt == 0 or prec < 53:
                        out[r, j] = -0.0  # 0 < T < (cnt + dropped) 2**-1075: -T rounds to -0
                    else:
                        out[r, j] = np.nan
                        undecided[r, j] = True
                    continue
                yh, yl = dd_add(dh, dl, -lh, -ll)
                e = (eL + EPS * abs(yh)) * 1.01
                val, ok = decide_scaled(yh, yl, e, 0, prec, emin, emax)
                out[r, j] = val
                undecided[r, j] = not ok


def exact_row(x, idx, fmt: Format, log: bool) -> dict:
    """The exact path for one row (no NaN or +inf, at least one finite entry): {j: RN(y_j)} for j in idx.

    Equal finite logits give the rationals ``1/c`` (softmax) and ``0`` (log_softmax of a single
    finite entry), rounded exactly; every other value is irrational (Lindemann-Weierstrass:
    ``sum_k w_k e**(a_k)`` with distinct rational ``a_k`` and nonzero rational ``w_k`` is never
    rational, nor ``log`` of such a sum unless it is 1), so it is no midpoint, and the interval
    loop, doubling its precision, terminates."""
    vals = [float(v) for v in x]
    fin = [v for v in vals if v != -math.inf]
    M = max(fin)
    d = {j: xr.dyadic(Fraction(v) - Fraction(M)) for j, v in enumerate(vals) if v != -math.inf}
    c0 = sum(1 for nd in d.values() if nd[0] == 0)
    others = [nd for nd in d.values() if nd[0] != 0]
    res = {}
    todo = []
    for j in idx:
        if j not in d:
            res[j] = -math.inf if log else 0.0
        elif not others:
            res[j] = (0.0 if c0 == 1 else None) if log else round_fraction(Fraction(1, c0), fmt)
            if res[j] is None:
                todo.append(j)
        else:
            todo.append(j)
    if not todo:
        return res
    P = 64
    nb = len(vals).bit_length()
    top = max((xr.approx(*nd) for nd in others), default=-math.inf)  # the largest d < 0
    extra = 0
    if log and c0 == 1 and others:
        if top < -45000.0:  # L = log(1 + T) < 2**-65000: y is d minus a positive amount far below every ulp
            F = 2000
            for j in todo:
                n, e = d[j]
                y = xr._floor_scaled(n, e, F) - 1  # d - 2**-F: rounds as every point of (d - L, d) does
                res[j] = xr.round_dyadic(y, -F, *fmt.params)
            return res
        extra = max(0, math.ceil(-top * 1.4427)) + 4
    while todo:
        W = P + 16 + nb + extra
        terms = []
        for n, e in others:
            if xr.approx(n, e) < -(W + 8) * 0.6931:  # e**d < 2**-(W+8): at most one unit
                terms.append((0, 1, -W))
            else:
                terms.append(xr.exp_interval(n, e, W))
        t_lo, t_hi = xr.add_intervals(terms, -W)
        s_lo, s_hi = (c0 << W) + t_lo, (c0 << W) + t_hi
        if log:
            l_lo, l_hi, sl = xr.log_interval(s_lo, s_hi, -W, W)
        left = []
        for j in todo:
            n, e = d[j]
            if log:
                y_lo = xr._floor_scaled(n, e, -sl) - l_hi
                y_hi = xr._ceil_scaled(n, e, -sl) - l_lo
                v = xr.round_interval(y_lo, y_hi, sl, *fmt.params)
            elif xr.approx(n, e) < -1300.0:
                v = 0.0  # e**d < 2**-1875 and S >= 1
            else:
                a, b, k = xr.exp_interval(n, e, P + 16)
                F = P + 16 + max(0, s_hi.bit_length() - a.bit_length())  # the quotient keeps P + 16 bits
                v = xr.round_interval((a << F) // s_hi, -(-(b << F) // s_lo), k + W - F, *fmt.params)
            if v is None:
                left.append(j)
            else:
                res[j] = v
        todo = left
        P *= 2
        if P > 1 << 22:
            raise RuntimeError("softmax: the exact path did not converge (a bug: please report the input)")
    return res


@dataclass
class PathCounts:
    """How many rows and elements each path decided (for tests and benchmarks)."""

    rows: int = 0
    elements: int = 0
    fast_rows: int = 0  #: rows decided entirely by the float64 pass
    dd_rows: int = 0  #: rows that went through the double-word pass
    exact_elements: int = 0  #: elements decided by the exact integer path
    exact_where: list = field(default_factory=list)  #: (row, column) of those elements


def softmax_rows(X: np.ndarray, fmt: Format, log: bool, force: str | None = None):
    """softmax (or log_softmax) of every row of the float64 (R, n) array X, whose values must lie
    in ``fmt``, rounded to ``fmt``: (out, PathCounts). ``force`` = "dd" skips the float64 pass,
    "exact" sends every element of every finite row to the exact path."""
    R, n = X.shape
    out = np.empty((R, n))
    counts = PathCounts(rows=R, elements=R * n)
    if R == 0 or n == 0:
        return out, counts
    if force == "exact":
        und = np.zeros((R, n), np.bool_)
        for r in range(R):
            if _nan_row(X[r]):
                out[r] = np.nan
            else:
                und[r] = True
    else:
        if fmt.prec < 53 and force is None:
            status = np.zeros(R, np.int64)
            _fast_rows(X, log, *fmt.params, out, status)
            todo = np.flatnonzero(status).astype(np.int64)
        else:
            todo = np.arange(R, dtype=np.int64)
        counts.fast_rows = R - todo.size
        counts.dd_rows = todo.size
        und = np.zeros((R, n), np.bool_)
        if todo.size:
            _dd_rows(X, todo, log, *fmt.params, out, und)
    for r in np.flatnonzero(und.any(axis=1)):
        idx = np.flatnonzero(und[r]).tolist()
        for j, v in exact_row(X[r], idx, fmt, log).items():
            out[r, j] = v
        counts.exact_elements += len(idx)
        counts.exact_where.extend((int(r), j) for j in idx)
    return out, counts


def _nan_row(x) -> bool:
    """Whether torch gives NaN throughout: a NaN or +inf entry, or no finite entry."""
    return bool(np.isnan(x).any() or (x == np.inf).any() or not (x > -np.inf).any())


def convert_input(x, op: str, dtype):
    """(operand, result format, values as float64): ``dtype`` converts the input first, as torch's
    ``input.to(dtype)`` on the CPU: exact widening; narrowing to nearest even, float64 to float16 or
    bfloat16 through float32."""
    o = operand(x, "input", op)
    fmt = o.fmt if dtype is None else format_of(dtype, "dtype", op)
    v = np.empty(np.shape(o.values))
    np.copyto(v, o.values)  # exact widening (measured 20x faster than np.asarray(values, np.float64) here)
    if fmt.prec < o.fmt.prec:
        v = np.ascontiguousarray(v)
        if o.fmt is FLOAT64 and fmt.prec < FLOAT32.prec:
            v = round_array(v, *FLOAT32.params)
        v = round_array(v, *fmt.params)
    return o, fmt, v


def _axis(dim, ndim: int, op: str) -> int:
    if dim is None:
        raise TypeError(
            f"{op}: dim must be an int; got None. torch's implicit choice of dim is deprecated: pass dim=-1 for the "
            "last dimension."
        )
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{op}: dim must be an int; got {dim!r}.")
    span = max(ndim, 1)
    if not -span <= dim < span:
        raise IndexError(f"{op}: dim={dim} is out of range for a {ndim}-d input (expected {-span}..{span - 1}).")
    return int(dim) % span


def _run(op, input, dim, dtype, log):  # noqa: A002
    o, fmt, v = convert_input(input, op, dtype)
    axis = _axis(dim, v.ndim, op)
    if v.ndim == 0:
        out, _ = softmax_rows(v.reshape(1, 1), fmt, log)
        return deliver(out.reshape(()), fmt, o.torch)
    moved = np.ascontiguousarray(np.moveaxis(v, axis, -1))
    X = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, moved.shape[-1])
    out, _ = softmax_rows(X, fmt, log)
    return deliver(np.moveaxis(out.reshape(moved.shape), -1, axis), fmt, o.torch)


def softmax(input, dim: int, dtype=None):  # noqa: A002
    """Reference ``torch.softmax(input, dim, dtype=dtype)`` (and ``F.softmax``, ``nn.Softmax``).

    Each element is ``e**(x_i - M) / sum_j e**(x_j - M)`` along ``dim`` (M the row's largest finite
    value), computed as a real number and rounded once to the result dtype (``dtype`` if given,
    which converts the input first as torch does, else the input's): correctly rounded, ties to
    even, subnormal results included (an exp below float64's range is still a positive real).
    NaN or +inf in a row, or a row of only -inf, gives NaN throughout; -inf entries give 0.
    ``input``: a numpy array or torch tensor (float16, bfloat16, float32, float64); the result is
    of the same kind. The module docstring states the method and the bounds.
    """
    return _run("softmax", input, dim, dtype, False)


def log_softmax(input, dim: int, dtype=None):  # noqa: A002
    """Reference ``torch.log_softmax(input, dim, dtype=dtype)`` (``F.log_softmax``, ``nn.LogSoftmax``).

    Each element is ``(x_i - M) - log(sum_j e**(x_j - M))`` along ``dim``, real-valued, rounded
    once to the result dtype: so a row with one dominant entry gives it ``-0.0`` when the real
    value is a negative number below the smallest subnormal (torch computes ``+0.0``), and an
    entry far below the rest gives its exact difference, -inf only when that leaves the format's
    range. NaN or +inf in a row, or a row of only -inf, gives NaN; -inf entries give -inf.
    """
    return _run("log_softmax", input, dim, dtype, True)
