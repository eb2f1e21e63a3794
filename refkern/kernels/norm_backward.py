"""The backward of layer_norm and rms_norm, correctly rounded: the real-valued derivative of the
definition at the given inputs, rounded once to each argument's dtype.

A row ``x`` of n elements (the normalised dimensions flattened), ``g`` its grad_output, ``w`` the
weight (1 without one), ``mu`` the exact mean (0 for rms_norm), ``M2 = sum (x - mu)^2`` exact,
``z = M2 / n + eps``, ``r = z**(-1/2)``, ``xhat = (x - mu) r``, ``gw = g w``:

    grad_input_j  = r (gw_j - A - xhat_j B),   A = mean(gw) (0 for rms_norm),  B = mean(gw xhat)
                  = (P_j) / sqrt(z),           P_j = gw_j - A - (x_j - mu) C / z,  C = mean(gw (x - mu))
    grad_weight_k = sum over rows of g_k xhat_k = sum_rows g_k (x_k - mu) / sqrt(z_row)
    grad_bias_k   = sum over rows of g_k                                    (layer_norm only)

Method (Ziv's strategy). For float16, bfloat16 and float32 inputs a float64 pass
(:func:`_fast_rows`) evaluates every element with a rigorous absolute error bound on top of the
forward's exact moments (:func:`refkern.kernels._moments.moments`) and its double-word ``r`` with
its bound (as :func:`refkern.kernels.norm._normalize` forms them), and
:func:`~refkern.accumulate.ziv.decide` rounds when the bound allows. The rest, and every float64
result, take the exact path: ``P_j`` is a rational, so grad_input is
:func:`~refkern.accumulate.ziv.round_quotient_sqrt` ``(0, P_j, z)`` (the forward's "comparing squares"
machinery); a grad_weight element is a sum of ``a_r / sqrt(z_r)`` over rows, grouped into classes of
rows whose ``z`` differ by a rational square factor (:func:`sum_over_sqrt`): one class is again
``A / sqrt(z_c)``, several are irrational (square roots of distinct square-free integers are linearly
independent over the rationals, Besicovitch 1940) and an interval loop on integer square roots ends.
grad_bias is a float64 sum with a bound, or an exact Fraction sum. A row the float64 pass leaves to the
exact path (extreme magnitudes) still joins the float64 column sums, with its ``xhat`` correctly
rounded to float64 (within ``2**-53 |xhat|``).

Rows holding a NaN or an infinity (in x, g or w), or with ``var + eps == 0``, have no real-valued
answer: they follow IEEE float64 arithmetic on the formula, as torch does.
"""

import math
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import FLOAT64, Format, round_array
from refkern.accumulate.ziv import decide, round_fraction, round_quotient_sqrt
from refkern.kernels._moments import OK, moments, new_workspace
from refkern.kernels.norm import biased_variance, inv_std

__all__ = ["norm_backward_rows", "sum_over_sqrt", "U", "TINY"]

U = 2.0**-53  #: float64's unit roundoff: every float64 operation of the fast pass is charged U |result|
TINY = 2.0**-1074  #: a product that underflows loses at most this: charged once per product
_FAST, _EXACT, _SPECIAL = 0, 1, 2  # row status


