"""The gradients' envelope of scaled_dot_product_attention (:mod:`refkern.analysis._envelope_backward`,
whose docstring derives the envelopes): torch's math backend and a flash backward, every intermediate
possibly stored in the dtype."""

import math

import numpy as np

from refkern.accumulate.formats import FLOAT32, FLOAT64
from refkern.analysis._envelope_backward_ops import EVAL_SLACK, _gamma

SCALE_ROUNDINGS = 4  #: attention logits: q and k each scaled by sqrt(s) (a float32 scalar, then the store)


LOGIT_ROUNDINGS = 2  #: attention logits: the mask's addition and the stored logit


SHIFT_ROUNDINGS = 4  #: the exp argument: z - max, or z - lse with lse's own rounding and log's error


FLASH_O_ROUNDINGS = 3  #: a flash forward's output: per key an exp, a product, an addition, a rescale (3 S + 8)


DS_ROUNDINGS = 3  #: dS = P (dP - Delta) stored: the product, the store, the expanded form's second product


REDUCE_EXTRA = 6  #: dq, dk beyond their sums: k' and q' stored, sqrt(s) twice as float32, two products


ATTN_SECOND_ORDER = 8  #: at most eight roundings compound on one path: (1 + 8 uu) covers their products


def attention_bound(at, G: np.ndarray, name: str, ref: np.ndarray, mask_fmt=None):
    """(envelope, n_terms): the envelope of each element of the gradient ``name`` ("query", "key",
    "value", "attn_mask") of ``scaled_dot_product_attention`` around ``ref`` (its correctly rounded value, shaped
    as the operand's 3-D stack: at.Q, at.K, at.V or at.mask), for a call normalised as ``at``
    (:class:`refkern.kernels.attention.Attention`) with grad_output G (B, L, Ev) float64; ``mask_fmt``: the
    mask's format, the mask gradient's (the query's by default).

    **What a correct backward computes.** torch's math backend: ``q' = q sqrt(s)``, ``k' = k sqrt(s)``
    (sqrt(s) a float32 scalar, each product stored in the dtype), ``z = q' k'^T + m`` (a matmul, the
    logits stored), ``P = softmax(z)`` stored, ``O = P v``; autograd: ``dv = P^T dO``, ``dP = dO v^T``,
    ``dS = P (dP - sum_k P_k dP_k)`` (softmax's backward, opmath), ``dq = (dS k') sqrt(s)``, ``dk`` likewise,
    the broadcast and GQA copies summed. A flash backward (torch's CPU kernel) recomputes ``P =
    exp(z - lse)`` from the stored logsumexp and forms ``Delta = rowsum(dO O^)`` from the stored output.
    The class covered: either form, every sum in any order, with every operation rounded in the working
    precision and every intermediate possibly stored in the dtype: one unit ``uu`` for every rounding,
    the dtype's (float16/bfloat16/float32 results: at least float32's, the working precision; float64:
    2**-53), ``eta`` (the dtype's smallest normal: flush to zero included) for each quantity that may
    underflow, ``gamma_k = k uu / (1 - k uu)`` (infinite from ``k uu >= 1/2``: no bound is claimed).

    **Derivation** (each error charged against magnitudes inflated by their own bounds, so that the cross
    terms of perturbed products are covered: ``|a'b' - ab| <= e_a |b'| + |a| e_b``):

    1. Logits. ``A_ij = |s| sum_l |q_il k_jl|``. The scalings round q and k (uu each) and sqrt(s) as
       float32 (uu each): SCALE_ROUNDINGS = 4; the dot product ``gamma_E``; the mask's addition and the
       store LOGIT_ROUNDINGS = 2 of ``|z|``: ``ez_ij = (4 uu + gamma_E) A_ij + 2 uu |z_ij| + eta``.
    2. Weights. ``P_j = e**z_j / sum_k e**z_k``: perturbing every logit by ``|d_k| <= dl_k`` moves P_j by
       the factor ``e**d_j / sum_k P_k e**d_k``, within ``expm1(dl_j + max_k dl_k)`` relative. The exp
       argument (``z - max`` or ``z - lse``) rounds up to SHIFT_ROUNDINGS = 4 times on magnitudes below
       ``zmax + log S + 1`` (zmax = max |z| of the row; lse and log's error included): ``dl_j = ez_j + 4
       uu (|z_j| + zmax + log S + 1)``. The exp (EXP_ULPS), the sum (S - 1 additions), the reciprocal or
       division, the product and the store: ``rp_j = expm1(dl_j + max dl) + gamma_{S + EXP_ULPS + 3}
       (1 + expm1(...))``; ``eP_j = P_j rp_j + eta`` (0 where the logit is -inf: P = 0 exactly).
    3. ``dP_j = dO . v_j``: ``edP_j = gamma_Ev sum_c |dO_c v_jc| + uu |dP_j| + (Ev + 1) eta`` (stored).
    4. Delta, the larger of two forms. (a) ``sum_j P^_j dP^_j``: ``sum_j (eP_j |dP_j| + (P_j + eP_j)
       edP_j) + gamma_S sum_j (P_j + eP_j)(|dP_j| + edP_j) + S eta``. (b) ``sum_c dO_c O^_c`` with the
       stored forward output within ``eO_c = sum_j eP_j |v_jc| + gamma_{3S+8} sum_j (P_j + eP_j) |v_jc| +
       (S + 2) eta`` (a flash forward: per key an exp, a product, an addition, and a rescale of the
       running sum by a rounded factor, FLASH_O_ROUNDINGS = 3 per key, 8 for the final division, the
       stores): ``sum_c |dO_c| eO_c + gamma_Ev sum_c |dO_c| (|O_c| + eO_c) + Ev eta``. Stored once more:
       ``eDel = max + uu (|Delta| + max)``.
    5. ``h_j = dP_j - Delta`` within ``eh_j = edP_j + eDel + uu (|dP_j| + |Delta| + edP_j + eDel)``;
       ``dS_j`` within ``edS_j = eP_j (|h_j| + eh_j) + P_j eh_j + DS_ROUNDINGS uu (P_j + eP_j)(|h_j| + eh_j)
       + eta``, DS_ROUNDINGS = 3.
    6. The gradients, n terms each (every output batch reading the element times S, or times L):
       ``dq_ie``: ``|s| (sum edS |k| + gamma_{n+6} sum (|dS| + edS) |k|) + (n + 6) eta``, REDUCE_EXTRA = 6
       (k' stored, sqrt(s) as float32 twice, the products by sqrt(s), the broadcast partials' stores);
       ``dk`` the same with q; ``dv_jc``: ``sum eP |dO| + gamma_{n+2} sum (P + eP) |dO| + (n + 2) eta``;
       the additive mask's ``dm``, dS itself summed to the mask's shape (autograd's ``sum_to`` of the stored dS:
       the logits ``z = s q k^T + m`` take m as it is, whose rounding step 1 charges): ``sum edS + gamma_n sum
       (|dS| + edS) + n eta``, n the (batch, row, column) triples reading the element.
    7. The store and the centre, as softmax's step 5: ``E (1 + ATTN_SECOND_ORDER uu) + u_o (2 |ref| (1 +
       2 u_o) + E) + 2 eta_o``, ATTN_SECOND_ORDER = 8.
    8. The bound is evaluated in float64 from float64 values of the exact quantities (P by a float64
       softmax within ``(S + 4) 2**-52`` relative, the sums within ``(n + 16) 2**-52`` of their magnitudes):
       each magnitude-based term carries that slack, and the whole EVAL_SLACK. Elements a NaN row
       reaches get 0 (the reference is NaN there)."""
    from refkern.analysis._envelope_softmax import EXP_ULPS

    fmt = at.fmt
    uu = FLOAT64.u if fmt is FLOAT64 else max(fmt.u, FLOAT32.u)
    eta = 2.0**fmt.emin
    fo = (mask_fmt or fmt) if name == "attn_mask" else fmt
    u_o, eta_o = fo.u, 2.0 ** (fo.emin - fo.prec)
    B = at.iq.size
    L, E = at.Q.shape[1], at.Q.shape[2]
    S, Ev = at.K.shape[1], at.V.shape[2]

    def f64(n):
        return (n + 16) * 2.0**-52

    with np.errstate(all="ignore"):
        Qg, Kg, Vg = at.Q[at.iq], at.K[at.ik], at.V[at.iv]
        s = abs(at.scale) if E else 0.0
        z = at.scale * (Qg @ Kg.transpose(0, 2, 1)) if E else np.zeros((B, L, S))
        A = s * (np.abs(Qg) @ np.abs(Kg).transpose(0, 2, 1)) if E else np.zeros((B, L, S))
        if at.causal:
            m = np.where(np.arange(S)[None, :] > np.arange(L)[:, None], -np.inf, 0.0)[None]
        elif at.has_mask:
            m = np.broadcast_to(at.mask[at.im], (B, L, S))
        else:
            m = np.zeros((1, 1, 1))
        z = z + m
        fin = np.isfinite(z)
        nanrow = (np.isnan(z) | (z == np.inf)).any(axis=2)
        zf = np.where(fin, z, -np.inf)
        M = zf.max(axis=2, keepdims=True)
        Mf = np.where(np.isfinite(M), M, 0.0)
        p = np.where(fin, np.exp(zf - Mf), 0.0)
        Psum = p.sum(axis=2, keepdims=True)
        P = np.where(Psum > 0, p / np.where(Psum > 0, Psum, 1.0), 0.0)
        ez = (SCALE_ROUNDINGS * uu + _gamma(E, uu) + f64(E)) * A + LOGIT_ROUNDINGS * uu * np.abs(zf) + eta
        zmax = np.where(fin, np.abs(z), 0.0).max(axis=2, keepdims=True)
        dl = np.where(fin, ez + SHIFT_ROUNDINGS * uu * (np.abs(np.where(fin, z, 0.0)) + zmax + math.log(max(S, 1)) + 1),
                      0.0)  # fmt: skip
        dlm = dl.max(axis=2, keepdims=True)
        x1 = np.expm1(dl + dlm)
        rp = x1 + _gamma(S + EXP_ULPS + 3, uu) * (1.0 + x1) + (S + 4) * 2.0**-52
        eP = np.where(fin, P * rp + eta, 0.0)
        Pm = P + eP
        dP = G @ Vg.transpose(0, 2, 1)
        Adp = np.abs(G) @ np.abs(Vg).transpose(0, 2, 1)
        edP = (_gamma(Ev, uu) + f64(Ev)) * Adp + uu * np.abs(dP) + (Ev + 1) * eta
        dPm = np.abs(dP) + edP
        Del = (P * dP).sum(axis=2, keepdims=True)
        eA = (eP * np.abs(dP) + Pm * edP).sum(axis=2, keepdims=True) + (_gamma(S, uu) + f64(S)) * (Pm * dPm).sum(
            axis=2, keepdims=True) + S * eta  # fmt: skip
        O = P @ Vg
        eO = eP @ np.abs(Vg) + (_gamma(FLASH_O_ROUNDINGS * S + 8, uu) + f64(S)) * (Pm @ np.abs(Vg)) + (S + 2) * eta
        eB = (np.abs(G) * eO).sum(axis=2, keepdims=True) + (_gamma(Ev, uu) + f64(Ev)) * (
            np.abs(G) * (np.abs(O) + eO)).sum(axis=2, keepdims=True) + Ev * eta  # fmt: skip
        eD = np.maximum(eA, eB)
        eDel = eD + uu * (np.abs(Del) + eD)
        h = dP - Del
        eh = edP + eDel + uu * (np.abs(dP) + np.abs(Del) + edP + eDel) + f64(S) * (np.abs(dP) + np.abs(Del))
        edS = np.where(fin, eP * (np.abs(h) + eh) + P * eh + DS_ROUNDINGS * uu * Pm * (np.abs(h) + eh) + eta, 0.0)
        dSm = np.where(fin, np.abs(P * h) + edS, 0.0)
        if name == "attn_mask":
            Etot, n, bad = _mask_envelope(at, edS, dSm, nanrow, uu, eta, f64)
            return _stored(Etot, ref, bad, uu, u_o, eta_o), n
        idx = {"query": at.iq, "key": at.ik, "value": at.iv}[name]
        X = {"query": at.Q, "key": at.K, "value": at.V}[name]
        Eb = np.zeros(X.shape)
        Mg = np.zeros(X.shape)
        nb = np.bincount(idx, minlength=X.shape[0])
        bad = np.zeros(X.shape, bool)
        for b in range(B):
            t = idx[b]
            if name == "query":
                Eb[t] += s * (edS[b] @ np.abs(Kg[b]))
                Mg[t] += s * (dSm[b] @ np.abs(Kg[b]))
                bad[t] |= nanrow[b][:, None]
            elif name == "key":
                Eb[t] += s * (edS[b].T @ np.abs(Qg[b]))
                Mg[t] += s * (dSm[b].T @ np.abs(Qg[b]))
                bad[t] |= nanrow[b].any()
            else:
                Eb[t] += eP[b].T @ np.abs(G[b])
                Mg[t] += Pm[b].T @ np.abs(G[b])
                bad[t] |= nanrow[b].any()
        n = nb.max(initial=1) * (S if name == "query" else L)
        extra = REDUCE_EXTRA if name != "value" else 2
        Etot = Eb + (_gamma(n + extra, uu) + f64(n)) * Mg + (n + extra) * eta * (1.0 + (s if name != "value" else 0.0))
        return _stored(Etot, ref, bad, uu, u_o, eta_o), int(n)


