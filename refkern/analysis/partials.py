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
plus, in a tree or a tile, part of at most one block at each end. Over blocks of ``B`` consecutive k
(:func:`block_size`) with exact block sums ``S_b`` and magnitudes ``A_b = sum_(k in b) |t_k|``, each partial sum
formed inside block ``b`` on a left-to-right (right-to-left) pass is at most ``|P_b| + A_b`` (``|Q_b| +
A_b``) with ``P_b`` the exact prefix before the block (``Q_b`` the suffix after it), so

    sum_j c_j**2 <= B max(sum_b (|P_b| + A_b + |bias|)**2, sum_b (|Q_b| + A_b + |bias|)**2)
                    + sum_k t_k**2 + M**2

(the bias counted in every partial sum, wherever the kernel adds it; ``M**2`` for its addition). A
contiguous range that does not start at k = 0 (a split-K chunk, a subtree) is a difference of two
prefixes: on data without structure it is no larger than the prefixes themselves, which is the premise
the reductions' scale already states (:mod:`refkern.analysis.noise`): the left-to-right and
right-to-left orders are the noisiest a backend runs there. The bound is taken no larger than the
order-free one (both bound the same sum). The block sums are float64 GEMMs (exact products; their sums
err by ``gamma_K M``, far under ``u M`` for the float32-or-narrower accumulations this is used for:
float64 results keep the order-free scale).

