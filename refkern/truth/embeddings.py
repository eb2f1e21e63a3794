"""Ground truth of embedding and its gradient: the lookup copies values; the gradient of ``weight`` is, per
row ``v`` and column j, the sum of ``grad_output[i, j]`` over the positions i whose index is v (over their
count with ``scale_grad_by_freq``), 0 for ``padding_idx``: exact Fractions, rounded once on integers
(:func:`refkern.truth.reductions.round_fraction`). Its own reading of the arguments, loops and rounding:
nothing shared with :mod:`refkern.kernels.embedding`."""

import math
from fractions import Fraction

import mpmath
import numpy as np

from refkern._arrays import operand
from refkern.truth.reductions import round_fraction
from refkern.truth.softmax import _decide

iv = mpmath.iv

__all__ = ["embedding", "backward"]


def _ints(t):
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t).astype(np.int64)


def _norm(row, p):
    """||row||_p as an mpmath interval at the current precision."""
    a = [abs(float(v)) for v in row]
    if p == math.inf:
        return iv.mpf(max(a, default=0.0))
    s = iv.mpf(0)
    for v in a:
        if v:
            s += iv.exp(iv.log(iv.mpf(v)) * p) if p not in (1.0, 2.0) else iv.mpf(v) ** int(p)
    if p == 1.0 or s == 0:
        return s
    return iv.sqrt(s) if p == 2.0 else iv.exp(iv.log(s) / p)


def _renorm(row, m, p, fmt):
    """The row scaled by m / (||row||_p + 1e-7) where its norm exceeds m (else None), each value rounded once."""
    if not np.isfinite(row).all():
        return None if np.isnan(row).any() else row * 0.0
    prec = 64
    saved = iv.prec
    try:
        while True:
            iv.prec = prec
            N = _norm(row, p)
            if N.a > m or N.b <= m:
                break
            prec *= 2
            if prec > 1 << 16:
                raise RuntimeError("truth: the norm equals max_norm to 65536 bits")
    finally:
        iv.prec = saved
    if not N.a > m:
        return None
    eps = iv.mpf(1e-7)
    return np.asarray([_decide(fmt, lambda v=v: iv.mpf(float(v)) * iv.mpf(m) / (_norm(row, p) + eps), 64)
                       for v in row], np.float64)  # fmt: skip


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,  # noqa: A002
              sparse=False, *, precision=None):  # fmt: skip
    """Ground truth of :func:`refkern.embedding`: the rows of weight at the indices (renormalised with
    ``max_norm``: mpmath intervals, rounded once), as float64 values."""
    w = operand(weight, "weight", "embedding")
    W = np.asarray(w.values, np.float64).reshape(w.shape)
    idx = _ints(input)
    if max_norm is not None:
        W = W.copy()
        for r in sorted(set(int(i) for i in idx.reshape(-1))):
            v = _renorm(W[r], float(max_norm), float(norm_type), w.fmt)
            if v is not None:
                W[r] = v
    return W[idx]


def backward(grad_output, a, wrt) -> dict:
    """``{"weight": gradient}`` (float64 values holding the rounded results) of embedding's call ``a``."""
    og = operand(grad_output, "grad_output", "truth.backward")
    idx = _ints(a["input"]).reshape(-1)
    V, D = operand(a["weight"], "weight", "truth.backward").shape
    G = np.asarray(og.values, np.float64).reshape(len(idx), D)
    pad = a.get("padding_idx")
    pad = None if pad is None else int(pad) % V
    out = np.zeros((V, D))
    for v in set(int(i) for i in idx):
        if v == pad:
            continue
        rows = [i for i in range(len(idx)) if idx[i] == v]
        for j in range(D):
            tot = sum((Fraction(float(G[i, j])) for i in rows), Fraction(0))
            out[v, j] = round_fraction(tot / len(rows) if a.get("scale_grad_by_freq") else tot, og.fmt)
    return {"weight": out}
