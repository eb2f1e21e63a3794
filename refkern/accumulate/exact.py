"""Exact dot products and sums, rounded once: the fast path of ``accumulate="exact"``.

Terms are processed in blocks of at most ``BLOCK`` = 2048. Per block, a bound
``|t| < 2**(E+1)`` on its terms gives the quantum 2**b of a first "bin", b = E - 50, and
each term ``t`` is split exactly by the ExtractScalar step of Rump, Ogita and Oishi
(2008, doi:10.1137/050645671; Demmel and Nguyen 2013):

    sigma = 1.5 * 2**(b + 52)       # ulp(sigma) = 2**b
    v     = t + sigma               # rounds t to a multiple q of 2**b, since |t| <= 2**(b+51)
    count = bits(v) - bits(sigma)   # q / 2**b, an exact integer with |count| <= 2**51
    t     = t - (v - sigma)         # the remainder, exact, |t| <= 2**(b-1)

Integer counts of a block sum exactly in int64 (2048 * 2**51 < 2**63) and are then
added to the superaccumulator at weight 2**b. The next bin has b - 52, so two bins
hold 104 bits below the block's bound: every float32 product (48 bits) within 2**-56
of the bound, every float64 term within 2**-50. The loop has no branches, so LLVM
vectorizes it without fast-math. If any remainder is nonzero after the fixed bins (or
the block holds inf/NaN, or float64 products could overflow or underflow) the block
takes a slower path that is still exact: more bins, each starting at the largest
remaining exponent, down to 2**-1074 where every remainder is zero; or, for special
values and extreme exponents, the superaccumulator term by term. Speed depends on
the data; exactness never does.
"""

import numpy as np
from numba import get_num_threads, prange, types
from numba.extending import overload

from refkern._jit import CACHE, jit
from refkern.accumulate._bits import bits, fma, from_bits, pow2
from refkern.accumulate.formats import round_to
from refkern.accumulate.superacc import (
    SIZE,
    acc_add_float,
    acc_add_int,
    acc_add_product,
    acc_has_special,
    acc_init,
    acc_merge,
    acc_round,
)

__all__ = [
    "BLOCK",
    "exact_dot",
    "exact_sum",
    "fold_terms",
    "bins2",
    "bins2_counts",
    "round_counts",
    "bins3",
    "wide_safe",
    "product_bound",
]

BLOCK = 2048
_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_INF_BITS = np.int64(0x7FF0000000000000)
_NEG_ZERO_BITS = np.int64(-0x8000000000000000)
_PARALLEL_MIN = 1 << 16  # below this many terms, threads cost more than they save


@jit(inline="always")
def _exponent(absbits):
    """floor(log2 x) for the bit pattern of x > 0 (-1022 for subnormals: x < 2**-1022)."""
    ef = absbits >> 52
    return ef - 1023 if ef > 0 else -1022


@jit(inline="always")
def _sigma(b):
    """1.5 * 2**(b + 52), built from its bits (b >= -1074)."""
    return from_bits((b + 1075) << 52 | (np.int64(1) << 51))


@jit(inline="always")
def _bins(e):
    """Quanta and constants of two bins below the bound 2**(e+1): (b1, s1, sb1, b2, s2, sb2)."""
    b1 = e - 50
    b2 = b1 - 52
    s1 = _sigma(b1)
    s2 = _sigma(b2)
    return b1, s1, bits(s1), b2, s2, bits(s2)


@jit(inline="always")
def _split2(t, s1, sb1, s2, sb2):
    """One term through two bins: t == d1 * 2**b1 + d2 * 2**b2 + r exactly (ExtractScalar twice)."""
    v = t + s1
    d1 = bits(v) - sb1  # the multiple of 2**b1 that t rounds to, as an integer
    r = t - (v - s1)  # exact remainder, |r| <= 2**(b1-1)
    v = r + s2
    d2 = bits(v) - sb2
    return d1, d2, r - (v - s2)


