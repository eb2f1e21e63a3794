"""The backward of ``scaled_dot_product_attention``, correctly rounded: the real-valued derivative of
the definition at the given inputs, rounded once to the query's dtype.

Per output batch b and query row i (logits ``z_ij = s q_i . k_j + m_ij``, ``P = softmax(z)`` row-wise
with real exp, ``dO`` the gradient arriving):

    dP_ij = dO_i . v_j,   Delta_i = sum_j P_ij dP_ij,   dS_ij = P_ij (dP_ij - Delta_i),
    dq_i = s sum_j dS_ij k_j,   dk_j = s sum_i dS_ij q_i,   dv_j = sum_i P_ij dO_i,

each gradient element summed over every output batch that reads it (broadcast batch dimensions,
and the query heads of a key/value head with ``enable_gqa``), rounded once. A fully masked row has
``P = 0`` (torch's math backend: the forward is the constant 0 there), hence no gradient. A row with
a NaN or +inf logit (a NaN or +inf mask value) makes NaN every element it reaches: its dq row, and
every dk and dv element of its key/value batch. Non-finite query, key, value or grad_output are
refused (:func:`attention_backward`).

Method (Ziv's strategy, as :mod:`refkern.kernels.softmax_backward`). float16/bfloat16/float32
inputs: a float64 pass (:func:`_fast_rows`, :func:`_fast_reduce`) evaluates every element with a
rigorous error bound and rounds both ends of the interval; elements whose ends round apart, every
element a row with a large error reaches, and every element of a float64 result go to the exact
path (:class:`_Exact`): exact logits and dP as sums of integer products (each operand a Python int
at one exponent per tensor, :class:`_Ints`), the exponentials as rigorous integer intervals in units
of ``2**-(w + 16)`` (at the first width ``w = 96`` from the double-word :func:`exp_dd`, relative error
``2**-99``; then from :func:`refkern.kernels._exact_real.exp_interval`), and per row ``S = sum_k E_k``,
``T = sum_k dP_k E_k`` on integers, so that ``P_j = E_j / S`` and ``dS_j = E_j (dP_j S - T) / S**2`` cost
O(1) each (rounded outward to dyadics of about w + 8 bits), summed per element as Fraction intervals at
doubling widths until both ends round alike. (The earlier form, Fractions throughout and dP recomputed
for every element a row reached, took 411 s wall, 358 s CPU, at (1, 8, 128, 64) float32 for 80
undecided elements; this one 5.3 s wall, 2.6 s CPU, the float64 pass included.)

Rational results are found first and computed exactly (the interval loop would not end on a
representable value or a midpoint): rows whose finite logits are all equal (``P = 1/c``), and ``dS_ij``
that vanish exactly (for every group of equal logits, ``sum_{k in group} (dP_ij - dP_ik) = 0``: by
Lindemann-Weierstrass the exponentials of distinct rational logits are linearly independent over the
rationals, so this is the only way ``dS_ij = e**a_j sum_k e**a_k (dP_ij - dP_ik) / S**2`` is 0). An
element whose every term is then exact is that exact rational, rounded once. Before that, the terms of
rows with equal logits (and values) are merged exactly (P_j is shared, dS is linear in the gradient
row: :meth:`_Exact.element`; such a combined row keeps its dP and intervals in Fractions), so rows that
cancel (e.g. two identical query rows with opposite dO: dk = dv = 0) are found exactly. A row alone in
its group keeps its own intervals, which every element reading it shares. Within one row, terms whose
sum is rational are found once two widths have not decided the element (:func:`_row_sum`: e.g.
``sum_j dS_ij = 0``, so a dq element whose key column is constant over the row's finite keys is exactly
0; common in bfloat16 under a causal mask, where a row has few keys). Then, across rows (:func:`_classes`),
the element's terms are grouped by their row's S up to a factor (rows whose logits are permutations of
one another, a row that sees another's keys each repeated): each group sums to ``A / S0**2`` (``A / S0``
for P terms), A and S0 exponential sums with rational coefficients and distinct rational exponents, which
is rational iff ``A = q S0**2`` coefficient by coefficient (Lindemann-Weierstrass). Undecided at 3072
bits, the groups are tested together over the product of their denominators (:func:`_rational_across`,
up to _ACROSS_CAP terms: S that share a polynomial factor in ``e**h``). An exact 0 is +0. Beyond the cap,
or for an irrational value within ``2**-65536`` of a rounding boundary, the loop stops with a
RuntimeError at 2**16 bits rather than return a guess.
"""

