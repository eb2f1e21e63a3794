"""The certain test within rows (:mod:`refkern.analysis.row_bound`) for the norms: two shared errors free.

A norm's row (layer_norm's last dims, rms_norm's, a group of group_norm, a channel of batch_norm) shares its
statistics: every correct kernel computes the mean ``m^ = m + dm`` and ``r^ = r (1 + dr)`` once per row (in
any order, Welford or two-pass, in float32 for half inputs, rsqrt within some ulps), then each element
through a few roundings of its own. The shared errors enter the output exactly linearly,

    b + w r (1 + dr) (x - m - dm) = y + dr t - (1 + dr) dm r w,    t = (x - m) r w,

so against the correctly rounded reference every correct result is

    a_j - ref_j = c1 l1_j + c2 l2_j + e_j,   l1_j = -r w_j,  l2_j = t_j,   |e_j| <= b_j,

with ``c1 = (1 + dr) dm`` and ``c2 = dr`` free (rms_norm and the given statistics of batch_norm's eval
mode: ``l1 = 0``) and ``b_j`` the element's own roundings. The test: ``T = min_(c1, c2) max_j |a_j -
ref_j - c1 l1_j - c2 l2_j| / b_j``; ``T > 1`` is a mismatch for sure (no level, no budget).

**The element bound**: each step rounded in the working format (``u``, charged ``u`` times a bound of its
magnitude, which holds for any rounding to nearest) and, as the family of :mod:`refkern.analysis.noise` has
it, the normalised row stored in the half result format (``u_m``) before the weight, on magnitudes widened
by the envelope's worst-case bounds on the statistics (``dmu`` on the mean, ``e_r`` on r: only to bound
magnitudes, the errors themselves are ``c1, c2``):

* standard form ``((x - m^) r^) w + b``: ``D = |x - m| + dmu``, ``R = r + e_r``; the subtraction ``u D``
  (times ``R |w|``), the product by r^ ``u P`` with ``P = (1 + u) D R`` (times ``|w|``), the stage ``u_m
  (1 + u) P`` (times ``|w|``), by w ``u Q``, ``Q = (1 + u)(1 + u_m) P |w|``, the bias ``u Y`` (``Y`` the
  result's magnitude with everything above); either product order (``(x - m^) (r^ w)``) is within the same
  charges;
* folded form ``x s + (b - m^ s)``, ``s = fl(r^ w)`` once per column (torch's CPU norms, cuDNN's
  inference): ``s``'s rounding ``u S D`` (``S = R |w|``; the same ``s`` multiplies ``x`` and ``m^``), the
  products ``u (1 + u) S |x|`` and ``u (1 + u) S (|m| + dmu)``, the shift's subtraction ``u (|b| + (1 +
  u)**2 S (|m| + dmu))`` and the final addition ``u Y``: on offset rows (mean 300, std 1) some ``600 u``
  where the standard form's is ``3 u`` (the folded form's known loss: the family's member named "folded
  affine form" gets this bound, the standard member the other; "sequential Welford" the larger);
* the store to a half result ``u_o Y'`` and the reference's own rounding ``u_o |ref|``; ``10 eta`` for
  the roundings that may underflow; the float64 evaluation of ``r``, ``m``, the loadings and the residual
  (within ``2**-50`` relative) by ``2**-48`` of ``|t| e_r / r + r |w| dmu`` and EVAL_SLACK.

**Reduced precisions** (the inputs, weight and bias rounded to p, computed in float32): both forms' bound
in float32 plus ``u_p (|x| R |w| + Q + |b|)``.

Power: no guaranteed size of one element is claimed (it depends on the geometry of the loadings; the
report keeps the statistical test's figure); measured, an element or a feature off by 2 spreads of correct
kernels on float32 rows fails it. What ``(c1, c2)`` absorb (a row scaled where the bias is 0, a row offset by
``c w``) the statistical tests judge. A kernel whose elements pass through other shared values (per tile) is outside.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32, Format
from refkern.analysis.row_bound import EVAL_SLACK, groups, half_subnormal

__all__ = ["NormRows", "FORMS"]

FORMS = {None: 0, "folded affine form": 1, "sequential Welford": 2}  #: 0 standard, 1 folded, 2 either
#: the ordered float64 keys of -2 and 2: c2 is searched in [-2, 2] (a correct kernel's |dr| <= e_r / r <= 1: rows
#: whose bound on r's relative error exceeds 1 make no claim)
_KEY_LO, _KEY_HI = -(2**62), 2**62


@jit(inline="always")
def _stats(x, n, center, eps, u, u_m, g_n, g_n3, uf):
    """(mean, r, dmu, e_r, ok) of one row: float64 two-pass statistics and the envelope's worst-case bounds
    of :func:`refkern.analysis.envelope._norm_rows` on the mean and on r (its two-pass form), with the
    sums' ``gamma`` of the working format (the family's statistics; ``u_m`` where they are stored in half)."""
    t = 0.0
    for j in range(n):
        t += np.float64(x[j])
    mean = t / n if center else 0.0
    m2, q, a = 0.0, 0.0, 0.0
    for j in range(n):
        v = np.float64(x[j])
        d = v - mean
        m2 += d * d
        q += v * v
        a += abs(v)
    if not (m2 - m2 == 0.0 and q - q == 0.0):
        return 0.0, 0.0, 0.0, 0.0, False
    A = a / n
    ua = u + u_m
    dmu = (g_n * A + u_m * abs(mean)) if center else 0.0
    e_m2 = g_n3 * np.sqrt(q) * np.sqrt(m2) + n * (g_n * A) ** 2
    var = m2 / n
    e_v = (e_m2 + uf) / n + ua * var
    w = var + eps
    e_w = e_v + ua * w
    if not w > 0.0 or not w - e_w > 0.0:
        return 0.0, 0.0, 0.0, 0.0, False
    r = 1.0 / np.sqrt(w)
    e_r = max(1.0 / np.sqrt(w - e_w) - r, r - 1.0 / np.sqrt(w + e_w)) + (2.0 * u + u_m) * r
    return mean, r, dmu, e_r, r - r == 0.0 and e_r - e_r == 0.0 and e_r <= r


@jit(inline="always")
def _element(x, y, w, bias, mean, r, dmu, e_r, u, u_m, uo, store, up, form, eta):
    """``b_j`` of the module docstring (inf where an operand or the reference is not finite)."""
    if not (abs(x) < np.inf and abs(y) < np.inf and abs(w) < np.inf and abs(bias) < np.inf):
        return np.inf
    ay, aw, ab = abs(y), abs(w), abs(bias)
    D = abs(x - mean) + dmu + up * (abs(x) + abs(mean))
    R = r + e_r
    sh = aw * (abs(x - mean) * e_r + dmu * R)  # the shared errors' reach: magnitudes only
    b_std = 0.0
    b_fold = 0.0
    if form != 1:
        P = (D + u * D) * R
        Pm = (1.0 + u) * P  # the normalised row, which a half stage stores (u_m): Hugging Face's RMSNorm
        Q = (1.0 + u_m) * Pm * aw
        e = u * D * R * aw + u * P * aw + u_m * Pm * aw + u * Q
        Y = ay + uo * ay + sh + e
        b_std = e + (u * Y if bias != 0.0 else 0.0)
    if form != 0:
        S = R * aw
        M = abs(mean) + dmu
        Y = ay + uo * ay + sh + 4.0 * u * S * (abs(x) + M)
        b_fold = u * S * D + u * (1.0 + u) * S * (abs(x) + M) + u * (ab + (1.0 + u) ** 2 * S * M) + u * Y
    b = max(b_std, b_fold)
    Yo = ay + uo * ay + sh + b
    b += store * Yo + uo * ay  # a half result's store; the reference's own rounding
    b += up * (abs(x) * R * aw + (1.0 + u) * (1.0 + u_m) * D * R * aw + ab)  # a candidate's inputs rounded to p
    b += 10.0 * eta + 2.0**-48 * (abs(x - mean) * r * aw * e_r / r + r * aw * dmu)
    return b * (1.0 + EVAL_SLACK) + 2.0**-52 * (ay + Yo)


@jit(inline="always")
def _gap(rho, al, be, c2, t):
    """``max(lo - hi, viol)`` at ``c2``: ``lo``/``hi`` the bounds on ``c1`` from the elements with a loading
    ``al`` (``|rho - c1 al - c2 be| <= t``), ``viol`` the excess of those without; convex in ``c2``."""
    lo, hi, viol = -np.inf, np.inf, -np.inf
    for j in range(rho.size):
        v = rho[j] - c2 * be[j]
        a = al[j]
        if a > 0.0:
            lo, hi = max(lo, (v - t) / a), min(hi, (v + t) / a)
        elif a < 0.0:
            lo, hi = max(lo, (v + t) / a), min(hi, (v - t) / a)
        else:
            viol = max(viol, abs(v) - t)
    return max(lo - hi, viol)


@jit(inline="always")
def _of_key(k):
    """The float64 of an ordered key (the bits of non-negative floats; minus those of |x| for negative)."""
    return np.int64(k).view(np.float64) if k >= 0 else -np.int64(-k).view(np.float64)


@jit(inline="always")
def _feasible(rho, al, be, t):
    """Is there ``(c1, c2)`` with every ``|rho_j - c1 al_j - c2 be_j| <= t``: the minimum of the convex
    :func:`_gap` over ``c2`` (a ternary search over the ordered keys of float64: a convex function is
    unimodal in any monotone parametrisation), at most 0?"""
    if _gap(rho, al, be, 0.0, t) <= 0.0:
        return True
    lo, hi = _KEY_LO, _KEY_HI
    while hi - lo > 2:
        third = (hi - lo) // 3
        m1, m2 = lo + third, hi - third
        g1, g2 = _gap(rho, al, be, _of_key(m1), t), _gap(rho, al, be, _of_key(m2), t)
        if g1 <= 0.0 or g2 <= 0.0:
            return True
        if g1 < g2:
            hi = m2
        elif g1 > g2:
            lo = m1
        else:
            lo, hi = m1, m2
    for k in range(lo, hi + 1):
        if _gap(rho, al, be, _of_key(k), t) <= 0.0:
            return True
    return False


@jit(inline="always")
def _row_arrays(X, W, B, Y, A, i, n, center, eps, u, u_m, uo, store, up, form, eta, g_n, g_n3, uf, rho, al, be):
    """Fill ``rho = (a - ref) / b``, ``al = l1 / b``, ``be = l2 / b`` of row i (0 where ``b`` is inf: no
    constraint); False where the row's statistics are not finite."""
    sw, sb = int(W.shape[1] > 1), int(B.shape[1] > 1)
    wr, br = W[i % W.shape[0]], B[i % B.shape[0]]
    mean, r, dmu, e_r, ok = _stats(X[i], n, center, eps, u, u_m, g_n, g_n3, uf)
    if not ok:
        return False
    for j in range(n):
        x, y, w, bias = np.float64(X[i, j]), np.float64(Y[i, j]), wr[j * sw], br[j * sb]
        b = _element(x, y, w, bias, mean, r, dmu, e_r, u, u_m, uo, store, up, form, eta)
        a = np.float64(A[i, j])
        if b < np.inf and abs(a) < np.inf:
            rho[j] = (a - y) / b
            al[j] = -r * w / b if center else 0.0
            be[j] = (x - mean) * r * w / b
        else:
            rho[j], al[j], be[j] = 0.0, 0.0, 0.0
    return True


