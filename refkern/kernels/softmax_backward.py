"""The backward of softmax and log_softmax, correctly rounded: the real-valued derivative of the
definition at the given inputs, rounded once to the input's dtype.

Along ``dim``, with ``y = softmax(x)`` the exact (real) softmax and ``g`` the gradient arriving:

    softmax:      dx_i = y_i (g_i - D),   D = sum_j g_j y_j
    log_softmax:  dx_i = g_i - y_i G,     G = sum_j g_j

Specials, by the definition where it has a value and as IEEE arithmetic would otherwise: a row
whose forward is NaN (a NaN or +inf logit, or only -inf) or whose ``g`` holds a NaN or an infinity
is NaN throughout; a -inf logit has ``y_i = 0`` exactly, so its softmax gradient is +0 and its
log_softmax gradient is ``g_i`` itself.

Method (Ziv's strategy, as the forward's :mod:`refkern.kernels.softmax`), three passes, each
deciding what it can prove and handing the rest on element by element:

1. for float16, bfloat16 and float32 results a float64 pass evaluates every element with a
   rigorous error bound (:func:`_fast_rows`, bounds in its docstring; compensated sums) and rounds
   both ends of the interval (relative error some ``20 * 2**-53``);
2. the rows holding an element it left undecided, and every row of a float64 result, go to the
   double-word pass (:func:`refkern.kernels._softmax_dd.dd_rows`, bounds in its module docstring):
   the row's sums once in double-word with rigorous bounds (relative error about ``n 2**-100``),
   then only the undecided elements, each by :func:`~refkern.kernels._transcendental.decide_scaled`;
3. the elements still undecided go to the exact path (:func:`exact_row`): rigorous integer
   intervals of the exponentials (:func:`refkern.kernels._exact_real.exp_interval`), combined
   exactly as fractions, at doubling precision (from 128 bits, past the double-word pass) until
   both ends round alike.

Results that are rational are found first and computed exactly (the interval loop would not end
on a midpoint): equal finite logits (``y = 1/c``), a softmax gradient that is exactly zero, a
log_softmax gradient with ``G = 0``. Every other result is irrational (Lindemann-Weierstrass, in
:func:`exact_row`), hence no midpoint, and the loop ends. Every pass decides an element only when
every real in its interval rounds alike, so each result is the one correct rounding, whichever pass
decides it: ``force_exact=True`` (every element by the exact path) gives the same bits.
"""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.eft import two_product, two_sum
from refkern.accumulate.formats import Format
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._softmax_dd import dd_rows, row_max
from refkern.kernels._transcendental import U, bracket_around
from refkern.kernels.softmax import exp_terms

__all__ = ["softmax_backward_rows", "exact_row"]

_TINY = 2.0**-1074  # a dropped or underflowed float64 quantity is below this
_FAR = -3000.0  # e**-3000 < 2**-4328: times any |G| or |N| (< 2**1200) below half of every subnormal


