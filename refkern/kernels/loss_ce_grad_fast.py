"""The fast path of cross_entropy's input gradient (:mod:`refkern.kernels.loss_ce_grad`): every element of a row,
``s (p_j A - B_j)``, evaluated in float64 with a rigorous bound and rounded to a format of at most 24 bits
(float32, bfloat16, float16) where the bound holds no rounding boundary; the elements it leaves (``und``) take the
exact path. One pass per row (rows in parallel), about 10 ns an element.

Bound (u = 2**-53, EPS = 2**-100 per double-word addition, :mod:`refkern.accumulate.dd`), per row with
``M = max_k x_k`` (the finite logits; a row holding NaN or +inf never comes here):

1. ``E_k = e**(x_k - M)``: ``x_k - M = dh + dl`` exactly (two_sum); ``e**dh = v 2**m (1 + t)``, ``|t| <= 2u``
   (:func:`~refkern.kernels._transcendental.exp_fast`, ``X_MIN <= dh <= 0``), ``e**dl`` within ``1.01 |dl|`` of 1
   (``|dl| <= 2000 u``), ``Ê = ldexp(v, m)`` rounds only where subnormal (2**-1074 absolute). Below ``X_MIN``,
   ``Ê = 0`` (``e**-2000 < 2**-2885``); at -inf, 0 exactly. So ``|Ê_k - E_k| <= rho E_k + 2**-1074``,
   ``rho = (2u + 1.01 max|dl|) 1.02``.
2. ``S = sum E_k >= 1`` (the maximum's term is 1), summed in double-word (``C`` additions of nonnegative terms,
   each within EPS of its partial sum: ``C EPS sum Ê``), then rounded (u): ``|Ŝ - S| <= sigma S``,
   ``sigma = (rho + u + C EPS) 1.02 + C 2**-1072``.
3. ``P = fl(Ê_j / Ŝ)``: ``|P - p_j| <= pi P + 2**-1072``, ``pi = (rho + sigma + u) 1.02`` (the quotient's rounding
   u, 2**-1075 where subnormal; first-order terms charged with the factor 1.02, every rate here below 2**-30).
4. ``t = fl(fl(P Â) - B̂_j)``: ``|t - (p A - B)| <= (|Â| + e_A) e_P + P e_A + e_B + u |P Â| + u |t| + 2**-1074``
   (Â, B̂ and their bounds e_A, e_B: class indices, ``B̂_t`` the correctly rounded rational (``1.01 u |B̂|``), the
   others ``fl(fl(eps / C) w_j)`` (``2.03 u |B̂|``), ``Â`` the rational ``eps / C fsum(w) + (1 - eps) w_t`` correctly
   rounded (``1.01 u |Â|``, plus ``1.03 u (eps / C) |fsum(w)|`` for fsum's own rounding); probability
   targets, ``B̂ = fl(fl(fl(c1 y) + c0) w)`` with ``c1 = fl(1 - eps)``, ``c0 = fl(eps / C)``: five roundings,
   ``e_B = 5.2 u (|c1 y| + c0) |w| + 2**-1072``; ``Â`` their double-word sum, ``e_A = sum e_B + 1.01 C EPS sum|B̂| +
   u |Â|``).
5. ``y = fl(ŝ t)``, ``ŝ = fl(g / fl(D))`` within ``2.01 u |s|`` (normal: the caller sends other rows to the exact
   path): ``|y - s T| <= (2.03 u |ŝ| (|t| + e_t) + |ŝ| e_t + u |y| + 2**-1074) 1.01``.

The decision (:func:`_decide_signed`) is bracket_around's: the ends of ``[y - e, y + e]`` enclosed and rounded,
equal with the same sign; where the sign of the real value is known (a class-index row's ``B_j = 0`` at a finite
logit: ``s p_j A`` with ``p_j > 0``) the interval is clipped at zero on the other side, which decides the underflows
to a signed zero. Magnitudes are kept inside float64's normal range by the caller's guards and by the row test
here (``2**-1000 <= |B̂|, |Â| <= 2**1000`` where nonzero, else the whole row is left to the exact path)."""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_add_fp
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import round_to
from refkern.kernels._transcendental import X_MIN, U, exp_fast, ldexp

__all__ = ["ce_rows_fast"]

_LO, _HI = 2.0**-1000, 2.0**1000  #: the magnitudes the bound's absolute terms (2**-1072) are negligible beside


@jit(inline="always")
def _rnd(v, prec, emin, emax):
    if prec == 24 and emin == -126 and emax == 127:
        return np.float64(np.float32(v))  # IEEE 754's conversion: round_to's value, a few ns
    return round_to(v, prec, emin, emax)


