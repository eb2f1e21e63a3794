"""``refkern.embedding`` and its backward, ``refkern.embedding_dense_backward``: torch's semantics, exact.

The forward is a gather, ``weight[input]``: every value copied, exact. Its gradient (aten's
``embedding_dense_backward``) is a scatter-add: row ``v`` of ``grad_weight`` is the sum of the rows of
``grad_output`` whose index is ``v`` (divided by their count with ``scale_grad_by_freq``: torch counts
every occurrence), 0 for ``padding_idx`` and for indices that do not occur; each element is that real
number rounded once to grad_output's dtype.

Method: the rows are grouped by index (a stable sort); per group and column the float64 values are
summed by Ogita, Rump and Oishi's Sum2 (TwoSum per addition, the errors summed apart), whose pair ``s + c``
is within ``gamma_{k-1}(u)**2 sum |x|`` of the exact sum of k terms (doi:10.1137/030601818, Prop. 4.5,
before its last addition); with ``fl(s + c)`` (u of it) and, with ``scale_grad_by_freq``, ``fl(. / k)`` (u
more) the value is bracketed and rounded at both ends (:func:`~refkern.kernels._transcendental.bracket_around`,
float16/bfloat16/float32 results). A single term is copied as it is. The rest (float64 results of
repeated indices, values near a midpoint, float64 sums that overflow) are summed as exact integers and
rounded once (:func:`~refkern.accumulate.ziv.round_fraction`).
"""

import sys
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numba import prange

from refkern._arrays import converted_once, is_tensor, operand
from refkern._jit import jit
from refkern.accumulate.eft import two_sum
from refkern.accumulate.formats import FLOAT64, Format
from refkern.accumulate.ziv import round_fraction
from refkern.kernels._common import deliver
from refkern.kernels._transcendental import U, bracket_around

__all__ = ["embedding", "embedding_dense_backward", "EmbeddingGrad", "embedding_grad_call", "indices_of"]


def indices_of(t, name, op) -> np.ndarray:
    """Integer indices (a tensor or array of an integer dtype) as int64."""
    if is_tensor(t):
        torch = sys.modules["torch"]
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError(f"{op}: {name} must be an integer tensor of indices; got {name}.dtype={t.dtype}.")
        return t.detach().cpu().numpy().astype(np.int64)
    a = np.asarray(t)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must be an integer array of indices; got {name}.dtype={a.dtype}.")
    return a.astype(np.int64)


def _padding(padding_idx, V, op):
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) or not -V <= padding_idx < V:
        raise ValueError(f"{op}: padding_idx must be None or an int in [{-V}, {V}); got padding_idx={padding_idx!r}.")
    return int(padding_idx) % V


def _check_range(idx, V, op, name):
    bad = (idx < 0) | (idx >= V)
    if bad.any():
        raise IndexError(f"{op}: {name} holds {int(idx[bad][0])}, out of range for {V} embeddings "
                         f"(expected 0..{V - 1}).")


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,  # noqa: A002
              scale_grad_by_freq: bool = False, sparse: bool = False):  # fmt: skip
    """Reference ``torch.nn.functional.embedding``: ``weight[input]``, every value copied (exact).

    With ``max_norm``, the rows the lookup reads whose ``norm_type``-norm exceeds it are first scaled by
    ``max_norm / (norm + 1e-7)``, each element rounded once (:mod:`refkern.kernels._embedding_renorm`); torch
    does this in place, to ``weight`` itself (so a second call on the same tensor finds the rows within
    max_norm), refkern on a copy. ``padding_idx``, ``scale_grad_by_freq`` and ``sparse`` change only the
    gradient (:func:`embedding_dense_backward`)."""
    op = "embedding"
    ow = operand(weight, "weight", op)
    if len(ow.shape) != 2:
        raise ValueError(f"{op}: weight must have shape (num_embeddings, embedding_dim); got shape {tuple(ow.shape)}.")
    idx = indices_of(input, "input", op)
    V = ow.shape[0]
    _padding(padding_idx, V, op)
    _check_range(idx, V, op, "input")
    W = np.asarray(ow.values, np.float64).reshape(ow.shape)
    if max_norm is not None:
        from refkern.kernels._embedding_renorm import check_norm_type, renormed_rows

        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float, np.integer, np.floating)):
            raise TypeError(f"{op}: max_norm must be a number or None; got max_norm={max_norm!r}.")
        ren = renormed_rows(W, np.unique(idx), max_norm, check_norm_type(norm_type, op), ow.fmt)
        if ren:
            W = W.copy()
            for r, v in ren.items():
                W[r] = v
    return deliver(W[idx], ow.fmt, ow.torch or is_tensor(input))


@dataclass
class EmbeddingGrad:
    """A validated backward call: grad_output as (N, D) float64 rows, the N indices, the number of
    embeddings V, the padding row (or None), scale_grad_by_freq, the format, tensors out."""

    G: np.ndarray
    idx: np.ndarray
    V: int
    padding: int | None
    scale: bool
    fmt: Format
    tensor: bool


