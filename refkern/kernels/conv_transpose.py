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

import numpy as np

from refkern import engines
from refkern.engines import filter as filt
from refkern.engines import filter_conv
from refkern.kernels._common import as_f64, finish, plan
from refkern.kernels._convt_numba import ConvTOperands, run_convt_numba, valid_taps  # re-exported
from refkern.kernels._element import EXACT
from refkern.kernels.conv import check_ranks
from refkern.ops._args import spatial as _pair
from refkern.ops._args import tuple_of as _tuple_of

__all__ = ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "ConvTOperands", "convt_operands",
           "run_conv_transpose", "valid_taps"]  # fmt: skip


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
    "auto", "filter" or "numba"), else by the Numba kernel (:func:`run_convt_numba`). ``rows`` (output
    rows per task) and ``slots`` (gathered filter sets kept per task) change only the Numba kernel's
    speed; None chooses them."""
    n, c_out = c.out_shape[:2]
    m = n * int(np.prod(c.out_shape[2:]))
    acc = "exact" if p.method == EXACT else "other"
    if engines.choose(engine, acc, m, c_out // c.groups, c.W[0].size, None, filterable=filt.applies(p)) == "filter":
        return filter_conv.conv_transpose(p, c if with_bias else dataclasses.replace(c, bias=None), want_mag)
    return run_convt_numba(p, c, want_mag, with_bias, rows, slots)


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
    :func:`refkern.engines.filter_conv.conv_transpose`; float16/bfloat16/float32 inputs, exact) or
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
