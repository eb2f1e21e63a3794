"""The log_softmax envelope that cross_entropy's yardstick (:mod:`refkern.analysis.losses`) needs, in one pass
per row, without the (R, C) float64 arrays of :mod:`refkern.analysis._envelope_softmax`.

The bound is that module's (``_Rows`` with zero logit errors, then ``_softmax(..., log=True)``, the centre's
rounding and its store, as :func:`refkern.analysis.envelope._one` adds them), term for term:

* per row (live entries ``z_j``, finite; ``n`` = C): ``M = max z``, ``gap_j = M - z_j``, ``dl_j = 2**-52 (gap_j
  + 1)`` (the float64 exps of the envelope's own weights), ``top = max (z_j + dl_j)``, ``theta_j = dl_j + 3 u
  (top - z_j + dl_j)``, ``rank_j = max(#{k: z_k + 2 dl_k >= z_j - 2 dl_j} - 1, 0)``, ``lam_d,j = theta_j +
  lg((1 + rank_j) 40 u + (rank_j + n - 1) u + u_m)``, ``lam_n,j`` the same with ``min(rank_j, 1)`` and ``2``
  for ``n - 1``, ``t_j = e**-gap_j``, ``e_d,j = t_j expm1(lam_d,j)`` (``e**(lam - gap)`` from ``lam >= 1``),
  ``D = sum t``, ``ED = sum e_d``, ``lmax = max(0, lam_d, lam_n)``, ``a = 6 n eta e**(2 lmax) D`` plus, for a
  half result, ``eta_h n_u 2 D e**(2 lmax)`` over the ``n_u`` terms with ``t e**-max(lam_d, lam_n) < 2**emin 2
  D e**lmax``; ``ell = lg((ED + a) / D) + lg(u_m)``, ``err_l = ell + (8 u + u_m)(log D + ell) + max(eta,
  eta_h) + u |M|``;
* per element: ``c_j = u max(gap_j, |M| + log D + err_l)``, ``b_j = (err_l + c_j + u (o_j + err_l + c_j))
  (1 + (n + 64) 2**-50) + 3 max dl``, plus the centre's rounding ``u_out o_j + h`` and its store ``u_out |ref_j|
  + h``, ``o_j = (|ref_j| + h) / (1 - u_out) >= |exact_j|``, ``h = 2**(emin - prec)`` of the result format.

Two differences, both within float64's own evaluation of the envelope (which its ``(n + 64) 2**-50`` slack
covers; ``tests/test_losses.py`` pins the two within 1e-12 of each other, element by element):

* no correctly rounded log_softmax is computed: where the old bound read ``|ref|`` (the centre's store) and
  ``o = (|ref| + h) / (1 - u_out)`` (an upper bound on ``|exact|``), this one reads ``ref' = RN(hi)`` for ``hi =
  ((M - x) + (L + eL)) (1 + 2**-49) >= |exact|`` (``L`` within ``eL``, :func:`refkern.kernels.loss.log_sums`, and
  ``L <= log C``; three nonnegative float64 roundings, at most ``(1 + 2**-53)**3``, and the product's own):
  rounding is monotone, so ``ref' >= |ref|`` and the bound is never below the old one; they are equal wherever
  ``hi`` and ``|exact|`` round alike, all but a fraction of about ``2**-48 / u_out`` of the elements;
* ``t_j = e**-gap_j`` is exp_fast's (within ``2 u64``, as the reference's own terms) where the old one took
  numpy's exp (within an ulp), and ``expm1(theta + G)`` is ``expm1(theta) EG + expm1(theta) + EG`` from the
  rank's term ``G`` tabulated once for every row (times ``1 + 2**-50``).

The ranks are counted on each row sorted once (an LSD radix sort of the float keys, 32-bit where the row is
float32-valued); the summed quantities are order-free, so no element needs its index. An entry ``-inf`` has
bound ``inf`` (its log-probability is ``-inf``: the store's ``u_out |ref|``), a row holding NaN or ``+inf`` too.
"""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate._bits import pow2
from refkern.accumulate.formats import round_to
from refkern.kernels._transcendental import X_MIN, exp_fast

__all__ = ["logsoftmax_rows", "pick_bounds", "row_sums"]

_ROW_FIELDS = 6  # M, log D, err_l, 3 max dl, status (0 live, 1 bad: NaN or +inf, 2 empty: only -inf), L + eL


@jit(inline="always")
def _lg(s):
    """-log(1 - s), inf from s = 1."""
    if s < 1.0:
        return -np.log1p(-s)
    return np.inf


