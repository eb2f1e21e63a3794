"""Per-row quantities that the statistical scales of :mod:`refkern.analysis.noise` and
:mod:`refkern.analysis.noise_attention` share: the partial sums' squares of the two summation orders,
the records of a running maximum (an online softmax's rescales), a row's softmax weights, and the
bound on its exponentials.

On float64 rows each is one jitted pass per row (a row a thread) instead of a handful of (R, n) numpy
temporaries: the same values, the partial sums formed in the same order (a running sum, as
``np.cumsum``), their squares and the weights' sum added left to right where numpy's reductions add
pairwise (a difference within float64's own rounding of a variance), and exp the C library's (numpy's
is within an ulp of it). Other dtypes keep the numpy form (a float32 array's cumsum stays float32)."""

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["_partial_sq", "_records", "_weights", "exp_ulps_rows"]


def _f64(X) -> bool:
    return isinstance(X, np.ndarray) and X.dtype == np.float64 and X.ndim == 2


def _partial_sq(X):
    """Per row of ``X`` (R, n): ``max(sum_k P_k**2, sum_k Q_k**2)`` over the n - 1 partial sums that the
    left-to-right (prefix sums P_1 .. P_(n-1), 0-based) and the right-to-left (suffix sums) orders form."""
    R, n = X.shape
    if n < 2:
        return np.zeros(R)
    if _f64(X):
        out = np.empty(R)
        _partial_sq_rows(X, out)
        return out
    with np.errstate(all="ignore"):
        P = np.cumsum(X, axis=1)
        left = np.einsum("ij,ij->i", P[:, 1:], P[:, 1:])
        Q = P[:, -1:] - P[:, :-2] if n > 2 else np.zeros((R, 0))  # suffix sums from k = 1 .. n - 2
        right = P[:, -1] ** 2 + np.einsum("ij,ij->i", Q, Q)
    return np.maximum(left, right)


@jit(parallel=True, error_model="numpy")
def _partial_sq_rows(X, out):
    """:func:`_partial_sq` of float64 rows (n >= 2): the running sum once for the total ``P_(n-1)``, then
    again for ``sum_(k >= 1) P_k**2`` and ``P_(n-1)**2 + sum_(k <= n-3) (P_(n-1) - P_k)**2``; NaN as
    ``np.maximum`` gives it."""
    R, n = X.shape
    for i in prange(R):
        tot = 0.0
        for j in range(n):
            tot += X[i, j]
        p, left, right = 0.0, 0.0, tot * tot
        for j in range(n):
            p += X[i, j]
            if j >= 1:
                left += p * p
            if j <= n - 3:
                q = tot - p
                right += q * q
        out[i] = left if (left != left or left >= right) else right


def _records(X):
    """Per row: the number of strict rises of the running maximum, read left to right or right to
    left (the larger), each row's first finite value not counted."""
    if _f64(X):
        out = np.empty(X.shape[0])
        _records_rows(X, out)
        return out
    with np.errstate(invalid="ignore"):
        Y = np.where(np.isnan(X), -np.inf, X)
        lr = (Y[:, 1:] > np.maximum.accumulate(Y, axis=1)[:, :-1]).sum(axis=1)
        Z = Y[:, ::-1]
        rl = (Z[:, 1:] > np.maximum.accumulate(Z, axis=1)[:, :-1]).sum(axis=1)
    return np.maximum(lr, rl).astype(np.float64)


@jit(parallel=True)
def _records_rows(X, out):
    """:func:`_records` of float64 rows (NaN read as -inf)."""
    R, n = X.shape
    for i in prange(R):
        lr, rl = 0, 0
        m = -np.inf
        for j in range(n):
            y = X[i, j]
            y = -np.inf if y != y else y
            if j >= 1 and y > m:
                lr += 1
            m = max(m, y)
        m = -np.inf
        for j in range(n - 1, -1, -1):
            y = X[i, j]
            y = -np.inf if y != y else y
            if j <= n - 2 and y > m:
                rl += 1
            m = max(m, y)
        out[i] = max(lr, rl)


def _weights(Z):
    """Per row of the logits Z: (the finite row maximum M as a column, z - M, t = exp(z - M), D = sum t,
    the weights t / D), in float64."""
    if _f64(Z) and Z.size:
        R, n = Z.shape
        Mf, D = np.empty(R), np.empty(R)
        arg, t, w = np.empty((R, n)), np.empty((R, n)), np.empty((R, n))
        _weights_rows(Z, Mf, arg, t, D, w)
        return Mf[:, None], arg, t, D, w
    with np.errstate(all="ignore"):
        M = np.max(np.where(np.isnan(Z), -np.inf, Z), axis=1, initial=-np.inf)
        Mf = np.where(np.isfinite(M), M, 0.0)[:, None]
        arg = Z - Mf
        t = np.exp(arg)
        D = t.sum(axis=1)
        return Mf, arg, t, D, t / D[:, None]


@jit(parallel=True, error_model="numpy")
def _weights_rows(Z, Mf, arg, t, D, w):
    """:func:`_weights` of float64 rows."""
    R, n = Z.shape
    for i in prange(R):
        M = -np.inf
        for j in range(n):
            z = Z[i, j]
            if z == z and z > M:
                M = z
        M = M if M - M == 0.0 else 0.0
        s = 0.0
        for j in range(n):
            a = Z[i, j] - M
            e = np.exp(a)
            arg[i, j], t[i, j] = a, e
            s += e
        Mf[i], D[i] = M, s
        for j in range(n):
            w[i, j] = t[i, j] / s


def exp_ulps_rows(arg, t, u):
    """(B, B_row): the bound in ulps of each term's exponential at its argument ``arg = z - M``
    (:func:`~refkern.analysis._envelope_softmax.exp_scale_ulps`), and per row the largest over its live terms
    (``t > 0``): an online softmax's rescale takes the exp of a difference of running maxima, within the row's
    range of live logits, so within that largest |arg| (the bound grows with |x|)."""
    from refkern.analysis._envelope_softmax import EXP_SCALE_BINADES, exp_scale_ulps

    if _f64(arg) and _f64(t) and arg.shape == t.shape and u > 2.0**-53:
        B, Brow = np.empty(arg.shape), np.empty(arg.shape[0])
        tops, bs = (np.array(v, np.float64) for v in zip(*EXP_SCALE_BINADES))
        _exp_ulps(arg, t, tops, bs, B, Brow)
        return B, Brow
    B = exp_scale_ulps(arg, u)
    live = np.isfinite(arg) & (t > 0)
    return B, np.max(np.where(live, B, 0.0), axis=1, initial=0.0)


@jit(parallel=True)
def _exp_ulps(arg, t, tops, bs, B, Brow):
    """:func:`exp_ulps_rows` of float64 rows for a float32 working unit: per element the bound of the first
    binade whose top exceeds ``|arg|`` (the last, inf, for NaN), per row the largest over the live terms."""
    R, n = arg.shape
    k = tops.size
    for i in prange(R):
        best = 0.0
        for j in range(n):
            a = abs(arg[i, j])
            b = bs[k - 1]
            for s in range(k - 1):
                if a < tops[s]:
                    b = bs[s]
                    break
            B[i, j] = b
            if a - a == 0.0 and t[i, j] > 0.0:
                best = max(best, b)
        Brow[i] = best
