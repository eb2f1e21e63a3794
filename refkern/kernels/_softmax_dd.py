"""The double-word pass of the softmax / log_softmax backward (:mod:`refkern.kernels.softmax_backward`).

Per row, the sums ``S = sum_j e**d_j``, ``D' = sum_j g_j e**d_j`` (softmax) and ``G = sum_j g_j``
(log_softmax) are evaluated once in double-word arithmetic with rigorous error bounds; every
element the caller marks is then decided from them with :func:`~refkern.kernels._transcendental.decide_scaled`,
or left marked for the exact path. Along the row (``d_j = x_j - M``, ``M`` the largest finite logit,
``P_j = e**d_j``):

    softmax:      dx_i = P_i (g_i S - D') / S**2
    log_softmax:  dx_i = g_i - G P_i / S

Units and ranges. ``EPS = 2**-100`` is charged per double-word operation, relative to the exact
result of that operation on its (double-word) operands (Joldes, Muller, Popescu 2017; the worst is
9.8 u**2 < EPS, :mod:`refkern.accumulate.dd`); those bounds hold for operands and results in
``[2**-900, 2**900]``, and every operand of a product or quotient below is kept there. A double-word
addition is within its bound under underflow too (an addition whose result is subnormal is exact),
and an absolute ``2**-1070`` per addition is charged anyway. ``g`` is scaled by ``2**-eg`` (``eg``
the exponent of ``max |g_j|``, so ``max |g'_j|`` lies in [1/2, 1)); ``g'_j`` is exact for every
``|g'_j| >= 2**-600`` (a power-of-two scaling that stays normal); smaller ``g'_j`` ("tiny") are left
out of the sums and charged ``2**-600`` each (``|g'_j P_j| <= |g'_j| < 2**-600``, as P_j <= 1).

Exponentials. ``d_j = dh + dl`` exactly (two-sum). ``d_j = 0``: ``P_j = 1`` (``c0`` of them, c0 >= 1).
``d_j < -2000`` (or ``x_j - M`` below -2**1024): ``P_j < 2**-2885``, left out, charged ``2**-1074``.
Else :func:`~refkern.kernels._transcendental.exp_dd`: ``P_j = (vh + vl) 2**m`` within relative
``EXP_DD_REL = 2 EPS``, ``vh`` in [0.99, 2), so ``P_j < 2**(m + 1)``.

Sums, each with its bound (A: the float64 sum of the magnitudes of the terms summed; a float64 sum
of at most 2**20 nonnegative terms is within 2**-32 of the exact one, so the factor 1.02 below also
covers that, the low words, and the evaluation of the bound itself):

* ``T = sum_{m_j >= -880} (vh 2**m + vl 2**m)`` by ``dd_add``: the ``cnt`` additions err by at most
  ``EPS`` of partial sums ``<= A_T`` each, the exponentials by ``EXP_DD_REL`` of theirs, and
  ``vl 2**m`` may lose ``2**-1075`` to underflow; a term with ``m_j < -880`` is below ``2**-879``,
  charged so. ``eT = (EXP_DD_REL + cnt EPS) A_T 1.02 + charges``. ``S = T + c0`` (``dd_add_fp``):
  ``eS = eT + EPS S 1.02``.
* ``D' = sum g'_j P_j``: ``g'_j`` itself (exact) where ``d_j = 0``; ``dd_mul_fp((vh, vl), g'_j)``
  then scaled by ``2**m`` (the product in [2**-602, 2), within EPS; its scaled low word may lose
  ``2**-1075``) where ``m_j + e_j >= -870`` (``|g'_j| < 2**e_j``); a smaller term (below
  ``2**-868``), a tiny ``g'_j`` and a term with ``d_j < -2000`` are charged ``2**-599`` each.
  ``eD = (EXP_DD_REL + EPS) A_E 1.02 + cnt EPS A_D 1.02 + charges`` (A_E over the exponential terms).
* ``G' = sum g'_j`` over every entry (``-inf`` logits too): ``eG = cnt EPS A_G 1.02 + charges``.

softmax element i (``d_i >= -2000``). ``N = g'_i S - D'``: ``N^ = dd_add(dd_mul_fp(S^, g'_i), -D'^)``
errs by at most ``eN = (|g'_i| (eS + EPS S^) + eD + EPS |N^|) 1.01`` (the product within EPS of
``g'_i S^``, the addition within EPS of its result); a tiny ``g'_i`` is left out, charged
``2**-600 (S^ + eS)``. Then ``v = P_i^ (N^ (1 / S^**2))``: the square, its reciprocal (both once per
row) and two products, 4 EPS; with ``rho = eN / |N^| + 2 eS / S^ + EXP_DD_REL + 4 EPS`` (no
EXP_DD_REL where ``d_i = 0``), ``|dx_i 2**-(m + eg) - v| <= 1.02 rho |v|`` whenever ``rho <= 2**-20``
(the second-order terms ``(1 + a)(1 + b) / (1 - c)**2 - 1 - (a + b + 2c)`` stay below 2**-19 of the
first-order ones). Needs ``|N^| >= 2**-800`` and ``rho <= 2**-20``; otherwise the element stays
undecided. ``d_i < -2000``: ``|dx_i| < 2**-2885 2 (n + 1) 2**1025 < 2**-1800``, below half of every
format's smallest subnormal: ``+0`` or ``-0`` by the sign of N, decided when ``|N^| > 1.01 eN``.

log_softmax element i: ``t = G' P_i / S``. When ``|G'^| >= 2**-800`` and ``eG <= 2**-20 |G'^|``:
``t^ = dd_mul(P_i^, dd_div(G'^, S^))`` (the quotient once per row) within ``1.02 rho |t^|``, ``rho =
eG / |G'^| + eS / S^ + EXP_DD_REL + 3 EPS`` (two operations, charged three); with ``g_i = 0`` the
result is ``-t^ 2**(m + eg)``; else, where ``m >= -850``, ``y = dd_add_fp(-t^ 2**m, g'_i)`` (the
scaled low word may lose 2**-1075; the addition EPS of |y|) and ``dx_i 2**-eg = y`` within ``1.02
rho |t^ 2**m| + EPS |y| 1.01 + 2**-1070 + 2**-1074``; where ``m < -850``, ``|t 2**m| < 2**-849 |t^|
1.01`` bounds the whole second term (``g'_i`` is at least 2**-600). When G' is known only to an
absolute bound (``G ~ 0``), ``|t| <= (|G'^| + eG) P_i^ 1.0002 / S^ 1.01``, and an element with ``g_i
!= 0`` is decided from ``g'_i`` within that bound (``g_i = 0`` stays undecided: its sign is that of
G). ``d_i < -2000``: ``|G y_i| < 2**-1800``: the result is g_i itself when ``g_i != 0`` (a value of
the format, moved by less than a quarter of its ulp), else ``-0`` when G > 0 and ``+0`` when G < 0
(decided when ``|G'^| > 1.01 eG``). A tiny ``g'_i`` (``|g_i| < 2**-600 max|g|``) stays undecided.

Exact values. A result whose real value is rational (equal logits, a zero softmax numerator,
``G = 0``) may be an exact zero or a midpoint: the interval around it never decides a zero's sign
(:func:`decide_scaled` decides only ``|qh| >= 4 e``, so the value's sign is known) nor a midpoint, so
those are left to the exact path, except two whole-row cases decided here exactly as the exact
path decides them: a softmax row whose ``g`` is equal over its finite logits (``dx = +0``), and a
log_softmax row whose ``g`` is all zero (``dx = g_i``; ``+0`` for finite logits when they are all
equal, where the exact path rounds the rational ``g_i - G/c = 0``).

``slack`` multiplies every bound (1.0; the tests shrink it to show that their rows reach the bounds).
Measured there: a float64 row with cancellation (``x = [0, -2**-53, -2**-52]``, ``g = [1, 1, 1 + 2**-52]``)
is first decided wrongly at ``slack = 2**-11`` (softmax) and ``2**-10`` (log_softmax): the bounds, sums
of worst cases (``n EPS`` per sum of n terms), are about 2**10 times the errors met, so halving one
breaks nothing that could be tested.
"""