@jit(parallel=True)
def _fast_rows(X, G, W, center, eps, prec, emin, emax, gin, xh, exh, status):
    """Float64 pass over the rows of X (R, n) with grad_output G (R, n) and weight W (P, n) (row r uses
    ``W[r % P]``; ones when absent): gin[r, j] = RN(grad_input) or NaN (undecided), xh/exh = xhat and its
    error bound (for grad_weight), status[r] = 0 (fast), 1 (exact path for the row), 2 (IEEE path).

    Bounds (``u = 2**-53``, every float64 operation charged ``u |result|``, every product also TINY
    for underflow): ``r`` and ``delta = mean - c`` as in the forward (``e_r``, ``e_d``, each low part
    dropped and charged whole); ``z_j = dh_j - delta`` within ``u|z_j| + |dl_j| + e_d``; ``xhat_j =
    z_j r`` within ``e_z (r + e_r) + |z_j| e_r + u|xhat_j| + TINY``; ``gw_j`` within ``u|gw_j| + TINY``;
    a float64 sum of n terms (each within ``e_k``) within ``sum e_k + 1.01 n u sum|terms|`` (gamma_n,
    n u < 2**-30 here); A and B divide by n (one more ``u``); then ``t = gw_j - A``, ``q = xhat_j B``,
    ``s = t - q`` and ``s r`` propagate as ``e(ab) = e(a)(|b| + e(b)) + |a| e(b) + u|ab|`` and
    ``e(a +- b) = e(a) + e(b) + u|a +- b|``; ``decide`` gets the bound times ``1 + 2**-40`` (the bound's
    own float64 evaluation)."""
    R, n = X.shape
    P = W.shape[0]
    for i in prange(R):
        x = X[i]
        g = G[i]
        w = W[i % P]
        bad = False
        for j in range(n):
            if not (abs(x[j]) < np.inf and abs(g[j]) < np.inf and abs(w[j]) < np.inf):
                bad = True
        for j in range(n):
            gin[i, j] = np.nan
        if bad:
            status[i] = _SPECIAL
            continue
        acc, tmp, scratch, dh, dl = new_workspace(n)
        st, c, d_h, d_l, e_d, m_h, m_l, e_m2, _ = moments(x, center, prec, acc, tmp, scratch, dh, dl)
        if st != OK:
            status[i] = _EXACT
            continue
        v_h, v_l, e_v = biased_variance(m_h, m_l, e_m2, n)
        fine, r_h, r_l, e_r = inv_std(v_h, v_l, e_v, eps)  # the forward's own r
        if not fine:
            status[i] = _EXACT
            continue
        r = r_h
        er = e_r + abs(r_l)  # |r - r_h|
        ed = e_d + abs(d_l)  # |delta - d_h|
        S = 0.0  # sum gw
        eS = 0.0
        aS = 0.0
        Bs = 0.0  # sum gw xhat
        eB = 0.0
        aB = 0.0
        for j in range(n):
            z = dh[j] - d_h
            ez = U * abs(z) + abs(dl[j]) + ed
            p = z * r
            xh[i, j] = p
            exh[i, j] = ez * (r + er) + abs(z) * er + U * abs(p) + TINY
            gw = g[j] * w[j]
            egw = U * abs(gw) + TINY
            S += gw
            eS += egw
            aS += abs(gw)
            t = gw * p
            Bs += t
            eB += egw * (abs(p) + exh[i, j]) + abs(gw) * exh[i, j] + U * abs(t) + TINY
            aB += abs(t)
        gam = 1.01 * n * U
        A = S / n if center else 0.0
        eA = ((eS + gam * aS) / n + U * abs(A)) if center else 0.0
        B = Bs / n
        eBn = (eB + gam * aB) / n + U * abs(B)
        for j in range(n):
            gw = g[j] * w[j]
            egw = U * abs(gw) + TINY
            t = gw - A
            et = egw + eA + U * abs(t)
            p = xh[i, j]
            q = p * B
            eq = exh[i, j] * (abs(B) + eBn) + abs(p) * eBn + U * abs(q) + TINY
            s = t - q
            es = et + eq + U * abs(s)
            y = s * r
            e = es * (r + er) + abs(s) * er + U * abs(y) + TINY
            v = decide(y, 0.0, e * (1.0 + 2.0**-40), prec, emin, emax)
            gin[i, j] = v if v != 0.0 else np.nan  # a zero's sign: decide compares -0 == +0; the exact path knows
        status[i] = _FAST


@jit(parallel=True)
def _fast_cols(G, xh, exh, use_xhat, prec, emin, emax, out):
    """out[k] = RN(sum_r G[r, k] xh[r, k]) (or RN(sum_r G[r, k]) without ``use_xhat``) or NaN: each term
    within ``e_t = |g| exh + u|term| + TINY``; the cascaded sum (Sum2 of Ogita, Rump and Oishi 2005,
    Proposition 4.5: within ``u |result| + gamma_{R-1}**2 sum|terms|`` of the exact sum of the computed
    terms, gamma <= 1.01 R u here) within that plus ``sum e_t`` (and ``gamma sum e_t``, their own sum's
    rounding)."""
    R, n = G.shape
    gam = 1.01 * R * U
    for k in prange(n):
        s = 0.0
        c = 0.0
        e = 0.0
        a = 0.0
        for r in range(R):
            if use_xhat:
                t = G[r, k] * xh[r, k]
                e += abs(G[r, k]) * exh[r, k] + U * abs(t) + TINY
            else:
                t = G[r, k]
            s, q = two_sum(s, t)
            c += q  # the cascaded sum (Sum2): s + c is within u |s + c| + gamma_R**2 sum|t| of the sum
            a += abs(t)
        y = s + c
        v = decide(y, 0.0, (e + U * abs(y) + gam * gam * a + gam * e) * (1.0 + 2.0**-40), prec, emin, emax)
        out[k] = v if v != 0.0 else np.nan  # a zero's sign is the exact path's to decide


