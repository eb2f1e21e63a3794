"""The convolution's Numba kernel (conv2d over a padded input; conv1d and conv3d reduce to it) and the
fast path its transposed twin shares: what the wrappers (:mod:`refkern.kernels.conv`) and the engines
(the filter's transposed convolution) share. Imports no engine: the engines call it, and the wrappers
call the engines."""

from dataclasses import dataclass

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.kernels._element import EXACT, abs_sum, reduce_element, row_stats

__all__ = ["ConvOperands", "run_conv_numba", "decide", "dot_mag_rows", "fast_element", "fast_ok", "fast_bound"]


_ABS = np.int64(0x7FFFFFFFFFFFFFFF)


_INF_BITS = np.int64(0x7FF0000000000000)


_CHUNK_BYTES = 3 << 18  # 768 KiB of gathered patches per task: with one filter, within a 1 MiB L2 cache


@jit(fastmath={"reassoc", "contract"})
def _dot_mag(a, b, n):
    """(sum_k a[k] b[k], sum_k |a[k] b[k]|), k < n, in float64, in any order: reassociation (and
    contraction) is allowed here and only here, because :func:`fast_element`'s bound holds for every
    order of the additions. A separate function, so that the flag stays on its own code."""
    s = 0.0
    m = 0.0
    for k in range(n):
        p = a[k] * b[k]
        s += p
        m += abs(p)
    return s, m


@jit(fastmath={"reassoc", "contract"})
def dot_mag_rows(w, b, n, sm):
    """sm[r] = :func:`_dot_mag` (w[r], b, n) for every row r of the 2-D ``w``: one call per
    gathered input instead of one per filter (the same freedom of order, the same flag)."""
    for r in range(w.shape[0]):
        s = 0.0
        m = 0.0
        for k in range(n):
            p = w[r, k] * b[k]
            s += p
            m += abs(p)
        sm[r, 0] = s
        sm[r, 1] = m


@jit(inline="always")
def fast_bound(terms, m):
    """err of :func:`fast_element` for ``terms`` terms of computed magnitude ``m``:
    fl(4 N u m), u = 2**-53 (derived there)."""
    return (4.0 * terms * 2.0**-53) * m


@jit(inline="always")
def fast_element(a, b, n, bias, has_bias, prec, emin, emax):
    """``bias + sum_{k < n} a[k] b[k]`` correctly rounded to the format (prec, emin, emax) when a
    float64 evaluation with a rigorous error bound decides it, else NaN: the caller then reduces the
    element with :func:`~refkern.kernels._element.reduce_element` (Ziv's strategy: a cheap evaluation,
    the exact path when it cannot decide). Only for ``exact`` on float32-or-narrower factors and a
    result format of at most 26 bits; ``a`` and ``b`` are read up to ``n``.

    The N = n + 1 terms t (n products, exact in float64 since their factors have <= 24 bits, and
    the bias) are summed in float64 in any order: |s - S| <= gamma_{N-1} sum|t| (Higham, Accuracy
    and Stability, 2nd ed., eq. (4.4); an addition never underflows inexactly, and the products are
    exact, so the model holds without an underflow term). The magnitude m, computed the same way,
    is >= (1 - gamma_{N-1}) sum|t|, so |s - S| <= gamma_{N-1} / (1 - gamma_{N-1}) m <= 2 (N - 1) u m
    (u = 2**-53, N u <= 2**-8: arrays of fewer than 2**45 elements), and |s| <= (1 + gamma) /
    (1 - gamma) m <= 1.01 m. err = fl(4 N u m) (:func:`fast_bound`) >= 4 N u m (1 - u) covers that
    error and the rounding of s -+ err, at most u (|s| + err) <= u (1.01 m + err):
    2 (N - 1) u m + 1.01 u m + u err <= 2 N u m + u err <= err / (2 (1 - u)) + u err < err. So S
    lies in [fl(s - err), fl(s + err)]. Rounding is monotonic: when both ends round to the same
    value, so does S, and that value is the correctly rounded result. Guards: m in [2**-960,
    2**1000] (err does not underflow, s does not overflow; m is NaN or inf, and fails it, whenever
    a factor or the bias is inf or NaN: |inf y| is inf or NaN, and sums of such terms stay so),
    |s| > err (else the exact path decides, and knows the sign of a zero).

    For float32 results both ends are rounded by the hardware's float64 -> float32 conversion:
    round-to-nearest-even with float32's subnormals and overflow to inf, i.e. ``round_to(x, 24,
    -126, 127)`` for every float64 x (one rounding of x itself, as round_to does), for a fraction
    of round_to's cost; the other formats use round_to."""
    s, m = _dot_mag(a, b, n)
    return decide(s, m, n, bias, has_bias, prec, emin, emax)