import math
import operator
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import Format
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._transcendental import EXP_DD_REL, EXP_FAST_REL, X_MIN, U, bracket_around, exp_dd, exp_fast
from refkern.kernels.attention import Attention, _exact_logits, _mask_row, _mask_value
from refkern.kernels.softmax_backward import _decided, _exp_iv, _iv_add, _iv_mul, _iv_scale

__all__ = ["attention_backward", "AttnBackCounts"]

OP = "scaled_dot_product_attention"
_TINY = 2.0**-1074


@jit(parallel=True)
def _fast_rows(Q, K, V, G, iq, ik, iv, M3, im, has_mask, causal, scale, P, eP, dS, edS, status):
    """Per row (b, i): P (float64), eP >= |P - P_exact|, dS, edS >= |dS - dS_exact|, status (0 fine,
    1 for the exact path, 2 NaN row, 3 fully masked). Inputs of a narrow format, finite.

    Bounds (u = 2**-53, ``gamma_n <= 1.01 n u``; 2**-1074 for each quantity that may underflow):

    * ``q . k_j`` summed in float64 from exact products: within ``gamma_E A_j``, ``A_j = sum |q_l k_jl|``;
      ``t = fl(s dot)`` and ``z_j = fl(t + m_j)`` add ``u (|t| + |z_j|)``: ``ez_j`` (the forward's bound,
      :func:`refkern.kernels.attention._fast_weights`).
    * ``p_j = e**(z_j - M)`` (M the largest computed logit, a float; softmax is invariant under the
      shift) by exp_fast within ``eps_j = EXP_FAST_REL + 1.02 (|dd_j| + ez_j + ez_M)`` relative (the
      argument's error, below 2**-20, moves e**x by at most 1.01 of it), 0 below e**X_MIN (2**-1074 each);
      ``D = sum p_j`` within ``ED = (sum eps_j p_j + (n - 1) u D) 1.01 + S 2**-1074``; ``P_j = p_j fl(1/D)``
      within ``eP_j = P_j (eps_j + ED / D + 2u) 1.02 + 2**-1073`` (softmax backward's ``ey``).
    * ``dP_j = dO_i . v_j`` from exact products within ``edP_j = gamma_Ev sum_c |dO_ic v_jc|``;
      ``Delta = sum_j P_j dP_j`` within ``eDel = (sum_j (eP_j |dP_j| + (P_j + eP_j) edP_j) + 2 (S + 1) u
      sum_j |P_j dP_j|) 1.01 + S 2**-1074`` (S products and S - 1 additions, each operand off by its bound);
      ``h_j = dP_j - Delta`` within ``eh_j = (edP_j + eDel + u |h_j|) 1.01``; ``dS_j = P_j h_j`` within
      ``(eP_j (|h_j| + eh_j) + P_j eh_j + u |dS_j| + 2**-1074) 1.01``.

    A row whose logit error exceeds 2**-20 (large logits) or whose ``ED / D`` does goes to the exact path. A
    row with one finite logit (the first row of a causal call) is exact: ``P = 1``, ``dS = 0``, no error."""
    B, L, S = P.shape
    E = Q.shape[2]
    Ev = V.shape[2]
    gE = 1.01 * E * U
    gV = 1.01 * Ev * U
    for t in prange(B * L):
        b = t // L
        i = t % L
        q = Q[iq[b], i]
        Kb = K[ik[b]]
        Vb = V[iv[b]]
        g = G[b, i]
        z = np.empty(S)
        ez = np.empty(S)
        st = 0
        M = -np.inf
        eM = 0.0
        for j in range(S):
            m = _mask_value(M3, im[b], i, j, causal, has_mask)
            if m != m or m == np.inf:
                st = 2
                break
            if m == -np.inf:
                z[j] = -np.inf
                continue
            dot = 0.0
            A = 0.0
            for l in range(E):
                pr = q[l] * Kb[j, l]  # exact: narrow inputs
                dot += pr
                A += abs(pr)
            ts = scale * dot
            zj = ts + m
            z[j] = zj
            ez[j] = (abs(scale) * gE * A + U * (abs(ts) + abs(zj))) * (1.0 + 2.0**-50) + 2.0 * _TINY
            if zj > M:
                M = zj
                eM = ez[j]
        if st == 0 and M == -np.inf:
            st = 3
        for j in range(S):
            P[b, i, j] = 0.0
            eP[b, i, j] = 0.0
            dS[b, i, j] = 0.0
            edS[b, i, j] = 0.0
        if st != 0:
            status[b, i] = st
            continue
        nfin = 0
        for j in range(S):
            if z[j] != -np.inf:
                nfin += 1
                jf = j
        if nfin == 1:  # one key: P = 1 and dS = P (dP - P dP) = 0 exactly
            P[b, i, jf] = 1.0
            status[b, i] = 0
            continue
        eps = np.zeros(S)
        Dsum = 0.0
        esum = 0.0
        cnt = 0
        for j in range(S):
            if z[j] == -np.inf:
                continue
            d, dd = two_sum(z[j], -M)
            ed = abs(dd) + ez[j] + eM
            if ed > 2.0**-20:
                st = 1
                break
            if d < X_MIN:  # e**d < 2**-2885: inside the slack
                continue
            a, k = exp_fast(d)
            P[b, i, j] = math.ldexp(a, k)
            eps[j] = EXP_FAST_REL + 1.02 * ed
            Dsum += P[b, i, j]
            esum += eps[j] * P[b, i, j]
            cnt += 1
        ED = (esum + max(cnt - 1, 0) * U * Dsum) * 1.01 + S * _TINY
        rho = ED / Dsum
        if st == 1 or not rho < 2.0**-20:
            status[b, i] = 1
            continue
        inv = 1.0 / Dsum
        dP = np.empty(S)
        edP = np.empty(S)
        Del = 0.0
        AP = 0.0
        eD = 0.0
        for j in range(S):
            s1 = 0.0
            a1 = 0.0
            for c in range(Ev):
                pr = g[c] * Vb[j, c]  # exact
                s1 += pr
                a1 += abs(pr)
            dP[j] = s1
            edP[j] = gV * a1
            if z[j] == -np.inf:
                continue
            pj = P[b, i, j] * inv
            P[b, i, j] = pj
            eP[b, i, j] = pj * (eps[j] + rho + 2.0 * U) * 1.02 + 2.0 * _TINY
            tj = pj * s1
            Del += tj
            AP += abs(tj)
            eD += eP[b, i, j] * abs(s1) + (pj + eP[b, i, j]) * edP[j]
        eDel = (eD + 2.0 * (S + 1) * U * AP) * 1.01 + S * _TINY
        for j in range(S):
            if z[j] == -np.inf:
                continue
            h = dP[j] - Del
            eh = (edP[j] + eDel + U * abs(h)) * 1.01
            v = P[b, i, j] * h
            dS[b, i, j] = v
            edS[b, i, j] = (eP[b, i, j] * (abs(h) + eh) + P[b, i, j] * eh + U * abs(v) + _TINY) * 1.01
        status[b, i] = 0


