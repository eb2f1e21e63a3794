"""Ground truth of embedding and its gradient: the lookup copies values; the gradient of ``weight`` is, per
row ``v`` and column j, the sum of ``grad_output[i, j]`` over the positions i whose index is v (over their
count with ``scale_grad_by_freq``), 0 for ``padding_idx``: exact Fractions, rounded once on integers
(:func:`refkern.truth.reductions.round_fraction`). Its own reading of the arguments, loops and rounding:
nothing shared with :mod:`refkern.kernels.embedding`."""

from fractions import Fraction

import numpy as np

from refkern._arrays import operand
from refkern.truth.reductions import round_fraction

__all__ = ["embedding", "backward"]


def _ints(t):
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t).astype(np.int64)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,  # noqa: A002
              sparse=False, *, precision=None):  # fmt: skip
    """Ground truth of :func:`refkern.embedding`: the rows of weight at the indices, as float64 values."""
    w = operand(weight, "weight", "embedding")
    W = np.asarray(w.values, np.float64).reshape(w.shape)
    return W[_ints(input)]


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