@jit
def _radix_keys(k, k2, m, npass):
    """Sort the unsigned keys k[:m] ascending (LSD, 11-bit digits, ``npass`` of them; scratch k2): every digit's
    histogram in one pass, and a digit that every key shares is skipped. Returns the array holding the result."""
    cnt = np.zeros((npass, 2048), np.int64)
    mask = k.dtype.type(2047)
    for i in range(m):
        v = k[i]
        for p in range(npass):
            cnt[p, (v >> k.dtype.type(11 * p)) & mask] += 1
    src, dst = k, k2
    for p in range(npass):
        sh = k.dtype.type(11 * p)
        if cnt[p, (src[0] >> sh) & mask] == m:
            continue  # every key has this digit: the pass would not move anything
        s = 0
        for d in range(2048):
            c = cnt[p, d]
            cnt[p, d] = s
            s += c
        for i in range(m):
            d = (src[i] >> sh) & mask
            dst[cnt[p, d]] = src[i]
            cnt[p, d] += 1
        src, dst = dst, src
    return src


@jit
def _sort_bits(bits, top, m, npass):
    """Sort the floats whose bit patterns are bits[:m] (unsigned, ``top`` their sign bit) ascending in place:
    each pattern mapped to a key that orders as its float (a negative one inverted, a positive one with its sign
    bit set), the keys sorted (:func:`_radix_keys`, ``npass`` digits), mapped back."""
    k, k2 = np.empty(m, bits.dtype), np.empty(m, bits.dtype)
    for i in range(m):
        b = bits[i]
        k[i] = ~b if b & top else b | top
    res = _radix_keys(k, k2, m, npass)
    for i in range(m):
        b = res[i]
        bits[i] = b & ~top if b & top else ~b


@jit
def _sort_row(v, m, f32):
    """Sort the finite v[:m] ascending in place (-0.0 before +0.0); ``f32``: every value is a float32 (32-bit
    keys, three digits instead of six)."""
    if f32:
        w = np.empty(m, np.float32)
        for i in range(m):
            w[i] = v[i]
        _sort_bits(w.view(np.uint32), np.uint32(1) << np.uint32(31), m, 3)
        for i in range(m):
            v[i] = w[i]
        return
    _sort_bits(v.view(np.uint64), np.uint64(1) << np.uint64(63), m, 6)


@jit(inline="always")
def _expm1_small(x):
    """expm1(x) for 0 <= x: the Taylor series to x**5 below 1e-3 (remainder below x**6 / 700, under a float64
    ulp of the result), numpy's beyond."""
    if x < 1e-3:
        return x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x / 120.0))))
    return np.expm1(x)