@jit(parallel=True)
def _fast_rows(X, G, log, prec, emin, emax, out, und):
    """Float64 pass: out[r, i] decided, or und[r, i] = True (a later pass decides it).

    The forward's terms and bounds (:func:`refkern.kernels.softmax.exp_terms`): ``P_j = e**(x_j - M)`` within
    ``eps_j = EXP_FAST_REL + 1.01 |de_j|`` relative plus 2**-1074, ``S = c0 + T`` within ``ES``, and
    ``y^_j = P_j fl(1 / S)`` within ``ey_j = y^_j (eps_j + ES / S + 2u) 1.02 + 2**-1073`` (u = 2**-53).
    The sums are compensated (Ogita, Rump and Oishi, "Accurate sum and dot product", SIAM J. Sci.
    Comput. 26(6), 2005, doi:10.1137/030601818): Sum2 of n terms errs by at most
    ``u |s| + gamma_n**2 sum|p_j|`` (Prop. 4.5) and Dot2 by ``u |s| + gamma_n**2 sum|x_j y_j|`` (its
    Section 5), gamma_n = n u / (1 - n u), without underflow; with ``|s| <= |s^| + gamma_n**2 sum|.|``
    that is at most ``(u |s^| + 2 gamma_n**2 sum|.|) 1.01`` from the result s^ (two-sums are exact under
    underflow; the products are charged below). So, with each product, difference and store within u
    of its value:

    * ``T^ = Sum2(P_j)``: ``ET = (sum eps_j P_j + (u + 2 gamma_m**2) T^) 1.01 + n 2**-1074``, then
      ``ES = ET + u S^``;
    * softmax: ``D^ = Dot2(g_j, y^_j)`` errs from D by at most ``eD = (sum|g_j| ey_j + u |D^| +
      2 gamma_n**2 sum|g_j y^_j|) 1.01 + n 2**-1074`` (a product or its error term below the normal
      range loses at most 2**-1075); ``h = g_i - D^`` by ``eh = (eD + u |h|) 1.01``; ``v = y^_i h`` by
      ``(ey_i (|h| + eh) + (y^_i + ey_i) eh + u |v| + 2**-1074) 1.01``;
    * log_softmax: ``G^ = Sum2(g_j)`` by ``eG = (u |G^| + 2 gamma_n**2 sum|g_j|) 1.01``; ``t = y^_i G^``
      by ``et = ey_i (|G^| + eG) + (y^_i + ey_i) eG + u |t| + 2**-1074``; ``v = g_i - t`` by
      ``(et + u |v|) 1.01``.

    The relative bound of an element is then some 20 u (it was about n u with plain sums: at n = 4096
    one float32 element in ~4000 was left undecided, one in ~10**6 now).
    :func:`~refkern.kernels._transcendental.bracket_around` widens each interval by the rounding of
    its own ends and rounds both; they decide when they agree (signs of zero included)."""
    n = X.shape[1]
    gn = n * U / (1.0 - n * U)
    g2 = 2.0 * gn * gn * 1.01  # 2 gamma_n**2 (every sum here has at most n terms)
    for r in prange(X.shape[0]):
        x = X[r]
        g = G[r]
        M, bad, _ = row_max(x, g)
        for j in range(n):
            und[r, j] = False
        if bad or M == -np.inf:  # the forward is NaN, or g is not finite: NaN throughout
            for j in range(n):
                out[r, j] = np.nan
            continue
        P = np.empty(n)
        eps = np.empty(n)
        c0 = exp_terms(x, M, P, eps)  # the forward's terms and bounds
        T = 0.0
        Tc = 0.0
        ET = 0.0
        for j in range(n):
            if eps[j] != 0.0:  # an exp term
                T, q = two_sum(T, P[j])  # Sum2
                Tc += q
                ET += eps[j] * P[j]
        T += Tc
        ET = (ET + (U + g2) * T) * 1.01 + n * _TINY
        S = c0 + T
        ES = ET + U * S
        inv = 1.0 / S
        rel = ES / S
        Y = np.zeros(n)
        EY = np.zeros(n)
        for j in range(n):
            if x[j] != -np.inf:
                Y[j] = P[j] * inv
                EY[j] = Y[j] * (eps[j] + rel + 2.0 * U) * 1.02 + 2.0 * _TINY
        if not log:
            D = 0.0
            Dc = 0.0
            AD = 0.0
            A = 0.0
            for j in range(n):
                p, pe = two_product(g[j], Y[j])  # Dot2
                D, q = two_sum(D, p)
                Dc += q + pe
                AD += abs(p)
                A += abs(g[j]) * EY[j]
            D += Dc
            eD = (A + U * abs(D) + g2 * AD) * 1.01 + n * _TINY
            for i in range(n):
                if x[i] == -np.inf:
                    out[r, i] = 0.0  # y_i = 0 exactly: the real gradient is 0
                    continue
                h = g[i] - D
                eh = (eD + U * abs(h)) * 1.01
                v = Y[i] * h
                e = (EY[i] * (abs(h) + eh) + (Y[i] + EY[i]) * eh + U * abs(v) + _TINY) * 1.01
                val, ok = bracket_around(v, e, False, prec, emin, emax)
                out[r, i] = val
                und[r, i] = not ok
        else:
            Gs = 0.0
            Gc = 0.0
            AG = 0.0
            for j in range(n):
                Gs, q = two_sum(Gs, g[j])  # Sum2
                Gc += q
                AG += abs(g[j])
            Gs += Gc
            eG = (U * abs(Gs) + g2 * AG) * 1.01
            for i in range(n):
                if x[i] == -np.inf:
                    out[r, i] = g[i]  # y_i = 0 exactly: the gradient is g_i, a value of the format
                    continue
                t = Y[i] * Gs
                et = EY[i] * (abs(Gs) + eG) + (Y[i] + EY[i]) * eG + U * abs(t) + _TINY
                v = g[i] - t
                e = (et + U * abs(v)) * 1.01
                val, ok = bracket_around(v, e, False, prec, emin, emax)
                out[r, i] = val
                und[r, i] = not ok


