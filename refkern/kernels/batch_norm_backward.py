"""The backward of batch_norm in eval mode (``training=False``), correctly rounded.

With the running statistics given, the output is an affine map of the input per channel c:
``y = (x - rm_c) r_c w_c + b_c``, ``r_c = (rv_c + eps)**(-1/2)``. Its gradients, each real-valued and
rounded once to its argument's dtype:

    grad_input  = g w_c r_c
    grad_weight = r_c sum_k g_k (x_k - rm_c)       (over the batch and spatial positions of c)
    grad_bias   = sum_k g_k

Method (Ziv's strategy, as :mod:`refkern.kernels.norm_backward`). A float64 pass evaluates each with
a rigorous absolute error bound: ``z = rv + eps`` exactly as a double-word (TwoSum), ``r`` in
double-word arithmetic (:func:`~refkern.accumulate.dd.dd_sqrt`, :func:`~refkern.accumulate.dd.dd_div`,
relative error EPS each, as the forward's ``_normalize``), every float64 operation charged
``u |result|`` (``u = 2**-53``) and every product ``TINY`` for underflow; ``xhat_k = (x_k - rm) r``
with ``x_k - rm`` a TwoSum (its low part dropped and charged whole); grad_weight and grad_bias then
sum as :func:`refkern.kernels.norm_backward._fast_cols` does. :func:`~refkern.accumulate.ziv.decide`
rounds where the bound allows; the rest take the exact path: grad_input is
:func:`~refkern.accumulate.ziv.round_quotient_sqrt` ``(0, g w, z)`` and grad_weight ``(0, sum g (x -
rm), z)`` (every term of a channel shares one ``1/sqrt(z)``: one rounding of a rational over a square
root), grad_bias an exact Fraction sum.

A channel holding a NaN or an infinity (in x, g, w, rm or rv), or with ``rv + eps <= 0``, has no
real-valued answer: it follows IEEE float64 arithmetic on torch's formula (``invstd = 1 / sqrt(rv +
eps)``, ``g invstd w``, ``sum g (x - rm) invstd``); grad_bias stays the exact sum where g is finite.
"""

from fractions import Fraction

import numpy as np
from numba import prange

from refkern._jit import jit
from refkern.accumulate.dd import EPS, dd_div, dd_sqrt, safe
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import round_array
from refkern.accumulate.ziv import decide, round_fraction, round_quotient_sqrt
from refkern.kernels.norm_backward import TINY, U, _fast_cols

__all__ = ["batch_norm_eval_backward"]


@jit(parallel=True)
def _fast_eval(X, G, W, RM, RV, eps, prec, emin, emax, gin, xh, exh, status):
    """Rows (channels) of X, G, W (C, K): gin = RN(g w r) or NaN (undecided), xh/exh = (x - rm) r and
    its bound, status[c] = 0 (fast), 1 (exact path), 2 (IEEE path).

    Bounds: ``z = rv + eps`` is the exact double-word (z_h, z_l); ``s = sqrt(z)`` within ``EPS s``,
    ``r = 1 / s`` within ``e_r = (EPS s) / (s (s - EPS s)) + EPS r`` (the forward's propagation);
    ``|r - r_h| <= er = e_r + |r_l|``. ``p = g w`` within ``u |p| + TINY``; ``y = p r_h`` within
    ``e_p (r_h + er) + |p| er + u |y| + TINY``. ``d = x - rm`` is the TwoSum (d_h, d_l): ``xhat = d_h r_h``
    within ``|d_l| (r_h + er) + |d_h| er + u |xhat| + TINY``. ``decide`` gets the bound times ``1 +
    2**-40`` (the bound's own float64 evaluation)."""
    C, K = X.shape
    for c in prange(C):
        status[c] = 0
        for k in range(K):
            gin[c, k] = np.nan
        ok = abs(RM[c]) < np.inf and abs(RV[c]) < np.inf
        for k in range(K):
            if not (abs(X[c, k]) < np.inf and abs(G[c, k]) < np.inf and abs(W[c, k]) < np.inf):
                ok = False
        if not ok:
            status[c] = 2
            continue
        z_h, z_l = two_sum(RV[c], eps)  # exact
        if not (z_h > 0.0):
            status[c] = 2 if z_h + z_l <= 0.0 else 1
            continue
        if not safe(z_h):
            status[c] = 1
            continue
        s_h, s_l = dd_sqrt(z_h, z_l)
        e_s = EPS * s_h
        r_h, r_l = dd_div(1.0, 0.0, s_h, s_l)
        e_r = e_s / (s_h * (s_h - e_s)) + EPS * abs(r_h)
        er = e_r + abs(r_l)
        if not safe(r_h):
            status[c] = 1
            continue
        for k in range(K):
            p = G[c, k] * W[c, k]
            ep = U * abs(p) + TINY
            y = p * r_h
            e = ep * (r_h + er) + abs(p) * er + U * abs(y) + TINY
            if safe(p) and safe(y):
                v = decide(y, 0.0, e * (1.0 + 2.0**-40), prec, emin, emax)
                gin[c, k] = v if v != 0.0 else np.nan  # a zero's sign is the exact path's to decide
            d_h, d_l = two_sum(X[c, k], -RM[c])
            q = d_h * r_h
            xh[c, k] = q
            exh[c, k] = abs(d_l) * (r_h + er) + abs(d_h) * er + U * abs(q) + TINY
            if not (safe(d_h) and safe(q)):
                exh[c, k] = np.inf