@jit(parallel=True)
def _rows_kernel(X, Ms, st, lel, G, EG, u, u_m, eta, eta_h, out_emin, stats):
    """stats[r] = (M, log D, err_l, 3 max dl, status, lel[r]) per row of X (module docstring), ``Ms`` and ``st``
    the rows' maxima and status from :func:`refkern.kernels.loss.log_sums`; ``G[k]`` the rank-k term of lam_d
    (its lg), ``EG`` its expm1: ``expm1(theta + G) = expm1(theta) EG + expm1(theta) + EG``."""
    R, n = X.shape
    eps_e = 40.0 * u  # exp within 20 ulps of the working format (EXP_ULPS)
    for r in prange(R):
        stats[r, 5] = lel[r]
        bad = False
        M = Ms[r]
        m = 1
        if st[r] != 0:  # NaN or +inf (bad), or only -inf (empty)
            m = 0
            for j in range(n):
                v = X[r, j]
                if v != v or v == np.inf:
                    bad = True
                elif v != -np.inf:
                    m += 1
                    M = v if m == 1 or v > M else M
        if bad:
            stats[r, 0], stats[r, 1], stats[r, 2], stats[r, 3], stats[r, 4] = np.nan, np.nan, np.inf, 0.0, 1.0
            continue
        if m == 0:
            stats[r, 0], stats[r, 1], stats[r, 2], stats[r, 3], stats[r, 4] = -np.inf, -np.inf, 0.0, 0.0, 2.0
            continue
        zs = np.empty(n)
        i = 0
        top = -np.inf
        d64max = 0.0
        f32 = True
        for j in range(n):
            v = X[r, j]
            if v != -np.inf:
                zs[i] = v
                i += 1
                if f32 and np.float64(np.float32(v)) != v:
                    f32 = False
                gap = M - v
                dl = 0.0 + 2.0**-52 * (gap + 1.0)
                if v + dl > top:
                    top = v + dl
                if dl > d64max:
                    d64max = dl
        m = i
        _sort_row(zs, m, f32)
        cs = np.empty(m)
        for i in range(m):
            dl = 0.0 + 2.0**-52 * ((M - zs[i]) + 1.0)
            cs[i] = zs[i] + 2 * dl
        for i in range(1, m):  # nearly sorted already: an insertion sort is one pass
            c = cs[i]
            p = i
            while p > 0 and cs[p - 1] > c:
                cs[p] = cs[p - 1]
                p -= 1
            cs[p] = c
        lam_n0 = _lg(eps_e + 2.0 * u + u_m)  # min(rank, 1) = 0
        lam_n1 = _lg(2.0 * eps_e + 3.0 * u + u_m)  # min(rank, 1) = 1
        D = 0.0
        ED = 0.0
        lmax = 0.0
        lam = np.empty(m if eta_h > 0.0 else 0)  # max(lam_d, lam_n) per term, for a half result's n_u
        p = 0
        for i in range(m):
            z = zs[i]
            gap = M - z
            dl = 0.0 + 2.0**-52 * (gap + 1.0)
            thr = z - 2 * dl
            while p > 0 and cs[p - 1] >= thr:
                p -= 1
            while p < m and cs[p] < thr:
                p += 1
            rank = max(m - p - 1, 0)
            theta = dl + 3.0 * u * (top - z + dl)
            lam_d = theta + G[rank]
            lam_n = theta + (lam_n0 if rank == 0 else lam_n1)
            t = 0.0  # e**-gap: exp_fast within 2 u (0 below e**-2000, as float64's exp)
            if -gap >= X_MIN:
                a, e = exp_fast(-gap)
                t = a * pow2(e) if e >= -1022 else np.ldexp(a, e)
            D += t
            if lam_d < 1.0:
                et = _expm1_small(theta)
                ED += t * ((et * EG[rank] + et + EG[rank]) * (1.0 + 2.0**-50))
            else:
                ED += np.exp(lam_d - gap)
            lmax = max(lmax, lam_d, lam_n)
            if eta_h > 0.0:
                lam[i] = max(lam_d, lam_n)
                zs[i] = t  # z_i is not read again
        a = 6.0 * n * eta * np.exp(2 * lmax) * D
        if eta_h > 0.0:
            thr_u = 2.0**out_emin * 2 * D * np.exp(lmax)
            n_u = 0
            for i in range(m):
                if zs[i] < thr_u:  # t e**-lam <= t (lam >= 0)
                    n_u += 1
                elif not (lam[i] <= 0.5 and zs[i] >= 2.0 * thr_u):  # else t e**-lam >= 0.6 t > thr_u
                    if zs[i] * np.exp(-lam[i]) < thr_u:
                        n_u += 1
            a = a + eta_h * n_u * 2 * D * np.exp(2 * lmax)
        ell = _lg((ED + a) / D) + _lg(u_m)
        logd = np.log(D)
        err_l = ell + (8.0 * u + u_m) * (logd + ell) + max(eta, eta_h) + u * abs(M)
        stats[r, 0], stats[r, 1], stats[r, 2], stats[r, 3], stats[r, 4] = M, logd, err_l, 3.0 * d64max, 0.0


@jit(inline="always")
def _elem(x, M, logd, err_l, d3, status, lel, u, slack, out_u, h, prec, emin, emax):
    """The log_softmax envelope of one element ``x`` of a row (its stats), its centre's rounding and store."""
    if status == 1.0 or x == -np.inf:
        return np.inf
    gap = M - x
    ref = round_to((gap + lel) * (1.0 + 2.0**-49), prec, emin, emax)  # >= |RN(exact)|: rounding is monotone
    o = (ref + h) / (1.0 - out_u)  # >= |exact|
    c = u * max(gap, abs(M) + logd + err_l)
    b = (err_l + c + u * (o + err_l + c)) * slack + d3 + (out_u * o + h) + (out_u * ref + h)
    return np.inf if b != b else b


@jit
def _pick_kernel(X, stats, cols, u, slack, out_u, h, prec, emin, emax, out):
    for r in range(X.shape[0]):  # serial: one element per row (a parallel launch costs more)
        s = stats[r]
        out[r] = _elem(X[r, cols[r]], s[0], s[1], s[2], s[3], s[4], s[5], u, slack, out_u, h, prec, emin, emax)