@jit(parallel=True)
def _fast_reduce(W, eW, X, ix, order, starts, rstat, scale, prec, emin, emax, out, und):
    """out[t, r, c] = RN(scale sum_{b in group t} sum_k W[b, r, k] X[ix[b], k, c]) when the bound decides
    it, else und[t, r, c]. W within eW of the exact weights (elementwise); rstat[b, r] is the largest
    status of the rows the element reads (1: undecided, 2: NaN).

    With n the number of terms, the float64 sum of the rounded products is within ``gamma_n sum |W X|``
    (n products, n - 1 additions) plus n 2**-1074 (underflowing products) of ``sum W X``, and that within
    ``sum eW |X|`` of the exact sum; the product by ``scale`` adds u of the result. The float64 sums of
    the bound's own terms err by at most gamma_n of them: the factor 1.02 (n u < 0.005). Where every
    computed product is 0 and the error sum is 0, every term is exactly 0 (x = 0, or a weight known
    exactly to be 0, whose eW is 0; any other weight has ``eW >= 2**-1073``): the sum is +0."""
    T, R, C = out.shape
    Kd = W.shape[2]
    for t in prange(T * R):
        tt = t // R
        r = t % R
        st = 0
        for p in range(starts[tt], starts[tt + 1]):
            st = max(st, rstat[order[p], r])
        if st == 2:
            for c in range(C):
                out[tt, r, c] = np.nan
            continue
        if st == 1:
            for c in range(C):
                und[tt, r, c] = True
            continue
        n = (starts[tt + 1] - starts[tt]) * Kd
        for c in range(C):
            acc = 0.0
            ab = 0.0
            er = 0.0
            for p in range(starts[tt], starts[tt + 1]):
                b = order[p]
                Xb = X[ix[b]]
                for k in range(Kd):
                    x = Xb[k, c]
                    pr = W[b, r, k] * x
                    acc += pr
                    ab += abs(pr)
                    er += eW[b, r, k] * abs(x)
            if ab == 0.0 and er == 0.0:  # every term exactly 0 (x = 0, or an exact weight of 0): the sum is +0
                out[tt, r, c] = 0.0
                continue
            v = scale * acc
            e = (abs(scale) * (er + 1.01 * (n + 1) * U * ab + n * _TINY) * 1.02 + U * abs(v) + _TINY) * 1.01
            val, ok = bracket_around(v, e, False, prec, emin, emax)
            out[tt, r, c] = val
            und[tt, r, c] = not ok


