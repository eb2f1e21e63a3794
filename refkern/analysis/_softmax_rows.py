"""The denominator side of the softmax and attention envelopes (:class:`refkern.analysis._envelope_softmax._Rows`)
in one jitted pass per row: the quantities that class formed as a dozen (R, n) float64 arrays and a sort per row.

Per row of logits ``z`` with logit errors ``dl`` and the float64 logits' own ``d64`` (the class's docstring and
:mod:`refkern.analysis._envelope_softmax`'s give the derivation), with ``live`` the finite entries of a row that
holds no NaN and no ``+inf``: ``M = max z``, ``gap = M - z``, ``d64' = d64 + 2**-52 (gap + 1)``, ``dl' = dl +
d64'``, ``top = max (z + dl')``, ``theta = dl' + ARG_ROUNDINGS u (top - z + dl')``, ``rank_j = max(#{k live: z_k +
2 dl'_k >= z_j - 2 dl'_j} - 1, 0)``, ``lam_d``, ``lam_n``, ``t = e**-gap``, the grown terms ``e_d``, ``e_n``, ``D``,
``ED``, ``lmax``, the underflow term ``a``. Each quantity is the same float64 expression as the array form; the
sums run left to right (numpy's are pairwise: they differ within float64's own evaluation of the envelope, which
its ``(n + E + 64) 2**-50`` slack covers); the terms' exp ``t`` is numpy's vector exp (within 0.69 ulp of the exact
value on 60,000 arguments in [-700, 0] against mpmath), the other exp, expm1 and log1p the C library's (within an
ulp).

The ranks are counted without a comparison sort: by buckets of equal width over the range of the live ``z + 2
dl'`` (:func:`_ranks_by_buckets`), or where those cluster, the live ``z + 2 dl'`` and ``z - 2 dl'`` sorted by their
bits (the float order: a sign flip of the negative values' bits; an LSD radix sort of the top bits, then an
insertion sort of the ties, or a radix sort of all 64 bits where those are many) and merged.

**The statistical scale's shared part** (:func:`shared_sq`, :func:`half_ulp`; used by the scale of
:mod:`refkern.analysis.noise` and :mod:`refkern.analysis.noise_backward`): a rounding to nearest of a value of
magnitude ``m`` errs by at most half its ulp, ``h(m) = u 2**floor(log2 m)`` (Higham's ``u m`` is its bound
over a binade: ``h(m)`` lies in ``(u m / 2, u m]``); a bounded, mean-zero error in ``[-h, h]`` is sub-Gaussian
with parameter ``h`` (Hoeffding's lemma), so the scale charges ``h`` where ``u m`` overstated it by up to
2 (on values spread over binades, ``E (h / (u m))**2 = 3 / (8 ln 2) = 0.54``). And an online softmax's rescale,
``exp(m_old - m_new)`` times its running sum, moves ``D`` by that sum, not by ``D``: the records of the running
maximum are charged the sum of the terms before them (:func:`shared_sq`), which for 4 randn rows of 64 logits
is 0.33 to 0.91 of ``D**2`` in all where the record count charged 2 to 7.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit

__all__ = ["rows_pass", "rank_tables", "logit_errors_pass", "shared_sq", "half_ulp", "ROW_FIELDS"]

ROW_FIELDS = 7  #: per row: M, D, ED, a, d64max, bad, empty


@jit(inline="always")
def _expm1_small(x):
    """expm1(x) for 0 <= x: the Taylor series to x**5 below 1e-3 (remainder below x**6 / 700, under a float64
    ulp of the result), the C library's beyond."""
    if x < 1e-3:
        return x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x / 120.0))))
    return np.expm1(x)


@jit(inline="always")
def _grow(t, gap, lam, et, eg):
    """t (e**lam - 1) of a live term of ``lam = theta + G`` (``et = expm1(theta)``, ``eg = expm1(G)``), as
    _Rows._grow: below lam = 1 from ``expm1(theta + G) = et eg + et + eg`` (an identity; its three roundings
    and expm1's own are within 2**-50 relative, taken upward), ``e**(lam - gap)`` from lam = 1 (no 0 * inf
    where t underflows)."""
    if lam < 1.0:
        return t * ((et * eg + et + eg) * (1.0 + 2.0**-50))
    return np.exp(lam - gap)


