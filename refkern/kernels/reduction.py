"""``refkern.sum``, ``mean``, ``var``, ``std`` and ``cumsum``: torch's reductions, correctly rounded.

Every output element is the real-valued result of the definition on the given inputs, rounded
once to the result dtype (round to nearest, ties to even; subnormals; overflow to inf only
when the real value rounds beyond the largest finite number, so the mean of float64 values
near 1.6e308 is finite). Sums are exact (superaccumulator); a mean, variance or standard
deviation is then evaluated in double-word arithmetic with a rigorous bound and rounded by
:func:`refkern.accumulate.ziv.decide`; the rare undecided elements take the exact rational path.
"""

import builtins
import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import format_of, operand
from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_div, dd_sqrt
from refkern.accumulate.eft import two_sum
from refkern.accumulate.exact import BLOCK, _sum_range
from refkern.accumulate.formats import round_array
from refkern.accumulate.superacc import NNAN, NNINF, NPINF, SIZE, acc_init, acc_round
from refkern.accumulate.ziv import acc_copy, acc_dd, decide, round_fraction, round_quotient_sqrt
from refkern.kernels._common import deliver
from refkern.kernels._moments import OK, exact_moments, moments, new_workspace
from refkern.ops._args import correction as _correction  # the gradients read it here too
from refkern.ops._args import dims as reduced_dims  # re-exported: the analysis reads it here
from refkern.scale._dispatch import dask_in, to_dask

__all__ = ["sum", "mean", "var", "std", "cumsum", "rows_of", "reduced_dims"]


def rows_of(values: np.ndarray, dims: tuple, keepdim: bool):
    """(X, out_shape): the reduced axes moved last and flattened, as a contiguous float64 (R, n)
    array, and the shape torch gives the result."""
    nd = values.ndim
    keep = [a for a in range(nd) if a not in dims]
    moved = np.transpose(values, keep + list(dims)) if nd else values.reshape(())
    lead = tuple(values.shape[a] for a in keep)
    n = int(np.prod([values.shape[a] for a in dims], dtype=np.int64)) if nd else 1
    X = np.ascontiguousarray(moved, dtype=np.float64).reshape(int(np.prod(lead, dtype=np.int64)), n)
    shape = tuple(1 if a in dims else values.shape[a] for a in range(nd)) if keepdim else lead
    return X, shape


def _deliver(out64, fmt, tensor):
    """As :func:`~refkern.kernels._common.deliver`; a 0-d numpy result is a numpy scalar, as numpy's own."""
    out = deliver(out64, fmt, tensor)
    return out if tensor or out.ndim else out[()]


def _input(x, op, dtype):
    """The operand and the result format; ``dtype`` converts the input first, as torch does
    (a narrower dtype rounds each input to nearest even)."""
    o = operand(x, "x", op)
    fmt = o.fmt if dtype is None else format_of(dtype, "dtype", op)
    v = np.asarray(o.values, np.float64)
    if fmt.prec < o.fmt.prec:
        v = round_array(np.ascontiguousarray(v), *fmt.params)
    return o, fmt, v


@jit(inline="always")
def _neg_zero_row(x):
    if x.size == 0:
        return False
    for i in range(x.size):
        if not (x[i] == 0.0 and np.signbit(x[i])):
            return False
    return True


@jit(parallel=True)
def _row_sums(X, prec, emin, emax, out):
    """out[r] = sum of row r exactly, rounded once (-0 only when every term is -0)."""
    for r in prange(X.shape[0]):
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        x = X[r]
        _sum_range(x, 0, x.size, acc, np.empty(BLOCK))
        special = acc[NNAN] + acc[NPINF] + acc[NNINF] > 0
        v = acc_round(acc, prec, emin, emax)
        if v == 0.0 and not special and _neg_zero_row(x):
            v = -0.0
        out[r] = v