# ---------------------------------------------------------------- the exact path


def _is_square(q: Fraction):
    """sqrt(q) as a Fraction when q >= 0 is the square of a rational, else None."""
    a, b = math.isqrt(q.numerator), math.isqrt(q.denominator)
    return Fraction(a, b) if a * a == q.numerator and b * b == q.denominator else None


def sum_over_sqrt(terms, fmt: Format) -> float:
    """RN(sum_k a_k / sqrt(z_k)) to ``fmt`` for pairs of Fractions (a_k, z_k), z_k > 0 (module docstring).

    Rows are grouped into classes of ``z`` that differ by the square of a rational (then
    ``a / sqrt(z) = (a / sqrt(z / z_c)) / sqrt(z_c)``, a rational multiple of ``1 / sqrt(z_c)``). One
    class with a nonzero coefficient: :func:`round_quotient_sqrt`. Several: ``1 / sqrt(z_c)`` is a
    rational times ``sqrt(s_c)``, ``s_c`` the square-free part of ``num(z_c) den(z_c)``, distinct between
    classes, so the value is irrational (Besicovitch) and no midpoint: the interval of integer square
    roots at doubling precision ends."""
    terms = [(a, z) for a, z in terms if a != 0]
    if not terms:
        return 0.0
    for w in (64, 160):  # an irrational sum decides here almost always, before the classes are formed
        v = _interval_round([(z, a) for a, z in terms], w, fmt)
        if v is not None:
            return v
    classes = []  # [z_c, A_c]
    for a, z in terms:
        if a == 0:
            continue
        for c in classes:
            s = _is_square(z / c[0])
            if s is not None:
                c[1] += a / s
                break
        else:
            classes.append([z, a])
    classes = [c for c in classes if c[1] != 0]
    if not classes:
        return 0.0
    if len(classes) == 1:
        return round_quotient_sqrt(Fraction(0), classes[0][1], classes[0][0], fmt)
    w = 64
    while True:
        v = _interval_round(classes, w, fmt)
        if v is not None:
            return v
        w *= 2
        if w > 1 << 22:
            raise RuntimeError("norm backward: the exact path did not converge (a bug: please report the input)")


