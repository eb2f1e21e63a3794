"""The partial sums a correct GEMM forms, bounded per output element: the order term of the rounding
scale of the sums of products (:mod:`refkern.analysis.stats`, :mod:`refkern.analysis.hypotheses`).

A correct kernel's error is ``sum_j c_j delta_j`` with one ``c_j`` per rounding: each product
``t_k = a_k b_k`` and each partial sum the order forms (and the bias's addition). The order-free scale
bounds every partial sum by ``M = sum_k |t_k| + |bias|``, ``sum_j c_j**2 <= (n + 1) M**2``; on terms of
either sign the partial sums are far smaller (about ``sqrt(k)`` terms' worth after ``k`` terms against
``k`` terms' worth), so at K = 4096 float32 terms that scale was 130 times the largest error of sgemm,
split-K and a sequential float32 loop on the same randn inputs, and a bug 128 times that spread in one
element was ``rounding``.

**The orders backends use.** A GEMM micro-kernel (MKL, OpenBLAS, cuBLAS, CUTLASS) keeps one
accumulator per output element and runs through k in order, panel by panel (``kc`` of 128-512); split-K
and stream-K sum contiguous chunks of k and then the chunks' results; a tensor-core MMA sums a few
consecutive k in a tree. Every partial sum of these orders is the sum over a contiguous range of k,
plus, in a tree or a tile, part of at most one block at each end. Over blocks of :data:`BLOCK`
consecutive k with exact block sums ``S_b`` and magnitudes ``A_b = sum_(k in b) |t_k|``, each partial sum
formed inside block ``b`` on a left-to-right (right-to-left) pass is at most ``|P_b| + A_b`` (``|Q_b| +
A_b``) with ``P_b`` the exact prefix before the block (``Q_b`` the suffix after it), so

    sum_j c_j**2 <= BLOCK max(sum_b (|P_b| + A_b + |bias|)**2, sum_b (|Q_b| + A_b + |bias|)**2)
                    + sum_k t_k**2 + M**2

(the bias counted in every partial sum, wherever the kernel adds it; ``M**2`` for its addition). A
contiguous range that does not start at k = 0 (a split-K chunk, a subtree) is a difference of two
prefixes: on data without structure it is no larger than the prefixes themselves, which is the premise
the reductions' scale already states (:mod:`refkern.analysis.noise`): the left-to-right and
right-to-left orders are the noisiest a backend runs there. The bound is taken no larger than the
order-free one (both bound the same sum). The block sums are float64 GEMMs (exact products; their sums
err by ``gamma_K M``, far under ``u M`` for the float32-or-narrower accumulations this is used for:
float64 results keep the order-free scale).

**Where the premise fails.** SIMD lanes across k (a dot product or a GEMV by ``sdot``, a reduction
that strides k over threads) form partial sums over k = l (mod L): on data whose signs repeat with the
lanes' period those grow like k while the contiguous ones stay small (a_k = (-1)**k (1 + 0.1 r_k)).
:func:`lanes_exceed` runs the lane orders exactly (L = 2 to 64 lanes, both directions) on a sample of
elements and, where any exceeds the bound above, the whole output keeps the order-free scale.
"""

import numpy as np

__all__ = ["BLOCK", "LANES", "gemm_partials", "lanes_exceed"]

BLOCK = 32  #: consecutive k per block of the bound (any block size gives a bound; smaller is tighter and costs more)
LANES = (2, 4, 8, 16, 32, 64)  #: the lane counts of the structure check (SIMD widths times unrolling)
LANE_SAMPLE = 256  #: elements whose lane orders are run exactly (the structure of data is shared by rows/columns)
_CHUNK = 1 << 22  # float64 values per temporary of the block GEMMs (32 MiB)


