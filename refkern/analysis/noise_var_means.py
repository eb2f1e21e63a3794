"""The mean a float32 var (std) gradient subtracts, as members of its rounding family: the long chains of a
float32 mean emulated on the very rows, the rest charged (as :mod:`refkern.analysis.noise_chains` does for a
sum and :mod:`refkern.analysis.noise_var_chains` for var), and each element's best member found in one jitted
pass (:func:`best_members`) for the element test of :func:`~refkern.analysis.noise_backward_reductions.
var_members`."""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32
from refkern.analysis.noise_moments import _moments
from refkern.analysis.noise_store import straddle_one

__all__ = ["MEMBER_ERR", "var_mean_chains", "std_intervals", "project", "nearest", "best_members", "FIT_SAMPLE"]


#: var_members' centres' relative error in float64: at most 8 roundings of 2**-53 (K = 2 / dof, std's division
#: by dof, its square root, 2 s and g / (2 s), the products K q and K q d; x - m_h of two half values is exact)
MEMBER_ERR = 8.0 * 2.0**-53


def var_mean_chains(X):
    """The float32 mean a var (std) gradient subtracts, as the long chains of its family (rows of float32
    numbers, at least two chains: else None): ``(smu2_rest, members)``, the rest's variance of the mean per row
    (R,) and a thunk yielding the members' means and their variances, (k, R) each, in two stages: the sum's
    members (the mean torch's gradient subtracts), then the var family's.

    torch's gradient is ``(2 / dof) g (x - x.mean())`` (and std's ``g / (2 s^)`` times it): the mean is a float32
    sum of the row divided by n, or a fused kernel's Welford mean. Its error moves every element of the row by
    ``-K q dmu``. Charged as one draw of the scalar loop's (``u**2 (sum P_k**2 / n**2 + mean**2)``), that is
    ``u |mean| sqrt(n / 3)`` on a row of mean ``mu``: a float32 var gradient over 10**6 values of mean 300
    scaled by 64x the spread of correct kernels passed (bench_verdict's power-backward). As for the forward
    sum and var, the orders whose chains hold at most ``ceil(n / C)`` terms stay charged (``u**2 (rest_sq /
    n**2 + mean**2)``, :func:`~refkern.analysis.noise_chains.rest_sq`), and the long chains are members: the
    sum's (``T`` chunks of ``L`` lanes, ``/ n`` or ``* fl(1 / n)``: the centre and variance before the
    division's rounding, which is charged, ``(u m)**2``) and the var family's means (Welford chains, tiles
    merged in float32, the two-pass scalar loops, with their merges' variance:
    :func:`~refkern.analysis.noise_var_chains.member_moments`), each refused where it has stagnated."""
    from refkern.analysis.noise_chains import chains_of, rest_sq
    from refkern.analysis.noise_chains import member_specs as sum_specs
    from refkern.analysis.noise_chains import members as sum_members
    from refkern.analysis.noise_var_chains import member_moments
    from refkern.analysis.noise_var_chains import member_specs as var_specs
    from refkern.analysis.stats import level

    R, n = X.shape
    if chains_of(n) < 2 or not np.array_equal(X, X.astype(np.float32)):
        return None
    u = FLOAT32.u
    mean = X.sum(axis=1) / n
    with np.errstate(all="ignore"):
        smu2_rest = u * u * (rest_sq(X) / n**2 + mean * mean)

    def members():  # only where an element fails the rest's scale: the sums' first (torch's x.mean()), then var's
        with np.errstate(all="ignore"):
            xh, _, pre = sum_members(X, "mean", level(len(sum_specs(n)) * R))
            yield xh, pre + (u * xh) ** 2
            m2, _, s2f, _ = _moments(X, True, u)
            specs = var_specs(n)
            mo, m2c, _, smo = member_moments(X, specs, level(len(specs) * R), m2, s2f)
            yield np.where(np.isnan(m2c), np.nan, mo), smo  # a stagnated member: refused

    return smu2_rest, members


