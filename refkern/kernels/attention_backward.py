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
up to _ACROSS_CAP terms: S that share a polynomial factor in ``e**h``). An exact 0 is +0. From 384 bits
on, every term is known relative to its own size instead of in units of its row's top exponential
(:func:`refkern.kernels._exact_attention._scaled`): ``X = R + e**b Y``, R its rational part, b < 0 its
leading exponent, exact; where the rest is below ``2**-T`` (``T = bits(q) + prec - emin + 1`` for the
rational part ``n / q``) no rounding boundary lies between the rational part and the value, so the rest's
sign decides: gradients of size e**-1e5 or e**-3.4e38 (logits that far apart, a mask of float32's
lowest value) are decided as near ones are (the fixed-point widths raised beyond a gap of about 45,000).
Beyond the cap, or for an irrational value within ``2**-65536`` (relative) of a rounding boundary, the
loop stops with a RuntimeError at 2**16 bits rather than return a guess.

The exact path's rational arithmetic lives with the numerics: :mod:`refkern.kernels._exact_attention_row`
(one row: :class:`_Ints`, :class:`_Row`) and :mod:`refkern.kernels._exact_attention` (:class:`_Exact`, the
rationality tests).
"""

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.kernels._exact_attention import _Exact
from refkern.kernels._transcendental import U, bracket_around
from refkern.kernels.attention import Attention, add_logit, exp_weights, row_masks, row_max

__all__ = ["attention_backward", "AttnBackCounts"]

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
        for j in range(S):
            P[b, i, j] = 0.0
            eP[b, i, j] = 0.0
            dS[b, i, j] = 0.0
            edS[b, i, j] = 0.0
        z = np.empty(S)
        ez = np.empty(S)
        if row_masks(M3, im[b], i, causal, has_mask, z):  # the forward's logits and bounds
            status[b, i] = 2
            continue
        for j in range(S):
            if z[j] == -np.inf:
                continue
            dot = 0.0
            A = 0.0
            for l in range(E):
                pr = q[l] * Kb[j, l]  # exact: narrow inputs
                dot += pr
                A += abs(pr)
            add_logit(z, ez, j, scale * dot, abs(scale) * gE * A)
        M, eM = row_max(z, ez)
        if M == -np.inf:
            status[b, i] = 3
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
        eps = np.empty(S)
        Dsum, ED, ok = exp_weights(z, ez, M, eM, P[b, i], eps)  # the forward's weights and bounds
        rho = ED / Dsum
        if not ok or not rho < 2.0**-20:
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


class AttnBackCounts:
    """How many elements each path decided (tests)."""

    def __init__(self):
        self.elements = 0
        self.exact_elements = 0


def _mask_terms(M, L, S):
    """The mask's gradient as a reduction: (rows, R, Kd, W) with W(x) the (B, L, S) array x as (B, R, Kd), R = Lm
    Sm the mask's elements per mask batch, Kd the (i, j) pairs each sums (L / Lm rows times S / Sm columns:
    a mask of shape (Lm, Sm), Lm in {1, L}, Sm in {1, S}, is broadcast along the others)."""
    Lm, Sm = M.shape[1], M.shape[2]
    li, si = L // Lm, S // Sm

    def W(x):
        B = x.shape[0]
        return np.ascontiguousarray(x.reshape(B, Lm, li, Sm, si).transpose(0, 1, 3, 2, 4).reshape(B, Lm * Sm, li * si))

    return Lm, Sm, li * si, W


def attention_backward(a: Attention, G: np.ndarray, wrt, force_exact: bool = False, mask_fmt=None):
    """({"query": (Bq, L, E), "key": (Bk, S, E), "value": (Bv, S, Ev), "attn_mask": (Bm, Lm, Sm)} float64
    gradients of the names in wrt, values of a.fmt (the mask's: of ``mask_fmt``, its own format), AttnBackCounts).
    G: grad_output as float64 (B, L, Ev). Every input must be finite.

    The additive mask's gradient is ``dS`` summed over every (output batch, row, column) that reads the mask
    element (its broadcast batch dimensions, and L or S where the mask has one row or one column), rounded
    once: the logits' gradient, since ``z = s q k^T + m``. Fast path: the float64 dS within edS of the exact
    values (:func:`_fast_rows`) summed by :func:`_fast_reduce` (scale 1, one-valued right operand); the
    undecided elements exactly (:meth:`_Exact.element` of the dS terms, unscaled)."""
    B = a.iq.size
    L, S = a.Q.shape[1], a.V.shape[1]
    fmt = a.fmt
    counts = AttnBackCounts()
    shapes = {"query": a.Q.shape, "key": a.K.shape, "value": a.V.shape, "attn_mask": a.mask.shape}
    fmts = {k: (mask_fmt or fmt) if k == "attn_mask" else fmt for k in wrt}
    out = {k: np.zeros(shapes[k]) for k in wrt}
    und = {k: np.zeros(shapes[k], np.bool_) for k in wrt}
    counts.elements = sum(v.size for v in out.values())
    if B * L * S == 0 or not counts.elements:
        return out, counts
    grp = {"query": _groups(a.iq, a.Q.shape[0]), "key": _groups(a.ik, a.K.shape[0]),
           "value": _groups(a.iv, a.V.shape[0])}  # fmt: skip
    if "attn_mask" in wrt:
        grp["attn_mask"] = _groups(a.im, a.mask.shape[0])
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
            elif k == "attn_mask":
                Lm, Sm, Kd, W = _mask_terms(a.mask, L, S)
                st_m = np.repeat(st.reshape(B, Lm, L // Lm).max(axis=2), Sm, axis=1)  # the rows each element reads
                o, u = out[k].reshape(-1, Lm * Sm, 1), und[k].reshape(-1, Lm * Sm, 1)
                _fast_reduce(W(dS), W(edS), np.ones((1, Kd, 1)), np.zeros(B, np.int64), order, starts,
                             np.ascontiguousarray(st_m), 1.0, *fmts[k].params, o, u)  # fmt: skip
                out[k], und[k] = o.reshape(shapes[k]), u.reshape(shapes[k])
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
            elif k == "attn_mask":  # (t, r, c): the mask element's row r (every row if Lm = 1), column c
                rows = range(L) if a.mask.shape[1] == 1 else (r,)
                cols = range(S) if a.mask.shape[2] == 1 else (c,)
                terms = [(ex.row(b, i), j, "dS", 1.0) for b in bs for i in rows for j in cols]
            else:
                terms = [(ex.row(b, i), r, "P", G[b, i, c]) for b in bs for i in range(L)]
            out[k][t, r, c] = ex.element(terms, k not in ("value", "attn_mask"), fmts[k])
            counts.exact_elements += 1
    return out, counts