@jit(parallel=True)
def _row_means(X, prec, emin, emax, out, undecided):
    """out[r] = RN(S / n); undecided[r] where the fast decision fails (the exact path rounds it)."""
    n = X.shape[1]
    for r in prange(X.shape[0]):
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        tmp = np.empty(SIZE, np.int64)
        x = X[r]
        _sum_range(x, 0, n, acc, np.empty(BLOCK))
        undecided[r] = False
        if acc[NNAN] + acc[NPINF] + acc[NNINF] > 0:
            out[r] = acc_round(acc, prec, emin, emax) / n  # NaN or +-inf, as IEEE division gives
            continue
        s_h, s_l = acc_dd(acc, tmp)
        if s_h == 0.0:
            out[r] = -0.0 if _neg_zero_row(x) else 0.0
            continue
        q_h, q_l = dd_div(s_h, s_l, np.float64(n), 0.0)
        v = decide(q_h, q_l, abs(q_h) * 2.0 * EPS, prec, emin, emax)  # read-out 2**-106 + one division
        out[r] = v
        undecided[r] = v != v


@jit(parallel=True)
def _row_var(X, corr_h, corr_l, want_std, prec, emin, emax, out, status):
    """out[r] = RN(M2 / (n - correction)) (or its square root). status: 0 decided, 1 NaN (a NaN or
    inf in the row), 2 for the exact path (undecided, a zero or negative divisor, extreme row)."""
    n = X.shape[1]
    d_h, d_l = two_sum(np.float64(n), -corr_h)
    d_h, d_l = two_sum(d_h, d_l - corr_l)
    for r in prange(X.shape[0]):
        acc, tmp, scratch, dh, dl = new_workspace(n)
        st, c, _, _, _, m_h, m_l, e_m2, _ = moments(X[r], True, prec, acc, tmp, scratch, dh, dl)
        status[r] = st
        out[r] = np.nan
        if st != OK:
            continue
        if not d_h > 0.0 or m_h <= 0.0:
            status[r] = 2
            continue
        v_h, v_l = dd_div(m_h, m_l, d_h, d_l)
        e_v = e_m2 / d_h * (1.0 + 2.0**-40) + EPS * abs(v_h)
        if want_std:
            if e_v >= 0.25 * v_h:
                status[r] = 2
                continue
            s_h, s_l = dd_sqrt(v_h, v_l)
            e = e_v / s_h + EPS * s_h  # |sqrt(v) - sqrt(v~)| <= |v - v~| / (sqrt(v) + sqrt(v~))
            v_h, v_l = s_h, s_l
        else:
            e = e_v
        y = decide(v_h, v_l, e, prec, emin, emax)
        out[r] = y
        if y != y:
            status[r] = 2


@jit(inline="always")
def cumsum_row(x, acc, tmp, scratch, s, t, bound, neg_zero, prec, emin, emax, out):
    """out[i] = (P + sum_{j <= i} x[j]) exactly, rounded once per element, where ``acc`` holds the
    exact prefix P (none: zero), ``s + t`` is P within ``bound``, and ``neg_zero`` says whether
    every term of P is -0 (true for none). ``acc`` is left holding P plus the terms it took in.

    A running pair decides almost every element: ``s = fl(s + x)`` with its exact error (TwoSum)
    added into ``t``, whose own roundings (each at most ``u |t|``, or ``2**-1074`` near underflow)
    are summed into a bound, so that ``|S_i - (s + t)| <= bound``; :func:`decide` rounds when it
    can. An element it cannot decide (a tie, a zero, a sum beyond its range), and every element
    after an inf, a NaN or an overflow of ``s``, reads the exact accumulator instead: it first
    takes in, exactly, the terms since it was last read. (refkern.scale starts it from the exact
    state of the chunks before a chunk of a Dask array.)"""
    fast = True
    synced = 0  # x[:synced] is in acc
    for i in range(x.size):
        v = x[i]
        neg_zero = neg_zero and v == 0.0 and np.signbit(v)
        y = np.nan
        if fast:
            if (s + v) - (s + v) != 0.0:  # an inf or NaN term or prefix, or s overflows: exact from here on
                fast = False
            else:
                s, e = two_sum(s, v)  # exact: s + e == s_old + v
                t = t + e
                bound += 2.0**-53 * abs(t) + 2.0**-1074  # this rounding of t
                h, lo = two_sum(s, t)
                # 2i roundings of the positive sum bound: a factor (1 + u)**(2i) <= 1 + 4iu
                y = decide(h, lo, bound * (1.0 + (i + 4) * 2.0**-50), prec, emin, emax)
        if y != y:
            _sum_range(x, synced, i + 1, acc, scratch)
            synced = i + 1
            acc_copy(tmp, acc)
            y = acc_round(tmp, prec, emin, emax)
            if y == 0.0 and neg_zero and tmp[NNAN] + tmp[NPINF] + tmp[NNINF] == 0:
                y = -0.0
        out[i] = y