@jit(inline="always")
def decide(s, m, n, bias, has_bias, prec, emin, emax):
    """:func:`fast_element` from ``(s, m)`` = :func:`_dot_mag` of its n products."""
    if has_bias:
        s += bias
        m += abs(bias)
    if 2.0**-960 <= m <= 2.0**1000:
        err = fast_bound(n + 1, m)
        if abs(s) > err:
            if prec == 24 and emin == -126 and emax == 127:  # float32: the conversion is that rounding
                lo = np.float64(np.float32(s - err))
                hi = np.float64(np.float32(s + err))
            else:
                lo = round_to(s - err, prec, emin, emax)
                hi = round_to(s + err, prec, emin, emax)
            if lo == hi:
                return lo
    return np.nan


@jit(inline="always")
def fast_ok(method, narrow, prec):
    """Whether :func:`fast_element` applies: ``exact`` on float32-or-narrower factors, <= 26-bit results."""
    return method == EXACT and narrow and prec <= 26


@jit(parallel=True)
def _conv2d_kernel(X, W2, bias, has_bias, out, mag, want_mag, groups, kh, kw, sh, sw, dh, dw, method, narrow, prec,
                   emin, emax, stw, cw):  # fmt: skip
    """out[n, co, y, x] = bias[co] + sum_{ci, ky, kx} W[co, ci, ky, kx] X[n, g cin + ci, y sh + ky dh, x sw + kx dw]
    with X already padded; W2 = W reshaped (C_out, K); stw: (max, min nonzero) |bits| per filter.
    A task is one output row of one (image, group); it gathers the patches of ``cw`` consecutive
    output columns, then reduces every filter against all of them, so that a filter is read once
    per chunk of columns rather than once per column (a long filter, as grad_weight's adjoint
    call has, stays in cache for the chunk instead of streaming from memory per element). With
    ``want_mag`` (compare's magnitudes M), the fast path's own sum of |terms| is stored where it ran
    (:func:`_dot_mag`: the same float64 sum as :func:`~refkern.kernels._element.abs_sum`, any order, the
    same error bound), not computed a second time."""
    nn, c, _, _ = X.shape
    cout, k = W2.shape
    _, _, ho, wo = out.shape
    cin_g = c // groups
    cout_g = cout // groups
    fast = fast_ok(method, narrow, prec)
    for task in prange(nn * groups * ho):
        n = task // (groups * ho)
        g = (task // ho) % groups
        oy = task % ho
        bufs = np.empty((cw, k))
        mxs = np.empty(cw, np.int64)
        mns = np.empty(cw, np.int64)
        pend = np.empty(cw, np.int64)  # the columns the fast path left undecided
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        scratch = np.empty(BLOCK)
        for x0 in range(0, wo, cw):
            m = min(cw, wo - x0)
            for j in range(m):
                ox = x0 + j
                buf = bufs[j]
                q = 0
                mx = np.int64(0)
                mn = _INF_BITS
                for ci in range(cin_g):
                    for ky in range(kh):
                        row = X[n, g * cin_g + ci, oy * sh + ky * dh]
                        for kx in range(kw):
                            v = row[ox * sw + kx * dw]
                            buf[q] = v
                            q += 1
                            x = bits(v) & _ABS
                            mx = x if x > mx else mx
                            xn = x if x != 0 else _INF_BITS
                            mn = xn if xn < mn else mn
                mxs[j] = mx
                mns[j] = mn
            for co in range(g * cout_g, (g + 1) * cout_g):
                bc = bias[co] if has_bias else 0.0
                npend = 0
                for j in range(m):
                    r = np.nan
                    if fast:  # fast_element, keeping its magnitude: abs_sum's M, the same sum in any order
                        sj, mj = _dot_mag(W2[co], bufs[j], k)
                        r = decide(sj, mj, k, bc, has_bias, prec, emin, emax)
                        if want_mag:
                            mag[n, co, oy, x0 + j] = mj + abs(bc)
                    if r == r:
                        out[n, co, oy, x0 + j] = r
                    else:  # undecided (or another method): reduced below, out of the hot loop
                        pend[npend] = j
                        npend += 1
                for i in range(npend):
                    j = pend[i]
                    out[n, co, oy, x0 + j] = reduce_element(
                        W2[co], bufs[j], bc, has_bias, method, narrow,
                        stw[co, 0], stw[co, 1], mxs[j], mns[j], prec, emin, emax, acc, scratch,
                    )  # fmt: skip
                if want_mag and not fast:
                    for j in range(m):
                        mag[n, co, oy, x0 + j] = abs_sum(W2[co], bufs[j], bc)


@dataclass
class ConvOperands:
    """A convolution reduced to conv2d over a padded input: out[n, co, y, x] =
    bias[co] + sum_{ci, ky, kx} W[co, ci, ky, kx] X[n, g cin + ci, y sh + ky dh, x sw + kx dw]."""

    X: np.ndarray  # (N, C_in, Hp, Wp) float64, padded
    W: np.ndarray  # (C_out, C_in / groups, kh, kw) float64
    bias: np.ndarray | None  # (C_out,) float64
    groups: int
    stride: tuple
    dilation: tuple
    out_shape: tuple  # (N, C_out, Ho, Wo); conv3d: (N * D_out, C_out, Ho, Wo)
    nd: int
    unbatched: bool
    depth: int = 1  # conv3d: output depth D_out (kernel image n * D_out + z is depth z of image n)

    def result(self, out4):
        """The kernel's (N, C_out, Ho, Wo) output in the caller's layout (conv1d, conv3d, unbatched)."""
        if self.nd == 1:
            out4 = out4[:, :, 0, :]
        if self.nd == 3:
            nz, c_out, ho, wo = out4.shape
            out4 = out4.reshape(nz // self.depth, self.depth, c_out, ho, wo).transpose(0, 2, 1, 3, 4)
        if self.unbatched:
            out4 = out4[0]
        return np.ascontiguousarray(out4)


def run_conv_numba(p, c, want_mag=False):
    """The Numba kernel on prepared operands: (values, magnitudes or None), float64, in the caller's layout."""
    c_out = c.W.shape[0]
    W2 = np.ascontiguousarray(c.W.reshape(c_out, -1))
    stw = np.empty((c_out, 2), np.int64)
    row_stats(W2, stw)
    out = np.empty(c.out_shape)
    mag = np.empty(c.out_shape if want_mag else (1, 1, 1, 1))
    has_bias = c.bias is not None
    b = c.bias if has_bias else np.zeros(1)
    kh, kw = c.W.shape[2], c.W.shape[3]
    wo = c.out_shape[3]
    cw = max(1, min(wo, _CHUNK_BYTES // (8 * max(1, W2.shape[1]))))  # columns whose patches share a filter read
    _conv2d_kernel(
        c.X, W2, b, has_bias, out, mag, want_mag, c.groups, kh, kw, *c.stride, *c.dilation, *p.kernel_args, stw, cw
    )
    return c.result(out), (c.result(mag) if want_mag else None)
