"""A float32 variance's long chains, emulated on the very inputs: the members of its rounding family
that no scale can hold tightly, taken out of the scale and tested one by one (as
:mod:`refkern.analysis.noise_chains` does for sums).

The scale of :mod:`refkern.analysis.noise` charges ``M2 = sum (x - mean)**2`` the worst order's roundings:
the squares' partial sums of one chain of ``n`` terms, and a sequential Welford mean, whose k-th rounding
``u (|m_k| + 2 |g_k|)`` reaches M2 as ``2 k (mean - m_k)``. On rows of mean ``mu`` and spread ``s`` the
latter is ``sum_k 4 k**2 (1/k - 1/n) s**2 (u mu)**2 ~ (2/3) n**2 (s u mu)**2``: about ``0.8 u |mu| / s`` of
M2 relative, whatever ``n`` (245 u at mean 300 and spread 1). With one output there is one draw: the
test's threshold is ``lam`` times that, while a correct Welford kernel is one deterministic chain (a
float32 var of 1000 values of mean 300 off by 32 times the spread of correct kernels passed, bench_verdict).

So the members with long chains are emulated exactly, and the scale keeps only the others:

* **Welford members** (:func:`member_specs`, flag 0): ``T`` contiguous chunks (torch's ``ceil(n / T)`` and
  OpenMP's static split) of ``L`` strided lanes (:data:`~refkern.analysis.noise_chains.LANES`) with ``T L <
  C`` (noise_chains' specs, the scalar loop also right to left), and blocks of a fixed ``B = 2**p`` with
  ``B > ceil(n / C)`` and fewer than ``C`` blocks (a kernel's tile), each chain the float32 update ``d = x -
  m; m = m + d / k; q = q + d (x - m)`` (torch's WelfordOps, Knuth). The chains' states ``(k_j, m_j, q_j)``
  are exact float32 numbers; how they are merged (Chan's formula) is free, so such a member is a centre,
  the exact merge ``M2c = sum q_j + sum k_j (m_j - mc)**2``, with a scale of its own: the merges' mean
  roundings ``u (|M_t| + 3 |g_t|)`` reaching M2 as ``2 N_t (mc - M_t)``, their products' (``6 u`` of each
  ``delta**2 N_a k_b / N``: ``delta`` twice, its square, two products, ``k_b / N``) and the M2 partial sums
  (``max`` over the chains merged left to right, right to left and pairwise).
* **blocked Welford members merged in float32** (flag 2): tiles of ``B = 2**p`` from :data:`B_MIN` to
  ``ceil(n / C)`` (at least ``C`` blocks: the merges themselves a long chain), each block a Welford chain,
  the blocks merged left to right by Chan's formula in float32 (torch's combine, and the M2 term's other
  association): everything emulated. Such a merge chain can stagnate (10**7 offset values in blocks of 64:
  the running mean's increment ``delta 64 / N`` falls under its half-ulp, the mean freezes and M2 gains
  ``n E**2``, 2119 ulps, far beyond the rest's first-order scale) while staying inside the whole family's.
* **two-pass scalar members** (flag 1): the mean summed by one float32 chain (left to right or right to
  left), divided by ``n`` or multiplied by ``fl(1 / n)``, then ``fl(fl(x - m)**2)`` summed by one chain
  either way: everything emulated.

The division by ``D = n - correction`` (or the product by ``fl(1 / D)``) and std's square root are the
last roundings: with one chain, ``fl(M2 / D)`` is known exactly and std's centre is its square root (a
half result: the float32 value, the store the test's interval). A member is the element test of a stored
result (``inside._straddle``): it must be matched exactly, or within its merge's scale.

**The rest** (:func:`rest_s2`) is every order whose chains hold at most ``ceil(n / C)`` terms, ``C =
min(isqrt(n), C_MAX)`` (noise_chains' balance: the within-chain drift ``(2/3) n**2 / C`` and the merges'
``(2/3) n C``, in units of ``(s u mu)**2``, are equal at ``C = sqrt(n)``), on the sum convention (on data
without structure other splits have smaller partial sums): the larger of ``C`` contiguous chunks and ``C``
strided lanes, each read either way, of their Welford drift plus their merges' (left to right, right to
left, pairwise) and their chains' M2 partial sums, or of a two-pass over the same chains (the squares'
partial sums and their combine: noise_chains' rest on ``d**2``; the mean summed in those chains, at second
order ``n e_mu**2``), whichever is larger (a kernel is one or the other: their combines are the same partial
sums, not two), with the order-free roundings ``5 d**4`` (each ``d`` and its square).

A kernel with a long chain that is none of the members is outside the family and may be called a mismatch:
a two-pass whose mean is summed in short chains (or by threads) and whose squares in one long chain (its
mean is not known exactly, so neither are its squares), a Welford in chunks of other boundaries or with
other updates (``m + d * fl(1 / k)``, a fused multiply-add), a dynamic schedule.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis.noise_chains import C_MAX, _chunk, chains_of
from refkern.analysis.noise_chains import member_specs as _sum_specs

__all__ = ["member_specs", "members", "member_moments", "batches", "rest_s2", "WELFORD", "TWO_PASS", "BLOCKS", "B_MIN"]

WELFORD, TWO_PASS, BLOCKS = 0, 1, 2  #: the flag of a member spec
B_MIN = 32  #: the smallest tile of the blocked Welford members merged in float32 (a warp's width)


def _ro(a, dtype):
    """``a`` as the kernels read it: C-contiguous, ``dtype``, read-only (one compiled signature per kernel)."""
    v = np.ascontiguousarray(a, dtype).view()
    v.flags.writeable = False
    return v


def member_specs(n: int) -> np.ndarray:
    """(k, 6) int64 rows ``(flag, T, L, back, omp, B)``: Welford members (flag :data:`WELFORD`: noise_chains'
    ``(T, L, back, omp)`` with ``B = 0``, and fixed blocks ``B`` with ``T = ceil(n / B)``, ``L = 1``), and
    the two-pass scalar members (flag :data:`TWO_PASS`: ``back`` the mean's direction, ``omp`` the squares'
    (0: left to right), ``L`` the division's variant (1: ``/ n``, 2: ``* fl(1 / n)``)), and blocks of ``B =
    2**p``, ``B_MIN <= B <= ceil(n / C)``, merged left to right in float32 (flag :data:`BLOCKS`, ``T``
    blocks, ``L`` the M2 update's form: 1 torch's ``(a.m2 + b.m2) + delta delta a.n (b.n / n)``, 2
    ``(a.m2 + b.m2) + delta delta ((a.n b.n) / n)``); empty where ``C < 2``."""
    C = chains_of(n)
    if C < 2:
        return np.zeros((0, 6), np.int64)
    out = [(WELFORD, T, L, back, omp, 0) for T, L, back, omp in _sum_specs(n)]
    c = -(-n // C)
    B = 1 << max(c.bit_length(), 1)  # the smallest power of two above ceil(n / C)
    while B < n:
        if -(-n // B) < C:
            out.append((WELFORD, -(-n // B), 1, 0, 0, B))
        B *= 2
    for back in range(2):
        for sq in range(2):
            for div in (1, 2):
                out.append((TWO_PASS, 1, div, back, sq, 0))
    B = B_MIN
    while B <= c:  # at least C blocks: their merges are a long chain, emulated too
        for form in (1, 2):
            out.append((BLOCKS, -(-n // B), form, 0, 0, B))
        B *= 2
    return np.array(out, np.int64).reshape(-1, 6)


@jit(inline="always")
def _merge_scale(cnt, mu, q, m, mc, u):
    """The merges' variance of ``m`` chain states (count, float64 mean, M2) merged left to right (module
    docstring): the mean's roundings through ``2 N_t (mc - M_t)``, the between terms' ``6 u``, and the M2
    partial sums; a merge whose result is the last (``t = m - 1``) has no later step to move."""
    N, M, s2, acc = cnt[0], mu[0], 0.0, q[0]
    for t in range(1, m):
        Nn = N + cnt[t]
        delta = mu[t] - M
        g = delta * cnt[t] / Nn
        Mn = M + g
        btw = delta * delta * N * cnt[t] / Nn
        acc += q[t] + btw
        if t < m - 1:
            c = 2.0 * Nn * (mc - Mn) * u * (abs(Mn) + 3.0 * abs(g))
            s2 += c * c + (u * acc) ** 2
        s2 += (6.0 * u * btw) ** 2
        N, M = Nn, Mn
    return s2


@jit(inline="always")
def _merges(cnt, mu, q, m, mc, u, tc, tm, tq):
    """The largest merge variance of the ``m`` states: left to right, right to left, pairwise (a tree of
    adjacent pairs, level by level: each internal node's mean rounding through ``2 N (mc - M)``, its between
    term's ``6 u`` and its M2's rounding ``u M2``; the root's mean moves nothing)."""
    best = _merge_scale(cnt, mu, q, m, mc, u)
    for t in range(m):
        tc[t], tm[t], tq[t] = cnt[m - 1 - t], mu[m - 1 - t], q[m - 1 - t]
    best = max(best, _merge_scale(tc, tm, tq, m, mc, u))
    for t in range(m):
        tc[t], tm[t], tq[t] = cnt[t], mu[t], q[t]
    k, s2 = m, 0.0
    while k > 1:
        h = 0
        for a in range(0, k, 2):
            if a + 1 < k:
                Nn = tc[a] + tc[a + 1]
                delta = tm[a + 1] - tm[a]
                g = delta * tc[a + 1] / Nn
                Mn = tm[a] + g
                btw = delta * delta * tc[a] * tc[a + 1] / Nn
                Q = tq[a] + tq[a + 1] + btw
                if k > 2:
                    c = 2.0 * Nn * (mc - Mn) * u * (abs(Mn) + 3.0 * abs(g))
                    s2 += c * c + (u * Q) ** 2
                s2 += (6.0 * u * btw) ** 2
                tc[h], tm[h], tq[h] = Nn, Mn, Q
            else:
                tc[h], tm[h], tq[h] = tc[a], tm[a], tq[a]
            h += 1
        k = h
    return max(best, s2)


@jit(parallel=True, error_model="numpy")
def _member_m2(X, specs, u, m2c, sc2, mo, smo):
    """Per member ``j`` and row ``i`` of X (R, n) float32: ``m2c`` the member's M2 before the division
    (float64: the exact merge of its float32 chain states; a two-pass member's float32 sum of squares) and
    ``sc2`` its merges' variance (0 for one chain: nothing left unemulated); ``mo`` its mean (the float32 mean
    of one chain, a two-pass member and the float32-merged tiles; else the exact merge of the chains' means)
    and ``smo`` that mean's variance: 0 where it is a float32 value, else its ``h - 1`` merges' roundings, each
    of a mean within ``|mc| + 2 max_j |m_j - mc|`` (the running mean and ``g = delta k / N``, ``|delta| <= 2
    max_j |m_j - mc|``), reaching the result with a weight at most 1, and the mean's store to float32, ``(u
    |mc|)**2``."""
    R, n = X.shape
    K = specs.shape[0]
    for job in prange(K * R):
        j, i = job // R, job % R
        flag, T, L, back, omp, B = specs[j, 0], specs[j, 1], specs[j, 2], specs[j, 3], specs[j, 4], specs[j, 5]
        if flag == 1:  # two-pass, scalar chains
            s = np.float32(0.0)
            for k in range(n):
                s = np.float32(s + X[i, n - 1 - k if back else k])
            if L == 1:
                mh = np.float32(s / np.float32(n))
            else:
                mh = np.float32(s * np.float32(np.float32(1.0) / np.float32(n)))
            a = np.float32(0.0)
            for k in range(n):
                d = np.float32(X[i, n - 1 - k if omp else k] - mh)
                a = np.float32(a + np.float32(d * d))
            m2c[j, i], sc2[j, i], mo[j, i], smo[j, i] = np.float64(a), 0.0, np.float64(mh), 0.0
            continue
        if flag == 2:  # fixed blocks, merged left to right in float32 (Chan's formula), all emulated
            cm, cq, cn = np.float32(0.0), np.float32(0.0), np.float32(0.0)
            for t in range(T):
                mm, qq, k = np.float32(0.0), np.float32(0.0), 0
                for p in range(t * B, min(t * B + B, n)):
                    x = X[i, p]
                    k += 1
                    d = np.float32(x - mm)
                    mm = np.float32(mm + np.float32(d / np.float32(k)))
                    qq = np.float32(qq + np.float32(d * np.float32(x - mm)))
                kf = np.float32(k)
                if t == 0:
                    cm, cq, cn = mm, qq, kf
                    continue
                tot = np.float32(cn + kf)
                dl = np.float32(mm - cm)
                r = np.float32(kf / tot)
                if L == 1:  # torch's WelfordOps::combine
                    btw = np.float32(np.float32(np.float32(dl * dl) * cn) * r)
                else:
                    btw = np.float32(np.float32(dl * dl) * np.float32(np.float32(cn * kf) / tot))
                cm = np.float32(cm + np.float32(dl * r))
                cq = np.float32(np.float32(cq + qq) + btw)
                cn = tot
            m2c[j, i], sc2[j, i], mo[j, i], smo[j, i] = np.float64(cq), 0.0, np.float64(cm), 0.0
            continue
        m = T * L
        cnt = np.zeros(m)
        mu = np.zeros(m)
        q = np.zeros(m)
        for t in range(T):
            if B > 0:
                s0, e0 = min(t * B, n), min(t * B + B, n)
            else:
                s0, e0 = _chunk(n, T, omp, t)
            for lane in range(L):
                mm = np.float32(0.0)
                qq = np.float32(0.0)
                k = 0
                cnt_lane = (e0 - s0 - lane + L - 1) // L if e0 - s0 > lane else 0
                for r in range(cnt_lane):
                    p = s0 + lane + (cnt_lane - 1 - r) * L if back else s0 + lane + r * L
                    x = X[i, p]
                    k += 1
                    d = np.float32(x - mm)
                    mm = np.float32(mm + np.float32(d / np.float32(k)))
                    qq = np.float32(qq + np.float32(d * np.float32(x - mm)))
                cnt[t * L + lane], mu[t * L + lane], q[t * L + lane] = k, mm, qq
        # the chains that took a term, in order
        h = 0
        for a in range(m):
            if cnt[a] > 0:
                cnt[h], mu[h], q[h] = cnt[a], mu[a], q[a]
                h += 1
        tot, sm = 0.0, 0.0
        for a in range(h):
            tot += cnt[a]
            sm += cnt[a] * mu[a]
        mc = sm / tot
        M2 = 0.0
        for a in range(h):
            M2 += q[a] + cnt[a] * (mu[a] - mc) ** 2
        m2c[j, i] = M2
        sc2[j, i] = _merges(cnt, mu, q, h, mc, u, np.empty(h), np.empty(h), np.empty(h)) if h > 1 else 0.0
        mo[j, i] = mc
        if h > 1:
            dev = 0.0
            for a in range(h):
                dev = max(dev, abs(mu[a] - mc))
            smo[j, i] = (h - 1) * (u * (abs(mc) + 2.0 * dev)) ** 2 + (u * mc) ** 2
        else:
            smo[j, i] = 0.0


def members(X, D: float, std: bool, half: bool, lam: float, m2, s2_family, specs=None, lam_el=None):
    """The emulated members (``specs``, default all of :func:`member_specs`) of a float32 var (or ``std``)
    of each row of X (R, n), values exact in float32, divisor ``D``: ``(xh, err, pre)``, each (2k, R) (the
    division ``/ D`` and ``* fl(1 / D)``): the centre before the last rounding (module docstring; ``half``:
    the float32 result, whose store is the last), its float64 error and the scale before it.

    A member is a correct kernel only where it behaves as the model of rounding says: its M2 within ``lam``
    of the whole family's sigma (``s2_family``, per row: the worst order's scale, which every correct
    order meets, the two-pass mean's second order included) of the exact ``m2``; beyond it a chain has
    stagnated (a float32 running sum of 10**7 squares) and the member is refused (its centre NaN). Within
    it a stagnating member is kept: measured at 10**7 offset values (mean 300), 4 Welford chains of 2.5e6
    whose running M2 loses its small increments came out 0.51% low, inside the family's 0.75%, and a bug of
    that size (the one-pass variance stored in float16) passed as that member (as it passed the family's
    scale before). Refusing on each member's own first-order scale would end that, and would refuse the
    float32-merged tiles of 64 there too (2119 ulps: their frozen running mean adds ``n E**2``, the two-pass
    mechanism, beyond Welford's first order). ``lam`` is the caller's level for refusing a
    correct member by chance (:func:`~refkern.analysis.stats.level` over the members and rows); ``lam_el``
    the element test's, at which a merged member's interval is taken through std's square root (as
    :func:`~refkern.analysis.noise_moments._var_rows` does; default ``lam``)."""
    R, n = X.shape
    specs = member_specs(n) if specs is None else specs
    lam_s = lam if lam_el is None else lam_el
    u = FLOAT32.u
    _, m2c, sc2, _ = member_moments(X, specs, lam, m2, s2_family)
    with np.errstate(all="ignore"):
        one = sc2 == 0.0  # one chain: M2 is a float32 number, its division known exactly
        # a merge in float64 of T L states (positive terms: 2 T L + 10 roundings at most); a float32 M2: exact
        merged = (specs[:, 0:1] == WELFORD) & (sc2 > 0.0)
        err_m2 = np.where(merged, 2.0 * specs[:, 1:2] * specs[:, 2:3] + 10.0, 0.0) * FLOAT64.u * np.abs(m2c)
        xs, es, ps = [], [], []
        for r in (None, float(np.float32(1.0) / np.float32(D))):
            v = m2c / D if r is None else m2c * r
            ev = err_m2 / D if r is None else err_m2 * r
            v32 = (np.float32(m2c) / np.float32(D) if r is None else np.float32(m2c) * np.float32(r)).astype(np.float64)
            pv = sc2 / D**2 if r is None else sc2 * r * r
            if not std:
                if half:  # the float32 division, then the store: exact with one chain
                    xh = np.where(one, v32, v)
                    pre = np.where(one, 0.0, pv + (u * v) ** 2)
                    err = np.where(one, 0.0, ev)
                else:
                    xh, pre, err = v, pv, ev
            else:
                # sqrt of the float32 variance (one chain: exact), else [v - lam sv, v + lam sv] through it
                sv = np.sqrt(pv + (u * v) ** 2)
                s = np.sqrt(v)
                step = np.maximum(s - np.sqrt(np.maximum(v - lam_s * sv, 0.0)), np.sqrt(v + lam_s * sv) - s) / lam_s
                s_one = np.sqrt(v32)
                if half:
                    xh = np.where(one, np.sqrt(v32.astype(np.float32)).astype(np.float64), s)
                    pre = np.where(one, 0.0, step**2 + (u * s) ** 2)
                    err = np.where(one, 0.0, ev / (2.0 * s) + FLOAT64.u * s)
                else:
                    xh = np.where(one, s_one, s)
                    pre = np.where(one, 0.0, step**2)
                    err = np.where(one, FLOAT64.u * s_one, ev / (2.0 * s) + FLOAT64.u * s)
            xs.append(xh)
            es.append(err)
            ps.append(pre)
    return np.concatenate(xs), np.concatenate(es), np.concatenate(ps)


def member_moments(X, specs, lam, m2, s2_family):
    """The emulated members ``specs`` (:func:`member_specs`) of each row of X (R, n), values exact in float32:
    ``(mean, M2, sM2, smean2)``, each (k, R): the member's mean and M2 before the division (float64, exact
    where its chain is one: :func:`_member_m2`), M2's variance and the mean's (its merges'). A member whose M2 is beyond
    ``lam`` sigmas of the whole family's (``s2_family``, per row) of the exact ``m2`` is refused (NaN): its
    chain has stagnated (:func:`members`)."""
    R = X.shape[0]
    m2c, sc2, mo, smo = (np.empty((len(specs), R)) for _ in range(4))
    _member_m2(_ro(X, np.float32), _ro(specs, np.int64), FLOAT32.u, m2c, sc2, mo, smo)
    with np.errstate(all="ignore"):
        m2c = np.where(np.abs(m2c - m2) <= lam * np.sqrt(s2_family), m2c, np.nan)
    return mo, m2c, sc2, smo


def batches(X, D, std, half, lam, m2, s2_family, lam_el=None):
    """The members of :func:`members` in batches, longest chains first (the scalar loops', then by ``T L``):
    a caller that has explained every element stops early; a bug runs them all."""
    specs = member_specs(X.shape[1])
    tl = np.where(specs[:, 5] > 0, C_MAX, specs[:, 1] * np.where(specs[:, 0] == WELFORD, specs[:, 2], 1))
    for lo, hi in ((1, 2), (2, 8), (8, C_MAX + 1)):
        sel = specs[(tl >= lo) & (tl < hi)]
        if len(sel):
            yield members(X, D, std, half, lam, m2, s2_family, sel, lam_el)


@jit(inline="always")
def _chain_drift(X, i, s, e, step, back, u, mean_out):
    """Welford's drift of one chain (elements s, s + step, ... < e, read either way), exact running means
    in float64: ``sum_k (2 k (mu - m_k) u (|m_k| + 2 |g_k|))**2`` with ``mu`` the chain's mean; its mean in
    ``mean_out[0]``, its count returned."""
    cnt = (e - s + step - 1) // step if e > s else 0
    tot = 0.0
    for r in range(cnt):
        tot += np.float64(X[i, s + r * step])
    if cnt == 0:
        mean_out[0] = 0.0
        return 0, 0.0
    mu = tot / cnt
    P, g, w = 0.0, 0.0, 0.0
    for r in range(cnt):
        p = s + (cnt - 1 - r) * step if back else s + r * step
        x = np.float64(X[i, p])
        if r >= 1:
            mk = P / r
            c = 2.0 * r * (mu - mk) * u * (abs(mk) + 2.0 * abs(g))
            w += c * c
            g = (x - mk) / (r + 1)
        P += x
    mean_out[0] = mu
    return cnt, w


@jit(parallel=True, error_model="numpy")
def _rest_rows(X, C, u, out_m2, out_mean, out_s2):
    """Per row of X (R, n) float32: M2, the mean and the rest's variance of M2 (module docstring)."""
    R, n = X.shape
    for i in prange(R):
        t = 0.0
        for j in range(n):
            t += np.float64(X[i, j])
        mean = t / n
        m2, d4 = 0.0, 0.0
        for j in range(n):
            d = np.float64(X[i, j]) - mean
            m2 += d * d
            d4 += d**4
        cnt = np.zeros(C)
        mu = np.zeros(C)
        qs = np.zeros(C)
        tc, tm, tq = np.empty(C), np.empty(C), np.empty(C)
        mo = np.zeros(1)
        best_w, best_sq, best_x = 0.0, 0.0, 0.0
        for lanes in range(2):
            for back in range(2):
                w, sq, sx = 0.0, 0.0, 0.0
                for c in range(C):
                    if lanes:
                        s, e, step = c, n, C
                    else:
                        s, e = _chunk(n, C, 0, c)
                        step = 1
                    k, wc = _chain_drift(X, i, s, e, step, back, u, mo)
                    w += wc
                    cnt[c], mu[c] = k, mo[0]
                    # the chain's M2 and the partial sums of its squares and of its values (either way)
                    qq, p, px = 0.0, 0.0, 0.0
                    for r in range(k):
                        pp = s + (k - 1 - r) * step if back else s + r * step
                        x = np.float64(X[i, pp])
                        dd = x - mean
                        p += dd * dd
                        px += x
                        qq += (x - mo[0]) ** 2
                        if r:
                            sq += p * p
                            sx += px * px
                    qs[c] = qq
                # the chains' merges, the squares' and the values' combines (partial sums, both ways)
                h = 0
                for c in range(C):
                    if cnt[c] > 0:
                        cnt[h], mu[h], qs[h] = cnt[c], mu[c], qs[c]
                        h += 1
                if h > 1:
                    w += _merges(cnt, mu, qs, h, mean, u, tc, tm, tq)
                pl, ql, px, qx, a, b, ax, bx = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                for c in range(h):
                    a += qs[c] + cnt[c] * (mu[c] - mean) ** 2
                    ax += cnt[c] * mu[c]
                    if c:
                        pl += a * a
                        px += ax * ax
                for c in range(h - 1, -1, -1):
                    b += qs[c] + cnt[c] * (mu[c] - mean) ** 2
                    bx += cnt[c] * mu[c]
                    if c < h - 1:
                        ql += b * b
                        qx += bx * bx
                best_w = max(best_w, w + u * u * sq)  # Welford: its chains' M2 partial sums, drifts, merges
                best_sq = max(best_sq, sq + max(pl, ql))  # two-pass: the squares' chains and their combine
                best_x = max(best_x, sx + max(px, qx))
        two = u * u * best_sq
        if n > 1:
            emu = u * (math.sqrt(best_x) / n + abs(mean))
            two += (n * emu * emu) ** 2  # a two-pass mean summed in these chains, at second order
        out_m2[i], out_mean[i], out_s2[i] = m2, mean, u * u * 5.0 * d4 + max(two, best_w)


def rest_s2(X):
    """Per row of X (R, n), values exact in float32: ``(M2, mean, sigma**2 of M2)`` of the orders left after
    the members (:func:`_rest_rows`)."""
    X32 = _ro(X, np.float32)
    R = X32.shape[0]
    m2, mean, s2 = (np.empty(R) for _ in range(3))
    _rest_rows(X32, max(chains_of(X32.shape[1]), 1), FLOAT32.u, m2, mean, s2)
    return m2, mean, s2