@jit(inline="always")
def _decide_signed(y, e, sgn, prec, emin, emax):
    """(RN(r), True) when every real r within e of y (of sign ``sgn`` where it is +-1) rounds alike, else (nan,
    False); the enclosure of :func:`~refkern.kernels._transcendental.bracket_around`."""
    f = (e + 2.0 * U * abs(y)) * (1.0 + 2.0 * U) + 2.0**-1073
    lo = y - f
    hi = y + f
    if sgn > 0 and lo < 0.0:
        lo = 0.0  # the real value is positive: round(+0) = +0 is its lower end
    if sgn < 0 and hi > 0.0:
        hi = -0.0
    a = _rnd(lo, prec, emin, emax)
    b = _rnd(hi, prec, emin, emax)
    if a == b and np.signbit(a) == np.signbit(b):
        return a, True
    return np.nan, False


@jit(parallel=True)
def ce_rows_fast(X, ok, tgt, Bt, b0, Y, w, c1, c0, s, A_cls, eA_cls, prec, emin, emax, out, und):
    """Rows r with ``ok[r]`` of the gradient into ``out`` (float64 values rounded to (prec, emin, emax)), ``und``
    set where undecided (module docstring). Class indices: ``tgt[r] >= 0``, ``B̂_rj = Bt[r]`` at ``j = tgt[r]``,
    ``b0[j]`` elsewhere, ``Â = A_cls[r]`` within ``eA_cls[r]``; probability targets (``tgt[r] < 0``): ``B̂_rj``
    from ``Y[r, j]``, ``w``, ``c1``, ``c0``. ``s`` the rows' ``fl(g / fl(D))``."""
    R, C = X.shape
    for r in prange(R):
        if not ok[r]:
            continue
        x = X[r]
        o = out[r]
        cls = tgt[r] >= 0
        M = -np.inf
        bad = False
        for k in range(C):
            bad = bad or x[k] != x[k] or x[k] == np.inf  # NaN or +inf: torch's IEEE row, the caller's
            if x[k] > M:
                M = x[k]
        if bad or M == -np.inf:  # (every logit -inf likewise)
            for k in range(C):
                und[r, k] = True
            continue
        sh, sl, dlmax = 0.0, 0.0, 0.0
        ah, al, eB_sum, babs = 0.0, 0.0, 0.0, 0.0
        for k in range(C):
            xk = x[k]
            E = 0.0
            if xk > -np.inf:
                dh, dl = two_sum(xk, -M)
                if dh >= X_MIN:
                    v, m = exp_fast(dh)
                    E = ldexp(v, m)
                    dlmax = max(dlmax, abs(dl))
            o[k] = E  # scratch: the row's exponentials
            sh, sl = dd_add_fp(sh, sl, E)
            if not cls:
                yk = Y[r, k]
                a1 = c1 * yk
                b = (a1 + c0) * w[k]
                mag = (abs(a1) + c0) * abs(w[k])
                bad = bad or not (abs(yk) < np.inf) or (b != 0.0 and not (_LO <= abs(b) <= _HI)) or mag > _HI
                ah, al = dd_add_fp(ah, al, b)
                eB_sum += 5.2 * U * mag + 2.0**-1072
                babs += abs(b)
        S = sh + sl
        if cls:
            A = A_cls[r]
            eA = eA_cls[r]
        else:
            A = ah + al
            eA = (eB_sum + 1.01 * C * EPS * babs + U * abs(A)) * 1.01
            bad = bad or (A != 0.0 and not (_LO <= abs(A) <= _HI)) or not (eA < _HI)
        if bad:
            for k in range(C):
                und[r, k] = True
            continue
        rho = (2.0 * U + 1.01 * dlmax) * 1.02
        sigma = (rho + U + C * EPS) * 1.02 + C * 2.0**-1072
        pi = (rho + sigma + U) * 1.02
        sr = s[r]
        t_idx = tgt[r]
        for j in range(C):
            if cls:
                B = b0[j]
                eB = 2.03 * U * abs(B)
                if j == t_idx:
                    B = Bt[r]
                    eB = 1.01 * U * abs(B)
            else:
                a1 = c1 * Y[r, j]
                B = (a1 + c0) * w[j]
                eB = 5.2 * U * (abs(a1) + c0) * abs(w[j]) + 2.0**-1072
            finite = x[j] > -np.inf
            P = o[j] / S
            eP = pi * P + 2.0**-1072
            q = P * A
            t = q - B
            et = ((abs(A) + eA) * eP + P * eA + eB + U * abs(q) + U * abs(t) + 2.0**-1074) * 1.01
            y = sr * t
            e = (2.03 * U * abs(sr) * (abs(t) + et) + abs(sr) * et + U * abs(y) + 2.0**-1074) * 1.01
            sgn = 0.0
            if cls and B == 0.0 and finite and A != 0.0:
                sgn = sr * A  # s p_j A, p_j > 0: the real value's sign
            v, dec = _decide_signed(y, e, sgn, prec, emin, emax)
            if cls and B == 0.0 and not finite:
                dec = False  # an exact zero (p_j = 0): signed by torch's formula, the caller's
            o[j] = v
            und[r, j] = not dec
