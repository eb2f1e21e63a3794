"""A float32 sum's long chains, emulated on the very inputs: the members of its rounding family that
no scale can hold tightly, taken out of the scale and tested one by one.

A sum's error is the rounding of its partial sums (:mod:`refkern.analysis.noise`), so its scale is set
by the order with the largest partial sums: a CPU scalar loop, one chain of ``n`` additions whose
partial sums wander like ``sqrt(k)`` (randn data): ``S**2 ~ n**2 / 2``. Every kernel that splits the row
into chains of at most ``n / C`` terms (threads, SIMD lanes, blocks, trees) has ``S**2 ~ n**2 / (2 C) +
n C / 2`` (the chains' own partial sums, and the combining of their ``C`` results). With one output there
is one draw: the test's threshold is ``lam`` times the largest member's scale, while the spread of the
kernels people run is one draw of it, often far under: a float32 sum of 1000 randn values let a result
off by 33 times the spread of correct kernels pass (bench_verdict).

A chain is deterministic: the same inputs in the same order give the same float32 value. So the
members whose chains are long are emulated exactly, and the scale keeps only the others:

* **members** (:func:`member_specs`): ``T`` contiguous chunks (threads: torch's ``ceil(n / T)`` and
  OpenMP's static ``n // T`` with the remainder on the first threads), each summed by ``L`` strided
  lanes (:data:`LANES`: a scalar loop and SIMD widths of 4, 8, 16 floats, 32 for two accumulators of
  16), left to right (and, for the one scalar chain, also right to left), for every ``T L < C``. Their
  chain values ``c_j`` are exact float32 numbers; how they are combined is free, so each member is a
  centre ``sum c_j`` with a scale of its own: the combine's partial sums (``max(sum P_k**2, sum Q_k**2)``
  over the chain values, as for a sum) and, for SIMD lanes (``L > 1``), each chain's last addition ``c_j``
  (a SIMD loop's tail joins in the combine instead of its lane: that moves a chain value by one
  rounding). The last addition (or a mean's division) is one rounding to nearest of a value within that
  scale of the centre: the element test of a stored result (``inside._straddle``), so a single chain
  must be matched exactly. Where the terms themselves are known only within a slack (a softmax's exps,
  :mod:`refkern.analysis.noise_softmax_chains`), :func:`sums` also gives the variance of the additions a kernel
  may round otherwise (:func:`_flip_sq`).
* **the rest** (:func:`rest_sq`): every order whose chains hold at most ``ceil(n / C)`` terms, on the
  sum convention of :mod:`refkern.analysis.noise` (on data without structure other splits have smaller
  partial sums): the larger of ``C`` contiguous chunks and ``C`` strided lanes, each read either way,
  their chains' partial sums plus the combine's.

``C = min(isqrt(n), C_MAX)`` balances the two terms of the rest's scale (``n**2 / (2 C) = n C / 2`` at
``C = sqrt(n)``); :data:`C_MAX` caps the members' cost (about ``C log C`` passes over the row, only when an
element fails the rest's test). A kernel with a long chain that is none of the members (a dynamic
schedule, a hybrid of threads and lanes with ``T L < C`` not listed) is outside the family and may be
called a mismatch.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, FLOAT64

__all__ = ["C_MAX", "LANES", "chains_of", "member_specs", "members", "sums", "batches", "rest_sq"]

C_MAX = 64  #: at most this many chains in the rest (the members' cost: every T L < C emulated)
LANES = (1, 4, 8, 16, 32)  #: a scalar loop, SIMD widths of 4, 8 and 16 floats, two accumulators of 16


def chains_of(n: int) -> int:
    """``C``: the rest's chains, ``min(isqrt(n), C_MAX)`` (module docstring); below 2, nothing is emulated."""
    return min(math.isqrt(max(int(n), 0)), C_MAX)


def member_specs(n: int) -> np.ndarray:
    """(k, 4) int64 rows ``(T, L, back, omp)`` of the emulated members for rows of ``n`` terms: ``T``
    chunks of ``L`` lanes with ``T L < C``, ``back`` right to left (the single scalar chain only), ``omp``
    OpenMP's static split (only where it differs from torch's ``ceil(n / T)``)."""
    C = chains_of(n)
    out = []
    for L in LANES:
        for T in range(1, C):
            if T * L >= C:
                break
            out.append((T, L, 0, 0))
            if T * L == 1:
                out.append((1, 1, 1, 0))
            if n % T and _bounds(n, T, 0) != _bounds(n, T, 1):
                out.append((T, L, 0, 1))
    return np.array(out, np.int64).reshape(-1, 4)


def _bounds(n, T, omp):
    return [(_chunk(n, T, omp, t)) for t in range(T)]


