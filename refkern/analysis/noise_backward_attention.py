"""Attention's gradient scales (:mod:`refkern.analysis.noise_backward` derives them: its module docstring's
attention): per element, the first-order variance of a correct kernel's roundings, and the errors the elements
of a head share (:class:`AttentionShared`, their scale test)."""


import numpy as np

from refkern.analysis._rows import _partial_sq
from refkern.analysis.noise_backward import _stores, _units

__all__ = ["attention_noise", "AttentionShared"]


def attention_noise(at, G, name: str, ref, shared=None):
    """sigma**2 of the gradient ``name`` ("query", "key", "value") of scaled_dot_product_attention per
    element of its operand's 3-D stack (``ref``, the correctly rounded gradient, shaped so), for the call
    normalised as ``at`` with grad_output G (B, L, Ev).

    What a correct backward computes (torch's math backend and the flash kernels, as the envelope's
    :func:`~refkern.analysis._envelope_backward.attention_bound` describes): the weights P recomputed
    (each with the forward's relative variance ``beta2``, the row sharing ``shared``:
    :func:`~refkern.analysis.noise_attention.attention_rows`), ``dv = P^T dO``, ``dP = dO v^T``, ``Delta = rowsum(dO
    O^)`` (the stored output, with its forward variance; or ``sum P dP``: both forms charged), ``dS = P (dP -
    Delta)``, ``dq = s dS k``, ``dk = s dS^T q``. Every intermediate (P, dP, Delta, dS, the scaled q and k) may
    be stored in a half result format (``u_c = u + u_m`` per store, torch's math backend); the products'
    sums in the working precision, their partial sums bounded per block as the forward's P @ V. Where values
    fall below the normals a rounding errs by up to eta absolutely, whatever the value: each such rounding is
    charged eta times what it is multiplied by on the way (P's by h, dP's and Delta's by P <= 1, then q or k;
    a float32 key gradient of 3.5e-40 was 7.44 sigma off with eta counted once per sum). The shared
    row errors (the row's sum, Delta) reach dq coherently (``shared dq**2``, ``var_Delta (s P k)**2``) and dk
    and dv once per row (independent rows: variances add), as do the query heads of a GQA key."""
    from refkern.analysis._envelope_softmax import _logits
    from refkern.analysis.noise_attention import DOT_BLOCK, _block_partials, attention_rows

    fmt = at.fmt
    u, u_m, u_o, eta_o, eta_w = _units(fmt)
    uc = u + u_m
    uq = u_m + 2.0 * u
    s = abs(at.scale)
    X = {"query": at.Q, "key": at.K, "value": at.V}[name]
    idx = {"query": at.iq, "key": at.ik, "value": at.iv}[name]
    var = np.zeros(X.shape)
    S, E = at.K.shape[1], at.Q.shape[-1]
    eta_x = max(eta_w, eta_o if u_m else 0.0)  # an intermediate's rounding below the normals (stored in half: eta_o)
    if S == 0 or X.size == 0:
        return var + _stores(np.asarray(ref, np.float64), fmt, 1)
    for b, z, mag, m, _ in _logits(at):
        rows = attention_rows(at, b, z, mag, m, u, u_m)
        w, o = rows.w, rows.o
        q, k, v = at.Q[at.iq[b]], at.K[at.ik[b]], at.V[at.iv[b]]
        dO = G[b]
        with np.errstate(all="ignore"):
            bP = rows.beta2 + uc * uc  # each weight's own relative variance, its store
            sh = rows.shared[:, None]
            if name == "value":
                t = (w * w * (bP + sh)).T @ (dO * dO) + 2.0 * eta_x * eta_x * (np.ones_like(w).T @ (dO * dO))
                if shared is not None:  # P's own errors per (i, j), the row's sum per i: loading w
                    shared.append((idx[b], dO, w * w * bP + 2.0 * eta_x * eta_x, w, rows.shared, None, None, None))
                t = t + u * u * (_block_partials(np.ascontiguousarray(w.T), dO) + (w * w).T @ (dO * dO))
            else:
                dP = dO @ v.T
                vdP = u * u * (_block_partials(dO, np.ascontiguousarray(v.T), DOT_BLOCK) + (dO * dO) @ (v * v).T)
                vdP = vdP + (uc * dP) ** 2
                var_o = rows.var + 2.0 * (u_o * o) ** 2  # the stored forward output
                Del = np.einsum("ic,ic->i", dO, o)
                do = dO * o
                vDel = np.einsum("ic,ic->i", dO * dO, var_o) + u * u * (_partial_sq(do) + (do * do).sum(axis=1))
                vDel = vDel + np.einsum("ij,ij->i", (w * dP) ** 2, bP) + np.einsum("ij,ij->i", w * w, vdP)
                vDel = (vDel + (uc * Del) ** 2)[:, None]
                h = dP - Del[:, None]
                dS = w * h
                ind = dS * dS * (bP + 2.0 * uc * uc) + w * w * (vdP + (uc * h) ** 2)  # own: P, dP, h, product, store
                # the roundings that may land below the normals lose eta_x each (absolute, whatever the value):
                # P's exp and division (their error times h in dS), dP's E products and E - 1 sums, Delta's
                # E terms, h, dS's product (each times P <= 1 at most), through the product with k (or q)
                eta_dS = eta_x * eta_x * (2.0 * h * h + (3.0 * E + 2.0))
                if shared is not None:  # per (i, j): dS's own errors; per query row i: the row's sum, Delta
                    shared.append((idx[b], k if name == "query" else q, ind + eta_dS, dS, rows.shared, w, vDel[:, 0],
                                   uq))  # fmt: skip
                if name == "query":
                    dq = dS @ k
                    t = ind @ (k * k) + sh * dq * dq + vDel * (w @ k) ** 2 + eta_dS @ (k * k)
                    t = t + u * u * (_block_partials(dS, k) + (dS * dS) @ (k * k)) + uq * uq * ((dS * dS) @ (k * k))
                    t = s * s * t + (u * s * dq) ** 2
                else:
                    dk = dS.T @ q
                    t = (ind + dS * dS * sh + w * w * vDel).T @ (q * q) + eta_dS.T @ (q * q)
                    t = t + u * u * (_block_partials(np.ascontiguousarray(dS.T), q) + (dS * dS).T @ (q * q))
                    t = t + uq * uq * ((dS * dS).T @ (q * q))
                    t = s * s * t + (u * s * dk) ** 2
            var[idx[b]] += np.where(np.isfinite(t), t, np.inf)
    n = S if name == "query" else at.Q.shape[1]  # the products and partial sums of the last GEMM, the scale:
    return var + _stores(np.asarray(ref, np.float64), fmt, 2 * n + 8)  # each may lose eta_w (s eta_w: s <= 1 here)


