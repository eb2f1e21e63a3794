"""The statistical scale of ``scaled_dot_product_attention`` (the derivation is in the docstring of
:mod:`refkern.analysis.noise`): per output element, the first-order variance of a correct kernel's
roundings, from the exact logits, weights and values, forward (:func:`attention_noise`) and as the
backward's scales read them (:func:`attention_rows`)."""

import math
from dataclasses import dataclass

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.analysis._envelope_softmax import EXP_SCALE_BINADES
from refkern.analysis.partials import block_partials

__all__ = ["attention_noise", "attention_rows", "AttentionRows", "BLOCK", "DOT_BLOCK"]

BLOCK = 32  #: keys per block in the bound on attention's P @ V partial sums (any block size gives a bound)
DOT_BLOCK = 4  #: features per block in the same bound on the logits' partial sums (q . k over E)
_Q_ROWS = 128  # rows per GEMM of _shared_q (each over its rows' non-zero keys): a (128, S) float32 block is a
# full-speed GEMM operand, and a causal mask then costs 1/2 + 128 / (2 L) of the full product
_Q_CHUNK = 1 << 24  # float32 elements of one chunk of _shared_q's outer products (64 MiB)


def attention_noise(lay, u, u_m, ref_rows, q_term=True):
    """sigma**2 of scaled_dot_product_attention per output element (rows of (B, L, Ev)), before the stores; with
    ``q_term`` False without q's shared rounding (:func:`_shared_q`: the one term whose cost is a GEMM 64 times the
    output's, ``L S Ev E`` products; a kernel that applies the scale to the scores, as FlashAttention's do, has no
    such rounding), with ``q_term="only"`` that term alone (for the member that has it, asked for lazily)."""
    from refkern.analysis._envelope_softmax import _logits

    a = lay.extra["a"]
    S = a.K.shape[1]
    out = np.zeros(ref_rows.shape)
    if S == 0 or out.size == 0:
        return out
    for b, z, mag, m, _ in _logits(a):
        out[b] = attention_rows(a, b, z, mag, m, u, u_m, q_term).var
    return out


@dataclass
class AttentionRows:
    """One output batch of attention (L queries, S keys), the exact quantities and the first-order scale
    of :func:`attention_rows`: the weights ``w``, the exponentials ``t`` and their sum ``D``, each weight's
    own relative variance ``beta2`` (its logit and exponential), the row's shared one ``shared`` (the sum's
    additions and the online rescales; the row's sensitivity ``sum w**2 beta2`` to every term's error),
    the output ``o`` and its variance ``var`` (before the stores)."""

    w: np.ndarray
    t: np.ndarray
    D: np.ndarray
    beta2: np.ndarray
    shared: np.ndarray
    o: np.ndarray
    var: np.ndarray


