"""Per-row quantities that the statistical scales of :mod:`refkern.analysis.noise` and
:mod:`refkern.analysis.noise_attention` share: the partial sums' squares of the two summation orders,
the records of a running maximum (an online softmax's rescales), a row's softmax weights, and the
bound on its exponentials."""

import numpy as np

__all__ = ["_partial_sq", "_records", "_weights", "exp_ulps_rows"]


def _partial_sq(X):
    """Per row of ``X`` (R, n): ``max(sum_k P_k**2, sum_k Q_k**2)`` over the n - 1 partial sums that the
    left-to-right (prefix sums P_1 .. P_(n-1), 0-based) and the right-to-left (suffix sums) orders form."""
    R, n = X.shape
    if n < 2:
        return np.zeros(R)
    with np.errstate(all="ignore"):
        P = np.cumsum(X, axis=1)
        left = np.einsum("ij,ij->i", P[:, 1:], P[:, 1:])
        Q = P[:, -1:] - P[:, :-2] if n > 2 else np.zeros((R, 0))  # suffix sums from k = 1 .. n - 2
        right = P[:, -1] ** 2 + np.einsum("ij,ij->i", Q, Q)
    return np.maximum(left, right)


def _records(X):
    """Per row: the number of strict rises of the running maximum, read left to right or right to
    left (the larger), each row's first finite value not counted."""
    with np.errstate(invalid="ignore"):
        Y = np.where(np.isnan(X), -np.inf, X)
        lr = (Y[:, 1:] > np.maximum.accumulate(Y, axis=1)[:, :-1]).sum(axis=1)
        Z = Y[:, ::-1]
        rl = (Z[:, 1:] > np.maximum.accumulate(Z, axis=1)[:, :-1]).sum(axis=1)
    return np.maximum(lr, rl).astype(np.float64)


def _weights(Z):
    """Per row of the logits Z: (the finite row maximum M as a column, z - M, t = exp(z - M), D = sum t,
    the weights t / D), in float64."""
    with np.errstate(all="ignore"):
        M = np.max(np.where(np.isnan(Z), -np.inf, Z), axis=1, initial=-np.inf)
        Mf = np.where(np.isfinite(M), M, 0.0)[:, None]
        arg = Z - Mf
        t = np.exp(arg)
        D = t.sum(axis=1)
        return Mf, arg, t, D, t / D[:, None]


def exp_ulps_rows(arg, t, u):
    """(B, B_row): the bound in ulps of each term's exponential at its argument ``arg = z - M``
    (:func:`~refkern.analysis._envelope_softmax.exp_scale_ulps`), and per row the largest over its live terms
    (``t > 0``): an online softmax's rescale takes the exp of a difference of running maxima, within the row's
    range of live logits, so within that largest |arg| (the bound grows with |x|)."""
    from refkern.analysis._envelope_softmax import exp_scale_ulps

    B = exp_scale_ulps(arg, u)
    live = np.isfinite(arg) & (t > 0)
    return B, np.max(np.where(live, B, 0.0), axis=1, initial=0.0)