def _stored(Etot, ref, bad, uu, u_o, eta_o):
    """Step 7 (the store and the centre) and step 8's slack, of an element's envelope Etot around ``ref``."""
    with np.errstate(all="ignore"):
        ra = np.abs(ref)
        Bd = Etot * (1 + ATTN_SECOND_ORDER * uu) + u_o * (2.0 * ra * (1 + 2 * u_o) + Etot) + 2.0 * eta_o
        Bd = Bd * EVAL_SLACK
        Bd = np.where(np.isnan(Bd), np.inf, Bd)
        return np.where(bad | ~np.isfinite(ref), 0.0, Bd)


def _mask_envelope(at, edS, dSm, nanrow, uu, eta, f64):
    """(Etot, n, bad) of the additive mask's gradient (step 6): per mask element the sums of edS and of
    |dS| + edS over the (batch, row, column) triples reading it, n the most such triples."""
    B, L, S = edS.shape
    Bm, Lm, Sm = at.mask.shape
    li, si = L // Lm, S // Sm
    Eb, Mg, bad = np.zeros(at.mask.shape), np.zeros(at.mask.shape), np.zeros(at.mask.shape, bool)
    for b in range(B):
        t = at.im[b]
        Eb[t] += edS[b].reshape(Lm, li, Sm, si).sum(axis=(1, 3))
        Mg[t] += dSm[b].reshape(Lm, li, Sm, si).sum(axis=(1, 3))
        bad[t] |= nanrow[b].reshape(Lm, li).any(axis=1)[:, None]
    n = np.bincount(at.im, minlength=Bm).max(initial=1) * li * si
    return Eb + (_gamma(n, uu) + f64(n)) * Mg + n * eta, int(n), bad
