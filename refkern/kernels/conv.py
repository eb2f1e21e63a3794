"""``refkern.conv1d``, ``refkern.conv2d`` and ``refkern.conv3d``: torch semantics (stride, padding including
"same"/"valid" and padding modes, dilation, groups, unbatched input), every output element
reduced by a named method (correctly rounded with the default ``accumulate="exact"``).

The Numba engine has no im2col: each task gathers one input patch (length K = C_in/groups *
kh * kw) into a buffer and reduces it against every filter of its group, so memory beyond
the inputs and outputs is O(threads * K). The BLAS engine (:func:`refkern.engines.blas.run_conv`)
unfolds chunks of images and runs exact GEMMs. Non-zero padding modes pad a copy of the
input first. conv3d is conv2d over depth slices: output depth z of image n is image
``n * D_out + z`` of a conv2d whose input channels are the pairs (ci, kz), holding input depth
``z * sd + kz * dd`` (a copy of the padded input, kd / sd times its size).
"""

from dataclasses import dataclass

import numpy as np
from numba import prange

from refkern import engines
from refkern._arrays import is_tensor
from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.exact import BLOCK
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import SIZE, acc_init
from refkern.engines import filter as filt
from refkern.kernels._common import as_f64, finish, plan
from refkern.kernels._element import EXACT, abs_sum, reduce_element, row_stats

__all__ = ["conv1d", "conv2d", "conv3d", "conv_operands", "ConvOperands", "run_conv", "run_conv_numba", "check_ranks",
           "decide", "dot_mag_rows", "fast_element", "fast_ok", "fast_bound"]  # fmt: skip

_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_INF_BITS = np.int64(0x7FF0000000000000)
_PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
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


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _tuple_of(nd):
    return "a tuple of 1 int" if nd == 1 else f"a tuple of 1 or {nd} ints"


def _pair(v, name, op, nd, minimum):
    """An int or a tuple of 1 or ``nd`` ints, each >= minimum, as a tuple of ``nd`` ints.

    As torch's convolutions do, a one-element tuple or list is expanded to every spatial
    dimension: ``conv2d(x, w, stride=(2,))`` is ``stride=(2, 2)``.
    """
    t = (v,) * nd if _is_int(v) else v
    if isinstance(t, (tuple, list)) and len(t) == 1:
        t = tuple(t) * nd
    if not isinstance(t, (tuple, list)) or len(t) != nd or not all(_is_int(i) for i in t):
        raise ValueError(f"{op}: {name} must be an int or {_tuple_of(nd)}; got {name}={v!r}.")
    if any(i < minimum for i in t):
        what = "positive" if minimum > 0 else "non-negative"
        raise ValueError(f"{op}: {name} must be {what}; got {name}={v!r}.")
    return tuple(int(i) for i in t)


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


