"""The exact path of the attention backward (:mod:`refkern.kernels.attention_backward`, whose docstring
derives it), part 1: one row's exact logits and dP as sums of integer products (:class:`_Ints`), its
exponentials as rigorous integer intervals, and its P and dS as dyadic Fraction intervals (:class:`_Row`)."""

import math
import operator
from fractions import Fraction

import numpy as np

from refkern._jit import jit
from refkern.accumulate.formats import Format
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._transcendental import EXP_DD_REL, X_MIN, exp_dd
from refkern.kernels.softmax_backward import _exp_iv, _iv_add, _iv_mul, _iv_scale

OP = "scaled_dot_product_attention"
_W0 = 96  # the first width of Ziv's loop: the exponentials from exp_dd (relative 2**-99)


def _snap(iv, w: int):
    """The interval widened outward to dyadics with about w + 8 bits below its magnitude (keeps the
    Fractions small; moves each end by at most 2**-(w + 8) of the magnitude)."""
    lo, hi = iv
    m = max(abs(lo), abs(hi))
    if m == 0:
        return iv
    e = m.numerator.bit_length() - m.denominator.bit_length()
    sc = w + 8 - e
    f = Fraction(2) ** sc
    return Fraction(math.floor(lo * f)) / f, Fraction(math.ceil(hi * f)) / f


@jit
def _exp_dd_all(xh, xl, vh, vl, m):
    """e**(xh[j] + xl[j]) = (vh[j] + vl[j]) 2**m[j] within relative EXP_DD_REL; X_MIN <= xh + xl <= 0."""
    for j in range(xh.size):
        vh[j], vl[j], m[j] = exp_dd(xh[j], xl[j])


def _fix(n: int, e: int, W: int, up: bool) -> int:
    """``n 2**e`` in units of ``2**-W``, rounded down (up: rounded up)."""
    k = e + W
    if k >= 0:
        return n << k
    return -((-n) >> -k) if up else n >> -k


def _dyadic_iv(lo: int, hi: int, k: int, e: int):
    """The interval ``[lo, hi] 2**(e - k)`` as Fractions."""
    sh = e - k
    if sh >= 0:
        return Fraction(lo << sh), Fraction(hi << sh)
    return Fraction(lo, 1 << -sh), Fraction(hi, 1 << -sh)


class _Ints:
    """A float64 stack holding values of a format of ``prec`` bits, as Python ints at one exponent,
    exactly: ``X[b] = n * 2**e`` elementwise (``m 2**prec`` is an integer for every value ``m 2**ex``,
    ``1/2 <= |m| < 1``, of the format, subnormals too); the rows of one batch built once, on first use,
    so that exact dot products are sums of small integers."""

    def __init__(self, X: np.ndarray, prec: int):
        self.X, self.prec = X, prec
        nz = X[X != 0]
        self.e = int(np.frexp(nz)[1].min()) - prec if nz.size else 0
        self._b = {}

    def rows(self, b: int) -> list:
        r = self._b.get(b)
        if r is None:
            m, ex = np.frexp(self.X[b])
            mant = (m * 2.0**self.prec).astype(np.int64)  # exact: an integer below 2**prec
            sh = np.maximum(ex.astype(np.int64) - self.prec - self.e, 0)  # >= 0 where nonzero (0 has mant 0)
            r = [[a << s for a, s in zip(ma, sa)] for ma, sa in zip(mant.tolist(), sh.tolist())]
            self._b[b] = r
        return r


def _idot(a: list, b: list) -> int:
    return sum(map(operator.mul, a, b))


def _frac(n: int, e: int) -> Fraction:
    return Fraction(n << e) if e >= 0 else Fraction(n, 1 << -e)


def _to_float(n: int, e: int) -> float:
    """``n 2**e`` correctly rounded to float64 (integer true division rounds correctly, subnormals too)."""
    return float(n << e) if e >= 0 else n / (1 << -e)


