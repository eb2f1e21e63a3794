"""``refkern.scaled_dot_product_attention``: torch's definition, real-valued, rounded once.

For each query row i (of every batch and head) and value column c:

    z_j = s * (q_i . k_j) + m_ij,   p_j = e**(z_j - max z),   out_ic = sum_j p_j v_jc / sum_j p_j,

with the dot products exact (sums of exact products of the inputs), ``s`` the float64 scale,
``m`` the additive mask (a boolean mask is 0 where True and -inf where False; ``is_causal``
masks ``j > i``, top-left aligned, as torch), every operation real, and one rounding to the
query's dtype. ``scale=None`` is ``1 / sqrt(E)`` as torch's math backend evaluates it in
float64: ``fl(1 / fl(sqrt(E)))`` (E = 64 gives 0.125 exactly, E = 5 gives 0.4472135954999579).

Specials follow IEEE 754 on the definition, as torch's math backend (CPU) does: a logit
that is NaN or +inf (a NaN or inf input, a +inf or NaN mask value, inf - inf) makes the row
NaN; a -inf logit gives the weight 0 exactly; a row whose logits are all -inf (fully masked)
gives 0 -- torch's CPU math backend returns zeros there since torch 2.5 -- and in every row a
value column holding NaN, or +-inf where the weight is 0 (0 * inf), gives NaN, and +-inf
where the weight is positive gives +-inf (NaN if both signs). ``E = 0``: the logits are the
mask (torch's math backend scales q and k, whose empty product is 0). ``S = 0``: zeros.

Layouts, as torch: query (..., L, E), key (..., S, E), value (..., S, Ev), at least 2-D, one
dtype; batch dimensions broadcast as in ``matmul``; ``enable_gqa`` repeats each key/value head
(dim -3) ``Hq / Hk`` times (``repeat_interleave``) when Hq is a multiple of Hk; the mask
(bool, float32 or the query's dtype) broadcasts to (batch of q k^T, L, S) without growing it.
``dropout_p > 0`` is refused: no reference exists for a random mask the caller cannot pass in.

Method (Ziv's strategy). float16/bfloat16/float32 inputs: ``q k^T`` in float64 by BLAS (the
products are exact; any summation order errs by at most ``gamma_E sum |q_l k_l| <= gamma_E
||q|| ||k||``), exp by :func:`~refkern.kernels._transcendental.exp_fast` with its bound, the
row sum with its bound, ``P v`` by BLAS (error ``gamma_S sum_j P_j |v_jc|``, bounded by
``min(||P|| ||v_c||, D max|v_c|)``); each element is bracketed and both ends rounded with
:func:`~refkern.accumulate.formats.round_to`. Undecided rows, rows with non-finite inputs and
every row of a float64 result take a double-word pass (Dot2 logits, exp_dd, double-word sums,
:func:`~refkern.kernels._transcendental.decide_scaled`); the elements still undecided (an
output that is exactly a midpoint, e.g. the mean of two values when all logits are equal, or
extreme ranges) are decided by exact integer intervals (:func:`exact_row`), which finds the
rational outputs first: by Lindemann-Weierstrass the output is rational exactly when every
group of equal logits has the same mean of ``v_c``, and is then that mean.
"""

import math
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import prange

from refkern._arrays import is_tensor, operand
from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import FLOAT32, Format
from refkern.kernels._attention_dd import _dd_rows, _mask_value  # noqa: F401 - _mask_value: the backward reads it here
from refkern.kernels._common import deliver
from refkern.kernels._exact_attention_row import exact_row  # re-exported
from refkern.kernels._transcendental import (
    EXP_FAST_REL,
    X_MIN,
    U,
    bracket_around,
    exp_fast,
)

__all__ = ["scaled_dot_product_attention", "Attention", "attention_operands", "attention_rows", "AttnCounts",
           "exact_row", "default_scale"]  # fmt: skip

OP = "scaled_dot_product_attention"
_TINY = 2.0**-1074


def default_scale(E: int) -> float:
    """torch's ``scale=None``: ``1.0 / sqrt(E)`` in float64 (both operations correctly rounded)."""
    return 1.0 / math.sqrt(E) if E > 0 else math.inf