@jit(parallel=True)
def _cumsum_rows(X, prec, emin, emax, out):
    """out[r, i] = sum_{j <= i} X[r, j] exactly, rounded once per element (:func:`cumsum_row` from zero)."""
    for r in prange(X.shape[0]):
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        cumsum_row(X[r], acc, np.empty(SIZE, np.int64), np.empty(BLOCK), 0.0, 0.0, 0.0, True, prec, emin, emax, out[r])


def sum(x, dim=None, keepdim=False, *, dtype=None, accumulate: str = "exact", accum_dtype=None):  # noqa: A001
    """Reference ``torch.sum(x, dim, keepdim, dtype=dtype)``.

    Each output element is the exact sum of its terms rounded once to the result dtype (``dtype``
    if given, which converts the input first as torch does, else the input's): NaN if a term is
    NaN or the terms hold +inf and -inf, -0 only when every term is -0, +0 for an empty sum.
    ``dim``: an int or tuple of ints (negative allowed); None, () or [] reduce every dimension.
    ``accumulate``/``accum_dtype`` choose another summation method (:func:`refkern.dot`) to
    emulate a backend; they apply to every output element.
    """
    if dask_in(x):  # lazy, the same bits for every chunking (refkern.scale.array)
        return to_dask("sum", x, dim, keepdim, dtype=dtype, accumulate=accumulate, accum_dtype=accum_dtype)
    op = "sum"
    o, fmt, v = _input(x, op, dtype)
    dims = reduced_dims(dim, v.ndim, op)
    from refkern.reduce import _reduce

    if len(dims) == v.ndim:  # one sum: the segmented, parallel kernel on the input's own dtype
        flat = o.values.reshape(-1) if fmt.prec >= o.fmt.prec else v.reshape(-1)
        out = np.array(_reduce(op, [flat], fmt, accumulate, accum_dtype, unit=True), np.float64)
        shape = (1,) * v.ndim if keepdim else ()
        return _deliver(out.reshape(shape), fmt, o.torch)
    X, shape = rows_of(v, dims, keepdim)
    if accumulate == "exact" and accum_dtype is None:
        out = np.empty(X.shape[0])
        _row_sums(X, *fmt.params, out)
    else:
        out = np.array([_reduce(op, [X[r]], fmt, accumulate, accum_dtype, unit=True) for r in range(X.shape[0])])
    return _deliver(out.reshape(shape), fmt, o.torch)


def mean(x, dim=None, keepdim=False, *, dtype=None):
    """Reference ``torch.mean(x, dim, keepdim, dtype=dtype)``: the exact sum divided by the number
    of terms, real-valued, rounded once (NaN for an empty reduction, IEEE for NaN/inf terms)."""
    if dask_in(x):
        return to_dask("mean", x, dim, keepdim, dtype=dtype)
    op = "mean"
    o, fmt, v = _input(x, op, dtype)
    dims = reduced_dims(dim, v.ndim, op)
    X, shape = rows_of(v, dims, keepdim)
    out = np.empty(X.shape[0])
    if X.shape[1] == 0:
        out[:] = np.nan
    else:
        und = np.zeros(X.shape[0], np.bool_)
        _row_means(X, *fmt.params, out, und)
        for r in np.flatnonzero(und):
            out[r] = round_fraction(builtins.sum(map(Fraction, X[r].tolist()), Fraction(0)) / X.shape[1], fmt)
    return _deliver(out.reshape(shape), fmt, o.torch)