def rank_tables(n, u, u_m, eps_e, num_ops, num_rescales):
    """(lg_d, eg_d, lg_n, eg_n): per rank r (0 .. n - 1) the rank term of lam_d, ``lg((1 + r) eps_e + (r + n - 1) u
    + u_m)``, and of lam_n, ``lg((1 + r) eps_e + (r + num_ops) u + u_m)`` (r capped at ``num_rescales``), and their
    expm1: each computed once per call, not once per term."""
    r = np.arange(max(n, 1), dtype=np.float64)
    with np.errstate(all="ignore"):
        s_d = (1 + r) * eps_e + (r + n - 1) * u + u_m
        r_n = r if num_rescales is None else np.minimum(r, num_rescales)
        s_n = (1 + r_n) * eps_e + (r_n + num_ops) * u + u_m
        lg_d, lg_n = (np.where(s < 1.0, -np.log1p(-np.minimum(s, 1.0)), np.inf) for s in (s_d, s_n))
        return lg_d, np.expm1(lg_d), lg_n, np.expm1(lg_n)


@jit(inline="always")
def _key(x):
    """The bits of the float64 ``x`` (not NaN) as an unsigned key in the float order (-0.0 taken as +0.0)."""
    b = np.float64(x + 0.0).view(np.uint64)
    top = np.uint64(1) << np.uint64(63)
    return ~b if b & top else b | top


@jit
def _radix(k, p, k2, p2, m, d0):
    """Sort the keys k[:m] with their payloads p[:m] ascending by their bits from ``8 d0`` up (LSD, 8-bit
    digits: a row of a thousand keys costs more in its histograms than in its moves beyond that; a digit every
    key shares is skipped; scratch k2, p2). Returns the (keys, payloads) arrays that hold the result."""
    cnt = np.zeros((8, 256), np.int64)
    mask = np.uint64(255)
    for i in range(m):
        v = k[i]
        for d in range(d0, 8):
            cnt[d, (v >> np.uint64(8 * d)) & mask] += 1
    sk, sp, dk, dp = k, p, k2, p2
    for d in range(d0, 8):
        sh = np.uint64(8 * d)
        if m == 0 or cnt[d, (sk[0] >> sh) & mask] == m:
            continue
        s = 0
        for b in range(256):
            c = cnt[d, b]
            cnt[d, b] = s
            s += c
        for i in range(m):
            b = (sk[i] >> sh) & mask
            j = cnt[d, b]
            dk[j] = sk[i]
            dp[j] = sp[i]
            cnt[d, b] = j + 1
        sk, sp, dk, dp = dk, dp, sk, sp
    return sk, sp


@jit
def _sort(k, p, m):
    """Sort the keys k[:m] with their payloads ascending: by their top 24 bits (three radix digits), then an
    insertion sort of the few keys that share them; where more than 8 m moves would be needed (keys that agree
    in their top bits: logits within a part in 2**12 of each other), by all 64 bits. Returns (keys, payloads)."""
    k2, p2 = np.empty(m, np.uint64), np.empty(m, np.int64)
    sk, sp = _radix(k, p, k2, p2, m, np.int64(5))
    moves = 0
    for i in range(1, m):
        c, cp = sk[i], sp[i]
        j = i
        while j > 0 and sk[j - 1] > c:
            sk[j] = sk[j - 1]
            sp[j] = sp[j - 1]
            j -= 1
        sk[j], sp[j] = c, cp
        moves += i - j
        if moves > 8 * m:
            return _radix(sk, sp, np.empty(m, np.uint64), np.empty(m, np.int64), m, np.int64(0))
    return sk, sp


@jit
def _ranks_by_sort(zi, dlp, lv, m, n, rank):
    """rank[j] = max(#{k live: c_k >= thr_j} - 1, 0) for the live j of a row (``c = z + 2 dl'``, ``thr = z - 2
    dl'``; n - 1 where thr is -inf): the live c sorted, the live thresholds sorted with their index, merged."""
    ck, cp = np.empty(m, np.uint64), np.zeros(m, np.int64)
    tk, tp = np.empty(m, np.uint64), np.empty(m, np.int64)
    q = 0
    for j in range(n):
        if lv[j]:
            ck[q] = _key(zi[j] + 2 * dlp[j])
            tk[q] = _key(zi[j] - 2 * dlp[j])
            tp[q] = j
            q += 1
    sc, _ = _sort(ck, cp, m)
    st, sp = _sort(tk, tp, m)
    p = 0  # sc[:p] < the threshold
    for q in range(m):
        j = sp[q]
        if zi[j] - 2 * dlp[j] == -np.inf:  # an infinite logit error: every entry of the row counts
            rank[j] = n - 1
            continue
        while p < m and sc[p] < st[q]:
            p += 1
        rank[j] = max(m - p - 1, 0)