class _Row:
    """One row (b, i), exactly: its state ("nan", "masked", "ok"), the finite logits' offsets
    ``a_j = an[j] 2**ae`` (``key``: rows with equal keys have equal P), the values' batch ``vkey``, and the
    exact ``dP_j = dpn[j] 2**edp`` of its gradient row; ``rational`` (every finite logit equal: ``P = 1/c``);
    :meth:`dS_exact` the exact dS_j when it is rational (0 by the group test, or the rational row's value),
    else None. :meth:`combined` is the row with the gradient row ``sum_r c_r g_r`` of rows of equal logits
    and values (dS and dP are linear in it: its dP in Fractions), sharing the exponentials' intervals."""

    def __init__(self, z, ze: int, vkey, dpn=None, edp=0):
        """z: the logits, "nan", "+inf", "-inf" or an integer n (the logit ``n 2**ze``)."""
        self.dpn, self.edp = dpn, edp
        self.state = "ok"
        if any(t in ("nan", "+inf") for t in z):
            self.state = "nan"
            return
        self.fin = [j for j, t in enumerate(z) if not isinstance(t, str)]
        if not self.fin:
            self.state = "masked"
            return
        M = max(z[j] for j in self.fin)
        an = [z[j] - M for j in self.fin]
        tz = min(((x & -x).bit_length() - 1 for x in an if x), default=0)  # a canonical exponent: equal keys
        self.an = {j: x >> tz for j, x in zip(self.fin, an)}
        self.ae = ze + tz if any(an) else 0
        self.key = (self.ae, tuple(self.an.items()))
        self.vkey = vkey
        self.rational = not any(an)
        self.groups = {}
        for j in self.fin:
            self.groups.setdefault(self.an[j], []).append(j)
        self._exp = {}  # w -> the exponentials' intervals: shared by the combined rows
        self._a = None
        self._set_dP(None)

    @property
    def a(self):
        """{j: a_j} as Fractions."""
        if self._a is None:
            self._a = {j: _frac(n, self.ae) for j, n in self.an.items()}
        return self._a

    @property
    def dP(self):
        """{j: dP_j} as Fractions."""
        if self._dP is None:
            self._dP = {j: _frac(n, self.edp) for j, n in self.dpn.items()}
        return self._dP

    def _set_dP(self, dP):
        self._dP = dP
        self._dS = {}
        self._iv = {}
        self._T = {}
        self._rel = {}  # scaled(): the groups' dP sums and the suffix sums, per leading group and width

    def combined(self, parts):
        """The row whose gradient row is ``sum c g_r`` over parts ``(row, c)`` (rows of this key and vkey)."""
        r = object.__new__(_Row)
        r.__dict__.update(self.__dict__)
        r._set_dP({j: sum((c * p.dP[j] for p, c in parts), Fraction(0)) for j in self.fin})
        r.dpn = None  # its intervals in Fractions
        return r

    def P_exact(self, j):
        return Fraction(1, len(self.fin)) if self.rational else None

    def dS_exact(self, j):
        if j not in self._dS:
            if self.dpn is not None:  # on integers: dP_j = dpn[j] 2**edp
                d = self.dpn
                if self.rational:
                    c = len(self.fin)
                    self._dS[j] = _frac(c * d[j] - sum(d.values()), self.edp) / (c * c)
                elif all(len(grp) * d[j] - sum(d[k] for k in grp) == 0 for grp in self.groups.values()):
                    self._dS[j] = Fraction(0)
                else:
                    self._dS[j] = None
                return self._dS[j]
            dP = self.dP
            if self.rational:
                c = len(self.fin)
                self._dS[j] = (dP[j] - sum(dP.values(), Fraction(0)) / c) / c
            elif all(sum((dP[j] - dP[k] for k in grp), Fraction(0)) == 0 for grp in self.groups.values()):
                self._dS[j] = Fraction(0)
            else:
                self._dS[j] = None
        return self._dS[j]

    def _exps(self, w):
        if w not in self._exp:
            Ei = {j: ((Fraction(1), Fraction(1)) if a == 0 else _exp_iv(a, w)) for j, a in self.a.items()}
            S = (sum(e[0] for e in Ei.values()), sum(e[1] for e in Ei.values()))  # >= 1: the top logit's e**0
            self._exp[w] = (Ei, S, (S[0] * S[0], S[1] * S[1]))
        return self._exp[w]

    def _fixed(self, w):
        """The exponentials on integers in units of ``2**-W`` (``W = w + 16``): ``({j: lo}, {j: hi}, S_lo,
        S_hi)`` with ``lo <= e**a_j 2**W <= hi``. At the first width from exp_dd (relative EXP_DD_REL, plus
        ``1.01 |a - xh - xl| <= 2**-105 |a| + 2**-1074`` for a_j as the double-word ``xh + xl``), then from
        :func:`refkern.kernels._exact_real.exp_interval`; ``[0, 1]`` where ``e**a_j < 2**-(W + 8)``."""
        key = ("fixed", w)
        if key in self._exp:
            return self._exp[key]
        W = w + 16
        one = 1 << W
        lo, hi = {}, {}
        far = -(W + 8) * 0.6931
        todo = []
        e = self.ae
        for j, n in self.an.items():
            if n == 0:
                lo[j] = hi[j] = one
                continue
            d = xr.approx(n, e)
            if d < far:
                lo[j], hi[j] = 0, 1
            elif w == _W0 and d > X_MIN:
                todo.append(j)
            else:
                l, h, sh = xr.exp_interval(n, e, w)
                lo[j], hi[j] = _fix(l, sh, W, False), _fix(h, sh, W, True)
        if todo:
            xh, xl = [], []
            for j in todo:  # a_j = xh + xl + t, |t| <= u |xl| + 2**-1075 <= 2**-106 |a_j| + 2**-1074
                n = self.an[j]
                x = _to_float(n, e)
                hn, he = xr.dyadic(x)
                k = min(e, he)
                xh.append(x)
                xl.append(_to_float((n << (e - k)) - (hn << (he - k)), k))
            xh, xl = np.array(xh), np.array(xl)
            vh, vl, m = np.empty_like(xh), np.empty_like(xh), np.zeros(xh.size, np.int64)
            _exp_dd_all(xh, xl, vh, vl, m)
            for j, x, h_, l_, mm in zip(todo, xh.tolist(), vh.tolist(), vl.tolist(), m.tolist()):
                r = (EXP_DD_REL + 2.0**-105 * abs(x) * 1.01 + 2.0**-1072) * (1.0 + 2.0**-40)
                rn = math.ceil(math.ldexp(r, 200)) + 1  # R = rn 2**-200 >= r
                nh, eh = xr.dyadic(h_)
                nl, el = xr.dyadic(l_)
                e0 = min(eh, el)
                V = (nh << (eh - e0)) + (nl << (el - e0))  # (vh + vl) = V 2**e0, exactly
                lo[j] = _fix(V * ((1 << 200) - rn), e0 + mm - 200, W, False)
                hi[j] = _fix(V * ((1 << 200) + rn), e0 + mm - 200, W, True)
        res = (lo, hi, sum(lo.values()), sum(hi.values()))
        self._exp[key] = res
        return res

    def _interval_fixed(self, j, kind, w: int):
        """As :meth:`interval`, on integers (a row built from the inputs: dP_j = dpn[j] 2**edp)."""
        lo, hi, Sl, Sh = self._fixed(w)
        bits = w + 8
        if kind == "P":
            k = bits - (hi[j].bit_length() - Sl.bit_length()) + 2  # P_j = E_j / S, in units of 2**-k
            if k >= 0:
                ql, qh = (lo[j] << k) // Sh, -((-(hi[j] << k)) // Sl)
            else:
                ql, qh = lo[j] // (Sh << -k), -((-hi[j]) // (Sl << -k))
            return _dyadic_iv(ql, qh, k, 0)
        dpn = self.dpn
        T = self._T.get(w)
        if T is None:  # T = sum_k dP_k E_k, in units of 2**(edp - W): exact integer sums
            tl = th = 0
            for k_, d in dpn.items():
                if d > 0:
                    tl += d * lo[k_]
                    th += d * hi[k_]
                elif d < 0:
                    tl += d * hi[k_]
                    th += d * lo[k_]
            T = self._T[w] = (tl, th)
        d = dpn[j]
        nl = d * (Sl if d >= 0 else Sh) - T[1]  # N = dP_j S - T
        nh = d * (Sh if d >= 0 else Sl) - T[0]
        ml = (lo[j] if nl >= 0 else hi[j]) * nl  # E_j N, in units of 2**(edp - 2W)
        mh = (hi[j] if nh >= 0 else lo[j]) * nh
        S2l, S2h = Sl * Sl, Sh * Sh  # S**2 in units of 2**-2W
        dl, dh = (S2h if ml >= 0 else S2l), (S2l if mh >= 0 else S2h)
        k = bits - (max(abs(ml), abs(mh)).bit_length() - S2l.bit_length()) + 2
        if k >= 0:
            ql, qh = (ml << k) // dl, -((-(mh << k)) // dh)
        else:
            ql, qh = ml // (dl << -k), -((-mh) // (dh << -k))
        return _dyadic_iv(ql, qh, k, self.edp)

    def scaled(self, j, kind, K: int):
        """``(R, bn, Y)``: P_j ("P") or dS_j ("dS") as ``R + e**(bn 2**ae) Y``, R rational, ``bn < 0``, Y a dyadic
        interval (:func:`_dv_sum`) of relative width about ``2**-K`` whatever the offsets (:meth:`interval`'s are
        absolute, in units of the row's top exponential, so that an e**-1e5 needs 1e5 / ln 2 bits there); None where
        dS_j is exactly 0. Over the groups g of equal offsets (``g_0 = 0 > g_1 > ...``, ``n_g`` keys each), ``S =
        n_0 + e**g_1 S_1`` with ``S_i = sum_(m >= i) n_m e**(g_m - g_i)``.

        * ``P_j = e**a_j / S``: for a top key ``1 / n_0 - e**g_1 S_1 / (n_0 S)``, else ``R = 0``, ``bn = an_j``.
        * ``dS_j = e**a_j N_j / S**2``, ``N_j = sum_g c_g e**g`` with ``c_g = sum_(k in g) (dP_j - dP_k)`` exact; the
          groups above the highest g* with ``c_g != 0`` add exactly 0, so ``N_j = e**g* N*``, ``N* = dP_j SS - ST``
          (``SS = S_(g*)``, ``ST = sum_(m >= g*) (sum_(k in m) dP_k) e**(g_m - g*)``), whose top term ``c_g*`` is a
          nonzero rational. Where ``a_j + g* < 0``, ``R = 0`` and ``Y = N* / S**2``. Where ``a_j = g* = 0`` (a top
          key of several, unequal dP), ``R = c_0 / n_0**2`` and the rest is ``e**g_1 (n_0**2 N_1 - c_0 (2 n_0 S_1 +
          e**g_1 S_1**2)) / (n_0**2 S**2)``, ``N_1 = dP_j S_1 - ST_1`` (``N* = c_0 + e**g_1 N_1``).

        So the rational part of every term is exact, and the rest has its own leading exponential."""
        ex = self._exp.get(("rel", K))
        if ex is None:  # the exponentials depend on the logits alone: shared by the combined rows
            gs = sorted(self.groups, reverse=True)  # gs[0] = 0, the top logit's group; two groups at least
            S = _dv_sum([_dv_mul((n, n, 0), _dv_exp(g, self.ae, K), K)
                         for g, n in ((g, len(self.groups[g])) for g in gs)], K)  # fmt: skip
            ex = self._exp[("rel", K)] = (gs, S, _dv_mul(S, S, K), _dv_exp(gs[1], self.ae, K))
        gs, S, S2, e1 = ex
        n0 = len(self.groups[0])
        if kind == "P":
            if self.an[j]:
                return Fraction(0), self.an[j], _dv_div((1, 1, 0), S, K)
            S1 = self._suffix(1, K)[0]
            return Fraction(1, n0), gs[1], _neg(_dv_div(S1, _dv_mul((n0, n0, 0), S, K), K))
        dP = self.dP
        sums = self._sums(gs)
        d = dP[j]
        i = next((i for i, g in enumerate(gs) if len(self.groups[g]) * d != sums[i]), None)
        if i is None:
            return None
        if self.an[j] or i:
            SS, ST = self._suffix(i, K)
            return Fraction(0), self.an[j] + gs[i], _dv_div(_dv_sum([_dv_q(d, SS, K), _neg(ST)], K), S2, K)
        c0 = n0 * d - sums[0]
        S1, T1 = self._suffix(1, K)
        N1 = _dv_sum([_dv_q(d, S1, K), _neg(T1)], K)
        sq = n0 * n0
        inner = _dv_sum([_dv_mul((2 * n0, 2 * n0, 0), S1, K), _dv_mul(e1, _dv_mul(S1, S1, K), K)], K)
        num = _dv_sum([_dv_mul((sq, sq, 0), N1, K), _neg(_dv_q(c0, inner, K))], K)
        return Fraction(c0, sq), gs[1], _dv_div(num, _dv_mul((sq, sq, 0), S2, K), K)

    def _sums(self, gs):
        """Per group (in the order of gs), ``sum_(k in g) dP_k`` (Fractions), once per gradient row."""
        sums = self._rel.get("sums")
        if sums is None:
            dP = self.dP
            sums = self._rel["sums"] = [sum((dP[k] for k in self.groups[g]), Fraction(0)) for g in gs]
        return sums

    def _suffix(self, i: int, K: int):
        """``(S_i, ST_i)`` of :meth:`scaled` from the group gs[i] down, relative to ``e**g_i``, at width K."""
        got = self._rel.get((i, K))
        if got is None:
            gs = self._exp[("rel", K)][0]
            sums = self._sums(gs)
            f = [_dv_exp(g - gs[i], self.ae, K) for g in gs[i:]]
            SS = _dv_sum([_dv_mul((n, n, 0), x, K) for n, x in zip((len(self.groups[g]) for g in gs[i:]), f)], K)
            ST = _dv_sum([_dv_q(t, x, K) for t, x in zip(sums[i:], f) if t], K)
            got = self._rel[(i, K)] = (SS, ST)
        return got

    def interval(self, j, kind, w: int):
        """P_j ("P") or dS_j ("dS") as an interval of Fractions at width w. ``dS_j = E_j (dP_j S - T) / S**2``
        with ``T = sum_k dP_k E_k`` (one interval per row and width: every j of the row reads it)."""
        if (j, kind, w) in self._iv:
            return self._iv[(j, kind, w)]
        if self.dpn is not None:
            v = self._iv[(j, kind, w)] = self._interval_fixed(j, kind, w)
            return v
        Ei, S, S2 = self._exps(w)
        if kind == "P":
            v = _snap((Ei[j][0] / S[1], Ei[j][1] / S[0]), w)
        else:
            T = self._T.get(w)
            if T is None:
                T = (Fraction(0), Fraction(0))
                for k in self.fin:
                    if self.dP[k] != 0:
                        T = _iv_add(T, _iv_scale(self.dP[k], Ei[k]))
                T = self._T[w] = _snap(T, w + 8)
            N = _iv_add(_iv_scale(self.dP[j], S), (-T[1], -T[0]))
            num = _iv_mul(Ei[j], N)
            lo = num[0] / S2[1] if num[0] >= 0 else num[0] / S2[0]
            hi = num[1] / S2[0] if num[1] >= 0 else num[1] / S2[1]
            v = _snap((lo, hi), w)
        self._iv[(j, kind, w)] = v
        return v


