"""The transposed convolution's prepared operands and its Numba kernel: what the wrappers
(:mod:`refkern.kernels.conv_transpose`, whose docstring derives the kernel) and the engines (the
filter's fallback) share. Imports no engine: the engines call it, and the wrappers call the engines."""

from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.kernels._conv_numba import decide, dot_mag_rows, fast_ok
from refkern.kernels._element import abs_sum, reduce_element

__all__ = ["ConvTOperands", "valid_taps", "run_convt_numba"]


_ABS = np.int64(0x7FFFFFFFFFFFFFFF)


_INF_BITS = np.int64(0x7FF0000000000000)


@jit(inline="always")
def _taps(o, p, d, s, size, k, taps, pos):
    """The taps t with o + p - t d = i s, 0 <= i < size, into taps[:m] (and i into pos[:m]); m."""
    m = 0
    for t in range(k):
        r = o + p - t * d
        if r >= 0 and r % s == 0 and r // s < size:
            taps[m] = t
            pos[m] = r // s
            m += 1
    return m


@jit(inline="always")
def _stats(v, mx, mn):
    """(max |bits|, min nonzero |bits|) updated with v (min is +inf's bits while all are zero)."""
    x = bits(v) & _ABS
    xn = x if x != 0 else _INF_BITS
    return (x if x > mx else mx), (xn if xn < mn else mn)