def std_intervals(X, D: float, hard, lam: float):
    """The intervals ``(lo, hi)``, (m, R) each, of std's shared relative error ``e`` (:func:`~refkern.analysis.
    noise_backward_reductions.var_members`: the gradient's ``q = g / (2 s^)`` carries ``s / s^``) where the
    forward's ``s^`` is one of its family's members, rows of float32 numbers, divisor ``D > 0``, at least two
    chains (else None): the rest's ``-+(hard + lam sub)`` (``sub`` the forward's relative sigma over the orders of
    short chains, :func:`~refkern.analysis.noise_var_chains.rest_s2`) and, per long-chain member ``k``
    (:func:`~refkern.analysis.noise_var_chains.members`: Welford, float32-merged tiles, two-pass; ``/ D`` and ``*
    fl(1 / D)``), ``s / s^ - 1 -+ hard`` over ``s^`` in ``[xh_k (1 - u) - w, xh_k (1 + u) + w]``, ``w = lam
    sqrt(pre_k) + err_k`` (the centre before its float32 store, the store's rounding, its scale). Charged as one
    draw of the scalar loop's sum of squares (``u sqrt(n / 3)`` relative at 10**4 randn terms: 29 u, times
    ``lam``), a float32 std gradient scaled by 64x the spread of correct kernels passed."""
    from refkern.analysis.noise_chains import chains_of
    from refkern.analysis.noise_var_chains import member_specs, members, rest_s2
    from refkern.analysis.stats import level

    R, n = X.shape
    if D <= 0 or chains_of(n) < 2 or not np.array_equal(X, X.astype(np.float32)):
        return None
    u = FLOAT32.u
    with np.errstate(all="ignore"):
        m2, _, s2f, _ = _moments(X, True, u)
        var = m2 / D
        s = np.sqrt(var)
        _, _, rs2 = rest_s2(X)
        sub = np.sqrt(rs2 / D**2 + (u * var) ** 2) / (2.0 * var)
        xh, err, pre = members(X, D, True, False, level(2 * len(member_specs(n)) * R), m2, s2f, lam_el=lam)
        w = lam * np.sqrt(pre) + err
        lo_s, hi_s = xh * (1.0 - u) - w, xh * (1.0 + u) + w
        up = np.where(lo_s > 0, s / lo_s - 1.0 + hard, np.inf)  # s^ may be near 0: no upper end
        lo = np.concatenate([-(hard + lam * sub)[None], s / hi_s - 1.0 - hard])
        hi = np.concatenate([(hard + lam * sub)[None], up])
    bad = np.isnan(lo) | np.isnan(hi) | (lo > hi)  # a refused member (NaN centre): no interval
    return np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)


def project(s, lo, hi):
    """``s`` (R,) projected onto the union of the intervals ``[lo, hi]`` (m, R) of each row (NaN: none): the
    nearest point, and the factor its error may have grown by. With the true ``e`` in the union, ``|P - e| <=
    |P - s| + |s - e| <= 2 |s - e|`` (``|P - s| <= |e - s|``): 2 for a union of more than one interval, 1 for one
    (a convex set: the projection only brings ``s`` nearer). No interval on a row: ``s`` itself (factor 1)."""
    P = np.clip(s[None, :], lo, hi)
    gap = np.where(np.isnan(P), np.inf, np.abs(P - s[None, :]))
    k = np.argmin(gap, axis=0)
    p = P[k, np.arange(s.size)]
    p = np.where(np.isfinite(gap.min(axis=0)), p, s)
    return p, (2.0 if lo.shape[0] > 1 else 1.0)


