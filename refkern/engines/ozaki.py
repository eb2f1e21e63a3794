"""The Ozaki scheme with torch: exact slice products on BLAS, added exactly, rounded once.

Everything here is a torch op on the operands' own device (MKL / OpenBLAS on the CPU,
cuBLAS on CUDA); nothing is rounded before :func:`round_digits`.

**Slices** (Ozaki, Ogita, Oishi and Rump, "Error-free transformations of matrix
multiplication by using fast routines of matrix multiplication and its applications",
Numer. Algorithms 59, 2012, doi:10.1007/s11075-011-9478-1). Let a row ``x`` of A (or a
column of B, stored as a row of Bᵀ) have ``2**E <= max|x| < 2**(E + 1)``. With the width
``w`` below, ``y = x * 2**(w - 1 - E)`` has ``|y| < 2**w``, and

    c_1 = round(y),   c_s = round((y - c_1 - ... - c_{s-1}) * 2**((s - 1) w))

(round to nearest even, exact in float64 since |y| < 2**52) gives integer-valued slices
with ``x = sum_s c_s * 2**(E + 1 - s w)`` and ``|c_s| <= 2**w``. Every step is exact: the
scaling is by a power of two, and ``y - c`` is the fraction of ``y`` (fewer bits, same
last place). If the lowest set bit of the row has weight ``2**low``, the remainder after
S slices is a multiple of ``2**low`` of magnitude ``<= 2**(E - S w)``, hence zero once
``S >= floor((E - low) / w) + 1``: the row needs :func:`slices_needed` slices. ``low`` is
taken from the smallest nonzero element and the input format's precision (a float32 of
exponent e is a multiple of ``2**(e - 23)``), never below the format's smallest quantum.

**Slice bound.** A slice product ``C = A_s @ B_tᵀ`` over K terms is a sum of integers
``|c c'| <= 2**(2w)``. With ``K * 2**(2w) <= 2**53`` every partial sum, in whatever order
and blocking the BLAS uses, with or without FMA, is an integer of magnitude ``<= 2**53``,
hence a float64, so the GEMM commits no rounding error: :func:`slice_width` is the largest
such ``w`` (21 for K = 1024, 16 for K = 2**20, 26 for K = 1). One bit wider and sums of up
to ``4 * 2**53`` can round: tests/test_engines.py checks that this makes results wrong.

**Karatsuba.** With S slices per side, the S**2 slice products come from S(S+1)/2 GEMMs:
``A_i B_j + A_j B_i = (A_i + A_j)(B_i + B_j) - A_i B_i - A_j B_j``. The sums have
``|c_0 + c_s| <= 1.5 * 2**w`` (every slice after the first is ``<= 2**(w-1)``), so the width
is then the largest with ``K (9/4) 2**(2w) <= 2**53`` (``slice_width(K, karatsuba=True)``,
one bit less for most K); the subtractions are done in int64.

**Tails.** Rows that need more slices than the dense count keep their extra slices as
"tails" (only their smallest elements have bits there), restricted to their nonzero rows and
columns and multiplied by small GEMMs: the same integer bound holds, so these products are
exact as well.

**Exact addition.** Every GEMM result is converted to int64 (exact: integers below 2**53)
and added into the digit plane ``G_d``, ``d = s + t``: at most 8 pairs per plane, each adding
at most 3 * 2**53 in magnitude (Karatsuba: M_ij - P_i - P_j), so ``|G_d| < 2**58``.
Element (i, j) is ``sum_d G_d * 2**(E_i + F_j + 2 - d w)``, an exact integer expansion that
:func:`round_digits` rounds once, in integer arithmetic, to the result format.
"""

import torch

__all__ = ["slice_width", "row_stats", "slices_needed", "make_slices", "products", "round_digits"]

_NONE = 1 << 40  # "no bit": the lowest-bit exponent of a zero, the leading-bit exponent of zero is -_NONE


def slice_width(k: int, karatsuba: bool = False) -> int:
    """The largest ``w`` with ``k * 2**(2w) <= 2**53``: slice products over k terms are exact.
    With ``karatsuba``, the largest with ``k * (9/4) 2**(2w) <= 2**53``: products of sums of
    two slices (``|c_0 + c_s| <= 1.5 * 2**w``) are exact too."""
    k = max(int(k), 1) * (9 if karatsuba else 4)
    w = 0
    while k << (2 * (w + 1)) <= 1 << 55:
        w += 1
    return w


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2.0**e for integer tensors e in [-1022, 1023], built from the bits (exact)."""
    return ((e + 1023) << 52).view(torch.float64)


def scale_pow2(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x * 2**e (e broadcast against x, clamped to [-2044, 2046]) by two power-of-two factors,
    neither of which overflows: exact whenever the result neither underflows nor overflows."""
    e = e.clamp(-2044, 2046)
    e1 = e.clamp(-1022, 1023)
    return x * _pow2(e1) * _pow2(e - e1)