def _blocks(A, Bt, absb_bias, block):
    """BLOCK max(left, right) + sum_k t_k**2 for ``A @ Bt.T`` ((M, K), (N, K) float64), in chunks of rows."""
    M, K = A.shape
    N = Bt.shape[0]
    nb = max(-(-K // block), 1)
    pad = nb * block - K
    Bp = np.pad(Bt, ((0, 0), (0, pad))).reshape(N, nb, block).transpose(1, 2, 0)  # (nb, block, N)
    aBp = np.abs(Bp)
    B2 = (Bt * Bt).T
    out = np.empty((M, N))
    step = max(1, _CHUNK // max(nb * N, 1))
    for r0 in range(0, M, step):
        Ap = np.pad(A[r0 : r0 + step], ((0, 0), (0, pad))).reshape(-1, nb, block).transpose(1, 0, 2)  # (nb, m, block)
        S = np.matmul(Ap, Bp)  # (nb, m, N): the block sums
        Ab = np.matmul(np.abs(Ap), aBp) + absb_bias  # the blocks' magnitudes, the bias in each
        start = np.cumsum(S, axis=0) - S
        end = (start[-1:] + S[-1:]) - start - S
        left = ((np.abs(start) + Ab) ** 2).sum(axis=0)
        right = ((np.abs(end) + Ab) ** 2).sum(axis=0)
        a = A[r0 : r0 + step]
        out[r0 : r0 + step] = block * np.maximum(left, right) + (a * a) @ B2
    return out


def gemm_partials(pr, mag, block: int = BLOCK):
    """``sum_j c_j**2`` per output element of the GEMM Problem ``pr`` (float64 of ``pr.shape``; module
    docstring), at most the order-free ``(n + 1) mag**2``; None where the bound does not apply (not a GEMM,
    or a float64 result)."""
    if pr.kind != "gemm" or pr.fmt.prec > 24:
        return None
    A3, Bt3, ia, ib = pr.ops
    nbat, M, N = ia.size, A3.shape[1], Bt3.shape[1]
    bias = np.zeros(N) if pr.bias is None else np.abs(np.asarray(pr.bias, np.float64))
    out = np.empty((nbat, M, N))
    with np.errstate(all="ignore"):
        for t in range(nbat):
            out[t] = _blocks(np.asarray(A3[ia[t]], np.float64), np.asarray(Bt3[ib[t]], np.float64), bias, block)
        mag = np.asarray(mag, np.float64).reshape(out.shape)
        out += mag * mag
        out = np.minimum(out, (pr.n_terms + 1.0) * mag * mag)
    return np.where(np.isfinite(out), out, (pr.n_terms + 1.0) * mag * mag).reshape(pr.shape)


def _lane_sq(T, lanes):
    """The largest ``sum_j c_j**2`` of the lane orders of each row's products ``T`` (s, K): L lanes each
    summing k = l (mod L) left to right (or right to left), then the lanes' totals summed in order or by a
    pairwise tree (a horizontal reduction), each exactly (float64, far under the float32 units it feeds)."""
    s, K = T.shape
    worst = np.zeros(s)
    for L in lanes:
        if L >= K:
            break
        pad = -K % L
        for seq in (T, T[:, ::-1]):
            P = np.cumsum(np.pad(seq, ((0, 0), (0, pad))).reshape(s, -1, L), axis=1)
            tot = P[:, -1]
            comb = np.maximum(_tree_sq(tot), (np.cumsum(tot, axis=1) ** 2).sum(axis=1))
            worst = np.maximum(worst, (P * P).sum(axis=(1, 2)) + comb)
    return worst


def _tree_sq(v):
    """Per row of ``v``, the sum of squares of the partial sums of a pairwise tree (a horizontal reduction)."""
    total = np.zeros(v.shape[0])
    while v.shape[1] > 1:
        v = np.pad(v, ((0, 0), (0, v.shape[1] % 2))).reshape(v.shape[0], -1, 2).sum(axis=2)
        total += (v * v).sum(axis=1)
    return total


def lanes_exceed(pr, bound, idx, lanes=LANES, at_most: int = LANE_SAMPLE) -> bool:
    """True where the lane orders (module docstring) of any of at most ``at_most`` of the sampled elements
    ``idx`` (flat indices, spread evenly) form partial sums beyond ``bound`` (:func:`gemm_partials`) there:
    the data has the structure the contiguous bound does not cover."""
    idx = np.asarray(idx, np.int64)
    idx = idx[np.linspace(0, idx.size - 1, min(idx.size, at_most)).astype(np.int64)] if idx.size else idx
    if idx.size == 0:
        return False
    L, R, _, _ = pr.terms(idx)
    T = L * R
    with np.errstate(all="ignore"):
        need = _lane_sq(T, lanes) + (T * T).sum(axis=1)
        return bool(np.any(need > np.asarray(bound).reshape(-1)[idx]))