def nearest(Xf, mean, kq, A, pre, means, smeans, lam):
    """The members (indices into ``means`` (k, R)) worth trying on the actual rows ``A``, nearest first: those
    whose mean is, on some row, within ``lam sqrt(sd**2 + smeans)`` of the row's least-squares estimate ``mean +
    d^`` of the mean the kernel subtracted (``a - c = -K q d + c e + n``: the offset ``d`` and the shared
    relative error ``e`` fitted together, weights ``1 / pre``; ``sd**2`` the estimate's variance, ``(M**-1)_00``
    of the normal equations). A correct member's mean lies outside with probability at most ``2 exp(-lam**2 /
    2)`` per row: ``lam = level(R)`` spends one more share ``ALPHA / PARTS`` of the false-alarm budget (the
    members left out would fail the element test anyway but for that chance: leaving them out is time, not
    power)."""
    c = kq * (Xf - mean[:, None])
    ok = np.isfinite(A) & (pre > 0)
    w = np.where(ok, 1.0 / pre, 0.0)
    r = np.where(ok, A - c, 0.0)
    z1 = -np.broadcast_to(kq, c.shape)
    m11, m12, m22 = (w * z1 * z1).sum(1), (w * z1 * c).sum(1), (w * c * c).sum(1)
    b1, b2 = (w * z1 * r).sum(1), (w * c * r).sum(1)
    with np.errstate(all="ignore"):
        det = m11 * m22 - m12 * m12
        d_hat = (m22 * b1 - m12 * b2) / det
        sd2 = m22 / det
        dist = np.abs(means - mean[None, :] - d_hat[None, :]) / np.sqrt(sd2[None, :] + smeans)
    near = dist <= lam
    near |= ~np.isfinite(d_hat) | ~np.isfinite(sd2)  # no estimate on a row: every member is tried
    near &= np.isfinite(means)
    idx = np.flatnonzero(near.any(axis=1))
    dist = np.where(near & np.isfinite(dist), dist, np.inf)[idx].min(axis=1)
    return idx[np.argsort(dist, kind="stable")]


def best_members(members, Xf, mean, kq, A, ok, bound, units, want_std, out, lam):
    """One batch ``(xh, err, pre)``, (1, R, n) each, for :func:`~refkern.analysis.inside._members`: each
    element's best member (the smallest z of the stored-result test, or the first within ``lam`` sigma: ``lam =
    level(R)`` is under the element test's level) among the members ``members()`` that
    :func:`nearest` keeps, each fitted to its row as :func:`~refkern.analysis.noise_backward_reductions.
    var_members` fits the exact mean (the shared relative error ``s`` projected onto ``bound``'s intervals, (lo,
    hi) of (m, R) each, :func:`project`, its sd added to each element's sigma). An element passes the batch if
    and only if it passes one of those members' tests, so the batch is the members' test, without a (R, n)
    array per member (400 members at 10**6 terms)."""
    uc, u, u_o, eta_o, eta_w, K = units
    R, n = Xf.shape
    kq1 = np.ascontiguousarray(np.asarray(kq, np.float64).reshape(R))
    with np.errstate(all="ignore"):
        d0 = Xf - mean[:, None]
        pre0 = kq1[:, None] ** 2 * (uc * uc * d0 * d0) + (kq1[:, None] * d0) ** 2 * (uc * uc + u * u)
        pre0 = pre0 + (u_o * kq1[:, None] * d0) ** 2  # the store too: the estimate's sd is not understated
    err_rel = MEMBER_ERR + (2.0 * n * 2.0**-53 if want_std else 0.0)
    consts = np.array([uc, u, u_o, eta_o, eta_w, K * K if want_std else 0.0, err_rel])
    Ac = np.ascontiguousarray(np.where(ok, A, np.nan))
    xh = np.where(np.isnan(Ac), 0.0, np.nan)  # a centre that fails until a member is found (0 against NaN)
    err, pre, z = np.zeros((R, n)), np.full((R, n), np.inf), np.full((R, n), np.inf)
    X64 = np.ascontiguousarray(Xf, np.float64)
    lo, hi = (np.ascontiguousarray(b, np.float64) for b in bound)
    for means, smeans in members():  # stages: stop once every element is within lam
        with np.errstate(all="ignore"):
            order = nearest(Xf, mean, kq1[:, None], A, pre0 + 2.0 * eta_o**2, means, smeans, lam)
        _best(X64, Ac, kq1, np.ascontiguousarray(means[order]), np.ascontiguousarray(smeans[order]), lo, hi, consts,
              out.prec, out.emin, float(lam), z, xh, err, pre)  # fmt: skip
        if not (z > lam).any():
            break
    return xh[None], err[None], pre[None]


#: elements of a row the fit of each member's shared relative error reads (evenly strided): the fit's sd grows
#: by sqrt(n / FIT_SAMPLE) and is charged (a fixed choice of elements keeps s - e sub-Gaussian), at 10**6 terms
#: 8 times a relative 2**-24 / sqrt(10**6): far under one element's own rounding
FIT_SAMPLE = 16384