# ---------------------------------------------------------------- the exact path


def _iv_mul(a, b):
    """The product of two intervals of Fractions."""
    p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(p), max(p)


def _iv_add(a, b):
    return a[0] + b[0], a[1] + b[1]


def _iv_scale(c: Fraction, a):
    """c times the interval a (c exact)."""
    return (c * a[0], c * a[1]) if c >= 0 else (c * a[1], c * a[0])


def _iv_div_pos(a, s):
    """a / s for an interval s > 0."""
    q = (a[0] / s[0], a[0] / s[1], a[1] / s[0], a[1] / s[1])
    return min(q), max(q)


def _approx(n: int, e: int) -> float:
    """:func:`refkern.kernels._exact_real.approx`, +-inf where ``n * 2**e`` lies beyond the float range
    (it raised OverflowError from 2**1024 to 2**1160: logits 1e308 and -1e308 differ by 2**1025)."""
    try:
        return xr.approx(n, e)
    except OverflowError:
        return math.inf if n > 0 else -math.inf


def _exp_iv(d: Fraction, w: int):
    """[lo, hi] (Fractions) around e**d, d <= 0 exact; [0, 2**-w] where e**d < 2**-(w + 8)."""
    n, e = xr.dyadic(d)
    if _approx(n, e) < -(w + 8) * 0.6931:
        return Fraction(0), Fraction(1, 1 << w)
    lo, hi, sh = xr.exp_interval(n, e, w)
    s = Fraction(2) ** sh
    return lo * s, hi * s


_BELOW = Fraction(1, 1 << 2000)  # below every half-gap of the formats here (float64's smallest: 2**-1075)


def _beyond_midpoint(gi: Fraction, G: Fraction, groups: dict, n: int, fmt: Format):
    """log_softmax's gradient at a top logit (a_i = 0) when its rational part is a rounding boundary and the rest
    cannot reach the next one, else None. ``dx_i = R + G T / (c S)``, ``R = g_i - G / c`` (c logits at the top),
    ``T = S - c = sum_(a_k < 0) c_k e**a_k``, so the rest has the sign of G and at most ``|G| (n - c) e**a2 / c**2``
    (a2 the largest a_k < 0). Where R is a midpoint and that bound is below half the gap between R's two
    neighbours (a margin of e in logs for the float evaluation), dx_i rounds to the neighbour on G's side, however
    small the rest: the interval loop never decides it once the far terms lie below its cut-off (logits 4e5
    apart ran it toward 2**22 bits for minutes)."""
    c = groups[Fraction(0)][0]
    r = gi - G / c
    lo, hi = round_fraction(r - _BELOW, fmt), round_fraction(r + _BELOW, fmt)
    a2 = max((k for k in groups if k < 0), default=None)
    if lo == hi or G == 0 or a2 is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    bound = math.log(abs(float(G)) * (n - c) / (c * c)) + float(a2)
    if not bound < math.log((hi - lo) / 2) - 1.0:
        return None
    return hi if G > 0 else lo


def _sums(groups, w: int, f: int):
    """Intervals (Fractions) around ``S = sum_k c_k e**a_k`` and ``sum_k G_k e**a_k``, summed on
    integers at the scale 2**-(w + 16) (each e**a_k floored and ceiled onto it: one unit each way)."""
    W = w + 16
    s_lo = s_hi = d_lo = d_hi = 0
    for k, (c, gk) in groups.items():
        n, e = xr.dyadic(k)
        if _approx(n, e) < -(w + 8) * 0.6931:  # e**a_k < 2**-(w + 8): in [0, 1] units
            lo, hi = 0, 1
        else:
            a, b, sh = xr.exp_interval(n, e, w)
            lo = a << (sh + W) if sh + W >= 0 else a >> -(sh + W)  # floor
            hi = b << (sh + W) if sh + W >= 0 else -((-b) >> -(sh + W))  # ceil
        s_lo += c * lo
        s_hi += c * hi
        gi = int(gk * (1 << f))  # exact: G_k is a multiple of 2**-f
        if gi >= 0:
            d_lo += gi * lo
            d_hi += gi * hi
        else:
            d_lo += gi * hi
            d_hi += gi * lo
    one = Fraction(1, 1 << W)
    return (s_lo * one, s_hi * one), (d_lo * one / (1 << f), d_hi * one / (1 << f))