def attention_rows(a, b, z, mag, m, u, u_m, q_term=True) -> AttentionRows:
    """The forward scale of one output batch ``b`` of the attention call ``a`` (module docstring), its
    logits ``z`` with the mask ``m`` and ``mag = s sum |q k|`` (:func:`~refkern.analysis._envelope_softmax._logits`);
    ``q_term`` as :func:`attention_noise` takes it (``var`` without q's shared rounding, or that term alone)."""
    s = abs(a.scale)
    uq = u_m + 2.0 * u  # q or k scaled (by fl(sqrt(s)): two roundings) and stored in the result format
    E = a.Q.shape[2]
    v = a.V[a.iv[b]]
    k = a.K[a.ik[b]]
    q = a.Q[a.iq[b]]
    L, S = z.shape
    with np.errstate(all="ignore"):
        t, w, beta2, g = (np.empty((L, S)) for _ in range(4))
        D, psq, rec = np.empty(L), np.empty(L), np.empty(L)
        qk2 = (q * q) @ (k * k).T  # sum_l (q_l k_jl)**2: the products' roundings, the k side's
        # the dot products' partial sums: per block of DOT_BLOCK features for float32 results; for half ones
        # the order-free (E + 1) (s sum|q k|)**2 (formed per term below), larger, and negligible next to the
        # scores' store u_m |z|
        part = np.empty((0, 0)) if u_m else np.ascontiguousarray(_block_partials(q, k.T, DOT_BLOCK), np.float64)
        zc = np.ascontiguousarray(z, np.float64)
        M = np.fmax.reduce(zc, axis=1, initial=-np.inf)  # the row's largest non-NaN logit
        np.exp(zc - np.where(M - M == 0.0, M, 0.0)[:, None], out=t)  # numpy's vector exp: a tenth of a scalar loop's
        _row_terms(zc, np.ascontiguousarray(np.broadcast_to(m, z.shape), np.float64),
                   np.ascontiguousarray(mag, np.float64), qk2, part, u, u_m, uq, s, E + 1.0, u <= 2.0**-53, _B_BY_EXP,
                   t, w, beta2, g, D, psq, rec)  # fmt: skip
        Ev = v.shape[1]
        ov = w @ np.concatenate([v, np.abs(v)], axis=1)  # o and sum_j w_j |v_j| (w >= 0) in one GEMM
        o, wv = ov[:, :Ev], ov[:, Ev:]
        gv = g @ np.concatenate([v * v, v], axis=1)
        A2 = gv[:, :Ev] - 2.0 * o * gv[:, Ev:] + o * o * g.sum(axis=1)[:, None]  # sum_j g_j (v_j - o)**2
        qv = (uq * s) ** 2 * _shared_q(w, v, k, q, o) if q_term else 0.0
        var = qv if q_term == "only" else np.maximum(A2, 0.0) + qv
        adds = u * u * psq / (D * D) + 2.0 * rec * u * u
        if q_term != "only":
            var = var + adds[:, None] * o * o
            var = var + u * u * _block_partials(w, v) + 2.0 * (u * o) ** 2 + rec[:, None] * (u * wv) ** 2
            var = var + u_m**2 * ((w * w) @ (v * v))  # P stored before P @ V (half results)
        shared = adds + g.sum(axis=1)
    return AttentionRows(w, t, D, beta2, np.where(np.isfinite(shared), shared, 0.0), o,
                         np.where(np.isfinite(var), var, 0.0))  # fmt: skip


def _b_by_exponent():
    """B of :data:`~refkern.analysis._envelope_softmax.EXP_SCALE_BINADES` per biased float64 exponent of ``|a|``
    (2048 entries): every bound there but the last ends at a power of two, so a binade lies wholly below or wholly
    above each, and the first top above the binade's values is read once here instead of searched per term."""
    tops = [t for t, _ in EXP_SCALE_BINADES[:-1]]
    assert all(np.frexp(t)[0] == 0.5 for t in tops) and EXP_SCALE_BINADES[-1][0] == np.inf, EXP_SCALE_BINADES
    out = np.empty(2048)
    for e in range(2048):
        hi = math.ldexp(1.0, e - 1022) if 0 < e < 2046 else (2.0**-1022 if e == 0 else math.inf)  # below hi
        out[e] = next((b for t, b in EXP_SCALE_BINADES if hi <= t), EXP_SCALE_BINADES[-1][1])
    return out


_B_BY_EXP = _b_by_exponent()