def _groups(idx: np.ndarray, n: int):
    """CSR of the output batches reading each of the n batches of an operand: (order, starts)."""
    order = np.argsort(idx, kind="stable").astype(np.int64)
    starts = np.searchsorted(idx[order], np.arange(n + 1)).astype(np.int64)
    return order, starts


# ---------------------------------------------------------------- the exact path


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


_W0 = 96  # the first width of Ziv's loop: the exponentials from exp_dd (relative 2**-99)


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


class _Exact:
    """The exact path over one call: rows built once (logits and dP as integer dot products), then each
    undecided element by Ziv's loop."""

    def __init__(self, a: Attention, G: np.ndarray):
        self.a, self.G = a, G
        self.rows = {}
        self.sF = Fraction(a.scale) if math.isfinite(a.scale) else None
        p = a.fmt.prec
        self.Qi, self.Ki, self.Vi, self.Gi = _Ints(a.Q, p), _Ints(a.K, p), _Ints(a.V, p), _Ints(G, p)
        self._kids = {}

    def _logits(self, b: int, i: int):
        """The row's logits as (z, ze): each "nan", "+inf", "-inf" or an integer n, the logit ``n 2**ze``
        (as :func:`refkern.kernels.attention._exact_logits` defines them)."""
        a = self.a
        mrow = _mask_row(a, b, i).tolist()
        if self.sF is None or a.Q.shape[2] == 0:
            z = _exact_logits(a.Q[a.iq[b]][i], a.K[a.ik[b]], np.asarray(mrow), a.scale)
            z = [t if isinstance(t, str) else xr.dyadic(t) for t in z]
            ze = min((t[1] for t in z if not isinstance(t, str)), default=0)
            return [t if isinstance(t, str) else t[0] << (t[1] - ze) for t in z], ze
        sn, se = xr.dyadic(a.scale)
        ed = se + self.Qi.e + self.Ki.e  # s q.k_j = sn dot_j 2**ed
        ms = [xr.dyadic(m) for m in mrow if m == m and abs(m) != math.inf and m != 0]
        ze = min([ed] + [e for _, e in ms])
        q = self.Qi.rows(int(a.iq[b]))[i]
        Kb = self.Ki.rows(int(a.ik[b]))
        out = []
        for j, m in enumerate(mrow):
            if m != m or m == math.inf:
                out.append("nan" if m != m else "+inf")
            elif m == -math.inf:
                out.append("-inf")
            else:
                zj = (sn * _idot(q, Kb[j])) << (ed - ze)
                if m != 0:
                    mn, me = xr.dyadic(m)
                    zj += mn << (me - ze)
                out.append(zj)
        return out, ze

    def row(self, b: int, i: int) -> _Row:
        r = self.rows.get((b, i))
        if r is None:
            z, ze = self._logits(b, i)
            dpn = None
            if not any(isinstance(t, str) and t != "-inf" for t in z):
                g = self.Gi.rows(b)[i]
                Vb = self.Vi.rows(int(self.a.iv[b]))
                dpn = {j: _idot(g, Vb[j]) for j, t in enumerate(z) if not isinstance(t, str)}
            r = _Row(z, ze, int(self.a.iv[b]), dpn, self.Gi.e + self.Vi.e)
            if r.state == "ok":  # equal logits, one small int (hashing the key once)
                r.kid = self._kids.setdefault(r.key, len(self._kids))
            self.rows[(b, i)] = r
        return r

    def element(self, terms, scaled: bool, fmt: Format) -> float:
        """RN of ``(s) sum coef * X`` over terms (row, j, kind, coef): X the row's P_j ("P") or dS_j ("dS").

        Terms of rows with equal logits (and, for dS, the same values) are merged first, exactly: ``sum c P_j``
        is ``P_j sum c``, and ``sum c dS_j(g)`` is ``dS_j(sum c g)`` (dS is linear in the gradient row), so
        contributions of such rows that cancel are found exactly (the combined dS passes the zero test). A
        row alone in its group keeps its own dS_j (times its coefficient): its intervals serve every element
        that reads it."""
        live = [(r, j, kind, Fraction(float(cf))) for r, j, kind, cf in terms if r.state != "masked"]
        if any(r.state == "nan" for r, _, _, _ in live):
            return math.nan
        sF = self.sF if scaled else Fraction(1)
        if sF is None:
            raise ValueError(f"{OP} backward: the scale must be finite; got scale={self.a.scale}.")
        merged = {}
        for r, j, kind, cf in live:
            if j not in r.an or cf == 0:
                continue
            if kind == "P":
                k = (r.kid, j, kind)
                ent = merged.get(k)
                merged[k] = [r, cf + (ent[1] if ent else 0)]
            else:
                merged.setdefault((r.kid, r.vkey, j, kind), [None, []])[1].append((r, cf))
        exact = Fraction(0)
        todo = []
        for k, (r, c) in merged.items():
            j, kind = k[-2], k[-1]
            if kind == "P":
                if c == 0:
                    continue
                x = r.P_exact(j)
            else:
                parts = {}
                for p, cf in c:  # the same row twice: one coefficient
                    parts[id(p)] = (p, parts[id(p)][1] + cf if id(p) in parts else cf)
                parts = list(parts.values())
                if len(parts) == 1:
                    r, c = parts[0]
                    if c == 0:
                        continue
                else:
                    r, c = parts[0][0].combined(parts), Fraction(1)
                x = r.dS_exact(j)
            if x is not None:
                exact += c * x
            else:
                todo.append((r, j, kind, c))
        if not todo:
            return round_fraction(sF * exact, fmt)
        w = _W0
        left, across = [], None
        while True:
            acc = (exact, exact)
            for r, j, kind, cf in todo:
                acc = _iv_add(acc, _iv_scale(cf, r.interval(j, kind, w)))
            v = _decided(_iv_scale(sF, acc), fmt)
            if v is not None:
                return v
            w *= 2
            if w == 4 * _W0:  # undecided at two widths: the terms may sum to a rational (an exact 0, a midpoint)
                exact, todo, left = _rational_rows(exact, todo)
                if not todo:
                    return round_fraction(sF * exact, fmt)
            if w == 64 * _W0 and len(left) > 1:  # undecided at 3072 bits: the classes together (costlier)
                across, q = _rational_across(left)
                if across == "rational":
                    return round_fraction(sF * (exact + q), fmt)
            if w > 1 << 16:
                why = f"more than {_ACROSS_CAP} terms to test its {len(left)} classes of rows together"
                if across != "unknown":
                    why = "an irrational value this close to a rounding boundary"
                raise RuntimeError(f"{OP} backward: the exact path did not converge at 2**16 bits ({why}): "
                                   "please report the input")  # fmt: skip


