"""Ground truth of the sums of products (dot, sum, matmul, linear, the convolutions): mpmath, exactly, rounded once.

Nothing here is shared with the fast path's summation: the exact value is an ``mpf``
built by mpmath at a working precision derived from the inputs (never mpmath's default
53 bits, which silently drops terms), and the single rounding to the result format is
done on Python integers by :func:`round_exact`.

Why the precision is exact: a finite binary64 ``a = ma * 2**ea`` (frexp, ``0.5 <= |ma| < 1``)
has all its bits at weights ``>= 2**(ea - 53)``, so the product of two lies on the grid
``2**(ea + eb - 106)`` below ``2**(ea + eb)``, and any partial sum of n such terms lies
on the grid of the lowest term and below ``n * 2**max(ea + eb)``. With
``prec >= max(ea + eb) - min(ea + eb - 106) + bit_length(n) + 2`` every mpmath product
and sum is exact.
"""

import math

import mpmath
import numpy as np

from refkern._arrays import operand, result, same_dtype
from refkern.accumulate.formats import Format

__all__ = ["dot", "sum", "matmul", "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "exact_precision", "round_exact"]


def _terms_dot(a, b):
    return list(zip(a.tolist(), b.tolist()))


def _terms_sum(x):
    return [(v, 1.0) for v in x.tolist()]


def exact_precision(terms) -> int:
    """Bits of mpmath precision that make the sum of the products in ``terms`` exact."""
    lo, hi = None, None
    for a, b in terms:
        if a == 0 or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
            continue
        e = math.frexp(a)[1] + math.frexp(b)[1]
        lo = e - 106 if lo is None else min(lo, e - 106)
        hi = e if hi is None else max(hi, e)
    if lo is None:
        return 53
    return max(53, hi - lo + len(terms).bit_length() + 2)


def round_exact(negative: bool, man: int, exp: int, fmt: Format) -> float:
    """Round ``(-1)**negative * man * 2**exp`` (man >= 0 an integer) once to ``fmt``. Written here again, not
    taken from :func:`refkern.kernels._exact_real.round_dyadic`, on purpose: the truth shares no numerics with the
    fast path it checks.

    Round to nearest, ties to even; subnormal grid ``2**(emin - prec + 1)``; +-inf when the
    value rounded with an unbounded exponent reaches ``2**(emax + 1)``; a nonzero value
    that rounds to zero keeps its sign. The result is a float64 holding the value exactly.
    """
    if man == 0:
        return 0.0
    top = exp + man.bit_length() - 1
    lsb = max(top - fmt.prec + 1, fmt.emin - fmt.prec + 1)
    shift = lsb - exp
    if shift <= 0:
        m = man << -shift
    else:
        m = man >> shift
        rest = man - (m << shift)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and m & 1):
            m += 1
    if m == 0:
        return -0.0 if negative else 0.0
    if m.bit_length() - 1 + lsb > fmt.emax:
        return -math.inf if negative else math.inf
    v = math.ldexp(m, lsb)  # m <= 2**53: exact
    return -v if negative else v


def _exact_sum_of_products(terms, fmt: Format, precision) -> float:
    nan = pinf = ninf = False
    finite = []
    all_neg_zero = len(terms) > 0
    for a, b in terms:
        if math.isnan(a) or math.isnan(b):
            nan = True
        elif math.isinf(a) or math.isinf(b):
            if a == 0 or b == 0:
                nan = True  # 0 * inf
            elif (a > 0) == (b > 0):
                pinf = True
            else:
                ninf = True
        else:
            finite.append((a, b))
        if not ((a == 0 or b == 0) and math.copysign(1.0, a) != math.copysign(1.0, b)):
            all_neg_zero = False  # this term is not -0 (decided on the factors: a*b may underflow)
    if nan or (pinf and ninf):
        return math.nan
    if pinf or ninf:
        return math.inf if pinf else -math.inf
    prec = exact_precision(finite) if precision is None else int(precision)
    with mpmath.workprec(prec):
        s = mpmath.mpf(0)
        for a, b in finite:
            s += mpmath.mpf(a) * mpmath.mpf(b)
        sign, man, exp, _ = s._mpf_ if s != 0 else (0, 0, 0, 0)
    if man == 0:
        return -0.0 if all_neg_zero else 0.0
    return round_exact(bool(sign), int(man), int(exp), fmt)


