"""A scan's increments: each output differs from its predecessor by the input, give or take a few roundings.

A cumsum's element test judges each output ``y_j`` against the spread of a running sum's accumulated errors,
which grows with ``j`` (:mod:`refkern.analysis.noise_scan`); a bug that moves a whole tail by one jump (a lost
carry between two blocks of a scan) is, at the jump, a few sigma of that spread, and after it no more. Its
increment is another matter: the difference of two neighbouring outputs of a correct scan,

    d_j = y_j - y_(j-1),    r_j = d_j - x_j = e_j - e_(j-1)    (e_j = y_j - P_j, P_j the exact prefix sums),

is the input ``x_j`` plus only the roundings that separate ``y_j`` from ``y_(j-1)``, not the ``j`` roundings
both carry; a lost carry puts one partial sum (a whole block's, or any bug's jump) into one ``r_j``.

**The orders.** Which roundings separate neighbours depends on the order, and this test holds for the orders
in which they are few (each rounding ``delta`` of a value ``v`` rounded to nearest in the working format, unit
roundoff ``u_w``, has ``|delta| <= h_w(|v|)``, ``h(m) = u 2**floor(log2 m)``, half the ulp of ``m``'s binade):

* a sequential running sum: ``y_j = fl(y_(j-1) + x_j)``, one rounding, of the prefix ``y_j``;
* blocked scans whose carry is the previous block's last output (a block's local running sum ``l_j``, then
  ``y_j = fl(c + l_j)``): within a block, ``l_j``'s rounding and the two outputs' (``e_j - e_(j-1) = delta(l_j)
  + delta(y_j) - delta(y_(j-1))``), at a block's first element one (``y_j = fl(c + x_j)``, ``c = y_(j-1)``);
* work-efficient trees (Brent and Kung; the odd-even recursion of ``jax.lax.associative_scan``; Blelloch's
  up- and down-sweep): an even position (of a recursion level) is ``y_j = fl(y_(j-1) + x_j)``, one rounding; an
  odd one is the next level's output over pair sums ``z_i = fl(x_(2i) + x_(2i+1))``, so ``r_j = delta(z_i) -
  delta(y_(j-1)) + r'_i`` with ``r'`` the next level's increment error on its (computed) inputs: at most ``L =
  ceil(log2 n)`` levels of two roundings each, and a last one: ``2 L + 1``;
* Sklansky's scan over tiles with the tile's total carried into its first value (ATen's CUDA scan of the innermost
  dimension, ``refkern.analysis.scan_kernels``): at level ``m`` every element with bit ``m`` set adds the last value
  of the lower half of its ``2**(m+1)``-block. Write ``j = b 1 0^t``, ``j - 1 = b 0 1^t``: at level ``t``, ``y_j``
  adds ``x_j`` to the very value ``y_(j-1)`` holds then (one rounding); at each higher level with a bit of ``b``
  set both add the same computed value (its errors cancel in ``r_j``), one rounding each: ``1 + 2 popcount(b) <=
  2 L - 1``; a tile's first element is ``fl(x + total)``, ``total`` its predecessor: one.

So ``r_j`` is at most ``2 L + 1`` roundings (``L >= 1``; the blocked scans' three and the sequential one's one
within it), each of a value that is a prefix sum or a segment sum ``P_b - P_a`` (``a < b <= j``) of the inputs,
as computed. For a correct kernel:

* a prefix partial is the working value an output is stored from (these orders' prefixes are outputs), and
  rounding to nearest keeps or raises a binade (``|RN(s)| >= 2**floor(log2 |s|)``), so ``|s| <= |a_i| / (1 -
  u_o)`` for the output ``a_i`` (``u_o`` the result format's): with ``M_j = max_(i <= j) max(|P_i|, |a_i|)``, at
  most ``M_j / (1 - u_o)``;
* a segment sum is at most ``2 M_j`` exactly; computed, it is a tree node of depth at most ``L + 1`` (first order
  ``(L + 1) u_w S_j`` away, ``S_j = sum_(i <= j) |x_i|``) or a block's local running sum ``l_j``, within ``(1 +
  u_w) (|s_j| + |c|)`` of two prefix partials; so every value rounded is at most ``m_S = 2 M_j (1 + u_w) / (1 -
  u_o) + ((L + 1) u_w + 2 n 2**-53) S_j`` (the last term: ``M_j`` is taken on the float64 running sums of the
  inputs, each within ``n 2**-53 S_j`` of the exact ``P_i``).

**The bound.** Every such correct result has ``|r_j| <= b_j`` with

    b_j = (2 L + 1) h_w(m_S) + [u_o > u_w] (h_o(|a_j|) + h_o(|a_(j-1)|)) + (2 L + 5) eta + slack,

the stores to a result format narrower than the working one (a float32 scan of bfloat16 values: ``|s - RN(s)|
<= h_o(|RN(s)|)`` by the binade argument), ``eta`` half the smallest subnormal (a rounding's error where it
underflows), and the float64 evaluation: ``r_j = (a_j - a_(j-1)) - x_j`` errs by at most ``2**-52 (|a_j| +
|a_(j-1)| + |x_j|)``, the bound's sum of positive terms is widened by EVAL_SLACK and so is ``m_S`` before its
binade is taken. ``b_0`` is the first output's store, ``h_o(|a_0|)``.

**The test.** ``T = max_j |r_j| / b_j`` per row: a row with ``T > 1`` is beyond every one of these orders for sure
(deterministic: no level, no share of the false-alarm budget). Measured (emulations in float32,
``tests/test_scan_bound.py``; 4 randn, offset and lognormal rows of 1,000, 4,099 and 10^5 values): ``T`` at most
0.024 (sequential), 0.060 (blocked, 64), 0.091 (Blelloch, chunks of 32), 0.099 (odd-even), 0.071 and 0.146
(Sklansky, tiles of 32 and 1024). Hillis and Steele's (Kogge and Stone's) scan is outside the derivation:
``y_j``'s and ``y_(j-1)``'s trees share no rounding, about ``2 B`` of them over blocks of ``B``, nearly all of small
segment sums; measured on the same rows it reaches 0.24 (blocks of 32) and 0.36 (blocks of 1024), and on a walk
kept near [-1, 2] (signs chosen against the running sum, so that every segment sum is near ``M_j``: its
adversary; the derived orders 0.095 there) 0.21 and 0.60: below 1, measured, not derived (a textbook scan over
blocks of 1024 on data built against it may pass 1). ``bench_verdict``'s lost carry (4 rows of 1,000 randn
float32 values, one row's tail offset by 8 spreads of correct kernels) has ``T = 1.46``.

**Power.** One element off by ``d`` moves ``r_j`` by ``d`` and ``r_(j+1)`` by ``-d``: flagged for sure once ``d >
2 min(b_j, b_(j+1))`` (a correct ``r`` at ``-b`` at worst): the size the report gives (:meth:`ScanIncrements.
detectable_ulps`). A lost carry is one such jump, of a whole partial sum.

**Reduced precisions** (:func:`refkern.analysis.row_bound.candidate`): the inputs rounded to ``p`` and scanned
in float32 (``x_j`` moves by ``h_p(|x_j|)``, the prefixes by ``u_p S_j``), or the float32 result stored in ``p``
(two stores more). A running sum held in the half result format (:mod:`refkern.analysis.noise_scan`'s
``half_scan``) is not tested here.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.formats import Format
from refkern.analysis.noise_rows import frozen
from refkern.analysis.row_bound import EVAL_SLACK, _h, candidate, groups, half_subnormal

__all__ = ["ScanIncrements", "levels"]


def levels(n: int) -> int:
    """``L = ceil(log2 n)``: the levels of a work-efficient tree over ``n`` values (0 for ``n <= 1``)."""
    return max(int(n) - 1, 0).bit_length()


@jit(inline="always")
def _binade(m, u, h, top):
    """``(h(m), top)``: the half-ulp of ``m``'s binade in unit ``u`` and the binade's upper end ``2 h / u``, kept
    from the last call while ``m < top`` (the magnitudes of a row only grow: one frexp per binade, not per
    element); ``m`` 0 gives 0 and is asked again."""
    if m < top:
        return h, top
    h = _h(m, u)
    return h, 2.0 * h / u


@jit(parallel=True, error_model="numpy")
def _scan_inc(X, A, uw, uo, up_in, up_out, eta, L, cS, what, prec, emin, T, W):
    """Per row ``T = max_j |r_j| / b_j`` over the finite increments, in one pass (the prefix sums ``P``, ``S`` and
    ``M`` formed as it goes), and with ``what`` 1 ``b_j`` written to ``W`` (inf where no bound applies: ``a_j``,
    ``a_(j-1)`` or ``x_j`` not finite, or the magnitudes before it), with ``what`` 2 ``2 min(b_j, b_(j+1))`` in ulps
    of ``A`` in the format (``prec``, ``emin``) (NaN where not finite); ``what`` 0 writes nothing."""
    R, n = X.shape
    keep = 1.0 / ((1.0 - uo) * (1.0 - up_out))  # a stored value's working magnitude over the stored one's
    half = uo > uw  # a store to a format narrower than the working one: a rounding of its own
    for i in prange(R):
        p, s, M, t = 0.0, 0.0, 0.0, 0.0
        hS, topS = 0.0, 0.0
        ho1, b1 = 0.0, np.inf
        for j in range(n):
            x, a = X[i, j], A[i, j]
            p += x
            s += abs(x)
            M = max(M, abs(p), abs(a))
            a1 = A[i, j - 1] if j >= 1 else 0.0
            ho = (_h(abs(a), uo) if half else 0.0) + _h(abs(a), up_out)
            b = np.inf
            if abs(a) < np.inf and abs(a1) < np.inf and abs(x) < np.inf and M < np.inf and s < np.inf:
                if j == 0:  # the first value is stored, not summed
                    b = (ho + _h(abs(x), up_in) + 3.0 * eta) * (1.0 + EVAL_SLACK) + 2.0**-52 * (abs(a) + abs(x))
                else:
                    hS, topS = _binade((2.0 * M * (1.0 + uw) * keep + cS * s) * (1.0 + EVAL_SLACK), uw, hS, topS)
                    b = (2.0 * L + 1.0) * hS + ho + ho1 + _h(abs(x), up_in) + (2.0 * L + 5.0) * eta
                    b = b * (1.0 + EVAL_SLACK) + 2.0**-52 * (abs(a) + abs(a1) + abs(x))
                r = abs((a - a1) - x)
                if r > t * b:
                    t = r / b
            if what == 1:
                W[i, j] = b
            elif what == 2 and j >= 1:
                W[i, j - 1] = 2.0 * min(b1, b) / _ulp(A[i, j - 1], prec, emin)
            ho1, b1 = ho, b
        if what == 2 and n:
            W[i, n - 1] = 2.0 * b1 / _ulp(A[i, n - 1], prec, emin)
        T[i] = t


@jit(inline="always")
def _ulp(y, prec, emin):
    """The ulp of the format (``prec``, ``emin``) at ``y`` (NaN where ``y`` is not finite)."""
    if not abs(y) < np.inf:
        return np.nan
    e = math.frexp(abs(y))[1] - 1 if y != 0.0 else emin
    return math.ldexp(1.0, int(max(e, emin) - prec + 1))


class ScanIncrements:
    """The test of the module docstring for a cumsum of the rows ``X`` (R, n) (the values times ``k``, a power of
    two, as :mod:`refkern.analysis.noise` scales tiny float64 ones) whose result format is ``out`` and working unit
    ``u_w``; ``rows``/``back`` take the output's layout to the rows and back. The protocol of the certain row tests
    (:attr:`refkern.analysis.noise.Noise.free`): ``failures(actual, key)``, ``detectable_ulps(ref)``."""

    def __init__(self, X, rows, back, out: Format, u_w: float, k: float = 1.0):
        self.X = frozen(X, np.float64)
        self.rows, self.back, self.out, self.u_w, self.k = rows, back, out, float(u_w), float(k)
        self.L = float(levels(self.X.shape[1]))
        self.eta = half_subnormal(u_w, out) * self.k  # a rounding's underflow, in the scaled values' units

    def _params(self, key):
        cand = candidate(key, self.out, self.u_w)
        if cand is None:
            return None
        uw, up_in, up_out = cand
        # m_S's S_j: a tree node's first-order error, the rounded inputs' prefixes (2 u_p S_j: M_j is taken on the
        # given ones) and the float64 prefix sums' own (2 n 2**-53 S_j: M_j is taken on them)
        cS = (self.L + 1.0) * uw + 2.0 * up_in + 2.0 * self.X.shape[1] * 2.0**-53
        return uw, self.out.u, up_in, up_out, self.eta, self.L, cS

    def _run(self, actual, key, what):
        """(T, W) of :func:`_scan_inc` for the output ``actual`` (the output's layout); None for a key not modelled."""
        p = self._params(key)
        if p is None:
            return None
        A = frozen(self.rows(np.asarray(actual, np.float64) * self.k), np.float64)
        T = np.zeros(self.X.shape[0])
        W = np.empty(self.X.shape if what else (0, 0))
        if self.X.size:
            emin = float(self.out.emin + math.frexp(self.k)[1] - 1)  # the scaled values' ulps: the format's times k
            _scan_inc(self.X, A, *p, what, float(self.out.prec), emin, T, W)
        return T, W, A

    def t(self, actual, key=None, bounds=False):
        """``T`` per row for the output ``actual`` (the output's layout), and ``b`` (R, n) with ``bounds``; None for
        a key this test does not model."""
        got = self._run(actual, key, 1 if bounds else 0)
        if got is None:
            return None
        return got[:2] if bounds else got[0]

    def failures(self, actual, key=None) -> list:
        """The failing rows as groups of :mod:`refkern.analysis.inside` (``ax`` None, ``axis`` ROW_OWN, ``z`` = T,
        ``mean`` the row's largest jump beyond the input, in the output's units; the first holding ``mask``: the
        elements whose increment from their predecessor is beyond ``b``), most significant first; [] where every
        row fits (one pass)."""
        T = self.t(actual, key)
        if T is None:
            return []
        bad = np.flatnonzero(T > 1.0)
        if not bad.size:
            return []
        T, B, A = self._run(actual, key, 1)
        with np.errstate(invalid="ignore"):
            r = np.zeros(self.X.shape)
            r[:, 0] = A[:, 0] - self.X[:, 0]
            r[:, 1:] = A[:, 1:] - A[:, :-1] - self.X[:, 1:]
            off = np.zeros(self.X.shape, bool)
            off[bad] = np.abs(r[bad]) > B[bad]
        jump = [float(r[i, np.argmax(np.where(off[i], np.abs(r[i]), -1.0))]) / self.k for i in bad]
        mask = np.asarray(self.back(off), bool)
        order = np.argsort(-T[bad])
        out = groups(bad[order], T[bad][order], np.asarray(jump)[order], mask)
        for g in out:
            g["increments"] = True  # for the note: a jump between neighbours, not a row's shared error
        return out

    def detectable_ulps(self, ref) -> tuple:
        """(median, largest) over the finite elements of ``2 min(b_j, b_(j+1))`` (the last: ``2 b_j``) in ulps of the
        result at ``ref``: one element off by more is flagged for sure (module docstring); (inf, inf) where none is
        finite."""
        _, D, _ = self._run(ref, None, 2)
        ulps = D[np.isfinite(D)]
        if not ulps.size:
            return np.inf, np.inf
        return float(np.median(ulps)), float(np.max(ulps))
