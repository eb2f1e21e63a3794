"""Ground truth of :func:`refkern.backward`: the gradients from the forward definition, summed with
mpmath exactly, rounded once.

Nothing here goes through the adjoint calls of :mod:`refkern.gradients`. Each op walks its own
forward definition, term by term: a term ``l * r`` of output element I (l an element of one
argument, r of another, or r = 1 for a bias) puts the pair ``(grad_output[I], r)`` into the term
list of l's gradient element (and ``(grad_output[I], l)`` into r's). Every list is then summed
exactly by :func:`refkern.truth.products._exact_sum_of_products` (mpmath at a derived exact
precision) and rounded once to the argument's format. Small sizes only: Python loops.
"""

import itertools

import numpy as np

import refkern.ops as _ops
from refkern.ops._bind import bind
from refkern.truth._backward_common import _values
from refkern.truth._backward_norm import _batch_norm_backward, _group_norm_backward, _norm_backward
from refkern.truth._backward_reductions import _pool_backward, _reduction_backward
from refkern.truth._backward_softmax import _attention_backward, _softmax_backward
from refkern.truth.products import _exact_sum_of_products

__all__ = ["backward"]


class _Grads:
    """Term lists of every gradient element, keyed by argument name and index."""

    def __init__(self, shapes: dict, wrt):
        self.terms = {k: {} for k in wrt}
        self.shapes = shapes

    def add(self, name, idx, g, r):
        t = self.terms.get(name)
        if t is not None:
            t.setdefault(idx, []).append((float(g), float(r)))

    def finish(self, fmt, as_tensor, precision):
        from refkern.kernels._common import deliver

        out = {}
        for k, terms in self.terms.items():
            shape = self.shapes[k]
            v = np.empty(shape)
            for idx in np.ndindex(*shape):
                v[idx] = _exact_sum_of_products(terms.get(idx, []), fmt, precision)
            out[k] = deliver(v, fmt, as_tensor)
        return out


def _linear(op, G, a, grads):
    x, w = a["x"], a["weight"]
    lead, n_in = x.shape[:-1], x.shape[-1]
    w2 = w if w.ndim == 2 else w[None, :]
    bias = a.get("bias")
    for m in np.ndindex(*lead):
        for o in range(w2.shape[0]):  # y[m, o] = bias[o] + sum_k x[m, k] w[o, k]
            oi = m + ((o,) if w.ndim == 2 else ())
            g = G[oi]
            for k in range(n_in):
                grads.add("x", m + (k,), g, w2[o, k])
                grads.add("weight", (o, k) if w.ndim == 2 else (k,), g, x[m + (k,)])
            if bias is not None:
                grads.add("bias", (o,) if bias.ndim == 1 else (), g, 1.0)


def _matmul(op, G, a, grads):
    A, B = a["a"], a["b"]
    A2 = A[None, :] if A.ndim == 1 else A
    B2 = B[:, None] if B.ndim == 1 else B
    batch = np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2])
    (m, k), n = A2.shape[-2:], B2.shape[-1]
    G2 = G.reshape(batch + (m, n))

    def own(idx, shape):  # the element of a (broadcast) operand that batch index idx reads
        lead = len(idx) - len(shape)
        return tuple(0 if s == 1 else i for i, s in zip(idx[lead:], shape))

    for t in np.ndindex(*batch):
        ta, tb = own(t, A2.shape[:-2]), own(t, B2.shape[:-2])
        for i, j, p in itertools.product(range(m), range(n), range(k)):  # C[t, i, j] = sum_p A[t, i, p] B[t, p, j]
            g = G2[t + (i, j)]
            grads.add("a", (ta + (i, p)) if A.ndim > 1 else (p,), g, B2[tb + (p, j)])
            grads.add("b", (tb + (p, j)) if B.ndim > 1 else (p,), g, A2[ta + (i, p)])


def _conv_geometry(op, nd, a, xshape, wshape):
    from refkern.ops._args import spatial as _pair

    stride = _pair(a["stride"], "stride", op, nd, 1)
    dilation = _pair(a["dilation"], "dilation", op, nd, 1)
    ksize = wshape[2:]
    p = a["padding"]
    if p == "valid":
        pads = [(0, 0)] * nd
    elif p == "same":
        pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, ksize)]
    else:
        pads = [(q, q) for q in _pair(p, "padding", op, nd, 0)]
    return stride, dilation, pads


def _source(j, lo, size, mode):
    """The input position that padded position j (padding lo on the left) holds, None for a zero."""
    i = j - lo
    if 0 <= i < size:
        return i
    if mode == "zeros":
        return None
    if mode == "replicate":
        return min(max(i, 0), size - 1)
    if mode == "circular":
        return i % size
    return -i if i < 0 else 2 * (size - 1) - i  # reflect