class AttentionShared:
    """:attr:`~refkern.analysis.noise.Noise.coherent` of an attention gradient (``name``), in the interface of
    :class:`~refkern.analysis.noise_rows.RowShared` with one row per head of the operand's 3-D stack (its
    :meth:`per_row` is this model's): the errors that several elements share, per head, beyond ``sum sigma**2
    w**2``. A gradient element of key ``j`` (query ``i``), column ``c`` is ``s sum_i dS_ij q_ic`` (``s sum_j dS_ij
    k_jc``; value: ``sum_i P_ij dO_ic``), so the rounding of one ``dS_ij`` (its own variance ``A_ij``: P's, dP's,
    h's and the product's roundings, :func:`attention_noise`'s ``ind`` and ``eta_dS``; value: P's own and the store)
    moves every column ``c`` of that key (query) row by ``dS_ij`` times ``q_ic`` (``k_jc``, ``dO_ic``): in ``sum e
    w`` it weighs ``M_ij = s sum_c W_jc q_ic`` (``W`` the weights in the head's layout), variance ``A_ij M_ij**2``;
    query row ``i``'s shared relative error (its sum, variance ``sh_i``) moves every ``dS_ij`` by ``dS_ij`` (value:
    ``P_ij``): ``sh_i (sum_j dS_ij M_ij)**2``; its Delta (variance ``vDel_i``) every ``dS_ij`` by ``-P_ij``:
    ``vDel_i (sum_j P_ij M_ij)**2``; the scaled operand's store (``uq`` relative, each ``q_ic`` shared by every key;
    ``k_jc`` by every query): ``(uq s)**2 sum_ic (q_ic sum_j dS_ij W_jc)**2``. Query rows are independent (heads
    too; the query heads of a GQA key add into its row). The diagonal is counted again (the sums' squares, not less
    their squares), as :func:`norm_param_noise`'s ``coherent``: more variance, never less. A gradient scaled by 8x
    the spread of correct kernels (bfloat16 keys, 64 x 64 per head) passed every element's test, whose scale holds
    these shared errors element by element; the scale tests of :func:`~refkern.analysis.verdict._scale_failure` and
    :func:`~refkern.analysis.verdict._row_scale_failures` see it."""

    def __init__(self, parts, stack, name, scale):
        self.parts, self.stack, self.name, self.scale = parts, tuple(stack), name, abs(float(scale))
        self.count = int(stack[0])
        self.terms, self.sigma, self.bounds, self.keys, self.fused = (), None, (), None, None

    def rows(self, v):
        return np.asarray(v).reshape(self.count, -1)

    def back(self, v):
        return np.asarray(v).reshape(self.stack)

    def held_stats(self, a, c, var):
        return None

    def bound(self, w):
        return None

    def grouped(self, w, var, sel):
        return None

    def stats(self, r, vk, keep, y):
        from refkern.analysis.noise_rows import RowShared

        return RowShared.stats(self, r, vk, keep, y)

    def per_row(self, w) -> np.ndarray:
        W = np.asarray(w, np.float64).reshape(self.stack)
        out = np.zeros(self.count)
        with np.errstate(all="ignore"):
            for h, X, A, D, sh, P, vDel, uq in self.parts:
                Wh = np.where(np.isfinite(W[h]), W[h], 0.0)
                if self.name == "value":  # M_ij = sum_c W_jc dO_ic
                    M = X @ Wh.T
                else:  # M_ij = s sum_c W_jc q_ic (key), s sum_c W_ic k_jc (query)
                    M = self.scale * (X @ Wh.T if self.name == "key" else Wh @ X.T)
                e = np.sum(A * M * M) + np.sum(sh * np.einsum("ij,ij->i", D, M) ** 2)
                if P is not None:
                    e += np.sum(vDel * np.einsum("ij,ij->i", P, M) ** 2)
                    # the scaled operand stored (uq): q_ic's rounding moves key j's column c by s dS_ij q_ic
                    N = D.T @ Wh if self.name == "query" else D @ Wh
                    e += (uq * self.scale) ** 2 * np.sum((X * N) ** 2)
                out[h] += e if np.isfinite(e) else np.inf
        return out

    def __call__(self, w) -> float:
        return float(np.sum(self.per_row(w)))
