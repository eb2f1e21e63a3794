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

import numpy as np

from refkern import engines
from refkern._arrays import is_tensor
from refkern.engines import filter as filt
from refkern.engines import filter_conv
from refkern.kernels._common import as_f64, finish, plan
from refkern.kernels._conv_numba import (  # the kernels, re-exported: the engines import them from there
    ConvOperands,
    decide,
    dot_mag_rows,
    fast_bound,
    fast_element,
    fast_ok,
    run_conv_numba,
)
from refkern.kernels._element import EXACT
from refkern.ops._args import is_int as _is_int
from refkern.ops._args import spatial as _pair  # the ground truth's gradients read it there too
from refkern.ops._args import tuple_of as _tuple_of

__all__ = ["conv1d", "conv2d", "conv3d", "conv_operands", "ConvOperands", "run_conv", "run_conv_numba", "check_ranks",
           "decide", "dot_mag_rows", "fast_element", "fast_ok", "fast_bound"]  # fmt: skip

_PAD_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


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
        return finish(p, filter_conv.conv(p, c, device=device)[0])
    return finish(p, run_conv_numba(p, c)[0])


def run_conv(p, c, want_mag=False, device=None):
    """The exact convolution on prepared operands: (values, magnitudes or None), float64, in the
    caller's layout, by the filtering engine where ``engines.choose`` picks it for ``engine="auto"``,
    else by the Numba kernel (:func:`run_conv_numba`). Same values; magnitudes within gamma_K."""
    n, c_out, ho, wo = c.out_shape
    acc = "exact" if p.method == EXACT else "other"
    if engines.choose("auto", acc, n * ho * wo, c_out // c.groups, c.W[0].size, device,
                      filterable=filt.applies(p)) == "filter":  # fmt: skip
        return filter_conv.conv(p, c, want_mag, device)
    return run_conv_numba(p, c, want_mag)


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
    :func:`refkern.engines.filter_conv.conv`; float16/bfloat16/float32 inputs), ``"blas"`` (im2col in
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