@jit(parallel=True, error_model="numpy")
def _test(X, W, B, Y, A, center, eps, u, u_m, uo, store, up, form, eta, g_n, g_n3, uf, ok):
    """``ok[i]``: does row i fit some ``(c1, c2)`` at ``t = 1``? ``c = 0`` where it fits (max |rho| <= 1),
    else a least-squares fit first, the exact search only where that fails."""
    R, n = X.shape
    for i in prange(R):
        rho, al, be = np.empty(n), np.empty(n), np.empty(n)
        if not _row_arrays(X, W, B, Y, A, i, n, center, eps, u, u_m, uo, store, up, form, eta, g_n, g_n3, uf, rho, al,
                           be):  # fmt: skip
            ok[i] = True
            continue
        top = 0.0
        for j in range(n):
            top = max(top, abs(rho[j]))
        if top <= 1.0:  # c = 0 fits: most rows of a correct result
            ok[i] = True
            continue
        saa, sab, sbb, sra, srb = 0.0, 0.0, 0.0, 0.0, 0.0
        for j in range(n):
            saa += al[j] * al[j]
            sab += al[j] * be[j]
            sbb += be[j] * be[j]
            sra += rho[j] * al[j]
            srb += rho[j] * be[j]
        det = saa * sbb - sab * sab
        c1, c2 = 0.0, 0.0
        if det > 0.0:
            c1, c2 = (sra * sbb - srb * sab) / det, (srb * saa - sra * sab) / det
        elif sbb > 0.0:
            c2 = srb / sbb
        worst = 0.0
        for j in range(n):
            worst = max(worst, abs(rho[j] - c1 * al[j] - c2 * be[j]))
        ok[i] = worst <= 1.0 or _feasible(rho, al, be, 1.0)