# Dyadic intervals ``(lo, hi, e)``, the reals ``[lo 2**e, hi 2**e]`` (integers lo <= hi), whose exponent is free:
# :meth:`_Row.scaled` and :meth:`refkern.kernels._exact_attention._Exact.element` at widths where offsets far apart
# leave the fixed-point intervals of :meth:`_Row.interval` undecided. Every step rounds outward to about K + 16 bits.


def _dv_trim(x, K: int):
    """x rounded outward to about K + 16 significant bits."""
    lo, hi, e = x
    sh = max(abs(lo), abs(hi)).bit_length() - K - 16
    return (lo >> sh, -((-hi) >> sh), e + sh) if sh > 0 else x


def _dv_sum(xs, K: int):
    """The sum of dyadic intervals, in units of 2**-(K + 24 + log2 len) of the largest magnitude (each term
    floored and ceiled onto that grid: a term far below it only widens the sum by one unit)."""
    xs = [x for x in xs if x[0] or x[1]]
    if not xs:
        return 0, 0, 0
    top = max(e + max(abs(lo), abs(hi)).bit_length() for lo, hi, e in xs)
    et = top - K - 24 - len(xs).bit_length()
    slo = shi = 0
    for lo, hi, e in xs:
        s = e - et
        if s >= 0:
            slo, shi = slo + (lo << s), shi + (hi << s)
        else:
            slo, shi = slo + (lo >> -s), shi - ((-hi) >> -s)
    return _dv_trim((slo, shi, et), K)