def _interval_round(pairs, w: int, fmt: Format):
    """The rounding of every real in an interval around ``sum a / sqrt(z)`` over the pairs (z, a), each
    ``1/sqrt(z) = sqrt(zn zd) / zn`` within ``[k, k + 1] / (zn 2**w)`` (k an integer square root), summed
    on integers on a grid 2**-(w + 8) times the largest term (floored and ceiled there); None when the
    ends round apart."""
    bits = lambda q: q.numerator.bit_length() - q.denominator.bit_length()  # noqa: E731
    top = max(bits(a) - bits(z) // 2 for z, a in pairs)
    W = w + 8 - (top - 2)  # 2**(top + 2) exceeds every |a / sqrt(z)|: the grid is 2**-(w + 8) relative to it
    lo = hi = 0
    for z, a in pairs:
        k = math.isqrt(z.numerator * z.denominator << (2 * w))
        den = z.numerator << w
        v0, v1 = a * Fraction(k, den), a * Fraction(k + 1, den)
        if v0 > v1:
            v0, v1 = v1, v0
        lo += (v0.numerator << W) // v0.denominator  # floor(v0 2**W)
        hi += -((-v1.numerator << W) // v1.denominator)  # ceil(v1 2**W)
    a, b = round_fraction(Fraction(lo, 1 << W), fmt), round_fraction(Fraction(hi, 1 << W), fmt)
    if a == b and math.copysign(1.0, a) == math.copysign(1.0, b):
        return a
    return None


class _ExactRow:
    """The exact statistics of one finite row: mean, z = M2 / n + eps (Fractions), and ``d(k)``."""

    def __init__(self, x, center, eps):
        vals = np.asarray(x, np.float64).tolist()
        # on integers: x_k = m_k / L with L the largest power-of-two denominator; the same values as
        # refkern.kernels._moments.exact_moments, without a Fraction per term
        ratios = [v.as_integer_ratio() for v in vals]
        L = max(q for _, q in ratios)
        m = [p * (L // q) for p, q in ratios]
        n = len(m)
        s1, s2 = sum(m), sum(k * k for k in m)
        self.mean = Fraction(s1, n * L) if center else Fraction(0)
        m2 = Fraction(n * s2 - s1 * s1, n * L * L) if center else Fraction(s2, L * L)
        self.z = m2 / n + Fraction(eps)
        self._m, self._c, self._den = m, (s1 if center else 0), n * L

    def d(self, k: int) -> Fraction:
        """x_k - mean, exactly: (n m_k - S1) / (n L)."""
        return Fraction(len(self._m) * self._m[k] - self._c, self._den)


def _exact_input_row(st: _ExactRow, g, w, cols, center, fmt):
    """RN(grad_input_j) for j in cols: ``P_j / sqrt(z)`` (module docstring), z > 0."""
    n = len(g)
    # on integers: gw_k = gn_k / LG (g w is exact: a dyadic rational), d_k = (n m_k - S1) / (n L)
    pr = [(p1 * p2, q1 * q2) for (p1, q1), (p2, q2) in
          zip((float(a).as_integer_ratio() for a in g), (float(b).as_integer_ratio() for b in w))]  # fmt: skip
    LG = max(q for _, q in pr)
    gn = [p * (LG // q) for p, q in pr]
    A = Fraction(sum(gn), LG * n) if center else Fraction(0)
    m, c = st._m, st._c
    C = Fraction(sum(a * (n * b - c) for a, b in zip(gn, m) if a), LG * st._den * n)
    out = []
    for j in cols:
        P = Fraction(gn[j], LG) - A - st.d(j) * C / st.z
        out.append(0.0 if P == 0 else round_quotient_sqrt(Fraction(0), P, st.z, fmt))
    return out


def _ieee_rows(X, G, W, center, eps, fmt, need_in):
    """Rows without a real-valued answer: the formula in IEEE float64 arithmetic, as torch evaluates
    it: (grad_input rounded to fmt or None, xhat in float64). W: (R, n), one weight row per row."""
    with np.errstate(all="ignore"):
        mu = X.mean(axis=1, keepdims=True) if center else 0.0
        var = ((X - mu) ** 2).mean(axis=1, keepdims=True)
        r = 1.0 / np.sqrt(var + eps)
        xh = (X - mu) * r
        gw = G * W
        A = gw.mean(axis=1, keepdims=True) if center else 0.0
        B = (gw * xh).mean(axis=1, keepdims=True)
        gi = r * (gw - A - xh * B)
    gi = round_array(np.ascontiguousarray(gi), *fmt.params) if need_in else None
    return gi, xh


def _columns(regroup, R, n):
    """The layout of the parameter gradients' sums: ``regroup`` maps an (R, n) array to (T, C), column
    c holding the T terms of parameter element c (None: the identity, layer_norm's column sums).
    Returns (regroup, rows (T, C), cols (T, C)): the row and column of X each term comes from."""
    if regroup is None:
        regroup = _identity
    rows = regroup(np.broadcast_to(np.arange(R)[:, None], (R, n)))
    cols = regroup(np.broadcast_to(np.arange(n)[None, :], (R, n)))
    return regroup, rows, cols


def _identity(a):
    return a


def norm_backward_rows(X, G, W, center: bool, eps: float, fmts: dict, wrt, force_exact: bool = False,
                       regroup=None) -> dict:  # fmt: skip
    """The gradients asked for (``wrt`` among "input", "weight", "bias") of a norm over the rows of
    the float64 (R, n) arrays X (input) and G (grad_output), with W float64 or None: (n,) (every row)
    or (P, n) (row r uses ``W[r % P]``: group_norm's per-channel weight, batch_norm's per-row one).
    grad_weight and grad_bias are the sums of ``g xhat`` and ``g`` over the columns of
    ``regroup(.)`` ((R, n) -> (T, C); default: the columns of X, layer_norm's layout). Each result a
    float64 array of values of ``fmts[name]``: {"input": (R, n), "weight": (C,), "bias": (C,)}."""
    R, n = X.shape
    out = {}
    Wk = np.ones((1, n)) if W is None or n == 0 else np.ascontiguousarray(np.asarray(W, np.float64).reshape(-1, n))
    Wr = Wk[np.arange(R) % Wk.shape[0]] if R and n else np.ones((R, n))  # one weight row per row
    X = np.ascontiguousarray(X, np.float64)
    G = np.ascontiguousarray(G, np.float64)
    regroup, trow, tcol = _columns(regroup, R, n)
    C = trow.shape[1]
    if R == 0 or n == 0:
        for k in wrt:
            out[k] = np.zeros((R, n) if k == "input" else (C,))
        return out
    fin = fmts["input"]
    gin = np.full((R, n), np.nan)
    xh = np.zeros((R, n))
    exh = np.full((R, n), np.inf)
    status = np.full(R, _EXACT, np.int64)
    if not force_exact:
        _fast_rows(X, G, Wk, center, float(eps), *fin.params, gin, xh, exh, status)
    else:
        bad = ~(np.isfinite(X).all(axis=1) & np.isfinite(G).all(axis=1) & np.isfinite(Wr).all(axis=1))
        status[bad] = _SPECIAL
    rows = {}

    def exact(r):
        if r not in rows:
            rows[r] = _ExactRow(X[r], center, eps)
        return rows[r]

    for r in np.flatnonzero(status == _EXACT):  # z == 0 (eps = 0, constant row): no real value either
        if exact(r).z <= 0:
            status[r] = _SPECIAL
    special = np.flatnonzero(status == _SPECIAL)
    if special.size:
        gi_s, xh_s = _ieee_rows(X[special], G[special], Wr[special], center, eps, fin, "input" in wrt)
    if "input" in wrt:
        if special.size:
            gin[special] = gi_s
        for r in range(R):
            if status[r] == _SPECIAL:
                continue
            cols = np.flatnonzero(np.isnan(gin[r]))
            if cols.size:
                gin[r, cols] = _exact_input_row(exact(r), G[r], Wr[r], cols.tolist(), center, fin)
        out["input"] = gin
    for k in ("weight", "bias"):
        if k not in wrt:
            continue
        fmt = fmts[k]
        col = np.full(C, np.nan)
        Gt = np.ascontiguousarray(regroup(G))
        if not force_exact and not special.size:
            for r in np.flatnonzero(status == _EXACT):  # xhat correctly rounded to float64: within u |xhat|
                st = exact(r)
                xh[r] = [round_quotient_sqrt(Fraction(0), st.d(k), st.z, FLOAT64) for k in range(n)]
                exh[r] = U * np.abs(xh[r]) + TINY
                status[r] = _FAST
            _fast_cols(Gt, np.ascontiguousarray(regroup(xh)), np.ascontiguousarray(regroup(exh)), k == "weight",
                       *fmt.params, col)  # fmt: skip
        if special.size:  # a row without a real value: the column sums in IEEE float64 arithmetic
            _, xh_all = _ieee_rows(X, G, Wr, center, eps, fin, False)
            with np.errstate(all="ignore"):
                terms = G * xh_all if k == "weight" else G
                col = round_array(np.ascontiguousarray(regroup(terms).sum(axis=0)), *fmt.params)
        else:
            for c in np.flatnonzero(np.isnan(col)):
                if k == "bias":
                    col[c] = round_fraction(sum((Fraction(float(v)) for v in Gt[:, c]), Fraction(0)), fmt)
                else:
                    terms = [(Fraction(float(G[r, j])) * exact(r).d(j), exact(r).z)
                             for r, j in zip(trow[:, c].tolist(), tcol[:, c].tolist()) if G[r, j] != 0]  # fmt: skip
                    col[c] = sum_over_sqrt(terms, fmt)
        out[k] = col
    return out