def _conv(nd, op, G, a, grads):
    x, w = a["x"], a["weight"]
    unbatched = x.ndim == nd + 1
    if unbatched:
        x, G = x[None], G[None]
    stride, dilation, pads = _conv_geometry(op, nd, a, x.shape, w.shape)
    mode = a["padding_mode"]
    groups = a["groups"]
    n_img, c_in = x.shape[:2]
    c_out, cin_g = w.shape[:2]
    cout_g = c_out // groups
    lift = (lambda idx: idx[1:]) if unbatched else (lambda idx: idx)
    bias = a.get("bias")
    for n, co in itertools.product(range(n_img), range(c_out)):
        gr = co // cout_g
        for o in np.ndindex(*G.shape[2:]):  # y[n, co, o] = bias[co] + sum_{ci, t} w[co, ci, t] x_p[n, ci', o s + t d]
            g = G[(n, co) + o]
            if bias is not None:
                grads.add("bias", (co,), g, 1.0)
            for ci in range(cin_g):
                cc = gr * cin_g + ci
                for t in np.ndindex(*w.shape[2:]):
                    src = [_source(o[i] * stride[i] + t[i] * dilation[i], pads[i][0], x.shape[2 + i], mode)
                           for i in range(nd)]  # fmt: skip
                    if any(s is None for s in src):  # a padded zero: a 0 term of grad_weight, none of grad_x
                        grads.add("weight", (co, ci) + t, g, 0.0)
                        continue
                    xi = (n, cc) + tuple(src)
                    grads.add("weight", (co, ci) + t, g, x[xi])
                    grads.add("x", lift(xi), g, w[(co, ci) + t])


def _conv_transpose(nd, op, G, a, grads):
    from refkern.ops._args import spatial as _pair

    x, w = a["input"], a["weight"]
    unbatched = x.ndim == nd + 1
    if unbatched:
        x, G = x[None], G[None]
    stride = _pair(a["stride"], "stride", op, nd, 1)
    dilation = _pair(a["dilation"], "dilation", op, nd, 1)
    padding = _pair(a["padding"], "padding", op, nd, 0)
    groups = a["groups"]
    n_img, c_in = x.shape[:2]
    cout_g = w.shape[1]
    cin_g = c_in // groups
    osz = G.shape[2:]
    lift = (lambda idx: idx[1:]) if unbatched else (lambda idx: idx)
    for n, ci in itertools.product(range(n_img), range(c_in)):  # torch's scatter definition
        gr = ci // cin_g
        for i in np.ndindex(*x.shape[2:]):
            for t in np.ndindex(*w.shape[2:]):
                o = tuple(i[q] * stride[q] - padding[q] + t[q] * dilation[q] for q in range(nd))
                if not all(0 <= o[q] < osz[q] for q in range(nd)):
                    continue
                for co in range(cout_g):
                    g = G[(n, gr * cout_g + co) + o]
                    grads.add("input", lift((n, ci) + i), g, w[(ci, co) + t])
                    grads.add("weight", (ci, co) + t, g, x[(n, ci) + i])
    if a.get("bias") is not None:
        for idx in np.ndindex(*G.shape):
            grads.add("bias", (idx[1],), G[idx], 1.0)


def _dot(op, G, a, grads):
    x, y = a["x"], a["y"]
    for k in range(x.shape[0]):  # out = sum_k x[k] y[k]
        grads.add("x", (k,), G[()], y[k])
        grads.add("y", (k,), G[()], x[k])


def _summed(walk):
    """The truth of an op whose gradients are sums of products (``walk(name, G, values, grads)`` puts each
    forward term's pairs into the term lists): each element summed exactly and rounded once (module
    docstring)."""

    def truth(name, grad_output, a, wrt, precision=None):
        diff = _ops.get(name).differentiable
        ops = {k: _values(v, k, "truth.backward") for k, v in a.items() if k in diff and v is not None}
        vals = {**a, **{k: v for k, (v, _) in ops.items()}}
        G, og = _values(grad_output, "grad_output", "truth.backward")
        if wrt is None:
            wrt = tuple(ops)
        elif isinstance(wrt, str):
            wrt = (wrt,)
        grads = _Grads({k: tuple(ops[k][1].shape) for k in ops}, wrt)
        walk(name, G, vals, grads)
        as_tensor = og.torch or any(o.torch for _, o in ops.values())
        return grads.finish(og.fmt, as_tensor, precision)

    return truth


def _with_values(fn):
    """The truth of a family read from grad_output's values: ``fn(name, G, og, bound, wrt)``."""

    def truth(name, grad_output, a, wrt, precision=None):
        G, og = _values(grad_output, "grad_output", "truth.backward")
        return fn(name, G, og, a, wrt)

    return truth