@jit
def fold_terms(r, m, acc):
    """acc += sum(r[:m]) exactly, for any float64 terms; r is overwritten.

    Multi-pass extraction: each pass uses the largest exponent left among the remainders
    (an upper bound from OR-ing their bit patterns), so widely spread terms cost a pass per
    52-bit band that actually holds bits, never a wrong result.
    """
    mx = np.int64(0)
    for i in range(m):
        x = bits(r[i]) & _ABS
        mx = x if x > mx else mx
    if mx == 0:
        return
    if mx >= _INF_BITS or _exponent(mx) > 1021:  # specials, or sigma would overflow
        for i in range(m):
            acc_add_float(acc, r[i])
        return
    b = _exponent(mx) - 50  # |r| < 2**(E+1) == 2**(b+51)
    while True:
        b = max(b, -1074)  # all float64 are multiples of 2**-1074: this pass leaves nothing
        sigma = _sigma(b)
        sb = bits(sigma)
        cnt = np.int64(0)
        orr = np.int64(0)
        for i in range(m):
            v = r[i] + sigma
            cnt += bits(v) - sb
            t = r[i] - (v - sigma)
            r[i] = t
            orr |= bits(t) & _ABS
        acc_add_int(acc, cnt, b)
        if orr == 0:
            return
        b = min(b - 52, _exponent(orr) - 50)  # |r| <= 2**(b-1) and |r| < 2**(E_or + 1)


@jit(inline="always")
def bins2_counts(ab, bb, m, e):
    """The two bin counts of sum ab[i] * bb[i] (i < m <= BLOCK, products exact in float64 and
    below 2**(e+1)), not yet folded: (c1, c2, b1, b2, complete). The sum equals
    c1 * 2**b1 + c2 * 2**b2 exactly when ``complete``; otherwise some term lies below 2**b2."""
    b1, s1, sb1, b2, s2, sb2 = _bins(e)
    c1 = np.int64(0)
    c2 = np.int64(0)
    orr = np.int64(0)
    for i in range(m):
        d1, d2, r = _split2(np.float64(ab[i]) * np.float64(bb[i]), s1, sb1, s2, sb2)  # exact: 24 + 24 bits
        c1 += d1
        c2 += d2
        orr |= bits(r) & _ABS
    return c1, c2, b1, b2, orr == 0


@jit
def bins2(ab, bb, m, e, acc, scratch):
    """acc += sum ab[i] * bb[i], i < m <= BLOCK, exactly, for products exact in float64
    (factors of float32 or narrower) bounded by |ab[i] bb[i]| < 2**(e+1), e in [-972, 1021]."""
    c1, c2, b1, b2, complete = bins2_counts(ab, bb, m, e)
    if complete:
        acc_add_int(acc, c1, b1)
        acc_add_int(acc, c2, b2)
    else:  # terms below 2**b2: redo the block with as many bins as it needs
        for i in range(m):
            scratch[i] = np.float64(ab[i]) * np.float64(bb[i])
        fold_terms(scratch, m, acc)


@jit(inline="always")
def round_counts(c1, b1, c2, b2, bias, prec, emin, emax):
    """c1 * 2**b1 + c2 * 2**b2 + bias rounded once to a format with prec <= 26, or NaN when
    a float64 evaluation cannot decide the rounding (the caller then takes the exact path).

    S = fl(fl(x1 + x2) + bias), with x_k = fl(c_k) * 2**b_k, errs by at most
    2**-51 (|x1| + |x2| + |bias|) (three roundings of 2**-53 each, relative to sums bounded
    by that total); twice that is taken as err. Rounding is monotonic, so if S - err and
    S + err round to the same value, so does the exact value, which lies between them; a
    result near zero (|S| <= err) is left to the exact path, which knows its sign."""
    x1 = np.float64(c1) * pow2(b1)  # b1 >= -348 for float32 products: a normal power of two
    x2 = np.float64(c2) * pow2(b2)
    s = (x1 + x2) + bias
    err = 2.0**-50 * (abs(x1) + abs(x2) + abs(bias))
    if not abs(s) > err:
        return np.nan
    lo = round_to(s - err, prec, emin, emax)
    hi = round_to(s + err, prec, emin, emax)
    return lo if lo == hi else np.nan


@jit
def bins3(ab, bb, m, e, acc, scratch):
    """acc += sum ab[i] * bb[i], i < m <= BLOCK, exactly, for float64 factors whose products
    neither overflow nor lose their FMA error term: |ab[i] bb[i]| < 2**(e+1) with
    -920 <= e <= 1021, and every nonzero product >= 2**-968 (callers check)."""
    b1, s1, sb1, b2, s2, sb2 = _bins(e)
    b3 = b2 - 52
    s3 = _sigma(b3)
    sb3 = bits(s3)
    c1 = np.int64(0)
    c2 = np.int64(0)
    c3 = np.int64(0)
    orr = np.int64(0)
    for i in range(m):
        p = ab[i] * bb[i]
        q = fma(ab[i], bb[i], -p)  # a b == p + q exactly, |q| <= 2**-53 |p|
        d1, d2, r = _split2(p, s1, sb1, s2, sb2)
        f2, f3, t = _split2(q, s2, sb2, s3, sb3)  # q starts one bin lower
        c1 += d1
        c2 += d2 + f2  # <= 2**51 + 2**50 per term: 2048 terms stay below 2**63
        c3 += f3
        orr |= (bits(r) | bits(t)) & _ABS
    if orr == 0:
        acc_add_int(acc, c1, b1)
        acc_add_int(acc, c2, b2)
        acc_add_int(acc, c3, b3)
    else:
        for i in range(m):
            scratch[i] = ab[i] * bb[i]
        fold_terms(scratch, m, acc)
        for i in range(m):
            p = ab[i] * bb[i]
            scratch[i] = fma(ab[i], bb[i], -p)
        fold_terms(scratch, m, acc)


