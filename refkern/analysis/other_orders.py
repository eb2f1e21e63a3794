"""The other orders a backend may run a GEMM's or a convolution's sums in, run exactly on a sample: the
check behind :func:`refkern.analysis.partials.order_bound` (SIMD lanes across k, their horizontal reduction,
split-K), whose partial sums the block bound of :mod:`refkern.analysis.partials` does not cover element by
element."""

import numpy as np

from refkern._jit import jit

__all__ = ["SPLITS", "other_sq"]

SPLITS = (2, 4, 8)  #: split-K chunk counts the check runs


def other_sq(T, lanes):
    """The largest ``sum_j c_j**2`` of the other orders, per row of products ``T`` (s, K), each exactly (float64,
    far under the float32 units it feeds): the terms' own order (a convolution's ``(c, ky, kx)``) left to right
    and right to left; L lanes summing k = l (mod L) left to right or right to left (the sequence padded with
    zeros to a multiple of L), then the lanes' totals in order or by a pairwise tree (a horizontal reduction);
    and split-K into 2, 4 or 8 contiguous chunks (padded with zeros to a multiple of the count), each left to
    right, then the chunks' results in order. Lane counts and splits of K or more are skipped."""
    T = np.ascontiguousarray(T, np.float64)
    out = np.empty(T.shape[0])
    _other_sq_rows(T, np.asarray(lanes, np.int64), np.asarray(SPLITS, np.int64), out)
    return out


_ROWS = 32  # rows of T that :func:`_other_sq_rows` runs side by side (the vector lanes of every pass)


@jit
def _other_sq_rows(T, lanes, splits, out):
    """:func:`_other_sq`, :data:`_ROWS` rows at a time, one thread (a sample of at most CHECK_SAMPLE rows: a
    parallel launch costs more than it saves, :func:`~refkern.engines.filter.threads_for`). Every partial sum
    is formed in the order the backend would form it, each row's operations in the same order as a row alone
    (so the same values); the rows, copied side by side (``TT[k, r]``, zero columns past the last row), are
    the lanes of each pass's vector loop, where one row's pass waited on each addition (K = 576: 2.4 -> 0.8 ms
    for 256 rows; K = 4608: 19 -> 9 ms)."""
    s, K = T.shape
    most = max(lanes.max() if lanes.size else 1, splits.max() if splits.size else 1)
    acc, sqv, TT = np.empty((most, _ROWS)), np.empty((most, _ROWS)), np.zeros((K, _ROWS))
    for r0 in range(0, s, _ROWS):
        nb = min(_ROWS, s - r0)
        for k0 in range(0, K, 16):  # 16 terms of each row at a time: the block of TT stays in L1
            for r in range(nb):
                for k in range(k0, min(K, k0 + 16)):
                    TT[k, r] = T[r0 + r, k]
        TT[:, nb:] = 0.0
        worst = _other_sq_block(TT, lanes, splits, acc, sqv)
        out[r0 : r0 + nb] = worst[:nb]


@jit
def _other_sq_block(TT, lanes, splits, acc, sqv):
    """The largest sum of squares of the other orders for each column of TT (:func:`_other_sq_rows`); the
    sequence padded with zeros (``+ 0.0``, squares counted again) as a row alone is."""
    K, nr = TT.shape
    p, q, lr, rl = np.zeros(nr), np.zeros(nr), np.zeros(nr), np.zeros(nr)
    for k in range(K):  # the terms' own order, left to right and right to left
        for r in range(nr):
            p[r] += TT[k, r]
            q[r] += TT[K - 1 - k, r]
            lr[r] += p[r] * p[r]
            rl[r] += q[r] * q[r]
    worst = np.empty(nr)
    for r in range(nr):
        worst[r] = max(lr[r], rl[r])
    sq, inorder, c, tree = np.empty(nr), np.empty(nr), np.empty(nr), np.empty(nr)
    for L in lanes:
        if L >= K:
            break
        for d in range(2):  # left to right, right to left
            acc[:L] = 0.0
            sqv[:L] = 0.0
            for k in range(-(-K // L) * L):  # steps of L: K padded with zeros to a multiple of L
                l, kk = k % L, (k if d == 0 else K - 1 - k)
                for r in range(nr):
                    acc[l, r] += TT[kk, r] if k < K else 0.0
                    sqv[l, r] += acc[l, r] * acc[l, r]
            sq[:], inorder[:], c[:], tree[:] = 0.0, 0.0, 0.0, 0.0
            for l in range(L):
                for r in range(nr):
                    sq[r] += sqv[l, r]
                    c[r] += acc[l, r]
                    inorder[r] += c[r] * c[r]
            m = L  # pairwise: L a power of two (LANES), an odd count padded with a zero
            while m > 1:
                h = (m + 1) // 2
                for l in range(h):
                    for r in range(nr):
                        acc[l, r] = acc[2 * l, r] + (acc[2 * l + 1, r] if 2 * l + 1 < m else 0.0)
                        tree[r] += acc[l, r] * acc[l, r]
                m = h
            for r in range(nr):
                worst[r] = max(worst[r], sq[r] + max(tree[r], inorder[r]))
    for cc in splits:
        if cc >= K:
            break
        w = -(-K // cc)  # the chunk length: K padded with zeros to a multiple of cc
        acc[:cc] = 0.0
        sqv[:cc] = 0.0
        for k in range(w):
            for i in range(cc):
                j = i * w + k
                for r in range(nr):
                    acc[i, r] += TT[j, r] if j < K else 0.0
                    sqv[i, r] += acc[i, r] * acc[i, r]
        sq[:], inorder[:], c[:] = 0.0, 0.0, 0.0
        for i in range(cc):
            for r in range(nr):
                sq[r] += sqv[i, r]
                c[r] += acc[i, r]
                inorder[r] += c[r] * c[r]
        for r in range(nr):
            worst[r] = max(worst[r], sq[r] + inorder[r])
    return worst
