"""Ground truth of the gradients of softmax, log_softmax and scaled_dot_product_attention
(:func:`refkern.truth.backward`): exact rationals where the values are rational, intervals of the real
exp and log elsewhere, rounded once. The tests of rationality across rows (:func:`_xmul`, :func:`_ratio`,
:func:`_rational_across`) repeat the algebra of the fast path's (:mod:`refkern.kernels._exact_attention`) on
purpose: the ground truth shares no code with what it checks."""

import math
from fractions import Fraction

import numpy as np

from refkern.truth._backward_common import _values
from refkern.truth.softmax import iv


def _softmax_backward_row(x: list, g: list, fmt, log: bool) -> list:
    """One row of the softmax (log_softmax) gradient from the definition: ``dx_i = y_i sum_j y_j (g_i -
    g_j)`` (``= y_i (g_i - sum_j g_j y_j)``, since the y_j sum to 1), ``dx_i = g_i - y_i sum_j g_j``, on
    mpmath intervals (Ziv's loop of :mod:`refkern.truth.softmax`). A NaN forward or a non-finite g:
    NaN throughout; a -inf logit: ``y_i = 0``. The rational results are decided as exact rationals:
    equal finite logits (``y = 1/c``), a softmax gradient whose ``sum_{j: x_j = a} (g_i - g_j)`` is 0
    for every distinct logit a (the exp terms of distinct rational logits are linearly independent
    over the rationals, Lindemann-Weierstrass: the gradient is 0 exactly then, and irrational
    otherwise), a log_softmax gradient with ``sum_j g_j = 0``."""
    from refkern.truth.softmax import _decide, _ivq, iv

    n = len(x)
    if (
        any(v != v or v == math.inf for v in x)
        or all(v == -math.inf for v in x)
        or not all(math.isfinite(v) for v in g)
    ):
        return [math.nan] * n
    M = Fraction(max(v for v in x if v != -math.inf))
    d = [Fraction(v) - M if v != -math.inf else None for v in x]
    gq = [Fraction(v) for v in g]
    fin = [j for j in range(n) if d[j] is not None]
    total = sum(gq, Fraction(0))
    levels = sorted({d[j] for j in fin})
    out = []
    for i in range(n):
        if d[i] is None:
            out.append(float(g[i]) if log else 0.0)
            continue
        if len(levels) == 1:
            c = len(fin)
            if log:
                q = gq[i] - total / c
            else:
                q = sum((gq[i] - gq[j] for j in fin), Fraction(0)) / (c * c)
            out.append(_decide(fmt, lambda q=q: _ivq(q)))
            continue
        if log and total == 0:
            out.append(float(g[i]))
            continue
        if not log and all(sum((gq[i] - gq[j] for j in fin if d[j] == a), Fraction(0)) == 0 for a in levels):
            out.append(0.0)
            continue

        def make(i=i):
            E = {j: (iv.exp(_ivq(d[j])) if d[j] != 0 else iv.mpf(1)) for j in fin}
            S = iv.mpf(0)
            for j in fin:
                S += E[j]
            yi = E[i] / S
            if log:
                return _ivq(gq[i]) - _ivq(total) * yi
            acc = iv.mpf(0)
            for j in fin:
                acc += E[j] * _ivq(gq[i] - gq[j])
            return yi * acc / S

        out.append(_decide(fmt, make))
    return out


def _softmax_backward(name, G, og, a, wrt):
    from refkern.kernels._common import deliver

    x, ox = _values(a["input"], "input", "truth.backward")
    if a.get("dtype") is not None:  # torch's input.to(dtype) first: the gradient at the converted input
        from refkern._arrays import format_of
        from refkern.truth.softmax import _convert

        x = _convert(x.reshape(-1), ox.fmt, format_of(a["dtype"], "dtype", "truth.backward")).reshape(x.shape)
    dim = a["dim"] % max(x.ndim, 1)
    xs = np.moveaxis(x.reshape(x.shape or (1,)), dim, -1)
    gs = np.moveaxis(G.reshape(x.shape or (1,)), dim, -1)
    rows = [_softmax_backward_row(list(map(float, xr)), list(map(float, gr)), ox.fmt, name == "log_softmax")
            for xr, gr in zip(xs.reshape(-1, xs.shape[-1]), gs.reshape(-1, gs.shape[-1]))]  # fmt: skip
    v = np.moveaxis(np.array(rows, np.float64).reshape(xs.shape), -1, dim).reshape(x.shape)
    return {"input": deliver(v, ox.fmt, og.torch or ox.torch)}


