"""Ground truth: the same reductions computed with mpmath, exactly, then rounded once.

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

__all__ = ["dot", "sum", "matmul", "linear", "conv1d", "conv2d", "exact_precision", "round_exact"]


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
    """Round ``(-1)**negative * man * 2**exp`` (man >= 0 an integer) once to ``fmt``.

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