_MAX_BUCKET = 64  # entries of one bucket beyond which the ranks are counted by sorting instead


@jit
def _ranks_by_buckets(zi, dlp, lv, m, n, rank):
    """:func:`_ranks_by_sort`'s ranks counted without sorting, where the finite c spread over their range: m
    equal-width buckets over [min c, max c] (``b(x) = min(floor((x - min c) m / (max c - min c)), m - 1)``,
    monotone in x as each of its float64 steps is), so every c of a lower bucket than a threshold's is below
    it, every c of a higher one is not, and only the threshold's own bucket is compared value by value. False
    (nothing written) where a bucket would hold more than :data:`_MAX_BUCKET` entries (clustered c) or the
    range's scale is not finite."""
    lo, hi = np.inf, -np.inf
    for j in range(n):
        if lv[j]:
            c = zi[j] + 2 * dlp[j]
            if c != np.inf:
                lo = min(lo, c)
                hi = max(hi, c)
    nb = max(m, 1)
    scale = nb / (hi - lo) if hi > lo else 0.0
    if not scale < np.inf:
        return False
    cnt = np.zeros(nb + 1, np.int64)
    for j in range(n):
        if lv[j]:
            c = zi[j] + 2 * dlp[j]
            if c != np.inf:
                cnt[min(np.int64((c - lo) * scale), nb - 1) + 1] += 1
    for b in range(1, nb + 1):
        if cnt[b] > _MAX_BUCKET:
            return False
        cnt[b] += cnt[b - 1]  # cnt[b]: the finite c of the buckets below b
    vals = np.empty(max(cnt[nb], 1))
    fill = cnt[:nb].copy()
    for j in range(n):
        if lv[j]:
            c = zi[j] + 2 * dlp[j]
            if c != np.inf:
                b = min(np.int64((c - lo) * scale), nb - 1)
                vals[fill[b]] = c
                fill[b] += 1
    nfin = cnt[nb]
    for j in range(n):
        if not lv[j]:
            continue
        t = zi[j] - 2 * dlp[j]
        if t == -np.inf:  # an infinite logit error: every entry of the row counts
            rank[j] = n - 1
            continue
        if nfin == 0 or t <= lo:
            below = 0
        elif t > hi:
            below = nfin
        else:
            b = min(np.int64((t - lo) * scale), nb - 1)
            below = cnt[b]
            for k in range(cnt[b], cnt[b + 1]):
                below += vals[k] < t
        rank[j] = max(m - below - 1, 0)  # the infinite c are never below a finite threshold
    return True