@jit(error_model="numpy")
def _t_rows(X, W, B, Y, A, rows, center, eps, u, u_m, uo, store, up, form, eta, g_n, g_n3, uf, T):
    """``T`` of the rows ``rows`` by bisection on ``t`` (to 2**-20 relative; inf beyond 2**60)."""
    n = X.shape[1]
    rho, al, be = np.empty(n), np.empty(n), np.empty(n)
    for k in range(rows.size):
        i = rows[k]
        _row_arrays(X, W, B, Y, A, i, n, center, eps, u, u_m, uo, store, up, form, eta, g_n, g_n3, uf, rho, al, be)
        lo, hi = 1.0, 2.0
        while not _feasible(rho, al, be, hi) and hi <= 2.0**60:
            lo, hi = hi, 2.0 * hi
        if hi > 2.0**60:
            T[k] = np.inf
            continue
        while hi - lo > 2.0**-20 * hi:
            mid = 0.5 * (lo + hi)
            if _feasible(rho, al, be, mid):
                hi = mid
            else:
                lo = mid
        T[k] = hi


def _gamma(k, u):
    return k * u / (1.0 - k * u) if k * u < 1.0 else math.inf


class NormRows:
    """The test of the module docstring for a norm laid out as rows ``X`` (R, n) with weight and bias ``W``,
    ``B`` ((1 or R, 1 or n), :func:`refkern.analysis.envelope._param_rows`), ``center`` (False: rms_norm),
    ``eps``, the correctly rounded result ``ref`` (``rows``/``back`` convert the output's layout), the result
    format ``out``, working unit ``u_w`` and half stage unit ``u_m``. ``given``: batch_norm's running
    statistics are not handled here (None is returned by :meth:`of`)."""

    REPORTED = 8  #: failing rows whose T is computed (the others are failing rows, T not needed)

    def __init__(self, X, W, B, center, eps, ref, rows, back, out: Format, u_w: float, u_m: float):
        from refkern.analysis.noise_rows import frozen, held_dtype

        Y = rows(ref) if np.asarray(ref).dtype in (np.float32, np.float64) else rows(np.asarray(ref, np.float64))
        self.h = held_dtype(X, Y)  # X, the reference and the output in one format: widened as they are read
        self.X, self.Y = frozen(X, self.h), frozen(Y, self.h)
        self.W, self.B = (frozen(p, np.float64) for p in (W, B))  # read-only too: one signature per format
        self.rows, self.back, self.out = rows, back, out
        self.center, self.eps, self.u_w, self.u_m = bool(center), float(eps), float(u_w), float(u_m)
        self.eta = half_subnormal(u_w, out)

    def _params(self, key):
        from refkern.accumulate.formats import BFLOAT16, FLOAT16

        n = self.X.shape[1]
        u, u_m, up, form = self.u_w, self.u_m, 0.0, FORMS.get(key, -1)
        if form < 0:
            p = {"fp16": FLOAT16, "bf16": BFLOAT16, "fp32": FLOAT32}.get(key)
            if p is None:
                return None
            u, u_m, up, form = FLOAT32.u, 0.0, p.u, 2
        store = self.out.u if self.out.prec < FLOAT32.prec else 0.0  # a float32 result: its last rounding
        g_n, g_n3 = _gamma(n, u), _gamma(n + 3, u)  # the family's statistics: the working format's (a half store: u_m)
        uf = 2.0 * n * self.eta  # the squares' underflow (the envelope's)
        return self.center, self.eps, u, u_m, self.out.u, store, up, form, self.eta, g_n, g_n3, uf

    def failures(self, actual, key=None) -> list:
        """The failing rows as groups (``axis`` :data:`~refkern.analysis.row_bound.ROW_OWN`, ``z`` = T, the
        first holding ``mask``: every element of the failing rows), most significant first; [] where every
        row fits or ``key`` is not modelled."""
        p = self._params(key)
        if p is None or not self.X.size:
            return []
        from refkern.analysis.noise_rows import frozen

        held = np.asarray(actual)
        exact = held.dtype in (np.float16, np.float32) or self.h == np.float64  # held without loss in h
        if not exact and held.dtype == np.float64:  # the verdict's float64 copy of a float32 result: one signature
            narrow = held.astype(np.float32)
            exact = bool(np.array_equal(narrow, held, equal_nan=True))
            held = narrow if exact else held
        A = frozen(self.rows(held), self.h if exact else np.float64)
        ok = np.ones(self.X.shape[0], bool)
        _test(self.X, self.W, self.B, self.Y, A, *p, ok)
        bad = np.flatnonzero(~ok)
        if not bad.size:
            return []
        T = np.full(bad.size, np.nan)
        head = bad[: self.REPORTED]
        Th = np.empty(head.size)
        _t_rows(self.X, self.W, self.B, self.Y, A, head.astype(np.int64), *p, Th)
        T[: head.size] = Th
        mask = np.zeros(self.X.shape, bool)
        mask[bad] = np.isfinite(A[bad]) & (A[bad] != self.Y[bad])
        mask = np.asarray(self.back(mask), bool)
        T = np.nan_to_num(T, nan=1.0)  # beyond REPORTED: failing, T > 1 not computed
        order = np.argsort(-T)
        return groups(bad[order], T[order], np.zeros(order.size), mask)

    def detectable_ulps(self, ref) -> tuple:
        """No claim of its own (module docstring, Power): (inf, inf), the statistical test's figure stands."""
        return math.inf, math.inf