def _attention_backward(name, G, og, a, wrt):
    """scaled_dot_product_attention: every gradient element from the definition (module docstring of
    :mod:`refkern.kernels.attention_backward`) on mpmath intervals, Ziv's loop. Per row: exact logits
    (:func:`refkern.truth.softmax._logit`), ``dP_j = dO_i . v_j`` as a Fraction, ``P = exp(z - max) /
    sum``, ``dS_j = P_j (dP_j - sum_k P_k dP_k)``. Rational values exactly: a row of equal finite logits
    (``P = 1/c``), a ``dS_j`` that vanishes (``sum_{k: z_k = t} (dP_j - dP_k) = 0`` for every distinct
    logit t: Lindemann-Weierstrass), after merging the terms of rows with equal logits (``value``). An
    element the loop leaves undecided at 128 bits may be a rational sum of irrational terms (``sum_j dS_ij =
    0``: a dq element is 0 when its key column is constant over the row's keys; dk, dv terms of rows whose
    logits are permutations of one another): the terms are grouped by their rows' multiset of logits, and
    each group's sum is tested exactly as an exponential sum (:func:`_rational_classes`), then, past 4096
    bits, the groups together (:func:`_rational_across`, up to _ACROSS_CAP terms; beyond it a bounded loop
    and a RuntimeError). An exact 0 is +0.0, the rounding of the real 0 (round_fraction's, the fast path's):
    an exact sum of nonzero terms that is 0 is +0 in IEEE round-to-nearest too, and the positive scale keeps
    it. (torch's math backend applies a negative scale as ``q (-sqrt|s|)``, ``k sqrt|s|``: an exact dS @ k of
    +0 would come back as -0 in its dq; the real derivative has no sign, and its computed value is a
    rounding residue anyway.) A NaN or +inf logit: NaN wherever the row reaches; a fully masked
    row: ``P = 0``. The layout comes from the kernel's validation; the numbers do not."""
    from refkern.kernels._common import deliver
    from refkern.kernels.attention import attention_operands
    from refkern.truth.softmax import _decide, _ivq, _logit, iv

    at = attention_operands(a["query"], a["key"], a["value"], a.get("attn_mask"), a.get("dropout_p", 0.0),
                            a.get("is_causal", False), a.get("scale"), a.get("enable_gqa", False),
                            op="truth.backward")  # fmt: skip
    B = at.iq.size
    L, S = at.Q.shape[1], at.K.shape[1]
    Gb = G.reshape(B, L, -1)
    fmt = at.fmt
    rows = {}

    def with_grad(r, dO):
        """The row r for the gradient row dO (Fractions): dP, and the set of j whose dS vanishes."""
        d, fin = r["d"], r["fin"]
        dP = {j: sum((x * v for x, v in zip(dO, r["V"][j]) if x != 0), Fraction(0)) for j in fin}
        levels = set(d.values())
        zero = {j for j in fin if all(sum((dP[j] - dP[k] for k in fin if d[k] == t), Fraction(0)) == 0 for t in levels)}
        return {**r, "dO": dO, "dP": dP, "zero": zero}

    def row(b, i):
        if (b, i) in rows:
            return rows[(b, i)]
        if at.causal:
            mrow = [(-math.inf if j > i else 0.0) for j in range(S)]
        elif at.has_mask:
            m = at.mask[at.im[b], i if at.mask.shape[1] > 1 else 0]
            mrow = [float(m[j if m.size > 1 else 0]) for j in range(S)]
        else:
            mrow = [0.0] * S
        q = at.Q[at.iq[b], i].tolist()
        z = [_logit(q, at.K[at.ik[b], j].tolist(), mrow[j], at.scale) for j in range(S)]
        r = {"nan": any(isinstance(t, float) and (t != t or t == math.inf) for t in z)}
        fin = [j for j in range(S) if isinstance(z[j], Fraction)]
        r["fin"] = fin
        if fin and not r["nan"]:
            M = max(z[j] for j in fin)
            d = {j: z[j] - M for j in fin}
            r.update(d=d, eq=len(set(d.values())) == 1, key=tuple(sorted(d.items())), vb=int(at.iv[b]),
                     V=[[Fraction(float(v)) for v in at.V[at.iv[b], j]] for j in range(S)])  # fmt: skip
            r = with_grad(r, [Fraction(float(x)) for x in Gb[b, i]])
        rows[(b, i)] = r
        return r

    def value(terms, scaled, fmt=fmt):
        """RN(s sum coef X) with X = P_j or dS_j of a row, in ``fmt`` (the query's; the mask's for its gradient).
        Rows of equal logits (and values) merge first:
        ``sum c P_j = P_j sum c`` and ``sum c dS_j(dO) = dS_j(sum c dO)`` (dS is linear in dO)."""
        live = [(r, j, kind, Fraction(float(cf))) for r, j, kind, cf in terms if r["nan"] or r["fin"]]
        if any(r["nan"] for r, _, _, _ in live):
            return math.nan
        sq = Fraction(at.scale) if scaled else Fraction(1)
        merged = {}
        for r, j, kind, cf in live:
            if j not in r["d"] or cf == 0:
                continue
            k = (r["key"], j, kind) if kind == "P" else (r["key"], r["vb"], j, kind)
            if k not in merged:
                merged[k] = [r, cf if kind == "P" else [cf * x for x in r["dO"]]]
            elif kind == "P":
                merged[k][1] += cf
            else:
                merged[k][1] = [x + cf * y for x, y in zip(merged[k][1], r["dO"])]
        exact, rest = Fraction(0), []
        for k, (r, c) in merged.items():
            j, kind = k[-2], k[-1]
            if kind == "dS":
                r, c = with_grad(r, c), Fraction(1)
            if c == 0 or (kind == "dS" and j in r["zero"]):
                continue
            n = len(r["fin"])
            if r["eq"]:
                mean = sum(r["dP"].values(), Fraction(0)) / n
                exact += c * (Fraction(1, n) if kind == "P" else (r["dP"][j] - mean) / n)
            else:
                rest.append((r, j, kind, c))
        if not rest:
            return _decide(fmt, lambda: _ivq(sq * exact))

        def make(exact=exact, rest=rest):
            tot = _ivq(exact)
            for r, j, kind, cf in rest:
                e = {k: (iv.exp(_ivq(t)) if t != 0 else iv.mpf(1)) for k, t in r["d"].items()}
                den = iv.mpf(0)
                for k in r["fin"]:
                    den += e[k]
                P = {k: e[k] / den for k in r["fin"]}
                if kind == "P":
                    x = P[j]
                else:
                    delta = iv.mpf(0)
                    for k in r["fin"]:
                        delta += P[k] * _ivq(r["dP"][k])
                    x = P[j] * (_ivq(r["dP"][j]) - delta)
                tot += _ivq(cf) * x
            return _ivq(sq) * tot

        for prec in (64, 128):  # an irrational value is decided here, almost always
            v = _round_at(fmt, make, prec)
            if v is not None:
                return v
        q, left = _rational_classes(rest)  # rational sums (an exact 0, a midpoint) never decide: find them
        exact += q
        rest = [t for _, _, ts in left for t in ts]
        if not rest:
            return _decide(fmt, lambda: _ivq(sq * exact))
        if len(left) == 1:  # irrational (Lindemann-Weierstrass): decided at some precision
            return _decide(fmt, lambda: make(exact, rest), start=256)
        for prec in (256, 512, 1024, 2048, 4096):  # irrational values that need the bits (a sign under large
            v = _round_at(fmt, lambda: make(exact, rest), prec)  # logits: e**-1000 against dP), before the
            if v is not None:  # costlier test of the classes together
                return v
        how, q = _rational_across(left)
        if how == "rational":
            return _decide(fmt, lambda: _ivq(sq * (exact + q)))
        if how == "irrational":
            return _decide(fmt, lambda: make(exact, rest), start=8192)
        for prec in (8192, 16384, 32768, 65536):  # not proven irrational: a bounded loop, then an honest failure
            v = _round_at(fmt, lambda: make(exact, rest), prec)
            if v is not None:
                return v
        raise RuntimeError("truth: the interval loop did not converge: the terms of rows with different logits "
                           f"may cancel (more than {_ACROSS_CAP} terms to test them together); please report the "
                           "input")  # fmt: skip

    names = ("query", "key", "value") if wrt is None else ((wrt,) if isinstance(wrt, str) else tuple(wrt))
    out = {}
    if "attn_mask" in names:  # dS summed over every (batch, row, column) reading the mask element, rounded once
        from refkern._arrays import operand

        mf = operand(a["attn_mask"], "attn_mask", "truth.backward").fmt
        Bm, Lm, Sm = at.mask.shape
        v = np.zeros(at.mask.shape)
        for t, r_, c in np.ndindex(Bm, Lm, Sm):
            bs = [b for b in range(B) if at.im[b] == t]
            rs, cs = (range(L) if Lm == 1 else (r_,)), (range(S) if Sm == 1 else (c,))
            v[t, r_, c] = value([(row(b, i), j, "dS", 1.0) for b in bs for i in rs for j in cs], False, mf)
        out["attn_mask"] = deliver(v.reshape(np.shape(a["attn_mask"])), mf, og.torch or at.tensor)
        names = tuple(k for k in names if k != "attn_mask")
    for k in names:
        X = {"query": at.Q, "key": at.K, "value": at.V}[k]
        idx = {"query": at.iq, "key": at.ik, "value": at.iv}[k]
        v = np.zeros(X.shape)
        for t, r_, c in np.ndindex(*X.shape):
            bs = [b for b in range(B) if idx[b] == t]
            if k == "query":
                terms = [(row(b, r_), j, "dS", at.K[at.ik[b], j, c]) for b in bs for j in range(S)]
            elif k == "key":
                terms = [(row(b, i), r_, "dS", at.Q[at.iq[b], i, c]) for b in bs for i in range(L)]
            else:
                terms = [(row(b, i), r_, "P", Gb[b, i, c]) for b in bs for i in range(L)]
            v[t, r_, c] = value(terms, k != "value")
        out[k] = deliver(v.reshape(np.shape(a[k])), fmt, og.torch or at.tensor)
    return out


