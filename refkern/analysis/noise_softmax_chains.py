"""A float32 softmax's denominator chains, emulated on the very logits: the members of the rounding family of
``D = sum_j exp(z_j - M)`` that no scale can hold tightly, taken out of the row-shared scale and tested one by
one (as :mod:`refkern.analysis.noise_chains` does for sums and :mod:`refkern.analysis.noise_norm_chains` for
the norms' statistics).

A softmax row shares its sum: D's relative error ``dD / D`` moves every weight ``y_j = t_j / D`` by ``-y_j dD /
D``. The scale of :mod:`refkern.analysis.noise_softmax` charges D the worst order's additions (a scalar loop's
``n - 1`` partial sums at their half-ulps, :func:`~refkern.analysis._softmax_rows.shared_sq`: 4.2-4.4 u relative
on randn rows of 64 logits, 16 u at 1024, 46 u at 8192) as one random draw, so the row's and the whole tensor's
scale tests run at ``lam_grp`` times that, while a correct kernel's D is one deterministic chain: one row of a
float32 softmax over 64 logits scaled by 8 spreads of correct kernels (19-29 u) passed (bench_verdict).

So, on float32 results of float32 logits (:func:`applies`):

* **the rest** (:attr:`Chains.adds_rest`): D's additions in every order whose chains hold at most ``ceil(n /
  C)`` terms, ``C = min(isqrt(n), C_MAX)`` (noise_chains' balance), ``u**2 S_rest**2(t) / D**2`` with
  ``S_rest**2`` of :func:`~refkern.analysis.noise_chains.rest_sq` on the exact terms ``t`` (their chains' partial
  sums and the combine's, each charged ``u P``: at least its half-ulp), taken at most the whole family's. The
  exps' errors (``sum w_j**2 beta_j**2``) and an online kernel's rescales stay as they were. The element test
  and the rows' and the tensor's scale tests run on the rest; the column tests (one element per row, each row's
  chain a draw of its own) keep the whole family's (:attr:`~refkern.analysis.noise_rows.RowShared.widen`: the
  family's less the rest's shared variance, on the loading ``y``).
* **members** (:class:`SoftmaxMembers`, only where a test fails on the rest): the two-pass kernels, D summed
  by the members of :func:`~refkern.analysis.noise_chains.member_specs` (``T`` chunks of ``L`` lanes with ``T L
  < C``, the scalar loop both ways) on the float32 terms ``t32 = fl(exp(fl(z - M)))`` (correctly rounded, the
  argument as every kernel rounds it), the chains' values exact and their combine free (its partial sums'
  scale, noise_chains); and the online scalar loops (Milakov and Gimelshein's running normaliser, both ways:
  ``s = fl(s fl(exp(fl(m - x))))`` at every new maximum, ``s = fl(s + fl(exp(fl(x - m))))``), emulated in float32
  (:func:`_online_rows`). Member ``k``'s error ``e_k`` is its chain value less the exact sum of its own float32
  terms (in the final maximum's units), so its centre is ``D_k = D + e_k`` on the exact terms and it moves
  weight ``j`` by ``A_k y_j``, ``A_k = D / D_k - 1``, exactly. What it leaves unemulated, relative to ``D**2`` and
  times ``(D / D_k)**2``: the exps' errors (``sum w_j**2 beta_j**2``, as the rest), the combine's (two-pass
  lanes: ``u**2 (comb + sq)``), the float64 sums' own error, an online loop's rescales along its own order (each
  factor ``f = exp(m_old - m_new)`` within ``B_row`` ulps in the kernel and half of one here: ``((2 B_row + 1)
  h(f) / f)**2`` of the running sum's square; its product a full rounding, below), and **the flips**: a kernel
  whose exp differs from ``t32`` by ``delta`` (within ``d_j = (2 B_j + 1) h(t_j (1 + 2 B_j u))``: its exp within
  ``B_j`` ulps, ``t32`` within half of one, ``h`` the half-ulp of :func:`~refkern.analysis._softmax_rows.
  half_ulp`; the argument ``fl(z - M)`` as every kernel here rounds it) rounds the same addition to the same
  float32 value unless the exact sum lies within ``delta`` of a rounding boundary; the two partial sums differ
  by a multiple of the binade's ulp, so each addition's difference is ``delta`` plus a mean-zero two-point error
  of range one ulp that is nonzero with probability ``p = delta / ulp`` (the rounding position uniform, the
  model of every rounding here), whose sub-Gaussian variance proxy is Kearns and Saul's ``ulp**2 (1 - 2 p) / (2
  ln((1 - p) / p))`` at ``p = min(d / ulp, 1/2)`` (at most ``h**2``, Hoeffding's, at ``p = 1/2``;
  :func:`~refkern.analysis.noise_chains._flip_sq`); where the computed partial sum enters a larger binade (the
  difference there a multiple of the smaller ulp) and at each online rescale's product, a full rounding,
  ``h**2``, of the step and of the one before it (the kernel's partial sum may cross one step apart). The proxy
  decays only as ``1 / ln(1 / p)``: at the ``p`` of 64 randn logits (0.04-0.3) a flip costs 0.6-1 of a rounding,
  so the scalar loop's member keeps 2.9 u of its 4.3 u. Measured on 200 randn rows of 64, 1024 and 8192 logits
  against numpy's float32 exp and torch's exp_u20 (emulated bit for bit) summed by the scalar loop: what the
  member leaves is 0.75-1.06 u relative (root mean square; at most 3.9 u): the proxy is the price of a
  sub-Gaussian bound at the tests' levels (a flip is a rare event of one ulp: its tail is Poisson's).

  The row test's floor on 64 logits is the rest's online rescales, ``sqrt(rescales) (2 B_row + 1) u``, 3-5 u
  (the records' running sums are 0.33-0.91 of ``D**2``): a row scaled by 24 u relative (8 spreads of correct
  kernels) is still `rounding` there; the tiled online kernels (FlashAttention's) are in the family and their
  rescales are that large within the exp's documented ulps.

  An element passes the rest's test or a member's: ``|a - c - A_k y| <= lam_el sqrt(v - s_rest y**2 + rem_k
  y**2)`` (``v`` the element's variance on the rest, ``s_rest`` the rest's shared relative variance it holds,
  ``rem_k`` the member's); a row's scale test on the rest's or a member's, the whole tensor's on the rest's or
  on one member for every row (a kernel is one order): :class:`~refkern.analysis.noise_norm_chains.NormMembers`'
  tests with one loading, ``l1 = y`` (``r = 1``, ``W = y``) and ``l2 = 0`` (``X = mean = 0``, ``B = rem2 =
  0``). Each member is one correct kernel with its own sub-Gaussian bound, so a result outside every one is
  refused at the level of the one that made it. A member is refused where its own error is beyond ``lam`` of
  its chain's worst case (a stagnating chain, noise_chains), at ``level(k R)``: the budget split over members x
  rows as the sums' and the norms' members are.

A softmax kernel whose denominator is a long chain that none of the members is (an online loop over lanes or
threads with its own boundaries, a dynamic schedule) is outside the family and may be called a mismatch.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import FLOAT64
from refkern.analysis._softmax_rows import _half_ulp, half_ulp
from refkern.analysis.noise_chains import _flip_sq, chains_of, rest_sq, sums
from refkern.analysis.noise_chains import member_specs as sum_specs
from refkern.analysis.noise_norm_chains import NormMembers
from refkern.analysis.noise_rows import frozen
from refkern.analysis.stats import level

__all__ = ["applies", "Chains", "SoftmaxMembers", "member_count", "slack", "ONLINE"]

ONLINE = 2  #: the online scalar loops emulated: left to right and right to left


def applies(X) -> bool:
    """Are the logits X (R, n) of a float32 result emulated: at least ``C = 2`` chains (:func:`~refkern.analysis.
    noise_chains.chains_of`)? The rest holds for any logits; the members run in float32 on them, so where some
    value is not a float32 number there are none (:meth:`Chains.make`, checked only there: a pass over the logits
    that a healthy output does not pay)."""
    X = np.asarray(X)
    return X.ndim == 2 and X.size > 0 and chains_of(X.shape[1]) >= 2


def member_count(n: int) -> int:
    """The number of emulated members of a row of ``n`` logits: the two-pass chains and :data:`ONLINE`."""
    return len(sum_specs(n)) + ONLINE


def slack(arg, t, B, u):
    """Per term, ``d_j = (2 B_j + 1) h(t_j (1 + 2 B_j u))``: how far a correct kernel's float32 exp (within ``B_j``
    ulps) may lie from the correctly rounded one (module docstring); 0 where the term is 0 or not finite."""
    with np.errstate(all="ignore"):
        d = (2.0 * B + 1.0) * half_ulp(t * (1.0 + 2.0 * B * u), u)
        return np.where(np.isfinite(d) & (t > 0), d, 0.0)


class Chains:
    """The rest and the members of one call's softmax rows (module docstring): :attr:`adds_rest` the rest's
    additions per row, relative to ``D**2``; :meth:`attach` hands the row tests the members and the columns'
    widening."""

    def __init__(self, X, arg, t, D, B, Brow, u, wb, adds, rec):
        self.X, self.arg, self.t, self.D, self.B, self.Brow, self.u = X, arg, t, D, B, Brow, u
        self.wb, self.adds, self.rec = wb, adds, rec
        with np.errstate(all="ignore"):
            rest = u * u * rest_sq(np.where(np.isfinite(t), t, 0.0)) / (D * D)
            self.adds_rest = np.where(np.isfinite(rest) & ~np.isnan(adds), np.minimum(rest, adds), adds)

    def attach(self, coh, ys_rows, sh_rest):
        """Give the row-shared errors ``coh`` (:class:`~refkern.analysis.noise_rows.RowShared`, its terms the
        rest's ``sh_rest`` on the loading ``ys_rows``) the members and the columns' widening."""
        R = self.X.shape[0]
        coh.members = SoftmaxMembers(ys_rows, sh_rest, self.make)
        d1 = np.nan_to_num(np.maximum(self.adds - self.adds_rest, 0.0))
        coh.widen = (np.ascontiguousarray(d1, np.float64), np.zeros(R))
        return coh

    def make(self):
        """Every member's ``(A, B, rem1, rem2)`` (k, R) (module docstring), a member refused at ``level(k R)``."""
        X32 = np.ascontiguousarray(self.X, np.float32)
        R, n = X32.shape
        if not np.array_equal(X32, self.X, equal_nan=True):  # logits that are not float32 numbers: no member
            z = np.zeros((0, R))
            return z, z, z, z
        u, D, wb = self.u, self.D, self.wb
        lam = level(member_count(n) * R)
        with np.errstate(all="ignore"):
            M32 = np.max(np.where(np.isnan(X32), -np.inf, X32), axis=1, initial=-np.inf)
            arg32 = X32 - np.where(np.isfinite(M32), M32, 0.0)[:, None]  # float32: each kernel's rounded argument
            t32 = np.exp(arg32.astype(np.float64)).astype(np.float32)
            d = slack(self.arg, self.t, self.B, u)
        specs = sum_specs(n)
        cs, err, comb, sq, _, flip = sums(t32, lam, specs, d, u)
        S32 = t32.astype(np.float64).sum(axis=1)
        with np.errstate(all="ignore"):
            e = cs - S32[None, :]
            rem = (u * u * (comb + sq) + flip + (err + n * FLOAT64.u * S32) ** 2) / (D * D)
        Dk, xs, psq, fo = (np.empty((ONLINE, R)) for _ in range(4))
        for back in range(ONLINE):
            _online_rows(frozen(X32), frozen(self.Brow, np.float64), u, back, Dk[back], xs[back], psq[back], fo[back])
        with np.errstate(all="ignore"):
            eo = Dk - xs
            eo = np.where(np.abs(eo) <= lam * u * np.sqrt(3.0 * psq + D * D), eo, np.nan)  # a stagnating loop
            remo = (fo + (n * FLOAT64.u * xs) ** 2) / (D * D)  # fo: its flips and its rescales' exps
            e = np.concatenate([e, eo])
            Dm = D[None, :] + e
            q = D[None, :] / Dm
            A = q - 1.0
            rem1 = q * q * (wb[None, :] + np.concatenate([rem, remo]))
            bad = ~(np.isfinite(A) & np.isfinite(rem1))
            A, rem1 = np.where(bad, np.nan, A), np.where(bad, np.nan, rem1)
        z = np.zeros_like(A)
        return A, z, rem1, z


class SoftmaxMembers(NormMembers):
    """The emulated members of a softmax's rows (module docstring) in the form of :class:`~refkern.analysis.
    noise_norm_chains.NormMembers` with one loading: ``parts = (0, 0, 1, y)``, so that ``l1 = r W = y`` (the
    weight: D's relative error moves it by ``-y dD / D``) and ``l2 = (X - mean) l1 = 0``; ``smu2`` the rest's
    shared relative variance per row, ``srel2 = 0``; ``make()`` the members' ``(A, 0, rem1, 0)``."""

    def __init__(self, ys_rows, sh_rest, make):
        R, n = ys_rows.shape
        parts = (
            frozen(np.zeros((R, n), np.float32)),
            np.zeros(R),
            np.ones(R),
            np.ascontiguousarray(ys_rows, np.float64),
        )
        super().__init__(parts, sh_rest, np.zeros(R), make)


@jit(parallel=True, error_model="numpy")
def _online_rows(X, Brow, u, back, Dk, xs, psq, flip):
    """Per row of the float32 logits X (R, n): the online scalar loop (module docstring; right to left with
    ``back``) in float32 with correctly rounded exps: its sum ``Dk`` in the final maximum's units, ``xs`` the
    exact sum of its float32 terms in those units (float64), ``psq`` the sum of the squares of those exact
    partial sums, ``flip`` the variance a kernel whose exps differ may add by rounding otherwise (module
    docstring; the terms' slack at the row's largest exp bound ``Brow``). NaN where the row holds a NaN or no
    finite maximum."""
    R, n = X.shape
    for i in prange(R):
        M = -np.inf
        nan = False
        for j in range(n):
            x = X[i, j]
            if x != x:
                nan = True
            elif x > M:
                M = x
        if nan or not M - M == 0.0:
            Dk[i], xs[i], psq[i], flip[i] = np.nan, np.nan, np.nan, np.nan
            continue
        b = Brow[i]
        m = np.float32(-np.inf)
        s = np.float32(0.0)
        ex, sp, fl, prev, rs = 0.0, 0.0, 0.0, 0.0, 0.0
        for q in range(n):
            j = n - 1 - q if back else q
            x = X[i, j]
            if x == -np.inf:
                continue
            if x > m:
                if s > 0:
                    f = np.float32(math.exp(np.float64(np.float32(m - x))))
                    ns = np.float32(s * f)
                    g = math.exp(np.float64(m) - np.float64(x))  # the units change, exactly
                    ex, sp, fl, prev = ex * g, sp * g * g, fl * g * g, prev * g * g
                    h = _half_ulp(np.float64(ns), u)
                    fl += h * h + prev  # the product's rounding, and the step before it
                    # the kernel's exp within b ulps of the exact factor, this one within half of one
                    e = (2.0 * b + 1.0) * _half_ulp(np.float64(f), u) / np.float64(f) * np.float64(s) * g
                    rs += e * e
                    s = ns
                m = x
            a = np.float32(x - m)
            tv = np.float32(math.exp(np.float64(a)))
            ns = np.float32(s + tv)
            d = (2.0 * b + 1.0) * _half_ulp(np.float64(tv) * (1.0 + 2.0 * b * u), u)
            g = _flip_sq(s, ns, d)
            fl += g
            prev = _half_ulp(np.float64(ns), u) ** 2
            s = ns
            ex += np.float64(tv)
            sp += ex * ex
        Dk[i], xs[i], psq[i], flip[i] = np.float64(s), ex, sp, fl + rs