@jit
def wide_safe(mxa, mna, mxb, mnb):
    """Whether float64 factors with these max / min-nonzero |bit patterns| may use bins3:
    no inf/NaN, products and bin constants below overflow, FMA error terms exact."""
    if mxa >= _INF_BITS or mxb >= _INF_BITS:
        return False
    e = _exponent(mxa) + _exponent(mxb) + 1
    tiny = (mna >> 52) + (mnb >> 52) - 2046  # lower bound on the exponent of any nonzero product
    return -920 <= e <= 1021 and tiny >= -968


@jit
def product_bound(mxa, mxb):
    """e with |a b| < 2**(e+1) for |a|, |b| at most the values with these bit patterns."""
    return _exponent(mxa) + _exponent(mxb) + 1


@jit
def _dot32_range(a, b, lo, hi, acc, scratch):
    """acc += sum a[i] * b[i] for lo <= i < hi, exactly; a, b float32 (products exact in float64)."""
    for s in range(lo, hi, BLOCK):
        m = min(BLOCK, hi - s)
        ab = a[s : s + m]
        bb = b[s : s + m]
        ma = np.int64(0)
        mb = np.int64(0)
        for i in range(m):
            x = bits(np.float64(ab[i])) & _ABS
            y = bits(np.float64(bb[i])) & _ABS
            ma = x if x > ma else ma
            mb = y if y > mb else mb
        if ma >= _INF_BITS or mb >= _INF_BITS:
            for i in range(m):
                acc_add_product(acc, np.float64(ab[i]), np.float64(bb[i]))
            continue
        if ma == 0 or mb == 0:
            continue
        bins2(ab, bb, m, product_bound(ma, mb), acc, scratch)  # float32 keeps the bound in [-298, 255]


@jit
def _dot64_range(a, b, lo, hi, acc, scratch):
    """acc += sum a[i] * b[i] for lo <= i < hi, exactly; a, b float64 (products as p + e)."""
    for s in range(lo, hi, BLOCK):
        m = min(BLOCK, hi - s)
        ab = a[s : s + m]
        bb = b[s : s + m]
        ma = np.int64(0)
        mb = np.int64(0)
        na = _INF_BITS
        nb = _INF_BITS
        for i in range(m):
            x = bits(ab[i]) & _ABS
            y = bits(bb[i]) & _ABS
            ma = x if x > ma else ma
            mb = y if y > mb else mb
            xn = x if x != 0 else _INF_BITS
            yn = y if y != 0 else _INF_BITS
            na = xn if xn < na else na
            nb = yn if yn < nb else nb
        if ma == 0 or mb == 0:
            if ma < _INF_BITS and mb < _INF_BITS:
                continue
        if not wide_safe(ma, na, mb, nb):
            # specials, possible overflow of a*b or sigma, or an inexact FMA error term
            for i in range(m):
                acc_add_product(acc, ab[i], bb[i])
            continue
        bins3(ab, bb, m, product_bound(ma, mb), acc, scratch)


@jit
def _sum_range(x, lo, hi, acc, scratch):
    """acc += sum x[i] for lo <= i < hi, exactly (x float32 or float64)."""
    for s in range(lo, hi, BLOCK):
        m = min(BLOCK, hi - s)
        xb = x[s : s + m]
        mx = np.int64(0)
        for i in range(m):
            y = bits(np.float64(xb[i])) & _ABS
            mx = y if y > mx else mx
        if mx == 0:
            continue
        e = _exponent(mx)
        if mx >= _INF_BITS or e > 1021 or e < -972:
            for i in range(m):
                scratch[i] = xb[i]
            fold_terms(scratch, m, acc)
            continue
        b1, s1, sb1, b2, s2, sb2 = _bins(e)
        c1 = np.int64(0)
        c2 = np.int64(0)
        orr = np.int64(0)
        for i in range(m):
            d1, d2, r = _split2(np.float64(xb[i]), s1, sb1, s2, sb2)
            c1 += d1
            c2 += d2
            orr |= bits(r) & _ABS
        if orr == 0:
            acc_add_int(acc, c1, b1)
            acc_add_int(acc, c2, b2)
        else:
            for i in range(m):
                scratch[i] = xb[i]
            fold_terms(scratch, m, acc)