import math

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add, dd_add_fp, dd_div, dd_mul, dd_mul_fp
from refkern.accumulate.eft import two_sum
from refkern.kernels._transcendental import EXP_DD_REL, X_MIN, decide_scaled, exp_dd

__all__ = ["dd_rows"]

_TINY_G = -600  # |g'_j| < 2**-600: left out of the sums, charged
_FLUSH_T = -880  # P_j < 2**(m + 1) with m < -880: left out of S, charged 2**-879
_FLUSH_D = -870  # |g'_j P_j| < 2**(m + e + 1) with m + e < -870: left out of D', charged
_SAFE = 2.0**-800  # smallest |N^| and |G'^| multiplied or divided further
_RHO_MAX = 2.0**-20  # first-order relative bounds are used up to this


@jit(parallel=True)
def dd_rows(X, G, rows, log, prec, emin, emax, slack, out, und):
    """For each row r in ``rows``: every element with und[r, i] set is decided into out[r, i] (und
    cleared) or left set for the exact path. X, G float64 (R, n) (logits, grad_output); a row whose
    forward is NaN or whose g is not finite becomes NaN throughout. Bounds in the module docstring."""
    for ii in prange(rows.size):
        r = rows[ii]
        _row(X[r], G[r], log, prec, emin, emax, slack, out[r], und[r])


