"""One-pass summaries of large per-element arrays: compiled, parallel, and the same on any thread count.

``compare`` summarises outputs of 10^7 elements and more: the ten worst elements, the median and
the largest rounding envelope in ulps (and, in :mod:`refkern.analysis.ulp`, the largest error).
Each is one parallel pass here over contiguous chunks of the flat arrays (:func:`chunks`: a few
per thread), whose partial
results are merged in chunk order, so every result is the one a serial loop gives whatever the
number of threads, and no temporary array of the output's size is allocated.

The median is exact, not estimated. A seeded sample of 4096 values brackets it
(:func:`median_bracket`); the pass that computes the values counts those below the bracket and
keeps those inside it, and when the middle rank(s) fall inside (the sample's median rank is
binomial: a bracket of +-6 standard deviations of it misses with probability about 2e-9 on
random data, but structured data may always miss, and ties may overflow the room kept) they are
ordered by ``np.partition`` among the kept values only (:func:`median_in_bracket`). Otherwise two
passes of their own find it (:func:`median_max_bound_ulps`): each value falls in a bin by its binary
exponent and the 4 significand bits after the leading one (:func:`_bin`, monotone in ``v``; 0 and
inf have bins of their own), a histogram per chunk gives each bin's rank range, and a second pass
gathers only the values of the bin(s) holding the middle rank(s). The sample and the bracket only
decide how fast the median is found, never its value.
"""

import math

import numba
import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.engines.filter import threads_for

__all__ = ["chunks", "top_k", "insert_top", "merge_top", "ulp_exponent", "scale_down", "pow2_neg", "ulps_at",
           "bound_ulps", "median", "median_bracket", "median_in_bracket", "median_max_bound_ulps", "SCALE1", "SCALE2",
           "floor_log2"]  # fmt: skip

_EMIN = -1074  # frexp's exponent of the smallest subnormal float64 is -1073: bins start below it
_SUB = 16  # bins per octave: the 4 significand bits after the leading one
_ZERO = 0
_INF = (1025 - _EMIN) * _SUB + 1  # above every finite value (frexp's exponent is at most 1024)
NBINS = _INF + 1


def chunks(n: int) -> int:
    """How many contiguous chunks a pass over ``n`` elements is cut into: 4 per thread (balance
    when one thread is slowed), none shorter than 2^14 elements (the merge stays negligible)."""
    return max(1, min(4 * numba.get_num_threads(), n >> 14))


@jit
def insert_top(idx, val, m, i, v):
    """Insert element ``i`` with key ``v`` into the list ``idx``/``val`` of the ``m`` largest keys so far
    (at most ``len(idx)``), largest first; NaN counts as inf, and a later element displaces only a
    strictly smaller key, so ties keep the lower index first. Returns the new length."""
    k = idx.size
    if v != v:
        v = np.inf
    if m == k and v <= val[m - 1]:
        return m
    j = m if m < k else k - 1
    while j > 0 and val[j - 1] < v:
        if j < k:
            val[j], idx[j] = val[j - 1], idx[j - 1]
        j -= 1
    val[j], idx[j] = v, i
    return min(m + 1, k)