@jit(inline="always")
def _pre_one(q, d, sm, uc, u, eta_o, eta_w, kk):
    """One element's sigma**2 before its store for a member of mean variance ``sm`` (``d = x - m``, ``q = K q``):
    :func:`~refkern.analysis.noise_backward_reductions._var_pre` plus the batch's ``2 eta_o**2 + 3 eta_w**2``, as
    ``_var_batch`` charges it (``kk``: ``K**2`` for std, else 0), one element at a time."""
    pre = q * q * (sm + uc * uc * d * d) + (q * d) ** 2 * (uc * uc + u * u)
    return pre + ((eta_o * d) ** 2 * (kk + 1.0) + (eta_o * q) ** 2 + 2.0 * eta_o**2 + 3.0 * eta_w**2)  # as `+=` did


@jit(parallel=True, error_model="numpy")
def _best(X, A, kq, means, smeans, lo, hi, consts, prec, emin, done, bzz, bxh, berr, bpre):
    """:func:`best_members`' pass: per row, per member with a finite mean, the fit (sums over an evenly strided
    sample of :data:`FIT_SAMPLE` elements of the row), then the stored-result test
    (:func:`~refkern.analysis.noise_store.straddle_one`) of each element not yet within ``done`` sigma (such an
    element passes whichever member comes later: ``done`` is at most the element test's level); the member of
    the smallest z kept (``bzz``, ``bxh``, ``berr``, ``bpre``: carried from the stages before, updated in place)."""
    uc, u, u_o, eta_o, eta_w, kk, err_rel = consts[0], consts[1], consts[2], consts[3], consts[4], consts[5], consts[6]
    R, n = X.shape
    k = means.shape[0]
    step = max(1, n // FIT_SAMPLE)
    half, tiny = 2.0**-prec, 2.0 ** (emin - prec)
    for i in prange(R):
        q = kq[i]
        bz = bzz[i]
        open_ = np.empty(n, np.int64)
        n_open = 0
        for j in range(n):
            if bz[j] > done:
                open_[n_open] = j
                n_open += 1
        for m in range(k):
            if n_open == 0:
                break
            mu, sm = means[m, i], smeans[m, i]
            if not (mu - mu == 0.0) or not (sm - sm == 0.0):
                continue
            den, num, sdn = 0.0, 0.0, 0.0
            for j in range(0, n, step):
                d = X[i, j] - mu
                c = q * d
                pre = _pre_one(q, d, sm, uc, u, eta_o, eta_w, kk)
                a = A[i, j]
                if a == a and pre > 0.0:
                    w = c / pre
                    den += w * c
                    num += w * (a - c)
                    sdn += w * w * (pre + (u_o * c) ** 2)
            s = num / den if den > 0.0 else 0.0
            s = 0.0 if s != s else s
            best, gap = s, np.inf  # s projected onto the union of e's intervals (project(), its factor below)
            for t in range(lo.shape[0]):
                if lo[t, i] == lo[t, i] and hi[t, i] == hi[t, i]:
                    p = min(max(s, lo[t, i]), hi[t, i])
                    if abs(p - s) < gap:
                        best, gap = p, abs(p - s)
            s = best
            sd = np.sqrt(sdn) / den if den > 0.0 else 0.0
            sd = sd * 2.0 if lo.shape[0] > 1 else sd
            h = 0
            for t in range(n_open):
                j = open_[t]
                d = X[i, j] - mu
                c = q * d
                pre = _pre_one(q, d, sm, uc, u, eta_o, eta_w, kk)
                xh = c * (1.0 + s)
                pr = (np.sqrt(pre) + abs(c) * sd) ** 2
                pr = pr if pr - pr == 0.0 else np.inf
                er = err_rel * abs(xh)
                er = er if er - er == 0.0 else np.inf
                a = A[i, j]
                # z >= (|a - xh| - hs - er) / sqrt(pr), hs >= half a's spacing: where that is already at least the
                # element's best, this member cannot better it (the exact test is skipped, the result the same)
                if (abs(a - xh) - abs(a) * half - tiny - er) / np.sqrt(pr) < bz[j]:
                    z = straddle_one(a, xh, er, pr, prec, emin)
                    if z < bz[j]:
                        bz[j], bxh[i, j], berr[i, j], bpre[i, j] = z, xh, er, pr
                if bz[j] > done:
                    open_[h] = j
                    h += 1
            n_open = h