**Convolutions** run through k = (input channel, tap) in one of three orders: tap-major (channels-last
layouts, a direct convolution: ``(ky, kx, c)``), channel-blocked (oneDNN's nChw16c kernels: ``(c_outer, ky,
kx, c_inner)`` with SIMD blocks of channels) and channel-major (im2col's ``(c, ky, kx)``, cuDNN's NCHW
implicit GEMM). Per image and conv group, the cells of the bound are ``B`` input channels at one tap (a
GEMM each); taken tap by tap they are the blocks of the tap-major order, block of channels by block of
channels those of the channel-blocked order, and the larger of the two bounds is used. The channel-major
order's blocks would be single channels with their taps (one GEMM per channel and tap: 300 s for a
ResNet layer under load), so it is among the orders checked on a sample instead. conv3d (its depth
folded into the kernel's images), the transposed convolutions (and the gradients judged as one) and
float64 results keep the order-free scale.

**The other orders, checked.** SIMD lanes across k (a dot product or a GEMV by ``sdot``, cuBLAS's
sliced-K, a reduction that strides k over threads) form partial sums over k = l (mod L), and split-K's
later chunks start from 0: on data without structure their partial sums are no larger than the
contiguous ones in distribution, but element by element either can exceed the bound (a conv2d of 288
randn terms: 0.4% of the elements, by up to 1.6x), and on data whose signs repeat with the lanes' period
they grow like k while the contiguous ones stay small (a_k = (-1)**k (1 + 0.1 r_k): 65x). :func:`order_bound`
runs those orders exactly on a sample and either scales the bound to cover them there or, where they
exceed it systematically, keeps the order-free scale for the whole output.
"""

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = [
    "BLOCK_MIN",
    "BLOCK_MAX",
    "LANES",
    "SPLITS",
    "CHECK_SAMPLE",
    "block_partials",
    "block_size",
    "gemm_partials",
    "order_bound",
]

BLOCK_MIN, BLOCK_MAX = 4, 32  #: the range of :func:`block_size` (any block size gives a bound)
LANES = (2, 4, 8, 16, 32, 64)  #: the lane counts of the structure check (SIMD widths times unrolling)
SPLITS = (2, 4, 8)  #: split-K chunk counts the check runs
CHECK_SAMPLE = 256  #: sampled elements whose other orders are run exactly
_CHUNK = 1 << 22  # float64 values per temporary of the block GEMMs (32 MiB)


def block_size(K: int) -> int:
    """``B``: the power of two nearest ``sqrt(K) / 2`` within [:data:`BLOCK_MIN`, :data:`BLOCK_MAX`]. Any B gives
    a bound; this one keeps it near the partial sums themselves. On terms of either sign and unit size the
    bound is about ``(K / B) B (0.6 sqrt(K) + 0.8 B)**2`` (a prefix's typical size plus a block's magnitude)
    against ``K**2 / 2`` for the left-to-right order, a ratio ``2 (0.6 + 0.8 B / sqrt(K))**2``: 2 at ``B =
    sqrt(K) / 2``, 8 at B = 32 for K = 320. Smaller blocks cost more GEMMs of a shorter inner dimension;
    above K = 4096 the prefixes dominate and 32 stays (1.4x in sigma at most from the block term)."""
    b = 2.0 ** round(np.log2(max(np.sqrt(max(K, 1)) / 2.0, 1.0)))
    return int(min(max(b, BLOCK_MIN), BLOCK_MAX))


def _ordered(S, A, bias, block, orders=None):
    """``block max(sum_b (|P_b| + A_b + |bias|)**2, sum_b (|Q_b| + A_b + |bias|)**2)`` over the blocks of the
    first axis (their exact sums ``S`` and magnitudes ``A``), P before each block, Q after it, the largest
    over ``orders`` (rows of block indices; default: as they lie); the shape of one block, ``bias``
    broadcast to it."""
    nb = S.shape[0]
    shape = S.shape[1:]
    orders = np.arange(nb)[None] if orders is None else np.asarray(orders, np.int64).reshape(-1, nb)
    out = np.empty(int(np.prod(shape, dtype=np.int64)))
    b = np.ascontiguousarray(np.broadcast_to(bias, shape), np.float64).reshape(-1)
    S2, A2 = (np.ascontiguousarray(v, np.float64).reshape(nb, -1) for v in (S, A))
    _ordered_pass(S2, A2, b, float(block), orders, out)
    return out.reshape(shape)


@jit(parallel=True)
def _ordered_pass(S, A, bias, block, orders, out):
    """:func:`_ordered`'s pass: for each order the prefix and suffix at each block, both sums of squares, the
    largest; elements in chunks of 1024 read along the rows of S and A (each block's row is contiguous)."""
    nb, n = S.shape
    step = 1024
    for c in prange((n + step - 1) // step):
        i0, i1 = c * step, min(n, (c + 1) * step)
        m = i1 - i0
        total, worst = np.zeros(m), np.zeros(m)
        p, left, right = np.empty(m), np.empty(m), np.empty(m)
        for k in range(nb):
            for i in range(m):
                total[i] += S[k, i0 + i]
        for o in range(orders.shape[0]):
            p[:] = 0.0
            left[:] = 0.0
            right[:] = 0.0
            for j in range(nb):
                k = orders[o, j]
                for i in range(m):
                    s = S[k, i0 + i]
                    a = A[k, i0 + i] + bias[i0 + i]
                    q = total[i] - p[i] - s
                    left[i] += (abs(p[i]) + a) ** 2
                    right[i] += (abs(q) + a) ** 2
                    p[i] += s
            for i in range(m):
                worst[i] = max(worst[i], left[i], right[i])
        for i in range(m):
            out[i0 + i] = block * worst[i]


def block_partials(a, b, block, bias=0.0):
    """``sum_k P_k**2`` over the partial sums of each element of ``a @ b`` ((M, K) @ (K, N), float64) along k,
    bounded per block of ``block`` consecutive k by ``block (|P_b| + A_b + |bias|)**2``, the larger of the two
    directions (module docstring; ``bias`` broadcast over the N columns); in chunks of rows, so that no
    temporary exceeds about 32 MiB. The GEMMs' order term and attention's (P @ V, q . k) read it."""
    M, K = a.shape
    N = b.shape[1]
    nb = max(-(-K // block), 1)
    pad = nb * block - K
    Bp = np.pad(b, ((0, pad), (0, 0))).reshape(nb, block, N)
    aBp = np.abs(Bp)
    out = np.empty((M, N))
    step = max(1, _CHUNK // max(nb * N, 1))
    for r0 in range(0, M, step):
        Ap = np.pad(a[r0 : r0 + step], ((0, 0), (0, pad))).reshape(-1, nb, block).transpose(1, 0, 2)  # (nb, m, block)
        out[r0 : r0 + step] = _ordered(np.matmul(Ap, Bp), np.matmul(np.abs(Ap), aBp), bias, block)
    return out


def _blocks(A, Bt, absb_bias, block):
    """The block bound plus ``sum_k t_k**2`` for ``A @ Bt.T`` ((M, K), (N, K) float64)."""
    return block_partials(A, Bt.T, block, absb_bias) + (A * A) @ (Bt * Bt).T


def _bmm(a, b):
    """Batched float64 ``a @ b`` by torch's BLAS (numpy's stacked matmul ran 5x slower on these shapes: inner
    dimension B, thousands of columns); numpy where torch is not installed."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the tests, optional for the library
        return np.matmul(a, b)
    return torch.matmul(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))).numpy()


def _conv_image(Xn, W, bias, c, block):
    """The bound plus ``sum_k t_k**2`` for one image ``Xn`` (C_in, Hp, Wp) of the convolution ``c``, (C_out, Ho *
    Wo), per conv group: cells of ``block`` input channels at one tap (a GEMM each), taken tap by tap
    (``(ky, kx, c)``) and channel block by channel block (``(c_outer, ky, kx, c_inner)``), the larger of the
    two (module docstring)."""
    c_out, cin_g, kh, kw = W.shape
    cout_g = c_out // c.groups
    _, _, ho, wo = c.out_shape
    (sh, sw), (dh, dw) = c.stride, c.dilation
    T = kh * kw
    cb = min(cin_g, block)
    ngr = -(-cin_g // cb)
    out = np.empty((c_out, ho * wo))
    for g in range(c.groups):
        Xg, Wg = Xn[g * cin_g : (g + 1) * cin_g], W[g * cout_g : (g + 1) * cout_g]
        V = np.zeros((T, ngr * cb, ho * wo))  # the input each tap reads, channels padded to whole cells
        for t in range(T):
            ky, kx = divmod(t, kw)
            v = Xg[:, ky * dh : ky * dh + (ho - 1) * sh + 1 : sh, kx * dw : kx * dw + (wo - 1) * sw + 1 : sw]
            V[t, :cin_g] = v.reshape(cin_g, ho * wo)
        Wc = np.zeros((cout_g, ngr * cb, T))
        Wc[:, :cin_g] = Wg.reshape(cout_g, cin_g, T)
        Wc = np.ascontiguousarray(Wc.reshape(cout_g, ngr, cb, T).transpose(3, 1, 0, 2)).reshape(T * ngr, cout_g, cb)
        V = V.reshape(T * ngr, cb, ho * wo)  # cell (t, j) at t ngr + j
        S, A = _bmm(Wc, V), _bmm(np.abs(Wc), np.abs(V))
        sq = (Wc * Wc).transpose(1, 0, 2).reshape(cout_g, -1) @ (V * V).reshape(-1, ho * wo)
        b = bias[g * cout_g : (g + 1) * cout_g, None]
        cells = np.arange(T * ngr).reshape(T, ngr)
        both = _ordered(S, A, b, cb, np.stack([cells.reshape(-1), cells.T.reshape(-1)]))  # tap-major, blocked
        out[g * cout_g : (g + 1) * cout_g] = both + sq
    return out


def gemm_partials(pr, mag, block: int | None = None):
    """``sum_j c_j**2`` per output element of the GEMM Problem ``pr`` (float64 of ``pr.shape``; module
    docstring), at most the order-free ``(n + 1) mag**2``; None where the bound does not apply (not a GEMM,
    or a float64 result)."""
    if pr.fmt.prec > 24 or pr.kind == "dot" or (pr.kind == "conv" and getattr(pr.ops[0], "depth", 0) != 1):
        return None
    block = block_size(pr.n_terms) if block is None else block
    with np.errstate(all="ignore"):
        if pr.kind == "gemm":
            A3, Bt3, ia, ib = pr.ops
            nbat, M, N = ia.size, A3.shape[1], Bt3.shape[1]
            bias = np.zeros(N) if pr.bias is None else np.abs(np.asarray(pr.bias, np.float64))
            out = np.empty((nbat, M, N))
            for t in range(nbat):
                out[t] = _blocks(np.asarray(A3[ia[t]], np.float64), np.asarray(Bt3[ib[t]], np.float64), bias, block)
        else:
            c = pr.ops[0]
            X, W = np.asarray(c.X, np.float64), np.asarray(c.W, np.float64)
            bias = np.zeros(W.shape[0]) if c.bias is None else np.abs(np.asarray(c.bias, np.float64))
            out = np.stack([_conv_image(X[n], W, bias, c, block) for n in range(X.shape[0])])
        mag = np.asarray(mag, np.float64).reshape(out.shape)
        out += mag * mag
        out = np.minimum(out, (pr.n_terms + 1.0) * mag * mag)
    return np.where(np.isfinite(out), out, (pr.n_terms + 1.0) * mag * mag).reshape(pr.shape)


def _other_sq(T, lanes):
    """The largest ``sum_j c_j**2`` of the other orders, per row of products ``T`` (s, K), each exactly (float64,
    far under the float32 units it feeds): the terms' own order (a convolution's ``(c, ky, kx)``) left to right
    and right to left; L lanes summing k = l (mod L) left to right or right to left, then
    the lanes' totals in order or by a pairwise tree (a horizontal reduction); and split-K into 2, 4 or 8
    contiguous chunks, each left to right, then the chunks' results in order."""
    s, K = T.shape
    worst = np.maximum((np.cumsum(T, axis=1) ** 2).sum(axis=1), (np.cumsum(T[:, ::-1], axis=1) ** 2).sum(axis=1))
    for L in lanes:
        if L >= K:
            break
        pad = -K % L
        for seq in (T, T[:, ::-1]):
            P = np.cumsum(np.pad(seq, ((0, 0), (0, pad))).reshape(s, -1, L), axis=1)
            tot = P[:, -1]
            comb = np.maximum(_tree_sq(tot), (np.cumsum(tot, axis=1) ** 2).sum(axis=1))
            worst = np.maximum(worst, (P * P).sum(axis=(1, 2)) + comb)
    for c in SPLITS:
        if c >= K:
            break
        pad = -K % c
        P = np.cumsum(np.pad(T, ((0, 0), (0, pad))).reshape(s, c, -1), axis=2)
        worst = np.maximum(worst, (P * P).sum(axis=(1, 2)) + (np.cumsum(P[:, :, -1], axis=1) ** 2).sum(axis=1))
    return worst


def _tree_sq(v):
    """Per row of ``v``, the sum of squares of the partial sums of a pairwise tree (a horizontal reduction)."""
    total = np.zeros(v.shape[0])
    while v.shape[1] > 1:
        v = np.pad(v, ((0, 0), (0, v.shape[1] % 2))).reshape(v.shape[0], -1, 2).sum(axis=2)
        total += (v * v).sum(axis=1)
    return total


def order_bound(pr, mag, idx, at_most: int = CHECK_SAMPLE):
    """The order term ``sum_j c_j**2`` the verdict uses per element (flat float64 of ``pr.shape``), or None for
    the order-free scale: :func:`gemm_partials`, checked on at most ``at_most`` of the sampled elements ``idx``
    (flat indices, spread evenly) against the other orders run exactly (:func:`_other_sq`: lanes, split-K).
    Structure (the median ratio of the other orders' sum to the bound above 1: signs repeating with the
    lanes, where every element exceeds it, 65x at K = 1024 on alternating signs) gives None. On data without
    it the ratio is a fluctuation of single elements (randn GEMM, K = 1024: median 0.18, 99th percentile
    0.78, largest 1.11 of 1600; a conv2d of 288 terms: 0.18, 0.82, 1.60): the bound is scaled by the largest
    ratio of the sample when above 1, so that it holds for every order run on every sampled element."""
    bound = gemm_partials(pr, mag)
    if bound is None:
        return None
    idx = np.asarray(idx, np.int64)
    idx = idx[np.linspace(0, idx.size - 1, min(idx.size, at_most)).astype(np.int64)] if idx.size else idx
    if idx.size == 0:
        return bound
    L, R, _, _ = pr.terms(idx)
    T = L * R
    with np.errstate(all="ignore"):
        ratio = (_other_sq(T, LANES) + (T * T).sum(axis=1)) / bound.reshape(-1)[idx]
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size and np.median(ratio) > 1.0:
        return None
    kappa = max(1.0, float(ratio.max())) if ratio.size else 1.0
    return bound * kappa