@jit(inline="always")
def row_max(x, g):
    """(M, bad, gmax) of a row of logits x and its grad_output g: the largest logit (-inf for none), whether the
    forward is NaN there (a NaN or +inf logit) or g is not finite, and ``max |g|``. Shared by this pass and the
    float64 pass (:func:`refkern.kernels.softmax_backward._fast_rows`)."""
    M = -np.inf
    bad = False
    gmax = 0.0
    for j in range(x.size):
        v = x[j]
        if v != v or v == np.inf or not abs(g[j]) < np.inf:
            bad = True
        elif v > M:
            M = v
        gmax = max(gmax, abs(g[j]))
    return M, bad, gmax


@jit
def _row(x, g, log, prec, emin, emax, slack, out, und):
    """One row of :func:`dd_rows` (out and und: that row's views)."""
    n = x.size
    M, bad, gmax = row_max(x, g)
    if bad or M == -np.inf:  # the forward is NaN, or g is not finite: NaN throughout
        for j in range(n):
            out[j] = np.nan
            und[j] = False
        return
    # whole-row exact cases (module docstring), decided as the exact path decides them
    same = True  # g equal over the finite logits
    one = True  # the finite logits all equal (one group: y = 1/c)
    g0 = np.nan
    for j in range(n):
        if x[j] != -np.inf:
            if g0 != g0:
                g0 = g[j]
            elif g[j] != g0:
                same = False
            if x[j] != M:
                one = False
    if not log and same:
        for j in range(n):
            if und[j]:
                out[j] = 0.0  # y_i (g_i - D) with D = g_i exactly: +0
                und[j] = False
        return
    if log and gmax == 0.0:
        for j in range(n):
            if und[j]:
                out[j] = 0.0 if (one and x[j] != -np.inf) else g[j]  # G = 0: dx = g_i
                und[j] = False
        return
    eg = math.frexp(gmax)[1]  # max |g'| in [1/2, 1)
    vh = np.zeros(n)
    vl = np.zeros(n)
    mm = np.zeros(n, np.int64)
    kind = np.zeros(n, np.int8)  # 0: -inf logit, 1: d == 0, 2: exp_dd term, 3: d < -2000
    c0 = 0.0
    th, tl, at, ct, cht = 0.0, 0.0, 0.0, 0, 0.0  # T, A_T, count, charges
    dh_, dl_, ad, ae, cd, chd = 0.0, 0.0, 0.0, 0.0, 0, 0.0  # D', A_D, A_E, count, charges
    gh, gl, ag, cg, chg = 0.0, 0.0, 0.0, 0, 0.0  # G', A_G, count, charges
    for j in range(n):
        gj = g[j]
        ej = math.frexp(gj)[1] - eg  # |g'_j| < 2**ej
        gs = math.ldexp(gj, -eg)  # exact where ej >= -600
        if log and gj != 0.0:
            if ej < _TINY_G:
                chg += 2.0**-600
            else:
                gh, gl = dd_add_fp(gh, gl, gs)
                ag += abs(gs)
                cg += 1
        v = x[j]
        if v == -np.inf:
            continue
        d, de = two_sum(v, -M)
        if d == 0.0:  # x == M: e**0 = 1 exactly
            kind[j] = 1
            c0 += 1.0
            if not log and gj != 0.0:
                if ej < _TINY_G:
                    chd += 2.0**-599
                else:
                    dh_, dl_ = dd_add_fp(dh_, dl_, gs)
                    ad += abs(gs)
                    cd += 1
            continue
        if not d >= X_MIN:  # e**d < 2**-2885 (x - M overflowing to -inf too)
            kind[j] = 3
            cht += 2.0**-1074
            if not log and gj != 0.0:
                chd += 2.0**-599
            continue
        a, b, k = exp_dd(d, de)
        kind[j] = 2
        vh[j], vl[j], mm[j] = a, b, k
        if k >= _FLUSH_T:
            ph = math.ldexp(a, k)
            th, tl = dd_add(th, tl, ph, math.ldexp(b, k))  # the low word may lose 2**-1075
            at += ph
            ct += 1
            cht += 2.0**-1074
        else:
            cht += 2.0**-879
        if not log and gj != 0.0:
            if ej >= _TINY_G and k + ej >= _FLUSH_D:
                ph, pl = dd_mul_fp(a, b, gs)  # in [2**-602, 2): within EPS
                ph, pl = math.ldexp(ph, k), math.ldexp(pl, k)  # the low word may lose 2**-1075
                dh_, dl_ = dd_add(dh_, dl_, ph, pl)
                ad += abs(ph)
                ae += abs(ph)
                cd += 1
                chd += 2.0**-1074
            else:
                chd += 2.0**-599
    eps = EPS * slack  # every bound below is scaled by slack (1.0 but in the tests)
    eT = ((EXP_DD_REL + ct * EPS) * at * 1.02 + cht + ct * 2.0**-1070) * slack
    sh, sl = dd_add_fp(th, tl, c0)  # S >= 1
    eS = eT + eps * sh * 1.02
    rs = eS / sh * (1.0 + 2.0**-50)  # relative bound of S^
    if not log:
        eD = ((EXP_DD_REL + EPS) * ae * 1.02 + cd * EPS * ad * 1.02 + chd + cd * 2.0**-1070) * slack
        s2h, s2l = dd_mul(sh, sl, sh, sl)
        ish, isl = dd_div(1.0, 0.0, s2h, s2l)  # 1 / S^**2: two operations, once per row
    else:
        eG = (cg * EPS * ag * 1.02 + chg + cg * 2.0**-1070) * slack
        ag_ok = abs(gh) >= _SAFE and eG <= _RHO_MAX * abs(gh)
        gsh, gsl = dd_div(gh, gl, sh, sl)  # G' / S^: one operation, once per row
    for i in range(n):
        if not und[i]:
            continue
        kd = kind[i]
        gi = g[i]
        if kd == 0:  # y_i = 0 exactly: softmax 0, log_softmax g_i (a value of the format)
            out[i] = gi if log else 0.0
            und[i] = False
            continue
        ei = math.frexp(gi)[1] - eg
        gs = math.ldexp(gi, -eg)
        if kd == 2:
            ph, pl, k = vh[i], vl[i], mm[i]
        else:
            ph, pl, k = 1.0, 0.0, 0
        # each case below sets (qh, ql, e, kq): decide (qh + ql + t) 2**kq, |t| <= e; or leaves it undecided
        qh, ql, e, kq = 0.0, 0.0, np.inf, 0
        if not log:
            if gi == 0.0:
                nh, nl = -dh_, -dl_
                eN = eD
            elif ei < _TINY_G:
                nh, nl = -dh_, -dl_
                eN = eD + 2.0**-600 * (sh * 1.01 + eS) * slack
            else:
                ah, al = dd_mul_fp(sh, sl, gs)
                nh, nl = dd_add(ah, al, -dh_, -dl_)
                eN = (abs(gs) * (eS + eps * sh * 1.01) + eD + eps * abs(nh) * 1.01 + 2.0**-1070 * slack) * 1.01
            if kd == 3:  # |dx_i| < 2**-1800: a zero with the sign of N
                if abs(nh) > eN * 1.01:
                    out[i] = 0.0 if nh > 0.0 else -0.0
                    und[i] = False
                continue
            if not abs(nh) >= _SAFE:
                continue
            rho = eN / abs(nh) * (1.0 + 2.0**-50) + 2.0 * rs + 4.0 * eps
            if kd == 2:
                rho += EXP_DD_REL * slack
            if not rho <= _RHO_MAX:
                continue
            qh, ql = dd_mul(nh, nl, ish, isl)
            qh, ql = dd_mul(qh, ql, ph, pl)
            e = abs(qh) * rho * 1.02
            kq = k + eg
        else:
            if kd == 3:  # |G y_i| < 2**-1800
                if gi != 0.0:
                    out[i] = gi
                    und[i] = False
                elif abs(gh) > eG * 1.01:
                    out[i] = -0.0 if gh > 0.0 else 0.0
                    und[i] = False
                continue
            if gi != 0.0 and ei < _TINY_G:
                continue
            if ag_ok:
                rho = eG / abs(gh) * (1.0 + 2.0**-50) + rs + 3.0 * eps
                if kd == 2:
                    rho += EXP_DD_REL * slack
                if not rho <= _RHO_MAX:
                    continue
                th, tl = dd_mul(ph, pl, gsh, gsl)
                et = abs(th) * rho * 1.02  # |t - t^| in units of 2**k
                if gi == 0.0:
                    qh, ql, e, kq = -th, -tl, et, k + eg
                elif k >= -850:
                    q2h, q2l = math.ldexp(th, k), math.ldexp(tl, k)  # the low word may lose 2**-1075
                    qh, ql = dd_add_fp(-q2h, -q2l, gs)
                    e = (math.ldexp(et, k) + eps * abs(qh) * 1.01 + 2.0**-1069 * slack) * 1.01  # ldexp: 2**-1075 more
                    kq = eg
                else:
                    qh, ql, e, kq = gs, 0.0, abs(th) * 1.01 * 2.0**-850 * slack, eg  # e bounds |t 2**k| itself
            else:
                if gi == 0.0:
                    continue  # the sign of -G y_i is unknown
                B = (abs(gh) * 1.0001 + eG) * ph * 1.0002 / sh * 1.01  # |t| in units of 2**k
                e = (math.ldexp(B, k) + 2.0**-1074) * slack  # ldexp may round a subnormal down by 2**-1075
                qh, ql, kq = gs, 0.0, eg
        val, ok = decide_scaled(qh, ql, e, kq, prec, emin, emax)
        if ok:
            out[i] = val
            und[i] = False