@jit(inline="always")
def _chunk(n, T, omp, t):
    """Start and end of chunk ``t`` of ``T``: torch's ``ceil(n / T)`` chunks, or OpenMP's static split."""
    if omp:
        q, r = n // T, n % T
        s = t * q + min(t, r)
        return s, s + q + (1 if t < r else 0)
    c = -(-n // T)
    return min(t * c, n), min(t * c + c, n)


@jit(inline="always")
def _flip_sq(old, new, d):
    """The variance of what a kernel's chain step may round differently from the emulated one ``new = fl(old +
    v)`` where its term differs from ``v`` by at most ``d`` (:func:`sums`' ``slack``): 0 without slack; where
    the binade grows (``|new| >= 2 |old|`` in exponent) a full rounding of each side, ``h(new)**2 + h(old)**2``;
    else the flip's Kearns-Saul proxy ``ulp**2 (1 - 2 p) / (2 ln((1 - p) / p))`` with ``p = min(d / ulp, 1/2)``
    (``ulp = ulp(new)``; the limit ``ulp**2 / 4`` at ``p = 1/2``)."""
    if d <= 0.0 or new == 0.0:
        return 0.0
    en = math.frexp(abs(np.float64(new)))[1]
    ulp = math.ldexp(1.0, en - 24)
    if old != 0.0 and math.frexp(abs(np.float64(old)))[1] < en:
        return 0.25 * ulp * ulp + 0.0625 * ulp * ulp  # h(new) = ulp / 2; h(old) <= ulp / 4
    p = d / ulp
    if p >= 0.5:
        return 0.25 * ulp * ulp
    return ulp * ulp * (1.0 - 2.0 * p) / (2.0 * math.log((1.0 - p) / p))


@jit(parallel=True, error_model="numpy")
def _member_sums(X, specs, cs, comb, sq, last, own, slack, flip):
    """Per member ``j`` and row ``i`` of X (R, n) float32: the float32 chain values of the member, and
    (float64) their sum ``cs``, the combine's partial sums ``comb`` (``max(sum P_k**2, sum Q_k**2)`` over
    the additions before the last), ``sq = sum c**2`` where a lane's last term may join the combine
    (``L > 1``, else 0), the total's square ``last``, and ``own``: the member's error ``sum c - sum x``
    over its own scale ``sqrt(sum_chains sum_k P_k**2 + comb)`` in units of u (0 where that scale is 0). The
    member's chains advance together, one term each per step (independent float32 additions, in their order
    within each chain), each with its exact running sum beside it. Where ``slack`` (R, n) is not empty,
    ``flip`` (k, R) sums :func:`_flip_sq` over the member's additions (term ``X[i, k]`` known to ``slack[i,
    k]``), else it is 0."""
    R, n = X.shape
    K = specs.shape[0]
    for job in prange(K * R):
        j, i = job // R, job % R
        T, L, back, omp = specs[j, 0], specs[j, 1], specs[j, 2], specs[j, 3]
        acc = np.zeros(T * L, np.float32)
        ex = np.zeros(T * L)  # the chains' exact running sums
        sp = 0.0  # their squares, summed
        st = np.empty(T, np.int64)
        ln = np.empty(T, np.int64)
        longest = 0
        fl = 0.0
        has = slack.shape[0] > 0
        for t in range(T):
            s, e = _chunk(n, T, omp, t)
            st[t], ln[t] = s, e - s
            longest = max(longest, e - s)
        for q0 in range(0, longest, L):
            for t in range(T):
                s, e, base = st[t], st[t] + ln[t], t * L
                if back:  # the single scalar chain (L = 1), right to left
                    if q0 < ln[t]:
                        v = X[i, e - 1 - q0]
                        nv = np.float32(acc[base] + v)
                        if has:
                            fl += _flip_sq(acc[base], nv, slack[i, e - 1 - q0])
                        acc[base] = nv
                        ex[base] += v
                        sp += ex[base] * ex[base]
                else:
                    for lane in range(L):
                        if s + q0 + lane < e:
                            v = X[i, s + q0 + lane]
                            nv = np.float32(acc[base + lane] + v)
                            if has:
                                fl += _flip_sq(acc[base + lane], nv, slack[i, s + q0 + lane])
                            acc[base + lane] = nv
                            ex[base + lane] += v
                            sp += ex[base + lane] * ex[base + lane]
        tot, p2, q2, s2, xs = 0.0, 0.0, 0.0, 0.0, 0.0
        m = 0
        for a in range(T * L):
            xs += ex[a]
            if ln[a // L] > a % L:  # a chain that took a term (empty lanes and chunks hold no value)
                acc[m] = acc[a]
                m += 1
        for k in range(m):
            c = np.float64(acc[k])
            tot += c
            s2 += c * c
            if 0 < k < m - 1:
                p2 += tot * tot
        tail = 0.0
        for k in range(m - 1, 0, -1):
            tail += np.float64(acc[k])
            if k > 1:
                q2 += tail * tail
        cs[j, i], comb[j, i], sq[j, i], last[j, i] = tot, max(p2, q2), s2 if L > 1 else 0.0, tot * tot
        scale = math.sqrt(sp + max(p2, q2) + tot * tot)
        own[j, i] = abs(tot - xs) / scale if scale > 0 else 0.0
        flip[j, i] = fl


def members(X, kind: str, lam: float, specs=None, out_u: float = FLOAT32.u):
    """The emulated members (``specs``, default all of :func:`member_specs`) of a float32 sum or mean of
    each row of X (R, n), values exact in float32: ``(xh, err, pre)``, each (k, R): the centre (``sum
    c_j``, over ``n`` for a mean; a mean's second variant multiplies by ``fl(1/n)``), its float64 error, and
    the scale before the last rounding (module docstring), for the stored-result element test.

    A member is a correct kernel only where it behaves as the model of rounding says: its own error within
    ``lam`` of its own scale (the sub-Gaussian bound every correct order meets). A chain that stagnates
    (pytorch#38716: a float32 running sum of 4e7 values in [0, 1) stops at 2**24, each later term below
    half its ulp) loses every term the same way, far beyond it: such a member is refused (its centre NaN),
    and a result equal to it is the bug it is. ``lam`` is the caller's level for refusing a correct
    member by chance (:func:`~refkern.analysis.stats.level` over the members and rows)."""
    n = X.shape[1]
    specs = member_specs(n) if specs is None else specs
    cs, err, comb, sq, last, _ = sums(X, lam, specs, out_u=out_u)
    u2 = out_u * out_u
    if kind == "sum":
        return cs, err, u2 * (comb + sq)
    pre = u2 * (comb + sq + last)  # the combine's last addition rounds too; the division is the last rounding
    r = float(np.float32(1.0) / np.float32(n))
    xh = np.concatenate([cs / n, cs * r])
    return xh, np.concatenate([err / n, err * r]) + FLOAT64.u * np.abs(xh), np.concatenate([pre / n**2, pre * r * r])


def sums(X, lam: float, specs, slack=None, out_u: float = FLOAT32.u):
    """The chain sums of :func:`members` (float32 values X (R, n), the member ``specs``): ``(cs, err, comb, sq,
    last, flip)``, each (k, R): the centre ``sum c_j`` (NaN where the member is refused, :func:`members`), its
    float64 error, the combine's partial sums, ``sum c**2`` of SIMD lanes, the total's square and, with
    ``slack`` (R, n), the variance a kernel whose terms differ from X by at most it may add by rounding its
    additions otherwise (:func:`_flip_sq`; 0 without)."""
    R, n = X.shape
    X32 = np.ascontiguousarray(X, np.float32)
    sl = np.zeros((0, 0)) if slack is None else np.ascontiguousarray(slack, np.float64)
    cs, comb, sq, last, own, flip = (np.empty((len(specs), R)) for _ in range(6))
    _member_sums(X32, specs, cs, comb, sq, last, own, sl, flip)
    cs = np.where(own <= lam * out_u, cs, np.nan)
    m = (specs[:, 0] * specs[:, 1]).astype(np.float64)[:, None]
    err = (m + 1) * FLOAT64.u * np.abs(cs)  # a float64 sum of at most C values, exact to m u64 of their sum
    return cs, err, comb, sq, last, flip


@jit(parallel=True, error_model="numpy")
def _rest_rows(X, C, out):
    """Per row of X (R, n): the larger, over ``C`` contiguous chunks and ``C`` strided lanes each read
    either way, of the chains' partial sums squared plus their combine's (sum convention, both ways)."""
    R, n = X.shape
    for i in prange(R):
        best = 0.0
        for lanes in range(2):
            for back in range(2):
                s2 = 0.0
                ch = np.zeros(C)
                for t in range(C):
                    if lanes:
                        s, e, step = t, n, C
                    else:
                        s, e = _chunk(n, C, 0, t)
                        step = 1
                    cnt = (e - s + step - 1) // step if e > s else 0
                    p = 0.0
                    for q in range(cnt):
                        k = s + (cnt - 1 - q) * step if back else s + q * step
                        p += X[i, k]
                        if q:
                            s2 += p * p
                    ch[t] = p
                tot, tail, p2, q2 = 0.0, 0.0, 0.0, 0.0
                for t in range(C):
                    tot += ch[t]
                    if t:
                        p2 += tot * tot
                for t in range(C - 1, -1, -1):
                    tail += ch[t]
                    if t < C - 1:
                        q2 += tail * tail
                best = max(best, s2 + max(p2, q2))
        out[i] = best


def rest_sq(X) -> np.ndarray:
    """Per row of X (R, n): ``S**2`` of the orders left after the members (:func:`_rest_rows`)."""
    X = np.ascontiguousarray(X, np.float64)
    out = np.empty(X.shape[0])
    _rest_rows(X, chains_of(X.shape[1]), out)
    return out


def batches(X, kind: str, lam: float):
    """The members of :func:`members` in batches, longest chains first (the scalar loop's two, then by
    ``T L``): a caller that has explained every element stops early (a correct kernel is usually one of
    the first); a bug runs them all."""
    specs = member_specs(X.shape[1])
    tl = specs[:, 0] * specs[:, 1]
    for lo, hi in ((1, 2), (2, 8), (8, C_MAX)):
        sel = specs[(tl >= lo) & (tl < hi)]
        if len(sel):
            yield members(X, kind, lam, sel)
