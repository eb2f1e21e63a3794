"""A float32 norm's row statistics with long chains, emulated on the very rows: the members of the rounding
family of layer_norm's mean and variance and rms_norm's mean of squares that no scale can hold tightly, taken
out of the row-shared scale and tested one by one (as :mod:`refkern.analysis.noise_chains` does for sums and
:mod:`refkern.analysis.noise_var_chains` for var).

A norm's row shares its statistics: the mean's error ``dmu`` moves every element by ``-dmu r w`` (loading ``l1
= r w``), r's relative error ``drel`` by ``drel t`` (loading ``l2 = t = (x - mean) r w``). The scale of
:mod:`refkern.analysis.noise` charges them the worst order's roundings (a scalar loop's partial sums: ``u
sqrt(n / 3)`` relative for a sum of squares of randn values; ``u |mean| sqrt(n / 3)`` for an offset row's mean),
as one random draw, so the row's and the whole tensor's scale tests run at ``lam_grp`` (level 6-7) times that.
A correct kernel's statistic is one deterministic chain: bench_verdict's rms_norm 64 and 4096 float32 scaled by
8 spreads of correct kernels passed (its row and tensor tests), and one element off by 8 spreads of a float32
layer_norm over 4096 offset features passed the element test (the scalar loop's mean, ``rw sigma_mu``).

So, on float32 results of float32 rows (:func:`applies`):

* **the rest** (:func:`rest_shared`): the statistic's variance of every order whose chains hold at most
  ``ceil(n / C)`` terms, ``C = min(isqrt(n), C_MAX)`` (noise_chains' balance): layer_norm's mean ``u**2
  (S_rest**2 / n**2 + mean**2)`` (``S_rest**2`` of :func:`~refkern.analysis.noise_chains.rest_sq`, the sum's
  rest, and the division), rms_norm's mean of squares ``u**2 (5 sum x**4 + S_rest**2(x**2)) / n**2 + (u
  ms)**2`` (the squares' roundings, the rest of the sum of the squares, the division). Layer_norm's variance
  keeps the whole family's scale in the rest (its rest, :func:`~refkern.analysis.noise_var_chains.rest_s2`, is
  14 passes over the row: 0.73 s on (16384, 768), five times the moments' pass; on a healthy output that cost
  would be paid always); its members take it out where they are tried. The element test and the rows' and the
  tensor's scale tests run on the rest; the column tests (one element per row, R rows: each row's long chain a
  draw of its own) keep the whole family's (``d1 l1**2 + d2 l2**2`` per element added back, ``d`` the
  family's less the rest's shared variance of the row).
* **members** (:class:`NormMembers`, only where a test fails on the rest): layer_norm's statistics by every
  member of :func:`~refkern.analysis.noise_var_chains.member_specs` (Welford over ``T`` chunks of ``L``
  lanes with ``T L < C``, Welford in fixed tiles, tiles of 32 and more merged in float32 by Chan's formula,
  the two-pass scalar loops), each member's mean and M2 as :func:`~refkern.analysis.noise_var_chains.
  member_moments` gives them, ``var = M2 / n`` or ``M2 fl(1 / n)``, ``w = var + eps`` in float32 (exact where
  the member is one chain; else its merges' variance, the division's and the addition's roundings);
  rms_norm's mean of squares by the members of :func:`~refkern.analysis.noise_chains.members` on the float32
  squares ``fl(x x)`` (``T`` chunks of ``L`` lanes, ``/ n`` or ``fl(1 / n)``; its scale before the last
  rounding), ``w = ms + eps`` (``(u w)**2``). Per row, member ``k``'s exact ``r_k = w_k**-1/2`` and mean
  ``mu_k`` move element ``j`` by ``(x - mu_k) r_k w - (x - mean) r w = B_k l2 + A_k l1``, ``q = r_k / r``,
  ``A_k = -(mu_k - mean) q``, ``B_k = q - 1``, exactly (not to first order), with what the member leaves
  unemulated: ``rem1 = smu2_k q**2`` on ``l1`` (a merged mean) and ``rem2 = srel2_k q**2`` on ``l2`` (``w``'s
  variance over ``4 w**2``). An element passes the rest's test or a member's: ``|a - c - A_k l1 - B_k l2| <=
  lam_el sqrt(v - smu2 l1**2 - srel2 l2**2 + rem1 l1**2 + rem2 l2**2)`` (``v`` the element's variance on the
  rest, ``smu2``, ``srel2`` the rest's shared variances it holds); a row's scale test passes on the rest's or
  a member's, ``|num - A_k A1 - B_k A2| <= lam_grp sqrt(vv - smu2 Q1 - srel2 Q2 + rem1 A1**2 + rem2 A2**2) +
  bound`` with the row sums the test already forms (``num = sum res w``, ``vv = sum v w**2``, ``A = sum l w``,
  ``Q = sum (l w)**2``, :func:`~refkern.analysis.noise_rows._norm_row_sums`: no further pass over the
  elements), rsqrt's part still bounded (``bound``); the whole tensor's on the rest's or on one member for
  every row (a kernel is one order). Each member is one correct kernel with its own sub-Gaussian bound, so a
  result outside every one is refused at the level of the one that made it: the false-alarm rate of a correct
  member's result is at most that of its own test. A member is refused where its statistic is beyond the
  whole family's scale (a stagnating chain): at ``level(k R)``, the budget split over members x rows as the
  sums' members are.

A norm kernel whose statistic is a long chain that none of the members is (a Welford with ``m + d fl(1 / k)``
or an FMA update, a sum of squares by fused multiply-adds ``fma(x, x, s)``, chunk boundaries of its own, a
dynamic schedule) is outside the family and may be called a mismatch.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT32
from refkern.analysis.noise_chains import chains_of, rest_sq
from refkern.analysis.noise_chains import member_specs as sum_specs
from refkern.analysis.noise_chains import members as sum_members
from refkern.analysis.noise_var_chains import member_moments
from refkern.analysis.noise_var_chains import member_specs as var_specs
from refkern.analysis.stats import level

__all__ = ["applies", "rest_of", "Rest", "rest_shared", "NormMembers", "stat_members", "shifts", "member_count",
           "sequential"]


def applies(X, n: int) -> bool:
    """Are a float32 result's rows X (R, n) emulated: at least ``C = 2`` chains (:func:`~refkern.analysis.
    noise_chains.chains_of`) and every value a float32 number (the members run in float32 on them)?"""
    X = np.asarray(X)
    if chains_of(n) < 2:
        return False
    return X.dtype == np.float32 or bool(np.array_equal(X, X.astype(np.float32)))


def rest_of(lay, name, out, u, mean, var, smu2, sv2):
    """A :class:`Rest` for a norm's call whose statistics are emulated (layer_norm or rms_norm computing its
    statistics, a float32 result, float32 rows: :func:`applies`), else None. ``smu2``, ``sv2``: the whole
    family's shared variances per row (the mean's, the variance's)."""
    if lay.given is not None or name not in ("layer_norm", "rms_norm") or out is not FLOAT32 or u != FLOAT32.u:
        return None
    if not applies(lay.X, lay.n):
        return None
    rmu2, rsv2 = rest_shared(lay.X, lay.center, mean, var, u)
    return Rest(lay, smu2 if rmu2 is None else np.minimum(rmu2, smu2), sv2 if rsv2 is None else np.minimum(rsv2, sv2),
                u)  # fmt: skip


class Rest:
    """A norm's rest (module docstring): :meth:`apply` gives the rest's shared variances for the elements' and
    rows' tests and keeps :attr:`widen`, what the columns' tests add back; :meth:`members` the emulated
    statistics (:class:`NormMembers`)."""

    def __init__(self, lay, smu2, sv2, u):
        self.lay, self.smu2, self.sv2, self.u, self.widen = lay, smu2, sv2, u, None

    def apply(self, smu2, srel2, w):
        """``(smu2, srel2)`` of the rest from the whole family's (r's relative variance ``srel2`` from the
        variance's, ``(sv2 + (u w)**2) / (4 w**2)``); :attr:`widen` the differences, per row."""
        rel = (self.sv2 + (self.u * w) ** 2) / (4.0 * w * w)
        self.widen = tuple(np.ascontiguousarray(np.nan_to_num(np.maximum(f - r, 0.0)), np.float64)
                           for f, r in ((smu2, self.smu2), (srel2, rel)))  # fmt: skip
        return self.smu2, rel

    def members(self, Xc, mean, r, Wr, smu2, srel2, m2, s2):
        """:class:`NormMembers` of the rows ``Xc`` (as the row sums read them), the rest's ``smu2``, ``srel2``;
        ``m2``, ``s2``: the exact M2 and the whole family's variance of it (layer_norm's refusal)."""
        lay = self.lay
        parts = tuple(np.ascontiguousarray(a, np.float64) for a in (mean, r, Wr))
        return NormMembers((Xc, *parts), smu2, srel2, make_members(lay.X, lay.center, lay.eps, mean, r,
                                                                   m2 if lay.center else None,
                                                                   s2 if lay.center else None))  # fmt: skip


def rest_shared(X, center: bool, mean, var, u: float):
    """Per row of X (R, n): ``(smu2, sv2)`` of the rest (module docstring): the mean's variance (layer_norm;
    None for rms_norm, whose mean is 0) and the mean of squares' (rms_norm; None for layer_norm, whose
    variance keeps the family's)."""
    n = X.shape[1]
    X64 = np.asarray(X, np.float64)
    if center:
        return u * u * (rest_sq(X64) / n**2 + mean * mean), None
    Q = X64 * X64  # exact: float32 squares in float64
    return None, u * u * (5.0 * np.sum(Q * Q, axis=1) + rest_sq(Q)) / n**2 + (u * var) ** 2


def member_count(n: int, center: bool) -> int:
    """The number of emulated members of a row of ``n`` (two divisions each)."""
    return 2 * len(var_specs(n) if center else sum_specs(n))


def stat_members(X, center: bool, eps: float, lam: float, m2=None, s2_family=None):
    """Per member and row of X (R, n), values exact in float32: ``(mu, w, smu2, sw2)``, each (k, R): the
    member's mean (0 for rms_norm), ``w = var + eps`` (or ``ms + eps``) and their variances, what the member
    leaves unemulated (module docstring); NaN where a member is refused. ``m2``, ``s2_family``: the exact M2
    and the whole family's variance of it per row (layer_norm's refusal, noise_var_chains)."""
    R, n = X.shape
    u = FLOAT32.u
    e32 = np.float32(eps)
    X32 = np.ascontiguousarray(X, np.float32)
    if not center:
        Q = X32 * X32  # the float32 squares, each rounded once
        ms, err, pre = sum_members(Q, "mean", lam, sum_specs(n))
        with np.errstate(all="ignore"):
            w = ms + float(e32)
            sw2 = pre + err * err + (u * w) ** 2  # the members' last roundings and eps's addition
        return np.zeros_like(w), w, np.zeros_like(w), sw2
    specs = var_specs(n)
    mo, M2, sM2, smo = member_moments(X32, specs, lam, m2, s2_family)
    one = sM2 == 0.0  # one chain: the float32 M2 and mean, the division and eps's addition emulated exactly
    rn = float(np.float32(1.0) / np.float32(n))
    ws, sws = [], []
    with np.errstate(all="ignore"):
        for div in range(2):
            v = M2 / n if div == 0 else M2 * rn
            m32 = np.where(np.isfinite(M2), M2, 0.0).astype(np.float32)
            v32 = m32 / np.float32(n) if div == 0 else m32 * np.float32(rn)
            w32 = (v32 + e32).astype(np.float64)
            ws.append(np.where(np.isnan(M2), np.nan, np.where(one, w32, v + float(e32))))
            vv = (sM2 / n**2 if div == 0 else sM2 * rn * rn) + (u * v) ** 2 + (u * (v + float(e32))) ** 2
            sws.append(np.where(one, 0.0, vv))
    return np.concatenate([mo, mo]), np.concatenate(ws), np.concatenate([smo, smo]), np.concatenate(sws)


def shifts(mean, r, mu, w, smu2, sw2):
    """Per member and row: ``(A, B, rem1, rem2)`` (module docstring), from the exact ``mean`` and ``r`` per row
    and the members' ``mu``, ``w`` and their variances (k, R); NaN where a member is refused."""
    with np.errstate(all="ignore"):
        rk = 1.0 / np.sqrt(w)
        q = rk / r[None, :]
        A = -(mu - mean[None, :]) * q
        B = q - 1.0
        rem1 = smu2 * q * q
        rem2 = sw2 / (4.0 * w * w) * q * q
        bad = ~(np.isfinite(A) & np.isfinite(B) & np.isfinite(rem1) & np.isfinite(rem2))
        return tuple(np.where(bad, np.nan, a) for a in (A, B, rem1, rem2))


class NormMembers:
    """The emulated members of a norm's rows (module docstring), for the tests of :mod:`refkern.analysis.
    inside` and :mod:`refkern.analysis.verdict`: ``parts = (X, mean, r, W)`` the rows as :func:`~refkern.
    analysis.noise_rows.norm_sums` reads them, ``smu2``, ``srel2`` (R,) the shared variances the elements'
    scale holds (the rest's), ``make()`` the members' ``(A, B, rem1, rem2)`` (k, R), computed once, on the
    first test that fails on the rest."""

    def __init__(self, parts, smu2, srel2, make):
        self.parts = parts
        self.smu2, self.srel2 = np.asarray(smu2, np.float64), np.asarray(srel2, np.float64)
        self._make, self._coef = make, None

    def coef(self):
        if self._coef is None:
            self._coef = tuple(np.ascontiguousarray(a, np.float64) for a in self._make())
        return self._coef

    def sums(self, w):
        """Per row ``(A1, Q1, A2, Q2)`` of the weights ``w`` (R, n): ``sum l w`` and ``sum (l w)**2`` of the
        mean's loading ``l1 = r w`` and r's ``l2 = (x - mean) r w``."""
        X, mean, r, W = self.parts
        with np.errstate(all="ignore"):
            l1 = r[:, None] * np.broadcast_to(W, (X.shape[0], X.shape[1]))
            l2 = (np.asarray(X, np.float64) - mean[:, None]) * l1
            a, b = l1 * w, l2 * w
            return a.sum(axis=1), (a * a).sum(axis=1), b.sum(axis=1), (b * b).sum(axis=1)

    def rows_pass(self, num, vv, extra, bd, A1, A2, lam):
        """``(per row, tensor)``: does some member pass each row's scale test, and one member every row's
        summed test (module docstring)? ``num``, ``vv``, ``extra``, ``bd`` per row: the test's residual sum,
        its elements' variance sum, the shared errors' variance beyond it and the bound. The member's variance
        is the row's less what it emulates, ``smu2 A1**2 + srel2 A2**2`` (the shared errors' whole variance,
        ``smu2 ((sum l1 w)**2 - sum (l1 w)**2)`` in ``extra`` and ``smu2 sum (l1 w)**2`` in ``vv``), plus what it
        leaves."""
        A, B, rem1, rem2 = self.coef()
        if not len(A):
            return np.zeros(len(num), bool), False
        with np.errstate(all="ignore"):
            nk = num[None, :] - A * A1[None, :] - B * A2[None, :]
            base = np.maximum(vv + extra - self.smu2 * A1 * A1 - self.srel2 * A2 * A2, 0.0)
            vk = base[None, :] + rem1 * (A1 * A1)[None, :] + rem2 * (A2 * A2)[None, :]
            ok = np.abs(nk) <= lam * np.sqrt(vk) + bd[None, :]
            tot = np.abs(nk.sum(axis=1)) <= lam * np.sqrt(vk.sum(axis=1)) + float(np.sum(bd))
        return ok.any(axis=0), bool(tot.any())

    def element_z(self, a, c, var, idx):
        """The smallest z over the members at the flat indices ``idx`` of the rows' (R, n) elements: ``a``
        the actual, ``c`` the centre, ``var`` the elements' variance on the rest (flat float64)."""
        A, B, rem1, rem2 = self.coef()
        X, mean, r, W = self.parts
        out = np.full(len(idx), np.inf)
        if len(A) and len(idx):
            _element_z(a, c, var, np.ascontiguousarray(idx, np.int64), X, mean, r, W, self.smu2, self.srel2, A, B,
                       rem1, rem2, out)  # fmt: skip
        return out


@jit(parallel=True, error_model="numpy")
def _element_z(a, c, var, idx, X, mean, r, W, smu2, srel2, A, B, rem1, rem2, out):
    """Per flat index ``e = idx[p]`` of the (R, n) rows: the smallest over members ``k`` of ``|a - c - A_k l1
    - B_k l2| / sqrt(var - smu2 l1**2 - srel2 l2**2 + rem1_k l1**2 + rem2_k l2**2)`` (module docstring); W is
    read at row ``i % W.shape[0]``, column ``j`` or 0; refused members (NaN) never pass."""
    n = X.shape[1]
    sw = int(W.shape[1] > 1)
    K = A.shape[0]
    for p in prange(idx.size):
        e = idx[p]
        i, j = e // n, e % n
        l1 = r[i] * W[i % W.shape[0], j * sw]
        l2 = (np.float64(X[i, j]) - mean[i]) * l1
        res = np.float64(a[e]) - np.float64(c[e])
        base = max(var[e] - smu2[i] * l1 * l1 - srel2[i] * l2 * l2, 0.0)
        best = np.inf
        for k in range(K):
            v = base + rem1[k, i] * l1 * l1 + rem2[k, i] * l2 * l2
            d = abs(res - A[k, i] * l1 - B[k, i] * l2)
            if v > 0.0 and d - d == 0.0:
                best = min(best, d / math.sqrt(v))
            elif d == 0.0:
                best = 0.0
        out[p] = best


def make_members(X, center, eps, mean, r, m2=None, s2_family=None):
    """The thunk of :class:`NormMembers`: every member's ``(A, B, rem1, rem2)`` (k, R), a member refused at
    ``level(k R)`` (module docstring)."""

    def make():
        lam_v = level(member_count(X.shape[1], center) * X.shape[0])
        mu, w, smu2, sw2 = stat_members(X, center, eps, lam_v, m2, s2_family)
        return shifts(mean, r, mu, w, smu2, sw2)

    return make


def sequential(Xc, mean, r, Wr, smu2):
    """:class:`NormMembers` of the four sequential Welford means of the rows ``Xc`` in their format (``m += (x -
    m) / k`` and ``m += (x - m) fl(1 / k)``, each way: :func:`~refkern.analysis.noise_rows.welford_means`), for
    rows whose values repeat, where those means' running roundings drift together (noise's sequential-Welford
    member): each a member whose mean is known exactly, ``A = -(m_k - mean)``, ``B = 0``, the elements' scale
    less the mean's share ``smu2 l1**2``, r's kept (a member of the mean alone). Before, that member took the
    largest drift of the four as a bound of either sign on every element and row: bugs of 8 to 16 spreads of
    correct kernels passed in it (layer_norm over 64 offset bfloat16 features, bench_verdict session 9)."""
    from refkern.analysis.noise_rows import welford_means

    R = Xc.shape[0]
    parts = (Xc, *(np.ascontiguousarray(a, np.float64) for a in (mean, r, Wr)))

    def make():
        _, m = welford_means(Xc, mean)
        with np.errstate(all="ignore"):
            A = np.ascontiguousarray(-(m.T - np.asarray(mean, np.float64)[None, :]))
        A = np.where(np.isfinite(A), A, np.nan)
        z = np.zeros((4, R))
        return A, z, z, z

    return NormMembers(parts, smu2, np.zeros(R), make)