def embedding_grad_call(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq, who, weight=None
                        ) -> EmbeddingGrad:  # fmt: skip
    """Validate an embedding_dense_backward call: grad_output of shape ``indices.shape + (D,)``, checked by the one
    check every backward rule makes (:func:`refkern.kernels._grad.grad_output`). ``weight``: the forward's weight
    operand, for embedding's backward (grad_output has its dtype and ``D`` is its embedding dimension); None for
    aten's embedding_dense_backward (any floating dtype, any D: the gradient takes grad_output's)."""
    from refkern.kernels._grad import _shape
    from refkern.kernels._grad import grad_output as _checked

    idx = indices_of(indices, "indices", who)
    given = _shape(grad_output)
    if weight is not None:
        fmt, D, text = weight.fmt, weight.shape[-1], f"({weight.shape[-1]},)"
    else:
        fmt = operand(grad_output, "grad_output", who).fmt  # its own dtype (converted once: the check reuses it)
        D, text = (given[-1] if len(given) == idx.ndim + 1 else -1), "(D,)"
    og = _checked(grad_output, "embedding", fmt, (*idx.shape, D), who,
                  f"shape indices.shape + (embedding_dim,) = {tuple(idx.shape)} + {text}")  # fmt: skip
    if isinstance(num_weights, bool) or not isinstance(num_weights, (int, np.integer)) or num_weights < 0:
        raise ValueError(f"{who}: num_weights must be a non-negative int; got num_weights={num_weights!r}.")
    V = int(num_weights)
    pad = _padding(padding_idx, V, who)  # torch.nn.functional's reading: a negative index counts from the end
    flat = idx.reshape(-1)
    _check_range(flat, V, who, "indices")
    D = og.shape[-1] if og.shape else 0
    G = np.ascontiguousarray(np.asarray(og.values, np.float64).reshape(-1, D))
    return EmbeddingGrad(G, flat, V, pad, bool(scale_grad_by_freq), og.fmt, og.torch or is_tensor(indices))


@jit(parallel=True)
def _group_sums(G, order, starts, scale, prec, emin, emax, out, und):
    """Row g of out: the sum (Sum2: TwoSum per term, errors summed apart) of the rows order[starts[g]:
    starts[g + 1]] of G, divided by their count with ``scale``, bracketed and rounded (module docstring);
    und[g, j] where the bracket does not decide."""
    D = G.shape[1]
    for gi in prange(starts.size - 1):
        a, b = starts[gi], starts[gi + 1]
        k = b - a
        for j in range(D):
            if k == 1 and not scale:  # a single term, copied
                out[gi, j] = G[order[a], j]
                und[gi, j] = False
                continue
            s, c, m, plain = 0.0, 0.0, 0.0, 0.0
            finite = True
            for t in range(a, b):
                x = G[order[t], j]
                plain += x
                if not np.isfinite(x):
                    finite = False
                    continue
                s, q = two_sum(s, x)
                c += q
                m += abs(x)
            if not finite:  # IEEE's sum of the specials (inf, or NaN): what any order gives
                out[gi, j] = plain / k if scale else plain
                und[gi, j] = False
                continue
            g1 = (k - 1) * U / (1.0 - (k - 1) * U)
            e = g1 * g1 * m * 1.01 + k * 2.0**-1074
            v = s + c
            e += U * abs(v)
            if scale:
                v = v / k
                e = e / k + U * abs(v)
            if not np.isfinite(v):
                out[gi, j] = np.nan
                und[gi, j] = True
                continue
            r, ok = bracket_around(v, e, False, prec, emin, emax)
            out[gi, j] = r
            und[gi, j] = not ok


def _exact(c: EmbeddingGrad, order, starts, gi, j) -> float:
    rows = order[starts[gi] : starts[gi + 1]]
    parts = [float(c.G[r, j]).as_integer_ratio() for r in rows]
    k = max(d.bit_length() - 1 for _, d in parts)
    tot = Fraction(sum(n << (k - (d.bit_length() - 1)) for n, d in parts), 1 << k)
    return round_fraction(tot / len(rows) if c.scale else tot, c.fmt)


def grad_weight(c: EmbeddingGrad) -> np.ndarray:
    """The exact gradient of the weight, float64 values (V, D) rounded to the format."""
    N, D = c.G.shape
    out = np.zeros((c.V, D))
    keep = np.ones(N, np.bool_) if c.padding is None else c.idx != c.padding
    order = np.flatnonzero(keep)
    order = order[np.argsort(c.idx[order], kind="stable")].astype(np.int64)
    if not order.size:
        return out
    tokens = c.idx[order]
    first = np.flatnonzero(np.r_[True, tokens[1:] != tokens[:-1]])
    starts = np.r_[first, order.size].astype(np.int64)
    vals = np.empty((first.size, D))
    und = np.zeros((first.size, D), np.bool_)
    prec = c.fmt.prec if c.fmt.prec < FLOAT64.prec else 60  # float64 results: every repeated sum to the exact path
    _group_sums(c.G, order, starts, c.scale, prec, c.fmt.emin, c.fmt.emax, vals, und)
    if c.fmt.prec >= FLOAT64.prec:
        und &= ~((np.diff(starts) == 1)[:, None] & (not c.scale))
    for gi, j in zip(*np.nonzero(und)):
        vals[gi, j] = _exact(c, order, starts, gi, j)
    out[tokens[first]] = vals
    return out


def embedding_dense_backward(grad_output, indices, num_weights: int, padding_idx=None, scale_grad_by_freq=False):
    """Reference ``aten.embedding_dense_backward``: the gradient of ``weight`` (num_weights, D), each element
    the exact sum of its rows of grad_output (over their count with ``scale_grad_by_freq``), rounded once;
    0 for ``padding_idx`` (``-1`` or None: none, as aten's -1). A correct implementation sums each row's
    k terms in any order in its working precision (torch's CPU: in the result dtype itself, one rounding
    per addition): ``gamma_{k-1}`` of their magnitudes (:mod:`refkern.analysis.embedding`)."""
    who = "embedding_dense_backward"
    if padding_idx == -1:
        padding_idx = None
    with converted_once():
        c = embedding_grad_call(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq, who)
    return deliver(grad_weight(c), c.fmt, c.tensor)