@jit(parallel=True)
def _sums_kernel(X, M, L, stats, W, P, dense, eps, u, slack, out_u, h, prec, emin, emax, out):
    """out[r] = (sum_c a_c l_c, sum_c |a_c| |l_c|, sum_c |a_c| b_c), l_c = (M - x_c) + L, a_c = w_c or, with
    probability targets (dense), w_c (P_rc (1 - eps) + eps / C)."""
    R, C = X.shape
    for r in prange(R):
        s = stats[r]
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        for j in range(C):
            a = W[j] * (P[r, j] * (1.0 - eps) + eps / C) if dense else W[j]
            lp = (M[r] - X[r, j]) + L[r]
            s1 += a * lp
            s2 += abs(a) * abs(lp)
            s3 += abs(a) * _elem(X[r, j], s[0], s[1], s[2], s[3], s[4], s[5], u, slack, out_u, h, prec, emin, emax)
        out[r, 0], out[r, 1], out[r, 2] = s1, s2, s3


def _units(fmt):
    """(u, u_m, eta, eta_h, u_out, h) of :mod:`refkern.analysis._envelope_softmax` for a result format."""
    from refkern.accumulate.formats import FLOAT32, FLOAT64

    u = FLOAT64.u if fmt is FLOAT64 else FLOAT32.u
    u_m = fmt.u if fmt.prec < FLOAT32.prec else 0.0
    eta = 2.0 ** (FLOAT64 if u <= FLOAT64.u else FLOAT32).emin
    eta_h = 2.0 ** (fmt.emin - fmt.prec) if u_m > 0 else 0.0
    return u, u_m, eta, eta_h, fmt.u, 2.0 ** (fmt.emin - fmt.prec)


def logsoftmax_rows(X, ls, fmt) -> np.ndarray:
    """(R, 6) per-row statistics of the log_softmax envelope of the float64 rows X for a result in ``fmt``
    (module docstring); ``ls = (M, L, eL, status)`` of :func:`refkern.kernels.loss.log_sums` (``L`` within ``eL``
    of each row's log-sum-exp)."""
    Ms, L, eL, st = ls
    R, n = X.shape
    u, u_m, eta, eta_h, _, _ = _units(fmt)
    stats = np.empty((R, _ROW_FIELDS))
    if R:
        with np.errstate(all="ignore"):
            lel = np.minimum(np.where(np.isnan(eL), np.inf, L + eL), np.log(max(n, 1)) * (1 + 2.0**-50))  # L <= log n
            rank = np.arange(max(n, 1))
            s = (1 + rank) * (40.0 * u) + (rank + n - 1) * u + u_m  # lam_d's rank term, the same for every row
            G = np.where(s < 1.0, -np.log1p(-np.minimum(s, 1.0)), np.inf)
            EG = np.expm1(G)
        _rows_kernel(np.ascontiguousarray(X, np.float64), np.asarray(Ms, np.float64), np.asarray(st, np.int8),
                     np.asarray(lel, np.float64), G, EG, u, u_m, eta, eta_h, float(fmt.emin), stats)  # fmt: skip
    return stats


def _slack(n):
    return 1.0 + (n + 64) * 2.0**-50


def pick_bounds(X, stats, cols, fmt) -> np.ndarray:
    """The envelope at ``(r, cols[r])`` of every row r (cols in range)."""
    u, _, _, _, out_u, h = _units(fmt)
    out = np.empty(X.shape[0])
    cols = np.asarray(cols)
    if cols.size and not (0 <= cols.min() and cols.max() < X.shape[1]):  # the kernel does not check its reads
        raise IndexError(f"pick_bounds: a column lies outside [0, {X.shape[1]}).")
    if X.shape[0]:
        _pick_kernel(X, stats, np.ascontiguousarray(cols, np.int64), u, _slack(X.shape[1]), out_u, h, *fmt.params, out)
    return out


def row_sums(X, M, L, stats, w, probs, eps, fmt) -> np.ndarray:
    """(R, 3) per row: ``sum a l``, ``sum |a| |l|`` and ``sum |a| b`` (:func:`_sums_kernel`)."""
    u, _, _, _, out_u, h = _units(fmt)
    R, C = X.shape
    out = np.empty((R, 3))
    dense = probs is not None
    P = np.ascontiguousarray(probs, np.float64) if dense else np.zeros((1, 1))
    if R:
        _sums_kernel(X, M, L, stats, np.ascontiguousarray(w, np.float64), P, dense, float(eps), u, _slack(C), out_u,
                     h, *fmt.params, out)  # fmt: skip
    return out
