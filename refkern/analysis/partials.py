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
order-free one (both bound the same sum). The block sums are float64 sums of exact products (they err by
``gamma_K M``, far under ``u M`` for the float32-or-narrower accumulations this is used for: float64 results
keep the order-free scale), formed with the blocks' magnitudes and the passes over them in one jitted task
per run of output positions (:func:`_cells_pass`), never written to memory.

**Convolutions** run through k = (input channel, tap) in one of three orders: tap-major (channels-last
layouts, a direct convolution: ``(ky, kx, c)``), channel-blocked (oneDNN's nChw16c kernels: ``(c_outer, ky,
kx, c_inner)`` with SIMD blocks of channels) and channel-major (im2col's ``(c, ky, kx)``, cuDNN's NCHW
implicit GEMM). Per image and conv group, the cells of the bound are ``B`` input channels at one tap;
taken tap by tap they are the blocks of the tap-major order, block of channels by block of
channels those of the channel-blocked order, and the larger of the two bounds is used. The channel-major
order's blocks would be single channels with their taps (a third partition of the products; as GEMMs, one
per channel and tap, 300 s for a ResNet layer under load), so it is among the orders checked on a sample
instead. A transposed convolution is the convolution of its stride-dilated, padded input with the flipped
weight (:meth:`~refkern.kernels.conv_transpose.ConvTOperands.as_convolution`): the inserted zeros are zero
terms, which leave every cell's sum and magnitude unchanged, so the same cells bound it. That covers the
gradients judged as one transposed convolution, whose taps are the images or broadcast batch elements a
backend forms one GEMM each for and adds (a conv2d's grad_weight, a broadcast matmul's grad_b: the
order-free scale was 32 times this bound there, K = 4096 float32). conv3d and the transposed ones with depth
taps keep the order-free scale: as conv2d over depth slices their channels are the pairs (c, kz), so a cell
of consecutive channels spans depth taps, and a tap-major order over (kz, ky, kx) is not an order of those
cells (measured: 3% over the bound on one element of a 3x3x3 kernel). So do float64 results.

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
from refkern.analysis.other_orders import SPLITS
from refkern.analysis.other_orders import other_sq as _other_sq
from refkern.engines.filter import decide_one, threads_for
from refkern.kernels._convt_numba import ConvTOperands

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
    "partials_and_magnitudes",
    "reference_and_partials",
]

BLOCK_MIN, BLOCK_MAX = 4, 32  #: the range of :func:`block_size` (any block size gives a bound)
LANES = (2, 4, 8, 16, 32, 64)  #: the lane counts of the structure check (SIMD widths times unrolling)
CHECK_SAMPLE = 256  #: sampled elements whose other orders are run exactly
_TASK_VALUES = 16384  # float64 values per cell buffer of a task of the fused pass (128 KiB)
_GATHER_VALUES = 1 << 22  # float64 values of a strided convolution's gathered input at a time (32 MiB)


def block_size(K: int) -> int:
    """``B``: the power of two nearest ``sqrt(K) / 2`` within [:data:`BLOCK_MIN`, :data:`BLOCK_MAX`]. Any B gives
    a bound; this one keeps it near the partial sums themselves. On terms of either sign and unit size the
    bound is about ``(K / B) B (0.6 sqrt(K) + 0.8 B)**2`` (a prefix's typical size plus a block's magnitude)
    against ``K**2 / 2`` for the left-to-right order, a ratio ``2 (0.6 + 0.8 B / sqrt(K))**2``: 2 at ``B =
    sqrt(K) / 2``, 8 at B = 32 for K = 320. Smaller blocks cost more cells per output (passes over them);
    above K = 4096 the prefixes dominate and 32 stays (1.4x in sigma at most from the block term)."""
    b = 2.0 ** round(np.log2(max(np.sqrt(max(K, 1)) / 2.0, 1.0)))
    return int(min(max(b, BLOCK_MIN), BLOCK_MAX))