@jit(parallel=True, error_model="numpy")
def _row_terms(z, m, mag, qk2, part, u, u_m, uq, s, e1, f64, b_exp, t, w, beta2, g, D, psq, rec):
    """Per row of the (L, S) logits ``z`` with their exponentials ``t = exp(z - M)`` (M the row's largest non-NaN
    logit, 0 where not finite), in one jitted task (the values of :func:`~refkern.analysis._rows._weights`,
    :func:`~refkern.analysis._rows._records`, :func:`~refkern.analysis._rows._partial_sq` of ``t`` and
    :func:`~refkern.analysis._rows.exp_ulps_rows`, as those compute them on float64 rows): the sum ``D`` of ``t``,
    the weights ``w``, the records ``rec`` and the partial sums' squares ``psq`` of ``t``; then each weight's own
    relative variance ``beta2`` (:func:`attention_rows`: its exponential within ``B`` ulps, B of
    :data:`~refkern.analysis._envelope_softmax.EXP_SCALE_BINADES` at its argument (``b_exp``, by the argument's
    biased exponent, :func:`_b_by_exponent`; 1 for a float64 unit, ``f64``), its argument, its logit's roundings, a
    float mask's addition, the scores' store) and ``g = w**2 beta2``, the same float64 operations as the array
    form (the sums left to right). The logit's partial sums: ``part`` per term, or for half results (``u_m``) the
    order-free ``e1 (mag / s)**2`` (``e1 = E + 1``). A term of weight 0 (or a non-finite argument) moves
    nothing: 0."""
    L, S = z.shape
    us2, uqs2 = (u * s) ** 2, (uq * s) ** 2
    for i in prange(L):
        M = -np.inf
        lr = 0
        mx = -np.inf
        for j in range(S):
            y = z[i, j]
            if y == y and y > M:
                M = y
            y = -np.inf if y != y else y
            if j >= 1 and y > mx:
                lr += 1
            mx = max(mx, y)
        rl = 0
        mx = -np.inf
        for j in range(S - 1, -1, -1):
            y = z[i, j]
            y = -np.inf if y != y else y
            if j <= S - 2 and y > mx:
                rl += 1
            mx = max(mx, y)
        rec[i] = max(lr, rl)
        Mf = M if M - M == 0.0 else 0.0
        tot = 0.0
        for j in range(S):
            tot += t[i, j]
        D[i] = tot
        p, left, right = 0.0, 0.0, tot * tot
        for j in range(S):
            p += t[i, j]
            if j >= 1:
                left += p * p
            if j <= S - 3:
                d = tot - p
                right += d * d
        psq[i] = 0.0 if S < 2 else (left if (left != left or left >= right) else right)
        for j in range(S):
            tt = t[i, j]
            ww = tt / tot
            w[i, j] = ww
            zz = z[i, j]
            a = zz - Mf
            if not (a - a == 0.0 and tt > 0.0):
                beta2[i, j] = 0.0
                g[i, j] = 0.0 * ww * ww  # NaN where w is, as w * w * 0 was
                continue
            B = 1.0 if f64 else b_exp[(np.float64(abs(a)).view(np.uint64) >> np.uint64(52)) & np.uint64(2047)]
            q2 = qk2[i, j]
            pt = e1 * (mag[i, j] / s) ** 2 if u_m else part[i, j]
            logit = us2 * (pt + q2) + (u * zz) ** 2 + uqs2 * q2
            mm = m[i, j]
            madd = (u * zz) ** 2 if (mm - mm == 0.0 and mm != 0.0) else 0.0
            b = (2.0 * B * u) ** 2 + (u * a) ** 2 + logit + madd + (u_m * zz) ** 2
            beta2[i, j] = b
            g[i, j] = ww * ww * b


