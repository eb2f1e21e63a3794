"""``refkern.conv_transpose1d/2d/3d``: torch semantics (stride, padding, output_padding, groups,
dilation, unbatched input), every output element reduced by a named method (correctly rounded
with the default ``accumulate="exact"``).

**What a transposed convolution sums.** Per spatial dimension (input size L, stride s, padding
p, dilation d, kernel size k, output_padding a), torch defines the output size
``L_out = (L - 1) s - 2 p + d (k - 1) + a + 1`` and scatters every product: input position i
with kernel tap t lands on output position ``o = i s - p + t d`` (dropped when outside
``[0, L_out)``). So output element o receives, per input channel ci of its group, the taps t with

    o + p - t d = i s,   0 <= i < L,

and nothing else: ``out[n, co, o] = bias[co] + sum_{ci, t valid} W[ci, co, t] x[n, ci, (o + p - t d) / s]``.

**As a convolution.** Insert s - 1 zeros between the input samples (the stride-dilated input
``xs[i s] = x[i]``), pad it with ``q = d (k - 1) - p`` zeros on the left and ``q + a`` on the
right (crop where q < 0), and convolve with stride 1, dilation d and the flipped, transposed
weight ``W'[co, ci, t'] = W[ci, co, k - 1 - t']``: tap t' of output o reads ``xs[o + t' d - q]``,
and with ``t = k - 1 - t'`` that is ``xs[o + p - t d]``, nonzero exactly at the taps above. The
inserted and padded zeros add only zero products, so this convolution has the same value; but
``0 * inf`` is NaN and ``0 * w`` can turn a ``-0`` result into ``+0``, and on a stride-2 layer
three quarters of its products are zeros. The kernel therefore gathers only the valid taps (no
zero is multiplied): an output element's number of terms varies with its position (borders,
residues modulo the stride; with stride > d (k - 1) + 1 some elements have none and are the
bias, or +0). The analysis sees the op as that convolution, with absent taps as 0 * 0 terms.
"""

import dataclasses
from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from refkern import engines
from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.engines import filter as filt
from refkern.kernels._common import as_f64, finish, plan
from refkern.kernels._element import EXACT, abs_sum, reduce_element
from refkern.kernels.conv import _pair, _tuple_of, check_ranks, decide, dot_mag_rows, fast_ok

__all__ = ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "ConvTOperands", "convt_operands",
           "run_conv_transpose", "valid_taps"]  # fmt: skip

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

    def result(self, out5):
        """The kernel's (N, C_out, D, H, W) output in the caller's layout."""
        out = out5.reshape(out5.shape[:2] + out5.shape[5 - self.nd :])
        if self.unbatched:
            out = out[0]
        return np.ascontiguousarray(out)


def convt_operands(p, nd, stride, padding, output_padding, groups, dilation) -> ConvTOperands:
    """Validate and normalise a conv_transpose{nd}d call exactly as torch does."""
    op = p.op
    sx, sw = p.ops["input"].shape, p.ops["weight"].shape
    unbatched = check_ranks(op, nd, sx, sw, groups, "input", "C_in", "C_in, C_out / groups")
    c_in = sx[0] if unbatched else sx[1]
    if sw[0] != c_in:
        raise ValueError(
            f"{op}: weight.shape[0] must equal the input channels (a transposed convolution's weight is "
            f"(C_in, C_out / groups, ...)); got weight.shape={sw} and input.shape={sx} ({c_in} channels)."
        )
    if c_in % groups:
        raise ValueError(f"{op}: input channels must be divisible by groups; got {c_in} channels and groups={groups}.")
    c_out = sw[1] * groups
    if p.ops["bias"] is not None and p.ops["bias"].shape != (c_out,):
        raise ValueError(f"{op}: bias must have shape ({c_out},); got bias.shape={p.ops['bias'].shape}.")
    if isinstance(padding, str):
        raise ValueError(f"{op}: padding must be an int or {_tuple_of(nd)} (no 'same' or 'valid' for a transposed "
                         f"convolution); got padding={padding!r}.")  # fmt: skip
    stride = _pair(stride, "stride", op, nd, 1)
    dilation = _pair(dilation, "dilation", op, nd, 1)
    padding = _pair(padding, "padding", op, nd, 0)
    outpad = _pair(output_padding, "output_padding", op, nd, 0)
    if any(a >= s and a >= d for a, s, d in zip(outpad, stride, dilation)):
        raise ValueError(
            f"{op}: output_padding must be smaller than either stride or dilation; got output_padding={outpad}, "
            f"stride={stride} and dilation={dilation}."
        )
    ksize, in_size = tuple(sw[2:]), tuple(sx[-nd:])
    out_size = tuple((n - 1) * s - 2 * q + d * (k - 1) + a + 1
                     for n, s, q, d, k, a in zip(in_size, stride, padding, dilation, ksize, outpad))  # fmt: skip
    if any(o <= 0 for o in out_size):
        raise ValueError(
            f"{op}: the output size (L - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1 must be "
            f"positive; got {out_size} for input size {in_size}. Reduce the padding."
        )
    lead = 3 - nd
    X = as_f64(p.ops["input"])
    if unbatched:
        X = X[None]
    X = np.ascontiguousarray(X.reshape(X.shape[:2] + (1,) * lead + X.shape[2:]))
    W = np.ascontiguousarray(as_f64(p.ops["weight"]).reshape(sw[:2] + (1,) * lead + ksize))
    bias = as_f64(p.ops["bias"]) if p.ops["bias"] is not None else None
    one = (1,) * lead
    return ConvTOperands(X, W, bias, groups, one + stride, (0,) * lead + padding, one + dilation,
                         (X.shape[0], c_out, *one, *out_size), nd, unbatched)  # fmt: skip


