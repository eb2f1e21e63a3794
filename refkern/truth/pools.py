"""Ground truth of the poolings: ``avg_pool1d``, ``avg_pool2d``, ``avg_pool3d``, ``max_pool1d``, ``max_pool2d``,
``adaptive_avg_pool1d``, ``adaptive_avg_pool2d``: exact window averages (and maxima), rounded once, on
the exact sums of :mod:`refkern.truth.reductions` (whose docstring says how)."""

import math
import operator

import numpy as np

from refkern._arrays import operand
from refkern.truth.reductions import (  # the exact sums, moments and extended values this family shares
    INF,
    NAN,
    _div_count,
    _f64,
    _finish,
    _out,
    _sum,
)

__all__ = ["avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "adaptive_avg_pool1d",
           "adaptive_avg_pool2d"]  # fmt: skip


def _pool_input(op: str, input, nd: int):  # noqa: A002
    """(operand, values as (N, C, *spatial) float64, unbatched?)."""
    x = operand(input, "input", op)
    shape = tuple(x.shape)
    if len(shape) not in (nd + 1, nd + 2) or 0 in shape[len(shape) - nd - 1 :]:
        names = {1: "(C, L) or (N, C, L)", 2: "(C, H, W) or (N, C, H, W)", 3: "(C, D, H, W) or (N, C, D, H, W)"}[nd]
        raise ValueError(
            f"{op}: input must have shape {names}, C and the spatial sizes nonzero; got input.shape={shape}."
        )
    v = _f64(x)
    unbatched = len(shape) == nd + 1
    return x, (v[None] if unbatched else v), unbatched


def _ints(op: str, name: str, value, nd: int, minimum: int) -> tuple:
    """An int or a sequence of ``nd`` ints (one int is repeated), each ``>= minimum``."""
    try:
        t = tuple(operator.index(v) for v in (value if isinstance(value, (tuple, list)) else (value,)))
    except TypeError:
        t = ()
    if len(t) == 1:
        t = t * nd
    if len(t) != nd or any(v < minimum for v in t):
        raise ValueError(f"{op}: {name} must be an int or {nd} ints, each >= {minimum}; got {name}={value!r}.")
    return t


def _stride(op, stride, kernel, nd):
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        return kernel  # torch's default
    return _ints(op, "stride", stride, nd, 1)