def _decided(iv, fmt: Format):
    """The rounding of every real in the interval, when they all round alike (sign of zero too)."""
    a, b = round_fraction(iv[0], fmt), round_fraction(iv[1], fmt)
    if a == b and math.copysign(1.0, a) == math.copysign(1.0, b):
        return a
    return None


def exact_row(x, g, idx, fmt: Format, log: bool, w0: int = 64) -> dict:
    """The exact path for one row whose forward is finite and whose g is finite: {i: RN(dx_i)}.

    Group the finite logits by value: a group k has ``c_k`` entries, logit offset ``a_k = x - M``
    and gradient sum ``G_k``. Then ``S = sum_k c_k e**a_k``, ``D = sum_k G_k e**a_k / S``, and

        softmax:      dx_i = e**a_i (sum_k (g_i c_k - G_k) e**a_k) / S**2
        log_softmax:  dx_i = g_i - G e**a_i / S          (G = sum of every g_j, -inf entries too)

    One group: ``y = 1/c``, every result rational, computed exactly. Several groups (distinct
    rational a_k): by Lindemann-Weierstrass the e**a_k are linearly independent over the algebraic
    numbers, so a softmax numerator is zero exactly when every ``g_i c_k - G_k`` is (then dx_i = 0),
    and otherwise dx_i is irrational: were it a rational r, ``sum_k w_k e**(a_i + a_k) - r S**2`` would
    vanish, but ``e**(2 a_k)`` of the top group (if a_i is not the top) or of the bottom group (else)
    appears only in ``r S**2``, with the coefficient ``r c_k**2 != 0``. Likewise ``G e**a_i / S`` is
    irrational unless G = 0 (then dx_i = g_i). An irrational value is no midpoint: the loop ends.

    The softmax numerator ``N = sum_k (g_i c_k - G_k) e**a_k`` is evaluated from the row's sums
    (``g_i S - sum_k G_k e**a_k``), except where the top group's coefficient vanishes (``g_i =
    G_top / c_top``: the argmax of a row with one largest logit, for one): N is then led by the
    largest a* among the groups with a nonzero coefficient, which may lie far below, and the row's
    sums, accurate to 2**-w absolutely, would need w >> -a* / ln 2 bits to see its sign (a row of one
    logit and entries masked by -3e38 never converged, and raised). There ``N' = N e**-a* = sum_k
    (g_i c_k - G_k) e**(a_k - a*)``, whose leading term is a nonzero rational, and ``dx_i = e**(a_i
    + a*) N' / S**2``. Where ``a_i (+ a*) < -3000`` the result is a zero whose sign is that of N
    (softmax), or g_i, or the zero of sign -G (log_softmax): ``|N|, |G| < 2**1200`` and ``S >= 1``.

    ``w0``: the first precision (bits) of the interval loop; the result does not depend on it.
    ``g_i c_k - G_k`` vanishes for every k exactly when every ratio ``G_k / c_k`` equals g_i: the
    distinct ratios are found once per row (the check was a loop over the groups per element)."""
    vals = [float(v) for v in x]
    gs = [Fraction(float(v)) for v in g]
    fin = [v for v in vals if v != -math.inf]
    M = Fraction(max(fin))
    groups = {}  # a_k -> [c_k, G_k]
    for v, gv in zip(vals, gs):
        if v != -math.inf:
            k = Fraction(v) - M
            c = groups.setdefault(k, [0, Fraction(0)])
            c[0] += 1
            c[1] += gv
    g_all = sum(gs, Fraction(0))
    ratios = {gk / c for c, gk in groups.values()}
    zero_at = ratios.pop() if len(ratios) == 1 else None  # the one g_i whose softmax numerator is 0
    res = {}
    todo = []
    for i in idx:
        if vals[i] == -math.inf:
            res[i] = 0.0 if not log else float(g[i])
        elif len(groups) == 1:
            ((c, gk),) = groups.values()
            q = (gs[i] - gk / c) / c if not log else gs[i] - g_all / c
            res[i] = round_fraction(q, fmt)
        elif not log and zero_at is not None and gs[i] == zero_at:
            res[i] = 0.0
        elif log and g_all == 0:
            res[i] = float(g[i])
        elif log and vals[i] == float(M) and (v := _beyond_midpoint(gs[i], g_all, groups, len(vals), fmt)) is not None:
            res[i] = v
        else:
            todo.append(i)
    w = w0
    f = max(0, max(-xr.dyadic(gk)[1] for _, gk in groups.values()))  # every G_k is an integer times 2**-f
    c_top, g_top = groups[Fraction(0)]
    top_zero = g_top / c_top  # the g_i whose top coefficient g_i c_top - G_top vanishes
    coefs = [(k, top_zero * c - gk) for k, (c, gk) in groups.items()]
    coefs = [(k, cf) for k, cf in coefs if cf != 0]
    a_star = max((k for k, _ in coefs), default=None)  # the leading group of such an N (none: zero_at)
    offs = {i: Fraction(vals[i]) - M for i in todo}
    while todo:
        S, Dn = _sums(groups, w, f)
        if not log and a_star is not None and any(gs[i] == top_zero for i in todo):
            Np = (Fraction(0), Fraction(0))  # N' = N e**-a*, led by its nonzero a* coefficient
            for k, cf in coefs:
                Np = _iv_add(Np, _iv_scale(cf, _exp_iv(k - a_star, w)))
        left = []  # S >= 1: the top group's e**0 = 1 is exact
        for i in todo:
            a = offs[i]
            if log or gs[i] != top_zero:
                N = _iv_add(_iv_scale(gs[i], S), (-Dn[1], -Dn[0]))  # g_i S - sum_k G_k e**a_k
                sh = Fraction(0)
            else:
                N, sh = Np, a_star  # dx_i = e**(a_i + a*) N' / S**2
            if _approx(*xr.dyadic(a + sh)) < _FAR:  # e**(a_i + a*) < e**-3000: far below every format's range
                v = None
                if log and gs[i] != 0:
                    v = float(g[i])  # g_i moved by less than 2**-4000 |G|: rounds to itself
                elif log:
                    v = -0.0 if g_all > 0 else 0.0  # -G y_i, a nonzero real below every subnormal
                elif N[0] > 0 or N[1] < 0:
                    v = 0.0 if N[0] > 0 else -0.0  # e**(a_i + a*) N / S**2 with the sign of N
            else:
                Ei = _exp_iv(a + sh, w)
                if log:
                    iv = _iv_div_pos(_iv_scale(g_all, Ei), S)
                    iv = (gs[i] - iv[1], gs[i] - iv[0])
                else:
                    iv = _iv_div_pos(_iv_mul(Ei, N), _iv_mul(S, S))
                v = _decided(iv, fmt)
            if v is None:
                left.append(i)
            else:
                res[i] = v
        todo = left
        w *= 2
        if w > 1 << 22:
            raise RuntimeError("softmax backward: the exact path did not converge (a bug: please report the input)")
    return res