def _round_at(fmt, make, prec: int):
    """One step of Ziv's loop: ``make()`` at iv precision prec, rounded when both ends agree, else None."""
    from refkern.truth.softmax import _round_ends

    saved = iv.prec
    try:
        iv.prec = prec
        return _round_ends(make(), fmt)
    finally:
        iv.prec = saved


# the truth's own copy of refkern.kernels._exact_attention._xmul, kept apart on purpose: the ground truth shares no
# code with the exact path it checks (docs/DESIGN: "checked against something that shares no code"), so a fault in
# one cannot hide in the other
def _xmul(a: dict, b: dict) -> dict:
    """The product of two exponential sums ``{t: c}`` (``sum_t c e**t``): ``e**t e**u = e**(t + u)``."""
    out = {}
    for t, c in a.items():
        for u, d in b.items():
            out[t + u] = out.get(t + u, 0) + c * d
    return out


def _rational_classes(rest):
    """``(q, left)``: the attention terms of rest (row, j, kind, coef) split into classes of rows with the same
    multiset of logit offsets; ``q`` the exact sum of the classes whose sum is rational, left the others' terms.

    A row's offsets ``d_k = z_k - max z`` (rationals, one of them 0) give ``P_j = e**d_j / S`` and
    ``dS_j = e**d_j (dP_j S - T) / S**2`` with ``S = sum_k e**d_k`` and ``T = sum_k dP_k e**d_k``; every row of
    a class has the same S (a permutation of the keys, or another batch, changes nothing in it). A class's
    terms sum to ``A / S**2``, ``A = S sum_P c e**d_j + sum_dS c e**d_j (dP_j S - T)`` (T of the term's own
    row), A and ``S**2`` exponential sums ``sum_t C_t e**t`` with rational C_t and distinct rational t. Such
    sums are equal iff their coefficients are (Lindemann-Weierstrass: e**t for distinct algebraic t are
    linearly independent over the algebraic numbers), so ``A / S**2`` is a rational q iff ``A = q S**2``
    coefficient by coefficient, with ``q = C_0 / D_0`` at t = 0 (``D_0 >= 1``: the top logit with itself).
    Otherwise the class's sum is irrational. Covers ``sum_j dS_ij = 0`` (a dq element whose key column is
    constant over the row's keys: the coefficients c_j equal) and rows whose logits are permutations of one
    another (dk and dv terms that cancel across rows). Classes of different S that cancel only together:
    :func:`_rational_across`."""
    classes = {}
    for t in rest:
        classes.setdefault(tuple(sorted(t[0]["d"].values())), []).append(t)
    q, left = Fraction(0), []
    for offs, ts in classes.items():
        S = {}
        for d in offs:
            S[d] = S.get(d, 0) + 1
        U, W = {}, {}  # A = S U - sum_r W_r T_r: U_j = c (P terms), c dP_j (dS terms); W_r = sum c e**d_j
        for r, j, kind, c in ts:
            d = r["d"][j]
            U[d] = U.get(d, 0) + (c if kind == "P" else c * r["dP"][j])
            if kind == "dS":
                w = W.setdefault(id(r), [r, {}])[1]
                w[d] = w.get(d, 0) + c
        if W:
            A = _xmul(S, U)
            for r, w in W.values():
                T = {}
                for k, d in r["d"].items():
                    T[d] = T.get(d, 0) + r["dP"][k]
                for t, x in _xmul(w, T).items():
                    A[t] = A.get(t, 0) - x
            D = _xmul(S, S)
        else:
            A, D = U, S
        v = _ratio(A, D)
        if v is not None:
            q += v
        else:
            left.append((A, D, ts))
    return q, left