def _dot_range(a, b, lo, hi, acc, scratch):
    """acc += sum a[i] * b[i] over [lo, hi): the float32 or float64 path, chosen at compile time."""


@overload(_dot_range, jit_options={"cache": CACHE, "fastmath": False})
def _dot_range_impl(a, b, lo, hi, acc, scratch):
    if a.dtype == types.float32:
        return lambda a, b, lo, hi, acc, scratch: _dot32_range(a, b, lo, hi, acc, scratch)
    return lambda a, b, lo, hi, acc, scratch: _dot64_range(a, b, lo, hi, acc, scratch)


@jit
def _all_neg_zero_products(a, b):
    """IEEE 754: an exactly zero sum is -0 only when every term is -0 (and there is one)."""
    if a.size == 0:
        return False
    for i in range(a.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if not ((x == 0.0 or y == 0.0) and (bits(x) < 0) != (bits(y) < 0)):
            return False
    return True


@jit
def _all_neg_zero(x):
    if x.size == 0:
        return False
    for i in range(x.size):
        if bits(np.float64(x[i])) != _NEG_ZERO_BITS:
            return False
    return True


@jit
def _finish(accs, nseg, prec, emin, emax):
    for t in range(1, nseg):
        acc_merge(accs[0], accs[t])
    special = acc_has_special(accs[0])
    return acc_round(accs[0], prec, emin, emax), special


@jit
def _exact_dot_serial(a, b, prec, emin, emax):
    accs = np.empty((1, SIZE), np.int64)
    acc_init(accs[0])
    _dot_range(a, b, 0, a.size, accs[0], np.empty(BLOCK))
    r, special = _finish(accs, 1, prec, emin, emax)
    if r == 0.0 and not special and _all_neg_zero_products(a, b):
        return -0.0
    return r


@jit(parallel=True)
def _exact_dot_parallel(a, b, prec, emin, emax, nseg):
    n = a.size
    nblk = (n + BLOCK - 1) // BLOCK
    accs = np.empty((nseg, SIZE), np.int64)
    for t in prange(nseg):
        acc_init(accs[t])
        lo = (nblk * t // nseg) * BLOCK
        hi = min(n, (nblk * (t + 1) // nseg) * BLOCK)
        _dot_range(a, b, lo, hi, accs[t], np.empty(BLOCK))
    r, special = _finish(accs, nseg, prec, emin, emax)
    if r == 0.0 and not special and _all_neg_zero_products(a, b):
        return -0.0
    return r


@jit
def _exact_sum_serial(x, prec, emin, emax):
    accs = np.empty((1, SIZE), np.int64)
    acc_init(accs[0])
    _sum_range(x, 0, x.size, accs[0], np.empty(BLOCK))
    r, special = _finish(accs, 1, prec, emin, emax)
    if r == 0.0 and not special and _all_neg_zero(x):
        return -0.0
    return r


@jit(parallel=True)
def _exact_sum_parallel(x, prec, emin, emax, nseg):
    n = x.size
    nblk = (n + BLOCK - 1) // BLOCK
    accs = np.empty((nseg, SIZE), np.int64)
    for t in prange(nseg):
        acc_init(accs[t])
        lo = (nblk * t // nseg) * BLOCK
        hi = min(n, (nblk * (t + 1) // nseg) * BLOCK)
        _sum_range(x, lo, hi, accs[t], np.empty(BLOCK))
    r, special = _finish(accs, nseg, prec, emin, emax)
    if r == 0.0 and not special and _all_neg_zero(x):
        return -0.0
    return r


def _segments(n):
    return min(get_num_threads(), (n + BLOCK - 1) // BLOCK)


def exact_dot(a, b, fmt):
    """sum a[i] * b[i] exactly, rounded once to ``fmt``; a, b contiguous, both float32 or both float64."""
    nseg = _segments(a.size)
    if a.size < _PARALLEL_MIN or nseg < 2:
        return _exact_dot_serial(a, b, *fmt.params)
    return _exact_dot_parallel(a, b, *fmt.params, nseg)


def exact_sum(x, fmt):
    """sum x[i] exactly, rounded once to ``fmt``; x contiguous float32 or float64."""
    nseg = _segments(x.size)
    if x.size < _PARALLEL_MIN or nseg < 2:
        return _exact_sum_serial(x, *fmt.params)
    return _exact_sum_parallel(x, *fmt.params, nseg)