def softmax_backward_rows(X: np.ndarray, Gr: np.ndarray, fmt: Format, log: bool, force_exact: bool = False):
    """dx of every row of the float64 (R, n) arrays X (logits) and Gr (grad_output), values of
    ``fmt``, rounded to ``fmt``: (out, number of elements the exact path decided). The float64 pass
    (narrower formats), the double-word pass and the exact path, as the module docstring says;
    ``force_exact`` sends every element of every finite row to the exact path."""
    R, n = X.shape
    out = np.empty((R, n))
    if R == 0 or n == 0:
        return out, 0
    und = np.zeros((R, n), np.bool_)
    X = np.ascontiguousarray(X, np.float64)
    Gr = np.ascontiguousarray(Gr, np.float64)
    w0 = 64
    if force_exact:
        for r in range(R):
            bad = np.isnan(X[r]).any() or (X[r] == np.inf).any() or not (X[r] > -np.inf).any()
            if bad or not np.isfinite(Gr[r]).all():
                out[r] = np.nan
            else:
                und[r] = True
    else:
        if fmt.prec < 53:
            _fast_rows(X, Gr, log, *fmt.params, out, und)
            rows = np.flatnonzero(und.any(axis=1)).astype(np.int64)
        else:
            und[:] = True
            rows = np.arange(R, dtype=np.int64)
        if rows.size:
            dd_rows(X, Gr, rows, log, *fmt.params, 1.0, out, und)
        w0 = 128  # the double-word pass left these: 64 bits would not decide them
    count = 0
    for r in np.flatnonzero(und.any(axis=1)):
        idx = np.flatnonzero(und[r]).tolist()
        for i, v in exact_row(X[r], Gr[r], idx, fmt, log, w0).items():
            out[r, i] = v
        count += len(idx)
    return out, count