def _neg(x):
    return -x[1], -x[0], x[2]


def _dv_mul(x, y, K: int):
    a, b, e = x
    c, d, f = y
    p = (a * c, a * d, b * c, b * d)
    return _dv_trim((min(p), max(p), e + f), K)


def _dv_q(q: Fraction, x, K: int):
    """The exact dyadic rational q times x."""
    n, e = xr.dyadic(q)
    return _dv_mul((n, n, e), x, K)


def _dv_div(x, y, K: int):
    """x / y for y > 0 (``y[0] > 0``): each end a floor or ceiling of an integer quotient."""
    lo, hi, e = x
    c, d, f = y
    k = max(0, K + 24 + d.bit_length() - max(abs(lo), abs(hi)).bit_length())
    ql = (lo << k) // (d if lo >= 0 else c)
    qh = -((-(hi << k)) // (c if hi >= 0 else d))
    return _dv_trim((ql, qh, e - f - k), K)


def _dv_exp(n: int, e: int, K: int):
    """``e**(n 2**e)``, ``n <= 0``: of relative width about ``2**-K`` (:func:`refkern.kernels._exact_real.exp_interval`
    at K + 8 bits), or ``[0, 2**-K]`` where ``n 2**e < -0.6932 K``: ``ln 2 < 0.6932``, so there ``e**(n 2**e) <
    2**-K`` (also where ``|n 2**e| >= 2**24``, beyond exp_interval's range: ``0.6932 K < 2**24`` for every K here)."""
    if n == 0:
        return 1, 1, 0
    lhs, rhs = n * 10000, -6932 * K
    if ((lhs << e) < rhs) if e >= 0 else (lhs < (rhs << -e)):
        return 0, 1, -K
    return xr.exp_interval(n, e, K + 8)


def exp_far(n: int, e: int):
    """``e**(n 2**e)`` for ``n 2**e < 0`` of any size, to within a factor 4: ``[2**lo, 2**hi]`` with ``lo = floor(d /
    ln2_lo)``, ``hi = ceil(d / ln2_hi)`` (``d = n 2**e < 0``, ``ln 2`` in ``[ln2_lo, ln2_hi]`` to ``W = log2|d| + 16``
    bits: :func:`refkern.kernels._exact_real.ln2_fixed`), so ``hi - lo <= 2``: e**d = 2**(d / ln 2) and d / ln 2 lies
    between the two quotients."""
    W = max(n.bit_length() + e, 0) + 16
    l_lo, l_hi = xr.ln2_fixed(W)
    d = _frac(n, e + W)  # d 2**W
    lo, hi = math.floor(d / l_lo), math.ceil(d / l_hi)
    return 1, 1 << (hi - lo), lo


def _exact_logits(q, K, mrow, s):
    """The logits of one row: a list of ("nan" | "+inf" | "-inf" | Fraction) (module docstring's rules)."""
    sF = Fraction(s) if math.isfinite(s) else None
    out = []
    for j in range(K.shape[0]):
        m = float(mrow[j])
        nan = pinf = ninf = False
        tot = Fraction(0)
        for a, b in zip(q.tolist(), K[j].tolist()):
            if not (math.isfinite(a) and math.isfinite(b)):
                if a != a or b != b or a == 0 or b == 0:
                    nan = True
                elif (a > 0) == (b > 0):
                    pinf = True
                else:
                    ninf = True
            else:
                tot += Fraction(a) * Fraction(b)
        if q.size == 0:
            x = 0.0  # E = 0: the logit is the mask
        elif nan or (pinf and ninf):
            x = math.nan
        elif pinf or ninf:
            x = (math.inf if pinf else -math.inf) * s
        elif sF is None:
            x = s * (0.0 if tot == 0 else (1.0 if tot > 0 else -1.0))  # inf * 0 is NaN
        else:
            x = None
        if x is not None:
            v = x + m
            out.append("nan" if v != v else ("+inf" if v == math.inf else ("-inf" if v == -math.inf else Fraction(v))))
        elif m != m or m == math.inf:
            out.append("nan" if m != m else "+inf")
        elif m == -math.inf:
            out.append("-inf")
        else:
            out.append(sF * tot + Fraction(m))
    return out


def exact_row(q, K, V, mrow, s: float, cols, fmt: Format) -> dict:
    """The exact path for one query row: {c: RN(out_c)} for c in cols. q (E,), K (S, E), V (S, Ev)
    float64, mrow (S,) the additive mask of the row (causal included)."""
    z = _exact_logits(q, K, mrow, s)
    res = {}
    if any(t in ("nan", "+inf") for t in z):
        return {c: math.nan for c in cols}
    fin = [j for j, t in enumerate(z) if not isinstance(t, str)]
    Vl = V.tolist()
    if not fin:
        return {c: (math.nan if any(not math.isfinite(Vl[j][c]) for j in range(len(z))) else 0.0) for c in cols}
    M = max(z[j] for j in fin)
    d = {j: z[j] - M for j in fin}
    groups = {}
    for j in fin:
        groups.setdefault(d[j], []).append(j)
    todo = []
    for c in cols:
        col = [Vl[j][c] for j in range(len(z))]
        if any(v != v for v in col) or any(math.isinf(col[j]) and j not in d for j in range(len(z))):
            res[c] = math.nan
            continue
        infs = {math.copysign(1.0, col[j]) for j in fin if math.isinf(col[j])}
        if infs:
            res[c] = math.nan if len(infs) == 2 else math.copysign(math.inf, infs.pop())
            continue
        means = {sum((Fraction(col[j]) for j in g), Fraction(0)) / len(g) for g in groups.values()}
        if len(means) == 1:  # rational: every group of equal logits has this mean
            res[c] = round_fraction(means.pop(), fmt)
            continue
        todo.append(c)
    P = 64
    dy = {j: xr.dyadic(d[j]) for j in fin}
    nb = len(z).bit_length() + 4
    while todo:
        W = P + 16 + nb
        ints = {}
        for j in fin:
            n, e = dy[j]
            if n == 0:
                ints[j] = (1 << W, 1 << W, -W)
            elif xr.approx(n, e) < -(W + 8) * 0.6931:
                ints[j] = (0, 1, -W)
            else:
                ints[j] = xr.exp_interval(n, e, W)
        d_lo, d_hi = xr.add_intervals(ints.values(), -W)
        left = []
        for c in todo:
            terms = []
            emin_v = 0
            for j in fin:
                v = Vl[j][c]
                if v != 0:
                    nv, ev = xr.dyadic(v)
                    lo, hi, sh = ints[j]
                    a, b = (lo * nv, hi * nv) if nv > 0 else (hi * nv, lo * nv)
                    terms.append((a, b, sh + ev))
                    emin_v = min(emin_v, ev)
            sN = -W - nb + emin_v
            n_lo, n_hi = xr.add_intervals(terms, sN)
            F = P + 16 + max(0, d_hi.bit_length() - max(abs(n_lo), abs(n_hi), 1).bit_length())  # P + 16 bits
            lo = (n_lo << F) // (d_hi if n_lo >= 0 else d_lo)
            hi = -((-(n_hi << F)) // (d_lo if n_hi >= 0 else d_hi))
            v = xr.round_interval(lo, hi, sN + W - F, *fmt.params)
            if v is None:
                left.append(c)
            else:
                res[c] = v
        todo = left
        P *= 2
        if P > 1 << 20:
            raise RuntimeError(f"{OP}: the exact path did not converge (a bug: please report the input)")
    return res