def _row_sum(r: _Row, cs: dict):
    """``sum_j c_j dS_j`` of one row when it is rational (its exact value), else None; cs: {j: c_j} Fractions.

    ``sum_j c_j dS_j = N / S**2`` with ``N = sum_{j<k} E_j E_k (c_j - c_k)(dP_j - dP_k)`` (j, k over the finite
    logits, ``c = 0`` where absent) and ``S**2 = sum_{j,k} E_j E_k``. Group both by the exponent
    ``a_j + a_k``: ``C_t`` and ``D_t`` (ordered pairs counted). By Lindemann-Weierstrass the exponentials of
    distinct rationals are linearly independent over the rationals, so ``N / S**2`` is a rational ``q`` iff
    ``C_t = q D_t`` for every t; ``D_0 >= 1`` (the top logit with itself) gives ``q = C_0 / D_0``. This is the
    case of ``sum_j dS_j = 0`` (a dq element whose key column is constant over the row: every
    ``c_j - c_k = 0``)."""
    ns = {j: xr.dyadic(c) for j, c in cs.items()}
    ec = min((e for _, e in ns.values()), default=0)
    ci = {j: n << (e - ec) for j, (n, e) in ns.items()}  # c_j = ci[j] 2**ec
    dP, edp = (r.dpn, r.edp) if r.dpn is not None else (r.dP, 0)
    an, fin = r.an, r.fin
    C, D = {}, {}
    for x, j in enumerate(fin):
        aj, cj, dj = an[j], ci.get(j, 0), dP[j]
        D[2 * aj] = D.get(2 * aj, 0) + 1
        for k in fin[x + 1 :]:
            t = aj + an[k]
            D[t] = D.get(t, 0) + 2
            u = (cj - ci.get(k, 0)) * (dj - dP[k])
            if u:
                C[t] = C.get(t, 0) + u
    q = Fraction(C.get(0, 0)) / D[0]
    if any(C.get(t, 0) != q * d for t, d in D.items()):
        return None
    return q * _frac(1, ec) * (_frac(1, edp) if r.dpn is not None else 1)


