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

**Convolutions** run through k = (input channel, tap) in one of two orders: channel-major (im2col's
``(c, ky, kx)``, cuDNN's NCHW implicit GEMM) or tap-major (channels-last and blocked layouts, a direct
convolution: ``(ky, kx, c)``, channels in SIMD blocks). Per image and conv group, the bound is taken for
each order with blocks of consecutive k in it (a GEMM each): tap-major, ``B`` input channels at one tap;
channel-major, ``max(1, B // (kh kw))`` channels with all their taps; the larger of the two
is used. conv3d (its depth folded into the kernel's images), the transposed convolutions (and the
gradients judged as one) and float64 results keep the order-free scale.

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

__all__ = ["BLOCK_MIN", "BLOCK_MAX", "LANES", "SPLITS", "CHECK_SAMPLE", "block_size", "gemm_partials", "order_bound"]

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


def _ordered(S, A, bias, block):
    """``block max(sum_b (|P_b| + A_b + |bias|)**2, sum_b (|Q_b| + A_b + |bias|)**2)`` over the blocks of the
    first axis (their exact sums ``S`` and magnitudes ``A``), P before each block, Q after it."""
    start = np.cumsum(S, axis=0) - S
    end = (start[-1:] + S[-1:]) - start - S
    A = A + bias
    return block * np.maximum(((np.abs(start) + A) ** 2).sum(axis=0), ((np.abs(end) + A) ** 2).sum(axis=0))


def _blocks(A, Bt, absb_bias, block):
    """The block bound plus ``sum_k t_k**2`` for ``A @ Bt.T`` ((M, K), (N, K) float64), in chunks of rows."""
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
        a = A[r0 : r0 + step]
        out[r0 : r0 + step] = _ordered(np.matmul(Ap, Bp), np.matmul(np.abs(Ap), aBp), absb_bias, block) + (a * a) @ B2
    return out


def _conv_image(Xn, W, bias, c, block):
    """The bound plus ``sum_k t_k**2`` for one image ``Xn`` (C_in, Hp, Wp) of the convolution ``c``, (C_out, Ho *
    Wo), per conv group, the larger of the two orders kernels run (module docstring): tap-major over cells of
    ``block`` input channels at one tap, channel-major over blocks of ``max(1, block // (kh kw))`` channels
    with all their taps (a GEMM each)."""
    c_out, cin_g, kh, kw = W.shape
    cout_g = c_out // c.groups
    _, _, ho, wo = c.out_shape
    (sh, sw), (dh, dw) = c.stride, c.dilation
    T = kh * kw
    cb, cm = min(cin_g, block), max(1, min(cin_g, block // T))
    ngr, ngm = -(-cin_g // cb), -(-cin_g // cm)
    out = np.empty((c_out, ho * wo))
    for g in range(c.groups):
        Xg, Wg = Xn[g * cin_g : (g + 1) * cin_g], W[g * cout_g : (g + 1) * cout_g]
        St, At = np.zeros((T, ngr, cout_g, ho * wo)), np.zeros((T, ngr, cout_g, ho * wo))
        Sc, Ac = np.zeros((ngm, cout_g, ho * wo)), np.zeros((ngm, cout_g, ho * wo))
        sq = np.zeros((cout_g, ho * wo))
        for t in range(T):
            ky, kx = divmod(t, kw)
            V = Xg[:, ky * dh : ky * dh + (ho - 1) * sh + 1 : sh, kx * dw : kx * dw + (wo - 1) * sw + 1 : sw]
            V = V.reshape(cin_g, ho * wo)
            aV, Wt = np.abs(V), Wg[:, :, ky, kx]
            aW = np.abs(Wt)
            for j in range(ngr):
                ch = slice(j * cb, (j + 1) * cb)
                St[t, j], At[t, j] = Wt[:, ch] @ V[ch], aW[:, ch] @ aV[ch]
            for j in range(ngm):
                ch = slice(j * cm, (j + 1) * cm)
                Sc[j] += Wt[:, ch] @ V[ch]
                Ac[j] += aW[:, ch] @ aV[ch]
            sq += (Wt * Wt) @ (V * V)
        b = bias[g * cout_g : (g + 1) * cout_g, None]
        taps = _ordered(St.reshape(-1, cout_g, ho * wo), At.reshape(-1, cout_g, ho * wo), b, cb)
        chans = _ordered(Sc, Ac, b, cm * T)
        out[g * cout_g : (g + 1) * cout_g] = np.maximum(taps, chans) + sq
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
    far under the float32 units it feeds): L lanes summing k = l (mod L) left to right or right to left, then
    the lanes' totals in order or by a pairwise tree (a horizontal reduction); and split-K into 2, 4 or 8
    contiguous chunks, each left to right, then the chunks' results in order."""
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