def batch_norm_eval_backward(X, G, W, RM, RV, eps: float, fmts: dict, wrt) -> dict:
    """The gradients asked for (``wrt`` among "input", "weight", "bias") of batch_norm in eval mode:
    X and G (C, K) float64, the channels as rows; W (C, K) (the weight per row) or None; RM, RV (C,)
    the running statistics; each result a float64 array of values of ``fmts[name]``: {"input": (C,
    K), "weight": (C,), "bias": (C,)} (module docstring)."""
    C, K = X.shape
    X = np.ascontiguousarray(X, np.float64)
    G = np.ascontiguousarray(G, np.float64)
    Wk = np.ones((C, K)) if W is None else np.ascontiguousarray(W, np.float64)
    RM = np.ascontiguousarray(RM, np.float64)
    RV = np.ascontiguousarray(RV, np.float64)
    out = {}
    if C == 0 or K == 0:
        return {k: np.zeros((C, K) if k == "input" else (C,)) for k in wrt}
    gin = np.full((C, K), np.nan)
    xh = np.zeros((C, K))
    exh = np.full((C, K), np.inf)
    status = np.zeros(C, np.int64)
    _fast_eval(X, G, Wk, RM, RV, float(eps), *fmts["input"].params, gin, xh, exh, status)
    Q = lambda v: Fraction(float(v))  # noqa: E731
    z = {}

    def zc(c):
        if c not in z:
            z[c] = Q(RV[c]) + Q(eps)
        return z[c]

    for c in np.flatnonzero(status == 1):
        if zc(c) <= 0:
            status[c] = 2
    special = np.flatnonzero(status == 2)
    with np.errstate(all="ignore"):
        inv = 1.0 / np.sqrt(RV[special] + eps)  # torch's formula on the channels without a real value
    if "input" in wrt:
        fin = fmts["input"]
        if special.size:
            gin[special] = round_array(np.ascontiguousarray(G[special] * inv[:, None] * Wk[special]), *fin.params)
        for c in range(C):
            if status[c] == 2:
                continue
            for k in np.flatnonzero(np.isnan(gin[c])):
                p = Q(G[c, k]) * Q(Wk[c, k])
                if p == 0:  # an exact zero: the sign of the product g w r (r > 0), as IEEE gives it
                    gin[c, k] = np.copysign(0.0, G[c, k]) * np.copysign(1.0, Wk[c, k])
                else:
                    gin[c, k] = round_quotient_sqrt(Fraction(0), p, zc(c), fin)
        out["input"] = gin
    for name in ("weight", "bias"):
        if name not in wrt:
            continue
        fmt = fmts[name]
        col = np.full(C, np.nan)
        ok = status != 2
        if ok.any():
            rows = np.flatnonzero(ok)
            part = np.full(rows.size, np.nan)
            _fast_cols(np.ascontiguousarray(G[rows].T), np.ascontiguousarray(xh[rows].T),
                       np.ascontiguousarray(exh[rows].T), name == "weight", *fmt.params, part)  # fmt: skip
            col[rows] = part
        for c in range(C):
            if status[c] == 2:
                with np.errstate(all="ignore"):
                    if name == "bias" and np.isfinite(G[c]).all():
                        col[c] = round_fraction(sum((Q(v) for v in G[c]), Fraction(0)), fmt)
                    else:
                        t = G[c].sum() if name == "bias" else (G[c] * (X[c] - RM[c])).sum() * inv[special == c][0]
                        col[c] = round_array(np.array([t]), *fmt.params)[0]
                continue
            if np.isnan(col[c]):
                if name == "bias":
                    col[c] = round_fraction(sum((Q(v) for v in G[c]), Fraction(0)), fmt)
                else:
                    P = sum((Q(a) * (Q(b) - Q(RM[c])) for a, b in zip(G[c], X[c]) if a != 0), Fraction(0))
                    col[c] = 0.0 if P == 0 else round_quotient_sqrt(Fraction(0), P, zc(c), fmt)
        out[name] = col
    return out
