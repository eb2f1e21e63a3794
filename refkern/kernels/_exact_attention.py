"""The exact path of the attention backward (:mod:`refkern.kernels.attention_backward`, whose docstring
derives it), part 2: each undecided element summed from its rows at doubling widths (:class:`_Exact`),
the rational results found first (equal rows merged, :func:`_row_sum`, :func:`_rational_rows`), and the
tests of rationality across rows (:func:`_classes`, :func:`_rational_across`)."""

import math
from fractions import Fraction

import numpy as np

from refkern.accumulate.formats import Format
from refkern.accumulate.ziv import round_fraction
from refkern.kernels import _exact_real as xr
from refkern.kernels._exact_attention_row import (
    _W0,
    OP,
    _dv_exp,
    _dv_mul,
    _dv_q,
    _dv_sum,
    _exact_logits,
    _frac,
    _idot,
    _Ints,
    _Row,
    exp_far,
)
from refkern.kernels.attention import Attention, _mask_row
from refkern.kernels.softmax_backward import _decided, _iv_add, _iv_scale


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
        (as :func:`refkern.kernels._exact_attention_row._exact_logits` defines them)."""
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
            if w < _SCALED_W:
                acc = (exact, exact)
                for r, j, kind, cf in todo:
                    acc = _iv_add(acc, _iv_scale(cf, r.interval(j, kind, w)))
                v = _decided(_iv_scale(sF, acc), fmt)
            else:  # past the rationality tests: every term to w bits of its own size (offsets far apart)
                v = _scaled(exact, todo, sF, fmt, w)
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


_SCALED_W = 4 * _W0  #: from this width on (after the tests of rationality within rows), :func:`_scaled` evaluates them


def _scaled(exact: Fraction, todo, sF: Fraction, fmt: Format, w: int):
    """``RN(sF (exact + sum_t c_t X_t))`` over the terms (row, j, kind, c) of todo when every real of the interval
    rounds alike, else None: each term relative to its own size, so that offsets far apart (logits 1e5 or 1e38
    apart: an e**-1e5 that no fixed-point width reaches) decide as near ones do.

    Each ``X_t = R_t + e**b_t Y_t`` (:meth:`~refkern.kernels._exact_attention_row._Row.scaled`: R_t rational, the
    value with every lower exponential at 0, added to exact; ``b_t < 0`` exact, Y_t to K = w + 40 bits of its own
    size). With ``B = max b_t``, the rest is ``e**B Z``, ``Z = sum_t c_t e**(b_t - B) Y_t`` (the
    factors ``e**(b_t - B) <= 1`` relative, or ``[0, 2**-K]``: :func:`~refkern.kernels._exact_attention_row._dv_exp`),
    and ``e**B`` is to K bits (:func:`~refkern.kernels._exact_real.exp_interval`) where ``B >= -2**20``, else to a
    factor 4 (:func:`~refkern.kernels._exact_attention_row.exp_far`: ``e**B < 2**-1.5e6`` there, and ``|sF Z| <
    2**4400`` (``|c| <= 2**1024``, ``|dP| <= 2**2060`` times 2**40 terms, ``|sF| <= 2**1024``), so the product lies
    below the bound T that follows, where its sign alone decides).

    Where the part ``d = sF e**B Z`` is below ``2**-T`` with ``T = bits(q) + p + 1`` (``x0 = sF exact = n / q``, ``p =
    prec - emin``), the rounding of ``x0 + d`` is that of ``x0 + sign(d) 2**-T``: every rounding boundary (a value of
    the format, a midpoint, the overflow threshold) and the sign change of a zero lie on the grid ``2**-p Z``, and a
    grid point ``m 2**-p != x0`` lies at least ``1 / (q 2**p) > 2**-T`` from x0, so no boundary lies strictly between
    x0 and ``x0 + d`` (nor at ``x0 + d``) whatever d's size. That is the dominant term's argument made exact: the
    result needs only the sign of Z, never ``e**B`` to any number of bits. Elsewhere the ends are rounded
    (:func:`refkern.kernels.softmax_backward._decided`), as Fractions of a few thousand bits at most."""
    K = w + 40
    parts = []
    for r, j, kind, c in todo:
        got = r.scaled(j, kind, K)
        if got is not None:
            exact += c * got[0]
            parts.append((_frac(got[1], r.ae), c, got[2]))
    x0 = sF * exact
    if not parts:
        return round_fraction(x0, fmt)
    B = max(b for b, _, _ in parts)
    Z = _dv_sum([_dv_mul(_dv_exp(*xr.dyadic(b - B), K), _dv_q(c, Y, K), K) for b, c, Y in parts], K)
    n, e = xr.dyadic(B)
    if n == 0:
        F = (1, 1, 0)
    elif (n << e if e >= 0 else n >> -e) >= -(1 << 20):
        F = xr.exp_interval(n, e, K)
    else:
        F = exp_far(n, e)
    lo, hi, e = _dv_q(sF, _dv_mul(F, Z, K), K)
    T = x0.denominator.bit_length() + fmt.prec - fmt.emin + 1
    if e + max(abs(lo), abs(hi)).bit_length() <= -T:  # |d| < 2**-T: its sign decides
        if lo > 0 or hi < 0:
            return round_fraction(x0 + (Fraction(1, 1 << T) if lo > 0 else Fraction(-1, 1 << T)), fmt)
        return None
    return _decided((x0 + _frac(lo, e), x0 + _frac(hi, e)), fmt)


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