def _rational_rows(exact, todo):
    """(exact, todo, left): the terms of todo whose sums are rational moved into exact, first row by row (a
    row's dS terms, two or more: :func:`_row_sum`), then class by class (:func:`_classes`: rows whose S are
    proportional, their terms over one denominator); left: the classes whose sum is irrational, for
    :func:`_rational_across`."""
    by_row = {}
    for t in todo:
        if t[2] == "dS":
            by_row.setdefault(id(t[0]), []).append(t)
    done = set()
    for key, ts in by_row.items():
        if len(ts) < 2:
            continue
        cs = {}
        for _, j, _, c in ts:
            cs[j] = cs.get(j, 0) + c
        v = _row_sum(ts[0][0], cs)
        if v is not None:
            exact += v
            done.add(key)
    tested = {key for key, ts in by_row.items() if len(ts) > 1} - done  # irrational: no class of one of them alone
    if done:
        todo = [t for t in todo if t[2] != "dS" or id(t[0]) not in done]
    q, keep, left = _classes(todo, tested)
    return exact + q, keep, left


def _xmul(a: dict, b: dict) -> dict:
    """The product of two exponential sums ``{t: c}`` (``sum_t c e**(t h)``, one step h): exponents add."""
    out = {}
    for t, c in a.items():
        for u, d in b.items():
            out[t + u] = out.get(t + u, 0) + c * d
    return out


def _ints(vals) -> int:
    """The least common denominator of the Fractions vals (1 when none)."""
    return math.lcm(1, *(v.denominator for v in vals))


