"""A fixed-point superaccumulator: the exact sum of binary64 numbers and of products of them.

The accumulator is one int64 array ``acc``. Its first ``NCHUNKS`` entries hold the value

    sum_j acc[j] * 2**(LOW + 32 j)

as signed 32-bit "chunks" with 31 bits of carry room (Neal, "Fast exact summation using
small and large superaccumulators", 2015, arXiv:1505.05571). The range LOW = -2304 ..
2240 holds every product of two binary64 numbers (2**-2148 .. 2**2048) and sums of up
to 2**63 of them, so no finite input ever overflows or underflows it. The slots after the
chunks count NaN, +inf and -inf terms (IEEE 754 special cases are decided at the end)
and track the range of chunks in use, so that normalisation and rounding only touch it.

Every operation on the chunks is integer arithmetic, exact by construction. The value is
rounded to a format exactly once, by :func:`acc_round`.
"""

import math

import numpy as np

from refkern._jit import jit
from refkern.accumulate._bits import bits

__all__ = [
    "LOW",
    "NCHUNKS",
    "SIZE",
    "acc_new",
    "acc_init",
    "acc_reset",
    "acc_add_int",
    "acc_add_float",
    "acc_add_product",
    "acc_merge",
    "acc_round",
    "acc_has_special",
]

LOW = -2304  # weight of bit 0 of chunk 0: 2**LOW
NCHUNKS = 142  # top weight 2**(LOW + 32 * NCHUNKS) = 2**2240
JMIN = NCHUNKS  # lowest chunk in use (NCHUNKS when empty)
JMAX = NCHUNKS + 1  # highest chunk in use (-1 when empty)
NNAN = NCHUNKS + 2  # number of NaN terms (including inf - inf and 0 * inf)
NPINF = NCHUNKS + 3  # number of +inf terms
NNINF = NCHUNKS + 4  # number of -inf terms
NADDS = NCHUNKS + 5  # additions since the last normalisation
SIZE = NCHUNKS + 6

_MASK32 = np.int64(0xFFFFFFFF)
_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_FRAC = np.int64((1 << 52) - 1)
_NORMALIZE_EVERY = 1 << 29  # each chunk takes <= 2 additions of < 2**32 per add: < 2**62


@jit
def acc_init(acc):
    """Make ``acc`` (int64 array of length SIZE) the empty sum."""
    acc[:] = 0
    acc[JMIN] = NCHUNKS
    acc[JMAX] = -1


@jit
def acc_reset(acc):
    """Make a used accumulator the empty sum again, touching only the chunks it used."""
    for j in range(acc[JMIN], acc[JMAX] + 1):
        acc[j] = 0
    acc[JMIN] = NCHUNKS
    acc[JMAX] = -1
    acc[NNAN] = 0
    acc[NPINF] = 0
    acc[NNINF] = 0
    acc[NADDS] = 0


@jit
def acc_new():
    """A fresh, empty accumulator."""
    acc = np.empty(SIZE, np.int64)
    acc_init(acc)
    return acc


@jit
def acc_normalize(acc):
    """Propagate carries so that chunks below the top one in use lie in [0, 2**32).

    The value is unchanged; the top chunk keeps the sign and stays within [-2**32, 2**32).
    """
    lo = acc[JMIN]
    hi = acc[JMAX]
    if hi < 0:
        return
    for j in range(lo, hi):
        c = acc[j] >> 32  # arithmetic shift: floor division by 2**32
        acc[j] -= c << 32
        acc[j + 1] += c
    while hi < NCHUNKS - 1:  # the top chunk keeps [-2**32, 2**32); carry the rest upward
        c = acc[hi] >> 32
        if c == 0 or c == -1:
            break
        acc[hi] -= c << 32
        hi += 1
        acc[hi] += c
    acc[JMAX] = hi
    acc[NADDS] = 0


@jit
def acc_add_int(acc, c, pos):
    """acc += c * 2**pos, for an int64 ``c`` and LOW <= pos <= LOW + 32 * (NCHUNKS - 3)."""
    if c == 0:
        return
    off = pos - LOW
    j = off >> 5
    sh = off & 31
    lo = c & _MASK32  # c == hi * 2**32 + lo with 0 <= lo < 2**32
    hi = c >> 32  # |hi| <= 2**31
    x = lo << sh  # < 2**63
    acc[j] += x & _MASK32
    acc[j + 1] += x >> 32
    y = hi * (np.int64(1) << sh)  # |y| <= 2**62
    acc[j + 1] += y & _MASK32
    acc[j + 2] += y >> 32
    if j < acc[JMIN]:
        acc[JMIN] = j
    if j + 2 > acc[JMAX]:
        acc[JMAX] = j + 2
    acc[NADDS] += 1
    if acc[NADDS] >= _NORMALIZE_EVERY:
        acc_normalize(acc)


@jit(inline="always")
def _decompose(x):
    """A finite float64 as (m, e) with x == m * 2**e, m a signed integer of <= 53 bits."""
    a = bits(x)
    ef = (a & _ABS) >> 52
    m = a & _FRAC
    if ef == 0:
        e = -1074
    else:
        m |= np.int64(1) << 52
        e = ef - 1075
    if a < 0:
        m = -m
    return m, e


@jit
def acc_add_special(acc, x):
    """Record a NaN or an infinite term."""
    if x != x:
        acc[NNAN] += 1
    elif x > 0:
        acc[NPINF] += 1
    else:
        acc[NNINF] += 1