def dot(x, y, *, precision: int | None = None):
    """Ground truth of :func:`refkern.dot`: the exact dot product rounded once to the result dtype.

    ``precision`` (bits) overrides the derived exact precision; leave it None for an exact result.
    """
    a = operand(x, "x", "truth.dot")
    b = operand(y, "y", "truth.dot")
    if a.values.ndim != 1 or a.values.shape != b.values.shape:
        raise ValueError(
            f"truth.dot: expected 1-D inputs of equal length; got x.shape={a.shape} and y.shape={b.shape}."
        )
    same_dtype("truth.dot", {"x": a, "y": b})
    fmt = a.fmt
    value = _exact_sum_of_products(_terms_dot(a.values, b.values), fmt, precision)
    return result(value, fmt, a.torch or b.torch)


def sum(x, *, precision: int | None = None):  # noqa: A001
    """Ground truth of :func:`refkern.sum`: the exact sum rounded once to the dtype of ``x``."""
    a = operand(x, "x", "truth.sum")
    value = _exact_sum_of_products(_terms_sum(a.values.reshape(-1)), a.fmt, precision)
    return result(value, a.fmt, a.torch)


def _finish(p, out):
    from refkern.kernels._common import finish

    return finish(p, out)


def _gemm(p, A3, Bt3, ia, ib, bias, shape, precision):
    nb, m, n = len(ia), A3.shape[1], Bt3.shape[1]
    out = np.empty((nb, m, n))
    for t in range(nb):
        for i in range(m):
            for j in range(n):
                terms = list(zip(A3[ia[t], i].tolist(), Bt3[ib[t], j].tolist()))
                if bias is not None:
                    terms.append((float(bias[j]), 1.0))
                out[t, i, j] = _exact_sum_of_products(terms, p.out, precision)
    return _finish(p, out.reshape(shape))


def matmul(a, b, *, precision: int | None = None):
    """Ground truth of :func:`refkern.matmul`: each element summed exactly with mpmath, rounded once."""
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import matmul_operands

    p = plan("truth.matmul", {"a": a, "b": b}, ("a", "b"), "exact", None)
    A3, Bt3, ia, ib, shape = matmul_operands(p)
    return _gemm(p, A3, Bt3, ia, ib, None, shape, precision)


def linear(x, weight, bias=None, *, precision: int | None = None):
    """Ground truth of :func:`refkern.linear` (the bias is a term of the exact sum)."""
    from refkern.kernels._common import plan
    from refkern.kernels.gemm import linear_operands

    p = plan("truth.linear", {"x": x, "weight": weight, "bias": bias}, ("x", "weight"), "exact", None)
    X, W, b, shape = linear_operands(p)
    zero = np.zeros(1, np.int64)
    return _gemm(p, X, W, zero, zero, b, shape, precision)