def _dP_ints(r: _Row):
    """``({j: n_j}, L)`` with the row's ``dP_j = n_j / L`` exactly, integers."""
    if r.dpn is not None:
        if r.edp >= 0:
            return {j: n << r.edp for j, n in r.dpn.items()}, 1
        return r.dpn, 1 << -r.edp
    L = _ints(r.dP.values())
    return {j: d.numerator * (L // d.denominator) for j, d in r.dP.items()}, L


def _norm_S(r: _Row):
    """``(key, lam)``: the row's ``S = sum_k e**a_k = lam S0`` with ``S0 = sum_t m_t e**(t 2**ae)``, the
    multiplicities m_t of its offsets divided by their gcd lam; key = (ae, S0's terms). Rows of one key have
    proportional S: the same logits permuted (lam equal), or a row that sees another's keys each repeated."""
    c = r.__dict__.get("_S0")
    if c is None:
        m = {}
        for a in r.an.values():
            m[a] = m.get(a, 0) + 1
        lam = math.gcd(*m.values())
        c = r._S0 = ((r.ae, tuple(sorted((t, n // lam) for t, n in m.items()))), lam)
    return c


def _ratio(A: dict, D: dict):
    """``A / D`` when it is a rational (its value, a Fraction), else None: exponential sums of integer
    coefficients and exponents <= 0, ``D_0 > 0``: by Lindemann-Weierstrass rational iff ``A = q D`` term by term."""
    a0, d0 = A.get(0, 0), D[0]
    if any(A.get(t, 0) * d0 != a0 * D.get(t, 0) for t in A.keys() | D.keys()):
        return None
    return Fraction(a0, d0)


def _classes(todo, tested=frozenset()):
    """``(q, keep, left)``: the terms of todo (row, j, kind, coef) split into classes of rows with
    proportional S (:func:`_norm_S`); q the exact sum of the classes whose sum is rational, keep the others'
    terms, left their exponential sums ``(A, L, S0, dS, ae)`` (the class's sum is ``A / (L D)``, D = S0 or
    S0**2) for :func:`_rational_across`. A class known irrational (one P term; one row whose dS terms
    :func:`_row_sum` found irrational, its id in tested) only gets its A, for left.

    Derivation. A row of offsets ``a_k = an_k 2**ae`` (``an_k <= 0`` integers, one of them 0), ``E_k =
    e**a_k``, ``S = sum_k E_k = lam S0`` and ``T = sum_k dP_k E_k``: ``P_j = E_j / S``, ``dS_j = E_j (dP_j S -
    T) / S**2``. Over the class's common ``S0``: ``c P_j = (c / lam) E_j / S0`` (``(c / lam) E_j S0 / S0**2``
    when the class has dS terms) and ``c dS_j = ((c dP_j / lam) E_j S0 - (c / lam**2) E_j T) / S0**2``. So the
    class sums to ``A / S0**2``, ``A = S0 U - sum_rows W_r T_r`` with ``U = sum (c / lam) E_j`` (P terms) ``+
    sum (c dP_j / lam) E_j`` (dS terms) and ``W_r = sum (c / lam_r**2) E_j`` (the dS terms of row r); or to ``U
    / S0`` with P terms alone. A, S0 and S0**2 are sums ``sum_t C_t x**t``, ``x = e**(2**ae)``, of rational
    C_t and integer t (exponents add in products). By Lindemann-Weierstrass e**b for distinct rational b are
    linearly independent over the rationals, so ``A / D`` is a rational q iff ``A = q D`` coefficient by
    coefficient, where ``q = A_0 / D_0`` (``D_0 >= 1``: the top logit with itself); else it is irrational.
    On integers: A times the common denominator L of its coefficients. Cheap refusals before D = S0**2 is
    formed: A_0 = 0 with A != 0, or A without the term of D at ``2 min t`` (where D's coefficient is > 0)."""
    classes = {}
    for t in todo:
        key, lam = _norm_S(t[0])
        classes.setdefault(key, []).append((t, lam))
    q, keep, left = Fraction(0), [], []
    for (ae, S0t), ts in classes.items():
        ids = {id(t[0]) for t, _ in ts}
        one_p = len(ts) == 1 and ts[0][0][2] == "P"  # c E_j / S: irrational (S has two distinct offsets or more)
        one_row = len(ids) == 1 and ids <= tested and all(t[2] == "dS" for t, _ in ts)  # _row_sum's: irrational
        known = one_p or one_row
        S0 = dict(S0t)
        U, W, Tr = {}, {}, {}
        for (r, j, kind, c), lam in ts:
            t = r.an[j]
            if kind == "P":
                U[t] = U.get(t, 0) + c / lam
                continue
            if id(r) not in Tr:
                n, L = _dP_ints(r)
                T = {}
                for k, a in r.an.items():
                    if n[k]:
                        T[a] = T.get(a, 0) + n[k]
                Tr[id(r)] = (T, L)
            L = Tr[id(r)][1]
            U[t] = U.get(t, 0) + c * r.dP[j] / lam
            w = W.setdefault(id(r), {})
            w[t] = w.get(t, 0) + c / (lam * lam * L)  # W_r / L_r: times T's integers
        dS = bool(W)
        Lc = _ints([*U.values(), *(x for w in W.values() for x in w.values())])
        Ui = {t: int(x * Lc) for t, x in U.items() if x}
        if dS:
            A = _xmul(S0, Ui)
            for k, w in W.items():
                for t, x in _xmul({t: int(x * Lc) for t, x in w.items() if x}, Tr[k][0]).items():
                    A[t] = A.get(t, 0) - x
        else:
            A = Ui
        A = {t: x for t, x in A.items() if x}
        if not A:
            continue  # the class sums to 0 exactly
        tmin = 2 * min(S0) if dS else min(S0)
        if not known and A.get(0, 0) and A.get(tmin, 0):
            v = _ratio(A, _xmul(S0, S0) if dS else S0)
            if v is not None:
                q += v / Lc
                continue
        keep.extend(t for t, _ in ts)
        left.append((A, Lc, S0, dS, ae))
    return q, keep, left


_ACROSS_CAP = 1 << 16  # the most terms the product of the classes' denominators may have


def _rational_across(left):
    """("rational", q), ("irrational", None) or ("unknown", None) (the product of the denominators would
    exceed _ACROSS_CAP terms): the classes left by :func:`_classes` (two or more, each of an irrational sum)
    together. Classes of non-proportional S cancel only when their S share a factor as polynomials in
    ``e**h`` (h the smallest step of their exponents: exponents ``t 2**ae`` become ``t 2**(ae - min ae)``):
    ``sum_r A_r / (L_r D_r)`` is a rational q iff ``sum_r A_r prod_{r' != r} L_r' D_r' = q prod_r L_r D_r``
    coefficient by coefficient (Lindemann-Weierstrass, as in :func:`_classes`; ``prod L_r D_r`` has a
    coefficient > 0 at 0)."""
    bound = 1
    for _, _, S0, dS, _ in left:
        n = len(S0)
        bound *= n * (n + 1) // 2 if dS else n
    if bound > _ACROSS_CAP:
        return "unknown", None
    e0 = min(ae for *_, ae in left)
    F, G = {}, {0: 1}
    for A, L, S0, dS, ae in left:  # F / G = the sum so far: (F D + A G) / (G D)
        sh = ae - e0
        D = _xmul(S0, S0) if dS else S0
        D = {t << sh: x * L for t, x in D.items()}
        A = {t << sh: x for t, x in A.items()}
        F = _xmul(F, D)
        for t, x in _xmul(A, G).items():
            F[t] = F.get(t, 0) + x
        G = _xmul(G, D)
    v = _ratio({t: x for t, x in F.items() if x}, G)
    return ("irrational", None) if v is None else ("rational", v)


class AttnBackCounts:
    """How many elements each path decided (tests)."""

    def __init__(self):
        self.elements = 0
        self.exact_elements = 0


def attention_backward(a: Attention, G: np.ndarray, wrt, force_exact: bool = False):
    """({"query": (Bq, L, E), "key": (Bk, S, E), "value": (Bv, S, Ev)} float64 gradients of the names in wrt,
    values of a.fmt, AttnBackCounts). G: grad_output as float64 (B, L, Ev). Every input must be finite."""
    B = a.iq.size
    L, S = a.Q.shape[1], a.V.shape[1]
    fmt = a.fmt
    counts = AttnBackCounts()
    shapes = {"query": a.Q.shape, "key": a.K.shape, "value": a.V.shape}
    out = {k: np.zeros(shapes[k]) for k in wrt}
    und = {k: np.zeros(shapes[k], np.bool_) for k in wrt}
    counts.elements = sum(v.size for v in out.values())
    if B * L * S == 0 or not counts.elements:
        return out, counts
    grp = {"query": _groups(a.iq, a.Q.shape[0]), "key": _groups(a.ik, a.K.shape[0]),
           "value": _groups(a.iv, a.V.shape[0])}  # fmt: skip
    if fmt.prec < 53 and not force_exact:
        P, eP, dS, edS = (np.empty((B, L, S)) for _ in range(4))
        status = np.zeros((B, L), np.int64)
        _fast_rows(a.Q, a.K, a.V, np.ascontiguousarray(G), a.iq, a.ik, a.iv, a.mask, a.im, a.has_mask, a.causal,
                   a.scale, P, eP, dS, edS, status)  # fmt: skip
        st = np.where(status == 3, 0, status)  # a fully masked row: P = 0, decided
        st_b = np.broadcast_to(st.max(axis=1, keepdims=True), (B, S)).copy()

        def tr(x):
            return np.ascontiguousarray(x.transpose(0, 2, 1))

        for k in wrt:
            order, starts = grp[k]
            if k == "query":
                _fast_reduce(dS, edS, a.K, a.ik, order, starts, st, a.scale, *fmt.params, out[k], und[k])
            elif k == "key":
                _fast_reduce(tr(dS), tr(edS), a.Q, a.iq, order, starts, st_b, a.scale, *fmt.params, out[k], und[k])
            else:
                _fast_reduce(tr(P), tr(eP), np.ascontiguousarray(G), np.arange(B, dtype=np.int64), order, starts,
                             st_b, 1.0, *fmt.params, out[k], und[k])  # fmt: skip
    else:
        for k in wrt:
            und[k][:] = True
    if not any(u.any() for u in und.values()):
        return out, counts
    ex = _Exact(a, G)
    for k in wrt:
        order, starts = grp[k]
        for t, r, c in zip(*np.nonzero(und[k])):
            bs = order[starts[t] : starts[t + 1]].tolist()
            if k == "query":
                terms = [(ex.row(b, r), j, "dS", a.K[a.ik[b], j, c]) for b in bs for j in range(S)]
            elif k == "key":
                terms = [(ex.row(b, i), r, "dS", a.Q[a.iq[b], i, c]) for b in bs for i in range(L)]
            else:
                terms = [(ex.row(b, i), r, "P", G[b, i, c]) for b in bs for i in range(L)]
            out[k][t, r, c] = ex.element(terms, k != "value", fmt)
            counts.exact_elements += 1
    return out, counts