@dataclass
class Attention:
    """A validated call: operands as float64 3-D stacks and index maps from the output batch."""

    Q: np.ndarray  # (Bq, L, E)
    K: np.ndarray  # (Bk, S, E)
    V: np.ndarray  # (Bv, S, Ev)
    iq: np.ndarray  # (B,) int64: output batch -> row of Q (likewise K, V, the mask)
    ik: np.ndarray
    iv: np.ndarray
    mask: np.ndarray  # (Bm, Lm, Sm) additive float64 mask; Lm in {1, L}, Sm in {1, S}
    im: np.ndarray
    has_mask: bool
    causal: bool
    scale: float
    fmt: Format
    out_shape: tuple
    tensor: bool


def _batch_map(shape: tuple, out: tuple, repeat: int = 1) -> np.ndarray:
    """Index into the flattened batch of an operand of batch shape ``shape`` for every element of the
    output batch ``out`` (broadcast; the last batch axis repeated ``repeat`` times, as
    repeat_interleave on dim -3)."""
    idx = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    if repeat > 1:
        idx = np.repeat(idx, repeat, axis=-1)
    # a writable copy always (a few integers): a read-only view where nothing broadcasts would be a kernel
    # signature of its own, one more compilation of each kernel that takes it (_dd_rows: 4 of them)
    return np.array(np.broadcast_to(idx, out).reshape(-1), dtype=np.int64)


def _gqa_factor(hq: int, hk: int, name: str) -> int:
    r = hq // hk if hk else 0
    if not hk or hq % hk:
        raise ValueError(
            f"{OP}: with enable_gqa=True the query heads must be a multiple of the {name} heads (dim -3); got "
            f"{hq} query heads and {hk} {name} heads."
        )
    return max(r, 1)