@jit(parallel=True)
def _top_chunks(eligible, key, nch, idx, val, cnt):
    n = key.size
    for c in prange(nch):
        m = 0
        ic, vc = idx[c], val[c]
        for i in range(c * n // nch, (c + 1) * n // nch):
            if eligible[i]:
                m = insert_top(ic, vc, m, i, key[i])
        cnt[c] = m


def merge_top(idx, val, cnt, k: int) -> np.ndarray:
    """The global top ``k`` from each chunk's (row's) own: the chunks' candidates hold it, and one
    sort by (-key, index) orders it."""
    keep = np.arange(idx.shape[1])[None, :] < cnt[:, None]
    i, v = idx[keep], val[keep]
    return i[np.lexsort((i, -v))][:k]


def top_k(eligible, key, k: int = 10) -> np.ndarray:
    """Flat indices of the (at most) ``k`` eligible elements with the largest ``key``, largest first,
    ties in index order (flat bool and float64 arrays of one size), in one pass."""
    with threads_for(key.size):  # a few ns per element: one thread below PARALLEL_TERMS elements (an audit's
        # ResNet-18: 21 passes of at most 0.8M elements, 0.24 s on two threads under load, each launch waiting)
        nch = chunks(key.size)
        idx, val, cnt = np.zeros((nch, k), np.int64), np.zeros((nch, k)), np.zeros(nch, np.int64)
        if key.size and k:
            _top_chunks(eligible, key, nch, idx, val, cnt)
    return merge_top(idx, val, cnt, k)


_K = np.arange(-1074, 1024)
# 2^-k = SCALE1[k + 1074] * SCALE2[k + 1074] for -1074 <= k <= 1023, each factor a float64 (2^-k alone is not
# one below k = -1023): v * SCALE1 * SCALE2 is v / 2^k exactly as the division rounds it (the exact value is
# rounded once, by the first product when the second is by 1; the second is exact otherwise), or overflows
SCALE1 = np.ldexp(1.0, np.where(_K >= -1023, -_K, -_K - 1023))
SCALE2 = np.where(_K >= -1023, 1.0, 2.0**1023)


@jit
def floor_log2(bits):
    """floor(log2 |y|) of the float64 ``y`` with these bits, for a normal ``y``; -1 for 0 and for
    specials, -1023 for a float64 subnormal (below every format's ``emin``, which is what the
    callers take the maximum with). A select, not a branch."""
    f = (bits >> 52) & 0x7FF
    return -1 if (f == 0x7FF) | (bits << 1 == 0) else f - 1023


@jit
def _bin(v):
    """The histogram bin of ``v >= 0``: monotone, one octave in 16 equal parts."""
    if v == 0.0:
        return _ZERO
    if v == np.inf:
        return _INF
    m, e = math.frexp(v)  # v = m 2^e, 1/2 <= m < 1
    return (e - _EMIN) * _SUB + 1 + int((m - 0.5) * (2 * _SUB))


@jit
def ulp_exponent(ybits, prec, emin):
    """k with 2^k the ulp of the format (prec, emin) at the float64 ``y`` of these bits (at 0 and at
    specials the ulp of [1/2, 1), 2^-prec: :func:`floor_log2`'s -1)."""
    return max(floor_log2(ybits), emin) - prec + 1


@jit
def scale_down(v, k):
    """v / 2^k, exactly as the division rounds it, for -1074 <= k <= 1023: two products by powers of
    two (:data:`SCALE1`, :data:`SCALE2`), cheaper than a division and without a branch."""
    return v * SCALE1[k + 1074] * SCALE2[k + 1074]


@jit
def pow2_neg(k):
    """2^-k for -1022 <= k <= 1022, built from its bits (a normal float64): no table, no branch."""
    return np.int64((1023 - k) << 52).view(np.float64)


@jit
def ulps_at(x, y, b, same, prec, emin):
    """(the bound ``b``, ``|x - y|``) in ulps of the format (prec, emin) at the float64 ``y``, each
    ``v / 2^k`` exactly as the division rounds it, as :func:`scale_down` gives it: the ulp exponent k
    (:func:`ulp_exponent`) lies in [emin - prec + 1, 1024 - prec], and ``v 2^-max(k, -1022)`` then
    ``2^-(k - max(k, -1022))`` (at most 2^52) are two exact products, one rounding only where the
    quotient overflows, as the division's. The error is counted at y as :mod:`refkern.analysis.ulp`
    counts it (at 0 in the smallest subnormal's ulp), the bound in the ulp of [1/2, 1) at 0 and at
    specials. A NaN bound is inf (no bound holds); the error is 0 where ``same`` (equal, or NaN
    alike) and inf at any other special. Selects and products only: inlined, it leaves a loop
    without a branch the data decides."""
    k = ulp_exponent(np.float64(y).view(np.int64), prec, emin)
    k1 = max(k, -1022)
    v = (b * pow2_neg(k1)) * pow2_neg(k - k1)
    if v != v:
        v = np.inf
    ke = k if y != 0.0 else emin - prec + 1
    ke1 = max(ke, -1022)
    d = (abs(x - y) * pow2_neg(ke1)) * pow2_neg(ke - ke1)
    if d != d:
        d = 0.0 if same else np.inf
    return v, d


@jit
def bound_bin(b, bbits, k):
    """:func:`_bin` of ``b / 2^k`` for ``b >= 0`` (NaN as inf) with bits ``bbits``: for a normal ``b``
    whose quotient is normal, from the bits alone (the exponent less k, the same significand)."""
    if not b < np.inf:
        return _INF
    f = (bbits >> 52) & 0x7FF
    e = f - 1023 - k  # floor(log2 (b / 2^k))
    if b == 0.0 or f == 0 or e < -1022 or e > 1023:
        return _bin(scale_down(b, k))
    return (e + 1 - _EMIN) * _SUB + 1 + ((bbits >> 48) & 0xF)


@jit
def bound_ulps(ybits, b, bbits, prec, emin):
    """(v, bin): the bound ``b`` in ulps of the result format at ``y`` (inf where no bound holds, NaN
    included) and :func:`_bin` of it."""
    k = ulp_exponent(ybits, prec, emin)
    return (scale_down(b, k) if b < np.inf else np.inf), bound_bin(b, bbits, k)


@jit(parallel=True)
def _ulps_histogram(ref, bound, prec, emin, nch, hist, peak):
    n = ref.size
    rb, bb = ref.view(np.int64), bound.view(np.int64)
    for c in prange(nch):
        m = 0.0
        hc = hist[c]
        for i in range(c * n // nch, (c + 1) * n // nch):
            v, b = bound_ulps(rb[i], bound[i], bb[i], prec, emin)
            hc[b] += 1
            if v > m:
                m = v
        peak[c] = m


@jit(parallel=True)
def _ulps_gather(ref, bound, prec, emin, nch, lo, hi, start, out):
    """The values whose bin lies in [lo, hi], chunk c's from ``start[c]`` on, in index order (the bin
    from the bits; the value only for those)."""
    n = ref.size
    rb, bb = ref.view(np.int64), bound.view(np.int64)
    for c in prange(nch):
        j = start[c]
        for i in range(c * n // nch, (c + 1) * n // nch):
            k = ulp_exponent(rb[i], prec, emin)
            if lo <= bound_bin(bound[i], bb[i], k) <= hi:
                b = bound[i]
                out[j] = scale_down(b, k) if b < np.inf else np.inf
                j += 1


BRACKET_SAMPLE = 4096  # values sampled to bracket the median
BRACKET_SD = 6.0  # the bracket's half-width in standard deviations (sqrt(m) / 2) of the sample median's rank
_SEED = 20240607


@jit
def _bound_ulps_at(ref, bound, idx, prec, emin, out):
    rb, bb = ref.view(np.int64), bound.view(np.int64)
    for j in range(idx.size):
        i = idx[j]
        out[j] = bound_ulps(rb[i], bound[i], bb[i], prec, emin)[0]


def median_bracket(ref, bound, prec: int, emin: int) -> tuple:
    """(lo, hi, room): a bracket [lo, hi] likely to hold the median of :func:`bound_ulps` over the flat
    arrays (``ref`` float32 or float64, ``bound`` float64), from a seeded sample of
    :data:`BRACKET_SAMPLE` values (the sample's middle rank +- :data:`BRACKET_SD` standard deviations of
    it), and the fraction of each chunk to keep room for (three times the expected share inside).
    Every value when the sample is everything."""
    n = ref.size
    if n <= BRACKET_SAMPLE:
        return -np.inf, np.inf, 1.0
    idx = np.sort(np.random.default_rng(_SEED).choice(n, BRACKET_SAMPLE, replace=False))
    v = np.empty(BRACKET_SAMPLE)
    _bound_ulps_at(np.asarray(ref[idx], np.float64), bound[idx], np.arange(BRACKET_SAMPLE), prec, emin, v)
    v.sort()
    h = int(math.ceil(BRACKET_SD * math.sqrt(BRACKET_SAMPLE) / 2))
    mid = BRACKET_SAMPLE // 2
    return (
        float(v[max(mid - 1 - h, 0)]),
        float(v[min(mid + h, BRACKET_SAMPLE - 1)]),
        min(1.0, 3.0 * 2 * h / BRACKET_SAMPLE),
    )


def median_in_bracket(kept, n_kept, n_below, n: int, lo=None, hi=None):
    """The exact median (``np.median``'s) of n values from the values kept in the bracket [lo, hi], per
    chunk (rows of ``kept``, ``n_kept`` of them each, counted even beyond the room), and the count below
    it; None when the middle rank(s) fall outside the bracket, or when the room overflowed and the
    bracket is not one value (a bracket ``lo == hi`` holds that value only: every bound infinite, as
    in bfloat16 beyond 32 terms, needs no kept value)."""
    if not n:
        return 0.0
    ranks = (n // 2,) if n % 2 else (n // 2 - 1, n // 2)
    below = int(n_below.sum())
    local = tuple(r - below for r in ranks)
    if local[0] < 0 or local[-1] >= int(n_kept.sum()):
        return None
    if lo is not None and lo == hi:
        return float(lo)
    if np.any(n_kept > kept.shape[1]):
        return None
    vals = np.concatenate([kept[c, : n_kept[c]] for c in range(kept.shape[0])])  # each chunk's filled prefix
    vals.partition(local)
    return float(vals[local[0]]) if len(local) == 1 else float(np.mean(vals[list(local)]))


def median_from_histogram(hist, ref, bound, prec: int, emin: int) -> float:
    """The exact median of :func:`bound_ulps` over the flat float64 arrays ``ref``, ``bound``, given
    their histogram per chunk of :func:`chunks` (rows of ``hist``): the bins of the middle rank(s)
    found from the counts, only their values gathered (in index order) and partitioned. The median is
    ``np.median``'s: the middle value, or the mean of the two middle values for an even count; 0 for
    none."""
    n = ref.size
    if not n:
        return 0.0
    nch = hist.shape[0]
    ranks = (n // 2,) if n % 2 else (n // 2 - 1, n // 2)
    below = np.cumsum(hist.sum(axis=0))  # values in bins <= b
    lo, hi = (int(np.searchsorted(below, r, side="right")) for r in (ranks[0], ranks[-1]))
    per_chunk = hist[:, lo : hi + 1].sum(axis=1)
    start = np.concatenate(([0], np.cumsum(per_chunk)[:-1]))
    vals = np.empty(int(per_chunk.sum()))
    _ulps_gather(ref, bound, prec, emin, nch, lo, hi, start, vals)
    first = int(below[lo - 1]) if lo else 0  # the rank of the smallest gathered value
    local = tuple(r - first for r in ranks)
    vals.partition(local)
    return float(vals[local[0]]) if len(local) == 1 else float(np.mean(vals[list(local)]))


def median_max_bound_ulps(ref, bound, prec: int, emin: int) -> tuple:
    """(median, max) over i of ``bound_i`` in ulps of the format (prec, emin) at ``ref_i`` (flat
    float64 arrays; an infinite or NaN bound counts as inf; (0, 0) for none): two passes."""
    n = ref.size
    if not n:
        return 0.0, 0.0
    with threads_for(n):  # as top_k (the chunks, and so the gathered values' order, follow the threads inside)
        nch = chunks(n)
        hist, peak = np.zeros((nch, NBINS), np.int64), np.zeros(nch)
        _ulps_histogram(ref, bound, prec, emin, nch, hist, peak)
        return median_from_histogram(hist, ref, bound, prec, emin), float(peak.max())


@jit(parallel=True)
def _bracket_pass(v, lo, hi, kept, n_kept, n_below, n_nan):
    """Per chunk of the flat ``v``: the count of NaNs, of values below ``lo``, and the values in [lo, hi]
    (kept while there is room, all counted), as :func:`median_in_bracket` reads them."""
    n = v.size
    nch = kept.shape[0]
    for ch in prange(nch):
        kc = kept[ch]
        room = max(kc.size, 1)
        nk = nb = nn = 0
        for i in range(ch * n // nch, (ch + 1) * n // nch):
            x = v[i]
            nn += x != x
            nb += x < lo
            kc[min(nk, room - 1)] = x  # committed only by the count
            nk += (x >= lo) & (x <= hi)
        n_kept[ch], n_below[ch], n_nan[ch] = nk, nb, nn


def median(v) -> float:
    """``np.median`` of the float64 values ``v`` (NaN when one is NaN), the same value, from one parallel
    pass: a seeded sample of :data:`BRACKET_SAMPLE` brackets the middle rank(s) (module docstring), the
    pass counts the values below and keeps those inside, and only those are partitioned; ``np.median``
    itself when the array is small, the sample holds a NaN or the bracket misses."""
    v = np.ascontiguousarray(v, np.float64).reshape(-1)
    n = v.size
    if n <= 4 * BRACKET_SAMPLE:
        return float(np.median(v)) if n else float("nan")
    idx = np.sort(np.random.default_rng(_SEED).choice(n, BRACKET_SAMPLE, replace=False))
    s = np.sort(v[idx])
    h = int(math.ceil(BRACKET_SD * math.sqrt(BRACKET_SAMPLE) / 2))
    mid = BRACKET_SAMPLE // 2
    lo, hi = float(s[max(mid - 1 - h, 0)]), float(s[min(mid + h, BRACKET_SAMPLE - 1)])
    if lo != lo or hi != hi:
        return float(np.median(v))
    with threads_for(n):  # as top_k
        nch = chunks(n)
        kept = np.empty((nch, int(3.0 * 2 * h / BRACKET_SAMPLE * (-(-n // nch))) + 64))
        n_kept, n_below, n_nan = (np.zeros(nch, np.int64) for _ in range(3))
        _bracket_pass(v, lo, hi, kept, n_kept, n_below, n_nan)
    if n_nan.any():
        return float("nan")
    m = median_in_bracket(kept, n_kept, n_below, n, lo, hi)
    return float(np.median(v)) if m is None else m