@jit(parallel=True)
def _convt_kernel(X, Wt, bias, has_bias, out, mag, want_mag, groups, st, pd, dl, ycls, xcls, slots, rows, method,
                  narrow, prec, emin, emax):  # fmt: skip
    """out[n, oc, z, y, x] = bias + sum over ci and the valid taps (kz, ky, kx) (module docstring) of
    Wt[oc, ci, kz, ky, kx] X[n, g cin + ci, iz, iy, ix], in (ci, kz, ky, kx) order, with Wt torch's
    weight regrouped per output channel (C_out, C_in / groups, kd, kh, kw), so that gathering one
    filter reads it in order. X is first copied channels-last (N, D, H, W, C), so that gathering an
    element's inputs reads one contiguous run of channels per tap instead of one value per channel
    plane. A task is ``rows`` output rows of one (image, group, depth); it keeps the gathered filters
    of the sets of valid (y, x) taps (set id ``ycls[y] * (max xcls + 1) + xcls[x]``) in ``slots``
    slots (set i in slot i % slots), so it gathers the filters once per set, not once per element
    (nor once per row: on a stride-2 layer the y taps alternate row by row).

    Exact on float32-or-narrower factors: :func:`~refkern.kernels.conv.fast_element` first, for
    every filter of an element; the filters it leaves undecided (rare) are reduced after them by
    :func:`~refkern.kernels._element.reduce_element`, with the inputs' exponent range computed then,
    so the hot loop holds neither the exact path nor a pass over the inputs for their exponents.
    The other methods go through reduce_element for every filter."""
    nn, c, dd, hh, ww = X.shape
    _, cin_g, kd, kh, kw = Wt.shape
    _, cout, do, ho, wo = out.shape
    cout_g = cout // groups
    kmax = max(cin_g * kd * kh * kw, 1)
    nblk = (ho + rows - 1) // rows
    nxc = xcls.max() + 1
    fast = fast_ok(method, narrow, prec)
    XC = np.empty((nn, dd, hh, ww, c))
    for r in prange(nn * dd * hh):  # channels-last copy, one input row of every channel per task
        i, z, y = r // (dd * hh), (r // hh) % dd, r % hh
        for ch in range(c):
            for x in range(ww):
                XC[i, z, y, x, ch] = X[i, ch, z, y, x]
    for task in prange(nn * groups * do * nblk):
        n = task // (groups * do * nblk)
        g = (task // (do * nblk)) % groups
        oz = (task // nblk) % do
        y0 = (task % nblk) * rows
        buf = np.empty(kmax)
        wbuf = np.empty((slots, cout_g, kmax))
        stw = np.empty((slots, cout_g, 2), np.int64)
        held = np.full(slots, -1, np.int64)  # the tap set in each slot
        pend = np.empty(cout_g, np.int64)  # the filters the fast path left undecided
        sm = np.empty((cout_g, 2))  # each filter's float64 sum and magnitude for the current element
        acc = np.empty(SIZE, np.int64)
        acc_init(acc)
        scratch = np.empty(BLOCK)
        tz, iz = np.empty(kd, np.int64), np.empty(kd, np.int64)
        ty, iy = np.empty(kh, np.int64), np.empty(kh, np.int64)
        tx, ix = np.empty(kw, np.int64), np.empty(kw, np.int64)
        nz = _taps(oz, pd[0], dl[0], st[0], dd, kd, tz, iz)
        orow = np.empty((cout_g, wo))  # one output row of every filter: written out contiguously per channel
        mrow = np.empty((cout_g, wo) if want_mag else (1, 1))
        for oy in range(y0, min(y0 + rows, ho)):
            ny = _taps(oy, pd[1], dl[1], st[1], hh, kh, ty, iy)
            for ox in range(wo):
                nx = _taps(ox, pd[2], dl[2], st[2], ww, kw, tx, ix)
                nt = nz * ny * nx
                k = cin_g * nt
                sid = ycls[oy] * nxc + xcls[ox]
                cx = sid % slots
                if held[cx] != sid:  # a new tap set: gather every filter's weights for it, with their stats
                    held[cx] = sid
                    for co in range(cout_g):
                        q = 0
                        mx = np.int64(0)
                        mn = _INF_BITS
                        for ci in range(cin_g):
                            for a in range(nz):
                                for b in range(ny):
                                    for e in range(nx):
                                        v = Wt[g * cout_g + co, ci, tz[a], ty[b], tx[e]]
                                        wbuf[cx, co, q] = v
                                        q += 1
                                        mx, mn = _stats(v, mx, mn)
                        stw[cx, co, 0] = mx
                        stw[cx, co, 1] = mn
                t = 0  # the inputs in (ci, kz, ky, kx) order: tap t of channel ci at ci * nt + t
                for a in range(nz):
                    for b in range(ny):
                        for e in range(nx):
                            src = XC[n, iz[a], iy[b], ix[e]]
                            for ci in range(cin_g):
                                buf[ci * nt + t] = src[g * cin_g + ci]
                            t += 1
                npend = 0
                if fast:
                    dot_mag_rows(wbuf[cx], buf, k, sm)
                for co in range(cout_g):
                    bc = bias[g * cout_g + co] if has_bias else 0.0
                    r = decide(sm[co, 0], sm[co, 1], k, bc, has_bias, prec, emin, emax) if fast else np.nan
                    if r == r:
                        orow[co, ox] = r
                    else:  # undecided (or another method): reduced below, out of the hot loop
                        pend[npend] = co
                        npend += 1
                if npend:
                    mx = np.int64(0)
                    mn = _INF_BITS
                    for q in range(k):
                        mx, mn = _stats(buf[q], mx, mn)
                    for i in range(npend):
                        co = pend[i]
                        bc = bias[g * cout_g + co] if has_bias else 0.0
                        orow[co, ox] = reduce_element(
                            wbuf[cx, co, :k], buf[:k], bc, has_bias, method, narrow, stw[cx, co, 0], stw[cx, co, 1],
                            mx, mn, prec, emin, emax, acc, scratch,
                        )  # fmt: skip
                if want_mag:  # the fast path's magnitudes where it ran: abs_sum's M, the same sum in any order
                    for co in range(cout_g):
                        bc = bias[g * cout_g + co] if has_bias else 0.0
                        mrow[co, ox] = sm[co, 1] + abs(bc) if fast else abs_sum(wbuf[cx, co, :k], buf[:k], bc)
            for co in range(cout_g):  # channel after channel: each a contiguous row of out, not one line per value
                out[n, g * cout_g + co, oz, oy, :] = orow[co]
                if want_mag:
                    mag[n, g * cout_g + co, oz, oy, :] = mrow[co]


def valid_taps(o, p, d, s, size, k) -> np.ndarray:
    """Boolean (len(o), k): tap t reaches output position o (module docstring), numpy."""
    r = np.asarray(o, np.int64)[:, None] + p - np.arange(k)[None, :] * d
    return (r >= 0) & (r % s == 0) & (r // s < size)


@dataclass
class ConvTOperands:
    """A transposed convolution in 3-D form (1-D and 2-D calls get unit leading dimensions)."""

    X: np.ndarray  # (N, C_in, D, H, W) float64
    weight: np.ndarray  # (C_in, C_out / groups, kd, kh, kw) float64, torch's layout
    bias: np.ndarray | None  # (C_out,)
    groups: int
    stride: tuple  # 3 ints each, as the kernel sees them
    padding: tuple
    dilation: tuple
    out_shape: tuple  # (N, C_out, D_out, H_out, W_out)
    nd: int
    unbatched: bool

    @property
    def W(self) -> np.ndarray:
        """The weight as the equivalent convolution's (C_out, C_in / groups, kd * kh, kw) filters, taps
        in torch's (unflipped) order: the layout of :meth:`Problem.terms` rows."""
        c_in, cout_g = self.weight.shape[:2]
        g = self.groups
        w = self.weight.reshape(g, c_in // g, cout_g, -1).transpose(0, 2, 1, 3)
        kd, kh, kw = self.weight.shape[2:]
        return w.reshape(g * cout_g, c_in // g, kd * kh, kw)

    def as_convolution(self):
        """The equivalent convolution (:mod:`refkern.kernels.conv_transpose`'s derivation) as conv2d over depth
        slices, the form :func:`refkern.kernels.conv.conv_operands` gives a conv3d: the stride-dilated input,
        padded by ``d (k - 1) - p`` zeros before it and to the output's length after it (cropped where negative),
        convolved with stride 1, dilation d and the flipped, transposed weight ``W'[co, ci, t'] = W[ci, co, k - 1
        - t']``; image ``n * D_out + z`` is output depth z of image n, its input channels the pairs (ci, kz).
        Every element's value is the transposed convolution's; the inserted zeros add zero products (0 * inf is
        NaN and 0 * w can turn a -0 result into +0: a caller with such inputs or zero results takes the products
        that reach an element instead). Memory: the dilated input, stride**nd times the input, as float64."""
        from refkern.kernels._conv_numba import ConvOperands

        n_img, c_out = self.out_shape[:2]
        c_in = self.X.shape[1]
        ksize = self.weight.shape[2:]
        steps, pads, crops = [], [], []
        for a in range(3):
            size, s, q, d, k = self.X.shape[2 + a], self.stride[a], self.padding[a], self.dilation[a], ksize[a]
            left = d * (k - 1) - q  # zeros before the dilated input (negative: crop)
            right = self.out_shape[2 + a] + d * (k - 1) - left - ((size - 1) * s + 1)
            steps.append(s)
            pads.append((max(left, 0), max(right, 0)))
            crops.append((max(-left, 0), max(-right, 0)))
        dil = np.zeros((n_img, c_in, *((self.X.shape[2 + a] - 1) * steps[a] + 1 for a in range(3))))
        dil[:, :, :: steps[0], :: steps[1], :: steps[2]] = self.X
        dil = np.pad(dil, [(0, 0), (0, 0), *pads])
        dil = dil[(slice(None), slice(None), *(slice(lo, dil.shape[2 + a] - hi) for a, (lo, hi) in enumerate(crops)))]
        g = self.groups
        w = self.W.reshape(c_out, c_in // g, *ksize)[:, :, ::-1, ::-1, ::-1]
        kd, do = ksize[0], self.out_shape[2]
        zi = np.arange(do)[:, None] + np.arange(kd)[None, :] * self.dilation[0]  # depth slices (conv.conv_operands)
        X2 = dil[:, :, zi].transpose(0, 2, 1, 3, 4, 5).reshape(n_img * do, c_in * kd, *dil.shape[3:])
        W2 = np.ascontiguousarray(w.reshape(c_out, (c_in // g) * kd, *ksize[1:]))
        return ConvOperands(np.ascontiguousarray(X2), W2, self.bias, g, (1, 1), tuple(self.dilation[1:]),
                            (n_img * do, c_out, *self.out_shape[3:]), 2, False, do)  # fmt: skip

    def result(self, out5):
        """The kernel's (N, C_out, D, H, W) output in the caller's layout."""
        out = out5.reshape(out5.shape[:2] + out5.shape[5 - self.nd :])
        if self.unbatched:
            out = out[0]
        return np.ascontiguousarray(out)


def run_convt_numba(p, c: ConvTOperands, want_mag=False, with_bias=True, rows=None, slots=None):
    """The Numba kernel on prepared operands: (values, magnitudes or None), float64, in the caller's
    layout. ``rows`` (output rows per task) and ``slots`` (gathered filter sets kept per task) change
    only its speed; None chooses them."""
    out = np.empty(c.out_shape)
    mag = np.empty(c.out_shape if want_mag else (1, 1, 1, 1, 1))
    has_bias = c.bias is not None and with_bias
    b = c.bias if has_bias else np.zeros(1)
    cls = []
    for a in (1, 2):  # the set of valid taps of every output row and column, as a class id
        valid = valid_taps(np.arange(c.out_shape[2 + a]), c.padding[a], c.dilation[a], c.stride[a], c.X.shape[2 + a],
                           c.weight.shape[2 + a])  # fmt: skip
        _, ids = np.unique(valid, axis=0, return_inverse=True)
        cls.append(np.ascontiguousarray(ids.reshape(-1), np.int64))
    n, c_out, do, ho, _ = c.out_shape
    filters = 8 * (c_out // c.groups) * max(1, c.W[0].size)  # bytes of one gathered set of filters
    if slots is None:  # a slot for every (y, x) tap set, at most 32 MiB per task
        slots = max(1, min((int(cls[0].max()) + 1) * (int(cls[1].max()) + 1), (1 << 25) // filters))
    if rows is None:
        rows = max(1, min(ho, (n * c.groups * do * ho) // (8 * numba.get_num_threads())))  # ~8 tasks per thread
    Wt = np.ascontiguousarray(c.W.reshape(c.W.shape[0], -1, *c.weight.shape[2:]))
    with numba.parallel_chunksize(1):  # tasks handed out one at a time: a thread slowed by other load takes fewer
        _convt_kernel(c.X, Wt, b, has_bias, out, mag, want_mag, c.groups, np.array(c.stride, np.int64),
                      np.array(c.padding, np.int64), np.array(c.dilation, np.int64), cls[0], cls[1], slots, rows,
                      *p.kernel_args)  # fmt: skip
    return c.result(out), (c.result(mag) if want_mag else None)