def attention_operands(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, op: str = OP) -> Attention:  # fmt: skip
    """Validate and normalise a call exactly as torch's math backend does (module docstring)."""
    q, k, v = (operand(x, n, op) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if not (q.fmt == k.fmt == v.fmt):
        raise TypeError(
            f"{op}: query, key and value must have the same dtype, as torch requires; got query.dtype="
            f"{q.fmt.name}, key.dtype={k.fmt.name} and value.dtype={v.fmt.name}."
        )
    if min(len(q.shape), len(k.shape), len(v.shape)) < 2:
        raise ValueError(
            f"{op}: query, key and value must be at least 2-D (..., L, E), (..., S, E), (..., S, Ev); got "
            f"query.shape={q.shape}, key.shape={k.shape} and value.shape={v.shape}."
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: dropout_p must be a number; got {dropout_p!r}.")
    if dropout_p != 0:
        raise ValueError(
            f"{op}: dropout_p must be 0; got dropout_p={dropout_p}. No reference exists for a random dropout mask "
            "the caller cannot pass in: compare with dropout off (dropout_p=0.0, or model.eval())."
        )
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: attn_mask must be None when is_causal=True, as torch requires; got both.")
    E, L = q.shape[-1], q.shape[-2]
    S = k.shape[-2]
    if k.shape[-1] != E:
        raise ValueError(f"{op}: query and key must have the same last dimension E; got query.shape={q.shape} and "
                         f"key.shape={k.shape}.")  # fmt: skip
    if v.shape[-2] != S:
        raise ValueError(f"{op}: key and value must have the same number of positions S (dim -2); got "
                         f"key.shape={k.shape} and value.shape={v.shape}.")  # fmt: skip
    if scale is None:
        s = default_scale(E)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: scale must be a float or None; got {scale!r}.")
    else:
        s = float(scale)
    qb, kb, vb = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    rk = rv = 1
    if enable_gqa:
        if len(q.shape) < 3 or len(k.shape) < 3 or len(v.shape) < 3:
            raise ValueError(f"{op}: enable_gqa=True needs a head dimension (dim -3) in query, key and value; got "
                             f"query.shape={q.shape}, key.shape={k.shape} and value.shape={v.shape}.")  # fmt: skip
        rk = _gqa_factor(qb[-1], kb[-1], "key")
        rv = _gqa_factor(qb[-1], vb[-1], "value")
        kb = kb[:-1] + (kb[-1] * rk,)
        vb = vb[:-1] + (vb[-1] * rv,)
    try:
        bqk = np.broadcast_shapes(qb, kb)
        out_b = np.broadcast_shapes(bqk, vb)
    except ValueError:
        raise ValueError(f"{op}: the batch dimensions of query, key and value do not broadcast; got query.shape="
                         f"{q.shape}, key.shape={k.shape} and value.shape={v.shape}.") from None  # fmt: skip
    if attn_mask is None:
        M3 = np.zeros((1, 1, 1))
        mb = ()
    else:
        M3, mb = _mask(attn_mask, q.fmt, bqk, L, S, op)
    iq = _batch_map(qb, out_b)
    ik = _batch_map(k.shape[:-2], out_b, rk)
    iv = _batch_map(v.shape[:-2], out_b, rv)
    im = _batch_map(mb, out_b)
    Q, K, V = (np.ascontiguousarray(np.asarray(x.values, np.float64).reshape(math.prod(x.shape[:-2]), *x.shape[-2:]))
               for x in (q, k, v))  # fmt: skip
    return Attention(Q, K, V, iq, ik, iv, M3, im, attn_mask is not None, bool(is_causal), s, q.fmt,
                     tuple(out_b) + (L, v.shape[-1]), q.torch or k.torch or v.torch)  # fmt: skip


def _mask(attn_mask, qfmt: Format, bqk: tuple, L: int, S: int, op: str):
    """The mask as an additive float64 (Bm, Lm, Sm) array and its batch shape."""
    if is_tensor(attn_mask):
        is_bool = str(attn_mask.dtype) == "torch.bool"
        arr = attn_mask.detach().cpu().numpy() if is_bool else None
    else:
        a = np.asarray(attn_mask)
        is_bool = a.dtype == np.bool_
        arr = a if is_bool else None
    if is_bool:
        m = np.where(arr, 0.0, -np.inf)
    else:
        o = operand(attn_mask, "attn_mask", op)
        if o.fmt.name not in ("float32", qfmt.name):
            raise TypeError(
                f"{op}: attn_mask must be bool, float32 or the query's dtype ({qfmt.name}), as torch requires; got "
                f"attn_mask.dtype={o.fmt.name}."
            )
        m = np.asarray(o.values, np.float64)
    if m.ndim < 2:
        m = m.reshape((1,) * (2 - m.ndim) + m.shape)
    try:
        ok = np.broadcast_shapes(m.shape, bqk + (L, S)) == bqk + (L, S)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{op}: attn_mask must broadcast to the attention weights' shape {bqk + (L, S)} (batch of query @ key^T, "
            f"L, S) without growing it; got attn_mask.shape={tuple(m.shape)}."
        )
    mb = m.shape[:-2]
    return np.ascontiguousarray(m.reshape((-1,) + m.shape[-2:]), dtype=np.float64), mb


# ------------------------------------------------------------------ the float64 pass (narrow formats)
# The logits and weights of one row, with their bounds, are formed by the helpers below, read by this pass and by
# the backward's (refkern.kernels.attention_backward._fast_rows), which differ only in how q . k is summed.


@jit(inline="always")
def row_masks(M3, imb, i, causal, has_mask, z):
    """z[j] = the mask's value m_ij of row i (-inf where masked out: ``is_causal``'s ``j > i``, a boolean mask's
    False); True (the row is NaN) at the first m_ij that is NaN or +inf, z then left part-filled."""
    for j in range(z.size):
        m = _mask_value(M3, imb, i, j, causal, has_mask)
        if m != m or m == np.inf:
            return True
        z[j] = m
    return False


@jit(inline="always")
def add_logit(z, ez, j, sz, err):
    """``z_j = fl(sz + m_ij)`` (``z[j]`` holds the finite ``m_ij`` on entry; ``sz`` the scaled dot product
    ``fl(s q_i . k_j)`` without its rounding, within ``err`` of the exact one) and ``ez[j] >= |z_j - z_j exact|``:
    ``err`` plus ``u (|sz| + |z_j|)`` for the scaling's and the mask's roundings, times ``1 + 2**-50`` for the
    evaluation of the bound, plus ``2**-1073`` (either rounding may underflow: 2**-1075 each)."""
    zj = sz + z[j]
    z[j] = zj
    ez[j] = (err + U * (abs(sz) + abs(zj))) * (1.0 + 2.0**-50) + 2.0 * _TINY


@jit(inline="always")
def row_max(z, ez):
    """(M, eM): the row's largest logit (the first of equal ones) and its bound ``ez``; M = -inf when every logit
    is masked out (the row is fully masked)."""
    M = -np.inf
    eM = 0.0
    for j in range(z.size):
        if z[j] > M:
            M = z[j]
            eM = ez[j]
    return M, eM


@jit(inline="always")
def exp_weights(z, ez, M, eM, p, eps):
    """The unnormalised weights ``p_j = e**(z_j - M)`` of a row, each within its bound, and their sum.

    ``d = z_j - M`` is exact as ``d + dd`` (two-sum) and off the real argument by at most
    ``ed = |dd| + ez_j + eM``; below 2**-20 that moves ``e**x`` by at most ``1.01 ed``, so ``p_j`` (exp_fast) is
    within ``eps_j = EXP_FAST_REL + 1.02 ed`` relative; a masked logit, and ``d < X_MIN`` (``e**d < 2**-2885``,
    in the slack), give ``p_j = eps_j = 0``. Returns ``(D, ED, ok)``: ``D = sum p_j`` in float64, in order, and
    ``ED = (sum eps_j p_j + (n - 1) u D) 1.01 + S 2**-1074 >= |D - sum of the exact weights|`` (n the exp terms,
    each addition within u of a partial sum <= D; 2**-1074 a dropped or underflowed term); ``ok`` is False, and
    the sums stop there, at the first ``ed > 2**-20`` (large logits: the row goes to a later pass)."""
    S = z.size
    for j in range(S):
        p[j] = 0.0
        eps[j] = 0.0
    d_sum = 0.0
    e_sum = 0.0
    cnt = 0
    ok = True
    for j in range(S):
        if z[j] == -np.inf:
            continue
        d, dd = two_sum(z[j], -M)
        ed = abs(dd) + ez[j] + eM
        if ed > 2.0**-20:
            ok = False
            break
        if d < X_MIN:  # e**d < 2**-2885: inside the slack
            continue
        a, k = exp_fast(d)
        pj = math.ldexp(a, k)
        p[j] = pj
        eps[j] = EXP_FAST_REL + 1.02 * ed
        d_sum += pj
        e_sum += eps[j] * pj
        cnt += 1
    return d_sum, (e_sum + max(cnt - 1, 0) * U * d_sum) * 1.01 + S * _TINY, ok


@jit(parallel=True)
def _fast_weights(Z, nq, nk, iq, ik, scale, G, M3, im, has_mask, causal, P, D, ED, eps, pn, status):
    """Per row (b, i): unnormalised weights P[b, i, :] (float64), their sum D with its error ED,
    the largest relative error eps of a weight, ``pn >= ||P row||``, and status: 0 fine, 1 for the
    double-word pass, 2 NaN row, 3 fully masked. Z = q k^T by BLAS, within ``G ||q|| ||k||``."""
    B, L, S = Z.shape
    for t in prange(B * L):
        b = t // L
        i = t % L
        z = np.empty(S)
        ez = np.empty(S)
        if row_masks(M3, im[b], i, causal, has_mask, z):
            status[b, i] = 2
            P[b, i, :] = 0.0
            continue
        for j in range(S):
            if z[j] != -np.inf:
                add_logit(z, ez, j, scale * Z[b, i, j], abs(scale) * G * nq[iq[b], i] * nk[ik[b], j])
        M, eM = row_max(z, ez)
        if M == -np.inf:
            status[b, i] = 3
            P[b, i, :] = 0.0
            continue
        e = np.empty(S)
        d_sum, e_sum, ok = exp_weights(z, ez, M, eM, P[b, i], e)
        e_max = 0.0
        sq = 0.0
        for j in range(S):  # zero beyond the exp terms
            e_max = max(e_max, e[j])
            sq += P[b, i, j] * P[b, i, j]
        status[b, i] = 0 if ok else 1
        D[b, i] = d_sum
        ED[b, i] = e_sum
        eps[b, i] = e_max
        pn[b, i] = math.sqrt(sq) * (1.0 + (S + 4) * U) + S * _TINY


@jit(parallel=True)
def _fast_decide(N, D, ED, eps, pn, vn, vmax, iv, gS, prec, emin, emax, status, out, pending):
    """out[b, i, c] = RN(N / D) when the bound decides it, else pending[b, i, c] (every column of a
    status-1 row). N = P v by BLAS: within ``gS sum_j P_j |v_jc| + S 2**-1075`` of the product of
    the computed weights, and those within ``eps`` (relative) of the exact ones."""
    B, L, Ev = N.shape
    for t in prange(B * L):
        b = t // L
        i = t % L
        st = status[b, i]
        if st == 2:
            out[b, i, :] = np.nan
            continue
        if st == 3:
            out[b, i, :] = 0.0  # fully masked: zeros, as torch's math backend
            continue
        d = D[b, i]
        rho = ED[b, i] / d
        if st == 1 or not rho < 2.0**-20:
            pending[b, i, :] = True
            continue
        for c in range(Ev):
            nv = N[b, i, c]
            A = min(pn[b, i] * vn[iv[b], c], d * (1.0 + 2.0 * gS) * vmax[iv[b], c]) * (1.0 + 2.0**-40)
            eN = (gS + eps[b, i] * 1.01) * A * 1.01 + 2.0**-1000 * (1.0 + vmax[iv[b], c])  # underflows: S 2**-1075
            y = nv / d
            e = ((eN + (abs(nv) + eN) * rho) / (d * (1.0 - rho)) + U * abs(y)) * 1.0001
            val, ok = bracket_around(y, e, False, prec, emin, emax)
            out[b, i, c] = val
            pending[b, i, c] = not ok


# ------------------------------------------------------------------ the double-word pass (any format):
# refkern/kernels/_attention_dd.py; the exact path (Python integers): refkern/kernels/_exact_attention_row.py


# ------------------------------------------------------------------ driver


@dataclass
class AttnCounts:
    """How many rows and elements each path decided (for tests and benchmarks)."""

    rows: int = 0
    elements: int = 0
    fast_rows: int = 0  #: rows decided entirely by the float64 pass
    dd_rows: int = 0  #: rows that went through the double-word pass (for their undecided columns)
    exact_elements: int = 0  #: elements decided by the exact integer path
    exact_where: list = field(default_factory=list)  #: (batch, row, column) of those elements


def _mask_row(a: Attention, b: int, i: int) -> np.ndarray:
    S = a.K.shape[1]
    if a.causal:
        return np.where(np.arange(S) > i, -np.inf, 0.0)
    if not a.has_mask:
        return np.zeros(S)
    m = a.mask[a.im[b], i if a.mask.shape[1] > 1 else 0]
    return np.broadcast_to(m, (S,))


def _norms(X: np.ndarray) -> np.ndarray:
    """Upper bounds on the 2-norms of the last axis (float64 sum of exact squares of narrow values:
    within gamma_n; the square root within u)."""
    n = X.shape[-1]
    return np.sqrt(np.einsum("...k,...k->...", X, X)) * (1.0 + (n + 4) * U) * (1.0 + 2.0**-50)


def attention_rows(a: Attention, force: str | None = None):
    """(out (B, L, Ev) float64, AttnCounts). force = "dd" skips the float64 pass, "exact" sends every
    element to the exact integer path."""
    B = a.iq.size
    L, E = a.Q.shape[1], a.Q.shape[2]
    S, Ev = a.V.shape[1], a.V.shape[2]
    out = np.zeros((B, L, Ev))
    counts = AttnCounts(rows=B * L, elements=B * L * Ev)
    if B * L * Ev == 0:
        return out, counts
    if S == 0:
        return out, counts  # no key: zeros, as torch
    und = np.zeros((B, L, Ev), np.bool_)
    if force == "exact":
        und[:] = True
    else:
        pending = np.ones((B, L, Ev), np.bool_)
        finite = all(np.isfinite(x).all() for x in (a.Q, a.K, a.V)) and math.isfinite(a.scale)
        if force is None and a.fmt.prec <= FLOAT32.prec and finite and E > 0:
            _fast(a, out, pending)
        rb, ri = np.nonzero(pending.any(axis=2))
        counts.fast_rows = B * L - rb.size
        counts.dd_rows = rb.size
        if rb.size:
            _dd_rows(a.Q, a.K, a.V, a.iq, a.ik, a.iv, a.mask, a.im, a.has_mask, a.causal, a.scale,
                     rb.astype(np.int64), ri.astype(np.int64), pending, *a.fmt.params, out, und)  # fmt: skip
    for b, i in zip(*np.nonzero(und.any(axis=2))):
        cols = np.flatnonzero(und[b, i]).tolist()
        vals = exact_row(a.Q[a.iq[b], i], a.K[a.ik[b]], a.V[a.iv[b]], _mask_row(a, b, i), a.scale, cols, a.fmt)
        for c, v in vals.items():
            out[b, i, c] = v
        counts.exact_elements += len(cols)
        counts.exact_where.extend((int(b), int(i), c) for c in cols)
    return out, counts


def _bmm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A @ B (float64 stacks) by a BLAS: torch's (MKL) when torch is loaded, else numpy's. Either sums each
    dot product in some order, so its error is within gamma_K sum |a_l b_l| (the bound the pass charges)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.matmul(torch.from_numpy(A), torch.from_numpy(B)).numpy()
    return np.matmul(A, B)


def _fast(a: Attention, out: np.ndarray, pending: np.ndarray) -> None:
    """The float64 pass: decides out, and marks in pending (B, L, Ev) what is left for the double-word pass."""
    B = a.iq.size
    L, E = a.Q.shape[1], a.Q.shape[2]
    S = a.K.shape[1]
    same_q = a.Q.shape[0] == B and np.array_equal(a.iq, np.arange(B))
    same_k = a.K.shape[0] == B and np.array_equal(a.ik, np.arange(B))
    Qg = a.Q if same_q else a.Q[a.iq]
    Kg = a.K if same_k else a.K[a.ik]
    Z = _bmm(Qg, Kg.transpose(0, 2, 1))  # exact products, rounded sums: within gamma_E ||q|| ||k||
    gE = E * U / (1.0 - E * U) * (1.0 + 2.0**-40)
    nq, nk = _norms(a.Q), _norms(a.K)
    P = np.empty((B, L, S))
    D, ED, eps, pn = (np.empty((B, L)) for _ in range(4))
    status = np.zeros((B, L), np.int64)
    _fast_weights(Z, nq, nk, a.iq, a.ik, a.scale, gE, a.mask, a.im, a.has_mask, a.causal, P, D, ED, eps, pn, status)
    same_v = a.V.shape[0] == B and np.array_equal(a.iv, np.arange(B))
    N = _bmm(P, a.V if same_v else a.V[a.iv])
    gS = S * U / (1.0 - S * U) * (1.0 + 2.0**-40)
    vn = _norms(np.ascontiguousarray(a.V.transpose(0, 2, 1)))
    vmax = np.abs(a.V).max(axis=1)
    _fast_decide(N, D, ED, eps, pn, vn, vmax, a.iv, gS, *a.fmt.params, status, out, pending)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):  # fmt: skip
    """Reference ``torch.nn.functional.scaled_dot_product_attention``, correctly rounded.

    Every output element is ``sum_j p_j v_jc / sum_j p_j`` with ``p_j = e**(z_j - max z)`` and
    ``z_j = scale * (q . k_j) + mask_j``: exact dot products, real exp and division, one rounding
    to the query's dtype (nearest, ties to even). ``scale=None`` is torch's float64
    ``1 / sqrt(E)``; a boolean mask adds 0 (True: takes part) or -inf (False), a float mask (float32
    or the query's dtype) adds its exact values; ``is_causal`` masks keys after the query
    (top-left aligned); ``enable_gqa`` repeats key/value heads. A fully masked row gives zeros
    (torch's CPU math backend), NaN/inf follow IEEE 754 on the definition (module docstring).
    ``dropout_p`` must be 0: a ValueError says why. numpy arrays or torch tensors in; the same
    kind out, shape (..., L, Ev) with the broadcast batch dimensions.
    """
    a = attention_operands(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    out, _ = attention_rows(a)
    return deliver(out.reshape(a.out_shape), a.fmt, a.tensor)