def _conv(op, nd, x, weight, bias, stride, padding, dilation, groups, padding_mode, accumulate, accum_dtype,
          engine):  # fmt: skip
    engines.check_engine(op, engine, accumulate)
    p = plan(op, {"x": x, "weight": weight, "bias": bias}, ("x", "weight"), accumulate, accum_dtype)
    c = conv_operands(p, nd, stride, padding, dilation, groups, padding_mode)
    n, c_out, ho, wo = c.out_shape
    k = c.W[0].size
    device = next((t.device for t in (x, weight, bias) if is_tensor(t) and t.device.type != "cpu"), None)
    acc = "exact" if p.method == EXACT else "other"
    chosen = engines.choose(engine, acc, n * ho * wo, c_out // c.groups, k, device, filterable=filt.applies(p))
    if chosen == "blas":
        from refkern.engines.blas import run_conv as run_conv_blas

        formats = tuple(p.ops[o].fmt if p.ops[o] is not None else None for o in ("x", "weight", "bias"))
        return finish(p, run_conv_blas(p, c, formats, device))
    if chosen == "filter":
        return finish(p, filt.conv(p, c, device=device)[0])
    return finish(p, run_conv_numba(p, c)[0])


def run_conv(p, c, want_mag=False, device=None):
    """The exact convolution on prepared operands: (values, magnitudes or None), float64, in the
    caller's layout, by the filtering engine where ``engines.choose`` picks it for ``engine="auto"``,
    else by the Numba kernel (:func:`run_conv_numba`). Same values; magnitudes within gamma_K."""
    n, c_out, ho, wo = c.out_shape
    acc = "exact" if p.method == EXACT else "other"
    if engines.choose("auto", acc, n * ho * wo, c_out // c.groups, c.W[0].size, device,
                      filterable=filt.applies(p)) == "filter":  # fmt: skip
        return filt.conv(p, c, want_mag, device)
    return run_conv_numba(p, c, want_mag)


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


def conv_operands(p, nd, stride, padding, dilation, groups, padding_mode) -> ConvOperands:
    """Validate and normalise a conv1d/conv2d/conv3d call exactly as torch does."""
    X, W, bias, groups, stride, dilation, unbatched = conv_padded(p, nd, stride, padding, dilation, groups,
                                                                 padding_mode)  # fmt: skip
    c_out = W.shape[0]
    if nd == 1:  # conv1d is conv2d over a height of 1
        X, W = X[:, :, None, :], W[:, :, None, :]
        stride, dilation = (1, *stride), (1, *dilation)
    depth = 1
    if nd == 3:  # conv3d is conv2d over depth slices: channel ci * kd + kz of image n * D_out + z
        nn, c, dp = X.shape[:3]
        kd = W.shape[2]
        depth = (dp - dilation[0] * (kd - 1) - 1) // stride[0] + 1
        zi = (np.arange(depth) * stride[0])[:, None] + np.arange(kd)[None, :] * dilation[0]  # (D_out, kd)
        X = X[:, :, zi].transpose(0, 2, 1, 3, 4, 5).reshape(nn * depth, c * kd, *X.shape[3:])
        W = W.reshape(c_out, W.shape[1] * kd, *W.shape[3:])
        stride, dilation = stride[1:], dilation[1:]
    X = np.ascontiguousarray(X)
    W = np.ascontiguousarray(W)
    kh, kw = W.shape[2], W.shape[3]
    ho = (X.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (X.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return ConvOperands(X, W, bias, groups, stride, dilation, (X.shape[0], c_out, ho, wo), nd, unbatched, depth)


_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}
_KERNEL = {1: "k", 2: "kh, kw", 3: "kd, kh, kw"}


def check_ranks(op, nd, sx, sw, groups, x_name, channels, weight_axes) -> bool:
    """The checks every convolution (transposed or not) makes first, with torch's messages: the
    input's rank (``channels`` names its channel axis, ``x_name`` the argument), the weight's (its
    leading axes ``weight_axes``) and ``groups``; whether the input is unbatched."""
    spatial = _SPATIAL[nd]
    if len(sx) not in (nd + 1, nd + 2):
        fix = f" Add batch and channel axes: {x_name}[None, None]." if len(sx) == nd else ""
        raise ValueError(
            f"{op}: input must have shape (N, {channels}, {spatial}) or ({channels}, {spatial}); got shape {sx}.{fix}"
        )
    if len(sw) != nd + 2:
        raise ValueError(f"{op}: weight must have shape ({weight_axes}, {_KERNEL[nd]}); got weight.shape={sw}.")
    if not _is_int(groups) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int; got groups={groups!r}.")
    return len(sx) == nd + 1


def conv_padded(p, nd, stride, padding, dilation, groups, padding_mode):
    """Validate a conv{nd}d call as torch does: (X padded (N, C_in, *spatial), W (C_out, C_in / groups,
    *kernel), bias or None, groups, stride, dilation, unbatched), float64, the spatial dimensions
    as given (no conv2d reshaping): what :func:`conv_operands` and the ground truth start from."""
    op = p.op
    sx, sw = p.ops["x"].shape, p.ops["weight"].shape
    unbatched = check_ranks(op, nd, sx, sw, groups, "x", "C", "C_out, C_in / groups")
    c_in = sx[0] if unbatched else sx[1]
    c_out = sw[0]
    if c_in % groups or c_out % groups:
        raise ValueError(
            f"{op}: input channels and output channels must be divisible by groups; "
            f"got {c_in} input channels, {c_out} output channels and groups={groups}."
        )
    if sw[1] * groups != c_in:
        raise ValueError(
            f"{op}: expected weight.shape[1] * groups == input channels; got weight.shape={sw}, "
            f"groups={groups} and x.shape={sx} ({c_in} channels)."
        )
    if p.ops["bias"] is not None and p.ops["bias"].shape != (c_out,):
        raise ValueError(f"{op}: bias must have shape ({c_out},); got bias.shape={p.ops['bias'].shape}.")
    if padding_mode not in _PAD_MODES:
        choices = ", ".join(repr(m) for m in _PAD_MODES)
        raise ValueError(f"{op}: unknown padding_mode={padding_mode!r}; choose one of {choices}.")
    stride = _pair(stride, "stride", op, nd, 1)
    dilation = _pair(dilation, "dilation", op, nd, 1)
    ksize = tuple(sw[2:])
    in_size = tuple(sx[-nd:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(
                    f"{op}: padding='same' is not supported for strided convolutions; got stride={stride}."
                )
            pads = []
            for d, k in zip(dilation, ksize):
                total = d * (k - 1)  # torch puts the odd one on the right / bottom
                pads.append((total // 2, total - total // 2))
        else:
            raise ValueError(
                f"{op}: padding must be an int, {_tuple_of(nd)}, 'valid' or 'same'; got padding={padding!r}."
            )
    else:
        pads = [(q, q) for q in _pair(padding, "padding", op, nd, 0)]
    for (lo, hi), size in zip(pads, in_size):
        if padding_mode == "reflect" and max(lo, hi) >= size:
            raise ValueError(
                f"{op}: padding_mode='reflect' needs padding smaller than the input size; "
                f"got padding={pads} and input size {in_size}."
            )
        if padding_mode == "circular" and max(lo, hi) > size:
            raise ValueError(
                f"{op}: padding_mode='circular' needs padding at most the input size; "
                f"got padding={pads} and input size {in_size}."
            )
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(in_size, pads))
    eff = tuple(d * (k - 1) + 1 for d, k in zip(dilation, ksize))
    if any(e > s for e, s in zip(eff, padded)):
        raise ValueError(
            f"{op}: kernel size can't be greater than the padded input size; got padded input size {padded} "
            f"and dilated kernel size {eff}."
        )
    X = as_f64(p.ops["x"])
    if unbatched:
        X = X[None]
    W = as_f64(p.ops["weight"])
    if any(lo or hi for lo, hi in pads):
        X = np.pad(X, [(0, 0), (0, 0), *pads], mode=_PAD_MODES[padding_mode])
    bias = as_f64(p.ops["bias"]) if p.ops["bias"] is not None else None
    return X, W, bias, groups, stride, dilation, unbatched


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros", *,
           accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):  # fmt: skip
    """Reference ``torch.nn.functional.conv2d`` (and ``nn.Conv2d``'s ``padding_mode``).

    ``x``: (N, C_in, H, W) or unbatched (C_in, H, W); ``weight``: (C_out, C_in / groups, kh, kw);
    ``bias``: (C_out,). ``stride``, ``padding``, ``dilation``: an int, a pair, or a one-element
    tuple that torch expands to both dimensions (``stride=(2,)`` is ``(2, 2)``); ``padding`` also
    ``"valid"`` or ``"same"`` (stride 1; an odd total padding puts the extra row/column at the
    bottom/right, as torch does). ``padding_mode``: ``"zeros"``, ``"reflect"``,
    ``"replicate"`` or ``"circular"``, applied as ``nn.Conv2d`` applies it.

    With ``accumulate="exact"`` each output element is ``bias + sum over (ci, ky, kx) of
    weight * input``, computed exactly and rounded once to the result dtype; the other
    methods reduce in that (ci, ky, kx) order with the bias last, in ``accum_dtype``.

    ``engine``: ``"numba"`` (the kernel above), ``"filter"`` (float64 GEMMs per tap or over im2col
    patches, a rigorous bound per element, the undecided elements exact:
    :func:`refkern.engines.filter.conv`; float16/bfloat16/float32 inputs), ``"blas"`` (im2col in
    chunks of images, then exact Ozaki slice GEMMs on torch's BLAS, on the tensors' device;
    ``accumulate="exact"`` only) or ``"auto"`` (the rule in :mod:`refkern.engines`, with M = N *
    Ho * Wo, N = C_out / groups, K = C_in / groups * kh * kw). All give bit-identical results.
    """
    return _conv("conv2d", 2, x, weight, bias, stride, padding, dilation, groups, padding_mode, accumulate, accum_dtype,
                 engine)  # fmt: skip


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros", *,
           accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):  # fmt: skip
    """Reference ``torch.nn.functional.conv3d`` (and ``nn.Conv3d``'s ``padding_mode``).

    ``x``: (N, C_in, D, H, W) or unbatched (C_in, D, H, W); ``weight``: (C_out, C_in / groups, kd,
    kh, kw); ``bias``: (C_out,). ``stride``, ``padding``, ``dilation``: an int, a triple, or a
    one-element tuple that torch expands to the three dimensions; ``padding`` also ``"valid"`` or
    ``"same"`` (stride 1; an odd total padding puts the extra plane at the end, as torch does).
    ``padding_mode``: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.

    With ``accumulate="exact"`` each output element is ``bias + sum over (ci, kz, ky, kx) of
    weight * input``, computed exactly and rounded once to the result dtype; the other methods
    reduce in that (ci, kz, ky, kx) order with the bias last, in ``accum_dtype``.

    Computed as conv2d over depth slices (module docstring), by the same kernels and engines as
    :func:`conv2d`, with M = N * D_out * H_out * W_out and K = C_in / groups * kd * kh * kw.
    """
    return _conv("conv3d", 3, x, weight, bias, stride, padding, dilation, groups, padding_mode, accumulate, accum_dtype,
                 engine)  # fmt: skip


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros", *,
           accumulate: str = "exact", accum_dtype=None, engine: str = "auto"):  # fmt: skip
    """Reference ``torch.nn.functional.conv1d``: ``x`` (N, C_in, L) or (C_in, L), ``weight``
    (C_out, C_in / groups, k); otherwise as :func:`conv2d`."""
    return _conv("conv1d", 1, x, weight, bias, stride, padding, dilation, groups, padding_mode, accumulate, accum_dtype,
                 engine)  # fmt: skip