def run_conv_transpose(p, c: ConvTOperands, want_mag=False, with_bias=True, rows=None, slots=None, engine="auto"):
    """The exact transposed convolution on prepared operands: (values, magnitudes or None), float64,
    in the caller's layout, by the filtering engine where ``engines.choose`` picks it (``engine``:
    "auto", "filter" or "numba"), else by the Numba kernel. ``rows`` (output rows per task) and
    ``slots`` (gathered filter sets kept per task) change only the Numba kernel's speed; None
    chooses them."""
    n, c_out = c.out_shape[:2]
    m = n * int(np.prod(c.out_shape[2:]))
    acc = "exact" if p.method == EXACT else "other"
    if engines.choose(engine, acc, m, c_out // c.groups, c.W[0].size, None, filterable=filt.applies(p)) == "filter":
        return filt.conv_transpose(p, c if with_bias else dataclasses.replace(c, bias=None), want_mag)
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


def _convt(op, nd, input, weight, bias, stride, padding, output_padding, groups, dilation, accumulate, accum_dtype,  # noqa: A002
           engine="auto"):  # fmt: skip
    engines.check_engine(op, engine, accumulate)
    if engine == "blas":
        raise ValueError(f"{op}: engine='blas' is not implemented for transposed convolutions; use 'filter' or "
                         "'numba'.")  # fmt: skip
    p = plan(op, {"input": input, "weight": weight, "bias": bias}, ("input", "weight"), accumulate, accum_dtype)
    c = convt_operands(p, nd, stride, padding, output_padding, groups, dilation)
    return finish(p, run_conv_transpose(p, c, engine=engine)[0])


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,  # noqa: A002
                     accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):  # fmt: skip
    """Reference ``torch.nn.functional.conv_transpose2d`` (and ``nn.ConvTranspose2d``).

    ``input``: (N, C_in, H, W) or unbatched (C_in, H, W); ``weight``: (C_in, C_out / groups, kh, kw)
    (torch's transposed layout); ``bias``: (C_out,). ``stride``, ``padding``, ``output_padding``,
    ``dilation``: an int, a pair, or a one-element tuple expanded to both dimensions.
    ``output_padding`` must be smaller than the stride or the dilation of its dimension, as torch
    requires; the output is ``(H - 1) sh - 2 ph + dh (kh - 1) + oph + 1`` high, likewise wide.

    With ``accumulate="exact"`` each output element is its bias plus the exact sum of the
    products that reach it (``weight[ci, co, ky, kx] * input[n, ci, iy, ix]`` with
    ``y = iy sh - ph + ky dh`` and ``x = ix sw - pw + kx dw``), rounded once to the result dtype.
    That is the convolution, stride 1 and dilation d, of the stride-dilated input padded with
    ``d (k - 1) - p`` zeros (plus ``output_padding`` at the end) with the flipped, transposed
    weight; the derivation is in :mod:`refkern.kernels.conv_transpose`. Only the products that
    reach an element are formed (no ``0 * inf``, no ``+0`` from an inserted zero), so the number
    of terms varies with the position. The other methods reduce in (ci, ky, kx) order over those
    products, bias last, in ``accum_dtype``.

    ``engine``: ``"numba"`` (the kernel above), ``"filter"`` (the equivalent convolution by
    :func:`refkern.engines.filter.conv_transpose`; float16/bfloat16/float32 inputs, exact) or
    ``"auto"`` (the rule in :mod:`refkern.engines`). Both give bit-identical results.
    """
    return _convt("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups, dilation,
                  accumulate, accum_dtype, engine)  # fmt: skip


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,  # noqa: A002
                     accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):  # fmt: skip
    """Reference ``torch.nn.functional.conv_transpose1d``: ``input`` (N, C_in, L) or (C_in, L),
    ``weight`` (C_in, C_out / groups, k); otherwise as :func:`conv_transpose2d`."""
    return _convt("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups, dilation,
                  accumulate, accum_dtype, engine)  # fmt: skip


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,  # noqa: A002
                     accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):  # fmt: skip
    """Reference ``torch.nn.functional.conv_transpose3d``: ``input`` (N, C_in, D, H, W) or
    (C_in, D, H, W), ``weight`` (C_in, C_out / groups, kd, kh, kw); otherwise as
    :func:`conv_transpose2d` (terms in (ci, kz, ky, kx) order)."""
    return _convt("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups, dilation,
                  accumulate, accum_dtype, engine)  # fmt: skip