def row_stats(x: torch.Tensor, prec: int, quantum: int):
    """(E, low, finite) per row of a 2-D float64 tensor holding values of a format with
    ``prec`` significand bits and smallest quantum ``2**quantum`` (-149 for float32):
    ``2**E <= max|x| < 2**(E+1)``, and ``low`` with every element a multiple of ``2**low``
    (``low = max(e_min - prec + 1, quantum)``, e_min the exponent of the smallest nonzero
    ``|x|``, ``_NONE`` for a zero row), and whether the row is finite (E and low are
    meaningless otherwise). A zero row has ``E = -_NONE``, so that the stats of column
    blocks combine by max / min / and."""
    ax = x.abs()
    if x.shape[1] == 0:
        ax = torch.zeros((x.shape[0], 1), dtype=x.dtype, device=x.device)
    mx = ax.amax(1)
    mn = ax.where(ax != 0, torch.inf).amin(1)
    finite = torch.isfinite(mx)
    E = torch.frexp(mx.where(finite, 1.0))[1].to(torch.int64) - 1  # frexp: x = f * 2**e, 0.5 <= f < 1
    lo = torch.frexp(mn.where(torch.isfinite(mn), 1.0))[1].to(torch.int64) - prec
    low = torch.where(mx == 0, _NONE, lo.clamp(min=quantum))
    return E.where(mx != 0, -_NONE), low, finite


def slices_needed(E: torch.Tensor, low: torch.Tensor, w: int) -> torch.Tensor:
    """Slices that hold a row exactly: ``floor((E - low) / w) + 1``, 0 for a zero row."""
    return torch.where(low >= _NONE, 0, torch.div(E - low, w, rounding_mode="floor") + 1)


def make_slices(x: torch.Tensor, E: torch.Tensor, s: int, w: int, keep: torch.Tensor) -> torch.Tensor:
    """(s, rows, K) integer-valued float64 slices with ``x[i] == sum_t out[t, i] * 2**(E_i + 1 - (t+1) w)``
    for every row with ``keep`` (rows needing <= s slices); other rows are zero."""
    if not bool(keep.all()):
        x = x.where(keep[:, None], 0.0)
    e = (w - 1 - E.where(keep, 0))[:, None]
    if bool((e.amin() >= -1022) & (e.amax() <= 1023)):
        y = x * _pow2(e)  # |y| < 2**w, exact
    else:
        y = scale_pow2(x, e)
    out = torch.empty((s, *x.shape), dtype=torch.float64, device=x.device)
    for t in range(s - 1):
        torch.round(y, out=out[t])  # to nearest even: an integer of magnitude <= 2**w
        y.sub_(out[t]).mul_(float(2**w))  # the fraction, exactly, scaled to the next slice
    out[s - 1] = y  # an integer: a kept row needs no more than s slices
    return out


def products(sa, sb, ta, tb, planes, add, karatsuba: bool):
    """planes[s + t] += A_s @ B_tᵀ for every pair of slices, exactly, in int64.

    ``sa`` (S_A, m, k), ``sb`` (S_B, n, k): dense slices; ``ta``, ``tb``: lists of (q, R, C, T),
    the tail slice q of the few rows R that need more slices than the dense ones, restricted
    to its nonzero columns C (T: (len(R), len(C))). ``add(d, x, sign)`` adds ``sign * x`` (a
    float64 tensor of integers below 2**53, converted exactly) into the int64 plane d. Every
    GEMM sums at most k integer products bounded by the slice width, so it is exact in
    float64, in any order; the tails' products go to their rows / columns by index_add.

    With ``karatsuba`` (S_A == S_B == S) the S**2 dense products are formed from S(S+1)/2
    GEMMs: P_i = A_i B_iᵀ and M_ij = (A_i + A_j)(B_i + B_j)ᵀ, with
    A_i B_jᵀ + A_j B_iᵀ = M_ij - P_i - P_j subtracted in int64."""
    if karatsuba:
        S = sa.shape[0]
        for i in range(S):
            p = sa[i] @ sb[i].T
            add(2 * i, p, 1)
            for j in range(S):
                if j != i:
                    add(i + j, p, -1)
            del p
        for i in range(S):
            for j in range(i + 1, S):
                add(i + j, (sa[i] + sa[j]) @ (sb[i] + sb[j]).T, 1)
    else:
        for s in range(sa.shape[0]):
            for t in range(sb.shape[0]):
                add(s + t, sa[s] @ sb[t].T, 1)
    k = sa.shape[2]
    for s, ra, ca, xa in ta:  # tails of A against every slice of B
        for t in range(sb.shape[0]):
            planes[s + t].index_add_(0, ra, (xa @ sb[t][:, ca].T).to(torch.int64))
        full_a = torch.zeros((ra.numel(), k), dtype=xa.dtype, device=xa.device)
        full_a[:, ca] = xa
        for t, rb, cb, xb in tb:
            full_b = torch.zeros((rb.numel(), k), dtype=xb.dtype, device=xb.device)
            full_b[:, cb] = xb
            p = (full_a @ full_b.T).to(torch.int64)
            planes[s + t].index_put_((ra[:, None], rb[None, :]), p, accumulate=True)
    for t, rb, cb, xb in tb:  # tails of B against the dense slices of A
        for s in range(sa.shape[0]):
            planes[s + t].index_add_(1, rb, (sa[s][:, cb] @ xb.T).to(torch.int64))