def _ratio(A: dict, D: dict):
    """``A / D`` when it is a rational (its value), else None: exponential sums with ``D_0 > 0``."""
    v = Fraction(A.get(0, 0)) / D[0]
    return v if all(A.get(t, 0) == v * D.get(t, 0) for t in set(A) | set(D)) else None


_ACROSS_CAP = 1 << 16  # the most terms the product of the classes' denominators may have (an upper bound)


def _rational_across(left):
    """The classes left by :func:`_rational_classes` (two or more, each of an irrational sum), together:
    ``sum_r A_r / D_r`` is rational q iff ``sum_r A_r prod_{r' != r} D_r' = q prod_r D_r`` coefficient by
    coefficient (the same Lindemann-Weierstrass argument; ``prod D_r`` has the coefficient ``prod D_r0 > 0`` at
    0). Classes of different S cancel only when their denominators share factors (S proportional: a row
    whose keys are another's, each repeated; or S of common polynomial factors in e**(1/N)): rare, but
    then no precision decides the element. ("rational", q), ("irrational", None), or ("unknown", None) when
    the product would exceed _ACROSS_CAP terms. Costly (the products): tried once the loop has not decided
    the element at 4096 bits."""
    if math.prod(len(D) for _, D, _ in left) > _ACROSS_CAP:
        return "unknown", None
    # on integers: exponents times the lcm of their denominators, the A_r times that of their coefficients'
    lx = math.lcm(*(Fraction(t).denominator for A, D, _ in left for t in (*A, *D)))
    lc = math.lcm(*(Fraction(c).denominator for A, _, _ in left for c in A.values()))
    F, G = {}, {0: 1}
    for A, D, _ in left:  # F / G = sum so far: (F D + A G) / (G D)
        A = {int(t * lx): int(c * lc) for t, c in A.items()}
        D = {int(t * lx): int(c) for t, c in D.items()}
        F = _xmul(F, D)
        for t, x in _xmul(A, G).items():
            F[t] = F.get(t, 0) + x
        G = _xmul(G, D)
    v = _ratio(F, G)
    if v is not None:
        v /= lc
    return ("irrational", None) if v is None else ("rational", v)