def _cell_pixels(n_cells: int, length: int) -> int:
    """Output positions per task of :func:`_cells_pass`: its two per-cell buffers hold ``n_cells`` rows of them,
    at most :data:`_TASK_VALUES` values each (128 KiB: the passes read them again from the core's L2 of 1 MiB,
    never from memory; measured on the ResNet layer and an RGB input layer, 0.31 s and 0.16 s against 0.35 s
    and 0.20 s at 64 KiB and 0.35 s and 0.16 s at 256 KiB, under load), a multiple of 32 (LLVM's vector loop:
    8 float64 lanes, unrolled 4 times; a remainder runs scalar) and at least 32. (Fewer positions, so that a
    task's input fits in L2 for the next output channel's, measured slower: a GEMM of K = 1024 at 32 positions
    0.56 s against 0.30 s, a strided ResNet-18 layer 0.031 s against 0.018 s.)"""
    return int(min(max(length, 1), max(32, (_TASK_VALUES // max(n_cells, 1)) // 32 * 32)))


@jit(parallel=True)
def _cells_pass(X, W, plane, off, pitch, wo, groups, cb, block, orders, bias, sbias, fmt, pw, with_sq, final, out, mag,
                val):  # fmt: skip
    """The block bound of the module docstring (plus ``sum_k t_k**2`` ``with_sq``) for a convolution read
    through flat planes: output position ``r = y pitch + x`` (x < wo) of image n and channel co is ``sum_(c, t)
    W[co, c, t] X[n, plane[t], g cin + c, r + off[t]]`` (float64; a stride-1 convolution reads one padded plane
    at offsets ``ky dh Wp + kx dw``, a strided one a plane per tap, a GEMM one plane of the rows of ``b``). A
    cell is ``cb`` consecutive input channels of a group at one tap, cell ``t ngr + j`` for tap ``t`` and
    channel block ``j``; ``orders`` (rows of cell indices) the orders the partial sums run through, the
    largest counts; ``bias`` (C_out, wo) the |bias| each partial sum carries; ``out`` (N, C_out, H, wo).
    Each task is ``pw`` consecutive positions of one image and output channel: the cells' sums ``S`` and
    magnitudes ``A`` are formed in a local buffer (never a GEMM's output in memory: at inner dimension cb
    those GEMMs were bound by memory, 0.4 s of products and 0.33 s of passes at a ResNet layer), then the
    passes read them there. ``mag`` (out's shape, or empty): each element's ``sum_k |t_k| + |bias|``, the
    sum of its cells' magnitudes (float64 sums, within gamma_K of the exact one, as a magnitudes GEMM's).
    ``final`` (n + 1, or 0): the bound completed with its own magnitudes ``M``, ``min(out + M**2, (n + 1) M**2)``
    ((n + 1) M**2 where that is not finite), as :func:`_partials` completes it for given magnitudes.
    ``val`` (out's shape, or empty): each element's correctly rounded value in the format ``fmt`` = (K, prec,
    emin, emax) where the filter's test decides it (:func:`~refkern.engines.filter.decide_one`: the sum of the
    cells' sums plus ``sbias``, the signed bias, is a float64 sum of the K exact products and the bias in some
    order, and the magnitudes bound its error), NaN where it does not. The products are exact (float32-or-
    narrower inputs in float64), the cells' sums err by gamma_cb relatively, far under the float32 units the
    bound feeds."""
    N = X.shape[0]
    c_out, cin_g, T = W.shape
    ho = out.shape[2]
    cout_g = c_out // groups
    ngr = (cin_g + cb - 1) // cb
    nc = T * ngr
    length = (ho - 1) * pitch + wo  # the last valid position + 1: a read stays inside its plane
    npc = (length + pw - 1) // pw
    for task in prange(N * c_out * npc):  # output channels innermost: a thread's consecutive tasks read one run
        co = task % c_out  # of input positions (kept in its core's L2), not one channel's whole output's
        pc = (task // c_out) % npc
        n = task // (npc * c_out)
        c0 = (co // cout_g) * cin_g
        r0 = pc * pw
        m = min(length, r0 + pw) - r0
        S = np.zeros((nc, m))
        A = np.zeros((nc, m))
        sq = np.zeros(m)  # sum_k t_k**2 (with_sq), else only a scratch
        for t in range(T):
            x0 = r0 + off[t]
            for j in range(ngr):
                _cell(X[n, plane[t]], W[co, :, t], c0, j * cb, min(cin_g, (j + 1) * cb), x0, m, S[t * ngr + j],
                      A[t * ngr + j], sq)  # fmt: skip
        total = np.zeros(m)
        for k in range(nc):
            for p in range(m):
                total[p] += S[k, p]
        b = np.zeros(m)
        for p in range(m):
            if (r0 + p) % pitch < wo:
                b[p] = bias[co, (r0 + p) % pitch]
        worst = np.zeros(m)
        P = np.empty(m)
        left = np.empty(m)
        right = np.empty(m)
        for o in range(orders.shape[0]):
            P[:] = 0.0
            left[:] = 0.0
            right[:] = 0.0
            j = 0
            while j + 4 <= nc:  # four cells per sweep: P, left and right read and written once per four cells, not
                # once per cell (the ResNet layer's pass 0.229 -> 0.218 s on one thread); same operations, same order
                s1, s2, s3, s4 = S[orders[o, j]], S[orders[o, j + 1]], S[orders[o, j + 2]], S[orders[o, j + 3]]
                a1, a2, a3, a4 = A[orders[o, j]], A[orders[o, j + 1]], A[orders[o, j + 2]], A[orders[o, j + 3]]
                for p in range(m):
                    bp, tp, pp, lp, rp = b[p], total[p], P[p], left[p], right[p]
                    s, a = s1[p], a1[p] + bp
                    lp += (abs(pp) + a) ** 2
                    rp += (abs(tp - pp - s) + a) ** 2  # the exact suffix after the cell
                    pp += s
                    s, a = s2[p], a2[p] + bp
                    lp += (abs(pp) + a) ** 2
                    rp += (abs(tp - pp - s) + a) ** 2
                    pp += s
                    s, a = s3[p], a3[p] + bp
                    lp += (abs(pp) + a) ** 2
                    rp += (abs(tp - pp - s) + a) ** 2
                    pp += s
                    s, a = s4[p], a4[p] + bp
                    lp += (abs(pp) + a) ** 2
                    rp += (abs(tp - pp - s) + a) ** 2
                    P[p], left[p], right[p] = pp + s, lp, rp
                j += 4
            while j < nc:
                s_row = S[orders[o, j]]
                a_row = A[orders[o, j]]
                for p in range(m):
                    s = s_row[p]
                    a = a_row[p] + b[p]
                    q = total[p] - P[p] - s  # the exact suffix after the cell
                    left[p] += (abs(P[p]) + a) ** 2
                    right[p] += (abs(q) + a) ** 2
                    P[p] += s
                j += 1
            for p in range(m):
                worst[p] = max(worst[p], left[p], right[p])
        own = mag.size > 0 or val.size > 0 or final > 0.0
        mt = np.zeros(m if own else 0)
        for k in range(nc if own else 0):
            for p in range(m):
                mt[p] += A[k, p]
        for p in range(m):
            y, x = divmod(r0 + p, pitch)
            if x < wo:
                v = block * worst[p] + (sq[p] if with_sq else 0.0)
                if own:
                    mp = mt[p] + b[p]
                    if final > 0.0:  # + M**2, at most the order-free (n + 1) M**2 (which also stands for inf, NaN)
                        v += mp * mp
                        cap = (final * mp) * mp
                        v = v if v <= cap else cap
                    if mag.size:
                        mag[n, co, y, x] = mp
                    if val.size:  # the bias is one more term of the float64 sum, counted in decide_one's K + 1
                        val[n, co, y, x] = decide_one(total[p] + sbias[co, x], mp, fmt[0], fmt[1], fmt[2], fmt[3])
                out[n, co, y, x] = v


@jit
def _cell(Xn, w, c0, c_lo, c_hi, x0, m, s_row, a_row, sq):
    """One cell's sums over its channels ``c_lo .. c_hi - 1`` (of the group starting at input channel ``c0``) at
    positions ``x0 .. x0 + m - 1`` of the plane ``Xn``, added in channel order to ``s_row`` (the products), ``a_row``
    (their magnitudes) and ``sq`` (their squares). Eight channels per pass over the positions (then four, and
    the last three, two or one in one pass): the buffers are read and written once per eight products, not once
    per product (3x fewer memory operations; same sums, same order). A product of float32-or-narrower values is
    exact in float64, so ``|t|`` and ``t * t`` (rounded once) are those of ``|w| |x|`` and ``w**2 x**2``."""
    c = c_lo
    while c + 8 <= c_hi:
        x1, x2, x3, x4 = Xn[c0 + c, x0 : x0 + m], Xn[c0 + c + 1, x0 : x0 + m], Xn[c0 + c + 2, x0 : x0 + m], \
            Xn[c0 + c + 3, x0 : x0 + m]  # fmt: skip
        x5, x6, x7, x8 = Xn[c0 + c + 4, x0 : x0 + m], Xn[c0 + c + 5, x0 : x0 + m], Xn[c0 + c + 6, x0 : x0 + m], \
            Xn[c0 + c + 7, x0 : x0 + m]  # fmt: skip
        w1, w2, w3, w4, w5, w6, w7, w8 = w[c], w[c + 1], w[c + 2], w[c + 3], w[c + 4], w[c + 5], w[c + 6], w[c + 7]
        for p in range(m):  # sliced rows, indices from a range: plain vector loads (an offset index gathers)
            t1, t2, t3, t4 = w1 * x1[p], w2 * x2[p], w3 * x3[p], w4 * x4[p]
            t5, t6, t7, t8 = w5 * x5[p], w6 * x6[p], w7 * x7[p], w8 * x8[p]
            s_row[p] = (((((((s_row[p] + t1) + t2) + t3) + t4) + t5) + t6) + t7) + t8
            a_row[p] = (((((((a_row[p] + abs(t1)) + abs(t2)) + abs(t3)) + abs(t4)) + abs(t5)) + abs(t6)) + abs(t7)) \
                + abs(t8)  # fmt: skip
            sq[p] = (((((((sq[p] + t1 * t1) + t2 * t2) + t3 * t3) + t4 * t4) + t5 * t5) + t6 * t6) + t7 * t7) + t8 * t8
        c += 8
    while c + 4 <= c_hi:
        x1, x2, x3, x4 = Xn[c0 + c, x0 : x0 + m], Xn[c0 + c + 1, x0 : x0 + m], Xn[c0 + c + 2, x0 : x0 + m], \
            Xn[c0 + c + 3, x0 : x0 + m]  # fmt: skip
        w1, w2, w3, w4 = w[c], w[c + 1], w[c + 2], w[c + 3]
        for p in range(m):
            t1, t2, t3, t4 = w1 * x1[p], w2 * x2[p], w3 * x3[p], w4 * x4[p]
            s_row[p] = (((s_row[p] + t1) + t2) + t3) + t4
            a_row[p] = (((a_row[p] + abs(t1)) + abs(t2)) + abs(t3)) + abs(t4)
            sq[p] = (((sq[p] + t1 * t1) + t2 * t2) + t3 * t3) + t4 * t4
        c += 4
    if c + 3 == c_hi:  # three left (an RGB input's cells): one sweep, not two
        x1, x2, x3 = Xn[c0 + c, x0 : x0 + m], Xn[c0 + c + 1, x0 : x0 + m], Xn[c0 + c + 2, x0 : x0 + m]
        w1, w2, w3 = w[c], w[c + 1], w[c + 2]
        for p in range(m):
            t1, t2, t3 = w1 * x1[p], w2 * x2[p], w3 * x3[p]
            s_row[p] = ((s_row[p] + t1) + t2) + t3
            a_row[p] = ((a_row[p] + abs(t1)) + abs(t2)) + abs(t3)
            sq[p] = ((sq[p] + t1 * t1) + t2 * t2) + t3 * t3
        c += 3
    if c + 2 <= c_hi:
        x1, x2 = Xn[c0 + c, x0 : x0 + m], Xn[c0 + c + 1, x0 : x0 + m]
        w1, w2 = w[c], w[c + 1]
        for p in range(m):
            t1, t2 = w1 * x1[p], w2 * x2[p]
            s_row[p] = (s_row[p] + t1) + t2
            a_row[p] = (a_row[p] + abs(t1)) + abs(t2)
            sq[p] = (sq[p] + t1 * t1) + t2 * t2
        c += 2
    while c < c_hi:
        xr = Xn[c0 + c, x0 : x0 + m]
        w1 = w[c]
        for p in range(m):
            t1 = w1 * xr[p]
            s_row[p] += t1
            a_row[p] += abs(t1)
            sq[p] += t1 * t1
        c += 1


def _cells(X, W, bias, stride, dilation, groups, cb, block, orders, out_shape, with_sq=True, mag=None, values=None,
           final=0.0):  # fmt: skip
    """:func:`_cells_pass` on a convolution's padded input ``X`` (N, C_in, Hp, Wp) and ``W`` (C_out, C_in / groups,
    kh, kw), ``bias`` broadcast to (C_out, Wo), ``orders`` of taps and channel blocks (``"tap"``: tap by tap;
    ``"both"``: also channel block by channel block): the bound (plus ``sum_k t_k**2`` ``with_sq``), of
    ``out_shape`` (N, C_out, Ho, Wo); ``mag`` (of ``out_shape``, or None) := the magnitudes; ``values`` (None, or
    (val of ``out_shape``, the signed bias broadcast as ``bias``, (K, prec, emin, emax))): val := the values the
    filter's test decides, NaN elsewhere; ``final``: :func:`_cells_pass`'s.
    Stride 1 reads the padded input in place (positions at the padded width, the columns past Wo dropped:
    (kw - 1) dw of Wp); a stride gathers each tap's input first, T times the output's positions per input
    channel, in chunks of images of at most 32 MiB."""
    N, C, Hp, Wp = X.shape
    c_out, cin_g, kh, kw = W.shape
    _, _, ho, wo = out_shape
    (sh, sw), (dh, dw) = stride, dilation
    ngr = -(-cin_g // cb)
    cells = np.arange(kh * kw * ngr).reshape(kh * kw, ngr)
    both = orders == "both" and ngr > 1 and kh * kw > 1  # one channel block or one tap: the two orders coincide
    order = np.stack([cells.reshape(-1)] + ([cells.T.reshape(-1)] if both else [])).astype(np.int64)
    out = np.empty(out_shape)
    b = np.broadcast_to(np.asarray(bias, np.float64), (c_out, wo))
    W3 = np.ascontiguousarray(W, np.float64).reshape(c_out, cin_g, kh * kw)
    ky, kx = np.divmod(np.arange(kh * kw), kw)
    if out.size == 0:
        return out
    if sh == 1 and sw == 1:
        planes = [(np.ascontiguousarray(X, np.float64).reshape(N, 1, C, Hp * Wp), np.zeros(kh * kw, np.int64),
                   (ky * dh * Wp + kx * dw).astype(np.int64), Wp, slice(None))]  # fmt: skip
    else:
        step = max(1, _GATHER_VALUES // max(kh * kw * C * ho * wo, 1))
        planes = ((_gathered(X[n0 : n0 + step], kh, kw, stride, dilation, ho, wo), np.arange(kh * kw),
                   np.zeros(kh * kw, np.int64), wo, slice(n0, n0 + step)) for n0 in range(0, N, step))  # fmt: skip
    none = np.empty((0, 0, 0, 0))
    val, sb, fmt = values if values is not None else (None, b, np.zeros(4, np.int64))
    sb = np.broadcast_to(np.asarray(sb, np.float64), (c_out, wo))
    for Xp, plane, off, pitch, sl in planes:
        o, mo, vo = out[sl], (mag[sl] if mag is not None else none), (val[sl] if val is not None else none)
        with threads_for(o.size * cin_g * kh * kw):  # the products it forms: one thread for a small GEMM (a linear
            # layer's 0.5M: 0.1 ms, where a parallel launch waits for both threads, ms under load)
            _cells_pass(Xp, W3, plane.astype(np.int64), off, int(pitch), int(wo), int(groups), int(cb), float(block),
                        order, b, sb, np.asarray(fmt, np.int64), _cell_pixels(cells.size, (ho - 1) * pitch + wo),
                        bool(with_sq), float(final), o, mo, vo)  # fmt: skip
    return out


def _gathered(X, kh, kw, stride, dilation, ho, wo):
    """(N, T, C, Ho Wo): the input each tap of a strided convolution reads, tap ``ky kw + kx``."""
    (sh, sw), (dh, dw) = stride, dilation
    N, C = X.shape[:2]
    V = np.empty((N, kh * kw, C, ho, wo))
    for t in range(kh * kw):
        y, x = divmod(t, kw)
        V[:, t] = X[:, :, y * dh : y * dh + (ho - 1) * sh + 1 : sh, x * dw : x * dw + (wo - 1) * sw + 1 : sw]
    return V.reshape(N, kh * kw, C, ho * wo)


def block_partials(a, b, block, bias=0.0):
    """``sum_k P_k**2`` over the partial sums of each element of ``a @ b`` ((M, K) @ (K, N), float64) along k,
    bounded per block of ``block`` consecutive k by ``block (|P_b| + A_b + |bias|)**2``, the larger of the two
    directions (module docstring; ``bias`` broadcast to (M, N)); a GEMM as a convolution with a 1 x 1 kernel
    (:func:`_cells_pass`). The GEMMs' order term and attention's (P @ V, q . k) read it."""
    return _blocks(a, b, block, bias, False)


def _blocks(a, b, block, bias, with_sq=True, mag=None, values=None, final=0.0):
    """The block bound (plus ``sum_k t_k**2`` ``with_sq``) for ``a @ b`` ((M, K), (K, N) float64), ``bias``
    broadcast to (M, N); ``mag`` ((M, N) or None) := the magnitudes; ``values`` as :func:`_cells`' with val
    (M, N) and the signed bias broadcast to (M, N); ``final`` as :func:`_cells_pass`'s."""
    M, K = a.shape
    N = b.shape[1]
    bias = np.broadcast_to(np.asarray(bias, np.float64), (M, N))
    X = np.asarray(b, np.float64).reshape(1, K, 1, N)
    W = np.asarray(a, np.float64).reshape(M, K, 1, 1)
    m4 = None if mag is None else mag.reshape(1, M, 1, N)
    if values is not None:
        val, sb, fmt = values
        values = (val.reshape(1, M, 1, N), np.broadcast_to(np.asarray(sb, np.float64), (M, N)), fmt)
    return _cells(X, W, bias, (1, 1), (1, 1), 1, block, block, "tap", (1, M, 1, N), with_sq, m4, values,
                  final).reshape(M, N)  # fmt: skip


def gemm_partials(pr, mag, block: int | None = None):
    """``sum_j c_j**2`` per output element of the GEMM Problem ``pr`` (float64 of ``pr.shape``; module
    docstring), at most the order-free ``(n + 1) mag**2``; None where the bound does not apply (not a GEMM,
    or a float64 result). The bound :func:`reference_and_partials` formed with these very magnitudes is
    returned as it is (no second pass)."""
    held = getattr(pr, "partials", None)
    if held is not None and held[0] is mag and block is None:
        return held[1]
    return _partials(pr, np.asarray(mag, np.float64), block)[0]


def partials_and_magnitudes(pr, block: int | None = None):
    """(:func:`gemm_partials`, the magnitudes ``sum_k |t_k| + |bias|``) of the GEMM Problem ``pr``, both of
    ``pr.shape``, the magnitudes the sums of the cells' that the pass forms anyway (within gamma_K of the
    exact ones, as a magnitudes GEMM's): a caller that asks for them here needs no GEMM of |A| |B| (a
    convolution's reference with magnitudes costs about twice the reference alone). (None, None) where the
    bound does not apply."""
    return _partials(pr, None, block)[:2]


def reference_and_partials(pr):
    """(the exact reference, the magnitudes) of the GEMM Problem ``pr`` (float64 of ``pr.shape``, as
    ``pr.run(want_mag=True)`` gives them: the same values, the magnitudes within gamma_K) from the pass that
    forms its order term, which ``pr`` keeps for :func:`gemm_partials` (and so :func:`order_bound`) to return
    with these magnitudes; None where the bound does not apply (the caller runs the reference).

    Where the filter applies (exact products, a result of at most 26 bits: :func:`~refkern.engines.filter.
    applies`) the values come from the pass too: the sum of its cells' sums is a float64 sum of the exact
    products, their magnitudes bound its error, and :func:`~refkern.engines.filter.decide_one` rounds it
    where that bound decides (no GEMM at all: the pass forms every product anyway). The undecided elements
    are computed exactly one by one (:func:`~refkern.analysis.evaluate.sample_run` on their gathered terms);
    more than ``filter.TILE_EXACT_MIN`` of the output undecided (terms that cancel), the reference runs as
    usual instead, so that this costs at most the reference and one pass."""
    import dataclasses

    from refkern.engines import filter as filt
    from refkern.kernels._element import EXACT

    p = dataclasses.replace(pr.p, method=EXACT, work=pr.p.out)
    bound, mag, val = _partials(pr, None, None, values=filt.applies(p))
    if bound is None:
        return None
    pr.partials = (mag, bound)
    if val is None:
        return pr.run()[0], mag
    und = np.flatnonzero(np.isnan(val))
    if und.size > filt.TILE_EXACT_MIN * val.size:
        return pr.run()[0], mag
    if und.size:
        from refkern.analysis.evaluate import sample_run

        L, R, b, has_bias = pr.terms(und)
        val.reshape(-1)[und] = sample_run(L, R, b, has_bias, p)[0]
    return val, mag


def _partials(pr, mag, block, values=False):
    """(bound, the pass's own magnitudes where ``mag`` is None, with ``values`` the values the filter's test
    decides in the pass (NaN elsewhere)), each of ``pr.shape``; (None, None, None) where the bound does not
    apply."""
    if pr.fmt.prec > 24 or pr.kind == "dot":
        return None, None, None
    block = block_size(pr.n_terms) if block is None else block
    fmt = (pr.n_terms - (pr.bias is not None), *pr.fmt.params)  # K products (the bias is decide_one's K + 1st)
    final = pr.n_terms + 1.0 if mag is None else 0.0  # with its own magnitudes the pass completes the bound
    with np.errstate(all="ignore"):
        if pr.kind == "gemm":
            A3, Bt3, ia, ib = pr.ops
            nbat, M, N = ia.size, A3.shape[1], Bt3.shape[1]
            sbias = np.zeros(N) if pr.bias is None else np.asarray(pr.bias, np.float64)
            out = np.empty((nbat, M, N))
            own = np.empty((nbat, M, N)) if mag is None else None
            val = np.empty((nbat, M, N)) if values else None
            for t in range(nbat):
                out[t] = _blocks(np.asarray(A3[ia[t]], np.float64), np.asarray(Bt3[ib[t]], np.float64).T, block,
                                 np.abs(sbias), mag=None if own is None else own[t],
                                 values=(val[t], sbias, fmt) if values else None, final=final)  # fmt: skip
        else:
            c = pr.ops[0]
            if isinstance(c, ConvTOperands):  # a transposed convolution as its convolution (the zeros: zero terms)
                if c.weight.shape[2] > 1:  # depth taps: channels (c, kz), not cells of one tap (module docstring)
                    return None, None, None
                c, values, val = c.as_convolution(), False, None  # a zero's sign is not the pass's to decide
            elif c.nd == 3:
                return None, None, None
            c_out, cin_g = c.W.shape[:2]
            sbias = np.zeros((c_out, 1)) if c.bias is None else np.asarray(c.bias, np.float64)[:, None]
            cb = min(cin_g, block)  # cells of cb channels at one tap, tap-major and channel-blocked (module docstring)
            own = np.empty(c.out_shape) if mag is None else None
            val = np.empty(c.out_shape) if values else None
            out = _cells(c.X, c.W, np.abs(sbias), c.stride, c.dilation, c.groups, cb, cb, "both", c.out_shape,
                         mag=own, values=(val, sbias, fmt) if values else None, final=final)  # fmt: skip
            if c.depth > 1:  # images n * D_out + z: depth z of image n (conv3d, conv_transpose3d)
                out, own, val = (None if a is None else _depth_last(a, c.depth) for a in (out, own, val))
        if own is None:  # given magnitudes: + M**2, at most (n + 1) M**2, which stands where that is not finite
            mag = mag.reshape(out.shape)
            out += mag * mag
            out = np.minimum(out, (pr.n_terms + 1.0) * mag * mag)
            out = np.where(np.isfinite(out), out, (pr.n_terms + 1.0) * mag * mag)
    return (out.reshape(pr.shape), (own.reshape(pr.shape) if own is not None else None),
            (val.reshape(pr.shape) if values else None))  # fmt: skip


def _depth_last(a, depth):
    """(N * D, C, H, W) -> (N, C, D, H, W), contiguous: a conv3d's depth slices in its output's layout."""
    nz, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(nz // depth, depth, c, h, w).transpose(0, 2, 1, 3, 4))


def order_bound(pr, mag, idx, at_most: int = CHECK_SAMPLE, bound=None):
    """The order term ``sum_j c_j**2`` the verdict uses per element (flat float64 of ``pr.shape``), or None for
    the order-free scale: :func:`gemm_partials`, checked on at most ``at_most`` of the sampled elements ``idx``
    (flat indices, spread evenly) against the other orders run exactly (:func:`_other_sq`: lanes, split-K).
    Structure (the median ratio of the other orders' sum to the bound above 1: signs repeating with the
    lanes, where every element exceeds it, 65x at K = 1024 on alternating signs) gives None. On data without
    it the ratio is a fluctuation of single elements (randn GEMM, K = 1024: median 0.18, 99th percentile
    0.78, largest 1.11 of 1600; a conv2d of 288 terms: 0.18, 0.82, 1.60): the bound is scaled by the largest
    ratio of the sample when above 1, so that it holds for every order run on every sampled element. ``bound``:
    :func:`gemm_partials` where the caller has it already (:func:`partials_and_magnitudes`)."""
    bound = gemm_partials(pr, mag) if bound is None else bound
    if bound is None:
        return None
    idx = np.asarray(idx, np.int64)
    idx = idx[np.linspace(0, idx.size - 1, min(idx.size, at_most)).astype(np.int64)] if idx.size else idx
    if idx.size == 0:
        return bound
    L, R, _, _ = pr.terms(idx)
    T = L * R
    with np.errstate(all="ignore"):
        other = _other_sq(T, LANES)
        np.multiply(T, T, out=T)  # the squares in place: one temporary of the sample's terms fewer (8 MB at K = 4608)
        ratio = (other + T.sum(axis=1)) / bound.reshape(-1)[idx]
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size and np.median(ratio) > 1.0:
        return None
    kappa = max(1.0, float(ratio.max())) if ratio.size else 1.0
    return bound * kappa
