"""One output element: ``bias + sum_k a[k] * b[k]`` by a named method, for the op kernels.

Every op kernel (matmul, linear, conv) reduces contiguous float64 operands ``a``, ``b``
of length K per output element, so this is the only place where methods are chosen.
For ``exact`` the caller passes the bit patterns of max|a|, min nonzero|a| (and for b),
computed once per row, so the fast bins need no pre-pass over the data:

* ``narrow`` (inputs were float32 or narrower): products are exact in float64 and
  :func:`~refkern.accumulate.exact.bins2` takes the whole row, block by block;
* otherwise float64 products use :func:`~refkern.accumulate.exact.bins3` where
  :func:`~refkern.accumulate.exact.wide_safe` allows it, and the term-by-term exact
  path elsewhere (inf/NaN, products that could overflow or underflow).

The bias is one more exact term, the result is rounded once, and an exactly zero result
is -0 only if every term (the bias included) is -0.
"""

import numpy as np

from refkern._jit import jit
from refkern.accumulate._bits import bits
from refkern.accumulate.exact import BLOCK, bins2, bins2_counts, bins3, product_bound, round_counts, wide_safe
from refkern.accumulate.methods import dot2, energy, kahan, naive, neumaier, pairwise
from refkern.accumulate.superacc import acc_add_float, acc_add_product, acc_has_special, acc_reset, acc_round

__all__ = ["METHOD_CODES", "EXACT", "NAIVE", "PAIRWISE", "ENERGY", "abs_sum", "reduce_element", "row_stats"]

NAIVE, PAIRWISE, KAHAN, NEUMAIER, DOT2, EXACT = 0, 1, 2, 3, 4, 5
ENERGY = 6  # not a summation method: the error scale of a left-to-right sum (analysis only)
METHOD_CODES = {
    "naive": NAIVE,
    "pairwise": PAIRWISE,
    "kahan": KAHAN,
    "neumaier": NEUMAIER,
    "dot2": DOT2,
    "exact": EXACT,
}

_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_INF_BITS = np.int64(0x7FF0000000000000)


@jit(inline="always")
def abs_bits(v):
    return bits(v) & _ABS


@jit
def row_stats(rows, stats):
    """stats[r] = (max |bits|, min nonzero |bits|) of each row of a 2-D float64 array
    (min is the bits of +inf for a row of zeros)."""
    for r in range(rows.shape[0]):
        mx = np.int64(0)
        mn = _INF_BITS
        row = rows[r]
        for k in range(row.size):
            x = bits(row[k]) & _ABS
            mx = x if x > mx else mx
            xn = x if x != 0 else _INF_BITS
            mn = xn if xn < mn else mn
        stats[r, 0] = mx
        stats[r, 1] = mn


@jit
def _all_terms_neg_zero(a, b, bias, has_bias):
    if has_bias and bits(bias) != np.int64(-0x8000000000000000):
        return False
    if a.size == 0 and not has_bias:
        return False
    for k in range(a.size):
        x = a[k]
        y = b[k]
        if not ((x == 0.0 or y == 0.0) and (bits(x) < 0) != (bits(y) < 0)):
            return False
    return True


@jit(fastmath={"reassoc", "contract"})
def abs_sum(a, b, bias):
    """sum_k |a[k] b[k]| + |bias| in float64: the magnitude M of the terms, for condition numbers
    and error bounds. Reassociation is allowed here, and only here: the terms are non-negative,
    so any order errs by at most (K + 1) 2**-53 relative, and LLVM may then vectorize the sum
    (0.1 instead of 0.8 ns per term). A separate function, so that the flag stays on its own code."""
    s = abs(bias)
    for k in range(a.size):
        s += abs(a[k] * b[k])
    return s


@jit(inline="always")  # inlined: array arguments to a call cost atomic refcounts per element
def _exact_element(a, b, bias, has_bias, narrow, mxa, mna, mxb, mnb, prec, emin, emax, acc, scratch):
    n = a.size
    if narrow and prec <= 26 and 0 < n <= BLOCK and mxa != 0 and mxb != 0 and mxa < _INF_BITS and mxb < _INF_BITS:
        # fast path: two integer bins, rounded from a float64 evaluation when its error bound decides
        c1, c2, b1, b2, complete = bins2_counts(a, b, n, product_bound(mxa, mxb))
        if complete and abs(bias) < np.inf:
            r = round_counts(c1, b1, c2, b2, bias if has_bias else 0.0, prec, emin, emax)
            if r == r:
                return r
    acc_reset(acc)
    if mxa >= _INF_BITS or mxb >= _INF_BITS:
        for k in range(n):
            acc_add_product(acc, a[k], b[k])
    elif mxa != 0 and mxb != 0:
        if narrow:
            e = product_bound(mxa, mxb)
            for s in range(0, n, BLOCK):
                m = min(BLOCK, n - s)
                bins2(a[s : s + m], b[s : s + m], m, e, acc, scratch)
        elif wide_safe(mxa, mna, mxb, mnb):
            e = product_bound(mxa, mxb)
            for s in range(0, n, BLOCK):
                m = min(BLOCK, n - s)
                bins3(a[s : s + m], b[s : s + m], m, e, acc, scratch)
        else:
            for k in range(n):
                acc_add_product(acc, a[k], b[k])
    if has_bias:
        acc_add_float(acc, bias)
    special = acc_has_special(acc)
    r = acc_round(acc, prec, emin, emax)
    if r == 0.0 and not special and _all_terms_neg_zero(a, b, bias, has_bias):
        return -0.0
    return r


@jit(inline="always")
def reduce_element(a, b, bias, has_bias, method, narrow, mxa, mna, mxb, mnb, prec, emin, emax, acc, scratch):
    """bias + sum_k a[k] * b[k] by ``method`` (a code of METHOD_CODES), in the format
    (prec, emin, emax): rounded once for EXACT, computed in that format for the others."""
    if method == EXACT:
        return _exact_element(a, b, bias, has_bias, narrow, mxa, mna, mxb, mnb, prec, emin, emax, acc, scratch)
    if method == NAIVE:
        return naive(a, b, False, bias, has_bias, prec, emin, emax)
    if method == PAIRWISE:
        return pairwise(a, b, False, bias, has_bias, prec, emin, emax)
    if method == KAHAN:
        return kahan(a, b, False, bias, has_bias, prec, emin, emax)
    if method == NEUMAIER:
        return neumaier(a, b, False, bias, has_bias, prec, emin, emax)
    if method == ENERGY:
        return energy(a, b, False, bias, has_bias)
    return dot2(a, b, False, bias, has_bias, prec, emin, emax)