@jit
def acc_add_float(acc, x):
    """acc += x exactly, for any float64 (NaN and +-inf are recorded as special terms)."""
    if x - x != 0.0:  # NaN or inf
        acc_add_special(acc, x)
        return
    m, e = _decompose(x)
    acc_add_int(acc, m, e)


@jit
def acc_add_product(acc, a, b):
    """acc += a * b exactly, for any float64 a, b, with IEEE 754 special cases.

    The slow, obviously exact path: the 53-bit integer significands are split into 26/27-bit
    halves whose four products fit in int64 and are added at their bit positions.
    """
    if a != a or b != b:
        acc[NNAN] += 1
        return
    if a - a != 0.0 or b - b != 0.0:  # an infinite factor
        if a == 0.0 or b == 0.0:
            acc[NNAN] += 1  # 0 * inf
        elif (a > 0) == (b > 0):
            acc[NPINF] += 1
        else:
            acc[NNINF] += 1
        return
    ma, ea = _decompose(a)
    mb, eb = _decompose(b)
    if ma == 0 or mb == 0:
        return
    neg = (ma < 0) != (mb < 0)
    ma = abs(ma)
    mb = abs(mb)
    ah = ma >> 26
    al = ma & ((1 << 26) - 1)
    bh = mb >> 26
    bl = mb & ((1 << 26) - 1)
    e = ea + eb
    s = -1 if neg else 1
    acc_add_int(acc, s * (al * bl), e)
    acc_add_int(acc, s * (ah * bl), e + 26)
    acc_add_int(acc, s * (al * bh), e + 26)
    acc_add_int(acc, s * (ah * bh), e + 52)


@jit
def acc_merge(dst, src):
    """dst += src (both are left normalised)."""
    acc_normalize(dst)
    acc_normalize(src)
    lo = src[JMIN]
    hi = src[JMAX]
    for j in range(lo, hi + 1):
        dst[j] += src[j]
    if hi >= 0:
        if lo < dst[JMIN]:
            dst[JMIN] = lo
        if hi > dst[JMAX]:
            dst[JMAX] = hi
    dst[NNAN] += src[NNAN]
    dst[NPINF] += src[NPINF]
    dst[NNINF] += src[NNINF]
    acc_normalize(dst)


@jit
def acc_has_special(acc):
    return acc[NNAN] + acc[NPINF] + acc[NNINF] > 0


@jit(inline="always")
def _bitlen(w):
    """Number of bits of 0 <= w < 2**53 (0 for 0)."""
    if w == 0:
        return 0
    return math.frexp(np.float64(w))[1]


@jit
def _get_bits(acc, pos, n):
    """The n <= 62 bits of weight 2**pos .. 2**(pos+n-1) of a normalised, non-negative acc."""
    off = pos - LOW
    j = off >> 5
    sh = off & 31
    res = np.int64(0)
    got = 0
    while got < n:
        take = min(32 - sh, n - got)
        piece = (acc[j] >> sh) & ((np.int64(1) << take) - 1)
        res |= piece << got
        got += take
        sh = 0
        j += 1
    return res


@jit
def _any_below(acc, pos):
    """Whether any bit of weight below 2**pos is set (normalised, non-negative acc)."""
    off = pos - LOW
    j = off >> 5
    sh = off & 31
    if acc[j] & ((np.int64(1) << sh) - 1):
        return True
    for k in range(acc[JMIN], j):
        if acc[k] != 0:
            return True
    return False


@jit
def acc_round(acc, prec, emin, emax):
    """The exact value of ``acc`` rounded once, to nearest even, to the format (prec, emin, emax).

    Returned as a float64 (the rounded value is exactly representable in float64 for every
    format with prec <= 53). IEEE 754: any NaN term, or both +inf and -inf terms, give NaN;
    otherwise an infinite term gives that infinity; a finite sum overflows to +-inf only when
    its value rounded with an unbounded exponent reaches 2**(emax+1); results below 2**emin
    are rounded to the subnormal grid 2**(emin-prec+1); a nonzero value that rounds to zero
    keeps its sign. An exactly zero sum returns +0.0 (the caller applies the all-terms-are--0
    rule). ``acc`` is left normalised and non-negative in magnitude form; do not reuse it.
    """
    if acc[NNAN] > 0 or (acc[NPINF] > 0 and acc[NNINF] > 0):
        return np.nan
    if acc[NPINF] > 0:
        return np.inf
    if acc[NNINF] > 0:
        return -np.inf
    acc_normalize(acc)
    hi = acc[JMAX]
    lo = acc[JMIN]
    if hi < 0:
        return 0.0
    neg = acc[hi] < 0
    if neg:
        for j in range(lo, hi + 1):
            acc[j] = -acc[j]
        acc_normalize(acc)
        hi = acc[JMAX]
    jt = hi
    while jt >= lo and acc[jt] == 0:
        jt -= 1
    if jt < lo:
        return 0.0
    top = LOW + 32 * jt + _bitlen(acc[jt]) - 1  # weight of the leading bit
    lsb = max(top - prec + 1, emin - prec + 1)  # weight of the last kept bit (subnormal grid)
    m = _get_bits(acc, lsb, top - lsb + 1) if top >= lsb else np.int64(0)
    rbit = _get_bits(acc, lsb - 1, 1)
    if rbit and (m & 1 or _any_below(acc, lsb - 1)):
        m += 1  # round half to even
    if m == 0:
        return -0.0 if neg else 0.0
    if _bitlen(m) - 1 + lsb > emax:
        return -np.inf if neg else np.inf
    v = math.ldexp(np.float64(m), lsb)
    return -v if neg else v