@jit(parallel=True, error_model="numpy")
def rows_pass(z, dl, d64, u, arg_r, num_rescales, lg_d, eg_d, lg_n, eg_n, und, eta_h, emin2, keep, t, gap, theta,
              e_n, live, rows):  # fmt: skip
    """Per row of the (R, n) arrays (module docstring): ``e_n`` (0 off the live entries), ``rows[i] = (M, D, ED,
    a, d64max, bad, empty)`` and, with ``keep``, ``t``, ``gap``, ``theta`` (0 off the live entries) and ``live``
    (else those four are not written). On entry ``e_n`` holds ``exp(z - max z)`` per entry (formed by
    :class:`~refkern.analysis._envelope_softmax._Rows` with numpy's vector exp, a tenth of a scalar exp's time),
    read where a term is live. ``arg_r = ARG_ROUNDINGS``, ``num_rescales`` the numerator's rescales (its
    rank capped there; -1: not capped), the rank terms of :func:`rank_tables`, ``und = UNDERFLOW_OPS n eta``
    (``eta`` the working format's smallest normal), ``eta_h`` half the result format's smallest subnormal where
    intermediates are stored in it (else 0), ``emin2 = 2**emin`` of the result format."""
    R, n = z.shape
    for i in prange(R):
        zi, dli, d64i = z[i], dl[i], d64[i]
        bad = False
        M = -np.inf
        m = 0
        for j in range(n):
            v = zi[j]
            if v != v or v == np.inf:
                bad = True
            elif v != -np.inf:
                m += 1
                M = max(M, v)
        if bad:
            M, m = -np.inf, 0
        lv = np.empty(n, np.bool_)
        dlp = np.empty(n)
        top = -np.inf
        d64max = 0.0
        for j in range(n):
            v = zi[j]
            lv[j] = (not bad) and v - v == 0.0
            if lv[j]:
                g = M - v
                dd = d64i[j] + 2.0**-52 * (g + 1.0)  # + the float64 exp of the envelope's weights
                d64max = max(d64max, dd)
                x = dli[j] + dd
                dlp[j] = x
                top = max(top, v + x)  # >= the computed maximum
            else:
                dlp[j] = 0.0
        rank = np.empty(n, np.int64)
        if not _ranks_by_buckets(zi, dlp, lv, m, n, rank):
            _ranks_by_sort(zi, dlp, lv, m, n, rank)
        D = 0.0
        ED = 0.0
        lmax = 0.0
        tr = np.empty(n if eta_h > 0.0 else 0)
        for j in range(n):
            if not lv[j]:
                e_n[i, j] = 0.0
                if keep:
                    t[i, j], gap[i, j], theta[i, j] = 0.0, 0.0, 0.0
                continue
            g = M - zi[j]
            th = dlp[j] + arg_r * u * (top - zi[j] + dlp[j])
            r = rank[j]
            r_n = r if num_rescales < 0 else min(r, num_rescales)
            lam_d = th + lg_d[r]
            lam_n = th + lg_n[r_n]
            tt = e_n[i, j]  # exp(-g), numpy's (the caller's), read before e_n is written here
            if keep:
                t[i, j], gap[i, j], theta[i, j] = tt, g, th
            et = _expm1_small(th)
            e_n[i, j] = _grow(tt, g, lam_n, et, eg_n[r_n])
            ED += _grow(tt, g, lam_d, et, eg_d[r])
            D += tt
            lmax = max(lmax, lam_d, lam_n)
            if eta_h > 0.0:
                tr[j] = tt
                dlp[j] = max(lam_d, lam_n)  # dl' is not read again: the larger lam, for the underflow count
        if keep:
            for j in range(n):
                live[i, j] = lv[j]
        a = und * np.exp(2 * lmax) * D
        if eta_h > 0.0:  # stored terms that may fall below the result format's normal range, eta_h 2 D e**lmax each
            thr = emin2 * 2 * D * np.exp(lmax)
            n_u = 0
            for j in range(n):
                if not lv[j]:
                    continue
                tt = tr[j]
                if tt < thr:  # t e**-lam <= t (lam >= 0)
                    n_u += 1
                elif not (dlp[j] <= 0.5 and tt >= 2.0 * thr):  # else t e**-lam >= 0.6 t > thr: no exp needed
                    if tt * np.exp(-dlp[j]) < thr:
                        n_u += 1
            a = a + eta_h * n_u * 2 * D * np.exp(2 * lmax)
        rows[i, 0], rows[i, 1], rows[i, 2], rows[i, 3] = M, D, ED, a
        rows[i, 4], rows[i, 5], rows[i, 6] = d64max, 1.0 if bad else 0.0, 1.0 if (not bad) and m == 0 else 0.0


@jit(parallel=True, error_model="numpy")
def logit_errors_pass(z, mag, ql, kl, m, has_m, G_h, base, u_m, c_l1, e_h2, eta_h, c_m, e2, dl, d64):
    """Per logit of attention (:func:`refkern.analysis._envelope_softmax._logit_errors`, the same float64
    expressions in the same order): ``dl = G_h mag + base`` (``base = (E + LOGIT_ROUNDINGS) eta``); for a half
    result (``u_m``) ``+ c_l1 (ql_i + kl_j) + e_h2`` (a stored q or k that underflows: ``c_l1 = (1 + G_h) eta_h
    max(s, sqrt(s))``, ``e_h2 = E eta_h**2``), then ``+ u_m (mag + dl) + eta_h`` (the stored scores); where a float
    mask ``m`` is finite and non-zero (``has_m``), ``+ c_m (|z| + mag + dl) + eta_h`` (converted, added, stored:
    ``c_m = (2 u + u_m) (1 + 2 u + u_m)``); NaN as inf. ``d64 = 2**-52 (e2 mag + |z|)`` (``e2 = E + 2``)."""
    L, S = z.shape
    for i in prange(L):
        for j in range(S):
            g = mag[i, j]
            zz = z[i, j]
            x = G_h * g + base
            if u_m:
                x = x + c_l1 * (ql[i] + kl[j]) + e_h2
                x = x + u_m * (g + x) + eta_h
            if has_m:
                mv = m[i, j]
                if mv - mv == 0.0 and mv != 0.0:
                    x = x + (c_m * (abs(zz) + g + x) + eta_h)
            dl[i, j] = np.inf if x != x else x
            d64[i, j] = 2.0**-52 * (e2 * g + abs(zz))