# the truths the records name (refkern.ops.Backward.truth): truth(name, grad_output, bound, wrt, precision)
linear, matmul, dot = _summed(_linear), _summed(_matmul), _summed(_dot)
conv = _summed(lambda name, *z: _conv(_ops.get(name).spatial, name, *z))  # over the record's Op.spatial dimensions
conv_transpose = _summed(lambda name, *z: _conv_transpose(_ops.get(name).spatial, name, *z))
softmax, attention = _with_values(_softmax_backward), _with_values(_attention_backward)
pool, reduction = _with_values(_pool_backward), _with_values(_reduction_backward)
norm, group_norm, batch_norm = (_with_values(_norm_backward), _with_values(_group_norm_backward),
                                _with_values(_batch_norm_backward))  # fmt: skip


def embedding(name, grad_output, a, wrt, precision=None):
    """A scatter-add of grad_output's rows: exact Fractions (:mod:`refkern.truth.embeddings`)."""
    from refkern.truth.embeddings import backward as embedding_backward

    return embedding_backward(grad_output, a, wrt)


def nll_loss(name, grad_output, a, wrt, precision=None):
    """``-w_t g (/ D)`` at the targets: exact Fractions (:mod:`refkern.truth.losses`)."""
    from refkern.truth.losses import nll_backward

    return nll_backward(grad_output, a, wrt)


def _wrt(name, wrt, a) -> tuple:
    """The arguments asked for: ``wrt`` as a tuple, or every differentiable one of the record's given (not None,
    not integers: :func:`refkern.gradients.differentiable`'s rule) when None."""
    from refkern.gradients import _given

    if wrt is None:
        return tuple(k for k in _ops.get(name).differentiable if _given(a, k))
    return (wrt,) if isinstance(wrt, str) else tuple(wrt)


def mse_loss(name, grad_output, a, wrt, precision=None):
    """``2 (x - t) g (/ n)`` for the input, ``2 (t - x) g (/ n)`` for the target: exact Fractions
    (:mod:`refkern.truth.losses`)."""
    from refkern.truth.losses import mse_backward

    return mse_backward(grad_output, a, _wrt(name, wrt, a))


def binary_cross_entropy(name, grad_output, a, wrt, precision=None):
    """``g w (p - y) / max(p (1 - p), 1e-12)`` for the input (exact Fractions), ``-g w logit(p)`` for the target
    (mpmath intervals) (:mod:`refkern.truth.losses`)."""
    from refkern.truth.losses import bce_backward

    return bce_backward(grad_output, a, _wrt(name, wrt, a), precision or 64)


def cross_entropy(name, grad_output, a, wrt, precision=None):
    """``s (p A - B)``: the softmax by mpmath intervals, the coefficients exact (:mod:`refkern.truth.losses`)."""
    from refkern.truth.losses import ce_backward

    return ce_backward(grad_output, a, _wrt(name, wrt, a), precision or 64)


def binary_cross_entropy_with_logits(name, grad_output, a, wrt, precision=None):
    """``g w (A sigmoid(x) - pw y)`` for the input, ``g w (-x + (pw - 1) softplus(-x))`` for the target (over n for a
    mean): mpmath intervals (:mod:`refkern.truth.losses`)."""
    from refkern.truth.losses import bce_logits_backward

    return bce_logits_backward(grad_output, a, _wrt(name, wrt, a), precision or 64)


def backward(op, grad_output, *args, wrt=None, precision: int | None = None, **kwargs) -> dict:
    """Ground truth of :func:`refkern.backward`: ``{argument name: gradient}``, each element the exact
    sum (mpmath, exact precision derived from its terms) of its terms from the forward definition,
    rounded once to the argument's dtype. Same arguments as :func:`refkern.backward`; the inputs are
    validated by the fast path's normalisers (shapes, dtypes) before the loops."""
    from refkern.gradients import adjoints

    name = _ops.lookup(op, "truth.backward", among=_ops.names(backward=True))
    a = bind(name, args, kwargs, "truth.backward")
    check = wrt
    if _ops.get(name).backward.broadcast is not None:  # an operand broadcast against the others: a sum, validated
        from refkern.gradients import broadcast_operands  # by the truth's own path

        summed = broadcast_operands(name, a, _ops.get(name).differentiable)
        asked = _ops.get(name).differentiable if wrt is None else (wrt,) if isinstance(wrt, str) else tuple(wrt)
        check = tuple(k for k in asked if k not in summed) if summed else wrt
    if check != ():
        adjoints(name, grad_output, *args, wrt=check, who="truth.backward", **kwargs)  # validation only: no kernel runs
    return _ops.resolve_path(_ops.get(name).backward.truth)(name, grad_output, a, wrt, precision)