def _normalize(d: torch.Tensor, w: int):
    """Carry digits (most significant first) so that every digit but the first lies in [0, 2**w)."""
    mask = (1 << w) - 1
    for k in range(d.shape[0] - 1, 0, -1):
        d[k - 1] += d[k] >> w  # arithmetic shift: floor division
        d[k] &= mask


def round_digits(g: torch.Tensor, e0: torch.Tensor, w: int, prec: int, emin: int, emax: int):
    """Round ``V = sum_k g[k] * 2**(e0 - k w)`` once to the format (prec, emin, emax).

    ``g``: (n, ...) int64 digit planes, ``|g| < 2**60``; ``e0``: int64 exponents broadcast
    against one plane. Returns (values, zero): float64 values exactly representable in the
    format (round to nearest even, subnormal grid ``2**(emin - prec + 1)``, +-inf when the
    value rounded with an unbounded exponent reaches ``2**(emax + 1)``, the sign of an
    underflowed nonzero kept) and the mask of exactly zero sums (returned as +0).

    All integer arithmetic: the planes are carried into sign-magnitude digits of w bits
    (one more plane on top takes the carry), which do not overlap; the leading bit, the
    kept bits, the round bit and the sticky bit are then read off digit by digit.
    """
    n = g.shape[0]
    d = torch.empty((n + 1, *g.shape[1:]), dtype=torch.int64, device=g.device)
    d[0] = 0
    d[1:] = g
    _normalize(d, w)  # every digit below the top in [0, 2**w): V < 0 exactly when the top one is
    neg = d[0] < 0
    torch.where(neg, -d, d, out=d)
    _normalize(d, w)  # |V|, all digits >= 0, the top one < 2**(61 - w)
    lead = torch.full_like(e0, -_NONE)
    for j in range(n + 1):  # exponent of the leading bit of |V|: digits < 2**53 convert exactly
        blen = torch.frexp(d[j].to(torch.float64))[1].to(torch.int64)
        lead = torch.where((d[j] != 0) & (lead == -_NONE), e0 + w * (1 - j) + blen - 1, lead)
    zero = lead == -_NONE
    q = torch.clamp(lead - prec + 1, min=emin - prec + 1)  # weight of the last kept bit
    kept = torch.zeros_like(e0)
    rbit = torch.zeros_like(e0)
    sticky = torch.zeros_like(e0, dtype=torch.bool)
    for j in range(n + 1):
        sh = e0 + w * (1 - j) - q  # digit j's last place lies sh places above the last kept bit
        above = sh >= 0
        kept += torch.where(above, d[j], 0) << sh.clamp(0, 62)  # no overflow: kept < 2**(prec + 1)
        kept += torch.where(above, 0, d[j]) >> (-sh).clamp(0, 63)
        t = -1 - sh  # position of the round bit inside digit j
        rbit |= torch.where(t >= 0, d[j] >> t.clamp(0, 63), 0) & 1
        sticky |= (torch.where(t > 0, d[j], 0) & ((1 << t.clamp(0, 62)) - 1)) != 0
    m = kept + (rbit & (sticky | (kept & 1).bool()).to(torch.int64))  # round half to even
    mf = m.to(torch.float64)  # m <= 2**prec <= 2**53: exact
    over = torch.frexp(mf)[1].to(torch.int64) - 1 + q > emax
    q1 = q.clamp(-1022, 1023)
    v = mf * _pow2(q1) * _pow2((q - q1).clamp(-1022, 0))  # m * 2**q: the first product is a normal
    v = torch.where(over, torch.inf, v)  # float64, the second lands exactly on the result
    return torch.where(neg, -v, v), zero