def _out_size(op: str, size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape: with ceil_mode the last window must start inside the input or
    the left padding."""
    if p > k // 2:
        raise ValueError(f"{op}: padding must be at most half of kernel_size; got padding={p} and kernel_size={k}.")
    o = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    if o < 1:
        raise ValueError(
            f"{op}: the output would be empty; got input size {size}, kernel_size={k}, stride={s}, "
            f"padding={p}, dilation={d}."
        )
    return o


def _pooled(x, v, unbatched, out_spatial, value):
    """Apply ``value(plane, index)`` for every (n, c) plane and output index; then the result."""
    import itertools

    nn, c = v.shape[:2]
    out = np.empty((nn, c, *out_spatial))
    for i, j in itertools.product(range(nn), range(c)):
        plane = v[i, j]
        for idx in itertools.product(*(range(o) for o in out_spatial)):
            out[(i, j, *idx)] = value(plane, idx)
    return _finish(out[0] if unbatched else out, x.fmt, x.torch)


def _avg_pool(op, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: A002
    x, v, unbatched = _pool_input(op, input, nd)
    k = _ints(op, "kernel_size", kernel_size, nd, 1)
    s = _stride(op, stride, k, nd)
    p = _ints(op, "padding", padding, nd, 0)
    if divisor_override is not None:
        divisor_override = operator.index(divisor_override)
        if divisor_override == 0:
            raise ValueError(f"{op}: divisor_override must be nonzero; got divisor_override=0.")
    sizes = v.shape[2:]
    osz = [_out_size(op, sizes[a], k[a], s[a], p[a], 1, ceil_mode) for a in range(nd)]
    spans = []  # per dim and output index: (first, last + 1 inside the input, count inside the padded input)
    for a in range(nd):
        dim = []
        for o in range(osz[a]):
            start = o * s[a] - p[a]
            end = min(start + k[a], sizes[a] + p[a])  # never past the padded input (ceil_mode's extra window)
            dim.append((max(start, 0), min(end, sizes[a]), end - start))
        spans.append(dim)

    def value(plane, idx):
        box = [spans[a][idx[a]] for a in range(nd)]
        window = plane[tuple(slice(lo, hi) for lo, hi, _ in box)].reshape(-1).tolist()
        if divisor_override is not None:
            divisor = divisor_override
        elif count_include_pad:
            divisor = math.prod(n for _, _, n in box)
        else:
            divisor = math.prod(hi - lo for lo, hi, _ in box)
        return _out(_div_count(_sum(window), divisor), x.fmt)

    return _pooled(x, v, unbatched, osz, value)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True):  # fmt: skip
    """Ground truth of ``F.avg_pool1d``: each output the exact window sum over the divisor, rounded once.

    Input ``(C, L)`` or ``(N, C, L)``. torch's output size (``ceil_mode``: the last window starts inside
    the input or the left padding) and divisor (``count_include_pad`` counts the padded zeros inside
    ``[-padding, L + padding)``, never the positions past it that ceil_mode's last window reaches).
    The sum is over the input elements of the window (padding adds nothing, so an all -0 window is -0);
    NaN and inf as :func:`sum`.
    """
    return _avg_pool("truth.avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override: int | None = None):  # fmt: skip
    """Ground truth of ``F.avg_pool2d`` (input ``(C, H, W)`` or ``(N, C, H, W)``): as :func:`avg_pool1d`
    per dim; the divisor is the product over both dims, or ``divisor_override`` when given."""
    return _avg_pool("truth.avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override: int | None = None):  # fmt: skip
    """Ground truth of ``F.avg_pool3d`` (input ``(C, D, H, W)`` or ``(N, C, D, H, W)``): as :func:`avg_pool1d`
    per dim; the divisor is the product over the three dims, or ``divisor_override`` when given."""
    return _avg_pool("truth.avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip


def _max_pool(op, nd, input, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: A002
    import itertools

    x, v, unbatched = _pool_input(op, input, nd)
    k = _ints(op, "kernel_size", kernel_size, nd, 1)
    s = _stride(op, stride, k, nd)
    p = _ints(op, "padding", padding, nd, 0)
    d = _ints(op, "dilation", dilation, nd, 1)
    sizes = v.shape[2:]
    osz = [_out_size(op, sizes[a], k[a], s[a], p[a], d[a], ceil_mode) for a in range(nd)]
    taps = [
        [[t for t in (o * s[a] - p[a] + j * d[a] for j in range(k[a])) if 0 <= t < sizes[a]] for o in range(osz[a])]
        for a in range(nd)
    ]  # the input positions of each window; padding is -inf, never chosen

    def value(plane, idx):
        best = -INF
        for pos in itertools.product(*(taps[a][idx[a]] for a in range(nd))):
            val = float(plane[pos])
            if math.isnan(val):
                return NAN
            if val > best:  # the first of equal values wins (-0 before +0 stays -0), as torch scans
                best = val
        return best

    return _pooled(x, v, unbatched, osz, value)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):  # noqa: A002
    """Ground truth of ``F.max_pool1d`` (input ``(C, L)`` or ``(N, C, L)``): the exact maximum of each window.

    A NaN in the window gives NaN; padding is -inf (a window wholly in the padding gives -inf); of
    equal maxima (+0 and -0) the first in scan order is returned, as torch's CPU kernel does.
    Output size as :func:`avg_pool1d`, with the dilated kernel ``dilation * (kernel_size - 1) + 1``.
    """
    return _max_pool("truth.max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):  # noqa: A002
    """Ground truth of ``F.max_pool2d`` (input ``(C, H, W)`` or ``(N, C, H, W)``), as :func:`max_pool1d`;
    the scan order is row-major over the window."""
    return _max_pool("truth.max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode)


def _adaptive(op, nd, input, output_size):  # noqa: A002
    x, v, unbatched = _pool_input(op, input, nd)
    sizes = v.shape[2:]
    given = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    if len(given) == 1:
        given = tuple(given) * nd
    if len(given) != nd:
        raise ValueError(f"{op}: output_size must be an int or {nd} ints (or None); got output_size={output_size!r}.")
    osz = []
    for a, o in enumerate(given):
        o = sizes[a] if o is None else operator.index(o)
        if o < 1:
            raise ValueError(f"{op}: output_size must be positive (or None); got output_size={output_size!r}.")
        osz.append(o)
    # torch's windows: start = floor(i * L / out), end = ceil((i + 1) * L / out)
    spans = [[(i * sizes[a] // osz[a], -(-(i + 1) * sizes[a] // osz[a])) for i in range(osz[a])] for a in range(nd)]

    def value(plane, idx):
        box = [spans[a][idx[a]] for a in range(nd)]
        window = plane[tuple(slice(lo, hi) for lo, hi in box)].reshape(-1).tolist()
        return _out(_div_count(_sum(window), len(window)), x.fmt)

    return _pooled(x, v, unbatched, osz, value)


def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    """Ground truth of ``F.adaptive_avg_pool1d``: output ``i`` averages ``x[floor(i L / out) : ceil((i + 1) L / out)]``
    exactly, rounded once. ``output_size`` None keeps the size."""
    return _adaptive("truth.adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """Ground truth of ``F.adaptive_avg_pool2d``: :func:`adaptive_avg_pool1d`'s windows in both dims; an
    entry None keeps that size."""
    return _adaptive("truth.adaptive_avg_pool2d", 2, input, output_size)