def _conv(op, nd, x, weight, bias, stride, padding, dilation, groups, padding_mode, precision):
    from refkern.kernels._common import plan
    from refkern.kernels.conv import conv_operands

    p = plan(op, {"x": x, "weight": weight, "bias": bias}, ("x", "weight"), "exact", None)
    c = conv_operands(p, nd, stride, padding, dilation, groups, padding_mode)
    nn, c_out, ho, wo = c.out_shape
    cin_g = c.X.shape[1] // c.groups
    cout_g = c_out // c.groups
    kh, kw = c.W.shape[2], c.W.shape[3]
    (sh, sw), (dh, dw) = c.stride, c.dilation
    out = np.empty(c.out_shape)
    for n in range(nn):
        for co in range(c_out):
            g = co // cout_g
            for y in range(ho):
                for x_ in range(wo):
                    terms = [
                        (float(c.W[co, ci, ky, kx]), float(c.X[n, g * cin_g + ci, y * sh + ky * dh, x_ * sw + kx * dw]))
                        for ci in range(cin_g)
                        for ky in range(kh)
                        for kx in range(kw)
                    ]
                    if c.bias is not None:
                        terms.append((float(c.bias[co]), 1.0))
                    out[n, co, y, x_] = _exact_sum_of_products(terms, p.out, precision)
    return _finish(p, c.result(out))


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros", *,
           precision: int | None = None):  # fmt: skip
    """Ground truth of :func:`refkern.conv2d`, element by element with mpmath."""
    return _conv("truth.conv2d", 2, x, weight, bias, stride, padding, dilation, groups, padding_mode, precision)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros", *,
           precision: int | None = None):  # fmt: skip
    """Ground truth of :func:`refkern.conv1d`, element by element with mpmath."""
    return _conv("truth.conv1d", 1, x, weight, bias, stride, padding, dilation, groups, padding_mode, precision)


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros", *,
           precision: int | None = None):  # fmt: skip
    """Ground truth of :func:`refkern.conv3d`, element by element with mpmath, from the padded 5-D
    input (not the depth-sliced conv2d form the fast path uses)."""
    from refkern.kernels._common import plan
    from refkern.kernels.conv import conv_padded

    p = plan("truth.conv3d", {"x": x, "weight": weight, "bias": bias}, ("x", "weight"), "exact", None)
    X, W, b, groups, (sd, sh, sw), (dd, dh, dw), unbatched = conv_padded(p, 3, stride, padding, dilation, groups,
                                                                          padding_mode)  # fmt: skip
    nn, c_in = X.shape[:2]
    c_out, cin_g, kd, kh, kw = W.shape
    cout_g = c_out // groups
    size = [(X.shape[2 + i] - d * (k - 1) - 1) // s + 1 for i, (d, k, s) in enumerate(((dd, kd, sd), (dh, kh, sh),
                                                                                       (dw, kw, sw)))]  # fmt: skip
    out = np.empty((nn, c_out, *size))
    for n in range(nn):
        for co in range(c_out):
            g = co // cout_g
            for z in range(size[0]):
                for y in range(size[1]):
                    for x_ in range(size[2]):
                        terms = [
                            (float(W[co, ci, a, b_, e]),
                             float(X[n, g * cin_g + ci, z * sd + a * dd, y * sh + b_ * dh, x_ * sw + e * dw]))
                            for ci in range(cin_g) for a in range(kd) for b_ in range(kh) for e in range(kw)
                        ]  # fmt: skip
                        if b is not None:
                            terms.append((float(b[co]), 1.0))
                        out[n, co, z, y, x_] = _exact_sum_of_products(terms, p.out, precision)
    return _finish(p, out[0] if unbatched else out)


def _conv_transpose(op, nd, input, weight, bias, stride, padding, output_padding, groups, dilation, precision):  # noqa: A002
    """torch's definition, scattered: input position i and tap t add weight * input to output
    position i * s - p + t * d of every spatial dimension (dropped outside the output)."""
    import itertools

    from refkern.kernels._common import plan
    from refkern.kernels.conv_transpose import convt_operands

    p = plan(op, {"input": input, "weight": weight, "bias": bias}, ("input", "weight"), "exact", None)
    c = convt_operands(p, nd, stride, padding, output_padding, groups, dilation)
    X, W = c.X, c.weight
    nn, c_in = X.shape[:2]
    cout_g = W.shape[1]
    cin_g = c_in // c.groups
    osz = c.out_shape[2:]
    terms = {}
    for n, ci in itertools.product(range(nn), range(c_in)):
        g = ci // cin_g
        for i in itertools.product(*(range(s) for s in X.shape[2:])):
            for t in itertools.product(*(range(k) for k in W.shape[2:])):
                o = tuple(i[a] * c.stride[a] - c.padding[a] + t[a] * c.dilation[a] for a in range(3))
                if not all(0 <= o[a] < osz[a] for a in range(3)):
                    continue
                for co in range(cout_g):
                    terms.setdefault((n, g * cout_g + co, *o), []).append((float(W[(ci, co, *t)]),
                                                                           float(X[(n, ci, *i)])))  # fmt: skip
    out = np.empty(c.out_shape)
    for idx in np.ndindex(*c.out_shape):
        ts = list(terms.get(idx, []))
        if c.bias is not None:
            ts.append((float(c.bias[idx[1]]), 1.0))
        out[idx] = _exact_sum_of_products(ts, p.out, precision)
    return _finish(p, c.result(out))


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,  # noqa: A002
                     precision: int | None = None):  # fmt: skip
    """Ground truth of :func:`refkern.conv_transpose1d`: torch's scatter definition, summed with mpmath."""
    return _conv_transpose("truth.conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups,
                           dilation, precision)  # fmt: skip


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,  # noqa: A002
                     precision: int | None = None):  # fmt: skip
    """Ground truth of :func:`refkern.conv_transpose2d`: torch's scatter definition, summed with mpmath."""
    return _conv_transpose("truth.conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups,
                           dilation, precision)  # fmt: skip


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,  # noqa: A002
                     precision: int | None = None):  # fmt: skip
    """Ground truth of :func:`refkern.conv_transpose3d`: torch's scatter definition, summed with mpmath."""
    return _conv_transpose("truth.conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups,
                           dilation, precision)  # fmt: skip