def half_ulp(m, u):
    """``u 2**floor(log2 m)`` elementwise for ``m >= 0`` (an array): the most that rounding a value of magnitude
    ``m`` to nearest in a format of unit roundoff ``u`` errs (half its ulp; at most ``u m``, at least half of it);
    0 at 0, ``u m`` where ``m`` is not finite (inf and NaN propagate)."""
    m = np.asarray(m, np.float64)
    with np.errstate(all="ignore"):
        fin = np.isfinite(m) & (m > 0)
        e = np.frexp(np.where(fin, m, 1.0))[1]
        return np.where(fin, u * np.ldexp(1.0, e - 1), u * m)


def shared_sq(X, t, u, b_max):
    """Per row of logits X (R, n) and their terms ``t = exp(z - M)`` (float64; D = sum t): ``(adds, rescales)``
    of the statistical scale's error of D that a row shares (:func:`refkern.analysis.noise._softmax_rows`), each
    relative to D**2 and the larger over the two reading orders (left to right, right to left):

    * ``adds = sum_k h_k**2 / D**2`` over the n - 1 additions of the running sum: from the row's maximum on (its
      first occurrence in the reading order) ``h_k = h(m_k)``, ``h(m) = u 2**floor(log2 m)`` the half-ulp of a
      value of magnitude ``m`` (round to nearest errs by at most that), ``m_k = P_k (1 + 2 u (k + 2 b_max))``
      the exact partial sum ``P_k`` widened by a first-order bound on the computed one's distance from it (k
      additions, each term's exp within ``b_max`` ulps: ``2 b_max u`` relative), so that its binade is never
      below the computed one's; before it ``h_k = u P_k`` (an online kernel holds those partial sums in the
      units of a smaller running maximum, ``P_k e**(M - m)``, whose place in its binade is not ``P_k``'s: only
      ``u`` relative is known);
    * ``rescales = sum_p (S_p / D)**2`` over the records ``p`` of the running maximum (each row's first finite
      value not counted; NaN read as -inf), ``S_p`` the sum of the terms read before ``p``: an online softmax
      multiplies its running sum by ``exp(m_old - m_new)`` when the maximum rises, and that exp's and product's
      errors move D by ``S_p`` times them (in the final maximum's units); a tiled kernel rescales once per tile
      whose maximum is a record, the sum of the tiles before it, at most ``S_p`` of that record.

    A row whose ``t`` holds NaN gives NaN (as the sum's square would)."""
    R, n = X.shape
    adds, resc = np.empty(R), np.empty(R)
    if R:
        X, t = np.ascontiguousarray(X, np.float64), np.ascontiguousarray(t, np.float64)
        _shared_sq_rows(X, t, float(u), float(b_max), adds, resc)
    return adds, resc


@jit(inline="always")
def _half_ulp(m, u):
    """:func:`half_ulp` of one value."""
    if m > 0.0 and m - m == 0.0:
        return u * math.ldexp(1.0, math.frexp(m)[1] - 1)
    return u * m


@jit(parallel=True, error_model="numpy")
def _shared_sq_rows(X, t, u, b_max, adds, resc):
    """:func:`shared_sq` row by row."""
    R, n = X.shape
    for i in prange(R):
        D = 0.0
        for j in range(n):
            D += t[i, j]
        top = -np.inf  # the row's maximum (NaN read as -inf)
        for j in range(n):
            x = X[i, j]
            if x == x and x > top:
                top = x
        best_a, best_r = 0.0, 0.0
        for back in range(2):
            p, a, r, m = 0.0, 0.0, 0.0, -np.inf
            for q in range(n):
                j = n - 1 - q if back else q
                x = X[i, j]
                x = -np.inf if x != x else x
                if q >= 1 and x > m:
                    r += p * p
                m = max(m, x)
                p += t[i, j]
                if q >= 1:
                    # from the maximum on, the running sum is in the final units: its half-ulp; before, u P
                    h = _half_ulp(p * (1.0 + 2.0 * u * (q + 2.0 * b_max)), u) if m == top else u * p
                    a += h * h
            a, r = a / (D * D), r / (D * D)
            best_a = a if (a != a or a > best_a) else best_a
            best_r = r if (r != r or r > best_r) else best_r
        adds[i], resc[i] = best_a, best_r