def _var_std(x, dim, correction, keepdim, op, want_std):
    if dask_in(x):
        return to_dask(op, x, dim, correction=correction, keepdim=keepdim)
    o = operand(x, "x", op)
    fmt = o.fmt
    corr = _correction(correction, op)
    v = np.asarray(o.values, np.float64)
    dims = reduced_dims(dim, v.ndim, op)
    X, shape = rows_of(v, dims, keepdim)
    n = X.shape[1]
    out = np.empty(X.shape[0])
    status = np.zeros(X.shape[0], np.int64)
    if n == 0:
        out[:] = np.nan
    else:
        c_h = float(corr)
        c_l = float(corr - Fraction(c_h))
        _row_var(X, c_h, c_l, want_std, *fmt.params, out, status)
        for r in np.flatnonzero(status == 2):
            out[r] = _exact_var(X[r], corr, fmt, want_std)
    return _deliver(out.reshape(shape), fmt, o.torch)


def _exact_var(x, corr: Fraction, fmt, want_std: bool) -> float:
    """The exact path: M2 / (n - correction) (or its square root) from Fractions; a divisor <= 0
    gives +inf for M2 > 0 and NaN for M2 == 0, as torch."""
    _, m2 = exact_moments(x)
    d = len(x) - corr
    if d <= 0:
        return math.inf if m2 > 0 else math.nan
    val = m2 / d
    if not want_std or val == 0:
        return round_fraction(val, fmt)
    return round_quotient_sqrt(Fraction(0), val, val, fmt)  # sqrt(v) = v / sqrt(v)


def var(x, dim=None, *, correction=1, keepdim=False):
    """Reference ``torch.var(x, dim, correction=correction, keepdim=keepdim)``.

    ``M2 / max(0, n - correction)`` with ``M2 = sum (x_i - mean)^2`` and the exact mean,
    real-valued, rounded once to the input's dtype. ``correction`` is any finite real (a negative
    one divides by more than n) or None, torch's default of 1. M2 is computed from the exact moments
    (:mod:`refkern.kernels._moments`), never by the cancelling ``E[x^2] - E[x]^2``. A NaN or inf
    in the reduced set gives NaN; a divisor <= 0 gives +inf (M2 > 0) or NaN (M2 == 0), as torch.
    """
    return _var_std(x, dim, correction, keepdim, "var", False)


def std(x, dim=None, *, correction=1, keepdim=False):
    """Reference ``torch.std``: the real square root of :func:`var`'s real value, rounded once
    (not the square root of the rounded variance)."""
    return _var_std(x, dim, correction, keepdim, "std", True)


def cumsum(x, dim, *, dtype=None):
    """Reference ``torch.cumsum(x, dim, dtype=dtype)``: every prefix sum exact, rounded once.

    Element i along ``dim`` is the exact sum of elements 0..i, rounded to the result dtype: no
    error carries from one element to the next (a backend that keeps a running float sum drifts
    by up to i units of its precision; this never does)."""
    if dask_in(x):
        return to_dask("cumsum", x, dim, dtype=dtype)
    op = "cumsum"
    if dim is None or not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"cumsum: dim must be an int; got {dim!r}.")
    o, fmt, v = _input(x, op, dtype)
    (axis,) = reduced_dims(dim, v.ndim, op) or (0,)
    if v.ndim == 0:
        return _deliver(np.asarray(v, np.float64).copy(), fmt, o.torch)
    moved = np.ascontiguousarray(np.moveaxis(v, axis, -1), dtype=np.float64)
    X = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, moved.shape[-1])
    out = np.empty_like(X)
    if X.size:
        _cumsum_rows(X, *fmt.params, out)
    return _deliver(np.moveaxis(out.reshape(moved.shape), -1, axis), fmt, o.torch)