def _shared_q(w, v, k, q, o):
    """sum_l q_l**2 C_cl**2 per row and output column, ``C_cl = sum_j w_j (v_jc - o_c) k_jl``: q's rounding
    (``eps_l``, shared by the row's logits) moves ``o_c`` by ``s sum_l eps_l q_l C_cl``. ``C`` of every row by
    GEMM, ``w @ [v_j k_j^T]_j`` (the (S, Ev E) outer products of each key), less ``o (w @ k)``; in chunks of
    keys so that no temporary exceeds about 64 MiB. That GEMM (L S Ev E products, 64 times the output's)
    runs in float32 on v centred by its mean over the keys (the same C: sum_j w_j = 1): a variance needs
    a few correct digits of C, and the centring keeps v's mean from cancelling them away.

    Its cost is the GEMM's and no form is cheaper where it matters: ``C`` has L Ev E elements, each a sum over
    the S keys; the other exact form, ``sum_(j, j') a_j a_j' G_jj'`` (``a_j = w_j (v_jc - o_c)``, ``G_jj' =
    sum_l q_l**2 k_jl k_j'l``, an S x S Gram matrix per row, since q**2 weights it per row), costs L S**2 (E + Ev),
    less only below S = E Ev / (E + Ev) keys (32 at E = Ev = 64), where the GEMM is small anyway. A bound through
    the keys' Gram matrix, shared by the rows, ``max_l q_l**2 lambda_max(K^T K) max_j w_j sum_j w_j (v_jc - o_c)**2``,
    costs L S Ev but drops the cancellation of the sum over the keys: on bench_compare_cost's attention (1024 keys,
    64 features, unrelated q, k, v) it is 977 times the exact term (median), a term that is 13.5% of the variance
    there (median; 8% to 21%). What is skipped is exact: a block of :data:`_Q_ROWS` rows multiplies only the keys
    from its first to its last non-zero weight (a causal mask halves the GEMM; a zero weight adds exactly 0)."""
    L, S = w.shape
    Ev, E = v.shape[1], k.shape[1]
    vbar = v.mean(axis=0) if S else np.zeros(Ev)
    vc = (v - vbar).astype(np.float32)
    k32, w32 = k.astype(np.float32), w.astype(np.float32)
    nz = w != 0.0  # NaN counts: a non-finite weight reaches C as it did
    has = nz.any(axis=1)
    first = np.where(has, nz.argmax(axis=1), S)
    last = np.where(has, S - nz[:, ::-1].argmax(axis=1), 0)
    blocks, span = [], []
    for r0 in range(0, L, _Q_ROWS):
        r1 = min(r0 + _Q_ROWS, L)
        sp = (first[r0:r1].min(), last[r0:r1].max())
        if span and span[-1] == sp:  # one GEMM for the rows of one key range (no mask: all of them)
            blocks[-1] = (blocks[-1][0], r1)
        else:
            blocks.append((r0, r1))
            span.append(sp)
    C = np.zeros((L, Ev * E), np.float32)
    written = [False] * len(blocks)
    step = max(1, _Q_CHUNK // max(Ev * E, 1))
    for s0 in range(0, S, step):
        s1 = min(s0 + step, S)
        outer = (vc[s0:s1, :, None] * k32[s0:s1, None, :]).reshape(-1, Ev * E)
        for n, ((r0, r1), (lo, hi)) in enumerate(zip(blocks, span)):
            lo, hi = max(lo, s0), min(hi, s1)
            if lo >= hi:
                continue
            if written[n]:
                C[r0:r1] += w32[r0:r1, lo:hi] @ outer[lo - s0 : hi - s0]
            else:
                np.matmul(w32[r0:r1, lo:hi], outer[lo - s0 : hi - s0], out=C[r0:r1])
                written[n] = True
    out = np.empty((L, Ev))
    _shared_rows(C.reshape(L, Ev, E), np.ascontiguousarray(o - vbar), np.ascontiguousarray(w @ k),
                 np.ascontiguousarray(q * q), out)  # fmt: skip
    return out


@jit(parallel=True)
def _shared_rows(C, d, m, q2, out):
    """``out[i, c] = sum_l q2[i, l] (C[i, c, l] - d[i, c] m[i, l])**2`` in float64 from the float32 GEMM's ``C``: one
    pass over it (the float64 copy, the difference and its square as whole (L, Ev, E) temporaries cost half as
    much again as the GEMM)."""
    L, Ev, E = C.shape
    for i in prange(L):
        for c in range(Ev):
            acc = 0.0
            for l in range(E):
                x = np.float64(C[i, c, l]) - d[i, c] * m[i, l]
                acc += q2[i, l] * (x * x)
            out[i, c] = acc


def _block_partials(w, v, block=None):
    """sum_k P_k**2 over the partial sums of each element of ``w @ v`` along the contracted index, bounded
    per block of ``block`` (default :data:`BLOCK`) indices (:func:`refkern.analysis.partials.block_partials`,
    the GEMMs' order term)."""
    return block_partials(w, v, BLOCK if block is None else block)
